//! `aliaslb pools`: the usage of every pool, per family, as the controller's planner
//! counts it (the numbers behind `aliaslb_pool_addresses`, `..._in_use`,
//! `..._quarantined` and `..._draining`, which the pool alerts read), with the Services
//! waiting for an address of each pool.
//!
//! [`rows`] and [`render_table`] are pure; the snapshot and the planner pass come from
//! [`crate::cli::live`].

use std::collections::BTreeMap;

use aliaslb_core::plan::{PoolUsage, ServiceKey, reason};
use aliaslb_core::pool::PoolConfig;
use aliaslb_core::range::Family;
use serde::Serialize;

use crate::cli::live::Planned;
use crate::cli::status::columns;

/// One pool and family.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolRow {
    /// Pool key: a namespace, or `_fallback`.
    pub pool: String,
    /// `IPv4` or `IPv6`.
    pub family: String,
    /// Addresses the pool can hand out (those a Node lists, never allocated, not counted).
    pub addresses: u128,
    /// Addresses handed out or quarantined.
    pub in_use: u128,
    /// Of those, quarantined: answered by a foreign host, or still shown on a Service
    /// that stopped being ours.
    pub quarantined: u128,
    /// Of those, in draining entries (or a draining pool): left to move.
    pub draining: u128,
    /// Addresses left.
    pub free: u128,
    /// `in_use / addresses`, in percent (the pool alerts' ratio).
    pub usage_percent: f64,
    /// Services waiting on the pool (it is exhausted, draining, not theirs, ...),
    /// primarily of this family.
    pub pending: usize,
}

/// Services of ours without an address and no pool to draw from (no pool for their
/// namespace, or one they name that does not exist), by key.
pub fn without_pool(planned: &Planned) -> Vec<&ServiceKey> {
    planned
        .output
        .services
        .iter()
        .filter(|(_, plan)| {
            plan.ips.is_empty()
                && matches!(
                    plan.allocated.reason,
                    reason::NO_POOL | reason::UNKNOWN_POOL
                )
        })
        .map(|(key, _)| key)
        .collect()
}

/// The rows of every pool and family, pools in config order (namespaces by name, then
/// `_fallback`), IPv4 first.
pub fn rows(planned: &Planned, config: &PoolConfig) -> Vec<PoolRow> {
    let mut quarantined: BTreeMap<(String, Family), u128> = BTreeMap::new();
    for ip in planned.planner.quarantined() {
        if let Some((pool, _)) = config.pools().find(|(_, p)| p.contains(ip)) {
            *quarantined
                .entry((pool.to_string(), Family::of(ip)))
                .or_default() += 1;
        }
    }
    let mut pending: BTreeMap<(String, Family), usize> = BTreeMap::new();
    for (pool, keys) in planned.planner.pending_on() {
        for key in keys {
            let family = planned
                .views
                .get(&key)
                .and_then(|v| v.families.families.first().copied())
                .unwrap_or(Family::V4);
            *pending.entry((pool.to_string(), family)).or_default() += 1;
        }
    }
    let usage: BTreeMap<(String, Family), PoolUsage> = planned
        .planner
        .usage()
        .into_iter()
        .map(|u| ((u.pool.to_string(), u.family), u))
        .collect();
    let mut out = Vec::new();
    for (key, _) in config.pools() {
        for family in [Family::V4, Family::V6] {
            let at = (key.to_string(), family);
            let (addresses, in_use, draining) = usage
                .get(&at)
                .map_or((0, 0, 0), |u| (u.total, u.in_use, u.draining));
            let waiting = pending.get(&at).copied().unwrap_or(0);
            if addresses == 0 && waiting == 0 {
                continue;
            }
            out.push(PoolRow {
                pool: at.0.clone(),
                family: family.to_string(),
                addresses,
                in_use,
                quarantined: quarantined.get(&at).copied().unwrap_or(0),
                draining,
                free: addresses.saturating_sub(in_use),
                #[allow(clippy::cast_precision_loss)]
                usage_percent: if addresses == 0 {
                    100.0
                } else {
                    in_use as f64 * 100.0 / addresses as f64
                },
                pending: waiting,
            });
        }
    }
    out
}

/// The rows as aligned columns, then one line for the Services without a pool. The
/// DRAINING column (addresses of draining entries still in use: left to move) is shown
/// only while some pool has one.
pub fn render_table(rows: &[PoolRow], without_pool: &[&ServiceKey]) -> String {
    let draining = rows.iter().any(|r| r.draining > 0);
    let mut header = vec!["POOL", "FAMILY", "ADDRESSES", "IN USE", "QUARANTINED"];
    if draining {
        header.push("DRAINING");
    }
    header.extend(["FREE", "USAGE", "PENDING"]);
    let mut table: Vec<Vec<String>> = vec![header.into_iter().map(str::to_owned).collect()];
    for r in rows {
        let mut cells = vec![
            r.pool.clone(),
            r.family.clone(),
            r.addresses.to_string(),
            r.in_use.to_string(),
            r.quarantined.to_string(),
        ];
        if draining {
            cells.push(r.draining.to_string());
        }
        cells.extend([
            r.free.to_string(),
            format!("{:.1}%", r.usage_percent),
            r.pending.to_string(),
        ]);
        table.push(cells);
    }
    let mut out = if rows.is_empty() {
        "no pools: the pool ConfigMap lists no addresses\n".to_owned()
    } else {
        columns(&table)
    };
    if !without_pool.is_empty() {
        let names: Vec<String> = without_pool.iter().map(ToString::to_string).collect();
        out.push_str(&format!(
            "\n{} Service(s) pending without a pool (none for their namespace, or one they name that does not exist): {}\n",
            names.len(),
            names.join(", ")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(pool: &str, addresses: u128, in_use: u128, pending: usize) -> PoolRow {
        PoolRow {
            pool: pool.into(),
            family: "IPv4".into(),
            addresses,
            in_use,
            quarantined: 0,
            draining: 0,
            free: addresses - in_use,
            #[allow(clippy::cast_precision_loss)]
            usage_percent: in_use as f64 * 100.0 / addresses as f64,
            pending,
        }
    }

    #[test]
    fn the_table_shows_usage_and_the_services_without_a_pool() {
        let key = ServiceKey::new("lost", "web");
        let text = render_table(&[row("team-a", 4, 3, 1)], &[&key]);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("POOL"), "{text}");
        let cells: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(cells, ["team-a", "IPv4", "4", "3", "0", "1", "75.0%", "1"]);
        assert!(
            text.contains("1 Service(s) pending without a pool"),
            "{text}"
        );
        assert!(text.contains("lost/web"), "{text}");
    }

    #[test]
    fn the_draining_column_shows_while_a_pool_drains() {
        let mut draining = row("old", 4, 3, 0);
        draining.draining = 2;
        let text = render_table(&[row("team-a", 4, 3, 1), draining], &[]);
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].contains("DRAINING"), "{text}");
        let cells: Vec<&str> = lines[2].split_whitespace().collect();
        assert_eq!(
            cells,
            ["old", "IPv4", "4", "3", "0", "2", "1", "75.0%", "0"]
        );
    }

    #[test]
    fn no_pools_is_said() {
        assert!(render_table(&[], &[]).starts_with("no pools"));
    }
}
