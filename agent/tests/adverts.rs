//! The advert sockets over real UDP on loopback: a holder's round reaches the standby's
//! port with its MAC verified; a copy for a relay is forwarded by the relay (signed again,
//! without `via`) and never delivered there as its own; a datagram under another key is
//! dropped and counted. Acks: the standby acks each advert once (never a replay), the relay
//! acks the copies it forwards.

use std::net::{IpAddr, UdpSocket};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aliaslb_agent::l2::failover::wire::{Dropped, Sender, Stream, receive_loop};
use aliaslb_core::advert::{Ack, Advert, AdvertKey, Message};
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

#[tokio::test]
async fn a_round_arrives_verified_and_a_relay_forwards_its_copy() {
    let port = free_port();
    let key = AdvertKey::new(&[7; 32]).unwrap();
    let (_key_tx, key_rx) = watch::channel(Some(key.clone()));
    let (tx, mut rx) = mpsc::channel(16);
    let dropped = Arc::new(Mutex::new(Vec::new()));
    let seen = dropped.clone();
    // The receiver of node "w": it relays for "s".
    let receiver = tokio::spawn(receive_loop("w".into(), port, key_rx, tx, move |d| {
        seen.lock().unwrap().push(d)
    }));
    tokio::time::sleep(Duration::from_millis(100)).await;

    let mut sender = Sender::new("h", port);
    let stream = Stream {
        to: "w".into(),
        address: ip("127.0.0.1"),
        interface: "lo".into(),
        relay: None,
        ips: vec![ip("10.0.0.1")],
    };
    assert_eq!(sender.round(&key, &[stream]).await, 1);
    let got = advert_of(
        tokio::time::timeout(Duration::from_secs(2), rx.recv())
            .await
            .unwrap()
            .unwrap(),
    );
    assert_eq!((got.from.as_str(), got.to.as_str()), ("h", "w"));
    assert_eq!(got.ips, vec![ip("10.0.0.1")]);
    assert_eq!(got.via, None);

    // A stream to "s" at 127.0.0.2 through the relay "w" at 127.0.0.1: the direct copy
    // goes to 127.0.0.2 (w's socket, bound to every address, hears it: for another node,
    // delivered as is), the relay's copy is forwarded to 127.0.0.2 without `via` (heard
    // again, the same counter). The copy marked `via` is never delivered.
    let stream = Stream {
        to: "s".into(),
        address: ip("127.0.0.2"),
        interface: "lo".into(),
        relay: Some(ip("127.0.0.1")),
        ips: vec![ip("10.0.0.2")],
    };
    assert_eq!(sender.round(&key, &[stream]).await, 2);
    let mut copies: Vec<Advert> = Vec::new();
    while copies.len() < 2 {
        let got = tokio::time::timeout(Duration::from_secs(2), rx.recv())
            .await
            .expect("the direct advert and the relayed one")
            .unwrap();
        copies.push(advert_of(got));
    }
    assert!(
        copies.iter().all(|a| a.to == "s" && a.via.is_none()),
        "{copies:?}"
    );
    assert_eq!(
        copies[0].counter, copies[1].counter,
        "one advert, two paths"
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(300), rx.recv())
            .await
            .is_err(),
        "forwarded once, never looped"
    );

    // Another cluster's key: dropped, counted.
    let other = AdvertKey::new(&[8; 32]).unwrap();
    let stream = Stream {
        to: "w".into(),
        address: ip("127.0.0.1"),
        interface: "lo".into(),
        relay: None,
        ips: vec![],
    };
    Sender::new("h", port).round(&other, &[stream]).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(rx.try_recv().is_err());
    assert_eq!(*dropped.lock().unwrap(), vec![Dropped::Invalid]);
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

fn acks(socket: &std::net::UdpSocket, key: &AdvertKey) -> Vec<Ack> {
    let mut out = Vec::new();
    let mut buf = [0u8; 512];
    while let Ok((n, _)) = socket.recv_from(&mut buf) {
        out.push(Ack::decode(key, &buf[..n]).expect("a valid ack"));
    }
    out
}

// Two workers: the holder's socket reads block while the receive loop runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_standby_acks_each_advert_once_and_the_relay_acks_the_copies_it_forwards() {
    let port = free_port();
    let key = AdvertKey::new(&[7; 32]).unwrap();
    let (_key_tx, key_rx) = watch::channel(Some(key.clone()));
    let (tx, mut rx) = mpsc::channel(16);
    // Node "w" on 127.0.0.1: the standby of the adverts to it, the relay of those to "s".
    let receiver = tokio::spawn(receive_loop("w".into(), port, key_rx, tx, |_| {}));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let holder = holder_socket("127.0.0.3", port);
    let to_w: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let advert = Advert {
        from: "h".into(),
        to: "w".into(),
        counter: 10,
        via: None,
        ips: vec![ip("10.0.0.1")],
    };
    holder.send_to(&advert.encode(&key), to_w).unwrap();
    let got = acks(&holder, &key);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!((got[0].from.as_str(), got[0].to.as_str()), ("w", "h"));
    assert_eq!(advert_of(rx.recv().await.unwrap()), advert);
    // The same advert again (a replay): delivered (the loop counts it stale), not acked.
    holder.send_to(&advert.encode(&key), to_w).unwrap();
    assert!(acks(&holder, &key).is_empty(), "a replay is not acked");
    // A copy for the relay: forwarded to "s" (127.0.0.4, nobody there) and acked by "w".
    let copy = Advert {
        counter: 11,
        to: "s".into(),
        via: Some(ip("127.0.0.4")),
        ..advert.clone()
    };
    holder.send_to(&copy.encode(&key), to_w).unwrap();
    let relayed = acks(&holder, &key);
    assert_eq!(relayed.len(), 1, "{relayed:?}");
    assert_eq!(relayed[0].from, "w");
    assert!(
        relayed[0].counter > got[0].counter,
        "the acker's counter grows"
    );
    // An ack for "w" is delivered to its loop; one for another node is not.
    for (to, counter) in [("w", 5), ("x", 6)] {
        let ack = Ack {
            from: "s".into(),
            to: to.into(),
            counter,
        };
        holder.send_to(&ack.encode(&key), to_w).unwrap();
    }
    let mut delivered = Vec::new();
    while let Ok(Some(m)) = tokio::time::timeout(Duration::from_millis(300), rx.recv()).await {
        delivered.push(m);
    }
    let for_w: Vec<&Message> = delivered
        .iter()
        .filter(|m| matches!(m, Message::Ack(_)))
        .collect();
    assert_eq!(
        for_w,
        vec![&Message::Ack(Ack {
            from: "s".into(),
            to: "w".into(),
            counter: 5
        })]
    );
    receiver.abort();
}
