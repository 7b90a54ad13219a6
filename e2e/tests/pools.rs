//! Two pools in one namespace over the lab, with the real binaries: an L2 pool (the
//! namespace's own key, on the LAN) and a BGP pool (`pool.routed`, on no LAN, real BIRD 2 on
//! the nodes and a real FRR router, `scripts/lab bgp-up`), one Service on each, chosen with
//! `aliaslb.io/pool`:
//!
//! - the L2 one is announced by one node and answers the client on the LAN;
//! - the routed one is in the router's FIB with one next hop per node and answers the
//!   client behind the router;
//! - a tenant with `edit` in the namespace names a pool of another namespace: refused
//!   (`PoolNotAllowed`), and that pool's address is on no node.
//!
//! One lab for the binary, so one test function running the phases in order. Needs root:
//!
//! ```sh
//! cargo build --workspace --bins && cargo test -p aliaslb-e2e --test pools -- --nocapture
//! ```

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, Instant};

use aliaslb_e2e::bgp::{BgpLab, NodeDaemon};
use aliaslb_e2e::fixtures::{lb_service, namespace};
use aliaslb_e2e::lab::{Lab, NODES, node_name, wait_for};
use aliaslb_e2e::{Error, aliases, client};

const NS: &str = "e2e-pools";
const OTHER: &str = "e2e-pools-other";
/// The namespace's own key: on the LAN.
const LAN_IP: &str = "192.168.55.47";
/// `pool.routed`: on no LAN, announced over BGP.
const ROUTED: &str = "10.200.0.30-10.200.0.31";
/// `pool.other`: another namespace's.
const OTHER_IP: &str = "192.168.55.48";
const ANNOUNCE_TIMEOUT: Duration = Duration::from_secs(30);
/// The tenant, as kubectl impersonates it.
const TENANT: &str = "--as=system:serviceaccount:e2e-pools:tenant";

#[test]
fn an_l2_pool_and_a_bgp_pool_in_one_namespace_both_answer() -> Result<(), Error> {
    let Some(lab) = Lab::up()? else {
        return Ok(());
    };
    lab.apply(&namespace(NS))?;
    lab.apply(&namespace(OTHER))?;
    let options = format!(
        "pools:\n  pool.routed:\n    namespaces: [{NS}]\n    announce: bgp\n  pool.other:\n    namespaces: [{OTHER}]\n"
    );
    let patch = serde_json::json!({"data": {
        NS: LAN_IP,
        "pool.routed": ROUTED,
        "pool.other": OTHER_IP,
        "config.yaml": options,
    }})
    .to_string();
    lab.patch_pools(&patch)?;
    let bgp = BgpLab::up(&lab, NodeDaemon::Bird)?;
    bgp.restart_agents()?;

    let created = Instant::now();
    lab.apply(&lb_service(NS, "lan").to_yaml())?;
    lab.apply(&lb_service(NS, "routed").pool("routed").to_yaml())?;

    // L2: one node holds the alias, the client on the LAN is answered through it.
    let (ip, holder) = lab.wait_announced(NS, "lan", ANNOUNCE_TIMEOUT)?;
    assert_eq!(ip.to_string(), LAN_IP);
    let answer = wait_for("the L2 Service to answer", ANNOUNCE_TIMEOUT, || {
        client::get(ip)
    })?;
    println!(
        "[e2e] {NS}/lan {ip} (L2, its namespace's own key) on {}: answered by {} {:.0} ms after creation",
        node_name(holder),
        answer.pod,
        created.elapsed().as_secs_f64() * 1e3
    );

    // BGP: every node announces, the router has one path per node, the client behind it is
    // answered.
    let vip = wait_for("the routed Service's address", ANNOUNCE_TIMEOUT, || {
        let view = lab.service(NS, "routed")?;
        Ok(match view.ips.as_slice() {
            [ip] => Ok(IpAddr::V4(*ip)),
            _ => Err(view.summary()),
        })
    })?;
    assert_eq!(vip, IpAddr::V4(Ipv4Addr::new(10, 200, 0, 30)));
    let all: BTreeSet<u8> = NODES.into_iter().collect();
    bgp.wait_next_hops(&vip.to_string(), &all, ANNOUNCE_TIMEOUT)?;
    bgp.settled(vip, &all)?;
    let answers = bgp.client_answers(vip, 80, 30)?;
    let failed: Vec<&String> = answers.iter().filter_map(|a| a.as_ref().err()).collect();
    println!(
        "[e2e] {NS}/routed {vip} (BGP, pool.routed): 3 next hops at the router, {} of 30 connections from behind it answered, {:.0} ms after creation",
        answers.len() - failed.len(),
        created.elapsed().as_secs_f64() * 1e3
    );
    assert!(failed.is_empty(), "{failed:?}");
    // Each on its own kind of announcement: the L2 address is on no routed device, the
    // routed one on no node's LAN alias list as an L2 holder would have it.
    let view = lab.service(NS, "routed")?;
    let node_annotation = view.node.unwrap_or_default();
    assert_eq!(
        node_annotation.split(',').count(),
        3,
        "every node announces the routed address: {node_annotation}"
    );

    // The tenant fence: a tenant with `edit` here names another namespace's pool.
    lab.apply(&format!(
        "apiVersion: v1
kind: ServiceAccount
metadata: {{name: tenant, namespace: {NS}}}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {{name: tenant-edit, namespace: {NS}}}
roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: edit}}
subjects: [{{kind: ServiceAccount, name: tenant, namespace: {NS}}}]
"
    ))?;
    let sneaky = lb_service(NS, "sneaky").pool("other").to_yaml();
    let service = sneaky.split("---").next().expect("the Service document");
    let file = std::env::temp_dir().join("aliaslb-e2e-pools-sneaky.yaml");
    std::fs::write(&file, service).map_err(|source| Error::Spawn {
        cmd: format!("write {}", file.display()),
        source,
    })?;
    let file = file.display().to_string();
    // RBAC settles within a second or so of the RoleBinding.
    wait_for(
        "the tenant's Service to be created",
        Duration::from_secs(10),
        || {
            Ok(lab
                .kubectl(&[TENANT, "apply", "-f", &file])
                .map_err(|e| format!("{e:?}")))
        },
    )?;
    let message = wait_for("PoolNotAllowed", ANNOUNCE_TIMEOUT, || {
        let view = lab.service(NS, "sneaky")?;
        Ok(match view.conditions.get("aliaslb.io/IPAllocated") {
            Some(c) if c.reason == "PoolNotAllowed" => Ok(c.message.clone()),
            _ => Err(view.summary()),
        })
    })?;
    assert_eq!(
        message,
        format!(
            "namespace {NS} may not draw from pool pool.other; namespace {NS} may draw from {NS}, pool.routed"
        )
    );
    assert!(lab.service(NS, "sneaky")?.ips.is_empty());
    let other: Ipv4Addr = OTHER_IP.parse().expect("an address");
    for n in NODES {
        assert!(!aliases(n)?.contains(&other), "{other} on {}", node_name(n));
    }
    println!("[e2e] a tenant naming another namespace's pool: {message}");
    Ok(())
}
