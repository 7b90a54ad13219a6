//! Failover and control-plane continuity over the lab, with the real binaries: the client
//! measures from each fault to the first answer forwarded by another node, and the sampler
//! proves an IP is never on two nodes beyond what a hard loss allows.
//!
//! One lab for the binary, so one test function running the phases in order (each leaves
//! the three Services announced for the next). Needs root; run with `--nocapture` to see
//! the figures:
//!
//! ```sh
//! cargo build --workspace --bins && cargo test -p aliaslb-e2e --test failover -- --nocapture
//! ```

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use aliaslb_e2e::client::{self, Recovery, RecoveryProbe};
use aliaslb_e2e::fixtures::{lb_service, namespace};
use aliaslb_e2e::lab::{LEASE_DURATION, Lab, node_name, wait_for};
use aliaslb_e2e::sampler::{Sampler, Samples};
use aliaslb_e2e::{Error, aliases};

const NS: &str = "e2e-failover";
const SERVICES: [&str; 3] = ["web-1", "web-2", "web-3"];
/// Bound of a hard failover: the controller notices the silent agent after the lease
/// duration; one more second for the reassignment, the new alias and its announcement.
const HARD_BOUND: Duration = Duration::from_secs(LEASE_DURATION.as_secs() + 1);
/// Bound of a graceful move (break-before-make over a few API round trips).
const GRACEFUL_BOUND: Duration = Duration::from_secs(1);
/// After a partitioned node is reconnected, its agent must drop the alias it kept: the
/// agent's watch reconnects within its 5 s maximum backoff, plus one second.
const RECONNECT_BOUND: Duration = Duration::from_secs(6);
const ANNOUNCE_TIMEOUT: Duration = Duration::from_secs(20);

type Assignments = BTreeMap<&'static str, (Ipv4Addr, u8)>;

#[test]
fn failover_and_control_plane_continuity() -> Result<(), Error> {
    let Some(lab) = Lab::up()? else {
        return Ok(());
    };
    let mut figures = Vec::new();
    setup(&lab)?;
    controller_restart_keeps_every_assignment(&lab)?;
    leader_change_keeps_every_assignment(&lab, &mut figures)?;
    figures.push(graceful_agent_sigterm(&lab)?);
    figures.push(graceful_cordon(&lab)?);
    figures.push(hard_node_death(&lab)?);
    figures.push(hard_partition(&lab)?);
    println!("\n[e2e] failover figures (fault -> first answer through another node):");
    for line in &figures {
        println!("[e2e]   {line}");
    }
    events_explain_every_move(&lab)
}

/// `kubectl describe` must say why the IP moved each time: the cordon move of
/// [`graceful_cordon`] follows other moves of web-1 within minutes, and still needs its
/// own NodeMoved Event naming the cordon.
fn events_explain_every_move(lab: &Lab) -> Result<(), Error> {
    let events = lab.get_json(&[
        "events",
        "-n",
        NS,
        "--field-selector",
        "involvedObject.name=web-1,reason=NodeMoved",
    ])?;
    let notes: Vec<String> = events["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            let count = e["series"]["count"]
                .as_u64()
                .or(e["count"].as_u64())
                .unwrap_or(1);
            format!("{} (x{count})", e["message"].as_str().unwrap_or_default())
        })
        .collect();
    println!("[e2e] NodeMoved Events of web-1: {notes:#?}");
    assert!(
        notes.iter().any(|n| n.contains("cordoned")),
        "no NodeMoved Event of web-1 tells of the cordon; its NodeMoved Events: {notes:#?}"
    );
    Ok(())
}

fn setup(lab: &Lab) -> Result<(), Error> {
    lab.apply(&namespace(NS))?;
    lab.add_pool(
        NS,
        &[
            "192.168.55.20",
            "192.168.55.21",
            "192.168.55.22",
            "192.168.55.23",
        ],
    )?;
    for name in SERVICES {
        lab.apply(&lb_service(NS, name).to_yaml())?;
    }
    let now = assignments(lab)?;
    for (name, (ip, node)) in &now {
        wait_reachable(*ip)?;
        println!("[e2e] {NS}/{name}: {ip} on {}", node_name(*node));
    }
    Ok(())
}

/// Every Service announced: name -> (IP, node).
fn assignments(lab: &Lab) -> Result<Assignments, Error> {
    SERVICES
        .into_iter()
        .map(|name| Ok((name, lab.wait_announced(NS, name, ANNOUNCE_TIMEOUT)?)))
        .collect()
}

fn wait_reachable(ip: Ipv4Addr) -> Result<client::Answer, Error> {
    wait_for(
        &format!("http://{ip}/ from the client"),
        Duration::from_secs(10),
        || client::get(ip),
    )
}

/// Asserts that in every sample each IP of `expected` sits on its node and nowhere else.
fn assert_never_moved(samples: &Samples, expected: &Assignments, what: &str) {
    assert!(!samples.is_empty(), "{what}: no samples taken");
    for sample in &samples.0 {
        for (name, (ip, node)) in expected {
            let holders = sample.holders(*ip);
            assert!(
                holders.len() == 1 && holders.contains(node),
                "{what}: {name} ({ip}) was on nodes {holders:?} instead of {node} only"
            );
        }
    }
}

fn controller_restart_keeps_every_assignment(lab: &Lab) -> Result<(), Error> {
    let before = assignments(lab)?;
    let sampler = Sampler::start();
    lab.stop("controller-1")?;
    lab.start_controller("controller-1")?;
    lab.wait_leader("controller-1", Duration::from_secs(20))?;
    // Give the new process time to do whatever it would do: a full resync of the Services.
    std::thread::sleep(Duration::from_secs(3));
    let samples = sampler.finish()?;
    let after = assignments(lab)?;
    assert_eq!(after, before, "a controller restart changed assignments");
    assert_never_moved(&samples, &before, "controller restart");
    println!(
        "[e2e] controller restart: {} Services kept IP and node ({} samples)",
        before.len(),
        samples.len()
    );
    Ok(())
}

fn leader_change_keeps_every_assignment(lab: &Lab, figures: &mut Vec<String>) -> Result<(), Error> {
    let before = assignments(lab)?;
    lab.start_controller("controller-2")?;
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        lab.leader()?.as_deref(),
        Some("controller-1"),
        "a second replica must not take the lead from a live leader"
    );
    let sampler = Sampler::start();
    let fault = Instant::now();
    lab.stop("controller-1")?;
    lab.wait_leader("controller-2", Duration::from_secs(20))?;
    let takeover = fault.elapsed();
    std::thread::sleep(Duration::from_secs(3));
    let samples = sampler.finish()?;
    assert_eq!(
        assignments(lab)?,
        before,
        "a leader change changed assignments"
    );
    assert_never_moved(&samples, &before, "leader change");
    // The new leader really works: a new Service gets an IP and is reachable.
    lab.apply(&lb_service(NS, "web-4").to_yaml())?;
    let (ip, node) = lab.wait_announced(NS, "web-4", ANNOUNCE_TIMEOUT)?;
    wait_reachable(ip)?;
    lab.kubectl(&["delete", "service", "-n", NS, "web-4"])?;
    lab.start_controller("controller-1")?;
    let line = format!(
        "leader change (SIGTERM to the leader): controller-2 led after {:.0} ms; assignments unchanged; web-4 -> {ip} on {}",
        takeover.as_secs_f64() * 1e3,
        node_name(node)
    );
    println!("[e2e] {line}");
    figures.push(line);
    Ok(())
}

/// The Service the faults aim at, and its holder.
fn target(lab: &Lab) -> Result<(Ipv4Addr, u8), Error> {
    lab.wait_announced(NS, SERVICES[0], ANNOUNCE_TIMEOUT)
}

/// Starts probing until the client is answered through a node other than `old`.
fn probe(ip: Ipv4Addr, old: u8, bound: Duration) -> RecoveryProbe {
    RecoveryProbe::start(ip, bound * 4, move |a| {
        a.via_node().is_some_and(|n| n != old)
    })
}

fn report(what: &str, ip: Ipv4Addr, old: u8, r: &Recovery, bound: Duration) -> String {
    format!(
        "{what}: {ip} {} -> {} in {:.0} ms ({} failed probes; bound {} ms)",
        node_name(old),
        r.answer
            .via_node()
            .map(node_name)
            .unwrap_or_else(|| "?".to_owned()),
        r.after.as_secs_f64() * 1e3,
        r.failed,
        bound.as_millis()
    )
}

fn assert_no_doubles(samples: &Samples, what: &str) {
    // "Never on two nodes" means little if the sampler could not keep up.
    assert!(
        samples.max_gap() < Duration::from_millis(500),
        "{what}: the sampler fell behind ({} ms between two samples)",
        samples.max_gap().as_millis()
    );
    let doubles = samples.doubles();
    assert!(
        doubles.is_empty(),
        "{what}: an IP was on two nodes in {} samples, first: {:?}",
        doubles.len(),
        doubles.first()
    );
}

fn graceful_agent_sigterm(lab: &Lab) -> Result<String, Error> {
    let (ip, old) = target(lab)?;
    let sampler = Sampler::start();
    let probe = probe(ip, old, GRACEFUL_BOUND);
    let fault = Instant::now();
    lab.stop(&format!("agent-{old}"))?;
    let r = probe.wait(fault)?;
    let (_, new) = target(lab)?;
    std::thread::sleep(Duration::from_millis(500));
    let samples = sampler.finish()?;
    let line = report("graceful, agent SIGTERM", ip, old, &r, GRACEFUL_BOUND);
    println!("[e2e] {line}");
    assert_ne!(new, old, "the IP did not move off the stopped agent's node");
    assert_no_doubles(&samples, "agent SIGTERM");
    assert!(r.after <= GRACEFUL_BOUND, "{line}");
    // The agent comes back; the IP stays where it is (no fail-back churn).
    lab.start_agent(old)?;
    lab.wait_agent_lease(old, Duration::from_secs(10))?;
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        target(lab)?,
        (ip, new),
        "the IP moved back after the agent returned"
    );
    Ok(line)
}

fn graceful_cordon(lab: &Lab) -> Result<String, Error> {
    let (ip, old) = target(lab)?;
    let sampler = Sampler::start();
    let probe = probe(ip, old, GRACEFUL_BOUND);
    let fault = Instant::now();
    lab.kubectl(&["cordon", &node_name(old)])?;
    let r = probe.wait(fault)?;
    let (_, new) = target(lab)?;
    std::thread::sleep(Duration::from_millis(500));
    let samples = sampler.finish()?;
    lab.kubectl(&["uncordon", &node_name(old)])?;
    let line = report("graceful, kubectl cordon", ip, old, &r, GRACEFUL_BOUND);
    println!("[e2e] {line}");
    assert_ne!(new, old, "the IP stayed on the cordoned node");
    assert_no_doubles(&samples, "cordon");
    assert!(r.after <= GRACEFUL_BOUND, "{line}");
    Ok(line)
}

/// Doubles may only pair `dead` with one other node, and end within `until` of `fault`.
fn assert_doubles_only_with(samples: &Samples, dead: u8, fault: Instant, until: Duration) {
    for d in samples.doubles() {
        assert!(
            d.nodes.len() == 2 && d.nodes.contains(&dead),
            "{} on nodes {:?}: only the failed node {dead} may still hold a moved IP",
            d.ip,
            d.nodes
        );
        assert!(
            d.at - fault <= until,
            "{} still on the failed node {dead} and on {:?} {:.0} ms after the fault (bound {} ms)",
            d.ip,
            d.nodes,
            (d.at - fault).as_secs_f64() * 1e3,
            until.as_millis()
        );
    }
}

fn hard_node_death(lab: &Lab) -> Result<String, Error> {
    let (ip, old) = target(lab)?;
    let sampler = Sampler::start();
    let probe = probe(ip, old, HARD_BOUND);
    let fault = Instant::now();
    lab.kill(&format!("agent-{old}"))?;
    lab.unplug(old)?;
    let r = probe.wait(fault)?;
    // Nobody removes the dead agent's alias: the kernel does when its lifetime (the lease
    // duration, refreshed at the last renewal before the kill) runs out.
    let expiry = LEASE_DURATION + Duration::from_secs(1);
    wait_for(
        &format!("{ip} to expire on the dead {}", node_name(old)),
        expiry + Duration::from_secs(2),
        || {
            let held = aliases(old)?;
            Ok(if held.contains(&ip) {
                Err(format!("{held:?}"))
            } else {
                Ok(())
            })
        },
    )?;
    let samples = sampler.finish()?;
    let last_on_dead = samples.last_on(ip, old).map(|t| t - fault);
    let overlap = samples.doubles().len();
    let line = format!(
        "{}; old alias expired {:.0} ms after the kill, {overlap} samples with the IP on both",
        report("hard, agent SIGKILL + LAN cut", ip, old, &r, HARD_BOUND),
        last_on_dead.unwrap_or_default().as_secs_f64() * 1e3,
    );
    println!("[e2e] {line}");
    assert!(r.after <= HARD_BOUND, "{line}");
    assert!(
        last_on_dead.is_some_and(|t| t <= expiry),
        "the dead node kept {ip} longer than its lifetime + 1 s: {line}"
    );
    assert_doubles_only_with(&samples, old, fault, expiry);
    lab.plug(old)?;
    lab.start_agent(old)?;
    lab.wait_agent_lease(old, Duration::from_secs(10))?;
    Ok(line)
}

fn hard_partition(lab: &Lab) -> Result<String, Error> {
    let (ip, old) = target(lab)?;
    let sampler = Sampler::start();
    let probe = probe(ip, old, HARD_BOUND);
    let fault = Instant::now();
    lab.unplug(old)?;
    lab.cut_api(old)?;
    let r = probe.wait(fault)?;
    let (_, new) = target(lab)?;
    // The cut-off agent is alive and cannot learn of the move: it keeps serving (an API
    // outage must not take load balancers down), so the isolated node keeps the alias.
    std::thread::sleep(Duration::from_secs(1));
    let kept = aliases(old)?.contains(&ip);
    lab.restore_api()?;
    lab.plug(old)?;
    let healed = Instant::now();
    wait_for(
        &format!("the reconnected {} to drop {ip}", node_name(old)),
        RECONNECT_BOUND * 2,
        || {
            let held = aliases(old)?;
            Ok(if held.contains(&ip) {
                Err(format!("{held:?}"))
            } else {
                Ok(())
            })
        },
    )?;
    let dropped = healed.elapsed();
    std::thread::sleep(Duration::from_millis(500));
    let samples = sampler.finish()?;
    let line = format!(
        "{}; isolated node kept the alias: {kept}; dropped {:.0} ms after reconnecting",
        report("hard, LAN + API cut (agent alive)", ip, old, &r, HARD_BOUND),
        dropped.as_secs_f64() * 1e3
    );
    println!("[e2e] {line}");
    assert_ne!(new, old);
    assert!(r.after <= HARD_BOUND, "{line}");
    assert!(
        dropped <= RECONNECT_BOUND,
        "the reconnected node kept {ip} too long: {line}"
    );
    // Two holders only while the old node was cut off, never after it dropped the alias.
    assert_doubles_only_with(&samples, old, fault, healed + dropped - fault);
    assert_no_doubles(&samples.since(healed + dropped), "after reconnecting");
    wait_reachable(ip)?;
    Ok(line)
}
