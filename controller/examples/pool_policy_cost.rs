//! What the optional pool ConfigMap policy (`manifests/optional/pool-configmap-policy*.yaml`)
//! costs a `kubectl apply`, against the real kube-apiserver of testenv: for pool ConfigMaps
//! of N lines (N valid addresses and one bad last line, so every line is read), the time of
//! a server-side apply of `aliaslb-pools` (checked by the policy: refused while it runs
//! within its cost limit, let through when it gives up) beside the same apply of a ConfigMap
//! the policy does not match (the floor), 5 rounds each, medians. The variant follows the
//! server's version (1.30: regular expressions; 1.31+: CEL's IP library).
//!
//! ```text
//! KUBEBUILDER_ASSETS=$HOME/.cache/aliaslb/kube-v1.37.2/bin \
//!   cargo run --release -p aliaslb-controller --example pool_policy_cost
//! ```

use std::path::Path;
use std::time::{Duration, Instant};

use aliaslb_testenv::TestEnv;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

const NAMESPACE: &str = "aliaslb-system";
const ROUNDS: usize = 5;

/// The value of `lines` distinct IPv4 addresses and a last line that is none.
fn value(lines: usize) -> String {
    let mut value = String::new();
    for i in 0..lines {
        value.push_str(&format!(
            "10.{}.{}.{}\n",
            i / 65536,
            (i / 256) % 256,
            i % 256
        ));
    }
    value.push_str("not-an-address\n");
    value
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let env = TestEnv::global();
    let client = env.client().await;
    let version = client.apiserver_version().await.unwrap();
    let minor: u32 = version.minor.trim_end_matches('+').parse().unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    env.kubectl(&[
        "apply",
        "-f",
        &root.join("manifests/namespace.yaml").display().to_string(),
    ]);
    let policy = if minor < 31 {
        "pool-configmap-policy-1.30.yaml"
    } else {
        "pool-configmap-policy.yaml"
    };
    env.kubectl(&[
        "apply",
        "-f",
        &root
            .join("manifests/optional")
            .join(policy)
            .display()
            .to_string(),
    ]);
    // The policy takes effect within a second or so of its creation.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let cms = Api::<ConfigMap>::namespaced(client, NAMESPACE);
    let params = PatchParams::apply("pool-policy-cost").force();
    println!(
        "pool ConfigMap policy {policy} on {}: apply of N lines, median of {ROUNDS}",
        version.git_version
    );
    for lines in [100usize, 1000, 2000, 4000, 5000] {
        let data = json!({"default": value(lines)});
        let (mut checked, mut floor) = (Vec::new(), Vec::new());
        let mut refused = 0;
        for _ in 0..ROUNDS {
            for (name, samples) in [
                ("aliaslb-pools", &mut checked),
                ("not-the-pools", &mut floor),
            ] {
                let object = json!({
                    "apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": name, "namespace": NAMESPACE},
                    "data": data,
                });
                let started = Instant::now();
                let result = cms.patch(name, &params, &Patch::Apply(&object)).await;
                samples.push(started.elapsed());
                if name == "aliaslb-pools" && result.is_err() {
                    refused += 1;
                }
            }
        }
        println!(
            "{lines:>5} lines: checked {:>8.1} ms (refused {refused} of {ROUNDS}: {}), floor {:>6.1} ms",
            median(checked).as_secs_f64() * 1e3,
            if refused == ROUNDS {
                "the policy ran"
            } else {
                "past its cost limit, let through"
            },
            median(floor).as_secs_f64() * 1e3
        );
    }
}
