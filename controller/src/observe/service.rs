//! One reading of a Service: its key, our annotations, its ingress and our conditions
//! ([`service_key`], [`annotation`], [`ingress`], [`our_conditions`]), whether it is ours
//! ([`is_ours`], [`has_our_marks`]), the planner's [`ServiceView`] of it, and the compact
//! [`ServiceRecord`] the controller keeps in place of the object. Everything that reads a
//! Service (the reconcile loop, `aliaslb status`, the tests and examples) reads it here.
//! Pure: no I/O.
//!
//! The caches hold every Service of the cluster. A `Service` from k8s-openapi is about
//! 4.5 KB on the heap even without `managedFields` (every optional field of its spec is
//! inline, every string its own allocation); the record keeps only what the reconcile
//! loop reads (the planner's [`ServiceView`], what we wrote on it, its identity) and is
//! a few hundred bytes. A Service that is not ours and carries none of our marks is not
//! kept at all.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::net::IpAddr;
use std::sync::Arc;

use aliaslb_core::annotations::parse_ip_list;
use aliaslb_core::keys;
use aliaslb_core::plan::{FamilyPolicy, PortKey, ServiceKey, ServiceView};
use aliaslb_core::range::Family;
use k8s_openapi::api::core::v1::{ObjectReference, Service, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::jiff::Timestamp;

use crate::config::ControllerConfig;

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
    annotated || our_conditions(svc).next().is_some()
}

/// Every `status.loadBalancer.ingress` entry of `svc`, in order.
pub fn ingress(svc: &Service) -> impl Iterator<Item = Ingress> + '_ {
    svc.status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_deref())
        .unwrap_or_default()
        .iter()
        .map(|i| Ingress {
            ip: i.ip.as_deref().and_then(|ip| ip.parse().ok()),
            hostname: i.hostname.is_some(),
            vip: i.ip_mode.as_deref() == Some(keys::IP_MODE_VIP),
            ip_mode: i.ip_mode.is_some(),
        })
}

/// The `status.loadBalancer.ingress[].ip` addresses of `svc` that parse, in order.
pub fn ingress_ips(svc: &Service) -> Vec<IpAddr> {
    ingress(svc).filter_map(|i| i.ip).collect()
}

/// The conditions of `svc` that are ours, in order, with which one each is; the
/// conditions of others are left out.
pub fn our_conditions(svc: &Service) -> impl Iterator<Item = (OurCondition, &Condition)> {
    svc.status
        .as_ref()
        .and_then(|s| s.conditions.as_deref())
        .unwrap_or_default()
        .iter()
        .filter_map(|c| Some((OurCondition::parse(&c.type_)?, c)))
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
        pool: annotation(svc, keys::ANNOTATION_POOL)
            .map(str::trim)
            .filter(|p| !p.is_empty())
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

/// One of the two conditions the controller owns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OurCondition {
    /// `aliaslb.io/IPAllocated`.
    IpAllocated,
    /// `aliaslb.io/Announced`.
    Announced,
}

impl OurCondition {
    /// The condition's `type`.
    pub fn type_(self) -> &'static str {
        match self {
            OurCondition::IpAllocated => keys::CONDITION_IP_ALLOCATED,
            OurCondition::Announced => keys::CONDITION_ANNOUNCED,
        }
    }

    /// The condition of `type_`, if it is one of ours.
    pub fn parse(type_: &str) -> Option<OurCondition> {
        [OurCondition::IpAllocated, OurCondition::Announced]
            .into_iter()
            .find(|c| c.type_() == type_)
    }
}

/// One of our conditions as observed. Its reason and message are kept as a digest
/// ([`ObservedCondition::says`]): they are only ever compared with what the controller
/// would write, and the text was most of a record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObservedCondition {
    /// Which one.
    pub which: OurCondition,
    /// `status`: `Some(true)` for `True`, `Some(false)` for `False`, `None` otherwise.
    pub status: Option<bool>,
    /// [`digest`] of `(reason, message)`.
    pub text: u64,
    /// `observedGeneration`.
    pub observed_generation: Option<i64>,
    /// `lastTransitionTime`.
    pub since: Timestamp,
}

/// One `status.loadBalancer.ingress` entry as observed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ingress {
    /// `ip`, `None` when absent or not an address.
    pub ip: Option<IpAddr>,
    /// Whether a `hostname` is set.
    pub hostname: bool,
    /// Whether `ipMode` is `VIP`.
    pub vip: bool,
    /// Whether `ipMode` is set at all.
    pub ip_mode: bool,
}

/// What the controller keeps of one Service.
#[derive(Debug, Clone, PartialEq)]
pub struct ServiceRecord {
    /// Namespace and name.
    pub key: ServiceKey,
    /// `metadata.uid`.
    pub uid: Arc<str>,
    /// `metadata.resourceVersion`.
    pub resource_version: Option<Box<str>>,
    /// `metadata.generation`.
    pub generation: Option<i64>,
    /// The planner's view; `Some` exactly when the Service is ours ([`is_ours`]).
    pub view: Option<Arc<ServiceView>>,
    /// `aliaslb.io/node` as observed.
    pub node: Option<Box<str>>,
    /// `aliaslb.io/interface` as observed.
    pub interface: Option<Box<str>>,
    /// `status.loadBalancer.ingress` as observed.
    pub ingress: Box<[Ingress]>,
    /// Our conditions as observed (other conditions are not kept).
    pub conditions: Box<[ObservedCondition]>,
}

impl ServiceRecord {
    /// The record of `svc`, as seen by a controller with `config`; `None` when the
    /// controller has nothing to do with it (not ours, none of our marks) or it lacks a
    /// name, namespace or uid (never the case for objects read from the API).
    pub fn keep(svc: &Service, config: &ControllerConfig) -> Option<ServiceRecord> {
        let ours = is_ours(svc, config);
        if !ours && !has_our_marks(svc) {
            return None;
        }
        ServiceRecord::of(svc, ours)
    }

    /// The record of `svc`, with its view when `ours`.
    pub fn of(svc: &Service, ours: bool) -> Option<ServiceRecord> {
        let key = service_key(svc)?;
        let uid: Arc<str> = svc.metadata.uid.as_deref()?.into();
        let view = if ours {
            Some(Arc::new(service_view(svc, &key, &uid)))
        } else {
            None
        };
        let observed_ingress = ingress(svc).collect();
        let conditions = our_conditions(svc)
            .map(|(which, c)| ObservedCondition {
                which,
                status: match c.status.as_str() {
                    "True" => Some(true),
                    "False" => Some(false),
                    _ => None,
                },
                text: digest(&(&c.reason, &c.message)),
                observed_generation: c.observed_generation,
                since: c.last_transition_time.0,
            })
            .collect();
        let ours_written = |k: &str| annotation(svc, k).map(Box::from);
        Some(ServiceRecord {
            key,
            uid,
            resource_version: svc.metadata.resource_version.as_deref().map(Box::from),
            generation: svc.metadata.generation,
            view,
            node: ours_written(keys::ANNOTATION_NODE),
            interface: ours_written(keys::ANNOTATION_INTERFACE),
            ingress: observed_ingress,
            conditions,
        })
    }

    /// Whether it carries something the controller writes: one of our annotations or
    /// conditions (see [`has_our_marks`]).
    pub fn has_our_marks(&self) -> bool {
        self.node.is_some() || self.interface.is_some() || !self.conditions.is_empty()
    }

    /// Our observed condition `which`.
    pub fn condition(&self, which: OurCondition) -> Option<&ObservedCondition> {
        self.conditions.iter().find(|c| c.which == which)
    }

    /// The parsed ingress IPs, in order.
    pub fn ingress_ips(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.ingress.iter().filter_map(|i| i.ip)
    }
}

impl crate::store::Record for ServiceRecord {
    /// Files the record under the cache's key and keeps the uid and view of the record it
    /// replaces when they are the same: the planner and the index hold those, and a copy
    /// per version was megabytes at 10,000 Services.
    fn share(&mut self, key: &ServiceKey, old: Option<&Self>) {
        self.key = key.clone();
        if let Some(old) = old
            && old.uid == self.uid
        {
            self.uid = old.uid.clone();
        }
        let Some(view) = &mut self.view else {
            return;
        };
        match old.and_then(|old| old.view.as_ref()) {
            Some(old) if **old == **view => *view = old.clone(),
            _ => {
                if let Some(fresh) = Arc::get_mut(view) {
                    fresh.key = key.clone();
                    fresh.uid = self.uid.clone();
                }
            }
        }
    }
}

impl ObservedCondition {
    /// Whether its reason and message are `reason` and `message` (64-bit digest: a
    /// collision, odds 2^-64, would leave a stale message until the next change).
    pub fn says(&self, reason: &str, message: &str) -> bool {
        self.text == digest(&(reason, message))
    }
}

/// A 64-bit digest of `value`: what the controller keeps of texts it only ever compares
/// (condition messages here, writes and resourceVersions in the reconciler's memo).
pub fn digest<T: Hash + ?Sized>(value: &T) -> u64 {
    let mut hasher = DefaultHasher::new();
    value.hash(&mut hasher);
    hasher.finish()
}

/// A reference to Service `key` (with `uid` when known), for Events.
pub fn object_ref(key: &ServiceKey, uid: Option<&str>) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Service".into()),
        namespace: Some(key.namespace.to_string()),
        name: Some(key.name.to_string()),
        uid: uid.map(str::to_owned),
        ..ObjectReference::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aliaslb_testenv::fixtures::{LbService, lb_service};

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
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
            let svc = svc.build();
            assert_eq!(is_ours(&svc, config), want, "{:?}", svc.metadata.name);
        }
    }

    fn view_of(svc: &Service) -> ServiceView {
        service_view(svc, &service_key(svc).unwrap(), &Arc::from("uid"))
    }

    #[test]
    fn view_reads_requests_sharing_and_observed_state() {
        let svc = lb_service("a", "web")
            .annotate(keys::ANNOTATION_REQUESTED_IPS, "10.0.0.5, 2001:db8::5")
            .annotate(keys::ANNOTATION_SHARING_KEY, "k")
            .annotate(keys::ANNOTATION_NODE, "n1")
            .spec(|s| {
                s.ip_families = Some(vec!["IPv6".into(), "IPv4".into()]);
                s.ip_family_policy = Some("RequireDualStack".into());
                s.external_traffic_policy = Some("Local".into());
            })
            .with_ingress(&["10.0.0.5"]);
        let view = view_of(&svc.build());
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
        let bad_annotation = lb_service("a", "x").annotate(keys::ANNOTATION_REQUESTED_IPS, "nope");
        let err = view_of(&bad_annotation.build()).requested.unwrap_err();
        assert!(
            err.contains("aliaslb.io/loadBalancerIPs") && err.contains("`nope`"),
            "{err}"
        );
        let bad_field = lb_service("a", "y").spec(|s| s.load_balancer_ip = Some("1.2.3".into()));
        let err = view_of(&bad_field.build()).requested.unwrap_err();
        assert!(err.contains("spec.loadBalancerIP `1.2.3`"), "{err}");
        let field = lb_service("a", "z").spec(|s| s.load_balancer_ip = Some("10.1.1.1".into()));
        assert_eq!(view_of(&field.build()).requested, Ok(vec![ip("10.1.1.1")]));
    }

    #[test]
    fn family_defaults_to_cluster_ip_family() {
        let v6 = lb_service("a", "v6").spec(|s| s.cluster_ip = Some("fd00::1".into()));
        assert_eq!(view_of(&v6.build()).families.families, vec![Family::V6]);
        let none = lb_service("a", "none");
        assert_eq!(view_of(&none.build()).families.families, vec![Family::V4]);
    }

    #[test]
    fn marks_are_our_annotations_and_conditions() {
        assert!(!has_our_marks(&lb_service("a", "x").build()));
        assert!(has_our_marks(
            &lb_service("a", "x")
                .annotate(keys::ANNOTATION_NODE, "n")
                .build()
        ));
        assert!(!has_our_marks(
            &lb_service("a", "x").annotate("other.io/node", "n").build()
        ));
    }

    /// Service `a/web` of `type_`, as read from the API: uid, resourceVersion, generation.
    fn service(type_: &str) -> LbService {
        lb_service("a", "web")
            .meta(|m| {
                m.uid = Some("uid-1".into());
                m.resource_version = Some("42".into());
                m.generation = Some(2);
            })
            .spec(|s| s.type_ = Some(type_.into()))
    }

    #[test]
    fn foreign_services_without_our_marks_are_not_kept() {
        let config = ControllerConfig::default();
        assert_eq!(
            ServiceRecord::keep(&service("ClusterIP").build(), &config),
            None
        );

        let marked = service("ClusterIP")
            .with_condition(keys::CONDITION_ANNOUNCED, "True", "R", "m")
            .build();
        let record = ServiceRecord::keep(&marked, &config).unwrap();
        assert!(record.view.is_none(), "not ours: no view");
        assert!(record.has_our_marks());
    }

    #[test]
    fn ours_keeps_view_identity_and_what_we_wrote() {
        let mut svc = service("LoadBalancer")
            .on_node("n1")
            .annotate("unrelated", &"x".repeat(4096))
            .with_condition("Other", "True", "R", "m")
            .with_condition(keys::CONDITION_IP_ALLOCATED, "True", "R", "m")
            .with_condition(keys::CONDITION_ANNOUNCED, "Unknown", "R", "m")
            .with_ingress(&["10.0.0.1", "not-an-ip"])
            .build();
        if let Some(first) = svc
            .status
            .as_mut()
            .and_then(|s| s.load_balancer.as_mut())
            .and_then(|lb| lb.ingress.as_mut())
            .and_then(|i| i.first_mut())
        {
            first.ip_mode = Some(keys::IP_MODE_VIP.into());
        }
        let record = ServiceRecord::keep(&svc, &ControllerConfig::default()).unwrap();
        let view = record.view.as_deref().expect("ours: a view");
        assert_eq!(view.key, record.key);
        assert!(Arc::ptr_eq(&view.uid, &record.uid), "the uid is shared");
        assert_eq!(record.resource_version.as_deref(), Some("42"));
        assert_eq!(record.generation, Some(2));
        assert_eq!(record.node.as_deref(), Some("n1"));
        assert_eq!(record.interface, None);
        assert_eq!(record.ingress_ips().collect::<Vec<_>>(), [ip("10.0.0.1")]);
        assert_eq!(ingress_ips(&svc), [ip("10.0.0.1")], "one reading");
        assert!(record.ingress[0].vip && record.ingress[0].ip_mode);
        assert_eq!(record.ingress[1].ip, None, "kept, so that it is rewritten");
        let kinds: Vec<_> = record
            .conditions
            .iter()
            .map(|c| (c.which, c.status))
            .collect();
        assert_eq!(
            kinds,
            [
                (OurCondition::IpAllocated, Some(true)),
                (OurCondition::Announced, None)
            ],
            "only our conditions"
        );
        assert!(record.conditions[0].says("R", "m"));

        let reference = object_ref(&record.key, Some(&record.uid));
        assert_eq!(
            (reference.namespace.as_deref(), reference.name.as_deref()),
            (Some("a"), Some("web"))
        );
        assert_eq!(reference.uid.as_deref(), Some("uid-1"));
        assert_eq!(reference.kind.as_deref(), Some("Service"));
    }
}
