//! `aliaslb-agent`: parses flags, sets up logging, the API client, the metrics/health
//! server, the watch of its assignment object and the Lease heartbeat, then runs the alias loop: reconcile
//! on every desired-set change, netlink change, API return and periodic resync; refresh
//! lifetimes at every renewal tick. With the host-port shield on (the default), checks
//! nftables first and refuses to start without it. On SIGTERM/SIGINT removes its aliases,
//! then the shield's table, deletes its Lease and exits 0, within `--shutdown-timeout`. A
//! killed agent leaves its table in place (fail closed) while its aliases expire.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use aliaslb_agent::aliases::{
    AliasConfig, AliasManager, DesiredSet, ReconcileError, ReconcileReport,
};
use aliaslb_agent::announce::{AnnounceConfig, Announcer};
use aliaslb_agent::backend::{AddressBackend, BackendError, Lifetime};
use aliaslb_agent::config::{Flags, Settings};
use aliaslb_agent::http::{AgentProbes, Health};
use aliaslb_agent::lease::{self, Heartbeat, LeaseConfig};
use aliaslb_agent::metrics::Metrics;
use aliaslb_agent::netlink::{NetlinkBackend, watch_changes};
use aliaslb_agent::nft::NftBackend;
use aliaslb_agent::shield::Shield;
use aliaslb_agent::{assignments, host, telemetry};
use aliaslb_core::report::{AgentReport, Conflict, InterfaceReport, REPORT_VERSION};
use aliaslb_ops::http;
use anyhow::Context as _;
use clap::Parser;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{Notify, watch};
use tokio::time::MissedTickBehavior;
use tracing::{error, info, warn};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let flags = Flags::parse();
    aliaslb_ops::telemetry::init(flags.log_format, telemetry::DEFAULT_FILTER)
        .context("setting up logging")?;
    let settings = flags.into_settings().context("invalid flags")?;
    // Installed first: from here on SIGTERM means "clean up", not "die".
    let mut sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut sigint = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let Settings {
        node_name,
        namespace,
        agent_namespace,
        interface,
        lease_duration,
        renew_interval,
        alias_lifetime,
        resync_interval,
        shutdown_timeout,
        metrics_addr,
        log_format: _,
        host_port_shield,
    } = settings;
    info!(
        version = env!("CARGO_PKG_VERSION"),
        node = %node_name,
        %namespace,
        %agent_namespace,
        interface = interface.as_deref().unwrap_or("(from the assignment, subnet or default route)"),
        ?lease_duration,
        ?renew_interval,
        ?alias_lifetime,
        ?resync_interval,
        host_port_shield,
        "aliaslb-agent starting"
    );
    let shield = if host_port_shield {
        let shield = Shield::new(NftBackend::default());
        shield.check().await.context(
            "the host-port shield needs the `nft` binary and the kernel's nf_tables (with \
             sets, concatenations, conntrack and named counters); install nftables and load \
             nf_tables, or start with --host-port-shield=off to serve LB IPs without it",
        )?;
        info!(
            "host-port shield: nftables works; the table `inet aliaslb` is written at the first reconcile"
        );
        Some(shield)
    } else {
        warn!(
            "host-port shield off (--host-port-shield=off): every listener of this node answers on the LB IPs it holds"
        );
        None
    };

    let client = aliaslb_ops::api::client()
        .await
        .context("creating the Kubernetes client (KUBECONFIG or in-cluster config)")?;
    let metrics = Arc::new(Metrics::new());
    let health = Health::new((lease_duration * 3).max(Duration::from_secs(10)));
    let (stop_http, http_stopped) = watch::channel(false);
    let listener = http::bind(metrics_addr).await?;
    info!(addr = %metrics_addr, "serving /metrics, /healthz, /readyz");
    let probes = AgentProbes {
        metrics: metrics.clone(),
        health: health.clone(),
    };
    let server = tokio::spawn(http::serve(listener, Arc::new(probes), async move {
        let mut rx = http_stopped;
        let _ = rx.wait_for(|stop| *stop).await;
    }));

    let (desired_tx, desired_rx) = watch::channel(None);
    let watcher = tokio::spawn(assignments::watch_assignments(
        client.clone(),
        namespace,
        node_name.clone(),
        desired_tx,
    ));
    let heartbeat = Heartbeat::new(
        client,
        LeaseConfig {
            namespace: agent_namespace,
            node_name,
            lease_duration,
            renew_interval,
        },
    );
    let (report_tx, report_rx) = watch::channel(None);
    let api_back = Arc::new(Notify::new());
    let heartbeat_task = tokio::spawn(lease::run(
        heartbeat.clone(),
        report_rx,
        metrics.clone(),
        api_back.clone(),
    ));

    let announcer = Announcer::new(AnnounceConfig::default());
    let aliases = AliasManager::new(
        NetlinkBackend::connect().context("opening the netlink socket")?,
        AliasConfig {
            interface_override: interface,
            lifetime: Lifetime::for_lease(alias_lifetime),
        },
    )
    .with_announcer(announcer.clone())
    .with_shield(shield);
    metrics.track_announcer(announcer.clone());
    let changes = watch_changes().context("subscribing to netlink address and link changes")?;
    let mut node = Node {
        aliases,
        announcer,
        metrics: metrics.clone(),
        report_tx,
        links_up: BTreeMap::new(),
        interfaces: Vec::new(),
    };

    let signal = node
        .run(
            Loop {
                desired_rx,
                changes,
                api_back,
                health: health.clone(),
                renew_interval,
                resync_interval,
            },
            &mut sigterm,
            &mut sigint,
        )
        .await;
    info!(
        signal,
        "shutting down: removing aliases, then releasing the Lease"
    );

    let Node {
        mut aliases,
        report_tx,
        ..
    } = node;
    let shielded = aliases.shield().is_some();
    let cleanup = async {
        // Stop the heartbeat after its write in flight, so nothing re-creates the Lease.
        drop(report_tx);
        let _ = heartbeat_task.await;
        watcher.abort();
        let report = aliases.release_all().await;
        for e in &report.errors {
            error!(error = %e, "could not remove an alias (the kernel drops it when its lifetime ends)");
        }
        info!(removed = report.removed.len(), "aliases removed");
        // Only now, and only when every alias is gone: removing the table first would open
        // the aliases' host ports. Left in place, the next agent replaces it.
        let mut clean = report.errors.is_empty();
        if shielded && !clean {
            warn!(
                "some aliases could not be removed: the host-port shield table stays until they expire"
            );
        }
        if shielded && clean {
            match aliases.remove_shield().await {
                Ok(()) => info!("host-port shield table removed"),
                Err(e) => {
                    error!(error = %e, "could not remove the host-port shield table `inet aliaslb`");
                    clean = false;
                }
            }
        }
        let released = heartbeat.release().await;
        (clean, released)
    };
    let outcome = tokio::time::timeout(shutdown_timeout, cleanup).await;
    let _ = stop_http.send(true);
    let _ = server.await;
    match outcome {
        Ok((true, Ok(()))) => {
            info!("stopped");
            Ok(())
        }
        Ok((aliases_ok, released)) => {
            if let Err(e) = &released {
                error!(error = %e, "could not release the Lease: the controller moves the IPs when it expires");
            }
            anyhow::bail!(
                "shutdown incomplete (aliases and shield removed: {aliases_ok}, Lease released: {})",
                released.is_ok()
            )
        }
        Err(_) => anyhow::bail!(
            "shutdown did not finish within --shutdown-timeout {shutdown_timeout:?}; remaining aliases expire with their lifetime"
        ),
    }
}

/// The inputs of the alias loop.
struct Loop {
    desired_rx: watch::Receiver<Option<DesiredSet>>,
    changes: tokio::sync::mpsc::Receiver<()>,
    api_back: Arc<Notify>,
    health: Health,
    renew_interval: Duration,
    resync_interval: Duration,
}

/// Why a reconcile runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cause {
    Desired,
    Netlink,
    Resync,
    ApiBack,
    Retry,
}

/// How often the shield's drop counters are read for the metrics.
const SHIELD_COUNTERS_INTERVAL: Duration = Duration::from_secs(5);

/// The alias loop's state.
struct Node {
    aliases: AliasManager<NetlinkBackend, NftBackend>,
    announcer: Announcer,
    metrics: Arc<Metrics>,
    report_tx: watch::Sender<Option<AgentReport>>,
    /// Up/down state of every link at the last look, to re-announce on a link coming up.
    links_up: BTreeMap<u32, bool>,
    interfaces: Vec<InterfaceReport>,
}

impl Node {
    /// Runs until a signal arrives; returns its name.
    async fn run(
        &mut self,
        mut inputs: Loop,
        sigterm: &mut tokio::signal::unix::Signal,
        sigint: &mut tokio::signal::unix::Signal,
    ) -> &'static str {
        let mut renew = tokio::time::interval(inputs.renew_interval);
        renew.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut resync = tokio::time::interval(inputs.resync_interval);
        resync.set_missed_tick_behavior(MissedTickBehavior::Delay);
        resync.reset();
        let mut counters = tokio::time::interval(SHIELD_COUNTERS_INTERVAL);
        counters.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let shielded = self.aliases.shield().is_some();
        let mut synced = false;
        let mut watching = true;
        // Transient failures (kernel writes, dumps) are retried at the next renewal tick.
        let mut retry = false;
        loop {
            let cause = tokio::select! {
                biased;
                _ = sigterm.recv() => return "SIGTERM",
                _ = sigint.recv() => return "SIGINT",
                _ = renew.tick() => {
                    inputs.health.beat();
                    self.refresh().await;
                    if !(synced && retry) {
                        continue;
                    }
                    Cause::Retry
                }
                changed = inputs.desired_rx.changed(), if watching => {
                    if changed.is_err() {
                        // The watch task ended (it only does on a panic): keep serving
                        // and refreshing what we hold.
                        error!("the assignment watch stopped; the aliases held stay as they are");
                        watching = false;
                        continue;
                    }
                    Cause::Desired
                }
                _ = counters.tick(), if shielded => {
                    self.read_shield_counters().await;
                    continue;
                }
                Some(()) = inputs.changes.recv() => Cause::Netlink,
                _ = resync.tick() => Cause::Resync,
                () = inputs.api_back.notified() => Cause::ApiBack,
            };
            let Some(desired) = inputs.desired_rx.borrow_and_update().clone() else {
                continue;
            };
            let first = !synced;
            retry = self.reconcile(&desired, cause, first).await;
            if first {
                synced = true;
                inputs.health.set_ready();
                info!(
                    desired = desired.len(),
                    held = self.aliases.held_ips().len(),
                    "first reconcile done"
                );
            }
        }
    }

    /// Resets the lifetime of every alias held.
    async fn refresh(&mut self) {
        let report = self.aliases.refresh_lifetimes().await;
        for e in &report.errors {
            self.count_error(e);
        }
    }

    /// Brings the shield's drop counters into the metrics.
    async fn read_shield_counters(&self) {
        let Some(shield) = self.aliases.shield() else {
            return;
        };
        match shield.dropped().await {
            Ok(dropped) => self.metrics.set_shield_dropped(dropped),
            // The table is written at the first reconcile; until then there is none of ours.
            Err(e) => tracing::debug!(error = %e, "cannot read the shield's counters"),
        }
    }

    /// One reconcile, then the report and the metrics; returns whether a transient
    /// failure asks for a retry.
    async fn reconcile(&mut self, desired: &DesiredSet, cause: Cause, first: bool) -> bool {
        let held_before: BTreeSet<IpAddr> = self.aliases.held_ips().into_iter().collect();
        let start = Instant::now();
        let report = self.aliases.reconcile(desired).await;
        let took = start.elapsed();
        let repaired = repairs(&held_before, &report);
        if repaired > 0 {
            info!(repaired, "aliases deleted by someone else were put back");
        }
        self.metrics
            .record_reconcile(report.added.len(), report.removed.len(), repaired, took);
        let mut retry = false;
        for e in &report.errors {
            self.count_error(e);
            retry |= !matches!(e, ReconcileError::Interface { .. });
        }
        // Interfaces and link states only change with the links: look again on netlink
        // ticks, resyncs and at start.
        if first || matches!(cause, Cause::Netlink | Cause::Resync) {
            retry |= !self.look_at_links().await;
        }
        self.metrics
            .set_held(self.aliases.owned().map(|a| a.ifname.as_str()));
        self.metrics
            .set_desired(desired.len(), report.conflicts.len());
        if let Some(shield) = self.aliases.shield() {
            self.metrics
                .set_shield(shield.state(), shield.contents().len(), shield.errors());
        }
        self.publish();
        if report.changed() || !report.errors.is_empty() {
            info!(
                ?cause,
                added = report.added.len(),
                removed = report.removed.len(),
                adopted = report.adopted.len(),
                conflicts = report.conflicts.len(),
                errors = report.errors.len(),
                took_ms = took.as_millis(),
                "reconciled"
            );
        }
        retry
    }

    /// Reads links and subnets for the report, and re-announces the aliases of links that
    /// came back up (their neighbours may have forgotten us). Returns false when the node
    /// could not be read.
    async fn look_at_links(&mut self) -> bool {
        let host = match self.aliases.backend().snapshot().await {
            Ok(host) => host,
            Err(e) => {
                warn!(error = %e, "cannot read the node's interfaces");
                self.count_backend_error(&e);
                return false;
            }
        };
        self.interfaces = host::interfaces(&host);
        let came_up: Vec<&host::Link> = host
            .links
            .iter()
            .filter(|l| l.up && self.links_up.get(&l.index) == Some(&false))
            .collect();
        for link in came_up {
            let Some(mac) = link.mac else { continue };
            for alias in self.aliases.owned().filter(|a| a.ifindex == link.index) {
                info!(alias = %alias, "link came back up: re-announcing");
                self.announcer.announce(alias, mac);
            }
        }
        self.links_up = host.links.iter().map(|l| (l.index, l.up)).collect();
        true
    }

    /// Publishes the report; the heartbeat writes the Lease at once when it changed.
    fn publish(&self) {
        let report = AgentReport {
            version: REPORT_VERSION,
            interfaces: self.interfaces.clone(),
            // An alias on a link without carrier answers nobody: not held, so the
            // controller's break-before-make can move its IP at once.
            held: self
                .aliases
                .owned()
                .filter(|a| self.links_up.get(&a.ifindex) != Some(&false))
                .map(|a| a.ip)
                .collect(),
            conflicts: self
                .aliases
                .conflicts()
                .map(|c| Conflict {
                    mac: None,
                    interface: None,
                    ip: c.ip,
                    reason: format!("already configured on {} by another owner", c.ifname),
                })
                .collect(),
            shield: self.aliases.shield_state(),
        };
        self.report_tx.send_if_modified(|current| {
            let changed = current.as_ref() != Some(&report);
            if changed {
                *current = Some(report);
            }
            changed
        });
    }

    fn count_error(&self, e: &ReconcileError) {
        match e {
            ReconcileError::Snapshot(b) | ReconcileError::Write(b) => self.count_backend_error(b),
            ReconcileError::Interface { .. } | ReconcileError::Shield(_) => {}
        }
    }

    fn count_backend_error(&self, e: &BackendError) {
        let op = match e {
            BackendError::Connect(_) => "connect",
            BackendError::Kernel { op, .. } | BackendError::Protocol { op, .. } => op,
        };
        self.metrics.inc_netlink_error(op);
    }
}

/// Aliases this reconcile put back that we held before and did not remove on purpose
/// (someone else deleted them).
fn repairs(held_before: &BTreeSet<IpAddr>, report: &ReconcileReport) -> usize {
    let moved: BTreeSet<IpAddr> = report.removed.iter().map(|a| a.ip).collect();
    report
        .added
        .iter()
        .filter(|a| held_before.contains(&a.ip) && !moved.contains(&a.ip))
        .count()
}
