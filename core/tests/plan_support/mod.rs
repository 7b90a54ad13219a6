//! Fixture builders shared by the planner tests: Services, nodes, agent reports and a
//! `World` that owns everything an [`Inputs`] borrows.

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use aliaslb_core::election::NodeState;
use aliaslb_core::plan::{
    FamilyPolicy, Inputs, NodeAddress, PlanEvent, PlanOutput, Planner, PortKey, Reports,
    ServiceKey, ServicePlan, ServiceView,
};
use aliaslb_core::pool::PoolConfig;
use aliaslb_core::range::Family;
use aliaslb_core::report::{AgentReport, Conflict, InterfaceReport};

pub fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

pub fn key(ns: &str, name: &str) -> ServiceKey {
    ServiceKey::new(ns, name)
}

/// A single-stack IPv4 Service created at time 0, uid `ns/name`, no request.
pub fn svc(ns: &str, name: &str) -> ServiceView {
    ServiceView {
        key: key(ns, name),
        uid: format!("{ns}/{name}").into(),
        created: 0,
        families: FamilyPolicy {
            families: vec![Family::V4],
            require_all: false,
        },
        requested: Ok(Vec::new()),
        sharing_key: None,
        pool: None,
        ports: Vec::new(),
        local_traffic: false,
        observed_ips: Vec::new(),
        observed_node: None,
    }
}

/// Builder methods on [`ServiceView`].
pub trait SvcExt {
    fn created(self, t: i64) -> Self;
    fn uid(self, uid: &str) -> Self;
    fn requesting(self, ips: &str) -> Self;
    fn malformed(self, message: &str) -> Self;
    fn sharing(self, key: &str) -> Self;
    fn pool(self, name: &str) -> Self;
    fn port(self, port: i32, protocol: &str) -> Self;
    fn families(self, families: &[Family], require_all: bool) -> Self;
    fn local(self) -> Self;
    fn observed(self, ips: &str, node: Option<&str>) -> Self;
}

impl SvcExt for ServiceView {
    fn created(mut self, t: i64) -> Self {
        self.created = t;
        self
    }
    fn uid(mut self, uid: &str) -> Self {
        self.uid = uid.into();
        self
    }
    /// Comma-separated IPs.
    fn requesting(mut self, ips: &str) -> Self {
        self.requested = Ok(ips.split(',').map(|s| ip(s.trim())).collect());
        self
    }
    fn malformed(mut self, message: &str) -> Self {
        self.requested = Err(message.to_owned());
        self
    }
    fn sharing(mut self, key: &str) -> Self {
        self.sharing_key = Some(key.to_owned());
        self
    }
    /// Names its pool (`aliaslb.io/pool`).
    fn pool(mut self, name: &str) -> Self {
        self.pool = Some(name.to_owned());
        self
    }
    fn port(mut self, port: i32, protocol: &str) -> Self {
        self.ports.push(PortKey {
            port,
            protocol: protocol.into(),
        });
        self
    }
    fn families(mut self, families: &[Family], require_all: bool) -> Self {
        self.families = FamilyPolicy {
            families: families.to_vec(),
            require_all,
        };
        self
    }
    fn local(mut self) -> Self {
        self.local_traffic = true;
        self
    }
    /// Comma-separated observed IPs and the observed node.
    fn observed(mut self, ips: &str, node: Option<&str>) -> Self {
        self.observed_ips = ips.split(',').map(|s| ip(s.trim())).collect();
        self.observed_node = node.map(str::to_owned);
        self
    }
}

/// A ready, schedulable node.
pub fn node(name: &str) -> NodeState {
    NodeState {
        name: name.into(),
        agent_ready: true,
        ..NodeState::default()
    }
}

/// A pool config from `(key, value)` pairs; panics on a config error.
pub fn config(pairs: &[(&str, &str)]) -> PoolConfig {
    let data: BTreeMap<String, String> = pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    PoolConfig::parse(&data).unwrap_or_else(|e| panic!("bad test config: {e:?}"))
}

/// Everything an [`Inputs`] borrows, owned.
#[derive(Debug, Clone)]
pub struct World {
    pub config: PoolConfig,
    /// Namespace labels (for pools that select namespaces).
    pub namespaces: BTreeMap<String, BTreeMap<String, String>>,
    pub services: Vec<ServiceView>,
    pub nodes: Vec<NodeState>,
    pub agents: Reports,
    pub local: BTreeMap<ServiceKey, BTreeSet<String>>,
    /// IPs the API shows on Services that are no longer ours.
    pub lingering: BTreeSet<IpAddr>,
    /// Addresses Nodes have (never allocated).
    pub node_addresses: BTreeMap<IpAddr, NodeAddress>,
    /// Service ClusterIP ranges (never allocated).
    pub service_ranges: Vec<ipnet::IpNet>,
    /// Services that exist but are no longer ours.
    pub not_ours: BTreeSet<ServiceKey>,
    pub respect_cordon: bool,
    /// The controller sees no agent renewing (blind).
    pub agents_unobservable: bool,
    pub now: Instant,
}

impl World {
    /// A world with `config`, the given Services and nodes `a` and `b`.
    pub fn new(config: PoolConfig, services: Vec<ServiceView>) -> Self {
        World {
            config,
            namespaces: BTreeMap::new(),
            services,
            nodes: vec![node("a"), node("b")],
            agents: BTreeMap::new(),
            local: BTreeMap::new(),
            lingering: BTreeSet::new(),
            node_addresses: BTreeMap::new(),
            service_ranges: Vec::new(),
            not_ours: BTreeSet::new(),
            respect_cordon: true,
            agents_unobservable: false,
            now: Instant::now(),
        }
    }

    pub fn plan(&self, planner: &mut Planner) -> PlanOutput {
        let services: Vec<Arc<ServiceView>> = self.services.iter().cloned().map(Arc::new).collect();
        planner.plan(&Inputs {
            config: &self.config,
            namespaces: &self.namespaces,
            services: &services,
            nodes: &self.nodes,
            agents: &self.agents,
            lingering: &self.lingering,
            node_addresses: &self.node_addresses,
            service_ranges: &self.service_ranges,
            not_ours: &self.not_ours,
            local_endpoints: &self.local,
            respect_cordon: self.respect_cordon,
            agents_unobservable: self.agents_unobservable,
            now: self.now,
        })
    }

    pub fn remove(&mut self, ns: &str, name: &str) {
        self.services.retain(|s| s.key != key(ns, name));
    }

    pub fn service_mut(&mut self, ns: &str, name: &str) -> &mut ServiceView {
        self.services
            .iter_mut()
            .find(|s| s.key == key(ns, name))
            .unwrap()
    }

    /// The report of the agent on `node`, to change (an empty one if it had none).
    pub fn report_mut(&mut self, node: &str) -> &mut AgentReport {
        Arc::make_mut(self.agents.entry(node.to_owned()).or_default())
    }

    pub fn node_mut(&mut self, name: &str) -> &mut NodeState {
        self.nodes.iter_mut().find(|n| &*n.name == name).unwrap()
    }

    /// Each `(node, address/prefix)`: the node's one address, on that subnet.
    pub fn on_subnets(&mut self, nodes: &[(&str, &str)]) {
        for (n, net) in nodes {
            let state = self.node_mut(n);
            state.subnets = vec![net.parse().unwrap()];
            state.addresses = vec![net.split('/').next().unwrap().parse().unwrap()];
        }
    }

    /// The agent on `node` reports holding `ips` (comma separated; empty: none).
    pub fn holds(&mut self, node: &str, ips: &str) {
        let report = self.report_mut(node);
        report.held = ips
            .split(',')
            .filter(|s| !s.trim().is_empty())
            .map(|s| ip(s.trim()))
            .collect();
    }

    /// The agent on `node` reports interface `name` on `subnet`.
    pub fn interface(&mut self, node: &str, name: &str, subnet: &str) {
        self.report_mut(node).interfaces.push(InterfaceReport {
            addresses: Vec::new(),
            mac: None,
            name: name.to_owned(),
            subnets: vec![subnet.parse().unwrap()],
        });
    }

    /// The agent on `node` reports a conflict for `ip`.
    pub fn conflict(&mut self, node: &str, ip_s: &str, reason: &str) {
        self.report_mut(node).conflicts.push(Conflict {
            while_held: false,
            yielded: false,
            mac: None,
            interface: None,
            ip: ip(ip_s),
            reason: reason.to_owned(),
        });
    }

    /// The agent on `node` reports `ip_s` answered on the LAN by `mac` on `interface`.
    pub fn lan_conflict(&mut self, node: &str, ip_s: &str, mac: &str, interface: &str) {
        self.report_mut(node).conflicts.push(Conflict {
            while_held: false,
            yielded: false,
            mac: Some(mac.parse().unwrap()),
            interface: Some(interface.to_owned()),
            ip: ip(ip_s),
            reason: format!("answered by {mac}"),
        });
    }

    /// The agent on `node` reports that `mac` claimed `ip_s` on `interface` while it held
    /// it, and that it defended it ([`Conflict::while_held`]).
    pub fn lan_claim(&mut self, node: &str, ip_s: &str, mac: &str, interface: &str) {
        let reason = format!("claimed on {interface} by {mac}: defended");
        self.held_claim(node, ip_s, mac, interface, reason, false);
    }

    /// The agent on `node` reports that node `by` (at `mac`) claimed `ip_s` on `interface`
    /// while it held it with stale authority, and that it yielded ([`Conflict::yielded`]).
    pub fn lan_yield(&mut self, node: &str, ip_s: &str, by: &str, mac: &str, interface: &str) {
        let reason = format!(
            "claimed on {interface} by node {by} ({mac}) while this agent's Lease was stale: yielded"
        );
        self.held_claim(node, ip_s, mac, interface, reason, true);
    }

    fn held_claim(
        &mut self,
        node: &str,
        ip_s: &str,
        mac: &str,
        interface: &str,
        reason: String,
        yielded: bool,
    ) {
        self.report_mut(node).conflicts.push(Conflict {
            while_held: true,
            yielded,
            mac: Some(mac.parse().unwrap()),
            interface: Some(interface.to_owned()),
            ip: ip(ip_s),
            reason,
        });
    }

    /// The agent on `node` no longer reports any conflict.
    pub fn no_conflicts(&mut self, node: &str) {
        if let Some(report) = self.agents.get_mut(node).map(Arc::make_mut) {
            report.conflicts.clear();
        }
    }

    /// The agent on `node` lists `mac` among its links' MACs (`AgentReport::macs`), with or
    /// without an interface report of its own.
    pub fn link_mac(&mut self, node: &str, mac: &str) {
        let report = self.report_mut(node);
        report.macs.push(mac.parse().unwrap());
    }

    /// The agent on `node` reports interface `name` with Ethernet address `mac`.
    pub fn mac(&mut self, node: &str, name: &str, mac: &str) {
        self.report_mut(node).interfaces.push(InterfaceReport {
            addresses: Vec::new(),
            mac: Some(mac.parse().unwrap()),
            name: name.to_owned(),
            subnets: Vec::new(),
        });
    }

    /// Node `node` has `ip_s` as its InternalIP.
    pub fn node_has(&mut self, node: &str, ip_s: &str) {
        self.node_addresses
            .insert(ip(ip_s), NodeAddress::new(node, "InternalIP"));
    }

    /// No Node has `ip_s` any more.
    pub fn node_drops(&mut self, ip_s: &str) {
        self.node_addresses.remove(&ip(ip_s));
    }

    pub fn advance(&mut self, d: Duration) {
        self.now += d;
    }
}

/// The plan of `ns/name`.
/// Node names as `&str`s, to compare with literals.
pub fn names(nodes: &[std::sync::Arc<str>]) -> Vec<&str> {
    nodes.iter().map(|n| &**n).collect()
}

pub fn plan_of<'o>(out: &'o PlanOutput, ns: &str, name: &str) -> &'o ServicePlan {
    out.services
        .get(&key(ns, name))
        .unwrap_or_else(|| panic!("no plan for {ns}/{name}"))
}

/// The IPs planned for `ns/name`, as strings.
pub fn ips(out: &PlanOutput, ns: &str, name: &str) -> Vec<String> {
    plan_of(out, ns, name)
        .ips
        .iter()
        .map(ToString::to_string)
        .collect()
}

/// Events with `reason`.
pub fn events<'o>(out: &'o PlanOutput, reason: &str) -> Vec<&'o PlanEvent> {
    out.events.iter().filter(|e| e.reason == reason).collect()
}

/// Events with `reason` for `ns/name`.
pub fn events_for<'o>(
    out: &'o PlanOutput,
    ns: &str,
    name: &str,
    reason: &str,
) -> Vec<&'o PlanEvent> {
    let k = key(ns, name);
    out.events
        .iter()
        .filter(|e| e.reason == reason && e.service == k)
        .collect()
}

/// Services of namespace `ns`, one per name, created at 1, 2, … in the order given.
pub fn created_in_order(ns: &str, names: &[&str]) -> Vec<ServiceView> {
    names
        .iter()
        .zip(1..)
        .map(|(name, t)| svc(ns, name).created(t))
        .collect()
}

/// The reason and message of the `IPAllocated` condition of `ns/name`, to compare at once.
pub fn allocated<'o>(out: &'o PlanOutput, ns: &str, name: &str) -> (&'static str, &'o str) {
    let c = &plan_of(out, ns, name).allocated;
    (c.reason, c.message.as_str())
}

/// Asserts that `text` starts with `prefix`; `what` says which case (or why) on failure.
#[track_caller]
pub fn assert_starts_with(text: &str, prefix: &str, what: &str) {
    assert!(
        text.starts_with(prefix),
        "{what}: {text:?} does not start with {prefix:?}"
    );
}

/// Asserts that `text` contains every one of `parts`; `what` says which case (or why).
#[track_caller]
pub fn assert_contains(text: &str, parts: &[&str], what: &str) {
    for part in parts {
        assert!(text.contains(part), "{what}: {text:?} lacks {part:?}");
    }
}

/// Asserts that the `IPAllocated` condition of `ns/name` has `reason` and a message that
/// starts with `prefix`; `what` says which case (or why) on failure.
#[track_caller]
pub fn assert_allocated_starts_with(
    out: &PlanOutput,
    (ns, name): (&str, &str),
    reason: &str,
    prefix: &str,
    what: &str,
) {
    let (got, message) = allocated(out, ns, name);
    assert_eq!(got, reason, "{what}: {ns}/{name}");
    assert_starts_with(message, prefix, &format!("{what}: {ns}/{name}"));
}

/// Asserts that `ns/name` has no IP, and the reason and message of its `IPAllocated`
/// condition; `what` says which case (or why) on failure.
#[track_caller]
pub fn assert_pending(
    out: &PlanOutput,
    (ns, name): (&str, &str),
    reason: &str,
    message: &str,
    what: &str,
) {
    assert_eq!(
        ips(out, ns, name),
        Vec::<String>::new(),
        "{what}: {ns}/{name}"
    );
    assert_eq!(
        allocated(out, ns, name),
        (reason, message),
        "{what}: {ns}/{name}"
    );
}
