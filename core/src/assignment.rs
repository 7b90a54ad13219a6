//! What one node must carry: the trusted assignment the controller writes for each node's
//! agent, and the only thing an agent acts on.
//!
//! A Service's annotations can be written by anyone with `edit` on Services in its
//! namespace, so they cannot say where an IP goes. The controller writes, for every node,
//! ConfigMaps in its own namespace, labelled [`crate::keys::LABEL_ASSIGNMENTS`]: an index
//! ([`crate::keys::assignment_configmap`]) and shards, laid out as [`shards`] says; agents
//! can read the controller's namespace but not write it, and tenants have no right there at
//! all. A shard's data key [`crate::keys::ASSIGNMENTS_KEY`] holds one line per IP (so did
//! the single object per node of earlier releases):
//!
//! ```text
//! 192.168.55.10 eth1 tcp:80,udp:53 default/web
//! 2001:db8::10 - - default/dns probe
//! 10.200.0.7 - tcp:443 shop/front bgp
//! ```
//!
//! IP, interface (`-`: the agent chooses), the Service ports open on the IP for the
//! host-port shield (`-`: none), the Services it is for (comma separated, for people
//! reading the object), and an optional last word `probe`: a first claim (no node of the
//! cluster held the IP when it was placed here), which the agent probes on the LAN (RFC
//! 5227 / RFC 4862) before taking it. A takeover from a known holder has no `probe`: it
//! must not wait. The flag `bgp` marks an address of an L3 pool (`announce: bgp`): the
//! agent puts it on its local device (`aliaslb0`, else `lo`) for the node's routing daemon
//! to announce, sends no gratuitous ARP / NA and does not watch the LAN for it; the interface
//! field is then `-`. Fast L2 failover adds two flags: `peer=NODE@ADDRESS` on the holder's
//! line names the node standing by for the IP and the address the holder's liveness
//! adverts go to; the standby's own assignment lists the IP with `standby=NODE` (its
//! holder): not to hold, to take over when that holder's adverts stop. `relay=NODE@ADDRESS`
//! on the holder's line names a third node on the LAN that forwards the adverts to the
//! standby (a standby cut off from the holder alone keeps hearing it). A pool with
//! `virtualMAC: true` adds `vmac=MAC` to the holder's and the standby's lines: the IP is
//! answered from that MAC ([`crate::mac::virtual_mac`]), on a macvlan of the interface, so
//! the MAC moves with the IP. Flags follow the
//! services, in any order, each at most once; an agent older than a flag refuses the whole
//! object and keeps what it has, never misreads it.
//!
//! The index's key [`crate::keys::PEERS_KEY`] lists the node's **LAN peers**, the nodes
//! it exchanges fast-failover adverts and acks with (the standbys and relays of the IPs it
//! holds, the holders of the IPs it stands by for or relays), one line each:
//!
//! ```text
//! alb-node-2 5d41402abc4b2a76b9719d911017c592aa96fe1b4c7d2f9e1a4a1b2c3d4e5f60 02:42:ac:11:00:02
//! alb-node-3 - 02:42:ac:11:00:03,0a:58:0a:f4:00:01 relay=alb-node-2@192.168.55.102
//! ```
//!
//! node, the public key its agent signs with (`-`: none reported, an agent older than
//! per-node keys), its MACs (`-`: none), and `relay=STANDBY@ADDRESS,...` on a holder's line
//! in its relay's index: the standbys this node forwards that holder's adverts to. A node
//! believes an advert or ack only from a peer listed here, signed with the key listed here;
//! it tells another node claiming an IP (a handover) from a foreign host (a conflict) by
//! the peers' MACs. A node's key or MACs changing rewrites its peers' indexes only. (The
//! index of earlier releases listed every node's MACs under [`crate::keys::NODE_MACS_KEY`],
//! one `MAC NODE` line each; still read.) A line format rather than JSON: ~45 bytes an IP,
//! so a shard of 512 lines is ~25 KB.
//!
//! The index's key [`crate::keys::HANDOVERS_KEY`] lists the node's **handovers**, the IPs
//! of a planned move still in its drain window (docs/how-it-works.md, "Planned moves keep established
//! connections"), one line each:
//!
//! ```text
//! 192.168.55.10 tcp:80,tcp:443 forward=alb-node-1@192.168.55.101
//! 192.168.55.11 tcp:5432 draining
//! ```
//!
//! IP, the Service TCP ports on it (`-`: none), then what this node does for it:
//! `forward=NODE@ADDRESS`, the packets of TCP flows this node does not know, sent to one
//! of those ports, go to that node (the one the IP came from), whose conntrack still
//! carries them; `draining`, this node carried the IP and left it in a planned move: its
//! established flows are being served through the new holder until the window ends (the
//! agent counts those still open then). A node can be both (a move within the window of
//! an earlier one). An agent older than handovers does not read the key: it neither
//! forwards nor counts, and misreads nothing. At most [`MAX_HANDOVERS`] lines. Pure:
//! render and parse only.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::{self, Write as _};
use std::net::IpAddr;

use crate::advert::PublicKey;
use crate::mac::{Mac, MacError};

pub mod shards;

/// A transport protocol a Service port can use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Protocol {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
    /// SCTP.
    Sctp,
}

impl Protocol {
    /// Reads a Service port's `protocol` (`TCP` when empty, as the API defaults it).
    pub fn from_service(protocol: Option<&str>) -> Option<Self> {
        match protocol.unwrap_or("TCP") {
            "TCP" => Some(Protocol::Tcp),
            "UDP" => Some(Protocol::Udp),
            "SCTP" => Some(Protocol::Sctp),
            _ => None,
        }
    }

    /// The lower-case name, as nftables and the assignment lines write it.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Sctp => "sctp",
        }
    }

    /// Reads a lower-case name.
    pub fn from_lower(s: &str) -> Option<Self> {
        match s {
            "tcp" => Some(Protocol::Tcp),
            "udp" => Some(Protocol::Udp),
            "sctp" => Some(Protocol::Sctp),
            _ => None,
        }
    }
}

/// One port a Service opens on its LB IP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OpenPort {
    /// The protocol.
    pub protocol: Protocol,
    /// The port number.
    pub port: u16,
}

impl fmt::Display for OpenPort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.protocol.as_str(), self.port)
    }
}

/// One IP a node must carry.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AssignedIp {
    /// The interface the pool asks for; `None`: the agent chooses.
    pub interface: Option<String>,
    /// The ports its Services open on it.
    pub ports: BTreeSet<OpenPort>,
    /// The Services it is for (`namespace/name`).
    pub services: BTreeSet<String>,
    /// A first claim: probe the LAN before taking it.
    pub probe: bool,
    /// An address of an L3 pool: on the local device, announced by the routing daemon.
    pub bgp: bool,
    /// On the holder's line: the node that stands by for the IP, and the address the
    /// holder sends its liveness adverts to (flag `peer=NODE@ADDRESS`).
    pub peer: Option<Peer>,
    /// On the holder's line: a third node on the IP's LAN that relays the adverts to the
    /// standby (flag `relay=NODE@ADDRESS`), so a standby cut off from the holder alone
    /// still hears it and takes nothing over.
    pub relay: Option<Peer>,
    /// A standby line (flag `standby=NODE`): this node does not hold the IP; it takes it
    /// over when the adverts of `NODE`, its holder, stop (fast L2 failover).
    pub standby_for: Option<String>,
    /// The IP's virtual MAC (flag `vmac=MAC`, pools with `virtualMAC: true`): the agent
    /// puts the IP on a macvlan with this MAC instead of on the interface itself.
    pub vmac: Option<Mac>,
}

impl AssignedIp {
    /// Whether the line asks the node to hold the IP (every line but a standby's).
    pub fn held(&self) -> bool {
        self.standby_for.is_none()
    }
}

/// The standby of an IP, as its holder's line names it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Peer {
    /// The standby node.
    pub node: String,
    /// Its address on the IP's subnet: where the holder's adverts go.
    pub address: IpAddr,
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.node, self.address)
    }
}

/// Whether `name` can be a Kubernetes node name (a DNS subdomain: at most 253 lower-case
/// alphanumerics, `-` and `.`, starting and ending alphanumeric).
pub fn valid_node_name(name: &str) -> bool {
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    name.len() <= 253
        && edge(name.chars().next())
        && edge(name.chars().last())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
}

/// Everything one node must carry.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeAssignments {
    /// The IPs, in address order.
    pub ips: BTreeMap<IpAddr, AssignedIp>,
    /// The MACs of every node's interfaces, with the node's name (an index of earlier
    /// releases; read, not written).
    pub node_macs: BTreeMap<Mac, String>,
    /// The node's LAN peers, by name.
    pub peers: BTreeMap<String, PeerNode>,
    /// The IPs of a planned move in its drain window and what this node does for them.
    pub handovers: BTreeMap<IpAddr, Handover>,
}

/// A node this node exchanges fast-failover adverts or acks with, as its index lists it
/// under [`crate::keys::PEERS_KEY`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerNode {
    /// The key its agent signs with; `None`: its agent reported none (older than
    /// per-node keys, or adverts off), so nothing it sends is believed.
    pub key: Option<PublicKey>,
    /// Its MACs, as its agent reports them.
    pub macs: BTreeSet<Mac>,
    /// On a holder's line in its relay's index: the standbys this node forwards that
    /// holder's adverts to, at these addresses.
    pub relay_to: BTreeSet<Peer>,
}

/// The most handover lines one node's index lists (~50 bytes each: about 200 KB): a planned
/// move of more IPs onto one node within one window keeps the established connections of
/// this many of them (the controller keeps the latest moves).
pub const MAX_HANDOVERS: usize = 4096;

/// What a node does for an IP during the drain window of a planned move (see the module
/// docs: the index's `handovers`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Handover {
    /// The Service TCP ports on the IP: the flows handed over.
    pub ports: BTreeSet<u16>,
    /// Forward the packets of TCP flows unknown here to this node, at this address: the
    /// node the IP came from.
    pub forward: Option<Peer>,
    /// This node left the IP in a planned move: its established flows are served through
    /// the new holder until the window ends.
    pub draining: bool,
}

/// The non-blank lines of the value under `key`, each trimmed, with the maker of its
/// error (its number, the key).
fn keyed_lines<'a>(
    text: &'a str,
    key: &'static str,
) -> impl Iterator<Item = (&'a str, impl Fn(String) -> AssignmentError + 'a)> {
    text.lines().enumerate().filter_map(move |(n, raw)| {
        let line = raw.trim();
        (!line.is_empty()).then_some((line, move |message: String| AssignmentError {
            line: n + 1,
            message: format!("{key}: {message}"),
            text: line.chars().take(200).collect(),
        }))
    })
}

/// A line of an assignment that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("assignment line {line}: {message} (`{text}`)")]
pub struct AssignmentError {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong.
    pub message: String,
    /// The line.
    pub text: String,
}

impl NodeAssignments {
    /// The IPs the node is asked to hold (every line but a standby's), in address order.
    pub fn held_ips(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.ips
            .iter()
            .filter(|(_, line)| line.held())
            .map(|(ip, _)| *ip)
    }

    /// Nothing assigned.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `ip` for `service` with `ports`. Services sharing an IP come from one pool and
    /// name the same interface; the first one named stays.
    pub fn assign(
        &mut self,
        ip: IpAddr,
        interface: Option<&str>,
        ports: impl IntoIterator<Item = OpenPort>,
        service: &str,
    ) {
        let entry = self.ips.entry(ip).or_default();
        if entry.interface.is_none() {
            entry.interface = interface.map(str::to_owned);
        }
        entry.ports.extend(ports);
        entry.services.insert(service.to_owned());
    }

    /// Whether nothing is assigned.
    pub fn is_empty(&self) -> bool {
        self.ips.is_empty()
    }

    /// The ConfigMap value: one line per IP, in address order.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for (ip, a) in &self.ips {
            render_line(&mut out, *ip, a);
        }
        out
    }

    /// The [`crate::keys::NODE_MACS_KEY`] value: one `MAC NODE` line per MAC, in order.
    pub fn render_node_macs(&self) -> String {
        let mut out = String::new();
        for (mac, node) in &self.node_macs {
            let _ = writeln!(out, "{mac} {node}");
        }
        out
    }

    /// The [`crate::keys::PEERS_KEY`] value: one line per peer, by name.
    pub fn render_peers(&self) -> String {
        let mut out = String::new();
        for (node, peer) in &self.peers {
            let _ = write!(out, "{node} ");
            match &peer.key {
                Some(key) => {
                    let _ = write!(out, "{key} ");
                }
                None => out.push_str("- "),
            }
            if peer.macs.is_empty() {
                out.push('-');
            }
            for (i, mac) in peer.macs.iter().enumerate() {
                let _ = write!(out, "{}{mac}", if i == 0 { "" } else { "," });
            }
            for (i, to) in peer.relay_to.iter().enumerate() {
                let _ = write!(out, "{}{to}", if i == 0 { " relay=" } else { "," });
            }
            out.push('\n');
        }
        out
    }

    /// Reads the [`crate::keys::PEERS_KEY`] value into [`Self::peers`].
    pub fn parse_peers(&mut self, text: &str) -> Result<(), AssignmentError> {
        for (line, err) in keyed_lines(text, crate::keys::PEERS_KEY) {
            let fields: Vec<&str> = line.split_ascii_whitespace().collect();
            let (node, key, macs, relay) = match fields[..] {
                [node, key, macs] => (node, key, macs, None),
                [node, key, macs, relay] => (node, key, macs, Some(relay)),
                _ => {
                    return Err(err(format!(
                        "expected 3 fields (node key macs) and an optional                          `relay=NODE@ADDRESS,...`, found {}",
                        fields.len()
                    )));
                }
            };
            if !valid_node_name(node) {
                return Err(err(format!("not a node name: {node}")));
            }
            let mut peer = PeerNode::default();
            if key != "-" {
                peer.key = Some(
                    key.parse()
                        .map_err(|e: crate::advert::KeyParseError| err(e.to_string()))?,
                );
            }
            if macs != "-" {
                for mac in macs.split(',') {
                    peer.macs
                        .insert(mac.parse().map_err(|e: MacError| err(e.to_string()))?);
                }
            }
            if let Some(relay) = relay {
                let list = relay
                    .strip_prefix("relay=")
                    .ok_or_else(|| err(format!("unknown flag `{relay}`: the flag is `relay=`")))?;
                for to in list.split(',') {
                    peer.relay_to
                        .insert(parse_peer(to).map_err(|m| err(format!("relay={to}: {m}")))?);
                }
            }
            if self.peers.insert(node.to_owned(), peer).is_some() {
                return Err(err(format!("{node} is listed twice")));
            }
        }
        Ok(())
    }

    /// The [`crate::keys::HANDOVERS_KEY`] value: one line per IP, in address order.
    pub fn render_handovers(&self) -> String {
        let mut out = String::new();
        for (ip, h) in &self.handovers {
            let _ = write!(out, "{ip} ");
            if h.ports.is_empty() {
                out.push('-');
            }
            for (i, port) in h.ports.iter().enumerate() {
                let _ = write!(out, "{}tcp:{port}", if i == 0 { "" } else { "," });
            }
            if h.draining {
                out.push_str(" draining");
            }
            if let Some(to) = &h.forward {
                let _ = write!(out, " forward={to}");
            }
            out.push('\n');
        }
        out
    }

    /// Reads the [`crate::keys::HANDOVERS_KEY`] value into [`Self::handovers`].
    pub fn parse_handovers(&mut self, text: &str) -> Result<(), AssignmentError> {
        let mut handovers = BTreeMap::new();
        for (line, err) in keyed_lines(text, crate::keys::HANDOVERS_KEY) {
            let fields: Vec<&str> = line.split_ascii_whitespace().collect();
            let [ip, ports, ref roles @ ..] = fields[..] else {
                return Err(err(
                    "expected an IP, its TCP ports and `draining` and/or `forward=NODE@ADDRESS`"
                        .to_owned(),
                ));
            };
            let ip: IpAddr = ip
                .parse()
                .map_err(|_| err(format!("not an IP address: {ip}")))?;
            let mut handover = Handover::default();
            if ports != "-" {
                for p in ports.split(',') {
                    let port = parse_port(p)
                        .filter(|p| p.protocol == Protocol::Tcp)
                        .ok_or_else(|| err(format!("not a TCP port (`tcp:80`): {p}")))?;
                    handover.ports.insert(port.port);
                }
            }
            for role in roles {
                let seen = match role.split_once('=') {
                    None if *role == "draining" => std::mem::replace(&mut handover.draining, true),
                    Some(("forward", to)) => handover
                        .forward
                        .replace(parse_peer(to).map_err(|m| err(format!("{role}: {m}")))?)
                        .is_some(),
                    _ => {
                        return Err(err(format!(
                            "unknown word `{role}`: the words are `draining` and \
                             `forward=NODE@ADDRESS`"
                        )));
                    }
                };
                if seen {
                    return Err(err(format!("`{role}` given twice")));
                }
            }
            if !handover.draining && handover.forward.is_none() {
                return Err(err(
                    "neither `draining` nor `forward=NODE@ADDRESS`: nothing to do".to_owned(),
                ));
            }
            if handover
                .forward
                .as_ref()
                .is_some_and(|to| to.address.is_ipv4() != ip.is_ipv4())
            {
                return Err(err(format!(
                    "the forward address is not of the family of {ip}"
                )));
            }
            if handovers.insert(ip, handover).is_some() {
                return Err(err(format!("{ip} is listed twice")));
            }
            if handovers.len() > MAX_HANDOVERS {
                return Err(err(format!("more than {MAX_HANDOVERS} lines")));
            }
        }
        self.handovers = handovers;
        Ok(())
    }

    /// Reads the [`crate::keys::NODE_MACS_KEY`] value into [`Self::node_macs`].
    pub fn parse_node_macs(&mut self, text: &str) -> Result<(), AssignmentError> {
        for (line, err) in keyed_lines(text, crate::keys::NODE_MACS_KEY) {
            let fields: Vec<&str> = line.split_ascii_whitespace().collect();
            let [mac, node] = fields[..] else {
                return Err(err(format!(
                    "expected 2 fields (mac node), found {}",
                    fields.len()
                )));
            };
            let mac: Mac = mac.parse().map_err(|e: MacError| err(e.to_string()))?;
            self.node_macs.insert(mac, node.to_owned());
        }
        Ok(())
    }

    /// Reads a ConfigMap value. Blank lines are skipped; a malformed line is an error (the
    /// agent then keeps what it has: the writer is the controller, so this is a bug or an
    /// edit by hand, never an instruction).
    pub fn parse(text: &str) -> Result<Self, AssignmentError> {
        let mut out = NodeAssignments::new();
        for (n, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() {
                continue;
            }
            let err = |message: String| AssignmentError {
                line: n + 1,
                message,
                text: line.chars().take(200).collect(),
            };
            let fields: Vec<&str> = line.split_ascii_whitespace().collect();
            let [ip, interface, ports, services, ref flags @ ..] = fields[..] else {
                return Err(err(format!(
                    "expected 4 fields (ip interface ports services) and optional flags \
                     (`probe`, `bgp`, `peer=NODE@ADDRESS`, `standby=NODE`, `vmac=MAC`), found {}",
                    fields.len()
                )));
            };
            let (mut probe, mut bgp) = (false, false);
            let (mut peer, mut standby_for, mut relay, mut vmac) = (None, None, None, None);
            for flag in flags {
                let seen = match flag.split_once('=') {
                    None if *flag == "probe" => std::mem::replace(&mut probe, true),
                    None if *flag == "bgp" => std::mem::replace(&mut bgp, true),
                    Some(("peer", value)) => peer
                        .replace(parse_peer(value).map_err(|m| err(format!("{flag}: {m}")))?)
                        .is_some(),
                    Some(("relay", value)) => relay
                        .replace(parse_peer(value).map_err(|m| err(format!("{flag}: {m}")))?)
                        .is_some(),
                    Some(("standby", node)) if valid_node_name(node) => {
                        standby_for.replace(node.to_owned()).is_some()
                    }
                    Some(("standby", node)) => {
                        return Err(err(format!("{flag}: not a node name: {node}")));
                    }
                    Some(("vmac", value)) => vmac
                        .replace(
                            value
                                .parse::<Mac>()
                                .ok()
                                .filter(|m| m.0[0] & 0b11 == 0b10)
                                .ok_or_else(|| {
                                    err(format!(
                                        "{flag}: not a locally administered unicast MAC \
                                         (`02:00:c0:a8:37:0a`)"
                                    ))
                                })?,
                        )
                        .is_some(),
                    _ => {
                        return Err(err(format!(
                            "unknown flag `{flag}`: the flags are `probe`, `bgp`, \
                             `peer=NODE@ADDRESS`, `relay=NODE@ADDRESS`, `standby=NODE` and \
                             `vmac=MAC`"
                        )));
                    }
                };
                if seen {
                    return Err(err(format!("flag `{flag}` given twice")));
                }
            }
            let roles = [probe, bgp, peer.is_some(), standby_for.is_some()];
            let exclusive = [(1, 2), (1, 3), (0, 3), (2, 3)];
            if exclusive.iter().any(|&(a, b)| roles[a] && roles[b])
                || (relay.is_some() && peer.is_none())
                || (bgp && vmac.is_some())
            {
                return Err(err(
                    "flags that do not go together: a `bgp` line has no `peer`, `standby` or \
                     `vmac`, a `standby` line is neither probed nor has a `peer`, and a `relay` \
                     needs a `peer`"
                        .to_owned(),
                ));
            }
            let ip: IpAddr = ip
                .parse()
                .map_err(|_| err(format!("not an IP address: {ip}")))?;
            let interface = match interface {
                "-" => None,
                name if valid_interface(name) => Some(name.to_owned()),
                name => return Err(err(format!("not an interface name: {name}"))),
            };
            if bgp && interface.is_some() {
                return Err(err(
                    "a `bgp` address goes on the agent's own device: its interface must be `-`"
                        .to_owned(),
                ));
            }
            let mut assigned = AssignedIp {
                interface,
                probe,
                bgp,
                peer,
                standby_for,
                relay,
                vmac,
                ..AssignedIp::default()
            };
            if ports != "-" {
                for p in ports.split(',') {
                    assigned.ports.insert(parse_port(p).ok_or_else(|| {
                        err(format!("not a port (`tcp:80`, `udp:53`, `sctp:9`): {p}"))
                    })?);
                }
            }
            if services != "-" {
                assigned
                    .services
                    .extend(services.split(',').map(str::to_owned));
            }
            if out.ips.insert(ip, assigned).is_some() {
                return Err(err(format!("{ip} is listed twice")));
            }
        }
        Ok(out)
    }
}

/// Appends the line of `ip` to `out`.
pub(crate) fn render_line(out: &mut String, ip: IpAddr, a: &AssignedIp) {
    let _ = write!(out, "{ip} {} ", a.interface.as_deref().unwrap_or("-"));
    if a.ports.is_empty() {
        out.push('-');
    }
    for (i, port) in a.ports.iter().enumerate() {
        let _ = write!(out, "{}{port}", if i == 0 { "" } else { "," });
    }
    out.push(' ');
    if a.services.is_empty() {
        out.push('-');
    }
    for (i, service) in a.services.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(service);
    }
    if a.probe {
        out.push_str(" probe");
    }
    if a.bgp {
        out.push_str(" bgp");
    }
    if let Some(peer) = &a.peer {
        let _ = write!(out, " peer={peer}");
    }
    if let Some(relay) = &a.relay {
        let _ = write!(out, " relay={relay}");
    }
    if let Some(holder) = &a.standby_for {
        let _ = write!(out, " standby={holder}");
    }
    if let Some(mac) = &a.vmac {
        let _ = write!(out, " vmac={mac}");
    }
    out.push('\n');
}

fn parse_peer(value: &str) -> Result<Peer, String> {
    let (node, address) = value
        .split_once('@')
        .ok_or_else(|| "expected NODE@ADDRESS".to_owned())?;
    if !valid_node_name(node) {
        return Err(format!("not a node name: {node}"));
    }
    let address = address
        .parse()
        .map_err(|_| format!("not an IP address: {address}"))?;
    Ok(Peer {
        node: node.to_owned(),
        address,
    })
}

/// Linux interface names, by the one rule the pool options and the agent reports use too
/// ([`crate::report::interface_name_error`]): a pool option the controller accepts is never
/// a line the agent refuses.
fn valid_interface(name: &str) -> bool {
    crate::report::interface_name_error(name).is_none()
}

fn parse_port(s: &str) -> Option<OpenPort> {
    let (protocol, port) = s.split_once(':')?;
    Some(OpenPort {
        protocol: Protocol::from_lower(protocol)?,
        port: port.parse().ok().filter(|p| *p != 0)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn port(protocol: Protocol, port: u16) -> OpenPort {
        OpenPort { protocol, port }
    }

    #[test]
    fn renders_one_line_per_ip_and_reads_it_back() {
        let mut a = NodeAssignments::new();
        a.assign(
            ip("192.168.55.10"),
            Some("eth1"),
            [port(Protocol::Udp, 53), port(Protocol::Tcp, 80)],
            "default/web",
        );
        a.assign(
            ip("192.168.55.10"),
            None,
            [port(Protocol::Tcp, 443)],
            "default/web-tls",
        );
        a.assign(ip("2001:db8::10"), None, [], "default/dns");
        a.ips.get_mut(&ip("2001:db8::10")).unwrap().probe = true;
        a.assign(
            ip("10.200.0.7"),
            None,
            [port(Protocol::Tcp, 443)],
            "shop/front",
        );
        a.ips.get_mut(&ip("10.200.0.7")).unwrap().bgp = true;
        let text = a.render();
        assert_eq!(
            text,
            "10.200.0.7 - tcp:443 shop/front bgp\n\
             192.168.55.10 eth1 tcp:80,tcp:443,udp:53 default/web,default/web-tls\n\
             2001:db8::10 - - default/dns probe\n"
        );
        assert_eq!(NodeAssignments::parse(&text).unwrap(), a);
        let both = NodeAssignments::parse("10.200.0.8 - - a/b bgp probe").unwrap();
        let line = &both.ips[&ip("10.200.0.8")];
        assert!(line.bgp && line.probe);
        a.node_macs.insert(
            Mac([0x82, 0x1e, 0x30, 0xb2, 0xc7, 0x74]),
            "alb-node-1".into(),
        );
        a.node_macs.insert(
            Mac([0x46, 0xb0, 0x48, 0xe8, 0x2d, 0x96]),
            "alb-node-2".into(),
        );
        let macs = a.render_node_macs();
        assert_eq!(
            macs,
            "46:b0:48:e8:2d:96 alb-node-2\n82:1e:30:b2:c7:74 alb-node-1\n"
        );
        let mut back = NodeAssignments::parse(&text).unwrap();
        back.parse_node_macs(&macs).unwrap();
        assert_eq!(back, a);
        let mut bad = NodeAssignments::new();
        let e = bad
            .parse_node_macs("46:b0:48:e8:2d:96 n1\n46:b0:48 n2")
            .unwrap_err();
        assert_eq!(e.line, 2, "{e}");
        assert!(e.to_string().contains("not a MAC address"), "{e}");
        let e = bad.parse_node_macs("46:b0:48:e8:2d:96").unwrap_err();
        assert!(e.to_string().contains("expected 2 fields"), "{e}");
        assert_eq!(NodeAssignments::parse("").unwrap(), NodeAssignments::new());
        assert_eq!(
            NodeAssignments::parse("\n  \n").unwrap(),
            NodeAssignments::new()
        );
    }

    #[test]
    fn holder_and_standby_lines_round_trip() {
        let text = "192.168.55.10 eth1 tcp:80 default/web probe peer=alb-node-2@192.168.55.3 \
                    relay=alb-node-3@192.168.55.4\n\
                    192.168.55.11 - - default/dns standby=alb-node-1\n\
                    2001:db8::10 - - default/v6 peer=n3@fd00::3\n";
        let a = NodeAssignments::parse(text).unwrap();
        let web = &a.ips[&ip("192.168.55.10")];
        assert!(web.held() && web.probe);
        assert_eq!(
            web.peer,
            Some(Peer {
                node: "alb-node-2".into(),
                address: ip("192.168.55.3")
            })
        );
        assert_eq!(web.relay.as_ref().unwrap().node, "alb-node-3");
        let dns = &a.ips[&ip("192.168.55.11")];
        assert!(!dns.held());
        assert_eq!(dns.standby_for.as_deref(), Some("alb-node-1"));
        assert_eq!(
            a.ips[&ip("2001:db8::10")].peer.as_ref().unwrap().address,
            ip("fd00::3")
        );
        assert_eq!(a.render(), text);
    }

    #[test]
    fn a_virtual_mac_rides_on_holder_and_standby_lines() {
        let text = "10.0.0.1 eth1 tcp:80 a/b peer=n2@10.0.0.2 vmac=02:00:0a:00:00:01\n\
                    10.0.0.9 - - a/c standby=n1 vmac=02:00:0a:00:00:09\n";
        let a = NodeAssignments::parse(text).unwrap();
        assert_eq!(a.ips[&ip("10.0.0.1")].vmac, Some(Mac([2, 0, 10, 0, 0, 1])));
        assert_eq!(a.ips[&ip("10.0.0.9")].vmac, Some(Mac([2, 0, 10, 0, 0, 9])));
        assert_eq!(a.render(), text);
    }

    #[test]
    fn node_names_are_dns_subdomains() {
        for good in ["n1", "alb-node-2", "node.example.com", "7"] {
            assert!(valid_node_name(good), "{good}");
        }
        let long = "a".repeat(254);
        for bad in ["", "-n", "n-", "N1", "n_1", "n@1", "n=1", long.as_str()] {
            assert!(!valid_node_name(bad), "{bad}");
        }
    }

    #[test]
    fn bad_lines_are_errors_with_their_number() {
        let table = [
            ("10.0.0.1 eth0 tcp:80", 1, "expected 4 fields"),
            ("10.0.0.1 eth0 tcp:80 a/b probe x", 1, "unknown flag `x`"),
            ("10.0.0.1 eth0 tcp:80 a/b prob", 1, "unknown flag `prob`"),
            ("10.0.0.1 - tcp:80 a/b bgp bgp", 1, "flag `bgp` given twice"),
            ("10.0.0.1 eth0 tcp:80 a/b bgp", 1, "interface must be `-`"),
            ("\n10.0.0.300 - - a/b", 2, "not an IP address"),
            ("10.0.0.1 eth0/x - a/b", 1, "not an interface name"),
            (
                "10.0.0.1 averyveryverylongname - a/b",
                1,
                "not an interface name",
            ),
            ("10.0.0.1 eth0:alb - a/b", 1, "not an interface name"),
            ("10.0.0.1 - tcp:0 a/b", 1, "not a port"),
            ("10.0.0.1 - quic:443 a/b", 1, "not a port"),
            ("10.0.0.1 - tcp:70000 a/b", 1, "not a port"),
            ("10.0.0.1 - - a/b\n10.0.0.1 - - c/d", 2, "listed twice"),
            ("10.0.0.1 - - a/b peer=n2", 1, "expected NODE@ADDRESS"),
            (
                "10.0.0.1 - - a/b peer=N2@10.0.0.2",
                1,
                "not a node name: N2",
            ),
            (
                "10.0.0.1 - - a/b peer=n2@10.0.0",
                1,
                "not an IP address: 10.0.0",
            ),
            ("10.0.0.1 - - a/b standby=-n1", 1, "not a node name: -n1"),
            ("10.0.0.1 - - a/b standby=n1 standby=n3", 1, "given twice"),
            ("10.0.0.1 - - a/b standby=n1 probe", 1, "do not go together"),
            (
                "10.0.0.1 - - a/b standby=n1 peer=n3@10.0.0.3",
                1,
                "do not go together",
            ),
            (
                "10.0.0.1 - - a/b bgp peer=n3@10.0.0.3",
                1,
                "do not go together",
            ),
            ("10.0.0.1 - - a/b bgp standby=n1", 1, "do not go together"),
            ("10.0.0.1 - - a/b holder=n1", 1, "unknown flag `holder=n1`"),
            (
                "10.0.0.1 - - a/b relay=n3@10.0.0.3",
                1,
                "a `relay` needs a `peer`",
            ),
            (
                "10.0.0.1 - - a/b peer=n2@10.0.0.2 relay=n3",
                1,
                "expected NODE@ADDRESS",
            ),
            (
                "10.0.0.1 - - a/b bgp vmac=02:00:0a:00:00:01",
                1,
                "do not go together",
            ),
            (
                "10.0.0.1 - - a/b vmac=00:11:22:33:44:55",
                1,
                "not a locally administered unicast MAC",
            ),
            (
                "10.0.0.1 - - a/b vmac=02:00:0a",
                1,
                "not a locally administered",
            ),
            (
                "10.0.0.1 - - a/b vmac=02:00:0a:00:00:01 vmac=02:00:0a:00:00:01",
                1,
                "given twice",
            ),
        ];
        for (text, line, want) in table {
            let e = NodeAssignments::parse(text).unwrap_err();
            assert_eq!(e.line, line, "{text:?}: {e}");
            assert!(e.to_string().contains(want), "{text:?}: {e}");
        }
    }

    #[test]
    fn handovers_render_and_read_back_and_bad_lines_say_why() {
        let mut a = NodeAssignments::new();
        a.handovers.insert(
            ip("192.168.55.10"),
            Handover {
                ports: [443, 80].into(),
                forward: Some(Peer {
                    node: "alb-node-1".into(),
                    address: ip("192.168.55.101"),
                }),
                draining: false,
            },
        );
        a.handovers.insert(
            ip("192.168.55.11"),
            Handover {
                ports: [5432].into(),
                forward: None,
                draining: true,
            },
        );
        a.handovers.insert(
            ip("fd55::10"),
            Handover {
                ports: BTreeSet::new(),
                forward: Some(Peer {
                    node: "alb-node-3".into(),
                    address: ip("fd55::103"),
                }),
                draining: true,
            },
        );
        let text = a.render_handovers();
        assert_eq!(
            text,
            "192.168.55.10 tcp:80,tcp:443 forward=alb-node-1@192.168.55.101\n\
             192.168.55.11 tcp:5432 draining\n\
             fd55::10 - draining forward=alb-node-3@fd55::103\n"
        );
        let mut back = NodeAssignments::new();
        back.parse_handovers(&text).unwrap();
        assert_eq!(back, a);
        // The words in any order.
        let mut swapped = NodeAssignments::new();
        swapped
            .parse_handovers("fd55::10 - forward=alb-node-3@fd55::103 draining")
            .unwrap();
        assert_eq!(
            swapped.handovers[&ip("fd55::10")],
            a.handovers[&ip("fd55::10")]
        );
        for (line, why) in [
            ("10.0.0.1", "expected an IP"),
            ("10.0.0.300 tcp:80 draining", "not an IP address"),
            ("10.0.0.1 udp:53 draining", "not a TCP port"),
            ("10.0.0.1 tcp:0 draining", "not a TCP port"),
            ("10.0.0.1 tcp:80", "nothing to do"),
            ("10.0.0.1 tcp:80 drain", "unknown word `drain`"),
            ("10.0.0.1 tcp:80 draining draining", "given twice"),
            ("10.0.0.1 tcp:80 forward=n1", "expected NODE@ADDRESS"),
            ("10.0.0.1 tcp:80 forward=n1@fd00::1", "not of the family"),
            (
                "10.0.0.1 tcp:80 draining\n10.0.0.1 tcp:80 draining",
                "listed twice",
            ),
        ] {
            let e = NodeAssignments::new().parse_handovers(line).unwrap_err();
            assert!(e.to_string().contains(why), "{line:?}: {e}");
            assert!(e.to_string().contains("handovers"), "{e}");
        }
        let many: String = (0..=MAX_HANDOVERS)
            .map(|i| format!("10.1.{}.{} - draining\n", i / 250, i % 250))
            .collect();
        let e = NodeAssignments::new().parse_handovers(&many).unwrap_err();
        assert!(e.to_string().contains("more than 4096"), "{e}");
    }

    #[test]
    fn protocols_read_like_the_api_defaults_them() {
        assert_eq!(Protocol::from_service(None), Some(Protocol::Tcp));
        assert_eq!(Protocol::from_service(Some("UDP")), Some(Protocol::Udp));
        assert_eq!(Protocol::from_service(Some("SCTP")), Some(Protocol::Sctp));
        assert_eq!(Protocol::from_service(Some("tcp")), None);
        for p in [Protocol::Tcp, Protocol::Udp, Protocol::Sctp] {
            assert_eq!(Protocol::from_lower(p.as_str()), Some(p));
        }
    }

    #[test]
    fn peers_render_and_read_back_and_bad_lines_say_why() {
        let key: PublicKey = "5d41402abc4b2a76b9719d911017c592aa96fe1b4c7d2f9e1a4a1b2c3d4e5f60"
            .parse()
            .unwrap();
        let mut a = NodeAssignments::new();
        a.peers.insert(
            "alb-node-2".into(),
            PeerNode {
                key: Some(key),
                macs: [Mac([2, 0x42, 0xac, 0x11, 0, 2])].into(),
                relay_to: BTreeSet::new(),
            },
        );
        a.peers.insert(
            "alb-node-3".into(),
            PeerNode {
                key: None,
                macs: [
                    Mac([2, 0x42, 0xac, 0x11, 0, 3]),
                    Mac([0x0a, 0x58, 0x0a, 0xf4, 0, 1]),
                ]
                .into(),
                relay_to: [
                    Peer {
                        node: "alb-node-2".into(),
                        address: ip("192.168.55.102"),
                    },
                    Peer {
                        node: "alb-node-4".into(),
                        address: ip("192.168.55.104"),
                    },
                ]
                .into(),
            },
        );
        a.peers.insert("alb-node-5".into(), PeerNode::default());
        let text = a.render_peers();
        assert_eq!(
            text,
            "alb-node-2 5d41402abc4b2a76b9719d911017c592aa96fe1b4c7d2f9e1a4a1b2c3d4e5f60 \
             02:42:ac:11:00:02\n\
             alb-node-3 - 02:42:ac:11:00:03,0a:58:0a:f4:00:01 \
             relay=alb-node-2@192.168.55.102,alb-node-4@192.168.55.104\n\
             alb-node-5 - -\n"
        );
        let mut back = NodeAssignments::new();
        back.parse_peers(&text).unwrap();
        assert_eq!(back, a);
        for (line, why) in [
            ("alb-node-2", "expected 3 fields"),
            ("Node_2 - -", "not a node name: Node_2"),
            ("n2 abc -", "not a public key"),
            ("n2 - 02:00", "02:00"),
            ("n2 - - peer=n3@10.0.0.1", "unknown flag `peer=n3@10.0.0.1`"),
            ("n2 - - relay=n3", "relay=n3: expected NODE@ADDRESS"),
            ("n2 - -\nn2 - -", "n2 is listed twice"),
        ] {
            let e = NodeAssignments::new().parse_peers(line).unwrap_err();
            assert!(e.to_string().contains(why), "{line:?}: {e}");
            assert!(e.to_string().contains("peers"), "{e}");
        }
    }
}
