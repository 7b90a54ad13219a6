//! Where the agent touches the kernel's addresses: the only module that imports rtnetlink
//! and netlink-packet-route. Does I/O (netlink sockets).
//!
//! Owns:
//! - the ownership marker: every alias is added with IFA_PROTO = [`ALIAS_PROTO`] and, for
//!   IPv4 when it fits, the label `<ifname>:alb`; only addresses carrying one of them are
//!   ever considered ours;
//! - [`NetlinkBackend`], the real [`AddressBackend`]: dump, add (with a non-permanent
//!   lifetime, IPv6 with IFA_F_NODAD), delete, refresh; the address writes go to the kernel
//!   up to [`BATCH`] per message, on a socket of their own (`WriteSocket`);
//! - the macvlans of virtual MACs, with the settings L2 mode's `vmac` module explains;
//! - [`watch_changes`], the stream of "something changed" ticks the run loop selects on.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use netlink_packet_route::address::{
    AddressAttribute, AddressFlags, AddressHeaderFlags, AddressMessage, AddressProtocol,
    AddressScope, CacheInfo,
};
use netlink_packet_route::link::{
    AfSpecInet, AfSpecInet6, AfSpecUnspec, In6AddrGenMode, InetDevConf, LinkAttribute, LinkFlags,
    LinkInfo, LinkMessage, MacVlanMode,
};
use netlink_packet_route::route::{
    RouteAttribute, RouteMessage, RouteProtocol, RouteScope, RouteType,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use rtnetlink::packet_core::{
    DecodeError, NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE, NLM_F_REQUEST, NetlinkMessage,
    NetlinkPayload,
};
use rtnetlink::sys::protocols::NETLINK_ROUTE;
use rtnetlink::sys::{AsyncSocket, AsyncSocketExt, SocketAddr, TokioSocket};
use rtnetlink::{AddressMessageBuilder, Handle, MulticastGroup};
use tokio::sync::{Mutex, mpsc};
use tracing::{debug, warn};

use crate::kernel::backend::{AddressBackend, BATCH, BackendError, Lifetime, Write};
use aliaslb_core::report::InterfaceReport;

use crate::host::{Alias, HostAddress, HostState, Link};
use crate::kernel::backend::NewMacvlan;

/// IFA_PROTO value marking the addresses aliaslb added (0xa1, "aliaslb").
///
/// The kernel (5.18+) stores it and dumps it back (`ip addr` shows `proto 0xa1`). Values
/// 0-3 are the kernel's own (unspec, loopback, RA, link-local); 0xa1 is used by no known
/// tool.
pub const ALIAS_PROTO: u8 = 0xa1;

/// Suffix of the IPv4 label marking our aliases: `<ifname>:alb`.
pub const LABEL_SUFFIX: &str = ":alb";

/// Longest label the kernel keeps (IFNAMSIZ - 1).
const MAX_LABEL_LEN: usize = 15;

// Errnos, Linux values (the agent only runs on Linux).
const ENOENT: i32 = 2;
const ESRCH: i32 = 3;
const EEXIST: i32 = 17;
const ENODEV: i32 = 19;
const EADDRNOTAVAIL: i32 = 99;

/// Main routing table id.
const RT_TABLE_MAIN: u8 = 254;

/// Receive buffer asked for the notification socket: a burst of 1,000 alias changes must
/// not overflow it (capped by `net.core.rmem_max`; an overflow still yields a tick).
const WATCH_RCVBUF: usize = 4 << 20;

/// The IPv4 label for an alias on `ifname`: `<ifname>:alb`, or `None` when that would
/// exceed 15 characters (labels must start with the interface name, so a long name
/// leaves no room; IFA_PROTO alone marks those).
pub fn alias_label(ifname: &str) -> Option<String> {
    let label = format!("{ifname}{LABEL_SUFFIX}");
    (label.len() <= MAX_LABEL_LEN).then_some(label)
}

/// The real address backend, over one rtnetlink connection of the calling thread's
/// network namespace, and one socket of the same namespace for the address writes.
#[derive(Debug, Clone)]
pub struct NetlinkBackend {
    handle: Handle,
    writes: Arc<Mutex<WriteSocket>>,
}

impl NetlinkBackend {
    /// Opens a netlink connection in the current network namespace and spawns its driver
    /// on the current tokio runtime.
    pub fn connect() -> Result<Self, BackendError> {
        let (mut conn, handle, _) = rtnetlink::new_connection().map_err(BackendError::Connect)?;
        // Strict dump requests (NETLINK_GET_STRICT_CHK, Linux 4.20+): the kernel then
        // honours the table and type asked for in a route dump, and skips the local
        // table, which holds one route per alias (with 1,000 aliases, reading those was
        // about half of the observe step). Older kernels refuse the option and dump every
        // table; `default_route` filters in both cases.
        if let Err(e) = conn
            .socket_mut()
            .socket_mut()
            .set_netlink_get_strict_chk(true)
        {
            debug!(error = %e, "no strict netlink dumps: route dumps list every table");
        }
        tokio::spawn(conn);
        // Opened here, in the caller's namespace: the tokio thread of a later write may
        // live in another one.
        let writes = Arc::new(Mutex::new(
            WriteSocket::open().map_err(BackendError::Connect)?,
        ));
        Ok(NetlinkBackend { handle, writes })
    }

    /// L3 mode: the local device for routed addresses. `name` if it exists (set up);
    /// otherwise a dummy interface `name` is created and set up; where that fails (the
    /// kernel has no dummy driver) the loopback `lo`, which every kernel has, and the
    /// error saying why. Never fails: `lo` is always there.
    pub async fn routed_device(&self, name: &str) -> (String, Option<BackendError>) {
        if name == "lo" {
            return ("lo".to_owned(), None);
        }
        let step = match self.find_link(name).await {
            // There already (ours from an earlier run, or the operator's): make sure it is up.
            Ok(Some(link)) => {
                let up = rtnetlink::LinkUnspec::new_with_index(link.header.index)
                    .up()
                    .build();
                self.handle
                    .link()
                    .change(up)
                    .execute()
                    .await
                    .map_err(|e| kernel("set up", name.into(), e))
            }
            _ => {
                let dummy = rtnetlink::LinkDummy::new(name).up().build();
                self.handle
                    .link()
                    .add(dummy)
                    .execute()
                    .await
                    .map_err(|e| kernel("create dummy", name.into(), e))
            }
        };
        if let Err(e) = step {
            return ("lo".to_owned(), Some(e));
        }
        (name.to_owned(), None)
    }

    /// The node's interfaces with their connected subnets (non-alias, global scope), for
    /// the Lease report and node election.
    pub async fn interfaces(&self) -> Result<Vec<InterfaceReport>, BackendError> {
        Ok(crate::host::interfaces(&self.snapshot().await?))
    }

    async fn links(&self) -> Result<Vec<Link>, BackendError> {
        let msgs: Vec<LinkMessage> = self
            .handle
            .link()
            .get()
            .execute()
            .try_collect()
            .await
            .map_err(|e| kernel("dump links", "-".into(), e))?;
        Ok(msgs.iter().map(parse_link).collect())
    }

    async fn addresses(&self) -> Result<Vec<HostAddress>, BackendError> {
        let msgs: Vec<AddressMessage> = self
            .handle
            .address()
            .get()
            .execute()
            .try_collect()
            .await
            .map_err(|e| kernel("dump addresses", "-".into(), e))?;
        Ok(msgs.iter().filter_map(parse_address).collect())
    }

    async fn default_route(&self, query: RouteMessage) -> Result<Option<u32>, BackendError> {
        let msgs: Vec<RouteMessage> = self
            .handle
            .route()
            .get(query)
            .execute()
            .try_collect()
            .await
            .map_err(|e| kernel("dump routes", "-".into(), e))?;
        Ok(msgs
            .iter()
            .filter(|r| {
                r.header.destination_prefix_length == 0
                    && r.header.table == RT_TABLE_MAIN
                    && r.header.kind == RouteType::Unicast
            })
            .filter_map(|r| Some((route_priority(r), route_oif(r)?)))
            .min()
            .map(|(_, oif)| oif))
    }
}

/// The address message of `alias` alone: interface, address and prefix length.
fn address_message(alias: &Alias) -> AddressMessage {
    match alias.ip {
        IpAddr::V4(ip) => AddressMessageBuilder::<Ipv4Addr>::new()
            .index(alias.ifindex)
            .address(ip, alias.prefix_len())
            .build(),
        IpAddr::V6(ip) => AddressMessageBuilder::<Ipv6Addr>::new()
            .index(alias.ifindex)
            .address(ip, alias.prefix_len())
            .build(),
    }
}

/// The request of `write` on `alias`, with the flags that make it an add (new only), a
/// refresh (replace, or create) or a delete. Adds and refreshes carry the ownership
/// marker, `lifetime` and, for IPv6, no duplicate address detection.
fn write_request(write: Write, alias: &Alias) -> NetlinkMessage<RouteNetlinkMessage> {
    let mut msg = address_message(alias);
    let (payload, flags) = match write {
        Write::Delete => (RouteNetlinkMessage::DelAddress(msg), 0),
        Write::Add(lifetime) | Write::Refresh(lifetime) => {
            let mut cache_info = CacheInfo::default();
            cache_info.ifa_preferred = preferred_lifetime(alias.ip, lifetime);
            cache_info.ifa_valid = lifetime.seconds;
            msg.attributes.push(AddressAttribute::CacheInfo(cache_info));
            msg.attributes
                .push(AddressAttribute::Protocol(AddressProtocol::from(
                    ALIAS_PROTO,
                )));
            match alias.ip {
                IpAddr::V4(_) => {
                    if let Some(label) = alias_label(&alias.ifname) {
                        msg.attributes.push(AddressAttribute::Label(label));
                    }
                }
                IpAddr::V6(_) => {
                    // No duplicate address detection: the alias is usable at once (a
                    // tentative address cannot be used as a source and is not answered for).
                    msg.header.flags |= AddressHeaderFlags::Nodad;
                    msg.attributes
                        .push(AddressAttribute::Flags(AddressFlags::Nodad));
                }
            }
            let how = if matches!(write, Write::Add(_)) {
                NLM_F_EXCL
            } else {
                NLM_F_REPLACE
            };
            (RouteNetlinkMessage::NewAddress(msg), NLM_F_CREATE | how)
        }
    };
    let mut req = NetlinkMessage::from(payload);
    req.header.flags = NLM_F_REQUEST | NLM_F_ACK | flags;
    req
}

/// What the kernel's answer to `write` on `alias` means to the reconcile: `Ok(true)`
/// changed, `Ok(false)` already so (EEXIST on add; EADDRNOTAVAIL, ENOENT or ESRCH on
/// delete).
fn write_outcome(
    write: Write,
    alias: &Alias,
    answer: Option<io::Result<()>>,
) -> Result<bool, BackendError> {
    let refused = match answer {
        Some(Ok(())) => return Ok(true),
        Some(Err(e)) => e,
        None => {
            return Err(BackendError::Protocol {
                op: write.op(),
                detail: format!("{alias}: the kernel's answer was lost"),
            });
        }
    };
    match (write, refused.raw_os_error()) {
        (Write::Add(_), Some(EEXIST)) => Ok(false),
        (Write::Delete, Some(EADDRNOTAVAIL | ENOENT | ESRCH)) => Ok(false),
        _ => Err(BackendError::Kernel {
            op: write.op(),
            target: alias.to_string(),
            source: refused,
        }),
    }
}

/// The socket the address writes go through, many to a `send` ([`NetlinkBackend`]'s
/// `write_all`): the kernel handles the requests of one message in order, within that
/// `send`, and queues one answer per request; they are read back by sequence number.
/// rtnetlink makes a `send` per request and wakes its caller once per answer: about 50 µs
/// of ours per address (BENCHMARKS, "The agent's first sync").
struct WriteSocket {
    socket: TokioSocket,
    /// Sequence number of the next request.
    next_seq: u32,
    /// The batch being sent, reused.
    out: Vec<u8>,
    /// An answer being read, reused.
    answer: Vec<u8>,
}

impl std::fmt::Debug for WriteSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteSocket")
            .field("next_seq", &self.next_seq)
            .finish_non_exhaustive()
    }
}

/// Room for the largest answer: an error answer quotes the request (without
/// NETLINK_CAP_ACK) and may add the kernel's explanation.
const ANSWER_ROOM: usize = 64 << 10;

impl WriteSocket {
    /// A route netlink socket of the current namespace, talking to the kernel.
    fn open() -> io::Result<Self> {
        let mut socket = TokioSocket::new(NETLINK_ROUTE)?;
        let raw = socket.socket_mut();
        raw.bind_auto()?;
        raw.connect(&SocketAddr::new(0, 0))?;
        // Refusals without a copy of the request: smaller answers. Older kernels (< 4.3)
        // refuse the option and quote it; both are read.
        let _ = raw.set_cap_ack(true);
        Ok(WriteSocket {
            socket,
            next_seq: 1,
            out: Vec::new(),
            answer: Vec::with_capacity(ANSWER_ROOM),
        })
    }

    /// Sends `requests` (at most [`BATCH`]) in one message and reads their answers: for
    /// each request in order, `Ok` acknowledged, `Err` refused with the kernel's errno,
    /// `None` when no answer could be read (the error that stopped the reading is
    /// logged). Answers to an earlier batch given up on (its caller timed out) are
    /// skipped by their sequence numbers.
    async fn send(
        &mut self,
        requests: impl ExactSizeIterator<Item = NetlinkMessage<RouteNetlinkMessage>>,
    ) -> Vec<Option<io::Result<()>>> {
        let first = self.next_seq;
        let n = requests.len();
        self.next_seq = first.wrapping_add(n as u32);
        self.out.clear();
        for (i, mut req) in requests.enumerate() {
            req.header.sequence_number = first.wrapping_add(i as u32);
            req.finalize();
            let at = self.out.len();
            self.out.resize(at + aligned(req.buffer_len()), 0);
            req.serialize(&mut self.out[at..]);
        }
        let mut answers: Vec<Option<io::Result<()>>> = (0..n).map(|_| None).collect();
        if let Err(e) = self.socket.send(&self.out).await {
            warn!(error = %e, requests = n, "address writes not sent");
            for a in &mut answers {
                *a = Some(Err(e.raw_os_error().map_or_else(
                    || io::Error::new(e.kind(), e.to_string()),
                    io::Error::from_raw_os_error,
                )));
            }
            return answers;
        }
        let mut missing = n;
        while missing > 0 {
            self.answer.clear();
            if let Err(e) = self.socket.recv(&mut self.answer).await {
                // ENOBUFS: answers overflowed the receive buffer and are lost.
                warn!(error = %e, missing, "the kernel's answers to address writes lost");
                break;
            }
            match read_answers(&self.answer, first, &mut answers) {
                Ok(filled) => missing -= filled,
                Err(e) => {
                    warn!(error = %e, missing, "unreadable answer to address writes");
                    break;
                }
            }
        }
        answers
    }
}

/// `len` rounded up to netlink's 4-byte alignment.
fn aligned(len: usize) -> usize {
    (len + 3) & !3
}

/// Reads the answers in `datagram` to the batch whose sequence numbers start at `first`
/// into `answers`, one slot per request: `Ok` for an acknowledgement, the errno for a
/// refusal. Messages of other sequence numbers, and answers already read, are skipped.
/// Returns how many slots it filled.
fn read_answers(
    datagram: &[u8],
    first: u32,
    answers: &mut [Option<io::Result<()>>],
) -> Result<usize, DecodeError> {
    let mut filled = 0;
    let mut rest = datagram;
    while !rest.is_empty() {
        let msg = NetlinkMessage::<RouteNetlinkMessage>::deserialize(rest)?;
        let len = aligned(msg.header.length as usize).min(rest.len());
        rest = &rest[len.max(1)..];
        let slot = msg.header.sequence_number.wrapping_sub(first) as usize;
        let NetlinkPayload::Error(e) = msg.payload else {
            continue;
        };
        if let Some(answer @ None) = answers.get_mut(slot) {
            *answer = Some(match e.code {
                None => Ok(()),
                Some(_) => Err(e.to_io()),
            });
            filled += 1;
        }
    }
    Ok(filled)
}

/// The preferred lifetime of an alias: its valid lifetime for IPv4, 0 (deprecated) for
/// IPv6. A /128 that is preferred wins the kernel's source-address selection for its whole
/// /64 (RFC 6724 rule 8, longest matching prefix, is capped at the address's own prefix
/// length in `ipv6_get_saddr_eval`: 128 against the node's 64), so the node would send its
/// own traffic from the VIP. A deprecated address is skipped as a source (rule 3) and
/// still accepted and answered for (RFC 4862 5.5.4). IPv4 picks the primary address of the
/// destination's subnet, never a /32 alias, and stays as it was.
pub fn preferred_lifetime(ip: IpAddr, lifetime: Lifetime) -> u32 {
    match ip {
        IpAddr::V4(_) => lifetime.seconds,
        IpAddr::V6(_) => 0,
    }
}

impl AddressBackend for NetlinkBackend {
    async fn snapshot(&self) -> Result<HostState, BackendError> {
        // One dump at a time: the kernel answers EBUSY to a second dump on a socket
        // whose first dump is still running (netlink_dump_start).
        Ok(HostState {
            links: self.links().await?,
            addresses: self.addresses().await?,
            default_v4: self
                .default_route(main_table_dump(AddressFamily::Inet))
                .await?,
            default_v6: self
                .default_route(main_table_dump(AddressFamily::Inet6))
                .await?,
        })
    }

    async fn add(&self, alias: &Alias, lifetime: Lifetime) -> Result<bool, BackendError> {
        self.write_one(Write::Add(lifetime), alias).await
    }

    async fn delete(&self, alias: &Alias) -> Result<bool, BackendError> {
        self.write_one(Write::Delete, alias).await
    }

    async fn refresh(&self, alias: &Alias, lifetime: Lifetime) -> Result<(), BackendError> {
        self.write_one(Write::Refresh(lifetime), alias)
            .await
            .map(|_| ())
    }

    async fn write_all(&self, write: Write, aliases: &[&Alias]) -> Vec<Result<bool, BackendError>> {
        debug_assert!(
            aliases.len() <= BATCH,
            "at most BATCH writes in one message"
        );
        let answers = self
            .writes
            .lock()
            .await
            .send(aliases.iter().map(|alias| write_request(write, alias)))
            .await;
        aliases
            .iter()
            .zip(answers)
            .map(|(alias, answer)| write_outcome(write, alias, answer))
            .collect()
    }

    async fn add_macvlan(&self, m: &NewMacvlan) -> Result<(), BackendError> {
        let target = || format!("{} on {}", m.name, m.parent_name);
        // The parent answers ARP for its own addresses only, not for the macvlan's.
        self.set_link(
            m.parent,
            vec![LinkAttribute::AfSpecUnspec(vec![inet_conf(1, 0)])],
        )
        .await
        .map_err(|e| kernel("set arp_ignore", m.parent_name.clone(), e))?;
        let new = rtnetlink::LinkMacVlan::new(&m.name, m.parent, MacVlanMode::Bridge)
            .address(m.mac.0.to_vec())
            .build();
        match self.handle.link().add(new).execute().await {
            Ok(()) => {}
            // Created meanwhile (by a reconcile that raced this one): the next dump sees it.
            Err(e) if errno(&e) == Some(EEXIST) => return Ok(()),
            Err(e) => return Err(kernel("add macvlan", target(), e)),
        }
        let index = match self.find_link(&m.name).await {
            Ok(Some(link)) => link.header.index,
            Ok(None) => {
                return Err(BackendError::Protocol {
                    op: "add macvlan",
                    detail: format!("{} vanished right after it was created", m.name),
                });
            }
            Err(e) => return Err(kernel("add macvlan", target(), e)),
        };
        // Down until configured: no IPv6 link-local address, ARP for its own addresses
        // only, a loose reverse-path filter. A link left half-configured is deleted, or
        // the next dump would take it as ready.
        let configured = async {
            // One IFLA_AF_SPEC for both families: the kernel reads only one.
            self.set_link(
                index,
                vec![LinkAttribute::AfSpecUnspec(vec![
                    inet_conf(1, 2),
                    AfSpecUnspec::Inet6(vec![AfSpecInet6::AddrGenMode(In6AddrGenMode::None)]),
                ])],
            )
            .await
            .map_err(|e| kernel("configure macvlan", target(), e))?;
            let up = rtnetlink::LinkUnspec::new_with_index(index).up().build();
            self.handle
                .link()
                .set(up)
                .execute()
                .await
                .map_err(|e| kernel("set up", target(), e))
        };
        if let Err(e) = configured.await {
            let _ = self.delete_link(index, &m.name).await;
            return Err(e);
        }
        Ok(())
    }

    async fn delete_link(&self, index: u32, name: &str) -> Result<(), BackendError> {
        match self.handle.link().del(index).execute().await {
            Ok(()) => Ok(()),
            Err(e) if errno(&e) == Some(ENODEV) => Ok(()),
            Err(e) => Err(kernel("delete link", name.to_owned(), e)),
        }
    }
}

impl NetlinkBackend {
    /// `write` on `alias` alone.
    async fn write_one(&self, write: Write, alias: &Alias) -> Result<bool, BackendError> {
        let mut results = self.write_all(write, &[alias]).await;
        results.pop().unwrap_or_else(|| {
            Err(BackendError::Protocol {
                op: write.op(),
                detail: format!("{alias}: no result"),
            })
        })
    }

    /// The link named `name`, if there is one.
    async fn find_link(&self, name: &str) -> Result<Option<LinkMessage>, rtnetlink::Error> {
        self.handle
            .link()
            .get()
            .match_name(name.to_owned())
            .execute()
            .try_next()
            .await
    }

    /// RTM_SETLINK on link `index` with `attributes`.
    async fn set_link(
        &self,
        index: u32,
        attributes: Vec<LinkAttribute>,
    ) -> Result<(), rtnetlink::Error> {
        let mut msg = rtnetlink::LinkUnspec::new_with_index(index).build();
        msg.attributes.extend(attributes);
        self.handle.link().set(msg).execute().await
    }
}

/// The IPv4 settings `arp_ignore` and `rp_filter` of a link, for its IFLA_AF_SPEC; a 0
/// is left as it is (the kernel is sent only the settings that are not 0).
fn inet_conf(arp_ignore: i32, rp_filter: i32) -> AfSpecUnspec {
    let mut conf = InetDevConf::default();
    conf.arp_ignore = arp_ignore;
    conf.rp_filter = rp_filter;
    AfSpecUnspec::Inet(vec![AfSpecInet::DevConfRequest(conf)])
}

/// Subscribes to address (IPv4, IPv6) and link notifications and returns a channel of
/// "something changed" ticks, coalesced (at most one pending).
///
/// A tick is sent for every address deletion, every link change and every new address
/// that is not ours; our own adds and refreshes do not tick, so the loop does not feed
/// itself. If the notification socket fails (e.g. it overflowed and lost events), a tick
/// is sent and the subscription is re-opened. The background task ends when the
/// receiver is dropped. Must be called inside a tokio runtime, in the network namespace
/// to watch.
pub fn watch_changes() -> Result<mpsc::Receiver<()>, BackendError> {
    let (tx, rx) = mpsc::channel(1);
    let first = subscribe()?;
    tokio::spawn(async move {
        let mut sub = Some(first);
        loop {
            let Some((handle, mut messages)) = sub.take() else {
                tokio::time::sleep(Duration::from_millis(200)).await;
                match subscribe() {
                    Ok(s) => sub = Some(s),
                    Err(e) => warn!(error = %e, "cannot re-subscribe to netlink notifications"),
                }
                continue;
            };
            while let Some((msg, _)) = messages.next().await {
                if let NetlinkPayload::InnerMessage(inner) = msg.payload
                    && is_relevant(&inner)
                {
                    debug!(kind = notification_kind(&inner), "netlink change");
                    // Full means a tick is already pending: that one covers this change.
                    if let Err(mpsc::error::TrySendError::Closed(())) = tx.try_send(()) {
                        return;
                    }
                }
            }
            drop(handle);
            warn!("netlink notification socket closed; re-subscribing");
            if let Err(mpsc::error::TrySendError::Closed(())) = tx.try_send(()) {
                return;
            }
        }
    });
    Ok(rx)
}

type Notifications = futures::channel::mpsc::UnboundedReceiver<(
    rtnetlink::packet_core::NetlinkMessage<RouteNetlinkMessage>,
    rtnetlink::sys::SocketAddr,
)>;

fn subscribe() -> Result<(Handle, Notifications), BackendError> {
    let (mut conn, handle, messages) = rtnetlink::new_multicast_connection(&[
        MulticastGroup::Link,
        MulticastGroup::Ipv4Ifaddr,
        MulticastGroup::Ipv6Ifaddr,
    ])
    .map_err(BackendError::Connect)?;
    if let Err(e) = conn.socket_mut().socket_mut().set_rx_buf_sz(WATCH_RCVBUF) {
        warn!(error = %e, "cannot enlarge the netlink notification buffer");
    }
    tokio::spawn(conn);
    Ok((handle, messages))
}

fn is_relevant(msg: &RouteNetlinkMessage) -> bool {
    match msg {
        RouteNetlinkMessage::NewAddress(m) => !parse_address(m).is_some_and(|a| a.owned),
        RouteNetlinkMessage::DelAddress(_)
        | RouteNetlinkMessage::NewLink(_)
        | RouteNetlinkMessage::DelLink(_) => true,
        _ => false,
    }
}

fn notification_kind(msg: &RouteNetlinkMessage) -> &'static str {
    match msg {
        RouteNetlinkMessage::NewAddress(_) => "new address",
        RouteNetlinkMessage::DelAddress(_) => "deleted address",
        RouteNetlinkMessage::NewLink(_) => "link change",
        RouteNetlinkMessage::DelLink(_) => "link removed",
        _ => "other",
    }
}

fn parse_link(m: &LinkMessage) -> Link {
    let mut name = String::new();
    let mut mac = None;
    let mut kind = None;
    let mut parent = None;
    for attr in &m.attributes {
        match attr {
            LinkAttribute::IfName(n) => name.clone_from(n),
            LinkAttribute::Link(index) => parent = Some(*index),
            LinkAttribute::Address(a) => mac = <[u8; 6]>::try_from(a.as_slice()).ok(),
            LinkAttribute::LinkInfo(infos) => {
                kind = infos.iter().find_map(|info| match info {
                    LinkInfo::Kind(k) => Some(k.to_string()),
                    _ => None,
                });
            }
            _ => {}
        }
    }
    Link {
        index: m.header.index,
        name,
        mac,
        kind,
        // Operationally up: administratively up AND with carrier. A pulled cable (or a veth
        // whose peer is down) clears IFF_LOWER_UP while IFF_UP stays set.
        up: m.header.flags.contains(LinkFlags::Up) && m.header.flags.contains(LinkFlags::LowerUp),
        parent,
    }
}

fn parse_address(m: &AddressMessage) -> Option<HostAddress> {
    let mut address = None;
    let mut local = None;
    let mut proto = None;
    let mut label = None;
    for attr in &m.attributes {
        match attr {
            AddressAttribute::Address(a) => address = Some(*a),
            AddressAttribute::Local(a) => local = Some(*a),
            AddressAttribute::Protocol(p) => proto = Some(u8::from(*p)),
            AddressAttribute::Label(l) => label = Some(l.as_str()),
            _ => {}
        }
    }
    // IPv4 puts the interface's own address in IFA_LOCAL (IFA_ADDRESS is the peer on
    // point-to-point links); IPv6 puts it in IFA_ADDRESS.
    let ip = match (local, address) {
        (Some(l @ IpAddr::V4(_)), _) => l,
        (_, Some(a)) => a,
        (Some(l), None) => l,
        (None, None) => return None,
    };
    let owned = proto == Some(ALIAS_PROTO)
        || (ip.is_ipv4() && label.is_some_and(|l| l.ends_with(LABEL_SUFFIX)));
    Some(HostAddress {
        ip,
        prefix_len: m.header.prefix_len,
        ifindex: m.header.index,
        owned,
        global: m.header.scope == AddressScope::Universe,
    })
}

/// A dump request for the unicast routes of the main table of `family`. Under strict
/// checking the kernel filters on the table, type and protocol of the header and refuses
/// a non-zero scope, so those are set explicitly (protocol 0: any; rtnetlink's builder
/// would ask for `static` only).
fn main_table_dump(family: AddressFamily) -> RouteMessage {
    let mut m = RouteMessage::default();
    m.header.address_family = family;
    m.header.table = RT_TABLE_MAIN;
    m.header.kind = RouteType::Unicast;
    m.header.protocol = RouteProtocol::Unspec;
    m.header.scope = RouteScope::Universe;
    m
}

fn route_oif(r: &RouteMessage) -> Option<u32> {
    r.attributes.iter().find_map(|a| match a {
        RouteAttribute::Oif(i) => Some(*i),
        RouteAttribute::MultiPath(hops) => hops.first().map(|h| h.interface_index),
        _ => None,
    })
}

fn route_priority(r: &RouteMessage) -> u32 {
    r.attributes
        .iter()
        .find_map(|a| match a {
            RouteAttribute::Priority(p) => Some(*p),
            _ => None,
        })
        .unwrap_or(0)
}

fn errno(e: &rtnetlink::Error) -> Option<i32> {
    match e {
        rtnetlink::Error::NetlinkError(m) => Some(m.raw_code().abs()),
        _ => None,
    }
}

fn kernel(op: &'static str, target: String, e: rtnetlink::Error) -> BackendError {
    match e {
        rtnetlink::Error::NetlinkError(m) => BackendError::Kernel {
            op,
            target,
            source: m.to_io(),
        },
        other => BackendError::Protocol {
            op,
            detail: other.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_fits_or_is_left_out() {
        assert_eq!(alias_label("eth0").as_deref(), Some("eth0:alb"));
        assert_eq!(alias_label("enp0s31f6").as_deref(), Some("enp0s31f6:alb"));
        assert_eq!(alias_label("enp0s31f6.10").as_deref(), None);
        assert_eq!(alias_label("abcdefghijk").map(|l| l.len()), Some(15));
    }

    /// One datagram holding the kernel's answers `(sequence number, errno or 0)`.
    fn datagram(answers: &[(u32, i32)]) -> Vec<u8> {
        let mut out = Vec::new();
        for &(seq, errno) in answers {
            let mut e = rtnetlink::packet_core::ErrorMessage::default();
            e.code = std::num::NonZeroI32::new(-errno);
            e.header = vec![0; 16];
            let mut msg = NetlinkMessage::<RouteNetlinkMessage>::new(
                Default::default(),
                NetlinkPayload::Error(e),
            );
            msg.header.sequence_number = seq;
            msg.finalize();
            let at = out.len();
            out.resize(at + aligned(msg.buffer_len()), 0);
            msg.serialize(&mut out[at..]);
        }
        out
    }

    fn errnos(answers: &[Option<io::Result<()>>]) -> Vec<Option<i32>> {
        answers
            .iter()
            .map(|a| {
                a.as_ref()
                    .map(|r| r.as_ref().err().map_or(0, |e| e.raw_os_error().unwrap()))
            })
            .collect()
    }

    #[test]
    fn answers_are_read_by_sequence_number_and_strays_skipped() {
        let mut answers: Vec<Option<io::Result<()>>> = (0..3).map(|_| None).collect();
        // 99 answers a batch given up on; 101 and 100 come in any order.
        let filled = read_answers(
            &datagram(&[(99, 0), (101, EEXIST), (100, 0)]),
            100,
            &mut answers,
        );
        assert_eq!(filled.unwrap(), 2);
        assert_eq!(errnos(&answers), [Some(0), Some(EEXIST), None]);
        // An answer read already, and one past the batch, change nothing.
        let filled = read_answers(
            &datagram(&[(100, ENODEV), (103, 0), (102, 0)]),
            100,
            &mut answers,
        );
        assert_eq!(filled.unwrap(), 1);
        assert_eq!(errnos(&answers), [Some(0), Some(EEXIST), Some(0)]);
        // Sequence numbers wrap.
        let mut answers: Vec<Option<io::Result<()>>> = (0..2).map(|_| None).collect();
        let filled = read_answers(
            &datagram(&[(0, ENODEV), (u32::MAX, 0)]),
            u32::MAX,
            &mut answers,
        );
        assert_eq!(filled.unwrap(), 2);
        assert_eq!(errnos(&answers), [Some(0), Some(ENODEV)]);
        // A truncated datagram is an error, not a guess.
        let mut cut = datagram(&[(u32::MAX, 0)]);
        cut.truncate(10);
        assert!(read_answers(&cut, u32::MAX, &mut answers).is_err());
    }

    #[test]
    fn a_write_request_says_add_refresh_or_delete_in_its_flags() {
        let alias = Alias {
            ip: "fd00::5".parse().unwrap(),
            ifindex: 7,
            ifname: "eth0".into(),
        };
        let life = Lifetime { seconds: 4 };
        let base = NLM_F_REQUEST | NLM_F_ACK;
        let add = write_request(Write::Add(life), &alias);
        assert_eq!(add.header.flags, base | NLM_F_CREATE | NLM_F_EXCL);
        let refresh = write_request(Write::Refresh(life), &alias);
        assert_eq!(refresh.header.flags, base | NLM_F_CREATE | NLM_F_REPLACE);
        let NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewAddress(m)) = &refresh.payload
        else {
            panic!("a refresh is a new address: {refresh:?}");
        };
        assert!(
            m.attributes
                .contains(&AddressAttribute::Protocol(AddressProtocol::from(
                    ALIAS_PROTO
                )))
        );
        assert!(
            m.attributes
                .contains(&AddressAttribute::Flags(AddressFlags::Nodad))
        );
        let delete = write_request(Write::Delete, &alias);
        assert_eq!(delete.header.flags, base);
        assert!(matches!(
            delete.payload,
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::DelAddress(_))
        ));
    }

    fn addr_msg(ip: IpAddr, attrs: Vec<AddressAttribute>) -> AddressMessage {
        let mut m = AddressMessage::default();
        m.header.index = 7;
        m.header.prefix_len = 32;
        m.attributes.push(AddressAttribute::Address(ip));
        m.attributes.extend(attrs);
        m
    }

    #[test]
    fn ownership_comes_from_proto_or_v4_label_only() {
        let v4: IpAddr = "10.0.0.5".parse().unwrap();
        let v6: IpAddr = "fd00::5".parse().unwrap();
        let marked = AddressAttribute::Protocol(AddressProtocol::from(ALIAS_PROTO));
        let other = AddressAttribute::Protocol(AddressProtocol::from(0x42));
        let label = AddressAttribute::Label("eth0:alb".into());
        let cases = [
            (v4, vec![marked.clone()], true),
            (v6, vec![marked], true),
            (v4, vec![other.clone()], false),
            (v4, vec![label.clone()], true),
            (v6, vec![label], false),
            (v4, vec![AddressAttribute::Label("eth0".into())], false),
            (v6, vec![other], false),
        ];
        for (ip, attrs, owned) in cases {
            let got = parse_address(&addr_msg(ip, attrs.clone())).unwrap();
            assert_eq!(got.owned, owned, "{ip} {attrs:?}");
            assert_eq!(got.ip, ip);
            assert_eq!(got.ifindex, 7);
        }
    }

    #[test]
    fn our_own_new_addresses_do_not_tick() {
        let ip: IpAddr = "10.0.0.5".parse().unwrap();
        let ours = addr_msg(
            ip,
            vec![AddressAttribute::Protocol(AddressProtocol::from(
                ALIAS_PROTO,
            ))],
        );
        let foreign = addr_msg(ip, vec![]);
        assert!(!is_relevant(&RouteNetlinkMessage::NewAddress(ours.clone())));
        assert!(is_relevant(&RouteNetlinkMessage::NewAddress(foreign)));
        assert!(is_relevant(&RouteNetlinkMessage::DelAddress(ours)));
    }
}
