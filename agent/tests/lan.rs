//! The LAN guard's AF_PACKET side against real kernels: a node namespace and a peer on
//! the far end of a veth. The peer's kernel answers our ARP probes and DAD solicitations
//! for the addresses it has; frames the peer sends by hand play the other claimants.
//! Needs root.

mod support;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::{Duration, Instant};

use aliaslb_agent::l2::announce::{garp_frame, send_frame, unsolicited_na_frame};
use aliaslb_agent::l2::lan::{
    ClaimKind, LanClaim, LanError, LanPort, LanWatch, ProbeConfig, ProbeOutcome, arp_probe_frame,
    dad_ns_frame,
};
use aliaslb_core::mac::Mac;
use pnet_datalink::Channel;
use support::{NetNs, node_and_lan, require_root};
use tokio::sync::mpsc::Receiver;

const TAKEN4: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 50);
const FREE4: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 51);
const TAKEN6: &str = "fd00:1::50";
const FREE6: &str = "fd00:1::51";

/// The node and its peer, with what the tests need to know about their links.
struct Lan {
    node: NetNs,
    peer: NetNs,
    node_if: u32,
    node_mac: Mac,
    peer_if: u32,
    peer_mac: Mac,
}

fn link(ns: &NetNs, dev: &str) -> (u32, Mac) {
    let v: serde_json::Value = serde_json::from_str(&ns.ip(&["-j", "link", "show", dev])).unwrap();
    let index = u32::try_from(v[0]["ifindex"].as_u64().unwrap()).unwrap();
    (index, v[0]["address"].as_str().unwrap().parse().unwrap())
}

fn lan(tag: &str) -> Lan {
    let (node, peer) = node_and_lan(tag);
    let (node_if, node_mac) = link(&node, "eth1");
    let (peer_if, peer_mac) = link(&peer, "lan0");
    Lan {
        node,
        peer,
        node_if,
        node_mac,
        peer_if,
        peer_mac,
    }
}

fn v6(s: &str) -> Ipv6Addr {
    s.parse().unwrap()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

impl Lan {
    /// A watch on the node's eth1 (its sockets and threads in the node namespace).
    fn watch(&self) -> (LanWatch, Receiver<LanClaim>) {
        let interfaces = [(self.node_if, self.node_mac)];
        self.node.run_sync(move || {
            let (watch, rx) = LanWatch::start();
            watch.set_interfaces(&interfaces);
            (watch, rx)
        })
    }

    /// Probes `ips` from the node; the outcomes and how long it took.
    fn probe(&self, watch: &LanWatch, ips: Vec<IpAddr>) -> (Vec<ProbeOutcome>, Duration) {
        let (watch, ifindex, mac) = (watch.clone(), self.node_if, self.node_mac);
        let order = ips.clone();
        let (results, took) = self.node.run(move || async move {
            let start = Instant::now();
            let r = watch
                .probe_many(ifindex, mac, ips, ProbeConfig::default())
                .await;
            (r, start.elapsed())
        });
        let results = results.expect("probe");
        assert_eq!(results.len(), order.len(), "every IP gets an outcome");
        (order.iter().map(|ip| results[ip]).collect(), took)
    }

    /// Sends `frame` from the peer; when it left.
    fn peer_sends(&self, frame: Vec<u8>) -> Instant {
        let ifindex = self.peer_if;
        self.peer.run_sync(move || {
            let at = Instant::now();
            send_frame(ifindex, &frame).expect("peer send");
            at
        })
    }
}

/// The next claim within `within`, if any.
fn next_claim(
    rt: &tokio::runtime::Runtime,
    rx: &mut Receiver<LanClaim>,
    within: Duration,
) -> Option<LanClaim> {
    rt.block_on(async { tokio::time::timeout(within, rx.recv()).await.ok().flatten() })
}

fn assert_window(took: Duration) {
    let window = ProbeConfig::default().window();
    assert!(
        took >= window - Duration::from_millis(10),
        "a free IP is probed for the whole window ({window:?}): took {took:?}"
    );
    assert!(
        took <= window + Duration::from_millis(300),
        "the probe overran its window ({window:?}): took {took:?}"
    );
}

#[test]
fn probe_ipv4_taken_by_the_peer_kernel_and_free() {
    if !require_root() {
        return;
    }
    let l = lan("lanp4");
    l.peer.ip(&["addr", "add", "10.0.0.50/24", "dev", "lan0"]);
    let (watch, _rx) = l.watch();

    let (outcomes, took) = l.probe(&watch, vec![TAKEN4.into(), FREE4.into()]);
    let taken = ProbeOutcome::Taken { mac: l.peer_mac };
    assert_eq!(outcomes, [taken, ProbeOutcome::Free]);
    assert_window(took);
    eprintln!("probe 10.0.0.50 (taken) + 10.0.0.51 (free): {took:?}");

    // Only taken IPs: the probe ends at the first answer.
    let (outcomes, took) = l.probe(&watch, vec![TAKEN4.into()]);
    assert_eq!(outcomes, [taken]);
    assert!(took < Duration::from_millis(100), "took {took:?}");
    eprintln!("probe of a taken IPv4 answered after {took:?}");

    // Nothing to probe: an answer at once; an interface that is not there: an error.
    let (w, node_if, mac) = (watch.clone(), l.node_if, l.node_mac);
    let (empty, missing) = l.node.run(move || async move {
        let config = ProbeConfig::default();
        let empty = w.probe_many(node_if, mac, vec![], config).await;
        let missing = w.probe_many(999_999, mac, vec![FREE4.into()], config).await;
        (empty, missing)
    });
    assert!(empty.expect("no IP").is_empty());
    assert!(
        matches!(
            missing,
            Err(LanError::Socket {
                ifindex: 999_999,
                ..
            })
        ),
        "{missing:?}"
    );
}

#[test]
fn probe_ipv6_taken_by_the_peer_kernel_and_free() {
    if !require_root() {
        return;
    }
    let l = lan("lanp6");
    // `nodad`: valid at once, not tentative; the peer kernel answers a DAD NS for it
    // with an NA to ff02::1 (ndisc_recv_ns).
    l.peer
        .ip(&["addr", "add", "fd00:1::50/64", "dev", "lan0", "nodad"]);
    let (watch, _rx) = l.watch();

    let (outcomes, took) = l.probe(&watch, vec![v6(TAKEN6).into(), v6(FREE6).into()]);
    let taken = ProbeOutcome::Taken { mac: l.peer_mac };
    assert_eq!(outcomes, [taken, ProbeOutcome::Free]);
    assert_window(took);
    eprintln!("probe fd00:1::50 (taken) + fd00:1::51 (free): {took:?}");

    let (outcomes, took) = l.probe(&watch, vec![v6(TAKEN6).into()]);
    assert_eq!(outcomes, [taken]);
    assert!(took < Duration::from_millis(100), "took {took:?}");
    eprintln!("probe of a taken IPv6 answered after {took:?}");
}

#[test]
fn a_simultaneous_probe_takes_the_ip() {
    if !require_root() {
        return;
    }
    let l = lan("lansim");
    let (watch, _rx) = l.watch();
    let (w, ifindex, mac) = (watch.clone(), l.node_if, l.node_mac);
    let quiet = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 52));
    let ips: Vec<IpAddr> = vec![FREE4.into(), v6(FREE6).into(), quiet];
    let probing = l
        .node
        .spawn(move || runtime().block_on(w.probe_many(ifindex, mac, ips, ProbeConfig::default())));
    // Both sides probe during the same window (RFC 5227 §2.1.1, RFC 4862 §5.4.3).
    std::thread::sleep(Duration::from_millis(50));
    l.peer_sends(arp_probe_frame(l.peer_mac, FREE4).to_vec());
    l.peer_sends(dad_ns_frame(l.peer_mac, v6(FREE6)));
    // The node's own announcement of an IP it probes is no conflict.
    let (ifindex, mac) = (l.node_if, l.node_mac);
    l.node.run_sync(move || {
        send_frame(ifindex, &garp_frame(mac.0, Ipv4Addr::new(10, 0, 0, 52))).unwrap();
    });
    let results = probing.join().unwrap().expect("probe");
    let taken = ProbeOutcome::Taken { mac: l.peer_mac };
    assert_eq!(results[&IpAddr::from(FREE4)], taken);
    assert_eq!(results[&IpAddr::from(v6(FREE6))], taken);
    assert_eq!(
        results[&quiet],
        ProbeOutcome::Free,
        "nobody else claimed this one"
    );
}

/// Watches `ip` on the node and checks what the peer's and the node's announcements of
/// it, and of `other` (unwatched), produce on the channel; `announce(mac, ip)` builds one.
fn watch_case(tag: &str, ip: IpAddr, other: IpAddr, announce: fn(Mac, IpAddr) -> Vec<u8>) {
    let l = lan(tag);
    let rt = runtime();
    let (watch, mut rx) = l.watch();
    // An interface whose socket cannot be opened is warned about, not fatal.
    let (w, good) = (watch.clone(), (l.node_if, l.node_mac));
    l.node
        .run_sync(move || w.set_interfaces(&[good, (999_999, Mac([2, 0, 0, 0, 0, 9]))]));
    watch.set_watched(&[ip]);

    let sent = l.peer_sends(announce(l.peer_mac, ip));
    let claim = next_claim(&rt, &mut rx, Duration::from_secs(1)).expect("the peer's claim");
    let latency = claim.at - sent;
    assert_eq!(
        (claim.ip, claim.mac, claim.kind, claim.ifindex),
        (ip, l.peer_mac, ClaimKind::Uses, l.node_if)
    );
    assert!(latency < Duration::from_millis(50), "{latency:?}");
    assert_eq!(
        next_claim(&rt, &mut rx, Duration::from_millis(150)),
        None,
        "one frame, one claim"
    );

    l.peer_sends(announce(l.peer_mac, other));
    assert_eq!(
        next_claim(&rt, &mut rx, Duration::from_millis(200)),
        None,
        "not watched"
    );

    // Our own defence reaches the peer (its kernel learns the IP at our MAC) and is not
    // reported; nor is an announcement from another socket (the watch sees it go out).
    let (w, ifindex, mac) = (watch.clone(), l.node_if, l.node_mac);
    let took = l.node.run_sync(move || {
        let start = Instant::now();
        w.defend(ifindex, mac, ip).unwrap();
        start.elapsed()
    });
    eprintln!("{tag}: defend took {took:?}");
    let family = if ip.is_ipv4() { "-4" } else { "-6" };
    let learnt = || {
        let neigh = l.peer.ip(&[
            family,
            "neigh",
            "show",
            "dev",
            "lan0",
            "to",
            &ip.to_string(),
        ]);
        neigh.contains(&l.node_mac.to_string())
    };
    let deadline = Instant::now() + Duration::from_secs(1);
    while !learnt() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(learnt(), "the peer learnt {ip} at our MAC from the defence");
    l.node
        .run_sync(move || send_frame(ifindex, &announce(mac, ip)).unwrap());
    assert_eq!(
        next_claim(&rt, &mut rx, Duration::from_millis(200)),
        None,
        "our own MAC"
    );

    // Unwatched again: quiet.
    watch.set_watched(&[]);
    l.peer_sends(announce(l.peer_mac, ip));
    assert_eq!(
        next_claim(&rt, &mut rx, Duration::from_millis(200)),
        None,
        "unwatched"
    );

    // Latency from the peer's send to the claim on the channel, one peer socket.
    watch.set_watched(&[ip]);
    let frame = announce(l.peer_mac, ip);
    let peer_if = l.peer_if;
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let sender = l.peer.spawn(move || {
        let iface = pnet_datalink::NetworkInterface {
            name: String::new(),
            description: String::new(),
            index: peer_if,
            mac: None,
            ips: Vec::new(),
            flags: 0,
        };
        let Ok(Channel::Ethernet(mut tx, _rx)) =
            pnet_datalink::channel(&iface, pnet_datalink::Config::default())
        else {
            panic!("peer socket");
        };
        let mut sent = Vec::new();
        for _ in 0..20 {
            ready_rx.recv().unwrap();
            sent.push(Instant::now());
            tx.send_to(&frame, None).unwrap().unwrap();
        }
        sent
    });
    let mut latencies = Vec::new();
    let mut received = Vec::new();
    for _ in 0..20 {
        ready_tx.send(()).unwrap();
        let claim = next_claim(&rt, &mut rx, Duration::from_secs(1)).expect("claim");
        received.push((claim, Instant::now()));
        std::thread::sleep(Duration::from_millis(10));
    }
    let sent = sender.join().unwrap();
    for ((claim, got), at) in received.iter().zip(&sent) {
        assert_eq!((claim.ip, claim.mac), (ip, l.peer_mac));
        latencies.push(*got - *at);
    }
    latencies.sort();
    let p50 = latencies[latencies.len() / 2];
    let p99 = latencies[latencies.len() - 1];
    eprintln!("{tag}: peer send -> claim on the channel over 20 sends: p50 {p50:?}, p99 {p99:?}");
    assert!(p50 < Duration::from_millis(50), "p50 {p50:?}");
    assert!(p99 < Duration::from_millis(500), "p99 {p99:?}");
    assert_eq!(watch.claims_reported(), 21);

    // The interface removed: its thread stops, nothing more is reported.
    let w = watch.clone();
    l.node.run_sync(move || w.set_interfaces(&[]));
    std::thread::sleep(Duration::from_millis(250));
    l.peer_sends(announce(l.peer_mac, ip));
    assert_eq!(
        next_claim(&rt, &mut rx, Duration::from_millis(200)),
        None,
        "no interface"
    );
}

#[test]
fn watch_reports_a_gratuitous_arp_for_a_watched_ip_only() {
    if !require_root() {
        return;
    }
    watch_case("lanw4", TAKEN4.into(), FREE4.into(), |mac, ip| match ip {
        IpAddr::V4(v4) => garp_frame(mac.0, v4).to_vec(),
        IpAddr::V6(_) => unreachable!(),
    });
}

#[test]
fn watch_reports_an_unsolicited_na_for_a_watched_ip_only() {
    if !require_root() {
        return;
    }
    watch_case(
        "lanw6",
        v6(TAKEN6).into(),
        v6(FREE6).into(),
        |mac, ip| match ip {
            IpAddr::V6(v6) => unsolicited_na_frame(mac.0, v6).to_vec(),
            IpAddr::V4(_) => unreachable!(),
        },
    );
}

#[test]
fn the_kernel_filter_keeps_data_traffic_out_of_user_space() {
    if !require_root() {
        return;
    }
    let l = lan("lanbpf");
    let (watch, _rx) = l.watch();
    let rx_packets = || -> u64 {
        l.node
            .exec("cat", &["/sys/class/net/eth1/statistics/rx_packets"])
            .trim()
            .parse()
            .unwrap()
    };
    let before = (rx_packets(), watch.frames_received());
    l.peer.run_sync(|| {
        let socket = std::net::UdpSocket::bind("10.0.0.1:0").unwrap();
        for _ in 0..500 {
            socket.send_to(&[0; 64], "10.0.0.2:9").unwrap();
        }
    });
    std::thread::sleep(Duration::from_millis(200));
    let after = (rx_packets(), watch.frames_received());
    assert!(after.0 - before.0 >= 500, "the node received the datagrams");
    let seen = after.1 - before.1;
    // The first datagram resolves 10.0.0.2: a request in, a reply out, maybe again.
    assert!(seen < 10, "user space saw {seen} frames of 500 datagrams");
    eprintln!("500 UDP datagrams: {seen} frames reached user space");
}

#[test]
fn a_socket_that_could_not_open_is_retried_and_one_that_failed_is_reopened() {
    if !require_root() {
        return;
    }
    let l = lan("lanre");
    let rt = runtime();
    // A second link made in the peer namespace, then moved to the node: its index is
    // known before the node has it (a move keeps the index when it is free).
    l.peer.veth("lan1", None, "eth2");
    let (eth2, eth2_mac) = link(&l.peer, "eth2");
    let (watch, mut rx) = LanWatch::start();
    let interfaces = [(l.node_if, l.node_mac), (eth2, eth2_mac)];
    let w = watch.clone();
    l.node.run_sync(move || w.set_interfaces(&interfaces));
    watch.set_watched(&[TAKEN4.into()]);
    let garp = garp_frame(l.peer_mac.0, TAKEN4).to_vec();
    l.peer_sends(garp.clone());
    let claim = next_claim(&rt, &mut rx, Duration::from_secs(1)).expect("claim on eth1");
    assert_eq!(claim.ifindex, l.node_if);

    l.peer.ip(&["link", "set", "eth2", "netns", l.node.name()]);
    l.node.ip(&["link", "set", "eth2", "up"]);
    assert_eq!(link(&l.node, "eth2").0, eth2, "the move kept the index");
    let w = watch.clone();
    l.node.run_sync(move || w.set_interfaces(&interfaces));
    let peer_lan1 = link(&l.peer, "lan1").0;
    let frame = garp.clone();
    l.peer
        .run_sync(move || send_frame(peer_lan1, &frame).unwrap());
    let claim = next_claim(&rt, &mut rx, Duration::from_secs(1)).expect("claim on eth2");
    assert_eq!((claim.ifindex, claim.mac), (eth2, l.peer_mac));

    // A link set down flags the socket with ENETDOWN; the thread reopens it and the watch
    // works again once the link is back up.
    l.node.ip(&["link", "set", "eth1", "down"]);
    std::thread::sleep(Duration::from_millis(300));
    l.node.ip(&["link", "set", "eth1", "up"]);
    let deadline = Instant::now() + Duration::from_secs(5);
    let recovered = loop {
        l.peer_sends(garp.clone());
        if let Some(claim) = next_claim(&rt, &mut rx, Duration::from_millis(100)) {
            break Some(claim);
        }
        if Instant::now() > deadline {
            break None;
        }
    };
    let claim = recovered.expect("claims on eth1 after the link came back");
    assert_eq!(claim.ifindex, l.node_if);
}
