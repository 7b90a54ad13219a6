//! Announcing aliases to the L2 segment: gratuitous ARP (IPv4) and unsolicited neighbour
//! advertisements (IPv6), sent once at once and then in a burst.
//!
//! Frames are built by hand by small pure functions (golden-byte tested); sending does
//! I/O through AF_PACKET sockets opened by `pnet_datalink` (a safe API: no unsafe here).
//! One task keeps the schedule of every burst; each round of the frames due goes out from
//! a blocking thread, through one socket per interface.
//!
//! IPv4 uses an ARP *request* with sender = target = VIP to broadcast (RFC 5227 "ARP
//! Announcement", what `arping -U` and the kernel's own `arp_notify` send): every host
//! that caches the VIP updates it, and, unlike an unsolicited reply, it is not dropped by
//! stacks that only accept replies to requests they made.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pnet_datalink::{Channel, DataLinkSender, NetworkInterface};
use tokio::sync::Notify;
use tokio::time::Instant;
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

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One frame of a burst, due now: what the sender thread needs to build and send it.
#[derive(Debug)]
struct Job {
    ip: IpAddr,
    mac: [u8; 6],
    ifindex: u32,
    ifname: Arc<str>,
    /// Its number in the burst (0: the first).
    n: u32,
}

/// Sends `jobs` through one socket per interface, counting each outcome.
///
/// Opening an AF_PACKET socket is cheap but closing one waits for an RCU grace period
/// (`synchronize_net` in `packet_release`), milliseconds each: one socket per frame made
/// the first frame for the last of 1,000 new aliases leave 0.5-1 s after the first. A
/// round instead sends everything due through one socket per interface, on the blocking
/// pool (never on the runtime's workers).
fn send_round(jobs: Vec<Job>, counts: &Counts) {
    let mut by_link: BTreeMap<u32, Vec<Job>> = BTreeMap::new();
    for job in jobs {
        by_link.entry(job.ifindex).or_default().push(job);
    }
    for (ifindex, jobs) in by_link {
        let mut tx = open_sender(ifindex);
        for job in jobs {
            let result = match &mut tx {
                Ok(tx) => send_on(tx.as_mut(), ifindex, &announcement_frame(job.mac, job.ip)),
                Err(e) => Err(e.duplicate()),
            };
            let (ip, ifname, n) = (job.ip, &job.ifname, job.n);
            match result {
                Ok(()) => {
                    counts.sent.fetch_add(1, Ordering::Relaxed);
                    debug!(%ip, interface = %ifname, n, "announced");
                }
                Err(e) => {
                    counts.failed.fetch_add(1, Ordering::Relaxed);
                    warn!(%ip, interface = %ifname, error = %e, "announcement failed");
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

/// The bursts under way: for each IP the frames left, and when the next one is due.
///
/// Plain data, kept by the one task that sends every burst (a task per burst cost about
/// 500 bytes each, 5 MB for the 10,000 bursts of a first sync of 10,000 IPs).
#[derive(Debug, Default)]
struct Schedule {
    bursts: HashMap<IpAddr, Burst>,
    /// Every burst's next frame, by due time (one per IP).
    due: BTreeSet<(Instant, IpAddr)>,
    /// Interface names, for the logs (one per interface, not per burst).
    names: HashMap<u32, Arc<str>>,
}

#[derive(Debug)]
struct Burst {
    mac: [u8; 6],
    ifindex: u32,
    start: Instant,
    /// Frames handed out so far: the number of the next.
    sent: u32,
    /// When its next frame is due (its entry in [`Schedule::due`]).
    next: Instant,
}

impl Schedule {
    /// Starts a burst for `alias` from `mac` at `now`, replacing one under way for its IP.
    fn start(&mut self, alias: &Alias, mac: [u8; 6], now: Instant) {
        self.cancel(alias.ip);
        // Kept per interface index, renamed if the interface was.
        match self.names.get(&alias.ifindex) {
            Some(name) if **name == *alias.ifname => {}
            _ => {
                self.names
                    .insert(alias.ifindex, alias.ifname.as_str().into());
            }
        }
        self.due.insert((now, alias.ip));
        let burst = Burst {
            mac,
            ifindex: alias.ifindex,
            start: now,
            sent: 0,
            next: now,
        };
        self.bursts.insert(alias.ip, burst);
    }

    /// Ends the burst for `ip`, if one is under way.
    fn cancel(&mut self, ip: IpAddr) {
        if let Some(b) = self.bursts.remove(&ip) {
            self.due.remove(&(b.next, ip));
        }
    }

    /// The frames due at `now`, each burst's next one rescheduled; a burst more than an
    /// interval behind its schedule ends instead (its first frame is never late).
    fn take_due(&mut self, now: Instant, config: AnnounceConfig) -> Vec<Job> {
        let mut jobs = Vec::new();
        while let Some(&(at, ip)) = self.due.first() {
            if at > now {
                break;
            }
            self.due.remove(&(at, ip));
            let Some(mut burst) = self.bursts.remove(&ip) else {
                continue;
            };
            let n = burst.sent;
            let ifname = self
                .names
                .get(&burst.ifindex)
                .cloned()
                .unwrap_or_else(|| "?".into());
            if n > 0 && late(at.into_std(), now.into_std(), config.interval) {
                debug!(%ip, interface = %ifname, n, "announcement burst ended: this agent was stopped or starved past its schedule, the alias may be gone");
                continue;
            }
            jobs.push(Job {
                ip,
                mac: burst.mac,
                ifindex: burst.ifindex,
                ifname,
                n,
            });
            burst.sent += 1;
            if burst.sent <= config.repeats {
                burst.next = burst.start + config.interval * burst.sent;
                self.due.insert((burst.next, ip));
                self.bursts.insert(ip, burst);
            }
        }
        jobs
    }

    /// When the next frame is due (`None`: no burst under way).
    fn next_due(&self) -> Option<Instant> {
        self.due.first().map(|(at, _)| *at)
    }
}

/// Frames sent and failed since start.
#[derive(Debug, Default)]
struct Counts {
    sent: AtomicU64,
    failed: AtomicU64,
}

#[derive(Debug)]
struct Shared {
    config: AnnounceConfig,
    /// The schedule, and whether a task is sending it.
    schedule: Mutex<(Schedule, bool)>,
    /// A burst was started: its first frame is due now.
    wake: Notify,
    counts: Arc<Counts>,
}

/// Sends announcement bursts from one background task and counts the frames.
#[derive(Debug, Clone)]
pub struct Announcer {
    shared: Arc<Shared>,
}

impl Announcer {
    /// An announcer with `config`.
    pub fn new(config: AnnounceConfig) -> Self {
        Announcer {
            shared: Arc::new(Shared {
                config,
                schedule: Mutex::default(),
                wake: Notify::new(),
                counts: Arc::default(),
            }),
        }
    }

    /// Starts a burst for `alias` from `mac` (replacing a burst still running for that IP).
    /// Needs a tokio runtime; the frames go out in the calling thread's network namespace.
    pub fn announce(&self, alias: &Alias, mac: [u8; 6]) {
        let start_task = {
            let mut guard = lock(&self.shared.schedule);
            let (schedule, running) = &mut *guard;
            schedule.start(alias, mac, Instant::now());
            !std::mem::replace(running, true)
        };
        if start_task {
            tokio::spawn(send_bursts(self.shared.clone()));
        } else {
            self.shared.wake.notify_one();
        }
    }

    /// Stops the burst for `ip`, if one runs (the alias was removed).
    pub fn cancel(&self, ip: IpAddr) {
        lock(&self.shared.schedule).0.cancel(ip);
    }

    /// Frames sent since start.
    pub fn frames_sent(&self) -> u64 {
        self.shared.counts.sent.load(Ordering::Relaxed)
    }

    /// Frames that failed to send since start.
    pub fn frames_failed(&self) -> u64 {
        self.shared.counts.failed.load(Ordering::Relaxed)
    }
}

/// Sends the frames of every burst as they fall due, a round at a time, until no burst is
/// left. Whether to stop is decided under the schedule's lock, so a burst started
/// meanwhile either is seen here or starts a new task.
async fn send_bursts(shared: Arc<Shared>) {
    loop {
        let now = Instant::now();
        let (jobs, next) = {
            let mut guard = lock(&shared.schedule);
            let (schedule, running) = &mut *guard;
            let jobs = schedule.take_due(now, shared.config);
            let next = schedule.next_due();
            if jobs.is_empty() && next.is_none() {
                *running = false;
                return;
            }
            (jobs, next)
        };
        if !jobs.is_empty() {
            let (count, counts) = (jobs.len() as u64, shared.counts.clone());
            if let Err(e) = tokio::task::spawn_blocking(move || send_round(jobs, &counts)).await {
                shared.counts.failed.fetch_add(count, Ordering::Relaxed);
                warn!(error = %e, frames = count, "an announcement round failed");
            }
            continue;
        }
        if let Some(next) = next {
            tokio::select! {
                () = tokio::time::sleep_until(next) => {}
                () = shared.wake.notified() => {}
            }
        }
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

    fn alias(ip: &str) -> Alias {
        Alias {
            ip: ip.parse().unwrap(),
            ifindex: 2,
            ifname: "eth1".into(),
        }
    }

    /// The (IP, frame number) of each job.
    fn sent(jobs: &[Job]) -> Vec<(String, u32)> {
        jobs.iter().map(|j| (j.ip.to_string(), j.n)).collect()
    }

    const BURST: AnnounceConfig = AnnounceConfig {
        repeats: 2,
        interval: Duration::from_secs(1),
    };

    #[test]
    fn a_burst_is_one_frame_at_once_then_one_per_interval_then_nothing() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let mut s = Schedule::default();
        s.start(&alias("10.0.0.1"), MAC, t0);
        s.start(&alias("fd00::1"), MAC, ms(300));
        assert_eq!(s.next_due(), Some(t0));
        let first = s.take_due(ms(300), BURST);
        assert_eq!(
            sent(&first),
            [("10.0.0.1".into(), 0), ("fd00::1".into(), 0)]
        );
        assert_eq!((first[0].mac, &*first[0].ifname), (MAC, "eth1"));
        assert!(
            s.take_due(ms(999), BURST).is_empty(),
            "nothing due before its interval"
        );
        assert_eq!(s.next_due(), Some(ms(1000)));
        assert_eq!(sent(&s.take_due(ms(1000), BURST)), [("10.0.0.1".into(), 1)]);
        assert_eq!(sent(&s.take_due(ms(1300), BURST)), [("fd00::1".into(), 1)]);
        assert_eq!(
            sent(&s.take_due(ms(2300), BURST)),
            [("10.0.0.1".into(), 2), ("fd00::1".into(), 2)]
        );
        // 1 + 2 repeats each: over.
        assert_eq!(s.next_due(), None);
        assert!(s.bursts.is_empty() && s.take_due(ms(9000), BURST).is_empty());
    }

    #[test]
    fn a_new_burst_replaces_the_running_one_and_a_cancelled_one_sends_nothing_more() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let mut s = Schedule::default();
        s.start(&alias("10.0.0.1"), MAC, t0);
        s.start(&alias("10.0.0.2"), MAC, t0);
        assert_eq!(s.take_due(t0, BURST).len(), 2);
        // Announced again 500 ms in (from another MAC): starts over, one schedule only.
        let other = [0x02, 0, 0, 0, 0, 9];
        s.start(&alias("10.0.0.1"), other, ms(500));
        s.cancel("10.0.0.2".parse().unwrap());
        assert_eq!(s.due.len(), 1);
        let again = s.take_due(ms(500), BURST);
        assert_eq!(sent(&again), [("10.0.0.1".into(), 0)]);
        assert_eq!(again[0].mac, other);
        assert!(
            s.take_due(ms(1000), BURST).is_empty(),
            "the old schedule is gone"
        );
        assert_eq!(sent(&s.take_due(ms(1500), BURST)), [("10.0.0.1".into(), 1)]);
        s.cancel("10.0.0.1".parse().unwrap());
        assert_eq!(s.next_due(), None);
        assert!(s.take_due(ms(9000), BURST).is_empty());
    }

    #[test]
    fn a_burst_more_than_an_interval_behind_ends_but_its_first_frame_always_goes() {
        let t0 = Instant::now();
        let mut s = Schedule::default();
        s.start(&alias("10.0.0.1"), MAC, t0);
        // Taken 8 s late (a frozen agent): the first frame still goes...
        let late_first = s.take_due(t0 + Duration::from_secs(8), BURST);
        assert_eq!(sent(&late_first), [("10.0.0.1".into(), 0)]);
        // ...the second, due at 1 s and more than an interval behind, ends the burst.
        assert!(s.take_due(t0 + Duration::from_secs(8), BURST).is_empty());
        assert_eq!(s.next_due(), None);
        assert!(s.bursts.is_empty());
    }

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
