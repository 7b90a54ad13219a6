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
//! - Namespace labels are read again when the Namespace cache changed since the last pass
//!   (its change counter moved), not otherwise; they are no change the planner is told of
//!   ([`aliaslb_core::plan::Inputs::namespaces`]).
//!
//! Pure bookkeeping over the caches: no API call.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use aliaslb_core::election::NodeState;
use aliaslb_core::plan::{Reports, ServiceKey, ServiceView};
use aliaslb_core::pool::Labels;
use aliaslb_core::report::AgentReport;

use crate::observe::agents::Freshness;
use crate::observe::endpoints::{self, EndpointNodes};
use crate::observe::service::ServiceRecord;
use crate::store::Records;
use crate::watch::Dirty;

/// Node name -> (freshness, report) of its agent.
pub(super) type AgentViews = BTreeMap<String, (Freshness, Arc<AgentReport>)>;

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
    /// Every agent, by node: its freshness and report (shared with [`World::reports`], the
    /// Lease cache and the planner: one copy of each report in the controller).
    agents: AgentViews,
    /// The agents' reports, by node (what the planner reads).
    reports: Reports,
    /// Whether a first pass read everything.
    seeded: bool,
    /// Every namespace's labels, as of the last pass.
    pub namespaces: BTreeMap<String, Labels>,
    /// The Namespace cache's change counter when [`World::namespaces`] was read.
    namespace_changes: Option<u64>,
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
    /// Our Services (before and after) whose ports changed: the one part of a view their
    /// assignment lines show. A view that changed elsewhere (its status: our own write
    /// landing) changes no line unless its plan does.
    pub ports: HashSet<ServiceKey>,
    /// Whether a stranger appeared, changed or went.
    pub strangers: bool,
}

impl World {
    /// Brings the namespace labels up to date when the Namespace cache changed since the
    /// last pass (`changes`: its counter now).
    pub fn namespaces(
        &mut self,
        cache: &kube::runtime::reflector::Store<
            kube::core::PartialObjectMeta<k8s_openapi::api::core::v1::Namespace>,
        >,
        changes: u64,
    ) {
        if self.namespace_changes == Some(changes) {
            return;
        }
        self.namespace_changes = Some(changes);
        let objects = cache.state();
        self.namespaces = crate::observe::namespaces::labels(objects.iter().map(|n| &n.metadata));
    }

    /// Brings the Service records up to date: every record when `dirty` says a relist
    /// happened or on the first pass, else the keys `dirty` names.
    pub fn services(&mut self, cache: &Records<ServiceRecord>, dirty: &Dirty) -> ServiceDelta {
        if dirty.everything || !self.seeded {
            self.seeded = true;
            let records: HashMap<ServiceKey, Arc<ServiceRecord>> = cache
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
                // Every node is rendered after a full read.
                ports: HashSet::new(),
                strangers: true,
            };
        }
        let mut delta = ServiceDelta::default();
        let mut keys: Vec<&ServiceKey> = dirty.services.iter().collect();
        keys.sort();
        for key in keys {
            let new = cache.get(key);
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
                if let (Some(old), Some(new)) = (&old_view, &new_view)
                    && old.ports != new.ports
                {
                    delta.ports.insert(key.clone());
                }
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
        cache: &Records<EndpointNodes>,
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
            let objects = cache.snapshot();
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

    /// The nodes whose state differs from the last pass (appeared and gone included);
    /// remembers these. Each node keeps the name it had (one shared name per node in the
    /// planner's groups and plans, whichever pass placed them).
    pub fn nodes_changed(&mut self, nodes: &mut [NodeState]) -> BTreeSet<String> {
        let mut changed = BTreeSet::new();
        for node in nodes.iter_mut() {
            if let Some(last) = self.nodes.get(&*node.name) {
                node.name = last.name.clone();
            }
        }
        let states: BTreeMap<String, NodeState> = nodes
            .iter()
            .map(|n| (n.name.to_string(), n.clone()))
            .collect();
        for name in states.keys().chain(self.nodes.keys()) {
            if states.get(name) != self.nodes.get(name) {
                changed.insert(name.clone());
            }
        }
        self.nodes = states;
        changed
    }

    /// Every agent by node: freshness and report.
    pub fn agents(&self) -> &AgentViews {
        &self.agents
    }

    /// Every agent's report by node.
    pub fn reports(&self) -> &Reports {
        &self.reports
    }

    /// Sets the agent of `node`: its freshness, and its report (`None`: as before).
    /// Returns whether either changed.
    pub fn set_agent(
        &mut self,
        node: &str,
        freshness: Freshness,
        report: Option<Arc<AgentReport>>,
    ) -> bool {
        match self.agents.get_mut(node) {
            Some((fresh, old)) => {
                let mut changed = *fresh != freshness;
                *fresh = freshness;
                if let Some(report) = report
                    && !Arc::ptr_eq(old, &report)
                {
                    changed |= **old != *report;
                    self.reports.insert(node.to_owned(), report.clone());
                    *old = report;
                }
                changed
            }
            None => {
                let report = report.unwrap_or_default();
                self.reports.insert(node.to_owned(), report.clone());
                self.agents.insert(node.to_owned(), (freshness, report));
                true
            }
        }
    }

    /// Forgets the agents of the nodes not in `present` (their Lease went); returns them.
    pub fn forget_agents_but(&mut self, present: &HashSet<&str>) -> Vec<String> {
        let gone: Vec<String> = self
            .agents
            .keys()
            .filter(|n| !present.contains(n.as_str()))
            .cloned()
            .collect();
        for node in &gone {
            self.agents.remove(node);
            self.reports.remove(node);
        }
        gone
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ControllerConfig;
    use crate::store;
    use aliaslb_testenv::fixtures::lb_service;
    use k8s_openapi::api::core::v1::{EndpointAddress, EndpointSubset, Endpoints, Service};
    use kube::runtime::watcher::Event;

    fn keep(svc: &Service) -> Option<ServiceRecord> {
        ServiceRecord::keep(svc, &ControllerConfig::default())
    }

    fn key(name: &str) -> ServiceKey {
        ServiceKey::new("a", name)
    }

    fn dirty(names: &[&str]) -> Dirty {
        Dirty {
            services: names.iter().map(|n| key(n)).collect(),
            ..Dirty::default()
        }
    }

    fn endpoints(name: &str, nodes: &[&str]) -> Endpoints {
        let mut ep = Endpoints::default();
        ep.metadata.namespace = Some("a".into());
        ep.metadata.name = Some(name.into());
        ep.subsets = Some(vec![EndpointSubset {
            addresses: Some(
                nodes
                    .iter()
                    .map(|n| EndpointAddress {
                        ip: "10.1.0.1".into(),
                        node_name: Some((*n).into()),
                        ..EndpointAddress::default()
                    })
                    .collect(),
            ),
            ..EndpointSubset::default()
        }]);
        ep
    }

    /// A Service seen again (each write of ours brings a new version) keeps the key, uid
    /// and, while unchanged, the view of the record it replaces: the planner and the index
    /// hold those. The Services of a namespace share its name.
    #[test]
    fn a_record_seen_again_shares_its_key_uid_and_view() {
        let (cache, mut writer) = store::records(keep);
        writer.apply(&Event::Init);
        for name in ["web", "db"] {
            writer.apply(&Event::InitApply(lb_service("a", name).build()));
        }
        writer.apply(&Event::InitDone);
        let before = cache.get(&key("web")).unwrap();
        let db = cache.get(&key("db")).unwrap();
        assert!(Arc::ptr_eq(&before.key.namespace, &db.key.namespace));
        let view = |r: &ServiceRecord| r.view.clone().expect("ours");

        let mut again = lb_service("a", "web").build();
        again.metadata.resource_version = Some("2".into());
        writer.apply(&Event::Apply(again));
        let after = cache.get(&key("web")).unwrap();
        assert!(!Arc::ptr_eq(&before, &after), "a record of its own");
        assert_eq!(after.resource_version.as_deref(), Some("2"));
        assert!(Arc::ptr_eq(&before.key.name, &after.key.name));
        assert!(Arc::ptr_eq(&before.uid, &after.uid));
        assert!(
            Arc::ptr_eq(&view(&before), &view(&after)),
            "the view is the same"
        );

        // A changed view is a new one, with the key and uid shared.
        writer.apply(&Event::Apply(lb_service("a", "web").port(8080).build()));
        let changed = view(&cache.get(&key("web")).unwrap());
        assert!(!Arc::ptr_eq(&view(&before), &changed));
        assert_ne!(*view(&before), *changed);
        assert!(Arc::ptr_eq(&changed.key.name, &before.key.name));
        assert!(Arc::ptr_eq(&changed.key.namespace, &db.key.namespace));
        assert!(Arc::ptr_eq(&changed.uid, &before.uid));

        // A relist shares with the records it replaces, and a new uid is not shared.
        writer.apply(&Event::Init);
        writer.apply(&Event::InitApply(lb_service("a", "web").port(8080).build()));
        let mut recreated = lb_service("a", "db").build();
        recreated.metadata.uid = Some("another".into());
        writer.apply(&Event::InitApply(recreated));
        writer.apply(&Event::InitDone);
        assert!(Arc::ptr_eq(
            &view(&cache.get(&key("web")).unwrap()),
            &changed
        ));
        let recreated = cache.get(&key("db")).unwrap();
        assert_eq!(&*recreated.uid, "another");
        assert_eq!(&*view(&recreated).uid, "another");
        assert!(Arc::ptr_eq(&recreated.key.name, &db.key.name));
    }

    #[tokio::test]
    async fn services_are_read_by_the_keys_that_changed_and_everything_after_a_relist() {
        let (cache, mut writer) = store::records(keep);
        writer.apply(&Event::Init);
        for name in ["web", "db", "old"] {
            writer.apply(&Event::InitApply(lb_service("a", name).build()));
        }
        writer.apply(&Event::InitDone);
        let mut world = World::default();

        let first = world.services(&cache, &Dirty::default());
        assert!(first.everything, "the first pass reads everything");
        assert_eq!(first.views.len(), 3);
        assert_eq!(world.views().len(), 3);

        // Nothing noted: nothing read, even though the cache changed meanwhile.
        writer.apply(&Event::Apply(lb_service("a", "web").port(443).build()));
        let quiet = world.services(&cache, &Dirty::default());
        assert!(!quiet.everything && quiet.records.is_empty() && quiet.views.is_empty());

        // Noted: the new view; a noted key whose record is the same is no change.
        let delta = world.services(&cache, &dirty(&["web", "db"]));
        assert_eq!(delta.records, [key("web")]);
        assert_eq!(delta.views.len(), 1);
        assert_eq!(delta.views[0].0, key("web"));
        assert_eq!(delta.views[0].1.as_ref().unwrap().ports[0].port, 443);
        assert_eq!(delta.ports, HashSet::from([key("web")]), "its lines change");
        assert!(!delta.strangers);

        // Our status write landing: a view change (the quarantine reads it), no line change.
        let written = lb_service("a", "web").port(443).with_ingress(&["10.0.0.1"]);
        writer.apply(&Event::Apply(written.build()));
        let delta = world.services(&cache, &dirty(&["web"]));
        assert_eq!(delta.views.len(), 1);
        assert!(delta.ports.is_empty(), "{:?}", delta.ports);

        // No longer ours but with our marks: a stranger, and its view goes.
        writer.apply(&Event::Apply(
            lb_service("a", "db")
                .on_node("n1")
                .spec(|s| s.type_ = Some("ClusterIP".into()))
                .build(),
        ));
        writer.apply(&Event::Delete(lb_service("a", "old").build()));
        let delta = world.services(&cache, &dirty(&["db", "old"]));
        assert_eq!(delta.records, [key("db"), key("old")]);
        assert_eq!(delta.views, [(key("db"), None), (key("old"), None)]);
        assert!(delta.strangers);
        assert_eq!(world.strangers.keys().collect::<Vec<_>>(), [&key("db")]);
        assert_eq!(world.views().len(), 1);

        // A relist reads everything again, and drops what went.
        writer.apply(&Event::Init);
        writer.apply(&Event::InitApply(lb_service("a", "web").build()));
        writer.apply(&Event::InitDone);
        let relist = world.services(
            &cache,
            &Dirty {
                everything: true,
                ..Dirty::default()
            },
        );
        assert!(relist.everything);
        assert_eq!(relist.records, [key("web"), key("db")], "db went");
        assert!(world.strangers.is_empty());
        assert_eq!(world.views().len(), 1);
    }

    #[tokio::test]
    async fn endpoints_are_read_only_for_local_services_and_only_changes_come_back() {
        let (services, mut svc_writer) = store::records(keep);
        let (cache, mut writer) = store::records(endpoints::endpoints_nodes);
        let local = |name: &str| {
            lb_service("a", name)
                .spec(|s| s.external_traffic_policy = Some("Local".into()))
                .build()
        };
        svc_writer.apply(&Event::Init);
        svc_writer.apply(&Event::InitApply(local("web")));
        svc_writer.apply(&Event::InitApply(lb_service("a", "db").build()));
        svc_writer.apply(&Event::InitDone);
        writer.apply(&Event::Init);
        writer.apply(&Event::InitApply(endpoints("web", &["n1"])));
        writer.apply(&Event::InitApply(endpoints("db", &["n1"])));
        writer.apply(&Event::InitDone);
        let mut world = World::default();
        let delta = world.services(&services, &Dirty::default());
        let changed = world.endpoints(&cache, &Dirty::default(), &delta);
        assert_eq!(changed, BTreeSet::from([key("web")]), "db is not Local");
        assert_eq!(world.local[&key("web")], BTreeSet::from(["n1".to_owned()]));

        // db's endpoints move: nobody reads them.
        writer.apply(&Event::Apply(endpoints("db", &["n2"])));
        let noted = Dirty {
            endpoints: [key("db")].into(),
            ..Dirty::default()
        };
        let delta = world.services(&services, &noted);
        assert!(world.endpoints(&cache, &noted, &delta).is_empty());

        // web's move: web changed.
        writer.apply(&Event::Apply(endpoints("web", &["n1", "n2"])));
        let noted = Dirty {
            endpoints: [key("web")].into(),
            ..Dirty::default()
        };
        let delta = world.services(&services, &noted);
        assert_eq!(
            world.endpoints(&cache, &noted, &delta),
            BTreeSet::from([key("web")])
        );

        // db becomes Local: its endpoints count from now on.
        svc_writer.apply(&Event::Apply(local("db")));
        let noted = dirty(&["db"]);
        let delta = world.services(&services, &noted);
        assert_eq!(
            world.endpoints(&cache, &noted, &delta),
            BTreeSet::from([key("db")])
        );
        assert_eq!(world.local[&key("db")], BTreeSet::from(["n2".to_owned()]));
    }

    #[test]
    fn a_node_changed_when_its_state_or_its_agent_did() {
        let node = |name: &str, ready: bool| NodeState {
            name: name.into(),
            agent_ready: ready,
            ..NodeState::default()
        };
        let report = |held: &[&str]| {
            Arc::new(AgentReport {
                held: held.iter().map(|ip| ip.parse().unwrap()).collect(),
                ..AgentReport::default()
            })
        };
        let mut world = World::default();
        let mut nodes = [node("n1", true), node("n2", true)];
        assert_eq!(world.nodes_changed(&mut nodes).len(), 2, "all new");
        let first = nodes[0].name.clone();
        assert!(world.nodes_changed(&mut nodes).is_empty());
        let mut nodes2 = [node("n1", false), node("n2", true)];
        assert_eq!(
            world.nodes_changed(&mut nodes2),
            BTreeSet::from(["n1".to_owned()]),
            "a state"
        );
        assert!(
            Arc::ptr_eq(&nodes2[0].name, &first),
            "a node keeps its name from pass to pass"
        );
        assert_eq!(
            world.nodes_changed(&mut nodes2[..1]),
            BTreeSet::from(["n2".to_owned()]),
            "gone"
        );

        assert!(
            world.set_agent("n1", Freshness::Fresh, Some(report(&[]))),
            "new"
        );
        assert!(
            !world.set_agent("n1", Freshness::Fresh, None),
            "not read again"
        );
        assert!(
            !world.set_agent("n1", Freshness::Fresh, Some(report(&[]))),
            "same"
        );
        assert!(world.set_agent("n1", Freshness::Fresh, Some(report(&["10.0.0.1"]))));
        assert!(world.set_agent("n1", Freshness::Lost, None), "freshness");
        assert_eq!(world.reports()["n1"], report(&["10.0.0.1"]));
        assert_eq!(
            world.agents()["n1"],
            (Freshness::Lost, report(&["10.0.0.1"]))
        );
        assert!(world.set_agent("n2", Freshness::Fresh, None));
        assert_eq!(
            world.forget_agents_but(&HashSet::from(["n2"])),
            ["n1".to_owned()]
        );
        assert!(!world.reports().contains_key("n1"));
    }
}
