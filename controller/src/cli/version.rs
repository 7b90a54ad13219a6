//! `aliaslb version`: the CLI's own version, the controller's and the agents', and the skew
//! between them. The running versions are read from the image tags of the controller's and
//! the agents' Pods (`app.kubernetes.io/name=aliaslb-controller` / `aliaslb-agent`, as the
//! manifests and the chart label them): the processes publish their version nowhere else in
//! the API. [`read`] does the I/O (two Pod lists); the rest is pure.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use serde::Serialize;

/// The label value of the controller's Pods.
pub const CONTROLLER_APP: &str = "aliaslb-controller";
/// The label value of the agents' Pods.
pub const AGENT_APP: &str = "aliaslb-agent";

/// One running version of a component: the Pods (and their nodes) that run it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Running {
    /// The image tag (`unknown` for an image without a tag, or with a digest only).
    pub version: String,
    /// `namespace/name` of each Pod running it, sorted.
    pub pods: Vec<String>,
    /// The nodes of those Pods (scheduled ones), sorted.
    pub nodes: Vec<String>,
}

/// What `aliaslb version` prints.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    /// This binary's version.
    pub client: String,
    /// The controller's versions, newest first by string order.
    pub controller: Vec<Running>,
    /// The agents' versions.
    pub agents: Vec<Running>,
    /// What differs, one sentence each; empty when every part runs the client's version.
    pub skew: Vec<String>,
}

/// A Pod's container image, as [`report`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodImage {
    /// `namespace/name`.
    pub pod: String,
    /// Its node, once scheduled.
    pub node: Option<String>,
    /// The image of its container named `container` (or its first container).
    pub image: String,
}

/// The version an image reference names: its tag (`ghcr.io/aliaslb/aliaslb:0.1.0` →
/// `0.1.0`, a leading `v` kept), `unknown` without one (a registry's port is not a tag).
pub fn image_version(image: &str) -> String {
    let name = image.split('@').next().unwrap_or(image);
    let last = name.rsplit('/').next().unwrap_or(name);
    match last.rsplit_once(':') {
        Some((_, tag)) if !tag.is_empty() => tag.to_owned(),
        _ => "unknown".to_owned(),
    }
}

/// The versions `pods` run, one entry per version.
fn running(pods: &[PodImage]) -> Vec<Running> {
    let mut by: BTreeMap<String, Running> = BTreeMap::new();
    for p in pods {
        let version = image_version(&p.image);
        let entry = by.entry(version.clone()).or_insert_with(|| Running {
            version,
            pods: Vec::new(),
            nodes: Vec::new(),
        });
        entry.pods.push(p.pod.clone());
        entry.nodes.extend(p.node.clone());
    }
    by.into_values()
        .rev()
        .map(|mut r| {
            r.pods.sort();
            r.nodes.sort();
            r.nodes.dedup();
            r
        })
        .collect()
}

/// The report on `controller`'s and `agents`' Pods, seen by a client of version `client`.
pub fn report(client: &str, controller: &[PodImage], agents: &[PodImage]) -> Report {
    let controller = running(controller);
    let agents = running(agents);
    let mut skew = Vec::new();
    let versions = |r: &[Running]| -> Vec<String> { r.iter().map(|r| r.version.clone()).collect() };
    if controller.is_empty() {
        skew.push("no controller Pod found: is aliaslb installed in this namespace?".to_owned());
    }
    if agents.is_empty() {
        skew.push("no agent Pod found: no node announces anything".to_owned());
    }
    if controller.len() > 1 {
        skew.push(format!(
            "the controller's Pods run {} (a rollout in progress?)",
            versions(&controller).join(" and ")
        ));
    }
    if agents.len() > 1 {
        let detail: Vec<String> = agents
            .iter()
            .map(|r| format!("{} on {}", r.version, nodes_or_pods(r)))
            .collect();
        skew.push(format!(
            "the agents run {} versions: {}",
            agents.len(),
            detail.join("; ")
        ));
    }
    if let [c] = controller.as_slice() {
        for a in &agents {
            if a.version != c.version {
                skew.push(format!(
                    "agents on {} run {}, the controller {}: run one release everywhere (the agents first on an upgrade)",
                    nodes_or_pods(a),
                    a.version,
                    c.version
                ));
            }
        }
    }
    let deployed: Vec<&Running> = controller.iter().chain(&agents).collect();
    if !deployed.is_empty() && deployed.iter().all(|r| r.version != client) {
        skew.push(format!(
            "this CLI is {client}: its planner may not match the cluster's (explain, simulate, check)"
        ));
    }
    Report {
        client: client.to_owned(),
        controller,
        agents,
        skew,
    }
}

fn nodes_or_pods(r: &Running) -> String {
    if r.nodes.is_empty() {
        r.pods.join(", ")
    } else {
        r.nodes.join(", ")
    }
}

/// The table: a line per component and version, then the skew.
pub fn render(report: &Report) -> String {
    let mut out = format!("{:<11} {}\n", "client", report.client);
    for (label, runs) in [
        ("controller", &report.controller),
        ("agents", &report.agents),
    ] {
        if runs.is_empty() {
            out += &format!("{label:<11} -\n");
        }
        for (i, r) in runs.iter().enumerate() {
            let label = if i == 0 { label } else { "" };
            out += &format!(
                "{label:<11} {:<10} {} pod(s){}\n",
                r.version,
                r.pods.len(),
                if r.nodes.is_empty() {
                    String::new()
                } else {
                    format!(" on {}", r.nodes.join(", "))
                }
            );
        }
    }
    if report.skew.is_empty() {
        out += "no skew: every part runs the same release\n";
    }
    for s in &report.skew {
        out += &format!("skew: {s}\n");
    }
    out
}

/// The images of the Pods labelled `app.kubernetes.io/name=app` in `namespace`, of their
/// container named `container` (the first one if none is).
pub async fn read(
    client: &kube::Client,
    namespace: &str,
    app: &str,
    container: &str,
) -> Result<Vec<PodImage>, kube::Error> {
    let pods = Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().labels(&format!("app.kubernetes.io/name={app}")))
        .await?;
    Ok(pods
        .items
        .into_iter()
        .filter_map(|p| {
            let spec = p.spec?;
            let image = spec
                .containers
                .iter()
                .find(|c| c.name == container)
                .or(spec.containers.first())?
                .image
                .clone()?;
            Some(PodImage {
                pod: format!(
                    "{}/{}",
                    p.metadata.namespace.unwrap_or_default(),
                    p.metadata.name.unwrap_or_default()
                ),
                node: spec.node_name,
                image,
            })
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, node: &str, image: &str) -> PodImage {
        PodImage {
            pod: format!("aliaslb-system/{name}"),
            node: Some(node.to_owned()),
            image: image.to_owned(),
        }
    }

    #[test]
    fn image_tags_are_versions() {
        assert_eq!(image_version("ghcr.io/aliaslb/aliaslb:0.1.0"), "0.1.0");
        assert_eq!(image_version("registry:5000/aliaslb:v0.2.0"), "v0.2.0");
        assert_eq!(image_version("registry:5000/aliaslb"), "unknown");
        assert_eq!(image_version("aliaslb@sha256:abcd"), "unknown");
        assert_eq!(image_version("aliaslb:0.1.0@sha256:abcd"), "0.1.0");
    }

    #[test]
    fn one_release_everywhere_has_no_skew() {
        let r = report(
            "0.1.0",
            &[pod("c-1", "n1", "x/aliaslb:0.1.0")],
            &[
                pod("a-1", "n1", "x/aliaslb:0.1.0"),
                pod("a-2", "n2", "x/aliaslb:0.1.0"),
            ],
        );
        assert!(r.skew.is_empty(), "{r:?}");
        let text = render(&r);
        assert!(
            text.contains("agents      0.1.0      2 pod(s) on n1, n2"),
            "{text}"
        );
        assert!(text.contains("no skew"), "{text}");
    }

    #[test]
    fn agents_behind_the_controller_are_named_by_node() {
        let r = report(
            "0.1.0",
            &[pod("c-1", "n1", "x/aliaslb:0.1.0")],
            &[
                pod("a-1", "n1", "x/aliaslb:0.1.0"),
                pod("a-2", "n2", "x/aliaslb:0.0.9"),
            ],
        );
        assert_eq!(r.agents.len(), 2);
        assert!(r.skew.iter().any(|s| s.contains("0.0.9 on n2")), "{r:?}");
        assert!(
            r.skew
                .iter()
                .any(|s| s.starts_with("agents on n2 run 0.0.9, the controller 0.1.0")),
            "{r:?}"
        );
        // The CLI matches a part of the cluster: no CLI skew.
        assert!(!r.skew.iter().any(|s| s.contains("this CLI")), "{r:?}");
    }

    #[test]
    fn a_cli_of_another_release_and_a_missing_part_are_said() {
        let r = report("0.2.0", &[pod("c-1", "n1", "x/aliaslb:0.1.0")], &[]);
        assert!(
            r.skew.iter().any(|s| s.starts_with("no agent Pod")),
            "{r:?}"
        );
        assert!(
            r.skew.iter().any(|s| s.starts_with("this CLI is 0.2.0")),
            "{r:?}"
        );
        assert!(render(&r).contains("agents      -\n"));
    }
}
