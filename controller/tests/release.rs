//! The release tooling (issue 46), in the parts CI can run in seconds; `scripts/release`
//! itself (a release build, the image) is measured by hand (docs/development.md, "Releasing"):
//!
//! - the release workflow passes actionlint (with shellcheck over its `run:` steps when
//!   shellcheck is on PATH; scripts/test installs it) and its steps call the scripts;
//! - every file that states the release version states the workspace's (scripts/release
//!   refuses to release otherwise: this keeps them from drifting between releases);
//! - `scripts/release-manifests`: `aliaslb.yaml` is `kubectl kustomize manifests/` with only
//!   the image changed, the optional files are the kustomize component's and manifests/
//!   optional/'s objects, the BIRD variant is the component added, the chart package has the
//!   release's version and renders what the chart folder renders; two runs write the same
//!   bytes;
//! - `scripts/krew-manifest` writes a manifest Krew's own validator accepts, and Krew
//!   installs the plugin from it and the archive (sha256 checked) so that `kubectl-aliaslb
//!   version` runs;
//! - `scripts/release-publish --dry-run` puts the architectures' folders together: each
//!   architecture's files, the shared ones once (a difference between the architectures is
//!   refused), the Krew manifest naming both, a SHA256SUMS that checks.
//!
//! Needs kubectl (scripts/kube-env), helm (scripts/helm) and Go for scripts/tool's tools
//! (actionlint, validate-krew-manifest, krew: seconds each the first time, then cached).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("controller/ has a parent")
        .to_owned()
}

/// Runs `cmd`, panicking with its output when it fails; its stdout.
fn run(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The path of a tool scripts/tool builds.
fn tool(name: &str) -> PathBuf {
    let out = run(Command::new("bash")
        .arg(repo_root().join("scripts/tool"))
        .arg(name));
    PathBuf::from(
        out.lines()
            .last()
            .expect("scripts/tool prints a path")
            .trim(),
    )
}

fn read(relative: &str) -> String {
    std::fs::read_to_string(repo_root().join(relative))
        .unwrap_or_else(|e| panic!("reading {relative}: {e}"))
}

#[test]
fn the_release_workflow_passes_actionlint_and_calls_the_scripts() {
    let workflow = repo_root().join(".github/workflows/release.yml");
    let shellcheck = Command::new("shellcheck").arg("--version").output().is_ok();
    let mut cmd = Command::new(tool("actionlint"));
    if !shellcheck {
        cmd.arg("-shellcheck=");
    }
    run(cmd.arg(&workflow).current_dir(repo_root()));
    println!(
        "actionlint: {} passes (shellcheck {})",
        workflow.display(),
        if shellcheck { "on" } else { "not installed" }
    );
    let text = read(".github/workflows/release.yml");
    for script in ["scripts/release ", "scripts/release-publish "] {
        assert!(text.contains(&format!("run: bash {script}")), "{script}");
    }
    assert!(text.contains("arch: amd64") && text.contains("arch: arm64"));
    assert!(text.contains("tags: [\"v*\"]"));
}

/// The version every release file states, next to where it states it.
fn stated_versions() -> BTreeMap<&'static str, String> {
    let field = |text: &str, key: &str| -> String {
        text.lines()
            .find_map(|l| l.trim_start().strip_prefix(key))
            .map(|v| v.trim().trim_matches('"').to_owned())
            .unwrap_or_else(|| panic!("no {key}"))
    };
    let cargo = read("Cargo.toml");
    let workspace = cargo
        .split("[workspace.package]")
        .nth(1)
        .expect("[workspace.package]");
    let chart = read("charts/aliaslb/Chart.yaml");
    let dockerfile = read("Dockerfile");
    let label = dockerfile
        .split("org.opencontainers.image.version=")
        .nth(1)
        .expect("the Dockerfile's version label")
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned();
    BTreeMap::from([
        (
            "Cargo.toml workspace.package.version",
            field(workspace, "version = "),
        ),
        (
            "charts/aliaslb/Chart.yaml version",
            field(&chart, "version:"),
        ),
        (
            "charts/aliaslb/Chart.yaml appVersion",
            field(&chart, "appVersion:"),
        ),
        (
            "manifests/kustomization.yaml newTag",
            field(&read("manifests/kustomization.yaml"), "newTag:"),
        ),
        ("Dockerfile org.opencontainers.image.version", label),
    ])
}

#[test]
fn every_release_file_states_the_workspace_version() {
    let versions = stated_versions();
    let want = env!("CARGO_PKG_VERSION");
    for (file, version) in &versions {
        assert_eq!(
            version, want,
            "{file} says {version}, the workspace {want}: bump them together (scripts/release refuses otherwise)"
        );
    }
    // scripts/release reads the same places.
    let script = read("scripts/release");
    for needle in [
        "charts/aliaslb/Chart.yaml",
        "manifests/kustomization.yaml",
        "org.opencontainers.image.version",
        "workspace.package",
    ] {
        assert!(script.contains(needle), "scripts/release checks {needle}");
    }
}

/// Objects of a multi-document YAML by (kind, namespace, name).
fn objects(yaml: &str) -> BTreeMap<(String, String, String), Value> {
    let mut out = BTreeMap::new();
    for doc in yaml_serde::Deserializer::from_str(yaml) {
        let v: Value = serde::Deserialize::deserialize(doc).unwrap();
        if v.is_null() {
            continue;
        }
        let s = |v: &Value| v.as_str().unwrap_or_default().to_owned();
        let key = (
            s(&v["kind"]),
            s(&v["metadata"]["namespace"]),
            s(&v["metadata"]["name"]),
        );
        assert!(out.insert(key.clone(), v).is_none(), "{key:?} twice");
    }
    out
}

/// Asserts that `got` and `want` hold the same objects, naming those that differ.
fn assert_same(
    got: &BTreeMap<(String, String, String), Value>,
    want: &BTreeMap<(String, String, String), Value>,
    what: &str,
) {
    let keys: std::collections::BTreeSet<_> = got.keys().chain(want.keys()).collect();
    let differ: Vec<String> = keys
        .into_iter()
        .filter(|k| got.get(*k) != want.get(*k))
        .map(|k| {
            format!(
                "{k:?}:\n    got  {}\n    want {}",
                got.get(k).map(Value::to_string).unwrap_or_default(),
                want.get(k).map(Value::to_string).unwrap_or_default()
            )
        })
        .collect();
    assert!(differ.is_empty(), "{what}:\n  {}", differ.join("\n  "));
}

/// `kubectl kustomize DIR`.
fn kustomize(dir: &Path) -> String {
    run(Command::new("kubectl").arg("kustomize").arg(dir))
}

/// Every container image in `objects`, replaced by `to` where it is `from`.
fn replace_images(
    objects: &mut BTreeMap<(String, String, String), Value>,
    from: &str,
    to: &str,
) -> usize {
    let mut replaced = 0;
    for object in objects.values_mut() {
        let containers = object
            .pointer_mut("/spec/template/spec/containers")
            .and_then(Value::as_array_mut);
        for c in containers.into_iter().flatten() {
            if c["image"] == from {
                c["image"] = Value::from(to);
                replaced += 1;
            }
        }
    }
    replaced
}

/// `scripts/release-manifests 9.9.9 DIR --image IMAGE`, the commit's date fixed.
fn release_manifests(dir: &Path, image: &str) {
    run(Command::new("bash")
        .arg(repo_root().join("scripts/release-manifests"))
        .args(["9.9.9", &dir.display().to_string(), "--image", image])
        .env("SOURCE_DATE_EPOCH", "1700000000"));
}

#[test]
fn the_release_manifests_are_the_kustomizations_with_the_image_pinned() {
    let dir = tempfile::tempdir().unwrap();
    let image = "registry.example/aliaslb:9.9.9";
    release_manifests(dir.path(), image);
    let file = |name: &str| std::fs::read_to_string(dir.path().join(name)).unwrap();

    // Reproducible: a second run writes the same bytes, the chart's archive included.
    let again = tempfile::tempdir().unwrap();
    release_manifests(again.path(), image);
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "aliaslb-9.9.9.tgz",
            "aliaslb-admission-policies.yaml",
            "aliaslb-bird-sidecar.yaml",
            "aliaslb-monitoring.yaml",
            "aliaslb.yaml"
        ]
    );
    for name in &names {
        assert!(
            std::fs::read(dir.path().join(name)).unwrap()
                == std::fs::read(again.path().join(name)).unwrap(),
            "{name} differs between two runs"
        );
    }

    // The chart package: its version, and the chart it renders.
    let helm = std::env::var("ALIASLB_HELM")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            let out = run(Command::new("bash").arg(repo_root().join("scripts/helm")));
            PathBuf::from(out.lines().last().unwrap().trim())
        });
    let package = dir.path().join("aliaslb-9.9.9.tgz");
    let shown = run(Command::new(&helm).arg("show").arg("chart").arg(&package));
    assert!(
        shown.contains("\nversion: 9.9.9") && shown.contains("appVersion: 9.9.9"),
        "{shown}"
    );
    let template = |chart: &Path| {
        objects(&run(Command::new(&helm)
            .args(["template", "aliaslb"])
            .arg(chart)
            .args(["-n", "aliaslb-system", "--set", "image.tag=9.9.9"])))
    };
    assert_same(
        &template(&package),
        &template(&repo_root().join("charts/aliaslb")),
        "the packaged chart",
    );

    // aliaslb.yaml: manifests/ with the image replaced, nothing else.
    let mut want = objects(&kustomize(&repo_root().join("manifests")));
    let pinned = format!("ghcr.io/aliaslb/aliaslb:{}", env!("CARGO_PKG_VERSION"));
    assert_eq!(replace_images(&mut want, &pinned, image), 2);
    let got = objects(&file("aliaslb.yaml"));
    assert_same(&got, &want, "aliaslb.yaml");
    assert!(file("aliaslb.yaml").starts_with("# aliaslb 9.9.9: install with"));

    // The BIRD variant: everything of aliaslb.yaml, the DaemonSet with the sidecar, and
    // BIRD's ConfigMap.
    let bird = objects(&file("aliaslb-bird-sidecar.yaml"));
    assert_eq!(bird.len(), got.len() + 1, "{:?}", bird.keys());
    let ds = &bird[&(
        "DaemonSet".to_owned(),
        "aliaslb-system".to_owned(),
        "aliaslb-agent".to_owned(),
    )];
    let containers: Vec<&str> = ds["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(containers, ["agent", "bird"]);
    assert_eq!(
        ds["spec"]["template"]["spec"]["containers"][0]["image"],
        image
    );

    // The optional files: the monitoring component's objects and the two policies.
    let monitoring = objects(&file("aliaslb-monitoring.yaml"));
    let kinds: Vec<&str> = monitoring.keys().map(|(k, _, _)| k.as_str()).collect();
    assert_eq!(
        kinds,
        ["ConfigMap", "PodMonitor", "PodMonitor", "PrometheusRule"]
    );
    let component = objects(&read("manifests/optional/monitoring/prometheusrule.yaml"));
    let rule = |all: &BTreeMap<(String, String, String), Value>| {
        all.iter()
            .find(|((k, _, _), _)| k == "PrometheusRule")
            .map(|(_, v)| v["spec"].clone())
            .unwrap()
    };
    assert_eq!(rule(&monitoring), rule(&component), "the same alert rules");
    let policies = objects(&file("aliaslb-admission-policies.yaml"));
    let mut want_policies = objects(&read("manifests/optional/service-annotation-policy.yaml"));
    want_policies.extend(objects(&read(
        "manifests/optional/pool-configmap-policy.yaml",
    )));
    assert_same(&policies, &want_policies, "aliaslb-admission-policies.yaml");
}

/// A Krew archive of `content` named for `version` and `arch`, in `dir`.
fn krew_archive(dir: &Path, version: &str, arch: &str, content: &[u8]) -> PathBuf {
    let staging = tempfile::tempdir().unwrap();
    let bin = staging.path().join("kubectl-aliaslb");
    std::fs::write(&bin, content).unwrap();
    run(Command::new("chmod").arg("0755").arg(&bin));
    let archive = dir.join(format!("kubectl-aliaslb_{version}_linux_{arch}.tar.gz"));
    run(Command::new("tar")
        .arg("-czf")
        .arg(&archive)
        .arg("-C")
        .arg(staging.path())
        .arg("kubectl-aliaslb"));
    archive
}

#[test]
fn krew_installs_the_cli_from_the_plugin_manifest() {
    let dir = tempfile::tempdir().unwrap();
    // The real CLI in the archive, as scripts/release packs it.
    let cli = std::fs::read(env!("CARGO_BIN_EXE_aliaslb")).unwrap();
    let archive = krew_archive(dir.path(), "9.9.9", "amd64", &cli);
    let manifest_dir = dir.path().join("manifest");
    std::fs::create_dir_all(&manifest_dir).unwrap();
    // Krew's validator wants the file named after the plugin.
    let manifest = manifest_dir.join("aliaslb.yaml");
    let text = run(Command::new("bash")
        .arg(repo_root().join("scripts/krew-manifest"))
        .arg("9.9.9")
        .arg(&archive));
    std::fs::write(&manifest, &text).unwrap();
    assert!(
        text.contains(
            "uri: https://github.com/aliaslb/aliaslb/releases/download/v9.9.9/kubectl-aliaslb_9.9.9_linux_amd64.tar.gz"
        ),
        "{text}"
    );
    run(Command::new(tool("validate-krew-manifest"))
        .arg("-manifest")
        .arg(&manifest)
        .arg("-skip-install"));
    let root = dir.path().join("krew-root");
    run(Command::new(tool("krew"))
        .args(["install", "--manifest"])
        .arg(&manifest)
        .arg("--archive")
        .arg(&archive)
        .env("KREW_ROOT", &root));
    let version = run(Command::new(root.join("bin/kubectl-aliaslb")).args(["version", "--client"]));
    assert!(
        version.starts_with(&format!("aliaslb {}\n", env!("CARGO_PKG_VERSION"))),
        "{version}"
    );
    // A wrong sha256 is refused.
    let other = krew_archive(dir.path(), "9.9.8", "amd64", b"#!/bin/sh\n");
    let tampered = text.replace(
        &text
            .lines()
            .find(|l| l.contains("sha256:"))
            .unwrap()
            .to_owned(),
        "      sha256: 0000000000000000000000000000000000000000000000000000000000000000",
    );
    std::fs::write(&manifest, tampered).unwrap();
    let out = Command::new(tool("krew"))
        .args(["install", "--manifest"])
        .arg(&manifest)
        .arg("--archive")
        .arg(&other)
        .env("KREW_ROOT", dir.path().join("krew-root-2"))
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "krew took an archive of another sha256"
    );
}

#[test]
fn release_publish_puts_the_architectures_together() {
    let dir = tempfile::tempdir().unwrap();
    let version = "9.9.9";
    let arch_dir = |arch: &str, shared: &str| -> PathBuf {
        let d = dir.path().join(arch);
        std::fs::create_dir_all(&d).unwrap();
        for (name, content) in [
            ("aliaslb.yaml".to_owned(), shared.to_owned()),
            (format!("aliaslb-{version}.tgz"), "chart".to_owned()),
            (format!("aliaslb-linux-{arch}"), format!("cli {arch}")),
            (
                format!("aliaslb-{version}-linux-{arch}.oci.tar"),
                format!("image {arch}"),
            ),
            (
                format!("aliaslb-agent-linux-{arch}.cdx.json"),
                format!("sbom {arch}"),
            ),
            (
                "aliaslb.krew.yaml".to_owned(),
                format!("one platform {arch}"),
            ),
        ] {
            std::fs::write(d.join(name), content).unwrap();
        }
        krew_archive(&d, version, arch, format!("cli {arch}").as_bytes());
        run(Command::new("sh")
            .arg("-c")
            .arg("ls | grep -v SHA256SUMS | xargs sha256sum > SHA256SUMS")
            .current_dir(&d));
        d
    };
    let amd = arch_dir("amd64", "manifest");
    let arm = arch_dir("arm64", "manifest");
    let out = dir.path().join("all");
    let publish = |dirs: &[&Path]| {
        let mut cmd = Command::new("bash");
        cmd.arg(repo_root().join("scripts/release-publish"))
            .arg(version)
            .arg(&out);
        for d in dirs {
            cmd.arg(d);
        }
        cmd.arg("--dry-run").output().unwrap()
    };
    let done = publish(&[&amd, &arm]);
    assert!(
        done.status.success(),
        "{}",
        String::from_utf8_lossy(&done.stderr)
    );
    let mut names: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "SHA256SUMS",
            "aliaslb-9.9.9-linux-amd64.oci.tar",
            "aliaslb-9.9.9-linux-arm64.oci.tar",
            "aliaslb-9.9.9.tgz",
            "aliaslb-agent-linux-amd64.cdx.json",
            "aliaslb-agent-linux-arm64.cdx.json",
            "aliaslb-linux-amd64",
            "aliaslb-linux-arm64",
            "aliaslb.krew.yaml",
            "aliaslb.yaml",
            "kubectl-aliaslb_9.9.9_linux_amd64.tar.gz",
            "kubectl-aliaslb_9.9.9_linux_arm64.tar.gz",
        ]
    );
    let krew = std::fs::read_to_string(out.join("aliaslb.krew.yaml")).unwrap();
    assert!(
        krew.contains("arch: amd64") && krew.contains("arch: arm64"),
        "{krew}"
    );
    run(Command::new("sha256sum")
        .args(["--quiet", "-c", "SHA256SUMS"])
        .current_dir(&out));

    // A shared file that differs between the architectures is refused.
    std::fs::write(arm.join("aliaslb.yaml"), "another manifest").unwrap();
    run(Command::new("sh")
        .arg("-c")
        .arg("ls | grep -v SHA256SUMS | xargs sha256sum > SHA256SUMS")
        .current_dir(&arm));
    let refused = publish(&[&amd, &arm]);
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("aliaslb.yaml differs"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
}
