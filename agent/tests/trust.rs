//! Fast failover, trusted (issue 41), against the real `aliaslb-agent` binary in a network
//! namespace, the real kernel and the real kube-apiserver. The test plays the other nodes:
//! it writes the agent's assignment (as the controller would) naming a peer `evil` whose
//! signing key the test holds, and it sends datagrams from the LAN namespace. `evil` is a
//! compromised node: it signs validly, as itself, and lies.
//!
//! - item 1: a flood of signed adverts, from made-up senders and from a named holder
//!   listing IPs that are not its lines, leaves the agent's memory flat;
//! - item 3: a standby that stops acking, cannot be reached on the LAN and claims the IP in
//!   its own Lease keeps its holder down for the check's second only (no relay is named:
//!   only the LAN's word counts).
//!
//! Needs root.

mod agent_support;
mod support;

use std::net::{IpAddr, UdpSocket};
use std::time::{Duration, Instant};

use agent_support::{Agent, eventually, setup};
use aliaslb_core::advert::{Ack, Advert, SigningKey};
use aliaslb_core::keys;
use aliaslb_core::report::AgentReport;
use aliaslb_testenv::TestEnv;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use support::{NetNs, require_root};

/// A UDP socket in the LAN namespace, sending to the agent's advert port at 10.0.0.2.
fn lan_socket(lan: &NetNs) -> UdpSocket {
    lan.run_sync(|| {
        let s = UdpSocket::bind("10.0.0.1:0").unwrap();
        s.connect(("10.0.0.2", keys::DEFAULT_ADVERT_PORT)).unwrap();
        s
    })
}

/// The agent's resident memory, in KiB.
fn rss_kib(agent: &Agent) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{}/status", agent.pid())).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

fn ipv6(n: u32) -> IpAddr {
    IpAddr::V6(std::net::Ipv6Addr::new(
        0x2001,
        0xdb8,
        0xf00d,
        0,
        0,
        0,
        (n >> 16) as u16,
        n as u16,
    ))
}

/// Item 1. Before per-node keys, 20,000 datagrams signed with the shared key from made-up
/// senders grew an agent by 173 MiB (lab, 64 IPv6 addresses each).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_signed_adverts_leaves_the_agents_memory_flat() {
    if !require_root() {
        return;
    }
    let s = setup("flood", |_| {}).await;
    let evil = SigningKey::generate().unwrap();
    // The agent stands by for evil's 10.0.0.150: evil is a named holder.
    let ips = "10.0.0.150 - tcp:80 default/web standby=evil\n";
    let peers = format!("evil {} 02:00:00:00:0e:01\n", evil.public_key());
    s.cluster
        .set_assignment_data(
            &s.name,
            &[(keys::ASSIGNMENTS_KEY, ips), (keys::PEERS_KEY, &peers)],
        )
        .await;
    let socket = lan_socket(&s.lan);
    // Believed: an advert from evil is accepted once the assignment is read.
    let mut counter = 0u64;
    let send = |key: &SigningKey, from: &str, ips: Vec<IpAddr>, counter: u64| {
        let advert = Advert {
            from: from.into(),
            to: s.name.clone(),
            counter,
            ips,
        };
        let _ = socket.send(&advert.encode(key));
    };
    let metric = |result: &str| {
        s.agent
            .metric(
                &s.node,
                &format!("aliaslb_agent_adverts_received_total{{result=\"{result}\"}}"),
            )
            .unwrap_or(0.0)
    };
    eventually(
        Duration::from_secs(10),
        "evil's advert accepted",
        async || {
            counter += 1;
            send(&evil, "evil", vec!["10.0.0.150".parse().unwrap()], counter);
            tokio::time::sleep(Duration::from_millis(100)).await;
            (metric("accepted") >= 1.0).then_some(())
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = rss_kib(&s.agent);
    // 10,000 from made-up senders (each its own key: they have none the agent knows) and
    // 10,000 from evil, each listing 64 IPv6 addresses that are nobody's line.
    let stranger = SigningKey::generate().unwrap();
    let started = Instant::now();
    for n in 0..10_000u32 {
        let foreign: Vec<IpAddr> = (0..64).map(|k| ipv6(n * 64 + k)).collect();
        send(&stranger, &format!("made-up-{n}"), foreign.clone(), 1);
        counter += 1;
        send(&evil, "evil", foreign, counter);
        if n % 500 == 0 {
            // Paced a little, so that the socket's queue takes most of them.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let sent_in = started.elapsed();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = rss_kib(&s.agent);
    let (unknown, accepted) = (metric("unknown_sender"), metric("accepted"));
    println!(
        "20,000 datagrams in {sent_in:?}: agent RSS {before} KiB -> {after} KiB ({:+} KiB); \
         dropped as unknown senders {unknown}, accepted from the named holder {accepted}",
        after as i64 - before as i64
    );
    assert!(
        unknown >= 5_000.0,
        "most made-up senders dropped unverified: {unknown}"
    );
    assert!(
        accepted >= 5_000.0,
        "most of evil's adverts accepted: {accepted}"
    );
    assert!(
        after <= before + 2 * 1024,
        "the agent grew from {before} KiB to {after} KiB"
    );
    // The one line of evil's is still armed (its IP is what evil lists): nothing else is.
    let _ = &s.namespace;
}

/// Item 3. The agent holds 10.0.0.151 with `evil` as its standby and no relay. evil acks,
/// then stops, cannot be reached on the LAN (its address 10.0.0.77 answers nothing: it
/// drops the holder's probes) and says in its own Lease that it holds the IP, without
/// answering for it: the agent steps down and takes the IP back within the check's second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_that_lies_in_its_lease_keeps_its_holder_down_for_a_second_only() {
    if !require_root() {
        return;
    }
    let s = setup("liar", |_| {}).await;
    let evil = SigningKey::generate().unwrap();
    let ips = "10.0.0.151 - tcp:80 default/web peer=evil@10.0.0.77\n";
    let peers = format!("evil {} 02:00:00:00:0e:01\n", evil.public_key());
    s.cluster
        .set_assignment_data(
            &s.name,
            &[(keys::ASSIGNMENTS_KEY, ips), (keys::PEERS_KEY, &peers)],
        )
        .await;
    eventually(Duration::from_secs(10), "the alias", async || {
        s.node.addr("eth1", "10.0.0.151")
    })
    .await;
    // evil's Lease says it holds the IP, renewed all along.
    let leases = Api::<Lease>::namespaced(TestEnv::global().client().await, &s.namespace);
    let report = AgentReport {
        held: ["10.0.0.151".parse().unwrap()].into(),
        key: Some(evil.public_key()),
        ..AgentReport::default()
    };
    let write_lease = async || {
        let lease = json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {
                "name": keys::agent_lease_name("evil"),
                "annotations": {keys::ANNOTATION_AGENT_REPORT: report.to_json()},
            },
            "spec": {
                "holderIdentity": "evil",
                "leaseDurationSeconds": 30,
                "renewTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
                    k8s_openapi::jiff::Timestamp::now()
                ),
            },
        });
        leases
            .patch(
                &keys::agent_lease_name("evil"),
                &PatchParams::apply("evil").force(),
                &Patch::Apply(&lease),
            )
            .await
            .unwrap();
    };
    write_lease().await;
    // evil acks for a second (arming the holder's step-down), then falls silent.
    let socket = lan_socket(&s.lan);
    for counter in 1..=10u64 {
        let ack = Ack {
            from: "evil".into(),
            to: s.name.clone(),
            counter,
        };
        socket.send(&ack.encode(&evil)).unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let silent = Instant::now();
    let down = eventually(Duration::from_secs(5), "the step-down", async || {
        write_lease().await;
        s.node
            .addr("eth1", "10.0.0.151")
            .is_none()
            .then(Instant::now)
    })
    .await;
    let back = eventually(Duration::from_secs(5), "the IP taken back", async || {
        s.node.addr("eth1", "10.0.0.151").map(|_| Instant::now())
    })
    .await;
    let dark = back - down;
    println!(
        "stepped down {:?} after evil's last ack, held again {dark:?} later",
        down - silent
    );
    assert!(
        dark <= Duration::from_millis(1_500),
        "held again {dark:?} after the step-down (bound 1.5 s)"
    );
    // And it stays: the standby must ack again before it can be stepped down again.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(s.node.addr("eth1", "10.0.0.151").is_some(), "kept");
    let retaken = s
        .agent
        .metric(&s.node, "aliaslb_agent_failovers_total{result=\"retaken\"}")
        .unwrap_or(0.0);
    assert_eq!(retaken, 1.0);
}
