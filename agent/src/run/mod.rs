//! The agent's run loop: it wires the parts, each of which owns its state, its tasks and
//! its metrics, and reconciles the aliases when one of them says what is held must change.
//!
//! - the kernel side ([`AliasManager`]): the aliases, their lifetimes, the host-port shield;
//! - the LAN guard ([`LanGuard`]): probes, claims, defences, yields;
//! - fast failover ([`FastFailover`]): takeovers on the standby, step-downs on the holder;
//! - L3 mode ([`Routed`]): the routing daemon's reading, the routed addresses' withdrawal;
//! - the heartbeat ([`Heartbeat`]): the report the Lease carries, the authority, the
//!   kernel rounds that gate the renewals.
//!
//! It reconciles on every desired-set change, kernel change, API return, LAN or failover
//! event and periodic resync; refreshes the lifetimes at every renewal tick; and publishes
//! the report. Generic over the kernel ([`AddressBackend`]), the shield ([`ShieldBackend`])
//! and the LAN ([`LanPort`]), so tests drive it with fakes.

mod report;

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use aliaslb_core::report::{AgentReport, InterfaceReport};
use tokio::sync::{Notify, mpsc, watch};
use tokio::time::{Instant, MissedTickBehavior};
use tracing::{error, info, warn};

use crate::aliases::{AliasManager, ReconcileError, ReconcileReport, refresh_crowded};
use crate::assignments::InForce;
use crate::desired::DesiredSet;
use crate::handover::Handovers;
use crate::heartbeat::{Authority, KernelRounds, LeaseError};
use crate::host::{self, Alias, Link};
use crate::http::Health;
use crate::kernel::backend::{AddressBackend, BackendError};
use crate::l2::failover::FastFailover;
use crate::l2::failover::wire::Wire;
use crate::l2::guard::{After, LanEvent, LanGuard};
use crate::l2::lan::LanPort;
use crate::l3::Routed;
use crate::metrics::Metrics;
use crate::shield::{IPVS_LINK, ShieldBackend};

/// The inputs of the run loop that are not a part's own.
#[derive(Debug)]
pub struct Inputs {
    /// The desired set (`None` until the assignment was read).
    pub desired_rx: watch::Receiver<Option<Arc<DesiredSet>>>,
    /// "Something changed" ticks from the kernel.
    pub changes: mpsc::Receiver<()>,
    /// Signalled when the API is reachable again.
    pub api_back: Arc<Notify>,
    /// Beaten at every renewal tick; set ready after the first reconcile.
    pub health: Health,
    /// Lifetime refresh period (a third of the alias lifetime).
    pub refresh_interval: Duration,
    /// Full reconcile period.
    pub resync_interval: Duration,
}

/// The run loop's ends toward the heartbeat task: where the report goes (it writes the
/// Lease at once when the report changed), this agent's authority, and where completed
/// kernel rounds are recorded (the heartbeat stops renewing when they stop).
#[derive(Debug)]
pub struct Heartbeat {
    /// Where the report goes.
    pub report_tx: watch::Sender<Option<AgentReport>>,
    /// This agent's Lease authority.
    pub authority: Authority,
    /// Where completed kernel rounds are recorded.
    pub kernel: KernelRounds,
}

/// The parts the loop wires.
#[derive(Debug)]
pub struct Parts<L> {
    /// The LAN guard.
    pub lan: LanGuard<L>,
    /// Fast L2 failover.
    pub failover: FastFailover<L>,
    /// L3 mode.
    pub routed: Routed,
    /// The heartbeat's ends.
    pub heartbeat: Heartbeat,
    /// The metrics.
    pub metrics: Arc<Metrics>,
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

/// How often the shield's whole table (drop counters, rules) is read; its chains are read at
/// every renewal (see `shield`: the whole table costs about 0.2 s of CPU with 10,000 IPs).
const SHIELD_TABLE_INTERVAL: Duration = Duration::from_secs(5);

/// The node's links as the loop last saw them.
#[derive(Debug, Default)]
struct Links {
    /// Up/down state of every link at the last look, to re-announce on a link coming up.
    up: BTreeMap<u32, bool>,
    /// Whether the node had a `kube-ipvs0` link at the last look (IPVS kube-proxy).
    ipvs: Option<bool>,
    /// The interfaces and subnets for the report.
    interfaces: Vec<InterfaceReport>,
}

/// The desired set as received, in force, held and given to the alias manager.
#[derive(Debug, Default)]
struct Sets {
    /// The set to hold: in force (as received, less a set kept for a missing object once
    /// the authority is stale: [`InForce`]) with the IPs taken over.
    desired: Arc<DesiredSet>,
    in_force: InForce,
    /// As last given to the alias manager: less what the parts hold back.
    effective: Arc<DesiredSet>,
}

/// The run loop's state.
#[derive(Debug)]
pub struct Agent<B, S, L> {
    aliases: AliasManager<B, S>,
    lan: LanGuard<L>,
    failover: FastFailover<L>,
    routed: Routed,
    heartbeat: Heartbeat,
    metrics: Arc<Metrics>,
    sets: Sets,
    links: Links,
    /// Planned moves keep established connections: the handover tables.
    handovers: Handovers<S>,
    /// The last lifetime refresh took more than half its interval (warned once per spell).
    refresh_crowded: bool,
}

impl<B, S, L> Agent<B, S, L>
where
    B: AddressBackend,
    S: ShieldBackend,
    L: LanPort,
{
    /// A loop over `aliases` and `parts`.
    pub fn new(aliases: AliasManager<B, S>, parts: Parts<L>) -> Self {
        Agent {
            aliases,
            lan: parts.lan,
            failover: parts.failover,
            routed: parts.routed,
            heartbeat: parts.heartbeat,
            metrics: parts.metrics,
            sets: Sets::default(),
            links: Links::default(),
            handovers: Handovers::off(),
            refresh_crowded: false,
        }
    }

    /// Writes the handover tables through `nft` (without it, as in tests: none).
    pub fn with_handovers(mut self, nft: S) -> Self {
        self.handovers = Handovers::new(nft, self.metrics.handover.clone());
        self
    }

    /// Removes the handover tables (at shutdown, before the aliases go).
    pub async fn lift_handovers(&mut self) {
        self.handovers.lift().await;
    }

    /// The alias manager (for the shutdown path) and the report sender (dropping it stops
    /// the heartbeat).
    pub fn into_parts(self) -> (AliasManager<B, S>, watch::Sender<Option<AgentReport>>) {
        (self.aliases, self.heartbeat.report_tx)
    }

    /// The alias manager.
    pub fn aliases(&self) -> &AliasManager<B, S> {
        &self.aliases
    }

    /// Runs until `stop` completes; returns its output (the signal's name).
    pub async fn run(
        &mut self,
        mut inputs: Inputs,
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
        // Transient failures (kernel writes, dumps) are retried at the next renewal tick.
        let mut retry = false;
        loop {
            let cause = tokio::select! {
                biased;
                signal = &mut stop => return signal,
                // First: a claim for a held IP may mean yielding it, at once.
                event = self.lan.next() => match self.on_lan(event) {
                    Some(cause) => cause,
                    None => continue,
                },
                _ = renew.tick() => match self.on_renew_tick(&inputs, synced, retry).await {
                    Some(cause) => cause,
                    None => continue,
                },
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
                event = self.failover.next(synced) => {
                    let lease = self.heartbeat.authority.lease_duration();
                    if self.failover.handle(event, self.aliases.held(), lease) && synced {
                        Cause::Failover
                    } else {
                        continue;
                    }
                }
                () = self.routed.next() => {
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
            };
            let news = cause == Cause::Desired || inputs.desired_rx.has_changed().unwrap_or(false);
            let Some(received) = inputs.desired_rx.borrow_and_update().clone() else {
                continue;
            };
            // A set kept for a missing object was not written by the controller: it ends
            // no yield.
            if news && !received.object_missing() {
                self.lan.desired_changed();
                self.routed.desired_changed();
            }
            let in_force = self
                .sets
                .in_force
                .of(&received, self.heartbeat.authority.may_keep(Instant::now()));
            self.sets.desired = self.failover.settle(in_force);
            let first = !synced;
            retry = self.reconcile(cause, first).await;
            if first {
                synced = true;
                inputs.health.set_ready();
                info!(
                    desired = self.sets.desired.len(),
                    held = self.aliases.held_ips().len(),
                    "first reconcile done"
                );
            }
        }
    }

    /// What the LAN guard woke for; the reconcile it asks for, if any.
    fn on_lan(&mut self, event: LanEvent) -> Option<Cause> {
        let desired = &self.sets.desired;
        match event {
            LanEvent::Claims(claims) => {
                let fresh = self.heartbeat.authority.is_fresh(Instant::now());
                let failover = &mut self.failover;
                let after =
                    self.lan
                        .on_claims(&claims, desired, self.aliases.held(), fresh, |ip, node| {
                            failover.holder_claims(ip, node)
                        });
                match after {
                    After::Nothing => None,
                    After::Publish => {
                        self.publish();
                        None
                    }
                    After::Reconcile => Some(Cause::Lan),
                }
            }
            LanEvent::Probed(done) => {
                self.lan.on_probe(done, desired, self.aliases.held());
                Some(Cause::Probe)
            }
            LanEvent::Timer => Some(Cause::Guard),
        }
    }

    /// At every renewal tick: the health beat, the lifetimes refreshed, the shield's chains
    /// looked at; the reconcile that asks for, if any (only once `synced`).
    async fn on_renew_tick(&mut self, inputs: &Inputs, synced: bool, retry: bool) -> Option<Cause> {
        inputs.health.beat();
        let authority = &self.heartbeat.authority;
        self.metrics
            .heartbeat
            .set_authority_fresh(authority.is_fresh(Instant::now()));
        let expired = self.refresh(inputs.refresh_interval).await;
        // Within one renew interval: a table someone deleted (or a flushed ruleset) is
        // noticed here and rewritten by the reconcile it asks for.
        let damaged = self.look_at_shield(false).await;
        let now = Instant::now();
        let authority = &self.heartbeat.authority;
        let fresh = authority.is_fresh(now);
        let stale = InForce::must_drop(&self.sets.desired, authority.may_keep(now))
            || self
                .routed
                .would_change(authority.stale_past_a_lease(now), fresh);
        match () {
            _ if !synced => None,
            _ if expired => Some(Cause::Resync),
            _ if damaged => Some(Cause::Shield),
            _ if stale => Some(Cause::Stale),
            _ if retry => Some(Cause::Retry),
            _ => None,
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
            self.metrics.kernel.record_refresh(report.took, crowded);
            if crowded && !self.refresh_crowded {
                warn!(
                    aliases = report.refreshed,
                    took_ms = report.took.as_millis(),
                    refresh_interval_ms = interval.as_millis(),
                    "refreshing the aliases' lifetimes takes more than half the refresh \
                     interval (a third of --alias-lifetime): the agent is busy refreshing and \
                     a late round lets aliases lapse; raise --alias-lifetime \
                     (docs/configuration.md, \"Many IPs on one node\")"
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
            self.heartbeat.kernel.record_ok(Instant::now());
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
            self.metrics.shield.set_dropped(dropped);
        }
        if look.damaged {
            self.set_shield_metrics();
            self.publish();
        }
        look.damaged
    }

    fn set_shield_metrics(&self) {
        if let Some(shield) = self.aliases.shield() {
            self.metrics.shield.set(
                shield.state(),
                shield.contents().len(),
                shield.errors(),
                shield.damaged(),
            );
        }
    }

    /// One reconcile of the desired set less what the parts hold back, then the probes the
    /// guard asks for, the LAN port's lists, the report and the metrics; returns whether a
    /// transient failure asks for a retry.
    async fn reconcile(&mut self, cause: Cause, first: bool) -> bool {
        let now = Instant::now();
        let authority = &self.heartbeat.authority;
        let fresh = authority.is_fresh(now);
        let stale_past_a_lease = authority.stale_past_a_lease(now);
        let lease = authority.lease_duration();
        let held_before = self.aliases.held().ips();
        let desired = self.sets.desired.clone();
        let back = self.lan.held_back(&desired, &held_before, fresh);
        self.routed
            .update(&desired, stale_past_a_lease, fresh, lease);
        self.sets.effective = self.effective_of(&back);
        // The forwards of a moved IP before its alias is announced.
        self.handovers
            .update(desired.handovers(), &self.links.interfaces, |ip| {
                desired.contains(ip)
            })
            .await;
        let start = Instant::now();
        let report = self.aliases.reconcile(&self.sets.effective).await;
        let took = start.elapsed();
        self.lan.unplugged(&report.unplugged);
        let repaired = repairs(&held_before, &report);
        if repaired > 0 {
            info!(
                repaired,
                "aliases missing from the node were put back (deleted by someone else, or \
                 lapsed: see aliaslb_agent_refresh_crowded)"
            );
        }
        self.metrics.kernel.record_reconcile(
            report.added.len(),
            report.removed.len(),
            repaired,
            took,
        );
        let mut retry = false;
        for e in &report.errors {
            self.count_error(e);
            retry |= !matches!(e, ReconcileError::Interface { .. });
        }
        if reached_kernel(&report) {
            self.heartbeat.kernel.record_ok(Instant::now());
        }
        let (read, rechecked) = self.look_at_links(fresh);
        retry |= !read;
        if rechecked {
            // Let go of them now, not at the next reconcile: the probes below decide.
            let back = self
                .lan
                .still_held_back(&desired, &self.aliases.held().ips());
            self.sets.effective = self.effective_of(&back);
            let again = self.aliases.reconcile(&self.sets.effective).await;
            for e in &again.errors {
                self.count_error(e);
            }
        }
        self.lan.start_probes(&desired, self.aliases.held());
        self.lan.tell(&desired, self.aliases.held());
        let metrics = &self.metrics.kernel;
        metrics.set_held(self.aliases.owned().map(|a| a.ifname.as_str()));
        metrics.set_desired(desired.len(), report.conflicts.len());
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

    /// What the alias manager is given: the desired set less `back` (held back by the
    /// guard), less the IPs stepped down (fast failover) and, while withdrawn, less the
    /// routed addresses (L3).
    fn effective_of(&self, back: &BTreeSet<IpAddr>) -> Arc<DesiredSet> {
        let desired = &self.sets.desired;
        let mut out: BTreeSet<IpAddr> = back.clone();
        out.extend(self.failover.stepped_down());
        out.extend(self.routed.withdrawn(desired));
        DesiredSet::without(desired.clone(), &out)
    }

    /// Takes links and subnets for the report from the reconcile's own dump, and has the
    /// aliases of links that came back up re-announced (their neighbours may have
    /// forgotten us), only for IPs still desired, or with stale authority (`fresh` false)
    /// re-checked on the LAN first. Returns whether the node could be read and whether any
    /// IP is to be re-checked.
    fn look_at_links(&mut self, fresh: bool) -> (bool, bool) {
        let Some(host) = self.aliases.last_snapshot() else {
            return (false, false);
        };
        self.links.interfaces = host::interfaces(host);
        let ipvs = host.links.iter().any(|l| l.name == IPVS_LINK);
        if self.links.ipvs != Some(ipvs) {
            if ipvs {
                warn!(
                    link = IPVS_LINK,
                    "kube-proxy runs in IPVS mode here, which aliaslb does not support: kube-proxy binds every load-balancer IP to kube-ipvs0 itself, so this agent sees them as another owner's and takes none (AddressConflict); run kube-proxy in iptables or nftables mode"
                );
            } else if self.links.ipvs.is_some() {
                info!(
                    link = IPVS_LINK,
                    "kube-ipvs0 is gone: kube-proxy no longer runs in IPVS mode"
                );
            }
            self.metrics.kernel.set_kube_proxy_ipvs(ipvs);
            self.links.ipvs = Some(ipvs);
        }
        let again = reannouncements(
            &self.links.up,
            &host.links,
            self.aliases.owned(),
            &self.sets.effective,
        );
        if came_up(&self.links.up, &host.links).next().is_some() {
            self.lan.link_up();
        }
        self.links.up = host.links.iter().map(|l| (l.index, l.up)).collect();
        let rechecked = self.lan.links_came_up(&again, fresh);
        (true, rechecked)
    }

    fn count_error(&self, e: &ReconcileError) {
        match e {
            ReconcileError::Snapshot(b) | ReconcileError::Write(b) => self.count_backend_error(b),
            ReconcileError::Interface { .. } | ReconcileError::Shield(_) => {}
        }
    }

    fn count_backend_error(&self, e: &BackendError) {
        self.metrics
            .kernel
            .inc_netlink_error(e.op(), e.is_timeout());
    }
}

/// The agent's end after the loop stopped (the heartbeat stopped first, so nothing re-creates
/// the Lease): every alias removed, the standbys told the IPs were let go (not lost: they
/// take nothing over), then the shield's table (only when every alias is gone: removed
/// first, it would open the aliases' host ports; left in place, the next agent replaces
/// it), then the Lease released so the controller moves at once. Returns whether the
/// aliases and the table are gone, and the Lease's release.
pub async fn shut_down<B: AddressBackend, S: ShieldBackend>(
    mut aliases: AliasManager<B, S>,
    wire: &Wire,
    lease: &crate::heartbeat::Heartbeat,
) -> (bool, Result<(), LeaseError>) {
    let shielded = aliases.shield().is_some();
    let streams = wire.let_go();
    let report = aliases.release_all().await;
    for e in &report.errors {
        error!(error = %e, "could not remove an alias (the kernel drops it when its lifetime ends)");
    }
    wire.goodbye(&streams).await;
    info!(removed = report.removed.len(), "aliases removed");
    let mut clean = report.errors.is_empty();
    if shielded && !clean {
        warn!(
            "some aliases could not be removed: the host-port shield table stays until they expire"
        );
    }
    if shielded && clean {
        match aliases.remove_shield().await {
            Ok(()) => info!("host-port shield table removed"),
            Err(e) => {
                error!(error = %e, "could not remove the host-port shield table `inet aliaslb`");
                clean = false;
            }
        }
    }
    (clean, lease.release().await)
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

/// The links that were down at the last look (`links_before`) and are up now.
fn came_up<'a>(
    links_before: &'a BTreeMap<u32, bool>,
    links_now: &'a [Link],
) -> impl Iterator<Item = &'a Link> + 'a {
    links_now
        .iter()
        .filter(|l| l.up && links_before.get(&l.index) == Some(&false))
}

/// The aliases to re-announce: those on links that were down at the last look and are up
/// now, whose IP is still desired (an alias whose removal failed is not announced again).
pub fn reannouncements<'a>(
    links_before: &BTreeMap<u32, bool>,
    links_now: &[Link],
    owned: impl Iterator<Item = &'a Alias>,
    desired: &DesiredSet,
) -> Vec<(Alias, [u8; 6])> {
    let came_up: BTreeMap<u32, [u8; 6]> = came_up(links_before, links_now)
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
            parent: None,
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
