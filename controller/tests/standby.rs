//! Fast L2 failover's control side against the real kube-apiserver: the shared advert key
//! Secret of earlier releases is deleted; each L2 IP's holder line names a standby on the
//! IP's LAN (`peer=NODE@ADDRESS`), relayed by the third (`relay=`), and that standby's own
//! assignment lists the IP as `standby=HOLDER`; each of the three lists the others it
//! exchanges adverts with among its peers, with the key that node's own report gives (and
//! the relay, where it forwards the holder's adverts); a node on another LAN is nobody's
//! peer; a hard loss of the holder moves the IP to its standby (which took it over on the
//! LAN already) and names a new standby. Agents are faked by renewing their Leases from
//! the test, reporting their LAN subnet, a key of their own, and holding their held lines.

mod support;

use std::net::IpAddr;
use std::time::Duration;

use aliaslb_core::advert::{PublicKey, SigningKey};
use aliaslb_core::keys;
use aliaslb_core::mac::Mac;
use aliaslb_core::report::{AgentReport, InterfaceReport, REPORT_VERSION};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use kube::api::PostParams;
use support::{Cluster, Task, assigned_ips, eventually, lb_service, read_assignment, serial};

/// A fake agent for `node` on the LAN of `address` (a /24), reporting `key` and a MAC made
/// of the address's last byte, holding its held lines.
fn lan_agent(c: &Cluster, node: &str, address: &str, key: PublicKey) -> Task {
    let assignments = Api::<ConfigMap>::namespaced(c.client.clone(), &c.system);
    let node_name = node.to_owned();
    let subnet: ipnet::IpNet = format!("{address}/24").parse().unwrap();
    let subnet = subnet.trunc();
    let own: IpAddr = address.parse().unwrap();
    let mac = mac_of(address);
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
                    mac: Some(mac),
                    addresses: vec![own],
                }],
                key: Some(key),
                ..AgentReport::default()
            }
            .to_json()
        }
    })
}

/// The MAC of the fake agent at `address`: 02:00:00:00:00:<last byte>.
fn mac_of(address: &str) -> Mac {
    let last: u8 = address.rsplit('.').next().unwrap().parse().unwrap();
    Mac([2, 0, 0, 0, 0, last])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_l2_ip_has_a_standby_on_its_lan_and_a_hard_loss_moves_it_there() {
    let _serial = serial().await;
    let c = Cluster::new("standby").await;
    c.set_pool(&[(c.ns.as_str(), "10.66.0.100-10.66.0.120")])
        .await;
    let nodes = [c.node("a").await, c.node("b").await, c.node("c").await];
    let address = |i: usize| format!("10.66.0.{}", 11 + i);
    let node_keys: Vec<PublicKey> = (0..3)
        .map(|_| SigningKey::generate().unwrap().public_key())
        .collect();
    let mut agents: Vec<Option<Task>> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| Some(lan_agent(&c, n, &address(i), node_keys[i])))
        .collect();
    // A fourth node on another LAN: a peer of nobody here.
    let far = c.node("far").await;
    let far_key = SigningKey::generate().unwrap().public_key();
    let _far_agent = lan_agent(&c, &far, "10.67.0.11", far_key);
    // The shared key of earlier releases, left by an upgrade: deleted.
    let secrets = Api::<Secret>::namespaced(c.client.clone(), &c.system);
    let mut legacy = Secret::default();
    legacy.metadata.name = Some(keys::LEGACY_ADVERT_KEY_SECRET.to_owned());
    secrets
        .create(&PostParams::default(), &legacy)
        .await
        .unwrap();
    let cleanup = Task(tokio::spawn(aliaslb_controller::legacy_key::delete(
        c.client.clone(),
        c.system.clone(),
    )));
    let (_controller, _metrics) = c.start_controller();
    eventually(
        Duration::from_secs(10),
        "the shared key of earlier releases deleted",
        async || {
            secrets
                .get_opt(keys::LEGACY_ADVERT_KEY_SECRET)
                .await
                .unwrap()
                .is_none()
        },
    )
    .await;
    drop(cleanup);

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
    // Peers, each with the key its own agent reported.
    let peers_of = async |i: usize| {
        read_assignment(&api, &nodes[i])
            .await
            .map(|a| a.peers)
            .unwrap_or_default()
    };
    let mut listed = None;
    eventually(
        Duration::from_secs(10),
        "the three list each other as peers",
        async || {
            let all = [
                peers_of(holder).await,
                peers_of(s).await,
                peers_of(third).await,
            ];
            let ok = all[0].contains_key(&nodes[s])
                && all[0].contains_key(&nodes[third])
                && all[1].contains_key(&nodes[holder])
                && all[2].contains_key(&nodes[holder]);
            listed = Some(all);
            ok
        },
    )
    .await;
    let [on_holder, on_standby, on_third] = listed.unwrap();
    assert_eq!(on_holder[&nodes[s]].key, Some(node_keys[s]));
    assert_eq!(
        on_holder[&nodes[s]].macs,
        [mac_of(&address(s))].into(),
        "with the MACs its own report gives"
    );
    assert_eq!(on_holder[&nodes[third]].key, Some(node_keys[third]));
    assert_eq!(on_standby[&nodes[holder]].key, Some(node_keys[holder]));
    assert_eq!(on_third[&nodes[holder]].key, Some(node_keys[holder]));
    let forwards: Vec<String> = on_third[&nodes[holder]]
        .relay_to
        .iter()
        .map(|p| p.to_string())
        .collect();
    assert_eq!(forwards, vec![format!("{}@{}", nodes[s], address(s))]);
    assert!(on_holder[&nodes[s]].relay_to.is_empty());
    for peers in [&on_holder, &on_standby, &on_third] {
        assert!(
            !peers.contains_key(&far),
            "a node on another LAN is nobody's peer"
        );
        assert!(peers.values().all(|p| p.key != Some(far_key)));
    }
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
    c.cleanup().await;
}
