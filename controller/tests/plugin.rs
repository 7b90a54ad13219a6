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
//!   commands through `kubectl_complete-aliaslb`.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::core::v1::{Node, Service};
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
