//! The agent's Prometheus metrics: one registry, typed handles, text encoding.
//!
//! No I/O: `http` serves [`Metrics::encode`]. Every name is prefixed `aliaslb_agent_`.

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::l2::announce::Announcer;
use crate::l2::lan::LanWatch;
use crate::shield::Dropped;
use aliaslb_core::report::ShieldState;

/// Labels of the per-interface gauge.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct InterfaceLabels {
    /// Interface name.
    interface: String,
}

/// Labels of the netlink error counter.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct OperationLabels {
    /// What was asked of the kernel: `add`, `delete`, `refresh`, `dump addresses`...
    operation: String,
}

/// Labels of the fast-failover counters.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ResultLabels {
    /// What happened.
    result: &'static str,
}

/// Labels of the shield's drop counter.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct FamilyLabels {
    /// `ipv4` or `ipv6`.
    family: &'static str,
}

/// Labels of the shield's state gauge.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct StateLabels {
    /// `active`, `failing`, `off` (`ShieldState::as_str`).
    state: &'static str,
}

/// Labels of the routing daemon gauge.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct DaemonLabels {
    /// `bird` or `frr`.
    daemon: &'static str,
}

/// Labels of the probe counter.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct OutcomeLabels {
    /// `free`, `taken` or `failed`.
    outcome: &'static str,
}

/// What one LAN probe of an IP found, for [`Metrics::inc_probe`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeMetric {
    /// Nobody answered.
    Free,
    /// Another host answered.
    Taken,
    /// The probe could not be sent or listened for.
    Failed,
}

/// The agent's metrics. Shared behind an `Arc`; every method takes `&self`.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    held: Family<InterfaceLabels, Gauge>,
    desired: Gauge,
    conflicts: Gauge,
    adds: Counter,
    removes: Counter,
    repairs: Counter,
    announcements: Counter,
    announcement_failures: Counter,
    netlink_errors: Family<OperationLabels, Counter>,
    netlink_timeouts: Family<OperationLabels, Counter>,
    renew_failures: Counter,
    renewals_gated: Counter,
    api_reachable: Gauge,
    authority_fresh: Gauge,
    routed_withdrawn: Gauge,
    kube_proxy_ipvs: Gauge,
    lan_conflicts: Gauge,
    routing_daemon_up: Gauge,
    routing_daemon_info: Family<DaemonLabels, Gauge>,
    bgp_sessions_established: Gauge,
    routes_exported: Gauge,
    yields: Counter,
    adverts_received: Family<ResultLabels, Counter>,
    adverts_sent: Counter,
    failovers: Family<ResultLabels, Counter>,
    defences: Counter,
    claims_elsewhere: Counter,
    probes: Family<OutcomeLabels, Counter>,
    reconcile_duration: Histogram,
    refresh_duration: Histogram,
    refresh_crowded: Gauge,
    shield_active: Gauge,
    shield_state: Family<StateLabels, Gauge>,
    shield_ips: Gauge,
    shield_sync_errors: Counter,
    shield_damaged: Counter,
    shield_dropped: Family<FamilyLabels, Counter>,
    /// The nftables counters at the last reading (they restart at 0 with a new table).
    shield_seen: [AtomicU64; 2],
    /// Read at every encode: its frames are sent by background tasks.
    announcer: OnceLock<Announcer>,
    lan_claims_dropped: Counter,
    /// Read at every encode: its threads count the claims they could not queue.
    lan: OnceLock<LanWatch>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// A fresh registry with every metric registered.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("aliaslb_agent");
        let held = Family::<InterfaceLabels, Gauge>::default();
        registry.register(
            "addresses",
            "Load-balancer addresses held as aliases, by interface",
            held.clone(),
        );
        let desired = Gauge::default();
        registry.register(
            "desired_addresses",
            "Addresses the controller assigned to this node",
            desired.clone(),
        );
        let conflicts = Gauge::default();
        registry.register(
            "conflicts",
            "Assigned addresses not taken because another owner holds them on this node",
            conflicts.clone(),
        );
        let adds = Counter::default();
        registry.register("address_adds", "Aliases put on the node", adds.clone());
        let removes = Counter::default();
        registry.register(
            "address_removes",
            "Aliases removed from the node",
            removes.clone(),
        );
        let repairs = Counter::default();
        registry.register(
            "repairs",
            "Held aliases that disappeared (deleted by someone else) and were put back",
            repairs.clone(),
        );
        let announcements = Counter::default();
        registry.register(
            "announcements",
            "Gratuitous ARP and unsolicited neighbour advertisement frames sent",
            announcements.clone(),
        );
        let announcement_failures = Counter::default();
        registry.register(
            "announcement_failures",
            "Announcement frames that could not be sent",
            announcement_failures.clone(),
        );
        let lan_claims_dropped = Counter::default();
        registry.register(
            "lan_claims_dropped",
            "ARP/NDP claims seen on the LAN and dropped because the loop's queue was full (a host flooding the LAN)",
            lan_claims_dropped.clone(),
        );
        let netlink_errors = Family::<OperationLabels, Counter>::default();
        registry.register(
            "netlink_errors",
            "Failed kernel requests, by operation",
            netlink_errors.clone(),
        );
        let netlink_timeouts = Family::<OperationLabels, Counter>::default();
        registry.register(
            "netlink_timeouts",
            "Kernel requests that got no answer within the request timeout, by operation (also counted as errors)",
            netlink_timeouts.clone(),
        );
        let renewals_gated = Counter::default();
        registry.register(
            "lease_renewals_gated",
            "Lease renewals skipped because the alias loop's last kernel round is too old for the held aliases to still exist",
            renewals_gated.clone(),
        );
        let authority_fresh = Gauge::default();
        registry.register(
            "authority_fresh",
            "1 while this agent's Lease was renewed within the lease duration (it defends its IPs), 0 when stale (it yields them to another node)",
            authority_fresh.clone(),
        );
        let routed_withdrawn = Gauge::default();
        registry.register(
            "routed_withdrawn",
            "Routed (L3) addresses assigned to this node but withdrawn because its authority has been stale for a lease duration (cut off from the API: the controller may have given them to other Services)",
            routed_withdrawn.clone(),
        );
        let kube_proxy_ipvs = Gauge::default();
        registry.register(
            "kube_proxy_ipvs",
            "1 while the node has a kube-ipvs0 link: kube-proxy in IPVS mode, which aliaslb does not support (kube-proxy binds every LB IP to kube-ipvs0, so this agent sees them as another owner's)",
            kube_proxy_ipvs.clone(),
        );
        let lan_conflicts = Gauge::default();
        registry.register(
            "lan_conflicts",
            "Addresses another host on the LAN answered for or claimed, as reported on the Lease",
            lan_conflicts.clone(),
        );
        let routing_daemon_up = Gauge::default();
        registry.register(
            "routing_daemon_up",
            "L3 mode: 1 when the last reading of the node's routing daemon (--routing-daemon) succeeded, 0 when it failed",
            routing_daemon_up.clone(),
        );
        let routing_daemon_info = Family::<DaemonLabels, Gauge>::default();
        registry.register(
            "routing_daemon_info",
            "L3 mode: 1, labelled with the routing daemon the agent reads (--routing-daemon); no series in L2 mode",
            routing_daemon_info.clone(),
        );
        let bgp_sessions_established = Gauge::default();
        registry.register(
            "bgp_sessions_established",
            "L3 mode: BGP sessions of the node's routing daemon in state Established, at the last reading",
            bgp_sessions_established.clone(),
        );
        let routes_exported = Gauge::default();
        registry.register(
            "routes_exported",
            "L3 mode: host routes the node's routing daemon exports to at least one Established peer, at the last reading",
            routes_exported.clone(),
        );
        let yields = Counter::default();
        registry.register(
            "yields",
            "Held addresses given up because another node claimed them while this agent's Lease was stale",
            yields.clone(),
        );
        let adverts_received = Family::<ResultLabels, Counter>::default();
        registry.register(
            "adverts_received",
            "Fast L2 failover: adverts and acks received, by result (accepted; ack: an ack of a standby or relay; replayed: a counter not above the last one from that sender; not_for_me; invalid: not an advert or a MAC that does not verify; no_key)",
            adverts_received.clone(),
        );
        let adverts_sent = Counter::default();
        registry.register(
            "adverts_sent",
            "Fast L2 failover: adverts sent to the standbys of the IPs held",
            adverts_sent.clone(),
        );
        let failovers = Family::<ResultLabels, Counter>::default();
        registry.register(
            "failovers",
            "Fast L2 failover on the standby: taken_over (holder silent, nobody answered the LAN check), still_answered (holder silent, but the IP still answered: not taken), given_back (the holder spoke for an IP taken over); on the holder: stepped_down (neither standby nor relay acked its adverts for 2 intervals and the standby's node did not answer a LAN probe: the alias goes), standby_answers (no acks, but the standby's node answers a LAN probe: kept), lifted (they ack again: held again), retaken (no evidence in the API that the standby took it: held again)",
            failovers.clone(),
        );
        let defences = Counter::default();
        registry.register(
            "defences",
            "Announcements sent to defend a held address another host (node or not) claimed while this agent's Lease was fresh (at most one per 10 s per address)",
            defences.clone(),
        );
        let claims_elsewhere = Counter::default();
        registry.register(
            "lan_claims_elsewhere",
            "Claims of a held or probed address heard on another link than the address's own (a pod veth, a CNI bridge, another NIC): ignored",
            claims_elsewhere.clone(),
        );
        let probes = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "probes",
            "Addresses probed on the LAN before a first claim or a re-claim, by outcome",
            probes.clone(),
        );
        let renew_failures = Counter::default();
        registry.register(
            "lease_renew_failures",
            "Lease writes (renewals and report updates) that failed",
            renew_failures.clone(),
        );
        let api_reachable = Gauge::default();
        registry.register(
            "api_reachable",
            "1 when the last Lease write reached the API server, else 0",
            api_reachable.clone(),
        );
        // 100 µs .. ~3 s.
        let reconcile_duration = Histogram::new(exponential_buckets(0.0001, 2.0, 15));
        registry.register(
            "reconcile_duration_seconds",
            "Time spent in one alias reconcile (dump, diff, writes)",
            reconcile_duration.clone(),
        );
        // 1 ms .. ~16 s: a round of 10,000 takes about a second.
        let refresh_duration = Histogram::new(exponential_buckets(0.001, 2.0, 15));
        registry.register(
            "refresh_duration_seconds",
            "Time spent refreshing the lifetime of every alias held (one round)",
            refresh_duration.clone(),
        );
        let refresh_crowded = Gauge::default();
        registry.register(
            "refresh_crowded",
            "1 when the last lifetime refresh took more than half the refresh interval (a sixth of --alias-lifetime): raise --alias-lifetime",
            refresh_crowded.clone(),
        );
        let shield_active = Gauge::default();
        registry.register(
            "shield_active",
            "1 when the host-port shield guards every held address, 0 when off or failing",
            shield_active.clone(),
        );
        let shield_damaged = Counter::default();
        registry.register(
            "shield_tables_damaged",
            "Times the host-port shield's nftables table was found deleted or altered by someone else (then rewritten)",
            shield_damaged.clone(),
        );
        let shield_state = Family::<StateLabels, Gauge>::default();
        registry.register(
            "shield_state",
            "The host-port shield's state: 1 for the current one of active, failing (the last table write failed, or the table was found deleted or altered, until it is rewritten), off (--host-port-shield=off), 0 for the others",
            shield_state.clone(),
        );
        let shield_ips = Gauge::default();
        registry.register(
            "shield_addresses",
            "Addresses in the host-port shield's nftables table",
            shield_ips.clone(),
        );
        let shield_sync_errors = Counter::default();
        registry.register(
            "shield_sync_errors",
            "Writes of the host-port shield's nftables table that failed",
            shield_sync_errors.clone(),
        );
        let shield_dropped = Family::<FamilyLabels, Counter>::default();
        registry.register(
            "shield_dropped_packets",
            "Packets addressed to a load-balancer IP dropped by the host-port shield (not a Service port), by family",
            shield_dropped.clone(),
        );
        Metrics {
            registry,
            held,
            desired,
            conflicts,
            adds,
            removes,
            repairs,
            announcements,
            announcement_failures,
            netlink_errors,
            netlink_timeouts,
            renew_failures,
            renewals_gated,
            api_reachable,
            authority_fresh,
            routed_withdrawn,
            kube_proxy_ipvs,
            lan_conflicts,
            routing_daemon_up,
            routing_daemon_info,
            bgp_sessions_established,
            routes_exported,
            yields,
            adverts_received,
            adverts_sent,
            failovers,
            defences,
            claims_elsewhere,
            probes,
            reconcile_duration,
            refresh_duration,
            refresh_crowded,
            shield_active,
            shield_state,
            shield_ips,
            shield_sync_errors,
            shield_damaged,
            shield_dropped,
            shield_seen: [AtomicU64::new(0), AtomicU64::new(0)],
            announcer: OnceLock::new(),
            lan_claims_dropped,
            lan: OnceLock::new(),
        }
    }

    /// Report `lan`'s dropped claims at every [`encode`](Self::encode) (the first given is
    /// kept).
    pub fn track_lan(&self, lan: LanWatch) {
        let _ = self.lan.set(lan);
    }

    /// Report `announcer`'s frame counts at every [`encode`](Self::encode) (the first
    /// announcer given is kept).
    pub fn track_announcer(&self, announcer: Announcer) {
        let _ = self.announcer.set(announcer);
    }

    /// Record the aliases held, as (interface, count); interfaces left out drop to no series.
    pub fn set_held<'a>(&self, interfaces: impl IntoIterator<Item = &'a str>) {
        let mut counts: BTreeMap<&str, i64> = BTreeMap::new();
        for name in interfaces {
            *counts.entry(name).or_default() += 1;
        }
        self.held.clear();
        for (interface, n) in counts {
            self.held
                .get_or_create(&InterfaceLabels {
                    interface: interface.to_owned(),
                })
                .set(n);
        }
    }

    /// Record the sizes of the desired set and of the conflict list.
    pub fn set_desired(&self, desired: usize, conflicts: usize) {
        self.desired.set(i64::try_from(desired).unwrap_or(i64::MAX));
        self.conflicts
            .set(i64::try_from(conflicts).unwrap_or(i64::MAX));
    }

    /// Count one reconcile's outcome: aliases added, removed, and repaired (re-added after
    /// someone else deleted them).
    pub fn record_reconcile(&self, added: usize, removed: usize, repaired: usize, took: Duration) {
        self.adds.inc_by(added as u64);
        self.removes.inc_by(removed as u64);
        self.repairs.inc_by(repaired as u64);
        self.reconcile_duration.observe(took.as_secs_f64());
    }

    /// Records one lifetime refresh round: how long it took, and whether that crowds the
    /// refresh interval ([`crate::aliases::refresh_crowded`]).
    pub fn record_refresh(&self, took: Duration, crowded: bool) {
        self.refresh_duration.observe(took.as_secs_f64());
        self.refresh_crowded.set(i64::from(crowded));
    }

    /// Count one failed kernel request under its `operation`.
    pub fn inc_netlink_error(&self, operation: &str) {
        self.netlink_errors
            .get_or_create(&OperationLabels {
                operation: operation.to_owned(),
            })
            .inc();
    }

    /// Count one kernel request that timed out under its `operation`.
    pub fn inc_netlink_timeout(&self, operation: &str) {
        self.netlink_timeouts
            .get_or_create(&OperationLabels {
                operation: operation.to_owned(),
            })
            .inc();
    }

    /// Count one renewal skipped because the kernel rounds are too old.
    pub fn record_renewal_gated(&self) {
        self.renewals_gated.inc();
    }

    /// Record how many routed addresses the L3 fence withdraws.
    pub fn set_routed_withdrawn(&self, count: usize) {
        self.routed_withdrawn
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    /// Record whether this agent's authority is fresh.
    pub fn set_authority_fresh(&self, fresh: bool) {
        self.authority_fresh.set(i64::from(fresh));
    }

    /// Whether the node has a `kube-ipvs0` link (kube-proxy in IPVS mode, unsupported).
    pub fn set_kube_proxy_ipvs(&self, ipvs: bool) {
        self.kube_proxy_ipvs.set(i64::from(ipvs));
    }

    /// Record the number of LAN conflicts reported.
    pub fn set_lan_conflicts(&self, n: usize) {
        self.lan_conflicts.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// L3 mode: the last reading of the routing daemon `daemon`: whether it succeeded, its
    /// Established sessions and its exported host routes.
    pub fn set_routing(&self, daemon: &'static str, up: bool, established: u32, exported: usize) {
        self.routing_daemon_info
            .get_or_create(&DaemonLabels { daemon })
            .set(1);
        self.routing_daemon_up.set(i64::from(up));
        self.bgp_sessions_established.set(i64::from(established));
        self.routes_exported
            .set(i64::try_from(exported).unwrap_or(i64::MAX));
    }

    /// Count one yield.
    pub fn inc_yield(&self) {
        self.yields.inc();
    }

    /// Count one advert received, by result.
    pub fn inc_advert_received(&self, result: &'static str) {
        self.adverts_received
            .get_or_create(&ResultLabels { result })
            .inc();
    }

    /// Count `n` adverts sent.
    pub fn add_adverts_sent(&self, n: u64) {
        self.adverts_sent.inc_by(n);
    }

    /// Count one failover event on the standby, by result.
    pub fn inc_failover(&self, result: &'static str) {
        self.failovers.get_or_create(&ResultLabels { result }).inc();
    }

    /// Count one defence.
    pub fn inc_defence(&self) {
        self.defences.inc();
    }

    /// Count one claim heard on a link that is not its address's own (ignored).
    pub fn inc_claim_elsewhere(&self) {
        self.claims_elsewhere.inc();
    }

    /// Count one probed address by outcome.
    pub fn inc_probe(&self, outcome: ProbeMetric) {
        let outcome = match outcome {
            ProbeMetric::Free => "free",
            ProbeMetric::Taken => "taken",
            ProbeMetric::Failed => "failed",
        };
        self.probes.get_or_create(&OutcomeLabels { outcome }).inc();
    }

    /// Bring the announcement counters up to the announcer's totals since start.
    pub fn set_announcements(&self, sent: u64, failed: u64) {
        self.announcements
            .inc_by(sent.saturating_sub(self.announcements.get()));
        self.announcement_failures
            .inc_by(failed.saturating_sub(self.announcement_failures.get()));
    }

    /// Record one Lease write: reached the API server or not.
    pub fn record_renewal(&self, ok: bool) {
        if !ok {
            self.renew_failures.inc();
        }
        self.api_reachable.set(i64::from(ok));
    }

    /// Record the shield's state, its size, its failed writes and the damaged tables found
    /// since start.
    pub fn set_shield(&self, state: ShieldState, addresses: usize, errors: u64, damaged: u64) {
        self.shield_active
            .set(i64::from(state == ShieldState::Active));
        for each in [ShieldState::Active, ShieldState::Failing, ShieldState::Off] {
            self.shield_state
                .get_or_create(&StateLabels {
                    state: each.as_str(),
                })
                .set(i64::from(state == each));
        }
        self.shield_ips
            .set(i64::try_from(addresses).unwrap_or(i64::MAX));
        self.shield_sync_errors
            .inc_by(errors.saturating_sub(self.shield_sync_errors.get()));
        self.shield_damaged
            .inc_by(damaged.saturating_sub(self.shield_damaged.get()));
    }

    /// Bring the drop counters up to the table's counters; a table replaced since the last
    /// reading restarted them at 0, and all it counted since is new.
    pub fn set_shield_dropped(&self, dropped: Dropped) {
        for (i, (family, now)) in [("ipv4", dropped.v4), ("ipv6", dropped.v6)]
            .into_iter()
            .enumerate()
        {
            let before = self.shield_seen[i].swap(now, Ordering::Relaxed);
            let new = if now >= before { now - before } else { now };
            self.shield_dropped
                .get_or_create(&FamilyLabels { family })
                .inc_by(new);
        }
    }

    /// Every metric in the OpenMetrics text format (`aliaslb_ops::metrics::CONTENT_TYPE`).
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        if let Some(a) = self.announcer.get() {
            self.set_announcements(a.frames_sent(), a.frames_failed());
        }
        if let Some(lan) = self.lan.get() {
            let dropped = lan.claims_dropped();
            self.lan_claims_dropped
                .inc_by(dropped.saturating_sub(self.lan_claims_dropped.get()));
        }
        aliaslb_ops::metrics::encode(&self.registry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_every_metric_with_prefix() {
        let m = Metrics::new();
        m.set_held(["eth1", "eth1", "eth0"]);
        m.set_desired(4, 1);
        m.record_reconcile(3, 1, 1, Duration::from_millis(2));
        m.inc_netlink_error("add");
        m.set_announcements(6, 1);
        m.set_announcements(8, 1);
        m.record_renewal(false);
        m.record_renewal(false);
        m.set_shield(ShieldState::Active, 2, 1, 1);
        m.set_shield_dropped(Dropped { v4: 5, v6: 1 });
        // The table was replaced: its counters restarted.
        m.set_shield_dropped(Dropped { v4: 2, v6: 1 });
        m.inc_netlink_timeout("dump");
        m.record_renewal_gated();
        m.set_authority_fresh(true);
        m.set_kube_proxy_ipvs(true);
        m.set_lan_conflicts(3);
        m.set_routing("bird", true, 2, 5);
        m.inc_yield();
        m.inc_defence();
        m.inc_defence();
        m.inc_claim_elsewhere();
        m.inc_probe(ProbeMetric::Free);
        m.inc_probe(ProbeMetric::Taken);
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
        m.record_renewal(true);
        m.set_held(["eth0"]);
        m.set_shield(ShieldState::Failing, 2, 2, 0);
        // A tracked announcer is read at encode time: it sent nothing, the totals stay.
        m.track_announcer(Announcer::new(
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
        m.set_routing("bird", true, 1, 1);
        m.set_shield(ShieldState::Active, 0, 0, 0);
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
