//! `aliaslb-controller`: parses flags, sets up logging, the API client, the metrics/health
//! server and leader election; runs the reconcile loop while leading; on SIGTERM/SIGINT
//! steps down, releases the leader Lease and exits.

use std::sync::Arc;

use aliaslb_controller::config::{Flags, Settings};
use aliaslb_controller::context::Context;
use aliaslb_controller::http::{self, Readiness};
use aliaslb_controller::leader::{self, Leadership};
use aliaslb_controller::metrics::Metrics;
use aliaslb_controller::telemetry;
use anyhow::Context as _;
use clap::Parser;
use tokio::sync::watch;
use tokio::task::JoinHandle;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let flags = Flags::parse();
    telemetry::init(flags.log_format).context("setting up logging")?;
    let Settings {
        controller,
        leader: leader_config,
        metrics_addr,
        log_format: _,
    } = flags.into_settings().context("invalid flags")?;
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        identity = %leader_config.identity,
        namespace = %controller.namespace,
        load_balancer_class = %controller.load_balancer_class,
        ignore_classless = controller.ignore_classless,
        respect_cordon = controller.respect_cordon,
        agent_lease_duration = ?controller.agent_lease_duration,
        "aliaslb-controller starting"
    );

    let client = kube::Client::try_default()
        .await
        .context("creating the Kubernetes client (KUBECONFIG or in-cluster config)")?;

    let metrics = Arc::new(Metrics::new());
    let readiness = Readiness::new();
    let (stop_http, http_stopped) = watch::channel(false);
    let listener = http::bind(metrics_addr).await?;
    tracing::info!(addr = %metrics_addr, "serving /metrics, /healthz, /readyz");
    let server = tokio::spawn(http::serve(
        listener,
        metrics.clone(),
        readiness.clone(),
        wait_true(http_stopped),
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
    let supervisor = tokio::spawn(supervise(ctx, leadership));

    // Followers are ready too: readiness only says the process can talk to the API.
    // The reconcile loop marks it once its caches have synced (see `run_reconcile`); until
    // then, reaching the API server is the bar.
    client
        .apiserver_version()
        .await
        .context("reaching the Kubernetes API server")?;
    readiness.set_ready();

    shutdown_signal().await?;
    tracing::info!("shutting down");
    // Step down and release first, so the other replica takes over at once.
    if let Err(error) = elector.shutdown().await {
        tracing::warn!(error = %error, source = ?std::error::Error::source(&error), "releasing the leader Lease failed; the other replica takes over after the lease duration");
    }
    supervisor.abort();
    let _ = stop_http.send(true);
    let _ = server.await;
    tracing::info!("stopped");
    Ok(())
}

/// Follow leadership edges: run the reconcile loop while leading, stop it on losing.
async fn supervise(ctx: Arc<Context>, leadership: Leadership) {
    let mut edges = leadership.watch();
    let mut running: Option<JoinHandle<()>> = None;
    loop {
        let leading = *edges.borrow_and_update();
        ctx.metrics.set_leader(leading);
        match (leading, running.take()) {
            (true, None) => running = Some(tokio::spawn(run_reconcile(ctx.clone()))),
            (true, Some(task)) => running = Some(task),
            (false, Some(task)) => task.abort(),
            (false, None) => {}
        }
        if edges.changed().await.is_err() {
            if let Some(task) = running.take() {
                task.abort();
            }
            ctx.metrics.set_leader(false);
            return;
        }
    }
}

/// The reconcile loop, started on becoming leader and aborted on losing leadership.
/// Every write it makes must check `ctx.leader.is_leader()` first.
async fn run_reconcile(ctx: Arc<Context>) {
    tracing::info!(
        class = %ctx.config.load_balancer_class,
        "leading: the reconcile loop would start here (not implemented yet)"
    );
    std::future::pending::<()>().await;
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
