//! The host-port shield over the lab, with the real agents and the real kube-proxy: an LB IP
//! opens only its Services' ports. From the client on the LAN:
//!
//! - the Service answers on its port through the LB IP (ARP -> alias -> kube-proxy DNAT);
//! - a host listener of the holder on `0.0.0.0:2222` and the agent's own `/metrics` on
//!   `:9101` answer on the node IP and get no answer at all on the LB IP;
//! - the Service's NodePort answers on the node IP, not on the LB IP (kube-proxy would DNAT
//!   it: the LB IP is a local address);
//! - an `externalTrafficPolicy: Local` IP held by a node whose endpoint went away is
//!   dropped, silently;
//! - `nft list table inet aliaslb` on the holder lists the IP in `held4` and only the
//!   Service's port in `ports4`.
//!
//! "Unreachable" is a connect timeout (no SYN-ACK, no RST, no ICMP error), checked against
//! a control that a closed port on the node IP is refused, and the shield's `dropped4`
//! counter on the holder must grow by the drop; "reachable" is an actual reply. One lab for
//! the binary, so one test function running the phases in order. Needs root:
//!
//! ```sh
//! cargo build --workspace --bins && cargo test -p aliaslb-e2e --test shield -- --nocapture
//! ```

mod shield_phases;

use aliaslb_e2e::Error;
use aliaslb_e2e::lab::ProxyMode;

#[test]
fn lb_ips_open_only_their_service_ports() -> Result<(), Error> {
    shield_phases::run_all(ProxyMode::Iptables)
}
