//! The operational plumbing both binaries (`aliaslb-controller`, `aliaslb-agent`) share:
//! the Kubernetes API client and watch retry policy ([`api`]: dead connections noticed
//! within seconds), the one watch loop ([`watch`]), the jitter of every retry and
//! periodic re-read a crowd would otherwise take in step ([`backoff`]), logging setup, the `/metrics`
//! `/healthz` `/readyz` server, flag value parsers, what this build is ([`build`]).
//!
//! Does network I/O (the server in [`http`], the client in [`api`], the watches
//! [`watch`] drives); the rest is pure. Each binary keeps only what is its own: its probe
//! logic (a [`http::Probes`] implementation), its metrics, its flags and its default log
//! filter.

pub mod api;
pub mod backoff;
pub mod build;
pub mod flags;
pub mod http;
pub mod metrics;
pub mod telemetry;
pub mod watch;
