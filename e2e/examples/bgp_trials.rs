//! L3 mode failover figures over many trials (BENCHMARKS.md, "L3 mode"): the BGP faults of
//! the failover-trials family. For each fault, `--trials` times, on node 1, 2, 3 in turn:
//! wait until the router has one path per node and the client is answered through each,
//! then, while the client behind the router connects in a loop, inject the fault on the
//! node, time until the router's kernel FIB no longer has that node's path, count the
//! client connections that failed meanwhile (from the fault to one second after the
//! withdrawal), undo the fault and wait for the path to be back. Prints p50/p99/max per
//! fault as a Markdown table. Needs root; about 10 s per trial:
//!
//! ```sh
//! cargo build -p aliaslb-agent -p aliaslb-controller --bins
//! cargo run -p aliaslb-e2e --example bgp_trials -- --trials 20
//! ```
//!
//! Faults: `kill` (SIGKILL of the agent: the address's kernel lifetime ends, the daemon
//! withdraws; bound: lifetime + 1 s), `link` (the node's LAN link down: BFD, 300 ms x 3),
//! `term` (SIGTERM: the agent removes its address first), `cordon`.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use aliaslb_e2e::Error;
use aliaslb_e2e::bgp::{BgpLab, NodeDaemon, routed_pool};
use aliaslb_e2e::fixtures::lb_service;
use aliaslb_e2e::lab::{Lab, NODES, node_name, wait_for};
use aliaslb_e2e::trials::{Summary, load_average};
use clap::Parser;

const NS: &str = "bgp-trials";
const SERVICE: &str = "bench";
const POOL: &str = "10.200.0.100-10.200.0.101";
/// How long after the withdrawal the client keeps counting failures.
const AFTER: Duration = Duration::from_secs(1);

/// L3 failover trials over the netns lab.
#[derive(Debug, Parser)]
struct Args {
    /// Trials per fault.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
    trials: u32,
    /// Faults to inject: kill, link, term, cordon.
    #[arg(long, value_delimiter = ',', default_value = "kill,link,term,cordon")]
    faults: Vec<String>,
    /// The routing daemon on the nodes: bird or frr.
    #[arg(long, default_value = "bird")]
    daemon: String,
}

/// One fault's figures.
struct Series {
    fault: String,
    withdrawn: Vec<Duration>,
    failed: Vec<usize>,
    answered: usize,
    timeouts: usize,
}

fn main() -> Result<(), Error> {
    let args = Args::parse();
    let daemon = match args.daemon.as_str() {
        "bird" => NodeDaemon::Bird,
        "frr" => NodeDaemon::Frr,
        other => {
            return Err(Error::Environment(format!(
                "--daemon {other}: expected bird or frr"
            )));
        }
    };
    for fault in &args.faults {
        if !["kill", "link", "term", "cordon"].contains(&fault.as_str()) {
            return Err(Error::Environment(format!(
                "unknown fault {fault}: expected kill, link, term or cordon"
            )));
        }
    }
    let Some(lab) = Lab::up()? else {
        return Ok(());
    };
    let started = Instant::now();
    routed_pool(&lab, NS, POOL)?;
    let bgp = BgpLab::up(&lab, daemon)?;
    bgp.restart_agents()?;
    lab.apply(&lb_service(NS, SERVICE).to_yaml())?;
    let vip = wait_for("the Service's IP", Duration::from_secs(20), || {
        let view = lab.service(NS, SERVICE)?;
        Ok(match view.ips.as_slice() {
            [ip] => Ok(IpAddr::V4(*ip)),
            _ => Err(view.summary()),
        })
    })?;
    let mut all = Vec::new();
    for fault in &args.faults {
        let mut series = Series {
            fault: fault.clone(),
            withdrawn: Vec::new(),
            failed: Vec::new(),
            answered: 0,
            timeouts: 0,
        };
        for trial in 0..args.trials {
            let n = NODES[trial as usize % NODES.len()];
            trial_once(&lab, &bgp, vip, fault, n, &mut series)?;
        }
        println!("[bgp-trials] {}", row(&series));
        all.push(series);
    }
    println!(
        "\n[bgp-trials] {} on the nodes, FRR router (ECMP, BFD 300 ms x 3, L4 hash); run took {:.0} s; load {}\n",
        daemon.name(),
        started.elapsed().as_secs_f64(),
        load_average()
    );
    println!(
        "| fault | trials | path withdrawn p50 | p99 | max | client connections failed (per trial: median / max) | answered meanwhile |"
    );
    println!("|---|---|---|---|---|---|---|");
    for s in &all {
        println!("{}", row(s));
    }
    Ok(())
}

/// One trial of `fault` on node `n`.
fn trial_once(
    lab: &Lab,
    bgp: &BgpLab<'_>,
    vip: IpAddr,
    fault: &str,
    n: u8,
    series: &mut Series,
) -> Result<(), Error> {
    let prefix = vip.to_string();
    let every: BTreeSet<u8> = NODES.into_iter().collect();
    let others: BTreeSet<u8> = NODES.into_iter().filter(|m| *m != n).collect();
    bgp.wait_next_hops(&prefix, &every, Duration::from_secs(60))?;
    bgp.settled(vip, &every)?;
    let (withdrawn, answered, failed) = bgp.while_probing(vip, || {
        std::thread::sleep(Duration::from_millis(300));
        let t0 = Instant::now();
        match fault {
            "kill" => lab.kill(&format!("agent-{n}"))?,
            "link" => bgp.link_down(n)?,
            "term" => lab.stop(&format!("agent-{n}"))?,
            _ => drop(lab.kubectl(&["cordon", &node_name(n)])?),
        }
        let gone = bgp
            .wait_next_hops(&prefix, &others, Duration::from_secs(10))
            .ok()
            .map(|_| t0.elapsed());
        std::thread::sleep(AFTER);
        Ok(gone)
    })?;
    match withdrawn {
        Some(took) => series.withdrawn.push(took),
        None => series.timeouts += 1,
    }
    series.failed.push(failed);
    series.answered += answered;
    match fault {
        "kill" | "term" => bgp.start_agent(n)?,
        "link" => bgp.link_up(n)?,
        _ => drop(lab.kubectl(&["uncordon", &node_name(n)])?),
    }
    Ok(())
}

fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1e3)
}

fn row(s: &Series) -> String {
    let summary = Summary::of(&s.withdrawn);
    let (p50, p99, max) = summary.map_or(("-".into(), "-".into(), "-".into()), |x| {
        (ms(x.p50), ms(x.p99), ms(x.max))
    });
    let mut failed = s.failed.clone();
    failed.sort_unstable();
    let median = failed.get(failed.len() / 2).copied().unwrap_or(0);
    let worst = failed.last().copied().unwrap_or(0);
    let timeouts = if s.timeouts > 0 {
        format!(" ({} not withdrawn within 10 s)", s.timeouts)
    } else {
        String::new()
    };
    format!(
        "| {} | {}{timeouts} | {p50} | {p99} | {max} | {median} / {worst} | {} |",
        s.fault,
        s.withdrawn.len() + s.timeouts,
        s.answered
    )
}
