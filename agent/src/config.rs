//! Command-line flags of `aliaslb-agent` (every flag also readable from the environment)
//! and the checked settings derived from them. No I/O.
//!
//! Flags that mean the same as the controller's carry the same name and variable
//! (`--namespace`/`POD_NAMESPACE`, `--agent-namespace`/`ALIASLB_AGENT_NAMESPACE`,
//! `--lease-duration`/`ALIASLB_AGENT_LEASE_DURATION`, `--metrics-addr`, `--log-format`), so
//! one ConfigMap of variables can feed both.

use std::net::SocketAddr;
use std::time::Duration;

use aliaslb_core::keys;
use aliaslb_ops::flags::parse_duration;
use aliaslb_ops::telemetry::LogFormat;

/// `aliaslb-agent` flags.
#[derive(Debug, Clone, PartialEq, Eq, clap::Parser)]
#[command(
    name = "aliaslb-agent",
    version,
    about = "Puts the load-balancer IPs the controller assigned to this node on its interfaces and announces them."
)]
pub struct Flags {
    /// This node's name (downward API `spec.nodeName`): its assignment object is
    /// `aliaslb-node-<node>`, its Lease `aliaslb-agent-<node>`.
    #[arg(long, env = "NODE_NAME")]
    pub node_name: String,

    /// Namespace of the controller, where the agent reads its assignment object (the agent
    /// needs no write right there).
    #[arg(long, env = "POD_NAMESPACE", default_value = keys::DEFAULT_NAMESPACE)]
    pub namespace: String,

    /// Namespace of the agents' Leases, where the agent renews its own.
    #[arg(long, env = "ALIASLB_AGENT_NAMESPACE", default_value = keys::DEFAULT_AGENT_NAMESPACE)]
    pub agent_namespace: String,

    /// Put every alias on this interface (default: the interface the controller's
    /// assignment names, from the pool's `interface` option, else the interface whose subnet
    /// holds the IP, else the default route's).
    #[arg(long, env = "ALIASLB_INTERFACE")]
    pub interface: Option<String>,

    /// Agent Lease duration, also the kernel lifetime of every alias: if the agent stops
    /// renewing, the controller moves its IPs and the kernel drops them after this long.
    /// Whole seconds, e.g. `4s`.
    #[arg(long, env = "ALIASLB_AGENT_LEASE_DURATION", default_value = "4s", value_parser = parse_duration)]
    pub lease_duration: Duration,

    /// How often the Lease is renewed and alias lifetimes refreshed.
    #[arg(long, env = "ALIASLB_AGENT_RENEW_INTERVAL", default_value = "1s", value_parser = parse_duration)]
    pub renew_interval: Duration,

    /// How often the whole desired set is re-applied even without any change seen.
    #[arg(long, env = "ALIASLB_AGENT_RESYNC_INTERVAL", default_value = "30s", value_parser = parse_duration)]
    pub resync_interval: Duration,

    /// On SIGTERM/SIGINT: how long removing the aliases and releasing the Lease may take.
    #[arg(long, env = "ALIASLB_AGENT_SHUTDOWN_TIMEOUT", default_value = "5s", value_parser = parse_duration)]
    pub shutdown_timeout: Duration,

    /// Listen address of the /metrics and /healthz server (the agent runs on the host
    /// network: 9100 is node-exporter's port, hence 9101).
    #[arg(long, env = "ALIASLB_METRICS_ADDR", default_value = "0.0.0.0:9101")]
    pub metrics_addr: SocketAddr,

    /// Log format.
    #[arg(long, env = "ALIASLB_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// The host-port shield: an nftables table of the agent's own (`inet aliaslb`) that
    /// lets traffic addressed to an LB IP reach only its Services' ports, never the node's
    /// own listeners or NodePorts. `on` needs `nft` and nf_tables: the agent refuses to
    /// start without them.
    #[arg(long, env = "ALIASLB_HOST_PORT_SHIELD", value_enum, default_value_t = Toggle::On)]
    pub host_port_shield: Toggle,

    /// L3 mode (pools with `announce: bgp`): the local device the routed addresses go on,
    /// for the node's routing daemon to export. Created as a dummy interface if missing;
    /// where the kernel has no dummy driver the agent falls back to `lo` (and says so).
    #[arg(long, env = "ALIASLB_ROUTED_DEVICE", default_value = "aliaslb0")]
    pub routed_device: String,

    /// L3 mode: the routing daemon to read (never write) to tell whether each routed
    /// address is exported to an Established BGP peer: `bird:<control socket>`
    /// (e.g. `bird:/run/bird/bird.ctl`), `frr` (vtysh on the PATH), `frr:<vtysh>[:<vty
    /// socket dir>]`, or `none`.
    #[arg(long, env = "ALIASLB_ROUTING_DAEMON", default_value = "none")]
    pub routing_daemon: String,

    /// Fast L2 failover: the UDP port of the liveness adverts between holder and standby
    /// nodes (sent to the standby's address on the IP's subnet, received on every address).
    /// `0` turns the adverts off here: this node's IPs then fail over by the Lease only.
    #[arg(long, env = "ALIASLB_ADVERT_PORT", default_value_t = keys::DEFAULT_ADVERT_PORT)]
    pub advert_port: u16,

    /// Fast L2 failover: how often a holder sends its adverts; a standby takes over after
    /// three intervals and a half of silence (and a LAN check). From 20ms to 1s.
    #[arg(long, env = "ALIASLB_ADVERT_INTERVAL", default_value = "100ms", value_parser = parse_duration)]
    pub advert_interval: Duration,
}

/// An on/off flag value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Toggle {
    /// Enabled.
    On,
    /// Disabled.
    Off,
}

/// Checked agent settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// This node's name.
    pub node_name: String,
    /// Namespace of the controller (the assignment object).
    pub namespace: String,
    /// Namespace of the agent Lease.
    pub agent_namespace: String,
    /// `--interface`, if given.
    pub interface: Option<String>,
    /// Lease duration (whole seconds).
    pub lease_duration: Duration,
    /// Renewal and lifetime refresh period.
    pub renew_interval: Duration,
    /// Kernel lifetime of the aliases: the lease duration less one renew interval, in whole
    /// seconds (see [`alias_lifetime`]).
    pub alias_lifetime: Duration,
    /// Full resync period.
    pub resync_interval: Duration,
    /// Bound on the SIGTERM clean-up.
    pub shutdown_timeout: Duration,
    /// Listen address of the HTTP server.
    pub metrics_addr: SocketAddr,
    /// Log format.
    pub log_format: LogFormat,
    /// Whether the host-port shield guards the LB IPs.
    pub host_port_shield: bool,
    /// `--routed-device`.
    pub routed_device: String,
    /// `--routing-daemon`, as given (parsed by [`crate::l3::routing`]).
    pub routing_daemon: String,
    /// `--advert-port` (`None`: adverts off).
    pub advert_port: Option<u16>,
    /// `--advert-interval`.
    pub advert_interval: Duration,
}

/// Why the flags do not make a usable configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AgentConfigError {
    /// The node name is empty.
    #[error("--node-name (or NODE_NAME) must not be empty")]
    EmptyNodeName,
    /// The advert interval is out of range.
    #[error("--advert-interval {0:?} must be from 20ms to 1s")]
    AdvertInterval(Duration),
    /// `--routed-device` is no interface name.
    #[error(
        "--routed-device (or ALIASLB_ROUTED_DEVICE) {name:?} {why}: give an interface name such as `aliaslb0` or `lo`"
    )]
    RoutedDevice {
        /// The name given.
        name: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// `--interface` was given empty.
    #[error("--interface (or ALIASLB_INTERFACE) must not be empty when set")]
    EmptyInterface,
    /// The Lease and the kernel count lifetimes in whole seconds.
    #[error(
        "--lease-duration {0:?} must be a whole number of seconds, at least 1s (the Lease and the kernel's address lifetimes count seconds)"
    )]
    LeaseNotWholeSeconds(Duration),
    /// Renewing no faster than the lease expires would let aliases lapse.
    #[error(
        "--renew-interval {renew_interval:?} must be shorter than --lease-duration {lease_duration:?}, or aliases expire between two refreshes"
    )]
    RenewNotBelowLease {
        /// Renew interval given.
        renew_interval: Duration,
        /// Lease duration given.
        lease_duration: Duration,
    },
    /// The aliases' lifetime would not outlast two renewals.
    #[error(
        "--lease-duration {lease_duration:?} with --renew-interval {renew_interval:?} leaves the aliases a kernel lifetime of {lifetime:?} (the lease less one renewal, in whole seconds), which does not cover two renewals: renew at least three times per lease, e.g. --renew-interval {suggest:?}"
    )]
    LifetimeTooShort {
        /// Lease duration given.
        lease_duration: Duration,
        /// Renew interval given.
        renew_interval: Duration,
        /// The lifetime that would result.
        lifetime: Duration,
        /// A renew interval that would work.
        suggest: Duration,
    },
}

/// The kernel lifetime of the aliases: `lease - renew`, floored to whole seconds.
///
/// Shorter than the lease on purpose. The controller declares a node lost one lease after
/// it last SAW the Lease change, and the agent's last Lease write can come up to one renew
/// interval after its last lifetime refresh; with lifetime = lease, a dead node's alias
/// could outlive the moment its IP is given to another node. With `lease - renew` the
/// kernel drops it first (figures in BENCHMARKS.md, "End-to-end failover").
pub fn alias_lifetime(lease_duration: Duration, renew_interval: Duration) -> Duration {
    Duration::from_secs(lease_duration.saturating_sub(renew_interval).as_secs())
}

impl Flags {
    /// Check the flags and turn them into [`Settings`].
    pub fn into_settings(self) -> Result<Settings, AgentConfigError> {
        let Flags {
            node_name,
            namespace,
            agent_namespace,
            interface,
            lease_duration,
            renew_interval,
            resync_interval,
            shutdown_timeout,
            metrics_addr,
            log_format,
            host_port_shield,
            routed_device,
            routing_daemon,
            advert_port,
            advert_interval,
        } = self;
        if !(Duration::from_millis(20)..=Duration::from_secs(1)).contains(&advert_interval) {
            return Err(AgentConfigError::AdvertInterval(advert_interval));
        }
        if node_name.trim().is_empty() {
            return Err(AgentConfigError::EmptyNodeName);
        }
        if interface.as_deref().is_some_and(|i| i.trim().is_empty()) {
            return Err(AgentConfigError::EmptyInterface);
        }
        if let Some(why) = aliaslb_core::report::interface_name_error(&routed_device) {
            return Err(AgentConfigError::RoutedDevice {
                name: routed_device,
                why,
            });
        }
        if lease_duration.subsec_nanos() != 0 || lease_duration.as_secs() == 0 {
            return Err(AgentConfigError::LeaseNotWholeSeconds(lease_duration));
        }
        if renew_interval >= lease_duration {
            return Err(AgentConfigError::RenewNotBelowLease {
                renew_interval,
                lease_duration,
            });
        }
        let lifetime = alias_lifetime(lease_duration, renew_interval);
        if lifetime < renew_interval * 2 {
            return Err(AgentConfigError::LifetimeTooShort {
                lease_duration,
                renew_interval,
                lifetime,
                suggest: lease_duration / 4,
            });
        }
        Ok(Settings {
            node_name,
            namespace,
            agent_namespace,
            interface,
            lease_duration,
            renew_interval,
            alias_lifetime: lifetime,
            resync_interval,
            shutdown_timeout,
            metrics_addr,
            log_format,
            host_port_shield: host_port_shield == Toggle::On,
            routed_device,
            routing_daemon,
            advert_port: (advert_port != 0).then_some(advert_port),
            advert_interval,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn parse(args: &[&str]) -> Result<Flags, clap::Error> {
        Flags::try_parse_from(std::iter::once("aliaslb-agent").chain(args.iter().copied()))
    }

    #[test]
    fn defaults() {
        let s = parse(&["--node-name=node-a"])
            .unwrap()
            .into_settings()
            .unwrap();
        assert_eq!(s.node_name, "node-a");
        assert_eq!(s.namespace, "aliaslb-system");
        assert_eq!(s.agent_namespace, "aliaslb-agents");
        assert_eq!(s.interface, None);
        assert_eq!(s.lease_duration, Duration::from_secs(4));
        assert_eq!(s.renew_interval, Duration::from_secs(1));
        assert_eq!(s.alias_lifetime, Duration::from_secs(3));
        assert_eq!(s.resync_interval, Duration::from_secs(30));
        assert_eq!(s.shutdown_timeout, Duration::from_secs(5));
        assert_eq!(s.metrics_addr, "0.0.0.0:9101".parse().unwrap());
        assert_eq!(s.log_format, LogFormat::Text);
        assert!(s.host_port_shield);
        assert_eq!(s.routed_device, "aliaslb0");
        assert_eq!(s.routing_daemon, "none");
        let bad = parse(&["--node-name=n", "--routed-device=eth0:1"])
            .unwrap()
            .into_settings()
            .unwrap_err();
        assert!(bad.to_string().contains("contains `/` or `:`"), "{bad}");
    }

    #[test]
    fn flags_are_typed() {
        let s = parse(&[
            "--node-name=n",
            "--namespace=lb",
            "--agent-namespace=lb-agents",
            "--interface=eth1",
            "--lease-duration=2s",
            "--renew-interval=500ms",
            "--resync-interval=1m",
            "--shutdown-timeout=3s",
            "--metrics-addr=127.0.0.1:1234",
            "--log-format=json",
            "--host-port-shield=off",
        ])
        .unwrap()
        .into_settings()
        .unwrap();
        assert_eq!(s.namespace, "lb");
        assert_eq!(s.agent_namespace, "lb-agents");
        assert_eq!(s.interface.as_deref(), Some("eth1"));
        assert_eq!(s.lease_duration, Duration::from_secs(2));
        assert_eq!(s.renew_interval, Duration::from_millis(500));
        assert_eq!(s.alias_lifetime, Duration::from_secs(1));
        assert_eq!(s.resync_interval, Duration::from_secs(60));
        assert_eq!(s.shutdown_timeout, Duration::from_secs(3));
        assert_eq!(s.metrics_addr, "127.0.0.1:1234".parse().unwrap());
        assert_eq!(s.log_format, LogFormat::Json);
        assert!(!s.host_port_shield);
    }

    #[test]
    fn bad_values_are_explained() {
        let table: &[(&[&str], &str)] = &[
            (
                &["--node-name=n", "--lease-duration=4"],
                "expected a duration",
            ),
            (
                &["--node-name=n", "--renew-interval=0s"],
                "greater than zero",
            ),
            (
                &["--node-name=n", "--metrics-addr=9101"],
                "invalid socket address",
            ),
            (
                &["--node-name=n", "--log-format=xml"],
                "possible values: text, json",
            ),
        ];
        for (args, want) in table {
            let err = parse(args).unwrap_err().to_string();
            assert!(err.contains(want), "{args:?}: {err}");
        }
    }

    #[test]
    fn inconsistent_settings_are_refused() {
        let table: &[(&[&str], AgentConfigError)] = &[
            (&["--node-name= "], AgentConfigError::EmptyNodeName),
            (
                &["--node-name=n", "--interface="],
                AgentConfigError::EmptyInterface,
            ),
            (
                &["--node-name=n", "--lease-duration=1500ms"],
                AgentConfigError::LeaseNotWholeSeconds(Duration::from_millis(1500)),
            ),
            (
                &[
                    "--node-name=n",
                    "--lease-duration=2s",
                    "--renew-interval=2s",
                ],
                AgentConfigError::RenewNotBelowLease {
                    renew_interval: Duration::from_secs(2),
                    lease_duration: Duration::from_secs(2),
                },
            ),
        ];
        for (args, want) in table {
            let err = parse(args).unwrap().into_settings().unwrap_err();
            assert_eq!(&err, want, "{args:?}");
            assert!(!err.to_string().is_empty());
        }
    }

    #[test]
    fn the_alias_lifetime_is_the_lease_less_one_renewal_and_covers_two() {
        assert_eq!(
            alias_lifetime(Duration::from_secs(4), Duration::from_secs(1)),
            Duration::from_secs(3)
        );
        assert_eq!(
            alias_lifetime(Duration::from_secs(2), Duration::from_millis(500)),
            Duration::from_secs(1)
        );
        let err = parse(&["--node-name=n", "--lease-duration=2s"])
            .unwrap()
            .into_settings()
            .unwrap_err();
        assert_eq!(
            err,
            AgentConfigError::LifetimeTooShort {
                lease_duration: Duration::from_secs(2),
                renew_interval: Duration::from_secs(1),
                lifetime: Duration::from_secs(1),
                suggest: Duration::from_millis(500),
            }
        );
        assert!(err.to_string().contains("--renew-interval 500ms"), "{err}");
    }
}
