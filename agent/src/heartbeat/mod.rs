//! The agent's heartbeat: its own Lease `aliaslb-agent-<node>` in the agents' namespace
//! (`--agent-namespace`), renewed every renew interval (10 s by default, the kubelet's own
//! rate) at a phase of its own ([`Schedule`]: a thousand agents renew spread over the
//! interval, also after an API server restart) and rewritten at once whenever the report
//! (interfaces, held IPs, conflicts) changes. Does API I/O (that one Lease only).
//!
//! Liveness is not the Lease's job any more where it must be fast: an L2 holder's loss is
//! seen on the LAN by its standby (`l2::failover`), and a stopped agent's aliases expire
//! by their kernel lifetime, refreshed locally. The Lease carries the report and the
//! authority below, at a rate that scales (1,000 nodes: 100 writes/s).
//!
//! [`lease_for`] builds the object (pure); [`Heartbeat`] writes and deletes it, each call
//! under a timeout; [`run`] is the loop, which also owns the "API reachable" edge: logged
//! once per edge, counted in metrics, and signalled so the alias loop reconciles at once
//! when the API comes back.
//!
//! Two small shared clocks tie the heartbeat to the rest of the agent:
//! - [`Authority`]: when a renewal last succeeded. The conflict guard asks it whether this
//!   agent still speaks for its IPs (a node whose Lease went stale may already have been
//!   replaced, so it yields a contested IP instead of defending it).
//! - [`KernelRounds`]: when the alias loop last completed a kernel round. The heartbeat
//!   renews only while the aliases its report lists can still exist in the kernel
//!   ([`may_renew`]): a hung netlink socket stops the renewals, so the controller moves the
//!   IPs instead of trusting a report the kernel has already expired.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use aliaslb_core::keys;
use aliaslb_core::report::AgentReport;
use aliaslb_core::version;
use aliaslb_ops::backoff::Backoff;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use tokio::sync::{Notify, watch};
use tokio::time::{Instant, MissedTickBehavior};
use tracing::{debug, info, warn};

use self::metrics::HeartbeatMetrics;

pub mod metrics;

/// Where and how the Lease is kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseConfig {
    /// Namespace of the Lease (the agents', apart from the controller's).
    pub namespace: String,
    /// This node's name: the Lease's holder identity.
    pub node_name: String,
    /// `leaseDurationSeconds` (whole seconds, checked by `config`).
    pub lease_duration: Duration,
    /// Renewal period (when the report did not change).
    pub renew_interval: Duration,
    /// The aliases' kernel lifetime: a report is written only while the last kernel round
    /// is younger ([`may_renew`]).
    pub alias_lifetime: Duration,
}

impl LeaseConfig {
    /// Bound on one API call: half the lease, so a hung call cannot eat the whole lease.
    fn call_timeout(&self) -> Duration {
        (self.lease_duration / 2).max(Duration::from_millis(500))
    }
}

/// Why a Lease write failed.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// The API server answered with an error, or could not be reached.
    #[error("{op} Lease {namespace}/{name}: {source}")]
    Api {
        /// `renew` or `release`.
        op: &'static str,
        /// Lease namespace.
        namespace: String,
        /// Lease name.
        name: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// No answer within the call timeout.
    #[error("{op} Lease {namespace}/{name}: no answer within {timeout:?}")]
    Timeout {
        /// `renew` or `release`.
        op: &'static str,
        /// Lease namespace.
        namespace: String,
        /// Lease name.
        name: String,
        /// The timeout.
        timeout: Duration,
    },
}

/// The Lease object the agent applies: holder = node, duration, `renewTime` = `now`,
/// `acquireTime` = `acquired`, the report annotation and the agent's version label.
pub fn lease_for(
    config: &LeaseConfig,
    report: &AgentReport,
    acquired: Timestamp,
    now: Timestamp,
) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(keys::agent_lease_name(&config.node_name)),
            namespace: Some(config.namespace.clone()),
            // The controller checks it against the releases it supports.
            labels: Some(
                [(
                    keys::LABEL_AGENT_VERSION.to_owned(),
                    version::label_value(aliaslb_ops::build::VERSION),
                )]
                .into(),
            ),
            annotations: Some(
                [(keys::ANNOTATION_AGENT_REPORT.to_owned(), report.to_json())].into(),
            ),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(config.node_name.clone()),
            lease_duration_seconds: Some(
                i32::try_from(config.lease_duration.as_secs()).unwrap_or(i32::MAX),
            ),
            acquire_time: Some(MicroTime(acquired)),
            renew_time: Some(MicroTime(now)),
            ..LeaseSpec::default()
        }),
    }
}

/// Writes and releases this agent's Lease.
#[derive(Debug, Clone)]
pub struct Heartbeat {
    api: Api<Lease>,
    config: LeaseConfig,
    name: String,
    acquired: Timestamp,
}

impl Heartbeat {
    /// A heartbeat for `config` (nothing is written yet).
    pub fn new(client: Client, config: LeaseConfig) -> Self {
        Heartbeat {
            api: Api::namespaced(client, &config.namespace),
            name: keys::agent_lease_name(&config.node_name),
            config,
            acquired: Timestamp::now(),
        }
    }

    /// Creates or renews the Lease with `report` (server-side apply, field manager
    /// `aliaslb-agent`), under the call timeout.
    pub async fn renew(&self, report: &AgentReport) -> Result<(), LeaseError> {
        let lease = lease_for(&self.config, report, self.acquired, Timestamp::now());
        let params = PatchParams::apply(keys::AGENT_FIELD_MANAGER).force();
        let patch = Patch::Apply(&lease);
        let call = self.api.patch(&self.name, &params, &patch);
        match tokio::time::timeout(self.config.call_timeout(), call).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(source)) => Err(self.api_error("renew", source)),
            Err(_) => Err(self.timeout("renew")),
        }
    }

    /// Releases the Lease: the same server-side apply without a holder, reporting nothing
    /// held (the aliases are gone by then), so the controller moves this node's IPs at once
    /// instead of waiting for the lease to expire. Not a delete: a Lease that disappears is
    /// no evidence to the controller (anyone who may write Leases could delete it), while a
    /// holderless write of its own Lease is what the optional admission policy lets only
    /// this node's agent do.
    pub async fn release(&self) -> Result<(), LeaseError> {
        let report = AgentReport {
            version: aliaslb_core::report::REPORT_VERSION,
            ..AgentReport::default()
        };
        let mut lease = lease_for(&self.config, &report, self.acquired, Timestamp::now());
        if let Some(spec) = lease.spec.as_mut() {
            spec.holder_identity = None;
        }
        let params = PatchParams::apply(keys::AGENT_FIELD_MANAGER).force();
        let patch = Patch::Apply(&lease);
        let call = self.api.patch(&self.name, &params, &patch);
        match tokio::time::timeout(self.config.call_timeout(), call).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(source)) => Err(self.api_error("release", source)),
            Err(_) => Err(self.timeout("release")),
        }
    }

    fn api_error(&self, op: &'static str, source: kube::Error) -> LeaseError {
        LeaseError::Api {
            op,
            namespace: self.config.namespace.clone(),
            name: self.name.clone(),
            source,
        }
    }

    fn timeout(&self, op: &'static str) -> LeaseError {
        LeaseError::Timeout {
            op,
            namespace: self.config.namespace.clone(),
            name: self.name.clone(),
            timeout: self.config.call_timeout(),
        }
    }
}

/// When the last renewal succeeded, shared between the heartbeat (which records it) and the
/// conflict guard (which asks [`Authority::is_fresh`]). Monotonic clock (tokio's, so paused
/// test time applies). Clones share the state.
#[derive(Debug, Clone)]
pub struct Authority {
    lease_duration: Duration,
    state: Arc<Mutex<AuthorityState>>,
}

#[derive(Debug, Clone, Copy)]
struct AuthorityState {
    renewed: Option<Instant>,
    /// When the agent started: the staleness of an agent that never renewed counts from
    /// there ([`Authority::stale_past_a_lease`]).
    started: Instant,
    /// The Lease was released ([`Authority::revoke`]): nothing is kept on its account.
    revoked: bool,
}

impl Authority {
    /// Authority under a lease of `lease_duration`, with no renewal yet (stale).
    pub fn new(lease_duration: Duration) -> Self {
        Authority {
            lease_duration,
            state: Arc::new(Mutex::new(AuthorityState {
                renewed: None,
                started: Instant::now(),
                revoked: false,
            })),
        }
    }

    /// Whether the authority has been stale for a whole lease duration at `now`: the last
    /// renewal (or the start, before any) is two lease durations old. By then the
    /// controller has judged this node lost (a lease after the renewal it saw, which came
    /// after this agent sent it) and may have given its addresses to other Services: an
    /// agent whose routed (L3) addresses no LAN claim can take over withdraws them then.
    pub fn stale_past_a_lease(&self, now: Instant) -> bool {
        let state = *self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let last = state.renewed.unwrap_or(state.started);
        now.saturating_duration_since(last) >= 2 * self.lease_duration
    }

    /// The lease duration this authority runs under.
    pub fn lease_duration(&self) -> Duration {
        self.lease_duration
    }

    /// Records a renewal that succeeded, `at` being when its request was sent: before the
    /// write landed, so before the controller can have seen it. This agent's authority
    /// therefore ends no later than the controller's view of its Lease does: by the time
    /// the controller has given an IP to another node (its Lease stale on the controller's
    /// clock), the old holder is stale too and yields to the new holder's first
    /// announcement (assuming the two monotonic clocks run at the same rate).
    pub fn record_renewal(&self, at: Instant) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.renewed = Some(state.renewed.map_or(at, |r| r.max(at)));
        state.revoked = false;
    }

    /// Whether the Lease was renewed within the lease duration before `now`. Stale before
    /// the first renewal: a restarted agent cannot know how long its node has looked lost
    /// to the controller, so until it has renewed it yields to another node's claim.
    pub fn is_fresh(&self, now: Instant) -> bool {
        let state = *self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state
            .renewed
            .is_some_and(|at| now.saturating_duration_since(at) < self.lease_duration)
    }

    /// Whether a set the controller wrote, whose object has since gone missing, may still
    /// be kept at `now`: while the authority is fresh, and before the first renewal for one
    /// lease duration from the start. An agent acts on the set it read before its first
    /// renewal lands (it must, to serve at once after a restart); keeping that set when
    /// its object vanishes meanwhile is no bolder, and a first renewal still in flight is
    /// no evidence that the node looks lost. A first renewal that has not succeeded a lease
    /// duration after the start is; a released Lease keeps nothing.
    pub fn may_keep(&self, now: Instant) -> bool {
        let state = *self.state.lock().unwrap_or_else(PoisonError::into_inner);
        match state.renewed {
            Some(at) => now.saturating_duration_since(at) < self.lease_duration,
            None => {
                !state.revoked && now.saturating_duration_since(state.started) < self.lease_duration
            }
        }
    }

    /// Ends the authority now (the Lease was released): stale at once, and stale past a
    /// lease two lease durations from now.
    pub fn revoke(&self, at: Instant) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.renewed = None;
        state.started = at;
        state.revoked = true;
    }

    /// When the last renewal succeeded, if one did.
    pub fn last_renewal(&self) -> Option<Instant> {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .renewed
    }
}

/// When the alias loop last completed a kernel round (a reconcile or a lifetime refresh)
/// that reached the kernel, shared between the loop (which records it) and the heartbeat
/// (which gates its renewals on it with [`may_renew`]). Clones share the state.
#[derive(Debug, Clone)]
pub struct KernelRounds {
    last_ok: Arc<Mutex<Instant>>,
}

impl Default for KernelRounds {
    fn default() -> Self {
        Self::new()
    }
}

impl KernelRounds {
    /// Counted from now, as if a round had just completed (the first reconcile runs before
    /// the first report exists).
    pub fn new() -> Self {
        KernelRounds {
            last_ok: Arc::new(Mutex::new(Instant::now())),
        }
    }

    /// Records a round that completed at `at`.
    pub fn record_ok(&self, at: Instant) {
        let mut last = self.last_ok.lock().unwrap_or_else(PoisonError::into_inner);
        *last = (*last).max(at);
    }

    /// When the last good round completed.
    pub fn last_ok(&self) -> Instant {
        *self.last_ok.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Whether the heartbeat may write a report at `now`, given the last good kernel round at
/// `last_ok`: only while that round is younger than the aliases' kernel lifetime. Each
/// round refreshes the lifetimes, so past this point the aliases the report lists may be
/// gone from the kernel, and a renewal would tell the controller they exist.
pub fn may_renew(last_ok: Instant, now: Instant, alias_lifetime: Duration) -> bool {
    now.saturating_duration_since(last_ok) <= alias_lifetime
}

/// What the heartbeat does at one look ([`Schedule::decide`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Beat {
    /// Write the Lease with the report.
    Write,
    /// Release the Lease (holderless, nothing held): the kernel rounds stopped, so the
    /// aliases may be gone and the controller should move the IPs now rather than a lease
    /// later.
    Release,
    /// Nothing to write.
    Nothing,
}

/// How often the heartbeat looks: at most a third of the alias lifetime, and a whole
/// fraction of the renew interval, so an unchanged report is written exactly a renew
/// interval after the last write (500 ms renewals with a 1 s lifetime look every 250 ms, not
/// every 333 ms, which wrote every 667 ms).
pub fn look_interval(renew: Duration, alias_lifetime: Duration) -> Duration {
    let most = (alias_lifetime / 3)
        .min(renew)
        .max(Duration::from_millis(1));
    let looks = renew.as_nanos().div_ceil(most.as_nanos()).max(1);
    renew / u32::try_from(looks).unwrap_or(u32::MAX)
}

/// When the heartbeat writes (pure): a changed report at once, an unchanged one at this
/// agent's own renewal slots, a failed write again after a jittered backoff, a release
/// once when the kernel rounds stop, and a write at once when they resume.
///
/// **A phase of its own, kept.** Each agent draws a phase in `[0, renew)` once, at start
/// ([`aliaslb_ops::backoff::phase`]); its slots are `first_slot + k x renew` with
/// `first_slot` = start + phase. An unchanged report is written at the first slot after the
/// last write, whenever that write was (a change, a retry after an outage): so a thousand
/// agents started by one rollout, or all cut off by one API server restart, keep writing
/// spread over the renew interval instead of in one wave, however they were bunched
/// before. The heartbeat's looks are laid on the slots ([`run`]).
///
/// **The rate and the lifetime bound hold.** Consecutive slots are a renew interval apart, and a
/// write between two slots (a change) only adds a write: while writes succeed, two of
/// them are never more than a renew interval apart (a slot's look may come half a look
/// early, as before, and a change written within half a look before a slot stands for
/// it), one unchanged write per renew interval, as without the phase. So `lifetime <=
/// lease - renew`, which assumes writes a renew interval apart, holds unchanged: the
/// phase moves *when* the writes come, never how far apart.
///
/// **A failed write** is retried after a jittered backoff ([`aliaslb_ops::backoff`]):
/// steps from one look doubling to the renew interval, each delay in `[step / 2, step]`,
/// so the retry comes within a renew interval of the failure, the crowd an outage failed
/// together retries spread over the last step, not at its next look in one burst. A
/// change waits for the retry too (it would fail alike). The first success resets it.
///
/// The heartbeat looks every `look` (a third of the alias lifetime, at most the renew
/// interval): a slot's write is due at the look nearest to it, half a look early rather
/// than a whole look late. Without that slack a look a millisecond early (timer jitter)
/// skipped the write to the next look, so a 1 s renew interval with 1 s looks wrote every
/// 2 s at times, and the controller could judge a frozen agent lost before its aliases'
/// lifetime ran out.
#[derive(Debug)]
pub struct Schedule {
    renew_interval: Duration,
    slack: Duration,
    first_slot: Instant,
    last_write: Option<Instant>,
    released: bool,
    /// After a failed write: no write before this.
    retry_at: Option<Instant>,
    retries: Backoff,
}

impl Schedule {
    /// Nothing written yet; the heartbeat looks every `look`; unchanged reports are due at
    /// `first_slot + k x renew_interval`; failed writes are retried after `retries`
    /// (jittered, from a look to the renew interval: [`Schedule::retries`]).
    pub fn new(
        renew_interval: Duration,
        look: Duration,
        first_slot: Instant,
        retries: Backoff,
    ) -> Self {
        Schedule {
            renew_interval,
            slack: look / 2,
            first_slot,
            last_write: None,
            released: false,
            retry_at: None,
            retries,
        }
    }

    /// The retry backoff of a heartbeat that looks every `look`: steps from `look` to
    /// `renew_interval`.
    pub fn retries(renew_interval: Duration, look: Duration) -> Backoff {
        Backoff::new(look, renew_interval)
    }

    /// The first slot later than `after`.
    fn slot_after(&self, after: Instant) -> Instant {
        let Some(since) = after.checked_duration_since(self.first_slot) else {
            return self.first_slot;
        };
        let renew = self.renew_interval.as_nanos().max(1);
        let slots = since.as_nanos() / renew + 1;
        let offset = u64::try_from(slots.saturating_mul(renew)).unwrap_or(u64::MAX);
        self.first_slot + Duration::from_nanos(offset)
    }

    /// What to do at `now`: `gated` when [`may_renew`] says no, `changed` when the report
    /// differs from the last one written.
    pub fn decide(&self, now: Instant, gated: bool, changed: bool) -> Beat {
        if gated {
            return if self.released {
                Beat::Nothing
            } else {
                Beat::Release
            };
        }
        if self.retry_at.is_some_and(|at| now + self.slack < at) {
            return Beat::Nothing;
        }
        // A write within half a look before a slot stands for that slot.
        let due = self
            .last_write
            .is_none_or(|at| now + self.slack >= self.slot_after(at + self.slack));
        if changed || due || self.released || self.retry_at.is_some() {
            Beat::Write
        } else {
            Beat::Nothing
        }
    }

    /// A write sent at `at` succeeded.
    pub fn wrote(&mut self, at: Instant) {
        self.last_write = Some(at);
        self.released = false;
        self.retry_at = None;
        self.retries.reset();
    }

    /// A write sent at `at` failed: the next one waits the next retry delay; returns it.
    pub fn failed(&mut self, at: Instant) -> Duration {
        let delay = self.retries.next_delay();
        self.retry_at = Some(at + delay);
        delay
    }

    /// The release succeeded.
    pub fn released(&mut self) {
        self.released = true;
    }
}

/// What [`run`] shares with the rest of the agent.
#[derive(Debug, Clone)]
pub struct HeartbeatLinks {
    /// Signalled when a write succeeds after failures or stale authority (the loop
    /// reconciles at once).
    pub api_back: Arc<Notify>,
    /// Records every successful renewal.
    pub authority: Authority,
    /// Gates the renewals on the alias loop's kernel rounds.
    pub kernel: KernelRounds,
}

/// The heartbeat loop: waits for the first report, then looks every refresh interval (a
/// third of the alias lifetime, at most the renew interval, on a grid laid on this agent's
/// renewal slots: see [`Schedule`]) and at once on every report change, and writes what
/// [`Schedule::decide`] says. Signals `api_back` when a write
/// succeeds after failures (or after authority was stale); records every success in
/// `links.authority`. While the alias loop's kernel rounds are too old ([`may_renew`]) it
/// releases the Lease once (the controller moves the IPs now) and writes nothing else,
/// logging once when it stops and once when it resumes. Returns when the report sender is
/// dropped (shutdown), after finishing the write in flight, so a later
/// [`Heartbeat::release`] cannot be overtaken by it.
pub async fn run(
    heartbeat: Heartbeat,
    mut reports: watch::Receiver<Option<AgentReport>>,
    metrics: HeartbeatMetrics,
    links: HeartbeatLinks,
) {
    let HeartbeatLinks {
        api_back,
        authority,
        kernel,
    } = links;
    let config = heartbeat.config.clone();
    let look_every = look_interval(config.renew_interval, config.alias_lifetime);
    // This agent's phase, kept for its lifetime (see [`Schedule`]); the looks are laid on
    // its slots: the renew interval is a whole number of looks, so a look falls on every
    // slot. `Skip`: a look missed while a write was in flight does not move the grid.
    let start = Instant::now();
    let phase = aliaslb_ops::backoff::phase(config.renew_interval);
    let first_slot = start + phase;
    let look_offset = Duration::from_nanos(
        u64::try_from(phase.as_nanos() % look_every.as_nanos().max(1)).unwrap_or(0),
    );
    let mut tick = tokio::time::interval_at(start + look_offset, look_every);
    tick.set_missed_tick_behavior(MissedTickBehavior::Skip);
    let mut schedule = Schedule::new(
        config.renew_interval,
        look_every,
        first_slot,
        Schedule::retries(config.renew_interval, look_every),
    );
    let mut written: Option<AgentReport> = None;
    // `None`: nothing written yet.
    let mut reachable: Option<bool> = None;
    let mut gated = false;
    loop {
        tokio::select! {
            biased;
            changed = reports.changed() => if changed.is_err() { return },
            _ = tick.tick() => {}
        }
        let Some(report) = reports.borrow_and_update().clone() else {
            continue;
        };
        let now = Instant::now();
        metrics.set_authority_fresh(authority.is_fresh(now));
        let last_round = kernel.last_ok();
        let closed = !may_renew(last_round, now, config.alias_lifetime);
        if closed {
            metrics.record_renewal_gated();
            if !gated {
                warn!(
                    since_ms = now.saturating_duration_since(last_round).as_millis(),
                    "the alias loop has not completed a kernel round for longer than the alias lifetime: its aliases may be gone; releasing the Lease so the controller moves this node's IPs now"
                );
                gated = true;
            }
        } else if gated {
            info!("kernel rounds complete again: renewing the Lease");
            gated = false;
        }
        let changed = written.as_ref() != Some(&report);
        match schedule.decide(now, closed, changed) {
            Beat::Nothing => {}
            Beat::Release => match heartbeat.release().await {
                Ok(()) => {
                    schedule.released();
                    written = None;
                    authority.revoke(now);
                    metrics.set_authority_fresh(false);
                    info!(lease = %heartbeat.name, "agent Lease released (kernel rounds stopped)");
                }
                Err(error) => debug!(%error, "cannot release the Lease; retrying at the next look"),
            },
            Beat::Write => {
                let was_stale = !authority.is_fresh(now);
                match heartbeat.renew(&report).await {
                    Ok(()) => {
                        schedule.wrote(now);
                        written = Some(report.clone());
                        authority.record_renewal(now);
                        metrics.set_authority_fresh(true);
                        metrics.record_renewal(true);
                        if was_stale && reachable == Some(true) {
                            // Stale without an API failure (renewals were gated): the loop
                            // may end its yields now.
                            api_back.notify_one();
                        }
                        match reachable {
                            None => {
                                info!(lease = %heartbeat.name, namespace = %config.namespace, "agent Lease written")
                            }
                            Some(false) => {
                                info!(lease = %heartbeat.name, "API server reachable again: Lease renewed, reconciling");
                                api_back.notify_one();
                            }
                            Some(true) => {
                                debug!(held = report.held.len(), changed, "Lease renewed")
                            }
                        }
                        reachable = Some(true);
                    }
                    Err(error) => {
                        metrics.record_renewal(false);
                        let retry_in = schedule.failed(now);
                        if reachable != Some(false) {
                            warn!(%error, ?retry_in, "cannot renew the agent Lease (API server unreachable?); aliases stay and keep being refreshed");
                        } else {
                            debug!(%error, ?retry_in, "Lease renewal still failing");
                        }
                        reachable = Some(false);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aliaslb_core::report::InterfaceReport;

    #[test]
    fn lease_carries_holder_duration_times_and_report() {
        let config = LeaseConfig {
            namespace: "aliaslb-system".into(),
            node_name: "node-a".into(),
            lease_duration: Duration::from_secs(4),
            renew_interval: Duration::from_secs(1),
            alias_lifetime: Duration::from_secs(3),
        };
        let report = AgentReport {
            version: 1,
            interfaces: vec![InterfaceReport {
                addresses: Vec::new(),
                mac: None,
                name: "eth1".into(),
                subnets: vec!["10.0.0.0/24".parse().unwrap()],
            }],
            held: ["10.0.0.50".parse().unwrap()].into(),
            conflicts: vec![],
            shield: aliaslb_core::report::ShieldState::Active,
            macs: Vec::new(),
            key: None,
            routing: None,
        };
        let acquired: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
        let now: Timestamp = "2026-01-01T00:00:05.25Z".parse().unwrap();
        let lease = lease_for(&config, &report, acquired, now);
        assert_eq!(lease.metadata.name.as_deref(), Some("aliaslb-agent-node-a"));
        assert_eq!(lease.metadata.namespace.as_deref(), Some("aliaslb-system"));
        assert_eq!(
            lease.metadata.labels.as_ref().unwrap()[keys::LABEL_AGENT_VERSION],
            env!("CARGO_PKG_VERSION"),
            "the agent's release, for the controller's version check"
        );
        let json = &lease.metadata.annotations.as_ref().unwrap()[keys::ANNOTATION_AGENT_REPORT];
        assert_eq!(AgentReport::from_json(json).unwrap(), report);
        let spec = lease.spec.unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some("node-a"));
        assert_eq!(spec.lease_duration_seconds, Some(4));
        assert_eq!(spec.acquire_time, Some(MicroTime(acquired)));
        assert_eq!(spec.renew_time, Some(MicroTime(now)));
        assert_eq!(config.call_timeout(), Duration::from_secs(2));
    }

    #[test]
    fn reports_stop_once_the_last_kernel_round_is_older_than_the_alias_lifetime() {
        let t = Instant::now();
        let lifetime = Duration::from_secs(3);
        let at = |ms| t + Duration::from_millis(ms);
        let cases = [
            (0, true),
            (2_999, true),
            (3_000, true),
            (3_001, false),
            (60_000, false),
        ];
        for (ms, want) in cases {
            assert_eq!(may_renew(t, at(ms), lifetime), want, "{ms} ms");
        }
    }

    #[test]
    fn the_heartbeat_looks_a_whole_fraction_of_the_renew_interval() {
        let ms = Duration::from_millis;
        let s = Duration::from_secs;
        // Production defaults: 10 s renewals, 3 s lifetime: every second.
        assert_eq!(look_interval(s(10), s(3)), s(1));
        // The lab: 1 s renewals, 3 s lifetime.
        assert_eq!(look_interval(s(1), s(3)), s(1));
        // The agent tests: 500 ms renewals, 1 s lifetime: 250 ms, not 333.
        assert_eq!(look_interval(ms(500), s(1)), ms(250));
        assert_eq!(look_interval(s(10), s(2)), ms(625));
    }

    /// A schedule renewing every `renew` with looks every `look`, its first slot at `first`,
    /// its retries seeded.
    fn schedule(renew: Duration, look: Duration, first: Instant) -> Schedule {
        Schedule::new(renew, look, first, Backoff::seeded(look, renew, 48))
    }

    #[test]
    fn a_renew_interval_equal_to_the_look_writes_at_every_look_despite_jitter() {
        let t = Instant::now();
        let s = |ms| t + Duration::from_millis(ms);
        let second = Duration::from_secs(1);
        let mut schedule = schedule(second, second, t);
        // Looks a few milliseconds late, then one early: every one writes.
        for ms in [3, 1_004, 1_999, 3_001, 3_998] {
            assert_eq!(schedule.decide(s(ms), false, false), Beat::Write, "{ms} ms");
            schedule.wrote(s(ms));
        }
    }

    #[test]
    fn unchanged_reports_are_written_at_the_agents_own_slots_changes_at_once() {
        let t = Instant::now();
        let s = |ms| t + Duration::from_millis(ms);
        // Phase 3.7 s: slots at 3.7 s, 13.7 s, 23.7 s...; looks laid on them (0.7 s, 1.7 s...).
        let mut schedule = schedule(Duration::from_secs(10), Duration::from_secs(1), s(3_700));
        assert_eq!(schedule.decide(t, false, false), Beat::Write, "first");
        schedule.wrote(t);
        assert_eq!(schedule.decide(s(700), false, false), Beat::Nothing);
        assert_eq!(schedule.decide(s(2_700), false, false), Beat::Nothing);
        // The first slot, not a renew interval after the first write.
        assert_eq!(schedule.decide(s(3_700), false, false), Beat::Write);
        schedule.wrote(s(3_700));
        assert_eq!(schedule.decide(s(4_700), false, false), Beat::Nothing);
        assert_eq!(schedule.decide(s(12_700), false, false), Beat::Nothing);
        // A change at once; it does not move the phase: the next slot still writes.
        assert_eq!(schedule.decide(s(5_000), false, true), Beat::Write);
        schedule.wrote(s(5_000));
        assert_eq!(schedule.decide(s(12_700), false, false), Beat::Nothing);
        // The look nearest to the slot writes, even a little early (timer jitter).
        assert_eq!(schedule.decide(s(13_698), false, false), Beat::Write);
        schedule.wrote(s(13_698));
        // A change within half a look before a slot stands for it.
        assert_eq!(schedule.decide(s(23_400), false, true), Beat::Write);
        schedule.wrote(s(23_400));
        assert_eq!(schedule.decide(s(23_700), false, false), Beat::Nothing);
        assert_eq!(schedule.decide(s(32_700), false, false), Beat::Nothing);
        assert_eq!(schedule.decide(s(33_700), false, false), Beat::Write);
        schedule.wrote(s(33_700));
        // Kernel rounds stopped: one release, then nothing, even for a change.
        assert_eq!(schedule.decide(s(34_000), true, false), Beat::Release);
        assert_eq!(
            schedule.decide(s(35_000), true, false),
            Beat::Release,
            "a failed release is retried"
        );
        schedule.released();
        assert_eq!(schedule.decide(s(36_000), true, true), Beat::Nothing);
        assert_eq!(schedule.decide(s(60_000), true, false), Beat::Nothing);
        // Rounds again: written at once, though the last write is recent.
        assert_eq!(schedule.decide(s(61_000), false, false), Beat::Write);
    }

    /// After an outage the agent is back on its own slots at once: its writes do not
    /// stay where the recovery put them (in step with every other agent's).
    #[test]
    fn a_failed_write_is_retried_with_a_jittered_backoff_then_the_phase_resumes() {
        let t = Instant::now();
        let ms = Duration::from_millis;
        let (renew, look) = (Duration::from_secs(10), Duration::from_secs(1));
        let mut schedule = schedule(renew, look, t + ms(3_700));
        let mut twin = Backoff::seeded(look, renew, 48);
        schedule.wrote(t + ms(3_700));
        // The API goes away: the slot's write fails at 13.7 s, and the retries after it.
        let mut now = t + ms(13_700);
        let mut steps = Vec::new();
        for step in [1_000, 2_000, 4_000, 8_000, 10_000, 10_000] {
            assert_eq!(schedule.decide(now, false, false), Beat::Write);
            let delay = schedule.failed(now);
            assert_eq!(delay, twin.next_delay());
            assert!(
                delay + ms(1) >= ms(step) / 2 && delay <= ms(step),
                "{delay:?}"
            );
            steps.push(delay);
            // Nothing before the retry is due, not even a change or the slot.
            let early = now + delay - ms(501);
            assert_eq!(schedule.decide(early, false, true), Beat::Nothing);
            now += delay;
        }
        // Within a renew interval of the last failure: the API answers.
        assert_eq!(schedule.decide(now, false, false), Beat::Write);
        schedule.wrote(now);
        // Back on its slots (3.7 s + k x 10 s), not a renew interval after the recovery.
        let first = t + ms(3_700);
        let slots = (now + ms(500) - first).as_nanos() / renew.as_nanos() + 1;
        let next_slot = first + renew * u32::try_from(slots).unwrap();
        assert!(next_slot - now < renew + ms(500));
        assert_eq!(
            schedule.decide(next_slot - ms(1_000), false, false),
            Beat::Nothing
        );
        assert_eq!(schedule.decide(next_slot, false, false), Beat::Write);
        // The first failure after a success starts the backoff over.
        schedule.wrote(next_slot);
        let again = schedule.failed(next_slot + renew);
        assert!(again <= look, "{again:?} after {steps:?}");
    }

    /// The lifetime bound (`lifetime <= lease - renew`): for any phase, with looks on its slots (a few ms of timer jitter either
    /// way) and changes at random times, writes that succeed are never more than a renew
    /// interval (and the half look a change may come early) apart, and the unchanged ones
    /// come once per renew interval.
    #[test]
    fn writes_stay_a_renew_interval_apart_whatever_the_phase_and_the_changes() {
        let t = Instant::now();
        let (renew, look) = (Duration::from_secs(10), Duration::from_secs(1));
        let mut rng = fastrand::Rng::with_seed(24);
        for _ in 0..50 {
            let phase = aliaslb_ops::backoff::phase_with(&mut rng, renew);
            let mut schedule = schedule(renew, look, t + phase);
            let offset = Duration::from_nanos((phase.as_nanos() % look.as_nanos()) as u64);
            let mut writes = Vec::new();
            let mut unchanged = 0;
            let mut changes = (0..30)
                .map(|_| Duration::from_millis(rng.u64(0..600_000)))
                .collect::<Vec<_>>();
            changes.sort();
            let mut changes = changes.into_iter().peekable();
            for k in 0..600u32 {
                let look_at = offset + look * k;
                while let Some(change) = changes.next_if(|c| *c < look_at) {
                    if schedule.decide(t + change, false, true) == Beat::Write {
                        schedule.wrote(t + change);
                        writes.push(change);
                    }
                }
                let jitter = Duration::from_millis(rng.u64(0..5));
                let at = if rng.bool() {
                    look_at + jitter
                } else {
                    look_at.saturating_sub(jitter)
                };
                if schedule.decide(t + at, false, false) == Beat::Write {
                    schedule.wrote(t + at);
                    writes.push(at);
                    unchanged += 1;
                }
            }
            let longest = writes.windows(2).map(|w| w[1] - w[0]).max().unwrap();
            assert!(
                longest <= renew + look / 2,
                "phase {phase:?}: writes {longest:?} apart"
            );
            // 600 s of slots: 60, give or take the first and the last; changes standing
            // for a slot make one fewer each.
            assert!(
                (28..=61).contains(&unchanged),
                "{unchanged} unchanged writes"
            );
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_revoked_authority_is_stale_at_once_and_past_a_lease_two_leases_later() {
        let lease = Duration::from_secs(4);
        let authority = Authority::new(lease);
        let start = Instant::now();
        authority.record_renewal(start);
        let at = start + Duration::from_secs(1);
        authority.revoke(at);
        assert!(!authority.is_fresh(at));
        assert!(!authority.may_keep(at), "a released Lease keeps nothing");
        assert_eq!(authority.last_renewal(), None);
        assert!(!authority.stale_past_a_lease(at + Duration::from_millis(7_999)));
        assert!(authority.stale_past_a_lease(at + 2 * lease));
    }

    #[tokio::test(start_paused = true)]
    async fn a_kept_set_may_stay_while_the_first_renewal_is_under_way_for_one_lease() {
        let lease = Duration::from_secs(2);
        let ms = Duration::from_millis;
        let authority = Authority::new(lease);
        let start = Instant::now();
        assert!(
            authority.may_keep(start + ms(1_999)),
            "first renewal under way"
        );
        assert!(
            !authority.may_keep(start + lease),
            "no renewal within a lease"
        );
        // Renewed late: from then on, exactly while fresh.
        authority.record_renewal(start + ms(2_500));
        assert!(authority.may_keep(start + ms(4_499)));
        assert!(!authority.may_keep(start + ms(4_500)));
        // Renewed early: a lease from that renewal, not from the start.
        let early = Authority::new(lease);
        early.record_renewal(start + ms(100));
        assert!(!early.may_keep(start + ms(2_100)));
        assert!(early.may_keep(start + ms(2_099)));
    }

    #[tokio::test(start_paused = true)]
    async fn authority_is_stale_until_renewed_then_fresh_for_a_lease_after_each_renewal() {
        let lease = Duration::from_secs(4);
        let authority = Authority::new(lease);
        let start = Instant::now();
        assert!(!authority.is_fresh(start), "stale before the first renewal");
        authority.record_renewal(start);
        assert!(authority.is_fresh(start + Duration::from_millis(3_999)));
        assert!(!authority.is_fresh(start + lease), "stale a lease after it");
        let clone = authority.clone();
        clone.record_renewal(start + Duration::from_secs(10));
        assert_eq!(
            authority.last_renewal(),
            Some(start + Duration::from_secs(10))
        );
        assert!(authority.is_fresh(start + Duration::from_secs(13)));
        assert!(!authority.is_fresh(start + Duration::from_secs(14)));
        // An older renewal recorded late does not move it back.
        clone.record_renewal(start + Duration::from_secs(5));
        assert!(authority.is_fresh(start + Duration::from_secs(13)));
    }
}

/// [`crate::l2::failover::HolderCheck`] over the agents' Leases: reads the holder's Lease
/// every [`HOLDER_POLL`] and answers once its `resourceVersion` moved (a renewal after the
/// first reading) and its report holds some of the IPs.
#[derive(Debug, Clone)]
pub struct LeaseHolderCheck {
    api: Api<Lease>,
}

/// How often [`LeaseHolderCheck`] reads a holder's Lease.
pub const HOLDER_POLL: Duration = Duration::from_millis(250);

impl LeaseHolderCheck {
    /// Reads the Leases in `namespace`.
    pub fn new(client: Client, namespace: &str) -> Self {
        LeaseHolderCheck {
            api: Api::namespaced(client, namespace),
        }
    }
}

impl crate::l2::failover::HolderCheck for LeaseHolderCheck {
    fn alive_holding(
        &self,
        holder: &str,
        ips: Vec<std::net::IpAddr>,
        within: Duration,
    ) -> crate::l2::lan::BoxFuture<Vec<std::net::IpAddr>> {
        let api = self.api.clone();
        let name = keys::agent_lease_name(holder);
        Box::pin(async move {
            let deadline = tokio::time::Instant::now() + within;
            let mut first: Option<Option<String>> = None;
            while tokio::time::Instant::now() < deadline {
                let read = tokio::time::timeout(HOLDER_POLL * 2, api.get_opt(&name)).await;
                if let Ok(Ok(lease)) = read {
                    let version = lease
                        .as_ref()
                        .and_then(|l| l.metadata.resource_version.clone());
                    match &first {
                        None => first = Some(version),
                        Some(before) if *before != version => {
                            let held = lease
                                .as_ref()
                                .and_then(|l| l.metadata.annotations.as_ref())
                                .and_then(|a| a.get(keys::ANNOTATION_AGENT_REPORT))
                                .and_then(|r| AgentReport::from_json(r).ok())
                                .map(|r| r.held)
                                .unwrap_or_default();
                            let proven: Vec<_> =
                                ips.iter().filter(|ip| held.contains(ip)).copied().collect();
                            if !proven.is_empty() {
                                return proven;
                            }
                        }
                        Some(_) => {}
                    }
                }
                tokio::time::sleep(HOLDER_POLL).await;
            }
            Vec::new()
        })
    }
}
