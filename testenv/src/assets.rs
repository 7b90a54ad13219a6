//! Finds the server binaries: `KUBEBUILDER_ASSETS` first (the envtest convention), then the cache
//! `scripts/kube-env` fills. Reads the environment and checks files exist; starts nothing.

use std::path::{Path, PathBuf};

use crate::Error;

/// The Kubernetes version `scripts/kube-env` builds and caches by default: the release that
/// `testenv/kube-build/kubernetes-1.NN/go.mod` pins (a unit test keeps the two equal).
pub const KUBE_VERSION: &str = "v1.37.2";

/// The folders searched for binaries, in order: `$KUBEBUILDER_ASSETS`, then
/// `$ALIASLB_CACHE/kube-<KUBE_VERSION>/bin` (default `$HOME/.cache/aliaslb/kube-v1.37.2/bin`).
pub fn search_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(assets) = std::env::var_os("KUBEBUILDER_ASSETS").filter(|v| !v.is_empty()) {
        dirs.push(PathBuf::from(assets));
    }
    let cache_root = std::env::var_os("ALIASLB_CACHE")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| Path::new(&home).join(".cache/aliaslb")));
    if let Some(root) = cache_root {
        dirs.push(root.join(format!("kube-{KUBE_VERSION}")).join("bin"));
    }
    dirs
}

/// The path of binary `name` (e.g. `kube-apiserver`, `etcd`, `kube-controller-manager`,
/// `kube-proxy`) in the first search dir holding it.
///
/// # Errors
/// [`Error::MissingBinary`] naming the command that builds it.
pub fn binary(name: &str) -> Result<PathBuf, Error> {
    let dirs = search_dirs();
    dirs.iter()
        .map(|dir| dir.join(name))
        .find(|path| path.is_file())
        .ok_or_else(|| Error::MissingBinary {
            binary: name.to_owned(),
            searched: if dirs.is_empty() {
                "no folder: neither KUBEBUILDER_ASSETS nor HOME is set".to_owned()
            } else {
                dirs.iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            },
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kube_version_is_the_release_scripts_kube_env_builds() {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/kube-env");
        let out = std::process::Command::new("bash")
            .arg(&script)
            .arg("--version")
            .output()
            .expect("run scripts/kube-env --version");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), KUBE_VERSION);
    }
}
