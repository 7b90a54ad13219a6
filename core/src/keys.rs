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
/// Service annotation naming the pool its addresses come from: a named pool's name, or
/// `_fallback` (written by users; see [`crate::pool::Tenancy`]).
pub const ANNOTATION_POOL: &str = "aliaslb.io/pool";
/// Service annotation written by the controller: the node elected to carry the IPs.
pub const ANNOTATION_NODE: &str = "aliaslb.io/node";
/// Service annotation written by the controller: the interface to put the alias on.
pub const ANNOTATION_INTERFACE: &str = "aliaslb.io/interface";

/// Node label that excludes a node from carrying load-balancer IPs (upstream name).
pub const LABEL_EXCLUDE_FROM_LB: &str = "node.kubernetes.io/exclude-from-external-load-balancers";

/// Agent Lease annotation: the agent's [`crate::report::AgentReport`] as JSON.
pub const ANNOTATION_AGENT_REPORT: &str = "aliaslb.io/report";

/// Agent Lease label: the agent's release ([`crate::version::label_value`] of its
/// version), which the controller checks against the releases it supports
/// ([`crate::version::agent_support`]); `kubectl get leases -L aliaslb.io/agent-version`
/// lists them. Agents older than version reporting write none.
pub const LABEL_AGENT_VERSION: &str = "aliaslb.io/agent-version";

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
/// Data key of an assignment index of earlier releases listing every node's MACs
/// ([`crate::assignment::NodeAssignments::parse_node_macs`]); read, no longer written.
pub const NODE_MACS_KEY: &str = "node-macs";
/// Data key of a node's index listing its LAN peers: the nodes it exchanges fast-failover
/// adverts and acks with, with their signing keys and MACs
/// ([`crate::assignment::NodeAssignments::render_peers`]).
pub const PEERS_KEY: &str = "peers";

/// Data key of a node's index listing its **handovers**: the IPs it forwards the packets of
/// unknown TCP flows for, to the node they came from, and the IPs whose established flows
/// it still carries, during the drain window of a planned move
/// ([`crate::assignment::NodeAssignments::render_handovers`]). Agents older than handovers
/// do not read the key: they neither forward nor count, and misread nothing.
pub const HANDOVERS_KEY: &str = "handovers";

/// Data key of a node's index object: how many shards hold its IP lines
/// ([`crate::assignment::shards`]). Absent: the single-object format of earlier releases,
/// whose lines are under [`ASSIGNMENTS_KEY`].
pub const SHARDS_KEY: &str = "shards";
/// Label on a node's index object and on each of its shards, so its agent watches its own
/// node's objects only: the node's name ([`assignment_node_label`]).
pub const LABEL_ASSIGNMENT_NODE: &str = "aliaslb.io/assignment-node";

/// Name of the ConfigMap (in the controller's namespace) that says what `node` must carry:
/// its index (the shard count and every node's MACs), or in the format of earlier releases,
/// its whole assignment.
pub fn assignment_configmap(node: &str) -> String {
    format!("aliaslb-node-{node}")
}

/// Name of shard `shard` of `node`'s assignment: `aliaslb-shard-<node>-<shard>`. The shard
/// number has no `-`, so the name reads back one way only ([`assignment_shard_of`]), and no
/// shard is ever named like an index.
pub fn assignment_shard_configmap(node: &str, shard: u32) -> String {
    format!("aliaslb-shard-{node}-{shard}")
}

/// The node and shard number of a shard's name: the inverse of
/// [`assignment_shard_configmap`].
pub fn assignment_shard_of(name: &str) -> Option<(&str, u32)> {
    let rest = name.strip_prefix("aliaslb-shard-")?;
    let (node, shard) = rest.rsplit_once('-')?;
    let plain = !node.is_empty() && !shard.is_empty() && shard.bytes().all(|b| b.is_ascii_digit());
    let shard = shard.parse().ok().filter(|_| plain)?;
    // `01` would be a second name for shard 1.
    (assignment_shard_configmap(node, shard) == name).then_some((node, shard))
}

/// Value of [`LABEL_ASSIGNMENT_NODE`] for `node`: its name when that is a valid label value
/// (63 characters at most, as most node names are), else `h` and a stable hash of it. A
/// label is only a filter for the watch: the agent still checks every object's name.
pub fn assignment_node_label(node: &str) -> String {
    let valid = node.len() <= 63
        && node
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        && node
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphanumeric())
        && node
            .bytes()
            .last()
            .is_some_and(|b| b.is_ascii_alphanumeric());
    if valid {
        node.to_owned()
    } else {
        let mut hash = crate::hash::Fnv1a::new();
        hash.write(node.as_bytes());
        format!("h{:016x}", hash.finish_mixed())
    }
}

/// The Secret of earlier releases that held the one key every node signed its adverts
/// with: no longer read or written; the controller deletes it (each node signs with a key
/// of its own now, [`crate::advert`]).
pub const LEGACY_ADVERT_KEY_SECRET: &str = "aliaslb-advert-key";
/// The UDP port of the fast-failover adverts.
pub const DEFAULT_ADVERT_PORT: u16 = 7479;

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

    #[test]
    fn shard_names_read_back_one_way() {
        for (node, shard) in [("a", 1), ("a-1", 0), ("a-1", 2), ("n.example.com", 31)] {
            let name = assignment_shard_configmap(node, shard);
            assert_eq!(assignment_shard_of(&name), Some((node, shard)), "{name}");
        }
        assert_eq!(assignment_shard_configmap("a-1", 2), "aliaslb-shard-a-1-2");
        for name in [
            "aliaslb-shard-a",
            "aliaslb-shard--1",
            "aliaslb-shard-a-",
            "aliaslb-shard-a-01",
            "aliaslb-shard-a-+1",
            "aliaslb-shard-a-99999999999",
            "aliaslb-node-a-1",
        ] {
            assert_eq!(assignment_shard_of(name), None, "{name}");
        }
    }

    #[test]
    fn node_labels_are_valid_label_values() {
        assert_eq!(assignment_node_label("node-a"), "node-a");
        assert_eq!(assignment_node_label("n1.example.com"), "n1.example.com");
        let long = "n".repeat(64);
        let label = assignment_node_label(&long);
        assert_eq!(label.len(), 17);
        assert!(label.starts_with('h'), "{label}");
        assert_ne!(label, assignment_node_label(&"m".repeat(64)));
    }
}
