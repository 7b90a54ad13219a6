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
    version = aliaslb_ops::build::version_line(),
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

    /// Agent Lease duration: an agent not seen renewing for this long has lost its node
    /// (the controller then moves its IPs; an L2 standby takes them over long before, on
    /// the LAN). Whole seconds, e.g. `30s`.
    #[arg(long, env = "ALIASLB_AGENT_LEASE_DURATION", default_value = "30s", value_parser = parse_duration)]
    pub lease_duration: Duration,

    /// How often the Lease is renewed when nothing changed (a changed report is written at
    /// once). At least three renewals per lease.
    #[arg(long, env = "ALIASLB_AGENT_RENEW_INTERVAL", default_value = "10s", value_parser = parse_duration)]
    pub renew_interval: Duration,

    /// Kernel lifetime of every alias, refreshed locally three times per lifetime: the
    /// dead-man switch of an agent that stops (a frozen or killed agent's aliases are gone
    /// this long after its last refresh). Whole seconds, at most the lease less one renew
    /// interval. Default: 3s, or the lease less one renew interval if that is shorter.
    #[arg(long, env = "ALIASLB_AGENT_ALIAS_LIFETIME", value_parser = parse_duration)]
    pub alias_lifetime: Option<Duration>,

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
    /// Lease renewal period (when the report did not change).
    pub renew_interval: Duration,
    /// Kernel lifetime of the aliases (whole seconds, see [`alias_lifetime`]).
    pub alias_lifetime: Duration,
    /// How often the alias lifetimes are refreshed: a third of the lifetime
    /// ([`refresh_interval`]).
    pub refresh_interval: Duration,
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
    /// Fewer than three renewals per lease: one lost write would cost the node.
    #[error(
        "--renew-interval {renew_interval:?} must be at most a third of --lease-duration {lease_duration:?} (three renewals per lease, so one lost write does not cost the node its IPs), e.g. --renew-interval {suggest:?}"
    )]
    RenewTooSlow {
        /// Renew interval given.
        renew_interval: Duration,
        /// Lease duration given.
        lease_duration: Duration,
        /// A renew interval that would work.
        suggest: Duration,
    },
    /// The alias lifetime is not a whole number of seconds, or zero.
    #[error(
        "--alias-lifetime {0:?} must be a whole number of seconds, at least 1s (the kernel counts address lifetimes in seconds)"
    )]
    LifetimeNotWholeSeconds(Duration),
    /// The aliases would outlive the moment the controller may give their IPs away.
    #[error(
        "--alias-lifetime {lifetime:?} must be at most --lease-duration {lease_duration:?} less --renew-interval {renew_interval:?} ({bound:?}): a dead agent's aliases must be gone from the kernel before the controller gives their IPs to another node"
    )]
    LifetimeOutlivesLease {
        /// The lifetime given (or the default).
        lifetime: Duration,
        /// Lease duration given.
        lease_duration: Duration,
        /// Renew interval given.
        renew_interval: Duration,
        /// The longest lifetime allowed.
        bound: Duration,
    },
}

/// The default alias lifetime.
pub const DEFAULT_ALIAS_LIFETIME: Duration = Duration::from_secs(3);

/// The longest kernel lifetime the aliases may have: `lease - renew`, floored to whole
/// seconds.
///
/// The controller declares a node lost one lease after it last SAW the Lease change, and
/// the agent's last Lease write can come up to one renew interval after its last lifetime
/// refresh; a longer lifetime would let a dead node's alias outlive the moment its IP is
/// given to another node.
pub fn lifetime_bound(lease_duration: Duration, renew_interval: Duration) -> Duration {
    Duration::from_secs(lease_duration.saturating_sub(renew_interval).as_secs())
}

/// The kernel lifetime of the aliases: `--alias-lifetime`, else [`DEFAULT_ALIAS_LIFETIME`]
/// or the [`lifetime_bound`] if that is shorter.
///
/// Independent of the Lease: the lifetime is refreshed locally (netlink), three times per
/// lifetime, so Lease writes can be rare (one per renew interval) while a stopped agent's
/// aliases still go within seconds (figures in BENCHMARKS.md, "End-to-end failover").
pub fn alias_lifetime(
    given: Option<Duration>,
    lease_duration: Duration,
    renew_interval: Duration,
) -> Duration {
    given.unwrap_or_else(|| {
        DEFAULT_ALIAS_LIFETIME.min(lifetime_bound(lease_duration, renew_interval))
    })
}

/// How often the alias lifetimes are refreshed: a third of the lifetime, so one missed or
/// late refresh never lets an alias lapse.
pub fn refresh_interval(lifetime: Duration) -> Duration {
    third(lifetime)
}

/// A third of `d`, in whole milliseconds.
fn third(d: Duration) -> Duration {
    Duration::from_millis(u64::try_from(d.as_millis() / 3).unwrap_or(u64::MAX))
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
            alias_lifetime: lifetime_given,
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
        if renew_interval.is_zero() || renew_interval * 3 > lease_duration {
            return Err(AgentConfigError::RenewTooSlow {
                renew_interval,
                lease_duration,
                suggest: third(lease_duration),
            });
        }
        let lifetime = alias_lifetime(lifetime_given, lease_duration, renew_interval);
        if lifetime.subsec_nanos() != 0 || lifetime.is_zero() {
            return Err(AgentConfigError::LifetimeNotWholeSeconds(lifetime));
        }
        let bound = lifetime_bound(lease_duration, renew_interval);
        if lifetime > bound {
            return Err(AgentConfigError::LifetimeOutlivesLease {
                lifetime,
                lease_duration,
                renew_interval,
                bound,
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
            refresh_interval: refresh_interval(lifetime),
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
        assert_eq!(s.lease_duration, Duration::from_secs(30));
        assert_eq!(s.renew_interval, Duration::from_secs(10));
        assert_eq!(s.alias_lifetime, Duration::from_secs(3));
        assert_eq!(s.refresh_interval, Duration::from_secs(1));
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
        assert_eq!(s.refresh_interval, Duration::from_millis(333));
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
                &["--node-name=n", "--alias-lifetime=0s"],
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
                AgentConfigError::RenewTooSlow {
                    renew_interval: Duration::from_secs(2),
                    lease_duration: Duration::from_secs(2),
                    suggest: Duration::from_millis(666),
                },
            ),
            (
                &["--node-name=n", "--alias-lifetime=2500ms"],
                AgentConfigError::LifetimeNotWholeSeconds(Duration::from_millis(2500)),
            ),
            (
                &["--node-name=n", "--alias-lifetime=21s"],
                AgentConfigError::LifetimeOutlivesLease {
                    lifetime: Duration::from_secs(21),
                    lease_duration: Duration::from_secs(30),
                    renew_interval: Duration::from_secs(10),
                    bound: Duration::from_secs(20),
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
    fn the_alias_lifetime_is_local_and_bounded_by_the_lease_less_one_renewal() {
        let at = |args: &[&str]| {
            let s = parse(args).unwrap().into_settings().unwrap();
            (s.alias_lifetime, s.refresh_interval)
        };
        // Rare Lease writes, a short lifetime refreshed locally.
        assert_eq!(
            at(&["--node-name=n"]),
            (Duration::from_secs(3), Duration::from_secs(1))
        );
        assert_eq!(
            at(&["--node-name=n", "--alias-lifetime=6s"]),
            (Duration::from_secs(6), Duration::from_secs(2))
        );
        // The earlier flags keep their meaning: lease 4s, renew 1s -> lifetime 3s.
        assert_eq!(
            at(&[
                "--node-name=n",
                "--lease-duration=4s",
                "--renew-interval=1s"
            ]),
            (Duration::from_secs(3), Duration::from_secs(1))
        );
        // A short lease bounds the default lifetime.
        assert_eq!(
            at(&[
                "--node-name=n",
                "--lease-duration=2s",
                "--renew-interval=500ms"
            ]),
            (Duration::from_secs(1), Duration::from_millis(333))
        );
        assert_eq!(
            lifetime_bound(Duration::from_secs(30), Duration::from_secs(10)),
            Duration::from_secs(20)
        );
        let err = parse(&[
            "--node-name=n",
            "--lease-duration=2s",
            "--renew-interval=1s",
        ])
        .unwrap()
        .into_settings()
        .unwrap_err();
        assert!(err.to_string().contains("--renew-interval 666ms"), "{err}");
    }
}
