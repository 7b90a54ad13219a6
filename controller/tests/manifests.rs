//! Acceptance of the install manifests (`manifests/`, applied with `kubectl apply -k`) against
//! the real kube-apiserver of `aliaslb-testenv`: every object is really created, the RBAC of
//! both ServiceAccounts is checked exactly (allowed and denied, by access review and by real
//! calls made as the ServiceAccount), the Deployment's flags parse with the controller's own
//! parser, the example pool ConfigMap parses, and the Dockerfile copies real binaries.
//!
//! Needs `kubectl` on PATH (it is what users install with) and the testenv binaries.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use aliaslb_controller::config::Flags;
use aliaslb_core::pool::PoolConfig;
use aliaslb_testenv::{TestEnv, TokenBinding, fixtures};
use clap::Parser;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Container, Node, Pod, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

const NAMESPACE: &str = "aliaslb-system";
const AGENT_NAMESPACE: &str = "aliaslb-agents";
const CONTROLLER_SA: &str = "aliaslb-controller";
const AGENT_SA: &str = "aliaslb-agent";
const IMAGE: &str = "ghcr.io/aliaslb/aliaslb:0.1.0";

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("controller/ has a parent")
        .to_owned()
}

fn read(relative: &str) -> String {
    let path = repo_root().join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// The shared environment with `kubectl apply -k manifests/` done once per test binary (the
/// manifests create the fixed namespace `aliaslb-system`).
fn installed() -> &'static TestEnv {
    static APPLIED: OnceLock<String> = OnceLock::new();
    let env = TestEnv::global();
    APPLIED.get_or_init(|| {
        let dir = repo_root().join("manifests");
        env.kubectl(&["apply", "-k", &dir.display().to_string()])
    });
    env
}

/// Whether the client's user may `verb` the `resource` (`name` or `name/subresource`) of
/// API `group` in `namespace` (`None`: cluster-wide), by SelfSubjectAccessReview.
async fn can(client: &Client, verb: &str, group: &str, resource: &str, ns: Option<&str>) -> bool {
    let (resource, subresource) = match resource.split_once('/') {
        Some((r, s)) => (r, Some(s.to_owned())),
        None => (resource, None),
    };
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                verb: Some(verb.to_owned()),
                group: Some(group.to_owned()),
                resource: Some(resource.to_owned()),
                subresource,
                namespace: ns.map(str::to_owned),
                ..ResourceAttributes::default()
            }),
            ..SelfSubjectAccessReviewSpec::default()
        },
        ..SelfSubjectAccessReview::default()
    };
    let answer = Api::<SelfSubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .unwrap_or_else(|e| panic!("SelfSubjectAccessReview {verb} {resource}: {e}"));
    answer.status.expect("access review has a status").allowed
}

/// One access check: verbs, group, resource, namespace (`None` = cluster-wide), expected.
type Case = (
    &'static [&'static str],
    &'static str,
    &'static str,
    Option<&'static str>,
    bool,
);

/// Checks every case and reports all mismatches at once.
async fn check_access(client: &Client, who: &str, cases: &[Case]) {
    let mut wrong = Vec::new();
    for &(verbs, group, resource, ns, want) in cases {
        for verb in verbs {
            let got = can(client, verb, group, resource, ns).await;
            if got != want {
                let scope = ns.unwrap_or("<cluster>");
                let group = if group.is_empty() { "core" } else { group };
                wrong.push(format!(
                    "{who} {verb} {group}/{resource} in {scope}: allowed={got}, want {want}"
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "RBAC mismatches:\n{}", wrong.join("\n"));
}

/// A client with the ServiceAccount token of an agent pod on Node `node` (both made here; no
/// kubelet runs the pod, only its token matters), as the DaemonSet's agent there has.
async fn agent_pod_client(env: &TestEnv, node: &str) -> Client {
    let admin = env.client().await;
    let made: Node = serde_json::from_value(json!({"metadata": {"name": node}})).unwrap();
    match Api::<Node>::all(admin.clone())
        .create(&PostParams::default(), &made)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        Err(e) => panic!("creating Node {node}: {e}"),
    }
    let name = format!("aliaslb-agent-{node}");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "serviceAccountName": AGENT_SA,
            "containers": [{"name": "agent", "image": IMAGE}],
        },
    }))
    .unwrap();
    let pods = Api::<Pod>::namespaced(admin, NAMESPACE);
    if pods.get_opt(&name).await.unwrap().is_none() {
        pods.create(&PostParams::default(), &pod).await.unwrap();
    }
    env.token_client(NAMESPACE, AGENT_SA, Some(TokenBinding::Pod(&name)))
        .await
}

const READ: &[&str] = &["get", "list", "watch"];
const ALL_WRITES: &[&str] = &["create", "update", "patch", "delete", "deletecollection"];
const SYS: Option<&str> = Some(NAMESPACE);
const AGENTS: Option<&str> = Some(AGENT_NAMESPACE);
const DEFAULT: Option<&str> = Some("default");

#[tokio::test]
async fn every_manifest_is_created() {
    let env = installed();
    // `kubectl get -k` looks up every object kustomize renders: it fails if one is missing.
    let dir = repo_root().join("manifests");
    let out = env.kubectl(&["get", "-k", &dir.display().to_string(), "-o", "name"]);
    let mut names: Vec<&str> = out.lines().collect();
    names.sort_unstable();
    // `kubectl get -o name` does not say the namespace: the two Roles `aliaslb-agent` are in
    // aliaslb-agents (its Lease) and aliaslb-system is `aliaslb-agent-assignments`; the two
    // `aliaslb-controller` Roles are in aliaslb-system and aliaslb-agents.
    let want = [
        "clusterrole.rbac.authorization.k8s.io/aliaslb-controller",
        "clusterrolebinding.rbac.authorization.k8s.io/aliaslb-controller",
        "configmap/aliaslb-pools",
        "daemonset.apps/aliaslb-agent",
        "deployment.apps/aliaslb-controller",
        "namespace/aliaslb-agents",
        "namespace/aliaslb-system",
        "poddisruptionbudget.policy/aliaslb-controller",
        "resourcequota/aliaslb-agent-leases",
        "role.rbac.authorization.k8s.io/aliaslb-agent",
        "role.rbac.authorization.k8s.io/aliaslb-agent-assignments",
        "role.rbac.authorization.k8s.io/aliaslb-controller",
        "role.rbac.authorization.k8s.io/aliaslb-controller",
        "rolebinding.rbac.authorization.k8s.io/aliaslb-agent",
        "rolebinding.rbac.authorization.k8s.io/aliaslb-agent-assignments",
        "rolebinding.rbac.authorization.k8s.io/aliaslb-controller",
        "rolebinding.rbac.authorization.k8s.io/aliaslb-controller",
        "serviceaccount/aliaslb-agent",
        "serviceaccount/aliaslb-controller",
        "validatingadmissionpolicy.admissionregistration.k8s.io/aliaslb-agent-own-lease",
        "validatingadmissionpolicybinding.admissionregistration.k8s.io/aliaslb-agent-own-lease",
    ];
    assert_eq!(names, want);
    let client = env.client().await;
    let sa = Api::<ServiceAccount>::namespaced(client, NAMESPACE);
    for name in [CONTROLLER_SA, AGENT_SA] {
        assert!(
            sa.get_opt(name).await.unwrap().is_some(),
            "ServiceAccount {name}"
        );
    }
}

#[tokio::test]
async fn controller_deployment_flags_parse_and_match_its_ports() {
    let client = installed().client().await;
    let deploy = Api::<Deployment>::namespaced(client, NAMESPACE)
        .get("aliaslb-controller")
        .await
        .unwrap();
    let spec = deploy.spec.unwrap();
    assert_eq!(spec.replicas, Some(2));
    let pod = spec.template.spec.unwrap();
    assert_eq!(pod.service_account_name.as_deref(), Some(CONTROLLER_SA));
    let c = only_container(pod.containers);
    assert_eq!(c.image.as_deref(), Some(IMAGE));

    // The flags in the manifest are accepted by the controller's real parser.
    let argv: Vec<String> = c
        .command
        .clone()
        .unwrap()
        .into_iter()
        .chain(c.args.clone().unwrap())
        .collect();
    assert_eq!(argv[0], "/usr/local/bin/aliaslb-controller");
    let flags = Flags::try_parse_from(&argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
    assert_eq!(flags.namespace, NAMESPACE, "POD_NAMESPACE default");
    let port = i32::from(flags.metrics_addr.port());

    let metrics = c
        .ports
        .as_ref()
        .unwrap()
        .iter()
        .find(|p| p.name.as_deref() == Some("metrics"));
    assert_eq!(metrics.map(|p| p.container_port), Some(port));
    let env: Vec<_> = c
        .env
        .as_ref()
        .unwrap()
        .iter()
        .map(|e| (e.name.as_str(), e.value.as_deref()))
        .collect();
    // The two from the downward API, and one glibc malloc arena (the memory figures in
    // BENCHMARKS.md are measured with it).
    assert_eq!(
        env,
        [
            ("POD_NAMESPACE", None),
            ("POD_NAME", None),
            ("MALLOC_ARENA_MAX", Some("1"))
        ]
    );
    for (probe, path) in [
        (&c.liveness_probe, "/healthz"),
        (&c.readiness_probe, "/readyz"),
    ] {
        let get = probe
            .as_ref()
            .and_then(|p| p.http_get.as_ref())
            .expect("http probe");
        assert_eq!(get.path.as_deref(), Some(path));
        assert_eq!(
            get.port,
            k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String("metrics".into())
        );
    }

    let sc = c.security_context.unwrap();
    assert_eq!(sc.allow_privilege_escalation, Some(false));
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(sc.capabilities.unwrap().drop, Some(vec!["ALL".to_owned()]));
    let psc = pod.security_context.unwrap();
    assert_eq!(psc.run_as_non_root, Some(true));
    assert_eq!(psc.seccomp_profile.unwrap().type_, "RuntimeDefault");
    let limits = c.resources.unwrap().limits.unwrap();
    assert!(limits.contains_key("memory"), "memory limit");

    // The PodDisruptionBudget keeps a replica through voluntary disruptions, and lets one go.
    let pdb = Api::<PodDisruptionBudget>::namespaced(installed().client().await, NAMESPACE)
        .get("aliaslb-controller")
        .await
        .unwrap()
        .spec
        .unwrap();
    assert_eq!(
        pdb.selector.and_then(|s| s.match_labels),
        spec.selector.match_labels,
        "the PDB selects the controller's pods"
    );
    assert_eq!(
        pdb.min_available,
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(1))
    );
}

#[tokio::test]
async fn agent_daemonset_matches_the_agent_defaults() {
    let client = installed().client().await;
    let ds = Api::<DaemonSet>::namespaced(client, NAMESPACE)
        .get("aliaslb-agent")
        .await
        .unwrap();
    let pod = ds.spec.unwrap().template.spec.unwrap();
    assert_eq!(pod.host_network, Some(true));
    assert_eq!(pod.service_account_name.as_deref(), Some(AGENT_SA));
    assert_eq!(
        pod.priority_class_name.as_deref(),
        Some("system-node-critical")
    );
    let c = only_container(pod.containers);
    assert_eq!(c.image.as_deref(), Some(IMAGE));
    assert_eq!(
        c.command,
        Some(vec!["/usr/local/bin/aliaslb-agent".to_owned()])
    );

    let sc = c.security_context.unwrap();
    let caps = sc.capabilities.unwrap();
    assert_eq!(caps.drop, Some(vec!["ALL".to_owned()]));
    assert_eq!(
        caps.add,
        Some(vec!["NET_ADMIN".to_owned(), "NET_RAW".to_owned()])
    );
    assert_eq!(sc.read_only_root_filesystem, Some(true));
    assert_eq!(sc.allow_privilege_escalation, Some(false));

    let env_names: Vec<_> = c
        .env
        .as_ref()
        .unwrap()
        .iter()
        .map(|e| e.name.as_str())
        .collect();
    assert_eq!(
        env_names,
        ["NODE_NAME", "POD_NAMESPACE", "MALLOC_ARENA_MAX"]
    );
    // One glibc arena, as the controller: what the agent's memory figures were measured with.
    let arenas = c
        .env
        .as_ref()
        .unwrap()
        .iter()
        .find(|e| e.name == "MALLOC_ARENA_MAX");
    assert_eq!(arenas.and_then(|e| e.value.as_deref()), Some("1"));

    // The agent crate is not a dependency here: read its flag defaults from its source, so a
    // changed default fails this test instead of silently breaking the probe or the grace period.
    let config = read("agent/src/config.rs");
    let default_of = |var: &str| -> String {
        let line = config
            .lines()
            .find(|l| l.contains(&format!("env = \"{var}\"")))
            .unwrap_or_else(|| panic!("agent/src/config.rs has no flag with env {var}"));
        let value = line
            .split("default_value = \"")
            .nth(1)
            .expect("default_value");
        value[..value.find('"').unwrap()].to_owned()
    };
    let metrics_port: i32 = default_of("ALIASLB_METRICS_ADDR")
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let args = c.args.clone().unwrap_or_default();
    assert!(
        args.contains(&format!("--metrics-addr=0.0.0.0:{metrics_port}")),
        "{args:?}"
    );
    let port = c
        .ports
        .as_ref()
        .unwrap()
        .iter()
        .find(|p| p.name.as_deref() == Some("metrics"));
    assert_eq!(port.map(|p| p.container_port), Some(metrics_port));
    let probe = c.liveness_probe.unwrap().http_get.unwrap();
    assert_eq!(probe.path.as_deref(), Some("/healthz"));
    // Ready once synced and reported: what paces the DaemonSet's rolling update.
    let ready = c.readiness_probe.unwrap().http_get.unwrap();
    assert_eq!(ready.path.as_deref(), Some("/readyz"));
    assert_eq!(
        ready.port,
        k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String("metrics".into())
    );

    let shutdown =
        humantime::parse_duration(&default_of("ALIASLB_AGENT_SHUTDOWN_TIMEOUT")).unwrap();
    let grace = pod.termination_grace_period_seconds.expect("grace period");
    assert!(
        u64::try_from(grace).unwrap() > shutdown.as_secs(),
        "terminationGracePeriodSeconds {grace} must exceed the agent's --shutdown-timeout {shutdown:?}"
    );
}

fn only_container(containers: Vec<Container>) -> Container {
    assert_eq!(containers.len(), 1, "one container");
    containers.into_iter().next().unwrap()
}

#[tokio::test]
async fn controller_rbac_is_exact() {
    let env = installed();
    let client = env.service_account_client(NAMESPACE, CONTROLLER_SA).await;
    let cases: &[Case] = &[
        (READ, "", "services", None, true),
        (&["patch"], "", "services", DEFAULT, true),
        (
            &["create", "update", "delete", "deletecollection"],
            "",
            "services",
            DEFAULT,
            false,
        ),
        (&["patch"], "", "services/status", DEFAULT, true),
        (&["update"], "", "services/status", DEFAULT, false),
        (READ, "", "nodes", None, true),
        (
            &["create", "update", "patch", "delete"],
            "",
            "nodes",
            None,
            false,
        ),
        (&["patch", "update"], "", "nodes/status", None, false),
        // Namespace labels, for named pools that select namespaces: list and watch only.
        (&["list", "watch"], "", "namespaces", None, true),
        (
            &["get", "create", "update", "patch", "delete"],
            "",
            "namespaces",
            None,
            false,
        ),
        (READ, "", "endpoints", None, true),
        (ALL_WRITES, "", "endpoints", DEFAULT, false),
        (READ, "discovery.k8s.io", "endpointslices", None, true),
        (READ, "networking.k8s.io", "servicecidrs", None, true),
        (ALL_WRITES, "networking.k8s.io", "servicecidrs", None, false),
        (
            ALL_WRITES,
            "discovery.k8s.io",
            "endpointslices",
            DEFAULT,
            false,
        ),
        (&["create", "patch"], "", "events", DEFAULT, true),
        (
            &["create", "patch"],
            "events.k8s.io",
            "events",
            DEFAULT,
            true,
        ),
        (&["delete", "update"], "", "events", DEFAULT, false),
        (READ, "", "configmaps", SYS, true),
        // The node assignments: server-side apply (patch; create for a node's first).
        (&["create", "patch"], "", "configmaps", SYS, true),
        (
            &["update", "delete", "deletecollection"],
            "",
            "configmaps",
            SYS,
            false,
        ),
        (READ, "", "configmaps", DEFAULT, false),
        (&["list"], "", "configmaps", None, false),
        (ALL_WRITES, "", "configmaps", AGENTS, false),
        // Its leader Lease.
        (
            &["get", "create", "update"],
            "coordination.k8s.io",
            "leases",
            SYS,
            true,
        ),
        (
            &["list", "watch", "patch", "delete"],
            "coordination.k8s.io",
            "leases",
            SYS,
            false,
        ),
        // The agents' heartbeats: read only.
        (READ, "coordination.k8s.io", "leases", AGENTS, true),
        (ALL_WRITES, "coordination.k8s.io", "leases", AGENTS, false),
        (
            &["get", "create"],
            "coordination.k8s.io",
            "leases",
            DEFAULT,
            false,
        ),
        (&["create", "get"], "", "pods", DEFAULT, false),
        (&["get", "list"], "", "secrets", SYS, false),
        (&["list"], "", "secrets", None, false),
    ];
    check_access(&client, CONTROLLER_SA, cases).await;
}

#[tokio::test]
async fn agent_rbac_is_exact() {
    let env = installed();
    let client = env.service_account_client(NAMESPACE, AGENT_SA).await;
    let cases: &[Case] = &[
        // No Service, no Node: it acts on its assignment object only.
        (READ, "", "services", None, false),
        (READ, "", "services", DEFAULT, false),
        (ALL_WRITES, "", "services", DEFAULT, false),
        (&["patch", "update"], "", "services/status", DEFAULT, false),
        (READ, "", "nodes", None, false),
        (
            &["create", "update", "patch", "delete"],
            "",
            "nodes",
            None,
            false,
        ),
        // Its heartbeat, in the agents' namespace.
        (
            &["get", "create", "patch", "delete"],
            "coordination.k8s.io",
            "leases",
            AGENTS,
            true,
        ),
        (
            &["list", "watch", "update", "deletecollection"],
            "coordination.k8s.io",
            "leases",
            AGENTS,
            false,
        ),
        // No write right at all where the leader Lease, the pools and the assignments are.
        (READ, "coordination.k8s.io", "leases", SYS, false),
        (ALL_WRITES, "coordination.k8s.io", "leases", SYS, false),
        (
            &["get", "create"],
            "coordination.k8s.io",
            "leases",
            DEFAULT,
            false,
        ),
        (READ, "", "configmaps", SYS, true),
        (ALL_WRITES, "", "configmaps", SYS, false),
        (READ, "", "configmaps", DEFAULT, false),
        (&["create", "patch"], "", "events", DEFAULT, false),
        (
            &["create", "patch"],
            "events.k8s.io",
            "events",
            DEFAULT,
            false,
        ),
        (READ, "", "endpoints", None, false),
        (&["create", "get"], "", "pods", DEFAULT, false),
        (&["get", "list"], "", "secrets", SYS, false),
    ];
    check_access(&client, AGENT_SA, cases).await;
}

/// A LoadBalancer Service created by the admin in a fresh namespace.
async fn lb_service(env: &TestEnv, hint: &str) -> (String, Service) {
    let admin = env.client().await;
    let ns = env.create_namespace(&admin, hint).await;
    let svc = fixtures::lb_service(&ns, "web")
        .meta(|m| m.uid = None)
        .build();
    let svc = Api::<Service>::namespaced(admin, &ns)
        .create(&PostParams::default(), &svc)
        .await
        .unwrap();
    (ns, svc)
}

fn status_patch(ip: &str) -> Patch<serde_json::Value> {
    Patch::Merge(json!({"status": {"loadBalancer": {"ingress": [{"ip": ip}]}}}))
}

fn is_forbidden(result: Result<impl std::fmt::Debug, kube::Error>) -> bool {
    matches!(result, Err(kube::Error::Api(ref s)) if s.code == 403)
}

#[tokio::test]
async fn controller_really_writes_status_and_reads_only_its_pools() {
    let env = installed();
    let (ns, _) = lb_service(env, "rbac-controller").await;
    let client = env.service_account_client(NAMESPACE, CONTROLLER_SA).await;
    let services = Api::<Service>::namespaced(client.clone(), &ns);

    let patched = services
        .patch_status(
            "web",
            &PatchParams::default(),
            &status_patch("192.168.55.10"),
        )
        .await
        .unwrap();
    let ingress = patched
        .status
        .unwrap()
        .load_balancer
        .unwrap()
        .ingress
        .unwrap();
    assert_eq!(ingress[0].ip.as_deref(), Some("192.168.55.10"));
    let annotate = Patch::Merge(json!({"metadata": {"annotations": {"aliaslb.io/node": "n1"}}}));
    services
        .patch("web", &PatchParams::default(), &annotate)
        .await
        .unwrap();
    assert!(is_forbidden(
        services.delete("web", &DeleteParams::default()).await
    ));

    let pools = Api::<ConfigMap>::namespaced(client.clone(), NAMESPACE);
    assert!(pools.get("aliaslb-pools").await.unwrap().data.is_some());
    let elsewhere = Api::<ConfigMap>::namespaced(client.clone(), &ns);
    assert!(is_forbidden(elsewhere.get_opt("aliaslb-pools").await));
    // A node assignment, as the controller writes it: server-side apply creates it, and
    // updates it. RBAC cannot narrow `patch` to a name prefix, so the controller could also
    // patch the pool ConfigMap; it never deletes anything there.
    let name = "aliaslb-node-rbac-node";
    let assignment = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": name, "labels": {"aliaslb.io/node-assignment": "true"}},
        "data": {"ips": "192.168.55.10 - tcp:80 default/web\n"},
    });
    let apply = PatchParams::apply("aliaslb-controller").force();
    pools
        .patch(name, &apply, &Patch::Apply(&assignment))
        .await
        .unwrap();
    pools
        .patch(name, &apply, &Patch::Apply(&assignment))
        .await
        .unwrap();
    assert!(is_forbidden(
        pools.delete(name, &DeleteParams::default()).await
    ));
    assert!(is_forbidden(
        elsewhere
            .patch(name, &apply, &Patch::Apply(&assignment))
            .await
    ));
}

#[tokio::test]
async fn agent_cannot_write_services_but_keeps_its_lease() {
    let env = installed();
    let (ns, _) = lb_service(env, "rbac-agent").await;
    // The Lease quota of manifests/ is counted by kube-controller-manager (the apiserver
    // refuses a Lease while the quota has no usage yet), and the agent Lease policy wants a
    // token bound to the agent's node: as the DaemonSet's pod on node rbac-node has.
    let _kcm = env.start_controller_manager().await.unwrap();
    let client = agent_pod_client(env, "rbac-node").await;
    let services = Api::<Service>::namespaced(client.clone(), &ns);

    assert!(is_forbidden(services.get("web").await));
    let steer = Patch::Merge(json!({"metadata": {"annotations": {"aliaslb.io/node": "evil"}}}));
    assert!(is_forbidden(
        services.patch("web", &PatchParams::default(), &steer).await
    ));
    assert!(is_forbidden(
        services
            .patch_status(
                "web",
                &PatchParams::default(),
                &status_patch("192.168.55.11")
            )
            .await
    ));

    let leases = Api::<Lease>::namespaced(client.clone(), AGENT_NAMESPACE);
    let name = "aliaslb-agent-rbac-node";
    let lease: Lease = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"holderIdentity": "rbac-node", "leaseDurationSeconds": 4},
    }))
    .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while let Err(e) = leases.create(&PostParams::default(), &lease).await {
        // Until the quota controller counted the namespace, and the policy is compiled.
        assert!(
            std::time::Instant::now() < deadline,
            "creating its Lease: {e}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let renew = Patch::Merge(json!({"spec": {"leaseDurationSeconds": 5}}));
    leases
        .patch(name, &PatchParams::default(), &renew)
        .await
        .unwrap();
    leases.delete(name, &DeleteParams::default()).await.unwrap();
    let other_ns = Api::<Lease>::namespaced(client.clone(), &ns);
    assert!(is_forbidden(
        other_ns.create(&PostParams::default(), &lease).await
    ));

    // The controller's namespace is out of reach: the leader Lease, the pools, the
    // assignments.
    let system_leases = Api::<Lease>::namespaced(client.clone(), NAMESPACE);
    let leader: Lease = serde_json::from_value(json!({
        "metadata": {"name": "aliaslb-controller"},
        "spec": {"holderIdentity": "evil", "leaseDurationSeconds": 3600},
    }))
    .unwrap();
    assert!(is_forbidden(
        system_leases.create(&PostParams::default(), &leader).await
    ));
    assert!(is_forbidden(
        system_leases
            .delete("aliaslb-controller", &DeleteParams::default())
            .await
    ));
    let configmaps = Api::<ConfigMap>::namespaced(client, NAMESPACE);
    assert!(configmaps.get("aliaslb-pools").await.is_ok(), "read-only");
    let wipe = Patch::Merge(json!({"data": {"default": "10.0.0.1"}}));
    assert!(is_forbidden(
        configmaps
            .patch("aliaslb-pools", &PatchParams::default(), &wipe)
            .await
    ));
    let steer: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "aliaslb-node-rbac-node"},
        "data": {"ips": "10.0.0.1 - - default/web\n"},
    }))
    .unwrap();
    assert!(is_forbidden(
        configmaps.create(&PostParams::default(), &steer).await
    ));
}

#[test]
fn example_pool_configmap_is_valid() {
    let cm: ConfigMap = yaml_serde::from_str(&read("manifests/pools.yaml")).unwrap();
    assert_eq!(cm.metadata.name.as_deref(), Some("aliaslb-pools"));
    assert_eq!(cm.metadata.namespace.as_deref(), Some(NAMESPACE));
    let data: BTreeMap<String, String> = cm.data.expect("data");
    let config = PoolConfig::parse(&data).unwrap_or_else(|errors| {
        let lines: Vec<String> = errors.iter().map(ToString::to_string).collect();
        panic!("manifests/pools.yaml is invalid:\n{}", lines.join("\n"))
    });
    let (_, pool) = config
        .pool_for_namespace("default")
        .expect("a pool for `default`");
    for ip in ["192.168.55.10", "192.168.55.11", "192.168.55.12"] {
        assert!(
            pool.contains(ip.parse().unwrap()),
            "{ip} in the example pool"
        );
    }
    assert_eq!(pool.size(aliaslb_core::range::Family::V4), 3);
}

/// `manifests/optional/monitoring` is a kustomize Component: included in a kustomization
/// (controller/tests/data/monitoring, as a user would), `kubectl kustomize` renders the
/// install manifests plus the PrometheusRule, one PodMonitor per binary, whose port names
/// are the ones the pods have, and the Grafana dashboard's ConfigMap. (Its rules:
/// controller/tests/alerts.rs; the dashboard's panels: e2e/tests/monitoring.rs.)
/// The monitoring component applies with `kubectl apply -k` (issue 22): over the Prometheus
/// Operator's own PodMonitor and PrometheusRule CRDs (generated from its API types by
/// scripts/prometheus-crds), the server validates our objects against their schemas and
/// stores them as written: its pruning would silently drop a field the schema does not know,
/// so the stored rule groups are compared with the rules file.
#[tokio::test]
async fn monitoring_component_applies_over_the_operators_crds() {
    let env = installed();
    let crds = repo_root().join("controller/tests/data/prometheus-operator-crds");
    env.kubectl(&["apply", "--server-side", "-f", &crds.display().to_string()]);
    env.kubectl(&[
        "wait",
        "--for=condition=Established",
        "--timeout=60s",
        "crd/podmonitors.monitoring.coreos.com",
        "crd/prometheusrules.monitoring.coreos.com",
    ]);
    let dir = repo_root().join("controller/tests/data/monitoring");
    env.kubectl(&["apply", "-k", &dir.display().to_string()]);
    let out = env.kubectl(&[
        "get",
        "-n",
        NAMESPACE,
        "prometheusrules,podmonitors",
        "-o",
        "name",
    ]);
    let mut names: Vec<&str> = out.lines().collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "podmonitor.monitoring.coreos.com/aliaslb-agent",
            "podmonitor.monitoring.coreos.com/aliaslb-controller",
            "prometheusrule.monitoring.coreos.com/aliaslb",
        ]
    );
    let stored: serde_json::Value = serde_json::from_str(&env.kubectl(&[
        "get",
        "-n",
        NAMESPACE,
        "prometheusrule",
        "aliaslb",
        "-o",
        "json",
    ]))
    .unwrap();
    let file: serde_json::Value =
        yaml_serde::from_str(&read("manifests/optional/monitoring/aliaslb.rules.yaml")).unwrap();
    assert_eq!(
        stored["spec"]["groups"], file["groups"],
        "the server stored other rule groups than the rules file's (a field pruned?)"
    );
    let dashboard = env.kubectl(&[
        "get",
        "-n",
        NAMESPACE,
        "configmap",
        "aliaslb-grafana-dashboard",
        "-o",
        "name",
    ]);
    assert_eq!(dashboard.trim(), "configmap/aliaslb-grafana-dashboard");
}

#[test]
fn monitoring_component_renders_with_the_manifests() {
    let dir = repo_root().join("controller/tests/data/monitoring");
    let out = Command::new("kubectl")
        .args(["kustomize", &dir.display().to_string()])
        .output()
        .unwrap_or_else(|e| panic!("running kubectl (is it installed and on PATH?): {e}"));
    assert!(
        out.status.success(),
        "kubectl kustomize {} failed:\n{}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let objects: Vec<serde_json::Value> = yaml_serde::Deserializer::from_str(&text)
        .map(|doc| serde::Deserialize::deserialize(doc).unwrap())
        .collect();
    let of_kind = |kind: &str| -> Vec<&serde_json::Value> {
        objects.iter().filter(|o| o["kind"] == kind).collect()
    };
    assert_eq!(
        of_kind("Deployment").len(),
        1,
        "the manifests are still there"
    );
    let rules = of_kind("PrometheusRule");
    assert_eq!(rules.len(), 1);
    assert_eq!(rules[0]["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(rules[0]["metadata"]["namespace"], NAMESPACE);
    assert!(
        rules[0]["spec"]["groups"]
            .as_array()
            .is_some_and(|g| !g.is_empty())
    );
    let monitors = of_kind("PodMonitor");
    let mut selected: Vec<&str> = monitors
        .iter()
        .map(|m| {
            assert_eq!(m["spec"]["podMetricsEndpoints"][0]["port"], "metrics");
            m["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"]
                .as_str()
                .unwrap()
        })
        .collect();
    selected.sort_unstable();
    assert_eq!(selected, ["aliaslb-agent", "aliaslb-controller"]);
    // The Grafana dashboard, as the ConfigMap Grafana's sidecar loads: a fixed name (no
    // hash suffix), its label, and the file unchanged. (Its panels: e2e/tests/monitoring.rs.)
    let dashboards: Vec<&serde_json::Value> = of_kind("ConfigMap")
        .into_iter()
        .filter(|c| c["metadata"]["labels"]["grafana_dashboard"] == "1")
        .collect();
    assert_eq!(dashboards.len(), 1, "one dashboard ConfigMap");
    assert_eq!(
        dashboards[0]["metadata"]["name"],
        "aliaslb-grafana-dashboard"
    );
    assert_eq!(dashboards[0]["metadata"]["namespace"], NAMESPACE);
    let file = read("manifests/optional/monitoring/grafana-dashboard.json");
    assert_eq!(
        dashboards[0]["data"]["grafana-dashboard.json"].as_str(),
        Some(file.as_str())
    );
    let dashboard: serde_json::Value = serde_json::from_str(&file).expect("the dashboard is JSON");
    assert_eq!(
        dashboard["templating"]["list"][0]["type"], "datasource",
        "the dashboard's data source is a variable"
    );
    // Every panel and query uses that variable; ids are unique; the grid has no overlap.
    let panels = dashboard["panels"].as_array().expect("panels");
    let mut ids = std::collections::BTreeSet::new();
    let mut cells = std::collections::BTreeSet::new();
    for panel in panels {
        let title = &panel["title"];
        assert!(ids.insert(panel["id"].as_u64().expect("an id")), "{title}");
        let at = |k: &str| panel["gridPos"][k].as_u64().expect("gridPos");
        assert!(at("x") + at("w") <= 24, "{title} is wider than the grid");
        for x in at("x")..at("x") + at("w") {
            for y in at("y")..at("y") + at("h") {
                assert!(cells.insert((x, y)), "{title} overlaps another panel");
            }
        }
        if panel["type"] == "row" {
            continue;
        }
        assert_eq!(panel["datasource"]["uid"], "${datasource}", "{title}");
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{title} has no query");
        for target in targets {
            assert_eq!(target["datasource"]["uid"], "${datasource}", "{title}");
        }
    }
    for workload in of_kind("Deployment")
        .into_iter()
        .chain(of_kind("DaemonSet"))
    {
        let template = &workload["spec"]["template"];
        let name = template["metadata"]["labels"]["app.kubernetes.io/name"]
            .as_str()
            .unwrap();
        assert!(selected.contains(&name), "{name} is scraped");
        assert!(
            template["spec"]["containers"][0]["ports"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["name"] == "metrics"),
            "{name} has a port named metrics"
        );
    }
}

/// The binaries the Dockerfile copies into /usr/local/bin are `[[bin]]` targets of the
/// workspace, and the manifests run binaries the image has.
#[test]
fn dockerfile_copies_real_binaries() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let out = Command::new(cargo)
        .args(["metadata", "--no-deps", "--format-version=1", "--offline"])
        .current_dir(repo_root())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let bins: Vec<String> = meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().unwrap())
        .filter(|t| t["kind"].as_array().unwrap().iter().any(|k| k == "bin"))
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect();

    let dockerfile = read("Dockerfile");
    let copied: Vec<&str> = dockerfile
        .lines()
        .filter(|l| l.starts_with("COPY --from=build"))
        .filter_map(|l| l.rsplit("/usr/local/bin/").next())
        .collect();
    assert_eq!(copied.len(), 3, "{copied:?}");
    for bin in ["aliaslb-controller", "aliaslb-agent", "aliaslb"] {
        assert!(
            bins.iter().any(|b| b == bin),
            "no [[bin]] {bin} in {bins:?}"
        );
        assert!(copied.contains(&bin), "Dockerfile does not copy {bin}");
        assert!(
            dockerfile.contains(&format!("target/release/{bin} "))
                || dockerfile.contains(&format!("target/release/{bin}\n")),
            "Dockerfile does not take {bin} from target/release"
        );
    }
    for manifest in ["manifests/controller.yaml", "manifests/agent.yaml"] {
        for line in read(manifest).lines().filter(|l| l.contains("command:")) {
            let bin = line
                .split("/usr/local/bin/")
                .nth(1)
                .expect("absolute command")
                .trim_end_matches(']');
            assert!(
                copied.contains(&bin),
                "{manifest} runs {bin}, which the image lacks"
            );
        }
    }
}

/// One grant: ServiceAccount, where (`cluster` or a namespace), resource, the one name it is
/// limited to (`resourceNames`), verb.
type Grant = (String, String, String, Option<String>, String);

/// The grants of the Roles and ClusterRoles of `manifests/`, through their bindings.
fn manifest_grants() -> BTreeSet<Grant> {
    let mut roles: BTreeMap<(String, String), Vec<serde_json::Value>> = BTreeMap::new();
    let mut bindings = Vec::new();
    for file in [
        "manifests/controller-rbac.yaml",
        "manifests/agent-rbac.yaml",
    ] {
        for doc in yaml_serde::Deserializer::from_str(&read(file)) {
            let value: serde_json::Value = serde::Deserialize::deserialize(doc).unwrap();
            let kind = value["kind"].as_str().unwrap_or_default().to_owned();
            let scope = value["metadata"]["namespace"]
                .as_str()
                .unwrap_or("cluster")
                .to_owned();
            let name = value["metadata"]["name"].as_str().unwrap().to_owned();
            match kind.as_str() {
                "Role" | "ClusterRole" => {
                    let rules = value["rules"].as_array().cloned().unwrap_or_default();
                    roles.insert((scope, name), rules);
                }
                "RoleBinding" | "ClusterRoleBinding" => bindings.push((scope, value)),
                _ => {}
            }
        }
    }
    let mut grants = BTreeSet::new();
    for (scope, binding) in bindings {
        let role = binding["roleRef"]["name"].as_str().unwrap().to_owned();
        let rules = &roles[&(scope.clone(), role)];
        for subject in binding["subjects"].as_array().unwrap() {
            let account = subject["name"].as_str().unwrap();
            for rule in rules {
                let list = |key: &str| -> Vec<String> {
                    rule[key]
                        .as_array()
                        .map(|a| a.iter().map(|v| v.as_str().unwrap().to_owned()).collect())
                        .unwrap_or_default()
                };
                let names: Vec<Option<String>> = match list("resourceNames") {
                    names if names.is_empty() => vec![None],
                    names => names.into_iter().map(Some).collect(),
                };
                for resource in list("resources") {
                    for name in &names {
                        for verb in list("verbs") {
                            grants.insert((
                                account.to_owned(),
                                scope.clone(),
                                resource.clone(),
                                name.clone(),
                                verb,
                            ));
                        }
                    }
                }
            }
        }
    }
    grants
}

/// The grants the RBAC table of docs/security.md states: rows `| ServiceAccount | where | resources:
/// verbs |` (an empty ServiceAccount cell continues the row above), the last cell entries
/// `resources: verbs` separated by `; `, a resource limited to one name written
/// ``secrets `name` ``; text in parentheses is commentary.
fn security_docs_grants() -> BTreeSet<Grant> {
    let docs = read("docs/security.md");
    let header = "| ServiceAccount | where | resources: verbs |";
    let table = docs
        .split_once(header)
        .expect("the RBAC table of docs/security.md")
        .1;
    let mut grants = BTreeSet::new();
    let mut account = String::new();
    for row in table.lines().skip(2).take_while(|l| l.starts_with('|')) {
        let cells: Vec<&str> = row.trim_matches('|').split('|').map(str::trim).collect();
        assert_eq!(cells.len(), 3, "{row}");
        if !cells[0].is_empty() {
            account = cells[0].to_owned();
        }
        // Commentary in parentheses is left out (it never holds `;` or `:`).
        let mut text = String::new();
        let mut depth = 0;
        for c in cells[2].chars() {
            match c {
                '(' => depth += 1,
                ')' => depth -= 1,
                c if depth == 0 => text.push(c),
                _ => {}
            }
        }
        for entry in text.split(';') {
            let (resources, verbs) = entry
                .split_once(':')
                .unwrap_or_else(|| panic!("`resources: verbs` in {entry:?} ({row})"));
            for resource in resources.split(',') {
                let resource = resource.trim();
                let (resource, name) = match resource.split_once(' ') {
                    Some((r, n)) => (r, Some(n.trim().trim_matches('`').to_owned())),
                    None => (resource, None),
                };
                for verb in verbs.split(',') {
                    grants.insert((
                        account.clone(),
                        cells[1].to_owned(),
                        resource.to_owned(),
                        name.clone(),
                        verb.trim().to_owned(),
                    ));
                }
            }
        }
    }
    grants
}

/// Issue 42 item 6: every row of docs/security.md's RBAC table is true, and it leaves nothing out
/// (the API group aside).
#[test]
fn the_security_docs_rbac_table_is_the_manifests_rbac() {
    let (manifests, docs) = (manifest_grants(), security_docs_grants());
    let text = |g: &Grant| {
        let name =
            g.3.as_deref()
                .map(|n| format!(" `{n}`"))
                .unwrap_or_default();
        format!("{} in {}: {}{name} {}", g.0, g.1, g.2, g.4)
    };
    let missing: Vec<String> = manifests.difference(&docs).map(text).collect();
    let untrue: Vec<String> = docs.difference(&manifests).map(text).collect();
    assert!(
        missing.is_empty() && untrue.is_empty(),
        "docs/security.md's RBAC table leaves out:\n  {}\nand states what manifests/ do not grant:\n  {}",
        missing.join("\n  "),
        untrue.join("\n  ")
    );
    assert!(manifests.len() > 30, "{manifests:?}");
}
