//! The LAN guard: what the LAN says about the IPs this node holds or is about to claim.
//!
//! - [`rules`]: the decisions, pure ([`Guard`]): probe first claims, yield, defend, report.
//! - [`LanGuard`] (here): does what they ask, over a [`LanPort`]: the probes (spawned,
//!   their results come back through [`LanGuard::next`]), the claims the LAN watch saw, the
//!   defences, the re-announcements of links that came back, and what the port is told to
//!   watch. It owns its state, its tasks and its metrics; the run loop hands it the
//!   desired set and what is held, and reconciles when it asks.

pub mod rules;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use aliaslb_core::mac::Mac;
use aliaslb_core::report::Conflict;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tracing::{debug, info, warn};

pub use rules::{Guard, GuardConfig, ProbeChange, ProbeRequest, Sighting, Verdict};

use crate::desired::DesiredSet;
use crate::host::{self, Alias, Held, Interfaces, Link};
use crate::l2::announce::Announcer;
use crate::l2::lan::{
    ClaimKind, LanClaim, LanError, LanPort, ProbeConfig, ProbeOutcome, ProbeResults,
};
use crate::l2::metrics::{LanMetrics, ProbeMetric};
use crate::l2::sleep_until;
use crate::l2::vmac;

/// Time a probe may take beyond its window before it counts as failed (a LAN port that
/// never answers must not hold a first claim back for ever: it is retried with backoff).
const PROBE_GRACE: Duration = Duration::from_secs(2);

/// A probe that finished: the interface, its name, the IPs, the result.
pub type ProbeDone = (u32, String, Vec<IpAddr>, ProbeResults);

/// What woke the guard.
#[derive(Debug)]
pub enum LanEvent {
    /// Claims the LAN watch saw (all those queued).
    Claims(Vec<LanClaim>),
    /// A probe finished.
    Probed(ProbeDone),
    /// A guard timer: a re-probe due, a conflict to forget.
    Timer,
}

/// What the run loop does after claims were handled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum After {
    /// Nothing changed.
    Nothing,
    /// Only the report changed (a defence, a conflict of an IP held back anyway).
    Publish,
    /// An IP must go: reconcile now.
    Reconcile,
}

/// The guard's settings and ends.
#[derive(Debug)]
pub struct LanGuardSetup<L> {
    /// The LAN.
    pub lan: Arc<L>,
    /// Claims the LAN port saw for the IPs watched.
    pub claims: mpsc::Receiver<LanClaim>,
    /// The guard's timers.
    pub guard: GuardConfig,
    /// How first claims are probed.
    pub probe: ProbeConfig,
    /// How an IP held before is re-checked (quickly: it is unanswered meanwhile).
    pub recheck: ProbeConfig,
    /// Re-announces aliases whose link came back up (`None`: none, in tests).
    pub announcer: Option<Announcer>,
    /// Its metrics.
    pub metrics: LanMetrics,
}

/// The LAN guard at work.
#[derive(Debug)]
pub struct LanGuard<L> {
    lan: Arc<L>,
    claims: mpsc::Receiver<LanClaim>,
    claims_open: bool,
    guard: Guard,
    probe_config: ProbeConfig,
    recheck_config: ProbeConfig,
    /// IPs this node held before its start, re-checked on the LAN before they are held
    /// again, once a desired set says which are still this node's.
    returning: Option<BTreeSet<IpAddr>>,
    probes: JoinSet<ProbeDone>,
    announcer: Option<Announcer>,
    metrics: LanMetrics,
    /// What the LAN port was last told: the links with our MACs, the IPs watched.
    interfaces: Vec<(u32, Mac)>,
    watched: Vec<IpAddr>,
    /// The MACs of those links.
    node_macs: BTreeSet<Mac>,
}

impl<L: LanPort> LanGuard<L> {
    /// A guard over `setup.lan`.
    pub fn new(setup: LanGuardSetup<L>) -> Self {
        LanGuard {
            lan: setup.lan,
            claims: setup.claims,
            claims_open: true,
            guard: Guard::new(setup.guard),
            probe_config: setup.probe,
            recheck_config: setup.recheck,
            returning: None,
            probes: JoinSet::new(),
            announcer: setup.announcer,
            metrics: setup.metrics,
            interfaces: Vec::new(),
            watched: Vec::new(),
            node_macs: BTreeSet::new(),
        }
    }

    /// The next thing to act on: claims first (a claim for a held IP may mean yielding it
    /// at once), then a finished probe, then a guard timer. Pending while there is none.
    pub async fn next(&mut self) -> LanEvent {
        let wake = self.guard.next_wakeup().map(Instant::from_std);
        tokio::select! {
            biased;
            claim = self.claims.recv(), if self.claims_open => match claim {
                Some(claim) => {
                    let mut claims = vec![claim];
                    while let Ok(more) = self.claims.try_recv() {
                        claims.push(more);
                    }
                    LanEvent::Claims(claims)
                }
                None => {
                    self.claims_open = false;
                    std::future::pending().await
                }
            },
            Some(done) = self.probes.join_next(), if !self.probes.is_empty() => match done {
                Ok(done) => LanEvent::Probed(done),
                Err(e) => {
                    tracing::error!(error = %e, "a probe task failed");
                    LanEvent::Timer
                }
            },
            () = sleep_until(wake), if wake.is_some() => LanEvent::Timer,
        }
    }

    /// The IPs this node's kernel still had when the agent started (and that were taken
    /// down: [`crate::l2::returning::ask_the_lan_first`]): those the first desired set lists
    /// are re-checked on the LAN before they are held again. A returning holder asks the
    /// LAN first: another node may have taken them over meanwhile.
    pub fn returning(&mut self, ips: impl IntoIterator<Item = IpAddr>) {
        self.returning = Some(ips.into_iter().collect());
    }

    /// A new desired set came from the controller: it may end yields.
    pub fn desired_changed(&mut self) {
        self.guard.desired_changed();
    }

    /// Moves the guard to the set about to be reconciled (yields may end), and returns the
    /// desired IPs it holds back from the alias manager.
    pub fn held_back(
        &mut self,
        desired: &DesiredSet,
        held: &BTreeSet<IpAddr>,
        fresh: bool,
    ) -> BTreeSet<IpAddr> {
        let now = Instant::now().into_std();
        if let Some(returning) = self.returning.take() {
            for ip in returning.into_iter().filter(|ip| desired.contains(*ip)) {
                info!(%ip, "held before this agent started: asking the LAN who answers for it before holding it again");
                self.guard.recheck(ip, now);
            }
        }
        for ip in self.guard.update(desired, held, fresh, now) {
            info!(%ip, "yield over: the Lease is fresh and the assignment still lists the IP");
        }
        let back = self.guard.held_back(desired, held);
        if !back.is_empty() {
            debug!(
                held_back = back.len(),
                "desired IPs held back by the conflict guard"
            );
        }
        back
    }

    /// The desired IPs held back now, as [`Self::held_back`] without moving the guard.
    pub fn still_held_back(
        &self,
        desired: &DesiredSet,
        held: &BTreeSet<IpAddr>,
    ) -> BTreeSet<IpAddr> {
        self.guard.held_back(desired, held)
    }

    /// The aliases of links that came back up: re-announced with fresh authority; with
    /// stale authority (`fresh` false) re-checked on the LAN before they are held again
    /// ([`Guard::recheck`]). Returns whether any is re-checked.
    pub fn links_came_up(&mut self, again: &[(Alias, [u8; 6])], fresh: bool) -> bool {
        if !fresh && !again.is_empty() {
            let now = Instant::now().into_std();
            for (alias, _) in again {
                warn!(alias = %alias, "link came back up while this agent's Lease is stale: re-checking the IP on the LAN before holding it again");
                self.guard.recheck(alias.ip, now);
            }
            return true;
        }
        if let Some(announcer) = &self.announcer {
            for (alias, mac) in again {
                info!(alias = %alias, "link came back up: re-announcing");
                announcer.announce(alias, *mac);
            }
        }
        false
    }

    /// Desired IPs the alias manager did not add because their link has no carrier: held
    /// back until the link is back and nobody answers for them on the LAN.
    pub fn unplugged(&mut self, ips: &[IpAddr]) {
        let now = Instant::now().into_std();
        for ip in ips {
            info!(%ip, "its link has no carrier: not added; asking the LAN who answers for it once the link is back");
            self.guard.unplugged(*ip, now);
        }
    }

    /// A link regained carrier: the probes that waited are due now.
    pub fn link_up(&mut self) {
        self.guard.link_up(Instant::now().into_std());
    }

    /// The LAN conflicts to report.
    pub fn conflicts(&self) -> Vec<Conflict> {
        let conflicts = self.guard.conflicts();
        self.metrics.set_conflicts(conflicts.len());
        conflicts
    }

    /// The MACs of the node's own links on the LAN (not the virtual MACs, which move with
    /// their IPs), for the report.
    pub fn node_macs(&self) -> &BTreeSet<Mac> {
        &self.node_macs
    }

    /// Starts the probes the guard asks for, one `probe_many` per interface.
    pub fn start_probes(&mut self, desired: &DesiredSet, held: Held<'_>) {
        let now = Instant::now().into_std();
        let due = self.guard.due_probes(desired, &held.ips(), now);
        if due.is_empty() {
            return;
        }
        let Some(host) = held.host() else {
            for p in due {
                self.guard.probe_failed(p.ip, now);
            }
            return;
        };
        let mut by_link: BTreeMap<(u32, bool), (String, Mac, Vec<IpAddr>)> = BTreeMap::new();
        let mut unprobed = Vec::new();
        let interfaces = Interfaces::of(host);
        for ProbeRequest {
            ip,
            ifindex,
            recheck,
        } in due
        {
            match probe_link(&interfaces, desired, held.interface_override(), ip, ifindex) {
                Some((link, mac)) => by_link
                    .entry((link.index, recheck))
                    .or_insert_with(|| (link.name.clone(), mac, Vec::new()))
                    .2
                    .push(ip),
                None => unprobed.push(ip),
            }
        }
        for ip in unprobed {
            debug!(%ip, "no Ethernet interface with carrier to probe on: retried later");
            self.guard.probe_failed(ip, now);
        }
        for ((ifindex, recheck), (ifname, mac, ips)) in by_link {
            let config = if recheck {
                self.recheck_config
            } else {
                self.probe_config
            };
            debug!(interface = %ifname, ips = ips.len(), recheck, "probing before a first claim or a re-claim");
            let probe = self.lan.probe_many(ifindex, mac, ips.clone(), config);
            let limit = config.window() + PROBE_GRACE;
            self.probes.spawn(async move {
                let result = tokio::time::timeout(limit, probe)
                    .await
                    .unwrap_or_else(|_| {
                        Err(LanError::Io {
                            ifindex,
                            source: std::io::Error::new(
                                std::io::ErrorKind::TimedOut,
                                format!("the probe did not finish within {limit:?}"),
                            ),
                        })
                    });
                (ifindex, ifname, ips, result)
            });
        }
    }

    /// Hands a finished probe to the guard.
    pub fn on_probe(
        &mut self,
        (ifindex, ifname, ips, result): ProbeDone,
        desired: &DesiredSet,
        held: Held<'_>,
    ) {
        let now = Instant::now().into_std();
        let outcomes = match result {
            Ok(outcomes) => outcomes,
            Err(e) => {
                warn!(interface = %ifname, error = %e, ips = ips.len(), "cannot probe: first claims wait, retried with backoff");
                for ip in ips {
                    self.metrics.inc_probe(ProbeMetric::Failed);
                    self.guard.probe_failed(ip, now);
                }
                return;
            }
        };
        for ip in ips {
            let Some(outcome) = outcomes.get(&ip).copied() else {
                self.metrics.inc_probe(ProbeMetric::Failed);
                self.guard.probe_failed(ip, now);
                continue;
            };
            let who = match outcome {
                ProbeOutcome::Free => {
                    self.metrics.inc_probe(ProbeMetric::Free);
                    None
                }
                ProbeOutcome::Taken { mac } => {
                    self.metrics.inc_probe(ProbeMetric::Taken);
                    Some(sighting(desired, held, mac, ifindex, Some(&ifname)))
                }
            };
            let mac = who.as_ref().map(|w| w.mac);
            match self.guard.probe_result(ip, outcome, who, desired, now) {
                ProbeChange::Conflict => {
                    warn!(%ip, interface = %ifname, mac = ?mac.map(|m| m.to_string()), "address conflict: another host answered the probe; not taken")
                }
                ProbeChange::ConflictGone => {
                    info!(%ip, interface = %ifname, "conflict over: nobody answers the probe any more")
                }
                ProbeChange::Cleared => debug!(%ip, interface = %ifname, "probe: free"),
                ProbeChange::StillTaken => {
                    debug!(%ip, interface = %ifname, "re-probe: still taken")
                }
                ProbeChange::Nothing => {}
            }
        }
    }

    /// Hands claims seen on the LAN to the guard and does what it says; returns what must
    /// follow at once. `holder_claims` is asked first for every claim that uses an IP: an
    /// IP taken over from its holder goes back when that holder speaks for it (fast
    /// failover), and then the guard does not judge it.
    pub fn on_claims(
        &mut self,
        claims: &[LanClaim],
        desired: &DesiredSet,
        held: Held<'_>,
        fresh: bool,
        mut holder_claims: impl FnMut(IpAddr, Option<&str>) -> bool,
    ) -> After {
        let held_ips = held.ips();
        let now = Instant::now().into_std();
        let mut after = After::Nothing;
        for claim in claims {
            // This node's own announcement from the IP's virtual MAC, heard on the parent
            // link before the port learnt the MAC (the reconcile that creates a virtual
            // MAC's link announces from it at once, and tells the port after): never a
            // claim, as it is not once the port knows the MAC.
            if desired.vmac(claim.ip) == Some(claim.mac) && held.alias(claim.ip).is_some() {
                continue;
            }
            let who = sighting(desired, held, claim.mac, claim.ifindex, None);
            if claim.kind == ClaimKind::Uses && holder_claims(claim.ip, who.node.as_deref()) {
                after = After::Reconcile;
                continue;
            }
            let (ip, mac, ifname) = (claim.ip, claim.mac, who.ifname.clone());
            let link = own_link(desired, held, ip);
            let verdict = self
                .guard
                .observe(claim, who, desired, &held_ips, fresh, link, now);
            let needs = match &verdict {
                Verdict::Ignore | Verdict::Elsewhere => After::Nothing,
                Verdict::Defend { .. } | Verdict::Defended | Verdict::Taken => After::Publish,
                Verdict::Yield { .. } | Verdict::Remove => After::Reconcile,
            };
            match &verdict {
                Verdict::Ignore => continue,
                Verdict::Elsewhere => {
                    self.metrics.inc_claim_elsewhere();
                    debug!(%ip, interface = %ifname, %mac, "a claim heard on another link than the address's own: ignored");
                    continue;
                }
                Verdict::Yield { node } => {
                    self.metrics.inc_yield();
                    warn!(%ip, interface = %ifname, %mac, %node, "another node claims a held IP while this agent's Lease is stale: yielding it");
                }
                Verdict::Remove => {
                    warn!(%ip, interface = %ifname, %mac, "a host that is none of this node's peers claims a held IP while this agent's Lease is stale: removing it");
                }
                Verdict::Defend { node: Some(node) } => {
                    self.defend(held, ip);
                    warn!(%ip, interface = %ifname, %mac, %node, "another node claims a held IP while this agent's Lease is fresh: defended");
                }
                Verdict::Defend { node: None } => {
                    self.defend(held, ip);
                    warn!(%ip, interface = %ifname, %mac, "a host that is none of this node's peers claims a held IP while this agent's Lease is fresh: defended, kept");
                }
                Verdict::Defended => {
                    debug!(%ip, %mac, "claimed again within the defence interval")
                }
                Verdict::Taken => {
                    warn!(%ip, interface = %ifname, %mac, "another host claims an IP being probed: not taken")
                }
            }
            after = after.max(needs);
        }
        after
    }

    /// Sends one defence of held `ip` from its link's MAC (a virtual MAC's through the
    /// parent's socket).
    fn defend(&self, held: Held<'_>, ip: IpAddr) {
        let Some(alias) = held.alias(ip) else {
            return;
        };
        let mac = held
            .host()
            .and_then(|h| h.links.iter().find(|l| l.index == alias.ifindex))
            .and_then(|l| l.mac);
        let Some(mac) = mac else {
            debug!(alias = %alias, "link has no Ethernet address: no defence");
            return;
        };
        match self
            .lan
            .defend(on_the_lan(held, alias.ifindex), Mac(mac), ip)
        {
            Ok(()) => self.metrics.inc_defence(),
            Err(e) => warn!(alias = %alias, error = %e, "defence not sent"),
        }
    }

    /// Tells the LAN port the links (with our MACs), and the IPs held when they changed.
    pub fn tell(&mut self, desired: &DesiredSet, held: Held<'_>) {
        if let Some(host) = held.host() {
            // The node's own links only: no socket (and thread) per pod veth or CNI
            // bridge, and no MAC of theirs in the report. A link an L2 alias is on counts
            // as the node's whatever its kind (`--interface` or the pool's `interface`
            // may name a veth or bridge without an address of the node). A virtual MAC's
            // macvlan is watched through its parent: one socket per parent link, however
            // many virtual MACs it carries (the parent's socket sees their frames too).
            let carrying: BTreeSet<u32> = held
                .aliases()
                .filter(|a| !desired.is_routed(a.ip))
                .map(|a| on_the_lan(held, a.ifindex))
                .collect();
            let interfaces: Vec<(u32, Mac)> = host
                .links
                .iter()
                .filter(|l| host::is_node_link(host, l) || carrying.contains(&l.index))
                // Our own macvlans are watched through their parents (below).
                .filter(|l| !vmac::is_ours(l))
                .filter_map(|l| Some((l.index, Mac(l.mac?))))
                // Loopback's all-zero address is no Ethernet interface.
                .filter(|(_, mac)| mac.0 != [0; 6])
                .collect();
            self.node_macs = interfaces.iter().map(|(_, mac)| *mac).collect();
            // The virtual MACs are ours too (their frames are no claims), on their
            // parent's socket.
            let virtual_macs = host
                .links
                .iter()
                .filter(|l| vmac::is_ours(l))
                .filter_map(|l| Some((l.parent?, Mac(l.mac?))))
                .filter(|(parent, _)| carrying.contains(parent));
            let told: Vec<(u32, Mac)> = interfaces.iter().copied().chain(virtual_macs).collect();
            // Every time, not only on a change: the port retries there the sockets it
            // could not open (cheap when nothing changed).
            self.lan.set_interfaces(&told);
            self.interfaces = interfaces;
        }
        // Routed (L3) addresses are on no LAN: nobody else's claim is news for them.
        let mut watched: Vec<IpAddr> = held.ips().into_iter().collect();
        watched.retain(|ip| !desired.is_routed(*ip));
        if watched != self.watched {
            self.lan.set_watched(&watched);
            self.watched = watched;
        }
    }
}

/// The link `ip`'s claims count on: its alias's, else the one its alias would go on (where
/// a first claim is probed). `None`: no such link.
fn own_link(desired: &DesiredSet, held: Held<'_>, ip: IpAddr) -> Option<u32> {
    // Per claim, and a flood of forged claims must stay cheap: a look-up, not a scan.
    if let Some(alias) = held.alias(ip) {
        return Some(on_the_lan(held, alias.ifindex));
    }
    let host = held.host()?;
    probe_link(
        &Interfaces::of(host),
        desired,
        held.interface_override(),
        ip,
        None,
    )
    .map(|(link, _)| link.index)
}

/// The link whose socket watches link `ifindex` on the LAN: itself, or for one of our
/// virtual MACs' macvlans, its parent (where its claims are heard).
fn on_the_lan(held: Held<'_>, ifindex: u32) -> u32 {
    held.host()
        .and_then(|h| h.links.iter().find(|l| l.index == ifindex))
        .filter(|l| vmac::is_ours(l))
        .and_then(|l| l.parent)
        .unwrap_or(ifindex)
}

/// Who `mac` is, seen on `ifindex`.
fn sighting(
    desired: &DesiredSet,
    held: Held<'_>,
    mac: Mac,
    ifindex: u32,
    ifname: Option<&str>,
) -> Sighting {
    let ifname = ifname.map(str::to_owned).unwrap_or_else(|| {
        held.host()
            .and_then(|h| h.links.iter().find(|l| l.index == ifindex))
            .map_or_else(|| format!("if{ifindex}"), |l| l.name.clone())
    });
    Sighting {
        mac,
        node: desired.node_of_mac(mac).map(str::to_owned),
        ifindex,
        ifname,
    }
}

/// The link and our MAC on it to probe `ip` on: where the conflict was seen (`hint`), else
/// the interface the alias would go on. `None`: no such link, or it has no Ethernet address.
fn probe_link<'a>(
    interfaces: &Interfaces<'a>,
    desired: &DesiredSet,
    interface_override: Option<&str>,
    ip: IpAddr,
    hint: Option<u32>,
) -> Option<(&'a Link, Mac)> {
    let host = interfaces.host();
    let link = match hint.and_then(|i| host.links.iter().find(|l| l.index == i)) {
        Some(link) => link,
        None => interfaces
            .choose(ip, interface_override, desired.interface(ip))
            .ok()?,
    };
    // A probe on a link without carrier hears nobody: its "free" would be a lie.
    if !host.has_carrier(link.index) {
        return None;
    }
    Some((link, Mac(link.mac?)))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    use super::*;
    use crate::host::{HostAddress, HostState};
    use crate::l2::lan::BoxFuture;

    #[derive(Debug, Default)]
    struct Told {
        interfaces: Mutex<Vec<(u32, Mac)>>,
        defences: Mutex<Vec<(u32, Mac, IpAddr)>>,
    }

    impl LanPort for Told {
        fn set_interfaces(&self, interfaces: &[(u32, Mac)]) {
            *self.interfaces.lock().unwrap() = interfaces.to_vec();
        }
        fn set_watched(&self, _: &[IpAddr]) {}
        fn probe_many(
            &self,
            _: u32,
            _: Mac,
            _: Vec<IpAddr>,
            _: ProbeConfig,
        ) -> BoxFuture<ProbeResults> {
            Box::pin(async { Ok(BTreeMap::new()) })
        }
        fn defend(&self, ifindex: u32, mac: Mac, ip: IpAddr) -> Result<(), LanError> {
            self.defences.lock().unwrap().push((ifindex, mac, ip));
            Ok(())
        }
    }

    fn link(index: u32, name: &str, mac: [u8; 6], kind: Option<&str>, parent: Option<u32>) -> Link {
        Link {
            index,
            name: name.into(),
            mac: Some(mac),
            kind: kind.map(str::to_owned),
            up: true,
            parent,
        }
    }

    /// A guard on `lan` with the default timers and no claims coming.
    fn test_guard(lan: Arc<Told>) -> LanGuard<Told> {
        let (_tx, claims) = mpsc::channel(1);
        LanGuard::new(LanGuardSetup {
            lan,
            claims,
            guard: GuardConfig::default(),
            probe: ProbeConfig::default(),
            recheck: ProbeConfig::quick(),
            announcer: None,
            metrics: LanMetrics::register(&mut prometheus_client::registry::Registry::default()),
        })
    }

    /// Issue 41, item 4: a thousand virtual MACs on one NIC are one watch, not a thousand.
    #[test]
    fn virtual_macs_are_watched_and_defended_through_their_parent() {
        let nic = [2, 0, 0, 0, 0, 2];
        let mut host = HostState {
            links: vec![link(2, "eth0", nic, None, None)],
            ..HostState::default()
        };
        let mut owned = BTreeMap::new();
        let mut desired = DesiredSet::new();
        for k in 0..1_000u32 {
            let ip = IpAddr::from([10, 0, (k / 250) as u8, (k % 250) as u8 + 1]);
            let vmac = aliaslb_core::mac::virtual_mac(ip);
            let index = 100 + k;
            host.links.push(link(
                index,
                &vmac::link_name(vmac),
                vmac.0,
                Some(vmac::KIND),
                Some(2),
            ));
            host.addresses.push(HostAddress {
                ip,
                prefix_len: 32,
                ifindex: index,
                owned: true,
                global: true,
            });
            owned.insert(
                ip,
                Alias {
                    ip,
                    ifindex: index,
                    ifname: vmac::link_name(vmac),
                },
            );
            desired.insert(ip, None);
            desired.set_vmac(ip, vmac);
        }
        let held = Held::new(&owned, Some(&host), None);
        let lan = Arc::new(Told::default());
        let mut guard = test_guard(lan.clone());
        guard.tell(&desired, held);
        let told = lan.interfaces.lock().unwrap().clone();
        let sockets: BTreeSet<u32> = told.iter().map(|(i, _)| *i).collect();
        assert_eq!(sockets, BTreeSet::from([2]), "one watch, on the parent");
        assert_eq!(
            told.len(),
            1_001,
            "every virtual MAC is ours, its frames no claims"
        );
        assert_eq!(
            guard.node_macs(),
            &BTreeSet::from([Mac(nic)]),
            "not reported as the node's"
        );
        // A claim heard on the parent for a virtual-MAC IP is its own link's.
        let ip = IpAddr::from([10, 0, 0, 1]);
        assert_eq!(own_link(&desired, held, ip), Some(2));
        // Defended from its virtual MAC, through the parent's socket.
        guard.defend(held, ip);
        let vmac = aliaslb_core::mac::virtual_mac(ip);
        assert_eq!(*lan.defences.lock().unwrap(), vec![(2, vmac, ip)]);
    }

    /// A pool switched to virtual MACs at run time: the reconcile that moves a held IP to
    /// its virtual MAC announces from it before the port knows the MAC (lab, issue 45's
    /// test: both Services `AddressDefended` against their own virtual MACs).
    #[test]
    fn an_own_virtual_mac_heard_before_the_port_knows_it_is_no_claim() {
        let nic = [2, 0, 0, 0, 0, 2];
        let ip = IpAddr::from([10, 0, 0, 1]);
        let vmac = aliaslb_core::mac::virtual_mac(ip);
        let host = HostState {
            links: vec![
                link(2, "eth0", nic, None, None),
                link(
                    100,
                    &vmac::link_name(vmac),
                    vmac.0,
                    Some(vmac::KIND),
                    Some(2),
                ),
            ],
            addresses: vec![HostAddress {
                ip,
                prefix_len: 32,
                ifindex: 100,
                owned: true,
                global: true,
            }],
            ..HostState::default()
        };
        let owned = BTreeMap::from([(
            ip,
            Alias {
                ip,
                ifindex: 100,
                ifname: vmac::link_name(vmac),
            },
        )]);
        let mut desired = DesiredSet::new();
        desired.insert(ip, None);
        desired.set_vmac(ip, vmac);
        let held = Held::new(&owned, Some(&host), None);
        let mut guard = test_guard(Arc::new(Told::default()));
        let claim = |mac: Mac| LanClaim {
            ip,
            mac,
            ifindex: 2,
            kind: ClaimKind::Uses,
            at: Instant::now().into_std(),
        };
        // No `tell` yet: the port does not know the virtual MAC.
        let after = guard.on_claims(&[claim(vmac)], &desired, held, true, |_, _| false);
        assert!(matches!(after, After::Nothing));
        assert!(guard.conflicts().is_empty(), "{:?}", guard.conflicts());
        // A stranger's claim is one.
        let stranger = Mac([2, 0xaa, 0, 0, 0, 1]);
        let after = guard.on_claims(&[claim(stranger)], &desired, held, true, |_, _| false);
        assert!(matches!(after, After::Publish));
        assert_eq!(guard.conflicts().len(), 1);
    }
}
