//! The alert rules of `manifests/optional/monitoring/`: `promtool check rules` and `promtool
//! test rules` pass; every alert has a unit test where it fires and one where it does not;
//! the PrometheusRule holds exactly the plain rules file; every metric the rules use that
//! is not an agent's (`aliaslb_agent_*`, checked by the agent's own test) is registered in
//! the controller's registry, as served on /metrics; every alert has a runbook line in
//! docs/operations.md, "Alerts".
//!
//! Needs `promtool` on PATH (Debian package `prometheus`; scripts/test installs it). No
//! API server.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aliaslb_controller::metrics::Metrics;
use aliaslb_controller::observe::agents::AgentClock;
use aliaslb_controller::track::Cause;
use aliaslb_core::range::Family;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use yaml_serde::Value;

fn monitoring() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests/optional/monitoring")
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

fn yaml(name: &str) -> Value {
    let path = monitoring().join(name);
    yaml_serde::from_str(&read(&path)).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Runs `promtool ARGS` in the monitoring folder; panics with its output on failure.
fn promtool(args: &[&str]) {
    let out = Command::new("promtool")
        .args(args)
        .current_dir(monitoring())
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "running promtool ({e}): install Debian's `prometheus` package, which provides \
                 it (scripts/test does)"
            )
        });
    assert!(
        out.status.success(),
        "promtool {args:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every rule of a rules file's `groups`.
fn rules(groups: &Value) -> Vec<&Value> {
    groups["groups"]
        .as_sequence()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_sequence().expect("rules"))
        .collect()
}

fn alert_names() -> BTreeSet<String> {
    let file = yaml("aliaslb.rules.yaml");
    rules(&file)
        .iter()
        .map(|r| {
            r["alert"]
                .as_str()
                .expect("every rule is an alert")
                .to_owned()
        })
        .collect()
}

/// The metric names (`aliaslb_...`) the rules' expressions use.
fn metric_names() -> BTreeSet<String> {
    let file = yaml("aliaslb.rules.yaml");
    let mut names = BTreeSet::new();
    for rule in rules(&file) {
        let expr = rule["expr"].as_str().expect("expr");
        let mut rest = expr;
        while let Some(at) = rest.find("aliaslb_") {
            let tail = &rest[at..];
            let end = tail
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(tail.len());
            names.insert(tail[..end].to_owned());
            rest = &tail[end..];
        }
    }
    names
}

/// Whether `name` (as a query writes it) is a series of a metric in `text`, an OpenMetrics
/// exposition: its `# TYPE` line, or a counter's `_total`, a histogram's `_bucket`, `_sum`
/// or `_count`.
fn exposed(text: &str, name: &str) -> bool {
    let types: Vec<(&str, &str)> = text
        .lines()
        .filter_map(|l| {
            let mut words = l.strip_prefix("# TYPE ")?.split(' ');
            Some((words.next()?, words.next()?))
        })
        .collect();
    let is = |base: &str, kind: &str| types.iter().any(|(n, t)| *n == base && *t == kind);
    types
        .iter()
        .any(|(n, t)| *n == name && matches!(*t, "gauge" | "info"))
        || name
            .strip_suffix("_total")
            .is_some_and(|b| is(b, "counter"))
        || ["_bucket", "_sum", "_count"]
            .iter()
            .any(|s| name.strip_suffix(s).is_some_and(|b| is(b, "histogram")))
}

/// The controller's /metrics text once every labelled family has a series (a family without
/// one is not in the text at all), each set through the method the reconcile loop calls.
fn served() -> String {
    let m = Metrics::new();
    m.set_pool("default", Family::V4, 4, 1, 0);
    m.set_pending_by_reason(&BTreeMap::from([("PoolExhausted", 1)]));
    m.set_unannounced(BTreeMap::from([(
        ("default".to_owned(), "PartiallyAnnounced"),
        1,
    )]));
    m.inc_failover(Cause::Hard);
    m.observe_failover(Cause::Hard, Duration::from_secs(1));
    m.inc_reconcile_error("timeout");
    m.inc_agent_report_rejected("json");
    let clock = Arc::new(Mutex::new(AgentClock::new(Duration::from_secs(4))));
    clock.lock().unwrap().observe(
        &Lease {
            metadata: ObjectMeta {
                name: Some(aliaslb_core::keys::agent_lease_name("n1")),
                resource_version: Some("1".into()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some("n1".into()),
                ..LeaseSpec::default()
            }),
        },
        Instant::now(),
    );
    m.track_agents(clock);
    m.encode().unwrap()
}

#[test]
fn promtool_checks_and_tests_the_rules() {
    promtool(&["check", "rules", "aliaslb.rules.yaml"]);
    promtool(&["test", "rules", "aliaslb.rules.test.yaml"]);
}

#[test]
fn every_alert_is_tested_firing_and_quiet() {
    let tests = yaml("aliaslb.rules.test.yaml");
    let mut fires = BTreeSet::new();
    let mut quiet = BTreeSet::new();
    for case in tests["tests"].as_sequence().expect("tests") {
        for t in case["alert_rule_test"].as_sequence().into_iter().flatten() {
            let name = t["alertname"].as_str().expect("alertname").to_owned();
            let expected = t["exp_alerts"].as_sequence().map_or(0, Vec::len);
            if expected == 0 {
                quiet.insert(name);
            } else {
                fires.insert(name);
            }
        }
    }
    let alerts = alert_names();
    assert!(alerts.len() >= 14, "{alerts:?}");
    let untested =
        |seen: &BTreeSet<String>| -> Vec<String> { alerts.difference(seen).cloned().collect() };
    assert!(
        untested(&fires).is_empty(),
        "never fire: {:?}",
        untested(&fires)
    );
    assert!(
        untested(&quiet).is_empty(),
        "never quiet: {:?}",
        untested(&quiet)
    );
}

#[test]
fn the_prometheusrule_holds_the_rules_file() {
    let rule = yaml("prometheusrule.yaml");
    assert_eq!(
        rule["apiVersion"].as_str(),
        Some("monitoring.coreos.com/v1")
    );
    assert_eq!(rule["kind"].as_str(), Some("PrometheusRule"));
    assert!(
        rule["spec"] == yaml("aliaslb.rules.yaml"),
        "prometheusrule.yaml differs from aliaslb.rules.yaml: run scripts/monitoring-rules"
    );
}

#[test]
fn every_controller_metric_the_rules_use_is_registered() {
    let names = metric_names();
    assert!(names.contains("aliaslb_leader"), "{names:?}");
    assert!(
        names.iter().any(|n| n.starts_with("aliaslb_agent_")),
        "{names:?}"
    );
    let text = served();
    let missing: Vec<&String> = names
        .iter()
        .filter(|n| !n.starts_with("aliaslb_agent_"))
        .filter(|n| !exposed(&text, n))
        .collect();
    assert!(
        missing.is_empty(),
        "the rules use {missing:?}, which the controller does not serve:\n{text}"
    );
}

#[test]
fn the_name_check_sees_a_rename() {
    let text = served();
    assert!(exposed(&text, "aliaslb_pool_addresses"));
    assert!(exposed(&text, "aliaslb_allocations_total"));
    assert!(exposed(&text, "aliaslb_failover_duration_seconds_bucket"));
    assert!(
        !exposed(&text, "aliaslb_allocations"),
        "a counter is queried as _total"
    );
    assert!(!exposed(&text, "aliaslb_pool_addresses_free"));
}

#[test]
fn every_alert_has_a_runbook_line_in_the_operations_docs() {
    let operations = read(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/operations.md"));
    let section = operations
        .split_once("\n## Alerts\n")
        .map(|(_, rest)| rest.split("\n## ").next().unwrap_or(rest))
        .expect("docs/operations.md has an Alerts section");
    let missing: Vec<String> = alert_names()
        .into_iter()
        .filter(|a| !section.lines().any(|l| l.contains(&format!("`{a}`"))))
        .collect();
    assert!(
        missing.is_empty(),
        "no runbook line in docs/operations.md's Alerts for {missing:?}"
    );
}
