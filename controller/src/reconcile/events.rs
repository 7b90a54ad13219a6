//! Events: the queue the pass fills and the worker that publishes it, behind the leader
//! fence. The pass never waits for a plan Event; the few Events about the pool config are
//! published at once ([`EventQueue::publish`]).
//!
//! Events yield to the writes: while the writer has Services left for its next pass (a
//! burst of more than `crate::write::pass::PASS_WRITES` writes, as on a first convergence), the worker
//! publishes one Event every [`BUSY_EVENT_GAP`] instead of [`MAX_IN_FLIGHT`] at once, so
//! the statuses (the truth a user and kube-proxy act on) are not slowed by their narrative
//! sharing the API server. (One Event in flight was not enough: at 10,000 Services that
//! still made 0.67 Event POSTs per Service during the convergence, 1.29x its floor.) The
//! Events are delayed, not dropped (up to the queue's bound), and never starve.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use aliaslb_core::plan::{PlanEvent, ServiceKey};
use aliaslb_core::text;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::MAX_IN_FLIGHT;
use crate::context::Context;
use crate::fence::WRITE_TIMEOUT;
use crate::observe::service;

/// Longest Event note the API accepts (events.k8s.io/v1 `note`: 1 kB).
pub(super) const MAX_NOTE: usize = 1000;
/// Plan Events waiting for the worker at most; more are dropped (and counted). The first
/// pass over N new Services queues 2N Events (IP allocated, node assigned): this holds
/// that for 32,768 Services. A queued Event is about 200 bytes.
const EVENT_QUEUE: usize = 65_536;
/// While the writer has a burst of Service writes left, one Event is published per gap
/// (10/s): a trickle, so that Events never starve under endless churn.
const BUSY_EVENT_GAP: Duration = Duration::from_millis(100);

/// What an Event is about.
pub(super) enum Regarding {
    /// A Service (its uid when known); the reference is built when the Event is sent, not
    /// while it waits.
    Service {
        key: ServiceKey,
        uid: Option<Arc<str>>,
    },
    /// Another object (an agent's Lease).
    Object(Box<ObjectReference>),
}

/// One Event to publish.
pub(super) struct Notice {
    pub(super) regarding: Regarding,
    pub(super) warning: bool,
    pub(super) reason: &'static str,
    /// Boxed: no room to grow while it waits (the queue holds up to [`EVENT_QUEUE`]).
    pub(super) note: Box<str>,
}

impl Notice {
    fn regarding(&self) -> ObjectReference {
        match &self.regarding {
            Regarding::Service { key, uid } => service::object_ref(key, uid.as_deref()),
            Regarding::Object(reference) => (**reference).clone(),
        }
    }
}

/// Publishes Events behind the leader fence.
///
/// Each Event goes through a fresh [`Recorder`]: kube-runtime 5.0's Recorder folds Events
/// that differ only in their note into one series that keeps the FIRST note (its cache key
/// has no note), so a second `NodeMoved` would show the first move's reason for six
/// minutes. The planner already emits transitions only, so no client-side aggregation is
/// needed.
#[derive(Clone)]
pub(super) struct Events {
    ctx: Arc<Context>,
}

impl Events {
    /// Publishes one Event (behind the fence), `related` to a second object if given;
    /// failures are logged and counted.
    pub(super) async fn publish(
        &self,
        regarding: &ObjectReference,
        related: Option<ObjectReference>,
        warning: bool,
        reason: &str,
        note: String,
    ) {
        if !self.ctx.leader.is_leader() {
            return;
        }
        let event = Event {
            type_: if warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.to_owned(),
            note: Some(text::bounded(note, MAX_NOTE)),
            action: "Reconcile".to_owned(),
            secondary: related,
        };
        let recorder = Recorder::new(self.ctx.client.clone(), self.ctx.reporter.clone());
        let publish = recorder.publish(&event, regarding);
        match tokio::time::timeout(WRITE_TIMEOUT, publish).await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                self.ctx.metrics.inc_reconcile_error("event");
                tracing::warn!(reason, object = ?regarding.name, error = %error, "publishing an Event failed");
            }
            Err(_) => {
                self.ctx.metrics.inc_reconcile_error("event");
                tracing::warn!(reason, object = ?regarding.name, "publishing an Event timed out");
            }
        }
    }

    /// Publishes queued Events, [`MAX_IN_FLIGHT`] at once, so that a burst of Events
    /// never holds up the next pass; one per [`BUSY_EVENT_GAP`] while `busy` (the writer
    /// has a burst of Service writes left).
    async fn worker(self, mut queue: mpsc::Receiver<Notice>, mut busy: watch::Receiver<bool>) {
        let mut in_flight = FuturesUnordered::new();
        // Whether `busy` can still change (its sender lives as long as the queue's).
        let mut watching = true;
        loop {
            let yielding = *busy.borrow();
            let limit = if yielding { 1 } else { MAX_IN_FLIGHT };
            tokio::select! {
                Some(()) = in_flight.next(), if !in_flight.is_empty() => {}
                notice = queue.recv(), if in_flight.len() < limit => match notice {
                    Some(n) => in_flight.push(self.clone().publish_notice(n, yielding)),
                    None => break,
                },
                changed = busy.changed(), if watching => watching = changed.is_ok(),
            }
        }
        while in_flight.next().await.is_some() {}
    }

    /// Publishes a queued Event; `yielding`, it holds its place for [`BUSY_EVENT_GAP`].
    async fn publish_notice(self, n: Notice, yielding: bool) {
        let gap = yielding.then(|| tokio::time::sleep(BUSY_EVENT_GAP));
        let regarding = n.regarding();
        self.publish(&regarding, None, n.warning, n.reason, n.note.into())
            .await;
        if let Some(gap) = gap {
            gap.await;
        }
    }
}

/// Aborts a task when dropped (the Event worker ends with its term's reconciler, the
/// reconciler with `supervise`).
pub(super) struct AbortOnDrop(pub(super) JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The Event side of one leadership term: the queue of plan Events and its worker.
pub(super) struct EventQueue {
    ctx: Arc<Context>,
    events: Events,
    /// Plan Events for the worker.
    queue: mpsc::Sender<Notice>,
    /// Whether the writer has a burst of Service writes left (the worker yields to it).
    busy: watch::Sender<bool>,
    _worker: AbortOnDrop,
}

impl EventQueue {
    /// A queue whose worker runs until the queue is dropped.
    pub(super) fn new(ctx: Arc<Context>) -> Self {
        let events = Events { ctx: ctx.clone() };
        let (queue, rx) = mpsc::channel(EVENT_QUEUE);
        let (busy, busy_rx) = watch::channel(false);
        let worker = AbortOnDrop(tokio::spawn(events.clone().worker(rx, busy_rx)));
        EventQueue {
            ctx,
            events,
            queue,
            busy,
            _worker: worker,
        }
    }

    /// The publisher, for the few Events published at once, not through the queue (those
    /// about the pool config: a pass waits for them).
    pub(super) fn now(&self) -> &Events {
        &self.events
    }

    /// Says whether the writer has a burst of Service writes left: while it has, the
    /// worker publishes one Event per [`BUSY_EVENT_GAP`].
    pub(super) fn writes_pending(&self, pending: bool) {
        self.busy
            .send_if_modified(|busy| std::mem::replace(busy, pending) != pending);
    }

    /// Queues an Event for the worker; a full queue drops it (counted).
    pub(super) fn enqueue(&self, notice: Notice) {
        if let Err(error) = self.queue.try_send(notice) {
            let notice = error.into_inner();
            self.ctx.metrics.inc_reconcile_error("event_dropped");
            tracing::warn!(
                object = ?notice.regarding().name,
                reason = %notice.reason,
                "Event queue full: Event dropped"
            );
        }
    }

    /// Queues the pass's Events, on their Services (by their uid in `refs`, this pass's;
    /// deleted ones by their last one, in `old_refs`).
    pub(super) fn plan_events(
        &self,
        events: Vec<PlanEvent>,
        refs: &HashMap<ServiceKey, Arc<str>>,
        old_refs: &HashMap<ServiceKey, Arc<str>>,
    ) {
        for e in events {
            let uid = refs
                .get(&e.service)
                .or_else(|| old_refs.get(&e.service))
                .cloned();
            let notice = Notice {
                regarding: Regarding::Service {
                    key: e.service,
                    uid,
                },
                warning: e.warning,
                reason: e.reason,
                note: e.message.into_boxed_str(),
            };
            self.enqueue(notice);
        }
    }
}
