//! MetalLB measured beside aliaslb, in one run, in the same netns lab, against the same
//! Service (BENCHMARKS.md, "MetalLB beside aliaslb"). Not a test: it takes minutes, and it
//! builds MetalLB (`scripts/metallb`, which names the release; nothing of MetalLB is in this
//! repository). kube-vip is not measured: its Go module is not served by the module proxy
//! this machine reaches.
//!
//! First run (2026-12-07): one trial per fault, 300 Services, figures in BENCHMARKS.md
//! ("MetalLB beside aliaslb"); more trials and 1,000 Services are still to be run.
//!
//! For each system, on a fresh lab (`scripts/lab up`: three nodes, kube-proxy, the two pods,
//! the client on the LAN):
//! - **install**: aliaslb as the e2e tests run it (controller on the host, an agent per
//!   node, fast failover on); MetalLB in L2 mode as its manifests run it, minus the pods:
//!   its CRDs, an `IPAddressPool` and an `L2Advertisement`, its controller on the host
//!   (`--webhook-mode=disabled`) and a speaker per node in the node's namespace with
//!   memberlist on (`METALLB_ML_BIND_ADDR` = the node's LAN address, `METALLB_ML_LABELS`,
//!   a secret key). The speakers find each other by listing their Pods: the lab has no
//!   kubelet, so a Pod object per speaker is created through the API with its `podIP` (the
//!   node's address), `Running` and `Ready` set through the status subresource, as a
//!   kubelet would;
//! - **idle memory**: the resident set (`VmRSS`) of the controller and of each agent /
//!   speaker, 10 s after start, no Service;
//! - **create → first answer**: the Service `bench/web` (type LoadBalancer, endpoints on the
//!   lab's two pods, the one address 192.168.55.70 in each system's pool), from `kubectl
//!   apply` to the client's first HTTP answer on that address;
//! - for each fault, `--trials` times, with the client probing every 50 ms and the LAN
//!   sampled every 20 ms (ARP requests from the client: which MACs answer): from the fault
//!   to the first answer forwarded by another node than the holder, and the longest run of
//!   LAN rounds in which two MACs answered for the address. **Hard loss**: the holder's
//!   agent / speaker SIGKILLed and its LAN cable pulled at once (then plugged back and the
//!   process restarted; whether the address then moves back is reported). **Cordon** and
//!   **the exclude label** (`node.kubernetes.io/exclude-from-external-load-balancers`) on
//!   the holder (then removed). A system that does not move the address within
//!   `--move-timeout` reports "not moved", and whether the client was answered meanwhile;
//! - **memory with `--services` Services** (1,000 by default, on a second subnet the bench
//!   adds to the nodes, 10.210.0.0/22, one Endpoints object each on the same pods): once
//!   every one has its address (and, for aliaslb, is announced), the resident set of each
//!   process again, and its peak (`VmHWM`).
//!
//! Needs root, the lab's tools, Go (for `scripts/metallb`) and the built binaries:
//!
//! ```sh
//! cargo build -p aliaslb-agent -p aliaslb-controller --bins
//! cargo run -p aliaslb-e2e --example metallb_beside -- --trials 3 --services 1000
//! ```

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use aliaslb_e2e::Error;
use aliaslb_e2e::client::RecoveryProbe;
use aliaslb_e2e::fixtures::{lb_service, namespace};
use aliaslb_e2e::lab::{Lab, NODES, node_ip, node_name, run, run_with_input, wait_for};
use aliaslb_e2e::lan::LanSampler;
use aliaslb_e2e::trials::{EXCLUDE_LABEL, Summary, TwoMacs};
use clap::Parser;

/// The bench's namespace, its Service and the Service's address.
const NS: &str = "bench";
const SERVICE: &str = "web";
const IP: Ipv4Addr = Ipv4Addr::new(192, 168, 55, 70);
/// The namespace of the many Services of the memory figure, and their addresses (in
/// 10.210.0.0/22, a subnet the bench adds to every node: 10.210.3.25N on node N).
const MANY_NS: &str = "bench-many";
const MANY_FIRST: &str = "10.210.0.1";
const MANY_LAST: &str = "10.210.3.232";
/// MetalLB's namespace and the labels of its speakers' Pods (its manifests').
const METALLB_NS: &str = "metallb-system";
const SPEAKER_LABELS: &str = "app=metallb,component=speaker";

#[derive(Debug, Parser)]
struct Args {
    /// Trials of each fault.
    #[arg(long, default_value_t = 3)]
    trials: usize,
    /// Services for the memory figure.
    #[arg(long, default_value_t = 1000)]
    services: usize,
    /// How long a fault may take to move the address before it counts as not moved.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    move_timeout: Duration,
    /// Measure only this system (both by default).
    #[arg(long, value_enum)]
    only: Option<System>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum System {
    Aliaslb,
    Metallb,
}

impl System {
    fn name(self) -> &'static str {
        match self {
            System::Aliaslb => "aliaslb",
            System::Metallb => "MetalLB",
        }
    }

    /// The lab process of node `n`'s agent or speaker.
    fn node_process(self, n: u8) -> String {
        match self {
            System::Aliaslb => format!("agent-{n}"),
            System::Metallb => format!("speaker-{n}"),
        }
    }

    /// The lab process of the controller.
    fn controller(self) -> &'static str {
        match self {
            System::Aliaslb => "controller-1",
            System::Metallb => "metallb-controller",
        }
    }
}

/// One fault's outcome.
#[derive(Debug, Clone)]
struct Outcome {
    /// From the fault to the first answer through another node; `None`: not moved within
    /// the timeout.
    moved: Option<Duration>,
    /// Probes that got no answer while waiting.
    failed: u32,
    /// Two MACs on the LAN for the address.
    two_macs: TwoMacs,
    /// After the fault was undone: the address went back to the old holder.
    moved_back: bool,
}

/// Everything measured of one system.
#[derive(Debug, Default)]
struct Figures {
    idle: BTreeMap<String, u64>,
    create_to_answer: Option<Duration>,
    faults: BTreeMap<&'static str, Vec<Outcome>>,
    loaded: BTreeMap<String, (u64, u64)>,
    version: String,
}

fn main() -> Result<(), Error> {
    let args = Args::parse();
    let metallb = match args.only {
        Some(System::Aliaslb) => None,
        _ => Some(build_metallb()?),
    };
    let mut results = Vec::new();
    for system in [System::Aliaslb, System::Metallb] {
        if args.only.is_some_and(|o| o != system) {
            continue;
        }
        println!("==== {} ====", system.name());
        results.push((system, measure(system, metallb.as_deref(), &args)?));
    }
    print_report(&results, &args);
    Ok(())
}

/// `scripts/metallb`: the folder with MetalLB's binaries and CRDs.
fn build_metallb() -> Result<PathBuf, Error> {
    let script = repo().join("scripts/metallb");
    let out = run(Command::new("bash").arg(&script))?;
    let dir = out.lines().last().unwrap_or_default().trim();
    Ok(PathBuf::from(dir))
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// One system, measured on a lab of its own.
fn measure(system: System, metallb: Option<&Path>, args: &Args) -> Result<Figures, Error> {
    let mut figures = Figures::default();
    let lab = match system {
        System::Aliaslb => Lab::up()?,
        System::Metallb => Lab::up_bare()?,
    };
    let Some(lab) = lab else {
        return Err(Error::Environment("the lab needs root".to_owned()));
    };
    lab.apply(&namespace(NS))?;
    lab.apply(&namespace(MANY_NS))?;
    // The many Services' subnet on every node, so that each system can place them.
    for n in NODES {
        run(Command::new("ip").args([
            "-n",
            &node_name(n),
            "addr",
            "add",
            &format!("10.210.3.25{n}/22"),
            "dev",
            "eth0",
        ]))?;
    }
    match system {
        System::Aliaslb => {
            lab.add_pool(NS, &[&IP.to_string()])?;
            lab.add_pool(MANY_NS, &[&format!("{MANY_FIRST}-{MANY_LAST}")])?;
            figures.version = format!("aliaslb {}", env!("CARGO_PKG_VERSION"));
        }
        System::Metallb => {
            let dir = metallb.ok_or_else(|| Error::Environment("MetalLB not built".into()))?;
            install_metallb(&lab, dir)?;
            figures.version = format!(
                "MetalLB {}",
                run(Command::new("bash")
                    .arg(repo().join("scripts/metallb"))
                    .arg("--version"))?
                .trim()
            );
        }
    }
    std::thread::sleep(Duration::from_secs(10));
    figures.idle = memory(&lab, system)?
        .into_iter()
        .map(|(k, (rss, _))| (k, rss))
        .collect();
    println!("[bench] idle RSS (KiB): {:?}", figures.idle);

    // Create -> first answer.
    let probe = RecoveryProbe::start(IP, Duration::from_secs(60), |_| true);
    let created = Instant::now();
    lab.apply(&lb_service(NS, SERVICE).to_yaml())?;
    let first = probe.wait(created)?;
    figures.create_to_answer = Some(first.after);
    println!(
        "[bench] {}: create -> first answer {:.0} ms (via node {:?})",
        system.name(),
        first.after.as_secs_f64() * 1000.0,
        first.answer.via_node()
    );

    for fault in ["hard loss", "cordon", "exclude label"] {
        for trial in 0..args.trials {
            let outcome = one_fault(&lab, system, fault, args.move_timeout)?;
            println!(
                "[bench] {} {fault} #{}: moved {} ({} probes failed), two MACs longest {:?} over {} rounds, moved back after the undo: {}",
                system.name(),
                trial + 1,
                outcome.moved.map_or("no".to_owned(), |d| format!(
                    "after {:.0} ms",
                    d.as_secs_f64() * 1000.0
                )),
                outcome.failed,
                outcome.two_macs.longest,
                outcome.two_macs.rounds,
                outcome.moved_back
            );
            figures.faults.entry(fault).or_default().push(outcome);
        }
    }

    // Memory with many Services.
    let t0 = Instant::now();
    many_services(&lab, system, args.services)?;
    println!(
        "[bench] {} Services placed in {:.1} s",
        args.services,
        t0.elapsed().as_secs_f64()
    );
    std::thread::sleep(Duration::from_secs(15));
    figures.loaded = memory(&lab, system)?;
    println!(
        "[bench] RSS, peak (KiB) with {} Services: {:?}",
        args.services, figures.loaded
    );
    Ok(figures)
}

/// MetalLB in L2 mode on the lab (see the module docs).
fn install_metallb(lab: &Lab, dir: &Path) -> Result<(), Error> {
    lab.apply(&namespace(METALLB_NS))?;
    for entry in std::fs::read_dir(dir.join("crds")).map_err(|source| Error::Io {
        what: format!("reading {}", dir.display()),
        source,
    })? {
        let path = entry
            .map_err(|source| Error::Io {
                what: "a CRD file".into(),
                source,
            })?
            .path();
        lab.kubectl(&["apply", "--server-side", "-f", &path.to_string_lossy()])?;
    }
    lab.kubectl(&[
        "wait",
        "--for=condition=Established",
        "crd",
        "ipaddresspools.metallb.io",
        "l2advertisements.metallb.io",
        "--timeout=30s",
    ])?;
    lab.apply(&format!(
        "apiVersion: metallb.io/v1beta1
kind: IPAddressPool
metadata:
  name: lan
  namespace: {METALLB_NS}
spec:
  addresses: [\"{IP}/32\"]
---
apiVersion: metallb.io/v1beta1
kind: IPAddressPool
metadata:
  name: many
  namespace: {METALLB_NS}
spec:
  addresses: [\"{MANY_FIRST}-{MANY_LAST}\"]
  autoAssign: false
---
apiVersion: metallb.io/v1beta1
kind: L2Advertisement
metadata:
  name: l2
  namespace: {METALLB_NS}
"
    ))?;
    let kubeconfig = format!("KUBECONFIG={}", lab.admin_kubeconfig().display());
    let bin = |name: &str| dir.join("bin").join(name).to_string_lossy().into_owned();
    let controller = bin("controller");
    lab.spawn(
        "metallb-controller",
        "host",
        &[
            "env",
            &kubeconfig,
            &format!("METALLB_NAMESPACE={METALLB_NS}"),
            &controller,
            "--webhook-mode=disabled",
            "--disable-cert-rotation",
            "--port=17472",
        ],
    )?;
    // The memberlist key the manifests generate into a Secret: any string.
    let secret = format!(
        "aliaslb-bench-{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    );
    for n in NODES {
        let pod = format!(
            "apiVersion: v1
kind: Pod
metadata:
  name: speaker-{n}
  namespace: {METALLB_NS}
  labels: {{app: metallb, component: speaker}}
spec:
  nodeName: {node}
  hostNetwork: true
  containers:
  - name: speaker
    image: quay.io/metallb/speaker:bench
",
            node = node_name(n)
        );
        lab.apply(&pod)?;
        let status = format!(
            "{{\"status\":{{\"phase\":\"Running\",\"podIP\":\"{ip}\",\"podIPs\":[{{\"ip\":\"{ip}\"}}],\"hostIP\":\"{ip}\",\"conditions\":[{{\"type\":\"Ready\",\"status\":\"True\"}}]}}}}",
            ip = node_ip(n)
        );
        lab.kubectl(&[
            "patch",
            "pod",
            "-n",
            METALLB_NS,
            &format!("speaker-{n}"),
            "--subresource=status",
            "--type=merge",
            "-p",
            &status,
        ])?;
    }
    for n in NODES {
        start_speaker(lab, dir, n, &secret)?;
    }
    Ok(())
}

/// Starts node `n`'s MetalLB speaker in its namespace.
fn start_speaker(lab: &Lab, dir: &Path, n: u8, secret: &str) -> Result<(), Error> {
    let kubeconfig = format!("KUBECONFIG={}", lab.admin_kubeconfig().display());
    let speaker = dir.join("bin/speaker").to_string_lossy().into_owned();
    let ip = node_ip(n).to_string();
    lab.spawn(
        &format!("speaker-{n}"),
        &format!("node-{n}"),
        &[
            "env",
            &kubeconfig,
            &format!("METALLB_NODE_NAME={}", node_name(n)),
            &format!("METALLB_HOST={ip}"),
            &format!("METALLB_ML_BIND_ADDR={ip}"),
            &format!("METALLB_ML_LABELS={SPEAKER_LABELS}"),
            &format!("METALLB_ML_SECRET_KEY={secret}"),
            &format!("METALLB_NAMESPACE={METALLB_NS}"),
            &speaker,
            "--port=17472",
        ],
    )
}

/// The node holding the address now: the one that forwards the client's request.
fn holder() -> Result<u8, Error> {
    wait_for("the Service to answer", Duration::from_secs(60), || {
        Ok(match aliaslb_e2e::client::get(IP)? {
            Ok(answer) => answer.via_node().ok_or_else(|| format!("{answer:?}")),
            Err(e) => Err(e),
        })
    })
}

/// One fault on the holder, measured and undone.
fn one_fault(lab: &Lab, system: System, fault: &str, timeout: Duration) -> Result<Outcome, Error> {
    let old = holder()?;
    // Settled: the same node for a few seconds.
    std::thread::sleep(Duration::from_secs(3));
    let old = if holder()? == old { old } else { holder()? };
    let lan = LanSampler::start([IP])?;
    std::thread::sleep(Duration::from_millis(500));
    let probe = RecoveryProbe::start(IP, timeout, move |a| a.via_node().is_some_and(|n| n != old));
    let at = Instant::now();
    let process = system.node_process(old);
    match fault {
        "hard loss" => {
            lab.kill(&process)?;
            lab.unplug(old)?;
        }
        "cordon" => {
            lab.kubectl(&["cordon", &node_name(old)])?;
        }
        _ => {
            lab.kubectl(&[
                "label",
                "node",
                &node_name(old),
                &format!("{EXCLUDE_LABEL}=true"),
            ])?;
        }
    }
    let recovery = probe.wait(at);
    let (moved, failed) = match &recovery {
        Ok(r) => (Some(r.after), r.failed),
        // Still answered by the old node, or not at all: the prober counted the latter.
        Err(Error::Timeout { what, .. }) => (None, failures_in(what)),
        Err(e) => return Err(Error::Environment(format!("probing {IP}: {e}"))),
    };
    // A second more on the LAN after the move, for late answers of the old holder.
    std::thread::sleep(Duration::from_secs(1));
    let record = lan.finish()?;
    let two_macs = TwoMacs::of(&record.since(at), IP);
    // Undo.
    match fault {
        "hard loss" => {
            lab.plug(old)?;
            match system {
                System::Aliaslb => {
                    lab.start_agent(old)?;
                    lab.wait_agent_lease(old, Duration::from_secs(20))?;
                }
                System::Metallb => {
                    let secret = speaker_secret(lab, old)?;
                    start_speaker(lab, &metallb_dir(lab)?, old, &secret)?;
                }
            }
        }
        "cordon" => {
            lab.kubectl(&["uncordon", &node_name(old)])?;
        }
        _ => {
            lab.kubectl(&[
                "label",
                "node",
                &node_name(old),
                &format!("{EXCLUDE_LABEL}-"),
            ])?;
        }
    }
    // Does the address go back to the old holder once it is back (fail-back)?
    std::thread::sleep(Duration::from_secs(10));
    let moved_back = moved.is_some() && holder()? == old;
    Ok(Outcome {
        moved,
        failed,
        two_macs,
        moved_back,
    })
}

/// The probes without an answer of a prober that gave up (its error says "(N probes
/// failed)"; the others were answered, by the old holder).
fn failures_in(what: &str) -> u32 {
    what.rsplit_once('(')
        .and_then(|(_, tail)| tail.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// The memberlist key the speakers were started with (from the running one's command line).
fn speaker_secret(lab: &Lab, n: u8) -> Result<String, Error> {
    let other = NODES.into_iter().find(|&o| o != n).unwrap_or(1);
    let pid = lab.pid(&format!("speaker-{other}"))?;
    let environ = std::fs::read(format!("/proc/{pid}/environ")).map_err(|source| Error::Io {
        what: format!("reading the environment of speaker-{other}"),
        source,
    })?;
    environ
        .split(|b| *b == 0)
        .filter_map(|kv| std::str::from_utf8(kv).ok())
        .find_map(|kv| kv.strip_prefix("METALLB_ML_SECRET_KEY=").map(str::to_owned))
        .ok_or_else(|| Error::Environment("no METALLB_ML_SECRET_KEY in a speaker".into()))
}

/// MetalLB's folder, from the running controller's executable.
fn metallb_dir(lab: &Lab) -> Result<PathBuf, Error> {
    let pid = lab.pid("metallb-controller")?;
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).map_err(|source| Error::Io {
        what: "the MetalLB controller's executable".into(),
        source,
    })?;
    exe.parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .ok_or_else(|| Error::Environment(format!("{} has no folder", exe.display())))
}

/// `count` Services in [`MANY_NS`] with endpoints on the lab's pods; waits until every one
/// has its address (aliaslb: and is announced).
fn many_services(lab: &Lab, system: System, count: usize) -> Result<(), Error> {
    let mut yaml = String::new();
    for i in 0..count {
        yaml += &lb_service(MANY_NS, &format!("s{i:04}"))
            .annotated("metallb.universe.tf/address-pool", "many")
            .to_yaml();
        yaml += "\n---\n";
    }
    run_with_input(
        Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(lab.admin_kubeconfig())
            .args(["apply", "--server-side", "-f", "-"]),
        Some(&yaml),
    )?;
    wait_for(
        &format!("{count} Services with an address"),
        Duration::from_secs(600),
        || {
            let list = lab.get_json(&["services", "-n", MANY_NS])?;
            let items = list["items"].as_array().cloned().unwrap_or_default();
            let placed = items
                .iter()
                .filter(|s| {
                    s["status"]["loadBalancer"]["ingress"][0]["ip"].is_string()
                        && (system == System::Metallb
                            || s["status"]["conditions"]
                                .as_array()
                                .into_iter()
                                .flatten()
                                .any(|c| {
                                    c["type"] == "aliaslb.io/Announced" && c["status"] == "True"
                                }))
                })
                .count();
            Ok(if placed >= count {
                Ok(())
            } else {
                Err(format!("{placed} of {count}"))
            })
        },
    )
}

/// Resident set and peak (KiB) of the controller and each node's process.
fn memory(lab: &Lab, system: System) -> Result<BTreeMap<String, (u64, u64)>, Error> {
    let mut out = BTreeMap::new();
    let names = std::iter::once(system.controller().to_owned())
        .chain(NODES.iter().map(|&n| system.node_process(n)));
    for name in names {
        let pid = lab.pid(&name)?;
        let status =
            std::fs::read_to_string(format!("/proc/{pid}/status")).map_err(|source| Error::Io {
                what: format!("reading the status of {name}"),
                source,
            })?;
        let field = |key: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
                .unwrap_or(0)
        };
        out.insert(name, (field("VmRSS:"), field("VmHWM:")));
    }
    Ok(out)
}

/// The report: one Markdown table, both systems side by side.
fn print_report(results: &[(System, Figures)], args: &Args) {
    let ms = |d: Duration| format!("{:.0} ms", d.as_secs_f64() * 1000.0);
    println!("\n## MetalLB beside aliaslb\n");
    let versions: Vec<&str> = results.iter().map(|(_, f)| f.version.as_str()).collect();
    println!(
        "{}, {} trials per fault\n",
        versions.join(", "),
        args.trials
    );
    let header: Vec<&str> = results.iter().map(|(s, _)| s.name()).collect();
    println!("| | {} |", header.join(" | "));
    println!("|---|{}", "---|".repeat(results.len()));
    let row = |label: &str, cell: &dyn Fn(&Figures) -> String| {
        let cells: Vec<String> = results.iter().map(|(_, f)| cell(f)).collect();
        println!("| {label} | {} |", cells.join(" | "));
    };
    row("create → first answer", &|f| {
        f.create_to_answer.map_or("-".into(), ms)
    });
    for fault in ["hard loss", "cordon", "exclude label"] {
        row(
            &format!("{fault} → answered by another node (p50 / max)"),
            &|f| {
                let outcomes = f.faults.get(fault).cloned().unwrap_or_default();
                let moved: Vec<Duration> = outcomes.iter().filter_map(|o| o.moved).collect();
                let not = outcomes.len() - moved.len();
                let mut text = match Summary::of(&moved) {
                    Some(s) => format!("{} / {}", ms(s.p50), ms(s.max)),
                    None => "not moved".to_owned(),
                };
                if not > 0 && !moved.is_empty() {
                    text += &format!(" ({not} not moved)");
                }
                if moved.is_empty() {
                    let failed: u32 = outcomes.iter().map(|o| o.failed).sum();
                    text += &format!(
                        " in {:?} ({failed} probes unanswered or by the old node)",
                        args.move_timeout
                    );
                }
                text
            },
        );
        row(
            &format!("{fault}: two MACs on the LAN (longest run)"),
            &|f| {
                let two = f
                    .faults
                    .get(fault)
                    .into_iter()
                    .flatten()
                    .fold(TwoMacs::default(), |a, o| a.merge(o.two_macs));
                format!("{} ({} rounds)", ms(two.longest), two.rounds)
            },
        );
        row(&format!("{fault}: moved back after the undo"), &|f| {
            let outcomes = f.faults.get(fault).cloned().unwrap_or_default();
            format!(
                "{} of {}",
                outcomes.iter().filter(|o| o.moved_back).count(),
                outcomes.len()
            )
        });
    }
    let mem = |label: &str, loaded: bool| {
        row(label, &|f| {
            let values: Vec<(String, u64)> = if loaded {
                f.loaded
                    .iter()
                    .map(|(k, (rss, _))| (k.clone(), *rss))
                    .collect()
            } else {
                f.idle.iter().map(|(k, v)| (k.clone(), *v)).collect()
            };
            values
                .iter()
                .map(|(k, v)| format!("{k} {:.1}", *v as f64 / 1024.0))
                .collect::<Vec<_>>()
                .join(", ")
                + " MiB"
        });
    };
    mem("RSS idle", false);
    mem(&format!("RSS with {} Services", args.services), true);
    row(&format!("peak RSS with {} Services", args.services), &|f| {
        f.loaded
            .iter()
            .map(|(k, (_, hwm))| format!("{k} {:.1}", *hwm as f64 / 1024.0))
            .collect::<Vec<_>>()
            .join(", ")
            + " MiB"
    });
}
