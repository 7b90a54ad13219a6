//! `aliaslb status`: the route table of every pool address (in use or free, large free
//! runs collapsed to one row, an address a Node has marked `node-address`: the controller
//! never allocates it; one a fresh agent reports answered on the LAN by a foreign host
//! marked `conflict` with the MAC: not allocated while reported), the pending Services with
//! their reason, and one row per agent Lease (when it was last renewed, the state of its
//! host-port shield).
//!
//! [`compute`], [`render_table`], [`service_info`] and [`agent_info`] are pure and
//! unit-tested (the current time comes in as a parameter); [`fetch`] reads the cluster
//! (read-only: Services, Nodes, the pool ConfigMap, agent Leases) and the clock, and is the
//! only I/O.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::IpAddr;
use std::time::Duration;

use aliaslb_core::election::NodeState;
use aliaslb_core::keys;
use aliaslb_core::plan::{
    LanConflict, NodeAddress, ServiceKey, SubnetEdge, lan_conflicts, service_range_withheld,
    subnet_edges,
};
use aliaslb_core::pool::{PoolConfig, PoolConfigError};
use aliaslb_core::range::{Family, from_u128, to_u128};
use aliaslb_core::report::{AgentReport, ShieldState};
use ipnet::IpNet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use serde::Serialize;

use crate::cli::live::Snapshot;
use crate::observe::service::{self, OurCondition};
use crate::observe::{agents, nodes};

/// An agent Lease's duration when it does not say (the agents' default).
const DEFAULT_AGENT_LEASE: Duration = Duration::from_secs(4);

/// Free runs at least this long are shown as one row.
pub const COLLAPSE_FROM: u128 = 4;

/// One of our conditions as observed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConditionInfo {
    /// `True`.
    pub status: bool,
    /// CamelCase reason.
    pub reason: String,
    /// Message.
    pub message: String,
}

/// What the table needs from one LoadBalancer Service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceInfo {
    /// Namespace and name.
    pub key: ServiceKey,
    /// `spec.clusterIP`.
    pub cluster_ip: Option<String>,
    /// `status.loadBalancer.ingress[].ip`.
    pub ips: Vec<IpAddr>,
    /// The node its IPs are assigned to: from the controller's assignment objects (see
    /// [`fetch`]), the `aliaslb.io/node` annotation only where none exists.
    pub node: Option<String>,
    /// `aliaslb.io/sharing-key`.
    pub sharing_key: Option<String>,
    /// Condition `aliaslb.io/IPAllocated`.
    pub allocated: Option<ConditionInfo>,
    /// Condition `aliaslb.io/Announced`.
    pub announced: Option<ConditionInfo>,
}

/// What the report needs from one agent Lease.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgentInfo {
    /// The agent's report; empty when the Lease has none or it is not valid JSON.
    pub report: AgentReport,
    /// The Lease's `spec.renewTime` (RFC 3339).
    pub renew_time: Option<String>,
    /// How long before `aliaslb status` read it the Lease was renewed, comparing the
    /// agent's wall clock with ours (zero when the renewTime is ahead of our clock).
    pub renewed_ago: Option<Duration>,
    /// Renewed within the Lease's duration (by these clocks): its conflicts count
    /// ([`lan_conflicts`]).
    pub fresh: bool,
}

/// One row of the route table: one address (or a collapsed free run) and its user.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Route {
    /// First address of the row.
    pub first: IpAddr,
    /// Last address (equal to `first` except for collapsed free runs).
    pub last: IpAddr,
    /// Number of addresses in the row.
    pub addresses: u128,
    /// Whether a Service uses it.
    pub in_use: bool,
    /// Pool key (a namespace or `_fallback`).
    pub pool: String,
    /// Namespace of the Service using it.
    pub namespace: Option<String>,
    /// Name of the Service using it.
    pub service: Option<String>,
    /// The Service's cluster IP.
    #[serde(rename = "clusterIP")]
    pub cluster_ip: Option<String>,
    /// Node carrying it; for a `node-address` row without a Service, the Node that has it.
    pub node: Option<String>,
    /// `announced`, `partially-announced` and `not-announced` (L3 mode), `waiting-for-agent`,
    /// `no-node`, `conflict`, `free`, `node-address`: a Node has this address (`status.addresses`), so it is never allocated (a Service
    /// shown on it is being moved off), or `subnet-address`: the network or broadcast
    /// address of a subnet an agent reports, or `service-range`: in a Service ClusterIP
    /// range; neither is ever allocated. `conflict` with [`Route::mac`]: a fresh agent
    /// reports it answered on the LAN by that MAC, not a node's; it is not allocated while
    /// reported, and `node` is the reporting node when no Service is shown on it.
    pub state: String,
    /// The foreign MAC answering for the address on the LAN, if a fresh agent reports one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
}

/// A Service of ours without an address.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Pending {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub service: String,
    /// Reason of the `aliaslb.io/IPAllocated` condition.
    pub reason: String,
    /// Its message.
    pub message: String,
}

/// One row of the node table: one agent Lease.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeRow {
    /// The node (from the Lease name).
    pub node: String,
    /// The Lease's `spec.renewTime` (RFC 3339).
    pub renew_time: Option<String>,
    /// Whole seconds between that renewTime and the moment `aliaslb status` read it, by the
    /// agent's wall clock and ours (so clock skew shows here).
    pub renewed_seconds_ago: Option<u64>,
    /// Renewed within its lease duration (by the same clocks).
    pub fresh: bool,
    /// The agent's host-port shield: `active`, `off`, `failing` or `unknown` (an agent that
    /// does not report it).
    pub shield: ShieldState,
}

/// The whole report (`-o json` prints it as is).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    /// Every pool address, in pool then address order.
    pub routes: Vec<Route>,
    /// Pending Services, by namespace and name.
    pub pending: Vec<Pending>,
    /// Every agent Lease, by node name.
    pub nodes: Vec<NodeRow>,
}

/// The state of `ip` used by `users`.
fn state(ip: IpAddr, users: &[&ServiceInfo], agents: &BTreeMap<String, AgentInfo>) -> &'static str {
    let group = |s: &ServiceInfo| s.sharing_key.clone().map(|k| (s.key.namespace.clone(), k));
    let shared = users
        .windows(2)
        .all(|w| group(w[0]).is_some() && group(w[0]) == group(w[1]));
    let reported_conflict = users.iter().any(|s| {
        s.announced
            .as_ref()
            .is_some_and(|c| c.reason == aliaslb_core::plan::reason::ADDRESS_CONFLICT)
            || s.node
                .as_ref()
                .and_then(|n| agents.get(n))
                .is_some_and(|a| a.report.conflicts.iter().any(|c| c.ip == ip))
    });
    if !shared || reported_conflict {
        return "conflict";
    }
    // L3 mode: the announcing nodes, comma-separated; what they export is in the
    // Announced condition, which reads the agents' routing reports.
    use aliaslb_core::plan::reason;
    match users[0].announced.as_ref().map(|c| c.reason.as_str()) {
        Some(reason::PARTIALLY_ANNOUNCED) => return "partially-announced",
        Some(reason::NOT_ANNOUNCED) => return "not-announced",
        Some(reason::ANNOUNCED) if users[0].node.as_ref().is_some_and(|n| n.contains(',')) => {
            return "announced";
        }
        _ => {}
    }
    match users[0].node.as_ref() {
        None => "no-node",
        Some(nodes)
            if nodes.split(',').all(|node| {
                agents
                    .get(node)
                    .is_some_and(|a| a.report.held.contains(&ip))
            }) =>
        {
            "announced"
        }
        Some(_) => "waiting-for-agent",
    }
}

/// State of an address a Node has.
pub const NODE_ADDRESS: &str = "node-address";

/// State of the network or broadcast address of a subnet a node is on.
pub const SUBNET_ADDRESS: &str = "subnet-address";

/// State of an address in a Service ClusterIP range.
pub const SERVICE_RANGE: &str = "service-range";

/// State of an address in conflict (with another owner, or answered on the LAN).
pub const CONFLICT: &str = "conflict";

/// State of an address its node holds and defends against a claim on the LAN by another
/// host (shown with the claiming MAC); the Service keeps it.
pub const DEFENDED: &str = "defended";

/// The MAC whose claim the holder of `ip` defends: the node of `users` holds `ip` and every
/// conflict its agent reports for it is a claim against the holder ([`whileHeld`]).
///
/// [`whileHeld`]: aliaslb_core::report::Conflict::while_held
fn defended_against(
    ip: IpAddr,
    users: &[&ServiceInfo],
    agents: &BTreeMap<String, AgentInfo>,
) -> Option<aliaslb_core::mac::Mac> {
    let node = users.first()?.node.as_ref()?;
    let report = &agents.get(node).filter(|a| a.fresh)?.report;
    if !report.held.contains(&ip) {
        return None;
    }
    let mut claims = report.conflicts.iter().filter(|c| c.ip == ip).peekable();
    claims.peek()?;
    let mut first = None;
    for c in claims {
        if !c.while_held {
            return None;
        }
        first = first.or(c.mac);
        c.mac?;
    }
    first
}

/// The addresses the controller withholds for a LAN conflict, by the rule it uses
/// ([`lan_conflicts`]), with freshness judged from the Leases' renewTime.
fn conflicts(
    config: &PoolConfig,
    agents: &BTreeMap<String, AgentInfo>,
) -> BTreeMap<IpAddr, LanConflict> {
    let nodes: Vec<NodeState> = agents
        .iter()
        .map(|(node, a)| NodeState {
            name: node.as_str().into(),
            agent_ready: a.fresh,
            ..NodeState::default()
        })
        .collect();
    let reports: aliaslb_core::plan::Reports = agents
        .iter()
        .map(|(node, a)| (node.clone(), std::sync::Arc::new(a.report.clone())))
        .collect();
    lan_conflicts(&nodes, &reports, config)
}

/// The network and broadcast addresses of the subnets the fresh agents report that count
/// for election (as the controller reads them: [`AgentReport::elected_subnets`] with the
/// addresses each Node lists), by the rule the controller withholds them with
/// ([`subnet_edges`]: anchored on the node's own Node address, or reported by two).
fn edges(
    config: &PoolConfig,
    agents: &BTreeMap<String, AgentInfo>,
    node_addresses: &BTreeMap<IpAddr, NodeAddress>,
) -> BTreeMap<IpAddr, SubnetEdge> {
    let nodes: Vec<NodeState> = agents
        .iter()
        .map(|(node, a)| {
            let own: Vec<IpAddr> = node_addresses
                .iter()
                .filter(|(_, address)| address.node == *node)
                .map(|(ip, _)| *ip)
                .collect();
            NodeState {
                name: node.as_str().into(),
                agent_ready: a.fresh,
                subnets: a.report.elected_subnets(&own).copied().collect(),
                ..NodeState::default()
            }
        })
        .collect();
    subnet_edges(&nodes, node_addresses, config)
}

/// The route table, the pending list and the node table; `agents` maps node name -> its
/// agent Lease, `node_addresses` the addresses Nodes have ([`nodes::node_addresses`]),
/// `service_ranges` the Service ClusterIP ranges (ServiceCIDRs).
pub fn compute(
    config: &PoolConfig,
    services: &[ServiceInfo],
    agents: &BTreeMap<String, AgentInfo>,
    node_addresses: &BTreeMap<IpAddr, NodeAddress>,
    service_ranges: &[IpNet],
) -> Report {
    let mut users: BTreeMap<IpAddr, Vec<&ServiceInfo>> = BTreeMap::new();
    for svc in services {
        for ip in &svc.ips {
            users.entry(*ip).or_default().push(svc);
        }
    }
    let lan = conflicts(config, agents);
    let edges = edges(config, agents, node_addresses);
    let in_range = service_range_withheld(config, service_ranges);
    let mut routes = Vec::new();
    for (pool_key, pool) in config.pools() {
        let pool_name = pool_key.as_str().to_owned();
        let free = |first: u128, last: u128, family: Family| Route {
            first: from_u128(family, first),
            last: from_u128(family, last),
            addresses: last - first + 1,
            in_use: false,
            pool: pool_name.clone(),
            namespace: None,
            service: None,
            cluster_ip: None,
            node: None,
            state: "free".to_owned(),
            mac: None,
        };
        for range in &pool.ranges {
            let family = range.family();
            let (start, end) = (to_u128(range.first()), to_u128(range.last()));
            let mut cursor = start;
            let push_free = |routes: &mut Vec<Route>, from: u128, to: u128| {
                if from > to {
                    return;
                }
                if to - from + 1 >= COLLAPSE_FROM {
                    routes.push(free(from, to, family));
                } else {
                    routes.extend((from..=to).map(|n| free(n, n, family)));
                }
            };
            // The rows that are not free: used by a Service, or a Node's.
            let mut marked: Vec<IpAddr> = users
                .range(range.first()..=range.last())
                .map(|(ip, _)| *ip)
                .chain(
                    node_addresses
                        .range(range.first()..=range.last())
                        .map(|(ip, _)| *ip),
                )
                .chain(edges.range(range.first()..=range.last()).map(|(ip, _)| *ip))
                .chain(
                    in_range
                        .range(range.first()..=range.last())
                        .map(|(ip, _)| *ip),
                )
                .chain(lan.range(range.first()..=range.last()).map(|(ip, _)| *ip))
                .collect();
            marked.sort_unstable();
            marked.dedup();
            for ip in marked {
                let n = to_u128(ip);
                push_free(&mut routes, cursor, n.wrapping_sub(1));
                cursor = n + 1;
                let withheld = node_addresses.contains_key(&ip)
                    || edges.contains_key(&ip)
                    || in_range.contains_key(&ip);
                let conflict = lan.get(&ip).filter(|_| !withheld);
                let mac = conflict.map(|c| c.mac.to_string());
                let Some(svcs) = users.get(&ip) else {
                    let (node, state) = match node_addresses.get(&ip) {
                        Some(a) => (Some(a.node.clone()), NODE_ADDRESS),
                        None if edges.contains_key(&ip) => (None, SUBNET_ADDRESS),
                        None if in_range.contains_key(&ip) => (None, SERVICE_RANGE),
                        None => (conflict.map(|c| c.node.clone()), CONFLICT),
                    };
                    routes.push(Route {
                        node,
                        state: state.to_owned(),
                        mac,
                        ..free(n, n, family)
                    });
                    continue;
                };
                let defended = (conflict.is_none() && !withheld)
                    .then(|| defended_against(ip, svcs, agents))
                    .flatten();
                let state = if node_addresses.contains_key(&ip) {
                    NODE_ADDRESS
                } else if edges.contains_key(&ip) {
                    SUBNET_ADDRESS
                } else if in_range.contains_key(&ip) {
                    SERVICE_RANGE
                } else if conflict.is_some() {
                    CONFLICT
                } else if defended.is_some() {
                    DEFENDED
                } else {
                    state(ip, svcs, agents)
                };
                let mac = mac.or(defended.map(|m| m.to_string()));
                for svc in svcs {
                    routes.push(Route {
                        first: ip,
                        last: ip,
                        addresses: 1,
                        in_use: true,
                        pool: pool_name.clone(),
                        namespace: Some(svc.key.namespace.to_string()),
                        service: Some(svc.key.name.to_string()),
                        cluster_ip: svc.cluster_ip.clone(),
                        node: svc.node.clone(),
                        state: state.to_owned(),
                        mac: mac.clone(),
                    });
                }
            }
            if cursor <= end {
                push_free(&mut routes, cursor, end);
            }
        }
    }
    let mut pending: Vec<Pending> = services
        .iter()
        .filter(|s| s.ips.is_empty())
        .filter_map(|s| {
            let c = s.allocated.as_ref()?;
            Some(Pending {
                namespace: s.key.namespace.to_string(),
                service: s.key.name.to_string(),
                reason: c.reason.clone(),
                message: c.message.clone(),
            })
        })
        .collect();
    pending.sort_by(|a, b| (&a.namespace, &a.service).cmp(&(&b.namespace, &b.service)));
    let nodes = agents
        .iter()
        .map(|(node, agent)| NodeRow {
            node: node.clone(),
            renew_time: agent.renew_time.clone(),
            renewed_seconds_ago: agent.renewed_ago.map(|d| d.as_secs()),
            fresh: agent.fresh,
            shield: agent.report.shield,
        })
        .collect();
    Report {
        routes,
        pending,
        nodes,
    }
}

/// An age the way kubectl prints one: `45s`, `7m`, `5h`, `3d`.
fn age(secs: u64) -> String {
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 120 * 60 => format!("{}m", s / 60),
        s if s < 48 * 3600 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

/// The report as aligned text columns.
pub fn render_table(report: &Report) -> String {
    render(report, false)
}

/// The report as aligned text columns; `wide` adds each address's pool and the MAC of a
/// conflict or a defended claim (instead of in the state), and whether each agent is
/// fresh.
pub fn render(report: &Report, wide: bool) -> String {
    let dash = |s: &Option<String>| s.clone().unwrap_or_else(|| "-".to_owned());
    let mut head = vec![
        "IP",
        "IN USE",
        "NAMESPACE",
        "SERVICE",
        "CLUSTER IP",
        "NODE",
        "STATE",
    ];
    if wide {
        head.extend(["POOL", "MAC"]);
    }
    let mut rows: Vec<Vec<String>> = vec![head.into_iter().map(str::to_owned).collect()];
    for r in &report.routes {
        let ip = if r.first == r.last {
            r.first.to_string()
        } else {
            format!("{}-{}", r.first, r.last)
        };
        let state = match (&r.mac, r.addresses > 1) {
            (Some(mac), _) if !wide => format!("{} {mac}", r.state),
            (_, true) => format!("{} ({})", r.state, r.addresses),
            _ => r.state.clone(),
        };
        let mut row = vec![
            ip,
            if r.in_use { "yes" } else { "no" }.into(),
            r.namespace.clone().unwrap_or_else(|| r.pool.clone()),
            dash(&r.service),
            dash(&r.cluster_ip),
            dash(&r.node),
            state,
        ];
        if wide {
            row.extend([r.pool.clone(), dash(&r.mac)]);
        }
        rows.push(row);
    }
    let mut out = columns(&rows);
    if !report.pending.is_empty() {
        out.push('\n');
        let mut pending = vec![vec!["PENDING".into(), "REASON".into(), "MESSAGE".into()]];
        for p in &report.pending {
            pending.push(vec![
                format!("{}/{}", p.namespace, p.service),
                p.reason.clone(),
                p.message.clone(),
            ]);
        }
        out.push_str(&columns(&pending));
    }
    if !report.nodes.is_empty() {
        out.push('\n');
        let mut head = vec!["NODE".to_owned(), "RENEWED".into(), "SHIELD".into()];
        if wide {
            head.push("FRESH".into());
        }
        let mut nodes = vec![head];
        for n in &report.nodes {
            let mut row = vec![
                n.node.clone(),
                n.renewed_seconds_ago
                    .map_or_else(|| "-".to_owned(), |s| format!("{} ago", age(s))),
                n.shield.as_str().to_owned(),
            ];
            if wide {
                row.push(if n.fresh { "yes" } else { "no" }.to_owned());
            }
            nodes.push(row);
        }
        out.push_str(&columns(&nodes));
    }
    out
}

/// Left-aligned columns separated by two spaces, trailing spaces trimmed.
pub(crate) fn columns<R: AsRef<[String]>>(rows: &[R]) -> String {
    let n = rows.iter().map(|r| r.as_ref().len()).max().unwrap_or(0);
    let mut widths = vec![0usize; n];
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row.as_ref()) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (cell, w) in row.as_ref().iter().zip(widths.iter().copied()) {
            let _ = write!(line, "{cell:<w$}  ");
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// What `aliaslb status` reads from one Service; `None` for Services that are not
/// LoadBalancers.
pub fn service_info(svc: &Service) -> Option<ServiceInfo> {
    let spec = svc.spec.as_ref()?;
    if spec.type_.as_deref() != Some("LoadBalancer") {
        return None;
    }
    let cond = |which: OurCondition| {
        service::our_conditions(svc)
            .find(|(w, _)| *w == which)
            .map(|(_, c)| ConditionInfo {
                status: c.status == "True",
                reason: c.reason.clone(),
                message: c.message.clone(),
            })
    };
    Some(ServiceInfo {
        key: service::service_key(svc)?,
        cluster_ip: spec.cluster_ip.clone(),
        ips: service::ingress_ips(svc),
        node: service::annotation(svc, keys::ANNOTATION_NODE).map(str::to_owned),
        sharing_key: service::annotation(svc, keys::ANNOTATION_SHARING_KEY).map(str::to_owned),
        allocated: cond(OurCondition::IpAllocated),
        announced: cond(OurCondition::Announced),
    })
}

/// Sets each info's node from the controller's assignment objects `assignments`: the node
/// agents act on (L3: the announcing nodes, comma-separated). Never the `aliaslb.io/node`
/// annotation [`service_info`] read, a view anyone with `edit` on the Service can write.
pub fn set_trusted_nodes(infos: &mut [ServiceInfo], assignments: &[ConfigMap]) {
    let observed = crate::write::assignments::observed(assignments);
    let trusted = crate::write::assignments::trusted_nodes(&observed);
    let routed = crate::write::assignments::routed_nodes(&observed);
    for info in infos {
        info.node = crate::write::assignments::trusted_node_of(&info.key, &info.ips, &trusted)
            .map(str::to_owned)
            .or_else(|| crate::write::assignments::routed_nodes_of(&info.key, &info.ips, &routed));
    }
}

/// What `aliaslb status` reads from one agent Lease at `now` (our wall clock): its node and
/// [`AgentInfo`]; `None` for Leases that are not agent Leases. A report that is not valid
/// JSON or out of bounds ([`AgentReport::from_json`]) reads as an empty one (shield
/// `unknown`).
pub fn agent_info(lease: &Lease, now: Timestamp) -> Option<(String, AgentInfo)> {
    let node = keys::agent_lease_node(lease.metadata.name.as_deref()?)?;
    let renewed = lease
        .spec
        .as_ref()
        .and_then(|s| s.renew_time.as_ref())
        .map(|t| t.0);
    let duration = lease
        .spec
        .as_ref()
        .and_then(|s| s.lease_duration_seconds)
        .and_then(|s| u64::try_from(s).ok())
        .map_or(DEFAULT_AGENT_LEASE, Duration::from_secs);
    let renewed_ago =
        renewed.map(|t| Duration::try_from(now.duration_since(t)).unwrap_or(Duration::ZERO));
    Some((
        node.to_owned(),
        AgentInfo {
            report: agents::agent_report(lease).unwrap_or_default(),
            renew_time: renewed.map(|t| t.to_string()),
            renewed_ago,
            fresh: renewed_ago.is_some_and(|ago| ago <= duration),
        },
    ))
}

/// Why the status could not be computed.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    /// An API read failed.
    #[error("reading {what}")]
    Api {
        /// What was read.
        what: String,
        /// Cause.
        #[source]
        source: kube::Error,
    },
    /// The pool ConfigMap is invalid.
    #[error("pool ConfigMap {name} is invalid:\n{}", .errors.iter().map(|e| format!("  {e}")).collect::<Vec<_>>().join("\n"))]
    InvalidConfig {
        /// `namespace/name`.
        name: String,
        /// Every error.
        errors: Vec<PoolConfigError>,
    },
}

/// Reads the cluster and computes the report. A missing ConfigMap means no pools.
pub async fn fetch(
    client: &Client,
    namespace: &str,
    agent_namespace: &str,
    configmap: &str,
) -> Result<Report, StatusError> {
    let snapshot = Snapshot::fetch(client, namespace, agent_namespace, configmap, false)
        .await
        .map_err(|e| StatusError::Api {
            what: e.what,
            source: e.source,
        })?;
    report(&snapshot)
}

/// The report of a [`Snapshot`]; an error when its pool ConfigMap is invalid.
pub fn report(snapshot: &Snapshot) -> Result<Report, StatusError> {
    let config = snapshot
        .config
        .as_ref()
        .map_err(|errors| StatusError::InvalidConfig {
            name: snapshot.configmap_name.clone(),
            errors: errors.clone(),
        })?;
    let node_addresses = nodes::node_addresses(snapshot.nodes.iter().map(|n| &**n));
    let mut infos: Vec<ServiceInfo> = snapshot.services.iter().filter_map(service_info).collect();
    set_trusted_nodes(&mut infos, &snapshot.assignments);
    Ok(compute(
        config,
        &infos,
        &snapshot.agents,
        &node_addresses,
        &snapshot.service_ranges,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(data: &[(&str, &str)]) -> PoolConfig {
        let data = data
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        PoolConfig::parse(&data).unwrap()
    }

    /// A Service fixture using `ips`.
    fn svc(ns: &str, name: &str, ips: &[&str]) -> ServiceInfo {
        ServiceInfo {
            key: ServiceKey::new(ns, name),
            cluster_ip: Some("10.96.0.10".into()),
            ips: ips.iter().map(|s| s.parse().unwrap()).collect(),
            node: None,
            sharing_key: None,
            allocated: None,
            announced: None,
        }
    }

    fn on(mut s: ServiceInfo, node: &str) -> ServiceInfo {
        s.node = Some(node.into());
        s
    }

    fn shared(mut s: ServiceInfo, key: &str) -> ServiceInfo {
        s.sharing_key = Some(key.into());
        s
    }

    fn pending(mut s: ServiceInfo, reason: &str, message: &str) -> ServiceInfo {
        s.allocated = Some(ConditionInfo {
            status: false,
            reason: reason.into(),
            message: message.into(),
        });
        s
    }

    fn holding(ips: &[&str]) -> AgentInfo {
        AgentInfo {
            report: AgentReport {
                held: ips.iter().map(|s| s.parse().unwrap()).collect(),
                ..AgentReport::default()
            },
            ..AgentInfo::default()
        }
    }

    /// An agent renewed `secs` ago (`None`: a Lease without renewTime) with `shield`.
    fn agent(secs: Option<u64>, shield: ShieldState) -> AgentInfo {
        AgentInfo {
            report: AgentReport {
                shield,
                ..AgentReport::default()
            },
            renew_time: secs.map(|_| "2025-01-01T00:00:00Z".into()),
            renewed_ago: secs.map(Duration::from_secs),
            fresh: secs.is_some_and(|s| s <= 4),
        }
    }

    fn lease(name: &str, renew_time: Option<&str>, report: Option<&str>) -> Lease {
        use k8s_openapi::api::coordination::v1::LeaseSpec;
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
        Lease {
            metadata: ObjectMeta {
                name: Some(name.into()),
                annotations: report
                    .map(|r| [(keys::ANNOTATION_AGENT_REPORT.to_owned(), r.to_owned())].into()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some("x".into()),
                renew_time: renew_time.map(|t| MicroTime(t.parse().unwrap())),
                ..LeaseSpec::default()
            }),
        }
    }

    #[test]
    fn golden_table() {
        let config = config(&[
            ("default", "192.168.55.10\n192.168.55.11\n192.168.55.12"),
            ("staging", "192.168.55.20-192.168.55.40"),
        ]);
        let services = vec![
            on(svc("default", "web", &["192.168.55.10"]), "node-a"),
            on(svc("default", "api", &["192.168.55.11"]), "node-b"),
            pending(
                svc("default", "late", &[]),
                "PoolExhausted",
                "every IPv4 address is in use",
            ),
        ];
        let mut agents = BTreeMap::from([
            ("node-a".to_owned(), holding(&["192.168.55.10"])),
            ("node-b".to_owned(), holding(&[])),
        ]);
        for (node, secs, shield) in [
            ("node-a", 1, ShieldState::Active),
            ("node-b", 9, ShieldState::Failing),
        ] {
            let a = agents.get_mut(node).unwrap();
            a.renewed_ago = Some(Duration::from_secs(secs));
            a.report.shield = shield;
        }
        let table = render_table(&compute(&config, &services, &agents, &BTreeMap::new(), &[]));
        let want = "\
IP                           IN USE  NAMESPACE  SERVICE  CLUSTER IP  NODE    STATE
192.168.55.10                yes     default    web      10.96.0.10  node-a  announced
192.168.55.11                yes     default    api      10.96.0.10  node-b  waiting-for-agent
192.168.55.12                no      default    -        -           -       free
192.168.55.20-192.168.55.40  no      staging    -        -           -       free (21)

PENDING       REASON         MESSAGE
default/late  PoolExhausted  every IPv4 address is in use

NODE    RENEWED  SHIELD
node-a  1s ago   active
node-b  9s ago   failing
";
        assert_eq!(table, want, "got:\n{table}");
    }

    #[test]
    fn golden_node_table() {
        let config = config(&[("a", "10.0.0.1")]);
        let agents = BTreeMap::from([
            ("alb-node-1".to_owned(), agent(Some(0), ShieldState::Active)),
            (
                "alb-node-2".to_owned(),
                agent(Some(119), ShieldState::Failing),
            ),
            ("alb-node-3".to_owned(), agent(Some(120), ShieldState::Off)),
            ("n4".to_owned(), agent(Some(7_199), ShieldState::Unknown)),
            ("n5".to_owned(), agent(Some(7_200), ShieldState::Active)),
            ("n6".to_owned(), agent(Some(48 * 3600), ShieldState::Active)),
            ("n7".to_owned(), agent(None, ShieldState::Unknown)),
        ]);
        let table = render_table(&compute(&config, &[], &agents, &BTreeMap::new(), &[]));
        let want = "\
IP        IN USE  NAMESPACE  SERVICE  CLUSTER IP  NODE  STATE
10.0.0.1  no      a          -        -           -     free

NODE        RENEWED   SHIELD
alb-node-1  0s ago    active
alb-node-2  119s ago  failing
alb-node-3  2m ago    off
n4          119m ago  unknown
n5          2h ago    active
n6          2d ago    active
n7          -         unknown
";
        assert_eq!(table, want, "got:\n{table}");
        // No agent Lease, no node section.
        let table = render_table(&compute(
            &config,
            &[],
            &BTreeMap::new(),
            &BTreeMap::new(),
            &[],
        ));
        assert!(!table.contains("SHIELD"), "{table}");
    }

    #[test]
    fn agent_info_reads_node_age_and_shield_from_the_lease() {
        let now: Timestamp = "2025-01-01T00:00:10Z".parse().unwrap();
        let report = r#"{"version":1,"held":["10.0.0.1"],"shield":"failing"}"#;
        let (node, info) = agent_info(
            &lease(
                "aliaslb-agent-n1",
                Some("2025-01-01T00:00:07Z"),
                Some(report),
            ),
            now,
        )
        .unwrap();
        assert_eq!(node, "n1");
        assert_eq!(info.report.shield, ShieldState::Failing);
        assert_eq!(info.report.held.len(), 1);
        assert_eq!(info.renewed_ago, Some(Duration::from_secs(3)));
        assert_eq!(info.renew_time.as_deref(), Some("2025-01-01T00:00:07Z"));
        // Renewed "in the future" (clock skew): zero, not an error.
        let (_, info) = agent_info(
            &lease("aliaslb-agent-n1", Some("2025-01-01T00:00:12Z"), None),
            now,
        )
        .unwrap();
        assert_eq!(info.renewed_ago, Some(Duration::ZERO));
        assert_eq!(info.report.shield, ShieldState::Unknown);
        // An older agent (no shield), a garbage report, no renewTime.
        let (_, info) = agent_info(
            &lease("aliaslb-agent-n1", None, Some(r#"{"version":1}"#)),
            now,
        )
        .unwrap();
        assert_eq!((info.renewed_ago, info.renew_time), (None, None));
        assert_eq!(info.report.shield, ShieldState::Unknown);
        let (_, info) =
            agent_info(&lease("aliaslb-agent-n1", None, Some("{not json")), now).unwrap();
        assert_eq!(info.report, AgentReport::default());
        // Not an agent Lease.
        assert_eq!(
            agent_info(&lease("aliaslb-controller", None, None), now),
            None
        );
    }

    #[test]
    fn small_runs_stay_expanded_and_big_ones_collapse_around_users() {
        let config = config(&[("a", "10.0.0.1-10.0.0.10")]);
        let services = vec![svc("a", "x", &["10.0.0.3"])];
        let report = compute(&config, &services, &BTreeMap::new(), &BTreeMap::new(), &[]);
        let rows: Vec<(String, u128, &str)> = report
            .routes
            .iter()
            .map(|r| (r.first.to_string(), r.addresses, r.state.as_str()))
            .collect();
        assert_eq!(
            rows,
            vec![
                ("10.0.0.1".into(), 1, "free"),
                ("10.0.0.2".into(), 1, "free"),
                ("10.0.0.3".into(), 1, "no-node"),
                ("10.0.0.4".into(), 7, "free"),
            ]
        );
    }

    #[test]
    fn ipv6_prefix_is_one_row_and_sharing_is_not_a_conflict() {
        let config = config(&[("a", "2001:db8::/64\n10.0.0.1")]);
        let services = vec![
            shared(on(svc("a", "x", &["10.0.0.1"]), "n"), "k"),
            shared(on(svc("a", "y", &["10.0.0.1"]), "n"), "k"),
        ];
        let report = compute(&config, &services, &BTreeMap::new(), &BTreeMap::new(), &[]);
        assert_eq!(report.routes.len(), 3);
        assert!(
            report.routes[..2]
                .iter()
                .all(|r| r.state == "waiting-for-agent")
        );
        assert_eq!(report.routes[2].addresses, (1u128 << 64) - 1);
    }

    #[test]
    fn an_address_a_node_has_is_marked_in_table_and_json() {
        let config = config(&[("default", "192.168.55.100-192.168.55.110\n2001:db8::/126")]);
        let services = vec![
            on(svc("default", "web", &["192.168.55.101"]), "alb-node-1"),
            // Being moved off by the controller: still marked.
            on(svc("default", "old", &["192.168.55.102"]), "alb-node-1"),
        ];
        let node_addresses = BTreeMap::from([
            (
                "192.168.55.102".parse().unwrap(),
                NodeAddress::new("alb-node-2", "ExternalIP"),
            ),
            (
                "192.168.55.103".parse().unwrap(),
                NodeAddress::new("alb-node-3", "InternalIP"),
            ),
            (
                "2001:db8::2".parse().unwrap(),
                NodeAddress::new("alb-node-3", "InternalIP"),
            ),
            // Not in a pool: no row.
            (
                "10.0.0.9".parse().unwrap(),
                NodeAddress::new("alb-node-4", "InternalIP"),
            ),
        ]);
        let report = compute(&config, &services, &BTreeMap::new(), &node_addresses, &[]);
        let table = render_table(&report);
        let want = "\
IP                             IN USE  NAMESPACE  SERVICE  CLUSTER IP  NODE        STATE
192.168.55.100                 no      default    -        -           -           free
192.168.55.101                 yes     default    web      10.96.0.10  alb-node-1  waiting-for-agent
192.168.55.102                 yes     default    old      10.96.0.10  alb-node-1  node-address
192.168.55.103                 no      default    -        -           alb-node-3  node-address
192.168.55.104-192.168.55.110  no      default    -        -           -           free (7)
2001:db8::1                    no      default    -        -           -           free
2001:db8::2                    no      default    -        -           alb-node-3  node-address
2001:db8::3                    no      default    -        -           -           free
";
        assert_eq!(table, want, "got:\n{table}");
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(
            json["routes"][3],
            serde_json::json!({
                "first": "192.168.55.103", "last": "192.168.55.103", "addresses": 1,
                "inUse": false, "pool": "default", "namespace": null, "service": null,
                "clusterIP": null, "node": "alb-node-3", "state": "node-address"
            })
        );
    }

    #[test]
    fn an_address_answered_on_the_lan_shows_as_a_conflict_with_the_mac() {
        use aliaslb_core::report::Conflict;
        let config = config(&[("default", "192.168.55.200-192.168.55.203")]);
        let lan = |ip: &str| Conflict {
            while_held: false,
            yielded: false,
            ip: ip.parse().unwrap(),
            reason: "answered".into(),
            mac: Some("46:b0:48:e8:2d:96".parse().unwrap()),
            interface: Some("eth1".into()),
        };
        let mut fresh = agent(Some(1), ShieldState::Active);
        fresh.report.conflicts = vec![lan("192.168.55.200"), lan("192.168.55.201")];
        let mut stale = agent(Some(60), ShieldState::Active);
        stale.report.conflicts = vec![lan("192.168.55.202")];
        let agents = BTreeMap::from([
            ("alb-node-2".to_owned(), fresh),
            ("alb-node-3".to_owned(), stale),
        ]);
        // Still shown on a Service (the controller is moving it off).
        let services = vec![on(svc("default", "web", &["192.168.55.201"]), "alb-node-1")];
        let report = compute(&config, &services, &agents, &BTreeMap::new(), &[]);
        let table = render_table(&report);
        let want = "\
IP              IN USE  NAMESPACE  SERVICE  CLUSTER IP  NODE        STATE
192.168.55.200  no      default    -        -           alb-node-2  conflict 46:b0:48:e8:2d:96
192.168.55.201  yes     default    web      10.96.0.10  alb-node-1  conflict 46:b0:48:e8:2d:96
192.168.55.202  no      default    -        -           -           free
192.168.55.203  no      default    -        -           -           free
";
        let table: String = table.split("\nNODE ").next().unwrap_or_default().to_owned();
        assert_eq!(
            table, want,
            "a stale agent's conflict does not count; got:\n{table}"
        );
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["routes"][0]["state"], "conflict");
        assert_eq!(json["routes"][0]["mac"], "46:b0:48:e8:2d:96");
        assert!(
            json["routes"][2].get("mac").is_none(),
            "{}",
            json["routes"][2]
        );
    }

    #[test]
    fn an_address_its_holder_defends_shows_as_defended_with_the_mac() {
        use aliaslb_core::report::Conflict;
        let config = config(&[("default", "192.168.55.200-192.168.55.201")]);
        let claim = |ip: &str, while_held: bool| Conflict {
            while_held,
            yielded: false,
            ip: ip.parse().unwrap(),
            reason: "claimed: defended".into(),
            mac: Some("46:b0:48:e8:2d:96".parse().unwrap()),
            interface: Some("eth1".into()),
        };
        let mut holder = agent(Some(1), ShieldState::Active);
        holder.report.held = ["192.168.55.200".parse().unwrap()].into();
        holder.report.conflicts = vec![claim("192.168.55.200", true)];
        let agents = BTreeMap::from([("alb-node-1".to_owned(), holder)]);
        let services = vec![on(svc("default", "web", &["192.168.55.200"]), "alb-node-1")];
        let report = compute(&config, &services, &agents, &BTreeMap::new(), &[]);
        assert_eq!(report.routes[0].state, DEFENDED);
        assert_eq!(report.routes[0].mac.as_deref(), Some("46:b0:48:e8:2d:96"));
        let table = render_table(&report);
        assert!(
            table.contains("alb-node-1  defended 46:b0:48:e8:2d:96"),
            "{table}"
        );
        // Not held any more (a stale agent let go): a conflict, as before.
        let mut agents = agents;
        agents.get_mut("alb-node-1").unwrap().report.held.clear();
        let report = compute(&config, &services, &agents, &BTreeMap::new(), &[]);
        assert_eq!(report.routes[0].state, CONFLICT);
    }

    #[test]
    fn two_unshared_users_are_a_conflict() {
        let config = config(&[("a", "10.0.0.1")]);
        let services = vec![svc("a", "x", &["10.0.0.1"]), svc("a", "y", &["10.0.0.1"])];
        let report = compute(&config, &services, &BTreeMap::new(), &BTreeMap::new(), &[]);
        assert!(report.routes.iter().all(|r| r.state == "conflict"));
    }

    #[test]
    fn json_field_names_are_stable() {
        let config = config(&[("a", "10.0.0.1")]);
        let report = compute(
            &config,
            &[on(svc("a", "x", &["10.0.0.1"]), "n")],
            &BTreeMap::from([
                ("n".to_owned(), agent(Some(3), ShieldState::Active)),
                ("old".to_owned(), agent(None, ShieldState::Unknown)),
            ]),
            &BTreeMap::new(),
            &[],
        );
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(
            json["routes"][0],
            serde_json::json!({
                "first": "10.0.0.1", "last": "10.0.0.1", "addresses": 1, "inUse": true,
                "pool": "a", "namespace": "a", "service": "x", "clusterIP": "10.96.0.10",
                "node": "n", "state": "waiting-for-agent"
            })
        );
        assert_eq!(json["pending"], serde_json::json!([]));
        assert_eq!(
            json["nodes"],
            serde_json::json!([
                {"node": "n", "renewTime": "2025-01-01T00:00:00Z", "renewedSecondsAgo": 3,
                 "fresh": true, "shield": "active"},
                {"node": "old", "renewTime": null, "renewedSecondsAgo": null,
                 "fresh": false, "shield": "unknown"},
            ])
        );
    }
}
