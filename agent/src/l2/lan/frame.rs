//! Probe frames and the claim parser: small pure functions, golden-byte tested, no I/O.
//!
//! The parser reads only what decides a claim (RFC 5227 for ARP, RFC 4861/4862 for
//! neighbour discovery) and answers `None` to anything else, truncated or malformed: it
//! sees every ARP and ND frame on the link, from any host, and must never panic.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Instant;

use aliaslb_core::mac::Mac;

use super::{ClaimKind, LanClaim};
use crate::l2::announce::icmpv6_checksum;

/// Length of an ARP probe frame (Ethernet + ARP, no padding: the NIC pads).
pub const ARP_PROBE_FRAME_LEN: usize = 42;
/// Length of a DAD neighbour solicitation frame (Ethernet + IPv6 + NS, no option).
pub const DAD_NS_FRAME_LEN: usize = 78;

pub(crate) const ETHERTYPE_ARP: u16 = 0x0806;
pub(crate) const ETHERTYPE_IPV6: u16 = 0x86dd;
const ETH_HEADER: usize = 14;
const IPV6_HEADER: usize = 40;
/// Where the ICMPv6 message starts in an Ethernet frame carrying IPv6 without extension
/// headers (neighbour discovery never has any).
const ICMP_AT: usize = ETH_HEADER + IPV6_HEADER;
/// An NS or NA without options: type, code, checksum, flags/reserved, target.
const ND_MESSAGE_LEN: usize = 24;
const ICMPV6: u8 = 58;
pub(crate) const ICMPV6_NEIGHBOR_SOLICIT: u8 = 135;
pub(crate) const ICMPV6_NEIGHBOR_ADVERT: u8 = 136;
/// ND option: target link-layer address.
const ND_OPT_TARGET_LL: u8 = 2;
const ARP_REQUEST: u16 = 1;
const ARP_REPLY: u16 = 2;

/// An RFC 5227 §2.1.1 ARP probe for `target` from `mac`: a broadcast request with sender
/// IP 0.0.0.0 (so no host updates its cache from it) and target hardware address zero.
pub fn arp_probe_frame(mac: Mac, target: Ipv4Addr) -> [u8; ARP_PROBE_FRAME_LEN] {
    crate::l2::announce::arp_request_frame(mac.0, Ipv4Addr::UNSPECIFIED, target)
}

/// The solicited-node multicast address of `ip` (RFC 4291 §2.7.1): ff02::1:ffXX:XXXX
/// with the low 24 bits of `ip`.
pub fn solicited_node(ip: Ipv6Addr) -> Ipv6Addr {
    let o = ip.octets();
    Ipv6Addr::from([
        0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xff, o[13], o[14], o[15],
    ])
}

/// An RFC 4862 §5.4.2 duplicate address detection NS for `target` from `mac`: IPv6
/// source `::`, destination the target's solicited-node group (Ethernet 33:33:ff + low
/// 24 bits), hop limit 255, and no source link-layer address option (forbidden with an
/// unspecified source, RFC 4861 §4.3).
pub fn dad_ns_frame(mac: Mac, target: Ipv6Addr) -> Vec<u8> {
    let mut f = vec![0u8; DAD_NS_FRAME_LEN];
    let group = solicited_node(target);
    let g = group.octets();
    f[0..6].copy_from_slice(&[0x33, 0x33, g[12], g[13], g[14], g[15]]);
    f[6..12].copy_from_slice(&mac.0);
    f[12..14].copy_from_slice(&ETHERTYPE_IPV6.to_be_bytes());
    // Version 6, traffic class 0, flow label 0.
    f[14] = 0x60;
    let payload_len = u16::try_from(ND_MESSAGE_LEN).unwrap_or(u16::MAX);
    f[18..20].copy_from_slice(&payload_len.to_be_bytes());
    f[20] = ICMPV6;
    f[21] = 255;
    // Source (22..38) stays `::`.
    f[38..54].copy_from_slice(&g);
    f[ICMP_AT] = ICMPV6_NEIGHBOR_SOLICIT;
    f[ICMP_AT + 8..ICMP_AT + 24].copy_from_slice(&target.octets());
    let sum = icmpv6_checksum(Ipv6Addr::UNSPECIFIED, group, &f[ICMP_AT..]);
    f[ICMP_AT + 2..ICMP_AT + 4].copy_from_slice(&sum.to_be_bytes());
    f
}

/// The frame's Ethernet type, if it has an Ethernet header.
pub fn ethertype(frame: &[u8]) -> Option<u16> {
    Some(u16::from_be_bytes([*frame.get(12)?, *frame.get(13)?]))
}

/// The frame's Ethernet source, if it has an Ethernet header.
pub fn ethernet_source(frame: &[u8]) -> Option<Mac> {
    Some(Mac(frame.get(6..12)?.try_into().ok()?))
}

/// The claim `frame` (a whole Ethernet frame received on `ifindex` at `at`) makes, if any:
/// - ARP (Ethernet/IPv4 request or reply): sender IP set -> the sender hardware address
///   [`ClaimKind::Uses`] it (a request, a reply, a gratuitous ARP); sender IP 0.0.0.0 ->
///   it [`ClaimKind::Probes`] the target IP (RFC 5227 §2.1.1).
/// - ICMPv6 with hop limit 255 (RFC 4861 §7.1.2: anything else was forwarded, not sent on
///   this link) and a valid checksum: an NA -> its target link-layer option, else the
///   Ethernet source, uses the target; an NS from `::` (DAD, RFC 4862 §5.4.3) -> the
///   Ethernet source probes the target. Other solicitations only ask: no claim.
///
/// A sender hardware address that is zero or multicast claims nothing (no host has one).
pub fn parse_claim(frame: &[u8], ifindex: u32, at: Instant) -> Option<LanClaim> {
    let (ip, mac, kind) = match ethertype(frame)? {
        ETHERTYPE_ARP => parse_arp(frame)?,
        ETHERTYPE_IPV6 => parse_nd(frame)?,
        _ => return None,
    };
    if mac == Mac::default() || mac.0[0] & 1 == 1 {
        return None;
    }
    Some(LanClaim {
        ip,
        mac,
        ifindex,
        kind,
        at,
    })
}

fn parse_arp(frame: &[u8]) -> Option<(IpAddr, Mac, ClaimKind)> {
    let arp = frame.get(ETH_HEADER..ETH_HEADER + 28)?;
    // Ethernet hardware, IPv4 protocol, 6- and 4-byte addresses.
    if arp[0..6] != [0, 1, 0x08, 0x00, 6, 4] {
        return None;
    }
    let op = u16::from_be_bytes([arp[6], arp[7]]);
    if op != ARP_REQUEST && op != ARP_REPLY {
        return None;
    }
    let sender_mac = Mac(arp[8..14].try_into().ok()?);
    let sender_ip = ipv4(&arp[14..18])?;
    let target_ip = ipv4(&arp[24..28])?;
    if !sender_ip.is_unspecified() {
        Some((IpAddr::V4(sender_ip), sender_mac, ClaimKind::Uses))
    } else if !target_ip.is_unspecified() {
        Some((IpAddr::V4(target_ip), sender_mac, ClaimKind::Probes))
    } else {
        None
    }
}

fn parse_nd(frame: &[u8]) -> Option<(IpAddr, Mac, ClaimKind)> {
    let ip6 = frame.get(ETH_HEADER..ICMP_AT)?;
    if ip6[0] >> 4 != 6 || ip6[6] != ICMPV6 || ip6[7] != 255 {
        return None;
    }
    let payload_len = usize::from(u16::from_be_bytes([ip6[4], ip6[5]]));
    // Ethernet may pad a frame past the IPv6 payload: the payload length bounds it.
    let icmp = frame.get(ICMP_AT..ICMP_AT.checked_add(payload_len)?)?;
    if icmp.len() < ND_MESSAGE_LEN || icmp[1] != 0 {
        return None;
    }
    let src = ipv6(&ip6[8..24])?;
    let dst = ipv6(&ip6[24..40])?;
    if icmpv6_checksum(src, dst, icmp) != 0 {
        return None;
    }
    let target = ipv6(&icmp[8..24])?;
    if target.is_multicast() || target.is_unspecified() {
        return None;
    }
    let eth_src = ethernet_source(frame)?;
    match icmp[0] {
        ICMPV6_NEIGHBOR_ADVERT => {
            let mac = target_link_layer(&icmp[ND_MESSAGE_LEN..])?.unwrap_or(eth_src);
            Some((IpAddr::V6(target), mac, ClaimKind::Uses))
        }
        ICMPV6_NEIGHBOR_SOLICIT if src.is_unspecified() => {
            Some((IpAddr::V6(target), eth_src, ClaimKind::Probes))
        }
        _ => None,
    }
}

/// The target link-layer address among ND `options`: `Some(None)` when absent, `None`
/// when the options are malformed (RFC 4861 §4.6: a zero length invalidates the message).
fn target_link_layer(mut options: &[u8]) -> Option<Option<Mac>> {
    let mut found = None;
    while !options.is_empty() {
        let len = usize::from(*options.get(1)?) * 8;
        if len == 0 {
            return None;
        }
        let option = options.get(..len)?;
        if option[0] == ND_OPT_TARGET_LL && found.is_none() {
            found = Some(Mac(option.get(2..8)?.try_into().ok()?));
        }
        options = &options[len..];
    }
    Some(found)
}

fn ipv4(bytes: &[u8]) -> Option<Ipv4Addr> {
    Some(Ipv4Addr::from(<[u8; 4]>::try_from(bytes).ok()?))
}

fn ipv6(bytes: &[u8]) -> Option<Ipv6Addr> {
    Some(Ipv6Addr::from(<[u8; 16]>::try_from(bytes).ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::l2::announce::{garp_frame, unsolicited_na_frame};

    const MAC: Mac = Mac([0x02, 0x11, 0x22, 0x33, 0x44, 0x55]);
    const PEER: Mac = Mac([0x02, 0xaa, 0xbb, 0xcc, 0xdd, 0xee]);

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn claim(frame: &[u8]) -> Option<(IpAddr, Mac, ClaimKind)> {
        let at = Instant::now();
        parse_claim(frame, 7, at).map(|o| {
            assert_eq!((o.ifindex, o.at), (7, at));
            (o.ip, o.mac, o.kind)
        })
    }

    fn v4(s: &str) -> Ipv4Addr {
        s.parse().unwrap()
    }

    fn v6(s: &str) -> Ipv6Addr {
        s.parse().unwrap()
    }

    /// An ARP reply from `mac` for `ip` to `to` (what a kernel sends to a probe).
    fn arp_reply(mac: Mac, ip: Ipv4Addr, to: Mac) -> Vec<u8> {
        let mut f = garp_frame(mac.0, ip).to_vec();
        f[0..6].copy_from_slice(&to.0);
        f[21] = 2;
        f[32..38].copy_from_slice(&to.0);
        f[38..42].copy_from_slice(&[0; 4]);
        f
    }

    /// An NA from `src` for `target` with `options`, with a correct checksum.
    fn na(eth_src: Mac, src: Ipv6Addr, target: Ipv6Addr, options: &[u8]) -> Vec<u8> {
        icmp6(eth_src, src, ICMPV6_NEIGHBOR_ADVERT, target, options)
    }

    fn icmp6(eth_src: Mac, src: Ipv6Addr, kind: u8, target: Ipv6Addr, opts: &[u8]) -> Vec<u8> {
        let dst = v6("ff02::1");
        let mut f = vec![0x33, 0x33, 0, 0, 0, 1];
        f.extend_from_slice(&eth_src.0);
        f.extend_from_slice(&[0x86, 0xdd, 0x60, 0, 0, 0]);
        let len = u16::try_from(ND_MESSAGE_LEN + opts.len()).unwrap();
        f.extend_from_slice(&len.to_be_bytes());
        f.extend_from_slice(&[ICMPV6, 255]);
        f.extend_from_slice(&src.octets());
        f.extend_from_slice(&dst.octets());
        f.extend_from_slice(&[kind, 0, 0, 0, 0x60, 0, 0, 0]);
        f.extend_from_slice(&target.octets());
        f.extend_from_slice(opts);
        let sum = icmpv6_checksum(src, dst, &f[ICMP_AT..]);
        f[ICMP_AT + 2..ICMP_AT + 4].copy_from_slice(&sum.to_be_bytes());
        f
    }

    #[test]
    fn arp_probe_golden_bytes() {
        let f = arp_probe_frame(MAC, v4("10.0.0.50"));
        assert_eq!(
            hex(&f),
            concat!(
                "ffffffffffff",
                "021122334455",
                "0806",
                "0001080006040001",
                "021122334455",
                "00000000",
                "000000000000",
                "0a000032"
            )
        );
    }

    #[test]
    fn dad_ns_golden_bytes() {
        let f = dad_ns_frame(MAC, v6("fd00::50"));
        // Checksum 0x7d07 computed independently (Python, RFC 4443 pseudo-header).
        assert_eq!(
            hex(&f),
            concat!(
                "3333ff000050",
                "021122334455",
                "86dd",
                "60000000",
                "0018",
                "3a",
                "ff",
                "00000000000000000000000000000000",
                "ff0200000000000000000001ff000050",
                "87",
                "00",
                "7d07",
                "00000000",
                "fd000000000000000000000000000050",
            )
        );
    }

    #[test]
    fn solicited_node_takes_the_low_24_bits() {
        assert_eq!(
            solicited_node(v6("2001:db8::abcd:1234:5678")),
            v6("ff02::1:ff34:5678")
        );
    }

    #[test]
    fn arp_claims() {
        let ip = v4("10.0.0.50");
        let v = IpAddr::V4(ip);
        // A gratuitous ARP (our announcement) uses the IP.
        assert_eq!(
            claim(&garp_frame(PEER.0, ip)),
            Some((v, PEER, ClaimKind::Uses))
        );
        // A probe probes it.
        assert_eq!(
            claim(&arp_probe_frame(PEER, ip)),
            Some((v, PEER, ClaimKind::Probes))
        );
        // The kernel's answer to a probe: a reply with the IP as sender, target IP 0.
        assert_eq!(
            claim(&arp_reply(PEER, ip, MAC)),
            Some((v, PEER, ClaimKind::Uses))
        );
        // An ordinary request: the asker uses its own address.
        let mut ask = arp_probe_frame(PEER, v4("10.0.0.9"));
        ask[28..32].copy_from_slice(&[10, 0, 0, 1]);
        assert_eq!(
            claim(&ask),
            Some((IpAddr::V4(v4("10.0.0.1")), PEER, ClaimKind::Uses))
        );
        // Padded to the Ethernet minimum, as received from a NIC.
        let mut padded = garp_frame(PEER.0, ip).to_vec();
        padded.resize(60, 0);
        assert_eq!(claim(&padded), Some((v, PEER, ClaimKind::Uses)));
    }

    #[test]
    fn arp_that_claims_nothing() {
        let ip = v4("10.0.0.50");
        let mut f = arp_probe_frame(PEER, ip);
        f[38..42].copy_from_slice(&[0; 4]);
        assert_eq!(claim(&f), None, "sender and target 0.0.0.0");
        let mut f = garp_frame(PEER.0, ip);
        f[21] = 3;
        assert_eq!(claim(&f), None, "RARP operation");
        let mut f = garp_frame(PEER.0, ip);
        f[19] = 16;
        assert_eq!(claim(&f), None, "not 6-byte hardware addresses");
        let mut f = garp_frame(PEER.0, ip);
        f[16..18].copy_from_slice(&[0x86, 0xdd]);
        assert_eq!(claim(&f), None, "not IPv4");
        assert_eq!(claim(&garp_frame([0; 6], ip)), None, "zero sender MAC");
        assert_eq!(
            claim(&garp_frame([0xff; 6], ip)),
            None,
            "broadcast sender MAC"
        );
    }

    #[test]
    fn nd_claims() {
        let ip = v6("fd00:1::50");
        let v = IpAddr::V6(ip);
        // Our own unsolicited NA: target link-layer option.
        assert_eq!(
            claim(&unsolicited_na_frame(PEER.0, ip)),
            Some((v, PEER, ClaimKind::Uses))
        );
        // The option wins over the Ethernet source (a proxy or bridge may resend it).
        let opt = [2, 1, 2, 9, 9, 9, 9, 9];
        assert_eq!(
            claim(&na(PEER, ip, ip, &opt)),
            Some((v, Mac([2, 9, 9, 9, 9, 9]), ClaimKind::Uses))
        );
        // No option: the Ethernet source; other options are skipped.
        assert_eq!(
            claim(&na(PEER, ip, ip, &[])),
            Some((v, PEER, ClaimKind::Uses))
        );
        let nonce = [14, 1, 1, 2, 3, 4, 5, 6];
        assert_eq!(
            claim(&na(PEER, ip, ip, &nonce)),
            Some((v, PEER, ClaimKind::Uses))
        );
        // A DAD NS probes.
        assert_eq!(
            claim(&dad_ns_frame(PEER, ip)),
            Some((v, PEER, ClaimKind::Probes))
        );
    }

    #[test]
    fn nd_that_claims_nothing() {
        let ip = v6("fd00:1::50");
        // A resolving NS (source set) only asks.
        let ns = icmp6(PEER, v6("fd00:1::1"), ICMPV6_NEIGHBOR_SOLICIT, ip, &[]);
        assert_eq!(claim(&ns), None);
        // Hop limit not 255: forwarded from another link.
        let mut f = unsolicited_na_frame(PEER.0, ip);
        f[21] = 64;
        assert_eq!(claim(&f), None, "hop limit");
        let mut f = unsolicited_na_frame(PEER.0, ip);
        f[80] ^= 1;
        assert_eq!(claim(&f), None, "bad checksum");
        let mut f = unsolicited_na_frame(PEER.0, ip);
        f[55] = 1;
        assert_eq!(claim(&f), None, "code not 0");
        let zero_len = [2, 0, 2, 9, 9, 9, 9, 9];
        assert_eq!(claim(&na(PEER, ip, ip, &zero_len)), None, "zero option");
        let mcast = v6("ff02::1");
        assert_eq!(claim(&na(PEER, ip, mcast, &[])), None, "multicast target");
        let router_adv = icmp6(PEER, ip, 134, ip, &[]);
        assert_eq!(claim(&router_adv), None, "not NS/NA");
        let mut f = unsolicited_na_frame(PEER.0, ip);
        f[20] = 17;
        assert_eq!(claim(&f), None, "not ICMPv6");
        let mut f = unsolicited_na_frame(PEER.0, ip);
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        assert_eq!(claim(&f), None, "IPv4 ethertype");
    }

    #[test]
    fn every_truncation_is_rejected_without_panic() {
        let frames = [
            garp_frame(PEER.0, v4("10.0.0.50")).to_vec(),
            arp_probe_frame(PEER, v4("10.0.0.50")).to_vec(),
            unsolicited_na_frame(PEER.0, v6("fd00::50")).to_vec(),
            dad_ns_frame(PEER, v6("fd00::50")),
        ];
        for f in &frames {
            assert!(claim(f).is_some());
            for len in 0..f.len() {
                assert_eq!(claim(&f[..len]), None, "{} cut at {len}", hex(f));
            }
        }
        // An IPv6 payload length beyond the frame.
        let mut f = unsolicited_na_frame(PEER.0, v6("fd00::50"));
        f[18..20].copy_from_slice(&[0xff, 0xff]);
        assert_eq!(claim(&f), None);
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        // A small deterministic fuzz (xorshift): random frames, and real ones with random
        // bytes changed, through the parser.
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let seeds = [
            garp_frame(PEER.0, v4("10.0.0.50")).to_vec(),
            unsolicited_na_frame(PEER.0, v6("fd00::50")).to_vec(),
            na(
                PEER,
                v6("fd00::50"),
                v6("fd00::50"),
                &[2, 1, 1, 2, 3, 4, 5, 6, 3, 2],
            ),
        ];
        for i in 0..20_000u64 {
            let mut f = seeds[usize::try_from(i % 3).unwrap()].clone();
            for _ in 0..(next() % 4) {
                let at = usize::try_from(next() % f.len() as u64).unwrap();
                f[at] = u8::try_from(next() & 0xff).unwrap();
            }
            let cut = usize::try_from(next() % (f.len() as u64 + 8)).unwrap();
            f.resize(cut, 0);
            let _ = claim(&f);
        }
    }
}
