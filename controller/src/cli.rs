//! The `aliaslb` CLI's subcommands, one module each; `src/bin/aliaslb.rs` only parses the
//! command line and dispatches. `connect` reaches the cluster as kubectl does
//! (`--kubeconfig`, `--context`); `live` reads it once for the read-only commands and runs
//! the controller's planner over it; `select` holds the filters and output formats they
//! share; `complete` answers kubectl's completion with names from the cluster; `version`
//! reads the versions the cluster runs.

pub mod bundle;
pub mod check;
pub mod complete;
pub mod connect;
pub mod explain;
pub mod live;
pub mod pools;
pub mod select;
pub mod simulate;
pub mod status;
pub mod validate;
pub mod version;
