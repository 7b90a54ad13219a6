//! The lab with real kubelets (`scripts/kubelets`: containerd and runc on each lab node, a
//! kube-scheduler) running aliaslb's image built in the same run (`scripts/image`), for the
//! tests that install aliaslb as pods: e2e/tests/install.rs (`kubectl apply -k`) and
//! e2e/tests/release_upgrade.rs (from the previous release, with helm and the release
//! manifest). [`Cluster`] brings it up and reads the pods back. Does I/O: processes,
//! `kubectl`.

use std::path::{Component, Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::Error;
use crate::lab::{Lab, NODES, SYSTEM_NAMESPACE, binary_dir, node_name, run, wait_for};

/// Pods starting from a local image, probes passing.
pub const POD_TIMEOUT: Duration = Duration::from_secs(120);

/// The repository's root folder.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("e2e/ has a parent")
        .to_owned()
}

/// `to` relative to the folder `from` (both absolute): kustomize refuses absolute resources.
pub fn relative(from: &Path, to: &Path) -> PathBuf {
    let depth = from
        .components()
        .filter(|c| matches!(c, Component::Normal(_)))
        .count();
    let mut out: PathBuf = std::iter::repeat_n("..", depth).collect();
    out.push(to.strip_prefix("/").unwrap_or(to));
    out
}

/// A file's content without its surrounding whitespace.
pub fn read_trimmed(path: &Path) -> Result<String, Error> {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .map_err(|source| Error::Io {
            what: format!("reading {}", path.display()),
            source,
        })
}

/// An image reference's name and tag (`localhost/aliaslb:dev-1a2b` -> both halves).
pub fn name_and_tag(image: &str) -> Result<(&str, &str), Error> {
    image
        .rsplit_once(':')
        .ok_or_else(|| Error::Environment(format!("image {image} has no tag")))
}

/// The pod is Running and every container Ready.
pub fn ready(pod: &Value) -> bool {
    pod["status"]["phase"] == "Running"
        && pod["status"]["containerStatuses"]
            .as_array()
            .is_some_and(|cs| !cs.is_empty() && cs.iter().all(|c| c["ready"] == true))
}

/// The lab with kubelets. Dropping it stops the kubelets and their pods, then the lab
/// (`scripts/lab down` runs `scripts/kubelets down` first); while panicking it prints the
/// [`Cluster::diagnostics`] first.
#[derive(Debug)]
pub struct Cluster {
    /// The lab (its API server, nodes and LAN).
    pub lab: Lab,
    /// aliaslb's image, as the nodes' containerd knows it.
    pub image: String,
    /// The BIRD sidecar's image (manifests/optional/bird-sidecar).
    pub bird_image: String,
}

impl Cluster {
    /// The bare lab, `scripts/image` of the binaries the tests run, `scripts/kubelets up`
    /// with its images imported into every node. `None` when the lab cannot run here
    /// (see [`Lab::up_bare`]).
    pub fn up(what: &str) -> Result<Option<Cluster>, Error> {
        let Some(lab) = Lab::up_bare()? else {
            return Ok(None);
        };
        let repo = repo_root();
        let t0 = Instant::now();
        let bins = binary_dir()?;
        let out = run(Command::new("bash")
            .arg(repo.join("scripts/image"))
            .arg("--bins")
            .arg(&bins))?;
        let images = PathBuf::from(out.lines().last().unwrap_or_default().trim());
        let image = read_trimmed(&images.join("aliaslb.ref"))?;
        let bird_image = read_trimmed(&images.join("bird.ref"))?;
        println!(
            "[{what}] image {image} in {:.1} s ({})",
            t0.elapsed().as_secs_f64(),
            images.display()
        );
        let t0 = Instant::now();
        let cluster = Cluster {
            lab,
            image,
            bird_image,
        };
        run(Command::new("bash")
            .arg(repo.join("scripts/kubelets"))
            .arg("up")
            .arg(&images)
            .env("ALIASLB_LAB_DIR", cluster.lab.state_dir()))?;
        println!(
            "[{what}] 3 kubelets Ready in {:.1} s",
            t0.elapsed().as_secs_f64()
        );
        Ok(Some(cluster))
    }

    /// Imports the OCI archives of `images` (a folder like `scripts/image`'s) into every
    /// node's containerd (`scripts/kubelets import`).
    pub fn import(&self, images: &Path) -> Result<(), Error> {
        run(Command::new("bash")
            .arg(repo_root().join("scripts/kubelets"))
            .arg("import")
            .arg(images)
            .env("ALIASLB_LAB_DIR", self.lab.state_dir()))
        .map(drop)
    }

    /// The pods of `app` (`aliaslb-agent`, `aliaslb-controller`), not being deleted.
    pub fn pods(&self, app: &str) -> Result<Vec<Value>, Error> {
        let selector = format!("app.kubernetes.io/name={app}");
        let list = self
            .lab
            .get_json(&["pods", "-n", SYSTEM_NAMESPACE, "-l", &selector])?;
        Ok(list["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
            .cloned()
            .collect())
    }

    /// Waits until the DaemonSet has one up-to-date Ready pod per node and the Deployment
    /// two up-to-date Ready replicas, nothing else (no old pod left).
    pub fn wait_rolled_out(&self) -> Result<(), Error> {
        wait_for(
            "3 agent pods and 2 controller pods Ready",
            POD_TIMEOUT,
            || {
                let ds =
                    self.lab
                        .get_json(&["daemonset", "-n", SYSTEM_NAMESPACE, "aliaslb-agent"])?;
                let dep = self.lab.get_json(&[
                    "deployment",
                    "-n",
                    SYSTEM_NAMESPACE,
                    "aliaslb-controller",
                ])?;
                let (s, d) = (&ds["status"], &dep["status"]);
                let agents = self.pods("aliaslb-agent")?;
                let controllers = self.pods("aliaslb-controller")?;
                let ok = s["desiredNumberScheduled"] == 3
                    && s["numberReady"] == 3
                    && s["updatedNumberScheduled"] == 3
                    && s["observedGeneration"] == ds["metadata"]["generation"]
                    && d["readyReplicas"] == 2
                    && d["updatedReplicas"] == 2
                    && d["replicas"] == 2
                    && d["observedGeneration"] == dep["metadata"]["generation"]
                    && agents.len() == 3
                    && controllers.len() == 2
                    && agents.iter().chain(&controllers).all(ready);
                Ok(if ok {
                    Ok(())
                } else {
                    Err(format!(
                        "agents {} (ready {}), controllers {} (ready {}); DaemonSet {s}; Deployment {d}",
                        agents.len(),
                        agents.iter().filter(|p| ready(p)).count(),
                        controllers.len(),
                        controllers.iter().filter(|p| ready(p)).count(),
                    ))
                })
            },
        )
    }

    /// The agent pod on node `n`.
    pub fn agent_pod(&self, n: u8) -> Result<String, Error> {
        self.pods("aliaslb-agent")?
            .iter()
            .find(|p| p["spec"]["nodeName"] == node_name(n).as_str())
            .and_then(|p| p["metadata"]["name"].as_str().map(str::to_owned))
            .ok_or_else(|| Error::Environment(format!("no agent pod on {}", node_name(n))))
    }

    /// Waits for a leader other than `not` among the controller pods; its name.
    pub fn wait_new_leader(&self, not: Option<&str>, timeout: Duration) -> Result<String, Error> {
        wait_for("a controller pod to lead", timeout, || {
            let leader = self.lab.leader()?;
            let names: Vec<String> = self
                .pods("aliaslb-controller")?
                .iter()
                .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_owned))
                .collect();
            Ok(match leader {
                Some(l) if Some(l.as_str()) != not && names.contains(&l) => Ok(l),
                other => Err(format!("leader {other:?}, controller pods {names:?}")),
            })
        })
    }

    /// The pods' phases and the last lines of every aliaslb container's log (on failure).
    pub fn diagnostics(&self) -> String {
        let mut out = self
            .lab
            .kubectl(&["get", "pods", "-A", "-o", "wide"])
            .unwrap_or_else(|e| format!("{e}"));
        for n in NODES {
            let logs = run(Command::new("bash")
                .arg(repo_root().join("scripts/kubelets"))
                .args(["logs", &n.to_string(), "aliaslb-"])
                .env("ALIASLB_LAB_DIR", self.lab.state_dir()))
            .unwrap_or_else(|e| format!("{e}"));
            let tail: Vec<&str> = logs.lines().rev().take(30).collect();
            out.push_str(&format!("\n---- {} ----\n", node_name(n)));
            out.push_str(&tail.into_iter().rev().collect::<Vec<_>>().join("\n"));
        }
        out
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("---- the cluster ----\n{}", self.diagnostics());
        }
    }
}
