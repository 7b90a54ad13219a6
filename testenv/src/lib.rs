//! Test support: a real etcd + kube-apiserver (v1.37.2 by default, [`KUBE_VERSION`]) on loopback for integration
//! tests, never a mock. Owns starting, supervising and tearing down those servers, the generated
//! certificates and kubeconfig, and building clients for them. Does I/O (processes, files, HTTP).
//!
//! ```no_run
//! # async fn demo() {
//! let env = aliaslb_testenv::TestEnv::global(); // one per test binary, started on first use
//! let client = env.client().await; // a new client per test (clients are runtime-bound)
//! let ns = env.create_namespace(&client, "my-test").await;
//! # }
//! ```
//!
//! Binaries come from `KUBEBUILDER_ASSETS` or the cache `scripts/kube-env` fills. Run the tests
//! with `cargo test` (one process per test binary shares one environment), not nextest.
//!
//! Without [`TestEnv::start_controller_manager`] namespaces never finish deleting, ServiceAccounts
//! are not created and no EndpointSlice is mirrored from Endpoints. `KUBEBUILDER_ASSETS` may name
//! another release's binaries (the oldest supported one: `scripts/kube-env --oldest`); tests of
//! what a release lacks ask the server for its version.

mod assets;
mod certs;
mod env;
mod error;
pub mod fixtures;
mod process;

pub use assets::{KUBE_VERSION, binary, search_dirs};
pub use certs::Certs;
pub use env::{ADMIN_USER, ControllerManager, SERVICE_CLUSTER_IP_RANGE, TestEnv, TokenBinding};
pub use error::Error;
