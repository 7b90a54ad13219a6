//! Two `aliaslb-controller` binaries against the real kube-apiserver: both get ready, only
//! the leader reconciles and writes (Events name it as reporting instance, the follower
//! runs no pass), and when the leader is killed the other one takes over.

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use aliaslb_core::keys;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use support::{Cluster, eventually, lb_service};

/// GET `path` over plain HTTP/1.0: (status line, body); `None` while nothing listens.
fn get(addr: SocketAddr, path: &str) -> Option<(String, String)> {
    let mut stream = TcpStream::connect(addr).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: test\r\n\r\n").ok()?;
    let mut raw = String::new();
    stream.read_to_string(&mut raw).ok()?;
    let (head, body) = raw.split_once("\r\n\r\n")?;
    Some((head.lines().next()?.to_owned(), body.to_owned()))
}

fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// A controller process, killed (SIGKILL) when dropped.
struct Replica {
    identity: String,
    addr: SocketAddr,
    child: Child,
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn spawn(c: &Cluster, identity: &str) -> Replica {
    let addr = free_addr();
    let child = Command::new(env!("CARGO_BIN_EXE_aliaslb-controller"))
        .env("KUBECONFIG", c.env.kubeconfig_path())
        .env("POD_NAMESPACE", &c.system)
        .env("POD_NAME", identity)
        .env("ALIASLB_METRICS_ADDR", addr.to_string())
        .env("ALIASLB_AGENT_LEASE_DURATION", "2s")
        .env("ALIASLB_LEADER_LEASE_DURATION", "3s")
        .env("ALIASLB_LEADER_RENEW_DEADLINE", "2s")
        .env("ALIASLB_LEADER_RETRY_PERIOD", "200ms")
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    Replica {
        identity: identity.to_owned(),
        addr,
        child,
    }
}

fn metric(replica: &Replica, prefix: &str) -> Option<String> {
    let (_, body) = get(replica.addr, "/metrics")?;
    body.lines()
        .find(|l| l.starts_with(prefix))
        .map(|l| l[prefix.len()..].trim().to_owned())
}

/// The reporting instances of the Events on Service `name`.
async fn reporters(c: &Cluster, name: &str) -> Vec<String> {
    c.events(&c.ns, name)
        .await
        .into_iter()
        .filter_map(|e| e.reporting_instance)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_leader_writes_and_the_other_takes_over() {
    let c = Cluster::new("replicas").await;
    c.set_pool(&[(c.ns.as_str(), "10.70.0.1-10.70.0.4")]).await;
    let node = c.node("a").await;
    let _agent = c.fake_agent(&node);
    let mut replicas = vec![spawn(&c, "replica-0"), spawn(&c, "replica-1")];

    for r in &replicas {
        eventually(Duration::from_secs(20), "/readyz of both", async || {
            get(r.addr, "/readyz").is_some_and(|(status, _)| status.contains("200"))
        })
        .await;
    }
    let leases = Api::<Lease>::namespaced(c.client.clone(), &c.system);
    let holder = async || {
        leases
            .get_opt(keys::CONTROLLER_LEASE)
            .await
            .unwrap()
            .and_then(|l| l.spec?.holder_identity)
            .filter(|h| !h.is_empty())
    };
    eventually(Duration::from_secs(10), "a leader", async || {
        holder().await.is_some()
    })
    .await;
    let leader = holder().await.unwrap();
    let (lead, follow) = if replicas[0].identity == leader {
        (0, 1)
    } else {
        (1, 0)
    };

    c.create(lb_service("one")).await;
    c.wait_ips("one", &["10.70.0.1"], Duration::from_secs(10))
        .await;
    eventually(Duration::from_secs(10), "events on one", async || {
        !reporters(&c, "one").await.is_empty()
    })
    .await;
    let by = reporters(&c, "one").await;
    assert!(by.iter().all(|r| *r == leader), "{by:?} (leader {leader})");
    let follower = &replicas[follow];
    assert_eq!(metric(follower, "aliaslb_leader ").as_deref(), Some("0"));
    assert_eq!(
        metric(follower, "aliaslb_reconcile_duration_seconds_count ").as_deref(),
        Some("0"),
        "the follower ran a pass"
    );

    // Kill the leader without a goodbye: the follower takes over after the lease duration.
    let killed_at = Instant::now();
    replicas.remove(lead);
    let survivor = &replicas[0];
    c.create(lb_service("two")).await;
    c.wait_ips("two", &["10.70.0.2"], Duration::from_secs(15))
        .await;
    eprintln!(
        "takeover: two got its IP {:?} after the leader was killed",
        killed_at.elapsed()
    );
    assert_eq!(metric(survivor, "aliaslb_leader ").as_deref(), Some("1"));
    eventually(Duration::from_secs(10), "events on two", async || {
        !reporters(&c, "two").await.is_empty()
    })
    .await;
    let by = reporters(&c, "two").await;
    assert!(by.iter().all(|r| *r == survivor.identity), "{by:?}");
    assert_eq!(c.ips("one").await, ["10.70.0.1"], "takeover kept one's IP");
    c.cleanup().await;
}
