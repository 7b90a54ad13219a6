//! L2 mode's metrics on the LAN: announcements sent, claims heard (and dropped, or heard on
//! another link), conflicts, yields, defences and probes. Pure, registered in the agent's
//! one registry; the announcer's and the LAN watch's own counters are read at every encode.

use std::sync::{Arc, OnceLock};

use aliaslb_ops::metrics::{count, registered};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::l2::announce::Announcer;
use crate::l2::lan::LanWatch;

/// Labels of the probe counter.
#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct OutcomeLabels {
    /// `free`, `taken` or `failed`.
    outcome: &'static str,
}

/// What one LAN probe of an IP found, for [`LanMetrics::inc_probe`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeMetric {
    /// Nobody answered.
    Free,
    /// Another host answered.
    Taken,
    /// The probe could not be sent or listened for.
    Failed,
}

/// L2 mode's LAN metrics (cheap to clone: handles).
#[derive(Debug, Clone)]
pub struct LanMetrics {
    announcements: Counter,
    announcement_failures: Counter,
    claims_dropped: Counter,
    conflicts: Gauge,
    yields: Counter,
    defences: Counter,
    claims_elsewhere: Counter,
    probes: Family<OutcomeLabels, Counter>,
    /// Read at every encode: its frames are sent by background tasks.
    announcer: Arc<OnceLock<Announcer>>,
    /// Read at every encode: its threads count the claims they could not queue.
    lan: Arc<OnceLock<LanWatch>>,
}

impl LanMetrics {
    /// Registered in `r`.
    pub fn register(r: &mut Registry) -> Self {
        LanMetrics {
            announcements: registered(
                r,
                "announcements",
                "Gratuitous ARP and unsolicited neighbour advertisement frames sent",
            ),
            announcement_failures: registered(
                r,
                "announcement_failures",
                "Announcement frames that could not be sent",
            ),
            claims_dropped: registered(
                r,
                "lan_claims_dropped",
                "ARP/NDP claims seen on the LAN and dropped because the loop's queue was full (a host flooding the LAN)",
            ),
            conflicts: registered(
                r,
                "lan_conflicts",
                "Addresses another host on the LAN answered for or claimed, as reported on the Lease",
            ),
            yields: registered(
                r,
                "yields",
                "Held addresses given up because another node claimed them while this agent's Lease was stale",
            ),
            defences: registered(
                r,
                "defences",
                "Announcements sent to defend a held address another host (node or not) claimed while this agent's Lease was fresh (at most one per 10 s per address)",
            ),
            claims_elsewhere: registered(
                r,
                "lan_claims_elsewhere",
                "Claims of a held or probed address heard on another link than the address's own (a pod veth, a CNI bridge, another NIC): ignored",
            ),
            probes: registered(
                r,
                "probes",
                "Addresses probed on the LAN before a first claim or a re-claim, by outcome",
            ),
            announcer: Arc::default(),
            lan: Arc::default(),
        }
    }

    /// Report `lan`'s dropped claims at every [`Self::collect`] (the first given is kept).
    pub fn track_lan(&self, lan: LanWatch) {
        let _ = self.lan.set(lan);
    }

    /// Report `announcer`'s frame counts at every [`Self::collect`] (the first announcer
    /// given is kept).
    pub fn track_announcer(&self, announcer: Announcer) {
        let _ = self.announcer.set(announcer);
    }

    /// Brings the counters kept by the announcer and the LAN watch up to date (before an
    /// encode).
    pub fn collect(&self) {
        if let Some(a) = self.announcer.get() {
            self.set_announcements(a.frames_sent(), a.frames_failed());
        }
        if let Some(lan) = self.lan.get() {
            let dropped = lan.claims_dropped();
            self.claims_dropped
                .inc_by(dropped.saturating_sub(self.claims_dropped.get()));
        }
    }

    /// Record the number of LAN conflicts reported.
    pub fn set_conflicts(&self, n: usize) {
        self.conflicts.set(count(n));
    }

    /// Count one yield.
    pub fn inc_yield(&self) {
        self.yields.inc();
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
}
