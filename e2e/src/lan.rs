//! The LAN-side sampler: who answers ARP for each watched load-balancer IP, seen from the
//! client's namespace (`alb-client`), which is what a router or a client on the LAN acts
//! on, whatever the nodes' address lists say. Every [`LAN_PERIOD`] a thread in the client
//! namespace broadcasts one ARP request per watched IP over an AF_PACKET socket
//! (`pnet_datalink`) and collects the replies until the next round; it also records every
//! gratuitous ARP (sender IP = target IP: an agent's announcement, a rogue host's, an
//! RFC 5227 defence) it sees. The verdicts ([`LanRecord::violations`]) are pure functions
//! of what was recorded, with unit tests below.
//!
//! Each round's requests carry one of [`TAG_COUNT`] sender addresses (unused LAN addresses
//! 192.168.55.240 + round mod 8): a reply is sent to the sender address of the request it
//! answers, so a late reply is counted in the round that asked, not in a later one (where
//! an old holder's slow reply would look like a second holder).
//!
//! IPv4 only: the lab has no IPv6 pools.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use pnet_datalink::{Channel, DataLinkReceiver, DataLinkSender};

use crate::Error;
use crate::lab::CLIENT_NS;

/// How often the sampler asks.
pub const LAN_PERIOD: Duration = Duration::from_millis(20);
/// The one exception to "one MAC answers per IP": for this long after a new holder's first
/// announcement (or its first answer, when it announces late or never; see
/// [`LanRecord::yield_windows`]) the old holder may still answer; it has to yield within
/// this bound (issue 12's target).
pub const YIELD_BOUND: Duration = Duration::from_millis(100);
/// Sender addresses the rounds rotate through (see the module docs).
pub const TAG_COUNT: u8 = 8;
/// The first of the tag sender addresses: 192.168.55.240..=247, unused in the lab.
const TAG_BASE: u8 = 240;

/// A MAC address, printed `aa:bb:cc:dd:ee:ff`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Mac(pub [u8; 6]);

impl fmt::Display for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            b[0], b[1], b[2], b[3], b[4], b[5]
        )
    }
}

impl std::str::FromStr for Mac {
    type Err = String;

    fn from_str(s: &str) -> Result<Mac, String> {
        let parts: Vec<&str> = s.trim().split(':').collect();
        if parts.len() != 6 {
            return Err(format!("{s:?} is not a MAC address (six hex bytes)"));
        }
        let mut out = [0u8; 6];
        for (o, p) in out.iter_mut().zip(parts) {
            *o = u8::from_str_radix(p, 16).map_err(|e| format!("{s:?}: {e}"))?;
        }
        Ok(Mac(out))
    }
}

/// One round: for each watched IP, the MACs that answered the round's request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LanSample {
    /// When the round's requests went out.
    pub at: Instant,
    /// Watched IP -> the MACs that answered (empty: nobody).
    pub answers: BTreeMap<Ipv4Addr, BTreeSet<Mac>>,
}

/// A gratuitous ARP seen on the LAN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Announcement {
    /// When it arrived.
    pub at: Instant,
    /// The IP announced.
    pub ip: Ipv4Addr,
    /// Who announced it.
    pub mac: Mac,
}

/// An ARP request by another host seen on the LAN (a probe, sender IP 0.0.0.0, or a
/// resolution): the LAN's own ARP traffic, which a storm of checks would swell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// When it arrived.
    pub at: Instant,
    /// Who asked.
    pub mac: Mac,
    /// The IP asked about.
    pub target: Ipv4Addr,
}

/// What a [`LanSampler`] recorded.
#[derive(Debug, Clone, Default)]
pub struct LanRecord {
    /// The rounds, in order.
    pub samples: Vec<LanSample>,
    /// Every gratuitous ARP, in order of arrival.
    pub announcements: Vec<Announcement>,
    /// Every ARP request of another host, in order of arrival.
    pub requests: Vec<Request>,
}

/// A breach of the one-holder invariant on the LAN.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LanViolation {
    /// Two or more MACs answered for `ip` in one round outside every yield window.
    Double {
        /// When (the round's time).
        at: Instant,
        /// The IP.
        ip: Ipv4Addr,
        /// The MACs that answered.
        macs: BTreeSet<Mac>,
    },
    /// The sampler itself stalled: two rounds more than [`YIELD_BOUND`] apart, so a
    /// double holder could have gone unseen in between.
    Stall {
        /// The round before the gap.
        at: Instant,
        /// How long the gap was.
        gap: Duration,
    },
}

impl LanViolation {
    /// When it happened.
    pub fn at(&self) -> Instant {
        match self {
            LanViolation::Double { at, .. } | LanViolation::Stall { at, .. } => *at,
        }
    }

    /// One line, with MACs named through `names` where known.
    pub fn describe(&self, t0: Instant, names: &BTreeMap<Mac, String>) -> String {
        let secs = self.at().saturating_duration_since(t0).as_secs_f64();
        match self {
            LanViolation::Double { ip, macs, .. } => {
                format!("{ip} answered by {} at {secs:.3}s", name_macs(macs, names))
            }
            LanViolation::Stall { gap, .. } => format!(
                "the LAN sampler stalled for {} ms at {secs:.3}s (more than the {} ms yield bound: not counted as clean)",
                gap.as_millis(),
                YIELD_BOUND.as_millis()
            ),
        }
    }
}

/// The MACs that answer NDP for `ip` on the LAN, from the client (`ndisc6 -m`: every
/// answer within the wait), lower case.
pub fn ndp_answers(ip: std::net::Ipv6Addr) -> Result<BTreeSet<String>, Error> {
    let out = std::process::Command::new("ip")
        .args([
            "netns", "exec", CLIENT_NS, "ndisc6", "-q", "-m", "-r", "2", "-w", "300",
        ])
        .arg(ip.to_string())
        .arg("eth0")
        .output()
        .map_err(|source| Error::Io {
            what: "running ndisc6 in the client".to_owned(),
            source,
        })?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.trim().to_lowercase())
        .filter(|l| !l.is_empty())
        .collect())
}

/// `mac (node)` for each MAC.
pub fn name_macs(macs: &BTreeSet<Mac>, names: &BTreeMap<Mac, String>) -> String {
    let named: Vec<String> = macs
        .iter()
        .map(|m| match names.get(m) {
            Some(n) => format!("{m} ({n})"),
            None => format!("{m} (unknown)"),
        })
        .collect();
    named.join(", ")
}

/// How long an IP went unanswered on the LAN within a window of rounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Silence {
    /// Rounds in the window that asked for the IP.
    pub rounds: usize,
    /// Of those, the rounds nobody answered.
    pub silent: usize,
    /// The longest stretch without an answer: from the last round answered before a run of
    /// silent rounds to the first answered after it (to the window's last round if none is),
    /// a run at the window's start counted from its first round; zero without silent rounds.
    pub longest: Duration,
    /// When that stretch began.
    pub longest_at: Option<Instant>,
    /// The longest such stretch as the sampler saw it: each time between two of its rounds
    /// counted for at most [`YIELD_BOUND`], so that the sampler's own stalls on a loaded
    /// machine (when it asked nobody) do not count as silence; at most [`Silence::longest`].
    pub longest_sampled: Duration,
}

impl LanRecord {
    /// The [`Silence`] of `ip` over the rounds in `[from, to)`.
    pub fn silence(&self, ip: Ipv4Addr, from: Instant, to: Instant) -> Silence {
        let rounds: Vec<(Instant, bool)> = self
            .samples
            .iter()
            .filter(|s| s.at >= from && s.at < to)
            .filter_map(|s| Some((s.at, !s.answers.get(&ip)?.is_empty())))
            .collect();
        let mut out = Silence {
            rounds: rounds.len(),
            silent: 0,
            longest: Duration::ZERO,
            longest_at: None,
            longest_sampled: Duration::ZERO,
        };
        let Some((first, _)) = rounds.first() else {
            return out;
        };
        let mut last_answer = *first;
        let mut previous = *first;
        let mut in_run = false;
        // The run's length with each step between rounds capped at YIELD_BOUND.
        let mut sampled = Duration::ZERO;
        let close = |out: &mut Silence, from: Instant, to: Instant, sampled: Duration| {
            let gap = to.saturating_duration_since(from);
            if gap > out.longest {
                out.longest = gap;
                out.longest_at = Some(from);
            }
            out.longest_sampled = out.longest_sampled.max(sampled);
        };
        for (at, answered) in &rounds {
            let step = at.saturating_duration_since(previous).min(YIELD_BOUND);
            previous = *at;
            if *answered {
                if in_run {
                    close(&mut out, last_answer, *at, sampled + step);
                }
                in_run = false;
                last_answer = *at;
            } else {
                if !in_run {
                    sampled = Duration::ZERO;
                }
                sampled += step;
                out.silent += 1;
                in_run = true;
            }
        }
        if in_run && let Some((last, _)) = rounds.last() {
            close(&mut out, last_answer, *last, sampled);
        }
        out
    }

    /// The rounds at or after `t`, and the announcements then.
    pub fn since(&self, t: Instant) -> LanRecord {
        LanRecord {
            samples: self.samples.iter().filter(|s| s.at >= t).cloned().collect(),
            announcements: self
                .announcements
                .iter()
                .filter(|a| a.at >= t)
                .copied()
                .collect(),
            requests: self
                .requests
                .iter()
                .filter(|r| r.at >= t)
                .copied()
                .collect(),
        }
    }

    /// How many ARP requests `macs` sent from `from` to `to`, per second.
    pub fn request_rate(&self, macs: &BTreeSet<Mac>, from: Instant, to: Instant) -> f64 {
        let n = self
            .requests
            .iter()
            .filter(|r| r.at >= from && r.at < to && macs.contains(&r.mac))
            .count();
        n as f64 / to.saturating_duration_since(from).as_secs_f64().max(0.001)
    }

    /// Every MAC that ever answered for `ip` or announced it.
    pub fn macs_for(&self, ip: Ipv4Addr) -> BTreeSet<Mac> {
        let answered = self
            .samples
            .iter()
            .filter_map(|s| s.answers.get(&ip))
            .flatten()
            .copied();
        let announced = self
            .announcements
            .iter()
            .filter(|a| a.ip == ip)
            .map(|a| a.mac);
        answered.chain(announced).collect()
    }

    /// The MACs that answered for `ip` in the last round that had any answer for it.
    pub fn last_answer(&self, ip: Ipv4Addr) -> Option<BTreeSet<Mac>> {
        self.samples
            .iter()
            .rev()
            .filter_map(|s| s.answers.get(&ip))
            .find(|m| !m.is_empty())
            .cloned()
    }

    /// Whether nothing can have changed hands between the rounds `before` and `after`:
    /// every IP answered by the same MACs, one at most, on both sides, and no announcement
    /// received in between (nor within a period after: frames wait in the socket while the
    /// thread is delayed). A second holder cannot come and go unseen in such a gap: every
    /// holder (an agent adding an alias, the chaos's rogue host) announces when it takes
    /// an address, and one that stayed would answer in `after`. Any other stall is
    /// unjudged time and a violation.
    fn quiet(&self, before: &LanSample, after: &LanSample) -> bool {
        let single = |s: &LanSample| s.answers.values().all(|m| m.len() <= 1);
        let same = before.answers == after.answers;
        let announced = self
            .announcements
            .iter()
            .any(|a| a.at >= before.at && a.at <= after.at + LAN_PERIOD);
        same && single(before) && !announced
    }

    /// The rounds more than [`YIELD_BOUND`] apart, judged or not.
    pub fn stalls(&self) -> usize {
        self.samples
            .windows(2)
            .filter(|w| w[1].at.saturating_duration_since(w[0].at) > YIELD_BOUND)
            .count()
    }

    /// The longest time between two consecutive rounds.
    pub fn max_gap(&self) -> Duration {
        self.samples
            .windows(2)
            .map(|w| w[1].at.saturating_duration_since(w[0].at))
            .max()
            .unwrap_or_default()
    }

    /// The times at which a MAC became a new holder of `ip` on the LAN: for each MAC, the
    /// first sign of it (an announcement or an answer) after a round in which it did not
    /// answer (or from the start). A holder that keeps answering does not restart its clock
    /// by announcing again.
    pub fn arrivals(&self, ip: Ipv4Addr) -> Vec<(Instant, Mac)> {
        #[derive(Clone, Copy)]
        enum Event {
            Answer(Mac),
            Silent(Mac),
            Announce(Mac),
        }
        let macs = self.macs_for(ip);
        let mut events: Vec<(Instant, u8, Event)> = Vec::new();
        for s in &self.samples {
            let Some(answered) = s.answers.get(&ip) else {
                continue;
            };
            for m in &macs {
                let e = if answered.contains(m) {
                    Event::Answer(*m)
                } else {
                    Event::Silent(*m)
                };
                events.push((s.at, 1, e));
            }
        }
        for a in self.announcements.iter().filter(|a| a.ip == ip) {
            events.push((a.at, 0, Event::Announce(a.mac)));
        }
        events.sort_by_key(|(at, order, _)| (*at, *order));
        let mut present: BTreeSet<Mac> = BTreeSet::new();
        let mut out = Vec::new();
        for (at, _, e) in events {
            match e {
                Event::Answer(m) | Event::Announce(m) => {
                    if present.insert(m) {
                        out.push((at, m));
                    }
                }
                Event::Silent(m) => {
                    present.remove(&m);
                }
            }
        }
        out
    }

    /// The yield windows of `ip`: for each arrival ([`LanRecord::arrivals`]) of a MAC,
    /// (arrival, clock start, MAC). The clock starts at the new holder's first
    /// announcement, the only thing the old holder can act on, when that comes at most
    /// [`YIELD_BOUND`] after the arrival (a holder's kernel answers as soon as the address
    /// is configured, a moment before its gratuitous ARP goes out); otherwise, or without
    /// any announcement, at the arrival itself.
    pub fn yield_windows(&self, ip: Ipv4Addr) -> Vec<(Instant, Instant, Mac)> {
        self.arrivals(ip)
            .into_iter()
            .map(|(arrived, mac)| {
                let announced = self
                    .announcements
                    .iter()
                    .filter(|a| a.ip == ip && a.mac == mac && a.at >= arrived)
                    .map(|a| a.at)
                    .find(|at| at.saturating_duration_since(arrived) <= YIELD_BOUND);
                (arrived, announced.unwrap_or(arrived), mac)
            })
            .collect()
    }

    /// The one-holder verdicts: every round in which two or more MACs answered for an IP,
    /// unless one of them is in its yield window (from its arrival to [`YIELD_BOUND`]
    /// after its clock started, see [`LanRecord::yield_windows`]); and every stall of the
    /// sampler longer than [`YIELD_BOUND`].
    pub fn violations(&self) -> Vec<LanViolation> {
        let mut out = Vec::new();
        for w in self.samples.windows(2) {
            let gap = w[1].at.saturating_duration_since(w[0].at);
            if gap > YIELD_BOUND && !self.quiet(&w[0], &w[1]) {
                out.push(LanViolation::Stall { at: w[0].at, gap });
            }
        }
        let ips: BTreeSet<Ipv4Addr> = self
            .samples
            .iter()
            .flat_map(|s| s.answers.keys().copied())
            .collect();
        for ip in ips {
            let windows = self.yield_windows(ip);
            for s in &self.samples {
                let Some(macs) = s.answers.get(&ip) else {
                    continue;
                };
                if macs.len() < 2 {
                    continue;
                }
                // A round's answers may come in up to a period after it was sent.
                let excused = windows.iter().any(|(arrived, clock, m)| {
                    macs.contains(m)
                        && *arrived <= s.at + LAN_PERIOD
                        && s.at.saturating_duration_since(*clock) <= YIELD_BOUND
                });
                if !excused {
                    out.push(LanViolation::Double {
                        at: s.at,
                        ip,
                        macs: macs.clone(),
                    });
                }
            }
        }
        out.sort_by_key(LanViolation::at);
        out
    }

    /// The rounds in which two or more MACs answered for `ip` (excused or not).
    pub fn doubles(&self, ip: Ipv4Addr) -> usize {
        self.samples
            .iter()
            .filter(|s| s.answers.get(&ip).is_some_and(|m| m.len() > 1))
            .count()
    }
}

/// The watched IPs, changeable while the sampler runs.
pub type Watched = Arc<Mutex<BTreeSet<Ipv4Addr>>>;

/// A running LAN sampler; [`LanSampler::finish`] stops it and returns its record.
#[derive(Debug)]
pub struct LanSampler {
    stop: Arc<AtomicBool>,
    watched: Watched,
    thread: JoinHandle<Result<LanRecord, Error>>,
}

/// Runs the calling thread at nice -10, so that the lab's own processes (agents,
/// controllers, kube-apiserver, etcd, kube-proxy, all at nice 0 on 2 cores) do not delay
/// the sampler's rounds past the yield bound: a stall is reported as unjudged time, and a
/// judge that loses its sight to CPU contention judges nothing. Linux applies a nice value
/// per thread (setpriority on a thread id), which `renice` sets from outside with no
/// unsafe code here; if it fails the sampler runs at the normal priority and says so.
fn raise_own_priority() {
    let tid = std::fs::read_link("/proc/thread-self")
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()));
    let Some(tid) = tid else {
        eprintln!("[lan] cannot find the sampler's thread id: running at normal priority");
        return;
    };
    let raised = std::process::Command::new("renice")
        .args(["-n", "-10", "-p", &tid])
        .stdout(std::process::Stdio::null())
        .status();
    if !raised.is_ok_and(|s| s.success()) {
        eprintln!("[lan] renice of the sampler thread {tid} failed: running at normal priority");
    }
}

impl LanSampler {
    /// Starts sampling `ips` every [`LAN_PERIOD`] from the client's namespace; returns once
    /// the socket is open (an error opening it is returned here, not at the end).
    pub fn start(ips: impl IntoIterator<Item = Ipv4Addr>) -> Result<LanSampler, Error> {
        let stop = Arc::new(AtomicBool::new(false));
        let watched: Watched = Arc::new(Mutex::new(ips.into_iter().collect()));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let flag = stop.clone();
        let list = watched.clone();
        let thread = std::thread::spawn(move || {
            raise_own_priority();
            let opened = open_client_socket();
            let (me, tx, rx) = match opened {
                Ok(v) => {
                    let _ = ready_tx.send(Ok(()));
                    v
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e.to_string()));
                    return Err(e);
                }
            };
            sample_loop(me, tx, rx, &flag, &list)
        });
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(LanSampler {
                stop,
                watched,
                thread,
            }),
            Ok(Err(why)) => Err(Error::Environment(format!(
                "the LAN sampler could not open its socket in {CLIENT_NS}: {why}"
            ))),
            Err(_) => Err(Error::Environment(
                "the LAN sampler thread ended before opening its socket".to_owned(),
            )),
        }
    }

    /// Replaces the watched IPs (from the next round on).
    pub fn watch(&self, ips: impl IntoIterator<Item = Ipv4Addr>) {
        if let Ok(mut w) = self.watched.lock() {
            *w = ips.into_iter().collect();
        }
    }

    /// Stops the sampler and returns what it recorded.
    pub fn finish(self) -> Result<LanRecord, Error> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .join()
            .map_err(|_| Error::Environment("the LAN sampler thread panicked".to_owned()))?
    }
}

type Socket = (Mac, Box<dyn DataLinkSender>, Box<dyn DataLinkReceiver>);

/// Enters the client's namespace (this thread only) and opens an AF_PACKET channel on its
/// `eth0`.
fn open_client_socket() -> Result<Socket, Error> {
    let path = format!("/run/netns/{CLIENT_NS}");
    let ns = std::fs::File::open(&path).map_err(|source| Error::Io {
        what: format!("opening {path}"),
        source,
    })?;
    nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET).map_err(|e| Error::Io {
        what: format!("entering {path}"),
        source: e.into(),
    })?;
    let iface = pnet_datalink::interfaces()
        .into_iter()
        .find(|i| i.name == "eth0")
        .ok_or_else(|| Error::Environment(format!("no eth0 in {CLIENT_NS}")))?;
    let mac = iface
        .mac
        .map(|m| Mac(m.octets()))
        .ok_or_else(|| Error::Environment(format!("eth0 in {CLIENT_NS} has no MAC")))?;
    let config = pnet_datalink::Config {
        read_timeout: Some(Duration::from_millis(2)),
        write_timeout: Some(Duration::from_millis(200)),
        read_buffer_size: 1 << 16,
        promiscuous: false,
        ..Default::default()
    };
    match pnet_datalink::channel(&iface, config) {
        Ok(Channel::Ethernet(tx, rx)) => Ok((mac, tx, rx)),
        Ok(_) => Err(Error::Environment(
            "pnet_datalink returned a non-Ethernet channel".to_owned(),
        )),
        Err(source) => Err(Error::Io {
            what: format!("opening an AF_PACKET socket on eth0 in {CLIENT_NS}"),
            source,
        }),
    }
}

/// The tag sender address of round `round`.
fn tag(round: u64) -> Ipv4Addr {
    Ipv4Addr::new(
        192,
        168,
        55,
        TAG_BASE + (round % u64::from(TAG_COUNT)) as u8,
    )
}

/// The round a reply to tag `tpa` belongs to, among the last [`TAG_COUNT`] rounds up to
/// `current`.
fn round_of(tpa: Ipv4Addr, current: u64) -> Option<u64> {
    let o = tpa.octets();
    if o[..3] != [192, 168, 55] || !(TAG_BASE..TAG_BASE + TAG_COUNT).contains(&o[3]) {
        return None;
    }
    let slot = u64::from(o[3] - TAG_BASE);
    let back = (current + u64::from(TAG_COUNT) - slot) % u64::from(TAG_COUNT);
    current.checked_sub(back)
}

fn sample_loop(
    me: Mac,
    mut tx: Box<dyn DataLinkSender>,
    mut rx: Box<dyn DataLinkReceiver>,
    stop: &AtomicBool,
    watched: &Watched,
) -> Result<LanRecord, Error> {
    let mut record = LanRecord::default();
    // Round `r` is `record.samples[r]`.
    let mut round: u64 = 0;
    let mut next = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        let ips: Vec<Ipv4Addr> = watched
            .lock()
            .map(|w| w.iter().copied().collect())
            .unwrap_or_default();
        let at = Instant::now();
        let sender = tag(round);
        for ip in &ips {
            let frame = arp_request(me, sender, *ip);
            // A dropped request (full queue) only means no answer this round.
            let _ = tx.send_to(&frame, None);
        }
        record.samples.push(LanSample {
            at,
            answers: ips.iter().map(|ip| (*ip, BTreeSet::new())).collect(),
        });
        next += LAN_PERIOD;
        if next < Instant::now() {
            next = Instant::now();
        }
        while Instant::now() < next {
            let Ok(frame) = rx.next() else {
                continue;
            };
            let Some(arp) = Arp::parse(frame) else {
                continue;
            };
            if arp.sha == me {
                continue;
            }
            if arp.spa == arp.tpa {
                record.announcements.push(Announcement {
                    at: Instant::now(),
                    ip: arp.spa,
                    mac: arp.sha,
                });
                continue;
            }
            if arp.op == 1 {
                record.requests.push(Request {
                    at: Instant::now(),
                    mac: arp.sha,
                    target: arp.tpa,
                });
                continue;
            }
            if arp.op != 2 {
                continue;
            }
            let asked = round_of(arp.tpa, round)
                .and_then(|r| usize::try_from(r).ok())
                .and_then(|i| record.samples.get_mut(i))
                .and_then(|s| s.answers.get_mut(&arp.spa));
            if let Some(set) = asked {
                set.insert(arp.sha);
            }
        }
        round += 1;
    }
    Ok(record)
}

/// A broadcast ARP request "who has `target`? tell `sender`" from `me`.
pub fn arp_request(me: Mac, sender: Ipv4Addr, target: Ipv4Addr) -> [u8; 42] {
    let mut f = [0u8; 42];
    f[0..6].copy_from_slice(&[0xff; 6]);
    f[6..12].copy_from_slice(&me.0);
    f[12..14].copy_from_slice(&[0x08, 0x06]);
    // Ethernet, IPv4, 6-byte MACs, 4-byte addresses, request.
    f[14..22].copy_from_slice(&[0x00, 0x01, 0x08, 0x00, 6, 4, 0x00, 0x01]);
    f[22..28].copy_from_slice(&me.0);
    f[28..32].copy_from_slice(&sender.octets());
    // Target MAC unknown: zeros.
    f[38..42].copy_from_slice(&target.octets());
    f
}

/// The fields of an Ethernet/IPv4 ARP frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arp {
    /// 1 request, 2 reply.
    pub op: u16,
    /// Sender MAC.
    pub sha: Mac,
    /// Sender IP.
    pub spa: Ipv4Addr,
    /// Target IP.
    pub tpa: Ipv4Addr,
}

impl Arp {
    /// Parses an Ethernet frame; `None` unless it is an Ethernet/IPv4 ARP packet.
    pub fn parse(frame: &[u8]) -> Option<Arp> {
        if frame.len() < 42 || frame[12..14] != [0x08, 0x06] {
            return None;
        }
        if frame[14..20] != [0x00, 0x01, 0x08, 0x00, 6, 4] {
            return None;
        }
        let ip = |at: usize| Ipv4Addr::new(frame[at], frame[at + 1], frame[at + 2], frame[at + 3]);
        let mut sha = [0u8; 6];
        sha.copy_from_slice(&frame[22..28]);
        Some(Arp {
            op: u16::from_be_bytes([frame[20], frame[21]]),
            sha: Mac(sha),
            spa: ip(28),
            tpa: ip(38),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const IP: Ipv4Addr = Ipv4Addr::new(192, 168, 55, 20);
    const A: Mac = Mac([2, 0, 0, 0, 0, 1]);
    const B: Mac = Mac([2, 0, 0, 0, 0, 2]);

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    /// A stall of the sampler inside a silent run counts for at most YIELD_BOUND in
    /// `longest_sampled`, in full in `longest`; rounds that keep coming unanswered count in
    /// full in both.
    #[test]
    fn the_samplers_own_stalls_are_not_silence_as_sampled() {
        let t0 = Instant::now();
        let round = |at: u64, answered: bool| LanSample {
            at: t0 + ms(at),
            answers: [(
                IP,
                if answered {
                    [A].into()
                } else {
                    BTreeSet::new()
                },
            )]
            .into(),
        };
        // Answered at 0, silent at 20 and at 920 (a 900 ms stall between), answered at 940.
        let stalled = LanRecord {
            samples: vec![
                round(0, true),
                round(20, false),
                round(920, false),
                round(940, true),
            ],
            announcements: Vec::new(),
            requests: Vec::new(),
        };
        let s = stalled.silence(IP, t0, t0 + ms(1000));
        assert_eq!(s.longest, ms(940));
        assert_eq!(s.longest_sampled, ms(20) + YIELD_BOUND + ms(20));
        // Fifty silent rounds 20 ms apart: a second in both.
        let mut samples = vec![round(0, true)];
        samples.extend((1..=50).map(|i| round(20 * i, false)));
        samples.push(round(20 * 51, true));
        let silent = LanRecord {
            samples,
            announcements: Vec::new(),
            requests: Vec::new(),
        };
        let s = silent.silence(IP, t0, t0 + ms(2000));
        assert_eq!((s.longest, s.longest_sampled), (ms(1020), ms(1020)));
    }

    /// Rounds 20 ms apart; `answers[i]` answered for [`IP`] in round `i`.
    fn record(t0: Instant, answers: &[&[Mac]], announcements: &[(u64, Mac)]) -> LanRecord {
        LanRecord {
            samples: answers
                .iter()
                .enumerate()
                .map(|(i, macs)| LanSample {
                    at: t0 + ms(20 * i as u64),
                    answers: [(IP, macs.iter().copied().collect())].into(),
                })
                .collect(),
            announcements: announcements
                .iter()
                .map(|(t, mac)| Announcement {
                    at: t0 + ms(*t),
                    ip: IP,
                    mac: *mac,
                })
                .collect(),
            requests: Vec::new(),
        }
    }

    #[test]
    fn one_mac_at_a_time_is_clean() {
        let r = record(Instant::now(), &[&[A], &[A], &[], &[B], &[B]], &[(60, B)]);
        assert!(r.violations().is_empty(), "{:?}", r.violations());
    }

    #[test]
    fn a_double_within_the_yield_bound_after_the_new_holders_announcement_is_excused() {
        // B announces at 40 ms; A still answers at 40, 60, 80, 100, 120 ms (80 ms after).
        let r = record(
            Instant::now(),
            &[
                &[A],
                &[A],
                &[A, B],
                &[A, B],
                &[A, B],
                &[A, B],
                &[A, B],
                &[B],
            ],
            &[(40, B)],
        );
        assert!(r.violations().is_empty(), "{:?}", r.violations());
    }

    #[test]
    fn a_double_beyond_the_yield_bound_is_a_violation() {
        // B announces at 40 ms; A still answers 120 and 140 ms after.
        let answers: Vec<&[Mac]> = [&[A][..], &[A], &[A, B]]
            .into_iter()
            .chain(std::iter::repeat_n(&[A, B][..], 7))
            .chain([&[B][..]])
            .collect();
        let r = record(Instant::now(), &answers, &[(40, B)]);
        let v = r.violations();
        assert_eq!(v.len(), 2, "{v:?}");
        assert!(matches!(&v[0], LanViolation::Double { macs, .. } if macs.len() == 2));
    }

    #[test]
    fn a_double_with_no_arrival_at_all_is_a_violation() {
        // A and B answer from the first round: both "arrive" at 0; the double lasts 200 ms.
        let answers: Vec<&[Mac]> = std::iter::repeat_n(&[A, B][..], 11).collect();
        let v = record(Instant::now(), &answers, &[]).violations();
        assert_eq!(v.len(), 5, "rounds at 120..200 ms: {v:?}");
    }

    #[test]
    fn a_new_holder_that_answers_before_announcing_starts_the_clock_at_its_announcement() {
        // B answers from 40 ms, announces at 50 ms: A may answer until 150 ms; the rounds
        // at 160 and 180 ms are late.
        let answers: Vec<&[Mac]> = [&[A][..], &[A]]
            .into_iter()
            .chain(std::iter::repeat_n(&[A, B][..], 8))
            .collect();
        let r = record(Instant::now(), &answers, &[(50, B)]);
        let v = r.violations();
        assert_eq!(v.len(), 2, "{v:?}");
    }

    #[test]
    fn an_announcement_long_after_the_first_answer_does_not_stretch_the_window() {
        // B answers from 40 ms but announces only at 150 ms: the clock starts at 40 ms, so
        // A at 160 ms (120 ms after) is late although only 10 ms after the announcement.
        let answers: Vec<&[Mac]> = [&[A][..], &[A]]
            .into_iter()
            .chain(std::iter::repeat_n(&[A, B][..], 7))
            .collect();
        let r = record(Instant::now(), &answers, &[(150, B)]);
        let v = r.violations();
        assert_eq!(v.len(), 1, "{v:?}");
    }

    #[test]
    fn a_holder_announcing_again_does_not_restart_its_clock() {
        // B arrives at 40 ms and announces again at 140 ms: A at 160 ms is still late.
        let r = record(
            Instant::now(),
            &[
                &[A],
                &[A],
                &[A, B],
                &[A, B],
                &[A, B],
                &[A, B],
                &[A, B],
                &[A, B],
                &[A, B],
            ],
            &[(40, B), (140, B)],
        );
        assert_eq!(r.violations().len(), 1);
    }

    #[test]
    fn a_stall_longer_than_the_bound_is_reported_not_clean_unless_quiet() {
        let t0 = Instant::now();
        // The holder changes across the gap: unjudged.
        let mut r = record(t0, &[&[A], &[A]], &[]);
        r.samples.push(LanSample {
            at: t0 + ms(20 + 150),
            answers: [(IP, [B].into())].into(),
        });
        let v = r.violations();
        assert_eq!(
            v,
            [LanViolation::Stall {
                at: t0 + ms(20),
                gap: ms(150)
            }]
        );
        assert_eq!(r.max_gap(), ms(150));
        // The same single holder on both sides and no announcement: nothing changed hands.
        r.samples.last_mut().unwrap().answers = [(IP, [A].into())].into();
        assert_eq!(r.violations(), []);
        assert_eq!(r.stalls(), 1);
        // An announcement inside the gap: unjudged again.
        r.announcements.push(Announcement {
            at: t0 + ms(100),
            ip: IP,
            mac: B,
        });
        assert_eq!(r.violations().len(), 1);
    }

    #[test]
    fn arrivals_restart_after_a_holder_went_silent() {
        let t0 = Instant::now();
        let r = record(t0, &[&[A], &[], &[A], &[B]], &[]);
        assert_eq!(
            r.arrivals(IP),
            [(t0, A), (t0 + ms(40), A), (t0 + ms(60), B)]
        );
    }

    #[test]
    fn replies_are_matched_to_the_round_that_asked() {
        assert_eq!(round_of(tag(13), 13), Some(13));
        assert_eq!(round_of(tag(11), 13), Some(11));
        assert_eq!(round_of(tag(6), 13), Some(6));
        assert_eq!(round_of(tag(3), 3), Some(3));
        assert_eq!(round_of(tag(5), 3), None, "a round that was never asked");
        assert_eq!(round_of(Ipv4Addr::new(192, 168, 55, 200), 3), None);
    }

    #[test]
    fn requests_parse_back() {
        let f = arp_request(A, tag(2), IP);
        assert_eq!(
            Arp::parse(&f),
            Some(Arp {
                op: 1,
                sha: A,
                spa: Ipv4Addr::new(192, 168, 55, 242),
                tpa: IP
            })
        );
        assert_eq!(Arp::parse(&f[..41]), None);
    }

    #[test]
    fn macs_print_and_parse() {
        let m: Mac = "0a:1b:2c:3d:4e:5f".parse().unwrap();
        assert_eq!(m.to_string(), "0a:1b:2c:3d:4e:5f");
        assert!("0a:1b".parse::<Mac>().is_err());
    }
}
