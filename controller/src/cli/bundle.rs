//! `aliaslb bundle`: a support dump of what aliaslb reads and writes, for a bug report or
//! a colleague: the pool ConfigMap, the LoadBalancer Services, the Nodes, the node
//! assignments, the agent Leases and the leader Lease, the agents' reports decoded, the
//! Events of our namespaces and of the Services, the Pods of the controller's namespace and
//! their `/metrics` (through the API server's pod proxy), the Secrets of our namespaces
//! **with every value redacted**, and `status` and `check` as they read now. Like `kubectl
//! cluster-info dump`: to stdout, or one file each under `--output-directory`. What could
//! not be read is listed in `index.txt`, not fatal.
//!
//! [`redact_secret`], [`yaml_list`] and [`Bundle::to_stream`] are pure; [`collect`] reads
//! the cluster (read-only), [`Bundle::write_dir`] writes the files.

use std::collections::BTreeSet;
use std::path::Path;

use aliaslb_core::keys;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Pod, Secret};
use kube::api::ListParams;
use kube::{Api, Client, Resource, ResourceExt};
use serde::Serialize;

use crate::cli::live::Snapshot;

/// What a redacted value becomes (its length stays, for "is it empty?").
pub const REDACTED: &str = "REDACTED";

/// The files of a bundle, in order, and what could not be read.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Bundle {
    /// `(path relative to the bundle, content)`.
    pub files: Vec<(String, String)>,
    /// What could not be collected, one line each.
    pub errors: Vec<String>,
}

/// Where aliaslb keeps its objects (the CLI's `--controller-namespace` and friends).
#[derive(Debug, Clone)]
pub struct Scope<'a> {
    /// The controller's namespace: pool ConfigMap, assignments, leader Lease, pods.
    pub namespace: &'a str,
    /// The agents' Leases.
    pub agent_namespace: &'a str,
}

/// `secret` with every value of `data` and `stringData` replaced by [`REDACTED`] and its
/// length (under `stringData`, readable as it is), and the annotation that would repeat
/// them (`kubectl apply`'s last-applied-configuration) removed; metadata otherwise kept.
pub fn redact_secret(mut secret: Secret) -> Secret {
    let said = |n: usize| format!("{REDACTED} ({n} bytes)");
    let mut redacted = std::collections::BTreeMap::new();
    for (key, value) in secret.data.take().into_iter().flatten() {
        redacted.insert(key, said(value.0.len()));
    }
    for (key, value) in secret.string_data.take().into_iter().flatten() {
        redacted.insert(key, said(value.len()));
    }
    if !redacted.is_empty() {
        secret.string_data = Some(redacted);
    }
    if let Some(annotations) = secret.metadata.annotations.as_mut() {
        annotations.remove("kubectl.kubernetes.io/last-applied-configuration");
    }
    secret.metadata.managed_fields = None;
    secret
}

/// `items` as one YAML `List` (as `kubectl get -o yaml` prints several), without their
/// managedFields (noise here).
pub fn yaml_list<K>(items: impl IntoIterator<Item = K>) -> Result<String, String>
where
    K: Resource + Serialize,
{
    let items: Vec<serde_json::Value> = items
        .into_iter()
        .map(|mut k| {
            k.meta_mut().managed_fields = None;
            serde_json::to_value(&k).map_err(|e| e.to_string())
        })
        .collect::<Result<_, _>>()?;
    yaml_serde::to_string(&serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items}))
        .map_err(|e| e.to_string())
}

impl Bundle {
    fn add(&mut self, path: &str, content: Result<String, String>) {
        match content {
            Ok(text) => self.files.push((path.to_owned(), text)),
            Err(e) => self.errors.push(format!("{path}: {e}")),
        }
    }

    /// Every file, each after a `==== PATH ====` line (stdout, as `kubectl cluster-info
    /// dump` prints), `index.txt` first.
    pub fn to_stream(&self) -> String {
        let mut out = String::new();
        for (path, text) in &self.files {
            out.push_str(&format!("==== {path} ====\n{text}"));
            if !text.ends_with('\n') {
                out.push('\n');
            }
        }
        out
    }

    /// Writes every file under `dir` (created; files of the same names replaced).
    pub fn write_dir(&self, dir: &Path) -> std::io::Result<()> {
        for (path, text) in &self.files {
            let file = dir.join(path);
            if let Some(parent) = file.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(&file, text)?;
        }
        Ok(())
    }
}

/// What `list` found, or why not.
async fn list<K>(api: Api<K>, params: &ListParams) -> Result<Vec<K>, String>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.list(params)
        .await
        .map(|l| l.items)
        .map_err(|e| e.to_string())
}

/// Reads everything the bundle holds (see the module docs). `snapshot` is what `status`
/// read; `status` and `check` are their outputs, already rendered; `header` opens
/// `index.txt` (when, which client).
pub async fn collect(
    client: &Client,
    scope: &Scope<'_>,
    snapshot: &Snapshot,
    header: &str,
    status: Result<String, String>,
    check: Result<String, String>,
) -> Bundle {
    let mut b = Bundle::default();
    let ns = scope.namespace;
    b.add("pools.yaml", yaml_list(snapshot.configmap.clone()));
    let lb: Vec<_> = snapshot
        .services
        .iter()
        .filter(|s| {
            s.spec
                .as_ref()
                .is_some_and(|spec| spec.type_.as_deref() == Some("LoadBalancer"))
        })
        .cloned()
        .collect();
    let services: BTreeSet<(String, String)> = lb
        .iter()
        .map(|s| (s.namespace().unwrap_or_default(), s.name_any()))
        .collect();
    b.add("services.yaml", yaml_list(lb));
    b.add(
        "nodes.yaml",
        yaml_list(snapshot.nodes.iter().map(|n| (**n).clone())),
    );
    b.add(
        "assignments.yaml",
        yaml_list(snapshot.assignments.iter().cloned()),
    );
    let leases = list(
        Api::<Lease>::namespaced(client.clone(), scope.agent_namespace),
        &ListParams::default(),
    )
    .await;
    let leader = Api::<Lease>::namespaced(client.clone(), ns)
        .get_opt(keys::CONTROLLER_LEASE)
        .await
        .map_err(|e| e.to_string());
    match (leases, leader) {
        (Ok(mut leases), Ok(leader)) => {
            leases.extend(leader);
            b.add("leases.yaml", yaml_list(leases));
        }
        (l, r) => b.add("leases.yaml", Err(format!("{:?} {:?}", l.err(), r.err()))),
    }
    let reports: std::collections::BTreeMap<&str, &aliaslb_core::report::AgentReport> = snapshot
        .agents
        .iter()
        .map(|(node, a)| (node.as_str(), &a.report))
        .collect();
    b.add(
        "reports.yaml",
        yaml_serde::to_string(&reports).map_err(|e| e.to_string()),
    );
    // Events: of our namespaces, and those about the LoadBalancer Services.
    let mut events = Vec::new();
    for namespace in [ns, scope.agent_namespace] {
        match list(
            Api::<Event>::namespaced(client.clone(), namespace),
            &ListParams::default(),
        )
        .await
        {
            Ok(found) => events.extend(found),
            Err(e) => b.errors.push(format!("events of {namespace}: {e}")),
        }
    }
    match list(
        Api::<Event>::all(client.clone()),
        &ListParams::default().fields("involvedObject.kind=Service"),
    )
    .await
    {
        Ok(found) => events.extend(found.into_iter().filter(|e| {
            let o = &e.involved_object;
            services.contains(&(
                o.namespace.clone().unwrap_or_default(),
                o.name.clone().unwrap_or_default(),
            ))
        })),
        Err(e) => b.errors.push(format!("events of Services: {e}")),
    }
    events.sort_by(|a, b| {
        let at = |e: &Event| e.last_timestamp.as_ref().map(|t| t.0);
        at(a).cmp(&at(b))
    });
    b.add("events.yaml", yaml_list(events));
    let mut secrets = Vec::new();
    for namespace in [ns, scope.agent_namespace] {
        match list(
            Api::<Secret>::namespaced(client.clone(), namespace),
            &ListParams::default(),
        )
        .await
        {
            Ok(found) => secrets.extend(found.into_iter().map(redact_secret)),
            Err(e) => b.errors.push(format!("secrets of {namespace}: {e}")),
        }
    }
    b.add("secrets.yaml", yaml_list(secrets));
    let pods = list(
        Api::<Pod>::namespaced(client.clone(), ns),
        &ListParams::default(),
    )
    .await;
    match pods {
        Ok(pods) => {
            for pod in &pods {
                let name = pod.name_any();
                let port = pod.spec.iter().flat_map(|s| &s.containers).find_map(|c| {
                    c.ports
                        .iter()
                        .flatten()
                        .find(|p| p.name.as_deref() == Some("metrics"))
                        .map(|p| p.container_port)
                });
                let Some(port) = port else { continue };
                let path = format!("/api/v1/namespaces/{ns}/pods/{name}:{port}/proxy/metrics");
                let text = match http::Request::get(&path).body(Vec::new()) {
                    Ok(request) => client
                        .request_text(request)
                        .await
                        .map_err(|e| e.to_string()),
                    Err(e) => Err(e.to_string()),
                };
                b.add(&format!("metrics/{name}.txt"), text);
            }
            b.add("pods.yaml", yaml_list(pods));
        }
        Err(e) => b.errors.push(format!("pods of {ns}: {e}")),
    }
    b.add("status.txt", status);
    b.add("check.txt", check);
    let mut index = header.to_owned();
    index.push_str("\nFiles:\n");
    for (path, _) in &b.files {
        index.push_str(&format!("  {path}\n"));
    }
    if b.errors.is_empty() {
        index.push_str("\nEverything was read.\n");
    } else {
        index.push_str("\nNot collected:\n");
        for e in &b.errors {
            index.push_str(&format!("  {e}\n"));
        }
    }
    b.files.insert(0, ("index.txt".to_owned(), index));
    b
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::ByteString;
    use std::collections::BTreeMap;

    #[test]
    fn a_secret_keeps_its_names_and_loses_its_values() {
        let secret = Secret {
            metadata: kube::api::ObjectMeta {
                name: Some("bgp".into()),
                annotations: Some(BTreeMap::from([(
                    "kubectl.kubernetes.io/last-applied-configuration".to_owned(),
                    "{\"data\":{\"password\":\"aHVudGVyMg==\"}}".to_owned(),
                )])),
                ..Default::default()
            },
            data: Some(BTreeMap::from([(
                "password".to_owned(),
                ByteString(b"hunter2".to_vec()),
            )])),
            string_data: Some(BTreeMap::from([("token".to_owned(), "abc".to_owned())])),
            ..Default::default()
        };
        let text = yaml_list([redact_secret(secret)]).unwrap();
        assert!(!text.contains("aHVudGVyMg"), "{text}");
        assert!(
            !text.contains("hunter2") && !text.contains("abc\n"),
            "{text}"
        );
        assert!(text.contains("password: REDACTED (7 bytes)"), "{text}");
        assert!(text.contains("token: REDACTED (3 bytes)"), "{text}");
        assert!(text.contains("kind: List"), "{text}");
    }

    #[test]
    fn the_stream_names_each_file() {
        let b = Bundle {
            files: vec![
                ("index.txt".into(), "hi\n".into()),
                ("a.yaml".into(), "x".into()),
            ],
            errors: Vec::new(),
        };
        assert_eq!(
            b.to_stream(),
            "==== index.txt ====\nhi\n==== a.yaml ====\nx\n"
        );
    }
}
