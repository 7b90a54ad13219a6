//! The run loop's handover part: brings the node's handover tables ([`super::script`]) to
//! the lines of its index, before the aliases are reconciled (so a moved IP's forwards are
//! in place when the new holder announces it). Does I/O: the tables through a
//! [`ShieldBackend`] (`nft`), and one UDP datagram to each new forward target so the
//! kernel resolves its link-layer address before the first forwarded packet needs it.
//!
//! The tables are lifted at the first update after start (a run before may have left
//! forwards to a node long gone) and at shutdown ([`Handovers::lift`]). An agent without
//! a backend ([`Handovers::off`], as in the run loop's tests) does nothing.
//!
//! When a drain ends while this node neither holds nor forwards the IP again (the window is
//! over), the
//! established connections its conntrack still carries to the IP are counted
//! ([`super::conntrack`], one dump on a blocking thread), logged and added to
//! `aliaslb_agent_handover_connections_cut_total`: they break now.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, UdpSocket};

use aliaslb_core::assignment::Handover;
use aliaslb_core::report::InterfaceReport;
use tracing::{debug, info, warn};

use super::metrics::HandoverMetrics;
use super::{Rules, apply, conntrack, lift_script};
use crate::shield::ShieldBackend;

/// The UDP port the resolving datagram goes to (discard: nothing answers, the neighbour
/// entry is what it is for).
const DISCARD_PORT: u16 = 9;

/// The node's handover tables as last written.
#[derive(Debug)]
pub struct Handovers<S> {
    nft: Option<S>,
    metrics: Option<HandoverMetrics>,
    /// The rules last written (`None`: nothing written since start, a lift is due).
    applied: Option<Rules>,
    /// The forward targets whose address a datagram was sent to.
    resolved: BTreeSet<IpAddr>,
}

impl<S: ShieldBackend> Handovers<S> {
    /// Tables written through `nft`, recorded in `metrics`.
    pub fn new(nft: S, metrics: HandoverMetrics) -> Self {
        Handovers {
            nft: Some(nft),
            metrics: Some(metrics),
            applied: None,
            resolved: BTreeSet::new(),
        }
    }

    /// No tables at all.
    pub fn off() -> Self {
        Handovers {
            nft: None,
            metrics: None,
            applied: None,
            resolved: BTreeSet::new(),
        }
    }

    /// Brings the tables to `lines`, each forward on the interface of the subnet of its
    /// target (else of its IP) among `interfaces`. A failed write is said and tried again
    /// at the next update. `holds` says whether this node holds an IP (a drain that ends
    /// because the IP came back is no window's end).
    pub async fn update(
        &mut self,
        lines: &BTreeMap<IpAddr, Handover>,
        interfaces: &[InterfaceReport],
        holds: impl Fn(IpAddr) -> bool,
    ) {
        let Some(nft) = &self.nft else {
            return;
        };
        let (mut rules, errors) = Rules::from_lines(lines, |ip| {
            let to = lines.get(&ip).and_then(|l| l.forward.as_ref());
            to.and_then(|to| interface_of(interfaces, to.address))
                .or_else(|| interface_of(interfaces, ip))
        });
        // An IP this node holds is never silenced: its shard line may arrive before the
        // index drops the drain (the two objects are written apart).
        rules.draining.retain(|ip| !holds(*ip));
        if self.applied.as_ref() == Some(&rules) {
            return;
        }
        for error in &errors {
            warn!(%error, "handover line not applied");
        }
        for (_, _, to, _) in &rules.forwards {
            if self.resolved.insert(*to) {
                resolve(*to);
            }
        }
        let start = self.applied.is_none() && rules == Rules::default();
        match apply(nft, &rules).await {
            Ok(()) if start => debug!("handover tables lifted at start"),
            Ok(()) => info!(
                forwards = rules.forwards.len(),
                draining = rules.draining.len(),
                "handover tables written"
            ),
            // At start without lines: there is nothing to lift on a node without nft.
            Err(error) if start => debug!(%error, "handover tables not lifted at start"),
            Err(error) => {
                warn!(%error, "could not write the handover tables; retrying at the next reconcile");
                return;
            }
        }
        self.resolved
            .retain(|a| rules.forwards.iter().any(|(_, _, to, _)| to == a));
        let ended = self
            .applied
            .as_ref()
            .map(|before| window_ends(before, &rules, &holds))
            .unwrap_or_default();
        if let Some(metrics) = &self.metrics {
            metrics.set_tables(rules.forwards.len(), rules.draining.len());
            if !ended.is_empty() {
                count_cut(ended, metrics.clone());
            }
        }
        self.applied = Some(rules);
    }

    /// Removes the tables (at shutdown: the forwards are this agent's to end).
    pub async fn lift(&mut self) {
        let Some(nft) = &self.nft else {
            return;
        };
        if self.applied.as_ref() == Some(&Rules::default()) {
            return;
        }
        match nft.apply(&lift_script()).await {
            Ok(()) => info!("handover tables removed"),
            Err(error) => warn!(%error, "could not remove the handover tables"),
        }
        self.applied = Some(Rules::default());
    }
}

/// The IPs whose drain window ended between the tables `before` and `now`: drained before,
/// not now, and neither held (`holds`) nor forwarded now. A drain that ends while this node
/// holds or forwards the IP again is the IP coming back (its index, with the forward, may
/// arrive before the shard with its line), not a window's end. Pure.
fn window_ends(before: &Rules, now: &Rules, holds: impl Fn(IpAddr) -> bool) -> BTreeSet<IpAddr> {
    before
        .draining
        .iter()
        .copied()
        .filter(|ip| {
            !now.draining.contains(ip) && !holds(*ip) && !now.forwards.iter().any(|(f, ..)| f == ip)
        })
        .collect()
}

/// Counts, off the loop, the established connections to `ended` (IPs whose drain window
/// just ended) and records them.
fn count_cut(ended: BTreeSet<IpAddr>, metrics: HandoverMetrics) {
    tokio::task::spawn_blocking(move || match conntrack::established_to(&ended) {
        Ok(counts) => {
            for (ip, n) in counts {
                metrics.record_cut(n);
                if n > 0 {
                    warn!(%ip, connections = n, "drain window over: established connections still open through this node break now (aliaslb_agent_handover_connections_cut_total)");
                } else {
                    info!(%ip, "drain window over: no established connection left through this node");
                }
            }
        }
        Err(error) => {
            warn!(%error, ips = ?ended, "drain window over: could not count the connections still open (conntrack dump)");
        }
    });
}

/// The interface whose own subnet holds `ip` (the longest prefix).
fn interface_of(interfaces: &[InterfaceReport], ip: IpAddr) -> Option<String> {
    interfaces
        .iter()
        .flat_map(|i| i.subnets.iter().map(move |net| (net, &i.name)))
        .filter(|(net, _)| net.contains(&ip))
        .max_by_key(|(net, _)| net.prefix_len())
        .map(|(_, name)| name.clone())
}

/// Has the kernel resolve `to`'s link-layer address: one empty UDP datagram to its discard
/// port (a forwarded packet waiting on neighbour discovery may wait seconds: the kernel
/// test saw IPv6 flows stall 1-2 s without it).
fn resolve(to: IpAddr) {
    let any = match to {
        IpAddr::V4(_) => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        IpAddr::V6(_) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
    };
    let sent = UdpSocket::bind(SocketAddr::new(any, 0))
        .and_then(|s| s.send_to(&[], SocketAddr::new(to, DISCARD_PORT)));
    if let Err(error) = sent {
        debug!(%to, %error, "could not send the datagram resolving a forward target");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn interface(name: &str, subnet: &str) -> InterfaceReport {
        InterfaceReport {
            name: name.into(),
            subnets: vec![subnet.parse().unwrap()],
            mac: None,
            addresses: Vec::new(),
        }
    }

    #[test]
    fn a_forward_goes_on_the_interface_of_its_target_subnet() {
        let interfaces = vec![
            interface("eth0", "10.0.0.0/16"),
            interface("eth1", "10.0.5.0/24"),
        ];
        assert_eq!(
            interface_of(&interfaces, "10.0.5.9".parse().unwrap()).as_deref(),
            Some("eth1")
        );
        assert_eq!(
            interface_of(&interfaces, "10.0.9.9".parse().unwrap()).as_deref(),
            Some("eth0")
        );
        assert_eq!(interface_of(&interfaces, "fd00::1".parse().unwrap()), None);
    }

    #[test]
    fn a_drain_ends_with_its_window_not_when_the_ip_comes_back() {
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let c: IpAddr = "10.0.0.3".parse().unwrap();
        let before = Rules {
            forwards: Vec::new(),
            draining: vec![a, b, c],
        };
        // c comes back with a forward to the node that drains it now (the index first).
        let now = Rules {
            forwards: vec![(c, vec![80], "10.0.0.9".parse().unwrap(), "eth0".into())],
            draining: vec![],
        };
        // b comes back as a held IP; a's window is over.
        assert_eq!(window_ends(&before, &now, |ip| ip == b), [a].into());
        assert!(window_ends(&before, &before, |_| false).is_empty());
    }
}
