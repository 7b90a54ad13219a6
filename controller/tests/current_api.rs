//! What a current kube-apiserver (1.30+) has and 1.20 lacked, against the real server of
//! `aliaslb-testenv` with fake agents: `externalTrafficPolicy: Local` elected from
//! `discovery.k8s.io/v1` EndpointSlices (ready, then serving-but-terminating endpoints),
//! `spec.loadBalancerClass` (ours, another, none), and the Service conditions as the server
//! stores and validates them.

mod support;

use std::time::Duration;

use aliaslb_core::keys;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use support::{Cluster, SETTLE, eventually, lb_service, serial};

/// Writes (server-side apply) the EndpointSlice `web-1` of Service `web` with one endpoint per
/// `(node, ready, serving, terminating)`, as the EndpointSlice controller writes them for pods.
async fn endpoints(c: &Cluster, endpoints: &[(&str, bool, bool, bool)]) {
    let endpoints: Vec<serde_json::Value> = endpoints
        .iter()
        .enumerate()
        .map(|(i, (node, ready, serving, terminating))| {
            json!({
                "addresses": [format!("10.244.0.{}", i + 10)],
                "nodeName": node,
                "conditions": {"ready": ready, "serving": serving, "terminating": terminating},
            })
        })
        .collect();
    let slice = json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "web-1", "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4",
        "endpoints": endpoints,
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    });
    Api::<EndpointSlice>::namespaced(c.client.clone(), &c.ns)
        .patch(
            "web-1",
            &PatchParams::apply("test").force(),
            &Patch::Apply(slice),
        )
        .await
        .unwrap();
}

/// `web`'s `aliaslb.io/node` once it equals `want` (`None`: no node).
async fn placed_on(c: &Cluster, want: Option<&str>, what: &str) {
    eventually(SETTLE, what, async || {
        support::annotation(&c.get("web").await, keys::ANNOTATION_NODE) == want
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_service_follows_its_ready_then_its_serving_endpoints() {
    let _serial = serial().await;
    let c = Cluster::new("etp-local").await;
    c.set_pool(&[(c.ns.as_str(), "10.70.0.1-10.70.0.4")]).await;
    let n1 = c.node("n1").await;
    let n2 = c.node("n2").await;
    let _a1 = c.fake_agent(&n1);
    let _a2 = c.fake_agent(&n2);
    let (_controller, _metrics) = c.start_controller();
    endpoints(&c, &[(&n1, true, true, false)]).await;
    c.create(lb_service("web").spec(|s| s.external_traffic_policy = Some("Local".into())))
        .await;
    placed_on(&c, Some(&n1), "web on n1, its only ready endpoint").await;

    // A rolling update: n1's pod terminates (still serving), n2's new pod is ready. The IP
    // goes where kube-proxy answers with a ready pod.
    endpoints(&c, &[(&n1, false, true, true), (&n2, true, true, false)]).await;
    placed_on(&c, Some(&n2), "web moves to n2, the ready endpoint").await;

    // Every pod terminating but serving (a one-replica update, a drain): kube-proxy still
    // sends a node's Local traffic to them, so their node keeps the IP.
    endpoints(&c, &[(&n2, false, true, true)]).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    placed_on(&c, Some(&n2), "web stays on n2 while its pod still serves").await;
    endpoints(&c, &[(&n1, false, true, true)]).await;
    placed_on(&c, Some(&n1), "web follows the serving endpoint to n1").await;

    // No longer serving anywhere: no eligible node, and the condition says so.
    endpoints(&c, &[(&n1, false, false, true)]).await;
    let message = c
        .wait_condition("web", keys::CONDITION_ANNOUNCED, "NoEligibleNode")
        .await;
    eprintln!("no serving endpoint: {message}");
    assert!(c.ips("web").await.len() == 1, "the IP stays allocated");
    c.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_balancer_class_ours_others_and_none() {
    let _serial = serial().await;
    let c = Cluster::new("lbclass").await;
    c.set_pool(&[(c.ns.as_str(), "10.71.0.1-10.71.0.4")]).await;
    let n1 = c.node("n1").await;
    let _a1 = c.fake_agent(&n1);
    let (_controller, _metrics) = c.start_controller();
    c.create(
        lb_service("ours")
            .spec(|s| s.load_balancer_class = Some(keys::DEFAULT_LOAD_BALANCER_CLASS.into())),
    )
    .await;
    c.create(
        lb_service("theirs").spec(|s| s.load_balancer_class = Some("example.com/other".into())),
    )
    .await;
    c.create(lb_service("classless")).await;

    // The server keeps the class (1.20 dropped the field).
    let ours = c.get("ours").await;
    assert_eq!(
        ours.spec
            .as_ref()
            .and_then(|s| s.load_balancer_class.as_deref()),
        Some(keys::DEFAULT_LOAD_BALANCER_CLASS)
    );
    eventually(SETTLE, "ours and the classless one get IPs", async || {
        c.ips("ours").await.len() == 1 && c.ips("classless").await.len() == 1
    })
    .await;
    c.wait_condition("ours", keys::CONDITION_ANNOUNCED, "Announced")
        .await;
    // Another implementation's Service: not a field of it is ours, ever.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let theirs = c.get("theirs").await;
    assert!(c.ips("theirs").await.is_empty(), "another class got an IP");
    assert!(
        theirs
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .is_empty(),
        "another class's Service got conditions"
    );
    assert!(
        support::annotation(&c.get("theirs").await, keys::ANNOTATION_NODE).is_none(),
        "another class's Service got our annotation"
    );
    let managers: Vec<String> = c
        .get("theirs")
        .await
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter_map(|m| m.manager)
        .collect();
    assert!(
        !managers.iter().any(|m| m == keys::CONTROLLER_FIELD_MANAGER),
        "the controller wrote to another class's Service: {managers:?}"
    );
    c.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conditions_as_a_current_server_stores_them() {
    let _serial = serial().await;
    let c = Cluster::new("conds").await;
    c.set_pool(&[(c.ns.as_str(), "10.72.0.1")]).await;
    let n1 = c.node("n1").await;
    let _a1 = c.fake_agent(&n1);
    let (_controller, _metrics) = c.start_controller();
    c.create(lb_service("web")).await;
    c.wait_condition("web", keys::CONDITION_ANNOUNCED, "Announced")
        .await;
    c.create(lb_service("late")).await;
    c.wait_condition("late", keys::CONDITION_IP_ALLOCATED, "PoolExhausted")
        .await;
    for name in ["web", "late"] {
        let svc = c.get(name).await;
        let generation = svc.metadata.generation;
        let conditions = svc.status.and_then(|s| s.conditions).unwrap_or_default();
        for type_ in [keys::CONDITION_IP_ALLOCATED, keys::CONDITION_ANNOUNCED] {
            let condition = conditions
                .iter()
                .find(|cond| cond.type_ == type_)
                .unwrap_or_else(|| panic!("{name}: no {type_} in {conditions:?}"));
            // What metav1.Condition validation requires, as stored by the server.
            assert!(["True", "False", "Unknown"].contains(&condition.status.as_str()));
            assert!(!condition.reason.is_empty() && condition.reason.len() <= 1024);
            assert!(
                condition
                    .reason
                    .chars()
                    .all(|ch| ch.is_ascii_alphanumeric() || ",:_".contains(ch)),
                "{name}: reason {:?}",
                condition.reason
            );
            assert!(condition.message.len() <= 32768);
            assert_eq!(
                condition.observed_generation, generation,
                "{name}: {type_} observes the Service's generation"
            );
            assert!(condition.last_transition_time.0.as_second() > 0);
        }
    }
    // A spec change bumps the generation: the conditions follow it.
    let api = Api::<k8s_openapi::api::core::v1::Service>::namespaced(c.client.clone(), &c.ns);
    api.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(
            json!({"spec": {"ports": [{"name": "http", "port": 81, "protocol": "TCP"}]}}),
        ),
    )
    .await
    .unwrap();
    eventually(
        SETTLE,
        "conditions observe the new generation",
        async || {
            let svc = c.get("web").await;
            let generation = svc.metadata.generation;
            svc.status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .all(|cond| cond.observed_generation == generation)
        },
    )
    .await;
    c.cleanup().await;
}
