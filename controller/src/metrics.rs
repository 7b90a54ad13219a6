//! The controller's Prometheus metrics: one registry, typed handles, text encoding.
//!
//! No I/O: `http` serves [`Metrics::encode`]. Every name is prefixed `aliaslb_`. The
//! names are stable: the alert rules (`manifests/optional/monitoring/`) use them, and a
//! test checks that every name they use is registered here or in the agent.
//!
//! Labelled gauges whose label sets come and go (pending reasons, agent ages) are replaced
//! series by series, never cleared and refilled: a scrape in between would miss a series
//! and reset an alert's `for`.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::Hash;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use aliaslb_core::range::Family as IpFamily;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::observe::agents::AgentClock;
use crate::track::Cause;

/// Value of the `family` label.
fn family_label(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => "ipv4",
        IpFamily::V6 => "ipv6",
    }
}

/// Labels of the per-pool gauges.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct PoolLabels {
    /// Pool key in the ConfigMap (a namespace).
    pool: String,
    /// `ipv4` or `ipv6`.
    family: &'static str,
}

/// Labels of the gauges by reason (`aliaslb_core::plan::reason`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, EncodeLabelSet)]
struct ReasonLabels {
    /// CamelCase reason of the condition, e.g. `PoolExhausted`.
    reason: &'static str,
}

/// Labels of the unannounced Services gauge.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, EncodeLabelSet)]
struct PoolReasonLabels {
    /// Pool key in the ConfigMap.
    pool: String,
    /// Reason of the `aliaslb.io/Announced` condition.
    reason: &'static str,
}

/// Labels of the failover metrics.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct CauseLabels {
    /// `hard`, `graceful` or `conflict` ([`Cause::label`]).
    cause: &'static str,
}

/// Labels of the per-node gauges.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, EncodeLabelSet)]
struct NodeLabels {
    /// Node name.
    node: String,
}

/// Buckets of the failover durations, in seconds: 50 ms .. ~7 min.
fn failover_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.05, 2.0, 14))
}

/// A labelled gauge whose label sets are replaced as a whole ([`Replaced::set`]).
#[derive(Debug)]
struct Replaced<L, G> {
    family: Family<L, G>,
    /// The label sets exported now.
    shown: Mutex<BTreeSet<L>>,
}

impl<L, G> Replaced<L, G>
where
    L: Clone + Ord + Hash + EncodeLabelSet + std::fmt::Debug + Send + Sync + 'static,
    G: Default
        + std::fmt::Debug
        + Send
        + Sync
        + prometheus_client::encoding::EncodeMetric
        + prometheus_client::metrics::TypedMetric
        + 'static,
{
    fn new() -> Self {
        Replaced {
            family: Family::default(),
            shown: Mutex::new(BTreeSet::new()),
        }
    }

    /// Exports exactly `values`, with `write` setting one gauge: new label sets appear,
    /// those left out disappear, the others are overwritten in place.
    fn set<V>(&self, values: impl IntoIterator<Item = (L, V)>, write: impl Fn(&G, V)) {
        let mut shown = self.shown.lock().unwrap_or_else(|e| e.into_inner());
        let mut now = BTreeSet::new();
        for (labels, value) in values {
            write(&self.family.get_or_create(&labels), value);
            now.insert(labels);
        }
        for gone in shown.difference(&now) {
            self.family.remove(gone);
        }
        *shown = now;
    }
}

/// How long the longest-waiting Service of each (pool, reason) has waited: the `since`
/// instants are set by the pass, the ages computed at every [`Metrics::encode`] (a Service
/// that waits causes no pass, and its age must still grow).
#[derive(Debug)]
struct Ages {
    family: Replaced<AgeLabels, Gauge<f64, AtomicU64>>,
    since: Mutex<BTreeMap<AgeLabels, Instant>>,
}

/// Labels of the waiting Services' ages.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, EncodeLabelSet)]
struct AgeLabels {
    /// The Services' namespace.
    namespace: String,
    /// Pool key in the ConfigMap (empty: none, e.g. `NoPool`).
    pool: String,
    /// Reason of the condition.
    reason: &'static str,
}

impl Ages {
    fn new() -> Self {
        Ages {
            family: Replaced::new(),
            since: Mutex::new(BTreeMap::new()),
        }
    }

    fn set(&self, since: BTreeMap<(String, String, &'static str), Instant>) {
        let since = since
            .into_iter()
            .map(|((namespace, pool, reason), at)| {
                (
                    AgeLabels {
                        namespace,
                        pool,
                        reason,
                    },
                    at,
                )
            })
            .collect();
        *self.since.lock().unwrap_or_else(|e| e.into_inner()) = since;
    }

    fn publish(&self, now: Instant) {
        let ages: Vec<(AgeLabels, f64)> = self
            .since
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(labels, at)| {
                (
                    labels.clone(),
                    now.saturating_duration_since(*at).as_secs_f64(),
                )
            })
            .collect();
        self.family.set(ages, |g, age| {
            g.set(age);
        });
    }
}

/// Labels of the failing writes gauge.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ObjectLabels {
    /// `service` or `node_assignment`.
    object: &'static str,
}

/// Labels of the reconcile error counter.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ErrorLabels {
    /// Short stable snake_case category of the error, `ApplyError::category`.
    category: String,
}

/// Labels of the rejected agent report counter.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RejectedLabels {
    /// What was wrong, `aliaslb_core::report::ReportError::category`.
    reason: &'static str,
}

/// The controller's metrics. Cheap to share behind an `Arc`; every method takes `&self`.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    pool_size: Family<PoolLabels, Gauge<f64, AtomicU64>>,
    pool_in_use: Family<PoolLabels, Gauge>,
    pool_quarantined: Family<PoolLabels, Gauge>,
    pool_draining: Family<PoolLabels, Gauge>,
    pending: Gauge,
    pending_by_reason: Replaced<ReasonLabels, Gauge>,
    unannounced: Replaced<PoolReasonLabels, Gauge>,
    pending_age: Ages,
    unannounced_age: Ages,
    create_to_ip: Histogram,
    failovers: Family<CauseLabels, Counter>,
    failover_duration: Family<CauseLabels, Histogram, fn() -> Histogram>,
    renewal_age: Replaced<NodeLabels, Gauge<f64, AtomicU64>>,
    /// Read at every encode: the watch of the agent Leases updates it.
    agents: OnceLock<Arc<Mutex<AgentClock>>>,
    allocations: Counter,
    releases: Counter,
    reconcile_errors: Family<ErrorLabels, Counter>,
    agent_reports_rejected: Family<RejectedLabels, Counter>,
    reconcile_duration: Histogram,
    services_planned: Counter,
    config_valid: Gauge,
    config_stale: Gauge,
    leader: Gauge,
    agents_unobservable: Gauge,
    agents_unsupported_version: Gauge,
    agents_ready: Gauge,
    writes_failing: Family<ObjectLabels, Gauge>,
    address_conflicts: Gauge,
    agent_leases_ignored: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A fresh registry with every metric registered.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("aliaslb");
        let pool_size = Family::<PoolLabels, Gauge<f64, AtomicU64>>::default();
        registry.register(
            "pool_addresses",
            "Addresses in the pool (a float: IPv6 pools can exceed 2^63)",
            pool_size.clone(),
        );
        let pool_in_use = Family::<PoolLabels, Gauge>::default();
        registry.register(
            "pool_addresses_in_use",
            "Pool addresses allocated to Services",
            pool_in_use.clone(),
        );
        let pool_quarantined = Family::<PoolLabels, Gauge>::default();
        registry.register(
            "pool_addresses_quarantined",
            "Pool addresses taken from a Service while the API still shows them on it: counted in use, not allocated again until no Service shows them",
            pool_quarantined.clone(),
        );
        let pool_draining = Family::<PoolLabels, Gauge>::default();
        registry.register(
            "pool_addresses_draining",
            "Pool addresses of draining entries (or a draining pool) still in use: left to move; counted in pool_addresses and pool_addresses_in_use, never handed out anew",
            pool_draining.clone(),
        );
        let pending = Gauge::default();
        registry.register(
            "services_pending",
            "LoadBalancer Services handled by aliaslb that have no IP",
            pending.clone(),
        );
        let pending_by_reason = Replaced::new();
        registry.register(
            "services_pending_by_reason",
            "The Services of services_pending by the reason of their aliaslb.io/IPAllocated condition (PoolExhausted, NoPool, AddressConflict...)",
            pending_by_reason.family.clone(),
        );
        let unannounced = Replaced::new();
        registry.register(
            "services_unannounced",
            "Services with IPs whose aliaslb.io/Announced reason is not Announced (WaitingForAgent, Moving, NoEligibleNode, AddressConflict, AgentsUnobservable; L3 mode: PartiallyAnnounced, NotAnnounced), by pool and reason",
            unannounced.family.clone(),
        );
        let pending_age = Ages::new();
        registry.register(
            "services_pending_seconds",
            "How long the longest-pending Service (no IP, or not every IP it asks for) of each namespace, pool and reason has been pending, in seconds, as the leader saw it (its own clock, from the first pass of its term that saw it pending)",
            pending_age.family.family.clone(),
        );
        let unannounced_age = Ages::new();
        registry.register(
            "services_unannounced_seconds",
            "How long the longest-unannounced Service of each namespace, pool and Announced reason (see services_unannounced) has had IPs not announced, in seconds, as the leader saw it (its own clock, from the first pass of its term that saw it so)",
            unannounced_age.family.family.clone(),
        );
        // 250 ms .. ~17 min.
        let create_to_ip = Histogram::new(exponential_buckets(0.25, 2.0, 13));
        registry.register(
            "service_create_to_ip_seconds",
            "From a Service's creationTimestamp (whole seconds) to the pass that allocated its first IP",
            create_to_ip.clone(),
        );
        let failovers = Family::<CauseLabels, Counter>::default();
        registry.register(
            "failovers",
            "Services whose IPs left the node that carried them, by cause: hard (its agent was not ready), graceful (its agent was ready, or shut down in order: cordon, exclusion, agent SIGTERM), conflict (an IP withheld by a LAN conflict was replaced); counted when it starts",
            failovers.clone(),
        );
        let failover_duration =
            Family::<CauseLabels, Histogram, fn() -> Histogram>::new_with_constructor(
                failover_buckets,
            );
        registry.register(
            "failover_duration_seconds",
            "From the pass that took a Service's IPs off their node (or replaced a withheld IP) to the first pass that saw a node's agent hold them all, by cause; for a hard failover the agent lease duration comes before it",
            failover_duration.clone(),
        );
        let renewal_age = Replaced::new();
        registry.register(
            "node_agent_renewal_age_seconds",
            "Seconds since this controller last saw the node's agent Lease renewed (its own clock; counted from start-up for a Lease not renewed since), for Leases with a holder",
            renewal_age.family.clone(),
        );
        let allocations = Counter::default();
        registry.register(
            "allocations",
            "IPs allocated to Services",
            allocations.clone(),
        );
        let releases = Counter::default();
        registry.register("releases", "IPs released by Services", releases.clone());
        let reconcile_errors = Family::<ErrorLabels, Counter>::default();
        registry.register(
            "reconcile_errors",
            "Failed reconciles by error category",
            reconcile_errors.clone(),
        );
        let agent_reports_rejected = Family::<RejectedLabels, Counter>::default();
        registry.register(
            "agent_reports_rejected",
            "Agent reports that became unusable (not JSON or out of bounds), by reason; the agent counts as not ready until it writes a valid one",
            agent_reports_rejected.clone(),
        );
        // 1 ms .. ~16 s.
        let reconcile_duration = Histogram::new(exponential_buckets(0.001, 2.0, 15));
        registry.register(
            "reconcile_duration_seconds",
            "Time spent in one reconcile",
            reconcile_duration.clone(),
        );
        let services_planned = Counter::default();
        registry.register(
            "reconcile_services_planned",
            "Services planned, summed over reconcile passes: a pass after a change plans what that change can affect, a full pass (first of a leadership term, relist) every Service",
            services_planned.clone(),
        );
        let config_valid = Gauge::default();
        registry.register(
            "config_valid",
            "1 when the pool ConfigMap as currently written is valid and in force, else 0 (invalid, or deleted after a config was in force)",
            config_valid.clone(),
        );
        let config_stale = Gauge::default();
        registry.register(
            "config_stale",
            "1 when the controller runs on an older, last good pool config because the current one is invalid or the ConfigMap was deleted",
            config_stale.clone(),
        );
        let leader = Gauge::default();
        registry.register(
            "leader",
            "1 when this replica is the leader and may write, else 0",
            leader.clone(),
        );
        let agents_unobservable = Gauge::default();
        registry.register(
            "agents_unobservable",
            "1 while the leader sees no agent Lease renewed within its lease duration and takes it that it cannot see the agents, not that every node is lost: every node keeps what it carries, no node is elected; else 0",
            agents_unobservable.clone(),
        );
        let agents_unsupported_version = Gauge::default();
        registry.register(
            "agents_unsupported_version",
            "Agents whose release the leader does not support (an older release line, more than one line ahead, or no or an unreadable version on their Lease): upgrade the agents first, then the controller",
            agents_unsupported_version.clone(),
        );
        let agents_ready = Gauge::default();
        registry.register(
            "agents_ready",
            "Nodes whose agent is ready as the leader sees it: its Lease renewed within its lease duration, with a valid report",
            agents_ready.clone(),
        );
        let writes_failing = Family::<ObjectLabels, Gauge>::default();
        registry.register(
            "writes_failing",
            "Objects whose last write failed and has not succeeded since (retried with backoff, or refused until it changes), by object: service (status, annotations), node_assignment (the ConfigMaps agents act on)",
            writes_failing.clone(),
        );
        let agent_leases_ignored = Gauge::default();
        registry.register(
            "agent_leases_ignored",
            "Agent Leases (aliaslb-agent-<node>) whose Node does not exist: ignored, only nodes are agents (not read; a compromised node may write them where the admission policy aliaslb-agent-own-lease is off)",
            agent_leases_ignored.clone(),
        );
        let address_conflicts = Gauge::default();
        registry.register(
            "controller_address_conflicts",
            "Pool addresses withheld because a fresh agent reports them answered on the LAN by a host outside the cluster (a foreign MAC): not allocated until no agent reports the conflict",
            address_conflicts.clone(),
        );
        Metrics {
            registry,
            pool_size,
            pool_in_use,
            pool_quarantined,
            pool_draining,
            pending,
            pending_by_reason,
            unannounced,
            pending_age,
            unannounced_age,
            create_to_ip,
            failovers,
            failover_duration,
            renewal_age,
            agents: OnceLock::new(),
            allocations,
            releases,
            reconcile_errors,
            agent_reports_rejected,
            reconcile_duration,
            services_planned,
            config_valid,
            config_stale,
            leader,
            agents_unobservable,
            agents_unsupported_version,
            agents_ready,
            writes_failing,
            address_conflicts,
            agent_leases_ignored,
        }
    }

    /// Record the size and use of one pool key and family, and how many of the addresses in
    /// use are quarantined.
    pub fn set_pool(
        &self,
        pool: &str,
        family: IpFamily,
        size: u128,
        in_use: u64,
        quarantined: u64,
    ) {
        let labels = PoolLabels {
            pool: pool.to_owned(),
            family: family_label(family),
        };
        // Precision loss above 2^53 is fine for a gauge.
        #[allow(clippy::cast_precision_loss)]
        self.pool_size.get_or_create(&labels).set(size as f64);
        self.pool_in_use
            .get_or_create(&labels)
            .set(i64::try_from(in_use).unwrap_or(i64::MAX));
        self.pool_quarantined
            .get_or_create(&labels)
            .set(i64::try_from(quarantined).unwrap_or(i64::MAX));
        // The series exists with its pool (0 until set_pool_draining says otherwise): a
        // rule that leaves draining pools out must not lose the others for lack of it.
        let _ = self.pool_draining.get_or_create(&labels);
    }

    /// Forget a pool key that left the config, so its series disappear.
    pub fn remove_pool(&self, pool: &str, family: IpFamily) {
        let labels = PoolLabels {
            pool: pool.to_owned(),
            family: family_label(family),
        };
        self.pool_size.remove(&labels);
        self.pool_in_use.remove(&labels);
        self.pool_quarantined.remove(&labels);
        self.pool_draining.remove(&labels);
    }

    /// Record how many of a pool key and family's addresses in use are draining.
    pub fn set_pool_draining(&self, pool: &str, family: IpFamily, draining: u128) {
        let labels = PoolLabels {
            pool: pool.to_owned(),
            family: family_label(family),
        };
        self.pool_draining
            .get_or_create(&labels)
            .set(i64::try_from(draining).unwrap_or(i64::MAX));
    }

    /// Set the number of Services waiting for an IP.
    pub fn set_pending(&self, services: usize) {
        self.pending
            .set(i64::try_from(services).unwrap_or(i64::MAX));
    }

    /// Set the pending Services by reason; reasons left out disappear.
    pub fn set_pending_by_reason(&self, reasons: &BTreeMap<&'static str, usize>) {
        self.pending_by_reason.set(
            reasons
                .iter()
                .map(|(reason, n)| (ReasonLabels { reason }, *n)),
            |g, n| {
                g.set(i64::try_from(n).unwrap_or(i64::MAX));
            },
        );
    }

    /// Set the Services with IPs not announced, by (pool, Announced reason); those left out
    /// disappear.
    pub fn set_unannounced(&self, counts: BTreeMap<(String, &'static str), usize>) {
        self.unannounced.set(
            counts
                .into_iter()
                .map(|((pool, reason), n)| (PoolReasonLabels { pool, reason }, n)),
            |g, n| {
                g.set(i64::try_from(n).unwrap_or(i64::MAX));
            },
        );
    }

    /// Since when the longest-pending Service of each (namespace, pool, reason) has been
    /// pending; those left out disappear. Their ages are computed at every encode.
    pub fn set_pending_since(&self, since: BTreeMap<(String, String, &'static str), Instant>) {
        self.pending_age.set(since);
    }

    /// Since when the longest-unannounced Service of each (namespace, pool, reason) has
    /// been unannounced; those left out disappear.
    pub fn set_unannounced_since(&self, since: BTreeMap<(String, String, &'static str), Instant>) {
        self.unannounced_age.set(since);
    }

    /// Record the time from a Service's creation to its first IP.
    pub fn observe_create_to_ip(&self, took: Duration) {
        self.create_to_ip.observe(took.as_secs_f64());
    }

    /// Count one failover that started.
    pub fn inc_failover(&self, cause: Cause) {
        self.failovers
            .get_or_create(&CauseLabels {
                cause: cause.label(),
            })
            .inc();
    }

    /// Record how long one failover took.
    pub fn observe_failover(&self, cause: Cause, took: Duration) {
        self.failover_duration
            .get_or_create(&CauseLabels {
                cause: cause.label(),
            })
            .observe(took.as_secs_f64());
    }

    /// Report the age of every agent's last renewal at every [`encode`](Self::encode), from
    /// `clock` (the first given is kept).
    pub fn track_agents(&self, clock: Arc<Mutex<AgentClock>>) {
        let _ = self.agents.set(clock);
    }

    /// Count one IP allocated.
    pub fn inc_allocations(&self) {
        self.allocations.inc();
    }

    /// Count one IP released.
    pub fn inc_releases(&self) {
        self.releases.inc();
    }

    /// Count one failed reconcile under its short stable `category`.
    pub fn inc_reconcile_error(&self, category: &str) {
        self.reconcile_errors
            .get_or_create(&ErrorLabels {
                category: category.to_owned(),
            })
            .inc();
    }

    /// Count one agent report that became unusable, under its `reason` category.
    pub fn inc_agent_report_rejected(&self, reason: &'static str) {
        self.agent_reports_rejected
            .get_or_create(&RejectedLabels { reason })
            .inc();
    }

    /// Record how long one reconcile took.
    pub fn observe_reconcile(&self, took: Duration) {
        self.reconcile_duration.observe(took.as_secs_f64());
    }

    /// Count the Services one pass planned.
    pub fn add_services_planned(&self, services: usize) {
        self.services_planned
            .inc_by(u64::try_from(services).unwrap_or(u64::MAX));
    }

    /// Record whether the current pool config is valid and whether an older one is in use.
    pub fn set_config(&self, valid: bool, stale: bool) {
        self.config_valid.set(i64::from(valid));
        self.config_stale.set(i64::from(stale));
    }

    /// Record whether this replica leads.
    pub fn set_leader(&self, leader: bool) {
        self.leader.set(i64::from(leader));
    }

    /// Record whether the leader cannot see any agent renewing (blind).
    pub fn set_agents_unobservable(&self, blind: bool) {
        self.agents_unobservable.set(i64::from(blind));
    }

    /// Set the number of agents whose release the leader does not support.
    pub fn set_agents_unsupported_version(&self, agents: usize) {
        self.agents_unsupported_version
            .set(i64::try_from(agents).unwrap_or(i64::MAX));
    }

    /// Set the number of nodes whose agent is ready.
    pub fn set_agents_ready(&self, ready: usize) {
        self.agents_ready
            .set(i64::try_from(ready).unwrap_or(i64::MAX));
    }

    /// Set the number of Services and node assignments whose last write failed.
    pub fn set_writes_failing(&self, services: usize, node_assignments: usize) {
        for (object, n) in [("service", services), ("node_assignment", node_assignments)] {
            self.writes_failing
                .get_or_create(&ObjectLabels { object })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    /// Set the number of agent Leases whose Node does not exist (ignored).
    pub fn set_agent_leases_ignored(&self, ghosts: usize) {
        self.agent_leases_ignored
            .set(i64::try_from(ghosts).unwrap_or(i64::MAX));
    }

    /// Set the number of addresses withheld by a LAN conflict.
    pub fn set_address_conflicts(&self, withheld: usize) {
        self.address_conflicts
            .set(i64::try_from(withheld).unwrap_or(i64::MAX));
    }

    /// Every metric in the OpenMetrics text format (`aliaslb_ops::metrics::CONTENT_TYPE`).
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let now = Instant::now();
        self.pending_age.publish(now);
        self.unannounced_age.publish(now);
        if let Some(clock) = self.agents.get() {
            let ages: Vec<(NodeLabels, f64)> = {
                let clock = clock.lock().unwrap_or_else(|e| e.into_inner());
                clock
                    .renewal_ages(now)
                    .map(|(node, age)| {
                        (
                            NodeLabels {
                                node: node.to_owned(),
                            },
                            age.as_secs_f64(),
                        )
                    })
                    .collect()
            };
            self.renewal_age.set(ages, |g, age| {
                g.set(age);
            });
        }
        aliaslb_ops::metrics::encode(&self.registry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_draining_pool_counts_what_is_left_to_move_and_goes_with_its_pool() {
        let m = Metrics::new();
        m.set_pool("old", IpFamily::V4, 3, 3, 0);
        m.set_pool_draining("old", IpFamily::V4, 2);
        let text = m.encode().unwrap();
        assert!(
            text.contains("aliaslb_pool_addresses_draining{pool=\"old\",family=\"ipv4\"} 2"),
            "{text}"
        );
        m.remove_pool("old", IpFamily::V4);
        assert!(!m.encode().unwrap().contains("pool=\"old\""));
    }

    #[test]
    fn encodes_every_metric_with_prefix() {
        let m = Metrics::new();
        m.set_pool("team-a", IpFamily::V4, 256, 3, 1);
        m.set_pool("team-a", IpFamily::V6, 1 << 64, 1, 0);
        m.set_pending(2);
        m.set_pending_by_reason(&BTreeMap::from([("PoolExhausted", 1), ("NoPool", 1)]));
        m.set_unannounced(BTreeMap::from([(
            ("team-a".to_owned(), "PartiallyAnnounced"),
            2,
        )]));
        m.observe_create_to_ip(Duration::from_millis(700));
        m.inc_failover(Cause::Hard);
        m.observe_failover(Cause::Hard, Duration::from_secs(1));
        m.inc_allocations();
        m.inc_releases();
        m.inc_reconcile_error("pool_exhausted");
        m.inc_agent_report_rejected("interface_name");
        m.observe_reconcile(Duration::from_millis(3));
        m.add_services_planned(7);
        m.set_config(true, false);
        m.set_leader(true);
        m.set_agents_unobservable(true);
        m.set_agents_unsupported_version(3);
        m.set_agents_ready(3);
        m.set_writes_failing(1, 0);
        m.set_address_conflicts(2);
        m.set_agent_leases_ignored(3);
        let text = m.encode().unwrap();
        for want in [
            r#"aliaslb_pool_addresses{pool="team-a",family="ipv4"} 256.0"#,
            r#"aliaslb_pool_addresses{pool="team-a",family="ipv6"} 18446744073709553000.0"#,
            r#"aliaslb_pool_addresses_in_use{pool="team-a",family="ipv4"} 3"#,
            r#"aliaslb_pool_addresses_quarantined{pool="team-a",family="ipv4"} 1"#,
            r#"aliaslb_pool_addresses_quarantined{pool="team-a",family="ipv6"} 0"#,
            "aliaslb_services_pending 2",
            r#"aliaslb_services_pending_by_reason{reason="PoolExhausted"} 1"#,
            r#"aliaslb_services_pending_by_reason{reason="NoPool"} 1"#,
            r#"aliaslb_services_unannounced{pool="team-a",reason="PartiallyAnnounced"} 2"#,
            r#"aliaslb_service_create_to_ip_seconds_bucket{le="1.0"} 1"#,
            "aliaslb_service_create_to_ip_seconds_count 1",
            r#"aliaslb_failovers_total{cause="hard"} 1"#,
            r#"aliaslb_failover_duration_seconds_bucket{le="1.6",cause="hard"} 1"#,
            r#"aliaslb_failover_duration_seconds_count{cause="hard"} 1"#,
            "aliaslb_allocations_total 1",
            "aliaslb_releases_total 1",
            r#"aliaslb_reconcile_errors_total{category="pool_exhausted"} 1"#,
            r#"aliaslb_agent_reports_rejected_total{reason="interface_name"} 1"#,
            "aliaslb_reconcile_duration_seconds_count 1",
            "aliaslb_reconcile_services_planned_total 7",
            "aliaslb_config_valid 1",
            "aliaslb_config_stale 0",
            "aliaslb_leader 1",
            "aliaslb_agents_unobservable 1",
            "aliaslb_agents_unsupported_version 3",
            "aliaslb_agents_ready 3",
            r#"aliaslb_writes_failing{object="service"} 1"#,
            r#"aliaslb_writes_failing{object="node_assignment"} 0"#,
            "aliaslb_controller_address_conflicts 2",
            "aliaslb_agent_leases_ignored 3",
            "# EOF",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
    }

    #[test]
    fn removed_pools_disappear() {
        let m = Metrics::new();
        m.set_pool("gone", IpFamily::V4, 4, 0, 0);
        m.remove_pool("gone", IpFamily::V4);
        assert!(!m.encode().unwrap().contains("gone"));
    }

    #[test]
    fn replaced_series_come_and_go_without_touching_the_others() {
        let m = Metrics::new();
        m.set_pending_by_reason(&BTreeMap::from([("PoolExhausted", 2), ("NoPool", 1)]));
        m.set_pending_by_reason(&BTreeMap::from([("PoolExhausted", 3)]));
        let text = m.encode().unwrap();
        assert!(
            text.contains(r#"aliaslb_services_pending_by_reason{reason="PoolExhausted"} 3"#),
            "{text}"
        );
        assert!(!text.contains(r#"reason="NoPool""#), "{text}");
    }

    #[test]
    fn waiting_ages_grow_between_passes_and_go_with_their_services() {
        let m = Metrics::new();
        let since = Instant::now() - Duration::from_secs(90);
        let key = |reason| ("ns-a".to_owned(), "team-a".to_owned(), reason);
        m.set_pending_since(BTreeMap::from([(key("PoolExhausted"), since)]));
        m.set_unannounced_since(BTreeMap::from([(key("NoEligibleNode"), since)]));
        let age = |text: &str, series: &str| -> f64 {
            text.lines()
                .find_map(|l| l.strip_prefix(series))
                .unwrap_or_else(|| panic!("no {series} in\n{text}"))
                .trim()
                .parse()
                .unwrap()
        };
        let pending = r#"aliaslb_services_pending_seconds{namespace="ns-a",pool="team-a",reason="PoolExhausted"}"#;
        let dark = r#"aliaslb_services_unannounced_seconds{namespace="ns-a",pool="team-a",reason="NoEligibleNode"}"#;
        let first = m.encode().unwrap();
        assert!(age(&first, pending) >= 90.0, "{first}");
        assert!(age(&first, dark) >= 90.0, "{first}");
        std::thread::sleep(Duration::from_millis(20));
        let later = m.encode().unwrap();
        assert!(
            age(&later, pending) > age(&first, pending),
            "no pass in between, and still older:\n{first}\n{later}"
        );
        m.set_pending_since(BTreeMap::new());
        let text = m.encode().unwrap();
        assert!(
            !text.contains("aliaslb_services_pending_seconds{"),
            "{text}"
        );
        assert!(text.contains(dark), "{text}");
    }

    #[test]
    fn agent_renewal_ages_are_read_at_encode_time() {
        use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
        let lease = |node: &str| Lease {
            metadata: ObjectMeta {
                name: Some(aliaslb_core::keys::agent_lease_name(node)),
                resource_version: Some("1".into()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(node.into()),
                ..LeaseSpec::default()
            }),
        };
        let m = Metrics::new();
        let clock = Arc::new(Mutex::new(AgentClock::new(Duration::from_secs(4))));
        clock.lock().unwrap().observe(&lease("n1"), Instant::now());
        m.track_agents(clock.clone());
        let text = m.encode().unwrap();
        let line = text
            .lines()
            .find(|l| l.starts_with(r#"aliaslb_node_agent_renewal_age_seconds{node="n1"}"#))
            .unwrap_or_else(|| panic!("no age of n1 in\n{text}"));
        let age: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
        assert!(age > 0.0 && age < 30.0, "computed at encode time: {line}");
        // A deleted Lease keeps its age while the clock keeps it (absence is no evidence
        // of death: see observe::agents); a released one (no holder) is not shown.
        clock
            .lock()
            .unwrap()
            .remove(&aliaslb_core::keys::agent_lease_name("n1"));
        assert!(m.encode().unwrap().contains(r#"node="n1""#));
        let mut released = lease("n1");
        released.metadata.resource_version = Some("2".into());
        released.spec.as_mut().unwrap().holder_identity = None;
        clock.lock().unwrap().observe(&released, Instant::now());
        assert!(!m.encode().unwrap().contains(r#"node="n1""#));
    }
}
