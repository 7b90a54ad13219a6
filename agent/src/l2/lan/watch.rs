//! The real [`LanPort`]: AF_PACKET sockets that watch the links for claims, probe before a
//! first claim and send a defence. Does I/O (sockets, threads); the decisions are the
//! conflict guard's, the frames and their parsing [`super::frame`]'s.
//!
//! Costs. An AF_PACKET socket bound with `ETH_P_ALL` gets a copy of every frame on its
//! link, in and out, data traffic to the LB IPs included: read in user space, that is a
//! wake-up and a copy per packet, and a receive queue that a busy link fills with data
//! while the one ARP that matters is dropped. So each socket carries a classic BPF filter
//! ([`CLAIM_FILTER`]) that the kernel runs per frame (at most 8 instructions) and that
//! keeps only ARP and ICMPv6 neighbour solicitations/advertisements: user space sees the
//! ND/ARP rate of the link, not its packet rate (500 UDP datagrams: 2-3 frames reached
//! user space in the netns test, 359 without the filter). Every frame that passes is still checked by
//! ethertype before parsing, then parsed, and dropped unless it claims a watched IP from
//! a MAC not this node's.
//!
//! One receiving socket (and one thread, blocked in `poll` for at most [`READ_TIMEOUT`]
//! so it notices a stop) per watched interface; a probe opens its own socket for its
//! window; a defence goes out through the interface's watching socket (or, if it has
//! none, [`announce::send_frame`]). Sockets and threads are created in the calling
//! thread's network namespace.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::io;
use std::net::IpAddr;
use std::os::fd::IntoRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use aliaslb_core::mac::Mac;
use pnet_datalink::{Channel, DataLinkReceiver, DataLinkSender};
use socket2::{Domain, SockFilter, Socket, Type};
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, info, warn};

use super::frame::{
    ETHERTYPE_ARP, ETHERTYPE_IPV6, arp_probe_frame, dad_ns_frame, ethernet_source, ethertype,
    parse_claim,
};
use super::{BoxFuture, LanClaim, LanError, LanPort, ProbeConfig, ProbeOutcome, ProbeResults};
use crate::l2::announce::{self, AnnounceError};

/// How long a watching thread blocks before it looks whether it should stop.
pub const READ_TIMEOUT: Duration = Duration::from_millis(100);
/// How long a probe blocks in a read: bounds how late a probe frame leaves.
const PROBE_READ_TIMEOUT: Duration = Duration::from_millis(5);
/// Longest pause between two attempts to reopen a watching socket that failed.
const MAX_REOPEN_BACKOFF: Duration = Duration::from_secs(2);

/// The kernel-side filter on every socket here (classic BPF, `SO_ATTACH_FILTER`): ARP
/// frames, and IPv6 frames whose next header is ICMPv6 and whose ICMPv6 type is 135 (NS)
/// or 136 (NA); everything else is dropped before it is queued. Offsets are in the
/// Ethernet frame; a load past its end drops it.
pub const CLAIM_FILTER: [SockFilter; 10] = {
    const LDH_ABS: u16 = 0x28; // BPF_LD | BPF_H | BPF_ABS
    const LDB_ABS: u16 = 0x30; // BPF_LD | BPF_B | BPF_ABS
    const JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
    const RET_K: u16 = 0x06; // BPF_RET | BPF_K
    [
        /* 0 */ SockFilter::new(LDH_ABS, 0, 0, 12), // ethertype
        /* 1 */ SockFilter::new(JEQ_K, 6, 0, ETHERTYPE_ARP as u32), // -> 8 accept
        /* 2 */ SockFilter::new(JEQ_K, 0, 6, ETHERTYPE_IPV6 as u32), // else -> 9 drop
        /* 3 */ SockFilter::new(LDB_ABS, 0, 0, 20), // IPv6 next header
        /* 4 */ SockFilter::new(JEQ_K, 0, 4, 58), // not ICMPv6 -> 9 drop
        /* 5 */ SockFilter::new(LDB_ABS, 0, 0, 54), // ICMPv6 type
        /* 6 */ SockFilter::new(JEQ_K, 1, 0, 135), // NS -> 8 accept
        /* 7 */ SockFilter::new(JEQ_K, 0, 1, 136), // NA -> 8 accept, else -> 9 drop
        /* 8 */ SockFilter::new(RET_K, 0, 0, 0xffff), // accept (up to 64 KiB)
        /* 9 */ SockFilter::new(RET_K, 0, 0, 0), // drop
    ]
};

/// Opens an AF_PACKET socket on `ifindex` with [`CLAIM_FILTER`], for sending frames and
/// receiving the filtered ones (reads block for at most `read_timeout`).
fn open(
    ifindex: u32,
    read_timeout: Duration,
) -> io::Result<(Box<dyn DataLinkSender>, Box<dyn DataLinkReceiver>)> {
    // Protocol 0: the socket receives nothing until pnet binds it to the interface with
    // ETH_P_ALL, by when the filter is in place (created with ETH_P_ALL it would queue
    // every interface's unfiltered frames meanwhile).
    let socket = Socket::new(Domain::PACKET, Type::RAW, None)?;
    socket.attach_filter(&CLAIM_FILTER)?;
    let iface = crate::l2::announce::link(ifindex);
    let config = pnet_datalink::Config {
        read_timeout: Some(read_timeout),
        write_timeout: Some(Duration::from_millis(200)),
        // pnet takes the descriptor over: it closes it on a failed bind or on drop.
        socket_fd: Some(socket.into_raw_fd()),
        promiscuous: false,
        ..Default::default()
    };
    match pnet_datalink::channel(&iface, config)? {
        Channel::Ethernet(tx, rx) => Ok((tx, rx)),
        _ => Err(io::Error::other(
            "pnet_datalink returned a non-Ethernet channel",
        )),
    }
}

/// Whether a read error only means "nothing yet" (pnet reports its poll timeout as
/// `TimedOut`; the socket is non-blocking).
fn is_idle(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
    )
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn read<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|p| p.into_inner())
}

fn write<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|p| p.into_inner())
}

/// Claims queued for the loop at most (a few hundred bytes each).
pub const CLAIM_QUEUE: usize = 4096;

/// What the watching threads share: who we are, what we watch, where claims go.
#[derive(Debug)]
struct Shared {
    /// This node's MACs on every listed interface: their frames are never reported.
    own: RwLock<HashSet<Mac>>,
    /// The IPs whose claims are reported.
    watched: RwLock<HashSet<IpAddr>>,
    claims: mpsc::Sender<LanClaim>,
    frames_received: AtomicU64,
    claims_reported: AtomicU64,
    claims_dropped: AtomicU64,
}

impl Shared {
    /// The claim to report for `frame`, if any: parsed, for a watched IP, from another MAC.
    fn admit(&self, frame: &[u8], ifindex: u32, at: Instant) -> Option<LanClaim> {
        // The kernel filter passes only ARP and ND; this keeps a frame it let through
        // by mistake (or a future filter change) from reaching the parser.
        if !matches!(ethertype(frame), Some(ETHERTYPE_ARP | ETHERTYPE_IPV6)) {
            return None;
        }
        let claim = parse_claim(frame, ifindex, at)?;
        if !read(&self.watched).contains(&claim.ip) {
            return None;
        }
        let own = read(&self.own);
        let from_us =
            own.contains(&claim.mac) || ethernet_source(frame).is_some_and(|m| own.contains(&m));
        (!from_us).then_some(claim)
    }
}

/// The sending half of a watching socket, replaced when the thread reopens the socket.
type SharedSender = Arc<Mutex<Box<dyn DataLinkSender>>>;

/// One watching thread, and its socket's sending half for defences.
struct Reader {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
    tx: SharedSender,
}

impl std::fmt::Debug for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader")
            .field("stop", &self.stop)
            .field("thread", &self.thread)
            .finish_non_exhaustive()
    }
}

/// The state behind the clones of a [`LanWatch`].
#[derive(Debug)]
struct Inner {
    shared: Arc<Shared>,
    readers: Mutex<BTreeMap<u32, Reader>>,
    /// Interfaces whose socket could not be opened (warned once, retried each call).
    failing: Mutex<BTreeSet<u32>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        for reader in lock(&self.readers).values() {
            reader.stop.store(true, Ordering::Relaxed);
        }
    }
}

/// AF_PACKET watching, probing and defending (see the module doc for the costs). Clones
/// share the same sockets; the threads stop when the last clone is dropped.
#[derive(Debug, Clone)]
pub struct LanWatch {
    inner: Arc<Inner>,
}

impl LanWatch {
    /// A watch on no interface yet, and the receiver of the claims it will see.
    ///
    /// The channel is bounded ([`CLAIM_QUEUE`]): a host flooding ARP for a held IP fills
    /// it, and what does not fit is dropped and counted ([`Self::claims_dropped`]) rather
    /// than queued without bound while the loop is busy. The loop drains the queue at
    /// every wake-up, and one claim of a node or a foreign host is all a verdict needs.
    pub fn start() -> (LanWatch, mpsc::Receiver<LanClaim>) {
        let (claims, rx) = mpsc::channel(CLAIM_QUEUE);
        let shared = Arc::new(Shared {
            own: RwLock::default(),
            watched: RwLock::default(),
            claims,
            frames_received: AtomicU64::new(0),
            claims_reported: AtomicU64::new(0),
            claims_dropped: AtomicU64::new(0),
        });
        let inner = Arc::new(Inner {
            shared,
            readers: Mutex::default(),
            failing: Mutex::default(),
        });
        (LanWatch { inner }, rx)
    }

    /// Frames the watching sockets received since start (what passed the kernel filter:
    /// the cost in user space).
    pub fn frames_received(&self) -> u64 {
        self.inner.shared.frames_received.load(Ordering::Relaxed)
    }

    /// Claims sent on the channel since start.
    pub fn claims_reported(&self) -> u64 {
        self.inner.shared.claims_reported.load(Ordering::Relaxed)
    }

    /// Claims dropped since start because the channel was full.
    pub fn claims_dropped(&self) -> u64 {
        self.inner.shared.claims_dropped.load(Ordering::Relaxed)
    }

    /// Opens the socket for `ifindex` and starts its thread.
    fn start_reader(&self, ifindex: u32) -> io::Result<Reader> {
        let (tx, rx) = open(ifindex, READ_TIMEOUT)?;
        let tx: SharedSender = Arc::new(Mutex::new(tx));
        let stop = Arc::new(AtomicBool::new(false));
        let (shared, flag, sender) = (self.inner.shared.clone(), stop.clone(), tx.clone());
        let thread = std::thread::Builder::new()
            .name(format!("lan-watch-{ifindex}"))
            .spawn(move || watch_link(ifindex, rx, &sender, &flag, &shared))?;
        Ok(Reader { stop, thread, tx })
    }
}

/// Reads claims off `ifindex` until `stop` is set or nobody listens. A socket that fails
/// (e.g. the link went down: the kernel flags it with ENETDOWN, which pnet reports on
/// every poll without ever reading it) is reopened, with a backoff.
fn watch_link(
    ifindex: u32,
    mut rx: Box<dyn DataLinkReceiver>,
    tx: &Mutex<Box<dyn DataLinkSender>>,
    stop: &AtomicBool,
    shared: &Shared,
) {
    let mut backoff = READ_TIMEOUT;
    while !stop.load(Ordering::Relaxed) {
        let error = match rx.next() {
            Ok(frame) => {
                backoff = READ_TIMEOUT;
                shared.frames_received.fetch_add(1, Ordering::Relaxed);
                if let Some(claim) = shared.admit(frame, ifindex, Instant::now()) {
                    match shared.claims.try_send(claim) {
                        Ok(()) => {
                            shared.claims_reported.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(mpsc::error::TrySendError::Full(_)) => {
                            shared.claims_dropped.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(mpsc::error::TrySendError::Closed(_)) => return,
                    }
                }
                continue;
            }
            Err(e) if is_idle(&e) => continue,
            Err(e) => e,
        };
        warn!(ifindex, error = %error, "LAN watch socket failed; reopening it");
        loop {
            sleep_unless_stopped(backoff, stop);
            if stop.load(Ordering::Relaxed) {
                return;
            }
            match open(ifindex, READ_TIMEOUT) {
                Ok((new_tx, new_rx)) => {
                    info!(ifindex, "LAN watch socket reopened");
                    *lock(tx) = new_tx;
                    rx = new_rx;
                    break;
                }
                Err(e) => {
                    debug!(ifindex, error = %e, "cannot reopen the LAN watch socket");
                    backoff = (backoff * 2).min(MAX_REOPEN_BACKOFF);
                }
            }
        }
        backoff = (backoff * 2).min(MAX_REOPEN_BACKOFF);
    }
}

fn sleep_unless_stopped(total: Duration, stop: &AtomicBool) {
    let end = Instant::now() + total;
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        if now >= end {
            return;
        }
        std::thread::sleep((end - now).min(READ_TIMEOUT));
    }
}

impl LanPort for LanWatch {
    /// Keeps one watching socket per listed interface: opens the new ones (a failure is
    /// warned once and retried at the next call), stops the removed ones (their threads
    /// end within [`READ_TIMEOUT`]).
    fn set_interfaces(&self, interfaces: &[(u32, Mac)]) {
        let own: HashSet<Mac> = interfaces.iter().map(|(_, mac)| *mac).collect();
        {
            let mut current = write(&self.inner.shared.own);
            if *current != own {
                *current = own;
            }
        }
        let wanted: BTreeSet<u32> = interfaces.iter().map(|(ifindex, _)| *ifindex).collect();
        let mut readers = lock(&self.inner.readers);
        readers.retain(|ifindex, reader| {
            // A thread that ended (it cannot, short of a panic) is started again below.
            let keep = wanted.contains(ifindex) && !reader.thread.is_finished();
            if !keep {
                reader.stop.store(true, Ordering::Relaxed);
            }
            keep
        });
        let mut failing = lock(&self.inner.failing);
        failing.retain(|ifindex| wanted.contains(ifindex));
        for &ifindex in &wanted {
            if readers.contains_key(&ifindex) {
                continue;
            }
            match self.start_reader(ifindex) {
                Ok(reader) => {
                    if failing.remove(&ifindex) {
                        info!(ifindex, "LAN watch socket opened");
                    }
                    readers.insert(ifindex, reader);
                }
                Err(error) => {
                    if failing.insert(ifindex) {
                        warn!(ifindex, %error, "cannot watch the LAN on this interface; retrying at the next reconcile");
                    } else {
                        debug!(ifindex, %error, "cannot watch the LAN on this interface");
                    }
                }
            }
        }
    }

    /// Replaces the watched IPs (a no-op write when unchanged).
    fn set_watched(&self, ips: &[IpAddr]) {
        let ips: HashSet<IpAddr> = ips.iter().copied().collect();
        let unchanged = *read(&self.inner.shared.watched) == ips;
        if !unchanged {
            *write(&self.inner.shared.watched) = ips;
        }
    }

    /// Probes on a thread of its own (started in the calling thread's namespace): the
    /// future needs no particular runtime and can be dropped (the probe then finishes
    /// its window unobserved).
    fn probe_many(
        &self,
        ifindex: u32,
        mac: Mac,
        ips: Vec<IpAddr>,
        config: ProbeConfig,
    ) -> BoxFuture<ProbeResults> {
        let mut own = read(&self.inner.shared.own).clone();
        own.insert(mac);
        let (done, outcome) = oneshot::channel();
        let spawned = std::thread::Builder::new()
            .name(format!("lan-probe-{ifindex}"))
            .spawn(move || {
                probe(ifindex, mac, &ips, config, &own, done);
            });
        Box::pin(async move {
            spawned.map_err(|source| LanError::Io { ifindex, source })?;
            outcome.await.unwrap_or_else(|_| {
                Err(LanError::Io {
                    ifindex,
                    source: io::Error::other("the probe thread stopped"),
                })
            })
        })
    }

    /// Sends one announcement now, on the calling thread, through the interface's
    /// watching socket: microseconds. Without one it opens a socket for the frame, whose
    /// close then waits for an RCU grace period (6-10 ms in the netns test) on the caller.
    fn defend(&self, ifindex: u32, mac: Mac, ip: IpAddr) -> Result<(), LanError> {
        let frame = announce::announcement_frame(mac.0, ip);
        let watching = lock(&self.inner.readers)
            .get(&ifindex)
            .map(|reader| reader.tx.clone());
        let sent = match watching {
            Some(tx) => announce::send_on(lock(&tx).as_mut(), ifindex, &frame),
            None => announce::send_frame(ifindex, &frame),
        };
        sent.map_err(|e| match e {
            AnnounceError::Socket { ifindex, source } => LanError::Socket { ifindex, source },
            AnnounceError::Send { ifindex, source } => LanError::Io { ifindex, source },
        })
    }
}

/// The probe frame for `ip` from `mac`, by family.
fn probe_frame(mac: Mac, ip: IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(v4) => arp_probe_frame(mac, v4).to_vec(),
        IpAddr::V6(v6) => dad_ns_frame(mac, v6),
    }
}

/// Probes `ips` through one socket and hands the outcomes to `done`, before the socket
/// is closed: a close waits for an RCU grace period (`synchronize_net` in
/// `packet_release`): 15 ms of a 16 ms answer to a taken IP in the netns test.
fn probe(
    ifindex: u32,
    mac: Mac,
    ips: &[IpAddr],
    config: ProbeConfig,
    own: &HashSet<Mac>,
    done: oneshot::Sender<ProbeResults>,
) {
    let outcomes: BTreeMap<IpAddr, ProbeOutcome> =
        ips.iter().map(|ip| (*ip, ProbeOutcome::Free)).collect();
    if outcomes.is_empty() {
        let _ = done.send(Ok(outcomes));
        return;
    }
    let (mut tx, mut rx) = match open(ifindex, PROBE_READ_TIMEOUT) {
        Ok(socket) => socket,
        Err(source) => {
            let _ = done.send(Err(LanError::Socket { ifindex, source }));
            return;
        }
    };
    let result = probe_on(
        tx.as_mut(),
        rx.as_mut(),
        ifindex,
        mac,
        outcomes,
        config,
        own,
    );
    // Nobody waits any more if the future was dropped.
    let _ = done.send(result);
}

/// The probe proper: `config.count` rounds `config.interval` apart, each IP's frame once
/// per round while it is free, reading until the window ends (or every IP is taken). A
/// claim (use or probe) of an IP from a MAC not in `own` takes it.
fn probe_on(
    tx: &mut dyn DataLinkSender,
    rx: &mut dyn DataLinkReceiver,
    ifindex: u32,
    mac: Mac,
    mut outcomes: BTreeMap<IpAddr, ProbeOutcome>,
    config: ProbeConfig,
    own: &HashSet<Mac>,
) -> ProbeResults {
    let frames: Vec<(IpAddr, Vec<u8>)> = outcomes
        .keys()
        .map(|ip| (*ip, probe_frame(mac, *ip)))
        .collect();
    let start = Instant::now();
    let end = start + config.window();
    let mut rounds = 0;
    let mut free = outcomes.len();
    loop {
        let now = Instant::now();
        if rounds < config.count && now >= start + config.interval * rounds {
            for (ip, frame) in &frames {
                // RFC 5227 §2.1.1: a host stops probing an address once it is in conflict.
                if outcomes.get(ip) == Some(&ProbeOutcome::Free) {
                    announce::send_on(tx, ifindex, frame).map_err(|e| match e {
                        AnnounceError::Socket { source, .. }
                        | AnnounceError::Send { source, .. } => LanError::Io { ifindex, source },
                    })?;
                }
            }
            rounds += 1;
            continue;
        }
        if now >= end || free == 0 {
            return Ok(outcomes);
        }
        match rx.next() {
            Ok(frame) => {
                let Some(claim) = parse_claim(frame, ifindex, now) else {
                    continue;
                };
                let from_us = own.contains(&claim.mac)
                    || ethernet_source(frame).is_some_and(|m| own.contains(&m));
                if from_us {
                    continue;
                }
                if let Some(slot @ ProbeOutcome::Free) = outcomes.get_mut(&claim.ip) {
                    *slot = ProbeOutcome::Taken { mac: claim.mac };
                    free -= 1;
                }
            }
            Err(e) if is_idle(&e) => {}
            Err(source) => return Err(LanError::Io { ifindex, source }),
        }
    }
}
