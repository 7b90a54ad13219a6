//! The handovers' metrics: the IPs this node forwards and drains, and the connections a
//! drain window ended with. Pure, registered in the agent's one registry.

use aliaslb_ops::metrics::{count, registered};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The handovers' metrics (cheap to clone: handles).
#[derive(Debug, Clone)]
pub struct HandoverMetrics {
    forwards: Gauge,
    draining: Gauge,
    cut: Counter,
}

impl HandoverMetrics {
    /// Registered in `r`.
    pub fn register(r: &mut Registry) -> Self {
        HandoverMetrics {
            forwards: registered(
                r,
                "handover_forwards",
                "IPs this node got in a planned move whose unknown TCP flows it forwards to the node they came from (issue 45)",
            ),
            draining: registered(
                r,
                "handover_draining",
                "IPs this node left in a planned move and still carries established connections for, within the drain window",
            ),
            cut: registered(
                r,
                "handover_connections_cut",
                "Established TCP connections to an IP this node drained that were still open when its drain window ended (they break, as without handovers)",
            ),
        }
    }

    /// Record the tables as written.
    pub fn set_tables(&self, forwards: usize, draining: usize) {
        self.forwards.set(count(forwards));
        self.draining.set(count(draining));
    }

    /// Count `n` connections still open at a drain window's end.
    pub fn record_cut(&self, n: usize) {
        self.cut.inc_by(u64::try_from(n).unwrap_or(u64::MAX));
    }
}
