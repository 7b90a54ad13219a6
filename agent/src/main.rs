//! `aliaslb-agent`: parses flags, sets up logging, the API client, the metrics/health
//! server, the watch of its assignment object and the Lease heartbeat, then runs the alias
//! loop (`aliaslb_agent::node`, over netlink with every request bounded, the shield and
//! the LAN). With the host-port shield on (the default), checks
//! nftables first and refuses to start without it. On SIGTERM/SIGINT removes its aliases,
//! then the shield's table, deletes its Lease and exits 0, within `--shutdown-timeout`. A
//! killed agent leaves its table in place (fail closed) while its aliases expire.

use std::sync::Arc;
use std::time::Duration;

use aliaslb_agent::aliases::{AliasConfig, AliasManager};
use aliaslb_agent::config::{Flags, Settings};
use aliaslb_agent::http::{AgentProbes, Health};
use aliaslb_agent::kernel::backend::{Lifetime, REQUEST_TIMEOUT, Timed};
use aliaslb_agent::kernel::netlink::{NetlinkBackend, watch_changes};
use aliaslb_agent::l2::adverts;
use aliaslb_agent::l2::announce::{AnnounceConfig, Announcer};
use aliaslb_agent::l2::failover::{Failover, FailoverConfig};
use aliaslb_agent::l2::guard::GuardConfig;
use aliaslb_agent::l2::lan::LanWatch;
use aliaslb_agent::l2::lan::ProbeConfig;
use aliaslb_agent::l3::routing::{DaemonSpec, DaemonView};
use aliaslb_agent::lease::{
    self, Authority, Heartbeat, HeartbeatLinks, KernelRounds, LeaseConfig, LeaseHolderCheck,
};
use aliaslb_agent::metrics::Metrics;
use aliaslb_agent::node::{Loop, Node, NodeSetup};
use aliaslb_agent::shield::Shield;
use aliaslb_agent::shield::nft::NftBackend;
use aliaslb_agent::{assignments, l3, telemetry};
use aliaslb_ops::http;
use anyhow::Context as _;
use clap::Parser;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{Notify, mpsc, watch};
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
    info!(
        version = aliaslb_ops::build::VERSION,
        commit = aliaslb_ops::build::COMMIT,
        node = %node_name,
        %namespace,
        %agent_namespace,
        interface = interface.as_deref().unwrap_or("(from the assignment, subnet or default route)"),
        ?lease_duration,
        ?renew_interval,
        ?alias_lifetime,
        ?refresh_interval,
        ?resync_interval,
        host_port_shield,
        ?advert_port,
        ?advert_interval,
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
    // The loop beats at every lifetime refresh: ten missed beats is a hung loop.
    let health = Health::new((refresh_interval * 10).max(Duration::from_secs(10)));
    let (stop_http, http_stopped) = watch::channel(false);
    let listener = http::bind(metrics_addr).await?;
    info!(addr = %metrics_addr, "serving /metrics, /healthz, /readyz");
    // When the Lease was last renewed: the heartbeat records it, `/readyz` waits for the first.
    let authority = Authority::new(lease_duration);
    let probes = AgentProbes {
        metrics: metrics.clone(),
        health: health.clone(),
        lease: authority.clone(),
    };
    let server = tokio::spawn(http::serve(listener, Arc::new(probes), async move {
        let mut rx = http_stopped;
        let _ = rx.wait_for(|stop| *stop).await;
    }));

    // Fast L2 failover: the key, the adverts heard, the adverts to send.
    let (key_tx, key_rx) = watch::channel(None);
    let (heard_tx, heard_rx) = mpsc::channel(1024);
    let (streams_tx, streams_rx) = watch::channel(Vec::new());
    if let Some(port) = advert_port {
        tokio::spawn(adverts::key_loop(client.clone(), namespace.clone(), key_tx));
        let received = metrics.clone();
        let receiver = adverts::receive_loop(
            node_name.clone(),
            port,
            key_rx.clone(),
            heard_tx,
            move |why| {
                received.inc_advert_received(match why {
                    adverts::Dropped::NoKey => "no_key",
                    adverts::Dropped::Invalid => "invalid",
                });
            },
        );
        tokio::spawn(async move {
            if let Err(e) = receiver.await {
                error!(error = %e, port, "the advert receiver stopped: this node no longer takes over for silent holders");
            }
        });
        tokio::spawn(adverts::send_loop(
            adverts::Sender::new(&node_name, port),
            advert_interval,
            key_rx.clone(),
            streams_rx,
            metrics.clone(),
        ));
    } else {
        warn!(
            "--advert-port 0: no fast-failover adverts; this node's IPs fail over by the Lease only"
        );
        drop(heard_tx);
    }
    let failover = Failover::new(&node_name, FailoverConfig::new(advert_interval));
    let (desired_tx, desired_rx) = watch::channel(None);
    let watcher = tokio::spawn(assignments::watch_assignments(
        client.clone(),
        namespace,
        node_name.clone(),
        desired_tx,
    ));
    let goodbye_node = node_name.clone();
    let (holder_client, holder_namespace) = (client.clone(), agent_namespace.clone());
    let heartbeat = Heartbeat::new(
        client,
        LeaseConfig {
            namespace: agent_namespace,
            node_name,
            lease_duration,
            renew_interval,
            alias_lifetime,
        },
    );
    let (report_tx, report_rx) = watch::channel(None);
    let api_back = Arc::new(Notify::new());
    let kernel = KernelRounds::new();
    let heartbeat_task = tokio::spawn(lease::run(
        heartbeat.clone(),
        report_rx,
        metrics.clone(),
        HeartbeatLinks {
            api_back: api_back.clone(),
            authority: authority.clone(),
            kernel: kernel.clone(),
        },
    ));

    let announcer = Announcer::new(AnnounceConfig::default());
    let netlink = NetlinkBackend::connect().context("opening the netlink socket")?;
    let (routed_device, fallback) = netlink.routed_device(&routed_device).await;
    match fallback {
        Some(e) => warn!(
            error = %e,
            "L3 mode: cannot create or set up the routed device, routed addresses go on lo \
             (the kernel may lack the dummy driver); the routing daemon must export lo's \
             host routes in the pools"
        ),
        None => info!(device = %routed_device, "L3 mode: routed addresses go on this device"),
    }
    let routing_spec: DaemonSpec = routing_daemon.parse().context("invalid flags")?;
    let (routing_tx, routing_rx) = watch::channel(None);
    if routing_spec != DaemonSpec::None {
        for warning in l3::arp_warnings(std::path::Path::new(l3::PROC_CONF)) {
            warn!("L3 mode: {warning}");
        }
        let daemon = routing_spec.daemon();
        info!(daemon, spec = %routing_daemon, "L3 mode: reading the routing daemon (read-only)");
        tokio::spawn(l3::watch_daemon(
            DaemonView {
                spec: routing_spec,
                timeout: ROUTING_READ_TIMEOUT,
            },
            daemon,
            refresh_interval,
            routing_tx,
            metrics.clone(),
        ));
    }
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
    metrics.track_announcer(announcer.clone());
    let changes = watch_changes().context("subscribing to netlink address and link changes")?;
    // The LAN: one AF_PACKET socket per interface watches claims for the held IPs, and
    // first claims are probed through it.
    let (lan, observed) = LanWatch::start();
    metrics.track_lan(lan.clone());
    let lan = Arc::new(lan);
    let mut node = Node::new(
        aliases,
        NodeSetup {
            announcer: Some(announcer),
            metrics: metrics.clone(),
            report_tx,
            lan,
            authority,
            kernel,
            guard: GuardConfig::default(),
            probe: ProbeConfig::default(),
            failover,
            streams_tx: advert_port.map(|_| streams_tx.clone()),
            holders: Some(Arc::new(LeaseHolderCheck::new(
                holder_client,
                &holder_namespace,
            ))),
        },
    );

    let stop = async {
        tokio::select! {
            _ = sigterm.recv() => "SIGTERM",
            _ = sigint.recv() => "SIGINT",
        }
    };
    let signal = node
        .run(
            Loop {
                desired_rx,
                changes,
                observed,
                api_back,
                health: health.clone(),
                refresh_interval,
                resync_interval,
                routing: routing_rx,
                heard: heard_rx,
            },
            stop,
        )
        .await;
    info!(
        signal,
        "shutting down: removing aliases, then releasing the Lease"
    );

    let (mut aliases, report_tx) = node.into_parts();
    let shielded = aliases.shield().is_some();
    let cleanup = async {
        // Stop the heartbeat after its write in flight, so nothing re-creates the Lease.
        drop(report_tx);
        let _ = heartbeat_task.await;
        watcher.abort();
        // No IP held from here on: the adverts still sent say so.
        let streams = streams_tx.send_replace(Vec::new());
        let report = aliases.release_all().await;
        for e in &report.errors {
            error!(error = %e, "could not remove an alias (the kernel drops it when its lifetime ends)");
        }
        // The standbys learn the IPs were let go, not lost: they do not take them over.
        if let Some(port) = advert_port {
            let key = key_rx.borrow().clone();
            adverts::goodbye(&goodbye_node, port, key.as_ref(), &streams).await;
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
