//! `aliaslb`: the user-facing CLI. Parses the command line and hands over to the
//! subcommand's module in `aliaslb_controller::cli`.
//!
//! The same binary is a kubectl plugin: installed (or linked) as `kubectl-aliaslb` on PATH,
//! `kubectl aliaslb ...` runs it; linked as `kubectl_complete-aliaslb`, it answers kubectl's
//! shell completion for the plugin (kubectl 1.26+).

use std::ffi::OsString;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use aliaslb_controller::cli::connect::Connection;
use aliaslb_controller::cli::live::{self, Snapshot, WhatIf};
use aliaslb_controller::cli::select::{Output, Selection};
use aliaslb_controller::cli::{
    bundle, check, complete, explain, pools, simulate, status, validate, version,
};
use aliaslb_controller::config::ControllerConfig;
use aliaslb_core::keys;
use aliaslb_core::plan::ServiceKey;
use clap::{CommandFactory, Parser, Subcommand};

/// aliaslb: bare-metal LoadBalancer for Kubernetes.
#[derive(Debug, Parser)]
#[command(name = "aliaslb", version = aliaslb_ops::build::version_line(), about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Check pool ConfigMap files (for CI): errors as FILE:LINE: message on stdout, a
    /// summary when valid. Exit 0 valid, 1 invalid, 2 usage error.
    Validate(validate::Args),
    /// Show the route table computed from the cluster: every pool address, who uses it, on
    /// which node and in which state; pending Services with their reason; the agents.
    /// Read-only.
    Status(StatusArgs),
    /// Show the usage of every pool per family (addresses, in use, quarantined, free,
    /// pending Services), as the controller counts it. Read-only.
    Pools(PoolsArgs),
    /// Explain a Service in plain sentences: why it is pending, why it is on its node,
    /// what a LAN conflict or a refused pool config did. Read-only.
    Explain(ExplainArgs),
    /// Show which addresses would move where if a node changed, computed by the
    /// controller's planner on the live state. Changes nothing.
    Simulate(SimulateArgs),
    /// Say what is wrong now, worst first, each with its alert's runbook. Exit 0 when
    /// nothing is, 1 when something is, 2 when the cluster cannot be read. Read-only.
    Check(CheckArgs),
    /// Dump what aliaslb reads and writes for a support request (the pool ConfigMap, our
    /// objects, Events, the agents' reports, the pods' metrics; Secrets redacted), to
    /// stdout or a directory. Read-only.
    Bundle(BundleArgs),
    /// Show this CLI's version, the controller's and the agents' (their Pods' image tags),
    /// and say any skew between them. Read-only.
    Version(VersionArgs),
    /// Print a shell completion script for aliaslb (bash, zsh, fish, elvish,
    /// powershell). For `kubectl aliaslb`, link the binary as `kubectl_complete-aliaslb`
    /// on PATH instead: kubectl asks it, and it completes Service, Node, pool and
    /// namespace names from the cluster.
    Completion {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

/// Where the cluster is and where aliaslb keeps its objects, and the controller's settings
/// that change what it does (the same flags and environment as the controller's).
#[derive(Debug, Clone, clap::Args)]
struct Scope {
    /// Path to the kubeconfig file (default: KUBECONFIG, then ~/.kube/config, then the
    /// in-cluster service account).
    #[arg(long, global = true, value_name = "PATH")]
    kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use (default: its current context).
    #[arg(long, global = true, value_name = "NAME")]
    context: Option<String>,
    /// Namespace of the controller: the pool ConfigMap and the node assignments.
    #[arg(long, global = true, env = "POD_NAMESPACE", default_value = keys::DEFAULT_NAMESPACE)]
    controller_namespace: String,
    /// Namespace of the agents' Leases.
    #[arg(long, global = true, env = "ALIASLB_AGENT_NAMESPACE", default_value = keys::DEFAULT_AGENT_NAMESPACE)]
    agent_namespace: String,
    /// Name of the pool ConfigMap.
    #[arg(long, global = true, env = "ALIASLB_POOL_CONFIGMAP", default_value = keys::DEFAULT_POOL_CONFIGMAP)]
    pool_configmap: String,
    /// The controller's --load-balancer-class.
    #[arg(long, global = true, env = "ALIASLB_LOAD_BALANCER_CLASS", default_value = keys::DEFAULT_LOAD_BALANCER_CLASS)]
    load_balancer_class: String,
    /// The controller's --ignore-classless.
    #[arg(long, global = true, env = "ALIASLB_IGNORE_CLASSLESS", value_parser = clap::builder::BoolishValueParser::new())]
    ignore_classless: bool,
    /// The controller's --ignore-cordon.
    #[arg(long, global = true, env = "ALIASLB_IGNORE_CORDON", value_parser = clap::builder::BoolishValueParser::new())]
    ignore_cordon: bool,
}

impl Scope {
    fn controller(&self) -> ControllerConfig {
        ControllerConfig {
            load_balancer_class: self.load_balancer_class.clone(),
            ignore_classless: self.ignore_classless,
            respect_cordon: !self.ignore_cordon,
            ..live::controller_config(
                &self.controller_namespace,
                &self.agent_namespace,
                &self.pool_configmap,
            )
        }
    }

    fn connection(&self) -> Connection {
        Connection {
            kubeconfig: self.kubeconfig.clone(),
            context: self.context.clone(),
        }
    }
}

/// kubectl's `-n` and `-A` for the commands that show every namespace by default.
#[derive(Debug, Clone, clap::Args)]
struct Namespaces {
    /// Only the Services of this namespace (default: every namespace).
    #[arg(
        short = 'n',
        long,
        value_name = "NAMESPACE",
        conflicts_with = "all_namespaces"
    )]
    namespace: Option<String>,
    /// Every namespace (the default, as kubectl's -A).
    #[arg(short = 'A', long)]
    all_namespaces: bool,
}

/// The filters of `status` and `check`.
#[derive(Debug, Clone, clap::Args)]
struct Filters {
    #[command(flatten)]
    namespaces: Namespaces,
    /// Only this pool key.
    #[arg(long, value_name = "POOL")]
    pool: Option<String>,
    /// Only what is on this node: the addresses it carries, its agent.
    #[arg(long, value_name = "NODE")]
    node: Option<String>,
}

impl Filters {
    fn selection(&self, problems: bool) -> Selection {
        Selection {
            namespace: self.namespaces.namespace.clone(),
            pool: self.pool.clone(),
            node: self.node.clone(),
            problems,
        }
    }
}

/// Arguments of `aliaslb status`.
#[derive(Debug, clap::Args)]
struct StatusArgs {
    #[command(flatten)]
    scope: Scope,
    #[command(flatten)]
    filters: Filters,
    /// Only what is wrong: addresses not announced (or claimed by another host), pending
    /// Services, agents not renewing or whose shield is not active.
    #[arg(long)]
    problems: bool,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = Output::Table)]
    output: Output,
}

/// Arguments of `aliaslb version`.
#[derive(Debug, clap::Args)]
struct VersionArgs {
    #[command(flatten)]
    scope: Scope,
    /// This CLI's release and commit only, without reading the cluster (as `kubectl
    /// version --client`).
    #[arg(long)]
    client: bool,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = Output::Table)]
    output: Output,
}

/// Arguments of `aliaslb pools`.
#[derive(Debug, clap::Args)]
struct PoolsArgs {
    #[command(flatten)]
    scope: Scope,
    /// Only this pool key.
    #[arg(long, value_name = "POOL")]
    pool: Option<String>,
    /// Only the pool this namespace draws from.
    #[arg(short = 'n', long, value_name = "NAMESPACE")]
    namespace: Option<String>,
    /// Output format (wide: the same columns).
    #[arg(short, long, value_enum, default_value_t = Output::Table)]
    output: Output,
}

/// Arguments of `aliaslb explain`.
#[derive(Debug, clap::Args)]
struct ExplainArgs {
    /// The Service: svc/NAME (or NAME).
    target: String,
    /// The Service's namespace; default: the kubeconfig context's.
    #[arg(short, long)]
    namespace: Option<String>,
    #[command(flatten)]
    scope: Scope,
    /// Output format (json, yaml: the sentences as a list).
    #[arg(short, long, value_enum, default_value_t = Output::Table)]
    output: Output,
}

/// Arguments of `aliaslb simulate`.
#[derive(Debug, clap::Args)]
struct SimulateArgs {
    #[command(subcommand)]
    change: Change,
    #[command(flatten)]
    scope: Scope,
    /// Only the moves of this namespace's Services (default: every namespace).
    #[arg(short = 'n', long, value_name = "NAMESPACE", global = true)]
    namespace: Option<String>,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = Output::Table, global = true)]
    output: Output,
}

/// What `aliaslb simulate` changes.
#[derive(Debug, Clone, Subcommand)]
enum Change {
    /// The node is cordoned (`kubectl cordon NODE`, or the start of a drain).
    Cordon {
        /// The Node's name.
        node: String,
    },
    /// The node's agent stops renewing: the node is lost or its agent gone.
    AgentLost {
        /// The Node's name.
        node: String,
    },
}

/// Arguments of `aliaslb check`.
#[derive(Debug, clap::Args)]
struct CheckArgs {
    #[command(flatten)]
    scope: Scope,
    #[command(flatten)]
    filters: Filters,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = Output::Table)]
    output: Output,
}

/// Arguments of `aliaslb bundle`.
#[derive(Debug, clap::Args)]
struct BundleArgs {
    #[command(flatten)]
    scope: Scope,
    /// Write one file per part into this directory (created) instead of stdout.
    #[arg(long, value_name = "DIR")]
    output_directory: Option<PathBuf>,
}

/// Runs `work` on a current-thread runtime with a client for `scope` (and its context's
/// namespace); prints what it returns on stdout, or its error on stderr with exit status
/// `failed`.
fn with_client<F>(
    scope: &Scope,
    failed: u8,
    work: impl FnOnce(kube::Client, String) -> F,
) -> ExitCode
where
    F: Future<Output = Result<(String, ExitCode), String>>,
{
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("aliaslb: cannot start the async runtime: {e}");
            return ExitCode::from(failed);
        }
    };
    let result = runtime.block_on(async {
        let (client, namespace) = scope
            .connection()
            .client()
            .await
            .map_err(|e| format!("cannot reach the cluster: {}", chain(&e)))?;
        work(client, namespace).await
    });
    match result {
        Ok((text, code)) => {
            print!("{text}");
            code
        }
        Err(message) => {
            eprintln!("aliaslb: {message}");
            ExitCode::from(failed)
        }
    }
}

/// [`with_client`] for the commands whose output is all there is (exit 0, or 1).
fn printing<F>(scope: &Scope, work: impl FnOnce(kube::Client, String) -> F) -> ExitCode
where
    F: Future<Output = Result<String, String>>,
{
    with_client(scope, 1, async |client, ns| {
        work(client, ns).await.map(|text| (text, ExitCode::SUCCESS))
    })
}

/// An error and its sources on one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(&format!(": {s}"));
        source = s.source();
    }
    out
}

/// The cluster as `scope` says; `endpoints`: with the EndpointSlices (node placement).
async fn snapshot(
    client: &kube::Client,
    scope: &Scope,
    endpoints: bool,
) -> Result<Snapshot, String> {
    Snapshot::fetch(
        client,
        &scope.controller_namespace,
        &scope.agent_namespace,
        &scope.pool_configmap,
        endpoints,
    )
    .await
    .map_err(|e| chain(&e))
}

/// The snapshot's pool config, or why the planner cannot run on it.
fn valid_config(snapshot: &Snapshot) -> Result<&aliaslb_core::pool::PoolConfig, String> {
    snapshot.config.as_ref().map_err(|errors| {
        format!(
            "pool ConfigMap {} is invalid ({} error(s)): the controller plans with its last valid config, which the cluster does not show (`aliaslb status` lists the errors)",
            snapshot.configmap_name,
            errors.len()
        )
    })
}

/// The pool key a namespace draws from in `snapshot`'s config (none when invalid).
fn pool_of(snapshot: &Snapshot) -> impl Fn(&str) -> Option<String> + '_ {
    |ns| {
        snapshot
            .config
            .as_ref()
            .ok()?
            .pool_for_namespace(ns)
            .map(|(pool, _)| pool.as_str().to_owned())
    }
}

/// `status`'s report of `snapshot`, filtered.
fn status_report(snapshot: &Snapshot, selection: &Selection) -> Result<status::Report, String> {
    let report = status::report(snapshot).map_err(|e| chain(&e))?;
    Ok(selection.report(report, &pool_of(snapshot)))
}

fn run_status(args: StatusArgs) -> ExitCode {
    let selection = args.filters.selection(args.problems);
    printing(&args.scope, async |client, _| {
        let snapshot = snapshot(&client, &args.scope, false).await?;
        let report = status_report(&snapshot, &selection)?;
        args.output
            .encode(&report)
            .unwrap_or_else(|| Ok(status::render(&report, args.output.wide())))
    })
}

/// The pools' rows and the Services without a pool, as `pools` shows them.
fn pool_rows(
    snapshot: &Snapshot,
    scope: &Scope,
) -> Result<(Vec<pools::PoolRow>, Vec<ServiceKey>), String> {
    let config = valid_config(snapshot)?;
    let planned = snapshot.plan(config, &scope.controller(), WhatIf::Nothing);
    let without = pools::without_pool(&planned).into_iter().cloned().collect();
    Ok((pools::rows(&planned, config), without))
}

fn run_pools(args: PoolsArgs) -> ExitCode {
    printing(&args.scope, async |client, _| {
        // Usage does not depend on where the addresses are: no EndpointSlices.
        let snapshot = snapshot(&client, &args.scope, false).await?;
        let (mut rows, mut without) = pool_rows(&snapshot, &args.scope)?;
        let want =
            match (&args.pool, &args.namespace) {
                (Some(pool), _) => Some(pool.clone()),
                (None, Some(ns)) => Some(pool_of(&snapshot)(ns).ok_or_else(|| {
                    format!("namespace {ns} has no pool (no key, no `_fallback`)")
                })?),
                (None, None) => None,
            };
        if let Some(want) = &want {
            rows.retain(|r| &r.pool == want);
            without.clear();
        }
        if let Some(ns) = &args.namespace {
            without.retain(|k| *k.namespace == **ns);
        }
        let without_refs: Vec<&ServiceKey> = without.iter().collect();
        args.output
            .encode(&serde_json::json!({
                "pools": rows,
                "pendingWithoutPool": without.iter().map(ToString::to_string).collect::<Vec<_>>(),
            }))
            .unwrap_or_else(|| Ok(pools::render_table(&rows, &without_refs)))
    })
}

fn run_explain(args: ExplainArgs) -> ExitCode {
    let name = match explain::parse_target(&args.target) {
        Ok(name) => name.to_owned(),
        Err(e) => {
            eprintln!("aliaslb: {e}");
            return ExitCode::from(2);
        }
    };
    printing(&args.scope, async |client, context_ns| {
        let namespace = args.namespace.clone().unwrap_or(context_ns);
        let key = ServiceKey::new(&namespace, &name);
        let snapshot = snapshot(&client, &args.scope, true).await?;
        let controller = args.scope.controller();
        let planned = snapshot
            .config
            .as_ref()
            .ok()
            .map(|config| snapshot.plan(config, &controller, WhatIf::Nothing));
        let warnings = |ns: String, kind: &'static str, name: String| {
            let client = client.clone();
            let now = snapshot.now;
            async move {
                explain::fetch_warnings(&client, &ns, kind, &name, now)
                    .await
                    .map_err(|e| format!("reading Events in {ns}: {e}"))
            }
        };
        let service_warnings = warnings(namespace.clone(), "Service", name.clone()).await?;
        let config_warnings = warnings(
            args.scope.controller_namespace.clone(),
            "ConfigMap",
            args.scope.pool_configmap.clone(),
        )
        .await?;
        let lines = explain::explain(
            &explain::Evidence {
                snapshot: &snapshot,
                planned: planned.as_ref(),
                controller: &controller,
                service_warnings: &service_warnings,
                config_warnings: &config_warnings,
            },
            &key,
        )?;
        args.output
            .encode(&serde_json::json!({
                "namespace": namespace,
                "service": name,
                "lines": lines,
            }))
            .unwrap_or_else(|| Ok(lines.into_iter().map(|l| l + "\n").collect()))
    })
}

fn run_simulate(args: SimulateArgs) -> ExitCode {
    printing(&args.scope, async |client, _| {
        let snapshot = snapshot(&client, &args.scope, true).await?;
        let config = valid_config(&snapshot)?;
        let (what_if, change) = match &args.change {
            Change::Cordon { node } => (WhatIf::Cordon(node), format!("cordon {node}")),
            Change::AgentLost { node } => {
                (WhatIf::AgentLost(node), format!("agent lost on {node}"))
            }
        };
        let (Change::Cordon { node } | Change::AgentLost { node }) = &args.change;
        if !snapshot
            .nodes
            .iter()
            .any(|n| n.metadata.name.as_deref() == Some(node.as_str()))
        {
            return Err(format!("Node {node} not found"));
        }
        let controller = args.scope.controller();
        let before = snapshot.plan(config, &controller, WhatIf::Nothing);
        let after = snapshot.plan(config, &controller, what_if);
        let mut moves = simulate::moves(&before, &after);
        if let Some(ns) = &args.namespace {
            moves.retain(|m| &m.namespace == ns);
        }
        args.output
            .encode(&serde_json::json!({"change": change, "moves": moves}))
            .unwrap_or_else(|| {
                Ok(simulate::render_table(
                    &change,
                    before.output.services.len(),
                    &moves,
                ))
            })
    })
}

/// What `check` finds in the cluster, for `selection`; and a line on what it looked at.
async fn check_findings(
    client: &kube::Client,
    scope: &Scope,
    snapshot: &Snapshot,
    selection: &Selection,
) -> Result<(Vec<check::Finding>, String), String> {
    let lease = kube::Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(
        client.clone(),
        &scope.controller_namespace,
    )
    .get_opt(keys::CONTROLLER_LEASE)
    .await
    .map_err(|e| format!("reading the leader Lease: {e}"))?;
    let report = status_report(snapshot, selection).ok();
    let mut rows = pool_rows(snapshot, scope)
        .map(|(rows, _)| rows)
        .unwrap_or_default();
    rows.retain(|r| selection.pool.as_deref().is_none_or(|p| p == r.pool));
    if let Some(ns) = &selection.namespace {
        let pool = pool_of(snapshot)(ns);
        rows.retain(|r| Some(&r.pool) == pool.as_ref());
    }
    let config_errors = match &snapshot.config {
        Ok(_) => Vec::new(),
        Err(errors) => errors.iter().map(ToString::to_string).collect(),
    };
    let findings = check::findings(&check::Evidence {
        leader: check::leader(lease.as_ref(), snapshot.now),
        config_errors,
        report: report.as_ref(),
        pools: &rows,
        agents: &snapshot.agents,
        nodes: snapshot.nodes.len(),
        selection,
    });
    let services = report
        .as_ref()
        .map_or(0, |r| r.routes.iter().filter(|r| r.in_use).count());
    let fresh = snapshot.agents.values().filter(|a| a.fresh).count();
    let summary = format!(
        "{services} address(es) in use, {} pool(s), {fresh} of {} agent(s) fresh, leader {}",
        rows.len(),
        snapshot.agents.len(),
        check::leader(lease.as_ref(), snapshot.now)
            .holder
            .unwrap_or_else(|| "-".to_owned())
    );
    Ok((findings, summary))
}

fn run_check(args: CheckArgs) -> ExitCode {
    let selection = args.filters.selection(false);
    with_client(&args.scope, 2, async |client, _| {
        let snapshot = snapshot(&client, &args.scope, false).await?;
        let (findings, summary) =
            check_findings(&client, &args.scope, &snapshot, &selection).await?;
        let code = if check::failing(&findings) {
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        };
        let text = args
            .output
            .encode(&serde_json::json!({
                "healthy": !check::failing(&findings),
                "summary": summary,
                "findings": findings,
            }))
            .unwrap_or_else(|| Ok(check::render(&findings, &summary)))?;
        Ok((text, code))
    })
}

fn run_bundle(args: BundleArgs) -> ExitCode {
    printing(&args.scope, async |client, _| {
        let snapshot = snapshot(&client, &args.scope, false).await?;
        let everything = Selection::default();
        let status = status_report(&snapshot, &everything).map(|r| status::render(&r, true));
        let check = check_findings(&client, &args.scope, &snapshot, &everything)
            .await
            .map(|(f, summary)| check::render(&f, &summary));
        let header = format!(
            "aliaslb bundle, read at {} by aliaslb {} (controller namespace {}, agent namespace {}, pool ConfigMap {}).\nSecrets: names and keys only, every value redacted.\n",
            snapshot.now,
            env!("CARGO_PKG_VERSION"),
            args.scope.controller_namespace,
            args.scope.agent_namespace,
            args.scope.pool_configmap,
        );
        let b = bundle::collect(
            &client,
            &bundle::Scope {
                namespace: &args.scope.controller_namespace,
                agent_namespace: &args.scope.agent_namespace,
            },
            &snapshot,
            &header,
            status,
            check,
        )
        .await;
        match &args.output_directory {
            None => Ok(b.to_stream()),
            Some(dir) => {
                b.write_dir(dir)
                    .map_err(|e| format!("writing {}: {e}", dir.display()))?;
                Ok(format!(
                    "wrote {} file(s) to {}{}\n",
                    b.files.len(),
                    dir.display(),
                    if b.errors.is_empty() {
                        String::new()
                    } else {
                        format!("; not collected: {} (see index.txt)", b.errors.len())
                    }
                ))
            }
        }
    })
}

fn run_version(args: VersionArgs) -> ExitCode {
    if args.client {
        let (version, commit) = (aliaslb_ops::build::VERSION, aliaslb_ops::build::COMMIT);
        let text = args
            .output
            .encode(&serde_json::json!({ "client": { "version": version, "commit": commit } }))
            .unwrap_or_else(|| Ok(format!("aliaslb {version}\ncommit {commit}\n")));
        return match text {
            Ok(text) => {
                print!("{text}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(1)
            }
        };
    }
    printing(&args.scope, async |client, _| {
        let read = async |namespace: &str, app: &str, container: &str| {
            version::read(&client, namespace, app, container)
                .await
                .map_err(|e| format!("listing the {app} Pods in {namespace}: {e}"))
        };
        let controller = read(
            &args.scope.controller_namespace,
            version::CONTROLLER_APP,
            "controller",
        )
        .await?;
        let agents = read(&args.scope.agent_namespace, version::AGENT_APP, "agent").await?;
        let report = version::report(env!("CARGO_PKG_VERSION"), &controller, &agents);
        args.output
            .encode(&report)
            .unwrap_or_else(|| Ok(version::render(&report)))
    })
}

/// The names of kind `want` for completion, read from the cluster with the connection
/// flags among `words` (or the kubeconfig's contexts); none when it cannot be read in a
/// few seconds (completion must not hang a shell).
fn names(want: complete::Want, words: &[String]) -> Vec<String> {
    let kubeconfig = complete::flag(words, &["--kubeconfig"]).map(PathBuf::from);
    if want == complete::Want::Contexts {
        let file = match &kubeconfig {
            Some(path) => kube::config::Kubeconfig::read_from(path),
            None => kube::config::Kubeconfig::read(),
        };
        return file
            .map(|k| k.contexts.into_iter().map(|c| c.name).collect())
            .unwrap_or_default();
    }
    let connection = Connection {
        kubeconfig,
        context: complete::flag(words, &["--context"]),
    };
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return Vec::new();
    };
    let env =
        |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.to_owned());
    let controller_namespace = complete::flag(words, &["--controller-namespace"])
        .unwrap_or_else(|| env("POD_NAMESPACE", keys::DEFAULT_NAMESPACE));
    let pool_configmap = complete::flag(words, &["--pool-configmap"])
        .unwrap_or_else(|| env("ALIASLB_POOL_CONFIGMAP", keys::DEFAULT_POOL_CONFIGMAP));
    runtime.block_on(async {
        let work = async {
            let (client, context_ns) = connection.client().await.ok()?;
            let namespace = complete::flag(words, &["-n", "--namespace"]).unwrap_or(context_ns);
            complete::names(
                &client,
                want,
                &namespace,
                &controller_namespace,
                &pool_configmap,
            )
            .await
            .ok()
        };
        tokio::time::timeout(std::time::Duration::from_secs(5), work)
            .await
            .ok()
            .flatten()
            .unwrap_or_default()
    })
}

/// kubectl's plugin completion (`kubectl_complete-aliaslb ARGS... CURRENT`): the
/// candidates for CURRENT after ARGS, one per line with its help, then `:4` (no file
/// completion), as kubectl's Cobra expects. Names (Services, Nodes, pools, namespaces,
/// contexts) come from the cluster; subcommands and flags from the CLI itself.
fn complete(args: &[String]) -> String {
    let root = Cli::command();
    let (current, words) = args
        .split_last()
        .map_or(("", &[][..]), |(c, w)| (c.as_str(), w));
    let want = complete::wanted(words);
    if want != complete::Want::Other && !current.starts_with('-') {
        let mut out: String = complete::matching(want, &names(want, words), current)
            .into_iter()
            .map(|n| n + "\n")
            .collect();
        out.push_str(":4\n");
        return out;
    }
    let mut cmd = &root;
    for word in words {
        if let Some(sub) = cmd.find_subcommand(word) {
            cmd = sub;
        }
    }
    let mut out = String::new();
    let about = |a: Option<&clap::builder::StyledStr>| {
        a.map(|s| s.to_string().lines().next().unwrap_or_default().to_owned())
            .unwrap_or_default()
    };
    if current.starts_with('-') {
        for arg in cmd.get_arguments().filter(|a| !a.is_hide_set()) {
            if let Some(long) = arg.get_long().map(|l| format!("--{l}"))
                && long.starts_with(current)
            {
                out.push_str(&format!("{long}\t{}\n", about(arg.get_help())));
            }
        }
    } else {
        for sub in cmd.get_subcommands() {
            if sub.get_name().starts_with(current) {
                out.push_str(&format!("{}\t{}\n", sub.get_name(), about(sub.get_about())));
            }
        }
        for arg in cmd.get_positionals() {
            for value in arg.get_possible_values() {
                if value.get_name().starts_with(current) {
                    out.push_str(&format!("{}\n", value.get_name()));
                }
            }
        }
    }
    out.push_str(":4\n");
    out
}

fn main() -> ExitCode {
    let mut argv: Vec<OsString> = std::env::args_os().collect();
    let invoked = argv
        .first()
        .and_then(|a| std::path::Path::new(a).file_name())
        .and_then(|n| n.to_str())
        .unwrap_or("aliaslb")
        .to_owned();
    if invoked.starts_with("kubectl_complete-") {
        let args: Vec<String> = argv
            .iter()
            .skip(1)
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        print!("{}", complete(&args));
        return ExitCode::SUCCESS;
    }
    let mut command = Cli::command();
    if invoked.starts_with("kubectl-") {
        // Usage and errors read as the user typed it.
        command = command.bin_name("kubectl aliaslb");
        argv[0] = OsString::from("kubectl aliaslb");
    }
    let matches = command.get_matches_from(argv);
    let Cli { command } = match <Cli as clap::FromArgMatches>::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    match command {
        Command::Validate(args) => ExitCode::from(validate::run(
            &args.files,
            &mut std::io::stdin().lock(),
            &mut std::io::stdout().lock(),
            &mut std::io::stderr().lock(),
        )),
        Command::Status(args) => run_status(args),
        Command::Pools(args) => run_pools(args),
        Command::Explain(args) => run_explain(args),
        Command::Simulate(args) => run_simulate(args),
        Command::Check(args) => run_check(args),
        Command::Bundle(args) => run_bundle(args),
        Command::Version(args) => run_version(args),
        Command::Completion { shell } => {
            let mut out = std::io::stdout().lock();
            clap_complete::generate(shell, &mut Cli::command(), "aliaslb", &mut out);
            let _ = out.flush();
            ExitCode::SUCCESS
        }
    }
}
