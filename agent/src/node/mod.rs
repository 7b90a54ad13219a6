//! The agent's run loop: reconcile on every desired-set change, netlink change, API return,
//! LAN event and periodic resync; refresh lifetimes at every renewal tick; publish the
//! report the heartbeat writes.
//!
//! Generic over the kernel ([`AddressBackend`]), the host-port shield ([`ShieldBackend`])
//! and the LAN ([`LanPort`]), so tests drive it with fakes. The decisions about the LAN are
//! the pure [`Guard`]'s; this module does what it asks: probes (spawned, their results come
//! back into the loop), defences, and the reconcile that removes a yielded or foreign-owned
//! IP in the same loop iteration as the claim that was seen.
//!
//! Every kernel round that reached the kernel is recorded in [`KernelRounds`]: the
//! heartbeat stops renewing when they stop (`lease::may_renew`).
//!
//! The LAN side of the loop (probes, claims, defences, what the LAN port watches) is in
//! `lan`.

mod failover;
mod lan;

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use aliaslb_core::advert::Message;
use aliaslb_core::mac::Mac;
use aliaslb_core::report::{
    AgentReport, Conflict, InterfaceReport, MAX_CONFLICTS, REPORT_VERSION, RoutingReport,
};
use tokio::sync::{Notify, mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::{Instant, MissedTickBehavior};
use tracing::{debug, error, info, warn};

use crate::aliases::{AliasManager, DesiredSet, ReconcileError, ReconcileReport, refresh_crowded};
use crate::assignments::InForce;
use crate::host::{self, Alias, Interfaces, Link};
use crate::http::Health;
use crate::kernel::backend::{AddressBackend, BackendError};
use crate::l2::adverts::Stream;
use crate::l2::announce::Announcer;
use crate::l2::failover::{Failover, Heard, HolderCheck};
use crate::l2::fence::{Acked, Fence, Pair, Peers};
use crate::l2::guard::{Guard, GuardConfig, ProbeChange, ProbeRequest, Sighting, Verdict};
use crate::l2::lan::{
    ClaimKind, LanClaim, LanError, LanPort, ProbeConfig, ProbeOutcome, ProbeResults,
};
use crate::l2::vmac;
use crate::l3::{FenceEdge, RoutedFence};
use crate::lease::{Authority, KernelRounds};
use crate::metrics::{Metrics, ProbeMetric};
use crate::shield::{IPVS_LINK, ShieldBackend};

/// The inputs of the run loop.
#[derive(Debug)]
pub struct Loop {
    /// The desired set (`None` until the assignment was read).
    pub desired_rx: watch::Receiver<Option<Arc<DesiredSet>>>,
    /// "Something changed" ticks from the kernel.
    pub changes: mpsc::Receiver<()>,
    /// Claims seen on the LAN for the IPs held (and probed).
    pub observed: mpsc::Receiver<LanClaim>,
    /// Signalled when the API is reachable again.
    pub api_back: Arc<Notify>,
    /// Beaten at every renewal tick; set ready after the first reconcile.
    pub health: Health,
    /// Lifetime refresh period (a third of the alias lifetime).
    pub refresh_interval: Duration,
    /// Full reconcile period.
    pub resync_interval: Duration,
    /// L3 mode: the routing daemon as last read (`None`: not read, `--routing-daemon=none`).
    pub routing: watch::Receiver<Option<RoutingReport>>,
    /// Fast L2 failover: the adverts and acks heard, their MAC verified.
    pub heard: mpsc::Receiver<Message>,
}

/// What the loop shares with the rest of the agent, and its LAN settings.
#[derive(Debug)]
pub struct NodeSetup<L> {
    /// Announces aliases whose link came back up (`None`: no announcements, in tests).
    pub announcer: Option<Announcer>,
    /// The metrics.
    pub metrics: Arc<Metrics>,
    /// Where the report goes (the heartbeat writes it).
    pub report_tx: watch::Sender<Option<AgentReport>>,
    /// The LAN.
    pub lan: Arc<L>,
    /// This agent's Lease authority.
    pub authority: Authority,
    /// Where completed kernel rounds are recorded.
    pub kernel: KernelRounds,
    /// The guard's timers.
    pub guard: GuardConfig,
    /// How first claims are probed.
    pub probe: ProbeConfig,
    /// Fast L2 failover: the standby's state.
    pub failover: Failover,
    /// Fast L2 failover: where the adverts to send are published (`None`: none sent).
    pub streams_tx: Option<watch::Sender<Vec<Stream>>>,
    /// Fast L2 failover: tells, after a takeover, whether the holder is alive and holds the
    /// IP after all (`None`: never asked).
    pub holders: Option<Arc<dyn HolderCheck>>,
}

/// Why a reconcile runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// A new desired set.
    Desired,
    /// A kernel change.
    Netlink,
    /// The periodic resync.
    Resync,
    /// The API is reachable again.
    ApiBack,
    /// A transient failure, retried at a renewal tick.
    Retry,
    /// A claim seen on the LAN.
    Lan,
    /// A probe finished.
    Probe,
    /// A guard timer (a re-probe due, a conflict to forget).
    Guard,
    /// The shield's table was found deleted or altered: it is rewritten.
    Shield,
    /// The authority went stale while the set in force is kept for a missing assignment
    /// object.
    Stale,
    /// Fast L2 failover: an IP taken over, or given back to its holder.
    Failover,
}

/// What the loop does after claims were handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum After {
    /// Nothing changed.
    Nothing,
    /// Only the report changed (a defence, a conflict of an IP held back anyway).
    Publish,
    /// An IP must go: reconcile now.
    Reconcile,
}

/// What a finished fast-failover task (a check, a probe) asks of the loop: a reconcile
/// when it changed what is held (`Ok(true)`); a task that panicked is logged.
fn failover_cause(done: Result<bool, tokio::task::JoinError>, what: &str) -> Option<Cause> {
    match done {
        Ok(true) => Some(Cause::Failover),
        Ok(false) => None,
        Err(e) => {
            error!(error = %e, "{what} failed");
            None
        }
    }
}

/// How often the shield's whole table (drop counters, rules) is read; its chains are read at
/// every renewal (see `shield`: the whole table costs about 0.2 s of CPU with 10,000 IPs).
const SHIELD_TABLE_INTERVAL: Duration = Duration::from_secs(5);

/// Time a probe may take beyond its window before it counts as failed (a LAN port that
/// never answers must not hold a first claim back for ever: it is retried with backoff).
const PROBE_GRACE: Duration = Duration::from_secs(2);

/// A probe that finished: the interface, its name, the IPs, the result.
type ProbeDone = (u32, String, Vec<IpAddr>, ProbeResults);

/// A takeover check that finished: the IP, and whether nobody answered for it.
type CheckDone = (IpAddr, bool);

/// A step-down's API check that finished: the standby, the IPs asked about, those it
/// proved it holds.
type StandbyDone = (String, Vec<IpAddr>, Vec<IpAddr>);

/// The run loop's state.
#[derive(Debug)]
pub struct Node<B, S, L> {
    aliases: AliasManager<B, S>,
    announcer: Option<Announcer>,
    metrics: Arc<Metrics>,
    report_tx: watch::Sender<Option<AgentReport>>,
    lan: Arc<L>,
    authority: Authority,
    kernel: KernelRounds,
    guard: Guard,
    probe_config: ProbeConfig,
    probes: JoinSet<ProbeDone>,
    /// The desired set in force (as received, less a set kept for a missing object once
    /// the authority is stale: [`InForce`]), and as last given to the alias manager.
    desired: Arc<DesiredSet>,
    in_force: InForce,
    effective: Arc<DesiredSet>,
    /// Up/down state of every link at the last look, to re-announce on a link coming up.
    links_up: BTreeMap<u32, bool>,
    /// Whether the node had a `kube-ipvs0` link at the last look (IPVS kube-proxy).
    ipvs: Option<bool>,
    /// The last lifetime refresh took more than half its interval (warned once per spell).
    refresh_crowded: bool,
    interfaces: Vec<InterfaceReport>,
    /// What the LAN port was last told.
    lan_interfaces: Vec<(u32, Mac)>,
    /// L3 mode: the routing daemon as last read.
    routing: Option<RoutingReport>,
    lan_watched: Vec<IpAddr>,
    /// L3: withdraws the routed addresses while cut off from the API.
    routed_fence: RoutedFence,
    /// Fast L2 failover: the standby's state, the checks in flight, the adverts to send.
    failover: Failover,
    checks: JoinSet<CheckDone>,
    streams_tx: Option<watch::Sender<Vec<Stream>>>,
    holders: Option<Arc<dyn HolderCheck>>,
    holder_checks: JoinSet<(String, Vec<IpAddr>)>,
    /// The holders with a check in flight (one each), and the IPs taken over from them
    /// since it began (checked next).
    holders_checking: BTreeMap<String, Vec<IpAddr>>,
    /// Fast L2 failover, the holder's side: the IPs stepped down because nobody acks their
    /// adverts, and the API checks of their standbys.
    fence: Fence,
    standby_checks: JoinSet<StandbyDone>,
    fence_probes: JoinSet<(Pair, bool)>,
    /// The IPs held with a standby (not stepped down), by standby and relay, as of the
    /// last publish.
    pairs: BTreeMap<Pair, Vec<IpAddr>>,
}

impl<B, S, L> Node<B, S, L>
where
    B: AddressBackend,
    S: ShieldBackend,
    L: LanPort,
{
    /// A loop over `aliases`.
    pub fn new(aliases: AliasManager<B, S>, setup: NodeSetup<L>) -> Self {
        Node {
            aliases,
            announcer: setup.announcer,
            metrics: setup.metrics,
            report_tx: setup.report_tx,
            lan: setup.lan,
            authority: setup.authority,
            kernel: setup.kernel,
            guard: Guard::new(setup.guard),
            routed_fence: RoutedFence::default(),
            probe_config: setup.probe,
            probes: JoinSet::new(),
            desired: Arc::default(),
            in_force: InForce::new(),
            effective: Arc::default(),
            links_up: BTreeMap::new(),
            ipvs: None,
            refresh_crowded: false,
            interfaces: Vec::new(),
            lan_interfaces: Vec::new(),
            lan_watched: Vec::new(),
            routing: None,
            fence: Fence::new(setup.failover.config().interval),
            failover: setup.failover,
            checks: JoinSet::new(),
            standby_checks: JoinSet::new(),
            fence_probes: JoinSet::new(),
            pairs: BTreeMap::new(),
            streams_tx: setup.streams_tx,
            holders: setup.holders,
            holder_checks: JoinSet::new(),
            holders_checking: BTreeMap::new(),
        }
    }

    /// The alias manager (for the shutdown path) and the report sender (dropping it stops
    /// the heartbeat).
    pub fn into_parts(self) -> (AliasManager<B, S>, watch::Sender<Option<AgentReport>>) {
        (self.aliases, self.report_tx)
    }

    /// The alias manager.
    pub fn aliases(&self) -> &AliasManager<B, S> {
        &self.aliases
    }

    /// Runs until `stop` completes; returns its output (the signal's name).
    pub async fn run(
        &mut self,
        mut inputs: Loop,
        stop: impl Future<Output = &'static str>,
    ) -> &'static str {
        tokio::pin!(stop);
        let mut renew = tokio::time::interval(inputs.refresh_interval);
        renew.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut resync = tokio::time::interval(inputs.resync_interval);
        resync.set_missed_tick_behavior(MissedTickBehavior::Delay);
        resync.reset();
        let mut table = tokio::time::interval(SHIELD_TABLE_INTERVAL);
        table.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let shielded = self.aliases.shield().is_some();
        let mut synced = false;
        let mut watching = true;
        let mut routing_open = true;
        // Transient failures (kernel writes, dumps) are retried at the next renewal tick.
        let mut retry = false;
        loop {
            let wake = self.guard.next_wakeup();
            let wake_at = wake.map_or_else(
                || Instant::now() + Duration::from_secs(3_600),
                Instant::from_std,
            );
            let due = self.failover.next_due(&self.desired);
            let due_at = due.map_or_else(
                || Instant::now() + Duration::from_secs(3_600),
                Instant::from_std,
            );
            let step = self.next_step_down();
            let step_at = step.unwrap_or_else(|| Instant::now() + Duration::from_secs(3_600));
            let cause = tokio::select! {
                biased;
                signal = &mut stop => return signal,
                // First: a claim for a held IP may mean yielding it, at once.
                Some(claim) = inputs.observed.recv() => {
                    let mut claims = vec![claim];
                    while let Ok(more) = inputs.observed.try_recv() {
                        claims.push(more);
                    }
                    match self.on_claims(&claims) {
                        After::Nothing => continue,
                        After::Publish => {
                            self.publish();
                            continue;
                        }
                        After::Reconcile => Cause::Lan,
                    }
                }
                _ = renew.tick() => {
                    inputs.health.beat();
                    self.metrics.set_authority_fresh(self.authority.is_fresh(Instant::now()));
                    let expired = self.refresh(inputs.refresh_interval).await;
                    // Within one renew interval: a table someone deleted (or a flushed
                    // ruleset) is noticed here and rewritten by the reconcile it asks for.
                    let damaged = self.look_at_shield(false).await;
                    let now = Instant::now();
                    let fresh = self.authority.is_fresh(now);
                    if synced && expired {
                        Cause::Resync
                    } else if synced && damaged {
                        Cause::Shield
                    } else if synced
                        && (InForce::must_drop(&self.desired, self.authority.may_keep(now))
                            || self.routed_fence.would_change(
                                self.authority.stale_past_a_lease(now),
                                fresh,
                            ))
                    {
                        Cause::Stale
                    } else if synced && retry {
                        Cause::Retry
                    } else {
                        continue;
                    }
                }
                changed = inputs.desired_rx.changed(), if watching => {
                    if changed.is_err() {
                        // The watch task ended (it only does on a panic): keep serving
                        // and refreshing what we hold.
                        error!("the assignment watch stopped; the aliases held stay as they are");
                        watching = false;
                        continue;
                    }
                    Cause::Desired
                }
                Some(done) = self.probes.join_next(), if !self.probes.is_empty() => {
                    match done {
                        Ok(done) => self.on_probe(done),
                        Err(e) => error!(error = %e, "a probe task failed"),
                    }
                    Cause::Probe
                }
                Some(message) = inputs.heard.recv() => {
                    let mut messages = vec![message];
                    while let Ok(more) = inputs.heard.try_recv() {
                        messages.push(more);
                    }
                    if self.on_messages(messages) && synced {
                        Cause::Failover
                    } else {
                        continue;
                    }
                }
                () = tokio::time::sleep_until(step_at), if step.is_some() && synced => {
                    self.probe_standbys();
                    continue;
                }
                Some(done) = self.fence_probes.join_next(), if !self.fence_probes.is_empty() => {
                    let done = done.map(|done| self.on_standby_probed(done));
                    let Some(cause) = failover_cause(done, "a probe of a standby") else {
                        continue;
                    };
                    cause
                }
                Some(done) = self.standby_checks.join_next(), if !self.standby_checks.is_empty() => {
                    let done = done.map(|done| self.on_standby_checked(done));
                    let Some(cause) = failover_cause(done, "a standby check") else {
                        continue;
                    };
                    cause
                }
                () = tokio::time::sleep_until(due_at), if due.is_some() && synced => {
                    self.start_checks();
                    continue;
                }
                Some(done) = self.checks.join_next(), if !self.checks.is_empty() => {
                    let done = done.map(|done| self.on_check(done));
                    let Some(cause) = failover_cause(done, "a takeover check") else {
                        continue;
                    };
                    cause
                }
                Some(done) = self.holder_checks.join_next(), if !self.holder_checks.is_empty() => {
                    let done = done.map(|done| self.on_holder_alive(done));
                    let Some(cause) = failover_cause(done, "a holder check") else {
                        continue;
                    };
                    cause
                }
                changed = inputs.routing.changed(), if routing_open => {
                    if changed.is_err() {
                        routing_open = false;
                    }
                    self.routing = inputs.routing.borrow_and_update().clone();
                    self.publish();
                    continue;
                }
                _ = table.tick(), if shielded => {
                    // Rules flushed from a table left in place, and the drop counters.
                    if self.look_at_shield(true).await && synced {
                        Cause::Shield
                    } else {
                        continue;
                    }
                }
                Some(()) = inputs.changes.recv() => Cause::Netlink,
                _ = resync.tick() => Cause::Resync,
                () = inputs.api_back.notified() => Cause::ApiBack,
                () = tokio::time::sleep_until(wake_at), if wake.is_some() => Cause::Guard,
            };
            let news = cause == Cause::Desired || inputs.desired_rx.has_changed().unwrap_or(false);
            let Some(received) = inputs.desired_rx.borrow_and_update().clone() else {
                continue;
            };
            // A set kept for a missing object was not written by the controller: it ends
            // no yield.
            if news && !received.object_missing() {
                self.guard.desired_changed();
                self.routed_fence.desired_changed();
            }
            let in_force = self
                .in_force
                .of(&received, self.authority.may_keep(Instant::now()));
            for ip in self.failover.settle(&in_force) {
                info!(%ip, "takeover over: the assignment no longer names this node the IP's standby for that holder");
            }
            // Held while taken over: as desired as any other IP, never probed.
            self.desired = DesiredSet::with_taken_over(in_force, self.failover.taken());
            self.settle_fence();
            let first = !synced;
            retry = self.reconcile(cause, first).await;
            if first {
                synced = true;
                inputs.health.set_ready();
                info!(
                    desired = self.desired.len(),
                    held = self.aliases.held_ips().len(),
                    "first reconcile done"
                );
            }
        }
    }

    /// Resets the lifetime of every alias held; a refresh without error is a kernel round.
    /// Returns whether the aliases may have expired meanwhile (see
    /// [`crate::aliases::RefreshReport::expired`]): then a reconcile must run instead. A
    /// round that takes more than half of the refresh `interval` is said, once per spell,
    /// in the log and the metrics.
    async fn refresh(&mut self, interval: Duration) -> bool {
        let report = self.aliases.refresh_lifetimes().await;
        for e in &report.errors {
            self.count_error(e);
        }
        if !report.expired {
            let crowded = refresh_crowded(report.took, interval);
            self.metrics.record_refresh(report.took, crowded);
            if crowded && !self.refresh_crowded {
                warn!(
                    aliases = report.refreshed,
                    took_ms = report.took.as_millis(),
                    refresh_interval_ms = interval.as_millis(),
                    "refreshing the aliases' lifetimes takes more than half the refresh \
                     interval (a third of --alias-lifetime): the agent is busy refreshing and \
                     a late round lets aliases lapse; raise --alias-lifetime (README, \"Many \
                     IPs on one node\")"
                );
            } else if !crowded && self.refresh_crowded {
                info!(
                    took_ms = report.took.as_millis(),
                    "refreshing the aliases' lifetimes fits its interval again"
                );
            }
            self.refresh_crowded = crowded;
        }
        if report.errors.is_empty() && !report.expired {
            self.kernel.record_ok(Instant::now());
        }
        report.expired
    }

    /// Looks at the shield's table, its chains only or `whole` (then its drop counters go
    /// into the metrics); returns whether it was found deleted or altered (then the shield
    /// reads `failing`, in the report and the metrics at once, until a reconcile has
    /// rewritten it).
    async fn look_at_shield(&mut self, whole: bool) -> bool {
        let Some(shield) = self.aliases.shield_mut() else {
            return false;
        };
        let look = if whole {
            shield.look().await
        } else {
            shield.look_at_chains().await
        };
        // A failed read is logged by the shield (warn, on the edge) and retried next time.
        let Ok(look) = look else {
            return false;
        };
        if let Some(dropped) = look.dropped {
            self.metrics.set_shield_dropped(dropped);
        }
        if look.damaged {
            self.set_shield_metrics();
            self.publish();
        }
        look.damaged
    }

    fn set_shield_metrics(&self) {
        if let Some(shield) = self.aliases.shield() {
            self.metrics.set_shield(
                shield.state(),
                shield.contents().len(),
                shield.errors(),
                shield.damaged(),
            );
        }
    }

    fn held(&self) -> BTreeSet<IpAddr> {
        self.aliases.held_ips().into_iter().collect()
    }

    /// One reconcile of the desired set less what the guard holds back, then the probes it
    /// asks for, the LAN port's lists, the report and the metrics; returns whether a
    /// transient failure asks for a retry.
    async fn reconcile(&mut self, cause: Cause, first: bool) -> bool {
        let now = Instant::now();
        let fresh = self.authority.is_fresh(now);
        let held_before = self.held();
        for ip in self
            .guard
            .update(&self.desired, &held_before, fresh, now.into_std())
        {
            info!(%ip, "yield over: the Lease is fresh and the assignment still lists the IP");
        }
        let back = self.guard.held_back(&self.desired, &held_before);
        if !back.is_empty() {
            debug!(
                held_back = back.len(),
                "desired IPs held back by the conflict guard"
            );
        }
        self.fence_routed(now, fresh);
        self.effective = self.effective_of(&back);
        let start = Instant::now();
        let report = self.aliases.reconcile(&self.effective).await;
        let took = start.elapsed();
        let repaired = repairs(&held_before, &report);
        if repaired > 0 {
            info!(
                repaired,
                "aliases missing from the node were put back (deleted by someone else, or \
                 lapsed: see aliaslb_agent_refresh_crowded)"
            );
        }
        self.metrics
            .record_reconcile(report.added.len(), report.removed.len(), repaired, took);
        let mut retry = false;
        for e in &report.errors {
            self.count_error(e);
            retry |= !matches!(e, ReconcileError::Interface { .. });
        }
        if reached_kernel(&report) {
            self.kernel.record_ok(Instant::now());
        }
        let (read, rechecked) = self.look_at_links(fresh);
        retry |= !read;
        if rechecked {
            // Let go of them now, not at the next reconcile: the probes below decide.
            let back = self.guard.held_back(&self.desired, &self.held());
            self.effective = self.effective_of(&back);
            let again = self.aliases.reconcile(&self.effective).await;
            for e in &again.errors {
                self.count_error(e);
            }
        }
        self.start_probes();
        self.tell_lan();
        self.metrics
            .set_held(self.aliases.owned().map(|a| a.ifname.as_str()));
        self.metrics
            .set_desired(self.desired.len(), report.conflicts.len());
        self.set_shield_metrics();
        self.publish();
        if report.changed() || !report.errors.is_empty() || first {
            info!(
                ?cause,
                added = report.added.len(),
                removed = report.removed.len(),
                adopted = report.adopted.len(),
                conflicts = report.conflicts.len(),
                held_back = back.len(),
                errors = report.errors.len(),
                took_ms = took.as_millis(),
                "reconciled"
            );
        }
        retry
    }

    /// The routed addresses of the desired set.
    fn routed(&self) -> BTreeSet<IpAddr> {
        self.desired
            .iter()
            .map(|(ip, _)| ip)
            .filter(|ip| self.desired.is_routed(*ip))
            .collect()
    }

    /// Moves the L3 fence ([`RoutedFence`]) to the authority at `now` and says so on an
    /// edge; the metric counts the routed addresses it keeps out.
    fn fence_routed(&mut self, now: Instant, fresh: bool) {
        let stale = self.authority.stale_past_a_lease(now);
        let routed = self.routed();
        match self.routed_fence.update(stale, fresh) {
            _ if routed.is_empty() => {}
            FenceEdge::Withdrawn => warn!(
                routed = routed.len(),
                stale_for = ?self.authority.lease_duration(),
                "the Lease has been stale for a lease duration (cut off from the API?): withdrawing the routed addresses, which the controller may give to other Services now; they come back once the Lease is renewed and the assignment read again"
            ),
            FenceEdge::Restored => info!(
                routed = routed.len(),
                "Lease renewed and assignment read again: the routed addresses it lists are announced again"
            ),
            FenceEdge::None => {}
        }
        let out = if self.routed_fence.withdrawn() {
            routed.len()
        } else {
            0
        };
        self.metrics.set_routed_withdrawn(out);
    }

    /// What the alias manager is given: the desired set less `back` (held back by the
    /// guard), less the IPs stepped down ([`Fence`]) and, while the L3 fence is up, less
    /// the routed addresses.
    fn effective_of(&self, back: &BTreeSet<IpAddr>) -> Arc<DesiredSet> {
        let mut out: BTreeSet<IpAddr> = back.clone();
        out.extend(self.fence.stepped_down().map(|(ip, _)| ip));
        if self.routed_fence.withdrawn() {
            out.extend(self.routed());
        }
        DesiredSet::without(self.desired.clone(), &out)
    }

    /// Takes links and subnets for the report from the reconcile's own dump, and
    /// re-announces the aliases of links that came back up (their neighbours may have
    /// forgotten us), only for IPs still desired. With stale authority (`fresh` false) it
    /// does not re-announce them but has the guard re-check them on the LAN first
    /// ([`Guard::recheck`]). Returns whether the node could be read and whether any IP is
    /// to be re-checked.
    fn look_at_links(&mut self, fresh: bool) -> (bool, bool) {
        let Some(host) = self.aliases.last_snapshot() else {
            return (false, false);
        };
        self.interfaces = host::interfaces(host);
        let ipvs = host.links.iter().any(|l| l.name == IPVS_LINK);
        if self.ipvs != Some(ipvs) {
            if ipvs {
                warn!(
                    link = IPVS_LINK,
                    "kube-proxy runs in IPVS mode here, which aliaslb does not support: kube-proxy binds every load-balancer IP to kube-ipvs0 itself, so this agent sees them as another owner's and takes none (AddressConflict); run kube-proxy in iptables or nftables mode"
                );
            } else if self.ipvs.is_some() {
                info!(
                    link = IPVS_LINK,
                    "kube-ipvs0 is gone: kube-proxy no longer runs in IPVS mode"
                );
            }
            self.metrics.set_kube_proxy_ipvs(ipvs);
            self.ipvs = Some(ipvs);
        }
        let again = reannouncements(
            &self.links_up,
            &host.links,
            self.aliases.owned(),
            &self.effective,
        );
        let links_up = host.links.iter().map(|l| (l.index, l.up)).collect();
        let rechecked = !fresh && !again.is_empty();
        if rechecked {
            let now = Instant::now().into_std();
            for (alias, _) in &again {
                warn!(alias = %alias, "link came back up while this agent's Lease is stale: re-checking the IP on the LAN before holding it again");
                self.guard.recheck(alias.ip, now);
            }
        } else if let Some(announcer) = &self.announcer {
            for (alias, mac) in &again {
                info!(alias = %alias, "link came back up: re-announcing");
                announcer.announce(alias, *mac);
            }
        }
        self.links_up = links_up;
        (true, rechecked)
    }

    /// Publishes the report; the heartbeat writes the Lease at once when it changed.
    fn publish(&mut self) {
        self.publish_streams();
        let lan = self.guard.conflicts();
        self.metrics.set_lan_conflicts(lan.len());
        let mut conflicts: Vec<Conflict> = self
            .aliases
            .conflicts()
            .map(|c| Conflict {
                while_held: false,
                yielded: false,
                mac: None,
                interface: None,
                ip: c.ip,
                reason: format!("already configured on {} by another owner", c.ifname),
            })
            .collect();
        conflicts.extend(lan);
        conflicts.truncate(MAX_CONFLICTS);
        // An alias on a link without carrier answers nobody: not held, so the controller's
        // break-before-make can move its IP at once.
        let held: BTreeSet<IpAddr> = self
            .aliases
            .owned()
            .filter(|a| self.links_up.get(&a.ifindex) != Some(&false))
            .map(|a| a.ip)
            .collect();
        let virtual_links: BTreeSet<u32> = self
            .aliases
            .last_snapshot()
            .map(|host| {
                host.links
                    .iter()
                    .filter(|l| vmac::is_ours(l))
                    .map(|l| l.index)
                    .collect()
            })
            .unwrap_or_default();
        let report = AgentReport {
            version: REPORT_VERSION,
            interfaces: self.interfaces.clone(),
            conflicts,
            shield: self.aliases.shield_state(),
            held: held.clone(),
            // Every Ethernet link of the node's own (a NIC with or without carrier or
            // addresses, not a pod's veth: `host::is_node_link`), so that no other agent
            // takes this node for a foreign host. Not the virtual MACs: they move with
            // their IPs and belong to no node.
            macs: self
                .lan_interfaces
                .iter()
                .filter(|(index, _)| !virtual_links.contains(index))
                .map(|(_, mac)| *mac)
                .collect::<BTreeSet<Mac>>()
                .into_iter()
                .collect(),
            // What the daemon exports of the routed addresses held: the rest is not ours.
            routing: self.routing.clone().map(|mut routing| {
                routing
                    .exported
                    .retain(|ip| self.desired.is_routed(*ip) && held.contains(ip));
                routing
            }),
        };
        self.report_tx.send_if_modified(|current| {
            let changed = current.as_ref() != Some(&report);
            if changed {
                *current = Some(report);
            }
            changed
        });
    }

    fn count_error(&self, e: &ReconcileError) {
        match e {
            ReconcileError::Snapshot(b) | ReconcileError::Write(b) => self.count_backend_error(b),
            ReconcileError::Interface { .. } | ReconcileError::Shield(_) => {}
        }
    }

    fn count_backend_error(&self, e: &BackendError) {
        self.metrics.inc_netlink_error(e.op());
        if e.is_timeout() {
            self.metrics.inc_netlink_timeout(e.op());
        }
    }
}

/// Whether a reconcile reached the kernel: it read the node and no request went
/// unanswered. A refused write is an answer (the report says what is held); a dump that
/// failed or a request that timed out says nothing about what the kernel holds.
fn reached_kernel(report: &ReconcileReport) -> bool {
    !report.errors.iter().any(|e| match e {
        ReconcileError::Snapshot(_) => true,
        ReconcileError::Write(b) => b.is_timeout(),
        ReconcileError::Interface { .. } | ReconcileError::Shield(_) => false,
    })
}

/// The aliases to re-announce: those on links that were down at the last look and are up
/// now, whose IP is still desired (an alias whose removal failed is not announced again).
pub fn reannouncements<'a>(
    links_before: &BTreeMap<u32, bool>,
    links_now: &[Link],
    owned: impl Iterator<Item = &'a Alias>,
    desired: &DesiredSet,
) -> Vec<(Alias, [u8; 6])> {
    let came_up: BTreeMap<u32, [u8; 6]> = links_now
        .iter()
        .filter(|l| l.up && links_before.get(&l.index) == Some(&false))
        .filter_map(|l| Some((l.index, l.mac?)))
        .collect();
    owned
        .filter(|a| desired.contains(a.ip))
        .filter_map(|a| Some((a.clone(), *came_up.get(&a.ifindex)?)))
        .collect()
}

/// Aliases this reconcile put back that we held before and did not remove on purpose
/// (someone else deleted them, or their lifetime ran out before a refresh).
pub fn repairs(held_before: &BTreeSet<IpAddr>, report: &ReconcileReport) -> usize {
    let moved: BTreeSet<IpAddr> = report.removed.iter().map(|a| a.ip).collect();
    report
        .added
        .iter()
        .filter(|a| held_before.contains(&a.ip) && !moved.contains(&a.ip))
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(index: u32, up: bool) -> Link {
        Link {
            index,
            name: format!("eth{index}"),
            mac: Some([2, 0, 0, 0, 0, index as u8]),
            kind: None,
            up,
        }
    }

    fn alias(ip: &str, ifindex: u32) -> Alias {
        Alias {
            ip: ip.parse().unwrap(),
            ifindex,
            ifname: format!("eth{ifindex}"),
        }
    }

    #[test]
    fn a_link_regaining_carrier_reannounces_only_desired_ips_on_it() {
        let before: BTreeMap<u32, bool> = [(2, false), (3, true), (4, false)].into();
        let now = [link(2, true), link(3, true), link(4, false)];
        let owned = [
            alias("10.0.0.1", 2),
            alias("10.0.0.2", 2),
            alias("10.0.0.3", 3),
            alias("10.0.0.4", 4),
        ];
        let desired: DesiredSet = ["10.0.0.1", "10.0.0.3", "10.0.0.4"]
            .iter()
            .map(|s| (s.parse().unwrap(), None))
            .collect();
        let again = reannouncements(&before, &now, owned.iter(), &desired);
        assert_eq!(again, vec![(alias("10.0.0.1", 2), [2, 0, 0, 0, 0, 2])]);
        // Nothing known before (the first look): nothing came up.
        assert!(reannouncements(&BTreeMap::new(), &now, owned.iter(), &desired).is_empty());
    }
}
