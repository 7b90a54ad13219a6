//! Planned moves keep established connections (issue 45), the data path in the lab: the
//! real controller and agents, real kube-proxy (iptables and nftables modes), the pods' real
//! DNAT. The
//! client holds idle TCP connections to an `externalTrafficPolicy: Cluster` Service through
//! its holder; the holder is cordoned (the controller moves the IP, the old agent removes
//! its alias, the new one announces it); then every connection sends one request.
//!
//! - Today (no handover tables): every connection breaks (the new holder's kube-proxy
//!   takes the next packet for a new flow and its pod answers with a reset).
//! - With the agent's handover tables ([`aliaslb_agent::handover`]) on the nodes that may
//!   get the IP, forwarding to the old holder: none breaks, each answered through the old
//!   holder (its conntrack still DNATs the flow, without the alias), and a new connection is
//!   answered through the new holder.
//!
//! **The tables are written by the test, not by the agents**: the controller does not
//! write handover lines nor the agents act on them yet (NOTES-45.md, "What remains"). This
//! proves the kernel mechanism the agents will drive, with every real component around it.
//! Needs root:
//!
//! ```sh
//! cargo build --workspace --bins && cargo test -p aliaslb-e2e --test handover -- --nocapture
//! ```

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use aliaslb_agent::handover::{self, Rules};
use aliaslb_core::assignment::{Handover, Peer};
use aliaslb_e2e::Error;
use aliaslb_e2e::client::{self, parse_answer};
use aliaslb_e2e::fixtures::lb_service;
use aliaslb_e2e::lab::{
    CLIENT_NS, Lab, NODES, ProxyMode, node_ip, node_name, run_with_input, wait_for,
};

const NS: &str = "default";
const NAME: &str = "svc-1";
const CONNECTIONS: usize = 40;
const ANNOUNCE_TIMEOUT: Duration = Duration::from_secs(20);

#[test]
fn a_cordon_keeps_established_connections_with_the_handover_tables() -> Result<(), Error> {
    cordon_both_ways(ProxyMode::Iptables)
}

#[test]
fn a_cordon_keeps_established_connections_with_nftables_kube_proxy() -> Result<(), Error> {
    cordon_both_ways(ProxyMode::Nftables)
}

/// The cordon without the tables, then with them, kube-proxy in `mode`.
fn cordon_both_ways(mode: ProxyMode) -> Result<(), Error> {
    let Some(lab) = Lab::up_with(mode)? else {
        return Ok(());
    };
    let started = Instant::now();
    lab.apply(&lb_service(NS, NAME).to_yaml())?;
    let off = cordon_holding(&lab, false)?;
    let on = cordon_holding(&lab, true)?;
    println!(
        "[e2e] cordon of the holder, {CONNECTIONS} established connections (ETP=Cluster, kube-proxy {}): without handover {} broke; with the handover tables {} broke, {} answered through the old holder; a new connection answered through the new holder {:?} after the cordon",
        mode.as_str(),
        off.broken,
        on.broken,
        on.via_old,
        on.first_new
    );
    println!("[e2e] both cordons in {:?}", started.elapsed());
    assert_eq!(off.broken, CONNECTIONS, "today's figure: every one breaks");
    assert_eq!(on.broken, 0, "{on:?}");
    assert_eq!(on.via_old, CONNECTIONS, "{on:?}");
    Ok(())
}

#[derive(Debug)]
struct Outcome {
    broken: usize,
    via_old: usize,
    first_new: Duration,
    errors: BTreeMap<String, usize>,
}

/// Holds the connections through the holder, cordons it (with `tables`: the handover tables
/// on the other nodes first), waits for the new holder, sends one request on each; then
/// uncordons and removes the tables.
fn cordon_holding(lab: &Lab, tables: bool) -> Result<Outcome, Error> {
    let (ip, holder) = lab.wait_announced(NS, NAME, ANNOUNCE_TIMEOUT)?;
    let streams =
        client::in_namespace(CLIENT_NS, move || hold(ip))?.map_err(|why| Error::Output {
            cmd: "long-lived connections from the client".to_owned(),
            why,
        })?;
    let others: Vec<u8> = NODES.into_iter().filter(|n| *n != holder).collect();
    if tables {
        for n in &others {
            nft(*n, &handover::script(&forward_rules(ip, holder)))?;
        }
    }
    let cordoned = Instant::now();
    lab.kubectl(&["cordon", &node_name(holder)])?;
    let (_, new_holder) = wait_for("the IP to move", ANNOUNCE_TIMEOUT, || {
        let (got, node) = lab.wait_announced(NS, NAME, ANNOUNCE_TIMEOUT)?;
        Ok(if node == holder {
            Err(format!("{got} still on {}", node_name(node)))
        } else {
            Ok((got, node))
        })
    })?;
    let first_new = wait_for(
        "a new connection through the new holder",
        ANNOUNCE_TIMEOUT,
        || {
            Ok(match client::get(ip)? {
                Ok(a) if a.via_node() == Some(new_holder) => Ok(cordoned.elapsed()),
                Ok(a) => Err(format!("answered via {:?}", a.via_node())),
                Err(e) => Err(e),
            })
        },
    )?;
    let answers = client::in_namespace(CLIENT_NS, move || {
        streams.into_iter().map(request).collect::<Vec<_>>()
    })?;
    let mut outcome = Outcome {
        broken: 0,
        via_old: 0,
        first_new,
        errors: BTreeMap::new(),
    };
    for answer in answers {
        match answer {
            Ok(a) => outcome.via_old += usize::from(a.via_node() == Some(holder)),
            Err(e) => {
                outcome.broken += 1;
                *outcome.errors.entry(e).or_default() += 1;
            }
        }
    }
    lab.kubectl(&["uncordon", &node_name(holder)])?;
    for n in NODES {
        nft(n, &handover::lift_script())?;
    }
    Ok(outcome)
}

/// The handover lines of a node that got `ip` from `holder`, as its agent renders them.
fn forward_rules(ip: Ipv4Addr, holder: u8) -> Rules {
    let mut lines = BTreeMap::new();
    lines.insert(
        IpAddr::V4(ip),
        Handover {
            ports: [80].into(),
            forward: Some(Peer {
                node: node_name(holder),
                address: IpAddr::V4(node_ip(holder)),
            }),
            draining: false,
        },
    );
    let (rules, errors) = Rules::from_lines(&lines, |_| Some("eth0".to_owned()));
    assert!(errors.is_empty(), "{errors:?}");
    rules
}

/// Runs `script` through `nft -f -` on node `n`.
fn nft(n: u8, script: &str) -> Result<(), Error> {
    run_with_input(
        Command::new("ip").args(["netns", "exec", &node_name(n), "nft", "-f", "-"]),
        Some(script),
    )
    .map(drop)
}

/// Opens the idle connections (in the client's namespace), paced: the pods' socat forks a
/// shell per connection behind a short accept queue.
fn hold(ip: Ipv4Addr) -> Result<Vec<TcpStream>, String> {
    let addr = SocketAddr::from((ip, 80));
    (0..CONNECTIONS)
        .map(|_| {
            std::thread::sleep(Duration::from_millis(25));
            let s = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
                .map_err(|e| format!("connect {addr}: {e}"))?;
            s.set_read_timeout(Some(Duration::from_secs(3)))
                .map_err(|e| e.to_string())?;
            Ok(s)
        })
        .collect()
}

/// One request on an established connection: the pod's answer, or why it failed.
fn request(mut s: TcpStream) -> Result<client::Answer, String> {
    s.write_all(b"GET / HTTP/1.0\r\n\r\n")
        .map_err(|e| format!("send: {}", e.kind()))?;
    let mut text = String::new();
    s.read_to_string(&mut text)
        .map_err(|e| format!("read: {}", e.kind()))?;
    parse_answer(&text)
}
