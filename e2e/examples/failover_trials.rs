//! Failover figures over many trials (BENCHMARKS.md, "End-to-end failover"): for each agent
//! lease duration and each fault, `--trials` times: wait until the Service is settled
//! (announced, on one node only, reachable through that node), start the sampler and the
//! client's prober, inject the fault on the holder, time the first answer forwarded by
//! another node, count the samples with the IP on two nodes, undo the fault and wait for
//! the node to be back. Prints p50/p99/max per fault as a Markdown table. Needs root; takes
//! minutes (the full run about 20), which is why it is an example and not a test:
//!
//! ```sh
//! cargo build -p aliaslb-agent -p aliaslb-controller --bins
//! cargo run -p aliaslb-e2e --example failover_trials -- --trials 20
//! ```
//!
//! Every trial also runs the LAN sampler ([`aliaslb_e2e::lan`]): the table counts the rounds
//! in which two MACs answered for the IP beyond the 100 ms yield bound, the sampler's
//! stalls, and how long the old holder kept answering after the new one (or a foreign
//! host) first showed. The faults of issue 12 are not in the default set:
//!
//! ```sh
//! cargo run -p aliaslb-e2e --example failover_trials -- --leases 4 --trials 10 \
//!     --faults partition,api-pause,controller-partition,foreign --pause-seconds 10
//! ```
//!
//! The L3 (BGP) faults have a runner of their own, `e2e/examples/bgp_trials.rs`: there is no
//! one holder to move, the figure is how long the router keeps a failed node's path.
//!
//! `partition` must move the IP (lease + 1 s) with the old holder yielding within 100 ms of
//! the new one's announcement; `api-pause` and `controller-partition` must move nothing
//! (their "IP did not move" column is the good outcome); `foreign` times the holder's yield
//! to a foreign host that takes the IP (target 100 ms).

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use aliaslb_e2e::client::{self, RecoveryProbe};
use aliaslb_e2e::fixtures::{lb_service, namespace};
use aliaslb_e2e::lab::{Lab, NODES, node_name, wait_for};
use aliaslb_e2e::lan::{LanSampler, LanViolation};
use aliaslb_e2e::sampler::{SAMPLE_PERIOD, Sampler};
use aliaslb_e2e::trials::{
    self, Fault, Launcher, Overlap, Summary, agent_lease, load_average, set_cordoned, set_excluded,
};
use aliaslb_e2e::{Error, aliases};
use clap::Parser;

const NS: &str = "e2e-trials";
const SERVICE: &str = "bench";
const POOL: [&str; 2] = ["192.168.55.30", "192.168.55.31"];
const SETTLE_TIMEOUT: Duration = Duration::from_secs(30);
/// A graceful move that has not happened after this long counts as not happening.
const GRACEFUL_TIMEOUT: Duration = Duration::from_secs(3);
/// A hard failover is given the lease duration plus this long.
const HARD_GRACE: Duration = Duration::from_secs(4);
/// How long a foreign-host trial watches the LAN for the holder to yield.
const FOREIGN_WATCH: Duration = Duration::from_secs(3);

/// Failover trials over the netns lab.
#[derive(Debug, Parser)]
struct Args {
    /// Trials per fault and lease duration.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
    trials: u32,
    /// Agent lease durations to measure under, in whole seconds (4 is the default).
    #[arg(long, value_delimiter = ',', default_value = "4,2", value_parser = clap::value_parser!(u64).range(1..=60))]
    leases: Vec<u64>,
    /// Faults to inject: kill, link, freeze, term, cordon, exclude.
    #[arg(long, value_delimiter = ',', default_value = "kill,link,freeze,term,cordon,exclude", value_parser = Fault::from_key)]
    faults: Vec<Fault>,
    /// Stop a fault's series after this many trials in a row in which the IP did not move
    /// at all (0: never), so a fault that is not handled does not eat the run.
    #[arg(long, default_value_t = 3)]
    give_up_after: u32,
    /// How long `api-pause` stops the apiserver and `controller-partition` cuts the
    /// controller, in seconds.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=120))]
    pause_seconds: u64,
    /// Also write the Markdown table to this file.
    #[arg(long)]
    out: Option<PathBuf>,
}

/// One trial.
#[derive(Debug)]
struct Trial {
    from: u8,
    /// How long injecting the fault took (`kubectl`, `kill`, `ip`, `scripts/lab stop`).
    injection: Duration,
    /// The node that answered after the fault and how long it took; `None`: timed out.
    recovered: Option<(u8, Duration)>,
    overlap: Overlap,
    /// LAN rounds in which two MACs answered for the IP beyond the yield bound.
    lan_doubles: usize,
    /// Stalls of the LAN sampler beyond the yield bound.
    lan_stalls: usize,
    /// How long the old holder kept answering after another MAC first showed.
    lan_yield: Option<Duration>,
}

/// The trials of one fault under one lease duration.
#[derive(Debug)]
struct Series {
    lease: Duration,
    fault: Fault,
    trials: Vec<Trial>,
    timeout: Duration,
    /// Trials not run after `--give-up-after` timeouts in a row.
    skipped: u32,
    /// What the lab looked like at the first timeout.
    evidence: Option<String>,
    load: String,
}

fn main() -> Result<(), Error> {
    let args = Args::parse();
    let Some(lab) = Lab::up()? else {
        return Ok(());
    };
    let started = Instant::now();
    let header = machine();
    println!("[trials] {header}");
    lab.apply(&namespace(NS))?;
    lab.add_pool(NS, &POOL)?;
    lab.apply(&lb_service(NS, SERVICE).to_yaml())?;
    let mut all = Vec::new();
    for &secs in &args.leases {
        let launcher = Launcher::new(Duration::from_secs(secs))?;
        restart_everything(&lab, &launcher)?;
        for &fault in &args.faults {
            let series = run_series(&lab, &launcher, fault, &args)?;
            println!("[trials] {}", row(&series));
            all.push(series);
        }
    }
    let table = table(&all);
    println!(
        "\n[trials] {header}; run took {:.0} s; load at the end {}\n\n{table}",
        started.elapsed().as_secs_f64(),
        load_average()
    );
    for s in all.iter().filter(|s| s.evidence.is_some()) {
        println!(
            "[trials] evidence, {} with a {} s lease: {}",
            s.fault.describe(),
            s.lease.as_secs(),
            s.evidence.as_deref().unwrap_or_default()
        );
    }
    if let Some(path) = &args.out {
        std::fs::write(path, &table).map_err(|source| Error::Io {
            what: format!("writing {}", path.display()),
            source,
        })?;
    }
    Ok(())
}

/// Date, CPUs, CPU model, kernel and load, for the record.
fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name")?.split_once(':'))
        .map(|(_, m)| m.trim().to_owned())
        .unwrap_or_default();
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let date = aliaslb_e2e::lab::run(std::process::Command::new("date").args(["-u", "+%F %R UTC"]))
        .unwrap_or_default();
    format!(
        "{}; {cpus} CPUs ({model}); kernel {}; load {}",
        date.trim(),
        kernel.trim(),
        load_average()
    )
}

/// Restarts the controller and every agent with `launcher`'s lease duration and waits for
/// the agents' Leases to carry it and the Service to be settled.
fn restart_everything(lab: &Lab, launcher: &Launcher) -> Result<(), Error> {
    let secs = launcher.lease.as_secs();
    println!("[trials] restarting the controller and the agents with a {secs} s agent lease");
    lab.stop("controller-1")?;
    for n in NODES {
        lab.stop(&format!("agent-{n}"))?;
    }
    for n in NODES {
        launcher.start_agent(lab, n)?;
    }
    launcher.start_controller(lab, "controller-1")?;
    lab.wait_leader("controller-1", SETTLE_TIMEOUT)?;
    for n in NODES {
        wait_for(
            &format!("{}'s agent Lease of {secs} s", node_name(n)),
            SETTLE_TIMEOUT,
            || {
                Ok(match agent_lease(lab, n)? {
                    Some(l) if l.duration_seconds == Some(secs) => Ok(()),
                    other => Err(format!("{other:?}")),
                })
            },
        )?;
    }
    settle(lab, None).map(drop)
}

fn run_series(lab: &Lab, launcher: &Launcher, fault: Fault, args: &Args) -> Result<Series, Error> {
    let pause = Duration::from_secs(args.pause_seconds);
    let timeout = if fault == Fault::ForeignHost {
        FOREIGN_WATCH
    } else if fault.timed() {
        pause + launcher.lease + HARD_GRACE
    } else if fault.graceful() {
        GRACEFUL_TIMEOUT
    } else {
        launcher.lease + HARD_GRACE
    };
    let mut series = Series {
        lease: launcher.lease,
        fault,
        trials: Vec::new(),
        timeout,
        skipped: 0,
        evidence: None,
        load: load1(),
    };
    let mut timeouts_in_a_row = 0;
    for i in 1..=args.trials {
        if args.give_up_after > 0 && timeouts_in_a_row >= args.give_up_after {
            series.skipped = args.trials - i + 1;
            println!(
                "[trials] {}: the IP did not move in {timeouts_in_a_row} trials in a row: skipping the remaining {}",
                fault.key(),
                series.skipped
            );
            break;
        }
        // Holders 1, 2, 3, 1, ...: never the previous trial's, whatever the fault did.
        let (ip, holder) = settle(lab, Some(NODES[(i as usize - 1) % NODES.len()]))?;
        let (trial, evidence) = run_trial(lab, launcher, fault, ip, holder, timeout, pause)?;
        let lan = format!(
            "LAN: {} rounds with two MACs beyond the yield bound, {} stalls, old holder answered {} ms after another MAC showed",
            trial.lan_doubles,
            trial.lan_stalls,
            trial.lan_yield.map_or("—".to_owned(), ms)
        );
        if !fault.moves() && fault != Fault::ForeignHost {
            println!(
                "[trials] {}s {} #{i}: {ip} on {}: {}; {lan}",
                launcher.lease.as_secs(),
                fault.key(),
                node_name(holder),
                match trial.recovered {
                    None => "did not move (good)".to_owned(),
                    Some((to, after)) =>
                        format!("MOVED to {} after {} ms", node_name(to), ms(after)),
                }
            );
            series.trials.push(trial);
            continue;
        }
        match trial.recovered {
            Some((to, after)) => {
                timeouts_in_a_row = 0;
                println!(
                    "[trials] {}s {} #{i}: {ip} {} -> {} in {:.0} ms; on two nodes in {} samples (longest {:.0} ms); {lan}",
                    launcher.lease.as_secs(),
                    fault.key(),
                    node_name(holder),
                    node_name(to),
                    after.as_secs_f64() * 1e3,
                    trial.overlap.samples,
                    trial.overlap.longest.as_secs_f64() * 1e3
                );
            }
            None => {
                timeouts_in_a_row += 1;
                println!(
                    "[trials] {}s {} #{i}: {ip} on {}: no {} within {} ms; {lan}; {}",
                    launcher.lease.as_secs(),
                    fault.key(),
                    node_name(holder),
                    if fault == Fault::ForeignHost {
                        "yield to the foreign host"
                    } else {
                        "answer through another node"
                    },
                    timeout.as_millis(),
                    evidence.as_deref().unwrap_or_default()
                );
                series.evidence = series.evidence.or(evidence);
            }
        }
        series.trials.push(trial);
    }
    series.load = format!("{} -> {}", series.load, load1());
    Ok(series)
}

/// Waits until the Service is announced, its IP is on its node only and the client is
/// answered through that node. With `holder`, first moves the IP there if it is elsewhere
/// (by cordoning the other nodes for the move), so the trials rotate over the nodes
/// instead of following the election's tie-break. Returns (IP, holder).
fn settle(lab: &Lab, holder: Option<u8>) -> Result<(Ipv4Addr, u8), Error> {
    let (mut ip, mut at) = lab.wait_announced(NS, SERVICE, SETTLE_TIMEOUT)?;
    if let Some(want) = holder.filter(|&want| want != at) {
        (ip, at) = move_to(lab, want)?;
    }
    let holder = at;
    wait_for(
        &format!("{ip} on {} only", node_name(holder)),
        SETTLE_TIMEOUT,
        || {
            let mut on = Vec::new();
            for n in NODES {
                if aliases(n)?.contains(&ip) {
                    on.push(n);
                }
            }
            Ok(if on == [holder] {
                Ok(())
            } else {
                Err(format!("on nodes {on:?}"))
            })
        },
    )?;
    wait_for(
        &format!("the client to be answered through {}", node_name(holder)),
        SETTLE_TIMEOUT,
        || {
            Ok(match client::get(ip)? {
                Ok(a) if a.via_node() == Some(holder) => Ok(()),
                Ok(a) => Err(format!("answered {a:?}")),
                Err(e) => Err(e),
            })
        },
    )?;
    Ok((ip, holder))
}

/// Moves the Service's IP to node `want`: cordons the other nodes until it is announced
/// there, then uncordons them.
fn move_to(lab: &Lab, want: u8) -> Result<(Ipv4Addr, u8), Error> {
    let others: Vec<u8> = NODES.into_iter().filter(|&n| n != want).collect();
    for &n in &others {
        set_cordoned(lab, n, true)?;
    }
    let moved = wait_for(
        &format!("{SERVICE} to be announced on {}", node_name(want)),
        SETTLE_TIMEOUT,
        || {
            let (ip, at) = lab.wait_announced(NS, SERVICE, SETTLE_TIMEOUT)?;
            Ok(if at == want {
                Ok((ip, at))
            } else {
                Err(format!("on {}", node_name(at)))
            })
        },
    );
    for &n in &others {
        set_cordoned(lab, n, false)?;
    }
    moved
}

/// One trial; the evidence is filled in when the IP did not move (or, for a foreign
/// host, the holder did not yield).
fn run_trial(
    lab: &Lab,
    launcher: &Launcher,
    fault: Fault,
    ip: Ipv4Addr,
    old: u8,
    timeout: Duration,
    pause: Duration,
) -> Result<(Trial, Option<String>), Error> {
    let old_mac = lab.node_mac(old)?;
    let sampler = Sampler::start();
    let lan = LanSampler::start([ip])?;
    let probe = (fault != Fault::ForeignHost).then(|| {
        RecoveryProbe::start(ip, timeout, move |a| a.via_node().is_some_and(|n| n != old))
    });
    let fault_at = Instant::now();
    inject(lab, fault, ip, old)?;
    let injection = fault_at.elapsed();
    if fault.timed() {
        std::thread::sleep(pause.saturating_sub(injection));
        undo_timed(lab, fault)?;
    }
    let recovered = match probe {
        Some(probe) => match probe.wait(fault_at) {
            Ok(r) => r.answer.via_node().map(|n| (n, r.after)),
            Err(Error::Timeout { .. }) => None,
            Err(e) => return Err(e),
        },
        None => {
            std::thread::sleep(timeout);
            None
        }
    };
    // Sample on until the old node no longer has the IP (a killed or frozen agent's alias
    // lives until its lifetime, the lease duration, runs out), bounded.
    if fault.moves() {
        let until = fault_at + launcher.lease + Duration::from_secs(2);
        let gone = wait_for(
            &format!("{ip} to leave {}", node_name(old)),
            until.saturating_duration_since(Instant::now()),
            || {
                let held = aliases(old)?;
                Ok(if held.contains(&ip) {
                    Err(format!("{held:?}"))
                } else {
                    Ok(())
                })
            },
        );
        match gone {
            Ok(()) | Err(Error::Timeout { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    std::thread::sleep(SAMPLE_PERIOD * 2);
    let samples = sampler.finish()?;
    let record = lan.finish()?;
    let violations = record.violations();
    let lan_doubles = violations
        .iter()
        .filter(|v| matches!(v, LanViolation::Double { .. }))
        .count();
    let lan_stalls = violations.len() - lan_doubles;
    let lan_yield = trials::lan_yield(&record, ip, old_mac);
    let recovered = if fault == Fault::ForeignHost {
        lan_yield.map(|y| (old, y))
    } else {
        recovered
    };
    let evidence = match (recovered, fault.moves() || fault == Fault::ForeignHost) {
        (None, true) => Some(evidence(lab, ip, old)?),
        _ => None,
    };
    restore(lab, launcher, fault, old)?;
    Ok((
        Trial {
            from: old,
            injection,
            recovered,
            overlap: Overlap::of(&samples, ip),
            lan_doubles,
            lan_stalls,
            lan_yield,
        },
        evidence,
    ))
}

/// Ends a timed fault (`api-pause`, `controller-partition`).
fn undo_timed(lab: &Lab, fault: Fault) -> Result<(), Error> {
    match fault {
        Fault::ApiPause => lab.resume_apiserver(),
        Fault::ControllerPartition => lab.heal_controller("controller-1"),
        _ => Ok(()),
    }
}

fn inject(lab: &Lab, fault: Fault, ip: Ipv4Addr, n: u8) -> Result<(), Error> {
    let agent = format!("agent-{n}");
    match fault {
        Fault::ApiPartition => lab.partition_api(n),
        Fault::ApiPause => lab.pause_apiserver(),
        Fault::ControllerPartition => lab.partition_controller("controller-1"),
        Fault::ForeignHost => lab.add_rogue(ip).map(drop),
        Fault::AgentKill => lab.kill(&agent),
        Fault::LinkDown => lab.unplug(n),
        Fault::AgentFreeze => trials::signal(lab, &agent, "STOP"),
        Fault::AgentTerm => lab.stop(&agent),
        Fault::Cordon => set_cordoned(lab, n, true),
        Fault::ExcludeLabel => set_excluded(lab, n, true),
    }
}

/// Undoes `fault` on node `n` and waits until the node can take the IP again.
fn restore(lab: &Lab, launcher: &Launcher, fault: Fault, n: u8) -> Result<(), Error> {
    let agent = format!("agent-{n}");
    match fault {
        Fault::ApiPause => {
            return wait_for("the apiserver to answer", SETTLE_TIMEOUT, || {
                Ok(match lab.kubectl(&["get", "--raw", "/readyz"]) {
                    Ok(out) if out.trim() == "ok" => Ok(()),
                    Ok(out) => Err(out),
                    Err(e) => Err(e.to_string()),
                })
            });
        }
        Fault::ControllerPartition => return lab.wait_leader("controller-1", SETTLE_TIMEOUT),
        Fault::ForeignHost => return lab.remove_rogue(),
        _ => {}
    }
    let stale = agent_lease(lab, n)?.map(|l| l.renew_time);
    match fault {
        Fault::AgentKill | Fault::AgentTerm => launcher.start_agent(lab, n)?,
        Fault::AgentFreeze => {
            if !trials::stopped(lab, &agent)? {
                return Err(Error::Environment(format!(
                    "{agent} was not stopped when the trial ended"
                )));
            }
            trials::signal(lab, &agent, "CONT")?;
        }
        Fault::LinkDown => lab.plug(n)?,
        Fault::Cordon => return set_cordoned(lab, n, false),
        Fault::ExcludeLabel => return set_excluded(lab, n, false),
        Fault::ApiPartition => lab.heal_api(n)?,
        Fault::ApiPause | Fault::ControllerPartition | Fault::ForeignHost => {}
    }
    // The agent is back once it renews its Lease with eth0 in its report.
    wait_for(
        &format!("{agent} to renew its Lease again"),
        SETTLE_TIMEOUT,
        || {
            Ok(match agent_lease(lab, n)? {
                Some(l) if Some(&l.renew_time) != stale.as_ref() && l.reports_interface("eth0") => {
                    Ok(())
                }
                other => Err(format!("{other:?}")),
            })
        },
    )
}

/// Where things stood when the IP did not move: the Service, every node's aliases and the
/// old holder's report.
fn evidence(lab: &Lab, ip: Ipv4Addr, old: u8) -> Result<String, Error> {
    let service = lab.service(NS, SERVICE)?.summary();
    let mut on = BTreeMap::new();
    for n in NODES {
        on.insert(node_name(n), aliases(n)?.contains(&ip));
    }
    let report = agent_lease(lab, old)?.map(|l| l.report);
    Ok(format!(
        "Service: {service}; {ip} on eth0: {on:?}; {}'s agent report: {}",
        node_name(old),
        report.as_deref().unwrap_or("no Lease")
    ))
}

/// The 1-minute load average.
fn load1() -> String {
    load_average()
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_owned()
}

fn ms(d: Duration) -> String {
    format!("{:.0}", d.as_secs_f64() * 1e3)
}

/// The figures of one series as a table row.
fn row(s: &Series) -> String {
    let target = s.fault.target(s.lease);
    let times: Vec<Duration> = s
        .trials
        .iter()
        .filter_map(|t| t.recovered.map(|(_, after)| after))
        .collect();
    let timeouts = s.trials.len() - times.len();
    // For the faults that must move nothing, a trial without a move is the good outcome.
    let still = s.fault.timed();
    let within = if still {
        timeouts
    } else {
        times.iter().filter(|&&t| t <= target).count()
    };
    let (p50, p99, max) = match Summary::of(&times) {
        _ if still && times.is_empty() => ("—".to_owned(), "—".to_owned(), "—".to_owned()),
        Some(sum) if timeouts == 0 => (ms(sum.p50), ms(sum.p99), ms(sum.max)),
        // A timed-out trial is slower than any figure: it sets p99 and max.
        Some(sum) => (
            ms(sum.p50),
            format!("> {}", ms(s.timeout)),
            format!("> {}", ms(s.timeout)),
        ),
        None => (
            "—".to_owned(),
            format!("> {}", ms(s.timeout)),
            format!("> {}", ms(s.timeout)),
        ),
    };
    let overlap = s
        .trials
        .iter()
        .map(|t| t.overlap)
        .fold(Overlap::default(), Overlap::merge);
    let injections: Vec<Duration> = s.trials.iter().map(|t| t.injection).collect();
    let injection = Summary::of(&injections).map_or("—".to_owned(), |sum| ms(sum.p50));
    let with_overlap = s.trials.iter().filter(|t| t.overlap.samples > 0).count();
    let lan_doubles: usize = s.trials.iter().map(|t| t.lan_doubles).sum();
    let lan_stalls: usize = s.trials.iter().map(|t| t.lan_stalls).sum();
    let yields: Vec<Duration> = s.trials.iter().filter_map(|t| t.lan_yield).collect();
    let yields = Summary::of(&yields).map_or("—".to_owned(), |sum| {
        format!("{} / {}", ms(sum.p50), ms(sum.max))
    });
    let holders: Vec<String> = NODES
        .into_iter()
        .map(|n| s.trials.iter().filter(|t| t.from == n).count().to_string())
        .collect();
    let skipped = if s.skipped > 0 {
        format!(" ({} skipped)", s.skipped)
    } else {
        String::new()
    };
    format!(
        "| {} | {} s | {}{skipped} | {} | {p50} | {p99} | {max} | {injection} | {} | {within}/{} | {} | {with_overlap} | {} | {} | {lan_doubles} | {lan_stalls} | {yields} | {} |",
        s.fault.describe(),
        s.lease.as_secs(),
        s.trials.len(),
        holders.join("/"),
        ms(target),
        s.trials.len(),
        timeouts,
        overlap.samples,
        ms(overlap.longest),
        s.load
    )
}

fn table(all: &[Series]) -> String {
    let mut out = String::from(
        "| Fault | agent lease | trials | holder node 1/2/3 | p50 ms | p99 ms | max ms | fault command p50 ms | target ms | within target | IP did not move | trials with IP on 2 nodes | samples on 2 nodes | longest overlap ms | LAN rounds with 2 MACs beyond 100 ms | LAN sampler stalls | old holder's yield p50 / max ms | load (1-min avg, start -> end) |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for s in all {
        out.push_str(&row(s));
        out.push('\n');
    }
    out
}
