//! The upgrade from the previous release to this one and back, on real kubelets (issue 46):
//! the way docs/operations.md, "Upgrade", says, agents first, then the controller, with the
//! LAN sampled all along ([`aliaslb_e2e::lan`]: who answers ARP for each load-balancer IP,
//! every 20 ms, from the client's namespace). This is the test that keeps every later change
//! of a format between controller and agents honest.
//!
//! The previous release is `scripts/previous-release`'s: the newest tag before HEAD, or while
//! none is tagged the last commit of main before the release tooling; its image is built
//! from that commit once and cached by commit, and so is its install manifest (its
//! manifests/ rendered with its image pinned). This release is the binaries of this run
//! (`scripts/image`). Both images are imported into the nodes' containerd.
//!
//! Two paths, on one cluster:
//! 1. **helm**: `helm install` of this chart with the previous image; Services spread over
//!    the three nodes; `helm upgrade` to this release's image for the agents
//!    (`agent.image`), then for the controller (`controller.image`); then back down, the
//!    controller first, then the agents. After each step the DaemonSet or the Deployment has
//!    rolled out completely and the pods run the image said; the agents' Leases carry the
//!    version label exactly while this release's agents run (the previous release writes
//!    none), and their `/metrics` has `aliaslb_build_info`.
//! 2. **kubectl**: `helm uninstall`, then `kubectl apply -f` of the previous release's
//!    manifest; Services; this release's `aliaslb.yaml` (scripts/release-manifests, the image
//!    this run's) applied agents first (`-l 'app.kubernetes.io/name!=aliaslb-controller'`),
//!    then whole; then the previous manifest back, the controller first
//!    (`-l app.kubernetes.io/name=aliaslb-controller`), then whole.
//!
//! Verdicts per path, over the whole sampled window: no round in which two MACs answer for
//! an IP (outside the yield window of a move, [`aliaslb_e2e::lan::YIELD_BOUND`]); no IP
//! unanswered longer than [`MAX_UNANSWERED`]; every Service keeps its IP (none renumbered).
//! IPs may move between nodes: each agent's rollout SIGTERMs it, which moves its node's IPs
//! gracefully (break-before-make). Needs root, the binaries and helm:
//!
//! ```sh
//! cargo build --workspace --bins && cargo test -p aliaslb-e2e --test release_upgrade -- --nocapture
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use aliaslb_e2e::Error;
use aliaslb_e2e::fixtures::{lb_service, namespace};
use aliaslb_e2e::kubelets::{Cluster, name_and_tag, read_trimmed, repo_root};
use aliaslb_e2e::lab::{
    AGENT_NAMESPACE, NODES, SYSTEM_NAMESPACE, helm_binary, node_ip, run, wait_for,
};
use aliaslb_e2e::lan::{LanRecord, LanSampler, LanViolation, name_macs};

const RELEASE: &str = "aliaslb";
/// The helm path's Services and their pool.
const NS: &str = "upgrade-e2e";
const POOL: [&str; 3] = ["192.168.55.40", "192.168.55.41", "192.168.55.42"];
/// The kubectl path's Services: in `default`, whose pool the release manifests' example
/// pools.yaml gives (192.168.55.10-12).
const MANIFEST_NS: &str = "default";
const SERVICES: [&str; 3] = ["up-a", "up-b", "up-c"];
const ANNOUNCE_TIMEOUT: Duration = Duration::from_secs(60);
/// The longest an IP may go unanswered on the LAN during the upgrade: one graceful move
/// (an agent's SIGTERM: it takes its addresses down and releases its Lease; the controller
/// elects another node, whose agent adds and announces them), as e2e/tests/install.rs
/// bounds a deleted agent pod's move. Judged as the sampler saw it
/// ([`aliaslb_e2e::lan::Silence::longest_sampled`]: a stall of the sampler itself, when it
/// asked nobody, counts for at most 100 ms); the stretch with the stalls is printed too.
const MAX_UNANSWERED: Duration = Duration::from_secs(1);
/// The agents' Lease label with their release (this release writes it; the previous none).
const VERSION_LABEL: &str = "aliaslb.io/agent-version";

#[test]
fn upgrade_from_the_previous_release_and_back() -> Result<(), Error> {
    let Some(c) = Cluster::up("release-upgrade")? else {
        return Ok(());
    };
    let t0 = Instant::now();
    let previous = PathBuf::from(
        run(Command::new("bash").arg(repo_root().join("scripts/previous-release")))?
            .lines()
            .last()
            .unwrap_or_default()
            .trim(),
    );
    c.import(&previous)?;
    let old = Release {
        image: read_trimmed(&previous.join("aliaslb.ref"))?,
        manifest: previous.join("aliaslb.yaml"),
    };
    println!(
        "[release-upgrade] previous release {} ({}) ready and imported in {:.1} s",
        read_trimmed(&previous.join("commit"))?,
        old.image,
        t0.elapsed().as_secs_f64()
    );
    let dir = c.lab.state_dir().join("release-upgrade");
    std::fs::create_dir_all(&dir).map_err(|source| Error::Io {
        what: format!("creating {}", dir.display()),
        source,
    })?;
    run(Command::new("bash")
        .arg(repo_root().join("scripts/release-manifests"))
        .args([env!("CARGO_PKG_VERSION"), &dir.display().to_string()])
        .args(["--image", &c.image]))?;
    let new = Release {
        image: c.image.clone(),
        manifest: dir.join("aliaslb.yaml"),
    };
    let helm = Helm {
        bin: helm_binary()?,
        kubeconfig: c.lab.admin_kubeconfig().to_owned(),
    };
    let outcome =
        helm_path(&c, &helm, &dir, &old, &new).and_then(|()| kubectl_path(&c, &old, &new));
    if let Err(e) = &outcome {
        eprintln!("---- the cluster ({e}) ----\n{}", c.diagnostics());
    }
    outcome
}

/// A release: its image and its install manifest (`aliaslb.yaml`).
struct Release {
    image: String,
    manifest: PathBuf,
}

/// helm as the lab's admin, the release in aliaslb-system.
struct Helm {
    bin: PathBuf,
    kubeconfig: PathBuf,
}

impl Helm {
    fn run(&self, args: &[&str]) -> Result<String, Error> {
        run(Command::new(&self.bin)
            .args(args)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(["--namespace", SYSTEM_NAMESPACE]))
    }
}

/// One step of an upgrade: its name, and how long it took until everything rolled out.
type Steps = Vec<(&'static str, Duration)>;

fn helm_path(
    c: &Cluster,
    helm: &Helm,
    dir: &Path,
    old: &Release,
    new: &Release,
) -> Result<(), Error> {
    let chart = repo_root().join("charts/aliaslb").display().to_string();
    let (old_repo, old_tag) = name_and_tag(&old.image)?;
    let (new_repo, new_tag) = name_and_tag(&new.image)?;
    let values = dir.join("values.yaml");
    let mut pool = String::new();
    for ip in POOL {
        pool.push_str(&format!("    {ip}\n"));
    }
    std::fs::write(
        &values,
        format!(
            "image:\n  repository: {old_repo}\n  tag: {old_tag}\npools:\n  default: null\n  {NS}: |\n{pool}"
        ),
    )
    .map_err(|source| Error::Io {
        what: format!("writing {}", values.display()),
        source,
    })?;
    let values = values.display().to_string();

    // The previous release, installed with this chart.
    let t0 = Instant::now();
    helm.run(&[
        "install",
        RELEASE,
        &chart,
        "--create-namespace",
        "-f",
        &values,
    ])?;
    c.wait_rolled_out()?;
    expect_images(c, &old.image, &old.image)?;
    // The previous release's agents say no version: this is really the previous build.
    expect_agent_version(c, false)?;
    println!(
        "[release-upgrade] helm install of the previous release: rolled out in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    c.lab.apply(&namespace(NS))?;
    let before = services(c, NS)?;

    let sampler = LanSampler::start(before.values().copied())?;
    let t_sampling = Instant::now();
    std::thread::sleep(Duration::from_secs(1));
    let mut steps = Steps::new();
    let set = |component: &str, repo: &str, tag: &str| -> Vec<String> {
        vec![
            format!("{component}.image.repository={repo}"),
            format!("{component}.image.tag={tag}"),
        ]
    };
    let upgrade = |sets: Vec<String>| -> Result<(), Error> {
        let mut args = vec!["upgrade", RELEASE, chart.as_str(), "--reuse-values"];
        for s in &sets {
            args.extend(["--set", s.as_str()]);
        }
        helm.run(&args).map(drop)
    };
    // Up: agents first, then the controller.
    step(c, &mut steps, "helm: agents up", Workload::Agents, || {
        upgrade(set("agent", new_repo, new_tag))
    })?;
    expect_images(c, &new.image, &old.image)?;
    expect_agent_version(c, true)?;
    step(
        c,
        &mut steps,
        "helm: controller up",
        Workload::Controller,
        || upgrade(set("controller", new_repo, new_tag)),
    )?;
    expect_images(c, &new.image, &new.image)?;
    // Down: the controller first, then the agents.
    step(
        c,
        &mut steps,
        "helm: controller down",
        Workload::Controller,
        || upgrade(set("controller", old_repo, old_tag)),
    )?;
    expect_images(c, &new.image, &old.image)?;
    step(c, &mut steps, "helm: agents down", Workload::Agents, || {
        upgrade(set("agent", old_repo, old_tag))
    })?;
    expect_images(c, &old.image, &old.image)?;
    expect_agent_version(c, false)?;
    std::thread::sleep(Duration::from_secs(1));
    let record = sampler.finish()?;
    judge(c, "helm", &record, t_sampling, &steps, NS, &before)?;

    // Gone again: the Services' pool goes with the release.
    helm.run(&["uninstall", RELEASE, "--wait", "--timeout", "120s"])?;
    c.lab
        .kubectl(&["delete", "namespace", NS, "--wait=true", "--timeout=120s"])?;
    Ok(())
}

fn kubectl_path(c: &Cluster, old: &Release, new: &Release) -> Result<(), Error> {
    let old_manifest = old.manifest.display().to_string();
    let new_manifest = new.manifest.display().to_string();
    let t0 = Instant::now();
    c.lab.kubectl(&["apply", "-f", &old_manifest])?;
    c.wait_rolled_out()?;
    expect_images(c, &old.image, &old.image)?;
    println!(
        "[release-upgrade] kubectl apply -f of the previous release's manifest: rolled out in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    let before = services(c, MANIFEST_NS)?;
    let sampler = LanSampler::start(before.values().copied())?;
    let t_sampling = Instant::now();
    std::thread::sleep(Duration::from_secs(1));
    let mut steps = Steps::new();
    let apply = |manifest: &str, selector: Option<&str>| -> Result<(), Error> {
        let mut args = vec!["apply", "-f", manifest];
        if let Some(s) = selector {
            args.extend(["-l", s]);
        }
        c.lab.kubectl(&args).map(drop)
    };
    step(
        c,
        &mut steps,
        "kubectl: agents up",
        Workload::Agents,
        || {
            apply(
                &new_manifest,
                Some("app.kubernetes.io/name!=aliaslb-controller"),
            )
        },
    )?;
    expect_images(c, &new.image, &old.image)?;
    expect_agent_version(c, true)?;
    step(
        c,
        &mut steps,
        "kubectl: controller up",
        Workload::Controller,
        || apply(&new_manifest, None),
    )?;
    expect_images(c, &new.image, &new.image)?;
    c.lab.kubectl(&[
        "get",
        "poddisruptionbudget",
        "-n",
        SYSTEM_NAMESPACE,
        "aliaslb-controller",
    ])?;
    step(
        c,
        &mut steps,
        "kubectl: controller down",
        Workload::Controller,
        || {
            apply(
                &old_manifest,
                Some("app.kubernetes.io/name=aliaslb-controller"),
            )
        },
    )?;
    expect_images(c, &new.image, &old.image)?;
    step(
        c,
        &mut steps,
        "kubectl: agents down",
        Workload::Agents,
        || apply(&old_manifest, None),
    )?;
    expect_images(c, &old.image, &old.image)?;
    expect_agent_version(c, false)?;
    std::thread::sleep(Duration::from_secs(1));
    let record = sampler.finish()?;
    judge(
        c,
        "kubectl",
        &record,
        t_sampling,
        &steps,
        MANIFEST_NS,
        &before,
    )
}

/// What a step rolls out.
#[derive(Debug, Clone, Copy)]
enum Workload {
    Agents,
    Controller,
}

/// Runs `change`, waits for its rollout (`kubectl rollout status`) and for everything to be
/// rolled out and Ready, and records how long that took.
fn step(
    c: &Cluster,
    steps: &mut Steps,
    what: &'static str,
    workload: Workload,
    change: impl FnOnce() -> Result<(), Error>,
) -> Result<(), Error> {
    let t0 = Instant::now();
    change()?;
    let target = match workload {
        Workload::Agents => "daemonset/aliaslb-agent",
        Workload::Controller => "deployment/aliaslb-controller",
    };
    c.lab.kubectl(&[
        "rollout",
        "status",
        target,
        "-n",
        SYSTEM_NAMESPACE,
        "--timeout=180s",
    ])?;
    c.wait_rolled_out()?;
    if matches!(workload, Workload::Controller) {
        c.wait_new_leader(None, Duration::from_secs(30))?;
    }
    let took = t0.elapsed();
    println!(
        "[release-upgrade] {what}: rolled out in {:.1} s",
        took.as_secs_f64()
    );
    steps.push((what, took));
    Ok(())
}

/// Creates [`SERVICES`] in `ns` (the namespace first, unless it is `default`) and waits
/// until each is announced and answered on the LAN: name -> IP.
fn services(c: &Cluster, ns: &str) -> Result<BTreeMap<&'static str, Ipv4Addr>, Error> {
    let mut out = BTreeMap::new();
    for name in SERVICES {
        c.lab.apply(&lb_service(ns, name).to_yaml())?;
    }
    for name in SERVICES {
        let (ip, node) = c.lab.wait_announced(ns, name, ANNOUNCE_TIMEOUT)?;
        println!("[release-upgrade] {ns}/{name}: {ip} on node {node}");
        out.insert(name, ip);
    }
    Ok(out)
}

/// Asserts that every agent pod runs `agents` and every controller pod `controller`.
fn expect_images(c: &Cluster, agents: &str, controller: &str) -> Result<(), Error> {
    for (app, want) in [
        ("aliaslb-agent", agents),
        ("aliaslb-controller", controller),
    ] {
        let images: BTreeSet<String> = c
            .pods(app)?
            .iter()
            .filter_map(|p| {
                p["spec"]["containers"][0]["image"]
                    .as_str()
                    .map(str::to_owned)
            })
            .collect();
        assert_eq!(images, BTreeSet::from([want.to_owned()]), "{app}");
    }
    Ok(())
}

/// Asserts that every agent's Lease carries this release's version label (`true`, this
/// release's agents run) or none (the previous release's), and that each agent's
/// `/metrics` has `aliaslb_build_info` with this version exactly then.
fn expect_agent_version(c: &Cluster, ours: bool) -> Result<(), Error> {
    let version = env!("CARGO_PKG_VERSION");
    wait_for(
        "the agents' Leases to say their release",
        Duration::from_secs(30),
        || {
            let leases = c.lab.get_json(&["leases", "-n", AGENT_NAMESPACE])?;
            let labels: Vec<Option<String>> = leases["items"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|l| l["spec"]["holderIdentity"].is_string())
                .map(|l| {
                    l["metadata"]["labels"][VERSION_LABEL]
                        .as_str()
                        .map(str::to_owned)
                })
                .collect();
            let want = if ours { Some(version.to_owned()) } else { None };
            Ok(
                if labels.len() == NODES.len() && labels.iter().all(|l| *l == want) {
                    Ok(())
                } else {
                    Err(format!("{labels:?}"))
                },
            )
        },
    )?;
    for n in NODES {
        let url = format!("http://{}:9101/metrics", node_ip(n));
        let metrics = c
            .lab
            .exec("client", &["curl", "-sf", "--max-time", "5", &url])?;
        let info = format!("aliaslb_build_info{{version=\"{version}\",commit=");
        assert_eq!(
            metrics.contains(&info),
            ours,
            "node {n}: {info} in its agent's /metrics"
        );
    }
    Ok(())
}

/// The LAN verdicts of one path (see the module docs), with its figures printed.
fn judge(
    c: &Cluster,
    path: &str,
    record: &LanRecord,
    t0: Instant,
    steps: &Steps,
    ns: &str,
    before: &BTreeMap<&'static str, Ipv4Addr>,
) -> Result<(), Error> {
    let names = c.lab.mac_names()?;
    let end = record.samples.last().map_or(t0, |s| s.at) + Duration::from_millis(1);
    let mut problems = Vec::new();
    let mut stalls = 0;
    for v in record.violations() {
        match v {
            LanViolation::Stall { .. } => stalls += 1,
            double @ LanViolation::Double { .. } => problems.push(double.describe(t0, &names)),
        }
    }
    for (name, ip) in before {
        let silence = record.silence(*ip, t0, end);
        let macs = record.macs_for(*ip);
        println!(
            "[release-upgrade] {path}: {ns}/{name} {ip}: longest unanswered {:.2} s ({:.2} s with the sampler's stalls; {} of {} rounds unanswered), answered by {}",
            silence.longest_sampled.as_secs_f64(),
            silence.longest.as_secs_f64(),
            silence.silent,
            silence.rounds,
            name_macs(&macs, &names)
        );
        if silence.longest_sampled > MAX_UNANSWERED {
            problems.push(format!(
                "{ip} unanswered for {:.2} s from {:.1} s (bound {MAX_UNANSWERED:?})",
                silence.longest_sampled.as_secs_f64(),
                silence
                    .longest_at
                    .map_or(0.0, |at| at.saturating_duration_since(t0).as_secs_f64())
            ));
        }
        if silence.rounds < 100 {
            problems.push(format!("{ip}: only {} rounds sampled", silence.rounds));
        }
        let now = c.lab.service(ns, name)?.assignment().map(|(ip, _)| ip);
        if now != Some(*ip) {
            problems.push(format!("{ns}/{name} was {ip}, now {now:?}: renumbered"));
        }
    }
    let total: Duration = steps.iter().map(|(_, d)| *d).sum();
    println!(
        "[release-upgrade] {path}: {} steps in {:.1} s, LAN sampled {:.1} s ({} rounds, {} gaps between rounds over 100 ms of which {stalls} unjudged, the longest {} ms)",
        steps.len(),
        total.as_secs_f64(),
        end.saturating_duration_since(t0).as_secs_f64(),
        record.samples.len(),
        record.stalls(),
        record.max_gap().as_millis()
    );
    assert!(
        problems.is_empty(),
        "the {path} upgrade and downgrade:\n  {}",
        problems.join("\n  ")
    );
    Ok(())
}
