//! [`Prometheus`]: a real Prometheus server (Debian's `prometheus` package,
//! `/usr/bin/prometheus`) run for one test in a network namespace of the lab, scraping the
//! targets it is given and evaluating a rules file, with its own temporary configuration and
//! TSDB; killed when the guard drops (also on panic). Its HTTP API is read with `curl` run in
//! the same namespace. Does I/O (a process, files, `curl`, `ss`), except the pure helpers
//! below it: the metric names of a rules file, the rewrite of its `for:` durations, the
//! queries of a Grafana dashboard and the substitution of Grafana's interval variables.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;

use crate::Error;
use crate::lab::{run, wait_for};

/// How often the server scrapes and evaluates its rules.
pub const SCRAPE_INTERVAL: Duration = Duration::from_secs(1);

/// One scrape job: its name (the `job` label), its targets (`host:port`), and what
/// service discovery would say of each (labels, `__meta_*` ones included, dropped after
/// relabelling) and the job's `relabel_configs`.
#[derive(Debug, Clone, Default)]
pub struct Job {
    /// The `job_name`.
    pub name: String,
    /// The targets, `host:port`.
    pub targets: Vec<String>,
    /// The labels of each target (same order; missing: none).
    pub labels: Vec<BTreeMap<String, String>>,
    /// The job's `relabel_configs`, as Prometheus reads them.
    pub relabel_configs: Vec<Value>,
}

/// One alert of `/api/v1/alerts`.
#[derive(Debug, Clone)]
pub struct Alert {
    /// `alertname`.
    pub name: String,
    /// `pending` or `firing`.
    pub state: String,
    /// Every label, as JSON.
    pub labels: Value,
}

/// A running Prometheus server (see the module docs).
#[derive(Debug)]
pub struct Prometheus {
    child: Child,
    dir: PathBuf,
    ns: String,
    port: u16,
}

impl Prometheus {
    /// Starts Prometheus in network namespace `ns` (`alb-client`, ...), listening on
    /// 127.0.0.1:`port` there, scraping `jobs` every [`SCRAPE_INTERVAL`] and evaluating
    /// `rules` (the text of a rules file) as often; returns once its API answers.
    pub fn start(ns: &str, port: u16, jobs: &[Job], rules: &str) -> Result<Prometheus, Error> {
        run(Command::new("prometheus").arg("--version")).map_err(|e| {
            Error::Environment(format!(
                "{e}: install Debian's `prometheus` package (scripts/test does)"
            ))
        })?;
        let dir = temp_dir()?;
        let io = |what: String| move |source| Error::Io { what, source };
        let rules_path = dir.join("rules.yaml");
        std::fs::write(&rules_path, rules)
            .map_err(io(format!("writing {}", rules_path.display())))?;
        let config_path = dir.join("prometheus.yml");
        std::fs::write(&config_path, config(jobs, &rules_path))
            .map_err(io(format!("writing {}", config_path.display())))?;
        let log_path = dir.join("prometheus.log");
        let log =
            File::create(&log_path).map_err(io(format!("creating {}", log_path.display())))?;
        let err = log
            .try_clone()
            .map_err(io("duplicating the log".to_owned()))?;
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", ns, "prometheus"])
            .arg(format!("--config.file={}", config_path.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err);
        // `ip netns exec` execs prometheus: the child is the server itself.
        let child = cmd.spawn().map_err(|source| Error::Spawn {
            cmd: "ip netns exec ... prometheus".to_owned(),
            source,
        })?;
        let server = Prometheus {
            child,
            dir,
            ns: ns.to_owned(),
            port,
        };
        wait_for(
            "Prometheus to answer /-/ready",
            Duration::from_secs(30),
            || {
                Ok(match server.curl(&["-f", &server.url("/-/ready")]) {
                    Ok(_) => Ok(()),
                    Err(e) => Err(format!("{e}; log: {}", server.log_tail(5))),
                })
            },
        )?;
        Ok(server)
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    fn curl(&self, args: &[&str]) -> Result<String, Error> {
        run(Command::new("ip")
            .args(["netns", "exec", &self.ns, "curl", "-sS", "--max-time", "10"])
            .args(args))
    }

    /// `GET path` of the HTTP API with `params` (URL-encoded): its `data` once `status`
    /// is `success`.
    pub fn api(&self, path: &str, params: &[(&str, &str)]) -> Result<Value, Error> {
        let pairs: Vec<String> = params.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let mut args = vec!["-G"];
        for pair in &pairs {
            args.extend(["--data-urlencode", pair.as_str()]);
        }
        let url = self.url(path);
        args.push(&url);
        let out = self.curl(&args)?;
        let what = || format!("curl {path} {params:?}");
        let v: Value = serde_json::from_str(&out).map_err(|e| Error::Output {
            cmd: what(),
            why: format!("not JSON ({e}): {out}"),
        })?;
        if v["status"] != "success" {
            return Err(Error::Output {
                cmd: what(),
                why: format!("{} {}", v["errorType"], v["error"]),
            });
        }
        Ok(v["data"].clone())
    }

    /// The result of the instant query `expr` (a vector's samples).
    pub fn query(&self, expr: &str) -> Result<Vec<Value>, Error> {
        let data = self.api("/api/v1/query", &[("query", expr)])?;
        Ok(data["result"].as_array().cloned().unwrap_or_default())
    }

    /// The series of the range query `expr` from `start` to `end`, one point per `step`, as
    /// Grafana asks for a time series panel.
    pub fn query_range(
        &self,
        expr: &str,
        start: SystemTime,
        end: SystemTime,
        step: Duration,
    ) -> Result<Vec<Value>, Error> {
        let (start, end) = (unix(start), unix(end));
        let step = format!("{}", step.as_secs_f64());
        let data = self.api(
            "/api/v1/query_range",
            &[
                ("query", expr),
                ("start", &start),
                ("end", &end),
                ("step", &step),
            ],
        )?;
        Ok(data["result"].as_array().cloned().unwrap_or_default())
    }

    /// Every metric name this server has stored (`/api/v1/label/__name__/values`, over
    /// its whole TSDB: a series that existed for one scrape counts).
    pub fn metric_names(&self) -> Result<BTreeSet<String>, Error> {
        let data = self.api("/api/v1/label/__name__/values", &[])?;
        Ok(data
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|n| n.as_str().map(str::to_owned))
            .collect())
    }

    /// The values of `label` on the series of `selector` this server has (as Grafana's
    /// `label_values(SELECTOR, LABEL)` asks).
    pub fn label_values(&self, selector: &str, label: &str) -> Result<Vec<String>, Error> {
        let data = self.api(
            &format!("/api/v1/label/{label}/values"),
            &[("match[]", selector)],
        )?;
        Ok(data
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|n| n.as_str().map(str::to_owned))
            .collect())
    }

    /// The alerts pending or firing now.
    pub fn alerts(&self) -> Result<Vec<Alert>, Error> {
        let data = self.api("/api/v1/alerts", &[])?;
        Ok(data["alerts"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|a| Alert {
                name: a["labels"]["alertname"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                state: a["state"].as_str().unwrap_or_default().to_owned(),
                labels: a["labels"].clone(),
            })
            .collect())
    }

    /// Waits until the server has scraped each of `jobs`' targets successfully.
    pub fn wait_targets_up(&self, jobs: &[Job], timeout: Duration) -> Result<(), Error> {
        let expected: usize = jobs.iter().map(|j| j.targets.len()).sum();
        wait_for("every scrape target up", timeout, || {
            let data = self.api("/api/v1/targets", &[("state", "active")])?;
            let targets = data["activeTargets"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let up = targets.iter().filter(|t| t["health"] == "up").count();
            Ok(if up == expected {
                Ok(())
            } else {
                let seen: Vec<String> = targets
                    .iter()
                    .map(|t| format!("{} {} {}", t["scrapeUrl"], t["health"], t["lastError"]))
                    .collect();
                Err(format!("{up} of {expected} up: {seen:?}"))
            })
        })
    }

    /// The last `lines` lines of the server's log.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(self.dir.join("prometheus.log")).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(lines).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "---- last lines of Prometheus' log ----\n{}",
                self.log_tail(20)
            );
        }
        // SIGKILL: its TSDB is thrown away with the directory.
        if let Err(e) = self.child.kill() {
            eprintln!(
                "[e2e] killing Prometheus (pid {}) failed: {e}",
                self.child.id()
            );
        }
        let _ = self.child.wait();
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            eprintln!("[e2e] removing {} failed: {e}", self.dir.display());
        }
    }
}

/// A fresh directory under the system's temporary directory.
fn temp_dir() -> Result<PathBuf, Error> {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let dir = std::env::temp_dir().join(format!(
        "aliaslb-e2e-prometheus-{}-{nanos}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).map_err(|source| Error::Io {
        what: format!("creating {}", dir.display()),
        source,
    })?;
    Ok(dir)
}

/// A TCP port free on 127.0.0.1 in network namespace `ns` (the kernel's choice for a port
/// 0 bind, released at once: nothing else of the lab binds ports of that range there).
pub fn free_port(ns: &str) -> Result<u16, Error> {
    crate::client::in_namespace(ns, || {
        std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr())
    })?
    .map(|a| a.port())
    .map_err(|source| Error::Io {
        what: format!("binding a port in {ns}"),
        source,
    })
}

/// Seconds since the epoch, as the HTTP API takes a time.
fn unix(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    format!("{}.{:03}", d.as_secs(), d.subsec_millis())
}

/// The address of every TCP socket process `pid` listens on in the host's namespace
/// (`ss -Hltnp`): how to find a server started with port 0.
pub fn tcp_listeners(pid: u32) -> Result<Vec<SocketAddr>, Error> {
    let out = run(Command::new("ss").args(["-Hltnp"]))?;
    Ok(listeners_of(&out, pid))
}

/// The local addresses of `pid`'s sockets in `ss -Hltnp` output.
fn listeners_of(ss: &str, pid: u32) -> Vec<SocketAddr> {
    let tag = format!("pid={pid},");
    ss.lines()
        .filter(|l| l.contains(&tag))
        .filter_map(|l| l.split_whitespace().nth(3)?.parse().ok())
        .collect()
}

/// The server's configuration: `jobs`, `rules` as its one rules file, scrapes and rule
/// evaluations every [`SCRAPE_INTERVAL`]. Written as JSON, which Prometheus reads as the
/// YAML it is.
pub fn config(jobs: &[Job], rules: &Path) -> String {
    let interval = format!("{}s", SCRAPE_INTERVAL.as_secs());
    let scrape: Vec<Value> = jobs
        .iter()
        .map(|job| {
            let statics: Vec<Value> = job
                .targets
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    serde_json::json!({
                        "targets": [t],
                        "labels": job.labels.get(i).cloned().unwrap_or_default(),
                    })
                })
                .collect();
            serde_json::json!({
                "job_name": job.name,
                "static_configs": statics,
                "relabel_configs": job.relabel_configs,
            })
        })
        .collect();
    let config = serde_json::json!({
        "global": {
            "scrape_interval": interval,
            "scrape_timeout": interval,
            "evaluation_interval": interval,
        },
        "rule_files": [rules.display().to_string()],
        "scrape_configs": scrape,
    });
    format!("{config:#}\n")
}

/// The metric names (`aliaslb_...`) the expressions (`expr:` blocks) of a rules file use.
/// The file is read as text, as written in `manifests/optional/monitoring/`: an `expr: |`
/// block ends at the first line indented no deeper than its key; a one-line `expr:` counts
/// too.
pub fn rule_metric_names(rules: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut block: Option<usize> = None;
    for line in rules.lines() {
        let indent = line.len() - line.trim_start().len();
        if let Some(key) = block {
            if line.trim().is_empty() || indent > key {
                names.extend(metric_names_in(line));
                continue;
            }
            block = None;
        }
        if let Some(rest) = line.trim_start().strip_prefix("expr:") {
            if rest.trim_start().starts_with(['|', '>']) {
                block = Some(indent);
            } else {
                names.extend(metric_names_in(rest));
            }
        }
    }
    names
}

/// The `aliaslb_...` identifiers in `text` (a PromQL expression).
pub fn metric_names_in(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("aliaslb_") {
        let starts_word = rest[..at]
            .chars()
            .next_back()
            .is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_'));
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        if starts_word {
            names.push(tail[..end].to_owned());
        }
        rest = &tail[end..];
    }
    names
}

/// The rules file with every rule's `for:` set to `duration` (e.g. `5s`), and how many
/// were rewritten.
pub fn with_for(rules: &str, duration: &str) -> (String, usize) {
    let mut count = 0;
    let mut out = String::with_capacity(rules.len());
    for line in rules.lines() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("for:") {
            let indent = &line[..line.len() - trimmed.len()];
            out += &format!("{indent}for: {duration}\n");
            count += 1;
        } else {
            out += line;
            out.push('\n');
        }
    }
    (out, count)
}

/// The rules file with the threshold of every rule on an age (an expression whose metric
/// is an `aliaslb_..._seconds` gauge: it ends `> N`) set to `seconds`, and how many were
/// rewritten. Like [`with_for`], for a test that cannot wait minutes: the expressions are
/// otherwise the shipped ones.
pub fn with_ages(rules: &str, seconds: u64) -> (String, usize) {
    let mut count = 0;
    let mut out: Vec<String> = Vec::new();
    // The current `expr: |` block: its key's indent, and where its lines start in `out`.
    let mut block: Option<(usize, usize)> = None;
    let finish = |out: &mut Vec<String>, from: usize, count: &mut usize| {
        let text = out[from..].join("\n");
        let on_age = metric_names_in(&text)
            .iter()
            .any(|n| n.ends_with("_seconds"));
        if !on_age {
            return;
        }
        // The last `> N` of the block is its threshold.
        for line in out[from..].iter_mut().rev() {
            if let Some(at) = line.rfind("> ") {
                let tail = &line[at + 2..];
                if !tail.is_empty() && tail.trim().chars().all(|c| c.is_ascii_digit() || c == '.') {
                    *line = format!("{}> {seconds}", &line[..at]);
                    *count += 1;
                    return;
                }
            }
        }
    };
    for line in rules.lines() {
        let indent = line.len() - line.trim_start().len();
        if let Some((key, from)) = block
            && !line.trim().is_empty()
            && indent <= key
        {
            finish(&mut out, from, &mut count);
            block = None;
        }
        out.push(line.to_owned());
        if let Some(rest) = line.trim_start().strip_prefix("expr:")
            && rest.trim_start().starts_with(['|', '>'])
        {
            block = Some((indent, out.len()));
        }
    }
    if let Some((_, from)) = block {
        finish(&mut out, from, &mut count);
    }
    (out.join("\n") + "\n", count)
}

/// One query of a Grafana dashboard panel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PanelQuery {
    /// The panel's title.
    pub panel: String,
    /// The target's `refId`.
    pub ref_id: String,
    /// The PromQL expression, with Grafana's variables.
    pub expr: String,
}

/// Every target's query of a dashboard (the panels of rows included, collapsed or not),
/// and the titles of the panels that are neither rows nor have a query.
pub fn dashboard_queries(dashboard: &Value) -> (Vec<PanelQuery>, Vec<String>) {
    let mut queries = Vec::new();
    let mut without = Vec::new();
    let mut stack: Vec<&Value> = dashboard["panels"]
        .as_array()
        .into_iter()
        .flatten()
        .collect();
    stack.reverse();
    while let Some(panel) = stack.pop() {
        let title = panel["title"].as_str().unwrap_or_default().to_owned();
        if panel["type"] == "row" {
            let inner: Vec<&Value> = panel["panels"].as_array().into_iter().flatten().collect();
            stack.extend(inner.into_iter().rev());
            continue;
        }
        let before = queries.len();
        for target in panel["targets"].as_array().into_iter().flatten() {
            if let Some(expr) = target["expr"].as_str() {
                queries.push(PanelQuery {
                    panel: title.clone(),
                    ref_id: target["refId"].as_str().unwrap_or_default().to_owned(),
                    expr: expr.to_owned(),
                });
            }
        }
        if queries.len() == before {
            without.push(title);
        }
    }
    (queries, without)
}

/// One query variable of a dashboard (`$pool`, ...): its name, the series selector and
/// label of its `label_values(...)` query, and the value of "All".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Variable {
    /// Its name (`$name` in queries).
    pub name: String,
    /// The series selector of `label_values(SELECTOR, LABEL)`.
    pub selector: String,
    /// The label whose values it offers.
    pub label: String,
    /// What "All" sends (`allValue`).
    pub all: String,
}

/// The query variables of a dashboard (`label_values(SELECTOR, LABEL)` ones), and the
/// names of those that are not of that form.
pub fn dashboard_variables(dashboard: &Value) -> (Vec<Variable>, Vec<String>) {
    let mut vars = Vec::new();
    let mut other = Vec::new();
    for v in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if v["type"] != "query" {
            continue;
        }
        let name = v["name"].as_str().unwrap_or_default().to_owned();
        let query = v["query"]["query"]
            .as_str()
            .or_else(|| v["query"].as_str())
            .unwrap_or_default();
        let parsed = query
            .strip_prefix("label_values(")
            .and_then(|q| q.strip_suffix(')'))
            .and_then(|q| q.rsplit_once(','));
        match parsed {
            Some((selector, label)) if v["includeAll"] == true => vars.push(Variable {
                name,
                selector: selector.trim().to_owned(),
                label: label.trim().to_owned(),
                all: v["allValue"].as_str().unwrap_or(".*").to_owned(),
            }),
            _ => other.push(name),
        }
    }
    (vars, other)
}

/// `expr` as Grafana sends it: `$__interval` is `step`, `$__rate_interval` is
/// max(`step` + `scrape`, 4 × `scrape`) (Grafana's rule, with the data source's scrape
/// interval), `$__range` is `range`, each of `vars` its "All" value; both spellings (`$x`,
/// `${x}`). Any other variable left is an error: the dashboard would send it to Prometheus
/// unresolved.
pub fn grafana_expr(
    expr: &str,
    step: Duration,
    scrape: Duration,
    range: Duration,
    vars: &[Variable],
) -> Result<String, String> {
    let secs = |d: Duration| format!("{}ms", d.as_millis());
    let rate = (step + scrape).max(4 * scrape);
    let mut out = expr.to_owned();
    // Longest names first: `$__rate_interval` before `$__interval` is not an issue (no
    // prefix), but `$__range_ms` would be; it is not supported, hence the check below.
    let builtin = [
        ("__rate_interval".to_owned(), secs(rate)),
        ("__interval".to_owned(), secs(step)),
        ("__range".to_owned(), secs(range)),
    ];
    let custom = vars.iter().map(|v| (v.name.clone(), v.all.clone()));
    for (name, value) in builtin.into_iter().chain(custom) {
        out = out.replace(&format!("${{{name}}}"), &value);
        out = out.replace(&format!("${name}"), &value);
    }
    if out.contains('$') {
        return Err(format!("a Grafana variable is left in {out:?}"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULES: &str = "groups:
  - name: g
    rules:
      - alert: A
        expr: |
          aliaslb_pool_addresses_in_use >= aliaslb_pool_addresses
            and on(instance) aliaslb_leader == 1
        for: 1m
        annotations:
          summary: \"not_aliaslb_x {{ $labels.pool }} aliaslb_in_summary\"
      - alert: B
        expr: max(aliaslb_leader) == 0 or absent(my_aliaslb_other)
        for: 10m
";

    #[test]
    fn rule_names_come_from_expressions_only() {
        let names: Vec<String> = rule_metric_names(RULES).into_iter().collect();
        assert_eq!(
            names,
            [
                "aliaslb_leader",
                "aliaslb_pool_addresses",
                "aliaslb_pool_addresses_in_use"
            ]
        );
    }

    #[test]
    fn every_for_is_rewritten() {
        let (text, n) = with_for(RULES, "5s");
        assert_eq!(n, 2);
        assert_eq!(text.matches("        for: 5s\n").count(), 2, "{text}");
        assert!(!text.contains("1m") && !text.contains("10m"), "{text}");
        assert_eq!(rule_metric_names(&text), rule_metric_names(RULES));
    }

    #[test]
    fn queries_of_rows_and_panels() {
        let dashboard = serde_json::json!({"panels": [
            {"type": "row", "title": "r", "panels": [
                {"type": "timeseries", "title": "in row", "targets": [{"refId": "A", "expr": "b"}]}
            ]},
            {"type": "timeseries", "title": "p", "targets": [
                {"refId": "A", "expr": "a"}, {"refId": "B", "expr": "c"}
            ]},
            {"type": "text", "title": "note"}
        ]});
        let (queries, without) = dashboard_queries(&dashboard);
        let got: Vec<(&str, &str)> = queries
            .iter()
            .map(|q| (q.panel.as_str(), q.expr.as_str()))
            .collect();
        assert_eq!(got, [("in row", "b"), ("p", "a"), ("p", "c")]);
        assert_eq!(without, ["note"]);
    }

    #[test]
    fn grafana_variables_are_substituted() {
        let s = Duration::from_secs;
        assert_eq!(
            grafana_expr(
                "rate(x[$__rate_interval]) + rate(y[${__interval}]) + increase(z[$__range])",
                s(2),
                s(1),
                s(300),
                &[]
            ),
            Ok("rate(x[4000ms]) + rate(y[2000ms]) + increase(z[300000ms])".to_owned())
        );
        assert_eq!(
            grafana_expr("rate(x[$__rate_interval])", s(10), s(1), s(60), &[]),
            Ok("rate(x[11000ms])".to_owned())
        );
        assert!(grafana_expr("x{pool=\"$pool\"}", s(1), s(1), s(60), &[]).is_err());
        let pool = Variable {
            name: "pool".into(),
            selector: "aliaslb_pool_addresses".into(),
            label: "pool".into(),
            all: ".*".into(),
        };
        assert_eq!(
            grafana_expr("x{pool=~\"$pool\"}", s(1), s(1), s(60), &[pool]),
            Ok("x{pool=~\".*\"}".to_owned())
        );
    }

    #[test]
    fn age_thresholds_are_rewritten_and_nothing_else() {
        let rules = "groups:
  - name: g
    rules:
      - alert: Old
        expr: |
          max by (reason) (
            aliaslb_services_pending_seconds
              and on(instance) aliaslb_leader == 1
          ) > 240
        for: 1m
      - alert: Count
        expr: |
          aliaslb_pool_addresses_in_use >= aliaslb_pool_addresses
        for: 1m
      - alert: Renewal
        expr: |
          min by (node) (aliaslb_node_agent_renewal_age_seconds) > 60
        for: 1m
";
        let (text, n) = with_ages(rules, 5);
        assert_eq!(n, 2, "{text}");
        assert!(text.contains("          ) > 5\n"), "{text}");
        assert!(text.contains("renewal_age_seconds) > 5\n"), "{text}");
        assert!(!text.contains("240") && !text.contains("> 60"), "{text}");
        assert!(text.contains(">= aliaslb_pool_addresses\n"), "{text}");
        assert_eq!(rule_metric_names(&text), rule_metric_names(rules));
    }

    #[test]
    fn variables_of_a_dashboard() {
        let d = serde_json::json!({"templating": {"list": [
            {"name": "datasource", "type": "datasource"},
            {"name": "pool", "type": "query", "includeAll": true, "allValue": ".*",
             "query": {"query": "label_values(aliaslb_pool_addresses, pool)"}},
            {"name": "odd", "type": "query", "query": "query_result(up)"}
        ]}});
        let (vars, other) = dashboard_variables(&d);
        assert_eq!(vars.len(), 1);
        assert_eq!(
            (vars[0].selector.as_str(), vars[0].label.as_str()),
            ("aliaslb_pool_addresses", "pool")
        );
        assert_eq!(other, ["odd"]);
    }

    #[test]
    fn the_config_is_json_prometheus_reads() {
        let job = Job {
            name: "a".into(),
            targets: vec!["10.0.0.1:9101".into()],
            labels: vec![BTreeMap::from([("__meta_x".to_owned(), "n1".to_owned())])],
            relabel_configs: vec![
                serde_json::json!({"source_labels": ["__meta_x"], "target_label": "node"}),
            ],
        };
        let v: Value = serde_json::from_str(&config(&[job], Path::new("/r.yaml"))).unwrap();
        assert_eq!(
            v["scrape_configs"][0]["static_configs"][0]["labels"]["__meta_x"],
            "n1"
        );
        assert_eq!(
            v["scrape_configs"][0]["relabel_configs"][0]["target_label"],
            "node"
        );
        assert_eq!(v["rule_files"][0], "/r.yaml");
    }

    #[test]
    fn listeners_of_a_pid() {
        let ss =
            "LISTEN 0 1024 127.0.0.1:41235 0.0.0.0:* users:((\"aliaslb-control\",pid=812,fd=9))
LISTEN 0 5 127.0.0.1:16501 0.0.0.0:* users:((\"socat\",pid=8120,fd=5))
";
        assert_eq!(
            listeners_of(ss, 812),
            ["127.0.0.1:41235".parse::<SocketAddr>().unwrap()]
        );
    }
}
