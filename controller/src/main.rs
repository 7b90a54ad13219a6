//! `aliaslb-controller`: parses flags, sets up logging, the API client, the metrics/health
//! server and leader election; runs the reconcile loop while leading; on SIGTERM/SIGINT
//! steps down, releases the leader Lease and exits.

use std::sync::Arc;

use aliaslb_controller::config::{Flags, Settings};
use aliaslb_controller::context::Context;
use aliaslb_controller::http::{ControllerProbes, Readiness};
use aliaslb_controller::leader;
use aliaslb_controller::metrics::Metrics;
use aliaslb_controller::reconcile;
use aliaslb_controller::telemetry;
use aliaslb_ops::http;
use anyhow::Context as _;
use clap::Parser;
use tokio::sync::watch;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let flags = Flags::parse();
    aliaslb_ops::telemetry::init(flags.log_format, telemetry::DEFAULT_FILTER)
        .context("setting up logging")?;
    let Settings {
        controller,
        leader: leader_config,
        metrics_addr,
        log_format: _,
    } = flags.into_settings().context("invalid flags")?;
    tracing::info!(
        version = aliaslb_ops::build::VERSION,
        commit = aliaslb_ops::build::COMMIT,
        identity = %leader_config.identity,
        namespace = %controller.namespace,
        load_balancer_class = %controller.load_balancer_class,
        ignore_classless = controller.ignore_classless,
        respect_cordon = controller.respect_cordon,
        agent_lease_duration = ?controller.agent_lease_duration,
        fast_failover = controller.fast_failover,
        "aliaslb-controller starting"
    );

    let client = aliaslb_ops::api::client()
        .await
        .context("creating the Kubernetes client (KUBECONFIG or in-cluster config)")?;

    let metrics = Arc::new(Metrics::new());
    let readiness = Readiness::new();
    let (stop_http, http_stopped) = watch::channel(false);
    let listener = http::bind(metrics_addr).await?;
    tracing::info!(addr = %metrics_addr, "serving /metrics, /healthz, /readyz");
    let probes = ControllerProbes {
        metrics: metrics.clone(),
        readiness: readiness.clone(),
    };
    let server = tokio::spawn(http::serve(
        listener,
        Arc::new(probes),
        wait_true(http_stopped),
    ));

    tokio::spawn(aliaslb_controller::legacy_key::delete(
        client.clone(),
        controller.namespace.clone(),
    ));
    let identity = leader_config.identity.clone();
    let (leadership, elector) = leader::start(client.clone(), leader_config);
    let ctx = Context::new(
        client.clone(),
        controller,
        metrics.clone(),
        leadership.clone(),
        &identity,
    );
    // Caches run in every replica; `/readyz` turns true once they synced (followers too).
    let mut controller = tokio::spawn(reconcile::run(ctx, readiness.clone()));

    let outcome = tokio::select! {
        signal = shutdown_signal() => signal,
        ended = &mut controller => match ended {
            Ok(Ok(())) => Err(anyhow::anyhow!("the controller stopped unexpectedly")),
            Ok(Err(error)) => Err(anyhow::Error::new(error).context("controller failed")),
            Err(join) => Err(anyhow::Error::new(join).context("controller task failed")),
        },
    };
    tracing::info!("shutting down");
    // Step down and release first, so the other replica takes over at once.
    if let Err(error) = elector.shutdown().await {
        tracing::warn!(error = %error, source = ?std::error::Error::source(&error), "releasing the leader Lease failed; the other replica takes over after the lease duration");
    }
    controller.abort();
    let _ = stop_http.send(true);
    let _ = server.await;
    tracing::info!("stopped");
    outcome
}

/// Resolves once the channel holds `true` (or its sender is gone).
async fn wait_true(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

/// Resolves on SIGTERM (Kubernetes) or SIGINT (Ctrl-C).
async fn shutdown_signal() -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    tokio::select! {
        _ = term.recv() => tracing::info!(signal = "SIGTERM", "received signal"),
        result = tokio::signal::ctrl_c() => {
            result.context("installing the SIGINT handler")?;
            tracing::info!(signal = "SIGINT", "received signal");
        }
    }
    Ok(())
}
