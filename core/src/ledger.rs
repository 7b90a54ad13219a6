//! The ledger of each pool: which of its addresses are in use (the allocator of a pass,
//! `plan/allocation.rs`, decides who gets which).
//!
//! Pure data, no I/O. The controller keeps one [`Ledger`] per namespace pool, imports the
//! assignments it reads back from Services at start-up, then allocates and releases as
//! Services come and go.
//!
//! Per family the ledger keeps two ordered maps of inclusive intervals (`start -> end`, as
//! integers): the pool's ranges, normalised so that they are disjoint and not adjacent, and
//! the addresses that are still free. Every operation is one or two `BTreeMap` look-ups
//! plus at most two inserts/removes, so O(log n) in the number of intervals; memory grows
//! with the number of ranges and allocations, never with the size of the pool (a /64 with
//! one address taken is two intervals).
//!
//! Because the ranges are merged when they touch, two free intervals that are numerically
//! adjacent always lie in one range: release can merge neighbours without looking at the
//! range boundaries, and never bridges a gap between ranges.
//!
//! **Closed ranges** (a pool's draining entries, [`Ledger::with_closed`]) are part of the
//! pool: their addresses can be imported and taken by name ([`Ledger::allocate_specific`],
//! which keeps what Services hold), but [`Ledger::allocate`] never hands one out: it skips
//! each closed range in one look-up, O(closed ranges x log n). [`Usage`] counts a closed
//! address only while it is in use.

use std::collections::BTreeMap;
use std::collections::btree_map;
use std::net::IpAddr;
use std::ops::RangeInclusive;

use crate::range::{Family, IpRange, from_u128, to_u128};

/// Which addresses of one pool are in use.
#[derive(Debug, Clone, Default)]
pub struct Ledger {
    v4: FamilyLedger,
    v6: FamilyLedger,
}

/// How many addresses of one family a pool holds, and how many of them are in use.
///
/// A closed (draining) address counts only while it is in use, in `total` and `in_use`
/// ([`Ledger::draining`] says how many): so `total - in_use` is what can still be handed
/// out, and a pool whose open addresses are all taken is full whatever it drains.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// Open addresses in the pool and closed ones in use, saturating at `u128::MAX` (only
    /// a pool of all of `::/0` does).
    pub total: u128,
    /// Addresses handed out (allocated or imported, not yet released).
    pub in_use: u128,
}

impl Usage {
    /// Addresses still available (off by one only for the saturated `::/0` total).
    pub fn free(&self) -> u128 {
        self.total.saturating_sub(self.in_use)
    }
}

/// Why an address could not be allocated. The messages end up in `kubectl describe`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocError {
    /// Every address of the family is in use.
    #[error(
        "pool exhausted: all {total} {family} addresses are in use; add addresses to the pool or delete a LoadBalancer Service that no longer needs one"
    )]
    Exhausted {
        /// Family asked for.
        family: Family,
        /// Size of the pool in that family.
        total: u128,
    },
    /// The pool holds no address of the family.
    #[error("the pool has no {family} addresses; add some to the pool or request the other family")]
    NoFamily {
        /// Family asked for.
        family: Family,
    },
    /// The requested address lies outside the pool.
    #[error(
        "{ip} is not in the pool; request an address from the pool or add {ip} to the pool first"
    )]
    NotInPool {
        /// Address requested.
        ip: IpAddr,
    },
    /// The requested address is already handed out.
    #[error("{ip} is already in use by another Service; request a different address")]
    InUse {
        /// Address requested.
        ip: IpAddr,
    },
}

impl Ledger {
    /// A ledger with every address of `ranges` free. The ranges may come in any order and
    /// may overlap or touch: they are merged.
    pub fn new(ranges: &[IpRange]) -> Ledger {
        Ledger::with_closed(ranges, &[])
    }

    /// A ledger of `ranges` whose addresses in `closed` are never handed out by
    /// [`Ledger::allocate`] (see the module docs); `closed` should lie inside `ranges`
    /// (what does not is ignored).
    pub fn with_closed(ranges: &[IpRange], closed: &[IpRange]) -> Ledger {
        let (v4, v6): (Vec<_>, Vec<_>) = ranges.iter().partition(|r| r.family() == Family::V4);
        let mut ledger = Ledger {
            v4: FamilyLedger::new(&v4),
            v6: FamilyLedger::new(&v6),
        };
        for range in closed {
            ledger.family_mut(range.family()).close(range);
        }
        ledger
    }

    /// Hands out the lowest free address of `family` that is not closed.
    pub fn allocate(&mut self, family: Family) -> Result<IpAddr, AllocError> {
        let ledger = self.family_mut(family);
        if ledger.ranges.is_empty() {
            return Err(AllocError::NoFamily { family });
        }
        let Some(n) = ledger.lowest_open_free() else {
            return Err(AllocError::Exhausted {
                family,
                total: ledger.total - ledger.closed_total,
            });
        };
        let ip = from_u128(family, n);
        ledger.take(n);
        Ok(ip)
    }

    /// Hands out `ip`, which must be in the pool and free (closed or not).
    pub fn allocate_specific(&mut self, ip: IpAddr) -> Result<(), AllocError> {
        let ledger = self.family_mut(Family::of(ip));
        let n = to_u128(ip);
        if !ledger.contains(n) {
            return Err(AllocError::NotInPool { ip });
        }
        if ledger.free_interval_holding(n).is_none() {
            return Err(AllocError::InUse { ip });
        }
        ledger.take(n);
        Ok(())
    }

    /// Whether the pool has addresses of `family` (closed or not).
    pub fn contains_family(&self, family: Family) -> bool {
        !self.family(family).ranges.is_empty()
    }

    /// Whether `ip` is in a closed range.
    pub fn is_closed(&self, ip: IpAddr) -> bool {
        self.family(Family::of(ip))
            .closed_holding(to_u128(ip))
            .is_some()
    }

    /// Records an assignment found in the cluster at start-up. Same checks as
    /// [`Ledger::allocate_specific`]: an address claimed twice comes back as
    /// [`AllocError::InUse`] and one outside the pool as [`AllocError::NotInPool`], so the
    /// controller can report the conflict instead of losing it.
    pub fn import(&mut self, ip: IpAddr) -> Result<(), AllocError> {
        self.allocate_specific(ip)
    }

    /// Makes `ip` available again. Returns whether it was in use (false for a free address
    /// or one outside the pool).
    pub fn release(&mut self, ip: IpAddr) -> bool {
        let ledger = self.family_mut(Family::of(ip));
        let n = to_u128(ip);
        if !ledger.contains(n) || ledger.free_interval_holding(n).is_some() {
            return false;
        }
        let mut start = n;
        let mut end = n;
        if let Some(below) = n.checked_sub(1)
            && let Some((&s, &e)) = ledger.free.range(..=below).next_back()
            && e == below
        {
            ledger.free.remove(&s);
            start = s;
        }
        if let Some(above) = n.checked_add(1)
            && let Some(e) = ledger.free.remove(&above)
        {
            end = e;
        }
        ledger.free.insert(start, end);
        ledger.in_use -= 1;
        if ledger.closed_holding(n).is_some() {
            ledger.closed_in_use -= 1;
        }
        true
    }

    /// Whether `ip` lies inside the pool.
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.family(Family::of(ip)).contains(to_u128(ip))
    }

    /// Whether `ip` is in the pool and handed out.
    pub fn is_in_use(&self, ip: IpAddr) -> bool {
        let ledger = self.family(Family::of(ip));
        let n = to_u128(ip);
        ledger.contains(n) && ledger.free_interval_holding(n).is_none()
    }

    /// Size and use of the pool in `family` (zero and zero for a family it lacks).
    pub fn usage(&self, family: Family) -> Usage {
        let ledger = self.family(family);
        Usage {
            total: (ledger.total - ledger.closed_total).saturating_add(ledger.closed_in_use),
            in_use: ledger.in_use,
        }
    }

    /// Closed (draining) addresses of `family` in use: left to move.
    pub fn draining(&self, family: Family) -> u128 {
        self.family(family).closed_in_use
    }

    /// Every address in use, ascending (IPv4 before IPv6).
    pub fn in_use(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.v4
            .used()
            .map(|n| from_u128(Family::V4, n))
            .chain(self.v6.used().map(|n| from_u128(Family::V6, n)))
    }

    fn family(&self, family: Family) -> &FamilyLedger {
        match family {
            Family::V4 => &self.v4,
            Family::V6 => &self.v6,
        }
    }

    fn family_mut(&mut self, family: Family) -> &mut FamilyLedger {
        match family {
            Family::V4 => &mut self.v4,
            Family::V6 => &mut self.v6,
        }
    }
}

/// The ledger of one family; addresses as integers, intervals inclusive.
#[derive(Debug, Clone, Default)]
struct FamilyLedger {
    /// Pool ranges, `start -> end`: disjoint and never adjacent.
    ranges: BTreeMap<u128, u128>,
    /// Free intervals, `start -> end`: each inside one range, disjoint and never adjacent.
    free: BTreeMap<u128, u128>,
    /// Addresses in `ranges`, saturating.
    total: u128,
    /// Addresses in `ranges` but not in `free`.
    in_use: u128,
    /// Closed intervals, `start -> end`: each inside one range, disjoint and never
    /// adjacent; [`Ledger::allocate`] hands none of their addresses out.
    closed: BTreeMap<u128, u128>,
    /// Addresses in `closed`, saturating.
    closed_total: u128,
    /// Addresses in `closed` but not in `free`.
    closed_in_use: u128,
}

impl FamilyLedger {
    fn new(ranges: &[&IpRange]) -> Self {
        let mut sorted: Vec<(u128, u128)> = ranges
            .iter()
            .map(|r| (to_u128(r.first()), to_u128(r.last())))
            .collect();
        sorted.sort_unstable();
        let mut merged: Vec<(u128, u128)> = Vec::with_capacity(sorted.len());
        for (start, end) in sorted {
            match merged.last_mut() {
                // Overlapping or touching: one range. `checked_add` is None only when the
                // previous range already reaches the top of the address space.
                Some((_, last_end)) if last_end.checked_add(1).is_none_or(|next| start <= next) => {
                    *last_end = (*last_end).max(end);
                }
                _ => merged.push((start, end)),
            }
        }
        let total = merged.iter().fold(0u128, |sum, &(s, e)| {
            sum.saturating_add((e - s).saturating_add(1))
        });
        let ranges: BTreeMap<u128, u128> = merged.into_iter().collect();
        FamilyLedger {
            free: ranges.clone(),
            ranges,
            total,
            in_use: 0,
            closed: BTreeMap::new(),
            closed_total: 0,
            closed_in_use: 0,
        }
    }

    /// Closes `range` (clipped to the ranges; a new ledger only: nothing in use yet).
    fn close(&mut self, range: &IpRange) {
        let (first, last) = (to_u128(range.first()), to_u128(range.last()));
        let pieces: Vec<(u128, u128)> = self
            .ranges
            .iter()
            .filter(|&(&s, &e)| s <= last && first <= e)
            .map(|(&s, &e)| (s.max(first), e.min(last)))
            .collect();
        for (mut start, mut end) in pieces {
            // Merge with closed intervals it overlaps or touches, inside the same range.
            let touching: Vec<(u128, u128)> = self
                .closed
                .iter()
                .filter(|&(&s, &e)| s <= end.saturating_add(1) && start <= e.saturating_add(1))
                .map(|(&s, &e)| (s, e))
                .collect();
            for (s, e) in touching {
                self.closed.remove(&s);
                self.closed_total = self.closed_total.saturating_sub((e - s).saturating_add(1));
                start = start.min(s);
                end = end.max(e);
            }
            self.closed.insert(start, end);
            self.closed_total = self
                .closed_total
                .saturating_add((end - start).saturating_add(1));
        }
    }

    /// The closed interval holding `n`, if any.
    fn closed_holding(&self, n: u128) -> Option<(u128, u128)> {
        self.closed
            .range(..=n)
            .next_back()
            .filter(|&(_, &end)| n <= end)
            .map(|(&start, &end)| (start, end))
    }

    /// The lowest free address outside the closed intervals: each step either finds one
    /// or jumps past a closed interval.
    fn lowest_open_free(&self) -> Option<u128> {
        let mut from = *self.free.keys().next()?;
        loop {
            let candidate = match self.free_interval_holding(from) {
                Some(_) => from,
                None => *self.free.range(from..).next()?.0,
            };
            match self.closed_holding(candidate) {
                Some((_, end)) => from = end.checked_add(1)?,
                None => return Some(candidate),
            }
        }
    }

    /// Marks the free address `n` in use.
    fn take(&mut self, n: u128) {
        let Some((start, end)) = self.free_interval_holding(n) else {
            return;
        };
        self.free.remove(&start);
        if start < n {
            self.free.insert(start, n - 1);
        }
        if n < end {
            self.free.insert(n + 1, end);
        }
        self.in_use += 1;
        if self.closed_holding(n).is_some() {
            self.closed_in_use += 1;
        }
    }

    fn contains(&self, n: u128) -> bool {
        self.ranges
            .range(..=n)
            .next_back()
            .is_some_and(|(_, &end)| n <= end)
    }

    /// The free interval holding `n`, if `n` is free.
    fn free_interval_holding(&self, n: u128) -> Option<(u128, u128)> {
        self.free
            .range(..=n)
            .next_back()
            .filter(|&(_, &end)| n <= end)
            .map(|(&start, &end)| (start, end))
    }

    /// Addresses in use, ascending: the gaps between free intervals inside each range.
    fn used(&self) -> impl Iterator<Item = u128> + '_ {
        self.ranges
            .iter()
            .flat_map(move |(&start, &end)| UsedGaps {
                free: self.free.range(start..=end),
                cursor: Some(start),
                end,
            })
            .flatten()
    }
}

/// Iterator over the used intervals of one range: what lies between its free intervals.
struct UsedGaps<'a> {
    /// Free intervals inside the range, ascending.
    free: btree_map::Range<'a, u128, u128>,
    /// First address not yet looked at; None once past the top of the address space.
    cursor: Option<u128>,
    /// Last address of the range.
    end: u128,
}

impl Iterator for UsedGaps<'_> {
    type Item = RangeInclusive<u128>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let cursor = self.cursor?;
            match self.free.next() {
                Some((&free_start, &free_end)) => {
                    self.cursor = free_end.checked_add(1);
                    if cursor < free_start {
                        return Some(cursor..=free_start - 1);
                    }
                }
                None => {
                    self.cursor = None;
                    return (cursor <= self.end).then_some(cursor..=self.end);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn range(first: &str, last: &str) -> IpRange {
        IpRange::new(ip(first), ip(last)).unwrap()
    }

    fn net(cidr: &str) -> IpRange {
        let net: ipnet::IpNet = cidr.parse().unwrap();
        IpRange::new(net.network(), net.broadcast()).unwrap()
    }

    fn ledger(ranges: &[IpRange]) -> Ledger {
        Ledger::new(ranges)
    }

    fn allocate_n(ledger: &mut Ledger, family: Family, n: usize) -> Vec<String> {
        (0..n)
            .map(|_| ledger.allocate(family).unwrap().to_string())
            .collect()
    }

    #[test]
    fn lowest_free_across_unsorted_ranges() {
        let mut l = ledger(&[range("10.0.1.5", "10.0.1.6"), range("10.0.0.1", "10.0.0.2")]);
        assert_eq!(
            allocate_n(&mut l, Family::V4, 4),
            ["10.0.0.1", "10.0.0.2", "10.0.1.5", "10.0.1.6"]
        );
        assert_eq!(
            l.allocate(Family::V4),
            Err(AllocError::Exhausted {
                family: Family::V4,
                total: 4
            })
        );
    }

    #[test]
    fn released_hole_is_refilled_first() {
        let mut l = ledger(&[net("10.0.0.0/29")]);
        allocate_n(&mut l, Family::V4, 5);
        assert!(l.release(ip("10.0.0.2")));
        assert!(l.release(ip("10.0.0.1")));
        assert!(!l.release(ip("10.0.0.1")), "second release is a no-op");
        assert_eq!(
            allocate_n(&mut l, Family::V4, 3),
            ["10.0.0.1", "10.0.0.2", "10.0.0.5"]
        );
    }

    #[test]
    fn overlapping_and_touching_ranges_are_merged() {
        let l = ledger(&[
            range("10.0.0.1", "10.0.0.5"),
            range("10.0.0.3", "10.0.0.8"),
            range("10.0.0.9", "10.0.0.9"),
            range("10.0.0.11", "10.0.0.11"),
        ]);
        assert_eq!(l.usage(Family::V4).total, 10);
        assert_eq!(l.v4.ranges.len(), 2);
        assert!(l.contains(ip("10.0.0.9")));
        assert!(!l.contains(ip("10.0.0.10")));
    }

    #[test]
    fn release_does_not_bridge_a_gap_between_ranges() {
        let mut l = ledger(&[range("10.0.0.1", "10.0.0.1"), range("10.0.0.3", "10.0.0.3")]);
        l.allocate_specific(ip("10.0.0.1")).unwrap();
        assert!(!l.release(ip("10.0.0.2")), "10.0.0.2 is outside the pool");
        assert!(l.release(ip("10.0.0.1")));
        assert_eq!(allocate_n(&mut l, Family::V4, 2), ["10.0.0.1", "10.0.0.3"]);
        assert!(l.allocate(Family::V4).is_err());
    }

    #[test]
    fn slash_31_and_single_address() {
        let mut l = ledger(&[net("192.168.0.0/31"), net("192.168.5.5/32")]);
        assert_eq!(
            allocate_n(&mut l, Family::V4, 3),
            ["192.168.0.0", "192.168.0.1", "192.168.5.5"]
        );
        let mut single = ledger(&[IpRange::single(ip("192.168.5.5"))]);
        assert_eq!(single.allocate_specific(ip("192.168.5.5")), Ok(()));
        assert_eq!(
            single.allocate_specific(ip("192.168.5.5")),
            Err(AllocError::InUse {
                ip: ip("192.168.5.5")
            })
        );
        assert!(single.release(ip("192.168.5.5")));
        assert_eq!(single.allocate(Family::V4), Ok(ip("192.168.5.5")));
    }

    #[test]
    fn both_families_in_one_pool() {
        let mut l = ledger(&[net("2001:db8::/126"), net("10.0.0.0/30")]);
        assert_eq!(l.allocate(Family::V6), Ok(ip("2001:db8::")));
        assert_eq!(l.allocate(Family::V4), Ok(ip("10.0.0.0")));
        l.allocate_specific(ip("2001:db8::3")).unwrap();
        assert_eq!(
            l.in_use().map(|a| a.to_string()).collect::<Vec<_>>(),
            ["10.0.0.0", "2001:db8::", "2001:db8::3"]
        );
        assert_eq!(
            l.usage(Family::V4),
            Usage {
                total: 4,
                in_use: 1
            }
        );
        assert_eq!(l.usage(Family::V6).free(), 2);
        // 10.0.0.1 as an IPv4-mapped IPv6 address is not the IPv4 address.
        assert!(!l.contains(ip("::ffff:10.0.0.1")));
    }

    #[test]
    fn missing_family_and_errors_read_plainly() {
        let mut l = ledger(&[net("10.0.0.0/31")]);
        let err = l.allocate(Family::V6).unwrap_err();
        assert_eq!(err, AllocError::NoFamily { family: Family::V6 });
        assert!(
            err.to_string()
                .starts_with("the pool has no IPv6 addresses"),
            "{err}"
        );
        allocate_n(&mut l, Family::V4, 2);
        let err = l.allocate(Family::V4).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("pool exhausted: all 2 IPv4 addresses are in use"),
            "{err}"
        );
        let err = l.allocate_specific(ip("10.0.0.7")).unwrap_err();
        assert_eq!(err, AllocError::NotInPool { ip: ip("10.0.0.7") });
        assert!(
            err.to_string().starts_with("10.0.0.7 is not in the pool"),
            "{err}"
        );
        let err = l.import(ip("10.0.0.1")).unwrap_err();
        assert_eq!(err, AllocError::InUse { ip: ip("10.0.0.1") });
        assert!(
            err.to_string().starts_with("10.0.0.1 is already in use"),
            "{err}"
        );
    }

    #[test]
    fn usage_on_a_slash_64_and_the_whole_v6_space() {
        let mut l = ledger(&[net("2001:db8::/64")]);
        l.allocate(Family::V6).unwrap();
        l.allocate_specific(ip("2001:db8::ffff:ffff:ffff:ffff"))
            .unwrap();
        let usage = l.usage(Family::V6);
        assert_eq!(usage.total, 1u128 << 64);
        assert_eq!(usage.in_use, 2);
        assert_eq!(usage.free(), (1u128 << 64) - 2);

        let mut all = ledger(&[net("::/0"), net("2001:db8::/64")]);
        assert_eq!(all.usage(Family::V6).total, u128::MAX);
        assert_eq!(all.allocate(Family::V6), Ok(ip("::")));
        let top = ip("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff");
        all.import(top).unwrap();
        assert_eq!(all.in_use().collect::<Vec<_>>(), [ip("::"), top]);
        assert!(all.release(top));
        assert!(all.release(ip("::")));
        assert_eq!(
            all.v6.free.len(),
            1,
            "releases merge back into one interval"
        );
        assert_eq!(all.usage(Family::V6).in_use, 0);
    }

    #[test]
    fn closed_ranges_are_never_handed_out_but_kept_and_counted_while_in_use() {
        // 10.0.0.0/30 and .8-.11 open around a closed 10.0.0.4-10.0.0.7 and a closed IPv6 /64.
        let ranges = [
            range("10.0.0.0", "10.0.0.11"),
            net("2001:db8::/64"),
            range("2001:db9::1", "2001:db9::2"),
        ];
        let mut l = Ledger::with_closed(
            &ranges,
            &[range("10.0.0.4", "10.0.0.7"), net("2001:db8::/64")],
        );
        // What a Service holds in a closed range is imported and counted.
        l.import(ip("10.0.0.5")).unwrap();
        assert!(l.is_closed(ip("10.0.0.5")) && !l.is_closed(ip("10.0.0.3")));
        assert_eq!(
            allocate_n(&mut l, Family::V4, 8),
            [
                "10.0.0.0",
                "10.0.0.1",
                "10.0.0.2",
                "10.0.0.3",
                "10.0.0.8",
                "10.0.0.9",
                "10.0.0.10",
                "10.0.0.11"
            ],
            "the lowest open address, each closed range skipped"
        );
        assert_eq!(
            l.allocate(Family::V4),
            Err(AllocError::Exhausted {
                family: Family::V4,
                total: 8
            })
        );
        assert_eq!(
            l.usage(Family::V4),
            Usage {
                total: 9,
                in_use: 9
            }
        );
        assert_eq!(l.draining(Family::V4), 1);
        assert_eq!(l.usage(Family::V4).free(), 0);
        // Released: gone from the counts, and still not handed out.
        assert!(l.release(ip("10.0.0.5")));
        assert_eq!(
            l.usage(Family::V4),
            Usage {
                total: 8,
                in_use: 8
            }
        );
        assert_eq!(l.draining(Family::V4), 0);
        assert!(l.allocate(Family::V4).is_err());
        // A closed address can still be taken by name (a Service keeps what it has).
        l.allocate_specific(ip("10.0.0.6")).unwrap();
        assert_eq!(l.draining(Family::V4), 1);
        // The closed /64 is skipped in one step.
        assert_eq!(l.allocate(Family::V6), Ok(ip("2001:db9::1")));
        assert_eq!(
            l.usage(Family::V6),
            Usage {
                total: 2,
                in_use: 1
            }
        );
        // All closed: nothing is handed out, nothing counted.
        let mut all = Ledger::with_closed(&[net("10.1.0.0/30")], &[net("10.1.0.0/30")]);
        assert!(all.allocate(Family::V4).is_err());
        assert_eq!(
            all.usage(Family::V4),
            Usage {
                total: 0,
                in_use: 0
            }
        );
        assert!(all.contains_family(Family::V4) && !all.contains_family(Family::V6));
    }

    #[test]
    fn memory_follows_allocations_not_pool_size() {
        let mut l = ledger(&[net("2001:db8::/64"), net("10.0.0.0/8")]);
        for _ in 0..10_000 {
            l.allocate(Family::V6).unwrap();
            l.allocate(Family::V4).unwrap();
        }
        // Lowest-first allocation keeps one free interval per range however many are taken.
        assert_eq!(l.v6.free.len(), 1);
        assert_eq!(l.v4.free.len(), 1);
        // Scattered requests split intervals: at most one more interval per allocation.
        for i in 0..1_000u128 {
            l.allocate_specific(from_u128(Family::V6, to_u128(ip("2001:db8::1:0")) + 7 * i))
                .unwrap();
        }
        assert!(l.v6.free.len() <= 1 + 1_000, "{}", l.v6.free.len());
        assert_eq!(l.usage(Family::V6).in_use, 11_000);
        assert_eq!(l.in_use().count(), 21_000);
    }
}
