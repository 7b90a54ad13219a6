//! aliaslb-agent as a library: the kernel side of the agent (aliases over netlink, their
//! lifetimes and ownership, repair, GARP/NA announcements), free of Kubernetes types so
//! `main.rs` wires it to the Service watch and the Lease heartbeat.
//!
//! - `host`: the node's links/addresses/default routes as data; interface choice;
//!   the interfaces-with-subnets report. Pure.
//! - `backend`: the [`backend::AddressBackend`] trait (snapshot, add, delete, refresh).
//! - `netlink`: the only module touching rtnetlink: the real backend, the ownership
//!   marker, the change notifications.
//! - `aliases`: [`aliases::AliasManager`], the reconcile loop state; pure `plan`.
//! - `announce`: GARP / unsolicited NA frames and bursts.
//!
//! The run loop `main.rs` is expected to write:
//!
//! ```no_run
//! # use std::time::Duration;
//! # use aliaslb_agent::{aliases::*, announce::*, backend::Lifetime, netlink::*};
//! # async fn run(mut desired_rx: tokio::sync::watch::Receiver<DesiredSet>) -> Result<(), Box<dyn std::error::Error>> {
//! let mut changes = watch_changes()?;
//! let mut aliases = AliasManager::new(
//!     NetlinkBackend::connect()?,
//!     AliasConfig { interface_override: None, lifetime: Lifetime::for_lease(Duration::from_secs(4)) },
//! )
//! .with_announcer(Announcer::new(AnnounceConfig::default()));
//! let mut renew = tokio::time::interval(Duration::from_secs(1));
//! loop {
//!     tokio::select! {
//!         _ = renew.tick() => { aliases.refresh_lifetimes().await; /* + renew the Lease */ continue; }
//!         _ = changes.recv() => {}
//!         _ = desired_rx.changed() => {}
//!     }
//!     let report = aliases.reconcile(&desired_rx.borrow().clone()).await;
//!     // publish report.conflicts (AddressConflict), aliases.held_ips() in the Lease...
//! #   let _ = report;
//! }
//! # }
//! ```

pub mod aliases;
pub mod announce;
pub mod backend;
pub mod host;
pub mod netlink;
