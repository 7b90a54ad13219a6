//! Test support for running the real `aliaslb-agent` binary in a network namespace
//! against the test apiserver: a TCP relay that makes the host's `127.0.0.1:PORT`
//! apiserver reachable at the same address inside the namespace, the agent process, and
//! small assignment/Lease helpers acting as the controller would. Does I/O (threads,
//! sockets, processes, API calls). Builds on `support` (namespaces, `ip`).

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aliaslb_core::assignment::{NodeAssignments, OpenPort, Protocol};
use aliaslb_core::keys;
use aliaslb_core::report::AgentReport;
use aliaslb_testenv::{TestEnv, fixtures};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use crate::support::NetNs;
pub use crate::support::relay::Relay;

/// Polls `check` every 20 ms until it returns `Some`, or panics after `within`.
pub async fn eventually<T>(
    within: Duration,
    what: &str,
    mut check: impl AsyncFnMut() -> Option<T>,
) -> T {
    let end = Instant::now() + within;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            Instant::now() < end,
            "timed out after {within:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The agent binary running in a namespace; killed on drop, its log printed if the test
/// failed.
#[derive(Debug)]
pub struct Agent {
    child: Option<Child>,
    log: PathBuf,
    ns: String,
}

/// Flags of one agent run.
#[derive(Debug, Clone)]
pub struct AgentArgs {
    /// `--node-name`.
    pub node: String,
    /// `--namespace` and `--agent-namespace` (the test's Kubernetes namespace: its
    /// assignment objects and its Lease).
    pub namespace: String,
    /// `--lease-duration`.
    pub lease: &'static str,
    /// `--renew-interval`.
    pub renew: &'static str,
    /// More flags.
    pub extra: Vec<String>,
    /// More environment variables (e.g. a `PATH` with a wrapped `nft` first).
    pub env: Vec<(String, String)>,
}

impl AgentArgs {
    /// Node `node` (unique per test: every agent watches the Services of all
    /// namespaces), a 2 s lease renewed every 500 ms.
    pub fn new(node: &str, namespace: &str) -> Self {
        AgentArgs {
            node: node.into(),
            namespace: namespace.into(),
            lease: "2s",
            renew: "500ms",
            extra: Vec::new(),
            env: Vec::new(),
        }
    }
}

/// Where the agent's metrics server listens inside its namespace.
pub const METRICS_ADDR: &str = "127.0.0.1:9101";

impl Agent {
    /// Starts the agent in `ns` with `args`, the test apiserver's kubeconfig.
    pub fn start(ns: &NetNs, args: &AgentArgs) -> Agent {
        let log = std::env::temp_dir().join(format!("{}-agent.log", ns.name()));
        let file = std::fs::File::create(&log).unwrap();
        let mut cmd = Command::new("ip");
        cmd.args([
            "netns",
            "exec",
            ns.name(),
            env!("CARGO_BIN_EXE_aliaslb-agent"),
        ])
        .args(["--node-name", &args.node])
        .args(["--namespace", &args.namespace])
        .args(["--agent-namespace", &args.namespace])
        .args(["--lease-duration", args.lease])
        .args(["--renew-interval", args.renew])
        .args(["--metrics-addr", METRICS_ADDR])
        .args(&args.extra)
        .envs(args.env.iter().map(|(k, v)| (k, v)))
        .env("KUBECONFIG", TestEnv::global().kubeconfig_path())
        .env_remove("RUST_LOG")
        .env_remove("NODE_NAME")
        .env_remove("POD_NAMESPACE")
        .stdout(Stdio::null())
        .stderr(file);
        let child = cmd.spawn().expect("spawning the agent");
        Agent {
            child: Some(child),
            log,
            ns: ns.name().to_owned(),
        }
    }

    /// The process id (`ip netns exec` execs the agent: same process).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// Sends `signal` (`TERM`, `KILL`...).
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([format!("-{signal}"), self.pid().to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill -{signal} failed");
    }

    /// Waits for the exit, at most `within`.
    pub fn wait(&mut self, within: Duration) -> ExitStatus {
        let end = Instant::now() + within;
        let child = self.child.as_mut().unwrap();
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < end,
                "agent did not exit within {within:?}\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The agent's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// GET `path` from the agent's HTTP server inside its namespace; `None` while nothing
    /// listens.
    pub fn get(&self, ns: &NetNs, path: &str) -> Option<String> {
        let path = path.to_owned();
        ns.run_sync(move || {
            let mut s = TcpStream::connect(METRICS_ADDR).ok()?;
            write!(s, "GET {path} HTTP/1.0\r\nHost: test\r\n\r\n").ok()?;
            let mut raw = String::new();
            s.read_to_string(&mut raw).ok()?;
            Some(raw)
        })
    }

    /// The value of the metric sample `line_prefix` (e.g. `aliaslb_agent_repairs_total`).
    pub fn metric(&self, ns: &NetNs, sample: &str) -> Option<f64> {
        let body = self.get(ns, "/metrics")?;
        body.lines().find_map(|l| {
            let (name, value) = l.rsplit_once(' ')?;
            (name == sample).then(|| value.parse().ok())?
        })
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if std::thread::panicking() {
            eprintln!("---- agent log ({}) ----\n{}", self.ns, self.log_text());
        }
    }
}

/// A `type: LoadBalancer` Service `name` with one TCP port.
pub fn lb_service(name: &str) -> Service {
    fixtures::lb_service("", name)
        .meta(|m| m.uid = None)
        .build()
}

/// One Service as the controller assigned it: node, interface, IPs.
type Assigned = (Option<String>, Option<String>, Vec<String>);

/// The controller's side, as far as the agent sees it: Services, the node assignment
/// objects and the agent Leases, all in one namespace.
#[derive(Debug, Clone)]
pub struct Cluster {
    pub services: Api<Service>,
    pub leases: Api<Lease>,
    pub assignments: Api<ConfigMap>,
    /// What [`Cluster::assign`] said per Service, to write whole node objects.
    assigned: Arc<Mutex<BTreeMap<String, Assigned>>>,
}

impl Cluster {
    /// Server-side applies `cm` (a ConfigMap named `name` in the test's namespace) as the
    /// controller would: its field manager, forced.
    pub async fn apply(&self, name: &str, cm: &serde_json::Value) {
        self.assignments
            .patch(
                name,
                &PatchParams::apply("test-controller").force(),
                &Patch::Apply(cm),
            )
            .await
            .unwrap();
    }

    /// Helpers over `namespace`.
    pub fn new(client: &Client, namespace: &str) -> Self {
        Cluster {
            services: Api::namespaced(client.clone(), namespace),
            leases: Api::namespaced(client.clone(), namespace),
            assignments: Api::namespaced(client.clone(), namespace),
            assigned: Arc::default(),
        }
    }

    /// Creates the LoadBalancer Service `name`.
    pub async fn create(&self, name: &str) {
        self.services
            .create(&PostParams::default(), &lb_service(name))
            .await
            .unwrap();
    }

    /// Assigns `ips` of Service `name` to `node` (to no node when `None`), as the
    /// controller would: the Service's status ingress, then the assignment objects of the
    /// nodes it leaves and joins (the only thing the agent acts on), with port tcp/80.
    pub async fn assign(
        &self,
        name: &str,
        node: Option<&str>,
        interface: Option<&str>,
        ips: &[&str],
    ) {
        let ingress: Vec<_> = ips.iter().map(|ip| json!({"ip": ip})).collect();
        let status = json!({"status": {"loadBalancer": {"ingress": ingress}}});
        self.services
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .unwrap();
        let (before, all) = {
            let mut assigned = self.assigned.lock().unwrap();
            let before = assigned.get(name).and_then(|a| a.0.clone());
            let entry = (
                node.map(str::to_owned),
                interface.map(str::to_owned),
                ips.iter().map(|s| (*s).to_owned()).collect(),
            );
            assigned.insert(name.to_owned(), entry);
            (before, assigned.clone())
        };
        for n in before.iter().map(String::as_str).chain(node) {
            self.write_assignment(n, &all).await;
        }
    }

    /// Writes `node`'s assignment object from `all`.
    async fn write_assignment(&self, node: &str, all: &BTreeMap<String, Assigned>) {
        let mut a = NodeAssignments::new();
        for (svc, (n, interface, ips)) in all {
            if n.as_deref() != Some(node) {
                continue;
            }
            for ip in ips {
                let port = OpenPort {
                    protocol: Protocol::Tcp,
                    port: 80,
                };
                a.assign(ip.parse().unwrap(), interface.as_deref(), [port], svc);
            }
        }
        self.set_assignment_text(node, &a.render()).await;
    }

    /// Writes `text` as `node`'s assignment object, as is.
    pub async fn set_assignment_text(&self, node: &str, text: &str) {
        self.set_assignment_data(node, &[(keys::ASSIGNMENTS_KEY, text)])
            .await;
    }

    /// Writes `text` (IP lines) and `peers` as `node`'s objects in the sharded format the
    /// controller writes: the shards (labelled for the node), then the index counting them.
    pub async fn set_sharded(&self, node: &str, text: &str, peers: &str) {
        use aliaslb_core::assignment::shards::{LEGACY_MARKER, Sharded};
        let sharded = Sharded::split(&NodeAssignments::parse(text).unwrap(), 1);
        let labels = json!({
            keys::LABEL_ASSIGNMENTS: "true",
            keys::LABEL_ASSIGNMENT_NODE: keys::assignment_node_label(node),
        });
        for (k, shard) in sharded.texts.iter().enumerate() {
            let name = keys::assignment_shard_configmap(node, k as u32);
            let cm = json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name, "labels": labels},
                "data": {keys::ASSIGNMENTS_KEY: shard},
            });
            self.apply(&name, &cm).await;
        }
        let name = keys::assignment_configmap(node);
        let cm = json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "labels": labels},
            "data": {
                keys::ASSIGNMENTS_KEY: LEGACY_MARKER,
                keys::SHARDS_KEY: sharded.count().to_string(),
                keys::PEERS_KEY: peers,
            },
        });
        self.apply(&name, &cm).await;
    }

    /// Writes `data` (key, text) as `node`'s assignment object, as is.
    pub async fn set_assignment_data(&self, node: &str, data: &[(&str, &str)]) {
        let name = keys::assignment_configmap(node);
        let data: serde_json::Map<String, serde_json::Value> = data
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).into()))
            .collect();
        let cm = json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name},
            "data": data,
        });
        self.apply(&name, &cm).await;
    }

    /// The agent report of `node`'s Lease, if the Lease exists.
    pub async fn report(&self, node: &str) -> Option<AgentReport> {
        let lease = self.lease(node).await?;
        let json = lease
            .metadata
            .annotations?
            .remove(keys::ANNOTATION_AGENT_REPORT)?;
        Some(AgentReport::from_json(&json).unwrap())
    }

    /// `node`'s agent Lease, if it exists.
    pub async fn lease(&self, node: &str) -> Option<Lease> {
        self.leases
            .get_opt(&keys::agent_lease_name(node))
            .await
            .unwrap()
    }
}

/// One test's world: the node namespace and its LAN peer, the relay to the API server,
/// the Kubernetes namespace and helpers, and the agent, started and past its first Lease.
pub struct Setup {
    /// The Kubernetes node name of the agent (unique per test).
    pub name: String,
    /// The Kubernetes namespace of the test's objects.
    pub namespace: String,
    pub node: NetNs,
    pub lan: NetNs,
    pub relay: Relay,
    pub cluster: Cluster,
    pub agent: Agent,
}

/// Starts the agent of node `tag` with its flags as `tweak` leaves them, in a fresh node
/// namespace and Kubernetes namespace, and waits for its first Lease (ready = the first
/// reconcile on a complete read of its assignment done; the Lease follows at once).
pub async fn setup(tag: &str, tweak: impl FnOnce(&mut AgentArgs)) -> Setup {
    let env = TestEnv::global();
    let client = env.client().await;
    let namespace = env.create_namespace(&client, tag).await;
    let (node, lan) = crate::support::node_and_lan(tag);
    let relay = Relay::start(&node, env.server_url());
    let name = format!("node-{tag}");
    let mut args = AgentArgs::new(&name, &namespace);
    tweak(&mut args);
    let agent = Agent::start(&node, &args);
    let cluster = Cluster::new(&client, &namespace);
    eventually(
        Duration::from_secs(20),
        "the agent's first Lease",
        async || cluster.report(&name).await,
    )
    .await;
    Setup {
        name,
        namespace,
        node,
        lan,
        relay,
        cluster,
        agent,
    }
}
