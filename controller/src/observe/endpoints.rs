//! EndpointSlices and Endpoints -> the nodes with a ready endpoint of each Service (what
//! `externalTrafficPolicy: Local` Services are elected on). Pure: no I/O.

use std::collections::{BTreeMap, BTreeSet};

use aliaslb_core::plan::ServiceKey;
use k8s_openapi::api::core::v1::Endpoints;
use k8s_openapi::api::discovery::v1::EndpointSlice;

/// Label of an EndpointSlice naming its Service.
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

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

/// What an EndpointSlice (`discovery.k8s.io/v1`) says; `None` without a ready node.
pub fn slice_nodes(slice: &EndpointSlice) -> Option<EndpointNodes> {
    let service = slice_service(slice)?;
    let ready = slice.endpoints.iter().filter_map(|endpoint| {
        // Per the API, an unset `ready` means ready.
        let ready = endpoint
            .conditions
            .as_ref()
            .and_then(|c| c.ready)
            .unwrap_or(true);
        endpoint.node_name.as_deref().filter(|_| ready)
    });
    EndpointNodes::new(service, ready)
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
    EndpointNodes::new(service, ready)
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
}
