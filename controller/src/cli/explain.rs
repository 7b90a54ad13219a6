//! `aliaslb explain svc/NAME`: why a Service is pending, why it is on its node, and what a
//! LAN conflict or a refused pool config did, in plain sentences, from the data the
//! controller's conditions come from: the Service and its conditions, the pool config, the
//! nodes and their agents, the assignment objects, the planner's pass over them
//! ([`crate::cli::live`]) and the recent Warning Events.
//!
//! [`explain`] is pure; [`fetch_warnings`] reads the Events.

use std::fmt::Write as _;
use std::time::Duration;

use aliaslb_core::election::{ElectionInput, eligible_nodes, ineligibility};
use aliaslb_core::keys;
use aliaslb_core::plan::{ServiceKey, reason};
use aliaslb_core::pool::{Announce, FALLBACK_KEY, OnConflict, PoolKey};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::{Api, Client};

use crate::cli::live::{Planned, Snapshot, ip_list};
use crate::cli::status::{service_info, set_trusted_nodes};
use crate::config::ControllerConfig;
use crate::observe::service;

/// At most this many Warning Events are quoted per object.
const WARNINGS: usize = 5;

/// One Warning Event, as quoted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warning {
    /// Its reason.
    pub reason: String,
    /// Its note.
    pub note: String,
    /// How long ago it last happened, by this machine's clock.
    pub ago: Option<Duration>,
}

/// What [`explain`] reads.
#[derive(Debug)]
pub struct Evidence<'a> {
    /// The cluster.
    pub snapshot: &'a Snapshot,
    /// The planner's pass over it; `None` while the pool ConfigMap is invalid (the
    /// controller plans with its last valid config, which the cluster does not show).
    pub planned: Option<&'a Planned>,
    /// The controller's settings (class, cordons).
    pub controller: &'a ControllerConfig,
    /// Recent Warning Events on the Service, newest first.
    pub service_warnings: &'a [Warning],
    /// Recent Warning Events on the pool ConfigMap, newest first.
    pub config_warnings: &'a [Warning],
}

/// Reads the newest Warning Events (events.k8s.io/v1) about `kind` `name` in `namespace`.
pub async fn fetch_warnings(
    client: &Client,
    namespace: &str,
    kind: &str,
    name: &str,
    now: Timestamp,
) -> Result<Vec<Warning>, kube::Error> {
    let list = Api::<Event>::namespaced(client.clone(), namespace)
        .list(&ListParams::default().fields("type=Warning"))
        .await?;
    let mut found: Vec<(Timestamp, Warning)> = list
        .items
        .into_iter()
        .filter(|e| {
            e.regarding
                .as_ref()
                .is_some_and(|r| r.kind.as_deref() == Some(kind) && r.name.as_deref() == Some(name))
        })
        .map(|e| {
            let at = e
                .series
                .as_ref()
                .map(|s| s.last_observed_time.0)
                .or(e.event_time.as_ref().map(|t| t.0))
                .or(e.deprecated_last_timestamp.as_ref().map(|t| t.0))
                .or(e.metadata.creation_timestamp.as_ref().map(|t| t.0))
                .unwrap_or(now);
            let ago = Duration::try_from(now.duration_since(at)).ok();
            (
                at,
                Warning {
                    reason: e.reason.unwrap_or_default(),
                    note: e.note.unwrap_or_default(),
                    ago,
                },
            )
        })
        .collect();
    found.sort_by_key(|w| std::cmp::Reverse(w.0));
    Ok(found.into_iter().take(WARNINGS).map(|(_, w)| w).collect())
}

fn ago(d: Option<Duration>) -> String {
    match d.map(|d| d.as_secs()) {
        None => "some time ago".to_owned(),
        Some(s) if s < 120 => format!("{s}s ago"),
        Some(s) if s < 7200 => format!("{}m ago", s / 60),
        Some(s) => format!("{}h ago", s / 3600),
    }
}

/// What a pending reason asks of the user, beyond the condition's message.
fn pending_hint(why: &str) -> Option<&'static str> {
    Some(match why {
        reason::NO_POOL => {
            "Add a key for its namespace (or a `_fallback` key) to the pool ConfigMap."
        }
        reason::POOL_EXHAUSTED | reason::NO_ADDRESS_OF_FAMILY => {
            "Add addresses to the pool, or delete a Service that holds one (`aliaslb pools` shows the usage)."
        }
        reason::REQUESTED_IP_NOT_IN_POOL => {
            "Request an address of its namespace's pool, or add that address to the pool."
        }
        reason::REQUESTED_IP_IN_USE | reason::REQUESTED_IP_RESERVED => {
            "Another Service holds, or was deleted less than --hold-released ago from, the address it requests: request another one, or wait."
        }
        reason::NODE_ADDRESS | reason::SUBNET_ADDRESS | reason::SERVICE_RANGE => {
            "The address it requests is never allocated: remove it from the pool and request another one."
        }
        reason::TOO_MANY_PORTS => "Split its ports over several Services.",
        reason::SHARING_NOT_ALLOWED | reason::SHARING_KEY_CONFLICT | reason::PORT_CLASH => {
            "Check its aliaslb.io/sharing-key, its ports and those of the Services it shares with."
        }
        reason::INVALID_REQUEST => "Fix the requested address annotation or spec.loadBalancerIP.",
        reason::POOL_NOT_ALLOWED | reason::UNKNOWN_POOL => {
            "Name a pool its namespace may draw from in aliaslb.io/pool (the message lists them), or remove the annotation."
        }
        reason::POOL_DRAINING => {
            "The pool (or the entry) is draining: name another pool in aliaslb.io/pool, or request an address that is not draining."
        }
        reason::NO_DEFAULT_POOL => {
            "Every pool of its namespace is `autoAssign: false` or draining: name one in aliaslb.io/pool, or request one of its addresses."
        }
        _ => return None,
    })
}

/// The explanation of `key`, one paragraph per line; an error when the Service does not
/// exist.
pub fn explain(e: &Evidence<'_>, key: &ServiceKey) -> Result<Vec<String>, String> {
    let svc = e
        .snapshot
        .service(key)
        .ok_or_else(|| format!("Service {key} not found"))?;
    let mut out = Vec::new();
    let spec = svc.spec.clone().unwrap_or_default();
    let type_ = spec.type_.as_deref().unwrap_or("ClusterIP");
    if type_ != "LoadBalancer" {
        out.push(format!(
            "Service {key} is of type {type_}: aliaslb handles only Services of type LoadBalancer."
        ));
        return Ok(out);
    }
    if !service::is_ours(svc, e.controller) {
        out.push(match spec.load_balancer_class.as_deref() {
            Some(class) => format!(
                "Service {key} has loadBalancerClass `{class}`: another load balancer handles it (aliaslb handles `{}`).",
                e.controller.load_balancer_class
            ),
            None => format!(
                "Service {key} has no loadBalancerClass and the controller runs with --ignore-classless: aliaslb leaves it alone."
            ),
        });
        return Ok(out);
    }
    let mut info = service_info(svc).ok_or_else(|| format!("Service {key} has no spec"))?;
    set_trusted_nodes(std::slice::from_mut(&mut info), &e.snapshot.assignments);
    out.push(format!("Service {key} is a LoadBalancer aliaslb handles."));

    // The pool config.
    let config = match &e.snapshot.config {
        Ok(config) => Some(config),
        Err(errors) => {
            let first = errors.first().map(ToString::to_string).unwrap_or_default();
            out.push(format!(
                "The pool ConfigMap {} is refused ({} error(s), the first: {first}). The controller keeps planning with the last valid config it read (see the Warning Events below and `aliaslb validate`); until it is fixed, no pool change takes effect.",
                e.snapshot.configmap_name,
                errors.len()
            ));
            None
        }
    };
    for w in e.config_warnings {
        out.push(format!(
            "The pool ConfigMap had a Warning {} ({}): {}",
            w.reason,
            ago(w.ago),
            w.note
        ));
    }
    let named = service::annotation(svc, keys::ANNOTATION_POOL).map(str::trim);
    let pool = config.and_then(|c| {
        let tenancy = c.tenancy(&key.namespace, e.snapshot.namespaces.get(&*key.namespace));
        if let Some(found) = info.ips.iter().find_map(|ip| c.pool_of(*ip)) {
            return Some((found, "it holds addresses of it"));
        }
        if let Some(name) = named {
            return PoolKey::from_annotation(name)
                .and_then(|k| c.keyed(&k))
                .map(|found| (found, "it names it in aliaslb.io/pool"));
        }
        tenancy
            .default_pool()
            .map(|found| (found, "its namespace's default"))
    });
    match (config, pool) {
        (Some(_), None) if named.is_some() => out.push(format!(
            "It names the pool `{}` in aliaslb.io/pool, which the pool ConfigMap does not define.",
            named.unwrap_or_default()
        )),
        (Some(_), None) => out.push(format!(
            "No pool lists namespace {} and there is no `{FALLBACK_KEY}` pool.",
            key.namespace
        )),
        (Some(_), Some(((pool_key, pool), why))) => {
            let whose = match pool_key {
                PoolKey::Fallback => format!(
                    "the cluster-wide `{FALLBACK_KEY}` pool (its namespace has no key of its own)"
                ),
                PoolKey::Namespace(_) => format!("pool `{pool_key}`, its namespace's own"),
                PoolKey::Named(_) => format!("the named pool `{pool_key}` ({why})"),
            };
            let how = match pool.options.announce {
                Announce::L2 => "one node answers ARP/NDP for each address (L2)",
                Announce::Bgp => "nodes announce the addresses over BGP (L3)",
            };
            out.push(format!("Its addresses come from {whose}: {how}."));
        }
        (None, _) => {}
    }
    let pool = pool.map(|(found, _)| found);

    // The address.
    match (&info.allocated, info.ips.is_empty()) {
        (_, false) => out.push(format!(
            "It has {} (status.loadBalancer.ingress).",
            ip_list(&info.ips)
        )),
        (Some(c), true) => {
            let mut s = format!("It is pending: {} ({}).", c.message, c.reason);
            if let Some(hint) = pending_hint(&c.reason) {
                let _ = write!(s, " {hint}");
            }
            out.push(s);
        }
        (None, true) => out.push(
            "It has no address and no aliaslb.io/IPAllocated condition yet: the controller has not handled it (is it running and leading? `aliaslb status`, the controller's logs)."
                .to_owned(),
        ),
    }

    // The node.
    if let Some(c) = &info.announced {
        let state = if c.status {
            "announced"
        } else {
            "not announced"
        };
        out.push(format!(
            "It is {state}: {} ({}).",
            c.message.trim_end_matches('.'),
            c.reason
        ));
    }
    if let (Some(planned), Some((_, pool))) = (e.planned, pool)
        && pool.options.announce == Announce::L2
        && !info.ips.is_empty()
    {
        out.extend(why_this_node(
            e,
            planned,
            key,
            &info.ips,
            &pool.options.node_selector,
            info.node.as_deref(),
        ));
    }
    if let Some(node) = info
        .node
        .as_deref()
        .filter(|_| pool.is_some_and(|(_, p)| p.options.announce == Announce::Bgp))
    {
        out.push(format!("The nodes announcing it: {node}."));
    }

    // LAN conflicts the agents report about its addresses.
    let on_conflict = pool.map_or(OnConflict::Defend, |(_, p)| p.options.on_conflict);
    for (node, agent) in &e.snapshot.agents {
        for conflict in agent
            .report
            .conflicts
            .iter()
            .filter(|c| info.ips.contains(&c.ip))
        {
            let who = conflict.mac.map_or_else(
                || "another owner on the node".to_owned(),
                |m| format!("MAC {m}"),
            );
            let what = match (on_conflict, conflict.mac.is_some()) {
                (OnConflict::Defend, true) => {
                    "the holder defends the address and the Service keeps it (pool option onConflict: defend); find the host with that MAC"
                }
                (OnConflict::Renumber, true) => {
                    "the address is quarantined while reported and the Service gets another one (pool option onConflict: renumber)"
                }
                (_, false) => "the agent does not take an address another owner configured",
            };
            out.push(format!(
                "The agent on {node} reports {} answered by {who}: {} — {what}.",
                conflict.ip, conflict.reason
            ));
        }
    }
    for w in e.service_warnings {
        out.push(format!("Warning {} ({}): {}", w.reason, ago(w.ago), w.note));
    }
    Ok(out)
}

/// Why `ips` are on `holder`: every node's standing under the election rules, and what
/// the planner would do now.
fn why_this_node(
    e: &Evidence<'_>,
    planned: &Planned,
    key: &ServiceKey,
    ips: &[std::net::IpAddr],
    node_selector: &std::collections::BTreeMap<String, String>,
    holder: Option<&str>,
) -> Vec<String> {
    let mut out = Vec::new();
    let input = ElectionInput {
        ips,
        current: holder,
        node_selector,
        local_endpoint_nodes: planned
            .views
            .get(key)
            .filter(|v| v.local_traffic)
            .map(|_| planned.local.get(key).unwrap_or(&EMPTY)),
        respect_cordon: e.controller.respect_cordon,
    };
    let left_out: Vec<String> = planned
        .nodes
        .iter()
        .filter_map(|n| ineligibility(&input, n).map(|why| format!("{} ({why})", n.name)))
        .collect();
    match eligible_nodes(&input, &planned.nodes) {
        Ok(eligible) => {
            let names: Vec<&str> = eligible.iter().map(|n| &*n.name).collect();
            let passing = planned.nodes.len() - left_out.len();
            let mut s = format!("Eligible nodes: {}.", names.join(", "));
            if names.len() < passing {
                let _ = write!(
                    s,
                    " ({} other node(s) pass every rule but have no interface on the address's subnet, which these have: the subnet rule keeps only them.)",
                    passing - names.len()
                );
            }
            out.push(s);
        }
        Err(none) => out.push(format!("No node can carry it: {none}.")),
    }
    if !left_out.is_empty() {
        out.push(format!("Left out: {}.", left_out.join(", ")));
    }
    let planned_node = planned
        .output
        .services
        .get(key)
        .and_then(|p| p.node.clone());
    match (holder, planned_node.as_deref()) {
        (Some(h), Some(p)) if h == p => out.push(format!(
            "{h} carries it and stays eligible, so it keeps it: aliaslb moves an address only when its node stops being eligible (no fail-back). A new address goes to the eligible node carrying the fewest, ties broken by a stable hash of node and address."
        )),
        (Some(h), Some(p)) => out.push(format!(
            "{h} carries it, but the planner would now move it to {p}: the controller does so on its next pass (break before make)."
        )),
        (Some(h), None) => out.push(format!(
            "{h} carries it, but no node would be elected now: the controller takes it off {h} on its next pass."
        )),
        (None, Some(p)) => out.push(format!(
            "No node carries it yet; the planner elects {p} (the eligible node carrying the fewest addresses)."
        )),
        (None, None) => {}
    }
    out
}

static EMPTY: std::collections::BTreeSet<String> = std::collections::BTreeSet::new();

/// Parses `svc/NAME`, `service/NAME`, `services/NAME` or a bare `NAME`.
pub fn parse_target(target: &str) -> Result<&str, String> {
    let name = match target.split_once('/') {
        None => target,
        Some(("svc" | "service" | "services", name)) => name,
        Some((kind, _)) => {
            return Err(format!(
                "`{target}`: only Services can be explained (svc/NAME), not {kind}"
            ));
        }
    };
    if name.is_empty() {
        return Err(format!("`{target}`: no Service name"));
    }
    Ok(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_name_services_only() {
        assert_eq!(parse_target("svc/web"), Ok("web"));
        assert_eq!(parse_target("services/web"), Ok("web"));
        assert_eq!(parse_target("web"), Ok("web"));
        assert!(
            parse_target("pod/web")
                .unwrap_err()
                .contains("only Services")
        );
        assert!(parse_target("svc/").is_err());
    }

    #[test]
    fn every_pending_reason_a_user_can_fix_has_a_hint() {
        for why in [
            reason::NO_POOL,
            reason::POOL_EXHAUSTED,
            reason::REQUESTED_IP_IN_USE,
            reason::TOO_MANY_PORTS,
        ] {
            assert!(pending_hint(why).is_some(), "{why}");
        }
        assert_eq!(pending_hint(reason::ALLOCATED), None);
    }

    #[test]
    fn ages_read_as_people_say_them() {
        assert_eq!(ago(Some(Duration::from_secs(5))), "5s ago");
        assert_eq!(ago(Some(Duration::from_secs(600))), "10m ago");
        assert_eq!(ago(Some(Duration::from_secs(3 * 3600))), "3h ago");
        assert_eq!(ago(None), "some time ago");
    }
}
