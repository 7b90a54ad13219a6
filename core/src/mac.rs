//! Ethernet (MAC) addresses as the agent reports and the controller relays them:
//! lower-case, colon-separated (`82:1e:30:b2:c7:74`), as `ip link` prints them.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A 48-bit Ethernet address.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Mac(pub [u8; 6]);

/// Text that is not `xx:xx:xx:xx:xx:xx` in hexadecimal.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a MAC address (`aa:bb:cc:dd:ee:ff`): {0}")]
pub struct MacError(pub String);

impl fmt::Display for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

impl FromStr for Mac {
    type Err = MacError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || MacError(s.chars().take(40).collect());
        let mut out = [0u8; 6];
        let mut parts = s.split(':');
        for byte in &mut out {
            let part = parts.next().ok_or_else(bad)?;
            if part.len() != 2 {
                return Err(bad());
            }
            *byte = u8::from_str_radix(part, 16).map_err(|_| bad())?;
        }
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(Mac(out))
    }
}

impl Serialize for Mac {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Mac {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// The virtual MAC of `ip` in a pool with `virtualMAC: true`: a locally administered
/// unicast address (first octet `0x02` for IPv4, `0x06` for IPv6) that names the IP and
/// nothing else, so it moves with the IP from node to node (a macvlan on the holder's LAN
/// interface carries both).
///
/// One MAC per IP, not per pool: the IPs of one pool are spread over the nodes, and one MAC
/// on two switch ports at once is no MAC at all. IPv4: `02:00` and the four octets
/// (`192.168.55.10` is `02:00:c0:a8:37:0a`), so no two IPv4 addresses share one. IPv6: `06`
/// and 40 bits of a stable hash of the address (a shared MAC needs two of the cluster's
/// virtual-MAC IPv6 addresses to collide: at 10,000 of them, one chance in 22,000).
pub fn virtual_mac(ip: IpAddr) -> Mac {
    match ip {
        IpAddr::V4(v4) => {
            let [a, b, c, d] = v4.octets();
            Mac([0x02, 0x00, a, b, c, d])
        }
        IpAddr::V6(_) => {
            let mut h = crate::hash::Fnv1a::new();
            h.write_ip(Some(ip));
            let [_, _, _, a, b, c, d, e] = h.finish_mixed().to_be_bytes();
            Mac([0x06, a, b, c, d, e])
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_virtual_mac_is_local_unicast_and_names_its_ip() {
        let v4 = virtual_mac("192.168.55.10".parse().unwrap());
        assert_eq!(v4.to_string(), "02:00:c0:a8:37:0a");
        let v6 = virtual_mac("2001:db8::10".parse().unwrap());
        let again = virtual_mac("2001:db8::10".parse().unwrap());
        assert_eq!(v6, again, "stable");
        assert_ne!(v6, virtual_mac("2001:db8::11".parse().unwrap()));
        assert_ne!(v6, virtual_mac("2001:db8:1::10".parse().unwrap()));
        for mac in [v4, v6] {
            assert_eq!(
                mac.0[0] & 0b11,
                0b10,
                "locally administered, unicast: {mac}"
            );
        }
        assert_ne!(v4.0[0], v6.0[0], "the families never share a MAC");
    }

    #[test]
    fn prints_and_reads_lower_case_colon_form() {
        let mac = Mac([0x82, 0x1e, 0x30, 0xb2, 0xc7, 0x04]);
        assert_eq!(mac.to_string(), "82:1e:30:b2:c7:04");
        assert_eq!("82:1E:30:b2:c7:04".parse::<Mac>().unwrap(), mac);
        for bad in [
            "",
            "82:1e:30:b2:c7",
            "82:1e:30:b2:c7:04:00",
            "82-1e-30-b2-c7-04",
            "8:1e:30:b2:c7:04a",
            "zz:1e:30:b2:c7:04",
        ] {
            assert!(bad.parse::<Mac>().is_err(), "{bad}");
        }
        let json = serde_json::to_string(&mac).unwrap();
        assert_eq!(json, r#""82:1e:30:b2:c7:04""#);
        assert_eq!(serde_json::from_str::<Mac>(&json).unwrap(), mac);
        assert!(serde_json::from_str::<Mac>(r#""nope""#).is_err());
    }
}
