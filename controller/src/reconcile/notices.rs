//! What the loop tells people, apart from the pass: the logs, Warning Events and gauges
//! for the controller going blind, a rejected agent report, an agent release it does not
//! support, the pool ConfigMap's changes, pool addresses a Node has or in a Service
//! ClusterIP range, and reported subnets that do not count. Each says a thing once, on its
//! edge, never once per pass.

use super::*;

/// What the loop last said on each edge it watches, so it says each thing once.
#[derive(Default)]
pub(super) struct Said {
    /// Agent Lease names whose report was last unreadable or out of bounds.
    pub(super) bad_reports: HashSet<String>,
    /// The release each agent Lease reports (its label), as last checked, by Lease name.
    pub(super) agent_versions: HashMap<String, Option<String>>,
    /// The agent Leases whose release this controller does not support, as last warned
    /// about ([`aliaslb_core::version`]).
    pub(super) unsupported_agents: BTreeSet<String>,
    /// The agent Leases whose Node does not exist, as last said (once each, in the log).
    pub(super) ghosts: HashSet<String>,
    /// The pool entries covering an address a Node has, as last warned about.
    pub(super) node_clashes: Vec<NodeAddressClash>,
    /// The pool entries overlapping a Service ClusterIP range, as last warned about.
    pub(super) service_clashes: Vec<ServiceRangeClash>,
    /// The reported subnets not used for election, by node, as last warned about.
    pub(super) unanchored: BTreeMap<String, Vec<ipnet::IpNet>>,
    /// The pool ConfigMap as last seen, for Events about its deletion.
    pub(super) configmap: Option<ObjectReference>,
}

impl Reconciler {
    /// The warning for the controller going blind: log, gauge, one Warning Event on the
    /// leader Lease (as for a deleted ConfigMap: see [`Reconciler::leader_lease_ref`]).
    pub(super) fn blind_notice(&self, agents: &BTreeMap<String, Freshness>) {
        let held = agents
            .values()
            .filter(|f| **f == Freshness::Unconfirmed)
            .count();
        let lease = self.ctx.config.agent_lease_duration;
        tracing::warn!(
            agents = held,
            "no agent Lease seen renewed within its lease duration: the controller cannot see the agents (kube-apiserver or watch interrupted?) rather than every node being lost; keeping every node assignment and electing no node until it sees them again"
        );
        self.ctx.metrics.set_agents_unobservable(true);
        self.events.enqueue(Notice {
            regarding: Regarding::Object(Box::new(self.leader_lease_ref())),
            warning: true,
            reason: AGENTS_UNOBSERVABLE,
            note: format!(
                "none of the {held} agent Leases was seen renewed within its lease duration \
                 (default {lease:?}): the controller takes it that it cannot see the agents, \
                 not that every node is lost. Every node keeps what it carries and no node is \
                 elected until a renewal is seen again. Check the kube-apiserver and the \
                 controller's connection to it."
            )
            .into(),
        });
    }

    /// Says once, in the log, each agent Lease whose Node does not exist (`ghosts`: Lease
    /// and node names), and counts them in `aliaslb_agent_leases_ignored`: it is ignored,
    /// whatever it reports (only nodes are agents; a compromised node may write such Leases
    /// where the admission policy is off).
    pub(super) fn ghost_notice(&mut self, ghosts: &BTreeSet<(&str, &str)>) {
        self.ctx.metrics.set_agent_leases_ignored(ghosts.len());
        for (lease, node) in ghosts {
            if !self.said.ghosts.contains(*lease) {
                tracing::warn!(
                    lease,
                    node,
                    "agent Lease of a node that does not exist: ignored (not read, not an agent) until a Node of that name exists"
                );
                self.said.ghosts.insert((*lease).to_owned());
            }
        }
        if self.said.ghosts.len() > ghosts.len() {
            let now: HashSet<&str> = ghosts.iter().map(|(lease, _)| *lease).collect();
            self.said
                .ghosts
                .retain(|lease| now.contains(lease.as_str()));
        }
    }

    /// The warning for a report that just became unusable: log, metric, Event on the Lease.
    pub(super) fn reject_report(&self, lease: &LeaseRecord, node: &str, error: &RejectedReport) {
        let category = error.category;
        // The error may quote the report (serde quotes what it did not expect).
        let error = text::bounded(error.message.clone(), MAX_NOTE);
        tracing::warn!(
            lease = lease.name.as_str(),
            node,
            reason = category,
            error = %error,
            "agent report rejected: the node is not eligible and holds nothing until its agent writes a valid one"
        );
        self.ctx.metrics.inc_agent_report_rejected(category);
        self.events.enqueue(Notice {
            regarding: Regarding::Object(Box::new(lease.object_ref())),
            warning: true,
            reason: INVALID_AGENT_REPORT,
            note: format!(
                "report of the agent on {node} ignored: the node is not eligible and holds \
                 nothing until it writes a valid one: {error}"
            )
            .into(),
        });
    }

    /// The warning for an agent whose release this controller does not support: log and
    /// a Warning Event on its Lease, saying what to upgrade.
    pub(super) fn unsupported_version_notice(
        &self,
        lease: &LeaseRecord,
        node: &str,
        support: &version::AgentSupport,
    ) {
        let controller = aliaslb_ops::build::VERSION;
        let advice = support.advice(controller);
        tracing::warn!(
            lease = lease.name.as_str(),
            node,
            agent_version = lease.agent_version(),
            controller_version = controller,
            reason = support.category(),
            "agent release not supported: {advice}"
        );
        self.events.enqueue(Notice {
            regarding: Regarding::Object(Box::new(lease.object_ref())),
            warning: true,
            reason: UNSUPPORTED_AGENT_VERSION,
            note: text::bounded(format!("agent on {node}: {advice}"), MAX_NOTE).into(),
        });
    }

    /// Logs a change of the pool config and publishes its Event, if any.
    pub(super) async fn config_notice(&self, cm: Option<&ConfigMap>, notice: ConfigNotice) {
        let namespace = &self.ctx.config.namespace;
        let name = &self.ctx.config.pool_configmap;
        match notice {
            ConfigNotice::MissingAtStart => {
                tracing::warn!(
                    %namespace,
                    %name,
                    "pool ConfigMap missing: no pools, every Service stays pending"
                );
            }
            ConfigNotice::MissingWithAssignments => {
                tracing::warn!(
                    %namespace,
                    %name,
                    "pool ConfigMap missing at start while IPs are assigned: it was deleted; nothing is planned and no IP is released until it exists again"
                );
                let note = format!(
                    "pool ConfigMap {namespace}/{name} is missing while IPs are assigned: \
                     nothing is planned and no IP is released until it exists again. A \
                     deleted ConfigMap is not an instruction: re-create it."
                );
                self.events
                    .now()
                    .publish(
                        &self.leader_lease_ref(),
                        None,
                        true,
                        "ConfigMapMissing",
                        note,
                    )
                    .await;
            }
            ConfigNotice::Deleted { pools } => {
                let keeping = match pools {
                    Some(n) => format!("keeping the last good pool config ({n} pools)"),
                    None => "no valid config was seen, no assignment is made".to_owned(),
                };
                tracing::warn!(
                    %namespace,
                    %name,
                    pools,
                    "pool ConfigMap deleted: {keeping}; no IP is released until it exists again"
                );
                let note = format!(
                    "pool ConfigMap {namespace}/{name} was deleted: {keeping}, no IP is \
                     released. A deleted ConfigMap is not an instruction: re-create it to \
                     change the config; to release a namespace's IPs, remove its key."
                );
                self.events
                    .now()
                    .publish(
                        &self.leader_lease_ref(),
                        self.said.configmap.clone(),
                        true,
                        "ConfigMapDeleted",
                        note,
                    )
                    .await;
            }
            ConfigNotice::Loaded { pools, announce } => {
                tracing::info!(pools, "pool config loaded");
                if announce {
                    let note = format!("pool config loaded: {pools} pools");
                    self.config_event(cm, false, "ConfigLoaded", note).await;
                }
            }
            ConfigNotice::Invalid { errors, stale } => {
                tracing::warn!(
                    errors = errors.len(),
                    first = %errors[0],
                    keeping_last_good = stale,
                    "pool ConfigMap invalid: no assignment changes until it is fixed"
                );
                let note = invalid_note(&errors, stale);
                self.config_event(cm, true, "InvalidConfig", note).await;
            }
        }
    }

    /// What the Warning about a deleted pool ConfigMap is put on: the controller's leader
    /// Lease (`aliaslb_core::keys::CONTROLLER_LEASE`, in the controller namespace), with
    /// the deleted ConfigMap as the Event's `related` object. Why this object:
    /// - the ConfigMap is gone: `kubectl describe` no longer shows it, and a re-created one
    ///   is a new object (new uid) that would not show the Event either;
    /// - the Lease exists whenever the Event is written: only the leader publishes, and the
    ///   leader holds it (with fixed leadership, as in tests, there is none: the Event then
    ///   names it without a uid and is still listed);
    /// - it sits in the controller namespace next to the ConfigMap, so `kubectl -n
    ///   aliaslb-system get events` shows it with the ConfigMap's own Events, and
    ///   `kubectl describe lease aliaslb-controller` shows it too;
    /// - it is the controller's own object and outlives failovers and pod restarts (a Pod
    ///   would not), and needs no permission the controller lacks;
    /// - the Services are not what changed: one Event on each of them for one deletion
    ///   would flood.
    pub(super) fn leader_lease_ref(&self) -> ObjectReference {
        let namespace = &self.ctx.config.namespace;
        let key = ServiceKey::new(namespace, keys::CONTROLLER_LEASE);
        match self.caches.leases.get(&key) {
            Some(lease) => lease.object_ref(),
            None => ObjectReference {
                api_version: Some("coordination.k8s.io/v1".into()),
                kind: Some("Lease".into()),
                namespace: Some(namespace.clone()),
                name: Some(keys::CONTROLLER_LEASE.into()),
                ..ObjectReference::default()
            },
        }
    }

    pub(super) async fn config_event(
        &self,
        cm: Option<&ConfigMap>,
        warning: bool,
        reason: &str,
        note: String,
    ) {
        let Some(cm) = cm else { return };
        self.events
            .now()
            .publish(&cm.object_ref(&()), None, warning, reason, note)
            .await;
    }

    /// Warns when the pool entries covering an address a Node has change (not on every
    /// pass): log and one Warning Event `NodeAddress` on the pool ConfigMap naming key, line
    /// and node. Without a ConfigMap to put it on, waits until there is one.
    pub(super) fn node_address_notice(
        &mut self,
        config: &PoolConfig,
        addresses: &BTreeMap<std::net::IpAddr, NodeAddress>,
    ) {
        let clashes = node_address_clashes(config, addresses);
        if clashes == self.said.node_clashes {
            return;
        }
        if clashes.is_empty() {
            tracing::info!("no pool address is a Node's any more");
            self.said.node_clashes = clashes;
            return;
        }
        if self.warn_pool_entries(
            &clashes,
            reason::NODE_ADDRESS,
            "the pool lists addresses that Nodes have: never allocated",
        ) {
            self.said.node_clashes = clashes;
        }
    }

    /// Logs `what` and puts one Warning Event `reason` on the pool ConfigMap listing the
    /// pool entries `clashes` (never empty), asking to remove them. Returns whether it was
    /// said: without a ConfigMap to put it on, it waits until there is one.
    pub(super) fn warn_pool_entries<T: std::fmt::Display>(
        &self,
        clashes: &[T],
        reason: &'static str,
        what: &str,
    ) -> bool {
        let Some(cm) = self.caches.configmap.state().into_iter().next() else {
            return false;
        };
        let list: Vec<String> = clashes.iter().map(ToString::to_string).collect();
        tracing::warn!(clashes = list.len(), first = %list[0], "{what}");
        let them = if list.len() == 1 { "it" } else { "them" };
        self.events.enqueue(Notice {
            regarding: Regarding::Object(Box::new(cm.object_ref(&()))),
            warning: true,
            reason,
            note: format!("{}; remove {them} from the pool", list.join("; ")).into(),
        });
        true
    }

    /// Warns, once per change, about the pool entries that overlap a Service ClusterIP
    /// range: log and a Warning Event `ServiceRange` on the pool ConfigMap.
    pub(super) fn service_range_notice(&mut self, config: &PoolConfig, ranges: &[ipnet::IpNet]) {
        let clashes = service_range_clashes(config, ranges);
        if clashes == self.said.service_clashes {
            return;
        }
        if clashes.is_empty() {
            tracing::info!("no pool entry overlaps a Service ClusterIP range any more");
            self.said.service_clashes = clashes;
            return;
        }
        if self.warn_pool_entries(
            &clashes,
            reason::SERVICE_RANGE,
            "the pool lists addresses in a Service ClusterIP range: never allocated",
        ) {
            self.said.service_clashes = clashes;
        }
    }

    /// Warns, once per change, about the reported subnets that do not count for election
    /// because they are wide and hold none of the Node's own addresses: log and a Warning
    /// Event on the Node.
    pub(super) fn unanchored_notice(&mut self, node_objects: &[std::sync::Arc<Node>]) {
        let unanchored = nodes::unanchored_subnets(node_objects, self.world.agents());
        if unanchored == self.said.unanchored {
            return;
        }
        for (name, subnets) in &unanchored {
            if self.said.unanchored.get(name) == Some(subnets) {
                continue;
            }
            let Some(node) = node_objects
                .iter()
                .find(|n| n.metadata.name.as_ref() == Some(name))
            else {
                continue;
            };
            let list: Vec<String> = subnets.iter().map(ToString::to_string).collect();
            tracing::warn!(
                node = %name,
                subnets = %list.join(", "),
                "the agent reports subnets wider than /24 (IPv4) or /64 (IPv6) that hold none of the Node's own addresses: not used for election"
            );
            self.events.enqueue(Notice {
                regarding: Regarding::Object(Box::new(node.object_ref(&()))),
                warning: true,
                reason: UNANCHORED_SUBNET,
                note: format!(
                    "the agent on {name} reports {}, wider than /24 (IPv4) or /64 (IPv6) and \
                     holding none of the addresses this Node lists: not used to elect this \
                     node (list an address of that network in the Node's status, e.g. with \
                     the kubelet's --node-ip, or use a narrower subnet)",
                    list.join(", ")
                )
                .into(),
            });
        }
        self.said.unanchored = unanchored;
    }
}

/// The Warning note for an invalid ConfigMap: every error with key and line.
pub(super) fn invalid_note(errors: &[PoolConfigError], stale: bool) -> String {
    let keeping = if stale {
        "keeping the last valid config"
    } else {
        "no valid config yet, no assignment is made"
    };
    let list: Vec<String> = errors.iter().map(ToString::to_string).collect();
    format!("{} error(s), {keeping}: {}", errors.len(), list.join("; "))
}
