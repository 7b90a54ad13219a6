//! How many established TCP connections to an IP this node's conntrack carries: what a
//! drain window ends with (issue 45: the connections still open when the forwards stop
//! break, and are counted). Does I/O: one ctnetlink dump (`NETLINK_NETFILTER`) per address
//! family asked about, blocking (run it on a blocking thread). Needs `CAP_NET_ADMIN`, which
//! the agent has. [`tally`] is the pure part.
//!
//! The dump is the whole table of the family (a busy node's 100,000 entries are ~20 MB of
//! messages, read once per window end, not per packet); the kernel's own filters on a dump
//! are by mark and zone, not by address.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::net::IpAddr;

use netlink_packet_core::{
    NLM_F_DUMP, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload,
};
use netlink_packet_netfilter::conntrack::{
    ConntrackAttribute, ConntrackMessage, IPTuple, ProtoInfo, ProtoInfoTCP, ProtoTuple, Protocol,
    Tuple,
};
use netlink_packet_netfilter::{
    NetfilterHeader, NetfilterMessage, NetfilterMessageInner, NetfilterProtoFamily,
};
use netlink_sys::protocols::NETLINK_NETFILTER;
use netlink_sys::{Socket, SocketAddr};

/// The TCP conntrack state of an established connection (`TCP_CONNTRACK_ESTABLISHED`).
const ESTABLISHED: u8 = 3;

/// For each of `ips`, the established TCP connections whose original destination it is,
/// in this network namespace's conntrack.
pub fn established_to(ips: &BTreeSet<IpAddr>) -> io::Result<BTreeMap<IpAddr, usize>> {
    let mut counts: BTreeMap<IpAddr, usize> = ips.iter().map(|ip| (*ip, 0)).collect();
    for (family, wanted) in [
        (NetfilterProtoFamily::IPv4, ips.iter().any(IpAddr::is_ipv4)),
        (NetfilterProtoFamily::IPv6, ips.iter().any(IpAddr::is_ipv6)),
    ] {
        if wanted {
            for entry in dump(family)? {
                tally(&entry, &mut counts);
            }
        }
    }
    Ok(counts)
}

/// Counts `entry` in `counts` if it is an established TCP connection to one of its keys.
/// Pure.
pub fn tally(entry: &[ConntrackAttribute], counts: &mut BTreeMap<IpAddr, usize>) {
    let mut to = None;
    let mut tcp = false;
    let mut established = false;
    for attribute in entry {
        match attribute {
            ConntrackAttribute::CtaTupleOrig(tuple) => {
                for part in tuple {
                    match part {
                        Tuple::Ip(ip) => {
                            to = ip.iter().find_map(|a| match a {
                                IPTuple::DestinationAddress(d) => Some(*d),
                                _ => None,
                            });
                        }
                        Tuple::Proto(proto) => {
                            tcp = proto
                                .iter()
                                .any(|p| matches!(p, ProtoTuple::Protocol(Protocol::Tcp)));
                        }
                        _ => {}
                    }
                }
            }
            ConntrackAttribute::CtaProtoInfo(info) => {
                established = info.iter().any(|i| match i {
                    ProtoInfo::TCP(tcp) => tcp
                        .iter()
                        .any(|t| matches!(t, ProtoInfoTCP::State(ESTABLISHED))),
                    _ => false,
                });
            }
            _ => {}
        }
    }
    if let (Some(to), true, true) = (to, tcp, established)
        && let Some(n) = counts.get_mut(&to)
    {
        *n += 1;
    }
}

/// Every conntrack entry of `family`, as its attributes.
fn dump(family: NetfilterProtoFamily) -> io::Result<Vec<Vec<ConntrackAttribute>>> {
    let mut socket = Socket::new(NETLINK_NETFILTER)?;
    socket.bind_auto()?;
    socket.connect(&SocketAddr::new(0, 0))?;
    let mut header = NetlinkHeader::default();
    header.flags = NLM_F_REQUEST | NLM_F_DUMP;
    let mut request = NetlinkMessage::new(
        header,
        NetlinkPayload::from(NetfilterMessage::new(
            NetfilterHeader::new(family, 0, 0),
            ConntrackMessage::Get(Vec::new()),
        )),
    );
    request.finalize();
    let mut bytes = vec![0; request.buffer_len()];
    request.serialize(&mut bytes);
    socket.send(&bytes, 0)?;
    let mut entries = Vec::new();
    loop {
        let (datagram, _) = socket.recv_from_full()?;
        if datagram.is_empty() {
            return Ok(entries);
        }
        let mut at = 0;
        while at < datagram.len() {
            let message = NetlinkMessage::<NetfilterMessage>::deserialize(&datagram[at..])
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))?;
            let length = message.header.length as usize;
            match message.payload {
                NetlinkPayload::Done(_) => return Ok(entries),
                NetlinkPayload::Error(e) => {
                    return Err(e.code.map_or_else(
                        || io::Error::other("ctnetlink error"),
                        |c| io::Error::from_raw_os_error(-c.get()),
                    ));
                }
                NetlinkPayload::InnerMessage(NetfilterMessage {
                    inner:
                        NetfilterMessageInner::Conntrack(
                            ConntrackMessage::New(attributes) | ConntrackMessage::Get(attributes),
                        ),
                    ..
                }) => entries.push(attributes),
                _ => {}
            }
            if length == 0 {
                break;
            }
            at += length.next_multiple_of(4);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(to: &str, protocol: Protocol, state: u8) -> Vec<ConntrackAttribute> {
        vec![
            ConntrackAttribute::CtaTupleOrig(vec![
                Tuple::Ip(vec![
                    IPTuple::SourceAddress("10.0.0.9".parse().unwrap()),
                    IPTuple::DestinationAddress(to.parse().unwrap()),
                ]),
                Tuple::Proto(vec![
                    ProtoTuple::Protocol(protocol),
                    ProtoTuple::SourcePort(40000),
                    ProtoTuple::DestinationPort(80),
                ]),
            ]),
            ConntrackAttribute::CtaProtoInfo(vec![ProtoInfo::TCP(vec![ProtoInfoTCP::State(
                state,
            )])]),
        ]
    }

    #[test]
    fn only_established_tcp_to_the_ips_asked_about_counts() {
        let ip: IpAddr = "192.168.55.60".parse().unwrap();
        let mut counts = BTreeMap::from([(ip, 0)]);
        for e in [
            entry("192.168.55.60", Protocol::Tcp, ESTABLISHED),
            entry("192.168.55.60", Protocol::Tcp, ESTABLISHED),
            // Closing (TIME_WAIT = 7), another IP, UDP: not counted.
            entry("192.168.55.60", Protocol::Tcp, 7),
            entry("192.168.55.61", Protocol::Tcp, ESTABLISHED),
            entry("192.168.55.60", Protocol::Udp, ESTABLISHED),
        ] {
            tally(&e, &mut counts);
        }
        assert_eq!(counts, BTreeMap::from([(ip, 2)]));
    }
}
