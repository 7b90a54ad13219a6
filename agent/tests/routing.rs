//! `routing::read` against the real daemons: BIRD 2 and FRR under test in a namespace
//! `rtr-a…` ("the node"), a BIRD peer in `rtr-b…` ("the ToR"), joined by a veth. The
//! daemons run the configs in `tests/data/routing/` (the ones the module docs show),
//! each with its own run directory; everything is killed and deleted on drop, on
//! failure too. Needs root and the `bird` / FRR binaries: skipped (printed) without
//! them, unless `CI=true`. The timeout and unreachable cases need neither.

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use aliaslb_agent::l3::routing::{
    self, DaemonSpec, DaemonView, RoutingError, RoutingStatus, RoutingView,
};

const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/routing");
const BIRD: &str = "/usr/sbin/bird";
const FRR_DIR: &str = "/usr/lib/frr";
const VTYSH: &str = "/usr/bin/vtysh";
/// Per reading, as the agent would use.
const READ_TIMEOUT: Duration = Duration::from_secs(3);
/// The bound for each awaited change.
const BOUND: Duration = Duration::from_secs(20);

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// Whether the daemon tests can run here; prints why not (panics under `CI=true`).
fn can_run(binaries: &[&str]) -> bool {
    let why = if !nix::unistd::geteuid().is_root() {
        Some("routing daemon tests need root (network namespaces)".to_string())
    } else {
        binaries
            .iter()
            .find(|b| !Path::new(b).exists())
            .map(|b| format!("routing daemon tests need {b} (apt-get install bird2 frr)"))
    };
    match why {
        None => true,
        Some(why) if std::env::var("CI").as_deref() == Ok("true") => {
            panic!("{why}, and CI=true: refusing to skip")
        }
        Some(why) => {
            eprintln!("SKIPPED: {why}");
            false
        }
    }
}

fn run(program: &str, args: &[&str]) {
    let out = Command::new(program).args(args).output().expect(program);
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A network namespace, deleted on drop.
struct Ns(String);

impl Ns {
    fn new(tag: &str) -> Ns {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let ns = Ns(format!("rtr-{tag}-{}-{n}", std::process::id()));
        run("ip", &["netns", "add", &ns.0]);
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    fn ip(&self, args: &[&str]) {
        let mut full = vec!["-n", self.0.as_str()];
        full.extend_from_slice(args);
        run("ip", &full);
    }
}

impl Drop for Ns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// A daemon running in the foreground inside a namespace, killed on drop.
struct Daemon {
    name: String,
    child: Option<Child>,
    log: PathBuf,
}

impl Daemon {
    fn spawn(ns: &Ns, dir: &Path, name: &str, program: &str, args: &[&str]) -> Daemon {
        let log = dir.join(format!("{name}.out"));
        let file = std::fs::File::create(&log).expect("log file");
        let child = Command::new("ip")
            .args(["netns", "exec", &ns.0, program])
            .args(args)
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("log file"))
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {program}: {e}"));
        Daemon {
            name: name.to_string(),
            child: Some(child),
            log,
        }
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            if let Ok(Some(status)) = child.try_wait() {
                let log = std::fs::read_to_string(&self.log).unwrap_or_default();
                panic!(
                    "{} had exited ({status}) before the test stopped it:\n{log}",
                    self.name
                );
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Two namespaces joined by a veth `eth0` (10.0.9.1/30, fd00:9::1/64 on the node side)
/// and a run directory. Field order: daemons (in the tests) drop before these.
struct Lab {
    node: Ns,
    tor: Ns,
    dir: tempfile::TempDir,
}

impl Lab {
    fn new() -> Lab {
        let node = Ns::new("a");
        let tor = Ns::new("b");
        node.ip(&[
            "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", &tor.0,
        ]);
        for (ns, v4, v6) in [
            (&node, "10.0.9.1/30", "fd00:9::1/64"),
            (&tor, "10.0.9.2/30", "fd00:9::2/64"),
        ] {
            ns.ip(&["link", "set", "eth0", "up"]);
            ns.ip(&["addr", "add", v4, "dev", "eth0"]);
            ns.ip(&["addr", "add", v6, "dev", "eth0", "nodad"]);
        }
        let dir = tempfile::tempdir().expect("tempdir");
        Lab { node, tor, dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn start_peer(&self) -> Daemon {
        let conf = format!("{DATA}/bird-peer.conf");
        let sock = self.path("peer.ctl");
        let pid = self.path("peer.pid");
        Daemon::spawn(
            &self.tor,
            self.dir.path(),
            "bird-peer",
            BIRD,
            &["-f", "-c", &conf, "-s", s(&sock), "-P", s(&pid)],
        )
    }
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

fn ips(list: &[&str]) -> BTreeSet<IpAddr> {
    list.iter().map(|s| s.parse().unwrap()).collect()
}

/// Reads until `done` holds (or fails [`BOUND`] after `start`); the status and the
/// time since `start` (the change the test made).
async fn until(
    spec: &DaemonSpec,
    what: &str,
    start: Instant,
    done: impl Fn(&Result<RoutingStatus, RoutingError>) -> bool,
) -> (Result<RoutingStatus, RoutingError>, Duration) {
    loop {
        let got = routing::read(spec, READ_TIMEOUT)
            .await
            .map(|s| s.expect("a daemon is configured"));
        if done(&got) {
            return (got, start.elapsed());
        }
        assert!(
            start.elapsed() < BOUND,
            "{what}: not within {BOUND:?}, last reading {got:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The scenario both daemons go through. `node` holds the daemon(s) under test.
async fn scenario(lab: &Lab, spec: &DaemonSpec, mut node: Vec<Daemon>) {
    let daemon = spec.daemon();
    // The daemon is starting; no peer yet.
    let (first, t) = until(spec, "first reading", Instant::now(), |r| r.is_ok()).await;
    let first = first.unwrap();
    println!("{daemon}: first reading after {t:?}: {first:?}");
    assert_eq!(first.daemon, daemon);
    assert_eq!(first.sessions, 1);
    assert_eq!(first.established, 0);
    assert!(first.exported.is_empty());

    let started = Instant::now();
    let mut peer = lab.start_peer();
    let (up, t) = until(spec, "session up", started, |r| {
        r.as_ref().is_ok_and(|s| s.established == 1)
    })
    .await;
    println!(
        "{daemon}: session Established after {t:?}: {:?}",
        up.unwrap()
    );

    // Outside the filter first, then inside: once the inside ones are seen, the outside
    // one has been through the same export path.
    lab.node.ip(&["addr", "add", "10.201.0.1/32", "dev", "lo"]);
    let added = Instant::now();
    lab.node.ip(&["addr", "add", "10.200.0.7/32", "dev", "lo"]);
    lab.node
        .ip(&["addr", "add", "fd00:200::7/128", "dev", "lo"]);
    let want = ips(&["10.200.0.7", "fd00:200::7"]);
    let (got, t) = until(spec, "VIPs exported", added, |r| {
        r.as_ref().is_ok_and(|s| want.is_subset(&s.exported))
    })
    .await;
    println!("{daemon}: address added -> read() says exported: {t:?}");
    let got = got.unwrap();
    assert!(got.is_exported("10.200.0.7".parse().unwrap()));
    assert_eq!(got.exported, want, "only the pool's host routes");
    assert!(!got.exported.contains(&"10.201.0.1".parse().unwrap()));

    let removed = Instant::now();
    lab.node.ip(&["addr", "del", "10.200.0.7/32", "dev", "lo"]);
    let (got, t) = until(spec, "VIP withdrawn", removed, |r| {
        r.as_ref()
            .is_ok_and(|s| !s.exported.contains(&"10.200.0.7".parse().unwrap()))
    })
    .await;
    println!("{daemon}: address removed -> read() says not exported: {t:?}");
    assert_eq!(got.unwrap().exported, ips(&["fd00:200::7"]));

    let stopped = Instant::now();
    peer.stop();
    let (got, t) = until(spec, "session down", stopped, |r| {
        r.as_ref()
            .is_ok_and(|s| s.established == 0 && s.exported.is_empty())
    })
    .await;
    println!("{daemon}: peer stopped -> established 0, nothing exported: {t:?}");
    assert_eq!(got.unwrap().sessions, 1);

    for d in &mut node {
        d.stop();
    }
    let (got, _) = until(spec, "daemon gone", Instant::now(), |r| r.is_err()).await;
    let err = got.unwrap_err();
    println!("{daemon}: daemon stopped -> {err}");
    assert!(
        matches!(err, RoutingError::Unreachable { .. }),
        "not Unreachable: {err:?}"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn bird_under_test() {
    if !can_run(&[BIRD]) {
        return;
    }
    let lab = Lab::new();
    let sock = lab.path("node.ctl");
    let pid = lab.path("node.pid");
    let conf = format!("{DATA}/bird-node.conf");
    let node = Daemon::spawn(
        &lab.node,
        lab.dir.path(),
        "bird-node",
        BIRD,
        &["-f", "-c", &conf, "-s", s(&sock), "-P", s(&pid)],
    );
    let spec = DaemonSpec::Bird { socket: sock };
    scenario(&lab, &spec, vec![node]).await;
}

#[tokio::test(flavor = "current_thread")]
async fn frr_under_test() {
    let zebra = format!("{FRR_DIR}/zebra");
    let bgpd = format!("{FRR_DIR}/bgpd");
    let bfdd = format!("{FRR_DIR}/bfdd");
    if !can_run(&[BIRD, &zebra, &bgpd, &bfdd, VTYSH]) {
        return;
    }
    let lab = Lab::new();
    let dir = lab.dir.path();
    // The daemons drop to user frr: it must own its run directory and read the config.
    let conf = lab.path("frr.conf");
    std::fs::copy(format!("{DATA}/frr-node.conf"), &conf).expect("copy frr.conf");
    run("chown", &["-R", "frr:frr", s(dir)]);
    let zserv = lab.path("zserv.api");
    let common = |name: &str| -> Vec<String> {
        [
            "-f",
            s(&conf),
            "-i",
            s(&lab.path(&format!("{name}.pid"))),
            "-z",
            s(&zserv),
            "--vty_socket",
            s(dir),
            "-u",
            "frr",
            "-g",
            "frr",
            "-P",
            "0",
            "--log",
            &format!("file:{}", s(&lab.path(&format!("{name}.log")))),
        ]
        .map(String::from)
        .to_vec()
    };
    let spawn = |name: &str, program: &str, extra: &[String]| {
        let mut args = common(name);
        args.extend_from_slice(extra);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        Daemon::spawn(&lab.node, dir, name, program, &args)
    };
    let z = spawn("zebra", &zebra, &[]);
    // bgpd and bfdd connect to zebra's socket; give it a moment to appear.
    let start = Instant::now();
    while !zserv.exists() && start.elapsed() < BOUND {
        std::thread::sleep(Duration::from_millis(20));
    }
    let ctl = lab.path("bfdd.sock");
    let f = spawn("bfdd", &bfdd, &["--bfdctl".into(), s(&ctl).into()]);
    let b = spawn("bgpd", &bgpd, &[]);
    let spec = DaemonSpec::Frr {
        vtysh: VTYSH.into(),
        vty_socket: Some(dir.to_path_buf()),
    };
    // bgpd first: once it is gone vtysh cannot answer `show bgp`.
    scenario(&lab, &spec, vec![b, f, z]).await;
}

#[tokio::test]
async fn missing_bird_socket_is_unreachable_and_says_what_to_check() {
    let view = DaemonView {
        spec: DaemonSpec::Bird {
            socket: "/nonexistent/bird.ctl".into(),
        },
        timeout: READ_TIMEOUT,
    };
    let err = view.read().await.unwrap_err();
    assert!(matches!(err, RoutingError::Unreachable { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        "cannot reach BIRD's control socket /nonexistent/bird.ctl: No such file or directory \
         (os error 2) (is bird running, and is the socket mounted into the agent?)"
    );
}

#[tokio::test]
async fn missing_vtysh_is_unreachable() {
    let spec = DaemonSpec::Frr {
        vtysh: "/nonexistent/vtysh".into(),
        vty_socket: None,
    };
    let err = routing::read(&spec, READ_TIMEOUT).await.unwrap_err();
    assert!(matches!(err, RoutingError::Unreachable { .. }), "{err:?}");
    println!("{err}");
    assert!(err.to_string().contains("/nonexistent/vtysh"), "{err}");
}

#[tokio::test]
async fn a_bird_that_never_greets_times_out() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("stuck.ctl");
    // Accepts and then says nothing, like a daemon stuck in a long operation.
    let listener = tokio::net::UnixListener::bind(&sock).unwrap();
    let held = tokio::spawn(async move {
        let mut conns = Vec::new();
        while let Ok((c, _)) = listener.accept().await {
            conns.push(c);
        }
    });
    let start = Instant::now();
    let err = routing::read(
        &DaemonSpec::Bird { socket: sock },
        Duration::from_millis(300),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, RoutingError::Timeout { .. }), "{err:?}");
    assert!(start.elapsed() < Duration::from_secs(2));
    println!("{err}");
    held.abort();
}

#[tokio::test]
async fn a_stuck_vtysh_times_out_and_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    let script = fake_vtysh(
        dir.path(),
        &format!("echo $$ > {}\nexec sleep 30", pidfile.display()),
    );
    let err = routing::read(
        &DaemonSpec::Frr {
            vtysh: script,
            vty_socket: None,
        },
        Duration::from_millis(500),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, RoutingError::Timeout { .. }), "{err:?}");
    let pid = std::fs::read_to_string(&pidfile).unwrap();
    let proc_dir = PathBuf::from(format!("/proc/{}", pid.trim()));
    let start = Instant::now();
    // Killed on drop; gone once reaped (tokio reaps orphaned children in the background).
    while is_alive(&proc_dir) {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the stuck vtysh ({}) was not killed",
            pid.trim()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Whether a process exists and is not a zombie.
fn is_alive(proc_dir: &Path) -> bool {
    std::fs::read_to_string(proc_dir.join("stat"))
        .map(|stat| {
            stat.rsplit_once(')')
                .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

/// An executable `vtysh` stand-in running `body`. Written by a `sh` child, so no
/// write descriptor of it is ever open in this (multi-threaded, forking) process: a
/// concurrent fork would make exec fail with ETXTBSY.
fn fake_vtysh(dir: &Path, body: &str) -> PathBuf {
    let script = dir.join(format!("vtysh-{}", COUNTER.fetch_add(1, Ordering::Relaxed)));
    run(
        "sh",
        &[
            "-c",
            "printf '#!/bin/sh\\n%s\\n' \"$1\" > \"$2\" && chmod +x \"$2\"",
            "sh",
            body,
            s(&script),
        ],
    );
    script
}

#[tokio::test]
async fn vtysh_failures_are_told_apart() {
    let dir = tempfile::tempdir().unwrap();
    let read = |vtysh: PathBuf| async move {
        let spec = DaemonSpec::Frr {
            vtysh,
            vty_socket: None,
        };
        routing::read(&spec, READ_TIMEOUT).await.unwrap_err()
    };
    // What FRR 8.4's vtysh says when zebra runs but bgpd does not.
    let err = read(fake_vtysh(
        dir.path(),
        "echo 'bgpd is not running' >&2; exit 1",
    ))
    .await;
    assert!(matches!(err, RoutingError::Unreachable { .. }), "{err:?}");
    // ... and for a command bgpd does not know.
    let err = read(fake_vtysh(
        dir.path(),
        "echo '% Unknown command: show bgp summary json'; exit 1",
    ))
    .await;
    assert!(matches!(err, RoutingError::Refused { .. }), "{err:?}");
    println!("{err}");
    // Not JSON at all.
    let err = read(fake_vtysh(dir.path(), "echo 'hello'")).await;
    assert!(matches!(err, RoutingError::Protocol { .. }), "{err:?}");
    println!("{err}");
}
