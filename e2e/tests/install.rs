//! The install, for real (issue 23): `kubectl apply -k` of manifests/ (only the image
//! reference overridden, by a kustomize overlay) on the lab whose three nodes run real
//! kubelets with containerd and runc (`scripts/kubelets`), from the image built offline in the
//! same run (`scripts/image`). The agent DaemonSet and the controller Deployment run as pods
//! from that image; nothing of aliaslb is started by the test.
//!
//! One lab, one test function, the phases in order:
//! 1. the install: 3 agent pods (one per node) and 2 controller pods Ready (the controller's
//!    readiness probe passes), every container from our image; PodSecurity admission is on
//!    and enforces the namespaces' labels (a privileged pod is refused in `aliaslb-agents`);
//! 2. a Service gets an IP from the pool of manifests/pools.yaml and the LAN client is
//!    answered through the holder;
//! 3. the holder's agent pod is deleted: the IP moves gracefully (timed), the DaemonSet
//!    recreates the pod;
//! 4. the leader controller pod is deleted: the other replica leads (timed), no IP moves;
//! 5. `kubectl rollout restart daemonset/aliaslb-agent`: the IP stays answered (the longest
//!    gap between answers is measured) and is held at the end;
//! 6. `kubectl drain` of the holder: the IP moves gracefully (timed);
//! 7. no pod ever restarted (the agents' liveness probes passed all along);
//! 8. `kubectl delete -k`: every object goes, and no alias is left on any node;
//! 9. installed again with the component optional/bird-sidecar (its bird.conf edited for the
//!    lab's router, `scripts/lab bgp-up`, whose own node daemons are stopped): BIRD runs in
//!    each agent pod, the router's sessions come up, a Service of a pool with `announce: bgp`
//!    is routed through every node and answered from behind the router; `kubectl delete -k`
//!    withdraws the paths.
//!
//! Needs root, the binaries (`cargo build --workspace --bins`) and Debian's packages
//! (`scripts/image` and `scripts/kubelets` install what is missing). Run with `--nocapture`
//! for the figures:
//!
//! ```sh
//! cargo build --workspace --bins && cargo test -p aliaslb-e2e --test install -- --nocapture
//! ```

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use std::collections::BTreeSet;

use aliaslb_e2e::bgp::{BgpLab, NodeDaemon, routed_pool};
use aliaslb_e2e::client::{self, RecoveryProbe};
use aliaslb_e2e::fixtures::lb_service;
use aliaslb_e2e::kubelets::{Cluster, name_and_tag, relative, repo_root};
use aliaslb_e2e::lab::{
    AGENT_NAMESPACE, CLIENT_NS, NODES, SYSTEM_NAMESPACE, node_name, node_number, wait_for,
};
use aliaslb_e2e::{Error, aliases};

/// The Service's namespace: the pool key `default` of manifests/pools.yaml.
const NS: &str = "default";
const SERVICE: &str = "web";
/// The longest the LAN may go unanswered in a graceful move (the agent's SIGTERM, a cordon):
/// break-before-make over a few API round trips, as in e2e/tests/failover.rs.
const GRACEFUL_BOUND: Duration = Duration::from_secs(1);
/// The longest the LAN may go unanswered during the agents' rolling restart: each node's
/// restart is at most one graceful move, and issue 23's target is 0.5 s.
const ROLLOUT_GAP_BOUND: Duration = Duration::from_millis(500);
/// The controller's leader Lease duration (its default, as in manifests/controller.yaml): the
/// standby must lead within it once the leader's pod is deleted.
const LEADER_LEASE: Duration = Duration::from_secs(15);
/// The BIRD sidecar's configuration for the lab's router (scripts/lab bgp-up: alb-router at
/// 192.168.55.1 and fd55::1, AS 64500; the nodes AS 64501; the pools' host routes only), as a
/// user writes it into the component's bird.conf.
const LAB_BIRD_CONF: &str = r#"log stderr all;
router id from "eth0";
filter pools {
  if net ~ [ 10.200.0.0/24{32,32} ] then accept;
  if net ~ [ fd00:200::/64{128,128} ] then accept;
  reject;
}
protocol device { scan time 10; }
protocol direct {
  ipv4 { import filter pools; };
  ipv6 { import filter pools; };
  interface "lo", "aliaslb0";
}
protocol bfd {
  interface "eth0" { min rx interval 300 ms; min tx interval 300 ms; multiplier 3; };
}
template bgp upstream {
  local as 64501;
  hold time 9;
  keepalive time 3;
  connect delay time 1;
  connect retry time 1;
  error wait time 1, 5;
  bfd on;
}
protocol bgp router4 from upstream {
  neighbor 192.168.55.1 as 64500;
  ipv4 { import none; export filter pools; };
}
protocol bgp router6 from upstream {
  neighbor fd55::1 as 64500;
  ipv6 { import none; export filter pools; };
}
"#;
/// The routed Service's namespace and its pool address (inside the lab's BGP pool).
const BGP_NS: &str = "bgp-e2e";
const BGP_VIP: &str = "10.200.0.10";
/// A move the test causes (a deleted agent pod, a cordon) must be over by then.
const MOVE_TIMEOUT: Duration = Duration::from_secs(15);

/// The user's overlay: manifests/ unchanged, the image set to ours. Returns its folder.
fn write_overlay(c: &Cluster) -> Result<PathBuf, Error> {
    let dir = c.lab.state_dir().join("install");
    let (name, tag) = name_and_tag(&c.image)?;
    let manifests = relative(&dir, &repo_root().join("manifests"));
    let yaml = format!(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
         resources:\n  - {}\nimages:\n  - name: ghcr.io/aliaslb/aliaslb\n    \
         newName: {name}\n    newTag: {tag}\n",
        manifests.display()
    );
    std::fs::create_dir_all(&dir)
        .and_then(|()| std::fs::write(dir.join("kustomization.yaml"), yaml))
        .map_err(|source| Error::Io {
            what: format!("writing the overlay in {}", dir.display()),
            source,
        })?;
    Ok(dir)
}

/// The overlay of a user of the BIRD sidecar: manifests/ plus the component
/// optional/bird-sidecar, both images set to ours, and the component's bird.conf edited
/// for the lab's router (its comments say to). Returns its folder.
fn write_bird_overlay(c: &Cluster) -> Result<PathBuf, Error> {
    let repo = repo_root();
    let dir = c.lab.state_dir().join("install-bird");
    let (name, tag) = name_and_tag(&c.image)?;
    let (bird_name, bird_tag) = name_and_tag(&c.bird_image)?;
    let patch = serde_json::json!([
        {"op": "replace", "path": "/data/bird.conf", "value": LAB_BIRD_CONF}
    ])
    .to_string();
    let yaml = format!(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
         resources:\n  - {}\ncomponents:\n  - {}\nimages:\n\
         \x20 - name: ghcr.io/aliaslb/aliaslb\n    newName: {name}\n    newTag: {tag}\n\
         \x20 - name: ghcr.io/aliaslb/bird\n    newName: {bird_name}\n    newTag: {bird_tag}\n\
         patches:\n  - target:\n      kind: ConfigMap\n      name: aliaslb-bird\n    \
         patch: {}\n",
        relative(&dir, &repo.join("manifests")).display(),
        relative(&dir, &repo.join("manifests/optional/bird-sidecar")).display(),
        serde_json::to_string(&patch).unwrap_or_default(),
    );
    std::fs::create_dir_all(&dir)
        .and_then(|()| std::fs::write(dir.join("kustomization.yaml"), yaml))
        .map_err(|source| Error::Io {
            what: format!("writing the overlay in {}", dir.display()),
            source,
        })?;
    Ok(dir)
}

/// Requests from the LAN client every 50 ms until stopped; the longest stretch without an
/// answer, and how many requests were answered and failed.
struct Prober {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Result<(Duration, u32, u32), Error>>,
}

impl Prober {
    fn start(ip: Ipv4Addr) -> Prober {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            client::in_namespace(CLIENT_NS, move || {
                let addr = SocketAddr::from((ip, 80));
                let (mut last_ok, mut gap, mut ok, mut failed) =
                    (Instant::now(), Duration::ZERO, 0, 0);
                while !flag.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    if client::request_to(addr, client::CONNECT_TIMEOUT).is_ok() {
                        gap = gap.max(t.saturating_duration_since(last_ok));
                        last_ok = Instant::now();
                        ok += 1;
                    } else {
                        failed += 1;
                    }
                    std::thread::sleep(client::PROBE_PERIOD);
                }
                gap = gap.max(last_ok.elapsed());
                (gap, ok, failed)
            })
        });
        Prober { stop, thread }
    }

    fn finish(self) -> Result<(Duration, u32, u32), Error> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .join()
            .map_err(|_| Error::Environment("the prober panicked".to_owned()))?
    }
}

/// Runs `fault` with the LAN client sampling `ip` all along, and waits until `ip` is answered
/// through another node than `holder`: (when it moved after the fault began, the longest
/// stretch without an answer).
fn move_away(
    ip: Ipv4Addr,
    holder: u8,
    fault: impl FnOnce() -> Result<(), Error>,
) -> Result<(Duration, Duration), Error> {
    let prober = Prober::start(ip);
    let probe = RecoveryProbe::start(ip, MOVE_TIMEOUT, move |a| {
        a.via_node().is_some_and(|n| n != holder)
    });
    let t0 = Instant::now();
    fault()?;
    let moved = probe.wait(t0)?;
    std::thread::sleep(Duration::from_millis(500));
    let (gap, _, _) = prober.finish()?;
    Ok((moved.after, gap))
}

#[test]
fn kubectl_apply_k_runs_aliaslb_as_pods_of_our_image() -> Result<(), Error> {
    let Some(c) = Cluster::up("install")? else {
        return Ok(());
    };
    if let Err(e) = phases(&c) {
        eprintln!("---- the cluster ----\n{}", c.diagnostics());
        return Err(e);
    }
    Ok(())
}

fn phases(c: &Cluster) -> Result<(), Error> {
    let lab = &c.lab;
    let overlay = write_overlay(c)?;
    let overlay = overlay.to_string_lossy();

    // 1. The install.
    let t0 = Instant::now();
    lab.kubectl(&["apply", "-k", &overlay])?;
    c.wait_rolled_out()?;
    println!(
        "[install] kubectl apply -k: 3 agent pods and 2 controller pods Ready in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    let agents = c.pods("aliaslb-agent")?;
    let controllers = c.pods("aliaslb-controller")?;
    for pod in agents.iter().chain(&controllers) {
        let name = pod["metadata"]["name"].as_str().unwrap_or("?");
        let status = &pod["status"]["containerStatuses"][0];
        assert_eq!(
            pod["spec"]["containers"][0]["image"],
            c.image.as_str(),
            "{name}"
        );
        assert!(
            status["imageID"].as_str().is_some_and(|i| !i.is_empty()),
            "{name} runs no image: {status}"
        );
    }
    let mut agent_nodes: Vec<u8> = agents
        .iter()
        .filter_map(|p| node_number(p["spec"]["nodeName"].as_str()?))
        .collect();
    agent_nodes.sort();
    assert_eq!(agent_nodes, NODES, "one agent pod per node");
    for pod in &agents {
        // hostNetwork: the pod's IP is its node's.
        let node = node_number(pod["spec"]["nodeName"].as_str().unwrap_or_default());
        assert_eq!(
            pod["status"]["podIP"].as_str(),
            node.map(|n| aliaslb_e2e::lab::node_ip(n).to_string())
                .as_deref()
        );
    }
    for pod in &controllers {
        // On the pod network (the CNI bridge), reaching the API through Service kubernetes.
        let ip = pod["status"]["podIP"].as_str().unwrap_or_default();
        assert!(ip.starts_with("10.244."), "controller pod IP {ip}");
    }
    // PodSecurity admission enforces the labels: `restricted` in aliaslb-agents refuses a
    // privileged pod, `privileged` in aliaslb-system admitted the agents.
    let refused = lab.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: privileged\n  namespace: {AGENT_NAMESPACE}\n\
         spec:\n  hostNetwork: true\n  containers:\n    - name: c\n      image: {}\n",
        c.image
    ));
    match refused {
        Err(Error::Command { stderr, .. }) if stderr.contains("violates PodSecurity") => {}
        other => panic!("a hostNetwork pod in {AGENT_NAMESPACE} was not refused: {other:?}"),
    }
    let leader = c.wait_new_leader(None, Duration::from_secs(30))?;
    for n in NODES {
        lab.wait_agent_lease(n, Duration::from_secs(30))?;
    }
    println!("[install] {leader} leads; every agent pod wrote its Lease");

    // 2. A Service, answered on the LAN.
    lab.apply(&lb_service(NS, SERVICE).to_yaml())?;
    let (ip, holder) = lab.wait_announced(NS, SERVICE, Duration::from_secs(30))?;
    // kube-proxy writes the Service's rules on its own schedule: the first answer may follow
    // the announcement by a sync period.
    let answer = wait_for(
        &format!("an answer from {ip}"),
        Duration::from_secs(10),
        || client::get(ip),
    )?;
    assert_eq!(answer.via_node(), Some(holder), "{answer:?}");
    println!(
        "[install] {ip} held by {}, answered: {answer:?}",
        node_name(holder)
    );

    // 3. The holder's agent pod deleted: a graceful move (its SIGTERM), then the DaemonSet's
    // new pod.
    let pod = c.agent_pod(holder)?;
    let (after, gap) = move_away(ip, holder, || {
        lab.kubectl(&[
            "delete",
            "pod",
            "-n",
            SYSTEM_NAMESPACE,
            &pod,
            "--wait=false",
        ])
        .map(drop)
    })?;
    println!(
        "[install] agent pod {pod} on {} deleted: the IP moved {:.2} s after `kubectl delete`, longest gap without an answer {:.2} s",
        node_name(holder),
        after.as_secs_f64(),
        gap.as_secs_f64()
    );
    assert!(gap <= GRACEFUL_BOUND, "gap {gap:?}");
    c.wait_rolled_out()?;
    let (ip2, holder) = lab.wait_announced(NS, SERVICE, Duration::from_secs(30))?;
    assert_eq!(ip2, ip, "the Service keeps its IP");

    // 4. The leader pod deleted: the other replica leads, nothing moves.
    let old = lab
        .leader()?
        .ok_or_else(|| Error::Environment("no leader".to_owned()))?;
    let fault = Instant::now();
    lab.kubectl(&[
        "delete",
        "pod",
        "-n",
        SYSTEM_NAMESPACE,
        &old,
        "--wait=false",
    ])?;
    let new = c.wait_new_leader(Some(&old), LEADER_LEASE)?;
    println!(
        "[install] leader pod {old} deleted: {new} leads after {:.2} s",
        fault.elapsed().as_secs_f64()
    );
    assert_eq!(
        lab.service(NS, SERVICE)?.assignment(),
        Some((ip, holder)),
        "the leader change moved the IP"
    );
    client::get(ip)?.map_err(|e| Error::Environment(format!("{ip} after the handover: {e}")))?;
    c.wait_rolled_out()?;

    // 5. The agents' rolling restart, the LAN sampled all along.
    let prober = Prober::start(ip);
    let t0 = Instant::now();
    lab.kubectl(&[
        "rollout",
        "restart",
        "daemonset/aliaslb-agent",
        "-n",
        SYSTEM_NAMESPACE,
    ])?;
    lab.kubectl(&[
        "rollout",
        "status",
        "daemonset/aliaslb-agent",
        "-n",
        SYSTEM_NAMESPACE,
        "--timeout=180s",
    ])?;
    c.wait_rolled_out()?;
    let (ip2, holder) = lab.wait_announced(NS, SERVICE, Duration::from_secs(30))?;
    std::thread::sleep(Duration::from_secs(1));
    let (gap, ok, failed) = prober.finish()?;
    println!(
        "[install] rollout restart of the agents in {:.1} s: longest gap without an answer {:.2} s ({ok} answered, {failed} failed); {ip2} held by {}",
        t0.elapsed().as_secs_f64(),
        gap.as_secs_f64(),
        node_name(holder)
    );
    assert_eq!(ip2, ip, "the Service keeps its IP");
    assert!(gap <= ROLLOUT_GAP_BOUND, "gap {gap:?}");

    // 6. Drain the holder: the cordon moves the IP gracefully.
    let (after, gap) = move_away(ip, holder, || {
        lab.kubectl(&[
            "drain",
            &node_name(holder),
            "--ignore-daemonsets",
            "--delete-emptydir-data",
            "--timeout=120s",
        ])
        .map(drop)
    })?;
    println!(
        "[install] drain of {}: the IP moved {:.2} s after `kubectl drain`, longest gap without an answer {:.2} s",
        node_name(holder),
        after.as_secs_f64(),
        gap.as_secs_f64()
    );
    assert!(gap <= GRACEFUL_BOUND, "gap {gap:?}");
    lab.kubectl(&["uncordon", &node_name(holder)])?;
    c.wait_rolled_out()?;

    // 7. The probes passed all along: no container restarted.
    for pod in c
        .pods("aliaslb-agent")?
        .iter()
        .chain(&c.pods("aliaslb-controller")?)
    {
        assert_eq!(
            pod["status"]["containerStatuses"][0]["restartCount"], 0,
            "{} restarted",
            pod["metadata"]["name"]
        );
    }

    // 8. The uninstall.
    let t0 = Instant::now();
    lab.kubectl(&["delete", "-k", &overlay, "--wait=true", "--timeout=120s"])?;
    wait_for(
        "aliaslb's namespaces to go",
        Duration::from_secs(60),
        || {
            let left = lab.kubectl(&["get", "namespaces", "-o", "name"])?;
            Ok(
                if left.contains(SYSTEM_NAMESPACE) || left.contains(AGENT_NAMESPACE) {
                    Err(left)
                } else {
                    Ok(())
                },
            )
        },
    )?;
    for n in NODES {
        let left = aliases(n)?;
        assert!(left.is_empty(), "{} keeps {left:?}", node_name(n));
    }
    // Nobody answers ARP for the IP any more. (A request would still be answered through a
    // stale neighbour entry: the Service keeps its status, so kube-proxy keeps its rules.)
    let ip_arg = ip.to_string();
    let arping = lab.exec(
        "client",
        &["arping", "-c", "3", "-w", "3", "-I", "eth0", &ip_arg],
    );
    // arping exits 1 when no reply came (2 and more: it could not send).
    match arping {
        Err(Error::Command { status, .. }) if status.code() == Some(1) => {}
        other => panic!("{ip} is still answered on the LAN after the uninstall: {other:?}"),
    }
    println!(
        "[install] kubectl delete -k: everything gone, no alias left, in {:.1} s",
        t0.elapsed().as_secs_f64()
    );

    // 9. Installed again, with the BIRD sidecar component: the lab's router peers with the
    // BIRD container of each agent pod (the lab's own node daemons stopped first) and routes a
    // Service's address over the nodes.
    let bgp = BgpLab::up(lab, NodeDaemon::Bird)?;
    for n in NODES {
        bgp.stop_daemon(n)?;
    }
    wait_for(
        "the lab's node daemons' sessions to close",
        Duration::from_secs(30),
        || {
            let sessions = bgp.router_sessions()?;
            Ok(if sessions.values().any(|s| s == "Established") {
                Err(format!("{sessions:?}"))
            } else {
                Ok(())
            })
        },
    )?;
    let bird_overlay = write_bird_overlay(c)?;
    let bird_overlay = bird_overlay.to_string_lossy();
    let t0 = Instant::now();
    lab.kubectl(&["apply", "-k", &bird_overlay])?;
    c.wait_rolled_out()?;
    for pod in c.pods("aliaslb-agent")? {
        let images: Vec<&str> = pod["spec"]["containers"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["image"].as_str())
            .collect();
        assert_eq!(images, [c.image.as_str(), c.bird_image.as_str()]);
    }
    bgp.wait_established(Duration::from_secs(60))?;
    println!(
        "[install] with optional/bird-sidecar: agent pods Ready (agent + bird), 6 sessions Established on the router, in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    routed_pool(lab, BGP_NS, BGP_VIP)?;
    lab.apply(&lb_service(BGP_NS, SERVICE).to_yaml())?;
    let all: BTreeSet<u8> = NODES.into_iter().collect();
    let took = bgp.wait_next_hops(BGP_VIP, &all, Duration::from_secs(30))?;
    let vip: std::net::IpAddr = BGP_VIP.parse().expect("a literal address");
    let answers = wait_for(
        &format!("answers from {vip} behind the router"),
        Duration::from_secs(10),
        || {
            let answers = bgp.client_answers(vip, 80, 20)?;
            Ok(if answers.iter().all(Result::is_ok) {
                Ok(answers.len())
            } else {
                Err(format!("{answers:?}"))
            })
        },
    )?;
    println!(
        "[install] {BGP_VIP}: the router has a path through every node's BIRD sidecar ({:.1} s after the Service), {answers} requests from behind the router answered",
        took.as_secs_f64()
    );
    lab.kubectl(&[
        "delete",
        "-k",
        &bird_overlay,
        "--wait=true",
        "--timeout=120s",
    ])?;
    bgp.wait_next_hops(BGP_VIP, &BTreeSet::new(), Duration::from_secs(30))?;
    println!("[install] kubectl delete -k: the router has no path left");
    Ok(())
}
