//! aliaslb-controller as a library: the parts the binaries and integration tests share.

pub mod cli;
pub mod config;
pub mod context;
pub mod fence;
pub mod handover;
pub mod http;
pub mod leader;
pub mod legacy_key;
pub mod metrics;
pub mod observe;
pub mod pool_state;
pub mod reconcile;
pub mod store;
pub mod telemetry;
pub mod track;
pub mod watch;
pub mod write;
