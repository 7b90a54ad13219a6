//! The reconcile loop against the real kube-apiserver (1.37; 1.30 too): allocation, exhaustion and
//! hand-over, requests, sharing, restarts, bad config edits, agent loss, agents of an
//! unsupported release, Node addresses, and no patch loop.
//! Agents are faked by renewing their Leases from the test.

mod support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use aliaslb_controller::config::ControllerConfig;
use aliaslb_controller::metrics::Metrics;
use aliaslb_core::keys;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::Api;
use kube::api::{Patch, PatchParams};
use kube::runtime::watcher::{self, Event};
use serde_json::json;
use support::{AGENT_RENEW, Cluster, eventually, lb_service, metric, serial};

use support::SETTLE;

/// The metric lines of the pool config's state.
const CONFIG_VALID: &str = "aliaslb_config_valid ";
const CONFIG_STALE: &str = "aliaslb_config_stale ";

/// Asserts each metric of `want`, a table of (line prefix, value); `step` says where the
/// test is, the message which metric failed.
fn assert_metrics(metrics: &Metrics, want: &[(&str, &str)], step: &str) {
    for (line, value) in want {
        let got = metric(metrics, line);
        assert_eq!(got.as_deref(), Some(*value), "{}: {step}", line.trim_end());
    }
}

/// Says on stderr how long `what` took since `started`, and asserts that it took less than
/// `limit`.
fn assert_took_under(started: Instant, limit: Duration, what: &str) {
    let took = started.elapsed();
    eprintln!("{what} after {took:?}");
    assert!(took < limit, "{what} after {took:?}, not within {limit:?}");
}

/// The node Service `name` is on (its annotation), if any.
async fn node_of(c: &Cluster, name: &str) -> Option<String> {
    support::annotation(&c.get(name).await, keys::ANNOTATION_NODE).map(str::to_owned)
}

/// Each Service's ingress IPs and node, in the order of the names asked for.
type Placement = Vec<(Vec<String>, Option<String>)>;

/// The placement of the Services `names`.
async fn placement(c: &Cluster, names: &[&str]) -> Placement {
    let mut out = Vec::new();
    for name in names {
        let svc = c.get(name).await;
        let ips = support::ingress(&svc)
            .iter()
            .map(ToString::to_string)
            .collect();
        let node = support::annotation(&svc, keys::ANNOTATION_NODE).map(str::to_owned);
        out.push((ips, node));
    }
    out
}

/// Whether every Service of `placement` has one IP and a node.
fn all_placed(placement: &Placement) -> bool {
    placement
        .iter()
        .all(|(ips, node)| ips.len() == 1 && node.is_some())
}

/// Looks at the Services `names` every `every` for `window`: each look must find them as
/// `before`; `what` says which window failed.
async fn assert_stays_put(
    c: &Cluster,
    names: &[&str],
    before: &Placement,
    (window, every): (Duration, Duration),
    what: &str,
) {
    let end = Instant::now() + window;
    while Instant::now() < end {
        tokio::time::sleep(every).await;
        assert_eq!(
            placement(c, names).await,
            *before,
            "{what}: a Service moved"
        );
    }
}

/// The cells of the row of `aliaslb status`'s `table` for `ip`.
fn status_row<'t>(table: &'t str, ip: &str) -> Vec<&'t str> {
    let row = table
        .lines()
        .find(|l| l.starts_with(&format!("{ip} ")))
        .unwrap_or_else(|| panic!("no row for {ip} in\n{table}"));
    row.split_whitespace().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn classic_pool_allocates_exhausts_and_hands_over_within_a_second() {
    let _serial = serial().await;
    let (c, node, _agent) =
        Cluster::with_one_agent("classic", "192.168.55.10\n192.168.55.11\n192.168.55.12").await;
    // A deleted Service's address goes to the next one at once (not held for its
    // re-creation: that is `held_for_re_creation` below).
    let (_controller, metrics) = c.start_controller_with(ControllerConfig {
        hold_released: Duration::ZERO,
        ..c.config()
    });

    c.create(lb_service("first")).await;
    c.wait_ips("first", &["192.168.55.10"], SETTLE).await;
    c.wait_announced("first", "first announced").await;
    assert_eq!(
        c.get("first").await.metadata.annotations.unwrap()[keys::ANNOTATION_NODE],
        node
    );

    // `aliaslb status` shows the route table.
    let table = c.status_table();
    let cells = status_row(&table, "192.168.55.10");
    assert_eq!(cells[1..4], ["yes", c.ns.as_str(), "first"], "{table}");
    assert_eq!(cells[5..], [node.as_str(), "announced"], "{table}");
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("192.168.55.12 ") && l.contains(" no ") && l.ends_with("free")),
        "{table}"
    );

    c.create(lb_service("second")).await;
    c.create(lb_service("third")).await;
    c.wait_ips("third", &["192.168.55.12"], SETTLE).await;
    c.create(lb_service("fourth")).await;
    c.wait_false_with(
        "fourth",
        keys::CONDITION_IP_ALLOCATED,
        "PoolExhausted",
        "fourth pending with PoolExhausted",
    )
    .await;
    eventually(SETTLE, "AllocationFailed event on fourth", async || {
        notes(&c, &c.ns, "fourth", "AllocationFailed")
            .await
            .iter()
            .any(|(type_, note)| type_ == "Warning" && !note.is_empty())
    })
    .await;
    let pending_by_reason = r#"aliaslb_services_pending_by_reason{reason="PoolExhausted"} "#;
    let want = [
        ("aliaslb_services_pending ", "1"),
        (pending_by_reason, "1"),
        // Once per Service that got its first IP.
        ("aliaslb_service_create_to_ip_seconds_count ", "3"),
    ];
    assert_metrics(&metrics, &want, "three Services with an IP, fourth pending");
    let age = metric(
        &metrics,
        &format!(r#"aliaslb_node_agent_renewal_age_seconds{{node="{node}"}} "#),
    )
    .and_then(|v| v.parse::<f64>().ok());
    assert!(
        age.is_some_and(|a| a < support::AGENT_LEASE.as_secs_f64()),
        "renewal age of {node}: {age:?}"
    );

    // Hand-over: the freed address reaches the pending Service within a second.
    let started = Instant::now();
    c.delete("second").await;
    c.wait_ips("fourth", &["192.168.55.11"], Duration::from_secs(3))
        .await;
    let limit = Duration::from_millis(1200);
    assert_took_under(started, limit, "hand-over of a freed IP");
    c.cleanup().await;
}

/// Issue 20 item 10: with the default `--hold-released` (10m), the address of a deleted
/// Service is held for it: the pending Service does not take it (its condition says why),
/// a request for it waits with RequestedIPReserved, and the re-created Service (a
/// reinstall) gets it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_for_re_creation() {
    let _serial = serial().await;
    let (c, _node, _agent) = Cluster::with_one_agent("held", "192.168.56.10").await;
    let (_controller, _metrics) = c.start_controller();
    c.create(lb_service("web")).await;
    c.wait_ips("web", &["192.168.56.10"], SETTLE).await;
    c.create(lb_service("waiting")).await;
    c.wait_condition("waiting", keys::CONDITION_IP_ALLOCATED, "PoolExhausted")
        .await;

    // A reinstall: web deleted, re-created 2 s later; a request meanwhile.
    c.delete("web").await;
    c.create(lb_service("asks").request("192.168.56.10")).await;
    let message = c
        .wait_condition("asks", keys::CONDITION_IP_ALLOCATED, "RequestedIPReserved")
        .await;
    assert!(
        message.starts_with(&format!("192.168.56.10 is held for {}/web", c.ns)),
        "{message}"
    );
    let waiting = c
        .wait_condition_where(
            "waiting",
            keys::CONDITION_IP_ALLOCATED,
            "PoolExhausted",
            |m| m.contains("held for a deleted Service"),
        )
        .await;
    assert!(
        waiting.contains(&format!("192.168.56.10 for {}/web", c.ns)),
        "{waiting}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let neither = async || c.ips("waiting").await.is_empty() && c.ips("asks").await.is_empty();
    assert!(
        neither().await,
        "waiting or asks took it while web was gone"
    );
    c.create(lb_service("web")).await;
    c.wait_ips("web", &["192.168.56.10"], SETTLE).await;
    assert!(neither().await, "waiting or asks took it once web was back");
    c.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_inside_outside_foreign_and_sharing() {
    let _serial = serial().await;
    let c = Cluster::new("requests").await;
    let other = c.env.create_namespace(&c.client, "requests-other").await;
    c.set_pool(&[
        (c.ns.as_str(), "10.61.0.1-10.61.0.4"),
        (other.as_str(), "10.61.1.1"),
    ])
    .await;
    let node = c.node("a").await;
    let _agent = c.fake_agent(&node);
    let (_controller, _metrics) = c.start_controller();

    // Each request: the Service, the address it asks for, and whether it gets it. One
    // outside every pool and one of another namespace's pool are refused.
    let requests = [
        ("inside", "10.61.0.3", true),
        ("outside", "10.99.0.1", false),
        ("foreign", "10.61.1.1", false),
    ];
    for (name, ip, _) in requests {
        c.create(lb_service(name).request(ip)).await;
    }
    c.create(lb_service("web").sharing("k").port(80)).await;
    c.create(lb_service("web-tls").sharing("k").port(443)).await;

    for (name, ip, granted) in requests {
        if granted {
            c.wait_ips(name, &[ip], SETTLE).await;
            continue;
        }
        c.wait_false_with(
            name,
            keys::CONDITION_IP_ALLOCATED,
            "RequestedIPNotInPool",
            &format!("{name} refused"),
        )
        .await;
        assert!(c.ips(name).await.is_empty(), "{name} got an IP");
        let (_, _, message) = c
            .condition(name, keys::CONDITION_IP_ALLOCATED)
            .await
            .unwrap();
        assert!(message.contains(ip), "{name}: {message}");
    }
    eventually(SETTLE, "shared IP", async || {
        let web = c.ips("web").await;
        !web.is_empty() && web == c.ips("web-tls").await
    })
    .await;
    c.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_keeps_every_ip_of_100_services() {
    let _serial = serial().await;
    let (c, _node, _agent) = Cluster::with_one_agent("restart", "10.62.0.0/24").await;
    let (controller, _metrics) = c.start_controller();
    for i in 0..100 {
        c.create(lb_service(&format!("svc-{i:03}"))).await;
    }
    let api = Api::<Service>::namespaced(c.client.clone(), &c.ns);
    let all = async || -> Vec<(String, Vec<String>)> {
        let mut out: Vec<(String, Vec<String>)> = api
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .iter()
            .map(|s| {
                let ips = support::ingress(s)
                    .iter()
                    .map(ToString::to_string)
                    .collect();
                (s.metadata.name.clone().unwrap(), ips)
            })
            .collect();
        out.sort();
        out
    };
    eventually(
        Duration::from_secs(30),
        "100 Services with an IP",
        async || all().await.iter().filter(|(_, ips)| ips.len() == 1).count() == 100,
    )
    .await;
    drop(controller);

    // While no controller runs, the oldest ten go away: a controller that planned from
    // scratch would now renumber the others from the start of the pool.
    for i in 0..10 {
        c.delete(&format!("svc-{i:03}")).await;
    }
    let before = all().await;
    assert_eq!(before.len(), 90);
    let (_controller, metrics) = c.start_controller();
    c.create(lb_service("svc-new")).await;
    eventually(SETTLE, "svc-new has an IP", async || {
        !c.ips("svc-new").await.is_empty()
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after: Vec<_> = all()
        .await
        .into_iter()
        .filter(|(name, _)| name != "svc-new")
        .collect();
    assert_eq!(after, before, "a restart changed IPs");

    // Incremental passes: one more Service (its creation, its status landing, its agent
    // holding it, its Announced landing) is planned a few times; the 91 others are not
    // planned again. A loop that re-planned everything on each pass would count 92 a pass.
    let planned = || {
        metric(&metrics, "aliaslb_reconcile_services_planned_total ")
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    c.wait_condition("svc-new", keys::CONDITION_ANNOUNCED, "Announced")
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = planned();
    assert!(
        before >= 91,
        "the first pass of the term plans every Service: {before}"
    );
    c.create(lb_service("svc-last")).await;
    c.wait_condition("svc-last", keys::CONDITION_ANNOUNCED, "Announced")
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let delta = planned() - before;
    assert!(
        (1..30).contains(&delta),
        "one new Service among 91 planned {delta} Services in all"
    );
    c.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_config_edit_changes_nothing_and_warns_once() {
    let _serial = serial().await;
    let (c, _node, _agent) = Cluster::with_one_agent("badconfig", "10.63.0.1\n10.63.0.2").await;
    let (_controller, metrics) = c.start_controller();
    c.create(lb_service("web")).await;
    c.wait_ips("web", &["10.63.0.1"], SETTLE).await;
    let pool_events = async || c.events(&c.system, keys::DEFAULT_POOL_CONFIGMAP).await;

    // The edit drops web's address and adds a broken line: applied, it would move web.
    c.set_pool(&[(c.ns.as_str(), "10.63.0.2\nnot-an-ip")]).await;
    c.wait_event(&c.system, keys::DEFAULT_POOL_CONFIGMAP, "InvalidConfig")
        .await;
    let events = pool_events().await;
    let note = events[0].note.clone().unwrap_or_default();
    assert_eq!(events[0].type_.as_deref(), Some("Warning"));
    assert!(note.contains(&format!("key {}, line 2", c.ns)), "{note}");
    let broken = [(CONFIG_VALID, "0"), (CONFIG_STALE, "1")];
    assert_metrics(&metrics, &broken, "after the broken edit");

    // More passes (a new Service) neither repeat the Event nor apply the broken config.
    c.create(lb_service("late")).await;
    c.wait_ips("late", &["10.63.0.2"], SETTLE).await;
    assert_eq!(c.ips("web").await, ["10.63.0.1"]);
    let invalid = c
        .events_with_reason(&c.system, keys::DEFAULT_POOL_CONFIGMAP, "InvalidConfig")
        .await;
    assert_eq!(invalid.len(), 1);
    let series = pool_events().await[0].series.clone();
    assert!(series.is_none(), "the Warning was repeated: {series:?}");

    // Fixed: loaded, metrics back.
    c.set_pool(&[(c.ns.as_str(), "10.63.0.1\n10.63.0.2")]).await;
    c.wait_event(&c.system, keys::DEFAULT_POOL_CONFIGMAP, "ConfigLoaded")
        .await;
    let fixed = [(CONFIG_VALID, "1"), (CONFIG_STALE, "0")];
    assert_metrics(&metrics, &fixed, "after the fix");
    let cm = Api::<ConfigMap>::namespaced(c.client.clone(), &c.system);
    assert!(
        cm.get_opt(keys::DEFAULT_POOL_CONFIGMAP)
            .await
            .unwrap()
            .is_some()
    );
    c.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_agent_stops_renewing_loses_its_ips() {
    let _serial = serial().await;
    let c = Cluster::with_pool("agentloss", "10.64.0.1-10.64.0.4").await;
    let a = c.node("a").await;
    let b = c.node("b").await;
    let mut agents = vec![
        (a.clone(), Some(c.fake_agent(&a))),
        (b.clone(), Some(c.fake_agent(&b))),
    ];
    let (_controller, metrics) = c.start_controller();
    c.create(lb_service("web")).await;
    eventually(SETTLE, "web placed", async || {
        node_of(&c, "web").await.is_some()
    })
    .await;
    let first = node_of(&c, "web").await.unwrap();

    // Hard loss: the agent just stops renewing (no event reaches the controller).
    let started = Instant::now();
    for (node, agent) in &mut agents {
        if *node == first {
            agent.take();
        }
    }
    eventually(Duration::from_secs(6), "web moved", async || {
        node_of(&c, "web").await.is_some_and(|n| n != first)
    })
    .await;
    // Stale after at most 2 s (lease duration) after the last renewal, <= 0.5 s before.
    let limit = support::AGENT_LEASE + Duration::from_secs(1);
    assert_took_under(
        started,
        limit,
        &format!("hard loss: web moved from {first}"),
    );
    assert_eq!(
        c.ips("web").await,
        ["10.64.0.1"],
        "the IP stays, the node changes"
    );
    c.wait_announced("web", "announced on the new node").await;
    // One hard failover, measured until the new node's agent reported the IP.
    eventually(SETTLE, "the failover measured", async || {
        metric(
            &metrics,
            r#"aliaslb_failover_duration_seconds_count{cause="hard"} "#,
        )
        .as_deref()
            == Some("1")
    })
    .await;
    assert_eq!(
        metric(&metrics, r#"aliaslb_failovers_total{cause="hard"} "#).as_deref(),
        Some("1")
    );
    c.cleanup().await;
}

/// How often the Services are looked at while the agents are silent.
const BLIND_LOOK_EVERY: Duration = Duration::from_millis(200);

/// kube-apiserver paused, every node healthy: every agent Lease goes stale at once. The
/// controller takes it that it cannot see the agents, not that every node died: nothing
/// moves or loses its node, it says so (gauge, one Warning on the leader Lease), and a
/// Service created meanwhile waits. Sight back: nothing moves. One agent stopping is
/// still a node loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_agent_silent_at_once_is_blindness_not_node_loss() {
    let _serial = serial().await;
    let c = Cluster::with_pool("blind", "10.68.0.1-10.68.0.8").await;
    let a = c.node("a").await;
    let b = c.node("b").await;
    let mut agents = [Some(c.fake_agent(&a)), Some(c.fake_agent(&b))];
    // Both Leases exist before the controller starts: the Services spread over both.
    c.wait_agent_leases(&[&a, &b]).await;
    let (_controller, metrics) = c.start_controller();
    let names = ["one", "two", "three", "four"];
    for name in names {
        c.create(lb_service(name)).await;
    }
    eventually(SETTLE, "every Service placed and announced", async || {
        let mut announced = true;
        for name in names {
            announced &= c.is_announced(name).await;
        }
        announced && all_placed(&placement(&c, &names).await)
    })
    .await;
    let before = placement(&c, &names).await;
    for node in [&a, &b] {
        assert!(
            before.iter().any(|(_, n)| n.as_ref() == Some(node)),
            "both nodes carry a Service: {before:?}"
        );
    }
    let unobservable = || metric(&metrics, "aliaslb_agents_unobservable ");
    assert_eq!(unobservable().as_deref(), Some("0"));
    let stays_put = async |window: Duration, what: &str| {
        assert_stays_put(&c, &names, &before, (window, BLIND_LOOK_EVERY), what).await;
    };

    // Both agents stop at once: for 3 lease durations, nothing moves.
    for agent in &mut agents {
        agent.take();
    }
    let silent = Instant::now();
    stays_put(3 * support::AGENT_LEASE, "every agent silent").await;
    assert_eq!(
        unobservable().as_deref(),
        Some("1"),
        "after {:?} of silence",
        silent.elapsed()
    );
    c.create(lb_service("late")).await;
    c.wait_false_with(
        "late",
        keys::CONDITION_ANNOUNCED,
        "AgentsUnobservable",
        "late pending with AgentsUnobservable",
    )
    .await;
    assert_eq!(
        node_of(&c, "late").await,
        None,
        "no node is elected while blind"
    );
    stays_put(support::AGENT_LEASE, "every agent silent, late created").await;
    let warnings = notes(&c, &c.system, keys::CONTROLLER_LEASE, "AgentsUnobservable").await;
    assert_eq!(warnings.len(), 1, "one Warning on the edge: {warnings:?}");
    assert_eq!(warnings[0].0, "Warning");
    assert!(
        warnings[0].1.contains("none of the 2 agent Leases"),
        "{}",
        warnings[0].1
    );

    // Both back, b a second after a (agents renew at their own pace): b is not lost when
    // a's renewal ends the blindness, nothing moves, late is placed.
    agents[0] = Some(c.fake_agent(&a));
    tokio::time::sleep(support::AGENT_LEASE / 2).await;
    assert_eq!(placement(&c, &names).await, before, "a back, b not yet");
    agents[1] = Some(c.fake_agent(&b));
    eventually(SETTLE, "agents observable again", async || {
        unobservable().as_deref() == Some("0")
    })
    .await;
    stays_put(2 * support::AGENT_LEASE, "agents back").await;
    eventually(SETTLE, "late placed once the agents are seen", async || {
        node_of(&c, "late").await.is_some()
    })
    .await;
    assert_eq!(
        notes(&c, &c.system, keys::CONTROLLER_LEASE, "AgentsUnobservable")
            .await
            .len(),
        1
    );

    // One agent stops: its node is lost, its Services move to the other as before.
    let started = Instant::now();
    agents[0].take();
    eventually(
        Duration::from_secs(6),
        "a's Services moved to b",
        async || {
            placement(&c, &names)
                .await
                .iter()
                .all(|(ips, node)| ips.len() == 1 && node.as_deref() == Some(b.as_str()))
        },
    )
    .await;
    let limit = support::AGENT_LEASE + Duration::from_secs(1);
    let what = "one of two agents stopped: its Services moved";
    assert_took_under(started, limit, what);
    let after = placement(&c, &names).await;
    for ((ips, _), (was, _)) in after.iter().zip(&before) {
        assert_eq!(ips, was, "the IPs stay, the node changes");
    }
    assert_eq!(unobservable().as_deref(), Some("0"));
    drop(agents);
    c.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_report_out_of_bounds_is_ignored_and_the_other_node_serves() {
    let _serial = serial().await;
    let c = Cluster::with_pool("badreport", "10.66.0.1-10.66.0.2").await;
    let good = c.node("good").await;
    let bad = c.node("bad").await;
    let _good_agent = c.fake_agent(&good);
    // The bad agent claims the pool's subnet (so, believed, its node would be preferred
    // as the only one on-link), holds and conflicts on every pool IP with a 40 KB reason
    // (more than a condition message may be), on an interface no kernel would name so.
    let report = json!({
        "version": 1,
        "interfaces": [{"name": "eth0/../../x", "subnets": ["10.66.0.0/24"]}],
        "held": ["10.66.0.1", "10.66.0.2"],
        "conflicts": [
            {"ip": "10.66.0.1", "reason": "x".repeat(40_000)},
            {"ip": "10.66.0.2", "reason": "x".repeat(40_000)},
        ],
        "shield": "active",
    });
    let _bad_agent = c.agent_reporting(&bad, report.to_string());
    let (_controller, metrics) = c.start_controller();

    c.create(lb_service("web")).await;
    c.wait_ips("web", &["10.66.0.1"], SETTLE).await;
    c.wait_announced("web", "web announced").await;
    assert_eq!(
        node_of(&c, "web").await.as_deref(),
        Some(good.as_str()),
        "the node with the valid report serves"
    );

    let lease = keys::agent_lease_name(&bad);
    let rejected = async || {
        c.events_with_reason(&c.system, &lease, "InvalidAgentReport")
            .await
    };
    c.wait_event(&c.system, &lease, "InvalidAgentReport").await;
    let events = rejected().await;
    let note = events[0].note.clone().unwrap_or_default();
    assert_eq!(events[0].type_.as_deref(), Some("Warning"));
    assert!(
        note.contains(&format!("agent on {bad} ignored")) && note.contains("eth0/../../x"),
        "{note}"
    );
    assert!(note.len() <= 1000, "{}", note.len());
    let counted = r#"aliaslb_agent_reports_rejected_total{reason="interface_name"} "#;
    assert_metrics(&metrics, &[(counted, "1")], "after the first bad report");

    // The bad agent renews every 0.5 s, each renewal a pass: still one warning, and no
    // condition quotes its report.
    c.create(lb_service("second")).await;
    c.wait_ips("second", &["10.66.0.2"], SETTLE).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(rejected().await.len(), 1);
    assert!(rejected().await[0].series.is_none());
    assert_metrics(&metrics, &[(counted, "1")], "after 2 s of bad renewals");
    for name in ["web", "second"] {
        assert_eq!(
            node_of(&c, name).await.as_deref(),
            Some(good.as_str()),
            "{name}"
        );
        let (_, reason, message) = c.condition(name, keys::CONDITION_ANNOUNCED).await.unwrap();
        assert_eq!(reason, "Announced", "{name}: {message}");
    }
    c.cleanup().await;
}

/// An agent of a release the controller does not support (issue 46): one Warning Event
/// `UnsupportedAgentVersion` on its Lease saying what to upgrade, the gauge
/// `aliaslb_agents_unsupported_version`, and nothing else changes (its node still serves).
/// Once the agent runs a supported release, the gauge falls back to 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_of_an_unsupported_release_is_warned_about() {
    let _serial = serial().await;
    let c = Cluster::with_pool("version", "10.68.0.1-10.68.0.2").await;
    let current = c.node("current").await;
    let old = c.node("old").await;
    let _current_agent = c.fake_agent(&current);
    let old_agent = c.agent_of_version(&old, Some("0.0.9"));
    let (_controller, metrics) = c.start_controller();
    let gauge = "aliaslb_agents_unsupported_version ";

    let lease = keys::agent_lease_name(&old);
    let warned = async || {
        c.events_with_reason(&c.system, &lease, "UnsupportedAgentVersion")
            .await
    };
    c.wait_event(&c.system, &lease, "UnsupportedAgentVersion")
        .await;
    let events = warned().await;
    assert_eq!(events[0].type_.as_deref(), Some("Warning"));
    let note = events[0].note.clone().unwrap_or_default();
    assert!(
        note.contains(&format!("agent on {old}"))
            && note.contains("0.0.9")
            && note.contains("upgrade the agents"),
        "{note}"
    );
    assert_metrics(&metrics, &[(gauge, "1")], "an agent of 0.0.9");
    // The current agent is not warned about, and the old one's node still serves.
    let current_lease = keys::agent_lease_name(&current);
    assert!(
        c.events_with_reason(&c.system, &current_lease, "UnsupportedAgentVersion")
            .await
            .is_empty(),
        "the current agent is warned about"
    );
    // Two Services, one IP each, in order.
    let services = [("a", "10.68.0.1"), ("b", "10.68.0.2")];
    for (name, _) in services {
        c.create(lb_service(name)).await;
    }
    for (name, ip) in services {
        c.wait_ips(name, &[ip], SETTLE).await;
    }
    eventually(SETTLE, "both nodes serve", async || {
        let mut nodes = BTreeSet::new();
        for (name, _) in services {
            nodes.extend(node_of(&c, name).await);
        }
        nodes.len() == 2
    })
    .await;
    // Renewals of the same release: still one Event.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(warned().await.len(), 1);

    // Upgraded: supported, the gauge at 0. Without a label (older than version reporting):
    // warned about again.
    drop(old_agent);
    let upgraded = c.fake_agent(&old);
    eventually(SETTLE, "the gauge at 0", async || {
        metric(&metrics, gauge).as_deref() == Some("0")
    })
    .await;
    drop(upgraded);
    let _unlabelled = c.agent_of_version(&old, None);
    eventually(SETTLE, "a second Event, for no version", async || {
        warned().await.iter().any(|e| {
            e.note
                .as_deref()
                .is_some_and(|n| n.contains("reports no version"))
        })
    })
    .await;
    assert_metrics(&metrics, &[(gauge, "1")], "an agent of no version");
    c.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_refused_as_invalid_waits_for_a_change() {
    let _serial = serial().await;
    let (c, node, _agent) = Cluster::with_one_agent("refused", "10.67.0.1-10.67.0.2").await;
    let (_controller, metrics) = c.start_controller();

    // A user's annotations just under the API's 256 KiB for all of them: ours do not fit,
    // and every write we make on this Service is refused with 422 Invalid.
    let blob_key = "example.com/blob";
    let blob = "x".repeat(256 * 1024 - blob_key.len() - 8);
    // The node is eligible before `full` is first planned: planned without a node (the
    // agent not seen renewing yet), its status write carries no annotation, is valid and
    // gives it its IP. Nothing orders the fake agent's first renewal before the
    // controller's first look at `full` (under load it can come after).
    c.create(lb_service("web").request("10.67.0.2")).await;
    c.wait_ips("web", &["10.67.0.2"], SETTLE).await;
    c.wait_announced("web", "web announced: the agent is seen")
        .await;
    c.create(lb_service("full").annotate(blob_key, &blob)).await;
    let refused = r#"aliaslb_reconcile_errors_total{category="invalid"} "#;
    eventually(SETTLE, "the refused write counted", async || {
        metric(&metrics, refused).is_some()
    })
    .await;
    // The agent acts on the node assignment, which is written apart from the Service: it
    // soon reports holding the IP, so the plan of `full` changes once (its Announced
    // condition) and that new write is refused too. Once the agent holds it, the plan is
    // stable: passes go on (the agent renews every 0.5 s), the same write is not made again.
    let assignments = Api::<ConfigMap>::namespaced(c.client.clone(), &c.system);
    eventually(SETTLE, "full's IP in the node assignment", async || {
        support::read_assignment(&assignments, &node)
            .await
            .is_some_and(|a| a.ips.contains_key(&"10.67.0.1".parse().unwrap()))
    })
    .await;
    tokio::time::sleep(AGENT_RENEW * 3).await;
    let settled = metric(&metrics, refused);
    assert!(
        matches!(settled.as_deref(), Some("1" | "2")),
        "{settled:?}: one refusal per plan, the plan changed once"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(metric(&metrics, refused), settled);
    assert!(c.ips("full").await.is_empty());

    // The user makes room: the Service changed, the write is made again and goes through.
    Api::<Service>::namespaced(c.client.clone(), &c.ns)
        .patch(
            "full",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {blob_key: "small"}}})),
        )
        .await
        .unwrap();
    c.wait_ips("full", &["10.67.0.1"], SETTLE).await;
    assert_eq!(metric(&metrics, refused), settled);
    c.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_patch_loop_with_ip_mode_in_status() {
    let _serial = serial().await;
    let (c, _node, _agent) = Cluster::with_one_agent("noloop", "10.65.0.1-10.65.0.8").await;
    let (_controller, metrics) = c.start_controller();
    for name in ["a", "b", "c"] {
        c.create(lb_service(name)).await;
    }
    c.create(lb_service("stuck").request("10.99.9.9")).await;
    for name in ["a", "b", "c"] {
        c.wait_announced(name, &format!("{name} announced")).await;
    }
    // Idle period: the agent renews every 0.5 s with the same report. Those renewals do
    // not each make a pass; the loop still wakes when the Lease would go stale (every
    // lease duration at most) and passes then, and nothing is written.
    let passes = |m: &Metrics| {
        metric(m, "aliaslb_reconcile_duration_seconds_count ")
            .unwrap()
            .parse::<u64>()
            .unwrap()
    };
    let before = passes(&metrics);
    let api = Api::<Service>::namespaced(c.client.clone(), &c.ns);
    let watch = watcher::watcher(api, watcher::Config::default());
    let mut stream = watch.boxed();
    let idle_until = tokio::time::Instant::now() + Duration::from_secs(3);
    let mut writes = Vec::new();
    loop {
        match tokio::time::timeout_at(idle_until, stream.next()).await {
            Err(_) => break,
            Ok(None) => panic!("the watch ended"),
            // `InitApply` is the initial list; `Apply` is a modification.
            Ok(Some(Ok(Event::Apply(svc)))) => writes.push(svc.metadata.name.unwrap_or_default()),
            Ok(Some(_)) => {}
        }
    }
    assert!(writes.is_empty(), "writes while idle: {writes:?}");
    let idle = passes(&metrics) - before;
    assert!(idle >= 1, "no pass while idle: nothing proven");
    assert!(
        idle < 6,
        "{idle} passes in 3 s: the agent's idle renewals (6 in 3 s) each made one"
    );
    let svc = c.get("a").await;
    let ingress = svc.status.unwrap().load_balancer.unwrap().ingress.unwrap();
    // Every supported release (1.30+) keeps ipMode; the controller writes VIP, and the
    // stored field does not make it write again (the idle watch above saw no write).
    let version = c.client.apiserver_version().await.unwrap();
    if aliaslb_controller::write::services::version_has_ip_mode(&version.major, &version.minor) {
        assert_eq!(
            ingress[0].ip_mode.as_deref(),
            Some("VIP"),
            "ipMode as stored"
        );
    } else {
        assert_eq!(ingress[0].ip_mode, None, "a server without ipMode drops it");
    }
    c.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_that_stops_being_ours_is_released_and_cleaned() {
    let _serial = serial().await;
    let (c, _node, _agent) = Cluster::with_one_agent("notours", "10.66.0.1").await;
    let (_controller, _metrics) = c.start_controller();
    c.create(lb_service("first")).await;
    c.create(lb_service("second")).await;
    c.wait_ips("first", &["10.66.0.1"], SETTLE).await;
    c.wait_announced("first", "first announced").await;

    let api = Api::<Service>::namespaced(c.client.clone(), &c.ns);
    let to_cluster_ip = serde_json::json!({"spec": {
        "type": "ClusterIP",
        "externalTrafficPolicy": null,
        "ports": [{"port": 80, "protocol": "TCP"}],
    }});
    api.patch(
        "first",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(to_cluster_ip),
    )
    .await
    .unwrap();
    // Its address goes to the waiting Service, and what we wrote on it is removed.
    c.wait_ips("second", &["10.66.0.1"], SETTLE).await;
    eventually(SETTLE, "first cleaned", async || {
        let svc = c.get("first").await;
        let ours = svc
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_.starts_with("aliaslb.io/")));
        support::annotation(&svc, keys::ANNOTATION_NODE).is_none()
            && !ours
            && support::ingress(&svc).is_empty()
    })
    .await;
    c.cleanup().await;
}

/// How long IPs and nodes must stay put after the pool ConfigMap is deleted.
const DELETED_WINDOW: Duration = Duration::from_secs(30);
/// How long they must stay put after it is re-created: a change would come within a pass.
const RECREATED_WINDOW: Duration = Duration::from_secs(5);
/// How long a controller restarted while the ConfigMap is gone is watched: its first pass
/// would release everything (well within this).
const RESTART_WINDOW: Duration = Duration::from_secs(5);
/// How often the Services are looked at meanwhile.
const LOOK_EVERY: Duration = Duration::from_millis(500);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_pool_configmap_releases_nothing_a_removed_key_does() {
    let _serial = serial().await;
    let c = Cluster::new("cmdeleted").await;
    let pools = [
        (c.ns.as_str(), "10.67.0.1-10.67.0.4"),
        ("unrelated", "10.67.1.1"),
    ];
    c.set_pool(&pools).await;
    let a = c.node("a").await;
    let b = c.node("b").await;
    let _agents = [c.fake_agent(&a), c.fake_agent(&b)];
    let (controller, metrics) = c.start_controller();
    let names = ["one", "two"];
    for name in names {
        c.create(lb_service(name)).await;
    }
    eventually(SETTLE, "both placed", async || {
        all_placed(&placement(&c, &names).await)
    })
    .await;
    let before = placement(&c, &names).await;
    let stays_put = async |window: Duration, what: &str| {
        assert_stays_put(&c, &names, &before, (window, LOOK_EVERY), what).await;
    };

    let cms = Api::<ConfigMap>::namespaced(c.client.clone(), &c.system);
    cms.delete(keys::DEFAULT_POOL_CONFIGMAP, &Default::default())
        .await
        .unwrap();
    stays_put(DELETED_WINDOW, "after the ConfigMap was deleted").await;
    let warnings = c
        .events_with_reason(&c.system, keys::CONTROLLER_LEASE, "ConfigMapDeleted")
        .await;
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    let warning = &warnings[0];
    assert_eq!(warning.type_.as_deref(), Some("Warning"));
    assert!(warning.series.is_none(), "repeated: {:?}", warning.series);
    let note = warning.note.as_deref().unwrap_or_default();
    assert!(
        note.contains("keeping the last good pool config (2 pools)"),
        "{note}"
    );
    let related = warning.related.as_ref().and_then(|r| r.name.as_deref());
    assert_eq!(related, Some(keys::DEFAULT_POOL_CONFIGMAP));
    let stale = [(CONFIG_STALE, "1"), (CONFIG_VALID, "0")];
    assert_metrics(&metrics, &stale, "after the ConfigMap was deleted");

    // A restart (or failover) while it is gone: the new term has seen no config, but IPs
    // are assigned, so it plans nothing rather than running on "no pools".
    drop(controller);
    let (_controller, metrics) = c.start_controller();
    stays_put(RESTART_WINDOW, "after a restart without the ConfigMap").await;
    c.wait_event(&c.system, keys::CONTROLLER_LEASE, "ConfigMapMissing")
        .await;
    let restarted = [(CONFIG_VALID, "0")];
    assert_metrics(
        &metrics,
        &restarted,
        "after a restart without the ConfigMap",
    );

    // Re-created as it was: nothing moves, the config is fresh again.
    c.set_pool(&pools).await;
    c.wait_event(&c.system, keys::DEFAULT_POOL_CONFIGMAP, "ConfigLoaded")
        .await;
    let fresh = [(CONFIG_STALE, "0"), (CONFIG_VALID, "1")];
    assert_metrics(&metrics, &fresh, "after the ConfigMap was re-created");
    stays_put(RECREATED_WINDOW, "after the ConfigMap was re-created").await;

    // Removing the namespace's key is an instruction: its Services are released.
    c.set_pool(&[("unrelated", "10.67.1.1")]).await;
    for name in names {
        eventually(
            SETTLE,
            &format!("{name} released with NoPool"),
            async || {
                c.is_false_with(name, keys::CONDITION_IP_ALLOCATED, "NoPool")
                    .await
                    && c.ips(name).await.is_empty()
            },
        )
        .await;
    }
    c.cleanup().await;
}

/// Events with `reason` regarding `name` in `namespace`, as (type, note).
async fn notes(c: &Cluster, namespace: &str, name: &str, reason: &str) -> Vec<(String, String)> {
    c.events_with_reason(namespace, name, reason)
        .await
        .into_iter()
        .map(|e| (e.type_.unwrap_or_default(), e.note.unwrap_or_default()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_address_a_node_has_is_never_allocated() {
    let _serial = serial().await;
    let (c, node, _agent) =
        Cluster::with_one_agent("nodeaddr", "# the LAN\n10.71.0.1-10.71.0.3").await;
    // Set before the controller starts (the agent's Lease does not depend on them).
    c.set_node_addresses(
        &node,
        &[
            ("InternalIP", "10.71.0.1"),
            ("Hostname", &node),
            ("ExternalIP", "2001:db8:71::1"),
        ],
    )
    .await;
    let (_controller, _metrics) = c.start_controller();

    c.create(lb_service("web")).await;
    c.wait_ips("web", &["10.71.0.2"], SETTLE).await;
    let want = format!(
        "key {}, line 2: 10.71.0.1 is the InternalIP of node {node}: never allocated; remove it \
         from the pool",
        c.ns
    );
    eventually(SETTLE, "NodeAddress Warning on the ConfigMap", async || {
        notes(&c, &c.system, keys::DEFAULT_POOL_CONFIGMAP, "NodeAddress").await
            == [("Warning".to_owned(), want.clone())]
    })
    .await;

    // `aliaslb status` marks it.
    let table = c.status_table();
    let cells = status_row(&table, "10.71.0.1");
    assert_eq!(
        cells,
        [
            "10.71.0.1",
            "no",
            c.ns.as_str(),
            "-",
            "-",
            node.as_str(),
            "node-address"
        ],
        "{table}"
    );

    // More passes neither allocate it nor repeat the Warning.
    c.create(lb_service("second")).await;
    c.wait_ips("second", &["10.71.0.3"], SETTLE).await;
    c.create(lb_service("third")).await;
    eventually(SETTLE, "third pending with PoolExhausted", async || {
        c.condition("third", keys::CONDITION_IP_ALLOCATED)
            .await
            .is_some_and(|(s, reason, message)| {
                s == "False"
                    && reason == "PoolExhausted"
                    && message.contains("10.71.0.1 is the InternalIP")
            })
    })
    .await;
    assert_eq!(
        notes(&c, &c.system, keys::DEFAULT_POOL_CONFIGMAP, "NodeAddress")
            .await
            .len(),
        1,
        "on the edge only"
    );
    c.cleanup().await;
}

/// A Node that gets the address a Service holds (its kubelet reports it) does not take it
/// from the Service (issue 42: a node's word never renumbers): the Service keeps it and is
/// told with a Warning `NodeClaim` naming the node; the pool ConfigMap gets its
/// `NodeAddress` Warning as for any pool entry covering a Node's address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_on_an_address_a_node_gets_keeps_it_with_a_warning() {
    let _serial = serial().await;
    let (c, _node, _agent) = Cluster::with_one_agent("nodeaddrlater", "10.72.0.1-10.72.0.2").await;
    // A node without an agent: only its addresses matter.
    let other = c.node("b").await;
    let (_controller, _metrics) = c.start_controller();
    c.create(lb_service("web")).await;
    c.wait_ips("web", &["10.72.0.1"], SETTLE).await;

    // Node b gets web's address (its kubelet reports a new ExternalIP).
    c.set_node_addresses(&other, &[("ExternalIP", "10.72.0.1")])
        .await;
    let want = format!("10.72.0.1 is the ExternalIP of node {other}: the node's own word");
    eventually(SETTLE, "NodeClaim Warning on web", async || {
        notes(&c, &c.ns, "web", "NodeClaim")
            .await
            .iter()
            .any(|(type_, note)| type_ == "Warning" && note.starts_with(&want))
    })
    .await;
    eventually(SETTLE, "NodeAddress Warning on the ConfigMap", async || {
        notes(&c, &c.system, keys::DEFAULT_POOL_CONFIGMAP, "NodeAddress")
            .await
            .iter()
            .any(|(type_, note)| {
                type_ == "Warning"
                    && note.starts_with(&format!(
                        "key {}, line 1: 10.72.0.1 is the ExternalIP of node {other}",
                        c.ns
                    ))
            })
    })
    .await;
    assert_eq!(c.ips("web").await, ["10.72.0.1"], "kept");
    assert!(notes(&c, &c.ns, "web", "ClearAssignment").await.is_empty());
    c.wait_announced("web", "still announced").await;
    c.cleanup().await;
}
