//! The advert sockets over real UDP on loopback, with per-node keys: a holder's round
//! reaches its standby's port verified with the holder's own key; the relay forwards the
//! holder's datagram unchanged, once, to the address its assignment names; whatever a node
//! the assignment does not name sends, or a named node signs with another key, is dropped
//! and counted, never delivered; a replay is neither delivered, acked nor forwarded again.

use std::collections::BTreeSet;
use std::net::{IpAddr, UdpSocket};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aliaslb_agent::desired::{DesiredSet, StandbyLine};
use aliaslb_agent::l2::failover::trust::Trust;
use aliaslb_agent::l2::failover::wire::{Receiver, Sender, Signer, Stream, receive_loop};
use aliaslb_core::advert::{self, Ack, Advert, Message, PublicKey};
use aliaslb_core::assignment::{Peer, PeerNode};
use tokio::sync::{mpsc, watch};

fn free_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn advert_of(message: Message) -> Advert {
    match message {
        Message::Advert(advert) => advert,
        other => panic!("expected an advert, got {other:?}"),
    }
}

/// The keys of the nodes: the holder `h`, the standby `s`, and `w` (the node under test).
struct Keys {
    h: Signer,
    s: Signer,
    w: Signer,
}

/// `w`'s assignment: it stands by for h's 10.0.0.1, relays h's adverts to s at
/// 127.0.0.2, and holds 10.0.0.9 with s as its standby (s's acks count).
fn assignment_of_w(keys: &Keys) -> DesiredSet {
    let mut d = DesiredSet::new();
    d.add_standby(
        ip("10.0.0.1"),
        StandbyLine {
            holder: "h".into(),
            interface: None,
            ports: BTreeSet::new(),
            vmac: None,
        },
    );
    d.insert(ip("10.0.0.9"), None);
    d.set_peer(
        ip("10.0.0.9"),
        Peer {
            node: "s".into(),
            address: ip("127.0.0.2"),
        },
    );
    let peer = |key: PublicKey, relay_to: Vec<Peer>| PeerNode {
        key: Some(key),
        macs: BTreeSet::new(),
        relay_to: relay_to.into_iter().collect(),
    };
    let to_s = Peer {
        node: "s".into(),
        address: ip("127.0.0.2"),
    };
    d.add_peer("h".into(), peer(keys.h.public_key(), vec![to_s]));
    d.add_peer("s".into(), peer(keys.s.public_key(), vec![]));
    d
}

/// What w's receiver delivers, what it drops (by reason), and its task.
type Started = (
    mpsc::Receiver<Message>,
    Arc<Mutex<Vec<&'static str>>>,
    tokio::task::JoinHandle<std::io::Result<()>>,
);

/// Starts w's receiver on `port`.
fn start_w(keys: &Keys, port: u16) -> Started {
    let trust = Trust::of("w", &assignment_of_w(keys));
    // The sender dropped: the receiver keeps the trust it was started with.
    let (_, trust_rx) = watch::channel(Arc::new(trust));
    let (tx, rx) = mpsc::channel(64);
    let dropped = Arc::new(Mutex::new(Vec::new()));
    let seen = dropped.clone();
    let receiver = Receiver {
        node: "w".into(),
        port,
        signer: keys.w.clone(),
        trust: trust_rx,
    };
    let task = tokio::spawn(receive_loop(receiver, tx, move |d| {
        seen.lock().unwrap().push(d)
    }));
    (rx, dropped, task)
}

fn keys() -> Keys {
    Keys {
        h: Signer::generate().unwrap(),
        s: Signer::generate().unwrap(),
        w: Signer::generate().unwrap(),
    }
}

#[tokio::test]
async fn a_round_arrives_verified_and_the_relay_forwards_it_once() {
    let port = free_port();
    let keys = keys();
    let (mut rx, dropped, receiver) = start_w(&keys, port);
    tokio::time::sleep(Duration::from_millis(100)).await;

    let mut sender = Sender::new("h", port, keys.h.clone());
    let stream = Stream {
        to: "w".into(),
        address: ip("127.0.0.1"),
        interface: "lo".into(),
        relay: None,
        ips: vec![ip("10.0.0.1")],
    };
    assert_eq!(sender.round(&[stream]).await, 1);
    let got = advert_of(
        tokio::time::timeout(Duration::from_secs(2), rx.recv())
            .await
            .unwrap()
            .unwrap(),
    );
    assert_eq!((got.from.as_str(), got.to.as_str()), ("h", "w"));
    assert_eq!(got.ips, vec![ip("10.0.0.1")]);
    assert_eq!(got.counter, 1, "a key's counter starts at 1: no clock");

    // A stream to "s" at 127.0.0.2 through the relay "w" at 127.0.0.1: the direct copy
    // goes to 127.0.0.2 (w's socket, bound to every address, hears it: for another node,
    // forwarded, as the relay's copy is not: the same counter). w delivers neither.
    let stream = Stream {
        to: "s".into(),
        address: ip("127.0.0.2"),
        interface: "lo".into(),
        relay: Some(ip("127.0.0.1")),
        ips: vec![ip("10.0.0.2")],
    };
    assert_eq!(sender.round(&[stream]).await, 2);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(rx.try_recv().is_err(), "an advert for s is not w's");
    let counts = |d: &[&str], what: &str| d.iter().filter(|x| **x == what).count();
    {
        let d = dropped.lock().unwrap();
        // Two copies reach w (direct to .2, via .1): one forwarded to .2 (heard again by
        // w, a replay now), the rest replays: forwarded once, never looped.
        assert_eq!(counts(&d, "relayed"), 1, "{d:?}");
        assert!(counts(&d, "replayed") >= 1, "{d:?}");
    }

    // A node nobody named, a named holder signing with another key, and an advert of the
    // shared-key protocol of earlier releases: dropped, counted, nothing delivered.
    let stranger = Signer::generate().unwrap();
    let to_w = Stream {
        to: "w".into(),
        address: ip("127.0.0.1"),
        interface: "lo".into(),
        relay: None,
        ips: vec![ip("10.0.0.1")],
    };
    Sender::new("made-up", port, stranger.clone())
        .round(std::slice::from_ref(&to_w))
        .await;
    Sender::new("h", port, stranger)
        .round(std::slice::from_ref(&to_w))
        .await;
    let v1 = UdpSocket::bind("127.0.0.1:0").unwrap();
    v1.send_to(b"ALBA\x01\x01h\x01w", ("127.0.0.1", port))
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(rx.try_recv().is_err());
    {
        let d = dropped.lock().unwrap();
        for what in ["unknown_sender", "bad_signature", "other_version"] {
            assert_eq!(counts(&d, what), 1, "{what}: {d:?}");
        }
    }
    receiver.abort();
}

/// A socket of the holder at `address`:`port` (more specific than the receiver's wildcard
/// bind, so the acks sent to it land here).
fn holder_socket(address: &str, port: u16) -> std::net::UdpSocket {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP)).unwrap();
    socket.set_reuse_address(true).unwrap();
    let at: std::net::SocketAddr = format!("{address}:{port}").parse().unwrap();
    socket.bind(&at.into()).unwrap();
    socket
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    socket.into()
}

/// The acks `socket` receives, verified with `key` (w's).
fn acks(socket: &std::net::UdpSocket, key: &PublicKey) -> Vec<Ack> {
    let mut out = Vec::new();
    let mut buf = [0u8; 512];
    while let Ok((n, _)) = socket.recv_from(&mut buf) {
        match Message::verify(&buf[..n], key).expect("a valid ack") {
            Message::Ack(ack) => out.push(ack),
            other => panic!("expected an ack, got {other:?}"),
        }
    }
    out
}

// Two workers: the holder's socket reads block while the receive loop runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_standby_acks_each_advert_once_and_the_relay_acks_and_forwards_fresh_copies_only() {
    let port = free_port();
    let keys = keys();
    let (mut rx, _dropped, receiver) = start_w(&keys, port);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let holder = holder_socket("127.0.0.3", port);
    let standby = holder_socket("127.0.0.2", port);
    let to_w: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let w_key = keys.w.public_key();
    let advert = Advert {
        from: "h".into(),
        to: "w".into(),
        counter: 10,
        ips: vec![ip("10.0.0.1")],
    };
    holder.send_to(&advert.encode(&keys.h.key), to_w).unwrap();
    let got = acks(&holder, &w_key);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!((got[0].from.as_str(), got[0].to.as_str()), ("w", "h"));
    assert_eq!(advert_of(rx.recv().await.unwrap()), advert);
    // The same advert again (a replay): neither delivered nor acked.
    holder.send_to(&advert.encode(&keys.h.key), to_w).unwrap();
    assert!(acks(&holder, &w_key).is_empty(), "a replay is not acked");
    // h's advert for "s": forwarded unchanged to s's address (127.0.0.2), acked by "w".
    let for_s = Advert {
        counter: 11,
        to: "s".into(),
        ..advert.clone()
    };
    let datagram = for_s.encode(&keys.h.key);
    holder.send_to(&datagram, to_w).unwrap();
    let relayed = acks(&holder, &w_key);
    assert_eq!(relayed.len(), 1, "{relayed:?}");
    assert!(
        relayed[0].counter > got[0].counter,
        "the acker's counter grows"
    );
    let mut buf = [0u8; 2048];
    let (n, _) = standby.recv_from(&mut buf).expect("the forwarded advert");
    assert_eq!(&buf[..n], &datagram[..], "forwarded unchanged");
    assert_eq!(
        Message::verify(&buf[..n], &keys.h.public_key()),
        Ok(Message::Advert(for_s))
    );
    // The relayed copy replayed: not forwarded again, not acked.
    holder.send_to(&datagram, to_w).unwrap();
    assert!(
        standby.recv_from(&mut buf).is_err(),
        "a stale copy is not forwarded"
    );
    assert!(acks(&holder, &w_key).is_empty());
    // An ack from s (w's standby for 10.0.0.9) is delivered; one from h (no standby of
    // w's) is not, nor one for another node.
    let ack = |from: &str, to: &str, counter| Ack {
        from: from.into(),
        to: to.into(),
        counter,
    };
    let sent = [
        (ack("s", "w", 5), &keys.s),
        (ack("h", "w", 6), &keys.h),
        (ack("s", "x", 7), &keys.s),
    ];
    for (a, key) in &sent {
        holder.send_to(&a.encode(&key.key), to_w).unwrap();
    }
    let mut delivered = Vec::new();
    while let Ok(Some(m)) = tokio::time::timeout(Duration::from_millis(300), rx.recv()).await {
        delivered.push(m);
    }
    assert_eq!(delivered, vec![Message::Ack(ack("s", "w", 5))]);
    // The head alone names the sender: the bytes after it are never read unverified.
    assert_eq!(advert::head(&datagram).unwrap().from, "h");
    receiver.abort();
}
