//! The report the heartbeat writes on the Lease, gathered from the parts: what the kernel
//! side holds and refuses, the LAN conflicts, the shield, the node's links and MACs, L3's
//! reading. Also publishes fast failover's adverts, which follow what is held.

use aliaslb_core::report::{Conflict, MAX_CONFLICTS, REPORT_VERSION};

use super::*;

impl<B, S, L> Agent<B, S, L>
where
    B: AddressBackend,
    S: ShieldBackend,
    L: LanPort,
{
    /// Publishes the report; the heartbeat writes the Lease at once when it changed.
    pub(super) fn publish(&mut self) {
        self.failover.publish(self.aliases.held(), &self.links.up);
        let mut conflicts: Vec<Conflict> = self
            .aliases
            .conflicts()
            .map(|c| Conflict {
                while_held: false,
                yielded: false,
                mac: None,
                interface: None,
                ip: c.ip,
                reason: format!("already configured on {} by another owner", c.ifname),
            })
            .collect();
        conflicts.extend(self.lan.conflicts());
        conflicts.truncate(MAX_CONFLICTS);
        // An alias on a link without carrier answers nobody: not held, so the controller's
        // break-before-make can move its IP at once.
        let held: BTreeSet<IpAddr> = self
            .aliases
            .owned()
            .filter(|a| self.links.up.get(&a.ifindex) != Some(&false))
            .map(|a| a.ip)
            .collect();
        let report = AgentReport {
            version: REPORT_VERSION,
            interfaces: self.links.interfaces.clone(),
            conflicts,
            shield: self.aliases.shield_state(),
            // Every Ethernet link of the node's own (a NIC with or without carrier or
            // addresses, not a pod's veth: `host::is_node_link`), so that no other agent
            // takes this node for a foreign host. Not the virtual MACs: they move with
            // their IPs and belong to no node.
            macs: self.lan.node_macs().iter().copied().collect(),
            key: self.failover.key(),
            routing: self.routed.report(&self.sets.desired, &held),
            held,
        };
        self.heartbeat.report_tx.send_if_modified(|current| {
            let changed = current.as_ref() != Some(&report);
            if changed {
                *current = Some(report);
            }
            changed
        });
    }
}
