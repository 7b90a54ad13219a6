//! The only module that runs `nft`: the real [`ShieldBackend`].
//!
//! Scripts go to `nft -f -` on standard input: one script is one kernel transaction, so a
//! table replace or a batch of element updates lands whole or not at all. The table is read
//! with `nft -t -j` (terse: without the set elements), for its shape and its counters. Every call is bounded by [`TIMEOUT`] and the child is killed past it.
//!
//! Why the binary and not a crate: the Rust crates that speak nf_tables netlink are GPL or
//! bindings to libnftnl, and the JSON-schema crate would turn the ruleset of `shield.rs` into
//! hundreds of lines of struct literals. Every value we write is typed (IP, protocol, port),
//! so the nft syntax leaves nothing to quote. The image ships Debian's `nftables`.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tokio::io::AsyncWriteExt as _;
use tokio::process::Command;

#[cfg(test)]
use crate::shield::Dropped;
use crate::shield::{ShieldBackend, ShieldError, TableView};

/// Bound on one `nft` run.
pub const TIMEOUT: Duration = Duration::from_secs(5);

/// Runs the `nft` binary.
#[derive(Debug, Clone)]
pub struct NftBackend {
    program: PathBuf,
}

impl Default for NftBackend {
    fn default() -> Self {
        Self::new("nft")
    }
}

impl NftBackend {
    /// Runs `program` (a path, or a name looked up in `PATH`).
    pub fn new(program: impl Into<PathBuf>) -> Self {
        NftBackend {
            program: program.into(),
        }
    }

    /// Runs nft with `args`, `input` on standard input; returns standard output.
    async fn run(
        &self,
        what: &'static str,
        args: &[&str],
        input: Option<&str>,
    ) -> Result<String, ShieldError> {
        let mut child = Command::new(&self.program)
            .args(args)
            .stdin(if input.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| ShieldError::Spawn {
                program: self.program.display().to_string(),
                source,
            })?;
        let stdin = child.stdin.take();
        let output = async move {
            if let (Some(mut stdin), Some(input)) = (stdin, input) {
                // A write error means nft exited early: its status and stderr say why.
                let _ = stdin.write_all(input.as_bytes()).await;
            }
            child.wait_with_output().await
        };
        let output = tokio::time::timeout(TIMEOUT, output)
            .await
            .map_err(|_| ShieldError::Timeout {
                what,
                seconds: TIMEOUT.as_secs(),
            })?
            .map_err(|source| ShieldError::Spawn {
                program: self.program.display().to_string(),
                source,
            })?;
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            return Err(ShieldError::Nft {
                what,
                stderr: stderr.trim().chars().take(2000).collect(),
            });
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }
}

impl ShieldBackend for NftBackend {
    async fn apply(&self, script: &str) -> Result<(), ShieldError> {
        self.run("apply", &["-f", "-"], Some(script))
            .await
            .map(drop)
    }

    async fn check(&self, script: &str) -> Result<(), ShieldError> {
        self.run("check", &["-c", "-f", "-"], Some(script))
            .await
            .map(drop)
    }

    async fn inspect(&self) -> Result<Option<TableView>, ShieldError> {
        // `-t` (terse) leaves out the set elements: the cost does not grow with the IPs.
        match self
            .run(
                "list table",
                &["-t", "-j", "list", "table", "inet", "aliaslb"],
                None,
            )
            .await
        {
            Ok(out) => parse_view(&out).map(Some),
            // The kernel's ENOENT: there is no such table.
            Err(ShieldError::Nft { stderr, .. })
                if stderr.starts_with("Error: No such file or directory") =>
            {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    async fn chains(&self) -> Result<Option<BTreeSet<String>>, ShieldError> {
        // Of every inet table: nft cannot list one table's chains without reading its
        // sets, and chains are few.
        let out = self
            .run("list chains", &["-j", "list", "chains", "inet"], None)
            .await?;
        parse_chains(&out)
    }
}

/// The chains of `inet aliaslb` in `nft -j list chains inet` output (`None`: none, so no
/// table of ours, or one without a chain).
fn parse_chains(json: &str) -> Result<Option<BTreeSet<String>>, ShieldError> {
    let v: Value = serde_json::from_str(json).map_err(|e| ShieldError::Output {
        what: "list chains",
        detail: e.to_string(),
    })?;
    let chains: BTreeSet<String> = v
        .get("nftables")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|i| i.get("chain"))
        .filter(|c| c.get("table").and_then(Value::as_str) == Some("aliaslb"))
        .filter(|c| c.get("family").and_then(Value::as_str) == Some("inet"))
        .filter_map(|c| c.get("name").and_then(Value::as_str).map(str::to_owned))
        .collect();
    Ok((!chains.is_empty()).then_some(chains))
}

/// Reads the chains' rule counts, the sets and the counters `dropped4` and `dropped6` from
/// `nft -t -j list table` output.
fn parse_view(json: &str) -> Result<TableView, ShieldError> {
    let bad = |detail: String| ShieldError::Output {
        what: "list table",
        detail,
    };
    let v: Value = serde_json::from_str(json).map_err(|e| bad(e.to_string()))?;
    let items = v
        .get("nftables")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("no `nftables` array".into()))?;
    let mut view = TableView::default();
    let name = |o: &Value, key: &str| o.get(key).and_then(Value::as_str).map(str::to_owned);
    for item in items {
        if let Some(counter) = item.get("counter") {
            let packets = counter.get("packets").and_then(Value::as_u64).unwrap_or(0);
            match counter.get("name").and_then(Value::as_str) {
                Some("dropped4") => view.dropped.v4 = packets,
                Some("dropped6") => view.dropped.v6 = packets,
                _ => {}
            }
        } else if let Some(chain) = item.get("chain").and_then(|c| name(c, "name")) {
            view.rules.entry(chain).or_default();
        } else if let Some(chain) = item.get("rule").and_then(|r| name(r, "chain")) {
            *view.rules.entry(chain).or_default() += 1;
        } else if let Some(set) = item.get("set").and_then(|s| name(s, "name")) {
            view.sets.insert(set);
        }
    }
    Ok(view)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_table_nft_prints() {
        // `nft -t -j list table inet aliaslb` of nftables 1.0.6, a table whose `guard4`
        // was flushed (no rule).
        let out = r#"{"nftables": [{"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}}, {"table": {"family": "inet", "name": "aliaslb", "handle": 1}}, {"counter": {"family": "inet", "name": "dropped4", "table": "aliaslb", "handle": 3, "packets": 7, "bytes": 420}}, {"counter": {"family": "inet", "name": "dropped6", "table": "aliaslb", "handle": 6, "packets": 2, "bytes": 160}}, {"set": {"family": "inet", "name": "held4", "table": "aliaslb", "type": "ipv4_addr", "handle": 4}}, {"chain": {"family": "inet", "table": "aliaslb", "name": "guard4", "handle": 1}}, {"chain": {"family": "inet", "table": "aliaslb", "name": "prerouting", "handle": 2, "type": "filter", "hook": "prerouting", "prio": -150, "policy": "accept"}}, {"rule": {"family": "inet", "table": "aliaslb", "chain": "prerouting", "handle": 7, "expr": [{"jump": {"target": "guard4"}}]}}]}"#;
        let view = parse_view(out).unwrap();
        assert_eq!(view.dropped, Dropped { v4: 7, v6: 2 });
        assert_eq!(
            view.rules,
            [("guard4".to_owned(), 0), ("prerouting".to_owned(), 1)].into()
        );
        assert_eq!(view.sets, ["held4".to_owned()].into());
        assert!(matches!(parse_view("{}"), Err(ShieldError::Output { .. })));
        // `nft -j list chains inet` with another inet table's chain.
        let chains = r#"{"nftables": [{"metainfo": {"version": "1.0.6"}}, {"chain": {"family": "inet", "table": "aliaslb", "name": "guard4", "handle": 1}}, {"chain": {"family": "inet", "table": "firewalld", "name": "filter_INPUT", "handle": 2}}]}"#;
        assert_eq!(
            parse_chains(chains).unwrap(),
            Some(["guard4".to_owned()].into())
        );
        assert_eq!(parse_chains(r#"{"nftables": []}"#).unwrap(), None);
    }

    #[tokio::test]
    async fn a_missing_binary_names_the_package() {
        let e = NftBackend::new("/nonexistent/nft")
            .apply("")
            .await
            .unwrap_err();
        assert_eq!(e.category(), "nft_missing");
        assert!(e.to_string().contains("install nftables"), "{e}");
        assert!(e.to_string().contains("--host-port-shield=off"), "{e}");
    }
}
