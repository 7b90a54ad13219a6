//! The desired set: what this node's agent must carry, as read from its assignment objects
//! (written by the controller only): the IPs with their interfaces and Service ports, the
//! first claims, the routed (L3) addresses, the standby, peer and relay lines of fast
//! failover, the virtual MACs and the MACs of the cluster's nodes. Pure data; every feature
//! reads it, none writes it but [`crate::assignments`].

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;

use aliaslb_core::assignment::{Handover, OpenPort, Peer, PeerNode};
use aliaslb_core::mac::Mac;

/// The IPs this node should carry, each with the interface the assignment names, if any,
/// and the ports its Services open on it (for the host-port shield); which of them are
/// first claims, to probe on the LAN before taking them; and the MACs of the cluster's
/// nodes, to tell a handover from a foreign host.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DesiredSet {
    entries: BTreeMap<IpAddr, Option<String>>,
    ports: BTreeMap<IpAddr, BTreeSet<OpenPort>>,
    probe: BTreeSet<IpAddr>,
    routed: BTreeSet<IpAddr>,
    node_macs: BTreeMap<Mac, String>,
    /// Fast L2 failover: the IPs this node stands by for (not held), by IP.
    standby: BTreeMap<IpAddr, StandbyLine>,
    /// Fast L2 failover: the standby of each IP held, where the adverts go.
    peers: BTreeMap<IpAddr, Peer>,
    /// Fast L2 failover: the relay of each IP held (its address), where a copy goes.
    relays: BTreeMap<IpAddr, Peer>,
    /// Virtual-MAC pools: the MAC each of their IPs is answered from (on a macvlan).
    vmacs: BTreeMap<IpAddr, Mac>,
    /// Fast L2 failover: the nodes this node exchanges adverts and acks with, with their
    /// keys (the only senders it believes) and relay roles.
    peer_nodes: BTreeMap<String, PeerNode>,
    /// Planned moves keep established connections: this node's handover lines
    /// ([`crate::handover`]).
    handovers: BTreeMap<IpAddr, Handover>,
    /// The assignment object is missing: this is the last set read, kept
    /// ([`crate::assignments`]).
    object_missing: bool,
}

/// An IP this node stands by for: it takes it over when its holder's adverts stop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StandbyLine {
    /// The holder whose adverts keep it there.
    pub holder: String,
    /// The interface the assignment names for it.
    pub interface: Option<String>,
    /// The ports its Services open (for the shield once taken over).
    pub ports: BTreeSet<OpenPort>,
    /// Its virtual MAC, for a pool with `virtualMAC: true`.
    pub vmac: Option<Mac>,
}

impl DesiredSet {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `ip`, on `interface` if the assignment names one (a later insert wins).
    pub fn insert(&mut self, ip: IpAddr, interface: Option<String>) {
        self.entries.insert(ip, interface);
    }

    /// Number of IPs.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no IP is desired.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Whether `ip` is desired.
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.entries.contains_key(&ip)
    }

    /// The interface the assignment names for a desired `ip` (`None`: none named, or not
    /// desired).
    pub fn interface(&self, ip: IpAddr) -> Option<&str> {
        self.entries.get(&ip).and_then(|i| i.as_deref())
    }

    /// The IPs with their requested interface, in address order.
    pub fn iter(&self) -> impl Iterator<Item = (IpAddr, Option<&str>)> {
        self.entries.iter().map(|(ip, i)| (*ip, i.as_deref()))
    }

    /// Opens `ports` on `ip` (a Service assigned to `ip` exposes them).
    pub fn open(&mut self, ip: IpAddr, ports: impl IntoIterator<Item = OpenPort>) {
        let mut ports = ports.into_iter().peekable();
        // No entry for no port, so equal sets compare equal however they were built.
        if ports.peek().is_some() {
            self.ports.entry(ip).or_default().extend(ports);
        }
    }

    /// The ports open on `ip`.
    pub fn ports(&self, ip: IpAddr) -> impl Iterator<Item = OpenPort> + '_ {
        self.ports.get(&ip).into_iter().flatten().copied()
    }

    /// Marks `ip` a first claim: probe the LAN before taking it.
    pub fn mark_probe(&mut self, ip: IpAddr) {
        self.probe.insert(ip);
    }

    /// Whether `ip` is a first claim (probe before taking it); a takeover from a known
    /// holder is not.
    pub fn needs_probe(&self, ip: IpAddr) -> bool {
        self.probe.contains(&ip)
    }

    /// Marks `ip` an address of an L3 pool: it goes on the routed device (whatever the
    /// assignment or `--interface` says), is announced by the routing daemon, not over
    /// ARP / NDP, and is not watched on the LAN.
    pub fn mark_routed(&mut self, ip: IpAddr) {
        self.routed.insert(ip);
    }

    /// Whether `ip` is an address of an L3 pool ([`Self::mark_routed`]).
    pub fn is_routed(&self, ip: IpAddr) -> bool {
        self.routed.contains(&ip)
    }

    /// Records that `mac` is an interface of node `node`.
    pub fn add_node_mac(&mut self, mac: Mac, node: &str) {
        self.node_macs.insert(mac, node.to_owned());
    }

    /// The node `mac` belongs to, if it is one of the cluster's.
    pub fn node_of_mac(&self, mac: Mac) -> Option<&str> {
        self.node_macs.get(&mac).map(String::as_str)
    }

    /// Sets this node's handover lines (planned moves keep established connections).
    pub fn set_handovers(&mut self, handovers: BTreeMap<IpAddr, Handover>) {
        self.handovers = handovers;
    }

    /// This node's handover lines (see [`crate::handover`]).
    pub fn handovers(&self) -> &BTreeMap<IpAddr, Handover> {
        &self.handovers
    }

    /// Records `node` as a LAN peer: its key, MACs and what this node relays for it.
    pub fn add_peer(&mut self, node: String, peer: PeerNode) {
        self.peer_nodes.insert(node, peer);
    }

    /// The LAN peers, by name.
    pub fn peer_nodes(&self) -> &BTreeMap<String, PeerNode> {
        &self.peer_nodes
    }

    /// Adds `ip` as an IP this node stands by for (not held).
    pub fn add_standby(&mut self, ip: IpAddr, line: StandbyLine) {
        self.standby.insert(ip, line);
    }

    /// The standby line of `ip`, if this node stands by for it.
    pub fn standby(&self, ip: IpAddr) -> Option<&StandbyLine> {
        self.standby.get(&ip)
    }

    /// Every IP this node stands by for.
    pub fn standbys(&self) -> impl Iterator<Item = (IpAddr, &StandbyLine)> {
        self.standby.iter().map(|(ip, line)| (*ip, line))
    }

    /// Names the standby of a held `ip`.
    pub fn set_peer(&mut self, ip: IpAddr, peer: Peer) {
        self.peers.insert(ip, peer);
    }

    /// Names the relay of the adverts of a held `ip`.
    pub fn set_relay(&mut self, ip: IpAddr, relay: Peer) {
        self.relays.insert(ip, relay);
    }

    /// The relay's address of a held `ip`, if it has one.
    pub fn relay(&self, ip: IpAddr) -> Option<IpAddr> {
        self.relays.get(&ip).map(|r| r.address)
    }

    /// The relay node of a held `ip`, if it has one.
    pub fn relay_node(&self, ip: IpAddr) -> Option<&str> {
        self.relays.get(&ip).map(|r| r.node.as_str())
    }

    /// The standby of a held `ip`, if it has one.
    pub fn peer(&self, ip: IpAddr) -> Option<&Peer> {
        self.peers.get(&ip)
    }

    /// Answers a held `ip` from `mac`, on a macvlan (a pool with `virtualMAC: true`).
    pub fn set_vmac(&mut self, ip: IpAddr, mac: Mac) {
        self.vmacs.insert(ip, mac);
    }

    /// The virtual MAC of a held `ip`, if its pool has one.
    pub fn vmac(&self, ip: IpAddr) -> Option<Mac> {
        self.vmacs.get(&ip).copied()
    }

    /// `set` with the standby IPs `taken` held too (taken over on the LAN: no probe). The
    /// same allocation when that adds nothing (the usual case): a set of 10,000 IPs is
    /// megabytes, copied only to change it.
    pub fn with_taken_over(mut set: Arc<DesiredSet>, taken: &BTreeSet<IpAddr>) -> Arc<DesiredSet> {
        for ip in taken {
            if !set.entries.contains_key(ip)
                && let Some(line) = set.standby.get(ip).cloned()
            {
                let set = Arc::make_mut(&mut set);
                set.entries.insert(*ip, line.interface);
                set.open(*ip, line.ports);
                if let Some(mac) = line.vmac {
                    set.vmacs.insert(*ip, mac);
                }
            }
        }
        set
    }

    /// Marks this set as the one kept while the assignment object is missing.
    pub fn mark_object_missing(&mut self) {
        self.object_missing = true;
    }

    /// Whether this is the set kept while the assignment object is missing (not a set
    /// the controller wrote: it ends no LAN yield).
    pub fn object_missing(&self) -> bool {
        self.object_missing
    }

    /// This set with no IP left (the node MACs, the peers and the missing mark stay).
    pub fn without_ips(&self) -> DesiredSet {
        DesiredSet {
            node_macs: self.node_macs.clone(),
            peer_nodes: self.peer_nodes.clone(),
            object_missing: self.object_missing,
            ..DesiredSet::default()
        }
    }

    /// Whether any part of this set is about `ip` (as [`without`](Self::without) removes it).
    fn mentions(&self, ip: IpAddr) -> bool {
        self.entries.contains_key(&ip)
            || self.ports.contains_key(&ip)
            || self.probe.contains(&ip)
            || self.routed.contains(&ip)
            || self.peers.contains_key(&ip)
            || self.relays.contains_key(&ip)
            || self.vmacs.contains_key(&ip)
    }

    /// `set` without `ips` (the conflict guard holds them back from the reconcile). The same
    /// allocation when none of them is in it (the usual case).
    pub fn without(mut set: Arc<DesiredSet>, ips: &BTreeSet<IpAddr>) -> Arc<DesiredSet> {
        for ip in ips {
            if !set.mentions(*ip) {
                continue;
            }
            let set = Arc::make_mut(&mut set);
            set.entries.remove(ip);
            set.ports.remove(ip);
            set.probe.remove(ip);
            set.routed.remove(ip);
            set.peers.remove(ip);
            set.relays.remove(ip);
            set.vmacs.remove(ip);
        }
        set
    }
}

impl FromIterator<(IpAddr, Option<String>)> for DesiredSet {
    fn from_iter<T: IntoIterator<Item = (IpAddr, Option<String>)>>(iter: T) -> Self {
        DesiredSet {
            entries: iter.into_iter().collect(),
            ..DesiredSet::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn desired(ips: &[&str]) -> DesiredSet {
        ips.iter().map(|s| (ip(s), None)).collect()
    }

    #[test]
    fn without_drops_the_ips_with_their_ports_and_probe_marks_only() {
        let mut d = desired(&["10.0.0.1", "10.0.0.2"]);
        let port = crate::shield::OpenPort {
            protocol: crate::shield::Protocol::Tcp,
            port: 80,
        };
        d.open(ip("10.0.0.2"), [port]);
        d.mark_probe(ip("10.0.0.2"));
        d.add_node_mac(Mac([2, 0, 0, 0, 0, 9]), "n2");
        let d = Arc::new(d);
        let less = DesiredSet::without(d.clone(), &[ip("10.0.0.2")].into());
        let mut want = desired(&["10.0.0.1"]);
        want.add_node_mac(Mac([2, 0, 0, 0, 0, 9]), "n2");
        assert_eq!(*less, want);
        assert_eq!(d.len(), 2, "the shared set is left as it was");
        // Nothing to drop: the same allocation, not a copy.
        for none in [BTreeSet::new(), [ip("10.0.0.9")].into()] {
            let same = DesiredSet::without(d.clone(), &none);
            assert!(Arc::ptr_eq(&same, &d));
        }
    }

    #[test]
    fn a_takeover_adds_the_standby_line_and_nothing_else_is_copied() {
        let mut d = desired(&["10.0.0.1"]);
        let port = crate::shield::OpenPort {
            protocol: crate::shield::Protocol::Tcp,
            port: 443,
        };
        let line = StandbyLine {
            holder: "n2".into(),
            interface: Some("eth1".into()),
            ports: [port].into(),
            vmac: Some(Mac([2, 0, 0, 0, 0, 7])),
        };
        d.add_standby(ip("10.0.0.5"), line);
        let d = Arc::new(d);
        let taken = DesiredSet::with_taken_over(d.clone(), &[ip("10.0.0.5")].into());
        assert!(taken.contains(ip("10.0.0.5")) && taken.contains(ip("10.0.0.1")));
        assert_eq!(taken.interface(ip("10.0.0.5")), Some("eth1"));
        assert_eq!(taken.ports(ip("10.0.0.5")).collect::<Vec<_>>(), [port]);
        assert_eq!(taken.vmac(ip("10.0.0.5")), Some(Mac([2, 0, 0, 0, 0, 7])));
        assert!(
            !d.contains(ip("10.0.0.5")),
            "the shared set is left as it was"
        );
        // Nothing taken, or taken but not a standby of this set, or already held: no copy.
        for none in [
            BTreeSet::new(),
            [ip("10.0.0.9")].into(),
            [ip("10.0.0.1")].into(),
        ] {
            let same = DesiredSet::with_taken_over(d.clone(), &none);
            assert!(Arc::ptr_eq(&same, &d));
        }
    }
}
