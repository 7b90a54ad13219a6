//! The LAN as the agent sees it: who claims an IP with ARP or neighbour discovery.
//!
//! Types shared by the conflict guard (which decides: probe, yield, defend, report) and the
//! AF_PACKET I/O (which only observes and sends). Contract:
//! - [`Observed`]: one frame from another host that claims or answers for an IP: an ARP
//!   request or reply whose sender IP is it (a gratuitous ARP, an answer to a probe), an
//!   ARP probe for it (sender IP 0.0.0.0, RFC 5227 §2.1.1), a neighbour advertisement
//!   for it as target, a DAD neighbour solicitation for it (source `::`, RFC 4862 §5.4.3).
//!   Frames sent from the node's own MACs are never reported.
//! - [`ProbeOutcome`]: the result of probing one IP before a first claim.

use std::net::IpAddr;
use std::time::{Duration, Instant};

use aliaslb_core::mac::Mac;

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
pub struct Observed {
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
    /// How long a probe takes when nobody answers.
    pub fn window(&self) -> Duration {
        self.interval * self.count.saturating_sub(1) + self.wait
    }
}
