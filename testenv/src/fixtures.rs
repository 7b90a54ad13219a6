//! The one builder of LoadBalancer Service fixtures, shared by the unit tests, integration
//! tests and examples of every crate, so that a test says only what its Service has that
//! the others do not. Pure: no I/O.
//!
//! ```
//! use aliaslb_testenv::fixtures::lb_service;
//!
//! let svc = lb_service("ns", "web").with_ingress(&["10.0.0.5"]).on_node("n1").build();
//! assert_eq!(svc.metadata.name.as_deref(), Some("web"));
//! ```

use aliaslb_core::keys;
use k8s_openapi::api::core::v1::{
    LoadBalancerIngress, LoadBalancerStatus, Service, ServicePort, ServiceSpec, ServiceStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;

/// A Service under construction; [`LbService::build`] yields it.
#[derive(Debug, Clone)]
pub struct LbService(Service);

/// A `type: LoadBalancer` Service `namespace/name` with uid `uid-NAME` and one port, 80/TCP.
/// An empty `namespace` leaves it unset (the Api the Service is created through sets it).
pub fn lb_service(namespace: &str, name: &str) -> LbService {
    LbService(Service {
        metadata: ObjectMeta {
            namespace: (!namespace.is_empty()).then(|| namespace.to_owned()),
            name: Some(name.to_owned()),
            uid: Some(format!("uid-{name}")),
            ..ObjectMeta::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            ports: Some(vec![ServicePort {
                port: 80,
                protocol: Some("TCP".into()),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        status: None,
    })
}

impl LbService {
    /// With annotation `key: value`.
    pub fn annotate(mut self, key: &str, value: &str) -> Self {
        self.0
            .metadata
            .annotations
            .get_or_insert_default()
            .insert(key.to_owned(), value.to_owned());
        self
    }

    /// With the `aliaslb.io/node` annotation (as the controller writes it).
    pub fn on_node(self, node: &str) -> Self {
        self.annotate(keys::ANNOTATION_NODE, node)
    }

    /// Requesting `ips` (`aliaslb.io/requested-ips`, the text as given).
    pub fn request(self, ips: &str) -> Self {
        self.annotate(keys::ANNOTATION_REQUESTED_IPS, ips)
    }

    /// Naming pool `name` (`aliaslb.io/pool`).
    pub fn pool(self, name: &str) -> Self {
        self.annotate(keys::ANNOTATION_POOL, name)
    }

    /// With sharing key `key` (`aliaslb.io/sharing-key`).
    pub fn sharing(self, key: &str) -> Self {
        self.annotate(keys::ANNOTATION_SHARING_KEY, key)
    }

    /// With one port, `port`/TCP, in place of the ports it had.
    pub fn port(self, port: i32) -> Self {
        self.spec(|s| {
            s.ports = Some(vec![ServicePort {
                port,
                protocol: Some("TCP".into()),
                ..ServicePort::default()
            }]);
        })
    }

    /// With `status.loadBalancer.ingress` holding `ips`, in order, in place of what it had.
    pub fn with_ingress(mut self, ips: &[&str]) -> Self {
        let ingress = ips
            .iter()
            .map(|ip| LoadBalancerIngress {
                ip: Some((*ip).to_owned()),
                ..LoadBalancerIngress::default()
            })
            .collect();
        self.status().load_balancer = Some(LoadBalancerStatus {
            ingress: Some(ingress),
        });
        self
    }

    /// With status condition `type_` (`status` `True`, `False` or anything else), observed
    /// at generation 1, transitioned at the epoch.
    pub fn with_condition(
        mut self,
        type_: &str,
        status: &str,
        reason: &str,
        message: &str,
    ) -> Self {
        self.status()
            .conditions
            .get_or_insert_default()
            .push(Condition {
                type_: type_.to_owned(),
                status: status.to_owned(),
                reason: reason.to_owned(),
                message: message.to_owned(),
                observed_generation: Some(1),
                last_transition_time: Time(Timestamp::UNIX_EPOCH),
            });
        self
    }

    /// With `f` applied to its spec.
    pub fn spec(mut self, f: impl FnOnce(&mut ServiceSpec)) -> Self {
        f(self.0.spec.get_or_insert_default());
        self
    }

    /// With `f` applied to its metadata.
    pub fn meta(mut self, f: impl FnOnce(&mut ObjectMeta)) -> Self {
        f(&mut self.0.metadata);
        self
    }

    /// The Service.
    pub fn build(self) -> Service {
        self.0
    }

    fn status(&mut self) -> &mut ServiceStatus {
        self.0.status.get_or_insert_default()
    }
}

impl From<LbService> for Service {
    fn from(builder: LbService) -> Service {
        builder.build()
    }
}
