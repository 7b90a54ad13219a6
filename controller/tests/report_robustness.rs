//! Robustness of what the controller does with agent reports it cannot trust: arbitrary
//! annotations on agent Leases (reports from the shared generators, hostile reports with
//! long or odd names and reasons, small edits of both, arbitrary text, oversized text) go
//! through the controller's own reading (`observe::agents::agent_view`, as `Reconciler::agents` uses
//! it), `observe::nodes::node_states`, and several planner passes, with Services whose user
//! annotations are arbitrary too.
//!
//! Properties: no panic; a report that is not read makes its agent not ready and holding
//! nothing; every condition message and Event message the planner produces is at most
//! `MAX_MESSAGE` bytes; and what the planner says of an agent it quotes only from a report
//! that was read within bounds.
//!
//! Case counts are small by default; `PROPTEST_CASES=N` sets them (see BENCHMARKS.md).

#[path = "../../core/tests/strategies/mod.rs"]
mod strategies;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use aliaslb_controller::observe::agents::{self, Freshness};
use aliaslb_controller::observe::{nodes, service};
use aliaslb_core::keys;
use aliaslb_core::plan::{Inputs, MAX_MESSAGE, Planner, ServiceView};
use aliaslb_core::pool::PoolConfig;
use aliaslb_core::report::{AgentReport, MAX_REASON};
use aliaslb_testenv::fixtures::lb_service;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use proptest::prelude::*;
use strategies::{hostile_text, report_annotation};

/// The pool of the test: 10.0.0.1-10.0.0.6 for namespace `default`.
const POOL: &str = "10.0.0.1-10.0.0.6";

/// IPs in reports: mostly the pool's (so conflicts and held IPs meet the Services), some
/// anywhere.
fn report_ip() -> impl Strategy<Value = IpAddr> + Clone {
    prop_oneof![
        4 => (0u8..8).prop_map(|d| IpAddr::from([10, 0, 0, d])),
        1 => any::<IpAddr>(),
    ]
}

fn lease(node: &str, annotation: Option<String>) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(keys::agent_lease_name(node)),
            namespace: Some("aliaslb-system".into()),
            annotations: annotation.map(|a| [(keys::ANNOTATION_AGENT_REPORT.to_owned(), a)].into()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(node.into()),
            ..LeaseSpec::default()
        }),
    }
}

fn node(name: &str) -> Arc<Node> {
    Arc::new(Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..ObjectMeta::default()
        },
        ..Node::default()
    })
}

/// Service `name` created at `created`, with the user annotations given (request, sharing
/// key: arbitrary text).
fn service(name: &str, created: usize, annotations: &[(&str, &str)]) -> Arc<ServiceView> {
    let svc = annotations
        .iter()
        .fold(lb_service("default", name), |svc, (k, v)| {
            svc.annotate(k, v)
        })
        .port(i32::try_from(80 + created).unwrap())
        .build();
    let key = service::service_key(&svc).unwrap();
    Arc::new(service::service_view(
        &svc,
        &key,
        &Arc::from(format!("uid-{name}")),
    ))
}

/// One pass's agent Leases: per node, an annotation or none.
type Pass = Vec<Option<String>>;

fn passes() -> impl Strategy<Value = Vec<Pass>> {
    let annotation =
        prop_oneof![1 => Just(None), 6 => report_annotation(report_ip()).prop_map(Some)];
    prop::collection::vec(prop::collection::vec(annotation, 3), 1..4)
}

fn check(passes: &[Pass], requests: &[String]) -> Result<(), TestCaseError> {
    let config = PoolConfig::parse(&[("default".to_owned(), POOL.to_owned())].into()).unwrap();
    let names = ["n1", "n2", "n3"];
    let nodes: Vec<Arc<Node>> = names.iter().map(|n| node(n)).collect();
    let mut services = vec![
        service("plain", 0, &[]),
        service("shared-a", 1, &[(keys::ANNOTATION_SHARING_KEY, "k")]),
        service("shared-b", 2, &[(keys::ANNOTATION_SHARING_KEY, "k")]),
    ];
    for (i, request) in requests.iter().enumerate() {
        services.push(service(
            &format!("asks-{i}"),
            3 + i,
            &[(keys::ANNOTATION_REQUESTED_IPS, request)],
        ));
    }
    let mut planner = Planner::new();
    let start = Instant::now();
    for (round, pass) in passes.iter().enumerate() {
        let mut agents = BTreeMap::new();
        for (name, annotation) in names.iter().zip(pass) {
            let lease = lease(name, annotation.clone());
            let record = agents::LeaseRecord::of(&lease, |_| true, None).unwrap();
            let (_, (ready, report), error) = record.agent_view(Freshness::Fresh).unwrap();
            if let Some(error) = &error {
                // Not read: counts for nothing.
                prop_assert_eq!(ready, Freshness::Lost);
                prop_assert_eq!(&*report, &AgentReport::default());
                prop_assert!(!error.message.is_empty());
            } else {
                prop_assert_eq!(ready, Freshness::Fresh);
                for c in &report.conflicts {
                    prop_assert!(c.reason.len() <= MAX_REASON);
                }
            }
            agents.insert((*name).to_owned(), (ready, report));
        }
        let node_states = nodes::node_states(&nodes, &agents);
        let reports: aliaslb_core::plan::Reports = agents
            .iter()
            .map(|(n, (_, r))| (n.clone(), r.clone()))
            .collect();
        let output = planner.plan(&Inputs {
            config: &config,
            namespaces: &BTreeMap::new(),
            services: &services,
            nodes: &node_states,
            agents: &reports,
            lingering: &Default::default(),
            node_addresses: &BTreeMap::new(),
            service_ranges: &[],
            not_ours: &Default::default(),
            local_endpoints: &BTreeMap::new(),
            respect_cordon: true,
            agents_unobservable: false,
            now: start + Duration::from_secs(u64::try_from(round).unwrap()),
        });
        for (key, plan) in &output.services {
            for condition in [&plan.allocated, &plan.announced] {
                prop_assert!(
                    condition.message.len() <= MAX_MESSAGE,
                    "{key} {}: {} bytes",
                    condition.reason,
                    condition.message.len()
                );
            }
            // A node whose report was not read is never elected.
            if let Some(node) = &plan.node {
                prop_assert!(
                    agents[&**node].0 == Freshness::Fresh,
                    "{key} on {node}, whose agent is not ready"
                );
            }
        }
        for event in &output.events {
            prop_assert!(
                event.message.len() <= MAX_MESSAGE,
                "{} {}: {} bytes",
                event.service,
                event.reason,
                event.message.len()
            );
        }
    }
    Ok(())
}

proptest! {
    #[test]
    fn untrusted_reports_never_panic_and_every_message_is_bounded(
        passes in passes(),
        requests in prop::collection::vec(hostile_text(), 0..3),
    ) {
        check(&passes, &requests)?;
    }
}

/// Corner cases a generator reaches rarely: reasons far over the API's condition limit on
/// a report that is otherwise valid, and a report just over the size bound.
#[test]
fn long_reasons_are_cut_and_oversized_reports_ignored() {
    let conflicts: Vec<String> = (1..=6)
        .map(|d| format!(r#"{{"ip":"10.0.0.{d}","reason":"{}"}}"#, "é".repeat(30_000)))
        .collect();
    let long_reasons = format!(
        r#"{{"version":1,"held":["10.0.0.1"],"conflicts":[{}]}}"#,
        conflicts.join(",")
    );
    let oversized = format!(
        r#"{{"version":1,"future":"{}"}}"#,
        "x".repeat(aliaslb_core::report::MAX_REPORT_BYTES)
    );
    let pass = vec![
        Some(long_reasons.clone()),
        Some(oversized),
        Some(long_reasons),
    ];
    check(&[pass.clone(), pass], &["10.0.0.3".to_owned()]).unwrap();
}
