//! Table-style tests of what LAN conflicts withhold and of first claims (`probe`): an address a
//! fresh agent reports answered on the LAN by a foreign MAC is withheld like a Node's
//! address; the first claim of an address no node held is marked for probing, a takeover
//! never is; a claim against the holder of an established Service's address never moves
//! it (it is defended: Announced `AddressDefended`, a Warning naming the MAC) unless its
//! pool says `onConflict: renumber`.

mod plan_support;

use std::collections::BTreeMap;

use aliaslb_core::plan::{LAN_HOST_BOUND, LanConflict, Planner, reason};
use aliaslb_core::pool::PoolKey;
use aliaslb_core::range::Family;
use plan_support::*;

const DEFAULT_3: (&str, &str) = ("default", "10.0.0.1\n10.0.0.2\n10.0.0.3");
const FOREIGN: &str = "46:b0:48:e8:2d:96";

/// `web` planned alone on a 3-address pool; returns the world, planner and its node.
fn placed(pool: (&str, &str)) -> (World, Planner, String) {
    let world = World::new(config(&[pool]), vec![svc("default", "web").created(1)]);
    let mut planner = Planner::new();
    let out = world.plan(&mut planner);
    assert_eq!(ips(&out, "default", "web"), ["10.0.0.1"]);
    let node = plan_of(&out, "default", "web")
        .node
        .as_deref()
        .expect("a node")
        .to_owned();
    (world, planner, node)
}

fn other(node: &str) -> &'static str {
    if node == "a" { "b" } else { "a" }
}

fn usage(planner: &Planner) -> (u128, u128) {
    let usage: BTreeMap<_, _> = planner
        .usage()
        .into_iter()
        .map(|u| ((u.pool, u.family), (u.total, u.in_use)))
        .collect();
    usage[&(PoolKey::Namespace("default".into()), Family::V4)]
}

#[test]
fn a_lan_conflict_moves_the_service_off_the_address_naming_the_mac() {
    let (mut world, mut planner, n) = placed(DEFAULT_3);
    world.service_mut("default", "web").observed_ips = vec![ip("10.0.0.1")];
    world.lan_conflict(&n, "10.0.0.1", FOREIGN, "eth1");
    let out = world.plan(&mut planner);
    assert_eq!(
        ips(&out, "default", "web"),
        ["10.0.0.2"],
        "another free address"
    );
    let warned = events_for(&out, "default", "web", reason::ADDRESS_CONFLICT);
    assert_eq!(warned.len(), 1, "{:?}", out.events);
    assert!(warned[0].warning);
    assert_eq!(
        warned[0].message,
        format!(
            "10.0.0.1 is answered on the LAN by {FOREIGN} (seen by {n} on eth1), not a node of \
             this cluster: released; assigning a new address"
        )
    );
    assert_eq!(
        events_for(&out, "default", "web", reason::IP_ALLOCATED).len(),
        1
    );
    let web = plan_of(&out, "default", "web");
    assert!(web.allocated.status);
    assert!(web.node.is_some(), "placed again in the same pass");
    assert!(
        out.probe.contains(&ip("10.0.0.2")),
        "a new address is a first claim: {:?}",
        out.probe
    );
    let withheld: Vec<(std::net::IpAddr, LanConflict)> = planner
        .lan_conflicts()
        .map(|(ip, c)| (ip, c.clone()))
        .collect();
    assert_eq!(withheld.len(), 1);
    assert_eq!(withheld[0].0, ip("10.0.0.1"));
    assert_eq!(withheld[0].1.node, n);
    assert_eq!(withheld[0].1.mac.to_string(), FOREIGN);
    assert_eq!(
        usage(&planner),
        (2, 1),
        "the withheld address counts neither in the pool nor in use"
    );

    // Once, on the edge.
    world.service_mut("default", "web").observed_ips = vec![ip("10.0.0.2")];
    let again = world.plan(&mut planner);
    assert_eq!(ips(&again, "default", "web"), ["10.0.0.2"]);
    assert!(
        events(&again, reason::ADDRESS_CONFLICT).is_empty()
            && events(&again, reason::IP_ALLOCATED).is_empty(),
        "{:?}",
        again.events
    );

    // A newcomer does not get the withheld address either, while the conflict is reported.
    world.services.push(svc("default", "new").created(2));
    let out = world.plan(&mut planner);
    assert_eq!(ips(&out, "default", "new"), ["10.0.0.3"]);
}

#[test]
fn without_another_address_the_service_waits_with_address_conflict_until_it_lifts() {
    let (mut world, mut planner, n) = placed(("default", "10.0.0.1"));
    world.lan_conflict(&n, "10.0.0.1", FOREIGN, "eth1");
    let out = world.plan(&mut planner);
    let web = plan_of(&out, "default", "web");
    assert!(web.ips.is_empty(), "{:?}", web.ips);
    assert!(web.node.is_none());
    assert!(!web.allocated.status);
    assert_eq!(
        web.allocated.reason,
        reason::ADDRESS_CONFLICT,
        "not PoolExhausted"
    );
    assert_eq!(
        web.allocated.message,
        format!(
            "all 1 addresses of pool default are in use; 1 of them is answered on the LAN by a \
             host outside the cluster, not allocated while an agent reports it (10.0.0.1 is \
             answered on the LAN by {FOREIGN} (seen by {n} on eth1))"
        )
    );
    assert_eq!(
        events_for(&out, "default", "web", reason::ADDRESS_CONFLICT).len(),
        1
    );
    let failed = events_for(&out, "default", "web", reason::ALLOCATION_FAILED);
    assert_eq!(failed.len(), 1);
    assert!(failed[0].message.contains(FOREIGN), "{}", failed[0].message);
    assert_eq!(planner.pending(), 1);
    assert!(out.probe.is_empty());

    // Still reported: still pending, nothing said again.
    let out = world.plan(&mut planner);
    assert!(ips(&out, "default", "web").is_empty());
    assert!(out.events.is_empty(), "{:?}", out.events);

    // The agent drops the conflict (nobody answers its probes any more): free again.
    world.no_conflicts(&n);
    let out = world.plan(&mut planner);
    assert_eq!(
        ips(&out, "default", "web"),
        ["10.0.0.1"],
        "allocatable again"
    );
    assert!(plan_of(&out, "default", "web").allocated.status);
    assert_eq!(planner.pending(), 0);
    assert_eq!(planner.lan_conflicts().count(), 0);
    assert_eq!(usage(&planner), (1, 1));
    assert!(out.probe.contains(&ip("10.0.0.1")), "probed again first");
}

#[test]
fn requested_and_sticky_addresses_are_blocked_by_a_conflict() {
    let mut world = World::new(
        config(&[DEFAULT_3]),
        vec![
            svc("default", "a").created(1),
            svc("default", "b").created(2),
        ],
    );
    let mut planner = Planner::new();
    world.plan(&mut planner);
    world.remove("default", "b");
    world.plan(&mut planner);
    // 10.0.0.2 (b's, remembered for sticky re-creation) is answered on the LAN.
    world.lan_conflict("a", "10.0.0.2", FOREIGN, "eth1");
    world
        .services
        .push(svc("default", "b").created(10).uid("b-2"));
    world
        .services
        .push(svc("default", "asks").created(11).requesting("10.0.0.2"));
    let out = world.plan(&mut planner);
    assert_eq!(
        ips(&out, "default", "b"),
        ["10.0.0.3"],
        "not the sticky one"
    );
    let asks = plan_of(&out, "default", "asks");
    assert!(asks.ips.is_empty());
    assert_eq!(asks.allocated.reason, reason::ADDRESS_CONFLICT);
    assert_eq!(
        asks.allocated.message,
        format!(
            "10.0.0.2 is answered on the LAN by {FOREIGN} (seen by a on eth1), not a node of \
             this cluster; request another address of the pool"
        )
    );
    world.no_conflicts("a");
    let out = world.plan(&mut planner);
    assert_eq!(ips(&out, "default", "asks"), ["10.0.0.2"]);
}

#[test]
fn a_conflict_over_an_address_an_agent_holds_or_with_a_node_mac_is_not_a_fence() {
    // Two nodes claim the address: the assignment is kept, for people to see.
    let (mut world, mut planner, n) = placed(DEFAULT_3);
    world.holds(other(&n), "10.0.0.1");
    world.lan_conflict(&n, "10.0.0.1", "02:00:00:00:00:0b", "eth1");
    let out = world.plan(&mut planner);
    let web = plan_of(&out, "default", "web");
    assert_eq!(web.ips, [ip("10.0.0.1")]);
    assert_eq!(web.node.as_deref(), Some(n.as_str()));
    assert_eq!(web.announced.reason, reason::ADDRESS_CONFLICT);
    assert!(
        web.announced.message.contains(&n),
        "{}",
        web.announced.message
    );
    assert_eq!(planner.lan_conflicts().count(), 0);
    assert!(events(&out, reason::CLEAR_ASSIGNMENT).is_empty());

    // The MAC is another node's, though it reports holding nothing: not foreign.
    world.holds(other(&n), "");
    world.mac(other(&n), "eth1", "02:00:00:00:00:0b");
    let out = world.plan(&mut planner);
    assert_eq!(ips(&out, "default", "web"), ["10.0.0.1"]);
    assert_eq!(planner.lan_conflicts().count(), 0);

    // No MAC: configured on the node by another owner, today's rule (kept, reported).
    world.no_conflicts(&n);
    world.conflict(&n, "10.0.0.1", "already on eth0 (owner: dhcpcd)");
    let out = world.plan(&mut planner);
    let web = plan_of(&out, "default", "web");
    assert_eq!(web.ips, [ip("10.0.0.1")]);
    assert_eq!(web.announced.reason, reason::ADDRESS_CONFLICT);
    assert_eq!(planner.lan_conflicts().count(), 0);
}

#[test]
fn a_stale_holder_does_not_keep_a_foreign_owners_address_allocatable() {
    // A node that died still lists the address in its last Lease: its alias has expired
    // with its lifetime, so only the foreign host can be answering.
    let (mut world, mut planner, n) = placed(DEFAULT_3);
    world.nodes.push(node("c"));
    world.node_mut("c").agent_ready = false;
    world.holds("c", "10.0.0.1");
    world.lan_conflict(&n, "10.0.0.1", FOREIGN, "eth1");
    let out = world.plan(&mut planner);
    assert_eq!(ips(&out, "default", "web"), ["10.0.0.2"], "withheld");
    assert_eq!(planner.lan_conflicts().count(), 1);
}

#[test]
fn a_mac_of_a_link_without_addresses_is_still_a_nodes() {
    // The other node reports the MAC only in `macs` (a link that only carries VIPs, or
    // without carrier just now): not foreign.
    let (mut world, mut planner, n) = placed(DEFAULT_3);
    world.link_mac(other(&n), "02:00:00:00:00:0b");
    world.lan_conflict(&n, "10.0.0.1", "02:00:00:00:00:0b", "eth1");
    let out = world.plan(&mut planner);
    assert_eq!(ips(&out, "default", "web"), ["10.0.0.1"]);
    assert_eq!(planner.lan_conflicts().count(), 0);
}

#[test]
fn a_stale_agents_conflict_is_ignored_and_blindness_keeps_the_fence() {
    let (mut world, mut planner, n) = placed(DEFAULT_3);
    let m = other(&n);
    world.lan_conflict(m, "10.0.0.1", FOREIGN, "eth1");
    world.node_mut(m).agent_ready = false;
    let out = world.plan(&mut planner);
    assert_eq!(
        ips(&out, "default", "web"),
        ["10.0.0.1"],
        "stale: as old as its Lease"
    );
    assert_eq!(planner.lan_conflicts().count(), 0);

    world.node_mut(m).agent_ready = true;
    let out = world.plan(&mut planner);
    assert_eq!(
        ips(&out, "default", "web"),
        ["10.0.0.2"],
        "fresh again: withheld"
    );

    // Blind: the agents' reports are no news; the address stays withheld though none is fresh.
    for node in &mut world.nodes {
        node.agent_ready = false;
        node.agent_unconfirmed = true;
    }
    world.agents_unobservable = true;
    world.no_conflicts(m);
    world.services.push(svc("default", "new").created(2));
    let out = world.plan(&mut planner);
    assert_eq!(ips(&out, "default", "new"), ["10.0.0.3"]);
    assert_eq!(planner.lan_conflicts().count(), 1);
}

#[test]
fn first_claims_are_probed_takeovers_never() {
    let (mut world, mut planner, n) = placed(DEFAULT_3);
    let first = world.plan(&mut planner);
    assert_eq!(
        first.probe.iter().copied().collect::<Vec<_>>(),
        [ip("10.0.0.1")],
        "no node held it: a first claim, until the agent holds it"
    );
    world.holds(&n, "10.0.0.1");
    let out = world.plan(&mut planner);
    assert!(out.probe.is_empty(), "held: the flag is dropped");

    // Hard loss: the new node takes over from a known holder.
    world.node_mut(&n).agent_ready = false;
    let out = world.plan(&mut planner);
    assert_eq!(
        plan_of(&out, "default", "web").node.as_deref(),
        Some(other(&n))
    );
    assert!(out.probe.is_empty(), "a takeover: {:?}", out.probe);

    // Even when the lost node's report is gone: there was a node.
    world.agents.remove(&n);
    let out = world.plan(&mut planner);
    assert!(out.probe.is_empty());
}

#[test]
fn a_graceful_move_is_no_first_claim_but_a_pending_group_is() {
    let (mut world, mut planner, n) = placed(DEFAULT_3);
    world.holds(&n, "10.0.0.1");
    world.plan(&mut planner);
    world.node_mut(&n).unschedulable = true;
    world.plan(&mut planner);
    world.holds(&n, "");
    let out = world.plan(&mut planner);
    assert_eq!(
        plan_of(&out, "default", "web").node.as_deref(),
        Some(other(&n))
    );
    assert!(out.probe.is_empty(), "graceful move: {:?}", out.probe);

    // A new Service while no node is eligible: pending, then placed: a first claim.
    for node in &mut world.nodes {
        node.agent_ready = false;
    }
    world.services.push(svc("default", "late").created(2));
    let out = world.plan(&mut planner);
    assert!(plan_of(&out, "default", "late").node.is_none());
    assert!(out.probe.is_empty(), "not placed: nothing to probe");
    let target = other(&n);
    world.node_mut(target).agent_ready = true;
    let out = world.plan(&mut planner);
    let late = plan_of(&out, "default", "late");
    assert_eq!(late.node.as_deref(), Some(target));
    assert!(out.probe.contains(&late.ips[0]), "{:?}", out.probe);
    // web lost its node too (no node was eligible); back on a node with no agent
    // reporting the address, its group was pending: a first claim as well.
    assert_eq!(
        plan_of(&out, "default", "web").node.as_deref(),
        Some(target)
    );
    assert!(out.probe.contains(&ip("10.0.0.1")), "{:?}", out.probe);
}

#[test]
fn an_address_held_by_some_agent_is_no_first_claim() {
    // A stale agent still reports the address (say its node died with it): whoever gets
    // it next takes over, no probe.
    let mut world = World::new(config(&[DEFAULT_3]), vec![svc("default", "web").created(1)]);
    world.nodes.push(node("c"));
    world.node_mut("c").agent_ready = false;
    world.holds("c", "10.0.0.1");
    let mut planner = Planner::new();
    let out = world.plan(&mut planner);
    assert_eq!(ips(&out, "default", "web"), ["10.0.0.1"]);
    assert!(plan_of(&out, "default", "web").node.is_some());
    assert!(out.probe.is_empty(), "{:?}", out.probe);
}

#[test]
fn a_replacement_address_of_a_placed_dual_stack_group_is_a_first_claim() {
    let mut world = World::new(
        config(&[("default", "10.0.0.1-10.0.0.2\n2001:db8::1-2001:db8::2")]),
        vec![
            svc("default", "web")
                .created(1)
                .families(&[Family::V4, Family::V6], false),
        ],
    );
    let mut planner = Planner::new();
    let out = world.plan(&mut planner);
    assert_eq!(ips(&out, "default", "web"), ["10.0.0.1", "2001:db8::1"]);
    let n = plan_of(&out, "default", "web").node.clone().unwrap();
    world.holds(&n, "10.0.0.1,2001:db8::1");
    let out = world.plan(&mut planner);
    assert!(out.probe.is_empty());

    world.holds(&n, "2001:db8::1");
    world.lan_conflict(&n, "10.0.0.1", FOREIGN, "eth1");
    let out = world.plan(&mut planner);
    let web = plan_of(&out, "default", "web");
    assert_eq!(ips(&out, "default", "web"), ["10.0.0.2", "2001:db8::1"]);
    assert_eq!(web.node.as_deref(), Some(&*n), "the group keeps its node");
    assert_eq!(
        out.probe.iter().copied().collect::<Vec<_>>(),
        [ip("10.0.0.2")],
        "only the new address is probed; the held IPv6 one is not"
    );
}

#[test]
fn a_restart_does_not_import_a_conflicted_address() {
    let (mut world, mut planner, n) = placed(DEFAULT_3);
    world.plan(&mut planner);
    // The conflict is reported while no planner runs; the API still shows the address.
    world.service_mut("default", "web").observed_ips = vec![ip("10.0.0.1")];
    world.service_mut("default", "web").observed_node = Some(n.clone());
    world.lan_conflict(&n, "10.0.0.1", FOREIGN, "eth1");
    planner = Planner::new();
    let out = world.plan(&mut planner);
    assert_eq!(ips(&out, "default", "web"), ["10.0.0.2"]);
    let warned = events_for(&out, "default", "web", reason::ADDRESS_CONFLICT);
    assert_eq!(warned.len(), 1, "{:?}", out.events);
    assert!(warned[0].message.contains(FOREIGN), "{}", warned[0].message);
}

/// Pool `default` of three addresses with `onConflict: renumber`.
const RENUMBER: (&str, &str) = (
    "config.yaml",
    "pools:\n  default:\n    onConflict: renumber\n",
);

#[test]
fn a_defended_claim_keeps_the_address_and_warns_once_naming_the_mac() {
    let (mut world, mut planner, n) = placed(DEFAULT_3);
    world.service_mut("default", "web").observed_ips = vec![ip("10.0.0.1")];
    world.holds(&n, "10.0.0.1");
    world.plan(&mut planner);
    // A LAN host claims the address; the holder's agent defends it and keeps it.
    world.lan_claim(&n, "10.0.0.1", FOREIGN, "eth1");
    let out = world.plan(&mut planner);
    let web = plan_of(&out, "default", "web");
    assert_eq!(web.ips, [ip("10.0.0.1")], "not renumbered");
    assert_eq!(web.node.as_deref(), Some(n.as_str()), "not moved");
    assert!(web.announced.status, "still announced");
    assert_eq!(web.announced.reason, reason::ADDRESS_DEFENDED);
    assert_eq!(
        web.announced.message,
        format!(
            "held by {n}, which defends 10.0.0.1 against a claim on the LAN by {FOREIGN} \
             (seen on eth1): claimed on eth1 by {FOREIGN}: defended; the Service keeps its \
             address"
        )
    );
    let warned = events_for(&out, "default", "web", reason::ADDRESS_DEFENDED);
    assert_eq!(warned.len(), 1, "{:?}", out.events);
    assert!(warned[0].warning && warned[0].message.contains(FOREIGN));
    assert!(events_for(&out, "default", "web", reason::ADDRESS_CONFLICT).is_empty());
    assert!(events(&out, reason::CLEAR_ASSIGNMENT).is_empty());
    assert_eq!(planner.lan_conflicts().count(), 0, "not withheld");
    assert!(out.probe.is_empty());
    // Claimed again (the same report): nothing said again.
    let out = world.plan(&mut planner);
    assert!(out.events.is_empty(), "{:?}", out.events);
    // The claims stop: Announced again, the address never moved.
    world.no_conflicts(&n);
    let out = world.plan(&mut planner);
    let web = plan_of(&out, "default", "web");
    assert_eq!(web.ips, [ip("10.0.0.1")]);
    assert_eq!(web.announced.reason, reason::ANNOUNCED);
}

#[test]
fn a_claim_against_a_holder_that_let_go_does_not_renumber_either() {
    // A stale agent removed the alias on a foreign claim (or a Service whose holder lost
    // it meanwhile): once fresh it reports the claim, holding nothing. The Service keeps
    // its address, Announced False, until the claimant leaves or the operator acts.
    let (mut world, mut planner, n) = placed(DEFAULT_3);
    world.service_mut("default", "web").observed_ips = vec![ip("10.0.0.1")];
    world.holds(&n, "10.0.0.1");
    world.plan(&mut planner);
    world.holds(&n, "");
    world.lan_claim(&n, "10.0.0.1", FOREIGN, "eth1");
    let out = world.plan(&mut planner);
    let web = plan_of(&out, "default", "web");
    assert_eq!(web.ips, [ip("10.0.0.1")], "not renumbered");
    assert_eq!(web.node.as_deref(), Some(n.as_str()));
    assert!(!web.announced.status);
    assert_eq!(web.announced.reason, reason::ADDRESS_CONFLICT);
    assert!(
        web.announced.message.contains(FOREIGN),
        "{}",
        web.announced.message
    );
    assert_eq!(planner.lan_conflicts().count(), 0, "not withheld");
    // A restart (a new leader) imports it all the same.
    let mut fresh = Planner::new();
    let out = world.plan(&mut fresh);
    assert_eq!(ips(&out, "default", "web"), ["10.0.0.1"]);
    assert!(events(&out, reason::ADDRESS_CONFLICT).len() <= 1);
    assert!(events(&out, reason::CLEAR_ASSIGNMENT).is_empty());
}

#[test]
fn with_on_conflict_renumber_a_claim_against_the_holder_renumbers() {
    let (mut world, mut planner, n) = placed(DEFAULT_3);
    world.config = config(&[DEFAULT_3, RENUMBER]);
    world.service_mut("default", "web").observed_ips = vec![ip("10.0.0.1")];
    world.holds(&n, "10.0.0.1");
    world.plan(&mut planner);
    world.lan_claim(&n, "10.0.0.1", FOREIGN, "eth1");
    let out = world.plan(&mut planner);
    assert_eq!(ips(&out, "default", "web"), ["10.0.0.2"], "renumbered");
    let warned = events_for(&out, "default", "web", reason::ADDRESS_CONFLICT);
    assert_eq!(warned.len(), 1, "{:?}", out.events);
    assert!(warned[0].message.contains(FOREIGN), "{}", warned[0].message);
    assert_eq!(
        planner.lan_conflicts().count(),
        1,
        "withheld while reported"
    );
    // Another node's MAC is still no foreign host, renumber or not.
    let (mut world, mut planner, n) = placed(DEFAULT_3);
    world.config = config(&[DEFAULT_3, RENUMBER]);
    world.holds(&n, "10.0.0.1");
    world.mac(other(&n), "eth1", "02:00:00:00:00:0b");
    world.lan_claim(&n, "10.0.0.1", "02:00:00:00:00:0b", "eth1");
    let out = world.plan(&mut planner);
    assert_eq!(ips(&out, "default", "web"), ["10.0.0.1"]);
    assert_eq!(planner.lan_conflicts().count(), 0);
}

#[test]
fn a_first_claim_found_taken_is_skipped_whatever_the_pool_option() {
    for pairs in [&[DEFAULT_3][..], &[DEFAULT_3, RENUMBER][..]] {
        let mut world = World::new(config(pairs), vec![svc("default", "web").created(1)]);
        let mut planner = Planner::new();
        let out = world.plan(&mut planner);
        let n = plan_of(&out, "default", "web").node.clone().unwrap();
        assert!(out.probe.contains(&ip("10.0.0.1")), "a first claim");
        // Its probe is answered: not a claim against a holder.
        world.lan_conflict(&n, "10.0.0.1", FOREIGN, "eth1");
        let out = world.plan(&mut planner);
        assert_eq!(ips(&out, "default", "web"), ["10.0.0.2"], "{pairs:?}");
    }
}

/// Issue 42 item 4: one LAN host answering every first claim's probe pushes allocations
/// through at most a few addresses of the pool, not through all of it. Each Service's first
/// claims are probed (and answered by the same MAC) until nothing new is probed; ten
/// Services in a row.
#[test]
fn one_lan_host_answering_every_probe_pushes_allocations_a_bounded_way() {
    let mut world = World::new(config(&[("default", "10.0.0.1-10.0.0.60")]), Vec::new());
    world.nodes = vec![node("n1")];
    let mut planner = Planner::new();
    let mut tried: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut out = world.plan(&mut planner);
    for i in 0..10 {
        let name = format!("s{i}");
        world.services.push(svc("default", &name).created(i));
        for _ in 0..80 {
            out = world.plan(&mut planner);
            for s in &mut world.services {
                s.observed_ips = out.services[&s.key].ips.clone();
                s.observed_node = out.services[&s.key].node.as_deref().map(str::to_owned);
            }
            for (key, plan) in &out.services {
                let seen = tried.entry(key.name.to_string()).or_default();
                for ip in &plan.ips {
                    if !seen.contains(&ip.to_string()) {
                        seen.push(ip.to_string());
                    }
                }
            }
            // The agent probes each first claim; the host answers every one.
            let probed: Vec<String> = out
                .probe
                .iter()
                .map(ToString::to_string)
                .filter(|ip| {
                    !world
                        .agents
                        .get("n1")
                        .is_some_and(|r| r.conflicts.iter().any(|c| c.ip.to_string() == *ip))
                })
                .collect();
            if probed.is_empty() {
                break;
            }
            for ip in probed {
                world.lan_conflict("n1", &ip, FOREIGN, "eth1");
            }
        }
    }
    let pushed: usize = tried.values().map(|t| t.len().saturating_sub(1)).sum();
    assert!(
        pushed < LAN_HOST_BOUND,
        "one host pushed the allocations {pushed} addresses further: {tried:?}"
    );
    // Every address it answered for stays out of allocation.
    let answered = planner.lan_conflicts().count();
    assert_eq!(answered, pushed + 10, "{tried:?}");
    for i in 0..10 {
        let name = format!("s{i}");
        let plan = plan_of(&out, "default", &name);
        assert_eq!(plan.ips.len(), 1, "{name} has an address");
    }
    // The Services past the bound keep the address the host answers for, unannounced, and
    // are told why, once.
    let last = plan_of(&out, "default", "s9");
    assert_eq!(last.announced.reason, reason::ADDRESS_CONFLICT);
    assert!(
        last.announced.message.contains(FOREIGN)
            && last.announced.message.contains("renumber no Service"),
        "{}",
        last.announced.message
    );
    assert!(
        events(&out, reason::NODE_CLAIM).is_empty(),
        "a LAN host is no node: {:?}",
        out.events
    );
    // A new leader decides the same: nothing moves.
    for s in &mut world.services {
        s.observed_ips = out.services[&s.key].ips.clone();
    }
    let again = world.plan(&mut Planner::new());
    for i in 0..10 {
        let name = format!("s{i}");
        assert_eq!(
            ips(&again, "default", &name),
            ips(&out, "default", &name),
            "{name} after a restart"
        );
    }
}
