//! The controller's writes, beside its reads ([`crate::observe`]): what each pass writes,
//! when, and the writes themselves, each behind the leader fence ([`crate::fence`]) and a
//! timeout. The reconcile loop ([`crate::reconcile`]) decides; it writes only through here.
//!
//! - [`pass`]: the executor of a pass: turns its plans into jobs where desired differs from
//!   observed, runs them (bounded in flight), settles the outcomes into its memo, backoff
//!   and refusals, and writes the node assignments. Does I/O.
//! - [`services`]: what a Service's status and annotations should say, and
//!   [`services::ServiceWriter`], which writes them.
//! - [`assignments`]: the node assignment objects the agents act on: rendered from the
//!   plans, read back as an agent reads them (the import of a new leader, the writes'
//!   own check), and applied.
//! - [`pool_status`]: the pool state ConfigMap `kubectl get` shows.

pub mod assignments;
pub mod pass;
pub mod pool_status;
pub mod services;
