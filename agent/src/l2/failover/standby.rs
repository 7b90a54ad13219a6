//! Fast L2 failover, the standby's side: from the adverts heard (already verified by their
//! MAC, [`aliaslb_core::advert`]) and the standby lines of the assignment, which IPs to
//! check on the LAN and take over. Pure: no I/O, time passed in; [`super::FastFailover`]
//! does the checks and the reconciles.
//!
//! Rules:
//! - An advert counts only if it is for this node and its counter is above the last one
//!   accepted from its sender (no replay).
//! - A standby IP is **armed** when the last round of adverts from its holder (the node its
//!   standby line names) listed it. A holder that is alive but no longer lists an IP (it
//!   let it go on the controller's word, or lost it) disarms it: that is the controller's
//!   business, not a failover.
//! - An armed IP whose holder has been silent for [`FailoverConfig::dead`] (three advert
//!   intervals plus a skew) is **due**: the loop checks the LAN first (a quick ARP / DAD
//!   probe, [`FailoverConfig::check`]). Taken over only if nobody answers: a holder whose
//!   agent is frozen, or whose adverts are blocked while the LAN works, still answers ARP
//!   and keeps the IP, so the LAN never shows two holders for it. An answered IP is checked
//!   again one interval later.
//! - An IP taken over is held (no probe) until the controller says otherwise, or its holder
//!   shows it is alive and holds it: an advert from it listing the IP, or its claim on the
//!   LAN ([`Standby::give_back`]). The controller's holder keeps priority: it is the one
//!   the whole cluster agrees on.
//! - A standby line that goes away or names another holder ends its takeover.
//! - The LAN alone cannot tell a dead holder from one cut off from the other nodes but
//!   still reaching its clients. So after a takeover the loop also watches the holder's
//!   Lease ([`HolderCheck`]): renewed after the takeover with a report that holds the IP,
//!   the holder is alive and serving it; the IP goes back and stays disarmed until an
//!   advert from that holder lists it again ([`Standby::give_back_for_good`]). With the
//!   API unreachable nothing is learnt there, and the takeover stands.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::time::Instant;

use aliaslb_core::advert::Advert;

use super::FailoverConfig;
use crate::desired::DesiredSet;

/// What an advert did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Heard {
    /// Counted; the IPs taken over that its sender holds again, to give back now.
    Accepted {
        /// Taken over here, listed by their holder again.
        give_back: Vec<IpAddr>,
    },
    /// For another node (a misrouted or replayed advert of another pair).
    NotForMe,
    /// The same advert again: its copy through the relay, or the direct one after it.
    Duplicate,
    /// Its counter is not above the last one from that sender: a replay, or reordered.
    Stale,
}

#[derive(Debug, Clone, Copy)]
struct Sender {
    counter: u64,
    last: Instant,
}

/// The standby's state.
#[derive(Debug)]
pub struct Standby {
    node: String,
    config: FailoverConfig,
    senders: HashMap<String, Sender>,
    /// Per IP: the holder whose advert listed it last, and when.
    listed: HashMap<IpAddr, (String, Instant)>,
    taken: BTreeSet<IpAddr>,
    checking: BTreeSet<IpAddr>,
    /// IPs whose last check was answered, and when.
    answered: HashMap<IpAddr, Instant>,
}

impl Standby {
    /// The standby side of node `node`.
    pub fn new(node: &str, config: FailoverConfig) -> Self {
        Standby {
            node: node.to_owned(),
            config,
            senders: HashMap::new(),
            listed: HashMap::new(),
            taken: BTreeSet::new(),
            checking: BTreeSet::new(),
            answered: HashMap::new(),
        }
    }

    /// The timers.
    pub fn config(&self) -> FailoverConfig {
        self.config
    }

    /// An advert verified by its MAC, received at `now`.
    pub fn heard(&mut self, advert: &Advert, now: Instant) -> Heard {
        if advert.to != self.node {
            return Heard::NotForMe;
        }
        match self.senders.get_mut(&advert.from) {
            Some(s) if advert.counter == s.counter => return Heard::Duplicate,
            Some(s) if advert.counter < s.counter => return Heard::Stale,
            Some(s) => {
                s.counter = advert.counter;
                s.last = now;
            }
            None => {
                self.senders.insert(
                    advert.from.clone(),
                    Sender {
                        counter: advert.counter,
                        last: now,
                    },
                );
            }
        }
        let mut give_back = Vec::new();
        for ip in &advert.ips {
            self.listed.insert(*ip, (advert.from.clone(), now));
            self.answered.remove(ip);
            if self.taken.remove(ip) {
                give_back.push(*ip);
            }
        }
        Heard::Accepted { give_back }
    }

    /// Whether `ip`, a standby IP of `holder`, was in that holder's last round.
    fn armed(&self, ip: IpAddr, holder: &str) -> Option<Instant> {
        let (by, at) = self.listed.get(&ip)?;
        let sender = self.senders.get(holder)?;
        // The adverts of one round leave together; half an interval tells rounds apart.
        (by == holder && *at + self.config.interval / 2 >= sender.last).then_some(sender.last)
    }

    /// The standby IPs to check on the LAN now, each with its holder.
    pub fn due(&self, desired: &DesiredSet, now: Instant) -> Vec<(IpAddr, String)> {
        desired
            .standbys()
            .filter(|(ip, _)| !self.taken.contains(ip) && !self.checking.contains(ip))
            .filter(|(ip, line)| {
                self.armed(*ip, &line.holder)
                    .is_some_and(|last| now.saturating_duration_since(last) >= self.config.dead)
            })
            .filter(|(ip, _)| {
                self.answered
                    .get(ip)
                    .is_none_or(|at| now.saturating_duration_since(*at) >= self.config.interval)
            })
            .map(|(ip, line)| (ip, line.holder.clone()))
            .collect()
    }

    /// When [`Self::due`] may next have something: the earliest silence deadline of the
    /// armed IPs, or a re-check; `None`: nothing armed.
    pub fn next_due(&self, desired: &DesiredSet) -> Option<Instant> {
        desired
            .standbys()
            .filter(|(ip, _)| !self.taken.contains(ip) && !self.checking.contains(ip))
            .filter_map(|(ip, line)| {
                let silent = self.armed(ip, &line.holder)? + self.config.dead;
                Some(match self.answered.get(&ip) {
                    Some(at) => silent.max(*at + self.config.interval),
                    None => silent,
                })
            })
            .min()
    }

    /// A check of `ip` started.
    pub fn checking(&mut self, ip: IpAddr) {
        self.checking.insert(ip);
    }

    /// The check of `ip` ended: `free` (nobody answered) takes it over unless its holder
    /// spoke meanwhile. Returns whether it was taken over.
    pub fn checked(&mut self, ip: IpAddr, free: bool, desired: &DesiredSet, now: Instant) -> bool {
        self.checking.remove(&ip);
        if !free {
            self.answered.insert(ip, now);
            return false;
        }
        let still_due = desired.standby(ip).is_some_and(|line| {
            self.armed(ip, &line.holder)
                .is_some_and(|last| now.saturating_duration_since(last) >= self.config.dead)
        });
        if still_due {
            self.taken.insert(ip);
        }
        still_due
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
    /// end (a line that became this node's own is held as such). Returns those ended.
    pub fn settle(&mut self, desired: &DesiredSet) -> Vec<IpAddr> {
        let ended: Vec<IpAddr> = self
            .taken
            .iter()
            .filter(|ip| {
                let line = desired.standby(**ip);
                let holder = self.listed.get(*ip).map(|(h, _)| h.as_str());
                line.is_none_or(|line| Some(line.holder.as_str()) != holder)
            })
            .copied()
            .collect();
        for ip in &ended {
            self.taken.remove(ip);
        }
        // Forget what no standby line needs any more.
        self.listed.retain(|ip, _| desired.standby(*ip).is_some());
        self.answered.retain(|ip, _| desired.standby(*ip).is_some());
        ended
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::desired::StandbyLine;

    const MS: Duration = Duration::from_millis(1);

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn standby_of(holder: &str, ips: &[&str]) -> DesiredSet {
        let mut set = DesiredSet::new();
        for i in ips {
            set.add_standby(
                ip(i),
                StandbyLine {
                    holder: holder.into(),
                    interface: None,
                    ports: BTreeSet::new(),
                    vmac: None,
                },
            );
        }
        set
    }

    fn advert(from: &str, to: &str, counter: u64, ips: &[&str]) -> Advert {
        Advert {
            from: from.into(),
            to: to.into(),
            counter,
            via: None,
            ips: ips.iter().map(|i| ip(i)).collect(),
        }
    }

    #[test]
    fn a_silent_holder_makes_its_ips_due_after_three_intervals_and_a_half() {
        let t0 = Instant::now();
        let mut f = Standby::new("b", FailoverConfig::default());
        let desired = standby_of("a", &["10.0.0.1", "10.0.0.2"]);
        assert!(
            f.due(&desired, t0).is_empty(),
            "nothing heard: nothing armed"
        );
        assert_eq!(f.next_due(&desired), None);
        let heard = f.heard(&advert("a", "b", 1, &["10.0.0.1"]), t0);
        assert_eq!(heard, Heard::Accepted { give_back: vec![] });
        assert_eq!(f.next_due(&desired), Some(t0 + 350 * MS));
        assert!(f.due(&desired, t0 + 349 * MS).is_empty());
        // 10.0.0.2 was never listed: not armed.
        assert_eq!(
            f.due(&desired, t0 + 350 * MS),
            vec![(ip("10.0.0.1"), "a".to_owned())]
        );
        // An advert keeps it alive.
        f.heard(&advert("a", "b", 2, &["10.0.0.1"]), t0 + 300 * MS);
        assert!(f.due(&desired, t0 + 500 * MS).is_empty());
    }

    #[test]
    fn replays_other_pairs_and_released_ips_arm_nothing() {
        let t0 = Instant::now();
        let mut f = Standby::new("b", FailoverConfig::default());
        let desired = standby_of("a", &["10.0.0.1"]);
        f.heard(&advert("a", "b", 5, &["10.0.0.1"]), t0);
        assert_eq!(
            f.heard(&advert("a", "b", 5, &[]), t0 + 50 * MS),
            Heard::Duplicate
        );
        assert_eq!(
            f.heard(&advert("a", "b", 4, &[]), t0 + 50 * MS),
            Heard::Stale
        );
        assert_eq!(
            f.heard(&advert("a", "c", 9, &[]), t0 + 50 * MS),
            Heard::NotForMe
        );
        // The holder alive, no longer listing the IP: released, not a failover.
        f.heard(&advert("a", "b", 6, &[]), t0 + 100 * MS);
        assert!(f.due(&desired, t0 + 2_000 * MS).is_empty());
        // Another node listing it does not arm the line of holder a.
        f.heard(&advert("z", "b", 1, &["10.0.0.1"]), t0 + 200 * MS);
        assert!(f.due(&desired, t0 + 2_000 * MS).is_empty());
    }

    #[test]
    fn an_answered_check_keeps_the_holder_and_checks_again_an_interval_later() {
        let t0 = Instant::now();
        let mut f = Standby::new("b", FailoverConfig::default());
        let desired = standby_of("a", &["10.0.0.1"]);
        f.heard(&advert("a", "b", 1, &["10.0.0.1"]), t0);
        let at = t0 + 400 * MS;
        f.checking(ip("10.0.0.1"));
        assert!(f.due(&desired, at).is_empty(), "one check at a time");
        assert!(!f.checked(ip("10.0.0.1"), false, &desired, at));
        assert!(f.taken().is_empty());
        assert!(f.due(&desired, at + 99 * MS).is_empty());
        assert_eq!(f.next_due(&desired), Some(at + 100 * MS));
        assert_eq!(f.due(&desired, at + 100 * MS).len(), 1);
        f.checking(ip("10.0.0.1"));
        assert!(f.checked(ip("10.0.0.1"), true, &desired, at + 150 * MS));
        assert_eq!(f.taken(), &BTreeSet::from([ip("10.0.0.1")]));
        assert!(f.due(&desired, at + 500 * MS).is_empty(), "held: not due");
        assert_eq!(f.next_due(&desired), None);
    }

    #[test]
    fn a_holder_heard_during_the_check_keeps_the_ip() {
        let t0 = Instant::now();
        let mut f = Standby::new("b", FailoverConfig::default());
        let desired = standby_of("a", &["10.0.0.1"]);
        f.heard(&advert("a", "b", 1, &["10.0.0.1"]), t0);
        f.checking(ip("10.0.0.1"));
        f.heard(&advert("a", "b", 2, &["10.0.0.1"]), t0 + 380 * MS);
        assert!(!f.checked(ip("10.0.0.1"), true, &desired, t0 + 400 * MS));
        assert!(f.taken().is_empty());
    }

    #[test]
    fn a_takeover_ends_when_the_holder_lists_the_ip_again_or_the_line_changes() {
        let t0 = Instant::now();
        let mut f = Standby::new("b", FailoverConfig::default());
        let desired = standby_of("a", &["10.0.0.1", "10.0.0.2"]);
        f.heard(&advert("a", "b", 1, &["10.0.0.1", "10.0.0.2"]), t0);
        for i in ["10.0.0.1", "10.0.0.2"] {
            f.checking(ip(i));
            assert!(f.checked(ip(i), true, &desired, t0 + 400 * MS));
        }
        assert_eq!(
            f.heard(&advert("a", "b", 2, &["10.0.0.1"]), t0 + 600 * MS),
            Heard::Accepted {
                give_back: vec![ip("10.0.0.1")]
            }
        );
        assert_eq!(f.taken(), &BTreeSet::from([ip("10.0.0.2")]));
        // Its claim on the LAN gives it back too.
        assert!(f.give_back(ip("10.0.0.2")));
        assert!(!f.give_back(ip("10.0.0.2")));
        // A line that names another holder ends a takeover.
        f.heard(&advert("a", "b", 3, &["10.0.0.2"]), t0 + 700 * MS);
        f.checking(ip("10.0.0.2"));
        assert!(f.checked(ip("10.0.0.2"), true, &desired, t0 + 1_100 * MS));
        let moved = standby_of("c", &["10.0.0.2"]);
        assert_eq!(f.settle(&moved), vec![ip("10.0.0.2")]);
        assert!(f.taken().is_empty());
        // The same line kept: the takeover stays.
        f.heard(&advert("c", "b", 1, &["10.0.0.2"]), t0 + 1_200 * MS);
        f.checking(ip("10.0.0.2"));
        assert!(f.checked(ip("10.0.0.2"), true, &moved, t0 + 1_600 * MS));
        assert!(f.settle(&moved).is_empty());
    }
}
