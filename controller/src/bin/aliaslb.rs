//! `aliaslb`: the user-facing CLI. Parses the command line and hands over to the
//! subcommand's module in `aliaslb_controller::cli`.
//!
//! The same binary is a kubectl plugin: installed (or linked) as `kubectl-aliaslb` on PATH,
//! `kubectl aliaslb ...` runs it; linked as `kubectl_complete-aliaslb`, it answers kubectl's
//! shell completion for the plugin (kubectl 1.26+).

use std::ffi::OsString;
use std::io::Write as _;
use std::process::ExitCode;

use aliaslb_controller::cli::live::{self, Snapshot, WhatIf};
use aliaslb_controller::cli::{explain, pools, simulate, status, validate};
use aliaslb_controller::config::ControllerConfig;
use aliaslb_core::keys;
use aliaslb_core::plan::ServiceKey;
use clap::{CommandFactory, Parser, Subcommand, ValueEnum};

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
    /// Show the route table computed from the cluster (KUBECONFIG): every pool address,
    /// who uses it, on which node and in which state; pending Services with their reason.
    /// Read-only.
    Status(StatusArgs),
    /// Show the usage of every pool per family (addresses, in use, quarantined, free,
    /// pending Services), as the controller counts it. Read-only.
    Pools(ReadArgs),
    /// Explain a Service in plain sentences: why it is pending, why it is on its node,
    /// what a LAN conflict or a refused pool config did. Read-only.
    Explain(ExplainArgs),
    /// Show which addresses would move where if a node changed, computed by the
    /// controller's planner on the live state. Changes nothing.
    Simulate(SimulateArgs),
    /// Print this binary's release and the commit it was built from (also `--version`).
    Version,
    /// Print a shell completion script for aliaslb (bash, zsh, fish, elvish,
    /// powershell). For `kubectl aliaslb`, link the binary as `kubectl_complete-aliaslb`
    /// on PATH instead: kubectl asks it.
    Completion {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

/// Where aliaslb keeps its objects, and the controller's settings that change what it
/// does (the same flags and environment as the controller's).
#[derive(Debug, Clone, clap::Args)]
struct Scope {
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
}

/// Arguments of `aliaslb status`.
#[derive(Debug, clap::Args)]
struct StatusArgs {
    #[command(flatten)]
    scope: Scope,
    /// Same as --controller-namespace (its name before the other commands came).
    #[arg(long, hide = true)]
    namespace: Option<String>,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = Output::Table)]
    output: Output,
}

/// Arguments of the read-only commands without a target.
#[derive(Debug, clap::Args)]
struct ReadArgs {
    #[command(flatten)]
    scope: Scope,
    /// Output format.
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
}

/// Arguments of `aliaslb simulate`.
#[derive(Debug, clap::Args)]
struct SimulateArgs {
    #[command(subcommand)]
    change: Change,
    #[command(flatten)]
    scope: Scope,
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

/// Output formats of the read-only commands.
#[derive(Debug, Clone, Copy, ValueEnum)]
enum Output {
    /// Aligned columns for people.
    Table,
    /// JSON for scripts (stable field names).
    Json,
}

/// Runs `work` on a current-thread runtime with a client from KUBECONFIG; prints its
/// error and returns 1 on failure.
fn with_client<F>(work: impl FnOnce(kube::Client) -> F) -> ExitCode
where
    F: Future<Output = Result<String, String>>,
{
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("aliaslb: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        let client = kube::Client::try_default()
            .await
            .map_err(|e| format!("cannot build a Kubernetes client (KUBECONFIG): {e}"))?;
        work(client).await
    });
    match result {
        Ok(text) => {
            print!("{text}");
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("aliaslb: {message}");
            ExitCode::FAILURE
        }
    }
}

/// An error and its source on one line.
fn chain(e: &dyn std::error::Error) -> String {
    match e.source() {
        Some(s) => format!("{e}: {s}"),
        None => e.to_string(),
    }
}

fn json<T: serde::Serialize>(value: &T) -> Result<String, String> {
    serde_json::to_string_pretty(value)
        .map(|s| s + "\n")
        .map_err(|e| format!("cannot encode the report: {e}"))
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

fn run_status(mut args: StatusArgs) -> ExitCode {
    if let Some(ns) = args.namespace.take() {
        args.scope.controller_namespace = ns;
    }
    with_client(async |client| {
        let snapshot = snapshot(&client, &args.scope, false).await?;
        let report = status::report(&snapshot).map_err(|e| chain(&e))?;
        match args.output {
            Output::Table => Ok(status::render_table(&report)),
            Output::Json => json(&report),
        }
    })
}

fn run_pools(args: ReadArgs) -> ExitCode {
    with_client(async |client| {
        // Usage does not depend on where the addresses are: no EndpointSlices.
        let snapshot = snapshot(&client, &args.scope, false).await?;
        let config = valid_config(&snapshot)?;
        let planned = snapshot.plan(config, &args.scope.controller(), WhatIf::Nothing);
        let rows = pools::rows(&planned, config);
        let without = pools::without_pool(&planned);
        match args.output {
            Output::Table => Ok(pools::render_table(&rows, &without)),
            Output::Json => json(&serde_json::json!({
                "pools": rows,
                "pendingWithoutPool": without.iter().map(ToString::to_string).collect::<Vec<_>>(),
            })),
        }
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
    with_client(async |client| {
        let namespace = args
            .namespace
            .clone()
            .unwrap_or_else(|| client.default_namespace().to_owned());
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
        Ok(lines.into_iter().map(|l| l + "\n").collect())
    })
}

fn run_simulate(args: SimulateArgs) -> ExitCode {
    with_client(async |client| {
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
        let moves = simulate::moves(&before, &after);
        match args.output {
            Output::Table => Ok(simulate::render_table(
                &change,
                before.output.services.len(),
                &moves,
            )),
            Output::Json => json(&serde_json::json!({"change": change, "moves": moves})),
        }
    })
}

/// kubectl's plugin completion (`kubectl_complete-aliaslb ARGS... CURRENT`): the
/// candidates for CURRENT after ARGS, one per line with its help, then `:4` (no file
/// completion), as kubectl's Cobra expects.
fn complete(args: &[String]) -> String {
    let root = Cli::command();
    let (current, words) = args
        .split_last()
        .map_or(("", &[][..]), |(c, w)| (c.as_str(), w));
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
        Command::Version => {
            println!("aliaslb {}", aliaslb_ops::build::VERSION);
            println!("commit {}", aliaslb_ops::build::COMMIT);
            ExitCode::SUCCESS
        }
        Command::Completion { shell } => {
            let mut out = std::io::stdout().lock();
            clap_complete::generate(shell, &mut Cli::command(), "aliaslb", &mut out);
            let _ = out.flush();
            ExitCode::SUCCESS
        }
    }
}
