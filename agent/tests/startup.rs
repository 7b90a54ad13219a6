//! The agent refuses to start when the host-port shield cannot work, and says what is
//! missing; `--host-port-shield=off` starts without it. Runs the real binary (no root
//! needed: the check fails before any kernel or API access).

use std::process::Command;
use std::time::Duration;

/// Runs the agent with a `PATH` that has no `nft`; returns (exit success, stderr).
fn agent_without_nft(extra: &[&str]) -> (bool, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_aliaslb-agent"))
        .args([
            "--node-name",
            "startup-test",
            "--metrics-addr",
            "127.0.0.1:0",
        ])
        .args(extra)
        .env("PATH", "/nonexistent")
        // An API server that is not there: the agent must fail on the shield first.
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawning the agent");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the agent did not exit"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn without_nft_the_agent_refuses_to_start_and_names_what_is_missing() {
    let (ok, stderr) = agent_without_nft(&[]);
    assert!(!ok, "started without nft:\n{stderr}");
    for want in [
        "host-port shield",
        "nft",
        "install nftables",
        "--host-port-shield=off",
    ] {
        assert!(stderr.contains(want), "missing {want:?} in:\n{stderr}");
    }
}

#[test]
fn with_the_shield_off_it_gets_past_the_check() {
    let (ok, stderr) = agent_without_nft(&["--host-port-shield=off"]);
    // It then fails on the missing kubeconfig, not on nftables.
    assert!(!ok);
    assert!(stderr.contains("host-port shield off"), "{stderr}");
    assert!(stderr.contains("Kubernetes client"), "{stderr}");
    assert!(!stderr.contains("install nftables"), "{stderr}");
}
