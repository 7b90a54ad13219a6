//! Planned moves keep established connections, the agent's side (issue 45; the
//! controller's side is `aliaslb_controller::handover`, the lines between them the index's
//! `handovers`, [`aliaslb_core::assignment`]). The run loop drives it through [`Handovers`]
//! (`part`), from the lines of the node's index (for the controller's `--drain-window`,
//! 300 s by default; with `0s` there is none and the tables are only lifted at start), and
//! counts the connections a drain ends with ([`conntrack`]). The kernel
//! mechanism is proven by `agent/tests/handover.rs`, the whole by `e2e/tests/handover.rs`.
//!
//! The agent owns three nftables tables named `aliaslb-handover` (families `ip`, `ip6`
//! and `arp`: the `dup` statement has no `inet` form), rewritten whole in one `nft`
//! transaction ([`script`]; [`lift_script`] removes them), and touches nothing else.
//!
//! - **Forward** (`forward=NODE@ADDRESS`: this node got the IP in a planned move): a packet
//!   to the IP and one of its Service TCP ports that conntrack has not seen before
//!   (`ct state new`) and that does not open a connection (no SYN, or RST) belongs to a flow
//!   the node the IP came from still carries: it is copied to that node on the LAN (`dup to
//!   ADDRESS device LAN`: the copy is routed to the address, so it goes to that node's MAC
//!   with the IP still its destination) and dropped here. The dropped packet's conntrack
//!   entry is never confirmed, so every packet of such a flow is `new` here and takes the
//!   same way; a SYN opens a connection on this node as without handovers. The chain hooks
//!   prerouting at priority `mangle - 10` (-160): after conntrack (-200), so the state is
//!   known, and before the host-port shield (mangle) and kube-proxy's DNAT (dstnat, -100,
//!   iptables and nftables modes), which would otherwise take the packet for a new flow.
//!   The old node answers the client directly, with the IP as source.
//! - **Drain** (`draining`: this node left the IP in a planned move): the IP stays a local
//!   address of the node for the window, silenced (no ARP reply for it, no IPv6 neighbour
//!   advertisement: the `arp`/`ip6` tables' `quiet` chains), so the flows its conntrack
//!   carries and the sockets bound to it keep working while the LAN reaches the new holder.
//!   Service traffic does not need it: kube-proxy's DNAT of an established flow lives in
//!   the flow's conntrack entry, so the old holder carries it without the alias (measured
//!   in the lab, `e2e/tests/handover.rs`: the agent removed the alias as today and all 40
//!   connections were answered through it, kube-proxy in iptables and nftables modes).
//!   The silenced alias is for flows that end in a socket on the node itself.
//!
//! The new holder must know the old one's link-layer address before the IP reaches it: in
//! the kernel test the IPv6 copies waiting on neighbour discovery stalled some flows 1-2 s
//! (none broke; TCP retransmitted), none once the neighbour was known.
//!
//! UDP is not forwarded: nothing tells an old UDP flow from a new one, so a UDP flow goes
//! to the new holder as today. Pure but for [`apply`], which runs the script through a
//! [`ShieldBackend`] (the only code running `nft` is `shield::nft`).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::IpAddr;

use aliaslb_core::assignment::Handover;

use crate::shield::{ShieldBackend, ShieldError};

pub mod conntrack;
pub mod metrics;
mod part;

pub use part::Handovers;

/// The name of the agent's three handover tables (`ip`, `ip6`, `arp`).
pub const TABLE: &str = "aliaslb-handover";

/// The prerouting priority of the forward chains: after conntrack, before the shield and
/// kube-proxy's DNAT (see the module docs).
pub const PRIORITY: i32 = -160;

/// What one node does for its handovers, ready to render: each line with the LAN
/// interface of its IP.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rules {
    /// IP, Service TCP ports, the address of the node its unknown flows go to, the LAN
    /// interface.
    pub forwards: Vec<(IpAddr, Vec<u16>, IpAddr, String)>,
    /// The IPs this node drains: kept local, silenced.
    pub draining: Vec<IpAddr>,
}

/// A handover line this node cannot act on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HandoverError {
    /// No LAN interface carries the subnet of the IP here.
    #[error(
        "handover of {ip}: no interface of this node is on its subnet; its flows are not forwarded"
    )]
    NoInterface {
        /// The IP.
        ip: IpAddr,
    },
}

impl Rules {
    /// The rules for `lines`; `interface` names the LAN interface of an IP. A line whose
    /// IP has no interface here is left out and returned as an error (the others apply).
    pub fn from_lines(
        lines: &BTreeMap<IpAddr, Handover>,
        interface: impl Fn(IpAddr) -> Option<String>,
    ) -> (Self, Vec<HandoverError>) {
        let mut rules = Rules::default();
        let mut errors = Vec::new();
        for (ip, line) in lines {
            if line.draining {
                rules.draining.push(*ip);
            }
            let Some(to) = &line.forward else { continue };
            if line.ports.is_empty() {
                continue;
            }
            match interface(*ip) {
                Some(dev) => {
                    rules.forwards.push((
                        *ip,
                        line.ports.iter().copied().collect(),
                        to.address,
                        dev,
                    ));
                }
                None => errors.push(HandoverError::NoInterface { ip: *ip }),
            }
        }
        (rules, errors)
    }
}

/// Removes the handover tables (none there: nothing happens).
pub fn lift_script() -> String {
    let mut out = String::new();
    for family in ["ip", "ip6", "arp"] {
        let _ = writeln!(
            out,
            "add table {family} {TABLE}\ndelete table {family} {TABLE}"
        );
    }
    out
}

/// The whole handover tables for `rules`, replacing any there, as one transaction (no
/// rule at all: the tables removed).
pub fn script(rules: &Rules) -> String {
    let mut out = lift_script();
    let mut forward4 = String::new();
    let mut forward6 = String::new();
    for (ip, ports, to, dev) in &rules.forwards {
        let ports: Vec<String> = ports.iter().map(ToString::to_string).collect();
        let (chain, family) = match ip {
            IpAddr::V4(_) => (&mut forward4, "ip"),
            IpAddr::V6(_) => (&mut forward6, "ip6"),
        };
        let _ = writeln!(
            chain,
            "    {family} daddr {ip} tcp dport {{ {} }} ct state new tcp flags & (syn | rst) != syn counter dup to {to} device \"{}\" drop",
            ports.join(", "),
            dev.escape_default()
        );
    }
    let quiet4: Vec<String> = rules
        .draining
        .iter()
        .filter(|ip| ip.is_ipv4())
        .map(ToString::to_string)
        .collect();
    // The target address of a neighbour advertisement: 16 bytes from the 8th byte of the
    // ICMPv6 header (type, code, checksum, flags).
    let quiet6: String = rules
        .draining
        .iter()
        .filter_map(|ip| match ip {
            IpAddr::V6(v6) => Some(format!(
                "    icmpv6 type nd-neighbor-advert @th,64,128 0x{:032x} drop\n",
                u128::from(*v6)
            )),
            IpAddr::V4(_) => None,
        })
        .collect();
    let forward_chain = |rules: &str| {
        format!(
            "  chain forward {{\n    type filter hook prerouting priority {PRIORITY}; policy accept;\n{rules}  }}\n"
        )
    };
    let quiet_chain = |rules: &str| {
        format!(
            "  chain quiet {{\n    type filter hook output priority 0; policy accept;\n{rules}  }}\n"
        )
    };
    if !forward4.is_empty() {
        let _ = write!(out, "table ip {TABLE} {{\n{}}}\n", forward_chain(&forward4));
    }
    if !forward6.is_empty() || !quiet6.is_empty() {
        let mut body = String::new();
        if !forward6.is_empty() {
            body.push_str(&forward_chain(&forward6));
        }
        if !quiet6.is_empty() {
            body.push_str(&quiet_chain(&quiet6));
        }
        let _ = write!(out, "table ip6 {TABLE} {{\n{body}}}\n");
    }
    if !quiet4.is_empty() {
        let rule = format!(
            "    arp operation reply arp saddr ip {{ {} }} drop\n",
            quiet4.join(", ")
        );
        let _ = write!(out, "table arp {TABLE} {{\n{}}}\n", quiet_chain(&rule));
    }
    out
}

/// Writes the handover tables for `rules` (or removes them when there is none).
pub async fn apply<S: ShieldBackend>(nft: &S, rules: &Rules) -> Result<(), ShieldError> {
    nft.apply(&script(rules)).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use aliaslb_core::assignment::Peer;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn line(ports: &[u16], forward: Option<&str>, draining: bool) -> Handover {
        Handover {
            ports: ports.iter().copied().collect(),
            forward: forward.map(|a| Peer {
                node: "old".into(),
                address: ip(a),
            }),
            draining,
        }
    }

    #[test]
    fn forwards_and_drains_become_one_transaction_per_family() {
        let mut lines = BTreeMap::new();
        lines.insert(ip("10.0.0.10"), line(&[443, 80], Some("10.0.0.2"), false));
        lines.insert(ip("10.0.0.11"), line(&[5432], None, true));
        lines.insert(ip("fd00::10"), line(&[80], Some("fd00::2"), true));
        lines.insert(ip("192.168.9.9"), line(&[80], Some("192.168.9.2"), false));
        // A line without TCP ports forwards nothing.
        lines.insert(ip("10.0.0.12"), line(&[], Some("10.0.0.2"), false));
        let (rules, errors) = Rules::from_lines(&lines, |ip| {
            (!ip.to_string().starts_with("192.")).then(|| "eth1".to_owned())
        });
        assert_eq!(
            errors,
            vec![HandoverError::NoInterface {
                ip: ip("192.168.9.9")
            }]
        );
        assert!(errors[0].to_string().contains("not forwarded"));
        let text = script(&rules);
        assert!(text.starts_with(&lift_script()), "{text}");
        assert!(
            text.contains(
                "table ip aliaslb-handover {\n  chain forward {\n    type filter hook prerouting priority -160; policy accept;\n    ip daddr 10.0.0.10 tcp dport { 80, 443 } ct state new tcp flags & (syn | rst) != syn counter dup to 10.0.0.2 device \"eth1\" drop\n  }\n}\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("ip6 daddr fd00::10 tcp dport { 80 } ct state new tcp flags & (syn | rst) != syn counter dup to fd00::2 device \"eth1\" drop"),
            "{text}"
        );
        assert!(
            text.contains(
                "icmpv6 type nd-neighbor-advert @th,64,128 0xfd000000000000000000000000000010 drop"
            ),
            "{text}"
        );
        assert!(
            text.contains("arp operation reply arp saddr ip { 10.0.0.11 } drop"),
            "{text}"
        );
        assert!(!text.contains("10.0.0.12 tcp"), "{text}");
        assert!(!text.contains("192.168.9.9"), "{text}");
        // Nothing to do: the tables are removed, nothing written.
        assert_eq!(script(&Rules::default()), lift_script());
    }
}
