//! Fast L2 failover, the I/O: the advert key read from its Secret, the UDP sockets that
//! send this node's adverts (each bound to the IP's own interface, so an advert never
//! leaves by another route when that link is down) and receive the others'.
//!
//! The run loop publishes the [`Stream`]s to send (one per standby node and interface,
//! with the IPs held there for it); [`send_loop`] sends one round of each every interval.
//! [`receive_loop`] verifies every datagram's MAC and hands the adverts to the loop, which
//! judges them ([`crate::l2::failover`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aliaslb_core::advert::{self, Ack, Advert, AdvertKey, Message};
use aliaslb_core::keys;
use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};
use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::UdpSocket;
use tokio::sync::{mpsc, watch};
use tracing::{debug, info, warn};

use crate::metrics::Metrics;

/// How often, at most, the key's Secret is read again (it may be deleted to rotate the
/// key); each wait is jittered ([`aliaslb_ops::backoff::jittered`]).
const KEY_EVERY: Duration = Duration::from_secs(60);

/// What one pair's adverts carry: sent to `address` through `interface`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Stream {
    /// The standby node.
    pub to: String,
    /// Its address on the IP's subnet.
    pub address: IpAddr,
    /// The interface the IPs are on.
    pub interface: String,
    /// The relay's address: a copy of each advert goes there, to be forwarded.
    pub relay: Option<IpAddr>,
    /// The IPs held for it on that interface (may be empty: "alive, holding nothing").
    pub ips: Vec<IpAddr>,
}

/// The advert key as last read: `None` while there is none (fast failover is off).
pub type KeyRx = watch::Receiver<Option<AdvertKey>>;

/// Reads the key from [`keys::ADVERT_KEY_SECRET`] in `namespace` now and every
/// [`KEY_EVERY`] (jittered down to half of it); a Secret that disappears keeps the last key (absence is no instruction).
pub async fn key_loop(client: Client, namespace: String, tx: watch::Sender<Option<AdvertKey>>) {
    let api: Api<Secret> = Api::namespaced(client, &namespace);
    let mut said: Option<String> = None;
    loop {
        let read = api.get_opt(keys::ADVERT_KEY_SECRET).await;
        let outcome = match read {
            Ok(Some(secret)) => match secret
                .data
                .as_ref()
                .and_then(|d| d.get(keys::ADVERT_KEY_DATA))
            {
                Some(bytes) => AdvertKey::new(&bytes.0).map(Some),
                None => Err(format!("it has no data key `{}`", keys::ADVERT_KEY_DATA)),
            },
            Ok(None) => Err("it does not exist (yet): the controller creates it".to_owned()),
            Err(e) => Err(format!("cannot read it: {e}")),
        };
        match outcome {
            Ok(key) => {
                if said.take().is_some() || tx.borrow().is_none() {
                    info!(
                        secret = keys::ADVERT_KEY_SECRET,
                        "advert key read: fast L2 failover is on"
                    );
                }
                tx.send_replace(key);
            }
            Err(why) => {
                if said.as_ref() != Some(&why) {
                    warn!(secret = keys::ADVERT_KEY_SECRET, %namespace, problem = %why, "no advert key: this node neither sends nor accepts adverts, its IPs fail over by the Lease only");
                    said = Some(why);
                }
            }
        }
        let wait = if tx.borrow().is_some() {
            KEY_EVERY
        } else {
            Duration::from_secs(5)
        };
        // Jittered within [wait / 2, wait]: the agents a rollout started together re-read
        // spread out, not all in the same second every minute.
        tokio::time::sleep(aliaslb_ops::backoff::jittered(wait)).await;
    }
}

/// A UDP socket on `port`: IPv4 (`v6` false) or IPv6 only, bound to `device` if given.
fn udp_socket(v6: bool, port: u16, device: Option<&str>) -> io::Result<UdpSocket> {
    let domain = if v6 { Domain::IPV6 } else { Domain::IPV4 };
    let socket = Socket::new(domain, Type::DGRAM, Some(Protocol::UDP))?;
    if v6 {
        socket.set_only_v6(true)?;
    }
    if let Some(device) = device {
        socket.bind_device(Some(device.as_bytes()))?;
    }
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    let any: IpAddr = if v6 {
        Ipv6Addr::UNSPECIFIED.into()
    } else {
        Ipv4Addr::UNSPECIFIED.into()
    };
    socket.bind(&SocketAddr::new(any, port).into())?;
    UdpSocket::from_std(socket.into())
}

/// The counter of this node's adverts: microseconds since the epoch at start, then +1 per
/// advert, so it grows across restarts too (with a sane clock).
#[derive(Debug)]
pub struct Counter(AtomicU64);

impl Default for Counter {
    fn default() -> Self {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(1, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX / 2));
        Counter(AtomicU64::new(now))
    }
}

impl Counter {
    fn next(&self) -> u64 {
        self.0.fetch_add(1, Ordering::Relaxed) + 1
    }
}

/// The sending side: a socket per interface and family, opened on first use.
#[derive(Debug)]
pub struct Sender {
    node: String,
    port: u16,
    counter: Counter,
    sockets: HashMap<(String, bool), UdpSocket>,
    failed: BTreeSet<(String, bool)>,
}

impl Sender {
    /// The sender of node `node`, to port `port`.
    pub fn new(node: &str, port: u16) -> Self {
        Sender {
            node: node.to_owned(),
            port,
            counter: Counter::default(),
            sockets: HashMap::new(),
            failed: BTreeSet::new(),
        }
    }

    /// Sends one round of every stream; returns the datagrams sent.
    pub async fn round(&mut self, key: &AdvertKey, streams: &[Stream]) -> usize {
        let mut sent = 0;
        for stream in streams {
            let v6 = stream.address.is_ipv6();
            let slot = (stream.interface.clone(), v6);
            if !self.sockets.contains_key(&slot) {
                match udp_socket(v6, 0, Some(&stream.interface)) {
                    Ok(socket) => {
                        self.sockets.insert(slot.clone(), socket);
                    }
                    Err(error) => {
                        if self.failed.insert(slot.clone()) {
                            warn!(interface = %stream.interface, %error, "cannot open an advert socket on this interface");
                        }
                        continue;
                    }
                }
            }
            let Some(socket) = self.sockets.get(&slot) else {
                continue;
            };
            let to = SocketAddr::new(stream.address, self.port);
            let counter = &self.counter;
            for advert in advert::round(&self.node, &stream.to, &stream.ips, || counter.next()) {
                match socket.send_to(&advert.encode(key), to).await {
                    Ok(_) => sent += 1,
                    // A link without carrier, no route: the standby hears silence, which
                    // is the truth.
                    Err(error) => {
                        debug!(%to, interface = %stream.interface, %error, "advert not sent")
                    }
                }
                // The same advert (same counter) through the relay, marked for forwarding.
                if let Some(relay) = stream.relay {
                    let copy = Advert {
                        via: Some(stream.address),
                        ..advert
                    };
                    let at = SocketAddr::new(relay, self.port);
                    match socket.send_to(&copy.encode(key), at).await {
                        Ok(_) => sent += 1,
                        Err(error) => {
                            debug!(%at, interface = %stream.interface, %error, "advert not sent to the relay")
                        }
                    }
                }
            }
        }
        sent
    }
}

/// Sends a round of the streams on `streams` every `interval` while a key is known.
/// Streams of a standby that are no longer published keep being sent, empty, for
/// [`LINGER`]: the standby then knows the IPs were let go, not lost.
pub async fn send_loop(
    mut sender: Sender,
    interval: Duration,
    mut key: KeyRx,
    mut streams: watch::Receiver<Vec<Stream>>,
    metrics: Arc<Metrics>,
) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    type Id = (String, IpAddr, String, Option<IpAddr>);
    let mut lingering: BTreeMap<Id, tokio::time::Instant> = BTreeMap::new();
    loop {
        tick.tick().await;
        let Some(k) = key.borrow_and_update().clone() else {
            continue;
        };
        let now = tokio::time::Instant::now();
        let mut round = streams.borrow_and_update().clone();
        let live: BTreeSet<Id> = round
            .iter()
            .map(|s| (s.to.clone(), s.address, s.interface.clone(), s.relay))
            .collect();
        for id in &live {
            lingering.insert(id.clone(), now + LINGER);
        }
        lingering.retain(|_, until| *until > now);
        for ((to, address, interface, relay), _) in
            lingering.iter().filter(|(id, _)| !live.contains(id))
        {
            round.push(Stream {
                to: to.clone(),
                address: *address,
                interface: interface.clone(),
                relay: *relay,
                ips: Vec::new(),
            });
        }
        let n = sender.round(&k, &round).await;
        metrics.add_adverts_sent(n as u64);
    }
}

/// How long a stream no longer published is still sent, empty.
pub const LINGER: Duration = Duration::from_secs(10);

/// One last round of every stream, empty (on SIGTERM, after the aliases are gone): the
/// standbys learn the IPs were let go and do not take them over.
pub async fn goodbye(node: &str, port: u16, key: Option<&AdvertKey>, streams: &[Stream]) {
    let Some(key) = key else { return };
    let empty: Vec<Stream> = streams
        .iter()
        .map(|s| Stream {
            ips: Vec::new(),
            ..s.clone()
        })
        .collect();
    Sender::new(node, port).round(key, &empty).await;
}

/// Why a datagram was dropped, for the metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dropped {
    /// No key yet.
    NoKey,
    /// Not an advert, malformed, or a MAC that does not verify.
    Invalid,
}

/// Receives adverts and acks on `port` (IPv4 and IPv6), verifies them with the current key
/// and sends those for this node (`node`) on `tx`; counts what it drops on `dropped`.
///
/// - A copy for a relay (`via`) that is for another node is forwarded to its `via` address
///   without `via`, signed again: never delivered here, never forwarded twice.
/// - Every advert with a counter above the last one acked from its sender (the first of
///   its direct and relayed copies; never a replay) is acked to its sender's address: by
///   the standby for its own adverts, by the relay for the copies it forwards. The holder
///   steps down from IPs whose standby and relay both stopped acking
///   ([`crate::l2::fence`]).
pub async fn receive_loop(
    node: String,
    port: u16,
    key: KeyRx,
    tx: mpsc::Sender<Message>,
    dropped: impl Fn(Dropped) + Send + 'static,
) -> io::Result<()> {
    let v4 = udp_socket(false, port, None)?;
    let v6 = udp_socket(true, port, None);
    if let Err(error) = &v6 {
        warn!(%error, port, "no IPv6 advert socket: IPv6 IPs fail over by the Lease only");
    }
    let v6 = v6.ok();
    let mut b4 = vec![0u8; 2048];
    let mut b6 = vec![0u8; 2048];
    let mut said_invalid = false;
    let counter = Counter::default();
    let mut acked: HashMap<String, u64> = HashMap::new();
    loop {
        let (n, from, buf) = tokio::select! {
            r = v4.recv_from(&mut b4) => { let (n, from) = r?; (n, from, &b4) }
            r = async { match &v6 { Some(s) => s.recv_from(&mut b6).await, None => std::future::pending().await } } => {
                let (n, from) = r?; (n, from, &b6)
            }
        };
        let Some(k) = key.borrow().clone() else {
            dropped(Dropped::NoKey);
            continue;
        };
        let socket_for = |address: IpAddr| {
            if address.is_ipv6() {
                v6.as_ref()
            } else {
                Some(&v4)
            }
        };
        match Message::decode(&k, &buf[..n]) {
            Ok(Message::Advert(mut advert)) => {
                let relayed = advert.via.take().filter(|_| advert.to != node);
                let fresh = acked
                    .get(&advert.from)
                    .is_none_or(|last| advert.counter > *last);
                if fresh && (relayed.is_some() || advert.to == node) {
                    acked.insert(advert.from.clone(), advert.counter);
                    let ack = Ack {
                        from: node.clone(),
                        to: advert.from.clone(),
                        counter: counter.next(),
                    };
                    let at = SocketAddr::new(from.ip(), port);
                    if let Some(socket) = socket_for(at.ip())
                        && let Err(error) = socket.send_to(&ack.encode(&k), at).await
                    {
                        debug!(%at, %error, "ack not sent");
                    }
                }
                if let Some(final_address) = relayed {
                    let at = SocketAddr::new(final_address, port);
                    if let Some(socket) = socket_for(final_address)
                        && let Err(error) = socket.send_to(&advert.encode(&k), at).await
                    {
                        debug!(%at, %error, "relayed advert not sent");
                    }
                    continue;
                }
                if tx.send(Message::Advert(advert)).await.is_err() {
                    return Ok(());
                }
            }
            Ok(Message::Ack(ack)) => {
                if ack.to == node && tx.send(Message::Ack(ack)).await.is_err() {
                    return Ok(());
                }
            }
            Err(error) => {
                dropped(Dropped::Invalid);
                if !said_invalid {
                    warn!(%from, %error, "advert dropped (said once; the metric counts them)");
                    said_invalid = true;
                }
            }
        }
    }
}
