//! Cost of one planner pass, side by side in one run: a full pass at 10,000 settled
//! Services (5 nodes, 50 namespaces with a /22 pool each, every agent holding what it
//! carries), narrowed passes ([`Planner::plan_changes`]) after one Service is added, after
//! one agent reports one more held IP and after nothing changed (a Lease renewal), and the
//! floor: a full pass with no Service at all.
//!
//! `cargo run --release -p aliaslb-core --example plan_passes [-- SERVICES [ROUNDS]]`
//!
//! Prints the median and the 90th percentile of each, in microseconds.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// No namespace labels (no pool selects namespaces), in this example.
static NAMESPACE_LABELS: BTreeMap<String, aliaslb_core::pool::Labels> = BTreeMap::new();

/// No Service that stopped being ours, in this example.
static NOT_OURS: std::collections::BTreeSet<aliaslb_core::plan::ServiceKey> =
    std::collections::BTreeSet::new();

use aliaslb_core::election::NodeState;
use aliaslb_core::plan::{
    Changes, FamilyPolicy, Inputs, NodeAddress, Planner, PortKey, ServiceKey, ServiceView,
};
use aliaslb_core::pool::PoolConfig;
use aliaslb_core::range::Family;
use aliaslb_core::report::AgentReport;

const NAMESPACES: usize = 50;
const NODES: usize = 5;

/// Everything an [`Inputs`] borrows.
struct World {
    config: PoolConfig,
    services: Vec<Arc<ServiceView>>,
    nodes: Vec<NodeState>,
    agents: aliaslb_core::plan::Reports,
    lingering: BTreeSet<IpAddr>,
    node_addresses: BTreeMap<IpAddr, NodeAddress>,
    local: BTreeMap<ServiceKey, BTreeSet<String>>,
    now: Instant,
}

impl World {
    fn inputs<'a>(&'a self, services: &'a [Arc<ServiceView>]) -> Inputs<'a> {
        Inputs {
            config: &self.config,
            namespaces: &NAMESPACE_LABELS,
            services,
            nodes: &self.nodes,
            agents: &self.agents,
            lingering: &self.lingering,
            node_addresses: &self.node_addresses,
            service_ranges: &[],
            not_ours: &NOT_OURS,
            local_endpoints: &self.local,
            respect_cordon: true,
            agents_unobservable: false,
            now: self.now,
        }
    }
}

fn service(i: usize) -> Arc<ServiceView> {
    let ns = format!("ns{}", i % NAMESPACES);
    Arc::new(ServiceView {
        key: ServiceKey::new(&ns, &format!("svc-{i}")),
        uid: format!("uid-{i}").into(),
        created: i as i64,
        families: FamilyPolicy {
            families: vec![Family::V4],
            require_all: false,
        },
        requested: Ok(Vec::new()),
        sharing_key: None,
        pool: None,
        ports: vec![PortKey {
            port: 80,
            protocol: "TCP".into(),
        }],
        local_traffic: false,
        observed_ips: Vec::new(),
        observed_node: None,
    })
}

fn world(services: usize) -> World {
    let data: BTreeMap<String, String> = (0..NAMESPACES)
        .map(|i| {
            (
                format!("ns{i}"),
                format!("10.{}.{}.0/22", 10 + i / 60, (i % 60) * 4),
            )
        })
        .collect();
    let config = PoolConfig::parse(&data).expect("the benchmark's pool config is valid");
    let nodes = (0..NODES)
        .map(|i| NodeState {
            name: format!("node-{i}").into(),
            agent_ready: true,
            ..NodeState::default()
        })
        .collect();
    World {
        config,
        services: (0..services).map(service).collect(),
        nodes,
        agents: BTreeMap::new(),
        lingering: BTreeSet::new(),
        node_addresses: BTreeMap::new(),
        local: BTreeMap::new(),
        now: Instant::now(),
    }
}

/// Plans until settled: the API shows every plan, each agent holds what it carries.
/// Returns the planner, one IP held by `node-0` (the agents' reports below leave it out
/// so that a report can gain it) and its Service.
fn settle(world: &mut World) -> (Planner, Option<(IpAddr, ServiceKey)>) {
    let mut planner = Planner::new();
    let inputs_services = world.services.clone();
    let out = planner.plan(&world.inputs(&inputs_services));
    let mut held: BTreeMap<String, BTreeSet<IpAddr>> = BTreeMap::new();
    world.services = world
        .services
        .iter()
        .map(|v| {
            let plan = &out.services[&v.key];
            if let Some(node) = &plan.node {
                held.entry(node.to_string())
                    .or_default()
                    .extend(plan.ips.iter().copied());
            }
            let mut v = (**v).clone();
            v.observed_ips = plan.ips.clone();
            v.observed_node = plan.node.as_deref().map(str::to_owned);
            Arc::new(v)
        })
        .collect();
    let spare = out
        .services
        .iter()
        .find(|(_, p)| p.node.as_deref() == Some("node-0"))
        .map(|(k, p)| (p.ips[0], k.clone()));
    for node in &world.nodes {
        let mut report = AgentReport {
            held: held.remove(&*node.name).unwrap_or_default(),
            ..AgentReport::default()
        };
        if let Some((ip, _)) = &spare {
            report.held.remove(ip);
        }
        world
            .agents
            .insert(node.name.to_string(), std::sync::Arc::new(report));
    }
    let services = world.services.clone();
    planner.plan(&world.inputs(&services));
    planner.plan(&world.inputs(&services));
    (planner, spare)
}

/// Median and 90th percentile of `samples`, in microseconds.
fn figures(samples: &mut [Duration]) -> (f64, f64) {
    samples.sort();
    let at = |q: f64| {
        let i = ((samples.len() as f64 - 1.0) * q).round() as usize;
        samples[i].as_secs_f64() * 1e6
    };
    (at(0.5), at(0.9))
}

fn print(what: &str, samples: &mut [Duration]) {
    let (p50, p90) = figures(samples);
    println!("{what:<58} p50 {p50:>10.1} us   p90 {p90:>10.1} us");
}

fn main() {
    let mut args = std::env::args().skip(1);
    let count: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(10_000);
    let rounds: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(50);
    println!(
        "planner passes: {count} Services, {NODES} nodes, {NAMESPACES} namespaces with a /22 \
         pool each, {rounds} rounds"
    );

    // The floor: no Service.
    let mut empty = world(0);
    let (mut planner, _) = settle(&mut empty);
    let mut floor = Vec::new();
    for _ in 0..rounds {
        let started = Instant::now();
        planner.plan(&empty.inputs(&[]));
        floor.push(started.elapsed());
    }

    let mut w = world(count);
    let (mut planner, spare) = settle(&mut w);
    let services = w.services.clone();
    let mut full = Vec::new();
    for _ in 0..rounds {
        let started = Instant::now();
        let out = planner.plan(&w.inputs(&services));
        full.push(started.elapsed());
        assert!(out.events.is_empty(), "settled: {:?}", out.events.first());
    }

    // Narrowed: nothing changed (an agent's renewal that changes nothing a pass reads).
    let mut idle = Vec::new();
    for _ in 0..rounds {
        let started = Instant::now();
        planner.plan_changes(&w.inputs(&[]), &Changes::default());
        idle.push(started.elapsed());
    }

    // Narrowed: one Service added (timed), then removed again (not timed).
    let mut added = Vec::new();
    for round in 0..rounds {
        let view = service(count + round);
        let key = view.key.clone();
        let changes = Changes {
            services: vec![(key.clone(), Some(view))],
            ..Changes::default()
        };
        let started = Instant::now();
        let out = planner.plan_changes(&w.inputs(&[]), &changes);
        added.push(started.elapsed());
        assert!(
            out.services[&key].allocated.status,
            "the new Service got an IP"
        );
        let changes = Changes {
            services: vec![(key, None)],
            ..Changes::default()
        };
        planner.plan_changes(&w.inputs(&[]), &changes);
    }

    // Narrowed: node-0's agent reports one more held IP (timed), then drops it again.
    let mut report = Vec::new();
    if let Some((ip, key)) = spare {
        let nodes = Changes {
            nodes: BTreeSet::from(["node-0".to_owned()]),
            ..Changes::default()
        };
        for _ in 0..rounds {
            if let Some(r) = w.agents.get_mut("node-0").map(std::sync::Arc::make_mut) {
                r.held.insert(ip);
            }
            let started = Instant::now();
            let out = planner.plan_changes(&w.inputs(&[]), &nodes);
            report.push(started.elapsed());
            assert!(
                out.services[&key].announced.status,
                "{key} is announced now"
            );
            if let Some(r) = w.agents.get_mut("node-0").map(std::sync::Arc::make_mut) {
                r.held.remove(&ip);
            }
            planner.plan_changes(&w.inputs(&[]), &nodes);
        }
    }

    print("full pass, 0 Services (floor)", &mut floor);
    print(&format!("full pass, {count} Services"), &mut full);
    print(
        &format!("narrowed pass, {count} Services, nothing changed"),
        &mut idle,
    );
    print(
        &format!("narrowed pass, {count} Services, 1 Service added"),
        &mut added,
    );
    if !report.is_empty() {
        print(
            &format!("narrowed pass, {count} Services, 1 more IP held by an agent"),
            &mut report,
        );
    }
}
