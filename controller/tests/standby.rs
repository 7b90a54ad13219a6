//! Fast L2 failover's control side against the real kube-apiserver: the advert key Secret
//! is created once and kept; each L2 IP's holder line names a standby on the IP's LAN
//! (`peer=NODE@ADDRESS`), relayed by the third (`relay=`), and that standby's own assignment lists the IP as `standby=HOLDER`;
//! a hard loss of the holder moves the IP to its standby (which took it over on the LAN
//! already) and names a new standby. Agents are faked by renewing their Leases from the
//! test, reporting their LAN subnet and holding their held lines.

mod support;

use std::net::IpAddr;
use std::time::Duration;

use aliaslb_core::keys;
use aliaslb_core::report::{AgentReport, InterfaceReport, REPORT_VERSION};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use kube::api::DeleteParams;
use support::{Cluster, Task, assigned_ips, eventually, lb_service, read_assignment, serial};

/// A fake agent for `node` on the LAN 10.66.0.0/24 at `address`, holding its held lines.
fn lan_agent(c: &Cluster, node: &str, address: &str) -> Task {
    let assignments = Api::<ConfigMap>::namespaced(c.client.clone(), &c.system);
    let node_name = node.to_owned();
    let subnet: ipnet::IpNet = format!("{address}/24").parse().unwrap();
    let subnet = subnet.trunc();
    let own: IpAddr = address.parse().unwrap();
    c.agent_with(node, move || {
        let assignments = assignments.clone();
        let node_name = node_name.clone();
        async move {
            let held = assigned_ips(&assignments, &node_name).await;
            AgentReport {
                version: REPORT_VERSION,
                held,
                interfaces: vec![InterfaceReport {
                    name: "eth0".into(),
                    subnets: vec![subnet],
                    mac: None,
                    addresses: vec![own],
                }],
                ..AgentReport::default()
            }
            .to_json()
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_l2_ip_has_a_standby_on_its_lan_and_a_hard_loss_moves_it_there() {
    let _serial = serial().await;
    let c = Cluster::new("standby").await;
    c.set_pool(&[(c.ns.as_str(), "10.66.0.100-10.66.0.120")])
        .await;
    let nodes = [c.node("a").await, c.node("b").await, c.node("c").await];
    let address = |i: usize| format!("10.66.0.{}", 11 + i);
    let mut agents: Vec<Option<Task>> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| Some(lan_agent(&c, n, &address(i))))
        .collect();
    let key = Task(tokio::spawn(aliaslb_controller::advert_key::keep(
        c.client.clone(),
        c.system.clone(),
    )));
    let (_controller, _metrics) = c.start_controller();

    // The key: created once, 32 bytes, and not replaced.
    let secrets = Api::<Secret>::namespaced(c.client.clone(), &c.system);
    let mut first = None;
    eventually(
        Duration::from_secs(10),
        "the advert key Secret",
        async || {
            first = secrets.get_opt(keys::ADVERT_KEY_SECRET).await.unwrap();
            first.is_some()
        },
    )
    .await;
    let bytes = |s: &Secret| s.data.as_ref().unwrap()[keys::ADVERT_KEY_DATA].0.clone();
    let first = first.unwrap();
    assert_eq!(bytes(&first).len(), 32);
    drop(key);
    let again = Task(tokio::spawn(aliaslb_controller::advert_key::keep(
        c.client.clone(),
        c.system.clone(),
    )));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let kept = secrets.get(keys::ADVERT_KEY_SECRET).await.unwrap();
    assert_eq!(
        bytes(&kept),
        bytes(&first),
        "an existing key is never replaced"
    );
    drop(again);

    c.create(lb_service("web")).await;
    c.wait_condition("web", keys::CONDITION_ANNOUNCED, "Announced")
        .await;
    let ip: IpAddr = c.ips("web").await[0].parse().unwrap();
    let api = Api::<ConfigMap>::namespaced(c.client.clone(), &c.system);
    // (holder, standby, the standby's address on the holder's line)
    let mut roles = None;
    eventually(
        Duration::from_secs(10),
        "a holder line naming a standby",
        async || {
            for (i, node) in nodes.iter().enumerate() {
                let Some(a) = read_assignment(&api, node).await else {
                    continue;
                };
                if let Some(peer) = a.ips.get(&ip).and_then(|l| l.peer.clone()) {
                    roles = Some((i, peer.node, peer.address));
                    return true;
                }
            }
            false
        },
    )
    .await;
    let (holder, standby, peer_address) = roles.unwrap();
    let s = nodes
        .iter()
        .position(|n| *n == standby)
        .expect("a node of ours");
    assert_ne!(s, holder);
    assert_eq!(peer_address.to_string(), address(s));
    eventually(
        Duration::from_secs(10),
        "the standby's own line",
        async || {
            read_assignment(&api, &nodes[s])
                .await
                .and_then(|a| a.ips.get(&ip).cloned())
                .is_some_and(|l| {
                    l.standby_for.as_deref() == Some(nodes[holder].as_str()) && !l.held()
                })
        },
    )
    .await;
    let third = 3 - holder - s;
    let relay = read_assignment(&api, &nodes[holder])
        .await
        .and_then(|a| a.ips.get(&ip).and_then(|l| l.relay.clone()))
        .expect("the third node relays the adverts");
    assert_eq!(relay.node, nodes[third]);
    assert_eq!(relay.address.to_string(), address(third));
    assert!(
        read_assignment(&api, &nodes[third])
            .await
            .is_none_or(|a| !a.ips.contains_key(&ip)),
        "the third node has no line for the IP"
    );

    // Hard loss of the holder: the standby becomes the holder, the third node the standby.
    agents[holder] = None;
    eventually(
        Duration::from_secs(15),
        "the standby holds the IP, the third stands by",
        async || {
            let on_standby = read_assignment(&api, &nodes[s])
                .await
                .and_then(|a| a.ips.get(&ip).cloned());
            let on_third = read_assignment(&api, &nodes[third])
                .await
                .and_then(|a| a.ips.get(&ip).cloned());
            on_standby.is_some_and(|l| {
                l.held() && l.peer.as_ref().is_some_and(|p| p.node == nodes[third])
            }) && on_third.is_some_and(|l| l.standby_for.as_deref() == Some(nodes[s].as_str()))
        },
    )
    .await;
    drop(agents);
    secrets
        .delete(keys::ADVERT_KEY_SECRET, &DeleteParams::default())
        .await
        .unwrap();
    c.cleanup().await;
}
