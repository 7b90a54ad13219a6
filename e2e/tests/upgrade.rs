//! The upgrade from the single-object assignment format of the previous release to the
//! sharded one, "agents first, then the controller", with the LAN sampled throughout: no
//! load-balancer IP goes unanswered beyond the sampler's resolution, none is answered by two
//! MACs, none is configured on two nodes.
//!
//! What is real and what is simulated: the lab, the kube-apiserver, the agents and the
//! controller are this workspace's. The previous release's controller is simulated by the
//! objects it wrote: with the controller stopped, each node's objects are rewritten as that
//! release wrote them (one ConfigMap `aliaslb-node-<node>`, its IP lines under `ips`, every
//! node's MACs under `node-macs`, label `aliaslb.io/node-assignment` only, by a server-side
//! apply of field manager `aliaslb-controller` with force, as it applied them) and the
//! shards are deleted (that release wrote none). Agents of the previous release are not run:
//! the agents restarted here are the new ones, which must read the single-object format.
//!
//! The phases, on one lab:
//! 1. a pool and [`SERVICES`] spread over the three nodes, all announced and answered;
//! 2. the LAN sampler (who answers ARP for each IP, every 20 ms, from the client's
//!    namespace) and the alias sampler (the /32 aliases of every node, every 50 ms) start;
//! 3. the controller stops; every node's objects are put back in the previous format (under
//!    the running agents, which must keep their aliases through the change);
//! 4. every agent is SIGKILLed and started again, one at a time (SIGKILL, not SIGTERM: a
//!    SIGTERMed agent removes its aliases for the controller to move them, and none runs
//!    now; a killed agent's aliases stay for their kernel lifetime); each must renew its
//!    Lease reporting its IPs held, and its aliases must outlive the killed agent's lifetimes;
//! 5. the controller starts again and converts every node's objects to the sharded format
//!    (the index gets `shards`, the shards hold the same lines); then one Service is created
//!    and one deleted, and the agents follow the sharded objects.
//!
//! Verdicts, from the LAN: for each IP no round with two MACs and no MAC but its holder's,
//! and the longest unanswered stretch of each IP from phase 3 on within [`MAX_UNANSWERED`];
//! from the alias sampler, no IP on two nodes and each on its own node in every sample; from
//! the agents' logs, no alias removed or added from phase 3 on but the deleted and the new
//! Service's (adopted is fine): that covers the LAN sampler's stalls on this loaded 2-core
//! machine, during which an alias dropped and added back would go unseen (the stalls are
//! printed, not failed, unlike in one_holder.rs). An agent that reads the single-object format as empty
//! (tried once, not kept) fails the unanswered-stretch, alias-on-its-node and Lease checks:
//! its IPs went unanswered for about 65 s, until the controller's conversion. Needs root:
//!
//! ```sh
//! cargo build --workspace --bins
//! cargo test -p aliaslb-e2e --test upgrade -- --nocapture
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr};
use std::process::Command;
use std::time::{Duration, Instant};

use aliaslb_e2e::client;
use aliaslb_e2e::fixtures::{lb_service, namespace};
use aliaslb_e2e::lab::{
    AGENT_NAMESPACE, LEASE_DURATION, Lab, NODES, SYSTEM_NAMESPACE, node_name, run_with_input,
    wait_for,
};
use aliaslb_e2e::lan::{LAN_PERIOD, LanRecord, LanSampler, LanViolation, Mac, name_macs};
use aliaslb_e2e::sampler::{Sampler, Samples};
use aliaslb_e2e::{Error, aliases};
use serde_json::{Value, json};

const NS: &str = "e2e-upgrade";
/// One address per Service, the extra one of phase 5 included (a deleted Service's address
/// is held for its re-creation, so none is reused within the run).
const POOL: [&str; 7] = [
    "192.168.55.30",
    "192.168.55.31",
    "192.168.55.32",
    "192.168.55.33",
    "192.168.55.34",
    "192.168.55.35",
    "192.168.55.36",
];
/// The Services present through the upgrade: five over three nodes (least-loaded election
/// puts two, two and one).
const SERVICES: [&str; 5] = ["up-1", "up-2", "up-3", "up-4", "up-5"];
/// Created after the conversion (phase 5).
const EXTRA: &str = "up-6";
/// Deleted after the conversion (phase 5).
const DELETED: &str = SERVICES[0];
const ANNOUNCE_TIMEOUT: Duration = Duration::from_secs(30);
/// The longest an IP may go unanswered on the LAN: the time between the two rounds around
/// one lost round (two periods), plus one period of the sampler's scheduling delay on this
/// 2-core machine, plus [`RETURN_SILENCE`]. A dropped alias costs far more: the previous one
/// is gone until an agent adds it again, which takes a reconcile and an API read (and with
/// the controller stopped, never happens).
const MAX_UNANSWERED: Duration =
    Duration::from_millis(3 * LAN_PERIOD.as_millis() as u64 + RETURN_SILENCE.as_millis() as u64);
/// What a restarted agent's aliases stay silent while it asks the LAN whether another node
/// answers for them (one holder across a return: an nftables transaction, a 25 ms probe,
/// another transaction): 80 ms measured in phase 4 on this loaded machine.
const RETURN_SILENCE: Duration = Duration::from_millis(100);
/// The kernel lifetime of the aliases: the agent's lease duration less its 1 s renewal.
/// An agent killed leaves its aliases for that long at most.
const ALIAS_LIFETIME: Duration = Duration::from_secs(LEASE_DURATION.as_secs() - 1);
/// The label of every assignment object, in both formats.
const LABEL_ASSIGNMENTS: &str = "aliaslb.io/node-assignment";
/// The label the sharded format adds (index and shards), naming the node.
const LABEL_ASSIGNMENT_NODE: &str = "aliaslb.io/assignment-node";
/// The data keys of an assignment object.
const IPS_KEY: &str = "ips";
const NODE_MACS_KEY: &str = "node-macs";
const SHARDS_KEY: &str = "shards";
/// The controller's field manager, the previous release's too.
const FIELD_MANAGER: &str = "aliaslb-controller";

/// Service name -> (IP, node).
type Assignments = BTreeMap<&'static str, (Ipv4Addr, u8)>;

#[test]
fn agents_then_controller_upgrade_keeps_every_alias() -> Result<(), Error> {
    let Some(lab) = Lab::up()? else {
        return Ok(());
    };
    let t_test = Instant::now();
    let mut problems: Vec<String> = Vec::new();

    // 1. Services spread over the nodes, announced and answered, in the sharded format.
    lab.apply(&namespace(NS))?;
    lab.add_pool(NS, &POOL)?;
    for name in SERVICES {
        lab.apply(&lb_service(NS, name).to_yaml())?;
    }
    let before = assignments(&lab, &SERVICES)?;
    for (name, (ip, node)) in &before {
        wait_answered(*ip)?;
        eprintln!("[upgrade] {NS}/{name}: {ip} on {}", node_name(*node));
    }
    let spread: BTreeSet<u8> = before.values().map(|(_, n)| *n).collect();
    assert!(
        spread.len() > 1,
        "the Services are not spread over the nodes: {before:?}"
    );
    let carrying: BTreeMap<u8, BTreeSet<Ipv4Addr>> =
        NODES.into_iter().map(|n| (n, ips_on(&before, n))).collect();
    let sharded_lines = wait_sharded(&lab, &carrying, "before the upgrade")?;
    let names = lab.mac_names()?;
    let macs: BTreeMap<u8, Mac> = NODES
        .into_iter()
        .map(|n| Ok((n, lab.node_mac(n)?)))
        .collect::<Result<_, Error>>()?;

    // 2. The samplers.
    let lan = LanSampler::start(before.values().map(|(ip, _)| *ip))?;
    let alias_sampler = Sampler::start();
    std::thread::sleep(Duration::from_secs(1));

    // 3. The previous release's objects, the controller stopped.
    let t3 = Instant::now();
    let log_offsets: BTreeMap<u8, u64> = NODES
        .into_iter()
        .map(|n| (n, agent_log(&lab, n).len() as u64))
        .collect();
    lab.stop("controller-1")?;
    let mut legacy_lines = BTreeMap::new();
    for n in NODES {
        if let Some(lines) = downgrade(&lab, n, &sharded_lines)? {
            legacy_lines.insert(n, lines);
        }
    }
    // The running agents see the format change under them.
    std::thread::sleep(Duration::from_secs(2));
    eprintln!(
        "[upgrade] phase 3: controller stopped, {} nodes' objects in the previous format (and 2 s for the agents to read them) in {:.1} s",
        legacy_lines.len(),
        t3.elapsed().as_secs_f64()
    );

    // 4. The agents, one at a time.
    let t4 = Instant::now();
    for n in NODES {
        match restart_agent(&lab, n, &carrying[&n]) {
            Ok(line) => eprintln!("[upgrade] phase 4: {line}"),
            Err(e) => problems.push(format!("restart of agent-{n}: {e:?}")),
        }
    }
    eprintln!(
        "[upgrade] phase 4: three agents restarted on the previous format in {:.1} s",
        t4.elapsed().as_secs_f64()
    );
    for n in NODES {
        let still = legacy_state(&lab, n)?;
        if carrying[&n].is_empty() {
            continue;
        }
        if still.shards.is_some() || !still.shard_names.is_empty() {
            problems.push(format!(
                "{}'s objects left the previous format while no controller ran: {still:?}",
                node_name(n)
            ));
        }
    }

    // 5. The new controller converts; the agents follow the sharded objects.
    let t5 = Instant::now();
    lab.start_controller("controller-1")?;
    lab.wait_leader("controller-1", Duration::from_secs(30))?;
    let converted = wait_sharded(&lab, &carrying, "after the controller's restart")?;
    let convert_secs = t5.elapsed().as_secs_f64();
    for (n, lines) in &legacy_lines {
        if converted.get(n) != Some(lines) {
            problems.push(format!(
                "the controller changed {}'s lines when converting: {lines:?} -> {:?}",
                node_name(*n),
                converted.get(n)
            ));
        }
    }
    // Whatever a new leader does in its first lease durations (a full pass, agents
    // unconfirmed until seen renewing) happens inside the sampled window.
    std::thread::sleep(LEASE_DURATION + Duration::from_secs(2));
    let after = assignments(&lab, &SERVICES)?;
    if after != before {
        problems.push(format!(
            "assignments changed through the upgrade: {before:?} -> {after:?}"
        ));
    }
    eprintln!(
        "[upgrade] phase 5: controller-1 converted every node's objects to the sharded format in {convert_secs:.1} s"
    );
    let t_follow = Instant::now();
    lab.apply(&lb_service(NS, EXTRA).to_yaml())?;
    let extra = assignments(&lab, &[EXTRA])?[EXTRA];
    wait_answered(extra.0)?;
    lan.watch(before.values().map(|(ip, _)| *ip).chain([extra.0]));
    let (deleted_ip, deleted_node) = before[DELETED];
    let t_delete = Instant::now();
    lab.kubectl(&["delete", "service", "-n", NS, DELETED, "--wait=false"])?;
    wait_for(
        &format!("{deleted_ip} to leave {}", node_name(deleted_node)),
        Duration::from_secs(15),
        || {
            let held = aliases(deleted_node)?;
            Ok(if held.contains(&deleted_ip) {
                Err(format!("{held:?}"))
            } else {
                Ok(())
            })
        },
    )?;
    let mut now_carrying = carrying.clone();
    if let Some(ips) = now_carrying.get_mut(&deleted_node) {
        ips.remove(&deleted_ip);
    }
    now_carrying.entry(extra.1).or_default().insert(extra.0);
    let followed = wait_sharded(&lab, &now_carrying, "after the create and the delete")?;
    eprintln!(
        "[upgrade] phase 5: {NS}/{EXTRA} -> {} on {}, {NS}/{DELETED} ({deleted_ip}) deleted and gone from {}, in {:.1} s; shards now: {followed:?}",
        extra.0,
        node_name(extra.1),
        node_name(deleted_node),
        t_follow.elapsed().as_secs_f64()
    );
    std::thread::sleep(Duration::from_secs(1));
    let t_end = Instant::now();
    let record = lan.finish()?;
    let samples = alias_sampler.finish()?;

    // 6. Verdicts.
    let mut holders: BTreeMap<Ipv4Addr, (u8, Instant, Instant)> = before
        .values()
        .map(|(ip, n)| (*ip, (*n, t3, t_end)))
        .collect();
    if let Some(h) = holders.get_mut(&deleted_ip) {
        h.2 = t_delete;
    }
    // The new IP is judged from its first answer on (the sampler watched it only then).
    let first_extra = record
        .samples
        .iter()
        .find(|s| s.answers.get(&extra.0).is_some_and(|m| !m.is_empty()))
        .map_or(t_end, |s| s.at);
    holders.insert(extra.0, (extra.1, first_extra, t_end));
    let phases = [
        ("3", t3),
        ("4", t4),
        ("5", t5),
        ("5, create and delete", t_follow),
        ("end", t_end),
    ];
    let logs: BTreeMap<u8, String> = NODES
        .into_iter()
        .map(|n| {
            let text = agent_log(&lab, n);
            let from = usize::try_from(log_offsets[&n])
                .unwrap_or(0)
                .min(text.len());
            (n, text[from..].to_owned())
        })
        .collect();
    for (figures, found) in [
        lan_verdicts(&record, &holders, &macs, &names, t3),
        (announcements(&record, &phases, &names), Vec::new()),
        alias_verdicts(&samples.since(t3), &holders),
        log_verdicts(&logs, &holders, (deleted_ip, deleted_node), extra),
    ] {
        for line in figures {
            eprintln!("[upgrade] {line}");
        }
        problems.extend(found);
    }
    eprintln!(
        "[upgrade] the run took {:.1} s ({:.1} s from phase 3 on)",
        t_test.elapsed().as_secs_f64(),
        t3.elapsed().as_secs_f64()
    );
    assert!(
        problems.is_empty(),
        "{} problems:\n{}",
        problems.len(),
        problems.join("\n")
    );
    Ok(())
}

/// Node `n`'s agent log so far (every agent-N process appends to it).
fn agent_log(lab: &Lab, n: u8) -> String {
    let path = lab.state_dir().join(format!("logs/agent-{n}.log"));
    String::from_utf8_lossy(&std::fs::read(path).unwrap_or_default()).into_owned()
}

/// The agents' own account of every alias change from phase 3 on (`logs`: what each node's
/// agents logged since): the lines of `aliaslb_agent::aliases` saying an alias was removed,
/// or added that was not there (`changed=true`; an alias found in place is "adopted").
/// None for the IPs of `holders` but the deleted Service's removal from its node and the
/// extra Service's addition on its node. This covers what the LAN sampler cannot see while
/// it stalls: an alias dropped and added back within a stall is two such lines.
fn log_verdicts(
    logs: &BTreeMap<u8, String>,
    holders: &BTreeMap<Ipv4Addr, (u8, Instant, Instant)>,
    deleted: (Ipv4Addr, u8),
    extra: (Ipv4Addr, u8),
) -> Verdict {
    let (mut figures, mut problems) = (Vec::new(), Vec::new());
    for (n, text) in logs {
        let changes = |verb: &str, ip: Ipv4Addr| -> usize {
            let needle = format!("aliaslb_agent::aliases: {verb} alias={ip}/");
            text.lines()
                .filter(|l| l.contains(&needle) && (verb != "added" || l.contains("changed=true")))
                .count()
        };
        let mut adopted = 0;
        for ip in holders.keys() {
            adopted += changes("adopted", *ip);
            let removed = changes("removed", *ip);
            let added = changes("added", *ip);
            let removed_ok = usize::from(deleted == (*ip, *n));
            let added_ok = usize::from(extra == (*ip, *n));
            if removed > removed_ok || added > added_ok {
                problems.push(format!(
                    "agent-{n} changed {ip} from phase 3 on: removed {removed} times, added {added} times (expected {removed_ok} and {added_ok})"
                ));
            }
        }
        let warnings: Vec<&str> = text
            .lines()
            .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
            .collect();
        figures.push(format!(
            "agent-{n}'s log from phase 3 on: {adopted} aliases adopted, {} lines, {} warnings or errors{}",
            text.lines().count(),
            warnings.len(),
            warnings
                .iter()
                .take(3)
                .map(|l| format!("\n    {l}"))
                .collect::<String>()
        ));
    }
    (figures, problems)
}

/// The gratuitous ARPs the LAN sampler saw in each phase (`phases`: name and start, the
/// last one the end), by IP and MAC: an agent announces the aliases it adds or adopts.
fn announcements(
    record: &LanRecord,
    phases: &[(&str, Instant)],
    names: &BTreeMap<Mac, String>,
) -> Vec<String> {
    phases
        .windows(2)
        .map(|w| {
            let ((name, from), (_, to)) = (w[0], w[1]);
            let mut seen: BTreeMap<(Ipv4Addr, String), usize> = BTreeMap::new();
            for a in &record.announcements {
                if a.at >= from && a.at < to {
                    let mac = names
                        .get(&a.mac)
                        .cloned()
                        .unwrap_or_else(|| a.mac.to_string());
                    *seen.entry((a.ip, mac)).or_default() += 1;
                }
            }
            let listed: Vec<String> = seen
                .iter()
                .map(|((ip, mac), count)| format!("{ip} by {mac} x{count}"))
                .collect();
            format!(
                "announcements in phase {name} ({:.1} s): {}",
                to.saturating_duration_since(from).as_secs_f64(),
                if listed.is_empty() {
                    "none".to_owned()
                } else {
                    listed.join(", ")
                }
            )
        })
        .collect()
}

/// Waits until every Service of `names` is announced: name -> (IP, node).
fn assignments(lab: &Lab, names: &[&'static str]) -> Result<Assignments, Error> {
    names
        .iter()
        .map(|name| Ok((*name, lab.wait_announced(NS, name, ANNOUNCE_TIMEOUT)?)))
        .collect()
}

fn ips_on(assignments: &Assignments, n: u8) -> BTreeSet<Ipv4Addr> {
    assignments
        .values()
        .filter(|(_, node)| *node == n)
        .map(|(ip, _)| *ip)
        .collect()
}

fn wait_answered(ip: Ipv4Addr) -> Result<client::Answer, Error> {
    wait_for(
        &format!("http://{ip}/ from the client"),
        Duration::from_secs(10),
        || client::get(ip),
    )
}

/// A node's assignment objects as read from the API.
#[derive(Debug, Clone, PartialEq, Eq)]
struct NodeObjects {
    /// The index's (or single object's) data keys.
    keys: BTreeSet<String>,
    /// Its labels.
    labels: BTreeMap<String, String>,
    /// Its `ips`.
    ips: String,
    /// Its `node-macs`.
    node_macs: Option<String>,
    /// Its `shards`.
    shards: Option<String>,
    /// The shards labelled with the node, by name: their `ips`.
    shard_names: BTreeMap<String, String>,
}

fn index_name(n: u8) -> String {
    format!("aliaslb-node-{}", node_name(n))
}

fn shard_name(n: u8, k: u32) -> String {
    format!("aliaslb-shard-{}-{k}", node_name(n))
}

/// Node `n`'s objects; `None` when it has no index.
fn read_objects(lab: &Lab, n: u8) -> Result<Option<NodeObjects>, Error> {
    let listed = lab.get_json(&[
        "configmaps",
        "-n",
        SYSTEM_NAMESPACE,
        "-l",
        LABEL_ASSIGNMENTS,
    ])?;
    let items = listed["items"].as_array().cloned().unwrap_or_default();
    let name_of = |cm: &Value| cm["metadata"]["name"].as_str().unwrap_or("").to_owned();
    let Some(index) = items.iter().find(|cm| name_of(cm) == index_name(n)) else {
        return Ok(None);
    };
    let text = |cm: &Value, key: &str| cm["data"][key].as_str().map(str::to_owned);
    let shard_prefix = format!("aliaslb-shard-{}-", node_name(n));
    let shard_names = items
        .iter()
        .filter(|cm| {
            cm["metadata"]["labels"][LABEL_ASSIGNMENT_NODE].as_str() == Some(&node_name(n))
                && name_of(cm).starts_with(&shard_prefix)
        })
        .map(|cm| (name_of(cm), text(cm, IPS_KEY).unwrap_or_default()))
        .collect();
    let strings = |v: &Value| -> BTreeMap<String, String> {
        v.as_object()
            .into_iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
            .collect()
    };
    Ok(Some(NodeObjects {
        keys: strings(&index["data"]).into_keys().collect(),
        labels: strings(&index["metadata"]["labels"]),
        ips: text(index, IPS_KEY).unwrap_or_default(),
        node_macs: text(index, NODE_MACS_KEY),
        shards: text(index, SHARDS_KEY),
        shard_names,
    }))
}

fn legacy_state(lab: &Lab, n: u8) -> Result<NodeObjects, Error> {
    read_objects(lab, n)?.ok_or_else(|| Error::Output {
        cmd: format!(
            "kubectl get configmap -n {SYSTEM_NAMESPACE} {}",
            index_name(n)
        ),
        why: "missing".to_owned(),
    })
}

/// The IP of an assignment line (its first field).
fn line_ip(line: &str) -> Option<IpAddr> {
    line.split_whitespace().next()?.parse().ok()
}

/// A node's lines in the sharded format, by IP, from the shards its index counts; `Err`
/// says why they are not (yet) readable.
fn sharded_lines(n: u8, objects: &NodeObjects) -> Result<BTreeMap<IpAddr, String>, String> {
    let count: u32 = objects
        .shards
        .as_deref()
        .ok_or("the index has no `shards`")?
        .trim()
        .parse()
        .map_err(|e| format!("`shards`: {e}"))?;
    if objects.labels.get(LABEL_ASSIGNMENT_NODE) != Some(&node_name(n)) {
        return Err(format!("the index's labels: {:?}", objects.labels));
    }
    if line_ip(&objects.ips).is_some_and(|ip| !ip.is_unspecified()) {
        return Err(format!("the index still lists IP lines: {:?}", objects.ips));
    }
    let mut lines = BTreeMap::new();
    for k in 0..count {
        let name = shard_name(n, k);
        let text = objects
            .shard_names
            .get(&name)
            .ok_or_else(|| format!("{name} (of {count}) is missing"))?;
        for line in text.lines() {
            // Fast failover's words: a standby line is no IP this node carries, and the
            // previous release wrote no `peer=` or `relay=` (its agents refuse them).
            let words: Vec<&str> = line.split_whitespace().collect();
            if words.iter().any(|w| w.starts_with("standby=")) {
                continue;
            }
            let kept: Vec<&str> = words
                .into_iter()
                .filter(|w| !w.starts_with("peer=") && !w.starts_with("relay="))
                .collect();
            let line = kept.join(" ");
            let line = line.as_str();
            let ip = line_ip(line).ok_or_else(|| format!("{name}: line {line:?}"))?;
            // A copy in another shard than its own exists only while the count grows (a
            // handful of lines never grows it): without the hash, refuse to guess.
            if lines.insert(ip, format!("{line}\n")).is_some() {
                return Err(format!("{ip} is in two shards"));
            }
        }
    }
    Ok(lines)
}

/// Waits until every node's objects are sharded and list exactly the IPs of `carrying`;
/// returns each node's lines in address order, as one text.
fn wait_sharded(
    lab: &Lab,
    carrying: &BTreeMap<u8, BTreeSet<Ipv4Addr>>,
    when: &str,
) -> Result<BTreeMap<u8, String>, Error> {
    wait_for(
        &format!("every node's objects sharded {when}"),
        Duration::from_secs(30),
        || {
            let mut out = BTreeMap::new();
            for (n, ips) in carrying {
                let Some(objects) = read_objects(lab, *n)? else {
                    if ips.is_empty() {
                        continue;
                    }
                    return Ok(Err(format!("{} has no index", index_name(*n))));
                };
                let lines = match sharded_lines(*n, &objects) {
                    Ok(lines) => lines,
                    Err(why) => return Ok(Err(format!("{}: {why}", node_name(*n)))),
                };
                let listed: BTreeSet<IpAddr> = lines.keys().copied().collect();
                let want: BTreeSet<IpAddr> = ips.iter().map(|ip| IpAddr::V4(*ip)).collect();
                if listed != want {
                    return Ok(Err(format!(
                        "{} lists {listed:?}, not {want:?}",
                        node_name(*n)
                    )));
                }
                out.insert(*n, lines.into_values().collect::<String>());
            }
            Ok(Ok(out))
        },
    )
}

/// Rewrites node `n`'s objects as the previous release wrote them and deletes its shards;
/// returns the lines written (`None`: the node has no objects, as it had none then).
fn downgrade(lab: &Lab, n: u8, lines: &BTreeMap<u8, String>) -> Result<Option<String>, Error> {
    let Some(objects) = read_objects(lab, n)? else {
        return Ok(None);
    };
    let Some(ips) = lines.get(&n) else {
        return Ok(None);
    };
    let body = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": index_name(n),
            "namespace": SYSTEM_NAMESPACE,
            "labels": {LABEL_ASSIGNMENTS: "true"},
        },
        "data": {
            IPS_KEY: ips,
            NODE_MACS_KEY: objects.node_macs.clone().unwrap_or_default(),
        },
    });
    let field_manager = format!("--field-manager={FIELD_MANAGER}");
    run_with_input(
        Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(lab.admin_kubeconfig())
            .args([
                "apply",
                "--server-side",
                "--force-conflicts",
                &field_manager,
                "-f",
                "-",
            ]),
        Some(&body.to_string()),
    )?;
    // The index first, then the shards: a reader never finds the index counting a shard
    // that is gone.
    for name in objects.shard_names.keys() {
        lab.kubectl(&["delete", "configmap", "-n", SYSTEM_NAMESPACE, name])?;
    }
    let now = legacy_state(lab, n)?;
    let keys: BTreeSet<String> = [IPS_KEY, NODE_MACS_KEY].map(str::to_owned).into();
    let labels = BTreeMap::from([(LABEL_ASSIGNMENTS.to_owned(), "true".to_owned())]);
    if now.keys != keys || now.labels != labels || &now.ips != ips || !now.shard_names.is_empty() {
        return Err(Error::Output {
            cmd: format!("kubectl apply --server-side of {}", index_name(n)),
            why: format!(
                "not the previous release's object (keys {keys:?}, labels {labels:?}, no shard): {now:?}"
            ),
        });
    }
    eprintln!(
        "[upgrade] phase 3: {} in the previous format (keys {:?}, labels {:?}, {} shards deleted): {:?}",
        index_name(n),
        now.keys,
        now.labels,
        objects.shard_names.len(),
        now.ips
    );
    Ok(Some(ips.clone()))
}

/// The `acquireTime` and the held IPs of node `n`'s agent Lease.
fn agent_lease(lab: &Lab, n: u8) -> Result<(String, BTreeSet<IpAddr>), Error> {
    let lease = lab.get_json(&[
        "lease",
        "-n",
        AGENT_NAMESPACE,
        &format!("aliaslb-agent-{}", node_name(n)),
    ])?;
    let acquired = lease["spec"]["acquireTime"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let report: Value = lease["metadata"]["annotations"]["aliaslb.io/report"]
        .as_str()
        .and_then(|r| serde_json::from_str(r).ok())
        .unwrap_or_default();
    let held = report["held"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|ip| ip.as_str()?.parse().ok())
        .collect();
    Ok((acquired, held))
}

/// SIGKILL of node `n`'s agent and a new one started: it must write its Lease (a new
/// `acquireTime`) reporting every IP of `ips` held, and the aliases must still be on the
/// node once the killed agent's last lifetimes have run out.
fn restart_agent(lab: &Lab, n: u8, ips: &BTreeSet<Ipv4Addr>) -> Result<String, Error> {
    let (acquired, _) = agent_lease(lab, n)?;
    let t0 = Instant::now();
    lab.kill(&format!("agent-{n}"))?;
    lab.start_agent(n)?;
    let want: BTreeSet<IpAddr> = ips.iter().map(|ip| IpAddr::V4(*ip)).collect();
    let renewed = wait_for(
        &format!("agent-{n} to renew its Lease holding {want:?}"),
        Duration::from_secs(20),
        || {
            let (now, held) = agent_lease(lab, n)?;
            Ok(if now != acquired && want.is_subset(&held) {
                Ok(t0.elapsed())
            } else {
                Err(format!("acquireTime {now}, held {held:?}"))
            })
        },
    )?;
    // Past the lifetime of the aliases the killed agent refreshed last.
    std::thread::sleep((ALIAS_LIFETIME + Duration::from_secs(1)).saturating_sub(t0.elapsed()));
    let held = aliases(n)?;
    if !ips.is_subset(&held) {
        return Err(Error::Output {
            cmd: format!("ip -n {} addr", node_name(n)),
            why: format!(
                "{:.1} s after the restart the node holds {held:?}, not all of {ips:?}",
                t0.elapsed().as_secs_f64()
            ),
        });
    }
    Ok(format!(
        "agent-{n} SIGKILLed and started: Lease renewed holding {} IPs after {:.2} s; aliases {held:?} still there after {:.1} s",
        want.len(),
        renewed.as_secs_f64(),
        t0.elapsed().as_secs_f64()
    ))
}

/// Figures to print and problems found.
type Verdict = (Vec<String>, Vec<String>);

/// The LAN verdicts: each IP of `holders` (IP -> node, judged from, to) answered by its
/// node's MAC only, in no round by two MACs, never unanswered longer than
/// [`MAX_UNANSWERED`]; no unjudged stall of the sampler.
fn lan_verdicts(
    record: &LanRecord,
    holders: &BTreeMap<Ipv4Addr, (u8, Instant, Instant)>,
    macs: &BTreeMap<u8, Mac>,
    names: &BTreeMap<Mac, String>,
    t0: Instant,
) -> Verdict {
    let (mut figures, mut problems) = (Vec::new(), Vec::new());
    let secs = |at: Instant| at.saturating_duration_since(t0).as_secs_f64();
    let mut worst = Duration::ZERO;
    for (ip, (node, from, to)) in holders {
        let window = record.since(*from);
        let window = LanRecord {
            samples: window.samples.into_iter().filter(|s| s.at < *to).collect(),
            announcements: window
                .announcements
                .into_iter()
                .filter(|a| a.at < *to)
                .collect(),
            requests: Vec::new(),
        };
        let s = window.silence(*ip, *from, *to);
        let doubles = window.doubles(*ip);
        let seen = window.macs_for(*ip);
        worst = worst.max(s.longest);
        figures.push(format!(
            "LAN {ip} ({}): {} rounds, {} unanswered, longest unanswered {} ms{}, {doubles} rounds with two MACs, MACs seen: {}",
            node_name(*node),
            s.rounds,
            s.silent,
            s.longest.as_millis(),
            s.longest_at
                .map(|at| format!(" at {:.3} s", secs(at)))
                .unwrap_or_default(),
            name_macs(&seen, names)
        ));
        if s.rounds == 0 {
            problems.push(format!("{ip}: the LAN sampler never asked for it"));
        }
        if s.longest > MAX_UNANSWERED {
            problems.push(format!(
                "{ip} went unanswered on the LAN for {} ms from {:.3} s (bound {} ms)",
                s.longest.as_millis(),
                s.longest_at.map_or(0.0, secs),
                MAX_UNANSWERED.as_millis()
            ));
        }
        if doubles > 0 {
            problems.push(format!("{ip} was answered by two MACs in {doubles} rounds"));
        }
        let holder = BTreeSet::from([macs[node]]);
        if !seen.is_subset(&holder) {
            problems.push(format!(
                "{ip} was answered or announced by {}, not only by {}",
                name_macs(&seen, names),
                node_name(*node)
            ));
        }
    }
    let judged = record.since(t0);
    let (stalls, doubles): (Vec<LanViolation>, Vec<LanViolation>) = judged
        .violations()
        .into_iter()
        .partition(|v| matches!(v, LanViolation::Stall { .. }));
    figures.push(format!(
        "LAN: {} rounds of {} ms from phase 3 on, {} announcements, longest time between rounds {} ms ({} stalls past the yield bound, {} of them with an announcement or a change inside: left to the agents' logs); longest unanswered stretch of any IP {} ms (bound {} ms)",
        judged.samples.len(),
        LAN_PERIOD.as_millis(),
        judged.announcements.len(),
        judged.max_gap().as_millis(),
        judged.stalls(),
        stalls.len(),
        worst.as_millis(),
        MAX_UNANSWERED.as_millis()
    ));
    figures.extend(
        stalls
            .iter()
            .map(|v| format!("LAN: {}", v.describe(t0, names))),
    );
    // Already counted per IP, without the yield bound's excuse; listed for the times.
    problems.extend(
        doubles
            .iter()
            .take(5)
            .map(|v| format!("LAN: {}", v.describe(t0, names))),
    );
    (figures, problems)
}

/// The alias verdicts: no IP on two nodes in any sample, and each IP of `holders` on its
/// node in every sample of its window.
fn alias_verdicts(
    samples: &Samples,
    holders: &BTreeMap<Ipv4Addr, (u8, Instant, Instant)>,
) -> Verdict {
    let mut problems = Vec::new();
    let doubles = samples.doubles();
    let mut missing: BTreeMap<Ipv4Addr, usize> = BTreeMap::new();
    for s in &samples.0 {
        for (ip, (node, from, to)) in holders {
            if s.at >= *from && s.at < *to && s.holders(*ip) != BTreeSet::from([*node]) {
                *missing.entry(*ip).or_default() += 1;
            }
        }
    }
    let figures = vec![format!(
        "aliases: {} samples of the three nodes, longest time between samples {} ms; {} (sample, IP) on two nodes; samples with an IP off its node: {missing:?}",
        samples.len(),
        samples.max_gap().as_millis(),
        doubles.len()
    )];
    if samples.is_empty() {
        problems.push("the alias sampler took no sample".to_owned());
    }
    if let Some(d) = doubles.first() {
        problems.push(format!(
            "an IP was on two nodes in {} samples, first: {} on {:?}",
            doubles.len(),
            d.ip,
            d.nodes
        ));
    }
    for (ip, count) in missing {
        problems.push(format!(
            "{ip} was not on its node alone in {count} alias samples"
        ));
    }
    (figures, problems)
}

#[cfg(test)]
mod verdicts {
    use super::*;
    use aliaslb_e2e::lan::LanSample;

    const IP: Ipv4Addr = Ipv4Addr::new(192, 168, 55, 30);
    const HOLDER: Mac = Mac([2, 0, 0, 0, 0, 1]);

    /// Rounds one period apart; `answered[i]`: the holder answered round `i`.
    fn record(t0: Instant, answered: &[bool]) -> LanRecord {
        LanRecord {
            samples: answered
                .iter()
                .enumerate()
                .map(|(i, a)| LanSample {
                    at: t0 + LAN_PERIOD * i as u32,
                    answers: [(IP, if *a { [HOLDER].into() } else { BTreeSet::new() })].into(),
                })
                .collect(),
            announcements: Vec::new(),
            requests: Vec::new(),
        }
    }

    #[test]
    fn one_lost_round_passes_and_a_dropped_alias_fails() {
        let t0 = Instant::now();
        let end = t0 + Duration::from_secs(10);
        // A lost frame: one silent round.
        let s = record(t0, &[true, true, false, true, true]).silence(IP, t0, end);
        assert_eq!((s.rounds, s.silent), (5, 1));
        assert_eq!(s.longest, LAN_PERIOD * 2);
        assert!(s.longest <= MAX_UNANSWERED);
        // An agent that drops the alias and takes it back half a second later.
        let mut rounds = vec![true; 5];
        rounds.extend([false; 25]);
        rounds.extend([true; 5]);
        let s = record(t0, &rounds).silence(IP, t0, end);
        assert_eq!(s.longest, LAN_PERIOD * 26);
        assert_eq!(s.longest_at, Some(t0 + LAN_PERIOD * 4));
        assert!(s.longest > MAX_UNANSWERED);
        // One that drops it for good: the stretch runs to the window's last round.
        let s = record(t0, &[true, true, false, false, false]).silence(IP, t0, end);
        assert_eq!(s.longest, LAN_PERIOD * 3);
        // Unanswered from the window's start.
        let s = record(t0, &[false, false, false, true]).silence(IP, t0, end);
        assert_eq!(s.longest, LAN_PERIOD * 3);
        // The window's bounds hold.
        let s = record(t0, &rounds).silence(IP, t0 + LAN_PERIOD * 30, end);
        assert_eq!((s.rounds, s.silent), (5, 0));
    }

    #[test]
    fn only_the_deleted_and_the_new_services_aliases_may_change_in_the_logs() {
        let t0 = Instant::now();
        let other = Ipv4Addr::new(192, 168, 55, 31);
        let extra = Ipv4Addr::new(192, 168, 55, 35);
        let holders = BTreeMap::from([
            (IP, (1, t0, t0)),
            (other, (2, t0, t0)),
            (extra, (2, t0, t0)),
        ]);
        let line = |verb: &str, ip: Ipv4Addr, changed: bool| {
            format!(
                "2026-01-01T00:00:00Z  INFO reconcile{{desired=1}}: aliaslb_agent::aliases: {verb} alias={ip}/32 dev eth0 changed={changed}\n"
            )
        };
        let clean = BTreeMap::from([
            (1, line("adopted", IP, false) + &line("removed", IP, true)),
            (
                2,
                line("adopted", other, false)
                    + &line("added", extra, true)
                    + &line("added", other, false),
            ),
        ]);
        let (_, problems) = log_verdicts(&clean, &holders, (IP, 1), (extra, 2));
        assert!(problems.is_empty(), "{problems:?}");
        // An agent that dropped an alias and added it back.
        let mut flapped = clean.clone();
        flapped.insert(
            2,
            line("removed", other, true) + &line("added", other, true),
        );
        let (_, problems) = log_verdicts(&flapped, &holders, (IP, 1), (extra, 2));
        assert_eq!(problems.len(), 1, "{problems:?}");
        // The new IP added on another node too.
        let mut twice = clean.clone();
        twice
            .get_mut(&1)
            .unwrap()
            .push_str(&line("added", extra, true));
        let (_, problems) = log_verdicts(&twice, &holders, (IP, 1), (extra, 2));
        assert_eq!(problems.len(), 1, "{problems:?}");
    }

    #[test]
    fn a_second_mac_or_a_dropped_alias_is_a_problem() {
        let t0 = Instant::now();
        let end = t0 + Duration::from_secs(10);
        let holders = BTreeMap::from([(IP, (1, t0, end))]);
        let macs = BTreeMap::from([(1, HOLDER)]);
        let names = BTreeMap::new();
        let clean = record(t0, &[true; 10]);
        let (_, problems) = lan_verdicts(&clean, &holders, &macs, &names, t0);
        assert!(problems.is_empty(), "{problems:?}");
        let mut double = clean.clone();
        double.samples[4]
            .answers
            .insert(IP, [HOLDER, Mac([2, 0, 0, 0, 0, 2])].into());
        let (_, problems) = lan_verdicts(&double, &holders, &macs, &names, t0);
        assert!(
            problems.iter().any(|p| p.contains("two MACs")),
            "{problems:?}"
        );
        let mut rounds = vec![true; 3];
        rounds.extend([false; 10]);
        let dropped = record(t0, &rounds);
        let (_, problems) = lan_verdicts(&dropped, &holders, &macs, &names, t0);
        assert!(
            problems.iter().any(|p| p.contains("unanswered")),
            "{problems:?}"
        );
    }
}
