//! The alert rules of `manifests/optional/monitoring/`: `promtool check rules` and `promtool
//! test rules` pass; every alert has a unit test where it fires and one where it does not;
//! the PrometheusRule holds exactly the plain rules file; every metric the rules use that
//! is not an agent's (`aliaslb_agent_*`, checked by the agent's own test) is registered in
//! the controller's registry, as served on /metrics; every alert has a runbook of its own
//! (`docs/runbooks/<alert>.md`: what it means, how to confirm with `kubectl aliaslb`, how to
//! fix), its `runbook_url` points there, and docs/operations.md's "Alerts" links each.
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

/// The metric names (`aliaslb_...`) in `expr`.
fn names_in(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = expr;
    while let Some(at) = rest.find("aliaslb_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.insert(tail[..end].to_owned());
        rest = &tail[end..];
    }
    names
}

/// The metric names (`aliaslb_...`) the rules' expressions use.
fn metric_names() -> BTreeSet<String> {
    let file = yaml("aliaslb.rules.yaml");
    rules(&file)
        .iter()
        .flat_map(|rule| names_in(rule["expr"].as_str().expect("expr")))
        .collect()
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
    let since = BTreeMap::from([(
        ("default".to_owned(), "default".to_owned(), "NoEligibleNode"),
        Instant::now(),
    )]);
    m.set_pending_since(since.clone());
    m.set_unannounced_since(since);
    m.set_agents_ready(1);
    m.set_writes_failing(0, 0);
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
    assert!(alerts.len() >= 20, "{alerts:?}");
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

/// The repository's root.
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Where each alert's runbook is served from: its file in the repository on GitHub.
const RUNBOOKS: &str = "https://github.com/aliaslb/aliaslb/blob/main/docs/runbooks/";

#[test]
fn every_alert_has_a_runbook_of_its_own() {
    let file = yaml("aliaslb.rules.yaml");
    let dir = repo().join("docs/runbooks");
    let mut problems = Vec::new();
    let mut urls = BTreeSet::new();
    for rule in rules(&file) {
        let alert = rule["alert"].as_str().expect("alert");
        let url = rule["annotations"]["runbook_url"]
            .as_str()
            .unwrap_or_default();
        let want = format!("{RUNBOOKS}{alert}.md");
        if url != want {
            problems.push(format!("{alert}: runbook_url {url:?}, not {want:?}"));
        }
        urls.insert(url.to_owned());
        let path = dir.join(format!("{alert}.md"));
        let Ok(text) = std::fs::read_to_string(&path) else {
            problems.push(format!("{alert}: no {}", path.display()));
            continue;
        };
        if !text.starts_with(&format!("# {alert}\n")) {
            problems.push(format!(
                "{alert}: its runbook's title is not the alert's name"
            ));
        }
        for section in ["## What it means", "## Confirm", "## Fix"] {
            if !text.contains(&format!("\n{section}\n")) {
                problems.push(format!("{alert}: no `{section}` in its runbook"));
            }
        }
        if !text.contains("kubectl aliaslb ") {
            problems.push(format!(
                "{alert}: its runbook confirms nothing with `kubectl aliaslb`"
            ));
        }
    }
    assert_eq!(
        urls.len(),
        alert_names().len(),
        "two alerts share a runbook: {urls:?}"
    );
    // No runbook without its alert (a renamed alert leaves none behind).
    for entry in std::fs::read_dir(&dir).expect("docs/runbooks") {
        let name = entry
            .expect("entry")
            .file_name()
            .to_string_lossy()
            .into_owned();
        let alert = name.strip_suffix(".md").unwrap_or(&name);
        if !alert_names().contains(alert) {
            problems.push(format!("docs/runbooks/{name} has no alert"));
        }
    }
    assert!(problems.is_empty(), "{problems:#?}");
}

#[test]
fn every_alert_is_linked_from_the_operations_docs() {
    let operations = read(&repo().join("docs/operations.md"));
    let section = operations
        .split_once("\n## Alerts\n")
        .map(|(_, rest)| rest.split("\n## ").next().unwrap_or(rest))
        .expect("docs/operations.md has an Alerts section");
    let missing: Vec<String> = alert_names()
        .into_iter()
        .filter(|a| !section.contains(&format!("[`{a}`](runbooks/{a}.md)")))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/operations.md's Alerts does not link the runbook of {missing:?}"
    );
}

/// Every query of the dashboard's panels (rows' panels included).
fn dashboard_exprs(dashboard: &serde_json::Value) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack: Vec<&serde_json::Value> = dashboard["panels"]
        .as_array()
        .into_iter()
        .flatten()
        .collect();
    while let Some(panel) = stack.pop() {
        stack.extend(panel["panels"].as_array().into_iter().flatten());
        for target in panel["targets"].as_array().into_iter().flatten() {
            out.extend(target["expr"].as_str().map(str::to_owned));
        }
    }
    out
}

#[test]
fn every_alert_has_its_signal_on_the_dashboard_and_its_variables() {
    let text = read(&monitoring().join("grafana-dashboard.json"));
    let dashboard: serde_json::Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let exprs = dashboard_exprs(&dashboard);
    let shown: BTreeSet<String> = exprs.iter().flat_map(|e| names_in(e)).collect();
    let file = yaml("aliaslb.rules.yaml");
    let mut missing = Vec::new();
    for rule in rules(&file) {
        let alert = rule["alert"].as_str().expect("alert");
        for name in names_in(rule["expr"].as_str().expect("expr")) {
            if name != "aliaslb_leader" && !shown.contains(&name) {
                missing.push(format!("{alert}: {name}"));
            }
        }
    }
    assert!(missing.is_empty(), "no panel shows {missing:?}");
    // The variables, and that the panels use them.
    let variables: BTreeSet<&str> = dashboard["templating"]["list"]
        .as_array()
        .expect("templating")
        .iter()
        .filter_map(|v| v["name"].as_str())
        .collect();
    for (name, used_with) in [
        ("pool", "pool=~\"$pool\""),
        ("namespace", "namespace=~\"$namespace\""),
        ("node", "node=~\"$node\""),
    ] {
        assert!(
            variables.contains(name),
            "no variable {name}: {variables:?}"
        );
        assert!(
            exprs.iter().any(|e| e.contains(used_with)),
            "no panel filters by ${name}"
        );
    }
    // Every agent metric a panel shows is filtered by node (the relabelled label).
    let unfiltered: Vec<&String> = exprs
        .iter()
        .filter(|e| e.contains("aliaslb_agent_") && !e.contains("node=~\"$node\""))
        .collect();
    assert!(unfiltered.is_empty(), "{unfiltered:?}");
}

#[test]
fn the_agent_podmonitor_labels_every_series_with_its_node() {
    let text = read(&monitoring().join("podmonitors.yaml"));
    let agent = text
        .split("\n---\n")
        .map(|doc| yaml_serde::from_str::<Value>(doc).expect("podmonitors.yaml"))
        .find(|doc| doc["metadata"]["name"].as_str() == Some("aliaslb-agent"))
        .expect("an aliaslb-agent PodMonitor");
    let relabelings = &agent["spec"]["podMetricsEndpoints"][0]["relabelings"];
    let node = relabelings
        .as_sequence()
        .into_iter()
        .flatten()
        .find(|r| r["targetLabel"].as_str() == Some("node"))
        .unwrap_or_else(|| panic!("no relabeling to `node`: {relabelings:?}"));
    assert_eq!(
        node["sourceLabels"][0].as_str(),
        Some("__meta_kubernetes_pod_node_name")
    );
    // And the rules name nodes, not scrape addresses.
    let rules = read(&monitoring().join("aliaslb.rules.yaml"));
    assert!(
        !rules.contains("$labels.instance"),
        "a summary names an agent by its instance (IP:9101), not its node"
    );
}
