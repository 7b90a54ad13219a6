//! Table tests for the pool ConfigMap parser: entry kinds, error kinds, the fallback key,
//! `config.yaml` options, and huge pools sized exactly.

use std::collections::BTreeMap;
use std::net::IpAddr;

use aliaslb_core::pool::{
    FALLBACK_KEY, OnConflict, PoolConfig, PoolConfigError, PoolKey, PoolOptions, parse_entry,
};
use aliaslb_core::range::{Family, IpRange};
use proptest::prelude::*;

/// A ConfigMap `data` map from `(key, value)` pairs.
fn data(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn range(first: &str, last: &str) -> IpRange {
    IpRange::new(ip(first), ip(last)).unwrap()
}

fn ns(name: &str) -> PoolKey {
    PoolKey::Namespace(name.to_owned())
}

/// The errors of an invalid config, as displayed.
fn errors(pairs: &[(&str, &str)]) -> Vec<String> {
    match PoolConfig::parse(&data(pairs)) {
        Ok(config) => panic!("expected errors, got {config:?}"),
        Err(errors) => errors.iter().map(PoolConfigError::to_string).collect(),
    }
}

fn valid(pairs: &[(&str, &str)]) -> PoolConfig {
    PoolConfig::parse(&data(pairs)).unwrap_or_else(|e| panic!("expected valid, got {e:#?}"))
}

#[test]
fn classic_example_parses() {
    let config = valid(&[
        ("default", "192.168.55.10\n192.168.55.11\n192.168.55.12"),
        (
            "staging",
            "10.0.7.0/29          # CIDR\n10.0.8.20-10.0.8.40  # inclusive range\n2001:db8:5::/64      # IPv6 is first-class\n",
        ),
    ]);
    let (key, default) = config.pool_for_namespace("default").unwrap();
    assert_eq!(key, &ns("default"));
    assert_eq!(
        default.ranges,
        vec![range("192.168.55.10", "192.168.55.12")]
    );
    assert_eq!(default.entries.len(), 3);
    assert_eq!(default.entries[2].line, 3);
    assert_eq!(default.entries[2].text, "192.168.55.12");
    assert_eq!(default.size(Family::V4), 3);
    assert_eq!(default.options, PoolOptions::default());
    assert!(default.options.allow_sharing);

    let staging = config.pool(&ns("staging")).unwrap();
    assert_eq!(staging.entries[0].text, "10.0.7.0/29");
    assert_eq!(staging.size(Family::V4), 6 + 21);
    assert_eq!(staging.size(Family::V6), (1u128 << 64) - 1);
    assert!(config.pool_for_namespace("other").is_none());
    let keys: Vec<_> = config.pools().map(|(k, _)| k.to_string()).collect();
    assert_eq!(keys, ["default", "staging"]);
}

#[test]
fn entry_kinds() {
    for (text, want, len) in [
        ("192.168.55.10", range("192.168.55.10", "192.168.55.10"), 1),
        ("2001:db8::10", range("2001:db8::10", "2001:db8::10"), 1),
        ("10.0.7.0/29", range("10.0.7.1", "10.0.7.6"), 6),
        ("10.0.7.0/30", range("10.0.7.1", "10.0.7.2"), 2),
        ("10.0.7.0/31", range("10.0.7.0", "10.0.7.1"), 2),
        ("10.0.7.5/32", range("10.0.7.5", "10.0.7.5"), 1),
        ("10.0.8.20-10.0.8.40", range("10.0.8.20", "10.0.8.40"), 21),
        ("10.0.8.20 - 10.0.8.40", range("10.0.8.20", "10.0.8.40"), 21),
        ("10.0.8.20-10.0.8.20", range("10.0.8.20", "10.0.8.20"), 1),
        (
            "2001:db8::1-2001:db8::ff",
            range("2001:db8::1", "2001:db8::ff"),
            255,
        ),
        (
            "2001:db8:5::/64",
            range("2001:db8:5::1", "2001:db8:5::ffff:ffff:ffff:ffff"),
            (1 << 64) - 1,
        ),
        ("2001:db8::/126", range("2001:db8::1", "2001:db8::3"), 3),
        ("2001:db8::/127", range("2001:db8::", "2001:db8::1"), 2),
        ("2001:db8::7/128", range("2001:db8::7", "2001:db8::7"), 1),
        (
            "10.0.0.0/8",
            range("10.0.0.1", "10.255.255.254"),
            (1 << 24) - 2,
        ),
        (
            "128.0.0.0/3",
            range("128.0.0.1", "159.255.255.254"),
            (1 << 29) - 2,
        ),
        (
            "2000::/3",
            range("2000::1", "3fff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"),
            (1 << 125) - 1,
        ),
    ] {
        let got = parse_entry(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(got, want, "{text}");
        assert_eq!(got.len(), len, "{text}");
    }
}

#[test]
fn comments_blank_lines_and_spaces_are_ignored() {
    let config = valid(&[(
        "default",
        "# our addresses\n\n   10.0.0.1   \n\t10.0.0.2# no space\n  # indented comment\n\n",
    )]);
    let pool = config.pool(&ns("default")).unwrap();
    let lines: Vec<_> = pool
        .entries
        .iter()
        .map(|e| (e.line, e.text.as_str()))
        .collect();
    assert_eq!(lines, [(3, "10.0.0.1"), (4, "10.0.0.2")]);
}

#[test]
fn each_error_kind_has_an_exact_message() {
    for (value, want) in [
        (
            "10.0.0.300",
            "key default, line 1: not an IP address, CIDR or range: expected an address (`192.168.55.10`, `2001:db8::10`), a CIDR (`10.0.7.0/29`) or an inclusive range (`10.0.8.20-10.0.8.40`) (`10.0.0.300`)",
        ),
        (
            "10.0.0.1 10.0.0.2",
            "key default, line 1: one entry per line: put each address, CIDR or range on its own line (`10.0.0.1 10.0.0.2`)",
        ),
        (
            "10.0.0.1,10.0.0.2",
            "key default, line 1: one entry per line: put each address, CIDR or range on its own line (`10.0.0.1,10.0.0.2`)",
        ),
        (
            "10.0.8.40-10.0.8.20",
            "key default, line 1: range 10.0.8.40-10.0.8.20 is reversed: the first address must not be above the last (did you mean 10.0.8.20-10.0.8.40?) (`10.0.8.40-10.0.8.20`)",
        ),
        (
            "10.0.8.20-2001:db8::1",
            "key default, line 1: 10.0.8.20 and 2001:db8::1 are not of the same IP family: both ends of a range must be IPv4, or both IPv6 (`10.0.8.20-2001:db8::1`)",
        ),
        (
            "10.0.8.20-40",
            "key default, line 1: `40` is not an IP address: write both ends of a range in full, e.g. `10.0.8.20-10.0.8.40` (`10.0.8.20-40`)",
        ),
        (
            "10.0.8.20-",
            "key default, line 1: the range has no last address: write both ends in full, e.g. `10.0.8.20-10.0.8.40` (`10.0.8.20-`)",
        ),
        (
            "10.0.8.0/30-10.0.8.9",
            "key default, line 1: `10.0.8.0/30`: the ends of a range are plain addresses, not CIDRs; write `first-last` or a CIDR on its own (`10.0.8.0/30-10.0.8.9`)",
        ),
        (
            "10.0.7.3/29",
            "key default, line 1: the CIDR has host bits set: write the network form `10.0.7.0/29`, or `10.0.7.3` alone for a single address (`10.0.7.3/29`)",
        ),
        (
            "2001:db8:5::1/64",
            "key default, line 1: the CIDR has host bits set: write the network form `2001:db8:5::/64`, or `2001:db8:5::1` alone for a single address (`2001:db8:5::1/64`)",
        ),
        (
            "10.0.7.0/33",
            "key default, line 1: prefix length `/33` is not valid for IPv4: use /0 to /32 (`10.0.7.0/33`)",
        ),
        (
            "2001:db8::/x",
            "key default, line 1: prefix length `/x` is not valid for IPv6: use /0 to /128 (`2001:db8::/x`)",
        ),
        (
            "10.0.7/24",
            "key default, line 1: `10.0.7` is not an IP address: expected an address (`192.168.55.10`, `2001:db8::10`), a CIDR (`10.0.7.0/29`) or an inclusive range (`10.0.8.20-10.0.8.40`) (`10.0.7/24`)",
        ),
        (
            "10.0.0.1\n10.0.0.0/30",
            "key default, line 2: overlaps line 1 (`10.0.0.1`) of the same key: list each address once (`10.0.0.0/30`)",
        ),
        (
            "10.0.0.1\n10.0.0.1",
            "key default, line 2: overlaps line 1 (`10.0.0.1`) of the same key: list each address once (`10.0.0.1`)",
        ),
        (
            "",
            "key default: the pool is empty: list at least one address, CIDR or range, or remove the key (a namespace with a key of its own never draws from `_fallback`, so an empty key leaves its Services pending)",
        ),
        (
            "# nothing yet\n\n",
            "key default: the pool is empty: list at least one address, CIDR or range, or remove the key (a namespace with a key of its own never draws from `_fallback`, so an empty key leaves its Services pending)",
        ),
    ] {
        assert_eq!(errors(&[("default", value)]), [want], "value {value:?}");
    }
}

#[test]
fn adjacent_ranges_are_fine_and_merged() {
    let config = valid(&[(
        "default",
        "10.0.0.4-10.0.0.7\n10.0.0.0/30\n10.0.0.3\n10.0.0.8/32\n2001:db8::/127\n2001:db8::2",
    )]);
    let pool = config.pool(&ns("default")).unwrap();
    // /30 skips .0 and .3, which `10.0.0.3` then fills.
    assert_eq!(
        pool.ranges,
        [
            range("10.0.0.1", "10.0.0.8"),
            range("2001:db8::", "2001:db8::2")
        ]
    );
    assert_eq!(pool.size(Family::V4), 8);
    assert_eq!(pool.size(Family::V6), 3);
    for (addr, inside) in [
        ("10.0.0.0", false),
        ("10.0.0.1", true),
        ("10.0.0.8", true),
        ("10.0.0.9", false),
        ("2001:db8::", true),
        ("2001:db8::2", true),
        ("2001:db8::3", false),
        ("::a00:1", false),
    ] {
        assert_eq!(pool.contains(ip(addr)), inside, "{addr}");
    }
}

#[test]
fn overlap_between_keys_names_both_keys_and_lines() {
    assert_eq!(
        errors(&[
            ("default", "192.168.0.0/24\n10.0.0.1"),
            ("staging", "172.16.0.1\n192.168.0.77"),
        ]),
        [
            "key staging, line 2: overlaps key default, line 1 (`192.168.0.0/24`): an address can belong to one pool only; remove it from one of the two keys (`192.168.0.77`)"
        ]
    );
    // Identical entries: the keys sorting after the first (`_` sorts before letters) are
    // reported against it.
    assert_eq!(
        errors(&[
            ("b", "10.0.0.1"),
            ("a", "10.0.0.1"),
            (FALLBACK_KEY, "10.0.0.1")
        ]),
        [
            "key a, line 1: overlaps key _fallback, line 1 (`10.0.0.1`): an address can belong to one pool only; remove it from one of the two keys (`10.0.0.1`)",
            "key b, line 1: overlaps key _fallback, line 1 (`10.0.0.1`): an address can belong to one pool only; remove it from one of the two keys (`10.0.0.1`)",
        ]
    );
}

#[test]
fn overlap_is_per_family_and_found_behind_a_long_range() {
    // `::a00:1` is 10.0.0.1 as an integer but another family: no overlap.
    valid(&[("a", "10.0.0.0/24"), ("b", "::a00:1")]);
    // 10.0.0.50 starts after 10.0.0.5-10.0.0.9 ended, but inside the /24 that began first.
    assert_eq!(
        errors(&[("a", "10.0.0.0/24"), ("b", "10.0.0.5-10.0.0.9\n10.0.0.50")]),
        [
            "key b, line 1: overlaps key a, line 1 (`10.0.0.0/24`): an address can belong to one pool only; remove it from one of the two keys (`10.0.0.5-10.0.0.9`)",
            "key b, line 2: overlaps key a, line 1 (`10.0.0.0/24`): an address can belong to one pool only; remove it from one of the two keys (`10.0.0.50`)",
        ]
    );
}

#[test]
fn key_names_are_checked() {
    let long = "a".repeat(64);
    for (key, want) in [
        (
            "Default",
            "key Default: not a valid pool key: keys are namespace names (DNS-1123 labels: at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit), `_fallback` or `config.yaml`; did you mean `default`?",
        ),
        (
            "my_ns",
            "key my_ns: not a valid pool key: keys are namespace names (DNS-1123 labels: at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit), `_fallback` or `config.yaml`",
        ),
        (
            "-ns",
            "key -ns: not a valid pool key: keys are namespace names (DNS-1123 labels: at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit), `_fallback` or `config.yaml`",
        ),
        (
            "_default",
            "key _default: unknown reserved key: the only reserved keys are `_fallback` and `config.yaml`; other keys are namespace names",
        ),
        (
            long.as_str(),
            "key aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa: not a valid pool key: keys are namespace names (DNS-1123 labels: at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit), `_fallback` or `config.yaml` (this one is 64 characters long)",
        ),
    ] {
        assert_eq!(errors(&[(key, "10.0.0.1")]), [want], "key {key}");
    }
    valid(&[
        (&"a".repeat(63), "10.0.0.1"),
        ("kube-system", "10.0.0.2"),
        ("0ns", "10.0.0.3"),
    ]);
}

#[test]
fn all_errors_reported_sorted_by_key_then_line() {
    assert_eq!(
        errors(&[
            ("zeta", "10.1.0.1\nbogus\n10.1.0.1"),
            ("alpha", "\n\n10.0.7.3/29\n10.0.9.9-10.0.9.1"),
            ("Bad", ""),
        ]),
        [
            "key Bad: not a valid pool key: keys are namespace names (DNS-1123 labels: at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit), `_fallback` or `config.yaml`; did you mean `bad`?",
            "key Bad: the pool is empty: list at least one address, CIDR or range, or remove the key (a namespace with a key of its own never draws from `_fallback`, so an empty key leaves its Services pending)",
            "key alpha, line 3: the CIDR has host bits set: write the network form `10.0.7.0/29`, or `10.0.7.3` alone for a single address (`10.0.7.3/29`)",
            "key alpha, line 4: range 10.0.9.9-10.0.9.1 is reversed: the first address must not be above the last (did you mean 10.0.9.1-10.0.9.9?) (`10.0.9.9-10.0.9.1`)",
            "key zeta, line 2: not an IP address, CIDR or range: expected an address (`192.168.55.10`, `2001:db8::10`), a CIDR (`10.0.7.0/29`) or an inclusive range (`10.0.8.20-10.0.8.40`) (`bogus`)",
            "key zeta, line 3: overlaps line 1 (`10.1.0.1`) of the same key: list each address once (`10.1.0.1`)",
        ]
    );
}

#[test]
fn fallback_serves_only_namespaces_without_a_key() {
    let config = valid(&[("tenant-a", "10.0.0.1"), (FALLBACK_KEY, "10.9.0.0/29")]);
    let (key, pool) = config.pool_for_namespace("tenant-a").unwrap();
    assert_eq!(key, &ns("tenant-a"));
    assert!(
        !pool.contains(ip("10.9.0.1")),
        "tenant-a is fenced from the fallback"
    );
    let (key, pool) = config.pool_for_namespace("anything-else").unwrap();
    assert_eq!(key, &PoolKey::Fallback);
    assert_eq!(key.to_string(), "_fallback");
    assert_eq!(pool.size(Family::V4), 6);
    assert_eq!(config.pool(&PoolKey::Fallback), Some(pool));
    let order: Vec<_> = config.pools().map(|(k, _)| k.clone()).collect();
    assert_eq!(order, [ns("tenant-a"), PoolKey::Fallback]);
}

#[test]
fn huge_pools_are_sized_exactly_without_enumeration() {
    let config = valid(&[("everything", "2000::/3\n128.0.0.0/3")]);
    let all = config.pool(&ns("everything")).unwrap();
    assert_eq!(all.size(Family::V6), (1 << 125) - 1);
    assert_eq!(all.size(Family::V4), (1 << 29) - 2);
    assert!(all.contains(ip("2001:db8::1")));
    assert!(!all.contains(ip("2000::")));
    let config = valid(&[("sixty-four", "2001:db8:1::/64\n")]);
    let v6 = config.pool(&ns("sixty-four")).unwrap();
    assert_eq!(v6.size(Family::V6), 18_446_744_073_709_551_615);
    assert_eq!(v6.size(Family::V4), 0);
    let eight = valid(&[("a", "10.0.0.0/8")]);
    assert_eq!(eight.pool(&ns("a")).unwrap().size(Family::V4), 16_777_214);
}

#[test]
fn options_apply_to_their_pool() {
    let config = valid(&[
        ("staging", "10.0.7.0/29"),
        ("prod", "10.0.8.0/29"),
        (FALLBACK_KEY, "10.0.9.0/29"),
        (
            "config.yaml",
            "pools:\n  staging:\n    interface: eth1\n    nodeSelector: {topology.kubernetes.io/zone: a, role: lb}\n    allowSharing: false\n  _fallback:\n    interface: bond0.100\n",
        ),
    ]);
    let staging = &config.pool(&ns("staging")).unwrap().options;
    assert_eq!(staging.interface.as_deref(), Some("eth1"));
    assert!(!staging.allow_sharing);
    let labels = |pairs: &[(&str, &str)]| {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect::<BTreeMap<_, _>>()
    };
    assert_eq!(
        staging.node_selector,
        labels(&[("role", "lb"), ("topology.kubernetes.io/zone", "a")])
    );
    assert!(staging.selects(&labels(&[
        ("role", "lb"),
        ("topology.kubernetes.io/zone", "a"),
        ("x", "y")
    ])));
    assert!(!staging.selects(&labels(&[
        ("role", "lb"),
        ("topology.kubernetes.io/zone", "b")
    ])));
    assert!(!staging.selects(&labels(&[("role", "lb")])));
    let fallback = &config.pool(&PoolKey::Fallback).unwrap().options;
    assert_eq!(fallback.interface.as_deref(), Some("bond0.100"));
    assert!(fallback.allow_sharing, "allowSharing defaults to true");
    assert_eq!(
        config.pool(&ns("prod")).unwrap().options,
        PoolOptions::default()
    );
    let bgp = valid(&[
        ("a", "10.200.0.0/24"),
        (
            "config.yaml",
            "pools:\n  a:\n    announce: bgp\n    maxNodes: 3\n",
        ),
    ]);
    let options = &bgp.pool(&ns("a")).unwrap().options;
    assert_eq!(
        (options.announce, options.max_nodes),
        (aliaslb_core::pool::Announce::Bgp, Some(3))
    );
    assert_eq!(options.on_conflict, OnConflict::Defend, "the default");
    let renumber = valid(&[
        ("a", "10.0.0.1"),
        ("config.yaml", "pools:\n  a:\n    onConflict: renumber\n"),
    ]);
    let options = &renumber.pool(&ns("a")).unwrap().options;
    assert_eq!(options.on_conflict, OnConflict::Renumber);
    assert_eq!(options.on_conflict.as_str(), "renumber");
    let defend = valid(&[
        ("a", "10.0.0.1"),
        ("config.yaml", "pools:\n  a:\n    onConflict: defend\n"),
    ]);
    assert_eq!(
        defend.pool(&ns("a")).unwrap().options,
        PoolOptions::default()
    );
    assert!(!options.virtual_mac, "the default");
    let vmac = valid(&[
        ("a", "10.0.0.1"),
        ("config.yaml", "pools:\n  a:\n    virtualMAC: true\n"),
    ]);
    assert!(vmac.pool(&ns("a")).unwrap().options.virtual_mac);
    // Empty or comment-only options are no options.
    valid(&[("a", "10.0.0.1"), ("config.yaml", "# later\n")]);
    valid(&[("a", "10.0.0.1"), ("config.yaml", "pools:\n  a:\n")]);
}

#[test]
fn options_errors() {
    for (options, want) in [
        (
            "pools:\n  staging:\n    interfce: eth1\n",
            "key config.yaml, line 3: not valid options YAML: pools.staging: unknown field `interfce`, expected one of `interface`, `nodeSelector`, `allowSharing`, `announce`, `maxNodes`, `onConflict`, `virtualMAC` at line 3 column 5; expected `pools:` mapping pool keys to `interface`, `nodeSelector`, `allowSharing`, `announce` (`l2` or `bgp`), `maxNodes`, `onConflict` (`defend` or `renumber`) and `virtualMAC` (`interfce: eth1`)",
        ),
        (
            "pool:\n  staging: {}\n",
            "key config.yaml, line 1: not valid options YAML: unknown field `pool`, expected `pools`; expected `pools:` mapping pool keys to `interface`, `nodeSelector`, `allowSharing`, `announce` (`l2` or `bgp`), `maxNodes`, `onConflict` (`defend` or `renumber`) and `virtualMAC` (`pool:`)",
        ),
        (
            "pools:\n  staging:\n    allowSharing: maybe\n",
            "key config.yaml, line 3: not valid options YAML: pools.staging.allowSharing: invalid type: string \"maybe\", expected a boolean at line 3 column 19; expected `pools:` mapping pool keys to `interface`, `nodeSelector`, `allowSharing`, `announce` (`l2` or `bgp`), `maxNodes`, `onConflict` (`defend` or `renumber`) and `virtualMAC` (`allowSharing: maybe`)",
        ),
        (
            "pools:\n  staging: {interface: eth1\n",
            "key config.yaml, line 2: not valid options YAML: did not find expected ',' or '}' at line 3 column 1, while parsing a flow mapping at line 2 column 12; expected `pools:` mapping pool keys to `interface`, `nodeSelector`, `allowSharing`, `announce` (`l2` or `bgp`), `maxNodes`, `onConflict` (`defend` or `renumber`) and `virtualMAC` (`staging: {interface: eth1`)",
        ),
        (
            "pools:\n  staging: [eth1]\n",
            "key config.yaml, line 2: not valid options YAML: pools.staging: invalid type: sequence, expected a mapping of `interface`, `nodeSelector`, `allowSharing`, `announce`, `maxNodes`, `onConflict`, `virtualMAC` at line 2 column 12; expected `pools:` mapping pool keys to `interface`, `nodeSelector`, `allowSharing`, `announce` (`l2` or `bgp`), `maxNodes`, `onConflict` (`defend` or `renumber`) and `virtualMAC` (`staging: [eth1]`)",
        ),
        (
            "pools:\n  staging: {}\n  prod:\n    interface: eth2\n",
            "key config.yaml, line 3: options for `prod`, which has no pool: add a `prod` key with its addresses, or remove these options (`prod:`)",
        ),
        (
            "pools:\n  Staging: {}\n",
            "key config.yaml, line 2: options for `Staging`: not a valid pool key: keys are namespace names (DNS-1123 labels: at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit), `_fallback` or `config.yaml`; did you mean `staging`? (`Staging: {}`)",
        ),
        (
            "pools:\n  staging:\n    interface: averyveryverylongname0\n",
            "key config.yaml, line 2: pool `staging`: interface `averyveryverylongname0` is not a valid interface name: it must be 1 to 15 characters long (`staging:`)",
        ),
        (
            "pools:\n  staging:\n    interface: eth0/1\n",
            "key config.yaml, line 2: pool `staging`: interface `eth0/1` is not a valid interface name: it may not be `.` or `..` nor contain `/`, `:` or spaces (`staging:`)",
        ),
        (
            "pools:\n  staging:\n    nodeSelector: {\"zone\": \"a b\"}\n",
            "key config.yaml, line 2: pool `staging`: nodeSelector `zone: a b`: label value `a b` must be at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit (`staging:`)",
        ),
        (
            "pools:\n  staging:\n    announce: ospf\n",
            "key config.yaml, line 3: not valid options YAML: pools.staging.announce: unknown variant `ospf`, expected `l2` or `bgp` at line 3 column 15; expected `pools:` mapping pool keys to `interface`, `nodeSelector`, `allowSharing`, `announce` (`l2` or `bgp`), `maxNodes`, `onConflict` (`defend` or `renumber`) and `virtualMAC` (`announce: ospf`)",
        ),
        (
            "pools:\n  staging:\n    maxNodes: 2\n",
            "key config.yaml, line 2: pool `staging`: `maxNodes` applies to `announce: bgp` only (in L2 mode one node carries each address); remove it or add `announce: bgp` (`staging:`)",
        ),
        (
            "pools:\n  staging:\n    announce: bgp\n    maxNodes: 0\n",
            "key config.yaml, line 2: pool `staging`: `maxNodes: 0` would announce the addresses nowhere; give at least 1, or leave it out to announce from every eligible node (`staging:`)",
        ),
        (
            "pools:\n  staging:\n    announce: bgp\n    interface: eth1\n",
            "key config.yaml, line 2: pool `staging`: `interface` applies to `announce: l2` only (in BGP mode the agent puts the addresses on its own device, `aliaslb0` or `lo`); remove it (`staging:`)",
        ),
        (
            "pools:\n  staging:\n    onConflict: move\n",
            "key config.yaml, line 3: not valid options YAML: pools.staging.onConflict: unknown variant `move`, expected `defend` or `renumber` at line 3 column 17; expected `pools:` mapping pool keys to `interface`, `nodeSelector`, `allowSharing`, `announce` (`l2` or `bgp`), `maxNodes`, `onConflict` (`defend` or `renumber`) and `virtualMAC` (`onConflict: move`)",
        ),
        (
            "pools:\n  staging:\n    announce: bgp\n    onConflict: renumber\n",
            "key config.yaml, line 2: pool `staging`: `onConflict` applies to `announce: l2` only (in BGP mode no address is claimed with ARP or NDP); remove it (`staging:`)",
        ),
        (
            "pools:\n  staging:\n    announce: bgp\n    virtualMAC: true\n",
            "key config.yaml, line 2: pool `staging`: `virtualMAC` applies to `announce: l2` only (in BGP mode the router reaches the addresses through the nodes' own MACs); remove it (`staging:`)",
        ),
        (
            "pools:\n  staging:\n    virtualMac: true\n",
            "key config.yaml, line 3: not valid options YAML: pools.staging: unknown field `virtualMac`, expected one of `interface`, `nodeSelector`, `allowSharing`, `announce`, `maxNodes`, `onConflict`, `virtualMAC` at line 3 column 5; expected `pools:` mapping pool keys to `interface`, `nodeSelector`, `allowSharing`, `announce` (`l2` or `bgp`), `maxNodes`, `onConflict` (`defend` or `renumber`) and `virtualMAC` (`virtualMac: true`)",
        ),
        (
            "pools:\n  staging:\n    nodeSelector: {Bad_Prefix/zone: a}\n",
            "key config.yaml, line 2: pool `staging`: nodeSelector `Bad_Prefix/zone: a`: label prefix `Bad_Prefix` must be a DNS subdomain (lowercase letters, digits, '-' and '.', at most 253 characters) (`staging:`)",
        ),
    ] {
        assert_eq!(
            errors(&[("staging", "10.0.7.0/29"), ("config.yaml", options)]),
            [want],
            "options {options:?}"
        );
    }
}

#[test]
fn errors_in_addresses_and_options_come_together() {
    assert_eq!(
        errors(&[
            ("staging", "10.0.7.0/29\n10.0.7.9/29"),
            ("config.yaml", "pools:\n  qa: {}\n"),
        ]),
        [
            "key config.yaml, line 2: options for `qa`, which has no pool: add a `qa` key with its addresses, or remove these options (`qa: {}`)",
            "key staging, line 2: the CIDR has host bits set: write the network form `10.0.7.8/29`, or `10.0.7.9` alone for a single address (`10.0.7.9/29`)",
        ]
    );
}

#[test]
fn many_entries_parse_in_n_log_n() {
    // 200k single addresses across 50 keys, one duplicate at the end: a pairwise check
    // would take 2*10^10 comparisons; the sweep takes well under a second.
    let mut pairs: Vec<(String, String)> = (0..50)
        .map(|k| {
            let value: String = (0..4000u32)
                .map(|i| format!("10.{k}.{}.{}\n", i / 250, i % 250 + 1))
                .collect();
            (format!("ns-{k}"), value)
        })
        .collect();
    pairs[49].1.push_str("10.0.0.1\n");
    let map: BTreeMap<String, String> = pairs.into_iter().collect();
    let start = std::time::Instant::now();
    let errors = PoolConfig::parse(&map).unwrap_err();
    let elapsed = start.elapsed();
    eprintln!("parsed 200001 entries in 50 keys in {elapsed:?}");
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0].key, "ns-49");
    assert_eq!(errors[0].line, Some(4001));
    assert!(elapsed.as_secs() < 10, "took {elapsed:?}");
}

proptest! {
    /// The sweep reports exactly the entries that overlap an entry sorting before them
    /// (by range, key, line), as a pairwise check would.
    #[test]
    fn sweep_matches_pairwise(entries in prop::collection::vec((0u8..3, 0u32..64, 0u32..8), 1..12)) {
        let mut values: BTreeMap<String, String> = BTreeMap::new();
        let mut located = Vec::new();
        for (key, start, width) in entries {
            let key = format!("ns{key}");
            let text = format!("10.0.0.{start}-10.0.0.{}", start + width);
            let value = values.entry(key.clone()).or_default();
            value.push_str(&text);
            value.push('\n');
            let line = value.lines().count();
            located.push((range(&format!("10.0.0.{start}"), &format!("10.0.0.{}", start + width)), key, line));
        }
        located.sort();
        let mut want: Vec<(String, usize)> = located
            .iter()
            .enumerate()
            .filter(|(i, (r, _, _))| located[..*i].iter().any(|(p, _, _)| p.overlaps(r)))
            .map(|(_, (_, key, line))| (key.clone(), *line))
            .collect();
        want.sort();
        let got: Vec<(String, usize)> = match PoolConfig::parse(&values) {
            Ok(_) => Vec::new(),
            Err(errors) => errors.into_iter().map(|e| (e.key, e.line.unwrap())).collect(),
        };
        prop_assert_eq!(got, want);
    }
}

#[test]
fn addresses_that_cannot_be_load_balancer_ips_are_refused() {
    for (text, what) in [
        ("127.0.0.1", "loopback (127.0.0.0/8)"),
        ("0.0.0.0/0", "\"this network\" (0.0.0.0/8)"),
        ("10.0.0.0-127.0.0.5", "loopback (127.0.0.0/8)"),
        ("169.254.1.1", "link-local (169.254.0.0/16)"),
        ("239.1.1.1", "multicast (224.0.0.0/4)"),
        ("255.255.255.255", "broadcast (255.255.255.255)"),
        ("::", "the unspecified address (::)"),
        ("::/0", "loopback (::1)"),
        ("::1", "loopback (::1)"),
        ("fe80::1", "link-local (fe80::/10)"),
        ("ff02::1", "multicast (ff00::/8)"),
        ("::ffff:10.0.0.1", "IPv4-mapped IPv6"),
    ] {
        let err = parse_entry(text).expect_err(text);
        assert!(
            err.contains(what) && err.contains("cannot be a load-balancer IP"),
            "{text}: {err}"
        );
    }
    assert!(parse_entry("126.255.255.255").is_ok());
    assert!(parse_entry("128.0.0.0").is_ok());
}
