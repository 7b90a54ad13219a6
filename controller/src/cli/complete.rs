//! kubectl's completion of the plugin's names (`kubectl aliaslb explain svc/<TAB>`,
//! `simulate cordon <TAB>`, `--node <TAB>`, `--pool <TAB>`, `-n <TAB>`, `--context <TAB>`):
//! which kind of name the word being completed is ([`wanted`], pure, from the words before
//! it), and the names of that kind in the cluster ([`names`], read-only I/O), read with the
//! connection flags already typed ([`flag`]).

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Service};
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};

/// The kind of name a word is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    /// A LoadBalancer Service of the namespace (`explain`'s target).
    Services,
    /// A Node (`simulate cordon NODE`, `--node`).
    Nodes,
    /// A pool key (`--pool`).
    Pools,
    /// A namespace (`-n`).
    Namespaces,
    /// A context of the kubeconfig (`--context`).
    Contexts,
    /// Not a name: the commands' own completion (subcommands, flags).
    Other,
}

/// The value of flag `names` (`--flag VALUE`, `--flag=VALUE`, `-n VALUE`) among `words`,
/// the last one given.
pub fn flag(words: &[String], names: &[&str]) -> Option<String> {
    let mut found = None;
    let mut it = words.iter().peekable();
    while let Some(w) = it.next() {
        if let Some((name, value)) = w.split_once('=')
            && names.contains(&name)
        {
            found = Some(value.to_owned());
        } else if names.contains(&w.as_str())
            && let Some(value) = it.peek()
        {
            found = Some((*value).clone());
            it.next();
        }
    }
    found
}

/// Flags of the CLI that take a value (so the word after one is not a positional).
const WITH_VALUE: &[&str] = &[
    "-n",
    "--namespace",
    "--node",
    "--pool",
    "--context",
    "--kubeconfig",
    "-o",
    "--output",
    "--controller-namespace",
    "--agent-namespace",
    "--pool-configmap",
    "--load-balancer-class",
    "--output-directory",
];

/// What the word after `words` (the plugin's arguments typed so far, without the one being
/// completed) is.
pub fn wanted(words: &[String]) -> Want {
    match words.last().map(String::as_str) {
        Some("-n" | "--namespace") => return Want::Namespaces,
        Some("--node") => return Want::Nodes,
        Some("--pool") => return Want::Pools,
        Some("--context") => return Want::Contexts,
        Some(flag) if WITH_VALUE.contains(&flag) => return Want::Other,
        _ => {}
    }
    // The positional words, flags and their values left out.
    let mut positional = Vec::new();
    let mut it = words.iter();
    while let Some(w) = it.next() {
        if w.starts_with('-') {
            if WITH_VALUE.contains(&w.as_str()) {
                it.next();
            }
            continue;
        }
        positional.push(w.as_str());
    }
    match positional.as_slice() {
        ["explain"] => Want::Services,
        ["simulate", "cordon" | "agent-lost"] => Want::Nodes,
        _ => Want::Other,
    }
}

/// The names of kind `want` in the cluster: the LoadBalancer Services of `namespace`, the
/// Nodes, the keys of the pool ConfigMap `pool_configmap` of `controller_namespace`, the
/// namespaces. (Contexts come from the kubeconfig, not the cluster: none here.)
pub async fn names(
    client: &Client,
    want: Want,
    namespace: &str,
    controller_namespace: &str,
    pool_configmap: &str,
) -> Result<Vec<String>, kube::Error> {
    let all = ListParams::default();
    Ok(match want {
        Want::Services => Api::<Service>::namespaced(client.clone(), namespace)
            .list(&all)
            .await?
            .items
            .into_iter()
            .filter(|s| {
                s.spec
                    .as_ref()
                    .is_some_and(|spec| spec.type_.as_deref() == Some("LoadBalancer"))
            })
            .map(|s| s.name_any())
            .collect(),
        Want::Nodes => cluster_names(Api::<Node>::all(client.clone())).await?,
        Want::Pools => Api::<ConfigMap>::namespaced(client.clone(), controller_namespace)
            .get_opt(pool_configmap)
            .await?
            .and_then(|cm| cm.data)
            .map(|data| data.into_keys().collect())
            .unwrap_or_default(),
        Want::Namespaces => cluster_names(Api::<Namespace>::all(client.clone())).await?,
        Want::Contexts | Want::Other => Vec::new(),
    })
}

/// The names of every object of `api` (a cluster-scoped kind).
async fn cluster_names<K>(api: Api<K>) -> Result<Vec<String>, kube::Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    Ok(api
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(ResourceExt::name_any)
        .collect())
}

/// The candidates among `names` for the word `current`; for a Service, `svc/NAME` when the
/// word starts so (as kubectl writes targets), else the bare name.
pub fn matching(want: Want, names: &[String], current: &str) -> Vec<String> {
    let (prefix, partial) = match (want, current.split_once('/')) {
        (Want::Services, Some((kind @ ("svc" | "service" | "services"), rest))) => {
            (format!("{kind}/"), rest)
        }
        _ => (String::new(), current),
    };
    names
        .iter()
        .filter(|n| n.starts_with(partial))
        .map(|n| format!("{prefix}{n}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_owned).collect()
    }

    #[test]
    fn what_each_place_wants() {
        assert_eq!(wanted(&words("explain")), Want::Services);
        assert_eq!(wanted(&words("explain -n team-a")), Want::Services);
        assert_eq!(wanted(&words("explain svc/web")), Want::Other);
        assert_eq!(wanted(&words("explain -n")), Want::Namespaces);
        assert_eq!(wanted(&words("simulate cordon")), Want::Nodes);
        assert_eq!(wanted(&words("simulate agent-lost -o json")), Want::Nodes);
        assert_eq!(wanted(&words("status --node")), Want::Nodes);
        assert_eq!(wanted(&words("status --pool")), Want::Pools);
        assert_eq!(wanted(&words("status --context")), Want::Contexts);
        assert_eq!(wanted(&words("status -o")), Want::Other);
        assert_eq!(wanted(&words("status")), Want::Other);
        assert_eq!(wanted(&words("simulate")), Want::Other);
    }

    #[test]
    fn flags_typed_so_far() {
        let w = words("explain --context lab -n a --namespace=b --kubeconfig /k");
        assert_eq!(flag(&w, &["-n", "--namespace"]).as_deref(), Some("b"));
        assert_eq!(flag(&w, &["--context"]).as_deref(), Some("lab"));
        assert_eq!(flag(&w, &["--kubeconfig"]).as_deref(), Some("/k"));
        assert_eq!(flag(&w, &["--pool"]), None);
    }

    #[test]
    fn candidates_keep_the_kind_typed() {
        let names = words("web db web-2");
        assert_eq!(matching(Want::Services, &names, "we"), ["web", "web-2"]);
        assert_eq!(matching(Want::Services, &names, "svc/d"), ["svc/db"]);
        assert_eq!(matching(Want::Nodes, &names, ""), names);
    }
}
