//! The host-port shield: a load-balancer IP opens only its Services' ports.
//!
//! An alias makes the LB IP a local address of its node, so without a filter every host
//! listener (sshd, kubelet, etcd, the agent's own `/metrics`) would answer on every LB IP.
//! The agent owns one nftables table, `inet aliaslb`, and touches nothing else (never
//! kube-proxy's tables, the CNI's or the operator's firewall). For every IP the agent holds
//! the table has one element in `held4`/`held6`, and one element per open port in
//! `ports4`/`ports6` (`ip . protocol . port`, the ports of the Services assigned to the IP).
//! Two chains drop what is not theirs, silently (no RST, no ICMP unreachable):
//!
//! - `prerouting` (priority mangle, before kube-proxy's DNAT at dstnat): a packet to a held
//!   IP passes only if it belongs to a connection conntrack already knows (its first packet
//!   passed here, or the node opened it; related ICMP errors too), is ICMP echo or an ICMP
//!   error (path-MTU discovery), NDP, or its `ip . protocol . port` is a Service port. This
//!   also closes the NodePorts on LB IPs, which kube-proxy would otherwise DNAT. Known
//!   connections are accepted first: most packets skip the port lookup. A dropped first
//!   packet never makes a connection known (conntrack confirms an entry only when the
//!   packet leaves the hooks).
//! - `input` (iptables and nftables kube-proxy): Service traffic was DNATed before the input
//!   hook, so what still reaches it addressed to a held IP is for the node's own stack
//!   (e.g. an `externalTrafficPolicy: Local` port with no local endpoint): dropped too. With
//!   kube-proxy in IPVS mode (a `kube-ipvs0` link), IPVS itself takes Service traffic at the
//!   input hook: the chain is left out and the allow-list of `prerouting` is the shield.
//!
//! ARP is not IP and never reaches these hooks. Membership changes are element updates in
//! one `nft` transaction each ([`update_script`]); only the first sync after start, an IPVS
//! switch, a failed update or a damaged table replaces the whole table, atomically
//! ([`table_script`]).
//!
//! **It heals.** Someone else may delete or flush the table (`nft flush ruleset` from
//! nftables.service, a firewall reload): the agent looks at it, and a table missing, short
//! of a chain or of a rule ([`damage`]) marks the shield failing and has the next sync
//! rewrite it whole. The state reads `failing` until that rewrite succeeded. Two looks, by
//! cost: at every renewal the table's chains ([`Shield::look_at_chains`]: `nft list
//! chains`, which reads no set, free at any size), which catches a deleted table and `nft
//! flush ruleset`; with the drop counters every few seconds the whole table less its
//! elements ([`Shield::look`]: nft 1.0 reads every element for it, about 0.2 s of CPU with
//! 10,000 IPs), which also catches rules flushed from a table left in place (`nft flush
//! table`, `flush chain`). The set elements are not compared: a flush keeps them, and only
//! a deliberate `nft delete element` or `flush set` would go unnoticed until the next
//! update.
//!
//! Pure except [`Shield`], which drives a [`ShieldBackend`] (`nft.rs` runs the real one).

pub mod metrics;
pub mod nft;

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::{self, Write as _};
use std::future::Future;
use std::net::IpAddr;

pub use aliaslb_core::assignment::{OpenPort, Protocol};
use aliaslb_core::report::ShieldState;
use tracing::{info, warn};

/// Family and name of the agent's table.
pub const TABLE: &str = "inet aliaslb";
/// The link kube-proxy's IPVS mode creates for its virtual IPs.
pub const IPVS_LINK: &str = "kube-ipvs0";

/// What the table holds: every shielded IP with the ports open on it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Contents {
    ips: BTreeMap<IpAddr, BTreeSet<OpenPort>>,
}

impl Contents {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Shields `ip` (with no port open yet, if it was not shielded).
    pub fn insert_ip(&mut self, ip: IpAddr) -> &mut BTreeSet<OpenPort> {
        self.ips.entry(ip).or_default()
    }

    /// Opens `ports` on `ip` (shielding it).
    pub fn open(&mut self, ip: IpAddr, ports: impl IntoIterator<Item = OpenPort>) {
        self.insert_ip(ip).extend(ports);
    }

    /// Whether `ip` is shielded.
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.ips.contains_key(&ip)
    }

    /// The ports open on `ip` (none when it is not shielded).
    pub fn ports(&self, ip: IpAddr) -> impl Iterator<Item = OpenPort> + '_ {
        self.ips.get(&ip).into_iter().flatten().copied()
    }

    /// The shielded IPs with their open ports, in address order.
    pub fn iter(&self) -> impl Iterator<Item = (IpAddr, &BTreeSet<OpenPort>)> {
        self.ips.iter().map(|(ip, p)| (*ip, p))
    }

    /// Number of shielded IPs.
    pub fn len(&self) -> usize {
        self.ips.len()
    }

    /// Whether no IP is shielded.
    pub fn is_empty(&self) -> bool {
        self.ips.is_empty()
    }

    /// Keeps only the IPs `keep` accepts.
    pub fn retain(&mut self, mut keep: impl FnMut(IpAddr) -> bool) {
        self.ips.retain(|ip, _| keep(*ip));
    }

    fn elements(&self) -> impl Iterator<Item = Element> + '_ {
        self.ips.iter().flat_map(|(ip, ports)| {
            std::iter::once(Element::Ip(*ip)).chain(ports.iter().map(|p| Element::Port(*ip, *p)))
        })
    }
}

/// One element of one of the table's four sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Element {
    Ip(IpAddr),
    Port(IpAddr, OpenPort),
}

impl Element {
    /// The order [`Contents::elements`] yields them in: by IP, the IP before its ports.
    fn walk_key(self) -> (IpAddr, Option<OpenPort>) {
        match self {
            Element::Ip(ip) => (ip, None),
            Element::Port(ip, port) => (ip, Some(port)),
        }
    }

    fn set(self) -> &'static str {
        match self {
            Element::Ip(IpAddr::V4(_)) => "held4",
            Element::Ip(IpAddr::V6(_)) => "held6",
            Element::Port(IpAddr::V4(_), _) => "ports4",
            Element::Port(IpAddr::V6(_), _) => "ports6",
        }
    }
}

impl fmt::Display for Element {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Element::Ip(ip) => write!(f, "{ip}"),
            Element::Port(ip, p) => write!(f, "{ip} . {} . {}", p.protocol.as_str(), p.port),
        }
    }
}

/// Writes `elements` as one `verb element` line per set, skipping empty sets.
fn element_lines(out: &mut String, verb: &str, elements: impl IntoIterator<Item = Element>) {
    let mut by_set: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for e in elements {
        by_set.entry(e.set()).or_default().push(e.to_string());
    }
    for (set, items) in by_set {
        let _ = writeln!(
            out,
            "{verb} element {TABLE} {set} {{ {} }}",
            items.join(", ")
        );
    }
}

/// The nft script that replaces the whole table with one holding `contents`, in one
/// transaction (`add` then `delete` makes it work whether the table exists or not).
/// `ipvs` leaves out the `input` chain (see the module docs).
pub fn table_script(contents: &Contents, ipvs: bool) -> String {
    let mut s = format!("add table {TABLE}\ndelete table {TABLE}\n");
    s.push_str(RULESET);
    if !ipvs {
        s.push_str(INPUT_CHAIN);
    }
    element_lines(&mut s, "add", contents.elements());
    s
}

/// The nft script that removes the table, whether it exists or not.
pub fn delete_script() -> String {
    format!("add table {TABLE}\ndelete table {TABLE}\n")
}

/// The element updates that turn `from` into `to` (empty when they are equal): one
/// transaction, whose cost grows with the change, not with the table.
///
/// One merge walk over the two tables in their common order, collecting only the
/// difference: no copy of either table (at 10,000 IPs a copy was megabytes per sync).
pub fn update_script(from: &Contents, to: &Contents) -> String {
    let (mut adds, mut deletes) = (Vec::new(), Vec::new());
    let (mut old, mut new) = (from.elements().peekable(), to.elements().peekable());
    loop {
        let order = match (old.peek(), new.peek()) {
            (None, None) => break,
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (Some(o), Some(n)) => o.walk_key().cmp(&n.walk_key()),
        };
        match order {
            Ordering::Less => deletes.extend(old.next()),
            Ordering::Greater => adds.extend(new.next()),
            Ordering::Equal => {
                old.next();
                new.next();
            }
        }
    }
    let mut s = String::new();
    element_lines(&mut s, "add", adds);
    element_lines(&mut s, "delete", deletes);
    s
}

/// The table without its `input` chain. ICMP types kept open: echo, and the errors that
/// path-MTU discovery and traceroute need; for IPv6 also neighbour discovery (unicast
/// neighbour solicitations are addressed to the IP itself).
const RULESET: &str = r#"table inet aliaslb {
	comment "aliaslb host-port shield: LB IPs open only their Services' ports (owned by aliaslb-agent)"
	set held4 { type ipv4_addr; }
	set held6 { type ipv6_addr; }
	set ports4 { type ipv4_addr . inet_proto . inet_service; }
	set ports6 { type ipv6_addr . inet_proto . inet_service; }
	counter dropped4 { }
	counter dropped6 { }
	chain guard4 {
		ct state established,related accept
		icmp type { echo-request, destination-unreachable, time-exceeded, parameter-problem } accept
		ip daddr . meta l4proto . th dport @ports4 accept
		counter name "dropped4" drop
	}
	chain guard6 {
		ct state established,related accept
		icmpv6 type { echo-request, packet-too-big, destination-unreachable, time-exceeded, parameter-problem, nd-neighbor-solicit, nd-neighbor-advert } accept
		ip6 daddr . meta l4proto . th dport @ports6 accept
		counter name "dropped6" drop
	}
	chain prerouting {
		type filter hook prerouting priority mangle; policy accept;
		ip daddr @held4 jump guard4
		ip6 daddr @held6 jump guard6
	}
}
"#;

/// The `input` chain (iptables and nftables kube-proxy): what still addresses a held IP
/// after DNAT is for the node's own stack.
const INPUT_CHAIN: &str = r#"add chain inet aliaslb input { type filter hook input priority mangle; policy accept; }
add rule inet aliaslb input ip daddr @held4 ct direction original meta l4proto != icmp counter name "dropped4" drop
add rule inet aliaslb input ip6 daddr @held6 ct direction original meta l4proto != ipv6-icmp counter name "dropped6" drop
"#;

/// Rules per chain in the table we write ([`RULESET`], plus [`INPUT_CHAIN`] unless
/// `ipvs`): what a look at the kernel's table must find.
pub fn expected_rules(ipvs: bool) -> BTreeMap<String, usize> {
    let mut rules: BTreeMap<String, usize> = [("guard4", 4), ("guard6", 4), ("prerouting", 2)]
        .into_iter()
        .map(|(chain, n)| (chain.to_owned(), n))
        .collect();
    if !ipvs {
        rules.insert("input".to_owned(), 2);
    }
    rules
}

/// The sets of the table.
pub const SETS: [&str; 4] = ["held4", "held6", "ports4", "ports6"];

/// The table as the kernel holds it, without the set elements (`nft -t`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TableView {
    /// Rules per chain (chains without a rule included).
    pub rules: BTreeMap<String, usize>,
    /// The sets' names.
    pub sets: BTreeSet<String>,
    /// The drop counters.
    pub dropped: Dropped,
}

/// What is wrong with the chains of the kernel's table (`None`: no table) against the
/// table written for `ipvs`; `None` when it has them all and no other.
pub fn chain_damage(chains: Option<&BTreeSet<String>>, ipvs: bool) -> Option<String> {
    let Some(chains) = chains else {
        return Some(format!("no table {TABLE}"));
    };
    let want: BTreeSet<String> = expected_rules(ipvs).into_keys().collect();
    (*chains != want).then(|| format!("chains {chains:?}, written {want:?}"))
}

/// What is wrong with the kernel's table (`None`: no table) against the one written for
/// `ipvs`; `None` when it is as written.
pub fn damage(view: Option<&TableView>, ipvs: bool) -> Option<String> {
    let Some(view) = view else {
        return Some(format!("no table {TABLE}"));
    };
    let want = expected_rules(ipvs);
    if view.rules != want {
        return Some(format!(
            "rules per chain {:?}, written {want:?}",
            view.rules
        ));
    }
    let missing: Vec<&str> = SETS
        .into_iter()
        .filter(|set| !view.sets.contains(*set))
        .collect();
    if !missing.is_empty() {
        return Some(format!("sets missing: {}", missing.join(", ")));
    }
    None
}

/// Packets dropped by the shield since its table was installed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Dropped {
    /// IPv4 packets.
    pub v4: u64,
    /// IPv6 packets.
    pub v6: u64,
}

/// Errors of a shield backend.
#[derive(Debug, thiserror::Error)]
pub enum ShieldError {
    /// `nft` could not be run at all.
    #[error(
        "cannot run `{program}`: {source} (install nftables, e.g. `apt-get install nftables`, or start with --host-port-shield=off)"
    )]
    Spawn {
        /// The program.
        program: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// `nft` ran and failed (e.g. the kernel has no nf_tables, or a stale element).
    #[error("nft {what} failed: {stderr}")]
    Nft {
        /// What was asked.
        what: &'static str,
        /// nft's own message.
        stderr: String,
    },
    /// `nft` did not answer in time.
    #[error("nft {what} did not finish within {seconds} s")]
    Timeout {
        /// What was asked.
        what: &'static str,
        /// The bound.
        seconds: u64,
    },
    /// `nft -j` printed something we cannot read.
    #[error("cannot read nft's JSON output of {what}: {detail}")]
    Output {
        /// What was asked.
        what: &'static str,
        /// What went wrong.
        detail: String,
    },
}

impl ShieldError {
    /// A short stable category in snake_case, the style of every error category.
    pub fn category(&self) -> &'static str {
        match self {
            ShieldError::Spawn { .. } => "nft_missing",
            ShieldError::Nft { .. } => "nft_failed",
            ShieldError::Timeout { .. } => "nft_timeout",
            ShieldError::Output { .. } => "nft_output",
        }
    }
}

/// What the shield needs from nftables.
pub trait ShieldBackend {
    /// Runs `script` (nft syntax) as one transaction.
    fn apply(&self, script: &str) -> impl Future<Output = Result<(), ShieldError>> + Send;
    /// Checks `script` against the kernel without committing it (`nft -c`).
    fn check(&self, script: &str) -> impl Future<Output = Result<(), ShieldError>> + Send;
    /// Reads our table without its set elements (`None`: there is no such table).
    fn inspect(&self) -> impl Future<Output = Result<Option<TableView>, ShieldError>> + Send;
    /// Reads the names of our table's chains only, which costs nothing whatever the sets
    /// hold (`None`: there is no such table).
    fn chains(&self) -> impl Future<Output = Result<Option<BTreeSet<String>>, ShieldError>> + Send;
}

/// The backend of an agent without a shield: never constructed, so a
/// `Shield<NoShield>` cannot exist and `Option<Shield<NoShield>>` is always `None`.
#[derive(Debug, Clone, Copy)]
pub enum NoShield {}

impl ShieldBackend for NoShield {
    async fn apply(&self, _: &str) -> Result<(), ShieldError> {
        match *self {}
    }
    async fn check(&self, _: &str) -> Result<(), ShieldError> {
        match *self {}
    }
    async fn inspect(&self) -> Result<Option<TableView>, ShieldError> {
        match *self {}
    }
    async fn chains(&self) -> Result<Option<BTreeSet<String>>, ShieldError> {
        match *self {}
    }
}

/// What a look at the kernel's table found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Look {
    /// The drop counters, when the table has them.
    pub dropped: Option<Dropped>,
    /// The table was written and is now missing or altered: the next sync rewrites it.
    pub damaged: bool,
}

/// The shield's state: what its table holds, and whether the kernel is known to agree.
#[derive(Debug)]
pub struct Shield<S> {
    backend: S,
    /// What the table holds, as last written.
    applied: Contents,
    /// Whether the kernel's table is ours and holds `applied` (false at start and after a
    /// failed write: the next sync replaces the whole table).
    installed: bool,
    /// Whether the table was written for kube-proxy in IPVS mode.
    ipvs: bool,
    /// Whether the last write failed.
    failing: bool,
    /// Writes that failed since start.
    errors: u64,
    /// Tables found deleted or altered since start.
    damaged: u64,
    /// Whether the last look at the table failed (logged on the edge).
    unreadable: bool,
}

impl<S: ShieldBackend> Shield<S> {
    /// A shield that has written nothing yet: its first [`sync`](Self::sync) replaces
    /// whatever table a previous agent left (which keeps guarding until then).
    pub fn new(backend: S) -> Self {
        Shield {
            backend,
            applied: Contents::new(),
            installed: false,
            ipvs: false,
            failing: false,
            errors: 0,
            damaged: 0,
            unreadable: false,
        }
    }

    /// Start-up check: the ruleset is accepted by `nft` and the kernel, without committing.
    /// The error names what is missing.
    pub async fn check(&self) -> Result<(), ShieldError> {
        // With one element per set, so that what a real sync writes is checked too (protocol
        // names such as `tcp` resolve through /etc/protocols on some nft builds).
        let mut sample = Contents::new();
        let port = [OpenPort {
            protocol: Protocol::Tcp,
            port: 80,
        }];
        sample.open(IpAddr::from([192, 0, 2, 1]), port);
        sample.open("2001:db8::1".parse().expect("a literal IPv6 address"), port);
        self.backend.check(&table_script(&sample, false)).await
    }

    /// The backend.
    pub fn backend(&self) -> &S {
        &self.backend
    }

    /// What the table holds, as last written.
    pub fn contents(&self) -> &Contents {
        &self.applied
    }

    /// Tells the shield whether kube-proxy runs in IPVS mode; a change replaces the table
    /// at the next sync.
    pub fn set_ipvs(&mut self, ipvs: bool) {
        if ipvs != self.ipvs {
            info!(
                ipvs,
                "kube-proxy mode changed: the shield's input chain is {}",
                if ipvs {
                    "left out (IPVS takes Service traffic at input)"
                } else {
                    "back"
                }
            );
            self.ipvs = ipvs;
            self.installed = false;
        }
    }

    /// Makes the table hold `target`: element updates only, or the whole table in one
    /// transaction when it is not known to be ours yet. Returns whether it wrote anything.
    pub async fn sync(&mut self, target: Contents) -> Result<bool, ShieldError> {
        let script = if self.installed {
            update_script(&self.applied, &target)
        } else {
            table_script(&target, self.ipvs)
        };
        if script.is_empty() {
            return Ok(false);
        }
        match self.backend.apply(&script).await {
            Ok(()) => {
                if self.failing {
                    info!("host-port shield works again");
                }
                self.applied = target;
                self.installed = true;
                self.failing = false;
                Ok(true)
            }
            Err(e) => {
                warn!(error = %e, "host-port shield update failed; the next sync rewrites the whole table");
                // The kernel may hold something else than `applied` now: rewrite it all.
                self.installed = false;
                self.failing = true;
                self.errors += 1;
                Err(e)
            }
        }
    }

    /// Removes the table (SIGTERM path, after the aliases are gone).
    pub async fn remove(&mut self) -> Result<(), ShieldError> {
        self.backend.apply(&delete_script()).await?;
        self.applied = Contents::new();
        self.installed = false;
        Ok(())
    }

    /// Reads the drop counters.
    pub async fn dropped(&self) -> Result<Dropped, ShieldError> {
        match self.backend.inspect().await? {
            Some(view) => Ok(view.dropped),
            None => Err(ShieldError::Nft {
                what: "list table",
                stderr: format!("no table {TABLE}"),
            }),
        }
    }

    /// Looks at the kernel's whole table but its elements: its drop counters, and, once
    /// this shield has written it, whether it is still as written ([`damage`]). A table
    /// deleted or altered by someone else makes the shield failing until the next sync
    /// has rewritten it whole. A failed read is logged at warn once, until a read works.
    pub async fn look(&mut self) -> Result<Look, ShieldError> {
        let view = self.read(self.backend.inspect().await)?;
        let dropped = view.as_ref().map(|v| v.dropped);
        let damaged = self.judge(|ipvs| damage(view.as_ref(), ipvs));
        Ok(Look { dropped, damaged })
    }

    /// The cheap look, at the table's chains only ([`chain_damage`]): a deleted table or a
    /// flushed ruleset, at any table size. Gives no counters.
    pub async fn look_at_chains(&mut self) -> Result<Look, ShieldError> {
        let chains = self.read(self.backend.chains().await)?;
        let damaged = self.judge(|ipvs| chain_damage(chains.as_ref(), ipvs));
        Ok(Look {
            dropped: None,
            damaged,
        })
    }

    /// Logs a failed read on the edge.
    fn read<T>(&mut self, result: Result<T, ShieldError>) -> Result<T, ShieldError> {
        match result {
            Ok(read) => {
                if std::mem::take(&mut self.unreadable) {
                    info!("the host-port shield's table can be read again");
                }
                Ok(read)
            }
            Err(e) => {
                if !self.unreadable {
                    warn!(error = %e, "cannot read the host-port shield's table (whether it is intact, its drop counters); retried at every renewal");
                    self.unreadable = true;
                }
                Err(e)
            }
        }
    }

    /// Whether the table, once written, is damaged as `what` says; if so the shield is
    /// failing and the next sync rewrites it whole.
    fn judge(&mut self, what: impl FnOnce(bool) -> Option<String>) -> bool {
        if !self.installed {
            // Not written yet, or a rewrite is already due.
            return false;
        }
        let Some(what) = what(self.ipvs) else {
            return false;
        };
        warn!(
            damage = %what,
            "the host-port shield's table was deleted or altered by someone else (e.g. `nft flush ruleset`): failing until it is rewritten"
        );
        self.installed = false;
        self.failing = true;
        self.damaged += 1;
        true
    }

    /// Writes that failed since start.
    pub fn errors(&self) -> u64 {
        self.errors
    }

    /// Tables found deleted or altered since start.
    pub fn damaged(&self) -> u64 {
        self.damaged
    }

    /// What the Lease report says of the shield.
    pub fn state(&self) -> ShieldState {
        if self.failing {
            ShieldState::Failing
        } else {
            ShieldState::Active
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn tcp(port: u16) -> OpenPort {
        OpenPort {
            protocol: Protocol::Tcp,
            port,
        }
    }

    fn udp(port: u16) -> OpenPort {
        OpenPort {
            protocol: Protocol::Udp,
            port,
        }
    }

    #[test]
    fn the_table_script_replaces_atomically_and_lists_every_element() {
        let mut c = Contents::new();
        c.open(ip("192.168.55.10"), [tcp(80), udp(53)]);
        c.insert_ip(ip("2001:db8::10"));
        let s = table_script(&c, false);
        assert!(
            s.starts_with(
                "add table inet aliaslb\ndelete table inet aliaslb\ntable inet aliaslb {"
            ),
            "{s}"
        );
        assert!(s.contains("add chain inet aliaslb input"), "{s}");
        assert!(
            s.contains("add element inet aliaslb held4 { 192.168.55.10 }\n"),
            "{s}"
        );
        assert!(
            s.contains("add element inet aliaslb held6 { 2001:db8::10 }\n"),
            "{s}"
        );
        assert!(
            s.contains(
                "add element inet aliaslb ports4 { 192.168.55.10 . tcp . 80, 192.168.55.10 . udp . 53 }\n"
            ),
            "{s}"
        );
        assert!(
            !s.contains("ports6 {  }"),
            "empty sets get no element line: {s}"
        );
        let ipvs = table_script(&c, true);
        assert!(!ipvs.contains("chain inet aliaslb input"), "{ipvs}");
        assert!(ipvs.contains("chain prerouting"), "{ipvs}");
    }

    #[test]
    fn updates_touch_only_the_difference() {
        let mut from = Contents::new();
        from.open(ip("10.0.0.1"), [tcp(80)]);
        from.open(ip("10.0.0.2"), [tcp(443)]);
        assert_eq!(update_script(&from, &from), "");
        let mut to = from.clone();
        to.open(ip("10.0.0.1"), [tcp(8080)]);
        to.retain(|i| i != ip("10.0.0.2"));
        to.open(ip("fd00::3"), [udp(53)]);
        assert_eq!(
            update_script(&from, &to),
            "add element inet aliaslb held6 { fd00::3 }\n\
             add element inet aliaslb ports4 { 10.0.0.1 . tcp . 8080 }\n\
             add element inet aliaslb ports6 { fd00::3 . udp . 53 }\n\
             delete element inet aliaslb held4 { 10.0.0.2 }\n\
             delete element inet aliaslb ports4 { 10.0.0.2 . tcp . 443 }\n"
        );
    }

    #[test]
    fn the_merge_walk_writes_what_the_set_difference_says() {
        // The oracle: both tables as sets of elements, differenced.
        let by_sets = |from: &Contents, to: &Contents| {
            let old: BTreeSet<Element> = from.elements().collect();
            let new: BTreeSet<Element> = to.elements().collect();
            let mut s = String::new();
            element_lines(&mut s, "add", new.difference(&old).copied());
            element_lines(&mut s, "delete", old.difference(&new).copied());
            s
        };
        // Tables drawn from 6 IPs (v4 and v6) with 0-2 of 3 ports each, every pair of them:
        // an IP in one table only, first or last; the same IP with other ports; equal tables.
        let ips = [
            "10.0.0.1", "10.0.0.2", "10.0.0.9", "fd00::1", "fd00::2", "::ffff:1",
        ];
        let ports = [tcp(80), tcp(443), udp(53)];
        let table = |seed: u32| {
            let mut c = Contents::new();
            for (i, addr) in ips.iter().enumerate() {
                let digit = (seed / 4u32.pow(i as u32)) % 4;
                if digit == 0 {
                    continue;
                }
                let open = ports
                    .iter()
                    .copied()
                    .filter(|p| !(u32::from(p.port) + digit).is_multiple_of(3));
                c.open(ip(addr), open.take(digit as usize - 1));
            }
            c
        };
        let tables: Vec<Contents> = (0..4u32.pow(6)).step_by(37).map(table).collect();
        let mut differing = 0;
        for from in &tables {
            for to in &tables {
                let want = by_sets(from, to);
                differing += usize::from(!want.is_empty());
                assert_eq!(update_script(from, to), want, "{from:?} -> {to:?}");
            }
        }
        assert!(
            differing > tables.len() * tables.len() / 2,
            "the cases differ"
        );
    }

    #[test]
    fn one_change_writes_one_element_whatever_the_table_size() {
        let mut from = Contents::new();
        for i in 0..1000u32 {
            from.open(IpAddr::V4((0x0a00_0000u32 + i).into()), [tcp(80)]);
        }
        let mut to = from.clone();
        to.insert_ip(ip("10.1.0.1"));
        assert_eq!(
            update_script(&from, &to),
            "add element inet aliaslb held4 { 10.1.0.1 }\n"
        );
    }

    #[test]
    fn a_table_short_of_a_chain_rule_or_set_is_damaged() {
        let chains = |names: &[&str]| names.iter().map(|n| (*n).to_owned()).collect();
        let whole: BTreeSet<String> = chains(&["guard4", "guard6", "input", "prerouting"]);
        assert_eq!(chain_damage(Some(&whole), false), None);
        assert!(
            chain_damage(Some(&whole), true).is_some(),
            "input with IPVS"
        );
        assert!(chain_damage(None, false).unwrap().contains("no table"));
        let ipvs: BTreeSet<String> = chains(&["guard4", "guard6", "prerouting"]);
        assert_eq!(chain_damage(Some(&ipvs), true), None);
        assert!(chain_damage(Some(&ipvs), false).is_some());

        let view = TableView {
            rules: expected_rules(false),
            sets: SETS.map(str::to_owned).into(),
            dropped: Dropped::default(),
        };
        assert_eq!(damage(Some(&view), false), None);
        let mut flushed = view.clone();
        flushed.rules.values_mut().for_each(|n| *n = 0);
        assert!(
            damage(Some(&flushed), false)
                .unwrap()
                .contains("rules per chain")
        );
        let mut no_set = view.clone();
        no_set.sets.remove("ports6");
        assert!(damage(Some(&no_set), false).unwrap().contains("ports6"));
        assert!(damage(None, false).is_some());
    }
}
