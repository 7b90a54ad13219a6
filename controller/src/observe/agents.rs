//! Agent Leases -> how fresh each agent is and what it reports, and the agent freshness
//! clock. Pure: no I/O; time comes in as [`Instant`]s on the controller's own monotonic
//! clock.
//!
//! **API blindness is not node loss.** An agent Lease that stops changing means either
//! that its node is gone or that the controller cannot see the change (kube-apiserver
//! paused or overloaded, the controller's watch cut). One Lease going stale while others
//! renew is a node loss. Every Lease going stale at once is, far more likely, the
//! controller going blind: the rule is kube-controller-manager's node-lifecycle "full
//! disruption". [`Observer`] turns the per-Lease freshness of the [`AgentClock`] into the
//! [`Freshness`] of each agent and the [`Sight`] of the controller:
//!
//! 1. **Blind** when at least one agent Lease names a holder and none of them was seen
//!    renewed within its lease duration. Every held agent is then [`Freshness::Unconfirmed`]:
//!    the controller keeps every node assignment as it is (no move, no node taken from a
//!    Service because of staleness) and elects no node for a Service without one (it
//!    stays pending with the reason `AgentsUnobservable`). The edge is said once: log,
//!    Warning Event `AgentsUnobservable` on the leader Lease, gauge
//!    `aliaslb_agents_unobservable` 1.
//! 2. **Normal** otherwise. An agent seen renewed within its lease duration is
//!    [`Freshness::Fresh`]. One that was not is [`Freshness::Lost`] once the controller has
//!    both *watched* it for a whole lease duration, counted from its last renewal seen or
//!    from when the controller started to see (the leadership term's start, or the end of
//!    the last blindness: agents renew at their own pace, so the first renewal seen after
//!    a pause says nothing of the others), and *seen* meanwhile: some agent Lease changed
//!    at least half a lease duration after that start. Agents renew at least three times
//!    per lease, so had the controller been seeing, a live agent's own renewal would have
//!    come before that change. Until both hold the agent is [`Freshness::Unconfirmed`]:
//!    when every renewal stops at once (an API pause), the Leases still expire one after
//!    the other over a renew interval, and the first to expire is not a node loss. An
//!    agent whose Lease names no holder (graceful shutdown) is lost at once.
//!
//! **Absence is not evidence.** A held Lease that is deleted is taken as an agent that
//! stopped renewing, not as a dead one: agents may write each other's Leases on servers
//! without the optional admission policy, so a compromised node could otherwise move every
//! IP at once, with no break-before-make. The clock keeps the Lease as last seen (its
//! renewal, duration and report) and the rules above judge it: fresh until its lease
//! duration has passed, then lost only while the controller sees other agents renew. A live
//! agent writes its Lease again at its next renewal, and nothing moved.
//!
//! An unconfirmed agent's node keeps what it carries but is not elected for new IPs. A
//! lost agent's node is a hard loss: its IPs move at once. So the loss of some nodes
//! still fails over within one lease duration of their last renewal (the other agents'
//! renewals are the proof of sight), while a controller that cannot see any agent changes
//! nothing until it sees them again. The price: a cluster whose every node really died
//! keeps its assignments (no node could take them anyway), and a node lost just before
//! a leadership change or the end of a blindness is replaced one lease duration later.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use aliaslb_core::keys;
use aliaslb_core::report::{AgentReport, ReportError};

use crate::store::Record;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ObjectReference;

use crate::observe::service::digest;

/// The agent's report on its Lease, read within the bounds of [`AgentReport::from_json`]
/// (an agent's node may be compromised); an absent annotation is an empty report.
pub fn agent_report(lease: &Lease) -> Result<AgentReport, ReportError> {
    match lease_annotation(lease) {
        Some(json) => AgentReport::from_json(json),
        None => Ok(AgentReport::default()),
    }
}

/// The release the agent reports on its Lease (the label
/// [`keys::LABEL_AGENT_VERSION`]); `None` for an agent older than version reporting.
pub fn agent_version(lease: &Lease) -> Option<&str> {
    lease
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(keys::LABEL_AGENT_VERSION))
        .map(String::as_str)
}

/// A 64-bit digest of the report annotation of an agent Lease (absent and present differ):
/// a renewal that leaves the report as it was keeps it, so the report is not read again.
pub fn report_digest(lease: &Lease) -> u64 {
    digest(&lease_annotation(lease))
}

/// The report annotation of an agent Lease, as written.
fn lease_annotation(lease: &Lease) -> Option<&str> {
    lease
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(keys::ANNOTATION_AGENT_REPORT))
        .map(String::as_str)
}

/// One Lease of the agent namespace as the controller keeps it: never the object itself
/// (a report is up to 256 KiB of JSON), only what the controller reads of it.
///
/// **Only nodes are agents.** A Lease `aliaslb-agent-<x>` whose Node `<x>` does not exist
/// is a [`LeaseKind::Ghost`]: its name, nothing of its report (it is not even parsed), and
/// the agent clock does not see it either, so it counts neither for election, nor for the
/// quarantine, nor for the node MACs, nor for the controller's sight. A Lease seen before
/// its Node exists is taken up at its next renewal.
#[derive(Debug, Clone, PartialEq)]
pub struct LeaseRecord {
    /// The Lease's name.
    pub name: String,
    /// Its namespace.
    pub namespace: String,
    /// Its uid (for the Events about it).
    pub uid: Option<String>,
    /// What it is.
    pub kind: LeaseKind,
}

/// What a Lease of the agent namespace is ([`LeaseRecord`]).
#[derive(Debug, Clone, PartialEq)]
pub enum LeaseKind {
    /// The agent Lease of an existing Node: its report read within bounds (shared with
    /// every pass that reads it), or why it cannot be read.
    Agent {
        /// The node.
        node: String,
        /// The report ([`agent_report`]), or the reason it was rejected.
        report: Result<Arc<AgentReport>, Arc<RejectedReport>>,
        /// The digest of the report annotation ([`report_digest`]): a renewal that leaves
        /// it as it was is not read again.
        digest: u64,
        /// The release its agent labels it with ([`agent_version`]), if any.
        version: Option<String>,
    },
    /// An agent Lease whose Node does not exist: its name only.
    Ghost {
        /// The node it names.
        node: String,
    },
    /// Not an agent's (the controller's own leader Lease, when both share a namespace).
    Other,
}

/// A report that could not be read: the error's category and message (the error itself is
/// not kept: a JSON error may hold a copy of what it quotes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RejectedReport {
    /// [`ReportError::category`].
    pub category: &'static str,
    /// The error, as text.
    pub message: String,
}

impl LeaseRecord {
    /// The record of `lease`; `node_exists` says whether a Node of a name exists, and
    /// `previous` is the record of the same Lease so far (its report is shared when the
    /// annotation did not change). A Lease without a name is none.
    pub fn of(
        lease: &Lease,
        node_exists: impl Fn(&str) -> bool,
        previous: Option<&LeaseRecord>,
    ) -> Option<LeaseRecord> {
        let name = lease.metadata.name.clone()?;
        let kind = match keys::agent_lease_node(&name) {
            None => LeaseKind::Other,
            Some(node) if !node_exists(node) => LeaseKind::Ghost {
                node: node.to_owned(),
            },
            Some(node) => {
                let digest = report_digest(lease);
                let report = match previous.map(|p| &p.kind) {
                    Some(LeaseKind::Agent {
                        report, digest: d, ..
                    }) if *d == digest => report.clone(),
                    _ => agent_report(lease).map(Arc::new).map_err(|e| {
                        Arc::new(RejectedReport {
                            category: e.category(),
                            message: e.to_string(),
                        })
                    }),
                };
                LeaseKind::Agent {
                    node: node.to_owned(),
                    report,
                    digest,
                    version: agent_version(lease).map(str::to_owned),
                }
            }
        };
        Some(LeaseRecord {
            name,
            namespace: lease.metadata.namespace.clone().unwrap_or_default(),
            uid: lease.metadata.uid.clone(),
            kind,
        })
    }

    /// This record with its report dropped: its Node was deleted.
    pub fn ghost(&self) -> Option<LeaseRecord> {
        match &self.kind {
            LeaseKind::Agent { node, .. } => Some(LeaseRecord {
                kind: LeaseKind::Ghost { node: node.clone() },
                ..self.clone()
            }),
            LeaseKind::Ghost { .. } | LeaseKind::Other => None,
        }
    }

    /// A reference to the Lease, for an Event about it.
    pub fn object_ref(&self) -> ObjectReference {
        ObjectReference {
            api_version: Some("coordination.k8s.io/v1".into()),
            kind: Some("Lease".into()),
            namespace: Some(self.namespace.clone()),
            name: Some(self.name.clone()),
            uid: self.uid.clone(),
            ..ObjectReference::default()
        }
    }
}

impl Record for LeaseRecord {
    fn same(&self, old: &Self) -> bool {
        self == old
    }
}

/// What the planner takes from an agent's Lease: its node, how fresh the agent is (from
/// the [`Observer`]) and its report.
pub type AgentView<'r> = (
    &'r str,
    (Freshness, Arc<AgentReport>),
    Option<&'r RejectedReport>,
);

impl LeaseRecord {
    /// For an existing Node's agent Lease ([`LeaseKind::Agent`]): what the planner takes of
    /// it ([`AgentView`]), given the agent's freshness `fresh`. A report that cannot be read
    /// counts for nothing: the agent is lost (its node is not eligible) and holds nothing;
    /// why comes back beside, for the caller to warn about. `None` for other Leases.
    /// The release an existing Node's agent labels its Lease with, if any.
    pub fn agent_version(&self) -> Option<&str> {
        match &self.kind {
            LeaseKind::Agent { version, .. } => version.as_deref(),
            LeaseKind::Ghost { .. } | LeaseKind::Other => None,
        }
    }

    pub fn agent_view(&self, fresh: Freshness) -> Option<AgentView<'_>> {
        let LeaseKind::Agent { node, report, .. } = &self.kind else {
            return None;
        };
        Some(match report {
            Ok(report) => (node, (fresh, report.clone()), None),
            Err(error) => (node, (Freshness::Lost, Arc::default()), Some(&**error)),
        })
    }
}

/// Whether the Lease has a holder (an agent shutting down clears it).
fn is_held(lease: &Lease) -> bool {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
        .is_some_and(|h| !h.is_empty())
}

/// One agent Lease as last seen.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Seen {
    /// What identifies a renewal: resourceVersion and renewTime.
    version: (Option<String>, Option<String>),
    /// When this version was first seen (controller clock).
    at: Instant,
    /// The Lease's `leaseDurationSeconds`, else the flag.
    duration: Duration,
    /// Whether it names a holder.
    held: bool,
    /// Digest of its report annotation (absent: `None`).
    report: u64,
    /// The Lease was deleted since (a held one is kept until judged lost: see the module
    /// docs).
    gone: bool,
    /// The [`AgentClock::relist`] generation it was last seen in.
    listed: u64,
}

/// Freshness of agent Leases on the controller's own monotonic clock.
///
/// A Lease is fresh when its resourceVersion or renewTime changed within its lease
/// duration, as seen locally; wall-clock times in the Lease are never compared with ours.
/// A Lease without holder is never fresh (graceful agent shutdown).
#[derive(Debug, Clone)]
pub struct AgentClock {
    default_duration: Duration,
    seen: HashMap<String, Seen>,
    /// Bumped when the watch lists every Lease anew ([`AgentClock::relist`]).
    generation: u64,
}

impl AgentClock {
    /// A clock using `default_duration` for Leases without `leaseDurationSeconds`.
    pub fn new(default_duration: Duration) -> Self {
        AgentClock {
            default_duration,
            seen: HashMap::new(),
            generation: 0,
        }
    }

    /// Records `lease` as seen at `now`; the timestamp only moves when the Lease changed.
    ///
    /// Returns whether a planning pass could decide anything new from it: `false` for a
    /// Lease that is not an agent's, and for a renewal that changes nothing a pass reads
    /// (one of a Lease that was fresh until now with the same holder state, duration and
    /// report, while every held Lease is fresh: no agent waits for a renewal of another to
    /// be judged lost, see [`Observer::judge`]). The loop still wakes when a Lease would go
    /// stale ([`AgentClock::next_expiry`]), and then sees the renewal.
    pub fn observe(&mut self, lease: &Lease, now: Instant) -> bool {
        let Some(name) = lease.metadata.name.as_deref() else {
            return true;
        };
        if keys::agent_lease_node(name).is_none() {
            // Not an agent's (the agent namespace may hold others, e.g. the controller's
            // own leader Lease when both share a namespace): no pass reads it.
            return false;
        }
        let spec = lease.spec.as_ref();
        let version = (
            lease.metadata.resource_version.clone(),
            spec.and_then(|s| s.renew_time.as_ref())
                .map(|t| t.0.to_string()),
        );
        let duration = spec
            .and_then(|s| s.lease_duration_seconds)
            .and_then(|s| u64::try_from(s).ok())
            .filter(|s| *s > 0)
            .map_or(self.default_duration, Duration::from_secs);
        let held = is_held(lease);
        let report = report_digest(lease);
        let all_fresh = self
            .seen
            .values()
            .all(|s| !s.held || now < s.at + s.duration);
        match self.seen.get_mut(name) {
            Some(seen) if seen.version == version => {
                let same = (seen.duration, seen.held, seen.report) == (duration, held, report)
                    && !seen.gone;
                seen.gone = false;
                seen.listed = self.generation;
                seen.duration = duration;
                seen.held = held;
                seen.report = report;
                !same
            }
            previous => {
                let idle_renewal = previous.is_some_and(|p| {
                    p.held
                        && now < p.at + p.duration
                        && (p.duration, p.held, p.report) == (duration, held, report)
                }) && all_fresh;
                self.seen.insert(
                    name.to_owned(),
                    Seen {
                        version,
                        at: now,
                        duration,
                        held,
                        report,
                        gone: false,
                        listed: self.generation,
                    },
                );
                !idle_renewal
            }
        }
    }

    /// Records that a Lease was deleted. A released one (no holder) is forgotten; a held
    /// one is kept as last seen, as an agent that stopped renewing, until
    /// [`AgentClock::forget_lost`] drops it (see the module docs: absence is not evidence).
    pub fn remove(&mut self, lease_name: &str) {
        match self.seen.get_mut(lease_name) {
            Some(seen) if seen.held => seen.gone = true,
            _ => {
                self.seen.remove(lease_name);
            }
        }
    }

    /// Forgets `lease_name` at once, whatever it was: a Lease that names a node that does not
    /// exist is no agent (see [`LeaseRecord`]). Returns whether it was known.
    pub fn forget(&mut self, lease_name: &str) -> bool {
        self.seen.remove(lease_name).is_some()
    }

    /// The watch starts listing every Lease anew (after a restart of the watch): the
    /// Leases not seen again by [`AgentClock::relisted`] were deleted meanwhile.
    pub fn relist(&mut self) {
        self.generation += 1;
    }

    /// The new list is complete: each Lease it did not hold is taken as deleted
    /// ([`AgentClock::remove`]), not forgotten.
    pub fn relisted(&mut self) {
        let missing: Vec<String> = self
            .seen
            .iter()
            .filter(|(_, s)| s.listed != self.generation && !s.gone)
            .map(|(name, _)| name.clone())
            .collect();
        for name in missing {
            self.remove(&name);
        }
    }

    /// The deleted Leases still kept (see [`AgentClock::remove`]), by name.
    pub fn gone(&self) -> impl Iterator<Item = &str> + '_ {
        self.seen
            .iter()
            .filter(|(_, s)| s.gone)
            .map(|(name, _)| name.as_str())
    }

    /// Forgets the deleted Leases `judgement` finds lost: from now on their agents are
    /// unknown, as if never seen. Returns their names.
    pub fn forget_lost(&mut self, judgement: &Judgement) -> Vec<String> {
        let lost: Vec<String> = self
            .gone()
            .filter(|name| judgement.agents.get(*name) == Some(&Freshness::Lost))
            .map(str::to_owned)
            .collect();
        for name in &lost {
            self.seen.remove(name);
        }
        lost
    }

    /// Whether the agent Lease `lease_name` is fresh at `now`.
    pub fn is_fresh(&self, lease_name: &str, now: Instant) -> bool {
        self.seen
            .get(lease_name)
            .is_some_and(|s| s.held && now < s.at + s.duration)
    }

    /// How long before `now` each held agent Lease was last seen renewed (a change of its
    /// resourceVersion or renewTime on this clock; a Lease not renewed since this
    /// controller started counts from when it first saw it), by node. Leases without a
    /// holder (an agent that shut down gracefully) are left out: they are not expected to
    /// renew.
    pub fn renewal_ages(&self, now: Instant) -> impl Iterator<Item = (&str, Duration)> + '_ {
        self.seen
            .iter()
            .filter(|(_, s)| s.held)
            .filter_map(move |(name, s)| {
                Some((
                    keys::agent_lease_node(name)?,
                    now.saturating_duration_since(s.at),
                ))
            })
    }

    /// The nodes whose agent Lease names no holder: their agent shut down in order (it
    /// releases its Lease on SIGTERM).
    pub fn released(&self) -> impl Iterator<Item = &str> + '_ {
        self.seen
            .iter()
            .filter(|(_, s)| !s.held)
            .filter_map(|(name, _)| keys::agent_lease_node(name))
    }

    /// The earliest moment after `now` at which a fresh Lease goes stale, if any: the
    /// loop wakes up then, so a hard node loss is acted upon without any event.
    pub fn next_expiry(&self, now: Instant) -> Option<Instant> {
        self.seen
            .values()
            .filter(|s| s.held)
            .map(|s| s.at + s.duration)
            .filter(|at| *at > now)
            .min()
    }
}

/// How many lease durations after its last renewal seen an agent may still announce its
/// routed addresses: its L3 cut-off withdraws them two lease durations after the renewal it
/// last sent (which is before the controller saw it), plus one for its next look (every
/// renewal interval) and for the routing daemons to carry the withdrawal to the routers.
pub const FENCE_LEASES: u32 = 3;

/// How the controller takes one agent (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Freshness {
    /// Seen renewed within its lease duration: its node is eligible.
    Fresh,
    /// Not seen renewed, but the controller cannot tell it is gone: blind, or watching for
    /// less than a lease duration. Its node keeps what it carries, is not elected anew.
    Unconfirmed,
    /// Gone: stale over a full lease duration of sight, released, or deleted.
    Lost,
    /// Lost for election (its node is not eligible, what it carried moves), but last seen
    /// renewing less than [`FENCE_LEASES`] lease durations ago: it may still announce the
    /// routed (L3) addresses it reported, which an agent cut off from the API withdraws
    /// only once its own Lease has been stale for a lease duration (`aliaslb-agent`'s L3
    /// cut-off). Those addresses stay in quarantine until then.
    Fading,
}

/// Whether the controller can see the agents at all (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sight {
    /// Some agent is seen renewing, or none names a holder.
    Normal,
    /// Agents name holders, and none was seen renewing within its lease duration.
    Blind,
}

/// What [`Observer::judge`] says at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Judgement {
    /// The controller's sight.
    pub sight: Sight,
    /// `Some(new sight)` when it changed with this judgement: said once, on the edge.
    pub edge: Option<Sight>,
    /// Each agent Lease the clock knows, by Lease name.
    pub agents: BTreeMap<String, Freshness>,
    /// When the judgement changes next without any event, if it does: a fresh Lease
    /// expiring, or an unconfirmed agent's grace ending.
    pub next_change: Option<Instant>,
}

/// The sight of one leadership term: when it started to see, and whether it is blind.
/// Pure: time comes in.
#[derive(Debug, Clone)]
pub struct Observer {
    /// Since when the controller has seen agents without interruption: the term's start,
    /// or the end of the last blindness.
    since: Instant,
    blind: bool,
}

impl Observer {
    /// The observer of a term starting at `start`.
    pub fn new(start: Instant) -> Self {
        Observer {
            since: start,
            blind: false,
        }
    }

    /// Judges every agent the clock knows at `now` (never earlier than the last call).
    pub fn judge(&mut self, clock: &AgentClock, now: Instant) -> Judgement {
        let fresh = |s: &Seen| s.held && now < s.at + s.duration;
        let any_held = clock.seen.values().any(|s| s.held);
        let blind = any_held && !clock.seen.values().any(fresh);
        let edge = (blind != self.blind).then(|| {
            if !blind {
                // Seeing again: every agent gets a lease duration to be seen.
                self.since = now;
            }
            self.blind = blind;
            if blind { Sight::Blind } else { Sight::Normal }
        });
        // The latest change of any agent Lease seen: the last moment the controller saw.
        let last_seen = clock.seen.values().map(|s| s.at).max();
        let since = self.since;
        let agents = clock
            .seen
            .iter()
            .map(|(name, s)| {
                let freshness = if fresh(s) {
                    Freshness::Fresh
                } else if !s.held {
                    Freshness::Lost
                } else if blind {
                    Freshness::Unconfirmed
                } else {
                    // Watched for a whole lease since it was last seen (or since the
                    // controller sees), and seeing meanwhile: another renewal came at
                    // least half a lease after its last one.
                    let from = s.at.max(since);
                    let watched = now >= from + s.duration;
                    let seeing = last_seen.is_some_and(|l| l >= from + s.duration / 2);
                    if watched && seeing {
                        if now < s.at + s.duration * FENCE_LEASES {
                            Freshness::Fading
                        } else {
                            Freshness::Lost
                        }
                    } else {
                        Freshness::Unconfirmed
                    }
                };
                (name.clone(), freshness)
            })
            .collect();
        let grace_ends = clock
            .seen
            .values()
            .filter(|s| s.held && !blind)
            .map(|s| s.at.max(since) + s.duration)
            .filter(|at| *at > now);
        let fades = clock
            .seen
            .values()
            .filter(|s| s.held && !blind)
            .map(|s| s.at + s.duration * FENCE_LEASES)
            .filter(|at| *at > now);
        let next_change = clock
            .next_expiry(now)
            .into_iter()
            .chain(grace_ends)
            .chain(fades)
            .min();
        Judgement {
            sight: if blind { Sight::Blind } else { Sight::Normal },
            edge,
            agents,
            next_change,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};

    fn lease(name: &str, rv: &str, holder: Option<&str>, secs: Option<i32>) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(name.into()),
                resource_version: Some(rv.into()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: holder.map(Into::into),
                lease_duration_seconds: secs,
                renew_time: None::<MicroTime>,
                ..LeaseSpec::default()
            }),
        }
    }

    #[test]
    fn renewal_ages_are_per_held_node_on_the_local_clock() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut clock = AgentClock::new(Duration::from_secs(4));
        clock.observe(&lease("aliaslb-agent-n1", "1", Some("n1"), None), t0);
        clock.observe(&lease("aliaslb-agent-n2", "1", Some("n2"), None), t0);
        clock.observe(&lease("aliaslb-agent-n3", "1", None, None), t0);
        clock.observe(&lease("other", "1", Some("x"), None), t0);
        // n1 renews at t0+2s, n2 does not: only the renewal moves its clock.
        clock.observe(
            &lease("aliaslb-agent-n1", "2", Some("n1"), None),
            t0 + 2 * s,
        );
        clock.observe(
            &lease("aliaslb-agent-n2", "1", Some("n2"), None),
            t0 + 2 * s,
        );
        let ages: BTreeMap<&str, Duration> = clock.renewal_ages(t0 + 5 * s).collect();
        assert_eq!(
            ages,
            BTreeMap::from([("n1", 3 * s), ("n2", 5 * s)]),
            "released (n3) and foreign Leases are left out"
        );
        // A deleted held Lease keeps its age (it is kept until judged lost); a deleted
        // released one goes.
        clock.remove("aliaslb-agent-n2");
        clock.remove("aliaslb-agent-n3");
        let ages: BTreeMap<&str, Duration> = clock.renewal_ages(t0 + 6 * s).collect();
        assert_eq!(ages, BTreeMap::from([("n1", 4 * s), ("n2", 6 * s)]));
        assert_eq!(clock.released().count(), 0);
        assert_eq!(clock.gone().collect::<Vec<_>>(), ["aliaslb-agent-n2"]);
    }

    #[test]
    fn freshness_follows_local_changes_only() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut clock = AgentClock::new(Duration::from_secs(4));
        clock.observe(&lease("aliaslb-agent-n1", "1", Some("n1"), Some(2)), t0);
        clock.observe(&lease("aliaslb-agent-n2", "1", Some("n2"), None), t0);
        clock.observe(&lease("other", "1", Some("x"), Some(2)), t0);
        assert!(clock.is_fresh("aliaslb-agent-n1", t0 + s));
        assert!(!clock.is_fresh("other", t0));
        // Same version seen again later: the clock does not move.
        clock.observe(&lease("aliaslb-agent-n1", "1", Some("n1"), Some(2)), t0 + s);
        assert!(!clock.is_fresh("aliaslb-agent-n1", t0 + 2 * s));
        assert_eq!(clock.next_expiry(t0 + s), Some(t0 + 2 * s));
        // The flag's duration for n2.
        assert!(clock.is_fresh("aliaslb-agent-n2", t0 + 3 * s));
        assert!(!clock.is_fresh("aliaslb-agent-n2", t0 + 4 * s));
        // A renewal moves it.
        clock.observe(
            &lease("aliaslb-agent-n1", "2", Some("n1"), Some(2)),
            t0 + 2 * s,
        );
        assert!(clock.is_fresh("aliaslb-agent-n1", t0 + 3 * s));
        // Released (empty holder): not ready at once.
        clock.observe(
            &lease("aliaslb-agent-n1", "3", Some(""), Some(2)),
            t0 + 3 * s,
        );
        assert!(!clock.is_fresh("aliaslb-agent-n1", t0 + 3 * s));
        // Deleted: as if it stopped renewing, fresh until its lease duration has passed.
        clock.remove("aliaslb-agent-n2");
        assert!(clock.is_fresh("aliaslb-agent-n2", t0 + 3 * s));
        assert_eq!(clock.next_expiry(t0 + 3 * s), Some(t0 + 4 * s));
        assert!(!clock.is_fresh("aliaslb-agent-n2", t0 + 4 * s));
        assert_eq!(clock.next_expiry(t0 + 4 * s), None);
    }

    /// Absence is not evidence: a deleted held Lease is judged as one that stopped
    /// renewing; written again, it is as fresh as any; a relist that misses it is a
    /// deletion; a released Lease deleted goes at once.
    #[test]
    fn a_deleted_lease_is_an_agent_that_stopped_renewing() {
        use Freshness::{Fading as D, Fresh as F, Lost as L, Unconfirmed as U};
        let t0 = Instant::now();
        let at = |secs: u64| t0 + Duration::from_secs(secs);
        let (a, b, c) = ("aliaslb-agent-a", "aliaslb-agent-b", "aliaslb-agent-c");
        let judge = |clock: &mut AgentClock, observer: &mut Observer, secs: u64| {
            let got = observer.judge(clock, at(secs));
            let lost = clock.forget_lost(&got);
            (got.agents.values().copied().collect::<Vec<_>>(), lost)
        };
        let mut clock = AgentClock::new(Duration::from_secs(4));
        let mut observer = Observer::new(t0);
        for name in [a, b, c] {
            clock.observe(&lease(name, "1", Some(name), Some(4)), at(0));
        }
        // c is deleted at 1 s: nothing changes before its lease has passed.
        clock.remove(c);
        assert_eq!(judge(&mut clock, &mut observer, 1), (vec![F, F, F], vec![]));
        clock.observe(&lease(a, "2", Some(a), Some(4)), at(3));
        clock.observe(&lease(b, "2", Some(b), Some(4)), at(3));
        assert_eq!(judge(&mut clock, &mut observer, 3), (vec![F, F, F], vec![]));
        // Its lease passed while the others renew: lost for election (fading: it may
        // still announce routed addresses), then lost and forgotten three leases after
        // its last renewal.
        assert_eq!(judge(&mut clock, &mut observer, 4), (vec![F, F, D], vec![]));
        clock.observe(&lease(a, "3", Some(a), Some(4)), at(6));
        clock.observe(&lease(b, "3", Some(b), Some(4)), at(6));
        clock.observe(&lease(a, "4", Some(a), Some(4)), at(9));
        clock.observe(&lease(b, "4", Some(b), Some(4)), at(9));
        assert_eq!(
            judge(&mut clock, &mut observer, 11),
            (vec![F, F, D], vec![])
        );
        assert_eq!(
            judge(&mut clock, &mut observer, 12),
            (vec![F, F, L], vec![c.to_owned()])
        );
        assert_eq!(judge(&mut clock, &mut observer, 12), (vec![F, F], vec![]));

        // Deleted while everything is silent (an API pause): unconfirmed, kept.
        clock.remove(b);
        assert_eq!(judge(&mut clock, &mut observer, 16), (vec![U, U], vec![]));
        // Written again (a live agent renews): fresh, no longer gone.
        clock.observe(&lease(b, "7", Some(b), Some(4)), at(17));
        clock.observe(&lease(a, "7", Some(a), Some(4)), at(17));
        assert_eq!(judge(&mut clock, &mut observer, 17), (vec![F, F], vec![]));
        assert_eq!(clock.gone().count(), 0);

        // A relist that misses a: deleted meanwhile, kept as last seen.
        clock.relist();
        clock.observe(&lease(b, "8", Some(b), Some(4)), at(18));
        clock.relisted();
        assert_eq!(clock.gone().collect::<Vec<_>>(), [a]);
        assert!(clock.is_fresh(a, at(20)));
        // A released Lease deleted is forgotten at once.
        clock.observe(&lease(b, "9", Some(""), Some(4)), at(19));
        clock.remove(b);
        assert_eq!(clock.gone().collect::<Vec<_>>(), [a]);
        assert_eq!(judge(&mut clock, &mut observer, 19), (vec![F], vec![]));
    }

    #[test]
    fn only_a_renewal_that_changes_nothing_is_not_worth_a_pass() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let reporting = |rv: &str, report: &str| {
            let mut l = lease("aliaslb-agent-n1", rv, Some("n1"), Some(2));
            l.metadata.annotations =
                Some([(keys::ANNOTATION_AGENT_REPORT.to_owned(), report.to_owned())].into());
            l
        };
        let mut clock = AgentClock::new(Duration::from_secs(4));
        assert!(clock.observe(&reporting("1", "a"), t0), "first sight");
        assert!(!clock.observe(&reporting("2", "a"), t0 + s), "idle renewal");
        assert!(
            !clock.observe(&reporting("2", "a"), t0 + s),
            "the same version again"
        );
        assert!(clock.observe(&reporting("3", "b"), t0 + s), "a new report");
        // Stale before its renewal: the agent becomes fresh again.
        assert!(
            clock.observe(&reporting("4", "b"), t0 + 4 * s),
            "back from stale"
        );
        let mut held = reporting("5", "b");
        held.spec.as_mut().unwrap().holder_identity = Some(String::new());
        assert!(clock.observe(&held, t0 + 4 * s), "released");
        assert!(
            clock.observe(&reporting("6", "b"), t0 + 4 * s),
            "held again"
        );
        let mut longer = reporting("7", "b");
        longer.spec.as_mut().unwrap().lease_duration_seconds = Some(10);
        assert!(clock.observe(&longer, t0 + 4 * s), "another duration");
        // Another held Lease is stale: its loss is judged on others' renewals.
        clock.observe(
            &lease("aliaslb-agent-n2", "1", Some("n2"), Some(2)),
            t0 + 4 * s,
        );
        let mut renewed = longer.clone();
        renewed.metadata.resource_version = Some("8".into());
        assert!(clock.observe(&renewed, t0 + 7 * s), "n2 is stale");
        assert!(
            !clock.observe(&lease("other", "1", None, None), t0),
            "not an agent's: no pass reads it"
        );
    }

    /// The observer over time: at each step, (seconds since t0, Leases renewed then as
    /// (name, resourceVersion, holder), the sight wanted, the edge wanted, and the
    /// freshness wanted per Lease: F fresh, U unconfirmed, L lost, in name order).
    #[test]
    fn blindness_is_not_node_loss() {
        use Freshness::{Fresh as F, Lost as L, Unconfirmed as U};
        type Step = (
            u64,
            &'static [(&'static str, &'static str, &'static str)],
            Sight,
            Option<Sight>,
            &'static [Freshness],
        );
        let t0 = Instant::now();
        let at = |secs: u64| t0 + Duration::from_secs(secs);
        const A: &str = "aliaslb-agent-a";
        const B: &str = "aliaslb-agent-b";
        const C: &str = "aliaslb-agent-c";
        // Lease duration 4 s; the term starts at 0 with the clock warm.
        let table: &[(&str, &[Step])] = &[
            (
                "one of three stops: lost after its lease, the others serve",
                &[
                    (
                        0,
                        &[(A, "1", "a"), (B, "1", "b"), (C, "1", "c")],
                        Sight::Normal,
                        None,
                        &[F, F, F],
                    ),
                    (
                        3,
                        &[(A, "2", "a"), (B, "2", "b")],
                        Sight::Normal,
                        None,
                        &[F, F, F],
                    ),
                    (
                        5,
                        &[(A, "3", "a"), (B, "3", "b")],
                        Sight::Normal,
                        None,
                        &[F, F, L],
                    ),
                ],
            ),
            (
                "two of three stop: lost as well",
                &[
                    (
                        0,
                        &[(A, "1", "a"), (B, "1", "b"), (C, "1", "c")],
                        Sight::Normal,
                        None,
                        &[F, F, F],
                    ),
                    (3, &[(A, "2", "a")], Sight::Normal, None, &[F, F, F]),
                    (5, &[(A, "3", "a")], Sight::Normal, None, &[F, L, L]),
                ],
            ),
            (
                "all stop at once: blind, kept, said once; sight back: a lease of grace",
                &[
                    (
                        0,
                        &[(A, "1", "a"), (B, "1", "b")],
                        Sight::Normal,
                        None,
                        &[F, F],
                    ),
                    (4, &[], Sight::Blind, Some(Sight::Blind), &[U, U]),
                    (30, &[], Sight::Blind, None, &[U, U]),
                    // a's renewal arrives first: b renews at its own pace.
                    (
                        31,
                        &[(A, "2", "a")],
                        Sight::Normal,
                        Some(Sight::Normal),
                        &[F, U],
                    ),
                    (34, &[(A, "3", "a")], Sight::Normal, None, &[F, U]),
                    (35, &[(A, "4", "a")], Sight::Normal, None, &[F, L]),
                ],
            ),
            (
                "sight back and every agent renews: nothing lost",
                &[
                    (
                        0,
                        &[(A, "1", "a"), (B, "1", "b")],
                        Sight::Normal,
                        None,
                        &[F, F],
                    ),
                    (5, &[], Sight::Blind, Some(Sight::Blind), &[U, U]),
                    (
                        6,
                        &[(B, "2", "b")],
                        Sight::Normal,
                        Some(Sight::Normal),
                        &[U, F],
                    ),
                    (7, &[(A, "2", "a")], Sight::Normal, None, &[F, F]),
                    (
                        20,
                        &[(A, "3", "a"), (B, "3", "b")],
                        Sight::Normal,
                        None,
                        &[F, F],
                    ),
                ],
            ),
            (
                "every renewal stops at once, the Leases expire in turn: the first is no loss",
                &[
                    (
                        0,
                        &[(A, "1", "a"), (B, "1", "b")],
                        Sight::Normal,
                        None,
                        &[F, F],
                    ),
                    // b's last renewal, a quarter lease after a's.
                    (1, &[(B, "2", "b")], Sight::Normal, None, &[F, F]),
                    (4, &[], Sight::Normal, None, &[U, F]),
                    (5, &[], Sight::Blind, Some(Sight::Blind), &[U, U]),
                ],
            ),
            (
                "released Leases are lost, never blindness",
                &[
                    (
                        0,
                        &[(A, "1", "a"), (B, "1", "b")],
                        Sight::Normal,
                        None,
                        &[F, F],
                    ),
                    (
                        1,
                        &[(A, "2", ""), (B, "2", "")],
                        Sight::Normal,
                        None,
                        &[L, L],
                    ),
                    (9, &[], Sight::Normal, None, &[L, L]),
                ],
            ),
            (
                "one held, one released, the held one stops: blind",
                &[
                    (
                        0,
                        &[(A, "1", "a"), (B, "1", "")],
                        Sight::Normal,
                        None,
                        &[F, L],
                    ),
                    (4, &[], Sight::Blind, Some(Sight::Blind), &[U, L]),
                ],
            ),
        ];
        for (what, steps) in table {
            let mut clock = AgentClock::new(Duration::from_secs(4));
            let mut observer = Observer::new(t0);
            for (i, (secs, renewed, sight, edge, want)) in steps.iter().enumerate() {
                for (name, rv, holder) in *renewed {
                    clock.observe(&lease(name, rv, Some(holder), Some(4)), at(*secs));
                }
                let got = observer.judge(&clock, at(*secs));
                // This table is about loss against blindness: fading is lost for election
                // (its timing: `a_lost_agent_fades_for_three_leases`).
                let freshness: Vec<Freshness> = got
                    .agents
                    .values()
                    .map(|f| match f {
                        Freshness::Fading => Freshness::Lost,
                        f => *f,
                    })
                    .collect();
                assert_eq!(
                    (got.sight, got.edge, freshness.as_slice()),
                    (*sight, *edge, *want),
                    "{what}, step {i} (t={secs}s)"
                );
            }
        }
    }

    /// A lost agent fades for [`FENCE_LEASES`] lease durations after its last renewal
    /// (its routed addresses may still be announced), then is lost; the judgement's next
    /// change names that moment, so the loop wakes for it.
    #[test]
    fn a_lost_agent_fades_for_three_leases() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let (a, b) = ("aliaslb-agent-a", "aliaslb-agent-b");
        let mut clock = AgentClock::new(Duration::from_secs(4));
        let mut observer = Observer::new(t0);
        clock.observe(&lease(a, "1", Some(a), Some(4)), at(0));
        clock.observe(&lease(b, "1", Some(b), Some(4)), at(0));
        // b keeps renewing every second; a stops after t0.
        let mut seen = Vec::new();
        for ms in (1000..=13_000).step_by(1000) {
            clock.observe(&lease(b, &ms.to_string(), Some(b), Some(4)), at(ms));
            let got = observer.judge(&clock, at(ms));
            seen.push((ms / 1000, got.agents[a], got.next_change));
        }
        let of = |secs: u64| seen.iter().find(|s| s.0 == secs).unwrap();
        assert_eq!(of(3).1, Freshness::Fresh);
        assert_eq!(of(4).1, Freshness::Fading, "stale over a lease of sight");
        assert_eq!(of(11).1, Freshness::Fading);
        assert_eq!(of(12).1, Freshness::Lost, "three leases after its renewal");
        assert_eq!(of(13).1, Freshness::Lost);
        assert_eq!(of(11).2, Some(at(12_000)), "the loop wakes when it is lost");
    }

    #[test]
    fn a_new_term_gives_every_agent_a_lease_to_be_seen() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut clock = AgentClock::new(Duration::from_secs(4));
        // Seen by the cache long before the term: a renewing, b silent since.
        clock.observe(&lease("aliaslb-agent-a", "1", Some("a"), Some(4)), t0);
        clock.observe(&lease("aliaslb-agent-b", "1", Some("b"), Some(4)), t0);
        clock.observe(
            &lease("aliaslb-agent-a", "2", Some("a"), Some(4)),
            t0 + 60 * s,
        );
        let mut observer = Observer::new(t0 + 60 * s);
        let got = observer.judge(&clock, t0 + 61 * s);
        assert_eq!(got.sight, Sight::Normal);
        assert_eq!(got.agents["aliaslb-agent-b"], Freshness::Unconfirmed);
        // The loop wakes when the grace ends (a's expiry is at the same moment).
        assert_eq!(got.next_change, Some(t0 + 64 * s));
        clock.observe(
            &lease("aliaslb-agent-a", "3", Some("a"), Some(4)),
            t0 + 62 * s,
        );
        let got = observer.judge(&clock, t0 + 64 * s);
        assert_eq!(got.sight, Sight::Normal);
        assert_eq!(got.agents["aliaslb-agent-b"], Freshness::Lost);
        // Both silent now: blind.
        let got = observer.judge(&clock, t0 + 66 * s);
        assert_eq!((got.sight, got.edge), (Sight::Blind, Some(Sight::Blind)));
        assert_eq!(got.next_change, None);
    }

    #[test]
    fn a_report_out_of_bounds_counts_as_no_agent() {
        let with_report = |json: &str| {
            let mut l = lease("aliaslb-agent-n1", "1", Some("n1"), Some(4));
            l.metadata.annotations =
                Some([(keys::ANNOTATION_AGENT_REPORT.to_owned(), json.to_owned())].into());
            l
        };
        let view = |lease: &Lease| {
            let record = LeaseRecord::of(lease, |_| true, None).unwrap();
            let (node, agent, error) = record.agent_view(Freshness::Fresh).unwrap();
            assert_eq!(node, "n1");
            (agent, error.cloned())
        };
        let valid = r#"{"version":1,"interfaces":[{"name":"eth0","subnets":["10.0.0.0/24"]}],"held":["10.0.0.5"]}"#;
        let ((ready, report), error) = view(&with_report(valid));
        assert!(ready == Freshness::Fresh && error.is_none());
        assert_eq!(report.held.len(), 1);
        // No annotation: an empty report from a ready agent.
        let ((ready, report), error) = view(&lease("aliaslb-agent-n1", "1", Some("n1"), None));
        assert!(ready == Freshness::Fresh && error.is_none() && *report == AgentReport::default());
        for bad in [
            valid.replace("eth0", "eth0/1"),
            valid.replace("eth0", "a-name-of-16-byt"),
            "{not json".to_owned(),
            format!("{{\"x\":\"{}\"}}", "y".repeat(300_000)),
        ] {
            let ((ready, report), error) = view(&with_report(&bad));
            assert_eq!(ready, Freshness::Lost, "{bad:.80}");
            assert_eq!(*report, AgentReport::default());
            assert!(error.is_some_and(|e| !e.message.is_empty()));
        }
    }

    /// Only nodes are agents (issue 42): the Lease of a node that does not exist keeps
    /// nothing of its report (not even parsed), an unchanged report is not read again, and a
    /// Node's deletion drops its agent's report.
    #[test]
    fn a_lease_of_a_node_that_does_not_exist_keeps_nothing_but_its_name() {
        let report = r#"{"version":1,"held":["10.0.0.5"],"macs":["02:00:00:00:00:09"]}"#;
        let mut l = lease("aliaslb-agent-ghost", "1", Some("ghost"), Some(4));
        l.metadata.namespace = Some("agents".into());
        l.metadata.annotations =
            Some([(keys::ANNOTATION_AGENT_REPORT.to_owned(), report.to_owned())].into());
        let ghost = LeaseRecord::of(&l, |_| false, None).unwrap();
        assert_eq!(
            ghost.kind,
            LeaseKind::Ghost {
                node: "ghost".into()
            }
        );
        assert!(ghost.agent_view(Freshness::Fresh).is_none());
        let agent = LeaseRecord::of(&l, |n| n == "ghost", None).unwrap();
        let (_, (_, read), _) = agent.agent_view(Freshness::Fresh).unwrap();
        assert_eq!(read.held.len(), 1);
        // A renewal with the same report shares it; a new one is read.
        l.metadata.resource_version = Some("2".into());
        let again = LeaseRecord::of(&l, |_| true, Some(&agent)).unwrap();
        let (_, (_, shared), _) = again.agent_view(Freshness::Fresh).unwrap();
        assert!(Arc::ptr_eq(&read, &shared));
        assert!(again.same(&agent), "a renewal changes nothing in the cache");
        // Its Node is deleted: only the name stays.
        assert_eq!(again.ghost().unwrap().kind, ghost.kind);
        assert_eq!(
            ghost.object_ref().name.as_deref(),
            Some("aliaslb-agent-ghost")
        );
        let other = LeaseRecord::of(
            &lease("aliaslb-controller", "1", None, None),
            |_| true,
            None,
        );
        assert_eq!(other.unwrap().kind, LeaseKind::Other);
    }
}
