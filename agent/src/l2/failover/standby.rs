//! Fast L2 failover, the standby's side: from the adverts heard (already verified with
//! their holder's own key, [`super::wire`]) and the standby lines of the assignment, which
//! IPs to check on the LAN and take over. Pure: no I/O, time passed in;
//! [`super::FastFailover`] does the checks and the reconciles.
//!
//! Rules:
//! - An advert counts only if it is for this node, comes from the holder of one of its
//!   standby lines and its counter is above the last one accepted under that holder's key
//!   (no replay). Only the IPs of that holder's standby lines are kept from it: what a
//!   holder lists beyond its lines, and whatever a node the assignment does not name
//!   sends, leaves no state ([`Heard::Unnamed`]). A holder no longer named is forgotten.
//! - A standby IP is **armed** when the last round of adverts from its holder (the node its
//!   standby line names) listed it. A holder that is alive but no longer lists an IP (it
//!   let it go on the controller's word, or lost it) disarms it: that is the controller's
//!   business, not a failover. A holder's new key (its agent restarted) keeps its IPs
//!   armed; only the counter starts again.
//! - An armed IP whose holder has been silent for [`FailoverConfig::dead`] (three advert
//!   intervals plus a skew) is **due**: the loop checks the LAN first (a quick ARP / DAD
//!   probe, [`FailoverConfig::check`], every due IP of a link in one round). Taken over
//!   only if nobody answers: a holder whose agent is frozen, or whose adverts are blocked
//!   while the LAN works, still answers ARP and keeps the IP, so the LAN never shows two
//!   holders for it.
//! - **Re-checks back off.** Once a holder's IPs answered during a silence, the holder is
//!   re-checked after an advert interval, doubling up to [`MAX_RECHECK`] (and once more
//!   when its aliases must have lapsed if it is frozen or dead: [`FailoverConfig::lapse`]
//!   after its last advert), and each re-check probes one of its IPs, not all: whether it
//!   is alive is a question about the holder. A re-check nobody answers takes that IP and checks all the holder's other IPs
//!   in the next round. So a silence that is not a failure (adverts dropped by a firewall,
//!   a key the controller has not relayed yet) costs the LAN about one probe per holder
//!   every [`MAX_RECHECK`], whatever the number of IPs, and a holder lost during such a
//!   silence is taken over within [`MAX_RECHECK`] and a check.
//! - An IP taken over is held (no probe) until the controller says otherwise, or its holder
//!   shows it is alive and holds it: an advert from it listing the IP, or its claim on the
//!   LAN ([`Standby::give_back`]). The controller's holder keeps priority: it is the one
//!   the whole cluster agrees on.
//! - A standby line that goes away or names another holder ends its takeover.
//! - The LAN alone cannot tell a dead holder from one cut off from the other nodes but
//!   still reaching its clients. So after a takeover the loop also watches the holder's
//!   Lease ([`super::HolderCheck`]): renewed after the takeover with a report that holds
//!   the IP, the holder is alive and serving it (its word about itself); the IP goes back
//!   and stays disarmed until an advert from that holder lists it again
//!   ([`Standby::give_back_for_good`]). With the API unreachable nothing is learnt there,
//!   and the takeover stands.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use aliaslb_core::advert::{Advert, PublicKey};

use super::FailoverConfig;
use crate::desired::DesiredSet;

/// The longest wait between two re-checks of a holder whose adverts are missing while its
/// IPs answer on the LAN.
pub const MAX_RECHECK: Duration = Duration::from_secs(2);

/// What an advert did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Heard {
    /// Counted; the IPs taken over that its sender holds again, to give back now.
    Accepted {
        /// Taken over here, listed by their holder again.
        give_back: Vec<IpAddr>,
        /// The holder's adverts had been missing while its IPs answered: they are back.
        back: bool,
    },
    /// For another node (a misrouted or replayed advert of another pair).
    NotForMe,
    /// From a node no standby line of this node names: nothing kept.
    Unnamed,
    /// The same advert again: its copy through the relay, or the direct one after it.
    Duplicate,
    /// Its counter is not above the last one from that sender: a replay, or reordered.
    Stale,
}

/// What a check round changed, for the log and the metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Checked {
    /// Taken over now.
    pub taken: Vec<IpAddr>,
    /// Still answered on the LAN.
    pub answered: Vec<IpAddr>,
    /// The holders whose IPs answered for the first time in this silence (said once).
    pub answering: Vec<String>,
}

/// The standby IPs by state ([`Standby::coverage`]), for the metrics: whether fast failover
/// covers them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Coverage {
    /// Its holder's latest adverts list it: taken over within a second of their silence.
    pub armed: usize,
    /// No advert of its holder lists it (none heard: UDP blocked, a key this node cannot
    /// verify, adverts off on the holder; or the holder does not hold it): if the holder
    /// dies, the IP moves only when its Lease expires.
    pub unheard: usize,
    /// Its holder's adverts stopped while the IP still answers on the LAN (adverts dropped
    /// on the way, a frozen holder): re-checked with backoff.
    pub silent: usize,
    /// Taken over by this node.
    pub taken_over: usize,
}

/// A holder whose adverts are missing while its IPs answer: when to look again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Recheck {
    backoff: Duration,
    next: Instant,
}

/// What is known of one holder named by the standby lines.
#[derive(Debug, Clone, Copy)]
struct Holder {
    /// Its key when its last advert was counted (a new key restarts the counter).
    key: Option<PublicKey>,
    counter: u64,
    /// When its last advert was heard.
    last: Option<Instant>,
    /// Set once its IPs answered during this silence.
    recheck: Option<Recheck>,
}

/// The standby's state.
#[derive(Debug)]
pub struct Standby {
    node: String,
    config: FailoverConfig,
    /// The holders the standby lines name (and no other node).
    holders: HashMap<String, Holder>,
    /// Per standby IP: the holder whose adverts last listed it, and when.
    listed: HashMap<IpAddr, (String, Instant)>,
    taken: BTreeSet<IpAddr>,
    checking: BTreeSet<IpAddr>,
}

impl Standby {
    /// The standby side of node `node`.
    pub fn new(node: &str, config: FailoverConfig) -> Self {
        Standby {
            node: node.to_owned(),
            config,
            holders: HashMap::new(),
            listed: HashMap::new(),
            taken: BTreeSet::new(),
            checking: BTreeSet::new(),
        }
    }

    /// The timers.
    pub fn config(&self) -> FailoverConfig {
        self.config
    }

    /// An advert verified with its sender's key, received at `now`; `desired` names the
    /// holders and their IPs.
    pub fn heard(&mut self, advert: &Advert, desired: &DesiredSet, now: Instant) -> Heard {
        if advert.to != self.node {
            return Heard::NotForMe;
        }
        let Some(holder) = self.holders.get_mut(&advert.from) else {
            return Heard::Unnamed;
        };
        match advert.counter.cmp(&holder.counter) {
            std::cmp::Ordering::Equal => return Heard::Duplicate,
            std::cmp::Ordering::Less => return Heard::Stale,
            std::cmp::Ordering::Greater => {}
        }
        holder.counter = advert.counter;
        holder.last = Some(now);
        let back = holder.recheck.take().is_some();
        let mut give_back = Vec::new();
        for ip in &advert.ips {
            if desired.standby(*ip).is_none_or(|l| l.holder != advert.from) {
                continue;
            }
            self.listed.insert(*ip, (advert.from.clone(), now));
            if self.taken.remove(ip) {
                give_back.push(*ip);
            }
        }
        Heard::Accepted { give_back, back }
    }

    /// When `holder`'s last round listed `ip`: `Some(when that round came)` if armed.
    fn armed(&self, ip: IpAddr, holder: &str) -> Option<Instant> {
        let (by, at) = self.listed.get(&ip)?;
        let last = self.holders.get(holder)?.last?;
        // The adverts of one round leave together; half an interval tells rounds apart.
        (by == holder && *at + self.config.interval / 2 >= last).then_some(last)
    }

    /// When the IPs of `holder` may next be checked, given the last advert at `last`.
    fn due_at(&self, holder: &str, last: Instant) -> Instant {
        let silent = last + self.config.dead;
        match self.holders.get(holder).and_then(|h| h.recheck) {
            Some(r) => silent.max(r.next),
            None => silent,
        }
    }

    /// The standby IPs to check on the LAN now, each with its holder: every armed IP of a
    /// holder silent for [`FailoverConfig::dead`], or one per holder being re-checked.
    pub fn due(&self, desired: &DesiredSet, now: Instant) -> Vec<(IpAddr, String)> {
        let mut out = Vec::new();
        let mut sampled: BTreeSet<&str> = BTreeSet::new();
        for (ip, line) in desired.standbys() {
            if self.taken.contains(&ip) || self.checking.contains(&ip) {
                continue;
            }
            let Some(last) = self.armed(ip, &line.holder) else {
                continue;
            };
            if now < self.due_at(&line.holder, last) {
                continue;
            }
            let rechecking = self
                .holders
                .get(&line.holder)
                .is_some_and(|h| h.recheck.is_some());
            if rechecking && !sampled.insert(&line.holder) {
                continue;
            }
            out.push((ip, line.holder.clone()));
        }
        out
    }

    /// When [`Self::due`] may next have something: the earliest silence deadline or
    /// re-check of the armed IPs; `None`: nothing armed.
    pub fn next_due(&self, desired: &DesiredSet) -> Option<Instant> {
        desired
            .standbys()
            .filter(|(ip, _)| !self.taken.contains(ip) && !self.checking.contains(ip))
            .filter_map(|(ip, line)| {
                let last = self.armed(ip, &line.holder)?;
                Some(self.due_at(&line.holder, last))
            })
            .min()
    }

    /// A check of `ip` started.
    pub fn checking(&mut self, ip: IpAddr) {
        self.checking.insert(ip);
    }

    /// A check round ended: `free` says, per IP checked, whether nobody answered. A free IP
    /// is taken over unless its holder spoke meanwhile; an answered one puts its holder in
    /// (or further into) re-checks; a free re-check of a holder makes all its IPs due.
    pub fn checked(
        &mut self,
        free: &[(IpAddr, bool)],
        desired: &DesiredSet,
        now: Instant,
    ) -> Checked {
        let mut out = Checked::default();
        let mut answering: BTreeSet<String> = BTreeSet::new();
        for &(ip, is_free) in free {
            self.checking.remove(&ip);
            let Some(line) = desired.standby(ip) else {
                continue;
            };
            let holder = line.holder.clone();
            if !is_free {
                out.answered.push(ip);
                answering.insert(holder);
                continue;
            }
            let still_due = self
                .armed(ip, &holder)
                .is_some_and(|last| now.saturating_duration_since(last) >= self.config.dead);
            if still_due {
                self.taken.insert(ip);
                out.taken.push(ip);
                // Its holder no longer answers there: check its other IPs at once.
                if let Some(h) = self.holders.get_mut(&holder) {
                    h.recheck = None;
                }
            }
        }
        // Once per holder and round, however many of its IPs answered.
        let (interval, lapse) = (self.config.interval, self.config.lapse);
        for holder in answering {
            let Some(h) = self.holders.get_mut(&holder) else {
                continue;
            };
            let backoff = h
                .recheck
                .map_or(interval, |r| (r.backoff * 2).min(MAX_RECHECK));
            if h.recheck.is_none() {
                out.answering.push(holder);
            }
            // A frozen or dead holder's aliases lapse by then: looked at again at once.
            let lapsed = h.last.map(|last| last + lapse + interval / 2);
            let next = match lapsed {
                Some(at) if at > now => (now + backoff).min(at),
                _ => now + backoff,
            };
            h.recheck = Some(Recheck { backoff, next });
        }
        out
    }

    /// The IPs taken over and held now.
    pub fn taken(&self) -> &BTreeSet<IpAddr> {
        &self.taken
    }

    /// The holder of a taken-over `ip` claims it on the LAN: give it back. Returns whether
    /// it was taken over here.
    pub fn give_back(&mut self, ip: IpAddr) -> bool {
        self.taken.remove(&ip)
    }

    /// The holder proved (by its Lease) that it is alive and holds taken-over `ip`: give
    /// it back, and do not take it again until an advert from the holder lists it (a
    /// holder cut off from this node on the LAN would be taken over again at once).
    /// Returns whether it was taken over here.
    pub fn give_back_for_good(&mut self, ip: IpAddr) -> bool {
        self.listed.remove(&ip);
        self.taken.remove(&ip)
    }

    /// A new desired set: takeovers whose standby line went away or names another holder
    /// end (a line that became this node's own is held as such); holders no line names any
    /// more are forgotten, and so is what no line needs; a holder's new key restarts its
    /// counter. Returns the takeovers ended.
    pub fn settle(&mut self, desired: &DesiredSet) -> Vec<IpAddr> {
        let same_holder =
            |ip: &IpAddr, by: &str| desired.standby(*ip).is_some_and(|l| l.holder == by);
        let ended: Vec<IpAddr> = self
            .taken
            .iter()
            .filter(|ip| {
                let by = self.listed.get(*ip).map(|(h, _)| h.as_str());
                by.is_none_or(|by| !same_holder(ip, by))
            })
            .copied()
            .collect();
        for ip in &ended {
            self.taken.remove(ip);
        }
        let named: BTreeSet<&str> = desired.standbys().map(|(_, l)| l.holder.as_str()).collect();
        self.holders.retain(|name, _| named.contains(name.as_str()));
        for name in named {
            let key = desired.peer_nodes().get(name).and_then(|p| p.key);
            let holder = self.holders.entry(name.to_owned()).or_insert(Holder {
                key,
                counter: 0,
                last: None,
                recheck: None,
            });
            if holder.key != key {
                holder.key = key;
                holder.counter = 0;
            }
        }
        self.listed.retain(|ip, (by, _)| same_holder(ip, by));
        self.checking.retain(|ip| desired.standby(*ip).is_some());
        ended
    }

    /// The standby IPs of `desired` by state at `now` ([`Coverage`]): can this node take
    /// each over within a second if its holder dies?
    pub fn coverage(&self, desired: &DesiredSet, now: Instant) -> Coverage {
        let mut out = Coverage::default();
        for (ip, line) in desired.standbys() {
            if self.taken.contains(&ip) {
                out.taken_over += 1;
                continue;
            }
            match self.armed(ip, &line.holder) {
                None => out.unheard += 1,
                Some(last) if now.saturating_duration_since(last) >= self.config.dead => {
                    out.silent += 1;
                }
                Some(_) => out.armed += 1,
            }
        }
        out
    }

    /// How many holders and IPs the state keeps (bounded by the standby lines).
    pub fn size(&self) -> (usize, usize) {
        (self.holders.len(), self.listed.len())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use aliaslb_core::advert::SigningKey;
    use aliaslb_core::assignment::PeerNode;

    use super::*;
    use crate::desired::StandbyLine;

    const MS: Duration = Duration::from_millis(1);

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn line(holder: &str) -> StandbyLine {
        StandbyLine {
            holder: holder.into(),
            interface: None,
            ports: BTreeSet::new(),
            vmac: None,
        }
    }

    /// This node (`b`) stands by for `ips` of `holder`.
    fn standby_of(holder: &str, ips: &[&str]) -> DesiredSet {
        let mut set = DesiredSet::new();
        for i in ips {
            set.add_standby(ip(i), line(holder));
        }
        set
    }

    fn advert(from: &str, to: &str, counter: u64, ips: &[&str]) -> Advert {
        Advert {
            from: from.into(),
            to: to.into(),
            counter,
            ips: ips.iter().map(|i| ip(i)).collect(),
        }
    }

    fn accepted(give_back: &[&str]) -> Heard {
        Heard::Accepted {
            give_back: give_back.iter().map(|i| ip(i)).collect(),
            back: false,
        }
    }

    /// A standby settled on `desired`.
    fn standby(desired: &DesiredSet) -> Standby {
        let mut f = Standby::new("b", FailoverConfig::default());
        f.settle(desired);
        f
    }

    /// One check round of `ips`, all with the same outcome.
    fn check(f: &mut Standby, d: &DesiredSet, ips: &[IpAddr], free: bool, at: Instant) -> Checked {
        for i in ips {
            f.checking(*i);
        }
        let outcomes: Vec<(IpAddr, bool)> = ips.iter().map(|i| (*i, free)).collect();
        f.checked(&outcomes, d, at)
    }

    #[test]
    fn a_silent_holder_makes_its_ips_due_after_three_intervals_and_a_half() {
        let t0 = Instant::now();
        let desired = standby_of("a", &["10.0.0.1", "10.0.0.2"]);
        let mut f = standby(&desired);
        assert!(
            f.due(&desired, t0).is_empty(),
            "nothing heard: nothing armed"
        );
        assert_eq!(f.next_due(&desired), None);
        let heard = f.heard(&advert("a", "b", 1, &["10.0.0.1"]), &desired, t0);
        assert_eq!(heard, accepted(&[]));
        assert_eq!(f.next_due(&desired), Some(t0 + 350 * MS));
        assert!(f.due(&desired, t0 + 349 * MS).is_empty());
        // 10.0.0.2 was never listed: not armed.
        assert_eq!(
            f.due(&desired, t0 + 350 * MS),
            vec![(ip("10.0.0.1"), "a".to_owned())]
        );
        // An advert keeps it alive.
        f.heard(&advert("a", "b", 2, &["10.0.0.1"]), &desired, t0 + 300 * MS);
        assert!(f.due(&desired, t0 + 500 * MS).is_empty());
    }

    #[test]
    fn replays_other_pairs_and_released_ips_arm_nothing() {
        let t0 = Instant::now();
        let desired = standby_of("a", &["10.0.0.1"]);
        let mut f = standby(&desired);
        f.heard(&advert("a", "b", 5, &["10.0.0.1"]), &desired, t0);
        let at = t0 + 50 * MS;
        assert_eq!(
            f.heard(&advert("a", "b", 5, &[]), &desired, at),
            Heard::Duplicate
        );
        assert_eq!(
            f.heard(&advert("a", "b", 4, &[]), &desired, at),
            Heard::Stale
        );
        assert_eq!(
            f.heard(&advert("a", "c", 9, &[]), &desired, at),
            Heard::NotForMe
        );
        // The holder alive, no longer listing the IP: released, not a failover.
        f.heard(&advert("a", "b", 6, &[]), &desired, t0 + 100 * MS);
        assert!(f.due(&desired, t0 + 2_000 * MS).is_empty());
        // Another node listing it does not arm the line of holder a: it is not named.
        let z = advert("z", "b", 1, &["10.0.0.1"]);
        assert_eq!(f.heard(&z, &desired, t0 + 200 * MS), Heard::Unnamed);
        assert!(f.due(&desired, t0 + 2_000 * MS).is_empty());
    }

    /// Nothing a node sends grows the state beyond the standby lines: adverts from
    /// made-up senders, and a named holder listing IPs that are not its lines.
    #[test]
    fn the_state_is_bounded_by_the_standby_lines() {
        let t0 = Instant::now();
        let mut desired = standby_of("a", &["10.0.0.1"]);
        desired.add_standby(ip("10.0.0.2"), line("c"));
        let mut f = standby(&desired);
        for n in 0..10_000u32 {
            let from = format!("made-up-{n}");
            let ips: Vec<IpAddr> = (0..64u32)
                .map(|k| IpAddr::from((n << 6 | k).to_be_bytes()))
                .collect();
            let flood = Advert {
                ips,
                ..advert(&from, "b", 1, &[])
            };
            assert_eq!(f.heard(&flood, &desired, t0), Heard::Unnamed);
        }
        // The named holder a lists its line, c's line and 64 foreign IPs.
        let mut ips = vec![ip("10.0.0.1"), ip("10.0.0.2")];
        ips.extend((0..64u8).map(|k| IpAddr::from([172, 16, 0, k])));
        let wide = Advert {
            ips,
            ..advert("a", "b", 1, &[])
        };
        assert_eq!(f.heard(&wide, &desired, t0), accepted(&[]));
        assert_eq!(
            f.size(),
            (2, 1),
            "two holders named, one IP listed by its holder"
        );
        // A holder the lines no longer name is forgotten with its IPs.
        f.settle(&standby_of("c", &["10.0.0.2"]));
        assert_eq!(f.size(), (1, 0));
    }

    #[test]
    fn a_holders_new_key_restarts_its_counter_and_keeps_its_ips_armed() {
        let t0 = Instant::now();
        let mut desired = standby_of("a", &["10.0.0.1"]);
        let peer = |key| PeerNode {
            key: Some(key),
            ..PeerNode::default()
        };
        desired.add_peer(
            "a".into(),
            peer(SigningKey::generate().unwrap().public_key()),
        );
        let mut f = standby(&desired);
        f.heard(&advert("a", "b", 900, &["10.0.0.1"]), &desired, t0);
        // The holder's agent restarted: a new key, counting from 1.
        let mut restarted = desired.clone();
        restarted.add_peer(
            "a".into(),
            peer(SigningKey::generate().unwrap().public_key()),
        );
        f.settle(&restarted);
        assert_eq!(
            f.due(&restarted, t0 + 350 * MS).len(),
            1,
            "still armed: a holder lost right after its restart is still taken over"
        );
        let again = advert("a", "b", 1, &["10.0.0.1"]);
        assert_eq!(f.heard(&again, &restarted, t0 + 100 * MS), accepted(&[]));
        // The same key again: the counter goes on.
        f.settle(&restarted);
        let old = advert("a", "b", 1, &["10.0.0.1"]);
        assert_eq!(f.heard(&old, &restarted, t0 + 150 * MS), Heard::Duplicate);
    }

    /// A holder whose adverts are missing while its IPs answer (a firewall, a key not
    /// relayed yet) is re-checked with backoff, one IP a round, and nobody answering
    /// makes all its IPs due again at once.
    #[test]
    fn rechecks_back_off_one_ip_per_holder_up_to_two_seconds() {
        let t0 = Instant::now();
        let ips = ["10.0.0.1", "10.0.0.2", "10.0.0.3"];
        let desired = standby_of("a", &ips);
        let mut f = standby(&desired);
        f.heard(&advert("a", "b", 1, &ips), &desired, t0);
        let mut at = t0 + 350 * MS;
        let due: Vec<IpAddr> = f.due(&desired, at).into_iter().map(|(i, _)| i).collect();
        assert_eq!(due.len(), 3, "the first check asks about every IP");
        let first = check(&mut f, &desired, &due, false, at);
        assert_eq!(first.answering, vec!["a".to_owned()], "said once");
        assert_eq!(first.answered.len(), 3);
        let mut gaps = Vec::new();
        for _ in 0..8 {
            let next = f.next_due(&desired).unwrap();
            assert!(f.due(&desired, next - MS).is_empty());
            gaps.push((next - at).as_millis());
            at = next;
            let due: Vec<IpAddr> = f.due(&desired, at).into_iter().map(|(i, _)| i).collect();
            assert_eq!(due.len(), 1, "a re-check asks about one IP of the holder");
            let round = check(&mut f, &desired, &due, false, at);
            assert!(round.answering.is_empty(), "not said again");
        }
        // 350 ms after the last advert, then 100, 200, 400, 800 ms; the next would be
        // 1,600 ms later, but the holder's aliases lapse 3,050 ms after its last advert (a
        // frozen holder is taken over then); then 2 s apart.
        assert_eq!(gaps, vec![100, 200, 400, 800, 1_200, 2_000, 2_000, 2_000]);
        // The holder is gone: the re-check finds its IP free, takes it, and the others
        // are due at once.
        at = f.next_due(&desired).unwrap();
        let due: Vec<IpAddr> = f.due(&desired, at).into_iter().map(|(i, _)| i).collect();
        let round = check(&mut f, &desired, &due, true, at);
        assert_eq!(round.taken, due);
        let rest: Vec<IpAddr> = f.due(&desired, at).into_iter().map(|(i, _)| i).collect();
        assert_eq!(rest.len(), 2);
        check(&mut f, &desired, &rest, true, at + 45 * MS);
        assert_eq!(f.taken().len(), 3);
        // Its adverts again: given back, and the re-checks are over.
        let heard = f.heard(&advert("a", "b", 2, &ips), &desired, at + 100 * MS);
        assert_eq!(
            heard,
            Heard::Accepted {
                give_back: ips.iter().map(|i| ip(i)).collect(),
                back: false
            }
        );
    }

    #[test]
    fn adverts_back_end_the_rechecks_and_say_so() {
        let t0 = Instant::now();
        let desired = standby_of("a", &["10.0.0.1"]);
        let mut f = standby(&desired);
        f.heard(&advert("a", "b", 1, &["10.0.0.1"]), &desired, t0);
        let at = t0 + 400 * MS;
        check(&mut f, &desired, &[ip("10.0.0.1")], false, at);
        let heard = f.heard(&advert("a", "b", 2, &["10.0.0.1"]), &desired, at + 50 * MS);
        assert_eq!(
            heard,
            Heard::Accepted {
                give_back: vec![],
                back: true
            }
        );
        // Silent again: a fresh first check after three intervals and a half.
        assert_eq!(f.next_due(&desired), Some(at + 400 * MS));
    }

    #[test]
    fn a_holder_heard_during_the_check_keeps_the_ip() {
        let t0 = Instant::now();
        let desired = standby_of("a", &["10.0.0.1"]);
        let mut f = standby(&desired);
        f.heard(&advert("a", "b", 1, &["10.0.0.1"]), &desired, t0);
        f.checking(ip("10.0.0.1"));
        f.heard(&advert("a", "b", 2, &["10.0.0.1"]), &desired, t0 + 380 * MS);
        let round = f.checked(&[(ip("10.0.0.1"), true)], &desired, t0 + 400 * MS);
        assert!(round.taken.is_empty());
        assert!(f.taken().is_empty());
    }

    #[test]
    fn a_takeover_ends_when_the_holder_lists_the_ip_again_or_the_line_changes() {
        let t0 = Instant::now();
        let desired = standby_of("a", &["10.0.0.1", "10.0.0.2"]);
        let mut f = standby(&desired);
        f.heard(
            &advert("a", "b", 1, &["10.0.0.1", "10.0.0.2"]),
            &desired,
            t0,
        );
        let both = [ip("10.0.0.1"), ip("10.0.0.2")];
        assert_eq!(
            check(&mut f, &desired, &both, true, t0 + 400 * MS)
                .taken
                .len(),
            2
        );
        assert_eq!(
            f.heard(&advert("a", "b", 2, &["10.0.0.1"]), &desired, t0 + 600 * MS),
            accepted(&["10.0.0.1"])
        );
        assert_eq!(f.taken(), &BTreeSet::from([ip("10.0.0.2")]));
        // Its claim on the LAN gives it back too.
        assert!(f.give_back(ip("10.0.0.2")));
        assert!(!f.give_back(ip("10.0.0.2")));
        // A line that names another holder ends a takeover.
        f.heard(&advert("a", "b", 3, &["10.0.0.2"]), &desired, t0 + 700 * MS);
        let one = [ip("10.0.0.2")];
        assert_eq!(
            check(&mut f, &desired, &one, true, t0 + 1_100 * MS).taken,
            one
        );
        let moved = standby_of("c", &["10.0.0.2"]);
        assert_eq!(f.settle(&moved), vec![ip("10.0.0.2")]);
        assert!(f.taken().is_empty());
        // The same line kept: the takeover stays.
        f.heard(&advert("c", "b", 1, &["10.0.0.2"]), &moved, t0 + 1_200 * MS);
        assert_eq!(
            check(&mut f, &moved, &one, true, t0 + 1_600 * MS).taken,
            one
        );
        assert!(f.settle(&moved).is_empty());
    }

    #[test]
    fn coverage_says_which_standby_ips_fail_over_fast() {
        let d = standby_of("a", &["10.0.0.1", "10.0.0.2", "10.0.0.3"]);
        let mut f = standby(&d);
        let t0 = Instant::now();
        let cov = |f: &Standby, at: Instant| f.coverage(&d, at);
        // Nothing heard yet: no IP could be taken over fast.
        assert_eq!(
            cov(&f, t0),
            Coverage {
                unheard: 3,
                ..Coverage::default()
            }
        );
        // The holder lists two of them.
        f.heard(&advert("a", "b", 1, &["10.0.0.1", "10.0.0.2"]), &d, t0);
        assert_eq!(
            cov(&f, t0 + 100 * MS),
            Coverage {
                armed: 2,
                unheard: 1,
                ..Coverage::default()
            }
        );
        // Its adverts stop: silent once `dead` passed; a check finds them answered.
        let dead = FailoverConfig::default().dead;
        assert_eq!(cov(&f, t0 + dead - MS).silent, 0);
        let at = t0 + dead;
        check(&mut f, &d, &[ip("10.0.0.1"), ip("10.0.0.2")], false, at);
        assert_eq!(
            cov(&f, at),
            Coverage {
                silent: 2,
                unheard: 1,
                ..Coverage::default()
            }
        );
        // One is free at the next check: taken over.
        let later = at + 2 * dead;
        check(&mut f, &d, &[ip("10.0.0.1")], true, later);
        assert_eq!(
            cov(&f, later),
            Coverage {
                taken_over: 1,
                silent: 1,
                unheard: 1,
                ..Coverage::default()
            }
        );
    }
}
