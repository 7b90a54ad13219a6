//! The monitoring kit of `manifests/optional/monitoring/` against a real Prometheus (Debian's
//! `prometheus` package) scraping the lab's real controller and agents, with the shipped
//! rules file loaded (`rule_files:`):
//!
//! - a pool of two addresses, one Service: `AliaslbPoolExhausted` stays quiet; two more
//!   Services (one left `PoolExhausted`): it goes pending, then fires within its `for` plus
//!   [`ALERT_MARGIN`]; the pending Service and one holder deleted (an address free): it
//!   resolves within [`ALERT_MARGIN`];
//! - a cordon moves a Service (a graceful failover, counted and timed);
//! - L3 mode (`scripts/lab bgp-up`, BIRD on the nodes, agents reading it): a Service of a BGP
//!   pool announced by the three nodes, then the daemon of one node stopped: the Service is
//!   `PartiallyAnnounced` and `AliaslbBgpPoolPartiallyAnnounced` fires;
//! - every metric name the rules' expressions use is in what Prometheus scraped (so a rename
//!   breaks this test). The phases above make every one of them exist, none is exempt: the
//!   per-reason and per-pool gauges (`aliaslb_services_pending_by_reason`,
//!   `aliaslb_services_unannounced`) only have series while a Service is pending or
//!   unannounced, and `aliaslb_agent_routing_daemon_info` only in L3 mode;
//! - the Grafana dashboard (`grafana-dashboard.json`): every panel has a query, and every
//!   query, sent as Grafana sends a time series panel's (a range query over the test's
//!   span, Grafana's interval variables substituted, see [`grafana_expr`]), returns at least
//!   one value that is not NaN; every metric name it uses was scraped too. The BGP panels
//!   count only agents that read a routing daemon (`* on(instance) group_left(daemon)
//!   aliaslb_agent_routing_daemon_info`: in L2 mode they stay empty rather than show zeros),
//!   so they get their data from the L3 phase: bringing BGP up in this lab costs ~3 s.
//!
//! Fired here: `AliaslbPoolExhausted` and `AliaslbBgpPoolPartiallyAnnounced`. The other
//! alerts are checked on the real scrape only by name (above) and by `promtool test rules`;
//! the failover panels get their data from a graceful failover (the `hard` and `conflict`
//! causes are exercised by e2e/tests/failover.rs and one_holder.rs, not here). About 50 s
//! with the lab's bring-up.
//!
//! **The `for` durations.** The shipped rules wait 1 to 10 minutes (`for:`) before firing.
//! This test loads a copy of the shipped rules file whose `for:` are all [`FOR`]: the
//! expressions, labels and everything else are the shipped ones. What this test proves is
//! that the expressions fire and resolve on the real metrics; that each alert waits its
//! real `for` is proven by `promtool test rules` (controller/tests/alerts.rs).
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
//! `prometheus`, `curl`, `ss`, `socat`, BIRD 2 and FRR (scripts/lab bgp-up):
//!
//! ```sh
//! cargo build --workspace --bins && cargo test -p aliaslb-e2e --test monitoring -- --nocapture
//! ```

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime};

use aliaslb_e2e::Error;
use aliaslb_e2e::bgp::{BgpLab, NodeDaemon, routed_pool};
use aliaslb_e2e::fixtures::{lb_service, namespace};
use aliaslb_e2e::lab::{CLIENT_NS, Lab, NODES, node_ip, node_name, wait_for};
use aliaslb_e2e::prometheus::{
    Job, Prometheus, SCRAPE_INTERVAL, dashboard_queries, free_port, grafana_expr, metric_names_in,
    rule_metric_names, tcp_listeners, with_for,
};
use serde_json::Value;

/// The namespace and pool (two addresses) of the exhaustion phase.
const NS: &str = "e2e-monitoring";
const POOL: [&str; 2] = ["192.168.55.60", "192.168.55.61"];
/// The namespace and pool of the L3 phase (inside the lab's BGP_POOL4).
const BGP_NS: &str = "e2e-monitoring-bgp";
const BGP_POOL: &str = "10.200.0.30-10.200.0.33";
/// Every `for:` of the rules copy Prometheus loads (see the module docs).
const FOR: Duration = Duration::from_secs(5);
const FOR_TEXT: &str = "5s";
/// Slack on top of `for` for an alert to fire, and for one to resolve: a scrape, a rule
/// evaluation (1 s each), the controller's pass and the agent's report, on a loaded machine.
const ALERT_MARGIN: Duration = Duration::from_secs(10);
const ANNOUNCE_TIMEOUT: Duration = Duration::from_secs(20);
/// The agents' `--metrics-addr` port (their default).
const AGENT_METRICS_PORT: u16 = 9101;
const EXHAUSTED: &str = "AliaslbPoolExhausted";
const PARTIAL: &str = "AliaslbBgpPoolPartiallyAnnounced";

fn monitoring_file(name: &str) -> Result<String, Error> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../manifests/optional/monitoring")
        .join(name);
    std::fs::read_to_string(&path).map_err(|source| Error::Io {
        what: format!("reading {}", path.display()),
        source,
    })
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
        alerts >= 14 && rewritten == alerts,
        "rewrote {rewritten} `for:` in a rules file of {alerts} alerts"
    );
    let jobs = scrape_jobs(&lab)?;
    let prometheus = Prometheus::start(CLIENT_NS, free_port(CLIENT_NS)?, &jobs, &rules)?;
    let since = SystemTime::now();
    prometheus.wait_targets_up(&jobs, Duration::from_secs(30))?;
    println!(
        "[e2e] Prometheus scrapes {} targets every {SCRAPE_INTERVAL:?}",
        jobs.iter().map(|j| j.targets.len()).sum::<usize>()
    );

    pool_exhausted_fires_and_resolves(&lab, &prometheus)?;
    graceful_failover_is_counted(&lab, &prometheus)?;
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

/// The controller (through a relay into the client's namespace) and the three agents.
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
    Ok(vec![
        Job {
            name: "aliaslb-controller".to_owned(),
            targets: vec![format!("127.0.0.1:{relay_port}")],
        },
        Job {
            name: "aliaslb-agent".to_owned(),
            targets: NODES
                .iter()
                .map(|&n| format!("{}:{AGENT_METRICS_PORT}", node_ip(n)))
                .collect(),
        },
    ])
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

    // svc-3 waits for an address: delete it first, so that the one svc-2 frees stays free.
    lab.kubectl(&["delete", "service", "-n", NS, "svc-3"])?;
    lab.kubectl(&["delete", "service", "-n", NS, "svc-2"])?;
    let freed = Instant::now();
    wait_for(
        &format!("{EXHAUSTED} {{pool=\"{NS}\"}} to resolve"),
        ALERT_MARGIN,
        || {
            let states = alert_states(prometheus, EXHAUSTED, "pool", NS)?;
            Ok(if states.is_empty() {
                Ok(())
            } else {
                Err(format!("{states:?}"))
            })
        },
    )?;
    println!(
        "[e2e] {EXHAUSTED} {{pool=\"{NS}\"}} resolved {:.1} s after svc-2 was deleted",
        freed.elapsed().as_secs_f64()
    );
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
            grafana_expr(&q.expr, step, SCRAPE_INTERVAL, range).map_err(|why| Error::Output {
                cmd: format!("panel {:?} {}", q.panel, q.ref_id),
                why,
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
