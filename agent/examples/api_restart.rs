//! 1,000 agents through a kube-apiserver restart, against the real apiserver (testenv) and
//! the real controller binary: how the agents' retries meet the apiserver when it comes
//! back, measured from the apiserver's own `apiserver_request_total`.
//!
//! Each agent is the agent's own API code, in this process, with its own client (the
//! agent's `aliaslb_ops::api::client`, TCP keepalives and all), acting as a ServiceAccount
//! (so that API Priority and Fairness treats it as it treats real agents, not as the
//! exempt admin): the heartbeat ([`heartbeat::run`], its Lease written with the report)
//! and the assignment watches ([`assignments::watch_assignments`], the watch driver and its
//! backoff). (Agents of before per-node keys also re-read the advert key's Secret every
//! 60 s; agents read no Secret now.) The kernel is left out:
//! an agent reports as held the IPs its assignment lists as held, as a real agent does
//! once it added them, and its alias rounds count as done. The agents start over one renew
//! interval (a rollout does not start them all in the same second).
//!
//! Phases:
//! 1. `--services` LoadBalancer Services, `--agents` Nodes and agents, the controller
//!    binary; until every Service is `Announced=True`;
//! 2. steady state: the agents' Lease writes per second over `--steady` seconds (the
//!    apiserver's counts, sampled every second): mean and max;
//! 3. the restart: the apiserver stopped (SIGTERM) for `--down` seconds and started again
//!    (same port, same etcd); from its `/readyz` on, its requests per second over
//!    `--after` seconds: LIST and WATCH of ConfigMaps (the assignment watches' relists),
//!    Lease writes, GET of Secrets (none since per-node keys), and the 429s (APF); peak and spread;
//! 4. the checks: every agent fresh again (its Lease renewed and both its assignment
//!    watches listed afresh after the restart), and when; no agent dropping an IP it held
//!    before the outage (its desired set, at every publication during and after the
//!    outage); the controller moving no IP (every Service's ingress and node as before,
//!    watched throughout).
//!
//! ```text
//! cargo build --release -p aliaslb-controller --bin aliaslb-controller
//! KUBEBUILDER_ASSETS=$HOME/.cache/aliaslb/kube-v1.37.2/bin \
//!   cargo run --release -p aliaslb-agent --example api_restart -- \
//!   [--agents 1000] [--services 1000] [--down 20] [--steady 60] [--after 60]
//! ```
//! `ALIASLB_CONTROLLER_BIN` overrides the controller binary (default
//! `target/release/aliaslb-controller`).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aliaslb_agent::assignments;
use aliaslb_agent::heartbeat::{
    self, Authority, Heartbeat, HeartbeatLinks, KernelRounds, LeaseConfig,
};
use aliaslb_agent::metrics::Metrics;
use aliaslb_core::keys;
use aliaslb_core::report::{AgentReport, REPORT_VERSION};
use aliaslb_testenv::{TestEnv, fixtures};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Service};
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use serde_json::json;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

/// The agents' user: a ServiceAccount, so that APF puts them where real agents go.
const AGENT_ACCOUNT: &str = "aliaslb-agent";
/// The controller's `POD_NAME`.
const IDENTITY: &str = "restart-controller";
/// The agents' alias lifetime (the agent's default): the heartbeat looks every third of it.
const ALIAS_LIFETIME: Duration = Duration::from_secs(3);
/// How long the restarted apiserver may take to answer `/readyz` (under the load of every
/// agent retrying).
const RESTART_WITHIN: Duration = Duration::from_secs(600);
/// How often the agents' (shared) kernel rounds are marked done.
const KERNEL_ROUND: Duration = Duration::from_millis(500);

/// Command-line options.
#[derive(Debug)]
struct Options {
    agents: usize,
    services: usize,
    /// Seconds the apiserver stays down.
    down: u64,
    /// Seconds of the steady-state window.
    steady: u64,
    /// Seconds observed after the apiserver is ready again.
    after: u64,
    /// The agents' renew interval and lease duration, seconds.
    renew: u64,
    lease: u64,
}

impl Options {
    fn parse() -> Result<Options, String> {
        let mut o = Options {
            agents: 1000,
            services: 1000,
            down: 20,
            steady: 60,
            after: 60,
            renew: 10,
            lease: 30,
        };
        let mut args = std::env::args().skip(1);
        while let Some(flag) = args.next() {
            let value = args
                .next()
                .ok_or_else(|| format!("{flag} needs a number"))?;
            let value: u64 = value
                .parse()
                .map_err(|_| format!("{flag}: `{value}` is not a number"))?;
            match flag.as_str() {
                "--agents" => o.agents = value as usize,
                "--services" => o.services = value as usize,
                "--down" => o.down = value,
                "--steady" => o.steady = value,
                "--after" => o.after = value,
                "--renew" => o.renew = value,
                "--lease" => o.lease = value,
                other => return Err(format!("unknown argument `{other}`")),
            }
        }
        if o.agents == 0 || o.services > 4000 || o.renew == 0 || o.lease < 3 * o.renew {
            return Err(
                "--agents at least 1, --services at most 4000, --lease at least 3 x --renew".into(),
            );
        }
        Ok(o)
    }

    fn flags(&self) -> String {
        format!(
            "--agents {} --services {} --down {} --steady {} --after {} --renew {} --lease {}",
            self.agents, self.services, self.down, self.steady, self.after, self.renew, self.lease
        )
    }
}

/// What the bench follows of one agent.
#[derive(Debug, Default)]
struct AgentView {
    /// The IPs its last published desired set holds.
    held: BTreeSet<IpAddr>,
    /// What it held when the outage began.
    before: Option<BTreeSet<IpAddr>>,
    /// Publications of its desired set that lacked an IP of `before`.
    dropped: usize,
    /// Its first publication of a complete list read after the apiserver started again.
    relisted: Option<Instant>,
    /// Its first successful Lease renewal sent after the apiserver started again (when
    /// sent).
    renewed: Option<Instant>,
}

/// Every agent's view, and the moment the apiserver was started again (`None` before):
/// what an agent reads or writes after it, it reads from the new apiserver.
#[derive(Debug, Default)]
struct Board {
    agents: Vec<AgentView>,
    restart: Option<Instant>,
}

/// One agent of the bench: its node, client and settings.
struct AgentSpec {
    client: Client,
    /// The controller's namespace (assignment objects, advert key).
    system: String,
    /// The agents' namespace (Leases).
    agents_ns: String,
    node: String,
    lease_duration: Duration,
    renew_interval: Duration,
    /// Its place in [`Board::agents`].
    index: usize,
}

/// One agent: the heartbeat, the assignment watches, the key re-reads, and the stand-in
/// for the kernel (the report lists the desired set's IPs as held).
async fn agent(
    spec: AgentSpec,
    board: Arc<Mutex<Board>>,
    kernel: KernelRounds,
    authority: Authority,
) {
    let AgentSpec {
        client,
        system,
        agents_ns,
        node,
        lease_duration,
        renew_interval,
        index,
    } = spec;
    let (desired_tx, mut desired_rx) = watch::channel(None);
    tokio::spawn(assignments::watch_assignments(
        client.clone(),
        system,
        node.clone(),
        desired_tx,
    ));
    let heartbeat = Heartbeat::new(
        client,
        LeaseConfig {
            namespace: agents_ns,
            node_name: node,
            lease_duration,
            renew_interval,
            alias_lifetime: ALIAS_LIFETIME,
        },
    );
    let (report_tx, report_rx) = watch::channel(None);
    tokio::spawn(heartbeat::run(
        heartbeat,
        report_rx,
        Metrics::new().heartbeat.clone(),
        HeartbeatLinks {
            api_back: Arc::new(Notify::new()),
            authority,
            kernel,
        },
    ));
    while desired_rx.changed().await.is_ok() {
        let Some(desired) = desired_rx.borrow_and_update().clone() else {
            continue;
        };
        let held: BTreeSet<IpAddr> = desired.iter().map(|(ip, _)| ip).collect();
        let now = Instant::now();
        {
            let mut board = board.lock().unwrap();
            let restart = board.restart;
            let view = &mut board.agents[index];
            if view.before.as_ref().is_some_and(|b| !b.is_subset(&held)) {
                view.dropped += 1;
            }
            if restart.is_some_and(|r| now > r) && view.relisted.is_none() {
                view.relisted = Some(now);
            }
            view.held = held.clone();
        }
        report_tx.send_if_modified(|report| {
            let new = AgentReport {
                version: REPORT_VERSION,
                held: held.clone(),
                ..AgentReport::default()
            };
            let changed = report.as_ref() != Some(&new);
            *report = Some(new);
            changed
        });
    }
}

/// `apiserver_request_total` by (verb, resource, subresource, code) plus the open
/// long-running requests (`apiserver_longrunning_requests`) as verb `OPEN-WATCH`.
async fn request_counts(client: &Client) -> Option<BTreeMap<(String, String, String), f64>> {
    let request = http::Request::get("/metrics").body(Vec::new()).ok()?;
    let text = client.request_text(request).await.ok()?;
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let open = line.starts_with("apiserver_longrunning_requests{");
        if !(open || line.starts_with("apiserver_request_total{")) {
            continue;
        }
        let Some((labels, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let label = |name: &str| {
            labels
                .split(&format!(",{name}=\""))
                .nth(1)
                .or_else(|| labels.split(&format!("{{{name}=\"")).nth(1))
                .and_then(|rest| rest.split('"').next())
                .unwrap_or_default()
                .to_owned()
        };
        let verb = if open {
            format!("OPEN-{}", label("verb"))
        } else if label("code") == "429" {
            "429".to_owned()
        } else {
            label("verb")
        };
        let key = (verb, label("resource"), label("subresource"));
        *out.entry(key).or_default() += value.parse::<f64>().unwrap_or(0.0);
    }
    Some(out)
}

/// The figures the bench follows, from two samples of [`request_counts`].
#[derive(Debug, Default, Clone, Copy)]
struct Rates {
    list_configmaps: f64,
    watch_configmaps: f64,
    open_watches: f64,
    lease_writes: f64,
    get_secrets: f64,
    throttled: f64,
}

impl Rates {
    fn between(
        before: &BTreeMap<(String, String, String), f64>,
        after: &BTreeMap<(String, String, String), f64>,
    ) -> Rates {
        let delta = |verbs: &[&str], resource: &str| -> f64 {
            after
                .iter()
                .filter(|((v, r, s), _)| {
                    verbs.contains(&v.as_str()) && r == resource && s.is_empty()
                })
                .map(|(k, value)| value - before.get(k).copied().unwrap_or(0.0))
                .sum()
        };
        let open = after
            .iter()
            .filter(|((v, r, _), _)| v == "OPEN-WATCH" && r == "configmaps")
            .map(|(_, value)| *value)
            .sum();
        Rates {
            list_configmaps: delta(&["LIST"], "configmaps"),
            watch_configmaps: delta(&["WATCH"], "configmaps"),
            open_watches: open,
            lease_writes: delta(&["APPLY", "PATCH"], "leases"),
            get_secrets: delta(&["GET"], "secrets"),
            throttled: after
                .iter()
                .filter(|((v, _, _), _)| v == "429")
                .map(|(k, value)| value - before.get(k).copied().unwrap_or(0.0))
                .sum(),
        }
    }
}

/// Samples the apiserver's counts every second for `seconds`; returns the per-second
/// rates. With `from_zero`, first the counts so far (a freshly started apiserver's, from
/// its start to now).
async fn sample(client: &Client, seconds: u64, from_zero: bool) -> Vec<Rates> {
    let mut rates = Vec::new();
    let mut last = request_counts(client).await.unwrap_or_default();
    if from_zero {
        rates.push(Rates::between(&BTreeMap::new(), &last));
    }
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    for _ in 0..seconds {
        tick.tick().await;
        let Some(now) = request_counts(client).await else {
            rates.push(Rates::default());
            continue;
        };
        rates.push(Rates::between(&last, &now));
        last = now;
    }
    rates
}

/// Max, mean and the shortest window holding 95 % of `values` (seconds).
fn spread(values: &[f64]) -> (f64, f64, usize) {
    let total: f64 = values.iter().sum();
    let max = values.iter().copied().fold(0.0, f64::max);
    let mean = total / values.len().max(1) as f64;
    let mut shortest = values.len();
    for start in 0..values.len() {
        let mut sum = 0.0;
        for (len, v) in values[start..].iter().enumerate() {
            sum += v;
            if sum >= 0.95 * total {
                shortest = shortest.min(len + 1);
                break;
            }
        }
    }
    (max, mean, shortest)
}

/// Stops the controller (SIGTERM, then SIGKILL after 30 s) when the bench ends.
struct Running(Option<Child>);

impl Drop for Running {
    fn drop(&mut self) {
        let Some(mut child) = self.0.take() else {
            return;
        };
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let end = std::time::Instant::now() + Duration::from_secs(30);
        while std::time::Instant::now() < end {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

fn controller_binary() -> PathBuf {
    std::env::var_os("ALIASLB_CONTROLLER_BIN").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/release/aliaslb-controller"),
        PathBuf::from,
    )
}

fn start_controller(
    binary: &Path,
    env: &TestEnv,
    system: &str,
    agents_ns: &str,
    lease: u64,
) -> (Running, PathBuf) {
    let addr: SocketAddr = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free local port for the controller's metrics");
    let log_path =
        std::env::temp_dir().join(format!("api_restart-{}-controller.log", std::process::id()));
    let log = std::fs::File::create(&log_path)
        .unwrap_or_else(|e| panic!("creating {}: {e}", log_path.display()));
    let child = Command::new(binary)
        .env("KUBECONFIG", env.kubeconfig_path())
        .env("POD_NAMESPACE", system)
        .env("ALIASLB_AGENT_NAMESPACE", agents_ns)
        .env("ALIASLB_AGENT_LEASE_DURATION", format!("{lease}s"))
        .env("POD_NAME", IDENTITY)
        .env("ALIASLB_METRICS_ADDR", addr.to_string())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", binary.display()));
    (Running(Some(child)), log_path)
}

/// Each Service's (ingress IPs, node annotation), as a watch sees them.
type Placement = BTreeMap<String, (Vec<IpAddr>, Option<String>)>;

fn placement_of(svc: &Service) -> (Vec<IpAddr>, Option<String>) {
    let ips = svc
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .map(|ingress| {
            ingress
                .iter()
                .filter_map(|i| i.ip.as_deref()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    let node = svc
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(keys::ANNOTATION_NODE))
        .cloned();
    (ips, node)
}

fn announced(svc: &Service) -> bool {
    svc.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| {
            c.iter()
                .any(|c| c.type_ == keys::CONDITION_ANNOUNCED && c.status == "True")
        })
}

/// Follows every Service: its placement and whether it is announced; counts the placement
/// changes seen once `frozen` holds the placement to keep.
#[derive(Debug, Default)]
struct Services {
    now: Placement,
    announced: BTreeSet<String>,
    frozen: Option<Placement>,
    moves: Vec<String>,
}

async fn track(client: Client, ns: String, services: Arc<Mutex<Services>>) {
    let api = Api::<Service>::namespaced(client, &ns);
    let stream = watcher::watcher(api, watcher::Config::default()).default_backoff();
    futures::pin_mut!(stream);
    while let Some(event) = stream.next().await {
        let Ok(watcher::Event::Apply(svc) | watcher::Event::InitApply(svc)) = event else {
            continue;
        };
        let name = svc.metadata.name.clone().unwrap_or_default();
        let place = placement_of(&svc);
        let mut s = services.lock().unwrap();
        if announced(&svc) {
            s.announced.insert(name.clone());
        } else {
            s.announced.remove(&name);
        }
        if let Some(frozen) = &s.frozen
            && frozen.get(&name) != Some(&place)
        {
            let was = frozen.get(&name).cloned();
            s.moves.push(format!("{name}: {was:?} -> {place:?}"));
        }
        s.now.insert(name, place);
    }
}

fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let opts = Options::parse().unwrap_or_else(|e| {
        eprintln!("api_restart: {e}");
        std::process::exit(2);
    });
    let binary = controller_binary();
    if !binary.is_file() {
        eprintln!(
            "api_restart: {} not found: run `cargo build --release -p aliaslb-controller --bin aliaslb-controller` (or set ALIASLB_CONTROLLER_BIN)",
            binary.display()
        );
        std::process::exit(2);
    }
    println!("api_restart {}", opts.flags());
    let mut env = TestEnv::start_with(&["--service-node-port-range=1024-65535"])
        .unwrap_or_else(|e| panic!("starting the test apiserver: {e}"));
    let admin = env.client().await;
    let system = env.create_namespace(&admin, "restart-system").await;
    let agents_ns = env.create_namespace(&admin, "restart-agents").await;
    let apps = env.create_namespace(&admin, "restart-apps").await;

    // The agents' ServiceAccount may do anything (RBAC is not what is measured); it is a
    // ServiceAccount so that APF classifies its requests as a real agent's.
    let binding: k8s_openapi::api::rbac::v1::ClusterRoleBinding = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "restart-bench-agents"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
        "subjects": [{"kind": "ServiceAccount", "name": AGENT_ACCOUNT, "namespace": agents_ns}],
    }))
    .unwrap();
    Api::all(admin.clone())
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    let pools = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": keys::DEFAULT_POOL_CONFIGMAP},
        "data": {apps.as_str(): "10.200.0.0/20"},
    });
    Api::<ConfigMap>::namespaced(admin.clone(), &system)
        .patch(
            keys::DEFAULT_POOL_CONFIGMAP,
            &PatchParams::apply("bench"),
            &Patch::Apply(pools),
        )
        .await
        .unwrap();
    let nodes: Vec<String> = (1..=opts.agents)
        .map(|i| format!("restart-node-{i:04}"))
        .collect();
    futures::stream::iter(&nodes)
        .map(|name| {
            let api = Api::<Node>::all(admin.clone());
            async move {
                let node: Node = serde_json::from_value(
                    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}}),
                )
                .unwrap();
                api.create(&PostParams::default(), &node).await.unwrap();
            }
        })
        .buffer_unordered(32)
        .collect::<()>()
        .await;
    let services = Arc::new(Mutex::new(Services::default()));
    tokio::spawn(track(admin.clone(), apps.clone(), services.clone()));
    futures::stream::iter(0..opts.services)
        .map(|i| {
            let api = Api::<Service>::namespaced(admin.clone(), &apps);
            async move {
                let svc = fixtures::lb_service("", &format!("svc-{i:04}"))
                    .meta(|m| m.uid = None)
                    .build();
                api.create(&PostParams::default(), &svc).await.unwrap();
            }
        })
        .buffer_unordered(32)
        .collect::<()>()
        .await;
    println!(
        "  {} Nodes, {} Services created; starting the controller",
        opts.agents, opts.services
    );
    let (_controller, controller_log) =
        start_controller(&binary, &env, &system, &agents_ns, opts.lease);
    println!("  controller log: {}", controller_log.display());

    // The agents, started one every renew interval / N.
    let board = Arc::new(Mutex::new(Board {
        agents: (0..opts.agents).map(|_| AgentView::default()).collect(),
        restart: None,
    }));
    let kernel = KernelRounds::new();
    {
        let kernel = kernel.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(KERNEL_ROUND);
            loop {
                tick.tick().await;
                kernel.record_ok(Instant::now());
            }
        });
    }
    let lease_duration = Duration::from_secs(opts.lease);
    let renew_interval = Duration::from_secs(opts.renew);
    let mut authorities = Vec::new();
    let started = Instant::now();
    let stagger = renew_interval / u32::try_from(opts.agents).unwrap_or(u32::MAX);
    for (index, node) in nodes.iter().enumerate() {
        let mut config = env.config().await.unwrap();
        config.auth_info.impersonate =
            Some(format!("system:serviceaccount:{agents_ns}:{AGENT_ACCOUNT}"));
        config.auth_info.impersonate_groups = Some(vec![
            "system:serviceaccounts".to_owned(),
            format!("system:serviceaccounts:{agents_ns}"),
            "system:authenticated".to_owned(),
        ]);
        let client = aliaslb_ops::api::client_for(config).unwrap();
        let authority = Authority::new(lease_duration);
        authorities.push(authority.clone());
        let spec = AgentSpec {
            client,
            system: system.clone(),
            agents_ns: agents_ns.clone(),
            node: node.clone(),
            lease_duration,
            renew_interval,
            index,
        };
        tokio::spawn(agent(spec, board.clone(), kernel.clone(), authority));
        tokio::time::sleep_until(started + stagger * u32::try_from(index + 1).unwrap_or(0)).await;
    }
    let converged = loop {
        let (announced, renewed) = {
            let s = services.lock().unwrap();
            let renewed = authorities
                .iter()
                .filter(|a| a.last_renewal().is_some())
                .count();
            (s.announced.len(), renewed)
        };
        if announced == opts.services && renewed == opts.agents {
            break started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "not converged after 600 s: {announced} of {} Services announced, {renewed} of {} agents renewed; see {}",
            opts.services,
            opts.agents,
            controller_log.display()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    println!(
        "phase 1: {} agents started over {}, every Service announced and every agent renewed after {}",
        opts.agents,
        secs(renew_interval),
        secs(converged)
    );

    // Phase 2: steady state.
    let steady = sample(&admin, opts.steady, false).await;
    let writes: Vec<f64> = steady.iter().map(|r| r.lease_writes).collect();
    let (max, mean, _) = spread(&writes);
    println!(
        "phase 2, steady state over {} s: Lease writes {mean:.1}/s mean, {max:.0}/s max (max/mean {:.2}; {} agents renewing every {})",
        opts.steady,
        max / mean.max(f64::MIN_POSITIVE),
        opts.agents,
        secs(renew_interval)
    );

    // Phase 3: the restart.
    {
        let mut board = board.lock().unwrap();
        for view in &mut board.agents {
            view.before = Some(view.held.clone());
        }
        let mut s = services.lock().unwrap();
        s.frozen = Some(s.now.clone());
    }
    let held_before: usize = board
        .lock()
        .unwrap()
        .agents
        .iter()
        .map(|v| v.held.len())
        .sum();
    let stopped = Instant::now();
    tokio::task::block_in_place(|| env.stop_apiserver());
    println!(
        "phase 3: apiserver stopped (SIGTERM) in {}; {} IPs held by the agents",
        secs(stopped.elapsed()),
        held_before
    );
    tokio::time::sleep_until(stopped + Duration::from_secs(opts.down)).await;
    let starting = Instant::now();
    board.lock().unwrap().restart = Some(starting);
    tokio::task::block_in_place(|| env.start_apiserver(RESTART_WITHIN))
        .unwrap_or_else(|e| panic!("starting the apiserver again: {e}"));
    let ready = Instant::now();
    println!(
        "  apiserver down {} in all, started again: ready {} after its start",
        secs(ready - stopped),
        secs(ready - starting)
    );
    // Every agent's first renewal after the apiserver started again: `last_renewal` is when
    // the request was sent, and renewals come at least a look (1 s) apart, so a 100 ms poll
    // sees the first one.
    let restart = starting;
    let renewals = {
        let (board, authorities) = (board.clone(), authorities.clone());
        tokio::spawn(async move {
            loop {
                let mut all = true;
                {
                    let mut board = board.lock().unwrap();
                    for (view, authority) in board.agents.iter_mut().zip(&authorities) {
                        if view.renewed.is_none() {
                            match authority.last_renewal() {
                                Some(at) if at > restart => view.renewed = Some(at),
                                _ => all = false,
                            }
                        }
                    }
                }
                if all {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    let after = sample(&admin, opts.after, true).await;
    renewals.abort();

    println!(
        "  the apiserver's requests, per second after /readyz (row 0: from its start to /readyz; WATCH: watches that ended):"
    );
    println!("     s   LIST cm  WATCH cm  open watches  Lease writes  GET secret  429");
    for (i, r) in after.iter().enumerate() {
        println!(
            "  {i:>4}  {:>7.0}  {:>8.0}  {:>12.0}  {:>12.0}  {:>10.0}  {:>3.0}",
            r.list_configmaps,
            r.watch_configmaps,
            r.open_watches,
            r.lease_writes,
            r.get_secrets,
            r.throttled
        );
    }
    for (what, values) in [
        (
            "LIST configmaps",
            after.iter().map(|r| r.list_configmaps).collect::<Vec<_>>(),
        ),
        (
            "Lease writes",
            after.iter().map(|r| r.lease_writes).collect::<Vec<_>>(),
        ),
    ] {
        let (max, _, window) = spread(&values);
        let total: f64 = values.iter().sum();
        println!(
            "  {what}: {total:.0} in {} s, peak {max:.0}/s, 95 % of them within {window} s",
            values.len()
        );
    }

    // Phase 4: the checks.
    let board = board.lock().unwrap();
    let mut fresh: Vec<Duration> = Vec::new();
    let mut stale = 0;
    for view in &board.agents {
        match (view.relisted, view.renewed) {
            (Some(relisted), Some(renewed)) => {
                fresh.push(relisted.max(renewed).saturating_duration_since(ready));
            }
            _ => stale += 1,
        }
    }
    fresh.sort();
    let quantile = |q: f64| {
        fresh
            .get(((q * fresh.len() as f64).ceil() as usize).clamp(1, fresh.len().max(1)) - 1)
            .copied()
            .unwrap_or_default()
    };
    println!(
        "phase 4: agents fresh again (Lease renewed and both assignment watches listed afresh), from /readyz: {} of {}, p50 {} p95 {} max {}",
        fresh.len(),
        opts.agents,
        secs(quantile(0.5)),
        secs(quantile(0.95)),
        secs(quantile(1.0)),
    );
    let dropped: usize = board.agents.iter().map(|v| v.dropped).sum();
    let held_after: usize = board.agents.iter().map(|v| v.held.len()).sum();
    println!(
        "  IPs dropped by an agent: {dropped} publications lacking an IP held before ({held_before} held before, {held_after} after)"
    );
    let moves = services.lock().unwrap().moves.clone();
    println!(
        "  Services moved or renumbered by the controller: {}",
        moves.len()
    );
    for m in moves.iter().take(10) {
        println!("    {m}");
    }
    let ok = stale == 0 && dropped == 0 && moves.is_empty();
    println!(
        "summary: {}",
        if ok {
            "every agent fresh again, nothing dropped, nothing moved"
        } else {
            "FAILED: see above"
        }
    );
    if !ok {
        std::process::exit(1);
    }
}
