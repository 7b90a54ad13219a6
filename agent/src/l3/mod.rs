//! L3 mode glue: the routing daemon read every interval and handed to the run loop as the
//! report's [`RoutingReport`], and the ARP sysctls a node announcing over BGP needs,
//! checked once at start-up.
//!
//! The daemon is only read ([`crate::l3::routing`]); a failed reading is reported (the Lease
//! says why, the metric `aliaslb_agent_routing_daemon_up` is 0), never fatal: the agent
//! keeps the routed addresses, since a daemon restarting would otherwise take every path
//! down with it.
//!
//! [`Withdrawal`]: a node cut off from the API withdraws its routed addresses.
//! [`Routed`]: the two at work in the agent: the daemon's last reading for the report, and
//! the routed addresses kept off the node while withdrawn.

pub mod metrics;
pub mod routing;

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use aliaslb_core::report::RoutingReport;
use tokio::sync::watch;
use tracing::{info, warn};

use crate::desired::DesiredSet;
use crate::l3::metrics::RoutingMetrics;
use crate::l3::routing::{RoutingStatus, RoutingView};

/// The report for one reading: the counts and exports, or the error and nothing else.
pub fn report_of(daemon: &str, reading: Result<RoutingStatus, String>) -> RoutingReport {
    match reading {
        Ok(status) => RoutingReport {
            daemon: status.daemon.to_owned(),
            error: None,
            sessions: u32::try_from(status.sessions).unwrap_or(u32::MAX),
            established: u32::try_from(status.established).unwrap_or(u32::MAX),
            exported: status.exported,
        },
        Err(error) => RoutingReport {
            daemon: daemon.to_owned(),
            error: Some(error),
            ..RoutingReport::default()
        },
    }
}

/// Reads `view` every `interval` and publishes each reading on `tx` (only when it changed:
/// the loop then rewrites the report, the heartbeat the Lease). Returns at once when no
/// daemon is configured; otherwise runs until `tx` has no receiver.
pub async fn watch_daemon<V: RoutingView>(
    view: V,
    daemon: &'static str,
    interval: Duration,
    tx: watch::Sender<Option<RoutingReport>>,
    metrics: RoutingMetrics,
) {
    let mut was_up = None;
    loop {
        let reading = match view.read().await {
            Ok(None) => return,
            Ok(Some(status)) => Ok(status),
            Err(e) => Err(e.to_string()),
        };
        let up = reading.is_ok();
        if was_up != Some(up) {
            match &reading {
                Ok(status) => info!(
                    daemon,
                    sessions = status.sessions,
                    established = status.established,
                    exported = status.exported.len(),
                    "routing daemon read"
                ),
                Err(error) => warn!(daemon, %error, "routing daemon cannot be read"),
            }
            was_up = Some(up);
        }
        let report = report_of(daemon, reading);
        metrics.set_routing(daemon, up, report.established, report.exported.len());
        tx.send_if_modified(|current| {
            let changed = current.as_ref() != Some(&report);
            if changed {
                *current = Some(report);
            }
            changed
        });
        if tx.is_closed() {
            return;
        }
        tokio::time::sleep(interval).await;
    }
}

/// Where the kernel's per-interface IPv4 settings are.
pub const PROC_CONF: &str = "/proc/sys/net/ipv4/conf";

/// What is wrong with the node's ARP settings for L3 mode, read under `conf`
/// ([`PROC_CONF`]): with a VIP on `lo` or a dummy device, Linux by default answers ARP
/// for it on every interface (`arp_ignore=0`) and may use it as the source of its own
/// ARP requests (`arp_announce=0`). Harmless while the pools are on no LAN; but a VIP that
/// is also on a node subnet would be answered by every announcing node. The kernel applies
/// the larger of `all` and the interface's value, so `all` set right is enough.
pub fn arp_warnings(conf: &Path) -> Vec<String> {
    let read = |name: &str| -> Option<u8> {
        std::fs::read_to_string(conf.join("all").join(name))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    let mut out = Vec::new();
    for (name, want, why) in [
        (
            "arp_ignore",
            1,
            "answers ARP for the routed addresses on every interface",
        ),
        (
            "arp_announce",
            2,
            "may use a routed address as the source of its own ARP requests",
        ),
    ] {
        match read(name) {
            Some(value) if value >= want => {}
            Some(value) => out.push(format!(
                "net.ipv4.conf.all.{name} is {value}: this node {why}; harmless while the \
                 BGP pools are on no LAN subnet, otherwise set net.ipv4.conf.all.{name}={want}"
            )),
            None => out.push(format!(
                "cannot read net.ipv4.conf.all.{name} under {}: L3 mode wants it at least {want}",
                conf.display()
            )),
        }
    }
    out
}

/// The L3 cut-off: an agent cut off from the API withdraws its routed addresses.
///
/// A routed address is on no LAN: no other node's claim makes this one yield it, and its
/// kernel lifetime is refreshed by this agent whatever its authority. So nothing else
/// stops a node the controller judged lost from announcing, for ever, an address the
/// controller may have given to another Service meanwhile (its stale kube-proxy would
/// then send the new Service's flows to the old one's pods). Once this agent's authority
/// has been stale for a whole lease duration
/// ([`crate::heartbeat::Authority::stale_past_a_lease`]), its routed addresses are withdrawn:
/// removed from the node, so the routing daemon withdraws their routes and the other
/// nodes' ECMP paths carry on. The controller counts them as announced until then, plus a
/// margin (it does not give such an address to another Service before).
///
/// They come back once the authority is fresh again **and** a desired set read after the
/// withdrawal has arrived: fresh authority says the API answers again, not that the node
/// still has these addresses (the assignment watch lists its object anew after an
/// outage, which is news even when unchanged). Pure.
#[derive(Debug, Clone, Default)]
pub struct Withdrawal {
    /// Desired sets read so far.
    generation: u64,
    /// `Some(generation at the withdrawal)` while withdrawn.
    withdrawn_at: Option<u64>,
}

/// What [`Withdrawal::update`] changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WithdrawalEdge {
    /// Nothing.
    None,
    /// The routed addresses are withdrawn from now on.
    Withdrawn,
    /// They are announced again.
    Restored,
}

impl Withdrawal {
    /// A desired set was read from the API.
    pub fn desired_changed(&mut self) {
        self.generation += 1;
    }

    /// Whether the routed addresses are withdrawn.
    pub fn withdrawn(&self) -> bool {
        self.withdrawn_at.is_some()
    }

    /// The state for the authority now: `stale_past_a_lease` and `fresh` (see the type's
    /// docs), without changing it.
    fn next(&self, stale_past_a_lease: bool, fresh: bool) -> Option<u64> {
        match self.withdrawn_at {
            None if stale_past_a_lease => Some(self.generation),
            Some(at) if fresh && self.generation > at => None,
            keep => keep,
        }
    }

    /// Whether [`Withdrawal::update`] would change anything now.
    pub fn would_change(&self, stale_past_a_lease: bool, fresh: bool) -> bool {
        self.next(stale_past_a_lease, fresh) != self.withdrawn_at
    }

    /// Moves to the state for the authority now; returns the edge crossed.
    pub fn update(&mut self, stale_past_a_lease: bool, fresh: bool) -> WithdrawalEdge {
        let next = self.next(stale_past_a_lease, fresh);
        let edge = match (self.withdrawn_at, next) {
            (None, Some(_)) => WithdrawalEdge::Withdrawn,
            (Some(_), None) => WithdrawalEdge::Restored,
            _ => WithdrawalEdge::None,
        };
        self.withdrawn_at = next;
        edge
    }
}

/// L3 mode at work in the agent: the routing daemon's last reading (for the report) and
/// the [`Withdrawal`] of the routed addresses while cut off from the API.
#[derive(Debug)]
pub struct Routed {
    readings: watch::Receiver<Option<RoutingReport>>,
    open: bool,
    last: Option<RoutingReport>,
    withdrawal: Withdrawal,
    metrics: RoutingMetrics,
}

impl Routed {
    /// Over the readings of [`watch_daemon`].
    pub fn new(readings: watch::Receiver<Option<RoutingReport>>, metrics: RoutingMetrics) -> Self {
        Routed {
            readings,
            open: true,
            last: None,
            withdrawal: Withdrawal::default(),
            metrics,
        }
    }

    /// Waits for the daemon's next reading and keeps it. Pending for ever once the reader
    /// ended (or when none runs: `--routing-daemon=none`).
    pub async fn next(&mut self) {
        if !self.open || self.readings.changed().await.is_err() {
            self.open = false;
            return std::future::pending().await;
        }
        self.last = self.readings.borrow_and_update().clone();
    }

    /// A desired set was read from the API.
    pub fn desired_changed(&mut self) {
        self.withdrawal.desired_changed();
    }

    /// Whether [`Self::update`] would change anything for the authority now.
    pub fn would_change(&self, stale_past_a_lease: bool, fresh: bool) -> bool {
        self.withdrawal.would_change(stale_past_a_lease, fresh)
    }

    /// Moves the withdrawal to the authority now (`stale_past_a_lease`, `fresh`, and its
    /// `lease` duration for the log) and says so on an edge; the metric counts the routed
    /// addresses kept out.
    pub fn update(
        &mut self,
        desired: &DesiredSet,
        stale_past_a_lease: bool,
        fresh: bool,
        lease: Duration,
    ) {
        let routed = routed(desired);
        match self.withdrawal.update(stale_past_a_lease, fresh) {
            _ if routed.is_empty() => {}
            WithdrawalEdge::Withdrawn => warn!(
                routed = routed.len(),
                stale_for = ?lease,
                "the Lease has been stale for a lease duration (cut off from the API?): withdrawing the routed addresses, which the controller may give to other Services now; they come back once the Lease is renewed and the assignment read again"
            ),
            WithdrawalEdge::Restored => info!(
                routed = routed.len(),
                "Lease renewed and assignment read again: the routed addresses it lists are announced again"
            ),
            WithdrawalEdge::None => {}
        }
        let out = if self.withdrawal.withdrawn() {
            routed.len()
        } else {
            0
        };
        self.metrics.set_routed_withdrawn(out);
    }

    /// The routed addresses of `desired` kept off the node now (none unless withdrawn).
    pub fn withdrawn(&self, desired: &DesiredSet) -> BTreeSet<IpAddr> {
        if self.withdrawal.withdrawn() {
            routed(desired)
        } else {
            BTreeSet::new()
        }
    }

    /// The report's routing part: what the daemon exports of the routed addresses `held`
    /// (the rest is not ours). `None`: no daemon read.
    pub fn report(&self, desired: &DesiredSet, held: &BTreeSet<IpAddr>) -> Option<RoutingReport> {
        self.last.clone().map(|mut routing| {
            routing
                .exported
                .retain(|ip| desired.is_routed(*ip) && held.contains(ip));
            routing
        })
    }
}

/// The routed addresses of `desired`.
fn routed(desired: &DesiredSet) -> BTreeSet<IpAddr> {
    desired
        .iter()
        .map(|(ip, _)| ip)
        .filter(|ip| desired.is_routed(*ip))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::l3::routing::RoutingError;

    #[test]
    fn routed_addresses_come_back_only_fresh_and_with_a_desired_set_read_after() {
        let mut f = Withdrawal::default();
        f.desired_changed();
        // (stale past a lease, fresh, desired set read before the step, edge, withdrawn)
        let steps: &[(bool, bool, bool, WithdrawalEdge, bool)] = &[
            (false, true, false, WithdrawalEdge::None, false),
            (false, false, false, WithdrawalEdge::None, false), // stale, not for a lease yet
            (true, false, false, WithdrawalEdge::Withdrawn, true),
            (true, false, false, WithdrawalEdge::None, true),
            (false, true, false, WithdrawalEdge::None, true), // fresh, no new set: still out
            (false, false, true, WithdrawalEdge::None, true), // a new set, stale: still out
            (false, true, false, WithdrawalEdge::Restored, false), // fresh, a set read after
            (true, false, false, WithdrawalEdge::Withdrawn, true),
            (false, true, true, WithdrawalEdge::Restored, false),
        ];
        for (i, (stale, fresh, read, edge, withdrawn)) in steps.iter().enumerate() {
            if *read {
                f.desired_changed();
            }
            assert_eq!(
                f.would_change(*stale, *fresh),
                *edge != WithdrawalEdge::None,
                "step {i}"
            );
            assert_eq!(f.update(*stale, *fresh), *edge, "step {i}");
            assert_eq!(f.withdrawn(), *withdrawn, "step {i}");
        }
    }

    #[test]
    fn a_reading_becomes_the_report_and_an_error_only_says_why() {
        let ok = report_of(
            "bird",
            Ok(RoutingStatus {
                daemon: "bird",
                established: 2,
                sessions: 3,
                exported: ["10.200.0.7".parse().unwrap()].into(),
            }),
        );
        assert_eq!((ok.sessions, ok.established, ok.exported.len()), (3, 2, 1));
        assert_eq!(ok.error, None);
        let down = report_of("frr", Err("cannot reach vtysh".into()));
        assert_eq!(down.daemon, "frr");
        assert_eq!(down.error.as_deref(), Some("cannot reach vtysh"));
        assert!(down.exported.is_empty() && down.established == 0);
    }

    struct Script(std::sync::Mutex<Vec<Result<Option<RoutingStatus>, RoutingError>>>);

    impl RoutingView for Script {
        fn read(&self) -> impl Future<Output = Result<Option<RoutingStatus>, RoutingError>> + Send {
            let next = self.0.lock().unwrap().pop();
            async move { next.unwrap_or(Ok(None)) }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_watch_publishes_changes_and_stops_without_a_daemon() {
        let status = RoutingStatus {
            daemon: "bird",
            established: 1,
            sessions: 1,
            exported: Default::default(),
        };
        // Popped from the end: up, up (unchanged), down, then "no daemon" ends the watch.
        let script = Script(std::sync::Mutex::new(vec![
            Ok(None),
            Err(RoutingError::Timeout {
                daemon: "bird",
                after: Duration::from_secs(1),
            }),
            Ok(Some(status.clone())),
            Ok(Some(status)),
        ]));
        let (tx, mut rx) = watch::channel(None);
        let metrics = crate::metrics::Metrics::new();
        let task = tokio::spawn(watch_daemon(
            script,
            "bird",
            Duration::from_secs(1),
            tx,
            metrics.routing.clone(),
        ));
        rx.changed().await.unwrap();
        assert_eq!(rx.borrow_and_update().as_ref().unwrap().established, 1);
        rx.changed().await.unwrap();
        let down = rx.borrow_and_update().clone().unwrap();
        assert!(down.error.unwrap().contains("did not answer within 1s"));
        task.await.unwrap();
        let text = metrics.encode().unwrap();
        assert!(text.contains("aliaslb_agent_routing_daemon_up 0"), "{text}");
    }

    #[test]
    fn arp_settings_are_checked_under_all() {
        let dir = std::env::temp_dir().join(format!("alb-arp-{}", std::process::id()));
        let all = dir.join("all");
        std::fs::create_dir_all(&all).unwrap();
        std::fs::write(all.join("arp_ignore"), "0\n").unwrap();
        std::fs::write(all.join("arp_announce"), "2\n").unwrap();
        let warnings = arp_warnings(&dir);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0].contains("net.ipv4.conf.all.arp_ignore is 0")
                && warnings[0].contains("net.ipv4.conf.all.arp_ignore=1"),
            "{warnings:?}"
        );
        std::fs::write(all.join("arp_ignore"), "1\n").unwrap();
        assert!(arp_warnings(&dir).is_empty());
        std::fs::remove_file(all.join("arp_announce")).unwrap();
        assert!(arp_warnings(&dir)[0].contains("cannot read net.ipv4.conf.all.arp_announce"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
