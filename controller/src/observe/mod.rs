//! The controller's one reading of Kubernetes objects: each object is turned, once, into
//! what the reconcile loop keeps of it and into the planner's plain views. Pure: no I/O;
//! the watches ([`crate::watch`]) call it as objects arrive, the reconcile loop and
//! `aliaslb status` read what it made.
//!
//! - [`service`]: a Service's key, our annotations, its ingress and our conditions; whether
//!   it is ours; its [`ServiceRecord`](service::ServiceRecord) and planner view.
//! - [`agents`]: agent Leases -> freshness (the [`AgentClock`](agents::AgentClock) and the
//!   blindness rule of the [`Observer`](agents::Observer)) and reports.
//! - [`nodes`]: Nodes -> the planner's node states and the addresses Nodes list.
//! - [`endpoints`]: EndpointSlices / Endpoints -> the nodes with a ready endpoint.
//! - [`namespaces`]: Namespaces -> their labels (pools that select namespaces).

pub mod agents;
pub mod endpoints;
pub mod namespaces;
pub mod nodes;
pub mod service;
