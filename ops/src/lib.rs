//! The operational plumbing both binaries (`aliaslb-controller`, `aliaslb-agent`) share:
//! logging setup, the `/metrics` `/healthz` `/readyz` server, flag value parsers.
//!
//! Does network I/O (the server in [`http`]); the rest is pure. Each binary keeps only what
//! is its own: its probe logic (a [`http::Probes`] implementation), its metrics, its flags
//! and its default log filter.

pub mod flags;
pub mod http;
pub mod metrics;
pub mod telemetry;
