//! aliaslb-agent as a library; `main.rs` wires the parts together.
//!
//! One folder per part where a part has several files; each part owns its state, its
//! tasks and its metrics (`<part>/metrics.rs`), behind a small seam the run loop wires.
//!
//! Kernel side (free of Kubernetes types):
//! - `host`: the node's links/addresses/default routes as data; interface choice;
//!   the interfaces-with-subnets report. Pure.
//! - `kernel/`: the seam to the kernel: `backend` (the [`kernel::backend::AddressBackend`]
//!   trait: snapshot, add, delete, refresh; [`kernel::backend::Timed`] bounds every call)
//!   and `netlink`, the only module touching rtnetlink (the real backend, the ownership
//!   marker, the change notifications).
//! - `desired`: [`desired::DesiredSet`], what this node must carry (pure data).
//! - `aliases/`: [`aliases::AliasManager`], the aliases on the node: observe, pure `plan`,
//!   apply the difference; lifetimes; the shield's elements.
//! - `l2/`: L2 mode on the LAN: `announce` (GARP / unsolicited NA frames and bursts),
//!   `lan` (the LAN seen through ARP/NDP: the [`l2::lan::LanPort`] seam and its types, ARP
//!   probe / DAD NS frames and the claim parser, and [`l2::lan::LanWatch`], the AF_PACKET
//!   sockets that watch for claims, probe and defend), `guard/` (the LAN guard: probe
//!   first claims, yield, defend, report: pure `rules` and the [`l2::guard::LanGuard`]
//!   that does what they ask), `failover/` (fast failover: the standby's and the holder's
//!   rules, the adverts on the wire, [`l2::failover::FastFailover`]), `vmac` (the
//!   macvlans of virtual MACs).
//! - `l3/`: L3 mode: the reading of the routing daemon into the report, the ARP sysctl
//!   check, the withdrawal of the routed addresses while cut off from the API
//!   ([`l3::Routed`]), and `routing` (the read-only view of BIRD 2's control socket and
//!   FRR's `vtysh`: BGP sessions and the host routes exported to them).
//! - `shield/`: the host-port shield (an LB IP opens only its Services' ports): the
//!   nftables table as data, its updates, and the [`shield::ShieldBackend`] seam (pure but
//!   for [`shield::Shield`], which drives the backend); `nft`, the only module running
//!   `nft`: the real shield backend.
//! - `handover/`: planned moves keep established connections (issue 45): the nftables
//!   tables that forward a moved IP's unknown TCP flows to the node it came from and keep
//!   a draining IP silent, driven by the run loop from the index's `handovers` lines
//!   (for the controller's `--drain-window`, on by default).
//! - `run/`: the run loop ([`run::Agent`]) wiring all of the above, generic over the
//!   backends; `report` gathers the report the Lease carries.
//!
//! Kubernetes side:
//! - `assignments`: the watch of this node's assignment objects (written only by the
//!   controller), turned into the desired set for this node.
//! - `heartbeat/`: the Lease, renewed, and the report it carries; the authority.
//!
//! Plumbing: `config` (flags), `metrics` (the one registry the parts register in), `http`
//! (`/metrics`, `/healthz`, `/readyz`), `telemetry` (logging).

pub mod aliases;
pub mod assignments;
pub mod config;
pub mod desired;
pub mod handover;
pub mod heartbeat;
pub mod host;
pub mod http;
pub mod kernel;
pub mod l2;
pub mod l3;
pub mod metrics;
pub mod run;
pub mod shield;
pub mod telemetry;
