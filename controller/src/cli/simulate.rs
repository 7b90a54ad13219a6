//! `aliaslb simulate cordon NODE` and `aliaslb simulate agent-lost NODE`: which addresses
//! would move where, computed by the controller's planner on the live state twice, as it
//! is and after the change, and compared. Nothing is written.
//!
//! [`moves`] and [`render_table`] are pure.

use std::net::IpAddr;

use aliaslb_core::plan::{ServiceKey, ServicePlan};
use serde::Serialize;

use crate::cli::live::{Planned, ip_list};
use crate::cli::status::columns;

/// One Service whose placement the change alters.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Move {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub service: String,
    /// Its addresses before the change.
    pub ips: Vec<IpAddr>,
    /// Its addresses after (differ only when it would be renumbered or lose them).
    pub ips_after: Vec<IpAddr>,
    /// The node(s) announcing it now (L3: comma-separated); `None`: none.
    pub from: Option<String>,
    /// The node(s) after the change; `None`: none.
    pub to: Option<String>,
    /// Why there is no node after, or why the address changes: the Announced or
    /// IPAllocated condition's message after the change.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
}

fn nodes_of(plan: &ServicePlan) -> Option<String> {
    plan.node_annotation().map(|n| n.into_owned())
}

/// The Services whose addresses or nodes differ between `before` and `after`, by key.
pub fn moves(before: &Planned, after: &Planned) -> Vec<Move> {
    let mut out = Vec::new();
    for (key, was) in &before.output.services {
        let Some(now) = after.output.services.get(key) else {
            continue;
        };
        let (from, to) = (nodes_of(was), nodes_of(now));
        if from == to && was.ips == now.ips {
            continue;
        }
        let why = if now.ips.is_empty() || now.ips != was.ips {
            Some(now.allocated.message.clone())
        } else if to.is_none() {
            Some(now.announced.message.clone())
        } else {
            None
        };
        out.push(move_of(key, was, now, from, to, why));
    }
    out
}

fn move_of(
    key: &ServiceKey,
    was: &ServicePlan,
    now: &ServicePlan,
    from: Option<String>,
    to: Option<String>,
    why: Option<String>,
) -> Move {
    Move {
        namespace: key.namespace.to_string(),
        service: key.name.to_string(),
        ips: was.ips.clone(),
        ips_after: now.ips.clone(),
        from,
        to,
        why: why.filter(|w| !w.is_empty()),
    }
}

/// A headline naming the change and how many Services it moves, then one row per move.
pub fn render_table(change: &str, total: usize, moves: &[Move]) -> String {
    let mut out = format!(
        "{change}: {} of {total} Service(s) would move (computed by the controller's planner on the live state; nothing was changed)\n",
        moves.len()
    );
    if moves.is_empty() {
        return out;
    }
    let mut table = vec![[
        "NAMESPACE".to_owned(),
        "SERVICE".to_owned(),
        "IP".to_owned(),
        "FROM".to_owned(),
        "TO".to_owned(),
        "WHY".to_owned(),
    ]];
    for m in moves {
        let ip = if m.ips == m.ips_after {
            ip_list(&m.ips)
        } else {
            format!("{} -> {}", ip_list(&m.ips), ip_list(&m.ips_after))
        };
        table.push([
            m.namespace.clone(),
            m.service.clone(),
            ip,
            m.from.clone().unwrap_or_else(|| "-".to_owned()),
            m.to.clone().unwrap_or_else(|| "-".to_owned()),
            m.why.clone().unwrap_or_default(),
        ]);
    }
    out.push('\n');
    out.push_str(&columns(&table));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_names_the_change_and_each_move() {
        let m = Move {
            namespace: "a".into(),
            service: "web".into(),
            ips: vec!["10.0.0.1".parse().unwrap()],
            ips_after: vec!["10.0.0.1".parse().unwrap()],
            from: Some("n1".into()),
            to: None,
            why: Some("no eligible node".into()),
        };
        let text = render_table("cordon n1", 3, &[m]);
        assert!(
            text.starts_with("cordon n1: 1 of 3 Service(s) would move"),
            "{text}"
        );
        let row: Vec<&str> = text.lines().last().unwrap().split_whitespace().collect();
        assert_eq!(row[..5], ["a", "web", "10.0.0.1", "n1", "-"], "{text}");
        assert!(text.contains("no eligible node"), "{text}");
    }
}
