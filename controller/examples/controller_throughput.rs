//! Controller throughput against the real kube-apiserver (testenv, v1.37.2; the figures in BENCHMARKS were measured on v1.20.2): creates N
//! LoadBalancer Services (default 1000) and measures the time until every one has an
//! ingress IP, plus the API requests the run cost per Service, from the apiserver's own
//! `apiserver_request_total` counters.
//!
//! By default the controller runs while the Services are created (live); with `--backlog`
//! every Service exists before the controller starts, which measures the controller alone.
//!
//! ```text
//! KUBEBUILDER_ASSETS=$HOME/.cache/aliaslb/kube-v1.37.2/bin \
//!   cargo run -p aliaslb-controller --example controller_throughput [-- [--backlog] N]
//! ```

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use aliaslb_controller::config::ControllerConfig;
use aliaslb_controller::context::Context;
use aliaslb_controller::http::Readiness;
use aliaslb_controller::leader::Leadership;
use aliaslb_controller::metrics::Metrics;
use aliaslb_controller::observe::service;
use aliaslb_controller::reconcile;
use aliaslb_core::keys;
use aliaslb_core::report::{AgentReport, REPORT_VERSION};
use aliaslb_testenv::{TestEnv, fixtures};
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;
use support::request_counts;

/// Starts an in-process controller and waits for its caches; returns its abort handle.
async fn start_controller(ctx: Arc<Context>) -> tokio::task::AbortHandle {
    let readiness = Readiness::new();
    let controller = tokio::spawn(reconcile::run(ctx, readiness.clone()));
    while !readiness.is_ready() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    controller.abort_handle()
}

/// Renews the agent Lease of `node` every 500 ms, reporting every IP assigned to it as held.
async fn fake_agent(client: Client, system: String, node: &'static str) {
    let leases = Api::<Lease>::namespaced(client.clone(), &system);
    let services = Api::<Service>::all(client);
    let name = keys::agent_lease_name(node);
    loop {
        let held: std::collections::BTreeSet<std::net::IpAddr> = services
            .list(&ListParams::default())
            .await
            .map(|list| {
                list.items
                    .iter()
                    .filter(|s| service::annotation(s, keys::ANNOTATION_NODE) == Some(node))
                    .flat_map(service::ingress_ips)
                    .collect()
            })
            .unwrap_or_default();
        let report = AgentReport {
            version: REPORT_VERSION,
            held,
            ..AgentReport::default()
        };
        let lease = json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": name, "annotations": {keys::ANNOTATION_AGENT_REPORT: report.to_json()}},
            "spec": {
                "holderIdentity": node,
                "leaseDurationSeconds": 4,
                "renewTime": MicroTime(Timestamp::now()),
            },
        });
        let params = PatchParams::apply(keys::AGENT_FIELD_MANAGER).force();
        if let Err(e) = leases.patch(&name, &params, &Patch::Apply(lease)).await {
            eprintln!("fake agent: renewing failed: {e}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let backlog = args.iter().any(|a| a == "--backlog");
    let n: usize = args
        .iter()
        .find(|a| !a.starts_with("--"))
        .map_or(1000, |s| s.parse().expect("N must be a number"));
    let env = TestEnv::global();
    let client = env.client().await;
    let ns = env.create_namespace(&client, "bench").await;
    let system = env.create_namespace(&client, "bench-system").await;

    let cm = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": keys::DEFAULT_POOL_CONFIGMAP},
        "data": {ns.as_str(): "10.80.0.0/20"},
    });
    Api::<ConfigMap>::namespaced(client.clone(), &system)
        .patch(
            keys::DEFAULT_POOL_CONFIGMAP,
            &PatchParams::apply("bench"),
            &Patch::Apply(cm),
        )
        .await
        .unwrap();
    let node: Node = serde_json::from_value(
        json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "bench-node"}}),
    )
    .unwrap();
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
        .unwrap();

    let agent = tokio::spawn(fake_agent(client.clone(), system.clone(), "bench-node"));

    let metrics = Arc::new(Metrics::new());
    let ctx = Context::new(
        client.clone(),
        ControllerConfig {
            namespace: system.clone(),
            ..ControllerConfig::default()
        },
        metrics.clone(),
        Leadership::fixed(true),
        "bench",
    );
    // Live: the controller runs while Services arrive. Backlog: every Service exists
    // before the controller starts (pure controller throughput).
    let mut controller = None;
    if !backlog {
        controller = Some(start_controller(ctx.clone()).await);
    }

    let before = request_counts(&client).await;
    let services = Api::<Service>::namespaced(client.clone(), &ns);
    let mut started = Instant::now();
    futures::stream::iter(0..n)
        .for_each_concurrent(32, |i| {
            let services = services.clone();
            async move {
                let svc = fixtures::lb_service("", &format!("svc-{i:05}"))
                    .meta(|m| m.uid = None)
                    .build();
                services.create(&PostParams::default(), &svc).await.unwrap();
            }
        })
        .await;
    let created = started.elapsed();
    if backlog {
        started = Instant::now();
        controller = Some(start_controller(ctx.clone()).await);
    }
    loop {
        let list = services.list(&ListParams::default()).await.unwrap();
        let done = list
            .items
            .iter()
            .filter(|s| service::ingress(s).next().is_some())
            .count();
        if done == n {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let all = started.elapsed();
    loop {
        let list = services.list(&ListParams::default()).await.unwrap();
        let announced = list
            .items
            .iter()
            .filter(|s| {
                s.status
                    .as_ref()
                    .and_then(|st| st.conditions.as_ref())
                    .is_some_and(|cs| {
                        cs.iter()
                            .any(|c| c.type_ == keys::CONDITION_ANNOUNCED && c.status == "True")
                    })
            })
            .count();
        if announced == n {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let announced = started.elapsed();
    // Let the trailing Events land before counting.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = request_counts(&client).await;
    if let Some(controller) = controller {
        controller.abort();
    }
    agent.abort();

    println!(
        "services: {n}, mode: {}",
        if backlog { "backlog" } else { "live" }
    );
    println!("created all in {created:?} (test client, 32 in flight)");
    println!(
        "all have an ingress IP {all:?} after {} ({:.0} Services/s)",
        if backlog {
            "the controller started (caches synced)"
        } else {
            "the first create"
        },
        n as f64 / all.as_secs_f64()
    );
    println!("all Announced=True after {announced:?}");
    println!("API requests during the run (apiserver_request_total delta), per Service:");
    let mut controller_total = 0.0;
    for (key, value) in &after {
        let delta = value - before.get(key).copied().unwrap_or(0.0);
        if delta < 1.0 {
            continue;
        }
        let (verb, resource, sub) = key;
        let by_test = verb == "POST" && resource == "services" && sub.is_empty()
            || verb == "LIST" && resource == "services";
        if !by_test && (resource == "services" || resource == "events") {
            controller_total += delta;
        }
        println!(
            "  {verb:<6} {resource}{}{sub}: {delta} ({:.2}/Service){}",
            if sub.is_empty() { "" } else { "/" },
            delta / n as f64,
            if by_test { " [test client]" } else { "" }
        );
    }
    println!(
        "controller writes (services + events): {controller_total} ({:.2}/Service)",
        controller_total / n as f64
    );
    let text = metrics.encode().unwrap();
    for line in text.lines().filter(|l| {
        l.starts_with("aliaslb_reconcile_duration_seconds_count")
            || l.starts_with("aliaslb_reconcile_duration_seconds_sum")
            || l.starts_with("aliaslb_reconcile_errors")
    }) {
        println!("  {line}");
    }
}
