//! What the metrics count across planner passes, from the plans the leader already has:
//! the failovers in flight ([`Failovers`]) and the Services whose IPs are not (fully)
//! announced ([`Unannounced`]). Pure, no I/O: the reconcile loop feeds each pass's plans
//! in, next to the plans of the pass before, and publishes what comes out.
//!
//! A **failover** is a Service's IPs leaving the node that carried them (L2 mode), by
//! [`Cause`]:
//! - `hard`: the old node's agent was not ready (lost, stale, its report rejected) when the
//!   IPs left it;
//! - `graceful`: its agent was ready (cordon, exclude label, local endpoints gone:
//!   break-before-make, the `Moving` state first), or had released its Lease (agent
//!   SIGTERM: it let go of the IPs in order);
//! - `conflict`: one of its IPs was replaced because a foreign host answers for it on the
//!   LAN (the address was fenced).
//!
//! It starts at the pass that takes the IPs off the node (or replaces the IP) and ends at
//! the first pass that sees the Service announced again, i.e. a node's agent reporting that
//! it holds every IP: that is its duration *as the controller sees it*. For a hard failover
//! the time the old agent's Lease took to go stale (the agent lease duration) comes before
//! it. A failover in flight is not restarted by a second cause (a graceful move whose target
//! dies stays `graceful` and keeps its start). The first pass of a leadership term has no
//! previous plans: it starts none, and failovers in flight during a handover are not
//! measured. L3 mode (`announce: bgp`) has no single holder, hence no failover.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use aliaslb_core::plan::{ServiceKey, ServicePlan, reason};

/// Why a Service's IPs left their node (module docs). Its label is [`Cause::label`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Cause {
    /// The old node's agent was not ready.
    Hard,
    /// The old node's agent was ready, or shut down in order: a planned move.
    Graceful,
    /// An IP was fenced by a LAN conflict and replaced.
    Conflict,
}

impl Cause {
    /// The value of the `cause` label: `hard`, `graceful`, `conflict`.
    pub fn label(self) -> &'static str {
        match self {
            Cause::Hard => "hard",
            Cause::Graceful => "graceful",
            Cause::Conflict => "conflict",
        }
    }
}

/// What one Service's new plan did to its failover ([`Failovers::observe`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Step {
    /// A failover started, with this cause.
    pub started: Option<Cause>,
    /// A failover ended: its cause and how long it took.
    pub done: Option<(Cause, Duration)>,
}

/// The failovers in flight, by Service (module docs).
#[derive(Debug, Default)]
pub struct Failovers {
    inflight: HashMap<ServiceKey, (Cause, Instant)>,
}

impl Failovers {
    /// Takes the Service `key` from its plan of the previous pass `old` (`None`: it had
    /// none) to `new`, at `now`. `orderly` says whether a node's agent is ready or shut down
    /// in order (released its Lease), `conflicted` whether an address is fenced by a LAN
    /// conflict.
    pub fn observe(
        &mut self,
        key: &ServiceKey,
        old: Option<&ServicePlan>,
        new: &ServicePlan,
        orderly: impl Fn(&str) -> bool,
        conflicted: impl Fn(IpAddr) -> bool,
        now: Instant,
    ) -> Step {
        let mut step = Step::default();
        if !self.inflight.contains_key(key)
            && let Some(old) = old
            && let Some(from) = old.node.as_deref()
        {
            let replaced = old
                .ips
                .iter()
                .any(|ip| !new.ips.contains(ip) && conflicted(*ip));
            let cause = if replaced {
                Some(Cause::Conflict)
            } else if new.node.as_deref() != Some(from) {
                Some(if orderly(from) {
                    Cause::Graceful
                } else {
                    Cause::Hard
                })
            } else {
                None
            };
            if let Some(cause) = cause {
                self.inflight.insert(key.clone(), (cause, now));
                step.started = Some(cause);
            }
        }
        if new.node.is_some()
            && new.announced.status
            && new.announced.reason == reason::ANNOUNCED
            && let Some((cause, since)) = self.inflight.remove(key)
        {
            step.done = Some((cause, now.saturating_duration_since(since)));
        }
        step
    }

    /// Forgets the Service `key` (deleted, or no longer ours): its failover is not measured.
    pub fn forget(&mut self, key: &ServiceKey) {
        self.inflight.remove(key);
    }

    /// Keeps only the Services `keep` accepts (after a full pass: those it planned).
    pub fn retain(&mut self, keep: impl Fn(&ServiceKey) -> bool) {
        self.inflight.retain(|k, _| keep(k));
    }

    /// Number of failovers in flight.
    pub fn in_flight(&self) -> usize {
        self.inflight.len()
    }
}

/// The Services with IPs whose `aliaslb.io/Announced` reason is not `Announced` (nor
/// `TakenOver`: answered by the standby), with their
/// pool and that reason (`WaitingForAgent`, `Moving`, `NoEligibleNode`, `AddressConflict`,
/// `AgentsUnobservable`, L3: `PartiallyAnnounced`, `NotAnnounced`), kept from pass to pass:
/// a narrowed pass updates the Services it re-planned, a full pass starts afresh.
#[derive(Debug, Default)]
pub struct Unannounced {
    /// Service -> its pool and the reason.
    services: HashMap<ServiceKey, (Arc<str>, &'static str)>,
    /// The pools' names, shared by their Services (a name per Service was a megabyte
    /// while 10,000 Services waited for their agents).
    pools: HashSet<Arc<str>>,
}

impl Unannounced {
    /// Before a full pass: forget everything.
    pub fn clear(&mut self) {
        self.services.clear();
        self.pools.clear();
    }

    /// Records the new plan of the Service `key`, of pool `pool`.
    pub fn set(&mut self, key: &ServiceKey, pool: &str, plan: &ServicePlan) {
        // A standby's takeover is answered on the LAN: announced, not a problem to count.
        let fine = plan.ips.is_empty()
            || plan.announced.reason == reason::ANNOUNCED
            || plan.announced.reason == reason::TAKEN_OVER
            || plan.announced.reason == reason::NOT_ALLOCATED;
        if fine {
            self.services.remove(key);
        } else {
            let pool = crate::store::interned(&mut self.pools, pool);
            self.services
                .insert(key.clone(), (pool, plan.announced.reason));
        }
    }

    /// Forgets the Service `key` (deleted, or no longer ours).
    pub fn forget(&mut self, key: &ServiceKey) {
        self.services.remove(key);
    }

    /// The number of Services by (pool, reason).
    pub fn counts(&self) -> BTreeMap<(String, &'static str), usize> {
        let mut counts: BTreeMap<(&str, &'static str), usize> = BTreeMap::new();
        for (pool, reason) in self.services.values() {
            *counts.entry((pool, *reason)).or_default() += 1;
        }
        counts
            .into_iter()
            .map(|((pool, reason), n)| ((pool.to_owned(), reason), n))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aliaslb_core::plan::ConditionPlan;

    fn plan(ips: &[&str], node: Option<&str>, announced: &'static str) -> ServicePlan {
        let condition = |status, reason| ConditionPlan {
            status,
            reason,
            message: String::new(),
        };
        ServicePlan {
            ips: ips.iter().map(|ip| ip.parse().unwrap()).collect(),
            node: node.map(Into::into),
            nodes: Vec::new(),
            interface: None,
            virtual_mac: false,
            standby: None,
            allocated: condition(!ips.is_empty(), reason::ALLOCATED),
            announced: condition(
                matches!(announced, reason::ANNOUNCED | reason::PARTIALLY_ANNOUNCED),
                announced,
            ),
        }
    }

    fn svc() -> ServiceKey {
        ServiceKey::new("default", "web")
    }

    const IP: &str = "10.0.0.1";

    /// Runs `plans` as successive passes 1 s apart; `ready` nodes have a ready agent and
    /// `fenced` addresses a LAN conflict. Returns every step.
    fn run(plans: &[ServicePlan], ready: &[&str], fenced: &[&str]) -> Vec<Step> {
        let mut failovers = Failovers::default();
        let t0 = Instant::now();
        let fenced: Vec<IpAddr> = fenced.iter().map(|ip| ip.parse().unwrap()).collect();
        let mut old: Option<&ServicePlan> = None;
        let mut steps = Vec::new();
        for (i, new) in plans.iter().enumerate() {
            let now = t0 + Duration::from_secs(i as u64);
            steps.push(failovers.observe(
                &svc(),
                old,
                new,
                |n| ready.contains(&n),
                |ip| fenced.contains(&ip),
                now,
            ));
            old = Some(new);
        }
        steps
    }

    fn started(steps: &[Step]) -> Vec<Cause> {
        steps.iter().filter_map(|s| s.started).collect()
    }

    fn done(steps: &[Step]) -> Vec<(Cause, Duration)> {
        steps.iter().filter_map(|s| s.done).collect()
    }

    #[test]
    fn a_lost_node_is_a_hard_failover_ended_by_the_new_holder() {
        let steps = run(
            &[
                plan(&[IP], Some("n1"), reason::ANNOUNCED),
                plan(&[IP], Some("n2"), reason::WAITING_FOR_AGENT),
                plan(&[IP], Some("n2"), reason::WAITING_FOR_AGENT),
                plan(&[IP], Some("n2"), reason::ANNOUNCED),
            ],
            &["n2"],
            &[],
        );
        assert_eq!(started(&steps), [Cause::Hard]);
        assert_eq!(done(&steps), [(Cause::Hard, Duration::from_secs(2))]);
    }

    #[test]
    fn a_move_off_a_ready_node_is_graceful_through_moving() {
        let steps = run(
            &[
                plan(&[IP], Some("n1"), reason::ANNOUNCED),
                plan(&[IP], None, reason::MOVING),
                plan(&[IP], Some("n2"), reason::WAITING_FOR_AGENT),
                plan(&[IP], Some("n2"), reason::ANNOUNCED),
            ],
            &["n1", "n2"],
            &[],
        );
        assert_eq!(started(&steps), [Cause::Graceful], "one failover, not two");
        assert_eq!(done(&steps), [(Cause::Graceful, Duration::from_secs(2))]);
    }

    #[test]
    fn a_fenced_address_replaced_is_a_conflict_failover() {
        let steps = run(
            &[
                plan(&[IP], Some("n1"), reason::ANNOUNCED),
                plan(&["10.0.0.2"], Some("n1"), reason::WAITING_FOR_AGENT),
                plan(&["10.0.0.2"], Some("n1"), reason::ANNOUNCED),
            ],
            &["n1"],
            &[IP],
        );
        assert_eq!(started(&steps), [Cause::Conflict]);
        assert_eq!(done(&steps), [(Cause::Conflict, Duration::from_secs(1))]);
    }

    #[test]
    fn no_failover_without_a_move() {
        for plans in [
            // A first allocation and its announcement.
            vec![
                plan(&[], None, reason::NOT_ALLOCATED),
                plan(&[IP], Some("n1"), reason::WAITING_FOR_AGENT),
                plan(&[IP], Some("n1"), reason::ANNOUNCED),
            ],
            // The holder's agent restarted: it re-adds the IP, no node changes.
            vec![
                plan(&[IP], Some("n1"), reason::ANNOUNCED),
                plan(&[IP], Some("n1"), reason::WAITING_FOR_AGENT),
                plan(&[IP], Some("n1"), reason::ANNOUNCED),
            ],
            // An IP replaced by a pool edit, not a conflict.
            vec![
                plan(&[IP], Some("n1"), reason::ANNOUNCED),
                plan(&["10.0.0.9"], Some("n1"), reason::ANNOUNCED),
            ],
        ] {
            let steps = run(&plans, &["n1"], &[]);
            assert_eq!(steps, vec![Step::default(); plans.len()], "{plans:?}");
        }
    }

    #[test]
    fn a_failover_that_finds_no_node_ends_when_one_announces() {
        let steps = run(
            &[
                plan(&[IP], Some("n1"), reason::ANNOUNCED),
                plan(&[IP], None, reason::NO_ELIGIBLE_NODE),
                plan(&[IP], None, reason::NO_ELIGIBLE_NODE),
                plan(&[IP], Some("n3"), reason::ANNOUNCED),
            ],
            &[],
            &[],
        );
        assert_eq!(started(&steps), [Cause::Hard]);
        assert_eq!(done(&steps), [(Cause::Hard, Duration::from_secs(2))]);
    }

    #[test]
    fn forgotten_services_are_not_measured() {
        let mut failovers = Failovers::default();
        let now = Instant::now();
        let moved = failovers.observe(
            &svc(),
            Some(&plan(&[IP], Some("n1"), reason::ANNOUNCED)),
            &plan(&[IP], Some("n2"), reason::WAITING_FOR_AGENT),
            |_| false,
            |_| false,
            now,
        );
        assert_eq!(moved.started, Some(Cause::Hard));
        assert_eq!(failovers.in_flight(), 1);
        failovers.forget(&svc());
        assert_eq!(failovers.in_flight(), 0);
        let step = failovers.observe(
            &svc(),
            None,
            &plan(&[IP], Some("n2"), reason::ANNOUNCED),
            |_| true,
            |_| false,
            now,
        );
        assert_eq!(step, Step::default());
    }

    #[test]
    fn unannounced_counts_by_pool_and_reason_and_forgets() {
        let mut u = Unannounced::default();
        let a = ServiceKey::new("team-a", "a");
        let b = ServiceKey::new("team-a", "b");
        let c = ServiceKey::new("team-b", "c");
        u.set(
            &a,
            "team-a",
            &plan(&[IP], None, reason::PARTIALLY_ANNOUNCED),
        );
        u.set(
            &b,
            "team-a",
            &plan(&[IP], None, reason::PARTIALLY_ANNOUNCED),
        );
        u.set(&c, "team-b", &plan(&[IP], Some("n1"), reason::ANNOUNCED));
        u.set(&c, "team-b", &plan(&[], None, reason::NOT_ALLOCATED));
        assert_eq!(
            u.counts(),
            BTreeMap::from([(("team-a".to_owned(), reason::PARTIALLY_ANNOUNCED), 2)])
        );
        u.set(&a, "team-a", &plan(&[IP], None, reason::NOT_ANNOUNCED));
        u.forget(&b);
        assert_eq!(
            u.counts(),
            BTreeMap::from([(("team-a".to_owned(), reason::NOT_ANNOUNCED), 1)])
        );
        u.set(&a, "team-a", &plan(&[IP], Some("n1"), reason::ANNOUNCED));
        assert!(u.counts().is_empty());
        u.set(&c, "team-b", &plan(&[IP], Some("n1"), reason::MOVING));
        u.clear();
        assert!(u.counts().is_empty());
    }
}
