//! The writer: the only caller of the API writes of the reconcile loop. It turns a pass's
//! plan into jobs (where desired differs from observed and no write of ours is pending),
//! executes them ([`MAX_IN_FLIGHT`] at once, each behind the leader fence and a timeout),
//! settles their outcomes into its memo, backoff and refusals, and writes the node
//! assignments. Does I/O.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use aliaslb_core::assignment::NodeAssignments;
use aliaslb_core::plan::{ServiceKey, ServicePlan};
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::Api;

use crate::context::Context;
use crate::fence::ApplyError;
use crate::observe::service::{ServiceRecord, digest};
use crate::reconcile::MAX_IN_FLIGHT;
use crate::write::assignments::{self, NodeObjects, ObjectData, Round, ShardsOf};
use crate::write::services::{self, ServiceWriter};

/// First retry step after a transient write failure; doubles up to [`MAX_BACKOFF`].
const BASE_BACKOFF: Duration = Duration::from_millis(200);
/// Longest retry delay (the last step).
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// Versions remembered per Service (see the module docs).
const KNOWN_VERSIONS: usize = 8;
/// The most Service writes one pass makes; the Services left over are examined first by
/// the next pass, which follows at once ([`Writes::jobs`]). A pass that would write
/// thousands (a first convergence, a pool change) then writes them in slices of this size,
/// and each slice is planned with what the agents reported meanwhile: the node
/// assignments are written first, so most Services get their IP and `Announced=True` in
/// one status write instead of two. It also bounds how long a pass keeps the loop from
/// seeing new changes (16 rounds of [`MAX_IN_FLIGHT`] writes).
pub(crate) const PASS_WRITES: usize = 16 * MAX_IN_FLIGHT;

/// Retry state after transient failures of one write.
#[derive(Debug)]
struct Backoff {
    failures: u32,
    next: Instant,
    delays: aliaslb_ops::backoff::Backoff,
}

/// The one retry policy of every write (a Service's, a node assignment's): after the n-th
/// transient failure in a row the write waits a delay drawn from `[D/2, D]`, with
/// `D` = [`BASE_BACKOFF`] x 2^(n-1), at most [`MAX_BACKOFF`] (equal jitter,
/// [`aliaslb_ops::backoff`]: the writes that one API server outage failed together are
/// not retried together); a success, or a failure that is not retried, forgets it.
#[derive(Debug)]
struct Retries<K> {
    due: HashMap<K, Backoff>,
    /// Tests: the jitter of the n-th key to fail is drawn from `seed + n`.
    seed: Option<u64>,
}

impl<K: std::hash::Hash + Eq + Clone> Retries<K> {
    fn new() -> Self {
        Retries {
            due: HashMap::new(),
            seed: None,
        }
    }

    /// Records a transient failure of `key` at `now`; returns how many in a row and the
    /// delay before its retry.
    fn failed(&mut self, key: K, now: Instant) -> (u32, Duration) {
        let seed = &mut self.seed;
        let backoff = self.due.entry(key).or_insert_with(|| Backoff {
            failures: 0,
            next: now,
            delays: match seed {
                Some(seed) => {
                    *seed += 1;
                    aliaslb_ops::backoff::Backoff::seeded(BASE_BACKOFF, MAX_BACKOFF, *seed)
                }
                None => aliaslb_ops::backoff::Backoff::new(BASE_BACKOFF, MAX_BACKOFF),
            },
        });
        let delay = backoff.delays.next_delay();
        backoff.failures += 1;
        backoff.next = now + delay;
        (backoff.failures, delay)
    }

    /// Forgets `key`: its write succeeded, or is not retried.
    fn forget(&mut self, key: &K) {
        self.due.remove(key);
    }

    /// Whether `key` waits for its retry at `now`.
    fn waiting(&self, key: &K, now: Instant) -> bool {
        self.due.get(key).is_some_and(|b| b.next > now)
    }

    /// The keys whose retry is due at `now`.
    fn due(&self, now: Instant) -> Vec<K> {
        self.due
            .iter()
            .filter(|(_, b)| b.next <= now)
            .map(|(key, _)| key.clone())
            .collect()
    }

    /// When the next retry is due, if any.
    fn next(&self) -> Option<Instant> {
        self.due.values().map(|b| b.next).min()
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
pub(crate) enum Job<'a> {
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
pub(crate) struct Done {
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

/// One assignment object to write.
struct ObjectWrite {
    node: String,
    name: String,
    data: ObjectData,
    /// Its resourceVersion in the cache (`None`: not there).
    version: Option<String>,
}

/// The write side of one leadership term, with what it remembers between passes.
pub(crate) struct Writes {
    ctx: Arc<Context>,
    writer: ServiceWriter,
    memos: HashMap<ServiceKey, Memo>,
    backoff: Retries<ServiceKey>,
    /// uids of foreign Services already cleaned up.
    cleared: HashSet<Arc<str>>,
    /// Services whose last write the API server refused as invalid (422), with the
    /// [`attempt_key`] of that write: not retried while it stays the same.
    refused: HashMap<ServiceKey, u64>,
    /// The node assignment objects written and not yet seen in the cache, by name: digest
    /// of the data and the versions before and after our write.
    assign_memo: HashMap<String, (u64, [Option<String>; 2])>,
    /// Assignment object writes the API server refused, by name (digest of the data,
    /// version of the object): not made again until one of them changes.
    assign_refused: HashMap<String, (u64, Option<String>)>,
    /// When failed assignment writes are retried, per node (the same policy as the
    /// Services').
    assign_retry: Retries<String>,
    /// The shard count of each node's index as we last wrote it: the cache may still show
    /// a lower one, and a count is never lowered, so the higher of the two is in force.
    shard_counts: HashMap<String, u32>,
    /// Services the last pass examined but left for the next one (more than
    /// [`PASS_WRITES`] writes were due), in the order they are to be written.
    deferred: Vec<ServiceKey>,
}

impl Writes {
    /// A writer that knows nothing yet; `ip_mode` from [`services::version_has_ip_mode`].
    pub(crate) fn new(ctx: Arc<Context>, ip_mode: bool) -> Self {
        Writes {
            ctx,
            writer: ServiceWriter::new(ip_mode),
            memos: HashMap::new(),
            backoff: Retries::new(),
            cleared: HashSet::new(),
            refused: HashMap::new(),
            assign_memo: HashMap::new(),
            assign_retry: Retries::new(),
            assign_refused: HashMap::new(),
            shard_counts: HashMap::new(),
            deferred: Vec::new(),
        }
    }

    /// The Services the last pass left for this one, in order (see [`PASS_WRITES`]); they
    /// are given back by [`Writes::jobs`] if there are still too many.
    pub(crate) fn take_deferred(&mut self) -> Vec<ServiceKey> {
        std::mem::take(&mut self.deferred)
    }

    /// How many Services wait for the next pass; that pass is due at once when any do.
    pub(crate) fn deferred(&self) -> usize {
        self.deferred.len()
    }

    /// Forgets the memos and refusals of Services not in `present` (deleted). (A retry
    /// forgets itself: a deleted Service's write is skipped.)
    pub(crate) fn forget_gone<V>(&mut self, present: &HashMap<ServiceKey, V>) {
        self.memos.retain(|k, _| present.contains_key(k));
        self.refused.retain(|k, _| present.contains_key(k));
    }

    /// Forgets what was remembered of the Service `key` (deleted, or no longer ours).
    pub(crate) fn forget(&mut self, key: &ServiceKey) {
        self.memos.remove(key);
        self.refused.remove(key);
    }

    /// The writes that failed and have not succeeded since: Services (waiting for a retry,
    /// or refused until they change) and node assignments (nodes waiting for a retry, and
    /// objects refused until their data changes). For `aliaslb_writes_failing`.
    pub(crate) fn failing(&self) -> (usize, usize) {
        (
            self.backoff.due.len() + self.refused.len(),
            self.assign_retry.due.len() + self.assign_refused.len(),
        )
    }

    /// The Services whose failed write is due for a retry at `now`.
    pub(crate) fn retries(&self, now: Instant) -> Vec<ServiceKey> {
        self.backoff.due(now)
    }

    /// The nodes whose failed assignment write is due for a retry at `now`.
    pub(crate) fn assignment_retries(&self, now: Instant) -> Vec<String> {
        self.assign_retry.due(now)
    }

    /// When the next retry of a failed write is due, if any.
    pub(crate) fn next_retry(&self) -> Option<Instant> {
        self.backoff
            .next()
            .into_iter()
            .chain(self.assign_retry.next())
            .min()
    }

    /// Writes every node assignment object whose data differs from what the cache shows
    /// (and that we did not just write: the cache lags behind our writes), round by round
    /// ([`Round`]): a node's writes of a round wait until its writes of the rounds before
    /// are done, so its agent never reads a count whose shards are not written yet. A node
    /// with nothing assigned gets empty lists and the node MACs.
    ///
    /// `nodes.0` are the nodes to look at, `desired` gives one node's assignment (with the
    /// node MACs), built one node at a time so a pass holds one node's lines, not every
    /// node's (a first pass at 10,000 Services held 8 MiB of them). A node that carries
    /// nothing and has no objects is left alone, unless it is one of `nodes.1`, owed an
    /// object (its agent holds addresses we did not give it). `versions` is the
    /// resourceVersion of each assignment object in the cache, by name.
    pub(crate) async fn write_assignments(
        &mut self,
        versions: HashMap<String, Option<String>>,
        (nodes, owed): (&BTreeSet<String>, &BTreeSet<String>),
        lines: &BTreeMap<String, BTreeSet<IpAddr>>,
        mut desired: impl FnMut(&str, Option<&ShardsOf>) -> NodeAssignments,
        observed: BTreeMap<String, NodeObjects>,
        now: Instant,
    ) {
        let no_objects = NodeObjects::new();
        let mut rounds: BTreeMap<Round, Vec<ObjectWrite>> = BTreeMap::new();
        // Nodes a write of which cannot be made now (refused, or waiting for its retry):
        // none of their later rounds is written.
        let mut blocked: HashMap<String, Round> = HashMap::new();
        for node in nodes {
            if self.assign_retry.waiting(node, now) {
                continue;
            }
            let written = self.shard_counts.get(node).copied().unwrap_or(0);
            let objects = match observed.get(node) {
                // The lines of `ips` alone changed, in a node already sharded: their shards
                // (and the index), unless they outgrow the count.
                Some(seen) if let Some(ips) = lines.get(node) => {
                    let in_force = assignments::count_in_force(node, seen).max(written);
                    let only = ShardsOf::new(ips.iter().copied(), in_force);
                    (in_force > 0)
                        .then(|| {
                            assignments::render_shards(node, &desired(node, Some(&only)), &only)
                        })
                        .flatten()
                }
                _ => None,
            };
            let seen = observed.get(node);
            let objects = match objects {
                Some(objects) => objects,
                None => {
                    let want = desired(node, None);
                    // A relay has no line but its peers to list.
                    if want.is_empty()
                        && want.peers.is_empty()
                        && seen.is_none()
                        && !owed.contains(node)
                    {
                        continue;
                    }
                    let seen = seen.unwrap_or(&no_objects);
                    let in_force = assignments::count_in_force(node, seen).max(written);
                    assignments::render_node(node, &want, in_force)
                }
            };
            let seen = seen.unwrap_or(&no_objects);
            let grows = objects.iter().any(|(_, _, r)| *r == Round::NewShard);
            let mut pending = false;
            for (name, data, round) in objects {
                let round = if round == Round::Index
                    && !grows
                    && data.shards.is_some()
                    && assignments::brings_forward(seen.get(&name), &data)
                {
                    Round::Forwards
                } else {
                    round
                };
                if seen.get(&name) == Some(&data) {
                    self.assign_memo.remove(&name);
                    self.assign_refused.remove(&name);
                    continue;
                }
                let version = versions.get(&name).cloned().flatten();
                let written = digest(&data);
                if self.assign_refused.get(&name) == Some(&(written, version.clone())) {
                    let first = blocked.entry(node.clone()).or_insert(round);
                    *first = (*first).min(round);
                    pending = true;
                    continue;
                }
                // The same data was just written over this version: the cache has not
                // caught up yet. A missing object (no version) is always written.
                if version.is_some()
                    && let Some((memo, seen)) = self.assign_memo.get(&name)
                    && *memo == written
                    && seen.contains(&version)
                {
                    continue;
                }
                pending = true;
                rounds.entry(round).or_default().push(ObjectWrite {
                    node: node.clone(),
                    name,
                    data,
                    version,
                });
            }
            if !pending {
                self.assign_retry.forget(node);
            }
        }
        let api = Api::<ConfigMap>::namespaced(self.ctx.client.clone(), &self.ctx.config.namespace);
        for (round, writes) in rounds {
            let writes: Vec<ObjectWrite> = writes
                .into_iter()
                .filter(|w| blocked.get(&w.node).is_none_or(|first| *first >= round))
                .collect();
            for (write, result) in self.run_object_writes(&api, writes).await {
                self.settle_object_write(write, result, round, now, &mut blocked);
            }
        }
    }

    /// Whether `version` of assignment object `name` is the one the last write of ours to
    /// it returned (the cache showing our own write).
    pub(crate) fn wrote(&self, name: &str, version: &Option<String>) -> bool {
        version.is_some()
            && self
                .assign_memo
                .get(name)
                .is_some_and(|(_, [_, after])| after == version)
    }

    /// Runs assignment object writes, [`MAX_IN_FLIGHT`] at once.
    async fn run_object_writes(
        &self,
        api: &Api<ConfigMap>,
        writes: Vec<ObjectWrite>,
    ) -> Vec<(ObjectWrite, Result<ConfigMap, ApplyError>)> {
        let namespace = &self.ctx.config.namespace;
        let leader = &self.ctx.leader;
        futures::stream::iter(writes)
            .map(|write| async move {
                let result = assignments::apply(
                    api,
                    namespace,
                    &write.node,
                    &write.name,
                    &write.data,
                    || leader.write_deadline(),
                )
                .await;
                (write, result)
            })
            .buffer_unordered(MAX_IN_FLIGHT)
            .collect()
            .await
    }

    /// Remembers the outcome of one assignment object write of `round`; a node whose write
    /// did not succeed is `blocked` from the later rounds of this pass.
    fn settle_object_write(
        &mut self,
        write: ObjectWrite,
        result: Result<ConfigMap, ApplyError>,
        round: Round,
        now: Instant,
        blocked: &mut HashMap<String, Round>,
    ) {
        let ObjectWrite {
            node,
            name,
            data,
            version,
        } = write;
        match result {
            Ok(written) => {
                self.assign_refused.remove(&name);
                self.assign_retry.forget(&node);
                tracing::info!(
                    node,
                    object = name,
                    ips = data.ips.lines().count(),
                    "node assignment written"
                );
                if let Some(count) = data.shards.as_deref().and_then(|c| c.parse().ok()) {
                    let known = self.shard_counts.entry(node.clone()).or_insert(0);
                    *known = (*known).max(count);
                }
                let after = written.metadata.resource_version;
                self.assign_memo
                    .insert(name, (digest(&data), [version, after]));
            }
            Err(error) => {
                blocked.entry(node.clone()).or_insert(round);
                self.ctx.metrics.inc_reconcile_error(error.category());
                if error.is_transient() {
                    let (failures, retry_in) = self.assign_retry.failed(node.clone(), now);
                    tracing::warn!(node, object = name, failures, ?retry_in, error = %error, "node assignment write failed; retrying");
                } else if error.category() != "not_leader" {
                    self.assign_retry.forget(&node);
                    // Refused (e.g. 422: over the object size limit; 403: RBAC): not made
                    // again until the data or the object changes.
                    tracing::error!(node, object = name, error = %error, "node assignment write refused: this node's agent does not see the change");
                    self.assign_refused.insert(name, (digest(&data), version));
                }
            }
        }
    }

    /// The writes this pass needs: for each Service of `plans` (the ones the pass looks
    /// at, with their plans, in the order they are to be written) whatever differs from
    /// its record in `records`, and the cleanup of every one of `strangers` (not ours, our
    /// marks) not cleaned up yet. Once [`PASS_WRITES`] Services have a write, the rest of
    /// `plans` is not examined: it is deferred to the next pass ([`Writes::take_deferred`]).
    pub(crate) fn jobs<'a>(
        &mut self,
        plans: impl IntoIterator<Item = (&'a ServiceKey, &'a ServicePlan)>,
        records: &HashMap<ServiceKey, Arc<ServiceRecord>>,
        strangers: &BTreeMap<ServiceKey, Arc<ServiceRecord>>,
        now: Instant,
    ) -> Vec<Job<'a>> {
        let ip_mode = self.writer.ip_mode();
        let mut jobs = Vec::new();
        if !self.refused.is_empty() {
            self.refused.retain(|key, _| records.contains_key(key));
        }
        let mut plans = plans.into_iter();
        while let Some((key, plan)) = plans.next() {
            if jobs.len() == PASS_WRITES {
                self.deferred.push(key.clone());
                self.deferred.extend(plans.map(|(key, _)| key.clone()));
                break;
            }
            let Some(svc) = records.get(key).filter(|r| r.view.is_some()) else {
                continue;
            };
            if self.backoff.waiting(key, now) {
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
                services::annotations_differ(svc, node.as_deref(), plan.interface.as_deref())
                    && !waiting(memo.is_some_and(|m| m.annotations == Some(annotations_key(plan))));
            let status = services::status_differs(svc, plan, ip_mode)
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
        let stranger_uids: HashSet<&Arc<str>> = strangers.values().map(|s| &s.uid).collect();
        self.cleared.retain(|uid| stranger_uids.contains(uid));
        for svc in strangers.values() {
            if self.cleared.contains(&svc.uid)
                || self.backoff.waiting(&svc.key, now)
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
    pub(crate) fn run_jobs<'a>(
        &'a self,
        jobs: Vec<Job<'a>>,
    ) -> impl Stream<Item = Done> + Send + 'a {
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
                let mut wrote_annotations = false;
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
                    // Also after a status write that was all the job asked for: a hand
                    // edit of our annotations that landed in between is in the object it
                    // returned, and that version is one we know, so no later pass would
                    // write over it.
                    if (annotations || current.is_some())
                        && services::annotations_differ(
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
                        wrote_annotations = true;
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
                        (annotations || wrote_annotations).then(|| annotations_key(plan)),
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

    pub(crate) fn settle(&mut self, done: Done, now: Instant) {
        match done.result {
            Ok(written) => {
                self.backoff.forget(&done.key);
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
                    let (failures, retry_in) = self.backoff.failed(done.key.clone(), now);
                    tracing::warn!(
                        svc = %done.key,
                        failures,
                        ?retry_in,
                        error = %error,
                        source = ?std::error::Error::source(&error),
                        "write failed; retrying"
                    );
                } else if error.is_invalid() {
                    // The same write would be refused again: wait for the plan to change.
                    tracing::warn!(
                        svc = %done.key,
                        error = %error,
                        source = ?std::error::Error::source(&error),
                        "write refused as invalid; not retried until it or the Service changes"
                    );
                    self.backoff.forget(&done.key);
                    self.refused.insert(done.key, done.attempt);
                } else {
                    tracing::debug!(svc = %done.key, error = %error, "write skipped");
                    self.backoff.forget(&done.key);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aliaslb_core::plan::reason;

    const MS: Duration = Duration::from_millis(1);

    /// `delay` lies in `[step / 2, step]` (to f32 rounding).
    #[track_caller]
    fn assert_in_step(delay: Duration, step: Duration) {
        assert!(
            delay + MS >= step / 2 && delay <= step,
            "{delay:?} is not in [{:?}, {step:?}]",
            step / 2
        );
    }

    #[test]
    fn backoff_doubles_and_caps() {
        let now = Instant::now();
        let mut retries = Retries::new();
        let delays: Vec<Duration> = (0..20).map(|_| retries.failed("a", now).1).collect();
        for (delay, step) in delays.iter().zip([200, 400, 800, 1600]) {
            assert_in_step(*delay, step * MS);
        }
        assert_in_step(delays[19], MAX_BACKOFF);
        assert!(delays.iter().all(|d| *d <= MAX_BACKOFF));
    }

    /// Services and node assignments share the retry policy: consecutive transient
    /// failures double the step, a success forgets them.
    #[test]
    fn every_write_retries_doubling_until_it_succeeds() {
        let t0 = Instant::now();
        let mut retries = Retries::new();
        let (_, first) = retries.failed("n1".to_owned(), t0);
        let (_, second) = retries.failed("n1".to_owned(), t0 + first);
        let (failures, third) = retries.failed("n1".to_owned(), t0 + first + second);
        assert_eq!(failures, 3);
        assert_in_step(first, 200 * MS);
        assert_in_step(second, 400 * MS);
        assert_in_step(third, 800 * MS);
        let at = t0 + first + second;
        assert!(retries.waiting(&"n1".to_owned(), at));
        assert!(retries.due(at).is_empty());
        assert_eq!(retries.next(), Some(at + third));
        assert_eq!(retries.due(at + third), ["n1".to_owned()]);
        retries.forget(&"n1".to_owned());
        assert_eq!(retries.next(), None);
        let (failures, again) = retries.failed("n1".to_owned(), at);
        assert_eq!(failures, 1);
        assert_in_step(again, 200 * MS);
    }

    /// What the jitter is for: a thousand writes failed by one API outage are not retried
    /// in one instant. Their fifth retries (3.2 s steps) spread over most of the 1.6 s the
    /// rule allows.
    #[test]
    fn writes_that_failed_together_are_retried_apart() {
        let t0 = Instant::now();
        let mut retries = Retries::new();
        retries.seed = Some(48);
        let mut at = Vec::new();
        for key in 0..1000 {
            let mut t = t0;
            for _ in 0..5 {
                t += retries.failed(key, t).1;
            }
            at.push(t - t0);
        }
        at.sort();
        assert!(at[999] - at[0] > 1500 * MS, "{:?}..{:?}", at[0], at[999]);
        let mut per_50ms = HashMap::<u128, usize>::new();
        for t in &at {
            *per_50ms.entry(t.as_millis() / 50).or_default() += 1;
        }
        let busiest = per_50ms.values().max().copied().unwrap_or(0);
        assert!(busiest <= 60, "{busiest} of 1000 retries in one 50 ms");
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
        let plan = crate::reconcile::tests::l2_plan(
            "10.0.0.1",
            "n1",
            aliaslb_core::plan::ConditionPlan {
                status: true,
                reason: reason::ALLOCATED,
                message: "assigned".into(),
            },
            aliaslb_core::plan::ConditionPlan {
                status: false,
                reason: reason::ADDRESS_CONFLICT,
                message: "n1 reports a conflict".into(),
            },
        );
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
