//! The leader fence of every write the controller makes (a Service's, a node assignment's):
//! checked right before the request is sent, and the request cut at the leader's write
//! deadline and within [`WRITE_TIMEOUT`] ([`guarded`]); why a write failed
//! ([`ApplyError`]), which the writer's one retry policy reads.

use std::time::{Duration, Instant};

/// How long one write may take.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a write failed (of a Service, or of a node assignment).
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// The API server refused or failed the call.
    #[error("{what} of {object} failed")]
    Api {
        /// Which write.
        what: &'static str,
        /// The object: `Service namespace/name`, `ConfigMap namespace/name`.
        object: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// No answer within [`WRITE_TIMEOUT`].
    #[error(
        "{what} of {object} timed out (at most {WRITE_TIMEOUT:?}, and never past the leader's write deadline)"
    )]
    Timeout {
        /// Which write.
        what: &'static str,
        /// The object: `Service namespace/name`, `ConfigMap namespace/name`.
        object: String,
    },
    /// This replica is not (or no longer) the leader.
    #[error("not the leader: {what} of {object} skipped")]
    NotLeader {
        /// Which write.
        what: &'static str,
        /// The object: `Service namespace/name`, `ConfigMap namespace/name`.
        object: String,
    },
}

impl ApplyError {
    /// Short stable category, for the metric label.
    pub fn category(&self) -> &'static str {
        match self {
            ApplyError::Api { source, .. } => match source {
                kube::Error::Api(status) if status.code == 404 => "not_found",
                kube::Error::Api(status) if status.code == 409 => "conflict",
                kube::Error::Api(status) if status.code == 422 => "invalid",
                kube::Error::Api(status) if status.code >= 500 => "api_server",
                kube::Error::Api(_) => "api_rejected",
                _ => "transport",
            },
            ApplyError::Timeout { .. } => "timeout",
            ApplyError::NotLeader { .. } => "not_leader",
        }
    }

    /// Whether retrying the same write later can help: everything but a vanished Service,
    /// lost leadership and a write the server refused as invalid.
    pub fn is_transient(&self) -> bool {
        !matches!(self.category(), "not_found" | "not_leader" | "invalid")
    }

    /// Whether the API server refused the write as invalid (422): the same write will be
    /// refused again, so it is only worth retrying once what it says changes.
    pub fn is_invalid(&self) -> bool {
        self.category() == "invalid"
    }
}

/// Runs one write `request` of `object` behind the leader fence (checked right before
/// it is sent: `fence` gives the write's deadline while this replica leads, see
/// `crate::leader`), within [`WRITE_TIMEOUT`] and never past that deadline.
pub async fn guarded<T>(
    what: &'static str,
    object: String,
    fence: &impl Fn() -> Option<Instant>,
    request: impl std::future::Future<Output = Result<T, kube::Error>>,
) -> Result<T, ApplyError> {
    let Some(until) = fence() else {
        return Err(ApplyError::NotLeader { what, object });
    };
    let budget = WRITE_TIMEOUT.min(until.saturating_duration_since(Instant::now()));
    match tokio::time::timeout(budget, request).await {
        Ok(Ok(written)) => Ok(written),
        Ok(Err(source)) => Err(ApplyError::Api {
            what,
            object,
            source,
        }),
        Err(_) => Err(ApplyError::Timeout { what, object }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_write_is_cut_at_the_leaders_write_deadline() {
        let until = Instant::now() + Duration::from_millis(100);
        let started = Instant::now();
        let slow = async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            Ok::<(), kube::Error>(())
        };
        let got = guarded("status", "Service a/web".into(), &|| Some(until), slow).await;
        assert!(matches!(got, Err(ApplyError::Timeout { .. })), "{got:?}");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "cut at the deadline, not after WRITE_TIMEOUT: {:?}",
            started.elapsed()
        );
        let refused = guarded("status", "Service a/web".into(), &|| None, async {
            Ok::<(), kube::Error>(())
        })
        .await;
        assert!(
            matches!(refused, Err(ApplyError::NotLeader { .. })),
            "{refused:?}"
        );
    }
}
