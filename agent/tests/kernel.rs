//! The alias loop against the real kernel, each test in fresh network namespaces with
//! veth links. What the kernel holds is checked with `ip -j addr`, not only our own dump.
//! Needs root (see `support::require_root`).

mod support;

use std::net::IpAddr;
use std::time::{Duration, Instant};

use aliaslb_agent::aliases::{AliasConfig, AliasManager, ReconcileError};
use aliaslb_agent::desired::DesiredSet;
use aliaslb_agent::host::Alias;
use aliaslb_agent::kernel::backend::{AddressBackend, BATCH, BackendError, Lifetime, Write};
use aliaslb_agent::kernel::netlink::{NetlinkBackend, watch_changes};
use support::{NetNs, require_root};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn desired(ips: &[&str]) -> DesiredSet {
    ips.iter().map(|s| (ip(s), None)).collect()
}

fn manager(lease_secs: u64) -> AliasManager<NetlinkBackend> {
    AliasManager::new(
        NetlinkBackend::connect().expect("netlink"),
        AliasConfig {
            interface_override: None,
            lifetime: Lifetime::for_lease(Duration::from_secs(lease_secs)),
            routed_device: "lo".into(),
        },
    )
}

/// A node namespace with `eth1` (10.0.0.2/24, fd00:1::2/64) whose peer stays in the
/// same namespace.
fn node() -> NetNs {
    let ns = NetNs::new("node");
    ns.veth("eth1", None, "peer1");
    ns.ip(&["addr", "add", "10.0.0.2/24", "dev", "eth1"]);
    ns.ip(&["addr", "add", "fd00:1::2/64", "dev", "eth1", "nodad"]);
    ns
}

#[test]
fn aliases_follow_the_desired_set_with_lifetime_and_marker() {
    if !require_root() {
        return;
    }
    let ns = node();
    let name = ns.name().to_string();
    let (first, after_first, second, ours, idle, before_idle, after_idle) =
        ns.run(move || async move {
            let mut m = manager(4);
            let first = m
                .reconcile(&desired(&["10.0.0.50", "10.0.0.51", "fd00:1::50"]))
                .await;
            let after_first = NetNsProbe(name).addrs();
            let second = m.reconcile(&desired(&["10.0.0.51", "fd00:1::50"])).await;
            let before_idle = m.writes();
            let idle = m.reconcile(&desired(&["10.0.0.51", "fd00:1::50"])).await;
            let after_idle = m.writes();
            let host = m.backend().snapshot().await.unwrap();
            let mut ours: Vec<_> = host
                .addresses
                .iter()
                .filter(|a| a.owned)
                .map(|a| a.ip)
                .collect();
            ours.sort();
            (
                first,
                after_first,
                second,
                ours,
                idle,
                before_idle,
                after_idle,
            )
        });
    assert!(first.errors.is_empty(), "{:?}", first.errors);
    assert_eq!(first.added.len(), 3);
    let v4 = after_first.iter().find(|a| a.local == "10.0.0.50").unwrap();
    assert_eq!(v4.prefixlen, 32);
    assert!(
        v4.dynamic && v4.valid_life_time <= 4 && v4.preferred_life_time <= 4,
        "{v4:?}"
    );
    assert_eq!(v4.label.as_deref(), Some("eth1:alb"));
    let v6 = after_first
        .iter()
        .find(|a| a.local == "fd00:1::50")
        .unwrap();
    assert_eq!(v6.prefixlen, 128);
    assert!(v6.nodad && v6.dynamic && v6.valid_life_time <= 4, "{v6:?}");

    assert_eq!(second.removed.len(), 1);
    assert_eq!(second.removed[0].ip, ip("10.0.0.50"));
    assert!(second.added.is_empty());
    let now = ns.addrs("eth1");
    let locals: Vec<_> = now.iter().map(|a| a.local.as_str()).collect();
    assert!(!locals.contains(&"10.0.0.50"), "{locals:?}");
    for kept in ["10.0.0.2", "fd00:1::2", "10.0.0.51", "fd00:1::50"] {
        assert!(locals.contains(&kept), "{kept} missing: {locals:?}");
    }
    // IFA_PROTO is read back by the kernel dump for both families (iproute2 6.1 does
    // not print it, so our dump is the witness here; the v6 alias has no label).
    assert_eq!(ours, vec![ip("10.0.0.51"), ip("fd00:1::50")]);

    assert!(!idle.changed() && idle.errors.is_empty(), "{idle:?}");
    assert_eq!(
        before_idle, after_idle,
        "an idle reconcile wrote to the kernel"
    );
}

/// Reads `ip -j addr` of `eth1` of a namespace, from any thread.
struct NetNsProbe(String);

impl NetNsProbe {
    fn addrs(&self) -> Vec<support::AddrInfo> {
        support::addrs_in(&self.0, "eth1")
    }
}

#[test]
fn refresh_extends_the_lifetime_and_the_kernel_expires_unrefreshed_aliases() {
    if !require_root() {
        return;
    }
    let ns = node();
    let name = ns.name().to_string();
    let lease = 3;
    let (before, after, gone_after) = ns.run(move || async move {
        let probe = NetNsProbe(name);
        let lft = |ip: &str| {
            probe
                .addrs()
                .into_iter()
                .find(|a| a.local == ip)
                .map(|a| a.valid_life_time)
        };
        let mut m = manager(lease);
        let r = m.reconcile(&desired(&["10.0.0.70", "fd00:1::70"])).await;
        assert_eq!(r.added.len(), 2, "{r:?}");
        tokio::time::sleep(Duration::from_millis(2100)).await;
        let before = (lft("10.0.0.70").unwrap(), lft("fd00:1::70").unwrap());
        let refreshed = m.refresh_lifetimes().await;
        assert_eq!(refreshed.refreshed, 2, "{:?}", refreshed.errors);
        assert_eq!(m.writes().refreshes, 2);
        let after = (lft("10.0.0.70").unwrap(), lft("fd00:1::70").unwrap());
        // No more refreshes: the kernel must drop both within the lease (+ margin).
        let start = Instant::now();
        while lft("10.0.0.70").is_some() || lft("fd00:1::70").is_some() {
            assert!(
                start.elapsed() < Duration::from_secs(lease + 2),
                "aliases outlived their lifetime"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        (before, after, start.elapsed())
    });
    assert!(
        before.0 <= 1 && before.1 <= 1,
        "lifetime did not run: {before:?}"
    );
    assert_eq!(after, (lease, lease), "refresh did not reset the lifetime");
    println!("unrefreshed aliases expired {gone_after:?} after the last refresh (lease {lease}s)");
    assert!(ns.addrs("eth1").iter().any(|a| a.local == "10.0.0.2"));
}

#[test]
fn foreign_addresses_are_conflicts_and_never_removed() {
    if !require_root() {
        return;
    }
    let ns = node();
    ns.ip(&["addr", "add", "10.0.0.60/32", "dev", "eth1"]);
    ns.ip(&[
        "addr",
        "add",
        "10.0.0.61/32",
        "dev",
        "eth1",
        "label",
        "eth1:other",
    ]);
    let (report, released) = ns.run(|| async {
        let mut m = manager(4);
        let report = m
            .reconcile(&desired(&["10.0.0.60", "10.0.0.2", "10.0.0.62"]))
            .await;
        let released = m.release_all().await;
        (report, released)
    });
    let mut conflicts: Vec<_> = report.conflicts.iter().map(|c| c.ip).collect();
    conflicts.sort();
    assert_eq!(conflicts, vec![ip("10.0.0.2"), ip("10.0.0.60")]);
    assert!(report.conflicts.iter().all(|c| c.ifname == "eth1"));
    assert_eq!(report.added.len(), 1);
    assert_eq!(released.removed.len(), 1);
    assert_eq!(released.removed[0].ip, ip("10.0.0.62"));
    let locals: Vec<_> = ns.addrs("eth1").into_iter().map(|a| a.local).collect();
    for foreign in ["10.0.0.2", "10.0.0.60", "10.0.0.61", "fd00:1::2"] {
        assert!(locals.iter().any(|l| l == foreign), "{foreign} was removed");
    }
    assert!(!locals.iter().any(|l| l == "10.0.0.62"));
    // A foreign /32 is not a connected subnet and is not reported as one.
}

#[test]
fn externally_deleted_alias_is_restored_within_a_second() {
    if !require_root() {
        return;
    }
    let ns = node();
    let name = ns.name().to_string();
    let restored_in = ns.run(move || async move {
        let want = desired(&["10.0.0.80", "fd00:1::80"]);
        let mut changes = watch_changes().unwrap();
        let mut m = manager(30);
        assert_eq!(m.reconcile(&want).await.added.len(), 2);
        // Drain the ticks of our own setup.
        tokio::time::sleep(Duration::from_millis(100)).await;
        while changes.try_recv().is_ok() {}
        let mut times = Vec::new();
        for (victim, prefix) in [("10.0.0.80", "32"), ("fd00:1::80", "128")] {
            support::run_cmd(
                "ip",
                &[
                    "-n",
                    &name,
                    "addr",
                    "del",
                    &format!("{victim}/{prefix}"),
                    "dev",
                    "eth1",
                ],
            );
            let start = Instant::now();
            let report = loop {
                tokio::time::timeout(Duration::from_secs(1), changes.recv())
                    .await
                    .expect("no change notification within a second")
                    .expect("watch ended");
                let r = m.reconcile(&want).await;
                if !r.added.is_empty() {
                    break r;
                }
            };
            assert_eq!(report.added[0].ip, ip(victim));
            let present = NetNsProbe(name.clone())
                .addrs()
                .iter()
                .any(|a| a.local == victim);
            assert!(present, "{victim} not restored");
            times.push(start.elapsed());
        }
        times
    });
    println!("restored after external delete in {restored_in:?}");
    assert!(restored_in.iter().all(|t| *t < Duration::from_secs(1)));
}

#[test]
fn link_flap_loses_ipv6_alias_and_the_watch_restores_it() {
    if !require_root() {
        return;
    }
    let ns = node();
    let name = ns.name().to_string();
    let restored = ns.run(move || async move {
        let want = desired(&["fd00:1::90"]);
        let mut changes = watch_changes().unwrap();
        let mut m = manager(30);
        assert_eq!(m.reconcile(&want).await.added.len(), 1);
        tokio::time::sleep(Duration::from_millis(100)).await;
        while changes.try_recv().is_ok() {}
        // With keep_addr_on_down=1 the node's own permanent address survives the flap;
        // non-permanent ones (our alias) are still flushed on link down.
        support::run_cmd(
            "ip",
            &[
                "netns",
                "exec",
                &name,
                "sysctl",
                "-q",
                "-w",
                "net.ipv6.conf.eth1.keep_addr_on_down=1",
            ],
        );
        for state in ["down", "up"] {
            support::run_cmd("ip", &["-n", &name, "link", "set", "eth1", state]);
        }
        let start = Instant::now();
        loop {
            tokio::time::timeout(Duration::from_secs(1), changes.recv())
                .await
                .expect("no notification after link flap")
                .expect("watch ended");
            let r = m.reconcile(&want).await;
            assert!(r.errors.is_empty(), "{r:?}");
            if !r.added.is_empty() {
                break start.elapsed();
            }
        }
    });
    println!("IPv6 alias restored {restored:?} after a link flap");
    assert!(ns.addr("eth1", "fd00:1::90").is_some());
}

#[test]
fn restart_cleans_stale_aliases_and_adopts_desired_ones_without_re_adding() {
    if !require_root() {
        return;
    }
    let ns = node();
    let report = ns.run(|| async {
        let mut before_crash = manager(30);
        let r = before_crash
            .reconcile(&desired(&["10.0.0.100", "10.0.0.101", "fd00:1::100"]))
            .await;
        assert_eq!(r.added.len(), 3);
        drop(before_crash);
        let mut restarted = manager(30);
        let report = restarted
            .reconcile(&desired(&["10.0.0.101", "fd00:1::100"]))
            .await;
        assert_eq!(restarted.writes().adds, 0, "adopted aliases were re-added");
        assert_eq!(restarted.writes().deletes, 1);
        report
    });
    assert!(report.added.is_empty());
    let mut adopted: Vec<_> = report.adopted.iter().map(|a| a.ip).collect();
    adopted.sort();
    assert_eq!(adopted, vec![ip("10.0.0.101"), ip("fd00:1::100")]);
    assert_eq!(report.removed.len(), 1);
    assert_eq!(report.removed[0].ip, ip("10.0.0.100"));
    assert!(ns.addr("eth1", "10.0.0.100").is_none());
    assert!(ns.addr("eth1", "10.0.0.101").is_some());
}

#[test]
fn interface_is_chosen_by_subnet_then_default_route() {
    if !require_root() {
        return;
    }
    let ns = node();
    ns.veth("eth2", None, "peer2");
    ns.ip(&["addr", "add", "192.168.5.2/24", "dev", "eth2"]);
    ns.ip(&[
        "route",
        "add",
        "default",
        "via",
        "192.168.5.1",
        "dev",
        "eth2",
    ]);
    let (report, interfaces, missing) = ns.run(|| async {
        let mut m = manager(30);
        let report = m
            .reconcile(&desired(&["10.0.0.50", "172.16.0.9", "2001:db8::9"]))
            .await;
        let interfaces = m.backend().interfaces().await.unwrap();
        let mut forced = AliasManager::new(
            NetlinkBackend::connect().unwrap(),
            AliasConfig {
                interface_override: Some("bond9".into()),
                lifetime: Lifetime { seconds: 30 },
                routed_device: "lo".into(),
            },
        );
        // Every IP errors; the aliases already held are kept, not removed.
        let missing = forced
            .reconcile(&desired(&["10.0.0.50", "172.16.0.9"]))
            .await;
        assert!(missing.removed.is_empty(), "{missing:?}");
        (report, interfaces, missing)
    });
    let on = |ip_s: &str| {
        report
            .added
            .iter()
            .find(|a| a.ip == ip(ip_s))
            .map(|a| a.ifname.clone())
    };
    assert_eq!(on("10.0.0.50").as_deref(), Some("eth1"), "by subnet");
    assert_eq!(
        on("172.16.0.9").as_deref(),
        Some("eth2"),
        "by default route"
    );
    assert_eq!(report.errors.len(), 1);
    let msg = report.errors[0].to_string();
    assert!(matches!(report.errors[0], ReconcileError::Interface { .. }));
    assert!(
        msg.contains("2001:db8::9") && msg.contains("IPv6 default route"),
        "{msg}"
    );
    assert!(ns.addr("eth1", "10.0.0.50").is_some());
    assert!(ns.addr("eth2", "172.16.0.9").is_some());

    let names: Vec<_> = interfaces.iter().map(|i| i.name.as_str()).collect();
    assert_eq!(
        names,
        vec!["eth1", "eth2"],
        "lo is host scope, aliases excluded"
    );
    let eth1: Vec<String> = interfaces[0]
        .subnets
        .iter()
        .map(|n| n.to_string())
        .collect();
    assert_eq!(eth1, vec!["10.0.0.0/24", "fd00:1::/64"]);

    assert_eq!(missing.errors.len(), 2);
    let msg = missing.errors[0].to_string();
    assert!(
        msg.contains("\"bond9\" (from --interface) does not exist"),
        "{msg}"
    );
}

#[test]
fn thousand_aliases_applied_and_removed_vs_ip_batch() {
    if !require_root() {
        return;
    }
    let ns = node();
    ns.veth("eth3", None, "peer3");
    let ips: Vec<String> = (0..1000)
        .map(|i| format!("10.77.{}.{}", i / 250, 1 + i % 250))
        .collect();
    let want: DesiredSet = ips.iter().map(|s| (ip(s), Some("eth1".into()))).collect();
    let name = ns.name().to_string();
    let (add_time, del_time, held) = ns.run(move || async move {
        let mut m = manager(30);
        let start = Instant::now();
        let r = m.reconcile(&want).await;
        let add_time = start.elapsed();
        assert!(r.errors.is_empty(), "{:?}", r.errors.first());
        assert_eq!(r.added.len(), 1000);
        let held = m.held_ips().len();
        let on_eth1 = support::addrs_in(&name, "eth1")
            .iter()
            .filter(|a| a.local.starts_with("10.77.") && a.prefixlen == 32)
            .count();
        assert_eq!(on_eth1, 1000, "ip -j addr does not list the 1000 aliases");
        let start = Instant::now();
        let r = m.reconcile(&DesiredSet::new()).await;
        let del_time = start.elapsed();
        assert_eq!(r.removed.len(), 1000);
        (add_time, del_time, held)
    });
    assert_eq!(held, 1000);
    let aliases = |dev| {
        ns.addrs(dev)
            .iter()
            .filter(|a| a.local.starts_with("10.77."))
            .count()
    };
    assert_eq!(aliases("eth1"), 0, "not all removed");

    let batch = |verb: &str| {
        ips.iter()
            .map(|a| format!("addr {verb} {a}/32 dev eth3\n"))
            .collect::<String>()
    };
    let file = std::env::temp_dir().join(format!("{}-batch", ns.name()));
    std::fs::write(&file, batch("add")).unwrap();
    let start = Instant::now();
    ns.ip(&["-batch", file.to_str().unwrap()]);
    let ip_add = start.elapsed();
    assert_eq!(aliases("eth3"), 1000);
    std::fs::write(&file, batch("del")).unwrap();
    let start = Instant::now();
    ns.ip(&["-batch", file.to_str().unwrap()]);
    let ip_del = start.elapsed();
    let _ = std::fs::remove_file(&file);
    println!(
        "1000 aliases: aliaslb add {add_time:?} / remove {del_time:?}; \
         ip -batch add {ip_add:?} / del {ip_del:?}"
    );
}

/// One message of writes to the kernel: each alias gets its own answer, in order, whatever
/// the others' (new, there already, refused); a batch of [`BATCH`] adds and refreshes.
#[test]
fn a_batch_of_writes_answers_each_alias_in_order() {
    if !require_root() {
        return;
    }
    let ns = node();
    ns.ip(&["addr", "add", "10.0.0.60/32", "dev", "eth1"]);
    let name = ns.name().to_string();
    let (adds, deletes, batch, refreshes, after) = ns.run(move || async move {
        let backend = NetlinkBackend::connect().expect("netlink");
        let host = backend.snapshot().await.expect("dump");
        let eth1 = host.links.iter().find(|l| l.name == "eth1").unwrap().index;
        let alias = |ip: &str, ifindex| Alias {
            ip: ip.parse().unwrap(),
            ifindex,
            ifname: "eth1".into(),
        };
        let life = Lifetime { seconds: 30 };
        let mixed = [
            alias("10.0.0.61", eth1),
            alias("10.0.0.60", eth1),
            alias("10.0.0.62", 9999),
            alias("fd00:1::61", eth1),
        ];
        let adds = backend
            .write_all(Write::Add(life), &mixed.iter().collect::<Vec<_>>())
            .await;
        let gone = [
            alias("10.0.0.61", eth1),
            alias("10.0.0.63", eth1),
            alias("fd00:1::61", eth1),
        ];
        let deletes = backend
            .write_all(Write::Delete, &gone.iter().collect::<Vec<_>>())
            .await;
        let many: Vec<Alias> = (0..BATCH)
            .map(|i| alias(&format!("10.78.0.{}", i + 1), eth1))
            .collect();
        let many: Vec<&Alias> = many.iter().collect();
        let batch = backend
            .write_all(Write::Add(Lifetime { seconds: 5 }), &many)
            .await;
        let refreshes = backend.write_all(Write::Refresh(life), &many).await;
        (
            adds,
            deletes,
            batch,
            refreshes,
            support::addrs_in(&name, "eth1"),
        )
    });
    let outcome = |r: &Result<bool, BackendError>| match r {
        Ok(changed) => format!("{changed}"),
        Err(e) => e.to_string(),
    };
    let adds: Vec<String> = adds.iter().map(outcome).collect();
    assert_eq!(adds[..2], ["true", "false"], "{adds:?}");
    assert!(
        adds[2].starts_with("add 10.0.0.62/32 dev eth1: No such device"),
        "{adds:?}"
    );
    assert_eq!(adds[3], "true", "{adds:?}");
    let deletes: Vec<String> = deletes.iter().map(outcome).collect();
    assert_eq!(deletes, ["true", "false", "true"]);
    assert!(
        batch
            .iter()
            .chain(&refreshes)
            .all(|r| matches!(r, Ok(true))),
        "{batch:?} {refreshes:?}"
    );
    assert_eq!((batch.len(), refreshes.len()), (BATCH, BATCH));
    let held: Vec<&support::AddrInfo> = after
        .iter()
        .filter(|a| a.local.starts_with("10.78.0."))
        .collect();
    assert_eq!(held.len(), BATCH);
    assert!(
        held.iter().all(|a| (25..=30).contains(&a.valid_life_time)),
        "the refresh set the lifetime: {held:?}"
    );
    let locals: Vec<&str> = after.iter().map(|a| a.local.as_str()).collect();
    assert!(
        locals.contains(&"10.0.0.60"),
        "the foreign address stays: {locals:?}"
    );
    assert!(
        !locals.contains(&"10.0.0.61") && !locals.contains(&"fd00:1::61"),
        "{locals:?}"
    );
}

#[test]
fn routed_addresses_go_on_the_routed_device_with_their_lifetime() {
    if !require_root() {
        return;
    }
    let ns = node();
    let name = ns.name().to_string();
    let (device, fallback, report, kernel_has_dummy) = ns.run(move || async move {
        let backend = NetlinkBackend::connect().expect("netlink");
        let (device, fallback) = backend.routed_device("aliaslb0").await;
        // Asked again (an agent restart): the device found is used as it is.
        let (again, _) = backend.routed_device("aliaslb0").await;
        assert_eq!(again, device);
        let mut m = AliasManager::new(
            backend,
            AliasConfig {
                interface_override: Some("eth1".into()),
                lifetime: Lifetime::for_lease(Duration::from_secs(4)),
                routed_device: device.clone(),
            },
        );
        let mut d = desired(&["10.0.0.50", "10.200.0.7", "fd00:200::7"]);
        d.mark_routed(ip("10.200.0.7"));
        d.mark_routed(ip("fd00:200::7"));
        let report = m.reconcile(&d).await;
        let dummy = std::process::Command::new("ip")
            .args(["-n", &name, "link", "show", "aliaslb0", "type", "dummy"])
            .output()
            .is_ok_and(|o| o.status.success() && !o.stdout.is_empty());
        (device, fallback, report, dummy)
    });
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    // This kernel may lack the dummy driver: then `lo`, and the error says why.
    match (&device[..], &fallback) {
        ("aliaslb0", None) => assert!(kernel_has_dummy),
        ("lo", Some(e)) => assert!(e.to_string().contains("create dummy aliaslb0"), "{e}"),
        other => panic!("unexpected routed device {other:?}"),
    }
    let routed = ns.addrs(&device);
    let v4 = routed
        .iter()
        .find(|a| a.local == "10.200.0.7")
        .unwrap_or_else(|| panic!("10.200.0.7 not on {device}: {routed:?}"));
    assert_eq!(v4.prefixlen, 32);
    assert!(v4.dynamic && v4.valid_life_time <= 4, "{v4:?}");
    assert_eq!(v4.label.as_deref(), Some(format!("{device}:alb").as_str()));
    let v6 = routed.iter().find(|a| a.local == "fd00:200::7").unwrap();
    assert_eq!(v6.prefixlen, 128);
    assert!(v6.dynamic && v6.valid_life_time <= 4, "{v6:?}");
    // `--interface` applies to the L2 address only.
    let eth1: Vec<_> = ns.addrs("eth1").into_iter().map(|a| a.local).collect();
    assert!(eth1.contains(&"10.0.0.50".to_owned()), "{eth1:?}");
    assert!(!eth1.contains(&"10.200.0.7".to_owned()), "{eth1:?}");
}

/// `ip -6 route get <to>` (or `ip -4`) inside `ns`: the source address the kernel picks.
fn route_source(ns: &str, to: &str) -> String {
    let family = if to.contains(':') { "-6" } else { "-4" };
    let out = support::run_cmd("ip", &["-n", ns, family, "route", "get", to]);
    let mut words = out.split_whitespace();
    words
        .by_ref()
        .find(|w| *w == "src")
        .and_then(|_| words.next())
        .unwrap_or_else(|| panic!("no src in `ip route get {to}`: {out}"))
        .to_owned()
}

#[test]
fn an_ipv6_alias_is_deprecated_so_the_node_keeps_its_own_source_address() {
    if !require_root() {
        return;
    }
    // The VIP fd00:1::50/128 shares the node's /64 (fd00:1::2/64) and the LAN neighbour's
    // (fd00:1::1): with a preferred /128 the kernel picks the VIP as the node's source
    // for the whole LAN (the longest-prefix rule is capped at each address's prefix
    // length, 128 against 64).
    let (node, lan) = support::node_and_lan("src6");
    let node_name = node.name().to_string();
    let lan_listener = lan.run_sync(|| std::net::TcpListener::bind("[::]:7000").unwrap());
    let (route6, route4, from6, preferred) = node.run(move || async move {
        let mut m = manager(30);
        let r = m.reconcile(&desired(&["10.0.0.50", "fd00:1::50"])).await;
        assert_eq!(r.added.len(), 2, "{r:?}");
        let refreshed = m.refresh_lifetimes().await;
        assert!(refreshed.errors.is_empty(), "{:?}", refreshed.errors);
        let route6 = route_source(&node_name, "fd00:1::1");
        let route4 = route_source(&node_name, "10.0.0.1");
        // A real connection from the node to its neighbour, seen from the neighbour.
        let stream = std::net::TcpStream::connect_timeout(
            &"[fd00:1::1]:7000".parse().unwrap(),
            Duration::from_secs(3),
        )
        .expect("the node reaches its LAN neighbour");
        let from6 = stream.local_addr().unwrap().ip();
        let preferred: Vec<(String, u64, u64)> = support::addrs_in(&node_name, "eth1")
            .into_iter()
            .filter(|a| a.local.ends_with("::50") || a.local == "10.0.0.50")
            .map(|a| (a.local, a.valid_life_time, a.preferred_life_time))
            .collect();
        drop(stream);
        (route6, route4, from6, preferred)
    });
    let (_, peer) = lan_listener.accept().unwrap();
    assert_eq!(route6, "fd00:1::2", "the VIP became the node's IPv6 source");
    assert_eq!(from6, ip("fd00:1::2"), "a connection left from the VIP");
    assert_eq!(peer.ip(), ip("fd00:1::2"), "the neighbour saw the VIP");
    assert_eq!(route4, "10.0.0.2", "IPv4 source");
    // After a refresh too: IPv6 preferred_lft 0 (deprecated), IPv4 preferred = valid.
    for (local, valid, preferred) in &preferred {
        if local.contains(':') {
            assert_eq!(
                *preferred, 0,
                "{local}: valid {valid}, preferred {preferred}"
            );
            assert!(*valid > 0 && *valid <= 30, "{local}: valid {valid}");
        } else {
            assert_eq!(preferred, valid, "{local}");
        }
    }
    assert_eq!(preferred.len(), 2, "{preferred:?}");
    // A deprecated address is still an address of the node: the LAN reaches the VIP.
    let vip_listener = node.run_sync(|| std::net::TcpListener::bind("[fd00:1::50]:7001").unwrap());
    let reached = lan.run_sync(|| {
        let start = Instant::now();
        loop {
            // The first solicitation may precede the kernel's join of the VIP's
            // solicited-node group: retry for a while.
            match std::net::TcpStream::connect_timeout(
                &"[fd00:1::50]:7001".parse().unwrap(),
                Duration::from_millis(500),
            ) {
                Ok(s) => break Ok(s.local_addr().unwrap().ip()),
                Err(e) if start.elapsed() > Duration::from_secs(5) => break Err(e),
                Err(_) => {}
            }
        }
    });
    let (_, client) = vip_listener.accept().unwrap();
    assert_eq!(
        reached.expect("the LAN reaches the deprecated VIP"),
        client.ip()
    );
}
