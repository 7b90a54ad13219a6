//! Inclusive address ranges, the unit pools and the allocator are built from.
//!
//! Both families are handled as integers (`u32` widened to `u128`), so a range costs
//! the same whether it holds four addresses or 2^64.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// IP family of an address or range.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    /// IPv4.
    V4,
    /// IPv6.
    V6,
}

impl Family {
    /// Family of `ip`.
    pub fn of(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        })
    }
}

/// The address as an integer (IPv4 widened to `u128`).
pub fn to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(u32::from(v4)),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

/// The address of `family` with integer value `n`.
///
/// # Panics
/// If `n` does not fit the family (more than 32 bits for IPv4): callers only pass values
/// taken from a range of that family.
pub fn from_u128(family: Family, n: u128) -> IpAddr {
    match family {
        Family::V4 => IpAddr::V4(Ipv4Addr::from(
            u32::try_from(n).expect("IPv4 value out of range"),
        )),
        Family::V6 => IpAddr::V6(Ipv6Addr::from(n)),
    }
}

/// An inclusive range `first..=last` of addresses of one family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IpRange {
    first: IpAddr,
    last: IpAddr,
}

/// Why two addresses do not make a range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RangeError {
    /// The two ends are of different families.
    #[error("{first} and {last} are not of the same IP family")]
    MixedFamilies {
        /// First address given.
        first: IpAddr,
        /// Last address given.
        last: IpAddr,
    },
    /// The last address is below the first.
    #[error(
        "range {first}-{last} is reversed: the first address must not be above the last (did you mean {last}-{first}?)"
    )]
    Reversed {
        /// First address given.
        first: IpAddr,
        /// Last address given.
        last: IpAddr,
    },
}

impl IpRange {
    /// The range `first..=last`; both of one family, `first <= last`.
    pub fn new(first: IpAddr, last: IpAddr) -> Result<Self, RangeError> {
        if Family::of(first) != Family::of(last) {
            return Err(RangeError::MixedFamilies { first, last });
        }
        if to_u128(first) > to_u128(last) {
            return Err(RangeError::Reversed { first, last });
        }
        Ok(Self { first, last })
    }

    /// The range holding only `ip`.
    pub fn single(ip: IpAddr) -> Self {
        Self {
            first: ip,
            last: ip,
        }
    }

    /// First address (inclusive).
    pub fn first(&self) -> IpAddr {
        self.first
    }

    /// Last address (inclusive).
    pub fn last(&self) -> IpAddr {
        self.last
    }

    /// Family of both ends.
    pub fn family(&self) -> Family {
        Family::of(self.first)
    }

    /// Number of addresses, saturating at `u128::MAX` (only `::/0` saturates).
    pub fn len(&self) -> u128 {
        (to_u128(self.last) - to_u128(self.first)).saturating_add(1)
    }

    /// Always false: a range holds at least one address. Present for clippy's sake.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Whether `ip` lies inside the range.
    pub fn contains(&self, ip: IpAddr) -> bool {
        Family::of(ip) == self.family() && {
            let n = to_u128(ip);
            to_u128(self.first) <= n && n <= to_u128(self.last)
        }
    }

    /// Whether the two ranges share at least one address.
    pub fn overlaps(&self, other: &IpRange) -> bool {
        self.family() == other.family()
            && to_u128(self.first) <= to_u128(other.last)
            && to_u128(other.first) <= to_u128(self.last)
    }
}

impl fmt::Display for IpRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.first == self.last {
            write!(f, "{}", self.first)
        } else {
            write!(f, "{}-{}", self.first, self.last)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn len_counts_both_ends_and_saturates() {
        assert_eq!(
            IpRange::new(ip("10.0.0.1"), ip("10.0.0.4")).unwrap().len(),
            4
        );
        assert_eq!(IpRange::single(ip("::1")).len(), 1);
        let all = IpRange::new(ip("::"), ip("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff")).unwrap();
        assert_eq!(all.len(), u128::MAX);
        let v6_64 = IpRange::new(ip("2001:db8::"), ip("2001:db8::ffff:ffff:ffff:ffff")).unwrap();
        assert_eq!(v6_64.len(), 1u128 << 64);
    }

    #[test]
    fn rejects_reversed_and_mixed() {
        let err = IpRange::new(ip("10.0.0.9"), ip("10.0.0.1")).unwrap_err();
        assert!(
            err.to_string().contains("did you mean 10.0.0.1-10.0.0.9"),
            "{err}"
        );
        assert!(matches!(
            IpRange::new(ip("10.0.0.1"), ip("::1")),
            Err(RangeError::MixedFamilies { .. })
        ));
    }

    #[test]
    fn contains_and_overlaps_respect_family() {
        let r = IpRange::new(ip("10.0.0.1"), ip("10.0.0.4")).unwrap();
        assert!(r.contains(ip("10.0.0.4")));
        assert!(!r.contains(ip("10.0.0.5")));
        assert!(!r.contains(ip("::a00:1")));
        assert!(r.overlaps(&IpRange::single(ip("10.0.0.4"))));
        assert!(!r.overlaps(&IpRange::single(ip("10.0.0.5"))));
        let v6 = IpRange::new(ip("::a00:1"), ip("::a00:4")).unwrap();
        assert!(!r.overlaps(&v6));
    }

    #[test]
    fn integer_round_trip() {
        for s in [
            "0.0.0.0",
            "192.168.55.10",
            "255.255.255.255",
            "::",
            "2001:db8::1",
        ] {
            let a = ip(s);
            assert_eq!(from_u128(Family::of(a), to_u128(a)), a);
        }
    }
}
