//! Harness of the end-to-end tests (tests only, see `tests/`): a guard around the netns lab
//! of `scripts/lab` with the real `aliaslb-controller` and `aliaslb-agent` processes in it,
//! a client that probes load-balancer IPs from the LAN, a sampler of the aliases on
//! every node, and a LAN-side sampler of who answers ARP for each IP ([`lan`]). Everything
//! here does I/O (processes, network namespaces, `kubectl`), except the verdicts. [`bgp`]
//! adds the BGP part of the lab (an upstream router doing ECMP over the nodes) for L3 mode;
//! [`prometheus`] a real Prometheus server scraping the lab, with its rules loaded;
//! [`kubelets`] the lab with real kubelets running aliaslb's image.

pub mod bgp;
pub mod chaos;
pub mod client;
mod error;
pub mod fixtures;
pub mod kubelets;
pub mod lab;
pub mod lan;
pub mod prometheus;
pub mod sampler;
pub mod trials;

pub use error::Error;
pub use sampler::{aliases, aliases6};
