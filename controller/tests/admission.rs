//! The ValidatingAdmissionPolicies, enforced by the real kube-apiserver of `aliaslb-testenv`
//! (run on the newest and the oldest supported release): the agent Lease policy of
//! `manifests/` (on by default): an agent writes only its own node's Lease, with the node
//! taken from its real, pod-bound ServiceAccount token, also once an install made without it
//! (as earlier releases did) is upgraded to it, its running agents' own Leases untouched; and
//! the optional policies of `manifests/optional/`: a tenant cannot set the annotations only
//! the controller writes, nor the status (RBAC); a pool ConfigMap line that is no address,
//! CIDR or range is refused at apply time (the 1.30 variant of that policy on 1.30, the one
//! with CEL's IP and CIDR library from 1.31 on).
//!
//! Its own test binary: the policies apply to every request of its apiserver.
//! Needs `kubectl` on PATH and the testenv binaries.

use std::path::{Path, PathBuf};
use std::time::Duration;

use aliaslb_testenv::{TestEnv, TokenBinding, fixtures};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::api::rbac::v1::RoleBinding;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

const NAMESPACE: &str = "aliaslb-system";
const AGENT_NAMESPACE: &str = "aliaslb-agents";
const AGENT_SA: &str = "aliaslb-agent";

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("controller/ has a parent")
        .to_owned()
}

/// The kinds of the objects an install of earlier releases did not have: the agent Lease
/// policy and its binding, the Lease quota.
const NEW_KINDS: [&str; 3] = [
    "kind: ValidatingAdmissionPolicy\n",
    "kind: ValidatingAdmissionPolicyBinding\n",
    "kind: ResourceQuota\n",
];

/// The node whose agent runs across the upgrade, and the Lease of a node that does not
/// exist it wrote before it (no policy stopped it then).
const UPGRADE_NODE: &str = "adm-up";
const FORGED_LEASE: &str = "aliaslb-agent-adm-forged";

/// The shared environment, once per test binary: first `manifests/` as an earlier release
/// installed it (without the agent Lease policy and the quota), its agent on
/// [`UPGRADE_NODE`] writing its own Lease and a forged one; then upgraded with `kubectl apply
/// -k manifests/`, and the optional Service annotation policy applied; a real
/// kube-controller-manager running (it fills the aggregated ClusterRoles such as `edit`,
/// gives each namespace its `default` ServiceAccount, and counts the Lease quota).
async fn installed() -> &'static TestEnv {
    static CONTROLLER_MANAGER: tokio::sync::OnceCell<aliaslb_testenv::ControllerManager> =
        tokio::sync::OnceCell::const_new();
    let env = TestEnv::global();
    CONTROLLER_MANAGER
        .get_or_init(|| async {
            let root = repo_root();
            let manifests = root.join("manifests").display().to_string();
            let rendered = env.kubectl(&["kustomize", &manifests]);
            let earlier: Vec<&str> = rendered
                .split("\n---\n")
                .filter(|doc| !NEW_KINDS.iter().any(|kind| doc.contains(kind)))
                .collect();
            assert_eq!(
                earlier.len() + NEW_KINDS.len(),
                rendered.split("\n---\n").count(),
                "the policy, its binding and the quota, one each"
            );
            let dir = tempfile::tempdir().unwrap();
            let file = dir.path().join("earlier.yaml");
            std::fs::write(&file, earlier.join("\n---\n")).unwrap();
            env.kubectl(&["apply", "-f", &file.display().to_string()]);
            let kcm = env
                .start_controller_manager()
                .await
                .unwrap_or_else(|e| panic!("{e}"));
            // The earlier install's agent writes its own Lease, and a forged one.
            let admin = env.client().await;
            let agent = agent_on(env, &admin, UPGRADE_NODE).await;
            let leases = Api::<Lease>::namespaced(agent, AGENT_NAMESPACE);
            for (name, holder) in [
                (format!("aliaslb-agent-{UPGRADE_NODE}"), UPGRADE_NODE),
                (FORGED_LEASE.to_owned(), "adm-forged"),
            ] {
                let object = lease(&name, holder);
                settled(
                    || leases.create(&CREATE, &object),
                    |r| matches!(r, Err(kube::Error::Api(s)) if s.code == 403),
                )
                .await
                .unwrap_or_else(|e| panic!("before the upgrade, {name}: {e}"));
            }
            // The upgrade.
            env.kubectl(&["apply", "-k", &manifests]);
            let pool_policy = if server_minor(&admin).await < 31 {
                "pool-configmap-policy-1.30.yaml"
            } else {
                "pool-configmap-policy.yaml"
            };
            for policy in ["service-annotation-policy.yaml", pool_policy] {
                let path = root.join("manifests/optional").join(policy);
                env.kubectl(&["apply", "-f", &path.display().to_string()]);
            }
            kcm
        })
        .await;
    env
}

/// The API server's minor version.
async fn server_minor(client: &Client) -> u32 {
    let version = client.apiserver_version().await.unwrap();
    version.minor.trim_end_matches('+').parse().unwrap()
}

/// An install made without the agent Lease policy, upgraded (see [`installed`]): its
/// running agent keeps renewing and releasing its own Lease, and may no longer touch the
/// Lease of another node, which it wrote before the upgrade.
#[tokio::test]
async fn an_upgrade_puts_the_policy_in_force_for_running_agents() {
    let env = installed().await;
    let admin = env.client().await;
    let agent = agent_on(env, &admin, UPGRADE_NODE).await;
    let leases = Api::<Lease>::namespaced(agent, AGENT_NAMESPACE);
    let own = format!("aliaslb-agent-{UPGRADE_NODE}");
    let renew = Patch::Merge(json!({"spec": {"leaseDurationSeconds": 6}}));
    let params = PatchParams::default();
    denied_once_active(
        LEASE_POLICY,
        || leases.patch(FORGED_LEASE, &params, &renew),
        || async {},
    )
    .await;
    leases
        .patch(&own, &PatchParams::default(), &renew)
        .await
        .expect("a running agent renews its own Lease after the upgrade");
    denied_by(
        LEASE_POLICY,
        leases.delete(FORGED_LEASE, &DeleteParams::default()).await,
    );
    let release = Patch::Merge(json!({"spec": {"holderIdentity": null}}));
    leases
        .patch(&own, &PatchParams::default(), &release)
        .await
        .expect("and releases it");
}

/// A Node `name`, as a kubelet would register it.
async fn node(admin: &Client, name: &str) {
    let node: Node = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    match Api::<Node>::all(admin.clone())
        .create(&PostParams::default(), &node)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        Err(e) => panic!("creating Node {name}: {e}"),
    }
}

/// An agent pod scheduled on `node` (no kubelet runs it: only its token matters), and a
/// client with that pod's bound token, as the DaemonSet's agent on `node` has.
async fn agent_on(env: &TestEnv, admin: &Client, node_name: &str) -> Client {
    node(admin, node_name).await;
    let name = format!("aliaslb-agent-{node_name}");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "nodeName": node_name,
            "serviceAccountName": AGENT_SA,
            "containers": [{"name": "agent", "image": "ghcr.io/aliaslb/aliaslb:0.1.0"}],
        },
    }))
    .unwrap();
    let pods = Api::<Pod>::namespaced(admin.clone(), NAMESPACE);
    if pods.get_opt(&name).await.unwrap().is_none() {
        pods.create(&PostParams::default(), &pod).await.unwrap();
    }
    env.token_client(NAMESPACE, AGENT_SA, Some(TokenBinding::Pod(&name)))
        .await
}

fn lease(name: &str, holder: &str) -> Lease {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 4},
    }))
    .unwrap()
}

/// The message of a request the policy `policy` denied; panics on success or another error.
fn denied_by<T: std::fmt::Debug>(policy: &str, result: Result<T, kube::Error>) -> String {
    match result {
        Err(kube::Error::Api(status)) if status.message.contains(policy) => status.message,
        other => panic!("expected a denial by {policy}, got {other:?}"),
    }
}

/// Retries `attempt` until it stops failing for the reason `still` accepts: the apiserver
/// compiles policies and reads RBAC from caches that lag the write by up to a second or so.
async fn settled<T, F, Fut>(
    mut attempt: F,
    still: impl Fn(&Result<T, kube::Error>) -> bool,
) -> Result<T, kube::Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, kube::Error>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let result = attempt().await;
        if !still(&result) || tokio::time::Instant::now() > deadline {
            return result;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The denial by `policy` of the create `attempt`, once the apiserver has compiled the policy
/// (until then the create passes: `undo` removes what it made, and it is tried again).
async fn denied_once_active<T, F, Fut, U, UFut>(policy: &str, mut attempt: F, mut undo: U) -> String
where
    T: std::fmt::Debug,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, kube::Error>>,
    U: FnMut() -> UFut,
    UFut: Future<Output = ()>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let result = attempt().await;
        if result.is_err() || tokio::time::Instant::now() > deadline {
            return denied_by(policy, result);
        }
        undo().await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

const CREATE: PostParams = PostParams {
    dry_run: false,
    field_manager: None,
};

const LEASE_POLICY: &str = "aliaslb-agent-own-lease";
const ANNOTATION_POLICY: &str = "aliaslb-service-annotations";
const POOL_POLICY: &str = "aliaslb-pool-configmap";

#[tokio::test]
async fn an_agent_writes_only_its_own_nodes_lease() {
    let env = installed().await;
    let admin = env.client().await;
    let n1 = agent_on(env, &admin, "adm-n1").await;
    let n2_leases = Api::<Lease>::namespaced(admin.clone(), AGENT_NAMESPACE);
    n2_leases
        .create(
            &PostParams::default(),
            &lease("aliaslb-agent-adm-n2", "adm-n2"),
        )
        .await
        .unwrap();
    let leases = Api::<Lease>::namespaced(n1.clone(), AGENT_NAMESPACE);
    let (n1_lease, n3_lease) = (
        lease("aliaslb-agent-adm-n1", "adm-n1"),
        lease("aliaslb-agent-adm-n3", "adm-n3"),
    );

    // Its own Lease, holder itself: allowed, as soon as RBAC and the policy have settled.
    let own = settled(
        || leases.create(&CREATE, &n1_lease),
        |r| matches!(r, Err(kube::Error::Api(s)) if s.code == 403),
    )
    .await;
    own.expect("an agent creates its own node's Lease");
    let renew = Patch::Merge(json!({"spec": {"leaseDurationSeconds": 5}}));
    leases
        .patch("aliaslb-agent-adm-n1", &PatchParams::default(), &renew)
        .await
        .expect("an agent renews its own Lease");

    // Another node's Lease: not created, not changed, not deleted; nor its own with another
    // holder.
    let message = denied_once_active(
        LEASE_POLICY,
        || leases.create(&CREATE, &n3_lease),
        || async {
            n2_leases
                .delete("aliaslb-agent-adm-n3", &DeleteParams::default())
                .await
                .unwrap();
        },
    )
    .await;
    assert!(
        message.contains("aliaslb-agent-adm-n1") && message.contains("aliaslb-agent-adm-n3"),
        "the denial names both Leases: {message}"
    );
    let steal = Patch::Merge(json!({"spec": {"holderIdentity": "adm-n1"}}));
    denied_by(
        LEASE_POLICY,
        leases
            .patch("aliaslb-agent-adm-n2", &PatchParams::default(), &steal)
            .await,
    );
    denied_by(
        LEASE_POLICY,
        leases
            .delete("aliaslb-agent-adm-n2", &DeleteParams::default())
            .await,
    );
    let other_holder = Patch::Merge(json!({"spec": {"holderIdentity": "adm-n2"}}));
    denied_by(
        LEASE_POLICY,
        leases
            .patch(
                "aliaslb-agent-adm-n1",
                &PatchParams::default(),
                &other_holder,
            )
            .await,
    );
    let n2 = n2_leases.get("aliaslb-agent-adm-n2").await.unwrap();
    assert_eq!(
        n2.spec.and_then(|s| s.holder_identity).as_deref(),
        Some("adm-n2"),
        "the other node's Lease is untouched"
    );

    // A token bound to no pod carries no node: even its "own" Lease is refused.
    let unbound = env.token_client(NAMESPACE, AGENT_SA, None).await;
    let unbound = Api::<Lease>::namespaced(unbound, AGENT_NAMESPACE);
    denied_by(
        LEASE_POLICY,
        unbound
            .patch("aliaslb-agent-adm-n1", &PatchParams::default(), &renew)
            .await,
    );

    // Releasing its own Lease (no holder: what SIGTERM does) is allowed; releasing
    // another node's is refused.
    let release = Patch::Merge(json!({"spec": {"holderIdentity": null}}));
    leases
        .patch("aliaslb-agent-adm-n1", &PatchParams::default(), &release)
        .await
        .expect("an agent releases its own Lease");
    denied_by(
        LEASE_POLICY,
        leases
            .patch("aliaslb-agent-adm-n2", &PatchParams::default(), &release)
            .await,
    );
    // Deleting its own Lease (what agents before 0.2 did on SIGTERM) is allowed.
    leases
        .delete("aliaslb-agent-adm-n1", &DeleteParams::default())
        .await
        .expect("an agent gives up its own Lease");
}

#[tokio::test]
async fn a_node_bound_token_is_bound_to_its_node_too() {
    let env = installed().await;
    let admin = env.client().await;
    let minor = server_minor(&admin).await;
    if minor < 31 {
        // ServiceAccountTokenNodeBinding is alpha (off) before 1.31: the TokenRequest itself
        // is refused, so there is nothing to enforce.
        eprintln!("1.{minor}: no node-bound tokens; pod-bound ones are tested above");
        return;
    }
    node(&admin, "adm-n4").await;
    let client = env
        .token_client(NAMESPACE, AGENT_SA, Some(TokenBinding::Node("adm-n4")))
        .await;
    let leases = Api::<Lease>::namespaced(client, AGENT_NAMESPACE);
    let (n4_lease, n5_lease) = (
        lease("aliaslb-agent-adm-n4", "adm-n4"),
        lease("aliaslb-agent-adm-n5", "adm-n5"),
    );
    settled(
        || leases.create(&CREATE, &n4_lease),
        |r| matches!(r, Err(kube::Error::Api(s)) if s.code == 403),
    )
    .await
    .expect("own Lease");
    let admin_leases = Api::<Lease>::namespaced(admin, AGENT_NAMESPACE);
    denied_once_active(
        LEASE_POLICY,
        || leases.create(&CREATE, &n5_lease),
        || async {
            admin_leases
                .delete("aliaslb-agent-adm-n5", &DeleteParams::default())
                .await
                .unwrap();
        },
    )
    .await;
}

#[tokio::test]
async fn a_tenant_cannot_write_the_controllers_annotations_nor_status() {
    let env = installed().await;
    let admin = env.client().await;
    let ns = env.create_namespace(&admin, "adm-tenant").await;
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "tenant-edit"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
        "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": ns}],
    }))
    .unwrap();
    Api::<RoleBinding>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    // kube-controller-manager's ServiceAccount controller creates the account.
    let accounts =
        Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(admin.clone(), &ns);
    settled(|| accounts.get("default"), Result::is_err)
        .await
        .expect("the namespace's default ServiceAccount");
    let tenant = env.token_client(&ns, "default", None).await;
    let services = Api::<Service>::namespaced(tenant, &ns);

    // A Service of its own, with the request annotation a tenant may set.
    let mut web = fixtures::lb_service(&ns, "web")
        .annotate("aliaslb.io/loadBalancerIPs", "192.0.2.5")
        .build();
    web.metadata.uid = None;
    settled(
        || services.create(&CREATE, &web),
        |r| matches!(r, Err(kube::Error::Api(s)) if s.code == 403 && !s.message.contains(ANNOTATION_POLICY)),
    )
    .await
    .expect("a tenant creates its Service with a requested IP");

    // Created with a controller annotation: refused.
    let mut steered = fixtures::lb_service(&ns, "steered")
        .annotate("aliaslb.io/node", "adm-n1")
        .build();
    steered.metadata.uid = None;
    let admin_services = Api::<Service>::namespaced(admin.clone(), &ns);
    let message = denied_once_active(
        ANNOTATION_POLICY,
        || services.create(&CREATE, &steered),
        || async {
            admin_services
                .delete("steered", &DeleteParams::default())
                .await
                .unwrap();
        },
    )
    .await;
    assert!(message.contains("aliaslb.io/node"), "{message}");

    // The controller writes them (its own ServiceAccount, real RBAC and policy path).
    let controller = env
        .service_account_client(NAMESPACE, "aliaslb-controller")
        .await;
    let as_controller = Api::<Service>::namespaced(controller, &ns);
    let written = Patch::Merge(json!({"metadata": {"annotations": {
        "aliaslb.io/node": "adm-n1", "aliaslb.io/interface": "eth0"}}}));
    as_controller
        .patch("web", &PatchParams::default(), &written)
        .await
        .expect("the controller writes its annotations");

    // The tenant can neither change nor remove them, by patch or by update...
    for patch in [
        json!({"metadata": {"annotations": {"aliaslb.io/node": "adm-n2"}}}),
        json!({"metadata": {"annotations": {"aliaslb.io/interface": null}}}),
    ] {
        denied_by(
            ANNOTATION_POLICY,
            services
                .patch("web", &PatchParams::default(), &Patch::Merge(patch))
                .await,
        );
    }
    let mut replaced = services.get("web").await.unwrap();
    replaced.metadata.annotations = None;
    denied_by(
        ANNOTATION_POLICY,
        services
            .replace("web", &PostParams::default(), &replaced)
            .await,
    );
    // ...but edits the rest of its Service as before.
    let label = Patch::Merge(json!({"metadata": {"labels": {"team": "a"}}}));
    services
        .patch("web", &PatchParams::default(), &label)
        .await
        .expect("other edits pass");
    // Status is the controller's: RBAC gives `edit` no services/status.
    let status =
        Patch::Merge(json!({"status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.99"}]}}}));
    match services
        .patch_status("web", &PatchParams::default(), &status)
        .await
    {
        Err(kube::Error::Api(s)) if s.code == 403 => {}
        other => panic!("a tenant wrote status: {other:?}"),
    }
    let read = Api::<Service>::namespaced(admin, &ns)
        .get("web")
        .await
        .unwrap();
    let annotations = read.metadata.annotations.unwrap_or_default();
    assert_eq!(
        annotations.get("aliaslb.io/node").map(String::as_str),
        Some("adm-n1")
    );
    assert_eq!(
        annotations.get("aliaslb.io/interface").map(String::as_str),
        Some("eth0")
    );
}

/// The pool ConfigMap with `data`, as `kubectl apply --server-side` sends it.
fn pools(data: &[(&str, &str)]) -> serde_json::Value {
    let data: serde_json::Map<String, serde_json::Value> = data
        .iter()
        .map(|(k, v)| ((*k).to_owned(), json!(v)))
        .collect();
    json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "aliaslb-pools", "namespace": NAMESPACE},
        "data": data,
    })
}

#[tokio::test]
async fn a_pool_configmap_line_that_is_no_address_is_refused_at_apply() {
    let env = installed().await;
    let admin = env.client().await;
    let cms = Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(admin.clone(), NAMESPACE);
    let apply = PatchParams::apply("adm-test").force();
    let good = pools(&[
        (
            "default",
            "192.168.55.10\n10.0.7.0/29          # CIDR\n10.0.8.20 - 10.0.8.40\n\n# a comment\n10.0.9.0/30 draining\n2001:db8:5::/64\n",
        ),
        (
            "pool.internal",
            "2001:db8::1-2001:db8::ff\n2001:db8:1::1\t draining",
        ),
        // Not the policy's to check: the controller reads the options.
        (
            "config.yaml",
            "pools:\n  pool.internal:\n    namespaces: [a]\n",
        ),
    ]);
    let good_patch = Patch::Apply(&good);
    let accepted = settled(
        || cms.patch("aliaslb-pools", &apply, &good_patch),
        |r| r.is_err(),
    )
    .await;
    accepted.expect("every form of entry passes");
    let restore = || async {
        cms.patch("aliaslb-pools", &apply, &Patch::Apply(&good))
            .await
            .unwrap();
    };
    for (key, value, named) in [
        ("default", "192.168.55.300", "default: `192.168.55.300`"),
        (
            "default",
            "192.168.55.10\n10.0.0.1 10.0.0.2",
            "default: `10.0.0.1 10.0.0.2`",
        ),
        ("team-b", "10.0.0.1-", "team-b: `10.0.0.1-`"),
        (
            "team-b",
            "10.0.8.20-10.0.8.40-10.0.8.50",
            "team-b: `10.0.8.20-10.0.8.40-10.0.8.50`",
        ),
        ("pool.x", "10.0.0.1 drainig", "pool.x: `10.0.0.1 drainig`"),
        ("pool.x", "fe80::1%eth0", "pool.x: `fe80::1%eth0`"),
        ("pool.x", "2001:db8:::1", "pool.x: `2001:db8:::1`"),
        ("pool.x", "::ffff:10.0.0.1", "pool.x: `::ffff:10.0.0.1`"),
        ("pool.x", "10.0.0.0/33x", "pool.x: `10.0.0.0/33x`"),
    ] {
        let bad = pools(&[("default", "192.168.55.10"), (key, value)]);
        let bad_patch = Patch::Apply(&bad);
        let message = denied_once_active(
            POOL_POLICY,
            || cms.patch("aliaslb-pools", &apply, &bad_patch),
            restore,
        )
        .await;
        assert!(message.contains(named), "{value:?}: {message}");
        assert!(
            message.contains("not an address, CIDR or range"),
            "{message}"
        );
    }
    // The variant for 1.31+ is refused by a 1.30 API server (no CEL IP and CIDR library for
    // new policies there): why the 1.30 variant exists.
    let variant = repo_root().join("manifests/optional/pool-configmap-policy.yaml");
    let dry_run = std::process::Command::new("kubectl")
        .arg(format!("--kubeconfig={}", env.kubeconfig_path().display()))
        .args(["apply", "--dry-run=server", "-f"])
        .arg(&variant)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&dry_run.stderr);
    if server_minor(&admin).await < 31 {
        assert!(
            !dry_run.status.success() && stderr.contains("isIP"),
            "{stderr}"
        );
    } else {
        assert!(dry_run.status.success(), "{stderr}");
    }
    // Created whole with a bad line: refused too.
    cms.delete("aliaslb-pools", &DeleteParams::default())
        .await
        .unwrap();
    let bad: k8s_openapi::api::core::v1::ConfigMap =
        serde_json::from_value(pools(&[("default", "nope")])).unwrap();
    denied_by(POOL_POLICY, cms.create(&PostParams::default(), &bad).await);
    // Only the pool ConfigMap is checked: another ConfigMap of the namespace is not.
    let other: k8s_openapi::api::core::v1::ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "adm-notes", "namespace": NAMESPACE},
        "data": {"default": "nope"},
    }))
    .unwrap();
    cms.create(&PostParams::default(), &other)
        .await
        .expect("not the pool ConfigMap");
    restore().await;
}
