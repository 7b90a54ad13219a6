//! Leader election on a `coordination.k8s.io/v1` Lease, so that of the controller's
//! replicas exactly one writes. Does API I/O (one Lease, in the controller namespace).
//!
//! The safety rule is "a replica that loses leadership stops writing before another can
//! take over", without ever comparing clocks across machines:
//!
//! - a follower takes over only once the Lease record (its `resourceVersion`) has not
//!   changed for the record's `leaseDurationSeconds`, timed on the follower's own monotonic
//!   clock from the moment it first saw that version (as client-go does);
//! - the leader stops claiming leadership `renew_deadline` after the *start* of its last
//!   successful write, and `renew_deadline < lease_duration`. A follower sees that write
//!   only after it was sent, so the leader's deadline always falls before the follower's,
//!   with `lease_duration - renew_deadline` of margin for clock-rate drift;
//! - every write is a `replace` carrying the `resourceVersion` it was decided on: a 409
//!   Conflict means someone else wrote first, and the writer does not lead.
//!
//! [`decide`] is the pure decision; [`start`] runs the thin I/O loop. Writers call
//! [`Leadership::is_leader`] before each write (it checks the local deadline itself, so it
//! is right even while the loop is blocked on a slow API call) and watch
//! [`Leadership::watch`] to start and stop their work on the edges.
//!
//! **A deposed leader's writes cannot land after its successor starts.** Checking the fence
//! before a write is not enough: a write sent just before the deadline could still be in
//! flight when the successor takes over. So every write is also bounded in time by
//! [`Leadership::write_deadline`]. With `s` the start of the leader's last successful
//! renewal, `D` the renew deadline and `L` the lease duration:
//! - the leader writes only while `now < s + D` (the fence);
//! - a follower takes over no earlier than `s + L` (it saw the renewal after `s`, and waits
//!   `L` on its own clock from then);
//! - so a write that passed the fence must be over by `s + L`. It is given until
//!   `s + D + (L - D) / 2`, half the slack, leaving the other half for clock-rate drift
//!   between the two machines. With the defaults (L = 15 s, D = 10 s), a write that
//!   starts at `s + 9.9 s` is cut at `s + 12.5 s`, 2.5 s before any successor can start.
//!
//! A write cut on the client side may still have reached the API server; what the bound
//! guarantees is that the deposed leader has given up on it before the successor writes,
//! and the successor, which reads the objects afresh, writes over it.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aliaslb_ops::backoff::jittered;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::{Api, Client};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

/// Leader-election durations, checked to be consistent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timings {
    lease_duration: Duration,
    renew_deadline: Duration,
    retry_period: Duration,
}

/// Why a set of durations cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TimingError {
    /// The Lease stores whole seconds.
    #[error(
        "leader lease duration {0:?} must be a whole number of seconds, at least 1s (the Lease stores seconds)"
    )]
    LeaseNotWholeSeconds(Duration),
    /// No safety margin.
    #[error(
        "leader renew deadline {renew_deadline:?} must be shorter than the leader lease duration {lease_duration:?}: the leader must stop writing before others may take over"
    )]
    RenewNotBelowLease {
        /// Renew deadline given.
        renew_deadline: Duration,
        /// Lease duration given.
        lease_duration: Duration,
    },
    /// The leader would never renew in time.
    #[error(
        "leader retry period {retry_period:?} must be shorter than the leader renew deadline {renew_deadline:?}, or the leader steps down between two renewals"
    )]
    RetryNotBelowRenew {
        /// Retry period given.
        retry_period: Duration,
        /// Renew deadline given.
        renew_deadline: Duration,
    },
}

impl Timings {
    /// Check `retry_period < renew_deadline < lease_duration`, lease in whole seconds.
    pub fn new(
        lease_duration: Duration,
        renew_deadline: Duration,
        retry_period: Duration,
    ) -> Result<Self, TimingError> {
        if lease_duration.subsec_nanos() != 0 || lease_duration.as_secs() == 0 {
            return Err(TimingError::LeaseNotWholeSeconds(lease_duration));
        }
        if renew_deadline >= lease_duration {
            return Err(TimingError::RenewNotBelowLease {
                renew_deadline,
                lease_duration,
            });
        }
        if retry_period >= renew_deadline {
            return Err(TimingError::RetryNotBelowRenew {
                retry_period,
                renew_deadline,
            });
        }
        Ok(Timings {
            lease_duration,
            renew_deadline,
            retry_period,
        })
    }

    /// How long followers wait after the last change they saw.
    pub fn lease_duration(&self) -> Duration {
        self.lease_duration
    }

    /// How long after the start of its last successful write the leader stops writing.
    pub fn renew_deadline(&self) -> Duration {
        self.renew_deadline
    }

    /// Longest interval between two looks at the Lease (each is drawn from
    /// `[retry_period / 2, retry_period]`).
    pub fn retry_period(&self) -> Duration {
        self.retry_period
    }

    fn lease_duration_seconds(&self) -> i32 {
        i32::try_from(self.lease_duration.as_secs()).unwrap_or(i32::MAX)
    }
}

/// Where the Lease is and who we are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderConfig {
    /// Namespace of the Lease.
    pub namespace: String,
    /// Name of the Lease (`aliaslb_core::keys::CONTROLLER_LEASE`).
    pub lease_name: String,
    /// This replica's `holderIdentity` (unique per replica: the pod name).
    pub identity: String,
    /// Durations.
    pub timings: Timings,
}

/// What this replica saw of the Lease record, timed on its own monotonic clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseSeen {
    /// `holderIdentity`; `None` or empty means free (released).
    pub holder: Option<String>,
    /// The record's `leaseDurationSeconds` (the holder's promise), else ours.
    pub lease_duration: Duration,
    /// When this replica first saw this version of the record.
    pub seen_at: Instant,
}

/// What to do next, given the last observation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// No Lease exists: create it with us as holder.
    Create,
    /// The Lease is free or expired: take it over.
    Acquire,
    /// We hold the Lease: renew it.
    Renew,
    /// Someone else holds a Lease that has not expired (on our clock): wait.
    Wait,
    /// We were leading but must stop: the local deadline passed, or the record no longer
    /// names us.
    StepDown,
}

/// The leader-election decision.
///
/// `leading_until` is `Some(deadline)` while this replica leads: the start of its last
/// successful write plus the renew deadline.
pub fn decide(
    observed: Option<&LeaseSeen>,
    me: &str,
    leading_until: Option<Instant>,
    now: Instant,
) -> Decision {
    let holder = observed.and_then(|o| o.holder.as_deref()).unwrap_or("");
    if let Some(until) = leading_until
        && (now >= until || holder != me)
    {
        return Decision::StepDown;
    }
    let Some(observed) = observed else {
        return Decision::Create;
    };
    if holder == me {
        return Decision::Renew;
    }
    if holder.is_empty() {
        return Decision::Acquire;
    }
    match observed.seen_at.checked_add(observed.lease_duration) {
        Some(expiry) if now >= expiry => Decision::Acquire,
        _ => Decision::Wait,
    }
}

/// A writer's view of leadership. Clones share the state.
#[derive(Debug, Clone)]
pub struct Leadership {
    rx: watch::Receiver<bool>,
    fence: Arc<Mutex<Option<Instant>>>,
    /// How long after the fence deadline a write may still run: half the lease's slack
    /// (see the module docs).
    grace: Duration,
}

impl Leadership {
    /// The fencing check: call right before each write. True only while this replica leads
    /// and its local deadline has not passed.
    pub fn is_leader(&self) -> bool {
        let deadline = *self.fence.lock().unwrap_or_else(|e| e.into_inner());
        deadline.is_some_and(|d| Instant::now() < d)
    }

    /// The fencing check with its time bound: `Some(until when a write started now may
    /// still run)` while this replica leads (see the module docs), `None` when it does not.
    pub fn write_deadline(&self) -> Option<Instant> {
        let deadline = (*self.fence.lock().unwrap_or_else(|e| e.into_inner()))?;
        (Instant::now() < deadline).then(|| deadline + self.grace)
    }

    /// Leadership edges: `true` when this replica became leader, `false` when it stopped.
    pub fn watch(&self) -> watch::Receiver<bool> {
        self.rx.clone()
    }

    /// A fixed leadership for tests: leader (for about a century) or never.
    pub fn fixed(leader: bool) -> Self {
        let deadline = leader
            .then(|| Instant::now().checked_add(Duration::from_secs(100 * 365 * 24 * 3600)))
            .flatten();
        let (_tx, rx) = watch::channel(leader);
        Leadership {
            rx,
            fence: Arc::new(Mutex::new(deadline)),
            grace: Duration::from_secs(3600),
        }
    }
}

/// Why a Lease operation failed.
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    /// The API refused or failed the call.
    #[error("Lease API call failed")]
    Api(#[source] kube::Error),
    /// The API did not answer in time.
    #[error("Lease API call timed out after {0:?}")]
    Timeout(Duration),
    /// The election task panicked or was aborted.
    #[error("leader election task failed")]
    Task(#[source] tokio::task::JoinError),
}

/// Step-down reason of a graceful shutdown (logged at info, every other one at warn).
const SHUTTING_DOWN: &str = "shutting down";

/// Running election; stop it with [`ElectorHandle::shutdown`].
#[derive(Debug)]
pub struct ElectorHandle {
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), LeaderError>>,
}

impl ElectorHandle {
    /// Stop: step down at once (writers see `false`), then release the Lease (empty holder)
    /// so another replica takes over at its next look instead of after the lease duration.
    pub async fn shutdown(self) -> Result<(), LeaderError> {
        // The task may have ended already; then there is nothing to stop.
        let _ = self.stop.send(());
        self.task.await.map_err(LeaderError::Task)?
    }

    /// Stop at once without releasing the Lease, as a crash would (others wait the lease
    /// duration). Local leadership ends immediately.
    pub fn abort(self) {
        self.task.abort();
    }
}

/// Start electing: returns the writers' view and the handle that stops it.
pub fn start(client: Client, config: LeaderConfig) -> (Leadership, ElectorHandle) {
    let (tx, rx) = watch::channel(false);
    let fence = Arc::new(Mutex::new(None));
    let timings = config.timings;
    let elector = Elector {
        api: Api::namespaced(client, &config.namespace),
        config,
        tx,
        fence: fence.clone(),
        last: None,
        leading_until: None,
        failing: false,
    };
    let (stop, stopped) = oneshot::channel();
    let task = tokio::spawn(elector.run(stopped));
    (
        Leadership {
            rx,
            fence,
            grace: (timings.lease_duration - timings.renew_deadline) / 2,
        },
        ElectorHandle { stop, task },
    )
}

/// The I/O loop's state.
struct Elector {
    api: Api<Lease>,
    config: LeaderConfig,
    tx: watch::Sender<bool>,
    fence: Arc<Mutex<Option<Instant>>>,
    /// Last record seen: its resourceVersion and our observation of it.
    last: Option<(Option<String>, LeaseSeen)>,
    leading_until: Option<Instant>,
    /// Whether the last API call failed (to log failures on the edge).
    failing: bool,
}

impl Drop for Elector {
    /// However the loop ends (shutdown, abort, panic), this replica stops claiming.
    fn drop(&mut self) {
        self.step_down("election stopped");
    }
}

impl Elector {
    async fn run(mut self, mut stopped: oneshot::Receiver<()>) -> Result<(), LeaderError> {
        let retry = self.config.timings.retry_period;
        tracing::info!(
            lease = %self.config.lease_name,
            namespace = %self.config.namespace,
            identity = %self.config.identity,
            "leader election started"
        );
        loop {
            let started = Instant::now();
            tokio::select! {
                _ = &mut stopped => break,
                () = self.step() => {}
            }
            // Jittered within `[retry / 2, retry]`: never later than the retry period the
            // timings were checked with (`retry < renew_deadline`), and replicas that start
            // or lose the API together do not look in step.
            let next = tokio::time::Instant::from_std(started + jittered(retry));
            tokio::select! {
                _ = &mut stopped => break,
                () = tokio::time::sleep_until(next) => {}
            }
        }
        self.release().await
    }

    /// One look at the Lease and the action it calls for.
    async fn step(&mut self) {
        self.step_down_if_expired();
        let lease = match self.call(self.api.get_opt(&self.config.lease_name)).await {
            Ok(lease) => lease,
            Err(error) => {
                self.failed(&error);
                self.step_down_if_expired();
                return;
            }
        };
        let now = Instant::now();
        self.observe(lease.as_ref(), now);
        let decision = decide(
            self.observed(),
            &self.config.identity,
            self.leading_until,
            now,
        );
        let written = match decision {
            Decision::Wait => return,
            Decision::StepDown => {
                let reason = if self.leading_until.is_some_and(|d| now >= d) {
                    "could not renew the Lease within the renew deadline"
                } else {
                    "the Lease names another holder"
                };
                self.step_down(reason);
                return;
            }
            Decision::Create => {
                let lease = self.new_lease(None);
                self.call(self.api.create(&PostParams::default(), &lease))
                    .await
            }
            Decision::Acquire | Decision::Renew => {
                let Some(current) = lease else { return };
                let lease = self.new_lease(Some(current));
                self.call(
                    self.api
                        .replace(&self.config.lease_name, &PostParams::default(), &lease),
                )
                .await
            }
        };
        match written {
            Ok(lease) => {
                self.recovered();
                self.observe(Some(&lease), now);
                self.lead(now);
            }
            Err(LeaderError::Api(kube::Error::Api(status))) if status.code == 409 => {
                // Someone else wrote first (took over, renewed, or created the Lease).
                tracing::debug!(
                    ?decision,
                    "Lease write conflicted: another replica wrote first"
                );
                self.step_down("another replica wrote the Lease first");
            }
            Err(error) => {
                self.failed(&error);
                self.step_down_if_expired();
            }
        }
    }

    /// Run one API call, bounded so a hung call cannot outlive our leadership deadline.
    async fn call<T>(
        &self,
        fut: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, LeaderError> {
        let limit = match self.leading_until {
            Some(deadline) => deadline.saturating_duration_since(Instant::now()),
            None => self.config.timings.renew_deadline,
        };
        match tokio::time::timeout(limit, fut).await {
            Ok(result) => result.map_err(LeaderError::Api),
            Err(_) => Err(LeaderError::Timeout(limit)),
        }
    }

    fn observed(&self) -> Option<&LeaseSeen> {
        self.last.as_ref().map(|(_, o)| o)
    }

    /// Record the Lease as seen at `now`, restarting the expiry clock only if it changed.
    fn observe(&mut self, lease: Option<&Lease>, now: Instant) {
        let Some(lease) = lease else {
            self.last = None;
            return;
        };
        let version = lease.metadata.resource_version.clone();
        let spec = lease.spec.as_ref();
        let holder = spec.and_then(|s| s.holder_identity.clone());
        let lease_duration = spec
            .and_then(|s| s.lease_duration_seconds)
            .and_then(|s| u64::try_from(s).ok())
            .map_or(self.config.timings.lease_duration, Duration::from_secs);
        let seen_at = match &self.last {
            Some((v, o)) if *v == version => o.seen_at,
            _ => now,
        };
        self.last = Some((
            version,
            LeaseSeen {
                holder,
                lease_duration,
                seen_at,
            },
        ));
    }

    /// The Lease to write: `current` (keeping its resourceVersion for the conflict check)
    /// with us as holder, or a new one.
    fn new_lease(&self, current: Option<Lease>) -> Lease {
        let now = MicroTime(Timestamp::now());
        let me = &self.config.identity;
        let mut lease = current.unwrap_or_else(|| Lease {
            metadata: ObjectMeta {
                name: Some(self.config.lease_name.clone()),
                namespace: Some(self.config.namespace.clone()),
                ..ObjectMeta::default()
            },
            spec: None,
        });
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if spec.holder_identity.as_deref() != Some(me.as_str()) {
            let had_record = spec.acquire_time.is_some() || spec.holder_identity.is_some();
            spec.lease_transitions =
                Some(spec.lease_transitions.unwrap_or(0) + i32::from(had_record));
            spec.holder_identity = Some(me.clone());
            spec.acquire_time = Some(now.clone());
        }
        spec.lease_duration_seconds = Some(self.config.timings.lease_duration_seconds());
        spec.renew_time = Some(now);
        lease
    }

    /// A write that started at `write_started` succeeded: lead until its deadline.
    fn lead(&mut self, write_started: Instant) {
        let deadline = write_started + self.config.timings.renew_deadline;
        self.leading_until = Some(deadline);
        *self.fence.lock().unwrap_or_else(|e| e.into_inner()) = Some(deadline);
        // The fence is set before the edge, so a writer woken by it sees `is_leader()`.
        self.tx.send_if_modified(|leading| {
            let edge = !*leading;
            if edge {
                tracing::info!(identity = %self.config.identity, lease = %self.config.lease_name, "became leader");
                *leading = true;
            }
            edge
        });
    }

    fn step_down_if_expired(&mut self) {
        if self.leading_until.is_some_and(|d| Instant::now() >= d) {
            self.step_down("could not renew the Lease within the renew deadline");
        }
    }

    /// Stop claiming leadership (idempotent; logs on the edge only).
    fn step_down(&mut self, reason: &str) {
        self.leading_until = None;
        *self.fence.lock().unwrap_or_else(|e| e.into_inner()) = None;
        self.tx.send_if_modified(|leading| {
            let edge = *leading;
            if edge {
                if reason == SHUTTING_DOWN {
                    tracing::info!(identity = %self.config.identity, lease = %self.config.lease_name, reason, "stopped leading");
                } else {
                    tracing::warn!(identity = %self.config.identity, lease = %self.config.lease_name, reason, "stopped leading");
                }
                *leading = false;
            }
            edge
        });
    }

    fn failed(&mut self, error: &LeaderError) {
        if !self.failing {
            tracing::warn!(error = %error, source = ?std::error::Error::source(error), lease = %self.config.lease_name, "Lease API call failed; retrying every retry period");
        } else {
            tracing::debug!(error = %error, "Lease API call failed again");
        }
        self.failing = true;
    }

    fn recovered(&mut self) {
        if self.failing {
            tracing::info!(lease = %self.config.lease_name, "Lease API reachable again");
        }
        self.failing = false;
    }

    /// Graceful release: stop writing first, then hand the Lease back if it still names us.
    async fn release(&mut self) -> Result<(), LeaderError> {
        self.step_down(SHUTTING_DOWN);
        let holds = self
            .observed()
            .is_some_and(|o| o.holder.as_deref() == Some(self.config.identity.as_str()));
        if !holds {
            return Ok(());
        }
        let Some(mut lease) = self.call(self.api.get_opt(&self.config.lease_name)).await? else {
            return Ok(());
        };
        let Some(spec) = lease.spec.as_mut() else {
            return Ok(());
        };
        if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        self.call(
            self.api
                .replace(&self.config.lease_name, &PostParams::default(), &lease),
        )
        .await?;
        tracing::info!(lease = %self.config.lease_name, identity = %self.config.identity, "released the leader Lease");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_secs(15);

    #[test]
    fn a_write_may_run_half_the_slack_past_the_fence_and_never_without_it() {
        let (_tx, rx) = watch::channel(true);
        let deadline = Instant::now() + Duration::from_secs(10);
        let leading = Leadership {
            rx: rx.clone(),
            fence: Arc::new(Mutex::new(Some(deadline))),
            grace: (LEASE - Duration::from_secs(10)) / 2,
        };
        assert_eq!(
            leading.write_deadline(),
            Some(deadline + Duration::from_millis(2500)),
            "s + D + (L - D) / 2, before any successor at s + L"
        );
        let expired = Leadership {
            rx: rx.clone(),
            fence: Arc::new(Mutex::new(Some(Instant::now() - Duration::from_millis(1)))),
            grace: Duration::from_secs(2),
        };
        assert_eq!(
            expired.write_deadline(),
            None,
            "past the fence: no write at all"
        );
        assert!(!expired.is_leader());
        let follower = Leadership {
            rx,
            fence: Arc::new(Mutex::new(None)),
            grace: Duration::from_secs(2),
        };
        assert_eq!(follower.write_deadline(), None);
    }

    fn held_by(holder: &str, seen_at: Instant) -> LeaseSeen {
        LeaseSeen {
            holder: (!holder.is_empty()).then(|| holder.to_owned()),
            lease_duration: LEASE,
            seen_at,
        }
    }

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    /// (name, observed, leading_until, now, expected decision for "a").
    type DecisionRow = (
        &'static str,
        Option<LeaseSeen>,
        Option<Instant>,
        Instant,
        Decision,
    );

    #[test]
    fn decisions() {
        let t0 = Instant::now();
        let table: Vec<DecisionRow> = vec![
            ("no Lease: create", None, None, t0, Decision::Create),
            (
                "free: acquire",
                Some(held_by("", t0)),
                None,
                t0,
                Decision::Acquire,
            ),
            (
                "other holder, fresh: wait",
                Some(held_by("b", t0)),
                None,
                t0 + secs(14),
                Decision::Wait,
            ),
            (
                "other holder, unchanged for the lease duration: acquire",
                Some(held_by("b", t0)),
                None,
                t0 + LEASE,
                Decision::Acquire,
            ),
            (
                "ours, not leading (restart with same identity): renew",
                Some(held_by("a", t0)),
                None,
                t0 + secs(100),
                Decision::Renew,
            ),
            (
                "ours, leading within deadline: renew",
                Some(held_by("a", t0)),
                Some(t0 + secs(10)),
                t0 + secs(9),
                Decision::Renew,
            ),
            (
                "ours, deadline passed: step down",
                Some(held_by("a", t0)),
                Some(t0 + secs(10)),
                t0 + secs(10),
                Decision::StepDown,
            ),
            (
                "leading but record names another: step down",
                Some(held_by("b", t0)),
                Some(t0 + secs(10)),
                t0 + secs(1),
                Decision::StepDown,
            ),
            (
                "leading but Lease deleted: step down",
                None,
                Some(t0 + secs(10)),
                t0 + secs(1),
                Decision::StepDown,
            ),
            (
                "leading but Lease released by someone: step down",
                Some(held_by("", t0)),
                Some(t0 + secs(10)),
                t0 + secs(1),
                Decision::StepDown,
            ),
        ];
        for (name, observed, leading_until, now, want) in table {
            assert_eq!(
                decide(observed.as_ref(), "a", leading_until, now),
                want,
                "{name}"
            );
        }
    }

    #[test]
    fn expiry_uses_the_record_duration() {
        let t0 = Instant::now();
        let mut long = held_by("b", t0);
        long.lease_duration = secs(60);
        assert_eq!(decide(Some(&long), "a", None, t0 + LEASE), Decision::Wait);
        assert_eq!(
            decide(Some(&long), "a", None, t0 + secs(60)),
            Decision::Acquire
        );
    }

    #[test]
    fn leader_steps_down_before_a_follower_may_take_over() {
        // The leader's last successful write starts at w; the follower first sees the
        // resulting version at some s >= w. Whatever the delay, the leader's deadline
        // comes strictly before the follower's takeover.
        let timings = Timings::new(LEASE, secs(10), secs(2)).unwrap();
        let w = Instant::now();
        for delay_ms in [0u64, 1, 500, 4_000, 20_000] {
            let seen = w + Duration::from_millis(delay_ms);
            let leader_until = w + timings.renew_deadline();
            let record = held_by("a", seen);
            let mut t = w;
            let mut leader_stopped = None;
            let mut follower_took = None;
            while follower_took.is_none() {
                if leader_stopped.is_none()
                    && decide(Some(&record), "a", Some(leader_until), t) == Decision::StepDown
                {
                    leader_stopped = Some(t);
                }
                if t >= seen && decide(Some(&record), "b", None, t) == Decision::Acquire {
                    follower_took = Some(t);
                }
                t += Duration::from_millis(100);
            }
            let (stopped, took) = (leader_stopped.unwrap(), follower_took.unwrap());
            assert!(
                took - stopped >= LEASE - timings.renew_deadline(),
                "delay {delay_ms}ms: stopped {stopped:?} took {took:?}"
            );
        }
    }

    #[test]
    fn timings_are_validated() {
        assert!(Timings::new(secs(15), secs(10), secs(2)).is_ok());
        let table = [
            (
                Duration::from_millis(1500),
                secs(1),
                Duration::from_millis(500),
                "whole number of seconds",
            ),
            (secs(0), secs(1), secs(1), "whole number of seconds"),
            (
                secs(10),
                secs(10),
                secs(2),
                "must be shorter than the leader lease duration",
            ),
            (
                secs(10),
                secs(5),
                secs(5),
                "must be shorter than the leader renew deadline",
            ),
        ];
        for (lease, renew, retry, want) in table {
            let err = Timings::new(lease, renew, retry).unwrap_err().to_string();
            assert!(err.contains(want), "{err}");
        }
    }

    #[test]
    fn fixed_leadership() {
        assert!(Leadership::fixed(true).is_leader());
        assert!(*Leadership::fixed(true).watch().borrow());
        assert!(!Leadership::fixed(false).is_leader());
    }
}
