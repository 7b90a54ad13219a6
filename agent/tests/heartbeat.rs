//! The heartbeat loop (`heartbeat::run`) against the real kube-apiserver: what it writes when
//! the alias loop's kernel rounds stop and resume. The kernel side is the fault here (a hung
//! netlink socket cannot be made on purpose in a real kernel), so the rounds are recorded by
//! the test; the Lease is the real one.

use std::sync::Arc;
use std::time::Duration;

use aliaslb_agent::heartbeat::{
    self, Authority, Heartbeat, HeartbeatLinks, KernelRounds, LeaseConfig,
};
use aliaslb_agent::metrics::Metrics;
use aliaslb_core::keys;
use aliaslb_core::report::{AgentReport, REPORT_VERSION};
use aliaslb_testenv::TestEnv;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

async fn holder(leases: &Api<Lease>, node: &str) -> Option<Option<String>> {
    let lease = leases
        .get_opt(&keys::agent_lease_name(node))
        .await
        .unwrap()?;
    Some(lease.spec.and_then(|s| s.holder_identity))
}

async fn wait_holder(leases: &Api<Lease>, node: &str, want: Option<&str>, within: Duration) {
    let start = Instant::now();
    loop {
        let now = holder(leases, node).await;
        if now.as_ref().map(|h| h.as_deref()) == Some(want) {
            return;
        }
        assert!(
            start.elapsed() < within,
            "the Lease's holder is {now:?}, not {want:?}, after {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Kernel rounds that stop for longer than the alias lifetime: the Lease is released at
/// once (holderless, nothing held), not left to expire a lease later; renewed again when
/// the rounds resume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_kernel_rounds_release_the_lease_and_resumed_ones_renew_it() {
    let env = TestEnv::global();
    let client = env.client().await;
    let namespace = env.create_namespace(&client, "heartbeat").await;
    let node = "node-heartbeat";
    let config = LeaseConfig {
        namespace: namespace.clone(),
        node_name: node.into(),
        lease_duration: Duration::from_secs(30),
        renew_interval: Duration::from_secs(10),
        alias_lifetime: Duration::from_secs(1),
    };
    let (report_tx, report_rx) = watch::channel(None);
    let authority = Authority::new(config.lease_duration);
    let kernel = KernelRounds::new();
    let metrics = Arc::new(Metrics::new());
    let task = tokio::spawn(heartbeat::run(
        Heartbeat::new(client.clone(), config),
        report_rx,
        metrics.heartbeat.clone(),
        HeartbeatLinks {
            api_back: Arc::new(Notify::new()),
            authority: authority.clone(),
            kernel: kernel.clone(),
        },
    ));
    let leases: Api<Lease> = Api::namespaced(client, &namespace);
    let report = AgentReport {
        version: REPORT_VERSION,
        held: ["10.0.0.80".parse().unwrap()].into(),
        ..AgentReport::default()
    };
    // Rounds every 200 ms for 2 s: the Lease is written and holds the node.
    let beating = {
        let kernel = kernel.clone();
        tokio::spawn(async move {
            loop {
                kernel.record_ok(Instant::now());
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };
    report_tx.send_replace(Some(report.clone()));
    wait_holder(&leases, node, Some(node), Duration::from_secs(3)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(authority.is_fresh(Instant::now()));
    // The rounds stop: released within the lifetime and one look (a third of it) and a write.
    beating.abort();
    let stopped = Instant::now();
    wait_holder(&leases, node, None, Duration::from_secs(3)).await;
    let released = stopped.elapsed();
    eprintln!("kernel rounds stopped -> Lease released after {released:?} (alias lifetime 1 s)");
    assert!(released < Duration::from_millis(2_000), "{released:?}");
    let lease = leases.get(&keys::agent_lease_name(node)).await.unwrap();
    let held = lease.metadata.annotations.unwrap()[keys::ANNOTATION_AGENT_REPORT].clone();
    assert!(
        AgentReport::from_json(&held).unwrap().held.is_empty(),
        "the release holds nothing: {held}"
    );
    assert!(!authority.is_fresh(Instant::now()), "released: stale");
    // Nothing more is written while they stay stopped, not even a changed report.
    let version = lease.metadata.resource_version.clone();
    report_tx.send_replace(Some(AgentReport {
        held: ["10.0.0.81".parse().unwrap()].into(),
        ..report.clone()
    }));
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let now = leases.get(&keys::agent_lease_name(node)).await.unwrap();
    assert_eq!(
        now.metadata.resource_version, version,
        "written while gated"
    );
    // A round again: renewed at once.
    kernel.record_ok(Instant::now());
    wait_holder(&leases, node, Some(node), Duration::from_secs(2)).await;
    assert!(authority.is_fresh(Instant::now()));
    let text = metrics.encode().unwrap();
    assert!(
        text.contains("aliaslb_agent_lease_renewals_gated_total"),
        "{text}"
    );
    drop(report_tx);
    task.await.unwrap();
}
