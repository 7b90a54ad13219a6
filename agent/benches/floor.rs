//! The agent's kernel side against the floor, `ip -batch`, in one run (issue "Benchmarks
//! against the floor"). Prints the figures recorded in BENCHMARKS.md and asserts that each
//! measured step did its work (every alias really added, removed, kept). Needs root.
//!
//! ```sh
//! cargo bench -p aliaslb-agent --bench floor              # every section
//! cargo bench -p aliaslb-agent --bench floor -- apply     # or: idle, binary
//! BENCH_ALIASES=10000 cargo bench -p aliaslb-agent --bench floor   # the scale target
//! ```
//!
//! `BENCH_ALIASES` (default 1,000, at most 39,936) is the number of aliases of every section.
//!
//! - `apply`: `AliasManager::reconcile` with a `DesiredSet` of N /32 through the real
//!   `NetlinkBackend`, vs `ip -batch` adding the same N addresses with the same lifetime
//!   and label (iproute2 6.1 cannot set IFA_PROTO), then one lifetime refresh of them all
//!   (`refresh_lifetimes` vs `ip -batch` of `addr replace`), then removing them;
//!   alternated, `BENCH_REPS` times (default 15), medians and ratios. Also, ours only, a
//!   reconcile with nothing to change against its floor, the dump it starts with.
//!   Announcer off, then a separate run with it on.
//! - `idle`: the agent's loop (renewal refresh every 1 s, resync every 30 s, reconcile on
//!   every netlink tick) over N stable aliases for `BENCH_IDLE_SECS` (default 60):
//!   writes by kind, reconciles, CPU time of this process.
//! - `binary`: the real `aliaslb-agent` binary (same build profile) against the test
//!   apiserver (`KUBEBUILDER_ASSETS`), shield on: the time from its assignment object
//!   written to N aliases in the kernel, then N aliases held through one idle period: CPU
//!   time (its own, and its `nft` children's), adds/removes from its metrics, peak RSS
//!   (`VmHWM`).
//!
//! Does I/O: creates network namespaces and veth links, runs `ip`, starts the test
//! apiserver and the agent binary. `apply` and `idle` run on a thread inside a fresh
//! namespace (every thread and `ip` process it starts inherits it); `binary` stays in the
//! host namespace, where the test apiserver listens.

#[path = "../tests/agent_support/mod.rs"]
mod agent_support;
mod stats;
#[path = "../tests/support/mod.rs"]
mod support;

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use agent_support::{Agent, AgentArgs, Cluster, Relay};
use aliaslb_agent::aliases::{AliasConfig, AliasManager, WriteCounts};
use aliaslb_agent::desired::DesiredSet;
use aliaslb_agent::kernel::backend::{AddressBackend, Lifetime};
use aliaslb_agent::kernel::netlink::{NetlinkBackend, watch_changes};
use aliaslb_agent::l2::announce::{AnnounceConfig, Announcer};
use aliaslb_testenv::TestEnv;
use stats::{env_number, list, median, ms, sections, timed};
use support::{NetNs, require_root};
use tokio::runtime::Runtime;
use tokio::time::MissedTickBehavior;

/// Aliases per measurement: `BENCH_ALIASES`, default 1,000.
fn aliases() -> u32 {
    static N: OnceLock<u32> = OnceLock::new();
    *N.get_or_init(|| {
        let n = env_number("BENCH_ALIASES", 1_000);
        // From 10.0.100.0 up, inside eth1's 10.0.0.0/16.
        assert!(
            (1..=MAX_ALIASES).contains(&n),
            "BENCH_ALIASES={n}: 1 to {MAX_ALIASES}"
        );
        n as u32
    })
}
/// 10.0.100.0 .. 10.0.255.255.
const MAX_ALIASES: u64 = 156 * 256;
/// The lease, `BENCH_LEASE_SECS`, default the agent's `--lease-duration 4s`: the aliases'
/// lifetime. Longer for counts the kernel cannot add within 4 s (the first aliases would
/// lapse before the last are added, whoever adds them: see BENCHMARKS.md).
fn lease() -> Duration {
    Duration::from_secs(env_number("BENCH_LEASE_SECS", 4).max(1))
}
/// The renewal: the agent's default `--renew-interval 1s` with the default lease, else a
/// quarter of the lease.
fn renew() -> Duration {
    let lease = lease().as_secs();
    Duration::from_secs(if lease == 4 { 1 } else { (lease / 4).max(1) })
}
/// The DaemonSet's `MALLOC_ARENA_MAX` (manifests/agent.yaml, the chart), for `binary`.
const MALLOC_ARENA_MAX: &str = "1";
/// The agent's default `--resync-interval 30s`.
const RESYNC: Duration = Duration::from_secs(30);

fn main() {
    if !require_root() {
        return;
    }
    let run = sections();
    let reps = env_number("BENCH_REPS", 15);
    let idle_secs = env_number("BENCH_IDLE_SECS", 60);
    let n = aliases();
    println!(
        "aliaslb-agent floor bench: {n} aliases, lease {:?}, renew {:?}, {} build",
        lease(),
        renew(),
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "optimised"
        }
    );
    if run("apply") {
        let ns = node("apply");
        ns.run_sync(move || in_runtime(|rt| apply(rt, reps)));
    }
    if run("idle") {
        let ns = node("idle");
        ns.run_sync(move || in_runtime(|rt| idle(rt, Duration::from_secs(idle_secs))));
    }
    if run("binary") {
        in_runtime(|rt| rt.block_on(binary(Duration::from_secs(idle_secs))));
    }
}

/// A fresh namespace with the veth `eth1` (up, peer up) on 10.0.0.2/16, which holds every
/// VIP's subnet.
fn node(tag: &str) -> NetNs {
    let ns = NetNs::new(tag);
    ns.veth("eth1", None, "peer1");
    ns.ip(&["addr", "add", "10.0.0.2/16", "dev", "eth1"]);
    ns
}

/// Runs `f` with a multi-thread runtime shaped like the agent's (`#[tokio::main]`, one
/// worker per core); worker threads inherit the calling thread's namespace.
fn in_runtime<T>(f: impl FnOnce(&Runtime) -> T) -> T {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    f(&rt)
}

/// N addresses from 10.0.100.0 up (1,000: .. 10.0.103.231; 10,000: .. 10.0.139.15).
fn vips() -> Vec<Ipv4Addr> {
    let base = u32::from(Ipv4Addr::new(10, 0, 100, 0));
    (0..aliases()).map(|i| Ipv4Addr::from(base + i)).collect()
}

fn desired() -> DesiredSet {
    vips()
        .into_iter()
        .map(|ip| (IpAddr::V4(ip), None))
        .collect()
}

fn manager() -> AliasManager<NetlinkBackend> {
    AliasManager::new(
        NetlinkBackend::connect().expect("netlink socket"),
        AliasConfig {
            interface_override: None,
            lifetime: Lifetime::for_lease(lease()),
            routed_device: "lo".into(),
        },
    )
}

/// The `ip -batch` files adding, refreshing (`addr replace`) and deleting the VIPs.
struct BatchFiles {
    add: PathBuf,
    replace: PathBuf,
    del: PathBuf,
}

/// Writes the `ip -batch` files adding, refreshing and deleting the VIPs exactly as the
/// agent does: /32, `valid_lft`/`preferred_lft` = the lease, label `eth1:alb`.
fn batch_files(tag: &str) -> BatchFiles {
    let secs = Lifetime::for_lease(lease()).seconds;
    let dir = std::env::temp_dir();
    let add = dir.join(format!("alb-floor-{tag}-{}.add", std::process::id()));
    let replace = dir.join(format!("alb-floor-{tag}-{}.replace", std::process::id()));
    let del = dir.join(format!("alb-floor-{tag}-{}.del", std::process::id()));
    let lines = |verb: &str, extra: &str| -> String {
        vips()
            .iter()
            .map(|ip| format!("addr {verb} {ip}/32 dev eth1{extra}\n"))
            .collect()
    };
    let add_opts = format!(" valid_lft {secs} preferred_lft {secs} label eth1:alb");
    std::fs::write(&add, lines("add", &add_opts)).expect("writing the batch file");
    std::fs::write(&replace, lines("replace", &add_opts)).expect("writing the batch file");
    std::fs::write(&del, lines("del", "")).expect("writing the batch file");
    BatchFiles { add, replace, del }
}

/// Runs `ip -batch file` in the calling thread's namespace and times it (process start
/// included: that is what the floor costs an operator).
fn ip_batch(file: &PathBuf) -> Duration {
    let start = Instant::now();
    let out = Command::new("ip")
        .arg("-batch")
        .arg(file)
        .output()
        .expect("running ip");
    let took = start.elapsed();
    assert!(
        out.status.success(),
        "ip -batch failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    took
}

/// How many of the VIPs the kernel holds with our marker (the `ip` side sets the label,
/// which also counts as ours).
fn held(rt: &Runtime, backend: &NetlinkBackend) -> usize {
    let want: BTreeSet<IpAddr> = vips().into_iter().map(IpAddr::V4).collect();
    let host = rt.block_on(backend.snapshot()).expect("dump");
    host.addresses
        .iter()
        .filter(|a| a.owned && want.contains(&a.ip))
        .count()
}

/// Section 1: add and remove N aliases, ours vs `ip -batch`.
fn apply(rt: &Runtime, reps: u64) {
    let n = aliases();
    let files = batch_files("apply");
    let desired = desired();
    let empty = DesiredSet::new();
    let mut mgr = rt.block_on(async { manager() });
    let probe = rt.block_on(async { NetlinkBackend::connect().expect("netlink socket") });
    let (mut ours_add, mut ours_del, mut ip_add, mut ip_del) = (vec![], vec![], vec![], vec![]);
    let (mut ours_refresh, mut ip_refresh, mut ours_unchanged) = (vec![], vec![], vec![]);
    let mut dumps = vec![];
    // One untimed round of each warms the kernel's and the allocator's caches.
    for rep in 0..=reps {
        let ours_first = rep % 2 == 0;
        for side in [ours_first, !ours_first] {
            if side {
                let (add, r) = timed(rt, mgr.reconcile(&desired));
                assert_eq!((r.added.len(), r.errors.len()), (n as usize, 0), "{r:?}");
                assert_eq!(held(rt, &probe), n as usize);
                let (dump, _) = timed(rt, probe.snapshot());
                let (unchanged, r) = timed(rt, mgr.reconcile(&desired));
                assert_eq!((r.added.len(), r.removed.len(), r.errors.len()), (0, 0, 0));
                let (refresh, r) = timed(rt, mgr.refresh_lifetimes());
                assert_eq!((r.refreshed, r.errors.len()), (n as usize, 0), "{r:?}");
                let (del, r) = timed(rt, mgr.reconcile(&empty));
                assert_eq!((r.removed.len(), r.errors.len()), (n as usize, 0), "{r:?}");
                assert_eq!(held(rt, &probe), 0);
                if rep > 0 {
                    ours_add.push(add);
                    ours_refresh.push(refresh);
                    ours_unchanged.push(unchanged);
                    ours_del.push(del);
                    dumps.push(dump);
                }
            } else {
                let add = ip_batch(&files.add);
                assert_eq!(held(rt, &probe), n as usize);
                let refresh = ip_batch(&files.replace);
                assert_eq!(held(rt, &probe), n as usize);
                let del = ip_batch(&files.del);
                assert_eq!(held(rt, &probe), 0);
                if rep > 0 {
                    ip_add.push(add);
                    ip_refresh.push(refresh);
                    ip_del.push(del);
                }
            }
        }
    }
    println!("\n## apply: {n} /32 aliases on a veth, announcer off, {reps} repetitions");
    row("add    ours (reconcile)", &ours_add, &ip_add);
    row("refresh ours (one round)", &ours_refresh, &ip_refresh);
    row("remove ours (reconcile)", &ours_del, &ip_del);
    println!(
        "    of which the observe step (dump links, {n} addresses, routes): median {:.2} ms",
        ms(median(&dumps))
    );
    println!(
        "reconcile with nothing to change ({n} held): median {:.2} ms | its floor, the \
         observe step: {:.2} ms | ratio {:.2}",
        ms(median(&ours_unchanged)),
        ms(median(&dumps)),
        median(&ours_unchanged).as_secs_f64() / median(&dumps).as_secs_f64()
    );
    println!("    ours     {}", list(&ours_unchanged));

    // The announcer on: what the reconcile itself costs more, and how long until the
    // first frame of every burst is out (bursts cut to one frame).
    let announcer = Announcer::new(AnnounceConfig {
        repeats: 0,
        interval: Duration::from_secs(1),
    });
    let mut mgr = rt
        .block_on(async { manager() })
        .with_announcer(announcer.clone());
    let (mut with_add, mut frames_out) = (vec![], vec![]);
    let announced_reps = reps.min(5);
    for _ in 0..announced_reps {
        let before = announcer.frames_sent() + announcer.frames_failed();
        let start = Instant::now();
        let r = rt.block_on(mgr.reconcile(&desired));
        with_add.push(start.elapsed());
        assert_eq!((r.added.len(), r.errors.len()), (n as usize, 0), "{r:?}");
        rt.block_on(async {
            while announcer.frames_sent() + announcer.frames_failed() < before + u64::from(n) {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        });
        frames_out.push(start.elapsed());
        let r = rt.block_on(mgr.reconcile(&empty));
        assert_eq!(r.removed.len(), n as usize);
    }
    assert_eq!(announcer.frames_failed(), 0, "announcements failed");
    println!("\n## apply with the announcer on (1 frame per alias), {announced_reps} repetitions");
    println!(
        "add    ours, reconcile returns       median {:>8.2} ms  (all {})",
        ms(median(&with_add)),
        list(&with_add)
    );
    println!(
        "add    ours, last GARP sent          median {:>8.2} ms  (all {})",
        ms(median(&frames_out)),
        list(&frames_out)
    );
    for file in [files.add, files.replace, files.del] {
        let _ = std::fs::remove_file(file);
    }
}

fn row(what: &str, ours: &[Duration], floor: &[Duration]) {
    let (o, f) = (median(ours), median(floor));
    println!(
        "{what}: median {:>7.2} ms | ip -batch median {:>7.2} ms | ratio {:.2}",
        ms(o),
        ms(f),
        o.as_secs_f64() / f.as_secs_f64()
    );
    println!("    ours     {}", list(ours));
    println!("    ip       {}", list(floor));
}

/// Section 2: the agent's loop over N stable aliases.
fn idle(rt: &Runtime, period: Duration) {
    let n = aliases();
    let desired = desired();
    rt.block_on(async move {
        let mut mgr = manager();
        let r = mgr.reconcile(&desired).await;
        assert_eq!((r.added.len(), r.errors.len()), (n as usize, 0), "{r:?}");
        let mut changes = watch_changes().expect("netlink notifications");
        // Our own adds do not tick (see `watch_changes`); let anything pending drain.
        tokio::time::sleep(Duration::from_millis(200)).await;
        while changes.try_recv().is_ok() {}
        let before = mgr.writes();
        let cpu_before = cpu_ticks("self");
        let mut renew = tokio::time::interval(renew());
        renew.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut resync = tokio::time::interval(RESYNC);
        resync.set_missed_tick_behavior(MissedTickBehavior::Delay);
        resync.reset();
        let end = tokio::time::sleep(period);
        tokio::pin!(end);
        let (mut renewals, mut resyncs, mut ticks) = (0u32, 0u32, 0u32);
        let mut refresh_time = Duration::ZERO;
        let mut reconcile_time = Duration::ZERO;
        let start = Instant::now();
        loop {
            tokio::select! {
                biased;
                () = &mut end => break,
                _ = renew.tick() => {
                    let t = Instant::now();
                    let r = mgr.refresh_lifetimes().await;
                    refresh_time += t.elapsed();
                    assert!(r.errors.is_empty(), "{:?}", r.errors);
                    renewals += 1;
                }
                Some(()) = changes.recv() => {
                    let t = Instant::now();
                    let r = mgr.reconcile(&desired).await;
                    reconcile_time += t.elapsed();
                    assert!(!r.changed(), "an idle reconcile changed something: {r:?}");
                    ticks += 1;
                }
                _ = resync.tick() => {
                    let t = Instant::now();
                    let r = mgr.reconcile(&desired).await;
                    reconcile_time += t.elapsed();
                    assert!(!r.changed(), "an idle resync changed something: {r:?}");
                    resyncs += 1;
                }
            }
        }
        let wall = start.elapsed();
        let cpu = ticks_to_duration(cpu_ticks("self") - cpu_before);
        let w = diff(mgr.writes(), before);
        let still = mgr.backend().snapshot().await.expect("dump");
        let kept = still.addresses.iter().filter(|a| a.owned).count();
        assert_eq!(kept, n as usize, "aliases lapsed during the idle period");
        println!("\n## idle: the agent's loop over {n} stable aliases for {wall:.1?}");
        println!(
            "adds + deletes: {} + {} | refreshes: {} ({renewals} renewals x {n})",
            w.adds, w.deletes, w.refreshes
        );
        println!(
            "reconciles: {resyncs} on resync, {ticks} on netlink ticks ({:.1?} in all)",
            reconcile_time
        );
        println!(
            "refresh time: {:.1?} in all, {:.2} ms per renewal",
            refresh_time,
            ms(refresh_time) / f64::from(renewals.max(1))
        );
        println!(
            "CPU time of this process: {cpu:?} ({:.2} % of one core)",
            100.0 * cpu.as_secs_f64() / wall.as_secs_f64()
        );
        println!(
            "peak RSS of this process (VmHWM): {}",
            status_field("self", "VmHWM")
        );
        assert_eq!(w.adds + w.deletes, 0, "writes during an idle period");
    });
}

fn diff(after: WriteCounts, before: WriteCounts) -> WriteCounts {
    WriteCounts {
        adds: after.adds - before.adds,
        deletes: after.deletes - before.deletes,
        refreshes: after.refreshes - before.refreshes,
    }
}

/// Section 3: the real agent binary holding N aliases through an idle period.
async fn binary(period: Duration) {
    let n = aliases();
    let env = TestEnv::global();
    let client = env.client().await;
    let namespace = env.create_namespace(&client, "bench").await;
    let ns = node("binary");
    let _relay = Relay::start(&ns, env.server_url());
    let name = "node-bench";
    let mut args = AgentArgs::new(name, &namespace);
    args.lease = Box::leak(format!("{}s", lease().as_secs()).into_boxed_str());
    args.renew = Box::leak(format!("{}s", renew().as_secs()).into_boxed_str());
    // The aliases' kernel lifetime is the agent's own (default 3 s, refreshed every second);
    // the bench's lease stands for it, as in the other sections, bounded as the agent bounds
    // it (lease less one renewal): 3 s at the default lease, 90 s at a 120 s lease.
    let lifetime = lease().saturating_sub(renew()).max(Duration::from_secs(1));
    args.extra
        .push(format!("--alias-lifetime={}s", lifetime.as_secs()));
    // As the DaemonSet runs it (manifests/agent.yaml): one glibc malloc arena.
    args.env
        .push(("MALLOC_ARENA_MAX".into(), MALLOC_ARENA_MAX.into()));
    let agent = Agent::start(&ns, &args);
    let pid = agent.pid().to_string();
    let cluster = Cluster::new(&client, &namespace);
    wait_for(Duration::from_secs(30), "the first Lease", async || {
        cluster.report(name).await.is_some()
    })
    .await;
    let idle_rss = status_field(&pid, "VmRSS");
    cluster.create("many").await;
    let vips: Vec<String> = vips().iter().map(Ipv4Addr::to_string).collect();
    let refs: Vec<&str> = vips.iter().map(String::as_str).collect();
    // The Service's status, then the node's assignment object (what the agent acts on).
    let start = Instant::now();
    cluster.assign("many", Some(name), None, &refs).await;
    let written = start.elapsed();
    let want: BTreeSet<&str> = refs.iter().copied().collect();
    let within = Duration::from_secs(30 + u64::from(n) / 200);
    wait_for(within, &format!("{n} aliases"), async || {
        let addrs = ns.addrs("eth1");
        addrs
            .iter()
            .filter(|a| want.contains(a.local.as_str()))
            .count()
            == n as usize
    })
    .await;
    let first_sync = start.elapsed();
    // Let the announcement bursts (5 s) and the Lease report settle before the idle period.
    tokio::time::sleep(Duration::from_secs(7)).await;
    let metric = |m: &str| agent.metric(&ns, m).unwrap_or(f64::NAN);
    let (adds, removes) = (
        metric("aliaslb_agent_address_adds_total"),
        metric("aliaslb_agent_address_removes_total"),
    );
    let shielded = metric("aliaslb_agent_shield_addresses");
    let cpu_before = cpu_ticks(&pid);
    let children_before = child_cpu_ticks(&pid);
    let start = Instant::now();
    tokio::time::sleep(period).await;
    let wall = start.elapsed();
    let cpu = ticks_to_duration(cpu_ticks(&pid) - cpu_before);
    let children = ticks_to_duration(child_cpu_ticks(&pid) - children_before);
    let (adds_after, removes_after) = (
        metric("aliaslb_agent_address_adds_total"),
        metric("aliaslb_agent_address_removes_total"),
    );
    let kept = ns
        .addrs("eth1")
        .iter()
        .filter(|a| want.contains(a.local.as_str()))
        .count();
    assert_eq!(kept, n as usize, "aliases lapsed during the idle period");
    println!(
        "\n## binary: aliaslb-agent (this build's profile), lease {}, renew {}, alias \
         lifetime {lifetime:?}, MALLOC_ARENA_MAX={MALLOC_ARENA_MAX}, shield on",
        args.lease, args.renew
    );
    println!("RSS before any Service (VmRSS): {idle_rss}");
    println!(
        "first sync: Service status + assignment object written in {:.1} ms; {n} aliases in \
         the kernel {:.1} ms after the writes began (ip -j addr polled every 20 ms); shield \
         IPs (its metric): {shielded}",
        ms(written),
        ms(first_sync)
    );
    println!(
        "idle {wall:.1?} holding {n} aliases: CPU {cpu:?} ({:.2} % of one core), its nft \
         children {children:?} ({:.2} %); adds {} -> {adds_after}, removes {} -> \
         {removes_after} (its metrics)",
        100.0 * cpu.as_secs_f64() / wall.as_secs_f64(),
        100.0 * children.as_secs_f64() / wall.as_secs_f64(),
        adds,
        removes
    );
    println!(
        "RSS now (VmRSS): {} | peak RSS (VmHWM): {}",
        status_field(&pid, "VmRSS"),
        status_field(&pid, "VmHWM")
    );
    assert_eq!(
        (adds, removes),
        (adds_after, removes_after),
        "writes during an idle period"
    );
    drop(agent);
}

async fn wait_for(within: Duration, what: &str, mut check: impl AsyncFnMut() -> bool) {
    let end = Instant::now() + within;
    while !check().await {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// User + system CPU time of process `pid` (or `self`), in clock ticks, from
/// `/proc/<pid>/stat` (fields 14 and 15; threads that ended are included).
fn cpu_ticks(pid: &str) -> u64 {
    stat_fields(pid, &[14, 15])
}

/// User + system CPU time of the children `pid` has waited for (fields 16 and 17).
fn child_cpu_ticks(pid: &str) -> u64 {
    stat_fields(pid, &[16, 17])
}

/// The sum of the numeric fields `which` (1-based, as in proc(5)) of `/proc/<pid>/stat`.
fn stat_fields(pid: &str, which: &[usize]) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("reading stat");
    // The command name (field 2) may hold spaces: count from the last ')'.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .expect("stat format")
        .1
        .split_whitespace()
        .collect();
    let field = |n: usize| -> u64 { fields[n - 3].parse().expect("stat field") };
    which.iter().map(|&n| field(n)).sum()
}

fn ticks_to_duration(ticks: u64) -> Duration {
    let out = Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .expect("getconf");
    let hz: u64 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("CLK_TCK");
    Duration::from_nanos(ticks * 1_000_000_000 / hz)
}

/// A field of `/proc/<pid>/status` (e.g. `VmHWM`), as the kernel prints it.
fn status_field(pid: &str, name: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("reading status");
    status
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .map(|v| v.trim().to_string())
        .unwrap_or_else(|| format!("({name} missing)"))
}
