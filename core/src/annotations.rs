//! Parsing of the Service annotations users write, e.g. `aliaslb.io/loadBalancerIPs`
//! (see [`crate::keys`] for the names). Pure, no I/O.

use std::net::IpAddr;

use crate::range::Family;

/// Why an annotation value is not valid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnnotationError {
    /// The value lists no address.
    #[error(
        "no address given: write one address per family, comma separated, e.g. `192.168.55.10,2001:db8::10`"
    )]
    Empty,
    /// Two commas with nothing between them (or a leading/trailing comma).
    #[error("empty item in `{value}`: remove the extra comma")]
    EmptyItem {
        /// The whole annotation value.
        value: String,
    },
    /// An item is not an IP address.
    #[error("`{item}` is not an IP address: write plain IPv4 or IPv6 addresses, comma separated")]
    NotAnAddress {
        /// The offending item.
        item: String,
    },
    /// Two addresses of the same family.
    #[error("{first} and {second} are both {family}: request at most one address per family")]
    SameFamily {
        /// Family of both.
        family: Family,
        /// First address of that family.
        first: IpAddr,
        /// Second address of that family.
        second: IpAddr,
    },
}

/// Parses `aliaslb.io/loadBalancerIPs`: comma-separated addresses, spaces allowed around
/// items, at most one per family. Returns them in the order written.
pub fn parse_ip_list(value: &str) -> Result<Vec<IpAddr>, AnnotationError> {
    if value.trim().is_empty() {
        return Err(AnnotationError::Empty);
    }
    let mut ips: Vec<IpAddr> = Vec::with_capacity(2);
    for item in value.split(',').map(str::trim) {
        if item.is_empty() {
            return Err(AnnotationError::EmptyItem {
                value: value.to_owned(),
            });
        }
        let ip: IpAddr = item.parse().map_err(|_| AnnotationError::NotAnAddress {
            item: item.to_owned(),
        })?;
        if let Some(&first) = ips.iter().find(|a| Family::of(**a) == Family::of(ip)) {
            return Err(AnnotationError::SameFamily {
                family: Family::of(ip),
                first,
                second: ip,
            });
        }
        ips.push(ip);
    }
    Ok(ips)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn accepts_one_per_family_in_order() {
        for (input, want) in [
            ("192.168.55.10", vec![ip("192.168.55.10")]),
            ("2001:db8::1", vec![ip("2001:db8::1")]),
            (
                " 2001:db8::1 , 10.0.0.1 ",
                vec![ip("2001:db8::1"), ip("10.0.0.1")],
            ),
        ] {
            assert_eq!(parse_ip_list(input), Ok(want), "{input}");
        }
    }

    #[test]
    fn rejects_bad_values_with_reason() {
        for (input, want) in [
            ("", "no address given"),
            ("  ", "no address given"),
            ("10.0.0.1,", "empty item in `10.0.0.1,`"),
            ("10.0.0.1,,::1", "empty item"),
            ("10.0.0.300", "`10.0.0.300` is not an IP address"),
            ("10.0.0.0/24", "`10.0.0.0/24` is not an IP address"),
            ("10.0.0.1,10.0.0.2", "10.0.0.1 and 10.0.0.2 are both IPv4"),
            ("::1,10.0.0.1,::2", "::1 and ::2 are both IPv6"),
        ] {
            let err = parse_ip_list(input).unwrap_err().to_string();
            assert!(err.contains(want), "{input:?}: {err}");
        }
    }
}
