//! The `aliaslb` CLI's subcommands, one module each; `src/bin/aliaslb.rs` only parses the
//! command line and dispatches.

pub mod status;
pub mod validate;
