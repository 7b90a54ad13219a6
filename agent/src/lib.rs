//! aliaslb-agent as a library; `main.rs` wires the pieces together.
//!
//! Kernel side (free of Kubernetes types):
//! - `host`: the node's links/addresses/default routes as data; interface choice;
//!   the interfaces-with-subnets report. Pure.
//! - `backend`: the [`backend::AddressBackend`] trait (snapshot, add, delete, refresh).
//! - `netlink`: the only module touching rtnetlink: the real backend, the ownership
//!   marker, the change notifications.
//! - `aliases`: [`aliases::AliasManager`], the reconcile loop state; pure `plan`.
//! - `announce`: GARP / unsolicited NA frames and bursts.
//! - `lan`: LAN conflict detection's I/O side: the [`lan::LanPort`] seam and its types,
//!   ARP probe / DAD NS frames and the claim parser (pure), and [`lan::LanWatch`], the
//!   AF_PACKET sockets that watch for claims, probe and defend.
//! - `shield`: the host-port shield (an LB IP opens only its Services' ports): the
//!   nftables table as data, its updates, and the [`shield::ShieldBackend`] seam. Pure but
//!   for [`shield::Shield`], which drives the backend.
//! - `nft`: the only module running `nft`: the real shield backend.
//! - `lan`: the LAN seen through ARP/NDP: the [`lan::LanPort`] seam and its types.
//! - `guard`: the conflict guard (probe first claims, yield, defend, report). Pure.
//! - `node`: the run loop over all of the above, generic over the backends.
//! - `routing`: the read-only view of the node's routing daemon (BIRD 2 control socket,
//!   FRR `vtysh`) for L3 pools: BGP sessions and the host routes exported to them.
//!
//! Kubernetes side:
//! - `assignments`: the watch of this node's assignment object (written only by the
//!   controller), turned into the desired set for this node.
//! - `lease`: the heartbeat Lease and the report it carries.
//!
//! Plumbing: `config` (flags), `metrics`, `http` (`/metrics`, `/healthz`, `/readyz`),
//! `telemetry` (logging).

pub mod aliases;
pub mod announce;
pub mod assignments;
pub mod backend;
pub mod config;
pub mod guard;
pub mod host;
pub mod http;
pub mod l3;
pub mod lan;
pub mod lease;
pub mod metrics;
pub mod netlink;
pub mod nft;
pub mod node;
pub mod routing;
pub mod shield;
pub mod telemetry;
