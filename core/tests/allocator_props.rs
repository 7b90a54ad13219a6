//! Property tests: the ledger against a model that enumerates every address of a small pool.
//!
//! Pools are up to four random ranges per family inside a 64-address window, placed at the
//! bottom, the middle or the very top of each address space (so integer overflow at
//! `255.255.255.255` and `ffff:...:ffff` is exercised). Operations pick addresses across the
//! whole window, so some fall outside the pool.

use std::collections::BTreeSet;
use std::net::IpAddr;

use aliaslb_core::ledger::{AllocError, Ledger};
use aliaslb_core::range::{Family, IpRange, from_u128, to_u128};
use proptest::prelude::*;

/// Addresses in the window each family's pool is drawn from.
const WINDOW: u128 = 64;

const FAMILIES: [Family; 2] = [Family::V4, Family::V6];

/// A small pool: for each family, the window's first address and ranges as offsets in it.
#[derive(Debug, Clone)]
struct Pool {
    v4_base: u128,
    v6_base: u128,
    v4: Vec<(u128, u128)>,
    v6: Vec<(u128, u128)>,
}

impl Pool {
    fn addr(&self, family: Family, offset: u128) -> IpAddr {
        let base = match family {
            Family::V4 => self.v4_base,
            Family::V6 => self.v6_base,
        };
        from_u128(family, base + offset)
    }

    fn ranges(&self) -> Vec<IpRange> {
        let v4 = self.v4.iter().map(|&r| (Family::V4, r));
        let v6 = self.v6.iter().map(|&r| (Family::V6, r));
        v4.chain(v6)
            .map(|(family, (first, last))| {
                IpRange::new(self.addr(family, first), self.addr(family, last)).unwrap()
            })
            .collect()
    }

    /// Every address of the pool, enumerated.
    fn addresses(&self) -> BTreeSet<IpAddr> {
        self.ranges()
            .iter()
            .flat_map(|r| {
                let family = r.family();
                (to_u128(r.first())..=to_u128(r.last())).map(move |n| from_u128(family, n))
            })
            .collect()
    }
}

fn offsets() -> impl Strategy<Value = Vec<(u128, u128)>> {
    prop::collection::vec((0..WINDOW, 0..16u128), 0..=4).prop_map(|v| {
        v.into_iter()
            .map(|(start, len)| (start, (start + len).min(WINDOW - 1)))
            .collect()
    })
}

fn pool() -> impl Strategy<Value = Pool> {
    let v4_base = prop::sample::select(vec![0, 0x0a00_0000, u128::from(u32::MAX) - (WINDOW - 1)]);
    let v6_base = prop::sample::select(vec![
        0,
        to_u128("2001:db8::".parse().unwrap()),
        u128::MAX - (WINDOW - 1),
    ]);
    (v4_base, v6_base, offsets(), offsets()).prop_map(|(v4_base, v6_base, v4, v6)| Pool {
        v4_base,
        v6_base,
        v4,
        v6,
    })
}

fn family() -> impl Strategy<Value = Family> {
    prop::sample::select(FAMILIES.to_vec())
}

#[derive(Debug, Clone)]
enum Op {
    Allocate(Family),
    Specific(Family, u128),
    Import(Family, u128),
    Release(Family, u128),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => family().prop_map(Op::Allocate),
        2 => (family(), 0..WINDOW).prop_map(|(f, o)| Op::Specific(f, o)),
        1 => (family(), 0..WINDOW).prop_map(|(f, o)| Op::Import(f, o)),
        2 => (family(), 0..WINDOW).prop_map(|(f, o)| Op::Release(f, o)),
    ]
}

/// The obvious implementation: the set of pool addresses and the set in use.
struct Model {
    pool: BTreeSet<IpAddr>,
    used: BTreeSet<IpAddr>,
}

impl Model {
    fn total(&self, family: Family) -> u128 {
        self.pool
            .iter()
            .filter(|a| Family::of(**a) == family)
            .count() as u128
    }

    fn allocate(&mut self, family: Family) -> Result<IpAddr, AllocError> {
        let total = self.total(family);
        if total == 0 {
            return Err(AllocError::NoFamily { family });
        }
        let lowest = self
            .pool
            .iter()
            .find(|a| Family::of(**a) == family && !self.used.contains(a))
            .copied()
            .ok_or(AllocError::Exhausted { family, total })?;
        self.used.insert(lowest);
        Ok(lowest)
    }

    fn allocate_specific(&mut self, ip: IpAddr) -> Result<(), AllocError> {
        if !self.pool.contains(&ip) {
            return Err(AllocError::NotInPool { ip });
        }
        if !self.used.insert(ip) {
            return Err(AllocError::InUse { ip });
        }
        Ok(())
    }

    fn release(&mut self, ip: IpAddr) -> bool {
        self.used.remove(&ip)
    }
}

/// Checks everything observable about `ledger` against `model`, and the pool membership
/// and use of `probe`.
fn assert_agrees(ledger: &Ledger, model: &Model, probe: IpAddr) -> Result<(), TestCaseError> {
    let in_use: Vec<IpAddr> = ledger.in_use().collect();
    let expected: Vec<IpAddr> = model.used.iter().copied().collect();
    prop_assert_eq!(
        in_use,
        expected,
        "in_use() must list each used address once, ascending"
    );
    for family in FAMILIES {
        let usage = ledger.usage(family);
        prop_assert_eq!(usage.total, model.total(family));
        let used = model
            .used
            .iter()
            .filter(|a| Family::of(**a) == family)
            .count();
        prop_assert_eq!(usage.in_use, used as u128);
        prop_assert_eq!(usage.free(), usage.total - usage.in_use);
    }
    prop_assert_eq!(ledger.contains(probe), model.pool.contains(&probe));
    prop_assert_eq!(ledger.is_in_use(probe), model.used.contains(&probe));
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Any sequence of operations gives the model's answers: allocation is the lowest free
    /// address, never one in use, never one outside the pool; release frees exactly what was
    /// in use; usage figures match.
    #[test]
    fn ledger_matches_model(pool in pool(), ops in prop::collection::vec(op(), 1..120)) {
        let mut ledger = Ledger::new(&pool.ranges());
        let mut model = Model { pool: pool.addresses(), used: BTreeSet::new() };
        for op in ops {
            let probe = match op {
                Op::Allocate(family) => {
                    let got = ledger.allocate(family);
                    prop_assert_eq!(&got, &model.allocate(family), "allocate {}", family);
                    got.unwrap_or_else(|_| pool.addr(family, 0))
                }
                Op::Specific(family, offset) => {
                    let ip = pool.addr(family, offset);
                    prop_assert_eq!(ledger.allocate_specific(ip), model.allocate_specific(ip));
                    ip
                }
                Op::Import(family, offset) => {
                    let ip = pool.addr(family, offset);
                    prop_assert_eq!(ledger.import(ip), model.allocate_specific(ip));
                    ip
                }
                Op::Release(family, offset) => {
                    let ip = pool.addr(family, offset);
                    prop_assert_eq!(ledger.release(ip), model.release(ip), "release {}", ip);
                    ip
                }
            };
            assert_agrees(&ledger, &model, probe)?;
        }
    }

    /// Importing existing assignments, then allocating until the pool is exhausted, hands
    /// out exactly the addresses not imported, in ascending order; importing one twice is
    /// reported as a collision.
    #[test]
    fn import_then_allocate_never_collides(
        pool in pool(),
        picks in prop::collection::vec((family(), 0..WINDOW), 0..40),
    ) {
        let addresses = pool.addresses();
        let mut ledger = Ledger::new(&pool.ranges());
        let mut imported = BTreeSet::new();
        for (family, offset) in picks {
            let ip = pool.addr(family, offset);
            let result = ledger.import(ip);
            if !addresses.contains(&ip) {
                prop_assert_eq!(result, Err(AllocError::NotInPool { ip }));
            } else if !imported.insert(ip) {
                prop_assert_eq!(result, Err(AllocError::InUse { ip }));
            } else {
                prop_assert_eq!(result, Ok(()));
            }
        }
        for family in FAMILIES {
            let mut handed_out = Vec::new();
            while let Ok(ip) = ledger.allocate(family) {
                prop_assert!(!imported.contains(&ip), "{} was imported, then allocated", ip);
                handed_out.push(ip);
            }
            let expected: Vec<IpAddr> = addresses
                .iter()
                .filter(|a| Family::of(**a) == family && !imported.contains(a))
                .copied()
                .collect();
            prop_assert_eq!(handed_out, expected);
        }
    }

    /// With the pool full, releasing some addresses makes exactly those available again,
    /// lowest first.
    #[test]
    fn release_makes_addresses_available_again(
        pool in pool(),
        releases in prop::collection::vec((family(), 0..WINDOW), 0..40),
    ) {
        let mut ledger = Ledger::new(&pool.ranges());
        let addresses = pool.addresses();
        for ip in &addresses {
            ledger.allocate_specific(*ip).unwrap();
        }
        let mut released = BTreeSet::new();
        for (family, offset) in releases {
            let ip = pool.addr(family, offset);
            let was_used = addresses.contains(&ip) && !released.contains(&ip);
            prop_assert_eq!(ledger.release(ip), was_used, "release {}", ip);
            released.insert(ip);
        }
        for family in FAMILIES {
            let mut again = Vec::new();
            while let Ok(ip) = ledger.allocate(family) {
                again.push(ip);
            }
            let expected: Vec<IpAddr> = released
                .iter()
                .filter(|a| Family::of(**a) == family && addresses.contains(a))
                .copied()
                .collect();
            prop_assert_eq!(again, expected);
        }
    }
}
