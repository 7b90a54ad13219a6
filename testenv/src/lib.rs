//! Test support: a real etcd + kube-apiserver (v1.20.2 by default) on loopback for integration
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
//! Known limits of kube-apiserver 1.20: no `spec.loadBalancerClass`, no `ipMode` (a merge patch
//! drops it, server-side apply rejects the patch), EndpointSlice only as
//! `discovery.k8s.io/v1beta1`; without [`TestEnv::start_controller_manager`] namespaces never
//! finish deleting and ServiceAccounts get no tokens.

mod assets;
mod certs;
mod env;
mod error;
pub mod fixtures;
mod process;

pub use assets::{KUBE_VERSION, binary, search_dirs};
pub use certs::Certs;
pub use env::{ADMIN_USER, ControllerManager, SERVICE_CLUSTER_IP_RANGE, TestEnv};
pub use error::Error;
