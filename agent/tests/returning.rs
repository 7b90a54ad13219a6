//! A returning holder asks the LAN first, against the real kernel (issue 41, item 7): a node
//! namespace that still has LAN aliases of ours when its agent starts, its peer on a veth.
//! While the LAN is asked, the node's kernel does not answer ARP / NDP for them (the
//! `aliaslb-quiet` tables); an IP the peer answers for is taken down, the others are kept
//! and answered again. Needs root.

mod support;

use std::net::IpAddr;
use std::time::Duration;

use aliaslb_agent::aliases::{AliasConfig, AliasManager};
use aliaslb_agent::desired::DesiredSet;
use aliaslb_agent::kernel::backend::{Lifetime, Timed};
use aliaslb_agent::kernel::netlink::NetlinkBackend;
use aliaslb_agent::l2::lan::LanWatch;
use aliaslb_agent::l2::returning::{ask_the_lan_first, lift_script, quiet_script};
use aliaslb_agent::shield::ShieldBackend;
use aliaslb_agent::shield::nft::NftBackend;
use support::{NetNs, node_and_lan, require_root};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// Our aliases of `ips` on the node's eth1, as an agent of a run before left them.
fn leave_aliases(node: &NetNs, ips: &[&str]) {
    let ips: Vec<IpAddr> = ips.iter().map(|i| ip(i)).collect();
    node.run(move || async move {
        let mut m = AliasManager::new(
            Timed::new(NetlinkBackend::connect().unwrap(), Duration::from_secs(2)),
            AliasConfig {
                interface_override: Some("eth1".into()),
                lifetime: Lifetime::for_lease(Duration::from_secs(30)),
                routed_device: "lo".into(),
            },
        );
        let d: DesiredSet = ips.into_iter().map(|i| (i, None)).collect();
        let r = m.reconcile(&d).await;
        assert!(r.errors.is_empty(), "{r:?}");
    });
}

/// Whether the peer gets an ARP answer for `target` from the node (one request, 300 ms).
fn answered(peer: &NetNs, target: &str) -> bool {
    peer.try_exec("arping", &["-c", "1", "-w", "1", "-I", "lan0", target])
        .is_ok_and(|out| out.contains("reply from") || out.contains("Unicast reply"))
}

#[test]
fn while_the_lan_is_asked_the_kernel_does_not_answer_for_the_aliases() {
    if !require_root() {
        return;
    }
    let (node, peer) = node_and_lan("rtq");
    leave_aliases(&node, &["10.0.0.60"]);
    assert!(
        answered(&peer, "10.0.0.60"),
        "the kernel answers for its alias"
    );
    let quiet = quiet_script(&[ip("10.0.0.60"), ip("fd00:1::60")]);
    node.run(move || async move { NftBackend::default().apply(&quiet).await.unwrap() });
    assert!(!answered(&peer, "10.0.0.60"), "silenced");
    assert!(node.addr("eth1", "10.0.0.60").is_some(), "the alias stays");
    node.run(|| async { NftBackend::default().apply(&lift_script()).await.unwrap() });
    assert!(answered(&peer, "10.0.0.60"), "heard again");
    assert!(
        node.try_exec("nft", &["list", "table", "arp", "aliaslb-quiet"])
            .is_err(),
        "no table left"
    );
}

#[test]
fn an_alias_another_host_answers_for_is_taken_down_the_others_are_kept() {
    if !require_root() {
        return;
    }
    let (node, peer) = node_and_lan("rtk");
    leave_aliases(&node, &["10.0.0.61", "10.0.0.62", "fd00:1::62"]);
    // Meanwhile another host (the standby) took 10.0.0.61 over.
    peer.ip(&["addr", "add", "10.0.0.61/32", "dev", "lan0"]);
    let returning = node.run(|| async {
        let backend = NetlinkBackend::connect().unwrap();
        let (lan, _claims) = LanWatch::start();
        let nft = NftBackend::default();
        let started = std::time::Instant::now();
        let r = ask_the_lan_first(&backend, Some(&nft), &lan, "lo")
            .await
            .unwrap();
        (r, started.elapsed())
    });
    let (returning, took) = returning;
    println!("asked the LAN in {took:?}: {returning:?}");
    assert_eq!(
        returning
            .yielded
            .iter()
            .map(|(i, _)| *i)
            .collect::<Vec<_>>(),
        vec![ip("10.0.0.61")]
    );
    let mut kept = returning.kept.clone();
    kept.sort();
    assert_eq!(kept, vec![ip("10.0.0.62"), ip("fd00:1::62")]);
    assert!(returning.withdrawn.is_empty());
    assert_eq!(
        returning.to_recheck().collect::<Vec<_>>(),
        vec![ip("10.0.0.61")]
    );
    assert!(node.addr("eth1", "10.0.0.61").is_none(), "yielded");
    assert!(node.addr("eth1", "10.0.0.62").is_some(), "kept");
    assert!(answered(&peer, "10.0.0.62"), "answered again");
    assert!(took < Duration::from_millis(500), "{took:?}");
}

#[test]
fn without_nftables_every_alias_is_taken_down_first() {
    if !require_root() {
        return;
    }
    let (node, _peer) = node_and_lan("rtw");
    leave_aliases(&node, &["10.0.0.63"]);
    let returning = node.run(|| async {
        let backend = NetlinkBackend::connect().unwrap();
        let (lan, _claims) = LanWatch::start();
        let missing = NftBackend::new("/nonexistent/nft");
        ask_the_lan_first(&backend, Some(&missing), &lan, "lo")
            .await
            .unwrap()
    });
    assert_eq!(returning.withdrawn, vec![ip("10.0.0.63")]);
    assert!(node.addr("eth1", "10.0.0.63").is_none());
}
