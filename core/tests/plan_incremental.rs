//! Property test of narrowed passes: two planners see the same random sequence of events;
//! A plans everything every time ([`Planner::plan`]), B is told only what changed
//! ([`Planner::plan_changes`] with the exact [`Changes`] of the step, `everything` only on
//! a first pass) and gets no `inputs.services` at all after its first pass.
//!
//! The events: Service adds (sharing keys, requests, dual-stack, `externalTrafficPolicy:
//! Local`, re-creation under a new uid, a pool named with `aliaslb.io/pool`), removes, pool
//! edits (node selectors, `announce: bgp` with and without `maxNodes`, named pools shared by
//! list and by namespace selector, draining entries and pools, `autoAssign: false`),
//! namespaces relabelled, Node addresses, Nodes going and coming back, agents
//! ready / not ready / unconfirmed, cordons, labels, agent reports holding or dropping IPs,
//! subnets, conflicts with and without a foreign MAC, agents converging on the plan,
//! endpoints moving, lingering IPs, blindness, the cordon policy, time passing and
//! controller restarts.
//!
//! After every step:
//! - B's plans so far (every output merged, gone Services dropped) equal A's plans;
//! - B's Events (in order), releases and first claims equal A's;
//! - usage, pending count, quarantine and the internal table (`fingerprint`) are equal.

mod plan_support;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use aliaslb_core::election::NodeState;
use aliaslb_core::plan::{
    Changes, Inputs, PlanOutput, Planner, ServiceKey, ServicePlan, ServiceView,
};
use aliaslb_core::pool::PoolConfig;
use aliaslb_core::range::Family;
use aliaslb_core::report::{AgentReport, Conflict, InterfaceReport};
use plan_support::*;
use proptest::prelude::*;

const NAMESPACES: [&str; 3] = ["ns0", "ns1", "ns2"];
const NODES: [&str; 3] = ["a", "b", "c"];
/// The pools of the model: `10.0.{0,1,9,5,6}.0/24` (ns0, ns1, fallback, `pool.shared`,
/// `pool.edge`).
const POOLS: [u8; 5] = [0, 1, 9, 5, 6];
/// What a Service may name in `aliaslb.io/pool` (the last is no pool).
const POOL_NAMES: [&str; 4] = ["shared", "edge", "_fallback", "bogus"];

/// A named pool of the model: `n` addresses, who may draw from it (a list of namespaces
/// by index, and/or those labelled `tier: web`), `autoAssign: false`, draining.
#[derive(Debug, Clone)]
struct NamedSpec {
    n: u8,
    namespaces: Vec<usize>,
    selector: bool,
    manual: bool,
    draining: bool,
}

/// A pool config: per namespace 0 and 1 maybe a key of `n` IPv4 addresses (and maybe
/// IPv6), maybe a fallback; options: sharing off and `onConflict: renumber` for ns0, and
/// for ns1 a node selector
/// (`mode` 1), `announce: bgp` (2) or `announce: bgp` with `maxNodes: 1` (3); ns0's first
/// two addresses maybe draining; maybe the named pools `pool.shared` and `pool.edge`
/// (`announce: bgp`), in either order.
#[derive(Debug, Clone)]
struct ConfigSpec {
    own: [Option<(u8, bool)>; 2],
    fallback: Option<u8>,
    sharing_off: bool,
    mode: u8,
    drain_own: bool,
    shared: Option<NamedSpec>,
    edge: Option<NamedSpec>,
    edge_first: bool,
}

impl NamedSpec {
    /// Its options under `config.yaml` (`announce: bgp` for `bgp`).
    fn options(&self, key: &str, bgp: bool) -> String {
        let mut yaml = format!("  {key}:\n");
        if !self.namespaces.is_empty() {
            let names: Vec<&str> = self.namespaces.iter().map(|i| NAMESPACES[*i]).collect();
            yaml.push_str(&format!("    namespaces: [{}]\n", names.join(", ")));
        }
        if self.selector {
            yaml.push_str("    namespaceSelector: {tier: web}\n");
        }
        if self.manual {
            yaml.push_str("    autoAssign: false\n");
        }
        if self.draining {
            yaml.push_str("    draining: true\n");
        }
        if bgp {
            yaml.push_str("    announce: bgp\n");
        }
        yaml
    }
}

impl ConfigSpec {
    fn build(&self) -> PoolConfig {
        let mut pairs: Vec<(String, String)> = Vec::new();
        for (i, own) in self.own.iter().enumerate() {
            if let Some((n, v6)) = own {
                let mut value = match (i, self.drain_own) {
                    // The first two addresses drain, the rest (if any) stay open.
                    (0, true) if *n > 2 => {
                        format!("10.0.0.1-10.0.0.2 draining\n10.0.0.3-10.0.0.{n}")
                    }
                    (0, true) => format!("10.0.0.1-10.0.0.{n} draining"),
                    _ => format!("10.0.{i}.1-10.0.{i}.{n}"),
                };
                if *v6 {
                    value.push_str(&format!("\n2001:db8:{i}::1-2001:db8:{i}::{n}"));
                }
                pairs.push((NAMESPACES[i].to_owned(), value));
            }
        }
        if let Some(n) = self.fallback {
            pairs.push(("_fallback".to_owned(), format!("10.0.9.1-10.0.9.{n}")));
        }
        let mut named = Vec::new();
        if let Some(shared) = &self.shared {
            pairs.push((
                "pool.shared".to_owned(),
                format!("10.0.5.1-10.0.5.{}", shared.n),
            ));
            named.push(shared.options("pool.shared", false));
        }
        if let Some(edge) = &self.edge {
            pairs.push((
                "pool.edge".to_owned(),
                format!("10.0.6.1-10.0.6.{}", edge.n),
            ));
            let options = edge.options("pool.edge", true);
            if self.edge_first {
                named.insert(0, options);
            } else {
                named.push(options);
            }
        }
        let mut yaml = named.concat();
        if self.sharing_off && self.own[0].is_some() {
            yaml.push_str("  ns0:\n    allowSharing: false\n    onConflict: renumber\n");
        }
        if self.own[1].is_some() {
            match self.mode {
                1 => yaml.push_str("  ns1:\n    nodeSelector: {zone: a}\n"),
                2 => yaml.push_str("  ns1:\n    announce: bgp\n"),
                3 => yaml.push_str("  ns1:\n    announce: bgp\n    maxNodes: 1\n"),
                _ => {}
            }
        }
        if !yaml.is_empty() {
            pairs.push(("config.yaml".to_owned(), format!("pools:\n{yaml}")));
        }
        let borrowed: Vec<(&str, &str)> = pairs
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        config(&borrowed)
    }
}

#[derive(Debug, Clone)]
enum Op {
    Add {
        ns: usize,
        name: u8,
        sharing: Option<u8>,
        port: u8,
        /// (pool index 0, 1 or 9, host): may be outside the namespace's pool.
        request: Option<(u8, u8)>,
        /// 0: IPv4, 1: PreferDualStack, 2: RequireDualStack.
        dual: u8,
        local: bool,
        /// `aliaslb.io/pool`: an index in [`POOL_NAMES`].
        pool: Option<usize>,
    },
    Remove(usize),
    /// Namespace `ns` is labelled `tier: web` (`true`) or not.
    NamespaceLabel(usize, bool),
    Config(ConfigSpec),
    /// A Node gets (`true`) or loses address `10.0.{pool}.{host}`.
    NodeAddress(u8, u8, bool),
    /// The Node of a model node lists (`true`) or stops listing `10.0.{pool}.{host}`: its
    /// own address, which anchors the subnets around it that its agent reports (their
    /// edges are withheld then, see `subnet_edges`).
    OwnAddress(usize, u8, u8, bool),
    /// The agent on a node reports (`true`) or stops reporting `10.0.{pool}.{host}`
    /// answered on the LAN by a foreign MAC.
    LanConflict(usize, u8, u8, bool),
    /// The agent on a node reports (`true`) or stops reporting a conflict without a MAC.
    Conflict(usize, u8, u8, bool),
    /// The agent on a node: 0 fresh, 1 lost, 2 unconfirmed, 3 fading (lost, but may still
    /// announce its routed addresses).
    Agent(usize, u8),
    Cordon(usize, bool),
    /// Label `zone: a` (for ns1's selector).
    Label(usize, bool),
    /// The agent on a node reports holding (`true`) or not `10.0.{pool}.{host}`.
    Holds(usize, u8, u8, bool),
    /// Every agent reports holding exactly what is planned on its node.
    Converge,
    /// The agent on a node reports an interface on `10.0.{pool}.0/24` (or drops it); nodes
    /// `b` and `c` report a `/30`, whose broadcast address `.3` the pools list: withheld
    /// while both report it fresh, or one whose Node lists an address in it.
    Subnet(usize, u8, bool),
    /// A Service ClusterIP range `10.0.{pool}.0/30` appears (`true`) or goes.
    ServiceRange(u8, bool),
    /// A node gains (`true`) or loses a ready endpoint of the n-th Service.
    Endpoint(usize, usize, bool),
    /// The Node object goes (`false`) or comes back.
    NodePresent(usize, bool),
    /// The API shows `10.0.{pool}.{host}` on a Service no longer ours.
    Lingering(u8, u8, bool),
    RespectCordon(bool),
    Blind(bool),
    Advance(u64),
    Restart,
}

fn named_spec() -> impl Strategy<Value = NamedSpec> {
    (
        1u8..5,
        prop::sample::subsequence(vec![0usize, 1, 2], 0..=3),
        any::<bool>(),
        prop::bool::weighted(0.2),
        prop::bool::weighted(0.2),
    )
        .prop_map(|(n, namespaces, selector, manual, draining)| NamedSpec {
            n,
            namespaces,
            selector,
            manual,
            draining,
        })
}

fn config_spec() -> impl Strategy<Value = ConfigSpec> {
    (
        prop::option::weighted(0.8, (1u8..5, any::<bool>())),
        prop::option::weighted(0.8, (1u8..5, any::<bool>())),
        prop::option::of(1u8..4),
        prop::bool::weighted(0.2),
        prop::sample::select(vec![0u8, 0, 1, 2, 3]),
        prop::bool::weighted(0.2),
        prop::option::weighted(0.6, named_spec()),
        prop::option::weighted(0.4, named_spec()),
        any::<bool>(),
    )
        .prop_map(
            |(a, b, fallback, sharing_off, mode, drain_own, shared, edge, edge_first)| ConfigSpec {
                own: [a, b],
                fallback,
                sharing_off,
                mode,
                drain_own,
                shared,
                edge,
                edge_first,
            },
        )
}

fn pool() -> impl Strategy<Value = u8> {
    prop::sample::select(POOLS.to_vec())
}

fn op() -> impl Strategy<Value = Op> {
    let n = 0usize..NODES.len();
    prop_oneof![
        8 => (
            0usize..3,
            0u8..6,
            prop::option::weighted(0.3, 0u8..2),
            0u8..3,
            prop::option::weighted(0.2, (pool(), 1u8..5)),
            prop::sample::select(vec![0u8, 0, 0, 1, 2]),
            prop::bool::weighted(0.3),
            prop::option::weighted(0.3, 0usize..POOL_NAMES.len()),
        )
            .prop_map(|(ns, name, sharing, port, request, dual, local, pool)| Op::Add {
                ns,
                name,
                sharing,
                port,
                request,
                dual,
                local,
                pool,
            }),
        1 => (0usize..3, any::<bool>()).prop_map(|(ns, on)| Op::NamespaceLabel(ns, on)),
        3 => any::<prop::sample::Index>().prop_map(|i| Op::Remove(i.index(1000))),
        1 => config_spec().prop_map(Op::Config),
        1 => (pool(), 1u8..5, any::<bool>()).prop_map(|(p, h, on)| Op::NodeAddress(p, h, on)),
        1 => (n.clone(), pool(), 1u8..5, any::<bool>())
            .prop_map(|(a, p, h, on)| Op::OwnAddress(a, p, h, on)),
        1 => (n.clone(), pool(), 1u8..5, any::<bool>())
            .prop_map(|(a, p, h, on)| Op::LanConflict(a, p, h, on)),
        1 => (n.clone(), pool(), 1u8..5, any::<bool>())
            .prop_map(|(a, p, h, on)| Op::Conflict(a, p, h, on)),
        2 => (n.clone(), prop::sample::select(vec![0u8, 0, 1, 1, 2, 3])).prop_map(|(a, s)| Op::Agent(a, s)),
        1 => (n.clone(), any::<bool>()).prop_map(|(a, on)| Op::Cordon(a, on)),
        1 => (n.clone(), any::<bool>()).prop_map(|(a, on)| Op::Label(a, on)),
        2 => (n.clone(), pool(), 1u8..5, any::<bool>())
            .prop_map(|(a, p, h, on)| Op::Holds(a, p, h, on)),
        4 => Just(Op::Converge),
        2 => (n.clone(), pool(), any::<bool>()).prop_map(|(a, p, on)| Op::Subnet(a, p, on)),
        1 => (pool(), any::<bool>()).prop_map(|(p, on)| Op::ServiceRange(p, on)),
        2 => (any::<prop::sample::Index>(), n.clone(), any::<bool>())
            .prop_map(|(i, a, on)| Op::Endpoint(i.index(1000), a, on)),
        1 => (n.clone(), any::<bool>()).prop_map(|(a, on)| Op::NodePresent(a, on)),
        1 => (pool(), 1u8..5, any::<bool>()).prop_map(|(p, h, on)| Op::Lingering(p, h, on)),
        1 => any::<bool>().prop_map(Op::RespectCordon),
        1 => prop::bool::weighted(0.3).prop_map(Op::Blind),
        1 => prop::sample::select(vec![60u64, 700]).prop_map(Op::Advance),
        1 => Just(Op::Restart),
    ]
}

fn view(ns: usize, name: u8, created: i64, op: &Op) -> ServiceView {
    let Op::Add {
        sharing,
        port,
        request,
        dual,
        local,
        pool,
        ..
    } = op
    else {
        unreachable!("only adds make views")
    };
    let mut s = svc(NAMESPACES[ns], &format!("s{name}"))
        .created(created)
        .uid(&format!("uid-{created}"))
        .port(80 + i32::from(*port), "TCP");
    if let Some(k) = sharing {
        s = s.sharing(&format!("k{k}"));
    }
    if let Some((pool, host)) = request {
        s = s.requesting(&format!("10.0.{pool}.{host}"));
    }
    if *local {
        s = s.local();
    }
    if let Some(pool) = pool {
        s = s.pool(POOL_NAMES[*pool]);
    }
    match dual {
        1 => s.families(&[Family::V4, Family::V6], false),
        2 => s.families(&[Family::V4, Family::V6], true),
        _ => s,
    }
}

/// The model: the world both planners see, plus the Node objects that went.
struct Model {
    world: World,
    /// Every node of the model, present or not (its state kept while absent).
    all_nodes: BTreeMap<String, NodeState>,
    present: BTreeSet<String>,
}

impl Model {
    fn node(&mut self, i: usize) -> &mut NodeState {
        self.all_nodes.get_mut(NODES[i]).expect("model node")
    }

    fn report(&mut self, i: usize) -> &mut AgentReport {
        self.world.report_mut(NODES[i])
    }

    /// Copies the present nodes into the world.
    fn sync_nodes(&mut self) {
        self.world.nodes = self
            .all_nodes
            .values()
            .filter(|n| self.present.contains(&*n.name))
            .cloned()
            .collect();
    }

    fn apply(&mut self, op: &Op, created: &mut i64, last: &BTreeMap<ServiceKey, Box<ServicePlan>>) {
        let addr = |pool: u8, host: u8| ip(&format!("10.0.{pool}.{host}"));
        match op {
            Op::Add { ns, name, .. } => {
                *created += 1;
                let v = view(*ns, *name, *created, op);
                self.world.services.retain(|s| s.key != v.key);
                self.world.services.push(v);
            }
            Op::Remove(i) => {
                if !self.world.services.is_empty() {
                    let i = i % self.world.services.len();
                    let gone = self.world.services.remove(i);
                    self.world.local.remove(&gone.key);
                }
            }
            Op::Config(spec) => self.world.config = spec.build(),
            Op::NamespaceLabel(ns, on) => {
                let labels = self
                    .world
                    .namespaces
                    .entry(NAMESPACES[*ns].to_owned())
                    .or_default();
                if *on {
                    labels.insert("tier".to_owned(), "web".to_owned());
                } else {
                    labels.remove("tier");
                }
            }
            Op::NodeAddress(pool, host, on) => {
                let address = format!("10.0.{pool}.{host}");
                if *on {
                    self.world
                        .node_has(&format!("node-{pool}-{host}"), &address);
                } else {
                    self.world.node_drops(&address);
                }
            }
            Op::OwnAddress(a, pool, host, on) => {
                let address = format!("10.0.{pool}.{host}");
                if *on {
                    self.world.node_has(NODES[*a], &address);
                } else {
                    self.world.node_drops(&address);
                }
            }
            Op::LanConflict(a, pool, host, on) | Op::Conflict(a, pool, host, on) => {
                let lan = matches!(op, Op::LanConflict(..));
                let at = addr(*pool, *host);
                let report = self.report(*a);
                report
                    .conflicts
                    .retain(|c| c.ip != at || c.mac.is_some() != lan);
                if *on {
                    report.conflicts.push(Conflict {
                        // Odd hosts: a claim against the holder (withholds only under
                        // `onConflict: renumber`); even: an answered probe.
                        while_held: lan && host % 2 == 1,
                        // Claims on hosts 3 mod 4: the holder yielded to it.
                        yielded: lan && host % 4 == 3,
                        ip: at,
                        reason: "answered".to_owned(),
                        mac: lan.then(|| "46:b0:48:e8:2d:96".parse().unwrap()),
                        interface: lan.then(|| "eth1".to_owned()),
                    });
                }
            }
            Op::Agent(a, state) => {
                let n = self.node(*a);
                n.agent_ready = *state == 0;
                n.agent_unconfirmed = *state == 2;
                // 3: lost, but it may still announce its routed addresses (fading).
                n.agent_announcing = *state != 1;
            }
            Op::Cordon(a, on) => self.node(*a).unschedulable = *on,
            Op::Label(a, on) => {
                let labels = &mut self.node(*a).labels;
                if *on {
                    labels.insert("zone".to_owned(), "a".to_owned());
                } else {
                    labels.remove("zone");
                }
            }
            Op::Holds(a, pool, host, on) => {
                let at = addr(*pool, *host);
                let report = self.report(*a);
                if *on {
                    report.held.insert(at);
                } else {
                    report.held.remove(&at);
                }
            }
            Op::Converge => {
                for (i, name) in NODES.iter().enumerate() {
                    let held: BTreeSet<IpAddr> = last
                        .values()
                        .filter(|p| {
                            p.node.as_deref() == Some(*name)
                                || p.nodes.iter().any(|n| &**n == *name)
                        })
                        .flat_map(|p| p.ips.iter().copied())
                        .collect();
                    self.report(i).held = held;
                }
            }
            Op::Subnet(a, pool, on) => {
                let prefix = if *a == 0 { 24 } else { 30 };
                let net: ipnet::IpNet = format!("10.0.{pool}.0/{prefix}").parse().unwrap();
                let name = format!("net{pool}");
                let report = self.report(*a);
                report.interfaces.retain(|i| i.name != name);
                if *on {
                    report.interfaces.push(InterfaceReport {
                        addresses: Vec::new(),
                        name,
                        subnets: vec![net],
                        mac: None,
                    });
                }
                let n = self.node(*a);
                n.subnets.retain(|s| *s != net);
                if *on {
                    n.subnets.push(net);
                }
            }
            Op::ServiceRange(pool, on) => {
                let net: ipnet::IpNet = format!("10.0.{pool}.0/30").parse().unwrap();
                self.world.service_ranges.retain(|r| *r != net);
                if *on {
                    self.world.service_ranges.push(net);
                }
            }
            Op::Endpoint(i, a, on) => {
                if !self.world.services.is_empty() {
                    let key = self.world.services[i % self.world.services.len()]
                        .key
                        .clone();
                    let nodes = self.world.local.entry(key.clone()).or_default();
                    if *on {
                        nodes.insert(NODES[*a].to_owned());
                    } else {
                        nodes.remove(NODES[*a]);
                        if nodes.is_empty() {
                            self.world.local.remove(&key);
                        }
                    }
                }
            }
            Op::NodePresent(a, on) => {
                if *on {
                    self.present.insert(NODES[*a].to_owned());
                } else {
                    self.present.remove(NODES[*a]);
                }
            }
            Op::Lingering(pool, host, on) => {
                if *on {
                    self.world.lingering.insert(addr(*pool, *host));
                } else {
                    self.world.lingering.remove(&addr(*pool, *host));
                }
            }
            Op::RespectCordon(on) => self.world.respect_cordon = *on,
            Op::Blind(on) => self.world.agents_unobservable = *on,
            Op::Advance(secs) => self.world.advance(Duration::from_secs(*secs)),
            Op::Restart => {}
        }
        self.sync_nodes();
    }
}

/// What a pass of B reads of the world besides `inputs.services`, as of the last pass.
#[derive(Default)]
struct Snapshot {
    services: BTreeMap<ServiceKey, ServiceView>,
    nodes: BTreeMap<String, NodeState>,
    agents: aliaslb_core::plan::Reports,
    local: BTreeMap<ServiceKey, BTreeSet<String>>,
}

impl Snapshot {
    fn of(world: &World) -> Self {
        Snapshot {
            services: world
                .services
                .iter()
                .map(|s| (s.key.clone(), s.clone()))
                .collect(),
            nodes: world
                .nodes
                .iter()
                .map(|n| (n.name.to_string(), n.clone()))
                .collect(),
            agents: world.agents.clone(),
            local: world.local.clone(),
        }
    }

    /// The exact changes from `self` to `now`.
    fn changes(&self, now: &Snapshot) -> Changes {
        let mut changes = Changes::default();
        let keys: BTreeSet<&ServiceKey> = self.services.keys().chain(now.services.keys()).collect();
        for key in keys {
            let (before, after) = (self.services.get(key), now.services.get(key));
            if before != after {
                changes
                    .services
                    .push((key.clone(), after.cloned().map(Arc::new)));
            }
        }
        let names: BTreeSet<&String> = self
            .nodes
            .keys()
            .chain(now.nodes.keys())
            .chain(self.agents.keys())
            .chain(now.agents.keys())
            .collect();
        for name in names {
            if self.nodes.get(name) != now.nodes.get(name)
                || self.agents.get(name) != now.agents.get(name)
            {
                changes.nodes.insert(name.clone());
            }
        }
        let keys: BTreeSet<&ServiceKey> = self.local.keys().chain(now.local.keys()).collect();
        for key in keys {
            if self.local.get(key) != now.local.get(key) {
                changes.endpoints.insert(key.clone());
            }
        }
        // Namespace labels are no change a caller lists (see `must_plan_everything`).
        changes
    }
}

/// B's pass: no `inputs.services` unless `changes.everything`.
fn plan_b(world: &World, planner: &mut Planner, changes: &Changes) -> PlanOutput {
    let services: Vec<Arc<ServiceView>> = if changes.everything {
        world.services.iter().cloned().map(Arc::new).collect()
    } else {
        Vec::new()
    };
    planner.plan_changes(
        &Inputs {
            config: &world.config,
            namespaces: &world.namespaces,
            services: &services,
            nodes: &world.nodes,
            agents: &world.agents,
            lingering: &world.lingering,
            node_addresses: &world.node_addresses,
            service_ranges: &world.service_ranges,
            not_ours: &world.not_ours,
            local_endpoints: &world.local,
            respect_cordon: world.respect_cordon,
            agents_unobservable: world.agents_unobservable,
            now: world.now,
        },
        changes,
    )
}

/// Lists everything in `now` as changed, besides what `changes` says.
fn overstate(changes: &mut Changes, now: &Snapshot) {
    let listed: BTreeSet<ServiceKey> = changes.services.iter().map(|(k, _)| k.clone()).collect();
    for (key, view) in &now.services {
        if !listed.contains(key) {
            changes
                .services
                .push((key.clone(), Some(Arc::new(view.clone()))));
        }
    }
    changes.nodes.extend(now.nodes.keys().cloned());
    changes.endpoints.extend(now.services.keys().cloned());
}

fn compare(
    world: &World,
    a: &Planner,
    b: &Planner,
    out_a: &PlanOutput,
    out_b: &PlanOutput,
    merged: &mut BTreeMap<ServiceKey, Box<ServicePlan>>,
) -> Result<(), TestCaseError> {
    let present: BTreeSet<&ServiceKey> = world.services.iter().map(|s| &s.key).collect();
    for key in out_b.services.keys() {
        prop_assert!(present.contains(key), "B planned {} which is gone", key);
    }
    merged.extend(out_b.services.iter().map(|(k, p)| (k.clone(), p.clone())));
    merged.retain(|k, _| present.contains(k));
    for (key, plan) in &out_a.services {
        prop_assert_eq!(merged.get(key), Some(plan), "plan of {}", key);
    }
    prop_assert_eq!(merged.len(), out_a.services.len());
    prop_assert_eq!(&out_b.events, &out_a.events);
    prop_assert_eq!(&out_b.released, &out_a.released);
    prop_assert_eq!(&out_b.probe, &out_a.probe);
    prop_assert_eq!(b.usage(), a.usage());
    prop_assert_eq!(b.pending(), a.pending());
    prop_assert_eq!(b.pending_by_reason(), a.pending_by_reason());
    prop_assert_eq!(
        b.quarantined().collect::<Vec<_>>(),
        a.quarantined().collect::<Vec<_>>()
    );
    prop_assert_eq!(b.fingerprint(), a.fingerprint());
    Ok(())
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(800)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]
    #[test]
    fn narrowed_passes_equal_full_passes(
        initial in config_spec(),
        ops in prop::collection::vec((op(), prop::bool::weighted(0.1)), 1..50),
    ) {
        let mut world = World::new(initial.build(), Vec::new());
        world.nodes.push(node("c"));
        let mut model = Model {
            all_nodes: world.nodes.iter().map(|n| (n.name.to_string(), n.clone())).collect(),
            present: NODES.iter().map(|n| (*n).to_owned()).collect(),
            world,
        };
        let (mut a, mut b) = (Planner::new(), Planner::new());
        let out_a = model.world.plan(&mut a);
        let out_b = plan_b(&model.world, &mut b, &Changes::everything());
        let mut merged = BTreeMap::new();
        compare(&model.world, &a, &b, &out_a, &out_b, &mut merged)?;
        let mut last = out_a.services;
        let mut created = 0i64;
        let mut before = Snapshot::of(&model.world);
        for (op, noisy) in &ops {
            model.apply(op, &mut created, &last);
            let restart = matches!(op, Op::Restart);
            if restart {
                a = Planner::new();
                b = Planner::new();
            }
            let now = Snapshot::of(&model.world);
            let mut changes = if restart { Changes::everything() } else { before.changes(&now) };
            if *noisy {
                // A caller may list more than changed: every Service, node and endpoint set.
                overstate(&mut changes, &now);
            }
            let out_a = model.world.plan(&mut a);
            let out_b = plan_b(&model.world, &mut b, &changes);
            compare(&model.world, &a, &b, &out_a, &out_b, &mut merged)?;
            // The controller's writes land: the API now shows what was planned.
            for s in &mut model.world.services {
                let p = &out_a.services[&s.key];
                s.observed_ips = p.ips.clone();
                s.observed_node = p.node.as_deref().map(str::to_owned);
            }
            before = now;
            last = out_a.services;
        }
    }
}

/// A settled world of `n` Services in namespace `shop` (pool of 64), nodes a and b, each
/// agent holding what it carries; the planner and its last output.
fn settled(n: usize) -> (World, Planner, PlanOutput) {
    let mut world = World::new(config(&[("shop", "10.0.0.0/26")]), Vec::new());
    for i in 0..n {
        world
            .services
            .push(svc("shop", &format!("s{i}")).created(i as i64));
    }
    let mut planner = Planner::new();
    let mut out = plan_b(&world, &mut planner, &Changes::everything());
    for _ in 0..2 {
        for s in &mut world.services {
            let p = &out.services[&s.key];
            s.observed_ips = p.ips.clone();
            s.observed_node = p.node.as_deref().map(str::to_owned);
        }
        for name in ["a", "b"] {
            world.holds(name, "");
            let held: Vec<String> = out
                .services
                .values()
                .filter(|p| p.node.as_deref() == Some(name))
                .flat_map(|p| p.ips.iter().map(ToString::to_string))
                .collect();
            world.holds(name, &held.join(","));
        }
        out = plan_b(&world, &mut planner, &Changes::everything());
    }
    (world, planner, out)
}

#[test]
fn a_narrowed_pass_with_nothing_changed_plans_nothing() {
    let (world, mut planner, _) = settled(20);
    let out = plan_b(&world, &mut planner, &Changes::default());
    assert!(out.services.is_empty(), "{:?}", out.services.keys());
    assert!(out.events.is_empty(), "{:?}", out.events);
}

#[test]
fn a_new_service_replans_only_itself() {
    let (mut world, mut planner, _) = settled(20);
    let view = svc("shop", "new").created(100);
    world.services.push(view.clone());
    let changes = Changes {
        services: vec![(view.key.clone(), Some(Arc::new(view)))],
        ..Changes::default()
    };
    let out = plan_b(&world, &mut planner, &changes);
    let planned: Vec<String> = out.services.keys().map(ToString::to_string).collect();
    assert_eq!(planned, ["shop/new"]);
    assert_eq!(ips(&out, "shop", "new"), ["10.0.0.21"]);
}

#[test]
fn one_more_held_ip_replans_only_its_service() {
    let (mut world, mut planner, out) = settled(20);
    let plan = plan_of(&out, "shop", "s3").clone();
    let node = plan.node.clone().expect("s3 is placed");
    world.report_mut(&node).held.remove(&plan.ips[0]);
    let changes = Changes {
        nodes: BTreeSet::from([node.to_string()]),
        ..Changes::default()
    };
    let out = plan_b(&world, &mut planner, &changes);
    let planned: Vec<String> = out.services.keys().map(ToString::to_string).collect();
    assert_eq!(planned, ["shop/s3"]);
    assert!(!plan_of(&out, "shop", "s3").announced.status);
    world.report_mut(&node).held.insert(plan.ips[0]);
    let out = plan_b(&world, &mut planner, &changes);
    assert_eq!(out.services.len(), 1);
    assert!(plan_of(&out, "shop", "s3").announced.status);
}

#[test]
fn a_cordoned_node_replans_its_groups_and_a_config_change_everything() {
    let (mut world, mut planner, out) = settled(20);
    let on_a = out
        .services
        .values()
        .filter(|p| p.node.as_deref() == Some("a"))
        .count();
    world.node_mut("a").unschedulable = true;
    let changes = Changes {
        nodes: BTreeSet::from(["a".to_owned()]),
        ..Changes::default()
    };
    let out = plan_b(&world, &mut planner, &changes);
    assert_eq!(out.services.len(), on_a, "the groups on a, no other");
    assert!(
        out.services.values().all(|p| p.node.is_none()),
        "moving off a"
    );
    world.config = config(&[("shop", "10.0.0.0/25")]);
    let out = plan_b(&world, &mut planner, &Changes::default());
    assert_eq!(out.services.len(), 20, "a new config plans every Service");
}

/// Issue 42, a scripted history besides the random ones (where a held subnet edge is rare):
/// a node's word on a held address (a Node address, an anchored subnet's broadcast address,
/// a subnet two fresh agents report) keeps it with its Service, narrowed as in full, through
/// the agents going stale and blind and back.
#[test]
fn a_nodes_word_on_a_held_address_is_planned_the_same_narrowed() {
    let mut world = World::new(config(&[("shop", "10.0.0.1-10.0.0.7")]), Vec::new());
    world.nodes.push(node("c"));
    for i in 0..7 {
        world
            .services
            .push(svc("shop", &format!("s{i}")).created(i));
    }
    let (mut a, mut b) = (Planner::new(), Planner::new());
    let out_a = world.plan(&mut a);
    let out_b = plan_b(&world, &mut b, &Changes::everything());
    let mut merged = BTreeMap::new();
    compare(&world, &a, &b, &out_a, &out_b, &mut merged).unwrap();
    let mut before = Snapshot::of(&world);
    type Step = fn(&mut World);
    let steps: [(&str, Step); 9] = [
        ("b reports the /29, unanchored: nothing withheld", |w| {
            w.node_mut("b").subnets = vec!["10.0.0.0/29".parse().unwrap()];
        }),
        ("b's Node lists an address in it: .7 withheld, kept", |w| {
            w.node_has("b", "10.0.0.9");
            w.node_has("b", "10.0.0.6");
        }),
        ("c reports it too", |w| {
            w.node_mut("c").subnets = vec!["10.0.0.0/29".parse().unwrap()];
        }),
        ("b's Node drops its address: still two reporters", |w| {
            w.node_drops("10.0.0.6");
        }),
        ("blind: the withheld addresses stay", |w| {
            for n in &mut w.nodes {
                n.agent_ready = false;
                n.agent_unconfirmed = true;
            }
            w.agents_unobservable = true;
        }),
        (
            "seeing again, c stale: one reporter, nothing withheld",
            |w| {
                w.agents_unobservable = false;
                for n in &mut w.nodes {
                    n.agent_ready = &*n.name != "c";
                    n.agent_unconfirmed = false;
                }
            },
        ),
        ("s6 is deleted while another node lists its address", |w| {
            w.node_has("x", "10.0.0.7");
            w.remove("shop", "s6");
        }),
        ("a new Service waits: .7 is withheld", |w| {
            w.advance(aliaslb_core::plan::STICKY_FOR * 2);
            w.services.push(svc("shop", "late").created(10));
        }),
        ("the Node drops it: the new Service gets it", |w| {
            w.node_drops("10.0.0.7");
        }),
    ];
    let mut claims = 0;
    for (what, step) in steps {
        step(&mut world);
        let now = Snapshot::of(&world);
        let changes = before.changes(&now);
        let out_a = world.plan(&mut a);
        let out_b = plan_b(&world, &mut b, &changes);
        claims += out_a
            .events
            .iter()
            .filter(|e| e.reason == "NodeClaim")
            .count();
        compare(&world, &a, &b, &out_a, &out_b, &mut merged)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        for s in &mut world.services {
            let p = &out_a.services[&s.key];
            s.observed_ips = p.ips.clone();
            s.observed_node = p.node.as_deref().map(str::to_owned);
        }
        before = now;
    }
    assert_eq!(ips_of(&merged, "shop", "late"), ["10.0.0.7"]);
    assert!(claims >= 2, "{claims} NodeClaim Events");
}

/// The IPs of `ns/name` in merged plans.
fn ips_of(plans: &BTreeMap<ServiceKey, Box<ServicePlan>>, ns: &str, name: &str) -> Vec<String> {
    plans[&key(ns, name)]
        .ips
        .iter()
        .map(ToString::to_string)
        .collect()
}
