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

/// Longest namespace name (a DNS-1123 label).
const MAX_NAMESPACE_LEN: usize = 63;

/// Identifies a pool: a namespace's own pool or the cluster-wide fallback.
///
/// Orders namespaces by name, the fallback last. Displays as the ConfigMap key.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PoolKey {
    /// The pool of the namespace with this name.
    Namespace(String),
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
        }
        Err(message)
    }

    /// The ConfigMap key of this pool.
    pub fn as_str(&self) -> &str {
        match self {
            PoolKey::Namespace(ns) => ns,
            PoolKey::Fallback => FALLBACK_KEY,
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
}

impl Pool {
    /// A pool of `entries` with default options.
    pub fn from_entries(entries: Vec<PoolEntry>) -> Pool {
        let mut sorted: Vec<IpRange> = entries.iter().map(|e| e.range).collect();
        sorted.sort();
        Pool {
            ranges: merge_sorted(sorted),
            entries,
            options: PoolOptions::default(),
        }
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
        // `IpAddr` orders IPv4 before IPv6, like `ranges`.
        let after = self.ranges.partition_point(|r| r.first() <= ip);
        after > 0 && self.ranges[after - 1].contains(ip)
    }
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

/// Parsed, validated configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolConfig {
    pools: BTreeMap<PoolKey, Pool>,
}

impl PoolConfig {
    /// Parses the ConfigMap's `data` map, reporting all errors at once, sorted by key and
    /// then by line.
    pub fn parse(data: &BTreeMap<String, String>) -> Result<PoolConfig, Vec<PoolConfigError>> {
        let mut errors = Vec::new();
        let mut pools = BTreeMap::new();
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
                errors.push(PoolConfigError::for_key(
                    key,
                    format!(
                        "the pool is empty: list at least one address, CIDR or range, or remove \
                         the key (a namespace with a key of its own never draws from \
                         `{FALLBACK_KEY}`, so an empty key leaves its Services pending)"
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
                        }
                    }
                }
                Err(option_errors) => errors.extend(option_errors),
            }
        }
        if errors.is_empty() {
            Ok(PoolConfig { pools })
        } else {
            // Stable sort: errors of one line keep the order they were found in.
            errors.sort_by(|a, b| (&a.key, a.line).cmp(&(&b.key, b.line)));
            Err(errors)
        }
    }

    /// The pool `namespace` draws from: its own key, else the fallback, else `None`.
    pub fn pool_for_namespace(&self, namespace: &str) -> Option<(&PoolKey, &Pool)> {
        self.pools
            .get_key_value(&PoolKey::Namespace(namespace.to_owned()))
            .or_else(|| self.pools.get_key_value(&PoolKey::Fallback))
    }

    /// Every pool, namespaces by name, then the fallback.
    pub fn pools(&self) -> impl Iterator<Item = (&PoolKey, &Pool)> {
        self.pools.iter()
    }

    /// The pool with key `key`.
    pub fn pool(&self, key: &PoolKey) -> Option<&Pool> {
        self.pools.get(key)
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
