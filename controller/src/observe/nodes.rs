//! Nodes -> the planner's [`NodeState`]s (with what the agents say) and the addresses
//! Nodes list, which the planner never allocates. Pure: no I/O.

use std::collections::BTreeMap;
use std::net::IpAddr;

use aliaslb_core::election::NodeState;
use aliaslb_core::plan::NodeAddress;
use aliaslb_core::report::AgentReport;
use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;

use super::agents::Freshness;

/// Nodes as the planner sees them: `agents` maps node name -> (freshness, report).
///
/// A node's subnets are those of its agent's report that count for election
/// ([`AgentReport::elected_subnets`]): a wide one only where it holds an address the Node
/// itself lists.
pub fn node_states(
    nodes: &[std::sync::Arc<Node>],
    agents: &BTreeMap<String, (Freshness, std::sync::Arc<AgentReport>)>,
) -> Vec<NodeState> {
    let mut out: Vec<NodeState> = nodes
        .iter()
        .filter_map(|node| {
            let name = node.metadata.name.clone()?;
            let agent = agents.get(&name);
            Some(NodeState {
                labels: node.metadata.labels.clone().unwrap_or_default(),
                unschedulable: node
                    .spec
                    .as_ref()
                    .and_then(|s| s.unschedulable)
                    .unwrap_or(false),
                agent_ready: agent.is_some_and(|(f, _)| *f == Freshness::Fresh),
                agent_unconfirmed: agent.is_some_and(|(f, _)| *f == Freshness::Unconfirmed),
                agent_announcing: agent.is_some_and(|(f, _)| {
                    matches!(
                        f,
                        Freshness::Fresh | Freshness::Unconfirmed | Freshness::Fading
                    )
                }),
                subnets: agent
                    .map(|(_, r)| r.elected_subnets(&listed_ips(node)).copied().collect())
                    .unwrap_or_default(),
                addresses: agent
                    .map(|(_, r)| {
                        r.interfaces
                            .iter()
                            .flat_map(|i| i.addresses.iter().copied())
                            .collect()
                    })
                    .unwrap_or_default(),
                name: name.into(),
            })
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// The subnets of each node's report that do not count for election (wide, and holding
/// no address the Node lists: [`AgentReport::unanchored_subnets`]), by node; nodes without
/// any are left out.
pub fn unanchored_subnets(
    nodes: &[std::sync::Arc<Node>],
    agents: &BTreeMap<String, (Freshness, std::sync::Arc<AgentReport>)>,
) -> BTreeMap<String, Vec<IpNet>> {
    nodes
        .iter()
        .filter_map(|node| {
            let name = node.metadata.name.as_ref()?;
            let (_, report) = agents.get(name)?;
            let left: Vec<IpNet> = report
                .unanchored_subnets(&listed_ips(node))
                .copied()
                .collect();
            (!left.is_empty()).then(|| (name.clone(), left))
        })
        .collect()
}

/// The Service ClusterIP ranges `cidrs` name, sorted, without duplicates (a range that
/// does not parse is left out: the apiserver validates them).
pub fn service_ranges<'a>(
    cidrs: impl IntoIterator<Item = &'a k8s_openapi::api::networking::v1::ServiceCIDR>,
) -> Vec<IpNet> {
    let mut out: Vec<IpNet> = cidrs
        .into_iter()
        .filter_map(|sc| sc.spec.as_ref()?.cidrs.as_ref())
        .flatten()
        .filter_map(|c| c.trim().parse().ok())
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Node address types that hold a name, not an IP.
const NAME_TYPES: [&str; 3] = ["Hostname", "InternalDNS", "ExternalDNS"];

/// The IPs `node` lists in `status.addresses`, with their types, names left out.
fn listed(node: &Node) -> impl Iterator<Item = (IpAddr, &str)> + '_ {
    let listed = node.status.as_ref().and_then(|s| s.addresses.as_ref());
    listed
        .into_iter()
        .flatten()
        .filter(|a| !NAME_TYPES.contains(&a.type_.as_str()))
        .filter_map(|a| Some((a.address.trim().parse::<IpAddr>().ok()?, a.type_.as_str())))
}

/// The IPs `node` lists (see [`node_addresses`]).
fn listed_ips(node: &Node) -> Vec<IpAddr> {
    listed(node).map(|(ip, _)| ip).collect()
}

/// Every IP a Node lists in `status.addresses` (InternalIP, ExternalIP or any other type
/// but the names: Hostname, InternalDNS, ExternalDNS), with the Node and the type: the
/// planner never allocates them. An address two Nodes list goes with the first Node by
/// name; one a Node lists twice, with the type it lists first.
pub fn node_addresses<'a>(
    nodes: impl IntoIterator<Item = &'a Node>,
) -> BTreeMap<IpAddr, NodeAddress> {
    let mut out: BTreeMap<IpAddr, NodeAddress> = BTreeMap::new();
    for node in nodes {
        let Some(name) = node.metadata.name.as_deref() else {
            continue;
        };
        for (ip, kind) in listed(node) {
            match out.get(&ip) {
                Some(kept) if *kept.node <= *name => {}
                _ => {
                    out.insert(ip, NodeAddress::new(name, kind));
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn node_with(name: &str, addresses: &[(&str, &str)]) -> Node {
        use k8s_openapi::api::core::v1::{NodeAddress as Listed, NodeStatus};
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            spec: None,
            status: Some(NodeStatus {
                addresses: Some(
                    addresses
                        .iter()
                        .map(|(type_, address)| Listed {
                            type_: (*type_).into(),
                            address: (*address).into(),
                        })
                        .collect(),
                ),
                ..NodeStatus::default()
            }),
        }
    }

    #[test]
    fn node_addresses_are_the_ips_of_every_type_but_names() {
        let nodes = [
            node_with(
                "n2",
                &[
                    ("InternalIP", "192.168.55.103"),
                    ("ExternalIP", "2001:db8::3"),
                    ("Hostname", "n2"),
                    ("InternalDNS", "n2.lan"),
                    ("ExternalIP", "192.168.55.103"),
                    ("InternalIP", "not-an-ip"),
                ],
            ),
            // Listed by two Nodes (a misconfiguration): the first Node by name is named.
            node_with("n1", &[("ExternalIP", "192.168.55.103")]),
            node_with("n3", &[]),
            Node {
                metadata: ObjectMeta {
                    name: Some("no-status".into()),
                    ..ObjectMeta::default()
                },
                ..Node::default()
            },
        ];
        let got = node_addresses(&nodes);
        assert_eq!(
            got,
            BTreeMap::from([
                (ip("192.168.55.103"), NodeAddress::new("n1", "ExternalIP")),
                (ip("2001:db8::3"), NodeAddress::new("n2", "ExternalIP")),
            ])
        );
        let first_listed = node_addresses(&nodes[..1]);
        assert_eq!(
            first_listed[&ip("192.168.55.103")],
            NodeAddress::new("n2", "InternalIP")
        );
    }

    #[test]
    fn wide_subnets_elect_a_node_only_around_its_listed_addresses() {
        use aliaslb_core::report::InterfaceReport;
        let report = |subnets: &[&str]| AgentReport {
            interfaces: vec![InterfaceReport {
                addresses: Vec::new(),
                name: "eth0".into(),
                subnets: subnets.iter().map(|s| s.parse().unwrap()).collect(),
                mac: None,
            }],
            ..AgentReport::default()
        };
        let nodes = [
            // Lists an address in its /16 (and a name, which holds no IP).
            std::sync::Arc::new(node_with(
                "n1",
                &[("InternalIP", "10.1.4.2"), ("Hostname", "10.2.0.1")],
            )),
            // Lists nothing in its /16.
            std::sync::Arc::new(node_with("n2", &[("InternalIP", "192.168.1.2")])),
        ];
        let agents = BTreeMap::from([
            (
                "n1".to_owned(),
                (
                    Freshness::Fresh,
                    std::sync::Arc::new(report(&["10.1.0.0/16", "10.2.0.0/16"])),
                ),
            ),
            (
                "n2".to_owned(),
                (
                    Freshness::Fresh,
                    std::sync::Arc::new(report(&["10.3.0.0/16", "192.168.1.0/24", "fd00::/56"])),
                ),
            ),
        ]);
        let states = node_states(&nodes, &agents);
        let subnets: Vec<Vec<String>> = states
            .iter()
            .map(|n| n.subnets.iter().map(ToString::to_string).collect())
            .collect();
        assert_eq!(
            subnets,
            [vec!["10.1.0.0/16"], vec!["192.168.1.0/24"]],
            "wide subnets without a listed address of their node do not count"
        );
        let left = unanchored_subnets(&nodes, &agents);
        assert_eq!(
            left,
            BTreeMap::from([
                ("n1".to_owned(), vec!["10.2.0.0/16".parse().unwrap()]),
                (
                    "n2".to_owned(),
                    vec!["10.3.0.0/16".parse().unwrap(), "fd00::/56".parse().unwrap()]
                ),
            ])
        );
    }
}
