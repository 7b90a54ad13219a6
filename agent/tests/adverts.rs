//! The advert sockets over real UDP on loopback: a holder's round reaches the standby's
//! port with its MAC verified; a copy for a relay is forwarded by the relay (signed again,
//! without `via`) and never delivered there as its own; a datagram under another key is
//! dropped and counted.

use std::net::{IpAddr, UdpSocket};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aliaslb_agent::l2::adverts::{Dropped, Sender, Stream, receive_loop};
use aliaslb_core::advert::{Advert, AdvertKey};
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
    let got = tokio::time::timeout(Duration::from_secs(2), rx.recv())
        .await
        .unwrap()
        .unwrap();
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
        copies.push(got);
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
