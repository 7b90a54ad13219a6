//! The pool ConfigMap: its format, parsed and validated into a [`PoolConfig`].
//!
//! Owns the meaning of the operator-edited ConfigMap (default `aliaslb-pools`). Pure: it
//! takes the ConfigMap's `data` map and returns data or errors, no I/O.
//!
//! # Format
//! Each key is a namespace name; its value lists the addresses that namespace's
//! LoadBalancer Services draw from, one entry per line:
//! ```yaml
//! data:
//!   default: |-
//!      192.168.55.10
//!      192.168.55.11
//!   staging: |
//!      10.0.7.0/29          # CIDR
//!      10.0.8.20-10.0.8.40  # inclusive range
//!      2001:db8:5::/64      # IPv6 is first-class
//!   _fallback: |
//!      10.0.9.0/28
//!   config.yaml: |
//!     pools:
//!       staging:
//!         interface: eth1
//!         nodeSelector: {topology.kubernetes.io/zone: a}
//!         allowSharing: false
//! ```
//! - An entry is a single IPv4 or IPv6 address, a CIDR, or an inclusive range `first-last`
//!   of one family. `#` starts a comment; blank lines and surrounding spaces are ignored.
//! - **IPv4 CIDRs shorter than /31 skip their network and broadcast addresses**
//!   (`10.0.7.0/29` yields `10.0.7.1-10.0.7.6`): hosts on that subnet treat them as
//!   special. /31 (RFC 3021 point-to-point) and /32 use every address.
//! - **IPv6 prefixes have no broadcast address, so they keep their last address, but
//!   prefixes shorter than /127 skip their first one**, the Subnet-Router anycast address
//!   (RFC 4291 §2.6.1): routers on a link answer for it, so a VIP there would collide with
//!   the gateway. A /64 therefore holds 2^64 - 1 addresses.
//!   /127 (RFC 6164) and /128 use every address. A single address or an explicit range is
//!   otherwise taken as written.
//! - **No entry may touch an address that cannot be a load-balancer IP**: unspecified,
//!   loopback, link-local, multicast, broadcast or IPv4-mapped (`127.0.0.1`, `0.0.0.0/0`, `fe80::1`,
//!   `ff02::1`, ...); the error names the block.
//! - A CIDR with host bits set (`10.0.7.3/29`) is an error naming the network form.
//! - [`FALLBACK_KEY`] (`_fallback`) is the cluster-wide pool, used only by namespaces that
//!   have **no key of their own**: a namespace with its own key never draws from it
//!   (tenant fencing). `_` cannot occur in a namespace name, so the key cannot clash.
//! - [`OPTIONS_KEY`] (`config.yaml`, not a namespace name either because of the `.`) holds
//!   optional per-pool options as YAML; see [`PoolOptions`].
//! - A key with no entries is an **error**, not a warning: since a namespace with its own
//!   key never falls back, an empty key silently leaves that namespace's Services pending.
//! - No address may appear twice, neither within one key nor across keys.
//!
//! # Named pools, draining and manual-only pools
//! Beyond the classic keys, a key `pool.NAME` ([`NAMED_PREFIX`]; `.` never occurs in a
//! namespace name, so no classic key is one) is a **named pool**: its value lists addresses
//! as above, and its options in [`OPTIONS_KEY`] say which namespaces may draw from it
//! (`namespaces`, a list, and/or `namespaceSelector`, labels a namespace must all carry).
//! A Service names its pool with `aliaslb.io/pool: NAME`; without it, it gets its
//! namespace's default ([`Tenancy`] states the rule). Every key or option this adds was an
//! error before, so a ConfigMap in the classic format means exactly what it meant.
//! ```yaml
//! data:
//!   team-a: |
//!     10.0.1.0/28
//!     10.0.2.0/28 draining     # no new address from this entry; those in use stay
//!   pool.internal: |
//!     10.0.3.0/24
//!   pool.public: |
//!     203.0.113.0/28
//!   config.yaml: |
//!     pools:
//!       pool.internal:
//!         namespaces: [team-a, team-b]
//!         namespaceSelector: {tier: internal}
//!       pool.public:
//!         announce: bgp
//!         namespaces: [team-a]
//!         autoAssign: false    # only for Services that name the pool or one of its IPs
//! ```
//! - An entry followed by the word `draining` is draining: the addresses of it that
//!   Services hold stay theirs, none is handed out anew. `draining: true` in the options
//!   drains the whole pool.
//! - `autoAssign: false`: the pool is never a namespace's default; its addresses go only
//!   to Services that name the pool or request one of its addresses.
//!
//! Pools are kept as ranges only, never as lists of addresses, so a /64 costs the same as
//! a /30; overlap detection sorts all entries once and sweeps (O(n log n)).
//!
//! # Errors
//! [`PoolConfig::parse`] reports every problem at once, sorted by key and then by line,
//! each naming the key, the 1-based line within the value and the offending text.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

use crate::range::{Family, IpRange};

mod entry;
mod options;

pub use entry::parse_entry;
pub use options::{Announce, OnConflict, PoolOptions};

/// ConfigMap key of the cluster-wide fallback pool.
pub const FALLBACK_KEY: &str = "_fallback";
/// ConfigMap key holding per-pool options as YAML.
pub const OPTIONS_KEY: &str = "config.yaml";
/// Prefix of the ConfigMap key of a named pool: `pool.NAME`.
pub const NAMED_PREFIX: &str = "pool.";
/// The word after an entry that marks it draining.
pub const DRAINING: &str = "draining";

/// Longest namespace name (a DNS-1123 label).
const MAX_NAMESPACE_LEN: usize = 63;

/// Identifies a pool: a namespace's own pool, a named pool or the cluster-wide fallback.
///
/// Orders namespaces by name, then named pools by name, the fallback last. Displays as the
/// ConfigMap key.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PoolKey {
    /// The pool of the namespace with this name.
    Namespace(String),
    /// A named pool: the whole key, `pool.NAME` ([`NAMED_PREFIX`]). (A `Box<str>`: the
    /// key then fits in the size of a `String`, and the planner keeps one per address in
    /// use.)
    Named(Box<str>),
    /// The cluster-wide fallback pool ([`FALLBACK_KEY`]).
    Fallback,
}

impl PoolKey {
    /// The pool key for ConfigMap key `key`, or why `key` is not one.
    ///
    /// [`OPTIONS_KEY`] is not a pool key either.
    pub fn from_config_key(key: &str) -> Result<PoolKey, String> {
        if key == FALLBACK_KEY {
            return Ok(PoolKey::Fallback);
        }
        if key == OPTIONS_KEY {
            return Err(format!("`{OPTIONS_KEY}` holds pool options, not addresses"));
        }
        if is_namespace_name(key) {
            return Ok(PoolKey::Namespace(key.to_owned()));
        }
        if let Some(name) = key.strip_prefix(NAMED_PREFIX) {
            if is_namespace_name(name) {
                return Ok(PoolKey::Named(key.into()));
            }
            let mut message = format!(
                "not a valid named pool key: `{NAMED_PREFIX}` is followed by the pool's name, \
                 at most {MAX_NAMESPACE_LEN} lowercase letters, digits and '-', starting and \
                 ending with a letter or digit"
            );
            if is_namespace_name(&name.to_ascii_lowercase()) {
                message.push_str(&format!(
                    "; did you mean `{NAMED_PREFIX}{}`?",
                    name.to_ascii_lowercase()
                ));
            }
            return Err(message);
        }
        let mut message = format!(
            "not a valid pool key: keys are namespace names (DNS-1123 labels: at most \
             {MAX_NAMESPACE_LEN} lowercase letters, digits and '-', starting and ending with a \
             letter or digit), `{FALLBACK_KEY}` or `{OPTIONS_KEY}`"
        );
        if key.starts_with('_') {
            message = format!(
                "unknown reserved key: the only reserved keys are `{FALLBACK_KEY}` and \
                 `{OPTIONS_KEY}`; other keys are namespace names"
            );
        } else if key.len() > MAX_NAMESPACE_LEN {
            message.push_str(&format!(" (this one is {} characters long)", key.len()));
        } else if is_namespace_name(&key.to_ascii_lowercase()) {
            message.push_str(&format!("; did you mean `{}`?", key.to_ascii_lowercase()));
        } else if key.contains('.') {
            message.push_str(&format!(
                "; a named pool's key is `{NAMED_PREFIX}` and its name, e.g. `{NAMED_PREFIX}internal`"
            ));
        }
        Err(message)
    }

    /// The pool a Service names with `aliaslb.io/pool`: a named pool by its name (`NAME`,
    /// or its whole key `pool.NAME`) or [`FALLBACK_KEY`]; `None` for anything else (a
    /// namespace's own key is its default, never named).
    pub fn from_annotation(value: &str) -> Option<PoolKey> {
        let value = value.trim();
        if value == FALLBACK_KEY {
            return Some(PoolKey::Fallback);
        }
        let name = value.strip_prefix(NAMED_PREFIX).unwrap_or(value);
        is_namespace_name(name).then(|| PoolKey::Named(format!("{NAMED_PREFIX}{name}").into()))
    }

    /// The ConfigMap key of this pool.
    pub fn as_str(&self) -> &str {
        match self {
            PoolKey::Namespace(ns) => ns,
            PoolKey::Named(key) => key,
            PoolKey::Fallback => FALLBACK_KEY,
        }
    }

    /// How a Service names this pool in `aliaslb.io/pool` (`NAME` of a named pool,
    /// `_fallback`), or the namespace of a namespace's own pool.
    pub fn name(&self) -> &str {
        match self {
            PoolKey::Named(key) => key.strip_prefix(NAMED_PREFIX).unwrap_or(key),
            other => other.as_str(),
        }
    }
}

impl fmt::Display for PoolKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether `s` is a valid namespace name: a DNS-1123 label (`[a-z0-9]([-a-z0-9]*[a-z0-9])?`,
/// at most 63 characters).
pub fn is_namespace_name(s: &str) -> bool {
    let bytes = s.as_bytes();
    let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    !bytes.is_empty()
        && bytes.len() <= MAX_NAMESPACE_LEN
        && bytes.iter().all(|b| alnum(b) || *b == b'-')
        && bytes.first().is_some_and(alnum)
        && bytes.last().is_some_and(alnum)
}

/// One entry of a pool, as the operator wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolEntry {
    /// 1-based line within the key's value.
    pub line: usize,
    /// The entry as written, without comment and surrounding spaces.
    pub text: String,
    /// The addresses the entry stands for (after the CIDR rules in the module docs).
    pub range: IpRange,
    /// Marked `draining`: none of its addresses is handed out anew.
    pub draining: bool,
}

/// One validated pool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pool {
    /// The pool's addresses: sorted (IPv4 first), non-overlapping, merged where adjacent.
    pub ranges: Vec<IpRange>,
    /// The entries as written, in line order (for summaries and status).
    pub entries: Vec<PoolEntry>,
    /// Options from [`OPTIONS_KEY`], or the defaults.
    pub options: PoolOptions,
    /// The addresses of the entries marked `draining`, sorted and merged like `ranges`
    /// (see [`Pool::closed`] for the whole pool draining).
    pub draining: Vec<IpRange>,
}

impl Pool {
    /// A pool of `entries` with default options.
    pub fn from_entries(entries: Vec<PoolEntry>) -> Pool {
        let mut sorted: Vec<IpRange> = entries.iter().map(|e| e.range).collect();
        sorted.sort();
        let mut draining: Vec<IpRange> = entries
            .iter()
            .filter(|e| e.draining)
            .map(|e| e.range)
            .collect();
        draining.sort();
        Pool {
            ranges: merge_sorted(sorted),
            entries,
            options: PoolOptions::default(),
            draining: merge_sorted(draining),
        }
    }

    /// The addresses none of which is handed out anew: every address while the pool is
    /// draining (`draining: true`), else those of its entries marked `draining`.
    pub fn closed(&self) -> &[IpRange] {
        if self.options.draining {
            &self.ranges
        } else {
            &self.draining
        }
    }

    /// Whether `ip` is one of the pool's addresses none of which is handed out anew.
    pub fn is_closed(&self, ip: IpAddr) -> bool {
        sorted_contain(self.closed(), ip)
    }

    /// Whether some address of the pool can be handed out anew (it is not all draining).
    pub fn is_open(&self) -> bool {
        !self.options.draining && self.draining != self.ranges
    }

    /// Whether the pool can be a namespace's default: it assigns addresses unasked
    /// (`autoAssign`, the default) and is not all draining.
    pub fn assigns_unasked(&self) -> bool {
        self.options.auto_assign && self.is_open()
    }

    /// Number of addresses of `family` in the pool, saturating at `u128::MAX` (reached only
    /// by a pool holding every IPv6 address).
    pub fn size(&self, family: Family) -> u128 {
        self.ranges
            .iter()
            .filter(|r| r.family() == family)
            .fold(0u128, |sum, r| sum.saturating_add(r.len()))
    }

    /// Whether `ip` is one of the pool's addresses. O(log n) in ranges.
    pub fn contains(&self, ip: IpAddr) -> bool {
        sorted_contain(&self.ranges, ip)
    }

    /// Whether this pool's options give namespaces access by their labels
    /// (`namespaceSelector`).
    pub fn selects_namespaces(&self) -> bool {
        !self.options.namespace_selector.is_empty()
    }
}

/// Whether one of `ranges` (sorted, disjoint) holds `ip`. O(log n).
fn sorted_contain(ranges: &[IpRange], ip: IpAddr) -> bool {
    // `IpAddr` orders IPv4 before IPv6, like the ranges.
    let after = ranges.partition_point(|r| r.first() <= ip);
    after > 0 && ranges[after - 1].contains(ip)
}

/// Merges sorted ranges that overlap or touch.
fn merge_sorted(sorted: Vec<IpRange>) -> Vec<IpRange> {
    let mut merged: Vec<IpRange> = Vec::with_capacity(sorted.len());
    for r in sorted {
        if let Some(last) = merged.last_mut()
            && last.family() == r.family()
            && crate::range::to_u128(r.first())
                <= crate::range::to_u128(last.last()).saturating_add(1)
        {
            if r.last() > last.last() {
                *last = IpRange::new(last.first(), r.last()).expect("same family, ordered ends");
            }
            continue;
        }
        merged.push(r);
    }
    merged
}

/// The labels of one namespace.
pub type Labels = BTreeMap<String, String>;

/// Parsed, validated configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolConfig {
    pools: BTreeMap<PoolKey, Pool>,
    /// The named pools with options, in the order [`OPTIONS_KEY`] lists them: the order in
    /// which a namespace's default is looked for ([`Tenancy`]).
    named: Vec<PoolKey>,
}

/// The pools one namespace may draw from, in the order its default is chosen, and the rule
/// for keeping an address. Built by [`PoolConfig::tenancy`].
///
/// The rule (the tenant fence): a namespace may draw from
/// 1. its own key, if it has one;
/// 2. every named pool whose `namespaces` lists it or whose `namespaceSelector` its labels
///    match, in the order `config.yaml` lists them;
/// 3. `_fallback`, if it has no key of its own.
///
/// A Service gets an address from the pool it names (`aliaslb.io/pool`), else from the pool
/// of the address it requests, else it keeps the pool its addresses (or its sharing
/// group's) are in, else it gets its namespace's **default: the first of those pools, in
/// that order, that assigns addresses unasked** (not `autoAssign: false`, not all
/// draining). Whatever the choice, an address is handed out only from a pool the namespace
/// may draw from.
///
/// An address a Service holds is kept while its namespace may draw from its pool, and
/// also, in a pool that grants by `namespaceSelector`, after the namespace stopped matching
/// it (a relabelled namespace keeps what it has, and gets nothing new there): a label edit
/// never renumbers a Service, an edit of the pool ConfigMap can.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenancy<'a> {
    namespace: String,
    pools: Vec<(&'a PoolKey, &'a Pool)>,
}

impl<'a> Tenancy<'a> {
    /// The namespace.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Every pool the namespace may draw from, in the order its default is looked for.
    pub fn pools(&self) -> &[(&'a PoolKey, &'a Pool)] {
        &self.pools
    }

    /// Whether the namespace may draw from no pool at all.
    pub fn is_empty(&self) -> bool {
        self.pools.is_empty()
    }

    /// Whether the namespace may draw new addresses from `key`.
    pub fn may_draw(&self, key: &PoolKey) -> bool {
        self.pools.iter().any(|(k, _)| *k == key)
    }

    /// Whether a Service of the namespace keeps an address of `key` (`pool`) it holds:
    /// see the rule above.
    pub fn keeps(&self, key: &PoolKey, pool: &Pool) -> bool {
        self.may_draw(key) || (matches!(key, PoolKey::Named(_)) && pool.selects_namespaces())
    }

    /// The namespace's default pool: the first that assigns addresses unasked.
    pub fn default_pool(&self) -> Option<(&'a PoolKey, &'a Pool)> {
        self.pools
            .iter()
            .copied()
            .find(|(_, p)| p.assigns_unasked())
    }

    /// The pools as `a, b, c` for messages.
    pub fn names(&self) -> String {
        let names: Vec<&str> = self.pools.iter().map(|(k, _)| k.as_str()).collect();
        names.join(", ")
    }
}

impl PoolConfig {
    /// Parses the ConfigMap's `data` map, reporting all errors at once, sorted by key and
    /// then by line.
    pub fn parse(data: &BTreeMap<String, String>) -> Result<PoolConfig, Vec<PoolConfigError>> {
        let mut errors = Vec::new();
        let mut pools = BTreeMap::new();
        let mut named = Vec::new();
        let mut all_entries = Vec::new();
        for (key, value) in data {
            if key == OPTIONS_KEY {
                continue;
            }
            let pool_key = PoolKey::from_config_key(key)
                .map_err(|message| errors.push(PoolConfigError::for_key(key, message)))
                .ok();
            let (entries, entry_errors) = entry::parse_value(key, value);
            if entries.is_empty() && entry_errors.is_empty() {
                let why = if matches!(pool_key, Some(PoolKey::Named(_))) {
                    "a Service that names it would stay pending".to_owned()
                } else {
                    format!(
                        "a namespace with a key of its own never draws from `{FALLBACK_KEY}`, \
                         so an empty key leaves its Services pending"
                    )
                };
                errors.push(PoolConfigError::for_key(
                    key,
                    format!(
                        "the pool is empty: list at least one address, CIDR or range, or remove \
                         the key ({why})"
                    ),
                ));
            }
            errors.extend(entry_errors);
            all_entries.extend(entries.iter().map(|e| Located {
                key,
                entry: e.clone(),
            }));
            if let Some(pool_key) = pool_key {
                pools.insert(pool_key, Pool::from_entries(entries));
            }
        }
        errors.extend(overlap_errors(all_entries));
        if let Some(text) = data.get(OPTIONS_KEY) {
            match options::parse(text, data) {
                Ok(options) => {
                    for (key, opts) in options {
                        if let Some(pool) = pools.get_mut(&key) {
                            pool.options = opts;
                            if matches!(key, PoolKey::Named(_)) {
                                named.push(key);
                            }
                        }
                    }
                }
                Err(option_errors) => errors.extend(option_errors),
            }
        }
        if errors.is_empty() {
            Ok(PoolConfig { pools, named })
        } else {
            // Stable sort: errors of one line keep the order they were found in.
            errors.sort_by(|a, b| (&a.key, a.line).cmp(&(&b.key, b.line)));
            Err(errors)
        }
    }

    /// The classic pool of `namespace`: its own key, else the fallback, else `None`. With
    /// named pools a namespace may draw from several: see [`PoolConfig::tenancy`].
    pub fn pool_for_namespace(&self, namespace: &str) -> Option<(&PoolKey, &Pool)> {
        self.pools
            .get_key_value(&PoolKey::Namespace(namespace.to_owned()))
            .or_else(|| self.pools.get_key_value(&PoolKey::Fallback))
    }

    /// The pools `namespace`, labelled `labels` (`None`: none known), may draw from, in the
    /// order its default is looked for ([`Tenancy`] states the rule). O(named pools).
    pub fn tenancy(&self, namespace: &str, labels: Option<&Labels>) -> Tenancy<'_> {
        let own = self
            .pools
            .get_key_value(&PoolKey::Namespace(namespace.to_owned()));
        let mut pools: Vec<(&PoolKey, &Pool)> = own.into_iter().collect();
        for key in &self.named {
            if let Some((key, pool)) = self.pools.get_key_value(key)
                && (pool.options.namespaces.iter().any(|n| n == namespace)
                    || labels.is_some_and(|l| pool.options.selects_namespace(l)))
            {
                pools.push((key, pool));
            }
        }
        if own.is_none()
            && let Some(fallback) = self.pools.get_key_value(&PoolKey::Fallback)
        {
            pools.push(fallback);
        }
        Tenancy {
            namespace: namespace.to_owned(),
            pools,
        }
    }

    /// The named pools a namespace labelled `labels` may draw from by its labels
    /// (`namespaceSelector`), in [`OPTIONS_KEY`] order. O(named pools).
    pub fn selected_by(&self, labels: &Labels) -> Vec<&PoolKey> {
        self.named
            .iter()
            .filter(|key| {
                self.pools
                    .get(*key)
                    .is_some_and(|p| p.options.selects_namespace(labels))
            })
            .collect()
    }

    /// Whether any named pool grants by `namespaceSelector`: only then do namespace labels
    /// matter.
    pub fn selects_namespaces(&self) -> bool {
        self.named
            .iter()
            .any(|key| self.pools.get(key).is_some_and(Pool::selects_namespaces))
    }

    /// The pool holding `ip` (pools never overlap). O(pools x log ranges).
    pub fn pool_of(&self, ip: IpAddr) -> Option<(&PoolKey, &Pool)> {
        self.pools.iter().find(|(_, pool)| pool.contains(ip))
    }

    /// The named pools with options, in the order [`OPTIONS_KEY`] lists them.
    pub fn named(&self) -> impl Iterator<Item = (&PoolKey, &Pool)> {
        self.named
            .iter()
            .filter_map(|key| self.pools.get_key_value(key))
    }

    /// Every pool, namespaces by name, then the fallback.
    pub fn pools(&self) -> impl Iterator<Item = (&PoolKey, &Pool)> {
        self.pools.iter()
    }

    /// The pool with key `key`.
    pub fn pool(&self, key: &PoolKey) -> Option<&Pool> {
        self.pools.get(key)
    }

    /// The pool with key `key`, with the config's own copy of the key.
    pub fn keyed(&self, key: &PoolKey) -> Option<(&PoolKey, &Pool)> {
        self.pools.get_key_value(key)
    }
}

/// An entry with the key it was written under, for overlap detection across keys.
struct Located<'a> {
    key: &'a str,
    entry: PoolEntry,
}

/// One error per entry that shares an address with an entry sorting before it.
///
/// Sort + sweep, O(n log n): in address order, an entry overlaps an earlier one exactly
/// when it starts at or before the furthest end seen so far, so it is reported against the
/// entry reaching furthest.
fn overlap_errors(mut all: Vec<Located<'_>>) -> Vec<PoolConfigError> {
    all.sort_by(|a, b| {
        (a.entry.range, a.key, a.entry.line).cmp(&(b.entry.range, b.key, b.entry.line))
    });
    let mut errors = Vec::new();
    let mut furthest: Option<&Located<'_>> = None;
    for cur in &all {
        if let Some(prev) = furthest {
            if prev.entry.range.overlaps(&cur.entry.range) {
                let message = if prev.key == cur.key {
                    format!(
                        "overlaps line {} (`{}`) of the same key: list each address once",
                        prev.entry.line, prev.entry.text
                    )
                } else {
                    format!(
                        "overlaps key {}, line {} (`{}`): an address can belong to one pool \
                         only; remove it from one of the two keys",
                        prev.key, prev.entry.line, prev.entry.text
                    )
                };
                errors.push(PoolConfigError::for_line(
                    cur.key,
                    cur.entry.line,
                    &cur.entry.text,
                    message,
                ));
            }
            // `IpAddr` orders IPv4 before IPv6, so the first IPv6 entry always moves ahead.
            if cur.entry.range.last() <= prev.entry.range.last() {
                continue;
            }
        }
        furthest = Some(cur);
    }
    errors
}

/// A problem in the pool ConfigMap.
///
/// Displays as ``key NAME, line N: message (`text`)``; without line or text, those parts
/// are left out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolConfigError {
    /// The ConfigMap key the problem is in.
    pub key: String,
    /// 1-based line within the key's value; `None` when the problem is the key itself.
    pub line: Option<usize>,
    /// The offending text (an entry, or the line of `config.yaml`); may be empty.
    pub text: String,
    /// What is wrong and what would be valid.
    pub message: String,
}

impl PoolConfigError {
    fn for_key(key: &str, message: String) -> Self {
        PoolConfigError {
            key: key.to_owned(),
            line: None,
            text: String::new(),
            message,
        }
    }

    fn for_line(key: &str, line: usize, text: &str, message: String) -> Self {
        PoolConfigError {
            key: key.to_owned(),
            line: Some(line),
            text: text.to_owned(),
            message,
        }
    }
}

impl fmt::Display for PoolConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "key {}", self.key)?;
        if let Some(line) = self.line {
            write!(f, ", line {line}")?;
        }
        write!(f, ": {}", self.message)?;
        if !self.text.is_empty() {
            write!(f, " (`{}`)", self.text)?;
        }
        Ok(())
    }
}

impl std::error::Error for PoolConfigError {}
