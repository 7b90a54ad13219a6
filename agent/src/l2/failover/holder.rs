//! Fast L2 failover, the holder's side: step down from an IP that nobody hears any more.
//! Pure: no I/O, time passed in; [`super::FastFailover`] probes and asks, the run loop
//! removes and re-adds the aliases.
//!
//! The standby takes an IP over when its holder's adverts stop and nothing answers for it
//! on the LAN. A holder cut off from the other nodes but not from its clients (a LAN
//! partition between the nodes) still answers them: without stepping down, two MACs would
//! answer for the IP until the API told the standby to give it back. So:
//! - The standby acks every advert it accepts, and so does the relay for each copy it
//!   forwards ([`aliaslb_core::advert::Ack`], signed, its counter growing per sender).
//! - A held IP is **armed** once its standby has acked at least once (an agent older than
//!   acks never arms it, and then nothing changes).
//! - When the standby and the relay of armed IPs have both been silent for [`StepDowns::after`]
//!   (two advert intervals), the holder asks the LAN whether it still reaches the standby:
//!   an ARP / DAD probe of the standby's node address, which its kernel answers whatever its
//!   agent does. Answered: the standby's own LAN check will hear this holder answer for the
//!   IP too, so nothing is to fear (adverts or acks dropped by a firewall, the standby's
//!   agent restarting); asked again while the silence lasts, an interval later and then
//!   twice as long each time, up to [`super::standby::MAX_RECHECK`] (one probe per pair,
//!   not per IP). A partition that begins during such a silence is stepped down within that
//!   wait. Not answered:
//!   the IPs of that pair are **stepped down**, their aliases go. The standby acts only
//!   after three and a half intervals and its own LAN check, so the holder is gone from the
//!   LAN about an interval before the standby can take the IP: one MAC.
//! - An ack from the standby or the relay after the step-down **lifts** it: the nodes hear
//!   each other again; the holder re-adds the IP and claims it (the standby gives a
//!   takeover back on that claim, or on the next advert that lists the IP).
//! - Silence cannot tell a partition from a dead standby. So a step-down is checked after
//!   a second ([`super::STANDBY_CHECK`]): the holder stays down only on evidence that
//!   another node holds the IP, and takes it back otherwise ([`StepDowns::retake`]; the
//!   standby's acks must then arm it again). The evidence is the LAN's: another MAC
//!   answers the holder's probe of the IP. Where a relay is named, the standby's own word
//!   counts too (its Lease renewed with a report that holds the IP): the relay, a third
//!   node, was silent as well, which the standby alone cannot cause, and the holder then
//!   stays down through a partition that hides the standby's answers from it. Where no
//!   relay is named (two nodes on the LAN), the standby's word is not enough: a standby
//!   that stops acking and claims the IP in its Lease without answering for it on the LAN
//!   keeps its holder down for the check's second only. A dead standby costs its holder
//!   one step-down (that second) when no relay acks either.
//! - Acks count only from the standbys and relays of the IPs held
//!   ([`StepDowns::name_peers`]); nothing from another node is kept.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use aliaslb_core::advert::{Ack, PublicKey};

/// The acks of one node.
#[derive(Debug, Clone, Copy)]
struct Acks {
    /// Its key when its last ack was counted (a new key restarts the counter).
    key: Option<PublicKey>,
    counter: u64,
    /// When the last one came; `None` once the node was disarmed by a re-take.
    last: Option<Instant>,
}

/// A held IP's peers: the standby its adverts go to, and the relay that forwards them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peers<'a> {
    /// The standby node.
    pub standby: &'a str,
    /// The relay node, if the assignment names one.
    pub relay: Option<&'a str>,
}

/// A step-down in force.
#[derive(Debug, Clone, PartialEq, Eq)]
struct StepDown {
    since: Instant,
    standby: String,
    relay: Option<String>,
}

/// What an ack did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Acked {
    /// Counted; the step-downs it lifts.
    Accepted {
        /// Stepped down before, to be held again now.
        lifted: Vec<IpAddr>,
    },
    /// Its counter is not above the last one from that node: a replay, or reordered.
    Stale,
    /// From a node that is the standby or relay of no IP held here: nothing kept.
    Unnamed,
}

/// A standby and relay, owned (the key of the per-pair state).
pub type Pair = (String, Option<String>);

impl<'a> Peers<'a> {
    /// The peers of an owned pair.
    pub fn of(pair: &'a Pair) -> Self {
        Peers {
            standby: &pair.0,
            relay: pair.1.as_deref(),
        }
    }

    /// The pair, owned.
    pub fn pair(&self) -> Pair {
        (self.standby.to_owned(), self.relay.map(str::to_owned))
    }
}

/// The holder's step-downs.
#[derive(Debug)]
pub struct StepDowns {
    interval: Duration,
    after: Duration,
    acks: HashMap<String, Acks>,
    stepped: BTreeMap<IpAddr, StepDown>,
    /// Pairs whose standby is being probed on the LAN.
    probing: BTreeSet<Pair>,
    /// Pairs whose standby answered the last probe: when, and the wait before the next
    /// (an interval, doubling up to [`super::standby::MAX_RECHECK`] while it keeps
    /// answering and its acks stay missing).
    answered: HashMap<Pair, (Instant, Duration)>,
}

impl StepDowns {
    /// The step-downs for adverts every `interval`.
    pub fn new(interval: Duration) -> Self {
        StepDowns {
            interval,
            after: interval * 2,
            acks: HashMap::new(),
            stepped: BTreeMap::new(),
            probing: BTreeSet::new(),
            answered: HashMap::new(),
        }
    }

    /// Silence of both peers after which the standby is probed on the LAN.
    pub fn after(&self) -> Duration {
        self.after
    }

    /// The standbys and relays of the IPs held (`named`, with the keys they sign with):
    /// acks are kept from these only; the others are forgotten, and a new key restarts its
    /// node's counter.
    pub fn name_peers(&mut self, named: impl IntoIterator<Item = (String, Option<PublicKey>)>) {
        let named: HashMap<String, Option<PublicKey>> = named.into_iter().collect();
        self.acks.retain(|node, _| named.contains_key(node));
        for (node, key) in named {
            let a = self.acks.entry(node).or_insert(Acks {
                key,
                counter: 0,
                last: None,
            });
            if a.key != key {
                a.key = key;
                a.counter = 0;
            }
        }
    }

    /// An ack verified with its sender's key (for this node), received at `now`.
    pub fn acked(&mut self, ack: &Ack, now: Instant) -> Acked {
        match self.acks.get_mut(&ack.from) {
            None => return Acked::Unnamed,
            Some(a) if ack.counter <= a.counter => return Acked::Stale,
            Some(a) => {
                a.counter = ack.counter;
                a.last = Some(now);
            }
        }
        self.answered.retain(|(standby, relay), _| {
            *standby != ack.from && relay.as_deref() != Some(&ack.from)
        });
        let lifted: Vec<IpAddr> = self
            .stepped
            .iter()
            .filter(|(_, s)| s.standby == ack.from || s.relay.as_deref() == Some(&ack.from))
            .map(|(ip, _)| *ip)
            .collect();
        for ip in &lifted {
            self.stepped.remove(ip);
        }
        Acked::Accepted { lifted }
    }

    /// When an IP with `peers` was last heard by one of them; `None` while it is not armed
    /// (its standby never acked, or not since a re-take).
    fn heard(&self, peers: Peers<'_>) -> Option<Instant> {
        let standby = self.acks.get(peers.standby)?.last?;
        let relay = peers
            .relay
            .and_then(|r| self.acks.get(r))
            .and_then(|a| a.last);
        Some(relay.map_or(standby, |r| r.max(standby)))
    }

    /// Whether `peers` have been silent for [`Self::after`] (and since the last answered
    /// probe, for an interval).
    fn silent(&self, peers: Peers<'_>, now: Instant) -> bool {
        self.heard(peers)
            .is_some_and(|at| now.saturating_duration_since(at) >= self.after)
    }

    /// Whether the standby of `peers` is to be probed now: silent, not being probed, and
    /// past the wait after its last answer.
    pub fn due(&self, peers: Peers<'_>, now: Instant) -> bool {
        let pair = peers.pair();
        self.silent(peers, now)
            && !self.probing.contains(&pair)
            && self
                .answered
                .get(&pair)
                .is_none_or(|(at, wait)| now.saturating_duration_since(*at) >= *wait)
    }

    /// When [`Self::due`] may next say yes for one of `pairs` (the peers of the IPs held
    /// and not stepped down: one entry per pair, however many IPs it carries); `None`:
    /// none armed.
    pub fn next_due<'a>(&self, pairs: impl IntoIterator<Item = Peers<'a>>) -> Option<Instant> {
        pairs
            .into_iter()
            .filter(|peers| !self.probing.contains(&peers.pair()))
            .filter_map(|peers| {
                let silent = self.heard(peers)? + self.after;
                Some(match self.answered.get(&peers.pair()) {
                    Some((at, wait)) => silent.max(*at + *wait),
                    None => silent,
                })
            })
            .min()
    }

    /// A probe of the standby of `peers` started.
    pub fn probing(&mut self, peers: Peers<'_>) {
        self.probing.insert(peers.pair());
    }

    /// The probe of the standby of `peers` ended at `now`: `answered` keeps the IPs (asked
    /// again an interval later, then after twice as long each time, up to
    /// [`super::standby::MAX_RECHECK`]); otherwise returns whether they are to be stepped
    /// down now (still silent: no ack came meanwhile).
    pub fn probed(&mut self, peers: Peers<'_>, answered: bool, now: Instant) -> bool {
        let pair = peers.pair();
        self.probing.remove(&pair);
        if answered {
            let wait = self.answered.get(&pair).map_or(self.interval, |(_, w)| {
                (*w * 2).min(super::standby::MAX_RECHECK)
            });
            self.answered.insert(pair, (now, wait));
            return false;
        }
        self.answered.remove(&pair);
        self.silent(peers, now)
    }

    /// Steps down from `ip` at `now`.
    pub fn step_down(&mut self, ip: IpAddr, peers: Peers<'_>, now: Instant) {
        self.stepped.insert(
            ip,
            StepDown {
                since: now,
                standby: peers.standby.to_owned(),
                relay: peers.relay.map(str::to_owned),
            },
        );
    }

    /// Whether `ip` is stepped down.
    pub fn is_stepped_down(&self, ip: IpAddr) -> bool {
        self.stepped.contains_key(&ip)
    }

    /// The IPs stepped down, each with its standby.
    pub fn stepped_down(&self) -> impl Iterator<Item = (IpAddr, &str)> {
        self.stepped.iter().map(|(ip, s)| (*ip, s.standby.as_str()))
    }

    /// The check after a step-down ended: of `asked`, `held_elsewhere` are held by
    /// another node (see [`super::FastFailover`] for the evidence); the others (still
    /// stepped down) are taken back now, and the standby must ack again before they can be
    /// stepped down again. Returns those taken back.
    pub fn retake(
        &mut self,
        standby: &str,
        asked: &[IpAddr],
        held_elsewhere: &[IpAddr],
    ) -> Vec<IpAddr> {
        let back: Vec<IpAddr> = asked
            .iter()
            .filter(|ip| !held_elsewhere.contains(ip))
            .filter(|ip| self.stepped.get(ip).is_some_and(|s| s.standby == standby))
            .copied()
            .collect();
        for ip in &back {
            self.stepped.remove(ip);
        }
        if !back.is_empty()
            && let Some(a) = self.acks.get_mut(standby)
        {
            a.last = None;
        }
        back
    }

    /// Ends the step-downs of IPs that `keep` no longer names with the same standby (no
    /// longer desired here, or another standby): the assignment changed. Returns them.
    pub fn settle<'a>(&mut self, keep: impl Fn(IpAddr) -> Option<Peers<'a>>) -> Vec<IpAddr> {
        let ended: Vec<IpAddr> = self
            .stepped
            .iter()
            .filter(|(ip, s)| keep(**ip).is_none_or(|p| p.standby != s.standby))
            .map(|(ip, _)| *ip)
            .collect();
        for ip in &ended {
            self.stepped.remove(ip);
        }
        ended
    }

    /// How long `ip` has been stepped down, at `now`.
    pub fn stepped_for(&self, ip: IpAddr, now: Instant) -> Option<Duration> {
        self.stepped
            .get(&ip)
            .map(|s| now.saturating_duration_since(s.since))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn ack(from: &str, counter: u64) -> Ack {
        Ack {
            from: from.into(),
            to: "h".into(),
            counter,
        }
    }

    const PEERS: Peers<'static> = Peers {
        standby: "s",
        relay: Some("r"),
    };

    /// `f` with the standby `s` and the relay `r` named.
    fn named(mut f: StepDowns) -> StepDowns {
        f.name_peers([("s".to_owned(), None), ("r".to_owned(), None)]);
        f
    }

    fn held(ips: &[&str]) -> Vec<(IpAddr, Peers<'static>)> {
        ips.iter().map(|i| (ip(i), PEERS)).collect()
    }

    /// The IPs of `held` whose standby is to be probed, as the loop finds them.
    fn due(f: &StepDowns, held: &[(IpAddr, Peers<'static>)], now: Instant) -> Vec<IpAddr> {
        held.iter()
            .filter(|(ip, peers)| !f.is_stepped_down(*ip) && f.due(*peers, now))
            .map(|(ip, _)| *ip)
            .collect()
    }

    fn pairs(f: &StepDowns, held: &[(IpAddr, Peers<'static>)]) -> Vec<Peers<'static>> {
        held.iter()
            .filter(|(ip, _)| !f.is_stepped_down(*ip))
            .map(|(_, p)| *p)
            .collect()
    }

    #[test]
    fn an_armed_ip_whose_peers_are_silent_for_two_intervals_is_stepped_down_if_the_standby_does_not_answer()
     {
        let t0 = Instant::now();
        let mut f = named(StepDowns::new(100 * MS));
        let ips = held(&["10.0.0.1"]);
        // The relay alone does not arm it (an older standby never acks).
        f.acked(&ack("r", 1), t0);
        assert_eq!(f.next_due(pairs(&f, &ips)), None);
        assert!(due(&f, &ips, t0 + 10_000 * MS).is_empty());
        f.acked(&ack("s", 1), t0);
        assert_eq!(f.next_due(pairs(&f, &ips)), Some(t0 + 200 * MS));
        assert!(due(&f, &ips, t0 + 199 * MS).is_empty());
        assert_eq!(due(&f, &ips, t0 + 200 * MS), vec![ip("10.0.0.1")]);
        // The relay's acks alone keep it (the standby hears the holder through it).
        f.acked(&ack("r", 2), t0 + 150 * MS);
        assert!(due(&f, &ips, t0 + 300 * MS).is_empty());
        // Silent: the standby is probed; it answers (its kernel is there): kept, asked
        // again an interval later, not before.
        let at = t0 + 350 * MS;
        assert_eq!(due(&f, &ips, at), vec![ip("10.0.0.1")]);
        f.probing(PEERS);
        assert!(due(&f, &ips, at).is_empty(), "one probe at a time");
        assert_eq!(f.next_due(pairs(&f, &ips)), None);
        assert!(!f.probed(PEERS, true, at + 45 * MS));
        assert_eq!(f.next_due(pairs(&f, &ips)), Some(at + 145 * MS));
        assert!(due(&f, &ips, at + 144 * MS).is_empty());
        // Not answered: stepped down, unless an ack came during the probe.
        f.probing(PEERS);
        f.acked(&ack("s", 2), at + 160 * MS);
        assert!(!f.probed(PEERS, false, at + 190 * MS), "acked meanwhile");
        f.probing(PEERS);
        assert!(f.probed(PEERS, false, at + 400 * MS));
        f.step_down(ip("10.0.0.1"), PEERS, at + 400 * MS);
        assert!(f.is_stepped_down(ip("10.0.0.1")));
        assert!(due(&f, &ips, at + 900 * MS).is_empty(), "stepped down once");
        assert_eq!(f.next_due(pairs(&f, &ips)), None);
    }

    #[test]
    fn an_ack_of_the_standby_or_the_relay_lifts_a_step_down_and_replays_do_not() {
        let t0 = Instant::now();
        let mut f = named(StepDowns::new(100 * MS));
        f.acked(&ack("s", 10), t0);
        f.acked(&ack("r", 10), t0);
        f.step_down(ip("10.0.0.1"), PEERS, t0 + 300 * MS);
        f.step_down(
            ip("10.0.0.2"),
            Peers {
                standby: "x",
                relay: None,
            },
            t0 + 300 * MS,
        );
        assert_eq!(f.acked(&ack("s", 10), t0 + 400 * MS), Acked::Stale);
        assert_eq!(f.acked(&ack("r", 9), t0 + 400 * MS), Acked::Stale);
        assert!(f.is_stepped_down(ip("10.0.0.1")));
        assert_eq!(
            f.acked(&ack("r", 11), t0 + 500 * MS),
            Acked::Accepted {
                lifted: vec![ip("10.0.0.1")]
            }
        );
        assert!(!f.is_stepped_down(ip("10.0.0.1")));
        assert!(f.is_stepped_down(ip("10.0.0.2")), "another standby's IP");
    }

    #[test]
    fn without_evidence_that_the_standby_took_it_the_ip_is_taken_back_and_disarmed() {
        let t0 = Instant::now();
        let mut f = named(StepDowns::new(100 * MS));
        let ips = held(&["10.0.0.1", "10.0.0.2"]);
        f.acked(&ack("s", 1), t0);
        for (i, p) in &ips {
            f.step_down(*i, *p, t0 + 250 * MS);
        }
        // The standby's Lease shows it holds 10.0.0.1: that one stays stepped down.
        let asked = [ip("10.0.0.1"), ip("10.0.0.2")];
        assert_eq!(
            f.retake("s", &asked, &[ip("10.0.0.1")]),
            vec![ip("10.0.0.2")]
        );
        assert!(f.is_stepped_down(ip("10.0.0.1")));
        // Disarmed: not stepped down again on the same silence.
        assert!(due(&f, &ips, t0 + 5_000 * MS).is_empty());
        // A new ack arms it again (and lifts the other).
        assert_eq!(
            f.acked(&ack("s", 2), t0 + 6_000 * MS),
            Acked::Accepted {
                lifted: vec![ip("10.0.0.1")]
            }
        );
        assert_eq!(f.next_due(pairs(&f, &ips)), Some(t0 + 6_200 * MS));
        // An answer for IPs no longer stepped down changes nothing.
        assert!(f.retake("s", &asked, &[]).is_empty());
    }

    #[test]
    fn a_changed_assignment_ends_a_step_down() {
        let t0 = Instant::now();
        let mut f = named(StepDowns::new(100 * MS));
        f.acked(&ack("s", 1), t0);
        f.step_down(ip("10.0.0.1"), PEERS, t0 + 250 * MS);
        f.step_down(ip("10.0.0.2"), PEERS, t0 + 250 * MS);
        f.step_down(ip("10.0.0.3"), PEERS, t0 + 250 * MS);
        let ended = f.settle(|i| match i.to_string().as_str() {
            "10.0.0.1" => Some(PEERS),
            "10.0.0.2" => Some(Peers {
                standby: "t",
                relay: None,
            }),
            _ => None,
        });
        assert_eq!(ended, vec![ip("10.0.0.2"), ip("10.0.0.3")]);
        assert_eq!(f.stepped_for(ip("10.0.0.1"), t0 + 300 * MS), Some(50 * MS));
    }

    #[test]
    fn acks_count_only_from_the_named_standbys_and_relays_and_a_new_key_restarts_the_counter() {
        use aliaslb_core::advert::SigningKey;
        let t0 = Instant::now();
        let mut f = named(StepDowns::new(100 * MS));
        for n in 0..1_000 {
            let from = format!("made-up-{n}");
            assert_eq!(f.acked(&ack(&from, 1), t0), Acked::Unnamed);
        }
        assert_eq!(f.acks.len(), 2, "only s and r are kept");
        f.acked(&ack("s", 500), t0);
        // s's agent restarted with a new key: its counter starts at 1 again.
        let key = SigningKey::generate().unwrap().public_key();
        f.name_peers([("s".to_owned(), Some(key))]);
        assert_eq!(f.acks.len(), 1, "r is no longer named: forgotten");
        assert_eq!(
            f.acked(&ack("s", 1), t0 + 100 * MS),
            Acked::Accepted { lifted: vec![] }
        );
        assert_eq!(f.acked(&ack("r", 7), t0 + 100 * MS), Acked::Unnamed);
    }
}
