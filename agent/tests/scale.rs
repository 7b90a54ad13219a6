//! 1,000 aliases through the real agent binary (one Service whose status lists 1,000 IPs,
//! as a controller could write it) against `ip -batch` adding the same 1,000 addresses in
//! another namespace in the same run. Prints the figures recorded in BENCHMARKS.md; asserts
//! every alias arrives and leaves and the Lease reports all of them. Needs root.
//!
//! `cargo test -p aliaslb-agent --test scale -- --nocapture`

mod agent_support;
mod support;

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use agent_support::{Agent, AgentArgs, Cluster, Relay, eventually};
use aliaslb_testenv::TestEnv;
use support::{NetNs, require_root, run_cmd};

const N: u32 = 1_000;

/// 10.0.100.0 .. 10.0.103.231.
fn vips() -> Vec<String> {
    let base = u32::from(Ipv4Addr::new(10, 0, 100, 0));
    (0..N)
        .map(|i| Ipv4Addr::from(base + i).to_string())
        .collect()
}

/// A namespace with `eth1` on 10.0.0.2/16 (holding every VIP's subnet).
fn node(tag: &str) -> NetNs {
    let ns = NetNs::new(tag);
    ns.veth("eth1", None, "peer1");
    ns.ip(&["addr", "add", "10.0.0.2/16", "dev", "eth1"]);
    ns
}

/// How many of `want` are on eth1 in `ns`.
fn present(ns: &NetNs, want: &BTreeSet<String>) -> usize {
    ns.addrs("eth1")
        .iter()
        .filter(|a| want.contains(&a.local))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_aliases_through_the_agent_vs_ip_batch() {
    if !require_root() {
        return;
    }
    let vips = vips();
    let want: BTreeSet<String> = vips.iter().cloned().collect();

    // Baseline: `ip -batch`, one process, 1,000 `addr add`.
    let plain = node("batch");
    let batch: String = vips
        .iter()
        .map(|ip| format!("addr add {ip}/32 dev eth1\n"))
        .collect();
    let file = std::env::temp_dir().join(format!("{}.batch", plain.name()));
    std::fs::write(&file, batch).unwrap();
    let start = Instant::now();
    run_cmd(
        "ip",
        &["-n", plain.name(), "-batch", file.to_str().unwrap()],
    );
    let ip_batch = start.elapsed();
    let _ = std::fs::remove_file(&file);
    assert_eq!(present(&plain, &want), N as usize);

    // Through the agent.
    let env = TestEnv::global();
    let client = env.client().await;
    let namespace = env.create_namespace(&client, "scale").await;
    let ns = node("scale");
    let _relay = Relay::start(&ns, env.server_url());
    let name = "node-scale";
    let agent = Agent::start(&ns, &AgentArgs::new(name, &namespace));
    let cluster = Cluster::new(&client, &namespace);
    eventually(Duration::from_secs(20), "the first Lease", async || {
        cluster.report(name).await
    })
    .await;
    cluster.create("many").await;
    let refs: Vec<&str> = vips.iter().map(String::as_str).collect();
    let start = Instant::now();
    cluster.assign("many", Some(name), None, &refs).await;
    let written = start.elapsed();
    eventually(Duration::from_secs(30), "1,000 aliases", async || {
        (present(&ns, &want) == N as usize).then_some(())
    })
    .await;
    let applied = start.elapsed();
    let held: BTreeSet<IpAddr> = vips.iter().map(|s| s.parse().unwrap()).collect();
    eventually(
        Duration::from_secs(5),
        "1,000 IPs in the Lease report",
        async || {
            cluster
                .report(name)
                .await
                .filter(|r| r.held == held)
                .map(|_| ())
        },
    )
    .await;
    let reported = start.elapsed();
    // A few renewals with 1,000 aliases: the refresh keeps up with a 500 ms renewal.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let lifetimes: Vec<u64> = ns
        .addrs("eth1")
        .iter()
        .filter(|a| want.contains(&a.local))
        .map(|a| a.valid_life_time)
        .collect();
    assert_eq!(lifetimes.len(), N as usize, "an alias lapsed under load");
    assert!(lifetimes.iter().all(|&l| l <= 2), "{lifetimes:?}");

    let start = Instant::now();
    cluster.assign("many", None, None, &[]).await;
    eventually(
        Duration::from_secs(30),
        "the 1,000 aliases gone",
        async || (present(&ns, &want) == 0).then_some(()),
    )
    .await;
    let removed = start.elapsed();
    let log = strip_ansi(&agent.log_text());
    let reconciles: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("reconciled"))
        .filter(|l| l.contains("added=1000") || l.contains("removed=1000"))
        .filter_map(|l| l.split("took_ms=").nth(1))
        .collect();
    eprintln!(
        "ip -batch, 1,000 addr add: {ip_batch:?}\n\
         agent, status written -> 1,000 aliases seen by `ip -j addr`: {applied:?} \
         (status patch itself {written:?})\n\
         agent, status written -> Lease lists 1,000 held: {reported:?}\n\
         agent, assignment removed -> 1,000 aliases gone: {removed:?}\n\
         agent reconcile durations (took_ms) from its log: {reconciles:?}"
    );
}

/// `text` without terminal colour sequences (`ESC [ ... m`).
fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            for c in chars.by_ref() {
                if c == 'm' {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}
