//! The Helm chart (`charts/aliaslb`) against the kustomize manifests it mirrors and against a
//! real kube-apiserver (`aliaslb-testenv`):
//!
//! - the chart's `files/` are byte copies of their sources in `manifests/`
//!   (`scripts/chart-files` writes them);
//! - `helm lint` passes, with the default values and with every optional part on, and the
//!   values schema refuses an unknown value;
//! - `helm template -n aliaslb-system` with the default values renders exactly the objects of
//!   `kubectl kustomize manifests/` but the Namespace aliaslb-system, which is the release's
//!   (`--create-namespace` makes it), not the chart's (same apiVersion, kind, namespace, name
//!   and content: the chart adds no label of its own), the agent Lease policy and the Lease
//!   quota included (on by default), each of which one value turns off, and each optional
//!   value renders exactly its kustomize component added to the kustomization as docs/l3-mode.md
//!   and docs/operations.md say (monitoring, BIRD sidecar) or its file of `manifests/optional/` (the Service
//!   annotation and pool ConfigMap policies);
//! - the chart installs into any namespace, the agents' Leases into any other one, and names
//!   no other; values.schema.json describes every value of values.yaml and refuses others;
//!   the chart's README is what helm-docs writes from values.yaml;
//! - each value reaches the objects it names (per-alert settings included, the rules then
//!   checked by promtool), and the rendered pools pass `aliaslb validate`;
//! - `helm install`, `helm upgrade` and `helm uninstall` create, change and remove exactly the
//!   rendered objects (the BIRD sidecar and the admission policies installed and removed by
//!   upgrades), and `helm install --take-ownership` adopts what `kubectl apply -k` made. (That
//!   an upgrade moves no IP, with the real binaries and the LAN sampled, is
//!   e2e/tests/helm.rs.)
//!
//! Needs `helm` (`ALIASLB_HELM`, else `scripts/helm` builds it from its Go module, about a
//! minute and a half the first time), helm-docs (`scripts/tool` builds it, seconds),
//! `kubectl` and `promtool` on PATH and the testenv binaries.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use aliaslb_core::pool::PoolConfig;
use aliaslb_testenv::TestEnv;
use serde_json::{Value, json};

const RELEASE: &str = "aliaslb";
const NAMESPACE: &str = "aliaslb-system";

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("controller/ has a parent")
        .to_owned()
}

fn chart() -> String {
    repo_root().join("charts/aliaslb").display().to_string()
}

/// The helm binary: `ALIASLB_HELM` (scripts/test exports it), else what `scripts/helm`
/// prints (it builds helm on first use and caches it).
fn helm_binary() -> &'static Path {
    static HELM: OnceLock<PathBuf> = OnceLock::new();
    HELM.get_or_init(|| {
        if let Some(path) = std::env::var_os("ALIASLB_HELM") {
            return PathBuf::from(path);
        }
        let out = Command::new("bash")
            .arg(repo_root().join("scripts/helm"))
            .output()
            .unwrap_or_else(|e| panic!("running scripts/helm: {e}"));
        assert!(
            out.status.success(),
            "scripts/helm failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8(out.stdout).unwrap();
        PathBuf::from(
            stdout
                .lines()
                .last()
                .expect("scripts/helm prints a path")
                .trim(),
        )
    })
}

/// Runs `helm ARGS`: stdout, or the command and its stderr.
fn helm(args: &[&str]) -> Result<String, String> {
    let out = Command::new(helm_binary())
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", helm_binary().display()));
    if out.status.success() {
        Ok(String::from_utf8(out.stdout).unwrap())
    } else {
        Err(format!(
            "helm {} failed ({}):\n{}{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

fn helm_ok(args: &[&str]) -> String {
    helm(args).unwrap_or_else(|e| panic!("{e}"))
}

/// `helm template` of the chart with `--set` values `sets`, as a user renders it into
/// [`NAMESPACE`].
fn render(sets: &[&str]) -> String {
    render_into(NAMESPACE, sets)
}

/// `helm template` of the chart into namespace `ns`, with `--set` values `sets`.
fn render_into(ns: &str, sets: &[&str]) -> String {
    let chart = chart();
    let mut args = vec!["template", RELEASE, &chart, "--namespace", ns];
    for set in sets {
        // A flag (`--kube-version=...`) as it is, anything else a value.
        if !set.starts_with("--") {
            args.push("--set");
        }
        args.push(set);
    }
    helm_ok(&args)
}

/// The optional values, all on.
const ALL_OPTIONS: [&str; 4] = [
    "monitoring.enabled=true",
    "birdSidecar.enabled=true",
    "admissionPolicies.serviceAnnotations.enabled=true",
    "admissionPolicies.poolConfigMap.enabled=true",
];

/// An object's identity: apiVersion, kind, namespace ("" when cluster-scoped), name.
type Key = (String, String, String, String);
/// The objects of a multi-document YAML by identity.
type Objects = BTreeMap<Key, Value>;

fn key_text((api, kind, ns, name): &Key) -> String {
    if ns.is_empty() {
        format!("{api} {kind} {name}")
    } else {
        format!("{api} {kind} {ns}/{name}")
    }
}

/// Parses a multi-document YAML (empty documents skipped); an object twice is an error.
fn objects(yaml: &str, what: &str) -> Objects {
    let mut all = Objects::new();
    for doc in yaml_serde::Deserializer::from_str(yaml) {
        let value: Value = serde::Deserialize::deserialize(doc)
            .unwrap_or_else(|e| panic!("{what}: a document is not YAML: {e}"));
        if value.is_null() {
            continue;
        }
        let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
        let key = (
            text(&value["apiVersion"]),
            text(&value["kind"]),
            text(&value["metadata"]["namespace"]),
            text(&value["metadata"]["name"]),
        );
        assert!(
            !key.0.is_empty() && !key.1.is_empty() && !key.3.is_empty(),
            "{what}: a document without apiVersion, kind or name: {value}"
        );
        if let Some(old) = all.insert(key.clone(), value) {
            panic!("{what}: {} twice ({old})", key_text(&key));
        }
    }
    all
}

/// The differences between `want` and `got` below `path`, one line each.
fn diff_values(path: &str, want: &Value, got: &Value, out: &mut Vec<String>) {
    match (want, got) {
        (Value::Object(w), Value::Object(g)) => {
            let keys: BTreeSet<&String> = w.keys().chain(g.keys()).collect();
            for k in keys {
                let p = format!("{path}.{k}");
                match (w.get(k), g.get(k)) {
                    (Some(a), Some(b)) => diff_values(&p, a, b, out),
                    (Some(a), None) => out.push(format!("{p}: missing (want {a})")),
                    (None, Some(b)) => out.push(format!("{p}: unexpected {b}")),
                    (None, None) => unreachable!(),
                }
            }
        }
        (Value::Array(w), Value::Array(g)) if w.len() == g.len() => {
            for (i, (a, b)) in w.iter().zip(g).enumerate() {
                diff_values(&format!("{path}[{i}]"), a, b, out);
            }
        }
        // A file's content (rules, bird.conf, the dashboard): its first differing line.
        (Value::String(w), Value::String(g))
            if w != g && (w.contains('\n') || g.contains('\n')) =>
        {
            fn lines(t: &str) -> impl Iterator<Item = Option<&str>> {
                t.lines().map(Some).chain(std::iter::repeat(None))
            }
            let first = lines(w)
                .zip(lines(g))
                .take(w.lines().count().max(g.lines().count()))
                .enumerate()
                .find(|(_, (a, b))| a != b);
            out.push(match first {
                Some((line, (a, b))) => {
                    format!("{path}: line {} differs: want {a:?}, got {b:?}", line + 1)
                }
                None => format!("{path}: the texts differ in their line endings"),
            });
        }
        _ if want != got => out.push(format!("{path}: want {want}, got {got}")),
        _ => {}
    }
}

/// What differs between `want` (kustomize) and `got` (the chart): what is missing, what is
/// extra and each differing field, one entry per object.
fn differences(want: &Objects, got: &Objects) -> Vec<String> {
    let mut problems = Vec::new();
    for (key, w) in want {
        match got.get(key) {
            None => problems.push(format!("missing from the chart: {}", key_text(key))),
            Some(g) => {
                let mut fields = Vec::new();
                diff_values("", w, g, &mut fields);
                if !fields.is_empty() {
                    problems.push(format!(
                        "{} differs:\n    {}",
                        key_text(key),
                        fields.join("\n    ")
                    ));
                }
            }
        }
    }
    for key in got.keys().filter(|k| !want.contains_key(*k)) {
        problems.push(format!("only in the chart: {}", key_text(key)));
    }
    problems
}

/// Asserts that `got` (the chart) holds exactly the objects of `want` (kustomize), printing
/// the [`differences`].
fn assert_same_objects(want: &Objects, got: &Objects, what: &str) {
    let problems = differences(want, got);
    assert!(
        problems.is_empty(),
        "{what}: the chart and kustomize differ:\n  {}",
        problems.join("\n  ")
    );
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// What the chart renders of `kubectl kustomize`'s objects ([`kustomize`]): all but the
/// Namespace [`NAMESPACE`], which is the release's (helm's `--create-namespace`, or the
/// operator, makes it) rather than the chart's.
fn kustomize_for_chart(components: &[&str], files: &[&str]) -> Objects {
    let mut all = kustomize(components, files);
    let release_namespace = (
        "v1".to_owned(),
        "Namespace".to_owned(),
        String::new(),
        NAMESPACE.to_owned(),
    );
    assert!(
        all.remove(&release_namespace).is_some(),
        "manifests/ creates the Namespace {NAMESPACE}"
    );
    all
}

/// What `kubectl kustomize` renders for manifests/ with `components` added to its
/// kustomization.yaml (as docs/operations.md tells users to), plus the objects of `files` (paths
/// in the repository, applied with `kubectl apply -f`).
fn kustomize(components: &[&str], files: &[&str]) -> Objects {
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("manifests");
    copy_dir(&repo_root().join("manifests"), &copy);
    if !components.is_empty() {
        let path = copy.join("kustomization.yaml");
        let mut text = std::fs::read_to_string(&path).unwrap();
        assert!(
            !text.contains("\ncomponents:"),
            "manifests/kustomization.yaml has components of its own: extend this test"
        );
        text.push_str("\ncomponents:\n");
        for c in components {
            text.push_str(&format!("  - {c}\n"));
        }
        std::fs::write(&path, text).unwrap();
    }
    let out = Command::new("kubectl")
        .args(["kustomize", &copy.display().to_string()])
        .output()
        .unwrap_or_else(|e| panic!("running kubectl (is it installed and on PATH?): {e}"));
    assert!(
        out.status.success(),
        "kubectl kustomize manifests/ with {components:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let what = format!("kubectl kustomize manifests/ with {components:?}");
    let mut all = objects(&String::from_utf8(out.stdout).unwrap(), &what);
    for file in files {
        let text = std::fs::read_to_string(repo_root().join(file)).unwrap();
        for (key, value) in objects(&text, file) {
            assert!(
                all.insert(key.clone(), value).is_none(),
                "{file}: {} also in the kustomization",
                key_text(&key)
            );
        }
    }
    all
}

/// The chart's `files/` and their sources (what scripts/chart-files copies).
const CHART_FILES: [(&str, &str); 7] = [
    (
        "aliaslb.rules.yaml",
        "manifests/optional/monitoring/aliaslb.rules.yaml",
    ),
    (
        "grafana-dashboard.json",
        "manifests/optional/monitoring/grafana-dashboard.json",
    ),
    ("bird.conf", "manifests/optional/bird-sidecar/bird.conf"),
    (
        "agent-lease-policy.yaml",
        "manifests/agent-lease-policy.yaml",
    ),
    (
        "pool-configmap-policy.yaml",
        "manifests/optional/pool-configmap-policy.yaml",
    ),
    (
        "pool-configmap-policy-1.30.yaml",
        "manifests/optional/pool-configmap-policy-1.30.yaml",
    ),
    (
        "service-annotation-policy.yaml",
        "manifests/optional/service-annotation-policy.yaml",
    ),
];

#[test]
fn chart_files_are_copies_of_the_manifests() {
    let files = repo_root().join("charts/aliaslb/files");
    let mut stale = Vec::new();
    for (name, source) in CHART_FILES {
        let copy = std::fs::read(files.join(name)).unwrap_or_default();
        let original = std::fs::read(repo_root().join(source))
            .unwrap_or_else(|e| panic!("reading {source}: {e}"));
        if copy != original {
            stale.push(format!("charts/aliaslb/files/{name} differs from {source}"));
        }
    }
    let mut present: Vec<String> = std::fs::read_dir(&files)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    present.sort();
    let mut expected: Vec<String> = CHART_FILES.iter().map(|(n, _)| (*n).to_owned()).collect();
    expected.sort();
    assert!(
        stale.is_empty(),
        "{}\nrun scripts/chart-files",
        stale.join("\n")
    );
    assert_eq!(present, expected, "charts/aliaslb/files holds only copies");
    // The script copies the same list.
    let script = std::fs::read_to_string(repo_root().join("scripts/chart-files")).unwrap();
    for (_, source) in CHART_FILES {
        assert!(
            script.contains(&format!("  {source}\n")),
            "scripts/chart-files does not copy {source}"
        );
    }
}

#[test]
fn helm_lint_passes() {
    let chart = chart();
    let t0 = Instant::now();
    let out = helm_ok(&["lint", "--strict", &chart]);
    assert!(out.contains("0 chart(s) failed"), "{out}");
    let mut args = vec!["lint", "--strict", &chart];
    for set in ALL_OPTIONS {
        args.extend(["--set", set]);
    }
    let out = helm_ok(&args);
    assert!(out.contains("0 chart(s) failed"), "{out}");
    println!(
        "helm lint (defaults, options on): {:.2} s",
        t0.elapsed().as_secs_f64()
    );
}

/// values.schema.json refuses what the chart does not know, so a typo is not silently ignored.
#[test]
fn the_values_schema_refuses_unknown_and_mistyped_values() {
    let chart = chart();
    for set in [
        "monitoring.enable=true",
        "birdSidecar.enabled=yes",
        "image.pullPolicy=Sometimes",
        "admissionPolicies.agentLeases.enabled=true",
        "controller.resources.limit.memory=1Gi",
        "agentLeases.namespace=Not_A_Name",
        "controller.podDisruptionBudget.minAvailable=half",
        "agent.extraArgs[0]=interface=eth1",
        "imagePullSecrets[0].secret=x",
        "monitoring.alerts.AliaslbNoSuchAlert.enabled=false",
        "monitoring.alerts.AliaslbNoLeader.threshold=1",
        "monitoring.alerts.AliaslbPoolExhausted.for=5 minutes",
        "controller.podLabels.team=null",
    ] {
        let refused = helm(&["template", RELEASE, &chart, "--set", set]);
        let why = refused.expect_err(&format!("--set {set} is refused"));
        assert!(
            why.contains("values don't meet the specifications"),
            "{set}: {why}"
        );
    }
}

/// The definitions of values.schema.json that describe a value as a whole, though they list
/// its keys: resource quantities (any of cpu, memory, ephemeral-storage may be given).
const WHOLE: [&str; 1] = ["#/definitions/quantities"];

/// `node`, its `$ref`s followed into the schema's `definitions`.
fn resolve<'a>(mut node: &'a Value, root: &'a Value) -> &'a Value {
    while let Some(reference) = node["$ref"].as_str() {
        node = &root["definitions"][reference.trim_start_matches("#/definitions/")];
    }
    node
}

/// The paths of every value of values.yaml, each with the schema node that describes it:
/// the walk goes down the schema's `properties` (through `$ref`s into `definitions`) and
/// stops at a value the schema types as a whole (a free-form map, a list, a scalar, one of
/// [`WHOLE`]). A value without a schema node, or one whose node has no `type`, is a problem.
fn schema_coverage(
    path: &str,
    value: &yaml_serde::Value,
    node: &Value,
    root: &Value,
    covered: &mut Vec<String>,
    problems: &mut Vec<String>,
) {
    if node["$ref"].as_str().is_some_and(|r| WHOLE.contains(&r)) {
        covered.push(path.to_owned());
        return;
    }
    let node = resolve(node, root);
    if node.is_null() {
        problems.push(format!("{path}: no schema"));
        return;
    }
    let has_type = !node["type"].is_null() || !node["oneOf"].is_null();
    if !has_type {
        problems.push(format!("{path}: its schema has no type: {node}"));
    }
    match value {
        yaml_serde::Value::Mapping(map) if node["properties"].is_object() => {
            if node["additionalProperties"] != Value::Bool(false) {
                problems.push(format!("{path}: its schema allows unknown keys"));
            }
            for (key, child) in map {
                let key = key.as_str().unwrap_or_default();
                let child_path = if path.is_empty() {
                    key.to_owned()
                } else {
                    format!("{path}.{key}")
                };
                schema_coverage(
                    &child_path,
                    child,
                    &node["properties"][key],
                    root,
                    covered,
                    problems,
                );
            }
        }
        _ => covered.push(path.to_owned()),
    }
}

/// values.schema.json describes every value of values.yaml, with a type, and refuses keys it
/// does not describe; and every value the schema describes is in values.yaml (so helm-docs
/// lists it).
#[test]
fn the_values_schema_covers_every_value() {
    let root_dir = repo_root().join("charts/aliaslb");
    let values: yaml_serde::Value =
        yaml_serde::from_str(&std::fs::read_to_string(root_dir.join("values.yaml")).unwrap())
            .unwrap();
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(root_dir.join("values.schema.json")).unwrap(),
    )
    .unwrap();
    let mut covered = Vec::new();
    let mut problems = Vec::new();
    schema_coverage("", &values, &schema, &schema, &mut covered, &mut problems);
    // The other way: each property the schema lists (outside `definitions`) has a value.
    fn listed(path: &str, node: &Value, root: &Value, out: &mut Vec<String>) {
        if node["$ref"].as_str().is_some_and(|r| WHOLE.contains(&r)) {
            out.push(path.to_owned());
            return;
        }
        let node = resolve(node, root);
        if let Some(props) = node["properties"].as_object() {
            for (key, child) in props {
                let p = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                listed(&p, child, root, out);
            }
        } else {
            out.push(path.to_owned());
        }
    }
    let mut described = Vec::new();
    listed("", &schema, &schema, &mut described);
    for path in &described {
        if !covered.contains(path) {
            problems.push(format!("{path}: in the schema, not in values.yaml"));
        }
    }
    assert!(
        problems.is_empty(),
        "values.schema.json and values.yaml:\n  {}",
        problems.join("\n  ")
    );
    assert!(covered.len() > 90, "{} values: {covered:?}", covered.len());
}

/// charts/aliaslb/README.md is what helm-docs writes (`scripts/chart-docs`) from the
/// current values.yaml and README.md.gotmpl: the values table cannot go stale.
#[test]
fn the_chart_readme_is_generated_from_the_values() {
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("aliaslb");
    copy_dir(&repo_root().join("charts/aliaslb"), &copy);
    let out = Command::new("bash")
        .arg(repo_root().join("scripts/chart-docs"))
        .arg(&copy)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "scripts/chart-docs failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let written = std::fs::read_to_string(copy.join("README.md")).unwrap();
    let committed =
        std::fs::read_to_string(repo_root().join("charts/aliaslb/README.md")).unwrap_or_default();
    assert!(
        written == committed,
        "charts/aliaslb/README.md is stale: run scripts/chart-docs"
    );
    for value in [
        "agentLeases.namespace",
        "monitoring.alerts.AliaslbNoLeader.for",
    ] {
        assert!(written.contains(&format!("| {value} |")), "{value}");
    }
}

#[test]
fn default_values_render_the_kustomization() {
    let want = kustomize_for_chart(&[], &[]);
    let got = objects(&render(&[]), "helm template");
    assert_eq!(
        want.len(),
        20,
        "the manifests' objects but the Namespace {NAMESPACE}: {:?}",
        want.keys()
    );
    assert_same_objects(&want, &got, "default values");
}

/// What is on by default can be turned off: the agent Lease policy (a server whose tokens
/// lack the node-name extra) and the Lease quota; each value removes its objects, nothing
/// else.
#[test]
fn the_defaults_that_guard_the_agent_namespace_can_be_turned_off() {
    let all = kustomize_for_chart(&[], &[]);
    let cases: [(&str, &[&str]); 2] = [
        (
            "admissionPolicies.agentLease.enabled=false",
            &[
                "ValidatingAdmissionPolicy",
                "ValidatingAdmissionPolicyBinding",
            ],
        ),
        ("agent.leaseQuota=0", &["ResourceQuota"]),
    ];
    for (set, kinds) in cases {
        let mut want = all.clone();
        want.retain(|(_, kind, _, _), _| !kinds.contains(&kind.as_str()));
        assert_eq!(want.len() + kinds.len(), all.len(), "{set}: {kinds:?}");
        let got = objects(&render(&[set]), set);
        assert_same_objects(&want, &got, set);
    }
}

#[test]
fn each_option_renders_its_kustomize_component() {
    let policies = [
        "manifests/optional/service-annotation-policy.yaml",
        // helm template's Kubernetes version is the newest: the 1.31+ variant.
        "manifests/optional/pool-configmap-policy.yaml",
    ];
    // What, the values set, the components added to the kustomization, the files applied.
    type Case<'a> = (&'a str, &'a [&'a str], &'a [&'a str], &'a [&'a str]);
    let cases: [Case<'_>; 6] = [
        (
            "monitoring",
            &["monitoring.enabled=true"],
            &["optional/monitoring"],
            &[],
        ),
        (
            "BIRD sidecar",
            &["birdSidecar.enabled=true"],
            &["optional/bird-sidecar"],
            &[],
        ),
        (
            "Service annotation policy",
            &["admissionPolicies.serviceAnnotations.enabled=true"],
            &[],
            &policies[..1],
        ),
        (
            "pool ConfigMap policy",
            &["admissionPolicies.poolConfigMap.enabled=true"],
            &[],
            &policies[1..],
        ),
        (
            "pool ConfigMap policy on 1.30",
            &[
                "admissionPolicies.poolConfigMap.enabled=true",
                "--kube-version=1.30.14",
            ],
            &[],
            &["manifests/optional/pool-configmap-policy-1.30.yaml"],
        ),
        (
            "everything",
            &ALL_OPTIONS,
            &["optional/monitoring", "optional/bird-sidecar"],
            &policies,
        ),
    ];
    let base = kustomize_for_chart(&[], &[]).len();
    let mut failed = Vec::new();
    for (what, sets, components, files) in cases {
        let want = kustomize_for_chart(components, files);
        assert!(want.len() > base, "{what}: the component adds objects");
        let got = objects(&render(sets), what);
        let problems = differences(&want, &got);
        if !problems.is_empty() {
            failed.push(format!("{what}:\n  {}", problems.join("\n  ")));
        }
    }
    assert!(
        failed.is_empty(),
        "the chart and kustomize differ:\n{}",
        failed.join("\n")
    );
}

/// Every string in `value` below `path`, with its path.
fn strings<'a>(path: String, value: &'a Value, out: &mut Vec<(String, &'a str)>) {
    match value {
        Value::String(text) => out.push((path, text)),
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                strings(format!("{path}[{i}]"), item, out);
            }
        }
        Value::Object(map) => {
            for (key, item) in map {
                strings(format!("{path}.{key}"), item, out);
            }
        }
        _ => {}
    }
}

/// `helm install -n my-lb --create-namespace` puts everything into my-lb and the agents'
/// Leases into agentLeases.namespace: every object, binding subject, flag and admission
/// policy names those two, never the defaults (the one `aliaslb-agents` left is the name of
/// a group of alert rules). The Leases' namespace cannot be the release's.
#[test]
fn the_chart_installs_into_any_namespace() {
    let mut sets = vec!["agentLeases.namespace=my-lb-agents"];
    sets.extend(ALL_OPTIONS);
    let all = objects(&render_into("my-lb", &sets), "helm template -n my-lb");
    let mut problems = Vec::new();
    for ((_, kind, ns, name), object) in &all {
        let want_ns = match (kind.as_str(), name.as_str()) {
            ("Namespace", _) => "",
            ("ClusterRole" | "ClusterRoleBinding", _) => "",
            ("ValidatingAdmissionPolicy" | "ValidatingAdmissionPolicyBinding", _) => "",
            ("Role" | "RoleBinding", "aliaslb-agent" | "aliaslb-controller")
                if object["metadata"]["namespace"] == "my-lb-agents" =>
            {
                "my-lb-agents"
            }
            ("ResourceQuota", "aliaslb-agent-leases") => "my-lb-agents",
            _ => "my-lb",
        };
        if ns != want_ns {
            problems.push(format!("{kind} {name} in {ns:?}, want {want_ns:?}"));
        }
        for subject in object["subjects"].as_array().into_iter().flatten() {
            if subject["namespace"] != "my-lb" {
                problems.push(format!("{kind} {name}: subject {subject}"));
            }
        }
        let mut texts = Vec::new();
        strings(String::new(), object, &mut texts);
        for (path, text) in texts {
            let group_name = kind == "PrometheusRule" && path.ends_with(".name");
            if text.contains("aliaslb-system") || (text.contains("aliaslb-agents") && !group_name) {
                problems.push(format!("{kind} {name}{path}: {text:?}"));
            }
        }
    }
    let names: BTreeSet<(&str, &str)> = all
        .keys()
        .map(|(_, kind, ns, name)| {
            (
                kind.as_str(),
                if ns.is_empty() {
                    name.as_str()
                } else {
                    ns.as_str()
                },
            )
        })
        .collect();
    assert!(names.contains(&("Namespace", "my-lb-agents")), "{names:?}");
    for kind in ["Role", "RoleBinding"] {
        assert!(names.contains(&(kind, "my-lb-agents")), "{kind}: {names:?}");
    }
    assert!(
        !names.contains(&("Namespace", "my-lb")),
        "the release's namespace is helm's, not the chart's"
    );
    for (workload, container) in [
        ("aliaslb-controller", "controller"),
        ("aliaslb-agent", "agent"),
    ] {
        let args = &containers(&all)[&(workload.to_owned(), container.to_owned())]["args"];
        assert!(
            args.as_array()
                .unwrap()
                .contains(&Value::from("--agent-namespace=my-lb-agents")),
            "{workload}: {args}"
        );
    }
    let policy = object(
        &all,
        "ValidatingAdmissionPolicy",
        "",
        "aliaslb-agent-own-lease",
    );
    let text = policy.to_string();
    assert!(
        text.contains("system:serviceaccount:my-lb:aliaslb-agent")
            && text.contains(r#""kubernetes.io/metadata.name":"my-lb-agents""#),
        "{text}"
    );
    assert!(
        problems.is_empty(),
        "objects naming another namespace:\n  {}",
        problems.join("\n  ")
    );

    // Without the Namespace: it must exist.
    let kept = objects(
        &render_into("my-lb", &["agentLeases.createNamespace=false"]),
        "no Lease namespace",
    );
    assert!(!kept.keys().any(|(_, kind, _, _)| kind == "Namespace"));

    // The Leases' namespace is never the release's.
    let chart = chart();
    let refused = helm(&[
        "template",
        RELEASE,
        &chart,
        "-n",
        "my-lb",
        "--set",
        "agentLeases.namespace=my-lb",
    ])
    .expect_err("the agents' Leases in the release's namespace are refused");
    assert!(
        refused.contains("agentLeases.namespace is \"my-lb\", the release's own namespace"),
        "{refused}"
    );
}

/// The alerts of values.yaml are the rules file's, and an alert has a `threshold` value
/// exactly when its expression compares with one number: what the chart's `threshold`
/// replaces ([`default_values_render_the_kustomization`] checks that the defaults are the
/// file's numbers).
#[test]
fn every_alert_has_its_values() {
    let rules: yaml_serde::Value = yaml_serde::from_str(
        &std::fs::read_to_string(repo_root().join("charts/aliaslb/files/aliaslb.rules.yaml"))
            .unwrap(),
    )
    .unwrap();
    let values: yaml_serde::Value = yaml_serde::from_str(
        &std::fs::read_to_string(repo_root().join("charts/aliaslb/values.yaml")).unwrap(),
    )
    .unwrap();
    let alerts = values["monitoring"]["alerts"].as_mapping().unwrap();
    let mut in_rules = BTreeSet::new();
    for group in rules["groups"].as_sequence().unwrap() {
        for rule in group["rules"].as_sequence().unwrap() {
            let name = rule["alert"].as_str().unwrap();
            in_rules.insert(name.to_owned());
            let expr = rule["expr"].as_str().unwrap();
            // A comparison with a number: `> 0`, `>= 0.75` (not `== 1`, not `>= metric`).
            let numbers = expr
                .match_indices(['<', '>'])
                .filter(|(i, _)| {
                    let rest = expr[i + 1..].trim_start_matches('=');
                    rest.strip_prefix(' ')
                        .is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit()))
                })
                .count();
            let entry = &alerts[name];
            assert!(entry.is_mapping(), "monitoring.alerts.{name} is missing");
            assert_eq!(
                entry.get("threshold").is_some(),
                numbers == 1,
                "{name}: {numbers} comparison(s) with a number in {expr:?}"
            );
            assert_eq!(entry["for"], rule["for"], "{name}: for");
            assert_eq!(entry["severity"], rule["labels"]["severity"], "{name}");
        }
    }
    let in_values: BTreeSet<String> = alerts
        .keys()
        .map(|k| k.as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        in_values, in_rules,
        "monitoring.alerts and the rules' alerts"
    );
}

/// monitoring.alerts reaches the PrometheusRule: a disabled alert is gone, `for`,
/// `severity` and `threshold` replace the rule's, the other rules are the file's, and
/// promtool accepts the result.
#[test]
fn alert_values_reach_the_rules() {
    let sets = [
        "monitoring.enabled=true",
        "monitoring.alerts.AliaslbNoLeader.enabled=false",
        "monitoring.alerts.AliaslbPoolUsage85Percent.threshold=0.9",
        "monitoring.alerts.AliaslbPoolUsage85Percent.for=15m",
        "monitoring.alerts.AliaslbAgentNotRenewing.threshold=120",
        "monitoring.alerts.AliaslbAgentNotRenewing.severity=critical",
    ];
    let all = objects(&render(&sets), "alerts");
    let rule = object(&all, "PrometheusRule", NAMESPACE, "aliaslb");
    let defaults = objects(&render(&["monitoring.enabled=true"]), "default alerts");
    let default_rule = object(&defaults, "PrometheusRule", NAMESPACE, "aliaslb");
    let by_name = |rule: &Value| -> BTreeMap<String, Value> {
        rule["spec"]["groups"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|g| g["rules"].as_array().unwrap().clone())
            .map(|r| (r["alert"].as_str().unwrap().to_owned(), r))
            .collect()
    };
    let (got, want) = (by_name(rule), by_name(default_rule));
    assert!(!got.contains_key("AliaslbNoLeader"), "disabled");
    assert_eq!(got.len(), want.len() - 1);
    let usage = &got["AliaslbPoolUsage85Percent"];
    assert_eq!(usage["for"], "15m");
    assert!(
        usage["expr"].as_str().unwrap().contains(">= 0.9\n")
            && !usage["expr"].as_str().unwrap().contains("0.85"),
        "{usage}"
    );
    let renewing = &got["AliaslbAgentNotRenewing"];
    assert!(
        renewing["expr"].as_str().unwrap().contains("> 120"),
        "{renewing}"
    );
    assert_eq!(renewing["labels"]["severity"], "critical");
    for (name, r) in &got {
        if !["AliaslbPoolUsage85Percent", "AliaslbAgentNotRenewing"].contains(&name.as_str()) {
            assert_eq!(r, &want[name], "{name} is the file's");
        }
    }
    // promtool reads the PrometheusRule's groups as a rules file.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("rules.yaml");
    std::fs::write(&file, serde_json::to_string(&rule["spec"]).unwrap()).unwrap();
    let out = Command::new("promtool")
        .args(["check", "rules", &file.display().to_string()])
        .output()
        .unwrap_or_else(|e| panic!("running promtool ({e}): Debian's `prometheus` package"));
    assert!(
        out.status.success(),
        "promtool check rules:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The check the chart's pools.yaml suggests before an install or upgrade works: `helm
/// template -s templates/pools.yaml` piped to `aliaslb validate -` accepts the example and
/// refuses a broken pool.
#[test]
fn the_rendered_pools_pass_aliaslb_validate() {
    use std::io::Write as _;
    let chart = chart();
    let validate = |sets: &[&str]| {
        let mut args = vec!["template", RELEASE, &chart, "-s", "templates/pools.yaml"];
        for set in sets {
            args.extend(["--set-string", set]);
        }
        let pools = helm_ok(&args);
        let mut child = Command::new(env!("CARGO_BIN_EXE_aliaslb"))
            .args(["validate", "-"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(pools.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        (out.status.code(), String::from_utf8(out.stdout).unwrap())
    };
    let (code, out) = validate(&[]);
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("ConfigMap aliaslb-pools: valid"), "{out}");
    let (code, out) = validate(&["pools.default=192.168.55.300"]);
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("192.168.55.300"), "{out}");
}

/// The values cover the new pool syntax: named pools, their options, draining entries reach
/// the ConfigMap as written and mean what the controller's parser says; `aliaslb validate`
/// accepts the rendered ConfigMap.
#[test]
fn named_pools_in_the_values_reach_the_pool_configmap() {
    use std::io::Write as _;
    let values = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        values.path(),
        r#"
pools:
  default: null
  team-a: |
    10.0.1.0/28
    10.0.2.0/28 draining
  pool.internal: |
    10.0.3.0/24
  pool.public: |
    203.0.113.0/28
  config.yaml: |
    pools:
      pool.internal:
        namespaces: [team-a, team-b]
        namespaceSelector: {tier: internal}
      pool.public:
        namespaces: [team-a]
        announce: bgp
        autoAssign: false
"#,
    )
    .unwrap();
    let path = values.path().display().to_string();
    let chart = chart();
    let rendered = helm_ok(&[
        "template",
        RELEASE,
        &chart,
        "--namespace",
        NAMESPACE,
        "-f",
        &path,
    ]);
    let all = objects(&rendered, "named pools");
    let cm = object(&all, "ConfigMap", NAMESPACE, "aliaslb-pools");
    let data: BTreeMap<String, String> = serde_json::from_value(cm["data"].clone()).unwrap();
    assert_eq!(
        data.keys().collect::<Vec<_>>(),
        ["config.yaml", "pool.internal", "pool.public", "team-a"]
    );
    let config = PoolConfig::parse(&data).unwrap_or_else(|e| panic!("{e:?}"));
    let labels = BTreeMap::from([("tier".to_owned(), "internal".to_owned())]);
    let names = |ns: &str, labels: Option<&BTreeMap<String, String>>| {
        let tenancy = config.tenancy(ns, labels);
        let pools: Vec<String> = tenancy.pools().iter().map(|(k, _)| k.to_string()).collect();
        (pools, tenancy.default_pool().map(|(k, _)| k.to_string()))
    };
    assert_eq!(
        names("team-a", None),
        (
            vec![
                "team-a".into(),
                "pool.internal".into(),
                "pool.public".into()
            ],
            Some("team-a".into())
        )
    );
    assert_eq!(
        names("team-b", None),
        (vec!["pool.internal".into()], Some("pool.internal".into()))
    );
    assert_eq!(
        names("team-c", Some(&labels)),
        (vec!["pool.internal".into()], Some("pool.internal".into()))
    );
    let team_a = config.pool(&aliaslb_core::pool::PoolKey::Namespace("team-a".into()));
    assert!(team_a.is_some_and(|p| p.is_closed("10.0.2.3".parse().unwrap())));

    let pools = helm_ok(&[
        "template",
        RELEASE,
        &chart,
        "-f",
        &path,
        "-s",
        "templates/pools.yaml",
    ]);
    let mut child = Command::new(env!("CARGO_BIN_EXE_aliaslb"))
        .args(["validate", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(pools.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let out = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.contains("ConfigMap aliaslb-pools: valid, 3 pools"),
        "{out}"
    );
    assert!(
        out.contains("pool.public: 1 entry, 14 IPv4 and 0 IPv6 addresses, for namespaces team-a, only on request (autoAssign: false)"),
        "{out}"
    );
    assert!(
        out.contains("team-a: 2 entries, 28 IPv4 and 0 IPv6 addresses, 1 entry draining"),
        "{out}"
    );
}

fn object<'a>(all: &'a Objects, kind: &str, ns: &str, name: &str) -> &'a Value {
    all.iter()
        .find(|((_, k, n, m), _)| k == kind && n == ns && m == name)
        .map(|(_, v)| v)
        .unwrap_or_else(|| panic!("no {kind} {ns}/{name} in {:?}", all.keys()))
}

/// The containers of every workload's pod template: (workload, container) -> container.
fn containers(all: &Objects) -> BTreeMap<(String, String), Value> {
    all.iter()
        .filter(|((_, kind, _, _), _)| kind == "Deployment" || kind == "DaemonSet")
        .flat_map(|((_, _, _, name), o)| {
            o["spec"]["template"]["spec"]["containers"]
                .as_array()
                .unwrap()
                .iter()
                .map(move |c| {
                    let cname = c["name"].as_str().unwrap().to_owned();
                    ((name.clone(), cname), c.clone())
                })
        })
        .collect()
}

#[test]
fn values_reach_their_objects() {
    let values = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        values.path(),
        r#"
image:
  repository: registry.example/aliaslb
  tag: "1.2.3"
  pullPolicy: Always
pools:
  default: null
  team-a: |
    10.0.7.0/29
  _fallback: |
    10.0.8.20-10.0.8.40
imagePullSecrets:
  - name: my-registry
controller:
  replicas: 3
  image:
    tag: "1.2.2"
  logLevel: debug
  extraArgs: [--hold-released=5m]
  resources:
    requests:
      memory: 256Mi
    limits:
      memory: 512Mi
  nodeSelector:
    example.com/role: infra
  tolerations:
    - key: example.com/infra
      operator: Exists
  affinity:
    nodeAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
        nodeSelectorTerms:
          - matchExpressions:
              - {key: example.com/role, operator: In, values: [infra]}
  priorityClassName: infra-critical
  podAnnotations:
    example.com/scrape: "yes"
  podLabels:
    team: network
  podDisruptionBudget:
    minAvailable: 2
agent:
  image:
    repository: registry.example/aliaslb-next
  logLevel: info,aliaslb_agent=debug
  extraArgs: [--interface=eth1]
  resources:
    limits:
      memory: 256Mi
  tolerations: []
  nodeSelector:
    example.com/lan: edge
  affinity:
    nodeAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
        nodeSelectorTerms:
          - matchExpressions:
              - {key: example.com/lan, operator: Exists}
  priorityClassName: ""
  podAnnotations:
    example.com/agent: "yes"
  podLabels:
    team: network
monitoring:
  enabled: true
  labels:
    release: kube-prometheus-stack
birdSidecar:
  enabled: true
  image:
    repository: registry.example/bird
    tag: "2.0.12-1"
  config: |
    router id 10.0.9.1;
"#,
    )
    .unwrap();
    let chart = chart();
    let file = values.path().display().to_string();
    let all = objects(
        &helm_ok(&["template", RELEASE, &chart, "-n", NAMESPACE, "-f", &file]),
        "helm template -f values",
    );

    let images: BTreeMap<_, _> = containers(&all)
        .into_iter()
        .map(|(k, c)| (k, (c["image"].clone(), c["imagePullPolicy"].clone())))
        .collect();
    let pair = |a: &str, b: &str| (a.to_owned(), b.to_owned());
    // The components' own image values win over `image` (a staged upgrade).
    assert_eq!(
        images[&pair("aliaslb-controller", "controller")],
        (
            Value::from("registry.example/aliaslb:1.2.2"),
            Value::from("Always")
        )
    );
    assert_eq!(
        images[&pair("aliaslb-agent", "agent")],
        (
            Value::from("registry.example/aliaslb-next:1.2.3"),
            Value::from("Always")
        )
    );
    assert_eq!(
        images[&pair("aliaslb-agent", "bird")],
        (Value::from("registry.example/bird:2.0.12-1"), Value::Null)
    );
    let deploy = object(&all, "Deployment", NAMESPACE, "aliaslb-controller");
    assert_eq!(deploy["spec"]["replicas"], 3);
    // Placement, pull secrets, log level, flags, pod metadata: on both pods.
    let ds = object(&all, "DaemonSet", NAMESPACE, "aliaslb-agent");
    for (workload, container, template, log, arg, selector, annotation) in [
        (
            "aliaslb-controller",
            "controller",
            &deploy["spec"]["template"],
            "debug",
            "--hold-released=5m",
            ("example.com/role", "infra"),
            "example.com/scrape",
        ),
        (
            "aliaslb-agent",
            "agent",
            &ds["spec"]["template"],
            "info,aliaslb_agent=debug",
            "--interface=eth1",
            ("example.com/lan", "edge"),
            "example.com/agent",
        ),
    ] {
        let pod = &template["spec"];
        assert_eq!(
            pod["imagePullSecrets"],
            json!([{"name": "my-registry"}]),
            "{workload}"
        );
        assert_eq!(pod["nodeSelector"][selector.0], selector.1, "{workload}");
        assert!(pod["affinity"]["nodeAffinity"].is_object(), "{workload}");
        assert!(
            pod["affinity"]["podAntiAffinity"].is_null(),
            "{workload}: a given affinity replaces the default"
        );
        assert_eq!(template["metadata"]["labels"]["team"], "network");
        assert_eq!(
            template["metadata"]["labels"]["app.kubernetes.io/name"],
            workload
        );
        assert_eq!(template["metadata"]["annotations"][annotation], "yes");
        let c = &containers(&all)[&pair(workload, container)];
        let env = c["env"].as_array().unwrap();
        assert!(
            env.contains(&json!({"name": "RUST_LOG", "value": log})),
            "{workload}: {env:?}"
        );
        assert!(
            c["args"].as_array().unwrap().contains(&Value::from(arg)),
            "{workload}"
        );
    }
    assert_eq!(
        deploy["spec"]["template"]["spec"]["priorityClassName"],
        "infra-critical"
    );
    assert_eq!(
        ds["spec"]["template"]["spec"]["priorityClassName"],
        Value::Null,
        "agent.priorityClassName: \"\" drops the default"
    );
    assert_eq!(
        deploy["spec"]["template"]["spec"]["tolerations"][0]["key"],
        "example.com/infra"
    );
    assert_eq!(
        containers(&all)[&pair("aliaslb-agent", "agent")]["resources"],
        json!({"requests": {"cpu": "20m", "memory": "32Mi"}, "limits": {"memory": "256Mi"}})
    );
    let pdb = object(&all, "PodDisruptionBudget", NAMESPACE, "aliaslb-controller");
    assert_eq!(pdb["spec"]["minAvailable"], 2);
    let no_pdb = objects(
        &render(&["controller.podDisruptionBudget.enabled=false"]),
        "no PDB",
    );
    assert!(
        !no_pdb
            .keys()
            .any(|(_, kind, _, _)| kind == "PodDisruptionBudget")
    );
    let resources = &containers(&all)[&pair("aliaslb-controller", "controller")]["resources"];
    assert_eq!(
        resources,
        &json!({"requests": {"cpu": "50m", "memory": "256Mi"}, "limits": {"memory": "512Mi"}}),
        "controller.resources: Helm merges the given map into the default one, key by key"
    );
    let agent_pod =
        &object(&all, "DaemonSet", NAMESPACE, "aliaslb-agent")["spec"]["template"]["spec"];
    assert_eq!(
        agent_pod["tolerations"],
        Value::Null,
        "agent.tolerations: []"
    );
    assert_eq!(agent_pod["nodeSelector"]["example.com/lan"], "edge");

    // The pools replace the example's key and parse with the controller's own parser.
    let cm = object(&all, "ConfigMap", NAMESPACE, "aliaslb-pools");
    let data: BTreeMap<String, String> = serde_json::from_value(cm["data"].clone()).unwrap();
    assert_eq!(
        data.keys().collect::<Vec<_>>(),
        ["_fallback", "team-a"],
        "pools.default: null drops the example"
    );
    let config = PoolConfig::parse(&data).unwrap_or_else(|e| panic!("{e:?}"));
    let (_, pool) = config.pool_for_namespace("team-a").expect("team-a's pool");
    assert!(pool.contains("10.0.7.5".parse().unwrap()));
    let (_, fallback) = config.pool_for_namespace("other").expect("the fallback");
    assert!(fallback.contains("10.0.8.30".parse().unwrap()));

    for (kind, name) in [
        ("PrometheusRule", "aliaslb"),
        ("PodMonitor", "aliaslb-controller"),
        ("PodMonitor", "aliaslb-agent"),
    ] {
        let labels = &object(&all, kind, NAMESPACE, name)["metadata"]["labels"];
        assert_eq!(labels["release"], "kube-prometheus-stack", "{kind} {name}");
        assert_eq!(
            labels["app.kubernetes.io/part-of"], "aliaslb",
            "{kind} {name}"
        );
    }

    // BIRD's own configuration, under a name that follows its content, which the
    // DaemonSet mounts.
    let bird: Vec<&Value> = all
        .iter()
        .filter(|((_, k, _, n), _)| k == "ConfigMap" && n.starts_with("aliaslb-bird-"))
        .map(|(_, v)| v)
        .collect();
    assert_eq!(bird.len(), 1);
    assert_eq!(bird[0]["data"]["bird.conf"], "router id 10.0.9.1;\n");
    let example = objects(&render(&["birdSidecar.enabled=true"]), "bird example");
    let example_name = example
        .keys()
        .find(|(_, k, _, n)| k == "ConfigMap" && n.starts_with("aliaslb-bird-"))
        .map(|k| k.3.clone())
        .unwrap();
    let name = bird[0]["metadata"]["name"].as_str().unwrap();
    assert_ne!(name, example_name, "a changed bird.conf gets a new name");
    let volumes = ds["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap();
    assert!(
        volumes.iter().any(|v| v["configMap"]["name"] == name),
        "{volumes:?}"
    );
}

/// `kubectl get` of every object in `yaml`: the ones that exist, as `kind/name` lines
/// (`--ignore-not-found`).
fn live(env: &TestEnv, manifest: &Path) -> BTreeSet<String> {
    env.kubectl(&[
        "get",
        "-f",
        &manifest.display().to_string(),
        "--ignore-not-found",
        "-o",
        "name",
    ])
    .lines()
    .map(str::to_owned)
    .collect()
}

/// `kind/name` of each object, as `kubectl get -o name` prints it.
fn names(all: &Objects) -> BTreeSet<String> {
    all.keys()
        .map(|(api, kind, _, name)| {
            let group = api.split_once('/').map(|(g, _)| g).unwrap_or("");
            let kind = kind.to_lowercase();
            if group.is_empty() {
                format!("{kind}/{name}")
            } else {
                format!("{kind}.{group}/{name}")
            }
        })
        .collect()
}

fn json_of(env: &TestEnv, args: &[&str]) -> Value {
    let mut all = vec!["get"];
    all.extend_from_slice(args);
    all.extend(["-o", "json"]);
    serde_json::from_str(&env.kubectl(&all)).unwrap()
}

/// Waits until `done` holds, for at most `timeout`.
fn wait(what: &str, timeout: Duration, mut done: impl FnMut() -> Result<(), String>) {
    let deadline = Instant::now() + timeout;
    loop {
        match done() {
            Ok(()) => return,
            Err(why) if Instant::now() > deadline => panic!("{what}: still {why}"),
            Err(_) => std::thread::sleep(Duration::from_millis(250)),
        }
    }
}

/// helm against testenv's kube-apiserver as the admin (kube-controller-manager runs, so that
/// deleted namespaces finish deleting).
struct Helm<'a> {
    env: &'a TestEnv,
    kubeconfig: String,
    chart: String,
    dir: tempfile::TempDir,
}

impl Helm<'_> {
    /// `helm VERB ARGS` for the release, printing how long it took.
    fn run(&self, verb: &str, args: &[&str]) -> String {
        let t0 = Instant::now();
        let mut all = vec![verb];
        all.extend_from_slice(args);
        all.extend(["--kubeconfig", &self.kubeconfig, "--namespace", NAMESPACE]);
        let out = helm_ok(&all);
        println!("helm {verb}: {:.2} s", t0.elapsed().as_secs_f64());
        out
    }

    /// The release's manifest (`helm get manifest`), as a file for `kubectl get -f` and as
    /// objects.
    fn manifest(&self, name: &str) -> (PathBuf, Objects) {
        let text = self.run("get", &["manifest", RELEASE]);
        let path = self.dir.path().join(name);
        std::fs::write(&path, &text).unwrap();
        (path, objects(&text, name))
    }

    /// Asserts that every object of the release exists and carries Helm's ownership
    /// metadata next to the chart's own labels.
    fn assert_owned(&self, manifest: &Path, all: &Objects) {
        assert_eq!(
            live(self.env, manifest),
            names(all),
            "the release's objects exist"
        );
        for (kind, ns, name) in [
            ("namespace", "", "aliaslb-agents"),
            ("clusterrole", "", "aliaslb-controller"),
            ("configmap", NAMESPACE, "aliaslb-pools"),
            ("daemonset", NAMESPACE, "aliaslb-agent"),
        ] {
            let mut args = vec![kind, name];
            if !ns.is_empty() {
                args.extend(["-n", ns]);
            }
            let meta = &json_of(self.env, &args)["metadata"];
            assert_eq!(
                meta["labels"]["app.kubernetes.io/managed-by"], "Helm",
                "{kind} {name}"
            );
            assert_eq!(
                meta["annotations"]["meta.helm.sh/release-name"], RELEASE,
                "{kind} {name}"
            );
            assert_eq!(
                meta["annotations"]["meta.helm.sh/release-namespace"], NAMESPACE,
                "{kind} {name}"
            );
            assert_eq!(
                meta["labels"]["app.kubernetes.io/part-of"], "aliaslb",
                "{kind} {name}: the chart's own labels"
            );
        }
        let ns = json_of(self.env, &["namespace", "aliaslb-agents"]);
        assert_eq!(
            ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"], "restricted",
            "the chart's Pod Security label"
        );
    }

    /// Uninstalls and waits until every object of `manifest` is gone, namespaces included.
    fn uninstall(&self, manifest: &Path) {
        self.run("uninstall", &[RELEASE]);
        wait(
            "the release's objects to go",
            Duration::from_secs(60),
            || {
                let left = live(self.env, manifest);
                if left.is_empty() {
                    Ok(())
                } else {
                    Err(format!("{left:?}"))
                }
            },
        );
        let releases = self.run("list", &["--all", "-q"]);
        assert!(releases.trim().is_empty(), "no release left: {releases}");
    }
}

/// A fresh install, upgrades (image, pools, the BIRD sidecar on, then back to the defaults)
/// and the uninstall; then the migration from `kubectl apply -k manifests/`: `helm install
/// --take-ownership` adopts the objects kustomize made, and the uninstall removes them. The
/// objects are the rendered ones, carry Helm's ownership, change with the values and are all
/// gone after each uninstall.
#[tokio::test(flavor = "multi_thread")]
async fn install_upgrade_uninstall() {
    let env = TestEnv::global();
    let _kcm = env.start_controller_manager().await.unwrap();
    let releases = Helm {
        env,
        kubeconfig: env.kubeconfig_path().display().to_string(),
        chart: chart(),
        dir: tempfile::tempdir().unwrap(),
    };
    let chart = releases.chart.clone();

    // A fresh install as earlier releases made it (no agent Lease policy, no Lease quota),
    // into a namespace helm makes (as docs/operations.md says).
    let earlier = [
        "admissionPolicies.agentLease.enabled=false",
        "agent.leaseQuota=0",
    ];
    let mut args = vec![RELEASE, chart.as_str(), "--create-namespace"];
    for set in &earlier {
        args.extend(["--set", set]);
    }
    releases.run("install", &args);
    let (earlier_file, earlier_objects) = releases.manifest("earlier.yaml");
    assert_same_objects(
        &objects(&render(&earlier), "helm template"),
        &earlier_objects,
        "helm get manifest after install",
    );
    releases.assert_owned(&earlier_file, &earlier_objects);
    // Upgraded to this release's defaults: the policy and the quota are installed.
    releases.run("upgrade", &[RELEASE, &chart, "--reset-values"]);
    let (installed_file, installed) = releases.manifest("installed.yaml");
    assert_same_objects(
        &objects(&render(&[]), "helm template"),
        &installed,
        "helm get manifest after the upgrade to the defaults",
    );
    assert_eq!(live(env, &installed_file), names(&installed), "installed");
    for object in [
        "validatingadmissionpolicy.admissionregistration.k8s.io/aliaslb-agent-own-lease",
        "resourcequota/aliaslb-agent-leases",
    ] {
        assert!(names(&installed).contains(object), "{object} installed");
    }
    releases.assert_owned(&installed_file, &installed);

    // Upgrade: a new image tag, one more pool address, the BIRD sidecar and the optional
    // admission policy on (the apiserver compiles their CEL).
    let upgrade = releases.dir.path().join("upgrade.yaml");
    std::fs::write(
        &upgrade,
        "image:\n  tag: 0.1.1\npools:\n  default: |\n    192.168.55.10\n    192.168.55.11\n    192.168.55.12\n    192.168.55.13\nbirdSidecar:\n  enabled: true\nadmissionPolicies:\n  agentLease:\n    enabled: true\n  serviceAnnotations:\n    enabled: true\n",
    )
    .unwrap();
    let upgrade_arg = upgrade.display().to_string();
    releases.run("upgrade", &[RELEASE, &chart, "-f", &upgrade_arg]);
    let (upgraded_file, upgraded) = releases.manifest("upgraded.yaml");
    assert_eq!(live(env, &upgraded_file), names(&upgraded), "upgraded");
    let deploy = json_of(env, &["deployment", "-n", NAMESPACE, "aliaslb-controller"]);
    assert_eq!(
        deploy["spec"]["template"]["spec"]["containers"][0]["image"],
        "ghcr.io/aliaslb/aliaslb:0.1.1"
    );
    let ds = json_of(env, &["daemonset", "-n", NAMESPACE, "aliaslb-agent"]);
    let ds_containers: Vec<&str> = ds["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(ds_containers, ["agent", "bird"]);
    let pools = json_of(env, &["configmap", "-n", NAMESPACE, "aliaslb-pools"]);
    let data: BTreeMap<String, String> = serde_json::from_value(pools["data"].clone()).unwrap();
    let config = PoolConfig::parse(&data).unwrap_or_else(|e| panic!("{e:?}"));
    let (_, pool) = config.pool_for_namespace("default").unwrap();
    assert_eq!(pool.size(aliaslb_core::range::Family::V4), 4);
    let bird: Vec<String> = names(&upgraded)
        .into_iter()
        .filter(|n| n.starts_with("configmap/aliaslb-bird-"))
        .collect();
    assert_eq!(bird.len(), 1, "{:?}", upgraded.keys());
    for policy in ["aliaslb-agent-own-lease", "aliaslb-service-annotations"] {
        let kind = "validatingadmissionpolicy.admissionregistration.k8s.io";
        assert!(
            names(&upgraded).contains(&format!("{kind}/{policy}")),
            "{policy} is installed"
        );
    }

    // Back to the defaults: the sidecar and its ConfigMap go.
    releases.run("upgrade", &[RELEASE, &chart, "--reset-values"]);
    let (_, reset) = releases.manifest("reset.yaml");
    assert_same_objects(&installed, &reset, "after --reset-values");
    let bird_file = releases.dir.path().join("bird.yaml");
    std::fs::write(
        &bird_file,
        format!(
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {}\n  namespace: {NAMESPACE}\n",
            bird[0].trim_start_matches("configmap/")
        ),
    )
    .unwrap();
    assert!(
        live(env, &bird_file).is_empty(),
        "the BIRD ConfigMap is gone"
    );

    // A hand edit of a pool the chart sets is written back by the next upgrade (NOTES.txt
    // says so); a key the chart does not set stays.
    let edit = r#"{"data":{"default":"192.168.55.99\n","hand-made":"192.168.55.98\n"}}"#;
    env.kubectl(&[
        "patch",
        "configmap",
        "-n",
        NAMESPACE,
        "aliaslb-pools",
        "--type",
        "merge",
        "-p",
        edit,
    ]);
    releases.run("upgrade", &[RELEASE, &chart, "--reuse-values"]);
    let pools = json_of(env, &["configmap", "-n", NAMESPACE, "aliaslb-pools"]);
    assert_eq!(
        pools["data"]["default"], "192.168.55.10\n192.168.55.11\n192.168.55.12\n",
        "the chart's pool is back"
    );
    assert_eq!(pools["data"]["hand-made"], "192.168.55.98\n", "{pools}");

    let history: Value =
        serde_json::from_str(&releases.run("history", &[RELEASE, "-o", "json"])).unwrap();
    assert_eq!(history.as_array().map(Vec::len), Some(5), "{history}");

    releases.uninstall(&installed_file);

    // Migration: the objects of `kubectl apply -k manifests/`, adopted by the release.
    let manifests = repo_root().join("manifests").display().to_string();
    env.kubectl(&["apply", "-k", &manifests]);
    let conflict = helm(&[
        "install",
        RELEASE,
        &chart,
        "--kubeconfig",
        &releases.kubeconfig,
        "--namespace",
        NAMESPACE,
    ])
    .expect_err("without --take-ownership, helm refuses objects it does not own");
    assert!(
        conflict.contains("exists and cannot be imported"),
        "{conflict}"
    );
    releases.run("install", &[RELEASE, &chart, "--take-ownership"]);
    let (adopted_file, adopted) = releases.manifest("adopted.yaml");
    assert_same_objects(&installed, &adopted, "the adopted release");
    releases.assert_owned(&adopted_file, &adopted);
    releases.uninstall(&adopted_file);
}
