//! The kernel side's metrics: the aliases held and desired, the writes, the kernel's
//! errors and timeouts, the time a reconcile and a lifetime refresh take. Pure (counters
//! and gauges in memory), registered in the agent's one registry.

use std::collections::BTreeMap;
use std::time::Duration;

use aliaslb_ops::metrics::{count, registered, with};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Labels of the per-interface gauge.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct InterfaceLabels {
    /// Interface name.
    interface: String,
}

/// Labels of the netlink error counters.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct OperationLabels {
    /// What was asked of the kernel: `add`, `delete`, `refresh`, `dump addresses`...
    operation: String,
}

/// The kernel side's metrics (cheap to clone: handles).
#[derive(Debug, Clone)]
pub struct AliasMetrics {
    held: Family<InterfaceLabels, Gauge>,
    desired: Gauge,
    conflicts: Gauge,
    adds: Counter,
    removes: Counter,
    repairs: Counter,
    netlink_errors: Family<OperationLabels, Counter>,
    netlink_timeouts: Family<OperationLabels, Counter>,
    reconcile_duration: Histogram,
    refresh_duration: Histogram,
    refresh_crowded: Gauge,
    kube_proxy_ipvs: Gauge,
}

impl AliasMetrics {
    /// Registered in `r`.
    pub fn register(r: &mut Registry) -> Self {
        AliasMetrics {
            held: registered(
                r,
                "addresses",
                "Load-balancer addresses held as aliases, by interface",
            ),
            desired: registered(
                r,
                "desired_addresses",
                "Addresses the controller assigned to this node",
            ),
            conflicts: registered(
                r,
                "conflicts",
                "Assigned addresses not taken because another owner holds them on this node",
            ),
            adds: registered(r, "address_adds", "Aliases put on the node"),
            removes: registered(r, "address_removes", "Aliases removed from the node"),
            repairs: registered(
                r,
                "repairs",
                "Held aliases that disappeared (deleted by someone else) and were put back",
            ),
            netlink_errors: registered(r, "netlink_errors", "Failed kernel requests, by operation"),
            netlink_timeouts: registered(
                r,
                "netlink_timeouts",
                "Kernel requests that got no answer within the request timeout, by operation (also counted as errors)",
            ),
            // 100 µs .. ~3 s.
            reconcile_duration: with(
                r,
                "reconcile_duration_seconds",
                "Time spent in one alias reconcile (dump, diff, writes)",
                Histogram::new(exponential_buckets(0.0001, 2.0, 15)),
            ),
            // 1 ms .. ~16 s: a round of 10,000 takes about a second.
            refresh_duration: with(
                r,
                "refresh_duration_seconds",
                "Time spent refreshing the lifetime of every alias held (one round)",
                Histogram::new(exponential_buckets(0.001, 2.0, 15)),
            ),
            refresh_crowded: registered(
                r,
                "refresh_crowded",
                "1 when the last lifetime refresh took more than half the refresh interval (a sixth of --alias-lifetime): raise --alias-lifetime",
            ),
            kube_proxy_ipvs: registered(
                r,
                "kube_proxy_ipvs",
                "1 while the node has a kube-ipvs0 link: kube-proxy in IPVS mode, which aliaslb does not support (kube-proxy binds every LB IP to kube-ipvs0, so this agent sees them as another owner's)",
            ),
        }
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
        self.desired.set(count(desired));
        self.conflicts.set(count(conflicts));
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
    /// refresh interval ([`super::refresh_crowded`]).
    pub fn record_refresh(&self, took: Duration, crowded: bool) {
        self.refresh_duration.observe(took.as_secs_f64());
        self.refresh_crowded.set(i64::from(crowded));
    }

    /// Count one failed kernel request under its `operation`, and one timeout too if it
    /// got no answer.
    pub fn inc_netlink_error(&self, operation: &str, timeout: bool) {
        let labels = OperationLabels {
            operation: operation.to_owned(),
        };
        self.netlink_errors.get_or_create(&labels).inc();
        if timeout {
            self.netlink_timeouts.get_or_create(&labels).inc();
        }
    }

    /// Whether the node has a `kube-ipvs0` link (kube-proxy in IPVS mode, unsupported).
    pub fn set_kube_proxy_ipvs(&self, ipvs: bool) {
        self.kube_proxy_ipvs.set(i64::from(ipvs));
    }
}
