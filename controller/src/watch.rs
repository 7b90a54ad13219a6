//! The controller's caches: reflectors of Services, Nodes, agent Leases, the pool
//! ConfigMap, endpoints and Namespaces (metadata only: pools may select namespaces by
//! label), each change bumping one trigger the reconcile loop waits on.
//! Does I/O (watches, discovery).
//!
//! Caches run in every replica, leader or not: a follower is ready once they synced and
//! takes over with a warm cache and an agent clock that already knows which Leases are
//! stale. Agent Lease freshness is recorded here, the moment a change arrives, on the local
//! monotonic clock ([`AgentClock`]).
//!
//! The kinds with one object per Service (Services, Endpoints / EndpointSlices) are kept
//! as compact records ([`crate::store`], [`ServiceRecord`], [`EndpointNodes`]), not as
//! objects: at 10,000 Services they were most of the controller's memory. The other
//! objects enter their caches without their `managedFields` and `kubectl apply`'s
//! last-applied copy (see `trim`): nothing reads them.
//!
//! Every watch is run by [`aliaslb_ops::watch::drive`], which resumes it after a backoff
//! delay (at most 2 s) when it fails (kube's watcher relists when the resource version
//! it resumes from is too old), and the client from [`aliaslb_ops::api::client`] notices
//! a silently dead connection within seconds (TCP keepalives), so a change made while the
//! API path was cut reaches the caches within about 3 s of the heal: see
//! [`aliaslb_ops::api`].

use std::collections::HashSet;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use aliaslb_core::plan::ServiceKey;
use aliaslb_ops::watch::{AfterError, drive};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Endpoints, Namespace, Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use kube::core::PartialObjectMeta;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, Store};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use aliaslb_core::keys;
use kube::runtime::reflector::ObjectRef;

use crate::config::ControllerConfig;
use crate::observe::agents::{AgentClock, LeaseRecord};
use crate::observe::endpoints::{self, EndpointNodes};
use crate::observe::service::ServiceRecord;
use crate::store::{self, Records};

/// Where endpoints come from: detected once at start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndpointSource {
    /// `discovery.k8s.io/v1` EndpointSlices.
    Slices,
    /// core/v1 Endpoints (servers without EndpointSlice v1, e.g. 1.20).
    Legacy,
}

/// Read handles of every cache plus the change trigger. Clones share everything.
#[derive(Clone)]
pub struct Caches {
    /// Every Service that is ours or carries our marks ([`ServiceRecord::keep`]).
    pub services: Records<ServiceRecord>,
    /// Every Node.
    pub nodes: Store<Node>,
    /// Leases of the agent namespace, as records ([`LeaseRecord`]: an agent's report read
    /// within bounds, or nothing but the name of an agent Lease whose Node does not exist).
    pub leases: Records<LeaseRecord>,
    /// The pool ConfigMap (zero or one object).
    pub configmap: Store<ConfigMap>,
    /// The node assignments we wrote (ConfigMaps labelled
    /// [`aliaslb_core::keys::LABEL_ASSIGNMENTS`] in the controller namespace).
    pub assignments: Store<ConfigMap>,
    /// Nodes with ready endpoints, per endpoints object (for `externalTrafficPolicy:
    /// Local`), read from [`Caches::endpoint_source`].
    pub endpoints: Records<EndpointNodes>,
    /// Where [`Caches::endpoints`] come from.
    pub endpoint_source: EndpointSource,
    /// The Service ClusterIP ranges (`networking.k8s.io/v1` ServiceCIDRs, GA in 1.33), or
    /// `None` where the server does not serve them.
    pub service_cidrs: Option<Store<ServiceCIDR>>,
    /// Every Namespace's metadata (for pools that select namespaces by label).
    pub namespaces: Store<PartialObjectMeta<Namespace>>,
    /// Bumped on every change of [`Caches::namespaces`]: the loop reads the labels again
    /// only when it moved.
    pub namespace_changes: Arc<AtomicU64>,
    /// Agent freshness, updated as Lease changes arrive.
    pub agents: Arc<Mutex<AgentClock>>,
    /// The Services and endpoints changed since the reconcile loop last looked
    /// ([`Caches::take_dirty`]).
    dirty: Arc<Mutex<Dirty>>,
    /// Bumped on every change of any cache.
    pub changes: watch::Receiver<u64>,
    _tasks: Arc<Tasks>,
}

impl fmt::Debug for Caches {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Caches")
            .field("services", &self.services.len())
            .field("nodes", &self.nodes.len())
            .field("leases", &self.leases.len())
            .field("endpoints", &self.endpoints.len())
            .field("endpoint_source", &self.endpoint_source)
            .finish_non_exhaustive()
    }
}

/// The watch tasks; aborted when the last [`Caches`] clone is dropped.
struct Tasks(Vec<JoinHandle<()>>);

impl Drop for Tasks {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

/// What changed in the caches with one object per Service (Services, endpoints) since
/// the reconcile loop last took it: the loop re-reads those keys only, not every record.
/// The other caches hold one object per node or fewer, and the loop compares them whole.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Dirty {
    /// A (re)list replaced one of these caches: any key may have changed.
    pub everything: bool,
    /// Services whose record may have changed (added, modified, deleted).
    pub services: HashSet<ServiceKey>,
    /// Services whose endpoints may have changed.
    pub endpoints: HashSet<ServiceKey>,
}

/// Where a cache notes its changes: the shared [`Dirty`], which of its sets, and the
/// Service an object belongs to.
struct Notes<K> {
    dirty: Arc<Mutex<Dirty>>,
    kind: DirtyKind,
    key: fn(&K) -> Option<ServiceKey>,
}

/// Which set of [`Dirty`] a cache's changes go to.
#[derive(Debug, Clone, Copy)]
enum DirtyKind {
    Services,
    Endpoints,
}

impl Dirty {
    /// Records one watch event of a cache of `kind`; `key` names the Service of an object.
    fn note<K>(
        &mut self,
        kind: DirtyKind,
        event: &Event<K>,
        key: impl Fn(&K) -> Option<ServiceKey>,
    ) {
        let object = match event {
            Event::Apply(object) | Event::Delete(object) => object,
            // The relist's contents replace the cache at once, on `InitDone`.
            Event::InitDone => {
                self.everything = true;
                return;
            }
            Event::Init | Event::InitApply(_) => return,
        };
        if let Some(key) = key(object) {
            match kind {
                DirtyKind::Services => self.services.insert(key),
                DirtyKind::Endpoints => self.endpoints.insert(key),
            };
        }
    }
}

/// Why the caches could not start or sync.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    /// A watch task ended before its cache synced.
    #[error("the {0} watch stopped before its cache synced")]
    Stopped(&'static str),
}

impl Caches {
    /// Detects the endpoint API and starts every watch. Returns at once; see
    /// [`Caches::synced`].
    pub async fn start(client: &Client, config: &ControllerConfig) -> Caches {
        let (tx, changes) = watch::channel(0u64);
        let tx = Arc::new(tx);
        let mut tasks = Vec::new();
        let agents = Arc::new(Mutex::new(AgentClock::new(config.agent_lease_duration)));
        let dirty = Arc::new(Mutex::new(Dirty::default()));

        let classes = config.clone();
        let services = spawn_records(
            &mut tasks,
            "Service",
            Api::<Service>::all(client.clone()),
            tx.clone(),
            move |svc| ServiceRecord::keep(svc, &classes),
            Notes {
                dirty: dirty.clone(),
                kind: DirtyKind::Services,
                key: crate::observe::service::service_key,
            },
        );
        // The Lease cache, once made: a deleted Node's agent Lease is dropped to its name.
        let lease_cache: Arc<std::sync::OnceLock<Records<LeaseRecord>>> = Arc::default();
        let deleted = (
            lease_cache.clone(),
            agents.clone(),
            config.agent_namespace.clone(),
        );
        // The Node list complete (kube's `Store::wait_until_ready` wakes only one of two
        // tasks waiting at once, and `synced` waits too).
        let (nodes_listed, nodes_ready) = watch::channel(false);
        let nodes = spawn(
            &mut tasks,
            "Node",
            Api::<Node>::all(client.clone()),
            watcher::Config::default(),
            tx.clone(),
            move |event| {
                if matches!(event, Event::InitDone) {
                    nodes_listed.send_replace(true);
                }
                if let Event::Delete(node) = event
                    && let (Some(cache), Some(name)) =
                        (deleted.0.get(), node.metadata.name.as_deref())
                {
                    let key = ServiceKey::new(&deleted.2, &keys::agent_lease_name(name));
                    forget_agent(cache, &deleted.1, &key);
                }
                true
            },
        );
        let leases = spawn_leases(
            &mut tasks,
            Api::<Lease>::namespaced(client.clone(), &config.agent_namespace),
            (nodes.clone(), nodes_ready),
            agents.clone(),
            tx.clone(),
        );
        let _ = lease_cache.set(leases.clone());
        let configmap = spawn(
            &mut tasks,
            "ConfigMap",
            Api::<ConfigMap>::namespaced(client.clone(), &config.namespace),
            watcher::Config::default().fields(&format!("metadata.name={}", config.pool_configmap)),
            tx.clone(),
            |_| true,
        );
        let assignments = spawn(
            &mut tasks,
            "assignment ConfigMap",
            Api::<ConfigMap>::namespaced(client.clone(), &config.namespace),
            watcher::Config::default().labels(aliaslb_core::keys::LABEL_ASSIGNMENTS),
            tx.clone(),
            |_| true,
        );
        let (endpoint_source, endpoints) = if serves_endpoint_slices(client).await {
            let records = spawn_records(
                &mut tasks,
                "EndpointSlice",
                Api::<EndpointSlice>::all(client.clone()),
                tx.clone(),
                endpoints::slice_nodes,
                Notes {
                    dirty: dirty.clone(),
                    kind: DirtyKind::Endpoints,
                    key: endpoints::slice_service,
                },
            );
            (EndpointSource::Slices, records)
        } else {
            let records = spawn_records(
                &mut tasks,
                "Endpoints",
                Api::<Endpoints>::all(client.clone()),
                tx.clone(),
                endpoints::endpoints_nodes,
                Notes {
                    dirty: dirty.clone(),
                    kind: DirtyKind::Endpoints,
                    key: endpoints::endpoints_service,
                },
            );
            (EndpointSource::Legacy, records)
        };
        tracing::info!(source = ?endpoint_source, "endpoints for externalTrafficPolicy: Local");
        let namespace_changes = Arc::new(AtomicU64::new(0));
        let namespaces = {
            let (reader, mut writer) = reflector::store();
            // Metadata only: the labels are all a pool reads.
            let api = Api::<PartialObjectMeta<Namespace>>::all(client.clone());
            let changes = namespace_changes.clone();
            spawn_driver(
                &mut tasks,
                "Namespace",
                move || watcher::watcher(api.clone(), watcher::Config::default()).modify(trim),
                tx.clone(),
                move |event| {
                    writer.apply_watcher_event(event);
                    if !matches!(event, Event::Init | Event::InitApply(_)) {
                        changes.fetch_add(1, Ordering::Relaxed);
                    }
                    true
                },
            );
            reader
        };
        let service_cidrs = if serves(client, "networking.k8s.io/v1", "servicecidrs").await {
            Some(spawn(
                &mut tasks,
                "ServiceCIDR",
                Api::<ServiceCIDR>::all(client.clone()),
                watcher::Config::default(),
                tx.clone(),
                |_| true,
            ))
        } else {
            tracing::warn!(
                "networking.k8s.io/v1 ServiceCIDRs not served (Kubernetes before 1.33, or the API disabled): pool addresses in the Service ClusterIP range are not detected; keep the pools out of it (--service-cluster-ip-range)"
            );
            None
        };
        Caches {
            services,
            nodes,
            leases,
            configmap,
            assignments,
            endpoints,
            endpoint_source,
            service_cidrs,
            namespaces,
            namespace_changes,
            agents,
            dirty,
            changes,
            _tasks: Arc::new(Tasks(tasks)),
        }
    }

    /// Takes what changed in the Service and endpoint caches since the last call (see
    /// [`Dirty`]); the caches start over with nothing changed.
    pub fn take_dirty(&self) -> Dirty {
        std::mem::take(&mut *self.dirty.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Resolves once every cache holds a complete first list.
    pub async fn synced(&self) -> Result<(), WatchError> {
        let wait = |ready: Result<(), reflector::store::WriterDropped>, what| {
            ready.map_err(|_| WatchError::Stopped(what))
        };
        let wait_records = |ready: Result<(), store::WriterDropped>, what| {
            ready.map_err(|_| WatchError::Stopped(what))
        };
        wait_records(self.services.wait_until_ready().await, "Service")?;
        wait(self.nodes.wait_until_ready().await, "Node")?;
        wait_records(self.leases.wait_until_ready().await, "Lease")?;
        wait(self.configmap.wait_until_ready().await, "ConfigMap")?;
        wait(
            self.assignments.wait_until_ready().await,
            "assignment ConfigMap",
        )?;
        let endpoints = match self.endpoint_source {
            EndpointSource::Slices => "EndpointSlice",
            EndpointSource::Legacy => "Endpoints",
        };
        wait_records(self.endpoints.wait_until_ready().await, endpoints)?;
        // Optional too: an old ClusterRole without namespaces list/watch must not keep the
        // controller from starting; pools that select namespaces by label then grant
        // nothing by label (what Services hold there stays theirs).
        match tokio::time::timeout(OPTIONAL_SYNC, self.namespaces.wait_until_ready()).await {
            Ok(ready) => wait(ready, "Namespace")?,
            Err(_) => tracing::warn!(
                "the Namespace cache did not sync within 10 s (RBAC: namespaces list/watch?); pools with a namespaceSelector grant no namespace until it does"
            ),
        }
        if let Some(cidrs) = &self.service_cidrs {
            // Optional: a controller whose RBAC lacks servicecidrs (an old ClusterRole) must
            // still start; it then plans without the ranges until the cache syncs.
            match tokio::time::timeout(OPTIONAL_SYNC, cidrs.wait_until_ready()).await {
                Ok(ready) => wait(ready, "ServiceCIDR")?,
                Err(_) => tracing::warn!(
                    "the ServiceCIDR cache did not sync within 10 s (RBAC: servicecidrs get/list/watch?); planning without the Service ClusterIP ranges until it does"
                ),
            }
        }
        tracing::info!(
            services = self.services.len(),
            nodes = self.nodes.len(),
            leases = self.leases.len(),
            "caches synced"
        );
        Ok(())
    }
}

/// How long the caches' first sync waits for each optional cache (ServiceCIDRs,
/// Namespaces).
const OPTIONAL_SYNC: std::time::Duration = std::time::Duration::from_secs(10);

/// Whether the server serves `discovery.k8s.io/v1` EndpointSlices.
async fn serves_endpoint_slices(client: &Client) -> bool {
    let served = serves(client, "discovery.k8s.io/v1", "endpointslices").await;
    if !served {
        tracing::info!(
            "discovery.k8s.io/v1 EndpointSlices not served: falling back to core/v1 Endpoints"
        );
    }
    served
}

/// Whether the server serves `resource` in API group version `group_version`.
async fn serves(client: &Client, group_version: &str, resource: &str) -> bool {
    match client.list_api_group_resources(group_version).await {
        Ok(list) => list.resources.iter().any(|r| r.name == resource),
        Err(error) => {
            tracing::debug!(error = %error, group_version, "API group version not served");
            false
        }
    }
}

/// The Service ClusterIP ranges the ServiceCIDRs of `store` name (a range that does not
/// parse is left out: the apiserver validates them).
pub fn service_ranges(store: Option<&Store<ServiceCIDR>>) -> Vec<ipnet::IpNet> {
    let cidrs = store.map(Store::state).unwrap_or_default();
    crate::observe::nodes::service_ranges(cidrs.iter().map(|sc| &**sc))
}

/// Starts the watch of the agent namespace's Leases into a cache of [`LeaseRecord`]s, once
/// the Node cache holds a complete list (`nodes`, and the flag its watch raises then: a
/// Lease is an agent's only if its Node exists):
/// never the Lease objects themselves, and only the name of an agent Lease whose Node does
/// not exist. Each change goes to the agent clock too ([`record_lease`]). The list is read
/// in pages of [`LEASE_PAGE`]: at 256 KiB a report, kube's default page of 500 Leases was
/// 125 MiB of JSON at once (10: the controller's peak with 600 Leases at the bound is 24.5
/// MiB, 66.6 MiB with pages of 50; BENCHMARKS, "Agent reports at their bounds").
fn spawn_leases(
    tasks: &mut Vec<JoinHandle<()>>,
    api: Api<Lease>,
    (nodes, mut nodes_ready): (Store<Node>, watch::Receiver<bool>),
    clock: Arc<Mutex<AgentClock>>,
    tx: Arc<watch::Sender<u64>>,
) -> Records<LeaseRecord> {
    let exists = {
        let nodes = nodes.clone();
        move |node: &str| nodes.get(&ObjectRef::new(node)).is_some()
    };
    // The records so far, for the keep function: an unchanged report is not read again.
    let so_far: Arc<std::sync::OnceLock<Records<LeaseRecord>>> = Arc::default();
    let previous = so_far.clone();
    let keep_exists = exists.clone();
    let (reader, mut writer) = store::records(move |lease: &Lease| {
        let old = previous.get().and_then(|r| r.get(&lease_key(lease)?));
        LeaseRecord::of(lease, &keep_exists, old.as_deref())
    });
    let _ = so_far.set(reader.clone());
    let config = watcher::Config::default().page_size(LEASE_PAGE);
    let make = move || watcher::watcher(api.clone(), config.clone()).modify(trim);
    let on_event = move |event: &Event<Lease>| {
        let changed = writer.apply(event);
        let clock_news = record_lease(&clock, event, &exists);
        changed || clock_news
    };
    let ready = async move {
        // Without a Node list, every agent Lease would look like a ghost.
        let _ = nodes_ready.wait_for(|listed| *listed).await;
    };
    spawn_driver_after(tasks, "Lease", ready, make, tx, on_event);
    reader
}

/// Leases per page of the Lease list (see [`spawn_leases`]).
const LEASE_PAGE: u32 = 10;

/// The cache key of a Lease: namespace and name.
fn lease_key(lease: &Lease) -> Option<ServiceKey> {
    Some(ServiceKey::new(
        lease.metadata.namespace.as_deref().unwrap_or_default(),
        lease.metadata.name.as_deref()?,
    ))
}

/// A Node was deleted: its agent's Lease record keeps only its name, and the clock forgets
/// it.
fn forget_agent(cache: &Records<LeaseRecord>, clock: &Mutex<AgentClock>, key: &ServiceKey) {
    if cache.update(key, LeaseRecord::ghost) {
        clock
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .forget(&key.name);
    }
}

/// Records agent Lease changes on the local clock as they arrive; returns whether the
/// change is worth a pass: not a renewal that changes nothing ([`AgentClock::observe`]).
/// The Lease of a node that does not exist (`exists`) is no agent's: the clock forgets it.
fn record_lease(
    clock: &Mutex<AgentClock>,
    event: &Event<Lease>,
    exists: impl Fn(&str) -> bool,
) -> bool {
    let now = std::time::Instant::now();
    let mut clock = clock.lock().unwrap_or_else(|e| e.into_inner());
    let ghost = |lease: &Lease| {
        let name = lease.metadata.name.as_deref().unwrap_or_default();
        keys::agent_lease_node(name)
            .filter(|node| !exists(node))
            .map(|_| name.to_owned())
    };
    match event {
        Event::Apply(lease) | Event::InitApply(lease) if let Some(name) = ghost(lease) => {
            clock.forget(&name)
        }
        Event::Apply(lease) => clock.observe(lease, now),
        Event::InitApply(lease) => {
            clock.observe(lease, now);
            true
        }
        Event::Delete(lease) => {
            if let Some(name) = lease.metadata.name.as_deref() {
                clock.remove(name);
            }
            true
        }
        Event::Init => {
            clock.relist();
            true
        }
        Event::InitDone => {
            clock.relisted();
            true
        }
    }
}

/// The annotation `kubectl apply` (client side) keeps the whole last applied object in.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Drops what the controller never reads before an object enters a cache: its
/// `managedFields` (a JSON tree per writer, several times the size of the rest of a
/// Service) and `kubectl apply`'s copy of the object. The caches hold every Service of
/// the cluster, so this is most of the controller's memory.
fn trim<K: Resource>(object: &mut K) {
    let meta = object.meta_mut();
    meta.managed_fields = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove(LAST_APPLIED);
    }
}

/// Starts one reflector: objects are [`trim`]med, every event goes to the cache and to
/// `on_event`, then bumps `tx` when `on_event` says the event is worth a pass.
fn spawn<K>(
    tasks: &mut Vec<JoinHandle<()>>,
    kind: &'static str,
    api: Api<K>,
    config: watcher::Config,
    tx: Arc<watch::Sender<u64>>,
    on_event: impl Fn(&Event<K>) -> bool + Send + 'static,
) -> Store<K>
where
    K: Resource + Clone + DeserializeOwned + fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
{
    let (reader, mut writer) = reflector::store();
    spawn_driver(
        tasks,
        kind,
        move || watcher::watcher(api.clone(), config.clone()).modify(trim),
        tx,
        move |event| {
            // What `reflector::reflector` does for a store that is not shared.
            writer.apply_watcher_event(event);
            on_event(event)
        },
    );
    reader
}

/// Starts one watch feeding a [`Records`] cache of `keep(object)`, noting every change
/// in `notes` (under the Service its key gives) after the cache has it, then bumping
/// `tx`.
fn spawn_records<K, T>(
    tasks: &mut Vec<JoinHandle<()>>,
    kind: &'static str,
    api: Api<K>,
    tx: Arc<watch::Sender<u64>>,
    keep: impl Fn(&K) -> Option<T> + Send + Sync + 'static,
    notes: Notes<K>,
) -> Records<T>
where
    K: Resource + Clone + DeserializeOwned + fmt::Debug + Send + Sync + 'static,
    T: store::Record + Send + Sync + 'static,
{
    let (reader, mut writer) = store::records(keep);
    spawn_driver(
        tasks,
        kind,
        move || watcher::watcher(api.clone(), watcher::Config::default()),
        tx,
        move |event| {
            // An object this cache does not keep and did not (a Service of another class
            // that never was ours) is worth no pass: its changes cost nothing.
            let changed = writer.apply(event);
            if changed {
                notes
                    .dirty
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .note(notes.kind, event, notes.key);
            }
            changed
        },
    );
    reader
}

/// Spawns the watch driver of `kind` over the streams `make` returns (resumed after an
/// error): each event goes to `apply`, which brings its cache up to date and says whether
/// a pass is worth it, then bumps `tx` ([`bump`]).
fn spawn_driver<K, S>(
    tasks: &mut Vec<JoinHandle<()>>,
    kind: &'static str,
    make: impl FnMut() -> S + Send + 'static,
    tx: Arc<watch::Sender<u64>>,
    apply: impl FnMut(&Event<K>) -> bool + Send + 'static,
) where
    K: Send + 'static,
    S: futures::Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static,
{
    spawn_driver_after(tasks, kind, std::future::ready(()), make, tx, apply);
}

/// [`spawn_driver`], the watch starting once `ready` resolves.
fn spawn_driver_after<K, S>(
    tasks: &mut Vec<JoinHandle<()>>,
    kind: &'static str,
    ready: impl std::future::Future<Output = ()> + Send + 'static,
    make: impl FnMut() -> S + Send + 'static,
    tx: Arc<watch::Sender<u64>>,
    mut apply: impl FnMut(&Event<K>) -> bool + Send + 'static,
) where
    K: Send + 'static,
    S: futures::Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static,
{
    let on_event = move |event: Event<K>| {
        let worth_a_pass = apply(&event);
        bump(&tx, &event, worth_a_pass);
    };
    tasks.push(tokio::spawn(async move {
        ready.await;
        drive(kind, make, AfterError::Resume, on_event).await;
    }));
}

/// Bumps the change trigger after `event` reached its cache, when it is `worth_a_pass`
/// and not `Init` (a relist starts: nothing changed yet).
fn bump<K>(tx: &watch::Sender<u64>, event: &Event<K>, worth_a_pass: bool) {
    if worth_a_pass && !matches!(event, Event::Init) {
        tx.send_modify(|n| *n = n.wrapping_add(1));
    }
}
