//! Table-style tests of the planner's pool rules beyond the classic format, one rule per
//! test: several pools per namespace chosen per Service, shared pools by list and by label
//! selector (a relabel gains or loses one), the tenant fence on pools and addresses,
//! draining entries and pools, `autoAssign: false`, a restart keeping all of it.

mod plan_support;

use aliaslb_core::plan::{Planner, reason};
use aliaslb_core::pool::PoolKey;
use aliaslb_core::range::Family;
use plan_support::*;

/// `team-a` has its own key and may draw from `pool.internal` (by list) and
/// `pool.public` (by the label `tier: web`, BGP); `team-b` from `pool.internal` only.
fn two_pools() -> World {
    let mut world = World::new(
        config(&[
            ("team-a", "10.0.1.1-10.0.1.2"),
            ("pool.internal", "10.0.2.1-10.0.2.3"),
            (
                "pool.public",
                "203.0.113.1-203.0.113.2\n2001:db8:1::1-2001:db8:1::2",
            ),
            (
                "config.yaml",
                "pools:\n  pool.public:\n    namespaceSelector: {tier: web}\n    announce: bgp\n  pool.internal:\n    namespaces: [team-a, team-b]\n",
            ),
        ]),
        Vec::new(),
    );
    world.namespaces.insert(
        "team-a".to_owned(),
        [("tier".to_owned(), "web".to_owned())].into(),
    );
    world
}

fn reason_of(out: &aliaslb_core::plan::PlanOutput, ns: &str, name: &str) -> &'static str {
    plan_of(out, ns, name).allocated.reason
}

#[test]
fn services_of_one_namespace_choose_their_pools() {
    let mut world = two_pools();
    world.services = vec![
        svc("team-a", "own").created(1),
        svc("team-a", "internal").created(2).pool("internal"),
        svc("team-a", "public").created(3).pool("pool.public"),
        svc("team-b", "default").created(4),
    ];
    let mut planner = Planner::new();
    let out = world.plan(&mut planner);
    assert_eq!(
        ips(&out, "team-a", "own"),
        ["10.0.1.1"],
        "its own key: the default"
    );
    assert_eq!(ips(&out, "team-a", "internal"), ["10.0.2.1"]);
    assert_eq!(ips(&out, "team-a", "public"), ["203.0.113.1"]);
    assert_eq!(
        ips(&out, "team-b", "default"),
        ["10.0.2.2"],
        "no key of its own: the first named pool that allows it"
    );
    // Each Service is announced the way its pool says: the public one over BGP.
    let public = plan_of(&out, "team-a", "public");
    assert!(public.node.is_none(), "L3 mode: no single holder");
    assert!(plan_of(&out, "team-a", "own").node.is_some(), "L2 mode");
    assert_eq!(
        plan_of(&out, "team-a", "internal").allocated.message,
        "assigned 10.0.2.1 from pool pool.internal"
    );
    assert_eq!(
        planner.pool_of_service(&key("team-a", "public")),
        Some(&PoolKey::Named("pool.public".into()))
    );
    // Dual-stack from a pool that has both families: the Service's ipFamilies choose.
    world.services.push(
        svc("team-a", "dual")
            .created(5)
            .pool("public")
            .families(&[Family::V6, Family::V4], true),
    );
    let out = world.plan(&mut planner);
    assert_eq!(
        ips(&out, "team-a", "dual"),
        ["2001:db8:1::1", "203.0.113.2"]
    );
}

#[test]
fn a_tenant_cannot_draw_from_a_pool_or_an_address_it_is_not_allowed() {
    let mut world = two_pools();
    world.services = vec![
        svc("team-b", "public").created(1).pool("public"),
        svc("team-b", "own-of-a").created(2).pool("team-a"),
        svc("team-b", "their-ip").created(3).requesting("10.0.1.2"),
        svc("team-b", "public-ip")
            .created(4)
            .requesting("203.0.113.2"),
        svc("team-b", "typo").created(5).pool("internl"),
    ];
    let mut planner = Planner::new();
    let out = world.plan(&mut planner);
    for name in ["public", "own-of-a", "their-ip", "public-ip", "typo"] {
        assert!(
            ips(&out, "team-b", name).is_empty(),
            "{name} got an address"
        );
    }
    assert_eq!(
        reason_of(&out, "team-b", "public"),
        reason::POOL_NOT_ALLOWED
    );
    assert_eq!(
        plan_of(&out, "team-b", "public").allocated.message,
        "namespace team-b may not draw new addresses from pool pool.public: its labels do not match the pool's namespaceSelector (addresses its Services hold there stay theirs); namespace team-b may draw from pool.internal"
    );
    world
        .services
        .push(svc("team-b", "vip").created(6).pool("vip"));
    world.config = config(&[
        ("pool.internal", "10.0.2.1-10.0.2.3"),
        ("pool.vip", "198.51.100.1"),
        (
            "config.yaml",
            "pools:\n  pool.internal:\n    namespaces: [team-b]\n  pool.vip:\n    namespaces: [team-c]\n",
        ),
    ]);
    let listed = world.plan(&mut Planner::new());
    assert_eq!(
        plan_of(&listed, "team-b", "vip").allocated.message,
        "namespace team-b may not draw from pool pool.vip; namespace team-b may draw from pool.internal"
    );
    world.config = two_pools().config;
    world.remove("team-b", "vip");
    // A namespace's own key is never named: it is no named pool.
    assert_eq!(reason_of(&out, "team-b", "own-of-a"), reason::UNKNOWN_POOL);
    assert_eq!(reason_of(&out, "team-b", "typo"), reason::UNKNOWN_POOL);
    assert!(
        plan_of(&out, "team-b", "typo")
            .allocated
            .message
            .starts_with("aliaslb.io/pool names `internl`, which is no pool"),
        "{}",
        plan_of(&out, "team-b", "typo").allocated.message
    );
    // Another tenant's address: not in its pools, as in the classic format; the message
    // names only its own pool.
    for name in ["their-ip", "public-ip"] {
        let plan = plan_of(&out, "team-b", name);
        assert_eq!(plan.allocated.reason, reason::REQUESTED_IP_NOT_IN_POOL);
        assert!(
            plan.allocated
                .message
                .contains("(pool.internal: 10.0.2.1-10.0.2.3)")
                && !plan.allocated.message.contains("team-a")
                && !plan.allocated.message.contains("public"),
            "{}",
            plan.allocated.message
        );
    }
    // A Warning Event each, once.
    assert_eq!(events(&out, reason::ALLOCATION_FAILED).len(), 5);
    assert!(world.plan(&mut planner).events.is_empty(), "said once");
    assert_eq!(
        planner
            .pending_on()
            .get(&PoolKey::Named("pool.public".into())),
        Some(&vec![key("team-b", "public")]),
        "waiting on the pool it named"
    );
}

#[test]
fn a_relabelled_namespace_gains_or_loses_a_shared_pool_and_keeps_what_it_has() {
    let mut world = two_pools();
    world.namespaces.clear();
    world.services = vec![
        svc("team-a", "web").created(1).pool("public"),
        svc("team-a", "api").created(2),
    ];
    let mut planner = Planner::new();
    let out = world.plan(&mut planner);
    assert_eq!(reason_of(&out, "team-a", "web"), reason::POOL_NOT_ALLOWED);
    assert_eq!(ips(&out, "team-a", "api"), ["10.0.1.1"]);

    // Labelled: it gains the pool; the waiting Service gets its address, the other keeps
    // its own (a new pool is no reason to move).
    world.namespaces.insert(
        "team-a".to_owned(),
        [("tier".to_owned(), "web".to_owned())].into(),
    );
    let out = world.plan(&mut planner);
    assert_eq!(ips(&out, "team-a", "web"), ["203.0.113.1"]);
    assert_eq!(ips(&out, "team-a", "api"), ["10.0.1.1"]);
    for s in &mut world.services {
        s.observed_ips = plan_of(&out, "team-a", &s.key.name).ips.clone();
    }

    // Label removed: what it holds stays (a label edit never renumbers), nothing new.
    world.namespaces.clear();
    world
        .services
        .push(svc("team-a", "web2").created(3).pool("public"));
    let out = world.plan(&mut planner);
    assert_eq!(ips(&out, "team-a", "web"), ["203.0.113.1"], "kept");
    assert!(plan_of(&out, "team-a", "web").allocated.status);
    assert!(events_for(&out, "team-a", "web", reason::CLEAR_ASSIGNMENT).is_empty());
    assert_eq!(reason_of(&out, "team-a", "web2"), reason::POOL_NOT_ALLOWED);
    assert!(
        plan_of(&out, "team-a", "web2")
            .allocated
            .message
            .starts_with("namespace team-a may not draw new addresses from pool pool.public: its labels do not match"),
        "{}",
        plan_of(&out, "team-a", "web2").allocated.message
    );
    // A restart (a new planner imports what the API shows) keeps it too.
    let mut restarted = Planner::new();
    let out = world.plan(&mut restarted);
    assert_eq!(
        ips(&out, "team-a", "web"),
        ["203.0.113.1"],
        "kept after a restart"
    );

    // An edit of the pool ConfigMap that takes the pool from the namespace is an
    // instruction, as removing a key always was.
    world.config = config(&[
        ("team-a", "10.0.1.1-10.0.1.2"),
        ("pool.public", "203.0.113.1-203.0.113.2"),
        (
            "config.yaml",
            "pools:\n  pool.public:\n    namespaces: [team-b]\n",
        ),
    ]);
    let out = world.plan(&mut planner);
    let cleared = events_for(&out, "team-a", "web", reason::CLEAR_ASSIGNMENT);
    assert_eq!(cleared.len(), 1, "{:?}", out.events);
    assert_eq!(
        cleared[0].message,
        "203.0.113.1 is no longer in a pool namespace team-a may draw from; assigning a new address"
    );
}

#[test]
fn a_pool_shared_by_list_serves_each_namespace_listed() {
    let mut world = World::new(
        config(&[
            ("pool.shared", "10.0.5.1-10.0.5.3"),
            (
                "config.yaml",
                "pools:\n  pool.shared:\n    namespaces: [a, b]\n",
            ),
        ]),
        vec![
            svc("a", "x").created(1),
            svc("b", "y").created(2),
            svc("c", "z").created(3),
        ],
    );
    let mut planner = Planner::new();
    let out = world.plan(&mut planner);
    assert_eq!(ips(&out, "a", "x"), ["10.0.5.1"]);
    assert_eq!(ips(&out, "b", "y"), ["10.0.5.2"]);
    assert_eq!(reason_of(&out, "c", "z"), reason::NO_POOL);
    assert_eq!(
        plan_of(&out, "c", "z").allocated.message,
        "namespace c has no pool and no _fallback pool is configured"
    );
    // Sharing stays within a namespace: the same key in two namespaces is two groups.
    world.services = vec![
        svc("a", "x").created(1).sharing("k").port(80, "TCP"),
        svc("b", "y").created(2).sharing("k").port(80, "TCP"),
    ];
    let out = world.plan(&mut planner);
    assert_ne!(ips(&out, "a", "x"), ips(&out, "b", "y"));
}

#[test]
fn draining_keeps_what_is_held_and_hands_out_nothing_anew() {
    let mut world = World::new(
        config(&[("team-a", "10.0.1.1-10.0.1.2\n10.0.9.1-10.0.9.2")]),
        vec![svc("team-a", "a").created(1), svc("team-a", "b").created(2)],
    );
    let mut planner = Planner::new();
    let out = world.plan(&mut planner);
    assert_eq!(ips(&out, "team-a", "a"), ["10.0.1.1"]);
    assert_eq!(ips(&out, "team-a", "b"), ["10.0.1.2"]);
    for s in &mut world.services {
        s.observed_ips = plan_of(&out, "team-a", &s.key.name).ips.clone();
    }
    // The old range drains: nothing moves, and the next Service gets the new range.
    world.config = config(&[("team-a", "10.0.1.1-10.0.1.2 draining\n10.0.9.1-10.0.9.2")]);
    world.services.push(svc("team-a", "c").created(3));
    world
        .services
        .push(svc("team-a", "asks-old").created(4).requesting("10.0.1.2"));
    let out = world.plan(&mut planner);
    assert_eq!(ips(&out, "team-a", "a"), ["10.0.1.1"], "kept");
    assert_eq!(ips(&out, "team-a", "b"), ["10.0.1.2"], "kept");
    assert!(events(&out, reason::CLEAR_ASSIGNMENT).is_empty());
    assert!(events(&out, reason::RELEASED).is_empty());
    assert_eq!(ips(&out, "team-a", "c"), ["10.0.9.1"]);
    // In use by b, and draining: refused for good.
    assert_eq!(reason_of(&out, "team-a", "asks-old"), reason::POOL_DRAINING);
    let usage = planner.usage();
    assert_eq!(
        (usage[0].total, usage[0].in_use, usage[0].draining),
        (4, 3, 2),
        "two draining left to move, one free"
    );
    // Released: a draining address is gone for good, a request for it refused.
    world.remove("team-a", "b");
    world.service_mut("team-a", "asks-old").requested = Ok(vec![ip("10.0.1.2")]);
    let out = world.plan(&mut Planner::with_hold(std::time::Duration::ZERO));
    assert_eq!(reason_of(&out, "team-a", "asks-old"), reason::POOL_DRAINING);
    assert_eq!(
        plan_of(&out, "team-a", "asks-old").allocated.message,
        "10.0.1.2 is draining in pool team-a: no Service gets it anew; request another address of the pool"
    );
    // Exhausted: the message counts what drains.
    let mut full = World::new(
        config(&[("team-a", "10.0.1.1 draining\n10.0.9.1")]),
        vec![
            svc("team-a", "old").observed("10.0.1.1", None).created(1),
            svc("team-a", "new").created(2),
            svc("team-a", "late").created(3),
        ],
    );
    let out = full.plan(&mut Planner::new());
    assert_eq!(
        ips(&out, "team-a", "old"),
        ["10.0.1.1"],
        "imported while draining"
    );
    assert_eq!(ips(&out, "team-a", "new"), ["10.0.9.1"]);
    assert_eq!(
        plan_of(&out, "team-a", "late").allocated.message,
        "all 2 addresses of pool team-a are in use; 1 of them are draining (left to move), none is handed out anew"
    );
    // Every entry draining: the pool says so.
    full.config = config(&[("team-a", "10.0.1.1 draining\n10.0.9.1 draining")]);
    full.remove("team-a", "new");
    let out = full.plan(&mut Planner::new());
    assert_eq!(reason_of(&out, "team-a", "late"), reason::NO_DEFAULT_POOL);
}

#[test]
fn a_draining_named_pool_is_no_default_but_keeps_its_services() {
    let world = World::new(
        config(&[
            ("pool.old", "10.0.1.1-10.0.1.4"),
            ("pool.new", "10.0.2.1-10.0.2.4"),
            (
                "config.yaml",
                "pools:\n  pool.old:\n    namespaces: [a]\n    draining: true\n  pool.new:\n    namespaces: [a]\n",
            ),
        ]),
        vec![
            svc("a", "held").observed("10.0.1.3", None).created(1),
            svc("a", "fresh").created(2),
            svc("a", "named").created(3).pool("old"),
        ],
    );
    let mut planner = Planner::new();
    let out = world.plan(&mut planner);
    assert_eq!(ips(&out, "a", "held"), ["10.0.1.3"]);
    assert_eq!(
        ips(&out, "a", "fresh"),
        ["10.0.2.1"],
        "the first pool that is open"
    );
    assert_eq!(reason_of(&out, "a", "named"), reason::POOL_DRAINING);
    assert_eq!(
        plan_of(&out, "a", "named").allocated.message,
        "pool pool.old is draining: no IPv4 address of it is handed out anew; name another pool with aliaslb.io/pool"
    );
    assert_eq!(planner.usage()[1].draining, 1, "pool.old: one left to move");
}

#[test]
fn manual_only_pools_serve_services_that_ask() {
    let mut world = World::new(
        config(&[
            ("pool.vip", "198.51.100.1-198.51.100.3"),
            (
                "config.yaml",
                "pools:\n  pool.vip:\n    namespaces: [a]\n    autoAssign: false\n",
            ),
        ]),
        vec![
            svc("a", "unasked").created(1),
            svc("a", "named").created(2).pool("vip"),
            svc("a", "requested").created(3).requesting("198.51.100.3"),
        ],
    );
    let out = world.plan(&mut Planner::new());
    assert_eq!(reason_of(&out, "a", "unasked"), reason::NO_DEFAULT_POOL);
    assert_eq!(
        plan_of(&out, "a", "unasked").allocated.message,
        "namespace a may draw from pool.vip, but none assigns addresses unasked (pool.vip: autoAssign: false): name one with aliaslb.io/pool, or request an address of one"
    );
    assert_eq!(ips(&out, "a", "named"), ["198.51.100.1"]);
    assert_eq!(ips(&out, "a", "requested"), ["198.51.100.3"]);
    // With a fallback, the unasked one gets that.
    world.config = config(&[
        ("pool.vip", "198.51.100.1-198.51.100.3"),
        ("_fallback", "10.9.0.1"),
        (
            "config.yaml",
            "pools:\n  pool.vip:\n    namespaces: [a]\n    autoAssign: false\n",
        ),
    ]);
    let out = world.plan(&mut Planner::new());
    assert_eq!(ips(&out, "a", "unasked"), ["10.9.0.1"]);
}

#[test]
fn naming_another_pool_moves_the_service_and_a_refused_name_keeps_its_address() {
    let mut world = two_pools();
    world.services = vec![svc("team-a", "web").created(1)];
    let mut planner = Planner::new();
    let out = world.plan(&mut planner);
    assert_eq!(ips(&out, "team-a", "web"), ["10.0.1.1"]);
    world.service_mut("team-a", "web").pool = Some("internal".to_owned());
    let out = world.plan(&mut planner);
    assert_eq!(ips(&out, "team-a", "web"), ["10.0.2.1"]);
    let released = events_for(&out, "team-a", "web", reason::RELEASED);
    assert_eq!(
        released[0].message,
        "released 10.0.1.1: moving to pool pool.internal"
    );
    // A name it may not use: it keeps what it has, and says why.
    world.namespaces.clear();
    world.service_mut("team-a", "web").pool = Some("public".to_owned());
    let out = world.plan(&mut planner);
    assert_eq!(ips(&out, "team-a", "web"), ["10.0.2.1"]);
    assert_eq!(reason_of(&out, "team-a", "web"), reason::POOL_NOT_ALLOWED);
    assert!(
        plan_of(&out, "team-a", "web")
            .allocated
            .message
            .ends_with("; keeping 10.0.2.1 for now"),
        "{}",
        plan_of(&out, "team-a", "web").allocated.message
    );
    // The name removed: it stays in the pool it holds.
    world.service_mut("team-a", "web").pool = None;
    let out = world.plan(&mut planner);
    assert_eq!(ips(&out, "team-a", "web"), ["10.0.2.1"]);
    assert!(plan_of(&out, "team-a", "web").allocated.status);
}

#[test]
fn one_pool_per_service_and_per_sharing_group() {
    let mut world = two_pools();
    world.services = vec![
        svc("team-a", "two")
            .created(1)
            .families(&[Family::V4, Family::V6], true)
            .requesting("10.0.1.1,2001:db8:1::1"),
        svc("team-a", "x")
            .created(2)
            .sharing("k")
            .port(80, "TCP")
            .pool("internal"),
        svc("team-a", "y").created(3).sharing("k").port(443, "TCP"),
        svc("team-a", "z")
            .created(4)
            .sharing("k")
            .port(8080, "TCP")
            .pool("public"),
    ];
    let out = world.plan(&mut Planner::new());
    assert_eq!(reason_of(&out, "team-a", "two"), reason::INVALID_REQUEST);
    assert_eq!(
        plan_of(&out, "team-a", "two").allocated.message,
        "requests 10.0.1.1 of pool team-a and 2001:db8:1::1 of pool pool.public: a Service's addresses come from one pool"
    );
    assert_eq!(ips(&out, "team-a", "x"), ["10.0.2.1"]);
    assert_eq!(ips(&out, "team-a", "y"), ["10.0.2.1"], "the group's pool");
    assert_eq!(reason_of(&out, "team-a", "z"), reason::SHARING_KEY_CONFLICT);
}
