//! EndpointSlices and Endpoints -> the nodes with a ready endpoint of each Service (what
//! `externalTrafficPolicy: Local` Services are elected on). Pure: no I/O.

use std::collections::{BTreeMap, BTreeSet};

use aliaslb_core::plan::ServiceKey;
use k8s_openapi::api::core::v1::Endpoints;
use k8s_openapi::api::discovery::v1::EndpointSlice;

/// Label of an EndpointSlice naming its Service.
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// What the endpoints cache keeps of each object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointNodes {
    /// The Service the object belongs to.
    pub service: ServiceKey,
    /// Nodes with at least one ready endpoint, sorted, without duplicates.
    pub nodes: Box<[Box<str>]>,
    /// Nodes with an endpoint that is terminating but still serving (EndpointSlice
    /// `serving: true, terminating: true`) and none ready, sorted: kube-proxy sends a node's
    /// `externalTrafficPolicy: Local` traffic to them while the node has no ready endpoint
    /// (KEP-1669), so they carry a Service whose endpoints are all terminating.
    pub serving: Box<[Box<str>]>,
}

impl crate::store::Record for EndpointNodes {}

impl EndpointNodes {
    /// `None` without a ready or serving node: only the nodes matter, and no entry means none.
    fn new<'a>(
        service: ServiceKey,
        nodes: impl Iterator<Item = &'a str>,
        serving: impl Iterator<Item = &'a str>,
    ) -> Option<Self> {
        let nodes: BTreeSet<&str> = nodes.collect();
        let serving: BTreeSet<&str> = serving.filter(|n| !nodes.contains(n)).collect();
        if nodes.is_empty() && serving.is_empty() {
            return None;
        }
        Some(EndpointNodes {
            service,
            nodes: nodes.into_iter().map(Box::from).collect(),
            serving: serving.into_iter().map(Box::from).collect(),
        })
    }
}

/// The Service an EndpointSlice belongs to (its `kubernetes.io/service-name` label).
pub fn slice_service(slice: &EndpointSlice) -> Option<ServiceKey> {
    let ns = slice.metadata.namespace.as_deref()?;
    let service = slice.metadata.labels.as_ref()?.get(SERVICE_NAME_LABEL)?;
    Some(ServiceKey::new(ns, service))
}

/// The Service a core/v1 Endpoints object belongs to (same namespace and name).
pub fn endpoints_service(ep: &Endpoints) -> Option<ServiceKey> {
    Some(ServiceKey::new(
        ep.metadata.namespace.as_deref()?,
        ep.metadata.name.as_deref()?,
    ))
}

/// What an EndpointSlice (`discovery.k8s.io/v1`) says; `None` without a ready or serving node.
pub fn slice_nodes(slice: &EndpointSlice) -> Option<EndpointNodes> {
    let service = slice_service(slice)?;
    // Per the API, an unset `ready` or `serving` means true, an unset `terminating` false.
    let condition = |endpoint: &k8s_openapi::api::discovery::v1::Endpoint| {
        let c = endpoint.conditions.as_ref();
        let ready = c.and_then(|c| c.ready).unwrap_or(true);
        let serving = c.and_then(|c| c.serving).unwrap_or(ready);
        let terminating = c.and_then(|c| c.terminating).unwrap_or(false);
        (ready && !terminating, serving && terminating)
    };
    let with = |pick: fn((bool, bool)) -> bool| {
        slice
            .endpoints
            .iter()
            .filter(move |e| pick(condition(e)))
            .filter_map(|e| e.node_name.as_deref())
    };
    EndpointNodes::new(
        service,
        with(|(ready, _)| ready),
        with(|(_, serving)| serving),
    )
}

/// What a core/v1 Endpoints object says; `None` without a ready node.
pub fn endpoints_nodes(ep: &Endpoints) -> Option<EndpointNodes> {
    let service = endpoints_service(ep)?;
    let ready = ep
        .subsets
        .iter()
        .flatten()
        .flat_map(|subset| subset.addresses.iter().flatten())
        .filter_map(|address| address.node_name.as_deref());
    // core/v1 Endpoints has no serving-but-terminating state.
    EndpointNodes::new(service, ready, std::iter::empty())
}

/// Service -> the nodes that carry its `externalTrafficPolicy: Local` traffic, for the Services
/// `wanted` accepts (the Local ones: no other Service reads it): the nodes with a ready
/// endpoint; while a Service has none anywhere (every pod terminating, as in a rolling update
/// of one replica), the nodes with a serving terminating endpoint, as kube-proxy falls back to.
pub fn local_endpoints<'a>(
    objects: impl IntoIterator<Item = &'a EndpointNodes>,
    wanted: impl Fn(&ServiceKey) -> bool,
) -> BTreeMap<ServiceKey, BTreeSet<String>> {
    let mut ready: BTreeMap<ServiceKey, BTreeSet<String>> = BTreeMap::new();
    let mut serving: BTreeMap<ServiceKey, BTreeSet<String>> = BTreeMap::new();
    for object in objects.into_iter().filter(|o| wanted(&o.service)) {
        let names = |nodes: &[Box<str>]| nodes.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        ready
            .entry(object.service.clone())
            .or_default()
            .extend(names(&object.nodes));
        serving
            .entry(object.service.clone())
            .or_default()
            .extend(names(&object.serving));
    }
    ready
        .into_iter()
        .filter_map(|(service, nodes)| {
            let nodes = if nodes.is_empty() {
                serving.remove(&service).unwrap_or_default()
            } else {
                nodes
            };
            (!nodes.is_empty()).then_some((service, nodes))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{EndpointAddress, EndpointSubset};
    use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

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
            serving: [].into(),
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

    fn endpoint(node: &str, ready: bool, serving: bool, terminating: bool) -> Endpoint {
        Endpoint {
            node_name: Some(node.into()),
            conditions: Some(EndpointConditions {
                ready: Some(ready),
                serving: Some(serving),
                terminating: Some(terminating),
            }),
            ..Endpoint::default()
        }
    }

    fn slice(name: &str, endpoints: Vec<Endpoint>) -> EndpointSlice {
        EndpointSlice {
            metadata: ObjectMeta {
                namespace: Some("a".into()),
                name: Some(name.into()),
                labels: Some([(SERVICE_NAME_LABEL.to_owned(), "web".to_owned())].into()),
                ..ObjectMeta::default()
            },
            address_type: "IPv4".into(),
            endpoints,
            ports: None,
        }
    }

    #[test]
    fn serving_terminating_endpoints_carry_a_service_only_while_none_is_ready() {
        let web = ServiceKey::new("a", "web");
        let local = |slices: &[EndpointSlice]| {
            let nodes: Vec<_> = slices.iter().filter_map(slice_nodes).collect();
            local_endpoints(&nodes, |_| true).remove(&web)
        };
        let set = |nodes: &[&str]| Some(nodes.iter().map(|n| n.to_string()).collect());
        // A rolling update: n1's pod terminates (still serving), n2's new pod is ready.
        let rolling = slice(
            "web-1",
            vec![
                endpoint("n1", false, true, true),
                endpoint("n2", true, true, false),
            ],
        );
        assert_eq!(local(std::slice::from_ref(&rolling)), set(&["n2"]));
        // Every pod terminating and serving: those nodes still carry it (kube-proxy uses them).
        let draining = slice(
            "web-1",
            vec![
                endpoint("n1", false, true, true),
                endpoint("n3", false, true, true),
            ],
        );
        assert_eq!(local(std::slice::from_ref(&draining)), set(&["n1", "n3"]));
        // Ready endpoints in another slice of the same Service win over serving ones.
        let other = slice("web-2", vec![endpoint("n4", true, true, false)]);
        assert_eq!(local(&[draining.clone(), other]), set(&["n4"]));
        // Terminating and no longer serving, or not ready and not terminating: nobody.
        let gone = slice(
            "web-1",
            vec![
                endpoint("n1", false, false, true),
                endpoint("n2", false, false, false),
            ],
        );
        assert_eq!(slice_nodes(&gone), None);
        assert_eq!(local(&[gone]), None);
    }
}
