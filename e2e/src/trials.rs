//! Repeated failover trials over the lab (`examples/failover_trials.rs`,
//! `tests/fast_failover.rs`): the faults a trial injects and undoes, one trial from settling
//! the Service to the verdicts ([`run_trial`]), starting the binaries with a chosen agent
//! lease duration, freezing and thawing an agent, the agent Leases and the holder's standby
//! (its `peer=` flag) as the API shows them, and the statistics of a series (nearest-rank
//! percentiles, time an IP spent on two nodes, the LAN's view: the first ARP answer by
//! another MAC and the runs of rounds with two MACs). Injecting faults and reading the lab
//! does I/O (`kubectl`, `ip`, `kill`, `scripts/lab`); the statistics ([`Summary`],
//! [`Overlap`], [`TwoMacs`], [`lan_takeover`]) and the parsing of a `peer=` flag are pure.
//!
//! Issue 24 (L2 failover under a second without the API) sets the LAN figures: on a hard
//! loss (the holder's LAN link cut and its agent killed, with or without the API) the IP is
//! answered by another MAC within [`HARD_LOSS_P99`] at p99 and [`HARD_LOSS_P50`] at p50,
//! that MAC is the standby the controller named in the holder's `peer=` flag, and no run of
//! rounds with two MACs lasts longer than one advert interval ([`TWO_MAC_BOUND`]).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::client::{self, RecoveryProbe};
use crate::lab::{
    AGENT_NAMESPACE, ApiPause, Lab, NODES, SYSTEM_NAMESPACE, node_name, node_number, run, wait_for,
};
use crate::lan::{LAN_PERIOD, LanRecord, LanSampler, LanViolation, Mac};
use crate::sampler::{SAMPLE_PERIOD, Sampler, Samples};
use crate::{Error, aliases};

/// The node label that takes a node out of the load-balancer election.
pub const EXCLUDE_LABEL: &str = "node.kubernetes.io/exclude-from-external-load-balancers";

/// A fault injected on the node holding the IP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Fault {
    /// SIGKILL of the holder's agent: nobody removes the alias, the kernel drops it when
    /// its lifetime runs out.
    AgentKill,
    /// The holder's LAN port goes down (no carrier on its `eth0`); agent alive, API
    /// reachable.
    LinkDown,
    /// Issue 24's hard loss: the holder's LAN port down and its agent SIGKILLed at once.
    HardLoss,
    /// [`Fault::HardLoss`] with kube-apiserver SIGSTOPped from just before the fault until
    /// [`TrialSettings::api_hold`] after the answer through another node: this failover
    /// needs no API.
    HardLossApiPaused,
    /// SIGSTOP of the holder's agent (SIGCONT when the trial is over).
    AgentFreeze,
    /// The holder's LAN port down and up again [`TrialSettings::flaps`] times,
    /// [`TrialSettings::flap_period`] apart; agent alive. The IP may stay or move; one MAC
    /// at a time either way.
    LinkFlap,
    /// SIGTERM of the holder's agent: it removes its aliases and gives up its Lease.
    AgentTerm,
    /// `kubectl cordon` of the holder.
    Cordon,
    /// The holder gets the [`EXCLUDE_LABEL`] label.
    ExcludeLabel,
    /// API-only partition of the holder, both directions, LAN untouched
    /// ([`Lab::partition_api`]): agent alive and on the LAN, cut from the apiserver.
    ApiPartition,
    /// kube-apiserver SIGSTOPped for a while ([`Lab::pause_apiserver`]): nothing may move.
    ApiPause,
    /// The controller's API path cut for a while ([`Lab::partition_controller`]): nothing
    /// may move.
    ControllerPartition,
    /// The holder's adverts dropped for a while ([`Lab::block_adverts`]), the LAN
    /// otherwise fine: its kernel still answers ARP, so nothing may move.
    AdvertsBlocked,
    /// The holder cut off the other nodes on the LAN for a while, broadcasts included
    /// ([`Lab::partition_lan`]), while the client still reaches every node: the standby
    /// hears neither adverts nor ARP answers. One MAC at a time, moved or not.
    LanPartition,
    /// The holder cut off its standby alone on the LAN for a while
    /// ([`Lab::partition_lan_from`]); the relay and the client reach both: the standby
    /// still hears the adverts through the relay, so nothing may move.
    StandbyPartition,
    /// A foreign host on the LAN takes the IP ([`Lab::add_rogue`]): the holder must yield
    /// within [`crate::lan::YIELD_BOUND`].
    ForeignHost,
}

impl Fault {
    /// Every fault, hard ones first.
    pub const ALL: [Fault; 16] = [
        Fault::AgentKill,
        Fault::LinkDown,
        Fault::HardLoss,
        Fault::HardLossApiPaused,
        Fault::AgentFreeze,
        Fault::LinkFlap,
        Fault::AgentTerm,
        Fault::Cordon,
        Fault::ExcludeLabel,
        Fault::ApiPartition,
        Fault::ApiPause,
        Fault::ControllerPartition,
        Fault::AdvertsBlocked,
        Fault::LanPartition,
        Fault::StandbyPartition,
        Fault::ForeignHost,
    ];

    /// The short name used on the command line.
    pub fn key(self) -> &'static str {
        match self {
            Fault::AgentKill => "kill",
            Fault::LinkDown => "link",
            Fault::HardLoss => "hard",
            Fault::HardLossApiPaused => "hard-api-pause",
            Fault::AgentFreeze => "freeze",
            Fault::LinkFlap => "flap",
            Fault::AgentTerm => "term",
            Fault::Cordon => "cordon",
            Fault::ExcludeLabel => "exclude",
            Fault::ApiPartition => "partition",
            Fault::ApiPause => "api-pause",
            Fault::ControllerPartition => "controller-partition",
            Fault::AdvertsBlocked => "adverts-blocked",
            Fault::LanPartition => "lan-partition",
            Fault::StandbyPartition => "standby-partition",
            Fault::ForeignHost => "foreign",
        }
    }

    /// The fault named `key` (see [`Fault::key`]).
    pub fn from_key(key: &str) -> Result<Fault, String> {
        Fault::ALL
            .into_iter()
            .find(|f| f.key() == key)
            .ok_or_else(|| {
                let keys: Vec<&str> = Fault::ALL.iter().map(|f| f.key()).collect();
                format!("unknown fault {key:?}: expected one of {}", keys.join(", "))
            })
    }

    /// One line for the table.
    pub fn describe(self) -> &'static str {
        match self {
            Fault::AgentKill => "hard: agent SIGKILL",
            Fault::LinkDown => "hard: LAN link down (agent alive, API reachable)",
            Fault::HardLoss => "hard loss: LAN link cut + agent SIGKILL",
            Fault::HardLossApiPaused => {
                "hard loss: LAN link cut + agent SIGKILL, kube-apiserver paused"
            }
            Fault::AgentFreeze => "hard: agent frozen (SIGSTOP)",
            Fault::LinkFlap => "flapping LAN link (agent alive)",
            Fault::AgentTerm => "graceful: agent SIGTERM",
            Fault::Cordon => "graceful: `kubectl cordon`",
            Fault::ExcludeLabel => "graceful: exclude-from-external-load-balancers label",
            Fault::ApiPartition => "hard: API-only partition of the holder (LAN up)",
            Fault::ApiPause => "no move: kube-apiserver paused (SIGSTOP)",
            Fault::ControllerPartition => "no move: the controller's API path cut",
            Fault::AdvertsBlocked => "no move: the holder's adverts dropped (ARP answered)",
            Fault::LanPartition => "LAN partition: the holder cut off the other nodes only",
            Fault::StandbyPartition => {
                "no move: the holder cut off its standby only (the relay reaches both)"
            }
            Fault::ForeignHost => "conflict: a foreign host takes the IP (time to yield)",
        }
    }

    /// Whether the IP has to move to another node: false for the faults that must change
    /// nothing on the LAN (the API, the controller or the adverts away), for a flapping
    /// link and a LAN partition between the nodes (it may stay or move) and for a foreign
    /// host (the holder yields; the Service moves to another address, not the IP to
    /// another node).
    pub fn moves(self) -> bool {
        !matches!(
            self,
            Fault::ApiPause
                | Fault::ControllerPartition
                | Fault::AdvertsBlocked
                | Fault::LinkFlap
                | Fault::LanPartition
                | Fault::StandbyPartition
                | Fault::ForeignHost
        )
    }

    /// Whether no other MAC may answer for the IP at all during the trial.
    pub fn stays(self) -> bool {
        matches!(
            self,
            Fault::ApiPause
                | Fault::ControllerPartition
                | Fault::AdvertsBlocked
                | Fault::StandbyPartition
        )
    }

    /// Whether the fault lasts a fixed time (`--pause-seconds`) and is undone by the trial
    /// before its verdict.
    pub fn timed(self) -> bool {
        self.stays() || self == Fault::LanPartition
    }

    /// Whether the move is a planned one (break-before-make, no lease to wait for).
    pub fn graceful(self) -> bool {
        matches!(self, Fault::AgentTerm | Fault::Cordon | Fault::ExcludeLabel)
    }

    /// Whether the standby must take the IP on the LAN by itself (issue 24): the holder's
    /// adverts stop and nothing answers ARP for the IP, at once (link cut) or once the
    /// alias's kernel lifetime has run out (agent killed or frozen, link up).
    pub fn standby_takes(self) -> bool {
        matches!(
            self,
            Fault::AgentKill
                | Fault::LinkDown
                | Fault::HardLoss
                | Fault::HardLossApiPaused
                | Fault::AgentFreeze
        )
    }

    /// Whether the holder's Lease stops being renewed, so the controller moves the IP
    /// (to the node that took it on the LAN) once it expires.
    pub fn lease_stops(self) -> bool {
        matches!(
            self,
            Fault::AgentKill
                | Fault::HardLoss
                | Fault::HardLossApiPaused
                | Fault::AgentFreeze
                | Fault::ApiPartition
        )
    }

    /// The p99 target of the time to another MAC's first ARP answer, for agent lease
    /// `lease` (renewed four times per lease, see [`Launcher`]). A foreign host: the yield
    /// bound. A graceful move: 0.5 s. A cut link (issue 24): [`HARD_LOSS_P99`]. A holder
    /// whose kernel still answers ARP (agent killed or frozen, link up): the alias's
    /// lifetime (`lease` less a renewal) and [`TAKEOVER_SLACK`], the standby re-checking
    /// every advert interval. An API-only partition: the lease and 1 s (the controller
    /// moves the IP).
    pub fn target(self, lease: Duration) -> Duration {
        match self {
            Fault::ForeignHost => crate::lan::YIELD_BOUND,
            f if f.graceful() => Duration::from_millis(500),
            Fault::LinkDown | Fault::HardLoss | Fault::HardLossApiPaused => HARD_LOSS_P99,
            Fault::AgentKill | Fault::AgentFreeze => alias_lifetime(lease) + TAKEOVER_SLACK,
            _ => lease + Duration::from_secs(1),
        }
    }

    /// The p50 target, where the issue sets one: [`HARD_LOSS_P50`] for a hard loss.
    pub fn p50_target(self) -> Option<Duration> {
        matches!(self, Fault::HardLoss | Fault::HardLossApiPaused).then_some(HARD_LOSS_P50)
    }

    /// How long a trial waits for the answer through another node (or, for a fault that
    /// moves nothing, watches), with `pause` the length of a timed fault.
    pub fn timeout(self, lease: Duration, pause: Duration) -> Duration {
        if self == Fault::ForeignHost {
            FOREIGN_WATCH
        } else if self.timed() {
            pause + lease + HARD_GRACE
        } else if self == Fault::LinkFlap {
            FLAP_WATCH
        } else if self.graceful() {
            GRACEFUL_TIMEOUT
        } else {
            lease + HARD_GRACE
        }
    }
}

/// Issue 24: a hard loss is answered again through another node within this at p99 ...
pub const HARD_LOSS_P99: Duration = Duration::from_secs(1);
/// ... and within this at p50.
pub const HARD_LOSS_P50: Duration = Duration::from_millis(500);
/// The agents' advert interval (`--advert-interval`, default).
pub const ADVERT_INTERVAL: Duration = Duration::from_millis(100);
/// The longest run of LAN rounds with two MACs allowed ([`TwoMacs::longest`]): one advert
/// interval, plus one LAN period because a run is measured from its first round to the
/// first round after it (within one period of the truth).
pub const TWO_MAC_BOUND: Duration =
    Duration::from_millis(ADVERT_INTERVAL.as_millis() as u64 + LAN_PERIOD.as_millis() as u64);
/// What a standby may take beyond the end of the holder's alias lifetime: a re-check at the
/// next advert interval, its ARP probe (~40 ms), the alias and the gratuitous ARP.
pub const TAKEOVER_SLACK: Duration = Duration::from_millis(500);
/// A graceful move that has not happened after this long counts as not happening.
const GRACEFUL_TIMEOUT: Duration = Duration::from_secs(3);
/// A hard failover is given the lease duration plus this long.
const HARD_GRACE: Duration = Duration::from_secs(4);
/// How long a foreign-host trial watches the LAN for the holder to yield.
const FOREIGN_WATCH: Duration = Duration::from_secs(3);
/// How long a flapping-link trial watches the LAN after its first flap.
const FLAP_WATCH: Duration = Duration::from_secs(3);

/// The kernel lifetime of an agent's aliases under agent lease `lease` as [`Launcher`]
/// starts it: the agent's default, 3 s, or the lease less one renewal (a quarter of it) in
/// whole seconds if that is shorter.
pub fn alias_lifetime(lease: Duration) -> Duration {
    Duration::from_secs((lease - lease / 4).as_secs()).min(Duration::from_secs(3))
}

/// Starts `aliaslb-agent` and `aliaslb-controller` in the lab like [`Lab::start_agent`] and
/// [`Lab::start_controller`], with an explicit agent lease duration on both.
#[derive(Debug, Clone)]
pub struct Launcher {
    /// The agents' `--lease-duration`, also the controller's `--agent-lease-duration`.
    pub lease: Duration,
}

impl Launcher {
    /// A launcher with agent lease `lease` (whole seconds).
    pub fn new(lease: Duration) -> Result<Launcher, Error> {
        if lease.subsec_nanos() != 0 || lease.as_secs() == 0 {
            return Err(Error::Environment(format!(
                "agent lease {lease:?} must be a whole number of seconds, at least 1 s"
            )));
        }
        Ok(Launcher { lease })
    }

    fn lease_flag(&self) -> String {
        format!("{}s", self.lease.as_secs())
    }

    /// Starts the agent of node `n` (`agent-N`) with `--lease-duration`.
    pub fn start_agent(&self, lab: &Lab, n: u8) -> Result<(), Error> {
        // Four renewals per lease: the agent's alias lifetime (lease less one renewal) must
        // cover two of them.
        let renew = format!("{}ms", self.lease.as_millis() / 4);
        lab.start_agent_with(
            n,
            &[
                "--lease-duration",
                &self.lease_flag(),
                "--renew-interval",
                &renew,
            ],
        )
    }

    /// Starts controller replica `identity` on the host with `--agent-lease-duration`.
    pub fn start_controller(&self, lab: &Lab, identity: &str) -> Result<(), Error> {
        lab.start_controller_with(identity, &["--agent-lease-duration", &self.lease_flag()])
    }
}

/// The pid of the lab process `name` (from `scripts/lab`'s pid file).
pub fn pid(lab: &Lab, name: &str) -> Result<u32, Error> {
    // `scripts/lab logs NAME` prints $LAB/logs/NAME.log: the pid file is $LAB/pids/NAME.pid.
    let log = PathBuf::from(lab.lab(&["logs", name])?.trim());
    let state = log
        .parent()
        .and_then(Path::parent)
        .ok_or_else(|| Error::Environment(format!("unexpected log path {}", log.display())))?;
    let path = state.join(format!("pids/{name}.pid"));
    let text = std::fs::read_to_string(&path).map_err(|source| Error::Io {
        what: format!("reading {}", path.display()),
        source,
    })?;
    text.trim().parse().map_err(|e| Error::Output {
        cmd: format!("cat {}", path.display()),
        why: format!("not a pid: {e}"),
    })
}

/// Sends `signal` (`STOP`, `CONT`, ...) to the lab process `name`.
pub fn signal(lab: &Lab, name: &str, signal: &str) -> Result<(), Error> {
    let pid = pid(lab, name)?.to_string();
    run(Command::new("kill").args([&format!("-{signal}"), &pid])).map(drop)
}

/// Waits until the lab process `name` is gone (or a zombie), after a SIGKILL.
pub fn wait_dead(lab: &Lab, name: &str) -> Result<(), Error> {
    let pid = pid(lab, name)?;
    wait_for(
        &format!("{name} (pid {pid}) to die"),
        Duration::from_secs(5),
        || {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let state = stat
                .rsplit_once(") ")
                .and_then(|(_, rest)| rest.chars().next());
            Ok(match state {
                None | Some('Z') | Some('X') => Ok(()),
                Some(s) => Err(format!("state {s}")),
            })
        },
    )
}

/// Whether the lab process `name` is stopped (state `T`, after SIGSTOP).
pub fn stopped(lab: &Lab, name: &str) -> Result<bool, Error> {
    let pid = pid(lab, name)?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The state follows the parenthesised command name, which may contain spaces.
    let state = stat.rsplit_once(") ").map(|(_, rest)| rest.chars().next());
    Ok(state == Some(Some('T')))
}

/// Puts the [`EXCLUDE_LABEL`] on node `n` (`on`) or removes it.
pub fn set_excluded(lab: &Lab, n: u8, on: bool) -> Result<(), Error> {
    let label = if on {
        format!("{EXCLUDE_LABEL}=")
    } else {
        format!("{EXCLUDE_LABEL}-")
    };
    lab.kubectl(&["label", "node", &node_name(n), &label, "--overwrite"])
        .map(drop)
}

/// `kubectl cordon` (`on`) or `uncordon` of node `n`.
pub fn set_cordoned(lab: &Lab, n: u8, on: bool) -> Result<(), Error> {
    let verb = if on { "cordon" } else { "uncordon" };
    lab.kubectl(&[verb, &node_name(n)]).map(drop)
}

/// Node `n`'s agent Lease as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentLease {
    /// `spec.renewTime`, verbatim (it changes at every renewal).
    pub renew_time: String,
    /// `spec.leaseDurationSeconds`: the agent's `--lease-duration`.
    pub duration_seconds: Option<u64>,
    /// The agent's report annotation, verbatim.
    pub report: String,
}

impl AgentLease {
    /// Whether the report lists interface `ifname`.
    pub fn reports_interface(&self, ifname: &str) -> bool {
        serde_json::from_str::<Value>(&self.report).is_ok_and(|r| {
            r["interfaces"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|i| i["name"].as_str() == Some(ifname))
        })
    }

    /// Whether the report says the agent holds `ip`.
    pub fn reports_held(&self, ip: Ipv4Addr) -> bool {
        serde_json::from_str::<Value>(&self.report).is_ok_and(|r| {
            r["held"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|h| h.as_str() == Some(&ip.to_string()))
        })
    }
}

/// Node `n`'s agent Lease, `None` when there is none (e.g. given up on SIGTERM).
pub fn agent_lease(lab: &Lab, n: u8) -> Result<Option<AgentLease>, Error> {
    let name = format!("aliaslb-agent-{}", node_name(n));
    let out = lab.kubectl(&[
        "get",
        "lease",
        "-n",
        AGENT_NAMESPACE,
        &name,
        "--ignore-not-found",
        "-o",
        "json",
    ])?;
    if out.trim().is_empty() {
        return Ok(None);
    }
    let v: Value = serde_json::from_str(&out).map_err(|e| Error::Output {
        cmd: format!("kubectl get lease -n {AGENT_NAMESPACE} {name} -o json"),
        why: format!("not JSON: {e}"),
    })?;
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    Ok(Some(AgentLease {
        renew_time: text(&v["spec"]["renewTime"]),
        duration_seconds: v["spec"]["leaseDurationSeconds"].as_u64(),
        report: text(&v["metadata"]["annotations"]["aliaslb.io/report"]),
    }))
}

/// p50, p99 and max of a series, nearest-rank (with 20 values p99 is the maximum).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    /// How many values.
    pub n: usize,
    /// Median (nearest rank).
    pub p50: Duration,
    /// 99th percentile (nearest rank).
    pub p99: Duration,
    /// Largest value.
    pub max: Duration,
}

impl Summary {
    /// The summary of `values`, `None` when there are none.
    pub fn of(values: &[Duration]) -> Option<Summary> {
        let mut sorted = values.to_vec();
        sorted.sort();
        let max = *sorted.last()?;
        Some(Summary {
            n: sorted.len(),
            p50: nearest_rank(&sorted, 50),
            p99: nearest_rank(&sorted, 99),
            max,
        })
    }
}

/// The `p`th percentile of `sorted` (not empty) by the nearest-rank method: the smallest
/// value with at least p % of the values at or below it.
fn nearest_rank(sorted: &[Duration], p: usize) -> Duration {
    let rank = (p * sorted.len()).div_ceil(100).max(1);
    sorted[rank - 1]
}

/// How long one IP sat on two or more nodes at once in a series of samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Overlap {
    /// Samples in which the IP was on two or more nodes.
    pub samples: usize,
    /// The longest run of consecutive such samples, from the sample before it (the last
    /// one without) to the sample after it (the first one without): an upper bound of the
    /// overlap, within one sampling interval of the truth.
    pub longest: Duration,
}

impl Overlap {
    /// The overlap of `ip` in `samples`.
    pub fn of(samples: &Samples, ip: Ipv4Addr) -> Overlap {
        let all = &samples.0;
        let double: Vec<bool> = all.iter().map(|s| s.holders(ip).len() > 1).collect();
        let mut overlap = Overlap::default();
        let mut i = 0;
        while i < all.len() {
            if !double[i] {
                i += 1;
                continue;
            }
            let start = i;
            while i < all.len() && double[i] {
                i += 1;
            }
            overlap.samples += i - start;
            // Bounded by the neighbouring clean samples; at an end of the series, by
            // one sampling period beyond the last double sample.
            let from = match start {
                0 => all[0].at.checked_sub(SAMPLE_PERIOD).unwrap_or(all[0].at),
                _ => all[start - 1].at,
            };
            let to = all
                .get(i)
                .map_or(all[i - 1].at + SAMPLE_PERIOD, |clean| clean.at);
            overlap.longest = overlap.longest.max(to - from);
        }
        overlap
    }

    /// Merges the overlaps of several trials: total samples, longest run.
    pub fn merge(self, other: Overlap) -> Overlap {
        Overlap {
            samples: self.samples + other.samples,
            longest: self.longest.max(other.longest),
        }
    }
}

/// How long `old` kept answering for `ip` on the LAN after another MAC first showed for it:
/// from that MAC's clock start (its announcement, see [`LanRecord::yield_windows`]) to the
/// first round after which `old` never answered again. `None` when no other MAC showed, or
/// `old` still answered in the last round (it never yielded).
pub fn lan_yield(record: &LanRecord, ip: Ipv4Addr, old: Mac) -> Option<Duration> {
    let (_, arrived, _) = record
        .yield_windows(ip)
        .into_iter()
        .find(|(_, _, mac)| *mac != old)?;
    let answered = |s: &crate::lan::LanSample| s.answers.get(&ip).is_some_and(|m| m.contains(&old));
    let last = record.samples.iter().rposition(answered);
    let yielded = match last {
        None => record.samples.iter().find(|s| s.at >= arrived)?,
        Some(i) => record.samples.get(i + 1)?,
    };
    Some(yielded.at.saturating_duration_since(arrived))
}

/// The first answer for `ip` on the LAN by a MAC other than `old` in a round sent at or
/// after `since`: (that MAC, round time - `since`). The round's time is when its request
/// went out; the answer came within [`LAN_PERIOD`] after.
pub fn lan_takeover(
    record: &LanRecord,
    ip: Ipv4Addr,
    old: Mac,
    since: Instant,
) -> Option<(Mac, Duration)> {
    record
        .samples
        .iter()
        .filter(|s| s.at >= since)
        .find_map(|s| {
            let other = s.answers.get(&ip)?.iter().find(|m| **m != old)?;
            Some((*other, s.at.saturating_duration_since(since)))
        })
}

/// The first gratuitous ARP for `ip` by a MAC other than `old` at or after `since`, timed
/// from `since`.
pub fn lan_announced(
    record: &LanRecord,
    ip: Ipv4Addr,
    old: Mac,
    since: Instant,
) -> Option<(Mac, Duration)> {
    record
        .announcements
        .iter()
        .find(|a| a.ip == ip && a.mac != old && a.at >= since)
        .map(|a| (a.mac, a.at.saturating_duration_since(since)))
}

/// The gratuitous ARPs for `ip` whose sender did not answer for it in any round from one
/// period before to `within` after (rounds up to then recorded): an announcement of an
/// address its sender does not hold, which moves the clients' caches to a node that does
/// not answer for it. (when, MAC.)
pub fn stray_announcements(
    record: &LanRecord,
    ip: Ipv4Addr,
    within: Duration,
) -> Vec<(Instant, Mac)> {
    let end = record.samples.last().map(|s| s.at);
    record
        .announcements
        .iter()
        .filter(|a| a.ip == ip)
        .filter(|a| end.is_some_and(|end| end >= a.at + within))
        .filter(|a| {
            !record.samples.iter().any(|s| {
                s.at + LAN_PERIOD >= a.at
                    && s.at <= a.at + within
                    && s.answers.get(&ip).is_some_and(|m| m.contains(&a.mac))
            })
        })
        .map(|a| (a.at, a.mac))
        .collect()
}

/// The rounds of a LAN record in which two or more MACs answered for one IP, excused or
/// not (the yield windows of [`LanRecord::violations`] do not apply: issue 24 bounds every
/// run of them by one advert interval).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TwoMacs {
    /// Rounds with two or more MACs.
    pub rounds: usize,
    /// The longest run of such rounds, from its first round to the first round after it
    /// with fewer than two MACs (at the end of the record: one period after its last
    /// round): within one [`LAN_PERIOD`] above the truth.
    pub longest: Duration,
    /// When the longest run began.
    pub longest_at: Option<Instant>,
}

impl TwoMacs {
    /// The runs of `ip` in `record`.
    pub fn of(record: &LanRecord, ip: Ipv4Addr) -> TwoMacs {
        let all = &record.samples;
        let double = |i: usize| all[i].answers.get(&ip).is_some_and(|m| m.len() > 1);
        let mut out = TwoMacs::default();
        let mut i = 0;
        while i < all.len() {
            if !double(i) {
                i += 1;
                continue;
            }
            let start = i;
            while i < all.len() && double(i) {
                i += 1;
            }
            out.rounds += i - start;
            let to = all
                .get(i)
                .map_or(all[i - 1].at + LAN_PERIOD, |clean| clean.at);
            let run = to.saturating_duration_since(all[start].at);
            if run > out.longest {
                out.longest = run;
                out.longest_at = Some(all[start].at);
            }
        }
        out
    }

    /// Merges the runs of several trials: total rounds, longest run.
    pub fn merge(self, other: TwoMacs) -> TwoMacs {
        if other.longest > self.longest {
            TwoMacs {
                rounds: self.rounds + other.rounds,
                ..other
            }
        } else {
            TwoMacs {
                rounds: self.rounds + other.rounds,
                ..self
            }
        }
    }
}

/// A node the controller names on the holder's line with its address (issue 24): the
/// standby (`peer=<node>@<address>`, where the adverts go) or the relay
/// (`relay=<node>@<address>`, which forwards a copy to the standby).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// The node's name.
    pub node: String,
    /// The address the holder sends its adverts to.
    pub address: IpAddr,
}

impl Peer {
    /// The lab node number (`alb-node-N`).
    pub fn number(&self) -> Option<u8> {
        node_number(&self.node)
    }

    /// Whether the address is the node's own LAN address in the lab.
    pub fn address_is_the_nodes(&self) -> bool {
        self.number()
            .is_some_and(|n| self.address == IpAddr::V4(crate::lab::node_ip(n)))
    }
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{}", self.node, self.address)
    }
}

/// The flags of `ip`'s line among assignment `lines` (`IP INTERFACE PORTS SERVICES
/// [FLAG ...]`, core/src/assignment.rs): the words after the fourth; `None` when no line
/// is for `ip`.
pub fn line_flags(lines: &str, ip: IpAddr) -> Option<Vec<&str>> {
    lines.lines().find_map(|line| {
        let words: Vec<&str> = line.split_ascii_whitespace().collect();
        let first: IpAddr = words.first()?.parse().ok()?;
        (first == ip).then(|| words.iter().skip(4).copied().collect())
    })
}

/// The standby named by a `peer=<node>@<address>` flag among `flags`.
pub fn peer_flag(flags: &[&str]) -> Option<Peer> {
    node_at_flag(flags, "peer=")
}

/// The relay named by a `relay=<node>@<address>` flag among `flags`.
pub fn relay_flag(flags: &[&str]) -> Option<Peer> {
    node_at_flag(flags, "relay=")
}

fn node_at_flag(flags: &[&str], prefix: &str) -> Option<Peer> {
    flags.iter().find_map(|f| {
        let (node, address) = f.strip_prefix(prefix)?.rsplit_once('@')?;
        Some(Peer {
            node: node.to_owned(),
            address: address.parse().ok()?,
        })
    })
}

/// The holder named by a `standby=<node>` flag among `flags`.
pub fn standby_flag<'a>(flags: &[&'a str]) -> Option<&'a str> {
    flags.iter().find_map(|f| f.strip_prefix("standby="))
}

/// Every assignment line the controller wrote for node `n` (its index and shards, the
/// objects labelled [`LABEL_ASSIGNMENT_NODE`] with its name), one string.
pub fn assignment_lines(lab: &Lab, n: u8) -> Result<String, Error> {
    let selector = format!("{LABEL_ASSIGNMENT_NODE}={}", node_name(n));
    let list = lab.get_json(&["configmaps", "-n", SYSTEM_NAMESPACE, "-l", &selector])?;
    Ok(list["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|cm| cm["data"][ASSIGNMENTS_KEY].as_str())
        .collect::<Vec<_>>()
        .join("\n"))
}

/// The standby and the relay the controller names for `ip` on holder `n`'s line; `None`
/// when it names no standby (no `peer=` flag, or no line for `ip`).
pub fn standby_of(lab: &Lab, n: u8, ip: Ipv4Addr) -> Result<Option<(Peer, Option<Peer>)>, Error> {
    let lines = assignment_lines(lab, n)?;
    let flags = line_flags(&lines, IpAddr::V4(ip)).unwrap_or_default();
    Ok(peer_flag(&flags).map(|p| (p, relay_flag(&flags))))
}

/// Whether standby `s`'s assignment lists `ip` with the flag `standby=<holder>`, waiting
/// up to [`STANDBY_WAIT`] for it (the controller writes the nodes' objects in rounds).
fn wait_standby_line(lab: &Lab, s: u8, holder: u8, ip: Ipv4Addr) -> Result<bool, Error> {
    let holder = node_name(holder);
    let listed = wait_for(
        &format!("a standby={holder} line for {ip} on {}", node_name(s)),
        STANDBY_WAIT,
        || {
            let lines = assignment_lines(lab, s)?;
            let flags = line_flags(&lines, IpAddr::V4(ip));
            Ok(match flags {
                Some(f) if standby_flag(&f) == Some(holder.as_str()) => Ok(()),
                other => Err(format!("flags {other:?}")),
            })
        },
    );
    match listed {
        Ok(()) => Ok(true),
        Err(Error::Timeout { .. }) => Ok(false),
        Err(e) => Err(e),
    }
}

/// The fast-failover counters of an agent (its `/metrics`): adverts its standby side
/// accepted and what its takeovers did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FailoverCounters {
    /// `aliaslb_agent_adverts_received_total{result="accepted"}`.
    pub accepted: u64,
    /// `aliaslb_agent_failovers_total{result="taken_over"}`.
    pub taken_over: u64,
    /// `aliaslb_agent_failovers_total{result="still_answered"}`.
    pub still_answered: u64,
    /// `aliaslb_agent_failovers_total{result="given_back"}`.
    pub given_back: u64,
}

/// The agents' metrics port (`--metrics-addr` default, in each node's namespace).
const AGENT_METRICS_PORT: u16 = 9101;

impl FailoverCounters {
    /// Reads the counters from a Prometheus text exposition (absent series: 0).
    pub fn parse(text: &str) -> FailoverCounters {
        let value = |name: &str, result: &str| -> u64 {
            let label = format!("result=\"{result}\"");
            text.lines()
                .filter(|l| l.starts_with(name) && l.contains(&label))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .map(|v| v as u64)
                .sum()
        };
        FailoverCounters {
            accepted: value("aliaslb_agent_adverts_received_total{", "accepted"),
            taken_over: value("aliaslb_agent_failovers_total{", "taken_over"),
            still_answered: value("aliaslb_agent_failovers_total{", "still_answered"),
            given_back: value("aliaslb_agent_failovers_total{", "given_back"),
        }
    }

    /// What grew since `before`.
    pub fn since(self, before: FailoverCounters) -> FailoverCounters {
        FailoverCounters {
            accepted: self.accepted.saturating_sub(before.accepted),
            taken_over: self.taken_over.saturating_sub(before.taken_over),
            still_answered: self.still_answered.saturating_sub(before.still_answered),
            given_back: self.given_back.saturating_sub(before.given_back),
        }
    }
}

/// Node `n`'s agent's [`FailoverCounters`], read from its `/metrics` inside the node's
/// namespace; `None` when it does not answer (dead, frozen).
pub fn failover_counters(n: u8) -> Result<Option<FailoverCounters>, Error> {
    Ok(agent_metrics(n)?.map(|t| FailoverCounters::parse(&t)))
}

/// Node `n`'s agent's `/metrics`, read inside the node's namespace; `None` when it does
/// not answer (dead, frozen).
pub fn agent_metrics(n: u8) -> Result<Option<String>, Error> {
    client::in_namespace(&node_name(n), || -> Option<String> {
        use std::io::{Read as _, Write as _};
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], AGENT_METRICS_PORT));
        let mut stream =
            std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(300)).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
        stream
            .write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
            .ok()?;
        let mut text = String::new();
        stream.read_to_string(&mut text).ok()?;
        Some(text)
    })
}

/// The value of the unlabelled series `name` in an exposition (absent: `None`).
pub fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .find_map(|v| v.trim().parse().ok())
}

/// The key node `n`'s agent signs its adverts with, as its Lease report says (`None`: no
/// Lease yet, or no key in it).
pub fn agent_key(lab: &Lab, n: u8) -> Result<Option<String>, Error> {
    let Some(lease) = agent_lease(lab, n)? else {
        return Ok(None);
    };
    let report: Value = serde_json::from_str(&lease.report).unwrap_or(Value::Null);
    Ok(report["key"].as_str().map(str::to_owned))
}

/// Node `n`'s peers as its index lists them: (peer node, key), `-` for no key.
pub fn listed_peers(lab: &Lab, n: u8) -> Result<Vec<(String, String)>, Error> {
    let name = format!("aliaslb-node-{}", node_name(n));
    let peers = lab.kubectl(&[
        "get",
        "configmap",
        "-n",
        SYSTEM_NAMESPACE,
        &name,
        "--ignore-not-found",
        "-o",
        "jsonpath={.data.peers}",
    ])?;
    Ok(peers
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            Some((fields.next()?.to_owned(), fields.next()?.to_owned()))
        })
        .collect())
}

/// Waits up to `timeout` until every agent reports the key it signs with and every node's
/// index lists each of its peers with that peer's current key (the controller relays them
/// from the reports): until then a pair fails over by the Lease only. Returns what it saw,
/// one line: a trial run should not start in that window, nor fail on a slow start.
pub fn wait_advert_keys(lab: &Lab, timeout: Duration) -> Result<String, Error> {
    let t0 = Instant::now();
    let ready = wait_for("every agent's key in its peers' indexes", timeout, || {
        let mut keys = std::collections::BTreeMap::new();
        for n in NODES {
            match agent_key(lab, n)? {
                Some(key) => {
                    keys.insert(node_name(n), key);
                }
                None => return Ok(Err(format!("{} reports no key", node_name(n)))),
            }
        }
        let mut peers = 0;
        for n in NODES {
            for (peer, key) in listed_peers(lab, n)? {
                peers += 1;
                if keys.get(&peer) != Some(&key) {
                    return Ok(Err(format!(
                        "{}'s index lists {peer} with key {key}, its agent reports {:?}",
                        node_name(n),
                        keys.get(&peer)
                    )));
                }
            }
        }
        Ok(if peers == 0 {
            Err("no node lists a peer yet".to_owned())
        } else {
            Ok(())
        })
    });
    match ready {
        Ok(()) => Ok(format!(
            "every peer has every agent's key ({} ms)",
            t0.elapsed().as_millis()
        )),
        Err(Error::Timeout { last, .. }) => Ok(format!(
            "after {} ms: {last}: those fail over by the Lease only",
            timeout.as_millis()
        )),
        Err(e) => Err(e),
    }
}

/// Waits up to `timeout` for [`standby_of`] to name a standby (the controller writes it
/// with, or just after, the holder's line).
pub fn wait_standby(
    lab: &Lab,
    n: u8,
    ip: Ipv4Addr,
    timeout: Duration,
) -> Result<Option<(Peer, Option<Peer>)>, Error> {
    match wait_for(
        &format!("a peer= flag for {ip} on {}", node_name(n)),
        timeout,
        || {
            Ok(match standby_of(lab, n, ip)? {
                Some(s) => Ok(s),
                None => Err("none".to_owned()),
            })
        },
    ) {
        Ok(s) => Ok(Some(s)),
        Err(Error::Timeout { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The label of a node's assignment objects (index and shards), naming the node
/// (core's `keys::LABEL_ASSIGNMENT_NODE`).
const LABEL_ASSIGNMENT_NODE: &str = "aliaslb.io/assignment-node";
/// The data key of the IP lines of an assignment object (core's `keys::ASSIGNMENTS_KEY`).
const ASSIGNMENTS_KEY: &str = "ips";
/// How long a trial waits for the controller to name the holder's standby before the fault.
const STANDBY_WAIT: Duration = Duration::from_secs(3);
/// How long after a gratuitous ARP its sender must answer for the IP for it not to be a
/// stray one.
const STRAY_WITHIN: Duration = Duration::from_millis(200);
/// Clean LAN rounds recorded before the fault.
const BEFORE_FAULT: Duration = Duration::from_millis(200);
/// How long to wait for the Service to settle.
pub const SETTLE_TIMEOUT: Duration = Duration::from_secs(30);

/// How the trials of a run go: the Service aimed at and the durations of the faults.
#[derive(Debug, Clone)]
pub struct TrialSettings {
    /// The Service's namespace.
    pub ns: String,
    /// The Service's name.
    pub service: String,
    /// How long a timed fault lasts ([`Fault::timed`]).
    pub pause: Duration,
    /// How long `hard-api-pause` keeps the apiserver paused after the answer through
    /// another node.
    pub api_hold: Duration,
    /// How many times `flap` takes the link down.
    pub flaps: u32,
    /// How long each flap's down and up last.
    pub flap_period: Duration,
    /// How long the LAN is still watched after the fault is undone (the old holder
    /// coming back, a standby giving back an IP).
    pub tail: Duration,
}

impl TrialSettings {
    /// Settings for the Service `ns/service`: 10 s timed faults, the apiserver held 1 s
    /// after the answer, three flaps 200 ms apart, a 1.5 s tail.
    pub fn new(ns: &str, service: &str) -> TrialSettings {
        TrialSettings {
            ns: ns.to_owned(),
            service: service.to_owned(),
            pause: Duration::from_secs(10),
            api_hold: Duration::from_secs(1),
            flaps: 3,
            flap_period: Duration::from_millis(200),
            tail: Duration::from_millis(1500),
        }
    }
}

/// What one trial saw. Times are from the fault.
#[derive(Debug, Clone)]
pub struct Trial {
    /// The fault.
    pub fault: Fault,
    /// The IP.
    pub ip: Ipv4Addr,
    /// The node that held it.
    pub from: u8,
    /// The standby the controller named on the holder's line before the fault.
    pub standby: Option<Peer>,
    /// The relay named there.
    pub relay: Option<Peer>,
    /// Adverts per second the standby accepted just before the fault (from its metrics).
    pub adverts_per_s: Option<f64>,
    /// The standby's failover counters, from just before the fault to the end of the trial.
    pub standby_counters: Option<FailoverCounters>,
    /// Whether the standby's own assignment had a line for the IP flagged
    /// `standby=<holder>` before the fault; `None` when no standby was named.
    pub standby_line: Option<bool>,
    /// How long injecting the fault took (`kubectl`, `kill`, `ip`, `scripts/lab stop`).
    pub injection: Duration,
    /// The client: the node that answered after the fault and how long it took; `None`:
    /// timed out (or not asked: a fault that moves nothing).
    pub recovered: Option<(u8, Duration)>,
    /// The LAN: the first ARP answer by another MAC, the node it belongs to.
    pub lan: Option<(Mac, Option<u8>, Duration)>,
    /// The LAN: the first gratuitous ARP by another MAC.
    pub announced: Option<Duration>,
    /// The LAN: gratuitous ARPs for the IP by a MAC that did not answer for it
    /// ([`stray_announcements`]): its node and when, in ms from the fault (negative:
    /// before it).
    pub stray_garps: Vec<(Option<u8>, i64)>,
    /// When the controller moved the Service to another node, and where.
    pub followed: Option<(u8, Duration)>,
    /// When the fault was undone (restore started).
    pub restored: Duration,
    /// The address sampler: the IP on two nodes.
    pub overlap: Overlap,
    /// The LAN: rounds with two MACs, longest run, from the fault to the tail's end.
    pub two_macs: TwoMacs,
    /// When the longest two-MAC run began, from the fault (negative runs: before it).
    pub two_macs_at: Option<Duration>,
    /// LAN rounds in which two MACs answered for the IP beyond the yield bound.
    pub lan_doubles: usize,
    /// Stalls of the LAN sampler beyond the yield bound.
    pub lan_stalls: usize,
    /// How long the old holder kept answering after another MAC first showed.
    pub lan_yield: Option<Duration>,
    /// What the lab looked like when something was off.
    pub evidence: Option<String>,
}

impl Trial {
    /// The node that took the IP on the LAN, when another node's MAC answered.
    pub fn taker(&self) -> Option<u8> {
        self.lan.and_then(|(_, node, _)| node)
    }

    /// Whether the taker is the standby named before the fault.
    pub fn taker_is_standby(&self) -> bool {
        match (&self.standby, self.taker()) {
            (Some(s), Some(t)) => s.number() == Some(t),
            _ => false,
        }
    }

    /// What goes against issue 24 in this trial under agent lease `lease`, one line each:
    /// no other MAC in time (or at all) where the standby must take the IP, another MAC
    /// where nothing may move, a taker that is not the named standby, and a two-MAC run
    /// longer than [`TWO_MAC_BOUND`]. Percentiles are the series' business.
    pub fn problems(&self, lease: Duration) -> Vec<String> {
        let mut out = Vec::new();
        let f = self.fault;
        for (what, p) in [("peer=", &self.standby), ("relay=", &self.relay)] {
            if let Some(p) = p.as_ref().filter(|p| !p.address_is_the_nodes()) {
                out.push(format!(
                    "{}: the holder's {what} flag sends the adverts to {}, which is not {}'s own LAN address",
                    f.key(),
                    p.address,
                    p.node
                ));
            }
        }
        if let (Some(s), Some(false)) = (&self.standby, self.standby_line) {
            out.push(format!(
                "{}: the holder's peer= flag names {} but its assignment has no line for {} flagged standby={}",
                f.key(),
                s.node,
                self.ip,
                node_name(self.from)
            ));
        }
        if f.standby_takes() {
            match self.lan {
                None => out.push(format!(
                    "{}: no other MAC answered for {} on the LAN",
                    f.key(),
                    self.ip
                )),
                Some((mac, node, after)) => {
                    if after > f.target(lease) {
                        out.push(format!(
                            "{}: another MAC ({mac}, node {node:?}) answered after {} ms, target {} ms",
                            f.key(),
                            after.as_millis(),
                            f.target(lease).as_millis()
                        ));
                    }
                    if !self.taker_is_standby() {
                        out.push(format!(
                            "{}: node {node:?} took {} but the holder's peer= flag named {:?}",
                            f.key(),
                            self.ip,
                            self.standby
                        ));
                    }
                }
            }
        }
        if f.stays()
            && let Some((mac, node, after)) = self.lan
        {
            out.push(format!(
                "{}: nothing may move, but {mac} (node {node:?}) answered for {} {} ms after the fault",
                f.key(),
                self.ip,
                after.as_millis()
            ));
        }
        if self.two_macs.longest > TWO_MAC_BOUND {
            out.push(format!(
                "{}: two MACs answered for {} in {} rounds, the longest run {} ms (bound {} ms) starting {} ms after the fault",
                f.key(),
                self.ip,
                self.two_macs.rounds,
                self.two_macs.longest.as_millis(),
                TWO_MAC_BOUND.as_millis(),
                self.two_macs_at.map_or(-1, |d| d.as_millis() as i128)
            ));
        }
        out
    }

    /// One line for the log.
    pub fn line(&self, lease: Duration) -> String {
        let lan = match self.lan {
            Some((_, node, after)) => format!(
                "LAN: {} answered after {} ms",
                node.map_or("an unknown MAC".to_owned(), node_name),
                after.as_millis()
            ),
            None => "LAN: no other MAC answered".to_owned(),
        };
        let standby = self.standby.as_ref().map_or("none named".to_owned(), |s| {
            format!("{}@{}", s.node, s.address)
        });
        let client = match self.recovered {
            Some((n, after)) => format!("{} after {} ms", node_name(n), after.as_millis()),
            None => "—".to_owned(),
        };
        let followed = match self.followed {
            Some((n, after)) => format!("{} after {} ms", node_name(n), after.as_millis()),
            None => "—".to_owned(),
        };
        let heard = match (self.adverts_per_s, self.standby_counters) {
            (Some(rate), Some(c)) => format!(
                "standby heard {rate:.0} adverts/s before; its failovers: taken_over +{}, still_answered +{}, given_back +{}",
                c.taken_over, c.still_answered, c.given_back
            ),
            (Some(rate), None) => format!("standby heard {rate:.0} adverts/s before"),
            _ => "standby's metrics unread".to_owned(),
        };
        let stray = if self.stray_garps.is_empty() {
            String::new()
        } else {
            let each: Vec<String> = self
                .stray_garps
                .iter()
                .map(|(n, ms)| format!("{} at {ms} ms", n.map_or("?".to_owned(), node_name)))
                .collect();
            format!("; STRAY GARPs (sender not answering): {}", each.join(", "))
        };
        format!(
            "{} {}s: {} on {} (standby {standby}; {heard}); {lan}; GARP {} ms{stray}; client via {client}; controller moved it to {followed}; two MACs in {} rounds (longest {} ms); on two nodes in {} address samples; restore at {} ms",
            self.fault.key(),
            lease.as_secs(),
            self.ip,
            node_name(self.from),
            self.announced
                .map_or("—".to_owned(), |d| d.as_millis().to_string()),
            self.two_macs.rounds,
            self.two_macs.longest.as_millis(),
            self.overlap.samples,
            self.restored.as_millis()
        )
    }
}

/// The LAN times of `trials` (fault -> another MAC's first answer), missing ones (no other
/// MAC) left out.
pub fn lan_times(trials: &[Trial]) -> Vec<Duration> {
    trials
        .iter()
        .filter_map(|t| t.lan.map(|(_, _, after)| after))
        .collect()
}

/// What goes against issue 24 in a series of trials of one fault under agent lease
/// `lease`: each trial's [`Trial::problems`] (numbered from 1), and the p50 and p99 of the
/// LAN times against the fault's targets, a trial in which the standby had to take the IP
/// and no other MAC answered counting as slower than any.
pub fn series_problems(trials: &[Trial], lease: Duration) -> Vec<String> {
    let mut out: Vec<String> = trials
        .iter()
        .enumerate()
        .flat_map(|(i, t)| {
            t.problems(lease)
                .into_iter()
                .map(move |p| format!("trial {}: {p}", i + 1))
        })
        .collect();
    let Some(fault) = trials.first().map(|t| t.fault) else {
        return out;
    };
    if !fault.standby_takes() {
        return out;
    }
    let mut times = lan_times(trials);
    let missing = trials.len() - times.len();
    // A missing answer is slower than any: it sorts last.
    times.extend(std::iter::repeat_n(Duration::MAX, missing));
    let Some(sum) = Summary::of(&times) else {
        return out;
    };
    let shown = |d: Duration| {
        if d == Duration::MAX {
            "never".to_owned()
        } else {
            format!("{} ms", d.as_millis())
        }
    };
    if sum.p99 > fault.target(lease) {
        out.push(format!(
            "{}: p99 {} over {} trials, target {} ms",
            fault.key(),
            shown(sum.p99),
            sum.n,
            fault.target(lease).as_millis()
        ));
    }
    if let Some(p50) = fault.p50_target().filter(|&t| sum.p50 > t) {
        out.push(format!(
            "{}: p50 {} over {} trials, target {} ms",
            fault.key(),
            shown(sum.p50),
            sum.n,
            p50.as_millis()
        ));
    }
    out
}

/// One trial of `fault` on holder `old` of `ip` (a settled Service, see [`settle`]): the
/// standby named before it, the address and LAN samplers and the client's prober started,
/// the fault injected (for `hard-api-pause`, with kube-apiserver paused until
/// [`TrialSettings::api_hold`] after the answer through another node), the answer
/// awaited, then (for a fault that moves the IP) the controller's move and the old alias's
/// end, the fault undone and the LAN watched for [`TrialSettings::tail`] more. The node is
/// back (its agent renewing its Lease) when this returns.
pub fn run_trial(
    lab: &Lab,
    launcher: &Launcher,
    fault: Fault,
    ip: Ipv4Addr,
    old: u8,
    settings: &TrialSettings,
) -> Result<Trial, Error> {
    let old_mac = lab.node_mac(old)?;
    let names = lab.mac_names()?;
    let (standby, relay) = match wait_standby(lab, old, ip, STANDBY_WAIT)? {
        Some((s, r)) => (Some(s), r),
        None => (None, None),
    };
    let standby_line = match standby.as_ref().and_then(Peer::number) {
        Some(s) => Some(wait_standby_line(lab, s, old, ip)?),
        None => None,
    };
    let timeout = fault.timeout(launcher.lease, settings.pause);
    let standby_n = standby.as_ref().and_then(Peer::number);
    let counters = |n: Option<u8>| -> Result<Option<(Instant, FailoverCounters)>, Error> {
        Ok(match n {
            Some(n) => failover_counters(n)?.map(|c| (Instant::now(), c)),
            None => None,
        })
    };
    let first = counters(standby_n)?;
    let sampler = Sampler::start();
    let lan = LanSampler::start([ip])?;
    std::thread::sleep(BEFORE_FAULT);
    let before = counters(standby_n)?;
    let adverts_per_s = match (first, before) {
        (Some((t0, c0)), Some((t1, c1))) => {
            Some(c1.since(c0).accepted as f64 / t1.saturating_duration_since(t0).as_secs_f64())
        }
        _ => None,
    };
    let probe = fault.moves().then(|| {
        RecoveryProbe::start(ip, timeout, move |a| a.via_node().is_some_and(|n| n != old))
    });
    let api = match fault {
        Fault::HardLossApiPaused => {
            let paused = ApiPause::new(lab)?;
            // SIGSTOP is asynchronous; let it land before the clock starts.
            std::thread::sleep(Duration::from_millis(50));
            Some(paused)
        }
        _ => None,
    };
    let fault_at = Instant::now();
    inject(lab, fault, ip, old, standby_n, settings)?;
    let injection = fault_at.elapsed();
    if fault.timed() {
        std::thread::sleep(settings.pause.saturating_sub(injection));
        undo_timed(lab, fault, old)?;
    }
    let recovered = match probe {
        Some(probe) => match probe.wait(fault_at) {
            Ok(r) => r.answer.via_node().map(|n| (n, r.after)),
            Err(Error::Timeout { .. }) => None,
            Err(e) => return Err(e),
        },
        None if fault.timed() => None,
        None => {
            std::thread::sleep(timeout.saturating_sub(fault_at.elapsed()));
            None
        }
    };
    // The controller can follow from here on.
    let mut api_back = fault_at;
    if let Some(api) = api {
        std::thread::sleep(settings.api_hold);
        api.resume()?;
        api_back = Instant::now();
    }
    // The controller follows (the old holder's Lease expires; after an API pause it gives
    // every agent a lease duration to be seen again); meanwhile a killed or frozen agent's
    // alias lives until its lifetime runs out.
    let followed = if fault.moves() {
        wait_moved(
            lab,
            settings,
            old,
            fault_at,
            api_back + launcher.lease + HARD_GRACE,
        )?
    } else {
        None
    };
    if fault.moves() {
        wait_gone(ip, old, fault_at + launcher.lease + Duration::from_secs(2))?;
    }
    let restored = fault_at.elapsed();
    let lease_before = restore(lab, launcher, fault, old)?;
    std::thread::sleep(settings.tail);
    let standby_counters = match (before, counters(standby_n)?) {
        (Some((_, b)), Some((_, a))) => Some(a.since(b)),
        _ => None,
    };
    let samples = sampler.finish()?;
    let record = lan.finish()?;
    if let Some(stale) = lease_before {
        wait_renewed(lab, old, stale)?;
    }
    let violations = record.violations();
    let lan_doubles = violations
        .iter()
        .filter(|v| matches!(v, LanViolation::Double { .. }))
        .count();
    let lan_stalls = violations.len() - lan_doubles;
    let lan_yield = lan_yield(&record, ip, old_mac);
    let recovered = if fault == Fault::ForeignHost {
        lan_yield.map(|y| (old, y))
    } else {
        recovered
    };
    let node_of = |mac: Mac| names.get(&mac).and_then(|n| node_number(n));
    let two_macs = TwoMacs::of(&record.since(fault_at), ip);
    let mut trial = Trial {
        fault,
        ip,
        from: old,
        standby,
        relay,
        adverts_per_s,
        standby_counters,
        standby_line,
        injection,
        recovered,
        lan: lan_takeover(&record, ip, old_mac, fault_at)
            .map(|(mac, after)| (mac, node_of(mac), after)),
        announced: lan_announced(&record, ip, old_mac, fault_at).map(|(_, after)| after),
        stray_garps: stray_announcements(&record, ip, STRAY_WITHIN)
            .into_iter()
            .map(|(at, mac)| {
                let ms = if at >= fault_at {
                    at.duration_since(fault_at).as_millis() as i64
                } else {
                    -(fault_at.duration_since(at).as_millis() as i64)
                };
                (node_of(mac), ms)
            })
            .collect(),
        followed,
        restored,
        overlap: Overlap::of(&samples.since(fault_at), ip),
        two_macs,
        two_macs_at: two_macs
            .longest_at
            .map(|at| at.saturating_duration_since(fault_at)),
        lan_doubles,
        lan_stalls,
        lan_yield,
        evidence: None,
    };
    let missing = match fault {
        Fault::ForeignHost => trial.recovered.is_none(),
        f if f.moves() => trial.recovered.is_none() || trial.lan.is_none(),
        _ => false,
    };
    if missing || !trial.problems(launcher.lease).is_empty() {
        trial.evidence = Some(evidence(lab, settings, ip, old, trial.standby.as_ref())?);
    }
    Ok(trial)
}

/// Waits until the Service is announced, its IP is on its node only and the client is
/// answered through that node. With `holder`, first moves the IP there if it is elsewhere
/// (by cordoning the other nodes for the move), so the trials rotate over the nodes
/// instead of following the election's tie-break. Returns (IP, holder).
pub fn settle(
    lab: &Lab,
    settings: &TrialSettings,
    holder: Option<u8>,
) -> Result<(Ipv4Addr, u8), Error> {
    let (ns, service) = (settings.ns.as_str(), settings.service.as_str());
    let (mut ip, mut at) = lab.wait_announced(ns, service, SETTLE_TIMEOUT)?;
    if let Some(want) = holder.filter(|&want| want != at) {
        (ip, at) = move_to(lab, settings, want)?;
    }
    let holder = at;
    wait_for(
        &format!("{ip} on {} only", node_name(holder)),
        SETTLE_TIMEOUT,
        || {
            let mut on = Vec::new();
            for n in NODES {
                if aliases(n)?.contains(&ip) {
                    on.push(n);
                }
            }
            Ok(if on == [holder] {
                Ok(())
            } else {
                Err(format!("on nodes {on:?}"))
            })
        },
    )?;
    wait_for(
        &format!("the client to be answered through {}", node_name(holder)),
        SETTLE_TIMEOUT,
        || {
            Ok(match client::get(ip)? {
                Ok(a) if a.via_node() == Some(holder) => Ok(()),
                Ok(a) => Err(format!("answered {a:?}")),
                Err(e) => Err(e),
            })
        },
    )?;
    Ok((ip, holder))
}

/// Moves the Service's IP to node `want`: cordons the other nodes until it is announced
/// there, then uncordons them.
fn move_to(lab: &Lab, settings: &TrialSettings, want: u8) -> Result<(Ipv4Addr, u8), Error> {
    let (ns, service) = (settings.ns.as_str(), settings.service.as_str());
    let others: Vec<u8> = NODES.into_iter().filter(|&n| n != want).collect();
    for &n in &others {
        set_cordoned(lab, n, true)?;
    }
    let moved = wait_for(
        &format!("{service} to be announced on {}", node_name(want)),
        SETTLE_TIMEOUT,
        || {
            let (ip, at) = lab.wait_announced(ns, service, SETTLE_TIMEOUT)?;
            Ok(if at == want {
                Ok((ip, at))
            } else {
                Err(format!("on {}", node_name(at)))
            })
        },
    );
    for &n in &others {
        set_cordoned(lab, n, false)?;
    }
    moved
}

/// Waits until the Service names another node than `old`, until `until` at most: (that
/// node, when, from `fault_at`).
fn wait_moved(
    lab: &Lab,
    settings: &TrialSettings,
    old: u8,
    fault_at: Instant,
    until: Instant,
) -> Result<Option<(u8, Duration)>, Error> {
    let moved = wait_for(
        &format!(
            "the controller to move {} off {}",
            settings.service,
            node_name(old)
        ),
        until.saturating_duration_since(Instant::now()),
        || {
            let view = lab.service(&settings.ns, &settings.service)?;
            Ok(match view.assignment() {
                Some((_, n)) if n != old => Ok((n, fault_at.elapsed())),
                _ => Err(view.summary()),
            })
        },
    );
    match moved {
        Ok(m) => Ok(Some(m)),
        Err(Error::Timeout { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Waits until node `old` no longer has `ip` (a killed or frozen agent's alias lives until
/// its lifetime runs out), until `until` at most.
fn wait_gone(ip: Ipv4Addr, old: u8, until: Instant) -> Result<(), Error> {
    let gone = wait_for(
        &format!("{ip} to leave {}", node_name(old)),
        until.saturating_duration_since(Instant::now()),
        || {
            let held = aliases(old)?;
            Ok(if held.contains(&ip) {
                Err(format!("{held:?}"))
            } else {
                Ok(())
            })
        },
    );
    match gone {
        Ok(()) | Err(Error::Timeout { .. }) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Ends a timed fault.
fn undo_timed(lab: &Lab, fault: Fault, n: u8) -> Result<(), Error> {
    match fault {
        Fault::ApiPause => lab.resume_apiserver(),
        Fault::ControllerPartition => lab.heal_controller("controller-1"),
        Fault::AdvertsBlocked => lab.unblock_adverts(n),
        Fault::LanPartition | Fault::StandbyPartition => lab.heal_lan(),
        _ => Ok(()),
    }
}

/// Takes node `n`'s link down and up `flaps` times, `period` each.
pub fn flap(lab: &Lab, n: u8, flaps: u32, period: Duration) -> Result<(), Error> {
    for i in 0..flaps {
        lab.unplug(n)?;
        std::thread::sleep(period);
        lab.plug(n)?;
        if i + 1 < flaps {
            std::thread::sleep(period);
        }
    }
    Ok(())
}

fn inject(
    lab: &Lab,
    fault: Fault,
    ip: Ipv4Addr,
    n: u8,
    standby: Option<u8>,
    settings: &TrialSettings,
) -> Result<(), Error> {
    let agent = format!("agent-{n}");
    match fault {
        Fault::ApiPartition => lab.partition_api(n),
        Fault::ApiPause => lab.pause_apiserver(),
        Fault::ControllerPartition => lab.partition_controller("controller-1"),
        Fault::AdvertsBlocked => lab.block_adverts(n),
        Fault::LanPartition => lab.partition_lan(n),
        Fault::StandbyPartition => match standby {
            Some(s) => lab.partition_lan_from(n, &[s]),
            None => Err(Error::Environment(format!(
                "standby-partition: no standby named for {ip} on {}",
                node_name(n)
            ))),
        },
        Fault::ForeignHost => lab.add_rogue(ip).map(drop),
        Fault::AgentKill => lab.kill(&agent),
        Fault::LinkDown => lab.unplug(n),
        Fault::HardLoss | Fault::HardLossApiPaused => {
            // The agent first: alive, it would see its link go down and report it within
            // milliseconds (the controller then moves the IP at once, as for `link`),
            // which a node that lost its power cannot do.
            signal(lab, &agent, "KILL")?;
            lab.unplug(n)?;
            wait_dead(lab, &agent)
        }
        Fault::LinkFlap => flap(lab, n, settings.flaps, settings.flap_period),
        Fault::AgentFreeze => signal(lab, &agent, "STOP"),
        Fault::AgentTerm => lab.stop(&agent),
        Fault::Cordon => set_cordoned(lab, n, true),
        Fault::ExcludeLabel => set_excluded(lab, n, true),
    }
}

/// Undoes `fault` on node `n`. Returns the agent's Lease renewal time before, when the
/// caller has to wait for the agent to renew it again ([`wait_renewed`]).
fn restore(
    lab: &Lab,
    launcher: &Launcher,
    fault: Fault,
    n: u8,
) -> Result<Option<Option<String>>, Error> {
    let agent = format!("agent-{n}");
    match fault {
        Fault::ApiPause => {
            wait_for("the apiserver to answer", SETTLE_TIMEOUT, || {
                Ok(match lab.kubectl(&["get", "--raw", "/readyz"]) {
                    Ok(out) if out.trim() == "ok" => Ok(()),
                    Ok(out) => Err(out),
                    Err(e) => Err(e.to_string()),
                })
            })?;
            return Ok(None);
        }
        Fault::ControllerPartition => {
            lab.wait_leader("controller-1", SETTLE_TIMEOUT)?;
            return Ok(None);
        }
        Fault::ForeignHost => {
            lab.remove_rogue()?;
            return Ok(None);
        }
        Fault::Cordon => {
            set_cordoned(lab, n, false)?;
            return Ok(None);
        }
        Fault::ExcludeLabel => {
            set_excluded(lab, n, false)?;
            return Ok(None);
        }
        _ => {}
    }
    let stale = agent_lease(lab, n)?.map(|l| l.renew_time);
    match fault {
        Fault::AgentKill | Fault::AgentTerm => launcher.start_agent(lab, n)?,
        Fault::HardLoss | Fault::HardLossApiPaused => {
            lab.plug(n)?;
            launcher.start_agent(lab, n)?;
        }
        Fault::AgentFreeze => {
            if !stopped(lab, &agent)? {
                return Err(Error::Environment(format!(
                    "{agent} was not stopped when the trial ended"
                )));
            }
            signal(lab, &agent, "CONT")?;
        }
        Fault::LinkDown | Fault::LinkFlap => lab.plug(n)?,
        Fault::ApiPartition => lab.heal_api(n)?,
        Fault::AdvertsBlocked => lab.unblock_adverts(n)?,
        Fault::LanPartition | Fault::StandbyPartition => lab.heal_lan()?,
        Fault::ApiPause
        | Fault::ControllerPartition
        | Fault::ForeignHost
        | Fault::Cordon
        | Fault::ExcludeLabel => {}
    }
    Ok(Some(stale))
}

/// Waits until node `n`'s agent renews its Lease (renewal time other than `stale`) with
/// eth0 in its report: it is back.
fn wait_renewed(lab: &Lab, n: u8, stale: Option<String>) -> Result<(), Error> {
    wait_for(
        &format!("agent-{n} to renew its Lease again"),
        SETTLE_TIMEOUT,
        || {
            Ok(match agent_lease(lab, n)? {
                Some(l) if Some(&l.renew_time) != stale.as_ref() && l.reports_interface("eth0") => {
                    Ok(())
                }
                other => Err(format!("{other:?}")),
            })
        },
    )
}

/// Where things stood when a trial went wrong: the Service, every node's aliases, the old
/// holder's report, and the last lines of the old holder's and the standby's agent logs.
fn evidence(
    lab: &Lab,
    settings: &TrialSettings,
    ip: Ipv4Addr,
    old: u8,
    standby: Option<&Peer>,
) -> Result<String, Error> {
    let service = lab.service(&settings.ns, &settings.service)?.summary();
    let mut on = BTreeMap::new();
    for n in NODES {
        on.insert(node_name(n), aliases(n)?.contains(&ip));
    }
    let report = agent_lease(lab, old)?.map(|l| l.report);
    let mut logs = format!(
        "\n---- agent-{old} (old holder) ----\n{}",
        lab.log_tail(&format!("agent-{old}"), 12)
    );
    if let Some(s) = standby.and_then(Peer::number) {
        logs.push_str(&format!(
            "\n---- agent-{s} (standby) ----\n{}",
            lab.log_tail(&format!("agent-{s}"), 12)
        ));
    }
    logs.push_str(&format!(
        "\n---- controller-1 ----\n{}",
        lab.log_tail("controller-1", 15)
    ));
    Ok(format!(
        "Service: {service}; {ip} on eth0: {on:?}; {}'s agent report: {}{logs}",
        node_name(old),
        report.as_deref().unwrap_or("no Lease")
    ))
}

/// `/proc/loadavg`'s first three fields, e.g. `6.24 6.54 6.02`.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::time::Instant;

    use super::*;
    use crate::sampler::Sample;

    const IP: Ipv4Addr = Ipv4Addr::new(192, 168, 55, 20);

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    /// Samples 50 ms apart; `holders[i]` are the nodes holding [`IP`] in sample `i`.
    fn samples(t0: Instant, holders: &[&[u8]]) -> Samples {
        Samples(
            holders
                .iter()
                .enumerate()
                .map(|(i, nodes)| Sample {
                    at: t0 + ms(50 * i as u64),
                    held: nodes
                        .iter()
                        .map(|&n| (n, BTreeSet::from([IP])))
                        .collect::<BTreeMap<_, _>>(),
                })
                .collect(),
        )
    }

    #[test]
    fn nearest_rank_percentiles_of_twenty_values() {
        let values: Vec<Duration> = (1..=20).rev().map(|v| ms(v * 10)).collect();
        let s = Summary::of(&values).unwrap();
        assert_eq!(s.n, 20);
        assert_eq!(s.p50, ms(100), "10th of 20 sorted values");
        assert_eq!(s.p99, ms(200), "with 20 values p99 is the largest");
        assert_eq!(s.max, ms(200));
    }

    #[test]
    fn percentiles_of_one_value_and_of_none() {
        let s = Summary::of(&[ms(7)]).unwrap();
        assert_eq!((s.p50, s.p99, s.max), (ms(7), ms(7), ms(7)));
        assert_eq!(Summary::of(&[]), None);
    }

    #[test]
    fn p99_of_two_hundred_values_is_not_the_max() {
        let values: Vec<Duration> = (1..=200).map(ms).collect();
        let s = Summary::of(&values).unwrap();
        assert_eq!((s.p50, s.p99, s.max), (ms(100), ms(198), ms(200)));
    }

    #[test]
    fn overlap_counts_double_samples_and_bounds_the_longest_run() {
        let t0 = Instant::now();
        let s = samples(t0, &[&[1], &[1, 2], &[1, 2], &[1, 2], &[2], &[2, 3], &[3]]);
        let o = Overlap::of(&s, IP);
        assert_eq!(o.samples, 4);
        // First run: from sample 0 (clean) to sample 4 (clean).
        assert_eq!(o.longest, ms(200));
    }

    #[test]
    fn no_overlap_when_the_ip_is_never_on_two_nodes() {
        let s = samples(Instant::now(), &[&[1], &[], &[2], &[2]]);
        assert_eq!(Overlap::of(&s, IP), Overlap::default());
    }

    #[test]
    fn overlap_at_the_end_of_the_series_counts_one_period_beyond() {
        let s = samples(Instant::now(), &[&[1], &[1, 2]]);
        assert_eq!(
            Overlap::of(&s, IP),
            Overlap {
                samples: 1,
                longest: ms(100)
            }
        );
    }

    #[test]
    fn overlaps_merge_into_total_samples_and_longest_run() {
        let a = Overlap {
            samples: 3,
            longest: ms(150),
        };
        let b = Overlap {
            samples: 1,
            longest: ms(400),
        };
        assert_eq!(
            a.merge(b),
            Overlap {
                samples: 4,
                longest: ms(400)
            }
        );
    }

    #[test]
    fn fault_keys_round_trip_and_unknown_keys_are_named() {
        for f in Fault::ALL {
            assert_eq!(Fault::from_key(f.key()), Ok(f));
        }
        let e = Fault::from_key("reboot").unwrap_err();
        assert!(e.contains("\"reboot\"") && e.contains("kill, link"), "{e}");
    }

    #[test]
    fn the_yield_runs_from_the_new_macs_arrival_to_the_old_ones_last_answer() {
        use crate::lan::{Announcement, LanSample};
        let t0 = Instant::now();
        let (old, new) = (Mac([2, 0, 0, 0, 0, 1]), Mac([2, 0, 0, 0, 0, 2]));
        let rounds = |holders: &[&[Mac]]| -> Vec<LanSample> {
            holders
                .iter()
                .enumerate()
                .map(|(i, macs)| LanSample {
                    at: t0 + ms(20 * i as u64),
                    answers: [(IP, macs.iter().copied().collect())].into(),
                })
                .collect()
        };
        // `new` announces at 30 ms; `old` answers last at 80 ms; the round after is 100 ms.
        let record = LanRecord {
            samples: rounds(&[
                &[old],
                &[old],
                &[old, new],
                &[old, new],
                &[old, new],
                &[new],
                &[new],
            ]),
            announcements: vec![Announcement {
                at: t0 + ms(30),
                ip: IP,
                mac: new,
            }],
            requests: Vec::new(),
        };
        assert_eq!(lan_yield(&record, IP, old), Some(ms(70)));
        // Never yielded.
        let stuck = LanRecord {
            samples: rounds(&[&[old], &[old, new], &[old, new]]),
            announcements: Vec::new(),
            requests: Vec::new(),
        };
        assert_eq!(lan_yield(&stuck, IP, old), None);
        // Nobody else showed.
        let alone = LanRecord {
            samples: rounds(&[&[old], &[old], &[]]),
            announcements: Vec::new(),
            requests: Vec::new(),
        };
        assert_eq!(lan_yield(&alone, IP, old), None);
    }

    #[test]
    fn only_the_api_controller_and_advert_faults_flapping_and_the_foreign_host_keep_the_ip() {
        let still: Vec<&str> = Fault::ALL
            .into_iter()
            .filter(|f| !f.moves())
            .map(|f| f.key())
            .collect();
        assert_eq!(
            still,
            [
                "flap",
                "api-pause",
                "controller-partition",
                "adverts-blocked",
                "lan-partition",
                "standby-partition",
                "foreign"
            ]
        );
        let stays: Vec<&str> = Fault::ALL
            .into_iter()
            .filter(|f| f.stays())
            .map(|f| f.key())
            .collect();
        assert_eq!(
            stays,
            [
                "api-pause",
                "controller-partition",
                "adverts-blocked",
                "standby-partition"
            ],
            "a flapping link or a LAN partition may move the IP, a foreign host takes it"
        );
        assert_eq!(Fault::ForeignHost.target(Duration::from_secs(4)), ms(100));
    }

    #[test]
    fn targets_follow_the_issues() {
        let lease = Duration::from_secs(4);
        assert_eq!(Fault::Cordon.target(lease), ms(500));
        // Issue 24: a cut link is answered through the standby within 1 s (p99), 0.5 s (p50).
        for f in [Fault::HardLoss, Fault::HardLossApiPaused, Fault::LinkDown] {
            assert_eq!(f.target(lease), ms(1000), "{f:?}");
        }
        assert_eq!(Fault::HardLoss.p50_target(), Some(ms(500)));
        assert_eq!(Fault::LinkDown.p50_target(), None);
        // A holder whose kernel still answers ARP: its alias's lifetime (the agent's: 3 s, or
        // the lease less a quarter in whole seconds if shorter), then the standby's re-check.
        assert_eq!(Fault::AgentFreeze.target(lease), ms(3500));
        assert_eq!(Fault::AgentKill.target(Duration::from_secs(2)), ms(1500));
        assert_eq!(Fault::AgentKill.target(Duration::from_secs(30)), ms(3500));
        // The controller moves the IP off an API-partitioned holder.
        assert_eq!(Fault::ApiPartition.target(lease), ms(5000));
        assert_eq!(TWO_MAC_BOUND, ms(120));
    }

    /// LAN rounds 20 ms apart; `answers[i]` answered for [`IP`] in round `i`.
    fn lan(t0: Instant, answers: &[&[Mac]]) -> LanRecord {
        use crate::lan::LanSample;
        LanRecord {
            samples: answers
                .iter()
                .enumerate()
                .map(|(i, macs)| LanSample {
                    at: t0 + ms(20 * i as u64),
                    answers: [(IP, macs.iter().copied().collect())].into(),
                })
                .collect(),
            announcements: Vec::new(),
            requests: Vec::new(),
        }
    }

    const OLD: Mac = Mac([2, 0, 0, 0, 0, 1]);
    const NEW: Mac = Mac([2, 0, 0, 0, 0, 2]);

    #[test]
    fn the_takeover_is_the_first_round_since_the_fault_with_another_mac() {
        let t0 = Instant::now();
        let r = lan(t0, &[&[NEW], &[OLD], &[], &[], &[NEW], &[NEW]]);
        // The fault at 10 ms: the answer of round 0 was before it.
        assert_eq!(lan_takeover(&r, IP, OLD, t0 + ms(10)), Some((NEW, ms(70))));
        assert_eq!(lan_takeover(&r, IP, NEW, t0), Some((OLD, ms(20))));
        let none = lan(t0, &[&[OLD], &[], &[OLD]]);
        assert_eq!(lan_takeover(&none, IP, OLD, t0), None);
    }

    #[test]
    fn the_first_announcement_by_another_mac_is_timed_from_the_fault() {
        use crate::lan::Announcement;
        let t0 = Instant::now();
        let mut r = lan(t0, &[&[OLD]]);
        r.announcements = vec![
            Announcement {
                at: t0 + ms(5),
                ip: IP,
                mac: NEW,
            },
            Announcement {
                at: t0 + ms(300),
                ip: IP,
                mac: OLD,
            },
            Announcement {
                at: t0 + ms(350),
                ip: IP,
                mac: NEW,
            },
        ];
        assert_eq!(
            lan_announced(&r, IP, OLD, t0 + ms(10)),
            Some((NEW, ms(340)))
        );
    }

    #[test]
    fn two_mac_runs_are_counted_and_the_longest_bounded_by_the_next_clean_round() {
        let t0 = Instant::now();
        let both: &[Mac] = &[OLD, NEW];
        let r = lan(
            t0,
            &[
                &[OLD],
                both,
                both,
                &[NEW],
                both,
                both,
                both,
                both,
                &[],
                &[NEW],
            ],
        );
        let two = TwoMacs::of(&r, IP);
        assert_eq!(two.rounds, 6);
        // Rounds 4..=7, then round 8 (nobody): from 80 ms to 160 ms.
        assert_eq!(two.longest, ms(80));
        assert_eq!(two.longest_at, Some(t0 + ms(80)));
        // A run at the end: one period past its last round.
        let end = lan(t0, &[&[OLD], both]);
        assert_eq!(TwoMacs::of(&end, IP).longest, ms(20));
        assert_eq!(
            TwoMacs::of(&lan(t0, &[&[OLD], &[NEW]]), IP),
            TwoMacs::default()
        );
        let merged = TwoMacs::of(&end, IP).merge(two);
        assert_eq!((merged.rounds, merged.longest), (7, ms(80)));
    }

    #[test]
    fn the_standby_is_read_from_the_holders_peer_flag() {
        let lines = "192.168.55.30 - tcp:80 e2e/bench peer=alb-node-2@192.168.55.102\n\
                     192.168.55.31 eth0 - e2e/other probe standby=alb-node-3\n";
        let flags = line_flags(lines, IpAddr::V4(IP_30)).unwrap();
        assert_eq!(
            peer_flag(&flags),
            Some(Peer {
                node: "alb-node-2".to_owned(),
                address: "192.168.55.102".parse().unwrap(),
            })
        );
        assert!(peer_flag(&flags).unwrap().address_is_the_nodes());
        assert_eq!(relay_flag(&flags), None);
        let relayed = [
            "peer=alb-node-2@192.168.55.0",
            "relay=alb-node-3@192.168.55.103",
        ];
        assert!(!peer_flag(&relayed).unwrap().address_is_the_nodes());
        assert_eq!(
            relay_flag(&relayed).map(|r| r.to_string()).as_deref(),
            Some("alb-node-3@192.168.55.103")
        );
        assert_eq!(peer_flag(&flags).unwrap().number(), Some(2));
        let other = line_flags(lines, "192.168.55.31".parse().unwrap()).unwrap();
        assert_eq!(other, ["probe", "standby=alb-node-3"]);
        assert_eq!(peer_flag(&other), None);
        assert_eq!(standby_flag(&other), Some("alb-node-3"));
        assert_eq!(line_flags(lines, "192.168.55.32".parse().unwrap()), None);
        // An IPv6 standby address.
        assert_eq!(
            peer_flag(&["peer=n-2@fd55::102"]).map(|s| s.address),
            Some("fd55::102".parse().unwrap())
        );
    }

    #[test]
    fn failover_counters_are_read_from_the_agents_metrics() {
        let text = "# HELP aliaslb_agent_adverts_received_total Fast L2 failover\n\
                    aliaslb_agent_adverts_received_total{result=\"accepted\"} 120\n\
                    aliaslb_agent_adverts_received_total{result=\"replayed\"} 3\n\
                    aliaslb_agent_failovers_total{result=\"taken_over\"} 1\n\
                    aliaslb_agent_failovers_total{result=\"still_answered\"} 7\n\
                    aliaslb_agent_adverts_sent_total 40\n";
        let c = FailoverCounters::parse(text);
        assert_eq!(
            c,
            FailoverCounters {
                accepted: 120,
                taken_over: 1,
                still_answered: 7,
                given_back: 0
            }
        );
        let later = FailoverCounters {
            accepted: 130,
            given_back: 1,
            ..c
        };
        assert_eq!(
            later.since(c),
            FailoverCounters {
                accepted: 10,
                given_back: 1,
                ..FailoverCounters::default()
            }
        );
    }

    #[test]
    fn an_announcement_by_a_mac_that_does_not_answer_is_stray() {
        use crate::lan::Announcement;
        let t0 = Instant::now();
        let mut r = lan(
            t0,
            &[
                &[OLD],
                &[OLD],
                &[NEW],
                &[NEW],
                &[NEW],
                &[NEW],
                &[NEW],
                &[NEW],
                &[NEW],
                &[NEW],
                &[NEW],
                &[NEW],
                &[NEW],
                &[NEW],
                &[NEW],
                &[NEW],
            ],
        );
        let at = |ms_: u64, mac| Announcement {
            at: t0 + ms(ms_),
            ip: IP,
            mac,
        };
        // NEW announcing as it arrives, OLD announcing after it stopped answering, and an
        // announcement too close to the end of the record to judge.
        r.announcements = vec![at(35, NEW), at(100, OLD), at(290, OLD)];
        assert_eq!(stray_announcements(&r, IP, ms(200)), [(t0 + ms(100), OLD)]);
    }

    const IP_30: Ipv4Addr = Ipv4Addr::new(192, 168, 55, 30);

    fn trial(fault: Fault) -> Trial {
        Trial {
            fault,
            ip: IP_30,
            from: 1,
            standby: Some(Peer {
                node: "alb-node-2".to_owned(),
                address: "192.168.55.102".parse().unwrap(),
            }),
            relay: None,
            adverts_per_s: Some(10.0),
            standby_counters: None,
            standby_line: Some(true),
            injection: ms(5),
            recovered: None,
            lan: None,
            announced: None,
            stray_garps: Vec::new(),
            followed: None,
            restored: ms(4000),
            overlap: Overlap::default(),
            two_macs: TwoMacs::default(),
            two_macs_at: None,
            lan_doubles: 0,
            lan_stalls: 0,
            lan_yield: None,
            evidence: None,
        }
    }

    #[test]
    fn a_trial_names_what_goes_against_issue_24() {
        let lease = Duration::from_secs(4);
        let mut t = trial(Fault::HardLoss);
        t.lan = Some((NEW, Some(2), ms(400)));
        assert!(t.problems(lease).is_empty(), "{:?}", t.problems(lease));
        // Too late, and not the standby.
        t.lan = Some((NEW, Some(3), ms(1200)));
        let p = t.problems(lease);
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(p[0].contains("1200 ms, target 1000 ms"), "{p:?}");
        assert!(p[1].contains("peer= flag"), "{p:?}");
        // Nobody took it.
        t.lan = None;
        assert!(t.problems(lease)[0].contains("no other MAC"));
        // Nothing may move with the adverts blocked.
        let mut b = trial(Fault::AdvertsBlocked);
        assert!(b.problems(lease).is_empty());
        b.lan = Some((NEW, Some(2), ms(400)));
        assert!(b.problems(lease)[0].contains("nothing may move"));
        // Two MACs beyond one advert interval, whatever the fault.
        let mut f = trial(Fault::LinkFlap);
        f.two_macs = TwoMacs {
            rounds: 8,
            longest: ms(160),
            longest_at: None,
        };
        assert!(f.problems(lease)[0].contains("longest run 160 ms (bound 120 ms)"));
        f.two_macs.longest = ms(120);
        assert!(f.problems(lease).is_empty());
        // The standby must carry the IP's line, flagged standby=<holder>.
        f.standby_line = Some(false);
        assert!(f.problems(lease)[0].contains("flagged standby=alb-node-1"));
        // The adverts must go to the standby's own address.
        f.standby_line = Some(true);
        f.standby.as_mut().unwrap().address = "192.168.55.0".parse().unwrap();
        assert!(f.problems(lease)[0].contains("192.168.55.0, which is not alb-node-2's own"));
    }

    #[test]
    fn lease_report_is_read_for_interfaces_and_held_ips() {
        let lease = AgentLease {
            renew_time: String::new(),
            duration_seconds: Some(4),
            report: r#"{"version":1,"interfaces":[{"name":"eth0","subnets":["192.168.55.101/24"]}],"held":["192.168.55.20"]}"#.to_owned(),
        };
        assert!(lease.reports_interface("eth0"));
        assert!(!lease.reports_interface("eth1"));
        assert!(lease.reports_held(IP));
        assert!(!lease.reports_held(Ipv4Addr::new(192, 168, 55, 21)));
    }
}
