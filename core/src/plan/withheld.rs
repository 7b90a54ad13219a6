//! The withheld addresses of a pass: addresses that are never handed out while their cause lasts, an
//! address in a Service ClusterIP range, one a foreign host answers for on the LAN, an
//! address a Node has, or the network or broadcast address of a node's subnet (see the
//! module docs of [`crate::plan`]). Pure.
//!
//! They are kept in the ledgers: each withheld address is marked in use in the ledger of
//! the pool listing it, for no Service, so every way of taking an address (lowest free,
//! sticky, requested) finds it taken. Only the addresses that changed are looked at, or all
//! of them after a new config (the ledgers were rebuilt): O(changes x log n) a pass, plus
//! building the map of causes (O(Node addresses + reported subnets + reported conflicts)).
//!
//! **Who may renumber.** The operator's data (a Service ClusterIP range) and the LAN (a
//! foreign host answering a first claim's probe) take a withheld address from the Service
//! holding it. A node's own word (its Node's `status.addresses`, which its kubelet writes;
//! the subnets its agent reports) only keeps an address from being *allocated*: the Service
//! that holds it keeps it, with a Warning `NodeClaim` and its IPAllocated condition naming
//! the node and what it claimed ([`WithheldCause::renumbers`]). A compromised node can then
//! make addresses unallocatable, never move one.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;

use super::{Inputs, NodeAddress, Planner, Sink, reason};
use crate::election::NodeState;
use crate::mac::Mac;
use crate::pool::{OnConflict, Pool, PoolConfig, PoolKey};
use crate::range::{Family, IpRange, from_u128, to_u128};

/// Withheld addresses named at most in one message; more are counted.
const NAMED: usize = 3;

/// A foreign host answering for an address on the LAN, as a fresh agent reports it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LanConflict {
    /// The MAC that answered the agent's probe (or claimed the address).
    pub mac: Mac,
    /// The node whose agent saw it.
    pub node: String,
    /// The interface it was seen on, if the agent says.
    pub interface: Option<String>,
}

impl fmt::Display for LanConflict {
    /// `answered on the LAN by 46:b0:48:e8:2d:96 (seen by alb-node-2 on eth1)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "answered on the LAN by {} (seen by {}",
            self.mac, self.node
        )?;
        if let Some(interface) = &self.interface {
            write!(f, " on {interface}")?;
        }
        write!(f, ")")
    }
}

/// An address of a subnet a node is on that is no host's: the IPv4 network and broadcast
/// addresses (prefixes up to /30; a /31 or /32 has none, RFC 3021), the IPv6 subnet-router
/// anycast address (the all-zeros host, RFC 4291 2.6.1; prefixes up to /126, a /127 has
/// none, RFC 6164). An alias of one would make the node answer for the whole subnet's
/// broadcast or anycast traffic, and clients could not reach it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SubnetEdge {
    /// The subnet, as an agent reports it.
    pub subnet: IpNet,
    /// The IPv4 broadcast address (else the network or subnet-router anycast address).
    pub broadcast: bool,
    /// The node whose report counts for it (see [`subnet_edges`]): the first by name whose
    /// Node lists an address in the subnet, else the first of the nodes reporting it.
    pub node: String,
}

impl fmt::Display for SubnetEdge {
    /// `the broadcast address of subnet 192.168.55.0/24 of node alb-node-2`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match (self.subnet, self.broadcast) {
            (IpNet::V4(_), false) => "network address",
            (IpNet::V4(_), true) => "broadcast address",
            (IpNet::V6(_), _) => "subnet-router anycast address",
        };
        write!(
            f,
            "the {what} of subnet {} of node {}",
            self.subnet, self.node
        )
    }
}

/// Fewest fresh agents that make a subnet's edges count without an address of their Node
/// in it (see [`subnet_edges`]).
pub const EDGE_REPORTERS: usize = 2;

/// The network and broadcast (IPv4) or subnet-router anycast (IPv6) addresses that some
/// pool of `config` lists, of the subnets `nodes` are on as their **fresh** agents report
/// them, where the subnet holds one of that node's own addresses (`node_addresses`, its
/// Node's `status.addresses`), or at least [`EDGE_REPORTERS`] fresh agents report it.
///
/// Why both: one node's report alone could otherwise withhold any /30 of any pool (16,384 of
/// them fit the report's bounds), while a subnet a node really is on holds the node's own
/// address, and a LAN several nodes share is one they all report even where the Nodes list
/// only their first NIC's address. A stale agent's subnets are as old as its Lease. An
/// address two Nodes list counts for the first by name only (as in `node_addresses`).
/// O(nodes x subnets x (log n + pools)).
pub fn subnet_edges(
    nodes: &[NodeState],
    node_addresses: &BTreeMap<IpAddr, NodeAddress>,
    config: &PoolConfig,
) -> BTreeMap<IpAddr, SubnetEdge> {
    // Each subnet: the nodes whose Node lists an address in it, and those reporting it.
    let mut subnets: BTreeMap<IpNet, (BTreeSet<&str>, BTreeSet<&str>)> = BTreeMap::new();
    for node in nodes.iter().filter(|n| n.agent_ready) {
        for subnet in node.subnets.iter().map(IpNet::trunc) {
            let (anchored, reporters) = subnets.entry(subnet).or_default();
            reporters.insert(&node.name);
            if node_addresses
                .range(subnet.network()..=subnet.broadcast())
                .any(|(_, address)| *address.node == *node.name)
            {
                anchored.insert(&node.name);
            }
        }
    }
    let mut out = BTreeMap::new();
    for (subnet, (anchored, reporters)) in subnets {
        let node = match (anchored.first(), reporters.len() >= EDGE_REPORTERS) {
            (Some(node), _) => *node,
            (None, true) => reporters.first().copied().unwrap_or_default(),
            (None, false) => continue,
        };
        let edges = match subnet {
            IpNet::V4(n) if n.prefix_len() <= 30 => {
                vec![(n.network().into(), false), (n.broadcast().into(), true)]
            }
            IpNet::V6(n) if n.prefix_len() <= 126 => vec![(n.network().into(), false)],
            _ => Vec::new(),
        };
        for (ip, broadcast) in edges {
            if config.pools().any(|(_, pool)| pool.contains(ip)) {
                out.entry(ip).or_insert_with(|| SubnetEdge {
                    subnet,
                    broadcast,
                    node: node.to_owned(),
                });
            }
        }
    }
    out
}

/// Most pool addresses withheld for lying in a Service ClusterIP range: a pool that overlaps
/// the range is a mistake the Warning on the pool ConfigMap names
/// ([`service_range_clashes`]); the planner withholds the first this many of the overlap out of
/// use (a /16 of them) without making every pass enumerate a huge overlap.
pub const MAX_SERVICE_RANGE_WITHHELD: usize = 65_536;

/// A pool address in a Service ClusterIP range (a `ServiceCIDR`): kube-proxy routes it to
/// a Service's endpoints on every node, so as a load-balancer IP it would be answered by
/// whichever Service gets that ClusterIP, and the holder's shield would drop pod traffic to
/// it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ServiceRange {
    /// The range.
    pub cidr: IpNet,
}

impl fmt::Display for ServiceRange {
    /// `in the Service ClusterIP range 10.96.0.0/12`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "in the Service ClusterIP range {}", self.cidr)
    }
}

/// The overlap of pool range `range` with `cidr`, if any, as (first, last) numbers.
fn overlap(range: &IpRange, cidr: &IpNet) -> Option<(u128, u128)> {
    if Family::of(cidr.addr()) != range.family() {
        return None;
    }
    let first = to_u128(range.first()).max(to_u128(cidr.network()));
    let last = to_u128(range.last()).min(to_u128(cidr.broadcast()));
    (first <= last).then_some((first, last))
}

/// The pool addresses of `config` in the Service ClusterIP ranges `ranges`, at most
/// [`MAX_SERVICE_RANGE_WITHHELD`] (the lowest first). O(pool ranges x ranges + the addresses
/// returned).
pub fn service_range_withheld(
    config: &PoolConfig,
    ranges: &[IpNet],
) -> BTreeMap<IpAddr, ServiceRange> {
    let mut out = BTreeMap::new();
    if ranges.is_empty() {
        return out;
    }
    for (_, pool) in config.pools() {
        for range in &pool.ranges {
            for cidr in ranges {
                let Some((first, last)) = overlap(range, cidr) else {
                    continue;
                };
                let family = range.family();
                let mut n = first;
                loop {
                    if out.len() >= MAX_SERVICE_RANGE_WITHHELD {
                        return out;
                    }
                    out.entry(from_u128(family, n))
                        .or_insert(ServiceRange { cidr: *cidr });
                    if n == last {
                        break;
                    }
                    n += 1;
                }
            }
        }
    }
    out
}

/// A pool entry that overlaps a Service ClusterIP range.
///
/// Displays as `key default, line 2: 10.96.0.5-10.96.0.9 is in the Service ClusterIP range
/// 10.96.0.0/12: never allocated`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ServiceRangeClash {
    /// The pool's key.
    pub key: PoolKey,
    /// The entry's line in its value.
    pub line: usize,
    /// The addresses of the entry in the range.
    pub first: IpAddr,
    /// The last of them.
    pub last: IpAddr,
    /// The range.
    pub range: ServiceRange,
}

impl fmt::Display for ServiceRangeClash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "key {}, line {}: {}", self.key, self.line, self.first)?;
        if self.first != self.last {
            write!(f, "-{}", self.last)?;
        }
        write!(
            f,
            " {} {}: never allocated",
            if self.first == self.last { "is" } else { "are" },
            self.range
        )
    }
}

/// The pool entries of `config` that overlap a Service ClusterIP range of `ranges`, by
/// key and line. O(entries x ranges).
pub fn service_range_clashes(config: &PoolConfig, ranges: &[IpNet]) -> Vec<ServiceRangeClash> {
    let mut out = Vec::new();
    for (key, pool) in config.pools() {
        for entry in &pool.entries {
            for cidr in ranges {
                if let Some((first, last)) = overlap(&entry.range, cidr) {
                    let family = entry.range.family();
                    out.push(ServiceRangeClash {
                        key: key.clone(),
                        line: entry.line,
                        first: from_u128(family, first),
                        last: from_u128(family, last),
                        range: ServiceRange { cidr: *cidr },
                    });
                }
            }
        }
    }
    out.sort();
    out
}

/// Why an address is withheld: kept in use in its pool's ledger for no Service. The variants
/// are in order of precedence: an address several causes name is withheld for the first.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum WithheldCause {
    /// It lies in a Service ClusterIP range: withheld for as long as the range exists.
    Service(ServiceRange),
    /// A foreign host answers for it on the LAN: withheld for as long as a fresh agent
    /// reports the conflict.
    Lan(LanConflict),
    /// A foreign host answers for it on the LAN, a host that answers for
    /// [`LAN_HOST_BOUND`] addresses or more ([`lan_withheld`]): withheld like
    /// [`WithheldCause::Lan`], but it renumbers no Service.
    LanHost(LanConflict),
    /// A Node has it (`status.addresses`): withheld for as long as a Node lists it.
    Node(NodeAddress),
    /// It is the network or broadcast address of a subnet a node is on: withheld for as
    /// long as fresh agents report that subnet ([`subnet_edges`]).
    Subnet(SubnetEdge),
}

impl WithheldCause {
    /// Whether the cause takes the address from a Service that holds it: the operator's
    /// data (a Service ClusterIP range) and the LAN do; a node's own word (its Node's
    /// addresses, its agent's subnets) only keeps the address from being allocated (see
    /// the module docs).
    pub fn renumbers(&self) -> bool {
        match self {
            WithheldCause::Service(_) | WithheldCause::Lan(_) => true,
            WithheldCause::LanHost(_) | WithheldCause::Node(_) | WithheldCause::Subnet(_) => false,
        }
    }

    /// Whether the LAN is the cause ([`WithheldCause::Lan`], [`WithheldCause::LanHost`]).
    pub fn is_lan(&self) -> bool {
        matches!(self, WithheldCause::Lan(_) | WithheldCause::LanHost(_))
    }

    /// The node whose word it is, for a node's word (a Node address, a subnet edge).
    pub fn node(&self) -> Option<&str> {
        match self {
            WithheldCause::Node(address) => Some(&address.node),
            WithheldCause::Subnet(edge) => Some(&edge.node),
            WithheldCause::Service(_) | WithheldCause::Lan(_) | WithheldCause::LanHost(_) => None,
        }
    }

    /// What the cause says of `ip`, after it: `is the InternalIP of node n3`.
    fn what(&self) -> String {
        match self {
            WithheldCause::Node(address) => format!("is {address}"),
            WithheldCause::Subnet(edge) => format!("is {edge}"),
            WithheldCause::Service(range) => format!("is {range}"),
            WithheldCause::Lan(lan) | WithheldCause::LanHost(lan) => format!("is {lan}"),
        }
    }

    /// Reason and text (after the IP) of the Warning to a Service that held the address.
    pub(super) fn cleared(&self) -> (&'static str, String) {
        match self {
            WithheldCause::Lan(lan) | WithheldCause::LanHost(lan) => (
                reason::ADDRESS_CONFLICT,
                format!("is {lan}, not a node of this cluster: released"),
            ),
            other => (
                reason::CLEAR_ASSIGNMENT,
                format!("{}: never allocated", other.what()),
            ),
        }
    }

    /// The text of the Warning (and the IPAllocated condition) of a Service that keeps `ip`
    /// although a node claims it (a cause that does not [`renumber`](Self::renumbers)).
    pub(super) fn kept(&self, ip: IpAddr) -> String {
        let node = self.node().unwrap_or_default();
        format!(
            "{ip} {}: the node's own word, which never takes an address from a Service (only \
             the LAN or a pool edit renumber), so the Service keeps it; once released it is \
             not allocated while node {node} says so",
            self.what()
        )
    }

    /// Reason and message of the failure of a request for `ip`.
    pub(super) fn refused(&self, ip: IpAddr) -> (&'static str, String) {
        match self {
            WithheldCause::Node(address) => (
                reason::NODE_ADDRESS,
                format!("{ip} is {address}: never allocated"),
            ),
            WithheldCause::Subnet(edge) => (
                reason::SUBNET_ADDRESS,
                format!("{ip} is {edge}: never allocated"),
            ),
            WithheldCause::Service(range) => (
                reason::SERVICE_RANGE,
                format!("{ip} is {range}: never allocated"),
            ),
            WithheldCause::Lan(lan) | WithheldCause::LanHost(lan) => (
                reason::ADDRESS_CONFLICT,
                format!("{ip} is {lan}, not a node of this cluster"),
            ),
        }
    }
}

/// The LAN conflicts that withhold an address: reported by a *fresh* agent with the MAC that
/// answered and a MAC that is not one of any agent's (fresh or stale:
/// [`AgentReport::macs`]), and either
/// - the answer to a first claim's probe (not [`Conflict::while_held`]) for an IP no fresh
///   agent reports holding, or
/// - a claim against a holder ([`Conflict::while_held`]: the agent held the IP when it came)
///   for an IP whose pool says `onConflict: renumber` ([`OnConflict::Renumber`]); under the
///   default `defend` such a claim is defended by the agent and never withholds: an
///   established Service is not renumbered by what a LAN host says.
///
/// Two nodes claiming one IP withholds nothing: the assignment stands and the node that is not
/// assigned the IP drops it. A stale agent's conflicts are as old as its Lease and are
/// ignored. When several agents report one IP, the first node by name is named.
/// O(agents x (interfaces + conflicts) x log n), plus O(pools) per claim against a holder.
///
/// [`Conflict::while_held`]: crate::report::Conflict::while_held
pub fn lan_conflicts(
    nodes: &[NodeState],
    agents: &super::Reports,
    config: &PoolConfig,
) -> BTreeMap<IpAddr, LanConflict> {
    let mut out = BTreeMap::new();
    let fresh: BTreeSet<&str> = nodes
        .iter()
        .filter(|n| n.agent_ready)
        .map(|n| &*n.name)
        .collect();
    if !agents
        .iter()
        .any(|(node, r)| fresh.contains(node.as_str()) && !r.conflicts.is_empty())
    {
        return out;
    }
    // Only fresh holders: a stale agent's aliases have outlived their kernel lifetime, and
    // the Lease of a node that died would otherwise keep a foreign owner's address allocatable for ever.
    // Another node answering is told apart by its MAC, fresh or stale.
    let held: BTreeSet<IpAddr> = agents
        .iter()
        .filter(|(node, _)| fresh.contains(node.as_str()))
        .flat_map(|(_, r)| r.held.iter().copied())
        .collect();
    let node_macs: BTreeSet<Mac> = agents.values().flat_map(|r| r.macs()).collect();
    for (node, report) in agents {
        if !fresh.contains(node.as_str()) {
            continue;
        }
        for conflict in &report.conflicts {
            let Some(mac) = conflict.mac else { continue };
            if node_macs.contains(&mac) {
                continue;
            }
            let withheld = if conflict.while_held {
                renumbers(config, conflict.ip)
            } else {
                !held.contains(&conflict.ip)
            };
            if !withheld {
                continue;
            }
            out.entry(conflict.ip).or_insert_with(|| LanConflict {
                mac,
                node: node.clone(),
                interface: conflict.interface.clone(),
            });
        }
    }
    out
}

/// Fewest addresses one LAN host (one MAC) answers for that make it a host answering for
/// everything ([`lan_withheld`]): its answers still keep addresses from being allocated, but
/// renumber no Service. A host that answers every first claim's probe (proxy ARP, a router
/// answering for the whole subnet, a forged answer) would otherwise push each new Service
/// through the pool one address per probe; this way one host pushes an allocation at most
/// `LAN_HOST_BOUND - 1` addresses, and each later Service keeps the first address it gets
/// (not announced while the host answers for it: its agent does not take it).
pub const LAN_HOST_BOUND: usize = 4;

/// The withheld addresses of the LAN conflicts `conflicts` ([`lan_conflicts`]): [`WithheldCause::Lan`],
/// or [`WithheldCause::LanHost`] (renumbers nothing) for every address of a MAC that answers
/// for [`LAN_HOST_BOUND`] of them or more. Depends on nothing but the conflicts, so a new
/// leader decides as the last one did. O(conflicts x log n).
pub fn lan_withheld(conflicts: BTreeMap<IpAddr, LanConflict>) -> BTreeMap<IpAddr, WithheldCause> {
    let mut per_mac: BTreeMap<Mac, usize> = BTreeMap::new();
    for conflict in conflicts.values() {
        *per_mac.entry(conflict.mac).or_default() += 1;
    }
    conflicts
        .into_iter()
        .map(|(ip, conflict)| {
            let cause = if per_mac[&conflict.mac] >= LAN_HOST_BOUND {
                WithheldCause::LanHost(conflict)
            } else {
                WithheldCause::Lan(conflict)
            };
            (ip, cause)
        })
        .collect()
}

/// The LAN hosts (MACs) in `withheld` that answer for [`LAN_HOST_BOUND`] addresses or more,
/// each with those addresses. O(withheld).
fn hosts_at_bound(withheld: &BTreeMap<IpAddr, WithheldCause>) -> BTreeMap<Mac, Vec<IpAddr>> {
    let mut per_mac: BTreeMap<Mac, Vec<IpAddr>> = BTreeMap::new();
    for (ip, cause) in withheld {
        if let WithheldCause::LanHost(lan) = cause {
            per_mac.entry(lan.mac).or_default().push(*ip);
        }
    }
    per_mac
}

/// Whether a LAN claim against the holder of `ip` renumbers it: its pool (the first
/// listing it) says `onConflict: renumber`. O(pools x ranges).
fn renumbers(config: &PoolConfig, ip: IpAddr) -> bool {
    config
        .pools()
        .find(|(_, pool)| pool.contains(ip))
        .is_some_and(|(_, pool)| pool.options.on_conflict == OnConflict::Renumber)
}

/// The withheld addresses of `withheld` that lie in `pool`, of `family`. O(ranges x log n)
/// plus the addresses found.
fn in_pool<'m>(
    withheld: &'m BTreeMap<IpAddr, WithheldCause>,
    pool: &'m Pool,
    family: Family,
) -> impl Iterator<Item = (&'m IpAddr, &'m WithheldCause)> + 'm {
    pool.ranges
        .iter()
        .filter(move |r| r.family() == family)
        .flat_map(move |r| withheld.range(r.first()..=r.last()))
}

impl Planner {
    /// Withholds the addresses of the Service ClusterIP ranges, those fresh agents report
    /// answered on the LAN by a foreign host ([`lan_conflicts`], [`lan_withheld`]), those
    /// Nodes have and the edges of the subnets nodes are on ([`subnet_edges`]); while the
    /// agents are unobservable, the addresses withheld for the LAN and subnets of the last pass stay (blindness
    /// is no news). Each is kept in use in the ledger of the pool listing it. A Service
    /// holding one loses it when the cause [renumbers](WithheldCause::renumbers) (a Warning
    /// naming the cause, the path of an address removed from the pool); otherwise it keeps
    /// it: told once with a Warning `NodeClaim` for a node's word, by its Announced
    /// condition for a LAN host answering for everything. Addresses no longer withheld go back to
    /// their pool. Runs after [`Planner::apply_config`]: a new config rebuilt the ledgers,
    /// so then every address is withheld again.
    pub(super) fn withhold(&mut self, inputs: &Inputs<'_>, sink: &mut Sink) {
        let sources = self.fence_inputs(inputs);
        if !self.config_changed && self.fences_are(&sources) {
            return;
        }
        let FenceSources {
            services,
            lan,
            nodes,
            subnets,
        } = sources;
        let mut current: BTreeMap<IpAddr, WithheldCause> = services
            .into_iter()
            .map(|(ip, range)| (ip, WithheldCause::Service(range)))
            .collect();
        for (ip, cause) in lan {
            current.entry(ip).or_insert(cause);
        }
        for (ip, address) in nodes {
            current
                .entry(*ip)
                .or_insert_with(|| WithheldCause::Node(address.clone()));
        }
        for (ip, edge) in subnets {
            current.entry(ip).or_insert(WithheldCause::Subnet(edge));
        }
        let gone: Vec<IpAddr> = self
            .withheld
            .keys()
            .filter(|ip| !current.contains_key(ip))
            .copied()
            .collect();
        for ip in gone {
            if self.ips.contains_key(&ip)
                || self.quarantined.contains(&ip)
                || self.reserved.contains_key(&ip)
            {
                continue;
            }
            if let Some(ledger) = self.ledgers.values_mut().find(|l| l.contains(ip))
                && ledger.release(ip)
            {
                self.freed += 1;
            }
        }
        for (ip, cause) in &current {
            let before = self.withheld.get(ip);
            if !self.config_changed && before == Some(cause) {
                continue;
            }
            if self.ips.contains_key(ip) {
                if cause.renumbers() {
                    let (why, text) = cause.cleared();
                    self.clear_ip(*ip, why, &text, sink);
                } else if cause.node().is_some() && before != Some(cause) {
                    self.claimed(*ip, cause, sink);
                }
            }
            self.reserve(*ip);
        }
        self.withheld = current;
        self.lan_hosts = hosts_at_bound(&self.withheld);
    }

    /// Tells every Service using `ip` that a node claims it and that it keeps it (a
    /// Warning `NodeClaim`, once per cause).
    pub(super) fn claimed(&self, ip: IpAddr, cause: &WithheldCause, sink: &mut Sink) {
        let Some(used) = self.ips.get(&ip) else {
            return;
        };
        let text = cause.kept(ip);
        for user in used.users.keys() {
            sink.event(user, true, reason::NODE_CLAIM, text.clone());
        }
    }

    /// The node's word on `ip`, if a node claims it while a Service keeps it: the cause of
    /// its withholding, when that cause is a node's word (a Node address, a subnet edge).
    pub(super) fn claim_on(&self, ip: IpAddr) -> Option<&WithheldCause> {
        self.withheld.get(&ip).filter(|c| c.node().is_some())
    }

    /// The withheld addresses of a pass by source: the Service ClusterIP ranges
    /// ([`service_range_withheld`]), the LAN conflicts ([`lan_conflicts`]), the Node
    /// addresses and the subnet edges ([`subnet_edges`]); while the agents are
    /// unobservable, the LAN conflicts and subnet edges of the last pass (blindness is no
    /// news: every agent looks stale then).
    pub(super) fn fence_inputs<'i>(&self, inputs: &Inputs<'i>) -> FenceSources<'i> {
        let blind = inputs.agents_unobservable;
        FenceSources {
            services: service_range_withheld(inputs.config, inputs.service_ranges),
            lan: if blind {
                self.withheld
                    .iter()
                    .filter(|(_, cause)| cause.is_lan())
                    .map(|(ip, cause)| (*ip, cause.clone()))
                    .collect()
            } else {
                lan_withheld(lan_conflicts(inputs.nodes, inputs.agents, inputs.config))
            },
            nodes: inputs.node_addresses,
            subnets: if blind {
                self.withheld
                    .iter()
                    .filter_map(|(ip, cause)| match cause {
                        WithheldCause::Subnet(edge) => Some((*ip, edge.clone())),
                        _ => None,
                    })
                    .collect()
            } else {
                subnet_edges(inputs.nodes, inputs.node_addresses, inputs.config)
            },
        }
    }

    /// Whether the withheld are what `sources` make of them (the first source naming an
    /// address gives its cause, in the order of [`FenceSources`]): the steady state,
    /// checked without building the map. O(withheld x log n).
    pub(super) fn fences_are(&self, sources: &FenceSources<'_>) -> bool {
        self.withheld.len() == sources.len()
            && self
                .withheld
                .iter()
                .all(|(ip, cause)| sources.is(*ip, cause))
    }

    /// Why `ip` may not be handed out, if it is withheld.
    pub(super) fn fence_of(&self, ip: IpAddr) -> Option<&WithheldCause> {
        self.withheld.get(&ip)
    }

    /// The LAN hosts (MACs) that answer for [`LAN_HOST_BOUND`] addresses or more as of the
    /// last pass, each with those addresses: their answers renumber nothing.
    pub(super) fn lan_hosts_at_bound(&self) -> &BTreeMap<Mac, Vec<IpAddr>> {
        &self.lan_hosts
    }

    /// The addresses answered on the LAN by a foreign host, withheld as of the last pass.
    pub fn lan_conflicts(&self) -> impl Iterator<Item = (IpAddr, &LanConflict)> + '_ {
        self.withheld.iter().filter_map(|(ip, cause)| match cause {
            WithheldCause::Lan(lan) | WithheldCause::LanHost(lan) => Some((*ip, lan)),
            WithheldCause::Node(_) | WithheldCause::Subnet(_) | WithheldCause::Service(_) => None,
        })
    }

    /// The withheld addresses of pool `key`, of `family` (in use for no Service).
    pub(super) fn withheld_in(
        &self,
        key: &PoolKey,
        family: Family,
    ) -> impl Iterator<Item = (&IpAddr, &WithheldCause)> + '_ {
        self.config
            .as_ref()
            .and_then(|c| c.pool(key))
            .into_iter()
            .flat_map(move |pool| in_pool(&self.withheld, pool, family))
            .filter(|(ip, _)| !self.ips.contains_key(ip))
    }

    /// For a message of an exhausted pool: the reason (`AddressConflict` when one of the
    /// pool's addresses of `family` is withheld by a LAN conflict, else `PoolExhausted`) and
    /// which addresses are withheld (empty when none is): `; 1 of them is a Node's address,
    /// never allocated (10.0.0.2 is the InternalIP of node n3)`.
    pub(super) fn withheld_note(&self, key: &PoolKey, family: Family) -> (&'static str, String) {
        let (mut nodes, mut subnets, mut lan) = (Vec::new(), Vec::new(), Vec::new());
        let mut services = Vec::new();
        for (ip, cause) in self.withheld_in(key, family) {
            match cause {
                WithheldCause::Node(address) => nodes.push(format!("{ip} is {address}")),
                WithheldCause::Subnet(edge) => subnets.push(format!("{ip} is {edge}")),
                WithheldCause::Service(range) => services.push(format!("{ip} is {range}")),
                WithheldCause::Lan(conflict) | WithheldCause::LanHost(conflict) => {
                    lan.push(format!("{ip} is {conflict}"));
                }
            }
        }
        let mut note = String::new();
        if !nodes.is_empty() {
            let count = match nodes.len() {
                1 => "1 of them is a Node's address".to_owned(),
                n => format!("{n} of them are Node addresses"),
            };
            note.push_str(&format!("; {count}, never allocated ({})", named(nodes)));
        }
        if !subnets.is_empty() {
            let count = match subnets.len() {
                1 => "1 of them is a subnet's network or broadcast address".to_owned(),
                n => format!("{n} of them are subnets' network or broadcast addresses"),
            };
            note.push_str(&format!("; {count}, never allocated ({})", named(subnets)));
        }
        if !services.is_empty() {
            let count = match services.len() {
                1 => "1 of them is in a Service ClusterIP range".to_owned(),
                n => format!("{n} of them are in a Service ClusterIP range"),
            };
            note.push_str(&format!("; {count}, never allocated ({})", named(services)));
        }
        if lan.is_empty() {
            return (reason::POOL_EXHAUSTED, note);
        }
        let count = match lan.len() {
            1 => "1 of them is answered on the LAN by a host outside the cluster".to_owned(),
            n => format!("{n} of them are answered on the LAN by hosts outside the cluster"),
        };
        note.push_str(&format!(
            "; {count}, not allocated while an agent reports it ({})",
            named(lan)
        ));
        (reason::ADDRESS_CONFLICT, note)
    }
}

/// What the withheld addresses of a pass are made of, by source, in the order of precedence of
/// [`WithheldCause`]: an address two sources name is withheld for the first.
#[derive(Debug)]
pub(super) struct FenceSources<'i> {
    services: BTreeMap<IpAddr, ServiceRange>,
    lan: BTreeMap<IpAddr, WithheldCause>,
    nodes: &'i BTreeMap<IpAddr, NodeAddress>,
    subnets: BTreeMap<IpAddr, SubnetEdge>,
}

impl FenceSources<'_> {
    /// How many addresses the sources withhold together.
    fn len(&self) -> usize {
        let services = self.services.len();
        let lan = self
            .lan
            .keys()
            .filter(|ip| !self.services.contains_key(ip))
            .count();
        let nodes = self
            .nodes
            .keys()
            .filter(|ip| !self.services.contains_key(ip) && !self.lan.contains_key(ip))
            .count();
        let subnets = self
            .subnets
            .keys()
            .filter(|ip| {
                !self.services.contains_key(ip)
                    && !self.lan.contains_key(ip)
                    && !self.nodes.contains_key(ip)
            })
            .count();
        services + lan + nodes + subnets
    }

    /// Whether the sources withhold `ip` for `cause`.
    fn is(&self, ip: IpAddr, cause: &WithheldCause) -> bool {
        if let Some(range) = self.services.get(&ip) {
            return matches!(cause, WithheldCause::Service(r) if r == range);
        }
        if let Some(lan) = self.lan.get(&ip) {
            return lan == cause;
        }
        if let Some(address) = self.nodes.get(&ip) {
            return matches!(cause, WithheldCause::Node(a) if a == address);
        }
        matches!(cause, WithheldCause::Subnet(e) if self.subnets.get(&ip) == Some(e))
    }
}

/// The first [`NAMED`] of `items`, the rest counted: `a, b, c, 2 more`.
pub(super) fn named(mut items: Vec<String>) -> String {
    let more = items.len().saturating_sub(NAMED);
    items.truncate(NAMED);
    if more > 0 {
        items.push(format!("{more} more"));
    }
    items.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(pairs: &[(&str, &str)]) -> PoolConfig {
        let data = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        PoolConfig::parse(&data).unwrap()
    }

    /// Node `name`, its agent fresh and reporting `subnets`.
    fn on(name: &str, subnets: &[&str]) -> NodeState {
        NodeState {
            name: name.into(),
            agent_ready: true,
            subnets: subnets.iter().map(|s| s.parse().unwrap()).collect(),
            ..NodeState::default()
        }
    }

    #[test]
    fn subnet_edges_are_network_and_broadcast_inside_the_pools() {
        let config = config(&[
            // Ranges: a pool CIDR skips its own edges, a range is taken as written.
            (
                "default",
                "10.0.0.0-10.0.0.255\n10.0.1.0-10.0.1.3\n10.0.2.0-10.0.2.255",
            ),
            ("six", "fd55::-fd55::ff\nfd56::-fd56::1"),
        ]);
        // (subnets reported, edges wanted as "ip what")
        let table: &[(&[&str], &[&str])] = &[
            (
                &["10.0.0.0/24"],
                &[
                    "10.0.0.0 network address of 10.0.0.0/24 of node n1",
                    "10.0.0.255 broadcast address of 10.0.0.0/24 of node n1",
                ],
            ),
            // Only what a pool lists: 10.0.1.3 is the broadcast of the /30, 10.0.1.7 of the
            // /29 is not in the pool.
            (
                &["10.0.1.0/30", "10.0.1.0/29"],
                &[
                    "10.0.1.0 network address of 10.0.1.0/29 of node n1",
                    "10.0.1.3 broadcast address of 10.0.1.0/30 of node n1",
                ],
            ),
            // Reported with host bits, as a node address with its prefix.
            (
                &["10.0.2.17/28"],
                &[
                    "10.0.2.16 network address of 10.0.2.16/28 of node n1",
                    "10.0.2.31 broadcast address of 10.0.2.16/28 of node n1",
                ],
            ),
            // /31 and /32 have none (RFC 3021).
            (&["10.0.0.0/31", "10.0.0.4/32"], &[]),
            (
                &["fd55::/64"],
                &["fd55:: subnet-router anycast address of fd55::/64 of node n1"],
            ),
            (&["fd56::/127"], &[]),
            // Outside every pool.
            (&["192.168.1.0/24", "fd99::/64"], &[]),
        ];
        for (subnets, want) in table {
            // Two fresh agents report them (see `subnet_edges`), n1 named first.
            let nodes = [on("n2", subnets), on("n1", subnets)];
            let got: Vec<String> = subnet_edges(&nodes, &BTreeMap::new(), &config)
                .iter()
                .map(|(ip, e)| {
                    format!(
                        "{ip} {}",
                        e.to_string()
                            .replacen("the ", "", 1)
                            .replace(" of subnet ", " of ")
                    )
                })
                .collect();
            assert_eq!(got, *want, "{subnets:?}");
        }
    }

    #[test]
    fn service_ranges_fence_the_pool_addresses_in_them_and_name_the_entries() {
        let config = config(&[
            (
                "default",
                "10.96.0.1-10.96.0.3\n10.80.0.1\n10.95.255.254-10.96.0.0",
            ),
            ("six", "fd00:96::/126"),
        ]);
        let ranges: Vec<IpNet> = vec![
            "10.96.0.0/12".parse().unwrap(),
            "fd00:96::/112".parse().unwrap(),
        ];
        let got: Vec<String> = service_range_withheld(&config, &ranges)
            .iter()
            .map(|(ip, r)| format!("{ip} {}", r.cidr))
            .collect();
        assert_eq!(
            got,
            [
                "10.96.0.0 10.96.0.0/12",
                "10.96.0.1 10.96.0.0/12",
                "10.96.0.2 10.96.0.0/12",
                "10.96.0.3 10.96.0.0/12",
                "fd00:96::1 fd00:96::/112",
                "fd00:96::2 fd00:96::/112",
                "fd00:96::3 fd00:96::/112",
            ]
        );
        let clashes: Vec<String> = service_range_clashes(&config, &ranges)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            clashes,
            [
                "key default, line 1: 10.96.0.1-10.96.0.3 are in the Service ClusterIP range 10.96.0.0/12: never allocated",
                "key default, line 3: 10.96.0.0 is in the Service ClusterIP range 10.96.0.0/12: never allocated",
                "key six, line 1: fd00:96::1-fd00:96::3 are in the Service ClusterIP range fd00:96::/112: never allocated",
            ]
        );
        assert!(service_range_withheld(&config, &[]).is_empty());
        // A huge overlap is withheld up to the bound, lowest first.
        let big = self::config(&[("default", "10.96.0.0-10.97.255.255")]);
        let withheld = service_range_withheld(&big, &ranges);
        assert_eq!(withheld.len(), MAX_SERVICE_RANGE_WITHHELD);
        assert_eq!(
            withheld.keys().next(),
            Some(&"10.96.0.0".parse::<IpAddr>().unwrap())
        );
    }
}
