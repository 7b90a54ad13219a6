//! The allocation step of a pass: import of observed assignments (first pass only), then
//! one decision per Service, oldest first. Pure.
//!
//! A decision first chooses the one pool the Service's addresses come from
//! ([`Planner::choose_pool`], the rule of [`Tenancy`]); then each family is checked before
//! anything changes ([`Step`]), so a RequireDualStack Service never ends up holding half its
//! addresses, and a request that cannot be honoured leaves the current address in place.
//! The tenant fence is checked where an address is taken: a fresh, requested or sticky
//! address only from a pool the namespace may draw from; an address held (or shared
//! within its sharing group) while its namespace keeps that pool. No address of a draining
//! pool or entry is handed out anew.

use std::collections::BTreeSet;
use std::net::IpAddr;

use super::{
    Entry, Failure, GroupId, Inputs, IpUse, MAX_PORTS_PER_IP, Pass, Planner, ServiceKey,
    ServiceView, Sink, insert_tight, join, reason, tight_map,
};
use crate::ledger::{AllocError, Ledger};
use crate::pool::{FALLBACK_KEY, Pool, PoolConfig, PoolKey, Tenancy};
use crate::range::Family;

/// How one family's address is obtained, decided before anything changes.
#[derive(Debug, Clone, Copy)]
enum Step {
    /// The current address stays.
    Keep,
    /// A free address of the pool, requested or sticky.
    Take(IpAddr),
    /// An address the Service's sharing group already uses.
    Share(IpAddr),
    /// The lowest free address of the family.
    Fresh(Family),
}

impl Planner {
    /// First pass: adopts the observed assignments, oldest Service first, so an IP claimed
    /// twice stays with the older Service. Whatever is not adopted is reported and left to
    /// the allocation step.
    ///
    /// A group whose node the observed view does not give (our assignment object for that
    /// node is missing or unreadable: the annotation alone is never trusted), while an agent
    /// that may still be running (fresh or unconfirmed) reports holding one of its IPs, is
    /// imported as moving off that agent's node ([`Group::moving_from`], the first such
    /// node by name): the node step elects a node only once that agent lets go, as in a
    /// graceful move. The agent's report is its word about itself (it holds the address),
    /// evidence enough to wait for, never a title to the address.
    pub(super) fn import(&mut self, order: &[&ServiceView], pass: &Pass<'_>, sink: &mut Sink) {
        let inputs = pass.inputs;
        for view in order.iter().filter(|v| !v.observed_ips.is_empty()) {
            self.ensure_entry(view);
            let mut seen = BTreeSet::new();
            for &ip in &view.observed_ips {
                if !seen.insert(ip) {
                    continue;
                }
                let claim = match self.fence_of(ip) {
                    Some(cause) if cause.renumbers() => {
                        let (why, text) = cause.cleared();
                        sink.event(
                            &view.key,
                            true,
                            why,
                            format!("{ip} {text}; assigning a new address"),
                        );
                        continue;
                    }
                    // A node's word, or a LAN host answering for everything: the Service
                    // keeps it (see `withheld`). Withheld for no
                    // Service until now (unless an older one imported it already): free
                    // in its ledger for the import to take.
                    Some(cause) => {
                        let cause = cause.clone();
                        if !self.ips.contains_key(&ip)
                            && let Some(ledger) = self.ledgers.values_mut().find(|l| l.contains(ip))
                        {
                            ledger.release(ip);
                        }
                        Some(cause)
                    }
                    None => None,
                };
                let imported = self.import_one(view, ip, pass);
                if let Some(cause) = &claim {
                    if imported.is_err() {
                        self.reserve(ip);
                    } else if cause.node().is_some() {
                        sink.event(&view.key, true, reason::NODE_CLAIM, cause.kept(ip));
                    }
                }
                if let Err(why) = imported {
                    sink.event(
                        &view.key,
                        true,
                        reason::CLEAR_ASSIGNMENT,
                        format!("{why}; assigning a new address"),
                    );
                }
            }
            let group_id = GroupId::of(view);
            if let Some(node) = &view.observed_node
                && let Some(group) = self.groups.get_mut(&group_id)
                && group.node.is_none()
            {
                // One name per node, shared through the load's keys.
                let node: std::sync::Arc<str> = match self.load.get_key_value(node.as_str()) {
                    Some((shared, _)) => shared.clone(),
                    None => node.as_str().into(),
                };
                *self.load.entry(node.clone()).or_default() += 1;
                group.node = Some(node);
            }
            if let Some(group) = self.groups.get_mut(&group_id)
                && group.node.is_none()
                && group.moving_from.is_none()
                && let Some(holder) = untrusted_holder(inputs, group.ips.values())
            {
                let ips: Vec<IpAddr> = group.ips.values().copied().collect();
                sink.event(
                    &view.key,
                    true,
                    reason::NODE_MOVED,
                    format!(
                        "no assignment object of the controller names a node for {}, which \
                         the agent on {holder} reports holding: waiting for it to let go \
                         before a node is elected (break-before-make)",
                        join(&ips)
                    ),
                );
                group.moving_from = Some(holder);
            }
        }
    }

    /// Adopts one observed IP, or says why not.
    fn import_one(
        &mut self,
        view: &ServiceView,
        ip: IpAddr,
        pass: &Pass<'_>,
    ) -> Result<(), String> {
        let key = &view.key;
        let ns = &key.namespace;
        let family = Family::of(ip);
        if let Some(other) = self.entries.get(key).and_then(|e| e.ips.get(&family)) {
            return Err(format!(
                "{ip} not imported: the Service already has the {family} address {other} \
                 and gets one per family"
            ));
        }
        if !view.families.families.contains(&family) {
            return Err(format!(
                "{ip} not imported: the Service does not ask for an {family} address"
            ));
        }
        let tenancy = pass.tenancy(ns);
        let config: &PoolConfig = pass.inputs.config;
        let Some((pool_key, _)) = config
            .pool_of(ip)
            .filter(|(key, pool)| tenancy.keeps(key, pool))
        else {
            if tenancy.is_empty() {
                return Err(format!("{ip} not imported: {}", no_pool(ns)));
            }
            return Err(not_in_pool(ip, &tenancy));
        };
        let group_id = GroupId::of(view);
        match self.ips.get(&ip) {
            Some(used) if used.group != group_id => {
                let owner = owner_name(used.users.keys().next(), ns);
                return Err(format!(
                    "{ip} is also claimed by {owner}, which is older and keeps it"
                ));
            }
            Some(_) => {
                // Sharing that exists is kept even if `allowSharing` was turned off since:
                // a running planner keeps it too, and a restart must not change IPs.
                self.check_join(ip, view, pool_key, None)
                    .map_err(|f| format!("{ip} not imported: {}", f.message))?;
                self.join(ip, view);
            }
            None => {
                if let Some(other) = self.groups.get(&group_id).and_then(|g| g.ips.get(&family)) {
                    return Err(format!(
                        "{ip} not imported: the Services with sharing key {} already share {other}",
                        view.sharing_key.as_deref().unwrap_or_default()
                    ));
                }
                let ledger = self
                    .ledgers
                    .get_mut(pool_key)
                    .ok_or_else(|| format!("{ip} not imported: pool {pool_key} has no ledger"))?;
                ledger
                    .import(ip)
                    .map_err(|e| format!("{ip} not imported: {e}"))?;
                self.add_ip(ip, pool_key, &group_id, view);
            }
        }
        if let Some(entry) = self.entries.get_mut(key) {
            insert_tight(&mut entry.ips, family, ip);
        }
        self.set_member(&group_id, key, true);
        Ok(())
    }

    /// Decides and applies the allocation of one Service.
    pub(super) fn allocate(&mut self, view: &ServiceView, pass: &Pass<'_>, sink: &mut Sink) {
        self.ensure_entry(view);
        let key = &view.key;
        let Some(entry) = self.entries.get(key) else {
            return;
        };
        let regrouped = !entry.group.is_of(view);
        let ports_changed = entry.ports != view.ports;
        let unchanged = entry.settled.as_ref().is_some_and(|(families, requested)| {
            *families == view.families && view.requested.as_ref() == Ok(requested)
        }) && self.in_named_pool(entry, view);
        if unchanged && !regrouped && !ports_changed && !self.config_changed {
            return;
        }
        if regrouped {
            self.release_all(key, sink, "the sharing key changed");
            if let Some(entry) = self.entries.get_mut(key) {
                entry.group = GroupId::of(view);
            }
        }
        if ports_changed {
            self.reindex_ports(view);
        }
        let failure = self.decide(view, pass, sink);
        if let Some(entry) = self.entries.get_mut(key) {
            entry.settled = match (&failure, &view.requested) {
                (None, Ok(requested)) => Some((view.families.clone(), requested.clone())),
                _ => None,
            };
            entry.failure = failure.map(Box::new);
        }
    }

    /// Whether the pool `view` names (if it names one) is the pool of the addresses its
    /// `entry` holds: without a name, the pool it holds stays its pool
    /// ([`Planner::choose_pool`]), so only a name can move it.
    fn in_named_pool(&self, entry: &Entry, view: &ServiceView) -> bool {
        let Some(name) = &view.pool else {
            return true;
        };
        let held = entry.ips.values().find_map(|ip| self.ips.get(ip));
        match (PoolKey::from_annotation(name), held) {
            (Some(named), Some(used)) => used.pool == named,
            // Nothing held: settled only without addresses to get (no wanted family), a
            // decision that does not depend on the pool.
            (_, None) => true,
            (None, Some(_)) => false,
        }
    }

    /// Emits AllocationFailed when the Service's failure differs from the one last
    /// reported: once per stuck Service, again only when the reason or message changes.
    pub(super) fn report_failure(&mut self, key: &ServiceKey, sink: &mut Sink) {
        if let Some(entry) = self.entries.get_mut(key)
            && entry.failure != entry.reported
        {
            if let Some(f) = &entry.failure {
                sink.event(key, true, reason::ALLOCATION_FAILED, f.message.clone());
            }
            entry.reported = entry.failure.clone();
        }
    }

    /// The allocation decision for one Service.
    fn decide(&mut self, view: &ServiceView, pass: &Pass<'_>, sink: &mut Sink) -> Option<Failure> {
        let key = &view.key;
        let ns = &key.namespace;
        let tenancy = pass.tenancy(ns);
        let requested = match &view.requested {
            Ok(list) => list.as_slice(),
            Err(message) => return Some(Failure::new(reason::INVALID_REQUEST, message.clone())),
        };
        let mut wanted: Vec<Family> = Vec::new();
        for f in &view.families.families {
            if !wanted.contains(f) {
                wanted.push(*f);
            }
        }
        if let Some(failure) = check_request(requested, &wanted) {
            return Some(failure);
        }
        if view.ports.len() > MAX_PORTS_PER_IP {
            self.release_all(
                key,
                sink,
                "the Service has more ports than an address carries",
            );
            return Some(Failure::new(
                reason::TOO_MANY_PORTS,
                format!(
                    "the Service has {} ports, more than the {MAX_PORTS_PER_IP} one address \
                     carries; split it into Services with fewer ports",
                    view.ports.len()
                ),
            ));
        }
        let group_id = self
            .entries
            .get(key)
            .map_or_else(|| GroupId::of(view), |e| e.group.clone());
        let (pool_key, pool) = match self.choose_pool(view, &tenancy, requested, &group_id, pass) {
            Ok(chosen) => chosen,
            Err(failure) if failure.reason == reason::NO_POOL => {
                self.release_all(key, sink, "the namespace has no pool");
                return Some(failure);
            }
            Err(mut failure) => {
                if let Some(held) = self.entries.get(key).filter(|e| !e.ips.is_empty()) {
                    let ips: Vec<IpAddr> = held.ips.values().copied().collect();
                    failure
                        .message
                        .push_str(&format!("; keeping {} for now", join(&ips)));
                }
                return Some(failure);
            }
        };
        self.decide_in(
            view,
            sink,
            &tenancy,
            requested,
            &wanted,
            &group_id,
            (pool_key, pool),
        )
        .map(|f| f.on(pool_key))
    }

    /// The allocation decision for one Service, in the pool chosen for it.
    #[allow(clippy::too_many_arguments)]
    fn decide_in(
        &mut self,
        view: &ServiceView,
        sink: &mut Sink,
        tenancy: &Tenancy<'_>,
        requested: &[IpAddr],
        wanted: &[Family],
        group_id: &GroupId,
        (pool_key, pool): (&PoolKey, &Pool),
    ) -> Option<Failure> {
        let key = &view.key;
        let prefer = wanted.len() > 1 && !view.families.require_all;
        let has = |f: Family| pool.size(f) > 0 || requested.iter().any(|ip| Family::of(*ip) == f);
        let desired: Vec<Family> = if prefer {
            wanted.iter().copied().filter(|f| has(*f)).collect()
        } else {
            wanted.to_vec()
        };
        self.drop_unwanted(key, &desired, sink);
        let lacking: Vec<Family> = desired.iter().copied().filter(|f| !has(*f)).collect();
        if desired.is_empty() || !lacking.is_empty() {
            self.release_all(key, sink, "the pool lacks a family the Service needs");
            let missing = if desired.is_empty() { wanted } else { &lacking };
            let names: Vec<String> = missing.iter().map(ToString::to_string).collect();
            return Some(Failure::new(
                reason::NO_ADDRESS_OF_FAMILY,
                format!(
                    "pool {pool_key} has no {} addresses; add some to the pool or change the \
                     Service's ipFamilies",
                    names.join(" or ")
                ),
            ));
        }

        let current = |planner: &Planner, f: Family| {
            planner
                .entries
                .get(key)
                .and_then(|e| e.ips.get(&f))
                .copied()
        };
        let mut steps = Vec::with_capacity(desired.len());
        let mut failure: Option<Failure> = None;
        let mut missing = false;
        for &family in &desired {
            let cur = current(self, family);
            let req = requested
                .iter()
                .copied()
                .find(|ip| Family::of(*ip) == family);
            let step = match (req, cur) {
                (Some(r), Some(c)) if r == c => Ok(Step::Keep),
                (Some(r), _) => self.check_specific(r, view, group_id, pool_key, pool, tenancy),
                // Kept while in the pool chosen (the one it holds, unless it names another).
                (None, Some(c)) if pool.contains(c) => Ok(Step::Keep),
                (None, _) => self.check_fresh(family, view, group_id, pool_key, pool, tenancy),
            };
            match step {
                Ok(step) => steps.push((family, step)),
                Err(mut f) => {
                    match cur {
                        Some(c) => f.message.push_str(&format!("; keeping {c} for now")),
                        None => missing = true,
                    }
                    failure.get_or_insert(f);
                }
            }
        }
        if missing && !prefer {
            // RequireDualStack or single-stack: all or nothing, never a partial allocation.
            if view.families.require_all {
                self.release_all(
                    key,
                    sink,
                    "RequireDualStack and not every family is available",
                );
            }
            return failure;
        }
        for (family, step) in steps {
            if let Err(f) = self.commit(view, group_id, pool_key, family, step, sink) {
                failure.get_or_insert(f);
            }
        }
        let holds = self.entries.get(key).is_some_and(|e| !e.ips.is_empty());
        self.set_member(group_id, key, holds);
        failure
    }

    /// The one pool `view`'s addresses come from (the rule of [`Tenancy`]): the pool it
    /// names; else, for a namespace with no pool, `NoPool`; else the pool of the addresses
    /// it requests; else the pool of the addresses it holds, or its sharing group holds,
    /// while its namespace keeps that pool; else its namespace's default. Whether it may
    /// draw a new address from it is checked by each step.
    fn choose_pool<'p>(
        &self,
        view: &ServiceView,
        tenancy: &Tenancy<'p>,
        requested: &[IpAddr],
        group_id: &GroupId,
        pass: &Pass<'p>,
    ) -> Result<(&'p PoolKey, &'p Pool), Failure> {
        let config: &'p PoolConfig = pass.inputs.config;
        let ns = tenancy.namespace();
        if let Some(name) = &view.pool {
            return PoolKey::from_annotation(name)
                .and_then(|k| config.keyed(&k))
                .ok_or_else(|| {
                    let name = crate::text::bounded(name.clone(), 64);
                    Failure::new(
                        reason::UNKNOWN_POOL,
                        format!(
                            "aliaslb.io/pool names `{name}`, which is no pool: write the name \
                             of a named pool (`NAME` of a key `pool.NAME`) or `{FALLBACK_KEY}`; \
                             {}",
                            pools_text(tenancy)
                        ),
                    )
                });
        }
        let entry = self.entries.get(&view.key);
        // What it holds, and its sharing group.
        let held_pool = entry
            .into_iter()
            .flat_map(|e| e.ips.values())
            .chain(
                self.groups
                    .get(group_id)
                    .into_iter()
                    .flat_map(|g| g.ips.values()),
            )
            .find_map(|ip| self.ips.get(ip))
            .and_then(|used| config.keyed(&used.pool))
            .filter(|(key, pool)| tenancy.keeps(key, pool));
        if tenancy.is_empty() && held_pool.is_none() {
            return Err(Failure::new(reason::NO_POOL, no_pool(ns)));
        }
        if !requested.is_empty() {
            let mut chosen: Option<(&'p PoolKey, &'p Pool, IpAddr)> = None;
            for &ip in requested {
                let owner = tenancy
                    .pools()
                    .iter()
                    .copied()
                    .find(|(_, pool)| pool.contains(ip))
                    // An address it holds in a pool its namespace only keeps.
                    .or_else(|| {
                        held_pool.filter(|(_, pool)| {
                            pool.contains(ip)
                                && entry.is_some_and(|e| e.ips.values().any(|h| *h == ip))
                        })
                    });
                let Some((key, pool)) = owner else {
                    return Err(Failure::new(
                        reason::REQUESTED_IP_NOT_IN_POOL,
                        not_in_pool(ip, tenancy),
                    ));
                };
                match chosen {
                    Some((other, _, first)) if other != key => {
                        return Err(Failure::new(
                            reason::INVALID_REQUEST,
                            format!(
                                "requests {first} of pool {other} and {ip} of pool {key}: a \
                                 Service's addresses come from one pool"
                            ),
                        ));
                    }
                    Some(_) => {}
                    None => chosen = Some((key, pool, ip)),
                }
            }
            if let Some((key, pool, _)) = chosen {
                return Ok((key, pool));
            }
        }
        if let Some(held) = held_pool {
            return Ok(held);
        }
        tenancy.default_pool().ok_or_else(|| {
            Failure::new(
                reason::NO_DEFAULT_POOL,
                format!(
                    "namespace {ns} may draw from {}, but none assigns addresses unasked ({}): \
                     name one with aliaslb.io/pool, or request an address of one",
                    tenancy.names(),
                    tenancy
                        .pools()
                        .iter()
                        .map(|(key, pool)| format!(
                            "{key}: {}",
                            if pool.is_open() {
                                "autoAssign: false"
                            } else {
                                "draining"
                            }
                        ))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )
        })
    }

    /// Can `view` have the requested `ip`?
    fn check_specific(
        &self,
        ip: IpAddr,
        view: &ServiceView,
        group_id: &GroupId,
        pool_key: &PoolKey,
        pool: &Pool,
        tenancy: &Tenancy<'_>,
    ) -> Result<Step, Failure> {
        let ns = &view.key.namespace;
        if !pool.contains(ip) {
            // The pool chosen holds every address requested, unless the Service names it.
            return Err(Failure::new(
                reason::REQUESTED_IP_NOT_IN_POOL,
                format!(
                    "{ip} is not in pool {pool_key}, which aliaslb.io/pool names; request an \
                     address of it, or name the pool that holds {ip}"
                ),
            ));
        }
        let shared = self.ips.get(&ip).is_some_and(|used| {
            used.group == *group_id && matches!(group_id, GroupId::Shared { .. })
        });
        if !shared {
            check_draw(pool_key, pool, tenancy)?;
            if pool.is_closed(ip) {
                return Err(Failure::new(
                    reason::POOL_DRAINING,
                    format!(
                        "{ip} is draining in pool {pool_key}: no Service gets it anew; \
                         request another address of the pool"
                    ),
                ));
            }
        }
        if let Some(cause) = self.fence_of(ip) {
            let (why, message) = cause.refused(ip);
            return Err(Failure::new(
                why,
                format!("{message}; request another address of the pool"),
            ));
        }
        if let Some(used) = self.ips.get(&ip) {
            if used.group == *group_id && matches!(group_id, GroupId::Shared { .. }) {
                self.check_join(ip, view, pool_key, Some(pool))?;
                return Ok(Step::Share(ip));
            }
            return Err(Failure::new(
                reason::REQUESTED_IP_IN_USE,
                format!(
                    "{ip} is used by {}; request a free address of the pool or share it \
                     with a sharing key",
                    owner_name(used.users.keys().next(), ns)
                ),
            ));
        }
        if let GroupId::Shared { key: sharing, .. } = group_id
            && let Some(&other) = self
                .groups
                .get(group_id)
                .and_then(|g| g.ips.get(&Family::of(ip)))
            && self
                .ips
                .get(&other)
                .is_some_and(|u| u.users.keys().any(|user| *user != view.key))
        {
            return Err(Failure::new(
                reason::SHARING_KEY_CONFLICT,
                format!(
                    "{ip} is requested, but the Services with sharing key {sharing} already \
                     share {other}; request {other} or use another sharing key"
                ),
            ));
        }
        if let Some(owner) = self.reserved_for(ip)
            && *owner != view.key
        {
            return Err(Failure::new(
                reason::REQUESTED_IP_RESERVED,
                format!(
                    "{ip} is held for {}, deleted less than {} ago, in case it is \
                     re-created; request another address, or wait until then",
                    owner_name(Some(owner), ns),
                    hold_text(self.hold.0)
                ),
            ));
        }
        Ok(Step::Take(ip))
    }

    /// For a message of an exhausted pool: which of `pool`'s addresses of `family` are
    /// held for deleted Services (empty when none is). O(reserved).
    fn reserved_note(&self, pool: &Pool, family: Family) -> String {
        let held: Vec<String> = self
            .reserved
            .iter()
            .filter(|(ip, _)| Family::of(**ip) == family && pool.contains(**ip))
            .map(|(ip, key)| format!("{ip} for {key}"))
            .collect();
        let count = match held.len() {
            0 => return String::new(),
            1 => "1 of them is held for a deleted Service".to_owned(),
            n => format!("{n} of them are held for deleted Services"),
        };
        format!(
            "; {count} in case it is re-created, for {} after its deletion ({})",
            hold_text(self.hold.0),
            super::withheld::named(held)
        )
    }

    /// How can `view` get an address of `family` it has not asked for by name?
    fn check_fresh(
        &self,
        family: Family,
        view: &ServiceView,
        group_id: &GroupId,
        pool_key: &PoolKey,
        pool: &Pool,
        tenancy: &Tenancy<'_>,
    ) -> Result<Step, Failure> {
        if let GroupId::Shared { key: sharing, .. } = group_id
            && let Some(&ip) = self.groups.get(group_id).and_then(|g| g.ips.get(&family))
        {
            if !pool.contains(ip) {
                let other = self
                    .ips
                    .get(&ip)
                    .map(|u| u.pool.to_string())
                    .unwrap_or_default();
                return Err(Failure::new(
                    reason::SHARING_KEY_CONFLICT,
                    format!(
                        "the Services with sharing key {sharing} share {ip} of pool {other}, \
                         but this Service draws from pool {pool_key}; name the same pool, or \
                         use another sharing key"
                    ),
                ));
            }
            self.check_join(ip, view, pool_key, Some(pool))?;
            return Ok(Step::Share(ip));
        }
        check_draw(pool_key, pool, tenancy)?;
        let Some(ledger) = self.ledgers.get(pool_key) else {
            return Err(Failure::new(reason::NO_POOL, no_pool(&view.key.namespace)));
        };
        let sticky = self.recent.get(&view.key).iter().copied().find(|ip| {
            Family::of(*ip) == family
                && pool.contains(*ip)
                && !ledger.is_closed(*ip)
                && (!ledger.is_in_use(*ip)
                    || (self.reserved_for(*ip) == Some(&view.key)
                        && self.fence_of(*ip).is_none()
                        && !self.quarantined.contains(ip)))
        });
        if let Some(ip) = sticky {
            return Ok(Step::Take(ip));
        }
        let usage = ledger.usage(family);
        // No address of the family is open: every one in use is draining.
        let draining = ledger.draining(family);
        if usage.free() == 0 && usage.in_use == draining {
            return Err(Failure::new(
                reason::POOL_DRAINING,
                format!(
                    "pool {pool_key} is draining: no {family} address of it is handed out anew; \
                     name another pool with aliaslb.io/pool"
                ),
            ));
        }
        if usage.free() == 0 {
            let single_family = [Family::V4, Family::V6]
                .iter()
                .filter(|f| pool.size(**f) > 0)
                .count()
                == 1;
            let what = if single_family {
                String::new()
            } else {
                format!("{family} ")
            };
            let (why, note) = self.withheld_note(pool_key, family);
            let held = self.reserved_note(pool, family);
            let draining = match draining {
                0 => String::new(),
                n => format!("; {n} of them are draining (left to move), none is handed out anew"),
            };
            return Err(Failure::new(
                why,
                format!(
                    "all {} {what}addresses of pool {pool_key} are in use{draining}{note}{held}",
                    usage.total
                ),
            ));
        }
        Ok(Step::Fresh(family))
    }

    /// Can `view` use `ip`, which its sharing group uses? No port may clash, and sharing
    /// must be allowed by `pool`'s options (not checked when `pool` is `None`).
    fn check_join(
        &self,
        ip: IpAddr,
        view: &ServiceView,
        pool_key: &PoolKey,
        pool: Option<&Pool>,
    ) -> Result<(), Failure> {
        let Some(used) = self.ips.get(&ip) else {
            return Ok(());
        };
        let other = used.users.keys().find(|u| **u != view.key);
        if pool.is_some_and(|p| !p.options.allow_sharing)
            && let Some(other) = other
        {
            return Err(Failure::new(
                reason::SHARING_NOT_ALLOWED,
                format!(
                    "{other} uses {ip} with sharing key {}, but pool {pool_key} does not allow \
                     sharing (allowSharing: false)",
                    view.sharing_key.as_deref().unwrap_or_default()
                ),
            ));
        }
        for port in &view.ports {
            if let Some(owner) = used.ports.get(port)
                && *owner != view.key
            {
                return Err(Failure::new(
                    reason::PORT_CLASH,
                    format!(
                        "port {port} on {ip} is already used by {owner}, which shares the \
                         address; use another port or sharing key"
                    ),
                ));
            }
        }
        let others = used.ports.values().filter(|o| **o != view.key).count();
        if others + view.ports.len() > MAX_PORTS_PER_IP {
            return Err(Failure::new(
                reason::TOO_MANY_PORTS,
                format!(
                    "sharing {ip} would put {} ports on it, more than the {MAX_PORTS_PER_IP} \
                     one address carries ({others} of the Services already sharing it); use \
                     another sharing key",
                    others + view.ports.len()
                ),
            ));
        }
        Ok(())
    }

    /// Applies one checked step.
    fn commit(
        &mut self,
        view: &ServiceView,
        group_id: &GroupId,
        pool_key: &PoolKey,
        family: Family,
        step: Step,
        sink: &mut Sink,
    ) -> Result<(), Failure> {
        let key = &view.key;
        if matches!(step, Step::Keep) {
            return Ok(());
        }
        if let Some(old) = self
            .entries
            .get_mut(key)
            .and_then(|e| e.ips.remove(&family))
        {
            self.drop_ip(key, old);
            let to = match step {
                Step::Take(ip) if view.requested.as_ref().is_ok_and(|r| r.contains(&ip)) => {
                    "the requested address".to_owned()
                }
                _ => format!("pool {pool_key}"),
            };
            sink.event(
                key,
                false,
                reason::RELEASED,
                format!("released {old}: moving to {to}"),
            );
        }
        let (ip, shared) = match step {
            Step::Keep => return Ok(()),
            Step::Share(ip) => {
                self.join(ip, view);
                (ip, true)
            }
            Step::Take(ip) => {
                // Its own address back from the reservation of a deleted Service.
                self.unreserve_for(ip, key);
                self.ledger(pool_key, &key.namespace)?
                    .allocate_specific(ip)
                    .map_err(alloc_failure)?;
                self.add_ip(ip, pool_key, group_id, view);
                (ip, false)
            }
            Step::Fresh(family) => {
                let ip = self
                    .ledger(pool_key, &key.namespace)?
                    .allocate(family)
                    .map_err(alloc_failure)?;
                self.add_ip(ip, pool_key, group_id, view);
                (ip, false)
            }
        };
        if let Some(entry) = self.entries.get_mut(key) {
            insert_tight(&mut entry.ips, family, ip);
        }
        // Re-created and served: what was held for it and not taken back goes back.
        self.end_reservations(key);
        let how = match (&view.sharing_key, shared) {
            (Some(sharing), true) => format!(", shared under sharing key {sharing}"),
            _ => String::new(),
        };
        sink.event(
            key,
            false,
            reason::IP_ALLOCATED,
            format!("assigned {ip} from pool {pool_key}{how}"),
        );
        Ok(())
    }

    /// The ledger of `pool_key` (built from the config, so always there).
    fn ledger(&mut self, pool_key: &PoolKey, ns: &str) -> Result<&mut Ledger, Failure> {
        self.ledgers
            .get_mut(pool_key)
            .ok_or_else(|| Failure::new(reason::NO_POOL, no_pool(ns)))
    }

    /// Records a newly taken `ip` (already marked in the ledger) as used by `view`.
    fn add_ip(&mut self, ip: IpAddr, pool_key: &PoolKey, group_id: &GroupId, view: &ServiceView) {
        let ports = tight_map(view.ports.iter().map(|p| (p.clone(), view.key.clone())));
        self.ips.insert(
            ip,
            Box::new(IpUse {
                pool: pool_key.clone(),
                group: group_id.clone(),
                users: tight_map([(view.key.clone(), ())]),
                ports,
            }),
        );
        let group = self.groups.entry(group_id.clone()).or_default();
        insert_tight(&mut group.ips, Family::of(ip), ip);
    }

    /// Adds `view` as a user of its group's `ip` (checked with [`Planner::check_join`]).
    fn join(&mut self, ip: IpAddr, view: &ServiceView) {
        if let Some(used) = self.ips.get_mut(&ip) {
            used.users.insert(view.key.clone(), ());
            for port in &view.ports {
                used.ports
                    .entry(port.clone())
                    .or_insert_with(|| view.key.clone());
            }
        }
    }

    /// Creates the Service's entry on first sight.
    fn ensure_entry(&mut self, view: &ServiceView) {
        if !self.entries.contains_key(&view.key) {
            self.entries.insert(
                view.key.clone(),
                Box::new(Entry {
                    uid: view.uid.clone(),
                    group: GroupId::of(view),
                    ips: Default::default(),
                    ports: view.ports.clone(),
                    failure: None,
                    reported: None,
                    conflict: None,
                    settled: None,
                }),
            );
        }
    }

    /// Releases every IP of `key`, with a Released Event saying `why`.
    fn release_all(&mut self, key: &ServiceKey, sink: &mut Sink, why: &str) {
        let Some(entry) = self.entries.get_mut(key) else {
            return;
        };
        if entry.ips.is_empty() {
            return;
        }
        let ips: Vec<IpAddr> = std::mem::take(&mut entry.ips).values().copied().collect();
        let group = entry.group.clone();
        for ip in &ips {
            self.drop_ip(key, *ip);
        }
        self.set_member(&group, key, false);
        sink.event(
            key,
            false,
            reason::RELEASED,
            format!("released {}: {why}", join(&ips)),
        );
    }

    /// Releases the IPs of families the Service no longer wants.
    fn drop_unwanted(&mut self, key: &ServiceKey, desired: &[Family], sink: &mut Sink) {
        let Some(entry) = self.entries.get_mut(key) else {
            return;
        };
        let unwanted: Vec<IpAddr> = entry
            .ips
            .iter()
            .filter(|(f, _)| !desired.contains(f))
            .map(|(_, ip)| *ip)
            .collect();
        for ip in unwanted {
            if let Some(entry) = self.entries.get_mut(key) {
                entry.ips.remove(&Family::of(ip));
            }
            self.drop_ip(key, ip);
            sink.event(
                key,
                false,
                reason::RELEASED,
                format!(
                    "released {ip}: the Service no longer asks for {}",
                    Family::of(ip)
                ),
            );
        }
    }

    /// The Service's ports changed: re-index them on its IPs. An IP where a new port clashes
    /// with another user is given up (the allocation step then reports the clash).
    fn reindex_ports(&mut self, view: &ServiceView) {
        let key = &view.key;
        let Some(entry) = self.entries.get_mut(key) else {
            return;
        };
        entry.ports = view.ports.clone();
        let ips: Vec<IpAddr> = entry.ips.values().copied().collect();
        for ip in ips {
            let Some(used) = self.ips.get_mut(&ip) else {
                continue;
            };
            used.ports.retain(|_, owner| owner != key);
            // A clash with a sharer's port, or more ports than the address carries: it
            // leaves the address (and tries to join again, failing with the reason).
            let clash = view
                .ports
                .iter()
                .any(|p| used.ports.get(p).is_some_and(|owner| owner != key))
                || used.ports.len() + view.ports.len() > MAX_PORTS_PER_IP;
            if clash {
                self.drop_ip(key, ip);
                if let Some(entry) = self.entries.get_mut(key) {
                    entry.ips.remove(&Family::of(ip));
                }
            } else {
                for port in &view.ports {
                    used.ports.insert(port.clone(), key.clone());
                }
            }
        }
    }
}

/// At most one requested IP per family, and only of families the Service asks for.
/// The first node by name whose agent may still be running (fresh or unconfirmed) and
/// reports holding one of `ips`, with its name shared as the nodes give it.
fn untrusted_holder<'i>(
    inputs: &Inputs<'_>,
    ips: impl Iterator<Item = &'i IpAddr> + Clone,
) -> Option<std::sync::Arc<str>> {
    inputs
        .nodes
        .iter()
        .filter(|n| n.agent_ready || n.agent_unconfirmed)
        .filter(|n| {
            inputs
                .agents
                .get(&*n.name)
                .is_some_and(|r| ips.clone().any(|ip| r.held.contains(ip)))
        })
        .map(|n| n.name.clone())
        .min()
}

fn check_request(requested: &[IpAddr], wanted: &[Family]) -> Option<Failure> {
    if wanted.is_empty() {
        return Some(Failure::new(
            reason::INVALID_REQUEST,
            "the Service asks for no IP family (spec.ipFamilies is empty)",
        ));
    }
    for (i, ip) in requested.iter().enumerate() {
        let family = Family::of(*ip);
        if let Some(other) = requested[..i].iter().find(|o| Family::of(**o) == family) {
            return Some(Failure::new(
                reason::INVALID_REQUEST,
                format!(
                    "requests both {other} and {ip}: at most one {family} address can be requested"
                ),
            ));
        }
        if !wanted.contains(&family) {
            return Some(Failure::new(
                reason::INVALID_REQUEST,
                format!("requests {ip}, but the Service's ipFamilies do not include {family}"),
            ));
        }
    }
    None
}

/// Message for a namespace without a pool.
fn no_pool(ns: &str) -> String {
    format!("namespace {ns} has no pool and no {FALLBACK_KEY} pool is configured")
}

/// Message for an IP outside the pools of the namespace, listing each pool's first ranges
/// (the classic message when it has one pool). Names no other namespace's pool.
fn not_in_pool(ip: IpAddr, tenancy: &Tenancy<'_>) -> String {
    let ns = tenancy.namespace();
    match tenancy.pools() {
        [] => format!("{ip} is not in a pool: {}", no_pool(ns)),
        [(key, pool)] => {
            let which = match key {
                PoolKey::Fallback => format!("{FALLBACK_KEY}: "),
                PoolKey::Named(key) => format!("{key}: "),
                PoolKey::Namespace(_) => String::new(),
            };
            format!(
                "{ip} is not in the pool of namespace {ns} ({which}{})",
                first_ranges(pool)
            )
        }
        pools => {
            let each: Vec<String> = pools
                .iter()
                .map(|(key, pool)| format!("{key}: {}", first_ranges(pool)))
                .collect();
            format!(
                "{ip} is not in a pool of namespace {ns} ({})",
                each.join("; ")
            )
        }
    }
}

/// A pool's first ranges, `a, b, c, ...`.
fn first_ranges(pool: &Pool) -> String {
    const SHOWN: usize = 3;
    let mut ranges: Vec<String> = pool
        .ranges
        .iter()
        .take(SHOWN)
        .map(ToString::to_string)
        .collect();
    if pool.ranges.len() > SHOWN {
        ranges.push("...".to_owned());
    }
    ranges.join(", ")
}

/// `namespace N may draw from a, b` (or from no pool), for messages.
fn pools_text(tenancy: &Tenancy<'_>) -> String {
    if tenancy.is_empty() {
        format!("namespace {} may draw from no pool", tenancy.namespace())
    } else {
        format!(
            "namespace {} may draw from {}",
            tenancy.namespace(),
            tenancy.names()
        )
    }
}

/// The tenant fence: a new address only from a pool the namespace may draw from.
fn check_draw(pool_key: &PoolKey, pool: &Pool, tenancy: &Tenancy<'_>) -> Result<(), Failure> {
    if tenancy.may_draw(pool_key) {
        return Ok(());
    }
    let ns = tenancy.namespace();
    let why = if tenancy.keeps(pool_key, pool) {
        format!(
            "namespace {ns} may not draw new addresses from pool {pool_key}: its labels do \
             not match the pool's namespaceSelector (addresses its Services hold there stay \
             theirs)"
        )
    } else {
        format!("namespace {ns} may not draw from pool {pool_key}")
    };
    Err(Failure::new(
        reason::POOL_NOT_ALLOWED,
        format!("{why}; {}", pools_text(tenancy)),
    ))
}

/// Names the Service using an address, unless it is in another namespace (tenants do not
/// learn each other's Service names).
/// `10 min`, or `90 s` when not a whole number of minutes.
fn hold_text(hold: std::time::Duration) -> String {
    let secs = hold.as_secs();
    if secs.is_multiple_of(60) {
        format!("{} min", secs / 60)
    } else {
        format!("{secs} s")
    }
}

fn owner_name(owner: Option<&ServiceKey>, ns: &str) -> String {
    match owner {
        Some(owner) if &*owner.namespace == ns => owner.to_string(),
        _ => "a Service in another namespace".to_owned(),
    }
}

/// A ledger error that the checks should have prevented, as a failure.
fn alloc_failure(e: AllocError) -> Failure {
    let reason = match e {
        AllocError::Exhausted { .. } => reason::POOL_EXHAUSTED,
        AllocError::NoFamily { .. } => reason::NO_ADDRESS_OF_FAMILY,
        AllocError::NotInPool { .. } => reason::REQUESTED_IP_NOT_IN_POOL,
        AllocError::InUse { .. } => reason::REQUESTED_IP_IN_USE,
    };
    Failure::new(reason, e.to_string())
}
