//! The shared state every reconcile gets: API client, settings, metrics, leadership and
//! the Event reporter. No I/O of its own.

use std::sync::Arc;

use aliaslb_core::keys;
use kube::Client;
use kube::runtime::events::Reporter;

use crate::config::ControllerConfig;
use crate::leader::Leadership;
use crate::metrics::Metrics;

/// Shared state of the controller, passed to reconciles as `Arc<Context>`.
#[derive(Clone)]
pub struct Context {
    /// Kubernetes API client.
    pub client: Client,
    /// Settings from the flags.
    pub config: ControllerConfig,
    /// Metrics handles.
    pub metrics: Arc<Metrics>,
    /// Leadership: check [`Leadership::is_leader`] right before every write.
    pub leader: Leadership,
    /// Who emits Events (`reportingController` / `reportingInstance`).
    pub reporter: Reporter,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // `kube::Client` has no Debug.
        f.debug_struct("Context")
            .field("config", &self.config)
            .field("metrics", &self.metrics)
            .field("leader", &self.leader)
            .field("reporter", &self.reporter)
            .finish_non_exhaustive()
    }
}

impl Context {
    /// The context of a running controller; `identity` is this replica's (pod) name.
    pub fn new(
        client: Client,
        config: ControllerConfig,
        metrics: Arc<Metrics>,
        leader: Leadership,
        identity: &str,
    ) -> Arc<Self> {
        Arc::new(Context {
            client,
            config,
            metrics,
            leader,
            reporter: Reporter {
                controller: keys::CONTROLLER_FIELD_MANAGER.to_owned(),
                instance: Some(identity.to_owned()),
            },
        })
    }

    /// A context for tests: default settings, fresh metrics, always leader.
    pub fn for_tests(client: Client) -> Arc<Self> {
        Self::new(
            client,
            ControllerConfig::default(),
            Arc::new(Metrics::new()),
            Leadership::fixed(true),
            "test",
        )
    }
}
