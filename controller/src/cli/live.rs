//! The cluster as the controller reads it, fetched once for the read-only CLI commands
//! (`status`, `pools`, `explain`, `simulate`), and the controller's own planner run over it.
//!
//! [`Snapshot::fetch`] is the only I/O (list calls, read-only). [`Snapshot::plan`] builds the
//! planner's inputs the way the controller does (the same observation functions: which
//! Services are ours, their views, the nodes with their agents judged fresh or not, the
//! trusted holders from the assignment objects, local endpoints, withheld addresses) and runs
//! a fresh [`Planner`] over them, optionally after a what-if ([`WhatIf`]) changed one node.
//! Nothing is written.
//!
//! Differences from the live controller, said where they show: the controller judges agent
//! freshness on its own monotonic clock (here: the Lease's renewTime against this
//! machine's clock, so skew counts), and remembers what a snapshot cannot see (addresses
//! held for a deleted Service's re-creation, conflicts learned earlier).

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use aliaslb_core::election::NodeState;
use aliaslb_core::keys;
use aliaslb_core::plan::{Inputs, PlanOutput, Planner, ServiceKey, ServiceView};
use aliaslb_core::pool::{Labels, PoolConfig, PoolConfigError};
use aliaslb_core::report::AgentReport;
use ipnet::IpNet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::{Api, Client};

use crate::cli::status::{AgentInfo, agent_info};
use crate::config::ControllerConfig;
use crate::observe::agents::Freshness;
use crate::observe::{endpoints, nodes, service};

/// At most this many planner passes settle a simulated change (a move takes two: off the
/// old node, then onto the new one once released).
const CONVERGE_PASSES: usize = 8;

/// Why the cluster could not be read.
#[derive(Debug, thiserror::Error)]
#[error("reading {what}")]
pub struct ReadError {
    /// What was read.
    pub what: String,
    /// Cause.
    #[source]
    pub source: kube::Error,
}

/// Everything the read-only commands read, listed once.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// The controller's namespace and the pool ConfigMap's name, as `namespace/name`.
    pub configmap_name: String,
    /// The pool ConfigMap, if it exists.
    pub configmap: Option<ConfigMap>,
    /// Its parse: a missing ConfigMap is an empty, valid config (no pools).
    pub config: Result<PoolConfig, Vec<PoolConfigError>>,
    /// Every Service.
    pub services: Vec<Service>,
    /// Every Node.
    pub nodes: Vec<Arc<Node>>,
    /// The agents' Leases, read at [`Snapshot::now`]: node name -> what they say.
    pub agents: BTreeMap<String, AgentInfo>,
    /// The controller's node assignment objects.
    pub assignments: Vec<ConfigMap>,
    /// Every EndpointSlice (for `externalTrafficPolicy: Local`), if fetched.
    pub slices: Vec<EndpointSlice>,
    /// The Service ClusterIP ranges, where served (1.33+); empty otherwise.
    pub service_ranges: Vec<IpNet>,
    /// The labels of every namespace, when a pool selects namespaces by label (else
    /// empty: nothing reads them).
    pub namespaces: BTreeMap<String, Labels>,
    /// When it was read, by this machine's clock.
    pub now: Timestamp,
}

/// One change to the live state a simulation applies before planning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WhatIf<'a> {
    /// The state as it is.
    Nothing,
    /// The node is cordoned (`kubectl cordon`).
    Cordon(&'a str),
    /// The node's agent stops renewing (node lost, or agent gone).
    AgentLost(&'a str),
}

/// The planner's output over a snapshot, and what it read.
#[derive(Debug)]
pub struct Planned {
    /// The planner after its pass (for [`Planner::usage`], [`Planner::quarantined`]).
    pub planner: Planner,
    /// Its output: the desired state of every Service of ours.
    pub output: PlanOutput,
    /// The nodes as the planner saw them, by name.
    pub nodes: Vec<NodeState>,
    /// The views of our Services, with the holder imported from the assignments.
    pub views: BTreeMap<ServiceKey, Arc<ServiceView>>,
    /// Service -> nodes with a ready local endpoint (`externalTrafficPolicy: Local`).
    pub local: BTreeMap<ServiceKey, BTreeSet<String>>,
}

impl Snapshot {
    /// Lists what the commands read. `namespace`: the controller's (pool ConfigMap,
    /// assignments); `agent_namespace`: the agents' Leases; `endpoints`: whether to list
    /// every EndpointSlice too (only node placement reads them, for
    /// `externalTrafficPolicy: Local`; a big cluster has many).
    pub async fn fetch(
        client: &Client,
        namespace: &str,
        agent_namespace: &str,
        configmap: &str,
        endpoints: bool,
    ) -> Result<Snapshot, ReadError> {
        let err = |what: String| move |source| ReadError { what, source };
        let cm = Api::<ConfigMap>::namespaced(client.clone(), namespace)
            .get_opt(configmap)
            .await
            .map_err(err(format!("ConfigMap {namespace}/{configmap}")))?;
        let data = cm
            .as_ref()
            .and_then(|cm| cm.data.clone())
            .unwrap_or_default();
        let services = Api::<Service>::all(client.clone())
            .list(&ListParams::default())
            .await
            .map_err(err("Services".to_owned()))?;
        let leases = Api::<Lease>::namespaced(client.clone(), agent_namespace)
            .list(&ListParams::default())
            .await
            .map_err(err(format!("Leases in {agent_namespace}")))?;
        let assignments = Api::<ConfigMap>::namespaced(client.clone(), namespace)
            .list(&ListParams::default().labels(keys::LABEL_ASSIGNMENTS))
            .await
            .map_err(err(format!("assignment ConfigMaps in {namespace}")))?;
        let node_list = Api::<Node>::all(client.clone())
            .list(&ListParams::default())
            .await
            .map_err(err("Nodes".to_owned()))?;
        let slices = if endpoints {
            Api::<EndpointSlice>::all(client.clone())
                .list(&ListParams::default())
                .await
                .map_err(err("EndpointSlices".to_owned()))?
                .items
        } else {
            Vec::new()
        };
        // Served from 1.33 on; older servers have none.
        let service_ranges = Api::<ServiceCIDR>::all(client.clone())
            .list(&ListParams::default())
            .await
            .map(|list| nodes::service_ranges(&list.items))
            .unwrap_or_default();
        let config = PoolConfig::parse(&data);
        let namespaces = if config.as_ref().is_ok_and(PoolConfig::selects_namespaces) {
            let list = Api::<Namespace>::all(client.clone())
                .list_metadata(&ListParams::default())
                .await
                .map_err(err("Namespaces".to_owned()))?;
            crate::observe::namespaces::labels(list.items.iter().map(|n| &n.metadata))
        } else {
            BTreeMap::new()
        };
        let now = Timestamp::now();
        Ok(Snapshot {
            configmap_name: format!("{namespace}/{configmap}"),
            configmap: cm,
            config,
            services: services.items,
            nodes: node_list.items.into_iter().map(Arc::new).collect(),
            agents: leases
                .items
                .iter()
                .filter_map(|l| agent_info(l, now))
                .collect(),
            assignments: assignments.items,
            slices,
            service_ranges,
            namespaces,
            now,
        })
    }

    /// The Service `namespace/name`, if it exists.
    pub fn service(&self, key: &ServiceKey) -> Option<&Service> {
        self.services
            .iter()
            .find(|s| service::service_key(s).as_ref() == Some(key))
    }

    /// Runs a fresh planner over the snapshot with `config` (the valid pool config) as a
    /// controller with `controller` settings would, after `what_if`.
    pub fn plan(
        &self,
        config: &PoolConfig,
        controller: &ControllerConfig,
        what_if: WhatIf<'_>,
    ) -> Planned {
        let mut views: Vec<Arc<ServiceView>> = Vec::new();
        let mut lingering = BTreeSet::new();
        let mut not_ours = BTreeSet::new();
        for svc in &self.services {
            let Some(key) = service::service_key(svc) else {
                continue;
            };
            if service::is_ours(svc, controller) {
                let uid: Arc<str> = Arc::from(svc.metadata.uid.as_deref().unwrap_or_default());
                views.push(Arc::new(service::service_view(svc, &key, &uid)));
            } else if service::has_our_marks(svc) {
                lingering.extend(service::ingress_ips(svc));
                not_ours.insert(key);
            }
        }
        let observed = crate::write::assignments::observed(&self.assignments);
        crate::reconcile::import_trusted_nodes(&mut views, &observed);

        let node_objects: Vec<Arc<Node>> = match what_if {
            WhatIf::Cordon(name) => self
                .nodes
                .iter()
                .map(|n| {
                    if n.metadata.name.as_deref() == Some(name) {
                        let mut n = (**n).clone();
                        n.spec.get_or_insert_default().unschedulable = Some(true);
                        Arc::new(n)
                    } else {
                        n.clone()
                    }
                })
                .collect(),
            _ => self.nodes.clone(),
        };
        let agents: BTreeMap<String, (Freshness, Arc<AgentReport>)> = self
            .agents
            .iter()
            .map(|(node, info)| {
                let lost = what_if == WhatIf::AgentLost(node.as_str());
                let freshness = if info.fresh && !lost {
                    Freshness::Fresh
                } else {
                    Freshness::Lost
                };
                (node.clone(), (freshness, Arc::new(info.report.clone())))
            })
            .collect();
        let mut reports: aliaslb_core::plan::Reports = agents
            .iter()
            .map(|(node, (_, report))| (node.clone(), report.clone()))
            .collect();
        let node_states = nodes::node_states(&node_objects, &agents);
        let node_addresses = nodes::node_addresses(node_objects.iter().map(|n| &**n));
        let local_keys: BTreeSet<&ServiceKey> = views
            .iter()
            .filter(|v| v.local_traffic)
            .map(|v| &v.key)
            .collect();
        let slices: Vec<endpoints::EndpointNodes> = self
            .slices
            .iter()
            .filter_map(endpoints::slice_nodes)
            .collect();
        let local = endpoints::local_endpoints(&slices, |k| local_keys.contains(k));
        // Agents name holders and none is fresh: the controller would be blind and keep
        // every assignment; so does the simulation.
        let blind = !agents.is_empty() && agents.values().all(|(f, _)| *f != Freshness::Fresh);
        let mut planner = Planner::new();
        // A move is break-before-make: one pass takes an address off its node, and the
        // next places it once that node's agent reports it released. Passes run, with the
        // fresh agents then holding what they were assigned, until nothing changes.
        let mut output;
        let mut passes = 0;
        loop {
            output = planner.plan(&Inputs {
                config,
                namespaces: &self.namespaces,
                services: &views,
                nodes: &node_states,
                agents: &reports,
                lingering: &lingering,
                node_addresses: &node_addresses,
                not_ours: &not_ours,
                service_ranges: &self.service_ranges,
                local_endpoints: &local,
                respect_cordon: controller.respect_cordon,
                agents_unobservable: blind,
                now: Instant::now(),
            });
            passes += 1;
            let mut held: BTreeMap<&str, BTreeSet<IpAddr>> = BTreeMap::new();
            for plan in output.services.values() {
                for node in plan.node.iter().chain(&plan.nodes) {
                    held.entry(node)
                        .or_default()
                        .extend(plan.ips.iter().copied());
                }
            }
            let mut changed = false;
            for (node, (freshness, _)) in &agents {
                if *freshness != Freshness::Fresh {
                    continue;
                }
                let now_held = held.get(node.as_str()).cloned().unwrap_or_default();
                if let Some(report) = reports.get_mut(node)
                    && report.held != now_held
                {
                    Arc::make_mut(report).held = now_held;
                    changed = true;
                }
            }
            if !changed || passes == CONVERGE_PASSES {
                break;
            }
        }
        Planned {
            planner,
            output,
            nodes: node_states,
            views: views.into_iter().map(|v| (v.key.clone(), v)).collect(),
            local,
        }
    }
}

/// The controller settings the CLI plans with: the flag defaults, with the namespaces and
/// the class the user gave.
pub fn controller_config(
    namespace: &str,
    agent_namespace: &str,
    configmap: &str,
) -> ControllerConfig {
    ControllerConfig {
        namespace: namespace.to_owned(),
        agent_namespace: agent_namespace.to_owned(),
        pool_configmap: configmap.to_owned(),
        ..ControllerConfig::default()
    }
}

/// The IPs of `ips` as a comma-separated list.
pub fn ip_list(ips: &[IpAddr]) -> String {
    ips.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}
