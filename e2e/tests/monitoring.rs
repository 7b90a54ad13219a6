//! The monitoring kit of `manifests/optional/monitoring/` against a real Prometheus (Debian's
//! `prometheus` package) scraping the lab's real controller and agents, with the shipped
//! rules file loaded (`rule_files:`). Each alert below is made to fire by causing its fault
//! for real in the lab (never by writing a metric), then to resolve by fixing it:
//!
//! - a pool of two addresses, one Service: `AliaslbPoolExhausted` stays quiet; two more
//!   Services (one left `PoolExhausted`): it goes pending, then fires, and so do
//!   `AliaslbPoolUsage75/85/95Percent` and, once the waiting Service is old enough,
//!   `AliaslbServicePending`; the pending Service and one holder deleted: all resolve;
//! - a cordon moves a Service (a graceful failover, counted and timed);
//! - the pool ConfigMap edited with a bad address: `AliaslbConfigRejected`; fixed: resolved;
//! - the holder's adverts dropped (UDP 7479, both ways, an nftables table on its node): its
//!   standby hears them stop while the address still answers: `AliaslbFastFailoverDegraded`
//!   fires with the standby's `node`; the adverts let through: resolved;
//! - every node labelled `node.kubernetes.io/exclude-from-external-load-balancers`: the
//!   Service keeps its IP and no node announces it (`NoEligibleNode`):
//!   `AliaslbServiceNotAnnounced`; the label removed: resolved;
//! - a host outside the cluster configures the Service's address and announces it: the
//!   holder defends it, `AliaslbAddressDefended`; the host gone: resolved;
//! - the controller's RBAC loses `services/status`: a new Service's status write is refused
//!   (403) and retried, `AliaslbWritesFailing`; the RBAC re-applied: resolved;
//! - the agents' RoleBinding deleted (their Lease writes refused): no agent is ready,
//!   `AliaslbNoAgentsReady` and `AliaslbAgentNotRenewing`; re-applied: resolved;
//! - L3 mode (`scripts/lab bgp-up`, BIRD on the nodes, agents reading it): a Service of a BGP
//!   pool announced by the three nodes, then the daemon of one node stopped: the Service is
//!   `PartiallyAnnounced` (`AliaslbBgpPoolPartiallyAnnounced`) and that node has no
//!   Established session (`AliaslbNoEstablishedBgpSession`); the daemon started again: both
//!   resolve;
//! - every metric name the rules' expressions use is in what Prometheus scraped (so a rename
//!   breaks this test); none is exempt;
//! - every agent series carries its node's name as `node`: the agents' scrape job is the
//!   plain scrape config of docs/operations.md (its `relabel_configs`, read from there), with the
//!   labels Kubernetes service discovery gives an agent pod (`__meta_kubernetes_pod_*`)
//!   set on each static target, since the lab's agents are processes, not pods; the agent
//!   PodMonitor's relabelling is checked to be the same rule;
//! - the Grafana dashboard (`grafana-dashboard.json`): every query variable's
//!   `label_values` has values, every panel has a query, and every query, sent as Grafana
//!   sends a time series panel's (a range query over the test's span, Grafana's interval
//!   variables substituted and each variable at "All", see [`grafana_expr`]), returns at
//!   least one value that is not NaN; every metric name it uses was scraped too.
//!
//! Not caused here (each has its `promtool test rules` cases): `AliaslbConfigNotLoaded` and
//! `AliaslbNoLeader` (a controller restart moves its metrics port, which the relay below
//! is bound to), `AliaslbAddressConflict` and `AliaslbNodeAddressConflict` (their faults are
//! e2e/tests/one_holder.rs's), `AliaslbShieldFailing` (an nftables that refuses the
//! agent's table), `AliaslbAgentRefreshCrowded` (thousands of addresses on a node).
//!
//! **Durations.** The shipped rules wait 1 to 10 minutes (`for:`), and the rules on a
//! Service's age wait minutes more. This test loads a copy of the shipped rules file whose
//! `for:` are all [`FOR`] and whose age thresholds are all [`AGE`] seconds
//! ([`with_for`], [`with_ages`]): the expressions, labels and everything else are the
//! shipped ones. What this test proves is that the expressions fire on the real fault and
//! resolve after the fix; that each alert waits its real `for` and age is proven by
//! `promtool test rules` (controller/tests/alerts.rs).
//!
//! **Where things run.** Prometheus runs in the client's namespace (`alb-client`, on the
//! LAN, like a Prometheus outside the nodes): it scrapes the agents on the nodes' LAN
//! addresses (`--metrics-addr` default `0.0.0.0:9101`). The controller runs on the host and
//! listens on 127.0.0.1 on a port of the kernel's choice (`--metrics-addr 127.0.0.1:0`, see
//! `Lab::start_controller_with`), which the test reads with `ss`; a relay pair (socat, a
//! unix socket in the lab's state directory) brings it into the client's namespace. The
//! controller is restarted with `--hold-released=0s`, so that a deleted Service's address
//! is free at once (by default it is held for a re-creation for 10 minutes, in use).
//!
//! One lab for the binary, so one test function running the phases in order. Needs root,
//! `prometheus`, `curl`, `ss`, `socat`, `arping`, BIRD 2 and FRR (scripts/lab bgp-up):
//!
//! ```sh
//! cargo build --workspace --bins && cargo test -p aliaslb-e2e --test monitoring -- --nocapture
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use aliaslb_e2e::Error;
use aliaslb_e2e::bgp::{BgpLab, NodeDaemon, routed_pool};
use aliaslb_e2e::fixtures::{lb_service, namespace};
use aliaslb_e2e::lab::{AGENT_NAMESPACE, CLIENT_NS, Lab, NODES, node_ip, node_name, wait_for};
use aliaslb_e2e::prometheus::{
    Job, Prometheus, SCRAPE_INTERVAL, dashboard_queries, dashboard_variables, free_port,
    grafana_expr, metric_names_in, rule_metric_names, tcp_listeners, with_ages, with_for,
};
use serde_json::Value;

/// The namespace and pool (two addresses) of the L2 phases.
const NS: &str = "e2e-monitoring";
const POOL: [&str; 2] = ["192.168.55.60", "192.168.55.61"];
/// The namespace and pool of the L3 phase (inside the lab's BGP_POOL4).
const BGP_NS: &str = "e2e-monitoring-bgp";
const BGP_POOL: &str = "10.200.0.30-10.200.0.33";
/// Every `for:` of the rules copy Prometheus loads (see the module docs).
const FOR: Duration = Duration::from_secs(5);
const FOR_TEXT: &str = "5s";
/// Every age threshold of the rules copy, in seconds (see the module docs).
const AGE: u64 = 5;
/// Slack on top of `for` for an alert to fire, and for one to resolve: a scrape, a rule
/// evaluation (1 s each), the controller's pass and the agent's report, on a loaded machine.
const ALERT_MARGIN: Duration = Duration::from_secs(10);
const ANNOUNCE_TIMEOUT: Duration = Duration::from_secs(20);
/// The agents' `--metrics-addr` port (their default).
const AGENT_METRICS_PORT: u16 = 9101;
const EXHAUSTED: &str = "AliaslbPoolExhausted";
const PARTIAL: &str = "AliaslbBgpPoolPartiallyAnnounced";
const EXCLUDE: &str = "node.kubernetes.io/exclude-from-external-load-balancers";

fn repo_file(path: &str) -> Result<String, Error> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path);
    std::fs::read_to_string(&path).map_err(|source| Error::Io {
        what: format!("reading {}", path.display()),
        source,
    })
}

fn monitoring_file(name: &str) -> Result<String, Error> {
    repo_file(&format!("manifests/optional/monitoring/{name}"))
}

#[test]
fn real_prometheus_alerts_metric_names_and_dashboard() -> Result<(), Error> {
    let t0 = Instant::now();
    let Some(lab) = Lab::up()? else {
        return Ok(());
    };
    lab.stop("controller-1")?;
    lab.start_controller_with("controller-1", &["--hold-released=0s"])?;
    lab.wait_leader("controller-1", Duration::from_secs(20))?;

    let shipped = monitoring_file("aliaslb.rules.yaml")?;
    let (rules, rewritten) = with_for(&shipped, FOR_TEXT);
    let alerts = shipped.matches("- alert: ").count();
    assert!(
        alerts >= 20 && rewritten == alerts,
        "rewrote {rewritten} `for:` in a rules file of {alerts} alerts"
    );
    let (rules, ages) = with_ages(&rules, AGE);
    assert!(ages >= 4, "rewrote {ages} age thresholds");
    let jobs = scrape_jobs(&lab)?;
    let prometheus = Prometheus::start(CLIENT_NS, free_port(CLIENT_NS)?, &jobs, &rules)?;
    let since = SystemTime::now();
    prometheus.wait_targets_up(&jobs, Duration::from_secs(30))?;
    println!(
        "[e2e] Prometheus scrapes {} targets every {SCRAPE_INTERVAL:?}",
        jobs.iter().map(|j| j.targets.len()).sum::<usize>()
    );
    every_agent_series_names_its_node(&prometheus)?;

    pool_exhausted_fires_and_resolves(&lab, &prometheus)?;
    graceful_failover_is_counted(&lab, &prometheus)?;
    config_rejected_fires_and_resolves(&lab, &prometheus)?;
    fast_failover_degraded_fires_and_resolves(&lab, &prometheus)?;
    not_announced_fires_and_resolves(&lab, &prometheus)?;
    address_defended_fires_and_resolves(&lab, &prometheus)?;
    writes_failing_fires_and_resolves(&lab, &prometheus)?;
    no_agents_ready_fires_and_resolves(&lab, &prometheus)?;
    {
        let bgp = BgpLab::up(&lab, NodeDaemon::Bird)?;
        bgp.restart_agents()?;
        partially_announced_fires(&lab, &bgp, &prometheus)?;
        // A few more scrapes, then every check over all that was scraped.
        std::thread::sleep(3 * SCRAPE_INTERVAL);
        every_rule_metric_is_scraped(&shipped, &prometheus)?;
        every_panel_has_data(&prometheus, since)?;
    }
    println!(
        "[e2e] monitoring test done in {:.1} s (lab bring-up included)",
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The agent job's `relabel_configs` of docs/operations.md's plain scrape config (the YAML block
/// after its `scrape-config` marker).
fn docs_agent_relabelling() -> Result<Vec<Value>, Error> {
    let docs = repo_file("docs/operations.md")?;
    let bad = |why: String| Error::Output {
        cmd: "reading docs/operations.md's scrape config".to_owned(),
        why,
    };
    let block = docs
        .split_once("<!-- scrape-config:")
        .and_then(|(_, rest)| rest.split_once("```yaml\n"))
        .and_then(|(_, rest)| rest.split_once("```"))
        .map(|(block, _)| block)
        .ok_or_else(|| bad("no ```yaml block after <!-- scrape-config".to_owned()))?;
    let config: Value = yaml_serde::from_str(block).map_err(|e| bad(e.to_string()))?;
    let job = config["scrape_configs"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|j| j["job_name"] == "aliaslb-agent")
        .ok_or_else(|| bad("no aliaslb-agent job".to_owned()))?;
    let relabel = job["relabel_configs"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    // The agent PodMonitor says the same: __meta_kubernetes_pod_node_name into `node`.
    let podmonitors = monitoring_file("podmonitors.yaml")?;
    let monitor = podmonitors
        .split("\n---\n")
        .filter_map(|doc| yaml_serde::from_str::<Value>(doc).ok())
        .find(|doc| doc["metadata"]["name"] == "aliaslb-agent")
        .ok_or_else(|| bad("no aliaslb-agent PodMonitor".to_owned()))?;
    let node_rule = |source: &Value, target: &Value| {
        source == &serde_json::json!(["__meta_kubernetes_pod_node_name"]) && target == "node"
    };
    assert!(
        monitor["spec"]["podMetricsEndpoints"][0]["relabelings"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|r| node_rule(&r["sourceLabels"], &r["targetLabel"])),
        "the agent PodMonitor does not relabel the node's name into `node`: {monitor}"
    );
    assert!(
        relabel
            .iter()
            .any(|r| node_rule(&r["source_labels"], &r["target_label"])),
        "docs/operations.md's agent job does not relabel the node's name into `node`: {relabel:?}"
    );
    Ok(relabel)
}

/// The controller (through a relay into the client's namespace) and the three agents, as
/// docs/operations.md's scrape config finds them (see the module docs).
fn scrape_jobs(lab: &Lab) -> Result<Vec<Job>, Error> {
    let pid = lab.pid("controller-1")?;
    let addr = wait_for(
        "controller-1 to listen for /metrics",
        Duration::from_secs(10),
        || {
            let listening = tcp_listeners(pid)?;
            Ok(match listening.as_slice() {
                [one] => Ok(*one),
                other => Err(format!("listening on {other:?}")),
            })
        },
    )?;
    let relay_port = free_port(CLIENT_NS)?;
    let socket = lab.state_dir().join("metrics-controller-1.sock");
    let socket = socket.to_string_lossy();
    lab.spawn(
        "metrics-relay-host",
        "host",
        &[
            "socat",
            &format!("UNIX-LISTEN:{socket},fork,unlink-early"),
            &format!("TCP:{addr}"),
        ],
    )?;
    lab.spawn(
        "metrics-relay-client",
        "client",
        &[
            "socat",
            &format!("TCP-LISTEN:{relay_port},bind=127.0.0.1,fork,reuseaddr"),
            &format!("UNIX-CONNECT:{socket}"),
        ],
    )?;
    // What Kubernetes service discovery (role: pod) says of an agent pod on node n.
    let pod = |n: u8| {
        BTreeMap::from([
            ("__meta_kubernetes_pod_node_name".to_owned(), node_name(n)),
            (
                "__meta_kubernetes_pod_label_app_kubernetes_io_name".to_owned(),
                "aliaslb-agent".to_owned(),
            ),
            (
                "__meta_kubernetes_pod_container_port_name".to_owned(),
                "metrics".to_owned(),
            ),
        ])
    };
    Ok(vec![
        Job {
            name: "aliaslb-controller".to_owned(),
            targets: vec![format!("127.0.0.1:{relay_port}")],
            ..Job::default()
        },
        Job {
            name: "aliaslb-agent".to_owned(),
            targets: NODES
                .iter()
                .map(|&n| format!("{}:{AGENT_METRICS_PORT}", node_ip(n)))
                .collect(),
            labels: NODES.iter().map(|&n| pod(n)).collect(),
            relabel_configs: docs_agent_relabelling()?,
        },
    ])
}

/// Every agent's series are labelled with its node's name (the relabelling), none with
/// another's.
fn every_agent_series_names_its_node(prometheus: &Prometheus) -> Result<(), Error> {
    let expr =
        "count by (instance, node) ({job=\"aliaslb-agent\", __name__=~\"aliaslb_agent_.*\"})";
    let series = prometheus.query(expr)?;
    let seen: BTreeMap<String, String> = series
        .iter()
        .map(|s| {
            (
                s["metric"]["instance"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                s["metric"]["node"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    let want: BTreeMap<String, String> = NODES
        .iter()
        .map(|&n| (format!("{}:{AGENT_METRICS_PORT}", node_ip(n)), node_name(n)))
        .collect();
    assert_eq!(seen, want, "{expr}: {series:?}");
    assert_eq!(series.len(), NODES.len(), "one node per agent: {series:?}");
    println!("[e2e] every agent series carries its node's name: {seen:?}");
    Ok(())
}

/// The alerts named `name` whose label `key` is `value`, as (state) strings.
fn alert_states(
    prometheus: &Prometheus,
    name: &str,
    key: &str,
    value: &str,
) -> Result<Vec<String>, Error> {
    Ok(prometheus
        .alerts()?
        .into_iter()
        .filter(|a| a.name == name && a.labels[key] == value)
        .map(|a| a.state)
        .collect())
}

/// Waits until Prometheus' instant query `expr` has a sample.
fn wait_series(prometheus: &Prometheus, expr: &str, timeout: Duration) -> Result<(), Error> {
    wait_for(&format!("Prometheus to have {expr}"), timeout, || {
        Ok(if prometheus.query(expr)?.is_empty() {
            Err("no sample".to_owned())
        } else {
            Ok(())
        })
    })
}

/// Waits until the alert `name` with `key`=`value` fires; returns the states seen before
/// (each change once, in order) and when it fired.
fn wait_firing(
    prometheus: &Prometheus,
    name: &str,
    (key, value): (&str, &str),
    timeout: Duration,
) -> Result<(Vec<String>, Instant), Error> {
    let mut seen: Vec<String> = Vec::new();
    wait_for(
        &format!("{name} {{{key}=\"{value}\"}} to fire"),
        timeout,
        || {
            let states = alert_states(prometheus, name, key, value)?;
            let now = states.join(",");
            if seen.last() != Some(&now) {
                seen.push(now.clone());
            }
            Ok(if states.iter().any(|s| s == "firing") {
                Ok(Instant::now())
            } else {
                Err(format!("states seen {seen:?}"))
            })
        },
    )
    .map(|at| (seen, at))
}

/// Waits until no alert `name` with `key`=`value` is pending or firing; returns how long
/// that took.
fn wait_resolved(
    prometheus: &Prometheus,
    name: &str,
    (key, value): (&str, &str),
    timeout: Duration,
) -> Result<Duration, Error> {
    let t0 = Instant::now();
    wait_for(
        &format!("{name} {{{key}=\"{value}\"}} to resolve"),
        timeout,
        || {
            let states = alert_states(prometheus, name, key, value)?;
            Ok(if states.is_empty() {
                Ok(())
            } else {
                Err(format!("{states:?}"))
            })
        },
    )?;
    Ok(t0.elapsed())
}

/// One fault and its alerts: `cause` it, wait until each of `alerts` (name, label) fires
/// (within `fire`), `fix` it, wait until each resolves (within `resolve`); prints how long
/// each took.
fn fault(
    prometheus: &Prometheus,
    what: &str,
    alerts: &[(&str, (&str, &str))],
    (fire, resolve): (Duration, Duration),
    cause: impl FnOnce() -> Result<(), Error>,
    fix: impl FnOnce() -> Result<(), Error>,
) -> Result<(), Error> {
    let caused = Instant::now();
    cause()?;
    for (alert, label) in alerts {
        let (seen, at) = wait_firing(prometheus, alert, *label, fire)?;
        println!(
            "[e2e] {what}: {alert} {{{}=\"{}\"}} fired {:.1} s after the fault (states seen {seen:?})",
            label.0,
            label.1,
            at.duration_since(caused).as_secs_f64()
        );
    }
    let fixed = Instant::now();
    fix()?;
    for (alert, label) in alerts {
        let left = resolve.saturating_sub(fixed.elapsed());
        wait_resolved(prometheus, alert, *label, left)?;
        println!(
            "[e2e] {what}: {alert} resolved {:.1} s after the fix",
            fixed.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

/// A pool of two: quiet at one Service, fires once exhausted (pending first: its `for` is in
/// force), resolves once an address is free.
fn pool_exhausted_fires_and_resolves(lab: &Lab, prometheus: &Prometheus) -> Result<(), Error> {
    lab.apply(&namespace(NS))?;
    lab.add_pool(NS, &POOL)?;
    lab.apply(&lb_service(NS, "svc-1").to_yaml())?;
    lab.wait_announced(NS, "svc-1", ANNOUNCE_TIMEOUT)?;
    let pool = format!("{{pool=\"{NS}\", family=\"ipv4\"}}");
    wait_series(
        prometheus,
        &format!("aliaslb_pool_addresses_in_use{pool} == 1 and aliaslb_pool_addresses{pool} == 2"),
        ANNOUNCE_TIMEOUT,
    )?;
    // Longer than `for` at one of two: the expression must not even be pending.
    std::thread::sleep(FOR + 2 * SCRAPE_INTERVAL);
    let quiet = alert_states(prometheus, EXHAUSTED, "pool", NS)?;
    assert!(
        quiet.is_empty(),
        "{EXHAUSTED} at 1 of 2 addresses: {quiet:?}"
    );

    lab.apply(&lb_service(NS, "svc-2").to_yaml())?;
    lab.wait_announced(NS, "svc-2", ANNOUNCE_TIMEOUT)?;
    let exhausted = Instant::now();
    lab.apply(&lb_service(NS, "svc-3").to_yaml())?;
    wait_for("svc-3 to be PoolExhausted", ANNOUNCE_TIMEOUT, || {
        let view = lab.service(NS, "svc-3")?;
        Ok(match view.conditions.get("aliaslb.io/IPAllocated") {
            Some(c) if c.reason == "PoolExhausted" => Ok(()),
            _ => Err(view.summary()),
        })
    })?;
    let (seen, fired) = wait_firing(prometheus, EXHAUSTED, ("pool", NS), FOR + ALERT_MARGIN)?;
    let took = fired.duration_since(exhausted);
    println!(
        "[e2e] {EXHAUSTED} {{pool=\"{NS}\"}} fired {:.1} s after svc-2, the pool's last address, was announced (exhausted since its allocation, a little earlier; for {FOR:?}; states seen {seen:?})",
        took.as_secs_f64()
    );
    assert!(
        seen.iter().any(|s| s == "pending"),
        "{EXHAUSTED} fired without being pending first: states {seen:?}"
    );
    let firing = prometheus.query(&format!(
        "ALERTS{{alertname=\"{EXHAUSTED}\", alertstate=\"firing\", pool=\"{NS}\", family=\"ipv4\", severity=\"critical\"}}"
    ))?;
    assert_eq!(firing.len(), 1, "the ALERTS series: {firing:?}");
    // At 2 of 2 every usage alert fires too.
    for usage in [75, 85, 95] {
        wait_firing(
            prometheus,
            &format!("AliaslbPoolUsage{usage}Percent"),
            ("pool", NS),
            FOR + ALERT_MARGIN,
        )?;
    }
    // svc-3 has waited since it was created: once older than AGE, and then FOR.
    let (_, fired) = wait_firing(
        prometheus,
        "AliaslbServicePending",
        ("namespace", NS),
        Duration::from_secs(AGE) + FOR + ALERT_MARGIN,
    )?;
    println!(
        "[e2e] AliaslbServicePending {{namespace=\"{NS}\"}} fired {:.1} s after svc-2 took the last address (age {AGE} s, then for {FOR:?})",
        fired.duration_since(exhausted).as_secs_f64()
    );
    let pending = prometheus.query(&format!(
        "ALERTS{{alertname=\"AliaslbServicePending\", alertstate=\"firing\", namespace=\"{NS}\", pool=\"{NS}\", reason=\"PoolExhausted\"}}"
    ))?;
    assert_eq!(pending.len(), 1, "the ALERTS series: {pending:?}");

    // svc-3 waits for an address: delete it first, so that the one svc-2 frees stays free.
    lab.kubectl(&["delete", "service", "-n", NS, "svc-3"])?;
    lab.kubectl(&["delete", "service", "-n", NS, "svc-2"])?;
    for alert in [
        EXHAUSTED,
        "AliaslbPoolUsage75Percent",
        "AliaslbPoolUsage85Percent",
        "AliaslbPoolUsage95Percent",
    ] {
        let took = wait_resolved(prometheus, alert, ("pool", NS), ALERT_MARGIN)?;
        println!(
            "[e2e] {alert} {{pool=\"{NS}\"}} resolved, {:.1} s later",
            took.as_secs_f64()
        );
    }
    wait_resolved(
        prometheus,
        "AliaslbServicePending",
        ("namespace", NS),
        ALERT_MARGIN,
    )?;
    Ok(())
}

/// svc-1's node cordoned: svc-1 moves (a graceful failover), which the controller counts
/// and times.
fn graceful_failover_is_counted(lab: &Lab, prometheus: &Prometheus) -> Result<(), Error> {
    let (_, old) = lab.wait_announced(NS, "svc-1", ANNOUNCE_TIMEOUT)?;
    lab.kubectl(&["cordon", &node_name(old)])?;
    let moved = wait_for(
        "svc-1 to move off its cordoned node",
        ANNOUNCE_TIMEOUT,
        || {
            let (_, node) = lab.wait_announced(NS, "svc-1", ANNOUNCE_TIMEOUT)?;
            Ok(if node == old {
                Err(format!("still on {}", node_name(old)))
            } else {
                Ok(node)
            })
        },
    );
    lab.kubectl(&["uncordon", &node_name(old)])?;
    let new = moved?;
    wait_series(
        prometheus,
        "aliaslb_failovers_total{cause=\"graceful\"} >= 1 and on(instance) aliaslb_failover_duration_seconds_count{cause=\"graceful\"} >= 1",
        ANNOUNCE_TIMEOUT,
    )?;
    println!(
        "[e2e] svc-1 moved from {} to {} on cordon: a graceful failover, counted and timed",
        node_name(old),
        node_name(new)
    );
    Ok(())
}

/// A bad address in the pool's key: the edit is refused, the last good config stays in
/// force; the key restored: resolved.
fn config_rejected_fires_and_resolves(lab: &Lab, prometheus: &Prometheus) -> Result<(), Error> {
    fault(
        prometheus,
        "pool ConfigMap edited with 192.168.55.300",
        &[("AliaslbConfigRejected", ("job", "aliaslb-controller"))],
        (FOR + ALERT_MARGIN, ALERT_MARGIN),
        || lab.add_pool(NS, &[POOL[0], POOL[1], "192.168.55.300"]),
        || lab.add_pool(NS, &POOL),
    )
}

/// The holder of svc-1 stops hearing and sending adverts (UDP 7479 dropped on its node):
/// its standby sees the adverts stop while svc-1's address still answers, and says so.
fn fast_failover_degraded_fires_and_resolves(
    lab: &Lab,
    prometheus: &Prometheus,
) -> Result<(), Error> {
    let (_, holder) = lab.wait_announced(NS, "svc-1", ANNOUNCE_TIMEOUT)?;
    // Its standby: the node standing by for an armed address (svc-1's is the only one).
    let armed = "aliaslb_agent_standby_addresses{state=\"armed\"} > 0";
    let standby = wait_for("svc-1's standby to be armed", ANNOUNCE_TIMEOUT, || {
        let series = prometheus.query(armed)?;
        Ok(match series.as_slice() {
            [one] => Ok(one["metric"]["node"]
                .as_str()
                .unwrap_or_default()
                .to_owned()),
            other => Err(format!("{armed}: {other:?}")),
        })
    })?;
    assert_ne!(
        standby,
        node_name(holder),
        "a holder is not its own standby"
    );
    let label = ("node", standby.as_str());
    fault(
        prometheus,
        &format!("adverts of {} dropped", node_name(holder)),
        &[("AliaslbFastFailoverDegraded", label)],
        (FOR + ALERT_MARGIN, ALERT_MARGIN),
        || lab.block_adverts(holder),
        || lab.unblock_adverts(holder),
    )?;
    // Fast failover was degraded, nothing moved: svc-1 is still on its holder.
    let (_, now) = lab.wait_announced(NS, "svc-1", ANNOUNCE_TIMEOUT)?;
    assert_eq!(now, holder, "svc-1 moved while the adverts were dropped");
    Ok(())
}

/// Every node excluded by label: svc-1 keeps its address and no node announces it.
fn not_announced_fires_and_resolves(lab: &Lab, prometheus: &Prometheus) -> Result<(), Error> {
    let names: Vec<String> = NODES.iter().map(|&n| node_name(n)).collect();
    let label = |suffix: &str| -> Result<(), Error> {
        let mut args = vec!["label", "node", "--overwrite"];
        args.extend(names.iter().map(String::as_str));
        let change = format!("{EXCLUDE}{suffix}");
        args.push(&change);
        lab.kubectl(&args).map(drop)
    };
    fault(
        prometheus,
        "every node excluded from load balancers",
        &[("AliaslbServiceNotAnnounced", ("namespace", NS))],
        (
            Duration::from_secs(AGE) + FOR + ALERT_MARGIN,
            ANNOUNCE_TIMEOUT,
        ),
        || label("=true"),
        || label("-"),
    )?;
    let reason = prometheus.query(&format!(
        "aliaslb_services_unannounced{{pool=\"{NS}\", reason=\"NoEligibleNode\"}}"
    ))?;
    assert!(reason.is_empty(), "still NoEligibleNode: {reason:?}");
    lab.wait_announced(NS, "svc-1", ANNOUNCE_TIMEOUT)?;
    Ok(())
}

/// A host outside the cluster takes svc-1's address: its holder defends it.
fn address_defended_fires_and_resolves(lab: &Lab, prometheus: &Prometheus) -> Result<(), Error> {
    let (ip, _) = lab.wait_announced(NS, "svc-1", ANNOUNCE_TIMEOUT)?;
    fault(
        prometheus,
        &format!("a foreign host claims {ip}"),
        &[("AliaslbAddressDefended", ("namespace", NS))],
        (
            Duration::from_secs(AGE) + FOR + ALERT_MARGIN,
            Duration::from_secs(120),
        ),
        || lab.add_rogue(ip).map(drop),
        || lab.remove_rogue(),
    )?;
    lab.wait_announced(NS, "svc-1", ANNOUNCE_TIMEOUT)?;
    Ok(())
}

/// The controller's ClusterRole without `services/status`: a new Service's status write is
/// refused, again and again, until the RBAC is applied again.
fn writes_failing_fires_and_resolves(lab: &Lab, prometheus: &Prometheus) -> Result<(), Error> {
    let mut role = lab.get_json(&["clusterrole", "aliaslb-controller"])?;
    let rules = role["rules"].as_array().cloned().unwrap_or_default();
    let kept: Vec<Value> = rules
        .iter()
        .filter(|r| {
            !r["resources"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|x| x == "services/status")
        })
        .cloned()
        .collect();
    assert_eq!(
        kept.len() + 1,
        rules.len(),
        "one rule grants services/status: {rules:?}"
    );
    role["rules"] = Value::Array(kept);
    role["metadata"]
        .as_object_mut()
        .map(|m| m.remove("resourceVersion"));
    let rbac = Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests/controller-rbac.yaml");
    let rbac = rbac.to_string_lossy().into_owned();
    fault(
        prometheus,
        "the controller may not write Service status",
        &[("AliaslbWritesFailing", ("object", "service"))],
        (FOR + ALERT_MARGIN, Duration::from_secs(45)),
        || {
            lab.apply(&role.to_string())?;
            lab.apply(&lb_service(NS, "svc-w").to_yaml())
        },
        || lab.kubectl(&["apply", "-f", &rbac]).map(drop),
    )?;
    lab.wait_announced(NS, "svc-w", ANNOUNCE_TIMEOUT)?;
    lab.kubectl(&["delete", "service", "-n", NS, "svc-w"])?;
    Ok(())
}

/// The agents' RoleBinding deleted: their Lease renewals are refused, and once their
/// Leases are stale no agent is ready.
fn no_agents_ready_fires_and_resolves(lab: &Lab, prometheus: &Prometheus) -> Result<(), Error> {
    let rbac = Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests/agent-rbac.yaml");
    let rbac = rbac.to_string_lossy().into_owned();
    let node1 = node_name(1);
    fault(
        prometheus,
        "the agents may not write their Leases",
        &[
            ("AliaslbNoAgentsReady", ("severity", "critical")),
            ("AliaslbAgentNotRenewing", ("node", node1.as_str())),
        ],
        (
            Duration::from_secs(AGE) + FOR + ALERT_MARGIN,
            ANNOUNCE_TIMEOUT,
        ),
        || {
            lab.kubectl(&[
                "delete",
                "rolebinding",
                "-n",
                AGENT_NAMESPACE,
                "aliaslb-agent",
            ])
            .map(drop)
        },
        || lab.kubectl(&["apply", "-f", &rbac]).map(drop),
    )?;
    lab.wait_announced(NS, "svc-1", ANNOUNCE_TIMEOUT)?;
    Ok(())
}

/// A Service of a BGP pool announced by the three nodes; node 3's daemon stopped: it is
/// PartiallyAnnounced and the pool's alert fires.
fn partially_announced_fires(
    lab: &Lab,
    bgp: &BgpLab<'_>,
    prometheus: &Prometheus,
) -> Result<(), Error> {
    routed_pool(lab, BGP_NS, BGP_POOL)?;
    lab.apply(&lb_service(BGP_NS, "web").to_yaml())?;
    let announced = |reason: &str| {
        wait_for(
            &format!("{BGP_NS}/web Announced {reason}"),
            Duration::from_secs(30),
            || {
                let view = lab.service(BGP_NS, "web")?;
                Ok(match view.conditions.get("aliaslb.io/Announced") {
                    Some(c) if c.reason == reason => Ok(()),
                    _ => Err(view.summary()),
                })
            },
        )
    };
    let phase = SystemTime::now();
    announced("Announced")?;
    wait_series(
        prometheus,
        "aliaslb_agent_routes_exported >= 1 and on(instance) aliaslb_agent_routing_daemon_info == 1",
        ANNOUNCE_TIMEOUT,
    )?;
    // Announced by all three: once Prometheus has scraped and evaluated that (a scrape and
    // an evaluation later), the pool has no unannounced Service and no alert (one may be
    // pending from the moments before every node exported the route; it must go).
    std::thread::sleep(2 * SCRAPE_INTERVAL);
    let unannounced = format!("aliaslb_services_unannounced{{pool=\"{BGP_NS}\"}}");
    wait_for(
        &format!("no {PARTIAL} for {BGP_NS} while announced by every node"),
        ALERT_MARGIN,
        || {
            let states = alert_states(prometheus, PARTIAL, "pool", BGP_NS)?;
            let series = prometheus.query(&unannounced)?;
            Ok(if states.is_empty() && series.is_empty() {
                Ok(())
            } else {
                Err(format!(
                    "alert states {states:?}, {unannounced}: {series:?}"
                ))
            })
        },
    )?;
    bgp.stop_daemon(3)?;
    announced("PartiallyAnnounced")?;
    let stopped = Instant::now();
    let (seen, fired) = wait_firing(prometheus, PARTIAL, ("pool", BGP_NS), FOR + ALERT_MARGIN)?;
    println!(
        "[e2e] {PARTIAL} {{pool=\"{BGP_NS}\"}} fired {:.1} s after the Service was PartiallyAnnounced (states seen {seen:?}); aliaslb_services_unannounced of the pool over the phase: {}",
        fired.duration_since(stopped).as_secs_f64(),
        timeline(prometheus, &unannounced, phase)?
    );
    let firing = prometheus.query(&format!(
        "ALERTS{{alertname=\"{PARTIAL}\", alertstate=\"firing\", pool=\"{BGP_NS}\", reason=\"PartiallyAnnounced\"}}"
    ))?;
    assert_eq!(firing.len(), 1, "the ALERTS series: {firing:?}");
    let node3 = node_name(3);
    let (seen, fired) = wait_firing(
        prometheus,
        "AliaslbNoEstablishedBgpSession",
        ("node", &node3),
        FOR + ALERT_MARGIN,
    )?;
    println!(
        "[e2e] AliaslbNoEstablishedBgpSession {{node=\"{node3}\"}} fired {:.1} s after its daemon stopped (states seen {seen:?})",
        fired.duration_since(stopped).as_secs_f64()
    );
    // The daemon back: its sessions come up, it exports the route again; both resolve.
    bgp.start_daemon(3)?;
    let started = Instant::now();
    let sessions = wait_resolved(
        prometheus,
        "AliaslbNoEstablishedBgpSession",
        ("node", &node3),
        Duration::from_secs(30),
    )?;
    let partial = wait_resolved(
        prometheus,
        PARTIAL,
        ("pool", BGP_NS),
        Duration::from_secs(30).saturating_sub(started.elapsed()),
    )?;
    println!(
        "[e2e] node 3's daemon started again: AliaslbNoEstablishedBgpSession resolved {:.1} s later, {PARTIAL} {:.1} s later",
        sessions.as_secs_f64(),
        (sessions + partial).as_secs_f64()
    );
    Ok(())
}

/// When each series of `expr` had samples since `since`, for the log: its `reason` and the
/// runs of consecutive samples, in seconds from `since` (`+a..+b`).
fn timeline(prometheus: &Prometheus, expr: &str, since: SystemTime) -> Result<String, Error> {
    let series = prometheus.query_range(expr, since, SystemTime::now(), SCRAPE_INTERVAL)?;
    let start = since
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64();
    let gap = 1.5 * SCRAPE_INTERVAL.as_secs_f64();
    let lines: Vec<String> = series
        .iter()
        .map(|s| {
            let mut runs: Vec<(f64, f64)> = Vec::new();
            for t in s["values"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|p| p[0].as_f64())
            {
                match runs.last_mut() {
                    Some((_, last)) if t - *last <= gap => *last = t,
                    _ => runs.push((t, t)),
                }
            }
            let runs: Vec<String> = runs
                .iter()
                .map(|(a, b)| format!("+{:.0}..+{:.0} s", a - start, b - start))
                .collect();
            format!("{{reason={}}} {}", s["metric"]["reason"], runs.join(", "))
        })
        .collect();
    Ok(lines.join("; "))
}

/// Every metric name of the rules' expressions was scraped, none exempt.
fn every_rule_metric_is_scraped(rules: &str, prometheus: &Prometheus) -> Result<(), Error> {
    let used = rule_metric_names(rules);
    assert!(
        used.contains("aliaslb_leader") && used.iter().any(|n| n.starts_with("aliaslb_agent_")),
        "the names read from the rules: {used:?}"
    );
    let scraped = prometheus.metric_names()?;
    // The check sees a rename: the rules with one name changed miss exactly that name.
    let renamed = rule_metric_names(&rules.replace(
        "aliaslb_pool_addresses_in_use",
        "aliaslb_pool_addresses_used",
    ));
    assert_eq!(
        renamed.difference(&scraped).collect::<Vec<_>>(),
        ["aliaslb_pool_addresses_used"]
    );
    let missing: Vec<&String> = used.difference(&scraped).collect();
    assert!(
        missing.is_empty(),
        "the rules use {missing:?}, which the real scrape does not have; scraped: {:?}",
        scraped
            .iter()
            .filter(|n| n.starts_with("aliaslb_"))
            .collect::<Vec<_>>()
    );
    println!(
        "[e2e] all {} metric names of the rules are in the scrape",
        used.len()
    );
    Ok(())
}

/// Whether a range query's result has a value that is not NaN.
fn has_value(series: &[Value]) -> bool {
    series.iter().any(|s| {
        s["values"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|point| point[1].as_str().is_some_and(|v| v != "NaN"))
    })
}

/// Every panel of the dashboard has a query, and each query returns data over the test's
/// span, as Grafana would ask for it: a range query from `since` to now whose step
/// (`$__interval`) is the span over 500 points but at least the scrape interval (what a
/// Grafana data source whose scrape interval is set to Prometheus' own uses as its minimum).
fn every_panel_has_data(prometheus: &Prometheus, since: SystemTime) -> Result<(), Error> {
    let text = monitoring_file("grafana-dashboard.json")?;
    let dashboard: Value = serde_json::from_str(&text).map_err(|e| Error::Output {
        cmd: "reading grafana-dashboard.json".to_owned(),
        why: format!("not JSON: {e}"),
    })?;
    let (queries, without) = dashboard_queries(&dashboard);
    assert!(without.is_empty(), "panels without a query: {without:?}");
    assert!(queries.len() >= 10, "{queries:?}");
    let (variables, other) = dashboard_variables(&dashboard);
    assert!(
        other.is_empty(),
        "variables this test cannot evaluate: {other:?}"
    );
    let names: Vec<&str> = variables.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(names, ["pool", "namespace", "node"]);
    for v in &variables {
        let values = prometheus.label_values(&v.selector, &v.label)?;
        assert!(
            !values.is_empty(),
            "variable ${} (label_values({}, {})) has no value",
            v.name,
            v.selector,
            v.label
        );
        println!("[e2e] dashboard variable ${}: {values:?}", v.name);
    }
    let now = SystemTime::now();
    let range = now.duration_since(since).unwrap_or_default();
    let step = (range / 500).max(SCRAPE_INTERVAL);
    // A rename the check must see: the same shape of query on a name that does not exist.
    let renamed = prometheus.query_range(
        "max by (pool, family) (aliaslb_pool_addresses_free)",
        since,
        now,
        step,
    )?;
    assert!(!has_value(&renamed), "{renamed:?}");

    let scraped = prometheus.metric_names()?;
    let mut empty = Vec::new();
    let mut unknown = BTreeSet::new();
    for q in &queries {
        unknown.extend(
            metric_names_in(&q.expr)
                .into_iter()
                .filter(|n| !scraped.contains(n)),
        );
        let expr =
            grafana_expr(&q.expr, step, SCRAPE_INTERVAL, range, &variables).map_err(|why| {
                Error::Output {
                    cmd: format!("panel {:?} {}", q.panel, q.ref_id),
                    why,
                }
            })?;
        let series = prometheus.query_range(&expr, since, now, step)?;
        if !has_value(&series) {
            empty.push(format!("{} / {}: {expr}", q.panel, q.ref_id));
        }
    }
    assert!(
        unknown.is_empty() && empty.is_empty(),
        "the dashboard uses {unknown:?}, which the real scrape does not have; panel queries \
         without data over the test's {range:?}:\n{}",
        empty.join("\n")
    );
    println!(
        "[e2e] every one of the dashboard's {} panel queries has data over {:.0} s (step {step:?})",
        queries.len(),
        range.as_secs_f64()
    );
    Ok(())
}
