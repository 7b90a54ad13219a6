//! The trusted node assignments: for each node, the ConfigMap `aliaslb-node-<node>` in the
//! controller's namespace saying which IPs its agent must carry, on which interface, with
//! which Service ports open (format: [`aliaslb_core::assignment`]). Agents act on nothing
//! else; tenants cannot write there, agents can only read.
//!
//! Pure: [`desired`] (from the pass's plans), [`observed`] (from the cache of what we
//! wrote), [`trusted_nodes`] (which node holds which Service's IP, for the import at the
//! start of a leadership term), [`node_macs`] (every node's MACs, from the agent reports).
//! [`apply`] is the thin writer: one server-side apply per node whose text changed, behind
//! the leader fence and the write timeout. A node whose last IP left keeps its object with
//! an empty list: "nothing assigned" is said, not inferred from an absence.
//!
//! **First claims.** A line ends in `probe` when the planner marks its IP a first claim
//! ([`PlanOutput::probe`]): placed while no agent report lists it as held, in a group no
//! node carried before. The flag is dropped once the node's agent reports holding the IP:
//! one more write of that node's object per new address, so the text says what the agent
//! still has to do, and an agent that restarts (or loses the alias) later re-adds an
//! address it already owned without probing for it.
//!
//! **Node MACs.** Every object also lists, under [`keys::NODE_MACS_KEY`], the MAC of every
//! interface of every agent report (fresh or stale: a node partitioned from the API still
//! answers on the LAN) with its node's name, so an agent tells another node's ARP/NDP
//! claim from a foreign host's. The list is the same in every object: a change of MACs (a
//! node joins, leaves or changes a NIC) rewrites every node's object once, N writes of
//! ~30 bytes x interfaces x N each; MACs change rarely, so that is cheap next to the IP
//! changes the objects carry anyway.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;

use aliaslb_core::assignment::{NodeAssignments, OpenPort, Protocol};
use aliaslb_core::keys;
use aliaslb_core::mac::Mac;
use aliaslb_core::plan::{ServiceKey, ServicePlan, ServiceView};
use aliaslb_core::report::AgentReport;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use crate::fence::{ApplyError, guarded};

/// Value of the [`keys::LABEL_ASSIGNMENTS`] label.
pub const LABEL_VALUE: &str = "true";

/// The data of one node's assignment object, as rendered: the IP lines
/// ([`keys::ASSIGNMENTS_KEY`]) and every node's MACs ([`keys::NODE_MACS_KEY`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Texts {
    /// The IP lines.
    pub ips: String,
    /// The `MAC NODE` lines.
    pub node_macs: String,
}

impl Texts {
    /// The rendered data of `assignments`.
    pub fn of(assignments: &NodeAssignments) -> Self {
        Texts {
            ips: assignments.render(),
            node_macs: assignments.render_node_macs(),
        }
    }
}

/// The MAC of every interface of every agent report, fresh or stale, with its node. A MAC
/// two nodes report (which should not happen) is given to the first by name.
pub fn node_macs(reports: &BTreeMap<String, AgentReport>) -> BTreeMap<Mac, String> {
    let mut out = BTreeMap::new();
    for (node, report) in reports {
        for mac in report.macs() {
            out.entry(mac).or_insert_with(|| node.clone());
        }
    }
    out
}

/// The node an assignment ConfigMap is for, from its name.
pub fn node_of(name: &str) -> Option<&str> {
    name.strip_prefix("aliaslb-node-").filter(|n| !n.is_empty())
}

/// The ports of `view` the shield opens (ports the API would refuse are left out).
fn open_ports(view: &ServiceView) -> impl Iterator<Item = OpenPort> + '_ {
    view.ports.iter().filter_map(|p| {
        Some(OpenPort {
            protocol: Protocol::from_service(Some(&p.protocol))?,
            port: u16::try_from(p.port).ok().filter(|p| *p != 0)?,
        })
    })
}

/// What the nodes `only` (every node when `None`) must carry according to `plans`: each
/// Service with a node gets its IPs there, with its ports (from its view, if given) and
/// the pool's interface, `probe` on the first claims (`probe`); every node's object lists
/// `macs`. A node in `only` that carries nothing is missing from the result.
pub fn desired<'a>(
    plans: impl IntoIterator<Item = (&'a ServiceKey, &'a ServicePlan, Option<&'a ServiceView>)>,
    probe: &BTreeSet<IpAddr>,
    macs: &BTreeMap<Mac, String>,
    only: Option<&BTreeSet<String>>,
) -> BTreeMap<String, NodeAssignments> {
    let mut nodes: BTreeMap<String, NodeAssignments> = BTreeMap::new();
    for (key, plan, view) in plans {
        // L2: the one elected node; L3: every announcing node, each line marked `bgp`.
        let (targets, bgp) = match &plan.node {
            Some(node) => (std::slice::from_ref(node), false),
            None => (plan.nodes.as_slice(), true),
        };
        let wanted = |node: &String| only.is_none_or(|only| only.contains(node));
        if !targets.iter().any(wanted) {
            continue;
        }
        let ports: Vec<OpenPort> = view.map(|v| open_ports(v).collect()).unwrap_or_default();
        let service = key.to_string();
        for node in targets.iter().filter(|n| wanted(n)) {
            let assignments = nodes
                .entry(node.clone())
                .or_insert_with(|| NodeAssignments {
                    node_macs: macs.clone(),
                    ..NodeAssignments::default()
                });
            for ip in &plan.ips {
                assignments.assign(
                    *ip,
                    plan.interface.as_deref(),
                    ports.iter().copied(),
                    &service,
                );
                if let Some(line) = assignments.ips.get_mut(ip) {
                    line.probe |= !bgp && probe.contains(ip);
                    line.bgp |= bgp;
                }
            }
        }
    }
    nodes
}

/// The texts of every assignment object we wrote, by node.
pub fn observed<'a>(objects: impl IntoIterator<Item = &'a ConfigMap>) -> BTreeMap<String, Texts> {
    objects
        .into_iter()
        .filter_map(|cm| {
            let node = node_of(cm.metadata.name.as_deref()?)?;
            let key = |k: &str| {
                cm.data
                    .as_ref()
                    .and_then(|d| d.get(k))
                    .cloned()
                    .unwrap_or_default()
            };
            let texts = Texts {
                ips: key(keys::ASSIGNMENTS_KEY),
                node_macs: key(keys::NODE_MACS_KEY),
            };
            Some((node.to_owned(), texts))
        })
        .collect()
}

/// For each IP our assignment objects give a node: that node and the Services it is
/// carried for. Unreadable objects give nothing (the node is then elected afresh).
pub fn trusted_nodes(observed: &BTreeMap<String, Texts>) -> HashMap<IpAddr, (String, Vec<String>)> {
    let mut out = HashMap::new();
    for (node, texts) in observed {
        let Ok(assignments) = NodeAssignments::parse(&texts.ips) else {
            tracing::warn!(node, "our assignment object for this node cannot be read");
            continue;
        };
        // L3 lines have no one holder to keep: their nodes are chosen afresh.
        for (ip, a) in assignments.ips.into_iter().filter(|(_, a)| !a.bgp) {
            out.insert(ip, (node.clone(), a.services.into_iter().collect()));
        }
    }
    out
}

/// L3 mode: for each IP our assignment objects mark `bgp`, every node announcing it, each
/// with the Services it is carried for (unreadable objects give nothing).
pub fn routed_nodes(
    observed: &BTreeMap<String, Texts>,
) -> HashMap<IpAddr, Vec<(String, Vec<String>)>> {
    let mut out: HashMap<IpAddr, Vec<(String, Vec<String>)>> = HashMap::new();
    for (node, texts) in observed {
        let Ok(assignments) = NodeAssignments::parse(&texts.ips) else {
            continue;
        };
        for (ip, a) in assignments.ips.into_iter().filter(|(_, a)| a.bgp) {
            let services = a.services.into_iter().collect();
            out.entry(ip).or_default().push((node.clone(), services));
        }
    }
    out
}

/// The nodes our own objects have announce Service `key`'s `ips` in L3 mode, by name,
/// comma-separated; `None` if none.
pub fn routed_nodes_of(
    key: &ServiceKey,
    ips: &[IpAddr],
    routed: &HashMap<IpAddr, Vec<(String, Vec<String>)>>,
) -> Option<String> {
    let key = key.to_string();
    ips.iter().find_map(|ip| {
        let nodes: Vec<&str> = routed
            .get(ip)?
            .iter()
            .filter(|(_, services)| services.contains(&key))
            .map(|(node, _)| node.as_str())
            .collect();
        (!nodes.is_empty()).then(|| nodes.join(","))
    })
}

/// The node our own objects assign Service `key`'s `ips` to, if any.
pub fn trusted_node_of<'a>(
    key: &ServiceKey,
    ips: &[IpAddr],
    trusted: &'a HashMap<IpAddr, (String, Vec<String>)>,
) -> Option<&'a str> {
    let key = key.to_string();
    ips.iter().find_map(|ip| {
        let (node, services) = trusted.get(ip)?;
        services.contains(&key).then_some(node.as_str())
    })
}

/// Writes `texts` as `node`'s assignment (creating the object if needed).
pub async fn apply(
    api: &Api<ConfigMap>,
    namespace: &str,
    node: &str,
    texts: &Texts,
    fence: impl Fn() -> Option<std::time::Instant>,
) -> Result<ConfigMap, ApplyError> {
    let name = keys::assignment_configmap(node);
    let body = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {keys::LABEL_ASSIGNMENTS: LABEL_VALUE},
        },
        "data": {
            keys::ASSIGNMENTS_KEY: texts.ips,
            keys::NODE_MACS_KEY: texts.node_macs,
        },
    });
    let params = PatchParams::apply(keys::CONTROLLER_FIELD_MANAGER).force();
    let object = format!("ConfigMap {namespace}/{name}");
    guarded("assignment", object, &fence, async {
        api.patch(&name, &params, &Patch::Apply(&body)).await
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use aliaslb_core::plan::{ConditionPlan, PlanOutput, PortKey};
    use std::sync::Arc;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn plan(ips: &[&str], node: Option<&str>, interface: Option<&str>) -> ServicePlan {
        let condition = ConditionPlan {
            status: true,
            reason: "x",
            message: String::new(),
        };
        ServicePlan {
            ips: ips.iter().map(|i| ip(i)).collect(),
            node: node.map(str::to_owned),
            nodes: Vec::new(),
            interface: interface.map(str::to_owned),
            allocated: condition.clone(),
            announced: condition,
        }
    }

    fn view(key: &ServiceKey, ports: &[(i32, &str)], observed: &[&str]) -> ServiceView {
        ServiceView {
            key: key.clone(),
            uid: Arc::from("u"),
            created: 0,
            families: aliaslb_core::plan::FamilyPolicy {
                families: vec![],
                require_all: false,
            },
            requested: Ok(vec![]),
            sharing_key: None,
            ports: ports
                .iter()
                .map(|(port, protocol)| PortKey {
                    port: *port,
                    protocol: Arc::from(*protocol),
                })
                .collect(),
            local_traffic: false,
            observed_ips: observed.iter().map(|i| ip(i)).collect(),
            observed_node: None,
        }
    }

    /// [`desired`] over every plan of `output`.
    fn desired_all(
        output: &PlanOutput,
        views: &HashMap<&ServiceKey, &ServiceView>,
        macs: &BTreeMap<Mac, String>,
    ) -> BTreeMap<String, NodeAssignments> {
        let plans = output
            .services
            .iter()
            .map(|(key, plan)| (key, plan, views.get(key).copied()));
        desired(plans, &output.probe, macs, None)
    }

    #[test]
    fn only_the_nodes_asked_for_are_rendered() {
        let web = ServiceKey::new("default", "web");
        let dns = ServiceKey::new("default", "dns");
        let mut routed = plan(&["10.200.0.7"], None, None);
        routed.nodes = vec!["n1".into(), "n3".into()];
        let plans = [
            (web.clone(), plan(&["10.0.0.1"], Some("n1"), None)),
            (dns.clone(), routed),
        ];
        let only = BTreeSet::from(["n3".to_owned(), "n9".to_owned()]);
        let d = desired(
            plans.iter().map(|(k, p)| (k, p, None)),
            &BTreeSet::new(),
            &BTreeMap::new(),
            Some(&only),
        );
        assert_eq!(
            d.keys().collect::<Vec<_>>(),
            vec!["n3"],
            "n9 carries nothing"
        );
        assert_eq!(d["n3"].render(), "10.200.0.7 - - default/dns bgp\n");
    }

    #[test]
    fn plans_with_a_node_become_lines_on_that_node_only() {
        let web = ServiceKey::new("default", "web");
        let dns = ServiceKey::new("default", "dns");
        let moving = ServiceKey::new("other", "moving");
        let mut output = PlanOutput::default();
        output
            .services
            .insert(web.clone(), plan(&["10.0.0.1"], Some("n1"), Some("eth1")));
        output.services.insert(
            dns.clone(),
            plan(&["10.0.0.1", "fd00::1"], Some("n1"), None),
        );
        output
            .services
            .insert(moving.clone(), plan(&["10.0.0.9"], None, None));
        let web_view = view(&web, &[(80, "TCP"), (443, "TCP")], &[]);
        let dns_view = view(&dns, &[(53, "UDP"), (0, "TCP"), (53, "QUIC")], &[]);
        let views = HashMap::from([(&web, &web_view), (&dns, &dns_view)]);
        let d = desired_all(&output, &views, &BTreeMap::new());
        assert_eq!(
            d.keys().collect::<Vec<_>>(),
            vec!["n1"],
            "a Service without a node is on none"
        );
        assert_eq!(
            d["n1"].render(),
            "10.0.0.1 eth1 tcp:80,tcp:443,udp:53 default/dns,default/web\n\
             fd00::1 - udp:53 default/dns\n"
        );
    }

    #[test]
    fn l3_plans_become_bgp_lines_on_every_announcing_node() {
        let front = ServiceKey::new("shop", "front");
        let mut output = PlanOutput::default();
        let mut routed = plan(&["10.200.0.7"], None, None);
        routed.nodes = vec!["n1".into(), "n3".into()];
        output.services.insert(front.clone(), routed);
        // The planner never marks an L3 address a first claim; even if it did, no probe.
        output.probe.insert(ip("10.200.0.7"));
        let front_view = view(&front, &[(443, "TCP")], &[]);
        let views = HashMap::from([(&front, &front_view)]);
        let d = desired_all(&output, &views, &BTreeMap::new());
        assert_eq!(d.keys().collect::<Vec<_>>(), vec!["n1", "n3"]);
        for node in ["n1", "n3"] {
            assert_eq!(d[node].render(), "10.200.0.7 - tcp:443 shop/front bgp\n");
        }
        let seen = BTreeMap::from([("n1".to_owned(), Texts::of(&d["n1"]))]);
        assert!(
            trusted_nodes(&seen).is_empty(),
            "an L3 line names no holder to keep"
        );
        let seen = BTreeMap::from([
            ("n1".to_owned(), Texts::of(&d["n1"])),
            ("n3".to_owned(), Texts::of(&d["n3"])),
        ]);
        let routed = routed_nodes(&seen);
        assert_eq!(
            routed_nodes_of(&front, &[ip("10.200.0.7")], &routed).as_deref(),
            Some("n1,n3")
        );
        let thief = ServiceKey::new("tenant", "thief");
        assert_eq!(routed_nodes_of(&thief, &[ip("10.200.0.7")], &routed), None);
    }

    #[test]
    fn first_claims_say_probe_and_every_object_lists_every_nodes_macs() {
        use aliaslb_core::report::InterfaceReport;
        let web = ServiceKey::new("default", "web");
        let dns = ServiceKey::new("default", "dns");
        let mut output = PlanOutput::default();
        output
            .services
            .insert(web.clone(), plan(&["10.0.0.1"], Some("n1"), None));
        output
            .services
            .insert(dns.clone(), plan(&["10.0.0.2"], Some("n2"), None));
        output.probe.insert(ip("10.0.0.2"));
        let interface = |name: &str, mac: Option<&str>| InterfaceReport {
            name: name.to_owned(),
            subnets: Vec::new(),
            mac: mac.map(|m| m.parse().unwrap()),
        };
        let mut reports = BTreeMap::new();
        let n1 = AgentReport {
            interfaces: vec![
                interface("eth0", Some("02:00:00:00:01:00")),
                interface("eth1", Some("02:00:00:00:01:01")),
                interface("lo", None),
            ],
            ..AgentReport::default()
        };
        let n3 = AgentReport {
            interfaces: vec![
                interface("eth1", Some("02:00:00:00:03:01")),
                interface("eth9", Some("02:00:00:00:01:01")),
            ],
            ..AgentReport::default()
        };
        reports.insert("n1".to_owned(), n1);
        reports.insert("n3".to_owned(), n3);
        let macs = node_macs(&reports);
        let views = HashMap::new();
        let d = desired_all(&output, &views, &macs);
        assert_eq!(d["n1"].render(), "10.0.0.1 - - default/web\n");
        assert_eq!(
            d["n2"].render(),
            "10.0.0.2 - - default/dns probe\n",
            "a first claim"
        );
        let listed = "02:00:00:00:01:00 n1\n02:00:00:00:01:01 n1\n02:00:00:00:03:01 n3\n";
        for node in ["n1", "n2"] {
            let texts = Texts::of(&d[node]);
            assert_eq!(
                texts.node_macs, listed,
                "{node}: every node's MACs, the first name wins"
            );
        }
    }

    #[test]
    fn only_our_objects_give_nodes_and_only_for_the_services_they_list() {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some("aliaslb-node-n1".into());
        cm.data = Some(
            [(
                keys::ASSIGNMENTS_KEY.to_owned(),
                "10.0.0.1 - - default/web\n".to_owned(),
            )]
            .into(),
        );
        let mut garbage = ConfigMap::default();
        garbage.metadata.name = Some("aliaslb-node-n2".into());
        garbage.data = Some([(keys::ASSIGNMENTS_KEY.to_owned(), "not a line".to_owned())].into());
        let mut other = ConfigMap::default();
        other.metadata.name = Some("aliaslb-pools".into());
        let seen = observed([&cm, &garbage, &other]);
        assert_eq!(
            seen["n1"].node_macs, "",
            "an object without node MACs reads as none"
        );
        assert_eq!(seen.keys().collect::<Vec<_>>(), vec!["n1", "n2"]);
        let trusted = trusted_nodes(&seen);
        let web = ServiceKey::new("default", "web");
        let thief = ServiceKey::new("tenant", "thief");
        assert_eq!(
            trusted_node_of(&web, &[ip("10.0.0.1")], &trusted),
            Some("n1")
        );
        assert_eq!(trusted_node_of(&thief, &[ip("10.0.0.1")], &trusted), None);
        assert_eq!(trusted_node_of(&web, &[ip("10.0.0.2")], &trusted), None);
        assert_eq!(node_of("aliaslb-node-"), None);
    }
}
