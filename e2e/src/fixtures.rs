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
    families: Families,
    requested: Option<String>,
    annotations: Vec<(String, String)>,
}

/// The IP families of a Service (`ipFamilyPolicy` / `ipFamilies`) and so of its endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Families {
    /// The cluster's default: single-stack IPv4.
    V4,
    /// Single-stack IPv6.
    V6,
    /// `RequireDualStack`, IPv4 first.
    Dual,
}

/// A Service `ns/name`, externalTrafficPolicy Cluster, endpoints pod-a (node 1) and pod-b
/// (node 2).
pub fn lb_service(ns: &str, name: &str) -> LbService {
    LbService {
        ns: ns.to_owned(),
        name: name.to_owned(),
        local: false,
        pod_nodes: vec![1, 2],
        families: Families::V4,
        requested: None,
        annotations: Vec::new(),
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

    /// The Service's IP families (default: single-stack IPv4).
    pub fn families(mut self, families: Families) -> Self {
        self.families = families;
        self
    }

    /// Requests `ip` (the `aliaslb.io/loadBalancerIPs` annotation).
    pub fn requesting(mut self, ip: &str) -> Self {
        self.requested = Some(ip.to_owned());
        self
    }

    /// Names pool `name` (the `aliaslb.io/pool` annotation).
    pub fn pool(self, name: &str) -> Self {
        self.annotated("aliaslb.io/pool", name)
    }

    /// With the annotation `key: value` (e.g. another load balancer's pool choice).
    pub fn annotated(mut self, key: &str, value: &str) -> Self {
        self.annotations.push((key.to_owned(), value.to_owned()));
        self
    }

    /// The Service and its Endpoints as a multi-document YAML.
    pub fn to_yaml(&self) -> String {
        let LbService {
            ns,
            name,
            local,
            pod_nodes,
            families,
            requested,
            annotations,
        } = self;
        let lines: String = requested
            .iter()
            .map(|ip| ("aliaslb.io/loadBalancerIPs", ip.as_str()))
            .chain(annotations.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .map(|(k, v)| format!("    {k}: \"{v}\"\n"))
            .collect();
        let annotations = if lines.is_empty() {
            String::new()
        } else {
            format!("  annotations:\n{lines}")
        };
        let policy = if *local { "Local" } else { "Cluster" };
        let (family_spec, v4, v6) = match families {
            Families::V4 => ("", true, false),
            Families::V6 => (
                "  ipFamilyPolicy: SingleStack\n  ipFamilies: [IPv6]\n",
                false,
                true,
            ),
            Families::Dual => (
                "  ipFamilyPolicy: RequireDualStack\n  ipFamilies: [IPv4, IPv6]\n",
                true,
                true,
            ),
        };
        // One subset per family: the EndpointSlice mirroring controller makes a slice of each.
        let subset = |ip: &dyn Fn(u8) -> String| -> String {
            let addresses: String = pod_nodes
                .iter()
                .map(|&n| format!("  - ip: {}\n    nodeName: {}\n", ip(n), node_name(n)))
                .collect();
            format!("- addresses:\n{addresses}  ports:\n  - name: http\n    port: 8080\n")
        };
        let mut subsets = String::new();
        if v4 {
            subsets += &subset(&|n| format!("10.244.{n}.10"));
        }
        if v6 {
            subsets += &subset(&|n| format!("fd44:0:0:{n}::10"));
        }
        format!(
            "apiVersion: v1
kind: Service
metadata:
  name: {name}
  namespace: {ns}
{annotations}spec:
  type: LoadBalancer
  externalTrafficPolicy: {policy}
{family_spec}  ports:
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
{subsets}"
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
    fn annotations_are_written_together() {
        let yaml = lb_service("ns", "web")
            .requesting("10.0.0.1")
            .annotated("metallb.universe.tf/address-pool", "many")
            .to_yaml();
        assert!(
            yaml.contains("  annotations:\n    aliaslb.io/loadBalancerIPs: \"10.0.0.1\"\n    metallb.universe.tf/address-pool: \"many\"\n"),
            "{yaml}"
        );
        assert!(!lb_service("ns", "web").to_yaml().contains("annotations"));
    }

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
    fn dual_stack_service_has_endpoints_of_both_families() {
        let yaml = lb_service("ns", "web").families(Families::Dual).to_yaml();
        assert!(yaml.contains("ipFamilyPolicy: RequireDualStack"), "{yaml}");
        assert!(
            yaml.contains("ip: 10.244.1.10") && yaml.contains("ip: fd44:0:0:2::10"),
            "{yaml}"
        );
        let v6 = lb_service("ns", "web").families(Families::V6).to_yaml();
        assert!(
            v6.contains("ipFamilies: [IPv6]") && !v6.contains("10.244."),
            "{v6}"
        );
        let v4 = lb_service("ns", "web").to_yaml();
        assert!(!v4.contains("ipFamil") && !v4.contains("fd44"), "{v4}");
    }

    #[test]
    fn pool_patch_is_one_address_per_line() {
        assert_eq!(
            pool_patch("team", &["192.168.55.20", "192.168.55.21"]),
            r#"{"data":{"team":"192.168.55.20\n192.168.55.21"}}"#
        );
    }
}
