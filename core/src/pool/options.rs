//! Per-pool options: the YAML under the [`OPTIONS_KEY`] key, parsed with yaml_serde and
//! checked against the pools that exist. Pure, no I/O.
//!
//! ```yaml
//! pools:
//!   staging:                  # a pool key: namespace name or `_fallback`
//!     interface: eth1         # NIC to put the aliases on
//!     nodeSelector:           # labels a node must all carry to announce this pool
//!       topology.kubernetes.io/zone: a
//!     allowSharing: false     # default true
//!   routed:
//!     announce: bgp           # `l2` (default): one node answers ARP/NDP; `bgp`: L3 mode
//!     maxNodes: 4             # bgp only: at most this many nodes announce each IP
//!   shared-lan:
//!     onConflict: renumber    # l2 only; `defend` (default): a LAN claim never moves an IP
//!   pinned-clients:
//!     virtualMAC: true        # l2 only: each IP answered from its own MAC, which moves with it
//! ```
//! Unknown fields are errors (a misspelt option must not be silently ignored), and so are
//! options for a key that has no pool.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::{OPTIONS_KEY, PoolConfigError, PoolKey};

/// Longest Linux interface name (`IFNAMSIZ` - 1).
const MAX_INTERFACE_LEN: usize = 15;

/// Deepest nesting of `[` and `{` accepted before the text reaches yaml_serde. A valid
/// document needs three levels (`pools`, a pool, `nodeSelector`), but libyaml scans flow
/// collections in time quadratic in their depth (16,000 levels take seconds), so a
/// ConfigMap-sized value of `[` would stall the parser for minutes.
const MAX_FLOW_DEPTH: usize = 64;

/// Options of one pool, from [`OPTIONS_KEY`]; the defaults when it has none.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolOptions {
    /// The NIC the agent puts this pool's aliases on; `None`: the interface whose subnet
    /// holds the address.
    pub interface: Option<String>,
    /// Labels a node must all carry (like `matchLabels`) to announce this pool's addresses;
    /// empty: every node.
    pub node_selector: BTreeMap<String, String>,
    /// Whether Services of the pool may share an address through the
    /// `aliaslb.io/sharing-key` annotation. Default true.
    pub allow_sharing: bool,
    /// How the pool's addresses reach the network. Default [`Announce::L2`].
    pub announce: Announce,
    /// L3 mode only: at most this many nodes announce each address; `None`: every eligible
    /// node.
    pub max_nodes: Option<usize>,
    /// L2 mode only: what a LAN claim from a host outside the cluster does to an address a
    /// Service already holds. Default [`OnConflict::Defend`].
    pub on_conflict: OnConflict,
    /// L2 mode only: each address is answered from its own locally administered MAC
    /// ([`crate::mac::virtual_mac`]), on a macvlan the holder creates on the LAN interface,
    /// so the MAC moves with the address and clients that ignore gratuitous ARP keep
    /// reaching it. Default false.
    pub virtual_mac: bool,
}

/// What a LAN claim by a host outside the cluster does to an address a Service holds
/// (`onConflict` in the options). A first claim is probed and a taken address skipped
/// either way.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase", expecting = "`defend` or `renumber`")]
pub enum OnConflict {
    /// The holder defends the address (RFC 5227 2.4 (c)) and the Service keeps it; the
    /// claim is shown on the Service (Announced `AddressDefended`, a Warning Event naming
    /// the MAC). One forged frame changes nothing.
    #[default]
    Defend,
    /// The address is fenced and the Service gets another one of the pool, as for a first
    /// claim found taken: for a LAN where a host outside the cluster may rightly own an
    /// address of the pool (static assignments nobody told the pool about), and no host
    /// that should not is on it.
    Renumber,
}

impl OnConflict {
    /// The name as the options write it.
    pub fn as_str(self) -> &'static str {
        match self {
            OnConflict::Defend => "defend",
            OnConflict::Renumber => "renumber",
        }
    }
}

/// How a pool's addresses reach the network (`announce` in the options).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase", expecting = "`l2` or `bgp`")]
pub enum Announce {
    /// One node per address carries it as an alias on its LAN interface and answers ARP /
    /// NDP for it (gratuitous ARP, unsolicited NA on a move).
    #[default]
    L2,
    /// Every chosen node carries the address on a local device (`aliaslb0`, else `lo`) and
    /// the node's routing daemon (BIRD, FRR) announces it over BGP; the router spreads the
    /// traffic over them (ECMP). No ARP / NDP for it.
    Bgp,
}

impl Announce {
    /// The name as the options write it.
    pub fn as_str(self) -> &'static str {
        match self {
            Announce::L2 => "l2",
            Announce::Bgp => "bgp",
        }
    }
}

impl Default for PoolOptions {
    fn default() -> Self {
        PoolOptions {
            interface: None,
            node_selector: BTreeMap::new(),
            allow_sharing: true,
            announce: Announce::L2,
            max_nodes: None,
            on_conflict: OnConflict::Defend,
            virtual_mac: false,
        }
    }
}

impl PoolOptions {
    /// Whether a node with `labels` matches the node selector.
    pub fn selects(&self, labels: &BTreeMap<String, String>) -> bool {
        self.node_selector
            .iter()
            .all(|(k, v)| labels.get(k).is_some_and(|have| have == v))
    }
}

// `expecting` replaces the Rust type names in serde's "invalid type" messages.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping with key `pools`")]
struct OptionsDoc {
    #[serde(default)]
    pools: Option<BTreeMap<String, Option<RawOptions>>>,
}

#[derive(Debug, Deserialize)]
#[serde(
    deny_unknown_fields,
    rename_all = "camelCase",
    expecting = "a mapping of `interface`, `nodeSelector`, `allowSharing`, `announce`, `maxNodes`, `onConflict`, `virtualMAC`"
)]
struct RawOptions {
    interface: Option<String>,
    node_selector: Option<BTreeMap<String, String>>,
    allow_sharing: Option<bool>,
    announce: Option<Announce>,
    max_nodes: Option<u32>,
    on_conflict: Option<OnConflict>,
    #[serde(rename = "virtualMAC")]
    virtual_mac: Option<bool>,
}

/// The options in `text` (the value of [`OPTIONS_KEY`]) by pool key, or every problem
/// found. `data` is the whole ConfigMap, to check that each options key has a pool.
pub(super) fn parse(
    text: &str,
    data: &BTreeMap<String, String>,
) -> Result<BTreeMap<PoolKey, PoolOptions>, Vec<PoolConfigError>> {
    check_flow_depth(text).map_err(|e| vec![e])?;
    let doc: Option<OptionsDoc> = yaml_serde::from_str(text).map_err(|e| {
        let line = e.location().and_then(|l| line_at(text, l.index()));
        let text = line
            .and_then(|l| text.lines().nth(l - 1))
            .map_or("", str::trim);
        vec![PoolConfigError {
            key: OPTIONS_KEY.to_owned(),
            line,
            text: text.to_owned(),
            message: format!(
                "not valid options YAML: {e}; expected `pools:` mapping pool keys to \
                 `interface`, `nodeSelector`, `allowSharing`, `announce` (`l2` or `bgp`), \
                 `maxNodes`, `onConflict` (`defend` or `renumber`) and `virtualMAC`"
            ),
        }]
    })?;
    let mut errors = Vec::new();
    let mut options = BTreeMap::new();
    for (key, raw) in doc.and_then(|d| d.pools).unwrap_or_default() {
        let line = key_line(text, &key);
        let mut error = |message: String| {
            errors.push(PoolConfigError {
                key: OPTIONS_KEY.to_owned(),
                line,
                text: line
                    .and_then(|l| text.lines().nth(l - 1))
                    .map_or("", str::trim)
                    .to_owned(),
                message,
            })
        };
        let pool_key = match PoolKey::from_config_key(&key) {
            Ok(pool_key) if data.contains_key(&key) => pool_key,
            Ok(_) => {
                error(format!(
                    "options for `{key}`, which has no pool: add a `{key}` key with its \
                     addresses, or remove these options"
                ));
                continue;
            }
            Err(message) => {
                error(format!("options for `{key}`: {message}"));
                continue;
            }
        };
        let raw = raw.unwrap_or(RawOptions {
            interface: None,
            node_selector: None,
            allow_sharing: None,
            announce: None,
            max_nodes: None,
            on_conflict: None,
            virtual_mac: None,
        });
        let announce = raw.announce.unwrap_or_default();
        match (announce, raw.max_nodes) {
            (Announce::L2, Some(_)) => error(format!(
                "pool `{key}`: `maxNodes` applies to `announce: bgp` only (in L2 mode one node \
                 carries each address); remove it or add `announce: bgp`"
            )),
            (Announce::Bgp, Some(0)) => error(format!(
                "pool `{key}`: `maxNodes: 0` would announce the addresses nowhere; give at \
                 least 1, or leave it out to announce from every eligible node"
            )),
            _ => {}
        }
        if announce == Announce::Bgp && raw.interface.is_some() {
            error(format!(
                "pool `{key}`: `interface` applies to `announce: l2` only (in BGP mode the \
                 agent puts the addresses on its own device, `aliaslb0` or `lo`); remove it"
            ));
        }
        if announce == Announce::Bgp && raw.on_conflict.is_some() {
            error(format!(
                "pool `{key}`: `onConflict` applies to `announce: l2` only (in BGP mode no \
                 address is claimed with ARP or NDP); remove it"
            ));
        }
        if announce == Announce::Bgp && raw.virtual_mac == Some(true) {
            error(format!(
                "pool `{key}`: `virtualMAC` applies to `announce: l2` only (in BGP mode the \
                 router reaches the addresses through the nodes' own MACs); remove it"
            ));
        }
        if let Some(name) = &raw.interface
            && let Err(why) = check_interface(name)
        {
            error(format!("pool `{key}`: interface `{name}` {why}"));
        }
        let node_selector = raw.node_selector.unwrap_or_default();
        for (label, value) in &node_selector {
            if let Err(why) = check_label(label, value) {
                error(format!(
                    "pool `{key}`: nodeSelector `{label}: {value}`: {why}"
                ));
            }
        }
        options.insert(
            pool_key,
            PoolOptions {
                interface: raw.interface,
                node_selector,
                allow_sharing: raw.allow_sharing.unwrap_or(true),
                announce,
                max_nodes: raw.max_nodes.map(|n| n as usize),
                on_conflict: raw.on_conflict.unwrap_or_default(),
                virtual_mac: raw.virtual_mac.unwrap_or(false),
            },
        );
    }
    if errors.is_empty() {
        Ok(options)
    } else {
        Err(errors)
    }
}

/// Refuses `text` if `[` and `{` nest deeper than [`MAX_FLOW_DEPTH`], naming the line.
///
/// Counts every bracket, also those in quotes and comments: a valid document has no
/// brackets there to speak of, and a count that is never too low keeps the guard simple.
fn check_flow_depth(text: &str) -> Result<(), PoolConfigError> {
    let mut depth = 0usize;
    for (index, line) in text.lines().enumerate() {
        for c in line.chars() {
            match c {
                '[' | '{' => depth += 1,
                ']' | '}' => depth = depth.saturating_sub(1),
                _ => continue,
            }
            if depth > MAX_FLOW_DEPTH {
                return Err(PoolConfigError {
                    key: OPTIONS_KEY.to_owned(),
                    line: Some(index + 1),
                    text: line.trim().to_owned(),
                    message: format!(
                        "`[` and `{{` nested more than {MAX_FLOW_DEPTH} levels deep: options \
                         need at most three (`pools`, a pool, `nodeSelector`)"
                    ),
                });
            }
        }
    }
    Ok(())
}

/// 1-based line of `text`, as [`str::lines`] counts them, holding byte `index` of a YAML
/// error; `None` for an empty text.
///
/// Not yaml_serde's own line number: libyaml also breaks lines at a lone `\r` and at
/// U+0085/U+2028/U+2029, and places errors found at the end of the input on the line after
/// the last, both of which would name a line the value does not have.
fn line_at(text: &str, index: usize) -> Option<usize> {
    let before = text.as_bytes().get(..index).unwrap_or(text.as_bytes());
    let line = before.iter().filter(|b| **b == b'\n').count() + 1;
    let count = text.lines().count();
    (count > 0).then(|| line.min(count))
}

/// 1-based line of `key:` under `pools:` in `text`, best effort (block style only).
fn key_line(text: &str, key: &str) -> Option<usize> {
    let candidates = [
        format!("{key}:"),
        format!("\"{key}\":"),
        format!("'{key}':"),
    ];
    let mut lines = text.lines().enumerate();
    let (pools_index, _) = lines.find(|(_, l)| l.trim_start().starts_with("pools:"))?;
    lines
        .find(|(_, l)| {
            let l = l.trim_start();
            candidates.iter().any(|c| l.starts_with(c.as_str()))
        })
        .map_or(Some(pools_index + 1), |(i, _)| Some(i + 1))
}

/// Linux's rules for interface names (`dev_valid_name` in net/core/dev.c).
fn check_interface(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_INTERFACE_LEN {
        return Err(format!(
            "is not a valid interface name: it must be 1 to {MAX_INTERFACE_LEN} characters long"
        ));
    }
    if name == "."
        || name == ".."
        || name.contains(|c: char| c == '/' || c == ':' || c.is_whitespace())
    {
        return Err(
            "is not a valid interface name: it may not be `.` or `..` nor contain `/`, `:` or \
             spaces"
                .to_owned(),
        );
    }
    // The same rule as the agent's (`crate::report::interface_name_error`): an option
    // accepted here is never a line the agent refuses.
    if name.chars().any(char::is_control) {
        return Err(
            "is not a valid interface name: it may not contain control characters".to_owned(),
        );
    }
    debug_assert!(crate::report::interface_name_error(name).is_none());
    Ok(())
}

/// Kubernetes' rules for label keys (`[prefix/]name`) and values.
fn check_label(key: &str, value: &str) -> Result<(), String> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix
        && !is_dns_subdomain(prefix)
    {
        return Err(format!(
            "label prefix `{prefix}` must be a DNS subdomain (lowercase letters, digits, '-' \
             and '.', at most 253 characters)"
        ));
    }
    if name.is_empty() || !is_label_value(name) {
        return Err(format!(
            "label name `{name}` must be 1 to 63 letters, digits, '-', '_' or '.', starting \
             and ending with a letter or digit"
        ));
    }
    if !is_label_value(value) {
        return Err(format!(
            "label value `{value}` must be at most 63 letters, digits, '-', '_' or '.', \
             starting and ending with a letter or digit"
        ));
    }
    Ok(())
}

/// `([A-Za-z0-9][-A-Za-z0-9_.]*[A-Za-z0-9])?`, at most 63 characters.
fn is_label_value(s: &str) -> bool {
    let b = s.as_bytes();
    b.is_empty()
        || (b.len() <= 63
            && b.iter()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
            && b.first().is_some_and(u8::is_ascii_alphanumeric)
            && b.last().is_some_and(u8::is_ascii_alphanumeric))
}

/// DNS-1123 subdomain: dot-separated DNS-1123 labels, at most 253 characters.
fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(super::is_namespace_name)
}
