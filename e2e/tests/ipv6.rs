//! IPv6 end to end over the dual-stack lab (LAN fd55::/64, pods fd44:0:0:N::10, Services from
//! both families, kube-proxy dual-stack), with the real binaries:
//!
//! - an IPv6-only Service gets an address of its pool's IPv6 half, held as a /128 on one node,
//!   and the client is answered through the real kube-proxy;
//! - a dual-stack Service gets one address of each family, both answered;
//! - the holder's own source address stays its own (`ip -6 route get` to a LAN neighbour);
//! - the host-port shield covers IPv6 (a host listener answers on the node's IPv6 address, not
//!   on the VIP);
//! - a hard loss of the holder fails over, and the client's neighbour entry follows the new
//!   holder from the unsolicited NA alone; NDP from the LAN (`ndisc6 -m`) is answered by the
//!   new holder's MAC only;
//! - a pool address some LAN host already answers NDP for is skipped by the first claim's
//!   probe (DAD-style), and the Service gets the next one.
//!
//! One lab for the binary, so one test function running the phases in order. Needs root:
//!
//! ```sh
//! cargo build --workspace --bins && cargo test -p aliaslb-e2e --test ipv6 -- --nocapture
//! ```

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv6Addr};
use std::process::Command;
use std::time::{Duration, Instant};

use aliaslb_e2e::client;
use aliaslb_e2e::fixtures::{Families, lb_service, namespace};
use aliaslb_e2e::lab::{CLIENT_IP6, CLIENT_NS, Lab, NODES, node_ip6, node_name, run, wait_for};
use aliaslb_e2e::lan::ndp_answers;
use aliaslb_e2e::{Error, aliases, aliases6};

const NS: &str = "e2e-v6";
const ANNOUNCE_TIMEOUT: Duration = Duration::from_secs(20);
/// A host listener in the holder's namespace, IPv6 only.
const HOST_PORT: u16 = 2222;

#[test]
fn ipv6_end_to_end() -> Result<(), Error> {
    let Some(lab) = Lab::up()? else {
        return Ok(());
    };
    lab.apply(&namespace(NS))?;
    lab.add_pool(NS, &["192.168.55.60", "fd55::60", "fd55::61"])?;
    let (ip, holder) = ipv6_only_service_is_answered(&lab)?;
    source_address_stays_the_nodes(ip, holder)?;
    shield_covers_ipv6(&lab, ip, holder)?;
    dual_stack_service_gets_both_families(&lab)?;
    hard_loss_fails_over_with_unsolicited_na(&lab, ip, holder)?;
    probe_skips_an_address_taken_on_the_lan(&lab)?;
    Ok(())
}

/// The Service's IPv6 ingress IPs and its node, once announced and held there.
fn wait_v6(lab: &Lab, name: &str) -> Result<(Vec<IpAddr>, u8), Error> {
    wait_for(&format!("{NS}/{name} announced"), ANNOUNCE_TIMEOUT, || {
        let view = lab.service(NS, name)?;
        let announced = view
            .conditions
            .get("aliaslb.io/Announced")
            .is_some_and(|c| c.status == "True");
        let node = view.node.as_deref().and_then(aliaslb_e2e::lab::node_number);
        let v6: Vec<Ipv6Addr> = view
            .all_ips
            .iter()
            .filter_map(|ip| match ip {
                IpAddr::V6(ip) => Some(*ip),
                IpAddr::V4(_) => None,
            })
            .collect();
        Ok(match node {
            Some(n) if announced && !v6.is_empty() && v6.iter().all(|ip| held6(n, *ip)) => {
                Ok((view.all_ips.clone(), n))
            }
            _ => Err(view.summary()),
        })
    })
}

fn held6(n: u8, ip: Ipv6Addr) -> bool {
    aliases6(n).is_ok_and(|held| held.contains(&ip))
}

fn v6_of(ips: &[IpAddr]) -> Ipv6Addr {
    ips.iter()
        .find_map(|ip| match ip {
            IpAddr::V6(ip) => Some(*ip),
            IpAddr::V4(_) => None,
        })
        .expect("an IPv6 address")
}

/// Requests from the client to `ip` until one is answered (bounded); the answering pod and
/// the source address it saw.
fn answered(ip: IpAddr, within: Duration) -> Result<client::Answer, Error> {
    wait_for(&format!("http://{ip}/ from the client"), within, || {
        client::get_ip(ip)
    })
}

fn ipv6_only_service_is_answered(lab: &Lab) -> Result<(Ipv6Addr, u8), Error> {
    lab.apply(&lb_service(NS, "web6").families(Families::V6).to_yaml())?;
    let (ips, holder) = wait_v6(lab, "web6")?;
    assert_eq!(
        ips.len(),
        1,
        "single-stack IPv6: one ingress IP, got {ips:?}"
    );
    let ip = v6_of(&ips);
    assert!(
        ip == "fd55::60".parse::<Ipv6Addr>().unwrap()
            || ip == "fd55::61".parse::<Ipv6Addr>().unwrap(),
        "{ip} is not from the pool's IPv6 half"
    );
    let holders: BTreeSet<u8> = NODES.into_iter().filter(|&n| held6(n, ip)).collect();
    assert_eq!(
        holders,
        BTreeSet::from([holder]),
        "{ip} held as a /128 on one node"
    );
    let answer = answered(IpAddr::V6(ip), Duration::from_secs(10))?;
    assert!(
        answer.client.is_ipv6() && answer.pod_node().is_some(),
        "answered by a pod over IPv6: {answer:?}"
    );
    println!(
        "[e2e] {NS}/web6: {ip} on {} answered by {} (saw {})",
        node_name(holder),
        answer.pod,
        answer.client
    );
    Ok((ip, holder))
}

/// `ip -6 route get` from the holder to the client picks the node's own address, never the
/// VIP of the same /64 (the alias is deprecated: preferred_lft 0).
fn source_address_stays_the_nodes(ip: Ipv6Addr, holder: u8) -> Result<(), Error> {
    let out = run(Command::new("ip").args([
        "-n",
        &node_name(holder),
        "-6",
        "route",
        "get",
        &CLIENT_IP6.to_string(),
    ]))?;
    let src = out
        .split_whitespace()
        .skip_while(|w| *w != "src")
        .nth(1)
        .unwrap_or_default()
        .to_owned();
    assert_eq!(
        src,
        node_ip6(holder).to_string(),
        "source address to {CLIENT_IP6} while holding {ip}: {out}"
    );
    println!(
        "[e2e] {}: source to {CLIENT_IP6} is {src}, not {ip}",
        node_name(holder)
    );
    Ok(())
}

/// A host listener on `[::]:2222` of the holder answers on the node's IPv6 address and is
/// not reached through the VIP: the shield's IPv6 half drops it.
fn shield_covers_ipv6(lab: &Lab, ip: Ipv6Addr, holder: u8) -> Result<(), Error> {
    let name = format!("host-listener6-{holder}");
    lab.spawn(
        &name,
        &format!("node-{holder}"),
        &[
            "socat",
            &format!("TCP6-LISTEN:{HOST_PORT},ipv6only=1,fork,reuseaddr"),
            "SYSTEM:echo host-port",
        ],
    )?;
    let probe = |addr: Ipv6Addr| -> Result<String, Error> {
        let target = format!("[{addr}]:{HOST_PORT}");
        client::in_namespace(
            CLIENT_NS,
            move || match std::net::TcpStream::connect_timeout(
                &target.parse().expect("a socket address"),
                Duration::from_secs(2),
            ) {
                Ok(_) => "answered".to_owned(),
                Err(e) if e.kind() == std::io::ErrorKind::TimedOut => "dropped".to_owned(),
                Err(e) => format!("failed: {e}"),
            },
        )
    };
    wait_for(
        "the host listener on the node's IPv6 address",
        Duration::from_secs(10),
        || {
            Ok(match probe(node_ip6(holder))?.as_str() {
                "answered" => Ok(()),
                other => Err(other.to_owned()),
            })
        },
    )?;
    assert_eq!(
        probe(ip)?,
        "dropped",
        "[{ip}]:{HOST_PORT} must be dropped by the shield"
    );
    lab.stop(&name)?;
    println!(
        "[e2e] shield: [{}]:{HOST_PORT} answers, [{ip}]:{HOST_PORT} dropped",
        node_ip6(holder)
    );
    Ok(())
}

fn dual_stack_service_gets_both_families(lab: &Lab) -> Result<(), Error> {
    lab.apply(&lb_service(NS, "dual").families(Families::Dual).to_yaml())?;
    let (ips, holder) = wait_v6(lab, "dual")?;
    let v4: Vec<_> = ips.iter().filter(|ip| ip.is_ipv4()).collect();
    assert_eq!(
        (v4.len(), ips.len()),
        (1, 2),
        "dual-stack: one address of each family, got {ips:?}"
    );
    let IpAddr::V4(ip4) = *v4[0] else {
        unreachable!()
    };
    wait_for("the IPv4 half held", ANNOUNCE_TIMEOUT, || {
        Ok(if aliases(holder)?.contains(&ip4) {
            Ok(())
        } else {
            Err(format!("{ip4} not on {}", node_name(holder)))
        })
    })?;
    for ip in &ips {
        let answer = answered(*ip, Duration::from_secs(10))?;
        assert_eq!(
            answer.client.is_ipv6(),
            ip.is_ipv6(),
            "{ip}: answered over the same family: {answer:?}"
        );
    }
    println!(
        "[e2e] {NS}/dual: {ips:?} on {}, both answered",
        node_name(holder)
    );
    Ok(())
}

/// The client's neighbour entry for `ip` (its MAC), if any.
fn client_neighbour(ip: Ipv6Addr) -> Result<Option<String>, Error> {
    let out =
        run(Command::new("ip").args(["-n", CLIENT_NS, "-6", "neigh", "show", &ip.to_string()]))?;
    Ok(out
        .split_whitespace()
        .skip_while(|w| *w != "lladdr")
        .nth(1)
        .map(str::to_lowercase))
}

fn hard_loss_fails_over_with_unsolicited_na(
    lab: &Lab,
    ip: Ipv6Addr,
    holder: u8,
) -> Result<(), Error> {
    let old_mac = lab.node_mac(holder)?.to_string().to_lowercase();
    answered(IpAddr::V6(ip), Duration::from_secs(10))?;
    assert_eq!(
        client_neighbour(ip)?.as_deref(),
        Some(old_mac.as_str()),
        "entry before"
    );
    assert_eq!(ndp_answers(ip)?, BTreeSet::from([old_mac.clone()]));

    // Hard loss: the agent dies and the node's LAN cable is pulled; nothing tells the client.
    let cut = Instant::now();
    lab.kill(&format!("agent-{holder}"))?;
    lab.unplug(holder)?;
    let (new_holder, new_mac) = wait_for(
        "another node to hold the IPv6 VIP",
        ANNOUNCE_TIMEOUT,
        || {
            for n in NODES.into_iter().filter(|&n| n != holder) {
                if held6(n, ip) {
                    return Ok(Ok((n, lab.node_mac(n)?.to_string().to_lowercase())));
                }
            }
            Ok(Err("no other holder yet".to_owned()))
        },
    )?;
    // The client learns the new MAC from the unsolicited NA (override flag): its entry
    // changes without it soliciting anything.
    wait_for(
        "the client's neighbour entry to follow the NA",
        Duration::from_secs(5),
        || {
            Ok(match client_neighbour(ip)? {
                Some(mac) if mac == new_mac => Ok(()),
                other => Err(format!("entry {other:?}, want {new_mac}")),
            })
        },
    )?;
    let answer = answered(IpAddr::V6(ip), Duration::from_secs(10))?;
    let took = cut.elapsed();
    assert_eq!(
        ndp_answers(ip)?,
        BTreeSet::from([new_mac.clone()]),
        "one holder on the LAN"
    );
    println!(
        "[e2e] IPv6 hard loss of {}: {ip} on {} ({new_mac}), answered by {} {:.1} s after the cut",
        node_name(holder),
        node_name(new_holder),
        answer.pod,
        took.as_secs_f64()
    );
    lab.plug(holder)?;
    lab.start_agent(holder)?;
    lab.wait_agent_lease(holder, Duration::from_secs(20))?;
    Ok(())
}

/// A LAN host already answers NDP for the pool's first IPv6 address: the Service's first
/// claim probes it, skips it and takes the next one.
fn probe_skips_an_address_taken_on_the_lan(lab: &Lab) -> Result<(), Error> {
    let ns = "e2e-v6-probe";
    lab.apply(&namespace(ns))?;
    let taken: Ipv6Addr = "fd55::70".parse().unwrap();
    run(Command::new("ip").args([
        "-n",
        CLIENT_NS,
        "addr",
        "add",
        "fd55::70/128",
        "dev",
        "eth0",
        "nodad",
    ]))?;
    lab.add_pool(ns, &["fd55::70", "fd55::71"])?;
    lab.apply(&lb_service(ns, "probed").families(Families::V6).to_yaml())?;
    let got = wait_for(
        "the probed Service to be announced",
        ANNOUNCE_TIMEOUT,
        || {
            let view = lab.service(ns, "probed")?;
            let announced = view
                .conditions
                .get("aliaslb.io/Announced")
                .is_some_and(|c| c.status == "True");
            Ok(match view.all_ips.as_slice() {
                [IpAddr::V6(ip)] if announced => Ok(*ip),
                _ => Err(view.summary()),
            })
        },
    )?;
    run(Command::new("ip").args([
        "-n",
        CLIENT_NS,
        "addr",
        "del",
        "fd55::70/128",
        "dev",
        "eth0",
    ]))?;
    assert_ne!(
        got, taken,
        "the probe must skip {taken}, which the client answers for"
    );
    assert!(
        NODES.into_iter().all(|n| !held6(n, taken)),
        "{taken} was added on a node"
    );
    println!("[e2e] {ns}/probed: {taken} answered on the LAN by the client, skipped; got {got}");
    Ok(())
}
