//! Planned moves keep established connections (issue 45), the data path in the lab: the
//! real controller and agents, real kube-proxy (iptables and nftables modes), the pods' real
//! DNAT. The client holds idle TCP connections to a Service through its holder; the IP is
//! moved in a planned move (the holder cordoned, or its agent stopped: the controller moves
//! the IP, the old agent removes its alias, the new one announces it); then every
//! connection sends one request.
//!
//! - The controller's default (a 300 s window): none breaks, idle ones included; the same
//!   for an `externalTrafficPolicy: Local` Service (its pods on nodes 1 and 2: the new
//!   holder is the other one), and when the holder's agent is stopped by SIGTERM (as in a
//!   rollout: its Lease released) instead of a cordon, for an IPv6 Service, when the pool's
//!   `nodeSelector` is edited to leave the holder out, and with the pool on virtual MACs.
//!   Through the host-port shield, which the lab's agents run with (the default).
//! - `--drain-window=10s`: the controller writes the handover lines, the new holder's agent
//!   its forwarding tables ([`aliaslb_agent::handover`]); none breaks, each answered
//!   through the old holder (its conntrack still DNATs the flow, without the alias), and a
//!   new connection is answered through the new holder. When the window ends the lines go,
//!   and connections still open then break, as the README says; the old holder's agent
//!   counts them (`aliaslb_agent_handover_connections_cut_total`, from its conntrack).
//! - `--drain-window=0s` (off): no index carries `handovers`, and every connection breaks
//!   (the new holder's kube-proxy takes the next packet for a new flow and its pod answers
//!   with a reset): today's figure. Last, because the flows it breaks stay established
//!   in the old holder's conntrack (nothing tells it) and would count at a later window's
//!   end there.
//!
//! The test writes no table: everything is the binaries' doing. Needs root:
//!
//! ```sh
//! cargo build --workspace --bins && cargo test -p aliaslb-e2e --test handover -- --nocapture
//! ```

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use aliaslb_core::keys;
use aliaslb_e2e::Error;
use aliaslb_e2e::client::{self, parse_answer};
use aliaslb_e2e::fixtures::{Families, lb_service, namespace};
use aliaslb_e2e::lab::{
    CLIENT_NS, Lab, NODES, ProxyMode, SYSTEM_NAMESPACE, node_ip, node_ip6, node_name, node_number,
    run, wait_for,
};
use aliaslb_e2e::trials;

const NS: &str = "default";
const NAME: &str = "svc-1";
/// An `externalTrafficPolicy: Local` Service with endpoints on nodes 1 and 2.
const LOCAL: &str = "svc-local";
/// The namespace, pool and name of an IPv6 Service.
const NS6: &str = "e2e-hov6";
const POOL6: &str = "fd55::80";
const NAME6: &str = "web6";
/// The namespace, pool and name of a Service on a pool with virtual MACs from the start.
const NSV: &str = "e2e-hovmac";
const POOLV: &str = "192.168.55.70";
const NAMEV: &str = "webv";
const CONNECTIONS: usize = 40;
/// Connections kept idle past the window's end.
const LATE: usize = 10;
/// Busy connections across a cordon: each sends a line every 100 ms and checks its echo.
const BUSY: usize = 200;
/// The controller's drain window in the test (short, so its end is seen).
const WINDOW: &str = "10s";
const ANNOUNCE_TIMEOUT: Duration = Duration::from_secs(20);
/// A connect's bound, before any move: two SYN retransmissions.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(6);

#[test]
fn a_cordon_keeps_established_connections_with_a_drain_window() -> Result<(), Error> {
    cordon_both_ways(ProxyMode::Iptables, true)
}

#[test]
fn a_cordon_keeps_established_connections_with_nftables_kube_proxy() -> Result<(), Error> {
    cordon_both_ways(ProxyMode::Nftables, false)
}

/// The cordon with the controller's default (on, 300 s: within it), with a 10 s window
/// (past its end), and with the window off (`--drain-window=0s`, today's figure),
/// kube-proxy in `mode`; with `every`, the other planned moves and Services too (within
/// the default window): ETP=Local, an agent stopped, IPv6, a pool's node selector edited,
/// virtual MACs.
fn cordon_both_ways(mode: ProxyMode, every: bool) -> Result<(), Error> {
    let Some(lab) = Lab::up_with(mode)? else {
        return Ok(());
    };
    let started = Instant::now();
    lab.apply(&lb_service(NS, NAME).to_yaml())?;
    lab.apply(&lb_service(NS, LOCAL).local().pods_on(&[1, 2]).to_yaml())?;
    lab.apply(&namespace(NS6))?;
    lab.add_pool(NS6, &[POOL6])?;
    lab.apply(&lb_service(NS6, NAME6).families(Families::V6).to_yaml())?;
    lab.apply(&namespace(NSV))?;
    lab.add_pool(NSV, &[POOLV])?;
    set_config(&lab, None)?;
    lab.apply(&lb_service(NSV, NAMEV).to_yaml())?;
    let restart = |window: Option<&str>| -> Result<(), Error> {
        lab.stop("controller-1")?;
        match window {
            Some(w) => {
                lab.start_controller_with("controller-1", &[&format!("--drain-window={w}")])?
            }
            None => lab.start_controller("controller-1")?,
        }
        lab.wait_leader("controller-1", Duration::from_secs(30))
    };
    // The lab's controller runs with the default. The baseline goes last: the flows it
    // breaks stay established in the old holder's conntrack (nothing tells it), and would
    // count at a later window's end there.
    let default = moving(&lab, (NS, NAME), Move::Cordon, false)?;
    let mut others = Vec::new();
    let mut busy = None;
    if every {
        busy = Some(busy_cordon(&lab).inspect_err(|e| said(&lab, "busy", e))?);
        others.push(("ETP=Local", moving(&lab, (NS, LOCAL), Move::Cordon, false)?));
        others.push((
            "an agent stopped",
            moving(&lab, (NS, NAME), Move::AgentStop, false)?,
        ));
        others.push(("IPv6", moving(&lab, (NS6, NAME6), Move::Cordon, false)?));
        others.push((
            "the pool's nodeSelector edited",
            moving(&lab, (NS, NAME), Move::Selector, false)?,
        ));
        // Its line carries its virtual MAC (`vmac=`): the IP is answered from its own MAC.
        wait_for("a line with a virtual MAC", ANNOUNCE_TIMEOUT, || {
            Ok(if virtual_mac_lines(&lab)? {
                Ok(())
            } else {
                Err("no vmac= line".to_owned())
            })
        })?;
        others.push((
            "virtual MACs, holder cordoned",
            moving(&lab, (NSV, NAMEV), Move::Cordon, false)?,
        ));
    }
    restart(Some(WINDOW))?;
    let on = moving(&lab, (NS, NAME), Move::Cordon, true)?;
    restart(Some("0s"))?;
    let off = moving(&lab, (NS, NAME), Move::Cordon, false)?;
    println!(
        "[e2e] cordon of the holder, {CONNECTIONS} established connections (ETP=Cluster, kube-proxy {}): --drain-window=0s {} broke; the default (300 s) {} broke, {} answered through the old holder; --drain-window={WINDOW} {} broke, {} answered through the old holder; a new connection answered through the new holder {:?} (default) and {:?} ({WINDOW}) after the cordon; handover lines gone {:?} after the cordon, then {} of {LATE} connections still open broke ({} counted by the old holder)",
        mode.as_str(),
        off.broken,
        default.broken,
        default.via_old,
        on.broken,
        on.via_old,
        default.first_new,
        on.first_new,
        on.lines_gone,
        on.late_broken,
        on.counted_cut,
    );
    if let Some(b) = &busy {
        println!(
            "[e2e] with the default window, kube-proxy {}: {BUSY} busy connections (a line every 100 ms each, its echo checked) across a cordon of the holder: {} broke; {} lines answered, {} after the IP moved, every connection by the same pod throughout: {}",
            mode.as_str(),
            b.broken.len(),
            b.answered,
            b.after_move,
            b.same_pod,
        );
    }
    for (what, run) in &others {
        println!(
            "[e2e] with the default window, kube-proxy {}, {what}: {} of {CONNECTIONS} broke, {} answered through the old holder; a new connection through the new holder {:?} after the move",
            mode.as_str(),
            run.broken,
            run.via_old,
            run.first_new,
        );
    }
    println!(
        "[e2e] {} planned moves in {:?}",
        3 + others.len(),
        started.elapsed()
    );
    if let Some(b) = &busy {
        assert!(
            b.broken.is_empty(),
            "busy connections broke: {:?}",
            b.broken
        );
        assert!(b.same_pod, "a flow changed pods: {b:?}");
        assert!(
            b.after_move > BUSY * 10,
            "the connections kept talking after the move: {b:?}"
        );
    }
    assert_eq!(off.broken, CONNECTIONS, "today's figure: every one breaks");
    assert_eq!(off.late_broken, LATE, "{off:?}");
    assert!(off.lines.is_empty(), "0s writes no handover: {off:?}");
    assert_eq!(off.counted_cut, 0.0, "no window, no count: {off:?}");
    let within: Vec<(&str, &Outcome)> = std::iter::once(("the default", &default))
        .chain(others.iter().map(|(what, run)| (*what, run)))
        .collect();
    for (what, run) in within.iter().copied().chain([(WINDOW, &on)]) {
        assert_eq!(run.broken, 0, "{what}: {run:?}");
        assert_eq!(run.via_old, CONNECTIONS, "{what}: {run:?}");
        assert!(
            run.lines.iter().any(|l| l.contains(" forward=")),
            "{what}: the new holder forwards: {run:?}"
        );
        assert!(
            run.lines.iter().any(|l| l.ends_with(" draining")),
            "{what}: the old holder drains: {run:?}"
        );
    }
    for (what, run) in within {
        assert_eq!(
            run.late_broken, 0,
            "{what}: within the default window, idle connections are kept too: {run:?}"
        );
    }
    assert!(
        on.lines_gone >= Duration::from_secs(9),
        "the lines last the window: {on:?}"
    );
    assert_eq!(
        on.late_broken, LATE,
        "after the window, as documented: {on:?}"
    );
    assert_eq!(
        on.counted_cut, LATE as f64,
        "the old holder counts the connections still open at the window's end: {on:?}"
    );
    Ok(())
}

#[derive(Debug)]
struct Outcome {
    broken: usize,
    via_old: usize,
    first_new: Duration,
    errors: BTreeMap<String, usize>,
    /// Every index's handover lines, by `NODE: LINE`, once the connections were answered.
    lines: Vec<String>,
    /// When no index had a handover line any more, after the cordon.
    lines_gone: Duration,
    /// Of the [`LATE`] connections, those broken when used after the lines went.
    late_broken: usize,
    /// What the old holder's agent counted as still open when its drain ended
    /// (`aliaslb_agent_handover_connections_cut_total`, grown during this cordon).
    counted_cut: f64,
}

/// A planned move of a Service's IP off its holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Move {
    /// `kubectl cordon` (then uncordon).
    Cordon,
    /// The holder's agent stopped by SIGTERM, as a rollout does (then started again).
    AgentStop,
    /// The pool's `nodeSelector` edited to leave the holder out (then removed).
    Selector,
}

/// The pools' options: [`NSV`]'s on virtual MACs, and with `selector`, the default pool's
/// nodes chosen by [`SELECT`] and leaving node `selector` out.
fn set_config(lab: &Lab, selector: Option<u8>) -> Result<(), Error> {
    let mut config = format!("pools:\n  {NSV}:\n    virtualMAC: true\n");
    if selector.is_some() {
        config.push_str(&format!(
            "  {NS}:\n    nodeSelector: {{{SELECT}: \"yes\"}}\n"
        ));
    }
    lab.patch_pools(&serde_json::json!({"data": {"config.yaml": config}}).to_string())
}

/// The label the [`Move::Selector`] pool selects nodes by.
const SELECT: &str = "aliaslb-e2e/handover";

/// Holds the connections to Service `name` through its holder, moves the IP off it
/// (`how`), waits for the new holder, sends one request on each of [`CONNECTIONS`]; reads
/// the indexes' handover lines; waits for them to go (`window`: the controller's drain
/// window is short), then sends one request on each of the [`LATE`] ones; then undoes the
/// move.
fn moving(lab: &Lab, svc: (&str, &str), how: Move, window: bool) -> Result<Outcome, Error> {
    moving_inner(lab, svc, how, window)
        .inspect_err(|e| said(lab, &format!("{}/{} {how:?}", svc.0, svc.1), e))
}

/// On a failed round: what went wrong, the handover lines, the controller's and the agents'
/// last log lines.
fn said(lab: &Lab, round: &str, error: &Error) {
    eprintln!("[e2e] round {round} failed: {error}");
    eprintln!("[e2e] handover lines: {:?}", handover_lines(lab));
    for name in ["controller-1", "agent-1", "agent-2", "agent-3"] {
        eprintln!(
            "---- last lines of {name}'s log ----\n{}",
            lab.log_tail(name, 40)
        );
    }
}

fn moving_inner(
    lab: &Lab,
    (ns, name): (&str, &str),
    how: Move,
    window: bool,
) -> Result<Outcome, Error> {
    let (ip, holder) = announced(lab, ns, name)?;
    let mut streams = client::in_namespace(CLIENT_NS, move || hold(ip, CONNECTIONS + LATE))?
        .map_err(|why| Error::Output {
            cmd: format!(
                "long-lived connections from the client to {ns}/{name} ({ip} on {}, {how:?})",
                node_name(holder)
            ),
            why: format!("{why}\n{}", diagnostics(lab, ip)),
        })?;
    let late = streams.split_off(CONNECTIONS);
    let cut_before = cut_counted(holder)?;
    let cordoned = Instant::now();
    match how {
        Move::Cordon => drop(lab.kubectl(&["cordon", &node_name(holder)])?),
        Move::AgentStop => lab.stop(&format!("agent-{holder}"))?,
        Move::Selector => {
            for n in NODES.into_iter().filter(|n| *n != holder) {
                lab.kubectl(&["label", "node", &node_name(n), &format!("{SELECT}=yes")])?;
            }
            set_config(lab, Some(holder))?;
        }
    }
    let (_, new_holder) = wait_for("the IP to move", ANNOUNCE_TIMEOUT, || {
        let (got, node) = announced(lab, ns, name)?;
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
            Ok(match client::get_ip(ip)? {
                Ok(a) if a.via_node() == Some(new_holder) => Ok(cordoned.elapsed()),
                Ok(a) => Err(format!("answered via {:?}", a.via_node())),
                Err(e) => Err(e),
            })
        },
    )?;
    let answers = client::in_namespace(CLIENT_NS, move || {
        streams.into_iter().map(request).collect::<Vec<_>>()
    })?;
    let lines = handover_lines(lab)?;
    let lines_gone = if window {
        wait_for(
            "the handover lines to go with the window",
            Duration::from_secs(40),
            || {
                let now = handover_lines(lab)?;
                Ok(if now.is_empty() {
                    Ok(cordoned.elapsed())
                } else {
                    Err(format!("{now:?}"))
                })
            },
        )?
    } else {
        Duration::ZERO
    };
    // The agents' tables follow their indexes (a watch event and a reconcile away); the
    // old holder counts what its conntrack still carries as the drain ends.
    std::thread::sleep(Duration::from_secs(1));
    // A stopped agent counts nothing (the count is its drain's end).
    let counted_cut = match how {
        Move::AgentStop => 0.0,
        Move::Cordon | Move::Selector => cut_counted(holder)? - cut_before,
    };
    let late_answers = client::in_namespace(CLIENT_NS, move || {
        late.into_iter().map(request).collect::<Vec<_>>()
    })?;
    let mut outcome = Outcome {
        broken: 0,
        via_old: 0,
        first_new,
        errors: BTreeMap::new(),
        lines,
        lines_gone,
        late_broken: late_answers.iter().filter(|a| a.is_err()).count(),
        counted_cut,
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
    match how {
        Move::Cordon => drop(lab.kubectl(&["uncordon", &node_name(holder)])?),
        Move::AgentStop => {
            lab.start_agent(holder)?;
            lab.wait_agent_lease(holder, ANNOUNCE_TIMEOUT)?;
        }
        Move::Selector => {
            set_config(lab, None)?;
            for n in NODES {
                lab.kubectl(&["label", "node", &node_name(n), &format!("{SELECT}-")])?;
            }
        }
    }
    Ok(outcome)
}

/// How [`BUSY`] connections fared across a cordon.
#[derive(Debug)]
struct Busy {
    /// The connections that broke, with why.
    broken: Vec<String>,
    /// Lines echoed in all, and after the IP moved.
    answered: usize,
    after_move: usize,
    /// Whether every connection was answered by one pod throughout.
    same_pod: bool,
}

/// [`BUSY`] connections to the default Service through its holder, each in echo mode
/// (the lab's pods answer every line after a first `ECHO`), sending a line every 100 ms
/// from one client thread; the holder is cordoned after 1 s, the lines go on for 4 s after
/// the IP moved; then uncordon.
fn busy_cordon(lab: &Lab) -> Result<Busy, Error> {
    use std::io::{BufRead as _, BufReader};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let (ip, holder) = announced(lab, NS, NAME)?;
    let stop = Arc::new(AtomicBool::new(false));
    // Milliseconds since `t0` when the IP moved (0: not yet).
    let moved_at = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now();
    let (stop2, moved2) = (stop.clone(), moved_at.clone());
    let talker = std::thread::spawn(move || {
        client::in_namespace(CLIENT_NS, move || -> Result<Busy, String> {
            let mut conns = Vec::new();
            for _ in 0..BUSY {
                std::thread::sleep(Duration::from_millis(10));
                let s = TcpStream::connect_timeout(&SocketAddr::new(ip, 80), CONNECT_TIMEOUT)
                    .map_err(|e| format!("connect: {e}"))?;
                s.set_read_timeout(Some(Duration::from_secs(2)))
                    .map_err(|e| e.to_string())?;
                let mut w = s.try_clone().map_err(|e| e.to_string())?;
                w.write_all(b"ECHO\n").map_err(|e| e.to_string())?;
                conns.push((w, BufReader::new(s), None::<String>, None::<String>));
            }
            let mut out = Busy {
                broken: Vec::new(),
                answered: 0,
                after_move: 0,
                same_pod: true,
            };
            let mut n = 0u64;
            while !stop2.load(Ordering::Relaxed) {
                let round = Instant::now();
                n += 1;
                for (k, (w, r, pod, broke)) in conns.iter_mut().enumerate() {
                    if broke.is_some() {
                        continue;
                    }
                    let mut line = String::new();
                    let got = w
                        .write_all(format!("{n}\n").as_bytes())
                        .map_err(|e| e.to_string())
                        .and_then(|()| r.read_line(&mut line).map_err(|e| e.to_string()));
                    match got {
                        Ok(0) => *broke = Some(format!("connection {k}: closed at line {n}")),
                        Err(e) => *broke = Some(format!("connection {k}: {e} at line {n}")),
                        Ok(_) => {
                            let who = line.split_whitespace().next().unwrap_or("").to_owned();
                            if pod.get_or_insert_with(|| who.clone()) != &who {
                                out.same_pod = false;
                            }
                            out.answered += 1;
                            if moved2.load(Ordering::Relaxed) != 0 {
                                out.after_move += 1;
                            }
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(100).saturating_sub(round.elapsed()));
            }
            out.broken = conns.into_iter().filter_map(|c| c.3).collect();
            Ok(out)
        })
    });
    std::thread::sleep(Duration::from_secs(1 + BUSY as u64 / 100 * 2));
    lab.kubectl(&["cordon", &node_name(holder)])?;
    wait_for("the IP to move", ANNOUNCE_TIMEOUT, || {
        let (got, node) = announced(lab, NS, NAME)?;
        Ok(if node == holder {
            Err(format!("{got} still on {}", node_name(node)))
        } else {
            Ok(())
        })
    })?;
    moved_at.store(
        u64::try_from(t0.elapsed().as_millis()).unwrap_or(1).max(1),
        Ordering::Relaxed,
    );
    std::thread::sleep(Duration::from_secs(4));
    stop.store(true, Ordering::Relaxed);
    let busy = talker
        .join()
        .map_err(|_| Error::Environment("the busy client thread panicked".to_owned()))??
        .map_err(|why| Error::Output {
            cmd: "busy connections from the client".to_owned(),
            why,
        })?;
    lab.kubectl(&["uncordon", &node_name(holder)])?;
    Ok(busy)
}

/// What the nodes and the client say about `ip`, for a failure's message.
fn diagnostics(lab: &Lab, ip: IpAddr) -> String {
    let mut out = format!("handover lines: {:?}\n", handover_lines(lab));
    let ask =
        |args: &[&str]| run(Command::new("ip").args(args)).unwrap_or_else(|e| format!("({e})"));
    out.push_str(&format!(
        "client neighbours: {}",
        ask(&["-n", CLIENT_NS, "neigh", "show", &ip.to_string()])
    ));
    for n in NODES {
        let node = node_name(n);
        let tables =
            run(Command::new("ip").args(["netns", "exec", &node, "nft", "list", "tables"]))
                .unwrap_or_default();
        let handover = run(Command::new("ip").args([
            "netns",
            "exec",
            &node,
            "nft",
            "list",
            "table",
            "ip",
            "aliaslb-handover",
        ]))
        .unwrap_or_default();
        out.push_str(&format!(
            "{node}: addresses to {ip}: {}; mac {}; tables {}; handover table: {}\n",
            ask(&["-n", &node, "-o", "addr", "show", "to", &ip.to_string()]).trim(),
            ask(&["-n", &node, "-br", "link", "show", "eth0"]).trim(),
            tables.replace('\n', " "),
            handover
        ));
    }
    out
}

/// The one IP of Service `ns/name` (either family) and its node, once announced and held
/// there.
fn announced(lab: &Lab, ns: &str, name: &str) -> Result<(IpAddr, u8), Error> {
    wait_for(&format!("{ns}/{name} announced"), ANNOUNCE_TIMEOUT, || {
        let view = lab.service(ns, name)?;
        let announced = view
            .conditions
            .get("aliaslb.io/Announced")
            .is_some_and(|c| c.status == "True");
        let node = view.node.as_deref().and_then(node_number);
        Ok(match (view.all_ips.as_slice(), node) {
            ([ip], Some(n)) if announced && held(n, *ip)? => Ok((*ip, n)),
            _ => Err(view.summary()),
        })
    })
}

/// Whether node `n` holds `ip` as an alias, on any link (a virtual MAC's is a macvlan).
fn held(n: u8, ip: IpAddr) -> Result<bool, Error> {
    let family = if ip.is_ipv4() { "-4" } else { "-6" };
    let out = run(Command::new("ip").args([
        "-n",
        &node_name(n),
        family,
        "-o",
        "addr",
        "show",
        "to",
        &ip.to_string(),
    ]))?;
    Ok(!out.trim().is_empty())
}

/// Whether some node's assignment has a line with a virtual MAC (`vmac=`).
fn virtual_mac_lines(lab: &Lab) -> Result<bool, Error> {
    let listed = lab.kubectl(&[
        "get",
        "configmap",
        "-n",
        SYSTEM_NAMESPACE,
        "-l",
        keys::LABEL_ASSIGNMENTS,
        "-o",
        "jsonpath={.items[*].data}",
    ])?;
    Ok(listed.contains("vmac="))
}

/// Node `n`'s agent's `aliaslb_agent_handover_connections_cut_total` (0 before any).
fn cut_counted(n: u8) -> Result<f64, Error> {
    let text = trials::agent_metrics(n)?.ok_or_else(|| Error::Output {
        cmd: format!("GET /metrics of agent-{n}"),
        why: "no answer".to_owned(),
    })?;
    Ok(trials::sample(&text, "aliaslb_agent_handover_connections_cut_total").unwrap_or(0.0))
}

/// Every node index's handover lines, as `NODE: LINE` (the old holder's name checked
/// against its address in the forward).
fn handover_lines(lab: &Lab) -> Result<Vec<String>, Error> {
    let mut out = Vec::new();
    for n in NODES {
        let name = keys::assignment_configmap(&node_name(n));
        let cm = lab.get_json(&["configmap", "-n", SYSTEM_NAMESPACE, &name])?;
        let text = cm["data"][keys::HANDOVERS_KEY].as_str().unwrap_or("");
        for line in text.lines() {
            if let Some((_, to)) = line.split_once(" forward=") {
                let to = to.split_whitespace().next().unwrap_or("");
                let named = NODES.into_iter().any(|m| {
                    to == format!("{}@{}", node_name(m), node_ip(m))
                        || to == format!("{}@{}", node_name(m), node_ip6(m))
                });
                assert!(named, "a forward to a node at its address: {line}");
            }
            out.push(format!("{}: {line}", node_name(n)));
        }
    }
    Ok(out)
}

/// Opens `count` idle connections (in the client's namespace), paced: the pods' socat
/// forks a shell per connection behind a short accept queue.
fn hold(ip: IpAddr, count: usize) -> Result<Vec<TcpStream>, String> {
    let addr = SocketAddr::from((ip, 80));
    (0..count)
        .map(|_| {
            std::thread::sleep(Duration::from_millis(25));
            // TCP's own SYN retransmissions (1 s, then 3 s) included: a first SYN lost in
            // the churn of the round before is not what a round measures.
            let s = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT)
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
