//! Leader election against the real kube-apiserver: one leader at a time, takeover only after
//! the old leader stopped claiming, prompt handover on graceful release.
//!
//! Each elector talks to the API through its own TCP proxy, so a test can partition one
//! replica (its calls hang, as on a dead network) without stopping its process.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aliaslb_controller::leader::{self, ElectorHandle, LeaderConfig, Leadership, Timings};
use aliaslb_testenv::TestEnv;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::{Api, Client};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

const LEASE_NAME: &str = "aliaslb-controller";

/// A TCP forwarder to the apiserver that can be cut: once cut, existing and new connections
/// stay open but carry nothing, like a partitioned network.
struct Proxy {
    addr: SocketAddr,
    cut: watch::Sender<bool>,
}

impl Proxy {
    async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (cut, cut_rx) = watch::channel(false);
        tokio::spawn(async move {
            loop {
                let Ok((mut down, _)) = listener.accept().await else {
                    return;
                };
                let mut cut_rx = cut_rx.clone();
                tokio::spawn(async move {
                    if *cut_rx.borrow() {
                        // Hold the connection open, forward nothing.
                        std::future::pending::<()>().await;
                    }
                    let Ok(mut up) = TcpStream::connect(upstream).await else {
                        return;
                    };
                    let cut = tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut down, &mut up) => false,
                        result = cut_rx.wait_for(|cut| *cut) => result.is_ok(),
                    };
                    if cut {
                        std::future::pending::<()>().await;
                    }
                });
            }
        });
        Proxy { addr, cut }
    }

    fn partition(&self) {
        self.cut.send_replace(true);
    }
}

/// Leadership edges of one elector, timestamped as they are seen.
type Edges = Arc<Mutex<Vec<(Instant, bool)>>>;

/// One elector under test.
struct Replica {
    leadership: Leadership,
    handle: Option<ElectorHandle>,
    edges: Edges,
    proxy: Proxy,
}

impl Replica {
    async fn start(env: &TestEnv, namespace: &str, identity: &str, timings: Timings) -> Replica {
        let upstream: SocketAddr = env
            .server_url()
            .trim_start_matches("https://")
            .parse()
            .unwrap();
        let proxy = Proxy::start(upstream).await;
        let mut config = env.config().await.unwrap();
        config.cluster_url = format!("https://{}", proxy.addr).parse().unwrap();
        let client = Client::try_from(config).unwrap();
        let (leadership, handle) = leader::start(
            client,
            LeaderConfig {
                namespace: namespace.to_owned(),
                lease_name: LEASE_NAME.to_owned(),
                identity: identity.to_owned(),
                timings,
            },
        );
        let edges = Edges::default();
        let mut rx = leadership.watch();
        let log = edges.clone();
        tokio::spawn(async move {
            while rx.changed().await.is_ok() {
                let leading = *rx.borrow_and_update();
                log.lock().unwrap().push((Instant::now(), leading));
            }
        });
        Replica {
            leadership,
            handle: Some(handle),
            edges,
            proxy,
        }
    }

    /// Graceful stop: step down and release the Lease.
    async fn shutdown(&mut self) {
        self.handle.take().unwrap().shutdown().await.unwrap();
    }

    /// Stop as a crash would, without releasing.
    fn stop_abruptly(&mut self) {
        self.handle.take().unwrap().abort();
    }

    /// Waits until this replica leads; returns when its watch channel said so.
    async fn until_leading(&self, within: Duration) -> Instant {
        let mut rx = self.leadership.watch();
        tokio::time::timeout(within, rx.wait_for(|l| *l))
            .await
            .expect("replica did not become leader in time")
            .unwrap();
        self.edge(true).await.expect("edge recorded")
    }

    /// Time of the last recorded edge to `leading`.
    async fn edge(&self, leading: bool) -> Option<Instant> {
        // The recorder task may lag the channel by a scheduling slice.
        for _ in 0..100 {
            let found = self
                .edges
                .lock()
                .unwrap()
                .iter()
                .rev()
                .find(|(_, l)| *l == leading)
                .map(|(t, _)| *t);
            if found.is_some() {
                return found;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        None
    }
}

fn timings(lease: u64, renew_ms: u64, retry_ms: u64) -> Timings {
    Timings::new(
        Duration::from_secs(lease),
        Duration::from_millis(renew_ms),
        Duration::from_millis(retry_ms),
    )
    .unwrap()
}

/// Samples both replicas' fencing check for `span`; returns how many samples saw exactly
/// one leader, panicking if any saw two.
async fn sample(a: &Replica, b: &Replica, span: Duration) -> (usize, usize) {
    let end = Instant::now() + span;
    let (mut samples, mut exactly_one) = (0, 0);
    while Instant::now() < end {
        let leaders = usize::from(a.leadership.is_leader()) + usize::from(b.leadership.is_leader());
        assert!(leaders <= 1, "two leaders at once");
        samples += 1;
        exactly_one += usize::from(leaders == 1);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    (samples, exactly_one)
}

async fn lease(client: &Client, namespace: &str) -> Lease {
    Api::<Lease>::namespaced(client.clone(), namespace)
        .get(LEASE_NAME)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leader_and_takeover_only_after_the_old_leader_stopped() {
    let env = TestEnv::global();
    let admin = env.client().await;
    let ns = env.create_namespace(&admin, "leader-takeover").await;
    let t = timings(2, 1000, 200);
    let mut a = Replica::start(env, &ns, "replica-a", t).await;
    let mut b = Replica::start(env, &ns, "replica-b", t).await;

    // One of them leads; for twice the lease duration the other never takes over.
    let first = tokio::select! {
        _ = a.until_leading(Duration::from_secs(10)) => 'a',
        _ = b.until_leading(Duration::from_secs(10)) => 'b',
    };
    let (samples, exactly_one) = sample(&a, &b, Duration::from_secs(4)).await;
    assert_eq!(
        exactly_one, samples,
        "some samples saw no leader in steady state"
    );
    let (leader, follower) = if first == 'a' { (&a, &b) } else { (&b, &a) };
    let record = lease(&admin, &ns).await;
    let spec = record.spec.unwrap();
    let leader_name = if first == 'a' {
        "replica-a"
    } else {
        "replica-b"
    };
    assert_eq!(spec.holder_identity.as_deref(), Some(leader_name));
    assert_eq!(spec.lease_duration_seconds, Some(2));
    assert!(spec.acquire_time.is_some() && spec.renew_time.is_some());

    // Partition the leader: its calls hang. It must stop claiming before the other starts.
    let cut_at = Instant::now();
    leader.proxy.partition();
    let (took_over, _) = tokio::join!(
        follower.until_leading(Duration::from_secs(10)),
        sample(&a, &b, Duration::from_secs(4)),
    );
    let stopped = leader
        .edge(false)
        .await
        .expect("old leader never stopped claiming");
    assert!(
        stopped < took_over,
        "old leader stopped at +{:?}, new one started at +{:?}",
        stopped - cut_at,
        took_over - cut_at
    );
    assert!(!leader.leadership.is_leader());
    eprintln!(
        "partition: old leader stopped at +{:?}, new leader at +{:?}",
        stopped - cut_at,
        took_over - cut_at
    );
    // The leader stops within its renew deadline of the partition (plus scheduling slack);
    // the follower waits a full lease duration after the last renewal it saw.
    assert!(stopped - cut_at <= Duration::from_millis(1000 + 300));
    assert!(took_over - cut_at >= Duration::from_millis(2000 - 200));
    assert!(took_over - cut_at <= Duration::from_millis(2000 + 2 * 200 + 1000));
    let spec = lease(&admin, &ns).await.spec.unwrap();
    assert_ne!(spec.holder_identity.as_deref(), Some(leader_name));
    assert_eq!(spec.lease_transitions, Some(1));

    a.stop_abruptly();
    b.stop_abruptly();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_release_hands_over_promptly() {
    let env = TestEnv::global();
    let admin = env.client().await;
    let ns = env.create_namespace(&admin, "leader-release").await;
    // A long lease: a handover within a second can only come from the release.
    let t = timings(15, 10_000, 200);
    let mut a = Replica::start(env, &ns, "replica-a", t).await;
    a.until_leading(Duration::from_secs(10)).await;
    let mut b = Replica::start(env, &ns, "replica-b", t).await;
    let (samples, exactly_one) = sample(&a, &b, Duration::from_secs(1)).await;
    assert_eq!(exactly_one, samples);
    assert!(a.leadership.is_leader());

    let released_at = Instant::now();
    a.shutdown().await;
    let stopped = a.edge(false).await.expect("leader did not step down");
    let took_over = b.until_leading(Duration::from_secs(5)).await;
    assert!(stopped < took_over);
    eprintln!(
        "graceful release: handover in {:?}",
        took_over - released_at
    );
    assert!(
        took_over - released_at < Duration::from_secs(1),
        "handover took {:?}",
        took_over - released_at
    );
    let spec = lease(&admin, &ns).await.spec.unwrap();
    assert_eq!(spec.holder_identity.as_deref(), Some("replica-b"));
    assert_eq!(spec.lease_transitions, Some(1));
    b.shutdown().await;
    let spec = lease(&admin, &ns).await.spec.unwrap();
    assert_eq!(spec.holder_identity, None, "release empties the holder");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_steps_down_when_the_record_names_someone_else() {
    let env = TestEnv::global();
    let admin = env.client().await;
    let ns = env.create_namespace(&admin, "leader-usurped").await;
    let t = timings(15, 10_000, 200);
    let mut a = Replica::start(env, &ns, "replica-a", t).await;
    a.until_leading(Duration::from_secs(10)).await;

    // Another writer takes the Lease over (e.g. an operator's mistake or a replica that
    // judged it expired): the leader must stop at its next look, not at its deadline.
    let api = Api::<Lease>::namespaced(admin.clone(), &ns);
    let mut record = api.get(LEASE_NAME).await.unwrap();
    let spec = record.spec.as_mut().unwrap();
    spec.holder_identity = Some("intruder".to_owned());
    spec.renew_time = Some(MicroTime(Timestamp::now()));
    let written_at = Instant::now();
    api.replace(LEASE_NAME, &PostParams::default(), &record)
        .await
        .unwrap();
    let mut rx = a.leadership.watch();
    tokio::time::timeout(Duration::from_secs(2), rx.wait_for(|l| !*l))
        .await
        .expect("leader kept claiming a Lease that names someone else")
        .unwrap();
    assert!(!a.leadership.is_leader());
    assert!(a.edge(false).await.unwrap() - written_at < Duration::from_secs(1));
    a.stop_abruptly();
}
