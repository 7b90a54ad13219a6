//! Test support for the controller against the real kube-apiserver: an in-process
//! controller, fake agents renewing their Leases, fixture builders and polling helpers.
//!
//! Every controller watches Services in all namespaces, so tests of one binary that run a
//! controller take [`serial`] first and delete their Services at the end ([`Cluster::cleanup`]).

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use aliaslb_controller::config::ControllerConfig;
use aliaslb_controller::context::Context;
use aliaslb_controller::http::Readiness;
use aliaslb_controller::leader::Leadership;
use aliaslb_controller::metrics::Metrics;
use aliaslb_controller::reconcile;
use aliaslb_controller::write::assignments;
use aliaslb_core::assignment::NodeAssignments;
use aliaslb_core::keys;
use aliaslb_core::report::{AgentReport, REPORT_VERSION, RoutingReport};
// The controller's own reading of a Service, re-exported for the tests (not every test
// binary reads both).
#[allow(unused_imports)]
pub use aliaslb_controller::observe::service::{annotation, ingress_ips as ingress};
use aliaslb_testenv::TestEnv;
pub use aliaslb_testenv::fixtures::{self, LbService};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Service};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use tokio::task::JoinHandle;

/// Agent Lease duration the tests run with.
pub const AGENT_LEASE: Duration = Duration::from_secs(2);
/// How often fake agents renew.
pub const AGENT_RENEW: Duration = Duration::from_millis(500);

/// How long the tests wait for the controller to act on a change.
pub const SETTLE: Duration = Duration::from_secs(10);

/// Serialises the tests of one binary that run a controller (see the module docs).
pub async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    LOCK.lock().await
}

/// Aborts a task when dropped.
pub struct Task(pub JoinHandle<()>);

impl Drop for Task {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// One test's slice of the cluster: a Services namespace and a controller namespace.
pub struct Cluster {
    pub env: &'static TestEnv,
    pub client: Client,
    /// Where the test's Services live (and the pool key).
    pub ns: String,
    /// The controller's namespace: pool ConfigMap, agent Leases.
    pub system: String,
}

impl Cluster {
    pub async fn new(hint: &str) -> Cluster {
        // Logs with `RUST_LOG=info cargo test ... -- --nocapture`.
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
        let env = TestEnv::global();
        let client = env.client().await;
        delete_leftovers(&client).await;
        let ns = env.create_namespace(&client, hint).await;
        let system = env
            .create_namespace(&client, &format!("{hint}-system"))
            .await;
        Cluster {
            env,
            client,
            ns,
            system,
        }
    }

    /// The controller settings of this test.
    pub fn config(&self) -> ControllerConfig {
        ControllerConfig {
            namespace: self.system.clone(),
            agent_namespace: self.system.clone(),
            agent_lease_duration: AGENT_LEASE,
            ..ControllerConfig::default()
        }
    }

    /// Starts an in-process controller (always leader); returns its task and metrics.
    pub fn start_controller(&self) -> (Task, Arc<Metrics>) {
        self.start_controller_with(self.config())
    }

    /// Starts an in-process controller (always leader) with `config`.
    pub fn start_controller_with(&self, config: ControllerConfig) -> (Task, Arc<Metrics>) {
        let metrics = Arc::new(Metrics::new());
        let ctx = Context::new(
            self.client.clone(),
            config,
            metrics.clone(),
            Leadership::fixed(true),
            "test-controller",
        );
        let task = tokio::spawn(async move {
            if let Err(e) = reconcile::run(ctx, Readiness::new()).await {
                panic!("controller failed: {e}");
            }
        });
        (Task(task), metrics)
    }

    /// Creates or replaces the pool ConfigMap.
    pub async fn set_pool(&self, data: &[(&str, &str)]) {
        let data: BTreeMap<String, String> = data
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let cm = json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": keys::DEFAULT_POOL_CONFIGMAP, "namespace": self.system},
            "data": data,
        });
        Api::<ConfigMap>::namespaced(self.client.clone(), &self.system)
            .patch(
                keys::DEFAULT_POOL_CONFIGMAP,
                &PatchParams::apply("test").force(),
                &Patch::Apply(cm),
            )
            .await
            .unwrap();
    }

    /// Creates a Node named `<ns>-<name>` and returns its name.
    pub async fn node(&self, name: &str) -> String {
        let name = format!("{}-{name}", self.ns);
        let node: Node = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
        }))
        .unwrap();
        Api::<Node>::all(self.client.clone())
            .create(&PostParams::default(), &node)
            .await
            .unwrap();
        name
    }

    /// Sets the `status.addresses` of Node `node` (a full name) to `(type, address)` pairs,
    /// through the status subresource, as the kubelet would.
    pub async fn set_node_addresses(&self, node: &str, addresses: &[(&str, &str)]) {
        let addresses: Vec<serde_json::Value> = addresses
            .iter()
            .map(|(type_, address)| json!({"type": type_, "address": address}))
            .collect();
        Api::<Node>::all(self.client.clone())
            .patch_status(
                node,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"addresses": addresses}})),
            )
            .await
            .unwrap();
    }

    /// Starts a fake agent for `node`: renews its Lease every [`AGENT_RENEW`] and reports
    /// holding every IP of its node's assignment object (what a real agent acts on).
    /// Dropping it stops renewing (hard loss).
    pub fn fake_agent(&self, node: &str) -> Task {
        self.agent_of_version(node, Some(env!("CARGO_PKG_VERSION")))
    }

    /// Starts a fake agent for `node` like [`Cluster::fake_agent`], its Lease labelled with
    /// the agent release `version` (`None`: no label). Each call is a new agent: stop the
    /// previous one of the node first.
    #[allow(dead_code)]
    pub fn agent_of_version(&self, node: &str, version: Option<&str>) -> Task {
        let assignments = Api::<ConfigMap>::namespaced(self.client.clone(), &self.system);
        let assignment = node.to_owned();
        self.agent_writing_as(node, version, move || {
            let assignments = assignments.clone();
            let assignment = assignment.clone();
            async move {
                AgentReport {
                    version: REPORT_VERSION,
                    held: assigned_ips(&assignments, &assignment).await,
                    ..AgentReport::default()
                }
                .to_json()
            }
        })
    }

    /// Waits until every node of `nodes` has its agent Lease (a fake agent's first renewal):
    /// a controller started after this sees them all ready in its first pass.
    #[allow(dead_code)]
    pub async fn wait_agent_leases(&self, nodes: &[&str]) {
        let leases = Api::<Lease>::namespaced(self.client.clone(), &self.system);
        eventually(
            SETTLE,
            &format!("the agent Leases of {nodes:?}"),
            async || {
                let mut all = true;
                for node in nodes {
                    let name = keys::agent_lease_name(node);
                    all &= leases.get_opt(&name).await.is_ok_and(|l| l.is_some());
                }
                all
            },
        )
        .await;
    }

    /// Starts an L3 agent for `node`: like [`Cluster::fake_agent`], and reporting its
    /// routing daemon as `routing` says at each renewal, the daemon exporting every IP
    /// held unless it has an error or no Established session. `None`: no daemon read.
    #[allow(dead_code)]
    pub fn bgp_agent(
        &self,
        node: &str,
        routing: Arc<std::sync::Mutex<Option<RoutingReport>>>,
    ) -> Task {
        let assignments = Api::<ConfigMap>::namespaced(self.client.clone(), &self.system);
        let assignment = node.to_owned();
        self.agent_writing(node, move || {
            let assignments = assignments.clone();
            let assignment = assignment.clone();
            let routing = routing.lock().unwrap().clone();
            async move {
                let held = assigned_ips(&assignments, &assignment).await;
                let routing = routing.map(|mut r| {
                    if r.error.is_none() && r.established > 0 {
                        r.exported = held.clone();
                    }
                    r
                });
                AgentReport {
                    version: REPORT_VERSION,
                    held,
                    routing,
                    ..AgentReport::default()
                }
                .to_json()
            }
        })
    }

    /// Starts an agent for `node` that renews its Lease like [`Cluster::fake_agent`] but
    /// always writes `annotation` as its report (a buggy or compromised agent).
    pub fn agent_reporting(&self, node: &str, annotation: String) -> Task {
        self.agent_writing(node, move || std::future::ready(annotation.clone()))
    }

    /// An agent for `node` renewing its Lease every [`AGENT_RENEW`] with the report
    /// annotation `report` gives each time.
    #[allow(dead_code)]
    pub fn agent_with<F: Future<Output = String> + Send>(
        &self,
        node: &str,
        report: impl Fn() -> F + Send + 'static,
    ) -> Task {
        self.agent_writing(node, report)
    }

    /// An agent for `node` renewing its Lease every [`AGENT_RENEW`] with the report
    /// annotation `report` gives each time.
    fn agent_writing<F: Future<Output = String> + Send>(
        &self,
        node: &str,
        report: impl Fn() -> F + Send + 'static,
    ) -> Task {
        self.agent_writing_as(node, Some(env!("CARGO_PKG_VERSION")), report)
    }

    /// Like [`Cluster::agent_writing`], the Lease labelled with the agent release `version`
    /// (`None`: no label, as agents older than version reporting write it).
    fn agent_writing_as<F: Future<Output = String> + Send>(
        &self,
        node: &str,
        version: Option<&str>,
        report: impl Fn() -> F + Send + 'static,
    ) -> Task {
        let leases = Api::<Lease>::namespaced(self.client.clone(), &self.system);
        let node = node.to_owned();
        let labels = match version {
            Some(v) => json!({keys::LABEL_AGENT_VERSION: v}),
            None => json!({}),
        };
        Task(tokio::spawn(async move {
            let name = keys::agent_lease_name(&node);
            loop {
                let lease = json!({
                    "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {
                        "name": name,
                        "labels": labels,
                        "annotations": {keys::ANNOTATION_AGENT_REPORT: report().await},
                    },
                    "spec": {
                        "holderIdentity": node,
                        "leaseDurationSeconds": AGENT_LEASE.as_secs(),
                        "renewTime": MicroTime(Timestamp::now()),
                    },
                });
                let renewed = leases
                    .patch(
                        &name,
                        &PatchParams::apply(keys::AGENT_FIELD_MANAGER).force(),
                        &Patch::Apply(lease),
                    )
                    .await;
                if let Err(e) = renewed {
                    eprintln!("fake agent {node}: renewing failed: {e}");
                }
                tokio::time::sleep(AGENT_RENEW).await;
            }
        }))
    }

    /// `aliaslb status` over this test's namespaces (the real CLI binary): its table.
    pub fn status_table(&self) -> String {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_aliaslb"))
            .args(["status", "--controller-namespace", &self.system])
            .args(["--agent-namespace", &self.system])
            .env("KUBECONFIG", self.env.kubeconfig_path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "aliaslb status failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// Creates a LoadBalancer Service from `builder`.
    pub async fn create(&self, builder: LbService) -> Service {
        let svc = builder
            .meta(|m| m.namespace = Some(self.ns.clone()))
            .build();
        Api::<Service>::namespaced(self.client.clone(), &self.ns)
            .create(&PostParams::default(), &svc)
            .await
            .unwrap()
    }

    pub async fn delete(&self, name: &str) {
        Api::<Service>::namespaced(self.client.clone(), &self.ns)
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }

    pub async fn get(&self, name: &str) -> Service {
        Api::<Service>::namespaced(self.client.clone(), &self.ns)
            .get(name)
            .await
            .unwrap()
    }

    /// The Service's ingress IPs as strings (empty when missing).
    pub async fn ips(&self, name: &str) -> Vec<String> {
        ingress(&self.get(name).await)
            .into_iter()
            .map(|ip| ip.to_string())
            .collect()
    }

    /// Waits until Service `name` has exactly `want` as ingress IPs.
    pub async fn wait_ips(&self, name: &str, want: &[&str], within: Duration) {
        let want: Vec<String> = want.iter().map(|s| (*s).to_owned()).collect();
        eventually(within, &format!("{name} has {want:?}"), async || {
            self.ips(name).await == want
        })
        .await;
    }

    /// `(status, reason, message)` of condition `type_` of Service `name`.
    pub async fn condition(&self, name: &str, type_: &str) -> Option<(String, String, String)> {
        let svc = self.get(name).await;
        svc.status?
            .conditions?
            .into_iter()
            .find(|c| c.type_ == type_)
            .map(|c| (c.status, c.reason, c.message))
    }

    /// Events in `namespace` regarding object `name`.
    pub async fn events(&self, namespace: &str, name: &str) -> Vec<Event> {
        Api::<Event>::namespaced(self.client.clone(), namespace)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
            .collect()
    }

    /// Deletes the test's Services so that later tests' controllers do not see them.
    pub async fn cleanup(&self) {
        let api = Api::<Service>::namespaced(self.client.clone(), &self.ns);
        // Services have no `deletecollection` on older servers.
        for svc in api.list(&ListParams::default()).await.unwrap().items {
            let name = svc.metadata.name.unwrap_or_default();
            let _ = api.delete(&name, &DeleteParams::default()).await;
        }
    }
}

/// Deletes the Services an earlier test of this binary left behind: one that failed before
/// its [`Cluster::cleanup`]. Without this, its Services (pending here: no pool of this
/// test lists their namespace) count in this test's controller, and one failure fails
/// the tests after it. Skips `default`, where the API server keeps its own Service; every
/// test makes its Services in namespaces of its own, after this.
async fn delete_leftovers(client: &Client) {
    let all = Api::<Service>::all(client.clone());
    let leftovers = all
        .list(&ListParams::default())
        .await
        .unwrap_or_else(|e| panic!("listing the Services left by earlier tests: {e}"));
    for svc in leftovers.items {
        let (Some(namespace), Some(name)) = (svc.metadata.namespace, svc.metadata.name) else {
            continue;
        };
        if namespace == "default" {
            continue;
        }
        eprintln!("deleting Service {namespace}/{name}, left by an earlier test");
        let _ = Api::<Service>::namespaced(client.clone(), &namespace)
            .delete(&name, &DeleteParams::default())
            .await;
    }
}

/// A LoadBalancer Service `name` to create (no namespace, no uid: the server sets them)
/// with port 80/TCP: the one fixture builder, [`aliaslb_testenv::fixtures`].
pub fn lb_service(name: &str) -> LbService {
    fixtures::lb_service("", name).meta(|m| m.uid = None)
}

/// Polls `check` every 20 ms until it holds or `within` passes.
pub async fn eventually(within: Duration, what: &str, mut check: impl AsyncFnMut() -> bool) {
    let end = Instant::now() + within;
    while !check().await {
        assert!(
            Instant::now() < end,
            "timed out after {within:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A metric line's value from the encoded metrics.
pub fn metric(metrics: &Metrics, line_prefix: &str) -> Option<String> {
    let text = metrics.encode().unwrap();
    text.lines()
        .find(|l| l.starts_with(line_prefix))
        .map(|l| l[line_prefix.len()..].trim().to_owned())
}

/// What a [`Cluster::slow_agent`] did, on the test's monotonic clock: for each IP, when
/// its node's assignment first stopped listing it while the agent still reported it, and
/// when the agent's report first left it out (taken just before the Lease write that
/// says so: no one can have read that report earlier).
#[derive(Debug, Default)]
pub struct Holdings {
    state: std::sync::Mutex<HoldState>,
}

#[derive(Debug, Default)]
struct HoldState {
    /// When each IP was last listed by the assignment (kept while it is still reported).
    listed: BTreeMap<IpAddr, Instant>,
    /// What the last report said the agent holds.
    reported: std::collections::BTreeSet<IpAddr>,
    unlisted_at: BTreeMap<IpAddr, Instant>,
    released_at: BTreeMap<IpAddr, Instant>,
}

impl Holdings {
    /// When `ip` first left the assignment while the agent still reported holding it.
    pub fn unlisted_at(&self, ip: IpAddr) -> Option<Instant> {
        self.lock().unlisted_at.get(&ip).copied()
    }

    /// When the agent's report first left `ip` out after having listed it.
    pub fn released_at(&self, ip: IpAddr) -> Option<Instant> {
        self.lock().released_at.get(&ip).copied()
    }

    /// Whether the agent's last report lists `ip`.
    pub fn reports(&self, ip: IpAddr) -> bool {
        self.lock().reported.contains(&ip)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HoldState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The IPs to report now, given what the assignment lists.
    fn report(
        &self,
        assigned: std::collections::BTreeSet<IpAddr>,
        keep: Duration,
    ) -> std::collections::BTreeSet<IpAddr> {
        let now = Instant::now();
        let mut s = self.lock();
        for ip in &assigned {
            s.listed.insert(*ip, now);
        }
        s.listed.retain(|_, last| now.duration_since(*last) < keep);
        let held: std::collections::BTreeSet<IpAddr> = s.listed.keys().copied().collect();
        let previous = std::mem::take(&mut s.reported);
        for ip in &previous {
            if !assigned.contains(ip) && held.contains(ip) {
                s.unlisted_at.entry(*ip).or_insert(now);
            }
            if !held.contains(ip) {
                s.released_at.entry(*ip).or_insert(now);
            }
        }
        s.reported = held.clone();
        held
    }
}

/// `node`'s assignment, as its agent reads it from its objects (index and shards): `None`
/// when they are missing or unreadable.
pub async fn read_assignment(api: &Api<ConfigMap>, node: &str) -> Option<NodeAssignments> {
    let params = ListParams::default().labels(&format!(
        "{}={}",
        keys::LABEL_ASSIGNMENT_NODE,
        keys::assignment_node_label(node)
    ));
    let listed = api.list(&params).await.ok()?.items;
    let objects = assignments::observed(&listed);
    assignments::read_node(node, objects.get(node)?).ok()
}

/// The IPs of `node`'s assignment (none when it is missing or unreadable), as an agent
/// reads it.
#[allow(dead_code)]
pub async fn assigned_ips(api: &Api<ConfigMap>, node: &str) -> std::collections::BTreeSet<IpAddr> {
    // What the node holds: a standby line (fast failover) is not held.
    read_assignment(api, node)
        .await
        .map(|a| a.held_ips().collect())
        .unwrap_or_default()
}

impl Cluster {
    /// Like [`Cluster::fake_agent`], but an IP its node's assignment stops listing is still
    /// reported as held for `keep` (a real agent slow to take an alias down: a hung netlink
    /// call, a node under load). Returns what it reported and when.
    pub fn slow_agent(&self, node: &str, keep: Duration) -> (Task, Arc<Holdings>) {
        let assignments = Api::<ConfigMap>::namespaced(self.client.clone(), &self.system);
        let assignment = node.to_owned();
        let holdings = Arc::new(Holdings::default());
        let state = holdings.clone();
        let task = self.agent_writing(node, move || {
            let assignments = assignments.clone();
            let assignment = assignment.clone();
            let state = state.clone();
            async move {
                let assigned = assigned_ips(&assignments, &assignment).await;
                AgentReport {
                    version: REPORT_VERSION,
                    held: state.report(assigned, keep),
                    ..AgentReport::default()
                }
                .to_json()
            }
        });
        (task, holdings)
    }
}

/// What a [`Cluster::lan_agent`] reports, changed by the test as it goes.
#[derive(Debug, Default)]
pub struct LanScript {
    /// Whether it holds the IPs its assignment lists (less those in `conflicts`); off, it
    /// holds nothing (an agent still probing).
    pub hold: bool,
    /// Assigned IPs it reports answered on the LAN by a MAC, on `eth1`.
    pub conflicts: BTreeMap<IpAddr, aliaslb_core::mac::Mac>,
    /// Held IPs it reports claimed on the LAN by a MAC, on `eth1`, and defended (kept).
    pub claims: BTreeMap<IpAddr, aliaslb_core::mac::Mac>,
    /// A host answering every probe: each IP its assignment marks `probe` goes into
    /// `conflicts` as answered by this MAC, before the report is written (so it is never
    /// held first).
    pub answer_probes: Option<aliaslb_core::mac::Mac>,
}

impl Cluster {
    /// A fake agent for `node` with one interface `eth1` of Ethernet address `mac`, whose
    /// report follows `LanScript` (starts holding nothing, reporting no conflict).
    pub fn lan_agent(&self, node: &str, mac: &str) -> (Task, Arc<std::sync::Mutex<LanScript>>) {
        use aliaslb_core::report::{Conflict, InterfaceReport};
        let assignments = Api::<ConfigMap>::namespaced(self.client.clone(), &self.system);
        let assignment = node.to_owned();
        let script: Arc<std::sync::Mutex<LanScript>> = Arc::default();
        let state = script.clone();
        let mac: aliaslb_core::mac::Mac = mac.parse().unwrap();
        let task = self.agent_writing(node, move || {
            let assignments = assignments.clone();
            let assignment = assignment.clone();
            let state = state.clone();
            async move {
                let lines = read_assignment(&assignments, &assignment)
                    .await
                    .unwrap_or_default();
                let mut s = state.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(host) = s.answer_probes {
                    let probed = lines.ips.iter().filter(|(_, line)| line.probe);
                    let answered: Vec<IpAddr> = probed.map(|(ip, _)| *ip).collect();
                    for ip in answered {
                        s.conflicts.insert(ip, host);
                    }
                }
                let assigned: std::collections::BTreeSet<IpAddr> =
                    lines.ips.keys().copied().collect();
                let held = if s.hold {
                    assigned
                        .into_iter()
                        .filter(|ip| !s.conflicts.contains_key(ip))
                        .collect()
                } else {
                    Default::default()
                };
                let conflicts = s
                    .conflicts
                    .iter()
                    .map(|(ip, foreign)| Conflict {
                        while_held: false,
                        yielded: false,
                        ip: *ip,
                        reason: format!("{ip} answered an ARP probe from {foreign}"),
                        mac: Some(*foreign),
                        interface: Some("eth1".to_owned()),
                    })
                    .chain(s.claims.iter().map(|(ip, foreign)| Conflict {
                        while_held: true,
                        yielded: false,
                        ip: *ip,
                        reason: format!(
                            "claimed on eth1 by {foreign} (not a node of this cluster) while \
                             this agent's Lease was fresh: defended"
                        ),
                        mac: Some(*foreign),
                        interface: Some("eth1".to_owned()),
                    }))
                    .collect();
                AgentReport {
                    version: REPORT_VERSION,
                    interfaces: vec![InterfaceReport {
                        addresses: Vec::new(),
                        name: "eth1".to_owned(),
                        subnets: Vec::new(),
                        mac: Some(mac),
                    }],
                    held,
                    conflicts,
                    ..AgentReport::default()
                }
                .to_json()
            }
        });
        (task, script)
    }

    /// The data of `node`'s assignment object, its index (empty when it does not exist).
    pub async fn assignment_data(&self, node: &str) -> BTreeMap<String, String> {
        Api::<ConfigMap>::namespaced(self.client.clone(), &self.system)
            .get_opt(&keys::assignment_configmap(node))
            .await
            .unwrap()
            .and_then(|cm| cm.data)
            .unwrap_or_default()
    }

    /// Waits until Service `name`'s condition `type_` has `reason`; returns its message.
    #[allow(dead_code)]
    pub async fn wait_condition(&self, name: &str, type_: &str, reason: &str) -> String {
        self.wait_condition_where(name, type_, reason, |_| true)
            .await
    }

    /// Waits until Service `name`'s condition `type_` has `reason` and a message `want`
    /// accepts; returns the message. On time-out, says what it saw last.
    #[allow(dead_code)]
    pub async fn wait_condition_where(
        &self,
        name: &str,
        type_: &str,
        reason: &str,
        want: impl Fn(&str) -> bool,
    ) -> String {
        let within = Duration::from_secs(10);
        let end = Instant::now() + within;
        loop {
            let seen = self.condition(name, type_).await;
            if let Some((_, r, m)) = &seen
                && r == reason
                && want(m)
            {
                return m.clone();
            }
            assert!(
                Instant::now() < end,
                "timed out after {within:?} waiting for {name} {type_} {reason} with the expected message; last seen: {seen:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The node among `nodes` whose assignment object lists `ip`, if one does (now).
    #[allow(dead_code)]
    pub async fn holder_of(&self, nodes: &[&str], ip: &str) -> Option<String> {
        for node in nodes {
            if self.assignment_line(node, ip).await.is_some() {
                return Some((*node).to_owned());
            }
        }
        None
    }

    /// The line of `node`'s assignment for `ip`, if it lists it.
    pub async fn assignment_line(&self, node: &str, ip: &str) -> Option<String> {
        let api = Api::<ConfigMap>::namespaced(self.client.clone(), &self.system);
        let ip: IpAddr = ip.parse().ok()?;
        let mut a = read_assignment(&api, node).await?;
        a.ips.retain(|i, _| *i == ip);
        let line = a.render();
        (!line.is_empty()).then(|| line.trim_end().to_owned())
    }
}

impl Cluster {
    /// The cluster of a test whose namespace's pool is `pool` (no Node yet).
    pub async fn with_pool(hint: &str, pool: &str) -> Cluster {
        let c = Cluster::new(hint).await;
        c.set_pool(&[(c.ns.as_str(), pool)]).await;
        c
    }

    /// The cluster of a test with one Node `a` and its fake agent, the pool of the test's
    /// namespace being `pool`; returns it, the node's name and the agent (dropping it stops
    /// renewing). No controller runs yet.
    pub async fn with_one_agent(hint: &str, pool: &str) -> (Cluster, String, Task) {
        let c = Cluster::with_pool(hint, pool).await;
        let node = c.node("a").await;
        let agent = c.fake_agent(&node);
        (c, node, agent)
    }

    /// Whether Service `name`'s condition Announced is True (now).
    pub async fn is_announced(&self, name: &str) -> bool {
        let announced = self.condition(name, keys::CONDITION_ANNOUNCED).await;
        announced.is_some_and(|(status, _, _)| status == "True")
    }

    /// Waits until Service `name` is announced (its condition Announced True); `what` says
    /// which wait timed out.
    pub async fn wait_announced(&self, name: &str, what: &str) {
        eventually(SETTLE, what, async || self.is_announced(name).await).await;
    }

    /// Whether Service `name`'s condition `type_` is False with `reason` (now).
    pub async fn is_false_with(&self, name: &str, type_: &str, reason: &str) -> bool {
        let seen = self.condition(name, type_).await;
        seen.is_some_and(|(status, r, _)| status == "False" && r == reason)
    }

    /// Waits until Service `name`'s condition `type_` is False with `reason`; `what` says
    /// which wait timed out.
    pub async fn wait_false_with(&self, name: &str, type_: &str, reason: &str, what: &str) {
        eventually(SETTLE, what, async || {
            self.is_false_with(name, type_, reason).await
        })
        .await;
    }

    /// The Events with `reason` regarding object `name` in `namespace`.
    pub async fn events_with_reason(
        &self,
        namespace: &str,
        name: &str,
        reason: &str,
    ) -> Vec<Event> {
        let mut events = self.events(namespace, name).await;
        events.retain(|e| e.reason.as_deref() == Some(reason));
        events
    }

    /// Waits until an Event with `reason` regards object `name` in `namespace`.
    pub async fn wait_event(&self, namespace: &str, name: &str, reason: &str) {
        let what = format!("a {reason} Event on {namespace}/{name}");
        eventually(SETTLE, &what, async || {
            !self
                .events_with_reason(namespace, name, reason)
                .await
                .is_empty()
        })
        .await;
    }
}
