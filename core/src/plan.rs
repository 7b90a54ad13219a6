//! The controller's planner: a level-triggered pass from observed state to the desired
//! state of every LoadBalancer Service, global or narrowed to what changed. Pure: no I/O, no clock (time comes in as
//! [`Inputs::now`]).
//!
//! The [`Planner`] owns the authoritative assignment table for one leadership term. The
//! controller's caches lag behind its own writes, so observed status is trusted exactly
//! once: the first pass imports every observed assignment (oldest Service first) before
//! allocating anything new. After that the table is the truth and observed status is only
//! compared against the output to decide what to write.
//!
//! A full pass ([`Planner::plan`]):
//! 1. releases the Services gone from the inputs (their IPs serve waiting Services in the
//!    same pass, unless held for the re-creation of a deleted one) and remembers their IPs
//!    for sticky re-creation ([`sticky`]);
//! 2. on a new pool config, rebuilds the ledgers from the table and clears assignments that
//!    left their namespace's pool;
//! 3. withholds the addresses of the Service ClusterIP ranges, those a fresh agent reports
//!    answered on the LAN by a foreign host, those Nodes have ([`node_addresses`]) and the
//!    edges of the subnets nodes are on ([`withheld`]), clearing an assignment that holds one
//!    of the first two (the operator's data and the LAN renumber; a node's own word only
//!    keeps an address from being allocated), and gives back to their pool those no longer
//!    withheld;
//! 4. on the first pass, imports observed assignments; an address no assignment object of
//!    ours gives a node while an agent reports holding it waits for that agent to let go
//!    before a node is elected (a graceful move off it: no double holder);
//! 5. allocates, in (created, namespace, name) order ([`allocation`]); Services already holding
//!    what they asked for, unchanged since, are skipped; if an address was freed mid-sweep,
//!    the pending Services are swept again so the oldest one still gets it this pass;
//! 6. places every IP group on a node, break-before-make ([`placement`]), and marks the first
//!    claims ([`PlanOutput::probe`]);
//! 7. renders a [`ServicePlan`] per Service and the transition [`PlanEvent`]s.
//!
//! **Narrowed passes.** [`Planner::plan_changes`] takes what changed since the last pass
//! ([`Changes`]: Services, nodes with their agents, endpoint sets) and re-plans only what
//! that can affect, with the same result as a full pass (the property test
//! `tests/plan_incremental.rs` compares the two after every step of random histories). The
//! planner keeps the views of the last pass (`Arc`s), what it saw of every node and agent
//! report, and the IPs visible for the quarantine as counts, so a narrowed pass reads
//! neither `inputs.services` nor the unchanged nodes. It escalates to a full pass by itself
//! (over its own views, updated by `changes.services`) on the first pass and whenever
//! something global differs from the last pass: the pool config, [`Inputs::lingering`],
//! [`Inputs::respect_cordon`], [`Inputs::agents_unobservable`], or the withheld addresses (the Node
//! addresses, or the set of LAN conflicts the agents report). Not the namespace labels
//! ([`Inputs::namespaces`]): they decide which pools a namespace may draw *new* addresses
//! from, what a relabelled namespace holds stays its own ([`Tenancy::keeps`]), and the
//! Services waiting for an address are swept on every pass. Otherwise a narrowed pass:
//! 1. releases the Services gone (or re-created under a new uid);
//! 2. sweeps, in (created, namespace, name) order, the changed Services and every one whose
//!    allocation is not as asked (an address freed goes to the oldest pending one): the
//!    full sweep skips every other Service (settled and unchanged), so this is the same
//!    subsequence of it;
//! 3. places again every group of a Service swept, changed (its group before and after) or
//!    whose endpoints changed; every group using an address a changed agent report gained,
//!    dropped or reports a conflict for; for a node whose Node or agent state changed,
//!    every group on it, moving off it or announced by it, every group with an address in
//!    its subnets before or after (the election's subnet rule compares nodes with each
//!    other), and every group on no node (pending, or in L3 mode); for a report that
//!    changed beyond single addresses (interfaces, routing, MACs), every group on it,
//!    moving off it or announced by it. The election keeps a current holder that stays
//!    eligible whatever the load ([`crate::election::elect`]), so a group not listed stays
//!    where it is; the load is kept up to date as groups move, never counted again;
//! 4. renders the members of those groups and the Services swept, in the order of a full
//!    pass, so the Events come in the same order.
//!
//! Its output holds the plans of the Services it rendered only (a superset of those whose
//! plan changed); Events, releases and first claims are complete. Cost: O(changes x log
//! n) plus what they affect; a node's state changing walks the groups once (no
//! allocation).
//!
//! **Quarantine.** Observed status also withholds: an IP taken from a Service (its request
//! moved, its pool changed, it stopped being ours: type or class changed, deleted) while the
//! API still shows it on that Service, or while any agent still reports holding it, is not
//! handed to anyone else until a pass sees neither. Only fresh agents count: a stale one's
//! aliases have outlived their kernel lifetime, and the Lease of a node that died without
//! a SIGTERM would otherwise keep its IPs out of their pool for ever. The writes of one pass run
//! concurrently, so without this the new holder's status could land before the old holder's
//! clear and the API would show one IP on two Services; and the old holder's node could
//! still answer for it when the new one's takes it. A Service that is no longer ours is not
//! in `services`: the IPs the API still shows on it come in as [`Inputs::lingering`].
//!
//! **Held for re-creation.** The IPs a deleted Service released (one that still exists but
//! stopped being ours, [`Inputs::not_ours`], is only quarantined instead) are held for its
//! namespace/name for [`Planner::with_hold`] (at most [`STICKY_FOR`], the default): kept in
//! use in their ledger for no Service, so the lowest free address skips them, a request by
//! another Service fails with `RequestedIPReserved`, and an exhausted pool's message names
//! them. The Service re-created under that name takes them back (sticky); once it holds
//! addresses, or the hold has passed ([`Planner::next_release`] says when), what is left
//! goes back to the pool.
//!
//! **Node addresses.** An address a Node has (an IP in its `status.addresses`, of any type:
//! InternalIP, ExternalIP; either family) is never handed out, even when a pool lists it: the
//! node elected for the Service would answer ARP or neighbour discovery for another node's
//! own address. It comes in as [`Inputs::node_addresses`] and is kept in use in its pool's
//! ledger for as long as a Node lists it, so neither the lowest free address nor a sticky
//! one can be it, and a request for it fails with `NodeAddress`. Pool usage counts such an
//! address neither in the pool nor in use. [`node_address_clashes`] lists the pool entries
//! concerned, by key and line, for the Warning on the pool ConfigMap.
//!
//! **A node's word never renumbers.** A Node's addresses are written by its own kubelet
//! (NodeRestriction lets a node write its own Node), so they are that node's word, as are
//! the subnets its agent reports: evidence about that node, never a reason to take an
//! address from a Service another node holds (only the LAN or the operator renumber). A
//! Service that holds an address a node claims (imported on a leader's first pass, or the
//! node claimed it later) keeps it: a Warning `NodeClaim` names the address, the node and
//! what it claimed (once per claim, and again on a new leader's first pass), its condition
//! IPAllocated says True `NodeClaim` with the same, and once the Service lets go of the
//! address it is not handed out while the claim lasts. A compromised node can so keep
//! addresses from being allocated (the Warning on the pool ConfigMap names them), never
//! move one.
//!
//! **Subnet edges.** The network and broadcast address of an IPv4 subnet a node is on (up to
//! /30) and the subnet-router anycast address of an IPv6 one (up to /126), as the *fresh*
//! agents report their subnets, are withheld like a Node's address where the subnet holds one
//! of that node's own Node addresses, or at least two fresh agents report it
//! ([`subnet_edges`]): one node's report alone could otherwise withhold any /30 of any pool. A
//! pool range may list them (a pool CIDR skips its own), but a node holding one would answer
//! for the subnet's broadcast or anycast traffic. A request for one fails with
//! `SubnetAddress`. While the agents are unobservable the edges of the last pass stay.
//!
//! **Service ClusterIP ranges.** A pool address in a Service ClusterIP range (a
//! `ServiceCIDR`, [`Inputs::service_ranges`]) is withheld the same way, at most
//! [`MAX_SERVICE_RANGE_WITHHELD`] of them ([`service_range_withheld`]); a request for one fails
//! with `ServiceRange`, and [`service_range_clashes`] names the pool entries for the Warning
//! on the pool ConfigMap.
//!
//! **LAN conflicts.** Before a first claim the agent probes the LAN (RFC 5227 ARP probe,
//! RFC 4862 DAD); an answer means another host owns the address, and the agent reports a
//! conflict with the MAC it saw. A host claiming an address the agent already holds is
//! reported too, marked [`crate::report::Conflict::while_held`]; the agent defends the
//! address (RFC 5227 2.4 (c)) and such a claim **never withholds** it: the Service keeps its
//! address, Announced True `AddressDefended` while the agent holds it (False
//! `AddressConflict` if it let go), with a Warning Event naming the MAC, unless its pool
//! says `onConflict: renumber`, when it withholds it like an answered probe. An answered
//! probe's address, reported by a *fresh* agent, held by no agent (fresh or stale) and
//! answered by a MAC that is none of the agents' interfaces ([`lan_conflicts`]), is withheld exactly like
//! a Node's address: kept in use in its pool's ledger for no Service, so lowest free,
//! sticky and requested all find it taken, and a request for it fails with
//! `AddressConflict`. A Service holding it loses it with an `AddressConflict` Warning naming
//! the IP, the MAC, the interface and the reporting node, then gets another free address of
//! its pool in the same pass, or stays pending with `AddressConflict` (not `PoolExhausted`),
//! the message naming the conflicted addresses. It is no longer withheld once no fresh agent reports
//! the conflict (the agent re-probes with backoff and drops it when nobody answers); while
//! the agents are unobservable it stays as it was. A conflict for an address some agent
//! holds (two nodes claim it) or with a node's MAC withholds nothing: the assignment is kept,
//! Announced False `AddressConflict`, and the agent not assigned the address drops it; a
//! conflict without a MAC (the address is configured on the node by another owner) is not
//! one either. Pool usage counts a withheld address neither in the pool nor in use. A host
//! (one MAC) answering for [`LAN_HOST_BOUND`] addresses or more (proxy ARP, forged answers)
//! renumbers nothing ([`lan_withheld`]): its addresses stay withheld from allocation, but a
//! Service holding one keeps it, Announced False `AddressConflict` saying why, so one host
//! pushes an allocation at most `LAN_HOST_BOUND - 1` addresses instead of through the pool.
//! The rule reads nothing but the current conflicts: a new leader decides as the last one.
//!
//! **First claims.** An IP placed on a node while no agent reports holding it, in a group
//! no node carried before (a new allocation, or a group that was pending), is a first claim
//! ([`PlanOutput::probe`]): the agent probes before taking it. A takeover (hard loss,
//! graceful move, partition) has a known holder and is never one. The flag ends once the
//! node's agent reports holding the IP, so a later restart of that agent re-adds it
//! without waiting.
//!
//! An *IP group* is what moves between nodes as one: a Service without a sharing key, or
//! all Services of a namespace with the same sharing key (which share one IP per family).
//!
//! Cost: a full pass is O(n log n) in Services plus O(groups x nodes) for election; every
//! look-up goes through an index (IP -> users and ports, group -> members and node,
//! node -> load, namespace -> pool). Groups are placed in the order of their oldest member,
//! so the output is deterministic.

mod allocation;
mod incremental;
mod node_addresses;
mod placement;
mod sticky;
mod withheld;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use ipnet::IpNet;
use litemap::LiteMap;

use crate::election::NodeState;
use crate::ledger::Ledger;
use crate::pool::{Labels, PoolConfig, PoolKey, Tenancy};
use crate::range::Family;
use crate::report::AgentReport;
use crate::text;

pub use incremental::Changes;
pub use node_addresses::{NodeAddress, NodeAddressClash, node_address_clashes};
pub use sticky::{STICKY_CAPACITY, STICKY_FOR};
pub use withheld::{
    EDGE_REPORTERS, LAN_HOST_BOUND, LanConflict, MAX_SERVICE_RANGE_WITHHELD, ServiceRange,
    ServiceRangeClash, SubnetEdge, WithheldCause, lan_conflicts, lan_withheld,
    service_range_clashes, service_range_withheld, subnet_edges,
};

/// Longest condition message or Event message the planner emits, in bytes; longer ones
/// are cut on a character boundary, ending in `...` ([`crate::text::bounded`]). Messages
/// quote text from outside (an agent's conflict reason, a user's annotation); the API
/// refuses a condition message over 32,768 bytes and an Event note over 1,024.
pub const MAX_MESSAGE: usize = 1024;

/// Most Service ports one address carries (a Service's own, or those of every Service
/// sharing it): each is a word of the address's line in its node's assignment object, so
/// one tenant's Services cannot make that object, which every Service on the node shares,
/// too large to write (about 2.6 KiB for a line at the bound).
pub const MAX_PORTS_PER_IP: usize = 256;

/// Condition and Event reasons the planner emits (CamelCase, stable: users grep for them).
pub mod reason {
    /// IPAllocated True: every wanted address is assigned.
    pub const ALLOCATED: &str = "Allocated";
    /// The Service's namespace has no pool and there is no fallback pool.
    pub const NO_POOL: &str = "NoPool";
    /// Every address of the wanted family is in use.
    pub const POOL_EXHAUSTED: &str = "PoolExhausted";
    /// The pool has no address of a family the Service needs.
    pub const NO_ADDRESS_OF_FAMILY: &str = "NoAddressOfFamily";
    /// A requested IP lies outside the namespace's pool.
    pub const REQUESTED_IP_NOT_IN_POOL: &str = "RequestedIPNotInPool";
    /// A requested IP is used by another Service that it may not share with.
    pub const REQUESTED_IP_IN_USE: &str = "RequestedIPInUse";
    /// A requested IP is an address a Node has (never allocated); also the Warning Event
    /// on the pool ConfigMap listing the pool entries that cover one.
    pub const NODE_ADDRESS: &str = "NodeAddress";
    /// The Service has more ports than one address carries ([`MAX_PORTS_PER_IP`]), or
    /// sharing its address would put more on it.
    ///
    /// [`MAX_PORTS_PER_IP`]: crate::plan::MAX_PORTS_PER_IP
    pub const TOO_MANY_PORTS: &str = "TooManyPorts";
    /// The requested IP is held for a deleted Service, in case it is re-created (see
    /// [`STICKY_FOR`](crate::plan::STICKY_FOR)).
    pub const REQUESTED_IP_RESERVED: &str = "RequestedIPReserved";
    /// The requested IP is the network or broadcast address of a subnet a node is on.
    pub const SUBNET_ADDRESS: &str = "SubnetAddress";
    /// IPAllocated True (and Warning Event): a node claims an address the Service holds
    /// (its Node lists it, or it is an edge of a subnet the node reports); a node's word
    /// never takes an address from a Service, so the Service keeps it (see
    /// [`WithheldCause::renumbers`](crate::plan::WithheldCause::renumbers)).
    pub const NODE_CLAIM: &str = "NodeClaim";
    /// The requested IP is in a Service ClusterIP range (a `ServiceCIDR`); also the
    /// Warning Event on the pool ConfigMap listing the pool entries that overlap one.
    pub const SERVICE_RANGE: &str = "ServiceRange";
    /// The request annotation or field is malformed or contradicts the Service.
    pub const INVALID_REQUEST: &str = "InvalidRequest";
    /// Sharing an IP would put two Services on the same port and protocol.
    pub const PORT_CLASH: &str = "PortClash";
    /// The pool does not allow sharing (`allowSharing: false`).
    pub const SHARING_NOT_ALLOWED: &str = "SharingNotAllowed";
    /// The Service requests an IP other than the one its sharing group already uses.
    pub const SHARING_KEY_CONFLICT: &str = "SharingKeyConflict";
    /// Announced True: the elected node's agent holds every IP.
    pub const ANNOUNCED: &str = "Announced";
    /// Announced True: the standby holds every IP, taken over on the LAN when the
    /// elected node's adverts stopped (fast L2 failover); the controller confirms it as
    /// the holder once the elected node's Lease expires.
    pub const TAKEN_OVER: &str = "TakenOver";
    /// Announced False: no IP allocated yet.
    pub const NOT_ALLOCATED: &str = "NotAllocated";
    /// Announced False: waiting for the elected node's agent to add the IPs.
    pub const WAITING_FOR_AGENT: &str = "WaitingForAgent";
    /// Announced False (and Warning Event): no node may carry the IPs.
    pub const NO_ELIGIBLE_NODE: &str = "NoEligibleNode";
    /// Announced False (and Warning Event): no agent is seen renewing (the controller
    /// cannot see the agents); every node keeps what it carries, none is elected.
    pub const AGENTS_UNOBSERVABLE: &str = "AgentsUnobservable";
    /// Announced False: graceful move, waiting for the old node to release the IPs.
    pub const MOVING: &str = "Moving";
    /// Announced False (and Warning Event): the agent reports a foreign owner of an IP.
    pub const ADDRESS_CONFLICT: &str = "AddressConflict";
    /// Announced True (and Warning Event naming the MAC): the holder's agent heard another
    /// host claim one of the IPs on the LAN and defended it (RFC 5227 2.4 (c)); the Service
    /// keeps its address (the pool's `onConflict: defend`, the default).
    pub const ADDRESS_DEFENDED: &str = "AddressDefended";
    /// Announced True, L3 mode: some of the chosen nodes announce every IP over BGP, others
    /// do not (the message names them and why).
    pub const PARTIALLY_ANNOUNCED: &str = "PartiallyAnnounced";
    /// Announced False, L3 mode: the chosen nodes hold the IPs but no routing daemon
    /// exports them to an Established peer (the message says why, node by node).
    pub const NOT_ANNOUNCED: &str = "NotAnnounced";
    /// Event: an IP was assigned.
    pub const IP_ALLOCATED: &str = "IPAllocated";
    /// Warning Event: the Service is (still) missing an IP, with the reason.
    pub const ALLOCATION_FAILED: &str = "AllocationFailed";
    /// Event: a node was elected for the IPs.
    pub const NODE_ASSIGNED: &str = "NodeAssigned";
    /// Event: the IPs leave their node, with why.
    pub const NODE_MOVED: &str = "NodeMoved";
    /// Event: IPs were released.
    pub const RELEASED: &str = "Released";
    /// Warning Event: an assignment was dropped (outside the pool, collision, pool edit,
    /// a Node's address).
    pub const CLEAR_ASSIGNMENT: &str = "ClearAssignment";
    /// The Service names (`aliaslb.io/pool`) a pool its namespace may not draw from: the
    /// tenant fence.
    pub const POOL_NOT_ALLOWED: &str = "PoolNotAllowed";
    /// The Service names (`aliaslb.io/pool`) no pool of the ConfigMap.
    pub const UNKNOWN_POOL: &str = "UnknownPool";
    /// The address would come from a draining pool or entry: none is handed out anew.
    pub const POOL_DRAINING: &str = "PoolDraining";
    /// The namespace has pools, but none assigns addresses unasked (each is `autoAssign:
    /// false` or draining): the Service must name one or request an address.
    pub const NO_DEFAULT_POOL: &str = "NoDefaultPool";
}

/// Every agent's report, by node name, each shared ([`Inputs::agents`]).
pub type Reports = BTreeMap<String, Arc<AgentReport>>;

/// Identifies a Service. Displays as `namespace/name`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
///
/// Both parts are shared strings: the planner's tables, the controller's cache and every
/// plan hold the same key many times over, and a clone is two reference-count bumps.
pub struct ServiceKey {
    /// Namespace.
    pub namespace: Arc<str>,
    /// Name.
    pub name: Arc<str>,
}

impl ServiceKey {
    /// The key of Service `name` in `namespace`.
    pub fn new(namespace: &str, name: &str) -> Self {
        ServiceKey {
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for ServiceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// The IP families a Service wants (`spec.ipFamilies` + `spec.ipFamilyPolicy`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FamilyPolicy {
    /// Wanted families, primary first. One family: SingleStack; two: dual-stack.
    pub families: Vec<Family>,
    /// RequireDualStack: all families or none. False with two families: PreferDualStack.
    pub require_all: bool,
}

/// A port of a Service, for clash checks between Services sharing an IP.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PortKey {
    /// Port number.
    pub port: i32,
    /// Protocol (`TCP`, `UDP`, `SCTP`); shared, as a port is indexed several times.
    pub protocol: Arc<str>,
}

impl fmt::Display for PortKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.port, self.protocol)
    }
}

/// One LoadBalancer Service of ours, as plain data.
#[derive(Debug, Clone, PartialEq)]
pub struct ServiceView {
    /// Namespace and name.
    pub key: ServiceKey,
    /// `metadata.uid`: a new uid under the same key is a re-created Service.
    pub uid: Arc<str>,
    /// Creation timestamp (unix seconds); allocation order is (created, namespace, name).
    pub created: i64,
    /// Wanted families.
    pub families: FamilyPolicy,
    /// `spec.loadBalancerIP` / `aliaslb.io/loadBalancerIPs`; `Err(message)` if malformed.
    pub requested: Result<Vec<IpAddr>, String>,
    /// `aliaslb.io/sharing-key`.
    pub sharing_key: Option<String>,
    /// `aliaslb.io/pool` as written: the pool the Service draws from (see
    /// [`crate::pool::Tenancy`]); `None`: its namespace's default.
    pub pool: Option<String>,
    /// Ports, for sharing clash checks.
    pub ports: Vec<PortKey>,
    /// `externalTrafficPolicy: Local`.
    pub local_traffic: bool,
    /// `status.loadBalancer.ingress[].ip` as observed; read on the first pass only.
    pub observed_ips: Vec<IpAddr>,
    /// `aliaslb.io/node` as observed; read on the first pass only.
    pub observed_node: Option<String>,
}

/// Everything one pass looks at.
#[derive(Debug, Clone, Copy)]
pub struct Inputs<'a> {
    /// The last valid pool config.
    pub config: &'a PoolConfig,
    /// The labels of every namespace, by name, for the pools that grant by
    /// `namespaceSelector` ([`PoolConfig::tenancy`]); a namespace missing has none. Read
    /// for the Services a pass decides on (a change of them calls for no more: see
    /// "Narrowed passes" in the module docs).
    pub namespaces: &'a BTreeMap<String, Labels>,
    /// Every LoadBalancer Service that is ours (one entry per key). Not read by
    /// [`Planner::plan_changes`] unless [`Changes::everything`] is set.
    pub services: &'a [Arc<ServiceView>],
    /// Every node (one entry per name); `agent_ready` already judged on the controller's
    /// monotonic clock.
    pub nodes: &'a [NodeState],
    /// Node name -> its agent's latest report (shared: the controller keeps one copy of
    /// each report, and a planner remembers the last ones it saw without copying them).
    pub agents: &'a Reports,
    /// IPs the API still shows on Services that are no longer ours (type or class
    /// changed): quarantined, not free.
    pub lingering: &'a BTreeSet<IpAddr>,
    /// Every IP a Node lists in `status.addresses`, with the Node and the address type:
    /// never allocated (see the module docs).
    pub node_addresses: &'a BTreeMap<IpAddr, NodeAddress>,
    /// Services that still exist but are no longer ours (type or class changed): the IPs
    /// they release are not held for a re-creation ([`Planner::with_hold`]), only
    /// quarantined while the API shows them.
    pub not_ours: &'a BTreeSet<ServiceKey>,
    /// The Service ClusterIP ranges (the `ServiceCIDR`s, where the server serves them):
    /// no pool address in them is allocated (see the module docs).
    pub service_ranges: &'a [IpNet],
    /// Service -> nodes with a ready local endpoint (for `externalTrafficPolicy: Local`).
    pub local_endpoints: &'a BTreeMap<ServiceKey, BTreeSet<String>>,
    /// Whether cordoned nodes are ineligible.
    pub respect_cordon: bool,
    /// No agent is seen renewing while some agent exists: the controller is blind, not
    /// every node dead. The node step then keeps every assignment and elects no node
    /// ([`reason::AGENTS_UNOBSERVABLE`]).
    pub agents_unobservable: bool,
    /// The controller's monotonic clock, for sticky re-creation.
    pub now: Instant,
}

/// Desired state of one Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServicePlan {
    /// Desired `status.loadBalancer.ingress` IPs, primary family first (may be empty).
    pub ips: Vec<IpAddr>,
    /// Desired `aliaslb.io/node`; `None` while pending or in the middle of a move, and in
    /// L3 mode (see [`ServicePlan::nodes`]).
    pub node: Option<Arc<str>>,
    /// L3 mode (`announce: bgp`): every node that announces the IPs, by name; empty in L2
    /// mode.
    pub nodes: Vec<Arc<str>>,
    /// Desired `aliaslb.io/interface` (from the pool options; `None`: no annotation).
    pub interface: Option<String>,
    /// The pool answers each IP from its own MAC (`virtualMAC: true`, L2 only): the
    /// assignment lines carry `vmac=`.
    pub virtual_mac: bool,
    /// L2 mode: the node standing by for the IPs (fast failover), with its address on the
    /// subnet of each IP it can take over; `None`: no standby. (Boxed: inline it was a
    /// third of a plan, and the index keeps a plan per Service.)
    pub standby: Option<Box<Standby>>,
    /// Condition `aliaslb.io/IPAllocated`.
    pub allocated: ConditionPlan,
    /// Condition `aliaslb.io/Announced`.
    pub announced: ConditionPlan,
}

impl ServicePlan {
    /// The value of `aliaslb.io/node`: the elected node in L2 mode, the announcing nodes
    /// comma-separated in L3 mode; `None` while there is none.
    pub fn node_annotation(&self) -> Option<std::borrow::Cow<'_, str>> {
        match (&self.node, self.nodes.is_empty()) {
            (Some(node), _) => Some(node.as_ref().into()),
            (None, false) => Some(self.nodes.join(",").into()),
            (None, true) => None,
        }
    }

    /// Whether `other` gives the same node assignment lines as this plan: the same IPs,
    /// nodes, standby, interface and virtual MAC (what the controller's
    /// `assignments::desired` reads of a plan). The conditions are the Service's
    /// status only: a plan that differs in them alone rewrites no node's lines.
    pub fn same_lines(&self, other: &ServicePlan) -> bool {
        let ServicePlan {
            ips,
            node,
            nodes,
            interface,
            virtual_mac,
            standby,
            allocated: _,
            announced: _,
        } = self;
        *ips == other.ips
            && *node == other.node
            && *nodes == other.nodes
            && *interface == other.interface
            && *virtual_mac == other.virtual_mac
            && *standby == other.standby
    }
}

/// The standby of a Service's IPs (fast L2 failover).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Standby {
    /// The standby node.
    pub node: Arc<str>,
    /// For each IP it stands by for: its own address on that IP's subnet, where the
    /// holder's adverts go.
    pub addresses: OnSubnets,
    /// A third node on the LAN that relays the holder's adverts to the standby, with its
    /// address on each IP's subnet (`None`: no third node qualifies).
    pub relay: Option<(Arc<str>, OnSubnets)>,
}

/// A node's own address on the subnet of each IP, as (IP, address) pairs.
pub type OnSubnets = Vec<(IpAddr, IpAddr)>;

/// Desired state of one Service condition.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ConditionPlan {
    /// `True` / `False`.
    pub status: bool,
    /// CamelCase reason, one of [`reason`].
    pub reason: &'static str,
    /// Human-readable message, at most [`MAX_MESSAGE`] bytes.
    pub message: String,
}

/// An Event to record on a Service. Emitted on transitions only, never once per pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanEvent {
    /// The Service.
    pub service: ServiceKey,
    /// Warning (true) or Normal.
    pub warning: bool,
    /// CamelCase reason, one of [`reason`].
    pub reason: &'static str,
    /// Human-readable message, at most [`MAX_MESSAGE`] bytes.
    pub message: String,
}

/// Result of one pass.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PlanOutput {
    /// Desired state of every Service in the inputs; after a narrowed pass
    /// ([`Planner::plan_changes`]) of every Service it re-planned, a superset of those
    /// whose plan changed. (Boxed: a caller that keeps the plans, as the controller's index
    /// does, takes each box as it is; the map and the sorted list `collect` builds it
    /// from hold a key and a pointer per Service, not a plan.)
    pub services: BTreeMap<ServiceKey, Box<ServicePlan>>,
    /// Transition Events, in a deterministic order.
    pub events: Vec<PlanEvent>,
    /// Services gone from the inputs, with the IPs they held (an IP still used by another
    /// Service of its sharing group stays in use).
    pub released: Vec<(ServiceKey, Vec<IpAddr>)>,
    /// The planned IPs that are first claims: placed on a node while no agent (fresh or
    /// stale) reported holding them and no node carried their group before (a new
    /// allocation, or a group that was pending), and not yet held by that node's agent.
    /// Their assignment lines say `probe`; a takeover from a known holder never does.
    pub probe: BTreeSet<IpAddr>,
}

/// Size and use of one family of one pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolUsage {
    /// The pool.
    pub pool: PoolKey,
    /// The family.
    pub family: Family,
    /// Addresses of the family in the pool (saturating), less those a Node has (never
    /// allocated); a draining address counts only while it is in use
    /// ([`crate::ledger::Usage`]).
    pub total: u128,
    /// Addresses handed out (or quarantined).
    pub in_use: u128,
    /// Of those, addresses of draining entries (or of a draining pool): left to move.
    pub draining: u128,
}

/// A [`LiteMap`] of exactly `pairs`. `collect` and a first `insert` give a map room for
/// four pairs, and most of the planner's small maps hold one (a Service's IP of a family,
/// the ports on an IP, a group's member): at 10,000 Services that spare room was about
/// 4 MB of the controller's peak.
fn tight_map<K: Ord, V, I>(pairs: I) -> LiteMap<K, V>
where
    I: IntoIterator<Item = (K, V), IntoIter: ExactSizeIterator>,
{
    let pairs = pairs.into_iter();
    let mut map = LiteMap::with_capacity(pairs.len());
    for (key, value) in pairs {
        map.insert(key, value);
    }
    map
}

/// [`LiteMap::insert`], growing a full map by the one pair rather than to twice its size
/// (see [`tight_map`]).
fn insert_tight<K: Ord, V>(map: &mut LiteMap<K, V>, key: K, value: V) -> Option<V> {
    if !map.contains_key(&key) {
        let mut pairs = std::mem::take(map).into_tuple_vec();
        pairs.reserve_exact(1);
        *map = LiteMap::from_sorted_store_unchecked(pairs);
    }
    map.insert(key, value)
}

/// The stateful planner: one per leadership term. See the module docs.
#[derive(Debug, Default)]
pub struct Planner {
    /// The config the ledgers were built from; `None` before the first pass.
    config: Option<PoolConfig>,
    /// One ledger per pool.
    ledgers: BTreeMap<PoolKey, Ledger>,
    /// Every Service seen in the last pass, assigned or pending. (The records of this
    /// table and the next two are boxed: a hash table keeps up to half of its buckets
    /// empty, and an empty bucket costs a pointer rather than a record; see
    /// [`tests::the_records_kept_per_service_stay_small`].)
    entries: HashMap<ServiceKey, Box<Entry>>,
    /// Every IP in use: its pool, group and users.
    ips: HashMap<IpAddr, Box<IpUse>>,
    /// Every IP group holding at least one IP.
    groups: HashMap<GroupId, Box<Group>>,
    /// IPs of recently released Services, for sticky re-creation.
    recent: sticky::Recent,
    /// The IPs of [`Planner::recent`] no other Service uses, reserved for the key that
    /// released them: kept in use in their ledger until that key takes them back or
    /// [`Planner::hold`] has passed (see the module docs).
    reserved: BTreeMap<IpAddr, ServiceKey>,
    /// How long a deleted Service's addresses are held for it.
    hold: Hold,
    /// Whether the first pass (import) has run.
    imported: bool,
    /// Addresses returned to a ledger during the current allocation sweep.
    freed: usize,
    /// Whether this pass brought a new config (every Service is then re-checked).
    config_changed: bool,
    /// IPs the API shows on one of the Services of this pass (their observed status),
    /// whether or not the table still gives them those IPs, or on a Service no longer ours
    /// ([`Inputs::lingering`]), or that a fresh agent reports holding: each with the number
    /// of such sightings, kept up to date from what changed (see [`incremental`]).
    visible: HashMap<IpAddr, u32>,
    /// The Services of the last pass, by key: a narrowed pass reads the unchanged ones here.
    views: HashMap<ServiceKey, Arc<ServiceView>>,
    /// The Services whose allocation is not as asked (`Entry::failure` set): swept again
    /// on every pass, narrowed or not.
    unsettled: HashSet<ServiceKey>,
    /// The groups with a first claim on a node ([`PlanOutput::probe`]), as of the last
    /// time each was placed.
    probing: HashSet<GroupId>,
    /// The number of groups on each node (zero or missing: none), kept up to date as
    /// groups move: the election's load, which a narrowed pass does not count again.
    load: BTreeMap<Arc<str>, usize>,
    /// What the last pass saw outside the Services, to tell what changed
    /// ([`incremental::Seen`]).
    seen: incremental::Seen,
    /// IPs taken from a Service while the API still showed them on it: kept in use in
    /// their ledger until no Service shows them any more (see [`Planner::quarantine`]).
    quarantined: BTreeSet<IpAddr>,
    /// The withheld addresses (in a Service ClusterIP range, answered on the LAN by a foreign
    /// host, a Node's, or a subnet's edge), as of this pass: kept in use in the ledger of
    /// the pool that lists them, for no Service unless one keeps an address a node claims
    /// ([`withheld`]).
    withheld: BTreeMap<IpAddr, WithheldCause>,
    /// The LAN hosts that answer for [`LAN_HOST_BOUND`] addresses or more, with those
    /// addresses, as of the last change of [`Planner::withheld`].
    lan_hosts: BTreeMap<crate::mac::Mac, Vec<IpAddr>>,
}

/// Allocation sweeps per pass at most: the first over every Service, the next ones over
/// the pending Services when the previous sweep freed addresses.
const MAX_SWEEPS: usize = 3;

/// What moves between nodes as one.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum GroupId {
    /// A Service without a sharing key.
    Single(ServiceKey),
    /// The Services of `namespace` with sharing key `key`.
    Shared { namespace: Arc<str>, key: String },
}

impl GroupId {
    fn of(view: &ServiceView) -> GroupId {
        match &view.sharing_key {
            Some(key) => GroupId::Shared {
                namespace: view.key.namespace.clone(),
                key: key.clone(),
            },
            None => GroupId::Single(view.key.clone()),
        }
    }

    /// Whether `view` belongs to this group (without building its id).
    fn is_of(&self, view: &ServiceView) -> bool {
        match (self, &view.sharing_key) {
            (GroupId::Single(key), None) => *key == view.key,
            (GroupId::Shared { namespace, key }, Some(sharing)) => {
                key == sharing && *namespace == view.key.namespace
            }
            _ => false,
        }
    }

    fn namespace(&self) -> &str {
        match self {
            GroupId::Single(key) => &key.namespace,
            GroupId::Shared { namespace, .. } => namespace,
        }
    }
}

/// An IP group's addresses and node.
#[derive(Debug, Default)]
struct Group {
    /// At most one IP per family, used by one or more members.
    ips: LiteMap<Family, IpAddr>,
    /// Services holding at least one of `ips` (a set: the values are `()`).
    members: LiteMap<ServiceKey, ()>,
    /// The node carrying the IPs; `None` while unplaced or moving. (Node names here and in
    /// the plans are the nodes' own, shared: a name per group and plan was megabytes.)
    node: Option<Arc<str>>,
    /// Graceful move in progress: the old node, waiting for its agent to release.
    moving_from: Option<Arc<str>>,
    /// Last NoEligibleNode message reported, so it is reported once.
    no_node: Option<String>,
    /// The IPs `node` was given, each with whether it is a first claim its agent must still
    /// probe ([`PlanOutput::probe`]); empty without a node.
    claims: Vec<(IpAddr, bool)>,
    /// L3 mode: the nodes announcing the IPs, by name (`node` is then `None`).
    announcers: Vec<Arc<str>>,
    /// L2 mode: the node standing by for the IPs (fast failover); `None` without a node
    /// or without a node that qualifies ([`crate::election::standby`]).
    standby: Option<Arc<str>>,
    /// L2 mode: the node relaying the holder's adverts to the standby.
    relay: Option<Arc<str>>,
}

/// One IP in use.
#[derive(Debug)]
struct IpUse {
    /// The pool (ledger) it came from.
    pool: PoolKey,
    /// Its group.
    group: GroupId,
    /// Services using it (more than one only within a sharing group; a set: the values
    /// are `()`).
    users: LiteMap<ServiceKey, ()>,
    /// Ports in use on it and by whom.
    ports: LiteMap<PortKey, ServiceKey>,
}

/// The planner's record of one Service.
#[derive(Debug)]
struct Entry {
    uid: Arc<str>,
    /// The group its IPs belong to (follows the sharing key).
    group: GroupId,
    /// At most one IP per family.
    ips: LiteMap<Family, IpAddr>,
    /// Ports indexed on its IPs.
    ports: Vec<PortKey>,
    /// Why the allocation is not as asked, if it is not. (This and the next two are
    /// boxed: rarely set, and inline they were a third of the table.)
    failure: Option<Box<Failure>>,
    /// The failure last reported by an AllocationFailed Event.
    reported: Option<Box<Failure>>,
    /// The AddressConflict message last reported.
    conflict: Option<Box<str>>,
    /// What the Service asked for (families, requested IPs) when it last got all of it.
    /// While the Service, its ports and the config stay the same, and the pool it names
    /// (if any) is the one its addresses are in, nothing can change its allocation, and the
    /// pass skips it.
    settled: Option<(FamilyPolicy, Vec<IpAddr>)>,
}

/// A reason the Service does not have every IP it asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Failure {
    reason: &'static str,
    message: String,
    /// The pool the Service waits on (it was to draw from it), if it came that far.
    pool: Option<PoolKey>,
}

impl Failure {
    fn new(reason: &'static str, message: impl Into<String>) -> Self {
        Failure {
            reason,
            message: message.into(),
            pool: None,
        }
    }

    /// The failure, waiting on `pool` (unless it names one already).
    fn on(mut self, pool: &PoolKey) -> Self {
        self.pool.get_or_insert_with(|| pool.clone());
        self
    }
}

/// What one pass reads, with the pools of each namespace looked up once.
struct Pass<'a> {
    inputs: &'a Inputs<'a>,
    tenancies: HashMap<&'a str, Tenancy<'a>>,
}

impl<'a> Pass<'a> {
    fn new(inputs: &'a Inputs<'a>) -> Self {
        let mut tenancies = HashMap::new();
        for view in inputs.services {
            let ns = &*view.key.namespace;
            tenancies.entry(ns).or_insert_with(|| tenancy(inputs, ns));
        }
        Pass { inputs, tenancies }
    }

    /// A pass that looks each namespace's pools up when asked (a narrowed pass, whose
    /// Services are few).
    fn lazy(inputs: &'a Inputs<'a>) -> Self {
        Pass {
            inputs,
            tenancies: HashMap::new(),
        }
    }

    /// The pools `namespace` may draw from ([`PoolConfig::tenancy`]).
    fn tenancy(&self, namespace: &str) -> std::borrow::Cow<'_, Tenancy<'a>> {
        match self.tenancies.get(namespace) {
            Some(found) => std::borrow::Cow::Borrowed(found),
            None => std::borrow::Cow::Owned(tenancy(self.inputs, namespace)),
        }
    }
}

/// The pools `namespace` may draw from, with its labels as `inputs` shows them.
fn tenancy<'a>(inputs: &Inputs<'a>, namespace: &str) -> Tenancy<'a> {
    inputs
        .config
        .tenancy(namespace, inputs.namespaces.get(namespace))
}

/// Events and releases collected during a pass.
#[derive(Debug, Default)]
struct Sink {
    events: Vec<PlanEvent>,
    released: Vec<(ServiceKey, Vec<IpAddr>)>,
}

impl Sink {
    fn event(
        &mut self,
        service: &ServiceKey,
        warning: bool,
        reason: &'static str,
        message: String,
    ) {
        self.events.push(PlanEvent {
            service: service.clone(),
            warning,
            reason,
            message: text::bounded(message, MAX_MESSAGE),
        });
    }
}

/// How long the addresses of a deleted Service are held for its re-creation: at most
/// [`STICKY_FOR`] (the planner remembers them no longer), [`STICKY_FOR`] by default, zero
/// for none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Hold(std::time::Duration);

impl Default for Hold {
    fn default() -> Self {
        Hold(STICKY_FOR)
    }
}

impl Planner {
    /// A planner with an empty table: its first pass imports observed assignments.
    pub fn new() -> Self {
        Self::default()
    }

    /// A planner that holds the addresses of a deleted Service for it during `hold` (at
    /// most [`STICKY_FOR`]; zero: not at all, a freed address goes to the next Service at
    /// once).
    pub fn with_hold(hold: std::time::Duration) -> Self {
        Planner {
            hold: Hold(hold.min(STICKY_FOR)),
            ..Self::default()
        }
    }

    /// One global pass over every Service in `inputs`; see the module docs. The same as
    /// [`Planner::plan_changes`] with [`Changes::everything`].
    pub fn plan(&mut self, inputs: &Inputs<'_>) -> PlanOutput {
        let output = self.plan_everything(inputs);
        self.check_invariants();
        output
    }

    /// A pass that re-plans only what `changes` can affect (see "Narrowed passes" in the
    /// module docs), or everything when `changes.everything` is set or something global
    /// changed since the last pass (then the same as [`Planner::plan`]).
    ///
    /// `inputs` is as for [`Planner::plan`], every field current, except that without
    /// `changes.everything` `inputs.services` is not read at all (it may be empty): the
    /// Services come from `changes.services` and the planner's own copy of the views of
    /// the last pass, also when it escalates to a full pass. Of
    /// `inputs.nodes` and `inputs.agents` it compares only the entries of
    /// `changes.nodes` with what it saw before (and reads the others where a re-planned
    /// group needs them); of `inputs.local_endpoints` only the entries of re-planned
    /// Services. The output's `services` holds the plan of every Service re-planned this
    /// pass: a superset of those whose plan changed (all of them on a full pass); `events`,
    /// `released` and `probe` are complete, as from [`Planner::plan`].
    pub fn plan_changes(&mut self, inputs: &Inputs<'_>, changes: &Changes) -> PlanOutput {
        let output = self.plan_what_changed(inputs, changes);
        self.check_invariants();
        output
    }

    /// [`Planner::plan_changes`] before its check.
    fn plan_what_changed(&mut self, inputs: &Inputs<'_>, changes: &Changes) -> PlanOutput {
        if changes.everything {
            return self.plan_everything(inputs);
        }
        if self.must_plan_everything(inputs) {
            // Something global changed: every Service, as this planner knows them.
            let mut views = self.views.clone();
            for (key, view) in &changes.services {
                match view {
                    Some(view) => views.insert(key.clone(), Arc::clone(view)),
                    None => views.remove(key),
                };
            }
            let services: Vec<Arc<ServiceView>> = views.into_values().collect();
            return self.plan_everything(&Inputs {
                services: &services,
                ..*inputs
            });
        }
        self.plan_narrowed(inputs, changes)
    }

    /// What the steps rely on from each other, checked after every pass in debug builds
    /// (every test; nothing in release): an IP in use is in use in its pool's ledger, in
    /// its group and on each of its users' entries; a quarantined, reserved or withheld
    /// address is in use in the ledger that holds it (so the lowest free address is never
    /// one); every group's IPs are in use by it; and the election's load of each node is
    /// the number of groups placed there (a narrowed pass keeps it up to date instead of
    /// counting, so it must not drift). Panics naming the first that does not hold.
    fn check_invariants(&self) {
        if !cfg!(debug_assertions) {
            return;
        }
        for (ip, used) in &self.ips {
            let ledger = self.ledgers.get(&used.pool);
            assert!(
                ledger.is_some_and(|l| l.is_in_use(*ip)),
                "planner invariant: {ip} is used by {:?} but not in use in pool {}",
                used.users.keys().collect::<Vec<_>>(),
                used.pool
            );
            let family = Family::of(*ip);
            assert!(
                self.groups
                    .get(&used.group)
                    .is_some_and(|g| g.ips.get(&family) == Some(ip)),
                "planner invariant: {ip} is not among the IPs of its group {:?}",
                used.group
            );
            for user in used.users.keys() {
                assert!(
                    self.entries
                        .get(user)
                        .is_some_and(|e| e.ips.get(&family) == Some(ip)),
                    "planner invariant: {ip} names {user} as a user, whose entry does not hold it"
                );
            }
        }
        let kept = self
            .quarantined
            .iter()
            .chain(self.reserved.keys())
            .chain(self.withheld.keys());
        for ip in kept {
            if let Some(ledger) = self.ledgers.values().find(|l| l.contains(*ip)) {
                assert!(
                    ledger.is_in_use(*ip),
                    "planner invariant: {ip} is quarantined, reserved or withheld but free in its ledger"
                );
            }
        }
        let mut load: BTreeMap<&str, usize> = BTreeMap::new();
        for (id, group) in &self.groups {
            for ip in group.ips.values() {
                assert!(
                    self.ips.get(ip).is_some_and(|u| &u.group == id),
                    "planner invariant: group {id:?} lists {ip}, which is not in use by it"
                );
            }
            if let Some(node) = group.node.as_deref() {
                *load.entry(node).or_default() += 1;
            }
        }
        let kept: BTreeMap<&str, usize> = self
            .load
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(node, n)| (node.as_ref(), *n))
            .collect();
        assert_eq!(
            kept, load,
            "planner invariant: the election's load (left) is not the groups placed on each node (right)"
        );
    }

    /// The full pass: every Service of `inputs`.
    fn plan_everything(&mut self, inputs: &Inputs<'_>) -> PlanOutput {
        let pass = Pass::new(inputs);
        let mut sink = Sink::default();
        let mut order: Vec<&ServiceView> = inputs.services.iter().map(|v| &**v).collect();
        order.sort_by(|a, b| (a.created, &a.key).cmp(&(b.created, &b.key)));

        self.end_reservations_due(inputs.now);
        self.see_everything(inputs);
        self.release_gone(inputs, &mut sink);
        self.apply_config(inputs, &mut sink);
        self.withhold(inputs, &mut sink);
        self.lift_quarantine();
        if !self.imported {
            self.import(&order, &pass, &mut sink);
            self.imported = true;
        }
        self.sweep(order.clone(), &pass, &mut sink);
        for view in &order {
            self.report_failure(&view.key, &mut sink);
        }
        self.unsettled = self
            .entries
            .iter()
            .filter(|(_, e)| e.failure.is_some())
            .map(|(key, _)| key.clone())
            .collect();
        self.place(&pass, &order, true, &mut sink);
        let services = order
            .iter()
            .map(|view| {
                (
                    view.key.clone(),
                    Box::new(self.render(view, &pass, &mut sink)),
                )
            })
            .collect();
        self.probing = self
            .groups
            .iter()
            .filter(|(_, g)| g.node.is_some() && g.claims.iter().any(|(_, probe)| *probe))
            .map(|(id, _)| id.clone())
            .collect();
        PlanOutput {
            services,
            events: sink.events,
            released: sink.released,
            probe: self.probe(),
        }
    }

    /// The allocation sweep over `sweep` (in (created, namespace, name) order). An IP freed
    /// in the middle of the sweep (a request moved, a RequireDualStack Service let go of
    /// half its addresses) belongs to the oldest pending Service, which may already have
    /// been looked at: the pending ones are swept again.
    fn sweep(&mut self, mut sweep: Vec<&ServiceView>, pass: &Pass<'_>, sink: &mut Sink) {
        for _ in 0..MAX_SWEEPS {
            self.freed = 0;
            for view in &sweep {
                self.allocate(view, pass, sink);
            }
            if self.freed == 0 {
                break;
            }
            sweep.retain(|v| {
                self.entries
                    .get(&v.key)
                    .is_some_and(|e| e.failure.is_some())
            });
        }
    }

    /// The planned IPs that are first claims ([`PlanOutput::probe`]).
    fn probe(&self) -> BTreeSet<IpAddr> {
        self.probing
            .iter()
            .filter_map(|id| self.groups.get(id))
            .filter(|g| g.node.is_some())
            .flat_map(|g| g.claims.iter().filter(|(_, probe)| *probe))
            .map(|(ip, _)| *ip)
            .collect()
    }

    /// Size and use of every family of every pool, pools in key order, IPv4 first.
    pub fn usage(&self) -> Vec<PoolUsage> {
        let mut out = Vec::new();
        for (pool, ledger) in &self.ledgers {
            for family in [Family::V4, Family::V6] {
                let usage = ledger.usage(family);
                if usage.total > 0 || ledger.contains_family(family) {
                    let (mut withheld, mut withheld_closed) = (0u128, 0u128);
                    for (ip, _) in self.withheld_in(pool, family) {
                        withheld += 1;
                        withheld_closed += u128::from(ledger.is_closed(*ip));
                    }
                    out.push(PoolUsage {
                        pool: pool.clone(),
                        family,
                        total: usage.total.saturating_sub(withheld),
                        in_use: usage.in_use.saturating_sub(withheld),
                        draining: ledger.draining(family).saturating_sub(withheld_closed),
                    });
                }
            }
        }
        out
    }

    /// The Services whose allocation is not as asked and that wait on a pool (it is
    /// exhausted, draining, not theirs to draw from, ...), by pool, each list sorted; as
    /// of the last pass.
    /// O(pending).
    pub fn pending_on(&self) -> BTreeMap<PoolKey, Vec<ServiceKey>> {
        let mut out: BTreeMap<PoolKey, Vec<ServiceKey>> = BTreeMap::new();
        // `unsettled` is exactly the Services with a failure, kept by every pass.
        for key in &self.unsettled {
            let failure = self.entries.get(key).and_then(|e| e.failure.as_ref());
            if let Some(pool) = failure.and_then(|f| f.pool.as_ref()) {
                out.entry(pool.clone()).or_default().push(key.clone());
            }
        }
        for keys in out.values_mut() {
            keys.sort();
        }
        out
    }

    /// The pool of `key`'s addresses, else the one it waits on, as of the last pass.
    pub fn pool_of_service(&self, key: &ServiceKey) -> Option<&PoolKey> {
        let entry = self.entries.get(key)?;
        entry
            .ips
            .values()
            .find_map(|ip| self.ips.get(ip).map(|used| &used.pool))
            .or_else(|| entry.failure.as_ref().and_then(|f| f.pool.as_ref()))
    }

    /// IPs taken from a Service while the API still shows them on it, kept out of every
    /// pool until it no longer does (see the quarantine in the module docs).
    pub fn quarantined(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.quarantined.iter().copied()
    }

    /// The planner's table as text, every map sorted: entries, groups, IPs in use,
    /// quarantine, withheld, visible IPs, pending Services, first claims and the load of
    /// each node. For tests that compare two
    /// planners (a full and a narrowed one); not a stable format.
    #[doc(hidden)]
    pub fn fingerprint(&self) -> String {
        use std::fmt::Write as _;
        let mut out = String::new();
        let mut entries: Vec<_> = self.entries.iter().collect();
        entries.sort_by(|a, b| a.0.cmp(b.0));
        for (key, entry) in entries {
            let _ = writeln!(out, "entry {key}: {entry:?}");
        }
        let mut groups: Vec<_> = self.groups.iter().collect();
        groups.sort_by(|a, b| a.0.cmp(b.0));
        for (id, group) in groups {
            let _ = writeln!(out, "group {id:?}: {group:?}");
        }
        let mut ips: Vec<_> = self.ips.iter().collect();
        ips.sort_by(|a, b| a.0.cmp(b.0));
        for (ip, used) in ips {
            let _ = writeln!(out, "ip {ip}: {used:?}");
        }
        let mut visible: Vec<_> = self.visible.iter().collect();
        visible.sort();
        let mut unsettled: Vec<_> = self.unsettled.iter().collect();
        unsettled.sort();
        let mut probing: Vec<_> = self
            .probing
            .iter()
            .filter(|id| {
                self.groups
                    .get(*id)
                    .is_some_and(|g| g.node.is_some() && g.claims.iter().any(|c| c.1))
            })
            .collect();
        probing.sort();
        let _ = writeln!(out, "quarantined {:?}", self.quarantined);
        let _ = writeln!(out, "withheld {:?}", self.withheld);
        let _ = writeln!(out, "visible {visible:?}");
        let _ = writeln!(out, "unsettled {unsettled:?}");
        let _ = writeln!(out, "probing {probing:?}");
        let load: Vec<_> = self.load.iter().filter(|(_, n)| **n > 0).collect();
        let _ = writeln!(out, "load {load:?}");
        out
    }

    /// Number of Services whose allocation is not as asked (missing an IP, or a request
    /// that cannot be honoured), as of the last pass.
    pub fn pending(&self) -> usize {
        self.entries
            .values()
            .filter(|e| e.failure.is_some())
            .count()
    }

    /// The Services [`pending`](Self::pending) counts, by the reason of their failure (one
    /// of [`reason`]), as of the last pass; reasons no Service has are left out.
    pub fn pending_by_reason(&self) -> BTreeMap<&'static str, usize> {
        let mut out = BTreeMap::new();
        for failure in self.entries.values().filter_map(|e| e.failure.as_deref()) {
            *out.entry(failure.reason).or_default() += 1;
        }
        out
    }

    /// The Services [`pending`](Self::pending) counts, each with the reason of its failure,
    /// as of the last pass (in no particular order).
    pub fn pending_services(&self) -> impl Iterator<Item = (&ServiceKey, &'static str)> {
        self.entries
            .iter()
            .filter_map(|(key, e)| Some((key, e.failure.as_deref()?.reason)))
    }

    /// Drops Services gone from the inputs (or re-created under a new uid) and frees their
    /// IPs at once.
    fn release_gone(&mut self, inputs: &Inputs<'_>, sink: &mut Sink) {
        let present: HashMap<&ServiceKey, &str> =
            inputs.services.iter().map(|v| (&v.key, &*v.uid)).collect();
        let mut gone: Vec<ServiceKey> = self
            .entries
            .iter()
            .filter(|(key, entry)| present.get(key).is_none_or(|uid| **uid != *entry.uid))
            .map(|(key, _)| key.clone())
            .collect();
        gone.sort();
        self.release(gone, inputs, sink);
    }

    /// Drops the Services `gone` (sorted) and frees their IPs at once.
    fn release(&mut self, gone: Vec<ServiceKey>, inputs: &Inputs<'_>, sink: &mut Sink) {
        let now = inputs.now;
        for key in gone {
            self.unsettled.remove(&key);
            let Some(entry) = self.entries.remove(&key) else {
                continue;
            };
            let ips: Vec<IpAddr> = entry.ips.values().copied().collect();
            for ip in &ips {
                self.drop_ip(&key, *ip);
            }
            self.set_member(&entry.group, &key, false);
            if !ips.is_empty() {
                if self.recent.remember(key.clone(), ips.clone(), now) {
                    self.unreserve_forgotten(now);
                }
                // Reserved for this key: no other Service takes them while held. Not for
                // a Service that still exists but stopped being ours (its type or class
                // changed, `not_ours`): its addresses are quarantined while the API shows
                // them, then free.
                for ip in &ips {
                    if self.hold.0 > std::time::Duration::ZERO
                        && !self.ips.contains_key(ip)
                        && !inputs.not_ours.contains(&key)
                    {
                        self.reserved.insert(*ip, key.clone());
                        self.reserve(*ip);
                    }
                }
                sink.event(
                    &key,
                    false,
                    reason::RELEASED,
                    format!("released {}", join(&ips)),
                );
                sink.released.push((key, ips));
            }
        }
    }

    /// On a new config: rebuild the ledgers from the table; IPs no longer in a pool their
    /// namespace keeps ([`Tenancy::keeps`]) are cleared (and re-allocated by the
    /// allocation step). (Namespace labels never clear an IP: a relabelled namespace keeps
    /// what a selector pool gave it.)
    fn apply_config(&mut self, inputs: &Inputs<'_>, sink: &mut Sink) {
        let config = inputs.config;
        self.config_changed = self.config.as_ref() != Some(config);
        if !self.config_changed {
            return;
        }
        self.ledgers = config
            .pools()
            .map(|(key, pool)| {
                (
                    key.clone(),
                    Ledger::with_closed(&pool.ranges, pool.closed()),
                )
            })
            .collect();
        for ip in self.quarantined.clone() {
            self.reserve(ip);
        }
        for ip in self.reserved.keys().copied().collect::<Vec<_>>() {
            self.reserve(ip);
        }
        let mut in_use: Vec<IpAddr> = self.ips.keys().copied().collect();
        in_use.sort();
        let mut tenancies: HashMap<String, Tenancy<'_>> = HashMap::new();
        for ip in in_use {
            let used = &self.ips[&ip];
            let namespace = used.group.namespace().to_owned();
            let classic = !matches!(used.pool, PoolKey::Named(_));
            let tenancy = tenancies
                .entry(namespace.clone())
                .or_insert_with(|| tenancy(inputs, &namespace));
            let kept = config
                .pool_of(ip)
                .filter(|(key, pool)| tenancy.keeps(key, pool))
                .map(|(key, _)| key.clone());
            if let Some(pool_key) = kept
                && let Some(ledger) = self.ledgers.get_mut(&pool_key)
                && ledger.import(ip).is_ok()
            {
                if let Some(used) = self.ips.get_mut(&ip) {
                    used.pool = pool_key;
                }
                continue;
            }
            let why = if classic {
                format!("was removed from the pool of namespace {namespace}")
            } else {
                format!("is no longer in a pool namespace {namespace} may draw from")
            };
            self.clear_ip(ip, reason::CLEAR_ASSIGNMENT, &why, sink);
        }
        self.config = Some(config.clone());
    }

    /// Takes `ip` from every Service using it, each told with a Warning `reason`
    /// (`ClearAssignment`, or `AddressConflict` for a LAN conflict:
    /// `{ip} {why}; assigning a new address`); the allocation step gives them another
    /// address. Does not free it: while the API still shows it, it is quarantined.
    fn clear_ip(&mut self, ip: IpAddr, reason: &'static str, why: &str, sink: &mut Sink) {
        let Some(used) = self.ips.remove(&ip) else {
            return;
        };
        if self.visible.contains_key(&ip) {
            // Another pool may hold it now (a namespace left the fallback): not before
            // the API stops showing it on its old Service.
            self.quarantined.insert(ip);
            self.reserve(ip);
        }
        if let Some(group) = self.groups.get_mut(&used.group) {
            group.ips.remove(&Family::of(ip));
        }
        for user in used.users.keys() {
            if let Some(entry) = self.entries.get_mut(user) {
                entry.ips.remove(&Family::of(ip));
                // Not as asked any more, whatever else changed: decided again this pass.
                entry.settled = None;
                sink.event(
                    user,
                    true,
                    reason,
                    format!("{ip} {why}; assigning a new address"),
                );
                if entry.ips.is_empty() {
                    let group = entry.group.clone();
                    self.set_member(&group, user, false);
                }
            }
        }
    }

    /// Quarantine: an IP taken from a Service goes back to its pool only once the API no
    /// longer shows it on any Service and no agent reports holding it. The writes of one
    /// pass run concurrently, so handing it to another Service in the same pass could let
    /// the new holder's status land before the old holder's clear: one IP on two Services
    /// in the API, however briefly (found by the chaos run, seed 11). Lifted at the start of
    /// every pass.
    fn lift_quarantine(&mut self) {
        let lifted: Vec<IpAddr> = self
            .quarantined
            .iter()
            .filter(|ip| !self.visible.contains_key(*ip))
            .copied()
            .collect();
        for ip in lifted {
            self.quarantined.remove(&ip);
            // Unless re-imported or re-assigned meanwhile, withheld, or held for the released
            // Service that may come back for it.
            self.give_back(ip);
        }
    }

    /// Ends the reservations of the IPs [`Planner::recent`] forgot (expired, or past its
    /// capacity) or held for [`Planner::hold`] already at `now`: each goes back to its pool
    /// unless in use, quarantined or withheld. O(reserved).
    fn unreserve_forgotten(&mut self, now: Instant) {
        let hold = self.hold.0;
        let forgotten: Vec<IpAddr> = self
            .reserved
            .iter()
            .filter(|(ip, key)| {
                !self.recent.get(key).contains(ip)
                    || self
                        .recent
                        .released_at(key)
                        .is_none_or(|at| at + hold <= now)
            })
            .map(|(ip, _)| *ip)
            .collect();
        for ip in forgotten {
            self.reserved.remove(&ip);
            self.give_back(ip);
        }
    }

    /// Returns `ip` to its pool's ledger unless something still keeps it: a Service uses
    /// it, or it is quarantined, withheld or held for a released Service.
    fn give_back(&mut self, ip: IpAddr) {
        if self.ips.contains_key(&ip)
            || self.quarantined.contains(&ip)
            || self.withheld.contains_key(&ip)
            || self.reserved.contains_key(&ip)
        {
            return;
        }
        if let Some(ledger) = self.ledgers.values_mut().find(|l| l.contains(ip))
            && ledger.release(ip)
        {
            self.freed += 1;
        }
    }

    /// Takes `ip` out of its reservation for `key` (which takes it back now): it is free in
    /// its ledger again, for `key` to allocate at once. No-op unless reserved for `key`.
    fn unreserve_for(&mut self, ip: IpAddr, key: &ServiceKey) {
        if self.reserved.get(&ip) != Some(key) {
            return;
        }
        self.reserved.remove(&ip);
        if self.quarantined.contains(&ip) || self.withheld.contains_key(&ip) {
            return;
        }
        if let Some(ledger) = self.ledgers.values_mut().find(|l| l.contains(ip)) {
            ledger.release(ip);
        }
    }

    /// Ends the reservations held for `key` (re-created, it got its addresses): each goes
    /// back to its pool unless in use, quarantined or withheld. O(IPs it released).
    fn end_reservations(&mut self, key: &ServiceKey) {
        let held: Vec<IpAddr> = self
            .recent
            .get(key)
            .iter()
            .filter(|ip| self.reserved.get(ip) == Some(key))
            .copied()
            .collect();
        for ip in held {
            self.reserved.remove(&ip);
            self.give_back(ip);
        }
    }

    /// When the next reservation of a released Service's IP ends (then an address may go to
    /// a Service waiting for one), if any is held. O(reserved).
    pub fn next_release(&self) -> Option<Instant> {
        self.reserved
            .values()
            .filter_map(|key| self.recent.released_at(key))
            .min()
            .map(|at| at + self.hold.0)
    }

    /// Forgets the sticky IPs remembered for [`STICKY_FOR`] and ends the reservations due
    /// at `now` (only when one is: O(reserved) then).
    fn end_reservations_due(&mut self, now: Instant) {
        let forgot = self.recent.expire(now);
        if forgot || self.next_release().is_some_and(|at| at <= now) {
            self.unreserve_forgotten(now);
        }
    }

    /// The addresses held for released Services, in case they are re-created, and for
    /// which (see the module docs).
    pub fn reserved(&self) -> impl Iterator<Item = (IpAddr, &ServiceKey)> + '_ {
        self.reserved.iter().map(|(ip, key)| (*ip, key))
    }

    /// The Service `ip` is held for, if it is reserved.
    fn reserved_for(&self, ip: IpAddr) -> Option<&ServiceKey> {
        self.reserved.get(&ip)
    }

    /// Keeps a quarantined `ip` in use in whichever ledger holds it (pools never overlap).
    fn reserve(&mut self, ip: IpAddr) {
        if let Some(ledger) = self.ledgers.values_mut().find(|l| l.contains(ip))
            && !ledger.is_in_use(ip)
        {
            let _ = ledger.allocate_specific(ip);
        }
    }

    /// Stops `key` using `ip`; frees it when it was the last user. Does not touch the
    /// Service's entry.
    fn drop_ip(&mut self, key: &ServiceKey, ip: IpAddr) {
        let Some(used) = self.ips.get_mut(&ip) else {
            return;
        };
        used.users.remove(key);
        used.ports.retain(|_, owner| owner != key);
        if !used.users.is_empty() {
            return;
        }
        if let Some(used) = self.ips.remove(&ip) {
            if self.visible.contains_key(&ip) {
                self.quarantined.insert(ip);
            } else if !self.reserved.contains_key(&ip)
                && !self.withheld.contains_key(&ip)
                && let Some(ledger) = self.ledgers.get_mut(&used.pool)
                && ledger.release(ip)
            {
                self.freed += 1;
            }
            if let Some(group) = self.groups.get_mut(&used.group) {
                group.ips.remove(&Family::of(ip));
            }
        }
    }

    /// Adds `key` to or removes it from `group`'s members; a group without members is
    /// forgotten.
    fn set_member(&mut self, group: &GroupId, key: &ServiceKey, member: bool) {
        if member {
            match self.groups.get_mut(group) {
                Some(g) => {
                    if !g.members.contains_key(key) {
                        insert_tight(&mut g.members, key.clone(), ());
                    }
                }
                None => {
                    let g = Box::new(Group {
                        members: tight_map([(key.clone(), ())]),
                        ..Group::default()
                    });
                    self.groups.insert(group.clone(), g);
                }
            }
        } else if let Some(g) = self.groups.get_mut(group) {
            g.members.remove(key);
            if g.members.is_empty()
                && let Some(node) = self.groups.remove(group).and_then(|g| g.node)
            {
                unload(&mut self.load, &node);
            }
        }
    }
}

/// `a, b, c`.
fn join(ips: &[IpAddr]) -> String {
    ips.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// One group fewer on `node` (see [`Planner::load`]).
fn unload(load: &mut BTreeMap<Arc<str>, usize>, node: &str) {
    if let Some(n) = load.get_mut(node) {
        *n = n.saturating_sub(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The room each small map keeps (its `Vec`'s capacity).
    fn room<K, V>(map: LiteMap<K, V>) -> usize {
        map.into_tuple_vec().capacity()
    }

    #[test]
    fn small_maps_keep_no_spare_room() {
        let one = || tight_map([(2u8, 'b')]);
        assert_eq!(room(one()), 1);
        // What `collect` gives, for contrast: room for four.
        assert_eq!(room([(2u8, 'b')].into_iter().collect::<LiteMap<_, _>>()), 4);

        let mut map = one();
        assert_eq!(insert_tight(&mut map, 1, 'a'), None);
        assert_eq!(insert_tight(&mut map, 3, 'c'), None);
        assert_eq!(
            insert_tight(&mut map, 2, 'B'),
            Some('b'),
            "a key already there"
        );
        let pairs: Vec<_> = map.iter().map(|(k, v)| (*k, *v)).collect();
        assert_eq!(
            pairs,
            [(1, 'a'), (2, 'B'), (3, 'c')],
            "sorted, as insert keeps it"
        );
        assert_eq!(room(map), 3);

        let mut empty = LiteMap::new();
        insert_tight(
            &mut empty,
            Family::V4,
            "192.0.2.1".parse::<IpAddr>().unwrap(),
        );
        assert_eq!(room(empty), 1);
    }

    /// The index keeps a plan per Service and the planner a group, an IP and an entry:
    /// their size is the controller's memory at scale (BENCHMARKS, "The planner's
    /// small maps"). A field that makes one of them grow is boxed if rare. The planner's
    /// tables keep their records boxed: a table of 10,000 has 16,384 buckets, and an
    /// empty bucket then costs a key and a pointer, not a record (BENCHMARKS, "Boxed
    /// records and interned names").
    #[test]
    fn the_records_kept_per_service_stay_small() {
        use std::mem::size_of;
        fn bucket<K, V>(_: &HashMap<K, Box<V>>) -> usize {
            size_of::<(K, Box<V>)>()
        }
        let planner = Planner::default();
        let entries = bucket(&planner.entries);
        let groups = bucket(&planner.groups);
        let ips = bucket(&planner.ips);
        assert!(
            entries <= 40 && groups <= 48 && ips <= 32,
            "{entries} {groups} {ips}"
        );
        assert!(
            size_of::<ServicePlan>() <= 208,
            "{}",
            size_of::<ServicePlan>()
        );
        assert!(size_of::<Group>() <= 216, "{}", size_of::<Group>());
        assert!(size_of::<IpUse>() <= 112, "{}", size_of::<IpUse>());
        assert!(size_of::<Entry>() <= 192, "{}", size_of::<Entry>());
    }
}
