//! Issue 42: what the controller believes of a node's word. A node's own word (its Node's
//! `status.addresses`, written by its kubelet; the subnets its agent reports) keeps an address
//! from being allocated and never takes it from a Service that holds it; only the LAN (a
//! foreign host answering a first claim's probe) or the operator (a pool edit, a Service
//! ClusterIP range) renumbers. One LAN host answering every probe pushes allocations a
//! bounded number of addresses, not through the pool. A holder the controller's own
//! assignment objects do not name at a leader change lets go before another node takes its
//! addresses.

mod plan_support;

use aliaslb_core::plan::{Planner, reason};
use plan_support::*;

/// The reason of the Warning and of IPAllocated when a node claims a held address.
const NODE_CLAIM: &str = "NodeClaim";

/// `a` holds the first address of `range` on node n1 (its agent reports it, the API shows
/// it).
fn held(range: &str) -> (World, Planner) {
    let mut world = World::new(
        config(&[("default", range)]),
        vec![svc("default", "a").created(1)],
    );
    world.nodes = vec![node("n1")];
    let mut planner = Planner::new();
    let out = world.plan(&mut planner);
    let first = range.split('-').next().unwrap();
    assert_eq!(ips(&out, "default", "a"), [first]);
    world.service_mut("default", "a").observed_ips = vec![ip(first)];
    world.holds("n1", first);
    world.plan(&mut planner);
    (world, planner)
}

/// The Warning and the condition of a Service keeping `held` that node `node` claims.
fn assert_kept(out: &aliaslb_core::plan::PlanOutput, name: &str, held: &str, node: &str) {
    assert_eq!(ips(out, "default", name), [held], "{:?}", out.events);
    assert!(
        events_for(out, "default", name, reason::CLEAR_ASSIGNMENT).is_empty(),
        "a node's word took {held} from {name}: {:?}",
        out.events
    );
    let warned = events_for(out, "default", name, NODE_CLAIM);
    assert_eq!(warned.len(), 1, "{:?}", out.events);
    assert!(warned[0].warning);
    let message = &warned[0].message;
    assert!(
        message.contains(held) && message.contains(node),
        "the Warning names the address and the node: {message}"
    );
    let allocated = &plan_of(out, "default", name).allocated;
    assert!(allocated.status, "{allocated:?}");
    assert_eq!(allocated.reason, NODE_CLAIM);
    assert!(
        allocated.message.contains(held) && allocated.message.contains(node),
        "{allocated:?}"
    );
}

#[test]
fn a_nodes_address_never_takes_an_address_from_its_service() {
    let (mut world, mut planner) = held("10.0.0.1-10.0.0.4");
    // n3's kubelet writes the held address into its Node's status.
    world.node_has("n3", "10.0.0.1");
    world.services.push(svc("default", "b").created(2));
    let out = world.plan(&mut planner);
    assert_kept(&out, "a", "10.0.0.1", "n3");
    assert!(
        out.events
            .iter()
            .find(|e| e.reason == NODE_CLAIM)
            .is_some_and(|e| e.message.contains("InternalIP")),
        "the Warning says what n3 claimed: {:?}",
        out.events
    );
    assert_eq!(
        ips(&out, "default", "b"),
        ["10.0.0.2"],
        "not on a's address"
    );
    // Said once, on the edge.
    let again = world.plan(&mut planner);
    assert!(events(&again, NODE_CLAIM).is_empty(), "{:?}", again.events);
    assert_eq!(ips(&again, "default", "a"), ["10.0.0.1"]);
    assert_eq!(plan_of(&again, "default", "a").allocated.reason, NODE_CLAIM);
    // Once a lets go of it, it is not allocated while the Node lists it.
    world.remove("default", "a");
    world.holds("n1", "");
    world.plan(&mut planner);
    world.advance(aliaslb_core::plan::STICKY_FOR * 2);
    world.services.push(svc("default", "c").created(3));
    world.services.push(svc("default", "d").created(4));
    world.services.push(svc("default", "e").created(5));
    let out = world.plan(&mut planner);
    let got: Vec<Vec<String>> = ["c", "d", "e"]
        .iter()
        .map(|n| ips(&out, "default", n))
        .collect();
    assert_eq!(
        got,
        [vec!["10.0.0.3"], vec!["10.0.0.4"], vec![]],
        "10.0.0.1 stays withheld"
    );
}

#[test]
fn a_reported_subnet_edge_never_takes_an_address_from_its_service() {
    let (mut world, mut planner) = held("10.0.0.3-10.0.0.6");
    // n2 reports an interface on 10.0.0.0/30, whose broadcast address a holds; its Node
    // lists an address in it (an anchored subnet, the strongest a node's word gets). n1 is
    // on the /24 around it, so the election keeps a there.
    world.node_mut("n1").subnets = vec!["10.0.0.0/24".parse().unwrap()];
    let mut n2 = node("n2");
    n2.subnets = vec!["10.0.0.0/30".parse().unwrap()];
    world.nodes.push(n2);
    world.node_has("n2", "10.0.0.2");
    let out = world.plan(&mut planner);
    assert_kept(&out, "a", "10.0.0.3", "n2");
    assert!(
        events(&out, NODE_CLAIM)[0]
            .message
            .contains("broadcast address of subnet 10.0.0.0/30"),
        "{:?}",
        out.events
    );
    // Not allocated to anyone else meanwhile, nor once a is gone.
    world.remove("default", "a");
    world.holds("n1", "");
    world.advance(aliaslb_core::plan::STICKY_FOR * 2);
    for (i, name) in ["b", "c", "d", "e"].iter().enumerate() {
        world
            .services
            .push(svc("default", name).created(2 + i as i64));
    }
    let out = world.plan(&mut planner);
    let mut got: Vec<String> = ["b", "c", "d", "e"]
        .iter()
        .flat_map(|n| ips(&out, "default", n))
        .collect();
    got.sort();
    assert_eq!(got, ["10.0.0.4", "10.0.0.5", "10.0.0.6"]);
}

#[test]
fn an_address_a_node_claims_is_kept_across_a_leader_change() {
    let mut world = World::new(
        config(&[("default", "10.0.0.1-10.0.0.4")]),
        vec![
            svc("default", "a")
                .created(1)
                .observed("10.0.0.1", Some("n1")),
        ],
    );
    world.nodes = vec![node("n1")];
    world.holds("n1", "10.0.0.1");
    world.node_has("n3", "10.0.0.1");
    // A new leader's first pass imports what the API shows.
    let out = world.plan(&mut Planner::new());
    assert_kept(&out, "a", "10.0.0.1", "n3");
    assert_eq!(
        plan_of(&out, "default", "a").node.as_deref(),
        Some("n1"),
        "and stays on its node"
    );
}

/// A reported subnet's network and broadcast addresses count only from a fresh agent, and
/// only when the subnet holds one of that node's own Node addresses or at least two fresh
/// agents report it.
#[test]
fn subnet_edges_count_only_when_anchored_and_fresh() {
    // (what, nodes as (name, fresh, subnet, Node address), whether 10.0.0.0 and 10.0.0.7 stay out)
    type Case = (
        &'static str,
        &'static [(&'static str, bool, &'static str, Option<&'static str>)],
        bool,
    );
    let table: &[Case] = &[
        (
            "one node, no address of its own in it",
            &[("n1", true, "10.0.0.0/29", None)],
            false,
        ),
        (
            "one node, its Node address outside it",
            &[("n1", true, "10.0.0.0/29", Some("10.0.0.9"))],
            false,
        ),
        (
            "one node, its Node address in it",
            &[("n1", true, "10.0.0.0/29", Some("10.0.0.5"))],
            true,
        ),
        (
            "anchored, but the agent is stale",
            &[("n1", false, "10.0.0.0/29", Some("10.0.0.5"))],
            false,
        ),
        (
            "two fresh nodes report it",
            &[
                ("n1", true, "10.0.0.0/29", None),
                ("n2", true, "10.0.0.0/29", None),
            ],
            true,
        ),
        (
            "two nodes report it, one stale",
            &[
                ("n1", true, "10.0.0.0/29", None),
                ("n2", false, "10.0.0.0/29", None),
            ],
            false,
        ),
    ];
    for (what, nodes, withheld) in table {
        // The pool lists the edges of the /29 but not the Node address 10.0.0.5.
        let mut world = World::new(
            config(&[("default", "10.0.0.0-10.0.0.1\n10.0.0.7")]),
            vec![
                svc("default", "a").created(1),
                svc("default", "b").created(2),
                svc("default", "c").created(3),
            ],
        );
        world.nodes.clear();
        for (name, fresh, subnet, address) in *nodes {
            let mut state = node(name);
            state.agent_ready = *fresh;
            state.subnets = vec![subnet.parse().unwrap()];
            world.nodes.push(state);
            if let Some(address) = address {
                world.node_has(name, address);
            }
        }
        let out = world.plan(&mut Planner::new());
        let mut got: Vec<String> = ["a", "b", "c"]
            .iter()
            .flat_map(|n| ips(&out, "default", n))
            .collect();
        got.sort();
        let want: &[&str] = if *withheld {
            &["10.0.0.1"]
        } else {
            &["10.0.0.0", "10.0.0.1", "10.0.0.7"]
        };
        assert_eq!(got, want, "{what}");
    }
}

/// Issue 42 item 5: a leader's first pass with no trusted node for a Service (its node's
/// assignment object is missing or unreadable, so the import has no `observed_node`) while
/// an agent reports holding its address: that agent's word is evidence about itself (it
/// holds the address), not a title to it. No other node is given the address while it
/// still holds it (no double holder); once it lets go, a node is elected.
#[test]
fn an_untrusted_holder_at_import_lets_go_before_another_node_takes_it() {
    let services: Vec<_> = (1..=4)
        .map(|i| {
            svc("default", &format!("s{i}"))
                .created(i)
                .observed(&format!("10.0.0.{i}"), None)
        })
        .collect();
    let mut world = World::new(config(&[("default", "10.0.0.1-10.0.0.8")]), services);
    world.nodes = vec![node("n1"), node("n2")];
    // n1 held them all under the last leader; at a new leader's start it is unconfirmed.
    for n in &mut world.nodes {
        n.agent_ready = false;
        n.agent_unconfirmed = true;
    }
    world.holds("n1", "10.0.0.1,10.0.0.2,10.0.0.3,10.0.0.4");
    world.holds("n2", "");
    let mut planner = Planner::new();
    let out = world.plan(&mut planner);
    // Both seen renewing: n2 is as eligible as n1, and the election spreads the load.
    for n in &mut world.nodes {
        n.agent_ready = true;
        n.agent_unconfirmed = false;
    }
    let mut outs = vec![out, world.plan(&mut planner)];
    for out in &outs {
        for i in 1..=4 {
            let plan = plan_of(out, "default", &format!("s{i}"));
            assert_eq!(
                ips(out, "default", &format!("s{i}")),
                [format!("10.0.0.{i}")]
            );
            assert!(
                plan.node.as_deref() != Some("n2"),
                "s{i} given to n2 while n1 still holds 10.0.0.{i}: {:?}",
                out.events
            );
        }
    }
    // n1 lets go (its assignment, written again, no longer lists them): elected anew.
    world.holds("n1", "");
    outs.push(world.plan(&mut planner));
    let last = outs.last().unwrap();
    let placed: Vec<Option<&str>> = (1..=4)
        .map(|i| plan_of(last, "default", &format!("s{i}")).node.as_deref())
        .collect();
    assert!(placed.iter().all(Option::is_some), "{placed:?}");
    assert!(placed.contains(&Some("n2")), "spread again: {placed:?}");
}
