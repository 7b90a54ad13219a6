//! Table-style tests of the planner, one rule per test: allocation order, exhaustion,
//! withheld addresses, import, sharing, dual-stack, pool edits, sticky re-creation and node moves.

mod plan_support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use aliaslb_core::plan::{
    MAX_MESSAGE, MAX_PORTS_PER_IP, NodeAddress, PlanEvent, PlanOutput, Planner, STICKY_FOR,
    ServicePlan, ServiceView, node_address_clashes, reason,
};
use aliaslb_core::pool::PoolKey;
use aliaslb_core::range::Family;
use plan_support::*;

const DEFAULT_3: (&str, &str) = ("default", "10.0.0.1\n10.0.0.2\n10.0.0.3");

/// A world with the pool `DEFAULT_3` and `services`.
fn default_3(services: Vec<ServiceView>) -> World {
    World::new(config(&[DEFAULT_3]), services)
}

/// A world with the pool `DEFAULT_3` and Services `default/<name>`, created at 1, 2, … in
/// the order given.
fn default_3_with(names: &[&str]) -> World {
    default_3(created_in_order("default", names))
}

fn classic() -> World {
    default_3_with(&["a", "b", "c", "d"])
}

/// `default/<name>`, created at `created`, sharing `key`, with one port.
fn sharer(name: &str, created: i64, key: &str, port: i32, protocol: &str) -> ServiceView {
    svc("default", name)
        .created(created)
        .sharing(key)
        .port(port, protocol)
}

/// `default/<name>`, created at `created`, that the API shows with `ips` on `node` (to import).
fn imported(name: &str, created: i64, ips: &str, node: Option<&str>) -> ServiceView {
    svc("default", name).created(created).observed(ips, node)
}

/// Asserts that `out` clears no assignment, and tells `default/<name>` once, with a
/// `NodeClaim` Event whose message starts with `prefix`, that a node claims its address (a
/// node's word never takes it from the Service); returns that Event.
#[track_caller]
fn assert_node_claim<'o>(out: &'o PlanOutput, name: &str, prefix: &str) -> &'o PlanEvent {
    assert!(events(out, reason::CLEAR_ASSIGNMENT).is_empty());
    let claimed = events_for(out, "default", name, reason::NODE_CLAIM);
    assert_eq!(claimed.len(), 1, "{:?}", out.events);
    assert_starts_with(
        &claimed[0].message,
        prefix,
        &format!("NodeClaim for {name}"),
    );
    claimed[0]
}

/// `default/<name>` is created again, at `created`, under a new `uid`.
fn recreate(world: &mut World, name: &str, created: i64, uid: &str) {
    world
        .services
        .push(svc("default", name).created(created).uid(uid));
}

#[test]
fn three_addresses_in_order_then_exhausted_then_freed() {
    let mut world = classic();
    let mut planner = Planner::new();
    let out = world.plan(&mut planner);
    for (name, want) in [("a", "10.0.0.1"), ("b", "10.0.0.2"), ("c", "10.0.0.3")] {
        assert_eq!(ips(&out, "default", name), [want], "{name}");
        assert!(plan_of(&out, "default", name).allocated.status);
    }
    assert_pending(
        &out,
        ("default", "d"),
        reason::POOL_EXHAUSTED,
        "all 3 addresses of pool default are in use",
        "no address left",
    );
    assert!(!plan_of(&out, "default", "d").allocated.status);
    let failed = events(&out, reason::ALLOCATION_FAILED);
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert!(failed[0].warning);
    assert_eq!(failed[0].service, key("default", "d"));
    assert_eq!(events(&out, reason::IP_ALLOCATED).len(), 3);
    assert_eq!(planner.pending(), 1);
    assert_eq!(
        planner.pending_by_reason(),
        BTreeMap::from([(reason::POOL_EXHAUSTED, 1)])
    );
    assert_eq!(
        planner.pending_services().collect::<Vec<_>>(),
        [(&key("default", "d"), reason::POOL_EXHAUSTED)]
    );

    // Level-triggered: the same inputs again produce no Events at all.
    let again = world.plan(&mut planner);
    assert_eq!(again.services, out.services);
    assert!(
        events(&again, reason::ALLOCATION_FAILED).is_empty()
            && events(&again, reason::IP_ALLOCATED).is_empty(),
        "{:?}",
        again.events
    );

    world.remove("default", "b");
    let out = world.plan(&mut planner);
    assert_eq!(out.released, [(key("default", "b"), vec![ip("10.0.0.2")])]);
    // b's address is held for b, in case it is re-created, for STICKY_FOR.
    let d = plan_of(&out, "default", "d");
    assert!(d.ips.is_empty());
    assert_eq!(
        d.allocated.message,
        "all 3 addresses of pool default are in use; 1 of them is held for a deleted Service \
         in case it is re-created, for 10 min after its deletion (10.0.0.2 for default/b)"
    );
    assert_eq!(
        planner.next_release(),
        Some(world.now + STICKY_FOR),
        "the loop wakes when it ends"
    );
    world.advance(STICKY_FOR);
    let out = world.plan(&mut planner);
    assert_eq!(
        ips(&out, "default", "d"),
        ["10.0.0.2"],
        "served in the pass the reservation ends"
    );
    assert_eq!(planner.next_release(), None);
    assert_eq!(planner.pending(), 0);
    assert!(planner.pending_by_reason().is_empty());
    assert_eq!(planner.pending_services().count(), 0);
    assert!(!out.services.contains_key(&key("default", "b")));
    let usage = planner.usage();
    assert_eq!(usage.len(), 1);
    assert_eq!((usage[0].total, usage[0].in_use), (3, 3));
}

#[test]
fn oldest_pending_service_gets_new_capacity_first() {
    let mut world = classic();
    world
        .services
        .push(svc("default", "e").created(0).uid("late-but-old"));
    world.services[0].created = 1;
    let mut planner = Planner::new();
    let out = world.plan(&mut planner);
    assert_eq!(ips(&out, "default", "e"), ["10.0.0.1"], "created first");
    assert!(ips(&out, "default", "c").is_empty() && ips(&out, "default", "d").is_empty());
    world.config = config(&[("default", "10.0.0.1-10.0.0.4")]);
    let out = world.plan(&mut planner);
    assert_eq!(ips(&out, "default", "c"), ["10.0.0.4"]);
    assert!(ips(&out, "default", "d").is_empty());
    assert_eq!(planner.pending(), 1);
}

#[test]
fn restart_with_100_assigned_services_changes_nothing() {
    let services: Vec<_> = (0..100)
        .map(|i| svc("default", &format!("s{i:03}")).created(i))
        .collect();
    let mut world = World::new(config(&[("default", "10.0.0.1-10.0.0.200")]), services);
    let mut first = Planner::new();
    let before = world.plan(&mut first);
    for s in &mut world.services {
        let p = &before.services[&s.key];
        s.observed_ips = p.ips.clone();
        s.observed_node = p.node.as_deref().map(str::to_owned);
    }
    // The restarted leader sees the Services in another order, and a newcomer.
    world.services.reverse();
    world.services.push(svc("default", "new").created(-5));
    let mut second = Planner::new();
    let after = world.plan(&mut second);
    for (k, p) in &before.services {
        assert_eq!(after.services[k].ips, p.ips, "{k}");
        assert_eq!(after.services[k].node, p.node, "{k}");
    }
    assert_eq!(
        ips(&after, "default", "new"),
        ["10.0.0.101"],
        "older, but imports come first"
    );
    assert!(events(&after, reason::CLEAR_ASSIGNMENT).is_empty());
    assert_eq!(events(&after, reason::IP_ALLOCATED).len(), 1);
    assert_eq!(events(&after, reason::NODE_ASSIGNED).len(), 1);
}

#[test]
fn tenant_fencing() {
    let world = World::new(
        config(&[
            DEFAULT_3,
            ("staging", "10.0.7.1-10.0.7.6\n10.0.8.1"),
            ("_fallback", "10.0.9.1-10.0.9.2"),
        ]),
        vec![
            svc("staging", "steal").created(1).requesting("10.0.0.1"),
            svc("staging", "fallback-ip")
                .created(2)
                .requesting("10.0.9.1"),
            svc("staging", "imported")
                .created(3)
                .observed("10.0.0.2", Some("a")),
            svc("default", "a").created(4),
            svc("default", "b").created(5),
            svc("default", "c").created(6),
            svc("default", "d").created(7),
            svc("other", "x").created(8),
        ],
    );
    let out = world.plan(&mut Planner::new());
    assert_pending(
        &out,
        ("staging", "steal"),
        reason::REQUESTED_IP_NOT_IN_POOL,
        "10.0.0.1 is not in the pool of namespace staging (10.0.7.1-10.0.7.6, 10.0.8.1)",
        "another tenant's address",
    );
    assert_eq!(
        plan_of(&out, "staging", "fallback-ip").allocated.reason,
        reason::REQUESTED_IP_NOT_IN_POOL,
        "a namespace with its own key never draws from the fallback"
    );
    // An observed IP of another tenant's pool is not imported.
    assert_eq!(ips(&out, "staging", "imported"), ["10.0.7.1"]);
    let cleared = events_for(&out, "staging", "imported", reason::CLEAR_ASSIGNMENT);
    assert_eq!(cleared.len(), 1);
    assert!(cleared[0].warning);
    assert_starts_with(
        &cleared[0].message,
        "10.0.0.2 is not in the pool of namespace staging",
        "staging/imported",
    );
    assert_eq!(
        ips(&out, "default", "a"),
        ["10.0.0.1"],
        "not imported by staging"
    );
    assert_eq!(ips(&out, "default", "b"), ["10.0.0.2"]);
    let d = plan_of(&out, "default", "d");
    assert_eq!(
        d.allocated.reason,
        reason::POOL_EXHAUSTED,
        "no fallback for default"
    );
    assert_eq!(
        ips(&out, "other", "x"),
        ["10.0.9.1"],
        "no key of its own: fallback"
    );
}

#[test]
fn no_pool_and_invalid_requests_are_explained() {
    let world = World::new(
        config(&[DEFAULT_3]),
        vec![
            svc("nowhere", "x"),
            svc("default", "bad")
                .malformed("aliaslb.io/loadBalancerIPs: `10.0.0.x` is not an IP address"),
            svc("default", "two").requesting("10.0.0.1, 10.0.0.2"),
            svc("default", "v6").requesting("2001:db8::1"),
        ],
    );
    let out = world.plan(&mut Planner::new());
    let table = [
        (
            "nowhere",
            "x",
            reason::NO_POOL,
            "namespace nowhere has no pool and no _fallback pool is configured",
        ),
        (
            "default",
            "bad",
            reason::INVALID_REQUEST,
            "aliaslb.io/loadBalancerIPs: `10.0.0.x` is not an IP address",
        ),
        (
            "default",
            "two",
            reason::INVALID_REQUEST,
            "requests both 10.0.0.1 and 10.0.0.2: at most one IPv4 address can be requested",
        ),
        (
            "default",
            "v6",
            reason::INVALID_REQUEST,
            "requests 2001:db8::1, but the Service's ipFamilies do not include IPv6",
        ),
    ];
    for (ns, name, want_reason, want_message) in table {
        let p = plan_of(&out, ns, name);
        assert!(p.ips.is_empty(), "{ns}/{name}");
        assert_eq!(
            (p.allocated.reason, p.allocated.message.as_str()),
            (want_reason, want_message),
            "{ns}/{name}"
        );
        assert_eq!(p.announced.reason, reason::NOT_ALLOCATED);
        assert_eq!(
            events_for(&out, ns, name, reason::ALLOCATION_FAILED).len(),
            1
        );
    }
}

#[test]
fn requested_ips_in_use_move_and_release() {
    let mut world = World::new(
        config(&[DEFAULT_3, ("_fallback", "10.0.9.1-10.0.9.3")]),
        vec![
            svc("default", "web").created(1),
            svc("default", "api").created(2).requesting("10.0.0.1"),
            svc("team-a", "x").created(3).requesting("10.0.9.2"),
            svc("team-b", "y").created(4).requesting("10.0.9.2"),
        ],
    );
    let mut planner = Planner::new();
    let out = world.plan(&mut planner);
    for (ns, name, prefix, why) in [
        (
            "default",
            "api",
            "10.0.0.1 is used by default/web",
            "in its namespace, the user is named",
        ),
        (
            "team-b",
            "y",
            "10.0.9.2 is used by a Service in another namespace",
            "tenants do not learn each other's names",
        ),
    ] {
        assert_allocated_starts_with(&out, (ns, name), reason::REQUESTED_IP_IN_USE, prefix, why);
    }

    // Changing the request moves the Service and frees the old address.
    world.service_mut("default", "web").requested = Ok(vec![ip("10.0.0.3")]);
    let out = world.plan(&mut planner);
    assert_eq!(ips(&out, "default", "web"), ["10.0.0.3"]);
    assert_eq!(
        ips(&out, "default", "api"),
        ["10.0.0.1"],
        "web is older, so it moved before api was planned"
    );
    assert_eq!(
        events_for(&out, "default", "web", reason::RELEASED).len(),
        1
    );
    assert_eq!(planner.usage()[0].in_use, 2, "10.0.0.1 and 10.0.0.3 only");

    // A request that cannot be honoured keeps the current address.
    world.service_mut("default", "web").requested = Ok(vec![ip("10.0.0.1")]);
    let out = world.plan(&mut planner);
    let web = plan_of(&out, "default", "web");
    assert_eq!(ips(&out, "default", "web"), ["10.0.0.3"]);
    assert_eq!(web.allocated.reason, reason::REQUESTED_IP_IN_USE);
    assert!(
        web.allocated
            .message
            .ends_with("; keeping 10.0.0.3 for now"),
        "{}",
        web.allocated.message
    );
}

#[test]
fn import_collision_keeps_the_older_and_reallocates_the_other() {
    let world = default_3(vec![
        imported("young", 9, "10.0.0.2", Some("b")),
        imported("old", 1, "10.0.0.2", Some("a")),
    ]);
    let out = world.plan(&mut Planner::new());
    assert_eq!(ips(&out, "default", "old"), ["10.0.0.2"]);
    assert_eq!(node_of(&out, "old"), Some("a"));
    assert_eq!(ips(&out, "default", "young"), ["10.0.0.1"]);
    let cleared = events_for(&out, "default", "young", reason::CLEAR_ASSIGNMENT);
    assert_eq!(cleared.len(), 1);
    assert!(cleared[0].warning);
    assert_eq!(
        cleared[0].message,
        "10.0.0.2 is also claimed by default/old, which is older and keeps it; assigning a new address"
    );
    assert!(events_for(&out, "default", "old", reason::CLEAR_ASSIGNMENT).is_empty());
}

#[test]
fn sharing_with_port_clash_and_same_node() {
    let mut world = World::new(
        config(&[DEFAULT_3, ("other", "10.0.1.1-10.0.1.3")]),
        vec![
            sharer("http", 1, "k", 80, "TCP"),
            sharer("https", 2, "k", 443, "TCP"),
            sharer("dns", 3, "k", 80, "UDP"),
            sharer("clash", 4, "k", 80, "TCP"),
            sharer("k2", 5, "k2", 80, "TCP"),
            svc("other", "k").created(6).sharing("k").port(80, "TCP"),
        ],
    );
    world.nodes = ["a", "b", "c", "d"].into_iter().map(node).collect();
    let mut planner = Planner::new();
    let out = world.plan(&mut planner);
    for name in ["http", "https", "dns"] {
        assert_eq!(ips(&out, "default", name), ["10.0.0.1"], "{name}");
    }
    let nodes: BTreeSet<_> = ["http", "https", "dns"]
        .iter()
        .map(|n| plan_of(&out, "default", n).node.clone())
        .collect();
    assert_eq!(nodes.len(), 1, "shared IPs on one node: {nodes:?}");
    assert!(nodes.iter().all(Option::is_some));
    let clash = plan_of(&out, "default", "clash");
    assert!(clash.ips.is_empty());
    assert_eq!(clash.allocated.reason, reason::PORT_CLASH);
    assert_contains(
        &clash.allocated.message,
        &["80/TCP", "default/http"],
        "default/clash",
    );
    assert_eq!(ips(&out, "default", "k2"), ["10.0.0.2"]);
    assert_eq!(
        ips(&out, "other", "k"),
        ["10.0.1.1"],
        "sharing never crosses namespaces"
    );

    // The shared IP stays until its last user goes.
    world.remove("default", "http");
    let out = world.plan(&mut planner);
    assert_eq!(ips(&out, "default", "https"), ["10.0.0.1"]);
    assert_eq!(
        ips(&out, "default", "clash"),
        ["10.0.0.1"],
        "80/TCP is free now"
    );
    assert_eq!(planner.usage()[0].in_use, 2);
    for name in ["https", "dns", "clash"] {
        world.remove("default", name);
    }
    world.plan(&mut planner);
    assert_eq!(
        planner.usage()[0].in_use,
        2,
        "k2, and the shared IP held for its last user in case it is re-created"
    );
    world.advance(STICKY_FOR);
    world.plan(&mut planner);
    assert_eq!(planner.usage()[0].in_use, 1, "only k2 left");
}

/// Issue 20 item 7: ports per Service and per address are bounded (MAX_PORTS_PER_IP), so
/// one tenant's Services cannot make a node's assignment object too large for everyone's;
/// the condition names the bound.
#[test]
fn ports_per_service_and_per_address_are_bounded() {
    let with_ports = |name: &str, created: i64, from: i32, n: usize| {
        let mut s = svc("default", name).created(created).sharing("k");
        for p in 0..n {
            s = s.port(from + p as i32, "TCP");
        }
        s
    };
    let mut too_many = svc("default", "huge").created(1);
    for p in 0..=MAX_PORTS_PER_IP {
        too_many = too_many.port(1000 + p as i32, "UDP");
    }
    let mut world = default_3(vec![
        too_many,
        with_ports("a", 2, 1, 200),
        with_ports("b", 3, 201, 100),
        with_ports("c", 4, 301, 10),
    ]);
    let mut planner = Planner::new();
    let out = world.plan(&mut planner);
    let huge = format!(
        "the Service has {} ports, more than the {MAX_PORTS_PER_IP} one address carries; \
         split it into Services with fewer ports",
        MAX_PORTS_PER_IP + 1
    );
    assert_pending(
        &out,
        ("default", "huge"),
        reason::TOO_MANY_PORTS,
        &huge,
        "too many ports",
    );
    assert_eq!(ips(&out, "default", "a"), ["10.0.0.1"]);
    assert_pending(
        &out,
        ("default", "b"),
        reason::TOO_MANY_PORTS,
        "sharing 10.0.0.1 would put 300 ports on it, more than the 256 one address \
         carries (200 of the Services already sharing it); use another sharing key",
        "200 + 100 ports on one address",
    );
    assert_eq!(ips(&out, "default", "c"), ["10.0.0.1"], "210 fit");
    // c grows past the bound: it leaves the address, a keeps it.
    *world.service_mut("default", "c") = with_ports("c", 4, 301, 60);
    let out = world.plan(&mut planner);
    assert_eq!(ips(&out, "default", "a"), ["10.0.0.1"]);
    let c = plan_of(&out, "default", "c");
    assert!(c.ips.is_empty());
    assert_eq!(c.allocated.reason, reason::TOO_MANY_PORTS);
    // At the bound exactly: fits.
    *world.service_mut("default", "c") = with_ports("c", 4, 301, 56);
    let out = world.plan(&mut planner);
    assert_eq!(
        ips(&out, "default", "c"),
        ["10.0.0.1"],
        "200 + 56 = 256 fit"
    );
}

#[test]
fn edits_to_ports_or_sharing_key_are_rechecked() {
    let mut world = default_3(vec![
        sharer("a", 1, "k", 80, "TCP"),
        sharer("b", 2, "k", 81, "TCP"),
    ]);
    let mut planner = Planner::new();
    let out = world.plan(&mut planner);
    assert_eq!(ips(&out, "default", "b"), ["10.0.0.1"]);
    world.service_mut("default", "b").ports[0].port = 80;
    let out = world.plan(&mut planner);
    let b = plan_of(&out, "default", "b");
    assert!(
        b.ips.is_empty(),
        "the edit introduced the clash: b gives the IP up"
    );
    assert_eq!(b.allocated.reason, reason::PORT_CLASH);
    assert_eq!(ips(&out, "default", "a"), ["10.0.0.1"]);
    world.service_mut("default", "b").sharing_key = Some("other".into());
    let out = world.plan(&mut planner);
    assert_eq!(ips(&out, "default", "b"), ["10.0.0.2"]);
    assert_eq!(planner.pending(), 0);
}

#[test]
fn requested_ip_of_the_sharing_group_is_shareable_unless_sharing_is_off() {
    let services = vec![
        sharer("a", 1, "k", 80, "TCP"),
        sharer("b", 2, "k", 81, "TCP").requesting("10.0.0.1"),
        sharer("c", 3, "k", 82, "TCP").requesting("10.0.0.3"),
    ];
    let world = default_3(services.clone());
    let out = world.plan(&mut Planner::new());
    assert_eq!(ips(&out, "default", "b"), ["10.0.0.1"]);
    let c = plan_of(&out, "default", "c");
    assert_eq!(c.allocated.reason, reason::SHARING_KEY_CONFLICT);

    let off = config(&[
        DEFAULT_3,
        (
            "config.yaml",
            "pools:\n  default:\n    allowSharing: false\n",
        ),
    ]);
    let world = World::new(off, services);
    let out = world.plan(&mut Planner::new());
    assert_eq!(ips(&out, "default", "a"), ["10.0.0.1"]);
    let b = plan_of(&out, "default", "b");
    assert!(b.ips.is_empty());
    assert_eq!(b.allocated.reason, reason::SHARING_NOT_ALLOWED);
    assert_contains(&b.allocated.message, &["allowSharing: false"], "default/b");
}

#[test]
fn dual_stack_policies() {
    let dual = config(&[("default", "10.0.0.1\n2001:db8::1-2001:db8::2")]);
    let v4_only = config(&[("default", "10.0.0.1-10.0.0.2")]);
    let both = [Family::V6, Family::V4];
    let table = [
        (
            "require, both free",
            dual.clone(),
            true,
            vec!["2001:db8::1", "10.0.0.1"],
            None,
        ),
        (
            "prefer, both free",
            dual.clone(),
            false,
            vec!["2001:db8::1", "10.0.0.1"],
            None,
        ),
        (
            "prefer, pool lacks IPv6",
            v4_only.clone(),
            false,
            vec!["10.0.0.1"],
            None,
        ),
        (
            "require, pool lacks IPv6",
            v4_only,
            true,
            vec![],
            Some(reason::NO_ADDRESS_OF_FAMILY),
        ),
    ];
    for (name, cfg, require_all, want, want_reason) in table {
        let world = World::new(cfg, vec![svc("default", "s").families(&both, require_all)]);
        let mut planner = Planner::new();
        let out = world.plan(&mut planner);
        assert_eq!(ips(&out, "default", "s"), want, "{name}");
        let p = plan_of(&out, "default", "s");
        assert_eq!(
            p.allocated.reason,
            want_reason.unwrap_or(reason::ALLOCATED),
            "{name}"
        );
        if want.is_empty() {
            assert!(
                planner.usage().iter().all(|u| u.in_use == 0),
                "{name}: holds nothing"
            );
        }
    }

    // RequireDualStack with IPv4 exhausted takes no IPv6 address either; PreferDualStack
    // takes the IPv6 one and gets IPv4 when it frees up.
    let mut world = World::new(
        dual,
        vec![
            svc("default", "v4").created(1),
            svc("default", "require")
                .created(2)
                .families(&[Family::V4, Family::V6], true),
            svc("default", "prefer")
                .created(3)
                .families(&[Family::V4, Family::V6], false),
        ],
    );
    let mut planner = Planner::new();
    let out = world.plan(&mut planner);
    assert!(ips(&out, "default", "require").is_empty());
    assert_eq!(
        plan_of(&out, "default", "require").allocated.message,
        "all 1 IPv4 addresses of pool default are in use"
    );
    assert_eq!(ips(&out, "default", "prefer"), ["2001:db8::1"]);
    assert_eq!(planner.pending(), 2);
    world.remove("default", "v4");
    // The freed IPv4 address is held for v4 for STICKY_FOR, then goes to the oldest waiter.
    let out = world.plan(&mut planner);
    assert!(ips(&out, "default", "require").is_empty());
    world.advance(STICKY_FOR);
    let out = world.plan(&mut planner);
    assert_eq!(ips(&out, "default", "require"), ["10.0.0.1", "2001:db8::2"]);
    assert!(ips(&out, "default", "prefer") == ["2001:db8::1"]);
}

#[test]
fn pool_edit_removing_an_ip() {
    let mut world = World::new(
        config(&[("default", "192.168.55.10-192.168.55.12")]),
        created_in_order("default", &["a", "b", "c"]),
    );
    let mut planner = Planner::new();
    world.plan(&mut planner);
    // Same addresses written differently: nothing changes, nothing reported.
    world.config = config(&[("default", "192.168.55.10\n192.168.55.11-192.168.55.12")]);
    let out = world.plan(&mut planner);
    assert_eq!(ips(&out, "default", "c"), ["192.168.55.12"]);
    assert!(out.events.is_empty(), "{:?}", out.events);

    world.config = config(&[("default", "192.168.55.10-192.168.55.11")]);
    let out = world.plan(&mut planner);
    assert_eq!(ips(&out, "default", "a"), ["192.168.55.10"]);
    assert_eq!(ips(&out, "default", "b"), ["192.168.55.11"]);
    assert!(ips(&out, "default", "c").is_empty());
    let cleared = events_for(&out, "default", "c", reason::CLEAR_ASSIGNMENT);
    assert_eq!(cleared.len(), 1);
    assert_eq!(
        cleared[0].message,
        "192.168.55.12 was removed from the pool of namespace default; assigning a new address"
    );
    assert_eq!(
        plan_of(&out, "default", "c").allocated.reason,
        reason::POOL_EXHAUSTED
    );

    world.config = config(&[("default", "192.168.55.10-192.168.55.11\n192.168.55.20")]);
    let out = world.plan(&mut planner);
    assert_eq!(ips(&out, "default", "c"), ["192.168.55.20"]);
    assert_eq!(planner.usage()[0].in_use, 3);
}

#[test]
fn pool_edit_moving_a_namespace_off_the_fallback() {
    let mut world = World::new(
        config(&[("_fallback", "10.0.9.1-10.0.9.3")]),
        vec![svc("team", "x").created(1)],
    );
    let mut planner = Planner::new();
    assert_eq!(ips(&world.plan(&mut planner), "team", "x"), ["10.0.9.1"]);
    world.config = config(&[("_fallback", "10.0.9.1-10.0.9.3"), ("team", "10.0.5.5")]);
    let out = world.plan(&mut planner);
    assert_eq!(
        ips(&out, "team", "x"),
        ["10.0.5.5"],
        "its own key now withholds it"
    );
    let usage: BTreeMap<_, _> = planner
        .usage()
        .into_iter()
        .map(|u| (u.pool, u.in_use))
        .collect();
    assert_eq!(usage[&PoolKey::Fallback], 0);
    assert_eq!(usage[&PoolKey::Namespace("team".into())], 1);
}

#[test]
fn sticky_recreation_within_the_window() {
    let mut world = default_3_with(&["a", "b", "c"]);
    let mut planner = Planner::new();
    world.plan(&mut planner);
    world.remove("default", "a");
    world.remove("default", "b");
    world.plan(&mut planner);
    world.advance(Duration::from_secs(60));
    recreate(&mut world, "b", 10, "b-2");
    let out = world.plan(&mut planner);
    assert_eq!(
        ips(&out, "default", "b"),
        ["10.0.0.2"],
        "its old IP, not the lowest free"
    );

    // Past the window, a re-created Service gets the lowest free address.
    world.remove("default", "b");
    world.plan(&mut planner);
    world.advance(STICKY_FOR);
    recreate(&mut world, "b", 20, "b-3");
    let out = world.plan(&mut planner);
    assert_eq!(ips(&out, "default", "b"), ["10.0.0.1"]);
}

#[test]
fn recreation_under_a_new_uid_in_one_pass_keeps_the_ip() {
    let mut world = default_3_with(&["a", "b"]);
    let mut planner = Planner::new();
    world.plan(&mut planner);
    *world.service_mut("default", "a") = svc("default", "a").created(5).uid("a-2");
    let out = world.plan(&mut planner);
    assert_eq!(out.released, [(key("default", "a"), vec![ip("10.0.0.1")])]);
    assert_eq!(ips(&out, "default", "a"), ["10.0.0.1"]);
}

/// One Service on 10.0.0.1, planned; returns the world, planner and its node.
fn placed() -> (World, Planner, String) {
    let world = default_3_with(&["web"]);
    let mut planner = Planner::new();
    let out = world.plan(&mut planner);
    let node = node_of(&out, "web").expect("a node").to_owned();
    assert_eq!(events(&out, reason::NODE_ASSIGNED).len(), 1);
    (world, planner, node)
}

/// [`placed`], and its node's agent holds 10.0.0.1, planned once more.
fn held() -> (World, Planner, String) {
    let (mut world, mut planner, n) = placed();
    world.holds(&n, "10.0.0.1");
    world.plan(&mut planner);
    (world, planner, n)
}

/// The node `default/<name>` is placed on in `out`.
fn node_of<'o>(out: &'o PlanOutput, name: &str) -> Option<&'o str> {
    plan_of(out, "default", name).node.as_deref()
}

fn other(node: &str) -> &'static str {
    if node == "a" { "b" } else { "a" }
}

#[test]
fn announced_only_when_the_node_holds_the_ip() {
    let (mut world, mut planner, n) = placed();
    let out = world.plan(&mut planner);
    let web = plan_of(&out, "default", "web");
    assert!(!web.announced.status);
    assert_eq!(web.announced.reason, reason::WAITING_FOR_AGENT);
    world.holds(other(&n), "10.0.0.1");
    let out = world.plan(&mut planner);
    assert_eq!(
        plan_of(&out, "default", "web").announced.reason,
        reason::WAITING_FOR_AGENT,
        "held by the wrong node does not count"
    );
    world.holds(&n, "10.0.0.1");
    world.interface(&n, "eth1", "10.0.0.0/24");
    let out = world.plan(&mut planner);
    let web = plan_of(&out, "default", "web");
    assert!(web.announced.status);
    assert_eq!(web.announced.reason, reason::ANNOUNCED);
    assert_eq!(web.announced.message, format!("held by {n} on eth1"));
}

#[test]
fn graceful_move_waits_for_the_old_agent() {
    let (mut world, mut planner, n) = held();
    let m = other(&n);
    world.node_mut(&n).unschedulable = true;
    let out = world.plan(&mut planner);
    let web = plan_of(&out, "default", "web");
    assert_eq!(web.node, None, "break before make");
    assert_eq!(web.ips, [ip("10.0.0.1")]);
    assert_eq!(web.announced.reason, reason::MOVING);
    let moved = events(&out, reason::NODE_MOVED);
    assert_eq!(moved.len(), 1);
    assert_contains(
        &moved[0].message,
        &[&format!("{n} is cordoned")],
        "NodeMoved",
    );

    // Still held: keep waiting, without repeating the Event.
    let out = world.plan(&mut planner);
    assert_eq!(plan_of(&out, "default", "web").node, None);
    assert!(out.events.is_empty(), "{:?}", out.events);

    world.holds(&n, "");
    let out = world.plan(&mut planner);
    assert_eq!(node_of(&out, "web"), Some(m));
    assert_eq!(events(&out, reason::NODE_ASSIGNED).len(), 1);

    // Uncordoning does not fail back.
    world.node_mut(&n).unschedulable = false;
    let out = world.plan(&mut planner);
    assert_eq!(node_of(&out, "web"), Some(m));
}

#[test]
fn hard_loss_moves_at_once() {
    let (mut world, mut planner, n) = held();
    world.node_mut(&n).agent_ready = false;
    let out = world.plan(&mut planner);
    assert_eq!(node_of(&out, "web"), Some(other(&n)));
    let moved = events(&out, reason::NODE_MOVED);
    assert_eq!(moved.len(), 1);
    assert_contains(&moved[0].message, &["not ready"], "NodeMoved");
}

/// Blind (no agent seen renewing): every node kept, a new Service waits with
/// `AgentsUnobservable` (said once); sight back: it is elected, nothing moved.
#[test]
fn blindness_keeps_every_node_and_elects_none() {
    let (mut world, mut planner, n) = held();
    world.services.push(svc("default", "new").created(2));
    for node in &mut world.nodes {
        node.agent_ready = false;
        node.agent_unconfirmed = true;
    }
    world.agents_unobservable = true;
    // Even a cordon waits for sight.
    world.node_mut(&n).unschedulable = true;
    for pass in 0..2 {
        let out = world.plan(&mut planner);
        let web = plan_of(&out, "default", "web");
        assert_eq!(web.node.as_deref(), Some(n.as_str()), "pass {pass}");
        assert_eq!(web.announced.reason, reason::ANNOUNCED);
        let new = plan_of(&out, "default", "new");
        assert_eq!(new.node, None);
        assert_eq!(new.ips, [ip("10.0.0.2")], "allocation goes on");
        assert_eq!(new.announced.reason, reason::AGENTS_UNOBSERVABLE);
        assert!(events(&out, reason::NODE_MOVED).is_empty());
        let warned = events(&out, reason::AGENTS_UNOBSERVABLE).len();
        assert_eq!(warned, usize::from(pass == 0), "once, on the edge");
    }
    world.node_mut(&n).unschedulable = false;
    for node in &mut world.nodes {
        node.agent_ready = true;
        node.agent_unconfirmed = false;
    }
    world.agents_unobservable = false;
    let out = world.plan(&mut planner);
    assert_eq!(node_of(&out, "web"), Some(n.as_str()));
    assert_eq!(
        node_of(&out, "new"),
        Some(other(&n)),
        "elected once the agents are seen"
    );
}

/// Unconfirmed (not seen renewing, grace of a new term or after blindness): the node
/// keeps what it carries but is not elected for anything new; lost, it is a hard loss.
#[test]
fn an_unconfirmed_agent_keeps_but_gets_nothing_new() {
    let (mut world, mut planner, n) = held();
    world.services.push(svc("default", "new").created(2));
    world.services.push(svc("default", "third").created(3));
    world.node_mut(&n).agent_ready = false;
    world.node_mut(&n).agent_unconfirmed = true;
    let out = world.plan(&mut planner);
    assert_eq!(node_of(&out, "web"), Some(n.as_str()));
    assert!(events(&out, reason::NODE_MOVED).is_empty());
    for name in ["new", "third"] {
        assert_eq!(
            node_of(&out, name),
            Some(other(&n)),
            "{name}: not on the unconfirmed node, though it carries less"
        );
    }
    world.node_mut(&n).agent_unconfirmed = false;
    let out = world.plan(&mut planner);
    assert_eq!(node_of(&out, "web"), Some(other(&n)), "lost: moved at once");
}

#[test]
fn no_eligible_node_is_reported_once() {
    let (mut world, mut planner, _) = placed();
    for n in &mut world.nodes {
        n.agent_ready = false;
    }
    let out = world.plan(&mut planner);
    let web = plan_of(&out, "default", "web");
    assert_eq!(web.node, None);
    assert_eq!(web.announced.reason, reason::NO_ELIGIBLE_NODE);
    assert_eq!(
        web.announced.message,
        "no eligible node: 2 nodes; 2 without a fresh aliaslb agent"
    );
    assert_eq!(events(&out, reason::NO_ELIGIBLE_NODE).len(), 1);
    let out = world.plan(&mut planner);
    assert!(events(&out, reason::NO_ELIGIBLE_NODE).is_empty());
    world.node_mut("b").agent_ready = true;
    let out = world.plan(&mut planner);
    assert_eq!(node_of(&out, "web"), Some("b"));
}

#[test]
fn address_conflict_keeps_the_node() {
    let (mut world, mut planner, n) = placed();
    world.conflict(&n, "10.0.0.1", "already on eth0 (owner: dhcpcd)");
    world.node_mut(&n).unschedulable = true;
    let out = world.plan(&mut planner);
    let web = plan_of(&out, "default", "web");
    assert_eq!(
        web.node.as_deref(),
        Some(n.as_str()),
        "moving would duplicate the address"
    );
    assert_eq!(web.announced.reason, reason::ADDRESS_CONFLICT);
    assert_contains(&web.announced.message, &[&n, "10.0.0.1"], "Announced");
    let conflicts = events(&out, reason::ADDRESS_CONFLICT);
    assert_eq!(conflicts.len(), 1);
    assert!(conflicts[0].warning);
    let out = world.plan(&mut planner);
    assert!(
        events(&out, reason::ADDRESS_CONFLICT).is_empty(),
        "reported once"
    );
}

/// An agent knows only its LAN peers' MACs, so it may call another node's MAC a
/// stranger's: the condition names the node the MAC belongs to.
#[test]
fn a_conflict_with_another_nodes_mac_names_that_node() {
    let (mut world, mut planner, n) = placed();
    let o = other(&n);
    world.mac(o, "eth0", "02:00:00:00:0b:01");
    world.lan_conflict(&n, "10.0.0.1", "02:00:00:00:0b:01", "eth0");
    let out = world.plan(&mut planner);
    let web = plan_of(&out, "default", "web");
    assert_eq!(web.announced.reason, reason::ADDRESS_CONFLICT);
    assert_contains(
        &web.announced.message,
        &[&format!("(02:00:00:00:0b:01 is node {o}'s)")],
        "another node's MAC",
    );
    // A stranger's MAC is named as nobody's.
    let (mut world, mut planner, n) = placed();
    world.lan_conflict(&n, "10.0.0.1", "02:aa:00:00:00:01", "eth0");
    let out = world.plan(&mut planner);
    let message = &plan_of(&out, "default", "web").announced.message;
    assert!(!message.contains("is node"), "{message}");
}

#[test]
fn quoted_text_is_bounded_in_conditions_and_events() {
    // The planner takes reports as given (the controller bounds them when it reads them):
    // a reason far over the API's 32 KiB limit still makes a bounded message.
    let (mut world, mut planner, n) = placed();
    let reason_text = format!("{}é", "x".repeat(40_000));
    world.conflict(&n, "10.0.0.1", &reason_text);
    // A user's malformed request quoted at length, too.
    world.services.push(
        svc("default", "odd")
            .created(2)
            .malformed(&"nope,".repeat(10_000)),
    );
    let out = world.plan(&mut planner);
    let web = plan_of(&out, "default", "web");
    assert_eq!(web.announced.reason, reason::ADDRESS_CONFLICT);
    let message = &web.announced.message;
    assert!(
        message.len() <= MAX_MESSAGE && message.len() > MAX_MESSAGE - 8,
        "{}",
        message.len()
    );
    assert_starts_with(
        message,
        &format!("{n} reports a conflict for 10.0.0.1: xxx"),
        "Announced",
    );
    assert!(message.ends_with("..."), "{message}");
    let conflicts = events(&out, reason::ADDRESS_CONFLICT);
    assert_eq!(conflicts.len(), 1);
    assert_eq!(
        &conflicts[0].message, message,
        "the Event says what the condition says"
    );
    let odd = plan_of(&out, "default", "odd");
    assert_eq!(odd.allocated.reason, reason::INVALID_REQUEST);
    assert!(odd.allocated.message.len() <= MAX_MESSAGE && odd.allocated.message.ends_with("..."));
    for e in &out.events {
        assert!(
            e.message.len() <= MAX_MESSAGE,
            "{}: {}",
            e.reason,
            e.message.len()
        );
    }
    // The same bounded message next pass: no new Event, nothing to write.
    let again = world.plan(&mut planner);
    assert!(events(&again, reason::ADDRESS_CONFLICT).is_empty());
    assert_eq!(
        &plan_of(&again, "default", "web").announced.message,
        message
    );
}

#[test]
fn restart_adopts_the_observed_node_only_if_eligible() {
    let mut world = default_3(vec![
        imported("kept", 1, "10.0.0.1", Some("b")),
        imported("leaving", 2, "10.0.0.2", Some("c")),
        imported("gone", 3, "10.0.0.3", Some("dead")),
    ]);
    let mut c = node("c");
    c.unschedulable = true;
    world.nodes.push(c);
    world.holds("c", "10.0.0.2");
    let out = world.plan(&mut Planner::new());
    assert_eq!(node_of(&out, "kept"), Some("b"));
    let leaving = plan_of(&out, "default", "leaving");
    assert_eq!(leaving.node, None, "c still holds it: graceful move");
    assert_eq!(leaving.announced.reason, reason::MOVING);
    assert!(
        plan_of(&out, "default", "gone").node.is_some(),
        "unknown node: elected at once"
    );
    assert!(events_for(&out, "default", "kept", reason::NODE_ASSIGNED).is_empty());
}

#[test]
fn local_traffic_follows_endpoints_and_least_load() {
    let mut world = World::new(
        config(&[("default", "10.0.0.1-10.0.0.9")]),
        vec![
            svc("default", "l").created(1).local(),
            svc("default", "x").created(2),
            svc("default", "y").created(3),
        ],
    );
    world
        .local
        .insert(key("default", "l"), BTreeSet::from(["b".to_owned()]));
    let mut planner = Planner::new();
    let out = world.plan(&mut planner);
    assert_eq!(node_of(&out, "l"), Some("b"));
    assert_eq!(
        node_of(&out, "x"),
        Some("a"),
        "least loaded: b already carries l"
    );

    // The endpoint moves to a: graceful move (b's agent holds the IP).
    world.holds("b", "10.0.0.1");
    world
        .local
        .insert(key("default", "l"), BTreeSet::from(["a".to_owned()]));
    let out = world.plan(&mut planner);
    let moved = events_for(&out, "default", "l", reason::NODE_MOVED);
    assert_contains(
        &moved[0].message,
        &["b has no ready local endpoint"],
        "NodeMoved",
    );
    world.holds("b", "");
    let out = world.plan(&mut planner);
    assert_eq!(node_of(&out, "l"), Some("a"));
}

#[test]
fn interface_comes_from_the_pool_options() {
    let world = World::new(
        config(&[
            DEFAULT_3,
            ("config.yaml", "pools:\n  default:\n    interface: eth1\n"),
        ]),
        vec![svc("default", "a"), svc("nowhere", "b")],
    );
    let out = world.plan(&mut Planner::new());
    assert_eq!(
        plan_of(&out, "default", "a").interface.as_deref(),
        Some("eth1")
    );
    assert_eq!(plan_of(&out, "nowhere", "b").interface, None);
}

#[test]
fn ten_thousand_services() {
    let services: Vec<_> = (0..10_000)
        .map(|i| {
            let s = svc(&format!("ns{}", i % 50), &format!("s{i}")).created(i);
            if i % 10 == 0 {
                s.sharing("k").port(i as i32, "TCP")
            } else {
                s
            }
        })
        .collect();
    let mut world = World::new(config(&[("_fallback", "10.1.0.0/16")]), services);
    world.nodes = (0..20).map(|i| node(&format!("n{i}"))).collect();
    // Timing is printed, not asserted (`cargo test --release -- --nocapture` to see it):
    // the best of five fresh planners, and of five passes with nothing changed, as wall
    // time and as this thread's CPU time (robust when the machine is busy).
    let mut first = Timing::default();
    let mut planner = Planner::new();
    let mut out = Default::default();
    for _ in 0..5 {
        planner = Planner::new();
        let t = Timing::start();
        out = world.plan(&mut planner);
        first = first.best(t.stop());
    }
    let mut steady = Timing::default();
    let mut again = Default::default();
    for _ in 0..5 {
        let t = Timing::start();
        again = world.plan(&mut planner);
        steady = steady.best(t.stop());
    }
    eprintln!("10,000 Services: first pass {first}; steady pass {steady}");
    assert_eq!(planner.pending(), 0);
    let shared: BTreeMap<_, _> = world
        .services
        .iter()
        .map(|s| (&s.key, s.sharing_key.is_some()))
        .collect();
    let mut owners: BTreeMap<_, BTreeSet<_>> = BTreeMap::new();
    for (k, p) in &out.services {
        assert_eq!(p.ips.len(), 1, "{k}");
        assert!(p.node.is_some(), "{k}");
        let group = shared[k];
        owners
            .entry(p.ips[0])
            .or_default()
            .insert((k.namespace.clone(), group));
    }
    for (ip, users) in &owners {
        assert_eq!(
            users.len(),
            1,
            "{ip} crosses namespaces or sharing groups: {users:?}"
        );
    }
    // 9,000 unshared + one shared address per namespace with sharers (i % 10 == 0 lands
    // in namespaces ns0, ns10, .., ns40).
    assert_eq!(owners.len(), 9_000 + 5);
    assert!(again.events.is_empty());
    assert_eq!(again.services, out.services);
}

/// Wall and CPU time of one pass (CPU from `/proc/thread-self/schedstat`, Linux only;
/// zero elsewhere).
#[derive(Debug, Clone, Copy)]
struct Timing {
    wall: Duration,
    cpu: Duration,
}

impl Default for Timing {
    fn default() -> Self {
        Timing {
            wall: Duration::MAX,
            cpu: Duration::MAX,
        }
    }
}

impl Timing {
    fn start() -> (std::time::Instant, Duration) {
        (std::time::Instant::now(), thread_cpu())
    }

    fn best(self, other: Timing) -> Timing {
        Timing {
            wall: self.wall.min(other.wall),
            cpu: self.cpu.min(other.cpu),
        }
    }
}

trait Stop {
    fn stop(self) -> Timing;
}

impl Stop for (std::time::Instant, Duration) {
    fn stop(self) -> Timing {
        Timing {
            wall: self.0.elapsed(),
            cpu: thread_cpu().saturating_sub(self.1),
        }
    }
}

impl std::fmt::Display for Timing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:.1?} wall, {:.1?} CPU", self.wall, self.cpu)
    }
}

fn thread_cpu() -> Duration {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .map_or(Duration::ZERO, Duration::from_nanos)
}

/// A Service moves to another address while another waits for one: until the controller's
/// write lands, the API still shows the old address on the Service that left it, and
/// handing it to the waiter in the same pass would show one IP on two Services (the two
/// writes run concurrently). The waiter gets it once the clear has landed.
#[test]
fn an_ip_the_api_still_shows_on_its_old_service_waits_until_the_clear_lands() {
    struct Case {
        name: &'static str,
        world: World,
        /// The Service that moves, from `old` to `new`.
        mover: (&'static str, &'static str),
        old: &'static str,
        new: &'static str,
        /// The Service that waits for an address (if in `world` from the start, it waits
        /// from the first pass).
        waiter: (&'static str, &'static str),
        /// Moves `mover` from `old` to `new`.
        moves: fn(&mut World),
    }
    let cases = [
        // Chaos seed 11: team/x leaves the fallback (its namespace gets a key) while other/y
        // waits for a fallback address.
        Case {
            name: "pool edit",
            world: World::new(
                config(&[("_fallback", "10.0.9.1")]),
                vec![svc("team", "x").created(1), svc("other", "y").created(2)],
            ),
            mover: ("team", "x"),
            old: "10.0.9.1",
            new: "10.0.5.5",
            waiter: ("other", "y"),
            moves: |world| {
                world.config = config(&[("_fallback", "10.0.9.1"), ("team", "10.0.5.5")])
            },
        },
        // a moves to 10.0.0.3 in the same pass as c arrives: 10.0.0.1 is free in memory, but
        // the API still shows it on a.
        Case {
            name: "requested move",
            world: default_3(vec![
                svc("default", "a").created(1),
                svc("default", "b").created(2).requesting("10.0.0.2"),
            ]),
            mover: ("default", "a"),
            old: "10.0.0.1",
            new: "10.0.0.3",
            waiter: ("default", "c"),
            moves: |world| {
                *world.service_mut("default", "a") = svc("default", "a")
                    .created(1)
                    .requesting("10.0.0.3")
                    .observed("10.0.0.1", None);
                world.services.push(svc("default", "c").created(3));
            },
        },
    ];
    for case in cases {
        let Case {
            name: case,
            mut world,
            mover: (ns, name),
            old,
            new,
            waiter: (wns, wname),
            moves,
        } = case;
        let waits_from_the_start = world.services.iter().any(|s| s.key == key(wns, wname));
        let mut planner = Planner::new();
        let out = world.plan(&mut planner);
        assert_eq!(ips(&out, ns, name), [old], "{case}");
        if waits_from_the_start {
            assert!(ips(&out, wns, wname).is_empty(), "{case}");
        }
        world.service_mut(ns, name).observed_ips = vec![ip(old)];

        moves(&mut world);
        let out = world.plan(&mut planner);
        assert_eq!(ips(&out, ns, name), [new], "{case}");
        assert!(
            ips(&out, wns, wname).is_empty(),
            "{case}: {old} is still on {ns}/{name} in the API"
        );

        world.service_mut(ns, name).observed_ips = vec![ip(new)];
        let out = world.plan(&mut planner);
        assert_eq!(ips(&out, wns, wname), [old], "{case}: the clear landed");
    }
}

#[test]
fn an_address_a_node_has_is_never_allocated() {
    let mut world = World::new(
        config(&[
            DEFAULT_3,
            ("six", "2001:db8::1-2001:db8::2"),
            ("other", "10.0.1.1-10.0.1.2"),
        ]),
        [
            created_in_order("default", &["a", "b", "c"]),
            vec![
                svc("default", "asks").created(4).requesting("10.0.0.1"),
                svc("six", "v6").created(5).families(&[Family::V6], false),
            ],
        ]
        .concat(),
    );
    world.node_has("n3", "10.0.0.1");
    world
        .node_addresses
        .insert(ip("2001:db8::1"), NodeAddress::new("n4", "ExternalIP"));
    let mut planner = Planner::new();
    let out = world.plan(&mut planner);
    assert_eq!(ips(&out, "default", "a"), ["10.0.0.2"], "not the lowest");
    assert_eq!(ips(&out, "default", "b"), ["10.0.0.3"]);
    assert_eq!(ips(&out, "six", "v6"), ["2001:db8::2"], "IPv6 too");
    assert_pending(
        &out,
        ("default", "c"),
        reason::POOL_EXHAUSTED,
        "all 3 addresses of pool default are in use; 1 of them is a Node's address, never \
         allocated (10.0.0.1 is the InternalIP of node n3)",
        "the Node's address is withheld",
    );
    assert_pending(
        &out,
        ("default", "asks"),
        reason::NODE_ADDRESS,
        "10.0.0.1 is the InternalIP of node n3: never allocated; request another address \
         of the pool",
        "a request for the Node's address",
    );
    let usage: BTreeMap<_, _> = planner
        .usage()
        .into_iter()
        .map(|u| ((u.pool, u.family), (u.total, u.in_use)))
        .collect();
    assert_eq!(
        usage[&(PoolKey::Namespace("default".into()), Family::V4)],
        (2, 2),
        "the Node's address counts neither in the pool nor in use"
    );
    assert_eq!(
        usage[&(PoolKey::Namespace("six".into()), Family::V6)],
        (1, 1)
    );
    assert_eq!(
        usage[&(PoolKey::Namespace("other".into()), Family::V4)],
        (2, 0)
    );
    assert!(events(&out, reason::CLEAR_ASSIGNMENT).is_empty());

    // Still withheld after a pool edit (the ledgers are rebuilt).
    world.config = config(&[
        ("default", "10.0.0.1-10.0.0.4"),
        ("six", "2001:db8::1-2001:db8::2"),
        ("other", "10.0.1.1-10.0.1.2"),
    ]);
    let out = world.plan(&mut planner);
    assert_eq!(ips(&out, "default", "c"), ["10.0.0.4"]);
    assert!(ips(&out, "default", "asks").is_empty());

    // The Node lets go of it: the oldest waiting Service gets it in the same pass.
    world.node_drops("10.0.0.1");
    let out = world.plan(&mut planner);
    assert_eq!(ips(&out, "default", "asks"), ["10.0.0.1"]);
    assert_eq!(planner.pending(), 0);
    assert_eq!(planner.usage()[0].in_use, 4);
}

/// Issue 20 item 10: the address of a deleted Service is held for its key while it is
/// remembered (STICKY_FOR): a pending Service does not take it, a request for it waits
/// with RequestedIPReserved, and the Service re-created under the same name gets it back.
#[test]
fn the_address_of_a_deleted_service_is_held_for_its_re_creation() {
    let mut world = World::new(
        config(&[("default", "10.0.0.1")]),
        created_in_order("default", &["web", "waiting"]),
    );
    let mut planner = Planner::new();
    let out = world.plan(&mut planner);
    assert_eq!(ips(&out, "default", "web"), ["10.0.0.1"]);
    // Its node's agent holds it, as it still does when the Service is deleted.
    let node = plan_of(&out, "default", "web").node.clone().unwrap();
    world.holds(&node, "10.0.0.1");
    world.plan(&mut planner);
    // A reinstall: web deleted, a pending Service and a request meanwhile.
    world.remove("default", "web");
    world
        .services
        .push(svc("default", "asks").created(3).requesting("10.0.0.1"));
    let out = world.plan(&mut planner);
    assert!(
        ips(&out, "default", "waiting").is_empty(),
        "taken by a waiter"
    );
    assert_pending(
        &out,
        ("default", "asks"),
        reason::REQUESTED_IP_RESERVED,
        "10.0.0.1 is held for default/web, deleted less than 10 min ago, in case it is \
         re-created; request another address, or wait until then",
        "taken by a request",
    );
    assert_eq!(
        planner
            .reserved()
            .map(|(ip, k)| (ip, k.clone()))
            .collect::<Vec<_>>(),
        [(ip("10.0.0.1"), key("default", "web"))]
    );
    // The agent lets go of it: still held for web.
    world.holds(&node, "");
    let out = world.plan(&mut planner);
    assert!(
        ips(&out, "default", "waiting").is_empty(),
        "taken once let go"
    );
    // Five minutes later web comes back (a new uid): its address, not a new one.
    world.advance(STICKY_FOR / 2);
    recreate(&mut world, "web", 10, "web-2");
    let out = world.plan(&mut planner);
    assert_eq!(ips(&out, "default", "web"), ["10.0.0.1"]);
    assert_eq!(planner.reserved().count(), 0);
    assert_eq!(planner.next_release(), None);
    assert!(ips(&out, "default", "waiting").is_empty());
}

#[test]
fn a_sticky_address_a_node_got_meanwhile_is_not_reused() {
    let mut world = default_3_with(&["a", "b"]);
    let mut planner = Planner::new();
    world.plan(&mut planner);
    world.remove("default", "b");
    world.plan(&mut planner);
    world.node_has("n", "10.0.0.2");
    recreate(&mut world, "b", 10, "b-2");
    let out = world.plan(&mut planner);
    assert_eq!(ips(&out, "default", "b"), ["10.0.0.3"]);
}

/// Issue 42: a node's word never takes an address from a Service. A Node that gets the
/// address a Service holds (its kubelet writes its status) leaves it with the Service, which
/// is told once (a Warning `NodeClaim` to every member of a sharing group); the address is
/// not allocated again once released while the Node lists it.
#[test]
fn a_service_holding_an_address_a_node_gets_keeps_it() {
    let mut world = World::new(
        config(&[("default", "10.0.0.1-10.0.0.4")]),
        vec![
            svc("default", "a").created(1),
            sharer("web", 2, "k", 80, "TCP"),
            sharer("tls", 3, "k", 443, "TCP"),
        ],
    );
    let want = [("a", "10.0.0.1"), ("web", "10.0.0.2"), ("tls", "10.0.0.2")];
    let mut planner = Planner::new();
    let out = world.plan(&mut planner);
    for (name, ip) in want {
        assert_eq!(ips(&out, "default", name), [ip], "{name}");
        world.service_mut("default", name).observed_ips =
            plan_of(&out, "default", name).ips.clone();
    }

    world.node_has("n3", "10.0.0.1");
    world.node_has("n4", "10.0.0.2");
    let out = world.plan(&mut planner);
    for (name, ip) in want {
        assert_eq!(ips(&out, "default", name), [ip], "{name}: kept");
    }
    let claimed = assert_node_claim(
        &out,
        "a",
        "10.0.0.1 is the InternalIP of node n3: the node's own word",
    );
    assert!(claimed.warning);
    for name in ["web", "tls"] {
        assert_eq!(
            events_for(&out, "default", name, reason::NODE_CLAIM).len(),
            1,
            "{name}"
        );
    }
    let a = plan_of(&out, "default", "a");
    assert!(a.allocated.status);
    assert_eq!(a.allocated.reason, reason::NODE_CLAIM);
    assert_starts_with(
        &a.allocated.message,
        "assigned 10.0.0.1 from pool default; 10.0.0.1 is the InternalIP of node n3",
        "IPAllocated",
    );
    let again = world.plan(&mut planner);
    assert!(
        events(&again, reason::NODE_CLAIM).is_empty(),
        "once, on the edge: {:?}",
        again.events
    );

    // A pool edit (the ledgers are rebuilt) keeps them too, and says nothing new.
    world.config = config(&[("default", "10.0.0.1-10.0.0.5")]);
    let out = world.plan(&mut planner);
    assert_eq!(ips(&out, "default", "a"), ["10.0.0.1"]);
    assert!(
        events(&out, reason::NODE_CLAIM).is_empty(),
        "{:?}",
        out.events
    );

    // The sharing group is deleted: its address stays out of use while n4 lists it.
    world.remove("default", "web");
    world.remove("default", "tls");
    world.plan(&mut planner);
    world.advance(STICKY_FOR * 2);
    for (i, name) in ["b", "c", "d", "e"].iter().enumerate() {
        world
            .services
            .push(svc("default", name).created(10 + i as i64));
    }
    let out = world.plan(&mut planner);
    let got: Vec<Vec<String>> = ["b", "c", "d", "e"]
        .iter()
        .map(|n| ips(&out, "default", n))
        .collect();
    assert_eq!(
        got,
        [vec!["10.0.0.3"], vec!["10.0.0.4"], vec!["10.0.0.5"], vec![]]
    );
    let e = plan_of(&out, "default", "e");
    assert_eq!(e.allocated.reason, reason::POOL_EXHAUSTED);
    assert_contains(
        &e.allocated.message,
        &[
            "1 of them is a Node's address, never allocated (10.0.0.2 is the InternalIP of \
           node n4)",
        ],
        "default/e",
    );
}

/// Issue 42: a leader's first pass imports an address a Node lists with its Service (the
/// Warning `NodeClaim` said again, once per term); claimed by two Services, the older keeps
/// it and the other gets another address.
#[test]
fn an_imported_node_address_is_kept() {
    let mut world = default_3(vec![
        imported("a", 1, "10.0.0.1", Some("a")),
        imported("b", 2, "10.0.0.3", Some("b")),
        svc("default", "c").created(3),
    ]);
    world.node_has("alb-node-3", "10.0.0.1");
    let mut planner = Planner::new();
    let out = world.plan(&mut planner);
    assert_eq!(ips(&out, "default", "a"), ["10.0.0.1"], "imported as is");
    assert_eq!(ips(&out, "default", "b"), ["10.0.0.3"], "imported as is");
    assert_eq!(ips(&out, "default", "c"), ["10.0.0.2"]);
    assert_node_claim(
        &out,
        "a",
        "10.0.0.1 is the InternalIP of node alb-node-3: the node's own word",
    );
    let mut world = default_3(vec![
        imported("a", 1, "10.0.0.1", None),
        imported("b", 2, "10.0.0.1", None),
    ]);
    world.node_has("n", "10.0.0.1");
    let out = world.plan(&mut Planner::new());
    assert_eq!(ips(&out, "default", "a"), ["10.0.0.1"]);
    assert_eq!(ips(&out, "default", "b"), ["10.0.0.2"]);
}

/// Issue 20 item 9, issue 42: the network and broadcast addresses of a subnet nodes are on
/// are never handed out, even from a pool range that lists them: not as the lowest free
/// address, not on request; a Service holding one (imported) keeps it (a node's word never
/// renumbers); once no agent reports the subnet, they are free again. Both nodes report the
/// subnet (their Nodes list no address in it: see `subnet_edges`).
#[test]
fn a_node_subnets_network_and_broadcast_addresses_are_never_allocated() {
    let mut world = World::new(
        config(&[("default", "10.0.0.0-10.0.0.3")]),
        vec![
            imported("a", 1, "10.0.0.3", Some("a")),
            svc("default", "b").created(2),
            svc("default", "c").created(3),
            svc("default", "d").created(4),
            svc("default", "asks").created(5).requesting("10.0.0.0"),
        ],
    );
    for node in ["a", "b"] {
        world.node_mut(node).subnets = vec!["10.0.0.0/30".parse().unwrap()];
    }
    let mut planner = Planner::new();
    let out = world.plan(&mut planner);
    assert_eq!(ips(&out, "default", "a"), ["10.0.0.3"], "kept");
    assert_eq!(ips(&out, "default", "b"), ["10.0.0.1"]);
    assert_eq!(ips(&out, "default", "c"), ["10.0.0.2"]);
    assert_node_claim(
        &out,
        "a",
        "10.0.0.3 is the broadcast address of subnet 10.0.0.0/30 of node a: the node's own word",
    );
    assert_pending(
        &out,
        ("default", "d"),
        reason::POOL_EXHAUSTED,
        "all 4 addresses of pool default are in use; 1 of them is a subnet's network or \
         broadcast address, never allocated (10.0.0.0 is the network address of subnet \
         10.0.0.0/30 of node a)",
        "the network address is withheld",
    );
    assert!(ips(&out, "default", "asks").is_empty());
    assert_allocated_starts_with(
        &out,
        ("default", "asks"),
        reason::SUBNET_ADDRESS,
        "10.0.0.0 is the network address of subnet 10.0.0.0/30 of node a: never allocated",
        "a request",
    );
    // The nodes leave that subnet: the network address is free again, and a is told nothing.
    for node in ["a", "b"] {
        world.node_mut(node).subnets.clear();
    }
    let out = world.plan(&mut planner);
    assert_eq!(ips(&out, "default", "d"), ["10.0.0.0"]);
    assert_eq!(ips(&out, "default", "asks"), Vec::<String>::new());
    assert_eq!(
        plan_of(&out, "default", "a").allocated.reason,
        reason::ALLOCATED
    );
}

/// Issue 20 item 9: pool addresses in a Service ClusterIP range are never handed out.
#[test]
fn pool_addresses_in_a_service_clusterip_range_are_never_allocated() {
    let mut world = World::new(
        config(&[("default", "10.96.0.1-10.96.0.2\n10.80.0.1")]),
        [
            created_in_order("default", &["a", "b"]),
            vec![svc("default", "asks").created(3).requesting("10.96.0.2")],
        ]
        .concat(),
    );
    world.service_ranges = vec!["10.96.0.0/12".parse().unwrap()];
    let mut planner = Planner::new();
    let out = world.plan(&mut planner);
    assert_eq!(ips(&out, "default", "a"), ["10.80.0.1"]);
    assert_eq!(
        allocated(&out, "default", "b"),
        (
            reason::POOL_EXHAUSTED,
            "all 3 addresses of pool default are in use; 2 of them are in a Service ClusterIP \
             range, never allocated (10.96.0.1 is in the Service ClusterIP range 10.96.0.0/12, \
             10.96.0.2 is in the Service ClusterIP range 10.96.0.0/12)"
        )
    );
    assert_allocated_starts_with(
        &out,
        ("default", "asks"),
        reason::SERVICE_RANGE,
        "10.96.0.2 is in the Service ClusterIP range 10.96.0.0/12: never allocated",
        "a request",
    );
    // The range goes (the ServiceCIDR was deleted): the addresses are free again.
    world.service_ranges.clear();
    let out = world.plan(&mut planner);
    assert_eq!(ips(&out, "default", "b"), ["10.96.0.1"]);
    assert_eq!(ips(&out, "default", "asks"), ["10.96.0.2"]);
}

#[test]
fn node_address_clashes_name_key_and_line() {
    let pools = config(&[
        ("default", "10.0.0.5\n10.0.0.1-10.0.0.3"),
        ("staging", "10.0.1.0/30\n2001:db8::/64"),
    ]);
    let addresses = BTreeMap::from([
        (ip("10.0.0.2"), NodeAddress::new("n1", "InternalIP")),
        // The network address of the /30 is not in the pool.
        (ip("10.0.1.0"), NodeAddress::new("n2", "InternalIP")),
        (ip("10.0.1.1"), NodeAddress::new("n2", "ExternalIP")),
        (ip("2001:db8::7"), NodeAddress::new("n3", "InternalIP")),
        (ip("10.9.9.9"), NodeAddress::new("n4", "InternalIP")),
    ]);
    let clashes: Vec<String> = node_address_clashes(&pools, &addresses)
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        clashes,
        [
            "key default, line 2: 10.0.0.2 is the InternalIP of node n1: never allocated",
            "key staging, line 1: 10.0.1.1 is the ExternalIP of node n2: never allocated",
            "key staging, line 2: 2001:db8::7 is the InternalIP of node n3: never allocated",
        ]
    );
    assert!(node_address_clashes(&pools, &BTreeMap::new()).is_empty());
}

#[test]
fn an_ip_is_not_reused_while_it_lingers_or_a_fresh_agent_holds_it() {
    let mut world = classic();
    let mut planner = Planner::new();
    world.plan(&mut planner);
    let d_pending = |out: &PlanOutput| ips(out, "default", "d").is_empty();

    // b stops being ours (type changed): the API still shows its IP on it.
    world.remove("default", "b");
    world.not_ours.insert(key("default", "b"));
    world.lingering.insert(ip("10.0.0.2"));
    world.holds("a", "10.0.0.2");
    assert!(
        d_pending(&world.plan(&mut planner)),
        "the API still shows it on b"
    );
    assert_eq!(
        planner.reserved().count(),
        0,
        "not held for b: it was not deleted, it stopped being ours"
    );
    // b's status was cleared, but node a's agent still holds the alias.
    world.lingering.clear();
    assert!(
        d_pending(&world.plan(&mut planner)),
        "a fresh agent still holds it"
    );
    // The agent went stale (its node died without a SIGTERM): its alias has expired in the
    // kernel, and its Lease must not keep the IP out of the pool for ever.
    world.node_mut("a").agent_ready = false;
    assert_eq!(ips(&world.plan(&mut planner), "default", "d"), ["10.0.0.2"]);
}

/// A plan names its nodes with the nodes' own names, shared, not copies: at 10,000
/// Services a name per group and plan was megabytes (BENCHMARKS, "Boxed records and
/// shared names"). Also when the holder stays (the election keeps the current node) and
/// for the standby.
#[test]
fn plans_share_the_names_of_their_nodes() {
    let mut world = default_3_with(&["s1", "s2", "s3"]);
    world.on_subnets(&[("a", "10.0.0.11/24"), ("b", "10.0.0.12/24")]);
    let own = |world: &World, name: &Arc<str>| {
        let node = world
            .nodes
            .iter()
            .find(|n| n.name == *name)
            .expect("a node");
        Arc::ptr_eq(&node.name, name)
    };
    let mut planner = Planner::new();
    // (The controller keeps each node's name from pass to pass: `World::nodes_changed`.)
    for pass in 0..2 {
        let out = world.plan(&mut planner);
        assert_eq!(out.services.len(), 3);
        for (key, plan) in &out.services {
            let node = plan.node.as_ref().expect("placed");
            assert!(own(&world, node), "pass {pass}, {key}: {node} is a copy");
            let standby = plan.standby.as_ref().expect("a standby");
            assert!(
                own(&world, &standby.node),
                "pass {pass}, {key}: the standby's name"
            );
        }
        for plan in out.services.values() {
            world.holds(plan.node.as_deref().unwrap(), &plan.ips[0].to_string());
        }
    }
}

/// `default/web` on `DEFAULT_3`, its nodes on the subnets of `lan` (`(node, address/prefix)`;
/// nodes other than `a` and `b` are added), planned: the world, the planner and web's plan.
fn web_on_a_lan(lan: &[(&str, &str)]) -> (World, Planner, ServicePlan) {
    let mut world = default_3_with(&["web"]);
    for (name, _) in lan {
        if !world.nodes.iter().any(|n| &*n.name == *name) {
            world.nodes.push(node(name));
        }
    }
    world.on_subnets(lan);
    let mut planner = Planner::new();
    let out = world.plan(&mut planner);
    let web = plan_of(&out, "default", "web").clone();
    (world, planner, web)
}

/// Fast L2 failover: each L2 Service gets a standby on its LAN (never its holder), which
/// stays while it qualifies; when the holder is lost, the standby (which took the IP over
/// on the LAN) becomes the holder and another node the standby.
#[test]
fn a_standby_on_the_lan_is_named_and_a_hard_loss_moves_to_it() {
    let (mut world, mut planner, web) = web_on_a_lan(&[
        ("a", "10.0.0.11/24"),
        ("b", "10.0.0.12/24"),
        ("c", "10.0.0.13/24"),
        ("off-lan", "192.168.9.9/24"),
    ]);
    let holder = web.node.clone().expect("a holder");
    let standby = web.standby.clone().expect("a standby");
    assert_ne!(standby.node, holder);
    assert_ne!(&*standby.node, "off-lan", "a standby is on the IP's LAN");
    let address = |n: &str| match n {
        "a" => ip("10.0.0.11"),
        "b" => ip("10.0.0.12"),
        _ => ip("10.0.0.13"),
    };
    assert_eq!(
        standby.addresses,
        vec![(ip("10.0.0.1"), address(&standby.node))]
    );
    world.holds(&holder, "10.0.0.1");
    for _ in 0..2 {
        let out = world.plan(&mut planner);
        assert_eq!(
            plan_of(&out, "default", "web").standby,
            Some(standby.clone())
        );
    }
    // Hard loss: the standby holds the IP on the LAN already and becomes the holder.
    world.holds(&holder, "");
    world.holds(&standby.node, "10.0.0.1");
    world.node_mut(&holder).agent_ready = false;
    let out = world.plan(&mut planner);
    let web = plan_of(&out, "default", "web");
    assert_eq!(web.node, Some(standby.node.clone()));
    let next = web.standby.as_ref().expect("a new standby");
    assert!(
        next.node != standby.node && next.node != holder && &*next.node != "off-lan",
        "{next:?}"
    );
    // A standby that goes (cordoned) is replaced.
    world.node_mut(&next.node.clone()).unschedulable = true;
    let out = world.plan(&mut planner);
    assert_eq!(
        plan_of(&out, "default", "web").standby,
        None,
        "no node left to stand by"
    );
}

/// A standby holding the IPs (it took them over on the LAN) while the elected node does not
/// shows as Announced `TakenOver`, naming both, as long as the holder cannot be confirmed
/// (a new leader's first lease duration): then nothing moves.
#[test]
fn a_takeover_by_the_standby_is_shown_on_the_service() {
    let (mut world, mut planner, web) =
        web_on_a_lan(&[("a", "10.0.0.11/24"), ("b", "10.0.0.12/24")]);
    let (holder, standby) = (web.node.unwrap(), web.standby.unwrap().node);
    world.holds(&holder, "10.0.0.1");
    let out = world.plan(&mut planner);
    assert_eq!(
        plan_of(&out, "default", "web").announced.reason,
        reason::ANNOUNCED
    );
    world.holds(&holder, "");
    world.holds(&standby, "10.0.0.1");
    world.node_mut(&holder).agent_ready = false;
    world.node_mut(&holder).agent_unconfirmed = true;
    let out = world.plan(&mut planner);
    let web = plan_of(&out, "default", "web");
    assert_eq!(web.node.as_ref(), Some(&holder));
    let announced = &web.announced;
    assert!(announced.status);
    assert_eq!(announced.reason, reason::TAKEN_OVER);
    assert!(
        announced.message.contains(&*standby) && announced.message.contains(&*holder),
        "{}",
        announced.message
    );
}

/// The holder of `default/web` (a placed L2 Service with a standby, nodes a, b and c on one
/// LAN) came back before its Lease ran out (a restarted agent renews it at once): the
/// standby took the IP over on the LAN and the holder's agent yielded it to that claim.
/// Returns the world, the planner, the holder and the standby.
fn yielded_to_the_standby() -> (World, Planner, Arc<str>, Arc<str>) {
    let (mut world, mut planner, web) = web_on_a_lan(&[
        ("a", "10.0.0.11/24"),
        ("b", "10.0.0.12/24"),
        ("c", "10.0.0.13/24"),
    ]);
    let (holder, standby) = (web.node.unwrap(), web.standby.unwrap().node);
    world.holds(&holder, "10.0.0.1");
    world.plan(&mut planner);
    // The standby takes the IP over; the holder, back, yields to its claim.
    world.holds(&holder, "");
    world.lan_yield(&holder, "10.0.0.1", &standby, "02:00:00:00:00:0b", "eth0");
    world.holds(&standby, "10.0.0.1");
    world.link_mac(&standby, "02:00:00:00:00:0b");
    (world, planner, holder, standby)
}

/// Fast L2 failover, the holder back before its Lease ran out and yielded to its standby's
/// claim ([`yielded_to_the_standby`]): the standby becomes the holder then, where the IP
/// is, without a probe.
#[test]
fn a_holder_that_yielded_to_its_standby_hands_over_to_it() {
    let (world, mut planner, holder, standby) = yielded_to_the_standby();
    let out = world.plan(&mut planner);
    let web = plan_of(&out, "default", "web");
    assert_eq!(web.node.as_ref(), Some(&standby), "{web:?}");
    assert_eq!(web.announced.reason, reason::ANNOUNCED, "{web:?}");
    assert!(
        web.standby.as_ref().is_none_or(|s| s.node != standby),
        "{web:?}"
    );
    assert!(
        out.probe.is_empty(),
        "the new holder already carries the IP: no probe"
    );
    let moved = events(&out, reason::NODE_MOVED);
    assert_eq!(moved.len(), 1, "{moved:?}");
    assert_contains(
        &moved[0].message,
        &[&format!("moved from {holder} to {standby}"), "standby"],
        "NodeMoved",
    );
    // Stable: the next pass keeps it there.
    let out = world.plan(&mut planner);
    assert_eq!(node_of(&out, "web"), Some(&*standby));
}

/// Fast L2 failover, the holder back before its Lease ran out: a holder that yielded
/// nothing (back and adding the IP), one that defended a claim (its link may have lost
/// carrier), one that yielded to another MAC than the standby's, one that still holds it (a
/// LAN split between the two) and one whose standby is no longer eligible keep it.
#[test]
fn a_holder_keeps_the_ip_unless_it_yielded_to_an_eligible_standby() {
    /// Changes the world of `yielded_to_the_standby`, given the holder and the standby.
    type Change = fn(&mut World, &str, &str);
    let cases: [(&str, Change); 5] = [
        // The holder's agent has not added it yet and yielded nothing (back, adding it): it
        // could add it any moment, so the standby is not made the holder.
        ("yielded nothing", |world, holder, _| {
            world.no_conflicts(holder);
        }),
        // A claim the holder defended, its link then without carrier: the report leaves the
        // alias out of `held`, but it is still there; the holder stays.
        ("defended a claim", |world, holder, _| {
            world.no_conflicts(holder);
            world.lan_claim(holder, "10.0.0.1", "02:00:00:00:00:0b", "eth0");
        }),
        // Yielded to a claim from another MAC than the standby's: not the standby's
        // takeover, whatever the standby reports; the holder stays.
        ("yielded to another MAC", |world, holder, standby| {
            world.no_conflicts(holder);
            world.lan_yield(holder, "10.0.0.1", standby, "02:00:00:00:00:0c", "eth0");
        }),
        // Both hold it (a LAN split between holder and standby): the holder stays.
        ("both hold it", |world, holder, _| {
            world.holds(holder, "10.0.0.1");
            world.no_conflicts(holder);
        }),
        // The standby cordoned meanwhile: not elected, and nothing else either (the IP is
        // on the standby; another node would put it on the LAN twice).
        ("standby cordoned", |world, _, standby| {
            world.node_mut(standby).unschedulable = true;
        }),
    ];
    for (case, change) in cases {
        let (mut world, mut planner, holder, standby) = yielded_to_the_standby();
        change(&mut world, &holder, &standby);
        let out = world.plan(&mut planner);
        assert_eq!(node_of(&out, "web"), Some(&*holder), "{case}");
    }
}
