//! The agent's answers behind the shared `/metrics`, `/healthz`, `/readyz` server
//! (`aliaslb_ops::http`, which does the network I/O). No I/O here.
//!
//! `/healthz` answers 200 while the alias loop keeps turning (it beats [`Health`] at every
//! renewal tick), so a hung loop — whose aliases the kernel is about to expire — gets the
//! pod restarted. `/readyz` answers 200 once the first reconcile on a complete read of its
//! assignment is done and the agent's Lease is written (its report is in; not since released
//! because its kernel rounds stopped): a rolling update of the DaemonSet (`maxUnavailable:
//! 1`) then moves to the next node only when this one's new agent carries its addresses and
//! the controller can see it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use aliaslb_ops::http::Probes;

use crate::heartbeat::Authority;
use crate::metrics::Metrics;

/// Liveness and readiness of the alias loop. Clones share the state.
#[derive(Debug, Clone)]
pub struct Health(Arc<HealthInner>);

#[derive(Debug)]
struct HealthInner {
    start: Instant,
    stall_after: Duration,
    last_beat_ms: AtomicU64,
    ready: AtomicBool,
}

impl Health {
    /// Alive (as if it just beat), not ready; unhealthy once no beat came for `stall_after`.
    pub fn new(stall_after: Duration) -> Self {
        Health(Arc::new(HealthInner {
            start: Instant::now(),
            stall_after,
            last_beat_ms: AtomicU64::new(0),
            ready: AtomicBool::new(false),
        }))
    }

    /// The loop is alive.
    pub fn beat(&self) {
        let ms = u64::try_from(self.0.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.0.last_beat_ms.store(ms, Ordering::Release);
    }

    /// Whether the loop beat within the stall window.
    pub fn is_alive(&self) -> bool {
        let last = Duration::from_millis(self.0.last_beat_ms.load(Ordering::Acquire));
        self.0.start.elapsed().saturating_sub(last) < self.0.stall_after
    }

    /// Mark the agent ready (first reconcile on a complete read of its assignment done).
    pub fn set_ready(&self) {
        self.0.ready.store(true, Ordering::Release);
    }

    /// Whether [`Health::set_ready`] was called.
    pub fn is_ready(&self) -> bool {
        self.0.ready.load(Ordering::Acquire)
    }
}

/// What the agent's endpoints answer; hand it to `aliaslb_ops::http::serve`.
#[derive(Debug, Clone)]
pub struct AgentProbes {
    /// Served on `/metrics`.
    pub metrics: Arc<Metrics>,
    /// Behind `/healthz` and `/readyz`.
    pub health: Health,
    /// The heartbeat's renewals: `/readyz` waits for the first (and for the next after a
    /// release).
    pub lease: Authority,
}

impl Probes for AgentProbes {
    fn healthz(&self) -> Result<(), String> {
        if self.health.is_alive() {
            Ok(())
        } else {
            Err("the alias loop is stuck: lifetimes are not being refreshed".to_owned())
        }
    }

    fn readyz(&self) -> Result<(), String> {
        if !self.health.is_ready() {
            Err("assignment not read yet".to_owned())
        } else if self.lease.last_renewal().is_none() {
            Err("Lease not written yet".to_owned())
        } else {
            Ok(())
        }
    }

    fn metrics(&self) -> Result<String, std::fmt::Error> {
        self.metrics.encode()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_readiness_and_metrics() {
        let metrics = Arc::new(Metrics::new());
        metrics.heartbeat.record_renewal(true);
        let probes = AgentProbes {
            metrics,
            health: Health::new(Duration::from_millis(300)),
            lease: Authority::new(Duration::from_secs(4)),
        };

        assert_eq!(probes.healthz(), Ok(()));
        assert_eq!(probes.readyz(), Err("assignment not read yet".to_owned()));
        probes.health.set_ready();
        assert_eq!(probes.readyz(), Err("Lease not written yet".to_owned()));
        probes.lease.record_renewal(tokio::time::Instant::now());
        assert_eq!(probes.readyz(), Ok(()));
        // Released (its kernel rounds stopped: the controller moves its IPs): not ready
        // until it writes the Lease again. A failing renewal (an API outage) releases
        // nothing and keeps it ready.
        probes.lease.revoke(tokio::time::Instant::now());
        assert_eq!(probes.readyz(), Err("Lease not written yet".to_owned()));
        probes.lease.record_renewal(tokio::time::Instant::now());
        assert_eq!(probes.readyz(), Ok(()));
        let body = probes.metrics().unwrap();
        assert!(body.contains("aliaslb_agent_api_reachable 1"), "{body}");

        // No beat for longer than the stall window: unhealthy, until the next beat.
        std::thread::sleep(Duration::from_millis(400));
        let stuck = probes.healthz().unwrap_err();
        assert!(stuck.contains("stuck"), "{stuck}");
        probes.health.beat();
        assert_eq!(probes.healthz(), Ok(()));
    }
}
