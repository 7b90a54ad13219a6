//! A tenant cannot steer an IP, over the lab with the real controller and agents.
//!
//! A ServiceAccount with the built-in `edit` ClusterRole in its own namespace (what most
//! teams get) writes `aliaslb.io/node` and `aliaslb.io/interface` on its own Service:
//! while the Service is assigned, and while a cordon moves it. The alias stays where the
//! controller put it (on the node's `eth0`, never on the pod bridge `cni0`, never on the
//! node the tenant names), as sampled from every node's kernel, and the controller takes
//! the annotations back. One lab for the binary, so one test function running the phases in
//! order. Needs root:
//!
//! ```sh
//! cargo build --workspace --bins && cargo test -p aliaslb-e2e --test tenant -- --nocapture
//! ```

use std::net::Ipv4Addr;
use std::process::Command;
use std::time::{Duration, Instant};

use aliaslb_e2e::fixtures::{lb_service, namespace};
use aliaslb_e2e::lab::{Lab, NODES, node_name, run, wait_for};
use aliaslb_e2e::{Error, aliases};
use serde_json::Value;

const NS: &str = "e2e-tenant";
const POOL: [&str; 1] = ["192.168.55.45"];
const ANNOUNCE_TIMEOUT: Duration = Duration::from_secs(20);
/// How long each tenant edit is watched for a wrong alias.
const WATCH: Duration = Duration::from_secs(5);
/// How soon the controller must take a hand edit back: one pass after the edit reaches its
/// cache (tens of milliseconds in the lab); 5 s leaves room for a loaded CI machine.
const TAKE_BACK: Duration = Duration::from_secs(5);
/// The tenant, as kubectl impersonates it.
const TENANT: &str = "--as=system:serviceaccount:e2e-tenant:tenant";

#[test]
fn tenant_annotations_never_move_an_alias() -> Result<(), Error> {
    let Some(lab) = Lab::up()? else {
        return Ok(());
    };
    lab.apply(&namespace(NS))?;
    lab.add_pool(NS, &POOL)?;
    lab.apply(TENANT_RBAC)?;
    lab.apply(&lb_service(NS, "web").to_yaml())?;
    let (ip, holder) = lab.wait_announced(NS, "web", ANNOUNCE_TIMEOUT)?;
    println!("[e2e] {NS}/web: {ip} on {}", node_name(holder));

    // Assigned: the tenant names another node and the pod bridge.
    let other = *NODES.iter().find(|n| **n != holder).expect("three nodes");
    tenant_annotates(&lab, &node_name(other), Some("cni0"))?;
    only_on(ip, holder, WATCH)?;
    taken_back(&lab, &node_name(holder))?;
    println!(
        "[e2e] tenant set node={} interface=cni0: the alias stayed on {} eth0, annotations taken back",
        node_name(other),
        node_name(holder)
    );

    // Moving: a cordon moves the IP (break-before-make); the tenant keeps naming the old
    // node and a made-up one throughout. The IP ends on a node the controller chose.
    lab.kubectl(&["cordon", &node_name(holder)])?;
    let start = Instant::now();
    let mut left = false;
    let mut names = [node_name(holder), "alb-node-made-up".to_owned()]
        .into_iter()
        .cycle();
    let new = loop {
        let name = names.next().expect("cycle");
        tenant_annotates(&lab, &name, Some("cni0"))?;
        never_on_cni0(ip)?;
        let view = lab.service(NS, "web")?;
        let announced = view
            .conditions
            .get("aliaslb.io/Announced")
            .is_some_and(|c| c.status == "True");
        let held: Vec<u8> = NODES
            .iter()
            .copied()
            .filter(|n| aliases(*n).is_ok_and(|a| a.contains(&ip)))
            .collect();
        assert!(held.len() <= 1, "{ip} on two nodes at once: {held:?}");
        // Once off the cordoned node, it never comes back there (the tenant names it).
        left |= !held.contains(&holder);
        assert!(
            !(left && held.contains(&holder)),
            "{ip} went back to the cordoned {} the tenant named",
            node_name(holder)
        );
        if announced && held.len() == 1 && held[0] != holder {
            break held[0];
        }
        assert!(
            start.elapsed() < ANNOUNCE_TIMEOUT,
            "the IP did not move off the cordoned node: held by {held:?}, {}",
            view.summary()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    only_on(ip, new, WATCH)?;
    taken_back(&lab, &node_name(new))?;
    println!(
        "[e2e] cordon of {}: the IP moved to {} as the controller chose, whatever the tenant wrote",
        node_name(holder),
        node_name(new)
    );
    lab.kubectl(&["uncordon", &node_name(holder)])?;
    Ok(())
}

/// The tenant's ServiceAccount with `edit` in its namespace only.
const TENANT_RBAC: &str = "apiVersion: v1
kind: ServiceAccount
metadata: {name: tenant, namespace: e2e-tenant}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: tenant-edit, namespace: e2e-tenant}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: edit}
subjects: [{kind: ServiceAccount, name: tenant, namespace: e2e-tenant}]
";

/// As the tenant: `aliaslb.io/node=node` and `aliaslb.io/interface=interface` on `web`.
fn tenant_annotates(lab: &Lab, node: &str, interface: Option<&str>) -> Result<(), Error> {
    let node = format!("aliaslb.io/node={node}");
    let interface = interface.map(|i| format!("aliaslb.io/interface={i}"));
    let mut args = vec![
        TENANT,
        "-n",
        NS,
        "annotate",
        "--overwrite",
        "service",
        "web",
    ];
    args.push(&node);
    if let Some(i) = &interface {
        args.push(i);
    }
    // kubectl annotate sends the resourceVersion it read: a controller write in between is
    // a 409 Conflict, which a tenant simply retries.
    let mut tries = 0;
    loop {
        match lab.kubectl(&args) {
            Ok(_) => return Ok(()),
            Err(e) if tries < 10 && format!("{e:?}").contains("Conflict") => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => return Err(e),
        }
    }
}

/// For `window`, sampled every 100 ms: `ip` is an alias on node `holder`'s `eth0` and on
/// no other node, and on no node's `cni0`.
fn only_on(ip: Ipv4Addr, holder: u8, window: Duration) -> Result<(), Error> {
    let end = Instant::now() + window;
    while Instant::now() < end {
        for n in NODES {
            let held = aliases(n)?.contains(&ip);
            assert_eq!(
                held,
                n == holder,
                "{ip} on {}: {held}, but the controller chose {}",
                node_name(n),
                node_name(holder)
            );
        }
        never_on_cni0(ip)?;
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// No node has `ip` on its pod bridge.
fn never_on_cni0(ip: Ipv4Addr) -> Result<(), Error> {
    for n in NODES {
        let ns = node_name(n);
        let out =
            run(Command::new("ip").args(["-n", &ns, "-j", "-4", "addr", "show", "dev", "cni0"]))?;
        let v: Value = serde_json::from_str(&out).map_err(|e| Error::Output {
            cmd: format!("ip -n {ns} -j -4 addr show dev cni0"),
            why: format!("not JSON: {e}"),
        })?;
        let on_bridge = v
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|link| link["addr_info"].as_array().into_iter().flatten())
            .any(|a| a["local"].as_str() == Some(&ip.to_string()));
        assert!(!on_bridge, "{ip} is on {ns}'s cni0");
    }
    Ok(())
}

/// Within [`TAKE_BACK`] the annotations say the controller's node and no interface again.
fn taken_back(lab: &Lab, node: &str) -> Result<(), Error> {
    wait_for(
        "the controller to take its annotations back",
        TAKE_BACK,
        || {
            let svc = lab.get_json(&["service", "-n", NS, "web"])?;
            let annotations = &svc["metadata"]["annotations"];
            let got_node = annotations["aliaslb.io/node"].as_str().map(str::to_owned);
            let got_interface = annotations["aliaslb.io/interface"]
                .as_str()
                .map(str::to_owned);
            Ok(
                if got_node.as_deref() == Some(node) && got_interface.is_none() {
                    Ok(())
                } else {
                    Err(format!("node={got_node:?} interface={got_interface:?}"))
                },
            )
        },
    )
}
