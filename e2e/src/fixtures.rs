//! Small builders for the objects the tests create: LoadBalancer Services without a
//! selector plus the Endpoints naming the lab's pods (kube-controller-manager mirrors them
//! into the EndpointSlices kube-proxy reads). No I/O: they render YAML.

use crate::lab::node_name;

/// A `type: LoadBalancer` Service on port 80 -> 8080 with Endpoints on the lab's pods.
#[derive(Debug, Clone)]
pub struct LbService {
    ns: String,
    name: String,
    local: bool,
    pod_nodes: Vec<u8>,
}

/// A Service `ns/name`, externalTrafficPolicy Cluster, endpoints pod-a (node 1) and pod-b
/// (node 2).
pub fn lb_service(ns: &str, name: &str) -> LbService {
    LbService {
        ns: ns.to_owned(),
        name: name.to_owned(),
        local: false,
        pod_nodes: vec![1, 2],
    }
}

impl LbService {
    /// externalTrafficPolicy Local.
    pub fn local(mut self) -> Self {
        self.local = true;
        self
    }

    /// Endpoints only on the pods of these nodes (1: pod-a, 2: pod-b).
    pub fn pods_on(mut self, nodes: &[u8]) -> Self {
        self.pod_nodes = nodes.to_vec();
        self
    }

    /// The Service and its Endpoints as a multi-document YAML.
    pub fn to_yaml(&self) -> String {
        let LbService {
            ns,
            name,
            local,
            pod_nodes,
        } = self;
        let policy = if *local { "Local" } else { "Cluster" };
        let addresses: String = pod_nodes
            .iter()
            .map(|&n| format!("  - ip: 10.244.{n}.10\n    nodeName: {}\n", node_name(n)))
            .collect();
        format!(
            "apiVersion: v1
kind: Service
metadata:
  name: {name}
  namespace: {ns}
spec:
  type: LoadBalancer
  externalTrafficPolicy: {policy}
  ports:
  - name: http
    port: 80
    targetPort: 8080
---
apiVersion: v1
kind: Endpoints
metadata:
  name: {name}
  namespace: {ns}
subsets:
- addresses:
{addresses}  ports:
  - name: http
    port: 8080
"
        )
    }
}

/// A Namespace.
pub fn namespace(name: &str) -> String {
    format!("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: {name}\n")
}

/// A merge patch adding the pool key `ns` (one address per line) to the pool ConfigMap.
pub fn pool_patch(ns: &str, ips: &[&str]) -> String {
    let value = ips.join("\n");
    serde_json::json!({ "data": { ns: value } }).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_service_names_only_the_chosen_pods() {
        let yaml = lb_service("ns", "web").local().pods_on(&[2]).to_yaml();
        assert!(yaml.contains("externalTrafficPolicy: Local"), "{yaml}");
        assert!(
            yaml.contains("ip: 10.244.2.10\n    nodeName: alb-node-2"),
            "{yaml}"
        );
        assert!(!yaml.contains("10.244.1.10"), "{yaml}");
    }

    #[test]
    fn pool_patch_is_one_address_per_line() {
        assert_eq!(
            pool_patch("team", &["192.168.55.20", "192.168.55.21"]),
            r#"{"data":{"team":"192.168.55.20\n192.168.55.21"}}"#
        );
    }
}
