//! The agent's read-only view of the node's routing daemon, for pools with
//! `announce: bgp` (L3 mode).
//!
//! In L3 mode the agent puts each VIP as a /32 or /128 on a local device (`aliaslb0`,
//! else `lo`) and a routing daemon on the node exports those host routes to its BGP
//! peers. aliaslb never speaks BGP and never writes the daemon's configuration: this
//! module only *reads* the daemon's state, so the agent can report, per VIP, whether it
//! is really exported (advertised) to at least one Established peer.
//!
//! Owns: the `--routing-daemon` flag value ([`DaemonSpec`]), one reading of the daemon
//! ([`read`] -> [`RoutingStatus`]), its errors ([`RoutingError`]) and the seam the
//! agent's loop reads through ([`RoutingView`], real: [`DaemonView`]). Does I/O:
//! - BIRD 2 ([`bird`]): its control-socket line protocol over a Unix stream, first
//!   switched to restricted mode (`restrict`, as `birdc -r`) so this client can never
//!   change anything; then `show protocols` and `show route exported <proto>` for each
//!   BGP protocol that is up (Established).
//! - FRR ([`frr`]): `vtysh -c 'show bgp summary json'`, then one `vtysh` run asking
//!   `show bgp <afi> unicast neighbors <peer> advertised-routes json` for each
//!   Established (peer, family).
//!
//! Only host prefixes (/32, /128) count as exported VIPs. Every reading is bounded by a
//! timeout (a stuck daemon must never hang the agent's loop); a `vtysh` child is killed
//! when the reading is abandoned.
//!
//! # Node configuration (what docs/l3-mode.md shows)
//!
//! The pool prefixes here are `10.200.0.0/24` and `fd00:200::/64`; the peer is a ToR at
//! `10.0.9.2` in AS 65002 (one session carrying IPv4 and IPv6), the node is AS 65001. Only addresses on `lo` or
//! `aliaslb0` inside the pool prefixes, as host routes, are exported; nothing is
//! imported; BFD watches the session. These are the very files the integration test
//! runs (`agent/tests/data/routing/bird-node.conf`, `frr-node.conf`, included here), so
//! the short `connect retry` / `timers connect` are the tested values.
//!
//! BIRD 2 (`/etc/bird/bird.conf`); the agent gets `--routing-daemon=bird:/run/bird/bird.ctl`
//! and the socket mounted read-write (connecting needs write; `restrict` keeps it
//! read-only in effect):
//!
//! ```text
#![doc = include_str!("../../tests/data/routing/bird-node.conf")]
//! ```
//!
//! FRR (`/etc/frr/frr.conf`, `bgpd=yes` and `bfdd=yes` in `/etc/frr/daemons`); the agent
//! gets `--routing-daemon=frr` (or `frr:/usr/bin/vtysh:/run/frr` with the vty socket
//! directory mounted):
//!
//! ```text
#![doc = include_str!("../../tests/data/routing/frr-node.conf")]
//! ```

pub mod bird;
pub mod frr;

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use ipnet::IpNet;

/// BIRD's control socket when `--routing-daemon=bird` names none (Debian's default).
pub const DEFAULT_BIRD_SOCKET: &str = "/run/bird/bird.ctl";
/// The `vtysh` binary when `--routing-daemon=frr` names none.
pub const DEFAULT_VTYSH: &str = "/usr/bin/vtysh";

/// Which routing daemon runs on the node, and how to reach it; the value of
/// `--routing-daemon`: `none`, `bird`, `bird:<socket>`, `frr`, `frr:<vtysh>` or
/// `frr:<vtysh>:<vty socket dir>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DaemonSpec {
    /// No daemon: L3 pools are not checked ([`read`] answers `Ok(None)`).
    None,
    /// BIRD 2, through its control socket.
    Bird {
        /// The control socket (`bird -s`), e.g. `/run/bird/bird.ctl`.
        socket: PathBuf,
    },
    /// FRR, through `vtysh`.
    Frr {
        /// The `vtysh` binary.
        vtysh: PathBuf,
        /// The daemons' vty socket directory (`vtysh --vty_socket`), when not the
        /// compiled-in default (`/var/run/frr`).
        vty_socket: Option<PathBuf>,
    },
}

/// Why a `--routing-daemon` value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid --routing-daemon value {value:?}: {reason}; expected `none`, `bird`, \
     `bird:/run/bird/bird.ctl`, `frr`, `frr:/usr/bin/vtysh` or `frr:/usr/bin/vtysh:/run/frr`"
)]
pub struct DaemonSpecError {
    /// The value given.
    pub value: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl FromStr for DaemonSpec {
    type Err = DaemonSpecError;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        let err = |reason| DaemonSpecError {
            value: value.to_string(),
            reason,
        };
        let (kind, rest) = match value.split_once(':') {
            Some((kind, rest)) => (kind, Some(rest)),
            None => (value, None),
        };
        let path = |s: &str| -> Result<PathBuf, DaemonSpecError> {
            if s.is_empty() {
                Err(err("the path after `:` is empty"))
            } else if !s.starts_with('/') {
                Err(err("paths must be absolute"))
            } else {
                Ok(PathBuf::from(s))
            }
        };
        match (kind, rest) {
            ("none", None) => Ok(DaemonSpec::None),
            ("none", Some(_)) => Err(err("`none` takes no path")),
            ("bird", None) => Ok(DaemonSpec::Bird {
                socket: PathBuf::from(DEFAULT_BIRD_SOCKET),
            }),
            ("bird", Some(socket)) => Ok(DaemonSpec::Bird {
                socket: path(socket)?,
            }),
            ("frr", None) => Ok(DaemonSpec::Frr {
                vtysh: PathBuf::from(DEFAULT_VTYSH),
                vty_socket: None,
            }),
            ("frr", Some(rest)) => {
                let (vtysh, vty_socket) = match rest.split_once(':') {
                    Some((vtysh, dir)) => (path(vtysh)?, Some(path(dir)?)),
                    None => (path(rest)?, None),
                };
                Ok(DaemonSpec::Frr { vtysh, vty_socket })
            }
            _ => Err(err("unknown daemon (aliaslb reads BIRD 2 or FRR)")),
        }
    }
}

impl DaemonSpec {
    /// The daemon's name as reported in [`RoutingStatus::daemon`] (`none` for none).
    pub fn daemon(&self) -> &'static str {
        match self {
            DaemonSpec::None => "none",
            DaemonSpec::Bird { .. } => "bird",
            DaemonSpec::Frr { .. } => "frr",
        }
    }
}

/// One reading of the daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutingStatus {
    /// Daemon name as reported ("bird", "frr").
    pub daemon: &'static str,
    /// BGP sessions in state Established.
    pub established: usize,
    /// BGP sessions configured (any state).
    pub sessions: usize,
    /// Host prefixes (/32, /128) exported (advertised) to at least one Established
    /// peer, as addresses.
    pub exported: BTreeSet<IpAddr>,
}

impl RoutingStatus {
    /// Whether `vip` is exported to at least one Established peer.
    pub fn is_exported(&self, vip: IpAddr) -> bool {
        self.exported.contains(&vip)
    }
}

/// The seam the agent's loop reads the daemon through, so the loop can be tested with
/// a fake; [`DaemonView`] is the real one.
pub trait RoutingView {
    /// One bounded reading; `Ok(None)` when no daemon is configured.
    fn read(&self) -> impl Future<Output = Result<Option<RoutingStatus>, RoutingError>> + Send;
}

/// The real [`RoutingView`]: [`read`] of `spec`, each reading bounded by `timeout`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaemonView {
    /// Which daemon, and how to reach it.
    pub spec: DaemonSpec,
    /// The bound on each reading.
    pub timeout: Duration,
}

impl RoutingView for DaemonView {
    fn read(&self) -> impl Future<Output = Result<Option<RoutingStatus>, RoutingError>> + Send {
        read(&self.spec, self.timeout)
    }
}

/// Why the daemon could not be read. Every message says what to check.
#[derive(Debug, thiserror::Error)]
pub enum RoutingError {
    /// The daemon could not be reached (socket missing or refused, `vtysh` missing or
    /// unable to reach `bgpd`).
    #[error("cannot reach {what} {}: {detail} ({hint})", target.display())]
    Unreachable {
        /// "bird" or "frr".
        daemon: &'static str,
        /// What was tried, e.g. "BIRD's control socket".
        what: &'static str,
        /// The socket or binary.
        target: PathBuf,
        /// The operating system's or `vtysh`'s words.
        detail: String,
        /// What to check.
        hint: &'static str,
    },
    /// The daemon answered something this reader does not understand.
    #[error(
        "{daemon} answered `{command}` with something aliaslb cannot read: {detail} \
         (is this BIRD 2 / FRR 8 or later? please report it with the daemon's version)"
    )]
    Protocol {
        /// "bird" or "frr".
        daemon: &'static str,
        /// The command sent.
        command: String,
        /// What was wrong.
        detail: String,
    },
    /// The daemon refused a command (an error reply).
    #[error("{daemon} refused `{command}`: {reply} ({hint})")]
    Refused {
        /// "bird" or "frr".
        daemon: &'static str,
        /// The command sent.
        command: String,
        /// The daemon's error reply.
        reply: String,
        /// What to check.
        hint: &'static str,
    },
    /// The reading took longer than allowed.
    #[error(
        "{daemon} did not answer within {after:?} (is it stuck or overloaded? the reading \
         is abandoned and retried on the next pass)"
    )]
    Timeout {
        /// "bird" or "frr".
        daemon: &'static str,
        /// The bound.
        after: Duration,
    },
}

impl RoutingError {
    /// A short stable category in snake_case, the style of every error category.
    pub fn category(&self) -> &'static str {
        match self {
            RoutingError::Unreachable { .. } => "routing_daemon_unreachable",
            RoutingError::Protocol { .. } => "routing_daemon_protocol",
            RoutingError::Refused { .. } => "routing_daemon_refused",
            RoutingError::Timeout { .. } => "routing_daemon_timeout",
        }
    }
}

/// Reads the daemon once, bounded by `timeout`. `Ok(None)` for [`DaemonSpec::None`].
pub async fn read(
    spec: &DaemonSpec,
    timeout: Duration,
) -> Result<Option<RoutingStatus>, RoutingError> {
    let reading = async {
        match spec {
            DaemonSpec::None => Ok(None),
            DaemonSpec::Bird { socket } => bird::read(socket).await.map(Some),
            DaemonSpec::Frr { vtysh, vty_socket } => {
                frr::read(vtysh, vty_socket.as_deref()).await.map(Some)
            }
        }
    };
    match tokio::time::timeout(timeout, reading).await {
        Ok(result) => result,
        Err(_) => Err(RoutingError::Timeout {
            daemon: spec.daemon(),
            after: timeout,
        }),
    }
}

/// The address of a host prefix (/32, /128); `None` for any other prefix.
fn host_address(net: IpNet) -> Option<IpAddr> {
    (net.prefix_len() == net.max_prefix_len()).then(|| net.addr())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flag_values() {
        let ok = |s: &str| s.parse::<DaemonSpec>().unwrap();
        assert_eq!(ok("none"), DaemonSpec::None);
        assert_eq!(
            ok("bird"),
            DaemonSpec::Bird {
                socket: DEFAULT_BIRD_SOCKET.into()
            }
        );
        assert_eq!(
            ok("bird:/run/bird/bird.ctl"),
            DaemonSpec::Bird {
                socket: "/run/bird/bird.ctl".into()
            }
        );
        assert_eq!(
            ok("frr"),
            DaemonSpec::Frr {
                vtysh: DEFAULT_VTYSH.into(),
                vty_socket: None
            }
        );
        assert_eq!(
            ok("frr:/usr/bin/vtysh"),
            DaemonSpec::Frr {
                vtysh: "/usr/bin/vtysh".into(),
                vty_socket: None
            }
        );
        assert_eq!(
            ok("frr:/usr/bin/vtysh:/run/frr"),
            DaemonSpec::Frr {
                vtysh: "/usr/bin/vtysh".into(),
                vty_socket: Some("/run/frr".into())
            }
        );
    }

    #[test]
    fn bad_flag_values_say_what_is_wrong() {
        let bad = |s: &str| s.parse::<DaemonSpec>().unwrap_err().to_string();
        assert!(
            bad("quagga").contains("unknown daemon"),
            "{}",
            bad("quagga")
        );
        assert!(bad("bird:").contains("empty"));
        assert!(bad("bird:run/bird.ctl").contains("absolute"));
        assert!(bad("frr:/usr/bin/vtysh:").contains("empty"));
        assert!(bad("none:/x").contains("takes no path"));
        assert!(bad("").contains("expected `none`"));
    }

    #[test]
    fn only_host_prefixes_are_addresses() {
        let net = |s: &str| s.parse::<IpNet>().unwrap();
        assert_eq!(
            host_address(net("10.200.0.7/32")),
            Some("10.200.0.7".parse().unwrap())
        );
        assert_eq!(
            host_address(net("fd00:200::7/128")),
            Some("fd00:200::7".parse().unwrap())
        );
        assert_eq!(host_address(net("10.200.0.0/24")), None);
        assert_eq!(host_address(net("fd00:200::/64")), None);
    }

    #[tokio::test]
    async fn none_reads_nothing() {
        assert_eq!(
            read(&DaemonSpec::None, Duration::from_secs(1))
                .await
                .unwrap(),
            None
        );
    }
}
