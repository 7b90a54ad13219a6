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
//!   pool.internal:            # a named pool (key `pool.internal`)
//!     namespaces: [team-a]    # named pools only: namespaces that may draw from it
//!     namespaceSelector:      # named pools only: and those carrying all these labels
//!       tier: internal
//!     autoAssign: false       # never a default: only for Services that name it or its IPs
//!     draining: true          # no address handed out anew; those in use stay
//! ```
//! Unknown fields are errors (a misspelt option must not be silently ignored), and so are
//! options for a key that has no pool. The pools are kept in the order written: it is the
//! order in which a namespace's default named pool is looked for.

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
    /// Named pools only: the namespaces that may draw from it (besides those
    /// `namespace_selector` selects).
    pub namespaces: Vec<String>,
    /// Named pools only: labels a namespace must all carry (like `matchLabels`) to draw
    /// from it; empty: none is selected by labels.
    pub namespace_selector: BTreeMap<String, String>,
    /// Whether the pool hands out addresses to Services that neither name it nor request
    /// one of its addresses, i.e. whether it can be a namespace's default. Default true.
    pub auto_assign: bool,
    /// The whole pool is draining: the addresses Services hold stay theirs, none is handed
    /// out anew. Default false.
    pub draining: bool,
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
    /// The address is withheld and the Service gets another one of the pool, as for a first
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
            namespaces: Vec::new(),
            namespace_selector: BTreeMap::new(),
            auto_assign: true,
            draining: false,
        }
    }
}

impl PoolOptions {
    /// Whether a node with `labels` matches the node selector.
    pub fn selects(&self, labels: &BTreeMap<String, String>) -> bool {
        matches_labels(&self.node_selector, labels)
    }

    /// Whether a namespace with `labels` matches the namespace selector (an empty one
    /// selects no namespace: the pool then grants by its list only).
    pub fn selects_namespace(&self, labels: &BTreeMap<String, String>) -> bool {
        !self.namespace_selector.is_empty() && matches_labels(&self.namespace_selector, labels)
    }
}

/// Whether `labels` carry every label of `selector` (`matchLabels`).
fn matches_labels(selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    selector
        .iter()
        .all(|(k, v)| labels.get(k).is_some_and(|have| have == v))
}

// `expecting` replaces the Rust type names in serde's "invalid type" messages.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, expecting = "a mapping with key `pools`")]
struct OptionsDoc {
    #[serde(default)]
    pools: Option<InOrder>,
}

/// The options of a classic key (a namespace's own, `_fallback`).
#[derive(Debug, Default, Deserialize)]
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

/// The options of a named pool: those of a classic key and who may draw from it, whether
/// it is a default, whether it drains. (A struct of its own, not a flattened one: serde's
/// `flatten` does not go with `deny_unknown_fields`.)
#[derive(Debug, Default, Deserialize)]
#[serde(
    deny_unknown_fields,
    rename_all = "camelCase",
    expecting = "a mapping of `interface`, `nodeSelector`, `allowSharing`, `announce`, `maxNodes`, `onConflict`, `virtualMAC`, `namespaces`, `namespaceSelector`, `autoAssign`, `draining`"
)]
struct RawNamed {
    interface: Option<String>,
    node_selector: Option<BTreeMap<String, String>>,
    allow_sharing: Option<bool>,
    announce: Option<Announce>,
    max_nodes: Option<u32>,
    on_conflict: Option<OnConflict>,
    #[serde(rename = "virtualMAC")]
    virtual_mac: Option<bool>,
    namespaces: Option<Vec<String>>,
    namespace_selector: Option<BTreeMap<String, String>>,
    auto_assign: Option<bool>,
    draining: Option<bool>,
}

impl From<RawOptions> for RawNamed {
    fn from(raw: RawOptions) -> Self {
        let RawOptions {
            interface,
            node_selector,
            allow_sharing,
            announce,
            max_nodes,
            on_conflict,
            virtual_mac,
        } = raw;
        RawNamed {
            interface,
            node_selector,
            allow_sharing,
            announce,
            max_nodes,
            on_conflict,
            virtual_mac,
            ..RawNamed::default()
        }
    }
}

/// The options under `pools:`, in the order written (a `BTreeMap` would sort them, and the
/// order of the named pools is the order a default is looked for). A key starting with
/// [`super::NAMED_PREFIX`] takes a named pool's options, any other a classic key's, so a
/// classic key's errors read as they always did. A key written twice is an error, as it is
/// for serde's maps.
#[derive(Debug)]
struct InOrder(Vec<(String, RawNamed)>);

impl<'de> Deserialize<'de> for InOrder {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = InOrder;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a mapping of pool keys to their options")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<Self::Value, A::Error> {
                let mut pairs: Vec<(String, RawNamed)> = Vec::new();
                while let Some(key) = map.next_key::<String>()? {
                    if pairs.iter().any(|(k, _)| *k == key) {
                        return Err(serde::de::Error::custom(format!(
                            "`{key}` is listed twice: give each pool's options once"
                        )));
                    }
                    let raw = if key.starts_with(super::NAMED_PREFIX) {
                        map.next_value::<Option<RawNamed>>()?.unwrap_or_default()
                    } else {
                        map.next_value::<Option<RawOptions>>()?
                            .map(RawNamed::from)
                            .unwrap_or_default()
                    };
                    pairs.push((key, raw));
                }
                Ok(InOrder(pairs))
            }
        }
        deserializer.deserialize_map(Visit)
    }
}

/// Options only named pools take: a classic key that gives one is told so.
const NAMED_ONLY: [&str; 4] = ["namespaces", "namespaceSelector", "autoAssign", "draining"];

/// The hint after a YAML error: the options there are, and for a misplaced named-pool
/// option where it belongs.
fn yaml_hint(message: &str) -> String {
    let mut hint = "expected `pools:` mapping pool keys to `interface`, `nodeSelector`, \
                    `allowSharing`, `announce` (`l2` or `bgp`), `maxNodes`, `onConflict` \
                    (`defend` or `renumber`) and `virtualMAC`"
        .to_owned();
    if message.contains(&format!("pools.{}", super::NAMED_PREFIX)) {
        hint.push_str(
            ", and for a named pool `namespaces`, `namespaceSelector`, `autoAssign` and `draining`",
        );
    } else if let Some(field) = NAMED_ONLY
        .iter()
        .find(|f| message.contains(&format!("unknown field `{f}`")))
    {
        hint.push_str(&format!(
            "; `{field}` applies to named pools (`{}NAME`) only: a namespace's own key serves \
             that namespace, `{}` every namespace without a key (to drain an entry, write \
             `draining` after it)",
            super::NAMED_PREFIX,
            super::FALLBACK_KEY
        ));
    }
    hint
}

/// The options in `text` (the value of [`OPTIONS_KEY`]) by pool key, in the order written,
/// or every problem found. `data` is the whole ConfigMap, to check that each options key
/// has a pool.
pub(super) fn parse(
    text: &str,
    data: &BTreeMap<String, String>,
) -> Result<Vec<(PoolKey, PoolOptions)>, Vec<PoolConfigError>> {
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
            message: format!("not valid options YAML: {e}; {}", yaml_hint(&e.to_string())),
        }]
    })?;
    let mut errors = Vec::new();
    let mut options = Vec::new();
    let pools = doc.and_then(|d| d.pools).map_or_else(Vec::new, |p| p.0);
    for (key, raw) in pools {
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
        let (namespaces, namespace_selector) = check_tenants(&key, &raw, &mut error);
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
        options.push((
            pool_key,
            PoolOptions {
                interface: raw.interface,
                node_selector,
                allow_sharing: raw.allow_sharing.unwrap_or(true),
                announce,
                max_nodes: raw.max_nodes.map(|n| n as usize),
                on_conflict: raw.on_conflict.unwrap_or_default(),
                virtual_mac: raw.virtual_mac.unwrap_or(false),
                namespaces,
                namespace_selector,
                auto_assign: raw.auto_assign.unwrap_or(true),
                draining: raw.draining.unwrap_or(false),
            },
        ));
    }
    if errors.is_empty() {
        Ok(options)
    } else {
        Err(errors)
    }
}

/// Checks who may draw from named pool `key`: each listed namespace is a namespace name,
/// listed once, and a selector is not empty (it would select every namespace). Returns
/// them, as far as they are valid.
fn check_tenants(
    key: &str,
    raw: &RawNamed,
    error: &mut impl FnMut(String),
) -> (Vec<String>, BTreeMap<String, String>) {
    let mut namespaces: Vec<String> = Vec::new();
    for ns in raw.namespaces.iter().flatten() {
        if !super::is_namespace_name(ns) {
            error(format!(
                "pool `{key}`: namespaces: `{ns}` is not a namespace name (at most 63 lowercase \
                 letters, digits and '-', starting and ending with a letter or digit)"
            ));
        } else if namespaces.contains(ns) {
            error(format!(
                "pool `{key}`: namespaces: `{ns}` is listed twice; list each namespace once"
            ));
        } else {
            namespaces.push(ns.clone());
        }
    }
    let selector = raw.namespace_selector.clone().unwrap_or_default();
    if raw.namespace_selector.is_some() && selector.is_empty() {
        error(format!(
            "pool `{key}`: an empty `namespaceSelector` would let every namespace draw from \
             the pool; give labels the namespaces must carry, or list them in `namespaces`"
        ));
    }
    for (label, value) in &selector {
        if let Err(why) = check_label(label, value) {
            error(format!(
                "pool `{key}`: namespaceSelector `{label}: {value}`: {why}"
            ));
        }
    }
    (namespaces, selector)
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
