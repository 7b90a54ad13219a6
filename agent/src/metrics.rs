//! The agent's metrics: one registry (prefix `aliaslb_agent`), in which each part of the
//! agent registers its own metrics, defined beside its code: the kernel side
//! ([`crate::aliases::metrics`]), the heartbeat ([`crate::heartbeat::metrics`]), the LAN
//! ([`crate::l2::metrics`]), fast failover ([`crate::l2::failover::metrics`]), L3 mode
//! ([`crate::l3::metrics`]), the host-port shield ([`crate::shield::metrics`]) and the
//! handovers of planned moves ([`crate::handover::metrics`]). Pure:
//! the HTTP server encodes it.

use prometheus_client::registry::Registry;

use crate::aliases::metrics::AliasMetrics;
use crate::handover::metrics::HandoverMetrics;
use crate::heartbeat::metrics::HeartbeatMetrics;
use crate::l2::failover::metrics::FailoverMetrics;
use crate::l2::metrics::LanMetrics;
use crate::l3::metrics::RoutingMetrics;
use crate::shield::metrics::ShieldMetrics;

/// The agent's metrics: the registry and every part's handles. Shared behind an `Arc`.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// The kernel side: aliases, writes, errors, reconcile and refresh times.
    pub kernel: AliasMetrics,
    /// The Lease heartbeat and the authority.
    pub heartbeat: HeartbeatMetrics,
    /// L2 on the LAN: announcements, claims, conflicts, probes.
    pub lan: LanMetrics,
    /// Fast L2 failover.
    pub failover: FailoverMetrics,
    /// L3 mode.
    pub routing: RoutingMetrics,
    /// The host-port shield.
    pub shield: ShieldMetrics,
    /// Planned moves keep established connections.
    pub handover: HandoverMetrics,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A fresh registry with every part's metrics registered.
    pub fn new() -> Self {
        let mut r = Registry::with_prefix("aliaslb_agent");
        Metrics {
            kernel: AliasMetrics::register(&mut r),
            lan: LanMetrics::register(&mut r),
            heartbeat: HeartbeatMetrics::register(&mut r),
            routing: RoutingMetrics::register(&mut r),
            failover: FailoverMetrics::register(&mut r),
            shield: ShieldMetrics::register(&mut r),
            handover: HandoverMetrics::register(&mut r),
            registry: r,
        }
    }

    /// Every metric in the OpenMetrics text format (`aliaslb_ops::metrics::CONTENT_TYPE`).
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        self.lan.collect();
        aliaslb_ops::metrics::encode(&self.registry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    use crate::l2::announce::Announcer;
    use crate::l2::metrics::ProbeMetric;
    use crate::shield::Dropped;
    use aliaslb_core::report::ShieldState;

    #[test]
    fn encodes_every_metric_with_prefix() {
        let m = Metrics::new();
        m.kernel.set_held(["eth1", "eth1", "eth0"]);
        m.kernel.set_desired(4, 1);
        m.kernel.record_reconcile(3, 1, 1, Duration::from_millis(2));
        m.kernel.inc_netlink_error("add", false);
        m.lan.set_announcements(6, 1);
        m.lan.set_announcements(8, 1);
        m.heartbeat.record_renewal(false);
        m.heartbeat.record_renewal(false);
        m.shield.set(ShieldState::Active, 2, 1, 1);
        m.shield.set_dropped(Dropped { v4: 5, v6: 1 });
        // The table was replaced: its counters restarted.
        m.shield.set_dropped(Dropped { v4: 2, v6: 1 });
        m.kernel.inc_netlink_error("dump", true);
        m.heartbeat.record_renewal_gated();
        m.heartbeat.set_authority_fresh(true);
        m.kernel.set_kube_proxy_ipvs(true);
        m.lan.set_conflicts(3);
        m.routing.set_routing("bird", true, 2, 5);
        m.lan.inc_yield();
        m.lan.inc_defence();
        m.lan.inc_defence();
        m.lan.inc_claim_elsewhere();
        m.lan.inc_probe(ProbeMetric::Free);
        m.lan.inc_probe(ProbeMetric::Taken);
        let text = m.encode().unwrap();
        for want in [
            r#"aliaslb_agent_addresses{interface="eth1"} 2"#,
            r#"aliaslb_agent_addresses{interface="eth0"} 1"#,
            "aliaslb_agent_desired_addresses 4",
            "aliaslb_agent_conflicts 1",
            "aliaslb_agent_address_adds_total 3",
            "aliaslb_agent_address_removes_total 1",
            "aliaslb_agent_repairs_total 1",
            r#"aliaslb_agent_netlink_errors_total{operation="add"} 1"#,
            "aliaslb_agent_announcements_total 8",
            "aliaslb_agent_announcement_failures_total 1",
            "aliaslb_agent_lease_renew_failures_total 2",
            "aliaslb_agent_api_reachable 0",
            "aliaslb_agent_reconcile_duration_seconds_count 1",
            "aliaslb_agent_shield_active 1",
            r#"aliaslb_agent_shield_state{state="active"} 1"#,
            r#"aliaslb_agent_shield_state{state="failing"} 0"#,
            r#"aliaslb_agent_shield_state{state="off"} 0"#,
            r#"aliaslb_agent_routing_daemon_info{daemon="bird"} 1"#,
            "aliaslb_agent_shield_addresses 2",
            "aliaslb_agent_shield_sync_errors_total 1",
            "aliaslb_agent_shield_tables_damaged_total 1",
            r#"aliaslb_agent_shield_dropped_packets_total{family="ipv4"} 7"#,
            r#"aliaslb_agent_shield_dropped_packets_total{family="ipv6"} 1"#,
            r#"aliaslb_agent_netlink_timeouts_total{operation="dump"} 1"#,
            "aliaslb_agent_lease_renewals_gated_total 1",
            "aliaslb_agent_authority_fresh 1",
            "aliaslb_agent_kube_proxy_ipvs 1",
            "aliaslb_agent_lan_conflicts 3",
            "aliaslb_agent_routing_daemon_up 1",
            "aliaslb_agent_bgp_sessions_established 2",
            "aliaslb_agent_routes_exported 5",
            "aliaslb_agent_yields_total 1",
            "aliaslb_agent_defences_total 2",
            "aliaslb_agent_lan_claims_elsewhere_total 1",
            r#"aliaslb_agent_probes_total{outcome="free"} 1"#,
            r#"aliaslb_agent_probes_total{outcome="taken"} 1"#,
            "# EOF",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
        m.heartbeat.record_renewal(true);
        m.kernel.set_held(["eth0"]);
        m.shield.set(ShieldState::Failing, 2, 2, 0);
        // A tracked announcer is read at encode time: it sent nothing, the totals stay.
        m.lan.track_announcer(Announcer::new(
            crate::l2::announce::AnnounceConfig::default(),
        ));
        let text = m.encode().unwrap();
        assert!(text.contains("aliaslb_agent_api_reachable 1"), "{text}");
        assert!(
            text.contains("aliaslb_agent_announcements_total 8"),
            "{text}"
        );
        assert!(!text.contains(r#"interface="eth1""#), "{text}");
        assert!(
            text.contains(r#"aliaslb_agent_shield_state{state="failing"} 1"#)
                && text.contains(r#"aliaslb_agent_shield_state{state="active"} 0"#),
            "{text}"
        );
    }

    /// Every agent metric the alert rules (`manifests/optional/monitoring/aliaslb.rules.yaml`)
    /// use is served: a rename breaks this test. (The controller's: controller/tests/alerts.rs.)
    #[test]
    fn every_agent_metric_the_alert_rules_use_is_registered() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../manifests/optional/monitoring/aliaslb.rules.yaml"
        );
        let rules = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let mut names = std::collections::BTreeSet::new();
        let mut rest = rules.as_str();
        while let Some(at) = rest.find("aliaslb_agent_") {
            let tail = &rest[at..];
            let end = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(tail.len());
            names.insert(&tail[..end]);
            rest = &tail[end..];
        }
        assert!(names.len() >= 4, "{names:?}");
        // A labelled family is in the text once it has a series.
        let m = Metrics::new();
        m.routing.set_routing("bird", true, 1, 1);
        m.shield.set(ShieldState::Active, 0, 0, 0);
        m.failover
            .set_standby(crate::l2::failover::standby::Coverage::default());
        let text = m.encode().unwrap();
        let typed = |name: &str, kind: &str| text.contains(&format!("# TYPE {name} {kind}\n"));
        for name in names {
            let served = typed(name, "gauge")
                || name
                    .strip_suffix("_total")
                    .is_some_and(|b| typed(b, "counter"))
                || ["_bucket", "_sum", "_count"]
                    .iter()
                    .any(|s| name.strip_suffix(s).is_some_and(|b| typed(b, "histogram")));
            assert!(
                served,
                "the alert rules use {name}, which the agent does not serve:\n{text}"
            );
        }
    }
}
