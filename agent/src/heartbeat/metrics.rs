//! The heartbeat's metrics: Lease writes that failed, renewals withheld because the kernel
//! went quiet, whether the API was reached and whether this agent's authority is fresh.
//! Pure, registered in the agent's one registry.

use aliaslb_ops::metrics::registered;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The heartbeat's metrics (cheap to clone: handles).
#[derive(Debug, Clone)]
pub struct HeartbeatMetrics {
    renew_failures: Counter,
    renewals_gated: Counter,
    api_reachable: Gauge,
    authority_fresh: Gauge,
}

impl HeartbeatMetrics {
    /// Registered in `r`.
    pub fn register(r: &mut Registry) -> Self {
        HeartbeatMetrics {
            renewals_gated: registered(
                r,
                "lease_renewals_gated",
                "Lease renewals skipped because the alias loop's last kernel round is too old for the held aliases to still exist",
            ),
            authority_fresh: registered(
                r,
                "authority_fresh",
                "1 while this agent's Lease was renewed within the lease duration (it defends its IPs), 0 when stale (it yields them to another node)",
            ),
            renew_failures: registered(
                r,
                "lease_renew_failures",
                "Lease writes (renewals and report updates) that failed",
            ),
            api_reachable: registered(
                r,
                "api_reachable",
                "1 when the last Lease write reached the API server, else 0",
            ),
        }
    }

    /// Count one renewal skipped because the kernel rounds are too old.
    pub fn record_renewal_gated(&self) {
        self.renewals_gated.inc();
    }

    /// Record whether this agent's authority is fresh.
    pub fn set_authority_fresh(&self, fresh: bool) {
        self.authority_fresh.set(i64::from(fresh));
    }

    /// Record one Lease write: reached the API server or not.
    pub fn record_renewal(&self, ok: bool) {
        if !ok {
            self.renew_failures.inc();
        }
        self.api_reachable.set(i64::from(ok));
    }
}
