//! What this node must carry: the controller's assignment ConfigMap for this node
//! (`aliaslb-node-<node>` in the controller's namespace, [`aliaslb_core::assignment`]),
//! and nothing else. Not the Services' annotations (anyone with `edit` on Services can
//! write those), not their type or class: the controller, the only writer of that object,
//! has decided all of it, ports for the host-port shield included.
//!
//! [`Assignment`] is the pure state fed by watch events; [`watch_assignments`] does the
//! API I/O (one watch of that one object, by a field selector on its name) and publishes
//! the [`DesiredSet`] on a channel, only once the initial list is complete, so a restarted
//! agent never drops aliases before it has read its assignment.
//!
//! **Absence is not an instruction.** An unreadable object keeps the last good set (it is
//! a bug or an edit by hand); so does a missing one (deleted by hand, by `kubectl delete
//! -k` or a GitOps prune: the controller says "nothing assigned" with an empty object,
//! never with an absence). The kept set is marked ([`DesiredSet::object_missing`]) and
//! [`InForce`] lets the node act on it only while this agent's own authority is fresh
//! (its Lease renewed within the lease duration): once it goes stale, the controller may
//! have given the IPs to another node, so they are let go, and not taken back before the
//! controller writes the object again. An agent that never read its object (it starts
//! while the object is missing) has nothing to keep: nothing is assigned.
//!
//! A silently dead API connection is noticed by the client's TCP keepalives, and the
//! watch driver ([`aliaslb_ops::watch`]) retries at most 2 s apart, so a change made during an outage applies within about 3 s of
//! the API path healing: see [`aliaslb_ops::api`].

use aliaslb_core::assignment::{AssignmentError, NodeAssignments};
use aliaslb_core::keys;
use aliaslb_ops::watch::{AfterError, drive};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::runtime::watcher;
use kube::{Api, Client};
use tokio::sync::watch;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::aliases::DesiredSet;

/// The desired set an assignment object asks for (`None`: the object does not exist).
pub fn desired_from(object: Option<&ConfigMap>) -> Result<DesiredSet, AssignmentError> {
    let data = object.and_then(|cm| cm.data.as_ref());
    let key = |k: &str| data.and_then(|d| d.get(k)).map_or("", String::as_str);
    let mut assignments = NodeAssignments::parse(key(keys::ASSIGNMENTS_KEY))?;
    assignments.parse_node_macs(key(keys::NODE_MACS_KEY))?;
    let mut set = DesiredSet::new();
    for (ip, a) in assignments.ips {
        set.insert(ip, a.interface);
        set.open(ip, a.ports);
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
    Ok(set)
}

/// This node's assignment object, kept up to date from watch events.
#[derive(Debug, Clone, Default)]
pub struct Assignment {
    current: Option<ConfigMap>,
    /// Filled during a (re-)list, swapped in at its end.
    listing: Option<Option<ConfigMap>>,
    synced: bool,
    /// The last set that could be read.
    good: Option<DesiredSet>,
}

impl Assignment {
    /// Nothing known yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Applies one watch event; returns whether the desired set must be published: it may
    /// have changed, or a complete list was read (news even when it reads the same: it is
    /// a desired set read from the API at that moment, which is what ends a LAN yield, see
    /// `guard`).
    pub fn apply(&mut self, event: watcher::Event<ConfigMap>) -> bool {
        match event {
            watcher::Event::Init => {
                self.listing = Some(None);
                false
            }
            watcher::Event::InitApply(cm) => {
                self.listing = Some(Some(cm));
                false
            }
            watcher::Event::InitDone => {
                self.current = self.listing.take().flatten();
                self.synced = true;
                self.read().is_some()
            }
            watcher::Event::Apply(cm) => {
                self.current = Some(cm);
                self.read().unwrap_or(false)
            }
            watcher::Event::Delete(_) => {
                self.current = None;
                self.read().unwrap_or(false)
            }
        }
    }

    /// Reads the current object: whether the desired set changed, `None` when the object
    /// cannot be read (the last good set stays). A missing object keeps the last good set
    /// too, marked as such (nothing read yet: nothing assigned).
    fn read(&mut self) -> Option<bool> {
        let set = match &self.current {
            None => {
                let mut kept = self.good.clone().unwrap_or_default();
                if !kept.object_missing() && !kept.is_empty() {
                    warn!(
                        kept = kept.len(),
                        "the assignment object of this node is missing: keeping the last one read \
                         while this agent's Lease stays fresh, until the controller writes it again"
                    );
                }
                kept.mark_object_missing();
                kept
            }
            Some(cm) => match desired_from(Some(cm)) {
                Ok(set) => set,
                Err(error) => {
                    warn!(%error, "the assignment of this node cannot be read: keeping the last one read");
                    return None;
                }
            },
        };
        if self.good.as_ref().is_some_and(DesiredSet::object_missing) && !set.object_missing() {
            info!(
                desired = set.len(),
                "the assignment object of this node is back"
            );
        }
        let changed = self.good.as_ref() != Some(&set);
        self.good = Some(set);
        Some(changed)
    }

    /// The desired set, once a complete list was seen and read (`None` before).
    pub fn desired(&self) -> Option<DesiredSet> {
        if self.synced { self.good.clone() } else { None }
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

    /// The set in force for `received`, with this agent's authority `fresh` or not.
    pub fn of(&mut self, received: &DesiredSet, fresh: bool) -> DesiredSet {
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
            received.without_ips()
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

/// Watches this node's assignment object in `namespace` (forever, through
/// [`aliaslb_ops::watch::drive`]: after an error, a backoff delay and a fresh list) and
/// publishes the desired set on `tx` after every complete list and every change. The
/// aliases held stay while the watch fails.
pub async fn watch_assignments(
    client: Client,
    namespace: String,
    node: String,
    tx: watch::Sender<Option<DesiredSet>>,
) {
    let api: Api<ConfigMap> = Api::namespaced(client, &namespace);
    let name = keys::assignment_configmap(&node);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut assignment = Assignment::new();
    let on_event = |event| {
        if assignment.apply(event)
            && let Some(desired) = assignment.desired()
        {
            debug!(desired = desired.len(), "desired set read");
            tx.send_replace(Some(desired));
        }
    };
    // A new watcher (a fresh list) after every error: kube's watcher resumes a failed
    // watch from its resource version without listing, and a resumed watch that brings
    // no event never says it is current, so after an outage the agent would have no
    // desired set read after it (a LAN yield would never end while the assignment stays).
    let make = || watcher(api.clone(), config.clone());
    drive("assignment ConfigMap", make, AfterError::Relist, on_event)
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
        let mut a = Assignment::new();
        assert_eq!(a.desired(), None);
        a.apply(watcher::Event::Init);
        a.apply(watcher::Event::InitApply(object("10.0.0.1 - - a/b")));
        assert_eq!(a.desired(), None);
        assert!(a.apply(watcher::Event::InitDone));
        assert_eq!(a.desired(), Some(set(&[("10.0.0.1", None)])));
    }

    /// `set` marked as kept for a missing object.
    fn kept(entries: &[(&str, Option<&str>)]) -> DesiredSet {
        let mut s = set(entries);
        s.mark_object_missing();
        s
    }

    #[test]
    fn no_object_ever_read_means_nothing_assigned() {
        let mut a = Assignment::new();
        a.apply(watcher::Event::Init);
        assert!(a.apply(watcher::Event::InitDone));
        assert_eq!(a.desired(), Some(kept(&[])));
        assert!(a.apply(watcher::Event::Apply(object("10.0.0.1 - - a/b"))));
        assert!(
            !a.apply(watcher::Event::Apply(object("10.0.0.1 - - a/b"))),
            "same content"
        );
        assert!(a.apply(watcher::Event::Apply(object(""))));
        assert_eq!(
            a.desired(),
            Some(DesiredSet::new()),
            "an empty object: nothing"
        );
    }

    #[test]
    fn a_deleted_object_keeps_the_last_good_set_until_one_is_written_again() {
        let mut a = Assignment::new();
        a.apply(watcher::Event::Init);
        a.apply(watcher::Event::InitApply(object("10.0.0.1 - - a/b")));
        a.apply(watcher::Event::InitDone);
        assert!(a.apply(watcher::Event::Delete(object("10.0.0.1 - - a/b"))));
        assert_eq!(a.desired(), Some(kept(&[("10.0.0.1", None)])));
        // Relisted while it is still missing: still kept.
        a.apply(watcher::Event::Init);
        assert!(a.apply(watcher::Event::InitDone));
        assert_eq!(a.desired(), Some(kept(&[("10.0.0.1", None)])));
        // The controller writes it again: that set, not marked.
        assert!(a.apply(watcher::Event::Apply(object("10.0.0.2 - - a/b"))));
        assert_eq!(a.desired(), Some(set(&[("10.0.0.2", None)])));
    }

    #[test]
    fn a_kept_set_is_in_force_only_while_the_authority_is_fresh() {
        let written = set(&[("10.0.0.1", None)]);
        let missing = kept(&[("10.0.0.1", None)]);
        let mut f = InForce::new();
        // (received, authority fresh, IPs in force)
        let steps: &[(&DesiredSet, bool, usize)] = &[
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
        }
        assert!(InForce::must_drop(&missing, false));
        assert!(!InForce::must_drop(&missing, true));
        assert!(!InForce::must_drop(&written, false));
    }

    #[test]
    fn an_unreadable_object_keeps_the_last_good_set() {
        let mut a = Assignment::new();
        a.apply(watcher::Event::Init);
        a.apply(watcher::Event::InitApply(object("10.0.0.1 - - a/b")));
        a.apply(watcher::Event::InitDone);
        assert!(!a.apply(watcher::Event::Apply(object("10.0.0.1 eth0"))));
        assert_eq!(a.desired(), Some(set(&[("10.0.0.1", None)])));
        assert!(a.apply(watcher::Event::Apply(object("10.0.0.2 - - a/b"))));
        assert_eq!(a.desired(), Some(set(&[("10.0.0.2", None)])));
    }

    #[test]
    fn a_relist_replaces_the_object_only_when_complete() {
        let mut a = Assignment::new();
        a.apply(watcher::Event::Init);
        a.apply(watcher::Event::InitApply(object("10.0.0.1 - - a/b")));
        a.apply(watcher::Event::InitDone);
        // Deleted while the watch was down: the relist does not list it.
        a.apply(watcher::Event::Init);
        assert_eq!(
            a.desired(),
            Some(set(&[("10.0.0.1", None)])),
            "kept while relisting"
        );
        assert!(a.apply(watcher::Event::InitDone));
        assert_eq!(a.desired(), Some(kept(&[("10.0.0.1", None)])), "kept");
        // A relist reading the same set is published too: a set read after an outage.
        a.apply(watcher::Event::Init);
        assert!(a.apply(watcher::Event::InitDone), "same set, freshly read");
    }
}
