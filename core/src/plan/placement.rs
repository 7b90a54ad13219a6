//! The node step of a pass: which node carries each IP group, break-before-make, and the
//! rendering of each Service's desired state and Announced condition. Pure; the election
//! rules themselves live in [`crate::election`].
//!
//! Per group, in order:
//! 1. a graceful move in progress ends once the old node's agent no longer holds any of
//!    the group's IPs (or is no longer ready);
//! 2. a current node whose agent reports a conflict for one of the IPs is kept: another
//!    owner of the address is on that node's LAN, so moving would duplicate it;
//! 3. a current node still eligible is kept; one that is not but whose agent is ready is
//!    left gracefully (desired node `None` until its agent lets go); a node whose agent is
//!    not ready is a hard loss and the group is re-elected at once;
//! 4. otherwise the least-loaded eligible node is elected (load = groups per node).
//!
//! While [`Inputs::agents_unobservable`] (no agent seen renewing at all: the controller
//! is blind, not every node dead), the step changes nothing: each group keeps its node
//! or its move in progress, and a group without a node stays pending with the reason
//! `AgentsUnobservable`. Cordons and selector changes wait for sight too.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

use litemap::LiteMap;

use super::{
    ConditionPlan, Group, GroupId, Inputs, LAN_HOST_BOUND, MAX_MESSAGE, Pass, Planner, ServiceKey,
    ServicePlan, ServiceView, Sink, Standby, join, reason,
};
use crate::election::{
    ElectionInput, Ineligible, NodeState, address_on_subnet, announcers, elect, ineligibility,
    standby,
};
use crate::keys::LABEL_EXCLUDE_FROM_LB;
use crate::mac::Mac;
use crate::pool::{Announce, PoolOptions};
use crate::report::{AgentReport, Conflict};
use crate::text;

/// Why a group without a node gets none while the agents are unobservable.
const UNOBSERVABLE: &str = "no node elected: no agent Lease was seen renewed within its \
     lease duration, so the controller cannot see the agents (kube-apiserver or its watch \
     interrupted?); every node keeps what it carries and no node is elected until it sees \
     them again";

/// An Event for every member of a group: (warning, reason, message).
type Note = (bool, &'static str, String);

/// What the node step reads besides the group itself.
struct NodeStep<'a> {
    inputs: &'a Inputs<'a>,
    by_name: HashMap<&'a str, &'a NodeState>,
}

impl NodeStep<'_> {
    /// Whether the agent on `node` counts as there for what the node already carries:
    /// fresh, or unconfirmed (see [`NodeState::agent_unconfirmed`]).
    fn ready(&self, node: &str) -> bool {
        self.by_name
            .get(node)
            .is_some_and(|n| n.agent_ready || n.agent_unconfirmed)
    }

    /// Whether any agent, fresh or stale, reports holding `ip`.
    fn held_anywhere(&self, ip: IpAddr) -> bool {
        self.inputs.agents.values().any(|r| r.held.contains(&ip))
    }

    fn holds_any(&self, node: &str, ips: &[IpAddr]) -> bool {
        self.inputs
            .agents
            .get(node)
            .is_some_and(|r| ips.iter().any(|ip| r.held.contains(ip)))
    }
}

impl Planner {
    /// Places every IP group on a node.
    /// Groups are visited in the order of their oldest member, so older Services get the
    /// first pick of the least-loaded nodes.
    /// `full`: every group is in `order` (a full pass).
    pub(super) fn place(
        &mut self,
        pass: &Pass<'_>,
        order: &[&ServiceView],
        full: bool,
        sink: &mut Sink,
    ) {
        if order.is_empty() && !full {
            return;
        }
        let inputs = pass.inputs;
        let world = NodeStep {
            inputs,
            by_name: inputs.nodes.iter().map(|n| (n.name.as_ref(), n)).collect(),
        };
        // The load of every node ([`Planner::load`]), kept up to date by every move; a
        // full pass counts it again (cheap, and it cannot drift).
        if full {
            self.load.clear();
            for node in self.groups.values().filter_map(|g| g.node.as_ref()) {
                match self.load.get_mut(node) {
                    Some(n) => *n += 1,
                    None => {
                        self.load.insert(node.clone(), 1);
                    }
                }
            }
        }
        let no_selector = BTreeMap::new();
        let Planner {
            groups,
            ips,
            entries,
            views,
            probing,
            load,
            ..
        } = self;
        let mut seen: HashSet<&GroupId> = HashSet::with_capacity(groups.len());
        for view in order {
            let Some(entry) = entries.get(&view.key) else {
                continue;
            };
            // A group of one is met once; only sharing groups need the visited set.
            let shared = matches!(entry.group, GroupId::Shared { .. });
            if entry.ips.is_empty() || (shared && !seen.insert(&entry.group)) {
                continue;
            }
            let Some(group) = groups.get_mut(&entry.group) else {
                continue;
            };
            // At most one IP per family: no need for a heap allocation.
            let mut buf = [IpAddr::from([0, 0, 0, 0]); 2];
            let mut count = 0;
            for (slot, ip) in buf.iter_mut().zip(group.ips.values()) {
                *slot = *ip;
                count += 1;
            }
            let group_ips = &buf[..count];
            let Some(first) = group_ips.first() else {
                continue;
            };
            let options = ips
                .get(first)
                .and_then(|used| inputs.config.pool(&used.pool))
                .map(|pool| &pool.options);
            let selector = options.map_or(&no_selector, |o| &o.node_selector);
            let local = local_nodes(&group.members, views, inputs.local_endpoints);
            let input = ElectionInput {
                ips: group_ips,
                current: None,
                node_selector: selector,
                local_endpoint_nodes: local.as_ref(),
                respect_cordon: inputs.respect_cordon,
            };
            let notes = match options.filter(|o| o.announce == Announce::Bgp) {
                Some(options) => step_bgp(group, &input, &world, options, load),
                None => step(group, &input, &world, load),
            };
            for (warning, why, message) in notes {
                for member in group.members.keys() {
                    sink.event(member, warning, why, message.clone());
                }
            }
            update_claims(group, group_ips, &world);
            if group.node.is_some() && group.claims.iter().any(|(_, probe)| *probe) {
                if !probing.contains(&entry.group) {
                    probing.insert(entry.group.clone());
                }
            } else if !probing.is_empty() {
                probing.remove(&entry.group);
            }
        }
    }

    /// The desired state of one Service after the pass; reports a new address conflict.
    pub(super) fn render(
        &mut self,
        view: &ServiceView,
        pass: &Pass<'_>,
        sink: &mut Sink,
    ) -> ServicePlan {
        let inputs = pass.inputs;
        let key = &view.key;
        let Some(entry) = self.entries.get(key) else {
            return ServicePlan {
                ips: Vec::new(),
                node: None,
                nodes: Vec::new(),
                interface: None,
                virtual_mac: false,
                standby: None,
                allocated: condition(false, reason::NOT_ALLOCATED, "not planned".to_owned()),
                announced: condition(false, reason::NOT_ALLOCATED, "not planned".to_owned()),
            };
        };
        let mut ips: Vec<IpAddr> = view
            .families
            .families
            .iter()
            .filter_map(|f| entry.ips.get(f).copied())
            .collect();
        for ip in entry.ips.values() {
            if !ips.contains(ip) {
                ips.push(*ip);
            }
        }
        // Collected with room for four; the index keeps the plan.
        ips.shrink_to_fit();
        // The pool of its addresses (one pool per Service).
        let pool = entry
            .ips
            .values()
            .find_map(|ip| self.ips.get(ip))
            .and_then(|used| inputs.config.keyed(&used.pool));
        // A node claims one of its addresses: kept, and said (see `withheld`).
        let claim = ips.iter().find_map(|ip| Some((*ip, self.claim_on(*ip)?)));
        let allocated = match (&entry.failure, pool) {
            (Some(f), _) => condition(false, f.reason, f.message.clone()),
            (None, Some((pool_key, _))) if !ips.is_empty() => match claim {
                Some((ip, cause)) => condition(
                    true,
                    reason::NODE_CLAIM,
                    format!(
                        "assigned {} from pool {pool_key}; {}",
                        join(&ips),
                        cause.kept(ip)
                    ),
                ),
                None => condition(
                    true,
                    reason::ALLOCATED,
                    format!("assigned {} from pool {pool_key}", join(&ips)),
                ),
            },
            (None, _) => condition(
                false,
                reason::NOT_ALLOCATED,
                "no address allocated yet".into(),
            ),
        };
        let group = if ips.is_empty() {
            None
        } else {
            self.groups.get(&entry.group).map(|g| &**g)
        };
        let node = group.and_then(|g| g.node.clone());
        let nodes = group.map(|g| g.announcers.clone()).unwrap_or_default();
        let interface = match (pool, ips.is_empty()) {
            (Some((_, pool)), false) => pool.options.interface.clone(),
            _ => None,
        };
        let bgp = pool.is_some_and(|(_, pool)| pool.options.announce == Announce::Bgp);
        let virtual_mac = !bgp && pool.is_some_and(|(_, pool)| pool.options.virtual_mac);
        let (announced, conflict) = if bgp {
            (announced_bgp(&ips, group, inputs), None)
        } else {
            announced(
                &ips,
                group,
                interface.as_deref(),
                inputs,
                self.lan_hosts_at_bound(),
            )
        };
        if (conflict.is_some() || entry.conflict.is_some())
            && let Some(entry) = self.entries.get_mut(key)
            && entry.conflict.as_deref() != conflict.as_ref().map(|(_, m)| m.as_str())
        {
            if let Some((why, message)) = &conflict {
                sink.event(key, true, why, message.clone());
            }
            entry.conflict = conflict.map(|(_, m)| Box::from(m));
        }
        // A node with its address on the subnet of each IP it can serve.
        let on_lan = |name: &Arc<str>| {
            let state = inputs.nodes.iter().find(|n| n.name == *name)?;
            let addresses: Vec<(IpAddr, IpAddr)> = ips
                .iter()
                .filter_map(|ip| Some((*ip, address_on_subnet(state, *ip)?)))
                .collect();
            (!addresses.is_empty()).then(|| (name.clone(), addresses))
        };
        let standby = group.filter(|g| g.node.is_some()).and_then(|g| {
            let (node, addresses) = on_lan(g.standby.as_ref()?)?;
            let relay = g.relay.as_ref().and_then(on_lan);
            Some(Box::new(Standby {
                node,
                addresses,
                relay,
            }))
        });
        ServicePlan {
            ips,
            node,
            nodes,
            interface,
            virtual_mac,
            standby,
            allocated,
            announced,
        }
    }
}

/// One group's node decision, then its standby ([`standby`]); returns the Events for its
/// members. Blind, the standby stays as it is, like the node.
fn step(
    group: &mut Group,
    input: &ElectionInput<'_>,
    world: &NodeStep<'_>,
    load: &mut BTreeMap<Arc<str>, usize>,
) -> Vec<Note> {
    let notes = step_holder(group, input, world, load);
    if !world.inputs.agents_unobservable {
        let nodes = world.inputs.nodes;
        group.standby = group
            .node
            .as_deref()
            .and_then(|holder| standby(input, nodes, &[holder], group.standby.as_deref(), load));
        group.relay = match (group.node.as_deref(), group.standby.as_deref()) {
            (Some(holder), Some(standby_node)) => standby(
                input,
                nodes,
                &[holder, standby_node],
                group.relay.as_deref(),
                load,
            ),
            _ => None,
        };
    }
    notes
}

/// One group's holder decision; returns the Events for its members.
fn step_holder(
    group: &mut Group,
    input: &ElectionInput<'_>,
    world: &NodeStep<'_>,
    load: &mut BTreeMap<Arc<str>, usize>,
) -> Vec<Note> {
    let mut notes = Vec::new();
    // A pool switched from L3 to L2 mode: its nodes withdraw, one node is elected.
    group.announcers.clear();
    if world.inputs.agents_unobservable {
        // Blind: nothing the controller sees of the agents is news. Keep every node and
        // move in progress; elect nothing.
        if group.node.is_none() && group.moving_from.is_none() {
            let message = UNOBSERVABLE.to_owned();
            if group.no_node.as_ref() != Some(&message) {
                notes.push((true, reason::AGENTS_UNOBSERVABLE, message.clone()));
                group.no_node = Some(message);
            }
        }
        return notes;
    }
    // A node carried the IPs before (or is letting go of them): whoever is elected now
    // takes over from a known holder and must not wait for a probe.
    let had_holder = group.node.is_some() || group.moving_from.is_some();
    if let Some(old) = &group.moving_from {
        if world.ready(old) && world.holds_any(old, input.ips) {
            return notes;
        }
        group.moving_from = None;
    }
    let mut left: Option<(Arc<str>, String)> = None;
    if let Some(standby) = took_over(group, input, world, load)
        && let Some(cur) = group.node.take()
    {
        // Where the addresses already are: no move on the LAN, only the record of it.
        super::unload(load, &cur);
        let why = format!(
            "its standby {standby} took {} over on the LAN and the agent on {cur} reports \
             that it no longer holds them",
            join(input.ips)
        );
        left = Some((cur, why));
    }
    if let Some(cur) = group.node.as_deref() {
        let ready = world.ready(cur);
        if ready && conflict_on(world.inputs.agents.get(cur).map(|r| &**r), input.ips).is_some() {
            return notes;
        }
        let with_current = ElectionInput {
            current: Some(cur),
            ..*input
        };
        if elect(&with_current, world.inputs.nodes, load).is_ok_and(|n| &*n == cur) {
            return notes;
        }
    }
    if let Some(cur) = group.node.take() {
        let ready = world.ready(&cur);
        super::unload(load, &cur);
        let why = why_leaving(&cur, world.by_name.get(&*cur).copied(), input);
        if ready && world.holds_any(&cur, input.ips) {
            notes.push((
                false,
                reason::NODE_MOVED,
                format!(
                    "moving off {cur} ({why}): waiting for its agent to release {}",
                    join(input.ips)
                ),
            ));
            group.moving_from = Some(cur);
            return notes;
        }
        left = Some((cur, why));
    }
    // A holder lost for good: its standby, if still eligible, may already carry the IPs
    // (it takes them over on the LAN when the adverts stop): keep them there.
    let standby_first = group.standby.as_deref().filter(|_| left.is_some());
    let elected = match standby_first {
        Some(standby) => elect(
            &ElectionInput {
                current: Some(standby),
                ..*input
            },
            world.inputs.nodes,
            load,
        )
        .or_else(|_| elect(input, world.inputs.nodes, load)),
        None => elect(input, world.inputs.nodes, load),
    };
    match elected {
        Ok(node) => {
            *load.entry(node.clone()).or_default() += 1;
            notes.push(match left {
                Some((old, why)) => (
                    false,
                    reason::NODE_MOVED,
                    format!("moved from {old} to {node}: {why}"),
                ),
                None => (false, reason::NODE_ASSIGNED, format!("assigned to {node}")),
            });
            group.node = Some(node);
            group.no_node = None;
            group.claims = input
                .ips
                .iter()
                .map(|ip| (*ip, !had_holder && !world.held_anywhere(*ip)))
                .collect();
        }
        Err(none) => {
            if let Some((old, why)) = left {
                notes.push((true, reason::NODE_MOVED, format!("moved off {old}: {why}")));
            }
            let message = none.to_string();
            if group.no_node.as_ref() != Some(&message) {
                notes.push((true, reason::NO_ELIGIBLE_NODE, message.clone()));
                group.no_node = Some(message);
            }
        }
    }
    notes
}

/// The group's standby, when it took the group's addresses over on the LAN and the holder
/// yielded them to that claim (its agent, back or reconnected, heard it while its Lease was
/// stale): the standby then becomes the holder at once (DESIGN, "Fast L2 failover"), not
/// only when the holder's Lease expires, which a restarted agent renews first.
///
/// Only where nothing moves on the LAN: both agents fresh (Leases renewed within this
/// term), the standby holding every address and still eligible, the holder holding none and
/// reporting each as yielded ([`Conflict::yielded`]: it stays down while the standby answers
/// for it, so it cannot come back while the standby is made the holder) to a claim from one
/// of the standby's links (`macs` of its report). A holder that merely has not added them
/// yet, defends one (its link may have lost carrier: the report leaves the alias out of
/// `held` but it is still there), or still holds one (a LAN split between the two, which
/// the standby settles by giving them back), keeps them.
fn took_over(
    group: &Group,
    input: &ElectionInput<'_>,
    world: &NodeStep<'_>,
    load: &BTreeMap<Arc<str>, usize>,
) -> Option<Arc<str>> {
    let holder = group.node.as_deref()?;
    let standby = group.standby.as_deref()?;
    let holder_report = world.inputs.agents.get(holder)?;
    let standby_report = world.inputs.agents.get(standby)?;
    // Yielded to the standby itself: the claim came from one of the standby's links.
    let by_standby = |c: &Conflict| c.mac.is_some_and(|m| standby_report.macs.contains(&m));
    let yielded = |ip: &IpAddr| {
        !holder_report.held.contains(ip)
            && holder_report
                .conflicts
                .iter()
                .any(|c| c.ip == *ip && c.yielded && by_standby(c))
    };
    let carries = |ip: &IpAddr| standby_report.held.contains(ip);
    let fresh = |node: &str| world.by_name.get(node).is_some_and(|n| n.agent_ready);
    if input.ips.is_empty()
        || !(fresh(holder) && fresh(standby))
        || !input.ips.iter().all(|ip| yielded(ip) && carries(ip))
    {
        return None;
    }
    let with_standby = ElectionInput {
        current: Some(standby),
        ..*input
    };
    elect(&with_standby, world.inputs.nodes, load)
        .ok()
        .filter(|n| &**n == standby)
}

/// L3 mode: one group's announcing nodes ([`announcers`]); returns the Events for its
/// members. There is no single holder and no break-before-make: each node's path is added
/// or withdrawn on its own (the router keeps the others), and nothing is probed, since
/// the addresses are on no LAN.
fn step_bgp(
    group: &mut Group,
    input: &ElectionInput<'_>,
    world: &NodeStep<'_>,
    options: &PoolOptions,
    load: &mut BTreeMap<Arc<str>, usize>,
) -> Vec<Note> {
    let mut notes = Vec::new();
    if let Some(node) = group.node.take() {
        super::unload(load, &node);
    }
    group.moving_from = None;
    group.claims.clear();
    if world.inputs.agents_unobservable {
        if group.announcers.is_empty() {
            let message = UNOBSERVABLE.to_owned();
            if group.no_node.as_ref() != Some(&message) {
                notes.push((true, reason::AGENTS_UNOBSERVABLE, message.clone()));
                group.no_node = Some(message);
            }
        }
        return notes;
    }
    let why_gone = |node: &str| match world.by_name.get(node) {
        Some(state) if ineligibility(input, state).is_none() => {
            format!("{node}: the pool's maxNodes is reached")
        }
        state => why_leaving(node, state.copied(), input),
    };
    match announcers(
        input,
        world.inputs.nodes,
        &group.announcers,
        options.max_nodes,
    ) {
        Ok(now) => {
            if now != group.announcers {
                let added: Vec<&str> = now
                    .iter()
                    .filter(|n| !group.announcers.contains(n))
                    .map(|n| &**n)
                    .collect();
                let mut parts = Vec::new();
                if !added.is_empty() {
                    parts.push(format!("announced from {}", added.join(", ")));
                }
                for gone in group.announcers.iter().filter(|n| !now.contains(n)) {
                    parts.push(format!("withdrawn from {gone} ({})", why_gone(gone)));
                }
                notes.push((
                    false,
                    reason::NODE_ASSIGNED,
                    format!(
                        "BGP: {}; announcing nodes: {}",
                        parts.join("; "),
                        now.join(", ")
                    ),
                ));
            }
            group.announcers = now;
            group.no_node = None;
        }
        Err(none) => {
            for gone in &group.announcers {
                notes.push((
                    true,
                    reason::NODE_MOVED,
                    format!("BGP: withdrawn from {gone} ({})", why_gone(gone)),
                ));
            }
            group.announcers.clear();
            let message = none.to_string();
            if group.no_node.as_ref() != Some(&message) {
                notes.push((true, reason::NO_ELIGIBLE_NODE, message.clone()));
                group.no_node = Some(message);
            }
        }
    }
    notes
}

/// Keeps the group's first claims ([`Group::claims`]) in step with its node and IPs: none
/// without a node; an IP the group gained while placed (a new family, or a replacement
/// for a withheld address) is a first claim unless some agent holds it; a first claim ends
/// once the node's agent reports holding the IP (the flag is dropped, one rewrite of
/// that node's assignment, so an agent restarting later re-adds it at once).
fn update_claims(group: &mut Group, ips: &[IpAddr], world: &NodeStep<'_>) {
    let Some(node) = &group.node else {
        group.claims.clear();
        return;
    };
    group.claims.retain(|(ip, _)| ips.contains(ip));
    for ip in ips {
        if !group.claims.iter().any(|(claimed, _)| claimed == ip) {
            group.claims.push((*ip, !world.held_anywhere(*ip)));
        }
    }
    let report = world.inputs.agents.get(&**node).map(|r| &**r);
    for (ip, probe) in &mut group.claims {
        if *probe && report.is_some_and(|r| r.held.contains(ip)) {
            *probe = false;
        }
    }
}

/// Why the group leaves `node`, for the NodeMoved Event.
fn why_leaving(node: &str, state: Option<&NodeState>, input: &ElectionInput<'_>) -> String {
    let Some(state) = state else {
        return format!("node {node} no longer exists");
    };
    match ineligibility(input, state) {
        Some(Ineligible::Cordoned) => format!("{node} is cordoned"),
        Some(Ineligible::Excluded) => format!("{node} is labelled {LABEL_EXCLUDE_FROM_LB}"),
        Some(Ineligible::NotSelected) => {
            format!("{node} no longer matches the pool's node selector")
        }
        Some(Ineligible::NoLocalEndpoint) => format!("{node} has no ready local endpoint"),
        Some(Ineligible::AgentNotReady) => {
            format!("the agent on {node} is not ready (its lease expired)")
        }
        None => format!("{node} is not on the addresses' subnet and another eligible node is"),
    }
}

/// For groups with `externalTrafficPolicy: Local` members: the nodes with a ready endpoint
/// of every such member (`endpoints`, a Service missing there has none). `None` when no
/// member is Local. Only `externalTrafficPolicy: Local` Services constrain the election by
/// endpoints.
fn local_nodes(
    members: &LiteMap<ServiceKey, ()>,
    views: &HashMap<ServiceKey, Arc<ServiceView>>,
    endpoints: &BTreeMap<ServiceKey, BTreeSet<String>>,
) -> Option<BTreeSet<String>> {
    let none = BTreeSet::new();
    let mut nodes: Option<BTreeSet<String>> = None;
    for member in members.keys() {
        if !views.get(member).is_some_and(|v| v.local_traffic) {
            continue;
        }
        let here = endpoints.get(member).unwrap_or(&none);
        nodes = Some(match nodes {
            None => here.clone(),
            Some(so_far) => so_far.intersection(here).cloned().collect(),
        });
    }
    nodes
}

/// The conflict an agent reports for one of `ips`, if any.
fn conflict_on<'r>(report: Option<&'r AgentReport>, ips: &[IpAddr]) -> Option<&'r Conflict> {
    report?.conflicts.iter().find(|c| ips.contains(&c.ip))
}

/// The Announced condition of a Service with `ips` in `group`, and the reason and message
/// of its conflict (`AddressConflict`, or `AddressDefended` for a claim its holder defends).
///
/// `at_bound`: the LAN hosts that answer for [`LAN_HOST_BOUND`] addresses or more, whose
/// answers renumber nothing: a conflict with one of them says so.
fn announced(
    ips: &[IpAddr],
    group: Option<&Group>,
    interface: Option<&str>,
    inputs: &Inputs<'_>,
    at_bound: &BTreeMap<Mac, Vec<IpAddr>>,
) -> (ConditionPlan, Option<(&'static str, String)>) {
    let Some(group) = group else {
        return (
            condition(
                false,
                reason::NOT_ALLOCATED,
                "no address allocated yet".into(),
            ),
            None,
        );
    };
    if let Some(old) = &group.moving_from {
        let message = format!(
            "moving off {old}: waiting for its agent to release {}",
            join(ips)
        );
        return (condition(false, reason::MOVING, message), None);
    }
    let Some(node) = &group.node else {
        return (unplaced(group, inputs, "no node elected yet"), None);
    };
    let report = inputs.agents.get(&**node).map(|r| &**r);
    let holds_all = report.is_some_and(|r| ips.iter().all(|ip| r.held.contains(ip)));
    let on = |r: &AgentReport| {
        interface
            .map(str::to_owned)
            .or_else(|| {
                r.interfaces
                    .iter()
                    .find(|i| i.subnets.iter().any(|net| net.contains(&ips[0])))
                    .map(|i| i.name.clone())
            })
            .map(|i| format!(" on {i}"))
            .unwrap_or_default()
    };
    let defended = |c: &&Conflict| c.while_held && c.mac.is_some();
    if let Some(r) = report.filter(|_| holds_all)
        && let Some(c) = conflict_on(report, ips)
        && r.conflicts
            .iter()
            .filter(|c| ips.contains(&c.ip))
            .all(|c| defended(&c))
    {
        // Still held: the agent defends it, nothing moves (see `lan_conflicts`). Names the
        // MAC itself rather than trusting the agent's text to.
        let mac = c.mac.map(|m| m.to_string()).unwrap_or_default();
        let seen = c
            .interface
            .as_deref()
            .map(|i| format!(" (seen on {i})"))
            .unwrap_or_default();
        let message = text::bounded(
            format!(
                "held by {node}{}, which defends {} against a claim on the LAN by {mac}{seen}: \
                 {}; the Service keeps its address",
                on(r),
                c.ip,
                c.reason
            ),
            MAX_MESSAGE,
        );
        return (
            condition(true, reason::ADDRESS_DEFENDED, message.clone()),
            Some((reason::ADDRESS_DEFENDED, message)),
        );
    }
    if let Some(c) = conflict_on(report, ips)
        && let Some(mac) = c.mac.filter(|m| at_bound.contains_key(m))
    {
        // One host answering for address after address: it renumbers nothing (see
        // `lan_withheld`). The text stays the same while the host answers for more, so the
        // Services it keeps are not told again each time. Names the MAC itself rather than
        // trusting the agent's text to.
        let seen = c
            .interface
            .as_deref()
            .map(|i| format!(" on {i}"))
            .unwrap_or_default();
        let message = text::bounded(
            format!(
                "{node} reports {} answered on the LAN by {mac}{seen}, a host that answers for \
                 {LAN_HOST_BOUND} addresses of the pools or more (`aliaslb status` lists them \
                 as conflicts): such a host's answers renumber no Service, so the Service \
                 keeps {}, not announced while that host answers for it. A host answering \
                 every probe is a proxy-ARP router or a misconfigured host on the LAN: fix \
                 it, or request another address",
                c.ip, c.ip
            ),
            MAX_MESSAGE,
        );
        return (
            condition(false, reason::ADDRESS_CONFLICT, message.clone()),
            Some((reason::ADDRESS_CONFLICT, message)),
        );
    }
    if let Some(c) = conflict_on(report, ips) {
        // Quotes the agent: bounded here, so the condition and the Event say the same. An
        // agent knows only its LAN peers' MACs: the controller names the node of a MAC it
        // reports as a stranger's.
        let owner = c.mac.and_then(|mac| {
            inputs
                .agents
                .iter()
                .find(|(other, r)| other.as_str() != &**node && r.macs().any(|m| m == mac))
                .map(|(other, _)| format!(" ({mac} is node {other}'s)"))
        });
        let message = text::bounded(
            format!(
                "{node} reports a conflict for {}: {}{}; the assignment is kept, since moving \
                 it would put the address on the LAN twice",
                c.ip,
                c.reason,
                owner.unwrap_or_default()
            ),
            MAX_MESSAGE,
        );
        return (
            condition(false, reason::ADDRESS_CONFLICT, message.clone()),
            Some((reason::ADDRESS_CONFLICT, message)),
        );
    }
    let standby = group.standby.as_deref().and_then(|s| {
        let r = inputs.agents.get(s)?;
        ips.iter().all(|ip| r.held.contains(ip)).then_some((s, r))
    });
    match (report, standby) {
        (Some(r), _) if holds_all => (
            condition(true, reason::ANNOUNCED, format!("held by {node}{}", on(r))),
            None,
        ),
        (_, Some((s, r))) => (
            condition(
                true,
                reason::TAKEN_OVER,
                format!(
                    "held by the standby {s}{}, which took it over on the LAN when {node} went silent; it becomes the holder once {node}'s Lease expires or its agent reports it let the address go, or gives it back once {node} is heard on the LAN again (a LAN partition between the nodes)",
                    on(r)
                ),
            ),
            None,
        ),
        _ => (
            condition(
                false,
                reason::WAITING_FOR_AGENT,
                format!("waiting for the agent on {node} to add {}", join(ips)),
            ),
            None,
        ),
    }
}

/// Whether `node` announces every one of `ips` over BGP: `Ok(established sessions)`, or
/// why not, as its agent reports it.
fn announces(node: &str, ips: &[IpAddr], inputs: &Inputs<'_>) -> Result<u32, String> {
    let Some(report) = inputs.agents.get(node) else {
        return Err(format!("{node}: waiting for its agent"));
    };
    let missing: Vec<IpAddr> = ips
        .iter()
        .filter(|ip| !report.held.contains(ip))
        .copied()
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "{node}: waiting for its agent to add {}",
            join(&missing)
        ));
    }
    let Some(routing) = &report.routing else {
        return Err(format!(
            "{node}: its agent reads no routing daemon (--routing-daemon=none), so whether \
             the daemon exports the addresses is unknown"
        ));
    };
    let daemon = &routing.daemon;
    if let Some(error) = &routing.error {
        return Err(format!("{node}: {daemon} cannot be read: {error}"));
    }
    if routing.established == 0 {
        return Err(format!(
            "{node}: {daemon} has no Established BGP session ({} configured)",
            routing.sessions
        ));
    }
    let filtered: Vec<IpAddr> = ips
        .iter()
        .filter(|ip| !routing.exported.contains(ip))
        .copied()
        .collect();
    if !filtered.is_empty() {
        return Err(format!(
            "{node}: {daemon} does not export {} to its peers (its export filter must \
             accept the pool's host routes)",
            join(&filtered)
        ));
    }
    Ok(routing.established)
}

/// L3 mode: the Announced condition of a Service with `ips` in `group`: True when at least
/// one announcing node's daemon exports every IP to an Established peer (reason
/// `PartiallyAnnounced` while some do not, naming them); False otherwise.
fn announced_bgp(ips: &[IpAddr], group: Option<&Group>, inputs: &Inputs<'_>) -> ConditionPlan {
    let Some(group) = group else {
        return condition(
            false,
            reason::NOT_ALLOCATED,
            "no address allocated yet".into(),
        );
    };
    if group.announcers.is_empty() {
        return unplaced(group, inputs, "no node chosen yet");
    }
    let total = group.announcers.len();
    let mut on = Vec::new();
    let mut peers = 0u32;
    let mut off = Vec::new();
    let mut waiting = 0;
    for node in &group.announcers {
        match announces(node, ips, inputs) {
            Ok(established) => {
                on.push(node.as_ref());
                peers = peers.saturating_add(established);
            }
            Err(why) => {
                waiting += usize::from(why.contains("waiting for its agent"));
                off.push(why);
            }
        }
    }
    let nodes = |n: usize| if n == 1 { "node" } else { "nodes" };
    let peer_s = if peers == 1 { "peer" } else { "peers" };
    if off.is_empty() {
        return condition(
            true,
            reason::ANNOUNCED,
            format!(
                "announced over BGP by {total} {} ({}) to {peers} {peer_s}",
                nodes(total),
                on.join(", ")
            ),
        );
    }
    if !on.is_empty() {
        return condition(
            true,
            reason::PARTIALLY_ANNOUNCED,
            format!(
                "announced over BGP by {} of {total} nodes ({}) to {peers} {peer_s}; not \
                 announcing: {}",
                on.len(),
                on.join(", "),
                off.join("; ")
            ),
        );
    }
    let why = if waiting == total {
        reason::WAITING_FOR_AGENT
    } else {
        reason::NOT_ANNOUNCED
    };
    condition(
        false,
        why,
        format!(
            "announced by none of the {total} {} chosen: {}",
            nodes(total),
            off.join("; ")
        ),
    )
}

/// Announced False for a group on no node (L2) or no announcing node (L3): why no node
/// may carry it, as last reported, else `yet` ("no node elected yet").
fn unplaced(group: &Group, inputs: &Inputs<'_>, yet: &str) -> ConditionPlan {
    let message = group.no_node.clone().unwrap_or_else(|| yet.to_owned());
    let why = if inputs.agents_unobservable {
        reason::AGENTS_UNOBSERVABLE
    } else {
        reason::NO_ELIGIBLE_NODE
    };
    condition(false, why, message)
}

/// A condition; its message is cut to [`MAX_MESSAGE`] bytes.
fn condition(status: bool, reason: &'static str, message: String) -> ConditionPlan {
    let mut message = text::bounded(message, MAX_MESSAGE);
    // `format!` leaves room to grow; the index keeps two of these per Service.
    message.shrink_to_fit();
    ConditionPlan {
        status,
        reason,
        message,
    }
}
