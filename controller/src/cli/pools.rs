//! `aliaslb pools`: the usage of every pool, per family, as the controller's planner
//! counts it (the numbers behind `aliaslb_pool_addresses`, `..._in_use` and
//! `..._quarantined`, which the pool alerts read), with the Services waiting for an
//! address of each pool.
//!
//! [`rows`] and [`render_table`] are pure; the snapshot and the planner pass come from
//! [`crate::cli::live`].

use std::collections::BTreeMap;

use aliaslb_core::plan::{PoolUsage, ServiceKey};
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
    /// Addresses left.
    pub free: u128,
    /// `in_use / addresses`, in percent (the pool alerts' ratio).
    pub usage_percent: f64,
    /// Services of the pool's namespaces, primarily of this family, without an address.
    pub pending: usize,
}

/// Services of ours without an address and no pool to draw from (no key for their
/// namespace, no `_fallback`), by key.
pub fn without_pool<'a>(planned: &'a Planned, config: &PoolConfig) -> Vec<&'a ServiceKey> {
    planned
        .output
        .services
        .iter()
        .filter(|(key, plan)| {
            plan.ips.is_empty() && config.pool_for_namespace(&key.namespace).is_none()
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
    for (key, plan) in &planned.output.services {
        if !plan.ips.is_empty() {
            continue;
        }
        let Some((pool, _)) = config.pool_for_namespace(&key.namespace) else {
            continue;
        };
        let family = planned
            .views
            .get(key)
            .and_then(|v| v.families.families.first().copied())
            .unwrap_or(Family::V4);
        *pending.entry((pool.to_string(), family)).or_default() += 1;
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
            let (addresses, in_use) = usage.get(&at).map_or((0, 0), |u| (u.total, u.in_use));
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

/// The rows as aligned columns, then one line for the Services without a pool.
pub fn render_table(rows: &[PoolRow], without_pool: &[&ServiceKey]) -> String {
    let mut table = vec![[
        "POOL".to_owned(),
        "FAMILY".to_owned(),
        "ADDRESSES".to_owned(),
        "IN USE".to_owned(),
        "QUARANTINED".to_owned(),
        "FREE".to_owned(),
        "USAGE".to_owned(),
        "PENDING".to_owned(),
    ]];
    for r in rows {
        table.push([
            r.pool.clone(),
            r.family.clone(),
            r.addresses.to_string(),
            r.in_use.to_string(),
            r.quarantined.to_string(),
            r.free.to_string(),
            format!("{:.1}%", r.usage_percent),
            r.pending.to_string(),
        ]);
    }
    let mut out = if rows.is_empty() {
        "no pools: the pool ConfigMap lists no addresses\n".to_owned()
    } else {
        columns(&table)
    };
    if !without_pool.is_empty() {
        let names: Vec<String> = without_pool.iter().map(ToString::to_string).collect();
        out.push_str(&format!(
            "\n{} Service(s) pending without a pool (no key for their namespace, no `_fallback`): {}\n",
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
    fn no_pools_is_said() {
        assert!(render_table(&[], &[]).starts_with("no pools"));
    }
}
