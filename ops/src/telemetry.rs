//! Logging setup for both binaries: installs the global `tracing` subscriber (text or JSON on
//! stderr). `RUST_LOG` is respected; when it is unset or empty the binary's default filter
//! applies.
//!
//! Does no I/O beyond reading `RUST_LOG` and writing log lines.

use tracing_subscriber::EnvFilter;
use tracing_subscriber::filter::{FromEnvError, ParseError};

/// How log lines are written (`--log-format`).
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
    Filter(#[source] FromEnvError),
    /// The binary's own default filter does not parse (a bug in the binary).
    #[error("the default log filter {filter:?} is not valid")]
    Default {
        /// The default filter given.
        filter: &'static str,
        /// Cause.
        #[source]
        source: ParseError,
    },
    /// A global subscriber was already installed.
    #[error("a global tracing subscriber is already installed")]
    AlreadyInstalled(#[source] tracing_subscriber::util::TryInitError),
}

/// The filter: `rust_log` (the value of `RUST_LOG`) when set and not empty, else
/// `default_filter` (directives such as `info,kube=warn`).
pub fn filter(
    default_filter: &'static str,
    rust_log: Option<&str>,
) -> Result<EnvFilter, TelemetryError> {
    match rust_log.filter(|s| !s.is_empty()) {
        Some(directives) => EnvFilter::builder()
            .parse(directives)
            .map_err(|e| TelemetryError::Filter(e.into())),
        None => EnvFilter::builder()
            .parse(default_filter)
            .map_err(|source| TelemetryError::Default {
                filter: default_filter,
                source,
            }),
    }
}

/// Install the global subscriber, filtered by `RUST_LOG` or else `default_filter` (see
/// [`filter`]). Call once, first thing in `main`.
pub fn init(format: LogFormat, default_filter: &'static str) -> Result<(), TelemetryError> {
    use tracing_subscriber::util::SubscriberInitExt;

    let rust_log = std::env::var(EnvFilter::DEFAULT_ENV).ok();
    let filter = filter(default_filter, rust_log.as_deref())?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.finish().try_init(),
        LogFormat::Json => builder.json().flatten_event(true).finish().try_init(),
    }
    .map_err(TelemetryError::AlreadyInstalled)
}

#[cfg(test)]
mod tests {
    use super::*;

    const QUIET_KUBE: &str = "info,kube_client::client::builder=off";

    fn shown(default_filter: &'static str, rust_log: Option<&str>) -> String {
        filter(default_filter, rust_log).unwrap().to_string()
    }

    #[test]
    fn the_default_applies_without_rust_log() {
        assert_eq!(shown("info", None), "info");
        assert_eq!(shown("info", Some("")), "info");
        let quiet = shown(QUIET_KUBE, None);
        assert!(
            quiet.contains("kube_client::client::builder=off") && quiet.contains("info"),
            "{quiet}"
        );
    }

    #[test]
    fn rust_log_replaces_the_default() {
        assert_eq!(shown("info", Some("kube=debug")), "kube=debug");
        assert_eq!(shown(QUIET_KUBE, Some("debug")), "debug");
    }

    #[test]
    fn invalid_filters_are_refused_and_blamed_right() {
        let err = filter("info", Some("kube=loudest")).unwrap_err();
        assert!(matches!(err, TelemetryError::Filter(_)), "{err}");
        assert_eq!(err.to_string(), "RUST_LOG is not a valid log filter");
        let err = filter("kube=loudest", None).unwrap_err();
        assert!(
            matches!(
                err,
                TelemetryError::Default {
                    filter: "kube=loudest",
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn installs_once() {
        // The only test here that installs a subscriber. RUST_LOG of the environment running
        // the tests is read, so an invalid one fails this test.
        init(LogFormat::Json, "info").unwrap();
        let second = init(LogFormat::Text, "info").unwrap_err();
        assert!(
            matches!(second, TelemetryError::AlreadyInstalled(_)),
            "{second}"
        );
    }
}
