//! `kubectl aliaslb`: the `aliaslb` binary linked as `kubectl-aliaslb` and
//! `kubectl_complete-aliaslb` on PATH, run by the real kubectl of the test release against
//! the real kube-apiserver, with the in-process controller and fake agents placing the
//! Services.
//!
//! - `pools` counts a pool's addresses, those in use and the Services waiting for one;
//! - `explain` says why a Service is pending (and what to do) and why it is on its node;
//! - `simulate cordon` predicts exactly the moves the controller then makes when the node
//!   is really cordoned, and changes nothing itself;
//! - `validate` and `status` answer as the plugin, and kubectl completes the plugin's
//!   commands through `kubectl_complete-aliaslb`;
//! - kubectl's habits: `--kubeconfig`, `--context` (and its namespace), `-n`/`-A`, `-o
//!   json|yaml|wide`, the filters `--pool`, `--node`, `--problems`; `check` says what is
//!   wrong worst first and exits 1, then 0 once nothing is; `bundle` dumps our objects,
//!   Events, reports and status with every Secret value redacted; kubectl completes
//!   Service, Node, pool, namespace and context names; `version` names each release the
//!   cluster runs (its Pods' image tags) and says the skew.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::core::v1::{Node, Pod, Service, ServiceAccount};
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};
use support::*;

/// A folder with the plugin links, first on the PATH the tests give kubectl.
struct PluginPath {
    dir: tempfile::TempDir,
}

impl PluginPath {
    fn new() -> PluginPath {
        let dir = tempfile::tempdir().unwrap();
        let bin = Path::new(env!("CARGO_BIN_EXE_aliaslb"));
        for link in ["kubectl-aliaslb", "kubectl_complete-aliaslb"] {
            std::os::unix::fs::symlink(bin, dir.path().join(link)).unwrap();
        }
        PluginPath { dir }
    }

    /// `kubectl ARGS` with the plugin on PATH: exit success, stdout, stderr.
    fn kubectl(&self, c: &Cluster, args: &[&str]) -> (bool, String, String) {
        let kubectl: PathBuf =
            aliaslb_testenv::binary("kubectl").unwrap_or_else(|_| PathBuf::from("kubectl"));
        let path = std::env::join_paths(std::iter::once(self.dir.path().to_owned()).chain(
            std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
        ))
        .unwrap();
        let out = Command::new(&kubectl)
            .args(args)
            .env("PATH", path)
            .env("KUBECONFIG", c.env.kubeconfig_path())
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", kubectl.display()));
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// `kubectl aliaslb ARGS --controller-namespace SYSTEM --agent-namespace SYSTEM`;
    /// panics unless it succeeds; its stdout.
    fn aliaslb(&self, c: &Cluster, args: &[&str]) -> String {
        let mut all = vec!["aliaslb"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--controller-namespace", &c.system]);
        all.extend_from_slice(&["--agent-namespace", &c.system]);
        let (ok, stdout, stderr) = self.kubectl(c, &all);
        assert!(ok, "kubectl {all:?} failed:\n{stdout}{stderr}");
        stdout
    }
}

/// The cells of `table`'s row whose first cell is `first`.
fn row<'t>(table: &'t str, first: &str) -> Vec<&'t str> {
    table
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|cells| cells.first() == Some(&first))
        .unwrap_or_else(|| panic!("no row {first} in:\n{table}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_aliaslb_pools_explain_simulate_as_the_controller_does() {
    let _serial = serial().await;
    let c = Cluster::new("plugin").await;
    c.set_pool(&[(c.ns.as_str(), "10.79.0.1-10.79.0.4")]).await;
    let n1 = c.node("n1").await;
    let n2 = c.node("n2").await;
    let n3 = c.node("n3").await;
    let _agents = [c.fake_agent(&n1), c.fake_agent(&n2), c.fake_agent(&n3)];
    let (controller, _metrics) = c.start_controller();
    let plugin = PluginPath::new();
    let nodes = [n1.as_str(), n2.as_str(), n3.as_str()];

    for name in ["a", "b", "c"] {
        c.create(lb_service(name)).await;
        c.wait_condition(name, "aliaslb.io/Announced", "Announced")
            .await;
    }
    // pools: 4 addresses, 3 in use, none waiting.
    let pools = plugin.aliaslb(&c, &["pools"]);
    assert_eq!(
        row(&pools, &c.ns),
        [c.ns.as_str(), "IPv4", "4", "3", "0", "1", "75.0%", "0"],
        "{pools}"
    );

    // Two more: the pool runs out, the last one waits.
    c.create(lb_service("d")).await;
    c.wait_condition("d", "aliaslb.io/Announced", "Announced")
        .await;
    c.create(lb_service("e")).await;
    c.wait_condition("e", "aliaslb.io/IPAllocated", "PoolExhausted")
        .await;
    let pools = plugin.aliaslb(&c, &["pools"]);
    assert_eq!(
        row(&pools, &c.ns),
        [c.ns.as_str(), "IPv4", "4", "4", "0", "0", "100.0%", "1"],
        "{pools}"
    );
    let json: Value = serde_json::from_str(&plugin.aliaslb(&c, &["pools", "-o", "json"])).unwrap();
    assert_eq!(json["pools"][0]["inUse"], json!(4), "{json}");

    // explain: the pending one says why and what to do; a placed one says where and why.
    let pending = plugin.aliaslb(&c, &["explain", "svc/e", "-n", &c.ns]);
    assert!(pending.contains("It is pending:"), "{pending}");
    assert!(pending.contains("(PoolExhausted)"), "{pending}");
    assert!(pending.contains("Add addresses to the pool"), "{pending}");
    let ip_a = c.ips("a").await[0].clone();
    let holder_a = c.holder_of(&nodes, &ip_a).await.unwrap();
    let placed = plugin.aliaslb(&c, &["explain", "svc/a", "-n", &c.ns]);
    assert!(placed.contains(&format!("It has {ip_a}")), "{placed}");
    assert!(
        placed.contains(&format!("{holder_a} carries it and stays eligible")),
        "{placed}"
    );
    assert!(placed.contains(&format!("pool `{}`", c.ns)), "{placed}");
    let (ok, _, err) = plugin.kubectl(&c, &["aliaslb", "explain", "pod/a", "-n", &c.ns]);
    assert!(!ok && err.contains("only Services"), "{err}");

    // simulate cordon on a node that carries something, as JSON.
    let mut holders = std::collections::BTreeMap::new();
    for name in ["a", "b", "c", "d"] {
        let ip = c.ips(name).await[0].clone();
        holders.insert(name, (ip.clone(), c.holder_of(&nodes, &ip).await.unwrap()));
    }
    let target = holders["a"].1.clone();
    let sim: Value =
        serde_json::from_str(&plugin.aliaslb(&c, &["simulate", "cordon", &target, "-o", "json"]))
            .unwrap();
    let moves = sim["moves"].as_array().unwrap().clone();
    let moving: Vec<&str> = holders
        .iter()
        .filter(|(_, (_, node))| *node == target)
        .map(|(name, _)| *name)
        .collect();
    assert_eq!(
        moves.len(),
        moving.len(),
        "every Service on {target} moves, no other: {sim}"
    );
    // Nothing changed: still there.
    assert_eq!(
        c.holder_of(&nodes, &holders["a"].0).await,
        Some(target.clone())
    );
    let table = plugin.aliaslb(&c, &["simulate", "cordon", &target]);
    assert!(
        table.starts_with(&format!(
            "cordon {target}: {} of 5 Service(s) would move",
            moves.len()
        )),
        "{table}"
    );

    // Cordon it for real: the controller makes exactly the simulated moves.
    Api::<Node>::all(c.client.clone())
        .patch(
            &target,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"unschedulable": true}})),
        )
        .await
        .unwrap();
    for m in &moves {
        let name = m["service"].as_str().unwrap();
        let to = m["to"].as_str().unwrap_or_else(|| panic!("{m}"));
        let ip = m["ips"][0].as_str().unwrap();
        assert_eq!(m["ipsAfter"], m["ips"], "a cordon renumbers nothing: {m}");
        eventually(SETTLE, &format!("{name} ({ip}) on {to}"), async || {
            c.holder_of(&nodes, ip).await.as_deref() == Some(to)
        })
        .await;
    }
    for (name, (ip, node)) in &holders {
        if *node != target {
            assert_eq!(
                c.holder_of(&nodes, ip).await.as_deref(),
                Some(node.as_str()),
                "{name} was not to move"
            );
        }
    }
    let after = plugin.aliaslb(&c, &["explain", "svc/a", "-n", &c.ns]);
    assert!(after.contains(&format!("{target} (cordoned)")), "{after}");

    // explain names the node of the controller's assignment objects, never the annotation
    // a tenant can write (here with no controller to take it back).
    drop(controller);
    let (ip_b, holder_b) = holders["b"].clone();
    let holder_b = c.holder_of(&nodes, &ip_b).await.unwrap_or(holder_b);
    let fake = nodes.iter().find(|n| **n != holder_b).unwrap();
    Api::<Service>::namespaced(c.client.clone(), &c.ns)
        .patch(
            "b",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"aliaslb.io/node": fake}}})),
        )
        .await
        .unwrap();
    let fooled = plugin.aliaslb(&c, &["explain", "svc/b", "-n", &c.ns]);
    assert!(
        fooled.contains(&format!("{holder_b} carries it")),
        "explain must name {holder_b}, not the annotation's {fake}:\n{fooled}"
    );

    c.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_aliaslb_validates_shows_status_and_completes() {
    let _serial = serial().await;
    let c = Cluster::new("plugin-kit").await;
    c.set_pool(&[(c.ns.as_str(), "10.79.1.1-10.79.1.2")]).await;
    let plugin = PluginPath::new();

    // Usage reads as the user typed it.
    let (ok, help, _) = plugin.kubectl(&c, &["aliaslb", "--help"]);
    assert!(ok && help.contains("Usage: kubectl aliaslb"), "{help}");

    // validate: an invalid file is refused with its line.
    let bad = plugin.dir.path().join("pools.yaml");
    std::fs::write(
        &bad,
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: aliaslb-pools\ndata:\n  team-a: |\n    10.0.0.300\n",
    )
    .unwrap();
    let (ok, out, _) = plugin.kubectl(&c, &["aliaslb", "validate", bad.to_str().unwrap()]);
    assert!(!ok, "an invalid file passes: {out}");
    assert!(out.contains("pools.yaml:7:"), "{out}");

    // status: today's table, as the plugin.
    let status = plugin.aliaslb(&c, &["status"]);
    assert!(status.contains("10.79.1.1"), "{status}");

    // Completion through kubectl: commands, then a command's subcommands and flags.
    let (ok, out, err) = plugin.kubectl(&c, &["__complete", "aliaslb", "s"]);
    assert!(ok, "{err}");
    let words: Vec<&str> = out.lines().map(|l| l.split('\t').next().unwrap()).collect();
    assert!(
        words.contains(&"status") && words.contains(&"simulate"),
        "{out}"
    );
    assert!(
        !words.contains(&"pools"),
        "`s` completes only what starts with it: {out}"
    );
    assert!(out.lines().any(|l| l == ":4"), "no file completion: {out}");
    let (_, out, _) = plugin.kubectl(&c, &["__complete", "aliaslb", "simulate", ""]);
    assert!(
        out.contains("cordon") && out.contains("agent-lost"),
        "{out}"
    );
    let (_, out, _) = plugin.kubectl(&c, &["__complete", "aliaslb", "pools", "--o"]);
    assert!(out.contains("--output"), "{out}");

    // And a completion script for the shell, for `aliaslb` itself.
    let script = Command::new(env!("CARGO_BIN_EXE_aliaslb"))
        .args(["completion", "bash"])
        .output()
        .unwrap();
    assert!(script.status.success());
    let script = String::from_utf8(script.stdout).unwrap();
    assert!(
        script.contains("complete -F") && script.contains("explain"),
        "{script}"
    );
    c.cleanup().await;
}

impl PluginPath {
    /// `kubectl aliaslb ARGS --controller-namespace SYSTEM --agent-namespace SYSTEM`: exit
    /// code, stdout, stderr.
    fn run(&self, c: &Cluster, args: &[&str]) -> (i32, String, String) {
        let kubectl: PathBuf =
            aliaslb_testenv::binary("kubectl").unwrap_or_else(|_| PathBuf::from("kubectl"));
        let path = std::env::join_paths(std::iter::once(self.dir.path().to_owned()).chain(
            std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
        ))
        .unwrap();
        let mut all = vec!["aliaslb"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["--controller-namespace", &c.system]);
        all.extend_from_slice(&["--agent-namespace", &c.system]);
        let out = Command::new(&kubectl)
            .args(&all)
            .env("PATH", path)
            .env("KUBECONFIG", c.env.kubeconfig_path())
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", kubectl.display()));
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// The completion candidates kubectl offers for the last of `args` (`kubectl
    /// __complete aliaslb ARGS`), without kubectl's directive line.
    fn complete(&self, c: &Cluster, args: &[&str]) -> Vec<String> {
        let mut all = vec!["__complete", "aliaslb"];
        all.extend_from_slice(args);
        let (ok, out, err) = self.kubectl(c, &all);
        assert!(ok, "kubectl {all:?}: {err}");
        out.lines()
            .filter(|l| !l.starts_with(':') && !l.is_empty())
            .map(|l| l.split('\t').next().unwrap_or_default().to_owned())
            .collect()
    }
}

/// A kubeconfig with the test cluster's context `good` (namespace `namespace`), and a
/// current context `broken` whose server refuses connections.
fn two_contexts(c: &Cluster, dir: &Path, namespace: &str) -> PathBuf {
    use kube::config::{Context, Kubeconfig, NamedCluster, NamedContext};
    let mut k = Kubeconfig::read_from(c.env.kubeconfig_path()).unwrap();
    let good = k.contexts[0].context.clone().unwrap();
    k.clusters.push(NamedCluster {
        name: "nowhere".into(),
        cluster: Some(kube::config::Cluster {
            server: Some("https://127.0.0.1:1".into()),
            insecure_skip_tls_verify: Some(true),
            ..kube::config::Cluster::default()
        }),
        other: Default::default(),
    });
    k.contexts = vec![
        NamedContext {
            name: "good".into(),
            context: Some(Context {
                namespace: Some(namespace.into()),
                ..good.clone()
            }),
            other: Default::default(),
        },
        NamedContext {
            name: "broken".into(),
            context: Some(Context {
                cluster: "nowhere".into(),
                ..good
            }),
            other: Default::default(),
        },
    ];
    k.current_context = Some("broken".into());
    let path = dir.join("two-contexts.yaml");
    std::fs::write(&path, yaml_serde::to_string(&k).unwrap()).unwrap();
    path
}

/// A fresh leader Lease, as the elected controller keeps it (the in-process controller of
/// these tests leads without one).
async fn leader_lease(c: &Cluster) {
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    let lease: Lease = serde_json::from_value(json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "aliaslb-controller"},
        "spec": {
            "holderIdentity": "test-controller",
            "leaseDurationSeconds": 600,
            "renewTime": MicroTime(k8s_openapi::jiff::Timestamp::now()),
        },
    }))
    .unwrap();
    Api::<Lease>::namespaced(c.client.clone(), &c.system)
        .patch(
            "aliaslb-controller",
            &PatchParams::apply("test").force(),
            &Patch::Apply(&lease),
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_aliaslb_behaves_like_kubectl() {
    let _serial = serial().await;
    let c = Cluster::new("habits").await;
    let other = c.env.create_namespace(&c.client, "habits-b").await;
    c.set_pool(&[
        (c.ns.as_str(), "10.79.2.1-10.79.2.2"),
        (other.as_str(), "10.79.2.9"),
    ])
    .await;
    let n1 = c.node("n1").await;
    let n2 = c.node("n2").await;
    let _agents = [c.fake_agent(&n1), c.fake_agent(&n2)];
    let (_controller, _metrics) = c.start_controller();
    let plugin = PluginPath::new();
    let services = Api::<Service>::namespaced(c.client.clone(), &other);
    let create_other = async |name: &str| {
        let svc: Service = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
            "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]},
        }))
        .unwrap();
        services.create(&Default::default(), &svc).await.unwrap();
    };
    for name in ["a", "b"] {
        c.create(lb_service(name)).await;
        c.wait_condition(name, "aliaslb.io/Announced", "Announced")
            .await;
    }
    create_other("x").await;
    create_other("y").await;
    eventually(SETTLE, "x announced and y pending", async || {
        let (_, out, _) = plugin.run(&c, &["status", "-n", &other]);
        out.contains("PoolExhausted") && out.contains(" x ") && out.contains("announced")
    })
    .await;

    // --kubeconfig and --context: the broken current context fails with a clear message;
    // the named one works, and its namespace is explain's default.
    let kubeconfig = two_contexts(&c, plugin.dir.path(), &c.ns);
    let kubeconfig = kubeconfig.to_str().unwrap();
    let (code, _, err) = plugin.run(&c, &["status", "--kubeconfig", kubeconfig]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("aliaslb: "), "{err}");
    let (code, out, err) = plugin.run(
        &c,
        &["status", "--kubeconfig", kubeconfig, "--context", "good"],
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("10.79.2.1"), "{out}");
    let (code, out, err) = plugin.run(
        &c,
        &[
            "explain",
            "svc/a",
            "--kubeconfig",
            kubeconfig,
            "--context",
            "good",
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("It has 10.79.2."),
        "the context's namespace: {out}"
    );

    // -n and -A.
    let mine = plugin.aliaslb(&c, &["status", "-n", &c.ns]);
    assert!(mine.contains(&c.ns) && !mine.contains(&other), "{mine}");
    let theirs = plugin.aliaslb(&c, &["status", "-n", &other]);
    assert!(
        theirs.contains(&format!("{other}/y")) && !theirs.contains(&format!("{}  ", c.ns)),
        "{theirs}"
    );
    let all = plugin.aliaslb(&c, &["status", "-A"]);
    assert!(all.contains(&c.ns) && all.contains(&other), "{all}");
    let (code, _, err) = plugin.run(&c, &["status", "-A", "-n", &other]);
    assert_eq!(code, 2, "-A and -n together are refused: {err}");

    // Filters: a pool, a node, the problems.
    let pool: Value =
        yaml_serde::from_str(&plugin.aliaslb(&c, &["status", "--pool", &other, "-o", "yaml"]))
            .unwrap();
    let pools_seen: std::collections::BTreeSet<&str> = pool["routes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["pool"].as_str().unwrap())
        .collect();
    assert_eq!(pools_seen, [other.as_str()].into(), "{pool}");
    let on_n1: Value =
        serde_json::from_str(&plugin.aliaslb(&c, &["status", "--node", &n1, "-o", "json"]))
            .unwrap();
    let routes = on_n1["routes"].as_array().unwrap();
    assert!(
        !routes.is_empty() && routes.iter().all(|r| r["node"] == n1.as_str()),
        "{on_n1}"
    );
    assert_eq!(on_n1["nodes"].as_array().unwrap().len(), 1, "{on_n1}");
    let problems: Value =
        serde_json::from_str(&plugin.aliaslb(&c, &["status", "--problems", "-A", "-o", "json"]))
            .unwrap();
    assert_eq!(problems["routes"], json!([]), "{problems}");
    assert_eq!(problems["pending"][0]["service"], "y", "{problems}");
    let wide = plugin.aliaslb(&c, &["status", "-o", "wide", "-n", &c.ns]);
    let head: Vec<&str> = wide
        .lines()
        .next()
        .unwrap()
        .split("  ")
        .filter(|s| !s.is_empty())
        .map(str::trim)
        .collect();
    assert_eq!(head.last(), Some(&"MAC"), "{wide}");
    assert!(head.contains(&"POOL"), "{wide}");

    // -o yaml and json on the other commands.
    let pools: Value =
        yaml_serde::from_str(&plugin.aliaslb(&c, &["pools", "-o", "yaml", "--pool", &c.ns]))
            .unwrap();
    assert_eq!(pools["pools"][0]["inUse"], json!(2), "{pools}");
    assert_eq!(pools["pools"].as_array().unwrap().len(), 1, "{pools}");
    let explained: Value = serde_json::from_str(
        &plugin.aliaslb(&c, &["explain", "svc/y", "-n", &other, "-o", "json"]),
    )
    .unwrap();
    assert!(
        explained["lines"]
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l.as_str().is_some_and(|l| l.starts_with("It is pending:"))),
        "{explained}"
    );
    let simulated: Value = yaml_serde::from_str(
        &plugin.aliaslb(&c, &["simulate", "cordon", &n1, "-o", "yaml", "-n", &c.ns]),
    )
    .unwrap();
    assert!(
        simulated["moves"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["namespace"] == c.ns.as_str()),
        "{simulated}"
    );

    // check: no leader Lease and a pending Service, worst first; then healthy.
    let (code, out, err) = plugin.run(&c, &["check"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.starts_with("CRITICAL"), "{out}");
    assert!(out.contains(&format!("{other}/y (PoolExhausted)")), "{out}");
    assert!(out.contains("AliaslbNoLeader.md"), "{out}");
    leader_lease(&c).await;
    services.delete("y", &Default::default()).await.unwrap();
    let mut last = String::new();
    for _ in 0..50 {
        let (code, out, err) = plugin.run(&c, &["check"]);
        if code == 0 {
            break;
        }
        last = format!("{out}{err}");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let (code, out, _) = plugin.run(&c, &["check"]);
    assert_eq!(code, 0, "check still finds something wrong:\n{last}");
    assert!(out.starts_with("nothing wrong:"), "{out}");
    let (code, out, _) = plugin.run(&c, &["check", "-o", "json"]);
    let healthy: Value = serde_json::from_str(&out).unwrap();
    assert_eq!((code, &healthy["healthy"]), (0, &json!(true)), "{healthy}");

    // bundle: our objects, Events, reports, status; a Secret's value nowhere.
    let secret = k8s_openapi::api::core::v1::Secret {
        metadata: kube::api::ObjectMeta {
            name: Some("bgp-password".into()),
            ..Default::default()
        },
        string_data: Some([("password".to_owned(), "s3cr3t-hunter2".to_owned())].into()),
        ..Default::default()
    };
    Api::<k8s_openapi::api::core::v1::Secret>::namespaced(c.client.clone(), &c.system)
        .create(&Default::default(), &secret)
        .await
        .unwrap();
    let dir = plugin.dir.path().join("bundle");
    let said = plugin.aliaslb(&c, &["bundle", "--output-directory", dir.to_str().unwrap()]);
    assert!(said.starts_with("wrote "), "{said}");
    let read = |f: &str| {
        std::fs::read_to_string(dir.join(f)).unwrap_or_else(|e| panic!("bundle's {f}: {e}"))
    };
    assert!(read("pools.yaml").contains("10.79.2.1-10.79.2.2"));
    assert!(read("services.yaml").contains("name: a"));
    assert!(read("leases.yaml").contains("aliaslb-controller"));
    assert!(read("reports.yaml").contains(&n1));
    assert!(read("events.yaml").contains("IPAllocated"));
    assert!(read("status.txt").contains("10.79.2.1"));
    assert!(read("check.txt").starts_with("nothing wrong"));
    let secrets = read("secrets.yaml");
    assert!(
        secrets.contains("password: REDACTED (14 bytes)"),
        "{secrets}"
    );
    let mut everything = String::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            everything += &std::fs::read_to_string(&path).unwrap();
        }
    }
    for leak in ["s3cr3t-hunter2", "czNjcjN0LWh1bnRlcjI="] {
        assert!(
            !everything.contains(leak),
            "the bundle leaks the Secret ({leak})"
        );
    }
    let stream = plugin.aliaslb(&c, &["bundle"]);
    assert!(
        stream.starts_with("==== index.txt ====") && stream.contains("==== events.yaml ===="),
        "{}",
        &stream[..stream.len().min(400)]
    );

    // Completion of names, through kubectl.
    let cns = ["--controller-namespace", c.system.as_str()];
    assert_eq!(
        plugin.complete(&c, &["explain", "-n", &c.ns, ""]),
        ["a", "b"]
    );
    assert_eq!(
        plugin.complete(&c, &["explain", "-n", &other, "svc/"]),
        ["svc/x"]
    );
    let nodes = plugin.complete(&c, &["simulate", "cordon", &format!("{}-n", c.ns)]);
    assert_eq!(nodes, [n1.clone(), n2.clone()]);
    assert_eq!(
        plugin.complete(&c, &["status", "--node", &n2]),
        std::slice::from_ref(&n2)
    );
    let mut pools = plugin.complete(&c, &["status", cns[0], cns[1], "--pool", ""]);
    pools.sort();
    let mut want = vec![c.ns.clone(), other.clone()];
    want.sort();
    assert_eq!(pools, want);
    assert!(
        plugin
            .complete(&c, &["status", "-n", "habits-b"])
            .contains(&other)
    );
    assert_eq!(
        plugin.complete(&c, &["status", "--kubeconfig", kubeconfig, "--context", ""]),
        ["good", "broken"]
    );
    c.cleanup().await;
}

/// A Pod of `app` (`app.kubernetes.io/name`) on `node` whose container `container` runs
/// `image`, as the manifests make them (no kubelet runs it: the API is all `version` reads).
fn component_pod(name: &str, app: &str, container: &str, node: &str, image: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": app}},
        "spec": {"nodeName": node, "containers": [{"name": container, "image": image}]},
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_aliaslb_version_says_the_skew() {
    let _serial = serial().await;
    let c = Cluster::new("version").await;
    let plugin = PluginPath::new();
    let client = env!("CARGO_PKG_VERSION");
    let pods = Api::<Pod>::namespaced(c.client.clone(), &c.system);
    let image = |v: &str| format!("registry.local:5000/aliaslb/aliaslb:{v}");
    // The ServiceAccount admission wants the Pods' account; no controller-manager makes it.
    let account: ServiceAccount =
        serde_json::from_value(json!({"metadata": {"name": "default"}})).unwrap();
    Api::<ServiceAccount>::namespaced(c.client.clone(), &c.system)
        .create(&Default::default(), &account)
        .await
        .unwrap();
    for pod in [
        component_pod(
            "ctl-1",
            "aliaslb-controller",
            "controller",
            "n1",
            &image(client),
        ),
        component_pod("agent-1", "aliaslb-agent", "agent", "n1", &image(client)),
        component_pod("agent-2", "aliaslb-agent", "agent", "n2", &image(client)),
    ] {
        pods.create(&Default::default(), &pod).await.unwrap();
    }
    // One release everywhere.
    let out = plugin.aliaslb(&c, &["version"]);
    assert_eq!(row(&out, "client"), ["client", client], "{out}");
    assert_eq!(
        row(&out, "agents"),
        ["agents", client, "2", "pod(s)", "on", "n1,", "n2"],
        "{out}"
    );
    assert!(out.contains("no skew"), "{out}");

    // An agent left behind by an upgrade: named by its node, in the table and in JSON.
    pods.create(
        &Default::default(),
        &component_pod(
            "agent-3",
            "aliaslb-agent",
            "agent",
            "n3",
            &image("0.0.1-old"),
        ),
    )
    .await
    .unwrap();
    let out = plugin.aliaslb(&c, &["version"]);
    assert!(
        out.contains(&format!(
            "skew: agents on n3 run 0.0.1-old, the controller {client}"
        )),
        "{out}"
    );
    let json: Value = serde_json::from_str(&plugin.aliaslb(&c, &["version", "-o", "json"]))
        .expect("version -o json");
    assert_eq!(json["client"], client);
    assert_eq!(json["controller"][0]["version"], client);
    let agents = json["agents"].as_array().unwrap();
    assert_eq!(agents.len(), 2, "{json}");
    assert!(
        agents
            .iter()
            .any(|a| a["version"] == "0.0.1-old" && a["nodes"] == json!(["n3"])),
        "{json}"
    );
    assert!(!json["skew"].as_array().unwrap().is_empty(), "{json}");
}
