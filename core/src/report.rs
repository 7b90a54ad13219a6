//! What an agent tells the controller, through an annotation on its own Lease.
//!
//! Agents never write Services (a compromised node must not steer traffic); they report
//! here instead, and the controller reads it for node election (interfaces and subnets),
//! break-before-make moves (which IPs are held right now) and conflicts. The report is
//! JSON in the annotation [`crate::keys::ANNOTATION_AGENT_REPORT`]; unknown fields are
//! ignored so agents and controllers of neighbouring versions understand each other.
//!
//! # Bounded input
//!
//! A buggy or compromised node can write anything into its Lease, so [`AgentReport::from_json`]
//! reads a report only within bounds, in this order:
//!
//! 1. the annotation is at most [`MAX_REPORT_BYTES`] long, checked before parsing;
//! 2. it parses (unknown fields and unknown shield states are still accepted);
//! 3. [`AgentReport::validated`]: data no agent can produce, or more entries than any node
//!    has, is **rejected**, and the first violation is named in the [`ReportError`]:
//!    - at most [`MAX_INTERFACES`] interfaces, each with at most
//!      [`MAX_SUBNETS_PER_INTERFACE`] subnets, none wider than [`WIDEST_SUBNET_V4`] or
//!      [`WIDEST_SUBNET_V6`] (no LAN is: `0.0.0.0/1` would make its node the one candidate
//!      for half of every IPv4 pool);
//!    - interface names as Linux allows them (`dev_valid_name`): 1 to
//!      [`MAX_INTERFACE_NAME`] bytes (`IFNAMSIZ` - 1), not `.` or `..`, no `/` or `:`, no
//!      whitespace; and, stricter than the kernel, no control characters and no non-ASCII
//!      whitespace (no tool creates them, and they would garble a condition message);
//!    - at most [`MAX_HELD`] held IPs and [`MAX_CONFLICTS`] conflicts;
//! 4. free text (conflict reasons) is **cut** instead: control characters become spaces
//!    and a reason is cut to [`MAX_REASON`] bytes on a character boundary, ending in
//!    `...`. A long reason is odd, not impossible, and the rest of the report is still
//!    worth reading.
//!
//! Within those bounds a subnet still says only what the node claims. A subnet wider than
//! [`ANCHOR_FREE_V4`] (IPv4) or [`ANCHOR_FREE_V6`] (IPv6) counts for node election only where
//! it holds one of the addresses the node's own Node object lists ([`AgentReport::elected_subnets`]);
//! narrower ones count as reported, so a second NIC on a /24 works without the Node
//! listing its address (see docs/security.md for what that leaves a
//! compromised node).
//!
//! A rejected report is worth nothing to the controller: it treats the agent as not ready
//! (its node is not eligible and holds nothing), exactly as for a report that is not JSON.
//!
//! The size bound is the API server's own: all annotations of an object together may not
//! exceed 256 KiB, so no report the API stores is cut by it. 10,000 held IPv4 addresses in
//! their longest form (`255.255.255.255`), with four interfaces of four subnets and ten
//! conflicts, make a report of 181,191 bytes (177 KiB); the same in 19-character IPv6
//! addresses (`2001:db8:ffff::c000`) 221,191 bytes (216 KiB) (see the test
//! `a_report_of_10000_held_ips_is_read`). More than that on one node (10,000 addresses in
//! the 39-character IPv6 form, or 10,000 dual-stack pairs, about 400 KiB) the API server
//! refuses to store at all.

use std::collections::BTreeSet;
use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::advert::PublicKey;
use crate::mac::Mac;
use crate::text;

/// Current report format version.
pub const REPORT_VERSION: u32 = 1;

/// Longest report annotation read, in bytes: 256 KiB, the API server's limit for all
/// annotations of an object together (see the module docs).
pub const MAX_REPORT_BYTES: usize = 256 * 1024;
/// Most interfaces in a report.
pub const MAX_INTERFACES: usize = 256;
/// Longest interface name in bytes: `IFNAMSIZ` (16) less the terminating NUL.
pub const MAX_INTERFACE_NAME: usize = 15;
/// Most subnets per interface.
pub const MAX_SUBNETS_PER_INTERFACE: usize = 64;
/// Shortest IPv4 prefix a report may carry: no broadcast domain is wider than a /8.
pub const WIDEST_SUBNET_V4: u8 = 8;
/// Shortest IPv6 prefix a report may carry (on-link prefixes are /64 almost everywhere).
pub const WIDEST_SUBNET_V6: u8 = 32;
/// Shortest IPv4 prefix that counts for election without holding one of the Node's own
/// addresses ([`AgentReport::elected_subnets`]).
pub const ANCHOR_FREE_V4: u8 = 24;
/// Shortest IPv6 prefix that counts for election without holding one of the Node's own
/// addresses.
pub const ANCHOR_FREE_V6: u8 = 64;
/// Most held IPs in a report.
pub const MAX_HELD: usize = 65_536;
/// Most conflicts in a report.
pub const MAX_CONFLICTS: usize = 4_096;
/// Longest conflict reason kept, in bytes; longer ones are cut.
pub const MAX_REASON: usize = 256;
/// Longest interface name quoted in a [`ReportError`], in bytes.
const QUOTED_NAME: usize = 32;

/// The report an agent publishes on its Lease.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentReport {
    /// Format version ([`REPORT_VERSION`]).
    #[serde(default)]
    pub version: u32,
    /// The node's interfaces and their connected subnets (its own addresses, not aliases).
    #[serde(default)]
    pub interfaces: Vec<InterfaceReport>,
    /// Load-balancer IPs the agent holds as aliases right now.
    #[serde(default, deserialize_with = "packed")]
    pub held: BTreeSet<IpAddr>,
    /// Assigned IPs the agent refuses to take, and why.
    #[serde(default)]
    pub conflicts: Vec<Conflict>,
    /// The host-port shield (the agent's nftables table) on this node.
    #[serde(default)]
    pub shield: ShieldState,
    /// The MACs of every Ethernet link of the node, with or without carrier or addresses
    /// of its own (an interface that only carries VIPs has none): the controller relays
    /// them to every agent, which tells another node's claim from a foreign host's by them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub macs: Vec<Mac>,
    /// Fast L2 failover: the public half of the key this agent signs its adverts and acks
    /// with (made at its start, never leaving it); the controller writes it into the
    /// assignments of the nodes that verify them. `None`: an agent older than per-node
    /// keys, or adverts off (`--advert-port 0`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<PublicKey>,
    /// L3 mode: the node's routing daemon as the agent last read it; `None`: the agent is
    /// told to read none (`--routing-daemon=none`), or is older than L3 mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing: Option<RoutingReport>,
}

/// L3 mode: what the node's routing daemon (BIRD, FRR) says, as the agent read it last.
/// The agent only reads the daemon; this is how the controller knows that an address on
/// the node's device really is announced.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RoutingReport {
    /// The daemon: `bird` or `frr`.
    pub daemon: String,
    /// Why the daemon could not be read, if it could not (then the counts are zero).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// BGP sessions configured, in any state.
    #[serde(default)]
    pub sessions: u32,
    /// BGP sessions Established.
    #[serde(default)]
    pub established: u32,
    /// Host routes (/32, /128) of held addresses the daemon exports to at least one
    /// Established peer.
    #[serde(default, deserialize_with = "packed")]
    pub exported: BTreeSet<IpAddr>,
}

/// State of an agent's host-port shield (its nftables table), as it reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ShieldState {
    /// The table is installed and every held IP is in it.
    Active,
    /// Disabled with `--host-port-shield=off`.
    Off,
    /// The last sync of the table failed; the agent retries, and adds no alias while its
    /// shield element cannot be written.
    Failing,
    /// Not reported: an agent of an older version, or a state this controller does not
    /// know (a newer agent).
    #[default]
    #[serde(other)]
    Unknown,
}

impl ShieldState {
    /// The state as in the report's JSON: `active`, `off`, `failing` or `unknown`.
    pub fn as_str(&self) -> &'static str {
        match self {
            ShieldState::Active => "active",
            ShieldState::Off => "off",
            ShieldState::Failing => "failing",
            ShieldState::Unknown => "unknown",
        }
    }
}

/// One interface of the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InterfaceReport {
    /// Interface name, e.g. `eth0`.
    pub name: String,
    /// Connected subnets of its own (non-alias) addresses, e.g. `192.168.55.3/24`.
    #[serde(default)]
    pub subnets: Vec<IpNet>,
    /// Its Ethernet address, if it has one: the controller relays every node's MACs to
    /// the agents, which tell another node's ARP/NDP claim from a foreign host's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<Mac>,
    /// Its own (non-alias) global addresses in `subnets`: where the holder's fast-failover
    /// adverts reach this node (agents before fast failover do not report them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<IpAddr>,
}

/// An assigned IP the agent did not take.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Conflict {
    /// The IP.
    pub ip: IpAddr,
    /// Human-readable reason, e.g. "already configured on eth0 by another owner".
    pub reason: String,
    /// For a conflict seen on the LAN (an ARP/NDP answer or claim from another host): the
    /// MAC that answered. `None`: the address is configured on this node by another owner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<Mac>,
    /// The interface it was seen on, for a conflict seen on the LAN.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<String>,
    /// The agent held the IP when the claim came: a claim against an established holder
    /// (defended, or yielded while its authority was stale), not the answer to a first
    /// claim's probe. Such a conflict never withholds the address unless the pool says
    /// `onConflict: renumber`. Absent (false) from agents older than this field.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub while_held: bool,
    /// The agent took the address down for this claim and keeps it down while the claimant
    /// answers for it: it yielded to a claim heard while its authority was stale, removed
    /// it for a foreign claim then, or found it answered when re-checking after a yield.
    /// Not set for a defended claim (the address stays up, even when a link without carrier
    /// leaves it out of `held`). Lets the controller make a standby that took the address
    /// over its holder at once. Absent (false) from agents older than this field.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub yielded: bool,
}

/// Why a report could not be read: the first bound it breaks (see the module docs).
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// The annotation is longer than [`MAX_REPORT_BYTES`]; it was not parsed.
    #[error("agent report is {size} bytes, more than the {MAX_REPORT_BYTES} read")]
    TooLarge {
        /// Its length in bytes.
        size: usize,
    },
    /// Not a report.
    #[error("agent report is not valid JSON: {0}")]
    Json(#[source] serde_json::Error),
    /// More than [`MAX_INTERFACES`] interfaces.
    #[error("agent report lists {count} interfaces, more than {MAX_INTERFACES}")]
    TooManyInterfaces {
        /// Interfaces listed.
        count: usize,
    },
    /// An interface name Linux does not allow.
    #[error("agent report: interface {index} has name {name:?}, which {why}")]
    InterfaceName {
        /// Its position in the list, from 0.
        index: usize,
        /// The name, cut to a few bytes.
        name: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// An interface with more than [`MAX_SUBNETS_PER_INTERFACE`] subnets.
    #[error(
        "agent report: interface {name} lists {count} subnets, more than {MAX_SUBNETS_PER_INTERFACE}"
    )]
    TooManySubnets {
        /// The interface (a valid name).
        name: String,
        /// Subnets listed.
        count: usize,
    },
    /// A subnet wider than [`WIDEST_SUBNET_V4`] or [`WIDEST_SUBNET_V6`].
    #[error(
        "agent report: interface {name} lists subnet {subnet}, wider than any LAN (/{WIDEST_SUBNET_V4} for IPv4, /{WIDEST_SUBNET_V6} for IPv6)"
    )]
    SubnetTooWide {
        /// The interface (a valid name).
        name: String,
        /// The subnet.
        subnet: IpNet,
    },
    /// More than [`MAX_HELD`] held IPs.
    #[error("agent report lists {count} held IPs, more than {MAX_HELD}")]
    TooManyHeld {
        /// Held IPs listed (without duplicates).
        count: usize,
    },
    /// More than [`MAX_CONFLICTS`] conflicts.
    #[error("agent report lists {count} conflicts, more than {MAX_CONFLICTS}")]
    TooManyConflicts {
        /// Conflicts listed.
        count: usize,
    },
    /// A conflict names an interface Linux does not allow.
    #[error("agent report: the conflict for {ip} names interface {name:?}, which {why}")]
    ConflictInterface {
        /// The conflict's IP.
        ip: IpAddr,
        /// The name, cut to a few bytes.
        name: String,
        /// What is wrong with it.
        why: &'static str,
    },
}

impl ReportError {
    /// Short stable category, for a metric label: `too_large`, `json`, `interfaces`,
    /// `interface_name`, `subnets`, `held` or `conflicts`.
    pub fn category(&self) -> &'static str {
        match self {
            ReportError::TooLarge { .. } => "too_large",
            ReportError::Json(_) => "json",
            ReportError::TooManyInterfaces { .. } => "interfaces",
            ReportError::InterfaceName { .. } | ReportError::ConflictInterface { .. } => {
                "interface_name"
            }
            ReportError::TooManySubnets { .. } | ReportError::SubnetTooWide { .. } => "subnets",
            ReportError::TooManyHeld { .. } => "held",
            ReportError::TooManyConflicts { .. } => "conflicts",
        }
    }
}

/// What is wrong with `name` as a Linux interface name, if anything (see the module docs).
pub fn interface_name_error(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        return Some("is empty");
    }
    if name.len() > MAX_INTERFACE_NAME {
        return Some("is longer than 15 bytes");
    }
    if name == "." || name == ".." {
        return Some("is not a name");
    }
    if name.contains(['/', ':']) {
        return Some("contains `/` or `:`");
    }
    if name.chars().any(char::is_whitespace) {
        return Some("contains whitespace");
    }
    if name.chars().any(char::is_control) {
        return Some("contains a control character");
    }
    None
}

/// Reads a set of addresses with its tree's nodes full. serde inserts one address at a time,
/// and a sorted run of inserts leaves each node of a `BTreeSet` a little over half full;
/// collecting them (sorted in bulk by `FromIterator`) fills them: a report at its bounds
/// (about 17,000 held IPv4 addresses in 255 KiB) takes about half the memory once read
/// (BENCHMARKS, "Agent reports at their bounds"). Duplicates collapse as before.
fn packed<'de, D: serde::Deserializer<'de>>(d: D) -> Result<BTreeSet<IpAddr>, D::Error> {
    let listed: Vec<IpAddr> = Deserialize::deserialize(d)?;
    Ok(listed.into_iter().collect())
}

/// `reason` without control characters and cut to [`MAX_REASON`] bytes.
fn bound_reason(reason: &mut String) {
    if reason.contains(char::is_control) {
        *reason = reason
            .chars()
            .map(|c| if c.is_control() { ' ' } else { c })
            .collect();
    }
    text::bound(reason, MAX_REASON);
}

impl AgentReport {
    /// Serialises the report for the Lease annotation.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("an AgentReport always serialises")
    }

    /// Reads a report from the Lease annotation, within bounds: size, then JSON, then
    /// [`AgentReport::validated`] (see the module docs).
    pub fn from_json(s: &str) -> Result<Self, ReportError> {
        if s.len() > MAX_REPORT_BYTES {
            return Err(ReportError::TooLarge { size: s.len() });
        }
        let report: AgentReport = serde_json::from_str(s).map_err(ReportError::Json)?;
        report.validated()
    }

    /// The report if it is within bounds, its free text cut; else the first bound it
    /// breaks (see the module docs).
    pub fn validated(mut self) -> Result<Self, ReportError> {
        if self.interfaces.len() > MAX_INTERFACES {
            return Err(ReportError::TooManyInterfaces {
                count: self.interfaces.len(),
            });
        }
        for (index, interface) in self.interfaces.iter().enumerate() {
            if let Some(why) = interface_name_error(&interface.name) {
                return Err(ReportError::InterfaceName {
                    index,
                    name: text::bounded(interface.name.clone(), QUOTED_NAME),
                    why,
                });
            }
            if interface.subnets.len() > MAX_SUBNETS_PER_INTERFACE {
                return Err(ReportError::TooManySubnets {
                    name: interface.name.clone(),
                    count: interface.subnets.len(),
                });
            }
            if let Some(subnet) = interface.subnets.iter().find(|net| too_wide(net)) {
                return Err(ReportError::SubnetTooWide {
                    name: interface.name.clone(),
                    subnet: *subnet,
                });
            }
        }
        if self.macs.len() > MAX_INTERFACES {
            return Err(ReportError::TooManyInterfaces {
                count: self.macs.len(),
            });
        }
        if self.held.len() > MAX_HELD {
            return Err(ReportError::TooManyHeld {
                count: self.held.len(),
            });
        }
        if self.conflicts.len() > MAX_CONFLICTS {
            return Err(ReportError::TooManyConflicts {
                count: self.conflicts.len(),
            });
        }
        if let Some(routing) = &mut self.routing {
            if routing.exported.len() > MAX_HELD {
                return Err(ReportError::TooManyHeld {
                    count: routing.exported.len(),
                });
            }
            bound_reason(&mut routing.daemon);
            text::bound(&mut routing.daemon, QUOTED_NAME);
            if let Some(error) = &mut routing.error {
                bound_reason(error);
            }
        }
        for conflict in &mut self.conflicts {
            bound_reason(&mut conflict.reason);
            if let Some((name, why)) = conflict
                .interface
                .as_ref()
                .and_then(|n| interface_name_error(n).map(|why| (n, why)))
            {
                return Err(ReportError::ConflictInterface {
                    ip: conflict.ip,
                    name: text::bounded(name.clone(), QUOTED_NAME),
                    why,
                });
            }
        }
        Ok(self)
    }

    /// Every MAC of the node: [`Self::macs`] and those of the interfaces listed.
    pub fn macs(&self) -> impl Iterator<Item = Mac> + '_ {
        self.macs
            .iter()
            .copied()
            .chain(self.interfaces.iter().filter_map(|i| i.mac))
    }

    /// All subnets of all interfaces.
    pub fn subnets(&self) -> impl Iterator<Item = &IpNet> {
        self.interfaces.iter().flat_map(|i| i.subnets.iter())
    }

    /// The subnets that count for node election, given the addresses the node's own Node
    /// object lists: each one no wider than [`ANCHOR_FREE_V4`] / [`ANCHOR_FREE_V6`], and the
    /// wider ones that hold one of `node_addresses` (see the module docs).
    pub fn elected_subnets<'a>(
        &'a self,
        node_addresses: &'a [IpAddr],
    ) -> impl Iterator<Item = &'a IpNet> + 'a {
        self.subnets()
            .filter(move |net| anchor_free(net) || node_addresses.iter().any(|a| net.contains(a)))
    }

    /// The subnets [`AgentReport::elected_subnets`] leaves out: wide, and holding none of
    /// `node_addresses`.
    pub fn unanchored_subnets<'a>(
        &'a self,
        node_addresses: &'a [IpAddr],
    ) -> impl Iterator<Item = &'a IpNet> + 'a {
        self.subnets()
            .filter(move |net| !anchor_free(net) && !node_addresses.iter().any(|a| net.contains(a)))
    }
}

/// Whether `net` is wider than any LAN ([`WIDEST_SUBNET_V4`], [`WIDEST_SUBNET_V6`]).
fn too_wide(net: &IpNet) -> bool {
    match net {
        IpNet::V4(n) => n.prefix_len() < WIDEST_SUBNET_V4,
        IpNet::V6(n) => n.prefix_len() < WIDEST_SUBNET_V6,
    }
}

/// Whether `net` counts for election without an address of the Node in it.
fn anchor_free(net: &IpNet) -> bool {
    match net {
        IpNet::V4(n) => n.prefix_len() >= ANCHOR_FREE_V4,
        IpNet::V6(n) => n.prefix_len() >= ANCHOR_FREE_V6,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nets(list: &[&str]) -> Vec<IpNet> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    /// An interface on `subnets`, without a MAC or addresses of its own.
    fn interface_on(name: &str, subnets: Vec<IpNet>) -> InterfaceReport {
        InterfaceReport {
            mac: None,
            addresses: Vec::new(),
            name: name.into(),
            subnets,
        }
    }

    #[test]
    fn round_trips_and_ignores_unknown_fields() {
        let report = AgentReport {
            version: REPORT_VERSION,
            interfaces: vec![interface_on("eth1", nets(&["192.168.55.3/24"]))],
            held: ["192.168.55.10".parse().unwrap()].into(),
            conflicts: vec![Conflict {
                mac: Some(Mac([0x82, 0x1e, 0x30, 0xb2, 0xc7, 0x74])),
                interface: Some("eth1".into()),
                ip: "192.168.55.11".parse().unwrap(),
                ..conflict(0, "already on eth1")
            }],
            shield: ShieldState::Active,
            macs: Vec::new(),
            key: Some(
                "5d41402abc4b2a76b9719d911017c592aa96fe1b4c7d2f9e1a4a1b2c3d4e5f60"
                    .parse()
                    .unwrap(),
            ),
            routing: Some(RoutingReport {
                daemon: "bird".into(),
                error: None,
                sessions: 2,
                established: 1,
                exported: ["10.200.0.7".parse().unwrap()].into(),
            }),
        };
        let json = report.to_json();
        assert!(json.contains(r#""shield":"active""#), "{json}");
        assert!(json.contains(r#""mac":"82:1e:30:b2:c7:74""#), "{json}");
        assert!(json.contains(r#""key":"5d41402a"#), "{json}");
        let mut bad_key = json.replace("5d41402abc", "5d41402abz");
        assert!(AgentReport::from_json(&bad_key).is_err());
        bad_key = json.replace(r#""key":"5d41402abc"#, r#""key":"5d41"#);
        assert!(AgentReport::from_json(&bad_key).is_err());
        let mut bad = report.clone();
        bad.conflicts[0].interface = Some("eth1:alb".into());
        let e = AgentReport::from_json(&bad.to_json()).unwrap_err();
        assert_eq!(e.category(), "interface_name");
        assert!(e.to_string().contains("192.168.55.11"), "{e}");
        assert_eq!(AgentReport::from_json(&json).unwrap(), report);
        let newer = json.replacen('{', r#"{"futureField":[1,2],"#, 1);
        assert_eq!(AgentReport::from_json(&newer).unwrap(), report);
        assert_eq!(report.subnets().count(), 1);
        assert!(json.contains(r#""routing":{"daemon":"bird""#), "{json}");
        let mut noisy = report.clone();
        let routing = noisy.routing.as_mut().unwrap();
        routing.error = Some(format!("line\none{}", "x".repeat(1000)));
        let read = AgentReport::from_json(&noisy.to_json()).unwrap();
        let error = read.routing.unwrap().error.unwrap();
        assert!(
            error.len() <= MAX_REASON && !error.contains('\n'),
            "{error}"
        );

        // An older agent does not report its shield; a newer one may report a state this
        // version does not know. Both read as Unknown, the rest of the report intact.
        let older = json.replace(r#","shield":"active""#, "");
        assert!(!older.contains("shield"), "{older}");
        let unknown = AgentReport {
            shield: ShieldState::Unknown,
            ..report.clone()
        };
        assert_eq!(AgentReport::from_json(&older).unwrap(), unknown);
        let future = json.replace(r#""shield":"active""#, r#""shield":"someFutureState""#);
        assert_eq!(AgentReport::from_json(&future).unwrap(), unknown);
    }

    /// The packed read of `held` and `exported` reads what one insert at a time read:
    /// unsorted lists sorted, duplicates collapsed, an absent field empty, a bad address
    /// an error saying so (serde's, with its place in the text).
    #[test]
    fn held_and_exported_read_as_sets() {
        let json = r#"{"version":1,"held":["10.0.0.9","10.0.0.1","fd00::1","10.0.0.9"],
            "routing":{"daemon":"bird","sessions":1,"established":1,
            "exported":["10.0.0.9","10.0.0.9"]}}"#
            .replace(r#""version":1"#, &format!(r#""version":{REPORT_VERSION}"#));
        let report = AgentReport::from_json(&json).unwrap();
        let ips = |list: &[&str]| -> BTreeSet<IpAddr> {
            list.iter().map(|ip| ip.parse().unwrap()).collect()
        };
        assert_eq!(report.held, ips(&["10.0.0.1", "10.0.0.9", "fd00::1"]));
        assert_eq!(report.routing.unwrap().exported, ips(&["10.0.0.9"]));
        let bare = format!(r#"{{"version":{REPORT_VERSION}}}"#);
        assert!(AgentReport::from_json(&bare).unwrap().held.is_empty());
        let bad = json.replace("10.0.0.1", "10.0.0.300");
        let e = AgentReport::from_json(&bad).unwrap_err().to_string();
        assert!(e.contains("invalid IP address"), "{e}");
    }

    #[test]
    fn shield_state_names_match_the_json() {
        for state in [
            ShieldState::Active,
            ShieldState::Off,
            ShieldState::Failing,
            ShieldState::Unknown,
        ] {
            let json = serde_json::to_string(&state).unwrap();
            assert_eq!(json, format!("\"{}\"", state.as_str()));
            assert_eq!(serde_json::from_str::<ShieldState>(&json).unwrap(), state);
        }
        assert_eq!(ShieldState::default(), ShieldState::Unknown);
    }

    /// A report of one interface, `eth0`, on `subnets`.
    fn on_eth0(subnets: &[&str]) -> AgentReport {
        AgentReport {
            version: REPORT_VERSION,
            interfaces: vec![interface_on("eth0", nets(subnets))],
            ..AgentReport::default()
        }
    }

    /// A valid report (`eth0` on 10.0.0.0/24) as `f` leaves it.
    fn report_with(f: impl FnOnce(&mut AgentReport)) -> AgentReport {
        let mut report = on_eth0(&["10.0.0.0/24"]);
        f(&mut report);
        report
    }

    /// The message of the error `validated` gives for `report_with(f)`.
    fn rejected(f: impl FnOnce(&mut AgentReport)) -> String {
        report_with(f).validated().unwrap_err().to_string()
    }

    fn interface(name: &str, subnets: usize) -> InterfaceReport {
        let subnets = (0..subnets)
            .map(|i| format!("10.{}.{}.0/24", i / 256, i % 256).parse().unwrap())
            .collect();
        interface_on(name, subnets)
    }

    /// `eth0`, `eth1` ... with a subnet each.
    fn interfaces(n: usize) -> Vec<InterfaceReport> {
        (0..n).map(|i| interface(&format!("eth{i}"), 1)).collect()
    }

    fn conflict(i: usize, reason: &str) -> Conflict {
        Conflict {
            while_held: false,
            yielded: false,
            mac: None,
            interface: None,
            ip: IpAddr::from([10, 1, (i / 256) as u8, (i % 256) as u8]),
            reason: reason.into(),
        }
    }

    fn conflicts(n: usize) -> Vec<Conflict> {
        (0..n).map(|i| conflict(i, "x")).collect()
    }

    fn held(n: usize) -> BTreeSet<IpAddr> {
        (0..n)
            .map(|i| IpAddr::from((0x0a00_0000u32 + u32::try_from(i).unwrap()).to_be_bytes()))
            .collect()
    }

    /// Checks the case `what`: `report` is valid and unchanged when `want` is `None`, else
    /// rejected in category `want`, read from the annotation too when it fits.
    fn check_validation(what: &str, report: AgentReport, want: Option<&str>) {
        match (report.clone().validated(), want) {
            (Ok(valid), None) => assert_eq!(valid, report, "{what}"),
            (Err(e), Some(category)) => {
                assert_eq!(e.category(), category, "{what}: {e}");
                assert!(e.to_string().starts_with("agent report"), "{what}: {e}");
                // Through the annotation too, when it fits.
                let json = report.to_json();
                if json.len() <= MAX_REPORT_BYTES {
                    let e = AgentReport::from_json(&json).unwrap_err();
                    assert_eq!(e.category(), category, "{what}: {e}");
                }
            }
            (got, want) => panic!("{what}: got {got:?}, want {want:?}"),
        }
    }

    #[test]
    fn validation_rejects_impossible_data_and_names_the_first_violation() {
        type Edit = fn(&mut AgentReport);
        let table: Vec<(&str, Edit, Option<&str>)> = vec![
            ("as written", |_| {}, None),
            ("256 interfaces", |r| r.interfaces = interfaces(256), None),
            (
                "257 interfaces",
                |r| r.interfaces = interfaces(257),
                Some("interfaces"),
            ),
            (
                "64 subnets",
                |r| r.interfaces[0] = interface("eth0", 64),
                None,
            ),
            (
                "65 subnets",
                |r| r.interfaces[0] = interface("eth0", 65),
                Some("subnets"),
            ),
            ("65,536 held", |r| r.held = held(65_536), None),
            ("65,537 held", |r| r.held = held(65_537), Some("held")),
            ("4,096 conflicts", |r| r.conflicts = conflicts(4096), None),
            (
                "4,097 conflicts",
                |r| r.conflicts = conflicts(4097),
                Some("conflicts"),
            ),
            // The first violation is the one named.
            (
                "bad name, then too many subnets",
                |r| {
                    r.interfaces = vec![
                        interface("ok0", 1),
                        interface("bad/1", 1),
                        interface("eth1", 65),
                    ];
                },
                Some("interface_name"),
            ),
        ];
        for (what, edit, want) in table {
            check_validation(what, report_with(edit), want);
        }
    }

    #[test]
    fn interface_names_are_checked_as_linux_checks_them() {
        // (case, the name of the report's interface, the category it is rejected in; None:
        // accepted)
        let table = [
            ("15-byte name", "a23456789012345", None),
            ("16-byte name", "a234567890123456", Some("interface_name")),
            ("non-ASCII name", "wlp0é", None),
            ("16 bytes of non-ASCII", "éééééééé", Some("interface_name")),
            ("empty name", "", Some("interface_name")),
            ("dot", ".", Some("interface_name")),
            ("dot dot", "..", Some("interface_name")),
            ("dots inside", "eth0.100", None),
            ("slash", "eth0/1", Some("interface_name")),
            (
                "colon (an address label)",
                "eth0:alb",
                Some("interface_name"),
            ),
            ("space", "eth 0", Some("interface_name")),
            ("tab", "eth\t0", Some("interface_name")),
            (
                "non-ASCII whitespace",
                "eth\u{2003}0",
                Some("interface_name"),
            ),
            ("control character", "eth\u{1b}[0m", Some("interface_name")),
            ("DEL", "eth\u{7f}", Some("interface_name")),
        ];
        for (what, name, want) in table {
            let report = report_with(|r| r.interfaces[0].name = name.into());
            check_validation(what, report, want);
        }
    }

    #[test]
    fn errors_name_the_violation_and_quote_little() {
        let long = format!("bad/{}", "x".repeat(10_000));
        let message = rejected(|r| {
            r.interfaces.push(interface("eth1", 0));
            r.interfaces.push(interface(&long, 0));
        });
        assert!(
            message.starts_with("agent report: interface 2 has name \"bad/xxx"),
            "{message}"
        );
        assert!(
            message.ends_with("which is longer than 15 bytes"),
            "{message}"
        );
        assert!(message.len() < 120, "{message}");
        assert_eq!(
            rejected(|r| r.interfaces[0].name = "a\nb".into()),
            r#"agent report: interface 0 has name "a\nb", which contains whitespace"#
        );
        assert_eq!(
            rejected(|r| r.interfaces[0] = interface("eth0", 70)),
            "agent report: interface eth0 lists 70 subnets, more than 64"
        );
    }

    #[test]
    fn free_text_is_cut_not_rejected() {
        let report = report_with(|r| {
            r.conflicts = vec![
                conflict(0, "already configured on eth1 by another owner"),
                conflict(1, &"é".repeat(1000)),
                conflict(2, "line one\nline two\u{1b}[31m\u{85}"),
            ];
        });
        let valid = report.validated().unwrap();
        assert_eq!(
            valid.conflicts[0].reason,
            "already configured on eth1 by another owner"
        );
        let cut = &valid.conflicts[1].reason;
        assert!(
            cut.len() <= MAX_REASON && cut.len() > MAX_REASON - 8,
            "{}",
            cut.len()
        );
        assert!(cut.ends_with("...") && cut.starts_with("éé"), "{cut}");
        assert_eq!(valid.conflicts[2].reason, "line one line two [31m ");
        // Reading it again changes nothing.
        assert_eq!(AgentReport::from_json(&valid.to_json()).unwrap(), valid);
    }

    #[test]
    fn the_size_bound_is_checked_before_parsing() {
        let padding = " ".repeat(MAX_REPORT_BYTES - 2);
        let at_bound = format!("{{{padding}}}");
        assert_eq!(at_bound.len(), MAX_REPORT_BYTES);
        assert_eq!(
            AgentReport::from_json(&at_bound).unwrap(),
            AgentReport::default()
        );
        // One byte more is refused unread: not even the JSON error of the garbage is seen.
        let over = format!("{at_bound}x");
        let e = AgentReport::from_json(&over).unwrap_err();
        assert_eq!(e.category(), "too_large");
        assert_eq!(
            e.to_string(),
            format!(
                "agent report is {} bytes, more than the 262144 read",
                MAX_REPORT_BYTES + 1
            )
        );
    }

    /// What an agent writes for 10,000 held IPs, in the longest IPv4 form and in a short
    /// IPv6 form, with a few interfaces and conflicts besides: every case must be read.
    #[test]
    fn a_report_of_10000_held_ips_is_read() {
        // 255.255.1xx.1xx: every address 15 characters, the longest IPv4 form.
        let v4: BTreeSet<IpAddr> = (0..10_000u16)
            .map(|i| IpAddr::from([255, 255, 100 + (i / 100) as u8, 100 + (i % 100) as u8]))
            .collect();
        assert!(v4.iter().all(|ip| ip.to_string().len() == 15));
        assert_eq!(v4.len(), 10_000);
        let v6: BTreeSet<IpAddr> = (0..10_000u16)
            .map(|i| format!("2001:db8:ffff::{:x}", 0xc000 + i).parse().unwrap())
            .collect();
        assert!(v6.iter().all(|ip| ip.to_string().len() == 19));
        for (family, held) in [("IPv4", v4), ("IPv6", v6)] {
            let report = report_with(|r| {
                r.interfaces = (0..4)
                    .map(|i| interface(&format!("enp{i}s0f1"), 4))
                    .collect();
                r.held = held;
                r.conflicts = (0..10)
                    .map(|i| conflict(i, "already configured on enp0s0f1 by another owner"))
                    .collect();
                r.shield = ShieldState::Active;
            });
            let json = report.to_json();
            eprintln!(
                "10,000 held {family} addresses: {} bytes ({:.1} KiB)",
                json.len(),
                json.len() as f64 / 1024.0
            );
            assert!(json.len() < MAX_REPORT_BYTES, "{family}: {}", json.len());
            assert_eq!(AgentReport::from_json(&json).unwrap(), report);
        }
    }

    #[test]
    fn rejects_garbage_with_a_message() {
        let err = AgentReport::from_json("{not json").unwrap_err();
        assert!(
            err.to_string()
                .starts_with("agent report is not valid JSON"),
            "{err}"
        );
        assert_eq!(err.category(), "json");
    }

    #[test]
    fn subnets_wider_than_any_lan_reject_the_report() {
        // (subnet, accepted): the widest bound on each side of the line, both families.
        let table = [
            ("0.0.0.0/1", false),
            ("0.0.0.0/0", false),
            ("10.0.0.0/7", false),
            ("10.0.0.0/8", true),
            ("192.168.55.0/24", true),
            ("2001:db8::/31", false),
            ("::/0", false),
            ("2001:db8::/32", true),
            ("fd55::/64", true),
        ];
        for (subnet, accepted) in table {
            let got = on_eth0(&["192.168.1.0/24", subnet]).validated();
            match (accepted, got) {
                (true, Ok(_)) => {}
                (false, Err(err)) => {
                    assert_eq!(err.category(), "subnets", "{subnet}");
                    assert_eq!(
                        err.to_string(),
                        format!(
                            "agent report: interface eth0 lists subnet {subnet}, wider than any LAN (/8 for IPv4, /32 for IPv6)"
                        ),
                        "{subnet}"
                    );
                }
                (accepted, got) => panic!("{subnet}: wanted accepted={accepted}, got {got:?}"),
            }
        }
    }

    #[test]
    fn wide_subnets_count_for_election_only_around_the_nodes_own_addresses() {
        let report = on_eth0(&[
            "10.0.0.0/8",
            "172.16.0.0/16",
            "192.168.55.0/24",
            "192.168.56.0/25",
            "fd55::/64",
            "fd56::/48",
        ]);
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        // (the Node's own addresses, the subnets elected)
        let table: [(&[IpAddr], &[&str]); 3] = [
            (&[], &["192.168.55.0/24", "192.168.56.0/25", "fd55::/64"]),
            (
                &[ip("172.16.4.2"), ip("fd56::7")],
                &[
                    "172.16.0.0/16",
                    "192.168.55.0/24",
                    "192.168.56.0/25",
                    "fd55::/64",
                    "fd56::/48",
                ],
            ),
            (
                &[ip("10.1.2.3"), ip("192.168.55.3")],
                &[
                    "10.0.0.0/8",
                    "192.168.55.0/24",
                    "192.168.56.0/25",
                    "fd55::/64",
                ],
            ),
        ];
        for (addresses, want) in table {
            let got: Vec<String> = report
                .elected_subnets(addresses)
                .map(ToString::to_string)
                .collect();
            assert_eq!(got, want, "{addresses:?}");
            let left: Vec<String> = report
                .unanchored_subnets(addresses)
                .map(ToString::to_string)
                .collect();
            assert_eq!(left.len() + got.len(), 6, "{addresses:?}: {left:?}");
            assert!(
                left.iter().all(|l| !want.contains(&l.as_str())),
                "{addresses:?}: {left:?}"
            );
        }
    }
}
