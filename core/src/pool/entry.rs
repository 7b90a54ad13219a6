//! One pool value: its lines, and each entry (address, CIDR, range, each maybe followed by
//! `draining`) parsed into an [`IpRange`]. Pure, no I/O. The CIDR rules are documented in
//! the parent module.

use std::net::IpAddr;

use ipnet::IpNet;

use super::{DRAINING, PoolConfigError, PoolEntry};
use crate::range::{Family, IpRange, RangeError, from_u128, to_u128};

/// What a valid entry looks like, appended to "not an entry" errors.
const EXPECTED: &str = "expected an address (`192.168.55.10`, `2001:db8::10`), a CIDR \
                        (`10.0.7.0/29`) or an inclusive range (`10.0.8.20-10.0.8.40`)";

/// The entries of `key`'s `value`, and an error for each line that is not one.
pub(super) fn parse_value(key: &str, value: &str) -> (Vec<PoolEntry>, Vec<PoolConfigError>) {
    let mut entries = Vec::new();
    let mut errors = Vec::new();
    for (index, raw) in value.lines().enumerate() {
        let line = index + 1;
        let text = raw.split_once('#').map_or(raw, |(before, _)| before).trim();
        if text.is_empty() {
            continue;
        }
        let (text, draining) = split_draining(text);
        match parse_entry(text) {
            Ok(range) => entries.push(PoolEntry {
                line,
                text: text.to_owned(),
                range,
                draining,
            }),
            Err(message) => errors.push(PoolConfigError::for_line(key, line, text, message)),
        }
    }
    (entries, errors)
}

/// `text` without a trailing ` draining` (after spaces), and whether it had one.
fn split_draining(text: &str) -> (&str, bool) {
    match text.strip_suffix(DRAINING) {
        Some(entry) if entry.ends_with(char::is_whitespace) && !entry.trim().is_empty() => {
            (entry.trim_end(), true)
        }
        _ => (text, false),
    }
}

/// Parses one entry (without comment or surrounding spaces): an address, a CIDR or an
/// inclusive range `first-last`. The error says what is wrong and what would be valid.
pub fn parse_entry(text: &str) -> Result<IpRange, String> {
    let range = if let Some((first, last)) = text.split_once('-') {
        parse_range(first.trim(), last.trim())?
    } else if let Some((addr, prefix)) = text.split_once('/') {
        parse_cidr(addr, prefix)?
    } else if text.contains(|c: char| c.is_whitespace() || c == ',' || c == ';') {
        if let Some((_, word)) = text.rsplit_once(char::is_whitespace)
            && word.parse::<IpAddr>().is_err()
            && word.contains(|c: char| c.is_ascii_alphabetic())
            && !word.contains(['.', ':', '/'])
        {
            return Err(format!(
                "`{word}` is not a word an entry takes: the only one is `{DRAINING}`, after \
                 the entry (`10.0.7.0/29 {DRAINING}`)"
            ));
        }
        return Err("one entry per line: put each address, CIDR or range on its own line".into());
    } else {
        text.parse::<IpAddr>()
            .map(IpRange::single)
            .map_err(|_| format!("not an IP address, CIDR or range: {EXPECTED}"))?
    };
    reject_special(range)?;
    Ok(range)
}

/// Blocks no load-balancer IP can live in: a node answering for one of these would break
/// itself (loopback, unspecified), could not be reached (link-local is not routed) or is
/// not a unicast address at all (multicast, broadcast).
const SPECIAL: [(&str, &str, &str); 10] = [
    ("0.0.0.0", "0.255.255.255", "\"this network\" (0.0.0.0/8)"),
    ("127.0.0.0", "127.255.255.255", "loopback (127.0.0.0/8)"),
    (
        "169.254.0.0",
        "169.254.255.255",
        "link-local (169.254.0.0/16)",
    ),
    ("224.0.0.0", "239.255.255.255", "multicast (224.0.0.0/4)"),
    (
        "255.255.255.255",
        "255.255.255.255",
        "broadcast (255.255.255.255)",
    ),
    ("::", "::", "the unspecified address (::)"),
    ("::1", "::1", "loopback (::1)"),
    (
        "::ffff:0.0.0.0",
        "::ffff:255.255.255.255",
        "IPv4-mapped IPv6 (::ffff:0:0/96; write the IPv4 address itself)",
    ),
    (
        "fe80::",
        "febf:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
        "link-local (fe80::/10)",
    ),
    (
        "ff00::",
        "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
        "multicast (ff00::/8)",
    ),
];

fn reject_special(range: IpRange) -> Result<(), String> {
    for (first, last, what) in SPECIAL {
        let special = IpRange::new(first.parse().unwrap(), last.parse().unwrap())
            .expect("the special blocks are valid ranges");
        if range.overlaps(&special) {
            return Err(format!(
                "{range} includes {what}, which cannot be a load-balancer IP: \
                 use unicast addresses of a subnet your nodes are on"
            ));
        }
    }
    Ok(())
}

fn parse_range(first: &str, last: &str) -> Result<IpRange, String> {
    let end = |s: &str, which: &str| -> Result<IpAddr, String> {
        if s.is_empty() {
            return Err(format!(
                "the range has no {which} address: write both ends in full, e.g. \
                 `10.0.8.20-10.0.8.40`"
            ));
        }
        if s.contains('/') {
            return Err(format!(
                "`{s}`: the ends of a range are plain addresses, not CIDRs; write \
                 `first-last` or a CIDR on its own"
            ));
        }
        s.parse().map_err(|_| {
            format!(
                "`{s}` is not an IP address: write both ends of a range in full, e.g. \
                 `10.0.8.20-10.0.8.40`"
            )
        })
    };
    let (first, last) = (end(first, "first")?, end(last, "last")?);
    IpRange::new(first, last).map_err(|e| match e {
        RangeError::MixedFamilies { .. } => {
            format!("{e}: both ends of a range must be IPv4, or both IPv6")
        }
        RangeError::Reversed { .. } => e.to_string(),
    })
}

fn parse_cidr(addr: &str, prefix: &str) -> Result<IpRange, String> {
    let ip: IpAddr = addr
        .trim()
        .parse()
        .map_err(|_| format!("`{addr}` is not an IP address: {EXPECTED}"))?;
    let family = Family::of(ip);
    let max = match family {
        Family::V4 => 32,
        Family::V6 => 128,
    };
    let len: u8 = prefix
        .trim()
        .parse()
        .ok()
        .filter(|len| *len <= max)
        .ok_or_else(|| {
            format!("prefix length `/{prefix}` is not valid for {family}: use /0 to /{max}")
        })?;
    let net = IpNet::new(ip, len).map_err(|e| e.to_string())?;
    if net.network() != ip {
        return Err(format!(
            "the CIDR has host bits set: write the network form `{}`, or `{ip}` alone for a \
             single address",
            net.trunc()
        ));
    }
    let (mut first, mut last) = (to_u128(net.network()), to_u128(net.broadcast()));
    match family {
        // Network and broadcast addresses are special on the subnet; RFC 3021 /31s have neither.
        Family::V4 if len < 31 => {
            first += 1;
            last -= 1;
        }
        // The Subnet-Router anycast address (RFC 4291 §2.6.1); RFC 6164 /127s have none.
        Family::V6 if len < 127 => first += 1,
        _ => {}
    }
    IpRange::new(from_u128(family, first), from_u128(family, last)).map_err(|e| e.to_string())
}
