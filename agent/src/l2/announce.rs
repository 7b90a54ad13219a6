//! Announcing aliases to the L2 segment: gratuitous ARP (IPv4) and unsolicited neighbour
//! advertisements (IPv6), sent once at once and then in a burst.
//!
//! Frames are built by hand by small pure functions (golden-byte tested); sending does
//! I/O through AF_PACKET sockets opened by `pnet_datalink` (a safe API: no unsafe here):
//! one blocking thread sends every queued frame through one socket per interface per
//! round.
//!
//! IPv4 uses an ARP *request* with sender = target = VIP to broadcast (RFC 5227 "ARP
//! Announcement", what `arping -U` and the kernel's own `arp_notify` send): every host
//! that caches the VIP updates it, and, unlike an unsolicited reply, it is not dropped by
//! stacks that only accept replies to requests they made.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pnet_datalink::{Channel, DataLinkSender, NetworkInterface};
use tokio::sync::oneshot;
use tokio::task::AbortHandle;
use tracing::{debug, warn};

use crate::host::Alias;

/// Length of a gratuitous ARP frame (Ethernet + ARP, no padding: the NIC pads).
pub const GARP_FRAME_LEN: usize = 42;
/// Length of an unsolicited NA frame (Ethernet + IPv6 + NA with target link-layer option).
pub const NA_FRAME_LEN: usize = 86;

const ETHERTYPE_ARP: [u8; 2] = [0x08, 0x06];
const ETHERTYPE_IPV6: [u8; 2] = [0x86, 0xdd];
const BROADCAST: [u8; 6] = [0xff; 6];
/// Ethernet address of ff02::1 (33:33 + low 32 bits).
const ALL_NODES_MAC: [u8; 6] = [0x33, 0x33, 0, 0, 0, 1];
const ALL_NODES: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);
const ICMPV6: u8 = 58;
const ICMPV6_NEIGHBOR_ADVERT: u8 = 136;
/// NA flags: Override set, Router and Solicited clear (RFC 4861 §4.4, §7.2.6).
const NA_FLAG_OVERRIDE: u8 = 0x20;
/// ND option: target link-layer address, length in units of 8 bytes.
const ND_OPT_TARGET_LL: u8 = 2;

/// A gratuitous ARP request announcing that `ip` is at `mac`.
pub fn garp_frame(mac: [u8; 6], ip: Ipv4Addr) -> [u8; GARP_FRAME_LEN] {
    arp_request_frame(mac, ip, ip)
}

/// A broadcast ARP request from `mac` with sender IP `sender` for `target`: a gratuitous
/// ARP (sender = target) or, with sender 0.0.0.0, an RFC 5227 probe.
pub(crate) fn arp_request_frame(
    mac: [u8; 6],
    sender: Ipv4Addr,
    target: Ipv4Addr,
) -> [u8; GARP_FRAME_LEN] {
    let mut f = [0u8; GARP_FRAME_LEN];
    f[0..6].copy_from_slice(&BROADCAST);
    f[6..12].copy_from_slice(&mac);
    f[12..14].copy_from_slice(&ETHERTYPE_ARP);
    // htype Ethernet, ptype IPv4, hlen 6, plen 4, operation request.
    f[14..22].copy_from_slice(&[0, 1, 0x08, 0x00, 6, 4, 0, 1]);
    f[22..28].copy_from_slice(&mac);
    f[28..32].copy_from_slice(&sender.octets());
    // Target hardware address stays zero (unknown, as in a request).
    f[38..42].copy_from_slice(&target.octets());
    f
}

/// An unsolicited neighbour advertisement for `ip` at `mac`, from `ip` to ff02::1, hop
/// limit 255 (receivers drop ND with any other), Override set, with the target
/// link-layer address option.
pub fn unsolicited_na_frame(mac: [u8; 6], ip: Ipv6Addr) -> [u8; NA_FRAME_LEN] {
    let mut f = [0u8; NA_FRAME_LEN];
    f[0..6].copy_from_slice(&ALL_NODES_MAC);
    f[6..12].copy_from_slice(&mac);
    f[12..14].copy_from_slice(&ETHERTYPE_IPV6);
    let payload_len: u16 = 32;
    // Version 6, traffic class 0, flow label 0.
    f[14] = 0x60;
    f[18..20].copy_from_slice(&payload_len.to_be_bytes());
    f[20] = ICMPV6;
    f[21] = 255;
    f[22..38].copy_from_slice(&ip.octets());
    f[38..54].copy_from_slice(&ALL_NODES.octets());
    let icmp = &mut f[54..86];
    icmp[0] = ICMPV6_NEIGHBOR_ADVERT;
    icmp[4] = NA_FLAG_OVERRIDE;
    icmp[8..24].copy_from_slice(&ip.octets());
    icmp[24] = ND_OPT_TARGET_LL;
    icmp[25] = 1;
    icmp[26..32].copy_from_slice(&mac);
    let sum = icmpv6_checksum(ip, ALL_NODES, &f[54..86]);
    f[56..58].copy_from_slice(&sum.to_be_bytes());
    f
}

/// The announcement frame for `ip` at `mac`, by family.
pub fn announcement_frame(mac: [u8; 6], ip: IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(v4) => garp_frame(mac, v4).to_vec(),
        IpAddr::V6(v6) => unsolicited_na_frame(mac, v6).to_vec(),
    }
}

/// RFC 4443 §2.3 checksum over the IPv6 pseudo-header and `message` (whose checksum
/// field must be zero).
pub fn icmpv6_checksum(src: Ipv6Addr, dst: Ipv6Addr, message: &[u8]) -> u16 {
    let len = u32::try_from(message.len()).unwrap_or(u32::MAX);
    let mut sum: u32 = 0;
    let mut add = |bytes: &[u8]| {
        for chunk in bytes.chunks(2) {
            let hi = u32::from(chunk[0]) << 8;
            let lo = chunk.get(1).copied().map_or(0, u32::from);
            sum = sum.wrapping_add(hi | lo);
        }
    };
    add(&src.octets());
    add(&dst.octets());
    add(&len.to_be_bytes());
    add(&[0, 0, 0, ICMPV6]);
    add(message);
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    // The loop above folded `sum` into 16 bits.
    !(u16::try_from(sum).unwrap_or(u16::MAX))
}

/// Why a frame could not be sent.
#[derive(Debug, thiserror::Error)]
pub enum AnnounceError {
    /// The AF_PACKET socket could not be opened or bound to the interface.
    #[error("cannot open a packet socket on interface index {ifindex}: {source}")]
    Socket {
        /// Interface index.
        ifindex: u32,
        /// Cause.
        #[source]
        source: io::Error,
    },
    /// The frame could not be sent.
    #[error("cannot send on interface index {ifindex}: {source}")]
    Send {
        /// Interface index.
        ifindex: u32,
        /// Cause.
        #[source]
        source: io::Error,
    },
}

/// Sends one raw Ethernet `frame` on the interface `ifindex` (of the calling thread's
/// network namespace), through a socket opened for it and closed after.
pub fn send_frame(ifindex: u32, frame: &[u8]) -> Result<(), AnnounceError> {
    let mut tx = open_sender(ifindex)?;
    send_on(tx.as_mut(), ifindex, frame)
}

/// The interface `ifindex` as `pnet_datalink` opens it: by index alone (the name, MAC
/// and addresses are not needed to bind a socket).
pub fn link(ifindex: u32) -> NetworkInterface {
    NetworkInterface {
        name: String::new(),
        description: String::new(),
        index: ifindex,
        mac: None,
        ips: Vec::new(),
        flags: 0,
    }
}

/// Opens an AF_PACKET socket bound to `ifindex` for sending raw Ethernet frames.
///
/// Such a socket also receives a copy of every frame on the link (pnet binds it to
/// ETH_P_ALL) for as long as it is open: it is kept only for one round of sends.
fn open_sender(ifindex: u32) -> Result<Box<dyn DataLinkSender>, AnnounceError> {
    let iface = link(ifindex);
    let config = pnet_datalink::Config {
        promiscuous: false,
        write_timeout: Some(Duration::from_millis(200)),
        ..Default::default()
    };
    let socket = |source| AnnounceError::Socket { ifindex, source };
    match pnet_datalink::channel(&iface, config).map_err(socket)? {
        Channel::Ethernet(tx, _rx) => Ok(tx),
        _ => Err(socket(io::Error::other(
            "pnet_datalink returned a non-Ethernet channel",
        ))),
    }
}

/// Linux ENOBUFS: the link's queueing discipline dropped the frame (`packet_snd` returns
/// `net_xmit_errno(NET_XMIT_DROP)`), e.g. its queue is full during a large round.
const ENOBUFS: i32 = 105;

/// Sends `frame` on an open socket; a frame dropped by a full queue is retried twice
/// after 1 ms, the time for the queue to drain a little.
pub(crate) fn send_on(
    tx: &mut dyn DataLinkSender,
    ifindex: u32,
    frame: &[u8],
) -> Result<(), AnnounceError> {
    let mut attempt = 0;
    loop {
        match tx.send_to(frame, None).unwrap_or(Ok(())) {
            Err(e) if e.raw_os_error() == Some(ENOBUFS) && attempt < 2 => {
                attempt += 1;
                std::thread::sleep(Duration::from_millis(1));
            }
            result => return result.map_err(|source| AnnounceError::Send { ifindex, source }),
        }
    }
}

/// Burst settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AnnounceConfig {
    /// Frames sent after the first one.
    pub repeats: u32,
    /// Pause between two frames.
    pub interval: Duration,
}

impl Default for AnnounceConfig {
    /// One frame at once, then one every second for 5 s.
    fn default() -> Self {
        AnnounceConfig {
            repeats: 5,
            interval: Duration::from_secs(1),
        }
    }
}

/// A frame waiting for the sender thread, and where its outcome goes.
#[derive(Debug)]
struct Job {
    ifindex: u32,
    frame: Arc<Vec<u8>>,
    done: oneshot::Sender<Result<(), AnnounceError>>,
}

/// Frames waiting to be sent, and whether a sender thread is draining them.
#[derive(Debug, Default)]
struct Outbox {
    jobs: Vec<Job>,
    draining: bool,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Queues `frame` for `ifindex` and starts a sender thread if none runs; the receiver
/// gets the outcome.
///
/// Opening an AF_PACKET socket is cheap but closing one waits for an RCU grace period
/// (`synchronize_net` in `packet_release`), milliseconds each: one socket per frame made
/// the first frame for the last of 1,000 new aliases leave 0.5-1 s after the first. One
/// thread instead sends everything queued through one socket per interface per round, on
/// the blocking pool (never on the runtime's workers).
fn submit(
    outbox: &Arc<Mutex<Outbox>>,
    ifindex: u32,
    frame: Arc<Vec<u8>>,
) -> oneshot::Receiver<Result<(), AnnounceError>> {
    let (done, outcome) = oneshot::channel();
    let start = {
        let mut o = lock(outbox);
        o.jobs.push(Job {
            ifindex,
            frame,
            done,
        });
        !std::mem::replace(&mut o.draining, true)
    };
    if start {
        let outbox = outbox.clone();
        tokio::task::spawn_blocking(move || drain(&outbox));
    }
    outcome
}

/// Sends rounds of queued frames until the queue is empty. Emptiness and the end of the
/// drain are decided under one lock, so a frame queued meanwhile either joins the next
/// round or starts a new drain.
fn drain(outbox: &Mutex<Outbox>) {
    /// Lets a later frame start a new drain if this one panics (the frames of the round
    /// in flight then report failure: their senders are dropped).
    struct Unwinding<'a>(&'a Mutex<Outbox>);
    impl Drop for Unwinding<'_> {
        fn drop(&mut self) {
            if std::thread::panicking() {
                lock(self.0).draining = false;
            }
        }
    }
    let _unwinding = Unwinding(outbox);
    loop {
        let jobs = {
            let mut o = lock(outbox);
            if o.jobs.is_empty() {
                o.draining = false;
                return;
            }
            std::mem::take(&mut o.jobs)
        };
        send_round(jobs);
    }
}

/// Sends `jobs` through one socket per interface and reports each outcome.
fn send_round(jobs: Vec<Job>) {
    let mut by_link: BTreeMap<u32, Vec<Job>> = BTreeMap::new();
    for job in jobs {
        by_link.entry(job.ifindex).or_default().push(job);
    }
    for (ifindex, jobs) in by_link {
        match open_sender(ifindex) {
            Ok(mut tx) => {
                for job in jobs {
                    let result = send_on(tx.as_mut(), ifindex, &job.frame);
                    // The burst was cancelled meanwhile: nobody waits for the outcome.
                    let _ = job.done.send(result);
                }
            }
            Err(e) => {
                for job in jobs {
                    let _ = job.done.send(Err(e.duplicate()));
                }
            }
        }
    }
}

impl AnnounceError {
    /// The same error, for each of the frames one failed socket concerned.
    fn duplicate(&self) -> Self {
        let copy = |e: &io::Error| match e.raw_os_error() {
            Some(code) => io::Error::from_raw_os_error(code),
            None => io::Error::new(e.kind(), e.to_string()),
        };
        match self {
            AnnounceError::Socket { ifindex, source } => AnnounceError::Socket {
                ifindex: *ifindex,
                source: copy(source),
            },
            AnnounceError::Send { ifindex, source } => AnnounceError::Send {
                ifindex: *ifindex,
                source: copy(source),
            },
        }
    }
}

/// Whether a frame due at `due` and sendable at `now` comes too late to be sent: more than
/// one `interval` behind. A frozen (SIGSTOPped) agent thawed after its aliases expired
/// and their IPs moved on would otherwise send the rest of a burst at once, pointing the
/// LAN at a node that no longer answers for the IP.
fn late(due: std::time::Instant, now: std::time::Instant, interval: Duration) -> bool {
    now.saturating_duration_since(due) > interval
}

/// Sends announcement bursts in background tasks and counts the frames.
#[derive(Debug, Clone)]
pub struct Announcer {
    config: AnnounceConfig,
    outbox: Arc<Mutex<Outbox>>,
    sent: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    bursts: Arc<Mutex<Bursts>>,
}

/// Map size below which finished bursts are not swept.
const MIN_SWEEP: usize = 64;

/// The bursts started, by IP, so a new burst or a removal can stop the running one.
#[derive(Debug)]
struct Bursts {
    running: HashMap<IpAddr, AbortHandle>,
    /// Size at which the next sweep of finished bursts happens.
    sweep_at: usize,
}

impl Default for Bursts {
    fn default() -> Self {
        Bursts {
            running: HashMap::new(),
            sweep_at: MIN_SWEEP,
        }
    }
}

impl Announcer {
    /// An announcer with `config`.
    pub fn new(config: AnnounceConfig) -> Self {
        Announcer {
            config,
            outbox: Arc::default(),
            sent: Arc::default(),
            failed: Arc::default(),
            bursts: Arc::default(),
        }
    }

    /// Starts a burst for `alias` from `mac` (replacing a burst still running for that IP).
    /// Needs a tokio runtime; the frames go out in the calling thread's network namespace.
    pub fn announce(&self, alias: &Alias, mac: [u8; 6]) {
        let frame = Arc::new(announcement_frame(mac, alias.ip));
        let (config, sent, failed) = (self.config, self.sent.clone(), self.failed.clone());
        let outbox = self.outbox.clone();
        let (ip, ifindex, ifname) = (alias.ip, alias.ifindex, alias.ifname.clone());
        let task = tokio::spawn(async move {
            let start = tokio::time::Instant::now();
            for i in 0..=config.repeats {
                if i > 0 {
                    let due = start + config.interval * i;
                    tokio::time::sleep_until(due).await;
                    if late(
                        due.into_std(),
                        tokio::time::Instant::now().into_std(),
                        config.interval,
                    ) {
                        debug!(%ip, interface = %ifname, n = i, "announcement burst ended: this agent was stopped or starved past its schedule, the alias may be gone");
                        return;
                    }
                }
                let result = submit(&outbox, ifindex, frame.clone())
                    .await
                    .unwrap_or_else(|_| {
                        Err(AnnounceError::Send {
                            ifindex,
                            source: io::Error::other("the sender thread stopped"),
                        })
                    });
                match result {
                    Ok(()) => {
                        sent.fetch_add(1, Ordering::Relaxed);
                        debug!(%ip, interface = %ifname, n = i, "announced");
                    }
                    Err(e) => {
                        failed.fetch_add(1, Ordering::Relaxed);
                        warn!(%ip, interface = %ifname, error = %e, "announcement failed");
                    }
                }
            }
        });
        let mut bursts = lock(&self.bursts);
        // Finished bursts are dropped once the map has doubled since the last sweep: a
        // sweep on every call made 1,000 announcements quadratic (a million entries
        // visited; the reconcile calls this synchronously).
        if bursts.running.len() >= bursts.sweep_at {
            bursts.running.retain(|_, h| !h.is_finished());
            bursts.sweep_at = (2 * bursts.running.len()).max(MIN_SWEEP);
        }
        if let Some(old) = bursts.running.insert(ip, task.abort_handle()) {
            old.abort();
        }
    }

    /// Stops the burst for `ip`, if one runs (the alias was removed).
    pub fn cancel(&self, ip: IpAddr) {
        if let Some(h) = lock(&self.bursts).running.remove(&ip) {
            h.abort();
        }
    }

    /// Frames sent since start.
    pub fn frames_sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// Frames that failed to send since start.
    pub fn frames_failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_frame_more_than_an_interval_behind_schedule_is_not_sent() {
        let t0 = std::time::Instant::now();
        let second = Duration::from_secs(1);
        assert!(!late(t0, t0, second));
        assert!(!late(t0, t0 + Duration::from_millis(900), second));
        assert!(!late(t0, t0 + second, second));
        assert!(late(t0, t0 + Duration::from_millis(1_001), second));
        // Thawed 8 s into a 5 s burst: the rest is dropped.
        assert!(late(t0 + 2 * second, t0 + 8 * second, second));
    }
    use super::*;

    const MAC: [u8; 6] = [0x02, 0x11, 0x22, 0x33, 0x44, 0x55];

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn garp_golden_bytes() {
        let f = garp_frame(MAC, Ipv4Addr::new(10, 0, 0, 50));
        assert_eq!(
            hex(&f),
            concat!(
                "ffffffffffff",
                "021122334455",
                "0806",
                "0001080006040001",
                "021122334455",
                "0a000032",
                "000000000000",
                "0a000032"
            )
        );
    }

    #[test]
    fn na_golden_bytes() {
        let f = unsolicited_na_frame(MAC, "fd00::50".parse().unwrap());
        // Checksum 0xf364 computed independently (Python, RFC 4443 pseudo-header).
        assert_eq!(
            hex(&f),
            concat!(
                "333300000001",
                "021122334455",
                "86dd",
                "60000000",
                "0020",
                "3a",
                "ff",
                "fd000000000000000000000000000050",
                "ff020000000000000000000000000001",
                "88",
                "00",
                "f364",
                "20000000",
                "fd000000000000000000000000000050",
                "0201",
                "021122334455"
            )
        );
    }

    #[test]
    fn na_checksum_verifies() {
        let ip: Ipv6Addr = "2001:db8::1:2".parse().unwrap();
        let f = unsolicited_na_frame(MAC, ip);
        // Summing a message with its checksum in place gives 0 after complement.
        assert_eq!(icmpv6_checksum(ip, ALL_NODES, &f[54..86]), 0);
    }

    #[test]
    fn announcement_frame_picks_by_family() {
        assert_eq!(
            announcement_frame(MAC, "10.1.2.3".parse().unwrap()).len(),
            42
        );
        assert_eq!(
            announcement_frame(MAC, "fd00::1".parse().unwrap()).len(),
            86
        );
    }
}
