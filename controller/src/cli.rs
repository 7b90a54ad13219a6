//! The `aliaslb` CLI's subcommands, one module each; `src/bin/aliaslb.rs` only parses the
//! command line and dispatches. `live` reads the cluster once for the read-only commands
//! and runs the controller's planner over it.

pub mod explain;
pub mod live;
pub mod pools;
pub mod simulate;
pub mod status;
pub mod validate;
