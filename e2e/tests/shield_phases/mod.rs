//! The phases of the host-port shield end-to-end test (see `shield.rs`), shared by the test
//! binaries that run them with kube-proxy in iptables mode (`shield.rs`) and in nftables mode
//! (`shield_nftables.rs`).

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, SocketAddrV4};
use std::process::Command;
use std::time::Duration;

use aliaslb_e2e::client::{self, Probe};
use aliaslb_e2e::fixtures::{lb_service, namespace};
use aliaslb_e2e::lab::{CLIENT_IP, Lab, NODES, ProxyMode, node_ip, node_name, run, wait_for};
use aliaslb_e2e::{Error, aliases};
use serde_json::Value;

const NS: &str = "e2e-shield";
const POOL: [&str; 2] = ["192.168.55.40", "192.168.55.41"];
const ANNOUNCE_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a SYN waits for any answer before it counts as dropped: two transmissions
/// (the kernel retransmits after 1 s); a refusal or an answer takes milliseconds in the lab.
const DROP_TIMEOUT: Duration = Duration::from_secs(2);
/// Connect timeout of the probes that must be answered.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(1);
/// The host listener started in the holder's namespace.
const HOST_PORT: u16 = 2222;
/// The agent's `/metrics` (its default `--metrics-addr 0.0.0.0:9101`).
const METRICS_PORT: u16 = 9101;
/// Nothing listens there: the control that RSTs reach the client.
const CLOSED_PORT: u16 = 2223;
const HTTP_GET: &[u8] = b"GET / HTTP/1.0\r\n\r\n";
const METRICS_GET: &[u8] = b"GET /metrics HTTP/1.0\r\n\r\n";

/// Every phase in order over one lab whose kube-proxy runs in `mode`.
pub fn run_all(mode: ProxyMode) -> Result<(), Error> {
    let Some(lab) = Lab::up_with(mode)? else {
        return Ok(());
    };
    lab.apply(&namespace(NS))?;
    lab.add_pool(NS, &POOL)?;
    let (ip, holder) = service_answers_on_its_port(&lab)?;
    table_lists_the_ip(&lab, ip, holder)?;
    host_listeners_answer_on_the_node_ip_only(&lab, ip, holder)?;
    node_port_answers_on_the_node_ip_only(&lab, ip, holder)?;
    local_without_local_endpoint_is_dropped(&lab)?;
    both_rule_sets_live_side_by_side(&lab)?;
    Ok(())
}

/// On every node, kube-proxy's rules and the shield's own table are both in place after all
/// of the above: neither replaced nor flushed the other (nftables mode: the tables
/// `ip kube-proxy` and `inet aliaslb` in one ruleset).
fn both_rule_sets_live_side_by_side(lab: &Lab) -> Result<(), Error> {
    for n in NODES {
        let ns = node_name(n);
        let ruleset =
            run(Command::new("ip").args(["netns", "exec", &ns, "nft", "list", "ruleset"]))?;
        assert!(
            ruleset.contains("table inet aliaslb"),
            "{ns}: no shield table in\n{ruleset}"
        );
        let proxy = lab.proxy_rules(n)?;
        match lab.proxy_mode() {
            ProxyMode::Nftables => {
                assert!(
                    ruleset.contains("table ip kube-proxy"),
                    "{ns}: no kube-proxy table"
                );
                assert!(
                    proxy.contains(&format!("{NS}/web")),
                    "{ns}: kube-proxy's nftables rules lost the Service"
                );
            }
            ProxyMode::Iptables => {
                assert!(
                    proxy.contains("KUBE-SERVICES"),
                    "{ns}: no kube-proxy chains"
                );
            }
        }
    }
    println!(
        "[e2e] kube-proxy ({}) and the shield's table side by side on every node",
        lab.proxy_mode().as_str()
    );
    Ok(())
}

/// The Service `web` (Cluster, pods on nodes 1 and 2) answers through its LB IP on port 80.
fn service_answers_on_its_port(lab: &Lab) -> Result<(Ipv4Addr, u8), Error> {
    lab.apply(&lb_service(NS, "web").to_yaml())?;
    let (ip, holder) = lab.wait_announced(NS, "web", ANNOUNCE_TIMEOUT)?;
    wait_for(
        &format!("http://{ip}/ from the client"),
        Duration::from_secs(10),
        || client::get(ip),
    )?;
    let answered = client::get_many(ip, 5)?.map_err(|e| Error::Output {
        cmd: format!("GET http://{ip}/ from the client"),
        why: e,
    })?;
    assert!(
        answered
            .iter()
            .all(|a| a.pod_node().is_some() && a.via_node() == Some(holder)),
        "not all answered by a pod through {}: {answered:?}",
        node_name(holder)
    );
    println!(
        "[e2e] {NS}/web: {ip} on {}; port 80 answers through the LB IP ({})",
        node_name(holder),
        answered[0].pod
    );
    Ok((ip, holder))
}

/// The holder's table lists the IP in `held4` with exactly the Service's port in `ports4`;
/// no other node shields it.
fn table_lists_the_ip(lab: &Lab, ip: Ipv4Addr, holder: u8) -> Result<(), Error> {
    let listing = lab.exec(
        &format!("node-{holder}"),
        &["nft", "list", "table", "inet", "aliaslb"],
    )?;
    println!(
        "[e2e] nft list table inet aliaslb on {}:\n{listing}",
        node_name(holder)
    );
    assert!(
        listing.contains(&ip.to_string()),
        "the listing of {} does not name {ip}:\n{listing}",
        node_name(holder)
    );
    // The same, element by element (nft's JSON).
    assert!(
        held4(lab, holder)?.contains(&ip),
        "{ip} is not in held4 on {}:\n{listing}",
        node_name(holder)
    );
    assert_eq!(
        ports4(lab, holder)?
            .into_iter()
            .filter(|(i, ..)| *i == ip)
            .map(|(_, proto, port)| (proto, port))
            .collect::<Vec<_>>(),
        vec![("tcp".to_owned(), 80)],
        "ports4 on {} must open exactly the Service's port on {ip}:\n{listing}",
        node_name(holder)
    );
    for n in NODES.into_iter().filter(|&n| n != holder) {
        assert!(
            !held4(lab, n)?.contains(&ip),
            "{} shields {ip}, which it does not hold",
            node_name(n)
        );
    }
    println!(
        "[e2e] held4 lists {ip} on {} only; ports4: {ip} . tcp . 80",
        node_name(holder)
    );
    Ok(())
}

/// A host listener on `0.0.0.0:2222` and the agent's `/metrics` answer on the holder's own
/// address and are dropped on the LB IP; a closed port on the node IP is refused (the
/// control: a timeout is the shield's silence, not the lab's).
fn host_listeners_answer_on_the_node_ip_only(
    lab: &Lab,
    ip: Ipv4Addr,
    holder: u8,
) -> Result<(), Error> {
    lab.spawn(
        "host-listener",
        &format!("node-{holder}"),
        &[
            "socat",
            &format!("TCP-LISTEN:{HOST_PORT},fork,reuseaddr"),
            "EXEC:echo host",
        ],
    )?;
    let node = node_ip(holder);
    let reply = wait_answer(SocketAddrV4::new(node, HOST_PORT), b"", |r| r == "host\n")?;
    println!(
        "[e2e] host listener {}:0.0.0.0:{HOST_PORT}: {node}:{HOST_PORT} answers {reply:?}",
        node_name(holder)
    );
    assert_dropped(
        lab,
        holder,
        SocketAddrV4::new(ip, HOST_PORT),
        b"",
        "the host listener",
    )?;

    let metrics = wait_answer(SocketAddrV4::new(node, METRICS_PORT), METRICS_GET, |r| {
        r.starts_with("HTTP/1.") && r.lines().next().is_some_and(|l| l.contains(" 200"))
    })?;
    println!(
        "[e2e] agent /metrics: {node}:{METRICS_PORT} answers {:?}",
        metrics.lines().next().unwrap_or_default()
    );
    assert_dropped(
        lab,
        holder,
        SocketAddrV4::new(ip, METRICS_PORT),
        METRICS_GET,
        "the agent's /metrics",
    )?;

    let closed = SocketAddrV4::new(node, CLOSED_PORT);
    let got = client::tcp_probe(closed, b"", DROP_TIMEOUT)?;
    assert_eq!(
        got,
        Probe::Refused,
        "control: a closed port on the node IP must be refused (RST), else a timeout proves nothing"
    );
    println!("[e2e] control: {closed} (nothing listens) is refused with a RST");
    lab.stop("host-listener")
}

/// The NodePort of `web` answers on the holder's node IP and is dropped on the LB IP.
fn node_port_answers_on_the_node_ip_only(lab: &Lab, ip: Ipv4Addr, holder: u8) -> Result<(), Error> {
    let svc = lab.get_json(&["service", "-n", NS, "web"])?;
    let node_port = svc["spec"]["ports"][0]["nodePort"]
        .as_u64()
        .and_then(|p| u16::try_from(p).ok())
        .ok_or_else(|| Error::Output {
            cmd: format!("kubectl get service -n {NS} web"),
            why: format!("no nodePort in {}", svc["spec"]["ports"]),
        })?;
    let node = node_ip(holder);
    let reply = wait_answer(SocketAddrV4::new(node, node_port), HTTP_GET, |r| {
        body(r).is_some_and(|b| b.starts_with("pod-"))
    })?;
    println!(
        "[e2e] NodePort {node}:{node_port} answers ({})",
        body(&reply)
            .and_then(|b| b.lines().next())
            .unwrap_or_default()
    );
    assert_dropped(
        lab,
        holder,
        SocketAddrV4::new(ip, node_port),
        HTTP_GET,
        "the NodePort",
    )
}

/// A Local Service whose IP sits on a node without a local endpoint: kube-proxy does not
/// DNAT it, and what is left for the node's own stack is dropped without a RST. The
/// controller closes that window by moving the IP; it is held open here by stopping the
/// controller before the endpoint moves (the agent keeps what it was assigned).
fn local_without_local_endpoint_is_dropped(lab: &Lab) -> Result<(), Error> {
    let name = "local";
    lab.apply(&lb_service(NS, name).local().pods_on(&[2]).to_yaml())?;
    let (ip, holder) = lab.wait_announced(NS, name, ANNOUNCE_TIMEOUT)?;
    assert_eq!(holder, 2, "Local with pod-b only must be on alb-node-2");
    let answer = wait_for(
        &format!("http://{ip}/ from the client"),
        Duration::from_secs(10),
        || client::get(ip),
    )?;
    assert_eq!(
        (answer.pod.as_str(), answer.client),
        ("pod-b", CLIENT_IP.into()),
        "Local on alb-node-2: want pod-b seeing the client address"
    );

    lab.stop("controller-1")?;
    lab.apply(&lb_service(NS, name).local().pods_on(&[1]).to_yaml())?;
    // kube-proxy on node 2 knows the Service has no local endpoint there: iptables mode
    // comments its rule so, nftables mode lists the LB IP in its no-endpoint map with `drop`.
    let marker = match lab.proxy_mode() {
        ProxyMode::Iptables => format!("{NS}/{name}:http has no local endpoints"),
        ProxyMode::Nftables => format!("{ip} . tcp . 80 comment \"{NS}/{name}:http\" : drop"),
    };
    wait_for(
        "kube-proxy on alb-node-2 to see no local endpoint",
        Duration::from_secs(20),
        || {
            let rules = lab.proxy_rules(2)?;
            Ok(if rules.contains(&marker) {
                Ok(())
            } else {
                Err(format!("no rule {marker:?}"))
            })
        },
    )?;
    assert!(
        aliases(2)?.contains(&ip) && held4(lab, 2)?.contains(&ip),
        "alb-node-2 must still hold and shield {ip} with the controller stopped"
    );
    assert_dropped(
        lab,
        2,
        SocketAddrV4::new(ip, 80),
        HTTP_GET,
        "Local without a local endpoint",
    )?;

    // The controller moves the IP to the node with the endpoint; node 2 forgets it.
    lab.start_controller("controller-1")?;
    lab.wait_leader("controller-1", Duration::from_secs(20))?;
    wait_for(
        "the Local Service to follow its endpoint to alb-node-1",
        ANNOUNCE_TIMEOUT,
        || {
            let view = lab.service(NS, name)?;
            Ok(match view.assignment() {
                Some((i, 1)) if i == ip && aliases(1)?.contains(&ip) => Ok(()),
                _ => Err(view.summary()),
            })
        },
    )?;
    let answer = wait_for(
        &format!("http://{ip}/ through alb-node-1"),
        Duration::from_secs(10),
        || {
            Ok(match client::get(ip)? {
                Ok(a) if a.pod == "pod-a" => Ok(a),
                other => Err(format!("{other:?}")),
            })
        },
    )?;
    assert_eq!(answer.client, IpAddr::V4(CLIENT_IP), "{answer:?}");
    wait_for(
        "alb-node-2 to drop the IP from held4",
        Duration::from_secs(10),
        || {
            let held = held4(lab, 2)?;
            Ok(if held.contains(&ip) {
                Err(format!("held4 {held:?}"))
            } else {
                Ok(())
            })
        },
    )?;
    assert!(
        held4(lab, 1)?.contains(&ip),
        "alb-node-1 holds {ip} without shielding it"
    );
    println!(
        "[e2e] {NS}/{name}: {ip} moved to alb-node-1 with its endpoint, answers (pod-a, client {CLIENT_IP}); held4 followed"
    );
    Ok(())
}

/// Waits (bounded) until `addr` answers `request` with a reply passing `ok`; the reply.
fn wait_answer(
    addr: SocketAddrV4,
    request: &[u8],
    ok: impl Fn(&str) -> bool,
) -> Result<String, Error> {
    wait_for(
        &format!("an answer from {addr} to the client"),
        Duration::from_secs(10),
        || {
            Ok(match client::tcp_probe(addr, request, ANSWER_TIMEOUT)? {
                Probe::Answered(reply) if ok(&reply) => Ok(reply),
                other => Err(format!("{other:?}")),
            })
        },
    )
}

/// `addr` gets no answer at all to `request` (a connect timeout: no SYN-ACK, no RST, no
/// ICMP error), and the drop is the shield's: its `dropped4` counter on `node` grows
/// meanwhile (kube-proxy's KUBE-FIREWALL drops silently too, after the shield's chains).
fn assert_dropped(
    lab: &Lab,
    node: u8,
    addr: SocketAddrV4,
    request: &[u8],
    what: &str,
) -> Result<(), Error> {
    let before = dropped4(lab, node)?;
    let got = client::tcp_probe(addr, request, DROP_TIMEOUT)?;
    let after = dropped4(lab, node)?;
    assert_eq!(
        got,
        Probe::TimedOut,
        "{what}: {addr} must be dropped silently (a connect timeout)"
    );
    assert!(
        after > before,
        "{what}: {addr} timed out, but the shield's dropped4 counter on {} did not grow ({before} -> {after})",
        node_name(node)
    );
    println!(
        "[e2e] {what}: {addr} dropped silently (connect timeout after {} s; dropped4 on {} {before} -> {after})",
        DROP_TIMEOUT.as_secs(),
        node_name(node)
    );
    Ok(())
}

/// The body of an HTTP reply.
fn body(reply: &str) -> Option<&str> {
    reply.split_once("\r\n\r\n").map(|(_, b)| b)
}

/// `nft -j list OBJECT` of the agent's table in node `n`, as JSON: the object itself.
fn nft_object(lab: &Lab, n: u8, kind: &str, name: &str) -> Result<Value, Error> {
    let out = lab.exec(
        &format!("node-{n}"),
        &["nft", "-j", "list", kind, "inet", "aliaslb", name],
    )?;
    let v: Value = serde_json::from_str(&out).map_err(|e| Error::Output {
        cmd: format!("nft -j list {kind} inet aliaslb {name} on {}", node_name(n)),
        why: format!("not JSON: {e}"),
    })?;
    v["nftables"]
        .as_array()
        .into_iter()
        .flatten()
        .find_map(|o| o.get(kind).cloned())
        .ok_or_else(|| Error::Output {
            cmd: format!("nft -j list {kind} inet aliaslb {name} on {}", node_name(n)),
            why: format!("no {kind} in {out}"),
        })
}

/// The IPv4 addresses the shield of node `n` holds.
fn held4(lab: &Lab, n: u8) -> Result<BTreeSet<Ipv4Addr>, Error> {
    let set = nft_object(lab, n, "set", "held4")?;
    Ok(set["elem"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e.as_str()?.parse().ok())
        .collect())
}

/// The `ip . protocol . port` elements of node `n`'s `ports4`.
fn ports4(lab: &Lab, n: u8) -> Result<Vec<(Ipv4Addr, String, u16)>, Error> {
    let set = nft_object(lab, n, "set", "ports4")?;
    Ok(set["elem"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| {
            let c = e["concat"].as_array()?;
            Some((
                c.first()?.as_str()?.parse().ok()?,
                c.get(1)?.as_str()?.to_owned(),
                u16::try_from(c.get(2)?.as_u64()?).ok()?,
            ))
        })
        .collect())
}

/// Packets the shield of node `n` dropped (IPv4).
fn dropped4(lab: &Lab, n: u8) -> Result<u64, Error> {
    let counter = nft_object(lab, n, "counter", "dropped4")?;
    counter["packets"].as_u64().ok_or_else(|| Error::Output {
        cmd: format!(
            "nft -j list counter inet aliaslb dropped4 on {}",
            node_name(n)
        ),
        why: format!("no packets in {counter}"),
    })
}
