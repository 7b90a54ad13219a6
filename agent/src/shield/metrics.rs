//! The host-port shield's metrics: its state, its size, its failed writes, the tables found
//! damaged and the packets it dropped. Pure, registered in the agent's one registry.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use aliaslb_core::report::ShieldState;
use aliaslb_ops::metrics::{count, registered};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::Dropped;

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

/// The shield's metrics (cheap to clone: handles).
#[derive(Debug, Clone)]
pub struct ShieldMetrics {
    active: Gauge,
    state: Family<StateLabels, Gauge>,
    addresses: Gauge,
    sync_errors: Counter,
    damaged: Counter,
    dropped: Family<FamilyLabels, Counter>,
    /// The nftables counters at the last reading (they restart at 0 with a new table).
    seen: Arc<[AtomicU64; 2]>,
}

impl ShieldMetrics {
    /// Registered in `r`.
    pub fn register(r: &mut Registry) -> Self {
        ShieldMetrics {
            active: registered(
                r,
                "shield_active",
                "1 when the host-port shield guards every held address, 0 when off or failing",
            ),
            damaged: registered(
                r,
                "shield_tables_damaged",
                "Times the host-port shield's nftables table was found deleted or altered by someone else (then rewritten)",
            ),
            state: registered(
                r,
                "shield_state",
                "The host-port shield's state: 1 for the current one of active, failing (the last table write failed, or the table was found deleted or altered, until it is rewritten), off (--host-port-shield=off), 0 for the others",
            ),
            addresses: registered(
                r,
                "shield_addresses",
                "Addresses in the host-port shield's nftables table",
            ),
            sync_errors: registered(
                r,
                "shield_sync_errors",
                "Writes of the host-port shield's nftables table that failed",
            ),
            dropped: registered(
                r,
                "shield_dropped_packets",
                "Packets addressed to a load-balancer IP dropped by the host-port shield (not a Service port), by family",
            ),
            seen: Arc::new([AtomicU64::new(0), AtomicU64::new(0)]),
        }
    }

    /// Record the shield's state, its size, its failed writes and the damaged tables found
    /// since start.
    pub fn set(&self, state: ShieldState, addresses: usize, errors: u64, damaged: u64) {
        self.active.set(i64::from(state == ShieldState::Active));
        for each in [ShieldState::Active, ShieldState::Failing, ShieldState::Off] {
            self.state
                .get_or_create(&StateLabels {
                    state: each.as_str(),
                })
                .set(i64::from(state == each));
        }
        self.addresses.set(count(addresses));
        self.sync_errors
            .inc_by(errors.saturating_sub(self.sync_errors.get()));
        self.damaged
            .inc_by(damaged.saturating_sub(self.damaged.get()));
    }

    /// Bring the drop counters up to the table's counters; a table replaced since the last
    /// reading restarted them at 0, and all it counted since is new.
    pub fn set_dropped(&self, dropped: Dropped) {
        for (i, (family, now)) in [("ipv4", dropped.v4), ("ipv6", dropped.v6)]
            .into_iter()
            .enumerate()
        {
            let before = self.seen[i].swap(now, Ordering::Relaxed);
            let new = if now >= before { now - before } else { now };
            self.dropped
                .get_or_create(&FamilyLabels { family })
                .inc_by(new);
        }
    }
}
