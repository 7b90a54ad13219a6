//! Whom this node believes, and for what: the senders its assignment names, each with the
//! key the controller relayed from that node's own report. Pure: built from the desired
//! set, asked about every datagram's head before its signature is checked or any state is
//! kept, so a sender nobody named costs a look-up and a counter, never memory.
//!
//! - An **advert to this node** is believed from the holder of one of its standby lines.
//! - An **advert to another node** is forwarded (this node is the relay) only for a holder
//!   and standby the holder's line in this node's index names (`relay=STANDBY@ADDRESS`),
//!   to that address.
//! - An **ack to this node** is believed from the standby or the relay of one of its held
//!   lines.
//!
//! A peer whose agent reported no key (older than per-node keys) is believed in nothing.

use std::collections::HashMap;
use std::net::IpAddr;

use aliaslb_core::advert::{Head, Kind, PublicKey};

use crate::desired::DesiredSet;

/// What to do with a datagram, from its head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Verify it with this key and hand it to this node's failover.
    Deliver(PublicKey),
    /// Verify it with this key and forward it, unchanged, to this address (a relay).
    Forward(PublicKey, IpAddr),
    /// Drop it unverified; the reason, for the metrics.
    Drop(&'static str),
}

/// The senders this node believes, from its assignment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Trust {
    node: String,
    /// Holders of this node's standby lines: their adverts to this node.
    holders: HashMap<String, PublicKey>,
    /// Standbys and relays of this node's held lines: their acks to this node.
    ackers: HashMap<String, PublicKey>,
    /// Holders this node relays for: the key, and where each standby's copy goes.
    relayed: HashMap<String, (PublicKey, HashMap<String, IpAddr>)>,
}

impl Trust {
    /// Whom node `node` believes, by `desired` (the set in force).
    pub fn of(node: &str, desired: &DesiredSet) -> Self {
        let key = |n: &str| desired.peer_nodes().get(n).and_then(|p| p.key);
        let mut trust = Trust {
            node: node.to_owned(),
            ..Trust::default()
        };
        for (_, line) in desired.standbys() {
            if let Some(k) = key(&line.holder) {
                trust.holders.insert(line.holder.clone(), k);
            }
        }
        for (ip, _) in desired.iter() {
            let peers = desired.peer(ip).map(|p| p.node.as_str());
            for n in peers.into_iter().chain(desired.relay_node(ip)) {
                if let Some(k) = key(n) {
                    trust.ackers.insert(n.to_owned(), k);
                }
            }
        }
        for (holder, peer) in desired.peer_nodes() {
            let Some(k) = peer.key.filter(|_| !peer.relay_to.is_empty()) else {
                continue;
            };
            let to = peer
                .relay_to
                .iter()
                .map(|s| (s.node.clone(), s.address))
                .collect();
            trust.relayed.insert(holder.clone(), (k, to));
        }
        trust
    }

    /// What to do with a datagram whose head is `head`.
    pub fn judge(&self, head: &Head<'_>) -> Verdict {
        let for_me = head.to == self.node;
        match head.kind {
            Kind::Advert if for_me => match self.holders.get(head.from) {
                Some(key) => Verdict::Deliver(*key),
                None => Verdict::Drop("unknown_sender"),
            },
            Kind::Advert => match self.relayed.get(head.from) {
                Some((key, to)) => match to.get(head.to) {
                    Some(address) => Verdict::Forward(*key, *address),
                    None => Verdict::Drop("not_for_me"),
                },
                None if self.holders.contains_key(head.from) => Verdict::Drop("not_for_me"),
                None => Verdict::Drop("unknown_sender"),
            },
            Kind::Ack if for_me => match self.ackers.get(head.from) {
                Some(key) => Verdict::Deliver(*key),
                None => Verdict::Drop("unknown_sender"),
            },
            Kind::Ack => Verdict::Drop("not_for_me"),
        }
    }

    /// Whether `node` is believed in anything (its state may be kept).
    pub fn names(&self, node: &str) -> bool {
        self.holders.contains_key(node)
            || self.ackers.contains_key(node)
            || self.relayed.contains_key(node)
    }

    /// The key `node` is believed with, if any.
    pub fn key_of(&self, node: &str) -> Option<PublicKey> {
        self.holders
            .get(node)
            .or_else(|| self.ackers.get(node))
            .or_else(|| self.relayed.get(node).map(|(k, _)| k))
            .copied()
    }

    /// How many senders are named (the bound on the receiver's state).
    pub fn len(&self) -> usize {
        let mut names: Vec<&String> = self.holders.keys().collect();
        names.extend(self.ackers.keys());
        names.extend(self.relayed.keys());
        names.sort();
        names.dedup();
        names.len()
    }

    /// Whether nobody is named.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use aliaslb_core::advert::SigningKey;
    use aliaslb_core::assignment::{Peer, PeerNode};

    use super::*;
    use crate::desired::StandbyLine;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn key() -> PublicKey {
        SigningKey::generate().unwrap().public_key()
    }

    fn head<'a>(kind: Kind, from: &'a str, to: &'a str) -> Head<'a> {
        Head {
            kind,
            from,
            to,
            counter: 1,
        }
    }

    fn peer(key: Option<PublicKey>, relay_to: &[(&str, &str)]) -> PeerNode {
        PeerNode {
            key,
            macs: BTreeSet::new(),
            relay_to: relay_to
                .iter()
                .map(|(n, a)| Peer {
                    node: (*n).into(),
                    address: ip(a),
                })
                .collect(),
        }
    }

    /// n1 holds .10 (standby n2, relay n3), stands by for .20 (holder n4), relays n5's
    /// adverts to n6; n7 is a peer with no key.
    #[test]
    fn a_sender_is_believed_only_in_what_the_assignment_names_it_for() {
        let (k2, k3, k4, k5) = (key(), key(), key(), key());
        let mut d = DesiredSet::new();
        d.insert(ip("10.0.0.10"), None);
        d.set_peer(
            ip("10.0.0.10"),
            Peer {
                node: "n2".into(),
                address: ip("10.0.0.2"),
            },
        );
        d.set_relay(
            ip("10.0.0.10"),
            Peer {
                node: "n3".into(),
                address: ip("10.0.0.3"),
            },
        );
        d.add_standby(
            ip("10.0.0.20"),
            StandbyLine {
                holder: "n4".into(),
                interface: None,
                ports: BTreeSet::new(),
                vmac: None,
            },
        );
        d.add_peer("n2".into(), peer(Some(k2), &[]));
        d.add_peer("n3".into(), peer(Some(k3), &[]));
        d.add_peer("n4".into(), peer(Some(k4), &[]));
        d.add_peer("n5".into(), peer(Some(k5), &[("n6", "10.0.0.6")]));
        d.add_peer("n7".into(), peer(None, &[("n6", "10.0.0.6")]));
        let t = Trust::of("n1", &d);
        use Kind::{Ack, Advert};
        assert_eq!(t.judge(&head(Advert, "n4", "n1")), Verdict::Deliver(k4));
        assert_eq!(t.judge(&head(Ack, "n2", "n1")), Verdict::Deliver(k2));
        assert_eq!(t.judge(&head(Ack, "n3", "n1")), Verdict::Deliver(k3));
        assert_eq!(
            t.judge(&head(Advert, "n5", "n6")),
            Verdict::Forward(k5, ip("10.0.0.6"))
        );
        // Named, but not for that: a standby's advert, a holder's ack, a relay elsewhere.
        assert_eq!(
            t.judge(&head(Advert, "n2", "n1")),
            Verdict::Drop("unknown_sender")
        );
        assert_eq!(
            t.judge(&head(Ack, "n4", "n1")),
            Verdict::Drop("unknown_sender")
        );
        assert_eq!(
            t.judge(&head(Advert, "n5", "n9")),
            Verdict::Drop("not_for_me")
        );
        assert_eq!(
            t.judge(&head(Advert, "n4", "n9")),
            Verdict::Drop("not_for_me")
        );
        assert_eq!(t.judge(&head(Ack, "n2", "n9")), Verdict::Drop("not_for_me"));
        // Not named at all, or with no key.
        for from in ["n8", "n7", "made-up"] {
            assert_eq!(
                t.judge(&head(Advert, from, "n1")),
                Verdict::Drop("unknown_sender")
            );
            assert_eq!(
                t.judge(&head(Ack, from, "n1")),
                Verdict::Drop("unknown_sender")
            );
            assert!(!t.names(from));
        }
        assert_eq!(
            t.judge(&head(Advert, "n7", "n6")),
            Verdict::Drop("unknown_sender")
        );
        assert_eq!(t.len(), 4);
        assert_eq!(t.key_of("n5"), Some(k5));
        assert!(Trust::of("n1", &DesiredSet::new()).is_empty());
    }
}
