//! The only module that runs `nft`: the real [`ShieldBackend`].
//!
//! Scripts go to `nft -f -` on standard input: one script is one kernel transaction, so a
//! table replace or a batch of element updates lands whole or not at all. Counters are read
//! with `nft -j`. Every call is bounded by [`TIMEOUT`] and the child is killed past it.
//!
//! Why the binary and not a crate: the Rust crates that speak nf_tables netlink are GPL or
//! bindings to libnftnl, and the JSON-schema crate would turn the ruleset of `shield.rs` into
//! hundreds of lines of struct literals. Every value we write is typed (IP, protocol, port),
//! so the nft syntax leaves nothing to quote. The image ships Debian's `nftables`.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use serde_json::Value;
use tokio::io::AsyncWriteExt as _;
use tokio::process::Command;

use crate::shield::{Dropped, ShieldBackend, ShieldError};

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

    async fn dropped(&self) -> Result<Dropped, ShieldError> {
        let out = self
            .run(
                "list counters",
                &["-j", "list", "counters", "table", "inet", "aliaslb"],
                None,
            )
            .await?;
        parse_dropped(&out)
    }
}

/// Reads `dropped4` and `dropped6` from `nft -j list counters` output.
fn parse_dropped(json: &str) -> Result<Dropped, ShieldError> {
    let bad = |detail: String| ShieldError::Output {
        what: "list counters",
        detail,
    };
    let v: Value = serde_json::from_str(json).map_err(|e| bad(e.to_string()))?;
    let items = v
        .get("nftables")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("no `nftables` array".into()))?;
    let mut dropped = Dropped::default();
    for counter in items.iter().filter_map(|i| i.get("counter")) {
        let packets = counter.get("packets").and_then(Value::as_u64).unwrap_or(0);
        match counter.get("name").and_then(Value::as_str) {
            Some("dropped4") => dropped.v4 = packets,
            Some("dropped6") => dropped.v6 = packets,
            _ => {}
        }
    }
    Ok(dropped)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_counters_nft_prints() {
        // `nft -j list counters table inet aliaslb` of nftables 1.0.6.
        let out = r#"{"nftables": [{"metainfo": {"version": "1.0.6", "release_name": "Lester Gooch #5", "json_schema_version": 1}}, {"counter": {"family": "inet", "name": "dropped4", "table": "aliaslb", "handle": 5, "packets": 7, "bytes": 420}}, {"counter": {"family": "inet", "name": "dropped6", "table": "aliaslb", "handle": 6, "packets": 2, "bytes": 160}}]}"#;
        assert_eq!(parse_dropped(out).unwrap(), Dropped { v4: 7, v6: 2 });
        assert!(matches!(
            parse_dropped("{}"),
            Err(ShieldError::Output { .. })
        ));
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
