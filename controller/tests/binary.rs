//! The `aliaslb-controller` binary end to end against the real kube-apiserver: it starts,
//! serves /healthz, /readyz and /metrics, takes the leader Lease, and on SIGTERM releases the
//! Lease and exits 0.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use aliaslb_testenv::TestEnv;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;

/// GET `path` over plain HTTP/1.0; `None` while nothing listens.
fn get(addr: SocketAddr, path: &str) -> Option<(String, String)> {
    let mut stream = TcpStream::connect(addr).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: test\r\n\r\n").ok()?;
    let mut raw = String::new();
    stream.read_to_string(&mut raw).ok()?;
    let (head, body) = raw.split_once("\r\n\r\n")?;
    Some((head.lines().next()?.to_owned(), body.to_owned()))
}

/// Polls `check` every 50 ms until it holds or `within` passes.
async fn eventually(within: Duration, what: &str, mut check: impl AsyncFnMut() -> bool) {
    let end = Instant::now() + within;
    while !check().await {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A free loopback port (released again, so a small race is possible).
fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// Kills the child if the test fails before it exits.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starts_leads_serves_and_releases_on_sigterm() {
    let env = TestEnv::global();
    let admin = env.client().await;
    let ns = env.create_namespace(&admin, "controller-binary").await;
    let addr = free_addr();
    let child = Command::new(env!("CARGO_BIN_EXE_aliaslb-controller"))
        .env("KUBECONFIG", env.kubeconfig_path())
        .env("POD_NAMESPACE", &ns)
        .env("POD_NAME", "controller-0")
        .env("ALIASLB_METRICS_ADDR", addr.to_string())
        .env("ALIASLB_LEADER_RETRY_PERIOD", "200ms")
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut child = Running(child);

    eventually(Duration::from_secs(20), "/readyz", async || {
        get(addr, "/readyz").is_some_and(|(status, _)| status.contains("200"))
    })
    .await;
    let (status, _) = get(addr, "/healthz").unwrap();
    assert!(status.contains("200"), "{status}");
    eventually(Duration::from_secs(10), "aliaslb_leader 1", async || {
        get(addr, "/metrics").is_some_and(|(_, body)| body.contains("aliaslb_leader 1"))
    })
    .await;
    let leases = Api::<Lease>::namespaced(admin.clone(), &ns);
    let holder = |lease: Lease| lease.spec.and_then(|s| s.holder_identity);
    assert_eq!(
        holder(leases.get("aliaslb-controller").await.unwrap()).as_deref(),
        Some("controller-0")
    );

    let killed = Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let end = Instant::now() + Duration::from_secs(10);
    let exit = loop {
        if let Some(exit) = child.0.try_wait().unwrap() {
            break exit;
        }
        assert!(
            Instant::now() < end,
            "controller did not exit after SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(exit.success(), "{exit}");
    assert_eq!(
        holder(leases.get("aliaslb-controller").await.unwrap()),
        None,
        "SIGTERM releases the leader Lease"
    );
}
