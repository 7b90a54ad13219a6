//! Services over the lab, with the real binaries: the classic pool example (three Services
//! get the three addresses in order, a fourth waits with a visible reason, and a deleted
//! one re-created gets its address back while the fourth waits on), and reachability from the client through the real data
//! path (ARP -> the holder's alias -> kube-proxy DNAT -> the pod) for externalTrafficPolicy
//! Cluster and Local.
//!
//! One lab for the binary, so one test function running the phases in order. Needs root:
//!
//! ```sh
//! cargo build --workspace --bins && cargo test -p aliaslb-e2e --test services -- --nocapture
//! ```

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::process::Command;
use std::time::Duration;

use aliaslb_e2e::client::{self, Answer};
use aliaslb_e2e::fixtures::{lb_service, namespace};
use aliaslb_e2e::lab::{CLIENT_IP, CLIENT_NS, Lab, NODES, node_name, run, wait_for};
use aliaslb_e2e::{Error, aliases};

const ANNOUNCE_TIMEOUT: Duration = Duration::from_secs(20);

#[test]
fn classic_pool_and_data_path() -> Result<(), Error> {
    let Some(lab) = Lab::up()? else {
        return Ok(());
    };
    classic_pool(&lab)?;
    cluster_policy_data_path(&lab)?;
    local_policy_follows_endpoints(&lab)?;
    ip_mode_vip_is_what_kube_proxy_acts_on(&lab)?;
    Ok(())
}

/// Whether kube-proxy on node `n` has its LoadBalancer-IP rule for `ip` (iptables:
/// `-d IP/32` in KUBE-SERVICES).
fn proxy_has_lb_rule(lab: &Lab, n: u8, ip: Ipv4Addr) -> Result<bool, Error> {
    Ok(lab.proxy_rules(n)?.contains(&format!("-d {ip}/32")))
}

/// `status.loadBalancer.ingress[].ipMode` as stored, and what kube-proxy does with it: with
/// `VIP` (what the controller writes) every node's kube-proxy handles the LB IP itself; with
/// `Proxy` (what a load balancer that proxies, and so rewrites the destination, would write)
/// kube-proxy drops its rules for the IP, and traffic reaching the holder for it is no longer
/// forwarded (the host-port shield drops it). The controller owns the status: restarted, it
/// writes `VIP` back and the Service answers again.
fn ip_mode_vip_is_what_kube_proxy_acts_on(lab: &Lab) -> Result<(), Error> {
    let (ip, holder) = lab.wait_announced("default", "svc-1", ANNOUNCE_TIMEOUT)?;
    let mode = || -> Result<String, Error> {
        lab.kubectl(&[
            "get",
            "svc",
            "-n",
            "default",
            "svc-1",
            "-o",
            "jsonpath={.status.loadBalancer.ingress[0].ipMode}",
        ])
    };
    assert_eq!(mode()?, "VIP", "the stored ipMode");
    for n in NODES {
        assert!(
            proxy_has_lb_rule(lab, n, ip)?,
            "no LB rule for {ip} on {}",
            node_name(n)
        );
    }

    lab.stop("controller-1")?;
    lab.kubectl(&[
        "patch",
        "svc",
        "-n",
        "default",
        "svc-1",
        "--subresource=status",
        "--type=json",
        "-p",
        r#"[{"op": "replace", "path": "/status/loadBalancer/ingress/0/ipMode", "value": "Proxy"}]"#,
    ])?;
    wait_for(
        "kube-proxy to drop its LB rules for an ipMode: Proxy IP",
        Duration::from_secs(20),
        || {
            let still: Vec<u8> = NODES
                .into_iter()
                .filter(|&n| proxy_has_lb_rule(lab, n, ip).unwrap_or(true))
                .collect();
            Ok(if still.is_empty() {
                Ok(())
            } else {
                Err(format!("rules for {ip} still on nodes {still:?}"))
            })
        },
    )?;
    assert_eq!(holders(ip)?, BTreeSet::from([holder]), "the alias stays");
    match client::get(ip)? {
        Err(_) => {}
        Ok(answer) => panic!("{ip} answered with ipMode Proxy: {answer:?}"),
    }
    println!(
        "[e2e] ipMode Proxy: kube-proxy dropped its rules for {ip}; the holder no longer forwards it"
    );

    lab.start_controller("controller-1")?;
    lab.wait_leader("controller-1", Duration::from_secs(20))?;
    wait_for(
        "the controller to write ipMode VIP back",
        ANNOUNCE_TIMEOUT,
        || {
            Ok(match mode()?.as_str() {
                "VIP" => Ok(()),
                other => Err(format!("ipMode {other:?}")),
            })
        },
    )?;
    answers(ip, 5)?;
    println!("[e2e] ipMode VIP written back: {ip} answers again through kube-proxy");
    Ok(())
}

fn ip(s: &str) -> Ipv4Addr {
    s.parse().expect("a literal IPv4 address")
}

/// `count` requests from the client to `ip`, waiting first until it answers at all.
fn answers(ip: Ipv4Addr, count: usize) -> Result<Vec<Answer>, Error> {
    wait_for(
        &format!("http://{ip}/ from the client"),
        Duration::from_secs(10),
        || client::get(ip),
    )?;
    client::get_many(ip, count)?.map_err(|e| Error::Output {
        cmd: format!("GET http://{ip}/ from {CLIENT_NS}"),
        why: e,
    })
}

/// The pool ConfigMap of `manifests/pools.yaml` holds 192.168.55.10-12 for `default`.
fn classic_pool(lab: &Lab) -> Result<(), Error> {
    let ns = "default";
    for (name, want) in [
        ("svc-1", "192.168.55.10"),
        ("svc-2", "192.168.55.11"),
        ("svc-3", "192.168.55.12"),
    ] {
        lab.apply(&lb_service(ns, name).to_yaml())?;
        let (got, node) = lab.wait_announced(ns, name, ANNOUNCE_TIMEOUT)?;
        assert_eq!(got, ip(want), "{name} got the wrong address");
        println!("[e2e] {ns}/{name}: {got} on {}", node_name(node));
    }

    lab.apply(&lb_service(ns, "svc-4").to_yaml())?;
    let pending = wait_for("svc-4 to report PoolExhausted", ANNOUNCE_TIMEOUT, || {
        let view = lab.service(ns, "svc-4")?;
        Ok(match view.conditions.get("aliaslb.io/IPAllocated") {
            Some(c) if c.status == "False" && c.reason == "PoolExhausted" => Ok(view),
            _ => Err(view.summary()),
        })
    })?;
    assert!(pending.ips.is_empty(), "svc-4 has an address: {pending:?}");
    let event = wait_for(
        "a Warning Event AllocationFailed on svc-4 naming the pool",
        Duration::from_secs(10),
        || {
            let events = lab.get_json(&[
                "events",
                "-n",
                ns,
                "--field-selector",
                "involvedObject.kind=Service,involvedObject.name=svc-4,type=Warning",
            ])?;
            let found = events["items"]
                .as_array()
                .into_iter()
                .flatten()
                .find_map(|e| {
                    let reason = e["reason"].as_str().unwrap_or_default();
                    let message = e["message"].as_str().unwrap_or_default();
                    (reason == "AllocationFailed" && message.contains("pool default"))
                        .then(|| format!("{reason}: {message}"))
                });
            Ok(found.ok_or_else(|| events["items"].to_string()))
        },
    )?;
    println!(
        "[e2e] {ns}/svc-4: pending, condition IPAllocated=False PoolExhausted ({}); Event {event}",
        pending.conditions["aliaslb.io/IPAllocated"].message
    );

    // A reinstall of svc-2: its address is held for it (--hold-released, 10 min by
    // default), so svc-4 does not take it, and the re-created svc-2 gets it back.
    lab.kubectl(&["delete", "service", "-n", ns, "svc-2"])?;
    let held = wait_for(
        "svc-4's condition to name the address held for svc-2",
        ANNOUNCE_TIMEOUT,
        || {
            let view = lab.service(ns, "svc-4")?;
            Ok(match view.conditions.get("aliaslb.io/IPAllocated") {
                Some(c) if c.message.contains("192.168.55.11 for default/svc-2") => {
                    Ok(c.message.clone())
                }
                _ => Err(view.summary()),
            })
        },
    )?;
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        lab.service(ns, "svc-4")?.ips.is_empty(),
        "svc-4 took the address held for svc-2"
    );
    lab.apply(&lb_service(ns, "svc-2").to_yaml())?;
    let (got, node) = lab.wait_announced(ns, "svc-2", ANNOUNCE_TIMEOUT)?;
    assert_eq!(
        got,
        ip("192.168.55.11"),
        "the re-created svc-2 did not get its address back"
    );
    let answered = answers(got, 5)?;
    assert!(
        answered.iter().all(|a| a.pod_node().is_some()),
        "not answered by a pod: {answered:?}"
    );
    println!(
        "[e2e] svc-2 deleted and re-created: svc-4 waited ({held}); svc-2 got {got} back on {} and answers ({})",
        node_name(node),
        answered[0].pod
    );
    assert!(
        lab.service(ns, "svc-4")?.ips.is_empty(),
        "svc-4 got an address"
    );
    for (name, want) in [("svc-1", "192.168.55.10"), ("svc-3", "192.168.55.12")] {
        assert_eq!(
            lab.service(ns, name)?.ips,
            vec![ip(want)],
            "{name} changed address"
        );
    }
    Ok(())
}

/// The MAC address of `dev` in namespace `ns`.
fn mac(ns: &str, dev: &str) -> Result<String, Error> {
    let out = run(Command::new("ip").args(["-n", ns, "-j", "link", "show", "dev", dev]))?;
    Ok(serde_json::from_str::<serde_json::Value>(&out)
        .ok()
        .and_then(|v| v[0]["address"].as_str().map(str::to_owned))
        .unwrap_or_default())
}

/// Which nodes hold `ip` as an alias.
fn holders(ip: Ipv4Addr) -> Result<BTreeSet<u8>, Error> {
    let mut out = BTreeSet::new();
    for n in NODES {
        if aliases(n)?.contains(&ip) {
            out.insert(n);
        }
    }
    Ok(out)
}

fn cluster_policy_data_path(lab: &Lab) -> Result<(), Error> {
    let (ip, holder) = lab.wait_announced("default", "svc-1", ANNOUNCE_TIMEOUT)?;
    let answered = answers(ip, 20)?;
    // The path, hop by hop: only the holder has the alias ...
    assert_eq!(holders(ip)?, BTreeSet::from([holder]), "{ip} aliases");
    // ... the client resolved the IP to the holder's MAC ...
    let neigh =
        run(Command::new("ip").args(["-n", CLIENT_NS, "-j", "neigh", "show", &ip.to_string()]))?;
    let holder_mac = mac(&node_name(holder), "eth0")?;
    assert!(
        neigh.contains(&holder_mac),
        "the client's ARP entry for {ip} is not {holder_mac} ({}'s eth0): {neigh}",
        node_name(holder)
    );
    // ... kube-proxy on the holder has the DNAT rules for it ...
    let rules = run(Command::new("ip").args([
        "netns",
        "exec",
        &node_name(holder),
        "iptables",
        "-w",
        "-t",
        "nat",
        "-S",
        "KUBE-SERVICES",
    ]))?;
    assert!(
        rules.contains(&format!("-d {ip}/32")),
        "no kube-proxy rule for {ip} on {}",
        node_name(holder)
    );
    // ... and every request was forwarded by the holder to a pod, both pods taking turns.
    let pods: BTreeSet<&str> = answered.iter().map(|a| a.pod.as_str()).collect();
    assert!(
        answered.iter().all(|a| a.via_node() == Some(holder)),
        "not all forwarded by {}: {answered:?}",
        node_name(holder)
    );
    assert_eq!(pods, BTreeSet::from(["pod-a", "pod-b"]), "{answered:?}");
    println!(
        "[e2e] Cluster: client ARP {ip} -> {holder_mac} ({} eth0, alias {ip}/32) -> kube-proxy DNAT -> {pods:?} (20 requests)",
        node_name(holder)
    );
    Ok(())
}

fn local_policy_follows_endpoints(lab: &Lab) -> Result<(), Error> {
    let ns = "e2e-local";
    lab.apply(&namespace(ns))?;
    lab.add_pool(ns, &["192.168.55.30", "192.168.55.31"])?;

    // Endpoints on nodes 1 and 2: node 3 (no pod) must never hold the IP.
    lab.apply(&lb_service(ns, "both").local().to_yaml())?;
    let (ip_both, holder) = lab.wait_announced(ns, "both", ANNOUNCE_TIMEOUT)?;
    assert!(
        holder == 1 || holder == 2,
        "Local with endpoints on nodes 1 and 2 is held by {}",
        node_name(holder)
    );
    assert_local_answers(ip_both, holder)?;

    // Only pod-b (node 2): the IP must be on node 2; then only pod-a: it must move to node 1.
    lab.apply(&lb_service(ns, "only").local().pods_on(&[2]).to_yaml())?;
    let (ip_only, holder) = lab.wait_announced(ns, "only", ANNOUNCE_TIMEOUT)?;
    assert_eq!(holder, 2, "Local with pod-b only must be on alb-node-2");
    assert_local_answers(ip_only, 2)?;
    lab.apply(&lb_service(ns, "only").local().pods_on(&[1]).to_yaml())?;
    let moved = wait_for(
        "the Local Service to follow its endpoint to alb-node-1",
        ANNOUNCE_TIMEOUT,
        || {
            let view = lab.service(ns, "only")?;
            Ok(match view.assignment() {
                Some((ip, 1)) if aliases(1)?.contains(&ip) => Ok(ip),
                _ => Err(view.summary()),
            })
        },
    )?;
    assert_eq!(
        moved, ip_only,
        "the Local Service changed address when moving"
    );
    assert_local_answers(ip_only, 1)?;
    println!(
        "[e2e] Local: {ip_both} on a node with a local endpoint; {ip_only} on alb-node-2 (pod-b only), then alb-node-1 after the endpoint moved; client address {CLIENT_IP} preserved"
    );
    Ok(())
}

/// Every answer comes from the pod on `holder`, which saw the client's own address.
fn assert_local_answers(ip: Ipv4Addr, holder: u8) -> Result<(), Error> {
    let answered = answers(ip, 10)?;
    assert_eq!(holders(ip)?, BTreeSet::from([holder]), "{ip} aliases");
    for a in &answered {
        assert_eq!(
            (a.pod_node(), a.client),
            (Some(holder), CLIENT_IP.into()),
            "Local on {}: want the local pod seeing the client address, got {a:?}",
            node_name(holder)
        );
    }
    Ok(())
}
