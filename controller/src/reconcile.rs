//! The leader's reconcile loop: observe (caches) -> one pure [`Planner::plan`] pass ->
//! apply the difference (the node assignments agents act on, Service annotations and
//! status, Events) -> metrics. Does I/O.
//!
//! - The first pass of a term imports the current nodes from our own assignment objects
//!   ([`crate::assign`]), never from the Services' `aliaslb.io/node` annotation, which a
//!   tenant can write (not even when no assignment object exists yet, as after an upgrade
//!   from a version without them: then the nodes are elected afresh, once).
//!
//! - [`run`] is the whole controller minus leader election and HTTP: it starts the caches
//!   (in every replica), marks the process ready once they synced, and runs a
//!   [`Reconciler`] for each leadership term (a fresh [`Planner`] per term: it imports the
//!   observed assignments on its first pass, so a restart or failover keeps every IP).
//! - Any cache change wakes the loop; it waits [`DEBOUNCE`] (bounded: not reset by later
//!   changes), so everything that arrived meanwhile goes into one pass. It also wakes
//!   exactly when the next agent Lease goes stale and when a write retry is due.
//! - Writes happen only where desired differs from observed, at most [`MAX_IN_FLIGHT`] at
//!   once, each behind the leader fence and a timeout. The caches lag behind our own
//!   writes: a write is not repeated while the cached object is a version we already know
//!   (the one we wrote over, or one our writes returned).
//! - Transient write failures back off per Service ([`Backoff`]). A write the API server
//!   refuses as invalid (422) would be refused again: it is logged, counted
//!   (`reconcile_errors{category="invalid"}`) and not retried until what it would write,
//!   or the Service, changes (see [`attempt_key`]).
//! - The planner never allocates an address a Node lists in `status.addresses`
//!   ([`views::node_addresses`]); when the pool entries covering one change, one Warning
//!   Event `NodeAddress` on the pool ConfigMap names key, line and node (see
//!   `Reconciler::node_address_notice`).
//! - Nor one a fresh agent reports answered on the LAN by a foreign MAC (the planner's
//!   LAN conflict fence, [`aliaslb_core::plan::lan_conflicts`]); the number of such
//!   addresses is the gauge `aliaslb_controller_address_conflicts`. The assignment objects
//!   mark first claims `probe` and list every agent's MACs under `node-macs`
//!   ([`crate::assign`]).
//! - Agent reports are read within bounds ([`AgentReport::from_json`]); a report that
//!   cannot be read makes its agent count as not ready, with one warning when it starts
//!   (see `Reconciler::agents`).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use aliaslb_core::assignment::NodeAssignments;
use aliaslb_core::keys;
use aliaslb_core::plan::{
    Inputs, NodeAddress, NodeAddressClash, PlanOutput, Planner, ServiceKey, ServicePlan,
    node_address_clashes, reason,
};
use aliaslb_core::pool::{ConfigError, PoolConfig};
use aliaslb_core::range::Family;
use aliaslb_core::report::{AgentReport, ReportError};
use aliaslb_core::text;
use futures::{Stream, StreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, ObjectReference, Service};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Resource};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::apply::{self, ApplyError, Writer};
use crate::assign;
use crate::context::Context;
use crate::http::Readiness;
use crate::pool_state::{ConfigState, Notice as ConfigNotice};
use crate::record::{self, ServiceRecord, digest};
use crate::views::{self, Freshness, Observer, Sight};
use crate::watch::{Caches, WatchError};

/// How long the loop waits after the first change before a pass, to coalesce bursts.
pub const DEBOUNCE: Duration = Duration::from_millis(20);
/// Writes in flight at once; the Event worker has its own bound of the same size.
pub const MAX_IN_FLIGHT: usize = 16;
/// First retry delay after a transient write failure; doubles up to [`MAX_BACKOFF`].
const BASE_BACKOFF: Duration = Duration::from_millis(200);
/// Longest retry delay.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Longest Event note the API accepts (events.k8s.io/v1 `note`: 1 kB).
const MAX_NOTE: usize = 1000;
/// Plan Events waiting for the worker at most; more are dropped (and counted). The first
/// pass over N new Services queues 2N Events (IP allocated, node assigned): this holds
/// that for 32,768 Services. A queued Event is about 200 bytes.
const EVENT_QUEUE: usize = 65_536;
/// Reason of the Warning Event on an agent Lease whose report was rejected.
pub const INVALID_AGENT_REPORT: &str = "InvalidAgentReport";
/// Warning Event on the leader Lease: no agent is seen renewing, so the controller keeps
/// every node assignment and elects no node until it sees them again
/// ([`views`] module docs).
pub const AGENTS_UNOBSERVABLE: &str = aliaslb_core::plan::reason::AGENTS_UNOBSERVABLE;
/// Versions remembered per Service (see the module docs).
const KNOWN_VERSIONS: usize = 8;

/// Why the controller could not start.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// The API server's version could not be read.
    #[error("reading the API server version")]
    Version(#[source] kube::Error),
    /// A cache did not sync.
    #[error("caches did not sync")]
    Watch(#[from] WatchError),
}

/// Runs the controller: caches, readiness, and the reconcile loop while leading (see the
/// module docs). Returns only on a start-up error; abort the task to stop it.
pub async fn run(ctx: Arc<Context>, readiness: Readiness) -> Result<(), ReconcileError> {
    let version = ctx
        .client
        .apiserver_version()
        .await
        .map_err(ReconcileError::Version)?;
    let ip_mode = apply::version_has_ip_mode(&version.major, &version.minor);
    tracing::info!(
        server = %version.git_version,
        ip_mode,
        "API server version"
    );
    let caches = Caches::start(&ctx.client, &ctx.config).await;
    caches.synced().await?;
    readiness.set_ready();
    supervise(ctx, caches, ip_mode).await;
    Ok(())
}

/// Follows leadership edges: a [`Reconciler`] while leading, none otherwise. The
/// reconciler's task is aborted with this future: aborting [`run`] stops the loop.
async fn supervise(ctx: Arc<Context>, caches: Caches, ip_mode: bool) {
    let mut edges = ctx.leader.watch();
    let mut running: Option<AbortOnDrop> = None;
    loop {
        let leading = *edges.borrow_and_update();
        ctx.metrics.set_leader(leading);
        match (leading, running.take()) {
            (true, None) => {
                let reconciler = Reconciler::new(ctx.clone(), caches.clone(), ip_mode);
                running = Some(AbortOnDrop(tokio::spawn(reconciler.run())));
            }
            (true, Some(task)) => running = Some(task),
            (false, Some(task)) => {
                tracing::info!("not leading: reconcile loop stopped");
                drop(task);
                // Only the leader judges the agents.
                ctx.metrics.set_agents_unobservable(false);
            }
            (false, None) => {}
        }
        if edges.changed().await.is_err() {
            // Leadership can no longer change (a fixed one, or election ended after its
            // last edge): keep the current state; every write still checks the fence.
            if let Some(mut task) = running.take() {
                let _ = (&mut task.0).await;
            }
            return;
        }
    }
}

/// Per-Service retry state after transient failures.
#[derive(Debug, Clone, Copy)]
struct Backoff {
    failures: u32,
    next: Instant,
}

impl Backoff {
    fn after(failures: u32, now: Instant) -> Backoff {
        let factor = 2u32.saturating_pow(failures.saturating_sub(1).min(16));
        Backoff {
            failures,
            next: now + BASE_BACKOFF.saturating_mul(factor).min(MAX_BACKOFF),
        }
    }
}

// A [`Memo`] keeps [`digest`]s of writes and resourceVersions, so that it stays a few
// dozen bytes per Service whatever the write said. A collision (odds 2^-64 per
// comparison) would only hold a write back until the cache shows a version the memo does
// not know.

/// What the status write says, without the node (which is an annotation).
fn status_key(plan: &ServicePlan) -> u64 {
    digest(&(&plan.ips, &plan.allocated, &plan.announced))
}

/// What the annotation write says.
fn annotations_key(plan: &ServicePlan) -> u64 {
    digest(&(&plan.node, &plan.nodes, &plan.interface))
}

/// What the writes for `plan` on `svc` would say, and the version of `svc` they would
/// apply to: a write the server refused as invalid (422) is tried again only once this
/// changes. The server validates the object the apply makes, so a change by someone else
/// (a user shortening their own annotations) can make the same write valid; a refused
/// write changes nothing, so it cannot trigger itself. A cleanup (`plan` `None`) writes
/// nothing of the plan.
fn attempt_key(plan: Option<&ServicePlan>, svc: &ServiceRecord) -> u64 {
    let writes = plan.map(|p| (annotations_key(p), status_key(p)));
    digest(&(writes, &svc.resource_version))
}

/// What we last wrote on a Service and the versions our writes produced, as digests.
#[derive(Debug, Default)]
struct Memo {
    annotations: Option<u64>,
    status: Option<u64>,
    versions: VecDeque<u64>,
}

impl Memo {
    fn knows(&self, svc: &ServiceRecord) -> bool {
        svc.resource_version
            .as_ref()
            .is_some_and(|rv| self.versions.contains(&digest(rv)))
    }

    fn remember(&mut self, version: Option<&str>) {
        if let Some(v) = version.map(digest)
            && !self.versions.contains(&v)
        {
            if self.versions.len() == KNOWN_VERSIONS {
                self.versions.pop_front();
            }
            self.versions.push_back(v);
        }
    }
}

/// One unit of write work of a pass (borrowing the pass's plans).
enum Job<'a> {
    /// Bring a Service of ours to its plan.
    Sync {
        svc: Arc<ServiceRecord>,
        plan: &'a ServicePlan,
        annotations: bool,
        status: bool,
    },
    /// Remove what we wrote on a Service that is no longer ours.
    Clear { svc: Arc<ServiceRecord> },
}

/// The outcome of one [`Job`]: small, a pass collects one per write.
struct Done {
    key: ServiceKey,
    /// [`attempt_key`] of the job.
    attempt: u64,
    /// For a sync: what the annotation and status writes said ([`annotations_key`],
    /// [`status_key`]), `None` for a write not made. `None` for a cleanup.
    sync: Option<(Option<u64>, Option<u64>)>,
    before: Option<Box<str>>,
    /// uid of a cleaned-up Service.
    uid: Option<Arc<str>>,
    /// The resourceVersions our writes returned (not the objects: a pass of 10,000 writes
    /// would otherwise hold 10,000 Service copies until it ends). The error is boxed: it
    /// is rare and several times the size of the rest.
    result: Result<Vec<Box<str>>, Box<ApplyError>>,
}

/// What an Event is about.
enum Regarding {
    /// A Service (its uid when known); the reference is built when the Event is sent, not
    /// while it waits.
    Service {
        key: ServiceKey,
        uid: Option<Arc<str>>,
    },
    /// Another object (an agent's Lease).
    Object(Box<ObjectReference>),
}

/// One Event to publish.
struct Notice {
    regarding: Regarding,
    warning: bool,
    reason: &'static str,
    note: String,
}

impl Notice {
    fn regarding(&self) -> ObjectReference {
        match &self.regarding {
            Regarding::Service { key, uid } => record::object_ref(key, uid.as_deref()),
            Regarding::Object(reference) => (**reference).clone(),
        }
    }
}

/// Publishes Events behind the leader fence.
///
/// Each Event goes through a fresh [`Recorder`]: kube-runtime 5.0's Recorder folds Events
/// that differ only in their note into one series that keeps the FIRST note (its cache key
/// has no note), so a second `NodeMoved` would show the first move's reason for six
/// minutes. The planner already emits transitions only, so no client-side aggregation is
/// needed.
#[derive(Clone)]
struct Events {
    ctx: Arc<Context>,
}

impl Events {
    /// Publishes one Event (behind the fence), `related` to a second object if given;
    /// failures are logged and counted.
    async fn publish(
        &self,
        regarding: &ObjectReference,
        related: Option<ObjectReference>,
        warning: bool,
        reason: &str,
        note: String,
    ) {
        if !self.ctx.leader.is_leader() {
            return;
        }
        let event = Event {
            type_: if warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.to_owned(),
            note: Some(text::bounded(note, MAX_NOTE)),
            action: "Reconcile".to_owned(),
            secondary: related,
        };
        let recorder = Recorder::new(self.ctx.client.clone(), self.ctx.reporter.clone());
        let publish = recorder.publish(&event, regarding);
        match tokio::time::timeout(apply::WRITE_TIMEOUT, publish).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                self.ctx.metrics.inc_reconcile_error("event");
                tracing::warn!(reason, object = ?regarding.name, error = %error, "publishing an Event failed");
            }
            Err(_) => {
                self.ctx.metrics.inc_reconcile_error("event");
                tracing::warn!(reason, object = ?regarding.name, "publishing an Event timed out");
            }
        }
    }

    /// Publishes queued Events, [`MAX_IN_FLIGHT`] at once, so that a burst of Events
    /// never holds up the next pass.
    async fn worker(self, queue: mpsc::Receiver<Notice>) {
        receiver_stream(queue)
            .for_each_concurrent(MAX_IN_FLIGHT, |n| {
                let events = self.clone();
                async move {
                    let regarding = n.regarding();
                    events
                        .publish(&regarding, None, n.warning, n.reason, n.note)
                        .await;
                }
            })
            .await;
    }
}

/// A stream over an mpsc receiver.
fn receiver_stream<T>(rx: mpsc::Receiver<T>) -> impl futures::Stream<Item = T> {
    futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    })
}

/// Aborts a task when dropped (the Event worker ends with its term's reconciler, the
/// reconciler with [`supervise`]).
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Node name -> (freshness, report) of its agent.
type AgentViews = BTreeMap<String, (Freshness, AgentReport)>;

/// The loop of one leadership term.
struct Reconciler {
    ctx: Arc<Context>,
    caches: Caches,
    planner: Planner,
    writer: Writer,
    events: Events,
    /// Plan Events for the worker.
    queue: mpsc::Sender<Notice>,
    _worker: AbortOnDrop,
    config: ConfigState,
    /// The pool ConfigMap as last seen, for Events about its deletion.
    configmap: Option<ObjectReference>,
    memos: HashMap<ServiceKey, Memo>,
    backoff: HashMap<ServiceKey, Backoff>,
    /// The uids of the last pass's Services, for Events on deleted ones (the uid is
    /// shared with the record: no copy). The reference is built per Event, not per
    /// Service and pass (that was 7 % of the CPU at 10,000 Services).
    refs: HashMap<ServiceKey, Arc<str>>,
    /// uids of foreign Services already cleaned up.
    cleared: HashSet<Arc<str>>,
    /// Services whose last write the API server refused as invalid (422), with the
    /// [`attempt_key`] of that write: not retried while it stays the same.
    refused: HashMap<ServiceKey, u64>,
    /// Pool series currently exported.
    pools: BTreeSet<(String, Family)>,
    /// Agent Lease names whose report was last unreadable or out of bounds: warned about
    /// once, on the edge.
    bad_reports: HashSet<String>,
    /// Whether the planner has imported the observed assignments (its first pass).
    imported: bool,
    /// The node assignments written and not yet seen in the cache: digest of the text and
    /// the versions before and after our write.
    assign_memo: HashMap<String, (u64, [Option<String>; 2])>,
    /// Assignment writes the API server refused (digest of the text, version of the object):
    /// not made again until one of them changes.
    assign_refused: HashMap<String, (u64, Option<String>)>,
    /// When failed assignment writes are retried, per node.
    assign_retry: HashMap<String, Instant>,
    /// The pool entries covering an address a Node has, as last warned about.
    node_clashes: Vec<NodeAddressClash>,
    /// The term's sight of the agents: blind or not, and since when it sees.
    observer: Observer,
    /// When the agents' freshness changes next without an event.
    agents_change: Option<Instant>,
}

impl Reconciler {
    fn new(ctx: Arc<Context>, caches: Caches, ip_mode: bool) -> Self {
        let events = Events { ctx: ctx.clone() };
        ctx.metrics.set_agents_unobservable(false);
        let (queue, rx) = mpsc::channel(EVENT_QUEUE);
        let worker = AbortOnDrop(tokio::spawn(events.clone().worker(rx)));
        Reconciler {
            ctx,
            caches,
            planner: Planner::new(),
            writer: Writer::new(ip_mode),
            events,
            queue,
            _worker: worker,
            config: ConfigState::default(),
            configmap: None,
            memos: HashMap::new(),
            backoff: HashMap::new(),
            refs: HashMap::new(),
            cleared: HashSet::new(),
            refused: HashMap::new(),
            pools: BTreeSet::new(),
            bad_reports: HashSet::new(),
            imported: false,
            assign_memo: HashMap::new(),
            assign_retry: HashMap::new(),
            assign_refused: HashMap::new(),
            node_clashes: Vec::new(),
            observer: Observer::new(Instant::now()),
            agents_change: None,
        }
    }

    async fn run(mut self) {
        tracing::info!(
            class = %self.ctx.config.load_balancer_class,
            "leading: reconcile loop started"
        );
        let mut changes = self.caches.changes.clone();
        loop {
            changes.borrow_and_update();
            let wake = self.pass().await;
            let sleep = async {
                match wake {
                    Some(at) => {
                        let at = at + Duration::from_millis(1);
                        tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await;
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                changed = changes.changed() => if changed.is_err() {
                    tracing::error!("caches stopped: reconcile loop ends");
                    return;
                },
                () = sleep => {}
            }
            tokio::time::sleep(DEBOUNCE).await;
        }
    }

    /// One pass; returns when the loop must wake up at the latest.
    #[tracing::instrument(level = "debug", skip_all)]
    async fn pass(&mut self) -> Option<Instant> {
        let started = Instant::now();
        let config = self.pool_config().await?;
        let services = self.caches.services.snapshot();
        let mut views: Vec<Arc<aliaslb_core::plan::ServiceView>> =
            Vec::with_capacity(services.len());
        let mut by_key: HashMap<ServiceKey, Arc<ServiceRecord>> =
            HashMap::with_capacity(services.len());
        let mut strangers = Vec::new();
        for svc in services {
            match &svc.view {
                Some(view) => {
                    views.push(view.clone());
                    by_key.insert(svc.key.clone(), svc);
                }
                None => strangers.push(svc),
            }
        }

        let now = Instant::now();
        let (agents, reports, sight) = self.agents(now);
        let node_objects = self.caches.nodes.state();
        let nodes = views::node_states(&node_objects, &agents);
        let node_addresses = views::node_addresses(node_objects.iter().map(|n| &**n));
        drop(node_objects);
        self.node_address_notice(&config, &node_addresses);
        let local_services: HashSet<&ServiceKey> = views
            .iter()
            .filter(|v| v.local_traffic)
            .map(|v| &v.key)
            .collect();
        let local = if local_services.is_empty() {
            BTreeMap::new()
        } else {
            let objects = self.caches.endpoints.snapshot();
            views::local_endpoints(objects.iter().map(|o| &**o), |k| local_services.contains(k))
        };
        let observed_assignments = assign::observed(
            self.caches
                .assignments
                .state()
                .iter()
                .map(|cm| &**cm)
                .collect::<Vec<_>>(),
        );
        // Our IPs on Services that stopped being ours: not free while the API shows them.
        let lingering: BTreeSet<std::net::IpAddr> =
            strangers.iter().flat_map(|s| s.ingress_ips()).collect();
        if !self.imported {
            import_trusted_nodes(&mut views, &observed_assignments);
            self.imported = true;
        }
        let output = self.planner.plan(&Inputs {
            config: &config,
            services: &views,
            nodes: &nodes,
            agents: &reports,
            lingering: &lingering,
            node_addresses: &node_addresses,
            local_endpoints: &local,
            respect_cordon: self.ctx.config.respect_cordon,
            agents_unobservable: sight == Sight::Blind,
            now,
        });
        self.record_metrics(&output);

        // The agents act on the assignments: they go first.
        let views_by_key: HashMap<&ServiceKey, &aliaslb_core::plan::ServiceView> =
            views.iter().map(|v| (&v.key, &**v)).collect();
        let macs = assign::node_macs(&reports);
        let desired_assignments = assign::desired(&output, &views_by_key, &macs);
        drop(views_by_key);
        let macs = NodeAssignments {
            node_macs: macs,
            ..NodeAssignments::default()
        }
        .render_node_macs();
        self.write_assignments(desired_assignments, observed_assignments, &macs, now)
            .await;

        let jobs = self.jobs(&output, &by_key, strangers, now);
        // From here on the pass holds a Service's record only while its write is pending:
        // each write brings a new version into the cache, and a pass over 10,000 Services
        // would otherwise keep every old version until it ends.
        let services = views.len();
        drop(views);
        let uids: HashMap<ServiceKey, Arc<str>> = by_key
            .into_iter()
            .map(|(key, svc)| (key, svc.uid.clone()))
            .collect();
        let done: Vec<Done> = self.run_jobs(jobs).collect().await;
        let now = Instant::now();
        let writes = done.len();
        for outcome in done {
            self.settle(outcome, now);
        }
        self.memos.retain(|k, _| uids.contains_key(k));
        let old_refs = std::mem::replace(&mut self.refs, uids);
        self.publish(&output, &old_refs);
        tracing::debug!(
            services,
            writes,
            events = output.events.len(),
            took = ?started.elapsed(),
            "pass done"
        );
        self.ctx.metrics.observe_reconcile(started.elapsed());

        let lease_expiry = self.agents_change;
        let retry = self.backoff.values().map(|b| b.next).min();
        lease_expiry
            .into_iter()
            .chain(retry)
            .chain(self.assign_retry.values().copied())
            .min()
    }

    /// Writes every node assignment whose text differs from what the cache shows (and
    /// that we did not just write: the cache lags behind our writes). A node with nothing
    /// assigned gets an empty list and the node MACs `macs` (rendered).
    async fn write_assignments(
        &mut self,
        desired: BTreeMap<String, NodeAssignments>,
        observed: BTreeMap<String, assign::Texts>,
        macs: &str,
        now: Instant,
    ) {
        self.assign_retry.retain(|_, at| *at > now);
        let versions: HashMap<String, Option<String>> = self
            .caches
            .assignments
            .state()
            .iter()
            .filter_map(|cm| {
                let node = assign::node_of(cm.metadata.name.as_deref()?)?;
                Some((node.to_owned(), cm.metadata.resource_version.clone()))
            })
            .collect();
        let nodes: BTreeSet<&String> = desired.keys().chain(observed.keys()).collect();
        let mut writes = Vec::new();
        for node in nodes {
            let text = desired.get(node).map_or_else(
                || assign::Texts {
                    ips: String::new(),
                    node_macs: macs.to_owned(),
                },
                assign::Texts::of,
            );
            if observed.get(node) == Some(&text) {
                self.assign_memo.remove(node);
                self.assign_refused.remove(node);
                continue;
            }
            if self.assign_retry.contains_key(node) {
                continue;
            }
            let refused = (digest(&text), versions.get(node).cloned().flatten());
            if self.assign_refused.get(node) == Some(&refused) {
                continue;
            }
            let version = versions.get(node).cloned().flatten();
            // The same text was just written (or refused) over this version: the cache has
            // not caught up yet. A missing object (no version) is always written.
            if version.is_some()
                && let Some((written, seen)) = self.assign_memo.get(node)
                && *written == digest(&text)
                && seen.contains(&version)
            {
                continue;
            }
            writes.push((node.clone(), text, version));
        }
        if writes.is_empty() {
            return;
        }
        let api = Api::<ConfigMap>::namespaced(self.ctx.client.clone(), &self.ctx.config.namespace);
        let namespace = &self.ctx.config.namespace;
        let leader = &self.ctx.leader;
        let done: Vec<_> = futures::stream::iter(writes)
            .map(|(node, text, before)| {
                let api = &api;
                async move {
                    let result =
                        assign::apply(api, namespace, &node, &text, || leader.write_deadline())
                            .await;
                    (node, text, before, result)
                }
            })
            .buffer_unordered(MAX_IN_FLIGHT)
            .collect()
            .await;
        for (node, text, before, result) in done {
            match result {
                Ok(written) => {
                    self.assign_refused.remove(&node);
                    tracing::info!(
                        node,
                        ips = text.ips.lines().count(),
                        "node assignment written"
                    );
                    self.assign_memo.insert(
                        node,
                        (digest(&text), [before, written.metadata.resource_version]),
                    );
                }
                Err(error) => {
                    self.ctx.metrics.inc_reconcile_error(error.category());
                    if error.is_transient() {
                        tracing::warn!(node, error = %error, "node assignment write failed; retrying");
                        self.assign_retry.insert(node, now + BASE_BACKOFF);
                    } else if error.category() != "not_leader" {
                        // Refused (e.g. 422: over the object size limit; 403: RBAC): not made
                        // again until the text or the object changes.
                        tracing::error!(node, error = %error, "node assignment write refused: this node's agent does not see the change");
                        self.assign_refused.insert(node, (digest(&text), before));
                    }
                }
            }
        }
    }

    /// Agent readiness and reports by node.
    ///
    /// A report that cannot be read (not JSON, or outside the bounds of
    /// [`AgentReport::from_json`]) counts for nothing: the agent is taken as not ready, so
    /// its node is not eligible, and as holding nothing. That is warned about once when it
    /// starts (log, Warning Event `InvalidAgentReport` on the Lease, and
    /// `aliaslb_agent_reports_rejected_total`), not on every pass.
    ///
    /// Freshness is the [`Observer`]'s: when no agent is seen renewing at all, the
    /// controller is blind rather than every node dead ([`views`] module docs); that is
    /// said once on each edge (log, Warning Event [`AGENTS_UNOBSERVABLE`] on the leader
    /// Lease, gauge `aliaslb_agents_unobservable`).
    fn agents(&mut self, now: Instant) -> (AgentViews, BTreeMap<String, AgentReport>, Sight) {
        let judgement = {
            let clock = self.caches.agents.lock().unwrap_or_else(|e| e.into_inner());
            self.observer.judge(&clock, now)
        };
        self.agents_change = judgement.next_change;
        match judgement.edge {
            Some(Sight::Blind) => self.blind_notice(&judgement.agents),
            Some(Sight::Normal) => {
                tracing::info!(
                    "agent Leases seen renewing again: election resumes; every agent gets a lease duration to be seen before its node counts as lost"
                );
                self.ctx.metrics.set_agents_unobservable(false);
            }
            None => {}
        }
        let mut agents = BTreeMap::new();
        let mut seen = HashSet::new();
        let leases = self.caches.leases.state();
        for lease in &leases {
            let Some(name) = lease.metadata.name.as_deref() else {
                continue;
            };
            let Some(node) = views::agent_node(name) else {
                continue;
            };
            seen.insert(name);
            let freshness = judgement
                .agents
                .get(name)
                .copied()
                .unwrap_or(Freshness::Lost);
            let (agent, error) = views::agent_view(lease, freshness);
            match error {
                None => {
                    if self.bad_reports.remove(name) {
                        tracing::info!(lease = name, "agent report readable again");
                    }
                }
                Some(error) => {
                    if self.bad_reports.insert(name.to_owned()) {
                        self.reject_report(lease, node, &error);
                    }
                }
            }
            agents.insert(node.to_owned(), agent);
        }
        // Forget deleted Leases: a new one with a bad report is warned about again.
        if !self.bad_reports.is_empty() {
            self.bad_reports.retain(|n| seen.contains(n.as_str()));
        }
        let reports = agents
            .iter()
            .map(|(node, (_, report))| (node.clone(), report.clone()))
            .collect();
        (agents, reports, judgement.sight)
    }

    /// The warning for the controller going blind: log, gauge, one Warning Event on the
    /// leader Lease (as for a deleted ConfigMap: see [`Reconciler::leader_lease_ref`]).
    fn blind_notice(&self, agents: &BTreeMap<String, Freshness>) {
        let held = agents
            .values()
            .filter(|f| **f == Freshness::Unconfirmed)
            .count();
        let lease = self.ctx.config.agent_lease_duration;
        tracing::warn!(
            agents = held,
            "no agent Lease seen renewed within its lease duration: the controller cannot see the agents (kube-apiserver or watch interrupted?) rather than every node being lost; keeping every node assignment and electing no node until it sees them again"
        );
        self.ctx.metrics.set_agents_unobservable(true);
        self.enqueue(Notice {
            regarding: Regarding::Object(Box::new(self.leader_lease_ref())),
            warning: true,
            reason: AGENTS_UNOBSERVABLE,
            note: format!(
                "none of the {held} agent Leases was seen renewed within its lease duration \
                 (default {lease:?}): the controller takes it that it cannot see the agents, \
                 not that every node is lost. Every node keeps what it carries and no node is \
                 elected until a renewal is seen again. Check the kube-apiserver and the \
                 controller's connection to it."
            ),
        });
    }

    /// The warning for a report that just became unusable: log, metric, Event on the Lease.
    fn reject_report(&self, lease: &Lease, node: &str, error: &ReportError) {
        let category = error.category();
        // The error may quote the report (serde quotes what it did not expect).
        let error = text::bounded(error.to_string(), MAX_NOTE);
        tracing::warn!(
            lease = lease.metadata.name.as_deref().unwrap_or_default(),
            node,
            reason = category,
            error = %error,
            "agent report rejected: the node is not eligible and holds nothing until its agent writes a valid one"
        );
        self.ctx.metrics.inc_agent_report_rejected(category);
        self.enqueue(Notice {
            regarding: Regarding::Object(Box::new(lease.object_ref(&()))),
            warning: true,
            reason: INVALID_AGENT_REPORT,
            note: format!(
                "report of the agent on {node} ignored: the node is not eligible and holds \
                 nothing until it writes a valid one: {error}"
            ),
        });
    }

    /// The config in force for this pass ([`ConfigState`]); `None` while no valid config
    /// was ever seen (planning on nothing would clear every assignment).
    async fn pool_config(&mut self) -> Option<PoolConfig> {
        let cm = self.caches.configmap.state().into_iter().next();
        if let Some(cm) = &cm {
            self.configmap = Some(cm.object_ref(&()));
        }
        let empty = BTreeMap::new();
        let data = cm.as_ref().map(|cm| cm.data.as_ref().unwrap_or(&empty));
        // Read at the first look only: is anything assigned already (see pool_state)?
        let assigned = self.config.first_look()
            && (!self.caches.assignments.is_empty()
                || self
                    .caches
                    .services
                    .snapshot()
                    .iter()
                    .any(|s| s.view.is_some() && s.ingress_ips().next().is_some()));
        if let Some(notice) = self.config.observe(data, assigned) {
            self.ctx
                .metrics
                .set_config(self.config.valid(), self.config.stale());
            self.config_notice(cm.as_deref(), notice).await;
        }
        self.config.in_force().cloned()
    }

    /// Logs a change of the pool config and publishes its Event, if any.
    async fn config_notice(&self, cm: Option<&ConfigMap>, notice: ConfigNotice) {
        let namespace = &self.ctx.config.namespace;
        let name = &self.ctx.config.pool_configmap;
        match notice {
            ConfigNotice::MissingAtStart => {
                tracing::warn!(
                    %namespace,
                    %name,
                    "pool ConfigMap missing: no pools, every Service stays pending"
                );
            }
            ConfigNotice::MissingWithAssignments => {
                tracing::warn!(
                    %namespace,
                    %name,
                    "pool ConfigMap missing at start while IPs are assigned: it was deleted; nothing is planned and no IP is released until it exists again"
                );
                let note = format!(
                    "pool ConfigMap {namespace}/{name} is missing while IPs are assigned: \
                     nothing is planned and no IP is released until it exists again. A \
                     deleted ConfigMap is not an instruction: re-create it."
                );
                self.events
                    .publish(
                        &self.leader_lease_ref(),
                        None,
                        true,
                        "ConfigMapMissing",
                        note,
                    )
                    .await;
            }
            ConfigNotice::Deleted { pools } => {
                let keeping = match pools {
                    Some(n) => format!("keeping the last good pool config ({n} pools)"),
                    None => "no valid config was seen, no assignment is made".to_owned(),
                };
                tracing::warn!(
                    %namespace,
                    %name,
                    pools,
                    "pool ConfigMap deleted: {keeping}; no IP is released until it exists again"
                );
                let note = format!(
                    "pool ConfigMap {namespace}/{name} was deleted: {keeping}, no IP is \
                     released. A deleted ConfigMap is not an instruction: re-create it to \
                     change the config; to release a namespace's IPs, remove its key."
                );
                self.events
                    .publish(
                        &self.leader_lease_ref(),
                        self.configmap.clone(),
                        true,
                        "ConfigMapDeleted",
                        note,
                    )
                    .await;
            }
            ConfigNotice::Loaded { pools, announce } => {
                tracing::info!(pools, "pool config loaded");
                if announce {
                    let note = format!("pool config loaded: {pools} pools");
                    self.config_event(cm, false, "ConfigLoaded", note).await;
                }
            }
            ConfigNotice::Invalid { errors, stale } => {
                tracing::warn!(
                    errors = errors.len(),
                    first = %errors[0],
                    keeping_last_good = stale,
                    "pool ConfigMap invalid: no assignment changes until it is fixed"
                );
                let note = invalid_note(&errors, stale);
                self.config_event(cm, true, "InvalidConfig", note).await;
            }
        }
    }

    /// What the Warning about a deleted pool ConfigMap is put on: the controller's leader
    /// Lease (`aliaslb_core::keys::CONTROLLER_LEASE`, in the controller namespace), with
    /// the deleted ConfigMap as the Event's `related` object. Why this object:
    /// - the ConfigMap is gone: `kubectl describe` no longer shows it, and a re-created one
    ///   is a new object (new uid) that would not show the Event either;
    /// - the Lease exists whenever the Event is written: only the leader publishes, and the
    ///   leader holds it (with fixed leadership, as in tests, there is none: the Event then
    ///   names it without a uid and is still listed);
    /// - it sits in the controller namespace next to the ConfigMap, so `kubectl -n
    ///   aliaslb-system get events` shows it with the ConfigMap's own Events, and
    ///   `kubectl describe lease aliaslb-controller` shows it too;
    /// - it is the controller's own object and outlives failovers and pod restarts (a Pod
    ///   would not), and needs no permission the controller lacks;
    /// - the Services are not what changed: one Event on each of them for one deletion
    ///   would flood.
    fn leader_lease_ref(&self) -> ObjectReference {
        let namespace = &self.ctx.config.namespace;
        let key = ObjectRef::<Lease>::new(keys::CONTROLLER_LEASE).within(namespace);
        match self.caches.leases.get(&key) {
            Some(lease) => lease.object_ref(&()),
            None => ObjectReference {
                api_version: Some("coordination.k8s.io/v1".into()),
                kind: Some("Lease".into()),
                namespace: Some(namespace.clone()),
                name: Some(keys::CONTROLLER_LEASE.into()),
                ..ObjectReference::default()
            },
        }
    }

    async fn config_event(
        &self,
        cm: Option<&ConfigMap>,
        warning: bool,
        reason: &str,
        note: String,
    ) {
        let Some(cm) = cm else { return };
        self.events
            .publish(&cm.object_ref(&()), None, warning, reason, note)
            .await;
    }

    /// Warns when the pool entries covering an address a Node has change (not on every
    /// pass): log and one Warning Event `NodeAddress` on the pool ConfigMap naming key, line
    /// and node. Without a ConfigMap to put it on, waits until there is one.
    fn node_address_notice(
        &mut self,
        config: &PoolConfig,
        addresses: &BTreeMap<std::net::IpAddr, NodeAddress>,
    ) {
        let clashes = node_address_clashes(config, addresses);
        if clashes == self.node_clashes {
            return;
        }
        if clashes.is_empty() {
            tracing::info!("no pool address is a Node's any more");
            self.node_clashes = clashes;
            return;
        }
        let Some(cm) = self.caches.configmap.state().into_iter().next() else {
            return;
        };
        let list: Vec<String> = clashes.iter().map(ToString::to_string).collect();
        tracing::warn!(
            clashes = list.len(),
            first = %list[0],
            "the pool lists addresses that Nodes have: never allocated"
        );
        let them = if list.len() == 1 { "it" } else { "them" };
        self.enqueue(Notice {
            regarding: Regarding::Object(Box::new(cm.object_ref(&()))),
            warning: true,
            reason: reason::NODE_ADDRESS,
            note: format!("{}; remove {them} from the pool", list.join("; ")),
        });
        self.node_clashes = clashes;
    }

    fn record_metrics(&mut self, output: &PlanOutput) {
        let metrics = &self.ctx.metrics;
        let mut current = BTreeSet::new();
        for usage in self.planner.usage() {
            let pool = usage.pool.as_str().to_owned();
            metrics.set_pool(
                &pool,
                usage.family,
                usage.total,
                u64::try_from(usage.in_use).unwrap_or(u64::MAX),
            );
            current.insert((pool, usage.family));
        }
        for (pool, family) in self.pools.difference(&current) {
            metrics.remove_pool(pool, *family);
        }
        self.pools = current;
        metrics.set_pending(self.planner.pending());
        metrics.set_address_conflicts(self.planner.lan_conflicts().count());
        for event in &output.events {
            if event.reason == reason::IP_ALLOCATED {
                metrics.inc_allocations();
            }
        }
        for (_, ips) in &output.released {
            for _ in ips {
                metrics.inc_releases();
            }
        }
    }

    /// The writes this pass needs.
    fn jobs<'a>(
        &mut self,
        output: &'a PlanOutput,
        by_key: &HashMap<ServiceKey, Arc<ServiceRecord>>,
        strangers: Vec<Arc<ServiceRecord>>,
        now: Instant,
    ) -> Vec<Job<'a>> {
        let ip_mode = self.writer.ip_mode();
        let mut jobs = Vec::new();
        if !self.refused.is_empty() {
            let strangers: HashSet<&ServiceKey> = strangers.iter().map(|s| &s.key).collect();
            self.refused
                .retain(|key, _| by_key.contains_key(key) || strangers.contains(key));
        }
        for (key, plan) in &output.services {
            let Some(svc) = by_key.get(key) else { continue };
            if self.backoff.get(key).is_some_and(|b| b.next > now) {
                continue;
            }
            if self
                .refused
                .get(key)
                .is_some_and(|a| *a == attempt_key(Some(plan), svc))
            {
                continue;
            }
            let memo = self.memos.get(key);
            let waiting = |same: bool| same && memo.is_some_and(|m| m.knows(svc));
            let node = plan.node_annotation();
            let annotations =
                apply::annotations_differ(svc, node.as_deref(), plan.interface.as_deref())
                    && !waiting(memo.is_some_and(|m| m.annotations == Some(annotations_key(plan))));
            let status = apply::status_differs(svc, plan, ip_mode)
                && !waiting(memo.is_some_and(|m| m.status == Some(status_key(plan))));
            if annotations || status {
                jobs.push(Job::Sync {
                    svc: svc.clone(),
                    plan,
                    annotations,
                    status,
                });
            }
        }
        let stranger_uids: HashSet<&Arc<str>> = strangers.iter().map(|s| &s.uid).collect();
        self.cleared.retain(|uid| stranger_uids.contains(uid));
        for svc in &strangers {
            if self.cleared.contains(&svc.uid)
                || self.backoff.get(&svc.key).is_some_and(|b| b.next > now)
                || self
                    .refused
                    .get(&svc.key)
                    .is_some_and(|a| *a == attempt_key(None, svc))
            {
                continue;
            }
            jobs.push(Job::Clear { svc: svc.clone() });
        }
        jobs
    }

    /// Runs `jobs`, [`MAX_IN_FLIGHT`] at once. One lifetime for the jobs and `self` (a
    /// closure generic over the jobs' lifetime would not be `Send`).
    fn run_jobs<'a>(&'a self, jobs: Vec<Job<'a>>) -> impl Stream<Item = Done> + Send + 'a {
        futures::stream::iter(jobs)
            .map(move |job| self.execute(job))
            .buffer_unordered(MAX_IN_FLIGHT)
    }

    async fn execute(&self, job: Job<'_>) -> Done {
        match job {
            Job::Sync {
                svc,
                plan,
                annotations,
                status,
            } => {
                let key = svc.key.clone();
                let api = Api::<Service>::namespaced(self.ctx.client.clone(), &key.namespace);
                let fence = || self.ctx.leader.write_deadline();
                let mut written = Vec::new();
                let result = async {
                    // Status first: the IP is what users wait for. Its body repeats the
                    // annotations, and servers whose Service status strategy keeps
                    // metadata changes (1.20 does) store them with it: then the
                    // annotation apply is not needed, which halves the writes of a
                    // new assignment. Where the returned object still differs, the
                    // annotation apply follows.
                    let mut current = None;
                    if status {
                        let updated = self.writer.apply_status(&api, &svc, plan, fence).await?;
                        written.extend(updated.resource_version.clone());
                        current = Some(updated);
                    }
                    let observed: &ServiceRecord = current.as_ref().unwrap_or(&*svc);
                    let node = plan.node_annotation();
                    if annotations
                        && apply::annotations_differ(
                            observed,
                            node.as_deref(),
                            plan.interface.as_deref(),
                        )
                    {
                        let updated = self
                            .writer
                            .apply_annotations(
                                &api,
                                observed,
                                node.as_deref(),
                                plan.interface.as_deref(),
                                fence,
                            )
                            .await?;
                        written.extend(updated.resource_version);
                    }
                    Ok::<_, ApplyError>(())
                }
                .await;
                if result.is_ok() {
                    tracing::info!(
                        svc = %key,
                        ips = ?plan.ips,
                        node = plan.node_annotation().as_deref().unwrap_or("-"),
                        announced = plan.announced.status,
                        reason = %plan.announced.reason,
                        "applied"
                    );
                }
                Done {
                    key,
                    attempt: attempt_key(Some(plan), &svc),
                    sync: Some((
                        annotations.then(|| annotations_key(plan)),
                        status.then(|| status_key(plan)),
                    )),
                    before: svc.resource_version.clone(),
                    uid: None,
                    result: result.map(|()| written).map_err(Box::new),
                }
            }
            Job::Clear { svc } => {
                let key = svc.key.clone();
                let api = Api::<Service>::namespaced(self.ctx.client.clone(), &key.namespace);
                let result = self
                    .writer
                    .clear(&api, &svc, || self.ctx.leader.write_deadline())
                    .await
                    .map(|s| s.resource_version.into_iter().collect());
                if result.is_ok() {
                    tracing::info!(svc = %key, "no longer ours: removed our annotations and status");
                }
                Done {
                    key,
                    attempt: attempt_key(None, &svc),
                    sync: None,
                    before: None,
                    uid: Some(svc.uid.clone()),
                    result: result.map_err(Box::new),
                }
            }
        }
    }

    fn settle(&mut self, done: Done, now: Instant) {
        match done.result {
            Ok(written) => {
                self.backoff.remove(&done.key);
                self.refused.remove(&done.key);
                let Some((annotations, status)) = done.sync else {
                    if let Some(uid) = done.uid {
                        self.cleared.insert(uid);
                    }
                    return;
                };
                let memo = self.memos.entry(done.key).or_default();
                memo.remember(done.before.as_deref());
                for version in &written {
                    memo.remember(Some(version));
                }
                if annotations.is_some() {
                    memo.annotations = annotations;
                }
                if status.is_some() {
                    memo.status = status;
                }
            }
            Err(error) => {
                self.ctx.metrics.inc_reconcile_error(error.category());
                if error.is_transient() {
                    let failures = self.backoff.get(&done.key).map_or(0, |b| b.failures) + 1;
                    let backoff = Backoff::after(failures, now);
                    tracing::warn!(
                        svc = %done.key,
                        failures,
                        retry_in = ?backoff.next.saturating_duration_since(now),
                        error = %error,
                        source = ?std::error::Error::source(&error),
                        "write failed; retrying"
                    );
                    self.backoff.insert(done.key, backoff);
                } else if error.is_invalid() {
                    // The same write would be refused again: wait for the plan to change.
                    tracing::warn!(
                        svc = %done.key,
                        error = %error,
                        source = ?std::error::Error::source(&error),
                        "write refused as invalid; not retried until it or the Service changes"
                    );
                    self.backoff.remove(&done.key);
                    self.refused.insert(done.key, done.attempt);
                } else {
                    tracing::debug!(svc = %done.key, error = %error, "write skipped");
                    self.backoff.remove(&done.key);
                }
            }
        }
    }

    /// Queues an Event for the worker; a full queue drops it (counted).
    fn enqueue(&self, notice: Notice) {
        if let Err(error) = self.queue.try_send(notice) {
            let notice = error.into_inner();
            self.ctx.metrics.inc_reconcile_error("event_dropped");
            tracing::warn!(
                object = ?notice.regarding().name,
                reason = %notice.reason,
                "Event queue full: Event dropped"
            );
        }
    }

    /// Queues the pass's Events, on their Services (deleted ones by their last reference).
    fn publish(&self, output: &PlanOutput, old_refs: &HashMap<ServiceKey, Arc<str>>) {
        for e in &output.events {
            let uid = self
                .refs
                .get(&e.service)
                .or_else(|| old_refs.get(&e.service))
                .cloned();
            let notice = Notice {
                regarding: Regarding::Service {
                    key: e.service.clone(),
                    uid,
                },
                warning: e.warning,
                reason: e.reason,
                note: e.message.clone(),
            };
            self.enqueue(notice);
        }
    }
}

/// Sets each Service's observed node from our own assignment objects (see the module
/// docs), never from the annotation: a Service none of them lists has no node to keep.
fn import_trusted_nodes(
    views: &mut [Arc<aliaslb_core::plan::ServiceView>],
    observed: &BTreeMap<String, assign::Texts>,
) {
    if observed.is_empty() && views.iter().any(|v| v.observed_node.is_some()) {
        tracing::warn!(
            "no node assignment object yet: Services with an aliaslb.io/node annotation get their node elected afresh (the annotation is a view anyone with edit on the Service can write)"
        );
    }
    let trusted = assign::trusted_nodes(observed);
    for view in views.iter_mut() {
        let node =
            assign::trusted_node_of(&view.key, &view.observed_ips, &trusted).map(str::to_owned);
        if view.observed_node != node {
            Arc::make_mut(view).observed_node = node;
        }
    }
}

/// The Warning note for an invalid ConfigMap: every error with key and line.
fn invalid_note(errors: &[ConfigError], stale: bool) -> String {
    let keeping = if stale {
        "keeping the last valid config"
    } else {
        "no valid config yet, no assignment is made"
    };
    let list: Vec<String> = errors.iter().map(ToString::to_string).collect();
    format!("{} error(s), {keeping}: {}", errors.len(), list.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_caps() {
        let now = Instant::now();
        let delays: Vec<Duration> = [1, 2, 3, 20]
            .iter()
            .map(|f| Backoff::after(*f, now).next - now)
            .collect();
        assert_eq!(
            delays,
            vec![
                Duration::from_millis(200),
                Duration::from_millis(400),
                Duration::from_millis(800),
                MAX_BACKOFF
            ]
        );
    }

    #[test]
    fn invalid_note_lists_key_and_line() {
        let data = BTreeMap::from([("default".to_owned(), "10.0.0.1\nnope\n".to_owned())]);
        let errors = PoolConfig::parse(&data).unwrap_err();
        let note = invalid_note(&errors, true);
        assert!(
            note.starts_with("1 error(s), keeping the last valid config: key default, line 2:"),
            "{note}"
        );
    }

    #[test]
    fn a_refused_write_is_retried_only_when_it_or_the_service_changes() {
        let svc = |version: &str| ServiceRecord {
            key: ServiceKey::new("a", "web"),
            uid: "uid".into(),
            resource_version: Some(version.into()),
            generation: Some(1),
            view: None,
            node: None,
            interface: None,
            ingress: Box::default(),
            conditions: Box::default(),
        };
        let plan = ServicePlan {
            ips: vec!["10.0.0.1".parse().unwrap()],
            node: Some("n1".into()),
            nodes: Vec::new(),
            interface: None,
            allocated: aliaslb_core::plan::ConditionPlan {
                status: true,
                reason: reason::ALLOCATED,
                message: "assigned".into(),
            },
            announced: aliaslb_core::plan::ConditionPlan {
                status: false,
                reason: reason::ADDRESS_CONFLICT,
                message: "n1 reports a conflict".into(),
            },
        };
        let refused = attempt_key(Some(&plan), &svc("7"));
        assert_eq!(
            attempt_key(Some(&plan), &svc("7")),
            refused,
            "the same write"
        );
        // A changed message, node or object is another write.
        let mut reworded = plan.clone();
        reworded.announced.message = "n1 reports another conflict".into();
        assert_ne!(attempt_key(Some(&reworded), &svc("7")), refused);
        let mut moved = plan.clone();
        moved.node = Some("n2".into());
        assert_ne!(attempt_key(Some(&moved), &svc("7")), refused);
        assert_ne!(attempt_key(Some(&plan), &svc("8")), refused);
        assert_ne!(attempt_key(None, &svc("7")), refused);
    }

    #[test]
    fn memo_knows_versions_it_saw() {
        let mut memo = Memo::default();
        for v in 0..10 {
            memo.remember(Some(&v.to_string()));
        }
        let at = |rv: &str| ServiceRecord {
            key: ServiceKey::new("a", "web"),
            uid: "uid".into(),
            resource_version: Some(rv.into()),
            generation: None,
            view: None,
            node: None,
            interface: None,
            ingress: Box::default(),
            conditions: Box::default(),
        };
        assert!(memo.knows(&at("9")));
        assert!(
            !memo.knows(&at("1")),
            "only the last {KNOWN_VERSIONS} are kept"
        );
        assert!(!memo.knows(&at("10")));
    }
}
