//! The pool state where `kubectl get` and `kubectl describe` show it, without a plugin: a
//! ConfigMap of its own, `<pool ConfigMap>-status` (`aliaslb-pools-status`) in the
//! controller's namespace, written by the leader only, with its own field manager
//! ([`FIELD_MANAGER`]).
//!
//! Why an object of its own, not an annotation on the pool ConfigMap nor Events: the pool
//! ConfigMap is what users (and their GitOps tools) write; a status written into it would
//! bump its `resourceVersion` on every allocation, wake every watcher of it, and show as
//! drift to a tool that compares the live object with Git (or be wiped by a `kubectl
//! replace`). Events expire after an hour and say what happened, not what is. A ConfigMap
//! the controller alone writes is read with plain RBAC (`view` in the controller's
//! namespace, which tenants do not have: it names Services of every namespace), needs no
//! CRD, and `kubectl describe configmap aliaslb-pools-status` prints each key as text.
//!
//! What it holds (every value a small YAML document):
//! - `config`: whether the pool ConfigMap as last edited is the config in force (`state`:
//!   `valid`, `invalid`: the last valid config stays in force, `deleted`: the config from
//!   before the deletion stays, `none`: no valid config was ever loaded), the number of
//!   pools in force, and the first [`MAX_ERRORS`] errors of an invalid edit with their key
//!   and line.
//! - one key per pool in force (its ConfigMap key: `team-a`, `pool.internal`,
//!   `_fallback`): per family `size` (what it can hand out, plus draining addresses still
//!   in use), `used`, `free` and `draining` (in use in draining entries: left to move); the
//!   Services pending on it (the first [`MAX_NAMED`]); for a named pool, the namespaces
//!   that may draw from it now (listed, or selected by their labels).
//!
//! [`render`] is pure (what to write); [`StatusWriter`] decides when (only what differs
//! from its last write, at most once per [`STATUS_EVERY`], and again every
//! [`STATUS_REFRESH`] so a deleted object comes back) and writes it with server-side apply
//! behind the leader fence ([`crate::fence::guarded`]). I/O only in [`StatusWriter::write`].

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use aliaslb_core::plan::{PoolUsage, ServiceKey};
use aliaslb_core::pool::{Labels, PoolConfig, PoolKey};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use crate::fence::{ApplyError, guarded};
use crate::pool_state::ConfigState;

/// The field manager of the status ConfigMap's writes.
pub const FIELD_MANAGER: &str = "aliaslb-pool-status";
/// The key of the config's state.
pub const CONFIG_KEY: &str = "config";
/// At most one write per this long: a burst of allocations is one write.
pub const STATUS_EVERY: Duration = Duration::from_secs(2);
/// The same content is written again after this long (an object someone deleted comes
/// back; nothing watches it).
pub const STATUS_REFRESH: Duration = Duration::from_secs(300);
/// Services (or namespaces) named per pool at most; the rest are counted.
pub const MAX_NAMED: usize = 20;
/// Errors of an invalid edit shown at most; the rest are counted.
pub const MAX_ERRORS: usize = 10;

/// The name of the status ConfigMap of pool ConfigMap `pool_configmap`.
pub fn name(pool_configmap: &str) -> String {
    format!("{pool_configmap}-status")
}

/// What the status is made of, as of one pass.
#[derive(Debug, Clone, Copy)]
pub struct StatusInput<'a> {
    /// The pool ConfigMap as last handled.
    pub config: &'a ConfigState,
    /// The usage of every pool and family ([`aliaslb_core::plan::Planner::usage`]).
    pub usage: &'a [PoolUsage],
    /// The Services pending on each pool ([`aliaslb_core::plan::Planner::pending_on`]).
    pub pending: &'a BTreeMap<PoolKey, Vec<ServiceKey>>,
    /// Every namespace's labels (who a named pool's selector selects).
    pub namespaces: &'a BTreeMap<String, Labels>,
}

/// The status ConfigMap's `data` for `input`.
pub fn render(input: &StatusInput<'_>) -> BTreeMap<String, String> {
    let mut data = BTreeMap::new();
    let state = input.config;
    let in_force = state.in_force();
    let (name, note) = match (state.valid(), state.deleted(), in_force.is_some()) {
        (true, _, true) => ("valid", "the pool ConfigMap as last edited is in force"),
        (false, true, true) => (
            "deleted",
            "the pool ConfigMap was deleted: the config from before stays in force",
        ),
        (false, false, true) => (
            "invalid",
            "the last edit is invalid: the last valid config stays in force",
        ),
        (_, true, false) => (
            "none",
            "the pool ConfigMap is missing while addresses are assigned: nothing is planned until it is back",
        ),
        (_, false, false) => (
            "none",
            "no valid pool config was ever loaded: nothing is planned",
        ),
    };
    let mut config = String::new();
    let _ = writeln!(config, "state: {name}");
    let _ = writeln!(config, "lastEditInForce: {}", name == "valid");
    let _ = writeln!(config, "message: {}", quoted(note));
    if let Some(config_in_force) = in_force {
        let _ = writeln!(config, "pools: {}", config_in_force.pools().count());
    }
    let errors = state.errors();
    if !errors.is_empty() {
        let _ = writeln!(config, "errors:");
        for error in errors.iter().take(MAX_ERRORS) {
            let _ = writeln!(config, "- {}", quoted(&error.to_string()));
        }
        if errors.len() > MAX_ERRORS {
            let _ = writeln!(config, "errorsNotShown: {}", errors.len() - MAX_ERRORS);
        }
    }
    data.insert(CONFIG_KEY.to_owned(), config);
    if let Some(config) = in_force {
        for (key, _) in config.pools() {
            data.insert(key.to_string(), pool_text(key, config, input));
        }
    }
    data
}

/// One pool's value.
fn pool_text(key: &PoolKey, config: &PoolConfig, input: &StatusInput<'_>) -> String {
    let mut text = String::new();
    for usage in input.usage.iter().filter(|u| u.pool == *key) {
        let _ = writeln!(
            text,
            "{}: {{size: {}, used: {}, free: {}, draining: {}}}",
            usage.family,
            usage.total,
            usage.in_use,
            usage.total.saturating_sub(usage.in_use),
            usage.draining
        );
    }
    let pending = input.pending.get(key).map_or(&[][..], Vec::as_slice);
    let _ = writeln!(text, "pending: {}", pending.len());
    if !pending.is_empty() {
        let names: Vec<String> = pending.iter().map(ToString::to_string).collect();
        let _ = writeln!(text, "pendingServices: {}", bounded_list(&names));
    }
    if let (PoolKey::Named(_), Some(pool)) = (key, config.pool(key)) {
        let mut allowed: BTreeSet<&str> =
            pool.options.namespaces.iter().map(String::as_str).collect();
        allowed.extend(
            input
                .namespaces
                .iter()
                .filter(|(_, labels)| pool.options.selects_namespace(labels))
                .map(|(ns, _)| ns.as_str()),
        );
        let names: Vec<String> = allowed.into_iter().map(str::to_owned).collect();
        let _ = writeln!(text, "namespaces: {}", bounded_list(&names));
        if !pool.options.auto_assign {
            let _ = writeln!(text, "autoAssign: false");
        }
        if pool.options.draining {
            let _ = writeln!(text, "draining: true");
        }
    }
    text
}

/// `[a, b, c]`, at most [`MAX_NAMED`] items, then `... and N more` as the last one.
fn bounded_list(items: &[String]) -> String {
    let mut shown: Vec<String> = items.iter().take(MAX_NAMED).map(|s| quoted(s)).collect();
    if items.len() > MAX_NAMED {
        shown.push(quoted(&format!("... and {} more", items.len() - MAX_NAMED)));
    }
    format!("[{}]", shown.join(", "))
}

/// `s` as a YAML scalar: plain when it is a plain name, else double-quoted (JSON).
fn quoted(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '/' | '_'))
        && s.chars().next().is_some_and(|c| c.is_ascii_alphanumeric());
    if plain {
        s.to_owned()
    } else {
        serde_json::Value::String(s.to_owned()).to_string()
    }
}

/// When the status is written, and what was written last.
#[derive(Debug, Default)]
pub struct StatusWriter {
    /// The data last written, and when.
    written: Option<(BTreeMap<String, String>, Instant)>,
    /// When a write last failed (the next waits [`STATUS_EVERY`]).
    failed: Option<Instant>,
}

impl StatusWriter {
    /// When `desired` should be written: `None` when it was (and not longer than
    /// [`STATUS_REFRESH`] ago), else the first moment at or after `now` that keeps one
    /// write per [`STATUS_EVERY`].
    pub fn due(&self, desired: &BTreeMap<String, String>, now: Instant) -> Option<Instant> {
        let last = self
            .written
            .as_ref()
            .map(|(_, at)| *at)
            .into_iter()
            .chain(self.failed)
            .max();
        let same = self
            .written
            .as_ref()
            .is_some_and(|(data, at)| data == desired && now < *at + STATUS_REFRESH);
        if same && self.failed.is_none() {
            return None;
        }
        Some(last.map_or(now, |at| (at + STATUS_EVERY).max(now)))
    }

    /// Writes `data` to ConfigMap `name` in `namespace` (server-side apply, field manager
    /// [`FIELD_MANAGER`], behind the leader fence `fence`), and remembers the outcome.
    pub async fn write(
        &mut self,
        api: &Api<ConfigMap>,
        name: &str,
        data: BTreeMap<String, String>,
        fence: impl Fn() -> Option<Instant>,
        now: Instant,
    ) -> Result<(), ApplyError> {
        let object = json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": name,
                "labels": {
                    "app.kubernetes.io/managed-by": "aliaslb-controller",
                    "app.kubernetes.io/part-of": "aliaslb",
                },
                "annotations": {
                    "aliaslb.io/description": "Pool state, written by aliaslb-controller: do not edit (see docs/configuration.md, \"Pool state\")",
                },
            },
            "data": data,
        });
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let written = guarded(
            "pool status",
            format!("ConfigMap {name}"),
            &fence,
            api.patch(name, &params, &Patch::Apply(&object)),
        )
        .await;
        match written {
            Ok(_) => {
                self.written = Some((data, now));
                self.failed = None;
                Ok(())
            }
            Err(error) => {
                self.failed = Some(now);
                Err(error)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use aliaslb_core::range::Family;

    fn config_state(data: &[(&str, &str)]) -> ConfigState {
        let mut state = ConfigState::default();
        let data: BTreeMap<String, String> = data
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        state.observe(Some(&data), false);
        state
    }

    fn usage(pool: PoolKey, total: u128, in_use: u128, draining: u128) -> PoolUsage {
        PoolUsage {
            pool,
            family: Family::V4,
            total,
            in_use,
            draining,
        }
    }

    #[test]
    fn renders_each_pool_and_the_config() {
        let state = config_state(&[
            ("team-a", "10.0.0.1-10.0.0.4\n10.0.1.0/30 draining"),
            ("pool.shared", "10.0.2.1-10.0.2.8"),
            (
                "config.yaml",
                "pools:\n  pool.shared:\n    namespaces: [team-b]\n    namespaceSelector: {tier: web}\n    autoAssign: false\n",
            ),
        ]);
        let team_a = PoolKey::Namespace("team-a".into());
        let shared = PoolKey::Named("pool.shared".into());
        let usage = [
            usage(team_a.clone(), 5, 5, 1),
            usage(shared.clone(), 8, 0, 0),
        ];
        let pending = BTreeMap::from([(team_a.clone(), vec![ServiceKey::new("team-a", "web")])]);
        let namespaces = BTreeMap::from([
            (
                "team-c".to_owned(),
                Labels::from([("tier".to_owned(), "web".to_owned())]),
            ),
            ("team-d".to_owned(), Labels::new()),
        ]);
        let data = render(&StatusInput {
            config: &state,
            usage: &usage,
            pending: &pending,
            namespaces: &namespaces,
        });
        let keys: Vec<&str> = data.keys().map(String::as_str).collect();
        assert_eq!(keys, ["config", "pool.shared", "team-a"]);
        assert_eq!(
            data["config"],
            "state: valid\nlastEditInForce: true\nmessage: \"the pool ConfigMap as last edited is in force\"\npools: 2\n"
        );
        assert_eq!(
            data["team-a"],
            "IPv4: {size: 5, used: 5, free: 0, draining: 1}\npending: 1\npendingServices: [team-a/web]\n"
        );
        assert_eq!(
            data["pool.shared"],
            "IPv4: {size: 8, used: 0, free: 8, draining: 0}\npending: 0\nnamespaces: [team-b, team-c]\nautoAssign: false\n"
        );
    }

    #[test]
    fn an_invalid_edit_shows_the_first_errors_and_keeps_the_pools_in_force() {
        let mut state = config_state(&[("team-a", "10.0.0.1")]);
        let bad: BTreeMap<String, String> = (0..12)
            .map(|i| (format!("ns{i}"), "nope".to_owned()))
            .collect();
        state.observe(Some(&bad), false);
        let data = render(&StatusInput {
            config: &state,
            usage: &[],
            pending: &BTreeMap::new(),
            namespaces: &BTreeMap::new(),
        });
        let config = &data["config"];
        assert!(
            config.starts_with("state: invalid\nlastEditInForce: false\n"),
            "{config}"
        );
        assert!(config.contains("pools: 1\n"), "{config}");
        assert_eq!(
            config.matches("\n- \"key ns").count(),
            MAX_ERRORS,
            "{config}"
        );
        assert!(config.ends_with("errorsNotShown: 2\n"), "{config}");
        assert!(data.contains_key("team-a"), "the pool in force is shown");
    }

    #[test]
    fn long_lists_are_cut_and_counted() {
        let names: Vec<String> = (0..25).map(|i| format!("ns/s{i}")).collect();
        let list = bounded_list(&names);
        assert!(list.starts_with("[ns/s0, ns/s1,"), "{list}");
        assert!(list.ends_with(", ns/s19, \"... and 5 more\"]"), "{list}");
    }

    #[test]
    fn writes_only_a_difference_at_most_once_per_interval() {
        let now = Instant::now();
        let data = BTreeMap::from([("config".to_owned(), "state: valid\n".to_owned())]);
        let mut writer = StatusWriter::default();
        assert_eq!(writer.due(&data, now), Some(now), "first: at once");
        writer.written = Some((data.clone(), now));
        assert_eq!(
            writer.due(&data, now + Duration::from_secs(1)),
            None,
            "same"
        );
        let changed = BTreeMap::from([("config".to_owned(), "state: invalid\n".to_owned())]);
        assert_eq!(
            writer.due(&changed, now + Duration::from_millis(500)),
            Some(now + STATUS_EVERY),
            "a change waits out the interval"
        );
        assert_eq!(
            writer.due(&changed, now + Duration::from_secs(3)),
            Some(now + Duration::from_secs(3))
        );
        assert_eq!(
            writer.due(&data, now + STATUS_REFRESH),
            Some(now + STATUS_REFRESH),
            "the same content again after the refresh interval"
        );
        writer.failed = Some(now + Duration::from_secs(1));
        assert_eq!(
            writer.due(&data, now + Duration::from_secs(1)),
            Some(now + Duration::from_secs(1) + STATUS_EVERY),
            "a failed write is retried after the interval"
        );
    }
}
