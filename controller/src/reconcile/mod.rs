//! The leader's reconcile loop: observe (caches) -> one pure planner pass -> apply the
//! difference (the node assignments agents act on, Service annotations and status,
//! Events) -> metrics. Does I/O.
//!
//! A pass costs what changed, not the number of Services: the term keeps what it observed
//! ([`world`]) and the caches note which Services and endpoints their watches changed, so
//! the planner re-plans what those changes can affect ([`Planner::plan_changes`]), only the
//! nodes whose assignment may differ are rendered and compared, and only the Services
//! re-planned, changed or due for a retry are compared with their plan. The first pass of
//! a term and a relist read and plan everything ([`Planner::plan`]).
//!
//! One leadership term is a `Reconciler`, split along the line of linkerd's index and
//! controller: the pass here (observe -> the config in force -> plan -> jobs), the index
//! (`index`: the plans, the Services on each node and what was last rendered, which the
//! pass merges its output into), the writer (`writer`: executes the jobs, settles their outcomes, keeps the memo and
//! backoff; the only caller of the API writes), the Events (`events`: a queue and its
//! worker) and what they say (`notices`: the texts of the logs and Warning Events said
//! once on an edge). Which pool configuration is in force is a step of its own
//! (`config_in_force`) that returns its notice instead of publishing it.
//!
//! - The first pass of a term imports the current nodes from our own assignment objects
//!   ([`crate::write::assignments`]), never from the Services' `aliaslb.io/node` annotation, which a
//!   tenant can write (not even when no assignment object exists yet, as after an upgrade
//!   from a version without them: then the nodes are elected afresh, once).
//!
//! - [`run`] is the whole controller minus leader election and HTTP: it starts the caches
//!   (in every replica), marks the process ready once they synced, and runs a
//!   [`Reconciler`] for each leadership term (a fresh [`Planner`] per term: it imports the
//!   observed assignments on its first pass, so a restart or failover keeps every IP).
//! - Any cache change wakes the loop, but for an agent's renewal that changes nothing a
//!   pass reads (same report, fresh before and after: see
//!   [`agents::AgentClock::observe`]). A change after a quiet spell is planned at once; one
//!   that comes less than [`DEBOUNCE`] after the last pass ended waits out the rest of it,
//!   so everything that arrived meanwhile goes into one pass; not between the slices of a
//!   burst (below), which follow one another at once. It also wakes
//!   exactly when the next agent Lease goes stale and when a write retry is due.
//! - Writes happen only where desired differs from observed, at most [`MAX_IN_FLIGHT`] at
//!   once, each behind the leader fence and a timeout, and at most `crate::write::pass::PASS_WRITES`
//!   Service writes per pass: the rest are examined first by the next pass, which follows
//!   at once with what changed meanwhile (the agents' reports of the assignments just
//!   written, so a first convergence mostly writes `Announced=True` with the IP). The
//!   caches lag behind our own writes: a write is not repeated while the cached object is
//!   a version we already know (the one we wrote over, or one our writes returned).
//! - Transient write failures back off per Service (`crate::write::pass`'s backoff). A write the API server
//!   refuses as invalid (422) would be refused again: it is logged, counted
//!   (`reconcile_errors{category="invalid"}`) and not retried until what it would write,
//!   or the Service, changes (see `crate::write::pass`).
//! - The planner never allocates an address a Node lists in `status.addresses`
//!   ([`nodes::node_addresses`]); when the pool entries covering one change, one Warning
//!   Event `NodeAddress` on the pool ConfigMap names key, line and node (see
//!   `Reconciler::node_address_notice`).
//! - Nor one a fresh agent reports answered on the LAN by a foreign MAC (the planner
//!   withholds it, [`aliaslb_core::plan::lan_conflicts`]); the number of such
//!   addresses is the gauge `aliaslb_controller_address_conflicts`. The assignment objects
//!   mark first claims `probe` and list every agent's MACs under `node-macs`
//!   ([`crate::write::assignments`]).
//! - Agent reports are read within bounds ([`AgentReport::from_json`](aliaslb_core::report::AgentReport::from_json)); a report that
//!   cannot be read makes its agent count as not ready, with one warning when it starts
//!   (see `Reconciler::agents`).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use aliaslb_core::election::NodeState;
use aliaslb_core::keys;
use aliaslb_core::plan::{
    Changes, Inputs, NodeAddress, NodeAddressClash, PlanEvent, PlanOutput, Planner, ServiceKey,
    ServicePlan, ServiceRangeClash, ServiceView, node_address_clashes, reason,
    service_range_clashes,
};
use aliaslb_core::pool::{PoolConfig, PoolConfigError, PoolKey};
use aliaslb_core::range::Family;
use aliaslb_core::text;
use aliaslb_core::version;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Node, ObjectReference};
use kube::Resource;
use kube::runtime::reflector::ObjectRef;

use crate::context::Context;
use crate::handover::{self, Handovers};
use crate::http::Readiness;
use crate::observe::agents::{Freshness, LeaseKind, LeaseRecord, Observer, RejectedReport, Sight};
use crate::observe::nodes;
use crate::pool_state::{ConfigNotice, ConfigState};
use crate::track::{Failovers, Waiting, unannounced_reason};
use crate::watch::{Caches, WatchError};
use crate::write::assignments::{self, Identities, ShardsOf};
use crate::write::pool_status::{StatusInput, StatusWriter};
use crate::write::services;

/// The shortest time from the end of one pass to the start of the next (unless a burst's
/// slices are under way): changes that arrive sooner wait for the rest of it, together.
/// A change after a quiet spell is planned at once (it used to wait `DEBOUNCE` after every
/// change: 20 ms of each new Service's time to its IP).
pub const DEBOUNCE: Duration = Duration::from_millis(20);
/// Writes in flight at once; the Event worker has its own bound of the same size.
pub const MAX_IN_FLIGHT: usize = 16;
/// Reason of the Warning Event on an agent Lease whose report was rejected.
pub const INVALID_AGENT_REPORT: &str = "InvalidAgentReport";
/// Reason of the Warning Event on an agent Lease whose release this controller does not
/// support ([`aliaslb_core::version`]: upgrade the agents first, then the controller).
pub const UNSUPPORTED_AGENT_VERSION: &str = "UnsupportedAgentVersion";
/// Reason of the Warning Event on a Node whose agent reports a wide subnet that holds none
/// of the Node's own addresses: not used for election ([`AgentReport::elected_subnets`]).
///
/// [`AgentReport::elected_subnets`]: aliaslb_core::report::AgentReport::elected_subnets
pub const UNANCHORED_SUBNET: &str = "UnanchoredSubnet";
/// Warning Event on the leader Lease: no agent is seen renewing, so the controller keeps
/// every node assignment and elects no node until it sees them again
/// ([`agents`] module docs).
pub const AGENTS_UNOBSERVABLE: &str = aliaslb_core::plan::reason::AGENTS_UNOBSERVABLE;

mod events;
mod index;
mod notices;
mod world;

use crate::write::pass::{Done, Writes};
use events::{AbortOnDrop, EventQueue, MAX_NOTE, Notice, Regarding};
use index::Index;
use world::{ServiceDelta, World};

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
    let ip_mode = services::version_has_ip_mode(&version.major, &version.minor);
    tracing::info!(
        server = %version.git_version,
        ip_mode,
        "API server version"
    );
    let caches = Caches::start(&ctx.client, &ctx.config).await;
    caches.synced().await?;
    ctx.metrics.track_agents(caches.agents.clone());
    readiness.set_ready();
    supervise(ctx, caches, ip_mode).await;
    Ok(())
}

/// Follows leadership edges: a [`Reconciler`] while leading, none otherwise. The
/// reconciler's task is aborted with this future: aborting [`run`] stops the loop.
async fn supervise(ctx: Arc<Context>, caches: Caches, ip_mode: bool) {
    let mut edges = ctx.leader.watch();
    let mut running: Option<AbortOnDrop> = None;
    // The config in force, kept across the terms of this process (see ConfigState::resumed).
    let last_good: LastGood = Arc::default();
    loop {
        let leading = *edges.borrow_and_update();
        ctx.metrics.set_leader(leading);
        match (leading, running.take()) {
            (true, None) => {
                let reconciler =
                    Reconciler::new(ctx.clone(), caches.clone(), ip_mode, last_good.clone());
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

/// The pool config a term had in force, for the next term of the same process.
type LastGood = Arc<std::sync::Mutex<Option<PoolConfig>>>;

/// The loop of one leadership term.
struct Reconciler {
    ctx: Arc<Context>,
    caches: Caches,
    planner: Planner,
    /// The writes and what they remember.
    writes: Writes,
    /// The Events.
    events: EventQueue,
    config: ConfigState,
    /// Where the config in force is kept for the next term of this process.
    last_good: LastGood,
    /// What the term has observed, brought up to date every pass.
    world: World,
    /// The term's index of what it planned and wrote ([`Index`]).
    index: Index,
    /// What the loop last said on each edge it watches ([`notices::Said`]).
    said: notices::Said,
    /// Whether the planner has imported the observed assignments (its first pass).
    imported: bool,
    /// The term's sight of the agents: blind or not, and since when it sees.
    observer: Observer,
    /// When the agents' freshness changes next without an event.
    agents_change: Option<Instant>,
    /// What the metrics count across passes ([`Tracked`]).
    tracked: Tracked,
    /// The pool status ConfigMap's writes ([`crate::write::pool_status`]).
    status: StatusWriter,
    /// The drain windows of planned moves (`--drain-window`; `None`: off, nothing of it
    /// runs).
    handovers: Option<Handovers>,
}

/// What the metrics count across passes.
#[derive(Default)]
struct Tracked {
    /// Pool series currently exported.
    pools: BTreeSet<(String, Family)>,
    /// The failovers in flight.
    failovers: Failovers,
    /// The Services with IPs not announced, for their gauge.
    unannounced: Waiting,
    /// The Services without (every) IP, and since when.
    pending: Waiting,
}

/// What [`Reconciler::merge`] found.
struct Merged {
    /// The nodes whose assignment may have changed, each with the IPs whose lines may
    /// have (`None`: every node, every line).
    touched: Option<BTreeMap<String, BTreeSet<IpAddr>>>,
    /// The Services the pass planned.
    planned: Vec<ServiceKey>,
}

/// What one pass observed, read from the caches and [`World`].
struct PassInput {
    /// What changed since the last pass, for the planner.
    changes: Changes,
    /// Every view of ours on a full pass (what it plans); empty on a narrowed one.
    views: Vec<Arc<ServiceView>>,
    /// What changed in the Service records.
    services: ServiceDelta,
    sight: Sight,
    nodes: Vec<NodeState>,
    node_addresses: BTreeMap<IpAddr, NodeAddress>,
    /// The Service ClusterIP ranges ([`crate::watch::service_ranges`]).
    service_ranges: Vec<ipnet::IpNet>,
    /// When the agents were judged.
    now: Instant,
}

impl Reconciler {
    fn new(ctx: Arc<Context>, caches: Caches, ip_mode: bool, last_good: LastGood) -> Self {
        ctx.metrics.set_agents_unobservable(false);
        let resumed = last_good.lock().map(|g| g.clone()).unwrap_or_default();
        let hold = ctx.config.hold_released;
        let ctx_drain_window = ctx.config.drain_window;
        Reconciler {
            events: EventQueue::new(ctx.clone()),
            writes: Writes::new(ctx.clone(), ip_mode),
            ctx,
            caches,
            planner: Planner::with_hold(hold),
            config: ConfigState::resumed(resumed),
            last_good,
            world: World::default(),
            index: Index::default(),
            said: notices::Said::default(),
            imported: false,
            tracked: Tracked::default(),
            observer: Observer::new(Instant::now()),
            agents_change: None,
            status: StatusWriter::default(),
            handovers: (!ctx_drain_window.is_zero()).then(|| Handovers::new(ctx_drain_window)),
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
            let passed = tokio::time::Instant::now();
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
            // A change after a quiet spell is planned at once: a lone new Service waits
            // for nothing. One that follows a pass closer than DEBOUNCE waits out the rest
            // of it, with whatever else arrives meanwhile: at most one pass per DEBOUNCE
            // in a stream of changes. A burst's next slice goes at once: what arrives
            // meanwhile waits for the slice after it, and the API server is kept busy.
            if self.writes.deferred() == 0 {
                tokio::time::sleep_until(passed + DEBOUNCE).await;
            }
        }
    }

    /// One pass, in named steps; returns when the loop must wake up at the latest.
    #[tracing::instrument(level = "debug", skip_all)]
    async fn pass(&mut self) -> Option<Instant> {
        let started = Instant::now();
        let Some(config) = self.config_step().await else {
            // Nothing is planned; the status says why.
            return self.status_step().await;
        };
        let mut observed = self.observe();
        self.node_address_notice(&config, &observed.node_addresses);
        self.service_range_notice(&config, &observed.service_ranges);
        let mut output = self.plan(&config, &mut observed);
        self.feed_handovers(&output, &observed);
        let Merged { touched, planned } = self.index.merge(&mut output, &observed);
        // The agents act on the assignments: they go first.
        self.write_assignments(&output, &observed, touched).await;
        let events = output.events.len();
        // The Events' texts move to the queue, not copied: a first pass's are megabytes.
        let (services, writes) = self
            .write_services(std::mem::take(&mut output.events), &planned, observed)
            .await;
        tracing::debug!(
            services,
            planned = planned.len(),
            writes,
            deferred = self.writes.deferred(),
            events,
            took = ?started.elapsed(),
            "pass done"
        );
        self.ctx.metrics.observe_reconcile(started.elapsed());
        self.ctx.metrics.add_services_planned(planned.len());
        // After this pass's writes settled: a retry that succeeded clears it now.
        let (failing, failing_assignments) = self.writes.failing();
        self.ctx
            .metrics
            .set_writes_failing(failing, failing_assignments);
        // Services left for the next pass: it follows at once.
        let deferred = (self.writes.deferred() > 0).then(Instant::now);
        let status = self.status_step().await;
        // A reservation of a deleted Service's address ending may serve a waiting one.
        self.agents_change
            .into_iter()
            .chain(deferred)
            .chain(self.index.identities.next_due(self.world.reports()))
            .chain(self.writes.next_retry())
            .chain(self.planner.next_release())
            .chain(self.handovers.as_ref().and_then(Handovers::next_end))
            .chain(status)
            .min()
    }

    /// With `--drain-window`: the drains that ended, and the moves of this pass's plans
    /// (before they are merged: the index holds the plans before), into the tracker.
    fn feed_handovers(&mut self, output: &PlanOutput, observed: &PassInput) {
        let Some(handovers) = self.handovers.as_mut() else {
            return;
        };
        handovers.observe_nodes(&observed.nodes);
        handovers.expire(observed.now);
        let released: BTreeSet<String> = {
            let clock = self.caches.agents.lock().unwrap_or_else(|e| e.into_inner());
            clock.released().map(str::to_owned).collect()
        };
        let world = handover::World {
            nodes: &observed.nodes,
            released: &released,
            reports: self.world.reports(),
        };
        let records = &self.world.records;
        let tcp_ports = |key: &ServiceKey| -> BTreeSet<u16> {
            let view = records.get(key).and_then(|r| r.view.as_deref());
            view.into_iter()
                .flat_map(|v| &v.ports)
                .filter(|p| &*p.protocol == "TCP")
                .filter_map(|p| u16::try_from(p.port).ok())
                .collect()
        };
        let l2 = |plan: &ServicePlan| plan.nodes.is_empty();
        for (key, plan) in &output.services {
            // A new plan has no holder to hand over from.
            let Some(old) = self.index.plans.get(key) else {
                continue;
            };
            if !l2(old) || !l2(plan) || (old.ips == plan.ips && old.node == plan.node) {
                continue;
            }
            let change = handover::Move {
                old_ips: old.ips.clone(),
                old_node: old.node.clone(),
                new_ips: plan.ips.clone(),
                new_node: plan.node.clone(),
                ports: tcp_ports(key),
            };
            handovers.moved(&change, &world, observed.now);
        }
        // Services gone: their IPs' lines go.
        let gone = deleted_or_released(observed, output)
            .chain(
                self.index
                    .plans
                    .keys()
                    .filter(|_| observed.changes.everything),
            )
            .filter(|key| !output.services.contains_key(*key));
        for key in gone {
            if let Some(old) = self.index.plans.get(key) {
                let change = handover::Move {
                    old_ips: old.ips.clone(),
                    old_node: old.node.clone(),
                    new_ips: Vec::new(),
                    new_node: None,
                    ports: BTreeSet::new(),
                };
                handovers.moved(&change, &world, observed.now);
            }
        }
    }

    /// Writes the pool status ConfigMap when it is due ([`StatusWriter::due`]); returns
    /// when a write that had to wait is due.
    async fn status_step(&mut self) -> Option<Instant> {
        let usage = self.planner.usage();
        let pending = self.planner.pending_on();
        let desired = crate::write::pool_status::render(&StatusInput {
            config: &self.config,
            usage: &usage,
            pending: &pending,
            namespaces: &self.world.namespaces,
        });
        let now = Instant::now();
        let due = self.status.due(&desired, now)?;
        if due > now {
            return Some(due);
        }
        let config = &self.ctx.config;
        let api = kube::Api::<ConfigMap>::namespaced(self.ctx.client.clone(), &config.namespace);
        let name = crate::write::pool_status::name(&config.pool_configmap);
        let leader = &self.ctx.leader;
        match self
            .status
            .write(&api, &name, desired, || leader.write_deadline(), now)
            .await
        {
            Ok(()) => None,
            Err(error) => {
                self.ctx.metrics.inc_reconcile_error(error.category());
                if error.category() != "not_leader" {
                    tracing::warn!(object = name, error = %error, "pool status write failed; retrying");
                }
                Some(now + crate::write::pool_status::STATUS_EVERY)
            }
        }
    }

    /// The pool config in force for this pass, its notice (if any) published; `None` while
    /// no valid config was ever seen (planning on nothing would clear every assignment).
    async fn config_step(&mut self) -> Option<PoolConfig> {
        let cm = self.caches.configmap.state().into_iter().next();
        if let Some(cm) = &cm {
            self.said.configmap = Some(cm.object_ref(&()));
        }
        let caches = &self.caches;
        let assigned = || {
            !caches.assignments.is_empty()
                || caches
                    .services
                    .snapshot()
                    .iter()
                    .any(|s| s.view.is_some() && s.ingress_ips().next().is_some())
        };
        let (config, notice) = config_in_force(&mut self.config, cm.as_deref(), assigned);
        if let Some(notice) = notice {
            if let Ok(mut kept) = self.last_good.lock() {
                kept.clone_from(&config);
            }
            self.ctx
                .metrics
                .set_config(self.config.valid(), self.config.stale());
            self.config_notice(cm.as_deref(), notice).await;
        }
        config
    }

    /// Everything the planner reads, brought up to date from what changed since the last
    /// pass ([`World`]).
    fn observe(&mut self) -> PassInput {
        let dirty = self.caches.take_dirty();
        let mut services = self.world.services(&self.caches.services, &dirty);
        let endpoints = self
            .world
            .endpoints(&self.caches.endpoints, &dirty, &services);

        let now = Instant::now();
        let (mut changed_nodes, sight) = self.agents(now);
        let node_objects = self.caches.nodes.state();
        let mut nodes = nodes::node_states(&node_objects, self.world.agents());
        let node_addresses = nodes::node_addresses(node_objects.iter().map(|n| &**n));
        self.unanchored_notice(&node_objects);
        drop(node_objects);
        changed_nodes.extend(self.world.nodes_changed(&mut nodes));
        // Labels: read for the Services this pass decides on; a change needs no more.
        self.world.namespaces(
            &self.caches.namespaces,
            self.caches
                .namespace_changes
                .load(std::sync::atomic::Ordering::Relaxed),
        );
        let changes = Changes {
            everything: services.everything,
            // Moved: nothing reads the delta's views after the endpoints.
            services: if services.everything {
                Vec::new()
            } else {
                std::mem::take(&mut services.views)
            },
            nodes: changed_nodes,
            endpoints,
        };
        // A narrowed pass reads the changed views only (`Changes::services`).
        let views = if services.everything {
            self.world.views()
        } else {
            Vec::new()
        };
        PassInput {
            changes,
            views,
            services,
            sight,
            nodes,
            node_addresses,
            service_ranges: crate::watch::service_ranges(self.caches.service_cidrs.as_ref()),
            now,
        }
    }

    /// One planner pass over what changed (the first of a term, and after a relist, over
    /// everything: it imports the nodes from our assignment objects first), and its
    /// metrics.
    fn plan(&mut self, config: &PoolConfig, observed: &mut PassInput) -> PlanOutput {
        // Our IPs on Services that stopped being ours: not free while the API shows them.
        let lingering: BTreeSet<IpAddr> = self
            .world
            .strangers
            .values()
            .flat_map(|s| s.ingress_ips())
            .collect();
        let not_ours: BTreeSet<ServiceKey> = self.world.strangers.keys().cloned().collect();
        if !self.imported {
            let assignments = self.caches.assignments.state();
            let observed_assignments = assignments::observed(assignments.iter().map(|cm| &**cm));
            import_trusted_nodes(&mut observed.views, &observed_assignments);
            if let Some(handovers) = self.handovers.as_mut() {
                for (node, objects) in &observed_assignments {
                    let lines = assignments::handovers_of(node, objects);
                    handovers.import(node, &lines, observed.now);
                }
                handovers.imported();
            }
            self.imported = true;
        }
        let inputs = Inputs {
            config,
            namespaces: &self.world.namespaces,
            services: &observed.views,
            nodes: &observed.nodes,
            agents: self.world.reports(),
            lingering: &lingering,
            node_addresses: &observed.node_addresses,
            service_ranges: &observed.service_ranges,
            not_ours: &not_ours,
            local_endpoints: &self.world.local,
            respect_cordon: self.ctx.config.respect_cordon,
            agents_unobservable: observed.sight == Sight::Blind,
            now: observed.now,
        };
        let output = if observed.changes.everything {
            self.planner.plan(&inputs)
        } else {
            self.planner.plan_changes(&inputs, &observed.changes)
        };
        self.record_metrics(&output, config, observed);
        output
    }

    /// The node assignments the plans ask for, written where they differ: the nodes in
    /// `touched` (every node when `None`), and those whose object changed or whose write
    /// is due for a retry. A node touched only by plans that changed renders the shards
    /// of the IPs `touched` lists for it (a change costs the shard it is in, not the
    /// node's every line); any other reason renders all of it.
    async fn write_assignments(
        &mut self,
        output: &PlanOutput,
        observed: &PassInput,
        touched: Option<BTreeMap<String, BTreeSet<IpAddr>>>,
    ) {
        // A node's new key or MACs: the indexes of its peers (the nodes that share a plan
        // with it) are written, no other.
        let identities_changed = self
            .index
            .identities
            .update(self.world.reports(), observed.now);
        let objects = self.caches.assignments.state();
        // Each object's version, and the nodes that have objects.
        let mut object_versions: HashMap<String, Option<String>> = HashMap::new();
        let mut with_objects: BTreeSet<&str> = BTreeSet::new();
        for cm in objects.iter() {
            let Some(name) = cm.metadata.name.as_deref() else {
                continue;
            };
            let Some(node) = assignments::node_of(name) else {
                continue;
            };
            with_objects.insert(node);
            object_versions.insert(name.to_owned(), cm.metadata.resource_version.clone());
        }
        let every = touched.is_none();
        // A node whose plans alone changed renders the shards of the lines that changed
        // (`lines`); any other reason renders the whole node.
        let mut lines = touched.unwrap_or_default();
        let mut touched: BTreeSet<String> = lines.keys().cloned().collect();
        // An object that changed, other than by a write of ours (the echo of one), or went:
        // someone else wrote it, its whole node is compared.
        let mut whole = BTreeSet::new();
        let node_of = |name: &str| assignments::node_of(name).map(str::to_owned);
        for (name, version) in &object_versions {
            if self.index.assignment_versions.get(name) != Some(version)
                && !self.writes.wrote(name, version)
            {
                whole.extend(node_of(name));
            }
        }
        whole.extend(
            self.index
                .assignment_versions
                .keys()
                .filter(|n| !object_versions.contains_key(*n))
                .filter_map(|n| node_of(n)),
        );
        whole.extend(self.writes.assignment_retries(observed.now));
        // A node whose agent holds addresses but that has no object of ours (deleted while
        // no controller ran): its agent keeps what it last read until we write one, so it
        // gets one, if only to say "nothing assigned" (a group imported as moving off it
        // waits for that, see `Planner::import`).
        let owed: BTreeSet<String> = self
            .world
            .reports()
            .iter()
            .filter(|(node, r)| !r.held.is_empty() && !with_objects.contains(node.as_str()))
            .map(|(node, _)| node.clone())
            .collect();
        whole.extend(owed.iter().cloned());
        if every {
            whole.extend(with_objects.iter().map(|n| (*n).to_owned()));
            whole.extend(self.index.on_node.keys().map(|n| n.to_string()));
            whole.extend(touched.iter().cloned());
        } else {
            for node in &identities_changed {
                whole.extend(self.index.peers_of(node));
            }
        }
        // Handover lines that changed: their nodes' indexes are rewritten.
        let handover_lines = match self.handovers.as_mut() {
            Some(handovers) => {
                whole.extend(handovers.take_changed());
                handovers.lines()
            }
            None => HashMap::new(),
        };
        lines.retain(|node, _| !whole.contains(node));
        touched.extend(whole);
        self.index.assignment_versions = object_versions.clone();
        if touched.is_empty() {
            return;
        }
        let observed_assignments = assignments::observed(
            objects
                .iter()
                .filter(|cm| {
                    cm.metadata
                        .name
                        .as_deref()
                        .and_then(assignments::node_of)
                        .is_some_and(|n| touched.contains(n))
                })
                .map(|cm| &**cm),
        );
        drop(objects);
        object_versions
            .retain(|name, _| assignments::node_of(name).is_some_and(|n| touched.contains(n)));
        let records = &self.world.records;
        let index = &self.index;
        let standbys = self.ctx.config.fast_failover;
        // One node at a time: its Services (those it holds or stands by for) and no other;
        // with `only`, those with a line in one of its shards.
        let desired = |node: &str, only: Option<&ShardsOf>| {
            let carried = index.on_node.get(node).into_iter().flatten();
            let carried = carried.filter_map(|key| {
                let plan = index.plans.get(key)?.as_ref();
                if only.is_some_and(|only| !only.holds_any(&plan.ips)) {
                    return None;
                }
                let view = records.get(key).and_then(|r| r.view.as_deref());
                Some((key, plan, view))
            });
            let only = BTreeSet::from([node.to_owned()]);
            let mut assignments = assignments::desired(
                carried,
                &output.probe,
                &index.identities,
                Some(&only),
                standbys,
            )
            .remove(node)
            .unwrap_or_default();
            if let Some(lines) = handover_lines.get(node) {
                assignments.handovers.clone_from(lines);
            }
            assignments
        };
        self.writes
            .write_assignments(
                object_versions,
                (&touched, &owed),
                &lines,
                desired,
                observed_assignments,
                observed.now,
            )
            .await;
    }

    /// The Service writes the plans ask for, then the pass's Events; returns how many
    /// Services were looked at and how many writes were made. Looked at: the Services
    /// re-planned, those whose record changed, those whose retry is due, and every
    /// Service that is no longer ours but carries our marks.
    async fn write_services(
        &mut self,
        events: Vec<PlanEvent>,
        planned: &[ServiceKey],
        observed: PassInput,
    ) -> (usize, usize) {
        let PassInput { services, now, .. } = observed;
        let mut examine: BTreeSet<ServiceKey> = planned.iter().cloned().collect();
        examine.extend(services.records.iter().cloned());
        examine.extend(self.writes.retries(now));
        // The uids of our Services, for the Events: those gone this pass stay readable
        // for this pass's Events.
        let mut old_refs = HashMap::new();
        if services.everything {
            old_refs = std::mem::take(&mut self.index.refs);
            self.index.refs = self
                .world
                .records
                .values()
                .filter(|r| r.view.is_some())
                .map(|r| (r.key.clone(), r.uid.clone()))
                .collect();
            self.writes.forget_gone(&self.index.refs);
        } else {
            for key in &services.records {
                match self.world.records.get(key).filter(|r| r.view.is_some()) {
                    Some(record) => {
                        if let Some(old) = self.index.refs.insert(key.clone(), record.uid.clone())
                            && old != record.uid
                        {
                            old_refs.insert(key.clone(), old);
                        }
                    }
                    None => {
                        if let Some(old) = self.index.refs.remove(key) {
                            old_refs.insert(key.clone(), old);
                        }
                        self.writes.forget(key);
                    }
                }
            }
        }
        // What the last pass left goes first, in its order (see crate::write::pass::PASS_WRITES).
        let deferred = self.writes.take_deferred();
        for key in &deferred {
            examine.remove(key);
        }
        let looked_at = deferred.len() + examine.len();
        let jobs = self.writes.jobs(
            deferred
                .iter()
                .chain(&examine)
                .filter_map(|k| Some((k, self.index.plans.get(k)?.as_ref()))),
            &self.world.records,
            &self.world.strangers,
            now,
        );
        let done: Vec<Done> = self.writes.run_jobs(jobs).collect().await;
        let now = Instant::now();
        let writes = done.len();
        for outcome in done {
            self.writes.settle(outcome, now);
        }
        self.events.writes_pending(self.writes.deferred() > 0);
        self.events.plan_events(events, &self.index.refs, &old_refs);
        (looked_at, writes)
    }

    /// Checks the release an agent Lease reports against the releases this controller
    /// supports ([`aliaslb_core::version`]) when it changed: warns once when it becomes
    /// unsupported (log, Warning Event [`UNSUPPORTED_AGENT_VERSION`] on the Lease, gauge
    /// `aliaslb_agents_unsupported_version`), logs when it is supported again. Nothing
    /// else changes: the agent's report counts as before.
    fn check_agent_version(&mut self, lease: &LeaseRecord, node: &str) {
        let name = lease.name.as_str();
        let reported = lease.agent_version();
        if self
            .said
            .agent_versions
            .get(name)
            .is_some_and(|v| v.as_deref() == reported)
        {
            return;
        }
        self.said
            .agent_versions
            .insert(name.to_owned(), reported.map(str::to_owned));
        let support = version::agent_support(aliaslb_ops::build::VERSION, reported);
        if support.is_supported() {
            if self.said.unsupported_agents.remove(name) {
                tracing::info!(
                    lease = name,
                    node,
                    agent_version = reported,
                    "agent release supported again"
                );
            }
        } else {
            self.said.unsupported_agents.insert(name.to_owned());
            self.unsupported_version_notice(lease, node, &support);
        }
    }

    /// Agent readiness and reports by node.
    ///
    /// A report that cannot be read (not JSON, or outside the bounds of
    /// [`AgentReport::from_json`](aliaslb_core::report::AgentReport::from_json)) counts for nothing: the agent is taken as not ready, so
    /// its node is not eligible, and as holding nothing. That is warned about once when it
    /// starts (log, Warning Event `InvalidAgentReport` on the Lease, and
    /// `aliaslb_agent_reports_rejected_total`), not on every pass. A report is read again
    /// only when it changed (the Lease cache keeps it, [`LeaseRecord`]).
    ///
    /// **Only nodes are agents.** An agent Lease whose Node does not exist is ignored: not
    /// read, counted in `aliaslb_agent_leases_ignored`, said once in the log
    /// ([`Reconciler::ghost_notice`]).
    ///
    /// Freshness is the [`Observer`]'s: when no agent is seen renewing at all, the
    /// controller is blind rather than every node dead ([`agents`] module docs); that is
    /// said once on each edge (log, Warning Event [`AGENTS_UNOBSERVABLE`] on the leader
    /// Lease, gauge `aliaslb_agents_unobservable`).
    ///
    /// A deleted Lease is not evidence of a dead agent: until the clock judges it lost, its
    /// node keeps its freshness and its last report as if the agent had stopped renewing
    /// ([`agents`] module docs); then it is forgotten.
    fn agents(&mut self, now: Instant) -> (BTreeSet<String>, Sight) {
        let (judgement, gone) = {
            let mut clock = self.caches.agents.lock().unwrap_or_else(|e| e.into_inner());
            let judgement = self.observer.judge(&clock, now);
            for name in clock.forget_lost(&judgement) {
                tracing::info!(lease = %name, "agent Lease deleted and not written again within its lease duration: its node counts as lost");
            }
            let gone: Vec<String> = clock.gone().map(str::to_owned).collect();
            (judgement, gone)
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
        let mut changed = BTreeSet::new();
        let mut seen = HashSet::new();
        let mut ghosts = BTreeSet::new();
        let leases = self.caches.leases.snapshot();
        for lease in &leases {
            let name = lease.name.as_str();
            let freshness = judgement
                .agents
                .get(name)
                .copied()
                .unwrap_or(Freshness::Lost);
            let Some((node, (freshness, report), error)) = lease.agent_view(freshness) else {
                if let LeaseKind::Ghost { node } = &lease.kind {
                    ghosts.insert((name, node.as_str()));
                }
                continue;
            };
            // A Node deleted since the record was made: a ghost too.
            if self.caches.nodes.get(&ObjectRef::new(node)).is_none() {
                ghosts.insert((name, node));
                continue;
            }
            seen.insert(node);
            self.check_agent_version(lease, node);
            match error {
                Some(error) if self.said.bad_reports.insert(name.to_owned()) => {
                    self.reject_report(lease, node, error);
                }
                None if self.said.bad_reports.remove(name) => {
                    tracing::info!(lease = name, "agent report readable again");
                }
                _ => {}
            }
            if self.world.set_agent(node, freshness, Some(report)) {
                changed.insert(node.to_owned());
            }
        }
        self.ghost_notice(&ghosts);
        // Deleted Leases not yet judged lost: the agent as last seen, its report kept.
        for name in &gone {
            let (Some(node), Some(freshness)) =
                (keys::agent_lease_node(name), judgement.agents.get(name))
            else {
                continue;
            };
            if self.caches.nodes.get(&ObjectRef::new(node)).is_none() {
                continue;
            }
            seen.insert(node);
            if self.world.set_agent(node, *freshness, None) {
                changed.insert(node.to_owned());
            }
        }
        changed.extend(self.world.forget_agents_but(&seen));
        // Forget deleted Leases: a new one with a bad report is warned about again.
        let lease_seen: HashSet<&str> = leases.iter().map(|l| l.name.as_str()).collect();
        if !self.said.bad_reports.is_empty() {
            self.said
                .bad_reports
                .retain(|n| lease_seen.contains(n.as_str()));
        }
        self.said
            .agent_versions
            .retain(|n, _| lease_seen.contains(n.as_str()));
        self.said
            .unsupported_agents
            .retain(|n| lease_seen.contains(n.as_str()));
        self.ctx
            .metrics
            .set_agents_unsupported_version(self.said.unsupported_agents.len());
        (changed, judgement.sight)
    }

    /// The metrics of one pass, from its output and the plans of the passes before (not
    /// merged yet): pools, pending Services, failovers ([`Failovers`]), Services not
    /// announced, create -> IP.
    fn record_metrics(&mut self, output: &PlanOutput, config: &PoolConfig, observed: &PassInput) {
        let metrics = &self.ctx.metrics;
        let mut quarantined: BTreeMap<(&str, Family), u64> = BTreeMap::new();
        for ip in self.planner.quarantined() {
            if let Some((pool, _)) = config.pools().find(|(_, p)| p.contains(ip)) {
                *quarantined
                    .entry((pool.as_str(), Family::of(ip)))
                    .or_default() += 1;
            }
        }
        let mut current = BTreeSet::new();
        for usage in self.planner.usage() {
            let pool = usage.pool.as_str().to_owned();
            metrics.set_pool(
                &pool,
                usage.family,
                usage.total,
                u64::try_from(usage.in_use).unwrap_or(u64::MAX),
                quarantined
                    .get(&(pool.as_str(), usage.family))
                    .copied()
                    .unwrap_or(0),
            );
            metrics.set_pool_draining(&pool, usage.family, usage.draining);
            current.insert((pool, usage.family));
        }
        for (pool, family) in self.tracked.pools.difference(&current) {
            metrics.remove_pool(pool, *family);
        }
        self.tracked.pools = current;
        metrics.set_pending(self.planner.pending());
        metrics.set_pending_by_reason(&self.planner.pending_by_reason());
        // The pool a pending Service waits on: the one its allocation failed in (a named
        // pool it asks for), else its namespace's default.
        let pool_of = |key: &ServiceKey| {
            self.planner.pool_of_service(key).map_or_else(
                || {
                    config
                        .pool_for_namespace(&key.namespace)
                        .map_or(String::new(), |(pool, _)| pool.as_str().to_owned())
                },
                |pool| pool.as_str().to_owned(),
            )
        };
        let pending: Vec<(&ServiceKey, String, &'static str)> = self
            .planner
            .pending_services()
            .map(|(key, why)| (key, pool_of(key), why))
            .collect();
        self.tracked.pending.replace(
            pending
                .iter()
                .map(|(key, pool, why)| (*key, pool.as_str(), *why)),
            observed.now,
        );
        metrics.set_pending_since(self.tracked.pending.oldest());
        metrics.set_agents_ready(observed.nodes.iter().filter(|n| n.agent_ready).count());
        metrics.set_address_conflicts(self.planner.lan_conflicts().count());

        // Failovers and unannounced Services: Services gone are forgotten, every plan of
        // the pass is compared with the one before.
        let gone =
            deleted_or_released(observed, output).filter(|key| !output.services.contains_key(*key));
        for key in gone {
            self.tracked.failovers.forget(key);
            self.tracked.unannounced.forget(key);
        }
        if observed.changes.everything {
            self.tracked
                .failovers
                .retain(|key| output.services.contains_key(key));
            self.tracked.unannounced.begin_full();
        }
        // A node left in order: its agent is ready, or released its Lease (SIGTERM).
        let mut orderly: HashSet<String> = observed
            .nodes
            .iter()
            .filter(|n| n.agent_ready)
            .map(|n| n.name.to_string())
            .collect();
        {
            let clock = self.caches.agents.lock().unwrap_or_else(|e| e.into_inner());
            orderly.extend(clock.released().map(str::to_owned));
        }
        let withheld: HashSet<IpAddr> = self.planner.lan_conflicts().map(|(ip, _)| ip).collect();
        for (key, plan) in &output.services {
            let step = self.tracked.failovers.observe(
                key,
                self.index.plans.get(key).map(|plan| &**plan),
                plan,
                |node| orderly.contains(node),
                |ip| withheld.contains(&ip),
                observed.now,
            );
            if let Some(cause) = step.started {
                metrics.inc_failover(cause);
            }
            if let Some((cause, took)) = step.done {
                metrics.observe_failover(cause, took);
            }
            let pool = self
                .planner
                .pool_of_service(key)
                .map_or("", PoolKey::as_str);
            self.tracked
                .unannounced
                .set(key, pool, unannounced_reason(plan), observed.now);
        }
        self.tracked.unannounced.end_full();
        metrics.set_unannounced(self.tracked.unannounced.counts());
        metrics.set_unannounced_since(self.tracked.unannounced.oldest());

        // Create -> IP: once per Service that had no IP (a dual-stack one gets an Event
        // per family), from its creationTimestamp on the wall clock.
        let wall = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let mut first_ip = HashSet::new();
        for event in &output.events {
            if event.reason == reason::IP_ALLOCATED {
                metrics.inc_allocations();
                if let Some(view) = self
                    .world
                    .records
                    .get(&event.service)
                    .and_then(|r| r.view.as_deref())
                    && view.observed_ips.is_empty()
                    && view.created > 0
                    && first_ip.insert(&event.service)
                {
                    #[allow(clippy::cast_precision_loss)]
                    let took = (wall - view.created as f64).max(0.0);
                    metrics.observe_create_to_ip(Duration::from_secs_f64(took));
                }
            }
        }
        for (_, ips) in &output.released {
            for _ in ips {
                metrics.inc_releases();
            }
        }
    }
}

/// Which pool config is in force, given the pool ConfigMap `cm` as the cache shows it
/// ([`ConfigState`]): `None` while no valid config was ever seen. `assigned` says whether
/// anything is assigned already; it is asked at the first look only (see
/// [`crate::pool_state`]). Publishes nothing: a change comes back as its notice, for the
/// caller to log and publish ([`Reconciler::config_notice`]).
fn config_in_force(
    state: &mut ConfigState,
    cm: Option<&ConfigMap>,
    assigned: impl FnOnce() -> bool,
) -> (Option<PoolConfig>, Option<ConfigNotice>) {
    let empty = BTreeMap::new();
    let data = cm.map(|cm| cm.data.as_ref().unwrap_or(&empty));
    let assigned = state.first_look() && assigned();
    let notice = state.observe(data, assigned);
    (state.in_force().cloned(), notice)
}

/// The Services a pass saw deleted (or no longer ours) and those whose addresses the
/// planner released (some may be planned again in the same pass).
fn deleted_or_released<'a>(
    observed: &'a PassInput,
    output: &'a PlanOutput,
) -> impl Iterator<Item = &'a ServiceKey> + 'a {
    observed
        .changes
        .services
        .iter()
        .filter(|(_, view)| view.is_none())
        .map(|(key, _)| key)
        .chain(output.released.iter().map(|(key, _)| key))
}

/// Sets each Service's observed node from our own assignment objects (see the module
/// docs), never from the annotation: a Service none of them lists has no node to keep.
pub(crate) fn import_trusted_nodes(
    views: &mut [Arc<aliaslb_core::plan::ServiceView>],
    observed: &BTreeMap<String, assignments::NodeObjects>,
) {
    if observed.is_empty() && views.iter().any(|v| v.observed_node.is_some()) {
        tracing::warn!(
            "no node assignment object yet: Services with an aliaslb.io/node annotation get their node elected afresh (the annotation is a view anyone with edit on the Service can write)"
        );
    }
    let trusted = assignments::trusted_nodes(observed);
    for view in views.iter_mut() {
        let node = assignments::trusted_node_of(&view.key, &view.observed_ips, &trusted)
            .map(str::to_owned);
        if view.observed_node != node {
            Arc::make_mut(view).observed_node = node;
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::notices::invalid_note;
    use super::*;
    use aliaslb_core::plan::ConditionPlan;

    /// An L2 plan: `ip` on `node`, no standby, with these conditions (for the tests of
    /// the reconcile modules).
    pub(crate) fn l2_plan(
        ip: &str,
        node: &str,
        allocated: ConditionPlan,
        announced: ConditionPlan,
    ) -> ServicePlan {
        ServicePlan {
            ips: vec![ip.parse().unwrap()],
            node: Some(node.into()),
            nodes: Vec::new(),
            interface: None,
            virtual_mac: false,
            standby: None,
            allocated,
            announced,
        }
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
    fn the_config_in_force_comes_back_with_its_notice_and_asks_assigned_once() {
        let mut state = ConfigState::default();
        let mut asked = 0;
        let (config, notice) = config_in_force(&mut state, None, || {
            asked += 1;
            true
        });
        assert!(
            config.is_none(),
            "deleted while assigned: nothing is planned"
        );
        assert!(matches!(notice, Some(ConfigNotice::MissingWithAssignments)));
        let cm = ConfigMap {
            data: Some(BTreeMap::from([(
                "default".to_owned(),
                "10.0.0.1-10.0.0.4\n".to_owned(),
            )])),
            ..ConfigMap::default()
        };
        let (config, notice) = config_in_force(&mut state, Some(&cm), || {
            asked += 1;
            true
        });
        assert!(config.is_some());
        assert!(matches!(
            notice,
            Some(ConfigNotice::Loaded { pools: 1, .. })
        ));
        let (config, notice) = config_in_force(&mut state, Some(&cm), || unreachable!());
        assert!(config.is_some() && notice.is_none(), "unchanged: no notice");
        assert_eq!(asked, 1, "assigned is read at the first look only");
    }
}
