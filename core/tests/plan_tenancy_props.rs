//! Property test of the tenant fence with several pools per namespace: random pool
//! ConfigMaps (own keys, named pools shared by list and by label selector, a fallback,
//! draining entries and pools, `autoAssign: false`), namespaces relabelled, Services that
//! name a pool (theirs, another tenant's, one that does not exist) or request an address
//! (theirs or another tenant's), removes and controller restarts.
//!
//! After every pass:
//! - every address a Service holds is in a pool its namespace keeps
//!   ([`aliaslb_core::pool::Tenancy::keeps`]): its own key, `_fallback` without a key of
//!   its own, a named pool that lists it or selects it, or a selector pool it matched when
//!   it got the address;
//! - every address handed out in this pass (an `IPAllocated` Event not joining a sharing
//!   group) is in a pool the namespace may draw from now, and not draining;
//! - a Service allocated as asked that names a pool holds addresses of that pool only;
//! - no address is held by Services of two namespaces;
//! - a restart (a fresh planner importing what the API shows) changes no address.

mod plan_support;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use aliaslb_core::plan::{PlanOutput, Planner, reason};
use aliaslb_core::pool::{Labels, PoolConfig};
use plan_support::*;
use proptest::prelude::*;

const NAMESPACES: [&str; 3] = ["ns0", "ns1", "ns2"];
/// `aliaslb.io/pool` values a Service may give (the last two are no named pool).
const NAMES: [&str; 5] = ["red", "blue", "_fallback", "ns1", "nope"];

/// A named pool `pool.{name}` on `10.0.{third}.1-n`: the namespaces listed (by index), a
/// selector on `tier: web`, `autoAssign: false`, draining.
#[derive(Debug, Clone)]
struct Named {
    n: u8,
    list: Vec<usize>,
    selector: bool,
    manual: bool,
    draining: bool,
}

#[derive(Debug, Clone)]
struct Spec {
    /// ns0's and ns1's own keys of `n` addresses (ns0's first maybe draining).
    own: [Option<u8>; 2],
    drain_first: bool,
    fallback: Option<u8>,
    red: Option<Named>,
    blue: Option<Named>,
}

impl Spec {
    fn build(&self) -> PoolConfig {
        let mut pairs: Vec<(String, String)> = Vec::new();
        for (i, own) in self.own.iter().enumerate() {
            if let Some(n) = own {
                let mut value = format!("10.0.{i}.1-10.0.{i}.{n}");
                if i == 0 && self.drain_first {
                    value = format!("10.0.0.100 draining\n{value}");
                }
                pairs.push((NAMESPACES[i].to_owned(), value));
            }
        }
        if let Some(n) = self.fallback {
            pairs.push(("_fallback".to_owned(), format!("10.0.9.1-10.0.9.{n}")));
        }
        let mut yaml = String::from("pools:\n");
        for (name, third, named) in [("red", 5, &self.red), ("blue", 6, &self.blue)] {
            let Some(named) = named else { continue };
            pairs.push((
                format!("pool.{name}"),
                format!("10.0.{third}.1-10.0.{third}.{}", named.n),
            ));
            yaml.push_str(&format!("  pool.{name}:\n"));
            if !named.list.is_empty() {
                let names: Vec<&str> = named.list.iter().map(|i| NAMESPACES[*i]).collect();
                yaml.push_str(&format!("    namespaces: [{}]\n", names.join(", ")));
            }
            if named.selector {
                yaml.push_str("    namespaceSelector: {tier: web}\n");
            }
            if named.manual {
                yaml.push_str("    autoAssign: false\n");
            }
            if named.draining {
                yaml.push_str("    draining: true\n");
            }
        }
        if yaml != "pools:\n" {
            pairs.push(("config.yaml".to_owned(), yaml));
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
        pool: Option<usize>,
        /// (third octet, host).
        request: Option<(u8, u8)>,
        sharing: bool,
    },
    Remove(usize),
    Config(Spec),
    Label(usize, bool),
    Restart,
}

fn named() -> impl Strategy<Value = Named> {
    (
        1u8..4,
        prop::sample::subsequence(vec![0usize, 1, 2], 0..=3),
        any::<bool>(),
        prop::bool::weighted(0.2),
        prop::bool::weighted(0.2),
    )
        .prop_map(|(n, list, selector, manual, draining)| Named {
            n,
            list,
            selector,
            manual,
            draining,
        })
}

fn spec() -> impl Strategy<Value = Spec> {
    (
        prop::option::weighted(0.7, 1u8..4),
        prop::option::weighted(0.7, 1u8..4),
        any::<bool>(),
        prop::option::of(1u8..3),
        prop::option::weighted(0.8, named()),
        prop::option::weighted(0.6, named()),
    )
        .prop_map(|(a, b, drain_first, fallback, red, blue)| Spec {
            own: [a, b],
            drain_first,
            fallback,
            red,
            blue,
        })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (
            0usize..3,
            0u8..5,
            prop::option::weighted(0.5, 0usize..NAMES.len()),
            prop::option::weighted(
                0.3,
                (prop::sample::select(vec![0u8, 1, 5, 6, 9]), 1u8..4)
            ),
            prop::bool::weighted(0.2),
        )
            .prop_map(|(ns, name, pool, request, sharing)| Op::Add {
                ns,
                name,
                pool,
                request,
                sharing,
            }),
        3 => any::<prop::sample::Index>().prop_map(|i| Op::Remove(i.index(1000))),
        2 => spec().prop_map(Op::Config),
        3 => (0usize..3, any::<bool>()).prop_map(|(ns, on)| Op::Label(ns, on)),
        1 => Just(Op::Restart),
    ]
}

fn check(
    world: &World,
    out: &PlanOutput,
    before: &BTreeMap<aliaslb_core::plan::ServiceKey, Vec<IpAddr>>,
) -> Result<(), TestCaseError> {
    let config = &world.config;
    let tenancy = |ns: &str| config.tenancy(ns, world.namespaces.get(ns));
    let mut owner_ns: BTreeMap<IpAddr, &str> = BTreeMap::new();
    for view in &world.services {
        let plan = &out.services[&view.key];
        let ns = &*view.key.namespace;
        for ip in &plan.ips {
            let pool = config.pool_of(*ip);
            prop_assert!(
                pool.is_some_and(|(k, p)| tenancy(ns).keeps(k, p)),
                "{} holds {} of {:?}, which namespace {} does not keep",
                view.key,
                ip,
                pool.map(|(k, _)| k.to_string()),
                ns
            );
            if let Some(other) = owner_ns.insert(*ip, ns) {
                prop_assert_eq!(other, ns, "{} held in two namespaces", ip);
            }
        }
        if let Some(name) = &view.pool
            && plan.allocated.status
        {
            for ip in &plan.ips {
                let (key, _) = config.pool_of(*ip).expect("in a pool");
                prop_assert_eq!(
                    key.name(),
                    name.strip_prefix("pool.").unwrap_or(name),
                    "{} names {} and holds {}",
                    view.key,
                    name,
                    ip
                );
            }
        }
    }
    for event in out
        .events
        .iter()
        .filter(|e| e.reason == reason::IP_ALLOCATED)
    {
        if event.message.contains("shared under sharing key") {
            continue;
        }
        let ip: IpAddr = event
            .message
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .expect("assigned IP from pool P");
        let was_held = before
            .get(&event.service)
            .is_some_and(|ips| ips.contains(&ip));
        let (key, pool) = config.pool_of(ip).expect("in a pool");
        let t = tenancy(&event.service.namespace);
        prop_assert!(
            t.may_draw(key),
            "{} got {} of {}, which namespace {} may not draw from",
            event.service,
            ip,
            key,
            event.service.namespace
        );
        prop_assert!(
            was_held || !pool.is_closed(ip),
            "{} got {} anew, which drains",
            event.service,
            ip
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(400)
    ))]
    #[test]
    fn no_service_draws_from_a_pool_its_namespace_may_not(
        initial in spec(),
        ops in prop::collection::vec(op(), 1..40),
    ) {
        let mut world = World::new(initial.build(), Vec::new());
        let mut planner = Planner::new();
        let mut created = 0i64;
        world.plan(&mut planner);
        let mut held: BTreeMap<_, Vec<IpAddr>> = BTreeMap::new();
        for op in &ops {
            match op {
                Op::Add { ns, name, pool, request, sharing } => {
                    created += 1;
                    let mut s = svc(NAMESPACES[*ns], &format!("s{name}"))
                        .created(created)
                        .uid(&format!("u{created}"))
                        .port(80 + i32::from(*name), "TCP");
                    if let Some(p) = pool {
                        s = s.pool(NAMES[*p]);
                    }
                    if let Some((third, host)) = request {
                        s = s.requesting(&format!("10.0.{third}.{host}"));
                    }
                    if *sharing {
                        s = s.sharing("k");
                    }
                    world.services.retain(|v| v.key != s.key);
                    world.services.push(s);
                }
                Op::Remove(i) => {
                    if !world.services.is_empty() {
                        let i = i % world.services.len();
                        world.services.remove(i);
                    }
                }
                Op::Config(spec) => world.config = spec.build(),
                Op::Label(ns, on) => {
                    let labels: &mut Labels =
                        world.namespaces.entry(NAMESPACES[*ns].to_owned()).or_default();
                    if *on {
                        labels.insert("tier".to_owned(), "web".to_owned());
                    } else {
                        labels.remove("tier");
                    }
                }
                Op::Restart => planner = Planner::new(),
            }
            let out = world.plan(&mut planner);
            check(&world, &out, &held)?;
            // The writes land: the API shows what was planned.
            for s in &mut world.services {
                s.observed_ips = out.services[&s.key].ips.clone();
            }
            held = out.services.iter().map(|(k, p)| (k.clone(), p.ips.clone())).collect();
            if matches!(op, Op::Restart) {
                continue;
            }
            // A restart now would keep every address.
            let mut fresh = Planner::new();
            let again = world.plan(&mut fresh);
            for (key, plan) in &out.services {
                let mut want: BTreeSet<IpAddr> = plan.ips.iter().copied().collect();
                let got: BTreeSet<IpAddr> = again.services[key].ips.iter().copied().collect();
                // A Service still waiting may get an address the restart finds free.
                if !plan.allocated.status {
                    want.retain(|ip| got.contains(ip));
                    prop_assert!(want.is_subset(&got), "{}: {:?} -> {:?}", key, plan.ips, got);
                    continue;
                }
                prop_assert_eq!(want, got, "{} renumbered by a restart", key);
            }
        }
    }
}
