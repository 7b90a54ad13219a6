//! aliaslb-agent as a library; `main.rs` wires the pieces together.
//!
//! Grouped by concern, one folder each where a concern has several parts.
//!
//! Kernel side (free of Kubernetes types):
//! - `host`: the node's links/addresses/default routes as data; interface choice;
//!   the interfaces-with-subnets report. Pure.
//! - `kernel/`: the seam to the kernel: `backend` (the [`kernel::backend::AddressBackend`]
//!   trait: snapshot, add, delete, refresh; [`kernel::backend::Timed`] bounds every call)
//!   and `netlink`, the only module touching rtnetlink (the real backend, the ownership
//!   marker, the change notifications).
//! - `aliases`: [`aliases::AliasManager`], the reconcile loop state; pure `plan`.
//! - `l2/`: L2 mode on the LAN: `announce` (GARP / unsolicited NA frames and bursts),
//!   `lan` (the LAN seen through ARP/NDP: the [`l2::lan::LanPort`] seam and its types, ARP
//!   probe / DAD NS frames and the claim parser, and [`l2::lan::LanWatch`], the AF_PACKET
//!   sockets that watch for claims, probe and defend), `guard` (the conflict guard: probe
//!   first claims, yield, defend, report; pure).
//! - `l3/`: L3 mode: the reading of the routing daemon into the report, the ARP sysctl
//!   check, the fence that withdraws routed addresses while cut off from the API, and
//!   `routing` (the read-only view of BIRD 2's control socket and FRR's `vtysh`: BGP
//!   sessions and the host routes exported to them).
//! - `shield/`: the host-port shield (an LB IP opens only its Services' ports): the
//!   nftables table as data, its updates, and the [`shield::ShieldBackend`] seam (pure but
//!   for [`shield::Shield`], which drives the backend); `nft`, the only module running
//!   `nft`: the real shield backend.
//! - `node`: the run loop over all of the above, generic over the backends.
//!
//! Kubernetes side:
//! - `assignments`: the watch of this node's assignment object (written only by the
//!   controller), turned into the desired set for this node.
//! - `lease`: the heartbeat Lease and the report it carries.
//!
//! Plumbing: `config` (flags), `metrics`, `http` (`/metrics`, `/healthz`, `/readyz`),
//! `telemetry` (logging).

pub mod aliases;
pub mod assignments;
pub mod config;
pub mod host;
pub mod http;
pub mod kernel;
pub mod l2;
pub mod l3;
pub mod lease;
pub mod metrics;
pub mod node;
pub mod shield;
pub mod telemetry;
