//! The controller's Prometheus metrics: one registry, typed handles, text encoding.
//!
//! No I/O: `http` serves [`Metrics::encode`]. Every name is prefixed `aliaslb_`.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use aliaslb_core::range::Family as IpFamily;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

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
    pending: Gauge,
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
    address_conflicts: Gauge,
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
        let pending = Gauge::default();
        registry.register(
            "services_pending",
            "LoadBalancer Services handled by aliaslb that have no IP",
            pending.clone(),
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
        let address_conflicts = Gauge::default();
        registry.register(
            "controller_address_conflicts",
            "Pool addresses fenced because a fresh agent reports them answered on the LAN by a host outside the cluster (a foreign MAC): not allocated until no agent reports the conflict",
            address_conflicts.clone(),
        );
        Metrics {
            registry,
            pool_size,
            pool_in_use,
            pending,
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
            address_conflicts,
        }
    }

    /// Record the size and use of one pool key and family.
    pub fn set_pool(&self, pool: &str, family: IpFamily, size: u128, in_use: u64) {
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
    }

    /// Forget a pool key that left the config, so its series disappear.
    pub fn remove_pool(&self, pool: &str, family: IpFamily) {
        let labels = PoolLabels {
            pool: pool.to_owned(),
            family: family_label(family),
        };
        self.pool_size.remove(&labels);
        self.pool_in_use.remove(&labels);
    }

    /// Set the number of Services waiting for an IP.
    pub fn set_pending(&self, services: usize) {
        self.pending
            .set(i64::try_from(services).unwrap_or(i64::MAX));
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

    /// Set the number of addresses fenced by a LAN conflict.
    pub fn set_address_conflicts(&self, fenced: usize) {
        self.address_conflicts
            .set(i64::try_from(fenced).unwrap_or(i64::MAX));
    }

    /// Every metric in the OpenMetrics text format (`aliaslb_ops::metrics::CONTENT_TYPE`).
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        aliaslb_ops::metrics::encode(&self.registry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_every_metric_with_prefix() {
        let m = Metrics::new();
        m.set_pool("team-a", IpFamily::V4, 256, 3);
        m.set_pool("team-a", IpFamily::V6, 1 << 64, 1);
        m.set_pending(2);
        m.inc_allocations();
        m.inc_releases();
        m.inc_reconcile_error("pool_exhausted");
        m.inc_agent_report_rejected("interface_name");
        m.observe_reconcile(Duration::from_millis(3));
        m.add_services_planned(7);
        m.set_config(true, false);
        m.set_leader(true);
        m.set_agents_unobservable(true);
        m.set_address_conflicts(2);
        let text = m.encode().unwrap();
        for want in [
            r#"aliaslb_pool_addresses{pool="team-a",family="ipv4"} 256.0"#,
            r#"aliaslb_pool_addresses{pool="team-a",family="ipv6"} 18446744073709553000.0"#,
            r#"aliaslb_pool_addresses_in_use{pool="team-a",family="ipv4"} 3"#,
            "aliaslb_services_pending 2",
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
            "aliaslb_controller_address_conflicts 2",
            "# EOF",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
    }

    #[test]
    fn removed_pools_disappear() {
        let m = Metrics::new();
        m.set_pool("gone", IpFamily::V4, 4, 0);
        m.remove_pool("gone", IpFamily::V4);
        assert!(!m.encode().unwrap().contains("gone"));
    }
}
