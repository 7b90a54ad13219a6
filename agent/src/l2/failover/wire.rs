//! Fast L2 failover, the I/O: the UDP sockets that send this node's adverts (each bound to
//! the IP's own interface, so an advert never leaves by another route when that link is
//! down), receive the others' and forward those this node relays.
//!
//! The run loop publishes the [`Stream`]s to send (one per standby node and interface,
//! with the IPs held there for it); [`send_loop`] sends one round of each every interval,
//! signed with this node's key. [`receive_loop`] reads every datagram's head, drops what
//! comes from a sender this node's assignment does not name ([`Trust`]) before checking
//! anything else or keeping any state, verifies the rest with its sender's key, drops
//! replays, and hands the adverts and acks for this node to [`super::FastFailover`].

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use aliaslb_core::advert::{self, Ack, AdvertError, Kind, Message, PublicKey, SigningKey};
use socket2::{Domain, Protocol, Socket, Type};
use tokio::net::UdpSocket;
use tokio::sync::{mpsc, watch};
use tracing::{debug, warn};

use super::metrics::FailoverMetrics;
use super::trust::{Trust, Verdict};

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

/// The counter of this node's messages (adverts and acks): from 1, +1 per message. It
/// belongs to the key, made at the agent's start, so no clock is involved: a restarted
/// agent signs with a new key, and its peers compare counters under that key only.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    /// The next value.
    pub fn next(&self) -> u64 {
        self.0.fetch_add(1, Ordering::Relaxed) + 1
    }
}

/// What signs this node's messages: its key and the counter under it.
#[derive(Debug, Clone)]
pub struct Signer {
    /// The key, made at start.
    pub key: Arc<SigningKey>,
    /// The counter under it, shared by the sender and the receiver (for acks).
    pub counter: Arc<Counter>,
}

impl Signer {
    /// A fresh key, counting from 1.
    pub fn generate() -> Result<Self, String> {
        Ok(Signer {
            key: Arc::new(SigningKey::generate()?),
            counter: Arc::default(),
        })
    }

    /// The public half of the key, for the report.
    pub fn public_key(&self) -> PublicKey {
        self.key.public_key()
    }
}

/// The sending side: a socket per interface and family, opened on first use.
#[derive(Debug)]
pub struct Sender {
    node: String,
    port: u16,
    signer: Signer,
    sockets: HashMap<(String, bool), UdpSocket>,
    failed: BTreeSet<(String, bool)>,
}

impl Sender {
    /// The sender of node `node`, to port `port`, signing with `signer`.
    pub fn new(node: &str, port: u16, signer: Signer) -> Self {
        Sender {
            node: node.to_owned(),
            port,
            signer,
            sockets: HashMap::new(),
            failed: BTreeSet::new(),
        }
    }

    /// Sends one round of every stream; returns the datagrams sent.
    pub async fn round(&mut self, streams: &[Stream]) -> usize {
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
            let counter = &self.signer.counter;
            for advert in advert::round(&self.node, &stream.to, &stream.ips, || counter.next()) {
                let datagram = advert.encode(&self.signer.key);
                match socket.send_to(&datagram, to).await {
                    Ok(_) => sent += 1,
                    // A link without carrier, no route: the standby hears silence, which
                    // is the truth.
                    Err(error) => {
                        debug!(%to, interface = %stream.interface, %error, "advert not sent")
                    }
                }
                // The same datagram through the relay, which forwards it unchanged.
                if let Some(relay) = stream.relay {
                    let at = SocketAddr::new(relay, self.port);
                    match socket.send_to(&datagram, at).await {
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

/// Sends a round of the streams on `streams` every `interval`. Streams of a standby that
/// are no longer published keep being sent, empty, for [`LINGER`]: the standby then knows
/// the IPs were let go, not lost.
pub async fn send_loop(
    mut sender: Sender,
    interval: Duration,
    mut streams: watch::Receiver<Vec<Stream>>,
    metrics: FailoverMetrics,
) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    type Id = (String, IpAddr, String, Option<IpAddr>);
    let mut lingering: BTreeMap<Id, tokio::time::Instant> = BTreeMap::new();
    loop {
        tick.tick().await;
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
        let n = sender.round(&round).await;
        metrics.add_sent(n as u64);
    }
}

/// The wire of one node, running: where the streams to send are published (for
/// [`super::FailoverSetup::streams`]), where whom to believe is published (for
/// [`super::FailoverSetup::trust`]), and what the goodbye needs.
#[derive(Debug)]
pub struct Wire {
    streams: watch::Sender<Vec<Stream>>,
    trust: watch::Sender<Arc<Trust>>,
    node: String,
    port: Option<u16>,
    signer: Signer,
}

impl Wire {
    /// Starts the receiver and the sender of node `node` on `port` (`None`: no adverts at
    /// all, the streams go nowhere and nothing is heard), adverts every `interval`, signed
    /// by `signer`. Returns the wire and the adverts and acks heard, verified (for
    /// [`super::FailoverSetup::heard`]).
    pub fn start(
        node: &str,
        port: Option<u16>,
        interval: Duration,
        signer: Signer,
        metrics: FailoverMetrics,
    ) -> (Self, mpsc::Receiver<Message>) {
        let (heard_tx, heard) = mpsc::channel(1024);
        let (streams, streams_rx) = watch::channel(Vec::new());
        let (trust, trust_rx) = watch::channel(Arc::default());
        let wire = Wire {
            streams,
            trust,
            node: node.to_owned(),
            port,
            signer: signer.clone(),
        };
        let Some(port) = port else {
            warn!(
                "--advert-port 0: no fast-failover adverts; this node's IPs fail over by the Lease only"
            );
            return (wire, heard);
        };
        let received = metrics.clone();
        let receiver = receive_loop(
            Receiver {
                node: node.to_owned(),
                port,
                signer: signer.clone(),
                trust: trust_rx,
            },
            heard_tx,
            move |why| received.inc_received(why),
        );
        tokio::spawn(async move {
            if let Err(e) = receiver.await {
                tracing::error!(error = %e, port, "the advert receiver stopped: this node no longer takes over for silent holders");
            }
        });
        tokio::spawn(send_loop(
            Sender::new(node, port, signer),
            interval,
            streams_rx,
            metrics,
        ));
        (wire, heard)
    }

    /// Where the streams to send go (`None`: no adverts are sent).
    pub fn streams(&self) -> Option<watch::Sender<Vec<Stream>>> {
        self.port.map(|_| self.streams.clone())
    }

    /// Where whom to believe goes.
    pub fn trust(&self) -> watch::Sender<Arc<Trust>> {
        self.trust.clone()
    }

    /// Stops advertising IPs (before they are removed at shutdown: no IP is held from
    /// here on, and the adverts still sent say so); returns the streams as they were.
    pub fn let_go(&self) -> Vec<Stream> {
        self.streams.send_replace(Vec::new())
    }

    /// One last round of every stream of `streams`, empty (on SIGTERM, after the aliases
    /// are gone): the standbys learn the IPs were let go and do not take them over.
    pub async fn goodbye(&self, streams: &[Stream]) {
        let Some(port) = self.port else { return };
        let empty: Vec<Stream> = streams
            .iter()
            .map(|s| Stream {
                ips: Vec::new(),
                ..s.clone()
            })
            .collect();
        Sender::new(&self.node, port, self.signer.clone())
            .round(&empty)
            .await;
    }
}

/// How long a stream no longer published is still sent, empty.
pub const LINGER: Duration = Duration::from_secs(10);

/// The receiving side of one node.
#[derive(Debug)]
pub struct Receiver {
    /// This node.
    pub node: String,
    /// The advert port.
    pub port: u16,
    /// Signs the acks.
    pub signer: Signer,
    /// Whom to believe, as the assignment says (published by [`super::FastFailover`]).
    pub trust: watch::Receiver<Arc<Trust>>,
}

/// The last counter accepted from each sender named, under its key: bounded by the senders
/// the assignment names, pruned when it stops naming one.
#[derive(Debug, Default)]
struct Seen(HashMap<(Kind, String, Option<String>), (PublicKey, u64)>);

impl Seen {
    /// Whether `counter` from `from` (to `to`, for a relayed advert) under `key` is above
    /// the last one accepted; if so it is the last one now. A new key starts afresh.
    fn fresh(
        &mut self,
        kind: Kind,
        from: &str,
        to: Option<&str>,
        key: PublicKey,
        counter: u64,
    ) -> bool {
        let slot = self
            .0
            .entry((kind, from.to_owned(), to.map(str::to_owned)))
            .or_insert((key, 0));
        if slot.0 != key {
            *slot = (key, 0);
        }
        if counter <= slot.1 {
            return false;
        }
        slot.1 = counter;
        true
    }

    /// Forgets the senders `trust` no longer names.
    fn prune(&mut self, trust: &Trust) {
        self.0.retain(|(_, from, _), _| trust.names(from));
    }
}

/// Receives adverts and acks on `port` (IPv4 and IPv6) and acts on each by its head
/// ([`Trust::judge`]): from a sender the assignment does not name, dropped unverified;
/// else verified with that sender's key, dropped if its counter is not above the last one
/// accepted under that key (a replay, or the second copy of an advert), then:
///
/// - an advert or ack for this node goes to `tx`; an advert is acked to the address it
///   came from (by the standby for the holder's own copy, or to the relay for the copy
///   it forwarded);
/// - an advert this node relays is forwarded unchanged to the standby's address its
///   assignment names (never to one the datagram names) and acked to its holder: the
///   holder steps down from IPs whose standby and relay both stopped acking
///   ([`super::holder`]).
///
/// What it drops is counted on `dropped`, by reason; nothing it drops leaves state behind.
pub async fn receive_loop(
    mut r: Receiver,
    tx: mpsc::Sender<Message>,
    dropped: impl Fn(&'static str) + Send + 'static,
) -> io::Result<()> {
    let v4 = udp_socket(false, r.port, None)?;
    let v6 = udp_socket(true, r.port, None);
    if let Err(error) = &v6 {
        warn!(%error, port = r.port, "no IPv6 advert socket: IPv6 IPs fail over by the Lease only");
    }
    let v6 = v6.ok();
    let mut b4 = vec![0u8; 2048];
    let mut b6 = vec![0u8; 2048];
    let mut said_invalid = false;
    let mut seen = Seen::default();
    let mut trust = r.trust.borrow_and_update().clone();
    loop {
        let (n, from, buf) = tokio::select! {
            r = v4.recv_from(&mut b4) => { let (n, from) = r?; (n, from, &b4) }
            r = async { match &v6 { Some(s) => s.recv_from(&mut b6).await, None => std::future::pending().await } } => {
                let (n, from) = r?; (n, from, &b6)
            }
        };
        if r.trust.has_changed().unwrap_or(false) {
            trust = r.trust.borrow_and_update().clone();
            seen.prune(&trust);
        }
        let datagram = &buf[..n];
        let socket_for = |address: IpAddr| {
            if address.is_ipv6() {
                v6.as_ref()
            } else {
                Some(&v4)
            }
        };
        let head = match advert::head(datagram) {
            Ok(head) => head,
            Err(error) => {
                dropped(match error {
                    AdvertError::OtherVersion(_) => "other_version",
                    _ => "invalid",
                });
                if !said_invalid {
                    warn!(%from, %error, "advert dropped (said once; the metric counts them)");
                    said_invalid = true;
                }
                continue;
            }
        };
        let (key, forward_to) = match trust.judge(&head) {
            Verdict::Deliver(key) => (key, None),
            Verdict::Forward(key, address) => (key, Some(address)),
            Verdict::Drop(why) => {
                dropped(why);
                continue;
            }
        };
        let message = match Message::verify(datagram, &key) {
            Ok(message) => message,
            Err(_) => {
                dropped("bad_signature");
                continue;
            }
        };
        let relayed_to = forward_to.map(|_| head.to);
        if !seen.fresh(head.kind, head.from, relayed_to, key, head.counter) {
            dropped("replayed");
            continue;
        }
        if head.kind == Kind::Advert {
            let ack = Ack {
                from: r.node.clone(),
                to: head.from.to_owned(),
                counter: r.signer.counter.next(),
            };
            let at = SocketAddr::new(from.ip(), r.port);
            if let Some(socket) = socket_for(at.ip())
                && let Err(error) = socket.send_to(&ack.encode(&r.signer.key), at).await
            {
                debug!(%at, %error, "ack not sent");
            }
        }
        if let Some(address) = forward_to {
            let at = SocketAddr::new(address, r.port);
            if let Some(socket) = socket_for(address)
                && let Err(error) = socket.send_to(datagram, at).await
            {
                debug!(%at, %error, "relayed advert not sent");
            }
            dropped("relayed");
            continue;
        }
        if tx.send(message).await.is_err() {
            return Ok(());
        }
    }
}
