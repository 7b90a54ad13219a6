//! L2 mode: the LAN side of an alias.
//!
//! - [`announce`]: gratuitous ARP / unsolicited NA frames and bursts.
//! - [`lan`]: the LAN seen through ARP/NDP (the [`lan::LanPort`] seam, the frames, and
//!   [`lan::LanWatch`], the AF_PACKET sockets that watch for claims, probe and defend).
//! - [`guard`]: the LAN guard (probe first claims, yield, defend, report).
//! - [`failover`]: fast failover (adverts between holder and standby, takeovers and
//!   step-downs).
//! - [`returning`]: at start, the LAN asked about the aliases a run before left.
//! - [`vmac`]: the macvlans of virtual-MAC pools.
//! - [`metrics`]: the LAN's metrics (fast failover has its own).

pub mod announce;
pub mod failover;
pub mod guard;
pub mod lan;
pub mod metrics;
pub mod returning;
pub mod vmac;

use tokio::time::Instant;

/// Sleeps until `at`, or for ever without one (a `select!` branch with an optional timer).
pub(crate) async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
