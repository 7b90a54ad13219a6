//! `aliaslb check`: what is wrong now, in order of harm, each with the runbook of the alert
//! that fires for it. Exit status 0 when nothing is (notes aside), 1 when something is.
//!
//! Order of harm: first what leaves clients without an answer now (addresses no node
//! announces, Services without an IP), then what stops aliaslb from acting (no leader, no
//! agent ready, a rejected pool config), then what will hurt next (agents not renewing,
//! shields failing, conflicts, full pools).
//!
//! [`findings`] and [`render`] are pure; the cluster is read by [`crate::cli::live`] and
//! [`leader`].

use std::collections::BTreeMap;

use aliaslb_core::report::ShieldState;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use serde::Serialize;

use crate::cli::pools::PoolRow;
use crate::cli::select::Selection;
use crate::cli::status::{self, AgentInfo, Report};

/// Where the runbooks are, one per alert.
pub const RUNBOOKS: &str = "https://github.com/aliaslb/aliaslb/blob/main/docs/runbooks/";

/// How bad a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Clients get no answer now, or aliaslb cannot act.
    Critical,
    /// Something is wrong that will hurt.
    Warning,
    /// Worth knowing; not a failure of `check`.
    Note,
}

impl Severity {
    fn label(self) -> &'static str {
        match self {
            Severity::Critical => "CRITICAL",
            Severity::Warning => "WARNING",
            Severity::Note => "NOTE",
        }
    }
}

/// One thing wrong.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Finding {
    /// How bad.
    pub severity: Severity,
    /// Its alert (the name of its runbook).
    pub alert: &'static str,
    /// What is wrong, in a sentence.
    pub summary: String,
    /// The objects concerned (`namespace/name`, node names...), with a word on each.
    pub objects: Vec<String>,
    /// The alert's runbook.
    pub runbook: String,
}

/// The controller's leader Lease as read.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Leader {
    /// Its holder, if any.
    pub holder: Option<String>,
    /// Renewed within its duration, by this machine's clock.
    pub fresh: bool,
}

/// The leader Lease `lease` (`None`: it does not exist) read at `now`.
pub fn leader(lease: Option<&Lease>, now: Timestamp) -> Leader {
    let Some(spec) = lease.and_then(|l| l.spec.as_ref()) else {
        return Leader::default();
    };
    let duration = spec
        .lease_duration_seconds
        .and_then(|s| u64::try_from(s).ok())
        .map_or(
            std::time::Duration::from_secs(15),
            std::time::Duration::from_secs,
        );
    let fresh = spec.renew_time.as_ref().is_some_and(|t| {
        std::time::Duration::try_from(now.duration_since(t.0)).is_ok_and(|ago| ago <= duration)
    });
    Leader {
        holder: spec.holder_identity.clone().filter(|h| !h.is_empty()),
        fresh,
    }
}

/// What `check` reads.
#[derive(Debug)]
pub struct Evidence<'a> {
    /// The controller's leader Lease.
    pub leader: Leader,
    /// The pool ConfigMap's errors, if it is invalid (then there is no report).
    pub config_errors: Vec<String>,
    /// `aliaslb status`'s report (already filtered), if the config is valid.
    pub report: Option<&'a Report>,
    /// The pools' usage (already filtered), if the config is valid.
    pub pools: &'a [PoolRow],
    /// The agents, by node.
    pub agents: &'a BTreeMap<String, AgentInfo>,
    /// Whether any Node exists.
    pub nodes: usize,
    /// What the user asked to look at.
    pub selection: &'a Selection,
}

fn finding(
    severity: Severity,
    alert: &'static str,
    summary: String,
    objects: Vec<String>,
) -> Finding {
    Finding {
        severity,
        alert,
        summary,
        objects,
        runbook: format!("{RUNBOOKS}{alert}.md"),
    }
}

/// Everything wrong in `e`, worst first.
pub fn findings(e: &Evidence<'_>) -> Vec<Finding> {
    let mut out = Vec::new();
    let node_selected = |node: &str| e.selection.on_node(Some(node));
    if let Some(report) = e.report {
        let dark: Vec<String> = report
            .routes
            .iter()
            .filter(|r| r.in_use)
            .filter(|r| {
                matches!(
                    r.state.as_str(),
                    "no-node" | "waiting-for-agent" | "not-announced" | status::CONFLICT
                )
            })
            .map(|r| {
                format!(
                    "{}/{} {} ({}{})",
                    r.namespace.as_deref().unwrap_or("-"),
                    r.service.as_deref().unwrap_or("-"),
                    r.first,
                    r.state,
                    r.node
                        .as_deref()
                        .map(|n| format!(" on {n}"))
                        .unwrap_or_default()
                )
            })
            .collect();
        if !dark.is_empty() {
            out.push(finding(
                Severity::Critical,
                "AliaslbServiceNotAnnounced",
                format!(
                    "{} address(es) of Services are not announced by any node: clients get no answer",
                    dark.len()
                ),
                dark,
            ));
        }
        let pending: Vec<String> = report
            .pending
            .iter()
            .map(|p| format!("{}/{} ({})", p.namespace, p.service, p.reason))
            .collect();
        if !pending.is_empty() {
            out.push(finding(
                Severity::Critical,
                "AliaslbServicePending",
                format!("{} Service(s) have no IP", pending.len()),
                pending,
            ));
        }
    }
    if !e.leader.fresh {
        out.push(finding(
            Severity::Critical,
            "AliaslbNoLeader",
            match &e.leader.holder {
                Some(h) => format!("no controller replica leads: the leader Lease of {h} is not renewed; nothing is allocated or moved"),
                None => "no controller replica leads (no leader Lease holder): nothing is allocated or moved".to_owned(),
            },
            Vec::new(),
        ));
    }
    let ready = e.agents.values().filter(|a| a.fresh).count();
    if ready == 0 && e.nodes > 0 {
        out.push(finding(
            Severity::Critical,
            "AliaslbNoAgentsReady",
            format!(
                "no agent is ready ({} agent Lease(s), {} Node(s)): nothing is announced anew and nothing fails over",
                e.agents.len(),
                e.nodes
            ),
            Vec::new(),
        ));
    }
    if !e.config_errors.is_empty() {
        out.push(finding(
            Severity::Critical,
            "AliaslbConfigRejected",
            format!(
                "the pool ConfigMap is invalid ({} error(s)): the controller runs on its last good config, or on none",
                e.config_errors.len()
            ),
            e.config_errors.clone(),
        ));
    }
    let stale: Vec<String> = e
        .agents
        .iter()
        .filter(|(node, a)| !a.fresh && node_selected(node))
        .map(|(node, a)| match a.renewed_ago {
            Some(ago) => format!("{node} (renewed {}s ago)", ago.as_secs()),
            None => format!("{node} (never renewed)"),
        })
        .collect();
    if !stale.is_empty() && ready > 0 {
        out.push(finding(
            Severity::Warning,
            "AliaslbAgentNotRenewing",
            format!(
                "{} agent(s) do not renew their Lease: their nodes count as lost",
                stale.len()
            ),
            stale,
        ));
    }
    let failing: Vec<String> = e
        .agents
        .iter()
        .filter(|(node, a)| a.report.shield == ShieldState::Failing && node_selected(node))
        .map(|(node, _)| node.clone())
        .collect();
    if !failing.is_empty() {
        out.push(finding(
            Severity::Warning,
            "AliaslbShieldFailing",
            format!(
                "{} agent(s) cannot write their nftables table and add no alias",
                failing.len()
            ),
            failing,
        ));
    }
    if let Some(report) = e.report {
        let claimed = |state: &str| -> Vec<String> {
            report
                .routes
                .iter()
                .filter(|r| r.state == state)
                .map(|r| {
                    format!(
                        "{} ({}{})",
                        r.first,
                        r.service
                            .as_ref()
                            .map(|s| format!("{}/{s}, ", r.namespace.as_deref().unwrap_or("-")))
                            .unwrap_or_default(),
                        r.mac
                            .as_deref()
                            .map_or("another owner".to_owned(), |m| format!("claimed by {m}"))
                    )
                })
                .collect()
        };
        let defended = claimed(status::DEFENDED);
        if !defended.is_empty() {
            out.push(finding(
                Severity::Warning,
                "AliaslbAddressDefended",
                format!("{} held address(es) are claimed on the LAN by another host: defended, but some clients may reach that host", defended.len()),
                defended,
            ));
        }
        let withheld: Vec<String> = report
            .routes
            .iter()
            .filter(|r| !r.in_use && r.state == status::CONFLICT)
            .map(|r| format!("{} ({})", r.first, r.mac.as_deref().unwrap_or("-")))
            .collect();
        if !withheld.is_empty() {
            out.push(finding(
                Severity::Warning,
                "AliaslbAddressConflict",
                format!("{} pool address(es) are answered on the LAN by a host outside the cluster: withheld", withheld.len()),
                withheld,
            ));
        }
    }
    // A full pool with Services waiting hurts now (they are pending, above); without, the
    // next Service of its namespaces will wait.
    for (waiting, severity, summary) in [
        (
            true,
            Severity::Warning,
            "pool(s) have no free address, and Services wait for one",
        ),
        (
            false,
            Severity::Note,
            "pool(s) have no free address: the next Service of their namespaces will wait",
        ),
    ] {
        let full: Vec<String> = e
            .pools
            .iter()
            // A pool whose every address drains is being retired: "full" says nothing
            // (the pool alerts leave it out too), unless Services wait on it.
            .filter(|p| p.addresses > 0 && p.free == 0 && (p.pending > 0) == waiting)
            .filter(|p| waiting || p.draining < p.addresses)
            .map(|p| format!("{} {} ({} addresses)", p.pool, p.family, p.addresses))
            .collect();
        if !full.is_empty() {
            out.push(finding(
                severity,
                "AliaslbPoolExhausted",
                format!("{} {summary}", full.len()),
                full,
            ));
        }
    }
    let filling: Vec<String> = e
        .pools
        .iter()
        .filter(|p| p.free > 0 && p.usage_percent >= 85.0 && p.draining < p.addresses)
        .map(|p| format!("{} {} ({:.0}% used)", p.pool, p.family, p.usage_percent))
        .collect();
    if !filling.is_empty() {
        out.push(finding(
            Severity::Note,
            "AliaslbPoolUsage85Percent",
            format!("{} pool(s) are 85 % used or more", filling.len()),
            filling,
        ));
    }
    // Stable: worst first, then in the order above.
    out.sort_by_key(|f| f.severity);
    out
}

/// Whether `findings` make `check` fail (anything but notes).
pub fn failing(findings: &[Finding]) -> bool {
    findings.iter().any(|f| f.severity != Severity::Note)
}

/// The findings for people: one block each, its objects indented, its runbook last; first
/// `nothing wrong: ` and `summary` (what was looked at) when there are only notes.
pub fn render(findings: &[Finding], summary: &str) -> String {
    let mut out = String::new();
    if !failing(findings) {
        out.push_str(&format!("nothing wrong: {summary}\n"));
    }
    for f in findings {
        out.push_str(&format!("{:<8}  {}\n", f.severity.label(), f.summary));
        const SHOWN: usize = 20;
        for o in f.objects.iter().take(SHOWN) {
            out.push_str(&format!("          - {o}\n"));
        }
        if f.objects.len() > SHOWN {
            out.push_str(&format!(
                "          ... and {} more (-o json lists them all)\n",
                f.objects.len() - SHOWN
            ));
        }
        out.push_str(&format!("          runbook: {}\n", f.runbook));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::status::{NodeRow, Pending, Route};
    use std::time::Duration;

    fn agent(fresh: bool, shield: ShieldState) -> AgentInfo {
        AgentInfo {
            report: aliaslb_core::report::AgentReport {
                shield,
                ..Default::default()
            },
            renew_time: None,
            renewed_ago: Some(Duration::from_secs(if fresh { 1 } else { 90 })),
            fresh,
        }
    }

    fn route(ns: &str, state: &str, node: Option<&str>) -> Route {
        let ip = "10.0.0.1".parse().unwrap();
        Route {
            first: ip,
            last: ip,
            addresses: 1,
            in_use: true,
            pool: ns.into(),
            namespace: Some(ns.into()),
            service: Some("web".into()),
            cluster_ip: None,
            node: node.map(Into::into),
            state: state.into(),
            mac: None,
        }
    }

    fn pool(free: u128, addresses: u128) -> PoolRow {
        #[allow(clippy::cast_precision_loss)]
        let usage = (addresses - free) as f64 * 100.0 / addresses as f64;
        PoolRow {
            pool: "p".into(),
            family: "IPv4".into(),
            addresses,
            in_use: addresses - free,
            quarantined: 0,
            draining: 0,
            free,
            usage_percent: usage,
            pending: 0,
        }
    }

    #[test]
    fn healthy_is_nothing() {
        let agents = BTreeMap::from([("n1".to_owned(), agent(true, ShieldState::Active))]);
        let report = Report {
            routes: vec![route("a", "announced", Some("n1"))],
            pending: Vec::new(),
            nodes: Vec::<NodeRow>::new(),
        };
        let f = findings(&Evidence {
            leader: Leader {
                holder: Some("c1".into()),
                fresh: true,
            },
            config_errors: Vec::new(),
            report: Some(&report),
            pools: &[pool(3, 4)],
            agents: &agents,
            nodes: 1,
            selection: &Selection::default(),
        });
        assert!(f.is_empty(), "{f:?}");
        assert!(render(&f, "1 Service").starts_with("nothing wrong"));
    }

    #[test]
    fn worst_first_each_with_its_runbook() {
        let agents = BTreeMap::from([
            ("n1".to_owned(), agent(true, ShieldState::Failing)),
            ("n2".to_owned(), agent(false, ShieldState::Active)),
        ]);
        let report = Report {
            routes: vec![
                route("a", "waiting-for-agent", Some("n2")),
                route("b", "announced", Some("n1")),
            ],
            pending: vec![Pending {
                namespace: "c".into(),
                service: "db".into(),
                reason: "PoolExhausted".into(),
                message: String::new(),
            }],
            nodes: Vec::new(),
        };
        let f = findings(&Evidence {
            leader: Leader {
                holder: Some("c1".into()),
                fresh: false,
            },
            config_errors: Vec::new(),
            report: Some(&report),
            pools: &[
                PoolRow {
                    pending: 1,
                    ..pool(0, 4)
                },
                pool(1, 10),
                pool(0, 2),
            ],
            agents: &agents,
            nodes: 2,
            selection: &Selection::default(),
        });
        let alerts: Vec<&str> = f.iter().map(|f| f.alert).collect();
        assert_eq!(
            alerts,
            [
                "AliaslbServiceNotAnnounced",
                "AliaslbServicePending",
                "AliaslbNoLeader",
                "AliaslbAgentNotRenewing",
                "AliaslbShieldFailing",
                "AliaslbPoolExhausted",
                "AliaslbPoolExhausted",
                "AliaslbPoolUsage85Percent",
            ]
        );
        assert_eq!(
            f[6].severity,
            Severity::Note,
            "full, nobody waiting: {:?}",
            f[6]
        );
        assert_eq!(f[0].objects, ["a/web 10.0.0.1 (waiting-for-agent on n2)"]);
        assert!(f[1].objects[0].contains("c/db (PoolExhausted)"));
        assert!(
            f.iter()
                .all(|f| f.runbook == format!("{RUNBOOKS}{}.md", f.alert))
        );
        assert!(failing(&f));
        assert!(!failing(&f[6..]), "notes alone do not fail");
        assert!(render(&f[6..], "").starts_with("nothing wrong"));
        let text = render(&f, "");
        assert!(text.starts_with("CRITICAL  1 address(es)"), "{text}");
        assert!(text.contains("runbook: https://"), "{text}");
    }

    #[test]
    fn no_agents_at_all_and_an_invalid_config() {
        let agents = BTreeMap::new();
        let f = findings(&Evidence {
            leader: Leader {
                holder: None,
                fresh: true,
            },
            config_errors: vec!["key a, line 1: bad".into()],
            report: None,
            pools: &[],
            agents: &agents,
            nodes: 3,
            selection: &Selection::default(),
        });
        let alerts: Vec<&str> = f.iter().map(|f| f.alert).collect();
        assert_eq!(alerts, ["AliaslbNoAgentsReady", "AliaslbConfigRejected"]);
    }

    #[test]
    fn the_leader_lease() {
        use k8s_openapi::api::coordination::v1::LeaseSpec;
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
        let now = Timestamp::now();
        let lease = |ago: i64| Lease {
            spec: Some(LeaseSpec {
                holder_identity: Some("c1".into()),
                lease_duration_seconds: Some(15),
                renew_time: Some(MicroTime(
                    now - k8s_openapi::jiff::SignedDuration::from_secs(ago),
                )),
                ..LeaseSpec::default()
            }),
            ..Lease::default()
        };
        assert!(leader(Some(&lease(3)), now).fresh);
        assert!(!leader(Some(&lease(30)), now).fresh);
        assert_eq!(leader(None, now), Leader::default());
    }
}
