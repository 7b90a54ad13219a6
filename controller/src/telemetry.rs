//! Logging setup: installs the global `tracing` subscriber (text or JSON on stderr).
//!
//! Does no I/O beyond writing log lines. `RUST_LOG` is respected; without it the level
//! is `info`.

use tracing_subscriber::EnvFilter;

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

    let filter = EnvFilter::builder()
        .with_default_directive(tracing::Level::INFO.into())
        .from_env()
        .map_err(TelemetryError::Filter)?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.finish().try_init(),
        LogFormat::Json => builder.json().flatten_event(true).finish().try_init(),
    }
    .map_err(TelemetryError::AlreadyInstalled)
}
