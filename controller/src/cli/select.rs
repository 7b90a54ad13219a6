//! What the read-only commands show, as kubectl users ask for it: the filters (`-n`/`-A`,
//! `--pool`, `--node`, `--problems`) applied to `aliaslb status`'s report, and the output
//! formats (`-o table|wide|json|yaml`). Pure: no I/O.

use serde::Serialize;

use crate::cli::status::{Report, Route};

/// Route states that are not a problem: served, or free to serve.
const FINE: [&str; 2] = ["announced", "free"];

/// The filters of a read-only command; `None` / `false` keeps everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selection {
    /// Only the Services of this namespace (`-n`), and the free addresses of its pool;
    /// `None`: every namespace (`-A`, or no `-n`).
    pub namespace: Option<String>,
    /// Only this pool key (`--pool`).
    pub pool: Option<String>,
    /// Only what is on this node (`--node`): the addresses it carries, its agent.
    pub node: Option<String>,
    /// Only what is wrong (`--problems`): addresses not announced, pending Services,
    /// agents not fresh or whose shield is not active.
    pub problems: bool,
}

impl Selection {
    /// Whether a Service of namespace `ns`, from pool `pool`, is selected (node and
    /// problems aside).
    pub fn service(&self, ns: &str, pool: Option<&str>) -> bool {
        self.namespace.as_deref().is_none_or(|want| want == ns)
            && self.pool.as_deref().is_none_or(|want| Some(want) == pool)
    }

    /// Whether `nodes` (one name, or L3's comma-separated list) has the selected node.
    pub fn on_node(&self, nodes: Option<&str>) -> bool {
        self.node
            .as_deref()
            .is_none_or(|want| nodes.is_some_and(|nodes| nodes.split(',').any(|n| n == want)))
    }

    fn route(&self, r: &Route, pool_of: &dyn Fn(&str) -> Option<String>) -> bool {
        let namespace = match (&self.namespace, &r.namespace) {
            (None, _) => true,
            (Some(want), Some(ns)) => want == ns,
            // An address no Service uses: shown with its namespace's pool.
            (Some(want), None) => pool_of(want).as_deref() == Some(r.pool.as_str()),
        };
        namespace
            && self.pool.as_deref().is_none_or(|want| want == r.pool)
            && self.on_node(r.node.as_deref())
            && (!self.problems || !FINE.contains(&r.state.as_str()) || r.mac.is_some())
    }

    /// `report` with only what is selected; `pool_of` gives a namespace's pool key.
    pub fn report(&self, report: Report, pool_of: &dyn Fn(&str) -> Option<String>) -> Report {
        let routes = report
            .routes
            .into_iter()
            .filter(|r| self.route(r, pool_of))
            .collect();
        // Pending Services have no node: `--node` shows none.
        let pending = report
            .pending
            .into_iter()
            .filter(|p| {
                self.node.is_none() && self.service(&p.namespace, pool_of(&p.namespace).as_deref())
            })
            .collect();
        let nodes = report
            .nodes
            .into_iter()
            .filter(|n| self.node.as_deref().is_none_or(|want| want == n.node))
            .filter(|n| {
                !self.problems || !n.fresh || n.shield != aliaslb_core::report::ShieldState::Active
            })
            .collect();
        Report {
            routes,
            pending,
            nodes,
        }
    }
}

/// How a command prints (kubectl's `-o`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    /// Aligned columns for people.
    #[default]
    Table,
    /// The table with more columns.
    Wide,
    /// JSON for scripts (stable field names).
    Json,
    /// YAML, the same fields as JSON.
    Yaml,
}

impl Output {
    /// `value` as JSON or YAML; `None` for the table formats (the command renders those).
    pub fn encode<T: Serialize>(self, value: &T) -> Option<Result<String, String>> {
        match self {
            Output::Table | Output::Wide => None,
            Output::Json => Some(
                serde_json::to_string_pretty(value)
                    .map(|s| s + "\n")
                    .map_err(|e| format!("cannot encode the report as JSON: {e}")),
            ),
            Output::Yaml => Some(
                yaml_serde::to_string(value)
                    .map_err(|e| format!("cannot encode the report as YAML: {e}")),
            ),
        }
    }

    /// Whether the table is the wide one.
    pub fn wide(self) -> bool {
        self == Output::Wide
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::status::{NodeRow, Pending};
    use aliaslb_core::report::ShieldState;

    fn route(ns: Option<&str>, pool: &str, node: Option<&str>, state: &str) -> Route {
        let ip = "10.0.0.1".parse().unwrap();
        Route {
            first: ip,
            last: ip,
            addresses: 1,
            in_use: ns.is_some(),
            pool: pool.into(),
            namespace: ns.map(Into::into),
            service: ns.map(|_| "web".into()),
            cluster_ip: None,
            node: node.map(Into::into),
            state: state.into(),
            mac: None,
        }
    }

    fn report() -> Report {
        let node = |name: &str, fresh: bool, shield: ShieldState| NodeRow {
            node: name.into(),
            renew_time: None,
            renewed_seconds_ago: Some(1),
            fresh,
            shield,
        };
        Report {
            routes: vec![
                route(Some("a"), "a", Some("n1"), "announced"),
                route(Some("a"), "a", Some("n2"), "waiting-for-agent"),
                route(Some("b"), "shared", Some("n1,n2"), "announced"),
                route(None, "a", None, "free"),
                route(None, "shared", None, "free"),
            ],
            pending: vec![Pending {
                namespace: "b".into(),
                service: "db".into(),
                reason: "PoolExhausted".into(),
                message: String::new(),
            }],
            nodes: vec![
                node("n1", true, ShieldState::Active),
                node("n2", false, ShieldState::Active),
                node("n3", true, ShieldState::Failing),
            ],
        }
    }

    fn pool_of(ns: &str) -> Option<String> {
        Some(if ns == "a" { "a" } else { "shared" }.to_owned())
    }

    fn shown(s: &Selection) -> (Vec<String>, usize, Vec<String>) {
        let r = s.report(report(), &pool_of);
        (
            r.routes
                .iter()
                .map(|r| format!("{}:{}", r.namespace.as_deref().unwrap_or(&r.pool), r.state))
                .collect(),
            r.pending.len(),
            r.nodes.iter().map(|n| n.node.clone()).collect(),
        )
    }

    #[test]
    fn nothing_selected_is_everything() {
        let (routes, pending, nodes) = shown(&Selection::default());
        assert_eq!(routes.len(), 5);
        assert_eq!((pending, nodes.len()), (1, 3));
    }

    #[test]
    fn a_namespace_shows_its_services_and_its_pool_s_free_addresses() {
        let (routes, pending, nodes) = shown(&Selection {
            namespace: Some("a".into()),
            ..Selection::default()
        });
        assert_eq!(routes, ["a:announced", "a:waiting-for-agent", "a:free"]);
        assert_eq!(pending, 0);
        assert_eq!(nodes.len(), 3, "nodes are not namespaced");
    }

    #[test]
    fn pool_node_and_problems() {
        let by_pool = shown(&Selection {
            pool: Some("shared".into()),
            ..Selection::default()
        });
        assert_eq!(by_pool.0, ["b:announced", "shared:free"]);
        assert_eq!(by_pool.1, 1, "db's namespace draws from `shared`");
        let by_node = shown(&Selection {
            node: Some("n2".into()),
            ..Selection::default()
        });
        assert_eq!(
            by_node.0,
            ["a:waiting-for-agent", "b:announced"],
            "L3 lists"
        );
        assert_eq!((by_node.1, by_node.2.clone()), (0, vec!["n2".to_owned()]));
        let problems = shown(&Selection {
            problems: true,
            ..Selection::default()
        });
        assert_eq!(problems.0, ["a:waiting-for-agent"]);
        assert_eq!(problems.1, 1);
        assert_eq!(problems.2, ["n2", "n3"], "stale, and shield failing");
    }

    #[test]
    fn outputs() {
        assert!(Output::Table.encode(&1).is_none());
        assert_eq!(Output::Json.encode(&[1]).unwrap().unwrap(), "[\n  1\n]\n");
        assert_eq!(Output::Yaml.encode(&[1]).unwrap().unwrap(), "- 1\n");
    }
}
