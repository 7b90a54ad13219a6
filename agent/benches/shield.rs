//! The host-port shield's cost against the floor, in one run: installing its table, one
//! membership change at growing table sizes, and what it adds on a Service's path. Prints the
//! figures recorded in BENCHMARKS.md and asserts that each measured step did its work (the
//! elements really in the kernel, the shield really dropping). Needs root and `nft`.
//!
//! ```sh
//! cargo bench -p aliaslb-agent --bench shield              # every section
//! cargo bench -p aliaslb-agent --bench shield -- install   # or: change, path
//! ```
//!
//! - `install`: the whole table with `BENCH_IPS` (default 1,000) IPv4 IPs x 2 ports (`Shield::sync` on a fresh
//!   `Shield`, i.e. `table_script` through the real `NftBackend`), into a namespace without
//!   the table and replacing a full one; against `nft -f <file>` of the same script, and the
//!   spawn floor (`NftBackend::apply` of an empty script). Alternated, `BENCH_REPS` times
//!   (default 10) after one untimed round; median and p95.
//! - `change`: one IP with one port added, then removed (`Shield::sync` of an installed
//!   shield, i.e. `update_script` through `NftBackend::apply`) while the table holds
//!   `BENCH_SIZES` IPs (comma-separated, default `10,100,1000`; 2 ports each), one namespace
//!   per size, sizes interleaved, `BENCH_CHANGES` times (default 30); with the spawn floor
//!   beside it. Per size also what one change writes: the script's bytes, and (once, with
//!   `strace` when it is installed) the netlink bytes `nft` sends and receives for it, which
//!   tell whether nft reads the set it changes.
//! - `path`: TCP connections (connect, 1 request byte, 1 reply byte, close) from a client
//!   namespace to an LB IP held as a /32 alias in a server namespace, DNATed to a listener on
//!   the server's own IP:8080 (a stand-in for kube-proxy); without the shield table, and with
//!   it holding the LB IP + port 80 and 1,000 other IPs; `BENCH_CONNS` (default 5,000)
//!   sequential connections per run, `BENCH_ROUNDS` (default 6) rounds of each, a/b order
//!   alternating.
//!
//! Does I/O: creates network namespaces and a veth pair, runs `nft`, opens TCP connections
//! between the namespaces. Each section runs on a thread of its own that `setns`es into the
//! namespace it works on (the `nft` processes it spawns and the sockets it opens inherit it).

mod stats;
#[path = "../tests/support/mod.rs"]
mod support;

use std::io::{Read as _, Write as _};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use aliaslb_agent::shield::nft::NftBackend;
use aliaslb_agent::shield::{
    Contents, OpenPort, Protocol, Shield, ShieldBackend as _, delete_script, table_script,
    update_script,
};
use stats::{env_number, list, median, ms, sections, timed};
use support::{NetNs, require_root};

/// IPs in the table of the `install` and `path` sections: `BENCH_IPS`, default 1,000.
fn big() -> u32 {
    let n = env_number("BENCH_IPS", 1_000);
    assert!(n <= 500_000, "BENCH_IPS={n}: at most 500,000");
    n as u32
}
/// The ports every held IP opens (the change adds one IP with the first only).
const PORTS: [u16; 2] = [80, 443];
/// Table sizes of the `change` section: `BENCH_SIZES`, default 10, 100 and 1,000.
fn sizes() -> Vec<u32> {
    let Ok(v) = std::env::var("BENCH_SIZES") else {
        return vec![10, 100, 1_000];
    };
    let sizes: Vec<u32> = v
        .split(',')
        .map(|s| {
            s.trim()
                .parse()
                .unwrap_or_else(|_| panic!("BENCH_SIZES={v:?}: whole numbers, comma-separated"))
        })
        .collect();
    assert!(
        !sizes.is_empty() && sizes.iter().all(|&n| n <= 500_000),
        "BENCH_SIZES={v:?}: 1 to 500,000 each"
    );
    sizes
}
/// The `path` section's LB IP, Service port, and the server's own address and port.
const LB_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 55, 10);
const SERVER_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const SERVICE_PORT: u16 = 80;
const BACKEND_PORT: u16 = 8080;
/// Bound on one run of connections, and on one connection.
const RUN_BOUND: Duration = Duration::from_secs(30);
const CONN_TIMEOUT: Duration = Duration::from_secs(2);

fn main() {
    if !require_root() {
        return;
    }
    let run = sections();
    let reps = env_number("BENCH_REPS", 10);
    let changes = env_number("BENCH_CHANGES", 30);
    let rounds = env_number("BENCH_ROUNDS", 6);
    let conns = env_number("BENCH_CONNS", 5_000);
    println!(
        "aliaslb-agent shield bench: {} | kernel {} | {} build",
        command_line("nft", &["--version"]),
        command_line("uname", &["-r"]),
        if cfg!(debug_assertions) {
            "debug"
        } else {
            "optimised"
        }
    );
    if run("install") {
        on_thread(move || install(reps));
    }
    if run("change") {
        on_thread(move || change(changes));
    }
    if run("path") {
        on_thread(move || path(rounds, conns));
    }
}

/// Runs `f` on a fresh thread (which may `setns` freely) and waits for it.
fn on_thread(f: impl FnOnce() + Send + 'static) {
    std::thread::spawn(f).join().expect("bench thread panicked");
}

/// A current-thread runtime on the calling thread: `NftBackend` spawns `nft` from it.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn tcp(port: u16) -> OpenPort {
    OpenPort {
        protocol: Protocol::Tcp,
        port,
    }
}

/// `n` IPs from 10.0.100.0 up, each opening `PORTS`.
fn held(n: u32) -> Contents {
    let base = u32::from(Ipv4Addr::new(10, 0, 100, 0));
    let mut c = Contents::new();
    for i in 0..n {
        c.open(IpAddr::V4(Ipv4Addr::from(base + i)), PORTS.map(tcp));
    }
    c
}

/// The number of elements of `set` in our table, from `nft -j list set` in the calling
/// thread's namespace.
fn set_len(set: &str) -> usize {
    let out = support::run_cmd("nft", &["-j", "list", "set", "inet", "aliaslb", set]);
    let v: serde_json::Value = serde_json::from_str(&out).expect("nft -j output is JSON");
    v["nftables"]
        .as_array()
        .into_iter()
        .flatten()
        .find_map(|item| item.get("set"))
        .and_then(|s| s["elem"].as_array().map(Vec::len))
        .unwrap_or(0)
}

/// Whether our table exists in the calling thread's namespace.
fn table_exists() -> bool {
    Command::new("nft")
        .args(["list", "table", "inet", "aliaslb"])
        .output()
        .expect("running nft")
        .status
        .success()
}

/// Asserts that the table holds `ips` IPs and `ports` port elements.
fn assert_holds(ips: usize, ports: usize) {
    assert_eq!(
        (set_len("held4"), set_len("ports4")),
        (ips, ports),
        "the table does not hold what was written"
    );
}

/// `nft -f <file>` in the calling thread's namespace, timed with its process start (what
/// the floor costs an operator).
fn nft_file(file: &std::path::Path) -> Duration {
    let start = Instant::now();
    let out = Command::new("nft")
        .arg("-f")
        .arg(file)
        .output()
        .expect("running nft");
    let took = start.elapsed();
    assert!(
        out.status.success(),
        "nft -f failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    took
}

/// Section 1: the whole table, ours vs `nft -f <file>` vs the spawn floor.
fn install(reps: u64) {
    let n = big();
    let ns = NetNs::new("shinst");
    ns.enter();
    let rt = runtime();
    let contents = held(n);
    let (ips, ports) = (n as usize, n as usize * PORTS.len());
    let script = table_script(&contents, false);
    let file = std::env::temp_dir().join(format!("alb-shield-{}.nft", std::process::id()));
    std::fs::write(&file, &script).expect("writing the nft file");
    let backend = NftBackend::default();
    let delete = delete_script();
    let (mut ours_new, mut ours_replace, mut file_new, mut file_replace, mut spawn) =
        (vec![], vec![], vec![], vec![], vec![]);
    // One untimed round warms the kernel's and nft's caches; the order of the three sides
    // rotates.
    for rep in 0..=reps {
        for side in 0..3 {
            match (side + rep) % 3 {
                0 => {
                    rt.block_on(backend.apply(&delete)).expect("delete table");
                    assert!(!table_exists());
                    let mut shield = Shield::new(NftBackend::default());
                    let (new, r) = timed(&rt, shield.sync(contents.clone()));
                    assert!(r.expect("table install"), "the install wrote nothing");
                    assert_holds(ips, ports);
                    let mut shield = Shield::new(NftBackend::default());
                    let (replace, r) = timed(&rt, shield.sync(contents.clone()));
                    assert!(r.expect("table replace"), "the replace wrote nothing");
                    assert_holds(ips, ports);
                    if rep > 0 {
                        ours_new.push(new);
                        ours_replace.push(replace);
                    }
                }
                1 => {
                    rt.block_on(backend.apply(&delete)).expect("delete table");
                    assert!(!table_exists());
                    let new = nft_file(&file);
                    assert_holds(ips, ports);
                    let replace = nft_file(&file);
                    assert_holds(ips, ports);
                    if rep > 0 {
                        file_new.push(new);
                        file_replace.push(replace);
                    }
                }
                _ => {
                    let (floor, r) = timed(&rt, backend.apply(""));
                    r.expect("empty nft script");
                    if rep > 0 {
                        spawn.push(floor);
                    }
                }
            }
        }
    }
    let _ = std::fs::remove_file(&file);
    println!(
        "\n## install: the whole table, {n} IPv4 IPs x {} ports ({} elements, {} bytes of \
         script), {reps} repetitions",
        PORTS.len(),
        ips + ports,
        script.len()
    );
    println!("{:<58} {:>9} {:>9}", "", "median", "p95");
    stat_row(
        "Shield::sync, fresh Shield (nft -f -), no table before",
        &ours_new,
    );
    stat_row(
        "nft -f <file> of the same script, no table before",
        &file_new,
    );
    stat_row(
        "Shield::sync, fresh Shield, replacing the full table",
        &ours_replace,
    );
    stat_row("nft -f <file>, replacing the full table", &file_replace);
    stat_row("floor: NftBackend::apply(\"\") (spawn nft -f -)", &spawn);
    println!(
        "ratio ours / nft -f <file> (medians): no table {:.2}, replacing {:.2}",
        ratio(&ours_new, &file_new),
        ratio(&ours_replace, &file_replace)
    );
    println!("    ours, no table   {}", list(&ours_new));
    println!("    file, no table   {}", list(&file_new));
    println!("    ours, replacing  {}", list(&ours_replace));
    println!("    file, replacing  {}", list(&file_replace));
    println!("    spawn floor      {}", list(&spawn));
}

/// Section 2: one membership change at each table size.
fn change(changes: u64) {
    let sizes = sizes();
    let rt = runtime();
    let add_base = u32::from(Ipv4Addr::new(10, 9, 0, 0));
    let spaces: Vec<NetNs> = sizes
        .iter()
        .map(|n| NetNs::new(&format!("shch{n}")))
        .collect();
    let bases: Vec<Contents> = sizes.iter().map(|&n| held(n)).collect();
    let mut shields: Vec<Shield<NftBackend>> = spaces
        .iter()
        .zip(&bases)
        .map(|(ns, base)| {
            ns.enter();
            let mut shield = Shield::new(NftBackend::default());
            assert!(rt.block_on(shield.sync(base.clone())).expect("install"));
            shield
        })
        .collect();
    let k = sizes.len();
    let (mut adds, mut removes, mut scripts) = (vec![vec![]; k], vec![vec![]; k], vec![vec![]; k]);
    let mut spawn = vec![];
    let backend = NftBackend::default();
    // Change 0 is an untimed warm-up; the order of the sizes rotates.
    for c in 0..=changes {
        for j in 0..k {
            let i = (j + c as usize) % k;
            let held_ips = sizes[i] as usize;
            let (ips, ports) = (held_ips, held_ips * PORTS.len());
            spaces[i].enter();
            let ip = IpAddr::V4(Ipv4Addr::from(add_base + c as u32));
            let mut target = bases[i].clone();
            target.open(ip, [tcp(PORTS[0])]);
            // What `sync` computes before it spawns nft, timed alone.
            let start = Instant::now();
            let script = std::hint::black_box(update_script(&bases[i], &target));
            let script_time = start.elapsed();
            assert_eq!(script.lines().count(), 2, "{script}");
            let (add, r) = timed(&rt, shields[i].sync(target));
            assert!(r.expect("add one IP"), "the add wrote nothing");
            assert_holds(ips + 1, ports + 1);
            let base = bases[i].clone();
            let (remove, r) = timed(&rt, shields[i].sync(base));
            assert!(r.expect("remove one IP"), "the remove wrote nothing");
            assert_holds(ips, ports);
            if c > 0 {
                adds[i].push(add);
                removes[i].push(remove);
                scripts[i].push(script_time);
            }
        }
        let (floor, r) = timed(&rt, backend.apply(""));
        r.expect("empty nft script");
        if c > 0 {
            spawn.push(floor);
        }
    }
    println!(
        "\n## change: one IP with one port added, then removed (Shield::sync -> update_script \
         -> NftBackend::apply), {changes} changes per size, {} ports per held IP",
        PORTS.len()
    );
    println!(
        "{:<10} {:>12} {:>9} {:>14} {:>9} {:>22}",
        "IPs held", "add median", "add p95", "remove median", "rem. p95", "update_script median"
    );
    for i in 0..k {
        println!(
            "{:<10} {:>9.2} ms {:>6.2} ms {:>11.2} ms {:>6.2} ms {:>19.1} us",
            sizes[i],
            ms(median(&adds[i])),
            ms(pct(&adds[i], 0.95)),
            ms(median(&removes[i])),
            ms(pct(&removes[i], 0.95)),
            median(&scripts[i]).as_secs_f64() * 1e6
        );
    }
    println!(
        "floor: NftBackend::apply(\"\") (spawn nft -f -): median {:.2} ms, p95 {:.2} ms",
        ms(median(&spawn)),
        ms(pct(&spawn, 0.95))
    );
    let last = k - 1;
    println!(
        "ratio {} / {} IPs (medians): add {:.2}, remove {:.2}",
        sizes[last],
        sizes[0],
        ratio(&adds[last], &adds[0]),
        ratio(&removes[last], &removes[0])
    );
    // What one change writes, against what rewriting the table would: the scripts' bytes,
    // and the netlink traffic of one `nft -f` of each (once per size, after the timed runs).
    println!(
        "what one change writes (script bytes; netlink bytes nft sends / receives, from \
         strace, one run each):"
    );
    let empty = nft_netlink_bytes("");
    for i in 0..k {
        spaces[i].enter();
        let mut target = bases[i].clone();
        target.open(IpAddr::V4(Ipv4Addr::from(add_base)), [tcp(PORTS[0])]);
        let (add, remove) = (
            update_script(&bases[i], &target),
            update_script(&target, &bases[i]),
        );
        let whole = table_script(&bases[i], false);
        let (add_io, remove_io) = (nft_netlink_bytes(&add), nft_netlink_bytes(&remove));
        assert_holds(sizes[i] as usize, sizes[i] as usize * PORTS.len());
        println!(
            "{:<10} add: {} B script, netlink {} | remove: {} B script, netlink {} | whole \
             table script: {} B",
            sizes[i],
            add.len(),
            io(add_io),
            remove.len(),
            io(remove_io),
            whole.len()
        );
    }
    println!("floor: empty script, netlink {}", io(empty));
    for i in 0..k {
        println!("    add    {:>5}  {}", sizes[i], list(&adds[i]));
        println!("    remove {:>5}  {}", sizes[i], list(&removes[i]));
    }
    println!("    spawn         {}", list(&spawn));
}

/// Netlink traffic of one `nft -f` run of `script` in the calling thread's namespace, from
/// `strace -f -e trace=sendto,sendmsg,recvfrom,recvmsg` (nft speaks to the kernel over
/// netlink only):
/// bytes sent, bytes received, messages received. `None` without `strace`.
fn nft_netlink_bytes(script: &str) -> Option<(u64, u64, u64)> {
    let dir = std::env::temp_dir();
    let tag = format!("{}-{:?}", std::process::id(), std::thread::current().id());
    let (file, trace) = (
        dir.join(format!("alb-shield-strace-{tag}.nft")),
        dir.join(format!("alb-shield-strace-{tag}.log")),
    );
    std::fs::write(&file, script).expect("writing the nft file");
    let out = Command::new("strace")
        .args([
            "-f",
            "-qq",
            "-e",
            "trace=sendto,sendmsg,recvfrom,recvmsg",
            "-o",
        ])
        .arg(&trace)
        .args(["nft", "-f"])
        .arg(&file)
        .output();
    let _ = std::fs::remove_file(&file);
    let out = out.ok()?;
    assert!(
        out.status.success(),
        "strace nft -f failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let log = std::fs::read_to_string(&trace).expect("reading the strace log");
    let _ = std::fs::remove_file(&trace);
    let (mut sent, mut received, mut reads) = (0, 0, 0);
    for line in log.lines() {
        // `sendmsg(3, {...}, 0) = 1234`, `recvfrom(3, ...) = 8192`
        let Some(bytes) = line
            .rsplit_once(" = ")
            .and_then(|(_, r)| r.split_whitespace().next()?.parse::<u64>().ok())
        else {
            continue;
        };
        if line.contains("sendmsg(") || line.contains("sendto(") {
            sent += bytes;
        } else if line.contains("recvmsg(") || line.contains("recvfrom(") {
            received += bytes;
            reads += 1;
        }
    }
    Some((sent, received, reads))
}

/// `nft_netlink_bytes` for a table.
fn io(bytes: Option<(u64, u64, u64)>) -> String {
    match bytes {
        Some((sent, received, reads)) => {
            format!("{sent} B sent / {received} B received in {reads} reads")
        }
        None => "(no strace)".to_string(),
    }
}

/// One run of sequential connections: each connection's wall time, and the run's.
struct Run {
    lat: Vec<Duration>,
    wall: Duration,
}

impl Run {
    fn rate(&self) -> f64 {
        self.lat.len() as f64 / self.wall.as_secs_f64()
    }
}

/// Connect, 1 request byte, 1 reply byte, then the server's close (read to EOF), close.
fn one_connection(to: SocketAddr, timeout: Duration) -> std::io::Result<()> {
    let mut s = TcpStream::connect_timeout(&to, timeout)?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(timeout))?;
    s.write_all(b"x")?;
    let mut buf = [0u8; 1];
    s.read_exact(&mut buf)?;
    if buf != *b"x" {
        return Err(std::io::Error::other("wrong reply byte"));
    }
    // The server closes first: its FIN ends the exchange, so the TIME_WAITs are its own
    // and the client never runs out of ports.
    if s.read(&mut buf)? != 0 {
        return Err(std::io::Error::other("more than one reply byte"));
    }
    Ok(())
}

/// `n` sequential connections to `to` from the calling thread's namespace, bounded by
/// `RUN_BOUND`.
fn connections(to: SocketAddr, n: u64) -> Run {
    let mut lat = Vec::with_capacity(n as usize);
    let start = Instant::now();
    for i in 0..n {
        let t = Instant::now();
        one_connection(to, CONN_TIMEOUT)
            .unwrap_or_else(|e| panic!("connection {i} to {to} failed: {e}"));
        lat.push(t.elapsed());
        if start.elapsed() > RUN_BOUND {
            break;
        }
    }
    Run {
        wall: start.elapsed(),
        lat,
    }
}

/// The listener on the server's 0.0.0.0:8080 (on every local address, LB IP included, as
/// host listeners are): read 1 byte, write it back, close. Runs until `stop` is set and a
/// connection wakes it.
fn serve(listener: TcpListener, stop: Arc<AtomicBool>) {
    for stream in listener.incoming() {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let Ok(mut s) = stream else { continue };
        let _ = s.set_nodelay(true);
        let _ = s.set_read_timeout(Some(CONN_TIMEOUT));
        let mut buf = [0u8; 1];
        if s.read_exact(&mut buf).is_ok() {
            let _ = s.write_all(&buf);
        }
    }
}

/// Section 3: the Service path without and with the shield.
fn path(rounds: u64, conns: u64) {
    let n = big();
    let client = NetNs::new("shcli");
    let server = NetNs::new("shsrv");
    client.veth("cli0", Some(&server), "srv0");
    client.ip(&["addr", "add", &format!("{CLIENT_IP}/24"), "dev", "cli0"]);
    server.ip(&["addr", "add", &format!("{SERVER_IP}/24"), "dev", "srv0"]);
    // The LB IP as the agent holds it: a /32 alias on the node's link.
    server.ip(&["addr", "add", &format!("{LB_IP}/32"), "dev", "srv0"]);
    client.ip(&[
        "route",
        "add",
        &format!("{LB_IP}/32"),
        "via",
        &SERVER_IP.to_string(),
    ]);
    client.sysctl("net.ipv4.ip_local_port_range", "1024 65535");
    let rt = runtime();
    server.enter();
    // kube-proxy's stand-in: LB IP:80 -> the node's own IP:8080, at dstnat (after the
    // shield's prerouting chain at mangle, as with the real kube-proxy).
    let kube_proxy = format!(
        "table ip aliaslb-bench-kube-proxy {{\n\
         \tchain prerouting {{\n\
         \t\ttype nat hook prerouting priority dstnat; policy accept;\n\
         \t\tip daddr {LB_IP} tcp dport {SERVICE_PORT} dnat to {SERVER_IP}:{BACKEND_PORT}\n\
         \t}}\n}}\n"
    );
    rt.block_on(NftBackend::default().apply(&kube_proxy))
        .expect("the DNAT rule");
    let listener = TcpListener::bind(("0.0.0.0", BACKEND_PORT)).expect("listen on 8080");
    let stop = Arc::new(AtomicBool::new(false));
    let server_thread = {
        let stop = stop.clone();
        std::thread::spawn(move || serve(listener, stop))
    };
    let mut contents = held(n);
    contents.open(IpAddr::V4(LB_IP), [tcp(SERVICE_PORT)]);
    let mut shield = Shield::new(NftBackend::default());
    let service = SocketAddr::from((LB_IP, SERVICE_PORT));
    let host_port = SocketAddr::from((LB_IP, BACKEND_PORT));
    let set_shield =
        |shield: &mut Shield<_>, on| switch(&rt, shield, &contents, &server, &client, on);
    let dropped = |shield: &Shield<NftBackend>| {
        server.enter();
        let d = rt
            .block_on(shield.dropped())
            .expect("the shield's counters");
        client.enter();
        d
    };

    // The setup does what it should: without the shield the host port answers on the LB IP;
    // with it, the Service port still does and the host port is dropped silently (counted).
    set_shield(&mut shield, false);
    one_connection(service, CONN_TIMEOUT).expect("the Service port, no shield");
    one_connection(host_port, CONN_TIMEOUT).expect("the host port on the LB IP, no shield");
    set_shield(&mut shield, true);
    one_connection(service, CONN_TIMEOUT).expect("the Service port, shield on");
    let refused = one_connection(host_port, Duration::from_millis(300))
        .expect_err("the shield let the host port through");
    assert_eq!(refused.kind(), std::io::ErrorKind::TimedOut, "{refused}");
    let probe = dropped(&shield);
    assert!(probe.v4 > 0, "the shield counted no drop: {probe:?}");

    // One untimed short run of each, then the rounds: a b, b a, a b, ...
    for on in [false, true] {
        set_shield(&mut shield, on);
        let _ = connections(service, conns.min(1_000));
    }
    let (mut without, mut with) = (vec![], vec![]);
    for round in 0..rounds {
        let order = if round % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for on in order {
            set_shield(&mut shield, on);
            let run = connections(service, conns);
            if on {
                // Installed afresh for this run: the counters count this run only.
                let d = dropped(&shield);
                assert_eq!((d.v4, d.v6), (0, 0), "the shield dropped Service traffic");
                with.push(run);
            } else {
                without.push(run);
            }
        }
    }
    set_shield(&mut shield, false);

    println!(
        "\n## path: TCP to {LB_IP}:{SERVICE_PORT} (a /32 alias), DNAT to \
         {SERVER_IP}:{BACKEND_PORT}, client and server namespaces over veth; {conns} \
         sequential connections per run (connect, 1 byte, 1 byte, close), {rounds} rounds, \
         a/b alternating"
    );
    println!(
        "(b) = shield table holding {LB_IP} . tcp . {SERVICE_PORT} and {n} other IPs x {} ports",
        PORTS.len()
    );
    println!(
        "{:<8} {:>16} {:>9} {:>9} | {:>16} {:>9} {:>9}",
        "round", "(a) no shield/s", "p50 ms", "p99 ms", "(b) shield/s", "p50 ms", "p99 ms"
    );
    for (r, (a, b)) in without.iter().zip(&with).enumerate() {
        println!(
            "{:<8} {:>16.0} {:>9.3} {:>9.3} | {:>16.0} {:>9.3} {:>9.3}",
            r + 1,
            a.rate(),
            ms(median(&a.lat)),
            ms(pct(&a.lat, 0.99)),
            b.rate(),
            ms(median(&b.lat)),
            ms(pct(&b.lat, 0.99))
        );
    }
    let rate = |runs: &[Run]| {
        let n: usize = runs.iter().map(|r| r.lat.len()).sum();
        let wall: Duration = runs.iter().map(|r| r.wall).sum();
        n as f64 / wall.as_secs_f64()
    };
    let pooled = |runs: &[Run]| -> Vec<Duration> {
        runs.iter().flat_map(|r| r.lat.iter().copied()).collect()
    };
    let (pa, pb) = (pooled(&without), pooled(&with));
    let (ra, rb) = (rate(&without), rate(&with));
    println!(
        "{:<8} {:>16.0} {:>9.3} {:>9.3} | {:>16.0} {:>9.3} {:>9.3}",
        "all",
        ra,
        ms(median(&pa)),
        ms(pct(&pa, 0.99)),
        rb,
        ms(median(&pb)),
        ms(pct(&pb, 0.99))
    );
    println!(
        "checks: host port {BACKEND_PORT} on the LB IP answers without the shield, is dropped \
         with it ({} packets counted); no drop during the (b) runs",
        probe.v4
    );
    println!(
        "(\"all\": every connection of every round; rate = connections / wall time of the runs)"
    );
    println!(
        "(b) vs (a): connections/s {:+.1} %, p50 {:+.1} %, p99 {:+.1} %",
        100.0 * (rb / ra - 1.0),
        100.0 * (ratio(&pb, &pa) - 1.0),
        100.0 * (pct(&pb, 0.99).as_secs_f64() / pct(&pa, 0.99).as_secs_f64() - 1.0)
    );

    stop.store(true, Ordering::Relaxed);
    let _ = one_connection(
        SocketAddr::from((SERVER_IP, BACKEND_PORT)),
        Duration::from_millis(300),
    );
    server_thread.join().expect("server thread");
}

/// Switches the shield on (a fresh table, so fresh counters: `Shield::remove`, then
/// `Shield::sync`) or off (`Shield::remove`) in the server namespace, asserts the kernel
/// agrees, and comes back to the client namespace.
fn switch(
    rt: &tokio::runtime::Runtime,
    shield: &mut Shield<NftBackend>,
    contents: &Contents,
    server: &NetNs,
    client: &NetNs,
    on: bool,
) {
    server.enter();
    rt.block_on(shield.remove()).expect("shield removal");
    if on {
        assert!(
            rt.block_on(shield.sync(contents.clone()))
                .expect("shield install")
        );
        assert_holds(contents.len(), contents.iter().map(|(_, p)| p.len()).sum());
    } else {
        assert!(!table_exists());
    }
    client.enter();
}

/// The first line of `cmd args` (for the header).
fn command_line(cmd: &str, args: &[&str]) -> String {
    support::run_cmd(cmd, args)
        .lines()
        .next()
        .unwrap_or_default()
        .to_string()
}

fn stat_row(what: &str, xs: &[Duration]) {
    println!(
        "{what:<58} {:>6.2} ms {:>6.2} ms",
        ms(median(xs)),
        ms(pct(xs, 0.95))
    );
}

/// The nearest-rank percentile `p` (0 < p <= 1).
fn pct(xs: &[Duration], p: f64) -> Duration {
    assert!(!xs.is_empty(), "no samples");
    let mut v = xs.to_vec();
    v.sort();
    let rank = (p * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

/// The ratio of the medians.
fn ratio(a: &[Duration], b: &[Duration]) -> f64 {
    median(a).as_secs_f64() / median(b).as_secs_f64()
}
