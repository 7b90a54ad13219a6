//! L3 mode (`announce: bgp`) in the planner: every eligible node announces (capped by
//! `maxNodes`), `externalTrafficPolicy: Local` follows the endpoints, nothing is probed or
//! moved break-before-make, and the Announced condition says which nodes really export
//! the addresses, reading the agents' routing reports.

mod plan_support;

use std::collections::BTreeSet;

use aliaslb_core::plan::{Planner, reason};
use aliaslb_core::report::RoutingReport;
use plan_support::*;

const BGP: (&str, &str) = ("config.yaml", "pools:\n  shop:\n    announce: bgp\n");

fn bgp_world(nodes: &[&str]) -> World {
    let mut world = World::new(
        config(&[("shop", "10.200.0.1-10.200.0.3"), BGP]),
        vec![
            svc("shop", "front").created(1),
            svc("shop", "back").created(2),
        ],
    );
    world.nodes = nodes.iter().map(|n| node(n)).collect();
    world
}

/// The agent on `node` holds `ips` and its daemon exports them to `established` peers.
fn announcing(world: &mut World, node: &str, ips: &str, established: u32) {
    world.holds(node, ips);
    let report = world.report_mut(node);
    report.routing = Some(RoutingReport {
        daemon: "bird".into(),
        error: None,
        sessions: 1,
        established,
        exported: report.held.clone(),
    });
}

#[test]
fn every_eligible_node_announces_and_nothing_is_probed() {
    let mut world = bgp_world(&["a", "b", "c"]);
    world.node_mut("c").unschedulable = true;
    let mut planner = Planner::new();
    let out = world.plan(&mut planner);
    let front = plan_of(&out, "shop", "front");
    assert_eq!(ips(&out, "shop", "front"), ["10.200.0.1"]);
    assert_eq!(
        names(&front.nodes),
        ["a", "b"],
        "the cordoned node does not announce"
    );
    assert_eq!(front.node, None, "no single holder in L3 mode");
    assert!(
        out.probe.is_empty(),
        "routed addresses are on no LAN: no probe"
    );
    assert!(!front.announced.status);
    assert_eq!(front.announced.reason, reason::WAITING_FOR_AGENT);
    let assigned = events_for(&out, "shop", "front", reason::NODE_ASSIGNED);
    assert_eq!(assigned.len(), 1, "{:?}", out.events);
    assert!(
        assigned[0].message.contains("announcing nodes: a, b"),
        "{}",
        assigned[0].message
    );

    // Uncordoned: the node joins without anyone leaving (no break-before-make).
    world.node_mut("c").unschedulable = false;
    let out = world.plan(&mut planner);
    assert_eq!(
        names(&plan_of(&out, "shop", "front").nodes),
        ["a", "b", "c"]
    );
    assert_eq!(names(&plan_of(&out, "shop", "back").nodes), ["a", "b", "c"]);
    // Cordoned again: its path is withdrawn at once, the others stay.
    world.node_mut("b").unschedulable = true;
    let out = world.plan(&mut planner);
    assert_eq!(names(&plan_of(&out, "shop", "front").nodes), ["a", "c"]);
    let moved = events_for(&out, "shop", "front", reason::NODE_ASSIGNED);
    assert!(
        moved[0]
            .message
            .contains("withdrawn from b (b is cordoned)"),
        "{}",
        moved[0].message
    );
    // The same inputs again: no Event.
    let again = world.plan(&mut planner);
    assert!(again.events.is_empty(), "{:?}", again.events);
}

#[test]
fn max_nodes_caps_the_announcers_and_keeps_the_current_ones() {
    let mut world = bgp_world(&["a", "b", "c", "d", "e"]);
    world.config = config(&[
        ("shop", "10.200.0.0/24"),
        (
            "config.yaml",
            "pools:\n  shop:\n    announce: bgp\n    maxNodes: 2\n",
        ),
    ]);
    world.services = (0..40)
        .map(|i| svc("shop", &format!("s{i}")).created(i))
        .collect();
    let mut planner = Planner::new();
    let out = world.plan(&mut planner);
    let mut used = BTreeSet::new();
    for plan in out.services.values() {
        assert_eq!(plan.nodes.len(), 2, "{plan:?}");
        used.extend(plan.nodes.iter().cloned());
    }
    assert_eq!(used.len(), 5, "addresses spread over every node: {used:?}");
    // A node leaves: only the addresses it announced get a replacement; the others keep
    // both their nodes.
    let before = out.services.clone();
    world.node_mut("a").agent_ready = false;
    let out = world.plan(&mut planner);
    for (key, plan) in &out.services {
        let old = &before[key].nodes;
        assert!(!names(&plan.nodes).contains(&"a"));
        assert_eq!(plan.nodes.len(), 2);
        if !names(old).contains(&"a") {
            assert_eq!(&plan.nodes, old, "{key}: unchanged");
        } else {
            let kept: Vec<_> = old.iter().filter(|n| &***n != "a").collect();
            assert!(plan.nodes.contains(kept[0]), "{key}: the survivor stays");
        }
    }
    // Back: it does not push anyone out (no churn).
    world.node_mut("a").agent_ready = true;
    let again = world.plan(&mut planner);
    for (key, plan) in &again.services {
        assert_eq!(plan.nodes, out.services[key].nodes, "{key}");
    }
}

#[test]
fn local_traffic_announces_only_from_nodes_with_an_endpoint() {
    let mut world = bgp_world(&["a", "b", "c"]);
    world.services[0].local_traffic = true;
    world
        .local
        .insert(key("shop", "front"), ["b".to_owned()].into());
    let mut planner = Planner::new();
    let out = world.plan(&mut planner);
    assert_eq!(names(&plan_of(&out, "shop", "front").nodes), ["b"]);
    assert_eq!(names(&plan_of(&out, "shop", "back").nodes), ["a", "b", "c"]);
    // The endpoint moves: so does the announcement.
    world.local.insert(
        key("shop", "front"),
        ["a".to_owned(), "c".to_owned()].into(),
    );
    let out = world.plan(&mut planner);
    assert_eq!(names(&plan_of(&out, "shop", "front").nodes), ["a", "c"]);
    // No endpoint left: not announced anywhere, and the condition says why.
    world.local.insert(key("shop", "front"), BTreeSet::new());
    let out = world.plan(&mut planner);
    let front = plan_of(&out, "shop", "front");
    assert!(front.nodes.is_empty());
    assert_eq!(front.announced.reason, reason::NO_ELIGIBLE_NODE);
    assert!(
        front
            .announced
            .message
            .contains("3 without a ready local endpoint")
            || front.announced.message.contains("local endpoint"),
        "{}",
        front.announced.message
    );
    assert_eq!(
        events_for(&out, "shop", "front", reason::NODE_MOVED).len(),
        2,
        "one withdrawal Event per node: {:?}",
        out.events
    );
}

#[test]
fn announced_says_which_nodes_export_and_why_the_others_do_not() {
    let mut world = bgp_world(&["a", "b", "c"]);
    let mut planner = Planner::new();
    world.plan(&mut planner);
    announcing(&mut world, "a", "10.200.0.1,10.200.0.2", 1);
    announcing(&mut world, "b", "10.200.0.1,10.200.0.2", 2);
    announcing(&mut world, "c", "10.200.0.1,10.200.0.2", 1);
    let out = world.plan(&mut planner);
    let front = &plan_of(&out, "shop", "front").announced;
    assert!(front.status, "{front:?}");
    assert_eq!(front.reason, reason::ANNOUNCED);
    assert_eq!(
        front.message,
        "announced over BGP by 3 nodes (a, b, c) to 4 peers"
    );

    // c's daemon is stopped, b's sessions are down, a filters one address.
    world.report_mut("c").routing.as_mut().unwrap().error =
        Some("cannot reach BIRD's control socket /run/bird/bird.ctl".into());
    world.report_mut("b").routing.as_mut().unwrap().established = 0;
    let out = world.plan(&mut planner);
    let front = &plan_of(&out, "shop", "front").announced;
    assert!(front.status, "a still carries the traffic: {front:?}");
    assert_eq!(front.reason, reason::PARTIALLY_ANNOUNCED);
    assert!(
        front
            .message
            .starts_with("announced over BGP by 1 of 3 nodes (a) to 1 peer;")
    );
    assert!(
        front
            .message
            .contains("b: bird has no Established BGP session (1 configured)"),
        "{}",
        front.message
    );
    assert!(
        front
            .message
            .contains("c: bird cannot be read: cannot reach BIRD's control socket"),
        "{}",
        front.message
    );
    world
        .report_mut("a")
        .routing
        .as_mut()
        .unwrap()
        .exported
        .remove(&ip("10.200.0.1"));
    let out = world.plan(&mut planner);
    let front = &plan_of(&out, "shop", "front").announced;
    assert!(!front.status);
    assert_eq!(front.reason, reason::NOT_ANNOUNCED);
    assert!(
        front.message.contains("a: bird does not export 10.200.0.1"),
        "{}",
        front.message
    );
    let back = &plan_of(&out, "shop", "back").announced;
    assert_eq!(back.reason, reason::PARTIALLY_ANNOUNCED, "{back:?}");

    // An agent told to read no daemon cannot confirm anything.
    world.report_mut("a").routing = None;
    let out = world.plan(&mut planner);
    let back = &plan_of(&out, "shop", "back").announced;
    assert_eq!(back.reason, reason::NOT_ANNOUNCED);
    assert!(
        back.message.contains("--routing-daemon=none"),
        "{}",
        back.message
    );
}

#[test]
fn blind_controller_keeps_the_announcers() {
    let mut world = bgp_world(&["a", "b"]);
    let mut planner = Planner::new();
    world.plan(&mut planner);
    for n in &mut world.nodes {
        n.agent_ready = false;
        n.agent_unconfirmed = true;
    }
    world.agents_unobservable = true;
    let out = world.plan(&mut planner);
    assert_eq!(names(&plan_of(&out, "shop", "front").nodes), ["a", "b"]);
    // Unconfirmed (a new leader's first lease duration): the announcers stay too.
    world.agents_unobservable = false;
    let out = world.plan(&mut planner);
    assert_eq!(names(&plan_of(&out, "shop", "front").nodes), ["a", "b"]);
}

#[test]
fn a_pool_switched_to_l2_elects_one_node_and_back() {
    let mut world = bgp_world(&["a", "b"]);
    let mut planner = Planner::new();
    let out = world.plan(&mut planner);
    assert_eq!(plan_of(&out, "shop", "front").nodes.len(), 2);
    world.config = config(&[("shop", "10.200.0.1-10.200.0.3")]);
    let out = world.plan(&mut planner);
    let front = plan_of(&out, "shop", "front");
    assert!(front.nodes.is_empty());
    assert!(front.node.is_some());
    assert_eq!(
        ips(&out, "shop", "front"),
        ["10.200.0.1"],
        "the address stays"
    );
    world.config = config(&[("shop", "10.200.0.1-10.200.0.3"), BGP]);
    let out = world.plan(&mut planner);
    let front = plan_of(&out, "shop", "front");
    assert_eq!((front.node.as_deref(), front.nodes.len()), (None, 2));
}

#[test]
fn an_ipv6_and_a_dual_stack_service_are_announced_from_every_node() {
    use aliaslb_core::range::Family;
    let mut world = bgp_world(&["a", "b"]);
    world.config = config(&[
        ("shop", "10.200.0.1\nfd00:200::/64"),
        ("config.yaml", "pools:\n  shop:\n    announce: bgp\n"),
    ]);
    world.services = vec![
        svc("shop", "v6").created(1).families(&[Family::V6], true),
        svc("shop", "dual")
            .created(2)
            .families(&[Family::V4, Family::V6], true),
    ];
    let mut planner = Planner::new();
    let out = world.plan(&mut planner);
    assert_eq!(ips(&out, "shop", "v6"), ["fd00:200::1"]);
    assert_eq!(ips(&out, "shop", "dual"), ["10.200.0.1", "fd00:200::2"]);
    for name in ["v6", "dual"] {
        assert_eq!(
            names(&plan_of(&out, "shop", name).nodes),
            ["a", "b"],
            "{name}"
        );
    }
    // Announced only once every family is exported by a node.
    announcing(&mut world, "a", "10.200.0.1,fd00:200::1,fd00:200::2", 2);
    announcing(&mut world, "b", "10.200.0.1,fd00:200::1", 2);
    let out = world.plan(&mut planner);
    assert_eq!(
        plan_of(&out, "shop", "v6").announced.reason,
        reason::ANNOUNCED
    );
    let dual = &plan_of(&out, "shop", "dual").announced;
    assert_eq!(dual.reason, reason::PARTIALLY_ANNOUNCED, "{dual:?}");
    assert!(
        dual.message
            .contains("b: waiting for its agent to add fd00:200::2"),
        "{}",
        dual.message
    );
}

/// Issue 20 item 4: a routed address a deleted Service leaves is not given to another
/// Service while an agent that reported it may still announce it: its node cut off from
/// the API is lost for election, but its agent withdraws routed addresses only once its
/// own Lease has been stale for a lease duration (`agent_announcing`). Once that has
/// passed, it is given. An L2 address of such an agent is not held back: its kernel
/// lifetime has ended it.
#[test]
fn a_routed_address_waits_for_every_agent_that_may_still_announce_it() {
    let l2 = ("l2", "10.0.9.1");
    let mut world = World::new(
        config(&[("shop", "10.200.0.1"), l2, BGP]),
        vec![svc("shop", "front").created(1), svc("l2", "old").created(1)],
    );
    world.nodes = vec![node("a"), node("b")];
    let mut planner = Planner::with_hold(std::time::Duration::ZERO);
    let out = world.plan(&mut planner);
    assert_eq!(ips(&out, "shop", "front"), ["10.200.0.1"]);
    assert_eq!(ips(&out, "l2", "old"), ["10.0.9.1"]);
    // a held both; it is cut off from the API: lost, announcing still. b let go.
    announcing(&mut world, "a", "10.200.0.1,10.0.9.1", 1);
    world.holds("b", "");
    world.plan(&mut planner);
    let a = world.node_mut("a");
    a.agent_ready = false;
    a.agent_announcing = true;
    world.remove("shop", "front");
    world.remove("l2", "old");
    world
        .services
        .push(svc("shop", "new").created(2).requesting("10.200.0.1"));
    world
        .services
        .push(svc("l2", "new").created(2).requesting("10.0.9.1"));
    let out = world.plan(&mut planner);
    assert_eq!(
        ips(&out, "shop", "new"),
        Vec::<String>::new(),
        "given while node a may still announce it"
    );
    assert_eq!(
        ips(&out, "l2", "new"),
        ["10.0.9.1"],
        "an L2 address is not held"
    );
    // a's L3 cut-off has passed: the address is given.
    world.node_mut("a").agent_announcing = false;
    let out = world.plan(&mut planner);
    assert_eq!(ips(&out, "shop", "new"), ["10.200.0.1"]);
}
