//! The controller's answers behind the shared `/metrics`, `/healthz`, `/readyz` server
//! (`aliaslb_ops::http`, which does the network I/O). No I/O here.
//!
//! `/healthz` answers 200 while the process serves requests. `/readyz` answers 200 once
//! [`Readiness::set_ready`] was called (caches synced); followers are ready too, so a
//! standby replica is never restarted for not leading.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use aliaslb_ops::http::Probes;

use crate::metrics::Metrics;

/// Shared "ready" flag behind `/readyz`. Clones share the flag.
#[derive(Debug, Clone, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    /// Not ready yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Mark the process ready (call once the caches have synced).
    pub fn set_ready(&self) {
        self.0.store(true, Ordering::Release);
    }

    /// Whether [`Readiness::set_ready`] was called.
    pub fn is_ready(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// What the controller's endpoints answer; hand it to `aliaslb_ops::http::serve`.
#[derive(Debug, Clone)]
pub struct ControllerProbes {
    /// Served on `/metrics`.
    pub metrics: Arc<Metrics>,
    /// Behind `/readyz`.
    pub readiness: Readiness,
}

impl Probes for ControllerProbes {
    fn healthz(&self) -> Result<(), String> {
        Ok(())
    }

    fn readyz(&self) -> Result<(), String> {
        if self.readiness.is_ready() {
            Ok(())
        } else {
            Err("caches not synced yet".to_owned())
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
    fn healthy_ready_once_synced_and_serves_metrics() {
        let metrics = Arc::new(Metrics::new());
        metrics.set_leader(true);
        let probes = ControllerProbes {
            metrics,
            readiness: Readiness::new(),
        };

        assert_eq!(probes.healthz(), Ok(()));
        assert_eq!(probes.readyz(), Err("caches not synced yet".to_owned()));
        probes.readiness.clone().set_ready();
        assert_eq!(probes.readyz(), Ok(()));
        let body = probes.metrics().unwrap();
        assert!(body.contains("aliaslb_leader 1"), "{body}");
    }
}
