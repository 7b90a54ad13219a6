//! The run loop against a fake kernel and a fake LAN, in paused time: probes gate first
//! claims, a node's claim makes a stale agent yield within the loop iteration that saw it
//! and a fresh one defend once per 10 s, a foreign claim is defended the same while fresh
//! and removes the alias while stale, a claim heard on another link than the alias's is
//! ignored, and a hung kernel stops the Lease renewals.

mod fakes;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aliaslb_agent::aliases::{AliasConfig, AliasManager};
use aliaslb_agent::desired::{DesiredSet, StandbyLine};
use aliaslb_agent::heartbeat::{Authority, KernelRounds, may_renew};
use aliaslb_agent::host::{HostAddress, Link};
use aliaslb_agent::http::Health;
use aliaslb_agent::kernel::backend::{Lifetime, Timed};
use aliaslb_agent::l2::announce::{AnnounceConfig, Announcer};
use aliaslb_agent::l2::failover::standby::MAX_RECHECK;
use aliaslb_agent::l2::failover::wire::Stream;
use aliaslb_agent::l2::failover::{FailoverConfig, FailoverSetup, FastFailover, HolderCheck};
use aliaslb_agent::l2::guard::{GuardConfig, LanGuard, LanGuardSetup};
use aliaslb_agent::l2::lan::{
    BoxFuture, ClaimKind, LanClaim, LanError, LanPort, ProbeConfig, ProbeOutcome, ProbeResults,
};
use aliaslb_agent::l3::Routed;
use aliaslb_agent::metrics::Metrics;
use aliaslb_agent::run::{Agent, Heartbeat, Inputs, Parts};
use aliaslb_core::advert::{Ack, Advert, Message};
use aliaslb_core::assignment::Peer;
use aliaslb_core::mac::Mac;
use aliaslb_core::report::{AgentReport, RoutingReport};
use fakes::{FakeKernel as Fake, Shared as Kernel};
use tokio::sync::{Notify, mpsc, oneshot, watch};
use tokio::time::Instant;

const NODE2: Mac = Mac([0x46, 0xb0, 0x48, 0xe8, 0x2d, 0x96]);
const STRANGER: Mac = Mac([0x02, 0xaa, 0, 0, 0, 1]);
const LEASE: Duration = Duration::from_secs(4);
const RENEW: Duration = Duration::from_secs(1);

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// A probe asked of the fake LAN: interface, our MAC, the IPs, when.
type ProbeCall = (u32, Mac, Vec<IpAddr>, Instant);

/// A LAN where the hosts in `answers` answer probes for their IPs; everything the loop asks
/// of it is recorded.
#[derive(Debug, Default)]
struct FakeLan {
    answers: Arc<Mutex<BTreeMap<IpAddr, Mac>>>,
    probes: Mutex<Vec<ProbeCall>>,
    defences: Mutex<Vec<(u32, Mac, IpAddr, Instant)>>,
    watched: Mutex<Vec<IpAddr>>,
    interfaces: Mutex<Vec<(u32, Mac)>>,
    /// Probes never finish.
    stall: Arc<AtomicBool>,
}

impl LanPort for FakeLan {
    fn set_interfaces(&self, interfaces: &[(u32, Mac)]) {
        *self.interfaces.lock().unwrap() = interfaces.to_vec();
    }

    fn set_watched(&self, ips: &[IpAddr]) {
        *self.watched.lock().unwrap() = ips.to_vec();
    }

    fn probe_many(
        &self,
        ifindex: u32,
        mac: Mac,
        ips: Vec<IpAddr>,
        config: ProbeConfig,
    ) -> BoxFuture<ProbeResults> {
        self.probes
            .lock()
            .unwrap()
            .push((ifindex, mac, ips.clone(), Instant::now()));
        let answers = self.answers.clone();
        let stall = self.stall.load(Ordering::SeqCst);
        Box::pin(async move {
            if stall {
                std::future::pending::<()>().await;
            }
            tokio::time::sleep(config.window()).await;
            let answers = answers.lock().unwrap();
            Ok(ips
                .into_iter()
                .map(|ip| match answers.get(&ip) {
                    Some(mac) => (ip, ProbeOutcome::Taken { mac: *mac }),
                    None => (ip, ProbeOutcome::Free),
                })
                .collect())
        })
    }

    fn defend(&self, ifindex: u32, mac: Mac, ip: IpAddr) -> Result<(), LanError> {
        self.defences
            .lock()
            .unwrap()
            .push((ifindex, mac, ip, Instant::now()));
        Ok(())
    }
}

/// Holders as their Leases show them: those in `alive` renew 1 s after being asked and
/// report holding every IP asked about; the others never prove anything.
#[derive(Debug, Default)]
struct FakeHolders {
    alive: Mutex<Vec<String>>,
    asked: Mutex<Vec<(String, Vec<IpAddr>)>>,
}

impl HolderCheck for FakeHolders {
    fn alive_holding(
        &self,
        holder: &str,
        ips: Vec<IpAddr>,
        within: Duration,
    ) -> BoxFuture<Vec<IpAddr>> {
        self.asked
            .lock()
            .unwrap()
            .push((holder.to_owned(), ips.clone()));
        let alive = self.alive.lock().unwrap().iter().any(|h| h == holder);
        Box::pin(async move {
            if alive {
                tokio::time::sleep(Duration::from_secs(1)).await;
                ips
            } else {
                tokio::time::sleep(within).await;
                Vec::new()
            }
        })
    }
}

/// A running loop and every handle on it.
struct Harness {
    fake: Arc<Fake>,
    lan: Arc<FakeLan>,
    desired_tx: watch::Sender<Option<Arc<DesiredSet>>>,
    observed_tx: mpsc::Sender<LanClaim>,
    report_rx: watch::Receiver<Option<AgentReport>>,
    authority: Authority,
    kernel: KernelRounds,
    metrics: Arc<Metrics>,
    changes_tx: mpsc::Sender<()>,
    routing_tx: watch::Sender<Option<RoutingReport>>,
    heard_tx: mpsc::Sender<Message>,
    streams_rx: watch::Receiver<Vec<Stream>>,
    holders: Arc<FakeHolders>,
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Harness {
    /// alb-node-2 acks this node's adverts once, then falls silent: the step-down.
    async fn stepped_down(&self) {
        self.ack("alb-node-2", 1);
        wait_for("the step-down", Duration::from_secs(1), || {
            self.fake.ours().is_empty()
        })
        .await;
    }

    /// Waits up to `limit` for the node to hold exactly `ips`.
    async fn wait_ours(&self, what: &str, limit: Duration, ips: &[&str]) {
        let want: Vec<IpAddr> = ips.iter().map(|s| ip(s)).collect();
        wait_for(what, limit, || self.fake.ours() == want).await;
    }

    /// From now on `mac` answers the LAN's questions about `s`.
    fn answers(&self, s: &str, mac: Mac) {
        self.lan.answers.lock().unwrap().insert(ip(s), mac);
    }

    /// Asserts that the agent's metrics have `line`.
    fn has_metric(&self, line: &str) {
        let text = self.metrics.encode().unwrap();
        assert!(text.contains(line), "no {line:?} in\n{text}");
    }

    /// A harness whose agent holds `ip` (on eth0), settled.
    async fn holding(ip: &str) -> Harness {
        Harness::wanting(desired(&[ip], &[])).await
    }

    /// A harness whose agent was given `set`, settled.
    async fn wanting(set: DesiredSet) -> Harness {
        let h = Harness::start();
        h.want(set);
        settle().await;
        h
    }

    fn start() -> Harness {
        Harness::start_with(Arc::new(Fake::with_lo()), None)
    }

    /// On `fake`, re-announcing through `announcer`.
    fn start_with(fake: Arc<Fake>, announcer: Option<Announcer>) -> Harness {
        let lan = Arc::new(FakeLan::default());
        let (desired_tx, desired_rx) = watch::channel(None);
        let (observed_tx, observed) = mpsc::channel(64);
        let (report_tx, report_rx) = watch::channel(None);
        let (changes_tx, changes) = mpsc::channel(1);
        let (routing_tx, routing_rx) = watch::channel(None);
        let (heard_tx, heard) = mpsc::channel(64);
        let (streams_tx, streams_rx) = watch::channel(Vec::new());
        let holders = Arc::new(FakeHolders::default());
        let authority = Authority::new(LEASE);
        let kernel = KernelRounds::new();
        let metrics = Arc::new(Metrics::new());
        let aliases = AliasManager::new(
            Timed::new(Kernel(fake.clone()), Duration::from_secs(2)),
            AliasConfig {
                interface_override: None,
                lifetime: Lifetime::for_lease(LEASE),
                routed_device: "lo".into(),
            },
        );
        let mut node = Agent::new(
            aliases,
            Parts {
                lan: LanGuard::new(LanGuardSetup {
                    lan: lan.clone(),
                    claims: observed,
                    guard: GuardConfig::default(),
                    probe: ProbeConfig::default(),
                    recheck: ProbeConfig::quick(),
                    announcer,
                    metrics: metrics.lan.clone(),
                }),
                failover: FastFailover::new(FailoverSetup {
                    node: "alb-node-1".into(),
                    config: FailoverConfig::default(),
                    lan: lan.clone(),
                    heard,
                    streams: Some(streams_tx),
                    trust: None,
                    key: None,
                    holders: Some(holders.clone() as Arc<dyn HolderCheck>),
                    metrics: metrics.failover.clone(),
                }),
                routed: Routed::new(routing_rx, metrics.routing.clone()),
                heartbeat: Heartbeat {
                    report_tx,
                    authority: authority.clone(),
                    kernel: kernel.clone(),
                },
                metrics: metrics.clone(),
            },
        );
        let (stop, stopped) = oneshot::channel::<()>();
        let inputs = Inputs {
            desired_rx,
            changes,
            api_back: Arc::new(Notify::new()),
            health: Health::new(Duration::from_secs(60)),
            refresh_interval: RENEW,
            resync_interval: Duration::from_secs(30),
        };
        // Not `tokio::spawn`: the reconcile's write streams are not `Send` for every
        // lifetime (a compiler limit), so the loop runs on the test's thread.
        let task = tokio::task::spawn_local(async move {
            node.run(inputs, async move {
                let _ = stopped.await;
                "stop"
            })
            .await;
        });
        Harness {
            fake,
            lan,
            desired_tx,
            observed_tx,
            report_rx,
            authority,
            kernel,
            metrics,
            changes_tx,
            routing_tx,
            heard_tx,
            streams_rx,
            holders,
            stop: Some(stop),
            task,
        }
    }

    fn want(&self, d: DesiredSet) {
        self.desired_tx.send_replace(Some(Arc::new(d)));
    }

    fn claim(&self, s: &str, mac: Mac, kind: ClaimKind) {
        self.claim_on(2, s, mac, kind);
    }

    /// A claim heard on link `ifindex` (the aliases are on 2, `eth0`).
    fn claim_on(&self, ifindex: u32, s: &str, mac: Mac, kind: ClaimKind) {
        self.observed_tx
            .try_send(LanClaim {
                ip: ip(s),
                mac,
                ifindex,
                kind,
                at: Instant::now().into_std(),
            })
            .unwrap();
    }

    fn report(&self) -> AgentReport {
        self.report_rx.borrow().clone().unwrap_or_default()
    }

    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.task.await.unwrap();
    }
}

/// `plain` IPs (takeovers) and `probed` ones (first claims); node-2's MAC known.
fn desired(plain: &[&str], probed: &[&str]) -> DesiredSet {
    let mut d: DesiredSet = plain.iter().chain(probed).map(|s| (ip(s), None)).collect();
    for s in probed {
        d.mark_probe(ip(s));
    }
    d.add_node_mac(NODE2, "alb-node-2");
    d
}

/// Polls `cond` every 10 ms of (paused) time, for at most `limit`.
async fn wait_for(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < limit, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Runs `test` on a local task set (the loop is spawned on it).
async fn local<F: std::future::Future>(test: F) -> F::Output {
    tokio::task::LocalSet::new().run_until(test).await
}

/// Lets the loop run its pending work without time passing.
/// A harness over a node with loopback and eth0 (`links[1]`), without announcer.
fn with_eth0() -> (Arc<Fake>, Harness) {
    let fake = Arc::new(Fake::with_lo());
    let h = Harness::start_with(fake.clone(), None);
    (fake, h)
}

async fn settle() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_first_claim_is_added_only_after_its_probe_finds_it_free() {
    local(async {
        let h = Harness::start();
        let sent = Instant::now();
        h.want(desired(&[], &["192.168.1.50"]));
        wait_for("the probe", Duration::from_secs(1), || {
            !h.lan.probes.lock().unwrap().is_empty()
        })
        .await;
        assert!(h.fake.ours().is_empty(), "not added before the probe ends");
        wait_for("the add", Duration::from_secs(2), || {
            !h.fake.ours().is_empty()
        })
        .await;
        assert!(
            sent.elapsed() >= ProbeConfig::default().window(),
            "added after {:?}",
            sent.elapsed()
        );
        let probes = h.lan.probes.lock().unwrap().clone();
        assert_eq!(probes.len(), 1, "{probes:?}");
        assert_eq!(
            (probes[0].0, probes[0].1, probes[0].2.clone()),
            (2, Mac([2, 0, 0, 0, 0, 2]), vec![ip("192.168.1.50")])
        );
        assert_eq!(h.report().held, [ip("192.168.1.50")].into());
        assert_eq!(*h.lan.watched.lock().unwrap(), vec![ip("192.168.1.50")]);
        assert_eq!(
            *h.lan.interfaces.lock().unwrap(),
            vec![(2, Mac([2, 0, 0, 0, 0, 2]))]
        );
        assert_eq!(h.report().macs, vec![Mac([2, 0, 0, 0, 0, 2])]);
        // Held: never probed again.
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(h.lan.probes.lock().unwrap().len(), 1);
        h.has_metric(r#"aliaslb_agent_probes_total{outcome="free"} 1"#);
        h.stop().await;
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_takeover_is_added_at_once_without_a_probe() {
    local(async {
        let h = Harness::holding("192.168.1.50").await;
        assert_eq!(h.fake.ours(), vec![ip("192.168.1.50")]);
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(h.lan.probes.lock().unwrap().is_empty());
        h.stop().await;
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn an_answered_probe_is_never_added_is_reported_and_reprobed_until_free() {
    local(async {
        let h = Harness::start();
        h.answers("192.168.1.50", STRANGER);
        h.want(desired(&["192.168.1.60"], &["192.168.1.50"]));
        wait_for("the conflict", Duration::from_secs(2), || {
            !h.report().conflicts.is_empty()
        })
        .await;
        let report = h.report();
        let c = &report.conflicts[0];
        assert_eq!(c.ip, ip("192.168.1.50"));
        assert_eq!(c.mac, Some(STRANGER));
        assert_eq!(c.interface.as_deref(), Some("eth0"));
        assert_eq!(
            c.reason,
            "answered ARP on eth0 from 02:aa:00:00:00:01 (none of this node's peers)"
        );
        assert_eq!(report.held, [ip("192.168.1.60")].into());
        // Re-probed (after 1 s, then 2 s, 4 s...), never added while answered.
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(h.fake.ours(), vec![ip("192.168.1.60")]);
        let probes = h.lan.probes.lock().unwrap().len();
        assert!((3..=5).contains(&probes), "{probes} probes in ~10 s");
        // The other host goes away: the next re-probe finds it free, and it is added.
        h.lan.answers.lock().unwrap().clear();
        wait_for("the re-take", Duration::from_secs(20), || {
            h.fake.ours().len() == 2
        })
        .await;
        wait_for("the report", Duration::from_secs(1), || {
            h.report().conflicts.is_empty()
        })
        .await;
        h.stop().await;
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_node_claim_while_stale_deletes_the_alias_before_the_next_renewal_tick() {
    local(async {
        let h = Harness::holding("192.168.1.50").await;
        assert_eq!(h.fake.ours(), vec![ip("192.168.1.50")]);
        // No renewal ever succeeded: stale once a lease has passed.
        tokio::time::sleep(LEASE + Duration::from_millis(500)).await;
        assert!(!h.authority.is_fresh(Instant::now()));
        let mark = h.fake.log_len();
        let sent = Instant::now();
        h.claim("192.168.1.50", NODE2, ClaimKind::Uses);
        wait_for("the delete", Duration::from_secs(1), || h.fake.ours().is_empty()).await;
        let log = h.fake.log_since(mark);
        let delete = log
            .iter()
            .position(|(op, _, _)| *op == "delete")
            .expect("a delete");
        assert!(
            log[..delete].iter().all(|(op, _, _)| *op != "refresh"),
            "a refresh came first: {log:?}"
        );
        assert_eq!(log[delete].2, sent, "deleted in the same instant: {log:?}");
        let report = h.report();
        assert!(report.held.is_empty());
        assert_eq!(report.conflicts.len(), 1);
        assert_eq!(
            report.conflicts[0].reason,
            "claimed on eth0 by node alb-node-2 (46:b0:48:e8:2d:96) while this agent's Lease was stale: yielded"
        );
        // Stays yielded (nothing added, nothing refreshed) while stale, even with a new set.
        h.want(desired(&["192.168.1.50", "192.168.1.51"], &[]));
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(h.fake.ours(), vec![ip("192.168.1.51")]);
        assert!(
            !h.fake
                .log_since(mark)
                .iter()
                .any(|(op, ip, _)| *op != "delete" && *ip == Some("192.168.1.50".parse().unwrap())),
            "touched again after the yield"
        );
        // Fresh again and a newer desired set still listing it: taken back.
        h.authority.record_renewal(Instant::now());
        h.want(desired(&["192.168.1.50"], &[]));
        h.wait_ours("the re-take", Duration::from_secs(1), &["192.168.1.50"]).await;
        h.has_metric("aliaslb_agent_yields_total 1");
        h.stop().await;
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_claim_while_fresh_is_defended_once_per_ten_seconds_and_kept() {
    // A node claiming it every second, a host that is no node ten times a second: 25 s of
    // claims while the Lease keeps being renewed.
    let cases = [
        (
            NODE2,
            Duration::from_secs(1),
            "claimed on eth0 by node alb-node-2 (46:b0:48:e8:2d:96) while this agent's Lease \
             was fresh: defended",
        ),
        (
            STRANGER,
            Duration::from_millis(100),
            "claimed on eth0 by 02:aa:00:00:00:01 (none of this node's peers) while this \
             agent's Lease was fresh: defended",
        ),
    ];
    for (mac, every, reason) in cases {
        local(async {
            let h = Harness::holding("192.168.1.50").await;
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(25) {
                h.authority.record_renewal(Instant::now());
                h.claim("192.168.1.50", mac, ClaimKind::Uses);
                tokio::time::sleep(every).await;
            }
            let defences = h.lan.defences.lock().unwrap().clone();
            let at: Vec<u64> = defences.iter().map(|d| (d.3 - start).as_secs()).collect();
            assert_eq!(at, vec![0, 10, 20], "{mac}: {defences:?}");
            assert!(
                defences
                    .iter()
                    .all(|d| (d.0, d.1, d.2) == (2, Mac([2, 0, 0, 0, 0, 2]), ip("192.168.1.50")))
            );
            assert_eq!(h.fake.ours(), vec![ip("192.168.1.50")], "{mac}: kept");
            let report = h.report();
            assert_eq!(report.held, [ip("192.168.1.50")].into());
            let c = &report.conflicts[0];
            assert_eq!(
                (c.reason.as_str(), c.mac, c.while_held),
                (reason, Some(mac), true)
            );
            h.has_metric("aliaslb_agent_defences_total 3");
            h.stop().await;
        })
        .await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_foreign_claim_while_stale_removes_the_alias_at_once_and_is_reported() {
    local(async {
        let h = Harness::holding("192.168.1.50").await;
        h.answers("192.168.1.50", STRANGER);
        // Probes of a held IP are the kernel's to answer.
        h.claim("192.168.1.50", STRANGER, ClaimKind::Probes);
        settle().await;
        assert_eq!(h.fake.ours(), vec![ip("192.168.1.50")]);
        // No renewal ever succeeded: stale once a lease has passed. The node-macs in hand
        // are as old as that: a node that joined since would look foreign.
        tokio::time::sleep(LEASE + Duration::from_millis(500)).await;
        assert!(!h.authority.is_fresh(Instant::now()));
        h.claim("192.168.1.50", STRANGER, ClaimKind::Uses);
        settle().await;
        assert!(h.fake.ours().is_empty());
        let report = h.report();
        assert_eq!(
            report.conflicts[0].reason,
            "claimed on eth0 by 02:aa:00:00:00:01 (none of this node's peers) while this \
             agent's Lease was stale: removed"
        );
        assert_eq!(report.conflicts[0].interface.as_deref(), Some("eth0"));
        assert!(report.conflicts[0].while_held);
        // Re-probed with backoff: still answered, then gone: taken back.
        tokio::time::sleep(Duration::from_secs(4)).await;
        assert!(h.fake.ours().is_empty());
        assert!(!h.lan.probes.lock().unwrap().is_empty());
        h.lan.answers.lock().unwrap().clear();
        wait_for("the re-take", Duration::from_secs(20), || {
            !h.fake.ours().is_empty()
        })
        .await;
        h.stop().await;
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_claim_heard_on_another_link_than_the_aliass_is_ignored() {
    local(async {
        let h = Harness::holding("192.168.1.50").await;
        // Stale, so that a claim that counted would remove it (or yield it to a node).
        tokio::time::sleep(LEASE + Duration::from_millis(500)).await;
        for mac in [STRANGER, NODE2] {
            h.claim_on(7, "192.168.1.50", mac, ClaimKind::Uses);
        }
        settle().await;
        assert_eq!(h.fake.ours(), vec![ip("192.168.1.50")], "kept");
        assert!(h.report().conflicts.is_empty());
        assert!(h.lan.defences.lock().unwrap().is_empty());
        h.has_metric("aliaslb_agent_lan_claims_elsewhere_total 2");
        h.stop().await;
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_hung_kernel_stops_the_lease_renewals_until_it_answers_again() {
    local(async {
        let h = Harness::holding("192.168.1.50").await;
        let gate = |k: &KernelRounds| may_renew(k.last_ok(), Instant::now(), LEASE - RENEW);
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(gate(&h.kernel), "refreshes keep the gate open");
        h.fake.hang.store(true, Ordering::SeqCst);
        let hung = Instant::now();
        wait_for("the gate to close", Duration::from_secs(10), || {
            !gate(&h.kernel)
        })
        .await;
        let closed = hung.elapsed();
        assert!(
            closed <= LEASE - RENEW + RENEW + Duration::from_millis(20),
            "closed after {closed:?}"
        );
        h.has_metric(r#"aliaslb_agent_netlink_timeouts_total{operation="refresh"}"#);
        h.fake.hang.store(false, Ordering::SeqCst);
        wait_for("the gate to open", Duration::from_secs(3), || {
            gate(&h.kernel)
        })
        .await;
        h.stop().await;
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_probe_that_never_finishes_keeps_the_first_claim_back_and_is_retried() {
    local(async {
        let h = Harness::start();
        h.lan.stall.store(true, Ordering::SeqCst);
        h.want(desired(&[], &["192.168.1.50"]));
        // Window (400 ms) + 2 s grace: failed; retried after 1 s, then 2 s...
        tokio::time::sleep(Duration::from_secs(6)).await;
        assert!(h.fake.ours().is_empty(), "no first claim without a probe");
        assert!(
            h.report().conflicts.is_empty(),
            "a failed probe is no conflict"
        );
        assert_eq!(h.lan.probes.lock().unwrap().len(), 2);
        h.has_metric(r#"aliaslb_agent_probes_total{outcome="failed"} 2"#);
        h.lan.stall.store(false, Ordering::SeqCst);
        wait_for("the add", Duration::from_secs(10), || {
            !h.fake.ours().is_empty()
        })
        .await;
        h.stop().await;
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn the_report_lists_host_conflicts_and_lan_conflicts_together() {
    local(async {
        let h = Harness::start();
        // 192.168.1.10 is the node's own address: a host conflict.
        h.want(desired(&["192.168.1.10", "192.168.1.50"], &[]));
        settle().await;
        h.claim("192.168.1.50", STRANGER, ClaimKind::Uses);
        settle().await;
        let report = h.report();
        let got: Vec<_> = report
            .conflicts
            .iter()
            .map(|c| (c.ip, c.mac, c.interface.as_deref()))
            .collect();
        assert_eq!(
            got,
            vec![
                (ip("192.168.1.10"), None, None),
                (ip("192.168.1.50"), Some(STRANGER), Some("eth0")),
            ]
        );
        assert_eq!(
            report.conflicts[0].reason,
            "already configured on eth0 by another owner"
        );
        h.has_metric("aliaslb_agent_lan_conflicts 1");
        h.stop().await;
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_link_regaining_carrier_reannounces_only_the_ips_still_desired() {
    local(async {
        // eth9 (10.9.0.1/24) has an index no interface of this host has: the announcer's
        // frames fail to send and are counted, nothing reaches a real LAN.
        let fake = Arc::new(Fake::with_lo());
        {
            let mut host = fake.host.lock().unwrap();
            host.links.push(Link {
                index: 4242,
                name: "eth9".into(),
                mac: Some([2, 0, 0, 0, 0, 9]),
                kind: None,
                up: true,
                parent: None,
            });
            host.addresses.push(HostAddress {
                ip: ip("10.9.0.1"),
                prefix_len: 24,
                ifindex: 4242,
                owned: false,
                global: true,
            });
        }
        let announcer = Announcer::new(AnnounceConfig {
            repeats: 0,
            interval: Duration::from_millis(100),
        });
        let frames = || announcer.frames_sent() + announcer.frames_failed();
        let h = Harness::start_with(fake.clone(), Some(announcer.clone()));
        let set_up = |up: bool| fake.set_up(2, up);
        h.want(desired(&["10.9.0.50", "10.9.0.51"], &[]));
        settle().await;
        assert_eq!(fake.ours(), vec![ip("10.9.0.50"), ip("10.9.0.51")]);
        // Carrier lost: seen at the next look; nothing announced.
        set_up(false);
        h.changes_tx.send(()).await.unwrap();
        settle().await;
        assert!(h.report().held.is_empty(), "no carrier: not held");
        // Back, while 10.9.0.51 left this node's assignment (the Lease fresh).
        h.authority.record_renewal(Instant::now());
        set_up(true);
        h.want(desired(&["10.9.0.50"], &[]));
        h.changes_tx.send(()).await.unwrap();
        wait_for("the announcement", Duration::from_secs(2), || frames() > 0).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(frames(), 1, "one burst of one frame: 10.9.0.50 only");
        assert_eq!(fake.ours(), vec![ip("10.9.0.50")]);
        h.stop().await;
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_link_regaining_carrier_while_stale_rechecks_its_ips_before_holding_them_again() {
    local(async {
        let (fake, h) = with_eth0();
        let set_up = |up: bool| fake.set_up(1, up);
        h.want(desired(&["192.168.1.50", "192.168.1.51"], &[]));
        settle().await;
        assert_eq!(fake.ours().len(), 2);
        set_up(false);
        h.changes_tx.send(()).await.unwrap();
        settle().await;
        // Off the LAN for longer than a lease, the API path with it: stale. Meanwhile the
        // controller gave 192.168.1.50 to node-2, which answers for it now.
        tokio::time::sleep(LEASE + Duration::from_millis(500)).await;
        assert!(!h.authority.is_fresh(Instant::now()));
        h.answers("192.168.1.50", NODE2);
        let probes_before = h.lan.probes.lock().unwrap().len();
        set_up(true);
        h.changes_tx.send(()).await.unwrap();
        settle().await;
        // Let go of both at once, and probed them (not re-announced from a stale view).
        assert!(fake.ours().is_empty(), "{:?}", fake.ours());
        wait_for("the probe", Duration::from_secs(1), || {
            h.lan.probes.lock().unwrap().len() > probes_before
        })
        .await;
        // Nobody answers for .51: held again; node-2 answers for .50: not taken, reported.
        wait_for("the re-add", Duration::from_secs(2), || {
            fake.ours() == vec![ip("192.168.1.51")]
        })
        .await;
        let report = h.report();
        assert_eq!(report.held, [ip("192.168.1.51")].into());
        assert_eq!(report.conflicts.len(), 1, "{report:?}");
        assert_eq!(report.conflicts[0].ip, ip("192.168.1.50"));
        assert_eq!(report.conflicts[0].mac, Some(NODE2));
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(fake.ours(), vec![ip("192.168.1.51")], "still not taken");
        h.stop().await;
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn an_ip_assigned_while_its_link_has_no_carrier_waits_for_the_link_and_the_lan() {
    // The kernel answers for an alias the instant its link regains carrier, before the
    // agent can ask the LAN: so no alias goes on a link without carrier (a holder whose
    // agent restarted while its cable was out: its standby holds the IPs meanwhile).
    local(async {
        let (fake, h) = with_eth0();
        let set_up = |up: bool| fake.set_up(1, up);
        set_up(false);
        h.want(desired(&["192.168.1.50", "192.168.1.51"], &[]));
        settle().await;
        assert!(fake.ours().is_empty(), "{:?}", fake.ours());
        // Long enough for the retries to back off past the wait below.
        tokio::time::sleep(Duration::from_secs(45)).await;
        assert!(fake.ours().is_empty(), "{:?}", fake.ours());
        assert!(
            h.lan.probes.lock().unwrap().is_empty(),
            "a probe on a link without carrier hears nobody"
        );
        // Meanwhile node-2 took .50 over; the cable is back.
        h.answers("192.168.1.50", NODE2);
        set_up(true);
        h.changes_tx.send(()).await.unwrap();
        wait_for("the re-add", Duration::from_secs(1), || {
            fake.ours() == vec![ip("192.168.1.51")]
        })
        .await;
        assert!(!h.lan.probes.lock().unwrap().is_empty());
        let report = h.report();
        assert_eq!(report.held, [ip("192.168.1.51")].into());
        assert_eq!(report.conflicts.len(), 1, "{report:?}");
        assert_eq!(report.conflicts[0].mac, Some(NODE2));
        h.stop().await;
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_routed_address_goes_on_the_routed_device_off_the_lan_and_reports_its_export() {
    local(async {
        let h = Harness::start();
        let mut d = desired(&["192.168.1.50"], &[]);
        d.insert(ip("10.200.0.7"), None);
        d.mark_routed(ip("10.200.0.7"));
        h.want(d);
        settle().await;
        let on = |wanted: &str| {
            h.fake
                .host
                .lock()
                .unwrap()
                .addresses
                .iter()
                .find(|a| a.owned && a.ip == ip(wanted))
                .map(|a| a.ifindex)
        };
        assert_eq!(on("10.200.0.7"), Some(1), "on lo, the routed device");
        assert_eq!(on("192.168.1.50"), Some(2), "the L2 address stays on eth0");
        assert_eq!(
            *h.lan.watched.lock().unwrap(),
            vec![ip("192.168.1.50")],
            "a routed address is on no LAN: not watched"
        );
        assert!(h.lan.probes.lock().unwrap().is_empty());
        assert_eq!(h.report().routing, None, "no daemon read yet");
        // The daemon exports the routed address, an L2 one and a stranger: only the held
        // routed address is reported.
        h.routing_tx.send_replace(Some(RoutingReport {
            daemon: "bird".into(),
            error: None,
            sessions: 1,
            established: 1,
            exported: [ip("10.200.0.7"), ip("192.168.1.50"), ip("10.200.0.99")].into(),
        }));
        settle().await;
        let routing = h.report().routing.expect("the daemon's state is reported");
        assert_eq!(routing.exported, [ip("10.200.0.7")].into());
        assert_eq!((routing.sessions, routing.established), (1, 1));
        h.stop().await;
    })
    .await;
}

/// A set kept for a missing assignment object (`Assignment` marks it) holds while the
/// Lease is fresh, is let go at the first renewal tick after it went stale, is not taken
/// back when the Lease is fresh again, and a written set is in force at once.
#[tokio::test(start_paused = true)]
async fn a_set_kept_for_a_missing_object_is_let_go_once_the_lease_is_stale() {
    local(async {
        let h = Harness::start();
        h.authority.record_renewal(Instant::now());
        h.want(desired(&["192.168.1.50"], &[]));
        settle().await;
        assert_eq!(h.fake.ours(), vec![ip("192.168.1.50")]);
        let mut kept = desired(&["192.168.1.50"], &[]);
        kept.mark_object_missing();
        h.want(kept.clone());
        // Renewed every second for 10 s: kept.
        for _ in 0..10 {
            h.authority.record_renewal(Instant::now());
            tokio::time::sleep(RENEW).await;
            assert_eq!(
                h.fake.ours(),
                vec![ip("192.168.1.50")],
                "dropped while fresh"
            );
        }
        // No renewal any more: gone within the lease and one renew interval.
        let last = Instant::now();
        h.authority.record_renewal(last);
        wait_for("the kept IP let go", LEASE + RENEW * 2, || {
            h.fake.ours().is_empty()
        })
        .await;
        assert!(last.elapsed() >= LEASE, "let go after {:?}", last.elapsed());
        settle().await;
        assert!(h.report().held.is_empty());
        // Fresh again, the object still missing: not taken back.
        for _ in 0..5 {
            h.authority.record_renewal(Instant::now());
            tokio::time::sleep(RENEW).await;
        }
        h.want(kept);
        settle().await;
        assert!(h.fake.ours().is_empty(), "taken back without a written set");
        // Written again by the controller.
        h.want(desired(&["192.168.1.50"], &[]));
        settle().await;
        assert_eq!(h.fake.ours(), vec![ip("192.168.1.50")]);
        h.stop().await;
    })
    .await;
}

/// Pod veths are no LAN: no LAN socket and no MAC in the report for them; a veth an alias
/// is put on (the assignment names it) is watched, even without an address of the node.
#[tokio::test(start_paused = true)]
async fn pod_veths_are_not_watched_but_a_veth_carrying_an_alias_is() {
    local(async {
        let fake = Arc::new(Fake::with_lo());
        {
            let mut host = fake.host.lock().unwrap();
            for (index, name) in [(30, "vethpod1"), (31, "lanv")] {
                host.links.push(Link {
                    index,
                    name: name.into(),
                    mac: Some([2, 0, 0, 0, 0, index as u8]),
                    kind: Some("veth".into()),
                    up: true,
                    parent: None,
                });
            }
        }
        let h = Harness::start_with(fake, None);
        let mut d = desired(&["192.168.1.50"], &[]);
        h.want(d.clone());
        settle().await;
        assert_eq!(
            *h.lan.interfaces.lock().unwrap(),
            vec![(2, Mac([2, 0, 0, 0, 0, 2]))],
            "pod veths watched"
        );
        assert_eq!(h.report().macs, vec![Mac([2, 0, 0, 0, 0, 2])]);
        d.insert(ip("192.168.1.60"), Some("lanv".into()));
        h.want(d);
        settle().await;
        assert_eq!(
            *h.lan.interfaces.lock().unwrap(),
            vec![(2, Mac([2, 0, 0, 0, 0, 2])), (31, Mac([2, 0, 0, 0, 0, 31]))]
        );
        h.stop().await;
    })
    .await;
}

/// kube-proxy in IPVS mode is not supported (it binds every LB IP to `kube-ipvs0`; the
/// kernel here has no IPVS to prove otherwise): a `kube-ipvs0` link is said (a warning on
/// the edge) and shown (`aliaslb_agent_kube_proxy_ipvs`), from the first look on and
/// whenever it comes or goes.
#[tokio::test(start_paused = true)]
async fn a_kube_ipvs0_link_is_said_and_shown() {
    local(async {
        let fake = Arc::new(Fake::with_lo());
        let ipvs = Link {
            index: 40,
            name: "kube-ipvs0".into(),
            mac: Some([2, 0, 0, 0, 0, 40]),
            kind: Some("dummy".into()),
            up: false,
            parent: None,
        };
        fake.host.lock().unwrap().links.push(ipvs.clone());
        let h = Harness::start_with(fake, None);
        h.want(desired(&["192.168.1.50"], &[]));
        settle().await;
        let shown = |h: &Harness| {
            let text = h.metrics.encode().unwrap();
            text.lines()
                .find(|l| l.starts_with("aliaslb_agent_kube_proxy_ipvs "))
                .map(str::to_owned)
        };
        assert_eq!(
            shown(&h).as_deref(),
            Some("aliaslb_agent_kube_proxy_ipvs 1")
        );
        // The link goes (kube-proxy switched to nftables mode): 0 at the next look.
        h.fake.host.lock().unwrap().links.retain(|l| l.index != 40);
        h.want(desired(&["192.168.1.51"], &[]));
        settle().await;
        assert_eq!(
            shown(&h).as_deref(),
            Some("aliaslb_agent_kube_proxy_ipvs 0")
        );
        h.stop().await;
    })
    .await;
}

/// `held` IPs held here, `standby` IPs this node (alb-node-1) stands by for, held by
/// alb-node-2; node-2's MAC known.
fn with_standby(held: &[&str], standby: &[&str]) -> DesiredSet {
    let mut d = desired(held, &[]);
    for s in standby {
        d.add_standby(
            ip(s),
            StandbyLine {
                holder: "alb-node-2".into(),
                interface: None,
                ports: Default::default(),
                vmac: None,
            },
        );
    }
    d
}

impl Harness {
    /// An advert from alb-node-2 listing `ips`.
    fn advert(&self, counter: u64, ips: &[&str]) {
        self.heard_tx
            .try_send(Message::Advert(Advert {
                from: "alb-node-2".into(),
                to: "alb-node-1".into(),
                counter,
                ips: ips.iter().map(|s| ip(s)).collect(),
            }))
            .unwrap();
    }

    /// An ack from `from` of this node's adverts.
    fn ack(&self, from: &str, counter: u64) {
        self.heard_tx
            .try_send(Message::Ack(Ack {
                from: from.into(),
                to: "alb-node-1".into(),
                counter,
            }))
            .unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn a_standby_takes_over_once_the_holder_is_silent_and_nobody_answers() {
    local(async {
        let h = Harness::wanting(with_standby(&[], &["192.168.1.60"])).await;
        assert!(h.fake.ours().is_empty(), "a standby line is not held");
        assert!(h.report().held.is_empty());
        // The holder advertises every 100 ms for a second: nothing happens.
        for n in 1..=10 {
            h.advert(n, &["192.168.1.60"]);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(h.fake.ours().is_empty());
        assert!(
            h.lan.probes.lock().unwrap().is_empty(),
            "no check while adverts come"
        );
        // Silence: a check 350 ms after the last advert, then the IP, without a probe of
        // the first-claim kind.
        let last = Instant::now() - Duration::from_millis(100);
        wait_for("the takeover", Duration::from_secs(1), || {
            !h.fake.ours().is_empty()
        })
        .await;
        let took = last.elapsed();
        assert!(
            took >= Duration::from_millis(350) && took < Duration::from_millis(500),
            "taken over {took:?} after the last advert"
        );
        let probes = h.lan.probes.lock().unwrap().clone();
        assert_eq!(probes.len(), 1, "{probes:?}");
        assert_eq!(probes[0].2, vec![ip("192.168.1.60")]);
        assert_eq!(h.report().held, [ip("192.168.1.60")].into());
        h.has_metric(r#"aliaslb_agent_failovers_total{result="taken_over"} 1"#);
        // The holder speaks again: the IP goes back at once.
        h.advert(11, &["192.168.1.60"]);
        settle().await;
        assert!(h.fake.ours().is_empty(), "given back");
        // A replayed advert counts for nothing.
        h.advert(10, &["192.168.1.60"]);
        settle().await;
        h.has_metric(r#"aliaslb_agent_adverts_received_total{result="replayed"} 1"#);
        h.stop().await;
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_silent_holder_whose_ip_still_answers_keeps_it() {
    local(async {
        let h = Harness::start();
        // A frozen holder: no adverts, but its kernel still answers for the IP.
        h.answers("192.168.1.60", NODE2);
        h.want(with_standby(&[], &["192.168.1.60"]));
        settle().await;
        h.advert(1, &["192.168.1.60"]);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(h.fake.ours().is_empty(), "never taken while answered");
        // Checked after 350 ms, then again after 100, 200, 400 and 800 ms: backing off
        // (the agent of before checked every interval, 16 times in these 2 s).
        let checks = h.lan.probes.lock().unwrap().len();
        assert!((4..=5).contains(&checks), "re-checks back off: {checks}");
        // Its alias expires: a re-check (at most two seconds apart) finds the IP free.
        h.lan.answers.lock().unwrap().clear();
        wait_for(
            "the takeover",
            MAX_RECHECK + Duration::from_millis(300),
            || !h.fake.ours().is_empty(),
        )
        .await;
        h.stop().await;
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_holder_publishes_one_stream_per_standby_and_lets_go_on_the_controllers_word() {
    local(async {
        let h = Harness::start();
        let mut d = desired(&["192.168.1.50", "192.168.1.51", "192.168.1.52"], &[]);
        for (i, to) in [
            ("192.168.1.50", "alb-node-2"),
            ("192.168.1.51", "alb-node-2"),
            ("192.168.1.52", "alb-node-3"),
        ] {
            d.set_peer(
                ip(i),
                Peer {
                    node: to.into(),
                    address: ip(if to == "alb-node-2" {
                        "192.168.1.12"
                    } else {
                        "192.168.1.13"
                    }),
                },
            );
        }
        h.want(d);
        settle().await;
        let streams = h.streams_rx.borrow().clone();
        assert_eq!(
            streams,
            vec![
                Stream {
                    to: "alb-node-2".into(),
                    address: ip("192.168.1.12"),
                    interface: "eth0".into(),
                    relay: None,
                    ips: vec![ip("192.168.1.50"), ip("192.168.1.51")],
                },
                Stream {
                    to: "alb-node-3".into(),
                    address: ip("192.168.1.13"),
                    interface: "eth0".into(),
                    relay: None,
                    ips: vec![ip("192.168.1.52")],
                },
            ]
        );
        // The controller takes the IPs away: nothing to advertise (the sender keeps the
        // streams, empty, for a while: the standbys know the IPs were let go).
        h.want(desired(&[], &[]));
        settle().await;
        assert!(h.streams_rx.borrow().is_empty());
        h.stop().await;
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_holder_silent_here_but_renewing_its_lease_with_the_ip_gets_it_back_for_good() {
    local(async {
        let h = Harness::start();
        // Cut off from this node on the LAN, not from its clients nor from the API.
        h.holders.alive.lock().unwrap().push("alb-node-2".into());
        h.want(with_standby(&[], &["192.168.1.60"]));
        settle().await;
        h.advert(1, &["192.168.1.60"]);
        wait_for("the takeover", Duration::from_secs(1), || {
            !h.fake.ours().is_empty()
        })
        .await;
        assert_eq!(
            *h.holders.asked.lock().unwrap(),
            vec![("alb-node-2".to_owned(), vec![ip("192.168.1.60")])]
        );
        let took = Instant::now();
        wait_for("the give-back", Duration::from_secs(2), || {
            h.fake.ours().is_empty()
        })
        .await;
        assert!(
            took.elapsed() <= Duration::from_millis(1_100),
            "{:?}",
            took.elapsed()
        );
        // Still silent here: not taken again (no flapping), until an advert lists it.
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(h.fake.ours().is_empty(), "not taken again while disarmed");
        h.has_metric(r#"aliaslb_agent_failovers_total{result="holder_alive"} 1"#);
        // The partition heals, then the holder dies for real: taken over again.
        h.holders.alive.lock().unwrap().clear();
        h.advert(2, &["192.168.1.60"]);
        wait_for("the second takeover", Duration::from_secs(1), || {
            !h.fake.ours().is_empty()
        })
        .await;
        // A dead holder proves nothing: the takeover stands past the lease.
        tokio::time::sleep(LEASE + Duration::from_secs(2)).await;
        assert_eq!(h.fake.ours(), vec![ip("192.168.1.60")]);
        h.stop().await;
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_holder_that_carried_many_ips_is_checked_once_at_a_time_not_once_per_ip() {
    local(async {
        let h = Harness::start();
        let ips = ["192.168.1.60", "192.168.1.61", "192.168.1.62"];
        h.want(with_standby(&[], &ips));
        settle().await;
        h.advert(1, &ips);
        wait_for("the takeovers", Duration::from_secs(1), || {
            h.fake.ours().len() == ips.len()
        })
        .await;
        // All three in one check round on the LAN, and one Lease check for the dead
        // holder, not three.
        assert_eq!(h.lan.probes.lock().unwrap().len(), 1);
        let asked = h.holders.asked.lock().unwrap().clone();
        assert_eq!(asked.len(), 1, "{asked:?}");
        assert_eq!(asked[0].0, "alb-node-2");
        assert_eq!(asked[0].1.len(), 3);
        h.stop().await;
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn ips_taken_from_a_holder_being_checked_wait_for_the_next_check() {
    local(async {
        let h = Harness::start();
        let ips = ["192.168.1.60", "192.168.1.61", "192.168.1.62"];
        // The holder's adverts stop while its IPs answer: re-checked one at a time.
        for i in ips {
            h.lan.answers.lock().unwrap().insert(ip(i), NODE2);
        }
        h.want(with_standby(&[], &ips));
        settle().await;
        h.advert(1, &ips);
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(h.fake.ours().is_empty());
        // Its aliases expire: the re-check takes one IP (asked about at once), then the
        // others, which wait for that Lease check to end.
        h.lan.answers.lock().unwrap().clear();
        wait_for("the takeovers", Duration::from_secs(1), || {
            h.fake.ours().len() == ips.len()
        })
        .await;
        let asked = h.holders.asked.lock().unwrap().clone();
        assert_eq!(asked.len(), 1, "{asked:?}");
        assert_eq!(asked[0].1.len(), 1, "{asked:?}");
        // It proves nothing within a lease and a second: the IPs that waited are checked
        // next, together.
        tokio::time::sleep(LEASE + Duration::from_millis(1_500)).await;
        let asked = h.holders.asked.lock().unwrap().clone();
        assert_eq!(asked.len(), 2, "{asked:?}");
        let mut all: Vec<IpAddr> = asked.iter().flat_map(|(_, ips)| ips.clone()).collect();
        all.sort();
        assert_eq!(all, ips.iter().map(|s| ip(s)).collect::<Vec<_>>());
        assert_eq!(h.fake.ours().len(), ips.len(), "the takeovers stand");
        h.stop().await;
    })
    .await;
}

/// `held` IPs held here, each with alb-node-2 as its standby and alb-node-3 as its relay.
fn held_with_peers(held: &[&str]) -> DesiredSet {
    standby_of(held, Some(("alb-node-3", "192.168.1.13")))
}

/// `held` IPs held here, each with alb-node-2 as its standby and `relay` (node, address).
fn standby_of(held: &[&str], relay: Option<(&str, &str)>) -> DesiredSet {
    let peer = |node: &str, address: &str| Peer {
        node: node.into(),
        address: ip(address),
    };
    let mut d = desired(held, &[]);
    for i in held {
        d.set_peer(ip(i), peer("alb-node-2", "192.168.1.12"));
        if let Some((node, address)) = relay {
            d.set_relay(ip(i), peer(node, address));
        }
    }
    d
}

#[tokio::test(start_paused = true)]
async fn a_holder_nobody_acks_steps_down_before_the_standby_acts_and_holds_again_when_acked() {
    local(async {
        let h = Harness::wanting(held_with_peers(&["192.168.1.70"])).await;
        assert_eq!(h.fake.ours(), vec![ip("192.168.1.70")]);
        // Never acked (an older standby): never stepped down.
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(h.fake.ours(), vec![ip("192.168.1.70")], "not armed");
        // The standby acks, then falls silent, its node still answering on the LAN (its
        // agent restarting, or UDP dropped): kept, the standby probed every interval.
        let standby_mac = Mac([2, 0, 0, 0, 0, 12]);
        h.answers("192.168.1.12", standby_mac);
        h.ack("alb-node-2", 1);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(h.fake.ours(), vec![ip("192.168.1.70")], "the standby answers");
        let probed = h
            .lan
            .probes
            .lock()
            .unwrap()
            .iter()
            .filter(|p| p.2 == vec![ip("192.168.1.12")])
            .count();
        // From 200 ms on, one probe (45 ms), then 100, 200, 400, 800 ms after the last
        // answer: backing off (the agent of before probed every interval, 11-14 times).
        assert!((4..=6).contains(&probed), "{probed} probes in 2 s");
        h.lan.answers.lock().unwrap().clear();
        // Acked by the standby, then the relay, then both fall silent and the standby's
        // node does not answer: cut off from them.
        h.ack("alb-node-2", 2);
        tokio::time::sleep(Duration::from_millis(100)).await;
        h.ack("alb-node-3", 1);
        let last = Instant::now();
        // The standby took it: its Lease says so within the check.
        h.holders.alive.lock().unwrap().push("alb-node-2".into());
        wait_for("the step-down", Duration::from_secs(1), || {
            h.fake.ours().is_empty()
        })
        .await;
        let silent = last.elapsed();
        assert!(
            silent >= Duration::from_millis(240) && silent < Duration::from_millis(300),
            "stepped down {silent:?} after the last ack (200 ms and a 45 ms probe): before the standby's 350 ms and its check"
        );
        assert_eq!(
            *h.holders.asked.lock().unwrap(),
            vec![("alb-node-2".to_owned(), vec![ip("192.168.1.70")])]
        );
        // Its stream stays, empty: the acks can tell when the nodes hear each other.
        wait_for("the empty stream", Duration::from_secs(1), || {
            h.streams_rx
                .borrow()
                .iter()
                .any(|s| s.to == "alb-node-2" && s.ips.is_empty())
        })
        .await;
        // The standby holds it: it stays stepped down past the check.
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(h.fake.ours().is_empty(), "the standby holds it");
        // A replayed ack lifts nothing; a fresh one of the relay does.
        h.ack("alb-node-3", 1);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(h.fake.ours().is_empty(), "a replay lifts nothing");
        h.ack("alb-node-3", 2);
        h.wait_ours("held again", Duration::from_secs(1), &["192.168.1.70"]).await;
        let text = h.metrics.encode().unwrap();
        for line in [
            r#"aliaslb_agent_failovers_total{result="stepped_down"} 1"#,
            r#"aliaslb_agent_failovers_total{result="standby_answers"} "#,
            r#"aliaslb_agent_failovers_total{result="lifted"} 1"#,
            r#"aliaslb_agent_adverts_received_total{result="replayed"} 1"#,
        ] {
            assert!(text.contains(line), "{line} in {text}");
        }
        h.stop().await;
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_holder_whose_standby_died_takes_the_ip_back_after_the_check_and_stays() {
    local(async {
        let h = Harness::wanting(held_with_peers(&["192.168.1.71"])).await;
        h.stepped_down().await;
        let down = Instant::now();
        // A dead standby proves nothing: the IP is held again after the check.
        h.wait_ours("held again", Duration::from_secs(2), &["192.168.1.71"])
            .await;
        let gone = down.elapsed();
        assert!(
            gone >= Duration::from_millis(900) && gone <= Duration::from_millis(1_200),
            "{gone:?}"
        );
        // Disarmed: the same silence steps nothing down again.
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(h.fake.ours(), vec![ip("192.168.1.71")]);
        h.has_metric(r#"aliaslb_agent_failovers_total{result="retaken"} 1"#);
        h.stop().await;
    })
    .await;
}

/// `held` IPs held here with alb-node-2 as the standby and no relay (two nodes on the LAN).
fn held_without_relay(held: &[&str]) -> DesiredSet {
    standby_of(held, None)
}

/// Issue 41, item 3: a compromised standby (no relay on the LAN) stops acking, drops the
/// holder's probe and claims the IP in its Lease without answering for it: the holder
/// believes the LAN, not that word, and takes the IP back after the check.
#[tokio::test(start_paused = true)]
async fn without_a_relay_a_standbys_word_without_the_lan_does_not_keep_its_holder_down() {
    local(async {
        let h = Harness::wanting(held_without_relay(&["192.168.1.72"])).await;
        h.ack("alb-node-2", 1);
        // Its Lease says it holds the IP; nothing answers for it on the LAN.
        h.holders.alive.lock().unwrap().push("alb-node-2".into());
        wait_for("the step-down", Duration::from_secs(1), || {
            h.fake.ours().is_empty()
        })
        .await;
        let down = Instant::now();
        h.wait_ours("held again", Duration::from_secs(2), &["192.168.1.72"])
            .await;
        let gone = down.elapsed();
        assert!(gone <= Duration::from_millis(1_200), "{gone:?}");
        assert!(
            h.holders.asked.lock().unwrap().is_empty(),
            "without a relay its word is not even asked for"
        );
        let probed_ip = h
            .lan
            .probes
            .lock()
            .unwrap()
            .iter()
            .any(|p| p.2 == vec![ip("192.168.1.72")]);
        assert!(probed_ip, "the LAN was asked");
        h.stop().await;
    })
    .await;
}

/// The same step-down, the standby answering for the IP on the LAN: it holds it, the
/// holder stays down until the nodes hear each other again.
#[tokio::test(start_paused = true)]
async fn a_standby_answering_for_the_ip_on_the_lan_keeps_its_holder_down() {
    local(async {
        let h = Harness::wanting(held_without_relay(&["192.168.1.73"])).await;
        h.stepped_down().await;
        h.answers("192.168.1.73", Mac([2, 0, 0, 0, 0, 12]));
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(
            h.fake.ours().is_empty(),
            "held by the standby, on the LAN's word"
        );
        h.ack("alb-node-2", 2);
        h.wait_ours("held again", Duration::from_secs(1), &["192.168.1.73"])
            .await;
        h.stop().await;
    })
    .await;
}

#[tokio::test(start_paused = true)]
async fn a_refresh_round_longer_than_half_its_interval_is_said_and_unsaid() {
    local(async {
        let h = Harness::start();
        h.want(desired(&["192.168.1.50", "192.168.1.51"], &[]));
        wait_for("the adds", Duration::from_secs(2), || {
            h.fake.ours().len() == 2
        })
        .await;
        let crowded = || {
            let text = h.metrics.encode().unwrap();
            let line = text
                .lines()
                .find(|l| l.starts_with("aliaslb_agent_refresh_crowded "))
                .map(str::to_owned);
            line.unwrap_or_else(|| panic!("no refresh_crowded gauge in {text}"))
        };
        let rounds = || {
            let text = h.metrics.encode().unwrap();
            text.lines()
                .find_map(|l| l.strip_prefix("aliaslb_agent_refresh_duration_seconds_count "))
                .map(|n| n.parse::<u64>().unwrap())
                .unwrap_or(0)
        };
        tokio::time::sleep(3 * RENEW).await;
        assert!(rounds() >= 2, "refresh rounds recorded: {}", rounds());
        assert_eq!(crowded(), "aliaslb_agent_refresh_crowded 0");
        let refresh_takes = |d: Duration| h.fake.slow.lock().unwrap().insert("refresh", d);
        // A kernel that takes 60 % of the interval per refresh: said at the next round.
        refresh_takes(RENEW * 6 / 10);
        tokio::time::sleep(3 * RENEW).await;
        assert_eq!(crowded(), "aliaslb_agent_refresh_crowded 1");
        assert_eq!(h.fake.ours().len(), 2, "still held");
        // 40 %: fits again.
        refresh_takes(RENEW * 4 / 10);
        tokio::time::sleep(3 * RENEW).await;
        assert_eq!(crowded(), "aliaslb_agent_refresh_crowded 0");
        h.stop().await;
    })
    .await;
}
