//! `aliaslb`: the user-facing CLI. Parses the command line and hands over to the
//! subcommand's module in `aliaslb_controller::cli`.

use std::process::ExitCode;

use aliaslb_controller::cli::status;
use aliaslb_controller::cli::validate;
use aliaslb_core::keys;
use clap::{Parser, Subcommand, ValueEnum};

/// aliaslb: bare-metal LoadBalancer for Kubernetes.
#[derive(Debug, Parser)]
#[command(name = "aliaslb", version, about)]
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
}

/// Arguments of `aliaslb status`.
#[derive(Debug, clap::Args)]
struct StatusArgs {
    /// Namespace of the controller: the pool ConfigMap and the node assignments.
    #[arg(long, env = "POD_NAMESPACE", default_value = keys::DEFAULT_NAMESPACE)]
    namespace: String,
    /// Namespace of the agents' Leases.
    #[arg(long, env = "ALIASLB_AGENT_NAMESPACE", default_value = keys::DEFAULT_AGENT_NAMESPACE)]
    agent_namespace: String,
    /// Name of the pool ConfigMap.
    #[arg(long, env = "ALIASLB_POOL_CONFIGMAP", default_value = keys::DEFAULT_POOL_CONFIGMAP)]
    pool_configmap: String,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = Output::Table)]
    output: Output,
}

/// `aliaslb status` output formats.
#[derive(Debug, Clone, Copy, ValueEnum)]
enum Output {
    /// Aligned columns for people.
    Table,
    /// JSON for scripts (stable field names).
    Json,
}

/// Runs `aliaslb status`: 0 on success, 1 when the cluster cannot be read or the pool
/// ConfigMap is invalid.
fn run_status(args: &StatusArgs) -> ExitCode {
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
    let report = runtime.block_on(async {
        let client = kube::Client::try_default()
            .await
            .map_err(|e| format!("cannot build a Kubernetes client (KUBECONFIG): {e}"))?;
        status::fetch(
            &client,
            &args.namespace,
            &args.agent_namespace,
            &args.pool_configmap,
        )
        .await
        .map_err(|e| {
            let source = std::error::Error::source(&e)
                .map(|s| format!(": {s}"))
                .unwrap_or_default();
            format!("{e}{source}")
        })
    });
    match report {
        Ok(report) => {
            match args.output {
                Output::Table => print!("{}", status::render_table(&report)),
                Output::Json => match serde_json::to_string_pretty(&report) {
                    Ok(json) => println!("{json}"),
                    Err(e) => {
                        eprintln!("aliaslb: cannot encode the report: {e}");
                        return ExitCode::FAILURE;
                    }
                },
            }
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("aliaslb: {message}");
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    let Cli { command } = Cli::parse();
    match command {
        Command::Validate(args) => ExitCode::from(validate::run(
            &args.files,
            &mut std::io::stdin().lock(),
            &mut std::io::stdout().lock(),
            &mut std::io::stderr().lock(),
        )),
        Command::Status(args) => run_status(&args),
    }
}
