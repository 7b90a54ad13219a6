//! What the controller benches share (each example includes it as `mod support`): the
//! release controller binary run in a subprocess against a testenv apiserver, its `/readyz`
//! and `/metrics` over plain HTTP, and its memory from `/proc` (`VmHWM`, `VmRSS` and its
//! two parts). Does I/O (processes, sockets, `/proc`).

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use aliaslb_testenv::TestEnv;
use kube::Client;

/// The value of `field` (e.g. `VmHWM`) in `/proc/PID/status`, in KiB.
pub fn proc_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

/// The current RSS of `pid` and its two parts: the heap, stacks and other private memory
/// (`RssAnon`), and the pages of files mapped (`RssFile`: mostly the binary's own code,
/// clean and shared with the page cache, which a smaller binary shrinks and no data
/// structure does).
pub fn rss_split(pid: u32) -> String {
    let mib = |field| proc_kib(pid, field).unwrap_or(0) as f64 / 1024.0;
    format!(
        "RSS {:.1} MiB = anonymous {:.1} + files {:.1}",
        mib("VmRSS"),
        mib("RssAnon"),
        mib("RssFile") + mib("RssShmem")
    )
}

/// GET `path` over plain HTTP/1.0: (status line, body); `None` while nothing listens.
pub fn get(addr: SocketAddr, path: &str) -> Option<(String, String)> {
    let mut stream = TcpStream::connect(addr).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: bench\r\n\r\n").ok()?;
    let mut raw = String::new();
    stream.read_to_string(&mut raw).ok()?;
    let (head, body) = raw.split_once("\r\n\r\n")?;
    Some((head.lines().next()?.to_owned(), body.to_owned()))
}

/// glibc malloc arenas of the controller: `1`, as `manifests/controller.yaml` sets it,
/// unless this process has `MALLOC_ARENA_MAX` (e.g. `8` to see glibc's default on 2 cores).
pub fn malloc_arenas() -> String {
    std::env::var("MALLOC_ARENA_MAX").unwrap_or_else(|_| "1".to_owned())
}

/// Stops the controller when the bench ends in any way: SIGTERM (so a profiler wrapping
/// it writes its output), SIGKILL after 30 s. [`Running::kill`] stops it at once instead.
pub struct Running(pub Option<Child>);

impl Running {
    pub fn id(&self) -> u32 {
        self.0.as_ref().map_or(0, Child::id)
    }

    /// SIGKILL and reap it: a controller that dies without stepping down (the leader
    /// Lease still names it).
    pub fn kill(mut self) {
        if let Some(mut child) = self.0.take() {
            if let Err(e) = child.kill() {
                eprintln!("killing the controller: {e}");
            }
            let _ = child.wait();
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let Some(mut child) = self.0.take() else {
            return;
        };
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status();
        let end = Instant::now() + Duration::from_secs(30);
        while Instant::now() < end {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// A controller process that answered `/readyz`.
pub struct Started {
    pub controller: Running,
    /// Its `/metrics`, `/healthz`, `/readyz` address.
    pub addr: SocketAddr,
    /// Just before the process was spawned.
    pub started: Instant,
    /// From spawn to the first 200 on `/readyz` (caches synced).
    pub ready: Duration,
    /// Its stderr.
    pub log: PathBuf,
}

/// Spawns the controller binary with its own metrics port and log file (`which` names
/// it), and waits for `/readyz`.
pub async fn start_controller(
    binary: &Path,
    env: &TestEnv,
    system: &str,
    (bench, identity, which): (&str, &str, &str),
) -> Started {
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("finding a free local port for the controller's metrics");
    let log_path = std::env::temp_dir().join(format!("{bench}-{}-{which}.log", std::process::id()));
    let log = std::fs::File::create(&log_path)
        .unwrap_or_else(|e| panic!("creating {}: {e}", log_path.display()));
    let started = Instant::now();
    let child = Command::new(binary)
        .env("KUBECONFIG", env.kubeconfig_path())
        .env("POD_NAMESPACE", system)
        // The fake agents' Leases are in the system namespace too.
        .env("ALIASLB_AGENT_NAMESPACE", system)
        .env("POD_NAME", identity)
        .env("ALIASLB_METRICS_ADDR", addr.to_string())
        .env("MALLOC_ARENA_MAX", malloc_arenas())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", binary.display()));
    let mut controller = Running(Some(child));
    let ready = loop {
        if get(addr, "/readyz").is_some_and(|(status, _)| status.contains("200")) {
            break started.elapsed();
        }
        if let Some(Ok(Some(status))) = controller.0.as_mut().map(Child::try_wait) {
            panic!(
                "the controller exited ({status}) before it was ready: see {}",
                log_path.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    Started {
        controller,
        addr,
        started,
        ready,
        log: log_path,
    }
}

/// The controller binary: `ALIASLB_CONTROLLER_BIN`, else `target/release/aliaslb-controller`.
pub fn controller_binary() -> PathBuf {
    std::env::var_os("ALIASLB_CONTROLLER_BIN").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/release/aliaslb-controller"),
        PathBuf::from,
    )
}

/// `apiserver_request_total` summed by (verb, resource, subresource).
pub async fn request_counts(client: &Client) -> BTreeMap<(String, String, String), f64> {
    let request = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let text = client.request_text(request).await.unwrap();
    let mut out = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
    {
        let (labels, value) = line.rsplit_once(' ').unwrap();
        let label = |name: &str| {
            labels
                .split(&format!("{name}=\""))
                .nth(1)
                .and_then(|rest| rest.split('"').next())
                .unwrap_or_default()
                .to_owned()
        };
        let key = (label("verb"), label("resource"), label("subresource"));
        *out.entry(key).or_default() += value.parse::<f64>().unwrap_or(0.0);
    }
    out
}
