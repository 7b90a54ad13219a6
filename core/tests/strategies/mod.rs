//! Generators shared by the property tests of untrusted input: arbitrary text, small edits
//! of near-valid text, and agent reports. Used by `core/tests/robustness.rs` and, through
//! `#[path]`, by the controller's `tests/report_robustness.rs`.

#![allow(dead_code)]

use std::net::IpAddr;

use aliaslb_core::report::{AgentReport, Conflict, InterfaceReport, MAX_REPORT_BYTES, ShieldState};
use proptest::prelude::*;

/// Arbitrary bytes, decoded lossily (invalid sequences become U+FFFD).
pub fn lossy_text() -> impl Strategy<Value = String> {
    prop::collection::vec(any::<u8>(), 0..80)
        .prop_map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
}

/// Arbitrary unicode, lossy bytes, or text over the characters entries are made of.
pub fn arbitrary_text() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<String>(),
        lossy_text(),
        "[0-9a-fA-F.:/%# ,;\t\r\n\\-]{0,40}",
    ]
}

/// A small edit to near-valid text, at a position given as a fraction of its length.
#[derive(Debug, Clone)]
pub enum Mutation {
    None,
    Insert(f64, char),
    Delete(f64),
    Replace(f64, char),
    Truncate(f64),
}

impl Mutation {
    pub fn apply(&self, text: &str) -> String {
        let chars: Vec<char> = text.chars().collect();
        let at = |f: f64| ((chars.len() as f64) * f) as usize;
        let mut out = chars.clone();
        match *self {
            Mutation::None => {}
            Mutation::Insert(f, c) => out.insert(at(f).min(chars.len()), c),
            Mutation::Delete(f) if !chars.is_empty() => {
                out.remove(at(f).min(chars.len() - 1));
            }
            Mutation::Replace(f, c) if !chars.is_empty() => out[at(f).min(chars.len() - 1)] = c,
            Mutation::Truncate(f) => out.truncate(at(f)),
            Mutation::Delete(_) | Mutation::Replace(..) => {}
        }
        out.into_iter().collect()
    }
}

pub fn mutation() -> impl Strategy<Value = Mutation> {
    let special = prop_oneof![
        4 => prop::sample::select(vec![
            '-', '/', '.', ':', '%', '#', ',', ' ', '\t', '0', '9', 'f', '\u{FEFF}', '\u{a0}',
            '\r', '١', '\u{2028}',
        ]),
        1 => any::<char>(),
    ];
    let fraction = 0.0..1.0f64;
    prop_oneof![
        4 => Just(Mutation::None),
        1 => (fraction.clone(), special.clone()).prop_map(|(f, c)| Mutation::Insert(f, c)),
        1 => fraction.clone().prop_map(Mutation::Delete),
        1 => (fraction.clone(), special).prop_map(|(f, c)| Mutation::Replace(f, c)),
        1 => fraction.prop_map(Mutation::Truncate),
    ]
}

/// A report with a few interfaces, held IPs, conflicts and a shield state.
pub fn agent_report() -> impl Strategy<Value = AgentReport> {
    let interface = (
        "[a-z]{1,4}[0-9]",
        prop::collection::vec((any::<IpAddr>(), 0u8..=32), 0..3),
    )
        .prop_map(|(name, subnets)| InterfaceReport {
            addresses: Vec::new(),
            mac: None,
            name,
            subnets: subnets
                .into_iter()
                .filter_map(|(ip, len)| format!("{ip}/{len}").parse().ok())
                .collect(),
        });
    (
        0u32..3,
        prop::collection::vec(interface, 0..3),
        prop::collection::btree_set(any::<IpAddr>(), 0..3),
        prop::collection::vec((any::<IpAddr>(), "[ -~]{0,10}"), 0..2),
        shield_state(),
    )
        .prop_map(
            |(version, interfaces, held, conflicts, shield)| AgentReport {
                version,
                interfaces,
                held,
                conflicts: conflicts
                    .into_iter()
                    .map(|(ip, reason)| Conflict {
                        while_held: false,
                        yielded: false,
                        ip,
                        reason,
                        mac: None,
                        interface: None,
                    })
                    .collect(),
                shield,
                macs: Vec::new(),
                key: None,
                routing: None,
            },
        )
}

fn shield_state() -> impl Strategy<Value = ShieldState> {
    prop_oneof![
        Just(ShieldState::Active),
        Just(ShieldState::Off),
        Just(ShieldState::Failing),
        Just(ShieldState::Unknown),
    ]
}

/// Text a hostile agent might put in a name or reason: short printable, arbitrary, or a
/// short piece repeated up to 40,000 times.
pub fn hostile_text() -> impl Strategy<Value = String> {
    prop_oneof![
        2 => "[ -~]{0,12}",
        2 => arbitrary_text(),
        1 => ("[a-zé\\n\u{1b}\u{2028} ]{1,8}", 0usize..5000).prop_map(|(piece, n)| piece.repeat(n)),
    ]
}

/// A report as a buggy or compromised agent might write it: names and reasons from
/// [`hostile_text`], IPs (held, in conflict, in subnets) from `ips`.
pub fn hostile_report(
    ips: impl Strategy<Value = IpAddr> + Clone,
) -> impl Strategy<Value = AgentReport> {
    let name = prop_oneof![3 => "[a-z]{1,4}[0-9]", 1 => hostile_text()];
    let interface =
        (name, prop::collection::vec((ips.clone(), 0u8..=32), 0..3)).prop_map(|(name, subnets)| {
            InterfaceReport {
                addresses: Vec::new(),
                mac: None,
                name,
                subnets: subnets
                    .into_iter()
                    .filter_map(|(ip, len)| format!("{ip}/{len}").parse().ok())
                    .collect(),
            }
        });
    (
        0u32..3,
        prop::collection::vec(interface, 0..4),
        prop::collection::btree_set(ips.clone(), 0..4),
        prop::collection::vec((ips, hostile_text()), 0..4),
        shield_state(),
    )
        .prop_map(
            |(version, interfaces, held, conflicts, shield)| AgentReport {
                version,
                interfaces,
                held,
                conflicts: conflicts
                    .into_iter()
                    .map(|(ip, reason)| Conflict {
                        while_held: false,
                        yielded: false,
                        ip,
                        reason,
                        mac: None,
                        interface: None,
                    })
                    .collect(),
                shield,
                macs: Vec::new(),
                key: None,
                routing: None,
            },
        )
}

/// What a report annotation may hold: a report (plain or hostile, see [`hostile_report`])
/// with small edits, arbitrary text, JSON-ish character soup, or more than
/// [`MAX_REPORT_BYTES`].
pub fn report_annotation(
    ips: impl Strategy<Value = IpAddr> + Clone,
) -> impl Strategy<Value = String> {
    let edits = || prop::collection::vec(mutation(), 1..4);
    let edited =
        |json: String, edits: Vec<Mutation>| edits.iter().fold(json, |json, m| m.apply(&json));
    prop_oneof![
        3 => (agent_report(), edits()).prop_map(move |(r, e)| edited(r.to_json(), e)),
        3 => (hostile_report(ips), edits()).prop_map(move |(r, e)| edited(r.to_json(), e)),
        1 => arbitrary_text(),
        1 => "[\\[\\]{}\",:0-9a-z ]{0,40}",
        1 => (1usize..3).prop_map(|n| format!("{{\"future\":\"{}\"}}", "x".repeat(MAX_REPORT_BYTES + n))),
    ]
}
