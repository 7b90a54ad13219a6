//! The node's network state as the agent sees it, and the pure decisions taken on it:
//! which interface carries an alias, and which interfaces/subnets the node reports.
//!
//! Plain data, no I/O: `netlink.rs` fills a [`HostState`] from the kernel, tests build one
//! by hand.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;

use aliaslb_core::mac::Mac;
use aliaslb_core::range::Family;
use aliaslb_core::report::InterfaceReport;
use ipnet::IpNet;

/// A network interface (link) of the node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// Kernel interface index.
    pub index: u32,
    /// Interface name, e.g. `eth0`.
    pub name: String,
    /// Hardware address, when the link has an Ethernet one.
    pub mac: Option<[u8; 6]>,
    /// The kernel's link kind (IFLA_INFO_KIND: `veth`, `bridge`, `vxlan`, `bond`...);
    /// `None` for a physical NIC (and loopback). See [`is_node_link`].
    pub kind: Option<String>,
    /// Whether the link is operationally up: administratively up and with carrier. A link
    /// that is down (cable out) is left out of the interface report, and aliases on it do
    /// not count as held, so the controller moves their IPs instead of waiting for them.
    pub up: bool,
    /// The link it is stacked on (IFLA_LINK: a macvlan's parent), if any.
    pub parent: Option<u32>,
}

/// One address present on the node, ours or not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostAddress {
    /// The address.
    pub ip: IpAddr,
    /// Its prefix length (`24` for `10.0.0.2/24`).
    pub prefix_len: u8,
    /// Index of the interface holding it.
    pub ifindex: u32,
    /// Whether it carries our ownership marker (IFA_PROTO, or the IPv4 `:alb` label).
    pub owned: bool,
    /// Whether it is global scope (not link-local, not host/loopback).
    pub global: bool,
}

/// Everything the reconcile and the interface choice need to know about the node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostState {
    /// All links.
    pub links: Vec<Link>,
    /// All addresses on all links.
    pub addresses: Vec<HostAddress>,
    /// Interface index of the IPv4 default route, if any.
    pub default_v4: Option<u32>,
    /// Interface index of the IPv6 default route, if any.
    pub default_v6: Option<u32>,
}

impl HostState {
    /// Whether the link `ifindex` has carrier: it is operationally up, or it is a macvlan
    /// (a virtual MAC's link, just created and not yet seen up) on a parent that is. Only a
    /// macvlan's IFLA_LINK is its parent here: a veth's names its peer, in another
    /// namespace. A link this dump does not show counts as up: the write says what is
    /// wrong with it.
    pub fn has_carrier(&self, ifindex: u32) -> bool {
        let link = |i: u32| self.links.iter().find(|l| l.index == i);
        match link(ifindex) {
            None => true,
            Some(l) => {
                l.up || (l.kind.as_deref() == Some(crate::l2::vmac::KIND)
                    && l.parent.and_then(link).is_some_and(|p| p.up))
            }
        }
    }
}

/// An alias the agent manages: an IP as a /32 or /128 on one interface.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Alias {
    /// The load-balancer IP.
    pub ip: IpAddr,
    /// Index of the interface carrying it.
    pub ifindex: u32,
    /// Name of that interface (for logs, labels and reports).
    pub ifname: String,
}

impl Alias {
    /// Host prefix length of the alias: 32 for IPv4, 128 for IPv6.
    pub fn prefix_len(&self) -> u8 {
        host_prefix_len(self.ip)
    }
}

impl fmt::Display for Alias {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{} dev {}", self.ip, self.prefix_len(), self.ifname)
    }
}

/// 32 for IPv4, 128 for IPv6.
pub fn host_prefix_len(ip: IpAddr) -> u8 {
    match ip {
        IpAddr::V4(_) => 32,
        IpAddr::V6(_) => 128,
    }
}

/// Why no interface could be chosen for an IP.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InterfaceError {
    /// The interface named by `--interface` or by the assignment is not on this node.
    #[error("interface {name:?} (from {source_of_name}) does not exist on this node")]
    NoSuchInterface {
        /// The name asked for.
        name: String,
        /// Where the name came from: `--interface` or `the assignment`.
        source_of_name: &'static str,
    },
    /// No subnet holds the IP and there is no default route of its family.
    #[error(
        "no interface for {ip}: no connected subnet holds it and there is no {family} default route; \
         set --interface or the pool's interface option"
    )]
    NoCandidate {
        /// The IP.
        ip: IpAddr,
        /// Its family.
        family: Family,
    },
}

/// Picks the interface for `ip`, in order: the `override_name` (`--interface`), the
/// interface named in the assignment, the interface whose connected subnet (a non-alias
/// address) holds `ip`, the interface of the default route of `ip`'s family. For many IPs
/// on one node state, [`Interfaces`] collects the subnets once.
pub fn choose_interface<'a>(
    host: &'a HostState,
    ip: IpAddr,
    override_name: Option<&str>,
    assigned_name: Option<&str>,
) -> Result<&'a Link, InterfaceError> {
    Interfaces::of(host).choose(ip, override_name, assigned_name)
}

/// [`choose_interface`] for many IPs of one node state: the node's connected subnets
/// (its own addresses, shorter than a host's) are collected once. Per IP, walking every
/// address instead made a plan over 10,000 aliases quadratic (BENCHMARKS, "The first sync
/// in batches").
#[derive(Debug)]
pub struct Interfaces<'a> {
    host: &'a HostState,
    /// The node's connected subnets, each with its address's interface index.
    subnets: Vec<(IpNet, u32)>,
}

impl<'a> Interfaces<'a> {
    /// The subnets of `host`, collected.
    pub fn of(host: &'a HostState) -> Self {
        let subnets = host
            .addresses
            .iter()
            .filter(|a| !a.owned && a.prefix_len < host_prefix_len(a.ip))
            .filter_map(|a| Some((net_of(a)?, a.ifindex)))
            .collect();
        Interfaces { host, subnets }
    }

    /// The node state the interfaces are chosen in.
    pub fn host(&self) -> &'a HostState {
        self.host
    }

    /// The interface for `ip`, as [`choose_interface`] says.
    pub fn choose(
        &self,
        ip: IpAddr,
        override_name: Option<&str>,
        assigned_name: Option<&str>,
    ) -> Result<&'a Link, InterfaceError> {
        let host = self.host;
        let by_name = |name: &str, source_of_name| {
            host.links.iter().find(|l| l.name == name).ok_or_else(|| {
                InterfaceError::NoSuchInterface {
                    name: name.to_string(),
                    source_of_name,
                }
            })
        };
        if let Some(name) = override_name {
            return by_name(name, "--interface");
        }
        if let Some(name) = assigned_name {
            return by_name(name, "the assignment");
        }
        // Longest matching prefix wins, as routing would pick it.
        let by_subnet = self
            .subnets
            .iter()
            .filter(|(net, _)| net.contains(&ip))
            .max_by_key(|(net, _)| net.prefix_len())
            .and_then(|(_, index)| host.links.iter().find(|l| l.index == *index));
        if let Some(link) = by_subnet {
            return Ok(link);
        }
        let family = Family::of(ip);
        let default = match family {
            Family::V4 => host.default_v4,
            Family::V6 => host.default_v6,
        };
        default
            .and_then(|index| host.links.iter().find(|l| l.index == index))
            .ok_or(InterfaceError::NoCandidate { ip, family })
    }
}

/// Link kinds that pods, overlays and the node's own plumbing use: each pod's veth, the
/// CNI's bridge, VXLAN / Geneve / IP-in-IP / GRE / WireGuard tunnels, dummies (kube-ipvs0,
/// nodelocaldns, aliaslb0), Open vSwitch ports.
pub const VIRTUAL_KINDS: &[&str] = &[
    "veth",
    "bridge",
    "vxlan",
    "geneve",
    "ipip",
    "ip6tnl",
    "sit",
    "gre",
    "gretap",
    "ip6gre",
    "ip6gretap",
    "wireguard",
    "tun",
    "dummy",
    "ifb",
    "nlmon",
    "openvswitch",
];

/// Name prefixes of the links CNIs and kube-proxy create and address themselves (`cni0`,
/// `flannel.1`, `cali*`, `vxlan.calico`, `tunl0`, `cilium_host`, `lxc*`, `docker0`,
/// `kube-ipvs0`, `weave`, `antrea-gw0`, `ovn-k8s-mp0`, `genev_sys_6081`, `nodelocaldns`).
pub const CNI_NAME_PREFIXES: &[&str] = &[
    "cni",
    "flannel",
    "cali",
    "vxlan",
    "tunl",
    "cilium",
    "lxc",
    "docker",
    "kube-",
    "weave",
    "antrea-",
    "ovn-k8s-",
    "genev_sys",
    "nodelocaldns",
    "veth",
];

/// Whether `link` is one of the node's own links, the ones the report lists and the LAN is
/// watched on, rather than a pod's or an overlay's (a node with 300 pods has 300 veths; one
/// LAN socket and one report entry each would make the report too large and cost a thread
/// per pod). Decided by the link's kind first: a physical NIC, bond, VLAN, macvlan (any
/// kind not in [`VIRTUAL_KINDS`]) is the node's, whatever its name. A virtual link is the
/// node's only when it carries one of the node's own addresses (global scope, not an
/// alias: a bridge holding the node IP, a veth as the LAN link of a node in a network
/// namespace) and does not have a CNI's name ([`CNI_NAME_PREFIXES`]: `cni0` and
/// `flannel.1` hold the pod network's gateway address, not the node's).
pub fn is_node_link(host: &HostState, link: &Link) -> bool {
    let virtual_kind = link
        .kind
        .as_deref()
        .is_some_and(|kind| VIRTUAL_KINDS.contains(&kind));
    if !virtual_kind {
        return true;
    }
    let cni_name = CNI_NAME_PREFIXES
        .iter()
        .any(|prefix| link.name.starts_with(prefix));
    !cni_name
        && host
            .addresses
            .iter()
            .any(|a| a.ifindex == link.index && a.global && !a.owned)
}

/// The node's interfaces with the connected subnets (network addresses, e.g.
/// `10.0.0.0/24`) of their global-scope, non-alias addresses, in the Lease report's
/// shape. Interfaces that are down (see [`Link::up`]), not the node's own (pod and CNI
/// links, [`is_node_link`]) or without such an address are left out.
pub fn interfaces(host: &HostState) -> Vec<InterfaceReport> {
    host.links
        .iter()
        .filter(|link| link.up && is_node_link(host, link))
        .filter_map(|link| {
            let mut subnets: Vec<IpNet> = host
                .addresses
                .iter()
                .filter(|a| a.ifindex == link.index && a.global && !a.owned)
                .filter_map(net_of)
                .collect();
            subnets.sort();
            subnets.dedup();
            let mut addresses: Vec<IpAddr> = host
                .addresses
                .iter()
                .filter(|a| a.ifindex == link.index && a.global && !a.owned)
                .map(|a| a.ip)
                .collect();
            addresses.sort();
            addresses.dedup();
            (!subnets.is_empty()).then(|| InterfaceReport {
                mac: link.mac.map(Mac),
                name: link.name.clone(),
                subnets,
                addresses,
            })
        })
        .collect()
}

fn net_of(a: &HostAddress) -> Option<IpNet> {
    IpNet::new(a.ip, a.prefix_len).ok().map(|n| n.trunc())
}

/// What the alias manager holds as of its last reconcile, read-only: the aliases it owns,
/// the node as it last read it, and `--interface`. Lent to the parts of the agent that act
/// on the aliases (the LAN guard, fast failover) without handing them the manager
/// (`AliasManager::held`).
#[derive(Debug, Clone, Copy)]
pub struct Held<'a> {
    owned: &'a BTreeMap<IpAddr, Alias>,
    host: Option<&'a HostState>,
    interface_override: Option<&'a str>,
}

impl<'a> Held<'a> {
    /// The aliases `owned`, the node as last read (`host`) and `--interface`.
    pub fn new(
        owned: &'a BTreeMap<IpAddr, Alias>,
        host: Option<&'a HostState>,
        interface_override: Option<&'a str>,
    ) -> Self {
        Held {
            owned,
            host,
            interface_override,
        }
    }

    /// Our alias of `ip`, if we hold it. O(log n).
    pub fn alias(&self, ip: IpAddr) -> Option<&'a Alias> {
        self.owned.get(&ip)
    }

    /// The aliases we hold.
    pub fn aliases(&self) -> impl Iterator<Item = &'a Alias> + use<'a> {
        self.owned.values()
    }

    /// The IPs we hold, in order.
    pub fn ips(&self) -> BTreeSet<IpAddr> {
        self.owned.keys().copied().collect()
    }

    /// The node as the last reconcile read it.
    pub fn host(&self) -> Option<&'a HostState> {
        self.host
    }

    /// `--interface`, if given.
    pub fn interface_override(&self) -> Option<&'a str> {
        self.interface_override
    }

    /// The link `ip` goes on on the LAN (`assigned`: the interface its line names).
    pub fn lan_link(&self, ip: IpAddr, assigned: Option<&str>) -> Option<&'a Link> {
        Interfaces::of(self.host?)
            .choose(ip, self.interface_override, assigned)
            .ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(index: u32, name: &str) -> Link {
        Link {
            index,
            name: name.into(),
            mac: Some([2, 0, 0, 0, 0, index as u8]),
            kind: None,
            up: true,
            parent: None,
        }
    }

    fn addr(ifindex: u32, cidr: &str) -> HostAddress {
        let net: IpNet = cidr.parse().unwrap();
        HostAddress {
            ip: net.addr(),
            prefix_len: net.prefix_len(),
            ifindex,
            owned: false,
            global: true,
        }
    }

    fn host() -> HostState {
        HostState {
            links: vec![link(1, "lo"), link(2, "eth0"), link(3, "eth1")],
            addresses: vec![
                addr(2, "192.168.1.10/24"),
                addr(3, "10.0.0.2/24"),
                addr(3, "10.0.0.0/16"),
                addr(3, "fd00:1::2/64"),
                HostAddress {
                    owned: true,
                    ..addr(2, "10.0.0.77/8")
                },
            ],
            default_v4: Some(2),
            default_v6: None,
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn override_wins_over_everything() {
        let h = host();
        let l = choose_interface(&h, ip("10.0.0.50"), Some("eth0"), Some("eth1")).unwrap();
        assert_eq!(l.name, "eth0");
    }

    #[test]
    fn assignment_wins_over_subnet() {
        let h = host();
        let l = choose_interface(&h, ip("10.0.0.50"), None, Some("eth0")).unwrap();
        assert_eq!(l.name, "eth0");
    }

    #[test]
    fn subnet_picks_longest_prefix_and_ignores_owned_aliases() {
        let h = host();
        assert_eq!(
            choose_interface(&h, ip("10.0.0.50"), None, None)
                .unwrap()
                .name,
            "eth1"
        );
        // 10.0.0.0/8 exists only as one of our aliases: falls back to the default route.
        assert_eq!(
            choose_interface(&h, ip("10.9.9.9"), None, None)
                .unwrap()
                .name,
            "eth0"
        );
        assert_eq!(
            choose_interface(&h, ip("fd00:1::50"), None, None)
                .unwrap()
                .name,
            "eth1"
        );
    }

    #[test]
    fn missing_interface_and_no_default_are_clear_errors() {
        let h = host();
        let err = choose_interface(&h, ip("10.0.0.50"), Some("bond7"), None).unwrap_err();
        assert!(
            err.to_string().contains("\"bond7\" (from --interface)"),
            "{err}"
        );
        let err = choose_interface(&h, ip("2001:db8::1"), None, None).unwrap_err();
        assert_eq!(
            err,
            InterfaceError::NoCandidate {
                ip: ip("2001:db8::1"),
                family: Family::V6
            }
        );
        assert!(err.to_string().contains("IPv6 default route"), "{err}");
    }

    #[test]
    fn interfaces_report_subnets_without_aliases() {
        let mut h = host();
        h.addresses.push(HostAddress {
            global: false,
            ..addr(1, "127.0.0.1/8")
        });
        let got = interfaces(&h);
        assert_eq!(
            got,
            vec![
                InterfaceReport {
                    addresses: vec![ip("192.168.1.10")],
                    mac: Some(Mac([2, 0, 0, 0, 0, 2])),
                    name: "eth0".into(),
                    subnets: vec!["192.168.1.0/24".parse().unwrap()],
                },
                InterfaceReport {
                    addresses: vec![ip("10.0.0.0"), ip("10.0.0.2"), ip("fd00:1::2")],
                    mac: Some(Mac([2, 0, 0, 0, 0, 3])),
                    name: "eth1".into(),
                    subnets: vec![
                        "10.0.0.0/16".parse().unwrap(),
                        "10.0.0.0/24".parse().unwrap(),
                        "fd00:1::/64".parse().unwrap(),
                    ],
                },
            ]
        );
    }

    #[test]
    fn a_link_without_carrier_is_left_out_of_the_report() {
        let mut h = host();
        h.links[1].up = false; // eth0: cable out
        let names: Vec<String> = interfaces(&h).into_iter().map(|i| i.name).collect();
        assert_eq!(names, ["eth1"]);
    }

    #[test]
    fn carrier_is_the_links_own_or_for_a_macvlan_its_parents() {
        let mut h = host();
        h.links[1].up = false; // eth0: cable out
        // A veth's IFLA_LINK names its peer (an index in another namespace, here eth1's).
        h.links[1].kind = Some("veth".into());
        h.links[1].parent = Some(h.links[2].index);
        assert!(!h.has_carrier(h.links[1].index));
        assert!(h.has_carrier(h.links[2].index));
        let macvlan = |index: u32, parent: u32, up: bool| Link {
            kind: Some(crate::l2::vmac::KIND.into()),
            parent: Some(parent),
            up,
            ..link(index, "alb0")
        };
        h.links.push(macvlan(20, h.links[2].index, false));
        assert!(h.has_carrier(20), "on eth1, which has carrier");
        h.links.push(macvlan(21, h.links[1].index, false));
        assert!(!h.has_carrier(21), "on eth0, which has none");
        assert!(h.has_carrier(99), "not in the dump: the write says");
    }

    #[test]
    fn pod_and_cni_links_are_not_the_nodes_by_kind_then_address_then_name() {
        let virt = |index: u32, name: &str, kind: &str| Link {
            kind: Some(kind.into()),
            ..link(index, name)
        };
        let mut h = host();
        h.links.extend([
            virt(10, "veth1a2b", "veth"),   // a pod's veth: no address of the node
            virt(11, "cali0123", "veth"),   // calico's
            virt(12, "cni0", "bridge"),     // holds the pod gateway 10.244.0.1/24
            virt(13, "flannel.1", "vxlan"), // holds 10.244.0.0/32
            virt(14, "br0", "bridge"),      // holds the node's own address
            virt(15, "eth9", "veth"),       // a netns node's LAN link, addressed
            Link {
                kind: Some("bond".into()),
                ..link(16, "cni-looking-bond") // a bond is the node's whatever its name
            },
            virt(17, "lan7", "veth"), // addressed only by one of our aliases
        ]);
        h.addresses.extend([
            addr(12, "10.244.0.1/24"),
            addr(13, "10.244.0.0/32"),
            addr(14, "192.168.7.2/24"),
            addr(15, "10.9.0.2/24"),
            addr(16, "10.8.0.2/24"),
            HostAddress {
                owned: true,
                ..addr(17, "10.7.0.9/32")
            },
        ]);
        let node: Vec<&str> = h
            .links
            .iter()
            .filter(|l| is_node_link(&h, l))
            .map(|l| l.name.as_str())
            .collect();
        assert_eq!(
            node,
            ["lo", "eth0", "eth1", "br0", "eth9", "cni-looking-bond"]
        );
        let reported: Vec<String> = interfaces(&h).into_iter().map(|i| i.name).collect();
        assert_eq!(
            reported,
            ["eth0", "eth1", "br0", "eth9", "cni-looking-bond"]
        );
    }
}
