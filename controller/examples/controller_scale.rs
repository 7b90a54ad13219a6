//! Controller scale and latency against the API floor, in one run, against the real
//! kube-apiserver (testenv, v1.20.2). The controller is the release `aliaslb-controller`
//! binary in a subprocess, so its peak RSS (`VmHWM`) is its own.
//!
//! Phases, all against the same apiserver and the same N Services:
//! 1. create N `type: LoadBalancer` Services over `--namespaces` namespaces (each with its
//!    own /22 pool), controller not running;
//! 2. the floor: a minimal client merge-patches `status.loadBalancer.ingress` of every
//!    Service, [`FLOOR_IN_FLIGHT`] requests at once (the controller's `MAX_IN_FLIGHT`),
//!    then clears them again (a second, untimed-for-the-ratio pass);
//! 3. the controller binary starts (fake agent Leases for `--nodes` nodes, renewed every
//!    second, report as held what is assigned to them); timed until every Service has an
//!    ingress IP, then until every one is `Announced=True`;
//! 4. latency: `--latency` more Services created one at a time, each waited for, with the
//!    N converged Services still in the controller's caches.
//!
//! API requests are the apiserver's own `apiserver_request_total` deltas per phase.
//!
//! ```text
//! cargo build --release -p aliaslb-controller --bin aliaslb-controller
//! KUBEBUILDER_ASSETS=$HOME/.cache/aliaslb/kube-v1.20.2/bin \
//!   cargo run --release -p aliaslb-controller --example controller_scale -- \
//!   [--services 1000] [--namespaces 50] [--nodes 5] [--latency 200]
//! ```
//! `ALIASLB_CONTROLLER_BIN` overrides the binary (default `target/release/aliaslb-controller`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aliaslb_controller::observe::service::{self, OurCondition};
use aliaslb_core::keys;
use aliaslb_core::report::{AgentReport, REPORT_VERSION};
use aliaslb_testenv::{TestEnv, fixtures};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use serde_json::json;
use tokio::sync::watch;

/// Requests in flight for the floor client and for creating Services: the floor uses the
/// controller's `reconcile::MAX_IN_FLIGHT`.
const FLOOR_IN_FLIGHT: usize = aliaslb_controller::reconcile::MAX_IN_FLIGHT;
/// Creates in flight while setting up (not measured against anything).
const CREATE_IN_FLIGHT: usize = 32;
/// Label on every bench Service (the progress watch selects on it).
const LABEL: &str = "aliaslb.io/bench";
/// Fake agent renewal period (the agent's default) and lease duration.
const RENEW_EVERY: Duration = Duration::from_secs(1);
const LEASE_SECONDS: i32 = 4;

/// Command-line options.
#[derive(Debug)]
struct Options {
    services: usize,
    namespaces: usize,
    nodes: usize,
    latency: usize,
}

impl Options {
    fn parse() -> Result<Options, String> {
        let mut o = Options {
            services: 1000,
            namespaces: 50,
            nodes: 5,
            latency: 200,
        };
        let mut args = std::env::args().skip(1);
        while let Some(flag) = args.next() {
            let slot = match flag.as_str() {
                "--services" => &mut o.services,
                "--namespaces" => &mut o.namespaces,
                "--nodes" => &mut o.nodes,
                "--latency" => &mut o.latency,
                other => return Err(format!("unknown argument `{other}`")),
            };
            let value = args
                .next()
                .ok_or_else(|| format!("{flag} needs a number"))?;
            *slot = value
                .parse()
                .map_err(|_| format!("{flag}: `{value}` is not a number"))?;
        }
        if o.namespaces == 0 || o.namespaces > 60 || o.nodes == 0 {
            return Err("--namespaces must be 1..=60 and --nodes at least 1".into());
        }
        // Each namespace has a /22 (1,024 addresses); the first one also takes the latency
        // Services.
        if o.services.div_ceil(o.namespaces) + o.latency > 1000 {
            return Err("too many Services per namespace for a /22 pool".into());
        }
        Ok(o)
    }
}

/// The pool of namespace number `i`: `10.100.(4i).0/22`.
fn pool(i: usize) -> String {
    format!("10.100.{}.0/22", 4 * i)
}

/// A distinct address of namespace `i`'s pool for its `k`-th Service (floor writes).
fn pool_ip(i: usize, k: usize) -> IpAddr {
    let third = u8::try_from(4 * i + k / 256).expect("pools end below 10.101.0.0");
    IpAddr::V4(Ipv4Addr::new(
        10,
        100,
        third,
        u8::try_from(k % 256).unwrap_or(0),
    ))
}

/// What the watch saw of one Service.
#[derive(Debug, Default, Clone)]
struct Seen {
    ips: Vec<IpAddr>,
    node: Option<String>,
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
            self.announced += usize::from(seen.announced);
            self.services.insert(key, seen);
        }
    }

    /// IPs assigned to `node` (what its fake agent reports as held).
    fn held_by(&self, node: &str) -> BTreeSet<IpAddr> {
        self.services
            .values()
            .filter(|s| s.node.as_deref() == Some(node))
            .flat_map(|s| s.ips.iter().copied())
            .collect()
    }
}

fn seen(svc: &Service) -> Seen {
    Seen {
        ips: service::ingress_ips(svc),
        node: service::annotation(svc, keys::ANNOTATION_NODE).map(str::to_owned),
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

/// Renews the agent Lease of each node every [`RENEW_EVERY`], reporting as held every IP
/// the watch sees assigned to it (what a real agent reports once it added them).
async fn fake_agents(client: Client, system: String, nodes: Vec<String>, p: Arc<Mutex<Progress>>) {
    let leases = Api::<Lease>::namespaced(client, &system);
    let params = PatchParams::apply(keys::AGENT_FIELD_MANAGER).force();
    loop {
        for node in &nodes {
            let held = p.lock().unwrap().held_by(node);
            let report = AgentReport {
                version: REPORT_VERSION,
                held,
                ..AgentReport::default()
            };
            let name = keys::agent_lease_name(node);
            let lease = json!({
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": name, "annotations": {keys::ANNOTATION_AGENT_REPORT: report.to_json()}},
                "spec": {
                    "holderIdentity": node,
                    "leaseDurationSeconds": LEASE_SECONDS,
                    "renewTime": MicroTime(Timestamp::now()),
                },
            });
            if let Err(e) = leases.patch(&name, &params, &Patch::Apply(lease)).await {
                eprintln!("fake agent {node}: renewing failed: {e}");
            }
        }
        tokio::time::sleep(RENEW_EVERY).await;
    }
}

/// `apiserver_request_total` summed by (verb, resource, subresource).
async fn request_counts(client: &Client) -> BTreeMap<(String, String, String), f64> {
    let request = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let text = client.request_text(request).await.unwrap();
    let mut out = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
    {
        let (labels, value) = line.rsplit_once(' ').unwrap();
        let label = |name: &str| {
            labels
                .split(&format!("{name}=\""))
                .nth(1)
                .and_then(|rest| rest.split('"').next())
                .unwrap_or_default()
                .to_owned()
        };
        let key = (label("verb"), label("resource"), label("subresource"));
        *out.entry(key).or_default() += value.parse::<f64>().unwrap_or(0.0);
    }
    out
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

/// The value of `field` (e.g. `VmHWM`) in `/proc/PID/status`, in KiB.
fn proc_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

/// GET `path` over plain HTTP/1.0: (status line, body); `None` while nothing listens.
fn get(addr: SocketAddr, path: &str) -> Option<(String, String)> {
    let mut stream = TcpStream::connect(addr).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: bench\r\n\r\n").ok()?;
    let mut raw = String::new();
    stream.read_to_string(&mut raw).ok()?;
    let (head, body) = raw.split_once("\r\n\r\n")?;
    Some((head.lines().next()?.to_owned(), body.to_owned()))
}

/// glibc malloc arenas of the controller: `1`, as `manifests/controller.yaml` sets it,
/// unless this process has `MALLOC_ARENA_MAX` (e.g. `8` to see glibc's default on 2 cores).
fn malloc_arenas() -> String {
    std::env::var("MALLOC_ARENA_MAX").unwrap_or_else(|_| "1".to_owned())
}

/// Stops the controller when the bench ends in any way: SIGTERM (so a profiler wrapping
/// it writes its output), SIGKILL after 30 s.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let end = Instant::now() + Duration::from_secs(30);
        while Instant::now() < end {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn controller_binary() -> PathBuf {
    std::env::var_os("ALIASLB_CONTROLLER_BIN").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/release/aliaslb-controller"),
        PathBuf::from,
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
                "controller_scale: {e}\nusage: controller_scale [--services N] [--namespaces 1..=60] [--nodes N] [--latency N]"
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
    let n = opts.services;
    // 10,000 LoadBalancer Services need 10,000 node ports (1.20 always allocates them);
    // the default range has 2,768.
    let env = TestEnv::start_with(&["--service-node-port-range=20000-60000"])
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
    let agents = tokio::spawn(fake_agents(
        client.clone(),
        system.clone(),
        nodes.clone(),
        progress.clone(),
    ));

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
    futures::stream::iter(&placed)
        .for_each_concurrent(CREATE_IN_FLIGHT, |(i, _, name)| {
            let api = Api::<Service>::namespaced(client.clone(), &namespaces[*i]);
            async move {
                api.create(&PostParams::default(), &service(name))
                    .await
                    .unwrap();
            }
        })
        .await;
    let created = started.elapsed();
    until(&progress, &mut tick, |p| p.services.len() == n).await;

    // Phase 2: the floor.
    let before = request_counts(&client).await;
    let started = Instant::now();
    futures::stream::iter(&placed)
        .map(|(i, k, name)| {
            let api = Api::<Service>::namespaced(client.clone(), &namespaces[*i]);
            let body = json!({"status": {"loadBalancer": {"ingress": [{"ip": pool_ip(*i, *k).to_string()}]}}});
            async move {
                api.patch_status(name, &PatchParams::default(), &Patch::Merge(body))
                    .await
                    .unwrap();
            }
        })
        .buffer_unordered(FLOOR_IN_FLIGHT)
        .collect::<()>()
        .await;
    let floor_returned = started.elapsed();
    let floor_seen = until(&progress, &mut tick, |p| p.with_ip == n).await - started;
    let after = request_counts(&client).await;
    println!(
        "services: {n} over {} namespaces, {} nodes",
        opts.namespaces, opts.nodes
    );
    println!("created in {} ({CREATE_IN_FLIGHT} in flight)", ms(created));
    println!(
        "floor: {n} merge patches of status.loadBalancer.ingress, {FLOOR_IN_FLIGHT} in flight: last returned {}, all seen by a watch {} ({:.0}/s)",
        ms(floor_returned),
        ms(floor_seen),
        n as f64 / floor_seen.as_secs_f64()
    );
    print_requests(&before, &after, n);

    let started = Instant::now();
    futures::stream::iter(&placed)
        .map(|(i, _, name)| {
            let api = Api::<Service>::namespaced(client.clone(), &namespaces[*i]);
            let body = json!({"status": {"loadBalancer": {"ingress": null}}});
            async move {
                api.patch_status(name, &PatchParams::default(), &Patch::Merge(body))
                    .await
                    .unwrap();
            }
        })
        .buffer_unordered(FLOOR_IN_FLIGHT)
        .collect::<()>()
        .await;
    let cleared = until(&progress, &mut tick, |p| p.with_ip == 0).await - started;
    println!(
        "floor again (clearing them): all seen by a watch {}",
        ms(cleared)
    );

    // Phase 3: the controller binary.
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let log_path =
        std::env::temp_dir().join(format!("controller_scale-{}.log", std::process::id()));
    let log = std::fs::File::create(&log_path).unwrap();
    let before = request_counts(&client).await;
    let started = Instant::now();
    let child = Command::new(&binary)
        .env("KUBECONFIG", env.kubeconfig_path())
        .env("POD_NAMESPACE", &system)
        .env("POD_NAME", "scale-controller")
        .env("ALIASLB_METRICS_ADDR", addr.to_string())
        .env("MALLOC_ARENA_MAX", malloc_arenas())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let controller = Running(child);
    let pid = controller.0.id();
    let ready = loop {
        if get(addr, "/readyz").is_some_and(|(status, _)| status.contains("200")) {
            break started.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let all_ip = until(&progress, &mut tick, |p| p.with_ip == n).await - started;
    let all_announced = until(&progress, &mut tick, |p| p.announced == n).await - started;
    // Let trailing Events land before counting.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = request_counts(&client).await;
    let hwm = proc_kib(pid, "VmHWM").unwrap_or(0);
    println!(
        "controller ({}, MALLOC_ARENA_MAX={}): ready (caches synced) after {}; every Service has an ingress IP {} after start, {} after ready ({:.0}/s); all Announced=True {} after start",
        binary.display(),
        malloc_arenas(),
        ms(ready),
        ms(all_ip),
        ms(all_ip - ready),
        n as f64 / (all_ip - ready).as_secs_f64(),
        ms(all_announced),
    );
    println!(
        "ratio controller / floor (watch-seen): {:.2} from ready, {:.2} from process start",
        (all_ip - ready).as_secs_f64() / floor_seen.as_secs_f64(),
        all_ip.as_secs_f64() / floor_seen.as_secs_f64()
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

    // Phase 4: latency, one Service at a time.
    if opts.latency > 0 {
        let api = Api::<Service>::namespaced(client.clone(), &namespaces[0]);
        let mut to_ip = Vec::with_capacity(opts.latency);
        for l in 0..opts.latency {
            let name = format!("lat-{l:04}");
            let key = format!("{}/{name}", namespaces[0]);
            let t = Instant::now();
            api.create(&PostParams::default(), &service(&name))
                .await
                .unwrap();
            until(&progress, &mut tick, |p| p.first_ip.contains_key(&key)).await;
            to_ip.push(progress.lock().unwrap().first_ip[&key] - t);
        }
        to_ip.sort();
        println!(
            "latency over {} Services created one by one ({n} others converged): create -> ingress IP p50 {} p99 {} max {}",
            opts.latency,
            ms(quantile(&to_ip, 0.5)),
            ms(quantile(&to_ip, 0.99)),
            ms(quantile(&to_ip, 1.0)),
        );
    }
    let hwm = proc_kib(pid, "VmHWM").unwrap_or(0);
    let rss = proc_kib(pid, "VmRSS").unwrap_or(0);
    println!(
        "controller peak RSS (VmHWM) {:.1} MiB, current RSS {:.1} MiB",
        hwm as f64 / 1024.0,
        rss as f64 / 1024.0
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
    println!("controller log: {}", log_path.display());
    drop(controller);
    agents.abort();
    tracker.abort();
}
