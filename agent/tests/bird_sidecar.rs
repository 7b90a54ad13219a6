//! The optional kustomize component `manifests/optional/bird-sidecar`, rendered with the base
//! manifests by the real `kubectl kustomize`: the agent DaemonSet gains a BIRD container, the
//! agent's `--routing-daemon` parses and names the socket on the volume both containers
//! mount, and the shipped `bird.conf` is accepted by the real BIRD (`bird -p`).

use std::path::{Path, PathBuf};
use std::process::Command;

use aliaslb_agent::l3::routing::DaemonSpec;
use serde::Deserialize;
use yaml_serde::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

fn have(binary: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {binary}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// The mounts of `container` as (volume, path).
fn mounts(container: &Value) -> Vec<(String, String)> {
    container["volumeMounts"]
        .as_sequence()
        .into_iter()
        .flatten()
        .map(|m| {
            (
                m["name"].as_str().unwrap().to_owned(),
                m["mountPath"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

#[test]
fn the_bird_sidecar_component_renders_and_its_config_parses() {
    if !have("kubectl") {
        eprintln!("skipped: no kubectl on PATH (scripts/test installs it)");
        return;
    }
    // kustomize takes relative paths only: a kustomization inside the repo's target dir.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let depth = dir
        .path()
        .strip_prefix(repo())
        .unwrap()
        .components()
        .count();
    let up = "../".repeat(depth);
    std::fs::write(
        dir.path().join("kustomization.yaml"),
        format!("resources: [{up}manifests]\ncomponents: [{up}manifests/optional/bird-sidecar]\n"),
    )
    .unwrap();
    let out = Command::new("kubectl")
        .args(["kustomize"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let docs: Vec<Value> = yaml_serde::Deserializer::from_str(&text)
        .map(|d| Value::deserialize(d).unwrap())
        .collect();
    let ds = docs
        .iter()
        .find(|d| d["kind"] == "DaemonSet" && d["metadata"]["name"] == "aliaslb-agent")
        .expect("the agent DaemonSet");
    let pod = &ds["spec"]["template"]["spec"];
    let containers = pod["containers"].as_sequence().unwrap();
    assert_eq!(containers.len(), 2, "agent and bird");
    let (agent, bird) = (&containers[0], &containers[1]);
    assert_eq!(bird["name"], "bird");
    let flag = agent["args"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .find_map(|a| a.strip_prefix("--routing-daemon="))
        .expect("--routing-daemon on the agent");
    let DaemonSpec::Bird { socket } = flag.parse::<DaemonSpec>().unwrap() else {
        panic!("not a BIRD spec: {flag}");
    };
    // BIRD creates its socket where the agent reads it: one volume, mounted by both.
    let socket_dir = socket.parent().unwrap().to_str().unwrap().to_owned();
    let shared: Vec<_> = mounts(agent)
        .into_iter()
        .filter(|(_, path)| *path == socket_dir)
        .collect();
    assert_eq!(shared.len(), 1, "{:?}", mounts(agent));
    assert!(mounts(bird).contains(&shared[0]), "{:?}", mounts(bird));
    let command: Vec<&str> = bird["command"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    let socket_arg = command.iter().position(|a| *a == "-s").unwrap() + 1;
    assert_eq!(Path::new(command[socket_arg]), socket);
    let config = docs
        .iter()
        .find(|d| d["kind"] == "ConfigMap" && d["data"]["bird.conf"].is_string())
        .expect("the aliaslb-bird ConfigMap");
    let volume = pod["volumes"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|v| v["configMap"]["name"] == config["metadata"]["name"])
        .expect("the ConfigMap mounted");
    assert!(mounts(bird).contains(&(
        volume["name"].as_str().unwrap().to_owned(),
        "/etc/bird".to_owned()
    )));

    if !have("bird") {
        eprintln!("bird.conf not parsed: no bird on PATH (scripts/test installs bird2)");
        return;
    }
    let conf = dir.path().join("bird.conf");
    std::fs::write(&conf, config["data"]["bird.conf"].as_str().unwrap()).unwrap();
    let parsed = Command::new("bird")
        .arg("-p")
        .arg("-c")
        .arg(&conf)
        .output()
        .unwrap();
    assert!(
        parsed.status.success(),
        "bird -p: {}",
        String::from_utf8_lossy(&parsed.stderr)
    );
}
