//! Fast failover's metrics: adverts and acks received by result, adverts sent, the
//! failover events of both sides, and the standby IPs by state (whether fast failover
//! covers them). Pure, registered in the agent's one registry.

use aliaslb_ops::metrics::registered;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Labels of the fast-failover counters.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct ResultLabels {
    /// What happened.
    result: &'static str,
}

/// Labels of the standby addresses gauge.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct StateLabels {
    /// `armed`, `unheard`, `silent` or `taken_over` ([`super::standby::Coverage`]).
    state: &'static str,
}

/// Fast failover's metrics (cheap to clone: handles).
#[derive(Debug, Clone)]
pub struct FailoverMetrics {
    received: Family<ResultLabels, Counter>,
    sent: Counter,
    events: Family<ResultLabels, Counter>,
    standby: Family<StateLabels, Gauge>,
}

impl FailoverMetrics {
    /// Registered in `r`.
    pub fn register(r: &mut Registry) -> Self {
        FailoverMetrics {
            received: registered(
                r,
                "adverts_received",
                "Fast L2 failover: adverts and acks received, by result (accepted; ack: an ack of a standby or relay; replayed: a counter not above the last one from that sender; not_for_me; invalid: not an advert or a MAC that does not verify; no_key)",
            ),
            sent: registered(
                r,
                "adverts_sent",
                "Fast L2 failover: adverts sent to the standbys of the IPs held",
            ),
            events: registered(
                r,
                "failovers",
                "Fast L2 failover on the standby: taken_over (holder silent, nobody answered the LAN check), still_answered (holder silent, but the IP still answered: not taken), given_back (the holder spoke for an IP taken over); on the holder: stepped_down (neither standby nor relay acked its adverts for 2 intervals and the standby's node did not answer a LAN probe: the alias goes), standby_answers (no acks, but the standby's node answers a LAN probe: kept), lifted (they ack again: held again), retaken (no evidence in the API that the standby took it: held again)",
            ),
            standby: registered(
                r,
                "standby_addresses",
                "Fast L2 failover: the addresses this node stands by for, by state: armed (its holder's adverts list it: taken over within a second if they stop), unheard (no advert of its holder lists it: adverts blocked or off, a key this node cannot verify, or the holder does not hold it; if the holder dies, the address moves only when its Lease expires), silent (its holder's adverts stopped while the address still answers on the LAN), taken_over",
            ),
        }
    }

    /// Set the standby addresses by state.
    pub fn set_standby(&self, c: super::standby::Coverage) {
        for (state, n) in [
            ("armed", c.armed),
            ("unheard", c.unheard),
            ("silent", c.silent),
            ("taken_over", c.taken_over),
        ] {
            self.standby
                .get_or_create(&StateLabels { state })
                .set(aliaslb_ops::metrics::count(n));
        }
    }

    /// Count one advert or ack received, by result.
    pub fn inc_received(&self, result: &'static str) {
        self.received.get_or_create(&ResultLabels { result }).inc();
    }

    /// Count `n` adverts sent.
    pub fn add_sent(&self, n: u64) {
        self.sent.inc_by(n);
    }

    /// Count one failover event, by result.
    pub fn inc(&self, result: &'static str) {
        self.events.get_or_create(&ResultLabels { result }).inc();
    }
}
