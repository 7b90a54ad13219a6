//! What the controller keeps of a Service: a compact [`ServiceRecord`] built the moment the
//! object arrives from the watch, in place of the object. Pure: no I/O.
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

use aliaslb_core::keys;
use aliaslb_core::plan::{ServiceKey, ServiceView};
use k8s_openapi::api::core::v1::{ObjectReference, Service};
use k8s_openapi::jiff::Timestamp;

use crate::config::ControllerConfig;
use crate::views;

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
    /// The planner's view; `Some` exactly when the Service is ours ([`views::is_ours`]).
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
        let ours = views::is_ours(svc, config);
        if !ours && !views::has_our_marks(svc) {
            return None;
        }
        ServiceRecord::of(svc, ours)
    }

    /// The record of `svc`, with its view when `ours`.
    pub fn of(svc: &Service, ours: bool) -> Option<ServiceRecord> {
        let key = views::service_key(svc)?;
        let uid: Arc<str> = svc.metadata.uid.as_deref()?.into();
        let view = if ours {
            Some(Arc::new(views::service_view(svc, &key, &uid)))
        } else {
            None
        };
        let status = svc.status.as_ref();
        let ingress = status
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|lb| lb.ingress.as_deref())
            .unwrap_or_default()
            .iter()
            .map(|i| Ingress {
                ip: i.ip.as_deref().and_then(|ip| ip.parse().ok()),
                hostname: i.hostname.is_some(),
                vip: i.ip_mode.as_deref() == Some(crate::apply::IP_MODE_VIP),
                ip_mode: i.ip_mode.is_some(),
            })
            .collect();
        let conditions = status
            .and_then(|s| s.conditions.as_deref())
            .unwrap_or_default()
            .iter()
            .filter_map(|c| {
                Some(ObservedCondition {
                    which: OurCondition::parse(&c.type_)?,
                    status: match c.status.as_str() {
                        "True" => Some(true),
                        "False" => Some(false),
                        _ => None,
                    },
                    text: digest(&(&c.reason, &c.message)),
                    observed_generation: c.observed_generation,
                    since: c.last_transition_time.0,
                })
            })
            .collect();
        let annotation = |k: &str| views::annotation(svc, k).map(Box::from);
        Some(ServiceRecord {
            key,
            uid,
            resource_version: svc.metadata.resource_version.as_deref().map(Box::from),
            generation: svc.metadata.generation,
            view,
            node: annotation(keys::ANNOTATION_NODE),
            interface: annotation(keys::ANNOTATION_INTERFACE),
            ingress,
            conditions,
        })
    }

    /// Whether it carries something the controller writes: one of our annotations or
    /// conditions (see [`views::has_our_marks`]).
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
    use k8s_openapi::api::core::v1::{
        LoadBalancerIngress, LoadBalancerStatus, ServiceSpec, ServiceStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use kube::api::ObjectMeta;

    fn service(type_: &str) -> Service {
        Service {
            metadata: ObjectMeta {
                namespace: Some("a".into()),
                name: Some("web".into()),
                uid: Some("uid-1".into()),
                resource_version: Some("42".into()),
                generation: Some(2),
                ..ObjectMeta::default()
            },
            spec: Some(ServiceSpec {
                type_: Some(type_.into()),
                ..ServiceSpec::default()
            }),
            status: None,
        }
    }

    fn condition(type_: &str, status: &str) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: "R".into(),
            message: "m".into(),
            observed_generation: Some(1),
            last_transition_time: Time(Timestamp::UNIX_EPOCH),
        }
    }

    #[test]
    fn foreign_services_without_our_marks_are_not_kept() {
        let config = ControllerConfig::default();
        assert_eq!(ServiceRecord::keep(&service("ClusterIP"), &config), None);

        let mut marked = service("ClusterIP");
        marked.status = Some(ServiceStatus {
            conditions: Some(vec![condition(keys::CONDITION_ANNOUNCED, "True")]),
            load_balancer: None,
        });
        let record = ServiceRecord::keep(&marked, &config).unwrap();
        assert!(record.view.is_none(), "not ours: no view");
        assert!(record.has_our_marks());
    }

    #[test]
    fn ours_keeps_view_identity_and_what_we_wrote() {
        let mut svc = service("LoadBalancer");
        svc.metadata.annotations = Some(
            [
                (keys::ANNOTATION_NODE.to_owned(), "n1".to_owned()),
                ("unrelated".to_owned(), "x".repeat(4096)),
            ]
            .into(),
        );
        svc.status = Some(ServiceStatus {
            conditions: Some(vec![
                condition("Other", "True"),
                condition(keys::CONDITION_IP_ALLOCATED, "True"),
                condition(keys::CONDITION_ANNOUNCED, "Unknown"),
            ]),
            load_balancer: Some(LoadBalancerStatus {
                ingress: Some(vec![
                    LoadBalancerIngress {
                        ip: Some("10.0.0.1".into()),
                        ip_mode: Some("VIP".into()),
                        ..LoadBalancerIngress::default()
                    },
                    LoadBalancerIngress {
                        ip: Some("not-an-ip".into()),
                        ..LoadBalancerIngress::default()
                    },
                ]),
            }),
        });
        let record = ServiceRecord::keep(&svc, &ControllerConfig::default()).unwrap();
        let view = record.view.as_deref().expect("ours: a view");
        assert_eq!(view.key, record.key);
        assert!(Arc::ptr_eq(&view.uid, &record.uid), "the uid is shared");
        assert_eq!(record.resource_version.as_deref(), Some("42"));
        assert_eq!(record.generation, Some(2));
        assert_eq!(record.node.as_deref(), Some("n1"));
        assert_eq!(record.interface, None);
        assert_eq!(
            record.ingress_ips().collect::<Vec<_>>(),
            ["10.0.0.1".parse::<IpAddr>().unwrap()]
        );
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

        let reference = object_ref(&record.key, Some(&record.uid));
        assert_eq!(
            (reference.namespace.as_deref(), reference.name.as_deref()),
            (Some("a"), Some("web"))
        );
        assert_eq!(reference.uid.as_deref(), Some("uid-1"));
        assert_eq!(reference.kind.as_deref(), Some("Service"));
    }
}
