//! The LAN as the agent sees it: who claims an IP with ARP or neighbour discovery.
//!
//! Types shared by the conflict guard (which decides: probe, yield, defend, report) and the
//! AF_PACKET I/O (which only observes and sends). Contract:
//! - [`LanClaim`]: one frame from another host that claims or answers for an IP: an ARP
//!   request or reply whose sender IP is it (a gratuitous ARP, an answer to a probe), an
//!   ARP probe for it (sender IP 0.0.0.0, RFC 5227 §2.1.1), a neighbour advertisement
//!   for it as target, a DAD neighbour solicitation for it (source `::`, RFC 4862 §5.4.3).
//!   Frames sent from the node's own MACs are never reported.
//! - [`ProbeOutcome`]: the result of probing one IP before a first claim.
//!
//! Below the contract: [`frame`] builds the probe frames and parses claims (pure), and
//! [`watch`] is the AF_PACKET implementation of [`LanPort`], [`LanWatch`] (I/O).

use std::collections::BTreeMap;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::time::{Duration, Instant};

use aliaslb_core::mac::Mac;

pub mod frame;
pub mod watch;

pub use frame::{arp_probe_frame, dad_ns_frame, parse_claim};
pub use watch::LanWatch;

/// What the frame said about the IP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimKind {
    /// The sender uses the IP: an ARP request/reply with it as sender IP, or an NA for it
    /// (solicited or not).
    Uses,
    /// The sender probes for the IP (ARP probe from 0.0.0.0, DAD NS from `::`): it wants
    /// it, it does not use it yet.
    Probes,
}

/// One claim seen on the LAN from another MAC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LanClaim {
    /// The IP claimed or answered for.
    pub ip: IpAddr,
    /// The Ethernet address that claims it (the ARP sender hardware address, the NA's
    /// target link-layer option, else the frame's source).
    pub mac: Mac,
    /// The interface it was seen on.
    pub ifindex: u32,
    /// What it said.
    pub kind: ClaimKind,
    /// When it was received.
    pub at: Instant,
}

/// The result of probing an IP before taking it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeOutcome {
    /// Nobody answered within the probe window.
    Free,
    /// `mac` uses the IP (or probes for it at the same time: RFC 5227 §2.1.1).
    Taken {
        /// Who answered.
        mac: Mac,
    },
}

/// How a first claim is probed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeConfig {
    /// Probes sent (RFC 5227 PROBE_NUM: 3).
    pub count: u32,
    /// Time between probes.
    pub interval: Duration,
    /// Time listened for answers after the last probe.
    pub wait: Duration,
}

impl Default for ProbeConfig {
    /// Three probes 100 ms apart and 200 ms listening after the last: 400 ms added to a
    /// first claim. RFC 5227's timers (1-2 s apart, 2 s after) assume a host joining a
    /// network once; a load balancer's first claim waits on a person, and a LAN answers in
    /// well under a millisecond.
    fn default() -> Self {
        ProbeConfig {
            count: 3,
            interval: Duration::from_millis(100),
            wait: Duration::from_millis(200),
        }
    }
}

impl ProbeConfig {
    /// Two probes 15 ms apart and 30 ms listening: for an IP that someone may be holding
    /// right now and that is unanswered meanwhile (a takeover's LAN check, a re-check of
    /// an IP held before). A LAN answers in well under a millisecond.
    pub fn quick() -> Self {
        ProbeConfig {
            count: 2,
            interval: Duration::from_millis(15),
            wait: Duration::from_millis(30),
        }
    }

    /// How long a probe takes when nobody answers.
    pub fn window(&self) -> Duration {
        self.interval * self.count.saturating_sub(1) + self.wait
    }
}

/// A LAN operation that failed.
#[derive(Debug, thiserror::Error)]
pub enum LanError {
    /// An AF_PACKET socket could not be opened on the interface (no `CAP_NET_RAW`?).
    #[error("cannot open an AF_PACKET socket on interface {ifindex}: {source}")]
    Socket {
        /// The interface.
        ifindex: u32,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// A frame could not be sent or received.
    #[error("cannot send or receive on interface {ifindex}: {source}")]
    Io {
        /// The interface.
        ifindex: u32,
        /// The error.
        #[source]
        source: io::Error,
    },
}

/// The result of [`LanPort::probe_many`].
pub type ProbeResults = Result<BTreeMap<IpAddr, ProbeOutcome>, LanError>;

/// A boxed future that owns what it needs (spawnable).
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// The seam between the conflict guard and the LAN: the real one is AF_PACKET sockets,
/// tests use a fake. Claims seen come out of the receiver handed over when the port is
/// created (a bounded `mpsc::Receiver<LanClaim>`), not through this trait.
pub trait LanPort: Send + Sync + 'static {
    /// The interfaces to listen on, each with this node's MAC on it. Frames sent from any
    /// of these MACs are never reported.
    fn set_interfaces(&self, interfaces: &[(u32, Mac)]);
    /// The IPs whose claims are reported (the IPs held); claims for others are dropped.
    fn set_watched(&self, ips: &[IpAddr]);
    /// Probes `ips` on interface `ifindex` from `mac` (ARP probe from 0.0.0.0 for IPv4, a
    /// DAD neighbour solicitation from `::` for IPv6), all in one window of
    /// [`ProbeConfig::window`]; every IP gets an outcome.
    fn probe_many(
        &self,
        ifindex: u32,
        mac: Mac,
        ips: Vec<IpAddr>,
        config: ProbeConfig,
    ) -> BoxFuture<ProbeResults>;
    /// Sends one announcement of `ip` at `mac` on `ifindex` (a gratuitous ARP or an
    /// unsolicited NA): the RFC 5227 §2.4 (b) defence.
    fn defend(&self, ifindex: u32, mac: Mac, ip: IpAddr) -> Result<(), LanError>;
}
