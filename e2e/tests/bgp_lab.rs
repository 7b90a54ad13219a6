//! The BGP lab itself, without aliaslb doing anything for it (the agents and the controller
//! run, as in every e2e test, but no Service of theirs is involved): an address put by hand
//! on `lo` of the three nodes is exported by each node's routing daemon and the router has an
//! ECMP route over the three; connections from the client behind the router reach the pods
//! through every node (kube-proxy, a Service with the address as external IP); removing the
//! address on one node, stopping a node's daemon and taking a node's link down each take
//! that node out of the route. Once with BIRD 2 and once with FRR on the nodes. Needs root:
//!
//! ```sh
//! cargo build -p aliaslb-agent -p aliaslb-controller --bins
//! KUBEBUILDER_ASSETS=$(bash scripts/kube-env) cargo test -p aliaslb-e2e --test bgp_lab -- --nocapture
//! ```

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use aliaslb_e2e::Error;
use aliaslb_e2e::bgp::{BgpLab, NodeDaemon};
use aliaslb_e2e::lab::{Lab, NODES, node_name, run, wait_for};

const NS: &str = "e2e-bgp-lab";
/// In `BGP_POOL4` of scripts/lab, so the nodes export it.
const VIP: &str = "10.200.0.240";
/// In `BGP_POOL6`.
const VIP6: &str = "fd00:200::240";
/// Routes move within a second in the lab (BFD 300 ms x 3 is the slowest path); 15 s leaves
/// room for a loaded machine and still fails a daemon that waits for its hold timer twice.
const CONVERGE: Duration = Duration::from_secs(15);
const CONNECTIONS: usize = 60;

#[test]
fn bgp_lab_routes_over_the_nodes() -> Result<(), Error> {
    let Some(lab) = Lab::up()? else {
        return Ok(());
    };
    lab.apply(&service_yaml())?;
    // Each node must forward to the pods before the address counts as reachable there.
    for n in NODES {
        wait_for(
            &format!("kube-proxy's rule for {VIP} on {}", node_name(n)),
            Duration::from_secs(30),
            || {
                let rules = lab.exec(
                    &format!("node-{n}"),
                    &["iptables", "-w", "-t", "nat", "-S", "KUBE-SERVICES"],
                )?;
                Ok(if rules.contains(&format!("-d {VIP}/32")) {
                    Ok(())
                } else {
                    Err("no rule yet".to_owned())
                })
            },
        )?;
    }
    for daemon in [NodeDaemon::Bird, NodeDaemon::Frr] {
        let bgp = BgpLab::up(&lab, daemon)?;
        routes_follow_the_nodes(&bgp)?;
    }
    Ok(())
}

/// A Service kube-proxy forwards for `VIP` (as external IP: the aliaslb controller leaves a
/// ClusterIP Service alone), with Endpoints on the two pods.
fn service_yaml() -> String {
    format!(
        "apiVersion: v1
kind: Namespace
metadata:
  name: {NS}
---
apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: {NS}
spec:
  externalIPs: [{VIP}]
  ports:
  - name: http
    port: 80
    targetPort: 8080
---
apiVersion: v1
kind: Endpoints
metadata:
  name: web
  namespace: {NS}
subsets:
- addresses:
  - ip: 10.244.1.10
    nodeName: alb-node-1
  - ip: 10.244.2.10
    nodeName: alb-node-2
  ports:
  - name: http
    port: 8080
"
    )
}

fn nodes(ns: &[u8]) -> BTreeSet<u8> {
    ns.iter().copied().collect()
}

/// `ip addr add|del IP/LEN dev lo` on node `n` (directly, so timings start at the change).
fn addr(op: &str, n: u8, ip: &str, len: u8) -> Result<(), Error> {
    run(Command::new("ip").args([
        "-n",
        &node_name(n),
        "addr",
        op,
        &format!("{ip}/{len}"),
        "dev",
        "lo",
    ]))
    .map(drop)
}

fn secs(t: Instant) -> f64 {
    t.elapsed().as_secs_f64()
}

fn routes_follow_the_nodes(bgp: &BgpLab<'_>) -> Result<(), Error> {
    let name = bgp.daemon().name();
    let all = nodes(&NODES);
    let t = Instant::now();
    for n in NODES {
        addr("add", n, VIP, 32)?;
    }
    bgp.wait_next_hops(VIP, &all, CONVERGE)?;
    let v4 = secs(t);
    let t = Instant::now();
    for n in NODES {
        addr("add", n, VIP6, 128)?;
    }
    bgp.wait_next_hops(VIP6, &all, CONVERGE)?;
    println!(
        "[e2e] {name}: {VIP} on lo of every node -> 3 next hops {v4:.2} s after the first ip addr add ({VIP6}: {:.2} s)",
        secs(t)
    );

    let vip: IpAddr = VIP.parse().expect("a literal address");
    let spread = bgp.client_spread(vip, 80, CONNECTIONS)?;
    println!("[e2e] {name}: {CONNECTIONS} connections from the BGP client: {spread:?}");
    assert_eq!(spread.failed, 0, "connections failed: {spread:?}");
    assert!(
        spread.unattributed.is_empty(),
        "answers from no node: {spread:?}"
    );
    assert_eq!(spread.nodes(), all, "not every node forwarded: {spread:?}");

    let t = Instant::now();
    addr("del", 3, VIP, 32)?;
    bgp.wait_next_hops(VIP, &nodes(&[1, 2]), CONVERGE)?;
    println!(
        "[e2e] {name}: {VIP} removed on node 3 -> 2 next hops after {:.2} s",
        secs(t)
    );
    // The other family's route is not disturbed.
    assert_eq!(bgp.router_next_hops(VIP6)?.len(), 3, "{VIP6} lost a path");

    let t = Instant::now();
    bgp.stop_daemon(1)?;
    bgp.wait_next_hops(VIP, &nodes(&[2]), CONVERGE)?;
    println!(
        "[e2e] {name}: node 1's daemon stopped -> 1 next hop after {:.2} s",
        secs(t)
    );
    let t = Instant::now();
    bgp.start_daemon(1)?;
    bgp.wait_next_hops(VIP, &nodes(&[1, 2]), CONVERGE)?;
    println!(
        "[e2e] {name}: node 1's daemon started -> 2 next hops after {:.2} s",
        secs(t)
    );

    let t = Instant::now();
    bgp.link_down(2)?;
    let down = bgp
        .wait_next_hops(VIP, &nodes(&[1]), CONVERGE)
        .map(|_| secs(t));
    // Up again before the verdict, so that a failure leaves the lab whole.
    bgp.link_up(2)?;
    println!(
        "[e2e] {name}: node 2's eth0 down -> 1 next hop after {:.2} s (BFD)",
        down?
    );
    let t = Instant::now();
    bgp.wait_next_hops(VIP, &nodes(&[1, 2]), CONVERGE)?;
    println!(
        "[e2e] {name}: node 2's eth0 up -> 2 next hops after {:.2} s",
        secs(t)
    );

    let t = Instant::now();
    for n in [1, 2] {
        addr("del", n, VIP, 32)?;
    }
    bgp.wait_next_hops(VIP, &BTreeSet::new(), CONVERGE)?;
    println!(
        "[e2e] {name}: {VIP} removed -> route withdrawn after {:.2} s",
        secs(t)
    );
    for n in NODES {
        addr("del", n, VIP6, 128)?;
    }
    bgp.wait_next_hops(VIP6, &BTreeSet::new(), CONVERGE)?;
    Ok(())
}
