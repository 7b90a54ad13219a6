//! Nodes -> the planner's [`NodeState`]s (with what the agents say) and the addresses
//! Nodes list, which the planner never allocates. Pure: no I/O.

use std::collections::BTreeMap;
use std::net::IpAddr;

use aliaslb_core::election::NodeState;
use aliaslb_core::plan::NodeAddress;
use aliaslb_core::report::AgentReport;
use k8s_openapi::api::core::v1::Node;

use super::agents::Freshness;

/// Nodes as the planner sees them: `agents` maps node name -> (freshness, report).
pub fn node_states(
    nodes: &[std::sync::Arc<Node>],
    agents: &BTreeMap<String, (Freshness, AgentReport)>,
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
                subnets: agent
                    .map(|(_, r)| r.subnets().copied().collect())
                    .unwrap_or_default(),
                name,
            })
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// Node address types that hold a name, not an IP.
const NAME_TYPES: [&str; 3] = ["Hostname", "InternalDNS", "ExternalDNS"];

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
        let listed = node.status.as_ref().and_then(|s| s.addresses.as_ref());
        for address in listed.into_iter().flatten() {
            if NAME_TYPES.contains(&address.type_.as_str()) {
                continue;
            }
            let Ok(ip) = address.address.trim().parse::<IpAddr>() else {
                continue;
            };
            match out.get(&ip) {
                Some(kept) if *kept.node <= *name => {}
                _ => {
                    out.insert(ip, NodeAddress::new(name, &address.type_));
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
}
