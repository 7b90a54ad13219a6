//! [`Lab`]: the netns lab of `scripts/lab` brought up for one test binary and torn down when
//! the guard drops (also on panic), with aliaslb's RBAC and pool ConfigMap applied and the
//! real binaries started under their own ServiceAccounts. Does I/O: runs `scripts/lab`,
//! `kubectl`, `ip` and `kill`.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::Error;
use crate::lan::Mac;

/// The lab's node numbers: node `N` is the namespace and Node `alb-node-N` at 192.168.55.10N.
pub const NODES: [u8; 3] = [1, 2, 3];
/// The client's namespace.
pub const CLIENT_NS: &str = "alb-client";
/// The client's address on the LAN.
pub const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 55, 200);
/// The namespace of the controller, its leader Lease, the node assignments and the pool
/// ConfigMap (manifests/).
pub const SYSTEM_NAMESPACE: &str = "aliaslb-system";
/// The namespace of the agents' Leases (manifests/).
pub const AGENT_NAMESPACE: &str = "aliaslb-agents";
/// Lease duration of the lab's agents (and the controller's freshness window): shorter
/// than the default (30 s) so that the suites which wait for a Lease to expire (API-only
/// partitions, the L3 cut-offs, killed agents without a standby) stay short. Renewed every
/// [`LEASE_RENEW`]; the aliases live 3 s either way (the default lifetime).
pub const LEASE_DURATION: Duration = Duration::from_secs(4);
/// The lab agents' `--renew-interval` under [`LEASE_DURATION`].
pub const LEASE_RENEW: Duration = Duration::from_secs(1);

/// The name of node `n`'s namespace and Node object.
pub fn node_name(n: u8) -> String {
    format!("alb-node-{n}")
}

/// Node `n`'s own LAN address.
pub fn node_ip(n: u8) -> Ipv4Addr {
    Ipv4Addr::new(192, 168, 55, 100 + n)
}

/// The node number of a Node name such as `alb-node-2`.
pub fn node_number(name: &str) -> Option<u8> {
    name.strip_prefix("alb-node-")?.parse().ok()
}

/// Runs `cmd`, returning its standard output; a failure carries the end of its stderr.
pub fn run(cmd: &mut Command) -> Result<String, Error> {
    run_with_input(cmd, None)
}

/// [`run`] with `input` on standard input.
pub fn run_with_input(cmd: &mut Command, input: Option<&str>) -> Result<String, Error> {
    let line = command_line(cmd);
    cmd.stdin(if input.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|source| Error::Spawn {
        cmd: line.clone(),
        source,
    })?;
    if let (Some(input), Some(mut stdin)) = (input, child.stdin.take()) {
        stdin
            .write_all(input.as_bytes())
            .map_err(|source| Error::Spawn {
                cmd: line.clone(),
                source,
            })?;
    }
    let out = child.wait_with_output().map_err(|source| Error::Spawn {
        cmd: line.clone(),
        source,
    })?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(15).collect();
        return Err(Error::Command {
            cmd: line,
            status: out.status,
            stderr: tail.into_iter().rev().collect::<Vec<_>>().join("\n"),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn command_line(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Polls `probe` every 100 ms until it yields a value; `Err(last)` from the probe means "not
/// yet" (and says what was seen), an outer `Err` stops at once.
pub fn wait_for<T>(
    what: &str,
    timeout: Duration,
    mut probe: impl FnMut() -> Result<Result<T, String>, Error>,
) -> Result<T, Error> {
    let start = Instant::now();
    loop {
        let last = match probe()? {
            Ok(value) => return Ok(value),
            Err(last) => last,
        };
        if start.elapsed() >= timeout {
            return Err(Error::Timeout {
                what: what.to_owned(),
                waited: timeout,
                last,
            });
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// One aliaslb condition of a Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceCondition {
    /// `True` or `False`.
    pub status: String,
    /// Machine-readable reason.
    pub reason: String,
    /// Human-readable message.
    pub message: String,
}

/// What aliaslb wrote on a Service, as read back from the API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceReadback {
    /// `status.loadBalancer.ingress[].ip`, the IPv4 ones.
    pub ips: Vec<Ipv4Addr>,
    /// `status.loadBalancer.ingress[].ip`, every family.
    pub all_ips: Vec<IpAddr>,
    /// The `aliaslb.io/node` annotation.
    pub node: Option<String>,
    /// Conditions by type.
    pub conditions: BTreeMap<String, ServiceCondition>,
}

impl ServiceReadback {
    /// Parses a Service as printed by `kubectl get -o json`.
    pub fn from_json(v: &Value) -> Self {
        let all_ips: Vec<IpAddr> = v["status"]["loadBalancer"]["ingress"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|i| i["ip"].as_str()?.parse().ok())
            .collect();
        let ips = all_ips
            .iter()
            .filter_map(|ip| match ip {
                IpAddr::V4(ip) => Some(*ip),
                IpAddr::V6(_) => None,
            })
            .collect();
        let node = v["metadata"]["annotations"]["aliaslb.io/node"]
            .as_str()
            .map(str::to_owned);
        let conditions = v["status"]["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| {
                let text = |k: &str| c[k].as_str().unwrap_or_default().to_owned();
                Some((
                    c["type"].as_str()?.to_owned(),
                    ServiceCondition {
                        status: text("status"),
                        reason: text("reason"),
                        message: text("message"),
                    },
                ))
            })
            .collect();
        ServiceReadback {
            ips,
            all_ips,
            node,
            conditions,
        }
    }

    /// The single IPv4 address and the node number, once both are written.
    pub fn assignment(&self) -> Option<(Ipv4Addr, u8)> {
        match (
            self.ips.as_slice(),
            self.node.as_deref().and_then(node_number),
        ) {
            ([ip], Some(node)) => Some((*ip, node)),
            _ => None,
        }
    }

    /// One line for diagnostics.
    pub fn summary(&self) -> String {
        let conditions: Vec<String> = self
            .conditions
            .iter()
            .map(|(t, c)| format!("{t}={} {} ({})", c.status, c.reason, c.message))
            .collect();
        format!(
            "ingress {:?}, node {:?}, conditions [{}]",
            self.ips,
            self.node,
            conditions.join("; ")
        )
    }
}

/// Node `n`'s IPv6 LAN address, `fd55::10N` (the lab is dual-stack).
pub fn node_ip6(n: u8) -> Ipv6Addr {
    Ipv6Addr::new(0xfd55, 0, 0, 0, 0, 0, 0, 0x100 + u16::from(n))
}

/// The client's IPv6 LAN address.
pub const CLIENT_IP6: Ipv6Addr = Ipv6Addr::new(0xfd55, 0, 0, 0, 0, 0, 0, 0x200);

/// The namespace of the foreign host of [`Lab::add_rogue`] (`scripts/lab down` removes it).
pub const ROGUE_NS: &str = "alb-rogue";
/// The foreign host's own LAN address.
pub const ROGUE_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 55, 250);
/// The nftables table of [`Lab::partition_api`] (the agent's own is `inet aliaslb`).
pub const PARTITION_TABLE: &str = "aliaslb_e2e_partition";

/// The nftables table of [`Lab::block_adverts`].
pub const ADVERTS_TABLE: &str = "aliaslb_e2e_adverts";
/// The UDP port of the agents' adverts (issue 24; the agent's `--advert-port` default).
pub const ADVERT_PORT: u16 = 7479;

/// The nftables table (family `bridge`, in the LAN's namespace) of [`Lab::partition_lan`].
pub const LAN_PARTITION_TABLE: &str = "aliaslb_e2e_lan";
/// The namespace of the LAN bridge `br0`, where each machine has its port (`node-N`, ...).
pub const LAN_NS: &str = "alb-lan";

/// The apiserver's port (`ALIASLB_LAB_API_PORT`, as `scripts/lab` reads it).
pub fn api_port() -> u16 {
    std::env::var("ALIASLB_LAB_API_PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(16443)
}

/// The port of controller `identity`'s relay: 16500 + the number ending the identity
/// (`controller-2` -> 16502).
pub fn controller_relay_port(identity: &str) -> Result<u16, Error> {
    identity
        .rsplit('-')
        .next()
        .and_then(|n| n.parse::<u16>().ok())
        .filter(|n| *n < 100)
        .map(|n| 16500 + n)
        .ok_or_else(|| {
            Error::Environment(format!(
                "controller identity {identity:?} does not end in a number below 100 (its relay port is 16500 + that number)"
            ))
        })
}

/// The MAC of `eth0` in namespace `ns`.
pub fn ns_mac(ns: &str) -> Result<Mac, Error> {
    let out = run(Command::new("ip").args(["-n", ns, "-j", "link", "show", "eth0"]))?;
    let v: Value = serde_json::from_str(&out).map_err(|e| Error::Output {
        cmd: format!("ip -n {ns} -j link show eth0"),
        why: format!("not JSON: {e}"),
    })?;
    v[0]["address"]
        .as_str()
        .ok_or_else(|| Error::Output {
            cmd: format!("ip -n {ns} -j link show eth0"),
            why: "no address".to_owned(),
        })?
        .parse()
        .map_err(|why| Error::Output {
            cmd: format!("ip -n {ns} -j link show eth0"),
            why,
        })
}

/// Node `n`'s API partition while alive: cut on creation, healed on drop (also on panic).
#[derive(Debug)]
pub struct ApiCut<'a> {
    lab: &'a Lab,
    node: u8,
    healed: bool,
}

impl<'a> ApiCut<'a> {
    /// Cuts node `n`'s API path ([`Lab::partition_api`]).
    pub fn new(lab: &'a Lab, n: u8) -> Result<ApiCut<'a>, Error> {
        lab.partition_api(n)?;
        Ok(ApiCut {
            lab,
            node: n,
            healed: false,
        })
    }

    /// Heals it now.
    pub fn heal(mut self) -> Result<(), Error> {
        self.healed = true;
        self.lab.heal_api(self.node)
    }
}

impl Drop for ApiCut<'_> {
    fn drop(&mut self) {
        if self.healed {
            return;
        }
        if let Err(e) = self.lab.heal_api(self.node) {
            eprintln!(
                "[e2e] healing node {}'s API partition failed: {e:?}",
                self.node
            );
        }
    }
}

/// kube-apiserver stopped while alive: SIGSTOP on creation, SIGCONT on drop (also on panic).
#[derive(Debug)]
pub struct ApiPause<'a> {
    lab: &'a Lab,
    resumed: bool,
}

impl<'a> ApiPause<'a> {
    /// Stops kube-apiserver ([`Lab::pause_apiserver`]).
    pub fn new(lab: &'a Lab) -> Result<ApiPause<'a>, Error> {
        lab.pause_apiserver()?;
        Ok(ApiPause {
            lab,
            resumed: false,
        })
    }

    /// Resumes it now.
    pub fn resume(mut self) -> Result<(), Error> {
        self.resumed = true;
        self.lab.resume_apiserver()
    }
}

impl Drop for ApiPause<'_> {
    fn drop(&mut self) {
        if self.resumed {
            return;
        }
        if let Err(e) = self.lab.resume_apiserver() {
            eprintln!("[e2e] resuming kube-apiserver failed: {e:?}");
        }
    }
}

/// kube-proxy's `--proxy-mode` on the lab's nodes (`ALIASLB_LAB_PROXY_MODE` of `scripts/lab`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyMode {
    /// iptables mode, the default.
    Iptables,
    /// nftables mode (GA in 1.33): its own `ip kube-proxy` / `ip6 kube-proxy` tables.
    Nftables,
}

impl ProxyMode {
    /// The flag's value.
    pub fn as_str(self) -> &'static str {
        match self {
            ProxyMode::Iptables => "iptables",
            ProxyMode::Nftables => "nftables",
        }
    }
}

/// A running lab (see the module docs). Dropping it runs `scripts/lab down`, unless
/// `ALIASLB_E2E_KEEP=1` (then it prints how to reach and remove the lab).
#[derive(Debug)]
pub struct Lab {
    repo: PathBuf,
    bins: PathBuf,
    state: PathBuf,
    admin_kubeconfig: PathBuf,
    controller_kubeconfig: PathBuf,
    /// Each node's agent kubeconfig: a token bound to its Node, which carries the node-name
    /// claim the agent Lease admission policy checks (on by default in the chart and
    /// `manifests/`), as a DaemonSet pod's token does.
    agent_kubeconfigs: std::collections::BTreeMap<u8, PathBuf>,
    proxy_mode: ProxyMode,
    _lock: File,
}

/// Serialises labs across processes (test binaries of concurrent runs, `scripts/demo`): the
/// lab's namespaces, ports and state directory are fixed names.
const LOCK_PATH: &str = "/run/aliaslb-lab.lock";

impl Lab {
    /// Brings the lab up from scratch (an existing lab is torn down first), applies the RBAC,
    /// namespace and pool ConfigMap of `manifests/` and starts one agent per node and the
    /// controller replica `controller-1`. `Ok(None)` when not root outside CI (the caller
    /// skips); under `CI=true` not being root is an error.
    pub fn up() -> Result<Option<Lab>, Error> {
        Lab::up_with(ProxyMode::Iptables)
    }

    /// [`Lab::up`] with kube-proxy in `proxy_mode` on every node.
    pub fn up_with(proxy_mode: ProxyMode) -> Result<Option<Lab>, Error> {
        let Some(mut lab) = Lab::up_bare_with(proxy_mode)? else {
            return Ok(None);
        };
        for file in ["namespace", "controller-rbac", "agent-rbac", "pools"] {
            let path = lab.repo.join(format!("manifests/{file}.yaml"));
            lab.kubectl(&["apply", "-f", &path.to_string_lossy()])?;
        }
        lab.start_aliaslb()?;
        Ok(Some(lab))
    }

    /// The lab without aliaslb: no object of `manifests/` applied, no agent or controller
    /// started. The caller installs the namespaces, RBAC and pool ConfigMap its own way (e.g.
    /// `helm install`, e2e/tests/helm.rs), then calls [`Lab::start_aliaslb`]. `Ok(None)` as
    /// for [`Lab::up`].
    pub fn up_bare() -> Result<Option<Lab>, Error> {
        Lab::up_bare_with(ProxyMode::Iptables)
    }

    fn up_bare_with(proxy_mode: ProxyMode) -> Result<Option<Lab>, Error> {
        if !nix::unistd::Uid::effective().is_root() {
            if std::env::var("CI").as_deref() == Ok("true") {
                return Err(Error::Environment(
                    "the end-to-end tests need root (network namespaces, iptables) and CI=true: refusing to skip them".to_owned(),
                ));
            }
            eprintln!("SKIPPED: the end-to-end tests need root (network namespaces, iptables)");
            return Ok(None);
        }
        let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .map(Path::to_path_buf)
            .ok_or_else(|| Error::Environment("no repository root above e2e/".to_owned()))?;
        let bins = binary_dir()?;
        let lock = File::create(LOCK_PATH).map_err(|source| Error::Io {
            what: format!("creating {LOCK_PATH}"),
            source,
        })?;
        if lock.try_lock().is_err() {
            eprintln!("[e2e] waiting for {LOCK_PATH} (another lab user runs)");
            lock.lock().map_err(|source| Error::Io {
                what: format!("locking {LOCK_PATH}"),
                source,
            })?;
        }
        let state = PathBuf::from(
            std::env::var("ALIASLB_LAB_DIR").unwrap_or_else(|_| "/run/aliaslb-lab".to_owned()),
        );
        let script = repo.join("scripts/lab");
        if state.exists() {
            eprintln!(
                "[e2e] a lab is already up in {}: tearing it down first",
                state.display()
            );
            run(Command::new(&script)
                .arg("down")
                .env("ALIASLB_LAB_PROXY_MODE", proxy_mode.as_str()))?;
        }
        let lab = Lab {
            admin_kubeconfig: state.join("kubeconfig"),
            controller_kubeconfig: PathBuf::new(),
            agent_kubeconfigs: std::collections::BTreeMap::new(),
            proxy_mode,
            repo,
            bins,
            state,
            _lock: lock,
        };
        // From here on the guard exists: a failure below still tears the lab down.
        let t0 = Instant::now();
        lab.lab(&["up"])?;
        println!("[e2e] lab up in {:.1} s", t0.elapsed().as_secs_f64());
        Ok(Some(lab))
    }

    /// Starts aliaslb on a lab whose aliaslb objects exist (namespaces, ServiceAccounts and
    /// RBAC, pool ConfigMap): one agent per node and the controller replica `controller-1`,
    /// each under its ServiceAccount's token, and waits until the controller leads and
    /// every agent has written its Lease.
    pub fn start_aliaslb(&mut self) -> Result<(), Error> {
        let t0 = Instant::now();
        let lab = self;
        lab.controller_kubeconfig = PathBuf::from(
            lab.lab(&["kubeconfig", SYSTEM_NAMESPACE, "aliaslb-controller"])?
                .trim(),
        );
        for n in NODES {
            let node = node_name(n);
            let path = lab.lab(&["kubeconfig", SYSTEM_NAMESPACE, "aliaslb-agent", &node])?;
            lab.agent_kubeconfigs.insert(n, PathBuf::from(path.trim()));
        }
        for n in NODES {
            lab.start_agent(n)?;
        }
        lab.start_controller("controller-1")?;
        lab.wait_leader("controller-1", Duration::from_secs(20))?;
        for n in NODES {
            lab.wait_agent_lease(n, Duration::from_secs(20))?;
        }
        println!(
            "[e2e] aliaslb up (3 agents, controller-1 leading) in {:.1} s",
            t0.elapsed().as_secs_f64()
        );
        Ok(())
    }

    /// Runs `scripts/lab ARGS`.
    pub fn lab(&self, args: &[&str]) -> Result<String, Error> {
        run(Command::new(self.repo.join("scripts/lab"))
            .args(args)
            .env("ALIASLB_LAB_DIR", &self.state)
            .env("ALIASLB_LAB_PROXY_MODE", self.proxy_mode.as_str()))
    }

    /// kube-proxy's mode on the nodes.
    pub fn proxy_mode(&self) -> ProxyMode {
        self.proxy_mode
    }

    /// kube-proxy's rules on node `n` as text: `iptables-save` in iptables mode, the
    /// `kube-proxy` tables of `nft list ruleset` in nftables mode.
    pub fn proxy_rules(&self, n: u8) -> Result<String, Error> {
        let ns = node_name(n);
        match self.proxy_mode {
            ProxyMode::Iptables => {
                run(Command::new("ip").args(["netns", "exec", &ns, "iptables-save"]))
            }
            ProxyMode::Nftables => {
                run(Command::new("ip").args(["netns", "exec", &ns, "nft", "list", "ruleset"]))
            }
        }
    }

    /// Runs `kubectl` as the lab's admin.
    pub fn kubectl(&self, args: &[&str]) -> Result<String, Error> {
        run(Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&self.admin_kubeconfig)
            .args(args))
    }

    /// `kubectl apply -f -` of `yaml`.
    pub fn apply(&self, yaml: &str) -> Result<(), Error> {
        run_with_input(
            Command::new("kubectl")
                .arg("--kubeconfig")
                .arg(&self.admin_kubeconfig)
                .args(["apply", "-f", "-"]),
            Some(yaml),
        )
        .map(drop)
    }

    /// Adds (or replaces) the pool key `ns` of the pool ConfigMap, one address per line.
    pub fn add_pool(&self, ns: &str, ips: &[&str]) -> Result<(), Error> {
        self.patch_pools(&crate::fixtures::pool_patch(ns, ips))
    }

    /// Applies the JSON merge patch `patch` to the pool ConfigMap.
    pub fn patch_pools(&self, patch: &str) -> Result<(), Error> {
        self.kubectl(&[
            "patch",
            "configmap",
            "-n",
            SYSTEM_NAMESPACE,
            "aliaslb-pools",
            "--type",
            "merge",
            "-p",
            patch,
        ])
        .map(drop)
    }

    /// `kubectl get ARGS -o json`, parsed.
    pub fn get_json(&self, args: &[&str]) -> Result<Value, Error> {
        let mut all = vec!["get"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["-o", "json"]);
        let out = self.kubectl(&all)?;
        serde_json::from_str(&out).map_err(|e| Error::Output {
            cmd: format!("kubectl {}", all.join(" ")),
            why: format!("not JSON: {e}"),
        })
    }

    /// The Service `ns/name` as aliaslb left it.
    pub fn service(&self, ns: &str, name: &str) -> Result<ServiceReadback, Error> {
        Ok(ServiceReadback::from_json(
            &self.get_json(&["service", "-n", ns, name])?,
        ))
    }

    /// Waits until `ns/name` has one IP, a node, and the agent there reports it announced
    /// (condition `aliaslb.io/Announced` True) and holds the alias; returns (IP, node).
    pub fn wait_announced(
        &self,
        ns: &str,
        name: &str,
        timeout: Duration,
    ) -> Result<(Ipv4Addr, u8), Error> {
        wait_for(
            &format!("Service {ns}/{name} to be announced"),
            timeout,
            || {
                let view = self.service(ns, name)?;
                let announced = view
                    .conditions
                    .get("aliaslb.io/Announced")
                    .is_some_and(|c| c.status == "True");
                match view.assignment() {
                    Some((ip, node)) if announced && crate::aliases(node)?.contains(&ip) => {
                        Ok(Ok((ip, node)))
                    }
                    _ => Ok(Err(view.summary())),
                }
            },
        )
    }

    /// The lab's state directory (`ALIASLB_LAB_DIR`, default `/run/aliaslb-lab`): sockets,
    /// pid files and logs of what `scripts/lab` started live below it.
    pub fn state_dir(&self) -> &Path {
        &self.state
    }

    /// Path of the admin kubeconfig.
    pub fn admin_kubeconfig(&self) -> &Path {
        &self.admin_kubeconfig
    }

    /// Runs `cmd` in namespace `ns` (`node-N`, `client`, ...) through `scripts/lab exec`;
    /// its standard output.
    pub fn exec(&self, ns: &str, cmd: &[&str]) -> Result<String, Error> {
        let mut args = vec!["exec", ns];
        args.extend_from_slice(cmd);
        self.lab(&args)
    }

    /// Starts `name` in namespace `ns` (`host`, `node-N`, ...) through `scripts/lab start`.
    pub fn spawn(&self, name: &str, ns: &str, cmd: &[&str]) -> Result<(), Error> {
        let mut args = vec!["start", name, ns];
        args.extend_from_slice(cmd);
        self.lab(&args).map(drop)
    }

    /// Starts the agent of node `n` (`agent-N`) with the agent ServiceAccount.
    pub fn start_agent(&self, n: u8) -> Result<(), Error> {
        self.start_agent_with(n, &[])
    }

    /// [`Lab::start_agent`] with more flags for the agent. Without a `--lease-duration`
    /// among them, the agent runs with the lab's [`LEASE_DURATION`] and [`LEASE_RENEW`].
    pub fn start_agent_with(&self, n: u8, flags: &[&str]) -> Result<(), Error> {
        let path = self.agent_kubeconfigs.get(&n).ok_or_else(|| {
            Error::Environment(format!("no agent kubeconfig for {}", node_name(n)))
        })?;
        let kubeconfig = format!("KUBECONFIG={}", path.display());
        let node = format!("NODE_NAME={}", node_name(n));
        let bin = self.bins.join("aliaslb-agent");
        let bin = bin.to_string_lossy();
        let lease = format!("{}s", LEASE_DURATION.as_secs());
        let renew = format!("{}ms", LEASE_RENEW.as_millis());
        let mut cmd = vec!["env", "NO_COLOR=1", &kubeconfig, &node, &bin];
        if !flags.iter().any(|f| f.starts_with("--lease-duration")) {
            cmd.extend_from_slice(&["--lease-duration", &lease, "--renew-interval", &renew]);
        }
        cmd.extend_from_slice(flags);
        self.spawn(&format!("agent-{n}"), &format!("node-{n}"), &cmd)
    }

    /// Starts a controller replica on the host with the controller ServiceAccount; `identity`
    /// is also the process name.
    pub fn start_controller(&self, identity: &str) -> Result<(), Error> {
        self.start_controller_with(identity, &[])
    }

    /// [`Lab::start_controller`] with more flags for the controller.
    ///
    /// The replica reaches the apiserver through a relay of its own (`api-relay-IDENTITY`,
    /// 127.0.0.1:[`controller_relay_port`]), as each node does, so that
    /// [`Lab::partition_controller`] can cut its path alone.
    pub fn start_controller_with(&self, identity: &str, flags: &[&str]) -> Result<(), Error> {
        let kubeconfig = self.controller_relay(identity)?;
        let kubeconfig = format!("KUBECONFIG={}", kubeconfig.display());
        let bin = self.bins.join("aliaslb-controller");
        let bin = bin.to_string_lossy();
        let mut cmd = vec![
            "env",
            "NO_COLOR=1",
            &kubeconfig,
            &bin,
            "--namespace",
            SYSTEM_NAMESPACE,
            "--identity",
            identity,
            "--metrics-addr",
            "127.0.0.1:0",
        ];
        cmd.extend_from_slice(flags);
        self.spawn(identity, "host", &cmd)
    }

    /// SIGTERM to `name`'s process group; returns once it exited (`scripts/lab stop`).
    pub fn stop(&self, name: &str) -> Result<(), Error> {
        self.lab(&["stop", name]).map(drop)
    }

    /// SIGKILL to `name`'s process, without any warning; returns once it is gone.
    pub fn kill(&self, name: &str) -> Result<(), Error> {
        let pid_file = self.state.join(format!("pids/{name}.pid"));
        let pid = std::fs::read_to_string(&pid_file).map_err(|source| Error::Io {
            what: format!("reading {}", pid_file.display()),
            source,
        })?;
        let pid = pid.trim();
        run(Command::new("kill").args(["-KILL", pid]))?;
        let stat = format!("/proc/{pid}/stat");
        wait_for(
            &format!("{name} (pid {pid}) to die"),
            Duration::from_secs(5),
            || {
                // Gone, or a zombie waiting for init to reap it.
                let state = std::fs::read_to_string(&stat).unwrap_or_default();
                let dead = state.is_empty() || state.split_whitespace().nth(2) == Some("Z");
                Ok(if dead { Ok(()) } else { Err(state) })
            },
        )
    }

    /// Takes node `n`'s LAN cable out: its port on the LAN bridge goes down (the node sees
    /// no carrier; its addresses stay).
    pub fn unplug(&self, n: u8) -> Result<(), Error> {
        run(Command::new("ip").args(["-n", "alb-lan", "link", "set", &format!("node-{n}"), "down"]))
            .map(drop)
    }

    /// Plugs node `n`'s LAN cable back in.
    pub fn plug(&self, n: u8) -> Result<(), Error> {
        run(Command::new("ip").args(["-n", "alb-lan", "link", "set", &format!("node-{n}"), "up"]))
            .map(drop)
    }

    /// Cuts node `n` off the API server too (its relay stops, open connections included),
    /// as a real cable cut would: in the lab the API is reached through a unix socket, not
    /// the LAN.
    pub fn cut_api(&self, n: u8) -> Result<(), Error> {
        self.stop(&format!("api-relay-node-{n}"))
    }

    /// Restores node `n`'s API access (`scripts/lab up` restarts the missing relay).
    pub fn restore_api(&self) -> Result<(), Error> {
        self.lab(&["up"]).map(drop)
    }

    /// Starts the relay of controller `identity` unless it runs, and writes its kubeconfig
    /// (the controller ServiceAccount's, with the relay's port); returns the kubeconfig.
    fn controller_relay(&self, identity: &str) -> Result<PathBuf, Error> {
        let port = controller_relay_port(identity)?;
        let relay = format!("api-relay-{identity}");
        if !self.alive(&relay) {
            self.spawn(
                &relay,
                "host",
                &[
                    "socat",
                    &format!("TCP-LISTEN:{port},bind=127.0.0.1,fork,reuseaddr"),
                    &format!("TCP:127.0.0.1:{}", api_port()),
                ],
            )?;
            wait_for(
                &format!("{relay} to listen on {port}"),
                Duration::from_secs(5),
                || {
                    Ok(match std::net::TcpStream::connect(("127.0.0.1", port)) {
                        Ok(_) => Ok(()),
                        Err(e) => Err(e.to_string()),
                    })
                },
            )?;
        }
        let text =
            std::fs::read_to_string(&self.controller_kubeconfig).map_err(|source| Error::Io {
                what: format!("reading {}", self.controller_kubeconfig.display()),
                source,
            })?;
        let path = self.state.join(format!("kubeconfig-{identity}"));
        let text = text.replace(
            &format!("https://127.0.0.1:{}", api_port()),
            &format!("https://127.0.0.1:{port}"),
        );
        std::fs::write(&path, text).map_err(|source| Error::Io {
            what: format!("writing {}", path.display()),
            source,
        })?;
        Ok(path)
    }

    /// Whether the lab process `name` runs (its pid file names a live, non-zombie process).
    pub fn alive(&self, name: &str) -> bool {
        let pid = std::fs::read_to_string(self.state.join(format!("pids/{name}.pid")))
            .unwrap_or_default();
        let stat =
            std::fs::read_to_string(format!("/proc/{}/stat", pid.trim())).unwrap_or_default();
        !pid.trim().is_empty() && !stat.is_empty() && stat.split_whitespace().nth(2) != Some("Z")
    }

    /// The pid of the lab process `name`.
    pub fn pid(&self, name: &str) -> Result<u32, Error> {
        let path = self.state.join(format!("pids/{name}.pid"));
        let text = std::fs::read_to_string(&path).map_err(|source| Error::Io {
            what: format!("reading {}", path.display()),
            source,
        })?;
        text.trim().parse().map_err(|e| Error::Output {
            cmd: format!("cat {}", path.display()),
            why: format!("not a pid: {e}"),
        })
    }

    /// Sends `signal` (`STOP`, `CONT`) to the process group of the lab process `name`
    /// (`scripts/lab start` runs each in a session of its own: a relay's forked children
    /// are in it).
    pub fn signal_group(&self, name: &str, signal: &str) -> Result<(), Error> {
        let pid = self.pid(name)?;
        run(Command::new("kill").args([&format!("-{signal}"), "--", &format!("-{pid}")])).map(drop)
    }

    /// Cuts node `n`'s path to the apiserver only, in both directions and silently (no
    /// reset, open connections hang): an nftables table of the harness's own in the node's
    /// namespace drops every packet to or from the API port on 127.0.0.1 (where the node's
    /// relay listens). The LAN is untouched: the agent keeps answering ARP. Undo with
    /// [`Lab::heal_api`]; [`ApiCut`] does both.
    pub fn partition_api(&self, n: u8) -> Result<(), Error> {
        let port = api_port();
        let rules = format!(
            "table inet {PARTITION_TABLE} {{\n  chain output {{\n    type filter hook output priority -300; policy accept;\n    ip daddr 127.0.0.1 tcp dport {port} drop\n    ip saddr 127.0.0.1 tcp sport {port} drop\n  }}\n}}\n"
        );
        run_with_input(
            Command::new("ip").args(["netns", "exec", &node_name(n), "nft", "-f", "-"]),
            Some(&rules),
        )
        .map(drop)
    }

    /// Removes node `n`'s API partition (none is fine).
    pub fn heal_api(&self, n: u8) -> Result<(), Error> {
        delete_nft_table(n, PARTITION_TABLE)
    }

    /// Drops node `n`'s agent adverts, both ways (UDP to [`ADVERT_PORT`], in and out), in
    /// an nftables table of the harness's own in the node's namespace: its standby hears
    /// nothing, while the LAN is otherwise fine (its kernel answers ARP, the client is
    /// served). Undo with [`Lab::unblock_adverts`].
    pub fn block_adverts(&self, n: u8) -> Result<(), Error> {
        let rules = format!(
            "table inet {ADVERTS_TABLE} {{\n  chain output {{\n    type filter hook output priority -300; policy accept;\n    udp dport {ADVERT_PORT} drop\n  }}\n  chain input {{\n    type filter hook input priority -300; policy accept;\n    udp dport {ADVERT_PORT} drop\n  }}\n}}\n"
        );
        run_with_input(
            Command::new("ip").args(["netns", "exec", &node_name(n), "nft", "-f", "-"]),
            Some(&rules),
        )
        .map(drop)
    }

    /// Cuts node `n` off the other nodes on the LAN, both ways, broadcasts included: the
    /// bridge drops every frame between its port and theirs (an nftables table of family
    /// `bridge` in [`LAN_NS`]), while the node and the others still reach the client and
    /// the client them. Undo with [`Lab::heal_lan`].
    pub fn partition_lan(&self, n: u8) -> Result<(), Error> {
        let others: Vec<u8> = NODES.into_iter().filter(|&o| o != n).collect();
        self.partition_lan_from(n, &others)
    }

    /// [`Lab::partition_lan`] between node `n` and the nodes `others` only.
    pub fn partition_lan_from(&self, n: u8, others: &[u8]) -> Result<(), Error> {
        let others: Vec<String> = others.iter().map(|o| format!("\"node-{o}\"")).collect();
        let others = others.join(", ");
        let rules = format!(
            "table bridge {LAN_PARTITION_TABLE} {{\n  chain forward {{\n    type filter hook forward priority -300; policy accept;\n    iifname \"node-{n}\" oifname {{ {others} }} drop\n    iifname {{ {others} }} oifname \"node-{n}\" drop\n  }}\n}}\n"
        );
        run_with_input(
            Command::new("ip").args(["netns", "exec", LAN_NS, "nft", "-f", "-"]),
            Some(&rules),
        )
        .map(drop)
    }

    /// Removes the LAN partition of [`Lab::partition_lan`] (none is fine).
    pub fn heal_lan(&self) -> Result<(), Error> {
        let listed =
            run(Command::new("ip").args(["netns", "exec", LAN_NS, "nft", "list", "tables"]))?;
        if !listed
            .lines()
            .any(|l| l.trim() == format!("table bridge {LAN_PARTITION_TABLE}"))
        {
            return Ok(());
        }
        run(Command::new("ip").args([
            "netns",
            "exec",
            LAN_NS,
            "nft",
            "delete",
            "table",
            "bridge",
            LAN_PARTITION_TABLE,
        ]))
        .map(drop)
    }

    /// Lets node `n`'s adverts through again (none blocked is fine).
    pub fn unblock_adverts(&self, n: u8) -> Result<(), Error> {
        delete_nft_table(n, ADVERTS_TABLE)
    }

    /// SIGSTOP of kube-apiserver: every client's requests hang (nothing is refused) until
    /// [`Lab::resume_apiserver`]; [`ApiPause`] does both.
    pub fn pause_apiserver(&self) -> Result<(), Error> {
        self.signal_group("kube-apiserver", "STOP")
    }

    /// SIGCONT of kube-apiserver.
    pub fn resume_apiserver(&self) -> Result<(), Error> {
        self.signal_group("kube-apiserver", "CONT")
    }

    /// Cuts controller `identity`'s path to the apiserver silently: its relay (see
    /// [`Lab::start_controller_with`]) is stopped with SIGSTOP, so its connections and new
    /// connects hang, as behind a dropped route. Undo with [`Lab::heal_controller`].
    pub fn partition_controller(&self, identity: &str) -> Result<(), Error> {
        self.signal_group(&format!("api-relay-{identity}"), "STOP")
    }

    /// Lets controller `identity` reach the apiserver again.
    pub fn heal_controller(&self, identity: &str) -> Result<(), Error> {
        self.signal_group(&format!("api-relay-{identity}"), "CONT")
    }

    /// The MAC of node `n`'s LAN interface (`eth0`).
    pub fn node_mac(&self, n: u8) -> Result<Mac, Error> {
        ns_mac(&node_name(n))
    }

    /// The MAC of the client's LAN interface.
    pub fn client_mac(&self) -> Result<Mac, Error> {
        ns_mac(CLIENT_NS)
    }

    /// Names of the MACs on the LAN: the nodes (`alb-node-N`), the client and the rogue
    /// host when it is there.
    pub fn mac_names(&self) -> Result<BTreeMap<Mac, String>, Error> {
        let mut names = BTreeMap::new();
        for n in NODES {
            names.insert(self.node_mac(n)?, node_name(n));
        }
        names.insert(self.client_mac()?, CLIENT_NS.to_owned());
        if Path::new(&format!("/run/netns/{ROGUE_NS}")).exists() {
            names.insert(ns_mac(ROGUE_NS)?, ROGUE_NS.to_owned());
        }
        Ok(names)
    }

    /// A foreign host on the LAN (namespace [`ROGUE_NS`], [`ROGUE_IP`], no aliaslb) that
    /// configures `ip` and announces it with two gratuitous ARPs: its kernel then answers
    /// ARP for `ip` (probes included). Returns its MAC. [`Lab::remove_rogue`] takes it
    /// away; `scripts/lab down` does too.
    pub fn add_rogue(&self, ip: Ipv4Addr) -> Result<Mac, Error> {
        if !Path::new(&format!("/run/netns/{ROGUE_NS}")).exists() {
            run(Command::new("ip").args(["netns", "add", ROGUE_NS]))?;
            run(Command::new("ip").args([
                "-n", "alb-lan", "link", "add", "rogue", "type", "veth", "peer", "name", "eth0",
                "netns", ROGUE_NS,
            ]))?;
            run(Command::new("ip").args([
                "-n", "alb-lan", "link", "set", "rogue", "master", "br0", "up",
            ]))?;
            run(Command::new("ip").args(["-n", ROGUE_NS, "link", "set", "lo", "up"]))?;
            run(Command::new("ip").args([
                "-n",
                ROGUE_NS,
                "addr",
                "replace",
                &format!("{ROGUE_IP}/24"),
                "dev",
                "eth0",
            ]))?;
            run(Command::new("ip").args(["-n", ROGUE_NS, "link", "set", "eth0", "up"]))?;
        }
        run(Command::new("ip").args([
            "-n",
            ROGUE_NS,
            "addr",
            "replace",
            &format!("{ip}/32"),
            "dev",
            "eth0",
        ]))?;
        // `arping -U` exits 1 when nobody answers, which is the normal case for a GARP.
        let _ = run(Command::new("ip").args([
            "netns",
            "exec",
            ROGUE_NS,
            "arping",
            "-q",
            "-U",
            "-c",
            "2",
            "-w",
            "1",
            "-I",
            "eth0",
            &ip.to_string(),
        ]));
        ns_mac(ROGUE_NS)
    }

    /// Removes the rogue host (none is fine).
    pub fn remove_rogue(&self) -> Result<(), Error> {
        if Path::new(&format!("/run/netns/{ROGUE_NS}")).exists() {
            run(Command::new("ip").args(["netns", "del", ROGUE_NS]))?;
        }
        Ok(())
    }

    /// The holder of the controllers' leader Lease.
    pub fn leader(&self) -> Result<Option<String>, Error> {
        let lease = self.get_json(&["lease", "-n", SYSTEM_NAMESPACE, "aliaslb-controller"]);
        Ok(lease
            .ok()
            .and_then(|l| l["spec"]["holderIdentity"].as_str().map(str::to_owned))
            .filter(|h| !h.is_empty()))
    }

    /// Waits until `identity` holds the leader Lease.
    pub fn wait_leader(&self, identity: &str, timeout: Duration) -> Result<(), Error> {
        wait_for(&format!("{identity} to lead"), timeout, || {
            Ok(match self.leader()? {
                Some(h) if h == identity => Ok(()),
                other => Err(format!("leader {other:?}")),
            })
        })
    }

    /// Waits until node `n`'s agent has written its Lease.
    pub fn wait_agent_lease(&self, n: u8, timeout: Duration) -> Result<(), Error> {
        let name = format!("aliaslb-agent-{}", node_name(n));
        wait_for(&format!("Lease {name}"), timeout, || {
            Ok(
                match self.kubectl(&["get", "lease", "-n", AGENT_NAMESPACE, &name]) {
                    Ok(_) => Ok(()),
                    Err(e) => Err(e.to_string()),
                },
            )
        })
    }

    /// The last `lines` lines of `name`'s log.
    pub fn log_tail(&self, name: &str, lines: usize) -> String {
        let path = self.state.join(format!("logs/{name}.log"));
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(lines).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    /// Names of the aliaslb processes this lab ran (agents and controllers).
    fn aliaslb_processes(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.state.join("logs"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let name = e
                    .file_name()
                    .to_string_lossy()
                    .strip_suffix(".log")?
                    .to_owned();
                (name.starts_with("agent-") || name.starts_with("controller-")).then_some(name)
            })
            .collect();
        names.sort();
        names
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for name in self.aliaslb_processes() {
                eprintln!(
                    "---- last lines of {name}'s log ----\n{}",
                    self.log_tail(&name, 40)
                );
            }
        }
        if std::env::var("ALIASLB_E2E_KEEP").as_deref() == Ok("1") {
            eprintln!(
                "[e2e] ALIASLB_E2E_KEEP=1: the lab stays up; eval \"$(scripts/lab env)\"; remove it with scripts/lab down"
            );
            return;
        }
        match self.lab(&["down"]) {
            Ok(_) => println!("[e2e] lab down"),
            Err(e) => eprintln!("[e2e] scripts/lab down failed: {e:?}"),
        }
    }
}

/// Deletes the harness's nftables table `table` (family `inet`) in node `n`'s namespace,
/// if it is there.
fn delete_nft_table(n: u8, table: &str) -> Result<(), Error> {
    let ns = node_name(n);
    let listed = run(Command::new("ip").args(["netns", "exec", &ns, "nft", "list", "tables"]))?;
    if !listed
        .lines()
        .any(|l| l.trim() == format!("table inet {table}"))
    {
        return Ok(());
    }
    run(Command::new("ip").args([
        "netns", "exec", &ns, "nft", "delete", "table", "inet", table,
    ]))
    .map(drop)
}

/// The helm binary: `ALIASLB_HELM` (scripts/test exports it), else what `scripts/helm`
/// prints (it builds helm on first use and caches it).
pub fn helm_binary() -> Result<PathBuf, Error> {
    if let Some(path) = std::env::var_os("ALIASLB_HELM") {
        return Ok(PathBuf::from(path));
    }
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .ok_or_else(|| Error::Environment("e2e/ has no parent".to_owned()))?;
    let out = run(Command::new("bash").arg(repo.join("scripts/helm")))?;
    out.lines()
        .last()
        .map(|l| PathBuf::from(l.trim()))
        .ok_or_else(|| Error::Environment("scripts/helm printed no path".to_owned()))
}

/// Where `aliaslb-controller` and `aliaslb-agent` are: `ALIASLB_E2E_BIN_DIR`, else the
/// profile directory of this test or example executable (`target/debug/deps/..` or
/// `target/debug/examples/..` — `CARGO_TARGET_DIR` is honoured by construction).
pub fn binary_dir() -> Result<PathBuf, Error> {
    let dir = match std::env::var_os("ALIASLB_E2E_BIN_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => std::env::current_exe()
            .map_err(|source| Error::Io {
                what: "locating this executable".to_owned(),
                source,
            })?
            .parent()
            .and_then(Path::parent)
            .map(Path::to_path_buf)
            .ok_or_else(|| {
                Error::Environment("this executable has no profile directory".to_owned())
            })?,
    };
    for bin in ["aliaslb-controller", "aliaslb-agent"] {
        if !dir.join(bin).is_file() {
            return Err(Error::Environment(format!(
                "{} is missing: build the binaries first (cargo build --workspace --bins; scripts/test does), or set ALIASLB_E2E_BIN_DIR",
                dir.join(bin).display()
            )));
        }
    }
    Ok(dir)
}
