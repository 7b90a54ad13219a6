//! The term's index: what it planned and wrote, kept across its passes (the plans of
//! every Service of ours, the Services on each node, the first claims, the node MACs and
//! the assignment objects' versions as last rendered and seen, the uids for Events). The
//! pass reads and updates it; nothing else does.

use super::*;

/// What one leadership term keeps of its plans and writes.
#[derive(Debug, Default)]
pub(super) struct Index {
    /// The plan of every Service of ours, merged from the passes' outputs. (Boxed: a table
    /// keeps up to half its buckets empty, and an empty bucket then costs a pointer, not a
    /// plan.)
    pub(super) plans: HashMap<ServiceKey, Box<ServicePlan>>,
    /// Node -> the Services planned on it (the L2 node, an L3 announcer, or the standby).
    pub(super) on_node: HashMap<Arc<str>, BTreeSet<ServiceKey>>,
    /// The first claims of the last pass.
    pub(super) probe: BTreeSet<IpAddr>,
    /// Each node's signing key and MACs as its peers' indexes list them.
    pub(super) identities: Identities,
    /// The resourceVersion of each assignment object (index or shard), as last seen.
    pub(super) assignment_versions: HashMap<String, Option<String>>,
    /// The uids of our Services, for Events on deleted ones (the uid is shared with the
    /// record: no copy). The reference is built per Event, not per Service and pass (that
    /// was 7 % of the CPU at 10,000 Services).
    pub(super) refs: HashMap<ServiceKey, Arc<str>>,
}

/// The nodes a plan concerns: the L2 node, the L3 announcers and the standby (each has a
/// line of it), and the relay (a peer of the holder's, with nothing to carry).
fn nodes_of(plan: &ServicePlan) -> impl Iterator<Item = &Arc<str>> {
    let standby = plan.standby.as_ref().map(|s| &s.node);
    let relay = plan
        .standby
        .as_ref()
        .and_then(|s| s.relay.as_ref())
        .map(|(r, _)| r);
    plan.node
        .iter()
        .chain(&plan.nodes)
        .chain(standby)
        .chain(relay)
}

impl Index {
    /// The nodes whose indexes list `node` among their peers: those sharing a plan with
    /// it.
    pub(super) fn peers_of(&self, node: &str) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        for key in self.on_node.get(node).into_iter().flatten() {
            if let Some(plan) = self.plans.get(key) {
                out.extend(
                    nodes_of(plan)
                        .filter(|n| &***n != node)
                        .map(|n| n.to_string()),
                );
            }
        }
        out
    }

    /// Moves the pass's plans into [`Index::plans`] (`output.services` is empty
    /// after); returns what they touched: the nodes, and for each the IPs whose lines may
    /// have changed (the lines of a plan that changed, old and new).
    pub(super) fn merge(&mut self, output: &mut PlanOutput, observed: &PassInput) -> Merged {
        let nodes_of = nodes_of;
        let everything = observed.changes.everything;
        let mut touched = Touched::default();
        let unplan = |key: &ServiceKey,
                      plans: &mut HashMap<ServiceKey, Box<ServicePlan>>,
                      on_node: &mut HashMap<Arc<str>, BTreeSet<ServiceKey>>,
                      touched: &mut Touched| {
            if let Some(old) = plans.remove(key) {
                for node in nodes_of(&old) {
                    touched.lines(node, &old.ips);
                    if let Some(keys) = on_node.get_mut(node) {
                        keys.remove(key);
                    }
                }
            }
        };
        if everything {
            let gone: Vec<ServiceKey> = self
                .plans
                .keys()
                .filter(|k| !output.services.contains_key(*k))
                .cloned()
                .collect();
            for key in &gone {
                unplan(key, &mut self.plans, &mut self.on_node, &mut touched);
            }
        }
        for (key, _) in observed
            .changes
            .services
            .iter()
            .filter(|(_, view)| view.is_none())
        {
            unplan(key, &mut self.plans, &mut self.on_node, &mut touched);
        }
        for (key, _) in &output.released {
            if !output.services.contains_key(key) {
                unplan(key, &mut self.plans, &mut self.on_node, &mut touched);
            }
        }
        // A first claim that started or ended is a line's `probe` flag. Its Service is
        // re-planned with it; if not, every node is looked at rather than one missed.
        // (One index of the pass's IPs, not a scan of every plan per flipped IP: a first
        // pass flips as many IPs as it plans Services.)
        let mut every = everything;
        if !every && output.probe != self.probe {
            let mut carriers: HashMap<IpAddr, Vec<&Arc<str>>> = HashMap::new();
            for plan in output.services.values() {
                for ip in &plan.ips {
                    carriers.entry(*ip).or_default().extend(nodes_of(plan));
                }
            }
            for ip in output.probe.symmetric_difference(&self.probe) {
                match carriers.get(ip).filter(|nodes| !nodes.is_empty()) {
                    Some(nodes) => {
                        for node in nodes {
                            touched.lines(node, std::slice::from_ref(ip));
                        }
                    }
                    None => every = true,
                }
            }
        }
        self.probe.clone_from(&output.probe);
        // Changed ports change the lines even when the plan stays; nothing else of a view
        // does (a status write of ours landing changes the view, not the lines: at 100
        // nodes a slice's echoes would render every node).
        let ports_changed = &observed.services.ports;
        let mut planned = Vec::with_capacity(output.services.len());
        // The first pass sizes the table once rather than growing it through every power
        // of two (each growth holds the old table and the new one).
        if self.plans.is_empty() {
            self.plans.reserve(output.services.len());
        }
        // Moved, not copied: at 10,000 Services a first pass's plans are megabytes.
        for (key, plan) in std::mem::take(&mut output.services) {
            planned.push(key.clone());
            let old = self.plans.get(&key);
            // A plan whose lines stay (its conditions alone changed, as when an agent
            // reports an IP held) touches no node: rendering a node is O(its Services).
            if !ports_changed.contains(&key) && old.is_some_and(|old| old.same_lines(&plan)) {
                self.plans.insert(key, plan);
                continue;
            }
            if let Some(old) = old {
                for node in nodes_of(old) {
                    touched.lines(node, &old.ips);
                    if let Some(keys) = self.on_node.get_mut(node) {
                        keys.remove(&key);
                    }
                }
            }
            for node in nodes_of(&plan) {
                touched.lines(node, &plan.ips);
                self.on_node
                    .entry(node.clone())
                    .or_default()
                    .insert(key.clone());
            }
            self.plans.insert(key, plan);
        }
        self.on_node.retain(|_, keys| !keys.is_empty());
        Merged {
            touched: (!every).then_some(touched.0),
            planned,
        }
    }
}

/// The nodes a merge touched, each with the IPs whose lines may have changed there.
#[derive(Debug, Default)]
struct Touched(BTreeMap<String, BTreeSet<IpAddr>>);

impl Touched {
    /// The lines of `ips` on `node` may have changed.
    fn lines(&mut self, node: &str, ips: &[IpAddr]) {
        let lines = match self.0.get_mut(node) {
            Some(lines) => lines,
            None => self.0.entry(node.to_owned()).or_default(),
        };
        lines.extend(ips.iter().copied());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aliaslb_core::plan::ConditionPlan;

    fn quiet_pass() -> PassInput {
        PassInput {
            changes: Changes::default(),
            views: Vec::new(),
            services: ServiceDelta::default(),
            sight: Sight::Normal,
            nodes: Vec::new(),
            node_addresses: BTreeMap::new(),
            service_ranges: Vec::new(),
            now: Instant::now(),
        }
    }

    type Lines = BTreeMap<String, BTreeSet<IpAddr>>;

    fn merge(index: &mut Index, key: &ServiceKey, plan: &ServicePlan) -> Option<Lines> {
        let mut output = PlanOutput::default();
        output.services.insert(key.clone(), Box::new(plan.clone()));
        index.merge(&mut output, &quiet_pass()).touched
    }

    fn lines(of: &[(&str, &[&str])]) -> Option<Lines> {
        Some(
            of.iter()
                .map(|(node, ips)| {
                    let ips = ips.iter().map(|ip| ip.parse().unwrap()).collect();
                    ((*node).to_owned(), ips)
                })
                .collect(),
        )
    }

    #[test]
    fn a_plan_whose_conditions_alone_changed_touches_no_node() {
        let condition = |status| ConditionPlan {
            status,
            reason: "R",
            message: String::new(),
        };
        let key = ServiceKey::new("ns", "web");
        let plan =
            super::super::tests::l2_plan("10.0.0.1", "n1", condition(true), condition(false));
        let mut index = Index::default();
        let ip = &["10.0.0.1"][..];
        assert_eq!(merge(&mut index, &key, &plan), lines(&[("n1", ip)]));

        // The agent reported the IP held: Announced=True, the same lines.
        let announced = ServicePlan {
            announced: condition(true),
            ..plan.clone()
        };
        assert_eq!(merge(&mut index, &key, &announced), lines(&[]));
        assert_eq!(*index.plans[&key], announced, "the new plan is kept");
        assert_eq!(index.on_node["n1"], BTreeSet::from([key.clone()]));

        // A line that changes touches its nodes, old and new, with its IP.
        let moved = ServicePlan {
            node: Some("n2".into()),
            ..announced.clone()
        };
        assert_eq!(
            merge(&mut index, &key, &moved),
            lines(&[("n1", ip), ("n2", ip)])
        );
        let vmac = ServicePlan {
            virtual_mac: true,
            ..moved.clone()
        };
        assert_eq!(merge(&mut index, &key, &vmac), lines(&[("n2", ip)]));

        // New IPs: the lines of the old ones and of the new ones (the old go).
        let renumbered = ServicePlan {
            ips: vec!["10.0.0.2".parse().unwrap(), "fd00::2".parse().unwrap()],
            ..vmac.clone()
        };
        assert_eq!(
            merge(&mut index, &key, &renumbered),
            lines(&[("n2", &["10.0.0.1", "10.0.0.2", "fd00::2"])])
        );
    }
}
