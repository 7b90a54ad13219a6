//! The controller's memory with agent reports at their bounds (issue 42): the release
//! `aliaslb-controller` binary in a subprocess against the real kube-apiserver (testenv),
//! its RSS read from `/proc`. Not CI: figures in BENCHMARKS.md.
//!
//! Agents here are Leases, each written once with a report as large as the API accepts
//! (`--report-bytes`, 255 KiB by default: the annotations of an object may not pass 256 KiB
//! together) and a lease of an hour, so each is fresh when the controller reads it, without
//! renewals (5,000 agents renewing 255 KiB every 10 s would be the apiserver's bench, not
//! ours). A report holds four interfaces (a MAC and four subnets each) and, to fill it,
//! IPv4 addresses it holds: the field that costs the controller most per byte, each agent
//! a window of a /16 pool, so they overlap as Services on real nodes cannot but a compromised
//! node's may.
//! 1. the floor: the controller with one small agent (the holder) and one Service, its RSS
//!    once it has planned;
//! 2. `--agents N` Nodes, each with its agent Lease at the bound; the controller started
//!    again, its RSS (`VmRSS`, and the peak `VmHWM`) once its pass has read every report
//!    and written (the holder's index lists every agent's MACs), plus `--settle` seconds:
//!    the difference with the floor, per agent;
//! 3. with `--ghosts M`: M Leases `aliaslb-agent-<x>` whose Node `<x>` does not exist, each
//!    at the bound with a MAC of its own: counted by `aliaslb_agent_leases_ignored`, none of
//!    their MACs in any node's assignment object.
//!
//! ```text
//! cargo build --release -p aliaslb-controller --bin aliaslb-controller
//! KUBEBUILDER_ASSETS=$HOME/.cache/aliaslb/kube-v1.37.2/bin \
//!   cargo run --release -p aliaslb-controller --example agent_reports -- \
//!   [--agents 5000] [--ghosts 0] [--report-bytes 261120] [--settle 10]
//! ```
//! `ALIASLB_CONTROLLER_BIN` overrides the binary (default `target/release/aliaslb-controller`).

mod support;

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use aliaslb_controller::write::assignments;
use aliaslb_core::keys;
use aliaslb_core::mac::Mac;
use aliaslb_core::report::{AgentReport, InterfaceReport, MAX_REPORT_BYTES, REPORT_VERSION};
use aliaslb_testenv::{TestEnv, fixtures};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use support::{controller_binary, get, malloc_arenas, proc_kib, rss_split, start_controller};

/// The controller's identity (its leader Lease).
const IDENTITY: &str = "reports-controller";
/// The one pool: a /16, so a report's held addresses are all pool addresses.
const POOL: &str = "10.200.0.0/16";
/// Lease writes in flight at once.
const IN_FLIGHT: usize = 16;

struct Options {
    agents: usize,
    ghosts: usize,
    report_bytes: usize,
    settle: u64,
}

impl Options {
    fn parse() -> Result<Options, String> {
        let mut o = Options {
            agents: 5000,
            ghosts: 0,
            report_bytes: MAX_REPORT_BYTES - 1024,
            settle: 10,
        };
        let mut args = std::env::args().skip(1);
        while let Some(flag) = args.next() {
            let value = args.next().ok_or(format!("{flag} needs a value"))?;
            let n: usize = value.parse().map_err(|e| format!("{flag} {value}: {e}"))?;
            match flag.as_str() {
                "--agents" => o.agents = n,
                "--ghosts" => o.ghosts = n,
                "--report-bytes" => o.report_bytes = n.min(MAX_REPORT_BYTES - 1024),
                "--settle" => o.settle = n as u64,
                _ => return Err(format!("unknown flag {flag}")),
            }
        }
        Ok(o)
    }
}

/// Agent `i`'s report, as close to `bytes` as it gets: four interfaces with a MAC and four
/// subnets each, the MAC `mac`, and held addresses of [`POOL`] from a window of its own.
fn report(i: usize, mac: Mac, bytes: usize) -> String {
    let mut report = AgentReport {
        version: REPORT_VERSION,
        interfaces: (0..4u8)
            .map(|k| InterfaceReport {
                name: format!("enp{k}s0f1"),
                subnets: (0..4u8)
                    .map(|s| format!("10.{}.{s}.0/24", 100 + k).parse().unwrap())
                    .collect(),
                mac: Some(Mac([2, 0xb, (i >> 16) as u8, (i >> 8) as u8, i as u8, k])),
                addresses: Vec::new(),
            })
            .collect(),
        macs: vec![mac],
        ..AgentReport::default()
    };
    let base = u32::from(Ipv4Addr::new(10, 200, 0, 0));
    let start = (i as u32).wrapping_mul(7919) % 65_536;
    // Each address adds its text, two quotes and a comma to the JSON: counted, not
    // serialized again (the first needs no comma).
    let mut length = report.to_json().len();
    let mut n = 0u32;
    while n < 65_536 {
        let ip = Ipv4Addr::from(base + (start + n) % 65_536);
        let more = ip.to_string().len() + 2 + usize::from(n > 0);
        if length + more > bytes {
            break;
        }
        length += more;
        report.held.insert(ip.into());
        n += 1;
    }
    let json = report.to_json();
    assert!(json.len() <= bytes, "{} > {bytes}", json.len());
    json
}

/// The agent Lease of `node` with `report`, renewed now for an hour.
fn lease(node: &str, report: &str) -> serde_json::Value {
    json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {
            "name": keys::agent_lease_name(node),
            "annotations": {keys::ANNOTATION_AGENT_REPORT: report},
        },
        "spec": {
            "holderIdentity": node,
            "leaseDurationSeconds": 3600,
            "renewTime": MicroTime(Timestamp::now()),
        },
    })
}

/// Writes `leases` (node, report), [`IN_FLIGHT`] at once; how long it took.
async fn write_leases(api: &Api<Lease>, leases: Vec<(String, String)>) -> Duration {
    let t0 = Instant::now();
    futures::stream::iter(leases)
        .for_each_concurrent(IN_FLIGHT, |(node, report)| async move {
            api.patch(
                &keys::agent_lease_name(&node),
                &PatchParams::apply(keys::AGENT_FIELD_MANAGER).force(),
                &Patch::Apply(lease(&node, &report)),
            )
            .await
            .unwrap_or_else(|e| panic!("writing the Lease of {node}: {e}"));
        })
        .await;
    t0.elapsed()
}

/// Creates the Nodes `names`, [`IN_FLIGHT`] at once.
async fn create_nodes(api: &Api<Node>, names: &[String]) {
    futures::stream::iter(names)
        .for_each_concurrent(IN_FLIGHT, |name| async move {
            let node: Node = serde_json::from_value(
                json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}),
            )
            .unwrap();
            api.create(&PostParams::default(), &node)
                .await
                .unwrap_or_else(|e| panic!("creating Node {name}: {e}"));
        })
        .await;
}

/// The value of metric `name` (a line without labels) on the controller at `addr`.
fn metric(addr: std::net::SocketAddr, name: &str) -> Option<f64> {
    let (_, body) = get(addr, "/metrics")?;
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))?
        .trim()
        .parse()
        .ok()
}

/// How many node series of `aliaslb_node_agent_renewal_age_seconds` the controller shows:
/// the agents its pass has read.
fn agents_seen(addr: std::net::SocketAddr) -> usize {
    get(addr, "/metrics").map_or(0, |(_, body)| {
        body.lines()
            .filter(|l| l.starts_with("aliaslb_node_agent_renewal_age_seconds{"))
            .count()
    })
}

/// How many MACs the index of `node` lists (0 while it has none).
async fn macs_listed(configmaps: &Api<ConfigMap>, node: &str) -> usize {
    let Ok(Some(cm)) = configmaps.get_opt(&keys::assignment_configmap(node)).await else {
        return 0;
    };
    cm.data
        .as_ref()
        .and_then(|d| d.get(keys::NODE_MACS_KEY))
        .map_or(0, |text| {
            text.lines().filter(|l| !l.trim().is_empty()).count()
        })
}

/// Starts the controller (`which` names its log), waits until its pass saw `agents` agents
/// and `ghosts` ignored Leases and its index of `holder` lists `macs` MACs (the pass that
/// read them has planned and written: the memory of a pass included, not only of the
/// reports), lets it settle; its RSS now and at its peak, in MiB, and how long it took to
/// be ready and to have read them all, and to have written.
async fn measure(
    env: &TestEnv,
    system: &str,
    which: &str,
    (agents, ghosts): (usize, usize),
    (holder, macs): (&str, usize),
    settle: Duration,
) -> (f64, f64, Duration, Duration, support::Started) {
    let started = start_controller(
        &controller_binary(),
        env,
        system,
        ("agent_reports", IDENTITY, which),
    )
    .await;
    let give_up = Instant::now() + Duration::from_secs(1800);
    loop {
        let seen = agents_seen(started.addr);
        // A controller before issue 42 has no such metric (`ALIASLB_CONTROLLER_BIN`, for a
        // comparison): every agent seen is all it can say.
        let ignored = metric(started.addr, "aliaslb_agent_leases_ignored");
        if seen >= agents && ignored.is_none_or(|n| n == ghosts as f64) {
            break;
        }
        assert!(
            Instant::now() < give_up,
            "{which}: the controller read {seen} agents of {agents}, {ignored:?} ignored of {ghosts}: see {}",
            started.log.display()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let read = started.started.elapsed();
    let configmaps = Api::<ConfigMap>::namespaced(env.client().await, system);
    loop {
        let listed = macs_listed(&configmaps, holder).await;
        if listed >= macs {
            break;
        }
        assert!(
            Instant::now() < give_up,
            "{which}: the index of {holder} lists {listed} MACs of {macs}: see {}",
            started.log.display()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    println!(
        "  {which}: every report read in {:.1} s, every MAC in the index of {holder} in {:.1} s",
        read.as_secs_f64(),
        started.started.elapsed().as_secs_f64()
    );
    tokio::time::sleep(settle).await;
    let pid = started.controller.id();
    let mib = |field| proc_kib(pid, field).unwrap_or(0) as f64 / 1024.0;
    println!("  {which}: {}", rss_split(pid));
    let ready = started.ready;
    (mib("VmRSS"), mib("VmHWM"), ready, read, started)
}

/// Every MAC listed in a `node-macs` of the assignment objects in `system`.
async fn indexed_macs(configmaps: &Api<ConfigMap>) -> BTreeSet<String> {
    let listed = configmaps
        .list(&ListParams::default().labels(keys::LABEL_ASSIGNMENTS))
        .await
        .unwrap()
        .items;
    let mut macs = BTreeSet::new();
    for cm in &listed {
        let Some(name) = cm.metadata.name.as_deref() else {
            continue;
        };
        if assignments::node_of(name).is_none() {
            continue;
        }
        let text = cm
            .data
            .as_ref()
            .and_then(|d| d.get(keys::NODE_MACS_KEY))
            .cloned()
            .unwrap_or_default();
        macs.extend(
            text.lines()
                .filter_map(|l| l.split_whitespace().next())
                .map(str::to_owned),
        );
    }
    macs
}

#[tokio::main]
async fn main() {
    let opts = match Options::parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!(
                "agent_reports: {e}\nusage: agent_reports [--agents N] [--ghosts N] [--report-bytes N] [--settle SECONDS]"
            );
            std::process::exit(2);
        }
    };
    let binary = controller_binary();
    if !binary.is_file() {
        eprintln!(
            "agent_reports: {} not found: run `cargo build --release -p aliaslb-controller --bin aliaslb-controller` (or set ALIASLB_CONTROLLER_BIN)",
            binary.display()
        );
        std::process::exit(2);
    }
    println!(
        "agent_reports --agents {} --ghosts {} --report-bytes {} --settle {}",
        opts.agents, opts.ghosts, opts.report_bytes, opts.settle
    );
    println!(
        "  controller binary {}, MALLOC_ARENA_MAX={}",
        binary.display(),
        malloc_arenas()
    );
    let settle = Duration::from_secs(opts.settle);
    let env = TestEnv::global();
    let client = env.client().await;
    let system = env.create_namespace(&client, "reports-system").await;
    let apps = env.create_namespace(&client, "reports").await;
    Api::<ConfigMap>::namespaced(client.clone(), &system)
        .patch(
            keys::DEFAULT_POOL_CONFIGMAP,
            &PatchParams::apply("bench"),
            &Patch::Apply(json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": keys::DEFAULT_POOL_CONFIGMAP},
                "data": {apps.as_str(): POOL},
            })),
        )
        .await
        .unwrap();
    let nodes = Api::<Node>::all(client.clone());
    let leases = Api::<Lease>::namespaced(client.clone(), &system);
    let configmaps = Api::<ConfigMap>::namespaced(client.clone(), &system);

    // 1. The floor: one small agent, one Service.
    let holder = "reports-holder".to_owned();
    create_nodes(&nodes, std::slice::from_ref(&holder)).await;
    let small = AgentReport {
        version: REPORT_VERSION,
        macs: vec![Mac([2, 0xa, 0, 0, 0, 1])],
        ..AgentReport::default()
    }
    .to_json();
    write_leases(&leases, vec![(holder.clone(), small)]).await;
    let mut web = fixtures::lb_service(&apps, "web").build();
    web.metadata.uid = None;
    Api::<Service>::namespaced(client.clone(), &apps)
        .create(&PostParams::default(), &web)
        .await
        .unwrap();
    let (floor, floor_peak, _, _, first) =
        measure(env, &system, "floor", (1, 0), (&holder, 1), settle).await;
    first.controller.kill();
    println!("floor (1 small agent, 1 Service): RSS {floor:.1} MiB, peak {floor_peak:.1} MiB");

    // 2. The agents at the bound.
    let sample = report(0, Mac([2, 0xc, 0, 0, 0, 0]), opts.report_bytes);
    let parsed = AgentReport::from_json(&sample).expect("a report within bounds");
    println!(
        "a report: {} bytes ({:.1} KiB), {} interfaces, {} held addresses",
        sample.len(),
        sample.len() as f64 / 1024.0,
        parsed.interfaces.len(),
        parsed.held.len()
    );
    drop(parsed);
    let mut written = Duration::ZERO;
    if opts.agents > 0 {
        let names: Vec<String> = (0..opts.agents)
            .map(|i| format!("reports-node-{i}"))
            .collect();
        let t0 = Instant::now();
        create_nodes(&nodes, &names).await;
        println!(
            "{} Nodes created in {:.1} s",
            names.len(),
            t0.elapsed().as_secs_f64()
        );
        // In chunks: the reports are built as they are written, not all held at once.
        for chunk in names.chunks(256).enumerate() {
            let (c, chunk) = chunk;
            let batch = chunk
                .iter()
                .enumerate()
                .map(|(k, name)| {
                    let i = c * 256 + k;
                    let mac = Mac([2, 0xc, (i >> 16) as u8, (i >> 8) as u8, i as u8, 0]);
                    (name.clone(), report(i, mac, opts.report_bytes))
                })
                .collect();
            written += write_leases(&leases, batch).await;
        }
        println!(
            "{} agent Leases at the bound written in {:.1} s",
            opts.agents,
            written.as_secs_f64()
        );
    }
    // 3. The ghosts.
    let ghost_macs: BTreeSet<String> = (0..opts.ghosts)
        .map(|i| Mac([2, 0xd, (i >> 16) as u8, (i >> 8) as u8, i as u8, 0]).to_string())
        .collect();
    if opts.ghosts > 0 {
        let batch = (0..opts.ghosts)
            .map(|i| {
                let mac = Mac([2, 0xd, (i >> 16) as u8, (i >> 8) as u8, i as u8, 0]);
                (
                    format!("reports-ghost-{i}"),
                    report(i, mac, opts.report_bytes),
                )
            })
            .collect();
        let took = write_leases(&leases, batch).await;
        println!(
            "{} ghost Leases (no Node) at the bound written in {:.1} s",
            opts.ghosts,
            took.as_secs_f64()
        );
    }
    let (rss, peak, ready, read, run) = measure(
        env,
        &system,
        "agents",
        (opts.agents + 1, opts.ghosts),
        // Each agent's 4 links and its own MAC, and the holder's.
        (&holder, 5 * opts.agents + 1),
        settle,
    )
    .await;
    println!(
        "with {} agents and {} ghosts at the bound: ready in {:.1} s, every report read in {:.1} s; RSS {rss:.1} MiB, peak {peak:.1} MiB",
        opts.agents,
        opts.ghosts,
        ready.as_secs_f64(),
        read.as_secs_f64()
    );
    let per = |n: usize, mib: f64| {
        if n == 0 {
            String::new()
        } else {
            format!(", {:.1} KiB each", (mib - floor) * 1024.0 / n as f64)
        }
    };
    println!(
        "  above the floor: RSS +{:.1} MiB{}, peak +{:.1} MiB{}",
        rss - floor,
        per(opts.agents + opts.ghosts, rss),
        peak - floor_peak,
        per(opts.agents + opts.ghosts, peak),
    );
    if opts.ghosts > 0 {
        let indexed = indexed_macs(&configmaps).await;
        let leaked: Vec<&String> = indexed.intersection(&ghost_macs).collect();
        println!(
            "  ghost MACs in the assignment objects: {} of {} ({} MACs listed)",
            leaked.len(),
            ghost_macs.len(),
            indexed.len()
        );
        if std::env::var_os("ALIASLB_CONTROLLER_BIN").is_none() {
            assert!(leaked.is_empty(), "ghost MACs indexed: {leaked:?}");
        }
    }
    run.controller.kill();
}
