//! L3 mode's metrics: the routing daemon as last read (up, its Established sessions, the
//! host routes it exports) and the routed addresses withdrawn while cut off from the API.
//! Pure, registered in the agent's one registry.

use aliaslb_ops::metrics::{count, registered};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Labels of the routing daemon gauge.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct DaemonLabels {
    /// `bird` or `frr`.
    daemon: &'static str,
}

/// L3 mode's metrics (cheap to clone: handles).
#[derive(Debug, Clone)]
pub struct RoutingMetrics {
    routed_withdrawn: Gauge,
    daemon_up: Gauge,
    daemon_info: Family<DaemonLabels, Gauge>,
    sessions_established: Gauge,
    routes_exported: Gauge,
}

impl RoutingMetrics {
    /// Registered in `r`.
    pub fn register(r: &mut Registry) -> Self {
        RoutingMetrics {
            routed_withdrawn: registered(
                r,
                "routed_withdrawn",
                "Routed (L3) addresses assigned to this node but withdrawn because its authority has been stale for a lease duration (cut off from the API: the controller may have given them to other Services)",
            ),
            daemon_up: registered(
                r,
                "routing_daemon_up",
                "L3 mode: 1 when the last reading of the node's routing daemon (--routing-daemon) succeeded, 0 when it failed",
            ),
            daemon_info: registered(
                r,
                "routing_daemon_info",
                "L3 mode: 1, labelled with the routing daemon the agent reads (--routing-daemon); no series in L2 mode",
            ),
            sessions_established: registered(
                r,
                "bgp_sessions_established",
                "L3 mode: BGP sessions of the node's routing daemon in state Established, at the last reading",
            ),
            routes_exported: registered(
                r,
                "routes_exported",
                "L3 mode: host routes the node's routing daemon exports to at least one Established peer, at the last reading",
            ),
        }
    }

    /// Record how many routed addresses are withdrawn while the authority is stale.
    pub fn set_routed_withdrawn(&self, n: usize) {
        self.routed_withdrawn.set(count(n));
    }

    /// The last reading of the routing daemon `daemon`: whether it succeeded, its
    /// Established sessions and its exported host routes.
    pub fn set_routing(&self, daemon: &'static str, up: bool, established: u32, exported: usize) {
        self.daemon_info
            .get_or_create(&DaemonLabels { daemon })
            .set(1);
        self.daemon_up.set(i64::from(up));
        self.sessions_established.set(i64::from(established));
        self.routes_exported.set(count(exported));
    }
}
