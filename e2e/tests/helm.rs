//! The Helm chart in the lab: `helm install` makes every aliaslb object (no `kubectl apply`
//! of manifests/), the real controller and agents run under the ServiceAccounts and RBAC the
//! chart created, and a `helm upgrade` that changes the image tag and adds a pool address,
//! followed by the controller's rollout (a new replica, the old one stopped), moves nothing:
//! with the LAN sampled from the client ([`aliaslb_e2e::lan`]), every IP is answered by its
//! node's MAC alone from before the upgrade to well after it, and every Service keeps its IP
//! and node; the added address is in force (a new Service gets it from the new leader).
//! Then `helm uninstall` removes every object of the release, and the agents, stopped as the
//! kubelet would stop them once their DaemonSet is gone, leave no address behind.
//!
//! The chart's Deployment and DaemonSet exist but run no pod (the lab has no kubelet): the
//! lab runs the binaries itself, as it does for every e2e test, and plays the controller's
//! rollout. Not played: the agents' rollout, where each agent's SIGTERM moves its node's IPs
//! (a graceful failover, e2e/tests/failover.rs). Needs root, the binaries and helm
//! (`ALIASLB_HELM`, else `scripts/helm` builds it):
//!
//! ```sh
//! cargo build --workspace --bins
//! cargo test -p aliaslb-e2e --test helm -- --nocapture
//! ```

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use aliaslb_e2e::fixtures::{lb_service, namespace};
use aliaslb_e2e::kubelets::repo_root;
use aliaslb_e2e::lab::{LEASE_DURATION, Lab, NODES, SYSTEM_NAMESPACE, helm_binary, run, wait_for};
use aliaslb_e2e::lan::{LanSampler, name_macs};
use aliaslb_e2e::{Error, aliases};
use serde_json::Value;

const RELEASE: &str = "aliaslb";
/// The Services' namespace and its pool, then the address the upgrade adds.
const NS: &str = "helm-e2e";
const POOL: [&str; 3] = ["192.168.55.80", "192.168.55.81", "192.168.55.82"];
const ADDED: &str = "192.168.55.83";
const SERVICES: [&str; 3] = ["web-a", "web-b", "web-c"];
const ANNOUNCE_TIMEOUT: Duration = Duration::from_secs(30);

/// Runs helm as the lab's admin on the release's namespace.
struct Helm {
    bin: PathBuf,
    kubeconfig: PathBuf,
    chart: String,
}

impl Helm {
    fn run(&self, args: &[&str]) -> Result<String, Error> {
        let t0 = Instant::now();
        let out = run(Command::new(&self.bin)
            .args(args)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(["--namespace", SYSTEM_NAMESPACE]))?;
        println!(
            "[helm] helm {}: {:.2} s",
            args[0],
            t0.elapsed().as_secs_f64()
        );
        Ok(out)
    }
}

/// A values file with the pool of [`NS`] (and `extra` lines).
fn values(dir: &Path, name: &str, pool: &[&str], extra: &str) -> Result<String, Error> {
    let mut text = format!("pools:\n  {NS}: |\n");
    for ip in pool {
        text.push_str(&format!("    {ip}\n"));
    }
    text.push_str(extra);
    let path = dir.join(name);
    std::fs::write(&path, text).map_err(|source| Error::Io {
        what: format!("writing {}", path.display()),
        source,
    })?;
    Ok(path.display().to_string())
}

/// The objects of `manifest` that exist, as `kind/name` (`kubectl get -f`).
fn live(lab: &Lab, manifest: &Path) -> Result<BTreeSet<String>, Error> {
    let out = lab.kubectl(&[
        "get",
        "-f",
        &manifest.display().to_string(),
        "--ignore-not-found",
        "-o",
        "name",
    ])?;
    Ok(out.lines().map(str::to_owned).collect())
}

#[test]
fn helm_install_upgrade_uninstall_moves_nothing() -> Result<(), Error> {
    let Some(mut lab) = Lab::up_bare()? else {
        return Ok(());
    };
    let dir = std::env::temp_dir().join(format!("aliaslb-e2e-helm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|source| Error::Io {
        what: format!("creating {}", dir.display()),
        source,
    })?;
    let helm = Helm {
        bin: helm_binary()?,
        kubeconfig: lab.admin_kubeconfig().to_owned(),
        chart: repo_root().join("charts/aliaslb").display().to_string(),
    };
    let chart = helm.chart.clone();

    // Install: every aliaslb object comes from the chart; the binaries run under its
    // ServiceAccounts.
    let install = values(&dir, "install.yaml", &POOL, "")?;
    helm.run(&[
        "install",
        RELEASE,
        &chart,
        "-f",
        &install,
        "--create-namespace",
    ])?;
    let manifest = dir.join("installed.yaml");
    let text = helm.run(&["get", "manifest", RELEASE])?;
    std::fs::write(&manifest, &text).map_err(|source| Error::Io {
        what: format!("writing {}", manifest.display()),
        source,
    })?;
    let installed = live(&lab, &manifest)?;
    assert!(
        installed.contains("daemonset.apps/aliaslb-agent")
            && installed.contains("serviceaccount/aliaslb-agent")
            && installed.contains("configmap/aliaslb-pools"),
        "{installed:?}"
    );
    lab.start_aliaslb()?;

    lab.apply(&namespace(NS))?;
    for name in SERVICES {
        lab.apply(&lb_service(NS, name).to_yaml())?;
    }
    let mut held = Vec::new();
    for name in SERVICES {
        let (ip, node) = lab.wait_announced(NS, name, ANNOUNCE_TIMEOUT)?;
        println!("[helm] {NS}/{name}: {ip} on node {node}");
        held.push((name, ip, node));
    }
    let macs = lab.mac_names()?;

    // Upgrade, with the LAN sampled from a while before to a while after.
    let sampler = LanSampler::start(held.iter().map(|(_, ip, _)| *ip))?;
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(2));
    let mut grown = POOL.to_vec();
    grown.push(ADDED);
    let upgrade = values(&dir, "upgrade.yaml", &grown, "image:\n  tag: 0.1.1\n")?;
    helm.run(&["upgrade", RELEASE, &chart, "-f", &upgrade])?;
    let upgraded_at = t0.elapsed();
    // The new image rolls the controller Deployment: a new replica starts, the old one stops
    // (releasing the leader Lease) and the new one leads. The lab has no kubelet: it plays
    // that rollout with its own processes.
    lab.start_controller("controller-2")?;
    lab.stop("controller-1")?;
    lab.wait_leader("controller-2", Duration::from_secs(30))?;
    println!(
        "[helm] controller-2 leads at {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    // The upgraded pool is in force: the only free address goes to a new Service.
    lab.apply(&lb_service(NS, "web-d").to_yaml())?;
    let (ip_d, node_d) = lab.wait_announced(NS, "web-d", ANNOUNCE_TIMEOUT)?;
    assert_eq!(
        ip_d.to_string(),
        ADDED,
        "web-d takes the address the upgrade added"
    );
    println!("[helm] {NS}/web-d: {ip_d} on node {node_d} (the added address)");
    // Long enough for any wrongful move: three agent lease durations.
    std::thread::sleep(LEASE_DURATION * 3);
    let record = sampler.finish()?;
    println!(
        "[helm] LAN sampled for {:.1} s ({} rounds, max gap {} ms), upgrade at {:.1} s",
        t0.elapsed().as_secs_f64(),
        record.samples.len(),
        record.max_gap().as_millis(),
        upgraded_at.as_secs_f64()
    );

    assert!(
        record.samples.len() >= 100,
        "the LAN sampler made only {} rounds",
        record.samples.len()
    );
    let mut moved = Vec::new();
    for (name, ip, node) in &held {
        let want: BTreeSet<_> = [lab.node_mac(*node)?].into();
        let seen = record.macs_for(*ip);
        if seen != want {
            moved.push(format!(
                "{name} {ip}: answered by {}, want only {}",
                name_macs(&seen, &macs),
                name_macs(&want, &macs)
            ));
        }
        let answered = record
            .samples
            .iter()
            .filter(|s| s.answers.get(ip).is_some_and(|m| !m.is_empty()))
            .count();
        if answered < record.samples.len() * 9 / 10 {
            moved.push(format!(
                "{name} {ip}: answered in only {answered} of {} rounds",
                record.samples.len()
            ));
        }
        let after = lab.service(NS, name)?;
        if after.assignment() != Some((*ip, *node)) {
            moved.push(format!(
                "{name}: was {ip} on node {node}, now {}",
                after.summary()
            ));
        }
    }
    let violations: Vec<String> = record
        .violations()
        .iter()
        .map(|v| v.describe(t0, &macs))
        .collect();
    assert!(
        moved.is_empty() && violations.is_empty(),
        "helm upgrade moved something:\n{}\n{}",
        moved.join("\n"),
        violations.join("\n")
    );
    let deploy: Value = serde_json::from_str(&lab.kubectl(&[
        "get",
        "deployment",
        "-n",
        SYSTEM_NAMESPACE,
        "aliaslb-controller",
        "-o",
        "json",
    ])?)
    .map_err(|e| Error::Output {
        cmd: "kubectl get deployment".to_owned(),
        why: e.to_string(),
    })?;
    assert_eq!(
        deploy["spec"]["template"]["spec"]["containers"][0]["image"],
        "ghcr.io/aliaslb/aliaslb:0.1.1",
        "the upgrade changed the image"
    );

    // Uninstall: the release's objects go; the kubelet would then stop the agents (SIGTERM),
    // which take their addresses off the nodes.
    helm.run(&["uninstall", RELEASE])?;
    for n in NODES {
        lab.stop(&format!("agent-{n}"))?;
    }
    lab.stop("controller-2")?;
    wait_for(
        "the release's objects to go",
        Duration::from_secs(60),
        || {
            let left = live(&lab, &manifest)?;
            Ok(if left.is_empty() {
                Ok(())
            } else {
                Err(format!("{left:?}"))
            })
        },
    )?;
    let left: Vec<(u8, BTreeSet<Ipv4Addr>)> = NODES
        .into_iter()
        .map(|n| aliases(n).map(|a| (n, a)))
        .collect::<Result<_, _>>()?;
    assert!(
        left.iter().all(|(_, a)| a.is_empty()),
        "addresses left on the nodes: {left:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
