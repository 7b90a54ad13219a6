//! `aliaslb`: the user-facing CLI. Parses the command line and hands over to the
//! subcommand's module in `aliaslb_controller::cli`.

use std::process::ExitCode;

use aliaslb_controller::cli::validate;
use clap::{Parser, Subcommand};

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
    }
}
