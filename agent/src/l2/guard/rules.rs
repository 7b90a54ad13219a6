//! The LAN conflict guard: decides, from what the LAN says, which desired IPs the alias
//! manager may hold. Pure: no I/O, time passed in; [`super::LanGuard`] does the probing,
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
//! - Claims count only on the IP's **own link**: the interface its alias is on (or, not
//!   held, would go on, where its probe runs). A claim heard on any other link (a pod veth
//!   carrying another alias, a CNI bridge, another NIC) is ignored and counted
//!   ([`Verdict::Elsewhere`]): a pod with NET_RAW, or a host on another segment, cannot
//!   speak for the alias's LAN.
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
//! - A held IP used by a **foreign** MAC (not a node's):
//!   - with fresh authority it is **defended** the same way (RFC 5227 2.4 (c)) and kept:
//!     an address the controller gave this node is not surrendered to whoever sends one
//!     frame; the conflict is reported (`whileHeld`), the controller shows it on the
//!     Service and renumbers only if the pool says `onConflict: renumber`;
//!   - with stale authority it is removed at once, reported, and re-probed with backoff
//!     like an answered probe: the `node-macs` in hand are as old as the authority, so a
//!     node that joined since (and may have been given the IP) would look foreign.
//! - Probes (`ClaimKind::Probes`) for a held IP are ignored (the kernel answers them); any
//!   claim seen for an IP being probed counts as `Taken`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use aliaslb_core::mac::Mac;
use aliaslb_core::report::{Conflict, MAX_CONFLICTS};

use crate::desired::DesiredSet;
use crate::l2::lan::{ClaimKind, LanClaim, ProbeOutcome};

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
    /// This agent held the IP before (a recheck after a carrier loss was answered): an
    /// owner of an established address, reported `whileHeld` like a claim.
    held_before: bool,
    /// The IP left the desired set since: the controller moved it away knowing every
    /// agent's report. A later takeover of it is not held back by this old sighting.
    released: bool,
}

/// The guard's view of one IP.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Entry {
    /// A first-claim probe is in flight; `backoff`: the wait after the last failed attempt;
    /// `recheck`: of an IP held before ([`Guard::recheck`]), not a first claim.
    Probing {
        started: Instant,
        backoff: Option<Duration>,
        recheck: bool,
    },
    /// Nobody answered (or we hold it): may be held.
    Cleared,
    /// The probe could not run (or a recheck is due): retried at `next`.
    Unprobed {
        backoff: Duration,
        next: Instant,
        recheck: bool,
    },
    /// Another host uses it. Boxed, as `Yielded`'s sighting: rare, and large beside the
    /// other variants, which every held IP has (at 10,000 IPs inline they cost 2 MiB).
    Foreign(Box<Foreign>),
    /// Given up to another node while our authority was stale.
    Yielded {
        who: Box<Sighting>,
        /// The desired-set generation at the yield.
        generation: u64,
    },
}

/// A held IP another host (node or not) claimed while our authority was fresh.
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
    /// A re-check of an IP held before ([`Guard::recheck`]): asked quickly, since the LAN
    /// answers in well under a millisecond and the IP is unanswered meanwhile.
    pub recheck: bool,
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
        /// The node claiming it; `None`: a host that is no node of the cluster.
        node: Option<String>,
    },
    /// Claimed again within the defence interval: keep holding, send nothing.
    Defended,
    /// Heard on another link than the IP's own: ignored (and counted).
    Elsewhere,
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
    /// or `forget_after`); yields end once authority is fresh and a newer desired set came,
    /// into a LAN re-check (held again once nobody answers, see [`Guard::recheck`]);
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
        let first_backoff = self.config.first_backoff;
        let mut ended = Vec::new();
        self.ips.retain(|ip, entry| {
            let wanted = desired.contains(*ip);
            match entry {
                Entry::Probing { .. } => true,
                Entry::Cleared | Entry::Unprobed { .. } => wanted,
                Entry::Foreign(f) => {
                    if !wanted {
                        f.released = true;
                    } else if f.released && f.probing.is_none() && !desired.needs_probe(*ip) {
                        // Seen while the IP was ours, then moved away by the controller and
                        // now given back as a takeover (never a first claim: it has a known
                        // holder). An agent knows only its LAN peers' MACs, so the sighting
                        // may be another node's; the controller, which knows every report,
                        // decided: added at once, as any takeover, and a node still
                        // answering yields to its announcement.
                        return false;
                    }
                    wanted
                        || f.probing.is_some()
                        || now.saturating_duration_since(f.seen) < forget_after
                }
                Entry::Yielded { generation: at, .. } => {
                    let over = fresh && generation > *at;
                    if wanted && over {
                        // Checked on the LAN before it is held again: the set that ended
                        // the yield may be one written before the move, delivered late by
                        // a watch that was cut (measured: 140 ms of two MACs after an
                        // API-only partition healed).
                        ended.push(*ip);
                        *entry = Entry::Unprobed {
                            backoff: first_backoff,
                            next: now,
                            recheck: true,
                        };
                        return true;
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

    /// A held IP to verify on the LAN before holding it again: its link regained carrier
    /// while this agent's authority is stale, so the controller may have given the IP to
    /// another node meanwhile, and this node, off the LAN, missed that node's
    /// announcement. Held back at once and probed now (a probe opens its own socket, so it
    /// does not depend on the watch being back on the link); held again once nobody
    /// answers, or a conflict naming the answering node's MAC. Keeps serving after a flap
    /// during a full API outage (nobody answers), and is never a second holder after one
    /// during a partition.
    pub fn recheck(&mut self, ip: IpAddr, now: Instant) {
        self.defended.remove(&ip);
        self.ips.insert(
            ip,
            Entry::Unprobed {
                backoff: self.config.first_backoff,
                next: now,
                recheck: true,
            },
        );
    }

    /// A desired IP that was not added because its link has no carrier
    /// ([`crate::aliases::ReconcileReport::unplugged`]): held back and re-checked on the LAN
    /// like an IP held before ([`Guard::recheck`]); the probe waits for the link
    /// ([`Guard::link_up`]). An IP another host uses, or yielded, stays as it is (held back
    /// already).
    pub fn unplugged(&mut self, ip: IpAddr, now: Instant) {
        match self.ips.get(&ip) {
            Some(Entry::Foreign(_) | Entry::Yielded { .. } | Entry::Unprobed { .. }) => {}
            None | Some(Entry::Cleared | Entry::Probing { .. }) => self.recheck(ip, now),
        }
    }

    /// A link regained carrier: the probes waiting (for it, among others) are due now,
    /// not at the end of a backoff that grew while nothing could be asked.
    pub fn link_up(&mut self, now: Instant) {
        for entry in self.ips.values_mut() {
            match entry {
                Entry::Unprobed { next, .. } => *next = now,
                Entry::Foreign(f) if f.probing.is_none() => f.next = now,
                _ => {}
            }
        }
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
                        recheck: false,
                    },
                );
                due.push(ProbeRequest {
                    ip,
                    ifindex: None,
                    recheck: false,
                });
            }
        }
        for (ip, entry) in &mut self.ips {
            match entry {
                Entry::Unprobed {
                    backoff,
                    next,
                    recheck,
                } if *next <= now => {
                    let (backoff, recheck) = (Some(*backoff), *recheck);
                    *entry = Entry::Probing {
                        started: now,
                        backoff,
                        recheck,
                    };
                    due.push(ProbeRequest {
                        ip: *ip,
                        ifindex: None,
                        recheck,
                    });
                }
                Entry::Foreign(f) if f.probing.is_none() && f.next <= now => {
                    f.probing = Some(now);
                    due.push(ProbeRequest {
                        ip: *ip,
                        ifindex: Some(f.who.ifindex),
                        recheck: false,
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
            Some(Entry::Probing {
                backoff, recheck, ..
            }) => {
                let (backoff, recheck) = (next_backoff(&config, *backoff), *recheck);
                self.ips.insert(
                    ip,
                    Entry::Unprobed {
                        backoff,
                        next: now + backoff,
                        recheck,
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
            (Entry::Probing { recheck, .. }, ProbeOutcome::Taken { mac }) => {
                let who = who.unwrap_or_else(|| unknown(mac));
                let mut foreign = Foreign::new(who, How::Answered, &config, now);
                foreign.held_before = *recheck;
                self.insert_foreign(ip, foreign, desired);
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

    /// A claim seen on the LAN (`who` says who made it, `fresh`: this agent's authority,
    /// `link`: the IP's own link, the interface its alias is or would be on; `None`: none).
    #[allow(clippy::too_many_arguments)]
    pub fn observe(
        &mut self,
        claim: &LanClaim,
        who: Sighting,
        desired: &DesiredSet,
        held: &BTreeSet<IpAddr>,
        fresh: bool,
        link: Option<u32>,
        now: Instant,
    ) -> Verdict {
        let ip = claim.ip;
        if link != Some(claim.ifindex) {
            return Verdict::Elsewhere;
        }
        if held.contains(&ip) {
            if claim.kind == ClaimKind::Probes {
                return Verdict::Ignore;
            }
            let node = match (who.node.clone(), fresh) {
                (None, false) => {
                    self.defended.remove(&ip);
                    self.insert_foreign(
                        ip,
                        Foreign::new(who, How::Claimed, &self.config, now),
                        desired,
                    );
                    return Verdict::Remove;
                }
                (Some(node), false) => {
                    self.defended.remove(&ip);
                    self.ips.insert(
                        ip,
                        Entry::Yielded {
                            who: Box::new(who),
                            generation: self.generation,
                        },
                    );
                    return Verdict::Yield { node };
                }
                (node, true) => node,
            };
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
            Some(Entry::Probing {
                started, recheck, ..
            }) => {
                // The probe in flight still reports; its "free" does not clear this.
                let (started, recheck) = (*started, *recheck);
                let mut foreign = Foreign::new(who, How::Answered, &config, now);
                foreign.probing = Some(started);
                foreign.held_before = recheck;
                self.insert_foreign(ip, foreign, desired);
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
                                || "none of this node's peers".to_owned(),
                                |n| format!("node {n}")
                            )
                        ),
                        How::Claimed => format!(
                            "claimed on {} by {} (none of this node's peers) while this \
                             agent's Lease was stale: removed",
                            f.who.ifname, f.who.mac
                        ),
                    };
                    let claim = if f.how == How::Claimed || f.held_before {
                        Claim::TakenDown
                    } else {
                        Claim::Probed
                    };
                    report(*ip, &f.who, reason, claim)
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
                    Claim::TakenDown,
                ),
                _ => continue,
            };
            out.push(conflict);
        }
        for (ip, d) in &self.defended {
            let by = match d.who.node.as_deref() {
                Some(node) => format!("node {node} ({})", d.who.mac),
                None => format!("{} (none of this node's peers)", d.who.mac),
            };
            out.push(report(
                *ip,
                &d.who,
                format!(
                    "claimed on {} by {by} while this agent's Lease was fresh: defended",
                    d.who.ifname,
                ),
                Claim::Defended,
            ));
        }
        out.sort_by_key(|c| c.ip);
        out.truncate(self.config.max_conflicts);
        out
    }

    /// When the guard next has something to do (a re-probe, a defence to forget), if ever.
    /// Never a past instant that the next reconcile does not move on (no spinning).
    pub fn next_wakeup(&self) -> Option<Instant> {
        let entries = self.ips.values().filter_map(|e| match e {
            Entry::Unprobed { next, .. } => Some(*next),
            // Not the forget deadline: a conflict is re-probed at least every
            // `max_backoff` and each result runs `update`; a desired conflict past that
            // deadline (its probes failing) must not wake the loop in a spin.
            Entry::Foreign(f) if f.probing.is_none() => Some(f.next),
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
        self.ips.insert(ip, Entry::Foreign(Box::new(foreign)));
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
            held_before: false,
            released: false,
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

/// What a reported claim did to the address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Claim {
    /// It answered the probe of a first claim: the address was never held.
    Probed,
    /// It came while the address was held with fresh authority: defended, still held.
    Defended,
    /// It came while the address was held, which is now down: yielded while stale (up
    /// again only after a newer assignment and a probe), removed for a foreign claim while
    /// stale, or answered when re-checked after a yield (both up again only when a probe
    /// finds it free).
    TakenDown,
}

fn report(ip: IpAddr, who: &Sighting, reason: String, claim: Claim) -> Conflict {
    Conflict {
        while_held: claim != Claim::Probed,
        yielded: claim == Claim::TakenDown,
        ip,
        reason,
        mac: Some(who.mac),
        interface: Some(who.ifname.clone()),
    }
}

/// A [`LanPort`](crate::l2::lan::LanPort) that sees nothing and finds every IP free: the
/// agent without LAN access (and the wiring spot until the AF_PACKET port is wired).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoLan;

impl crate::l2::lan::LanPort for NoLan {
    fn set_interfaces(&self, _: &[(u32, Mac)]) {}

    fn set_watched(&self, _: &[IpAddr]) {}

    fn probe_many(
        &self,
        _: u32,
        _: Mac,
        ips: Vec<IpAddr>,
        _: crate::l2::lan::ProbeConfig,
    ) -> crate::l2::lan::BoxFuture<crate::l2::lan::ProbeResults> {
        Box::pin(async move { Ok(ips.into_iter().map(|ip| (ip, ProbeOutcome::Free)).collect()) })
    }

    fn defend(&self, _: u32, _: Mac, _: IpAddr) -> Result<(), crate::l2::lan::LanError> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODE2: Mac = Mac([0x46, 0xb0, 0x48, 0xe8, 0x2d, 0x96]);
    const STRANGER: Mac = Mac([0x02, 0xaa, 0, 0, 0, 1]);
    /// A probe the stranger answered.
    const TAKEN: ProbeOutcome = ProbeOutcome::Taken { mac: STRANGER };

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn the_entry_every_held_ip_has_stays_small() {
        // One per held IP: at 10,000 IPs each 100 bytes is a megabyte. A conflict's
        // details (sightings, backoffs) are boxed.
        let size = std::mem::size_of::<Entry>();
        assert!(size <= 48, "Entry is {size} bytes");
    }

    /// Desired: `plain` (takeovers), `probed` (first claims), node-2's MAC known.
    fn desired(plain: &[&str], probed: &[&str]) -> DesiredSet {
        let mut d: DesiredSet = plain.iter().chain(probed).map(|s| (ip(s), None)).collect();
        for s in probed {
            d.mark_probe(ip(s));
        }
        d.add_node_mac(NODE2, "alb-node-2");
        d
    }

    fn held(ips: &[&str]) -> BTreeSet<IpAddr> {
        ips.iter().map(|s| ip(s)).collect()
    }

    fn who(mac: Mac, d: &DesiredSet) -> Sighting {
        Sighting {
            mac,
            node: d.node_of_mac(mac).map(str::to_owned),
            ifindex: 3,
            ifname: "eth1".into(),
        }
    }

    fn claim(at: Instant, s: &str, mac: Mac, kind: ClaimKind) -> LanClaim {
        LanClaim {
            ip: ip(s),
            mac,
            ifindex: 3,
            kind,
            at,
        }
    }

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    /// The start of a test: now, a new guard, the desired set (`plain` takeovers, `probed`
    /// first claims) and the IPs held.
    fn start(
        plain: &[&str],
        probed: &[&str],
        held_ips: &[&str],
    ) -> (Instant, Guard, DesiredSet, BTreeSet<IpAddr>) {
        let t = Instant::now();
        (t, Guard::default(), desired(plain, probed), held(held_ips))
    }

    /// `g` probes the first claim 10.0.0.2 of `d` at `t`, none held, and the stranger
    /// answers (`seen`: where, if the port says): a conflict.
    fn answer(g: &mut Guard, d: &DesiredSet, seen: Option<Sighting>, t: Instant) {
        g.due_probes(d, &held(&[]), t);
        let change = g.probe_result(ip("10.0.0.2"), TAKEN, seen, d, t);
        assert_eq!(change, ProbeChange::Conflict, "an answered first claim");
    }

    #[test]
    fn a_first_claim_waits_for_its_probe_and_a_takeover_never_probes() {
        let (t, mut g, d, none) = start(&["10.0.0.1"], &["10.0.0.2"], &[]);
        g.update(&d, &none, true, t);
        assert_eq!(g.held_back(&d, &none), held(&["10.0.0.2"]));
        let due = g.due_probes(&d, &none, t);
        assert_eq!(
            due,
            vec![ProbeRequest {
                ip: ip("10.0.0.2"),
                ifindex: None,
                recheck: false
            }]
        );
        assert!(g.is_probing(ip("10.0.0.2")));
        assert!(g.due_probes(&d, &none, t).is_empty(), "one probe in flight");
        assert_eq!(g.held_back(&d, &none), held(&["10.0.0.2"]), "still probing");
        let change = g.probe_result(ip("10.0.0.2"), ProbeOutcome::Free, None, &d, t);
        assert_eq!(change, ProbeChange::Cleared);
        assert!(g.held_back(&d, &none).is_empty());
        // Cleared stays cleared while desired, held or not.
        g.update(&d, &none, true, t + secs(5));
        assert!(g.held_back(&d, &none).is_empty());
        assert!(g.due_probes(&d, &none, t + secs(5)).is_empty());
        assert!(g.conflicts().is_empty());
        // Undesired, then first-claimed again: probed again.
        let gone = desired(&["10.0.0.1"], &[]);
        g.update(&gone, &none, true, t + secs(6));
        assert_eq!(g.due_probes(&d, &none, t + secs(7)).len(), 1);
    }

    #[test]
    fn a_held_first_claim_is_not_probed() {
        let (t, mut g, d, h) = start(&[], &["10.0.0.2"], &["10.0.0.2"]);
        g.update(&d, &h, true, t);
        assert!(g.held_back(&d, &h).is_empty());
        assert!(g.due_probes(&d, &h, t).is_empty());
        // Deleted by someone else: put back without a probe.
        assert!(g.held_back(&d, &held(&[])).is_empty());
    }

    #[test]
    fn an_answered_probe_is_a_conflict_reprobed_with_backoff_until_free() {
        let (t, mut g, d, none) = start(&[], &["10.0.0.2"], &[]);
        // A conflict: `answer` checks the probe result says so.
        answer(&mut g, &d, Some(who(STRANGER, &d)), t);
        assert_eq!(g.held_back(&d, &none), held(&["10.0.0.2"]));
        let c = g.conflicts();
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].mac, Some(STRANGER));
        assert_eq!(c[0].interface.as_deref(), Some("eth1"));
        assert_eq!(
            c[0].reason,
            "answered ARP on eth1 from 02:aa:00:00:00:01 (none of this node's peers)"
        );
        assert!(
            !c[0].while_held && !c[0].yielded,
            "a first claim's probe: the controller withholds it"
        );
        // Re-probes: 1 s, 2 s, 4 s ... capped at 60 s.
        let mut at = t;
        for wait in [1, 2, 4, 8, 16, 32, 60, 60] {
            assert_eq!(g.next_wakeup(), Some(at + secs(wait)), "after {at:?}");
            assert!(
                g.due_probes(&d, &none, at + secs(wait) - Duration::from_millis(1))
                    .is_empty()
            );
            at += secs(wait);
            let due = g.due_probes(&d, &none, at);
            assert_eq!(due[0].ifindex, Some(3), "re-probed where it was seen");
            let change = g.probe_result(ip("10.0.0.2"), TAKEN, Some(who(STRANGER, &d)), &d, at);
            assert_eq!(change, ProbeChange::StillTaken);
            assert_eq!(g.conflicts().len(), 1);
        }
        at += secs(60);
        assert_eq!(g.due_probes(&d, &none, at).len(), 1);
        let change = g.probe_result(ip("10.0.0.2"), ProbeOutcome::Free, None, &d, at);
        assert_eq!(change, ProbeChange::ConflictGone);
        assert!(g.conflicts().is_empty());
        assert!(g.held_back(&d, &none).is_empty(), "free and desired: taken");
    }

    #[test]
    fn an_undesired_conflict_stays_reported_until_free_or_forgotten() {
        let (t, mut g, d, none) = start(&[], &["10.0.0.2"], &[]);
        answer(&mut g, &d, Some(who(STRANGER, &d)), t);
        // The controller moved the Service away: withholding it needs the report.
        let moved = desired(&[], &[]);
        g.update(&moved, &none, true, t + secs(1));
        assert_eq!(g.conflicts().len(), 1);
        assert_eq!(
            g.due_probes(&moved, &none, t + secs(1)).len(),
            1,
            "re-probed anyway"
        );
        g.probe_result(ip("10.0.0.2"), TAKEN, None, &moved, t + secs(1));
        g.update(&moved, &none, true, t + secs(500));
        assert_eq!(g.conflicts().len(), 1);
        g.update(&moved, &none, true, t + secs(602));
        assert!(
            g.conflicts().is_empty(),
            "forgotten ten minutes after last seen"
        );
        assert!(g.next_wakeup().is_none());
    }

    #[test]
    fn a_conflict_of_an_ip_moved_away_does_not_hold_back_its_takeover_later() {
        let (t, mut g, d, none) = start(&[], &["10.0.0.2"], &[]);
        // Answered when this node probed it (a recheck after a yield, say).
        answer(&mut g, &d, Some(who(STRANGER, &d)), t);
        // Still desired as a first claim: held back.
        g.update(&d, &none, true, t + secs(1));
        assert_eq!(g.held_back(&d, &none), held(&["10.0.0.2"]));
        // Moved away by the controller, then given back as a takeover: added at once.
        g.update(&desired(&[], &[]), &none, true, t + secs(2));
        assert_eq!(g.conflicts().len(), 1, "reported while away");
        let back = desired(&["10.0.0.2"], &[]);
        g.update(&back, &none, true, t + secs(3));
        assert!(g.held_back(&back, &none).is_empty());
        assert!(g.conflicts().is_empty());
        // Given back as a first claim instead: probed, as any first claim is.
        let mut g = Guard::default();
        answer(&mut g, &d, Some(who(STRANGER, &d)), t);
        g.update(&desired(&[], &[]), &none, true, t + secs(2));
        g.update(&d, &none, true, t + secs(3));
        assert_eq!(g.held_back(&d, &none), held(&["10.0.0.2"]));
    }

    #[test]
    fn a_node_claim_while_stale_yields_until_fresh_and_a_newer_desired_set() {
        let (t, mut g, d, h) = start(&["10.0.0.1"], &[], &["10.0.0.1"]);
        g.update(&d, &h, false, t);
        let c = claim(t, "10.0.0.1", NODE2, ClaimKind::Uses);
        let verdict = g.observe(&c, who(NODE2, &d), &d, &h, false, Some(3), t);
        assert_eq!(
            verdict,
            Verdict::Yield {
                node: "alb-node-2".into()
            }
        );
        assert_eq!(
            g.held_back(&d, &h),
            held(&["10.0.0.1"]),
            "held back at once"
        );
        let none = held(&[]);
        let report = g.conflicts();
        assert_eq!(
            report[0].reason,
            "claimed on eth1 by node alb-node-2 (46:b0:48:e8:2d:96) while this agent's Lease was stale: yielded"
        );
        assert_eq!(report[0].mac, Some(NODE2));
        assert!(
            report[0].while_held && report[0].yielded,
            "taken down: the controller may make the claimant, its standby, the holder"
        );
        // Stale, even with a new desired set: still yielded.
        g.desired_changed();
        assert!(g.update(&d, &none, false, t + secs(1)).is_empty());
        assert!(g.is_yielded(ip("10.0.0.1")));
        // Fresh again, but no desired set since the yield... (a fresh guard state)
        let mut g2 = Guard::default();
        g2.observe(&c, who(NODE2, &d), &d, &h, false, Some(3), t);
        assert!(g2.update(&d, &none, true, t + secs(2)).is_empty());
        assert_eq!(g2.held_back(&d, &none), held(&["10.0.0.1"]));
        // ... until one arrives.
        g2.desired_changed();
        assert_eq!(
            g2.update(&d, &none, true, t + secs(3)),
            vec![ip("10.0.0.1")]
        );
        // Not held at once: that set may be one written before the move, delivered late.
        // Re-checked on the LAN first: the new holder answers, and it stays back.
        assert_eq!(g2.held_back(&d, &none), held(&["10.0.0.1"]));
        let probes = g2.due_probes(&d, &none, t + secs(3));
        assert_eq!(probes.len(), 1, "{probes:?}");
        assert!(!g2.is_yielded(ip("10.0.0.1")));
        // The first guard: fresh now, and it had a newer set: over too.
        assert_eq!(g.update(&d, &none, true, t + secs(4)), vec![ip("10.0.0.1")]);
        // Moved away meanwhile: the yield simply ends with the IP.
        let mut g3 = Guard::default();
        g3.observe(&c, who(NODE2, &d), &d, &h, false, Some(3), t);
        g3.update(&desired(&[], &[]), &none, false, t + secs(1));
        assert!(!g3.is_yielded(ip("10.0.0.1")) && g3.conflicts().is_empty());
    }

    #[test]
    fn a_claim_while_fresh_is_defended_once_per_interval_and_kept() {
        // (claimant, its MAC, the node it is, the reason reported)
        let table = [
            (
                "node-2",
                NODE2,
                Some("alb-node-2"),
                "claimed on eth1 by node alb-node-2 (46:b0:48:e8:2d:96) while this agent's \
                 Lease was fresh: defended",
            ),
            (
                "a stranger",
                STRANGER,
                None,
                "claimed on eth1 by 02:aa:00:00:00:01 (none of this node's peers) while this \
                 agent's Lease was fresh: defended",
            ),
        ];
        for (what, mac, node, reason) in table {
            let (t, mut g, d, h) = start(&["10.0.0.1"], &[], &["10.0.0.1"]);
            let c = |at| claim(at, "10.0.0.1", mac, ClaimKind::Uses);
            let observe =
                |g: &mut Guard, at| g.observe(&c(at), who(mac, &d), &d, &h, true, Some(3), at);
            let defend = Verdict::Defend {
                node: node.map(str::to_owned),
            };
            assert_eq!(observe(&mut g, t), defend, "{what}");
            // A flood of forged frames (every 250 ms, and up to the last moment of the
            // interval): one defence per 10 s, never a removal.
            for ms in (1..10_000).filter(|ms| ms % 250 == 1 || [5_000, 9_999].contains(ms)) {
                let at = t + Duration::from_millis(ms);
                assert_eq!(observe(&mut g, at), Verdict::Defended, "{what}: {ms} ms");
                assert!(g.held_back(&d, &h).is_empty(), "{what}: kept at {ms} ms");
            }
            assert_eq!(observe(&mut g, t + secs(10)), defend, "{what}: at 10 s");
            assert!(g.held_back(&d, &h).is_empty(), "{what}: kept");
            assert!(!g.is_probing(ip("10.0.0.1")), "{what}");
            let report = g.conflicts();
            assert_eq!(report.len(), 1, "{what}");
            assert_eq!(report[0].reason, reason, "{what}");
            assert_eq!(report[0].mac, Some(mac), "{what}");
            assert!(
                report[0].while_held,
                "{what}: a claim against the holder, not a probe's answer"
            );
            assert!(!report[0].yielded, "{what}: defended: the address stays up");
            // Quiet for 30 s: out of the report; the IP never left.
            g.update(&d, &h, true, t + secs(39));
            assert_eq!(g.conflicts().len(), 1, "{what}: quiet for 29 s");
            g.update(&d, &h, true, t + secs(40));
            assert!(g.conflicts().is_empty(), "{what}: quiet for 30 s");
            assert!(g.held_back(&d, &h).is_empty(), "{what}: quiet for 30 s");
        }
    }

    #[test]
    fn a_foreign_claim_while_stale_removes_at_once_and_probes_are_ignored_while_held() {
        let (t, mut g, d, h) = start(&["10.0.0.1"], &[], &["10.0.0.1"]);
        let probe = claim(t, "10.0.0.1", STRANGER, ClaimKind::Probes);
        assert_eq!(
            g.observe(&probe, who(STRANGER, &d), &d, &h, true, Some(3), t),
            Verdict::Ignore
        );
        let node_probe = claim(t, "10.0.0.1", NODE2, ClaimKind::Probes);
        assert_eq!(
            g.observe(&node_probe, who(NODE2, &d), &d, &h, false, Some(3), t),
            Verdict::Ignore
        );
        assert!(g.held_back(&d, &h).is_empty());
        // Stale: the node-macs in hand are as old as the authority (a node that joined
        // since would look foreign), so the split-brain bound wins: removed.
        let uses = claim(t, "10.0.0.1", STRANGER, ClaimKind::Uses);
        assert_eq!(
            g.observe(&uses, who(STRANGER, &d), &d, &h, false, Some(3), t),
            Verdict::Remove
        );
        assert_eq!(g.held_back(&d, &h), held(&["10.0.0.1"]));
        let report = g.conflicts();
        assert_eq!(
            report[0].reason,
            "claimed on eth1 by 02:aa:00:00:00:01 (none of this node's peers) while this \
             agent's Lease was stale: removed"
        );
        assert!(report[0].while_held && report[0].yielded);
        let none = held(&[]);
        assert!(
            g.due_probes(&d, &none, t + Duration::from_millis(999))
                .is_empty()
        );
        assert_eq!(g.due_probes(&d, &none, t + secs(1)).len(), 1);
        g.probe_result(ip("10.0.0.1"), ProbeOutcome::Free, None, &d, t + secs(2));
        assert!(g.held_back(&d, &none).is_empty(), "free again: re-taken");
    }

    #[test]
    fn claims_count_only_on_the_ips_own_link() {
        let (t, mut g, d, h) = start(&["10.0.0.1"], &["10.0.0.2"], &["10.0.0.1"]);
        // Heard on link 7 (a pod veth, a CNI bridge, another NIC); the alias is on 3.
        for (mac, fresh) in [(STRANGER, true), (STRANGER, false), (NODE2, false)] {
            let mut c = claim(t, "10.0.0.1", mac, ClaimKind::Uses);
            c.ifindex = 7;
            let mut w = who(mac, &d);
            w.ifindex = 7;
            assert_eq!(
                g.observe(&c, w, &d, &h, fresh, Some(3), t),
                Verdict::Elsewhere,
                "{mac} fresh={fresh}"
            );
        }
        // No link for it at all: nothing counts.
        let c = claim(t, "10.0.0.1", STRANGER, ClaimKind::Uses);
        assert_eq!(
            g.observe(&c, who(STRANGER, &d), &d, &h, false, None, t),
            Verdict::Elsewhere
        );
        assert_eq!(
            g.held_back(&d, &h),
            held(&["10.0.0.2"]),
            "the first claim only"
        );
        assert!(g.conflicts().is_empty());
        // A first claim being probed on link 3: an answer on link 7 does not make it taken.
        g.due_probes(&d, &h, t);
        let mut c = claim(t, "10.0.0.2", STRANGER, ClaimKind::Uses);
        c.ifindex = 7;
        assert_eq!(
            g.observe(&c, who(STRANGER, &d), &d, &h, true, Some(3), t),
            Verdict::Elsewhere
        );
        let change = g.probe_result(ip("10.0.0.2"), ProbeOutcome::Free, None, &d, t);
        assert_eq!(change, ProbeChange::Cleared);
    }

    #[test]
    fn a_claim_during_a_probe_is_taken_and_the_quiet_probe_does_not_clear_it() {
        let (t, mut g, d, none) = start(&[], &["fd00::2"], &[]);
        g.due_probes(&d, &none, t);
        let c = claim(t, "fd00::2", STRANGER, ClaimKind::Probes);
        let at = t + Duration::from_millis(100);
        assert_eq!(
            g.observe(&c, who(STRANGER, &d), &d, &none, true, Some(3), at),
            Verdict::Taken
        );
        let change = g.probe_result(ip("fd00::2"), ProbeOutcome::Free, None, &d, at);
        assert_eq!(change, ProbeChange::StillTaken);
        assert_eq!(g.held_back(&d, &none), held(&["fd00::2"]));
        assert!(g.conflicts()[0].reason.starts_with("answered NDP on eth1"));
    }

    #[test]
    fn an_answered_recheck_of_a_held_ip_is_reported_while_held() {
        // The link regained carrier while stale: held back and probed again; an answer is
        // an owner of an established address, not a first claim's: never withheld by
        // itself at the controller.
        let (t, mut g, d, h) = start(&["10.0.0.1"], &[], &["10.0.0.1"]);
        g.update(&d, &h, false, t);
        g.recheck(ip("10.0.0.1"), t);
        assert_eq!(g.held_back(&d, &h), held(&["10.0.0.1"]));
        let none = held(&[]);
        assert_eq!(g.due_probes(&d, &none, t).len(), 1);
        g.probe_failed(ip("10.0.0.1"), t);
        assert_eq!(g.due_probes(&d, &none, t + secs(2)).len(), 1, "retried");
        let change = g.probe_result(
            ip("10.0.0.1"),
            TAKEN,
            Some(who(STRANGER, &d)),
            &d,
            t + secs(2),
        );
        assert_eq!(change, ProbeChange::Conflict);
        let c = g.conflicts();
        assert!(c[0].while_held && c[0].yielded, "{c:?}");
        assert_eq!(c[0].mac, Some(STRANGER));
    }

    #[test]
    fn an_ip_whose_link_has_no_carrier_waits_for_the_link_and_a_recheck() {
        // Assigned (no first claim) while its link has no carrier: held back from then on,
        // its probes fail while the link is down (backing off), and the link's return makes
        // the re-check due at once, not at the end of the backoff.
        let (t, mut g, d, none) = start(&["10.0.0.1"], &[], &[]);
        g.update(&d, &none, true, t);
        assert!(g.held_back(&d, &none).is_empty(), "not a first claim");
        g.unplugged(ip("10.0.0.1"), t);
        assert_eq!(g.held_back(&d, &none), held(&["10.0.0.1"]));
        let due = g.due_probes(&d, &none, t);
        assert!(due.len() == 1 && due[0].recheck, "{due:?}");
        g.probe_failed(ip("10.0.0.1"), t);
        let mut at = t;
        for _ in 0..3 {
            at = g.next_wakeup().expect("a retry");
            assert_eq!(g.due_probes(&d, &none, at).len(), 1);
            g.probe_failed(ip("10.0.0.1"), at);
        }
        assert!(g.next_wakeup().unwrap() - at >= secs(8), "backed off");
        assert!(g.due_probes(&d, &none, at + secs(1)).is_empty());
        let t = at + secs(1);
        g.link_up(t);
        assert_eq!(g.due_probes(&d, &none, t).len(), 1, "due at the return");
        assert_eq!(
            g.held_back(&d, &none),
            held(&["10.0.0.1"]),
            "until it answers"
        );
        let change = g.probe_result(ip("10.0.0.1"), ProbeOutcome::Free, None, &d, t);
        assert_eq!(change, ProbeChange::Cleared);
        assert!(g.held_back(&d, &none).is_empty());
        // An IP another host uses stays as it is.
        g.update(&d, &none, true, t + secs(6));
        g.recheck(ip("10.0.0.1"), t + secs(6));
        g.due_probes(&d, &none, t + secs(6));
        g.probe_result(
            ip("10.0.0.1"),
            TAKEN,
            Some(who(STRANGER, &d)),
            &d,
            t + secs(6),
        );
        g.unplugged(ip("10.0.0.1"), t + secs(6));
        assert_eq!(g.conflicts().len(), 1, "still a conflict");
    }

    #[test]
    fn a_failed_probe_keeps_the_first_claim_back_and_retries() {
        let (t, mut g, d, none) = start(&[], &["10.0.0.2"], &[]);
        g.due_probes(&d, &none, t);
        g.probe_failed(ip("10.0.0.2"), t);
        assert_eq!(g.held_back(&d, &none), held(&["10.0.0.2"]));
        assert!(g.conflicts().is_empty(), "not a conflict");
        assert_eq!(g.next_wakeup(), Some(t + secs(1)));
        assert_eq!(g.due_probes(&d, &none, t + secs(1)).len(), 1);
        g.probe_failed(ip("10.0.0.2"), t + secs(1));
        assert_eq!(g.next_wakeup(), Some(t + secs(3)), "doubled");
    }

    #[test]
    fn the_conflict_table_is_bounded_forgetting_the_oldest_undesired_first() {
        let t = Instant::now();
        let mut g = Guard::new(GuardConfig {
            max_conflicts: 2,
            ..GuardConfig::default()
        });
        let all = desired(&[], &["10.0.0.1", "10.0.0.2", "10.0.0.3"]);
        let none = held(&[]);
        for (i, s) in ["10.0.0.1", "10.0.0.2"].iter().enumerate() {
            let at = t + secs(i as u64);
            g.due_probes(&all, &none, at);
            g.probe_result(ip(s), TAKEN, None, &all, at);
            g.probe_failed(ip("10.0.0.3"), at);
        }
        // 10.0.0.2 is no longer desired; 10.0.0.1 (older) still is.
        let d = desired(&[], &["10.0.0.1", "10.0.0.3"]);
        g.update(&d, &none, true, t + secs(2));
        g.due_probes(&d, &none, t + secs(10));
        g.probe_result(ip("10.0.0.3"), TAKEN, None, &d, t + secs(10));
        let ips: Vec<IpAddr> = g.conflicts().iter().map(|c| c.ip).collect();
        assert_eq!(ips, vec![ip("10.0.0.1"), ip("10.0.0.3")]);
    }

    #[test]
    fn a_desired_conflict_whose_probes_fail_never_wakes_the_loop_in_the_past() {
        let (t, mut g, d, none) = start(&[], &["10.0.0.2"], &[]);
        answer(&mut g, &d, None, t);
        let mut now = t;
        while now < t + secs(1_200) {
            g.update(&d, &none, true, now);
            for p in g.due_probes(&d, &none, now) {
                g.probe_failed(p.ip, now);
            }
            let wake = g.next_wakeup().unwrap();
            assert!(wake > now, "wakes at {wake:?}, now {now:?}");
            now = wake;
        }
        assert_eq!(g.conflicts().len(), 1, "still desired, still reported");
    }
}
