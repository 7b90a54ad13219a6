//! The trusted node assignments: for each node, the objects in the controller's namespace
//! saying which IPs its agent must carry, on which interface, with which Service ports open
//! (lines: [`aliaslb_core::assignment`]; layout: [`aliaslb_core::assignment::shards`]): the
//! index `aliaslb-node-<node>` and its shards `aliaslb-shard-<node>-<k>`. Agents act on
//! nothing else; tenants cannot write there, agents can only read.
//!
//! Pure: [`desired`] (from the pass's plans), [`observed`] (from the cache of what we
//! wrote), [`render_node`] (a node's objects and the order they are written in),
//! [`read_node`] (a node's objects read back as its agent reads them), [`trusted_nodes`]
//! (which node holds which Service's IP, for the import at the start of a leadership
//! term), [`Identities`] (each node's signing key and MACs, from its own report, as its
//! peers' indexes list them). [`apply`] is the thin
//! writer: one server-side apply per object whose data changed, behind the leader fence and
//! the write timeout. A change writes the one shard its line is in (~25 KB at most), not the
//! node's whole list. A node whose last IP left keeps its objects with empty lists: "nothing
//! assigned" is said, not inferred from an absence.
//!
//! **Upgrades.** An index written here replaces a single object of earlier releases (same
//! name, same field manager) once its shards are written; an agent of earlier releases then
//! refuses it (it reads [`LEGACY_MARKER`] as its lines) and keeps what it has, saying why.
//!
//! **First claims.** A line ends in `probe` when the planner marks its IP a first claim
//! ([`PlanOutput::probe`]): placed while no agent report lists it as held, in a group no
//! node carried before. The flag is dropped once the node's agent reports holding the IP:
//! one more write of that node's object per new address, so the text says what the agent
//! still has to do, and an agent that restarts (or loses the alias) later re-adds an
//! address it already owned without probing for it.
//!
//! **Peers.** Every index also lists, under [`keys::PEERS_KEY`], the node's LAN peers (the
//! standbys and relays of the IPs it holds, the holders of those it stands by for or
//! relays), each with the key its agent signs fast-failover adverts with and its MACs, as
//! that agent's own report says (fresh or stale: a node partitioned from the API still
//! answers on the LAN). An agent believes adverts and acks from these peers only, with
//! these keys, and tells another node's ARP/NDP claim from a foreign host's by their MACs.
//! One node's key or MACs changing rewrites the indexes of its peers only, and a MAC list
//! that flaps is taken at most once per [`MAC_HOLD`] ([`Identities`]): one node's churn
//! costs writes bounded by its peers, never one per node of the cluster. (Indexes of
//! earlier releases listed every node's MACs under [`keys::NODE_MACS_KEY`]; it is dropped
//! at the next write.)

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use aliaslb_core::advert::PublicKey;
use aliaslb_core::assignment::shards::{self, LEGACY_MARKER, Sharded};
use aliaslb_core::assignment::{Handover, NodeAssignments, OpenPort, Peer, PeerNode, Protocol};
use aliaslb_core::keys;
use aliaslb_core::mac::{Mac, virtual_mac};
use aliaslb_core::plan::{ServiceKey, ServicePlan, ServiceView, Standby};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use crate::fence::{ApplyError, guarded};

/// Value of the [`keys::LABEL_ASSIGNMENTS`] label.
pub const LABEL_VALUE: &str = "true";

/// The data of one assignment object, as rendered or read.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct ObjectData {
    /// [`keys::ASSIGNMENTS_KEY`]: the IP lines of a shard (or of a node in the
    /// single-object format), [`LEGACY_MARKER`] in an index.
    pub ips: String,
    /// [`keys::NODE_MACS_KEY`]: every node's MACs (an index of earlier releases, a single
    /// object): read, never written.
    pub node_macs: Option<String>,
    /// [`keys::PEERS_KEY`]: the node's LAN peers (an index).
    pub peers: Option<String>,
    /// [`keys::SHARDS_KEY`]: the shard count (an index only).
    pub shards: Option<String>,
    /// [`keys::HANDOVERS_KEY`]: the node's handovers (an index only, and only while it
    /// has any: with `--drain-window` off the key is never written).
    pub handovers: Option<String>,
}

impl ObjectData {
    /// The data of `cm`.
    pub fn of(cm: &ConfigMap) -> Self {
        let key = |k: &str| cm.data.as_ref().and_then(|d| d.get(k)).cloned();
        ObjectData {
            ips: key(keys::ASSIGNMENTS_KEY).unwrap_or_default(),
            node_macs: key(keys::NODE_MACS_KEY),
            peers: key(keys::PEERS_KEY),
            shards: key(keys::SHARDS_KEY),
            handovers: key(keys::HANDOVERS_KEY),
        }
    }
}

/// One node's assignment objects (its index and its shards, or its single object), by name.
pub type NodeObjects = BTreeMap<String, ObjectData>;

/// The shard count `objects` are in force with: the index's; 0 for the single-object format
/// or no index (every shard is then new); an unreadable count reads as 0 too.
pub fn count_in_force(node: &str, objects: &NodeObjects) -> u32 {
    objects
        .get(&keys::assignment_configmap(node))
        .and_then(|index| index.shards.as_deref())
        .and_then(|count| shards::parse_count(count).ok())
        .unwrap_or(0)
}

/// Reads a node's assignment from its objects, as its agent does: the shards its index
/// lists (the sharded format), else the index's own lines (the single-object format), and
/// the node MACs.
pub fn read_node(node: &str, objects: &NodeObjects) -> Result<NodeAssignments, String> {
    let index_name = keys::assignment_configmap(node);
    let Some(index) = objects.get(&index_name) else {
        return Err(format!("{index_name} is missing"));
    };
    let macs = index.node_macs.as_deref().unwrap_or("");
    let peers = index.peers.as_deref().unwrap_or("");
    let Some(count) = index.shards.as_deref() else {
        let mut assignments = NodeAssignments::parse(&index.ips).map_err(|e| e.to_string())?;
        assignments
            .parse_node_macs(macs)
            .map_err(|e| e.to_string())?;
        return Ok(assignments);
    };
    let shard = |k| {
        let name = keys::assignment_shard_configmap(node, k);
        objects.get(&name).map(|o| o.ips.as_str())
    };
    shards::read_index(&index_name, count, macs, peers, shard)?
        .ok_or_else(|| format!("a shard of the {count} {index_name} lists is missing"))
}

/// The handovers `node`'s index lists (a new leader takes them in: [`crate::handover`]);
/// lines that cannot be read are said and left out (their drains end).
pub fn handovers_of(node: &str, objects: &NodeObjects) -> BTreeMap<IpAddr, Handover> {
    let index = objects.get(&keys::assignment_configmap(node));
    let Some(text) = index.and_then(|i| i.handovers.as_deref()) else {
        return BTreeMap::new();
    };
    let mut read = NodeAssignments::new();
    match read.parse_handovers(text) {
        Ok(()) => read.handovers,
        Err(error) => {
            tracing::warn!(node, %error, "the handovers of this node's index cannot be read: its drains end");
            BTreeMap::new()
        }
    }
}

/// When an object must be written among a node's writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Round {
    /// The index, when it brings a new forward and the shard count does not grow
    /// ([`brings_forward`]): before the shards, so the node that gets an IP in a planned
    /// move has its forward in place before the shard line that makes it announce the IP
    /// (the two writes would otherwise race, and an agent reading the shard first would
    /// announce the IP one reconcile before it forwards the flows of the old holder).
    Forwards,
    /// A shard beyond the count in force: before the index says it counts.
    NewShard,
    /// The index, and the shards already counted when the count does not change.
    Index,
    /// A shard already counted, after the index raised the count (it drops the lines that
    /// moved to the new shards).
    OldShard,
}

/// Whether the index data `new` lists a forward (a handover line with `forward=`) that
/// `old` (what the node's index says now) does not. Pure.
pub fn brings_forward(old: Option<&ObjectData>, new: &ObjectData) -> bool {
    let forwards = |d: Option<&ObjectData>| -> BTreeSet<String> {
        d.and_then(|d| d.handovers.as_deref())
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(" forward="))
            .map(str::to_owned)
            .collect()
    };
    let before = forwards(old);
    forwards(Some(new)).iter().any(|l| !before.contains(l))
}

/// The objects that say `assignments` for `node` (every shard and the index), each with its
/// [`Round`], the count never lower than `in_force` (what its objects say now).
pub fn render_node(
    node: &str,
    assignments: &NodeAssignments,
    in_force: u32,
) -> Vec<(String, ObjectData, Round)> {
    let sharded = Sharded::split(assignments, in_force.max(1));
    let count = sharded.count();
    let grows = count != in_force;
    let mut out: Vec<(String, ObjectData, Round)> = sharded
        .texts
        .into_iter()
        .zip(0..)
        .map(|(ips, k)| {
            let round = match (k >= in_force, grows) {
                (true, _) => Round::NewShard,
                (false, true) => Round::OldShard,
                (false, false) => Round::Index,
            };
            let data = ObjectData {
                ips,
                ..ObjectData::default()
            };
            (keys::assignment_shard_configmap(node, k), data, round)
        })
        .collect();
    let index = ObjectData {
        ips: LEGACY_MARKER.to_owned(),
        node_macs: None,
        peers: Some(assignments.render_peers()),
        shards: Some(count.to_string()),
        handovers: (!assignments.handovers.is_empty()).then(|| assignments.render_handovers()),
    };
    out.push((keys::assignment_configmap(node), index, Round::Index));
    out
}

/// Some shards of a node: those the lines of some IPs are in, under a shard count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardsOf {
    count: u32,
    shards: BTreeSet<u32>,
}

impl ShardsOf {
    /// The shards of `ips` among `count`.
    pub fn new(ips: impl IntoIterator<Item = IpAddr>, count: u32) -> Self {
        ShardsOf {
            count,
            shards: ips
                .into_iter()
                .map(|ip| shards::shard_of(ip, count))
                .collect(),
        }
    }

    /// Whether a line of one of `ips` is in these shards.
    pub fn holds_any(&self, ips: &[IpAddr]) -> bool {
        ips.iter()
            .any(|ip| self.shards.contains(&shards::shard_of(*ip, self.count)))
    }
}

/// The objects [`render_node`] gives, of the shards in `only` and the index, for `want`
/// that holds (at least) every line of those shards. `None` when `want` does not fit the
/// count of `only` (the node's count in force): the count grows, every shard must be
/// rendered.
pub fn render_shards(
    node: &str,
    want: &NodeAssignments,
    only: &ShardsOf,
) -> Option<Vec<(String, ObjectData, Round)>> {
    let mut objects = render_node(node, want, only.count);
    if objects.len() != only.count as usize + 1 {
        return None;
    }
    let index = objects.pop()?;
    let mut out: Vec<_> = objects
        .into_iter()
        .zip(0u32..)
        .filter(|(_, k)| only.shards.contains(k))
        .map(|(object, _)| object)
        .collect();
    out.push(index);
    Some(out)
}

/// How long a node's MAC list, once changed in its peers' indexes, is not changed there
/// again: a link that comes and goes (an SR-IOV VF, a macvtap, a compromised node flipping
/// its list) costs its peers one write per this, not one per flap.
pub const MAC_HOLD: Duration = Duration::from_secs(10);

/// What a node's peers' indexes say of it: its agent's signing key and its MACs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Identity {
    /// The key its agent signs adverts and acks with (`None`: it reports none).
    pub key: Option<PublicKey>,
    /// Its MACs.
    pub macs: BTreeSet<Mac>,
}

impl Identity {
    /// What `report` says of its node.
    pub fn of(report: &aliaslb_core::report::AgentReport) -> Self {
        Identity {
            key: report.key,
            macs: report.macs().collect(),
        }
    }
}

/// Each node's [`Identity`] as its peers' indexes list it, from its agent's report (fresh
/// or stale). A new key (a restarted agent) goes out at once: its adverts are believed only
/// once its peers have it. A new MAC list goes out at once too, unless the node's list
/// changed less than [`MAC_HOLD`] ago: then it waits for the end of that hold
/// ([`Identities::next_due`]).
#[derive(Debug, Default)]
pub struct Identities {
    in_force: BTreeMap<String, Identity>,
    /// When each node's MAC list last changed in force.
    macs_changed: HashMap<String, Instant>,
}

impl Identities {
    /// Moves to what `reports` say at `now`; returns the nodes whose identity in force
    /// changed (their peers' indexes are to be written).
    pub fn update(
        &mut self,
        reports: &aliaslb_core::plan::Reports,
        now: Instant,
    ) -> BTreeSet<String> {
        let mut changed: BTreeSet<String> = self
            .in_force
            .keys()
            .filter(|node| !reports.contains_key(*node))
            .cloned()
            .collect();
        for node in &changed {
            self.in_force.remove(node);
            self.macs_changed.remove(node);
        }
        for (node, report) in reports {
            let wanted = Identity::of(report);
            let current = self.in_force.get(node);
            if current == Some(&wanted) {
                continue;
            }
            let mut next = wanted;
            if let Some(current) = current
                && current.macs != next.macs
            {
                let held = self
                    .macs_changed
                    .get(node)
                    .is_some_and(|at| now.saturating_duration_since(*at) < MAC_HOLD);
                if held {
                    next.macs = current.macs.clone();
                } else {
                    self.macs_changed.insert(node.clone(), now);
                }
            }
            if current != Some(&next) {
                self.in_force.insert(node.clone(), next);
                changed.insert(node.clone());
            }
        }
        changed
    }

    /// When a MAC list held back may go out (the loop must look again by then).
    pub fn next_due(&self, reports: &aliaslb_core::plan::Reports) -> Option<Instant> {
        self.macs_changed
            .iter()
            .filter(|(node, _)| {
                let wanted = reports
                    .get(*node)
                    .map(|r| r.macs().collect::<BTreeSet<Mac>>());
                let current = self.in_force.get(*node).map(|i| &i.macs);
                wanted.as_ref() != current
            })
            .map(|(_, at)| *at + MAC_HOLD)
            .min()
    }

    /// The identity of `node` in force.
    pub fn get(&self, node: &str) -> Option<&Identity> {
        self.in_force.get(node)
    }
}

/// The node an assignment ConfigMap (an index or a shard) is for, from its name.
pub fn node_of(name: &str) -> Option<&str> {
    match name.strip_prefix("aliaslb-node-") {
        Some(node) => Some(node).filter(|n| !n.is_empty()),
        None => keys::assignment_shard_of(name).map(|(node, _)| node),
    }
}

/// The ports of `view` the shield opens (ports the API would refuse are left out).
fn open_ports(view: &ServiceView) -> impl Iterator<Item = OpenPort> + '_ {
    view.ports.iter().filter_map(|p| {
        Some(OpenPort {
            protocol: Protocol::from_service(Some(&p.protocol))?,
            port: u16::try_from(p.port).ok().filter(|p| *p != 0)?,
        })
    })
}

/// What the nodes `only` (every node when `None`) must carry according to `plans`: each
/// Service with a node gets its IPs there, with its ports (from its view, if given) and
/// the pool's interface, `probe` on the first claims (`probe`); with `standbys`, each L2
/// line names its standby (`peer=`) and relay (`relay=`), the standby node gets the line
/// as `standby=` (fast L2 failover), and the holder, standby and relay list each other
/// among their peers with the identities `identities` gives (the relay with the standbys
/// it forwards the holder's adverts to); a pool with `virtualMAC` gives both lines the
/// IP's `vmac=`. A node in `only` that carries nothing and is no one's peer is missing
/// from the result.
pub fn desired<'a>(
    plans: impl IntoIterator<Item = (&'a ServiceKey, &'a ServicePlan, Option<&'a ServiceView>)>,
    probe: &BTreeSet<IpAddr>,
    identities: &Identities,
    only: Option<&BTreeSet<String>>,
    standbys: bool,
) -> BTreeMap<String, NodeAssignments> {
    let mut nodes: BTreeMap<String, NodeAssignments> = BTreeMap::new();
    let wanted = |node: &str| only.is_none_or(|only| only.contains(node));
    // `node` lists `peer` (its key and MACs, as in force) among its peers, if `node` is
    // wanted.
    fn add_peer<'n>(
        nodes: &'n mut BTreeMap<String, NodeAssignments>,
        identities: &Identities,
        wanted: impl Fn(&str) -> bool,
        node: &str,
        peer: &str,
    ) -> Option<&'n mut PeerNode> {
        if !wanted(node) || node == peer {
            return None;
        }
        let entry = nodes.entry(node.to_owned()).or_default();
        Some(entry.peers.entry(peer.to_owned()).or_insert_with(|| {
            let identity = identities.get(peer).cloned().unwrap_or_default();
            PeerNode {
                key: identity.key,
                macs: identity.macs,
                relay_to: BTreeSet::new(),
            }
        }))
    }
    for (key, plan, view) in plans {
        // L2: the one elected node; L3: every announcing node, each line marked `bgp`.
        let (targets, bgp) = match &plan.node {
            Some(node) => (std::slice::from_ref(node), false),
            None => (plan.nodes.as_slice(), true),
        };
        let standby = plan.standby.as_ref().filter(|_| standbys && !bgp);
        let standby_wanted = standby.is_some_and(|s| wanted(&s.node));
        let relay = standby.and_then(|s| s.relay.as_ref());
        let relay_wanted = relay.is_some_and(|(r, _)| wanted(r));
        if !targets.iter().any(|n| wanted(n)) && !standby_wanted && !relay_wanted {
            continue;
        }
        let ports: Vec<OpenPort> = view.map(|v| open_ports(v).collect()).unwrap_or_default();
        let service = key.to_string();
        for node in targets.iter().filter(|n| wanted(n)) {
            let assignments = nodes.entry(node.to_string()).or_default();
            for ip in &plan.ips {
                assignments.assign(
                    *ip,
                    plan.interface.as_deref(),
                    ports.iter().copied(),
                    &service,
                );
                if let Some(line) = assignments.ips.get_mut(ip) {
                    line.vmac = plan.virtual_mac.then(|| virtual_mac(*ip));
                    line.probe |= !bgp && probe.contains(ip);
                    line.bgp |= bgp;
                    line.peer = standby.and_then(|s| peer_of(s, *ip));
                    line.relay = line
                        .peer
                        .as_ref()
                        .and(standby)
                        .and_then(|s| relay_of(s, *ip));
                }
            }
        }
        // The holder (`targets` is that one node in L2 mode) is never its own standby.
        let Some(s) = standby.filter(|s| !targets.contains(&s.node)) else {
            continue;
        };
        let holder = &targets[0];
        add_peer(&mut nodes, identities, wanted, holder, &s.node);
        add_peer(&mut nodes, identities, wanted, &s.node, holder);
        if let Some((relay, _)) = relay {
            add_peer(&mut nodes, identities, wanted, holder, relay);
            if let Some(entry) = add_peer(&mut nodes, identities, wanted, relay, holder) {
                entry
                    .relay_to
                    .extend(plan.ips.iter().filter_map(|ip| peer_of(s, *ip)));
            }
        }
        if standby_wanted {
            let assignments = nodes.entry(s.node.to_string()).or_default();
            for (ip, _) in &s.addresses {
                assignments.assign(
                    *ip,
                    plan.interface.as_deref(),
                    ports.iter().copied(),
                    &service,
                );
                if let Some(line) = assignments.ips.get_mut(ip) {
                    line.vmac = plan.virtual_mac.then(|| virtual_mac(*ip));
                    line.standby_for = Some(holder.to_string());
                }
            }
        }
    }
    nodes
}

/// The `relay=` of `ip`'s line: the relay and its address on `ip`'s subnet.
fn relay_of(standby: &Standby, ip: IpAddr) -> Option<Peer> {
    let (node, addresses) = standby.relay.as_ref()?;
    addresses
        .iter()
        .find(|(vip, _)| *vip == ip)
        .map(|(_, address)| Peer {
            node: node.to_string(),
            address: *address,
        })
}

/// The `peer=` of `ip`'s line: the standby and its address on `ip`'s subnet.
fn peer_of(standby: &Standby, ip: IpAddr) -> Option<Peer> {
    standby
        .addresses
        .iter()
        .find(|(vip, _)| *vip == ip)
        .map(|(_, address)| Peer {
            node: standby.node.to_string(),
            address: *address,
        })
}

/// The data of every assignment object we wrote, by node and name.
pub fn observed<'a>(
    objects: impl IntoIterator<Item = &'a ConfigMap>,
) -> BTreeMap<String, NodeObjects> {
    let mut out: BTreeMap<String, NodeObjects> = BTreeMap::new();
    for cm in objects {
        let Some(name) = cm.metadata.name.as_deref() else {
            continue;
        };
        let Some(node) = node_of(name) else {
            continue;
        };
        out.entry(node.to_owned())
            .or_default()
            .insert(name.to_owned(), ObjectData::of(cm));
    }
    out
}

/// Every node's assignment our objects say; unreadable ones give nothing (their nodes are
/// then elected afresh).
fn read_all(observed: &BTreeMap<String, NodeObjects>) -> Vec<(&String, NodeAssignments)> {
    observed
        .iter()
        .filter_map(|(node, objects)| match read_node(node, objects) {
            Ok(assignments) => Some((node, assignments)),
            Err(error) => {
                tracing::warn!(node, %error, "our assignment objects for this node cannot be read");
                None
            }
        })
        .collect()
}

/// For each IP our assignment objects give a node: that node and the Services it is
/// carried for. Unreadable objects give nothing (the node is then elected afresh).
pub fn trusted_nodes(
    observed: &BTreeMap<String, NodeObjects>,
) -> HashMap<IpAddr, (String, Vec<String>)> {
    let mut out = HashMap::new();
    for (node, assignments) in read_all(observed) {
        // L3 lines have no one holder to keep: their nodes are chosen afresh. A standby
        // line holds nothing.
        for (ip, a) in assignments
            .ips
            .into_iter()
            .filter(|(_, a)| !a.bgp && a.held())
        {
            out.insert(ip, (node.clone(), a.services.into_iter().collect()));
        }
    }
    out
}

/// L3 mode: for each IP our assignment objects mark `bgp`, every node announcing it, each
/// with the Services it is carried for (unreadable objects give nothing).
pub fn routed_nodes(
    observed: &BTreeMap<String, NodeObjects>,
) -> HashMap<IpAddr, Vec<(String, Vec<String>)>> {
    let mut out: HashMap<IpAddr, Vec<(String, Vec<String>)>> = HashMap::new();
    for (node, assignments) in read_all(observed) {
        for (ip, a) in assignments.ips.into_iter().filter(|(_, a)| a.bgp) {
            let services = a.services.into_iter().collect();
            out.entry(ip).or_default().push((node.clone(), services));
        }
    }
    out
}

/// The nodes our own objects have announce Service `key`'s `ips` in L3 mode, by name,
/// comma-separated; `None` if none.
pub fn routed_nodes_of(
    key: &ServiceKey,
    ips: &[IpAddr],
    routed: &HashMap<IpAddr, Vec<(String, Vec<String>)>>,
) -> Option<String> {
    let key = key.to_string();
    ips.iter().find_map(|ip| {
        let nodes: Vec<&str> = routed
            .get(ip)?
            .iter()
            .filter(|(_, services)| services.contains(&key))
            .map(|(node, _)| node.as_str())
            .collect();
        (!nodes.is_empty()).then(|| nodes.join(","))
    })
}

/// The node our own objects assign Service `key`'s `ips` to, if any.
pub fn trusted_node_of<'a>(
    key: &ServiceKey,
    ips: &[IpAddr],
    trusted: &'a HashMap<IpAddr, (String, Vec<String>)>,
) -> Option<&'a str> {
    let key = key.to_string();
    ips.iter().find_map(|ip| {
        let (node, services) = trusted.get(ip)?;
        services.contains(&key).then_some(node.as_str())
    })
}

/// Writes `data` as `node`'s assignment object `name` (creating it if needed).
pub async fn apply(
    api: &Api<ConfigMap>,
    namespace: &str,
    node: &str,
    name: &str,
    data: &ObjectData,
    fence: impl Fn() -> Option<std::time::Instant>,
) -> Result<ConfigMap, ApplyError> {
    let mut values = serde_json::Map::new();
    values.insert(keys::ASSIGNMENTS_KEY.into(), data.ips.clone().into());
    if let Some(macs) = &data.node_macs {
        values.insert(keys::NODE_MACS_KEY.into(), macs.clone().into());
    }
    if let Some(peers) = &data.peers {
        values.insert(keys::PEERS_KEY.into(), peers.clone().into());
    }
    if let Some(count) = &data.shards {
        values.insert(keys::SHARDS_KEY.into(), count.clone().into());
    }
    if let Some(handovers) = &data.handovers {
        values.insert(keys::HANDOVERS_KEY.into(), handovers.clone().into());
    }
    let body = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {
                keys::LABEL_ASSIGNMENTS: LABEL_VALUE,
                keys::LABEL_ASSIGNMENT_NODE: keys::assignment_node_label(node),
            },
        },
        "data": values,
    });
    let params = PatchParams::apply(keys::CONTROLLER_FIELD_MANAGER).force();
    let object = format!("ConfigMap {namespace}/{name}");
    guarded("assignment", object, &fence, async {
        api.patch(name, &params, &Patch::Apply(&body)).await
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use aliaslb_core::plan::{ConditionPlan, PlanOutput, PortKey};
    use aliaslb_core::report::AgentReport;
    use std::sync::Arc;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn plan(ips: &[&str], node: Option<&str>, interface: Option<&str>) -> ServicePlan {
        let condition = ConditionPlan {
            status: true,
            reason: "x",
            message: String::new(),
        };
        ServicePlan {
            ips: ips.iter().map(|i| ip(i)).collect(),
            node: node.map(Into::into),
            nodes: Vec::new(),
            interface: interface.map(str::to_owned),
            virtual_mac: false,
            standby: None,
            allocated: condition.clone(),
            announced: condition,
        }
    }

    fn view(key: &ServiceKey, ports: &[(i32, &str)], observed: &[&str]) -> ServiceView {
        ServiceView {
            key: key.clone(),
            uid: Arc::from("u"),
            created: 0,
            families: aliaslb_core::plan::FamilyPolicy {
                families: vec![],
                require_all: false,
            },
            requested: Ok(vec![]),
            sharing_key: None,
            pool: None,
            ports: ports
                .iter()
                .map(|(port, protocol)| PortKey {
                    port: *port,
                    protocol: Arc::from(*protocol),
                })
                .collect(),
            local_traffic: false,
            observed_ips: observed.iter().map(|i| ip(i)).collect(),
            observed_node: None,
        }
    }

    /// [`desired`] over every plan of `output`.
    fn desired_all(
        output: &PlanOutput,
        views: &HashMap<&ServiceKey, &ServiceView>,
        identities: &Identities,
    ) -> BTreeMap<String, NodeAssignments> {
        let plans = output
            .services
            .iter()
            .map(|(key, plan)| (key, &**plan, views.get(key).copied()));
        desired(plans, &output.probe, identities, None, true)
    }

    #[test]
    fn only_the_nodes_asked_for_are_rendered() {
        let web = ServiceKey::new("default", "web");
        let dns = ServiceKey::new("default", "dns");
        let mut routed = plan(&["10.200.0.7"], None, None);
        routed.nodes = vec!["n1".into(), "n3".into()];
        let plans = [
            (web.clone(), plan(&["10.0.0.1"], Some("n1"), None)),
            (dns.clone(), routed),
        ];
        let only = BTreeSet::from(["n3".to_owned(), "n9".to_owned()]);
        let d = desired(
            plans.iter().map(|(k, p)| (k, p, None)),
            &BTreeSet::new(),
            &Identities::default(),
            Some(&only),
            true,
        );
        assert_eq!(
            d.keys().collect::<Vec<_>>(),
            vec!["n3"],
            "n9 carries nothing"
        );
        assert_eq!(d["n3"].render(), "10.200.0.7 - - default/dns bgp\n");
    }

    #[test]
    fn a_standby_gets_a_standby_line_and_the_holder_names_it() {
        let web = ServiceKey::new("default", "web");
        let mut p = plan(&["192.168.55.10", "2001:db8::10"], Some("n1"), Some("eth1"));
        p.standby = Some(Box::new(Standby {
            node: "n2".into(),
            // No address of n2 on the IPv6 subnet: no takeover of that one.
            addresses: vec![(ip("192.168.55.10"), ip("192.168.55.3"))],
            relay: Some(("n3".into(), vec![(ip("192.168.55.10"), ip("192.168.55.4"))])),
        }));
        let v = view(&web, &[(80, "TCP")], &[]);
        let plans = [(web.clone(), p)];
        let d = desired(
            plans.iter().map(|(k, p)| (k, p, Some(&v))),
            &BTreeSet::new(),
            &Identities::default(),
            None,
            true,
        );
        assert_eq!(
            d["n1"].render(),
            "192.168.55.10 eth1 tcp:80 default/web peer=n2@192.168.55.3 relay=n3@192.168.55.4\n\
             2001:db8::10 eth1 tcp:80 default/web\n"
        );
        assert_eq!(
            d["n2"].render(),
            "192.168.55.10 eth1 tcp:80 default/web standby=n1\n"
        );
        // Peers: the holder lists its standby and relay, the standby its holder, the relay
        // its holder with where it forwards the adverts; the relay carries no line.
        assert_eq!(d["n1"].render_peers(), "n2 - -\nn3 - -\n");
        assert_eq!(d["n2"].render_peers(), "n1 - -\n");
        assert_eq!(d["n3"].render(), "");
        assert_eq!(d["n3"].render_peers(), "n1 - - relay=n2@192.168.55.3\n");
        // A virtual-MAC pool: both lines name the MAC, the holder's and the standby's.
        let mut vmac = plans.clone();
        vmac[0].1.virtual_mac = true;
        let d_vmac = desired(
            vmac.iter().map(|(k, p)| (k, p, Some(&v))),
            &BTreeSet::new(),
            &Identities::default(),
            None,
            true,
        );
        let mac6 = virtual_mac(ip("2001:db8::10"));
        assert_eq!(
            d_vmac["n1"].render(),
            format!(
                "192.168.55.10 eth1 tcp:80 default/web peer=n2@192.168.55.3 relay=n3@192.168.55.4 \
                 vmac=02:00:c0:a8:37:0a\n2001:db8::10 eth1 tcp:80 default/web vmac={mac6}\n"
            )
        );
        assert_eq!(
            d_vmac["n2"].render(),
            "192.168.55.10 eth1 tcp:80 default/web standby=n1 vmac=02:00:c0:a8:37:0a\n"
        );
        // The standby line is no holder: the IP is trusted on n1 only.
        let seen: BTreeMap<String, NodeObjects> = d
            .iter()
            .map(|(node, a)| (node.clone(), objects_of(node, a)))
            .collect();
        let trusted = trusted_nodes(&seen);
        assert_eq!(trusted[&ip("192.168.55.10")].0, "n1");
        // Only n2 asked for: its standby line alone (and its peer); fast failover off: no
        // peer, no standby, no relay.
        let only = BTreeSet::from(["n2".to_owned()]);
        let d = desired(
            plans.iter().map(|(k, p)| (k, p, Some(&v))),
            &BTreeSet::new(),
            &Identities::default(),
            Some(&only),
            true,
        );
        assert_eq!(d.keys().collect::<Vec<_>>(), vec!["n2"]);
        let d = desired(
            plans.iter().map(|(k, p)| (k, p, Some(&v))),
            &BTreeSet::new(),
            &Identities::default(),
            None,
            false,
        );
        assert_eq!(d.keys().collect::<Vec<_>>(), vec!["n1"]);
        assert!(d["n1"].ips.values().all(|a| a.peer.is_none()));
    }

    #[test]
    fn plans_with_a_node_become_lines_on_that_node_only() {
        let web = ServiceKey::new("default", "web");
        let dns = ServiceKey::new("default", "dns");
        let moving = ServiceKey::new("other", "moving");
        let mut output = PlanOutput::default();
        output.services.insert(
            web.clone(),
            plan(&["10.0.0.1"], Some("n1"), Some("eth1")).into(),
        );
        output.services.insert(
            dns.clone(),
            plan(&["10.0.0.1", "fd00::1"], Some("n1"), None).into(),
        );
        output
            .services
            .insert(moving.clone(), plan(&["10.0.0.9"], None, None).into());
        let web_view = view(&web, &[(80, "TCP"), (443, "TCP")], &[]);
        let dns_view = view(&dns, &[(53, "UDP"), (0, "TCP"), (53, "QUIC")], &[]);
        let views = HashMap::from([(&web, &web_view), (&dns, &dns_view)]);
        let d = desired_all(&output, &views, &Identities::default());
        assert_eq!(
            d.keys().collect::<Vec<_>>(),
            vec!["n1"],
            "a Service without a node is on none"
        );
        assert_eq!(
            d["n1"].render(),
            "10.0.0.1 eth1 tcp:80,tcp:443,udp:53 default/dns,default/web\n\
             fd00::1 - udp:53 default/dns\n"
        );
    }

    #[test]
    fn l3_plans_become_bgp_lines_on_every_announcing_node() {
        let front = ServiceKey::new("shop", "front");
        let mut output = PlanOutput::default();
        let mut routed = plan(&["10.200.0.7"], None, None);
        routed.nodes = vec!["n1".into(), "n3".into()];
        output.services.insert(front.clone(), routed.into());
        // The planner never marks an L3 address a first claim; even if it did, no probe.
        output.probe.insert(ip("10.200.0.7"));
        let front_view = view(&front, &[(443, "TCP")], &[]);
        let views = HashMap::from([(&front, &front_view)]);
        let d = desired_all(&output, &views, &Identities::default());
        assert_eq!(d.keys().collect::<Vec<_>>(), vec!["n1", "n3"]);
        for node in ["n1", "n3"] {
            assert_eq!(d[node].render(), "10.200.0.7 - tcp:443 shop/front bgp\n");
        }
        let seen = BTreeMap::from([("n1".to_owned(), objects_of("n1", &d["n1"]))]);
        assert!(
            trusted_nodes(&seen).is_empty(),
            "an L3 line names no holder to keep"
        );
        let seen = BTreeMap::from([
            ("n1".to_owned(), objects_of("n1", &d["n1"])),
            ("n3".to_owned(), objects_of("n3", &d["n3"])),
        ]);
        let routed = routed_nodes(&seen);
        assert_eq!(
            routed_nodes_of(&front, &[ip("10.200.0.7")], &routed).as_deref(),
            Some("n1,n3")
        );
        let thief = ServiceKey::new("tenant", "thief");
        assert_eq!(routed_nodes_of(&thief, &[ip("10.200.0.7")], &routed), None);
    }

    #[test]
    fn first_claims_say_probe_and_peers_are_listed_with_their_reported_keys_and_macs() {
        use aliaslb_core::advert::SigningKey;
        use aliaslb_core::report::InterfaceReport;
        let web = ServiceKey::new("default", "web");
        let dns = ServiceKey::new("default", "dns");
        let mut output = PlanOutput::default();
        let mut web_plan = plan(&["10.0.0.1"], Some("n1"), None);
        web_plan.standby = Some(Box::new(Standby {
            node: "n3".into(),
            addresses: vec![(ip("10.0.0.1"), ip("10.0.0.13"))],
            relay: None,
        }));
        output.services.insert(web.clone(), web_plan.into());
        output
            .services
            .insert(dns.clone(), plan(&["10.0.0.2"], Some("n2"), None).into());
        output.probe.insert(ip("10.0.0.2"));
        let interface = |name: &str, mac: Option<&str>| InterfaceReport {
            addresses: Vec::new(),
            name: name.to_owned(),
            subnets: Vec::new(),
            mac: mac.map(|m| m.parse().unwrap()),
        };
        let key = SigningKey::generate().unwrap().public_key();
        let mut reports = BTreeMap::new();
        let n1 = AgentReport {
            interfaces: vec![
                interface("eth0", Some("02:00:00:00:01:00")),
                interface("eth1", Some("02:00:00:00:01:01")),
                interface("lo", None),
            ],
            ..AgentReport::default()
        };
        let n3 = AgentReport {
            interfaces: vec![interface("eth1", Some("02:00:00:00:03:01"))],
            key: Some(key),
            ..AgentReport::default()
        };
        reports.insert("n1".to_owned(), Arc::new(n1));
        reports.insert("n3".to_owned(), Arc::new(n3));
        let mut identities = Identities::default();
        let changed = identities.update(&reports, Instant::now());
        assert_eq!(changed, BTreeSet::from(["n1".to_owned(), "n3".to_owned()]));
        let views = HashMap::new();
        let d = desired_all(&output, &views, &identities);
        assert_eq!(
            d["n1"].render(),
            "10.0.0.1 - - default/web peer=n3@10.0.0.13\n"
        );
        assert_eq!(
            d["n2"].render(),
            "10.0.0.2 - - default/dns probe\n",
            "a first claim"
        );
        let index = |node: &str| {
            let objects = objects_of(node, &d[node]);
            objects[&keys::assignment_configmap(node)].clone()
        };
        assert_eq!(
            index("n1").peers.as_deref(),
            Some(format!("n3 {key} 02:00:00:00:03:01\n").as_str()),
            "n1 lists its standby n3, with n3's own key and MACs"
        );
        assert_eq!(
            index("n3").peers.as_deref(),
            Some("n1 - 02:00:00:00:01:00,02:00:00:00:01:01\n"),
            "n1 reports no key (an agent of before per-node keys)"
        );
        assert_eq!(index("n2").peers.as_deref(), Some(""), "n2 has no peer");
        assert_eq!(
            index("n1").node_macs,
            None,
            "no node's index lists every node's MACs"
        );
    }

    /// A node's MACs flapping reach its peers' indexes at most once per [`MAC_HOLD`]; a new
    /// key goes out at once; a node gone is dropped at once.
    #[test]
    fn identities_take_a_new_key_at_once_and_a_flapping_mac_list_once_per_hold() {
        use aliaslb_core::advert::SigningKey;
        let t0 = Instant::now();
        let report = |macs: &[&str], key| {
            Arc::new(AgentReport {
                macs: macs.iter().map(|m| m.parse().unwrap()).collect(),
                key,
                ..AgentReport::default()
            })
        };
        let key = Some(SigningKey::generate().unwrap().public_key());
        let mut reports = BTreeMap::from([("n1".to_owned(), report(&["02:00:00:00:00:01"], key))]);
        let mut ids = Identities::default();
        assert_eq!(ids.update(&reports, t0).len(), 1);
        assert!(ids.update(&reports, t0).is_empty(), "nothing new");
        let mut written = 0;
        // A VF that comes and goes every second for a minute.
        for s in 1..=60u64 {
            let macs: &[&str] = if s % 2 == 1 {
                &["02:00:00:00:00:01", "02:00:00:00:00:02"]
            } else {
                &["02:00:00:00:00:01"]
            };
            reports.insert("n1".into(), report(macs, key));
            let at = t0 + Duration::from_secs(s);
            written += ids.update(&reports, at).len();
            if let Some(due) = ids.next_due(&reports) {
                assert!(due > at && due <= at + MAC_HOLD, "{due:?}");
            }
        }
        assert!(written <= 7, "{written} changes in 60 s of flapping");
        // A new key: at once, even within a hold.
        let new_key = Some(SigningKey::generate().unwrap().public_key());
        reports.insert("n1".into(), report(&["02:00:00:00:00:01"], new_key));
        let at = t0 + Duration::from_secs(61);
        assert_eq!(ids.update(&reports, at).len(), 1);
        assert_eq!(ids.get("n1").unwrap().key, new_key);
        // Gone: dropped.
        assert_eq!(ids.update(&BTreeMap::new(), at).len(), 1);
        assert!(ids.get("n1").is_none());
    }

    /// The objects [`render_node`] gives `node` for `a`, by name, as the cache would show them.
    fn objects_of(node: &str, a: &NodeAssignments) -> NodeObjects {
        render_node(node, a, 0)
            .into_iter()
            .map(|(name, data, _)| (name, data))
            .collect()
    }

    fn configmap(name: &str, data: &[(&str, &str)]) -> ConfigMap {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some(name.into());
        cm.data = Some(
            data.iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        );
        cm
    }

    #[test]
    fn only_our_objects_give_nodes_and_only_for_the_services_they_list() {
        // n1 in the single-object format of earlier releases, n2 unreadable, n3 sharded.
        let legacy = configmap(
            "aliaslb-node-n1",
            &[(keys::ASSIGNMENTS_KEY, "10.0.0.1 - - default/web\n")],
        );
        let garbage = configmap("aliaslb-node-n2", &[(keys::ASSIGNMENTS_KEY, "not a line")]);
        let index = configmap(
            "aliaslb-node-n3",
            &[
                (keys::ASSIGNMENTS_KEY, LEGACY_MARKER),
                (keys::SHARDS_KEY, "1"),
            ],
        );
        let shard = configmap(
            "aliaslb-shard-n3-0",
            &[(keys::ASSIGNMENTS_KEY, "10.0.0.3 - - default/db\n")],
        );
        let other = configmap("aliaslb-pools", &[]);
        let seen = observed([&legacy, &garbage, &index, &shard, &other]);
        assert_eq!(
            seen["n1"]["aliaslb-node-n1"].node_macs, None,
            "an object without node MACs reads as none"
        );
        assert_eq!(seen.keys().collect::<Vec<_>>(), vec!["n1", "n2", "n3"]);
        assert_eq!(count_in_force("n1", &seen["n1"]), 0);
        assert_eq!(count_in_force("n3", &seen["n3"]), 1);
        let trusted = trusted_nodes(&seen);
        let web = ServiceKey::new("default", "web");
        let db = ServiceKey::new("default", "db");
        let thief = ServiceKey::new("tenant", "thief");
        assert_eq!(
            trusted_node_of(&web, &[ip("10.0.0.1")], &trusted),
            Some("n1")
        );
        assert_eq!(
            trusted_node_of(&db, &[ip("10.0.0.3")], &trusted),
            Some("n3")
        );
        assert_eq!(trusted_node_of(&thief, &[ip("10.0.0.1")], &trusted), None);
        assert_eq!(trusted_node_of(&web, &[ip("10.0.0.2")], &trusted), None);
        assert_eq!(node_of("aliaslb-node-"), None);
        assert_eq!(node_of("aliaslb-shard-n3-0"), Some("n3"));
        // A shard the index counts but the cache lacks: the node reads as unreadable.
        let mut lacking = seen["n3"].clone();
        lacking.remove("aliaslb-shard-n3-0");
        let e = read_node("n3", &lacking).unwrap_err();
        assert!(e.contains("missing"), "{e}");
    }

    #[test]
    fn a_growing_node_writes_its_new_shards_first_and_its_old_ones_last() {
        let mut a = NodeAssignments::new();
        for i in 0..600u32 {
            let ip = IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i));
            a.assign(ip, None, [], &format!("ns/s{i}"));
        }
        // From the single-object format: every shard is new, then the index.
        let rounds: Vec<(String, Round)> = render_node("n1", &a, 0)
            .into_iter()
            .map(|(name, _, round)| (name, round))
            .collect();
        assert_eq!(
            rounds,
            vec![
                ("aliaslb-shard-n1-0".to_owned(), Round::NewShard),
                ("aliaslb-shard-n1-1".to_owned(), Round::NewShard),
                ("aliaslb-node-n1".to_owned(), Round::Index),
            ]
        );
        // From 1 shard: the new one, the index, then the old one.
        let rounds: Vec<Round> = render_node("n1", &a, 1)
            .into_iter()
            .map(|(_, _, r)| r)
            .collect();
        assert_eq!(rounds, vec![Round::OldShard, Round::NewShard, Round::Index]);
        // The count in force stays: one round.
        let objects = render_node("n1", &a, 2);
        assert!(objects.iter().all(|(_, _, r)| *r == Round::Index));
        let by_name: NodeObjects = objects.into_iter().map(|(n, d, _)| (n, d)).collect();
        assert_eq!(read_node("n1", &by_name).unwrap(), a);
        // It never shrinks.
        let small = render_node("n1", &NodeAssignments::new(), 4);
        assert_eq!(small.len(), 5);
        let by_name: NodeObjects = small.into_iter().map(|(n, d, _)| (n, d)).collect();
        assert!(read_node("n1", &by_name).unwrap().is_empty());
    }

    #[test]
    fn a_change_renders_its_own_shard_as_the_whole_node_would() {
        let ip = |i: u32| IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i));
        let mut a = NodeAssignments::new();
        for i in 0..1500u32 {
            a.assign(ip(i), None, [], &format!("ns/s{i}"));
        }
        let count = count_in_force("n1", &objects_of("n1", &a));
        assert_eq!(count, 4, "1,500 lines: four shards");
        // What a pass hands over for `only`: the lines of the Services with an IP there.
        let within = |a: &NodeAssignments, only: &ShardsOf| {
            let mut want = a.clone();
            want.ips.retain(|ip, _| only.holds_any(&[*ip]));
            want
        };
        // One line added, one removed, one changed: each renders its shard and the index,
        // the same objects as the whole node's render.
        let mut added = a.clone();
        added.assign(ip(1500), None, [], "ns/new");
        let mut removed = a.clone();
        removed.ips.remove(&ip(7));
        let mut changed = a.clone();
        changed.assign(ip(9), Some("eth1"), [], "ns/s9");
        for (what, after, ips) in [
            ("added", &added, vec![ip(1500)]),
            ("removed", &removed, vec![ip(7)]),
            ("changed", &changed, vec![ip(9)]),
            ("two lines", &changed, vec![ip(9), ip(1200)]),
        ] {
            let only = ShardsOf::new(ips.iter().copied(), count);
            let partial = render_shards("n1", &within(after, &only), &only).unwrap();
            let whole = render_node("n1", after, count);
            let shards: BTreeSet<String> = ips
                .iter()
                .map(|ip| keys::assignment_shard_configmap("n1", shards::shard_of(*ip, count)))
                .chain([keys::assignment_configmap("n1")])
                .collect();
            let names: BTreeSet<String> = partial.iter().map(|(n, ..)| n.clone()).collect();
            assert_eq!(names, shards, "{what}: its shards and the index");
            let expected: Vec<_> = whole
                .into_iter()
                .filter(|(n, ..)| shards.contains(n))
                .collect();
            assert_eq!(partial, expected, "{what}");
            // Written over the old objects, they read as the whole node.
            let mut objects = objects_of("n1", &a);
            objects.extend(partial.into_iter().map(|(n, d, _)| (n, d)));
            assert_eq!(&read_node("n1", &objects).unwrap(), after, "{what}");
        }
        // A shard that outgrows the count: no partial render (the count grows).
        let mut crowded = a.clone();
        let only = ShardsOf::new([ip(0)], count);
        let mut i = 2000;
        while within(&crowded, &only).ips.len() <= shards::MAX_SHARD_LINES {
            if only.holds_any(&[ip(i)]) {
                crowded.assign(ip(i), None, [], &format!("ns/s{i}"));
            }
            i += 1;
        }
        assert_eq!(render_shards("n1", &within(&crowded, &only), &only), None);
    }

    #[test]
    fn an_index_that_brings_a_forward_goes_before_the_shards() {
        let index = |handovers: Option<&str>| ObjectData {
            handovers: handovers.map(str::to_owned),
            ..ObjectData::default()
        };
        let forward = "10.0.0.1 tcp:80 forward=n2@192.168.0.2\n";
        let draining = "10.0.0.2 tcp:80 draining\n";
        assert!(brings_forward(None, &index(Some(forward))));
        assert!(brings_forward(Some(&index(None)), &index(Some(forward))));
        assert!(!brings_forward(
            Some(&index(Some(forward))),
            &index(Some(forward))
        ));
        assert!(!brings_forward(Some(&index(None)), &index(Some(draining))));
        assert!(!brings_forward(Some(&index(Some(forward))), &index(None)));
        assert!(Round::Forwards < Round::NewShard && Round::NewShard < Round::Index);
    }
}
