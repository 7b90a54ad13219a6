//! Node election: which node carries a Service's IPs. Pure: no I/O, no clock.
//!
//! The controller turns what it observed (Nodes, agent Leases judged on its own monotonic
//! clock, EndpointSlices) into plain [`NodeState`]s and calls [`elect`]. The rules (
//! docs/how-it-works.md states them for users):
//!
//! 1. a node is eligible when its agent is fresh (or, for the node currently carrying the
//!    IPs only, unconfirmed: not seen renewing, but the controller cannot tell it is gone,
//!    see [`NodeState::agent_unconfirmed`]), it is not labelled
//!    [`LABEL_EXCLUDE_FROM_LB`], not cordoned (unless cordons are ignored), matches the pool's
//!    node selector, and, for `externalTrafficPolicy: Local`, has a ready local endpoint;
//! 2. subnet-aware: if any eligible node has an interface subnet holding the IPs, only the
//!    nodes whose subnets hold the most of them stay eligible (multi-NIC, dual-stack);
//! 3. the current holder is kept while it stays eligible (no fail-back churn);
//! 4. otherwise the least-loaded eligible node wins, ties broken by a stable hash of
//!    (node, first IP), then by name.
//!
//! When no node is eligible, [`NoEligibleNode`] counts the nodes per reason so the user
//! reads why in the Service's condition and Events.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;

use crate::hash::Fnv1a;
use crate::keys::LABEL_EXCLUDE_FROM_LB;

/// What the controller knows about one node, as plain data.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NodeState {
    /// Node name; shared by every group and plan on the node.
    pub name: Arc<str>,
    /// Node labels.
    pub labels: BTreeMap<String, String>,
    /// `spec.unschedulable`: the node is cordoned.
    pub unschedulable: bool,
    /// The node's agent Lease renewal was seen within the lease duration, measured on the
    /// controller's own monotonic clock.
    pub agent_ready: bool,
    /// The agent is not ready, but the controller cannot tell it is gone: it cannot see
    /// any agent, or has watched for less than a lease duration (new leadership term, or
    /// just after such blindness). The node stays eligible as the current holder (rule 3)
    /// and is not elected for IPs it does not carry.
    pub agent_unconfirmed: bool,
    /// The agent is not ready but may still announce the routed (L3) addresses it
    /// reported: it is unconfirmed, or lost for less than the time an agent cut off from
    /// the API takes to withdraw them (its L3 cut-off) plus a margin. Not read by the
    /// election; it keeps those addresses in quarantine (see `plan`, "Quarantine").
    pub agent_announcing: bool,
    /// Subnets of the node's interfaces, as reported by its agent.
    pub subnets: Vec<IpNet>,
    /// The node's own addresses in `subnets`, as reported by its agent (fast failover's
    /// adverts go there).
    pub addresses: Vec<IpAddr>,
}

/// What is being placed, and the policy that applies to it.
#[derive(Debug, Clone, Copy)]
pub struct ElectionInput<'a> {
    /// The Service's IPs (one per family for dual-stack); the first one seeds the tie-break.
    pub ips: &'a [IpAddr],
    /// The node currently carrying the IPs, if any.
    pub current: Option<&'a str>,
    /// The pool's node selector: every pair must be among the node's labels.
    pub node_selector: &'a BTreeMap<String, String>,
    /// `Some(nodes with a ready local endpoint)` for `externalTrafficPolicy: Local`,
    /// `None` for `Cluster`.
    pub local_endpoint_nodes: Option<&'a BTreeSet<String>>,
    /// Whether cordoned nodes are ineligible (the default: planned maintenance moves IPs away).
    pub respect_cordon: bool,
}

/// Why one node cannot carry the IPs. The variants are in precedence order: a node failing
/// several rules is reported under the first one (operator decisions before run-time state).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Ineligible {
    /// The node is cordoned (`spec.unschedulable`).
    Cordoned,
    /// The node is labelled [`LABEL_EXCLUDE_FROM_LB`].
    Excluded,
    /// The node does not match the pool's node selector.
    NotSelected,
    /// `externalTrafficPolicy: Local` and the node has no ready endpoint of the Service.
    NoLocalEndpoint,
    /// The node's agent Lease is not fresh (agent missing, dead or partitioned).
    AgentNotReady,
}

impl fmt::Display for Ineligible {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ineligible::Cordoned => f.write_str("cordoned"),
            Ineligible::Excluded => write!(f, "labelled {LABEL_EXCLUDE_FROM_LB}"),
            Ineligible::NotSelected => f.write_str("not matching the pool's node selector"),
            Ineligible::NoLocalEndpoint => f.write_str("without a ready local endpoint"),
            Ineligible::AgentNotReady => f.write_str("without a fresh aliaslb agent"),
        }
    }
}

/// No node can carry the IPs: how many nodes there are and why each was left out.
///
/// Each node is counted once, under the first [`Ineligible`] reason it fails.
#[derive(Debug, Clone, Default, PartialEq, Eq, thiserror::Error)]
pub struct NoEligibleNode {
    /// Number of nodes considered.
    pub nodes: usize,
    /// Nodes left out because they are cordoned.
    pub cordoned: usize,
    /// Nodes left out because they carry the exclusion label.
    pub excluded: usize,
    /// Nodes left out because they do not match the node selector.
    pub not_selected: usize,
    /// Nodes left out because they have no ready local endpoint.
    pub no_local_endpoint: usize,
    /// Nodes left out because their agent is not fresh.
    pub agent_not_ready: usize,
}

impl NoEligibleNode {
    fn count(&mut self, reason: Ineligible) {
        let slot = match reason {
            Ineligible::Cordoned => &mut self.cordoned,
            Ineligible::Excluded => &mut self.excluded,
            Ineligible::NotSelected => &mut self.not_selected,
            Ineligible::NoLocalEndpoint => &mut self.no_local_endpoint,
            Ineligible::AgentNotReady => &mut self.agent_not_ready,
        };
        *slot += 1;
    }
}

impl fmt::Display for NoEligibleNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.nodes == 0 {
            return f.write_str("no eligible node: no nodes known");
        }
        let plural = if self.nodes == 1 { "" } else { "s" };
        write!(f, "no eligible node: {} node{plural}", self.nodes)?;
        let reasons = [
            (self.cordoned, Ineligible::Cordoned),
            (self.excluded, Ineligible::Excluded),
            (self.not_selected, Ineligible::NotSelected),
            (self.no_local_endpoint, Ineligible::NoLocalEndpoint),
            (self.agent_not_ready, Ineligible::AgentNotReady),
        ];
        let mut sep = "; ";
        for (count, reason) in reasons.into_iter().filter(|(count, _)| *count > 0) {
            write!(f, "{sep}{count} {reason}")?;
            sep = ", ";
        }
        Ok(())
    }
}

/// The first rule `node` fails for `input`, or `None` if it passes every per-node rule.
///
/// The subnet rule is not here: it compares nodes with each other (see [`eligible_nodes`]).
pub fn ineligibility(input: &ElectionInput<'_>, node: &NodeState) -> Option<Ineligible> {
    if input.respect_cordon && node.unschedulable {
        return Some(Ineligible::Cordoned);
    }
    if node.labels.contains_key(LABEL_EXCLUDE_FROM_LB) {
        return Some(Ineligible::Excluded);
    }
    let selected = input
        .node_selector
        .iter()
        .all(|(key, value)| node.labels.get(key) == Some(value));
    if !selected {
        return Some(Ineligible::NotSelected);
    }
    if let Some(local) = input.local_endpoint_nodes
        && !local.contains(&*node.name)
    {
        return Some(Ineligible::NoLocalEndpoint);
    }
    let kept = node.agent_unconfirmed && input.current == Some(&*node.name);
    if !node.agent_ready && !kept {
        return Some(Ineligible::AgentNotReady);
    }
    None
}

/// Number of `ips` that some subnet of `node` holds.
fn on_link(node: &NodeState, ips: &[IpAddr]) -> usize {
    ips.iter()
        .filter(|ip| node.subnets.iter().any(|net| net.contains(*ip)))
        .count()
}

/// Every node that may carry the IPs, after all rules including the subnet rule, in the
/// order of `nodes`; or why there is none.
pub fn eligible_nodes<'n>(
    input: &ElectionInput<'_>,
    nodes: &'n [NodeState],
) -> Result<Vec<&'n NodeState>, NoEligibleNode> {
    let mut why = NoEligibleNode {
        nodes: nodes.len(),
        ..NoEligibleNode::default()
    };
    let mut eligible = Vec::with_capacity(nodes.len());
    for node in nodes {
        match ineligibility(input, node) {
            Some(reason) => why.count(reason),
            None => eligible.push(node),
        }
    }
    if eligible.is_empty() {
        return Err(why);
    }
    // Multi-NIC: prefer the nodes that are on-link for the most IPs. If no node is on-link
    // for any (routed VIPs, agents not reporting yet), the rule does not apply.
    let best = eligible
        .iter()
        .map(|node| on_link(node, input.ips))
        .max()
        .unwrap_or(0);
    if best > 0 {
        eligible.retain(|node| on_link(node, input.ips) == best);
    }
    Ok(eligible)
}

/// Elect the node that carries `input.ips`.
///
/// `load` maps node name to the number of IPs it carries (missing = 0). The result is a
/// function of the set of nodes, not their order.
pub fn elect(
    input: &ElectionInput<'_>,
    nodes: &[NodeState],
    load: &BTreeMap<Arc<str>, usize>,
) -> Result<Arc<str>, NoEligibleNode> {
    let eligible = eligible_nodes(input, nodes)?;
    if let Some(current) = input.current
        && let Some(node) = eligible.iter().find(|node| &*node.name == current)
    {
        return Ok(node.name.clone());
    }
    let first_ip = input.ips.first().copied();
    let chosen = eligible
        .into_iter()
        .min_by_key(|node| {
            (
                load.get(&node.name).copied().unwrap_or(0),
                tie_break_hash(&node.name, first_ip),
                &node.name,
            )
        })
        .expect("eligible_nodes never returns an empty list");
    Ok(chosen.name.clone())
}

/// The standby of `input.ips`: the node that takes them over on the LAN when the holder's
/// liveness adverts stop (fast L2 failover); also its relay. It must pass every per-node
/// rule, not be one of `exclude` (the holder; for the relay, the standby too), and be on-link for at least one of the IPs (adverts
/// and the takeover's gratuitous ARP go on that LAN). `current` stays while it qualifies
/// (no churn); else the node the election would pick: least loaded, then the tie-break
/// hash. `None`: no node qualifies.
pub fn standby(
    input: &ElectionInput<'_>,
    nodes: &[NodeState],
    exclude: &[&str],
    current: Option<&str>,
    load: &BTreeMap<Arc<str>, usize>,
) -> Option<Arc<str>> {
    let fresh = ElectionInput {
        current: None,
        ..*input
    };
    let qualifies = |node: &&NodeState| {
        !exclude.contains(&&*node.name)
            && on_link(node, input.ips) > 0
            && ineligibility(&fresh, node).is_none()
    };
    if let Some(current) = current
        && let Some(node) = nodes.iter().filter(qualifies).find(|n| &*n.name == current)
    {
        return Some(node.name.clone());
    }
    let first_ip = input.ips.first().copied();
    nodes
        .iter()
        .filter(qualifies)
        .min_by_key(|node| {
            (
                std::cmp::Reverse(on_link(node, input.ips)),
                load.get(&node.name).copied().unwrap_or(0),
                tie_break_hash(&node.name, first_ip),
                &node.name,
            )
        })
        .map(|node| node.name.clone())
}

/// The address of `node` on the subnet of `ip` (where a holder's adverts to it go): one
/// of its reported addresses that a subnet holding `ip` holds too.
pub fn address_on_subnet(node: &NodeState, ip: IpAddr) -> Option<IpAddr> {
    node.subnets
        .iter()
        .filter(|net| net.contains(&ip))
        .find_map(|net| node.addresses.iter().find(|a| net.contains(*a)).copied())
}

/// L3 mode: every node that announces `input.ips` over BGP, by name; or why there is none.
///
/// The per-node rules of [`ineligibility`] apply, each of `current` (the nodes announcing
/// now) counting as the current holder (an unconfirmed agent keeps announcing what it
/// announces); the subnet rule does not (routed addresses need no node on their subnet).
/// With `cap`, the nodes announcing now stay first (no churn when a node returns), then the
/// others in the order of the tie-break hash of (node, first IP), so different addresses
/// spread over different nodes.
pub fn announcers(
    input: &ElectionInput<'_>,
    nodes: &[NodeState],
    current: &[Arc<str>],
    cap: Option<usize>,
) -> Result<Vec<Arc<str>>, NoEligibleNode> {
    let mut why = NoEligibleNode {
        nodes: nodes.len(),
        ..NoEligibleNode::default()
    };
    let first_ip = input.ips.first().copied();
    let mut eligible = Vec::with_capacity(nodes.len());
    for node in nodes {
        let announcing = current.contains(&node.name);
        let as_current = ElectionInput {
            current: announcing.then_some(&*node.name),
            ..*input
        };
        match ineligibility(&as_current, node) {
            Some(reason) => why.count(reason),
            None => eligible.push((
                !announcing,
                tie_break_hash(&node.name, first_ip),
                &node.name,
            )),
        }
    }
    if eligible.is_empty() {
        return Err(why);
    }
    eligible.sort_unstable();
    eligible.truncate(cap.unwrap_or(usize::MAX).max(1));
    let mut chosen: Vec<Arc<str>> = eligible.into_iter().map(|(_, _, n)| n.clone()).collect();
    chosen.sort_unstable();
    Ok(chosen)
}

/// Stable tie-break hash of (node, IP): FNV-1a 64 over the name, a separator and the
/// address octets, then the murmur3 64-bit finalizer (`core/src/hash.rs`).
///
/// The finalizer matters: FNV-1a alone barely moves the high bits when only the last
/// octet differs, so the order of nodes would be the same for every IP of a pool and
/// equal-load ties would all land on one node.
pub fn tie_break_hash(node: &str, ip: Option<IpAddr>) -> u64 {
    let mut hash = Fnv1a::new();
    hash.write(node.as_bytes());
    hash.write_ip(ip);
    hash.finish_mixed()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// [`super::elect`] with the loads and the winner as `String`s, as the tests write them.
    fn elect(
        input: &ElectionInput<'_>,
        nodes: &[NodeState],
        load: &BTreeMap<String, usize>,
    ) -> Result<String, NoEligibleNode> {
        super::elect(input, nodes, &shared(load)).map(|n| n.to_string())
    }

    /// [`super::standby`], as [`elect`].
    fn standby(
        input: &ElectionInput<'_>,
        nodes: &[NodeState],
        exclude: &[&str],
        current: Option<&str>,
        load: &BTreeMap<String, usize>,
    ) -> Option<String> {
        super::standby(input, nodes, exclude, current, &shared(load)).map(|n| n.to_string())
    }

    fn shared(load: &BTreeMap<String, usize>) -> BTreeMap<Arc<str>, usize> {
        load.iter().map(|(n, l)| (n.as_str().into(), *l)).collect()
    }

    /// A ready, schedulable node with no labels and no subnets.
    fn node(name: &str) -> NodeState {
        NodeState {
            name: name.into(),
            agent_ready: true,
            ..NodeState::default()
        }
    }

    impl NodeState {
        fn cordoned(mut self) -> Self {
            self.unschedulable = true;
            self
        }
        fn not_ready(mut self) -> Self {
            self.agent_ready = false;
            self
        }
        fn label(mut self, key: &str, value: &str) -> Self {
            self.labels.insert(key.to_owned(), value.to_owned());
            self
        }
        fn subnet(mut self, net: &str) -> Self {
            self.subnets.push(net.parse().unwrap());
            self
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    /// Owned inputs the tests borrow an [`ElectionInput`] from.
    #[derive(Debug, Clone)]
    struct Case {
        ips: Vec<IpAddr>,
        current: Option<String>,
        selector: BTreeMap<String, String>,
        local: Option<BTreeSet<String>>,
        respect_cordon: bool,
    }

    fn case(ips: &[&str]) -> Case {
        Case {
            ips: ips.iter().map(|s| ip(s)).collect(),
            current: None,
            selector: BTreeMap::new(),
            local: None,
            respect_cordon: true,
        }
    }

    impl Case {
        fn current(mut self, name: &str) -> Self {
            self.current = Some(name.to_owned());
            self
        }
        fn selector(mut self, key: &str, value: &str) -> Self {
            self.selector.insert(key.to_owned(), value.to_owned());
            self
        }
        fn local(mut self, names: &[&str]) -> Self {
            self.local = Some(names.iter().map(|s| (*s).to_owned()).collect());
            self
        }
        fn ignore_cordon(mut self) -> Self {
            self.respect_cordon = false;
            self
        }
        fn input(&self) -> ElectionInput<'_> {
            ElectionInput {
                ips: &self.ips,
                current: self.current.as_deref(),
                node_selector: &self.selector,
                local_endpoint_nodes: self.local.as_ref(),
                respect_cordon: self.respect_cordon,
            }
        }
        fn elect(&self, nodes: &[NodeState]) -> Result<String, NoEligibleNode> {
            elect(&self.input(), nodes, &BTreeMap::new())
        }
    }

    fn load(pairs: &[(&str, usize)]) -> BTreeMap<String, usize> {
        pairs.iter().map(|(n, l)| ((*n).to_owned(), *l)).collect()
    }

    #[test]
    fn the_standby_is_another_eligible_node_on_the_lan_and_stays() {
        let c = case(&["192.168.55.10"]);
        let lan = |name: &str, addr: &str| {
            let mut n = node(name).subnet(addr);
            n.addresses
                .push(addr.split('/').next().unwrap().parse().unwrap());
            n
        };
        let nodes = [
            lan("a", "192.168.55.2/24"),
            lan("b", "192.168.55.3/24"),
            lan("c", "192.168.55.4/24").cordoned(),
            node("d").subnet("10.0.0.5/24"),
            lan("e", "192.168.55.6/24").not_ready(),
            lan("f", "192.168.55.7/24"),
        ];
        let none = BTreeMap::new();
        // Never the holder, a cordoned, unready or off-LAN node; the least loaded.
        let busy = load(&[("b", 3)]);
        assert_eq!(
            standby(&c.input(), &nodes, &["a"], None, &busy),
            Some("f".into())
        );
        assert_eq!(
            standby(&c.input(), &nodes, &["a"], None, &load(&[("f", 3)])),
            Some("b".into())
        );
        // The current standby stays while it qualifies, whatever the load.
        assert_eq!(
            standby(&c.input(), &nodes, &["a"], Some("b"), &busy),
            Some("b".into())
        );
        // A current standby that no longer qualifies is replaced by the election's pick.
        assert_eq!(
            standby(&c.input(), &nodes, &["a"], Some("c"), &none),
            standby(&c.input(), &nodes, &["a"], None, &none)
        );
        // Alone on its LAN: no standby.
        assert_eq!(standby(&c.input(), &nodes[..1], &["a"], None, &none), None);
        assert_eq!(
            address_on_subnet(&nodes[1], ip("192.168.55.10")),
            Some(ip("192.168.55.3"))
        );
        assert_eq!(address_on_subnet(&nodes[3], ip("192.168.55.10")), None);
    }

    #[test]
    fn per_node_rules() {
        let excl = LABEL_EXCLUDE_FROM_LB;
        let table: Vec<(&str, Case, NodeState, Option<Ineligible>)> = vec![
            ("plain ready node", case(&["10.0.0.1"]), node("a"), None),
            (
                "agent not fresh",
                case(&["10.0.0.1"]),
                node("a").not_ready(),
                Some(Ineligible::AgentNotReady),
            ),
            (
                "exclusion label, any value",
                case(&["10.0.0.1"]),
                node("a").label(excl, ""),
                Some(Ineligible::Excluded),
            ),
            (
                "cordoned",
                case(&["10.0.0.1"]),
                node("a").cordoned(),
                Some(Ineligible::Cordoned),
            ),
            (
                "cordoned but cordons ignored",
                case(&["10.0.0.1"]).ignore_cordon(),
                node("a").cordoned(),
                None,
            ),
            (
                "selector matches",
                case(&["10.0.0.1"]).selector("zone", "a"),
                node("a").label("zone", "a"),
                None,
            ),
            (
                "selector value differs",
                case(&["10.0.0.1"]).selector("zone", "a"),
                node("a").label("zone", "b"),
                Some(Ineligible::NotSelected),
            ),
            (
                "selector key missing",
                case(&["10.0.0.1"]).selector("zone", "a"),
                node("a"),
                Some(Ineligible::NotSelected),
            ),
            (
                "Local policy with a local endpoint",
                case(&["10.0.0.1"]).local(&["a"]),
                node("a"),
                None,
            ),
            (
                "Local policy without a local endpoint",
                case(&["10.0.0.1"]).local(&["b"]),
                node("a"),
                Some(Ineligible::NoLocalEndpoint),
            ),
            (
                "cordon reported before a dead agent",
                case(&["10.0.0.1"]),
                node("a").cordoned().not_ready(),
                Some(Ineligible::Cordoned),
            ),
        ];
        for (name, case, node, want) in table {
            assert_eq!(ineligibility(&case.input(), &node), want, "{name}");
            let got = case.elect(std::slice::from_ref(&node));
            assert_eq!(got.is_ok(), want.is_none(), "{name}: {got:?}");
        }
    }

    #[test]
    fn keeps_current_while_eligible() {
        let nodes = [node("a"), node("b")];
        let busy = load(&[("a", 10), ("b", 0)]);
        let c = case(&["10.0.0.1"]).current("a");
        assert_eq!(elect(&c.input(), &nodes, &busy).unwrap(), "a");
    }

    #[test]
    fn moves_when_current_is_no_longer_eligible() {
        let nodes = [node("a").cordoned(), node("b")];
        let c = case(&["10.0.0.1"]).current("a");
        assert_eq!(c.elect(&nodes).unwrap(), "b");
    }

    #[test]
    fn unknown_current_is_replaced() {
        let nodes = [node("b")];
        let c = case(&["10.0.0.1"]).current("gone");
        assert_eq!(c.elect(&nodes).unwrap(), "b");
    }

    #[test]
    fn least_loaded_wins() {
        let nodes = [node("a"), node("b"), node("c")];
        let c = case(&["10.0.0.1"]);
        let l = load(&[("a", 3), ("b", 1), ("c", 2)]);
        assert_eq!(elect(&c.input(), &nodes, &l).unwrap(), "b");
        let l = load(&[("a", 3), ("c", 2)]);
        assert_eq!(elect(&c.input(), &nodes, &l).unwrap(), "b", "missing = 0");
    }

    #[test]
    fn ties_follow_the_stable_hash() {
        let nodes: Vec<_> = ["a", "b", "c", "d"].into_iter().map(node).collect();
        let first = ip("10.0.0.7");
        let want = nodes
            .iter()
            .min_by_key(|n| tie_break_hash(&n.name, Some(first)))
            .unwrap()
            .name
            .to_string();
        assert_eq!(case(&["10.0.0.7"]).elect(&nodes).unwrap(), want);
    }

    #[test]
    fn ties_spread_over_nodes() {
        // Different IPs must not all land on the same node when loads are equal.
        let nodes: Vec<_> = ["a", "b", "c"].into_iter().map(node).collect();
        let winners: BTreeSet<String> = (1..=30)
            .map(|i| case(&[&format!("10.0.0.{i}")]).elect(&nodes).unwrap())
            .collect();
        assert_eq!(winners.len(), 3, "{winners:?}");
    }

    #[test]
    fn tie_break_hash_is_pinned() {
        // Golden values: changing the hash reshuffles every tie in every cluster.
        assert_ne!(
            tie_break_hash("node-a", Some(ip("192.0.2.1"))),
            tie_break_hash("node-a", Some(ip("192.0.2.2")))
        );
        assert_eq!(
            tie_break_hash("node-a", Some(ip("192.0.2.1"))),
            GOLDEN_NODE_A_192_0_2_1
        );
    }

    /// fmix64(FNV-1a 64 of `b"node-a\0\x04\xc0\x00\x02\x01"`), computed independently.
    const GOLDEN_NODE_A_192_0_2_1: u64 = 0x7988_b168_6c3d_c8b9;

    #[test]
    fn subnet_aware_prefers_on_link_nodes() {
        let nodes = [
            node("a").subnet("10.1.0.0/24"),
            node("b").subnet("192.168.0.0/24"),
            node("c").subnet("192.168.0.0/24"),
        ];
        let l = load(&[("a", 0), ("b", 5), ("c", 7)]);
        let c = case(&["192.168.0.10"]);
        assert_eq!(elect(&c.input(), &nodes, &l).unwrap(), "b");
        // Current holder off-link is moved to an on-link node.
        let c = case(&["192.168.0.10"]).current("a");
        assert_eq!(elect(&c.input(), &nodes, &l).unwrap(), "b");
    }

    #[test]
    fn subnet_rule_ignores_ineligible_on_link_nodes() {
        // The only on-link node is cordoned: the rule does not apply, any node may carry it.
        let nodes = [
            node("a").subnet("10.1.0.0/24"),
            node("b").subnet("192.168.0.0/24").cordoned(),
        ];
        assert_eq!(case(&["192.168.0.10"]).elect(&nodes).unwrap(), "a");
    }

    #[test]
    fn subnet_rule_prefers_nodes_on_link_for_more_families() {
        let nodes = [
            node("a").subnet("192.168.0.0/24"),
            node("b").subnet("192.168.0.0/24").subnet("2001:db8::/64"),
        ];
        let l = load(&[("a", 0), ("b", 9)]);
        let c = case(&["192.168.0.10", "2001:db8::10"]);
        assert_eq!(elect(&c.input(), &nodes, &l).unwrap(), "b");
    }

    #[test]
    fn no_subnet_match_anywhere_keeps_every_node() {
        let nodes = [node("a").subnet("10.1.0.0/24"), node("b")];
        let l = load(&[("a", 1), ("b", 0)]);
        let c = case(&["203.0.113.5"]);
        assert_eq!(elect(&c.input(), &nodes, &l).unwrap(), "b");
    }

    #[test]
    fn no_eligible_node_explains_why() {
        let nodes = [
            node("a").cordoned(),
            node("b").label(LABEL_EXCLUDE_FROM_LB, "true"),
            node("c").not_ready(),
        ];
        let err = case(&["10.0.0.1"]).elect(&nodes).unwrap_err();
        assert_eq!(
            err,
            NoEligibleNode {
                nodes: 3,
                cordoned: 1,
                excluded: 1,
                agent_not_ready: 1,
                ..NoEligibleNode::default()
            }
        );
        assert_eq!(
            err.to_string(),
            "no eligible node: 3 nodes; 1 cordoned, 1 labelled \
             node.kubernetes.io/exclude-from-external-load-balancers, \
             1 without a fresh aliaslb agent"
        );
    }

    #[test]
    fn no_eligible_node_messages() {
        let table: Vec<(Case, Vec<NodeState>, &str)> = vec![
            (
                case(&["10.0.0.1"]),
                vec![],
                "no eligible node: no nodes known",
            ),
            (
                case(&["10.0.0.1"]).selector("zone", "a"),
                vec![node("a")],
                "no eligible node: 1 node; 1 not matching the pool's node selector",
            ),
            (
                case(&["10.0.0.1"]).local(&[]),
                vec![node("a"), node("b")],
                "no eligible node: 2 nodes; 2 without a ready local endpoint",
            ),
        ];
        for (case, nodes, want) in table {
            assert_eq!(case.elect(&nodes).unwrap_err().to_string(), want);
        }
    }

    fn arb_node(name: String) -> impl Strategy<Value = NodeState> {
        (
            any::<bool>(),
            any::<bool>(),
            prop::bool::weighted(0.8),
            prop::bool::weighted(0.2),
            prop::option::of(0u8..3),
        )
            .prop_map(move |(zone_a, cordoned, ready, excluded, subnet)| {
                let mut n = node(&name);
                n.unschedulable = cordoned;
                n.agent_ready = ready;
                n = n.label("zone", if zone_a { "a" } else { "b" });
                if excluded {
                    n = n.label(LABEL_EXCLUDE_FROM_LB, "");
                }
                if let Some(s) = subnet {
                    n = n.subnet(&format!("10.0.{s}.0/24"));
                }
                n
            })
    }

    /// A unique-named node list, the same list shuffled, loads, and the case.
    fn arb_world() -> impl Strategy<Value = (Vec<NodeState>, Vec<NodeState>, Vec<usize>, Case)> {
        let names = prop::sample::subsequence(vec!["n0", "n1", "n2", "n3", "n4", "n5"], 0..=6);
        names
            .prop_flat_map(|names| {
                let nodes: Vec<_> = names.iter().map(|n| arb_node((*n).to_owned())).collect();
                let loads = prop::collection::vec(0usize..3, names.len());
                (
                    nodes,
                    loads,
                    0u8..3,
                    1u8..4,
                    prop::option::of(0usize..6),
                    any::<bool>(),
                    any::<bool>(),
                    prop::option::of(prop::collection::btree_set(0usize..6, 0..4)),
                )
            })
            .prop_flat_map(
                |(nodes, loads, net, host, current, respect, select, local)| {
                    let shuffled = Just(nodes.clone()).prop_shuffle();
                    let mut c = case(&[&format!("10.0.{net}.{host}")]);
                    c.current = current.map(|i| format!("n{i}"));
                    c.respect_cordon = respect;
                    if select {
                        c = c.selector("zone", "a");
                    }
                    c.local = local.map(|s| s.into_iter().map(|i| format!("n{i}")).collect());
                    (Just(nodes), shuffled, Just(loads), Just(c))
                },
            )
    }

    fn load_of(nodes: &[NodeState], loads: &[usize]) -> BTreeMap<String, usize> {
        nodes
            .iter()
            .zip(loads)
            .map(|(n, l)| (n.name.to_string(), *l))
            .collect()
    }

    proptest! {
        #[test]
        fn election_properties((nodes, shuffled, loads, c) in arb_world()) {
            let l = load_of(&nodes, &loads);
            let input = c.input();
            let got = elect(&input, &nodes, &l);

            // Stable under reordering of the node list.
            prop_assert_eq!(&got, &elect(&input, &shuffled, &l));

            let eligible: Vec<String> = match eligible_nodes(&input, &nodes) {
                Ok(list) => list.iter().map(|n| n.name.to_string()).collect(),
                Err(why) => {
                    prop_assert_eq!(got, Err(why.clone()));
                    let counted = why.cordoned + why.excluded + why.not_selected
                        + why.no_local_endpoint + why.agent_not_ready;
                    prop_assert_eq!(counted, nodes.len());
                    return Ok(());
                }
            };
            let winner = got.expect("some node is eligible");

            // Always an eligible node, and the per-node rules agree.
            prop_assert!(eligible.contains(&winner));
            let w = nodes.iter().find(|n| *n.name == *winner).unwrap();
            prop_assert_eq!(ineligibility(&input, w), None);

            // Sticky: an eligible current holder is kept, and the winner is kept next time.
            if let Some(cur) = &c.current && eligible.contains(cur) {
                prop_assert_eq!(&winner, cur);
            } else {
                // Otherwise least-loaded among the eligible.
                let min = eligible.iter().map(|n| l[n]).min().unwrap();
                prop_assert_eq!(l[&winner], min);
            }
            let again = c.clone().current(&winner);
            prop_assert_eq!(elect(&again.input(), &shuffled, &l), Ok(winner));
        }
    }
    /// An unconfirmed agent (not seen renewing, but not known gone) keeps its node for
    /// the IPs it carries; it is never elected for IPs it does not carry.
    #[test]
    fn an_unconfirmed_agent_keeps_but_is_never_elected_anew() {
        let mut unconfirmed = node("a").not_ready();
        unconfirmed.agent_unconfirmed = true;
        let nodes = [unconfirmed, node("b")];
        let no_selector = BTreeMap::new();
        let ips = [ip("10.0.0.1")];
        let input = |current| ElectionInput {
            ips: &ips,
            current,
            node_selector: &no_selector,
            local_endpoint_nodes: None,
            respect_cordon: true,
        };
        // a carries no load: it would win, were it fresh.
        let load = BTreeMap::from([("b".to_owned(), 5)]);
        let table = [(Some("a"), Ok("a")), (None, Ok("b")), (Some("b"), Ok("b"))];
        for (current, want) in table {
            let got = elect(&input(current), &nodes, &load);
            assert_eq!(got.as_deref().map_err(|_| ()), want, "current {current:?}");
        }
        // Alone, it is no candidate: the reason is its agent.
        let alone = elect(&input(None), &nodes[..1], &load).unwrap_err();
        assert_eq!(alone.agent_not_ready, 1);
        // Unconfirmed does not override an operator's decision.
        let mut cordoned = nodes[0].clone();
        cordoned.unschedulable = true;
        assert!(elect(&input(Some("a")), &[cordoned], &load).is_err());
    }
}
