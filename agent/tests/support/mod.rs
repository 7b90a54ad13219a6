//! Test harness: throw-away network namespaces with veth links, and a way to run our
//! netlink code inside one (a dedicated OS thread that `setns`es, then a current-thread
//! tokio runtime). Does I/O: runs `ip`, creates and deletes namespaces.

#![allow(dead_code)]

use std::fs::File;
use std::future::Future;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use nix::sched::{CloneFlags, setns};

pub mod relay;

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// Whether kernel tests can run. Not root: under `CI=true` this panics (CI must run them),
/// otherwise it prints why and the test returns early.
pub fn require_root() -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("kernel tests need root (network namespaces) and CI=true: refusing to skip");
    }
    eprintln!("SKIPPED: kernel tests need root to create network namespaces");
    false
}

/// A network namespace deleted on drop.
#[derive(Debug)]
pub struct NetNs {
    name: String,
}

impl NetNs {
    /// A fresh namespace `alb-<tag>-<pid>-<n>` with `lo` up.
    pub fn new(tag: &str) -> Self {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = format!("alb-{tag}-{}-{n}", std::process::id());
        run_cmd("ip", &["netns", "add", &name]);
        let ns = NetNs { name };
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs `ip -n <ns> args...`, panicking with stderr on failure; returns stdout.
    pub fn ip(&self, args: &[&str]) -> String {
        let mut full = vec!["-n", self.name.as_str()];
        full.extend_from_slice(args);
        run_cmd("ip", &full)
    }

    /// Runs `ip netns exec <ns> cmd args...`; returns stdout.
    pub fn exec(&self, cmd: &str, args: &[&str]) -> String {
        let mut full = vec!["netns", "exec", self.name.as_str(), cmd];
        full.extend_from_slice(args);
        run_cmd("ip", &full)
    }

    /// Sets a sysctl inside the namespace.
    pub fn sysctl(&self, key: &str, value: &str) {
        self.exec("sysctl", &["-q", "-w", &format!("{key}={value}")]);
    }

    /// Creates a veth pair `here` (in this namespace) <-> `there` (in `peer`, or in this
    /// namespace too when `peer` is `None`), both up.
    pub fn veth(&self, here: &str, peer: Option<&NetNs>, there: &str) {
        let peer_ns = peer.map_or(self.name.as_str(), |p| p.name.as_str());
        self.ip(&[
            "link", "add", here, "type", "veth", "peer", "name", there, "netns", peer_ns,
        ]);
        self.ip(&["link", "set", here, "up"]);
        match peer {
            Some(p) => p.ip(&["link", "set", there, "up"]),
            None => self.ip(&["link", "set", there, "up"]),
        };
    }

    /// The addresses on `dev`, from `ip -j addr show dev <dev>`.
    pub fn addrs(&self, dev: &str) -> Vec<AddrInfo> {
        addrs_in(&self.name, dev)
    }

    /// The address `ip` on `dev`, if present.
    pub fn addr(&self, dev: &str, ip: &str) -> Option<AddrInfo> {
        self.addrs(dev).into_iter().find(|a| a.local == ip)
    }

    /// Runs `f` on a thread inside this namespace and returns its result.
    pub fn run_sync<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        let path = format!("/var/run/netns/{}", self.name);
        std::thread::spawn(move || {
            enter(&path);
            f()
        })
        .join()
        .expect("namespace thread panicked")
    }

    /// Moves the calling thread into this namespace: the processes it spawns from now on,
    /// and the sockets it opens, are in it (for a thread of its own, e.g. a benchmark's).
    pub fn enter(&self) {
        enter(&format!("/var/run/netns/{}", self.name));
    }

    /// Runs the future made by `f` on a current-thread tokio runtime inside this namespace.
    pub fn run<T, Fut>(&self, f: impl FnOnce() -> Fut + Send + 'static) -> T
    where
        T: Send + 'static,
        Fut: Future<Output = T>,
    {
        self.run_sync(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("tokio runtime")
                .block_on(f())
        })
    }

    /// Starts `f` on a thread inside this namespace, without waiting.
    pub fn spawn<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> std::thread::JoinHandle<T> {
        let path = format!("/var/run/netns/{}", self.name);
        std::thread::spawn(move || {
            enter(&path);
            f()
        })
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .status();
    }
}

fn enter(path: &str) {
    let file = File::open(path).unwrap_or_else(|e| panic!("open {path}: {e}"));
    setns(&file, CloneFlags::CLONE_NEWNET).unwrap_or_else(|e| panic!("setns {path}: {e}"));
}

/// The addresses on `dev` in the namespace `ns`, from `ip -n <ns> -j addr show dev <dev>`
/// (callable from any thread, also one inside another namespace).
pub fn addrs_in(ns: &str, dev: &str) -> Vec<AddrInfo> {
    let out = run_cmd("ip", &["-n", ns, "-j", "addr", "show", "dev", dev]);
    let v: serde_json::Value = serde_json::from_str(&out).expect("ip -j output is JSON");
    v[0]["addr_info"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| AddrInfo {
            local: a["local"].as_str().unwrap_or_default().to_string(),
            prefixlen: a["prefixlen"].as_u64().unwrap_or_default(),
            valid_life_time: a["valid_life_time"].as_u64().unwrap_or(u64::MAX),
            preferred_life_time: a["preferred_life_time"].as_u64().unwrap_or(u64::MAX),
            label: a["label"].as_str().map(str::to_string),
            nodad: a["nodad"].as_bool().unwrap_or(false),
            dynamic: a["dynamic"].as_bool().unwrap_or(false),
        })
        .collect()
}

/// One entry of `ip -j addr` (iproute2 6.1 does not print IFA_PROTO).
#[derive(Debug, Clone)]
pub struct AddrInfo {
    pub local: String,
    pub prefixlen: u64,
    /// Seconds; `u64::MAX` for "forever".
    pub valid_life_time: u64,
    pub preferred_life_time: u64,
    pub label: Option<String>,
    pub nodad: bool,
    pub dynamic: bool,
}

/// Runs `cmd args...`, panicking with its stderr on failure; returns stdout.
pub fn run_cmd(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd}: {e}"));
    assert!(
        out.status.success(),
        "{cmd} {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A node namespace with `eth1` (10.0.0.2/24, fd00:1::2/64) whose peer `lan0` is in a
/// second namespace (10.0.0.1/24, fd00:1::1/64) that learns neighbours from unsolicited
/// announcements. Returns (node, lan).
pub fn node_and_lan(tag: &str) -> (NetNs, NetNs) {
    let node = NetNs::new(tag);
    let lan = NetNs::new(&format!("{tag}lan"));
    node.veth("eth1", Some(&lan), "lan0");
    node.ip(&["addr", "add", "10.0.0.2/24", "dev", "eth1"]);
    node.ip(&["addr", "add", "fd00:1::2/64", "dev", "eth1", "nodad"]);
    lan.ip(&["addr", "add", "10.0.0.1/24", "dev", "lan0"]);
    lan.ip(&["addr", "add", "fd00:1::1/64", "dev", "lan0", "nodad"]);
    lan.sysctl("net.ipv4.conf.lan0.arp_accept", "1");
    // RFC 9131: only a router creates an entry from an untracked NA (ndisc_recv_na).
    lan.sysctl("net.ipv6.conf.all.forwarding", "1");
    lan.sysctl("net.ipv6.conf.lan0.accept_untracked_na", "1");
    (node, lan)
}

impl NetNs {
    /// Runs `ip netns exec <ns> cmd args...`: stdout, or stderr when it fails (for
    /// commands whose failure is an expected answer, e.g. `nft list table` of a table
    /// that must be gone).
    pub fn try_exec(&self, cmd: &str, args: &[&str]) -> Result<String, String> {
        let out = Command::new("ip")
            .args(["netns", "exec", self.name.as_str(), cmd])
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("cannot run ip netns exec {cmd}: {e}"));
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }
}
