//! The real `aliaslb-agent` binary in a fresh network namespace (veth links, real kernel)
//! against the real kube-apiserver, reached through a relay into the namespace. The tests
//! write Service status and the node annotation themselves, as the controller would, and
//! check the kernel with `ip -j addr` and the Lease through the API. Needs root (see
//! `support::require_root`).

mod agent_support;
mod support;

use std::time::{Duration, Instant};

use agent_support::{Cluster, Setup, eventually, setup};
use aliaslb_core::report::{AgentReport, ShieldState};
use support::{AddrInfo, NetNs, require_root};

/// Our alias `ip` on eth1, if present.
fn alias(node: &NetNs, ip: &str) -> Option<AddrInfo> {
    node.addr("eth1", ip)
}

/// Waits until the Lease report satisfies `pred`; returns it and how long that took.
async fn report_where(
    cluster: &Cluster,
    node: &str,
    what: &str,
    within: Duration,
    pred: impl Fn(&AgentReport) -> bool,
) -> (AgentReport, Duration) {
    let start = Instant::now();
    let r = eventually(within, what, async || {
        cluster.report(node).await.filter(|r| pred(r))
    })
    .await;
    (r, start.elapsed())
}

/// Service `web` assigned to this node with `ips`; returns once every alias is on it.
async fn serve(s: &Setup, ips: &[&str]) {
    s.cluster.create("web").await;
    s.cluster
        .assign("web", Some(s.name.as_str()), None, ips)
        .await;
    eventually(Duration::from_secs(5), "the aliases", async || {
        ips.iter()
            .all(|ip| alias(&s.node, ip).is_some())
            .then_some(())
    })
    .await;
}

fn ips(list: &[&str]) -> std::collections::BTreeSet<std::net::IpAddr> {
    list.iter().map(|s| s.parse().unwrap()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aliases_follow_services_and_the_lease_reports_them() {
    if !require_root() {
        return;
    }
    let s = setup("follow", |_| {}).await;
    let (node, c) = (&s.node, &s.cluster);

    // The first report: interfaces with their subnets, nothing held.
    let first = c.report(&s.name).await.unwrap();
    let eth1 = first.interfaces.iter().find(|i| i.name == "eth1").unwrap();
    assert_eq!(
        eth1.subnets,
        vec![
            "10.0.0.0/24".parse().unwrap(),
            "fd00:1::/64".parse().unwrap()
        ]
    );
    assert!(first.held.is_empty());
    let lease = c.lease(&s.name).await.unwrap().spec.unwrap();
    assert_eq!(lease.holder_identity.as_deref(), Some(s.name.as_str()));
    assert_eq!(lease.lease_duration_seconds, Some(2));

    // Assigned to us: both families appear, marked and with the lease as lifetime.
    c.create("web").await;
    let changed = Instant::now();
    c.assign(
        "web",
        Some(s.name.as_str()),
        None,
        &["10.0.0.50", "fd00:1::50"],
    )
    .await;
    let v4 = eventually(Duration::from_secs(5), "10.0.0.50 on eth1", async || {
        alias(node, "10.0.0.50")
    })
    .await;
    let v6 = eventually(Duration::from_secs(5), "fd00:1::50 on eth1", async || {
        alias(node, "fd00:1::50")
    })
    .await;
    let applied = changed.elapsed();
    assert_eq!(v4.prefixlen, 32);
    assert_eq!(v4.label.as_deref(), Some("eth1:alb"), "ownership label");
    assert!(v4.valid_life_time <= 2, "lifetime = lease: {v4:?}");
    assert_eq!(v6.prefixlen, 128);
    assert!(v6.nodad && v6.valid_life_time <= 2, "{v6:?}");
    let (_, reported) = report_where(
        c,
        &s.name,
        "held IPs in the Lease",
        Duration::from_secs(1),
        |r| r.held == ips(&["10.0.0.50", "fd00:1::50"]),
    )
    .await;
    eprintln!("assignment -> aliases in {applied:?}, -> Lease report {reported:?} later");

    // GARP / unsolicited NA reached the peer: its kernel learnt our MAC for both VIPs.
    let link: serde_json::Value =
        serde_json::from_str(&node.ip(&["-j", "link", "show", "eth1"])).unwrap();
    let mac = link[0]["address"].as_str().unwrap().to_owned();
    for (family, vip) in [("-4", "10.0.0.50"), ("-6", "fd00:1::50")] {
        eventually(
            Duration::from_secs(3),
            "neighbour entry on the peer",
            async || {
                let out = s
                    .lan
                    .ip(&[family, "neigh", "show", "dev", "lan0", "to", vip]);
                out.contains(&mac).then_some(())
            },
        )
        .await;
    }

    // Changed IP and interface annotation naming eth1: old one goes, new one comes.
    let changed = Instant::now();
    c.assign("web", Some(s.name.as_str()), Some("eth1"), &["10.0.0.51"])
        .await;
    eventually(
        Duration::from_secs(5),
        "10.0.0.51 replacing the others",
        async || {
            (alias(node, "10.0.0.51").is_some()
                && alias(node, "10.0.0.50").is_none()
                && alias(node, "fd00:1::50").is_none())
            .then_some(())
        },
    )
    .await;
    report_where(
        c,
        &s.name,
        "the new IP in the Lease",
        Duration::from_secs(1),
        |r| r.held == ips(&["10.0.0.51"]),
    )
    .await;
    eprintln!("change -> kernel + Lease in {:?}", changed.elapsed());

    // Moved to another node: we let go, and say so.
    c.assign("web", Some("node-b"), None, &["10.0.0.51"]).await;
    eventually(Duration::from_secs(5), "10.0.0.51 gone", async || {
        alias(node, "10.0.0.51").is_none().then_some(())
    })
    .await;
    let (_, took) = report_where(
        c,
        &s.name,
        "an empty held set",
        Duration::from_secs(1),
        |r| r.held.is_empty(),
    )
    .await;
    eprintln!("release -> Lease report within {took:?} of the alias going");
    assert_eq!(
        s.agent.metric(node, "aliaslb_agent_address_adds_total"),
        Some(3.0)
    );
    assert_eq!(
        s.agent.metric(node, "aliaslb_agent_address_removes_total"),
        Some(3.0)
    );
    let text = s.agent.get(node, "/metrics").unwrap();
    assert!(text.contains("aliaslb_agent_api_reachable 1"), "{text}");
    let sent = s.agent.metric(node, "aliaslb_agent_announcements_total");
    assert!(sent.is_some_and(|n| n >= 2.0), "announcements: {sent:?}");
    assert!(
        s.agent
            .get(node, "/healthz")
            .unwrap()
            .starts_with("HTTP/1.0 200")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_address_is_left_alone_and_reported_as_a_conflict() {
    if !require_root() {
        return;
    }
    let s = setup("conflict", |_| {}).await;
    let (node, c) = (&s.node, &s.cluster);
    // Somebody else's /32 in the pool range, and one of ours next to it.
    node.ip(&["addr", "add", "10.0.0.60/32", "dev", "eth1"]);
    c.create("clash").await;
    c.assign(
        "clash",
        Some(s.name.as_str()),
        None,
        &["10.0.0.60", "10.0.0.61"],
    )
    .await;
    let (report, _) = report_where(
        c,
        &s.name,
        "the conflict in the Lease",
        Duration::from_secs(5),
        |r| !r.conflicts.is_empty() && !r.held.is_empty(),
    )
    .await;
    assert_eq!(report.held, ips(&["10.0.0.61"]));
    assert_eq!(report.conflicts.len(), 1);
    assert_eq!(
        report.conflicts[0].ip,
        "10.0.0.60".parse::<std::net::IpAddr>().unwrap()
    );
    assert!(
        report.conflicts[0].reason.contains("eth1"),
        "{:?}",
        report.conflicts[0]
    );
    let assert_untouched = |when: &str| {
        let foreign =
            alias(node, "10.0.0.60").unwrap_or_else(|| panic!("foreign address removed {when}"));
        assert_eq!(
            foreign.label.as_deref(),
            Some("eth1"),
            "{when}: {foreign:?}"
        );
        assert_eq!(
            foreign.valid_life_time,
            u64::from(u32::MAX),
            "{when}: still permanent"
        );
    };
    assert_untouched("while assigned");
    assert_eq!(s.agent.metric(node, "aliaslb_agent_conflicts"), Some(1.0));

    // Unassigned: ours goes, the foreign one stays; the conflict is gone from the report.
    c.assign("clash", None, None, &[]).await;
    report_where(c, &s.name, "an empty report", Duration::from_secs(5), |r| {
        r.held.is_empty() && r.conflicts.is_empty()
    })
    .await;
    assert!(alias(node, "10.0.0.61").is_none());
    assert_untouched("after the release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_kill_9_the_kernel_drops_the_aliases_within_the_lease() {
    if !require_root() {
        return;
    }
    let mut s = setup("kill9", |_| {}).await;
    let node = &s.node;
    serve(&s, &["10.0.0.70", "fd00:1::70"]).await;
    // Let a few refreshes go by: the lifetime never grows beyond the lease.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(alias(node, "10.0.0.70").unwrap().valid_life_time <= 2);

    s.agent.signal("KILL");
    let killed = Instant::now();
    s.agent.wait(Duration::from_secs(2));
    eventually(
        Duration::from_secs(4),
        "the kernel to expire both aliases",
        async || {
            (alias(node, "10.0.0.70").is_none() && alias(node, "fd00:1::70").is_none())
                .then_some(())
        },
    )
    .await;
    let gone = killed.elapsed();
    eprintln!("kill -9 -> aliases expired after {gone:?} (lease 2s)");
    // The lease (2 s) plus the kernel's once-a-second lifetime check.
    assert!(gone < Duration::from_millis(3200), "took {gone:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_externally_deleted_alias_comes_back_within_a_second() {
    if !require_root() {
        return;
    }
    let s = setup("repair", |_| {}).await;
    let node = &s.node;
    serve(&s, &["10.0.0.80", "fd00:1::80"]).await;
    for (ip, prefix) in [("10.0.0.80", "32"), ("fd00:1::80", "128")] {
        let cidr = format!("{ip}/{prefix}");
        node.ip(&["addr", "del", &cidr, "dev", "eth1"]);
        let deleted = Instant::now();
        eventually(
            Duration::from_secs(1),
            "the alias to come back",
            async || alias(node, ip),
        )
        .await;
        eprintln!("{ip}: deleted -> back in {:?}", deleted.elapsed());
    }
    // Counted when the deletion notification's reconcile puts it back; a lifetime
    // refresh landing in between re-creates it too, uncounted (a few ms in 500 ms).
    let repairs = s.agent.metric(node, "aliaslb_agent_repairs_total");
    assert!(repairs.is_some_and(|n| n >= 1.0), "repairs: {repairs:?}");
    assert!(alias(node, "10.0.0.80").unwrap().label.as_deref() == Some("eth1:alb"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_removes_the_aliases_and_releases_the_lease() {
    if !require_root() {
        return;
    }
    let mut s = setup("sigterm", |_| {}).await;
    let (node, c) = (&s.node, &s.cluster);
    // A foreign address that must survive the clean-up.
    node.ip(&["addr", "add", "10.0.0.99/32", "dev", "eth1"]);
    serve(&s, &["10.0.0.90", "fd00:1::90"]).await;
    // The host-port shield is on by default: its elements are written before the aliases.
    let shield = ["list", "table", "inet", "aliaslb"];
    let table = node.try_exec("nft", &shield).unwrap_or_else(|e| {
        panic!(
            "no table `inet aliaslb` while the agent holds 10.0.0.90: {e}\n{}",
            s.agent.log_text()
        )
    });
    assert!(
        table.contains("10.0.0.90") && table.contains("fd00:1::90"),
        "the shield does not hold the aliases:\n{table}"
    );

    s.agent.signal("TERM");
    let start = Instant::now();
    let status = s.agent.wait(Duration::from_secs(6));
    let took = start.elapsed();
    assert!(
        status.success(),
        "exit status {status:?}\n{}",
        s.agent.log_text()
    );
    eprintln!("SIGTERM -> exit 0 in {took:?}");
    assert!(alias(node, "10.0.0.90").is_none(), "IPv4 alias left behind");
    assert!(
        alias(node, "fd00:1::90").is_none(),
        "IPv6 alias left behind"
    );
    assert!(
        alias(node, "10.0.0.99").is_some(),
        "foreign address removed"
    );
    if let Ok(table) = node.try_exec("nft", &shield) {
        panic!(
            "the shield's table outlived the agent:\n{table}\n{}",
            s.agent.log_text()
        );
    }
    // Released, not deleted (a Lease that disappears is no evidence to the controller): no
    // holder, and nothing held.
    let lease = c.lease(&s.name).await.expect("the released Lease");
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity),
        None,
        "the Lease still names a holder"
    );
    let report = c.report(&s.name).await.expect("a report");
    assert!(report.held.is_empty(), "{report:?}");
    let log = s.agent.log_text();
    assert!(log.contains("SIGTERM"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn during_an_api_outage_aliases_stay_and_changes_apply_on_return() {
    if !require_root() {
        return;
    }
    let mut s = setup("outage", |_| {}).await;
    let c = s.cluster.clone();
    serve(&s, &["10.0.0.100"]).await;

    s.relay.stop();
    let down = Instant::now();
    // Three lease durations without the API: the alias stays, its lifetime refreshed.
    while down.elapsed() < Duration::from_secs(6) {
        let a = alias(&s.node, "10.0.0.100").expect("alias dropped during the API outage");
        assert!(a.valid_life_time <= 2, "{a:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let reachable = s.agent.metric(&s.node, "aliaslb_agent_api_reachable");
    assert_eq!(reachable, Some(0.0));
    let failures = s
        .agent
        .metric(&s.node, "aliaslb_agent_lease_renew_failures_total")
        .unwrap();
    assert!(failures >= 2.0, "renew failures: {failures}");
    let log = s.agent.log_text();
    assert_eq!(
        log.matches("cannot renew the agent Lease").count(),
        1,
        "logged once, on the edge:\n{log}"
    );
    // kube-client's own ERROR line per failed request is filtered out by default.
    assert!(
        !log.contains("ERROR"),
        "error spam during the outage:\n{log}"
    );
    assert!(
        s.agent
            .get(&s.node, "/healthz")
            .unwrap()
            .starts_with("HTTP/1.0 200"),
        "still healthy"
    );

    // The controller moves the IP meanwhile; the agent sees it once the API is back.
    c.assign("web", Some("node-b"), None, &["10.0.0.100"]).await;
    s.relay.restart();
    let back = Instant::now();
    let node = &s.node;
    eventually(
        Duration::from_secs(8),
        "the alias released after the outage",
        async || alias(node, "10.0.0.100").is_none().then_some(()),
    )
    .await;
    eprintln!("API back -> change applied in {:?}", back.elapsed());
    report_where(
        &c,
        &s.name,
        "the report after the outage",
        Duration::from_secs(2),
        |r| r.held.is_empty(),
    )
    .await;
    assert_eq!(
        s.agent.metric(&s.node, "aliaslb_agent_api_reachable"),
        Some(1.0)
    );
    assert!(s.agent.log_text().contains("API server reachable again"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_without_carrier_is_not_reported_and_its_aliases_are_not_held() {
    if !require_root() {
        return;
    }
    let s = setup("carrier", |_| {}).await;
    let c = &s.cluster;
    let vip: std::net::IpAddr = "10.0.0.81".parse().unwrap();
    let on_link = |r: &AgentReport| r.subnets().any(|n| n.contains(&vip));
    c.create("web").await;
    c.assign("web", Some(s.name.as_str()), None, &["10.0.0.81"])
        .await;
    report_where(
        c,
        &s.name,
        "the IP held on eth1",
        Duration::from_secs(5),
        |r| r.held.contains(&vip) && on_link(r),
    )
    .await;

    // Cable out: the LAN end of the veth goes down, so eth1 loses its carrier while the
    // agent still reaches the API (through the relay, not the LAN).
    s.lan.ip(&["link", "set", "lan0", "down"]);
    let (_, took) = report_where(
        c,
        &s.name,
        "eth1 and its alias dropped from the report",
        Duration::from_secs(1),
        |r| !r.held.contains(&vip) && !on_link(r),
    )
    .await;
    eprintln!("carrier lost -> report updated in {took:?}");
    // Nobody asked to remove the alias: it stays, it just answers nobody.
    assert!(alias(&s.node, "10.0.0.81").is_some());

    s.lan.ip(&["link", "set", "lan0", "up"]);
    report_where(
        c,
        &s.name,
        "the IP held again",
        Duration::from_secs(2),
        |r| r.held.contains(&vip) && on_link(r),
    )
    .await;
}

/// Issue 12 item 4 and issue 20 item 12: a watch whose connection is cut silently (packets
/// dropped, no RST or FIN) must notice, and the agent act on a change made during the cut,
/// within 5 s of the path healing, after cuts of 20 s and 60 s (and 180 s with
/// `ALIASLB_LONG_CUT=1`): a removed assignment, a new one, and a removed one again. The change is made early in the cut,
/// so without a liveness check the apiserver side's retransmission of the event comes back
/// long after the heal (exponential backoff, up to minutes over a long cut).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_silent_cut_changes_apply_within_5s_of_the_heal() {
    if !require_root() {
        return;
    }
    let s = setup("silentcut", |_| {}).await;
    let c = s.cluster.clone();
    serve(&s, &["10.0.0.110"]).await;
    let node = &s.node;

    // Each change made 1 s into a cut of 20 s, 60 s (and 180 s with `ALIASLB_LONG_CUT=1`:
    // 3 minutes of CI for the same mechanism; its figure is in BENCHMARKS, "Longer cuts"):
    // (cut, IP assigned to this node afterwards, or none).
    let all: [(u64, Option<&str>); 3] = [(20, None), (60, Some("10.0.0.111")), (180, None)];
    let steps = if std::env::var_os("ALIASLB_LONG_CUT").is_some() {
        &all[..]
    } else {
        &all[..2]
    };
    let mut took = Vec::new();
    let mut held = "10.0.0.110";
    for &(secs, now_held) in steps {
        s.relay.cut_silently();
        tokio::time::sleep(Duration::from_secs(1)).await;
        match now_held {
            Some(ip) => c.assign("web", Some(s.name.as_str()), None, &[ip]).await,
            None => c.assign("web", Some("node-b"), None, &[held]).await,
        }
        tokio::time::sleep(Duration::from_secs(secs - 1)).await;
        s.relay.heal();
        let healed = Instant::now();
        match now_held {
            Some(ip) => {
                eventually(
                    Duration::from_secs(200),
                    "the alias added after the heal",
                    async || alias(node, ip),
                )
                .await;
                held = ip;
            }
            None => {
                eventually(
                    Duration::from_secs(200),
                    "the alias released after the heal",
                    async || alias(node, held).is_none().then_some(()),
                )
                .await;
            }
        }
        let applied = healed.elapsed();
        eprintln!(
            "{secs} s cut: heal -> {} applied in {applied:?}",
            if now_held.is_some() {
                "new assignment"
            } else {
                "removed assignment"
            }
        );
        took.push((secs, applied));
    }

    assert!(
        took.iter().all(|(_, t)| *t <= Duration::from_secs(5)),
        "after the heal (cut seconds, applied after): {took:?} (want <= 5 s each)\n{}",
        s.agent.log_text()
    );
}

/// Issue 41, item 9: the same with the lease the manifests ship (30 s, renewed every 10 s):
/// a 40 s silent cut, the assignment taken away 1 s into it; the alias goes within 5 s of
/// the heal (14 s before, where the renewal that follows the heal waited for its tick).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_default_lease_a_change_made_during_a_silent_cut_applies_within_5s_of_the_heal() {
    if !require_root() {
        return;
    }
    let s = setup("silentdef", |args| {
        args.lease = "30s";
        args.renew = "10s";
    })
    .await;
    // The sharded format, as the controller writes it (two watches to heal: the index by
    // name, its shards by label).
    let c = s.cluster.clone();
    c.set_sharded(&s.name, "10.0.0.112 - tcp:80 default/web\n", "")
        .await;
    let node = &s.node;
    eventually(Duration::from_secs(15), "the alias", async || {
        alias(node, "10.0.0.112")
    })
    .await;
    s.relay.cut_silently();
    tokio::time::sleep(Duration::from_secs(1)).await;
    c.set_sharded(&s.name, "", "").await;
    tokio::time::sleep(Duration::from_secs(39)).await;
    s.relay.heal();
    let healed = Instant::now();
    eventually(
        Duration::from_secs(60),
        "the alias released after the heal",
        async || alias(node, "10.0.0.112").is_none().then_some(()),
    )
    .await;
    let applied = healed.elapsed();
    eprintln!("40 s cut, default lease: heal -> removed assignment applied in {applied:?}");
    assert!(
        applied <= Duration::from_secs(5),
        "applied {applied:?} after the heal (want <= 5 s)\n{}",
        s.agent.log_text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_assignment_keeps_the_aliases_until_the_agent_lease_goes_stale() {
    if !require_root() {
        return;
    }
    let mut s = setup("orphan", |_| {}).await;
    let c = s.cluster.clone();
    let object = aliaslb_core::keys::assignment_configmap(&s.name);
    let delete = async || {
        c.assignments
            .delete(&object, &kube::api::DeleteParams::default())
            .await
            .unwrap();
    };
    c.create("web").await;
    c.assign(
        "web",
        Some(s.name.as_str()),
        None,
        &["10.0.0.120", "fd00:1::120"],
    )
    .await;
    let node = &s.node;
    eventually(Duration::from_secs(5), "the aliases", async || {
        alias(node, "10.0.0.120").and(alias(node, "fd00:1::120"))
    })
    .await;

    // Deleted (by hand, a prune): three lease durations later everything is still held.
    delete().await;
    let deleted = Instant::now();
    while deleted.elapsed() < Duration::from_secs(6) {
        assert!(alias(node, "10.0.0.120").is_some(), "dropped on a deletion");
        assert!(
            alias(node, "fd00:1::120").is_some(),
            "dropped on a deletion"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let report = c.report(&s.name).await.unwrap();
    assert_eq!(report.held, ips(&["10.0.0.120", "fd00:1::120"]));
    assert!(
        s.agent
            .log_text()
            .contains("assignment object of this node is missing"),
        "{}",
        s.agent.log_text()
    );

    // Written again by the controller: it is in force at once (here without the v6 IP).
    c.assign("web", Some(s.name.as_str()), None, &["10.0.0.120"])
        .await;
    eventually(Duration::from_secs(5), "fd00:1::120 released", async || {
        alias(node, "fd00:1::120").is_none().then_some(())
    })
    .await;

    // Missing again, then the API is lost: once the agent's Lease is stale (2 s), the
    // kept set is let go (the controller may have moved the IP), and it is not taken
    // back when the API returns, only when the controller writes the object again.
    delete().await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(alias(node, "10.0.0.120").is_some());
    let_go_once_stale_until_written_again(&mut s, "10.0.0.120").await;
}

/// The API is lost: once the agent's Lease is stale (2 s), the alias of `ip` kept for an
/// object missing or unreadable is let go (the controller may have moved the IP), and it is
/// not taken back when the API returns, only once the controller writes the object again.
async fn let_go_once_stale_until_written_again(s: &mut Setup, ip: &str) {
    let c = s.cluster.clone();
    s.relay.stop();
    let cut = Instant::now();
    eventually(
        Duration::from_secs(6),
        "the kept alias let go with stale authority",
        async || alias(&s.node, ip).is_none().then_some(()),
    )
    .await;
    let let_go = cut.elapsed();
    eprintln!("API cut -> kept alias let go in {let_go:?} (lease 2 s)");
    assert!(
        let_go >= Duration::from_millis(1500),
        "let go before the Lease went stale: {let_go:?}"
    );
    s.relay.restart();
    report_where(
        &c,
        &s.name,
        "a report after the API returned",
        Duration::from_secs(10),
        |r| r.held.is_empty(),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(alias(&s.node, ip).is_none(), "taken back unasked");
    c.assign("web", Some(s.name.as_str()), None, &[ip]).await;
    eventually(
        Duration::from_secs(5),
        "the alias assigned again",
        async || alias(&s.node, ip),
    )
    .await;
}

/// Issue 42 item 5: an assignment object that cannot be read (an edit by hand, a bug) is
/// treated like a missing one: the last set read is kept while the agent's Lease stays
/// fresh, let go once it goes stale (the controller may have moved the IP meanwhile), and
/// not taken back before the controller writes a readable object again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_assignment_keeps_the_aliases_until_the_agent_lease_goes_stale() {
    if !require_root() {
        return;
    }
    let mut s = setup("garbled", |_| {}).await;
    let c = s.cluster.clone();
    serve(&s, &["10.0.0.130"]).await;
    let node = &s.node;

    // Garbled: kept while the Lease is fresh (three lease durations).
    c.set_assignment_text(&s.name, "10.0.0.130 - - not a line\n")
        .await;
    let garbled = Instant::now();
    while garbled.elapsed() < Duration::from_secs(6) {
        assert!(alias(node, "10.0.0.130").is_some(), "dropped while fresh");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The API is lost: once the Lease is stale, the kept set is let go.
    let_go_once_stale_until_written_again(&mut s, "10.0.0.130").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_300_pod_veths_still_reports_validly_and_takes_ips() {
    if !require_root() {
        return;
    }
    let s = setup("pods", |_| {}).await;
    let c = s.cluster.clone();
    let node = &s.node;
    // 300 pods' veth pairs, both ends on the node (600 Ethernet links, none with an
    // address of the node), made while the agent runs, and a CNI bridge holding the pod
    // gateway address.
    let mut batch = String::new();
    for i in 0..300 {
        batch.push_str(&format!(
            "link add veth{i:04x} type veth peer name pod{i:04x}\nlink set veth{i:04x} up\nlink set pod{i:04x} up\n"
        ));
    }
    batch
        .push_str("link add cni0 type bridge\nlink set cni0 up\naddr add 10.244.0.1/24 dev cni0\n");
    let file = std::env::temp_dir().join(format!("{}-veths.batch", node.name()));
    std::fs::write(&file, batch).unwrap();
    let made = Instant::now();
    node.ip(&["-batch", file.to_str().unwrap()]);
    std::fs::remove_file(&file).unwrap();
    eprintln!("300 veth pairs made in {:?}", made.elapsed());
    let links = node.ip(&["-o", "link", "show"]).lines().count();
    assert!(links > 600, "{links} links");

    // The agent has seen them (a reconcile after the link changes), and its report is
    // still valid (`Cluster::report` reads it within bounds) and lists only eth1.
    tokio::time::sleep(Duration::from_secs(2)).await;
    c.create("web").await;
    let assigned = Instant::now();
    c.assign(
        "web",
        Some(s.name.as_str()),
        None,
        &["10.0.0.130", "fd00:1::130"],
    )
    .await;
    eventually(Duration::from_secs(10), "the aliases", async || {
        alias(node, "10.0.0.130").and(alias(node, "fd00:1::130"))
    })
    .await;
    let (report, _) = report_where(
        &c,
        &s.name,
        "the aliases reported held",
        Duration::from_secs(5),
        |r| r.held == ips(&["10.0.0.130", "fd00:1::130"]),
    )
    .await;
    eprintln!("assigned -> held and reported in {:?}", assigned.elapsed());
    let names: Vec<&str> = report.interfaces.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(names, ["eth1"], "pod and CNI links reported");
    assert_eq!(report.macs.len(), 1, "{:?}", report.macs);

    // No LAN socket, and no thread, per pod link.
    let tasks = std::fs::read_dir(format!("/proc/{}/task", s.agent.pid()))
        .unwrap()
        .count();
    let packet_sockets = node.exec("cat", &["/proc/net/packet"]).lines().count() - 1;
    eprintln!("agent threads: {tasks}, packet sockets in the node: {packet_sockets}");
    assert!(tasks < 40, "{tasks} threads");
    assert!(packet_sockets <= 4, "{packet_sockets} AF_PACKET sockets");
}

/// Whether the node's shield table is whole and guards `ip`: its rules are there (the
/// `guard4` chain's drop rule) and `held4` lists `ip`.
fn shield_guards(node: &NetNs, ip: &str) -> bool {
    let Ok(table) = node.try_exec("nft", &["list", "table", "inet", "aliaslb"]) else {
        return false;
    };
    let held4 = table
        .split("set held4")
        .nth(1)
        .and_then(|rest| rest.split('}').next())
        .unwrap_or_default();
    table.contains("counter name \"dropped4\" drop") && held4.contains(ip)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shield_heals_a_flushed_ruleset_and_reads_failing_until_it_is_rewritten() {
    if !require_root() {
        return;
    }
    // `nft` as the agent runs it: the real one, behind a wrapper that refuses writes
    // (`-f`) while `fail-write` exists and reads (`-t`) while `fail-read` exists.
    let dir = tempfile::tempdir().unwrap();
    let real = ["/usr/sbin/nft", "/sbin/nft", "/usr/bin/nft"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .expect("nft (apt-get install nftables)");
    let d = dir.path().display();
    let wrapper = format!(
        "#!/bin/sh\ncase \"$1\" in\n  -f) [ -e {d}/fail-write ] && {{ echo 'Error: refused by the test' >&2; exit 1; }} ;;\n  -t) [ -e {d}/fail-read ] && {{ echo 'Error: refused by the test' >&2; exit 1; }} ;;\nesac\nexec {real} \"$@\"\n"
    );
    let nft = dir.path().join("nft");
    std::fs::write(&nft, wrapper).unwrap();
    std::fs::set_permissions(&nft, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let path = format!("{d}:{}", std::env::var("PATH").unwrap_or_default());
    let s = setup("heal", |a| a.env.push(("PATH".into(), path))).await;
    let c = s.cluster.clone();
    let node = &s.node;
    c.create("web").await;
    c.assign("web", Some(s.name.as_str()), None, &["10.0.0.140"])
        .await;
    eventually(Duration::from_secs(5), "the alias, shielded", async || {
        (alias(node, "10.0.0.140").is_some() && shield_guards(node, "10.0.0.140")).then_some(())
    })
    .await;
    let shield_active = || s.agent.metric(node, "aliaslb_agent_shield_active");
    assert_eq!(shield_active(), Some(1.0));

    // Someone else's `nft flush ruleset` (nftables.service), or the table deleted:
    // rewritten within one renew interval (500 ms) plus the time of one `nft` run. Rules
    // flushed from a table left in place: within the 5 s of the whole table's reading.
    let cases = [
        (vec!["flush", "ruleset"], Duration::from_millis(1500)),
        (
            vec!["delete", "table", "inet", "aliaslb"],
            Duration::from_millis(1500),
        ),
        (
            vec!["flush", "table", "inet", "aliaslb"],
            Duration::from_millis(6000),
        ),
    ];
    for (how, bound) in cases {
        node.exec("nft", &how);
        assert!(!shield_guards(node, "10.0.0.140"));
        let start = Instant::now();
        eventually(Duration::from_secs(8), "the table rewritten", async || {
            shield_guards(node, "10.0.0.140").then_some(())
        })
        .await;
        let healed = start.elapsed();
        eprintln!("nft {} -> shield rewritten in {healed:?}", how.join(" "));
        assert!(healed < bound, "{how:?}: {healed:?}");
    }
    assert!(alias(node, "10.0.0.140").is_some());
    // The last case's `Failing` and `Active` reports may still be on their way: start the
    // next one from an `Active` report, or its `Failing` could be the last case's.
    report_where(
        &c,
        &s.name,
        "the shield reported active after the rewrites",
        Duration::from_secs(3),
        |r| r.shield == ShieldState::Active,
    )
    .await;

    // Deleted while nft cannot write: the state reads `failing` in the report and the
    // metric, never `active`, until the rewrite works again.
    std::fs::write(dir.path().join("fail-write"), "").unwrap();
    node.exec("nft", &["delete", "table", "inet", "aliaslb"]);
    report_where(
        &c,
        &s.name,
        "the shield reported failing",
        Duration::from_secs(3),
        |r| r.shield == ShieldState::Failing,
    )
    .await;
    let failing = Instant::now();
    while failing.elapsed() < Duration::from_secs(2) {
        assert_eq!(shield_active(), Some(0.0));
        let r = c.report(&s.name).await.unwrap();
        assert_eq!(r.shield, ShieldState::Failing, "while the table is gone");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    std::fs::remove_file(dir.path().join("fail-write")).unwrap();
    report_where(
        &c,
        &s.name,
        "the shield reported active again",
        Duration::from_secs(3),
        |r| r.shield == ShieldState::Active,
    )
    .await;
    assert!(shield_guards(node, "10.0.0.140"));
    assert_eq!(shield_active(), Some(1.0));
    let damaged = s
        .agent
        .metric(node, "aliaslb_agent_shield_tables_damaged_total")
        .unwrap();
    assert!(damaged >= 4.0, "{damaged}");

    // A read that fails is a warning, once, not a debug line every renewal. The whole table
    // (`nft -t`) is read every 5 s: failing for longer than that fails at least one read.
    std::fs::write(dir.path().join("fail-read"), "").unwrap();
    tokio::time::sleep(Duration::from_millis(5_500)).await;
    std::fs::remove_file(dir.path().join("fail-read")).unwrap();
    let log = s.agent.log_text();
    let warned: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("cannot read the host-port shield's table"))
        .collect();
    assert_eq!(warned.len(), 1, "{log}");
    assert!(warned[0].contains("WARN"), "{}", warned[0]);
    assert!(log.contains("deleted or altered by someone else"), "{log}");
}

/// Issue 20 item 4: a node cut off from the API withdraws its routed (L3) addresses once
/// its Lease has been stale for a lease duration (2 x 2 s here), so its routing daemon
/// withdraws their routes and the controller may give them to other Services; its LAN
/// (L2) aliases stay (the LAN guard handles those). Once the API is back and the
/// assignment read again, the routed address is taken back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_cut_off_from_the_api_withdraws_its_routed_addresses_after_a_lease() {
    if !require_root() {
        return;
    }
    let mut s = setup("l3fence", |_| {}).await;
    let c = s.cluster.clone();
    c.set_assignment_text(
        &s.name,
        "10.0.0.130 - tcp:80 t/lan\n10.200.0.130 - tcp:80 t/routed bgp\n",
    )
    .await;
    let node = &s.node;
    eventually(Duration::from_secs(5), "both addresses", async || {
        alias(node, "10.0.0.130").and(node.addr("lo", "10.200.0.130"))
    })
    .await;

    s.relay.stop();
    let cut = Instant::now();
    // Stale after 2 s (lease), withdrawn 2 s later: still there at 3 s.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        node.addr("lo", "10.200.0.130").is_some(),
        "withdrawn before the Lease had been stale for a lease duration"
    );
    eventually(
        Duration::from_secs(4),
        "the routed address withdrawn",
        async || node.addr("lo", "10.200.0.130").is_none().then_some(()),
    )
    .await;
    let withdrawn = cut.elapsed();
    eprintln!("API cut -> routed address withdrawn in {withdrawn:?} (lease 2 s)");
    assert!(
        alias(node, "10.0.0.130").is_some(),
        "the L2 alias is not withdrawn by the L3 cut-off"
    );
    assert_eq!(
        s.agent.metric(node, "aliaslb_agent_routed_withdrawn"),
        Some(1.0)
    );
    assert!(
        s.agent
            .log_text()
            .contains("withdrawing the routed addresses"),
        "{}",
        s.agent.log_text()
    );
    // Two more lease durations: not back while cut off.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        node.addr("lo", "10.200.0.130").is_none(),
        "back while cut off"
    );

    s.relay.restart();
    let back = Instant::now();
    eventually(
        Duration::from_secs(10),
        "the routed address back after the API returned",
        async || node.addr("lo", "10.200.0.130"),
    )
    .await;
    eprintln!("API back -> routed address back in {:?}", back.elapsed());
    assert_eq!(
        s.agent.metric(node, "aliaslb_agent_routed_withdrawn"),
        Some(0.0)
    );
}

/// Issue 24, heartbeats that scale: at the defaults (30 s lease, renewed every 10 s) an
/// unchanged report is written once per renew interval, a change at once, and the aliases
/// still live 3 s, refreshed locally between the writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_is_written_once_per_renew_interval_and_a_change_at_once() {
    if !require_root() {
        return;
    }
    let s = setup("rare", |a| {
        a.lease = "30s";
        a.renew = "10s";
    })
    .await;
    let (node, c) = (&s.node, &s.cluster);
    c.create("web").await;
    let assigned = Instant::now();
    c.assign("web", Some(s.name.as_str()), None, &["10.0.0.71"])
        .await;
    let (_, took) = report_where(
        c,
        &s.name,
        "the report to hold the new IP",
        Duration::from_secs(5),
        |r| r.held.contains(&"10.0.0.71".parse().unwrap()),
    )
    .await;
    eprintln!(
        "assigned -> reported held after {:?} (renew interval 10 s)",
        assigned.elapsed()
    );
    assert!(took < Duration::from_secs(3), "a change waited {took:?}");
    // Now count the writes: the Lease read every 100 ms for 21 s (two renew intervals and a
    // bit). A write whose report is the one before is a renewal; one that changed it (an
    // interface, the shield's state) is a change, written at once by design.
    let read = async || {
        c.lease(&s.name).await.map(|l| {
            let report = l
                .metadata
                .annotations
                .and_then(|mut a| a.remove(aliaslb_core::keys::ANNOTATION_AGENT_REPORT));
            (l.metadata.resource_version, report)
        })
    };
    let (mut version, mut report) = read().await.unwrap();
    let (mut renewals, mut changes) = (0, Vec::new());
    let mut longest_lifetime = 0;
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(21) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let (v, r) = read().await.unwrap();
        if v != version {
            if r == report {
                renewals += 1;
            } else {
                changes.push(format!("{:?}: {r:?}", start.elapsed()));
            }
            (version, report) = (v, r);
        }
        let lifetime = alias(node, "10.0.0.71")
            .expect("the alias stays, refreshed locally")
            .valid_life_time;
        longest_lifetime = longest_lifetime.max(lifetime);
    }
    eprintln!(
        "21 s: {renewals} renewals of an unchanged report, {} changes written; alias valid_lft at most {longest_lifetime} s",
        changes.len()
    );
    for change in &changes {
        eprintln!("  change at {change}");
    }
    // Every 10 s: two in 21 s, three at most; at the old 1 s renewal about 21.
    assert!(
        (1..=3).contains(&renewals),
        "{renewals} renewals in 21 s at a 10 s renew interval; changes: {changes:?}"
    );
    assert!(
        (1..=3).contains(&longest_lifetime),
        "valid_lft {longest_lifetime}"
    );
}
