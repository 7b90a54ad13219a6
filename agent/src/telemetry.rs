//! Logging setup: installs the global `tracing` subscriber (text or JSON on stderr). Same
//! shape and flag values as the controller's `telemetry` module.
//!
//! Does no I/O beyond writing log lines. `RUST_LOG` is respected; without it the filter
//! is [`DEFAULT_FILTER`].

use tracing_subscriber::EnvFilter;

/// The filter without `RUST_LOG`: `info`, minus kube-client's own line per failed request
/// (an ERROR every renewal during an API outage). The agent logs those failures itself,
/// once per outage edge, and counts each in `aliaslb_agent_lease_renew_failures_total`.
pub const DEFAULT_FILTER: &str = "info,kube_client::client::builder=off";

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

/// Why the subscriber could not be installed.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// `RUST_LOG` is set but is not a valid filter.
    #[error("RUST_LOG is not a valid log filter")]
    Filter(#[source] tracing_subscriber::filter::FromEnvError),
    /// A global subscriber was already installed.
    #[error("a global tracing subscriber is already installed")]
    AlreadyInstalled(#[source] tracing_subscriber::util::TryInitError),
}

/// Install the global subscriber. Call once, first thing in `main`.
pub fn init(format: LogFormat) -> Result<(), TelemetryError> {
    use tracing_subscriber::util::SubscriberInitExt;

    let filter = match std::env::var(EnvFilter::DEFAULT_ENV) {
        Ok(_) => EnvFilter::try_from_default_env().map_err(TelemetryError::Filter)?,
        Err(_) => EnvFilter::new(DEFAULT_FILTER),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.finish().try_init(),
        LogFormat::Json => builder.json().flatten_event(true).finish().try_init(),
    }
    .map_err(TelemetryError::AlreadyInstalled)
}
