//! What forwarding an established flow through the new holder costs (issue 45), against
//! the same flow reaching the old holder directly, in one run. Prints the figures recorded
//! in BENCHMARKS.md and asserts the forward rule really carried the forwarded rounds. Needs
//! root and `nft`.
//!
//! ```sh
//! cargo bench -p aliaslb-agent --bench handover
//! ```
//!
//! A client, the old holder `a` and the new holder `b` on one bridge (veths, network
//! namespaces). One TCP connection from the client to the IP, served by `a`; `b` has the IP
//! and its handover table forwarding to `a`. The client's neighbour entry for the IP is
//! switched between `a` (direct) and `b` (forwarded: client -> `b` -> `dup` -> `a`; the
//! answers go from `a` straight back) on the same connection, alternating:
//!
//! - latency: `BENCH_ROUNDS` (default 6) blocks of `BENCH_PINGS` (default 2,000) 64-byte
//!   round trips each way; median and p99 of the round trip;
//! - throughput: `BENCH_ROUNDS` uploads of `BENCH_MB` (default 256) MB client -> server (the
//!   forwarded direction) each way.
//!
//! Does I/O: network namespaces, `nft`, TCP between them.

mod stats;
#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use aliaslb_agent::handover::{self, Rules};
use aliaslb_agent::shield::nft::NftBackend;
use aliaslb_core::assignment::{Handover, Peer};
use stats::{env_number, median, ms};
use support::{NetNs, require_root};

const V: &str = "10.0.0.10";
const PORT: u16 = 8080;

fn mac(ns: &NetNs) -> String {
    let out = ns.ip(&["-j", "link", "show", "eth1"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    v[0]["address"].as_str().unwrap().to_owned()
}

/// Echoes each 64-byte message back; a message starting with `U` announces an upload of
/// the length that follows, answered with one byte once it is all in.
fn server(ns: &NetNs) {
    let (tx, rx) = std::sync::mpsc::channel();
    ns.spawn(move || {
        let listener = TcpListener::bind(("0.0.0.0", PORT)).unwrap();
        tx.send(()).unwrap();
        let (mut s, _) = listener.accept().unwrap();
        s.set_nodelay(true).unwrap();
        let mut msg = [0u8; 64];
        let mut sink = vec![0u8; 1 << 16];
        while s.read_exact(&mut msg).is_ok() {
            if msg[0] == b'U' {
                let mut left = u64::from_le_bytes(msg[1..9].try_into().unwrap());
                while left > 0 {
                    let want = sink.len().min(usize::try_from(left).unwrap());
                    let n = s.read(&mut sink[..want]).unwrap();
                    assert!(n > 0, "upload cut short");
                    left -= n as u64;
                }
                s.write_all(b"k").unwrap();
            } else {
                s.write_all(&msg).unwrap();
            }
        }
    });
    rx.recv().unwrap();
}

fn main() {
    if !require_root() {
        return;
    }
    let rounds = env_number("BENCH_ROUNDS", 6);
    let pings = env_number("BENCH_PINGS", 2000);
    let mb = env_number("BENCH_MB", 256);
    let bridge = NetNs::new("hobr");
    bridge.ip(&["link", "add", "br0", "type", "bridge"]);
    bridge.ip(&["link", "set", "br0", "up"]);
    let nodes: Vec<NetNs> = (1..=3)
        .map(|n| {
            let ns = NetNs::new(&format!("hob{n}"));
            let port = format!("p{n}");
            bridge.veth(&port, Some(&ns), "eth1");
            bridge.ip(&["link", "set", &port, "master", "br0"]);
            ns.ip(&["addr", "add", &format!("10.0.0.{n}/24"), "dev", "eth1"]);
            ns
        })
        .collect();
    let [c, a, b] = <[NetNs; 3]>::try_from(nodes).unwrap();
    a.ip(&["addr", "add", &format!("{V}/32"), "dev", "eth1"]);
    b.ip(&["addr", "add", &format!("{V}/32"), "dev", "eth1"]);
    b.exec("ping", &["-c1", "-W1", "10.0.0.2"]);
    let (a_mac, b_mac) = (mac(&a), mac(&b));
    let via = |m: &str| {
        c.ip(&[
            "neigh",
            "replace",
            V,
            "lladdr",
            m,
            "dev",
            "eth1",
            "nud",
            "permanent",
        ]);
    };
    via(&a_mac);
    server(&a);
    let mut lines = BTreeMap::new();
    lines.insert(
        V.parse::<IpAddr>().unwrap(),
        Handover {
            ports: [PORT].into(),
            forward: Some(Peer {
                node: "a".into(),
                address: "10.0.0.2".parse().unwrap(),
            }),
            draining: false,
        },
    );
    let (rules, errors) = Rules::from_lines(&lines, |_| Some("eth1".to_owned()));
    assert!(errors.is_empty());
    b.run(move || async move { handover::apply(&NftBackend::default(), &rules).await })
        .unwrap();

    c.enter();
    let mut s = TcpStream::connect(SocketAddr::new(V.parse().unwrap(), PORT)).unwrap();
    s.set_nodelay(true).unwrap();
    let mut lat: BTreeMap<&str, Vec<Duration>> = BTreeMap::new();
    let mut rate: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let chunk = vec![0x5au8; 1 << 16];
    for round in 0..rounds * 2 {
        // Alternate which goes first.
        let way = if (round + round / 2) % 2 == 0 {
            "direct"
        } else {
            "forwarded"
        };
        via(if way == "direct" { &a_mac } else { &b_mac });
        let mut msg = [b'p'; 64];
        let mut back = [0u8; 64];
        for _ in 0..pings {
            let t = Instant::now();
            s.write_all(&msg).unwrap();
            s.read_exact(&mut back).unwrap();
            lat.entry(way).or_default().push(t.elapsed());
        }
        let total = mb << 20;
        msg[0] = b'U';
        msg[1..9].copy_from_slice(&total.to_le_bytes());
        let t = Instant::now();
        s.write_all(&msg).unwrap();
        let mut left = total;
        while left > 0 {
            let n = chunk.len().min(usize::try_from(left).unwrap());
            s.write_all(&chunk[..n]).unwrap();
            left -= n as u64;
        }
        s.read_exact(&mut back[..1]).unwrap();
        let secs = t.elapsed().as_secs_f64();
        rate.entry(way)
            .or_default()
            .push((total as f64) * 8.0 / secs / 1e9);
    }
    let table = b.exec("nft", &["list", "table", "ip", handover::TABLE]);
    assert!(
        !table.contains("counter packets 0 "),
        "the forwarded rounds went through b's rule: {table}"
    );
    for way in ["direct", "forwarded"] {
        let mut xs = lat[way].clone();
        xs.sort();
        let p99 = xs[xs.len() * 99 / 100];
        let mut r = rate[way].clone();
        r.sort_by(f64::total_cmp);
        println!(
            "{way:9}: round trip median {:.1} us, p99 {:.1} us ({} round trips); upload {:.2} Gbit/s median of {} x {mb} MB (min {:.2}, max {:.2})",
            ms(median(&xs)) * 1000.0,
            ms(p99) * 1000.0,
            xs.len(),
            r[r.len() / 2],
            r.len(),
            r[0],
            r[r.len() - 1]
        );
    }
}
