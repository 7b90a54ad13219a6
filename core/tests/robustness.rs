//! Robustness of the pure crate's input parsers: `PoolConfig::parse`, `parse_entry`,
//! `parse_ip_list` and `AgentReport::from_json` (with its bounds), fed arbitrary text and near-valid input
//! from small grammars. Every property first proves the parser does not panic (proptest
//! turns a panic into a failing, shrunk case), then that every rejection carries a message
//! and every acceptance is internally consistent.
//!
//! Case counts are small by default so `cargo test` stays fast; a long run sets
//! `PROPTEST_CASES`, e.g. `PROPTEST_CASES=100000 cargo test --release -p aliaslb-core --test
//! robustness` (see BENCHMARKS.md).

use std::collections::BTreeMap;
use std::net::IpAddr;

use aliaslb_core::annotations::parse_ip_list;
use aliaslb_core::pool::{
    FALLBACK_KEY, OPTIONS_KEY, PoolConfig, PoolConfigError, PoolKey, PoolOptions, parse_entry,
};
use aliaslb_core::range::{Family, IpRange, to_u128};
use aliaslb_core::report::{
    AgentReport, MAX_INTERFACES, MAX_REASON, MAX_REPORT_BYTES, MAX_SUBNETS_PER_INTERFACE,
    WIDEST_SUBNET_V4, WIDEST_SUBNET_V6, interface_name_error,
};
use proptest::prelude::*;

mod strategies;
use strategies::{arbitrary_text, mutation, report_annotation};

// ---------------------------------------------------------------------------------------
// Generators: arbitrary text and near-valid entries.
// ---------------------------------------------------------------------------------------

/// One IPv4 octet: mostly valid, sometimes out of range, zero-padded, empty or in
/// non-ASCII digits (`std` rejects those; they must still be rejected with a message).
fn octet() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => (0u16..=255).prop_map(|n| n.to_string()),
        1 => (256u32..100_000).prop_map(|n| n.to_string()),
        1 => (0u16..=255).prop_map(|n| format!("0{n}")),
        1 => prop::sample::select(vec!["", "١", "１", "٠٠", "-1", "+1", "0x1"]).prop_map(String::from),
    ]
}

/// An IPv4 address biased towards a few subnets (so entries overlap) and the blocks that
/// cannot be load-balancer IPs; sometimes with three or five octets.
fn ipv4_text() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => (0u8..4, any::<u8>()).prop_map(|(c, d)| format!("10.0.{c}.{d}")),
        2 => (any::<u8>(), any::<u8>()).prop_map(|(c, d)| format!("192.168.{c}.{d}")),
        2 => prop::sample::select(vec![
            "0.0.0.0", "127.0.0.1", "169.254.1.1", "224.0.0.1", "255.255.255.255",
            "126.255.255.255", "128.0.0.0", "0.255.255.255", "1.0.0.0",
        ]).prop_map(String::from),
        2 => any::<u32>().prop_map(|n| std::net::Ipv4Addr::from(n).to_string()),
        2 => prop::collection::vec(octet(), 3..=5).prop_map(|o| o.join(".")),
    ]
}

/// An IPv6 address: documentation prefix, special blocks, IPv4-mapped, zone ids, random
/// hextet soups.
fn ipv6_text() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => (0u16..4, any::<u16>()).prop_map(|(a, b)| format!("2001:db8:{a:x}::{b:x}")),
        2 => prop::sample::select(vec![
            "::", "::1", "fe80::1", "fe80::1%eth0", "ff02::1", "febf:ffff::1", "fec0::1",
            "::ffff:10.0.0.1", "::ffff:127.0.0.1", "::ffff:0:0", "2001:db8::1%1", "::10.0.0.1",
            "2001:db8:::1", "2001:db8::1::2", "[2001:db8::1]", "2001:DB8::A", "1:2:3:4:5:6:7:8:9",
            "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "feff::", "ff00::",
        ]).prop_map(String::from),
        2 => any::<u128>().prop_map(|n| std::net::Ipv6Addr::from(n).to_string()),
        1 => (any::<u128>(), "%[a-z0-9]{0,5}").prop_map(|(n, zone)| format!("{}{zone}", std::net::Ipv6Addr::from(n))),
        2 => prop::collection::vec("[0-9a-fA-F]{0,5}", 1..10).prop_map(|h| h.join(":")),
    ]
}

fn address_text() -> impl Strategy<Value = String> {
    prop_oneof![ipv4_text(), ipv6_text()]
}

/// A prefix length: mostly plausible, sometimes huge, negative, spaced or not a number.
fn prefix_text() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => (0u16..=140).prop_map(|n| n.to_string()),
        1 => prop::sample::select(vec![
            "", "-1", "0x10", " 24", "24 ", "032", "256", "99999999999999999999999", "２４", "+8",
            "1/2",
        ]).prop_map(String::from),
    ]
}

/// Separators of a range, valid or nearly so.
fn range_separator() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "-", " - ", "- ", " -", "--", "\t-\t", "–", "..", "-/", "/-",
    ])
}

/// An entry that is valid or close to it: address, CIDR, range, or one of those with a
/// character inserted, deleted or replaced.
fn near_entry() -> impl Strategy<Value = String> {
    let base = prop_oneof![
        3 => address_text(),
        3 => (address_text(), prefix_text()).prop_map(|(a, p)| format!("{a}/{p}")),
        3 => (address_text(), range_separator(), address_text())
            .prop_map(|(a, s, b)| format!("{a}{s}{b}")),
        1 => (address_text(), prefix_text(), address_text())
            .prop_map(|(a, p, b)| format!("{a}/{p}-{b}")),
        1 => prop::collection::vec(address_text(), 2..4).prop_map(|a| a.join(", ")),
    ];
    (base, mutation()).prop_map(|(text, mutate)| mutate.apply(&text))
}

/// One line of a pool value: an entry with random spaces and an optional comment, a
/// comment alone, a blank line, or arbitrary text.
fn pool_line() -> impl Strategy<Value = String> {
    let comment = prop_oneof![
        Just(String::new()),
        "[ \t]{0,2}#[ -~]{0,12}",
        Just("# 10.0.0.1 - 10.0.0.2 # again".to_owned()),
    ];
    prop_oneof![
        8 => ("[ \t]{0,3}", near_entry(), "[ \t]{0,3}", comment)
            .prop_map(|(lead, entry, trail, comment)| format!("{lead}{entry}{trail}{comment}")),
        1 => Just(String::new()),
        1 => "[ \t]*#[^\n]{0,20}",
        1 => arbitrary_text(),
    ]
}

/// A pool value: near-valid lines joined by `\n` or `\r\n`, or arbitrary text.
fn pool_value() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => (prop::collection::vec(pool_line(), 0..8), any::<bool>(), any::<bool>()).prop_map(
            |(lines, crlf, trailing)| {
                let mut value = lines.join(if crlf { "\r\n" } else { "\n" });
                if trailing {
                    value.push('\n');
                }
                value
            }
        ),
        1 => arbitrary_text(),
    ]
}

/// A ConfigMap key: mostly namespace names from a small set (so keys collide with the
/// options document), the reserved keys, near-valid and arbitrary strings.
fn config_key() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => prop::sample::select(vec!["default", "staging", "prod", "a", "team-1"]).prop_map(String::from),
        2 => Just(FALLBACK_KEY.to_owned()),
        1 => Just(OPTIONS_KEY.to_owned()),
        2 => "[a-z0-9]([-a-z0-9]{0,10}[a-z0-9])?",
        1 => "[A-Za-z0-9_.-]{0,70}",
        1 => prop::sample::select(vec![
            "", "-a", "a-", "Default", "_other", "_FALLBACK", "config.yml", "a.b", "a_b",
            "0123456789012345678901234567890123456789012345678901234567890123",
        ]).prop_map(String::from),
        1 => any::<String>(),
    ]
}

/// A `config.yaml` value: a structurally valid or invalid options document, or YAML-ish
/// noise.
fn options_value() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => options_document(),
        2 => yamlish_text(),
        1 => arbitrary_text(),
        1 => (options_document(), mutation()).prop_map(|(doc, m)| m.apply(&doc)),
    ]
}

/// Lines built from YAML's punctuation, indentation and a few words.
fn yamlish_text() -> impl Strategy<Value = String> {
    let token = prop::sample::select(vec![
        "pools",
        "interface",
        "nodeSelector",
        "allowSharing",
        "default",
        "_fallback",
        ":",
        ": ",
        "- ",
        "{",
        "}",
        "[",
        "]",
        ",",
        "&a ",
        "*a",
        "!!str ",
        "!tag ",
        "|",
        ">",
        "'",
        "\"",
        "#",
        "%YAML 1.2",
        "---",
        "...",
        "? ",
        "~",
        "null",
        "true",
        "no",
        "1e9",
        "\t",
        "  ",
        "    ",
        "<<: *a",
        "@",
        "`",
        "eth0",
        "\\",
        "\u{FEFF}",
    ]);
    prop::collection::vec(prop::collection::vec(token, 0..8), 0..8).prop_map(|lines| {
        lines
            .iter()
            .map(|l| l.concat())
            .collect::<Vec<_>>()
            .join("\n")
    })
}

/// An options document: `pools:` with per-pool options, some well-formed, some with
/// unknown fields, wrong types, invalid interface names or labels, in block or flow style.
fn options_document() -> impl Strategy<Value = String> {
    let pool_key = prop_oneof![
        config_key(),
        Just("\"default\"".to_owned()),
        Just("'staging'".to_owned()),
        Just("? complex".to_owned()),
    ];
    let interface = prop_oneof![
        "[a-z]{1,4}[0-9]{0,2}",
        prop::sample::select(vec![
            "",
            "\"\"",
            ".",
            "..",
            "eth/0",
            "eth:0",
            "\"a b\"",
            "averyveryverylongname0",
            "[1, 2]",
            "{a: b}",
            "~",
            "123",
        ])
        .prop_map(String::from),
    ];
    let label = prop_oneof![
        "[a-z]{1,6}(\\.[a-z]{1,4})?/[a-z]{1,6}",
        "[a-z]{1,6}",
        prop::sample::select(vec![
            "topology.kubernetes.io/zone",
            "/x",
            "a/",
            "A.B/c",
            "-x",
            "x-",
            "a/b/c",
            "\"\"",
            "\"a b\"",
        ])
        .prop_map(String::from),
    ];
    let label_value = prop_oneof![
        "[a-z0-9]{0,6}",
        prop::sample::select(vec!["-a", "a-", "\"\"", "[x]", "~", "true", "1"])
            .prop_map(String::from),
    ];
    let option = prop_oneof![
        interface.prop_map(|i| format!("interface: {i}")),
        prop::collection::vec((label, label_value), 0..3).prop_map(|labels| {
            let mut s = "nodeSelector:".to_owned();
            for (k, v) in labels {
                s.push_str(&format!("\n      {k}: {v}"));
            }
            s
        }),
        prop::sample::select(vec!["true", "false", "yes", "1", "\"true\"", "~", "[]"])
            .prop_map(|b| format!("allowSharing: {b}")),
        prop::sample::select(vec![
            "interfaces: eth0",
            "allow_sharing: false",
            "foo: 1",
            "- x"
        ])
        .prop_map(String::from),
    ];
    let pool = (pool_key, prop::collection::vec(option, 0..4), 0u8..4).prop_map(
        |(key, options, style)| match style {
            0 => format!("  {key}:\n    {}", options.join("\n    ")),
            1 => format!("  {key}: {{{}}}", options.join(", ")),
            2 => format!("  {key}:"),
            _ => format!("  {key}: {}", options.join(" ")),
        },
    );
    let header = prop::sample::select(vec![
        "pools:",
        "pools:",
        "pools:",
        "pool:",
        "pools: {}",
        "pools: []",
        "pools: ~",
        "- pools:",
        "other: 1\npools:",
        "---\npools:",
    ]);
    (header, prop::collection::vec(pool, 0..4), "[ \n]{0,2}")
        .prop_map(|(header, pools, tail)| format!("{header}\n{}{tail}", pools.join("\n")))
}

/// A ConfigMap `data` map mixing the generators above; sometimes with an options document.
fn config_data() -> impl Strategy<Value = BTreeMap<String, String>> {
    (
        prop::collection::vec((config_key(), pool_value()), 0..6),
        prop::option::weighted(0.5, options_value()),
    )
        .prop_map(|(pairs, options)| {
            let mut data: BTreeMap<String, String> = pairs.into_iter().collect();
            if let Some(options) = options {
                data.insert(OPTIONS_KEY.to_owned(), options);
            }
            data
        })
}

// ---------------------------------------------------------------------------------------
// Checks.
// ---------------------------------------------------------------------------------------

/// Every property of a rejected ConfigMap: errors exist, have messages, name a key of
/// `data` and a line of that key's value holding the quoted text, in (key, line) order.
fn check_errors(
    data: &BTreeMap<String, String>,
    errors: &[PoolConfigError],
) -> Result<(), TestCaseError> {
    prop_assert!(!errors.is_empty(), "Err without errors");
    for e in errors {
        prop_assert!(!e.message.trim().is_empty(), "error without message: {e:?}");
        prop_assert!(!e.to_string().is_empty());
        let value = data.get(&e.key);
        prop_assert!(value.is_some(), "error names a key not in the map: {e:?}");
        let value = value.unwrap();
        if let Some(line) = e.line {
            let count = value.lines().count();
            prop_assert!(
                (1..=count).contains(&line),
                "line {line} outside the value's {count} lines: {e:?}\nvalue: {value:?}"
            );
            let written = value.lines().nth(line - 1).unwrap();
            prop_assert!(
                written.contains(&e.text),
                "error text {:?} is not on line {line} ({written:?})",
                e.text
            );
        } else {
            prop_assert!(e.text.is_empty() || value.contains(&e.text), "{e:?}");
        }
    }
    let order: Vec<(&str, Option<usize>)> =
        errors.iter().map(|e| (e.key.as_str(), e.line)).collect();
    let mut sorted = order.clone();
    sorted.sort();
    prop_assert_eq!(order, sorted, "errors are not in (key, line) order");
    Ok(())
}

/// Every property of an accepted ConfigMap: one pool per address key, each pool's ranges
/// sorted, disjoint, merged and exactly the union of its entries, every entry
/// `parse_entry`-valid and on the line it names, and no address in two pools.
fn check_config(data: &BTreeMap<String, String>, config: &PoolConfig) -> Result<(), TestCaseError> {
    let address_keys = data.keys().filter(|k| *k != OPTIONS_KEY).count();
    prop_assert_eq!(config.pools().count(), address_keys);
    let mut all_ranges = Vec::new();
    for (key, pool) in config.pools() {
        let value = &data[key.as_str()];
        prop_assert_eq!(PoolKey::from_config_key(key.as_str()), Ok(key.clone()));
        prop_assert!(!pool.entries.is_empty(), "pool {key} has no entries");
        for pair in pool.ranges.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            prop_assert!(
                a.family() < b.family()
                    || (a.family() == b.family() && to_u128(a.last()) + 1 < to_u128(b.first())),
                "pool {key}: ranges {a} and {b} are unsorted, overlapping or unmerged"
            );
        }
        let lines: Vec<&str> = value.lines().collect();
        for (i, entry) in pool.entries.iter().enumerate() {
            prop_assert_eq!(parse_entry(&entry.text), Ok(entry.range), "{:?}", entry);
            prop_assert!((1..=lines.len()).contains(&entry.line), "{entry:?}");
            prop_assert!(lines[entry.line - 1].contains(&entry.text), "{entry:?}");
            prop_assert!(
                i == 0 || pool.entries[i - 1].line < entry.line,
                "entries of {key} out of line order"
            );
            prop_assert!(
                pool.ranges
                    .iter()
                    .any(|r| r.contains(entry.range.first()) && r.contains(entry.range.last())),
                "entry {entry:?} of {key} is not inside the pool's ranges"
            );
        }
        for family in [Family::V4, Family::V6] {
            // Entries of a valid config are disjoint, so their sizes add up to the pool's.
            let entries: u128 = pool
                .entries
                .iter()
                .filter(|e| e.range.family() == family)
                .map(|e| e.range.len())
                .fold(0, u128::saturating_add);
            prop_assert_eq!(pool.size(family), entries, "pool {} {}", key, family);
        }
        if !data.contains_key(OPTIONS_KEY) {
            prop_assert_eq!(&pool.options, &PoolOptions::default());
        }
        all_ranges.extend(pool.ranges.iter().copied());
    }
    all_ranges.sort();
    for pair in all_ranges.windows(2) {
        prop_assert!(
            !pair[0].overlaps(&pair[1]),
            "{} and {} in two pools",
            pair[0],
            pair[1]
        );
    }
    Ok(())
}

fn check_parse(data: &BTreeMap<String, String>) -> Result<(), TestCaseError> {
    let result = PoolConfig::parse(data);
    prop_assert_eq!(
        &PoolConfig::parse(data),
        &result,
        "parse is not deterministic"
    );
    match &result {
        Ok(config) => check_config(data, config),
        Err(errors) => check_errors(data, errors),
    }
}

/// The properties of one `parse_entry` call.
fn check_entry(text: &str) -> Result<(), TestCaseError> {
    match parse_entry(text) {
        Err(message) => prop_assert!(!message.trim().is_empty(), "{text:?}: empty message"),
        Ok(range) => {
            if let Ok(ip) = text.parse::<IpAddr>() {
                prop_assert_eq!(range, IpRange::single(ip));
            }
            if let Some((first, last)) = text.split_once('-') {
                prop_assert_eq!(Ok(range.first()), first.trim().parse::<IpAddr>());
                prop_assert_eq!(Ok(range.last()), last.trim().parse::<IpAddr>());
            }
            if let Some((addr, _)) = text.split_once('/') {
                let addr: IpAddr = addr.trim().parse().unwrap();
                prop_assert!(
                    range.contains(addr) || to_u128(addr) + 1 == to_u128(range.first()),
                    "{text}: {range} does not start at the network"
                );
            }
            // The range's own notation means the same addresses.
            prop_assert_eq!(parse_entry(&range.to_string()), Ok(range));
            for special in [
                "0.0.0.0",
                "127.0.0.1",
                "169.254.0.1",
                "224.0.0.1",
                "255.255.255.255",
                "::",
                "::1",
                "fe80::1",
                "ff02::1",
            ] {
                prop_assert!(
                    !range.contains(special.parse().unwrap()),
                    "{text}: {range} holds {special}"
                );
            }
        }
    }
    Ok(())
}

proptest! {
    // `PROPTEST_CASES` overrides this count (the macro applies the environment last).
    #![proptest_config(ProptestConfig::with_cases(600))]

    /// Maps of arbitrary and near-valid keys and values: no panic, and every outcome
    /// passes [`check_parse`].
    #[test]
    fn pool_config_parse_is_total_and_consistent(data in config_data()) {
        check_parse(&data)?;
    }

    /// Only near-valid addresses under valid keys, so a good share of maps is accepted and
    /// the `Ok` properties are exercised, not only the errors.
    #[test]
    fn pool_config_accepts_consistently(
        pairs in prop::collection::vec(
            (prop::sample::select(vec!["default", "staging", FALLBACK_KEY]),
             prop::collection::vec(near_entry(), 1..4)),
            1..4,
        )
    ) {
        let data: BTreeMap<String, String> = pairs
            .into_iter()
            .map(|(k, entries)| (k.to_owned(), entries.join("\n")))
            .collect();
        check_parse(&data)?;
    }

    #[test]
    fn options_documents_never_panic(options in options_value(), keys in prop::collection::vec(config_key(), 0..3)) {
        let mut data: BTreeMap<String, String> =
            keys.into_iter().map(|k| (k, "10.1.0.1".to_owned())).collect();
        data.insert(OPTIONS_KEY.to_owned(), options);
        check_parse(&data)?;
    }

    #[test]
    fn parse_entry_is_total_and_round_trips(text in prop_oneof![3 => near_entry(), 1 => arbitrary_text()]) {
        check_entry(&text)?;
    }

    /// Single valid addresses are accepted as exactly themselves unless special.
    #[test]
    fn parse_entry_keeps_single_addresses(ip in any::<IpAddr>()) {
        check_entry(&ip.to_string())?;
        if let Ok(range) = parse_entry(&ip.to_string()) {
            prop_assert_eq!(range, IpRange::single(ip));
        }
    }

    #[test]
    fn parse_ip_list_is_total(
        value in prop_oneof![
            3 => prop::collection::vec(prop_oneof![address_text(), Just(String::new()), arbitrary_text()], 0..4)
                .prop_map(|items| items.join(",")),
            1 => arbitrary_text(),
        ]
    ) {
        match parse_ip_list(&value) {
            Err(e) => prop_assert!(!e.to_string().trim().is_empty()),
            Ok(ips) => {
                prop_assert!((1..=2).contains(&ips.len()), "{value:?}: {ips:?}");
                if let [a, b] = ips[..] {
                    prop_assert_ne!(Family::of(a), Family::of(b));
                }
                let items: Vec<&str> = value.split(',').map(str::trim).collect();
                prop_assert_eq!(items.len(), ips.len());
                for (item, ip) in items.iter().zip(&ips) {
                    prop_assert_eq!(item.parse::<IpAddr>().ok(), Some(*ip));
                }
                let written: Vec<String> = ips.iter().map(IpAddr::to_string).collect();
                prop_assert_eq!(parse_ip_list(&written.join(",")), Ok(ips));
            }
        }
    }

    #[test]
    fn agent_report_from_json_is_total(json in report_annotation(any::<IpAddr>())) {
        match AgentReport::from_json(&json) {
            Err(e) => {
                let message = e.to_string();
                prop_assert!(message.starts_with("agent report"), "{message}");
                prop_assert!(!e.category().is_empty());
                if json.len() > MAX_REPORT_BYTES {
                    prop_assert_eq!(e.category(), "too_large");
                }
            }
            Ok(report) => {
                // Within bounds, and a fixed point: reading what it writes changes nothing.
                prop_assert!(report.interfaces.len() <= MAX_INTERFACES);
                for interface in &report.interfaces {
                    prop_assert_eq!(interface_name_error(&interface.name), None);
                    prop_assert!(interface.subnets.len() <= MAX_SUBNETS_PER_INTERFACE);
                    for subnet in &interface.subnets {
                        let widest = match subnet {
                            ipnet::IpNet::V4(_) => WIDEST_SUBNET_V4,
                            ipnet::IpNet::V6(_) => WIDEST_SUBNET_V6,
                        };
                        prop_assert!(subnet.prefix_len() >= widest, "{subnet}");
                    }
                }
                for conflict in &report.conflicts {
                    prop_assert!(conflict.reason.len() <= MAX_REASON);
                    prop_assert!(!conflict.reason.contains(char::is_control));
                }
                prop_assert_eq!(AgentReport::from_json(&report.to_json()).unwrap(), report)
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Inputs a generator reaches rarely: deep nesting, huge sizes, exact corner cases.
// ---------------------------------------------------------------------------------------

#[test]
fn deeply_nested_documents_are_rejected_without_overflowing_the_stack() {
    let depth = 100_000;
    // serde_json skips unknown fields without recursing, so any depth there is harmless.
    let json = format!("{{\"future\":{}{}}}", "[".repeat(depth), "]".repeat(depth));
    assert_eq!(
        AgentReport::from_json(&json).unwrap(),
        AgentReport::default()
    );

    for nested in [
        format!("pools: {}{}", "[".repeat(depth), "]".repeat(depth)),
        format!("pools:\n  default: {}", "{a: ".repeat(depth)),
        format!(
            "pools:\n{}",
            (0..2000)
                .map(|i| format!("{}- x\n", " ".repeat(i)))
                .collect::<String>()
        ),
    ] {
        let data: BTreeMap<String, String> = [
            ("default".to_owned(), "10.0.0.1".to_owned()),
            (OPTIONS_KEY.to_owned(), nested),
        ]
        .into();
        let errors = PoolConfig::parse(&data).unwrap_err();
        assert!(
            !errors.is_empty() && errors.iter().all(|e| !e.message.is_empty()),
            "{errors:?}"
        );
    }
}

#[test]
fn options_errors_at_the_end_of_the_text_name_a_line_of_the_value() {
    // yaml_serde reports errors found at the end of input on the line after the last one,
    // and counts a lone `\r` or U+2028 as a line break, which `str::lines` does not.
    for text in [
        "pools:\n  default: [eth0\n",
        "pools:\n  default: {",
        "pools: \"open",
        "\r,",
        "pools:\r  default: [\r",
        "pools: {}\u{2028}x: [",
    ] {
        let data: BTreeMap<String, String> = [
            ("default".to_owned(), "10.0.0.1".to_owned()),
            (OPTIONS_KEY.to_owned(), text.to_owned()),
        ]
        .into();
        let errors = PoolConfig::parse(&data).unwrap_err();
        let lines = text.lines().count();
        for e in &errors {
            let line = e.line.expect("a YAML error has a line");
            assert!(
                (1..=lines).contains(&line),
                "{text:?}: line {line} of {lines}: {e}"
            );
            assert!(!e.text.is_empty(), "{text:?}: {e}");
        }
    }
}

#[test]
fn corner_cases_of_entries() {
    for text in [
        "0.0.0.0/0",
        "::/0",
        "10.0.0.0/32",
        "10.0.0.0/31",
        "10.0.0.0/30",
        "2001:db8::/127",
        "2001:db8::/128",
        "2001:db8::/126",
        "8000::/1",
        "128.0.0.0/1",
        "::ffff:10.0.0.1",
        "::ffff:0:0/96",
        "fe80::1%eth0",
        "10.0.0.1-10.0.0.1",
        "-",
        "/",
        "-/",
        "/-",
        "--",
        "",
        "10.0.0.1/",
        "/24",
        "10.0.0.01",
        "1.2.3",
        "1.2.3.4.5",
        "١.١.١.١",
        "10.0.0.1/٢٤",
        "10.0.0.1-",
        "-10.0.0.1",
        "10.0.0.0/33",
        "2001:db8::/129",
        "10.0.0.0/999999999999999999999",
    ] {
        check_entry(text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
    }
}

/// libyaml scans flow collections in time quadratic in their nesting depth (16,000 levels
/// took 2.6 s in a debug build), so a ConfigMap-sized value of `[` would stall the parser
/// for minutes; it must be refused up front, naming the line.
#[test]
fn deep_flow_nesting_is_refused_quickly() {
    let mib = 1 << 20;
    for text in [
        format!("pools: {}", "[".repeat(mib)),
        format!("pools:\n  default: {}", "{a: ".repeat(mib / 4)),
    ] {
        let data: BTreeMap<String, String> = [
            ("default".to_owned(), "10.0.0.1".to_owned()),
            (OPTIONS_KEY.to_owned(), text.clone()),
        ]
        .into();
        let start = std::time::Instant::now();
        let errors = PoolConfig::parse(&data).unwrap_err();
        let elapsed = start.elapsed();
        assert!(elapsed.as_secs() < 2, "took {elapsed:?}");
        assert_eq!(errors.len(), 1, "{errors:?}");
        let line = text.lines().count();
        assert_eq!(errors[0].line, Some(line));
        assert!(
            errors[0].message.contains("nested more than"),
            "{}",
            errors[0].message
        );
    }
}
