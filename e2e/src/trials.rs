//! Repeated failover trials over the lab (`examples/failover_trials.rs`): the faults a trial
//! injects and undoes, starting the binaries with a chosen agent lease duration, freezing
//! and thawing an agent, the agent Leases as the API shows them, and the statistics of a
//! series (nearest-rank percentiles, time an IP spent on two nodes). Injecting faults and
//! reading the lab does I/O (`kubectl`, `ip`, `kill`, `scripts/lab`); the statistics
//! ([`Summary`], [`Overlap`]) are pure.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::Error;
use crate::lab::{AGENT_NAMESPACE, Lab, node_name, run};
use crate::lan::{LanRecord, Mac};
use crate::sampler::{SAMPLE_PERIOD, Samples};

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
    /// SIGSTOP of the holder's agent (SIGCONT when the trial is over).
    AgentFreeze,
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
    /// A foreign host on the LAN takes the IP ([`Lab::add_rogue`]): the holder must yield
    /// within [`crate::lan::YIELD_BOUND`].
    ForeignHost,
}

impl Fault {
    /// Every fault, hard ones first.
    pub const ALL: [Fault; 10] = [
        Fault::AgentKill,
        Fault::LinkDown,
        Fault::AgentFreeze,
        Fault::AgentTerm,
        Fault::Cordon,
        Fault::ExcludeLabel,
        Fault::ApiPartition,
        Fault::ApiPause,
        Fault::ControllerPartition,
        Fault::ForeignHost,
    ];

    /// The short name used on the command line.
    pub fn key(self) -> &'static str {
        match self {
            Fault::AgentKill => "kill",
            Fault::LinkDown => "link",
            Fault::AgentFreeze => "freeze",
            Fault::AgentTerm => "term",
            Fault::Cordon => "cordon",
            Fault::ExcludeLabel => "exclude",
            Fault::ApiPartition => "partition",
            Fault::ApiPause => "api-pause",
            Fault::ControllerPartition => "controller-partition",
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
            Fault::AgentFreeze => "hard: agent frozen (SIGSTOP)",
            Fault::AgentTerm => "graceful: agent SIGTERM",
            Fault::Cordon => "graceful: `kubectl cordon`",
            Fault::ExcludeLabel => "graceful: exclude-from-external-load-balancers label",
            Fault::ApiPartition => "hard: API-only partition of the holder (LAN up)",
            Fault::ApiPause => "no move: kube-apiserver paused (SIGSTOP)",
            Fault::ControllerPartition => "no move: the controller's API path cut",
            Fault::ForeignHost => "conflict: a foreign host takes the IP (time to yield)",
        }
    }

    /// Whether the IP has to move to another node: false for the faults that must change
    /// nothing on the LAN (the API or the controller away) and for a foreign host (the
    /// holder yields; the Service moves to another address, not the IP to another node).
    pub fn moves(self) -> bool {
        !matches!(
            self,
            Fault::ApiPause | Fault::ControllerPartition | Fault::ForeignHost
        )
    }

    /// Whether the fault lasts a fixed time (`--pause-seconds`) and is undone by the trial
    /// before its verdict.
    pub fn timed(self) -> bool {
        matches!(self, Fault::ApiPause | Fault::ControllerPartition)
    }

    /// Whether the move is a planned one (break-before-make, no lease to wait for).
    pub fn graceful(self) -> bool {
        matches!(self, Fault::AgentTerm | Fault::Cordon | Fault::ExcludeLabel)
    }

    /// The target the issue sets for this fault under agent lease `lease`: 0.5 s for a
    /// graceful move, the lease duration + 1 s for a hard one.
    /// A foreign host: the yield bound.
    pub fn target(self, lease: Duration) -> Duration {
        if self == Fault::ForeignHost {
            crate::lan::YIELD_BOUND
        } else if self.graceful() {
            Duration::from_millis(500)
        } else {
            lease + Duration::from_secs(1)
        }
    }
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
        };
        assert_eq!(lan_yield(&record, IP, old), Some(ms(70)));
        // Never yielded.
        let stuck = LanRecord {
            samples: rounds(&[&[old], &[old, new], &[old, new]]),
            announcements: Vec::new(),
        };
        assert_eq!(lan_yield(&stuck, IP, old), None);
        // Nobody else showed.
        let alone = LanRecord {
            samples: rounds(&[&[old], &[old], &[]]),
            announcements: Vec::new(),
        };
        assert_eq!(lan_yield(&alone, IP, old), None);
    }

    #[test]
    fn only_the_api_and_controller_faults_and_the_foreign_host_keep_the_ip_in_place() {
        let still: Vec<&str> = Fault::ALL
            .into_iter()
            .filter(|f| !f.moves())
            .map(|f| f.key())
            .collect();
        assert_eq!(still, ["api-pause", "controller-partition", "foreign"]);
        assert_eq!(Fault::ForeignHost.target(Duration::from_secs(4)), ms(100));
    }

    #[test]
    fn targets_follow_the_issue() {
        let lease = Duration::from_secs(2);
        assert_eq!(Fault::Cordon.target(lease), ms(500));
        assert_eq!(Fault::AgentKill.target(lease), ms(3000));
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
