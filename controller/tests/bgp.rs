//! L3 mode (`announce: bgp`) against the real kube-apiserver (1.37; 1.30 too), with fake agents that
//! report their routing daemon:
//!
//! - every eligible node gets the Service's IP as a `bgp` line (never `probe`), the
//!   Service's `aliaslb.io/node` lists them all, and Announced says "announced over BGP by
//!   3 nodes ... to 3 peers" once their daemons export it;
//! - a daemon that cannot be read, or has no Established session, turns it into
//!   `PartiallyAnnounced` naming the node and why, shown as `partially-announced` in
//!   `aliaslb status`; all of them down: `NotAnnounced`;
//! - a cordoned node's path is withdrawn (its line removed) while the others stay; a node
//!   whose agent stops renewing (hard loss) is dropped within the lease duration.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use aliaslb_core::keys;
use aliaslb_core::plan::reason;
use aliaslb_core::report::RoutingReport;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use support::{AGENT_LEASE, Cluster, annotation, eventually, lb_service, serial};

use support::SETTLE;

fn bird(established: u32) -> Arc<Mutex<Option<RoutingReport>>> {
    Arc::new(Mutex::new(Some(RoutingReport {
        daemon: "bird".into(),
        error: None,
        sessions: 1,
        established,
        exported: Default::default(),
    })))
}

async fn announced(c: &Cluster, name: &str, reason: &str) -> String {
    c.wait_condition(name, keys::CONDITION_ANNOUNCED, reason)
        .await
}

/// Like [`announced`], until the message is one `want` accepts. A change read from
/// several agents (each renews on its own), or one that keeps the reason, reaches the
/// condition over several passes: waiting for the reason alone may return an older
/// message.
async fn announced_as(
    c: &Cluster,
    name: &str,
    reason: &str,
    want: impl Fn(&str) -> bool,
) -> String {
    c.wait_condition_where(name, keys::CONDITION_ANNOUNCED, reason, want)
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_node_announces_and_announced_reads_the_daemons() {
    let _serial = serial().await;
    let c = Cluster::new("bgp").await;
    c.set_pool(&[
        (c.ns.as_str(), "10.200.0.1-10.200.0.3"),
        (
            "config.yaml",
            &format!("pools:\n  {}:\n    announce: bgp\n", c.ns),
        ),
    ])
    .await;
    let nodes = [c.node("n1").await, c.node("n2").await, c.node("n3").await];
    let daemons = [bird(1), bird(1), bird(1)];
    let mut agents: Vec<Option<support::Task>> = nodes
        .iter()
        .zip(&daemons)
        .map(|(n, d)| Some(c.bgp_agent(n, d.clone())))
        .collect();
    let (_controller, _metrics) = c.start_controller();

    c.create(lb_service("front").port(443)).await;
    c.wait_ips("front", &["10.200.0.1"], SETTLE).await;
    for node in &nodes {
        eventually(SETTLE, &format!("{node} has a bgp line"), async || {
            c.assignment_line(node, "10.200.0.1").await.as_deref()
                == Some(&format!("10.200.0.1 - tcp:443 {}/front bgp", c.ns)[..])
        })
        .await;
    }
    let all = format!(
        "announced over BGP by 3 nodes ({}, {}, {}) to 3 peers",
        nodes[0], nodes[1], nodes[2]
    );
    announced_as(&c, "front", reason::ANNOUNCED, |m| m == all).await;
    let svc = c.get("front").await;
    assert_eq!(
        annotation(&svc, keys::ANNOTATION_NODE),
        Some(nodes.join(",").as_str())
    );

    // n3's daemon cannot be read, n2's session is down: partially announced.
    daemons[2].lock().unwrap().as_mut().unwrap().error =
        Some("cannot reach BIRD's control socket /run/bird/bird.ctl".into());
    daemons[1].lock().unwrap().as_mut().unwrap().established = 0;
    // Two agents report the two changes, each at its own renewal.
    let one = format!(
        "announced over BGP by 1 of 3 nodes ({}) to 1 peer; not announcing:",
        nodes[0]
    );
    let message = announced_as(&c, "front", reason::PARTIALLY_ANNOUNCED, |m| {
        m.starts_with(&one)
    })
    .await;
    assert!(
        message.contains(&format!(
            "{}: bird has no Established BGP session (1 configured)",
            nodes[1]
        )),
        "{message}"
    );
    assert!(
        message.contains(&format!(
            "{}: bird cannot be read: cannot reach BIRD's control socket",
            nodes[2]
        )),
        "{message}"
    );
    let table = c.status_table();
    assert!(
        table.contains("partially-announced") && table.contains(&nodes.join(",")),
        "{table}"
    );
    daemons[0].lock().unwrap().as_mut().unwrap().established = 0;
    announced(&c, "front", reason::NOT_ANNOUNCED).await;
    for d in &daemons {
        let mut d = d.lock().unwrap();
        let d = d.as_mut().unwrap();
        d.error = None;
        d.established = 1;
    }
    announced_as(&c, "front", reason::ANNOUNCED, |m| m == all).await;

    // Cordoned: n1's path is withdrawn at once, the others keep theirs.
    Api::<Node>::all(c.client.clone())
        .patch(
            &nodes[0],
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": true}})),
        )
        .await
        .unwrap();
    eventually(SETTLE, "n1's line removed", async || {
        c.assignment_line(&nodes[0], "10.200.0.1").await.is_none()
    })
    .await;
    for node in &nodes[1..] {
        assert!(c.assignment_line(node, "10.200.0.1").await.is_some());
    }
    announced_as(&c, "front", reason::ANNOUNCED, |m| m.contains("by 2 nodes")).await;

    // n2's agent stops renewing: dropped within the lease (plus the controller's pass).
    agents[1] = None;
    let lost = std::time::Instant::now();
    eventually(AGENT_LEASE + SETTLE, "n2's line removed", async || {
        c.assignment_line(&nodes[1], "10.200.0.1").await.is_none()
    })
    .await;
    let took = lost.elapsed();
    assert!(took < AGENT_LEASE + Duration::from_secs(3), "{took:?}");
    let last = format!("announced over BGP by 1 node ({}) to 1 peer", nodes[2]);
    announced_as(&c, "front", reason::ANNOUNCED, |m| m == last).await;
    drop(agents);
    c.cleanup().await;
}
