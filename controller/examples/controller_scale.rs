//! Controller scale, latency and CPU against their floors, in one run, against the real
//! kube-apiserver (testenv): the figures of issue 21's performance targets, each
//! printed beside the floor it is judged against. The controller is the release
//! `aliaslb-controller` binary in a subprocess, so its peak RSS (`VmHWM`) and CPU time
//! (`/proc/PID/stat`) are its own.
//!
//! Fake agent Leases for `--nodes` nodes run in the bench process for the whole run (each
//! renewed every `--renew-every` seconds by its own task, the tasks spread over the period as
//! real agents are; each reports as held what its node's assignment objects list as held,
//! read from them as a real agent reads them, written at once when that changes, as a real
//! agent does). Phases, all against the same apiserver:
//! 0. the floors with 0 Services: the controller binary starts; idle CPU over `--steady`
//!    seconds right after `/readyz`; then `--latency` Services (`zero-0000`, ...) created one
//!    at a time, each waited for (create -> ingress IP); then the controller is killed
//!    (SIGKILL + wait) and those Services are deleted, and the bench waits until its watch
//!    no longer has them;
//! 1. create N `type: LoadBalancer` Services over `--namespaces` namespaces (each with its
//!    own /22 pool), controller not running;
//! 2. the floor: the fewest writes an IP needs, one status write per Service, made by a
//!    minimal client: a server-side apply of the status the controller's first write
//!    carries (the ingress IP with `ipMode`, `IPAllocated` and `Announced`, [`floor_status`])
//!    on every Service, [`FLOOR_IN_FLIGHT`] requests at once (the controller's
//!    `MAX_IN_FLIGHT`), then clears them again (a second, untimed-for-the-ratio pass). The
//!    node assignment writes are not in the floor (one per shard, shared by up to 512
//!    Services), nor the `aliaslb.io/node` annotation (a view for people). Then the same
//!    floor again with a second watch of every Service open (listed before the clock
//!    starts): a controller keeps one (its cache), so in phase 3 the apiserver sends each
//!    write to two watchers, in the first floor to one. Both ratios are printed;
//! 3. the controller binary starts again (same identity, so it renews the leader Lease the
//!    killed one left at once, see [`IDENTITY`]); timed until every Service has an ingress
//!    IP (ratio to the floor), then until every one is `Announced=True`;
//! 4. latency: `--latency` more Services (`lat-0000`, ...) created one at a time, each
//!    waited for, with the N converged Services still in the controller's caches (ratio to
//!    phase 0's p50 and p99). Each time is also split into the create call (the apiserver's
//!    own, which grows with the Services that exist) and created -> IP (the controller's
//!    part). Each is followed by its floor (interleaved, so both meet the same apiserver;
//!    also in phase 0): a Service of a class the controller ignores, whose status the bench
//!    writes itself once its watch has seen it, one apply, the fewest steps an IP needs;
//!    printed as the floor's own ratio (at N / at 0) and the controller's to the floor at N.
//!    Then the controller's latency to notice a node's report: from
//!    the fake agent's Lease write that first lists the new Service's IP to the watch seeing
//!    it `Announced=True`;
//! 5. steady state: the controller's CPU over `--steady` seconds with the N Services and the
//!    agents renewing (beside phase 0's idle figure), with the reconcile passes and their
//!    mean time over the window (the controller's `/metrics`).
//!
//! API requests are the apiserver's own `apiserver_request_total` deltas per phase; the
//! controller's assignment object writes (count, bytes, the largest object) come from a
//! watch of them. A summary against the targets ends the output.
//!
//! ```text
//! cargo build --release -p aliaslb-controller --bin aliaslb-controller
//! KUBEBUILDER_ASSETS=$HOME/.cache/aliaslb/kube-v1.37.2/bin \
//!   cargo run --release -p aliaslb-controller --example controller_scale -- \
//!   [--services 1000] [--namespaces 50] [--nodes 5] [--latency 200] [--steady 20]
//!   [--renew-every 1]
//! ```
//! - `--services N`: Services converged in phases 1-3 (and in the caches in 4-5);
//! - `--namespaces M` (1..=60): namespaces (one /22 pool each) they are spread over;
//! - `--nodes K`: Nodes, each with a fake agent Lease (1,000 works at `--renew-every 10`);
//! - `--renew-every R`: seconds between two renewals of an unchanged report (1; the agent's
//!   default is 10), the lease being three periods (at least 4 s);
//! - `--latency L`: Services created one by one in phases 0 and 4 (0 skips both);
//! - `--steady S`: seconds of each CPU window (phase 0's idle floor and phase 5).
//!
//! `ALIASLB_CONTROLLER_BIN` overrides the binary (default `target/release/aliaslb-controller`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod support;

use support::{
    controller_binary, get, malloc_arenas, proc_kib, request_counts, rss_split, start_controller,
};

use aliaslb_controller::observe::service::{self, OurCondition};
use aliaslb_controller::write::assignments;
use aliaslb_core::assignment::NodeAssignments;
use aliaslb_core::keys;
use aliaslb_core::report::{AgentReport, REPORT_VERSION};
use aliaslb_testenv::{TestEnv, fixtures};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use serde_json::json;
use tokio::sync::watch;

/// Field manager of the floor client's status applies.
const FLOOR_MANAGER: &str = "aliaslb-bench-floor";

/// The floor's status apply for Service `name`: what the controller's first status write
/// carries (the ingress IP with `ipMode`, `IPAllocated` and `Announced`), from a client that
/// does nothing else.
fn floor_status(name: &str, namespace: &str, ip: IpAddr) -> serde_json::Value {
    floor_status_as(
        name,
        namespace,
        ip,
        [keys::CONDITION_IP_ALLOCATED, keys::CONDITION_ANNOUNCED],
    )
}

/// [`floor_status`] with the condition types `types` (the latency floor's Services take
/// types of their own: with ours, the controller would take them for Services that were
/// once its own and clean them up).
fn floor_status_as(name: &str, namespace: &str, ip: IpAddr, types: [&str; 2]) -> serde_json::Value {
    let condition = |type_: &str, status: &str, reason: &str| {
        json!({
            "type": type_, "status": status, "reason": reason, "message": "floor",
            "lastTransitionTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::now()),
        })
    };
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": namespace},
        "status": {
            "loadBalancer": {"ingress": [{"ip": ip.to_string(), "ipMode": keys::IP_MODE_VIP}]},
            "conditions": [
                condition(types[0], "True", "Allocated"),
                condition(types[1], "False", "WaitingForAgent"),
            ],
        },
    })
}

/// Requests in flight for the floor client and for creating Services: the floor uses the
/// controller's `reconcile::MAX_IN_FLIGHT`.
const FLOOR_IN_FLIGHT: usize = aliaslb_controller::reconcile::MAX_IN_FLIGHT;
/// Creates in flight while setting up (not measured against anything).
const CREATE_IN_FLIGHT: usize = 64;
/// Label on every bench Service (the progress watch selects on it).
const LABEL: &str = "aliaslb.io/bench";
/// How often a fake agent looks whether its held set changed (written at once if so).
const REPORT_LOOK: Duration = Duration::from_millis(100);
/// The controller's `POD_NAME` (its leader-election identity), the same for both starts.
/// The controller killed after phase 0 leaves the leader Lease naming it, unexpired; a
/// replica whose identity is the Lease's holder renews it at its first look
/// (`leader::decide` returns `Renew`), whereas any other identity would wait the Lease's
/// duration (15 s by default) for it to expire. So the second start is not delayed, and
/// the bench checks it: it prints when the new process first renewed the Lease.
const IDENTITY: &str = "scale-controller";
/// Clock ticks per second of the times in `/proc/PID/stat` (Linux's `USER_HZ`). Assumed,
/// not read with `sysconf(_SC_CLK_TCK)`: the controller crate has no `libc` dependency, and
/// `getconf CLK_TCK` is 100 on this machine (as on x86-64 and arm64 Linux generally).
const CLK_TCK: f64 = 100.0;

/// Command-line options.
#[derive(Debug)]
struct Options {
    services: usize,
    namespaces: usize,
    nodes: usize,
    latency: usize,
    /// Seconds of each CPU window.
    steady: usize,
    /// Seconds between two renewals of an unchanged report.
    renew_every: usize,
}

impl Options {
    fn parse() -> Result<Options, String> {
        let mut o = Options {
            services: 1000,
            namespaces: 50,
            nodes: 5,
            latency: 200,
            steady: 20,
            renew_every: 1,
        };
        let mut args = std::env::args().skip(1);
        while let Some(flag) = args.next() {
            let slot = match flag.as_str() {
                "--services" => &mut o.services,
                "--namespaces" => &mut o.namespaces,
                "--nodes" => &mut o.nodes,
                "--latency" => &mut o.latency,
                "--steady" => &mut o.steady,
                "--renew-every" => &mut o.renew_every,
                other => return Err(format!("unknown argument `{other}`")),
            };
            let value = args
                .next()
                .ok_or_else(|| format!("{flag} needs a number"))?;
            *slot = value
                .parse()
                .map_err(|_| format!("{flag}: `{value}` is not a number"))?;
        }
        if o.namespaces == 0
            || o.namespaces > 60
            || o.nodes == 0
            || o.steady == 0
            || !(1..=60).contains(&o.renew_every)
        {
            return Err(
                "--namespaces must be 1..=60, --renew-every 1..=60, --nodes and --steady at least 1"
                    .into(),
            );
        }
        // Each namespace has a /22 (1,024 addresses); the first one also takes the latency
        // Services (phase 0's are deleted before phase 1).
        if o.services.div_ceil(o.namespaces) + o.latency > 1000 {
            return Err("too many Services per namespace for a /22 pool".into());
        }
        Ok(o)
    }

    /// The command line these options stand for, every flag spelled out.
    fn flags(&self) -> String {
        format!(
            "--services {} --namespaces {} --nodes {} --latency {} --steady {} --renew-every {}",
            self.services, self.namespaces, self.nodes, self.latency, self.steady, self.renew_every
        )
    }

    /// The fake agents' renewal period.
    fn renew(&self) -> Duration {
        Duration::from_secs(self.renew_every as u64)
    }

    /// The fake agents' `leaseDurationSeconds`: three periods, at least 4 s.
    fn lease_seconds(&self) -> i32 {
        i32::try_from((3 * self.renew_every).max(4)).unwrap_or(i32::MAX)
    }
}

/// The pool of namespace number `i`: `10.200.(4i).0/22` (outside the Service ClusterIP
/// range of current servers, 10.96.0.0/12, whose addresses are never allocated).
fn pool(i: usize) -> String {
    format!("10.200.{}.0/22", 4 * i)
}

/// A distinct address of namespace `i`'s pool for its `k`-th Service (floor writes).
fn pool_ip(i: usize, k: usize) -> IpAddr {
    let third = u8::try_from(4 * i + k / 256).expect("pools end below 10.201.0.0");
    IpAddr::V4(Ipv4Addr::new(
        10,
        200,
        third,
        u8::try_from(k % 256).unwrap_or(0),
    ))
}

/// What the watch saw of one Service.
#[derive(Debug, Default, Clone)]
struct Seen {
    ips: Vec<IpAddr>,
    announced: bool,
}

/// Progress of every bench Service, as the watch sees it.
#[derive(Debug, Default)]
struct Progress {
    services: HashMap<String, Seen>,
    with_ip: usize,
    announced: usize,
    /// First moment each Service was seen with an ingress IP.
    first_ip: HashMap<String, Instant>,
    /// First moment each Service was seen `Announced=True`.
    first_announced: HashMap<String, Instant>,
    /// When the last fake agent Lease write that newly listed each IP as held returned (an
    /// address reused by a later Service counts from its new listing).
    reported: HashMap<IpAddr, Instant>,
    /// Bumped whenever what a node's fake agent reports may have changed.
    node_version: HashMap<String, u64>,
    /// The IPs each node's assignment objects list as held, per object (index or shard),
    /// as a real agent reads them.
    assigned: HashMap<String, HashMap<String, BTreeSet<IpAddr>>>,
}

impl Progress {
    fn update(&mut self, key: String, now: Instant, seen: Option<Seen>) {
        if let Some(old) = self.services.remove(&key) {
            self.with_ip -= usize::from(!old.ips.is_empty());
            self.announced -= usize::from(old.announced);
        }
        if let Some(seen) = seen {
            if !seen.ips.is_empty() {
                self.with_ip += 1;
                self.first_ip.entry(key.clone()).or_insert(now);
            }
            if seen.announced {
                self.first_announced.entry(key.clone()).or_insert(now);
            }
            self.announced += usize::from(seen.announced);
            self.services.insert(key, seen);
        }
    }

    /// Notes what the assignment object `name` of `node` lists as held (`None`: deleted).
    fn assign(&mut self, node: &str, name: String, held: Option<BTreeSet<IpAddr>>) {
        let objects = self.assigned.entry(node.to_owned()).or_default();
        match held {
            Some(held) => objects.insert(name, held),
            None => objects.remove(&name),
        };
        *self.node_version.entry(node.to_owned()).or_default() += 1;
    }

    /// IPs assigned to `node` (what its fake agent reports as held).
    fn held_by(&self, node: &str) -> BTreeSet<IpAddr> {
        self.assigned
            .get(node)
            .into_iter()
            .flat_map(HashMap::values)
            .flatten()
            .copied()
            .collect()
    }
}

fn seen(svc: &Service) -> Seen {
    Seen {
        ips: service::ingress_ips(svc),
        announced: service::our_conditions(svc)
            .any(|(which, c)| which == OurCondition::Announced && c.status == "True"),
    }
}

fn key_of(svc: &Service) -> String {
    format!(
        "{}/{}",
        svc.metadata.namespace.as_deref().unwrap_or_default(),
        svc.metadata.name.as_deref().unwrap_or_default()
    )
}

/// Follows every bench Service into `progress`, bumping `tick` on each change.
async fn track(client: Client, progress: Arc<Mutex<Progress>>, tick: watch::Sender<u64>) {
    let config = watcher::Config::default().labels(LABEL);
    let stream = watcher::watcher(Api::<Service>::all(client), config).default_backoff();
    futures::pin_mut!(stream);
    while let Some(event) = stream.next().await {
        let now = Instant::now();
        let mut p = progress.lock().unwrap();
        match event {
            Ok(watcher::Event::Apply(svc) | watcher::Event::InitApply(svc)) => {
                p.update(key_of(&svc), now, Some(seen(&svc)));
            }
            Ok(watcher::Event::Delete(svc)) => p.update(key_of(&svc), now, None),
            Ok(watcher::Event::Init | watcher::Event::InitDone) => {}
            Err(error) => eprintln!("progress watch: {error}"),
        }
        drop(p);
        tick.send_modify(|n| *n += 1);
    }
}

/// What the controller wrote into its node assignment objects, as a watch of them sees it
/// (each event is one write; a write's size is the sum of its data values).
#[derive(Debug, Default, Clone)]
struct Written {
    writes: u64,
    bytes: u64,
    largest: usize,
    largest_name: String,
}

impl Written {
    /// What was written since `before`, with the largest object of the whole run so far.
    fn since(&self, before: &Written) -> Written {
        Written {
            writes: self.writes - before.writes,
            bytes: self.bytes - before.bytes,
            ..self.clone()
        }
    }

    /// [`Written::describe`] of what `written` holds since `before`.
    fn report(written: &Mutex<Written>, before: &Written, per: usize, what: &str) -> String {
        written.lock().unwrap().since(before).describe(per, what)
    }

    fn describe(&self, per: usize, what: &str) -> String {
        format!(
            "{} assignment object writes, {:.1} KiB ({:.2} writes and {:.1} KiB per {what}); largest object so far {:.1} KiB ({})",
            self.writes,
            self.bytes as f64 / 1024.0,
            self.writes as f64 / per.max(1) as f64,
            self.bytes as f64 / 1024.0 / per.max(1) as f64,
            self.largest as f64 / 1024.0,
            self.largest_name,
        )
    }
}

/// Follows the controller's assignment objects into `written`, and what each lists as
/// held into `progress` (for the fake agents).
async fn track_assignments(
    client: Client,
    system: String,
    written: Arc<Mutex<Written>>,
    progress: Arc<Mutex<Progress>>,
) {
    let config = watcher::Config::default().labels(keys::LABEL_ASSIGNMENTS);
    let api = Api::<ConfigMap>::namespaced(client, &system);
    let stream = watcher::watcher(api, config).default_backoff();
    futures::pin_mut!(stream);
    while let Some(event) = stream.next().await {
        let (cm, present) = match event {
            Ok(watcher::Event::Apply(cm) | watcher::Event::InitApply(cm)) => (cm, true),
            Ok(watcher::Event::Delete(cm)) => (cm, false),
            _ => continue,
        };
        let Some(node) = assignments::observed([&cm]).into_keys().next() else {
            continue;
        };
        let name = cm.metadata.name.clone().unwrap_or_default();
        // A shard's lines (an index's marker reads as nothing): the held ones, as an agent
        // adds them.
        let held = present.then(|| {
            NodeAssignments::parse(&assignments::ObjectData::of(&cm).ips)
                .map(|a| a.held_ips().collect())
                .unwrap_or_default()
        });
        progress.lock().unwrap().assign(&node, name.clone(), held);
        if !present {
            continue;
        }
        let size: usize = cm
            .data
            .iter()
            .flatten()
            .map(|(k, v)| k.len() + v.len())
            .sum();
        let mut w = written.lock().unwrap();
        w.writes += 1;
        w.bytes += size as u64;
        if size > w.largest {
            w.largest = size;
            w.largest_name = name;
        }
    }
}

/// The floor's writes: [`floor_status`] applied to every Service of `placed`. Returns when
/// the last returned and when the bench's watch saw them all, from the start.
async fn floor_pass(
    client: &Client,
    placed: &[(usize, usize, String)],
    namespaces: &[String],
    progress: &Mutex<Progress>,
    tick: &mut watch::Receiver<u64>,
) -> (Duration, Duration) {
    let started = Instant::now();
    apply_statuses(client, placed, namespaces, |i, k, name| {
        floor_status(name, &namespaces[i], pool_ip(i, k))
    })
    .await;
    let returned = started.elapsed();
    let seen = until(progress, tick, |p| p.with_ip == placed.len()).await - started;
    (returned, seen)
}

/// Removes what [`floor_pass`] set (an apply that claims nothing); returns when the bench's
/// watch saw every IP gone, from the start.
async fn clear_pass(
    client: &Client,
    placed: &[(usize, usize, String)],
    namespaces: &[String],
    progress: &Mutex<Progress>,
    tick: &mut watch::Receiver<u64>,
) -> Duration {
    let started = Instant::now();
    apply_statuses(client, placed, namespaces, |i, _, name| {
        json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": &namespaces[i]},
        })
    })
    .await;
    until(progress, tick, |p| p.with_ip == 0).await - started
}

/// Applies `body(namespace index, address index, name)` to the status of every Service of
/// `placed` as the floor's client, [`FLOOR_IN_FLIGHT`] at once.
async fn apply_statuses(
    client: &Client,
    placed: &[(usize, usize, String)],
    namespaces: &[String],
    body: impl Fn(usize, usize, &str) -> serde_json::Value,
) {
    let params = PatchParams::apply(FLOOR_MANAGER).force();
    futures::stream::iter(placed)
        .map(|(i, k, name)| {
            let api = Api::<Service>::namespaced(client.clone(), &namespaces[*i]);
            let body = body(*i, *k, name);
            let params = &params;
            async move {
                api.patch_status(name, params, &Patch::Apply(body))
                    .await
                    .unwrap();
            }
        })
        .buffer_unordered(FLOOR_IN_FLIGHT)
        .collect::<()>()
        .await;
}

/// Waits until `done` holds for the progress (re-checked on every watch event).
async fn until(
    progress: &Mutex<Progress>,
    tick: &mut watch::Receiver<u64>,
    done: impl Fn(&Progress) -> bool,
) -> Instant {
    loop {
        tick.borrow_and_update();
        if done(&progress.lock().unwrap()) {
            return Instant::now();
        }
        tick.changed().await.expect("progress watch ended");
    }
}

/// What the fake agents did, to check that every Lease really is renewed at its period.
#[derive(Debug, Default, Clone, Copy)]
struct AgentStats {
    /// Renewals that succeeded.
    renewals: u64,
    /// Renewals the apiserver refused or that failed on the way.
    failures: u64,
    /// The slowest renewal PATCH.
    slowest: Duration,
    /// The longest time between the starts of two consecutive renewals of one Lease.
    longest_gap: Duration,
}

/// How the fake agents renew.
#[derive(Debug, Clone, Copy)]
struct Renewal {
    /// Between two renewals of an unchanged report.
    every: Duration,
    /// `leaseDurationSeconds`.
    lease_seconds: i32,
}

/// Runs one fake agent per node, all at once: each renews its node's agent Lease every
/// `renewal.every`, the agents' phases spread evenly over the period (real agents start at
/// unrelated moments), reporting as held every IP its node's assignment objects list as held
/// (what a real agent reports once it added them), and writes at once when that changes.
/// Concurrent, so K Leases really are K renewals per period however long one PATCH takes;
/// `stats` shows whether they were.
async fn fake_agents(
    client: Client,
    system: String,
    nodes: Vec<String>,
    renewal: Renewal,
    p: Arc<Mutex<Progress>>,
    stats: Arc<Mutex<AgentStats>>,
) {
    let leases = Api::<Lease>::namespaced(client, &system);
    let first = tokio::time::Instant::now();
    let count = u32::try_from(nodes.len()).unwrap_or(u32::MAX);
    let agents = nodes.into_iter().enumerate().map(|(i, node)| {
        let phase = renewal.every * u32::try_from(i).unwrap_or(0) / count;
        fake_agent(
            leases.clone(),
            node,
            first + phase,
            renewal,
            p.clone(),
            stats.clone(),
        )
    });
    futures::future::join_all(agents).await;
}

/// One fake agent: from `first` on, writes `node`'s Lease every `renewal.every`, and at
/// once (within [`REPORT_LOOK`]) when its held set changed.
async fn fake_agent(
    leases: Api<Lease>,
    node: String,
    first: tokio::time::Instant,
    renewal: Renewal,
    p: Arc<Mutex<Progress>>,
    stats: Arc<Mutex<AgentStats>>,
) {
    let params = PatchParams::apply(keys::AGENT_FIELD_MANAGER).force();
    let name = keys::agent_lease_name(&node);
    tokio::time::sleep_until(first).await;
    let mut look = tokio::time::interval(REPORT_LOOK);
    // A renewal slower than the period delays the next one rather than bunching them.
    look.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last: Option<Instant> = None;
    let mut seen_version: Option<u64> = None;
    let mut written: Option<BTreeSet<IpAddr>> = None;
    loop {
        look.tick().await;
        let version = p.lock().unwrap().node_version.get(&node).copied();
        let due = last.is_none_or(|at| at.elapsed() >= renewal.every);
        if !due && version == seen_version {
            continue;
        }
        seen_version = version;
        let held = p.lock().unwrap().held_by(&node);
        if !due && written.as_ref() == Some(&held) {
            continue;
        }
        let started = Instant::now();
        let new: Vec<IpAddr> = held
            .iter()
            .filter(|ip| !written.as_ref().is_some_and(|w| w.contains(ip)))
            .copied()
            .collect();
        let report_held = held.clone();
        let report = AgentReport {
            version: REPORT_VERSION,
            held,
            ..AgentReport::default()
        };
        let lease = json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": name, "annotations": {keys::ANNOTATION_AGENT_REPORT: report.to_json()}},
            "spec": {
                "holderIdentity": node,
                "leaseDurationSeconds": renewal.lease_seconds,
                "renewTime": MicroTime(Timestamp::now()),
            },
        });
        let result = leases.patch(&name, &params, &Patch::Apply(lease)).await;
        let took = started.elapsed();
        let mut s = stats.lock().unwrap();
        match result {
            Ok(_) => {
                s.renewals += 1;
                let done = Instant::now();
                let mut progress = p.lock().unwrap();
                for ip in new {
                    progress.reported.insert(ip, done);
                }
                written = Some(report_held);
            }
            Err(e) => {
                s.failures += 1;
                eprintln!("fake agent {node}: renewing failed: {e}");
            }
        }
        s.slowest = s.slowest.max(took);
        if let Some(last) = last {
            s.longest_gap = s.longest_gap.max(started - last);
        }
        last = Some(started);
    }
}

/// Prints the request deltas of a phase on Services and Events; returns their sum.
fn print_requests(
    before: &BTreeMap<(String, String, String), f64>,
    after: &BTreeMap<(String, String, String), f64>,
    per: usize,
) -> f64 {
    let mut total = 0.0;
    for (key, value) in after {
        let delta = value - before.get(key).copied().unwrap_or(0.0);
        let (verb, resource, sub) = key;
        if delta < 1.0 || !(resource == "services" || resource == "events") {
            continue;
        }
        // The bench's own progress watch.
        if verb == "WATCH" {
            continue;
        }
        total += delta;
        println!(
            "    {verb:<6} {resource}{}{sub}: {delta} ({:.2}/Service)",
            if sub.is_empty() { "" } else { "/" },
            delta / per as f64
        );
    }
    total
}

/// Waits until the leader Lease names [`IDENTITY`] in a version other than `not_version`
/// (the one a killed controller left), polling every 20 ms; the moment it does. Panics
/// after a minute (three default leader lease durations): the controller is not electing.
async fn leading(leases: &Api<Lease>, not_version: Option<&str>) -> Instant {
    let give_up = Instant::now() + Duration::from_secs(60);
    loop {
        assert!(
            Instant::now() < give_up,
            "the controller did not take the leader Lease {} within 60 s: see its log",
            keys::CONTROLLER_LEASE
        );
        if let Ok(Some(lease)) = leases.get_opt(keys::CONTROLLER_LEASE).await {
            let holder = lease
                .spec
                .as_ref()
                .and_then(|s| s.holder_identity.as_deref());
            if holder == Some(IDENTITY) && lease.metadata.resource_version.as_deref() != not_version
            {
                return Instant::now();
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The leader Lease's `resourceVersion`, if it exists.
async fn leader_version(leases: &Api<Lease>) -> Option<String> {
    leases
        .get_opt(keys::CONTROLLER_LEASE)
        .await
        .ok()
        .flatten()
        .and_then(|l| l.metadata.resource_version)
}

/// User plus system CPU time of process `pid` so far, in clock ticks (`/proc/PID/stat`
/// fields 14 and 15).
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Field 2 (the command) is in parentheses and may hold spaces: count from the last `)`,
    // after which comes field 3.
    let mut fields = stat.rsplit_once(')')?.1.split_whitespace();
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

/// The controller's `aliaslb_reconcile_duration_seconds` (count, sum) from its `/metrics`.
fn reconcile_totals(addr: SocketAddr) -> Option<(f64, f64)> {
    let (_, body) = get(addr, "/metrics")?;
    let value = |name: &str| -> f64 {
        body.lines()
            .filter(|l| l.split([' ', '{']).next() == Some(name))
            .filter_map(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
            .sum()
    };
    Some((
        value("aliaslb_reconcile_duration_seconds_count"),
        value("aliaslb_reconcile_duration_seconds_sum"),
    ))
}

/// What the controller did over a window of wall-clock time.
#[derive(Debug, Clone, Copy)]
struct Window {
    /// Length of the window.
    wall: Duration,
    /// Controller CPU (user + system) as a percentage of one core.
    cpu_percent: f64,
    /// Reconcile passes that ended in the window, and their summed time.
    passes: f64,
    pass_seconds: f64,
    /// Fake agent renewals in the window.
    renewals: u64,
}

impl Window {
    /// `cpu %`, passes/s and the mean pass, for printing.
    fn describe(&self) -> String {
        let secs = self.wall.as_secs_f64();
        let mean = if self.passes > 0.0 {
            format!("{:.2} ms", self.pass_seconds / self.passes * 1000.0)
        } else {
            "-".to_owned()
        };
        format!(
            "reconcile passes {} ({:.1}/s), mean pass {mean}, {:.1} % of the window in passes; fake agent renewals {} ({:.1}/s)",
            self.passes,
            self.passes / secs,
            self.pass_seconds / secs * 100.0,
            self.renewals,
            self.renewals as f64 / secs,
        )
    }
}

/// Measures the controller `pid` (metrics at `addr`) over `length`.
async fn window(
    pid: u32,
    addr: SocketAddr,
    length: Duration,
    agents: &Mutex<AgentStats>,
) -> Window {
    let renewals = || agents.lock().unwrap().renewals;
    let (count0, sum0) = reconcile_totals(addr).unwrap_or_default();
    let renewals0 = renewals();
    let ticks0 = cpu_ticks(pid).expect("reading the controller's /proc/PID/stat");
    let t0 = Instant::now();
    tokio::time::sleep(length).await;
    let ticks1 = cpu_ticks(pid).expect("reading the controller's /proc/PID/stat");
    let wall = t0.elapsed();
    let renewals1 = renewals();
    let (count1, sum1) = reconcile_totals(addr).unwrap_or_default();
    Window {
        wall,
        cpu_percent: (ticks1 - ticks0) as f64 / CLK_TCK / wall.as_secs_f64() * 100.0,
        passes: count1 - count0,
        pass_seconds: sum1 - sum0,
        renewals: renewals1 - renewals0,
    }
}

/// Creates `count` Services `{prefix}-0000`, ... in `api`'s namespace `ns` one at a time,
/// each waited for until the watch sees its ingress IP: the create -> IP times, sorted,
/// and the Services' keys. Each is followed by its floor, `{prefix}-floor-0000`, ...: a
/// Service of a class the controller ignores ([`FLOOR_CLASS`]) whose status the bench
/// writes itself, the fewest steps an IP needs (its watch sees the Service, one status
/// apply, the watch sees the IP), interleaved so that both meet the same apiserver.
/// Returns the controller's times, then the floor's.
async fn latency(
    api: &Api<Service>,
    ns: &str,
    prefix: &str,
    count: usize,
    progress: &Mutex<Progress>,
    tick: &mut watch::Receiver<u64>,
) -> (Latencies, Latencies) {
    let mut ours = Latencies::default();
    let mut floor = Latencies::default();
    for l in 0..count {
        let name = format!("{prefix}-{l:04}");
        let key = format!("{ns}/{name}");
        let (t, created) = create_timed(api, &service(&name), &key).await;
        until(progress, tick, |p| p.first_ip.contains_key(&key)).await;
        let first_ip = progress.lock().unwrap().first_ip[&key];
        ours.push(t, created, first_ip);
        until(progress, tick, |p| p.first_announced.contains_key(&key)).await;
        {
            let p = progress.lock().unwrap();
            let reported = p.services[&key]
                .ips
                .iter()
                .filter_map(|ip| p.reported.get(ip))
                .max()
                .copied();
            if let Some(reported) = reported {
                ours.noticed
                    .push(p.first_announced[&key].saturating_duration_since(reported));
            }
        }
        ours.keys.push(key);

        let name = format!("{prefix}-floor-{l:04}");
        let key = format!("{ns}/{name}");
        let (t, created) = create_timed(api, &floor_service(&name), &key).await;
        until(progress, tick, |p| p.services.contains_key(&key)).await;
        let ip = IpAddr::from([192, 0, 2, u8::try_from(l % 250 + 1).unwrap_or(1)]);
        api.patch_status(
            &name,
            &PatchParams::apply(FLOOR_MANAGER).force(),
            &Patch::Apply(floor_status_as(&name, ns, ip, FLOOR_CONDITIONS)),
        )
        .await
        .unwrap_or_else(|e| panic!("floor status of Service {key}: {e}"));
        until(progress, tick, |p| p.first_ip.contains_key(&key)).await;
        let first_ip = progress.lock().unwrap().first_ip[&key];
        floor.push(t, created, first_ip);
        floor.keys.push(key);
    }
    ours.sort();
    floor.sort();
    (ours, floor)
}

/// Creates `svc` (`key`) through `api`: when the call began, and when it returned.
async fn create_timed(api: &Api<Service>, svc: &Service, key: &str) -> (Instant, Instant) {
    let t = Instant::now();
    api.create(&PostParams::default(), svc)
        .await
        .unwrap_or_else(|e| panic!("creating Service {key}: {e}"));
    (t, Instant::now())
}

/// What [`latency`] measured.
#[derive(Debug, Default)]
struct Latencies {
    /// Create -> ingress IP, sorted.
    to_ip: Vec<Duration>,
    /// The create call alone, sorted: the apiserver's own cost, before any controller can
    /// see the Service (it grows with the Services that exist: Kubernetes 1.33+ counts every
    /// `IPAddress` object on each ClusterIP allocation).
    in_create: Vec<Duration>,
    /// The create call returned -> ingress IP, sorted: what the controller adds (for the
    /// floor: what its watch and one status apply take).
    created_to_ip: Vec<Duration>,
    /// The fake agent's Lease write listing the IP returned -> the watch saw
    /// `Announced=True`, sorted: the controller noticing a node's report.
    noticed: Vec<Duration>,
    /// The Services created.
    keys: Vec<String>,
}

impl Latencies {
    /// One Service: its create call began at `t` and returned at `created`; the watch saw
    /// its IP at `first_ip`.
    fn push(&mut self, t: Instant, created: Instant, first_ip: Instant) {
        self.to_ip.push(first_ip - t);
        self.in_create.push(created - t);
        self.created_to_ip
            .push(first_ip.saturating_duration_since(created));
    }

    fn sort(&mut self) {
        self.to_ip.sort();
        self.in_create.sort();
        self.created_to_ip.sort();
        self.noticed.sort();
    }

    /// Prints the figures, one per line, each line starting with `indent`.
    fn print(&self, indent: &str) {
        println!("{indent}create -> ingress IP {}", percentiles(&self.to_ip));
        println!(
            "{indent}  the create call alone (the apiserver) {}",
            percentiles(&self.in_create)
        );
        let floor = self.keys.first().is_some_and(|k| k.contains("-floor-"));
        println!(
            "{indent}  created -> ingress IP ({}) {}",
            if floor {
                "the bench's watch and status apply"
            } else {
                "the controller"
            },
            percentiles(&self.created_to_ip)
        );
        if floor {
            return;
        }
        println!(
            "{indent}a node's report noticed (its Lease write listing the IP -> Announced=True), {} of them: {}",
            self.noticed.len(),
            if self.noticed.is_empty() {
                "-".to_owned()
            } else {
                percentiles(&self.noticed)
            }
        );
    }

    /// p50 and p99 of create -> IP, then of created -> IP, over `floor`'s.
    fn ratios(&self, floor: &Latencies) -> (f64, f64, f64, f64) {
        let ratio = |ours: &[Duration], theirs: &[Duration], q| {
            quantile(ours, q).as_secs_f64() / quantile(theirs, q).as_secs_f64()
        };
        (
            ratio(&self.to_ip, &floor.to_ip, 0.5),
            ratio(&self.to_ip, &floor.to_ip, 0.99),
            ratio(&self.created_to_ip, &floor.created_to_ip, 0.5),
            ratio(&self.created_to_ip, &floor.created_to_ip, 0.99),
        )
    }
}

/// `p50 .. p99 .. max` of sorted latencies.
fn percentiles(sorted: &[Duration]) -> String {
    format!(
        "p50 {} p99 {} max {}",
        ms(quantile(sorted, 0.5)),
        ms(quantile(sorted, 0.99)),
        ms(quantile(sorted, 1.0)),
    )
}

fn service(name: &str) -> Service {
    fixtures::lb_service("", name)
        .meta(|m| {
            m.uid = None;
            m.labels = Some([(LABEL.to_owned(), "scale".to_owned())].into());
        })
        .build()
}

/// The `spec.loadBalancerClass` of the floor's latency Services: not the controller's, so
/// the bench writes their status itself.
const FLOOR_CLASS: &str = "bench.example/floor";

/// The condition types of the latency floor's status: as long as ours, not ours.
const FLOOR_CONDITIONS: [&str; 2] = ["bench.example/IPAllocated", "bench.example/Announced"];

/// A floor Service of [`latency`]: as [`service`], of [`FLOOR_CLASS`].
fn floor_service(name: &str) -> Service {
    let mut svc = service(name);
    if let Some(spec) = svc.spec.as_mut() {
        spec.load_balancer_class = Some(FLOOR_CLASS.to_owned());
    }
    svc
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

/// The `q`-th quantile (0..=1) of sorted durations, nearest rank.
fn quantile(sorted: &[Duration], q: f64) -> Duration {
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let opts = match Options::parse() {
        Ok(o) => o,
        Err(e) => {
            eprintln!(
                "controller_scale: {e}\nusage: controller_scale [--services N] [--namespaces 1..=60] [--nodes N] [--latency N] [--steady SECONDS]"
            );
            std::process::exit(2);
        }
    };
    let binary = controller_binary();
    if !binary.is_file() {
        eprintln!(
            "controller_scale: {} not found: run `cargo build --release -p aliaslb-controller --bin aliaslb-controller` (or set ALIASLB_CONTROLLER_BIN)",
            binary.display()
        );
        std::process::exit(2);
    }
    println!("controller_scale {}", opts.flags());
    println!(
        "  controller binary {}, MALLOC_ARENA_MAX={}",
        binary.display(),
        malloc_arenas()
    );
    let n = opts.services;
    let steady = Duration::from_secs(opts.steady as u64);
    // Every LoadBalancer Service gets a node port, as a user's does (1.20 always allocates
    // them); the default range has 2,768, and 50,000 Services need 50,000.
    let env = TestEnv::start_with(&["--service-node-port-range=1024-65535"])
        .unwrap_or_else(|e| panic!("starting the test apiserver: {e}"));
    let env = &env;
    let client = env.client().await;
    let system = env.create_namespace(&client, "scale-system").await;
    let mut namespaces = Vec::new();
    for _ in 0..opts.namespaces {
        namespaces.push(env.create_namespace(&client, "scale").await);
    }
    let data: BTreeMap<&str, String> = namespaces
        .iter()
        .enumerate()
        .map(|(i, ns)| (ns.as_str(), pool(i)))
        .collect();
    let cm = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": keys::DEFAULT_POOL_CONFIGMAP},
        "data": data,
    });
    Api::<ConfigMap>::namespaced(client.clone(), &system)
        .patch(
            keys::DEFAULT_POOL_CONFIGMAP,
            &PatchParams::apply("bench"),
            &Patch::Apply(cm),
        )
        .await
        .unwrap();
    let nodes: Vec<String> = (1..=opts.nodes)
        .map(|i| format!("scale-node-{i}"))
        .collect();
    for name in &nodes {
        let node: Node = serde_json::from_value(
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}),
        )
        .unwrap();
        Api::<Node>::all(client.clone())
            .create(&PostParams::default(), &node)
            .await
            .unwrap();
    }

    let progress = Arc::new(Mutex::new(Progress::default()));
    let (tick_tx, mut tick) = watch::channel(0u64);
    let tracker = tokio::spawn(track(client.clone(), progress.clone(), tick_tx));
    let written = Arc::new(Mutex::new(Written::default()));
    let object_tracker = tokio::spawn(track_assignments(
        client.clone(),
        system.clone(),
        written.clone(),
        progress.clone(),
    ));
    let agent_stats = Arc::new(Mutex::new(AgentStats::default()));
    let agents_started = Instant::now();
    let agents = tokio::spawn(fake_agents(
        client.clone(),
        system.clone(),
        nodes.clone(),
        Renewal {
            every: opts.renew(),
            lease_seconds: opts.lease_seconds(),
        },
        progress.clone(),
        agent_stats.clone(),
    ));
    // Every agent Lease exists before any controller starts.
    while agent_stats.lock().unwrap().renewals < opts.nodes as u64 {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let leases = Api::<Lease>::namespaced(client.clone(), &system);
    let first_ns = Api::<Service>::namespaced(client.clone(), &namespaces[0]);

    // Phase 0: the floors with 0 Services: idle CPU, then latency.
    let zero = start_controller(&binary, env, &system, ("controller_scale", IDENTITY, "0")).await;
    let zero_pid = zero.controller.id();
    let zero_leading = leading(&leases, None).await - zero.started;
    println!(
        "phase 0, controller with 0 Services: ready (caches synced) after {}, leading after {}",
        ms(zero.ready),
        ms(zero_leading)
    );
    let idle = window(zero_pid, zero.addr, steady, &agent_stats).await;
    println!(
        "  idle floor over {} s with {} fake agents renewing every {} s: controller CPU {:.1} % of one core",
        opts.steady, opts.nodes, opts.renew_every, idle.cpu_percent
    );
    println!("    {}", idle.describe());
    let zero_latency = if opts.latency > 0 {
        let (zero, zero_floor) = latency(
            &first_ns,
            &namespaces[0],
            "zero",
            opts.latency,
            &progress,
            &mut tick,
        )
        .await;
        println!(
            "  latency with 0 other Services over {} created one by one:",
            opts.latency
        );
        zero.print("    ");
        println!(
            "    the floor, interleaved (the bench's watch sees the Service, one status apply):"
        );
        zero_floor.print("      ");
        Some((zero, zero_floor))
    } else {
        None
    };
    let zero_hwm = proc_kib(zero_pid, "VmHWM").unwrap_or(0);
    println!(
        "  peak RSS (VmHWM) with 0 Services: {:.1} MiB; now {}",
        zero_hwm as f64 / 1024.0,
        rss_split(zero_pid)
    );
    println!("  controller log: {}", zero.log.display());
    zero.controller.kill();
    // The killed controller's leader Lease stays; the next start (same identity) renews it.
    let dead_version = leader_version(&leases).await;
    // Their Services go, so that they disturb neither the floor nor the convergence.
    if let Some((zero, zero_floor)) = &zero_latency {
        let keys: Vec<&String> = zero.keys.iter().chain(&zero_floor.keys).collect();
        for key in &keys {
            let name = key.rsplit_once('/').map_or(key.as_str(), |(_, name)| name);
            first_ns
                .delete(name, &DeleteParams::default())
                .await
                .unwrap_or_else(|e| panic!("deleting Service {key}: {e}"));
        }
        until(&progress, &mut tick, |p| {
            keys.iter().all(|k| !p.services.contains_key(*k))
        })
        .await;
    }

    // Phase 1: the Services, controller not running.
    // Service j lives in namespace j % namespaces; `k` is its index there.
    let placed: Vec<(usize, usize, String)> = (0..n)
        .map(|j| {
            (
                j % opts.namespaces,
                j / opts.namespaces,
                format!("svc-{j:05}"),
            )
        })
        .collect();
    let started = Instant::now();
    // The apiserver's create slows down as Services accumulate (see `Latencies::in_create`):
    // the progress lines show the rate per step.
    let step = (n / 10).max(1000);
    let mut creates = futures::stream::iter(&placed)
        .map(|(i, _, name)| {
            let api = Api::<Service>::namespaced(client.clone(), &namespaces[*i]);
            async move {
                api.create(&PostParams::default(), &service(name))
                    .await
                    .unwrap();
            }
        })
        .buffer_unordered(CREATE_IN_FLIGHT);
    let (mut done, mut step_started) = (0, Instant::now());
    while creates.next().await.is_some() {
        done += 1;
        if done % step == 0 && done < n {
            println!(
                "  created {done} of {n} after {} ({:.0}/s over the last {step})",
                ms(started.elapsed()),
                step as f64 / step_started.elapsed().as_secs_f64()
            );
            step_started = Instant::now();
        }
    }
    drop(creates);
    let created = started.elapsed();
    until(&progress, &mut tick, |p| p.services.len() == n).await;

    // Phase 2: the floor, then again with a second watch of every Service open.
    let before = request_counts(&client).await;
    let (floor_returned, floor_seen) =
        floor_pass(&client, &placed, &namespaces, &progress, &mut tick).await;
    let after = request_counts(&client).await;
    println!(
        "services: {n} over {} namespaces, {} nodes",
        opts.namespaces, opts.nodes
    );
    println!("created in {} ({CREATE_IN_FLIGHT} in flight)", ms(created));
    println!(
        "floor: {n} status applies (the ingress IP with ipMode and both conditions, the one write per Service an IP needs), {FLOOR_IN_FLIGHT} in flight: last returned {}, all seen by a watch {} ({:.0}/s)",
        ms(floor_returned),
        ms(floor_seen),
        n as f64 / floor_seen.as_secs_f64()
    );
    print_requests(&before, &after, n);
    let cleared = clear_pass(&client, &placed, &namespaces, &progress, &mut tick).await;
    println!(
        "floor again (clearing them): all seen by a watch {}",
        ms(cleared)
    );
    // A controller learns of the Services through a watch of its own (its cache): in phase
    // 3 the apiserver sends each write to two watchers (the controller's and this bench's),
    // in the floor above to one. The same floor with a second watch of every Service open
    // and drained, listed before the clock starts, carries that cost too.
    let second_watch = {
        let (listed_tx, listed) = tokio::sync::oneshot::channel();
        let api = Api::<Service>::all(client.clone());
        let task = tokio::spawn(async move {
            let mut listed_tx = Some(listed_tx);
            let mut stream =
                std::pin::pin!(watcher::watcher(api, watcher::Config::default()).default_backoff());
            while let Some(event) = stream.next().await {
                if let Ok(watcher::Event::InitDone) = event
                    && let Some(tx) = listed_tx.take()
                {
                    let _ = tx.send(());
                }
            }
        });
        listed.await.expect("the second watch lists the Services");
        task
    };
    let (_, floor_watched) = floor_pass(&client, &placed, &namespaces, &progress, &mut tick).await;
    clear_pass(&client, &placed, &namespaces, &progress, &mut tick).await;
    second_watch.abort();
    println!(
        "floor with a second watch of the Services open (as the controller keeps one): all seen by a watch {} ({:.0}/s), {:.2}x the floor",
        ms(floor_watched),
        n as f64 / floor_watched.as_secs_f64(),
        floor_watched.as_secs_f64() / floor_seen.as_secs_f64()
    );

    // Phase 3: the controller binary again.
    let before = request_counts(&client).await;
    let written_before = written.lock().unwrap().clone();
    let lead_watch = {
        let leases = leases.clone();
        let dead_version = dead_version.clone();
        tokio::spawn(async move { leading(&leases, dead_version.as_deref()).await })
    };
    let run = start_controller(&binary, env, &system, ("controller_scale", IDENTITY, "n")).await;
    let (started, ready, addr) = (run.started, run.ready, run.addr);
    let pid = run.controller.id();
    let all_ip = until(&progress, &mut tick, |p| p.with_ip == n).await - started;
    // Its CPU from start to the last IP (this machine's 2 cores also run the apiserver).
    let convergence_cpu = cpu_ticks(pid).unwrap_or(0) as f64 / CLK_TCK;
    let all_announced = until(&progress, &mut tick, |p| p.announced == n).await - started;
    let lead = lead_watch
        .await
        .ok()
        .map(|at| at.saturating_duration_since(started));
    // Let trailing Events land before counting.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = request_counts(&client).await;
    let hwm = proc_kib(pid, "VmHWM").unwrap_or(0);
    println!(
        "controller: ready (caches synced) after {}, leading after {} (renewed the killed one's leader Lease); every Service has an ingress IP {} after start, {} after ready ({:.0}/s); all Announced=True {} after start",
        ms(ready),
        lead.map_or_else(|| "?".to_owned(), ms),
        ms(all_ip),
        ms(all_ip - ready),
        n as f64 / (all_ip - ready).as_secs_f64(),
        ms(all_announced),
    );
    let convergence_ratio = (all_ip - ready).as_secs_f64() / floor_seen.as_secs_f64();
    let watched_ratio = (all_ip - ready).as_secs_f64() / floor_watched.as_secs_f64();
    println!(
        "ratio controller / floor (watch-seen): {convergence_ratio:.2} from ready (target <= 1.2), {:.2} from process start; {watched_ratio:.2} from ready against the floor with a second watch",
        all_ip.as_secs_f64() / floor_seen.as_secs_f64()
    );
    println!(
        "  controller CPU from start to the last IP: {convergence_cpu:.1} s ({:.0} % of one core)",
        100.0 * convergence_cpu / all_ip.as_secs_f64()
    );
    println!("  controller requests on services + events (apiserver_request_total delta):");
    let total = print_requests(&before, &after, n);
    println!(
        "  total {total} ({:.2}/Service, start-up LIST included)",
        total / n as f64
    );
    println!(
        "  peak RSS (VmHWM) after convergence: {:.1} MiB",
        hwm as f64 / 1024.0
    );
    println!(
        "  {}",
        Written::report(&written, &written_before, n, "Service")
    );
    // The Events the burst queued go out once the writer is idle: wait for them, so that
    // phase 4 measures a converged controller (how long they took is printed).
    let posted = |counts: &BTreeMap<(String, String, String), f64>| -> f64 {
        counts
            .iter()
            .filter(|((verb, resource, _), _)| verb == "POST" && resource == "events")
            .map(|(_, count)| count)
            .sum()
    };
    let at_convergence = posted(&after);
    let mut last = at_convergence;
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = posted(&request_counts(&client).await);
        if now == last {
            break;
        }
        last = now;
    }
    println!(
        "  Events drained {} after start: {} more posted after the count above ({:.2}/Service in all)",
        ms(started.elapsed()),
        last - at_convergence,
        (last - posted(&before)) / n as f64
    );

    // Phase 4: latency, one Service at a time.
    let mut latency_ratio = None;
    let mut latency_max = None;
    let written_before = written.lock().unwrap().clone();
    let mut floor_ratio = None;
    if let Some((zero_latency, zero_floor)) = &zero_latency {
        let (at_n, floor_at_n) = latency(
            &first_ns,
            &namespaces[0],
            "lat",
            opts.latency,
            &progress,
            &mut tick,
        )
        .await;
        println!(
            "latency over {} Services created one by one ({n} others converged, {} fake agents renewing every {} s):",
            opts.latency, opts.nodes, opts.renew_every,
        );
        at_n.print("  ");
        println!(
            "  the floor, interleaved (the bench's watch sees the Service, one status apply):"
        );
        floor_at_n.print("    ");
        println!("latency with 0 other Services:");
        zero_latency.print("  ");
        println!("  the floor, interleaved:");
        zero_floor.print("    ");
        let ratios = at_n.ratios(zero_latency);
        println!(
            "latency ratio at {n} / at 0: create -> IP p50 {:.2}, p99 {:.2}; created -> IP p50 {:.2}, p99 {:.2} (target <= 1.2)",
            ratios.0, ratios.1, ratios.2, ratios.3
        );
        let floors = floor_at_n.ratios(zero_floor);
        println!(
            "  the floor's own ratio at {n} / at 0: create -> IP p50 {:.2}, p99 {:.2}; created -> IP p50 {:.2}, p99 {:.2}",
            floors.0, floors.1, floors.2, floors.3
        );
        let against = at_n.ratios(&floor_at_n);
        println!(
            "  the controller / its floor at {n}: create -> IP p50 {:.2}, p99 {:.2}; created -> IP p50 {:.2}, p99 {:.2}",
            against.0, against.1, against.2, against.3
        );
        floor_ratio = Some((floors, against));
        latency_ratio = Some(ratios);
        latency_max = Some((
            quantile(&at_n.to_ip, 1.0),
            quantile(&at_n.created_to_ip, 1.0),
        ));
        // Let the agents' reports (the `probe` flag dropped) land before counting.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let new = Written::report(&written, &written_before, opts.latency, "new Service");
        println!("  {new}");
    }

    // Phase 5: steady state.
    let busy = window(pid, addr, steady, &agent_stats).await;
    println!(
        "steady state over {} s with {} fake agents renewing every {} s: controller CPU {:.1} % of one core (target < 5 %)",
        opts.steady, opts.nodes, opts.renew_every, busy.cpu_percent
    );
    println!("    {}", busy.describe());
    println!(
        "  idle floor (0 Services, same agents, phase 0): controller CPU {:.1} % of one core",
        idle.cpu_percent
    );

    let hwm = proc_kib(pid, "VmHWM").unwrap_or(0);
    println!(
        "controller peak RSS (VmHWM) {:.1} MiB, now {} (0 Services: {:.1} MiB)",
        hwm as f64 / 1024.0,
        rss_split(pid),
        zero_hwm as f64 / 1024.0,
    );
    if let Some((_, body)) = get(addr, "/metrics") {
        for line in body.lines().filter(|l| {
            l.starts_with("aliaslb_reconcile_duration_seconds_count")
                || l.starts_with("aliaslb_reconcile_duration_seconds_sum")
                || l.starts_with("aliaslb_reconcile_errors")
        }) {
            println!("  {line}");
        }
    }
    let a = *agent_stats.lock().unwrap();
    let agents_for = agents_started.elapsed().as_secs_f64();
    println!(
        "fake agents: {} Leases, {} renewals in {agents_for:.0} s ({:.1}/s), {} failed; slowest renewal {}, longest gap between two renewals of one Lease {}",
        opts.nodes,
        a.renewals,
        a.renewals as f64 / agents_for,
        a.failures,
        ms(a.slowest),
        ms(a.longest_gap),
    );
    println!("controller log: {}", run.log.display());

    let announced_ratio = (all_announced - ready).as_secs_f64() / (all_ip - ready).as_secs_f64();
    let largest = written.lock().unwrap().largest;
    println!("summary against issue 21's targets ({}):", opts.flags());
    println!(
        "  first convergence: controller / floor {convergence_ratio:.2} (target <= 1.2); / the floor with a second watch of the Services {watched_ratio:.2}"
    );
    println!(
        "  first convergence to Announced=True / to the IPs: {announced_ratio:.2} (target <= 1.5)"
    );
    match (latency_ratio, latency_max) {
        (Some((p50, p99, c50, c99)), Some((max, created_max))) => {
            println!(
                "  create -> IP at {n} / at 0 Services: p50 {p50:.2}, p99 {p99:.2} (target <= 1.2); max {} (target <= 1 s)",
                ms(max)
            );
            println!(
                "    without the create call (created -> IP): p50 {c50:.2}, p99 {c99:.2}; max {}",
                ms(created_max)
            );
        }
        _ => println!("  create -> IP: not measured (--latency 0)"),
    }
    if let Some((floors, against)) = floor_ratio {
        println!(
            "    the floor's own (bench watch + one status apply) at {n} / at 0: create -> IP p50 {:.2}, p99 {:.2}; created -> IP p50 {:.2}, p99 {:.2}",
            floors.0, floors.1, floors.2, floors.3
        );
        println!(
            "    the controller / the floor, both at {n}: create -> IP p50 {:.2}, p99 {:.2}; created -> IP p50 {:.2}, p99 {:.2}",
            against.0, against.1, against.2, against.3
        );
    }
    println!(
        "  steady CPU with {} agents at {n} Services: {:.1} % of one core, idle floor {:.1} % (target < 2 %)",
        opts.nodes, busy.cpu_percent, idle.cpu_percent
    );
    println!(
        "  peak RSS {:.1} MiB (target <= 40 MiB at 10,000 Services, <= 150 MiB at 50,000)",
        hwm as f64 / 1024.0
    );
    println!(
        "  largest assignment object written {:.1} KiB (target <= 256 KiB at 50,000 Services on 5 nodes)",
        largest as f64 / 1024.0
    );
    drop(run);
    agents.abort();
    tracker.abort();
    object_tracker.abort();
}
