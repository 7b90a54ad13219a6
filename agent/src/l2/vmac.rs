//! Virtual MACs (pools with `virtualMAC: true`): each such IP is answered from its own
//! locally administered MAC ([`aliaslb_core::mac::virtual_mac`]), which moves with it.
//!
//! The holder puts the IP on a macvlan of the LAN interface (mode bridge) that carries the
//! IP's MAC and is named after it: `alb` and the MAC's twelve hex digits
//! (`alb0200c0a8370a`), so the agent finds its own after a restart and never touches a
//! link of anyone else. A client whose neighbour entry for the IP is pinned, a switch or an
//! appliance that ignores gratuitous ARP, keeps sending to the same MAC after a move; the
//! new holder's announcement (sent from that MAC) only teaches the switches the new port.
//!
//! Three kernel settings keep one MAC per IP on the LAN ([`crate::kernel::netlink`] writes
//! them):
//! - the macvlan answers ARP only for its own addresses (`arp_ignore=1`), not for the
//!   node's, and generates no IPv6 link-local address (`addr_gen_mode none`): a macvlan
//!   left behind by a dead agent says nothing on the LAN with the MAC another node now
//!   carries;
//! - its reverse-path filter is loose (`rp_filter=2`): replies leave through the parent's
//!   subnet route, not through the macvlan, which a strict filter would drop;
//! - the parent answers ARP only for its own addresses too (`arp_ignore=1`, as keepalived
//!   sets for its VMACs), or it would answer for the IP with the node's MAC beside the
//!   macvlan. IPv6 needs no such setting: NDP answers only on the interface that holds
//!   the address.
//!
//! Pure: which macvlans to create and which to delete, from the desired set and a dump.

use std::collections::BTreeSet;
use std::net::IpAddr;

use aliaslb_core::mac::Mac;

use crate::desired::DesiredSet;
use crate::host::{HostState, InterfaceError, Interfaces, Link};
use crate::kernel::backend::NewMacvlan;

/// The link kind of a macvlan, as the kernel names it.
pub const KIND: &str = "macvlan";

/// Prefix of our macvlans' names.
const PREFIX: &str = "alb";

/// The name of the macvlan carrying `mac`: `alb` and its hex digits (15 characters, the
/// longest name Linux takes).
pub fn link_name(mac: Mac) -> String {
    let mut name = String::with_capacity(15);
    name.push_str(PREFIX);
    for byte in mac.0 {
        name.push_str(&format!("{byte:02x}"));
    }
    name
}

/// Whether `link` is a macvlan of ours: a macvlan named after its own MAC.
pub fn is_ours(link: &Link) -> bool {
    link.kind.as_deref() == Some(KIND) && link.mac.is_some_and(|m| link.name == link_name(Mac(m)))
}

/// What to change among our macvlans.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct MacvlanPlan {
    /// Macvlans a desired IP needs that the node does not have.
    pub create: Vec<NewMacvlan>,
    /// Our macvlans no desired IP needs (index, name): deleted after the aliases.
    pub delete: Vec<(u32, String)>,
    /// Desired IPs whose macvlan has no parent to go on.
    pub no_parent: Vec<(IpAddr, InterfaceError)>,
}

/// The macvlans `desired` needs on `host`: one per virtual MAC of an L2 IP, on the
/// interface the IP would go on without one (`--interface`, the assignment, the subnet);
/// ours that nothing needs are to be deleted.
pub fn plan(
    desired: &DesiredSet,
    host: &HostState,
    interface_override: Option<&str>,
) -> MacvlanPlan {
    let mut out = MacvlanPlan::default();
    let mut needed = BTreeSet::new();
    let interfaces = Interfaces::of(host);
    for (ip, assigned) in desired.iter() {
        let Some(mac) = desired.vmac(ip).filter(|_| !desired.is_routed(ip)) else {
            continue;
        };
        let name = link_name(mac);
        if !needed.insert(name.clone()) {
            continue;
        }
        if host.links.iter().any(|l| l.name == name && is_ours(l)) {
            continue;
        }
        match interfaces.choose(ip, interface_override, assigned) {
            // A macvlan never goes on one of ours (an assignment naming one is a bug).
            Ok(parent) if !is_ours(parent) => out.create.push(NewMacvlan {
                name,
                mac,
                parent: parent.index,
                parent_name: parent.name.clone(),
            }),
            Ok(parent) => out.no_parent.push((
                ip,
                InterfaceError::NoSuchInterface {
                    name: parent.name.clone(),
                    source_of_name: "a virtual MAC's parent (it is a macvlan of ours)",
                },
            )),
            Err(e) => out.no_parent.push((ip, e)),
        }
    }
    out.delete = host
        .links
        .iter()
        .filter(|l| is_ours(l) && !needed.contains(&l.name))
        .map(|l| (l.index, l.name.clone()))
        .collect();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::HostAddress;

    fn link(index: u32, name: &str, mac: [u8; 6], kind: Option<&str>) -> Link {
        Link {
            index,
            name: name.into(),
            mac: Some(mac),
            kind: kind.map(str::to_owned),
            up: true,
            parent: None,
        }
    }

    fn host(links: Vec<Link>) -> HostState {
        HostState {
            links,
            addresses: vec![HostAddress {
                ip: "192.168.55.2".parse().unwrap(),
                prefix_len: 24,
                ifindex: 2,
                owned: false,
                global: true,
            }],
            default_v4: None,
            default_v6: None,
        }
    }

    const VMAC: Mac = Mac([2, 0, 192, 168, 55, 10]);

    #[test]
    fn names_are_the_mac_and_fit_ifnamsiz() {
        assert_eq!(link_name(VMAC), "alb0200c0a8370a");
        assert_eq!(link_name(VMAC).len(), 15);
        assert!(is_ours(&link(9, "alb0200c0a8370a", VMAC.0, Some(KIND))));
        // Someone else's macvlan, or a link that merely has our name pattern, is not ours.
        assert!(!is_ours(&link(9, "mv0", VMAC.0, Some(KIND))));
        assert!(!is_ours(&link(9, "alb0200c0a8370a", VMAC.0, Some("veth"))));
        assert!(!is_ours(&link(9, "alb0200c0a8370b", VMAC.0, Some(KIND))));
    }

    #[test]
    fn a_virtual_mac_ip_gets_a_macvlan_on_its_subnet_and_unneeded_ones_go() {
        let ip: IpAddr = "192.168.55.10".parse().unwrap();
        let mut desired = DesiredSet::new();
        desired.insert(ip, None);
        desired.set_vmac(ip, VMAC);
        desired.insert("192.168.55.11".parse().unwrap(), None);
        let stale = Mac([2, 0, 192, 168, 55, 99]);
        let h = host(vec![
            link(2, "eth0", [0x52, 0, 0, 0, 0, 1], None),
            link(7, &link_name(stale), stale.0, Some(KIND)),
            link(8, "mv-other", [2, 9, 9, 9, 9, 9], Some(KIND)),
        ]);
        let p = plan(&desired, &h, None);
        assert_eq!(
            p.create,
            vec![NewMacvlan {
                name: "alb0200c0a8370a".into(),
                mac: VMAC,
                parent: 2,
                parent_name: "eth0".into(),
            }]
        );
        assert_eq!(
            p.delete,
            vec![(7, link_name(stale))],
            "never the operator's"
        );
        assert!(p.no_parent.is_empty());
        // Once there, nothing to do; without the IP, it goes.
        let mut with = h.clone();
        with.links
            .push(link(9, "alb0200c0a8370a", VMAC.0, Some(KIND)));
        with.links.retain(|l| l.index != 7);
        assert_eq!(plan(&desired, &with, None), MacvlanPlan::default());
        assert_eq!(
            plan(&DesiredSet::new(), &with, None).delete,
            vec![(9, "alb0200c0a8370a".to_owned())]
        );
    }

    #[test]
    fn no_parent_is_said_per_ip() {
        let ip: IpAddr = "10.9.0.10".parse().unwrap();
        let mut desired = DesiredSet::new();
        desired.insert(ip, Some("eth9".into()));
        desired.set_vmac(ip, VMAC);
        let p = plan(
            &desired,
            &host(vec![link(2, "eth0", [0x52, 0, 0, 0, 0, 1], None)]),
            None,
        );
        assert!(p.create.is_empty());
        assert_eq!(p.no_parent.len(), 1);
        assert!(
            p.no_parent[0].1.to_string().contains("eth9"),
            "{:?}",
            p.no_parent
        );
    }
}
