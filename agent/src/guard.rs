//! The LAN conflict guard: decides, from what the LAN says, which desired IPs the alias
//! manager may hold. Pure: no I/O, time passed in; the run loop (`node`) does the probing,
//! the defending and the reconciles it asks for.
//!
//! Rules (RFC 5227 for IPv4, RFC 4862 DAD semantics for IPv6):
//! - **First claims** (a desired IP marked `probe`, not held, not yet cleared) are held back
//!   from the reconcile until a probe says [`ProbeOutcome::Free`]; then the IP is *cleared*
//!   and stays so while desired. A takeover (no `probe` mark) is never probed: it must not
//!   wait.
//! - An answered probe is a **conflict**: not added, reported with the MAC and interface,
//!   re-probed with backoff (1 s doubling to 60 s) whether or not still desired, dropped
//!   when a re-probe finds the IP free; an undesired conflicted IP is forgotten ten minutes
//!   after it was last seen.
//! - A held IP **used** by another **node** (its MAC is in `node-macs`):
//!   - with stale authority (this agent's Lease not renewed within the lease duration: the
//!     controller may already have moved the IP) the agent **yields**: the IP is held back
//!     at once (the loop's next reconcile, in the same iteration, deletes the alias) and
//!     reported. It stays yielded until authority is fresh again **and** a desired set
//!     newer than the yield has arrived. Why both: fresh authority alone says the API is
//!     reachable again, not that the desired set in hand is still the controller's view;
//!     a desired set received after the yield came from the API after the claim was seen,
//!     so if it still lists the IP the controller (which by then saw this node's stale
//!     Lease and the other node's claim) wants it back here, and told the other node to
//!     drop it. It cannot flap back into a split brain: re-taking needs a fresh Lease,
//!     and with a fresh Lease a further claim is defended and reported, never yielded and
//!     re-taken in a loop; while stale, no desired set un-yields.
//!   - with fresh authority it **defends** (one announcement, at most once per
//!     [`GuardConfig::defend_interval`] per IP, RFC 5227 DEFEND_INTERVAL) and reports the
//!     conflict for the controller to resolve; it keeps holding.
//! - A held IP used by a **foreign** MAC (not a node's): removed at once, reported, and
//!   re-probed with backoff like an answered probe.
//! - Probes (`ClaimKind::Probes`) for a held IP are ignored (the kernel answers them); any
//!   claim seen for an IP being probed counts as `Taken`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use aliaslb_core::mac::Mac;
use aliaslb_core::report::{Conflict, MAX_CONFLICTS};

use crate::aliases::DesiredSet;
use crate::lan::{ClaimKind, Observed, ProbeOutcome};

/// The guard's timers and bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GuardConfig {
    /// First wait before re-probing a conflicted IP (or retrying a probe that failed).
    pub first_backoff: Duration,
    /// Longest wait between re-probes.
    pub max_backoff: Duration,
    /// At most one defence per IP in this time (RFC 5227 DEFEND_INTERVAL).
    pub defend_interval: Duration,
    /// An undesired conflicted IP is forgotten this long after it was last seen taken.
    pub forget_after: Duration,
    /// A defended IP stays in the report this long after the last claim seen.
    pub defended_report_for: Duration,
    /// Most LAN conflicts remembered (the oldest undesired go first).
    pub max_conflicts: usize,
}

impl Default for GuardConfig {
    fn default() -> Self {
        GuardConfig {
            first_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(60),
            defend_interval: Duration::from_secs(10),
            forget_after: Duration::from_secs(600),
            defended_report_for: Duration::from_secs(30),
            max_conflicts: MAX_CONFLICTS,
        }
    }
}

/// Who else was seen with an IP, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sighting {
    /// Its MAC.
    pub mac: Mac,
    /// The node it belongs to, if it is one of the cluster's.
    pub node: Option<String>,
    /// The interface it was seen on.
    pub ifindex: u32,
    /// That interface's name.
    pub ifname: String,
}

/// How the other owner showed up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum How {
    /// It answered our probe (or claimed the IP while we probed it).
    Answered,
    /// It claimed an IP we held.
    Claimed,
}

/// A foreign owner of an IP: not held, re-probed with backoff.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Foreign {
    who: Sighting,
    how: How,
    /// When it was last seen using the IP.
    seen: Instant,
    backoff: Duration,
    /// When the next re-probe is due.
    next: Instant,
    /// When the re-probe in flight started.
    probing: Option<Instant>,
}

/// The guard's view of one IP.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Entry {
    /// A first-claim probe is in flight; `backoff`: the wait after the last failed attempt.
    Probing {
        started: Instant,
        backoff: Option<Duration>,
    },
    /// Nobody answered (or we hold it): may be held.
    Cleared,
    /// The probe could not run: retried at `next`.
    Unprobed { backoff: Duration, next: Instant },
    /// Another host uses it.
    Foreign(Foreign),
    /// Given up to another node while our authority was stale.
    Yielded {
        who: Sighting,
        /// The desired-set generation at the yield.
        generation: u64,
    },
}

/// A held IP another node claimed while our authority was fresh.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Defence {
    who: Sighting,
    last_defence: Instant,
    last_claim: Instant,
}

/// A probe the loop should start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeRequest {
    /// The IP.
    pub ip: IpAddr,
    /// Where the conflict was seen, for a re-probe (the loop otherwise picks the
    /// interface the alias would go on).
    pub ifindex: Option<u32>,
}

/// What the loop does about one claim seen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing to do.
    Ignore,
    /// Hold the IP back now (reconcile at once: the alias goes); a node got it.
    Yield {
        /// The node.
        node: String,
    },
    /// Send one defence of the IP.
    Defend {
        /// The node claiming it.
        node: String,
    },
    /// A node claims it again within the defence interval: keep holding, send nothing.
    Defended,
    /// Hold the IP back now (reconcile at once): a foreign host uses it.
    Remove,
    /// A claim while probing it: a conflict, it stays held back.
    Taken,
}

/// What a probe result changed, for the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeChange {
    /// Free: the IP may be held.
    Cleared,
    /// A conflict ended: nobody answers for it any more.
    ConflictGone,
    /// A new conflict.
    Conflict,
    /// A known conflict is still there.
    StillTaken,
    /// Nothing the guard tracks (the IP was dropped meanwhile).
    Nothing,
}

/// The conflict guard's state.
#[derive(Debug, Clone)]
pub struct Guard {
    config: GuardConfig,
    ips: BTreeMap<IpAddr, Entry>,
    defended: BTreeMap<IpAddr, Defence>,
    generation: u64,
}

impl Default for Guard {
    fn default() -> Self {
        Guard::new(GuardConfig::default())
    }
}

impl Guard {
    /// A guard that knows nothing yet.
    pub fn new(config: GuardConfig) -> Self {
        Guard {
            config,
            ips: BTreeMap::new(),
            defended: BTreeMap::new(),
            generation: 0,
        }
    }

    /// A new desired set arrived (ends yields, once authority is fresh again).
    pub fn desired_changed(&mut self) {
        self.generation += 1;
    }

    /// Housekeeping before a reconcile: held IPs count as cleared; entries of IPs no
    /// longer desired go (but conflicts, kept for the report until a re-probe clears them
    /// or `forget_after`); yields end once authority is fresh and a newer desired set came;
    /// defences of IPs not held or not claimed for a while leave the report. Returns the
    /// yields that ended.
    pub fn update(
        &mut self,
        desired: &DesiredSet,
        held: &BTreeSet<IpAddr>,
        fresh: bool,
        now: Instant,
    ) -> Vec<IpAddr> {
        let (generation, forget_after) = (self.generation, self.config.forget_after);
        let mut ended = Vec::new();
        self.ips.retain(|ip, entry| {
            let wanted = desired.contains(*ip);
            match entry {
                Entry::Probing { .. } => true,
                Entry::Cleared | Entry::Unprobed { .. } => wanted,
                Entry::Foreign(f) => {
                    wanted
                        || f.probing.is_some()
                        || now.saturating_duration_since(f.seen) < forget_after
                }
                Entry::Yielded { generation: at, .. } => {
                    let over = fresh && generation > *at;
                    if wanted && over {
                        ended.push(*ip);
                    }
                    wanted && !over
                }
            }
        });
        for ip in held {
            if desired.contains(*ip) {
                self.ips.entry(*ip).or_insert(Entry::Cleared);
            }
        }
        let keep_for = self.config.defended_report_for;
        self.defended.retain(|ip, d| {
            held.contains(ip) && now.saturating_duration_since(d.last_claim) < keep_for
        });
        ended
    }

    /// The desired IPs the alias manager must not hold now: first claims not cleared,
    /// IPs another host uses, IPs yielded, IPs whose probe could not run.
    pub fn held_back(&self, desired: &DesiredSet, held: &BTreeSet<IpAddr>) -> BTreeSet<IpAddr> {
        desired
            .iter()
            .map(|(ip, _)| ip)
            .filter(|ip| match self.ips.get(ip) {
                Some(Entry::Cleared) => false,
                Some(Entry::Probing { .. }) => !held.contains(ip),
                Some(Entry::Unprobed { .. } | Entry::Foreign(_) | Entry::Yielded { .. }) => true,
                None => desired.needs_probe(*ip) && !held.contains(ip),
            })
            .collect()
    }

    /// The probes to start now, each marked in flight: desired first claims not held and
    /// not yet probed, and re-probes (conflicts, failed probes) that are due.
    pub fn due_probes(
        &mut self,
        desired: &DesiredSet,
        held: &BTreeSet<IpAddr>,
        now: Instant,
    ) -> Vec<ProbeRequest> {
        let mut due = Vec::new();
        for (ip, _) in desired.iter() {
            if desired.needs_probe(ip) && !held.contains(&ip) && !self.ips.contains_key(&ip) {
                self.ips.insert(
                    ip,
                    Entry::Probing {
                        started: now,
                        backoff: None,
                    },
                );
                due.push(ProbeRequest { ip, ifindex: None });
            }
        }
        for (ip, entry) in &mut self.ips {
            match entry {
                Entry::Unprobed { backoff, next } if *next <= now => {
                    let backoff = Some(*backoff);
                    *entry = Entry::Probing {
                        started: now,
                        backoff,
                    };
                    due.push(ProbeRequest {
                        ip: *ip,
                        ifindex: None,
                    });
                }
                Entry::Foreign(f) if f.probing.is_none() && f.next <= now => {
                    f.probing = Some(now);
                    due.push(ProbeRequest {
                        ip: *ip,
                        ifindex: Some(f.who.ifindex),
                    });
                }
                _ => {}
            }
        }
        due.sort_by_key(|p| p.ip);
        due
    }

    /// A probe could not be made (no socket, no interface): retried with backoff; the IP
    /// stays held back meanwhile (no first claim without a probe).
    pub fn probe_failed(&mut self, ip: IpAddr, now: Instant) {
        let config = self.config;
        match self.ips.get_mut(&ip) {
            Some(Entry::Probing { backoff, .. }) => {
                let backoff = next_backoff(&config, *backoff);
                self.ips.insert(
                    ip,
                    Entry::Unprobed {
                        backoff,
                        next: now + backoff,
                    },
                );
            }
            Some(Entry::Foreign(f)) if f.probing.is_some() => {
                f.probing = None;
                f.backoff = next_backoff(&config, Some(f.backoff));
                f.next = now + f.backoff;
            }
            _ => {}
        }
    }

    /// The outcome of probing `ip`; `who` names who answered (for `Taken`).
    pub fn probe_result(
        &mut self,
        ip: IpAddr,
        outcome: ProbeOutcome,
        who: Option<Sighting>,
        desired: &DesiredSet,
        now: Instant,
    ) -> ProbeChange {
        let config = self.config;
        let wanted = desired.contains(ip);
        let Some(entry) = self.ips.get_mut(&ip) else {
            return ProbeChange::Nothing;
        };
        match (entry, outcome) {
            (Entry::Probing { .. }, ProbeOutcome::Free) => {
                if wanted {
                    self.ips.insert(ip, Entry::Cleared);
                } else {
                    self.ips.remove(&ip);
                }
                ProbeChange::Cleared
            }
            (Entry::Probing { .. }, ProbeOutcome::Taken { mac }) => {
                let who = who.unwrap_or_else(|| unknown(mac));
                self.insert_foreign(ip, Foreign::new(who, How::Answered, &config, now), desired);
                ProbeChange::Conflict
            }
            (Entry::Foreign(f), ProbeOutcome::Free) => {
                let Some(started) = f.probing.take() else {
                    return ProbeChange::StillTaken;
                };
                if f.seen >= started {
                    // Seen using it while the probe ran: the quiet probe does not clear it.
                    f.backoff = next_backoff(&config, Some(f.backoff));
                    f.next = now + f.backoff;
                    return ProbeChange::StillTaken;
                }
                if wanted {
                    self.ips.insert(ip, Entry::Cleared);
                } else {
                    self.ips.remove(&ip);
                }
                ProbeChange::ConflictGone
            }
            (Entry::Foreign(f), ProbeOutcome::Taken { mac }) => {
                f.probing = None;
                if let Some(who) = who {
                    f.who = who;
                } else {
                    f.who.mac = mac;
                }
                f.seen = now;
                f.backoff = next_backoff(&config, Some(f.backoff));
                f.next = now + f.backoff;
                ProbeChange::StillTaken
            }
            _ => ProbeChange::Nothing,
        }
    }

    /// A claim seen on the LAN (`who` says who made it, `fresh`: this agent's authority).
    pub fn observe(
        &mut self,
        claim: &Observed,
        who: Sighting,
        desired: &DesiredSet,
        held: &BTreeSet<IpAddr>,
        fresh: bool,
        now: Instant,
    ) -> Verdict {
        let ip = claim.ip;
        if held.contains(&ip) {
            if claim.kind == ClaimKind::Probes {
                return Verdict::Ignore;
            }
            let Some(node) = who.node.clone() else {
                self.defended.remove(&ip);
                self.insert_foreign(
                    ip,
                    Foreign::new(who, How::Claimed, &self.config, now),
                    desired,
                );
                return Verdict::Remove;
            };
            if !fresh {
                self.defended.remove(&ip);
                self.ips.insert(
                    ip,
                    Entry::Yielded {
                        who,
                        generation: self.generation,
                    },
                );
                return Verdict::Yield { node };
            }
            let interval = self.config.defend_interval;
            return match self.defended.get_mut(&ip) {
                Some(d) if now.saturating_duration_since(d.last_defence) < interval => {
                    d.last_claim = now;
                    d.who = who;
                    Verdict::Defended
                }
                _ => {
                    self.defended.insert(
                        ip,
                        Defence {
                            who,
                            last_defence: now,
                            last_claim: now,
                        },
                    );
                    Verdict::Defend { node }
                }
            };
        }
        let config = self.config;
        match self.ips.get_mut(&ip) {
            Some(Entry::Probing { .. }) => {
                self.insert_foreign(ip, Foreign::new(who, How::Answered, &config, now), desired);
                Verdict::Taken
            }
            Some(Entry::Foreign(f)) if f.probing.is_some() => {
                f.who = who;
                f.seen = now;
                Verdict::Taken
            }
            _ => Verdict::Ignore,
        }
    }

    /// The conflicts the guard reports: foreign owners, yields, defences; by IP, at most
    /// [`GuardConfig::max_conflicts`].
    pub fn conflicts(&self) -> Vec<Conflict> {
        let mut out: Vec<Conflict> = Vec::new();
        for (ip, entry) in &self.ips {
            let conflict = match entry {
                Entry::Foreign(f) => {
                    let reason = match f.how {
                        How::Answered => format!(
                            "answered {} on {} from {} ({})",
                            protocol(*ip),
                            f.who.ifname,
                            f.who.mac,
                            f.who.node.as_deref().map_or_else(
                                || "not a node of this cluster".to_owned(),
                                |n| format!("node {n}")
                            )
                        ),
                        How::Claimed => format!(
                            "claimed on {} by {} (not a node of this cluster): removed",
                            f.who.ifname, f.who.mac
                        ),
                    };
                    report(*ip, &f.who, reason)
                }
                Entry::Yielded { who, .. } => report(
                    *ip,
                    who,
                    format!(
                        "claimed on {} by node {} ({}) while this agent's Lease was stale: yielded",
                        who.ifname,
                        who.node.as_deref().unwrap_or("?"),
                        who.mac
                    ),
                ),
                _ => continue,
            };
            out.push(conflict);
        }
        for (ip, d) in &self.defended {
            out.push(report(
                *ip,
                &d.who,
                format!(
                    "claimed on {} by node {} ({}) while this agent's Lease was fresh: defended",
                    d.who.ifname,
                    d.who.node.as_deref().unwrap_or("?"),
                    d.who.mac
                ),
            ));
        }
        out.sort_by_key(|c| c.ip);
        out.truncate(self.config.max_conflicts);
        out
    }

    /// When the guard next has something to do (a re-probe, a conflict or a defence to
    /// forget), if ever.
    pub fn next_wakeup(&self) -> Option<Instant> {
        let entries = self.ips.values().filter_map(|e| match e {
            Entry::Unprobed { next, .. } => Some(*next),
            Entry::Foreign(f) if f.probing.is_none() => {
                Some(f.next.min(f.seen + self.config.forget_after))
            }
            _ => None,
        });
        let defences = self
            .defended
            .values()
            .map(|d| d.last_claim + self.config.defended_report_for);
        entries.chain(defences).min()
    }

    /// Whether a probe of `ip` is in flight.
    pub fn is_probing(&self, ip: IpAddr) -> bool {
        match self.ips.get(&ip) {
            Some(Entry::Probing { .. }) => true,
            Some(Entry::Foreign(f)) => f.probing.is_some(),
            _ => false,
        }
    }

    /// Whether `ip` is yielded.
    pub fn is_yielded(&self, ip: IpAddr) -> bool {
        matches!(self.ips.get(&ip), Some(Entry::Yielded { .. }))
    }

    fn insert_foreign(&mut self, ip: IpAddr, foreign: Foreign, desired: &DesiredSet) {
        let foreigners = || {
            self.ips
                .iter()
                .filter(|(i, e)| **i != ip && matches!(e, Entry::Foreign(_)))
        };
        if foreigners().count() >= self.config.max_conflicts {
            // The oldest undesired conflict goes first; else the oldest.
            let seen = |e: &Entry| match e {
                Entry::Foreign(f) => f.seen,
                _ => foreign.seen,
            };
            let victim = foreigners()
                .min_by_key(|(i, e)| (desired.contains(**i), seen(e)))
                .map(|(i, _)| *i);
            if let Some(victim) = victim {
                self.ips.remove(&victim);
            }
        }
        self.ips.insert(ip, Entry::Foreign(foreign));
    }
}

impl Foreign {
    fn new(who: Sighting, how: How, config: &GuardConfig, now: Instant) -> Self {
        Foreign {
            who,
            how,
            seen: now,
            backoff: config.first_backoff,
            next: now + config.first_backoff,
            probing: None,
        }
    }
}

/// The wait after `last` (none: the first).
fn next_backoff(config: &GuardConfig, last: Option<Duration>) -> Duration {
    last.map_or(config.first_backoff, |b| (b * 2).min(config.max_backoff))
}

fn unknown(mac: Mac) -> Sighting {
    Sighting {
        mac,
        node: None,
        ifindex: 0,
        ifname: "?".into(),
    }
}

fn protocol(ip: IpAddr) -> &'static str {
    if ip.is_ipv4() { "ARP" } else { "NDP" }
}

fn report(ip: IpAddr, who: &Sighting, reason: String) -> Conflict {
    Conflict {
        ip,
        reason,
        mac: Some(who.mac),
        interface: Some(who.ifname.clone()),
    }
}

/// A [`LanPort`](crate::lan::LanPort) that sees nothing and finds every IP free: the
/// agent without LAN access (and the wiring spot until the AF_PACKET port is wired).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoLan;

impl crate::lan::LanPort for NoLan {
    fn set_interfaces(&self, _: &[(u32, Mac)]) {}

    fn set_watched(&self, _: &[IpAddr]) {}

    fn probe_many(
        &self,
        _: u32,
        _: Mac,
        ips: Vec<IpAddr>,
        _: crate::lan::ProbeConfig,
    ) -> crate::lan::BoxFuture<crate::lan::ProbeResults> {
        Box::pin(async move { Ok(ips.into_iter().map(|ip| (ip, ProbeOutcome::Free)).collect()) })
    }

    fn defend(&self, _: u32, _: Mac, _: IpAddr) -> Result<(), crate::lan::LanError> {
        Ok(())
    }
}
