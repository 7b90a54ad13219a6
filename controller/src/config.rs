//! Command-line flags of `aliaslb-controller` (every flag also readable from the
//! environment) and the settings derived from them. No I/O except reading the hostname
//! when no identity is given.

use std::net::SocketAddr;
use std::time::Duration;

use aliaslb_core::keys;
use aliaslb_ops::flags::parse_duration;
use aliaslb_ops::telemetry::LogFormat;

use crate::leader::{LeaderConfig, TimingError, Timings};

/// `aliaslb-controller` flags.
#[derive(Debug, Clone, PartialEq, Eq, clap::Parser)]
#[command(
    name = "aliaslb-controller",
    version = aliaslb_ops::build::version_line(),
    about = "Leases IPs to LoadBalancer Services from per-namespace pools and elects the node that announces them."
)]
pub struct Flags {
    /// Namespace of the controller, the pool ConfigMap, the node assignments and the leader
    /// Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = keys::DEFAULT_NAMESPACE)]
    pub namespace: String,

    /// Namespace of the agents' Leases (apart from the controller's, so agents get no write
    /// right where the leader Lease, the pools and the assignments live).
    #[arg(long, env = "ALIASLB_AGENT_NAMESPACE", default_value = keys::DEFAULT_AGENT_NAMESPACE)]
    pub agent_namespace: String,

    /// Name of the pool ConfigMap (key = namespace, value = addresses).
    #[arg(long, env = "ALIASLB_POOL_CONFIGMAP", default_value = keys::DEFAULT_POOL_CONFIGMAP)]
    pub pool_configmap: String,

    /// `spec.loadBalancerClass` this controller handles.
    #[arg(long, env = "ALIASLB_LOAD_BALANCER_CLASS", default_value = keys::DEFAULT_LOAD_BALANCER_CLASS)]
    pub load_balancer_class: String,

    /// Leave Services without a `loadBalancerClass` alone (by default they are handled).
    #[arg(long, env = "ALIASLB_IGNORE_CLASSLESS", value_parser = clap::builder::BoolishValueParser::new())]
    pub ignore_classless: bool,

    /// Let cordoned nodes carry IPs (by default a cordon moves IPs away before maintenance).
    #[arg(long, env = "ALIASLB_IGNORE_CORDON", value_parser = clap::builder::BoolishValueParser::new())]
    pub ignore_cordon: bool,

    /// Agent Lease duration: an agent whose renewal was not seen for this long (on the
    /// controller's own clock) is not fresh and its IPs move. Read from each Lease's
    /// `leaseDurationSeconds` (the agent's `--lease-duration`); this is for Leases without one.
    /// E.g. `30s`, `500ms`.
    #[arg(long, alias = "lease-duration", env = "ALIASLB_AGENT_LEASE_DURATION", default_value = "30s", value_parser = parse_duration)]
    pub agent_lease_duration: Duration,

    /// Turn fast L2 failover off: no standby per IP, no advert key. IPs then move when the
    /// holder's agent Lease expires (the lease duration), as before.
    #[arg(long, env = "ALIASLB_NO_FAST_FAILOVER", value_parser = clap::builder::BoolishValueParser::new())]
    pub no_fast_failover: bool,

    /// How long the addresses of a deleted Service are held for it, so a re-created one
    /// (a reinstall, `kubectl replace --force`) gets them back and no other Service takes
    /// them meanwhile: at most 10m; `0s` hands a freed address to the next Service at once.
    #[arg(long, env = "ALIASLB_HOLD_RELEASED", default_value = "10m", value_parser = parse_hold)]
    pub hold_released: Duration,

    /// Planned moves keep established connections: how long a node that left an L2 IP
    /// in a planned move (a cordon, a drain, an agent rollout) still carries the TCP flows
    /// it had, the new holder forwarding their packets to it (docs/how-it-works.md, "Planned moves keep
    /// established connections"). The default, 300s, is cloud load balancers' own
    /// deregistration delay; `0s`: off, the assignment objects carry no `handovers` key.
    #[arg(long, env = "ALIASLB_DRAIN_WINDOW", default_value = "300s", value_parser = aliaslb_ops::flags::parse_duration_or_zero)]
    pub drain_window: Duration,

    /// Leader Lease duration: how long followers wait after the last renewal they saw
    /// before taking over. Whole seconds (the Lease stores seconds).
    #[arg(long, env = "ALIASLB_LEADER_LEASE_DURATION", default_value = "15s", value_parser = parse_duration)]
    pub leader_lease_duration: Duration,

    /// The leader stops writing if it could not renew for this long; must be shorter than
    /// the leader lease duration (the difference is the safety margin).
    #[arg(long, env = "ALIASLB_LEADER_RENEW_DEADLINE", default_value = "10s", value_parser = parse_duration)]
    pub leader_renew_deadline: Duration,

    /// How often the leader renews and followers look at the Lease.
    #[arg(long, env = "ALIASLB_LEADER_RETRY_PERIOD", default_value = "2s", value_parser = parse_duration)]
    pub leader_retry_period: Duration,

    /// Listen address of the /metrics, /healthz and /readyz server.
    #[arg(long, env = "ALIASLB_METRICS_ADDR", default_value = "0.0.0.0:9100")]
    pub metrics_addr: SocketAddr,

    /// Log format.
    #[arg(long, env = "ALIASLB_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// This replica's identity in the leader Lease (default: the pod name, else the hostname).
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
}

/// Settings the reconcile loop reads: the flags that shape allocation and election.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControllerConfig {
    /// Namespace of the pool ConfigMap and the node assignments.
    pub namespace: String,
    /// Namespace of the agents' Leases.
    pub agent_namespace: String,
    /// Name of the pool ConfigMap.
    pub pool_configmap: String,
    /// `spec.loadBalancerClass` handled.
    pub load_balancer_class: String,
    /// Whether Services without a class are left alone.
    pub ignore_classless: bool,
    /// Whether cordoned nodes are ineligible (see `aliaslb_core::election`).
    pub respect_cordon: bool,
    /// Freshness window of agent Leases, on the controller's monotonic clock.
    pub agent_lease_duration: Duration,
    /// How long a deleted Service's addresses are held for it (`--hold-released`).
    pub hold_released: Duration,
    /// Fast L2 failover: a standby per L2 IP and the advert key (`--no-fast-failover`).
    pub fast_failover: bool,
    /// Planned moves keep established connections for this long (`--drain-window`; zero:
    /// off, see [`crate::handover`]).
    pub drain_window: Duration,
}

impl Default for ControllerConfig {
    /// The flag defaults.
    fn default() -> Self {
        ControllerConfig {
            namespace: keys::DEFAULT_NAMESPACE.to_owned(),
            agent_namespace: keys::DEFAULT_AGENT_NAMESPACE.to_owned(),
            pool_configmap: keys::DEFAULT_POOL_CONFIGMAP.to_owned(),
            load_balancer_class: keys::DEFAULT_LOAD_BALANCER_CLASS.to_owned(),
            ignore_classless: false,
            respect_cordon: true,
            agent_lease_duration: Duration::from_secs(30),
            hold_released: aliaslb_core::plan::STICKY_FOR,
            fast_failover: true,
            drain_window: crate::handover::DEFAULT_WINDOW,
        }
    }
}

/// `--hold-released`: a duration from zero to [`aliaslb_core::plan::STICKY_FOR`] (the
/// planner remembers a deleted Service's addresses no longer).
fn parse_hold(s: &str) -> Result<Duration, String> {
    let d = aliaslb_ops::flags::parse_duration_or_zero(s)?;
    let most = aliaslb_core::plan::STICKY_FOR;
    if d > most {
        return Err(format!(
            "must be at most {}m (deleted Services' addresses are remembered no longer)",
            most.as_secs() / 60
        ));
    }
    Ok(d)
}

/// Everything `main` needs, split by consumer.
#[derive(Debug, Clone)]
pub struct Settings {
    /// For the reconcile loop.
    pub controller: ControllerConfig,
    /// For leader election.
    pub leader: LeaderConfig,
    /// Listen address of the HTTP server.
    pub metrics_addr: SocketAddr,
    /// Log format.
    pub log_format: LogFormat,
}

/// Why the flags do not make a usable configuration.
#[derive(Debug, thiserror::Error)]
pub enum ControllerConfigError {
    /// The leader-election durations are inconsistent.
    #[error("invalid leader election timings")]
    Timings(#[from] TimingError),
    /// No `--identity`/`POD_NAME` and the hostname could not be read.
    #[error("no --identity (or POD_NAME) given and the hostname could not be read")]
    Hostname(#[source] std::io::Error),
    /// The identity is empty.
    #[error("--identity must not be empty")]
    EmptyIdentity,
}

impl Flags {
    /// Check the flags and split them into [`Settings`]. Reads the hostname when no identity
    /// is given.
    pub fn into_settings(self) -> Result<Settings, ControllerConfigError> {
        let Flags {
            namespace,
            agent_namespace,
            pool_configmap,
            load_balancer_class,
            ignore_classless,
            ignore_cordon,
            agent_lease_duration,
            no_fast_failover,
            hold_released,
            drain_window,
            leader_lease_duration,
            leader_renew_deadline,
            leader_retry_period,
            metrics_addr,
            log_format,
            identity,
        } = self;
        let identity = match identity {
            Some(id) => id,
            None => hostname().map_err(ControllerConfigError::Hostname)?,
        };
        if identity.trim().is_empty() {
            return Err(ControllerConfigError::EmptyIdentity);
        }
        let timings = Timings::new(
            leader_lease_duration,
            leader_renew_deadline,
            leader_retry_period,
        )?;
        Ok(Settings {
            leader: LeaderConfig {
                namespace: namespace.clone(),
                lease_name: keys::CONTROLLER_LEASE.to_owned(),
                identity,
                timings,
            },
            controller: ControllerConfig {
                namespace,
                agent_namespace,
                pool_configmap,
                load_balancer_class,
                ignore_classless,
                respect_cordon: !ignore_cordon,
                agent_lease_duration,
                hold_released,
                fast_failover: !no_fast_failover,
                drain_window,
            },
            metrics_addr,
            log_format,
        })
    }
}

/// The kernel's hostname (Linux), used as identity outside a pod.
fn hostname() -> std::io::Result<String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname")?;
    Ok(name.trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn parse(args: &[&str]) -> Result<Flags, clap::Error> {
        Flags::try_parse_from(std::iter::once("aliaslb-controller").chain(args.iter().copied()))
    }

    #[test]
    fn defaults() {
        let s = parse(&["--identity", "pod-a"])
            .unwrap()
            .into_settings()
            .unwrap();
        assert_eq!(s.controller, ControllerConfig::default());
        assert_eq!(s.leader.identity, "pod-a");
        assert_eq!(s.leader.lease_name, "aliaslb-controller");
        assert_eq!(s.leader.namespace, "aliaslb-system");
        assert_eq!(s.controller.agent_namespace, "aliaslb-agents");
        // Planned moves keep established connections by default (issue 45).
        assert_eq!(s.controller.drain_window, Duration::from_secs(300));
        assert_eq!(s.leader.timings.lease_duration(), Duration::from_secs(15));
        assert_eq!(s.leader.timings.renew_deadline(), Duration::from_secs(10));
        assert_eq!(s.leader.timings.retry_period(), Duration::from_secs(2));
        assert_eq!(s.metrics_addr, "0.0.0.0:9100".parse().unwrap());
        assert_eq!(s.log_format, LogFormat::Text);
    }

    #[test]
    fn flags_are_typed() {
        let s = parse(&[
            "--identity=x",
            "--namespace=lb",
            "--agent-namespace=lb-agents",
            "--ignore-cordon",
            "--ignore-classless",
            "--lease-duration=500ms",
            "--leader-lease-duration=6s",
            "--leader-renew-deadline=4s",
            "--leader-retry-period=1s",
            "--log-format=json",
            "--metrics-addr=127.0.0.1:1234",
            "--hold-released=90s",
        ])
        .unwrap()
        .into_settings()
        .unwrap();
        assert!(!s.controller.respect_cordon);
        assert!(s.controller.ignore_classless);
        assert_eq!(s.controller.namespace, "lb");
        assert_eq!(s.controller.agent_namespace, "lb-agents");
        assert_eq!(s.leader.namespace, "lb");
        assert_eq!(
            s.controller.agent_lease_duration,
            Duration::from_millis(500)
        );
        assert_eq!(s.leader.timings.lease_duration(), Duration::from_secs(6));
        assert_eq!(s.controller.hold_released, Duration::from_secs(90));
        assert_eq!(
            parse(&["--hold-released=0s"]).unwrap().hold_released,
            Duration::ZERO
        );
        assert_eq!(s.log_format, LogFormat::Json);
        assert_eq!(s.metrics_addr, "127.0.0.1:1234".parse().unwrap());
    }

    #[test]
    fn bad_values_are_explained() {
        let table: &[(&[&str], &str)] = &[
            (&["--lease-duration=4"], "expected a duration"),
            (&["--lease-duration=0s"], "greater than zero"),
            (&["--metrics-addr=9100"], "invalid socket address"),
            (&["--log-format=xml"], "possible values: text, json"),
            (&["--hold-released=11m"], "must be at most 10m"),
            (&["--hold-released=soon"], "expected a duration such as 4s"),
        ];
        for (args, want) in table {
            let err = parse(args).unwrap_err().to_string();
            assert!(err.contains(want), "{args:?}: {err}");
        }
    }

    #[test]
    fn inconsistent_timings_are_refused() {
        let err = parse(&[
            "--identity=x",
            "--leader-lease-duration=10s",
            "--leader-renew-deadline=10s",
        ])
        .unwrap()
        .into_settings()
        .unwrap_err();
        assert!(matches!(err, ControllerConfigError::Timings(_)), "{err}");
    }

    #[test]
    fn empty_identity_is_refused() {
        let err = parse(&["--identity="])
            .unwrap()
            .into_settings()
            .unwrap_err();
        assert!(matches!(err, ControllerConfigError::EmptyIdentity), "{err}");
    }

    #[test]
    fn hostname_is_the_fallback_identity() {
        let s = parse(&[]).unwrap();
        // POD_NAME may be set in the environment running the tests.
        if s.identity.is_none() {
            let settings = s.into_settings().unwrap();
            assert_eq!(settings.leader.identity, hostname().unwrap());
        }
    }
}
