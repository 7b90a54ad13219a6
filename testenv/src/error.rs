//! The one error type of the test environment. No I/O.

use std::path::PathBuf;

/// Why the test environment could not be started or used.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A required binary is neither in `KUBEBUILDER_ASSETS` nor in the build cache.
    #[error(
        "{binary} not found (looked in: {searched}). Build and cache the Kubernetes test binaries with \
         `scripts/kube-env` from the repository root (scripts/test does it too), or point \
         KUBEBUILDER_ASSETS at a folder holding kube-apiserver and etcd"
    )]
    MissingBinary {
        /// File name of the binary, e.g. `kube-apiserver`.
        binary: String,
        /// The folders that were searched, comma separated.
        searched: String,
    },

    /// A file or folder of the environment could not be created, written or read.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done, e.g. "create temp dir".
        action: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },

    /// A helper command (openssl, sh) could not be run or failed.
    #[error("command `{command}` failed: {detail}")]
    Command {
        /// The command line, for the message.
        command: String,
        /// Exit status and stderr, or the spawn error.
        detail: String,
    },

    /// A server exited or did not become ready in time.
    #[error(
        "{server} failed to start: {reason}\n--- last lines of {} (the folder is removed unless \
         ALIASLB_TESTENV_KEEP=1) ---\n{tail}",
        log.display()
    )]
    StartUp {
        /// `etcd`, `kube-apiserver`, ...
        server: &'static str,
        /// What went wrong.
        reason: String,
        /// The server's log file.
        log: PathBuf,
        /// The last lines of that log.
        tail: String,
    },

    /// The kubeconfig written by the environment could not be loaded.
    #[error("loading kubeconfig {}: {source}", path.display())]
    Kubeconfig {
        /// The kubeconfig file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: kube::config::KubeconfigError,
    },

    /// A Kubernetes API call made by the environment itself failed.
    #[error("{action}: {source}")]
    Api {
        /// What was being done, e.g. "create namespace demo-1".
        action: String,
        /// The underlying error.
        #[source]
        source: kube::Error,
    },
}
