//! [`BgpLab`]: the BGP part of the lab (`scripts/lab bgp-up`) for the L3-mode tests, brought
//! up over a running [`Lab`] and removed when the guard drops: an FRR router `alb-router` on
//! the LAN (AS 64500) doing ECMP over the nodes, a client `alb-bgpclient` behind it, and a
//! routing daemon on every node ([`NodeDaemon`]: BIRD 2 or FRR, AS 64501) exporting the host
//! routes of the addresses on `lo` / `aliaslb0` inside the pools [`POOL4`] and [`POOL6`].
//!
//! What the tests observe: the router's next hops for a prefix (its kernel table, `ip -j
//! route`), the sessions on the router (`vtysh`), and which node forwarded each of many
//! connections from the client ([`Spread`]). Does I/O (`scripts/lab`, `ip`, `vtysh`, sockets
//! in the client's namespace), except the parsers ([`parse_next_hops`], [`parse_sessions`],
//! [`forwarding_node`]).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::Error;
use crate::client::{self, Answer};
use crate::lab::{Lab, NODES, node_ip, run};

/// The upstream router's namespace.
pub const ROUTER_NS: &str = "alb-router";
/// The router's LAN address (IPv4).
pub const ROUTER_IP: Ipv4Addr = Ipv4Addr::new(192, 168, 55, 1);
/// The router's LAN address (IPv6).
pub const ROUTER_IP6: Ipv6Addr = Ipv6Addr::new(0xfd55, 0, 0, 0, 0, 0, 0, 1);
/// The namespace of the client behind the router.
pub const BGP_CLIENT_NS: &str = "alb-bgpclient";
/// The BGP client's address (IPv4; its subnet 10.99.0.0/24 is behind the router).
pub const BGP_CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 99, 0, 2);
/// The BGP client's address (IPv6; fd99::/64 behind the router).
pub const BGP_CLIENT_IP6: Ipv6Addr = Ipv6Addr::new(0xfd99, 0, 0, 0, 0, 0, 0, 2);
/// The IPv4 pool whose host routes the nodes export (`BGP_POOL4` in `scripts/lab`).
pub const POOL4: &str = "10.200.0.0/24";
/// The IPv6 pool whose host routes the nodes export (`BGP_POOL6` in `scripts/lab`).
pub const POOL6: &str = "fd00:200::/64";
/// How long [`BgpLab::up`] waits for every session to be Established on the router. The
/// daemons retry every second (`connect retry time 1`, `timers connect 1`); seconds are the
/// norm, the rest is room for a loaded machine.
pub const ESTABLISH_TIMEOUT: Duration = Duration::from_secs(30);
/// Connect timeout of one connection of [`BgpLab::client_spread`]: routed through the
/// router, so a little more than the LAN client's.
pub const SPREAD_CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
/// Poll period of [`BgpLab::wait_next_hops`]: its result is a measured convergence time.
const POLL: Duration = Duration::from_millis(20);

pub use crate::lab::node_ip6;

/// The routing daemon on the nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeDaemon {
    /// BIRD 2 (the reference), control socket `$LAB/bird/node-N/bird.ctl`.
    Bird,
    /// FRR (zebra, bgpd, bfdd), vty sockets in `$LAB/frr/node-N`.
    Frr,
}

impl NodeDaemon {
    /// The argument of `scripts/lab bgp-up`.
    pub fn name(self) -> &'static str {
        match self {
            NodeDaemon::Bird => "bird",
            NodeDaemon::Frr => "frr",
        }
    }

    /// The value of the agent's `--routing-daemon=` flag on node `n` of the lab whose state
    /// directory is `state`. The one place that knows the flag's syntax:
    /// `bird:<control socket>` or `frr:<vtysh>:<vty socket directory>`.
    pub fn routing_flag(self, state: &Path, n: u8) -> String {
        match self {
            NodeDaemon::Bird => format!("bird:{}", bird_socket(state, n).display()),
            NodeDaemon::Frr => format!("frr:/usr/bin/vtysh:{}", frr_dir(state, n).display()),
        }
    }
}

/// BIRD's control socket on node `n`.
pub fn bird_socket(state: &Path, n: u8) -> PathBuf {
    state.join(format!("bird/node-{n}/bird.ctl"))
}

/// The directory of FRR's vty sockets on node `n` (`vtysh --vty_socket`).
pub fn frr_dir(state: &Path, n: u8) -> PathBuf {
    state.join(format!("frr/node-{n}"))
}

/// Where the connections of [`BgpLab::client_spread`] went.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Spread {
    /// Answered connections per forwarding node.
    pub by_node: BTreeMap<u8, usize>,
    /// Answered, but the source the pod saw names no node (see [`forwarding_node`]).
    pub unattributed: Vec<Answer>,
    /// Connections that got no answer.
    pub failed: usize,
    /// The last failure, to explain it.
    pub last_failure: Option<String>,
}

impl Spread {
    /// The nodes that forwarded at least one connection.
    pub fn nodes(&self) -> BTreeSet<u8> {
        self.by_node.keys().copied().collect()
    }
}

/// The node that forwarded a connection from the BGP client, told from the source address
/// the pod saw: kube-proxy (externalTrafficPolicy Cluster) masquerades to the node's `cni0`
/// address 10.244.N.1 when the pod is on it, else to its LAN address; with Local the client's
/// own address arrives and the pod is on the forwarding node. No I/O.
pub fn forwarding_node(answer: &Answer) -> Option<u8> {
    NODES.into_iter().find(|&n| {
        answer.client == IpAddr::V4(node_ip(n))
            || answer.client == IpAddr::V4(Ipv4Addr::new(10, 244, n, 1))
            || (answer.client == IpAddr::V4(BGP_CLIENT_IP) && answer.pod_node() == Some(n))
    })
}

/// The node whose LAN address (IPv4 or IPv6) is `hop`.
pub fn next_hop_node(hop: IpAddr) -> Option<u8> {
    NODES
        .into_iter()
        .find(|&n| hop == IpAddr::V4(node_ip(n)) || hop == IpAddr::V6(node_ip6(n)))
}

/// The next hops of the routes in `ip -j route show PREFIX` output: a single-path route has
/// `gateway`, a multipath route a `nexthops` array; no route is `[]` (or nothing). Sorted.
/// No I/O.
pub fn parse_next_hops(json: &str) -> Result<Vec<IpAddr>, String> {
    if json.trim().is_empty() {
        return Ok(Vec::new());
    }
    let routes: Value =
        serde_json::from_str(json).map_err(|e| format!("not JSON ({e}): {json:?}"))?;
    let routes = routes
        .as_array()
        .ok_or_else(|| format!("not a JSON array: {json:?}"))?;
    let gateway = |v: &Value| -> Result<Option<IpAddr>, String> {
        v.get("gateway")
            .map(|g| {
                g.as_str()
                    .and_then(|g| g.parse().ok())
                    .ok_or_else(|| format!("bad gateway {g} in {json:?}"))
            })
            .transpose()
    };
    let mut hops = Vec::new();
    for route in routes {
        match route.get("nexthops").and_then(Value::as_array) {
            Some(nexthops) => {
                for nh in nexthops {
                    hops.extend(gateway(nh)?);
                }
            }
            None => hops.extend(gateway(route)?),
        }
    }
    hops.sort();
    Ok(hops)
}

/// The state of every neighbor in `vtysh -c 'show bgp summary json'` output, by address
/// family (`ipv4Unicast`, `ipv6Unicast`) and peer address: `Established`, `Idle`, `Active`,
/// ... No I/O.
pub fn parse_sessions(json: &str) -> Result<BTreeMap<(String, String), String>, String> {
    let summary: Value =
        serde_json::from_str(json).map_err(|e| format!("not JSON ({e}): {json:?}"))?;
    let families = summary
        .as_object()
        .ok_or_else(|| format!("not a JSON object: {json:?}"))?;
    let mut sessions = BTreeMap::new();
    for (family, table) in families {
        let Some(peers) = table.get("peers").and_then(Value::as_object) else {
            continue;
        };
        for (peer, v) in peers {
            let state = v["state"]
                .as_str()
                .ok_or_else(|| format!("no state for {family} peer {peer} in {json:?}"))?;
            sessions.insert((family.clone(), peer.clone()), state.to_owned());
        }
    }
    Ok(sessions)
}

/// The BGP lab over `lab` (see the module docs). Dropping it runs `scripts/lab bgp-down`
/// (unless `ALIASLB_E2E_KEEP=1`, as for [`Lab`]).
#[derive(Debug)]
pub struct BgpLab<'a> {
    lab: &'a Lab,
    daemon: NodeDaemon,
}

impl<'a> BgpLab<'a> {
    /// Runs `scripts/lab bgp-up DAEMON` and waits until the router has every node session
    /// (one per node and address family) Established.
    pub fn up(lab: &'a Lab, daemon: NodeDaemon) -> Result<BgpLab<'a>, Error> {
        let t0 = Instant::now();
        // The guard first: a failing bgp-up is still torn down.
        let bgp = BgpLab { lab, daemon };
        lab.lab(&["bgp-up", daemon.name()])?;
        bgp.wait_established(ESTABLISH_TIMEOUT)?;
        println!(
            "[e2e] BGP lab up ({} on the nodes, {} sessions Established) in {:.1} s",
            daemon.name(),
            2 * NODES.len(),
            t0.elapsed().as_secs_f64()
        );
        Ok(bgp)
    }

    /// The routing daemon on the nodes.
    pub fn daemon(&self) -> NodeDaemon {
        self.daemon
    }

    /// The agent's `--routing-daemon=` value on node `n` ([`NodeDaemon::routing_flag`]).
    pub fn routing_flag(&self, n: u8) -> String {
        self.daemon.routing_flag(self.lab.state_dir(), n)
    }

    /// The router's sessions by (address family, peer) with their state.
    pub fn router_sessions(&self) -> Result<BTreeMap<(String, String), String>, Error> {
        let dir = self.lab.state_dir().join("frr-router");
        let dir = dir.to_string_lossy();
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", ROUTER_NS, "vtysh", "--vty_socket", &dir])
            .args(["--config_dir", &dir, "-c", "show bgp summary json"]);
        let out = run(&mut cmd)?;
        parse_sessions(&out).map_err(|why| Error::Output {
            cmd: "vtysh -c 'show bgp summary json' in alb-router".to_owned(),
            why,
        })
    }

    /// Waits until the router has all `2 * NODES` sessions Established.
    pub fn wait_established(&self, timeout: Duration) -> Result<(), Error> {
        crate::lab::wait_for(
            "every node session Established on alb-router",
            timeout,
            || {
                let sessions = self.router_sessions()?;
                let up = sessions.values().filter(|s| *s == "Established").count();
                Ok(if up == 2 * NODES.len() {
                    Ok(())
                } else {
                    Err(format!("{sessions:?}"))
                })
            },
        )
    }

    /// The router's next hops for `prefix` (e.g. `10.200.0.7` or `fd00:200::7/128`), from its
    /// kernel table; empty when it has no route.
    pub fn router_next_hops(&self, prefix: &str) -> Result<Vec<IpAddr>, Error> {
        // `ip route show` does not tell the family from the prefix: IPv4 unless told.
        let family = if prefix.contains(':') { "-6" } else { "-4" };
        let out =
            run(Command::new("ip").args(["-n", ROUTER_NS, "-j", family, "route", "show", prefix]))?;
        parse_next_hops(&out).map_err(|why| Error::Output {
            cmd: format!("ip -n {ROUTER_NS} -j {family} route show {prefix}"),
            why,
        })
    }

    /// Waits until the router's next hops for `prefix` are exactly the nodes `expected`
    /// (empty: no route); how long that took, measured with [`POLL`] resolution.
    pub fn wait_next_hops(
        &self,
        prefix: &str,
        expected: &BTreeSet<u8>,
        timeout: Duration,
    ) -> Result<Duration, Error> {
        let start = Instant::now();
        loop {
            let hops = self.router_next_hops(prefix)?;
            let nodes: Option<BTreeSet<u8>> = hops.iter().map(|h| next_hop_node(*h)).collect();
            if nodes.as_ref() == Some(expected) && hops.len() == expected.len() {
                return Ok(start.elapsed());
            }
            if start.elapsed() >= timeout {
                return Err(Error::Timeout {
                    what: format!(
                        "next hops {expected:?} (node numbers) for {prefix} on {ROUTER_NS}"
                    ),
                    waited: timeout,
                    last: format!("next hops {hops:?}"),
                });
            }
            std::thread::sleep(POLL);
        }
    }

    /// Stops node `n`'s routing daemon (its sessions close; the router withdraws its routes).
    pub fn stop_daemon(&self, n: u8) -> Result<(), Error> {
        self.lab
            .lab(&["bgp-node", "stop", &n.to_string()])
            .map(drop)
    }

    /// Starts node `n`'s routing daemon again, configured as by `bgp-up`.
    pub fn start_daemon(&self, n: u8) -> Result<(), Error> {
        self.lab
            .lab(&["bgp-node", "start", &n.to_string()])
            .map(drop)
    }

    /// Takes node `n`'s `eth0` administratively down (`ip link set eth0 down` in its
    /// namespace): BGP notices through BFD.
    pub fn link_down(&self, n: u8) -> Result<(), Error> {
        self.lab
            .lab(&["bgp-link", "down", &n.to_string()])
            .map(drop)
    }

    /// Brings node `n`'s `eth0` up again, with the routes and the IPv6 address the kernel
    /// dropped when it went down.
    pub fn link_up(&self, n: u8) -> Result<(), Error> {
        self.lab.lab(&["bgp-link", "up", &n.to_string()]).map(drop)
    }

    /// `connections` HTTP requests to `vip:port` from the BGP client, each on its own TCP
    /// connection: what each got.
    pub fn client_answers(
        &self,
        vip: IpAddr,
        port: u16,
        connections: usize,
    ) -> Result<Vec<Result<Answer, String>>, Error> {
        let addr = SocketAddr::new(vip, port);
        client::in_namespace(BGP_CLIENT_NS, move || {
            (0..connections)
                .map(|_| client::request_to(addr, SPREAD_CONNECT_TIMEOUT))
                .collect::<Vec<_>>()
        })
    }

    /// `connections` HTTP requests to `vip:port` from the BGP client, each on its own TCP
    /// connection (a new source port, so the router's L4 hash picks a path afresh), counted
    /// by the node that forwarded them ([`forwarding_node`]).
    pub fn client_spread(
        &self,
        vip: IpAddr,
        port: u16,
        connections: usize,
    ) -> Result<Spread, Error> {
        let answers = self.client_answers(vip, port, connections)?;
        let mut spread = Spread::default();
        for answer in answers {
            match answer {
                Ok(a) => match forwarding_node(&a) {
                    Some(n) => *spread.by_node.entry(n).or_default() += 1,
                    None => spread.unattributed.push(a),
                },
                Err(e) => {
                    spread.failed += 1;
                    spread.last_failure = Some(e);
                }
            }
        }
        Ok(spread)
    }
}

impl BgpLab<'_> {
    /// Restarts every agent reading its node's routing daemon (`--routing-daemon`).
    pub fn restart_agents(&self) -> Result<(), Error> {
        for n in NODES {
            self.lab.stop(&format!("agent-{n}"))?;
            self.start_agent(n)?;
        }
        for n in NODES {
            self.lab.wait_agent_lease(n, Duration::from_secs(20))?;
        }
        Ok(())
    }

    /// Starts node `n`'s agent reading its routing daemon.
    pub fn start_agent(&self, n: u8) -> Result<(), Error> {
        let flag = format!("--routing-daemon={}", self.routing_flag(n));
        self.lab.start_agent_with(n, &[&flag])
    }

    /// Waits until a round of 30 connections to `vip` is answered without a failure,
    /// through the nodes `expected` only: kube-proxy rewrites its rules once a Service has
    /// its IP (or its endpoints moved), and a SYN can be lost meanwhile.
    pub fn settled(&self, vip: IpAddr, expected: &BTreeSet<u8>) -> Result<(), Error> {
        crate::lab::wait_for(
            &format!("30 connections to {vip} answered through nodes {expected:?}"),
            Duration::from_secs(15),
            || {
                let round = self.client_spread(vip, 80, 30)?;
                Ok(if round.failed == 0 && round.nodes() == *expected {
                    Ok(())
                } else {
                    Err(format!("{round:?}"))
                })
            },
        )
    }

    /// Runs `work` while the BGP client connects to `vip` in a loop (rounds of 10); the
    /// connections answered and failed meanwhile, and what `work` returned.
    pub fn while_probing<T>(
        &self,
        vip: IpAddr,
        work: impl FnOnce() -> Result<T, Error>,
    ) -> Result<(T, usize, usize), Error> {
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            let prober = s.spawn(|| -> Result<(usize, usize), Error> {
                let (mut ok, mut failed) = (0, 0);
                while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                    let round = self.client_spread(vip, 80, 10)?;
                    ok += round.by_node.values().sum::<usize>();
                    failed += round.failed;
                }
                Ok((ok, failed))
            });
            let result = work();
            stop.store(true, std::sync::atomic::Ordering::SeqCst);
            let counts = prober
                .join()
                .map_err(|_| Error::Environment("the prober thread panicked".to_owned()))?;
            let (ok, failed) = counts?;
            Ok((result?, ok, failed))
        })
    }
}

/// Gives namespace `ns` (created here) the pool `pool` in L3 mode (`announce: bgp`), as a
/// merge patch of the lab's pool ConfigMap (its `config.yaml` is replaced).
pub fn routed_pool(lab: &Lab, ns: &str, pool: &str) -> Result<(), Error> {
    lab.apply(&crate::fixtures::namespace(ns))?;
    let options = format!("pools:\n  {ns}:\n    announce: bgp\n");
    let patch = serde_json::json!({"data": {ns: pool, "config.yaml": options}}).to_string();
    lab.patch_pools(&patch)
}

impl Drop for BgpLab<'_> {
    fn drop(&mut self) {
        if std::env::var("ALIASLB_E2E_KEEP").as_deref() == Ok("1") {
            return;
        }
        match self.lab.lab(&["bgp-down"]) {
            Ok(_) => println!("[e2e] BGP lab down"),
            Err(e) => eprintln!("[e2e] scripts/lab bgp-down failed: {e:?}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `ip -n alb-router -j -4 route show 10.200.0.249` with the address on all three nodes
    /// (FRR 8.4 installs nexthop objects; the kernel still reports the paths).
    const MULTIPATH: &str = r#"[{"dst":"10.200.0.249","nhid":13,"protocol":"bgp","metric":20,"flags":[],"nexthops":[{"gateway":"192.168.55.101","dev":"eth0","weight":1,"flags":[]},{"gateway":"192.168.55.102","dev":"eth0","weight":1,"flags":[]},{"gateway":"192.168.55.103","dev":"eth0","weight":1,"flags":[]}]}]"#;
    /// The same with the address on node 1 only.
    const SINGLE: &str = r#"[{"dst":"10.200.0.249","nhid":14,"gateway":"192.168.55.101","dev":"eth0","protocol":"bgp","metric":20,"flags":[]}]"#;
    /// `ip -n alb-router -j -6 route show fd00:200::fa`, on all three nodes.
    const MULTIPATH6: &str = r#"[{"dst":"fd00:200::fa","nhid":116,"protocol":"bgp","metric":20,"flags":[],"pref":"medium","nexthops":[{"gateway":"fd55::102","dev":"eth0","weight":1,"flags":[]},{"gateway":"fd55::101","dev":"eth0","weight":1,"flags":[]},{"gateway":"fd55::103","dev":"eth0","weight":1,"flags":[]}]}]"#;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("a literal address")
    }

    #[test]
    fn next_hops_of_a_multipath_route() {
        assert_eq!(
            parse_next_hops(MULTIPATH),
            Ok(vec![
                ip("192.168.55.101"),
                ip("192.168.55.102"),
                ip("192.168.55.103")
            ])
        );
        let hops = parse_next_hops(MULTIPATH6).expect("parses");
        assert_eq!(
            hops,
            vec![ip("fd55::101"), ip("fd55::102"), ip("fd55::103")]
        );
        let nodes: Vec<Option<u8>> = hops.into_iter().map(next_hop_node).collect();
        assert_eq!(nodes, vec![Some(1), Some(2), Some(3)]);
    }

    #[test]
    fn next_hops_of_a_single_path_route_and_of_none() {
        assert_eq!(parse_next_hops(SINGLE), Ok(vec![ip("192.168.55.101")]));
        assert_eq!(parse_next_hops("[]\n"), Ok(vec![]));
        assert_eq!(parse_next_hops(""), Ok(vec![]));
        assert!(parse_next_hops("Error: any valid prefix is expected").is_err());
        assert!(parse_next_hops(r#"[{"gateway":"nonsense"}]"#).is_err());
    }

    #[test]
    fn next_hops_name_nodes_only_for_node_addresses() {
        assert_eq!(next_hop_node(ip("192.168.55.103")), Some(3));
        assert_eq!(next_hop_node(ip("fd55::102")), Some(2));
        assert_eq!(next_hop_node(ip("192.168.55.1")), None);
        assert_eq!(next_hop_node(ip("fe80::1")), None);
        assert_eq!(node_ip6(1).to_string(), "fd55::101");
    }

    /// `show bgp summary json` on alb-router (FRR 8.4) with node 3's daemon stopped,
    /// trimmed to the fields of one peer per state.
    const SUMMARY: &str = r#"{
"ipv4Unicast":{
  "routerId":"192.168.55.1",
  "as":64500,
  "peerCount":2,
  "peers":{
    "192.168.55.101":{"hostname":"alb-node-1","remoteAs":64501,"localAs":64500,"version":4,
      "msgRcvd":159,"msgSent":149,"peerUptime":"00:00:34","pfxRcd":0,"pfxSnt":0,
      "state":"Established","peerState":"OK","idType":"ipv4"},
    "192.168.55.103":{"hostname":"alb-node-3","remoteAs":64501,"localAs":64500,"version":4,
      "msgRcvd":156,"msgSent":144,"peerUptime":"00:00:00","pfxRcd":0,"pfxSnt":0,
      "state":"Idle","peerState":"OK","idType":"ipv4"}
  },
  "failedPeers":1,
  "totalPeers":2
},
"ipv6Unicast":{
  "routerId":"192.168.55.1",
  "peers":{
    "fd55::101":{"remoteAs":64501,"state":"Established","peerState":"OK","idType":"ipv6"}
  }
}
}"#;

    #[test]
    fn sessions_from_the_bgp_summary() {
        let sessions = parse_sessions(SUMMARY).expect("parses");
        let key = |f: &str, p: &str| (f.to_owned(), p.to_owned());
        assert_eq!(sessions.len(), 3);
        assert_eq!(
            sessions[&key("ipv4Unicast", "192.168.55.101")],
            "Established"
        );
        assert_eq!(sessions[&key("ipv4Unicast", "192.168.55.103")], "Idle");
        assert_eq!(sessions[&key("ipv6Unicast", "fd55::101")], "Established");
        // bgpd without any neighbor prints `{}`.
        assert_eq!(parse_sessions("{}"), Ok(BTreeMap::new()));
        assert!(parse_sessions("% Unknown command").is_err());
    }

    /// Answers as the lab's pods send them (captured with `curl -si`).
    fn answer(client: &str, pod: &str) -> Answer {
        let text =
            format!("HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n{pod}\nclient={client}\n");
        client::parse_answer(&text).expect("a pod's answer parses")
    }

    #[test]
    fn the_forwarding_node_from_the_source_the_pod_saw() {
        let raw =
            "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\npod-b\nclient=192.168.55.103\n";
        let a = client::parse_answer(raw).expect("parses");
        assert_eq!((a.pod.as_str(), a.client), ("pod-b", ip("192.168.55.103")));
        assert_eq!(forwarding_node(&a), Some(3));
        // Pod on the forwarding node: masqueraded to its cni0 address.
        assert_eq!(forwarding_node(&answer("10.244.1.1", "pod-a")), Some(1));
        assert_eq!(forwarding_node(&answer("10.244.2.1", "pod-b")), Some(2));
        // Pod elsewhere: the node's LAN address.
        assert_eq!(forwarding_node(&answer("192.168.55.102", "pod-a")), Some(2));
        // externalTrafficPolicy Local: the client's own address, the pod's node forwarded.
        assert_eq!(forwarding_node(&answer("10.99.0.2", "pod-b")), Some(2));
        assert_eq!(forwarding_node(&answer("10.99.0.7", "pod-b")), None);
        assert!(client::parse_answer("HTTP/1.0 200 OK\r\n\r\npod-a\n").is_err());
    }

    #[test]
    fn routing_flags_name_the_daemons_sockets() {
        let state = Path::new("/run/aliaslb-lab");
        assert_eq!(
            NodeDaemon::Bird.routing_flag(state, 2),
            "bird:/run/aliaslb-lab/bird/node-2/bird.ctl"
        );
        assert_eq!(
            NodeDaemon::Frr.routing_flag(state, 3),
            "frr:/usr/bin/vtysh:/run/aliaslb-lab/frr/node-3"
        );
    }
}
