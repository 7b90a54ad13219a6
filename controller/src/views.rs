//! Kubernetes objects -> the planner's plain views ([`ServiceView`], [`NodeState`], agent
//! reports, local endpoints), and the agent freshness clock. Pure: no I/O; time comes in
//! as [`Instant`]s on the controller's own monotonic clock.
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
//!    agent whose Lease names no holder (graceful shutdown) or is gone is lost at once.
//!
//! An unconfirmed agent's node keeps what it carries but is not elected for new IPs. A
//! lost agent's node is a hard loss: its IPs move at once. So the loss of some nodes
//! still fails over within one lease duration of their last renewal (the other agents'
//! renewals are the proof of sight), while a controller that cannot see any agent changes
//! nothing until it sees them again. The price: a cluster whose every node really died
//! keeps its assignments (no node could take them anyway), and a node lost just before
//! a leadership change or the end of a blindness is replaced one lease duration later.
//!
//! Also owns the answer to "is this Service ours?" ([`is_ours`]) and what we wrote on a
//! Service ([`has_our_marks`]), so that a Service that stops being ours is cleaned up.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use aliaslb_core::annotations::parse_ip_list;
use aliaslb_core::election::NodeState;
use aliaslb_core::keys;
use aliaslb_core::plan::{FamilyPolicy, NodeAddress, PortKey, ServiceKey, ServiceView};
use aliaslb_core::range::Family;
use aliaslb_core::report::{AgentReport, ReportError};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Endpoints, Node, Service, ServiceSpec};
use k8s_openapi::api::discovery::v1::EndpointSlice;

use crate::config::ControllerConfig;
use crate::record::OurCondition;

/// Prefix of the agents' Lease names (see [`keys::agent_lease_name`]).
pub const AGENT_LEASE_PREFIX: &str = "aliaslb-agent-";

/// Label of an EndpointSlice naming its Service.
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// The key of a Service, `None` without name or namespace.
pub fn service_key(svc: &Service) -> Option<ServiceKey> {
    Some(ServiceKey::new(
        svc.metadata.namespace.as_deref()?,
        svc.metadata.name.as_deref()?,
    ))
}

/// Whether the controller handles `svc`: `type: LoadBalancer`, and its
/// `spec.loadBalancerClass` is ours, or unset while classless Services are handled.
pub fn is_ours(svc: &Service, config: &ControllerConfig) -> bool {
    let Some(spec) = &svc.spec else {
        return false;
    };
    if spec.type_.as_deref() != Some("LoadBalancer") {
        return false;
    }
    match spec.load_balancer_class.as_deref() {
        None => !config.ignore_classless,
        Some(class) => class == config.load_balancer_class,
    }
}

/// Whether `svc` carries something the controller writes: one of our annotations or
/// conditions. Used to clean up Services that stopped being ours.
pub fn has_our_marks(svc: &Service) -> bool {
    let annotated = svc.metadata.annotations.as_ref().is_some_and(|a| {
        a.contains_key(keys::ANNOTATION_NODE) || a.contains_key(keys::ANNOTATION_INTERFACE)
    });
    let conditioned = svc
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| OurCondition::parse(&c.type_).is_some()));
    annotated || conditioned
}

/// The `status.loadBalancer.ingress[].ip` addresses of `svc` that parse, in order.
pub fn ingress_ips(svc: &Service) -> Vec<IpAddr> {
    svc.status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .map(|ingress| {
            ingress
                .iter()
                .filter_map(|i| i.ip.as_deref()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// An annotation of `svc`.
pub fn annotation<'a>(svc: &'a Service, key: &str) -> Option<&'a str> {
    svc.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

/// The planner's view of `svc`, whose key and uid the caller already has (shared with
/// its record).
pub fn service_view(svc: &Service, key: &ServiceKey, uid: &Arc<str>) -> ServiceView {
    // Borrowed, not cloned: this runs for every Service on every pass.
    let default_spec = ServiceSpec::default();
    let spec = svc.spec.as_ref().unwrap_or(&default_spec);
    let created = svc
        .metadata
        .creation_timestamp
        .as_ref()
        .map_or(0, |t| t.0.as_second());
    let families = family_policy(
        spec.ip_families.as_deref().unwrap_or_default(),
        spec.ip_family_policy.as_deref(),
        spec.cluster_ip.as_deref(),
    );
    let requested = match annotation(svc, keys::ANNOTATION_REQUESTED_IPS) {
        Some(value) => parse_ip_list(value)
            .map_err(|e| format!("annotation {}: {e}", keys::ANNOTATION_REQUESTED_IPS)),
        None => match spec.load_balancer_ip.as_deref().map(str::trim) {
            None | Some("") => Ok(Vec::new()),
            Some(ip) => ip
                .parse::<IpAddr>()
                .map(|ip| vec![ip])
                .map_err(|_| format!("spec.loadBalancerIP `{ip}` is not an IP address")),
        },
    };
    let ports = spec
        .ports
        .iter()
        .flatten()
        .map(|p| PortKey {
            port: p.port,
            protocol: Arc::from(p.protocol.as_deref().unwrap_or("TCP")),
        })
        .collect();
    ServiceView {
        key: key.clone(),
        uid: uid.clone(),
        created,
        families,
        requested,
        sharing_key: annotation(svc, keys::ANNOTATION_SHARING_KEY)
            .map(str::trim)
            .filter(|k| !k.is_empty())
            .map(str::to_owned),
        ports,
        local_traffic: spec.external_traffic_policy.as_deref() == Some("Local"),
        observed_ips: ingress_ips(svc),
        // L3 mode lists its announcing nodes there, comma-separated: no one holder.
        observed_node: annotation(svc, keys::ANNOTATION_NODE)
            .filter(|n| !n.contains(','))
            .map(str::to_owned),
    }
}

/// Families from `spec.ipFamilies` / `spec.ipFamilyPolicy`; servers that leave them empty
/// (headless or pre-dual-stack objects) get the family of the cluster IP, else IPv4.
fn family_policy(
    families: &[String],
    policy: Option<&str>,
    cluster_ip: Option<&str>,
) -> FamilyPolicy {
    let mut wanted: Vec<Family> = Vec::new();
    for f in families {
        let family = match f.as_str() {
            "IPv4" => Family::V4,
            "IPv6" => Family::V6,
            _ => continue,
        };
        if !wanted.contains(&family) {
            wanted.push(family);
        }
    }
    if wanted.is_empty() {
        let from_cluster_ip = cluster_ip
            .and_then(|ip| ip.parse::<IpAddr>().ok())
            .map_or(Family::V4, Family::of);
        wanted.push(from_cluster_ip);
    }
    FamilyPolicy {
        families: wanted,
        require_all: policy == Some("RequireDualStack"),
    }
}

/// The node an agent Lease belongs to, from its name; `None` for other Leases.
pub fn agent_node(lease_name: &str) -> Option<&str> {
    lease_name
        .strip_prefix(AGENT_LEASE_PREFIX)
        .filter(|n| !n.is_empty())
}

/// The agent's report on its Lease, read within the bounds of [`AgentReport::from_json`]
/// (an agent's node may be compromised); an absent annotation is an empty report.
pub fn agent_report(lease: &Lease) -> Result<AgentReport, ReportError> {
    match lease
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(keys::ANNOTATION_AGENT_REPORT))
    {
        Some(json) => AgentReport::from_json(json),
        None => Ok(AgentReport::default()),
    }
}

/// What the planner takes from an agent's Lease: how fresh the agent is (from the
/// [`Observer`]) and its report. A report that cannot be read counts for nothing: the
/// agent is lost (its node is not eligible) and holds nothing; the error comes back
/// beside, for the caller to warn about.
pub fn agent_view(
    lease: &Lease,
    fresh: Freshness,
) -> ((Freshness, AgentReport), Option<ReportError>) {
    match agent_report(lease) {
        Ok(report) => ((fresh, report), None),
        Err(error) => ((Freshness::Lost, AgentReport::default()), Some(error)),
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
}

impl AgentClock {
    /// A clock using `default_duration` for Leases without `leaseDurationSeconds`.
    pub fn new(default_duration: Duration) -> Self {
        AgentClock {
            default_duration,
            seen: HashMap::new(),
        }
    }

    /// Records `lease` as seen at `now`; the timestamp only moves when the Lease changed.
    pub fn observe(&mut self, lease: &Lease, now: Instant) {
        let Some(name) = lease.metadata.name.as_deref() else {
            return;
        };
        if agent_node(name).is_none() {
            return;
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
        match self.seen.get_mut(name) {
            Some(seen) if seen.version == version => {
                seen.duration = duration;
                seen.held = held;
            }
            _ => {
                self.seen.insert(
                    name.to_owned(),
                    Seen {
                        version,
                        at: now,
                        duration,
                        held,
                    },
                );
            }
        }
    }

    /// Forgets a deleted Lease: its agent is not ready from now on.
    pub fn remove(&mut self, lease_name: &str) {
        self.seen.remove(lease_name);
    }

    /// Whether the agent Lease `lease_name` is fresh at `now`.
    pub fn is_fresh(&self, lease_name: &str, now: Instant) -> bool {
        self.seen
            .get(lease_name)
            .is_some_and(|s| s.held && now < s.at + s.duration)
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
                        Freshness::Lost
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
        let next_change = clock.next_expiry(now).into_iter().chain(grace_ends).min();
        Judgement {
            sight: if blind { Sight::Blind } else { Sight::Normal },
            edge,
            agents,
            next_change,
        }
    }
}

/// Nodes as the planner sees them: `agents` maps node name -> (freshness, report).
pub fn node_states(
    nodes: &[std::sync::Arc<Node>],
    agents: &BTreeMap<String, (Freshness, AgentReport)>,
) -> Vec<NodeState> {
    let mut out: Vec<NodeState> = nodes
        .iter()
        .filter_map(|node| {
            let name = node.metadata.name.clone()?;
            let agent = agents.get(&name);
            Some(NodeState {
                labels: node.metadata.labels.clone().unwrap_or_default(),
                unschedulable: node
                    .spec
                    .as_ref()
                    .and_then(|s| s.unschedulable)
                    .unwrap_or(false),
                agent_ready: agent.is_some_and(|(f, _)| *f == Freshness::Fresh),
                agent_unconfirmed: agent.is_some_and(|(f, _)| *f == Freshness::Unconfirmed),
                subnets: agent
                    .map(|(_, r)| r.subnets().copied().collect())
                    .unwrap_or_default(),
                name,
            })
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// Node address types that hold a name, not an IP.
const NAME_TYPES: [&str; 3] = ["Hostname", "InternalDNS", "ExternalDNS"];

/// Every IP a Node lists in `status.addresses` (InternalIP, ExternalIP or any other type
/// but the names: Hostname, InternalDNS, ExternalDNS), with the Node and the type: the
/// planner never allocates them. An address two Nodes list goes with the first Node by
/// name; one a Node lists twice, with the type it lists first.
pub fn node_addresses<'a>(
    nodes: impl IntoIterator<Item = &'a Node>,
) -> BTreeMap<IpAddr, NodeAddress> {
    let mut out: BTreeMap<IpAddr, NodeAddress> = BTreeMap::new();
    for node in nodes {
        let Some(name) = node.metadata.name.as_deref() else {
            continue;
        };
        let listed = node.status.as_ref().and_then(|s| s.addresses.as_ref());
        for address in listed.into_iter().flatten() {
            if NAME_TYPES.contains(&address.type_.as_str()) {
                continue;
            }
            let Ok(ip) = address.address.trim().parse::<IpAddr>() else {
                continue;
            };
            match out.get(&ip) {
                Some(kept) if *kept.node <= *name => {}
                _ => {
                    out.insert(ip, NodeAddress::new(name, &address.type_));
                }
            }
        }
    }
    out
}

/// The nodes with a ready endpoint of one Service, from one endpoints object: what the
/// endpoints cache keeps of each object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointNodes {
    /// The Service the object belongs to.
    pub service: ServiceKey,
    /// Nodes with at least one ready endpoint, sorted, without duplicates.
    pub nodes: Box<[Box<str>]>,
}

impl EndpointNodes {
    /// `None` without a ready node: only the nodes matter, and no entry means none.
    fn new<'a>(service: ServiceKey, nodes: impl Iterator<Item = &'a str>) -> Option<Self> {
        let nodes: BTreeSet<&str> = nodes.collect();
        if nodes.is_empty() {
            return None;
        }
        Some(EndpointNodes {
            service,
            nodes: nodes.into_iter().map(Box::from).collect(),
        })
    }
}

/// What an EndpointSlice (`discovery.k8s.io/v1`) says; `None` without a ready node.
pub fn slice_nodes(slice: &EndpointSlice) -> Option<EndpointNodes> {
    let ns = slice.metadata.namespace.as_deref()?;
    let service = slice.metadata.labels.as_ref()?.get(SERVICE_NAME_LABEL)?;
    let ready = slice.endpoints.iter().filter_map(|endpoint| {
        // Per the API, an unset `ready` means ready.
        let ready = endpoint
            .conditions
            .as_ref()
            .and_then(|c| c.ready)
            .unwrap_or(true);
        endpoint.node_name.as_deref().filter(|_| ready)
    });
    EndpointNodes::new(ServiceKey::new(ns, service), ready)
}

/// What a core/v1 Endpoints object says; `None` without a ready node.
pub fn endpoints_nodes(ep: &Endpoints) -> Option<EndpointNodes> {
    let ns = ep.metadata.namespace.as_deref()?;
    let name = ep.metadata.name.as_deref()?;
    let ready = ep
        .subsets
        .iter()
        .flatten()
        .flat_map(|subset| subset.addresses.iter().flatten())
        .filter_map(|address| address.node_name.as_deref());
    EndpointNodes::new(ServiceKey::new(ns, name), ready)
}

/// Service -> nodes with a ready endpoint, for the Services `wanted` accepts (the
/// `externalTrafficPolicy: Local` ones: no other Service reads it).
pub fn local_endpoints<'a>(
    objects: impl IntoIterator<Item = &'a EndpointNodes>,
    wanted: impl Fn(&ServiceKey) -> bool,
) -> BTreeMap<ServiceKey, BTreeSet<String>> {
    let mut out: BTreeMap<ServiceKey, BTreeSet<String>> = BTreeMap::new();
    for object in objects.into_iter().filter(|o| wanted(&o.service)) {
        out.entry(object.service.clone())
            .or_default()
            .extend(object.nodes.iter().map(|n| n.to_string()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::api::core::v1::{
        EndpointAddress, EndpointSubset, LoadBalancerIngress, LoadBalancerStatus, ServicePort,
        ServiceSpec, ServiceStatus,
    };
    use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};

    /// A LoadBalancer Service fixture.
    struct Svc(Service);

    fn lb_service(ns: &str, name: &str) -> Svc {
        Svc(Service {
            metadata: ObjectMeta {
                namespace: Some(ns.into()),
                name: Some(name.into()),
                uid: Some(format!("uid-{name}")),
                ..ObjectMeta::default()
            },
            spec: Some(ServiceSpec {
                type_: Some("LoadBalancer".into()),
                ports: Some(vec![ServicePort {
                    port: 80,
                    ..ServicePort::default()
                }]),
                ..ServiceSpec::default()
            }),
            status: None,
        })
    }

    impl Svc {
        fn annotated(mut self, key: &str, value: &str) -> Self {
            self.0
                .metadata
                .annotations
                .get_or_insert_default()
                .insert(key.into(), value.into());
            self
        }
        fn spec(mut self, f: impl FnOnce(&mut ServiceSpec)) -> Self {
            f(self.0.spec.as_mut().unwrap());
            self
        }
        fn with_ingress(mut self, ip: &str) -> Self {
            self.0.status = Some(ServiceStatus {
                load_balancer: Some(LoadBalancerStatus {
                    ingress: Some(vec![LoadBalancerIngress {
                        ip: Some(ip.into()),
                        ..LoadBalancerIngress::default()
                    }]),
                }),
                conditions: None,
            });
            self
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn node_with(name: &str, addresses: &[(&str, &str)]) -> Node {
        use k8s_openapi::api::core::v1::{NodeAddress as Listed, NodeStatus};
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            spec: None,
            status: Some(NodeStatus {
                addresses: Some(
                    addresses
                        .iter()
                        .map(|(type_, address)| Listed {
                            type_: (*type_).into(),
                            address: (*address).into(),
                        })
                        .collect(),
                ),
                ..NodeStatus::default()
            }),
        }
    }

    #[test]
    fn node_addresses_are_the_ips_of_every_type_but_names() {
        let nodes = [
            node_with(
                "n2",
                &[
                    ("InternalIP", "192.168.55.103"),
                    ("ExternalIP", "2001:db8::3"),
                    ("Hostname", "n2"),
                    ("InternalDNS", "n2.lan"),
                    ("ExternalIP", "192.168.55.103"),
                    ("InternalIP", "not-an-ip"),
                ],
            ),
            // Listed by two Nodes (a misconfiguration): the first Node by name is named.
            node_with("n1", &[("ExternalIP", "192.168.55.103")]),
            node_with("n3", &[]),
            Node {
                metadata: ObjectMeta {
                    name: Some("no-status".into()),
                    ..ObjectMeta::default()
                },
                ..Node::default()
            },
        ];
        let got = node_addresses(&nodes);
        assert_eq!(
            got,
            BTreeMap::from([
                (ip("192.168.55.103"), NodeAddress::new("n1", "ExternalIP")),
                (ip("2001:db8::3"), NodeAddress::new("n2", "ExternalIP")),
            ])
        );
        let first_listed = node_addresses(&nodes[..1]);
        assert_eq!(
            first_listed[&ip("192.168.55.103")],
            NodeAddress::new("n2", "InternalIP")
        );
    }

    #[test]
    fn ours_by_type_and_class() {
        let config = ControllerConfig::default();
        let classless = ControllerConfig {
            ignore_classless: true,
            ..ControllerConfig::default()
        };
        let table = [
            (lb_service("a", "plain"), &config, true),
            (lb_service("a", "plain"), &classless, false),
            (
                lb_service("a", "ours").spec(|s| {
                    s.load_balancer_class = Some(keys::DEFAULT_LOAD_BALANCER_CLASS.into())
                }),
                &classless,
                true,
            ),
            (
                lb_service("a", "theirs").spec(|s| s.load_balancer_class = Some("other/x".into())),
                &config,
                false,
            ),
            (
                lb_service("a", "cip").spec(|s| s.type_ = Some("ClusterIP".into())),
                &config,
                false,
            ),
        ];
        for (svc, config, want) in table {
            assert_eq!(is_ours(&svc.0, config), want, "{:?}", svc.0.metadata.name);
        }
    }

    fn view_of(svc: &Service) -> ServiceView {
        service_view(svc, &service_key(svc).unwrap(), &Arc::from("uid"))
    }

    #[test]
    fn view_reads_requests_sharing_and_observed_state() {
        let svc = lb_service("a", "web")
            .annotated(keys::ANNOTATION_REQUESTED_IPS, "10.0.0.5, 2001:db8::5")
            .annotated(keys::ANNOTATION_SHARING_KEY, "k")
            .annotated(keys::ANNOTATION_NODE, "n1")
            .spec(|s| {
                s.ip_families = Some(vec!["IPv6".into(), "IPv4".into()]);
                s.ip_family_policy = Some("RequireDualStack".into());
                s.external_traffic_policy = Some("Local".into());
            })
            .with_ingress("10.0.0.5");
        let view = view_of(&svc.0);
        assert_eq!(view.key, ServiceKey::new("a", "web"));
        assert_eq!(view.requested, Ok(vec![ip("10.0.0.5"), ip("2001:db8::5")]));
        assert_eq!(view.families.families, vec![Family::V6, Family::V4]);
        assert!(view.families.require_all);
        assert!(view.local_traffic);
        assert_eq!(view.sharing_key.as_deref(), Some("k"));
        assert_eq!(view.observed_ips, vec![ip("10.0.0.5")]);
        assert_eq!(view.observed_node.as_deref(), Some("n1"));
        assert_eq!(
            view.ports,
            vec![PortKey {
                port: 80,
                protocol: "TCP".into()
            }]
        );
    }

    #[test]
    fn bad_requests_are_explained() {
        let bad_annotation = lb_service("a", "x").annotated(keys::ANNOTATION_REQUESTED_IPS, "nope");
        let err = view_of(&bad_annotation.0).requested.unwrap_err();
        assert!(
            err.contains("aliaslb.io/loadBalancerIPs") && err.contains("`nope`"),
            "{err}"
        );
        let bad_field = lb_service("a", "y").spec(|s| s.load_balancer_ip = Some("1.2.3".into()));
        let err = view_of(&bad_field.0).requested.unwrap_err();
        assert!(err.contains("spec.loadBalancerIP `1.2.3`"), "{err}");
        let field = lb_service("a", "z").spec(|s| s.load_balancer_ip = Some("10.1.1.1".into()));
        assert_eq!(view_of(&field.0).requested, Ok(vec![ip("10.1.1.1")]));
    }

    #[test]
    fn family_defaults_to_cluster_ip_family() {
        let v6 = lb_service("a", "v6").spec(|s| s.cluster_ip = Some("fd00::1".into()));
        assert_eq!(view_of(&v6.0).families.families, vec![Family::V6]);
        let none = lb_service("a", "none");
        assert_eq!(view_of(&none.0).families.families, vec![Family::V4]);
    }

    #[test]
    fn marks_are_our_annotations_and_conditions() {
        assert!(!has_our_marks(&lb_service("a", "x").0));
        assert!(has_our_marks(
            &lb_service("a", "x").annotated(keys::ANNOTATION_NODE, "n").0
        ));
        assert!(!has_our_marks(
            &lb_service("a", "x").annotated("other.io/node", "n").0
        ));
    }

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
        // Released (empty holder) or deleted: not ready at once.
        clock.observe(
            &lease("aliaslb-agent-n1", "3", Some(""), Some(2)),
            t0 + 3 * s,
        );
        assert!(!clock.is_fresh("aliaslb-agent-n1", t0 + 3 * s));
        clock.remove("aliaslb-agent-n2");
        assert!(!clock.is_fresh("aliaslb-agent-n2", t0));
        assert_eq!(clock.next_expiry(t0 + 3 * s), None);
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
                let freshness: Vec<Freshness> = got.agents.values().copied().collect();
                assert_eq!(
                    (got.sight, got.edge, freshness.as_slice()),
                    (*sight, *edge, *want),
                    "{what}, step {i} (t={secs}s)"
                );
            }
        }
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
    fn endpoints_give_ready_nodes() {
        let slice = EndpointSlice {
            metadata: ObjectMeta {
                namespace: Some("a".into()),
                name: Some("web-abc".into()),
                labels: Some([(SERVICE_NAME_LABEL.to_owned(), "web".to_owned())].into()),
                ..ObjectMeta::default()
            },
            address_type: "IPv4".into(),
            endpoints: vec![
                Endpoint {
                    node_name: Some("n1".into()),
                    ..Endpoint::default()
                },
                Endpoint {
                    node_name: Some("n2".into()),
                    conditions: Some(EndpointConditions {
                        ready: Some(false),
                        ..EndpointConditions::default()
                    }),
                    ..Endpoint::default()
                },
            ],
            ports: None,
        };
        let from_slice = slice_nodes(&slice).unwrap();
        assert_eq!(from_slice.service, ServiceKey::new("a", "web"));
        assert_eq!(&*from_slice.nodes, [Box::from("n1")]);

        let ep = Endpoints {
            metadata: ObjectMeta {
                namespace: Some("a".into()),
                name: Some("web".into()),
                ..ObjectMeta::default()
            },
            subsets: Some(vec![EndpointSubset {
                addresses: Some(vec![EndpointAddress {
                    ip: "10.1.0.1".into(),
                    node_name: Some("n3".into()),
                    ..EndpointAddress::default()
                }]),
                not_ready_addresses: Some(vec![EndpointAddress {
                    ip: "10.1.0.2".into(),
                    node_name: Some("n4".into()),
                    ..EndpointAddress::default()
                }]),
                ports: None,
            }]),
        };
        let from_endpoints = endpoints_nodes(&ep).unwrap();
        assert_eq!(&*from_endpoints.nodes, [Box::from("n3")]);

        // Objects of one Service merge; Services not wanted are left out.
        let other = EndpointNodes {
            service: ServiceKey::new("b", "db"),
            nodes: [Box::from("n9")].into(),
        };
        let got = local_endpoints([&from_slice, &from_endpoints, &other], |k| {
            &*k.namespace == "a"
        });
        assert_eq!(
            got,
            BTreeMap::from([(
                ServiceKey::new("a", "web"),
                BTreeSet::from(["n1".to_owned(), "n3".to_owned()])
            )])
        );

        // Without a ready node, nothing is kept.
        let mut unready = slice.clone();
        unready.endpoints.truncate(0);
        assert_eq!(slice_nodes(&unready), None);
    }

    #[test]
    fn a_report_out_of_bounds_counts_as_no_agent() {
        let with_report = |json: &str| {
            let mut l = lease("aliaslb-agent-n1", "1", Some("n1"), Some(4));
            l.metadata.annotations =
                Some([(keys::ANNOTATION_AGENT_REPORT.to_owned(), json.to_owned())].into());
            l
        };
        let valid = r#"{"version":1,"interfaces":[{"name":"eth0","subnets":["10.0.0.0/24"]}],"held":["10.0.0.5"]}"#;
        let ((ready, report), error) = agent_view(&with_report(valid), Freshness::Fresh);
        assert!(ready == Freshness::Fresh && error.is_none());
        assert_eq!(report.held.len(), 1);
        // No annotation: an empty report from a ready agent.
        let ((ready, report), error) = agent_view(
            &lease("aliaslb-agent-n1", "1", Some("n1"), None),
            Freshness::Fresh,
        );
        assert!(ready == Freshness::Fresh && error.is_none() && report == AgentReport::default());
        for bad in [
            valid.replace("eth0", "eth0/1"),
            valid.replace("eth0", "a-name-of-16-byt"),
            "{not json".to_owned(),
            format!("{{\"x\":\"{}\"}}", "y".repeat(300_000)),
        ] {
            let ((ready, report), error) = agent_view(&with_report(&bad), Freshness::Fresh);
            assert_eq!(ready, Freshness::Lost, "{bad:.80}");
            assert_eq!(report, AgentReport::default());
            assert!(error.is_some());
        }
    }

    #[test]
    fn agent_lease_names() {
        assert_eq!(agent_node("aliaslb-agent-n1"), Some("n1"));
        assert_eq!(agent_node("aliaslb-agent-"), None);
        assert_eq!(agent_node("aliaslb-controller"), None);
    }
}
