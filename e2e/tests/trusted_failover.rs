//! Fast failover, trusted (issue 41), on the LAN of the netns lab, with the lease the
//! manifests ship (30 s, renewed every 10 s; aliases living 3 s) and judged from the LAN:
//! the sampler asks who answers ARP for every Service's IP every 20 ms from the client's
//! namespace, and also counts the ARP requests the nodes send (their probes and checks).
//!
//! 1. Armed from the first seconds (item 8): a holder's agent restarted (a new key, which
//!    its peers learn from the controller) and lost 4 s later (link cut, agent killed) is
//!    taken over by its standby within a second.
//! 2. Routine faults make no check storm (item 2), with 12 Services over the 3 nodes: an
//!    agent restarted (new key), UDP 7479 blocked on one node for 60 s, a forged advert
//!    with the largest counter: the nodes' ARP requests per second against the steady
//!    state's (both printed), no IP moved, never two MACs.
//! 3. One holder across a return (item 7): a holder lost (link cut, agent killed) whose
//!    agent starts again 0.5, 1, 2 and 5 s later, its link back 200 ms after that agent has
//!    taken down the aliases it found (it has no carrier; the time is printed): never two
//!    MACs for the IP. The agent takes down the aliases of a run before before anything
//!    else (its link has no carrier to ask on) and asks the LAN before it holds them again.
//!    An assignment that reaches the agent while its link has no carrier is held back
//!    until the link is back and the LAN was asked (the kernel would answer for an alias
//!    the instant the carrier returns: CI saw 60 ms of two MACs once): the number held
//!    back that way is printed. What an agent cannot govern, the kernel answering between
//!    a link's return and the agent's start, is bounded by the alias lifetime; the test
//!    restarts the agent first.
//!
//! Needs root; about 4 minutes.
//!
//! ```sh
//! cargo build --workspace --bins && cargo test -p aliaslb-e2e --test trusted_failover -- --nocapture
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, UdpSocket};
use std::time::{Duration, Instant};

use aliaslb_e2e::Error;
use aliaslb_e2e::client::in_namespace;
use aliaslb_e2e::fixtures::{lb_service, namespace};
use aliaslb_e2e::lab::wait_for;
use aliaslb_e2e::lab::{ADVERT_PORT, Lab, NODES, ROGUE_NS, node_ip, node_name};
use aliaslb_e2e::lan::{LanRecord, LanSampler, Mac};
use aliaslb_e2e::sampler::aliases;
use aliaslb_e2e::trials::{Launcher, wait_advert_keys};

const NS: &str = "e2e-trusted";
/// The Services, and their pool.
const SERVICES: usize = 12;
const FIRST: u8 = 60;
/// The lease the manifests ship.
const LEASE: &str = "30s";
const RENEW: &str = "10s";
/// Bound on a takeover after a hard loss (the fast-failover target, p99).
const TAKEOVER: Duration = Duration::from_secs(1);

fn ip(k: usize) -> Ipv4Addr {
    Ipv4Addr::new(192, 168, 55, FIRST + k as u8)
}

fn service(k: usize) -> String {
    format!("svc-{k}")
}

/// Starts node `n`'s agent with the manifests' lease.
fn start_agent(lab: &Lab, n: u8) -> Result<(), Error> {
    lab.start_agent_with(n, &["--lease-duration", LEASE, "--renew-interval", RENEW])
}

/// Each Service's IP and holder, once all are announced.
fn holders(lab: &Lab) -> Result<BTreeMap<Ipv4Addr, u8>, Error> {
    let mut out = BTreeMap::new();
    for k in 0..SERVICES {
        let (ip, node) = lab.wait_announced(NS, &service(k), Duration::from_secs(60))?;
        out.insert(ip, node);
    }
    Ok(out)
}

/// The rounds of `record` in which two MACs answered for one IP, with the IP and when.
fn doubles(record: &LanRecord, t0: Instant) -> Vec<String> {
    record
        .samples
        .iter()
        .flat_map(|s| {
            s.answers
                .iter()
                .filter(|(_, macs)| macs.len() > 1)
                .map(move |(ip, macs)| format!("{ip} at {:?}: {macs:?}", s.at - t0))
        })
        .collect()
}

/// When another MAC than `old` first answered for `ip` after `from`.
fn taken_at(record: &LanRecord, ip: Ipv4Addr, old: Mac, from: Instant) -> Option<Instant> {
    record
        .samples
        .iter()
        .filter(|s| s.at >= from)
        .find(|s| {
            s.answers
                .get(&ip)
                .is_some_and(|m| m.iter().any(|x| *x != old))
        })
        .map(|s| s.at)
}

#[test]
fn trusted_fast_failover_on_the_lan() -> Result<(), Error> {
    let Some(lab) = Lab::up()? else {
        return Ok(());
    };
    // Every agent and the controller with the manifests' lease.
    let launcher = Launcher::new(Duration::from_secs(30))?;
    for n in NODES {
        lab.stop(&format!("agent-{n}"))?;
        start_agent(&lab, n)?;
    }
    lab.stop("controller-1")?;
    launcher.start_controller(&lab, "controller-1")?;
    lab.wait_leader("controller-1", Duration::from_secs(30))?;
    lab.apply(&namespace(NS))?;
    let pool: Vec<String> = (0..SERVICES).map(|k| ip(k).to_string()).collect();
    lab.add_pool(NS, &pool.iter().map(String::as_str).collect::<Vec<_>>())?;
    for k in 0..SERVICES {
        lab.apply(&lb_service(NS, &service(k)).to_yaml())?;
    }
    let mut placed = holders(&lab)?;
    println!(
        "[trusted] {}",
        wait_advert_keys(&lab, Duration::from_secs(20))?
    );
    let node_macs: BTreeMap<u8, Mac> = NODES
        .into_iter()
        .map(|n| Ok((n, lab.node_mac(n)?)))
        .collect::<Result<_, Error>>()?;
    let nodes: BTreeSet<Mac> = node_macs.values().copied().collect();
    let ips: Vec<Ipv4Addr> = (0..SERVICES).map(ip).collect();
    let mut problems = Vec::new();
    let mut doubled = Vec::new();

    // 1. Armed from the first seconds: the holder of svc-0 restarted, lost 4 s later.
    let (ip0, h) = (ip(0), placed[&ip(0)]);
    lab.kill(&format!("agent-{h}"))?;
    start_agent(&lab, h)?;
    let sampler = LanSampler::start(ips.iter().copied())?;
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(4));
    let lost = Instant::now();
    lab.unplug(h)?;
    lab.kill(&format!("agent-{h}"))?;
    std::thread::sleep(Duration::from_secs(2));
    let record = sampler.finish()?;
    doubled.extend(doubles(&record, t0));
    match taken_at(&record, ip0, node_macs[&h], lost) {
        Some(at) if at - lost <= TAKEOVER => println!(
            "[trusted] armed: {} restarted, lost 4 s later: {ip0} taken over after {:?}",
            node_name(h),
            at - lost
        ),
        other => problems.push(format!(
            "armed: {ip0} of {} lost 4 s after its agent's restart: taken over after {:?} (bound {TAKEOVER:?})",
            node_name(h),
            other.map(|at| at - lost)
        )),
    }
    start_agent(&lab, h)?;
    lab.plug(h)?;
    std::thread::sleep(Duration::from_secs(3));
    placed = holders(&lab)?;

    // 2. No check storm: the nodes' ARP requests per second in each phase, one sampler.
    let sampler = LanSampler::start(ips.iter().copied())?;
    let t0 = Instant::now();
    let mut phases: Vec<(&str, Instant, Instant)> = Vec::new();
    std::thread::sleep(Duration::from_secs(20));
    phases.push(("steady state", t0, Instant::now()));
    // An agent restarted: a new key, unknown to its peers until the controller relays it.
    let from = Instant::now();
    lab.kill("agent-1")?;
    start_agent(&lab, 1)?;
    std::thread::sleep(Duration::from_secs(20));
    phases.push(("node-1's agent restarted (a new key)", from, Instant::now()));
    still(&lab, "agent restart", &mut problems, &placed)?;
    // UDP 7479 blocked on node 1 for 60 s.
    let from = Instant::now();
    lab.block_adverts(1)?;
    std::thread::sleep(Duration::from_secs(60));
    lab.unblock_adverts(1)?;
    phases.push(("UDP 7479 blocked on node-1 for 60 s", from, Instant::now()));
    still(&lab, "adverts blocked", &mut problems, &placed)?;
    // A forged advert "from node-2 to node-1" with the largest counter, from a host on the
    // LAN that has no node's key.
    lab.add_rogue(Ipv4Addr::new(192, 168, 55, 250))?;
    let forged = forged_advert(&node_name(2), &node_name(1));
    let to = node_ip(1);
    in_namespace(ROGUE_NS, move || {
        let s = UdpSocket::bind("0.0.0.0:0").map_err(|source| Error::Io {
            what: "a UDP socket in the rogue namespace".into(),
            source,
        })?;
        s.send_to(&forged, (to, ADVERT_PORT))
            .map_err(|source| Error::Io {
                what: "sending the forged advert".into(),
                source,
            })?;
        Ok::<(), Error>(())
    })??;
    let from = Instant::now();
    std::thread::sleep(Duration::from_secs(15));
    phases.push((
        "a forged advert with the largest counter",
        from,
        Instant::now(),
    ));
    still(&lab, "forged advert", &mut problems, &placed)?;
    lab.remove_rogue()?;
    let record = sampler.finish()?;
    doubled.extend(doubles(&record, t0));
    let rates: Vec<(&str, f64)> = phases
        .iter()
        .map(|(what, from, to)| (*what, record.request_rate(&nodes, *from, *to)))
        .collect();
    let steady = rates[0].1;
    for (what, rate) in &rates {
        println!("[trusted] nodes' ARP requests, {what}: {rate:.2}/s");
    }
    // Each silent pair costs at most a probe round (2 frames) every 2 s once backed off:
    // with a handful of pairs, a few frames a second at most, against thousands before
    // (125.74/s with UDP 7479 blocked before the fix). Measured: 6.01/s on a quiet machine
    // in every run, 8.76/s once with both cores busy building (the silence's first
    // re-checks and a slow key relay crowd the minute): the bound leaves room for that and
    // is still an order of magnitude under the storm.
    for (what, rate) in &rates[1..] {
        if *rate > steady + 12.0 {
            problems.push(format!(
                "{what}: {rate:.2} ARP requests/s (steady {steady:.2}/s)"
            ));
        }
    }

    // 3. One holder across a return.
    for offset_ms in [500u64, 1_000, 2_000, 5_000] {
        placed = holders(&lab)?;
        let (ip, h) = placed.iter().next().map(|(i, n)| (*i, *n)).unwrap();
        let sampler = LanSampler::start([ip])?;
        let from = Instant::now();
        lab.unplug(h)?;
        lab.kill(&format!("agent-{h}"))?;
        std::thread::sleep(Duration::from_millis(offset_ms));
        start_agent(&lab, h)?;
        // The link comes back once the agent has acted on the aliases of its run before
        // (with no carrier, it takes them all down), plus 200 ms: a fixed delay after the
        // start raced a slow start on a loaded machine (CI: two MACs once).
        let started = Instant::now();
        let ours: BTreeSet<Ipv4Addr> = ips.iter().copied().collect();
        let settled = wait_for(
            "the restarted agent to act on its aliases",
            Duration::from_secs(10),
            || {
                let left: Vec<Ipv4Addr> = aliases(h)?.intersection(&ours).copied().collect();
                Ok(if left.is_empty() {
                    Ok(started.elapsed())
                } else {
                    Err(format!("still on the node: {left:?}"))
                })
            },
        )?;
        std::thread::sleep(Duration::from_millis(200));
        lab.plug(h)?;
        std::thread::sleep(Duration::from_secs(6));
        let record = sampler.finish()?;
        let two = doubles(&record, from);
        // Whether the assignment reached the agent before its link was back: then it held
        // the IPs back for want of carrier (see the module docs).
        let log = lab.log_tail(&format!("agent-{h}"), 400);
        let this_run = log
            .rsplit("aliaslb-agent starting")
            .next()
            .unwrap_or_default();
        let unplugged = this_run
            .matches("its link has no carrier: not added")
            .count();
        println!(
            "[trusted] {} lost, back after {offset_ms} ms (its aliases down {settled:?} after the agent's start; {unplugged} IPs held back for want of carrier): {ip} answered by {:?}; {} rounds with two MACs",
            node_name(h),
            record.last_answer(ip),
            two.len()
        );
        if !two.is_empty() {
            problems.push(format!(
                "return after {offset_ms} ms: two MACs for {ip}: {}",
                two.join("; ")
            ));
        }
    }
    if !doubled.is_empty() {
        problems.push(format!("two MACs: {}", doubled.join("; ")));
    }
    assert!(
        problems.is_empty(),
        "{} problem(s):\n{}",
        problems.len(),
        problems.join("\n")
    );
    Ok(())
}

/// Whether the IPs still sit where `before` says; a problem for `what` if not.
fn still(
    lab: &Lab,
    what: &str,
    problems: &mut Vec<String>,
    before: &BTreeMap<Ipv4Addr, u8>,
) -> Result<(), Error> {
    let after = holders(lab)?;
    if &after != before {
        problems.push(format!("{what}: IPs moved: {before:?} -> {after:?}"));
    }
    Ok(())
}

/// An advert "from `from` to `to`" with the largest counter, listing nothing, signed with
/// no node's key (64 bytes of noise): what a host on the LAN can forge.
fn forged_advert(from: &str, to: &str) -> Vec<u8> {
    let mut out = b"ALBA\x02".to_vec();
    for name in [from, to] {
        out.push(name.len() as u8);
        out.extend_from_slice(name.as_bytes());
    }
    out.extend_from_slice(&u64::MAX.to_be_bytes());
    out.extend_from_slice(&0u16.to_be_bytes());
    out.extend((0..64u8).map(|b| b.wrapping_mul(37)));
    out
}
