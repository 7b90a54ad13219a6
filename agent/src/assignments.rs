//! What this node must carry: the controller's assignment objects for this node, in the
//! controller's namespace ([`aliaslb_core::assignment`], laid out as in
//! [`aliaslb_core::assignment::shards`]), and nothing else. Not the Services' annotations
//! (anyone with `edit` on Services can write those), not their type or class: the
//! controller, the only writer of those objects, has decided all of it, ports for the
//! host-port shield included.
//!
//! [`Assignment`] is the pure state fed by watch events; [`watch_assignments`] does the
//! API I/O and publishes the [`DesiredSet`] on a channel, only once the initial lists are
//! complete, so a restarted agent never drops aliases before it has read its assignment.
//! Two watches, both of this node's objects only:
//! - [`Source::Index`]: the object `aliaslb-node-<node>`, by a field selector on its name.
//!   In the single-object format of earlier controllers it is the whole assignment, read
//!   from there; that is how an upgraded agent keeps working under an older controller.
//! - [`Source::Labelled`]: every object labelled [`keys::LABEL_ASSIGNMENT_NODE`] with this
//!   node, the index and its shards, in one watch: the controller writes new shards before
//!   the index counts them and the events of one watch come in the order of the writes, so
//!   the sharded set is read from this watch alone (its copy of the index included).
//!
//! **Absence is not an instruction.** An unreadable object keeps the last good set (it is
//! a bug or an edit by hand); so does a missing one (deleted by hand, by `kubectl delete
//! -k` or a GitOps prune: the controller says "nothing assigned" with empty objects,
//! never with an absence), or a shard the index counts and that is missing. The kept set is
//! marked ([`DesiredSet::object_missing`], for an unreadable object as for a missing one)
//! and
//! [`InForce`] lets the node act on it only while this agent's own authority may keep it
//! ([`crate::heartbeat::Authority::may_keep`]: its Lease renewed within the lease duration, or
//! its first renewal under way less than a lease duration after the start): once it goes
//! stale, the controller may
//! have given the IPs to another node, so they are let go, and not taken back before the
//! controller writes the object again. An agent that never read its object (it starts
//! while the object is missing) has nothing to keep: nothing is assigned.
//!
//! A silently dead API connection is noticed by the client's TCP keepalives, and the
//! watch driver ([`aliaslb_ops::watch`]) retries at most 2 s apart, so a change made during an outage applies within about 3 s of
//! the API path healing: see [`aliaslb_ops::api`].

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use aliaslb_core::assignment::shards;
use aliaslb_core::assignment::{AssignmentError, NodeAssignments};
use aliaslb_core::keys;
use aliaslb_ops::watch::{AfterError, drive};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::watcher;
use kube::{Api, Client};
use tokio::sync::watch;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::desired::{DesiredSet, StandbyLine};

/// The desired set a node's assignment says.
fn set_of(assignments: NodeAssignments) -> DesiredSet {
    let mut set = DesiredSet::new();
    for (ip, a) in assignments.ips {
        if let Some(holder) = a.standby_for {
            // Not to hold: to take over when the holder's adverts stop.
            set.add_standby(
                ip,
                StandbyLine {
                    holder,
                    interface: a.interface,
                    ports: a.ports,
                    vmac: a.vmac,
                },
            );
            continue;
        }
        if let Some(peer) = a.peer {
            set.set_peer(ip, peer);
        }
        if let Some(relay) = a.relay {
            set.set_relay(ip, relay);
        }
        set.insert(ip, a.interface);
        set.open(ip, a.ports);
        if let Some(mac) = a.vmac {
            set.set_vmac(ip, mac);
        }
        if a.bgp {
            // On no LAN: nothing to probe there.
            set.mark_routed(ip);
        } else if a.probe {
            set.mark_probe(ip);
        }
    }
    for (mac, node) in &assignments.node_macs {
        set.add_node_mac(*mac, node);
    }
    for (node, peer) in assignments.peers {
        for mac in &peer.macs {
            set.add_node_mac(*mac, &node);
        }
        set.add_peer(node, peer);
    }
    set.set_handovers(assignments.handovers);
    set
}

fn value<'a>(cm: &'a ConfigMap, key: &str) -> Option<&'a str> {
    cm.data.as_ref()?.get(key).map(String::as_str)
}

/// The desired set an assignment object of the single-object format asks for (`None`: the
/// object does not exist).
pub fn desired_from(object: Option<&ConfigMap>) -> Result<DesiredSet, AssignmentError> {
    let key = |k: &str| object.and_then(|cm| value(cm, k)).unwrap_or("");
    let mut assignments = NodeAssignments::parse(key(keys::ASSIGNMENTS_KEY))?;
    assignments.parse_node_macs(key(keys::NODE_MACS_KEY))?;
    assignments.parse_peers(key(keys::PEERS_KEY))?;
    assignments.parse_handovers(key(keys::HANDOVERS_KEY))?;
    Ok(set_of(assignments))
}

/// Which watch an event comes from (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The index object, by name.
    Index,
    /// The index and its shards, by label.
    Labelled,
}

/// The objects one watch shows, kept up to date from its events.
#[derive(Debug, Clone, Default)]
struct Listing {
    objects: BTreeMap<String, ConfigMap>,
    /// Filled during a (re-)list, swapped in at its end.
    next: Option<BTreeMap<String, ConfigMap>>,
    synced: bool,
}

impl Listing {
    /// Applies one event; whether a list just completed.
    fn apply(&mut self, event: watcher::Event<ConfigMap>) -> bool {
        let name = |cm: &ConfigMap| cm.metadata.name.clone().unwrap_or_default();
        match event {
            watcher::Event::Init => self.next = Some(BTreeMap::new()),
            watcher::Event::InitApply(cm) => {
                self.next.get_or_insert_default().insert(name(&cm), cm);
            }
            watcher::Event::InitDone => {
                self.objects = self.next.take().unwrap_or_default();
                self.synced = true;
                return true;
            }
            watcher::Event::Apply(cm) => {
                self.objects.insert(name(&cm), cm);
            }
            watcher::Event::Delete(cm) => {
                self.objects.remove(&name(&cm));
            }
        }
        false
    }

    /// Whether a complete list was read and no new list is under way.
    fn current(&self) -> bool {
        self.synced && self.next.is_none()
    }
}

/// What the objects say right now.
enum Reading {
    /// A set.
    Set(Box<DesiredSet>),
    /// The index, or a shard it counts, is missing.
    Missing,
    /// An object cannot be read.
    Unreadable(String),
    /// The two watches disagree for a moment (the index's format changes): wait.
    Between,
}

/// This node's assignment objects, kept up to date from both watches' events.
#[derive(Debug, Clone)]
pub struct Assignment {
    node: String,
    index: Listing,
    labelled: Listing,
    /// The last set that could be read (shared with the channel and the node loop: at
    /// 10,000 IPs a set is megabytes).
    good: Option<Arc<DesiredSet>>,
}

impl Assignment {
    /// Nothing known yet of `node`'s objects.
    pub fn new(node: &str) -> Self {
        Assignment {
            node: node.to_owned(),
            index: Listing::default(),
            labelled: Listing::default(),
            good: None,
        }
    }

    /// Applies one watch event of `source`; returns whether the desired set must be
    /// published: it may have changed, or a complete list was read while the other watch
    /// is current (news even when it reads the same: it is a desired set read from the API
    /// at that moment, which is what ends a LAN yield, see `guard`).
    pub fn apply(&mut self, source: Source, event: watcher::Event<ConfigMap>) -> bool {
        let (this, other) = match source {
            Source::Index => (&mut self.index, &self.labelled),
            Source::Labelled => (&mut self.labelled, &self.index),
        };
        let listed = this.apply(event);
        if !(this.current() && other.current()) {
            return false;
        }
        let changed = self.read();
        if listed {
            changed.is_some()
        } else {
            changed.unwrap_or(false)
        }
    }

    /// What the objects say: the index's own lines in the single-object format, else the
    /// shards the labelled watch's index counts.
    fn reading(&self) -> Reading {
        let index_name = keys::assignment_configmap(&self.node);
        let Some(named) = self.index.objects.get(&index_name) else {
            return Reading::Missing;
        };
        if value(named, keys::SHARDS_KEY).is_none() {
            return match desired_from(Some(named)) {
                Ok(set) => Reading::Set(Box::new(set)),
                Err(e) => Reading::Unreadable(e.to_string()),
            };
        }
        let Some(index) = self.labelled.objects.get(&index_name) else {
            return Reading::Between;
        };
        let Some(count) = value(index, keys::SHARDS_KEY) else {
            return Reading::Between;
        };
        let shard = |k| {
            let name = keys::assignment_shard_configmap(&self.node, k);
            let cm = self.labelled.objects.get(&name)?;
            Some(value(cm, keys::ASSIGNMENTS_KEY).unwrap_or(""))
        };
        let macs = value(index, keys::NODE_MACS_KEY).unwrap_or("");
        let peers = value(index, keys::PEERS_KEY).unwrap_or("");
        match shards::read_index(&index_name, count, macs, peers, shard) {
            Ok(Some(mut assignments)) => {
                let handovers = value(index, keys::HANDOVERS_KEY).unwrap_or("");
                match assignments.parse_handovers(handovers) {
                    Ok(()) => Reading::Set(Box::new(set_of(assignments))),
                    Err(e) => Reading::Unreadable(e.to_string()),
                }
            }
            Ok(None) => Reading::Missing,
            Err(e) => Reading::Unreadable(e),
        }
    }

    /// Reads the current objects: whether the desired set changed, `None` while the two
    /// watches disagree. A missing or unreadable object keeps the last good set, marked as
    /// kept ([`DesiredSet::object_missing`]: [`InForce`] lets it go once this agent's
    /// Lease is stale); nothing read yet: nothing assigned.
    fn read(&mut self) -> Option<bool> {
        let set = match self.reading() {
            Reading::Set(set) => Arc::new(*set),
            Reading::Missing => self.kept("is missing", None),
            Reading::Unreadable(error) => self.kept("cannot be read", Some(error)),
            Reading::Between => return None,
        };
        if self.good.as_ref().is_some_and(|g| g.object_missing()) && !set.object_missing() {
            info!(
                desired = set.len(),
                "the assignment objects of this node are back"
            );
        }
        let changed = self.good.as_ref() != Some(&set);
        self.good = Some(set);
        Some(changed)
    }

    /// The last good set, marked as kept for an object that `is` missing or unreadable
    /// (`error`), said once when it starts.
    fn kept(&self, is: &str, error: Option<String>) -> Arc<DesiredSet> {
        let mut kept = self.good.clone().unwrap_or_default();
        if !kept.object_missing() && !kept.is_empty() {
            warn!(
                kept = kept.len(),
                error = error.as_deref().unwrap_or_default(),
                "an assignment object of this node {is}: keeping the last set read while this \
                 agent's Lease stays fresh, until the controller writes it again"
            );
        }
        Arc::make_mut(&mut kept).mark_object_missing();
        kept
    }

    /// The desired set, once both watches listed completely and it was read (`None` before).
    pub fn desired(&self) -> Option<Arc<DesiredSet>> {
        if self.index.synced && self.labelled.synced {
            self.good.clone()
        } else {
            None
        }
    }
}

/// What the node acts on, from the desired set received: a set kept for a missing object
/// ([`DesiredSet::object_missing`]) only while this agent's authority is fresh. Once the
/// authority was stale with the object missing, its IPs stay dropped until a set the
/// controller wrote arrives (a fresh authority later does not bring them back: the
/// controller may have moved them meanwhile). Pure.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InForce {
    /// The kept set was let go for stale authority.
    dropped: bool,
}

impl InForce {
    /// Nothing dropped yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// The set in force for `received`, `fresh` saying whether this agent's authority may
    /// keep a set ([`crate::heartbeat::Authority::may_keep`]) (the same allocation unless its
    /// IPs are dropped).
    pub fn of(&mut self, received: &Arc<DesiredSet>, fresh: bool) -> Arc<DesiredSet> {
        if !received.object_missing() {
            self.dropped = false;
            return received.clone();
        }
        if !fresh && !self.dropped && !received.is_empty() {
            warn!(
                dropped = received.len(),
                "the assignment object of this node is missing and this agent's Lease is \
                 stale: letting go of the IPs kept for it"
            );
        }
        self.dropped |= !fresh;
        if self.dropped {
            Arc::new(received.without_ips())
        } else {
            received.clone()
        }
    }

    /// Whether `in_force` (what [`of`](Self::of) returned) must be recomputed now that the
    /// authority is `fresh` or not: a kept set still held while the authority is stale.
    pub fn must_drop(in_force: &DesiredSet, fresh: bool) -> bool {
        in_force.object_missing() && !in_force.is_empty() && !fresh
    }
}

/// Watches this node's assignment objects in `namespace` (forever, through
/// [`aliaslb_ops::watch::drive`]: after an error, a backoff delay and a fresh list) and
/// publishes the desired set on `tx` after every complete list and every change. The
/// aliases held stay while the watches fail.
pub async fn watch_assignments(
    client: Client,
    namespace: String,
    node: String,
    tx: watch::Sender<Option<Arc<DesiredSet>>>,
) {
    let api: Api<ConfigMap> = Api::namespaced(client, &namespace);
    let name = keys::assignment_configmap(&node);
    let by_name = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let label = keys::assignment_node_label(&node);
    let by_label =
        watcher::Config::default().labels(&format!("{}={label}", keys::LABEL_ASSIGNMENT_NODE));
    // Both drivers run in this one task: the lock is never contended.
    let assignment = Mutex::new(Assignment::new(&node));
    let on_event = |source| {
        let (assignment, tx) = (&assignment, &tx);
        move |event| {
            let mut assignment = assignment.lock().unwrap_or_else(|e| e.into_inner());
            if assignment.apply(source, event)
                && let Some(desired) = assignment.desired()
            {
                debug!(desired = desired.len(), "desired set read");
                tx.send_replace(Some(desired));
            }
        }
    };
    // A new watcher (a fresh list) after every error: kube's watcher resumes a failed
    // watch from its resource version without listing, and a resumed watch that brings
    // no event never says it is current, so after an outage the agent would have no
    // desired set read after it (a LAN yield would never end while the assignment stays).
    let index = drive(
        "assignment ConfigMap",
        || watcher(api.clone(), by_name.clone()),
        AfterError::Relist,
        on_event(Source::Index),
    );
    let labelled = drive(
        "assignment shards",
        || watcher(api.clone(), by_label.clone()),
        AfterError::Relist,
        on_event(Source::Labelled),
    );
    futures::future::join(index, labelled)
        .instrument(info_span!("assignments", configmap = %name, %namespace))
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shield::{OpenPort, Protocol};
    use aliaslb_core::mac::Mac;
    use std::net::IpAddr;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn object(text: &str) -> ConfigMap {
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some("aliaslb-node-me".into());
        cm.data = Some([(keys::ASSIGNMENTS_KEY.to_owned(), text.to_owned())].into());
        cm
    }

    /// Node `me`'s state with the labelled watch listed and empty (the single-object format
    /// of earlier controllers, which label nothing).
    fn labelled_listed() -> Assignment {
        let mut a = Assignment::new("me");
        a.apply(Source::Labelled, watcher::Event::Init);
        a.apply(Source::Labelled, watcher::Event::InitDone);
        a
    }

    /// [`labelled_listed`], with the index listed holding the single-object lines `text`.
    fn listed_with(text: &str) -> Assignment {
        let mut a = labelled_listed();
        a.apply(Source::Index, watcher::Event::Init);
        a.apply(Source::Index, watcher::Event::InitApply(object(text)));
        a.apply(Source::Index, watcher::Event::InitDone);
        a
    }

    fn set(entries: &[(&str, Option<&str>)]) -> DesiredSet {
        entries
            .iter()
            .map(|(i, f)| (ip(i), f.map(str::to_owned)))
            .collect()
    }

    #[test]
    fn the_object_becomes_the_desired_set_with_ports() {
        let d = desired_from(Some(&object(
            "10.0.0.1 eth1 tcp:80,udp:53 default/web\nfd00::1 - - default/dns\n",
        )))
        .unwrap();
        let mut want = set(&[("10.0.0.1", Some("eth1")), ("fd00::1", None)]);
        want.open(
            ip("10.0.0.1"),
            [
                OpenPort {
                    protocol: Protocol::Tcp,
                    port: 80,
                },
                OpenPort {
                    protocol: Protocol::Udp,
                    port: 53,
                },
            ],
        );
        assert_eq!(d, want);
        assert!(!d.needs_probe(ip("fd00::1")));
        assert_eq!(desired_from(None).unwrap(), DesiredSet::new());
        assert_eq!(
            desired_from(Some(&ConfigMap::default())).unwrap(),
            DesiredSet::new()
        );
    }

    #[test]
    fn bgp_lines_are_routed_and_never_probed() {
        let d = desired_from(Some(&object(
            "10.200.0.7 - tcp:443 shop/front bgp probe\n10.0.0.2 - - a/c\n",
        )))
        .unwrap();
        assert!(d.is_routed(ip("10.200.0.7")));
        assert!(
            !d.needs_probe(ip("10.200.0.7")),
            "on no LAN: nothing to probe"
        );
        assert!(!d.is_routed(ip("10.0.0.2")));
        assert_eq!(d.ports(ip("10.200.0.7")).count(), 1);
    }

    #[test]
    fn first_claims_and_node_macs_are_read() {
        let mut cm = object("10.0.0.1 - - a/b probe\n10.0.0.2 - - a/c\n");
        cm.data.as_mut().unwrap().insert(
            keys::NODE_MACS_KEY.to_owned(),
            "02:00:00:00:00:01 n1\n02:00:00:00:00:02 n2\n".to_owned(),
        );
        let d = desired_from(Some(&cm)).unwrap();
        assert!(d.needs_probe(ip("10.0.0.1")));
        assert!(!d.needs_probe(ip("10.0.0.2")));
        assert_eq!(d.node_of_mac(Mac([2, 0, 0, 0, 0, 2])), Some("n2"));
        assert_eq!(d.node_of_mac(Mac([2, 0, 0, 0, 0, 3])), None);
        cm.data.as_mut().unwrap().insert(
            keys::NODE_MACS_KEY.to_owned(),
            "02:00:00:00:00:01\n".to_owned(),
        );
        let e = desired_from(Some(&cm)).unwrap_err();
        assert!(e.to_string().contains("node-macs"), "{e}");
    }

    #[test]
    fn nothing_is_desired_before_the_initial_list_completes() {
        let mut a = labelled_listed();
        assert_eq!(a.desired(), None);
        a.apply(Source::Index, watcher::Event::Init);
        a.apply(
            Source::Index,
            watcher::Event::InitApply(object("10.0.0.1 - - a/b")),
        );
        assert_eq!(a.desired(), None);
        assert!(a.apply(Source::Index, watcher::Event::InitDone));
        assert_eq!(a.desired().as_deref(), Some(&set(&[("10.0.0.1", None)])));
    }

    /// `set` marked as kept for a missing object.
    fn kept(entries: &[(&str, Option<&str>)]) -> DesiredSet {
        let mut s = set(entries);
        s.mark_object_missing();
        s
    }

    #[test]
    fn no_object_ever_read_means_nothing_assigned() {
        let mut a = labelled_listed();
        a.apply(Source::Index, watcher::Event::Init);
        assert!(a.apply(Source::Index, watcher::Event::InitDone));
        assert_eq!(a.desired().as_deref(), Some(&kept(&[])));
        assert!(a.apply(
            Source::Index,
            watcher::Event::Apply(object("10.0.0.1 - - a/b"))
        ));
        assert!(
            !a.apply(
                Source::Index,
                watcher::Event::Apply(object("10.0.0.1 - - a/b"))
            ),
            "same content"
        );
        assert!(a.apply(Source::Index, watcher::Event::Apply(object(""))));
        assert_eq!(
            a.desired().as_deref(),
            Some(&DesiredSet::new()),
            "an empty object: nothing"
        );
    }

    #[test]
    fn a_deleted_object_keeps_the_last_good_set_until_one_is_written_again() {
        let mut a = listed_with("10.0.0.1 - - a/b");
        assert!(a.apply(
            Source::Index,
            watcher::Event::Delete(object("10.0.0.1 - - a/b"))
        ));
        assert_eq!(a.desired().as_deref(), Some(&kept(&[("10.0.0.1", None)])));
        // Relisted while it is still missing: still kept.
        a.apply(Source::Index, watcher::Event::Init);
        assert!(a.apply(Source::Index, watcher::Event::InitDone));
        assert_eq!(a.desired().as_deref(), Some(&kept(&[("10.0.0.1", None)])));
        // The controller writes it again: that set, not marked.
        assert!(a.apply(
            Source::Index,
            watcher::Event::Apply(object("10.0.0.2 - - a/b"))
        ));
        assert_eq!(a.desired().as_deref(), Some(&set(&[("10.0.0.2", None)])));
    }

    #[test]
    fn a_kept_set_is_in_force_only_while_the_authority_is_fresh() {
        let written = Arc::new(set(&[("10.0.0.1", None)]));
        let missing = Arc::new(kept(&[("10.0.0.1", None)]));
        let mut f = InForce::new();
        // (received, authority fresh, IPs in force)
        let steps: &[(&Arc<DesiredSet>, bool, usize)] = &[
            (&written, false, 1), // a written set holds whatever the authority
            (&missing, true, 1),  // deleted: kept while fresh
            (&missing, false, 0), // stale: let go
            (&missing, true, 0),  // fresh again: not taken back
            (&written, true, 1),  // written again: in force
            (&missing, false, 0),
            (&written, false, 1),
        ];
        for (i, (received, fresh, want)) in steps.iter().enumerate() {
            let now = f.of(received, *fresh);
            assert_eq!(now.len(), *want, "step {i}");
            assert_eq!(now.object_missing(), received.object_missing(), "step {i}");
            assert!(!InForce::must_drop(&now, *fresh), "step {i}");
            // Whatever is not dropped is the set received itself, not a copy of it.
            assert_eq!(Arc::ptr_eq(&now, received), *want == 1, "step {i}");
        }
        assert!(InForce::must_drop(&missing, false));
        assert!(!InForce::must_drop(&missing, true));
        assert!(!InForce::must_drop(&written, false));
    }

    #[test]
    fn an_unreadable_object_keeps_the_last_good_set_as_a_missing_one() {
        let mut a = listed_with("10.0.0.1 - - a/b");
        assert!(a.apply(
            Source::Index,
            watcher::Event::Apply(object("10.0.0.1 eth0"))
        ));
        // Kept, and marked: in force only while the authority is fresh (`InForce`).
        assert_eq!(a.desired().as_deref(), Some(&kept(&[("10.0.0.1", None)])));
        assert!(!a.apply(
            Source::Index,
            watcher::Event::Apply(object("10.0.0.1 eth1"))
        ));
        assert!(a.apply(
            Source::Index,
            watcher::Event::Apply(object("10.0.0.2 - - a/b"))
        ));
        assert_eq!(a.desired().as_deref(), Some(&set(&[("10.0.0.2", None)])));
    }

    #[test]
    fn a_relist_replaces_the_object_only_when_complete() {
        let mut a = listed_with("10.0.0.1 - - a/b");
        // Deleted while the watch was down: the relist does not list it.
        a.apply(Source::Index, watcher::Event::Init);
        assert_eq!(
            a.desired().as_deref(),
            Some(&set(&[("10.0.0.1", None)])),
            "kept while relisting"
        );
        assert!(a.apply(Source::Index, watcher::Event::InitDone));
        assert_eq!(
            a.desired().as_deref(),
            Some(&kept(&[("10.0.0.1", None)])),
            "kept"
        );
        // A relist reading the same set is published too: a set read after an outage.
        a.apply(Source::Index, watcher::Event::Init);
        assert!(
            a.apply(Source::Index, watcher::Event::InitDone),
            "same set, freshly read"
        );
    }

    /// `me`'s sharded objects for `a`, as a controller writes them: shards, then the index.
    fn sharded(a: &NodeAssignments, count: u32) -> Vec<ConfigMap> {
        let split = shards::Sharded::split(a, count);
        let mut out: Vec<ConfigMap> = (0..split.count())
            .map(|k| {
                let mut cm = ConfigMap::default();
                cm.metadata.name = Some(keys::assignment_shard_configmap("me", k));
                let text = split.texts[k as usize].clone();
                cm.data = Some([(keys::ASSIGNMENTS_KEY.to_owned(), text)].into());
                cm
            })
            .collect();
        let mut index = object(shards::LEGACY_MARKER);
        let data = index.data.as_mut().unwrap();
        data.insert(keys::SHARDS_KEY.to_owned(), split.count().to_string());
        data.insert(
            keys::NODE_MACS_KEY.to_owned(),
            "02:00:00:00:00:01 n1\n".to_owned(),
        );
        out.push(index);
        out
    }

    fn lines(n: u32) -> NodeAssignments {
        let mut a = NodeAssignments::new();
        for i in 0..n {
            let ip = IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i));
            a.assign(ip, None, [], "a/b");
        }
        a
    }

    fn listed(index: Option<&ConfigMap>, labelled: &[ConfigMap]) -> Assignment {
        let mut a = Assignment::new("me");
        a.apply(Source::Index, watcher::Event::Init);
        if let Some(cm) = index {
            a.apply(Source::Index, watcher::Event::InitApply(cm.clone()));
        }
        a.apply(Source::Labelled, watcher::Event::Init);
        for cm in labelled {
            a.apply(Source::Labelled, watcher::Event::InitApply(cm.clone()));
        }
        assert!(
            !a.apply(Source::Index, watcher::Event::InitDone),
            "one watch listed"
        );
        assert_eq!(a.desired(), None, "not before both watches listed");
        assert!(a.apply(Source::Labelled, watcher::Event::InitDone));
        a
    }

    #[test]
    fn the_shards_the_index_counts_make_the_set() {
        let objects = sharded(&lines(700), 1);
        assert_eq!(objects.len(), 3, "2 shards and the index");
        let index = objects.last().unwrap();
        let a = listed(Some(index), &objects);
        let d = a.desired().unwrap();
        assert_eq!(d.len(), 700);
        assert!(!d.object_missing());
        assert_eq!(d.node_of_mac(Mac([2, 0, 0, 0, 0, 1])), Some("n1"));
        // Another node's shard, which a label collision could bring, is not read.
        let mut a = listed(Some(index), &objects[1..]);
        assert!(a.desired().unwrap().object_missing(), "shard 0 missing");
        let mut stranger = objects[0].clone();
        stranger.metadata.name = Some(keys::assignment_shard_configmap("you", 0));
        assert!(!a.apply(Source::Labelled, watcher::Event::Apply(stranger)));
        assert!(a.desired().unwrap().object_missing());
        assert!(a.apply(Source::Labelled, watcher::Event::Apply(objects[0].clone())));
        assert_eq!(a.desired().unwrap().len(), 700);
    }

    #[test]
    fn a_change_of_one_shard_changes_the_set() {
        let objects = sharded(&lines(700), 1);
        let index = objects.last().unwrap();
        let mut a = listed(Some(index), &objects);
        let mut fewer = lines(700);
        let gone = *fewer.ips.keys().next().unwrap();
        fewer.ips.remove(&gone);
        let changed: Vec<ConfigMap> = sharded(&fewer, 2)
            .into_iter()
            .filter(|cm| !objects.contains(cm))
            .collect();
        assert_eq!(changed.len(), 1, "one shard written");
        assert!(a.apply(Source::Labelled, watcher::Event::Apply(changed[0].clone())));
        let d = a.desired().unwrap();
        assert_eq!(d.len(), 699);
        assert!(!d.contains(gone));
    }

    #[test]
    fn the_format_changes_under_a_running_agent_without_a_gap() {
        // An upgraded controller turns the single object of an earlier one into shards: the
        // shards, then the index (both watches), in either order of the two watches; and an
        // earlier controller turns it back. The set never loses an address on the way.
        let whole = lines(700);
        let legacy = object(&whole.render());
        let objects = sharded(&whole, 1);
        let index = objects.last().unwrap().clone();
        for index_watch_first in [false, true] {
            let mut a = listed(Some(&legacy), &[]);
            assert_eq!(a.desired().unwrap().len(), 700, "the single object");
            for shard in &objects[..objects.len() - 1] {
                a.apply(Source::Labelled, watcher::Event::Apply(shard.clone()));
                assert_eq!(a.desired().unwrap().len(), 700);
            }
            let steps = if index_watch_first {
                [Source::Index, Source::Labelled]
            } else {
                [Source::Labelled, Source::Index]
            };
            for source in steps {
                a.apply(source, watcher::Event::Apply(index.clone()));
                let d = a.desired().unwrap();
                assert_eq!(d.len(), 700, "{source:?} first: {index_watch_first}");
                assert!(!d.object_missing());
            }
            // Back to an earlier controller: its apply drops the count and the label.
            for source in steps {
                match source {
                    Source::Index => a.apply(source, watcher::Event::Apply(legacy.clone())),
                    Source::Labelled => a.apply(source, watcher::Event::Delete(index.clone())),
                };
                let d = a.desired().unwrap();
                assert_eq!(d.len(), 700, "back: {source:?} first");
                assert!(!d.object_missing());
            }
        }
    }

    #[test]
    fn a_relist_of_one_watch_publishes_once_the_other_is_current() {
        let objects = sharded(&lines(10), 1);
        let index = objects.last().unwrap();
        let mut a = listed(Some(index), &objects);
        a.apply(Source::Index, watcher::Event::Init);
        a.apply(Source::Labelled, watcher::Event::Init);
        a.apply(Source::Index, watcher::Event::InitApply(index.clone()));
        assert!(
            !a.apply(Source::Index, watcher::Event::InitDone),
            "the labelled watch is still listing"
        );
        for cm in &objects {
            a.apply(Source::Labelled, watcher::Event::InitApply(cm.clone()));
        }
        assert!(
            a.apply(Source::Labelled, watcher::Event::InitDone),
            "a set read after the outage, the same"
        );
        assert_eq!(a.desired().unwrap().len(), 10);
    }
}
