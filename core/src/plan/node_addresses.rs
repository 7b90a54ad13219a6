//! The node-address fence of a pass: an address a Node has is never handed out (see the
//! module docs of [`crate::plan`]). Pure.
//!
//! The fence is kept in the ledgers: each address a Node has is marked in use in the ledger
//! of the pool listing it, for no Service, so every way of taking an address (lowest free,
//! sticky, requested) finds it taken. Only the addresses that changed are looked at, or all
//! of them after a new config (the ledgers were rebuilt): O(changes x log n) a pass.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

use super::{Planner, Sink};
use crate::pool::{Pool, PoolConfig, PoolKey};
use crate::range::Family;

/// Node addresses named at most in one message; more are counted.
const NAMED: usize = 3;

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

/// The addresses of `addresses` that lie in `pool`, of `family`. O(ranges x log n) plus the
/// addresses found.
fn in_pool<'m>(
    addresses: &'m BTreeMap<IpAddr, NodeAddress>,
    pool: &'m Pool,
    family: Family,
) -> impl Iterator<Item = (&'m IpAddr, &'m NodeAddress)> + 'm {
    pool.ranges
        .iter()
        .filter(move |r| r.family() == family)
        .flat_map(move |r| addresses.range(r.first()..=r.last()))
}

impl Planner {
    /// Keeps every address a Node has in use in the ledger of the pool listing it, and takes
    /// it from the Services holding it ([`Planner::clear_ip`], the path of an address
    /// removed from the pool); gives back to their pool the addresses no Node has any
    /// more. Runs after [`Planner::apply_config`]: a new config rebuilt the ledgers, so
    /// then every address is fenced again.
    pub(super) fn fence_node_addresses(
        &mut self,
        current: &BTreeMap<IpAddr, NodeAddress>,
        sink: &mut Sink,
    ) {
        if !self.config_changed && self.node_addresses == *current {
            return;
        }
        let gone: Vec<IpAddr> = self
            .node_addresses
            .keys()
            .filter(|ip| !current.contains_key(ip))
            .copied()
            .collect();
        for ip in gone {
            if self.ips.contains_key(&ip) || self.quarantined.contains(&ip) {
                continue;
            }
            if let Some(ledger) = self.ledgers.values_mut().find(|l| l.contains(ip))
                && ledger.release(ip)
            {
                self.freed += 1;
            }
        }
        for (ip, address) in current {
            if !self.config_changed && self.node_addresses.contains_key(ip) {
                continue;
            }
            if self.ips.contains_key(ip) {
                self.clear_ip(*ip, &format!("is {address}: never allocated"), sink);
            }
            self.reserve(*ip);
        }
        self.node_addresses.clone_from(current);
    }

    /// Why `ip` may not be handed out, if a Node has it.
    pub(super) fn node_address(&self, ip: IpAddr) -> Option<String> {
        self.node_addresses
            .get(&ip)
            .map(|address| format!("{ip} is {address}: never allocated"))
    }

    /// The addresses of pool `key`, of `family`, fenced as a Node's (in use for no Service).
    pub(super) fn fenced(
        &self,
        key: &PoolKey,
        family: Family,
    ) -> impl Iterator<Item = (&IpAddr, &NodeAddress)> + '_ {
        self.config
            .as_ref()
            .and_then(|c| c.pool(key))
            .into_iter()
            .flat_map(move |pool| in_pool(&self.node_addresses, pool, family))
            .filter(|(ip, _)| !self.ips.contains_key(ip))
    }

    /// For a `PoolExhausted` message: which of the pool's addresses of `family` are a
    /// Node's (empty when none is): `; 1 of them is a Node's address, never allocated
    /// (10.0.0.2 is the InternalIP of node n3)`.
    pub(super) fn fenced_note(&self, key: &PoolKey, family: Family) -> String {
        let fenced: Vec<(&IpAddr, &NodeAddress)> = self.fenced(key, family).collect();
        if fenced.is_empty() {
            return String::new();
        }
        let mut named: Vec<String> = fenced
            .iter()
            .take(NAMED)
            .map(|(ip, address)| format!("{ip} is {address}"))
            .collect();
        if fenced.len() > NAMED {
            named.push(format!("{} more", fenced.len() - NAMED));
        }
        let count = match fenced.len() {
            1 => "1 of them is a Node's address".to_owned(),
            n => format!("{n} of them are Node addresses"),
        };
        format!("; {count}, never allocated ({})", named.join(", "))
    }
}
