//! Pools beyond the classic format against the real kube-apiserver (1.37; 1.30 too): a
//! namespace with two pools and Services choosing each; a pool shared by list and by label
//! selector, a namespace relabelled gaining and losing it; the tenant fence (another
//! tenant's pool or address refused with a condition and a Warning Event); draining that
//! moves nothing and hands out nothing; `autoAssign: false`; and the pool state the
//! controller writes where `kubectl get` and `kubectl describe` show it, without touching
//! the pool ConfigMap users write. Agents are faked by renewing their Leases from the test.

mod support;

use std::time::Duration;

use aliaslb_core::keys;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Service};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::json;
use support::{Cluster, LbService, SETTLE, eventually, lb_service, serial};

/// The `aliaslb.io/IPAllocated` condition's `(status, reason, message)`, and the
/// AllocationFailed Warning Events' notes, of `namespace/name`.
async fn refused(c: &Cluster, namespace: &str, name: &str, reason: &str) -> (String, Vec<String>) {
    let api = Api::<Service>::namespaced(c.client.clone(), namespace);
    let mut message = String::new();
    eventually(
        SETTLE,
        &format!("{namespace}/{name} {reason}"),
        async || {
            let svc = api.get(name).await.unwrap();
            let found = svc
                .status
                .and_then(|s| s.conditions)
                .into_iter()
                .flatten()
                .find(|c| c.type_ == keys::CONDITION_IP_ALLOCATED);
            match found {
                Some(cond) if cond.status == "False" && cond.reason == reason => {
                    message = cond.message;
                    true
                }
                _ => false,
            }
        },
    )
    .await;
    let mut notes = Vec::new();
    eventually(SETTLE, "the AllocationFailed Warning Event", async || {
        notes = c
            .events(namespace, name)
            .await
            .into_iter()
            .filter(|e| {
                e.reason.as_deref() == Some("AllocationFailed")
                    && e.type_.as_deref() == Some("Warning")
            })
            .filter_map(|e| e.note)
            .collect();
        !notes.is_empty()
    })
    .await;
    (message, notes)
}

/// Creates `builder` in `namespace`.
async fn create_in(c: &Cluster, namespace: &str, builder: LbService) {
    let svc = builder
        .meta(|m| m.namespace = Some(namespace.to_owned()))
        .build();
    Api::<Service>::namespaced(c.client.clone(), namespace)
        .create(&PostParams::default(), &svc)
        .await
        .unwrap();
}

/// The ingress IPs of `namespace/name`.
async fn ips_in(c: &Cluster, namespace: &str, name: &str) -> Vec<String> {
    let svc = Api::<Service>::namespaced(c.client.clone(), namespace)
        .get(name)
        .await
        .unwrap();
    support::ingress(&svc)
        .into_iter()
        .map(|ip| ip.to_string())
        .collect()
}

async fn wait_ips_in(c: &Cluster, namespace: &str, name: &str, want: &[&str]) {
    eventually(
        SETTLE,
        &format!("{namespace}/{name} has {want:?}"),
        async || ips_in(c, namespace, name).await == want,
    )
    .await;
}

/// Labels namespace `name` `tier: web` (`on`) or removes the label.
async fn label(c: &Cluster, name: &str, on: bool) {
    let value = if on { json!("web") } else { json!(null) };
    Api::<Namespace>::all(c.client.clone())
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"tier": value}}})),
        )
        .await
        .unwrap();
}

/// Deletes the Services of the extra namespaces (the cluster's own go in `cleanup`).
async fn cleanup_in(c: &Cluster, namespaces: &[&str]) {
    for ns in namespaces {
        let api = Api::<Service>::namespaced(c.client.clone(), ns);
        for svc in api.list(&Default::default()).await.unwrap().items {
            let _ = api
                .delete(&svc.metadata.name.unwrap_or_default(), &Default::default())
                .await;
        }
    }
    c.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_with_two_pools_and_services_choosing_each() {
    let _serial = serial().await;
    let c = Cluster::new("two-pools").await;
    let config = format!("pools:\n  pool.internal:\n    namespaces: [{}]\n", c.ns);
    c.set_pool(&[
        (c.ns.as_str(), "10.70.0.1-10.70.0.2"),
        ("pool.internal", "10.70.1.1-10.70.1.2"),
        ("config.yaml", config.as_str()),
    ])
    .await;
    let node = c.node("a").await;
    let _agent = c.fake_agent(&node);
    let (_controller, _metrics) = c.start_controller();

    c.create(lb_service("own")).await;
    c.create(lb_service("internal").pool("internal")).await;
    c.wait_ips("own", &["10.70.0.1"], SETTLE).await;
    c.wait_ips("internal", &["10.70.1.1"], SETTLE).await;
    let (_, _, message) = c
        .condition("internal", keys::CONDITION_IP_ALLOCATED)
        .await
        .unwrap();
    assert_eq!(message, "assigned 10.70.1.1 from pool pool.internal");

    // Naming the other pool moves a Service; the name removed, it stays where it is.
    let api = Api::<Service>::namespaced(c.client.clone(), &c.ns);
    let name = |value: serde_json::Value| {
        Patch::Merge(json!({"metadata": {"annotations": {keys::ANNOTATION_POOL: value}}}))
    };
    c.create(lb_service("mover")).await;
    c.wait_ips("mover", &["10.70.0.2"], SETTLE).await;
    api.patch("mover", &PatchParams::default(), &name(json!(c.ns)))
        .await
        .unwrap();
    // Its namespace's own key is no named pool: refused, the address kept.
    let (message, _) = refused(&c, &c.ns, "mover", "UnknownPool").await;
    assert!(
        message.ends_with("; keeping 10.70.0.2 for now"),
        "{message}"
    );
    assert_eq!(c.ips("mover").await, ["10.70.0.2"]);
    api.patch("mover", &PatchParams::default(), &name(json!("internal")))
        .await
        .unwrap();
    c.wait_ips("mover", &["10.70.1.2"], SETTLE).await;
    api.patch("mover", &PatchParams::default(), &name(json!(null)))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(c.ips("mover").await, ["10.70.1.2"], "kept");

    // The CLI reads it as the controller does: both pools, the Service's pool explained.
    let pools = cli(&c, &["pools"]);
    let rows: Vec<Vec<&str>> = pools
        .lines()
        .skip(1)
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        rows,
        [
            vec![c.ns.as_str(), "IPv4", "2", "1", "0", "1", "50.0%", "0"],
            vec!["pool.internal", "IPv4", "2", "2", "0", "0", "100.0%", "0"],
        ],
        "{pools}"
    );
    let explained = cli(&c, &["explain", "svc/mover", "-n", &c.ns]);
    assert!(
        explained.contains("the named pool `pool.internal` (it holds addresses of it)"),
        "{explained}"
    );
    c.cleanup().await;
}

/// `aliaslb ARGS` (the CLI binary) against the test's API server and controller namespace.
fn cli(c: &Cluster, args: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_aliaslb"))
        .args(args)
        .args(["--controller-namespace", &c.system])
        .args(["--agent-namespace", &c.system])
        .env("KUBECONFIG", c.env.kubeconfig_path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "aliaslb {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_pools_by_list_and_by_selector_and_a_relabelled_namespace() {
    let _serial = serial().await;
    let c = Cluster::new("shared").await;
    let listed = c.env.create_namespace(&c.client, "shared-listed").await;
    let selected = c.env.create_namespace(&c.client, "shared-selected").await;
    let config = format!(
        "pools:\n  pool.web:\n    namespaceSelector: {{tier: web}}\n  pool.team:\n    namespaces: [{}, {listed}]\n",
        c.ns
    );
    c.set_pool(&[
        ("pool.web", "10.71.0.1-10.71.0.3"),
        ("pool.team", "10.71.1.1-10.71.1.3"),
        ("config.yaml", config.as_str()),
    ])
    .await;
    let node = c.node("a").await;
    let _agent = c.fake_agent(&node);
    let (_controller, _metrics) = c.start_controller();

    // By list: both namespaces listed draw from it (their default: no key of their own).
    c.create(lb_service("a")).await;
    create_in(&c, &listed, lb_service("b")).await;
    c.wait_ips("a", &["10.71.1.1"], SETTLE).await;
    wait_ips_in(&c, &listed, "b", &["10.71.1.2"]).await;

    // By selector: not labelled, no pool at all; labelled, it gets the pool.
    create_in(&c, &selected, lb_service("web").pool("web")).await;
    let (message, _) = refused(&c, &selected, "web", "PoolNotAllowed").await;
    assert!(message.contains("its labels do not match"), "{message}");
    label(&c, &selected, true).await;
    wait_ips_in(&c, &selected, "web", &["10.71.0.1"]).await;

    // Relabelled: what it holds stays (a label edit never renumbers); nothing new.
    label(&c, &selected, false).await;
    create_in(&c, &selected, lb_service("web2").pool("web")).await;
    let (message, notes) = refused(&c, &selected, "web2", "PoolNotAllowed").await;
    assert!(
        message.contains(&format!(
            "namespace {selected} may not draw new addresses from pool pool.web"
        )),
        "{message}"
    );
    assert!(notes.iter().any(|n| n.contains("pool.web")), "{notes:?}");
    assert_eq!(ips_in(&c, &selected, "web").await, ["10.71.0.1"], "kept");
    // Labelled again: the waiting one gets its address.
    label(&c, &selected, true).await;
    wait_ips_in(&c, &selected, "web2", &["10.71.0.2"]).await;
    assert_eq!(ips_in(&c, &selected, "web").await, ["10.71.0.1"]);
    cleanup_in(&c, &[&listed, &selected]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_asking_for_another_tenants_pool_or_address_is_refused() {
    let _serial = serial().await;
    let c = Cluster::new("fence").await;
    let other = c.env.create_namespace(&c.client, "fence-other").await;
    let config = format!("pools:\n  pool.other:\n    namespaces: [{other}]\n");
    c.set_pool(&[
        (c.ns.as_str(), "10.72.0.1-10.72.0.2"),
        (other.as_str(), "10.72.1.1-10.72.1.2"),
        ("pool.other", "10.72.2.1-10.72.2.2"),
        ("config.yaml", config.as_str()),
    ])
    .await;
    let node = c.node("a").await;
    let _agent = c.fake_agent(&node);
    let (_controller, _metrics) = c.start_controller();

    c.create(lb_service("their-pool").pool("other")).await;
    c.create(lb_service("their-named-ip").request("10.72.2.1"))
        .await;
    c.create(lb_service("their-own-ip").request("10.72.1.1"))
        .await;
    for (name, reason) in [
        ("their-pool", "PoolNotAllowed"),
        ("their-named-ip", "RequestedIPNotInPool"),
        ("their-own-ip", "RequestedIPNotInPool"),
    ] {
        let (message, notes) = refused(&c, &c.ns, name, reason).await;
        assert!(c.ips(name).await.is_empty(), "{name} got an address");
        // The refusal names this tenant's pools only, never the other tenant.
        assert!(!message.contains(&other), "{name}: {message}");
        assert!(notes.iter().all(|n| !n.contains(&other)), "{notes:?}");
    }
    let (message, _) = refused(&c, &c.ns, "their-pool", "PoolNotAllowed").await;
    assert_eq!(
        message,
        format!(
            "namespace {ns} may not draw from pool pool.other; namespace {ns} may draw from {ns}",
            ns = c.ns
        )
    );
    // The other tenant gets them.
    create_in(&c, &other, lb_service("mine").pool("other")).await;
    wait_ips_in(&c, &other, "mine", &["10.72.2.1"]).await;
    cleanup_in(&c, &[&other]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn draining_moves_nothing_and_hands_out_nothing_and_manual_pools_wait_to_be_asked() {
    let _serial = serial().await;
    let c = Cluster::new("drain").await;
    let ns = c.ns.clone();
    c.set_pool(&[(ns.as_str(), "10.73.0.1-10.73.0.2\n10.73.9.1-10.73.9.2")])
        .await;
    let node = c.node("a").await;
    let _agent = c.fake_agent(&node);
    let (_controller, metrics) = c.start_controller();
    c.create(lb_service("a")).await;
    c.create(lb_service("b")).await;
    c.wait_ips("a", &["10.73.0.1"], SETTLE).await;
    c.wait_ips("b", &["10.73.0.2"], SETTLE).await;

    // The old range drains: nothing moves; new Services get the rest.
    c.set_pool(&[(
        ns.as_str(),
        "10.73.0.1-10.73.0.2 draining   # retired\n10.73.9.1-10.73.9.2",
    )])
    .await;
    c.create(lb_service("c")).await;
    c.wait_ips("c", &["10.73.9.1"], SETTLE).await;
    assert_eq!(c.ips("a").await, ["10.73.0.1"]);
    assert_eq!(c.ips("b").await, ["10.73.0.2"]);
    // A freed draining address is handed out to no one, not even on request.
    c.delete("b").await;
    c.create(lb_service("asks").request("10.73.0.2")).await;
    let (message, _) = refused(&c, &ns, "asks", "PoolDraining").await;
    assert!(
        message.starts_with("10.73.0.2 is draining in pool"),
        "{message}"
    );
    c.create(lb_service("d")).await;
    c.wait_ips("d", &["10.73.9.2"], SETTLE).await;
    c.create(lb_service("e")).await;
    let (message, _) = refused(&c, &ns, "e", "PoolExhausted").await;
    // Two: a's, and b's, held for its re-creation.
    assert!(
        message.contains("2 of them are draining (left to move)"),
        "{message}"
    );
    for svc in ["a", "c", "d"] {
        assert!(
            c.events(&ns, svc)
                .await
                .iter()
                .all(|e| e.reason.as_deref() != Some("ClearAssignment")),
            "{svc} was moved"
        );
    }

    // autoAssign: false — only for a Service that names the pool or one of its IPs.
    let config = format!("pools:\n  pool.vip:\n    namespaces: [{ns}]\n    autoAssign: false\n");
    c.set_pool(&[
        (ns.as_str(), "10.73.9.1-10.73.9.2"),
        ("pool.vip", "10.73.5.1-10.73.5.3"),
        ("config.yaml", config.as_str()),
    ])
    .await;
    c.create(lb_service("vip").pool("vip")).await;
    c.create(lb_service("vip-ip").request("10.73.5.3")).await;
    c.wait_ips("vip", &["10.73.5.1"], SETTLE).await;
    c.wait_ips("vip-ip", &["10.73.5.3"], SETTLE).await;
    // The unasked one still waits on its own (full) key, not on the manual pool.
    let (message, _) = refused(&c, &ns, "e", "PoolExhausted").await;
    assert!(message.contains(&format!("pool {ns}")), "{message}");
    // One asking the manual pool once it is full waits on it, and its pending series
    // says that pool, not the namespace's own.
    c.create(lb_service("vip2").pool("vip")).await;
    c.wait_ips("vip2", &["10.73.5.2"], SETTLE).await;
    c.create(lb_service("vip3").pool("vip")).await;
    let (message, _) = refused(&c, &ns, "vip3", "PoolExhausted").await;
    assert!(message.contains("pool pool.vip"), "{message}");
    let series = |pool: &str| {
        format!(
            "aliaslb_services_pending_seconds{{namespace=\"{ns}\",pool=\"{pool}\",reason=\"PoolExhausted\"}}"
        )
    };
    eventually(SETTLE, "vip3 pending on pool.vip", async || {
        support::metric(&metrics, &series("pool.vip")).is_some()
    })
    .await;
    c.cleanup().await;
}

/// `kubectl` against the test's API server; its stdout.
fn kubectl(c: &Cluster, args: &[&str]) -> String {
    c.env.kubectl(args)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pool_state_shows_in_kubectl_get_and_describe_and_the_pool_configmap_is_left_alone() {
    let _serial = serial().await;
    let c = Cluster::new("state").await;
    let ns = c.ns.clone();
    let config = format!("pools:\n  pool.shared:\n    namespaces: [{ns}]\n");
    c.set_pool(&[
        (ns.as_str(), "10.74.0.1\n10.74.0.2 draining"),
        ("pool.shared", "10.74.1.1-10.74.1.4"),
        ("config.yaml", config.as_str()),
    ])
    .await;
    let cms = Api::<ConfigMap>::namespaced(c.client.clone(), &c.system);
    let before = cms.get(keys::DEFAULT_POOL_CONFIGMAP).await.unwrap();
    let node = c.node("a").await;
    let _agent = c.fake_agent(&node);
    let (_controller, _metrics) = c.start_controller();
    c.create(lb_service("a")).await;
    c.create(lb_service("waits")).await;
    c.create(lb_service("shared").pool("shared")).await;
    c.wait_ips("a", &["10.74.0.1"], SETTLE).await;
    c.wait_ips("shared", &["10.74.1.1"], SETTLE).await;

    let status = "aliaslb-pools-status";
    let want = format!(
        "IPv4: {{size: 1, used: 1, free: 0, draining: 0}}\npending: 1\npendingServices: [{ns}/waits]\n"
    );
    // Written at most every 2 s: the state of the moment comes within that.
    eventually(SETTLE, "the pool state", async || {
        let data = cms
            .get_opt(status)
            .await
            .unwrap()
            .and_then(|cm| cm.data)
            .unwrap_or_default();
        data.get(ns.as_str()) == Some(&want)
            && data
                .get("pool.shared")
                .is_some_and(|s| s.contains("used: 1"))
    })
    .await;
    let yaml = kubectl(
        &c,
        &["get", "configmap", "-n", &c.system, status, "-o", "yaml"],
    );
    assert!(yaml.contains("state: valid"), "{yaml}");
    assert!(yaml.contains("lastEditInForce: true"), "{yaml}");
    assert!(
        yaml.contains("IPv4: {size: 4, used: 1, free: 3, draining: 0}"),
        "{yaml}"
    );
    assert!(yaml.contains(&format!("namespaces: [{ns}]")), "{yaml}");
    let described = kubectl(&c, &["describe", "configmap", "-n", &c.system, status]);
    println!("$ kubectl describe configmap -n aliaslb-system {status}\n{described}");
    assert!(described.contains("pool.shared:\n----\n"), "{described}");
    assert!(
        described.contains("config:\n----\nstate: valid"),
        "{described}"
    );

    // An invalid edit: the state says the last valid config stays, with the first error.
    c.set_pool(&[(ns.as_str(), "10.74.0.1\n10.74.0.300")]).await;
    eventually(SETTLE, "the invalid edit shown", async || {
        let data = cms.get(status).await.unwrap().data.unwrap_or_default();
        data.get("config")
            .is_some_and(|c| c.contains("state: invalid"))
    })
    .await;
    let data = cms.get(status).await.unwrap().data.unwrap();
    let config = &data["config"];
    assert!(config.contains("lastEditInForce: false"), "{config}");
    assert!(
        config.contains(&format!("- \"key {ns}, line 2:")),
        "{config}"
    );
    assert!(
        data.contains_key("pool.shared"),
        "the pools in force stay shown"
    );

    // The pool ConfigMap users write is never written by the controller: no field of
    // ours in it, no version but the test's own edits.
    let after = cms.get(keys::DEFAULT_POOL_CONFIGMAP).await.unwrap();
    let managers: Vec<String> = after
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter_map(|f| f.manager)
        .collect();
    assert_eq!(managers, ["test"], "only the test wrote it");
    assert_eq!(
        after.metadata.annotations, before.metadata.annotations,
        "no annotation added"
    );
    let written = cms.get(status).await.unwrap();
    let managers: Vec<String> = written
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter_map(|f| f.manager)
        .collect();
    assert_eq!(managers, ["aliaslb-pool-status"]);
    c.cleanup().await;
}
