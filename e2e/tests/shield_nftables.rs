//! The host-port shield end-to-end test of `shield.rs`, every phase, with kube-proxy in
//! **nftables** mode on the lab's nodes (its tables `ip kube-proxy` / `ip6 kube-proxy` beside
//! the agent's `inet aliaslb`): the Service port answers on the LB IP, host ports and NodePorts
//! do not, a Local IP without a local endpoint is dropped, and both rule sets stay in place.
//! Needs root:
//!
//! ```sh
//! cargo build --workspace --bins && cargo test -p aliaslb-e2e --test shield_nftables -- --nocapture
//! ```

mod shield_phases;

use aliaslb_e2e::Error;
use aliaslb_e2e::lab::ProxyMode;

#[test]
fn lb_ips_open_only_their_service_ports_with_nftables_kube_proxy() -> Result<(), Error> {
    shield_phases::run_all(ProxyMode::Nftables)
}
