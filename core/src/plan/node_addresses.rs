//! Addresses Nodes have: never handed out (see the module docs of [`crate::plan`]; the
//! withholding itself is [`super::withheld`], shared with LAN conflicts). Pure.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

use crate::pool::{PoolConfig, PoolKey};

/// An address a Node has: which Node, and as what.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeAddress {
    /// The Node's name.
    pub node: String,
    /// The type it is listed as in `status.addresses` (`InternalIP`, `ExternalIP`, ...).
    pub kind: String,
}

impl NodeAddress {
    /// An address of type `kind` of Node `node`.
    pub fn new(node: &str, kind: &str) -> Self {
        NodeAddress {
            node: node.to_owned(),
            kind: kind.to_owned(),
        }
    }
}

impl fmt::Display for NodeAddress {
    /// `the InternalIP of node alb-node-3`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the {} of node {}", self.kind, self.node)
    }
}

/// A pool entry that covers an address a Node has.
///
/// Displays as `key default, line 3: 192.168.55.103 is the InternalIP of node alb-node-3:
/// never allocated`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct NodeAddressClash {
    /// The ConfigMap key of the pool.
    pub key: PoolKey,
    /// 1-based line of the entry within the key's value.
    pub line: usize,
    /// The address.
    pub ip: IpAddr,
    /// Whose it is.
    pub address: NodeAddress,
}

impl fmt::Display for NodeAddressClash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "key {}, line {}: {} is {}: never allocated",
            self.key, self.line, self.ip, self.address
        )
    }
}

/// Every pool entry of `config` that covers one of `addresses`, by key, line and address.
/// O(entries x log n) plus the clashes found.
pub fn node_address_clashes(
    config: &PoolConfig,
    addresses: &BTreeMap<IpAddr, NodeAddress>,
) -> Vec<NodeAddressClash> {
    let mut out = Vec::new();
    if addresses.is_empty() {
        return out;
    }
    for (key, pool) in config.pools() {
        for entry in &pool.entries {
            let range = entry.range;
            for (ip, address) in addresses.range(range.first()..=range.last()) {
                out.push(NodeAddressClash {
                    key: key.clone(),
                    line: entry.line,
                    ip: *ip,
                    address: address.clone(),
                });
            }
        }
    }
    out.sort();
    out
}
