//! The host-port shield against the real kernel and the real `nft`, each test in fresh
//! network namespaces (`support::node_and_lan`: the node's `eth1` 10.0.0.2 / fd00:1::2, the
//! LAN peer's `lan0` 10.0.0.1 / fd00:1::1). The production path is what runs: an
//! [`AliasManager`] with `Shield::new(NftBackend::default())`, driven inside the node
//! namespace (so its `nft` children run there), whose reconcile writes the shield before
//! adding an alias and after deleting one. The LAN peer probes with real sockets and
//! `ping`; what the kernel holds is read back with `nft -j`.
//!
//! A dropped TCP probe is told from a refused one by time: the shield drops silently, so
//! `connect` waits out [`SILENCE`], while a closed port on the node's own IP answers at once
//! with a RST. Listeners bind the dual-stack wildcard `[::]:P` (one socket answers both
//! families, like a default sshd). Needs root (see `support::require_root`), `nft` and
//! `ping` (iputils-ping).

mod support;

use std::io::{ErrorKind, Read, Write as _};
use std::net::{IpAddr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use aliaslb_agent::aliases::{AliasConfig, AliasManager};
use aliaslb_agent::desired::DesiredSet;
use aliaslb_agent::kernel::backend::Lifetime;
use aliaslb_agent::kernel::netlink::NetlinkBackend;
use aliaslb_agent::shield::nft::NftBackend;
use aliaslb_agent::shield::{
    Contents, Dropped, OpenPort, Protocol, Shield, ShieldBackend, ShieldError, TableView,
    table_script,
};
use aliaslb_core::report::ShieldState;
use serde_json::Value;
use support::{NetNs, node_and_lan, require_root};

const NODE4: &str = "10.0.0.2";
const NODE6: &str = "fd00:1::2";
const LB4: &str = "10.0.0.50";
const LB6: &str = "fd00:1::50";

/// How long a probe waits for an answer: a dropped packet makes it wait that long.
const SILENCE: Duration = Duration::from_secs(1);
/// A RST comes back well within this on a veth link.
const PROMPT: Duration = Duration::from_millis(500);

type Manager<S = NftBackend> = AliasManager<NetlinkBackend, S>;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn at(host: &str, port: u16) -> SocketAddr {
    SocketAddr::new(ip(host), port)
}

fn tcp(port: u16) -> OpenPort {
    OpenPort {
        protocol: Protocol::Tcp,
        port,
    }
}

fn udp(port: u16) -> OpenPort {
    OpenPort {
        protocol: Protocol::Udp,
        port,
    }
}

/// A desired set holding each IP with the Service ports it opens.
fn desired(entries: &[(&str, &[OpenPort])]) -> DesiredSet {
    let mut d = DesiredSet::new();
    for (addr, ports) in entries {
        d.insert(ip(addr), None);
        d.open(ip(addr), ports.iter().copied());
    }
    d
}

/// A manager guarding its aliases with `backend` (call inside the node namespace).
fn manager_with<S: ShieldBackend>(backend: S) -> Manager<S> {
    AliasManager::new(
        NetlinkBackend::connect().expect("netlink"),
        AliasConfig {
            interface_override: None,
            lifetime: Lifetime::for_lease(Duration::from_secs(30)),
            routed_device: "lo".into(),
        },
    )
    .with_shield(Some(Shield::new(backend)))
}

/// The production shield: `nft` run by `NftBackend::default()`.
fn manager() -> Manager {
    manager_with(NftBackend::default())
}

/// Reconciles `want`, failing the test on any error; then waits until every IPv6 alias
/// added can answer neighbour solicitations (see [`wait_for_solicited_node_group`]).
async fn apply<S: ShieldBackend>(m: &mut Manager<S>, want: &DesiredSet) {
    let r = m.reconcile(want).await;
    assert!(r.errors.is_empty(), "reconcile failed: {:?}", r.errors);
    for alias in &r.added {
        if let IpAddr::V6(v6) = alias.ip {
            wait_for_solicited_node_group(&alias.ifname, v6);
        }
    }
}

/// Waits until `dev` (in the calling thread's namespace) joined the solicited-node group
/// of `addr`. The kernel joins it from its addrconf work queue, under the RTNL lock, a
/// moment after the address is added (later when other tests hold the lock); a neighbour
/// solicitation arriving before is not delivered, and the LAN peer retries only after its
/// 1 s retransmit timer, which would look like a silent drop to a 1 s probe.
fn wait_for_solicited_node_group(dev: &str, addr: Ipv6Addr) {
    let s = addr.segments();
    let group = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 1, 0xff00 | (s[6] & 0xff), s[7]).to_string();
    let start = Instant::now();
    for polls in 1.. {
        let maddr = support::run_cmd("ip", &["-6", "maddr", "show", "dev", dev]);
        if maddr.split_whitespace().any(|w| w == group) {
            if polls > 1 {
                eprintln!(
                    "{dev} joined {group} {:?} after {addr} was added",
                    start.elapsed()
                );
            }
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(2),
            "{dev} did not join {group} (for {addr}) within 2 s:\n{maddr}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

// ---- nft, from any thread -------------------------------------------------------------

/// Runs `nft args...` in the namespace `ns`: stdout, or stderr on failure.
fn nft(ns: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "nft"])
        .args(args)
        .output()
        .expect("cannot run `ip netns exec ... nft` (apt-get install nftables)");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// Runs `nft args...` in `ns`, failing the test on error.
fn nft_ok(ns: &str, args: &[&str]) -> String {
    nft(ns, args).unwrap_or_else(|e| panic!("nft {args:?} in {ns} failed: {e}"))
}

/// Loads `script` with `nft -f -` in `ns`, failing the test on error.
fn nft_load(ns: &str, script: &str) {
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns, "nft", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cannot run nft");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "nft -f - failed: {}\nscript:\n{script}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The elements of set `set` of `inet aliaslb`, sorted, concatenations written
/// `ip . proto . port`; with the raw JSON for failure messages.
fn elements(ns: &str, set: &str) -> (Vec<String>, String) {
    let json = nft_ok(ns, &["-j", "list", "set", "inet", "aliaslb", set]);
    let v: Value = serde_json::from_str(&json).expect("nft -j prints JSON");
    let show = |e: &Value| match e {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let mut out: Vec<String> = v["nftables"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| i.get("set"))
        .flat_map(|s| s["elem"].as_array().cloned().unwrap_or_default())
        .map(|e| match e.get("concat").and_then(Value::as_array) {
            Some(parts) => parts.iter().map(show).collect::<Vec<_>>().join(" . "),
            None => show(&e),
        })
        .collect();
    out.sort();
    (out, json)
}

/// Asserts that set `set` holds exactly `want`.
fn assert_set(ns: &str, set: &str, want: &[&str], when: &str) {
    let (got, json) = elements(ns, set);
    let mut want: Vec<String> = want.iter().map(|s| s.to_string()).collect();
    want.sort();
    assert_eq!(got, want, "{when}: set {set}, nft -j listed:\n{json}");
}

/// `dropped4` and `dropped6` as `nft -j list counters table inet aliaslb` prints them.
fn counters(ns: &str) -> (Dropped, String) {
    let json = nft_ok(ns, &["-j", "list", "counters", "table", "inet", "aliaslb"]);
    let v: Value = serde_json::from_str(&json).expect("nft -j prints JSON");
    let mut d = Dropped::default();
    for c in v["nftables"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| i.get("counter"))
    {
        let packets = c["packets"].as_u64().unwrap_or(0);
        match c["name"].as_str() {
            Some("dropped4") => d.v4 = packets,
            Some("dropped6") => d.v6 = packets,
            _ => {}
        }
    }
    (d, json)
}

/// Whether the table `inet aliaslb` exists in `ns`.
fn shield_table(ns: &str) -> Result<String, String> {
    nft(ns, &["list", "table", "inet", "aliaslb"])
}

// ---- servers on the node, probes from the LAN -----------------------------------------

/// A host service on the node: a TCP listener that greets with `port <P>` and closes, or
/// a UDP echo. Counts what reached it; stops on drop.
struct Server {
    stop: Arc<AtomicBool>,
    hits: Arc<AtomicUsize>,
    thread: Option<JoinHandle<()>>,
}

impl Server {
    /// Listens on `[::]:port` (TCP), in the calling thread's namespace.
    fn tcp(port: u16) -> Server {
        let listener = TcpListener::bind(("::", port)).expect("bind [::]:port");
        listener.set_nonblocking(true).unwrap();
        Self::start(move |stop, hits| {
            while !stop.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((mut s, _)) => {
                        hits.fetch_add(1, Ordering::SeqCst);
                        s.set_nonblocking(false).unwrap();
                        let _ = s.write_all(format!("port {port}\n").as_bytes());
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        })
    }

    /// Echoes datagrams on `[::]:port` (UDP), in the calling thread's namespace.
    fn udp_echo(port: u16) -> Server {
        let socket = UdpSocket::bind(("::", port)).expect("bind [::]:port");
        socket
            .set_read_timeout(Some(Duration::from_millis(20)))
            .unwrap();
        Self::start(move |stop, hits| {
            let mut buf = [0u8; 512];
            while !stop.load(Ordering::SeqCst) {
                if let Ok((n, from)) = socket.recv_from(&mut buf) {
                    hits.fetch_add(1, Ordering::SeqCst);
                    let _ = socket.send_to(&buf[..n], from);
                }
            }
        })
    }

    fn start(serve: impl FnOnce(Arc<AtomicBool>, Arc<AtomicUsize>) + Send + 'static) -> Server {
        let stop = Arc::new(AtomicBool::new(false));
        let hits = Arc::new(AtomicUsize::new(0));
        let (s, h) = (stop.clone(), hits.clone());
        Server {
            stop,
            hits,
            thread: Some(std::thread::spawn(move || serve(s, h))),
        }
    }

    /// Connections accepted / datagrams received so far.
    fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// How a TCP connect from the LAN ended.
#[derive(Debug)]
enum Tcp {
    /// Connected; what the listener said.
    Answered(String),
    /// RST, after this long.
    Refused(Duration),
    /// No answer within [`SILENCE`].
    Silent(Duration),
    /// Anything else (e.g. host unreachable); shown by the failure messages.
    Failed(#[allow(dead_code)] std::io::Error),
}

impl Tcp {
    fn answered(&self, greeting: &str) -> bool {
        matches!(self, Tcp::Answered(g) if g == greeting)
    }
    fn refused_at_once(&self) -> bool {
        matches!(self, Tcp::Refused(t) if *t < PROMPT)
    }
    fn silent(&self) -> bool {
        matches!(self, Tcp::Silent(t) if *t >= SILENCE - Duration::from_millis(100))
    }
}

fn connect(to: SocketAddr) -> Tcp {
    let start = Instant::now();
    match TcpStream::connect_timeout(&to, SILENCE) {
        Ok(mut s) => {
            s.set_read_timeout(Some(SILENCE)).unwrap();
            let mut greeting = String::new();
            let _ = s.read_to_string(&mut greeting);
            Tcp::Answered(greeting)
        }
        Err(e) if e.kind() == ErrorKind::ConnectionRefused => Tcp::Refused(start.elapsed()),
        Err(e) if e.kind() == ErrorKind::TimedOut => Tcp::Silent(start.elapsed()),
        Err(e) => Tcp::Failed(e),
    }
}

/// Sends one datagram from an unconnected socket (so a reply from any source counts) and
/// returns the first reply within [`SILENCE`], with its source.
fn datagram(to: SocketAddr) -> Option<(String, SocketAddr)> {
    let bind = if to.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" };
    let s = UdpSocket::bind(bind).unwrap();
    s.set_read_timeout(Some(SILENCE)).unwrap();
    s.send_to(b"hello", to).unwrap();
    let mut buf = [0u8; 512];
    match s.recv_from(&mut buf) {
        Ok((n, from)) => Some((String::from_utf8_lossy(&buf[..n]).into_owned(), from)),
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => None,
        Err(e) => panic!("udp probe of {to}: {e}"),
    }
}

/// Runs `probe` on every target at once from `lan` (each on its own thread in the LAN
/// namespace), so the silent ones cost one [`SILENCE`] together.
fn probe_all<T: Send + 'static>(
    lan: &NetNs,
    probe: fn(SocketAddr) -> T,
    targets: &[SocketAddr],
) -> Vec<T> {
    let running: Vec<_> = targets
        .iter()
        .map(|&to| lan.spawn(move || probe(to)))
        .collect();
    running
        .into_iter()
        .map(|t| t.join().expect("probe thread panicked"))
        .collect()
}

fn ping(lan: &str, to: &str) -> Result<String, String> {
    let out = Command::new("ip")
        .args(["netns", "exec", lan, "ping", "-c1", "-W1", to])
        .output()
        .expect("cannot run ping (apt-get install iputils-ping)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(text)
    } else {
        Err(text)
    }
}

// ---- the tests --------------------------------------------------------------------------

#[test]
fn host_listeners_answer_on_the_node_ip_and_not_on_the_lb_ip() {
    if !require_root() {
        return;
    }
    let (node, lan) = node_and_lan("shhost");
    let lan = Arc::new(lan);
    node.run(move || async move {
        // Host services: "sshd" on tcp/22, an UDP daemon on udp/5000; tcp/23 is closed.
        let sshd = Server::tcp(22);
        let daemon = Server::udp_echo(5000);
        let mut m = manager();
        apply(&mut m, &desired(&[(LB4, &[tcp(80)]), (LB6, &[tcp(80)])])).await;

        let tcps = probe_all(
            &lan,
            connect,
            &[
                at(NODE4, 22),
                at(LB4, 22),
                at(NODE4, 23),
                at(LB4, 23),
                at(NODE6, 22),
                at(LB6, 22),
                at(NODE6, 23),
                at(LB6, 23),
            ],
        );
        let udps = probe_all(
            &lan,
            datagram,
            &[
                at(NODE4, 5000),
                at(LB4, 5000),
                at(NODE6, 5000),
                at(LB6, 5000),
            ],
        );
        let seen = format!("tcp {tcps:#?}\nudp {udps:#?}");
        for (i, family) in [(0, "IPv4"), (4, "IPv6")] {
            assert!(
                tcps[i].answered("port 22\n"),
                "{family}: the listener does not answer on the node IP\n{seen}"
            );
            assert!(
                tcps[i + 1].silent(),
                "{family}: tcp/22 on the LB IP is not silently dropped\n{seen}"
            );
            assert!(
                tcps[i + 2].refused_at_once(),
                "{family}: a closed port on the node IP is not refused at once\n{seen}"
            );
            assert!(
                tcps[i + 3].silent(),
                "{family}: a closed port on the LB IP answers (a RST?)\n{seen}"
            );
        }
        assert_eq!(
            udps[0].as_ref().map(|r| r.0.as_str()),
            Some("hello"),
            "{seen}"
        );
        assert_eq!(udps[1], None, "IPv4: the UDP daemon answered on the LB IP");
        assert_eq!(
            udps[2].as_ref().map(|r| r.0.as_str()),
            Some("hello"),
            "{seen}"
        );
        assert_eq!(udps[3], None, "IPv6: the UDP daemon answered on the LB IP");
        assert_eq!(sshd.hits(), 2, "only the node-IP connections reached sshd");
        assert_eq!(
            daemon.hits(),
            2,
            "only the node-IP datagrams reached the daemon"
        );

        // Control: without the table the same probes reach the host services on the LB
        // IPs, so it was the shield that kept them out (and the LB IPs are reachable).
        m.remove_shield().await.expect("remove the shield");
        let open = probe_all(&lan, connect, &[at(LB4, 22), at(LB6, 22), at(LB4, 23)]);
        assert!(open[0].answered("port 22\n"), "{open:?}");
        assert!(open[1].answered("port 22\n"), "{open:?}");
        assert!(open[2].refused_at_once(), "{open:?}");
        let echo = probe_all(&lan, datagram, &[at(LB4, 5000), at(LB6, 5000)]);
        assert!(echo.iter().all(Option::is_some), "{echo:?}");
    });
}

#[test]
fn a_service_port_passes_and_a_nodeport_on_the_lb_ip_does_not() {
    if !require_root() {
        return;
    }
    let (node, lan) = node_and_lan("shsvc");
    let lan = Arc::new(lan);
    // Stands in for kube-proxy: the Service port 80 and a NodePort 30080 of the LB IPs
    // DNATed to a "pod" listening on the node IP's 8080. Port 81 is a Service port
    // without DNAT (e.g. `externalTrafficPolicy: Local` with no local endpoint), with a
    // host listener on it.
    nft_load(
        node.name(),
        &format!(
            "table ip testproxy {{
                chain pre {{
                    type nat hook prerouting priority dstnat; policy accept;
                    ip daddr {LB4} tcp dport 80 dnat to {NODE4}:8080
                    ip daddr {LB4} tcp dport 30080 dnat to {NODE4}:8080
                }}
            }}
            table ip6 testproxy {{
                chain pre {{
                    type nat hook prerouting priority dstnat; policy accept;
                    ip6 daddr {LB6} tcp dport 80 dnat to [{NODE6}]:8080
                    ip6 daddr {LB6} tcp dport 30080 dnat to [{NODE6}]:8080
                }}
            }}"
        ),
    );
    node.run(move || async move {
        let pod = Server::tcp(8080);
        let host81 = Server::tcp(81);
        let mut m = manager();
        let ports: &[OpenPort] = &[tcp(80), tcp(81)];
        apply(&mut m, &desired(&[(LB4, ports), (LB6, ports)])).await;

        let seen = probe_all(
            &lan,
            connect,
            &[
                at(LB4, 80),
                at(LB4, 30080),
                at(LB4, 81),
                at(LB6, 80),
                at(LB6, 30080),
                at(LB6, 81),
            ],
        );
        for (i, family) in [(0, "IPv4"), (3, "IPv6")] {
            assert!(
                seen[i].answered("port 8080\n"),
                "{family}: the Service port 80 does not reach its DNAT target: {seen:#?}"
            );
            assert!(
                seen[i + 1].silent(),
                "{family}: the NodePort 30080 answers on the LB IP: {seen:#?}"
            );
            assert!(
                seen[i + 2].silent(),
                "{family}: an open Service port not DNATed reached the host listener \
                 (the input chain should drop it): {seen:#?}"
            );
        }
        assert_eq!(pod.hits(), 2, "only the two Service-port connections");
        assert_eq!(host81.hits(), 0);

        // Control: the stand-in DNAT of 30080 works, and port 81 has a listener, once the
        // shield is gone.
        m.remove_shield().await.expect("remove the shield");
        let open = probe_all(
            &lan,
            connect,
            &[at(LB4, 30080), at(LB6, 30080), at(LB4, 81), at(LB6, 81)],
        );
        assert!(open[0].answered("port 8080\n"), "{open:#?}");
        assert!(open[1].answered("port 8080\n"), "{open:#?}");
        assert!(open[2].answered("port 81\n"), "{open:#?}");
        assert!(open[3].answered("port 81\n"), "{open:#?}");
    });
}

#[test]
fn icmp_echo_to_the_lb_ip_is_answered() {
    if !require_root() {
        return;
    }
    let (node, lan) = node_and_lan("shping");
    let node_name = node.name().to_string();
    node.run(|| async {
        // The kernel keeps aliases (30 s lifetime) and table once the manager is gone.
        apply(&mut manager(), &desired(&[(LB4, &[]), (LB6, &[])])).await;
    });
    let table = shield_table(&node_name).expect("the shield's table");
    assert!(table.contains(LB4) && table.contains(LB6), "{table}");
    for to in [LB4, LB6] {
        if let Err(out) = ping(lan.name(), to) {
            panic!("ping {to} through the shield failed:\n{out}\n{table}");
        }
    }
    // The echo requests were accepted, not counted as drops.
    let (dropped, json) = counters(&node_name);
    assert_eq!(dropped, Dropped::default(), "{json}");
}

#[test]
fn replies_to_what_the_node_sends_from_the_lb_ip_pass() {
    if !require_root() {
        return;
    }
    let (node, lan) = node_and_lan("shreply");
    // A UDP echo on the LAN; the node talks to it from the LB IPs, to a port nobody opened.
    let echo = lan.run_sync(|| Server::udp_echo(7000));
    let ns = node.name().to_string();
    node.run(move || async move {
        apply(&mut manager(), &desired(&[(LB4, &[]), (LB6, &[])])).await;
        for (from, to) in [(LB4, "10.0.0.1"), (LB6, "fd00:1::1")] {
            let s = UdpSocket::bind((ip(from), 0)).unwrap();
            s.set_read_timeout(Some(SILENCE)).unwrap();
            s.send_to(b"from the node", at(to, 7000)).unwrap();
            let mut buf = [0u8; 64];
            let got = s.recv_from(&mut buf);
            assert!(
                matches!(&got, Ok((13, src)) if *src == at(to, 7000)),
                "the reply to {from} was dropped: {got:?}\n{}",
                counters(&ns).1
            );
        }
        let (dropped, json) = counters(&ns);
        assert_eq!(dropped, Dropped::default(), "{json}");
    });
    assert_eq!(echo.hits(), 2);
}

#[test]
fn removing_an_ip_removes_its_elements_and_the_counters_count_the_drops() {
    if !require_root() {
        return;
    }
    let (node, lan) = node_and_lan("shrm");
    let lan = Arc::new(lan);
    let ns = node.name().to_string();
    node.run(move || async move {
        let mut m = manager();
        let other = "10.0.0.51";
        apply(
            &mut m,
            &desired(&[
                (LB4, &[tcp(80), udp(53)]),
                (other, &[tcp(443)]),
                (LB6, &[tcp(80)]),
            ]),
        )
        .await;
        let when = "after the adds";
        assert_set(&ns, "held4", &[LB4, other], when);
        let held4_ports = [
            "10.0.0.50 . tcp . 80",
            "10.0.0.50 . udp . 53",
            "10.0.0.51 . tcp . 443",
        ];
        assert_set(&ns, "ports4", &held4_ports, when);
        assert_set(&ns, "held6", &[LB6], when);
        assert_set(&ns, "ports6", &["fd00:1::50 . tcp . 80"], when);

        // Three datagrams to a port nobody opened, per family: dropped, and counted.
        let sent = 3;
        lan.run_sync(move || {
            for to in [at(LB4, 9), at(LB6, 9)] {
                let s = UdpSocket::bind(if to.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" }).unwrap();
                for _ in 0..sent {
                    s.send_to(b"x", to).unwrap();
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(1);
        let (counted, json) = loop {
            let (d, json) = counters(&ns);
            if (d.v4 >= sent && d.v6 >= sent) || Instant::now() > deadline {
                break (d, json);
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(
            counted.v4 >= sent && counted.v6 >= sent,
            "{sent} dropped datagrams per family not counted:\n{json}"
        );
        let read = m
            .shield()
            .unwrap()
            .dropped()
            .await
            .expect("Shield::dropped");
        assert_eq!(read, counted, "Shield::dropped disagrees with nft:\n{json}");

        // LB4 and LB6 no longer desired: their elements go, the other IP's stay.
        apply(&mut m, &desired(&[(other, &[tcp(443)])])).await;
        let when = "after removing 10.0.0.50 and fd00:1::50";
        assert_set(&ns, "held4", &[other], when);
        assert_set(&ns, "ports4", &["10.0.0.51 . tcp . 443"], when);
        assert_set(&ns, "held6", &[], when);
        assert_set(&ns, "ports6", &[], when);
        let on_eth1: Vec<_> = support::addrs_in(&ns, "eth1")
            .into_iter()
            .map(|a| a.local)
            .collect();
        assert!(
            !on_eth1.iter().any(|a| a == LB4 || a == LB6) && on_eth1.iter().any(|a| a == other),
            "{on_eth1:?}"
        );

        apply(&mut m, &DesiredSet::new()).await;
        for set in ["held4", "ports4", "held6", "ports6"] {
            assert_set(&ns, set, &[], "after removing every IP");
        }
        // Removals are element updates: the table (and its counters) were not replaced.
        let (after, json) = counters(&ns);
        assert!(
            after.v4 >= counted.v4 && after.v6 >= counted.v6,
            "counters reset by the removals (table replaced?): {counted:?} then\n{json}"
        );
    });
}

#[test]
fn other_tables_are_never_touched_and_remove_shield_deletes_only_ours() {
    if !require_root() {
        return;
    }
    let (node, _lan) = node_and_lan("shforeign");
    let ns = node.name().to_string();
    // An operator's firewall, and a table with our name in another family: neither is
    // the agent's. Their rules match no traffic of this test, so counters stay put.
    nft_load(
        &ns,
        r#"table inet testfw {
            comment "stands in for kube-proxy's or an operator's table"
            set blocked4 { type ipv4_addr; flags interval; elements = { 192.0.2.0/24, 198.51.100.7 } }
            set blocked6 { type ipv6_addr; elements = { 2001:db8::1 } }
            counter ssh { }
            chain input {
                type filter hook input priority filter; policy accept;
                ip saddr @blocked4 drop
                ip6 saddr @blocked6 drop
                tcp dport 2222 counter name "ssh" accept
            }
        }
        table ip aliaslb {
            comment "same name, other family"
            set held4 { type ipv4_addr; elements = { 192.0.2.50 } }
            counter dropped4 { }
            chain prerouting {
                type filter hook prerouting priority mangle; policy accept;
                ip daddr @held4 counter name "dropped4" drop
            }
        }"#,
    );
    let snapshot = {
        let ns = ns.clone();
        move || {
            [
                ["-j", "list", "table", "inet", "testfw"],
                ["-j", "list", "table", "ip", "aliaslb"],
            ]
            .map(|args| nft_ok(&ns, &args))
        }
    };
    let before = snapshot();
    let steps = node.run(move || async move {
        let mut steps = Vec::new();
        let mut m = manager();
        apply(&mut m, &desired(&[(LB4, &[tcp(80)]), (LB6, &[tcp(80)])])).await;
        assert!(shield_table(&ns).is_ok());
        steps.push(("adds", snapshot()));
        apply(&mut m, &desired(&[(LB4, &[tcp(80), udp(53)])])).await;
        steps.push(("a port opened, an IP removed", snapshot()));
        apply(&mut m, &DesiredSet::new()).await;
        steps.push(("every IP removed", snapshot()));
        let released = m.release_all().await;
        assert!(released.errors.is_empty(), "{:?}", released.errors);
        m.remove_shield().await.expect("remove_shield");
        steps.push(("remove_shield", snapshot()));
        match shield_table(&ns) {
            Ok(t) => panic!("inet aliaslb still there after remove_shield:\n{t}"),
            Err(e) => assert!(e.contains("No such file or directory"), "{e}"),
        }
        // Removing a table that is gone is not an error (SIGTERM after a manual delete).
        m.remove_shield()
            .await
            .expect("remove_shield without a table");
        steps
    });
    for (when, after) in steps {
        for (b, a) in before.iter().zip(&after) {
            assert_eq!(b, a, "a foreign table changed ({when})");
        }
    }
    // And the text listing, for good measure.
    let text = nft_ok(node.name(), &["list", "ruleset"]);
    assert!(
        text.contains("table inet testfw") && text.contains("table ip aliaslb"),
        "{text}"
    );
    assert!(!text.contains("table inet aliaslb"), "{text}");
}

#[test]
fn the_first_reconcile_replaces_a_stale_table_of_a_previous_agent() {
    if !require_root() {
        return;
    }
    let (node, _lan) = node_and_lan("shstale");
    let ns = node.name().to_string();
    // What a previous agent left: its table (for an IP not desired any more, plus a chain
    // this version does not have).
    let mut stale = Contents::new();
    stale.open(ip("10.0.0.77"), [tcp(22)]);
    stale.open(ip("fd00:1::77"), [udp(53)]);
    nft_load(
        &ns,
        &format!(
            "{}add chain inet aliaslb legacy {{ type filter hook input priority 10; policy accept; }}\n",
            table_script(&stale, false)
        ),
    );
    assert_set(&ns, "held4", &["10.0.0.77"], "the stale table");
    node.run(move || async move {
        let mut m = manager();
        apply(&mut m, &desired(&[(LB4, &[tcp(80)]), (LB6, &[])])).await;
        let when = "after the first reconcile";
        assert_set(&ns, "held4", &[LB4], when);
        assert_set(&ns, "ports4", &["10.0.0.50 . tcp . 80"], when);
        assert_set(&ns, "held6", &[LB6], when);
        assert_set(&ns, "ports6", &[], when);
        let table = shield_table(&ns).unwrap();
        assert!(
            !table.contains("legacy"),
            "the previous agent's chain survived:\n{table}"
        );
        assert!(table.contains("chain input"), "{table}");
    });
}

/// An `NftBackend` that, after every write, notes which of the node's aliases (IPv4, by
/// their `eth1:alb` label) the table does not hold.
struct Watching {
    nft: NftBackend,
    ns: String,
    unshielded: Arc<Mutex<Vec<String>>>,
}

impl ShieldBackend for Watching {
    async fn apply(&self, script: &str) -> Result<(), ShieldError> {
        let result = self.nft.apply(script).await;
        let (held, _) = elements(&self.ns, "held4");
        for a in support::addrs_in(&self.ns, "eth1") {
            if a.label.as_deref() == Some("eth1:alb") && !held.contains(&a.local) {
                self.unshielded.lock().unwrap().push(format!(
                    "{} on the node but not in held4 {held:?} after:\n{script}",
                    a.local
                ));
            }
        }
        result
    }
    async fn check(&self, script: &str) -> Result<(), ShieldError> {
        self.nft.check(script).await
    }
    async fn inspect(&self) -> Result<Option<TableView>, ShieldError> {
        self.nft.inspect().await
    }
    async fn chains(&self) -> Result<Option<std::collections::BTreeSet<String>>, ShieldError> {
        self.nft.chains().await
    }
}

/// A stale alias a previous agent left is deleted by the first reconcile of the next one;
/// until it is gone it must stay shielded (aliases.rs: "the IPs being removed stay
/// shielded until they are gone").
#[test]
fn a_stale_alias_of_a_previous_agent_stays_shielded_until_deleted() {
    if !require_root() {
        return;
    }
    let (node, _lan) = node_and_lan("shgap");
    let ns = node.name().to_string();
    let unshielded = node.run(move || async move {
        let mut previous = manager();
        apply(&mut previous, &desired(&[("10.0.0.77", &[tcp(22)])])).await;
        drop(previous); // crash: alias and table stay
        let unshielded = Arc::new(Mutex::new(Vec::new()));
        let mut m = manager_with(Watching {
            nft: NftBackend::default(),
            ns: ns.clone(),
            unshielded: unshielded.clone(),
        });
        apply(&mut m, &desired(&[(LB4, &[tcp(80)])])).await;
        assert!(
            support::addrs_in(&ns, "eth1")
                .iter()
                .all(|a| a.local != "10.0.0.77")
        );
        unshielded.lock().unwrap().clone()
    });
    assert!(
        unshielded.is_empty(),
        "an alias was on the node without its shield element:\n{}",
        unshielded.join("\n")
    );
}

/// [`Shield::look`] of `m`'s shield, failing the test when `nft` cannot list the table.
async fn look(m: &mut Manager) -> aliaslb_agent::shield::Look {
    m.shield_mut()
        .unwrap()
        .look()
        .await
        .expect("nft lists the table")
}

/// The shield's looks at its own table, against the real `nft`: the table as written reads
/// intact (in both kube-proxy modes: the expected chains and rules match what the kernel
/// lists); deleted or flushed away it reads damaged from its chains alone, missing rules
/// from the whole listing; the shield then reads `failing`; the next reconcile rewrites it
/// whole (elements included) and it is `active` again.
#[test]
fn a_deleted_or_flushed_table_is_seen_damaged_and_the_next_reconcile_rewrites_it() {
    if !require_root() {
        return;
    }
    let (node, _lan) = node_and_lan("shheal");
    let ns = node.name().to_string();
    node.run(move || async move {
        let mut m = manager();
        let want = desired(&[(LB4, &[tcp(80)]), (LB6, &[tcp(80)])]);
        apply(&mut m, &want).await;
        assert!(!look(&mut m).await.damaged, "the table as written");
        let chains = m.shield_mut().unwrap().look_at_chains().await.unwrap();
        assert!(!chains.damaged, "the chains as written");
        assert_eq!(m.shield_state(), ShieldState::Active);
        // (what someone else runs, whether the cheap look at the chains sees it)
        let damage: [(&[&str], bool); 4] = [
            (&["flush", "ruleset"], true),
            (&["flush", "table", "inet", "aliaslb"], false),
            (&["delete", "table", "inet", "aliaslb"], true),
            (&["flush", "chain", "inet", "aliaslb", "guard6"], false),
        ];
        for (how, by_chains) in damage {
            nft_ok(&ns, how);
            let quick = m.shield_mut().unwrap().look_at_chains().await.unwrap();
            assert_eq!(quick.damaged, by_chains, "nft {how:?}, chains looked at");
            if !by_chains {
                let seen = look(&mut m).await;
                assert!(seen.damaged, "nft {how:?} not seen");
            }
            assert_eq!(m.shield_state(), ShieldState::Failing, "nft {how:?}");
            // Seen once: the rewrite is due, not seen again until it is done.
            assert!(!look(&mut m).await.damaged, "nft {how:?} seen twice");
            let r = m.reconcile(&want).await;
            assert!(r.errors.is_empty(), "{:?}", r.errors);
            assert_eq!(m.shield_state(), ShieldState::Active, "nft {how:?}");
            assert!(
                !look(&mut m).await.damaged,
                "after the rewrite of nft {how:?}"
            );
            let when = format!("after nft {how:?} and a reconcile");
            assert_set(&ns, "held4", &[LB4], &when);
            assert_set(&ns, "ports6", &["fd00:1::50 . tcp . 80"], &when);
        }
        assert_eq!(m.shield().unwrap().damaged(), 4);
        // kube-proxy in IPVS mode (its link; a veth here, the kernel has no dummy driver):
        // the table without its input chain reads intact, and the iptables one, loaded by
        // someone else, does not.
        support::run_cmd(
            "ip",
            &[
                "-n",
                &ns,
                "link",
                "add",
                "kube-ipvs0",
                "type",
                "veth",
                "peer",
                "name",
                "ipvsp",
            ],
        );
        apply(&mut m, &want).await;
        assert!(!shield_table(&ns).unwrap().contains("chain input"));
        assert!(!look(&mut m).await.damaged, "the IPVS table as written");
        let chains = m.shield_mut().unwrap().look_at_chains().await.unwrap();
        assert!(!chains.damaged, "the IPVS chains as written");
        nft_load(&ns, &table_script(m.shield().unwrap().contents(), false));
        assert!(
            look(&mut m).await.damaged,
            "an input chain in the IPVS table"
        );
    });
}
