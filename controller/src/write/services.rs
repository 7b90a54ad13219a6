//! Writes to Services: what differs between a [`ServicePlan`] and the observed object
//! (pure: [`annotations_differ`], [`status_differs`], [`status_body`]) and the server-side
//! apply calls that fix it ([`ServiceWriter`], does I/O).
//!
//! Both writes use server-side apply with field manager `aliaslb-controller` and force, so
//! a field we stop specifying (an annotation set to `None`, a Service that stopped being
//! ours) is removed by the API server itself, and fields of other managers are untouched.
//!
//! `ipMode`: servers older than 1.29 do not know the field; server-side apply then fails
//! with HTTP 500 `field not declared in schema`, and a merge patch silently drops it. The
//! [`ServiceWriter`] starts from the server version, falls back on that error, and also turns
//! the field off when the server returns an object without it (feature gate off). With the
//! field off, it is left out of both the body and the comparison: no patch loop.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use aliaslb_core::keys;
use aliaslb_core::plan::{ConditionPlan, ServicePlan};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};

use crate::fence::{ApplyError, guarded};
use crate::observe::service::{ObservedCondition, OurCondition, ServiceRecord};

/// Whether the `aliaslb.io/node` / `aliaslb.io/interface` annotations differ from `plan`.
pub fn annotations_differ(
    svc: &ServiceRecord,
    node: Option<&str>,
    interface: Option<&str>,
) -> bool {
    svc.node.as_deref() != node || svc.interface.as_deref() != interface
}

fn status_word(status: bool) -> &'static str {
    if status { "True" } else { "False" }
}

/// Whether the observed condition already says what `plan` says.
fn condition_matches(
    observed: Option<&ObservedCondition>,
    plan: &ConditionPlan,
    generation: Option<i64>,
) -> bool {
    observed.is_some_and(|c| {
        c.status == Some(plan.status)
            && c.says(plan.reason, &plan.message)
            && c.observed_generation == generation
    })
}

/// Whether the status subresource differs from `plan`: ingress IPs (and `ipMode` when the
/// server keeps it) or one of our two conditions.
pub fn status_differs(svc: &ServiceRecord, plan: &ServicePlan, ip_mode: bool) -> bool {
    let ips_match = svc.ingress.len() == plan.ips.len()
        && svc
            .ingress
            .iter()
            .zip(&plan.ips)
            .all(|(i, want)| i.ip == Some(*want) && !i.hostname && (!ip_mode || i.vip));
    let generation = svc.generation;
    !ips_match
        || !condition_matches(
            svc.condition(OurCondition::IpAllocated),
            &plan.allocated,
            generation,
        )
        || !condition_matches(
            svc.condition(OurCondition::Announced),
            &plan.announced,
            generation,
        )
}

/// One condition as applied; `lastTransitionTime` only moves when the status changes.
fn condition_body(
    svc: &ServiceRecord,
    which: OurCondition,
    plan: &ConditionPlan,
    now: Timestamp,
) -> Value {
    let status = status_word(plan.status);
    let since = match svc.condition(which) {
        Some(c) if c.status == Some(plan.status) => c.since,
        _ => now,
    };
    let mut body = json!({
        "type": which.type_(),
        "status": status,
        "reason": plan.reason,
        "message": plan.message,
        // The API wants RFC 3339 in whole seconds; `Time` serialises exactly that.
        "lastTransitionTime": Time(since),
    });
    if let Some(generation) = svc.generation {
        body["observedGeneration"] = json!(generation);
    }
    body
}

/// The server-side apply body of the status subresource for `plan`.
///
/// It repeats the annotations: before 1.22 the API server tracks one field set per manager
/// across the object and its status, so a status apply without them would remove the
/// annotations our other apply set (newer servers ignore metadata on the status endpoint).
pub fn status_body(
    svc: &ServiceRecord,
    plan: &ServicePlan,
    ip_mode: bool,
    now: Timestamp,
) -> Value {
    let ingress: Vec<Value> = plan
        .ips
        .iter()
        .map(|ip| {
            if ip_mode {
                json!({"ip": ip.to_string(), "ipMode": keys::IP_MODE_VIP})
            } else {
                json!({"ip": ip.to_string()})
            }
        })
        .collect();
    let node = plan.node_annotation();
    let mut body = annotations_body(svc, node.as_deref(), plan.interface.as_deref());
    body["status"] = json!({
            "loadBalancer": {"ingress": ingress},
            "conditions": [
            condition_body(svc, OurCondition::IpAllocated, &plan.allocated, now),
            condition_body(svc, OurCondition::Announced, &plan.announced, now),
        ],
    });
    body
}

/// The server-side apply body of the Service's annotations.
pub fn annotations_body(svc: &ServiceRecord, node: Option<&str>, interface: Option<&str>) -> Value {
    let mut annotations = serde_json::Map::new();
    if let Some(node) = node {
        annotations.insert(keys::ANNOTATION_NODE.to_owned(), json!(node));
    }
    if let Some(interface) = interface {
        annotations.insert(keys::ANNOTATION_INTERFACE.to_owned(), json!(interface));
    }
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": &*svc.key.name,
            "namespace": &*svc.key.namespace,
            "annotations": annotations,
        },
    })
}

/// An apply body that claims nothing: applying it removes every field we own.
fn empty_body(svc: &ServiceRecord) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": &*svc.key.name, "namespace": &*svc.key.namespace},
    })
}

/// Whether the server supports `ipMode`, from `major`/`minor` of `/version` (1.29+).
pub fn version_has_ip_mode(major: &str, minor: &str) -> bool {
    let digits = |s: &str| -> Option<u32> {
        s.chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
            .parse()
            .ok()
    };
    match (digits(major), digits(minor)) {
        (Some(major), Some(minor)) => major > 1 || (major == 1 && minor >= 29),
        _ => false,
    }
}

/// Whether `error` is the API server not knowing a field we sent (pre-1.29 `ipMode`).
fn is_unknown_field(error: &kube::Error) -> bool {
    matches!(error, kube::Error::Api(s) if s.message.contains("field not declared in schema"))
}

/// Performs the writes; shared by the concurrent write tasks of one pass.
#[derive(Debug)]
pub struct ServiceWriter {
    ip_mode: AtomicBool,
}

impl ServiceWriter {
    /// A writer; `ip_mode` from [`version_has_ip_mode`].
    pub fn new(ip_mode: bool) -> Self {
        ServiceWriter {
            ip_mode: AtomicBool::new(ip_mode),
        }
    }

    /// Whether `ipMode` is written and compared.
    pub fn ip_mode(&self) -> bool {
        self.ip_mode.load(Ordering::Relaxed)
    }

    fn disable_ip_mode(&self, why: &str) {
        if self.ip_mode.swap(false, Ordering::Relaxed) {
            tracing::warn!(
                why,
                "the API server does not keep ipMode: writing ingress without it"
            );
        }
    }

    /// Applies the annotations of `plan` on `svc`; returns the updated Service.
    pub async fn apply_annotations(
        &self,
        api: &Api<Service>,
        svc: &ServiceRecord,
        node: Option<&str>,
        interface: Option<&str>,
        fence: impl Fn() -> Option<Instant>,
    ) -> Result<ServiceRecord, ApplyError> {
        let body = annotations_body(svc, node, interface);
        let updated = call(api, svc, "annotations", false, &body, &fence).await?;
        if !annotations_differ(&updated, node, interface) {
            return Ok(updated);
        }
        // Still different: someone else's field manager owns the annotation (a hand edit,
        // `kubectl annotate`), and an apply that leaves a field out does not remove another
        // manager's field. A merge patch sets (or removes) it whoever owns it: the
        // annotations are a read-only view of the controller's decision.
        tracing::info!(svc = %svc.key, "taking back a hand-edited aliaslb annotation");
        let body = json!({"metadata": {"annotations": {
            keys::ANNOTATION_NODE: node,
            keys::ANNOTATION_INTERFACE: interface,
        }}});
        merge(api, svc, "annotation take-back", &body, &fence).await
    }

    /// Applies the status of `plan` on `svc`; returns the updated Service.
    pub async fn apply_status(
        &self,
        api: &Api<Service>,
        svc: &ServiceRecord,
        plan: &ServicePlan,
        fence: impl Fn() -> Option<Instant>,
    ) -> Result<ServiceRecord, ApplyError> {
        let ip_mode = self.ip_mode();
        let body = status_body(svc, plan, ip_mode, Timestamp::now());
        match call(api, svc, "status", true, &body, &fence).await {
            Err(ApplyError::Api { source, .. }) if ip_mode && is_unknown_field(&source) => {
                self.disable_ip_mode("server-side apply refused the field");
                let body = status_body(svc, plan, false, Timestamp::now());
                call(api, svc, "status", true, &body, &fence).await
            }
            Ok(updated) => {
                if ip_mode
                    && !plan.ips.is_empty()
                    && updated.ingress_ips().eq(plan.ips.iter().copied())
                {
                    let kept = updated.ingress.iter().all(|i| i.ip_mode);
                    if !kept {
                        self.disable_ip_mode("the server dropped the field");
                    }
                }
                Ok(updated)
            }
            other => other,
        }
    }

    /// Removes everything we wrote on a Service that is no longer ours.
    pub async fn clear(
        &self,
        api: &Api<Service>,
        svc: &ServiceRecord,
        fence: impl Fn() -> Option<Instant>,
    ) -> Result<ServiceRecord, ApplyError> {
        let body = empty_body(svc);
        call(api, svc, "status cleanup", true, &body, &fence).await?;
        call(api, svc, "annotation cleanup", false, &body, &fence).await
    }
}

/// One JSON merge patch of `svc` under the fence and [`WRITE_TIMEOUT`](crate::fence::WRITE_TIMEOUT).
async fn merge(
    api: &Api<Service>,
    svc: &ServiceRecord,
    what: &'static str,
    body: &Value,
    fence: &impl Fn() -> Option<Instant>,
) -> Result<ServiceRecord, ApplyError> {
    let params = PatchParams {
        field_manager: Some(keys::CONTROLLER_FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    };
    let object = format!("Service {}", svc.key);
    let updated = guarded(what, object, fence, async {
        api.patch(&svc.key.name, &params, &Patch::Merge(body)).await
    })
    .await?;
    Ok(ServiceRecord::of(&updated, false).unwrap_or_else(|| svc.clone()))
}

/// One server-side apply under the fence and [`WRITE_TIMEOUT`](crate::fence::WRITE_TIMEOUT); returns the record of
/// the object the server returned (without view: only its identity and our marks are
/// read).
async fn call(
    api: &Api<Service>,
    svc: &ServiceRecord,
    what: &'static str,
    status: bool,
    body: &Value,
    fence: &impl Fn() -> Option<Instant>,
) -> Result<ServiceRecord, ApplyError> {
    let name = &*svc.key.name;
    let params = PatchParams::apply(keys::CONTROLLER_FIELD_MANAGER).force();
    let patch = Patch::Apply(body);
    let object = format!("Service {}", svc.key);
    let updated = guarded(what, object, fence, async {
        if status {
            api.patch_status(name, &params, &patch).await
        } else {
            api.patch(name, &params, &patch).await
        }
    })
    .await?;
    // The server returns what it stored: a Service without uid is not one.
    Ok(ServiceRecord::of(&updated, false).unwrap_or_else(|| svc.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    use aliaslb_core::plan::reason;
    use aliaslb_testenv::fixtures::lb_service;
    use k8s_openapi::api::core::v1::ServiceStatus;

    fn plan(ips: &[&str], node: Option<&str>) -> ServicePlan {
        ServicePlan {
            ips: ips.iter().map(|s| s.parse().unwrap()).collect(),
            node: node.map(Into::into),
            nodes: Vec::new(),
            interface: None,
            virtual_mac: false,
            standby: None,
            allocated: ConditionPlan {
                status: !ips.is_empty(),
                reason: reason::ALLOCATED,
                message: "ok".into(),
            },
            announced: ConditionPlan {
                status: false,
                reason: reason::WAITING_FOR_AGENT,
                message: "waiting".into(),
            },
        }
    }

    /// The record of a Service whose status is what `plan` renders to, as a server would
    /// store it.
    fn written(plan: &ServicePlan, ip_mode: bool, server_keeps_ip_mode: bool) -> ServiceRecord {
        let svc = lb_service("a", "web")
            .meta(|m| {
                m.uid = Some("uid".into());
                m.generation = Some(3);
            })
            .build();
        let before = ServiceRecord::of(&svc, false).unwrap();
        let body = status_body(&before, plan, ip_mode, Timestamp::UNIX_EPOCH);
        let mut status: ServiceStatus = serde_json::from_value(body["status"].clone()).unwrap();
        if !server_keeps_ip_mode {
            for i in status
                .load_balancer
                .iter_mut()
                .flat_map(|lb| lb.ingress.iter_mut().flatten())
            {
                i.ip_mode = None;
            }
        }
        let svc = Service {
            status: Some(status),
            ..svc
        };
        ServiceRecord::of(&svc, false).unwrap()
    }

    #[test]
    fn written_status_compares_equal_so_no_loop() {
        let p = plan(&["10.0.0.1"], Some("n1"));
        // New server: ipMode kept and compared.
        assert!(!status_differs(&written(&p, true, true), &p, true));
        // Old server dropped ipMode: compared without it, equal.
        assert!(!status_differs(&written(&p, true, false), &p, false));
        // ... but with ipMode on it would differ forever (the loop we avoid).
        assert!(status_differs(&written(&p, true, false), &p, true));
    }

    #[test]
    fn status_differences_are_seen() {
        let p = plan(&["10.0.0.1"], None);
        let svc = written(&p, false, false);
        assert!(status_differs(&svc, &plan(&["10.0.0.2"], None), false));
        assert!(status_differs(&svc, &plan(&[], None), false));
        let mut other_message = p.clone();
        other_message.announced.message = "other".into();
        assert!(status_differs(&svc, &other_message, false));
        let mut newer = svc.clone();
        newer.generation = Some(4);
        assert!(
            status_differs(&newer, &p, false),
            "observedGeneration is compared"
        );
        let mut foreign = svc.clone();
        foreign.ingress[0].hostname = true;
        assert!(status_differs(&foreign, &p, false));
        let mut unparsed = svc.clone();
        unparsed.ingress[0].ip = None;
        assert!(status_differs(&unparsed, &p, false));
    }

    #[test]
    fn transition_time_moves_only_with_status() {
        let p = plan(&["10.0.0.1"], None);
        let mut svc = written(&p, false, false);
        let t1: Timestamp = "2030-01-01T00:00:00.123456789Z".parse().unwrap();
        for c in &mut svc.conditions {
            c.since = Timestamp::UNIX_EPOCH;
        }
        let mut changed_message = p.clone();
        changed_message.allocated.message = "new words".into();
        let body = status_body(&svc, &changed_message, false, t1);
        assert_eq!(
            body["status"]["conditions"][0]["lastTransitionTime"],
            "1970-01-01T00:00:00Z"
        );
        let released = plan(&[], None);
        let body = status_body(&svc, &released, false, t1);
        assert_eq!(body["status"]["conditions"][0]["status"], "False");
        assert_eq!(
            body["status"]["conditions"][0]["lastTransitionTime"],
            "2030-01-01T00:00:00Z"
        );
        assert_eq!(body["status"]["conditions"][0]["observedGeneration"], 3);
        assert_eq!(body["status"]["loadBalancer"]["ingress"], json!([]));
    }

    #[test]
    fn annotations_are_set_and_left_out() {
        let svc = written(&plan(&[], None), false, false);
        let body = annotations_body(&svc, Some("n1"), None);
        assert_eq!(
            body["metadata"]["annotations"],
            json!({"aliaslb.io/node": "n1"})
        );
        assert!(annotations_differ(&svc, Some("n1"), None));
        // The status apply repeats them: on pre-1.22 servers it would remove them otherwise.
        let status = status_body(
            &svc,
            &plan(&["10.0.0.1"], Some("n1")),
            false,
            Timestamp::UNIX_EPOCH,
        );
        assert_eq!(
            status["metadata"]["annotations"],
            json!({"aliaslb.io/node": "n1"})
        );
        assert!(!annotations_differ(&svc, None, None));
    }

    #[test]
    fn invalid_writes_are_permanent_and_the_rest_by_cause() {
        let api = |code: u16| ApplyError::Api {
            what: "status",
            object: "Service a/web".into(),
            source: kube::Error::Api(
                kube::core::Status::failure("refused", "Reason")
                    .with_code(code)
                    .boxed(),
            ),
        };
        for (code, category, transient) in [
            (404, "not_found", false),
            (409, "conflict", true),
            (422, "invalid", false),
            (400, "api_rejected", true),
            (403, "api_rejected", true),
            (429, "api_rejected", true),
            (500, "api_server", true),
        ] {
            let e = api(code);
            assert_eq!(e.category(), category, "{code}");
            assert_eq!(e.is_transient(), transient, "{code}");
            assert_eq!(e.is_invalid(), code == 422, "{code}");
        }
        let timeout = ApplyError::Timeout {
            what: "status",
            object: "Service a/web".into(),
        };
        assert!(timeout.is_transient() && !timeout.is_invalid());
    }

    #[test]
    fn ip_mode_from_version() {
        for (major, minor, want) in [
            ("1", "20", false),
            ("1", "28+", false),
            ("1", "29", true),
            ("1", "33+", true),
            ("2", "0", true),
            ("", "", false),
        ] {
            assert_eq!(version_has_ip_mode(major, minor), want, "{major}.{minor}");
        }
    }
}
