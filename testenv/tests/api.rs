//! What the controller relies on, proven against the real kube-apiserver the tests use (1.37; 1.30 too):
//! LoadBalancer Services, the status subresource, how `ipMode` is handled, Leases, watchers,
//! Events and RBAC for ServiceAccounts.

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{ConfigMap, LoadBalancerIngress, Service};
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::watcher;
use kube::{Api, Client, Resource};
use serde_json::json;

use aliaslb_testenv::{TestEnv, fixtures};

/// A `type: LoadBalancer` Service with one TCP port, to create (the server sets its uid).
fn lb_service(name: &str) -> Service {
    fixtures::lb_service("", name)
        .meta(|m| m.uid = None)
        .build()
}

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        ..ObjectMeta::default()
    }
}

/// The admin client and a fresh namespace for one test.
async fn setup(hint: &str) -> (Client, String) {
    let env = TestEnv::global();
    let client = env.client().await;
    let ns = env.create_namespace(&client, hint).await;
    (client, ns)
}

async fn create_lb_service(client: &Client, ns: &str, name: &str) -> Api<Service> {
    let api = Api::<Service>::namespaced(client.clone(), ns);
    api.create(&PostParams::default(), &lb_service(name))
        .await
        .expect("create LoadBalancer Service");
    api
}

fn ingress_of(svc: &Service) -> Vec<LoadBalancerIngress> {
    svc.status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.clone())
        .unwrap_or_default()
}

#[tokio::test]
async fn load_balancer_service_gets_a_cluster_ip_and_no_ingress() {
    let (client, ns) = setup("lb-service").await;
    let api = create_lb_service(&client, &ns, "web").await;

    let svc = api.get("web").await.unwrap();
    let spec = svc.spec.as_ref().unwrap();
    let ip: std::net::Ipv4Addr = spec
        .cluster_ip
        .as_deref()
        .expect("cluster IP assigned")
        .parse()
        .expect("cluster IP is IPv4");
    let range: ipnet::Ipv4Net = aliaslb_testenv::SERVICE_CLUSTER_IP_RANGE.parse().unwrap();
    assert!(range.contains(&ip), "{ip} outside {range}");
    assert!(
        ingress_of(&svc).is_empty(),
        "nobody assigned an IP yet, so the Service must be pending"
    );
    assert!(
        spec.load_balancer_class.is_none(),
        "1.20 has no loadBalancerClass"
    );
}

#[tokio::test]
async fn status_subresource_patch_is_read_back() {
    let (client, ns) = setup("lb-status").await;
    let api = create_lb_service(&client, &ns, "web").await;

    let patch = json!({"status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.10"}]}}});
    let patched = api
        .patch_status("web", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("merge patch of status");
    assert_eq!(ingress_of(&patched)[0].ip.as_deref(), Some("192.0.2.10"));

    let read = api.get("web").await.unwrap();
    let ingress = ingress_of(&read);
    assert_eq!(ingress.len(), 1);
    assert_eq!(ingress[0].ip.as_deref(), Some("192.0.2.10"));

    // A status write through the main resource is ignored: only the subresource sets status.
    let spec_patch = json!({"status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.99"}]}}});
    api.patch("web", &PatchParams::default(), &Patch::Merge(&spec_patch))
        .await
        .unwrap();
    let read = api.get("web").await.unwrap();
    assert_eq!(ingress_of(&read)[0].ip.as_deref(), Some("192.0.2.10"));
}

/// Whether the server models `status.loadBalancer.ingress[].ipMode` (beta and on by default
/// since 1.30). The cached test server is 1.20, which does not.
async fn server_knows_ip_mode(client: &Client) -> bool {
    let version = client.apiserver_version().await.unwrap();
    let minor: u32 = version
        .minor
        .trim_end_matches('+')
        .parse()
        .expect("numeric minor version");
    version.major == "1" && minor >= 30
}

#[tokio::test]
async fn merge_patch_silently_drops_ip_mode_on_old_servers() {
    let (client, ns) = setup("ipmode-merge").await;
    let api = create_lb_service(&client, &ns, "web").await;

    let patch =
        json!({"status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.11", "ipMode": "VIP"}]}}});
    api.patch_status("web", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("the server accepts the patch");

    let ingress = ingress_of(&api.get("web").await.unwrap());
    assert_eq!(ingress[0].ip.as_deref(), Some("192.0.2.11"));
    if server_knows_ip_mode(&client).await {
        assert_eq!(ingress[0].ip_mode.as_deref(), Some("VIP"));
    } else {
        assert_eq!(
            ingress[0].ip_mode, None,
            "an old server drops ipMode silently"
        );
    }
}

#[tokio::test]
async fn server_side_apply_with_ip_mode_is_rejected_on_old_servers() {
    let (client, ns) = setup("ipmode-ssa").await;
    let api = create_lb_service(&client, &ns, "web").await;
    let params = PatchParams::apply("aliaslb-controller").force();

    let with_ip_mode = json!({
        "apiVersion": "v1", "kind": "Service",
        "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.12", "ipMode": "VIP"}]}}
    });
    let result = api
        .patch_status("web", &params, &Patch::Apply(&with_ip_mode))
        .await;
    if server_knows_ip_mode(&client).await {
        let applied = result.expect("a current server accepts ipMode");
        assert_eq!(ingress_of(&applied)[0].ip_mode.as_deref(), Some("VIP"));
        return;
    }
    let err = result.expect_err("SSA with a field unknown to the server must fail");
    let kube::Error::Api(status) = &err else {
        panic!("expected an API error, got {err}");
    };
    assert_eq!(status.code, 500, "{status:?}");
    assert!(
        status.message.contains("field not declared in schema"),
        "{status:?}"
    );
    assert!(
        ingress_of(&api.get("web").await.unwrap()).is_empty(),
        "the whole patch is rejected"
    );

    // Without ipMode the same apply works, so the controller can fall back to it.
    let without = json!({
        "apiVersion": "v1", "kind": "Service",
        "status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.12"}]}}
    });
    let applied = api
        .patch_status("web", &params, &Patch::Apply(&without))
        .await
        .expect("SSA without ipMode");
    assert_eq!(ingress_of(&applied)[0].ip.as_deref(), Some("192.0.2.12"));
}

#[tokio::test]
async fn lease_is_created_renewed_and_guarded_by_resource_version() {
    let (client, ns) = setup("lease").await;
    let api = Api::<Lease>::namespaced(client, &ns);
    let first = Timestamp::from_second(1_700_000_000).unwrap();
    let lease = Lease {
        metadata: meta("aliaslb-controller"),
        spec: Some(LeaseSpec {
            holder_identity: Some("replica-a".into()),
            lease_duration_seconds: Some(15),
            renew_time: Some(MicroTime(first)),
            ..LeaseSpec::default()
        }),
    };
    let created = api.create(&PostParams::default(), &lease).await.unwrap();

    let mut renewed = created.clone();
    let second = Timestamp::from_second(1_700_000_005).unwrap();
    renewed.spec.as_mut().unwrap().renew_time = Some(MicroTime(second));
    let after = api
        .replace("aliaslb-controller", &PostParams::default(), &renewed)
        .await
        .expect("renew");
    assert_ne!(
        after.metadata.resource_version,
        created.metadata.resource_version
    );

    let read = api.get("aliaslb-controller").await.unwrap();
    let spec = read.spec.unwrap();
    assert_eq!(spec.renew_time, Some(MicroTime(second)));
    assert_eq!(spec.holder_identity.as_deref(), Some("replica-a"));

    // A second replica working from the stale copy must lose: this is what makes election safe.
    let mut stale = created;
    stale.spec.as_mut().unwrap().holder_identity = Some("replica-b".into());
    let err = api
        .replace("aliaslb-controller", &PostParams::default(), &stale)
        .await
        .expect_err("stale resourceVersion");
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 409),
        "{err}"
    );
}

#[tokio::test]
async fn watcher_sees_create_update_and_delete() {
    let (client, ns) = setup("watch").await;
    let api = Api::<ConfigMap>::namespaced(client, &ns);
    let mut events = watcher(api.clone(), watcher::Config::default()).boxed();

    // Wait until the initial list is done, so the watch is established before we write.
    next_matching(&mut events, |e| matches!(e, watcher::Event::InitDone)).await;

    let mut cm = ConfigMap {
        metadata: meta("pools"),
        data: Some([("demo".to_owned(), "192.0.2.1".to_owned())].into()),
        ..ConfigMap::default()
    };
    api.create(&PostParams::default(), &cm).await.unwrap();
    next_matching(
        &mut events,
        |e| matches!(e, watcher::Event::Apply(c) if data_of(c) == Some("192.0.2.1")),
    )
    .await;

    cm.data = Some([("demo".to_owned(), "192.0.2.2".to_owned())].into());
    api.replace("pools", &PostParams::default(), &cm)
        .await
        .unwrap();
    next_matching(
        &mut events,
        |e| matches!(e, watcher::Event::Apply(c) if data_of(c) == Some("192.0.2.2")),
    )
    .await;

    api.delete("pools", &Default::default()).await.unwrap();
    next_matching(
        &mut events,
        |e| matches!(e, watcher::Event::Delete(c) if c.metadata.name.as_deref() == Some("pools")),
    )
    .await;
}

fn data_of(cm: &ConfigMap) -> Option<&str> {
    cm.data.as_ref()?.get("demo").map(String::as_str)
}

async fn next_matching<S>(events: &mut S, want: impl Fn(&watcher::Event<ConfigMap>) -> bool)
where
    S: futures::Stream<Item = Result<watcher::Event<ConfigMap>, watcher::Error>> + Unpin,
{
    tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let event = events
                .next()
                .await
                .expect("watch stream ended")
                .expect("watch error");
            if want(&event) {
                return;
            }
        }
    })
    .await
    .expect("expected watch event within 20 s");
}

#[tokio::test]
async fn recorder_event_is_published_and_listed() {
    let (client, ns) = setup("events").await;
    let services = create_lb_service(&client, &ns, "web").await;
    let svc = services.get("web").await.unwrap();

    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "aliaslb-controller".into(),
            instance: Some("test".into()),
        },
    );
    recorder
        .publish(
            &Event {
                type_: EventType::Normal,
                reason: "IPAllocated".into(),
                note: Some("allocated 192.0.2.20 from pool demo".into()),
                action: "Allocate".into(),
                secondary: None,
            },
            &svc.object_ref(&()),
        )
        .await
        .expect("publish event");

    let events = Api::<K8sEvent>::namespaced(client, &ns)
        .list(&ListParams::default())
        .await
        .unwrap();
    let ours: Vec<_> = events
        .items
        .iter()
        .filter(|e| e.reason.as_deref() == Some("IPAllocated"))
        .collect();
    assert_eq!(ours.len(), 1, "{:?}", events.items);
    let event = ours[0];
    assert_eq!(
        event.note.as_deref(),
        Some("allocated 192.0.2.20 from pool demo")
    );
    let regarding = event.regarding.as_ref().unwrap();
    assert_eq!(regarding.kind.as_deref(), Some("Service"));
    assert_eq!(regarding.name.as_deref(), Some("web"));
    assert_eq!(regarding.uid, svc.metadata.uid);
}

#[tokio::test]
async fn service_account_needs_rbac() {
    let env = TestEnv::global();
    let (admin, ns) = setup("rbac").await;
    create_lb_service(&admin, &ns, "web").await;
    let as_sa = env.service_account_client(&ns, "aliaslb-agent").await;
    let services = Api::<Service>::namespaced(as_sa, &ns);

    let err = services
        .list(&ListParams::default())
        .await
        .expect_err("no Role yet");
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 403),
        "{err}"
    );

    let role = Role {
        metadata: meta("read-services"),
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["services".into()]),
            verbs: vec!["get".into(), "list".into()],
            ..PolicyRule::default()
        }]),
    };
    Api::<Role>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &role)
        .await
        .unwrap();
    let binding = RoleBinding {
        metadata: meta("agent-reads-services"),
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name: "read-services".into(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: "aliaslb-agent".into(),
            namespace: Some(ns.clone()),
            ..Subject::default()
        }]),
    };
    Api::<RoleBinding>::namespaced(admin, &ns)
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();

    // The authorizer reads RBAC objects from an informer: allow it a moment to catch up.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let listed = loop {
        match services.list(&ListParams::default()).await {
            Ok(list) => break list,
            Err(e) if tokio::time::Instant::now() < deadline => {
                assert!(matches!(&e, kube::Error::Api(s) if s.code == 403), "{e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("still denied after the RoleBinding: {e}"),
        }
    };
    assert_eq!(listed.items.len(), 1);

    // The Role grants reads only.
    let err = services
        .delete("web", &Default::default())
        .await
        .expect_err("delete is not granted");
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 403),
        "{err}"
    );
}

#[tokio::test]
async fn kubeconfig_and_token_work_for_other_clients() {
    let env = TestEnv::global();
    let text = std::fs::read_to_string(env.kubeconfig_path()).unwrap();
    assert!(text.contains(env.server_url()), "{text}");
    assert!(text.contains(env.admin_token()));

    // A client that trusts the CA but presents a wrong token is rejected: auth is really on.
    let mut config = env.config().await.unwrap();
    config.auth_info.token = Some("wrong-token".to_owned().into());
    let client = Client::try_from(config).unwrap();
    let err = client
        .apiserver_version()
        .await
        .expect_err("bad token must be refused");
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 401),
        "{err}"
    );

    let version = env.client().await.apiserver_version().await.unwrap();
    assert_eq!(version.major, "1", "{version:?}");
}
