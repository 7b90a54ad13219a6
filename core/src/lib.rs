//! aliaslb-core: the pure model both binaries share.
//!
//! No Kubernetes client, no tokio, no netlink: everything here is plain data and
//! functions, tested with plain `#[test]`s and property tests.

pub mod advert;
pub mod annotations;
pub mod assignment;
pub mod election;
mod hash;
pub mod keys;
pub mod ledger;
pub mod mac;
pub mod plan;
pub mod pool;
pub mod range;
pub mod report;
pub mod text;
pub mod version;
