//! LAN conflicts and first claims against the real kube-apiserver (1.37; 1.30 too), with fake agents
//! whose reports the test scripts ([`Cluster::lan_agent`]):
//!
//! - an agent reporting its assigned IP answered on the LAN by a foreign MAC: the Service
//!   gets another IP of its pool, with a Warning Event `AddressConflict` naming the MAC;
//!   the address shows as `conflict` with the MAC in `aliaslb status` and in the gauge
//!   `aliaslb_controller_address_conflicts`; a Service created meanwhile with no other
//!   address waits with `AddressConflict`; the report dropped, the address is allocatable
//!   again;
//! - with a one-address pool, the Service waits with `AddressConflict` until the report is
//!   dropped, then gets its address back;
//! - the first assignment line of a new Service says `probe` until the agent holds the IP;
//!   after a hard loss (the agent's Lease expired) the new node's line does not;
//! - every assignment object lists every agent's MACs under `node-macs`;
//! - an agent reporting a claim against its held IP by a foreign MAC (defended): the
//!   Service keeps its IP and node, Announced True `AddressDefended` and one Warning Event
//!   `AddressDefended`, both naming the MAC; with the pool option `onConflict: renumber` the
//!   same report moves it to another IP (Warning `AddressConflict`);
//! - the network and broadcast addresses of a subnet two fresh agents report are never
//!   handed out (issue 20 item 9, issue 42): the lowest free address skips them, a request for one waits with
//!   `SubnetAddress`, an exhausted pool's message names them, and `aliaslb status` shows
//!   them as `subnet-address`.

mod support;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use aliaslb_core::keys;
use aliaslb_core::plan::reason;
use support::{AGENT_LEASE, Cluster, SETTLE, eventually, lb_service, metric, serial};

/// The foreign host answering on the LAN.
const FOREIGN: &str = "46:b0:48:e8:2d:96";
const MAC1: &str = "02:00:00:00:00:01";
const MAC2: &str = "02:00:00:00:00:02";

async fn announced(c: &Cluster, name: &str, reason: &str) {
    eventually(SETTLE, &format!("{name} Announced {reason}"), async || {
        c.condition(name, keys::CONDITION_ANNOUNCED)
            .await
            .is_some_and(|(_, r, _)| r == reason)
    })
    .await;
}

/// Waits until Service `name`'s IPAllocated condition has `reason`; returns its message.
async fn allocated(c: &Cluster, name: &str, reason: &str) -> String {
    c.wait_condition(name, keys::CONDITION_IP_ALLOCATED, reason)
        .await
}

/// The Warning Events `reason` on Service `name`, their notes.
async fn warnings(c: &Cluster, name: &str, reason: &str) -> Vec<String> {
    c.events(&c.ns, name)
        .await
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some(reason) && e.type_.as_deref() == Some("Warning"))
        .filter_map(|e| e.note)
        .collect()
}

/// The node among `nodes` whose assignment object lists `ip`, once one does.
async fn node_of(c: &Cluster, nodes: &[&String], ip: &str) -> String {
    let nodes: Vec<&str> = nodes.iter().map(|n| n.as_str()).collect();
    let mut found = None;
    eventually(SETTLE, &format!("a node is assigned {ip}"), async || {
        found = c.holder_of(&nodes, ip).await;
        found.is_some()
    })
    .await;
    found.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lan_conflict_moves_the_service_and_first_claims_say_probe() {
    let _serial = serial().await;
    let c = Cluster::new("lan-conflict").await;
    c.set_pool(&[(c.ns.as_str(), "10.89.0.1-10.89.0.2")]).await;
    let n1 = c.node("n1").await;
    let n2 = c.node("n2").await;
    let mut agents = BTreeMap::from([
        (n1.clone(), c.lan_agent(&n1, MAC1)),
        (n2.clone(), c.lan_agent(&n2, MAC2)),
    ]);
    let (_controller, metrics) = c.start_controller();
    let nodes = [&n1, &n2];

    // A first claim: `probe` until the agent holds the IP, then dropped.
    c.create(lb_service("web")).await;
    c.wait_ips("web", &["10.89.0.1"], SETTLE).await;
    let first = node_of(&c, &nodes, "10.89.0.1").await;
    let line = c.assignment_line(&first, "10.89.0.1").await.unwrap();
    assert!(line.ends_with(" probe"), "a first claim: {line:?}");
    // No standby (the fake agents report no subnet, so no node is on the IP's LAN): no
    // peer listed, and no index lists every node's MACs (controller/tests/standby.rs has
    // the peers' MACs and keys).
    let data = c.assignment_data(&first).await;
    assert_eq!(data.get(keys::PEERS_KEY).map(String::as_str), Some(""));
    assert!(!data.contains_key(keys::NODE_MACS_KEY));
    agents[&first].1.lock().unwrap().hold = true;
    announced(&c, "web", "Announced").await;
    eventually(SETTLE, "probe dropped once held", async || {
        c.assignment_line(&first, "10.89.0.1")
            .await
            .is_some_and(|l| !l.ends_with(" probe"))
    })
    .await;

    // The agent reports the address answered on the LAN by a foreign host: moved.
    let conflicted: IpAddr = "10.89.0.1".parse().unwrap();
    agents[&first]
        .1
        .lock()
        .unwrap()
        .conflicts
        .insert(conflicted, FOREIGN.parse().unwrap());
    c.wait_ips("web", &["10.89.0.2"], SETTLE).await;
    let mut notes = Vec::new();
    eventually(SETTLE, "a Warning AddressConflict on web", async || {
        notes = warnings(&c, "web", reason::ADDRESS_CONFLICT).await;
        !notes.is_empty()
    })
    .await;
    assert_eq!(
        notes,
        [format!(
            "10.89.0.1 is answered on the LAN by {FOREIGN} (seen by {first} on eth1), not a \
             node of this cluster: released; assigning a new address"
        )]
    );
    eventually(
        SETTLE,
        "the gauge counts the withheld address",
        async || metric(&metrics, "aliaslb_controller_address_conflicts ").as_deref() == Some("1"),
    )
    .await;
    let table = c.status_table();
    let row = table
        .lines()
        .find(|l| l.starts_with("10.89.0.1 "))
        .unwrap_or_else(|| panic!("no row for 10.89.0.1:\n{table}"));
    assert!(
        row.contains(&format!("conflict {FOREIGN}")) && row.contains(&first),
        "{row}\n{table}"
    );

    // Nothing else free: a new Service waits with AddressConflict, naming the MAC.
    c.create(lb_service("late")).await;
    let message = allocated(&c, "late", reason::ADDRESS_CONFLICT).await;
    assert!(
        message.contains("10.89.0.1") && message.contains(FOREIGN),
        "{message}"
    );

    // Nobody answers any more: the agent drops the report, the address is free again.
    agents[&first].1.lock().unwrap().conflicts.clear();
    c.wait_ips("late", &["10.89.0.1"], SETTLE).await;
    eventually(SETTLE, "the gauge back to 0", async || {
        metric(&metrics, "aliaslb_controller_address_conflicts ").as_deref() == Some("0")
    })
    .await;

    // Hard loss of web's node: the new node takes over from a known holder, no probe.
    let lost = node_of(&c, &nodes, "10.89.0.2").await;
    eventually(SETTLE, "web's agent holds 10.89.0.2", async || {
        agents[&lost].1.lock().unwrap().hold = true;
        announced_now(&c, "web").await
    })
    .await;
    let heir = if lost == n1 { n2.clone() } else { n1.clone() };
    // The heir's agent holds nothing, so a line without `probe` is not one already held.
    agents[&heir].1.lock().unwrap().hold = false;
    drop(agents.remove(&lost));
    eventually(
        SETTLE + AGENT_LEASE,
        "web's IP assigned to the heir",
        async || c.assignment_line(&heir, "10.89.0.2").await.is_some(),
    )
    .await;
    let line = c.assignment_line(&heir, "10.89.0.2").await.unwrap();
    assert!(!line.ends_with(" probe"), "a takeover: {line:?}");
    c.cleanup().await;
}

/// Whether Service `name` is Announced now.
async fn announced_now(c: &Cluster, name: &str) -> bool {
    c.condition(name, keys::CONDITION_ANNOUNCED)
        .await
        .is_some_and(|(_, r, _)| r == "Announced")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_one_address_the_service_waits_for_the_conflict_to_lift() {
    let _serial = serial().await;
    let c = Cluster::new("lan-pending").await;
    c.set_pool(&[(c.ns.as_str(), "10.89.1.1")]).await;
    let n1 = c.node("n1").await;
    let (_agent, script) = c.lan_agent(&n1, MAC1);
    script.lock().unwrap().hold = true;
    let (_controller, _metrics) = c.start_controller();
    c.create(lb_service("web")).await;
    c.wait_ips("web", &["10.89.1.1"], SETTLE).await;
    announced(&c, "web", "Announced").await;

    script
        .lock()
        .unwrap()
        .conflicts
        .insert("10.89.1.1".parse().unwrap(), FOREIGN.parse().unwrap());
    c.wait_ips("web", &[], SETTLE).await;
    let message = allocated(&c, "web", reason::ADDRESS_CONFLICT).await;
    assert_eq!(
        message,
        format!(
            "all 1 addresses of pool {} are in use; 1 of them is answered on the LAN by a \
             host outside the cluster, not allocated while an agent reports it (10.89.1.1 is \
             answered on the LAN by {FOREIGN} (seen by {n1} on eth1))",
            c.ns
        )
    );
    eventually(
        SETTLE,
        "a Warning AddressConflict naming the MAC",
        async || {
            warnings(&c, "web", reason::ADDRESS_CONFLICT)
                .await
                .iter()
                .any(|n| n.contains(FOREIGN))
        },
    )
    .await;
    assert!(
        c.assignment_line(&n1, "10.89.1.1").await.is_none(),
        "the agent is no longer assigned the address"
    );

    script.lock().unwrap().conflicts.clear();
    c.wait_ips("web", &["10.89.1.1"], SETTLE).await;
    allocated(&c, "web", reason::ALLOCATED).await;
    announced(&c, "web", "Announced").await;
    c.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_defended_claim_keeps_the_service_and_names_the_mac_unless_the_pool_renumbers() {
    let _serial = serial().await;
    let c = Cluster::new("lan-defend").await;
    let pool = "10.89.1.1-10.89.1.2";
    c.set_pool(&[(c.ns.as_str(), pool)]).await;
    let n1 = c.node("n1").await;
    let agent = c.lan_agent(&n1, MAC1);
    agent.1.lock().unwrap().hold = true;
    let (_controller, _metrics) = c.start_controller();
    c.create(lb_service("web")).await;
    c.wait_ips("web", &["10.89.1.1"], SETTLE).await;
    announced(&c, "web", "Announced").await;

    // A host outside the cluster claims it; the agent defends it and says so.
    let claimed: IpAddr = "10.89.1.1".parse().unwrap();
    agent
        .1
        .lock()
        .unwrap()
        .claims
        .insert(claimed, FOREIGN.parse().unwrap());
    announced(&c, "web", reason::ADDRESS_DEFENDED).await;
    let (status, _, message) = c.condition("web", keys::CONDITION_ANNOUNCED).await.unwrap();
    assert_eq!(status, "True", "still announced: {message}");
    assert!(
        message.contains(FOREIGN) && message.contains(&n1),
        "{message}"
    );
    let mut notes = Vec::new();
    eventually(SETTLE, "a Warning AddressDefended on web", async || {
        notes = warnings(&c, "web", reason::ADDRESS_DEFENDED).await;
        !notes.is_empty()
    })
    .await;
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(notes[0].contains(FOREIGN), "{notes:?}");
    // Nothing moves while it is reported.
    tokio::time::sleep(Duration::from_secs(2)).await;
    c.wait_ips("web", &["10.89.1.1"], SETTLE).await;
    assert!(
        c.assignment_line(&n1, "10.89.1.1").await.is_some(),
        "still assigned to {n1}"
    );
    assert!(
        warnings(&c, "web", reason::ADDRESS_CONFLICT)
            .await
            .is_empty()
    );
    assert_eq!(warnings(&c, "web", reason::ADDRESS_DEFENDED).await.len(), 1);

    // The operator says this LAN's claims win: renumbered.
    c.set_pool(&[
        (c.ns.as_str(), pool),
        (
            "config.yaml",
            &format!("pools:\n  {}:\n    onConflict: renumber\n", c.ns),
        ),
    ])
    .await;
    c.wait_ips("web", &["10.89.1.2"], SETTLE).await;
    // The Event is written after the pass that moved the address (the Event queue).
    eventually(
        SETTLE,
        "an AddressConflict Warning naming the claim",
        async || {
            warnings(&c, "web", reason::ADDRESS_CONFLICT)
                .await
                .iter()
                .any(|n| n.contains(FOREIGN) && n.contains("10.89.1.1"))
        },
    )
    .await;
    c.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_subnets_network_and_broadcast_addresses_are_never_handed_out() {
    let _serial = serial().await;
    let c = Cluster::new("subnet-edges").await;
    // A range that lists the /30's network (.0) and broadcast (.3) addresses.
    c.set_pool(&[(c.ns.as_str(), "10.89.0.0-10.89.0.3")]).await;
    let n1 = c.node("n1").await;
    let report = serde_json::json!({
        "version": 1,
        "interfaces": [{"name": "eth1", "subnets": ["10.89.0.0/30"]}],
    })
    .to_string();
    // Two fresh agents report the subnet (one node's report alone counts only around its
    // own Node address, issue 42).
    let n2 = c.node("n2").await;
    let _agent = c.agent_reporting(&n1, report.clone());
    let _agent2 = c.agent_reporting(&n2, report);
    c.wait_agent_leases(&[&n1, &n2]).await;
    let (_controller, _metrics) = c.start_controller();
    c.create(lb_service("a")).await;
    c.wait_ips("a", &["10.89.0.1"], SETTLE).await;
    c.create(lb_service("b")).await;
    c.wait_ips("b", &["10.89.0.2"], SETTLE).await;
    c.create(lb_service("c")).await;
    let message = allocated(&c, "c", reason::POOL_EXHAUSTED).await;
    assert!(
        message.contains("2 of them are subnets' network or broadcast addresses")
            && message.contains("10.89.0.3 is the broadcast address of subnet 10.89.0.0/30"),
        "{message}"
    );
    c.create(lb_service("asks").request("10.89.0.0")).await;
    let message = allocated(&c, "asks", reason::SUBNET_ADDRESS).await;
    assert!(
        message.starts_with("10.89.0.0 is the network address of subnet 10.89.0.0/30"),
        "{message}"
    );
    let table = c.status_table();
    for ip in ["10.89.0.0", "10.89.0.3"] {
        assert!(
            table
                .lines()
                .any(|l| l.starts_with(ip) && l.contains("subnet-address")),
            "{ip} not shown as subnet-address:\n{table}"
        );
    }
    c.cleanup().await;
}

/// Pool addresses in a Service ClusterIP range (the apiserver's own ServiceCIDR
/// `kubernetes`, from `--service-cluster-ip-range=10.96.0.0/12`) are never handed out
/// (issue 20 item 9), with a Warning `ServiceRange` on the pool ConfigMap naming the
/// entries. On servers that do not serve ServiceCIDRs (before 1.33) the controller says at
/// start that it cannot tell; this test then checks nothing more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_addresses_in_the_service_clusterip_range_are_never_handed_out() {
    let _serial = serial().await;
    let c = Cluster::new("service-range").await;
    let served = c
        .client
        .list_api_group_resources("networking.k8s.io/v1")
        .await
        .is_ok_and(|l| l.resources.iter().any(|r| r.name == "servicecidrs"));
    if !served {
        eprintln!("this server serves no ServiceCIDRs: nothing to withhold by");
        return;
    }
    c.set_pool(&[(c.ns.as_str(), "10.96.0.1-10.96.0.2\n10.89.1.1")])
        .await;
    let n1 = c.node("n1").await;
    let _agent = c.fake_agent(&n1);
    let (_controller, _metrics) = c.start_controller();
    c.create(lb_service("a")).await;
    c.wait_ips("a", &["10.89.1.1"], SETTLE).await;
    c.create(lb_service("b")).await;
    let message = allocated(&c, "b", reason::POOL_EXHAUSTED).await;
    assert!(
        message.contains("2 of them are in a Service ClusterIP range")
            && message.contains("10.96.0.1 is in the Service ClusterIP range 10.96.0.0/12"),
        "{message}"
    );
    c.create(lb_service("asks").request("10.96.0.2")).await;
    let message = allocated(&c, "asks", reason::SERVICE_RANGE).await;
    assert!(
        message.starts_with("10.96.0.2 is in the Service ClusterIP range 10.96.0.0/12"),
        "{message}"
    );
    let mut note = String::new();
    eventually(
        SETTLE,
        "a ServiceRange Warning on the pool ConfigMap",
        async || {
            note = c
                .events(&c.system, keys::DEFAULT_POOL_CONFIGMAP)
                .await
                .into_iter()
                .filter(|e| e.reason.as_deref() == Some(reason::SERVICE_RANGE))
                .filter_map(|e| e.note)
                .next()
                .unwrap_or_default();
            !note.is_empty()
        },
    )
    .await;
    assert!(
        note.starts_with(&format!(
            "key {}, line 1: 10.96.0.1-10.96.0.2 are in the Service ClusterIP range 10.96.0.0/12: never allocated",
            c.ns
        )),
        "{note}"
    );
    let table = c.status_table();
    for ip in ["10.96.0.1", "10.96.0.2"] {
        assert!(
            table
                .lines()
                .any(|l| l.starts_with(ip) && l.contains("service-range")),
            "{ip} not shown as service-range:\n{table}"
        );
    }
    c.cleanup().await;
}

/// One LAN host answering every first claim's probe (issue 42 item 4): the agent on the one
/// node reports each address it is asked to probe as answered by the same foreign MAC (as a
/// real agent does, and keeps reporting it while it re-probes: `LanScript::answer_probes`). The first Service is pushed
/// at most `LAN_HOST_BOUND - 1` addresses; every later one keeps the first address it gets,
/// not announced, with a Warning `AddressConflict` saying that the host's answers renumber
/// nothing; every Service has an address and the pool is not walked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_lan_host_answering_every_probe_pushes_allocations_a_bounded_way() {
    use aliaslb_core::plan::LAN_HOST_BOUND;
    let _serial = serial().await;
    let c = Cluster::new("lan-walk").await;
    c.set_pool(&[(c.ns.as_str(), "10.85.0.1-10.85.0.40")]).await;
    let n1 = c.node("n1").await;
    let (_agent, script) = c.lan_agent(&n1, MAC1);
    {
        let mut script = script.lock().unwrap();
        script.hold = true;
        script.answer_probes = Some(FOREIGN.parse().unwrap());
    }
    c.wait_agent_leases(&[&n1]).await;
    let (_controller, _metrics) = c.start_controller();
    let services = 8;
    for i in 0..services {
        let name = format!("s{i}");
        c.create(lb_service(&name)).await;
        let message = c
            .wait_condition_where(
                &name,
                keys::CONDITION_ANNOUNCED,
                reason::ADDRESS_CONFLICT,
                |m| m.contains(FOREIGN) && m.contains("renumber no Service"),
            )
            .await;
        if i == 0 {
            eprintln!("s0: {message}");
        }
    }
    let answered: Vec<IpAddr> = script.lock().unwrap().conflicts.keys().copied().collect();
    eprintln!("answered for {} addresses: {answered:?}", answered.len());
    assert!(
        answered.len() < LAN_HOST_BOUND + services,
        "the host pushed the allocations through {} addresses: {answered:?}",
        answered.len()
    );
    let mut ips = std::collections::BTreeSet::new();
    for i in 0..services {
        let got = c.ips(&format!("s{i}")).await;
        assert_eq!(got.len(), 1, "s{i}: {got:?}");
        ips.insert(got[0].clone());
        let told = warnings(&c, &format!("s{i}"), reason::ADDRESS_CONFLICT)
            .await
            .iter()
            .filter(|n| n.contains("renumber no Service"))
            .count();
        assert_eq!(told, 1, "s{i} is told once");
    }
    assert_eq!(ips.len(), services, "one address each: {ips:?}");
    c.cleanup().await;
}
