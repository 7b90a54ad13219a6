//! The sharded node assignment against the real kube-apiserver (1.37; 1.30 too): a node
//! that carries more than a shard holds is split over several objects, a new Service then
//! writes the one shard its address is in (never the node's other lines), and the
//! single-object format of earlier releases is imported (no node changes) and converted.
//! A first convergence of many Services writes them in slices, the assignments first, so
//! most get their IP and `Announced=True` in one status write.
//! Agents are faked by renewing their Leases from the test.

mod support;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aliaslb_core::assignment::NodeAssignments;
use aliaslb_core::assignment::shards::{LEGACY_MARKER, MAX_SHARD_BYTES, MAX_SHARD_LINES};
use aliaslb_core::keys;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde_json::json;
use support::{Cluster, Task, eventually, lb_service, read_assignment, serial};

use support::SETTLE;

/// Services on the one node: more than one shard holds.
const MANY: usize = 600;

/// The names and data sizes of the assignment objects written while a watch runs.
#[derive(Default)]
struct Writes(Mutex<Vec<(String, usize)>>);

impl Writes {
    /// Watches the assignment objects of `c` from now on (the initial list is not a write).
    async fn start(c: &Cluster) -> (Arc<Writes>, Task) {
        let writes = Arc::new(Writes::default());
        let api = Api::<ConfigMap>::namespaced(c.client.clone(), &c.system);
        let log = writes.clone();
        let config = watcher::Config::default().labels(keys::LABEL_ASSIGNMENTS);
        let task = watch_changes(api, config, move |cm: ConfigMap| {
            let size = cm.data.iter().flatten().map(|(_, v)| v.len()).sum();
            let name = cm.metadata.name.unwrap_or_default();
            log.0.lock().unwrap().push((name, size));
        })
        .await;
        (writes, task)
    }

    fn take(&self) -> Vec<(String, usize)> {
        std::mem::take(&mut self.0.lock().unwrap())
    }
}

/// Watches `api` and calls `changed` with every object created or changed after the
/// watch's initial list, which it waits for.
async fn watch_changes<K>(
    api: Api<K>,
    config: watcher::Config,
    mut changed: impl FnMut(K) + Send + 'static,
) -> Task
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    let (synced_tx, synced_rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let stream = watcher::watcher(api, config);
        futures::pin_mut!(stream);
        let mut synced = Some(synced_tx);
        while let Some(event) = stream.next().await {
            match event {
                Ok(watcher::Event::InitDone) => {
                    if let Some(tx) = synced.take() {
                        let _ = tx.send(());
                    }
                }
                Ok(watcher::Event::Apply(object)) => changed(object),
                _ => {}
            }
        }
    });
    synced_rx.await.unwrap();
    Task(task)
}

/// `node`'s objects, by name, with their data.
async fn objects(c: &Cluster, node: &str) -> Vec<ConfigMap> {
    let label = format!(
        "{}={}",
        keys::LABEL_ASSIGNMENT_NODE,
        keys::assignment_node_label(node)
    );
    Api::<ConfigMap>::namespaced(c.client.clone(), &c.system)
        .list(&kube::api::ListParams::default().labels(&label))
        .await
        .unwrap()
        .items
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_node_is_sharded_and_a_new_service_writes_one_shard() {
    let _serial = serial().await;
    let c = Cluster::new("shards").await;
    c.set_pool(&[(c.ns.as_str(), "10.63.0.0/21")]).await;
    let node = c.node("a").await;
    let _agent = c.fake_agent(&node);
    let (_controller, _metrics) = c.start_controller();
    let api = Api::<Service>::namespaced(c.client.clone(), &c.ns);
    futures::stream::iter(0..MANY)
        .for_each_concurrent(16, |i| {
            let api = api.clone();
            async move {
                let svc = lb_service(&format!("svc-{i:03}")).build();
                api.create(&PostParams::default(), &svc).await.unwrap();
            }
        })
        .await;
    let assignments = Api::<ConfigMap>::namespaced(c.client.clone(), &c.system);
    eventually(
        Duration::from_secs(60),
        "every Service's address in the node's shards, none a first claim",
        async || {
            read_assignment(&assignments, &node)
                .await
                .is_some_and(|a| a.ips.len() == MANY && a.ips.values().all(|l| !l.probe))
        },
    )
    .await;
    let listed = objects(&c, &node).await;
    let index_name = keys::assignment_configmap(&node);
    let index = listed
        .iter()
        .find(|cm| cm.metadata.name.as_deref() == Some(index_name.as_str()))
        .expect("the index");
    let data = index.data.as_ref().unwrap();
    let count: u32 = data[keys::SHARDS_KEY].parse().unwrap();
    assert!(count >= 2, "{MANY} lines need 2 shards at least: {count}");
    assert_eq!(data[keys::ASSIGNMENTS_KEY], LEGACY_MARKER);
    assert_eq!(
        listed.len(),
        count as usize + 1,
        "the index and its shards, nothing else"
    );
    for cm in &listed {
        let text = cm
            .data
            .as_ref()
            .and_then(|d| d.get(keys::ASSIGNMENTS_KEY))
            .unwrap();
        assert!(
            text.lines().count() <= MAX_SHARD_LINES,
            "{:?}",
            cm.metadata.name
        );
        assert!(text.len() <= MAX_SHARD_BYTES, "{:?}", cm.metadata.name);
    }

    // One more Service: its shard is written (the first claim, then without `probe` once
    // the agent holds it), no other object, and each write is a shard's size, not the node's.
    let (writes, _watch) = Writes::start(&c).await;
    c.create(lb_service("one-more")).await;
    c.wait_condition("one-more", keys::CONDITION_ANNOUNCED, "Announced")
        .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let ip: IpAddr = c.ips("one-more").await[0].parse().unwrap();
    let shard = aliaslb_core::assignment::shards::shard_of(ip, count);
    let written = writes.take();
    let names: BTreeSet<&str> = written.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        BTreeSet::from([keys::assignment_shard_configmap(&node, shard).as_str()]),
        "only the new address's shard is written: {written:?}"
    );
    assert!(
        (1..=2).contains(&written.len()),
        "the first claim, then without probe: {written:?}"
    );
    let whole = read_assignment(&assignments, &node)
        .await
        .unwrap()
        .render()
        .len();
    for (name, size) in &written {
        assert!(
            *size * 3 < whole * 2,
            "{name}: {size} bytes written, the node's lines are {whole}"
        );
    }

    // Our own writes are not taken for edits (a change renders its shard alone, above);
    // an edit by someone else is: a shard emptied by hand is written whole again.
    let before = read_assignment(&assignments, &node).await.unwrap();
    let other = (shard + 1) % count;
    let emptied = keys::assignment_shard_configmap(&node, other);
    assignments
        .patch(
            &emptied,
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {keys::ASSIGNMENTS_KEY: ""}})),
        )
        .await
        .unwrap();
    eventually(
        Duration::from_secs(10),
        "the emptied shard written again with its lines",
        async || read_assignment(&assignments, &node).await.as_ref() == Some(&before),
    )
    .await;
    c.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_single_object_format_is_imported_and_converted() {
    let _serial = serial().await;
    let c = Cluster::new("legacy").await;
    c.set_pool(&[(c.ns.as_str(), "10.64.0.0/24")]).await;
    let nodes = [c.node("a").await, c.node("b").await, c.node("c").await];
    let _agents: Vec<Task> = nodes.iter().map(|n| c.fake_agent(n)).collect();
    // What an earlier controller left: six Services with their IPs in status, all carried
    // by node c in its single object. A controller electing afresh spreads them.
    let api = Api::<Service>::namespaced(c.client.clone(), &c.ns);
    let mut legacy = NodeAssignments::new();
    for i in 1..=6u8 {
        let name = format!("old-{i}");
        c.create(lb_service(&name)).await;
        let ip = format!("10.64.0.{i}");
        let status =
            json!({"status": {"loadBalancer": {"ingress": [{"ip": ip, "ipMode": "VIP"}]}}});
        api.patch_status(&name, &PatchParams::default(), &Patch::Merge(status))
            .await
            .unwrap();
        legacy.assign(ip.parse().unwrap(), None, [], &format!("{}/{name}", c.ns));
    }
    let index_name = keys::assignment_configmap(&nodes[2]);
    let object = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {
            "name": index_name,
            "labels": {keys::LABEL_ASSIGNMENTS: "true"},
        },
        "data": {keys::ASSIGNMENTS_KEY: legacy.render(), keys::NODE_MACS_KEY: ""},
    });
    let params = PatchParams::apply(keys::CONTROLLER_FIELD_MANAGER).force();
    let assignments = Api::<ConfigMap>::namespaced(c.client.clone(), &c.system);
    assignments
        .patch(&index_name, &params, &Patch::Apply(object))
        .await
        .unwrap();

    // Node c must be ready in the controller's first pass, or its Services move.
    c.wait_agent_leases(&[&nodes[0], &nodes[1], &nodes[2]])
        .await;
    let (_controller, _metrics) = c.start_controller();
    eventually(SETTLE, "node c's index in the sharded format", async || {
        objects(&c, &nodes[2]).await.iter().any(|cm| {
            cm.metadata.name.as_deref() == Some(index_name.as_str())
                && cm
                    .data
                    .as_ref()
                    .is_some_and(|d| d.contains_key(keys::SHARDS_KEY))
        })
    })
    .await;
    let read = read_assignment(&assignments, &nodes[2]).await.unwrap();
    assert_eq!(
        read.ips.keys().collect::<Vec<_>>(),
        legacy.ips.keys().collect::<Vec<_>>(),
        "every address stays on node c"
    );
    for i in 1..=6 {
        let name = format!("old-{i}");
        assert_eq!(c.ips(&name).await, [format!("10.64.0.{i}")], "{name}");
        c.wait_condition(&name, keys::CONDITION_ANNOUNCED, "Announced")
            .await;
        let svc = c.get(&name).await;
        assert_eq!(
            support::annotation(&svc, keys::ANNOTATION_NODE),
            Some(nodes[2].as_str()),
            "{name} stays where the earlier controller put it"
        );
    }
    for node in &nodes[..2] {
        let read = read_assignment(&assignments, node).await;
        assert!(
            read.as_ref().is_none_or(NodeAssignments::is_empty),
            "{node}: {read:?}"
        );
    }
    c.cleanup().await;
}

/// Services that exist before the controller starts: several passes' worth of writes.
const CONVERGE: usize = 2000;

/// What a watch saw of each Service: the `Announced` condition's status in the first
/// version with an ingress IP, and in the latest.
#[derive(Default)]
struct Announced {
    first: HashMap<String, String>,
    latest: HashMap<String, String>,
    /// The Events on Services seen when the last Service got its IP.
    events_at_last_ip: Option<usize>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_convergence_writes_most_services_once_with_announced() {
    let _serial = serial().await;
    let c = Cluster::new("converge").await;
    c.set_pool(&[(c.ns.as_str(), "10.63.8.0/21")]).await;
    let node = c.node("a").await;
    let api = Api::<Service>::namespaced(c.client.clone(), &c.ns);
    let names: Vec<String> = (0..CONVERGE).map(|i| format!("svc-{i:04}")).collect();
    futures::stream::iter(&names)
        .for_each_concurrent(16, |name| {
            let api = api.clone();
            async move {
                api.create(&PostParams::default(), &lb_service(name).build())
                    .await
                    .unwrap();
            }
        })
        .await;

    // The Events on Services, by name (each is created once).
    let events = Arc::new(Mutex::new(HashSet::new()));
    let log = events.clone();
    let _events = watch_changes(
        Api::<Event>::namespaced(c.client.clone(), &c.ns),
        watcher::Config::default(),
        move |e: Event| {
            if e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some("Service") {
                log.lock()
                    .unwrap()
                    .insert(e.metadata.name.unwrap_or_default());
            }
        },
    )
    .await;
    let seen = Arc::new(Mutex::new(Announced::default()));
    let log = seen.clone();
    let counted = events.clone();
    let _watch = watch_changes(
        api.clone(),
        watcher::Config::default(),
        move |svc: Service| {
            let status = svc.status.as_ref();
            let has_ip = status
                .and_then(|s| s.load_balancer.as_ref())
                .and_then(|lb| lb.ingress.as_ref())
                .is_some_and(|i| !i.is_empty());
            if !has_ip {
                return;
            }
            let announced = status
                .and_then(|s| s.conditions.as_ref())
                .and_then(|cs| cs.iter().find(|c| c.type_ == keys::CONDITION_ANNOUNCED))
                .map_or_else(|| "absent".to_owned(), |c| c.status.clone());
            let name = svc.metadata.name.unwrap_or_default();
            let mut seen = log.lock().unwrap();
            seen.first.entry(name.clone()).or_insert(announced.clone());
            seen.latest.insert(name, announced);
            if seen.first.len() == CONVERGE && seen.events_at_last_ip.is_none() {
                seen.events_at_last_ip = Some(counted.lock().unwrap().len());
            }
        },
    )
    .await;
    assert!(
        seen.lock().unwrap().first.is_empty(),
        "no IP before the controller starts"
    );

    let _agent = c.fake_agent(&node);
    let (_controller, _metrics) = c.start_controller();
    eventually(
        Duration::from_secs(120),
        "every Service Announced=True",
        async || {
            let seen = seen.lock().unwrap();
            seen.latest.len() == CONVERGE && seen.latest.values().all(|s| s == "True")
        },
    )
    .await;
    let twice = seen
        .lock()
        .unwrap()
        .first
        .values()
        .filter(|s| *s != "True")
        .count();
    eprintln!(
        "{twice} of {CONVERGE} Services had their IP written before Announced=True (agent renewing every {:?})",
        support::AGENT_RENEW
    );
    // A pass writing every Service at once writes all of them twice (the agent has not
    // reported anything when the IPs are written); in slices, only those written before the
    // agent's report did: the first slice or two.
    assert!(
        twice * 2 <= CONVERGE,
        "{twice} of {CONVERGE} Services had their IP and Announced=True in separate writes"
    );
    // Events yield to the status writes while the writer has a burst left: one in flight
    // beside its 16. Sharing the API server equally, they would be about as many as the
    // statuses written by then (each Service has two: IPAllocated, and NodeAssigned).
    let early = seen.lock().unwrap().events_at_last_ip.unwrap();
    eprintln!("{early} Events on Services were posted when the last Service got its IP");
    assert!(
        early * 4 <= CONVERGE,
        "{early} Events were posted before the last of {CONVERGE} Services got its IP"
    );
    // Delayed, not dropped.
    eventually(
        Duration::from_secs(60),
        "two Events per Service",
        async || events.lock().unwrap().len() >= 2 * CONVERGE,
    )
    .await;

    futures::stream::iter(&names)
        .for_each_concurrent(16, |name| {
            let api = api.clone();
            async move {
                let _ = api.delete(name, &DeleteParams::default()).await;
            }
        })
        .await;
    c.cleanup().await;
}

/// A port change is a line change although the plan stays (same IP, same node): the line
/// shows the new port, the other Service's line is left as it was. Our own status writes
/// change the view too, but no line: the index touches a node for changed ports only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_change_rewrites_its_line_alone() {
    let _serial = serial().await;
    let c = Cluster::new("ports").await;
    c.set_pool(&[(c.ns.as_str(), "10.63.16.0/29")]).await;
    let node = c.node("a").await;
    let _agent = c.fake_agent(&node);
    c.wait_agent_leases(&[&node]).await;
    let (_controller, _metrics) = c.start_controller();
    c.create(lb_service("web")).await;
    c.create(lb_service("db").port(5432)).await;
    for name in ["web", "db"] {
        c.wait_condition(name, keys::CONDITION_ANNOUNCED, "Announced")
            .await;
    }
    let web = c.ips("web").await[0].clone();
    let db = c.ips("db").await[0].clone();
    let db_line = c.assignment_line(&node, &db).await.expect("db's line");
    let web_line = c.assignment_line(&node, &web).await.expect("web's line");
    assert!(web_line.contains("tcp:80 "), "{web_line}");

    let api = Api::<Service>::namespaced(c.client.clone(), &c.ns);
    let ports = json!({"spec": {"ports": [{"name": "https", "port": 8443, "protocol": "TCP"}]}});
    api.patch("web", &PatchParams::default(), &Patch::Merge(ports))
        .await
        .unwrap();
    eventually(
        SETTLE,
        "web's line opens 8443 and no longer 80",
        async || {
            c.assignment_line(&node, &web)
                .await
                .is_some_and(|l| l.contains("tcp:8443 ") && !l.contains("tcp:80 "))
        },
    )
    .await;
    assert_eq!(c.ips("web").await, [web], "the plan stays");
    assert_eq!(c.assignment_line(&node, &db).await, Some(db_line));
    c.cleanup().await;
}
