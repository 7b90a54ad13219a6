//! How the CLI reaches the cluster, the way kubectl does: `--kubeconfig` (else
//! `KUBECONFIG`, a list of files, else `~/.kube/config`, else the in-cluster service
//! account), `--context` (else the kubeconfig's current context), and that context's
//! namespace as the default for `-n`. The only I/O: reading the kubeconfig files.

use std::path::PathBuf;

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

/// Where to connect: kubectl's `--kubeconfig` and `--context`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Connection {
    /// A kubeconfig file, instead of `KUBECONFIG` and `~/.kube/config`.
    pub kubeconfig: Option<PathBuf>,
    /// A context of the kubeconfig, instead of its current context.
    pub context: Option<String>,
}

/// Why no client could be built.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The file of `--kubeconfig` cannot be read or parsed.
    #[error("reading the kubeconfig {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// The kubeconfig does not give a usable cluster (unknown context, no current
    /// context, missing credentials...).
    #[error("{what}")]
    Config {
        /// What was asked for.
        what: String,
        /// Cause.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// Neither a kubeconfig nor the in-cluster service account.
    #[error("no kubeconfig (KUBECONFIG, ~/.kube/config) and not in a cluster")]
    Infer(#[source] kube::config::InferConfigError),
    /// The client could not be built from the config (TLS, proxy).
    #[error("building the client")]
    Client(#[source] kube::Error),
}

impl Connection {
    /// A client for this connection, and the namespace of its context (`default` when the
    /// context names none).
    pub async fn client(&self) -> Result<(Client, String), ConnectError> {
        let options = KubeConfigOptions {
            context: self.context.clone(),
            cluster: None,
            user: None,
        };
        let which = || match &self.context {
            Some(context) => format!("context {context:?} of the kubeconfig"),
            None => "the kubeconfig's current context".to_owned(),
        };
        let config = match (&self.kubeconfig, &self.context) {
            (Some(path), _) => {
                let file = Kubeconfig::read_from(path).map_err(|source| ConnectError::Read {
                    path: path.clone(),
                    source,
                })?;
                Config::from_custom_kubeconfig(file, &options)
                    .await
                    .map_err(|source| ConnectError::Config {
                        what: format!("{} {}", which(), path.display()),
                        source,
                    })?
            }
            (None, Some(_)) => {
                Config::from_kubeconfig(&options)
                    .await
                    .map_err(|source| ConnectError::Config {
                        what: which(),
                        source,
                    })?
            }
            (None, None) => Config::infer().await.map_err(ConnectError::Infer)?,
        };
        let namespace = config.default_namespace.clone();
        let client = Client::try_from(config).map_err(ConnectError::Client)?;
        Ok((client, namespace))
    }
}
