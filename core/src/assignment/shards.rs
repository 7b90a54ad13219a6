//! The sharded layout of a node's assignment: its IP lines spread over several objects by
//! a hash of the address, so a change rewrites the one shard its line is in, not every line
//! of the node.
//!
//! - The node's **index** `aliaslb-node-<node>` ([`crate::keys::assignment_configmap`])
//!   holds the shard count under [`crate::keys::SHARDS_KEY`] (a power of two), every node's
//!   MACs under [`crate::keys::NODE_MACS_KEY`], and under [`crate::keys::ASSIGNMENTS_KEY`]
//!   the single line [`LEGACY_MARKER`]: an agent of the single-object format reads its lines
//!   there, refuses that one (an unknown flag), keeps what it has and logs why.
//! - **Shard** `k` (`aliaslb-shard-<node>-<k>`,
//!   [`crate::keys::assignment_shard_configmap`]) holds, under
//!   [`crate::keys::ASSIGNMENTS_KEY`], the lines of the IPs whose [`shard_of`] is `k`, in
//!   the line format of [`crate::assignment`].
//! - Index and shards carry the label [`crate::keys::LABEL_ASSIGNMENT_NODE`], so an agent
//!   watches its own node's objects and no other.
//!
//! **Growth.** The writer doubles the count until every shard is within
//! [`MAX_SHARD_LINES`] lines and [`MAX_SHARD_BYTES`] bytes ([`Sharded::split`]); it never
//! shrinks it (a node that once carried many IPs keeps its empty shards). A line counts
//! only in the shard it hashes to under the index's count: [`read`] ignores the copies
//! elsewhere. So the writer grows in an order in which a reader never misses a line:
//! 1. the new shards `[old, new)` are written, each with its lines; a reader of the old
//!    count does not look at them;
//! 2. the index says the new count; the lines that move are now read from the new shards,
//!    already written; their copies in the old shards no longer count;
//! 3. the old shards are rewritten without those copies.
//!
//! Pure: split, render and read only.

use std::net::IpAddr;

use super::{AssignmentError, NodeAssignments, render_line};
use crate::hash::Fnv1a;

/// A shard grows no longer than this many lines: ~25 KB in the usual line of ~50 bytes.
pub const MAX_SHARD_LINES: usize = 512;
/// Nor than this many bytes (lines with many ports or shared by many Services).
pub const MAX_SHARD_BYTES: usize = 128 * 1024;
/// The most shards a node gets (a node would then carry half a million IPs).
pub const MAX_SHARDS: u32 = 1024;

/// The [`crate::keys::ASSIGNMENTS_KEY`] value of a sharded index: a line an agent of the
/// single-object format refuses with "unknown flag `sharded`", showing this text.
pub const LEGACY_MARKER: &str =
    "0.0.0.0 - - this-assignment-is-sharded:upgrade-the-aliaslb-agent sharded\n";

/// The shard of `ip` among `count` (a power of two): a stable hash of the address
/// (`core/src/hash.rs`), so every release places an address the same way.
pub fn shard_of(ip: IpAddr, count: u32) -> u32 {
    let bucket = address_hash(ip) % u64::from(count.max(1));
    u32::try_from(bucket).unwrap_or(0)
}

fn address_hash(ip: IpAddr) -> u64 {
    let mut hash = Fnv1a::new();
    hash.write_ip(Some(ip));
    hash.finish_mixed()
}

/// A node's assignment split into shards: the text of each, in shard order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sharded {
    /// Shard `k`'s lines, in address order.
    pub texts: Vec<String>,
}

impl Sharded {
    /// Splits `assignments` over the fewest shards, at least `at_least` (the count already
    /// in force: it never shrinks), so that each is within [`MAX_SHARD_LINES`] and
    /// [`MAX_SHARD_BYTES`] (up to [`MAX_SHARDS`]). Every line is rendered once.
    pub fn split(assignments: &NodeAssignments, at_least: u32) -> Sharded {
        let lines: Vec<(u64, String)> = assignments
            .ips
            .iter()
            .map(|(ip, a)| {
                let mut line = String::new();
                render_line(&mut line, *ip, a);
                (address_hash(*ip), line)
            })
            .collect();
        let mut count = at_least.clamp(1, MAX_SHARDS).next_power_of_two();
        while count < MAX_SHARDS && !fits(&lines, count) {
            count *= 2;
        }
        let mut texts = vec![String::new(); count as usize];
        for (hash, line) in lines {
            texts[bucket(hash, count)].push_str(&line);
        }
        Sharded { texts }
    }

    /// How many shards.
    pub fn count(&self) -> u32 {
        u32::try_from(self.texts.len()).unwrap_or(MAX_SHARDS)
    }
}

fn bucket(hash: u64, count: u32) -> usize {
    usize::try_from(hash % u64::from(count)).unwrap_or(0)
}

fn fits(lines: &[(u64, String)], count: u32) -> bool {
    let mut sizes = vec![(0usize, 0usize); count as usize];
    for (hash, line) in lines {
        let (n, bytes) = &mut sizes[bucket(*hash, count)];
        *n += 1;
        *bytes += line.len();
        if *n > MAX_SHARD_LINES || *bytes > MAX_SHARD_BYTES {
            return false;
        }
    }
    true
}

/// Reads an index's [`crate::keys::SHARDS_KEY`] value: a power of two from 1 to
/// [`MAX_SHARDS`].
pub fn parse_count(text: &str) -> Result<u32, String> {
    let count: u32 = text
        .trim()
        .parse()
        .map_err(|_| format!("`{}` is not a shard count", text.trim()))?;
    if !count.is_power_of_two() || count > MAX_SHARDS {
        return Err(format!(
            "shard count {count} is not a power of two from 1 to {MAX_SHARDS}"
        ));
    }
    Ok(count)
}

/// Reads a node's assignment from its `count` shards (`shard(k)`: the text of shard `k`, if
/// it exists); only the lines in their own shard count. `Ok(None)`: a shard is missing.
pub fn read<'a>(
    count: u32,
    mut shard: impl FnMut(u32) -> Option<&'a str>,
) -> Result<Option<NodeAssignments>, AssignmentError> {
    let mut out = NodeAssignments::new();
    for k in 0..count {
        let Some(text) = shard(k) else {
            return Ok(None);
        };
        let part = NodeAssignments::parse(text).map_err(|e| AssignmentError {
            message: format!("shard {k}: {}", e.message),
            ..e
        })?;
        out.ips.extend(
            part.ips
                .into_iter()
                .filter(|(ip, _)| shard_of(*ip, count) == k),
        );
    }
    Ok(Some(out))
}

/// A node's sharded assignment as both its agent and the controller read it: the index
/// `index_name`'s shard count, node MACs (an index of earlier releases) and peers (their
/// texts), and the shards by number (`shard`). `Ok(None)`: a shard the count lists is
/// missing (not written yet, or gone).
pub fn read_index<'a>(
    index_name: &str,
    count: &str,
    node_macs: &str,
    peers: &str,
    shard: impl FnMut(u32) -> Option<&'a str>,
) -> Result<Option<NodeAssignments>, String> {
    let count = parse_count(count).map_err(|e| format!("{index_name}: {e}"))?;
    let Some(mut assignments) = read(count, shard).map_err(|e| e.to_string())? else {
        return Ok(None);
    };
    assignments
        .parse_node_macs(node_macs)
        .and_then(|()| assignments.parse_peers(peers))
        .map_err(|e| format!("{index_name}: {e}"))?;
    Ok(Some(assignments))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::assignment::{OpenPort, Protocol};

    fn node_with(n: usize, ports: u16) -> NodeAssignments {
        let mut a = NodeAssignments::new();
        for i in 0..n {
            let ip = IpAddr::from([10, 1, (i / 250) as u8, (i % 250) as u8 + 1]);
            let open = (1..=ports).map(|port| OpenPort {
                protocol: Protocol::Tcp,
                port,
            });
            a.assign(ip, None, open, &format!("ns/svc-{i}"));
        }
        a
    }

    fn read_all(s: &Sharded) -> NodeAssignments {
        read(s.count(), |k| s.texts.get(k as usize).map(String::as_str))
            .unwrap()
            .unwrap()
    }

    #[test]
    fn shards_grow_until_each_fits_and_read_back_whole() {
        for (ips, ports, at_least) in [
            (0, 1, 1),
            (10, 1, 1),
            (3_000, 1, 1),
            (3_000, 1, 64),
            (2_000, 40, 1),
        ] {
            let a = node_with(ips, ports);
            let s = Sharded::split(&a, at_least);
            assert!(
                s.count().is_power_of_two() && s.count() >= at_least,
                "{ips}"
            );
            for text in &s.texts {
                assert!(text.lines().count() <= MAX_SHARD_LINES, "{ips}");
                assert!(text.len() <= MAX_SHARD_BYTES, "{ips}");
            }
            if s.count() > at_least {
                assert!(!fits(&lines_of(&a), s.count() / 2), "{ips}: not the fewest");
            }
            assert_eq!(read_all(&s), a, "{ips} IPs read back");
        }
        assert_eq!(Sharded::split(&node_with(10, 1), 1).count(), 1);
        assert_eq!(Sharded::split(&node_with(10_000, 1), 1).count(), 32);
    }

    fn lines_of(a: &NodeAssignments) -> Vec<(u64, String)> {
        a.ips
            .iter()
            .map(|(ip, l)| {
                let mut line = String::new();
                render_line(&mut line, *ip, l);
                (address_hash(*ip), line)
            })
            .collect()
    }

    #[test]
    fn a_reader_never_misses_a_line_while_the_count_doubles() {
        let a = node_with(900, 1);
        let old = Sharded::split(&a, 1);
        let new = Sharded::split(&a, old.count() * 2);
        let (o, n) = (old.count(), new.count());
        // What a reader sees after each write of the growth order, with the count it reads.
        let shard = |k: u32, written_new: &dyn Fn(u32) -> bool| -> Option<String> {
            if written_new(k) {
                new.texts.get(k as usize).cloned()
            } else {
                old.texts.get(k as usize).cloned()
            }
        };
        let steps: [(u32, &dyn Fn(u32) -> bool); 3] = [
            (o, &|k| k >= o), // 1. the new shards written
            (n, &|k| k >= o), // 2. the index says n; the old shards still hold copies
            (n, &|_| true),   // 3. the old shards lose the copies
        ];
        for (i, (count, written)) in steps.into_iter().enumerate() {
            let texts: Vec<Option<String>> = (0..count).map(|k| shard(k, written)).collect();
            let seen = read(count, |k| texts[k as usize].as_deref())
                .unwrap()
                .unwrap();
            assert_eq!(seen, a, "step {}", i + 1);
        }
    }

    #[test]
    fn a_missing_shard_and_a_bad_line_are_told_apart() {
        let s = Sharded::split(&node_with(600, 1), 1);
        assert_eq!(s.count(), 2);
        assert_eq!(
            read(2, |k| (k == 0).then_some(s.texts[0].as_str())),
            Ok(None)
        );
        let e = read(2, |k| Some(if k == 1 { "10.0.0.1 eth0" } else { "" })).unwrap_err();
        assert!(e.to_string().contains("shard 1: expected 4 fields"), "{e}");
        // A copy of a line in another shard than its own does not count.
        let stray = read(1, |_| Some("")).unwrap().unwrap();
        assert!(stray.is_empty());
        let ip: IpAddr = "10.0.0.1".parse().unwrap();
        let other = 1 - shard_of(ip, 2);
        let texts = |k: u32| if k == other { "10.0.0.1 - - a/b\n" } else { "" };
        assert!(read(2, |k| Some(texts(k))).unwrap().unwrap().is_empty());
    }

    #[test]
    fn counts_are_powers_of_two_within_the_bound() {
        assert_eq!(parse_count("8"), Ok(8));
        assert_eq!(parse_count(" 1\n"), Ok(1));
        for bad in ["0", "3", "2048", "-1", "x", ""] {
            assert!(parse_count(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn an_older_agent_refuses_a_sharded_index_and_says_why() {
        // The single-object parser is the one agents of earlier releases run.
        let e = NodeAssignments::parse(LEGACY_MARKER).unwrap_err();
        let text = e.to_string();
        assert!(text.contains("unknown flag `sharded`"), "{text}");
        assert!(text.contains("upgrade-the-aliaslb-agent"), "{text}");
    }

    #[test]
    fn the_shard_of_an_address_is_pinned() {
        // Golden values: changing the hash moves every line of every node once.
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let got: Vec<u32> = ["10.0.0.1", "10.0.0.2", "192.0.2.77", "2001:db8::11"]
            .iter()
            .map(|s| shard_of(ip(s), 1024))
            .collect();
        assert_eq!(got, GOLDEN_SHARDS);
        assert_eq!(shard_of(ip("10.0.0.1"), 1), 0);
    }

    /// fmix64(FNV-1a 64 of `[0, 4]` or `[0, 6]` and the octets) mod 1024, computed
    /// independently (Python).
    const GOLDEN_SHARDS: [u32; 4] = [890, 761, 757, 343];
}
