//! Narrowed passes: what a change to some Services, some nodes (their Node object, their
//! agent's freshness or report) or some endpoint sets can affect, and the state the
//! planner keeps to tell (the views of the last pass, what it saw of nodes and agents,
//! the counted set of visible IPs). Pure; see "Narrowed passes" in the module docs of
//! [`crate::plan`] for the rules.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;

use super::{GroupId, Inputs, Pass, PlanOutput, Planner, ServiceKey, ServiceView, Sink};
use crate::election::NodeState;
use crate::pool::{Announce, PoolConfig};
use crate::report::AgentReport;

/// What changed since the previous pass, as the caller observed it (the argument of
/// [`Planner::plan_changes`]).
#[derive(Debug, Clone, Default)]
pub struct Changes {
    /// Plan everything (first pass, relist, anything the caller cannot narrow down).
    pub everything: bool,
    /// Services added, changed or removed since the last pass, by key (the key of the
    /// view): the new view, or `None` = gone (no longer a LoadBalancer Service of ours).
    /// Any field of the view counts, the observed status too (the quarantine reads it: a
    /// write of the last pass landing is a change). A Service listed whose view did not
    /// change costs a re-plan of its group, nothing else.
    pub services: Vec<(ServiceKey, Option<Arc<ServiceView>>)>,
    /// Nodes whose Node object, agent freshness or agent report changed (or appeared /
    /// went), by name. The planner compares each with what it saw of it last and re-plans
    /// what the difference can affect.
    pub nodes: BTreeSet<String>,
    /// Services whose [`Inputs::local_endpoints`] entry changed.
    pub endpoints: BTreeSet<ServiceKey>,
}

impl Changes {
    /// Plan everything: what [`Planner::plan`] does.
    pub fn everything() -> Self {
        Changes {
            everything: true,
            ..Changes::default()
        }
    }
}

/// What the last pass saw besides the Services.
#[derive(Debug, Default)]
pub(super) struct Seen {
    /// Every node, by name.
    nodes: BTreeMap<Arc<str>, NodeState>,
    /// Every agent's report, by node name (shared with the caller's).
    reports: super::Reports,
    /// [`Inputs::lingering`].
    lingering: BTreeSet<IpAddr>,
    /// ([`Inputs::respect_cordon`], [`Inputs::agents_unobservable`]); `None` before the
    /// first pass.
    flags: Option<(bool, bool)>,
}

/// What changed on the nodes and agents of a narrowed pass.
#[derive(Debug, Default)]
struct NodeNews<'c> {
    /// Nodes whose state changed, with their subnets before and after (the subnet rule of
    /// the election compares nodes with each other).
    moved: Vec<(&'c str, Vec<IpNet>)>,
    /// Nodes whose report changed beyond single addresses (interfaces, routing, MACs).
    whole: Vec<&'c str>,
    /// Addresses an agent report gained, dropped or reports a conflict for, or stopped.
    mentioned: BTreeSet<IpAddr>,
}

/// Counts one sighting of `ip` more (`up`) or less in `visible`.
fn bump(visible: &mut HashMap<IpAddr, u32>, ip: IpAddr, up: bool) {
    if up {
        *visible.entry(ip).or_default() += 1;
    } else if let Some(n) = visible.get_mut(&ip) {
        *n -= 1;
        if *n == 0 {
            visible.remove(&ip);
        }
    }
}

/// What the agent of a node (`state`, `report`) holds that counts for the quarantine:
/// everything while it is fresh; while it only may still announce
/// ([`NodeState::agent_announcing`]), the routed addresses (`routed`: of a pool in L3
/// mode), which no kernel lifetime ends while its agent runs cut off from the API.
fn counted_held(
    state: Option<&NodeState>,
    report: Option<&AgentReport>,
    routed: impl Fn(IpAddr) -> bool,
) -> BTreeSet<IpAddr> {
    match (state, report) {
        (Some(n), Some(r)) if n.agent_ready => r.held.clone(),
        (Some(n), Some(r)) if n.agent_announcing => {
            r.held.iter().copied().filter(|ip| routed(*ip)).collect()
        }
        _ => BTreeSet::new(),
    }
}

/// Whether `ip` is an address of a pool in L3 mode in `config`.
pub(super) fn is_routed(config: &PoolConfig, ip: IpAddr) -> bool {
    config
        .pools()
        .find(|(_, pool)| pool.contains(ip))
        .is_some_and(|(_, pool)| pool.options.announce == Announce::Bgp)
}

/// Whether two reports of one agent differ only in what they say about single addresses
/// (held, conflicts), which re-plans only the groups of those addresses. Exhaustive, so a
/// new field of the report is a compile error here until it is decided on.
fn same_but_addresses(a: &AgentReport, b: &AgentReport) -> bool {
    let AgentReport {
        version,
        interfaces,
        held: _,
        conflicts: _,
        shield,
        macs,
        routing,
        // The signing key is the assignments' business (the peers' indexes), not the
        // planner's.
        key: _,
    } = a;
    *version == b.version
        && *interfaces == b.interfaces
        && *shield == b.shield
        && *macs == b.macs
        && *routing == b.routing
}

impl Planner {
    /// Full pass: remembers everything `inputs` shows, for the narrowed passes after it.
    pub(super) fn see_everything(&mut self, inputs: &Inputs<'_>) {
        self.views.clear();
        self.views.extend(
            inputs
                .services
                .iter()
                .map(|v| (v.key.clone(), Arc::clone(v))),
        );
        self.seen.nodes = inputs
            .nodes
            .iter()
            .map(|n| (n.name.clone(), n.clone()))
            .collect();
        self.seen.reports = inputs.agents.clone();
        self.seen.lingering = inputs.lingering.clone();
        self.seen.flags = Some((inputs.respect_cordon, inputs.agents_unobservable));
        self.visible.clear();
        let observed = inputs.services.iter().flat_map(|v| v.observed_ips.iter());
        for ip in observed.chain(inputs.lingering) {
            bump(&mut self.visible, *ip, true);
        }
        for (name, node) in &self.seen.nodes {
            let held = counted_held(Some(node), inputs.agents.get(&**name).map(|r| &**r), |ip| {
                is_routed(inputs.config, ip)
            });
            for ip in held {
                bump(&mut self.visible, ip, true);
            }
        }
    }

    /// Whether something changed that a caller does not list and that can affect any
    /// Service: then a pass plans everything. Cheap: O(pools + lingering + withheld), plus
    /// the agents' conflicts.
    ///
    /// Not the namespace labels ([`Inputs::namespaces`]): they decide only which pools a
    /// namespace may draw *new* addresses from (what a relabelled namespace holds stays
    /// its own, [`crate::pool::Tenancy::keeps`]), and the Services that wait for one are
    /// swept on every pass.
    pub(super) fn must_plan_everything(&self, inputs: &Inputs<'_>) -> bool {
        if !self.imported
            || self.config.as_ref() != Some(inputs.config)
            || self.seen.flags != Some((inputs.respect_cordon, inputs.agents_unobservable))
            || self.seen.lingering != *inputs.lingering
        {
            return true;
        }
        !self.fences_are(&self.fence_inputs(inputs))
    }

    /// The narrowed pass (see the module docs of [`crate::plan`]).
    pub(super) fn plan_narrowed(&mut self, inputs: &Inputs<'_>, changes: &Changes) -> PlanOutput {
        let pass = Pass::lazy(inputs);
        let mut sink = Sink::default();
        self.end_reservations_due(inputs.now);
        self.config_changed = false;
        let changed: BTreeMap<&ServiceKey, Option<&Arc<ServiceView>>> = changes
            .services
            .iter()
            .map(|(key, view)| (key, view.as_ref()))
            .collect();
        let (mut groups, gone) = self.see_services(&changed);
        let news = self.see_nodes(inputs, &changes.nodes);
        self.release(gone, inputs, &mut sink);
        self.lift_quarantine();
        let swept = self.sweep_narrowed(&changed, &pass, &mut sink);
        groups.extend(self.groups_touched(&swept, &changes.endpoints, &news));
        let order = self.members(groups, &swept, &changes.endpoints);
        let order: Vec<&ServiceView> = order.iter().map(|v| &**v).collect();
        self.place(&pass, &order, false, &mut sink);
        let services = order
            .iter()
            .map(|view| {
                (
                    view.key.clone(),
                    Box::new(self.render(view, &pass, &mut sink)),
                )
            })
            .collect();
        let groups = &self.groups;
        self.probing.retain(|id| groups.contains_key(id));
        PlanOutput {
            services,
            events: sink.events,
            released: sink.released,
            probe: self.probe(),
        }
    }

    /// Takes in the changed Services: their views, the IPs the API shows on them. Returns
    /// the groups they were in (to place again) and those gone or re-created under a new
    /// uid (sorted).
    fn see_services(
        &mut self,
        changed: &BTreeMap<&ServiceKey, Option<&Arc<ServiceView>>>,
    ) -> (Vec<GroupId>, Vec<ServiceKey>) {
        let mut groups: Vec<GroupId> = Vec::new();
        let mut gone: Vec<ServiceKey> = Vec::new();
        for (&key, &new) in changed {
            if let Some(entry) = self.entries.get(key) {
                groups.push(entry.group.clone());
                if new.is_none_or(|v| *v.uid != *entry.uid) {
                    gone.push(key.clone());
                }
            }
            let old = match new {
                Some(view) => self.views.insert(key.clone(), Arc::clone(view)),
                None => self.views.remove(key),
            };
            for ip in old.iter().flat_map(|v| v.observed_ips.iter()) {
                bump(&mut self.visible, *ip, false);
            }
            for ip in new.iter().flat_map(|v| v.observed_ips.iter()) {
                bump(&mut self.visible, *ip, true);
            }
        }
        (groups, gone)
    }

    /// Takes in the nodes `names`: compares each with what the last pass saw of it (the
    /// Node, the agent's freshness and report), keeps the IPs fresh agents hold counted,
    /// and remembers the new state.
    fn see_nodes<'c>(&mut self, inputs: &Inputs<'_>, names: &'c BTreeSet<String>) -> NodeNews<'c> {
        let mut news = NodeNews::default();
        let by_name: HashMap<&str, &NodeState> =
            inputs.nodes.iter().map(|n| (n.name.as_ref(), n)).collect();
        let routed = |ip| is_routed(inputs.config, ip);
        for name in names {
            let new_state = by_name.get(name.as_str()).copied();
            let new_report = inputs.agents.get(name).map(|r| &**r);
            let old_state = self.seen.nodes.get(name.as_str());
            let old_report = self.seen.reports.get(name).map(|r| &**r);
            let old_held = counted_held(old_state, old_report, routed);
            let new_held = counted_held(new_state, new_report, routed);
            for ip in old_held.difference(&new_held) {
                bump(&mut self.visible, *ip, false);
            }
            for ip in new_held.difference(&old_held) {
                bump(&mut self.visible, *ip, true);
            }
            match (old_report, new_report) {
                (Some(a), Some(b)) => {
                    news.mentioned
                        .extend(a.held.symmetric_difference(&b.held).copied());
                    if a.conflicts != b.conflicts {
                        let ips = a.conflicts.iter().chain(&b.conflicts).map(|c| c.ip);
                        news.mentioned.extend(ips);
                    }
                    if !same_but_addresses(a, b) {
                        news.whole.push(name);
                    }
                }
                (None, None) => {}
                (a, b) => {
                    for r in a.into_iter().chain(b) {
                        news.mentioned.extend(r.held.iter().copied());
                        news.mentioned.extend(r.conflicts.iter().map(|c| c.ip));
                    }
                    news.whole.push(name);
                }
            }
            if old_state != new_state {
                let subnets = old_state
                    .into_iter()
                    .chain(new_state)
                    .flat_map(|n| n.subnets.iter().copied())
                    .collect();
                news.moved.push((name, subnets));
            }
            match new_state {
                Some(state) if old_state != Some(state) => {
                    self.seen.nodes.insert(state.name.clone(), state.clone());
                }
                Some(_) => {}
                None => {
                    self.seen.nodes.remove(name.as_str());
                }
            }
            match inputs.agents.get(name) {
                // The caller's, shared: a report is not copied to be remembered.
                Some(report) if old_report != Some(&**report) => {
                    self.seen.reports.insert(name.clone(), Arc::clone(report));
                }
                Some(_) => {}
                None => {
                    self.seen.reports.remove(name);
                }
            }
        }
        news
    }

    /// The allocation sweep of a narrowed pass: the changed Services still there and every
    /// pending one, in the order of the full sweep (of which it is the subsequence that
    /// does anything). Returns them, in that order.
    fn sweep_narrowed(
        &mut self,
        changed: &BTreeMap<&ServiceKey, Option<&Arc<ServiceView>>>,
        pass: &Pass<'_>,
        sink: &mut Sink,
    ) -> Vec<Arc<ServiceView>> {
        let mut sweep: Vec<Arc<ServiceView>> =
            changed.values().filter_map(|v| v.map(Arc::clone)).collect();
        sweep.extend(
            self.unsettled
                .iter()
                .filter(|key| !changed.contains_key(key))
                .filter_map(|key| self.views.get(key).map(Arc::clone)),
        );
        sweep.sort_by(|a, b| (a.created, &a.key).cmp(&(b.created, &b.key)));
        let order: Vec<&ServiceView> = sweep.iter().map(|v| &**v).collect();
        self.sweep(order.clone(), pass, sink);
        for view in &order {
            self.report_failure(&view.key, sink);
            match self.entries.get(&view.key) {
                Some(entry) if entry.failure.is_some() => {
                    self.unsettled.insert(view.key.clone());
                }
                _ => {
                    self.unsettled.remove(&view.key);
                }
            }
        }
        sweep
    }

    /// The groups to place again besides those the changed Services were in: the groups
    /// of the Services `swept` and of those whose `endpoints` changed, and what `news`
    /// can affect (see the module docs of [`crate::plan`]).
    fn groups_touched(
        &self,
        swept: &[Arc<ServiceView>],
        endpoints: &BTreeSet<ServiceKey>,
        news: &NodeNews<'_>,
    ) -> Vec<GroupId> {
        let mut groups = Vec::new();
        let keys = swept.iter().map(|v| &v.key).chain(endpoints);
        groups.extend(keys.filter_map(|key| self.entries.get(key).map(|e| e.group.clone())));
        groups.extend(
            news.mentioned
                .iter()
                .filter_map(|ip| self.ips.get(ip).map(|used| used.group.clone())),
        );
        if news.moved.is_empty() && news.whole.is_empty() {
            return groups;
        }
        // A node's state or report changed as a whole: one walk over the groups.
        for (id, g) in &self.groups {
            let on = |n: &str| {
                g.node.as_deref() == Some(n)
                    || g.moving_from.as_deref() == Some(n)
                    || g.announcers.iter().any(|a| &**a == n)
                    || g.standby.as_deref() == Some(n)
                    || g.relay.as_deref() == Some(n)
            };
            let in_subnets = |subnets: &[IpNet]| {
                g.ips
                    .values()
                    .any(|ip| subnets.iter().any(|net| net.contains(ip)))
            };
            // A group on no node (pending, or L3 mode) may get one when any node changes.
            let hit = news.whole.iter().any(|n| on(n))
                || (!news.moved.is_empty() && g.node.is_none())
                || news
                    .moved
                    .iter()
                    .any(|(n, subnets)| on(n) || in_subnets(subnets));
            if hit {
                groups.push(id.clone());
            }
        }
        groups
    }

    /// Every member of `groups`, with the Services `swept` and those whose `endpoints`
    /// changed, in (created, namespace, name) order: the Services a narrowed pass places
    /// and renders. A member's own group is taken in too, so each group placed has all its
    /// members and is met at its oldest one, as in a full pass.
    fn members(
        &self,
        mut groups: Vec<GroupId>,
        swept: &[Arc<ServiceView>],
        endpoints: &BTreeSet<ServiceKey>,
    ) -> Vec<Arc<ServiceView>> {
        let mut touched: HashSet<ServiceKey> = swept.iter().map(|v| v.key.clone()).collect();
        touched.extend(
            endpoints
                .iter()
                .filter(|key| self.views.contains_key(*key))
                .cloned(),
        );
        let mut placed: HashSet<GroupId> = HashSet::new();
        while let Some(id) = groups.pop() {
            if placed.contains(&id) {
                continue;
            }
            if let Some(group) = self.groups.get(&id) {
                for member in group.members.keys() {
                    if touched.insert(member.clone())
                        && let Some(entry) = self.entries.get(member)
                        && entry.group != id
                    {
                        groups.push(entry.group.clone());
                    }
                }
            }
            placed.insert(id);
        }
        let mut order: Vec<Arc<ServiceView>> = touched
            .iter()
            .filter_map(|key| self.views.get(key).map(Arc::clone))
            .collect();
        order.sort_by(|a, b| (a.created, &a.key).cmp(&(b.created, &b.key)));
        order
    }
}
