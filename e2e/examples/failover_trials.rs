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
//!
//! Issue 24 (L2 failover under a second, without the API) is judged on the LAN, in the
//! first table: from the fault to the first ARP answer by another MAC (p50 / p99 / max),
//! whether that MAC is the standby the controller named in the holder's `peer=` flag, and
//! the runs of LAN rounds in which two MACs answered (none may last longer than one advert
//! interval, 100 ms, plus one 20 ms LAN period). Its faults: `hard` (the holder's LAN link
//! cut and its agent SIGKILLed; p99 <= 1 s, p50 <= 0.5 s), `hard-api-pause` (the same with
//! kube-apiserver paused from before the fault until `--api-hold-ms` after the client's
//! answer through another node), `freeze` (no takeover before the holder's alias lifetime
//! ends, 3 s at the 4 s lease, so no two MACs), `flap` (`--flaps` downs and ups of the
//! holder's link, `--flap-ms` each: one MAC at a time, moved or not) and `adverts-blocked`
//! (the holder's UDP adverts dropped for `--pause-seconds`, ARP still answered: no other
//! MAC at all). `lan-partition` cuts the holder off the other nodes on the LAN bridge for
//! `--pause-seconds` (the client still reaches every node): the standby hears neither
//! adverts nor ARP answers, so only the two-MAC bound judges it; `standby-partition` cuts
//! it off its standby alone (the relay still reaches both: nothing may move). Gratuitous
//! ARPs by a node that does not answer for the IP (stray) are counted too. The second table is the
//! client's and the address sampler's view, as before.
//!
//! ```sh
//! cargo run -p aliaslb-e2e --example failover_trials -- --leases 4 --trials 50 \
//!     --faults hard,hard-api-pause
//! cargo run -p aliaslb-e2e --example failover_trials -- --leases 4 --trials 10 \
//!     --faults freeze,flap,adverts-blocked,lan-partition,api-pause,partition --pause-seconds 5
//! ```

use std::path::PathBuf;
use std::time::{Duration, Instant};

use aliaslb_e2e::Error;
use aliaslb_e2e::fixtures::{lb_service, namespace};
use aliaslb_e2e::lab::{Lab, NODES, node_name, wait_for};
use aliaslb_e2e::trials::{
    self, Fault, Launcher, Overlap, SETTLE_TIMEOUT, Summary, TWO_MAC_BOUND, Trial, TrialSettings,
    TwoMacs, agent_lease, load_average, settle,
};
use clap::Parser;

const NS: &str = "e2e-trials";
const SERVICE: &str = "bench";
const POOL: [&str; 2] = ["192.168.55.30", "192.168.55.31"];

/// Failover trials over the netns lab.
#[derive(Debug, Parser)]
struct Args {
    /// Trials per fault and lease duration.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
    trials: u32,
    /// Agent lease durations to measure under, in whole seconds (4 is the default).
    #[arg(long, value_delimiter = ',', default_value = "4,2", value_parser = clap::value_parser!(u64).range(1..=60))]
    leases: Vec<u64>,
    /// Faults to inject: hard, hard-api-pause, kill, link, freeze, flap, term, cordon,
    /// exclude, partition, api-pause, controller-partition, adverts-blocked, foreign.
    #[arg(long, value_delimiter = ',', default_value = "hard,hard-api-pause,kill,link,freeze,term,cordon,exclude", value_parser = Fault::from_key)]
    faults: Vec<Fault>,
    /// Stop a fault's series after this many trials in a row in which the IP did not move
    /// at all (0: never), so a fault that is not handled does not eat the run.
    #[arg(long, default_value_t = 3)]
    give_up_after: u32,
    /// How long `api-pause` stops the apiserver, `controller-partition` cuts the
    /// controller and `adverts-blocked` drops the holder's adverts, in seconds.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=120))]
    pause_seconds: u64,
    /// How long `hard-api-pause` keeps the apiserver paused after the client's first
    /// answer through another node, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    api_hold_ms: u64,
    /// How many times `flap` takes the holder's link down.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=20))]
    flaps: u32,
    /// How long each of `flap`'s downs and ups lasts, in milliseconds.
    #[arg(long, default_value_t = 200)]
    flap_ms: u64,
    /// How long the LAN is still watched after a fault is undone, in milliseconds.
    #[arg(long, default_value_t = 1500)]
    tail_ms: u64,
    /// Also write the Markdown table to this file.
    #[arg(long)]
    out: Option<PathBuf>,
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
    let settings = TrialSettings {
        pause: Duration::from_secs(args.pause_seconds),
        api_hold: Duration::from_millis(args.api_hold_ms),
        flaps: args.flaps,
        flap_period: Duration::from_millis(args.flap_ms),
        tail: Duration::from_millis(args.tail_ms),
        ..TrialSettings::new(NS, SERVICE)
    };
    let mut all = Vec::new();
    for &secs in &args.leases {
        let launcher = Launcher::new(Duration::from_secs(secs))?;
        restart_everything(&lab, &launcher, &settings)?;
        for &fault in &args.faults {
            let series = run_series(&lab, &launcher, fault, &args, &settings)?;
            println!("[trials] {}", row(&series));
            println!("[trials] {}", lan_row(&series));
            all.push(series);
        }
    }
    let table = format!("{}\n{}", lan_table(&all), table(&all));
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
fn restart_everything(
    lab: &Lab,
    launcher: &Launcher,
    settings: &TrialSettings,
) -> Result<(), Error> {
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
    println!(
        "[trials] {}",
        trials::wait_advert_keys(lab, Duration::from_secs(10))?
    );
    settle(lab, settings, None).map(drop)
}

fn run_series(
    lab: &Lab,
    launcher: &Launcher,
    fault: Fault,
    args: &Args,
    settings: &TrialSettings,
) -> Result<Series, Error> {
    let timeout = fault.timeout(launcher.lease, settings.pause);
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
        let (ip, holder) = settle(lab, settings, Some(NODES[(i as usize - 1) % NODES.len()]))?;
        let trial = trials::run_trial(lab, launcher, fault, ip, holder, settings)?;
        let lan = format!(
            "LAN: {} rounds with two MACs beyond the yield bound, {} stalls, old holder answered {} ms after another MAC showed",
            trial.lan_doubles,
            trial.lan_stalls,
            trial.lan_yield.map_or("—".to_owned(), ms)
        );
        println!("[trials] #{i} {}", trial.line(launcher.lease));
        for p in trial.problems(launcher.lease) {
            println!("[trials] #{i} PROBLEM {p}");
        }
        if !fault.moves() && fault != Fault::ForeignHost {
            println!(
                "[trials] {}s {} #{i}: {ip} on {}: {}; {lan}",
                launcher.lease.as_secs(),
                fault.key(),
                node_name(holder),
                match trial.lan {
                    None => "no other MAC answered".to_owned(),
                    Some((_, to, after)) => format!(
                        "{} answered after {} ms",
                        to.map_or("an unknown MAC".to_owned(), node_name),
                        ms(after)
                    ),
                }
            );
        } else {
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
                        "[trials] {}s {} #{i}: {ip} on {}: no {} within {} ms; {lan}",
                        launcher.lease.as_secs(),
                        fault.key(),
                        node_name(holder),
                        if fault == Fault::ForeignHost {
                            "yield to the foreign host"
                        } else {
                            "answer through another node"
                        },
                        timeout.as_millis(),
                    );
                }
            }
        }
        if let Some(e) = &trial.evidence {
            println!("[trials] #{i} evidence: {e}");
            series.evidence = series.evidence.take().or(Some(e.clone()));
        }
        series.trials.push(trial);
    }
    series.load = format!("{} -> {}", series.load, load1());
    Ok(series)
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
    // For the faults that must move nothing, a trial without a move is the good outcome
    // (a flapping link may move the IP or not: the client is not asked).
    let still = !s.fault.moves() && s.fault != Fault::ForeignHost;
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

/// A LAN time summary cell: `p50 / p99 / max`, a missing answer counting as `> timeout`.
fn lan_cell(s: &Series) -> String {
    let times = trials::lan_times(&s.trials);
    let missing = s.trials.len() - times.len();
    match Summary::of(&times) {
        None if s.fault.moves() => format!("> {}", ms(s.timeout)),
        None => "—".to_owned(),
        Some(sum) if missing == 0 || !s.fault.moves() => {
            format!("{} / {} / {}", ms(sum.p50), ms(sum.p99), ms(sum.max))
        }
        // A trial without another MAC is slower than any figure: it sets p99 and max, and
        // p50 too when it is half of them or more.
        Some(_) => {
            let mut all = times.clone();
            all.extend(std::iter::repeat_n(Duration::MAX, missing));
            let sum = Summary::of(&all).unwrap_or_else(|| unreachable!("not empty"));
            let cell = |d: Duration| {
                if d == Duration::MAX {
                    format!("> {}", ms(s.timeout))
                } else {
                    ms(d)
                }
            };
            format!("{} / {} / {}", cell(sum.p50), cell(sum.p99), cell(sum.max))
        }
    }
}

/// The LAN figures of one series (issue 24) as a table row.
fn lan_row(s: &Series) -> String {
    let target = match s.fault.p50_target() {
        Some(p50) => format!("{} / {}", ms(p50), ms(s.fault.target(s.lease))),
        None if s.fault.stays() => "no other MAC".to_owned(),
        None if s.fault.moves() || s.fault == Fault::ForeignHost => {
            format!("— / {}", ms(s.fault.target(s.lease)))
        }
        None => "—".to_owned(),
    };
    let none = s.trials.iter().filter(|t| t.lan.is_none()).count();
    let named = s.trials.iter().filter(|t| t.standby.is_some()).count();
    let lined = s
        .trials
        .iter()
        .filter(|t| t.standby_line == Some(true))
        .count();
    let to_standby = s.trials.iter().filter(|t| t.taker_is_standby()).count();
    let took = s.trials.iter().filter(|t| t.lan.is_some()).count();
    let garp: Vec<Duration> = s.trials.iter().filter_map(|t| t.announced).collect();
    let garp = Summary::of(&garp).map_or("—".to_owned(), |sum| ms(sum.p50));
    let followed: Vec<Duration> = s
        .trials
        .iter()
        .filter_map(|t| t.followed.map(|(_, d)| d))
        .collect();
    let followed = Summary::of(&followed).map_or("—".to_owned(), |sum| ms(sum.p50));
    let two = s
        .trials
        .iter()
        .map(|t| t.two_macs)
        .fold(TwoMacs::default(), TwoMacs::merge);
    let with_two = s.trials.iter().filter(|t| t.two_macs.rounds > 0).count();
    let mut rates: Vec<f64> = s.trials.iter().filter_map(|t| t.adverts_per_s).collect();
    rates.sort_by(f64::total_cmp);
    let rate = rates
        .get(rates.len().saturating_sub(1) / 2)
        .map_or("—".to_owned(), |r| format!("{r:.0}"));
    let counted = s
        .trials
        .iter()
        .filter_map(|t| t.standby_counters)
        .fold((0, 0, 0), |(a, b, c), x| {
            (a + x.taken_over, b + x.still_answered, c + x.given_back)
        });
    let stray = s
        .trials
        .iter()
        .filter(|t| !t.stray_garps.is_empty())
        .count();
    let problems = trials::series_problems(&s.trials, s.lease);
    let verdict = if problems.is_empty() {
        "ok".to_owned()
    } else {
        format!("{} problem(s): {}", problems.len(), problems[0])
    };
    format!(
        "| {} | {} s | {} | {} | {target} | {none} | {to_standby}/{took} | {named} / {lined} / {} | {rate} | {} / {} / {} | {garp} | {stray} | {followed} | {} | {with_two} | {} | {verdict} |",
        s.fault.describe(),
        s.lease.as_secs(),
        s.trials.len(),
        lan_cell(s),
        s.trials.len(),
        counted.0,
        counted.1,
        counted.2,
        two.rounds,
        ms(two.longest),
    )
}

fn lan_table(all: &[Series]) -> String {
    let mut out = format!(
        "| Fault | agent lease | trials | LAN: fault -> another MAC answers ARP, p50 / p99 / max ms | target p50 / p99 ms | trials with no other MAC | taken by the peer= standby | standby named (peer=) / with its standby= line / trials | adverts/s the standby accepted before the fault, p50 | standby's taken_over / still_answered / given_back | that MAC's GARP p50 ms | trials with a stray GARP (sender not answering) | controller moved the Service p50 ms | LAN rounds with 2 MACs | trials with 2 MACs | longest 2-MAC run ms (bound {}) | verdict |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        ms(TWO_MAC_BOUND)
    );
    for s in all {
        out.push_str(&lan_row(s));
        out.push('\n');
    }
    out
}
