//! GARP and unsolicited NA frames seen on the far end of a veth, in another network
//! namespace: captured with a raw socket (field checks) and accepted by the peer kernel
//! into its neighbour table (which also proves the ICMPv6 checksum). Needs root.

mod support;

use std::sync::mpsc;
use std::time::{Duration, Instant};

use aliaslb_agent::aliases::{AliasConfig, AliasManager};
use aliaslb_agent::desired::DesiredSet;
use aliaslb_agent::kernel::backend::Lifetime;
use aliaslb_agent::kernel::netlink::NetlinkBackend;
use aliaslb_agent::l2::announce::{AnnounceConfig, Announcer, icmpv6_checksum};
use pnet_datalink::Channel;
use support::{NetNs, node_and_lan, require_root};

const VIP4: [u8; 4] = [10, 0, 0, 50];
const VIP6: &str = "fd00:1::50";
/// An address of an L3 pool.
const ROUTED: [u8; 4] = [10, 200, 0, 7];

/// Captures ARP and ICMPv6 NA frames on `dev` in `ns` for `window`; signals on `ready`
/// once the socket is open.
fn capture(
    ns: &NetNs,
    dev: &'static str,
    window: Duration,
    ready: mpsc::Sender<()>,
) -> std::thread::JoinHandle<Vec<Vec<u8>>> {
    ns.spawn(move || {
        let iface = pnet_datalink::interfaces()
            .into_iter()
            .find(|i| i.name == dev)
            .expect("capture interface");
        let config = pnet_datalink::Config {
            read_timeout: Some(Duration::from_millis(100)),
            ..Default::default()
        };
        let Ok(Channel::Ethernet(_tx, mut rx)) = pnet_datalink::channel(&iface, config) else {
            panic!("cannot open capture socket");
        };
        ready.send(()).unwrap();
        let mut frames = Vec::new();
        let end = Instant::now() + window;
        while Instant::now() < end {
            if let Ok(f) = rx.next() {
                let arp = f.len() >= 42 && f[12..14] == [0x08, 0x06];
                let na = f.len() >= 86 && f[12..14] == [0x86, 0xdd] && f[20] == 58 && f[54] == 136;
                if arp || na {
                    frames.push(f.to_vec());
                }
            }
        }
        frames
    })
}

#[test]
fn garp_and_unsolicited_na_reach_the_peer() {
    if !require_root() {
        return;
    }
    // The peer kernel learns neighbours from unsolicited announcements.
    let (node, lan) = node_and_lan("ann");
    let link: serde_json::Value =
        serde_json::from_str(&node.ip(&["-j", "link", "show", "eth1"])).unwrap();
    let mac_str = link[0]["address"].as_str().unwrap().to_string();
    let mac: Vec<u8> = mac_str
        .split(':')
        .map(|h| u8::from_str_radix(h, 16).unwrap())
        .collect();

    let (ready_tx, ready_rx) = mpsc::channel();
    let captured = capture(&lan, "lan0", Duration::from_millis(1500), ready_tx);
    ready_rx.recv().unwrap();
    let (sent, failed) = node.run(|| async {
        let announcer = Announcer::new(AnnounceConfig {
            repeats: 2,
            interval: Duration::from_millis(200),
        });
        let mut m = AliasManager::new(
            NetlinkBackend::connect().unwrap(),
            AliasConfig {
                interface_override: None,
                lifetime: Lifetime { seconds: 30 },
                // A routed device with a MAC (as a dummy has): still never announced.
                routed_device: "eth1".into(),
            },
        )
        .with_announcer(announcer.clone());
        let mut want: DesiredSet = [
            ("10.0.0.50".parse().unwrap(), None),
            (VIP6.parse().unwrap(), None),
            (ROUTED.into(), None),
        ]
        .into_iter()
        .collect();
        want.mark_routed(ROUTED.into());
        let r = m.reconcile(&want).await;
        assert_eq!(r.added.len(), 3, "{r:?}");
        tokio::time::sleep(Duration::from_millis(700)).await;
        (announcer.frames_sent(), announcer.frames_failed())
    });
    assert_eq!(
        (sent, failed),
        (6, 0),
        "1 + 2 repeats per L2 alias, none for the routed one"
    );
    let frames = captured.join().unwrap();
    assert!(
        !frames
            .iter()
            .any(|f| f[12..14] == [0x08, 0x06] && f[28..32] == ROUTED),
        "an L3 address is announced by the routing daemon, never on the LAN"
    );

    let garps: Vec<_> = frames
        .iter()
        .filter(|f| f[12..14] == [0x08, 0x06] && f[28..32] == VIP4)
        .collect();
    assert!(garps.len() >= 3, "saw {} GARP frames", garps.len());
    for f in &garps {
        assert_eq!(f[0..6], [0xff; 6], "broadcast");
        assert_eq!(f[6..12], mac[..], "source MAC");
        assert_eq!(
            f[14..22],
            [0, 1, 8, 0, 6, 4, 0, 1],
            "Ethernet/IPv4 ARP request"
        );
        assert_eq!(f[22..28], mac[..], "sender hardware address");
        assert_eq!(f[38..42], VIP4, "target = sender = VIP");
    }

    let vip6: std::net::Ipv6Addr = VIP6.parse().unwrap();
    let nas: Vec<_> = frames
        .iter()
        .filter(|f| f[12..14] == [0x86, 0xdd] && f[62..78] == vip6.octets())
        .collect();
    assert!(nas.len() >= 3, "saw {} NA frames", nas.len());
    for f in &nas {
        assert_eq!(f[0..6], [0x33, 0x33, 0, 0, 0, 1], "all-nodes MAC");
        assert_eq!(f[6..12], mac[..]);
        assert_eq!(f[21], 255, "hop limit");
        assert_eq!(
            f[38..54],
            "ff02::1".parse::<std::net::Ipv6Addr>().unwrap().octets()
        );
        assert_eq!(
            f[58] & 0xe0,
            0x20,
            "override set, router and solicited clear"
        );
        assert_eq!(f[78..80], [2, 1], "target link-layer address option");
        assert_eq!(f[80..86], mac[..]);
        assert_eq!(
            icmpv6_checksum(vip6, "ff02::1".parse().unwrap(), &f[54..86]),
            0
        );
    }

    // The peer kernel accepted both announcements (it drops bad checksums and hop limits).
    let neigh4 = lan.ip(&["neigh", "show", "dev", "lan0", "to", "10.0.0.50"]);
    assert!(neigh4.contains(&mac_str), "ARP entry: {neigh4:?}");
    let neigh6 = lan.ip(&["-6", "neigh", "show", "dev", "lan0", "to", VIP6]);
    assert!(neigh6.contains(&mac_str), "ND entry: {neigh6:?}");
}
