//! Property test of the planner over random sequences of Service adds (including
//! re-creation under a new uid), removes, pool edits, Nodes getting or losing a pool
//! address, a fresh agent reporting a pool address answered on the LAN by a foreign MAC (or
//! dropping that report) and controller restarts.
//!
//! After every pass:
//! - no IP is planned for two Services unless they are of one namespace, share a sharing
//!   key and use different ports;
//! - every IP lies inside its namespace's pool (own key, else fallback);
//! - no IP planned is one a fresh agent reports answered on the LAN by a foreign host
//!   (unless that host answers for `LAN_HOST_BOUND` addresses or more, and its Service had
//!   it before: such a host renumbers nothing), nor an address a Node has unless its
//!   Service had it before (a node's word keeps an address from being allocated, never
//!   takes it);
//! - a plain Service (single-stack IPv4, no request, no sharing key) is pending only when
//!   its pool really has no free IPv4 address, and then says PoolExhausted, or
//!   AddressConflict when a LAN conflict withholds one of them (or NoPool / NoAddressOfFamily
//!   when there is no pool or no IPv4 in it);
//! - every IP marked `probe` is planned, on a node;
//! - the planner's usage matches the distinct IPs planned;
//! - a restart (fresh Planner importing the last output) changes no IP and no node.

mod plan_support;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use aliaslb_core::plan::{LAN_HOST_BOUND, PlanOutput, Planner, ServiceKey, ServiceView, reason};
use aliaslb_core::pool::PoolConfig;
use aliaslb_core::range::Family;
use plan_support::*;
use proptest::prelude::*;

const NAMESPACES: [&str; 3] = ["ns0", "ns1", "ns2"];

/// A pool config: per namespace 0 and 1 maybe a key of `n` IPv4 addresses (and maybe
/// IPv6), maybe a fallback of `n` addresses, maybe sharing off for namespace 0.
#[derive(Debug, Clone)]
struct ConfigSpec {
    own: [Option<(u8, bool)>; 2],
    fallback: Option<u8>,
    sharing_off: bool,
}

impl ConfigSpec {
    fn build(&self) -> PoolConfig {
        let mut pairs: Vec<(String, String)> = Vec::new();
        for (i, own) in self.own.iter().enumerate() {
            if let Some((n, v6)) = own {
                let mut value = format!("10.0.{i}.1-10.0.{i}.{n}");
                if *v6 {
                    value.push_str(&format!("\n2001:db8:{i}::1-2001:db8:{i}::{n}"));
                }
                pairs.push((NAMESPACES[i].to_owned(), value));
            }
        }
        if let Some(n) = self.fallback {
            pairs.push(("_fallback".to_owned(), format!("10.0.9.1-10.0.9.{n}")));
        }
        if self.sharing_off && self.own[0].is_some() {
            pairs.push((
                "config.yaml".to_owned(),
                "pools:\n  ns0:\n    allowSharing: false\n".to_owned(),
            ));
        }
        let borrowed: Vec<(&str, &str)> = pairs
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        config(&borrowed)
    }
}

#[derive(Debug, Clone)]
enum Op {
    Add {
        ns: usize,
        name: u8,
        sharing: Option<u8>,
        port: u8,
        /// (pool index 0, 1 or 9, host): may be outside the namespace's pool.
        request: Option<(u8, u8)>,
        /// 0: IPv4, 1: PreferDualStack, 2: RequireDualStack.
        dual: u8,
    },
    Remove(usize),
    Config(ConfigSpec),
    /// A Node gets (`true`) or loses address `10.0.{pool}.{host}`.
    NodeAddress(u8, u8, bool),
    /// The agent on node `a` reports (`true`) or stops reporting `10.0.{pool}.{host}`
    /// answered on the LAN by a foreign MAC.
    LanConflict(u8, u8, bool),
    Restart,
}

fn config_spec() -> impl Strategy<Value = ConfigSpec> {
    (
        prop::option::weighted(0.8, (1u8..5, any::<bool>())),
        prop::option::weighted(0.8, (1u8..5, any::<bool>())),
        prop::option::of(1u8..4),
        prop::bool::weighted(0.2),
    )
        .prop_map(|(a, b, fallback, sharing_off)| ConfigSpec {
            own: [a, b],
            fallback,
            sharing_off,
        })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (
            0usize..3,
            0u8..6,
            prop::option::weighted(0.3, 0u8..2),
            0u8..3,
            prop::option::weighted(0.2, (prop::sample::select(vec![0u8, 1, 9]), 1u8..5)),
            prop::sample::select(vec![0u8, 0, 0, 1, 2]),
        )
            .prop_map(|(ns, name, sharing, port, request, dual)| Op::Add {
                ns,
                name,
                sharing,
                port,
                request,
                dual,
            }),
        3 => any::<prop::sample::Index>().prop_map(|i| Op::Remove(i.index(1000))),
        1 => config_spec().prop_map(Op::Config),
        1 => (prop::sample::select(vec![0u8, 1, 9]), 1u8..5, any::<bool>())
            .prop_map(|(pool, host, on)| Op::NodeAddress(pool, host, on)),
        // Often enough that the one MAC answers for more than `LAN_HOST_BOUND`.
        3 => (prop::sample::select(vec![0u8, 1, 9]), 1u8..5, prop::bool::weighted(0.7))
            .prop_map(|(pool, host, on)| Op::LanConflict(pool, host, on)),
        1 => Just(Op::Restart),
    ]
}

fn view(ns: usize, name: u8, created: i64, op: &Op) -> ServiceView {
    let Op::Add {
        sharing,
        port,
        request,
        dual,
        ..
    } = op
    else {
        unreachable!("only adds make views")
    };
    let mut s = svc(NAMESPACES[ns], &format!("s{name}"))
        .created(created)
        .uid(&format!("uid-{created}"))
        .port(80 + i32::from(*port), "TCP");
    if let Some(k) = sharing {
        s = s.sharing(&format!("k{k}"));
    }
    if let Some((pool, host)) = request {
        s = s.requesting(&format!("10.0.{pool}.{host}"));
    }
    match dual {
        1 => s.families(&[Family::V4, Family::V6], false),
        2 => s.families(&[Family::V4, Family::V6], true),
        _ => s,
    }
}

/// The addresses a fresh agent reports answered on the LAN by a foreign MAC (no agent holds
/// anything in this model, and no MAC is a node's): the planner withholds them all. A LAN conflict outranks a Node's address
/// (the LAN renumbers, a node's word does not).
fn answered(world: &World) -> BTreeSet<IpAddr> {
    world
        .nodes
        .iter()
        .filter(|n| n.agent_ready)
        .filter_map(|n| world.agents.get(&*n.name))
        .flat_map(|r| r.conflicts.iter().filter(|c| c.mac.is_some()).map(|c| c.ip))
        .collect()
}

/// The invariants of one pass's `out`, `last` being the pass before's.
fn check(
    world: &World,
    planner: &Planner,
    out: &PlanOutput,
    last: &PlanOutput,
) -> Result<(), TestCaseError> {
    let answered = answered(world);
    let lan: BTreeSet<IpAddr> = planner.lan_conflicts().map(|(ip, _)| ip).collect();
    prop_assert_eq!(&lan, &answered);
    // The model's one MAC answering for `LAN_HOST_BOUND` addresses or more renumbers no
    // Service: a Service may then keep one it had.
    let host_at_bound = answered.len() >= LAN_HOST_BOUND;
    // What the last pass planned: a kept address stays with its Service (and the sharing
    // group it is in, which a new member may join).
    let held_before: BTreeSet<IpAddr> = last
        .services
        .values()
        .flat_map(|p| p.ips.iter().copied())
        .collect();
    let views: BTreeMap<&ServiceKey, &ServiceView> =
        world.services.iter().map(|s| (&s.key, s)).collect();
    prop_assert_eq!(out.services.len(), views.len());
    let mut users: BTreeMap<IpAddr, Vec<&ServiceView>> = BTreeMap::new();
    for (k, plan) in &out.services {
        let v = views[k];
        for ip in &plan.ips {
            users.entry(*ip).or_default().push(v);
            let pool = world.config.pool_for_namespace(&k.namespace);
            prop_assert!(
                pool.is_some_and(|(_, p)| p.contains(*ip)),
                "{} outside the pool of {}",
                ip,
                k
            );
            prop_assert!(
                !lan.contains(ip) || (host_at_bound && held_before.contains(ip)),
                "{} is answered on the LAN by a foreign host and planned for {}",
                ip,
                k
            );
            // A node's word keeps an address from being allocated, never takes it: a
            // Service on a Node's address had it before.
            prop_assert!(
                !world.node_addresses.contains_key(ip) || held_before.contains(ip),
                "{} is a Node's address and newly allocated to {}",
                ip,
                k
            );
        }
    }
    for ip in &out.probe {
        prop_assert!(
            out.services
                .values()
                .any(|p| p.node.is_some() && p.ips.contains(ip)),
            "{} marked probe but not placed",
            ip
        );
    }
    for (ip, list) in &users {
        if list.len() < 2 {
            continue;
        }
        let first = list[0];
        let mut ports = BTreeSet::new();
        for v in list {
            prop_assert_eq!(
                &v.key.namespace,
                &first.key.namespace,
                "{} crosses namespaces",
                ip
            );
            prop_assert!(
                v.sharing_key.is_some(),
                "{} on a non-sharing Service {}",
                ip,
                v.key
            );
            prop_assert_eq!(
                &v.sharing_key,
                &first.sharing_key,
                "{} across sharing keys",
                ip
            );
            for p in &v.ports {
                prop_assert!(ports.insert(p.clone()), "{} port {} twice", ip, p);
            }
        }
    }
    // Quarantined IPs are ones the API showed at the start of the pass (the writes of the
    // pass before), never planned for anyone: nothing stays quarantined once its clear landed.
    let shown: BTreeSet<IpAddr> = world
        .services
        .iter()
        .flat_map(|s| s.observed_ips.iter().copied())
        .collect();
    // No pass plans an IP for a Service while the API still shows it on another one that
    // may not share it: the writes of a pass land in any order.
    for (k, plan) in &out.services {
        let v = views[k];
        for ip in &plan.ips {
            for other in &world.services {
                let may_share = other.key.namespace == k.namespace
                    && other.sharing_key.is_some()
                    && other.sharing_key == v.sharing_key;
                prop_assert!(
                    other.key == *k || may_share || !other.observed_ips.contains(ip),
                    "{} planned for {} while the API shows it on {}",
                    ip,
                    k,
                    other.key
                );
            }
        }
    }
    let quarantined: BTreeSet<IpAddr> = planner.quarantined().collect();
    for ip in &quarantined {
        prop_assert!(shown.contains(ip), "{} quarantined but shown nowhere", ip);
        prop_assert!(!users.contains_key(ip), "{} quarantined and planned", ip);
    }
    // An address held for a released Service is neither planned for another nor requested
    // successfully by one.
    let reserved: BTreeMap<IpAddr, ServiceKey> =
        planner.reserved().map(|(ip, k)| (ip, k.clone())).collect();
    for (ip, owner) in &reserved {
        prop_assert!(
            !users.contains_key(ip),
            "{} held for {} and planned",
            ip,
            owner
        );
    }
    // Usage matches the distinct IPs planned plus those quarantined or held for a released
    // Service, per pool; a withheld address (a Node's, or answered on the LAN) counts neither
    // in the pool nor in use, unless a Service keeps it (a Node's address it had before).
    let withheld_ips: BTreeSet<IpAddr> = world
        .node_addresses
        .keys()
        .chain(&lan)
        .filter(|ip| !users.contains_key(ip))
        .copied()
        .collect();
    let withheld = |ip: &&IpAddr| withheld_ips.contains(*ip);
    for usage in planner.usage() {
        let pool = world.config.pool(&usage.pool).unwrap();
        let of_pool = |ip: &&IpAddr| Family::of(**ip) == usage.family && pool.contains(**ip);
        let held: BTreeSet<&IpAddr> = users
            .keys()
            .chain(quarantined.iter())
            .chain(reserved.keys())
            .filter(|ip| !withheld(ip))
            .collect();
        let planned = held.into_iter().filter(of_pool).count();
        prop_assert_eq!(usage.in_use, planned as u128, "usage of {}", usage.pool);
        let nodes = withheld_ips.iter().filter(of_pool).count() as u128;
        prop_assert_eq!(usage.total, pool.size(usage.family) - nodes);
    }
    // Plain Services are pending only when their pool has no room.
    for (k, plan) in &out.services {
        let v = views[k];
        let plain = v.sharing_key.is_none()
            && v.requested.as_ref().is_ok_and(Vec::is_empty)
            && v.families.families == [Family::V4];
        if !plain || !plan.ips.is_empty() {
            continue;
        }
        let why = plan.allocated.reason;
        match world.config.pool_for_namespace(&k.namespace) {
            None => prop_assert_eq!(why, reason::NO_POOL),
            Some((_, pool)) if pool.size(Family::V4) == 0 => {
                prop_assert_eq!(why, reason::NO_ADDRESS_OF_FAMILY)
            }
            Some((pool_key, pool)) => {
                // An address withheld for the LAN that no Service keeps (a host answering for everything renumbers
                // none).
                let conflicted = lan
                    .iter()
                    .any(|ip| ip.is_ipv4() && pool.contains(*ip) && !users.contains_key(ip));
                let expected = if conflicted {
                    reason::ADDRESS_CONFLICT
                } else {
                    reason::POOL_EXHAUSTED
                };
                prop_assert_eq!(why, expected, "{}: {}", k, plan.allocated.message);
                let used = users
                    .keys()
                    .chain(quarantined.iter())
                    .chain(withheld_ips.iter())
                    .chain(reserved.keys())
                    .filter(|ip| ip.is_ipv4() && pool.contains(**ip))
                    .collect::<BTreeSet<_>>()
                    .len() as u128;
                prop_assert_eq!(
                    used,
                    pool.size(Family::V4),
                    "{} pending with room in {}",
                    k,
                    pool_key
                );
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]
    #[test]
    fn planner_invariants(initial in config_spec(), ops in prop::collection::vec(op(), 1..40)) {
        let mut world = World::new(initial.build(), Vec::new());
        let mut planner = Planner::new();
        let mut created = 0i64;
        let mut last = world.plan(&mut planner);
        for op in &ops {
            match op {
                Op::Add { ns, name, .. } => {
                    created += 1;
                    let v = view(*ns, *name, created, op);
                    world.services.retain(|s| s.key != v.key);
                    world.services.push(v);
                }
                Op::Remove(i) => {
                    if !world.services.is_empty() {
                        let i = i % world.services.len();
                        world.services.remove(i);
                    }
                }
                Op::Config(spec) => world.config = spec.build(),
                Op::NodeAddress(pool, host, on) => {
                    let address = format!("10.0.{pool}.{host}");
                    if *on {
                        world.node_has(&format!("node-{pool}-{host}"), &address);
                    } else {
                        world.node_drops(&address);
                    }
                }
                Op::LanConflict(pool, host, on) => {
                    let address = format!("10.0.{pool}.{host}");
                    let report = world.report_mut("a");
                    report.conflicts.retain(|c| c.ip != ip(&address));
                    if *on {
                        world.lan_conflict("a", &address, "46:b0:48:e8:2d:96", "eth1");
                    }
                }
                Op::Restart => planner = Planner::new(),
            }
            let out = world.plan(&mut planner);
            check(&world, &planner, &out, &last)?;
            // The controller's writes land: the API now shows what was planned.
            for s in &mut world.services {
                let p = &out.services[&s.key];
                s.observed_ips = p.ips.clone();
                s.observed_node = p.node.as_deref().map(str::to_owned);
            }
            if matches!(op, Op::Restart) {
                for (k, before) in &last.services {
                    if before.ips.is_empty() {
                        continue;
                    }
                    // Every IP held before is still held. A family still held back by the
                    // quarantine before the restart may be granted now: gained, not moved.
                    let after = &out.services[k].ips;
                    prop_assert!(
                        before.ips.iter().all(|ip| after.contains(ip)),
                        "restart moved {}: {:?} -> {:?}",
                        k,
                        before.ips,
                        after
                    );
                    prop_assert_eq!(&out.services[k].node, &before.node, "restart moved {}", k);
                }
                prop_assert!(
                    out.events.iter().all(|e| e.reason != reason::CLEAR_ASSIGNMENT),
                    "{:?}", out.events
                );
            }
            last = out;
        }
    }
}
