//! `aliaslb-agent`: parses flags, sets up logging, the API client, the metrics/health
//! server and the parts (the kernel side over netlink with every request bounded, the
//! shield, the LAN guard, fast failover, L3 mode, the heartbeat), then runs the loop that
//! wires them ([`aliaslb_agent::run`]). With the host-port shield on (the default), checks
//! nftables first and refuses to start without it. On SIGTERM/SIGINT removes its aliases,
//! then the shield's table, deletes its Lease and exits 0, within `--shutdown-timeout`. A
//! killed agent leaves its table in place (fail closed) while its aliases expire.

use std::sync::Arc;
use std::time::Duration;

use aliaslb_agent::aliases::{AliasConfig, AliasManager};
use aliaslb_agent::config::{Flags, Settings};
use aliaslb_agent::heartbeat::{
    self, Authority, HeartbeatLinks, KernelRounds, LeaseConfig, LeaseHolderCheck,
};
use aliaslb_agent::http::{AgentProbes, Health};
use aliaslb_agent::kernel::backend::{Lifetime, REQUEST_TIMEOUT, Timed};
use aliaslb_agent::kernel::netlink::{NetlinkBackend, watch_changes};
use aliaslb_agent::l2::announce::{AnnounceConfig, Announcer};
use aliaslb_agent::l2::failover::wire::{Signer, Wire};
use aliaslb_agent::l2::failover::{FailoverConfig, FailoverSetup, FastFailover};
use aliaslb_agent::l2::guard::{GuardConfig, LanGuard, LanGuardSetup};
use aliaslb_agent::l2::lan::{LanWatch, ProbeConfig};
use aliaslb_agent::l2::returning;
use aliaslb_agent::l3::routing::{DaemonSpec, DaemonView};
use aliaslb_agent::l3::{self, Routed};
use aliaslb_agent::metrics::Metrics;
use aliaslb_agent::run::{self, Agent, Heartbeat, Inputs, Parts};
use aliaslb_agent::shield::Shield;
use aliaslb_agent::shield::nft::NftBackend;
use aliaslb_agent::{assignments, telemetry};
use aliaslb_ops::http;
use anyhow::Context as _;
use clap::Parser;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{Notify, watch};
use tracing::{error, info, warn};

/// Bound on one reading of the routing daemon (a stuck daemon must not stall the reports).
const ROUTING_READ_TIMEOUT: Duration = Duration::from_secs(2);

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let flags = Flags::parse();
    aliaslb_ops::telemetry::init(flags.log_format, telemetry::DEFAULT_FILTER)
        .context("setting up logging")?;
    let settings = flags.into_settings().context("invalid flags")?;
    // Installed first: from here on SIGTERM means "clean up", not "die".
    let mut sigterm = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut sigint = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    log_start(&settings);
    let Settings {
        node_name,
        namespace,
        agent_namespace,
        interface,
        lease_duration,
        renew_interval,
        alias_lifetime,
        refresh_interval,
        resync_interval,
        shutdown_timeout,
        metrics_addr,
        log_format: _,
        host_port_shield,
        routed_device,
        routing_daemon,
        advert_port,
        advert_interval,
    } = settings;
    // First of all, before the kernel answers for an IP another node may hold now: a
    // returning holder asks the LAN first. The LAN: one AF_PACKET socket per interface
    // watches claims for the held IPs, and first claims are probed through it.
    let (netlink, routed_device) = start_kernel(&routed_device).await?;
    let (lan, claims) = LanWatch::start();
    let nft = host_port_shield.then(NftBackend::default);
    let returning = returning::ask_the_lan_first(&netlink, nft.as_ref(), &lan, &routed_device)
        .await
        .context("asking the LAN about the aliases of a run before")?;
    let shield = start_shield(host_port_shield).await?;
    let client = aliaslb_ops::api::client()
        .await
        .context("creating the Kubernetes client (KUBECONFIG or in-cluster config)")?;
    let metrics = Arc::new(Metrics::new());
    // The loop beats at every lifetime refresh: ten missed beats is a hung loop.
    let health = Health::new((refresh_interval * 10).max(Duration::from_secs(10)));
    // When the Lease was last renewed: the heartbeat records it, `/readyz` waits for the first.
    let authority = Authority::new(lease_duration);
    let (stop_http, server) = serve_http(metrics_addr, &metrics, &health, &authority).await?;

    // The Kubernetes side: the assignment watch and the heartbeat.
    let (desired_tx, desired_rx) = watch::channel(None);
    let watcher = tokio::spawn(assignments::watch_assignments(
        client.clone(),
        namespace.clone(),
        node_name.clone(),
        desired_tx,
    ));
    let holders = LeaseHolderCheck::new(client.clone(), &agent_namespace);
    // Fast L2 failover: this node's own signing key, made now, never leaving the process.
    let signer = Signer::generate()
        .map_err(anyhow::Error::msg)
        .context("making this node's advert key")?;
    let (wire, heard) = Wire::start(
        &node_name,
        advert_port,
        advert_interval,
        signer.clone(),
        metrics.failover.clone(),
    );
    let lease = heartbeat::Heartbeat::new(
        client,
        LeaseConfig {
            namespace: agent_namespace,
            node_name: node_name.clone(),
            lease_duration,
            renew_interval,
            alias_lifetime,
        },
    );
    let (report_tx, report_rx) = watch::channel(None);
    let api_back = Arc::new(Notify::new());
    let kernel = KernelRounds::new();
    let heartbeat_task = tokio::spawn(heartbeat::run(
        lease.clone(),
        report_rx,
        metrics.heartbeat.clone(),
        HeartbeatLinks {
            api_back: api_back.clone(),
            authority: authority.clone(),
            kernel: kernel.clone(),
        },
    ));

    // The kernel side and the parts.
    let announcer = Announcer::new(AnnounceConfig::default());
    metrics.lan.track_announcer(announcer.clone());
    let routed = start_l3(&routing_daemon, refresh_interval, &metrics)?;
    let aliases = AliasManager::new(
        Timed::new(netlink, REQUEST_TIMEOUT),
        AliasConfig {
            interface_override: interface,
            lifetime: Lifetime::for_lease(alias_lifetime),
            routed_device,
        },
    )
    .with_announcer(announcer.clone())
    .with_shield(shield);
    let changes = watch_changes().context("subscribing to netlink address and link changes")?;
    metrics.lan.track_lan(lan.clone());
    let lan = Arc::new(lan);
    let mut guard = LanGuard::new(LanGuardSetup {
        lan: lan.clone(),
        claims,
        guard: GuardConfig::default(),
        probe: ProbeConfig::default(),
        recheck: ProbeConfig::quick(),
        announcer: Some(announcer),
        metrics: metrics.lan.clone(),
    });
    guard.returning(returning.to_recheck());
    let mut agent = Agent::new(
        aliases,
        Parts {
            lan: guard,
            failover: FastFailover::new(FailoverSetup {
                node: node_name,
                config: FailoverConfig::new(advert_interval, alias_lifetime),
                lan,
                heard,
                streams: wire.streams(),
                trust: Some(wire.trust()),
                key: advert_port.map(|_| signer.public_key()),
                holders: Some(Arc::new(holders)),
                metrics: metrics.failover.clone(),
            }),
            routed,
            heartbeat: Heartbeat {
                report_tx,
                authority,
                kernel,
            },
            metrics,
        },
    )
    .with_handovers(NftBackend::default());

    let stop = async {
        tokio::select! {
            _ = sigterm.recv() => "SIGTERM",
            _ = sigint.recv() => "SIGINT",
        }
    };
    let inputs = Inputs {
        desired_rx,
        changes,
        api_back,
        health,
        refresh_interval,
        resync_interval,
    };
    let signal = agent.run(inputs, stop).await;
    info!(
        signal,
        "shutting down: removing aliases, then releasing the Lease"
    );
    agent.lift_handovers().await;
    let (aliases, report_tx) = agent.into_parts();
    let cleanup = async {
        // Stop the heartbeat after its write in flight, so nothing re-creates the Lease.
        drop(report_tx);
        let _ = heartbeat_task.await;
        watcher.abort();
        run::shut_down(aliases, &wire, &lease).await
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

/// The netlink socket and the routed device (L3 mode's).
async fn start_kernel(routed_device: &str) -> anyhow::Result<(NetlinkBackend, String)> {
    let netlink = NetlinkBackend::connect().context("opening the netlink socket")?;
    let (routed_device, fallback) = netlink.routed_device(routed_device).await;
    match fallback {
        Some(e) => warn!(
            error = %e,
            "L3 mode: cannot create or set up the routed device, routed addresses go on lo \
             (the kernel may lack the dummy driver); the routing daemon must export lo's \
             host routes in the pools"
        ),
        None => info!(device = %routed_device, "L3 mode: routed addresses go on this device"),
    }
    Ok((netlink, routed_device))
}

/// Says the settings the agent starts with.
fn log_start(s: &Settings) {
    info!(
        version = aliaslb_ops::build::VERSION,
        commit = aliaslb_ops::build::COMMIT,
        node = %s.node_name,
        namespace = %s.namespace,
        agent_namespace = %s.agent_namespace,
        interface = s.interface.as_deref().unwrap_or("(from the assignment, subnet or default route)"),
        lease_duration = ?s.lease_duration,
        renew_interval = ?s.renew_interval,
        alias_lifetime = ?s.alias_lifetime,
        refresh_interval = ?s.refresh_interval,
        resync_interval = ?s.resync_interval,
        host_port_shield = s.host_port_shield,
        advert_port = ?s.advert_port,
        advert_interval = ?s.advert_interval,
        "aliaslb-agent starting"
    );
}

/// The host-port shield, once nftables is known to work (`None`: turned off).
async fn start_shield(on: bool) -> anyhow::Result<Option<Shield<NftBackend>>> {
    if !on {
        warn!(
            "host-port shield off (--host-port-shield=off): every listener of this node answers on the LB IPs it holds"
        );
        return Ok(None);
    }
    let shield = Shield::new(NftBackend::default());
    shield.check().await.context(
        "the host-port shield needs the `nft` binary and the kernel's nf_tables (with \
         sets, concatenations, conntrack and named counters); install nftables and load \
         nf_tables, or start with --host-port-shield=off to serve LB IPs without it",
    )?;
    info!(
        "host-port shield: nftables works; the table `inet aliaslb` is written at the first reconcile"
    );
    Ok(Some(shield))
}

/// Serves `/metrics`, `/healthz` and `/readyz` until the returned sender says stop.
async fn serve_http(
    addr: std::net::SocketAddr,
    metrics: &Arc<Metrics>,
    health: &Health,
    lease: &Authority,
) -> anyhow::Result<(watch::Sender<bool>, tokio::task::JoinHandle<()>)> {
    let (stop, stopped) = watch::channel(false);
    let listener = http::bind(addr).await?;
    info!(%addr, "serving /metrics, /healthz, /readyz");
    let probes = AgentProbes {
        metrics: metrics.clone(),
        health: health.clone(),
        lease: lease.clone(),
    };
    let server = tokio::spawn(http::serve(listener, Arc::new(probes), async move {
        let mut rx = stopped;
        let _ = rx.wait_for(|stop| *stop).await;
    }));
    Ok((stop, server))
}

/// L3 mode: the routing daemon's reader, started unless `--routing-daemon=none`.
fn start_l3(spec: &str, interval: Duration, metrics: &Metrics) -> anyhow::Result<Routed> {
    let parsed: DaemonSpec = spec.parse().context("invalid flags")?;
    let (tx, rx) = watch::channel(None);
    if parsed != DaemonSpec::None {
        for warning in l3::arp_warnings(std::path::Path::new(l3::PROC_CONF)) {
            warn!("L3 mode: {warning}");
        }
        let daemon = parsed.daemon();
        info!(
            daemon,
            spec, "L3 mode: reading the routing daemon (read-only)"
        );
        tokio::spawn(l3::watch_daemon(
            DaemonView {
                spec: parsed,
                timeout: ROUTING_READ_TIMEOUT,
            },
            daemon,
            interval,
            tx,
            metrics.routing.clone(),
        ));
    }
    Ok(Routed::new(rx, metrics.routing.clone()))
}
