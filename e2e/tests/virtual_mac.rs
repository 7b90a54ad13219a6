//! Virtual MACs (`virtualMAC: true`) over the dual-stack lab, with the real binaries, the
//! real kernel's macvlans and the real kube-proxy. From the client on the LAN:
//!
//! - each IP of a dual-stack Service is on a macvlan of its holder named after the IP's MAC
//!   (`02:00:` and the IPv4 octets; `06:` and a hash for IPv6), and only that MAC answers
//!   ARP / NDP for it: not the holder's own MAC (the parent's `arp_ignore`), and the
//!   macvlan answers for nothing else (an ARP for the holder's own address gets the node's
//!   MAC only);
//! - a client whose neighbour entries are pinned (`nud permanent`) to the virtual MACs is
//!   answered, over both families;
//! - the host-port shield covers the macvlan: a host listener of the holder answers on the
//!   node's address and is dropped on the VIP;
//! - the holder is cordoned: the IPs move, the macvlan with them (gone from the old node),
//!   and the pinned client keeps being answered through the new holder with its entries
//!   untouched: no gratuitous ARP or NA needed to reach it. The LAN sampler sees one MAC,
//!   the virtual one, for the whole move;
//! - the new holder dies hard (agent killed, cable pulled): its standby takes the IPs over
//!   with their MACs, and the pinned client is answered again; the dead node's agent,
//!   restarted, removes the macvlan it left behind (the IPs are elsewhere);
//! - the Service is deleted: the macvlan goes.
//!
//! One lab for the binary, so one test function running the phases in order. Needs root:
//!
//! ```sh
//! cargo build --workspace --bins && cargo test -p aliaslb-e2e --test virtual_mac -- --nocapture
//! ```

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::process::Command;
use std::time::{Duration, Instant};

use aliaslb_e2e::Error;
use aliaslb_e2e::client;
use aliaslb_e2e::fixtures::{Families, lb_service, namespace};
use aliaslb_e2e::lab::{CLIENT_NS, Lab, NODES, node_ip, node_name, run, wait_for};
use aliaslb_e2e::lan::{LanSampler, Mac, ndp_answers};

const NS: &str = "e2e-vmac";
const IP4: &str = "192.168.55.70";
const IP6: &str = "fd55::70";
const ANNOUNCE_TIMEOUT: Duration = Duration::from_secs(20);
/// A host listener on the holder.
const HOST_PORT: u16 = 2222;
/// Cordon to answered again, through the new holder.
const MOVE_BOUND: Duration = Duration::from_secs(5);

#[test]
fn virtual_macs_move_with_their_ips() -> Result<(), Error> {
    let Some(lab) = Lab::up()? else {
        return Ok(());
    };
    lab.apply(&namespace(NS))?;
    let pool = format!("{IP4}\n{IP6}\n");
    let options = format!("pools:\n  {NS}:\n    virtualMAC: true\n");
    let patch = serde_json::json!({"data": {NS: pool, "config.yaml": options}}).to_string();
    lab.patch_pools(&patch)?;
    lab.apply(&lb_service(NS, "web").families(Families::Dual).to_yaml())?;
    let ip4: Ipv4Addr = IP4.parse().unwrap();
    let ip6: Ipv6Addr = IP6.parse().unwrap();
    let (mac4, mac6) = (vmac_of(&lab, IP4)?, vmac_of(&lab, IP6)?);
    assert_eq!(mac4.to_string(), "02:00:c0:a8:37:46", "the IPv4 octets");
    assert_eq!(mac6.0[0], 0x06, "{mac6}");

    let holder = wait_held(&lab, None)?;
    only_the_virtual_mac_answers(&lab, holder, ip4, ip6, mac4, mac6)?;
    pin_the_client(ip4, mac4, ip6, mac6)?;
    for ip in [IpAddr::V4(ip4), IpAddr::V6(ip6)] {
        let answer = answered(ip, Duration::from_secs(10))?;
        println!("[e2e] {ip} answered through the pinned entry: {answer:?}");
    }
    shield_covers_the_macvlan(&lab, holder, ip4)?;
    let holder = cordon_moves_the_mac(&lab, holder, ip4, ip6, mac4, mac6)?;
    hard_loss_takes_the_mac_along(&lab, holder, ip4, mac4)?;

    lab.kubectl(&["delete", "service", "-n", NS, "web"])?;
    no_macvlan_left(&NODES, "the macvlans to go with the Service")?;
    Ok(())
}

/// The `vmac=` the controller wrote for `ip`, read from the agents' assignment objects.
fn vmac_of(lab: &Lab, ip: &str) -> Result<Mac, Error> {
    wait_for(&format!("a vmac= line for {ip}"), ANNOUNCE_TIMEOUT, || {
        let objects = lab.get_json(&[
            "configmaps",
            "-n",
            aliaslb_e2e::lab::SYSTEM_NAMESPACE,
            "-l",
            "aliaslb.io/node-assignment",
        ])?;
        let lines: Vec<String> = objects["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|cm| cm["data"]["ips"].as_str())
            .flat_map(|text| text.lines().map(str::to_owned).collect::<Vec<_>>())
            .filter(|line| line.split_whitespace().next() == Some(ip))
            .collect();
        let mac = lines.iter().find_map(|line| {
            line.split_whitespace()
                .find_map(|w| w.strip_prefix("vmac="))
                .and_then(|m| m.parse::<Mac>().ok())
        });
        Ok(mac.ok_or_else(|| format!("lines {lines:?}")))
    })
}

/// Waits until none of `nodes` has a macvlan of ours (`alb…`).
fn no_macvlan_left(nodes: &[u8], what: &str) -> Result<(), Error> {
    wait_for(what, ANNOUNCE_TIMEOUT, || {
        let mut left = Vec::new();
        for n in nodes {
            left.extend(links_of(*n)?.into_iter().filter(|l| l.starts_with("alb")));
        }
        Ok(if left.is_empty() {
            Ok(())
        } else {
            Err(format!("{left:?}"))
        })
    })
}

/// The links of node `n`'s namespace.
fn links_of(n: u8) -> Result<Vec<String>, Error> {
    let out = run(Command::new("ip").args(["-n", &node_name(n), "-o", "link", "show"]))?;
    Ok(out
        .lines()
        .filter_map(|l| l.split(": ").nth(1))
        .map(|name| name.split('@').next().unwrap_or(name).to_owned())
        .collect())
}

/// The link of node `n` that carries `ip`, if it holds it.
fn carrier_of(n: u8, ip: &str) -> Result<Option<String>, Error> {
    let prefix = if ip.contains(':') { "128" } else { "32" };
    let out = run(Command::new("ip").args([
        "-n",
        &node_name(n),
        "-o",
        "addr",
        "show",
        "to",
        &format!("{ip}/{prefix}"),
    ]))?;
    Ok(out.split_whitespace().nth(1).map(str::to_owned))
}

/// The one node holding both IPs, each on its macvlan (not `not_on`), once Announced.
fn wait_held(lab: &Lab, not_on: Option<u8>) -> Result<u8, Error> {
    wait_for(
        &format!("{NS}/web held on macvlans"),
        ANNOUNCE_TIMEOUT,
        || {
            let view = lab.service(NS, "web")?;
            let announced = view
                .conditions
                .get("aliaslb.io/Announced")
                .is_some_and(|c| c.status == "True");
            let mut holders = BTreeSet::new();
            let mut carriers = Vec::new();
            for n in NODES {
                for ip in [IP4, IP6] {
                    if let Some(link) = carrier_of(n, ip)? {
                        holders.insert(n);
                        carriers.push((n, ip, link));
                    }
                }
            }
            let on_macvlans =
                carriers.len() == 2 && carriers.iter().all(|(_, _, l)| l.starts_with("alb"));
            Ok(match holders.iter().copied().collect::<Vec<_>>()[..] {
                [n] if announced && on_macvlans && Some(n) != not_on => Ok(n),
                _ => Err(format!("{carriers:?}; {}", view.summary())),
            })
        },
    )
}

/// Who answers ARP for the VIP and for the holder's own address, and NDP for the IPv6 VIP.
fn only_the_virtual_mac_answers(
    lab: &Lab,
    holder: u8,
    ip4: Ipv4Addr,
    ip6: Ipv6Addr,
    mac4: Mac,
    mac6: Mac,
) -> Result<(), Error> {
    let node = node_ip(holder);
    let sampler = LanSampler::start([ip4, node])?;
    std::thread::sleep(Duration::from_secs(2));
    let record = sampler.finish()?;
    let node_mac = lab.node_mac(holder)?;
    assert_eq!(
        record.macs_for(ip4),
        BTreeSet::from([mac4]),
        "{ip4}: the virtual MAC only, never {node_mac} of {}",
        node_name(holder)
    );
    assert_eq!(
        record.macs_for(node),
        BTreeSet::from([node_mac]),
        "{node}: the node's own MAC only: the macvlan answers for its own address only"
    );
    assert_eq!(
        ndp_answers(ip6)?,
        BTreeSet::from([mac6.to_string()]),
        "{ip6}: the virtual MAC only"
    );
    println!(
        "[e2e] ARP for {ip4}: {mac4} only; for {node}: {node_mac} only; NDP for {ip6}: {mac6} only"
    );
    Ok(())
}

/// Pins the client's neighbour entries of the VIPs to their virtual MACs: from now on it
/// takes no gratuitous ARP or NA into account.
fn pin_the_client(ip4: Ipv4Addr, mac4: Mac, ip6: Ipv6Addr, mac6: Mac) -> Result<(), Error> {
    for (ip, mac) in [(IpAddr::V4(ip4), mac4), (IpAddr::V6(ip6), mac6)] {
        run(Command::new("ip").args([
            "-n",
            CLIENT_NS,
            "neigh",
            "replace",
            &ip.to_string(),
            "lladdr",
            &mac.to_string(),
            "nud",
            "permanent",
            "dev",
            "eth0",
        ]))?;
    }
    Ok(())
}

/// The client's neighbour entry of `ip`: its MAC and state.
fn client_entry(ip: IpAddr) -> Result<String, Error> {
    run(Command::new("ip").args(["-n", CLIENT_NS, "neigh", "show", &ip.to_string()]))
        .map(|s| s.trim().to_lowercase())
}

fn answered(ip: IpAddr, within: Duration) -> Result<client::Answer, Error> {
    wait_for(&format!("http://{ip}/ from the client"), within, || {
        client::get_ip(ip)
    })
}

/// A host listener on `0.0.0.0:2222` of the holder answers on the node's address and is
/// dropped on the VIP, although the VIP is on the macvlan.
fn shield_covers_the_macvlan(lab: &Lab, holder: u8, ip4: Ipv4Addr) -> Result<(), Error> {
    let name = format!("host-listener-{holder}");
    lab.spawn(
        &name,
        &format!("node-{holder}"),
        &[
            "socat",
            &format!("TCP-LISTEN:{HOST_PORT},fork,reuseaddr"),
            "SYSTEM:echo host-port",
        ],
    )?;
    let probe = |addr: Ipv4Addr| -> Result<String, Error> {
        let target = std::net::SocketAddr::from((addr, HOST_PORT));
        client::in_namespace(
            CLIENT_NS,
            move || match std::net::TcpStream::connect_timeout(&target, Duration::from_secs(2)) {
                Ok(_) => "answered".to_owned(),
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => "dropped".to_owned(),
                Err(e) => format!("failed: {e}"),
            },
        )
    };
    wait_for(
        "the host listener on the node's address",
        Duration::from_secs(10),
        || {
            Ok(match probe(node_ip(holder))?.as_str() {
                "answered" => Ok(()),
                other => Err(other.to_owned()),
            })
        },
    )?;
    assert_eq!(
        probe(ip4)?,
        "dropped",
        "{ip4}:{HOST_PORT} must be dropped by the shield on the macvlan"
    );
    lab.stop(&name)?;
    println!(
        "[e2e] shield: {}:{HOST_PORT} answers, {ip4}:{HOST_PORT} on the macvlan dropped",
        node_ip(holder)
    );
    Ok(())
}

/// Cordons the holder: the IPs and their macvlans move; the pinned client is answered
/// through the new holder, its entries unchanged, and the LAN saw one MAC throughout.
/// Returns the new holder.
fn cordon_moves_the_mac(
    lab: &Lab,
    old: u8,
    ip4: Ipv4Addr,
    ip6: Ipv6Addr,
    mac4: Mac,
    mac6: Mac,
) -> Result<u8, Error> {
    let entries_before = [
        client_entry(IpAddr::V4(ip4))?,
        client_entry(IpAddr::V6(ip6))?,
    ];
    let sampler = LanSampler::start([ip4])?;
    let cordon = Instant::now();
    lab.kubectl(&["cordon", &node_name(old)])?;
    let new = wait_held(lab, Some(old))?;
    let mut took = Duration::ZERO;
    for ip in [IpAddr::V4(ip4), IpAddr::V6(ip6)] {
        let answer = wait_for(
            &format!("{ip} answered through the new holder"),
            MOVE_BOUND,
            || {
                Ok(client::get_ip(ip)?.and_then(|a| match a.via_node() {
                    Some(n) if n == old => Err(format!("still through {}", node_name(old))),
                    _ => Ok(a),
                }))
            },
        )?;
        took = took.max(cordon.elapsed());
        println!("[e2e] after the cordon {ip}: {answer:?}");
    }
    std::thread::sleep(Duration::from_millis(500));
    let record = sampler.finish()?;
    lab.kubectl(&["uncordon", &node_name(old)])?;
    assert!(
        !links_of(old)?.iter().any(|l| l.starts_with("alb")),
        "the macvlan left {} with its IPs",
        node_name(old)
    );
    assert_eq!(
        [
            client_entry(IpAddr::V4(ip4))?,
            client_entry(IpAddr::V6(ip6))?
        ],
        entries_before,
        "the pinned entries are untouched"
    );
    assert!(
        entries_before[0].contains(&mac4.to_string()) && entries_before[0].contains("permanent")
    );
    assert!(
        entries_before[1].contains(&mac6.to_string()) && entries_before[1].contains("permanent")
    );
    assert_eq!(
        record.macs_for(ip4),
        BTreeSet::from([mac4]),
        "one MAC answered {ip4} through the move"
    );
    assert!(took <= MOVE_BOUND);
    println!(
        "[e2e] cordon of {}: {ip4} and {ip6} on {} with their MACs, the pinned client answered {} ms after the cordon",
        node_name(old),
        node_name(new),
        took.as_millis()
    );
    Ok(new)
}

/// Kills the holder's agent and pulls its cable: the standby takes the IPs over on the LAN
/// with their MACs; the pinned client is answered again. The dead node's cable back and
/// its agent restarted, the macvlan it left behind goes.
fn hard_loss_takes_the_mac_along(
    lab: &Lab,
    old: u8,
    ip4: Ipv4Addr,
    mac4: Mac,
) -> Result<(), Error> {
    let fault = Instant::now();
    lab.kill(&format!("agent-{old}"))?;
    lab.unplug(old)?;
    let answer = wait_for("the pinned client answered again", MOVE_BOUND, || {
        client::get_ip(IpAddr::V4(ip4))
    })?;
    let took = fault.elapsed();
    let new = wait_held(lab, Some(old))?;
    assert!(
        links_of(old)?.iter().any(|l| l.starts_with("alb")),
        "the dead agent's macvlan is still on {} (nothing removed it yet)",
        node_name(old)
    );
    lab.plug(old)?;
    lab.start_agent(old)?;
    no_macvlan_left(
        &[old],
        &format!(
            "the restarted agent of {} to remove its macvlan",
            node_name(old)
        ),
    )?;
    let sampler = LanSampler::start([ip4])?;
    std::thread::sleep(Duration::from_secs(1));
    let record = sampler.finish()?;
    assert_eq!(
        record.macs_for(ip4),
        BTreeSet::from([mac4]),
        "one MAC after"
    );
    println!(
        "[e2e] hard loss of {}: {ip4} on {} with {mac4}, the pinned client answered {} ms after the fault ({answer:?}); the restarted agent removed its macvlan",
        node_name(old),
        node_name(new),
        took.as_millis()
    );
    Ok(())
}
