//! What the metrics count across planner passes, from the plans the leader already has:
//! the failovers in flight ([`Failovers`]), and the Services waiting: without an IP, or
//! with IPs not (fully) announced ([`Waiting`]), and since when. Pure, no I/O: the reconcile loop feeds each pass's plans
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
//!   LAN (the address was withheld).
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
    /// An IP was withheld by a LAN conflict and replaced.
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
    /// in order (released its Lease), `conflicted` whether an address is withheld by a LAN
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

/// Why the Service of `plan` counts as not announced, if it does: the reason of its
/// `aliaslb.io/Announced` condition when it has IPs and that reason is not `Announced`
/// (nor `TakenOver`: answered by the standby): `WaitingForAgent`, `Moving`,
/// `NoEligibleNode`, `AddressConflict`, `AddressDefended`, `AgentsUnobservable`, L3:
/// `PartiallyAnnounced`, `NotAnnounced`.
pub fn unannounced_reason(plan: &ServicePlan) -> Option<&'static str> {
    let fine = plan.ips.is_empty()
        || plan.announced.reason == reason::ANNOUNCED
        || plan.announced.reason == reason::TAKEN_OVER
        || plan.announced.reason == reason::NOT_ALLOCATED;
    (!fine).then_some(plan.announced.reason)
}

/// One Service of [`Waiting`]: its pool, the reason, and since when it has been waiting.
#[derive(Debug, Clone)]
struct Wait {
    pool: Arc<str>,
    reason: &'static str,
    since: Instant,
}

/// The Services in a state that must not last (without an IP; with IPs nobody announces),
/// each with its pool, the reason and **since when**, kept from pass to pass: a narrowed
/// pass updates the Services it re-planned ([`Waiting::set`]), a full pass replaces them
/// all ([`Waiting::begin_full`] .. [`Waiting::end_full`]) but keeps the `since` of those
/// still waiting, so a relist does not restart an alert's clock. A Service keeps its
/// `since` when its reason changes (it has been waiting all along); it is counted under its
/// latest reason. The time is the leader's own monotonic clock, from the first pass of its
/// term that saw the Service waiting.
#[derive(Debug, Default)]
pub struct Waiting {
    services: HashMap<ServiceKey, Wait>,
    /// During a full pass: the Services of before it, for their `since`.
    before: Option<HashMap<ServiceKey, Wait>>,
    /// The pools' names, shared by their Services (a name per Service was a megabyte
    /// while 10,000 Services waited for their agents).
    pools: HashSet<Arc<str>>,
}

impl Waiting {
    /// Before a full pass: every Service is set again (or forgotten) by the pass.
    pub fn begin_full(&mut self) {
        let before = std::mem::take(&mut self.services);
        self.before = Some(before);
        self.pools.clear();
    }

    /// After a full pass: what it did not set again is forgotten.
    pub fn end_full(&mut self) {
        self.before = None;
    }

    /// Records that the Service `key` of `pool` waits for `reason` (`None`: it does not)
    /// as of the pass at `now`.
    pub fn set(
        &mut self,
        key: &ServiceKey,
        pool: &str,
        reason: Option<&'static str>,
        now: Instant,
    ) {
        let Some(reason) = reason else {
            self.services.remove(key);
            return;
        };
        let since = self
            .services
            .get(key)
            .or_else(|| self.before.as_ref()?.get(key))
            .map_or(now, |w| w.since);
        let pool = crate::store::interned(&mut self.pools, pool);
        self.services.insert(
            key.clone(),
            Wait {
                pool,
                reason,
                since,
            },
        );
    }

    /// Exactly `waiting` (Service, pool, reason) wait now, at `now`: a full replacement
    /// that keeps the `since` of those that already waited.
    pub fn replace<'a>(
        &mut self,
        waiting: impl IntoIterator<Item = (&'a ServiceKey, &'a str, &'static str)>,
        now: Instant,
    ) {
        self.begin_full();
        for (key, pool, reason) in waiting {
            self.set(key, pool, Some(reason), now);
        }
        self.end_full();
    }

    /// Forgets the Service `key` (deleted, or no longer ours).
    pub fn forget(&mut self, key: &ServiceKey) {
        self.services.remove(key);
    }

    /// The number of Services by (pool, reason).
    pub fn counts(&self) -> BTreeMap<(String, &'static str), usize> {
        let mut counts: BTreeMap<(&str, &'static str), usize> = BTreeMap::new();
        for w in self.services.values() {
            *counts.entry((&w.pool, w.reason)).or_default() += 1;
        }
        counts
            .into_iter()
            .map(|((pool, reason), n)| ((pool.to_owned(), reason), n))
            .collect()
    }

    /// Since when the longest-waiting Service of each (namespace, pool, reason) has waited.
    pub fn oldest(&self) -> BTreeMap<(String, String, &'static str), Instant> {
        let mut oldest: BTreeMap<(&str, &str, &'static str), Instant> = BTreeMap::new();
        for (key, w) in &self.services {
            oldest
                .entry((&key.namespace, &w.pool, w.reason))
                .and_modify(|since| *since = (*since).min(w.since))
                .or_insert(w.since);
        }
        oldest
            .into_iter()
            .map(|((ns, pool, reason), since)| ((ns.to_owned(), pool.to_owned(), reason), since))
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
    /// `withheld` addresses a LAN conflict. Returns every step.
    fn run(plans: &[ServicePlan], ready: &[&str], withheld: &[&str]) -> Vec<Step> {
        let mut failovers = Failovers::default();
        let t0 = Instant::now();
        let withheld: Vec<IpAddr> = withheld.iter().map(|ip| ip.parse().unwrap()).collect();
        let mut old: Option<&ServicePlan> = None;
        let mut steps = Vec::new();
        for (i, new) in plans.iter().enumerate() {
            let now = t0 + Duration::from_secs(i as u64);
            steps.push(failovers.observe(
                &svc(),
                old,
                new,
                |n| ready.contains(&n),
                |ip| withheld.contains(&ip),
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
    fn a_withheld_address_replaced_is_a_conflict_failover() {
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
        let mut u = Waiting::default();
        let now = Instant::now();
        let a = ServiceKey::new("team-a", "a");
        let b = ServiceKey::new("team-a", "b");
        let c = ServiceKey::new("team-b", "c");
        let set = |u: &mut Waiting, key: &ServiceKey, pool: &str, p: ServicePlan| {
            u.set(key, pool, unannounced_reason(&p), now);
        };
        set(
            &mut u,
            &a,
            "team-a",
            plan(&[IP], None, reason::PARTIALLY_ANNOUNCED),
        );
        set(
            &mut u,
            &b,
            "team-a",
            plan(&[IP], None, reason::PARTIALLY_ANNOUNCED),
        );
        set(
            &mut u,
            &c,
            "team-b",
            plan(&[IP], Some("n1"), reason::ANNOUNCED),
        );
        set(
            &mut u,
            &c,
            "team-b",
            plan(&[IP], Some("n2"), reason::TAKEN_OVER),
        );
        set(&mut u, &c, "team-b", plan(&[], None, reason::NOT_ALLOCATED));
        assert_eq!(
            u.counts(),
            BTreeMap::from([(("team-a".to_owned(), reason::PARTIALLY_ANNOUNCED), 2)])
        );
        set(
            &mut u,
            &a,
            "team-a",
            plan(&[IP], None, reason::NOT_ANNOUNCED),
        );
        u.forget(&b);
        assert_eq!(
            u.counts(),
            BTreeMap::from([(("team-a".to_owned(), reason::NOT_ANNOUNCED), 1)])
        );
        set(
            &mut u,
            &a,
            "team-a",
            plan(&[IP], Some("n1"), reason::ANNOUNCED),
        );
        assert!(u.counts().is_empty());
        set(
            &mut u,
            &c,
            "team-b",
            plan(&[IP], Some("n1"), reason::MOVING),
        );
        u.begin_full();
        u.end_full();
        assert!(
            u.counts().is_empty(),
            "a full pass that did not set it forgets it"
        );
    }

    #[test]
    fn waiting_keeps_since_across_reasons_and_full_passes() {
        let mut w = Waiting::default();
        let t0 = Instant::now();
        let s = |n: u64| t0 + Duration::from_secs(n);
        let (a, b) = (ServiceKey::new("ns", "a"), ServiceKey::new("ns", "b"));
        w.set(&a, "pool", Some(reason::WAITING_FOR_AGENT), s(0));
        w.set(&b, "pool", Some(reason::WAITING_FOR_AGENT), s(5));
        w.set(&a, "pool", Some(reason::NO_ELIGIBLE_NODE), s(7));
        let at = |reason: &'static str| ("ns".to_owned(), "pool".to_owned(), reason);
        assert_eq!(
            w.oldest(),
            BTreeMap::from([
                (at(reason::NO_ELIGIBLE_NODE), s(0)),
                (at(reason::WAITING_FOR_AGENT), s(5)),
            ]),
            "a new reason keeps the Service's since"
        );
        // A full pass (a relist) sets a again: its clock goes on; b is gone.
        w.begin_full();
        w.set(&a, "pool", Some(reason::NO_ELIGIBLE_NODE), s(9));
        w.end_full();
        assert_eq!(
            w.oldest(),
            BTreeMap::from([(at(reason::NO_ELIGIBLE_NODE), s(0))])
        );
        // Announced, then dark again: a new clock.
        w.set(&a, "pool", None, s(10));
        w.set(&a, "pool", Some(reason::MOVING), s(11));
        assert_eq!(w.oldest(), BTreeMap::from([(at(reason::MOVING), s(11))]));
        // replace: exactly these, since kept.
        w.replace(
            [(&a, "pool", reason::MOVING), (&b, "pool", reason::MOVING)],
            s(12),
        );
        assert_eq!(w.counts()[&("pool".to_owned(), reason::MOVING)], 2);
        assert_eq!(w.oldest()[&at(reason::MOVING)], s(11));
        w.replace([], s(13));
        assert!(w.oldest().is_empty());
    }
}
