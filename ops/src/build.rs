//! What this build is: its release version and the commit it was built from, as `--version`
//! on both daemons, `aliaslb version` and the metric `aliaslb_build_info{version,commit}`
//! (appended by [`crate::metrics::encode`]) print them. Pure, no I/O.
//!
//! The version is the workspace's (`Cargo.toml`). The commit comes from the environment of
//! the build, `ALIASLB_COMMIT` (`scripts/release` and the Dockerfile set it; cargo rebuilds
//! this crate when it changes), and is `unknown` in a plain `cargo build`: asking git from a
//! build script would make every commit rebuild everything that depends on this crate.

use std::sync::LazyLock;

/// This build's release, e.g. `0.2.0`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The commit this build was made from (`ALIASLB_COMMIT` at build time), else
/// [`UNKNOWN_COMMIT`].
pub const COMMIT: &str = match option_env!("ALIASLB_COMMIT") {
    Some(commit) if !commit.is_empty() => commit,
    _ => UNKNOWN_COMMIT,
};

/// [`COMMIT`] of a build made without `ALIASLB_COMMIT` (a developer's `cargo build`).
pub const UNKNOWN_COMMIT: &str = "unknown";

/// `VERSION (commit COMMIT)`: what `--version` prints after the program's name.
pub fn version_line() -> &'static str {
    static LINE: LazyLock<String> = LazyLock::new(|| line(VERSION, COMMIT));
    &LINE
}

fn line(version: &str, commit: &str) -> String {
    format!("{version} (commit {commit})")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_line_names_version_and_commit() {
        assert_eq!(line("0.2.0", "1a2b3c"), "0.2.0 (commit 1a2b3c)");
        assert!(version_line().starts_with(env!("CARGO_PKG_VERSION")));
        assert!(version_line().ends_with(&format!("(commit {COMMIT})")));
        assert!(!COMMIT.is_empty());
    }
}
