//! Planned moves keep established connections: the drain window of every IP that left a
//! node in a planned move, and what each node does for it during the window (the index's
//! `handovers`, [`aliaslb_core::assignment`]). Pure: time comes in as [`Instant`]s, the
//! reconcile loop feeds it the plan changes and renders its lines.
//!
//! **Planned.** An IP leaves its holder in a planned move when the holder's agent is
//! fresh (a cordon, a drain, the exclude label, a pool's node selector edited, the last
//! local endpoint of an `externalTrafficPolicy: Local` Service gone: the graceful move of
//! `aliaslb_core::plan::placement`) or has released its Lease (an agent stopped by SIGTERM,
//! as in a rollout). Not when the agent is lost (its Lease expired: the node may be gone)
//! nor when the new holder already carries the IP when it is elected (its standby took it
//! over on the LAN: the old holder's flows broke then). A node that left an IP in a planned
//! move *drains* it for the window: its conntrack still carries the established flows,
//! which need no local address (kube-proxy's DNAT of an established flow is in its
//! conntrack entry). The node that gets the IP from it *forwards* the packets of TCP flows
//! it does not know to it, for as long as it drains.
//!
//! **Chains.** A node that drains and had itself got the IP from a draining node keeps
//! forwarding to that one (a rollout moves an IP twice within a window: the flows of the
//! first holder reach it through the second). When an IP comes back to a node, that node
//! stops draining it (its flows are local again) and every node forwarding to it stops:
//! the forwards never form a loop (each points to a node that held the IP earlier and has
//! not held it since).
//!
//! **Window.** Each drain ends [`Handovers::window`] after its move (`--drain-window`),
//! and the forwards to it with it; [`Handovers::next_end`] says when, for the loop's wake-up.
//! The tracker is the leader's memory: a new leader reads the lines back from the
//! assignment objects ([`Handovers::import`]) and gives them a whole window from its start
//! (a leader change extends a window, never cuts one).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use aliaslb_core::assignment::{Handover, MAX_HANDOVERS, Peer};
use aliaslb_core::election::NodeState;
use aliaslb_core::plan::Reports;
use ipnet::IpNet;

/// The default drain window (`--drain-window`): the deregistration delay cloud load
/// balancers default to (AWS's target groups, 300 s), so a client that reconnects on its
/// own schedule has minutes to, while a planned move costs forwarding for a bounded time.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(300);

/// One IP's drains and forwards.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Chain {
    /// The Service TCP ports on the IP, as last seen.
    ports: BTreeSet<u16>,
    /// The node that left the IP last in a planned move.
    last_left: Option<Arc<str>>,
    /// The nodes draining the IP, with when they left it.
    draining: BTreeMap<Arc<str>, Instant>,
    /// The nodes forwarding the IP's unknown flows, to whom (a draining node).
    forward: BTreeMap<Arc<str>, Peer>,
}

impl Chain {
    fn is_empty(&self) -> bool {
        self.draining.is_empty() && self.forward.is_empty()
    }

    /// Every node this chain names.
    fn nodes(&self) -> impl Iterator<Item = &Arc<str>> {
        self.draining.keys().chain(self.forward.keys())
    }

    /// `node` no longer drains the IP: it and every forward to it end. Returns the nodes
    /// whose lines changed.
    fn end_drain(&mut self, node: &str) -> Vec<Arc<str>> {
        let mut changed = Vec::new();
        if let Some((n, _)) = self.draining.remove_entry(node) {
            changed.push(n);
        }
        self.forward.retain(|from, to| {
            let keep = to.node != node;
            if !keep {
                changed.push(from.clone());
            }
            keep
        });
        if self.last_left.as_deref() == Some(node) {
            self.last_left = None;
        }
        changed
    }
}

/// One Service's plan change, as the reconcile loop's merge saw it (L2 plans only).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Move {
    /// The IPs before (empty: a new plan).
    pub old_ips: Vec<IpAddr>,
    /// The holder before.
    pub old_node: Option<Arc<str>>,
    /// The IPs now (empty: the Service is gone, or no longer in L2 mode).
    pub new_ips: Vec<IpAddr>,
    /// The holder now.
    pub new_node: Option<Arc<str>>,
    /// The Service TCP ports now.
    pub ports: BTreeSet<u16>,
}

/// The drain windows in force (see the module docs).
#[derive(Debug, Clone)]
pub struct Handovers {
    window: Duration,
    chains: HashMap<IpAddr, Chain>,
    /// Each node's subnets with its address there, as its agent last reported them (an
    /// agent that released its Lease reports none: its address is still needed).
    addresses: HashMap<Arc<str>, Vec<(IpNet, IpAddr)>>,
    /// The nodes whose lines changed since [`Handovers::take_changed`].
    changed: BTreeSet<String>,
}

/// How the world looked at a move: who may leave in a planned move, who holds what.
#[derive(Debug, Clone, Copy)]
pub struct World<'a> {
    /// Every node (its agent's freshness).
    pub nodes: &'a [NodeState],
    /// The nodes whose agent released its Lease (it stopped in order, on SIGTERM).
    pub released: &'a BTreeSet<String>,
    /// Each node's agent's report (the IPs it holds).
    pub reports: &'a Reports,
}

impl Handovers {
    /// No drain in force; `window` zero turns handovers off.
    pub fn new(window: Duration) -> Self {
        Handovers {
            window,
            chains: HashMap::new(),
            addresses: HashMap::new(),
            changed: BTreeSet::new(),
        }
    }

    /// The drain window.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// Remembers each node's addresses from `nodes` (those reporting any).
    pub fn observe_nodes(&mut self, nodes: &[NodeState]) {
        for node in nodes {
            let pairs: Vec<(IpNet, IpAddr)> = node
                .subnets
                .iter()
                .filter_map(|net| {
                    let address = node.addresses.iter().find(|a| net.contains(*a))?;
                    Some((*net, *address))
                })
                .collect();
            if !pairs.is_empty() {
                self.addresses.insert(node.name.clone(), pairs);
            }
        }
    }

    /// `node`'s address on the subnet of `ip`, as last reported.
    fn address_of(&self, node: &str, ip: IpAddr) -> Option<IpAddr> {
        self.addresses
            .get(node)?
            .iter()
            .find(|(net, _)| net.contains(&ip))
            .map(|(_, a)| *a)
    }

    /// Takes in one Service's plan change at `now`.
    pub fn moved(&mut self, change: &Move, world: &World<'_>, now: Instant) {
        for ip in &change.old_ips {
            if !change.new_ips.contains(ip) {
                self.forget(*ip);
            }
        }
        if self.window.is_zero() {
            return;
        }
        for ip in &change.new_ips {
            let before = change
                .old_node
                .as_ref()
                .filter(|_| change.old_ips.contains(ip));
            if before == change.new_node.as_ref() {
                if let Some(chain) = self.chains.get_mut(ip)
                    && chain.ports != change.ports
                {
                    chain.ports.clone_from(&change.ports);
                    self.changed.extend(chain.nodes().map(|n| n.to_string()));
                }
                continue;
            }
            if let Some(old) = before {
                let planned = world.released.contains(&**old)
                    || world.nodes.iter().any(|n| n.name == *old && n.agent_ready);
                self.left(*ip, old, planned, &change.ports, now);
            }
            if let Some(new) = &change.new_node {
                let took_over = world
                    .reports
                    .get(&**new)
                    .is_some_and(|r| r.held.contains(ip));
                self.arrived(*ip, new, took_over);
            }
        }
    }

    /// The IP left `node`: in a planned move, `node` drains it from `now`.
    fn left(
        &mut self,
        ip: IpAddr,
        node: &Arc<str>,
        planned: bool,
        ports: &BTreeSet<u16>,
        now: Instant,
    ) {
        let chain = self.chains.entry(ip).or_default();
        chain.ports.clone_from(ports);
        if planned {
            chain.draining.insert(node.clone(), now);
            chain.last_left = Some(node.clone());
            self.changed.insert(node.to_string());
        } else {
            // Lost: nothing of its flows can be carried, nor forwarded through it.
            self.changed
                .extend(chain.end_drain(node).iter().map(|n| n.to_string()));
            if chain.forward.remove(&**node).is_some() {
                self.changed.insert(node.to_string());
            }
        }
        if chain.is_empty() && chain.last_left.is_none() {
            self.chains.remove(&ip);
        }
    }

    /// The IP arrived at `node` (`took_over`: its agent already holds it, taken over on
    /// the LAN).
    fn arrived(&mut self, ip: IpAddr, node: &Arc<str>, took_over: bool) {
        let Some(mut chain) = self.chains.remove(&ip) else {
            return;
        };
        // Its own flows are local again; whoever forwarded to it stops (no loop).
        let mut changed = chain.end_drain(node);
        if chain.forward.remove(&**node).is_some() {
            changed.push(node.clone());
        }
        if let Some(from) = chain.last_left.clone() {
            if took_over {
                changed.extend(chain.end_drain(&from));
            } else if let Some(address) = self.address_of(&from, ip) {
                chain.forward.insert(
                    node.clone(),
                    Peer {
                        node: from.to_string(),
                        address,
                    },
                );
                changed.push(node.clone());
            }
        }
        self.changed.extend(changed.iter().map(|n| n.to_string()));
        if !chain.is_empty() {
            self.chains.insert(ip, chain);
        }
    }

    /// The IP is no longer a Service's (deleted, renumbered, moved to an L3 pool): every
    /// line of it goes.
    fn forget(&mut self, ip: IpAddr) {
        if let Some(chain) = self.chains.remove(&ip) {
            self.changed.extend(chain.nodes().map(|n| n.to_string()));
        }
    }

    /// Ends the drains whose window has passed at `now`.
    pub fn expire(&mut self, now: Instant) {
        let window = self.window;
        let mut changed = Vec::new();
        self.chains.retain(|_, chain| {
            let ended: Vec<Arc<str>> = chain
                .draining
                .iter()
                .filter(|(_, since)| now >= **since + window)
                .map(|(n, _)| n.clone())
                .collect();
            for node in ended {
                changed.extend(chain.end_drain(&node));
            }
            !chain.is_empty()
        });
        self.changed.extend(changed.iter().map(|n| n.to_string()));
    }

    /// When the next drain ends.
    pub fn next_end(&self) -> Option<Instant> {
        self.chains
            .values()
            .flat_map(|c| c.draining.values())
            .map(|since| *since + self.window)
            .min()
    }

    /// The nodes whose lines changed since the last call.
    pub fn take_changed(&mut self) -> BTreeSet<String> {
        std::mem::take(&mut self.changed)
    }

    /// How many IPs are in a drain window.
    pub fn ips(&self) -> usize {
        self.chains
            .values()
            .filter(|c| !c.draining.is_empty())
            .count()
    }

    /// Every node's handover lines: the latest [`MAX_HANDOVERS`] of each (a forward counts
    /// from the drain it forwards to).
    pub fn lines(&self) -> HashMap<Arc<str>, BTreeMap<IpAddr, Handover>> {
        let mut by_node: HashMap<Arc<str>, Vec<(Instant, IpAddr, Handover)>> = HashMap::new();
        for (ip, chain) in &self.chains {
            for node in chain.nodes().collect::<BTreeSet<_>>() {
                let draining = chain.draining.get(node).copied();
                let forward = chain.forward.get(node).cloned();
                let since = forward
                    .as_ref()
                    .and_then(|to| chain.draining.get(to.node.as_str()).copied())
                    .into_iter()
                    .chain(draining)
                    .max();
                let Some(since) = since else {
                    continue;
                };
                let handover = Handover {
                    ports: chain.ports.clone(),
                    forward,
                    draining: draining.is_some(),
                };
                by_node
                    .entry(node.clone())
                    .or_default()
                    .push((since, *ip, handover));
            }
        }
        by_node
            .into_iter()
            .map(|(node, mut lines)| {
                if lines.len() > MAX_HANDOVERS {
                    lines.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
                    lines.truncate(MAX_HANDOVERS);
                }
                let lines = lines.into_iter().map(|(_, ip, h)| (ip, h)).collect();
                (node, lines)
            })
            .collect()
    }

    /// A new leader takes in the lines its assignment objects say for `node`, each with a
    /// whole window from `now`.
    pub fn import(&mut self, node: &str, lines: &BTreeMap<IpAddr, Handover>, now: Instant) {
        if self.window.is_zero() {
            return;
        }
        let node: Arc<str> = node.into();
        for (ip, line) in lines {
            let chain = self.chains.entry(*ip).or_default();
            chain.ports.extend(&line.ports);
            if line.draining {
                chain.draining.insert(node.clone(), now);
            }
            if let Some(to) = &line.forward {
                chain.forward.insert(node.clone(), to.clone());
            }
        }
    }

    /// After [`Handovers::import`]: forwards to a node that drains nothing are dropped, and
    /// each IP's last drain is the one the current holder forwards to.
    pub fn imported(&mut self) {
        for chain in self.chains.values_mut() {
            let draining = &chain.draining;
            chain
                .forward
                .retain(|_, to| draining.contains_key(to.node.as_str()));
            // The holder is the node that forwards and drains nothing.
            chain.last_left = chain
                .forward
                .iter()
                .find(|(from, _)| !draining.contains_key(&***from))
                .map(|(_, to)| Arc::from(to.node.as_str()));
        }
        self.chains.retain(|_, c| !c.is_empty());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aliaslb_core::report::AgentReport;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn node(name: &str, n: u8, ready: bool) -> NodeState {
        NodeState {
            name: name.into(),
            labels: BTreeMap::new(),
            unschedulable: false,
            agent_ready: ready,
            agent_unconfirmed: false,
            agent_announcing: ready,
            subnets: vec!["10.0.0.0/24".parse().unwrap(), "fd00::/64".parse().unwrap()],
            addresses: vec![ip(&format!("10.0.0.{n}")), ip(&format!("fd00::{n}"))],
        }
    }

    struct Lab {
        nodes: Vec<NodeState>,
        released: BTreeSet<String>,
        reports: Reports,
        tracker: Handovers,
        t0: Instant,
    }

    impl Lab {
        fn new() -> Self {
            let nodes = vec![node("a", 1, true), node("b", 2, true), node("c", 3, true)];
            let mut tracker = Handovers::new(Duration::from_secs(300));
            tracker.observe_nodes(&nodes);
            Lab {
                nodes,
                released: BTreeSet::new(),
                reports: BTreeMap::new(),
                tracker,
                t0: Instant::now(),
            }
        }

        fn set_ready(&mut self, name: &str, ready: bool) {
            for n in &mut self.nodes {
                if &*n.name == name {
                    n.agent_ready = ready;
                }
            }
        }

        /// The IPs move from `from` to `to` at `secs` seconds.
        fn step(&mut self, ips: &[&str], from: Option<&str>, to: Option<&str>, secs: u64) {
            let ips: Vec<IpAddr> = ips.iter().map(|s| ip(s)).collect();
            let world = World {
                nodes: &self.nodes,
                released: &self.released,
                reports: &self.reports,
            };
            let change = Move {
                old_ips: ips.clone(),
                old_node: from.map(Arc::from),
                new_ips: ips,
                new_node: to.map(Arc::from),
                ports: [80].into(),
            };
            self.tracker
                .moved(&change, &world, self.t0 + Duration::from_secs(secs));
        }

        /// Each node's lines for `ip` as `draining`/`forward=NODE`.
        fn of(&self, ip_s: &str) -> BTreeMap<String, String> {
            let lines = self.tracker.lines();
            let mut out = BTreeMap::new();
            for (node, l) in lines {
                if let Some(h) = l.get(&ip(ip_s)) {
                    let mut words = Vec::new();
                    if h.draining {
                        words.push("draining".to_owned());
                    }
                    if let Some(to) = &h.forward {
                        words.push(format!("forward={to}"));
                    }
                    out.insert(node.to_string(), words.join(" "));
                }
            }
            out
        }
    }

    fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn a_graceful_move_drains_the_old_holder_and_the_new_one_forwards_to_it() {
        let mut lab = Lab::new();
        lab.step(&["10.0.0.10", "fd00::10"], None, Some("a"), 0);
        assert!(
            lab.tracker.lines().is_empty(),
            "a first placement hands nothing over"
        );
        // Cordoned: the IPs leave a (its agent fresh), then arrive at b.
        lab.step(&["10.0.0.10", "fd00::10"], Some("a"), None, 10);
        assert_eq!(lab.of("10.0.0.10"), map(&[("a", "draining")]));
        lab.step(&["10.0.0.10", "fd00::10"], None, Some("b"), 11);
        assert_eq!(
            lab.of("10.0.0.10"),
            map(&[("a", "draining"), ("b", "forward=a@10.0.0.1")])
        );
        assert_eq!(
            lab.of("fd00::10"),
            map(&[("a", "draining"), ("b", "forward=a@fd00::1")]),
            "each family forwards to the address of its own"
        );
        assert_eq!(
            lab.tracker.take_changed(),
            ["a", "b"].map(String::from).into()
        );
        assert_eq!(lab.tracker.ips(), 2);
        // The window ends 300 s after the move: every line goes, both nodes rewritten.
        let end = lab.t0 + Duration::from_secs(310);
        assert_eq!(lab.tracker.next_end(), Some(end));
        lab.tracker.expire(end - Duration::from_millis(1));
        assert!(lab.tracker.take_changed().is_empty());
        lab.tracker.expire(end);
        assert!(lab.tracker.lines().is_empty());
        assert_eq!(
            lab.tracker.take_changed(),
            ["a", "b"].map(String::from).into()
        );
        assert_eq!(lab.tracker.next_end(), None);
    }

    #[test]
    fn a_released_lease_is_planned_a_lost_one_is_not() {
        let mut lab = Lab::new();
        lab.step(&["10.0.0.10"], None, Some("a"), 0);
        // SIGTERM: a's agent released its Lease, the IP goes to b in one pass.
        lab.set_ready("a", false);
        lab.released.insert("a".into());
        lab.step(&["10.0.0.10"], Some("a"), Some("b"), 5);
        assert_eq!(
            lab.of("10.0.0.10"),
            map(&[("a", "draining"), ("b", "forward=a@10.0.0.1")])
        );
        // b is lost (its Lease expired): nothing of its flows is carried; c forwards to a
        // still, whose flows b had carried to it.
        lab.set_ready("b", false);
        lab.step(&["10.0.0.10"], Some("b"), Some("c"), 6);
        assert_eq!(
            lab.of("10.0.0.10"),
            map(&[("a", "draining"), ("c", "forward=a@10.0.0.1")])
        );
        // A hard loss with nothing planned before hands nothing over.
        let mut lab = Lab::new();
        lab.step(&["10.0.0.11"], None, Some("a"), 0);
        lab.set_ready("a", false);
        lab.step(&["10.0.0.11"], Some("a"), Some("b"), 5);
        assert!(lab.of("10.0.0.11").is_empty());
    }

    #[test]
    fn a_takeover_on_the_lan_is_not_a_handover() {
        let mut lab = Lab::new();
        lab.step(&["10.0.0.10"], None, Some("a"), 0);
        // The standby b took the IP over on the LAN; a, back, yielded it; the controller
        // confirms b while both agents are fresh.
        let mut report = AgentReport::default();
        report.held.insert(ip("10.0.0.10"));
        lab.reports.insert("b".into(), Arc::new(report));
        lab.step(&["10.0.0.10"], Some("a"), Some("b"), 5);
        assert!(lab.of("10.0.0.10").is_empty());
    }

    #[test]
    fn chains_follow_the_moves_and_never_loop() {
        let mut lab = Lab::new();
        lab.step(&["10.0.0.10"], None, Some("a"), 0);
        lab.step(&["10.0.0.10"], Some("a"), Some("b"), 10);
        // A rollout: b moves it on to c within a's window; b keeps forwarding to a.
        lab.step(&["10.0.0.10"], Some("b"), Some("c"), 20);
        assert_eq!(
            lab.of("10.0.0.10"),
            map(&[
                ("a", "draining"),
                ("b", "draining forward=a@10.0.0.1"),
                ("c", "forward=b@10.0.0.2"),
            ])
        );
        // Back to a: its flows are local again, b's forward to it ends (no loop a -> b ->
        // a); a forwards to c's predecessor... c, which drains now.
        lab.step(&["10.0.0.10"], Some("c"), Some("a"), 30);
        assert_eq!(
            lab.of("10.0.0.10"),
            map(&[
                ("a", "forward=c@10.0.0.3"),
                ("b", "draining"),
                ("c", "draining forward=b@10.0.0.2"),
            ])
        );
        // Every forward points to a draining node, none back to the holder.
        let lines = lab.tracker.lines();
        for (from, l) in &lines {
            for h in l.values() {
                if let Some(to) = &h.forward {
                    assert_ne!(to.node, "a", "{from} forwards to the holder");
                    assert!(lines[&*to.node][&ip("10.0.0.10")].draining);
                }
            }
        }
        // b's drain (from 20 s) ends at 320 s: c's forward to it goes, c still drains.
        lab.tracker.expire(lab.t0 + Duration::from_secs(320));
        assert_eq!(
            lab.of("10.0.0.10"),
            map(&[("a", "forward=c@10.0.0.3"), ("c", "draining")])
        );
    }

    #[test]
    fn ports_follow_the_service_and_a_gone_ip_is_forgotten() {
        let mut lab = Lab::new();
        lab.step(&["10.0.0.10"], None, Some("a"), 0);
        lab.step(&["10.0.0.10"], Some("a"), Some("b"), 1);
        lab.tracker.take_changed();
        let world_nodes = lab.nodes.clone();
        let released = BTreeSet::new();
        let reports = BTreeMap::new();
        let world = World {
            nodes: &world_nodes,
            released: &released,
            reports: &reports,
        };
        let same = Move {
            old_ips: vec![ip("10.0.0.10")],
            old_node: Some("b".into()),
            new_ips: vec![ip("10.0.0.10")],
            new_node: Some("b".into()),
            ports: [80, 443].into(),
        };
        lab.tracker.moved(&same, &world, lab.t0);
        assert_eq!(
            lab.tracker.lines()[&Arc::from("b")][&ip("10.0.0.10")].ports,
            [80, 443].into()
        );
        assert_eq!(
            lab.tracker.take_changed(),
            ["a", "b"].map(String::from).into()
        );
        let gone = Move {
            new_ips: Vec::new(),
            new_node: None,
            ..same
        };
        lab.tracker.moved(&gone, &world, lab.t0);
        assert!(lab.tracker.lines().is_empty());
        assert_eq!(
            lab.tracker.take_changed(),
            ["a", "b"].map(String::from).into()
        );
    }

    #[test]
    fn a_zero_window_hands_nothing_over() {
        let mut lab = Lab::new();
        lab.tracker = Handovers::new(Duration::ZERO);
        lab.tracker.observe_nodes(&lab.nodes.clone());
        lab.step(&["10.0.0.10"], None, Some("a"), 0);
        lab.step(&["10.0.0.10"], Some("a"), Some("b"), 1);
        assert!(lab.tracker.lines().is_empty());
        assert_eq!(lab.tracker.next_end(), None);
    }

    #[test]
    fn a_new_leader_takes_the_lines_back_with_a_whole_window() {
        let mut lab = Lab::new();
        lab.step(&["10.0.0.10"], None, Some("a"), 0);
        lab.step(&["10.0.0.10"], Some("a"), Some("b"), 10);
        lab.step(&["10.0.0.10"], Some("b"), Some("c"), 20);
        let lines = lab.tracker.lines();
        let mut next = Handovers::new(Duration::from_secs(300));
        let later = lab.t0 + Duration::from_secs(100);
        for (node, l) in &lines {
            next.import(node, l, later);
        }
        next.imported();
        assert_eq!(next.lines(), lines);
        assert_eq!(next.next_end(), Some(later + Duration::from_secs(300)));
        // The holder c forwards to b, the last to leave: a move on hands over from b.
        next.observe_nodes(&lab.nodes);
        lab.tracker = next;
        lab.step(&["10.0.0.10"], Some("c"), Some("a"), 110);
        assert_eq!(
            lab.of("10.0.0.10"),
            map(&[
                ("a", "forward=c@10.0.0.3"),
                ("b", "draining"),
                ("c", "draining forward=b@10.0.0.2"),
            ])
        );
        // A forward whose target no longer drains is not taken back.
        let mut orphan = Handovers::new(Duration::from_secs(300));
        let mut only_forward = BTreeMap::new();
        only_forward.insert(
            ip("10.0.0.12"),
            Handover {
                ports: [80].into(),
                forward: Some(Peer {
                    node: "a".into(),
                    address: ip("10.0.0.1"),
                }),
                draining: false,
            },
        );
        orphan.import("b", &only_forward, later);
        orphan.imported();
        assert!(orphan.lines().is_empty());
    }
}
