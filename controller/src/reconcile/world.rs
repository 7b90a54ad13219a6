//! What one leadership term has observed, kept between passes and brought up to date from
//! what changed, so that a pass after one change reads what that change can affect and
//! no more (the planner's [`Changes`]).
//!
//! - Services and endpoints (one object per Service, 10,000s of them) are re-read by key:
//!   the caches note the keys their watches changed ([`crate::watch::Dirty`]). A relist,
//!   and the first pass of a term, read everything.
//! - Nodes and agent reports (one per node) are compared whole on every pass: a node whose
//!   [`NodeState`] or agent (freshness, report) differs from the last pass changed. That
//!   also catches the changes no watch event brings: an agent going stale.
//!
//! Pure bookkeeping over the caches: no API call.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use aliaslb_core::election::NodeState;
use aliaslb_core::plan::{ServiceKey, ServiceView};
use aliaslb_core::report::AgentReport;

use crate::observe::agents::Freshness;
use crate::observe::endpoints;
use crate::observe::service::ServiceRecord;
use crate::watch::{Caches, Dirty};

/// Node name -> (freshness, report) of its agent.
pub(super) type AgentViews = BTreeMap<String, (Freshness, AgentReport)>;

/// The term's copy of what the caches hold, as of the last pass.
#[derive(Debug, Default)]
pub(super) struct World {
    /// Every Service record (ours, and those that are not ours but carry our marks).
    pub records: HashMap<ServiceKey, Arc<ServiceRecord>>,
    /// The records that are not ours but carry our marks (cleaned up, and their IPs
    /// lingering).
    pub strangers: BTreeMap<ServiceKey, Arc<ServiceRecord>>,
    /// Our `externalTrafficPolicy: Local` Services.
    local_services: BTreeSet<ServiceKey>,
    /// Nodes with a ready endpoint, per `externalTrafficPolicy: Local` Service.
    pub local: BTreeMap<ServiceKey, BTreeSet<String>>,
    /// The node states of the last pass, by name.
    nodes: BTreeMap<String, NodeState>,
    /// The agents of the last pass.
    agents: AgentViews,
    /// Whether a first pass read everything.
    seeded: bool,
}

/// What changed in the Services since the last pass.
#[derive(Debug, Default)]
pub(super) struct ServiceDelta {
    /// Everything was read afresh (first pass, relist).
    pub everything: bool,
    /// Keys whose record changed, appeared or went (ours or not): their writes are looked
    /// at again.
    pub records: Vec<ServiceKey>,
    /// Our Services whose view changed: the new view, or `None` when it is no longer ours.
    pub views: Vec<(ServiceKey, Option<Arc<ServiceView>>)>,
    /// Whether a stranger appeared, changed or went.
    pub strangers: bool,
}

impl World {
    /// Brings the Service records up to date: every record when `dirty` says a relist
    /// happened or on the first pass, else the keys `dirty` names.
    pub fn services(&mut self, caches: &Caches, dirty: &Dirty) -> ServiceDelta {
        if dirty.everything || !self.seeded {
            self.seeded = true;
            let records: HashMap<ServiceKey, Arc<ServiceRecord>> = caches
                .services
                .snapshot()
                .into_iter()
                .map(|r| (r.key.clone(), r))
                .collect();
            let mut gone: Vec<ServiceKey> = self
                .records
                .keys()
                .filter(|k| !records.contains_key(*k))
                .cloned()
                .collect();
            gone.sort();
            self.strangers = records
                .values()
                .filter(|r| r.view.is_none())
                .map(|r| (r.key.clone(), r.clone()))
                .collect();
            self.records = records;
            let mut keys: Vec<ServiceKey> = self.records.keys().cloned().collect();
            keys.sort();
            let views = keys
                .iter()
                .map(|k| (k.clone(), self.records[k].view.clone()))
                .collect();
            keys.extend(gone);
            self.local_services = self.local_keys();
            return ServiceDelta {
                everything: true,
                records: keys,
                views,
                strangers: true,
            };
        }
        let mut delta = ServiceDelta::default();
        let mut keys: Vec<&ServiceKey> = dirty.services.iter().collect();
        keys.sort();
        for key in keys {
            let new = caches.services.get(key);
            let old = self.records.get(key);
            if match (&new, old) {
                (Some(new), Some(old)) => Arc::ptr_eq(new, old) || new == old,
                (None, None) => true,
                _ => false,
            } {
                continue;
            }
            delta.records.push(key.clone());
            let old_view = old.and_then(|r| r.view.clone());
            let new_view = new.as_ref().and_then(|r| r.view.clone());
            if old_view != new_view {
                delta.views.push((key.clone(), new_view.clone()));
                let local = new_view.as_ref().is_some_and(|v| v.local_traffic);
                if local {
                    self.local_services.insert(key.clone());
                } else {
                    self.local_services.remove(key);
                }
            }
            let was_stranger = old.is_some_and(|r| r.view.is_none());
            match new {
                Some(record) => {
                    let stranger = record.view.is_none();
                    if stranger {
                        self.strangers.insert(key.clone(), record.clone());
                    } else if was_stranger {
                        self.strangers.remove(key);
                    }
                    delta.strangers |= stranger || was_stranger;
                    self.records.insert(key.clone(), record);
                }
                None => {
                    self.records.remove(key);
                    if was_stranger {
                        self.strangers.remove(key);
                        delta.strangers = true;
                    }
                }
            }
        }
        delta
    }

    /// Our `externalTrafficPolicy: Local` Services, read from every record.
    fn local_keys(&self) -> BTreeSet<ServiceKey> {
        self.records
            .values()
            .filter_map(|r| r.view.as_ref())
            .filter(|v| v.local_traffic)
            .map(|v| v.key.clone())
            .collect()
    }

    /// Every view of ours, in no particular order (a full pass's input).
    pub fn views(&self) -> Vec<Arc<ServiceView>> {
        self.records
            .values()
            .filter_map(|r| r.view.clone())
            .collect()
    }

    /// Brings the endpoints of the `externalTrafficPolicy: Local` Services up to date and
    /// returns the Services whose nodes changed. Reads the endpoint cache only when an
    /// endpoint object of such a Service changed, or such a Service appeared or went.
    pub fn endpoints(
        &mut self,
        caches: &Caches,
        dirty: &Dirty,
        services: &ServiceDelta,
    ) -> BTreeSet<ServiceKey> {
        let relevant = services.everything
            || dirty.everything
            || services
                .views
                .iter()
                .any(|(k, _)| self.local_services.contains(k) || self.local.contains_key(k))
            || dirty
                .endpoints
                .iter()
                .any(|k| self.local_services.contains(k));
        if !relevant {
            return BTreeSet::new();
        }
        let local = if self.local_services.is_empty() {
            BTreeMap::new()
        } else {
            let objects = caches.endpoints.snapshot();
            let wanted = &self.local_services;
            endpoints::local_endpoints(objects.iter().map(|o| &**o), |k| wanted.contains(k))
        };
        let keys: BTreeSet<&ServiceKey> = local.keys().chain(self.local.keys()).collect();
        let changed = keys
            .into_iter()
            .filter(|k| local.get(*k) != self.local.get(*k))
            .cloned()
            .collect();
        self.local = local;
        changed
    }

    /// The nodes whose state or agent differs from the last pass (appeared and gone
    /// included); remembers these.
    pub fn nodes_changed(&mut self, nodes: &[NodeState], agents: &AgentViews) -> BTreeSet<String> {
        let mut changed = BTreeSet::new();
        let states: BTreeMap<String, NodeState> =
            nodes.iter().map(|n| (n.name.clone(), n.clone())).collect();
        for name in states.keys().chain(self.nodes.keys()) {
            if states.get(name) != self.nodes.get(name) {
                changed.insert(name.clone());
            }
        }
        for name in agents.keys().chain(self.agents.keys()) {
            if agents.get(name) != self.agents.get(name) {
                changed.insert(name.clone());
            }
        }
        self.nodes = states;
        self.agents = agents.clone();
        changed
    }
}
