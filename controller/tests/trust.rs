//! The trust boundary against the real kube-apiserver (1.37; 1.30 too).
//!
//! - A tenant (a ServiceAccount with the built-in `edit` ClusterRole bound in its own
//!   namespace only) cannot steer its Service's IP: whatever it writes into the
//!   `aliaslb.io/node` and `aliaslb.io/interface` annotations, in every state of the
//!   Service (assigned, moving, no eligible node, `externalTrafficPolicy: Local` without
//!   endpoint), the trusted node assignments (`aliaslb-node-<node>` in the controller's
//!   namespace, the only thing agents act on) never follow it, and the controller takes the
//!   annotations back within [`TAKE_BACK`]. The tenant cannot read or write where those
//!   objects and the agents' Leases live, nor write its Service's status.
//! - An IP leaves a Service, its agent included, before it is given to another: a Service
//!   switched to `ClusterIP` while another waits on the same one-address pool; the waiting
//!   Service gets the address only once the old holder's agent stops reporting it.
//!
//! Every version of the assignment objects is recorded by a watch ([`Trusted`]), so a
//! write that was undone again at once still fails the test. The tenant writes the
//! annotations the three ways kubectl does ([`Edit`]), at creation, and while no controller
//! runs (the next one must start from its own objects).
//!
//! This environment runs no kube-controller-manager, so the aggregated `edit` role has no
//! rules of its own: [`aggregate`] fills them in as its aggregation controller would.

mod support;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aliaslb_controller::write::assignments;
use aliaslb_core::assignment::NodeAssignments;
use aliaslb_core::keys;
use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, RoleBinding};
use kube::api::{ListParams, Patch, PatchParams, PostParams, WatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use serde_json::json;
use support::{Cluster, Task, annotation, eventually, lb_service, serial};

use support::SETTLE;
/// The controller takes back a tenant's edit of its annotations within this. It reacts to
/// the Service's watch event (debounce 20 ms) with one apply and, when the tenant's field
/// manager owns the annotation, one merge patch: well under a second on this apiserver.
const TAKE_BACK: Duration = Duration::from_secs(2);
/// After each take-back, how long the annotations must stay taken back and the assignment
/// objects are watched for a write following the tenant (more than a pass, an agent renew
/// and an agent Lease duration).
const OBSERVE: Duration = Duration::from_secs(3);
/// The tenant's ServiceAccount.
const TENANT: &str = "tenant";
/// The interface the tenant asks for (the pools say `eth1`, or nothing).
const TENANT_INTERFACE: &str = "cni0";
/// The interface the pool options give.
const POOL_INTERFACE: &str = "eth1";

/// The pool ConfigMap data of `c` with `range`, and the pool interface option when `eth1`.
async fn pool(c: &Cluster, range: &str, eth1: bool) {
    let options = format!("pools:\n  {}:\n    interface: {POOL_INTERFACE}\n", c.ns);
    let mut data = vec![(c.ns.as_str(), range)];
    if eth1 {
        data.push(("config.yaml", options.as_str()));
    }
    c.set_pool(&data).await;
}

/// Fills in the rules of the built-in aggregated ClusterRole `name` (and of the aggregated
/// roles it selects, such as `view` for `edit`) when they are missing, exactly as
/// kube-controller-manager's clusterrole-aggregation controller would: the union of the
/// rules of every ClusterRole its selectors match. This test environment runs no
/// kube-controller-manager, so `edit` comes up empty; on a real cluster it has what this
/// gives it.
fn aggregate<'a>(
    roles: &'a Api<ClusterRole>,
    name: &'a str,
) -> futures::future::BoxFuture<'a, Vec<k8s_openapi::api::rbac::v1::PolicyRule>> {
    Box::pin(async move {
        let role = roles.get(name).await.expect("a bootstrap ClusterRole");
        let Some(selectors) = role.aggregation_rule.and_then(|a| a.cluster_role_selectors) else {
            return role.rules.unwrap_or_default();
        };
        if let Some(rules) = role.rules.filter(|r| !r.is_empty()) {
            return rules;
        }
        let mut rules = Vec::new();
        for selector in selectors {
            let labels: Vec<String> = selector
                .match_labels
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            let matched = roles
                .list(&ListParams::default().labels(&labels.join(",")))
                .await
                .unwrap();
            for other in matched.items {
                let other = other.metadata.name.unwrap_or_default();
                if other != name {
                    rules.extend(aggregate(roles, &other).await);
                }
            }
        }
        assert!(!rules.is_empty(), "nothing aggregates into {name}");
        roles
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"rules": rules})),
            )
            .await
            .unwrap();
        rules
    })
}

/// Creates the ServiceAccount `tenant` in `c.ns`, binds the built-in ClusterRole `edit` to
/// it with a RoleBinding in `c.ns` only, and returns a client acting as it.
async fn tenant(c: &Cluster) -> Client {
    aggregate(&Api::<ClusterRole>::all(c.client.clone()), "edit").await;
    let sa: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": TENANT}})).unwrap();
    Api::<ServiceAccount>::namespaced(c.client.clone(), &c.ns)
        .create(&PostParams::default(), &sa)
        .await
        .unwrap();
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "tenant-edit"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
        "subjects": [{"kind": "ServiceAccount", "name": TENANT, "namespace": c.ns}],
    }))
    .unwrap();
    Api::<RoleBinding>::namespaced(c.client.clone(), &c.ns)
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    let client = c.env.service_account_client(&c.ns, TENANT).await;
    // The authorizer reads RoleBindings from a cache: wait until it has this one.
    let services = Api::<Service>::namespaced(client.clone(), &c.ns);
    eventually(SETTLE, "the tenant can list its Services", async || {
        services.list(&ListParams::default()).await.is_ok()
    })
    .await;
    client
}

/// Creates Service `builder` as the tenant.
async fn create_as(tenant: &Api<Service>, builder: support::LbService) {
    tenant
        .create(&PostParams::default(), &builder.build())
        .await
        .unwrap();
}

/// How the tenant writes the annotations: `kubectl annotate` (merge patch), `kubectl apply
/// --server-side --force-conflicts` (a forced apply under its own field manager) and
/// `kubectl edit` (read, change, update).
#[derive(Debug, Clone, Copy)]
enum Edit {
    Annotate,
    Apply,
    Update,
}

/// The tenant sets `aliaslb.io/node` to `node` and `aliaslb.io/interface` to `interface`
/// (`None`: removes it) on Service `name`, and checks that the API took the edit.
async fn steer(
    tenant: &Api<Service>,
    name: &str,
    node: Option<&str>,
    interface: Option<&str>,
    how: Edit,
) {
    let updated = match how {
        Edit::Annotate => {
            let body = json!({"metadata": {"annotations": {
                keys::ANNOTATION_NODE: node,
                keys::ANNOTATION_INTERFACE: interface,
            }}});
            tenant
                .patch(name, &PatchParams::default(), &Patch::Merge(body))
                .await
                .unwrap()
        }
        Edit::Apply => {
            let mut annotations = serde_json::Map::new();
            for (key, value) in [
                (keys::ANNOTATION_NODE, node),
                (keys::ANNOTATION_INTERFACE, interface),
            ] {
                if let Some(value) = value {
                    annotations.insert(key.to_owned(), json!(value));
                }
            }
            let body = json!({
                "apiVersion": "v1", "kind": "Service",
                "metadata": {"name": name, "annotations": annotations},
            });
            tenant
                .patch(
                    name,
                    &PatchParams::apply(TENANT).force(),
                    &Patch::Apply(body),
                )
                .await
                .unwrap()
        }
        Edit::Update => loop {
            let mut svc = tenant.get(name).await.unwrap();
            let annotations = svc.metadata.annotations.get_or_insert_default();
            for (key, value) in [
                (keys::ANNOTATION_NODE, node),
                (keys::ANNOTATION_INTERFACE, interface),
            ] {
                match value {
                    Some(value) => annotations.insert(key.to_owned(), value.to_owned()),
                    None => annotations.remove(key),
                };
            }
            match tenant.replace(name, &PostParams::default(), &svc).await {
                Ok(svc) => break svc,
                // The controller wrote in between: read again, as kubectl edit would.
                Err(kube::Error::Api(s)) if s.code == 409 => continue,
                Err(e) => panic!("tenant update of {name}: {e}"),
            }
        },
    };
    assert_eq!(
        (
            annotation(&updated, keys::ANNOTATION_NODE),
            annotation(&updated, keys::ANNOTATION_INTERFACE)
        ),
        (node, interface),
        "the API did not take the tenant's {how:?}"
    );
}

/// Waits until Service `name` shows the controller's `node` and `interface` annotations
/// again (`None`: absent), within [`TAKE_BACK`] of `since`; returns how long it took.
async fn taken_back(
    c: &Cluster,
    name: &str,
    node: Option<&str>,
    interface: Option<&str>,
    since: Instant,
) -> Duration {
    let shows = async || {
        let svc = c.get(name).await;
        annotation(&svc, keys::ANNOTATION_NODE) == node
            && annotation(&svc, keys::ANNOTATION_INTERFACE) == interface
    };
    let end = since + TAKE_BACK;
    while !shows().await {
        assert!(
            Instant::now() < end,
            "{name}: the controller did not take its annotations back to node={node:?} \
             interface={interface:?} within {TAKE_BACK:?}: {:?}",
            c.get(name).await.metadata.annotations
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    since.elapsed()
}

/// Polls for [`OBSERVE`] that Service `name` keeps showing `node` and `interface`.
async fn stays(c: &Cluster, name: &str, node: Option<&str>, interface: Option<&str>) {
    let end = Instant::now() + OBSERVE;
    while Instant::now() < end {
        let svc = c.get(name).await;
        assert_eq!(
            (
                annotation(&svc, keys::ANNOTATION_NODE),
                annotation(&svc, keys::ANNOTATION_INTERFACE)
            ),
            (node, interface),
            "{name}: the annotations did not stay taken back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One version of an assignment object, as the watch delivered it.
#[derive(Debug, Clone)]
struct Version {
    received: Instant,
    node: String,
    resource_version: String,
    /// `None`: deleted.
    assignments: Option<NodeAssignments>,
}

/// Every version of every node assignment object in the controller's namespace, from a
/// watch started before the controller: what agents would have acted on.
struct Trusted {
    log: Arc<Mutex<Vec<Version>>>,
    api: Api<ConfigMap>,
    _watch: Task,
}

impl Trusted {
    async fn start(c: &Cluster) -> Trusted {
        let api = Api::<ConfigMap>::namespaced(c.client.clone(), &c.system);
        let log: Arc<Mutex<Vec<Version>>> = Arc::default();
        let (synced_tx, synced_rx) = tokio::sync::oneshot::channel();
        let task = {
            let api = api.clone();
            let log = log.clone();
            tokio::spawn(async move {
                let mut synced = Some(synced_tx);
                let mut objects: BTreeMap<String, assignments::NodeObjects> = BTreeMap::new();
                let stream = watcher::watcher(api, watcher::Config::default()).default_backoff();
                futures::pin_mut!(stream);
                while let Some(event) = stream.next().await {
                    let (cm, deleted) = match event {
                        Ok(watcher::Event::InitApply(cm) | watcher::Event::Apply(cm)) => {
                            (cm, false)
                        }
                        Ok(watcher::Event::Delete(cm)) => (cm, true),
                        Ok(watcher::Event::InitDone) => {
                            if let Some(tx) = synced.take() {
                                let _ = tx.send(());
                            }
                            continue;
                        }
                        Ok(watcher::Event::Init) => continue,
                        Err(e) => {
                            eprintln!("assignment watch: {e}");
                            continue;
                        }
                    };
                    let Some(name) = cm.metadata.name.clone() else {
                        continue;
                    };
                    let Some(node) = assignments::node_of(&name).map(str::to_owned) else {
                        continue;
                    };
                    let node_objects = objects.entry(node.clone()).or_default();
                    if deleted {
                        node_objects.remove(&name);
                    } else {
                        node_objects.insert(name, assignments::ObjectData::of(&cm));
                    }
                    // What the node's agent reads after this event: nothing once the index is
                    // gone; the last set while a shard the index counts is not there yet (the
                    // initial list brings the index before its shards).
                    let index_name = keys::assignment_configmap(&node);
                    let assignments = match assignments::read_node(&node, node_objects) {
                        Ok(a) => Some(a),
                        Err(_) if !node_objects.contains_key(&index_name) => None,
                        Err(e) if e.contains("is missing") => {
                            let log = log.lock().unwrap();
                            let last = log.iter().rev().find(|v| v.node == node);
                            last.and_then(|v| v.assignments.clone())
                        }
                        Err(e) => panic!("the controller wrote an unreadable assignment: {e}"),
                    };
                    log.lock().unwrap().push(Version {
                        received: Instant::now(),
                        node: node.to_owned(),
                        resource_version: cm.metadata.resource_version.unwrap_or_default(),
                        assignments,
                    });
                }
            })
        };
        synced_rx.await.unwrap();
        Trusted {
            log,
            api,
            _watch: Task(task),
        }
    }

    /// Waits until the log holds the current version of every assignment object; returns
    /// the time from which every logged version is newer than what exists now.
    async fn mark(&self) -> Instant {
        eventually(SETTLE, "the assignment watch caught up", async || {
            let now = self.api.list(&ListParams::default()).await.unwrap().items;
            let log = self.log.lock().unwrap();
            now.iter()
                .filter(|cm| {
                    cm.metadata
                        .name
                        .as_deref()
                        .and_then(assignments::node_of)
                        .is_some()
                })
                .all(|cm| {
                    log.iter()
                        .any(|v| Some(&v.resource_version) == cm.metadata.resource_version.as_ref())
                })
        })
        .await;
        Instant::now()
    }

    /// The versions received after `since`.
    fn since(&self, since: Instant) -> Vec<Version> {
        let log = self.log.lock().unwrap();
        log.iter().filter(|v| v.received > since).cloned().collect()
    }

    /// The whole log.
    fn all(&self) -> Vec<Version> {
        self.log.lock().unwrap().clone()
    }

    /// The lines of the current version of `node`'s object listing `ip`, if any.
    fn current(&self, node: &str, ip: IpAddr) -> Option<aliaslb_core::assignment::AssignedIp> {
        let log = self.log.lock().unwrap();
        let last = log.iter().rev().find(|v| v.node == node)?;
        last.assignments.as_ref()?.ips.get(&ip).cloned()
    }
}

/// Where `ip` must not appear in the trusted objects.
enum Never<'a> {
    /// On these nodes.
    On(&'a [&'a str]),
    /// On any node.
    Anywhere,
}

/// Checks that since `mark`, no assignment object listed `ip` where `never` says, and that
/// no version ever (since the watch started) gave `ip` the tenant's interface or named the
/// made-up node `invented`.
fn check(trusted: &Trusted, mark: Instant, ip: IpAddr, never: Never<'_>, invented: &str) {
    let mut wrong = Vec::new();
    for v in trusted.all() {
        if v.node == invented {
            wrong.push(format!(
                "an assignment object exists for the made-up node: {v:?}"
            ));
        }
        if let Some(a) = v.assignments.as_ref().and_then(|a| a.ips.get(&ip))
            && a.interface.as_deref() == Some(TENANT_INTERFACE)
        {
            wrong.push(format!("{ip} with the tenant's interface: {v:?}"));
        }
    }
    for v in trusted.since(mark) {
        let listed = v
            .assignments
            .as_ref()
            .is_some_and(|a| a.ips.contains_key(&ip));
        let forbidden = match never {
            Never::On(nodes) => nodes.contains(&v.node.as_str()),
            Never::Anywhere => true,
        };
        if listed && forbidden {
            wrong.push(format!(
                "{ip} on node {} after the tenant's edit: {v:?}",
                v.node
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "the trusted assignments followed the tenant:\n{}",
        wrong.join("\n")
    );
}

/// The Service's one ingress IP.
async fn ip_of(c: &Cluster, name: &str) -> IpAddr {
    let ips = support::ingress(&c.get(name).await);
    assert_eq!(ips.len(), 1, "{name}: {ips:?}");
    ips[0]
}

/// Waits until condition Announced of `name` has `reason`.
async fn announced(c: &Cluster, name: &str, reason: &str) {
    eventually(SETTLE, &format!("{name} Announced {reason}"), async || {
        c.condition(name, keys::CONDITION_ANNOUNCED)
            .await
            .is_some_and(|(_, r, _)| r == reason)
    })
    .await;
}

/// A made-up node name (no such Node exists).
fn invented(c: &Cluster) -> String {
    format!("{}-no-such-node", c.ns)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_cannot_steer_an_assigned_service() {
    let _serial = serial().await;
    let c = Cluster::new("steer-assigned").await;
    let tenant = Api::<Service>::namespaced(tenant(&c).await, &c.ns);
    pool(&c, "10.81.0.1-10.81.0.4", true).await;
    let n1 = c.node("n1").await;
    let n2 = c.node("n2").await;
    let _a1 = c.fake_agent(&n1);
    let _a2 = c.fake_agent(&n2);
    let trusted = Trusted::start(&c).await;
    let (controller, _metrics) = c.start_controller();
    let invented = invented(&c);

    // The tenant's Service comes with the annotations already set.
    create_as(
        &tenant,
        lb_service("web")
            .annotate(keys::ANNOTATION_NODE, &invented)
            .annotate(keys::ANNOTATION_INTERFACE, TENANT_INTERFACE),
    )
    .await;
    announced(&c, "web", "Announced").await;
    let ip = ip_of(&c, "web").await;
    let svc = c.get("web").await;
    let node = annotation(&svc, keys::ANNOTATION_NODE).unwrap().to_owned();
    let other = if node == n1 { n2.clone() } else { n1.clone() };
    assert_ne!(node, invented);
    assert_eq!(
        annotation(&svc, keys::ANNOTATION_INTERFACE),
        Some(POOL_INTERFACE)
    );
    assert_eq!(
        trusted
            .current(&node, ip)
            .and_then(|a| a.interface)
            .as_deref(),
        Some(POOL_INTERFACE)
    );
    check(&trusted, Instant::now(), ip, Never::Anywhere, &invented);
    let mark = trusted.mark().await;

    for (steer_to, how) in [
        (Some(other.as_str()), Edit::Annotate),
        (Some(invented.as_str()), Edit::Apply),
        (None, Edit::Update),
    ] {
        let edited = Instant::now();
        steer(&tenant, "web", steer_to, Some(TENANT_INTERFACE), how).await;
        let took = taken_back(&c, "web", Some(&node), Some(POOL_INTERFACE), edited).await;
        eprintln!("assigned, {how:?} node={steer_to:?}: taken back in {took:?}");
        stays(&c, "web", Some(&node), Some(POOL_INTERFACE)).await;
        check(
            &trusted,
            mark,
            ip,
            Never::On(&[&other, &invented]),
            &invented,
        );
    }
    // An edit made while no controller runs: the next one starts from its own assignment
    // objects, not from the annotation.
    drop(controller);
    steer(
        &tenant,
        "web",
        Some(&other),
        Some(TENANT_INTERFACE),
        Edit::Annotate,
    )
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        annotation(&c.get("web").await, keys::ANNOTATION_NODE),
        Some(other.as_str()),
        "no controller runs, yet the edit was taken back"
    );
    let restarted = Instant::now();
    let (_controller, _metrics) = c.start_controller();
    let took = taken_back(&c, "web", Some(&node), Some(POOL_INTERFACE), restarted).await;
    eprintln!("assigned, edited while no controller ran: taken back {took:?} after the restart");
    stays(&c, "web", Some(&node), Some(POOL_INTERFACE)).await;
    check(
        &trusted,
        mark,
        ip,
        Never::On(&[&other, &invented]),
        &invented,
    );

    // The elected node kept the IP, on the pool's interface, in every version since.
    for v in trusted.since(mark).iter().filter(|v| v.node == node) {
        let line = v.assignments.as_ref().and_then(|a| a.ips.get(&ip));
        assert_eq!(
            line.and_then(|a| a.interface.as_deref()),
            Some(POOL_INTERFACE),
            "the elected node's assignment changed: {v:?}"
        );
    }
    assert_eq!(ip_of(&c, "web").await, ip);
    c.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_cannot_steer_a_moving_service() {
    let _serial = serial().await;
    let c = Cluster::new("steer-moving").await;
    let tenant = Api::<Service>::namespaced(tenant(&c).await, &c.ns);
    pool(&c, "10.82.0.1-10.82.0.4", true).await;
    let n1 = c.node("n1").await;
    // The old node's agent lets go of an alias only 5 s after its assignment drops it: the
    // move (break-before-make) lasts that long.
    let (_a1, holdings) = c.slow_agent(&n1, Duration::from_secs(5));
    let trusted = Trusted::start(&c).await;
    let (_controller, metrics) = c.start_controller();
    create_as(&tenant, lb_service("web")).await;
    announced(&c, "web", "Announced").await;
    assert_eq!(
        annotation(&c.get("web").await, keys::ANNOTATION_NODE),
        Some(n1.as_str())
    );
    let ip = ip_of(&c, "web").await;
    let n2 = c.node("n2").await;
    let _a2 = c.fake_agent(&n2);

    // Cordon n1: the controller takes the IP off n1 first, then waits for n1's agent.
    Api::<Node>::all(c.client.clone())
        .patch(
            &n1,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": true}})),
        )
        .await
        .unwrap();
    announced(&c, "web", "Moving").await;
    eventually(SETTLE, "n1's assignment dropped the IP", async || {
        trusted.current(&n1, ip).is_none()
    })
    .await;
    taken_back(&c, "web", None, Some(POOL_INTERFACE), Instant::now()).await;
    let invented = invented(&c);
    let mark = trusted.mark().await;

    for (steer_to, how) in [
        (n1.as_str(), Edit::Annotate),
        (invented.as_str(), Edit::Apply),
    ] {
        let edited = Instant::now();
        steer(&tenant, "web", Some(steer_to), Some(TENANT_INTERFACE), how).await;
        let took = taken_back(&c, "web", None, Some(POOL_INTERFACE), edited).await;
        eprintln!("moving, {how:?} node={steer_to}: taken back in {took:?}");
        assert!(
            holdings.reports(ip),
            "the move ended before the take-back: this did not test the moving state"
        );
        check(&trusted, mark, ip, Never::On(&[&n1, &invented]), &invented);
    }
    // The move completes to n2 once n1's agent let go, not before, and never back to n1.
    c.wait_ips("web", &[ip.to_string().as_str()], SETTLE).await;
    eventually(SETTLE, "web moved to n2", async || {
        annotation(&c.get("web").await, keys::ANNOTATION_NODE) == Some(n2.as_str())
    })
    .await;
    let released = holdings.released_at(ip).expect("n1's agent let go");
    for v in trusted.since(mark).iter().filter(|v| v.node == n2) {
        if v.assignments
            .as_ref()
            .is_some_and(|a| a.ips.contains_key(&ip))
        {
            assert!(v.received > released, "n2 got {ip} before n1 let go: {v:?}");
        }
    }
    assert_eq!(
        trusted
            .current(&n2, ip)
            .and_then(|a| a.interface)
            .as_deref(),
        Some(POOL_INTERFACE)
    );
    tokio::time::sleep(OBSERVE).await;
    check(&trusted, mark, ip, Never::On(&[&n1, &invented]), &invented);
    // One graceful failover (n1's agent was ready), measured until n2's agent held the IP.
    announced(&c, "web", "Announced").await;
    eventually(SETTLE, "the failover measured", async || {
        support::metric(
            &metrics,
            r#"aliaslb_failover_duration_seconds_count{cause="graceful"} "#,
        )
        .as_deref()
            == Some("1")
    })
    .await;
    assert_eq!(
        support::metric(&metrics, r#"aliaslb_failovers_total{cause="graceful"} "#).as_deref(),
        Some("1")
    );
    assert_eq!(
        support::metric(&metrics, r#"aliaslb_failovers_total{cause="hard"} "#),
        None
    );
    c.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_cannot_steer_a_service_without_eligible_node() {
    let _serial = serial().await;
    let c = Cluster::new("steer-noagent").await;
    let tenant = Api::<Service>::namespaced(tenant(&c).await, &c.ns);
    pool(&c, "10.83.0.1-10.83.0.4", true).await;
    let n1 = c.node("n1").await;
    // A node that never had an agent.
    let n2 = c.node("n2").await;
    let agent = c.fake_agent(&n1);
    // Another agent keeps the controller seeing: without it, the only agent stopping would
    // be blindness (every assignment kept), not the loss of n1. Its Node exists (only
    // nodes are agents) and is excluded from load balancing, so it carries nothing.
    let witness = c.node("witness").await;
    Api::<Node>::all(c.client.clone())
        .patch(
            &witness,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {
                keys::LABEL_EXCLUDE_FROM_LB: "true"
            }}})),
        )
        .await
        .unwrap();
    let _witness = c.fake_agent(&witness);
    let trusted = Trusted::start(&c).await;
    let (_controller, _metrics) = c.start_controller();
    create_as(&tenant, lb_service("web")).await;
    announced(&c, "web", "Announced").await;
    let ip = ip_of(&c, "web").await;

    // The only agent stops: past its Lease, no node may carry the IP.
    drop(agent);
    announced(&c, "web", "NoEligibleNode").await;
    taken_back(&c, "web", None, Some(POOL_INTERFACE), Instant::now()).await;
    eventually(SETTLE, "n1's assignment dropped the IP", async || {
        trusted.current(&n1, ip).is_none()
    })
    .await;
    let invented = invented(&c);
    let mark = trusted.mark().await;

    for (steer_to, how) in [
        (n1.as_str(), Edit::Annotate),
        (n2.as_str(), Edit::Update),
        (invented.as_str(), Edit::Apply),
    ] {
        let edited = Instant::now();
        steer(&tenant, "web", Some(steer_to), Some(TENANT_INTERFACE), how).await;
        let took = taken_back(&c, "web", None, Some(POOL_INTERFACE), edited).await;
        eprintln!("no eligible node, {how:?} node={steer_to}: taken back in {took:?}");
        stays(&c, "web", None, Some(POOL_INTERFACE)).await;
        check(&trusted, mark, ip, Never::Anywhere, &invented);
    }
    assert_eq!(ip_of(&c, "web").await, ip, "the IP stays with its Service");
    c.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_cannot_steer_a_local_service_without_endpoint() {
    let _serial = serial().await;
    let c = Cluster::new("steer-local").await;
    let tenant = Api::<Service>::namespaced(tenant(&c).await, &c.ns);
    // No interface option: the controller writes no interface annotation at all.
    pool(&c, "10.84.0.1-10.84.0.4", false).await;
    let n1 = c.node("n1").await;
    let _agent = c.fake_agent(&n1);
    let trusted = Trusted::start(&c).await;
    let (_controller, _metrics) = c.start_controller();
    let local = lb_service("local").spec(|s| s.external_traffic_policy = Some("Local".into()));
    create_as(&tenant, local).await;
    announced(&c, "local", "NoEligibleNode").await;
    let ip = ip_of(&c, "local").await;
    let invented = invented(&c);
    let mark = trusted.mark().await;

    for (steer_to, how) in [
        (n1.as_str(), Edit::Annotate),
        (invented.as_str(), Edit::Apply),
        (n1.as_str(), Edit::Update),
    ] {
        let edited = Instant::now();
        steer(
            &tenant,
            "local",
            Some(steer_to),
            Some(TENANT_INTERFACE),
            how,
        )
        .await;
        let took = taken_back(&c, "local", None, None, edited).await;
        eprintln!("local without endpoint, {how:?} node={steer_to}: taken back in {took:?}");
        stays(&c, "local", None, None).await;
        check(&trusted, mark, ip, Never::Anywhere, &invented);
    }
    c.cleanup().await;
}

fn is_forbidden<T>(result: Result<T, kube::Error>) -> bool {
    matches!(result, Err(kube::Error::Api(ref s)) if s.code == 403)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_cannot_reach_the_trusted_objects_nor_its_status() {
    let _serial = serial().await;
    let c = Cluster::new("tenant-rbac").await;
    let client = tenant(&c).await;
    let services = Api::<Service>::namespaced(client.clone(), &c.ns);
    create_as(&services, lb_service("web")).await;
    // What `edit` does give it: its Services, their annotations included.
    steer(&services, "web", Some("n1"), Some("eth0"), Edit::Annotate).await;

    let mut wrong = Vec::new();
    let mut expect = |what: &str, forbidden: bool| {
        if !forbidden {
            wrong.push(what.to_owned());
        }
    };
    let status =
        Patch::Merge(json!({"status": {"loadBalancer": {"ingress": [{"ip": "10.85.0.1"}]}}}));
    expect(
        "patch services/status",
        is_forbidden(
            services
                .patch_status("web", &PatchParams::default(), &status)
                .await,
        ),
    );
    let apply_status = Patch::Apply(json!({
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
        "status": {"loadBalancer": {"ingress": [{"ip": "10.85.0.1"}]}},
    }));
    expect(
        "apply services/status",
        is_forbidden(
            services
                .patch_status("web", &PatchParams::apply(TENANT).force(), &apply_status)
                .await,
        ),
    );

    let configmaps = Api::<ConfigMap>::namespaced(client.clone(), &c.system);
    let assignment = keys::assignment_configmap("n1");
    expect(
        "get ConfigMap",
        is_forbidden(configmaps.get(&assignment).await),
    );
    expect(
        "list ConfigMaps",
        is_forbidden(configmaps.list(&ListParams::default()).await),
    );
    expect(
        "watch ConfigMaps",
        is_forbidden(
            configmaps
                .watch(&WatchParams::default(), "0")
                .await
                .map(|_| ()),
        ),
    );
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": assignment},
        "data": {keys::ASSIGNMENTS_KEY: format!("10.85.0.1 cni0 - {}/web\n", c.ns)},
    }))
    .unwrap();
    expect(
        "create ConfigMap",
        is_forbidden(configmaps.create(&PostParams::default(), &cm).await),
    );
    let edit = Patch::Merge(json!({"data": {keys::ASSIGNMENTS_KEY: "10.85.0.1 cni0 - x/y\n"}}));
    expect(
        "patch ConfigMap",
        is_forbidden(
            configmaps
                .patch(&assignment, &PatchParams::default(), &edit)
                .await,
        ),
    );
    expect(
        "apply ConfigMap",
        is_forbidden(
            configmaps
                .patch(
                    &assignment,
                    &PatchParams::apply(TENANT).force(),
                    &Patch::Apply(&cm),
                )
                .await,
        ),
    );

    let leases = Api::<Lease>::namespaced(client, &c.system);
    let lease_name = keys::agent_lease_name("n1");
    expect("get Lease", is_forbidden(leases.get(&lease_name).await));
    expect(
        "list Leases",
        is_forbidden(leases.list(&ListParams::default()).await),
    );
    expect(
        "watch Leases",
        is_forbidden(leases.watch(&WatchParams::default(), "0").await.map(|_| ())),
    );
    let lease: Lease = serde_json::from_value(json!({
        "metadata": {"name": lease_name,
            "annotations": {keys::ANNOTATION_AGENT_REPORT: r#"{"version":1,"held":["10.85.0.1"]}"#}},
        "spec": {"holderIdentity": "n1", "leaseDurationSeconds": 3600},
    }))
    .unwrap();
    expect(
        "create Lease",
        is_forbidden(leases.create(&PostParams::default(), &lease).await),
    );
    let renew = Patch::Merge(json!({"spec": {"leaseDurationSeconds": 3600}}));
    expect(
        "patch Lease",
        is_forbidden(
            leases
                .patch(&lease_name, &PatchParams::default(), &renew)
                .await,
        ),
    );
    expect(
        "patch leader Lease",
        is_forbidden(
            leases
                .patch(keys::CONTROLLER_LEASE, &PatchParams::default(), &renew)
                .await,
        ),
    );
    assert!(
        wrong.is_empty(),
        "the tenant was not refused (403) on: {}",
        wrong.join(", ")
    );
    c.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ip_leaves_its_service_and_agent_before_it_is_reused() {
    let _serial = serial().await;
    let c = Cluster::new("reuse").await;
    c.set_pool(&[(c.ns.as_str(), "10.86.0.1")]).await;
    let n1 = c.node("n1").await;
    const KEEP: Duration = Duration::from_secs(3);
    let (_agent, holdings) = c.slow_agent(&n1, KEEP);
    let (_controller, _metrics) = c.start_controller();

    c.create(lb_service("a")).await;
    c.wait_ips("a", &["10.86.0.1"], SETTLE).await;
    announced(&c, "a", "Announced").await;
    let ip: IpAddr = "10.86.0.1".parse().unwrap();
    assert!(holdings.reports(ip));
    c.create(lb_service("b")).await;
    eventually(SETTLE, "b pending with PoolExhausted", async || {
        c.condition("b", keys::CONDITION_IP_ALLOCATED)
            .await
            .is_some_and(|(s, reason, _)| s == "False" && reason == "PoolExhausted")
    })
    .await;

    // A stops being a LoadBalancer. Changing only the type is enough: since 1.20 the API
    // server drops the node ports the type no longer needs itself.
    let switched = Instant::now();
    let a = Api::<Service>::namespaced(c.client.clone(), &c.ns)
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"type": "ClusterIP"}})),
        )
        .await
        .unwrap();
    let spec = a.spec.unwrap();
    assert_eq!(spec.type_.as_deref(), Some("ClusterIP"));
    assert!(
        spec.ports.unwrap().iter().all(|p| p.node_port.is_none()),
        "node port kept"
    );

    // B's status, the whole time: it may show the IP only once n1's agent stopped
    // reporting it (`released_at` is taken before the Lease write that says so).
    let end = switched + KEEP + SETTLE;
    let got = loop {
        let b = support::ingress(&c.get("b").await);
        let seen = Instant::now();
        if b.contains(&ip) {
            match holdings.released_at(ip) {
                Some(released) if released < seen => break seen,
                _ => panic!(
                    "b got {ip} {:?} after a left the LoadBalancer type, while n1's agent \
                     still reported holding it ({})",
                    seen - switched,
                    match holdings.unlisted_at(ip) {
                        Some(t) => format!(
                            "its assignment dropped it {:?} after the switch",
                            t - switched
                        ),
                        None => "its agent had not even seen its assignment drop it yet".to_owned(),
                    },
                ),
            }
        }
        assert!(
            Instant::now() < end,
            "b never got {ip}: {:?}",
            c.get("b").await.status
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let unlisted = holdings
        .unlisted_at(ip)
        .expect("n1's assignment dropped the IP");
    let released = holdings.released_at(ip).unwrap();
    eprintln!(
        "after the switch: n1's assignment dropped {ip} at {:?}, its agent let go at {:?}, \
         b got it at {:?}",
        unlisted - switched,
        released - switched,
        got - switched,
    );
    assert!(
        released - unlisted >= KEEP - Duration::from_millis(600),
        "the agent did not hold on: {:?}",
        released - unlisted
    );
    assert!(
        got - released < Duration::from_secs(3),
        "b got the freed IP only {:?} after the agent let go",
        got - released
    );
    assert!(
        support::ingress(&c.get("a").await).is_empty(),
        "a still shows {ip}"
    );
    c.cleanup().await;
}

/// A leadership term that starts while no assignment object exists at all (a restart or
/// failover before any IP was ever placed on a node, such as a fresh install whose agents
/// are not up yet; or the first start after the upgrade that introduced them) does not
/// import the nodes from the tenant-writable `aliaslb.io/node` annotations: a tenant that
/// sets them between two terms does not choose the node. Both Services on the tenant's node
/// is what trusting the annotation gave; the controller's least-loaded election puts one on
/// each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_cannot_steer_across_a_restart_before_any_assignment() {
    let _serial = serial().await;
    let c = Cluster::new("steer-fresh").await;
    let tenant = Api::<Service>::namespaced(tenant(&c).await, &c.ns);
    pool(&c, "10.87.0.1-10.87.0.4", true).await;
    let n1 = c.node("n1").await;
    let n2 = c.node("n2").await;
    let trusted = Trusted::start(&c).await;
    let (controller, _metrics) = c.start_controller();
    // No agent is up yet: the Services get IPs, no node, and no assignment object exists.
    for name in ["web1", "web2"] {
        create_as(&tenant, lb_service(name)).await;
        announced(&c, name, "NoEligibleNode").await;
    }
    let ips = [ip_of(&c, "web1").await, ip_of(&c, "web2").await];
    assert!(trusted.all().is_empty(), "{:?}", trusted.all());

    // Between two terms, the tenant names n1 for both; then the agents come up.
    drop(controller);
    for name in ["web1", "web2"] {
        steer(
            &tenant,
            name,
            Some(&n1),
            Some(TENANT_INTERFACE),
            Edit::Annotate,
        )
        .await;
    }
    let _a1 = c.fake_agent(&n1);
    let _a2 = c.fake_agent(&n2);
    // Both nodes ready in the controller's first pass, or both Services go to n1.
    c.wait_agent_leases(&[&n1, &n2]).await;
    let mark = Instant::now();
    let (_controller, _metrics) = c.start_controller();
    for name in ["web1", "web2"] {
        announced(&c, name, "Announced").await;
    }
    let on_n1: Vec<IpAddr> = ips
        .into_iter()
        .filter(|ip| trusted.current(&n1, *ip).is_some())
        .collect();
    assert!(
        on_n1.len() < 2,
        "both IPs {on_n1:?} went to the tenant's node {n1}: {:?}",
        trusted.since(mark)
    );
    c.cleanup().await;
}

/// Absence is not evidence (issue 20 item 3). Where the optional admission policy is not
/// installed an agent may delete any agent Lease: one deleted again and again moves
/// nothing while its own agent keeps writing it, and one deleted for good moves its IP only
/// once the lease duration has passed since the last renewal, as a hard loss would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_agent_lease_is_not_evidence_of_a_dead_node() {
    let _serial = serial().await;
    let c = Cluster::new("lease-deleted").await;
    c.set_pool(&[(c.ns.as_str(), "10.87.0.1")]).await;
    let n1 = c.node("n1").await;
    let n2 = c.node("n2").await;
    let mut agents = std::collections::BTreeMap::from([
        (n1.clone(), c.fake_agent(&n1)),
        (n2.clone(), c.fake_agent(&n2)),
    ]);
    let (_controller, _metrics) = c.start_controller();
    c.create(lb_service("a")).await;
    c.wait_ips("a", &["10.87.0.1"], SETTLE).await;
    announced(&c, "a", "Announced").await;
    let nodes = [n1.as_str(), n2.as_str()];
    let holder = c.holder_of(&nodes, "10.87.0.1").await.expect("a holder");
    let other = if holder == n1 { &n2 } else { &n1 };
    let leases = Api::<Lease>::namespaced(c.client.clone(), &c.system);
    let lease = keys::agent_lease_name(&holder);

    // Another node deletes the holder's Lease every 100 ms for three lease durations.
    let until = Instant::now() + 3 * support::AGENT_LEASE;
    let mut deleted = 0;
    while Instant::now() < until {
        if leases.delete(&lease, &Default::default()).await.is_ok() {
            deleted += 1;
        }
        assert_eq!(
            c.holder_of(&nodes, "10.87.0.1").await.as_deref(),
            Some(holder.as_str()),
            "the IP left {holder}, whose agent renews, after {deleted} deletions of its Lease"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(deleted >= 5, "only {deleted} deletions went through");
    announced(&c, "a", "Announced").await;

    // The holder's agent stops, and its Lease is deleted once.
    drop(agents.remove(&holder));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let cut = Instant::now();
    let _ = leases.delete(&lease, &Default::default()).await;
    let moved = loop {
        if c.holder_of(&nodes, "10.87.0.1").await.as_deref() == Some(other.as_str()) {
            break cut.elapsed();
        }
        assert!(cut.elapsed() < SETTLE, "the IP never moved to {other}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    eprintln!("Lease deleted for good: the IP moved {moved:?} later");
    // The last renewal came at most one renew interval (and the 50 ms) before the cut.
    assert!(
        moved >= support::AGENT_LEASE - support::AGENT_RENEW - Duration::from_millis(100),
        "the IP moved {moved:?} after the Lease was deleted: before its lease duration \
         ({:?}) had passed since the last renewal",
        support::AGENT_LEASE
    );
    drop(agents);
    c.cleanup().await;
}

/// Reported subnets are bounded and checked against the node's own addresses (issue 20
/// item 3): a report with a subnet wider than any LAN is rejected (its node takes nothing),
/// and a wide subnet that holds none of the addresses its Node lists does not make its node
/// the only candidate for the pool's addresses; once the Node lists an address in it, it
/// counts, and its node is the only one on the pool's subnet.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_cannot_claim_a_subnet_it_is_not_on() {
    let _serial = serial().await;
    let c = Cluster::new("wide-subnet").await;
    c.set_pool(&[(c.ns.as_str(), "10.88.9.1-10.88.9.5")]).await;
    let n1 = c.node("n1").await;
    let n2 = c.node("n2").await;
    let n3 = c.node("n3").await;
    let report = |subnet: &str| {
        serde_json::json!({
            "version": 1,
            "interfaces": [{"name": "eth0", "subnets": [subnet]}],
        })
        .to_string()
    };
    // n1 claims the /16 around the pool without any address in it; n3 half the IPv4 space.
    let _a1 = c.agent_reporting(&n1, report("10.88.0.0/16"));
    let _a2 = c.fake_agent(&n2);
    let _a3 = c.agent_reporting(&n3, report("0.0.0.0/1"));
    // n2's fake agent reads its assignment before its first renewal: the controller starts
    // once both eligible nodes' Leases exist, so its first pass sees both (else it may place
    // every Service on n1 before n2 counts, which says nothing about the subnet rule).
    c.wait_agent_leases(&[&n1, &n2]).await;
    let (_controller, _metrics) = c.start_controller();
    for name in ["a", "b", "c", "d"] {
        c.create(lb_service(name)).await;
    }
    let nodes = [n1.as_str(), n2.as_str(), n3.as_str()];
    let mut on = std::collections::BTreeMap::<String, usize>::new();
    for ip in ["10.88.9.1", "10.88.9.2", "10.88.9.3", "10.88.9.4"] {
        let mut holder = None;
        eventually(SETTLE, &format!("{ip} on a node"), async || {
            holder = c.holder_of(&nodes, ip).await;
            holder.is_some()
        })
        .await;
        *on.entry(holder.unwrap()).or_default() += 1;
    }
    assert_eq!(on.get(&n3), None, "n3's report is rejected: {on:?}");
    assert_eq!(
        (on.get(&n1), on.get(&n2)),
        (Some(&2), Some(&2)),
        "n1's unanchored /16 must not win the subnet rule: {on:?}"
    );
    // Events are written by a queue of their own, after the pass that placed the IPs.
    eventually(
        SETTLE,
        &format!("an UnanchoredSubnet Event on Node {n1}"),
        async || {
            c.events("default", &n1).await.iter().any(|e| {
                e.reason.as_deref() == Some("UnanchoredSubnet")
                    && e.note
                        .as_deref()
                        .is_some_and(|n| n.contains("10.88.0.0/16"))
            })
        },
    )
    .await;
    let lease = keys::agent_lease_name(&n3);
    eventually(
        SETTLE,
        "an InvalidAgentReport Event on n3's Lease",
        async || {
            c.events(&c.system, &lease).await.iter().any(|e| {
                e.reason.as_deref() == Some("InvalidAgentReport")
                    && e.note.as_deref().is_some_and(|n| n.contains("0.0.0.0/1"))
            })
        },
    )
    .await;

    // Once Node n1 lists an address in the /16, it counts: n1 is the only node on the
    // pool's subnet, so a new Service goes to it and the others move there (the subnet rule
    // holds for holders too).
    c.set_node_addresses(&n1, &[("InternalIP", "10.88.3.3")])
        .await;
    c.create(lb_service("e")).await;
    for ip in [
        "10.88.9.1",
        "10.88.9.2",
        "10.88.9.3",
        "10.88.9.4",
        "10.88.9.5",
    ] {
        eventually(SETTLE, &format!("{ip} on {n1}"), async || {
            c.holder_of(&nodes, ip).await.as_deref() == Some(n1.as_str())
        })
        .await;
    }
    c.cleanup().await;
}

/// A tenant's input is bounded (issue 20 item 7): a Service with more ports than one address
/// carries waits with `TooManyPorts` naming the bound, and another tenant's Service on the
/// same node is placed and announced as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_with_too_many_ports_waits_and_stops_no_other() {
    let _serial = serial().await;
    let c = Cluster::new("ports").await;
    c.set_pool(&[(c.ns.as_str(), "10.90.0.1-10.90.0.2")]).await;
    let n1 = c.node("n1").await;
    let _agent = c.fake_agent(&n1);
    let (_controller, _metrics) = c.start_controller();
    let max = aliaslb_core::plan::MAX_PORTS_PER_IP;
    let ports: Vec<k8s_openapi::api::core::v1::ServicePort> = (0..=max)
        .map(|p| k8s_openapi::api::core::v1::ServicePort {
            name: Some(format!("p{p}")),
            port: 2000 + i32::try_from(p).unwrap(),
            protocol: Some("TCP".into()),
            ..Default::default()
        })
        .collect();
    c.create(lb_service("huge").spec(move |s| s.ports = Some(ports)))
        .await;
    let message = c
        .wait_condition("huge", keys::CONDITION_IP_ALLOCATED, "TooManyPorts")
        .await;
    assert_eq!(
        message,
        format!(
            "the Service has {} ports, more than the {max} one address carries; split it \
             into Services with fewer ports",
            max + 1
        )
    );
    c.create(lb_service("web")).await;
    c.wait_ips("web", &["10.90.0.1"], SETTLE).await;
    announced(&c, "web", "Announced").await;
    assert!(c.ips("huge").await.is_empty());
    c.cleanup().await;
}

/// A node's word never renumbers a Service (issue 42 item 1), against the real API server:
/// node n2's kubelet writes the address a Service holds into its Node's status, and its
/// agent reports an interface on the /30 around it (anchored by that very address), whose
/// network and broadcast addresses two more Services hold. All three keep their addresses
/// (sampled throughout), each with a Warning `NodeClaim` naming n2 and what it claimed and
/// IPAllocated True `NodeClaim`; a new Service gets none of them, and an address let go
/// while n2 claims it is not handed out again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nodes_word_never_renumbers_a_service() {
    use aliaslb_core::report::{AgentReport, InterfaceReport, REPORT_VERSION};
    use std::sync::atomic::{AtomicBool, Ordering};
    let _serial = serial().await;
    let c = Cluster::new("node-word").await;
    // a .4 (the /30's network address), b .5 (n2's new ExternalIP), x .6, d .7 (broadcast).
    c.set_pool(&[(c.ns.as_str(), "10.86.0.4-10.86.0.9")]).await;
    let n1 = c.node("n1").await;
    let n2 = c.node("n2").await;
    let claims = Arc::new(AtomicBool::new(false));
    let agent = |node: &str, subnet: &'static str, claims: Option<Arc<AtomicBool>>| {
        let assignments = Api::<ConfigMap>::namespaced(c.client.clone(), &c.system);
        let node_name = node.to_owned();
        c.agent_with(node, move || {
            let assignments = assignments.clone();
            let node = node_name.clone();
            let claims = claims.clone();
            async move {
                let held = support::assigned_ips(&assignments, &node).await;
                let mut subnets = vec![subnet.parse().unwrap()];
                if claims.is_some_and(|c| c.load(Ordering::SeqCst)) {
                    subnets.push("10.86.0.4/30".parse().unwrap());
                }
                AgentReport {
                    version: REPORT_VERSION,
                    held,
                    interfaces: vec![InterfaceReport {
                        name: "eth1".into(),
                        subnets,
                        mac: None,
                        addresses: Vec::new(),
                    }],
                    ..AgentReport::default()
                }
                .to_json()
            }
        })
    };
    // Both nodes on the /24 around the pool (whose edges the pool does not list).
    let _a1 = agent(&n1, "10.86.0.0/24", None);
    let _a2 = agent(&n2, "10.86.0.0/24", Some(claims.clone()));
    c.wait_agent_leases(&[&n1, &n2]).await;
    let config = aliaslb_controller::config::ControllerConfig {
        hold_released: Duration::ZERO,
        ..c.config()
    };
    let (_controller, _metrics) = c.start_controller_with(config);
    for (name, ip) in [
        ("a", "10.86.0.4"),
        ("b", "10.86.0.5"),
        ("x", "10.86.0.6"),
        ("d", "10.86.0.7"),
    ] {
        c.create(lb_service(name)).await;
        c.wait_ips(name, &[ip], SETTLE).await;
    }

    // n2 claims: its kubelet writes .5, its agent reports the /30 (anchored by .5).
    c.set_node_addresses(&n2, &[("InternalIP", "10.86.0.5")])
        .await;
    claims.store(true, Ordering::SeqCst);
    let held = [("a", "10.86.0.4"), ("b", "10.86.0.5"), ("d", "10.86.0.7")];
    let until = Instant::now() + 3 * support::AGENT_LEASE;
    while Instant::now() < until {
        for (name, ip) in held {
            assert_eq!(
                c.ips(name).await,
                [ip],
                "{name} was renumbered by node {n2}'s word"
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for (name, ip, what) in [
        ("a", "10.86.0.4", "network address of subnet 10.86.0.4/30"),
        ("b", "10.86.0.5", "InternalIP"),
        ("d", "10.86.0.7", "broadcast address of subnet 10.86.0.4/30"),
    ] {
        let message = c
            .wait_condition_where(name, keys::CONDITION_IP_ALLOCATED, "NodeClaim", |m| {
                m.contains(ip) && m.contains(&n2) && m.contains(what)
            })
            .await;
        eprintln!("{name}: IPAllocated NodeClaim: {message}");
        eventually(
            SETTLE,
            &format!("a NodeClaim Warning on {name}"),
            async || {
                c.events(&c.ns, name).await.iter().any(|e| {
                    e.type_.as_deref() == Some("Warning")
                        && e.reason.as_deref() == Some("NodeClaim")
                        && e.note
                            .as_deref()
                            .is_some_and(|n| n.contains(ip) && n.contains(&n2) && n.contains(what))
                })
            },
        )
        .await;
    }
    // A new Service gets none of the claimed addresses.
    c.create(lb_service("e")).await;
    c.wait_ips("e", &["10.86.0.8"], SETTLE).await;
    // b goes: its address stays out of use while n2 lists it.
    c.delete("b").await;
    c.create(lb_service("f")).await;
    c.wait_ips("f", &["10.86.0.9"], SETTLE).await;
    c.create(lb_service("g")).await;
    let message = c
        .wait_condition_where("g", keys::CONDITION_IP_ALLOCATED, "PoolExhausted", |m| {
            m.contains("10.86.0.5 is the InternalIP of node")
        })
        .await;
    eprintln!("g: {message}");
    c.cleanup().await;
}

/// What a [`keeping_agent`] reported: the IPs it holds now, and when each was last let go.
#[derive(Debug, Default)]
struct Kept {
    held: std::collections::BTreeSet<IpAddr>,
    released_at: BTreeMap<IpAddr, Instant>,
}

/// A fake agent for `node` that acts as a real one on a missing assignment object: it holds
/// what its objects list, and keeps the last set read while they are missing (its Lease
/// fresh). Records when it lets go of each IP (just before the Lease write that says so).
fn keeping_agent(c: &Cluster, node: &str) -> (Task, Arc<Mutex<Kept>>) {
    use aliaslb_core::report::{AgentReport, REPORT_VERSION};
    let api = Api::<ConfigMap>::namespaced(c.client.clone(), &c.system);
    let kept: Arc<Mutex<Kept>> = Arc::default();
    let (state, name) = (kept.clone(), node.to_owned());
    let task = c.agent_with(node, move || {
        let (api, state, name) = (api.clone(), state.clone(), name.clone());
        async move {
            let read = support::read_assignment(&api, &name).await;
            let mut s = state.lock().unwrap();
            if let Some(assignments) = read {
                let now: std::collections::BTreeSet<IpAddr> = assignments.held_ips().collect();
                for ip in s.held.difference(&now).copied().collect::<Vec<_>>() {
                    s.released_at.insert(ip, Instant::now());
                }
                s.held = now;
            }
            AgentReport {
                version: REPORT_VERSION,
                held: s.held.clone(),
                ..AgentReport::default()
            }
            .to_json()
        }
    });
    (task, kept)
}

/// No double holder across a leader change with an assignment object missing (issue 42
/// item 5): node n1 holds four Services' IPs, n2 carries nothing; n1's objects are deleted
/// while no controller runs, and its agent keeps holding them (its Lease is fresh). The next
/// leader has no trusted node for them, and two equally loaded nodes: it must not give any
/// of them to n2 before n1's agent lets go. Every version of every assignment object is
/// recorded (`Trusted`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_double_holder_across_a_leader_change_with_an_assignment_object_missing() {
    let _serial = serial().await;
    let c = Cluster::new("object-missing").await;
    c.set_pool(&[(c.ns.as_str(), "10.84.0.1-10.84.0.8")]).await;
    let n1 = c.node("n1").await;
    let n2 = c.node("n2").await;
    // Only n1's agent runs at first: it gets every Service.
    let (_k1, kept) = keeping_agent(&c, &n1);
    c.wait_agent_leases(&[&n1]).await;
    let trusted = Trusted::start(&c).await;
    let (controller, _metrics) = c.start_controller();
    let names = ["s1", "s2", "s3", "s4"];
    for name in names {
        c.create(lb_service(name)).await;
    }
    for name in names {
        announced(&c, name, "Announced").await;
    }
    let mut ips = Vec::new();
    for name in names {
        ips.push(ip_of(&c, name).await);
    }
    let (holder, other) = (n1.clone(), n2.clone());
    // n2's agent starts: as eligible as n1, and carrying nothing.
    let (_k2, _) = keeping_agent(&c, &n2);
    c.wait_agent_leases(&[&n2]).await;

    // No controller; the holder's objects are deleted (by hand, a prune); its agent keeps.
    drop(controller);
    let api = Api::<ConfigMap>::namespaced(c.client.clone(), &c.system);
    let label = format!(
        "{}={}",
        keys::LABEL_ASSIGNMENT_NODE,
        keys::assignment_node_label(&holder)
    );
    api.delete_collection(&Default::default(), &ListParams::default().labels(&label))
        .await
        .unwrap();
    tokio::time::sleep(2 * support::AGENT_RENEW).await;
    assert!(
        ips.iter().all(|ip| kept.lock().unwrap().held.contains(ip)),
        "the holder's agent keeps its set"
    );
    let mark = trusted.mark().await;

    // The next leader.
    let (_controller, _metrics) = c.start_controller();
    let deadline = Instant::now() + SETTLE;
    loop {
        let mut states = Vec::new();
        for name in names {
            states.push((name, c.condition(name, keys::CONDITION_ANNOUNCED).await));
        }
        if states
            .iter()
            .all(|(_, s)| s.as_ref().is_some_and(|(_, r, _)| r == "Announced"))
        {
            break;
        }
        if Instant::now() > deadline {
            let n1_lines = c.assignment_data(&n1).await;
            let n2_lines = c.assignment_data(&n2).await;
            panic!(
                "not announced again: {states:?}\nn1 {n1_lines:?}\nn2 {n2_lines:?}\nkept {:?}",
                kept.lock().unwrap()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(support::AGENT_LEASE).await;
    let mut wrong = Vec::new();
    for v in trusted.since(mark).iter().filter(|v| v.node == other) {
        for ip in &ips {
            if !v
                .assignments
                .as_ref()
                .is_some_and(|a| a.ips.contains_key(ip))
            {
                continue;
            }
            let released = kept.lock().unwrap().released_at.get(ip).copied();
            if released.is_none_or(|at| at > v.received) {
                wrong.push(format!(
                    "{ip} assigned to {other} at {:?} while {holder}'s agent held it (let go {:?})",
                    v.received.duration_since(mark),
                    released.map(|at| at.duration_since(mark)),
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "double holder:\n{}", wrong.join("\n"));
    c.cleanup().await;
}

/// Only nodes are agents (issue 42 item 2): a Lease `aliaslb-agent-<x>` whose Node `<x>`
/// does not exist (written by a compromised node where the admission policy is off) is
/// ignored: its MAC reaches no node's assignment object, it is counted in
/// `aliaslb_agent_leases_ignored`; once a Node of that name exists, its renewals make it an
/// agent like any other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_of_a_node_that_does_not_exist_is_ignored() {
    let _serial = serial().await;
    let c = Cluster::new("ghost").await;
    c.set_pool(&[(c.ns.as_str(), "10.83.0.1-10.83.0.4")]).await;
    let n1 = c.node("n1").await;
    let _a1 = c.fake_agent(&n1);
    // The ghost: a copy of a real report with a MAC of its own, holding a pool address.
    let ghost = format!("{}-ghost", c.ns);
    const GHOST_MAC: &str = "02:00:00:00:0e:0e";
    let report = serde_json::json!({
        "version": 1,
        "interfaces": [{"name": "eth1", "subnets": ["10.83.0.0/24"], "mac": GHOST_MAC}],
        "held": ["10.83.0.1"],
        "macs": [GHOST_MAC],
    })
    .to_string();
    let _ghost_agent = c.agent_reporting(&ghost, report);
    c.wait_agent_leases(&[&n1, &ghost]).await;
    let (_controller, metrics) = c.start_controller();
    c.create(lb_service("web")).await;
    announced(&c, "web", "Announced").await;
    eventually(SETTLE, "the ghost counted", async || {
        support::metric(&metrics, "aliaslb_agent_leases_ignored").as_deref() == Some("1")
    })
    .await;
    assert_eq!(
        support::metric(&metrics, "aliaslb_agents_ready").as_deref(),
        Some("1"),
        "the ghost is no agent"
    );
    // Neither as a node's MAC (older indexes) nor as a peer's (per-node keys).
    let index = c.assignment_data(&n1).await;
    for key in [keys::NODE_MACS_KEY, keys::PEERS_KEY] {
        let macs = index.get(key).cloned().unwrap_or_default();
        assert!(
            !macs.contains(GHOST_MAC),
            "a ghost's MAC in {n1}'s index, {key}: {macs:?}"
        );
    }
    // A ghost's held address is nothing: the pool's first address went to web.
    assert_eq!(c.ips("web").await, ["10.83.0.1"]);

    // A Node of that name appears: its Lease, renewed, is an agent's.
    let node: k8s_openapi::api::core::v1::Node = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Node", "metadata": {"name": ghost},
    }))
    .unwrap();
    Api::<Node>::all(c.client.clone())
        .create(&PostParams::default(), &node)
        .await
        .unwrap();
    eventually(SETTLE, "no ghost left", async || {
        support::metric(&metrics, "aliaslb_agent_leases_ignored").as_deref() == Some("0")
    })
    .await;
    // Now a node: its agent counts as one like any other.
    eventually(SETTLE, "an agent once it is a node", async || {
        support::metric(&metrics, "aliaslb_agents_ready").as_deref() == Some("2")
    })
    .await;
    Api::<Node>::all(c.client.clone())
        .delete(&ghost, &Default::default())
        .await
        .unwrap();
    c.cleanup().await;
}
