//! The client on the LAN (`alb-client`, 192.168.55.200): plain HTTP/1.0 requests to a
//! load-balancer IP from a thread inside the client's network namespace, so every request
//! takes the real path (ARP, the holder's alias, kube-proxy DNAT, the pod); and raw TCP
//! probes that tell an answer, a refusal and a silent drop apart ([`tcp_probe`]). Does I/O.

use std::io::{ErrorKind, Read as _, Write as _};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, TcpStream};
use std::time::{Duration, Instant};

use crate::Error;
use crate::lab::{CLIENT_IP, CLIENT_IP6, CLIENT_NS, NODES, node_ip, node_ip6};

/// Connect timeout of one request: a dead path fails fast and the next probe follows.
pub const CONNECT_TIMEOUT: Duration = Duration::from_millis(100);
/// Read/write timeout of one request.
pub const IO_TIMEOUT: Duration = Duration::from_millis(500);
/// Period of the probes while waiting for recovery.
pub const PROBE_PERIOD: Duration = Duration::from_millis(50);

/// A pod's answer: its name and the source address it saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// `pod-a` (on node 1) or `pod-b` (on node 2).
    pub pod: String,
    /// The source address the pod saw.
    pub client: IpAddr,
}

impl Answer {
    /// The node that forwarded the request, i.e. held the IP: with externalTrafficPolicy
    /// Cluster kube-proxy masquerades to that node's LAN address (pod elsewhere) or to its
    /// `cni0` address 10.244.N.1 / fd44:0:0:N::1 (pod on the same node); with Local the
    /// client address is kept and the pod is on the holder.
    pub fn via_node(&self) -> Option<u8> {
        NODES.into_iter().find(|&n| {
            self.client == IpAddr::V4(node_ip(n))
                || self.client == IpAddr::V6(node_ip6(n))
                || self.client == IpAddr::V4(Ipv4Addr::new(10, 244, n, 1))
                || self.client == IpAddr::V6(Ipv6Addr::new(0xfd44, 0, 0, u16::from(n), 0, 0, 0, 1))
                || ((self.client == IpAddr::V4(CLIENT_IP) || self.client == IpAddr::V6(CLIENT_IP6))
                    && self.pod_node() == Some(n))
        })
    }

    /// The node the answering pod runs on.
    pub fn pod_node(&self) -> Option<u8> {
        match self.pod.as_str() {
            "pod-a" => Some(1),
            "pod-b" => Some(2),
            _ => None,
        }
    }
}

/// Runs `f` on a thread inside the client's network namespace.
fn in_client<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, Error> {
    in_namespace(CLIENT_NS, f)
}

/// Runs `f` on a thread inside the network namespace `ns` (e.g. the BGP client's): sockets it
/// opens belong to that namespace.
pub fn in_namespace<T: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, Error> {
    let path = format!("/run/netns/{ns}");
    let handle = std::thread::spawn(move || {
        let ns = std::fs::File::open(&path).map_err(|source| Error::Io {
            what: format!("opening {path}"),
            source,
        })?;
        nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET).map_err(|e| Error::Io {
            what: format!("entering {path}"),
            source: e.into(),
        })?;
        Ok(f())
    });
    handle
        .join()
        .map_err(|_| Error::Environment("the client thread panicked".to_owned()))?
}

/// One request (must run inside the client namespace); `Err` says why it failed.
fn request(ip: Ipv4Addr) -> Result<Answer, String> {
    request_to(SocketAddr::from((ip, 80)), CONNECT_TIMEOUT)
}

/// One HTTP/1.0 request to `addr` on a new connection (so a new source port) from the
/// calling thread's namespace (see [`in_namespace`]); `Err` says why it failed.
pub fn request_to(addr: SocketAddr, connect_timeout: Duration) -> Result<Answer, String> {
    let mut stream = TcpStream::connect_timeout(&addr, connect_timeout)
        .map_err(|e| format!("connect {addr}: {e}"))?;
    stream
        .set_read_timeout(Some(IO_TIMEOUT))
        .and_then(|()| stream.set_write_timeout(Some(IO_TIMEOUT)))
        .map_err(|e| format!("socket options: {e}"))?;
    stream
        .write_all(format!("GET / HTTP/1.0\r\nHost: {}\r\n\r\n", host(addr.ip())).as_bytes())
        .map_err(|e| format!("send to {addr}: {e}"))?;
    let mut text = String::new();
    stream
        .read_to_string(&mut text)
        .map_err(|e| format!("read from {addr}: {e}"))?;
    parse_answer(&text)
}

/// `ip` as the host part of a URL (an IPv6 address in brackets).
fn host(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(ip) => ip.to_string(),
        IpAddr::V6(ip) => format!("[{ip}]"),
    }
}

/// Parses a pod's HTTP answer (head and body): the pod's name on the body's first line, the
/// source address it saw on the second (`client=IP`). No I/O.
pub fn parse_answer(text: &str) -> Result<Answer, String> {
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, body)| body)
        .ok_or_else(|| format!("no HTTP body in {text:?}"))?;
    let mut lines = body.lines();
    let pod = lines.next().unwrap_or_default().to_owned();
    let client = lines
        .next()
        .and_then(|l| l.strip_prefix("client="))
        // socat writes an IPv6 peer in brackets.
        .map(|c| c.trim_start_matches('[').trim_end_matches(']'))
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("no client= line in {body:?}"))?;
    Ok(Answer { pod, client })
}

/// One request from the client to `http://ip/`.
pub fn get(ip: Ipv4Addr) -> Result<Result<Answer, String>, Error> {
    in_client(move || request(ip))
}

/// One request from the client to `http://ip/`, either family.
pub fn get_ip(ip: IpAddr) -> Result<Result<Answer, String>, Error> {
    in_client(move || request_to(SocketAddr::from((ip, 80)), CONNECT_TIMEOUT))
}

/// `count` requests in a row (no pause); the answers or the first failure.
pub fn get_many(ip: Ipv4Addr, count: usize) -> Result<Result<Vec<Answer>, String>, Error> {
    in_client(move || (0..count).map(|_| request(ip)).collect())
}

/// What one TCP connection attempt from the client met, told apart the way the host-port
/// shield needs: a silent drop (nothing at all comes back) is not a refusal (a RST or an
/// ICMP error comes back), and neither is an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// Connected, and the peer sent this (lossy UTF-8, possibly cut at the read timeout).
    Answered(String),
    /// The SYN was answered with a RST (or an ICMP port unreachable): `ECONNREFUSED`.
    Refused,
    /// Nothing came back within the connect timeout: no SYN-ACK, no RST, no ICMP error.
    TimedOut,
    /// Anything else: connected but nothing read, reset after the handshake, no route, ...
    Failed(String),
}

/// One TCP connection from the client to `addr` (inside the client namespace): connects
/// within `connect_timeout`, sends `request` (may be empty), then reads until the peer
/// closes or [`IO_TIMEOUT`] passes.
pub fn tcp_probe(
    addr: SocketAddrV4,
    request: &[u8],
    connect_timeout: Duration,
) -> Result<Probe, Error> {
    let request = request.to_vec();
    in_client(move || {
        let addr = SocketAddr::V4(addr);
        let mut stream = match TcpStream::connect_timeout(&addr, connect_timeout) {
            Ok(stream) => stream,
            Err(e) if e.kind() == ErrorKind::TimedOut => return Probe::TimedOut,
            Err(e) if e.kind() == ErrorKind::ConnectionRefused => return Probe::Refused,
            Err(e) => return Probe::Failed(format!("connect {addr}: {e}")),
        };
        let setup = stream
            .set_read_timeout(Some(IO_TIMEOUT))
            .and_then(|()| stream.set_write_timeout(Some(IO_TIMEOUT)));
        if let Err(e) = setup {
            return Probe::Failed(format!("socket options: {e}"));
        }
        if !request.is_empty()
            && let Err(e) = stream.write_all(&request)
        {
            return Probe::Failed(format!("send to {addr}: {e}"));
        }
        let mut got = Vec::new();
        let read = stream.read_to_end(&mut got);
        let text = String::from_utf8_lossy(&got).into_owned();
        match read {
            Ok(_) if !got.is_empty() => Probe::Answered(text),
            // A slow peer that sent something and kept the connection open still answered.
            Err(e)
                if !got.is_empty()
                    && matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) =>
            {
                Probe::Answered(text)
            }
            Ok(_) => Probe::Failed(format!("{addr} accepted and closed without a byte")),
            Err(e) => Probe::Failed(format!("read from {addr}: {e} (after {text:?})")),
        }
    })
}

/// How the client got its answer back after a fault.
#[derive(Debug, Clone)]
pub struct Recovery {
    /// From the fault to the first accepted answer.
    pub after: Duration,
    /// Probes that got no answer at all (connection refused, timed out, ...).
    pub failed: u32,
    /// The accepted answer.
    pub answer: Answer,
}

/// What the prober's thread ends with: (when, failed probes, the answer), or (failed
/// probes, the last failure) when it gave up.
type ProbeOutcome = Result<(Instant, u32, Answer), (u32, String)>;

/// A prober started *before* a fault: it requests `http://ip/` every [`PROBE_PERIOD`] until
/// an answer passes `accept` (e.g. "forwarded by another node than the old holder").
#[derive(Debug)]
pub struct RecoveryProbe {
    ip: Ipv4Addr,
    thread: std::thread::JoinHandle<Result<ProbeOutcome, Error>>,
}

impl RecoveryProbe {
    /// Starts probing; it gives up `max` from now.
    pub fn start(
        ip: Ipv4Addr,
        max: Duration,
        accept: impl Fn(&Answer) -> bool + Send + 'static,
    ) -> RecoveryProbe {
        let thread = std::thread::spawn(move || {
            in_client(move || {
                let end = Instant::now() + max;
                let mut failed = 0;
                let mut last = String::from("no probe yet");
                let mut next = Instant::now();
                while Instant::now() < end {
                    match request(ip) {
                        Ok(answer) if accept(&answer) => {
                            return Ok((Instant::now(), failed, answer));
                        }
                        Ok(answer) => last = format!("not accepted: {answer:?}"),
                        Err(e) => {
                            failed += 1;
                            last = e;
                        }
                    }
                    next += PROBE_PERIOD;
                    if let Some(wait) = next.checked_duration_since(Instant::now()) {
                        std::thread::sleep(wait);
                    }
                }
                Err((failed, last))
            })
        });
        RecoveryProbe { ip, thread }
    }

    /// Waits for the accepted answer, timing it from `fault`.
    pub fn wait(self, fault: Instant) -> Result<Recovery, Error> {
        let ip = self.ip;
        let outcome = self
            .thread
            .join()
            .map_err(|_| Error::Environment("the client thread panicked".to_owned()))??;
        match outcome {
            Ok((at, failed, answer)) => Ok(Recovery {
                after: at.saturating_duration_since(fault),
                failed,
                answer,
            }),
            Err((failed, last)) => Err(Error::Timeout {
                what: format!("an accepted answer from http://{ip}/ ({failed} probes failed)"),
                waited: fault.elapsed(),
                last,
            }),
        }
    }
}
