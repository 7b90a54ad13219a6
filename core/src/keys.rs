//! Names of the annotations, labels, conditions and Leases aliaslb reads and writes.
//! One place, so the controller, the agent, the CLI and the docs cannot drift apart.

/// Prefix of every aliaslb annotation, label and condition type.
pub const DOMAIN: &str = "aliaslb.io";

/// Default `spec.loadBalancerClass` handled by the controller.
pub const DEFAULT_LOAD_BALANCER_CLASS: &str = "aliaslb.io/alias";

/// Service annotation: requested IPs, comma separated (one per family for dual-stack).
pub const ANNOTATION_REQUESTED_IPS: &str = "aliaslb.io/loadBalancerIPs";
/// Service annotation: Services in one namespace with the same key may share an IP.
pub const ANNOTATION_SHARING_KEY: &str = "aliaslb.io/sharing-key";
/// Service annotation written by the controller: the node elected to carry the IPs.
pub const ANNOTATION_NODE: &str = "aliaslb.io/node";
/// Service annotation written by the controller: the interface to put the alias on.
pub const ANNOTATION_INTERFACE: &str = "aliaslb.io/interface";

/// Node label that excludes a node from carrying load-balancer IPs (upstream name).
pub const LABEL_EXCLUDE_FROM_LB: &str = "node.kubernetes.io/exclude-from-external-load-balancers";

/// Agent Lease annotation: the agent's [`crate::report::AgentReport`] as JSON.
pub const ANNOTATION_AGENT_REPORT: &str = "aliaslb.io/report";

/// Service condition: an IP was allocated.
pub const CONDITION_IP_ALLOCATED: &str = "aliaslb.io/IPAllocated";
/// Service condition: the elected node's agent reports holding every IP.
pub const CONDITION_ANNOUNCED: &str = "aliaslb.io/Announced";

/// Default namespace of the controller, the agents' Leases and the pool ConfigMap.
pub const DEFAULT_NAMESPACE: &str = "aliaslb-system";
/// Default name of the pool ConfigMap.
pub const DEFAULT_POOL_CONFIGMAP: &str = "aliaslb-pools";
/// Name of the controllers' leader-election Lease.
pub const CONTROLLER_LEASE: &str = "aliaslb-controller";
/// Field manager used for every server-side apply.
pub const CONTROLLER_FIELD_MANAGER: &str = "aliaslb-controller";
/// Field manager used by agents for their Lease.
pub const AGENT_FIELD_MANAGER: &str = "aliaslb-agent";

/// Prefix of the agents' Lease names: `aliaslb-agent-NODE` ([`agent_lease_name`]).
pub const AGENT_LEASE_PREFIX: &str = "aliaslb-agent-";

/// Name of the Lease an agent on `node` renews.
pub fn agent_lease_name(node: &str) -> String {
    format!("{AGENT_LEASE_PREFIX}{node}")
}

/// The node an agent Lease belongs to, from its name: the inverse of
/// [`agent_lease_name`]; `None` for other Leases.
pub fn agent_lease_node(lease_name: &str) -> Option<&str> {
    lease_name
        .strip_prefix(AGENT_LEASE_PREFIX)
        .filter(|n| !n.is_empty())
}

/// Value of a Service ingress's `ipMode` for our addresses: the node owns the VIP
/// (kube-proxy must not).
pub const IP_MODE_VIP: &str = "VIP";

/// Default namespace of the agents' Leases: apart from the controller's, so an agent's
/// right to write its Lease gives it no write right where the controller keeps its
/// leader Lease, the pool ConfigMap and the assignments.
pub const DEFAULT_AGENT_NAMESPACE: &str = "aliaslb-agents";

/// Label (value `true`) on every node assignment ConfigMap, which the controller watches.
pub const LABEL_ASSIGNMENTS: &str = "aliaslb.io/node-assignment";
/// Data key of an assignment ConfigMap ([`crate::assignment`]).
pub const ASSIGNMENTS_KEY: &str = "ips";
/// Data key of an assignment ConfigMap listing every node's MACs
/// ([`crate::assignment::NodeAssignments::render_node_macs`]).
pub const NODE_MACS_KEY: &str = "node-macs";

/// Name of the ConfigMap (in the controller's namespace) that holds what `node` must carry.
pub fn assignment_configmap(node: &str) -> String {
    format!("aliaslb-node-{node}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_lease_name_is_prefixed() {
        assert_eq!(agent_lease_name("node-a"), "aliaslb-agent-node-a");
        assert_eq!(
            agent_lease_node(&agent_lease_name("node-a")),
            Some("node-a")
        );
        assert_eq!(agent_lease_node("aliaslb-agent-"), None);
        assert_eq!(agent_lease_node("aliaslb-controller"), None);
        assert_eq!(assignment_configmap("node-a"), "aliaslb-node-node-a");
    }
}
