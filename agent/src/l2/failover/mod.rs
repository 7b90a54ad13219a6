//! Fast L2 failover (VRRP-class, configured by the controller): one folder, one name.
//!
//! - [`wire`]: the I/O of the adverts and acks (UDP sockets, this node's signing key).
//! - [`trust`]: whom this node believes, for what: the senders its assignment names.
//! - [`standby`]: the standby's decisions, pure: which IPs to check on the LAN and take
//!   over when their holder falls silent.
//! - [`holder`]: the holder's decisions, pure: step down from IPs nobody acks.
//! - [`metrics`]: its metrics.
//! - [`FastFailover`] (here): both sides at work in the agent: the adverts and acks heard,
//!   the LAN checks before a takeover and the probes of a silent standby (spawned, their
//!   results come back through [`FastFailover::next`]), the API checks of a holder or
//!   standby ([`HolderCheck`]), and the streams of adverts to send. It owns its state, its
//!   tasks and its metrics; the run loop hands it the desired set and what is held, and
//!   reconciles when it says what it holds changed ([`FastFailover::taken`],
//!   [`FastFailover::stepped_down`]).

pub mod holder;
pub mod metrics;
pub mod standby;
pub mod trust;
pub mod wire;

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use aliaslb_core::advert::{Message, PublicKey};
use aliaslb_core::mac::Mac;
use tokio::sync::{mpsc, watch};
use tokio::task::{JoinError, JoinSet};
use tokio::time::Instant;
use tracing::{debug, error, info, warn};

use self::holder::{Acked, Pair, Peers, StepDowns};
use self::metrics::FailoverMetrics;
use self::standby::{Heard, Standby};
use self::trust::Trust;
use self::wire::Stream;
use crate::desired::DesiredSet;
use crate::host::{Held, Interfaces};
use crate::l2::lan::{BoxFuture, LanPort, ProbeConfig, ProbeOutcome};
use crate::l2::sleep_until;

/// The failover timers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailoverConfig {
    /// How often a holder sends its adverts.
    pub interval: Duration,
    /// Silence after which a holder counts as gone: three intervals and half of one
    /// (VRRP's skew), so one late advert is never a failover.
    pub dead: Duration,
    /// The LAN check before a takeover.
    pub check: ProbeConfig,
    /// The kernel lifetime of the aliases (`--alias-lifetime`, the same on every node): a
    /// holder's aliases lapse at most this long after its last advert, so a holder frozen
    /// or dead with its IPs still answered is re-checked then, whatever the backoff.
    pub lapse: Duration,
}

impl FailoverConfig {
    /// The timers for adverts every `interval`, aliases living `lapse`.
    pub fn new(interval: Duration, lapse: Duration) -> Self {
        FailoverConfig {
            interval,
            dead: interval * 3 + interval / 2,
            check: ProbeConfig::quick(),
            lapse,
        }
    }
}

impl Default for FailoverConfig {
    /// Adverts every 100 ms, aliases living 3 s (the defaults of the flags).
    fn default() -> Self {
        Self::new(Duration::from_millis(100), Duration::from_secs(3))
    }
}

/// Whether a node is alive and holds IPs, from its Lease (the API): asked by a standby that
/// took IPs over from a holder, and by a holder that stepped down, of its standby.
pub trait HolderCheck: Send + Sync + std::fmt::Debug + 'static {
    /// Resolves with those of `ips` that `holder` proves it holds: its Lease renewed after
    /// this call began, with a report that lists them; empty once `within` passed without
    /// that (a dead holder, or no API).
    fn alive_holding(
        &self,
        holder: &str,
        ips: Vec<IpAddr>,
        within: Duration,
    ) -> BoxFuture<Vec<IpAddr>>;
}

/// How long a holder that stepped down waits for its standby's Lease to show the IP held
/// before it takes the IP back (no evidence: a dead standby, or no API). The standby writes
/// its report at once after a takeover, so about 0.5 s after the step-down.
pub const STANDBY_CHECK: Duration = Duration::from_secs(1);

/// A takeover check round that finished: each IP, and whether nobody answered for it.
type CheckDone = Vec<(IpAddr, bool)>;

/// A step-down's check that finished: the standby, the IPs asked about, those held by
/// another node by the evidence.
type StandbyDone = (String, Vec<IpAddr>, Vec<IpAddr>);

/// Fast failover's settings and ends.
#[derive(Debug)]
pub struct FailoverSetup<L> {
    /// This node.
    pub node: String,
    /// The timers.
    pub config: FailoverConfig,
    /// The LAN, for the checks before a takeover and the probes of a silent standby.
    pub lan: Arc<L>,
    /// The adverts and acks heard, their MAC verified ([`wire::receive_loop`]).
    pub heard: mpsc::Receiver<Message>,
    /// Where the adverts to send are published (`None`: none sent).
    pub streams: Option<watch::Sender<Vec<Stream>>>,
    /// Where whom to believe is published, for the receiver (`None`: nobody listens).
    pub trust: Option<watch::Sender<Arc<Trust>>>,
    /// The public half of the key this node signs with, for its report (`None`: adverts
    /// off).
    pub key: Option<PublicKey>,
    /// Tells whether a holder or standby is alive and holds IPs (`None`: never asked).
    pub holders: Option<Arc<dyn HolderCheck>>,
    /// Its metrics.
    pub metrics: FailoverMetrics,
}

/// What woke fast failover.
#[derive(Debug)]
pub enum FailoverEvent {
    /// Adverts and acks heard (all those queued).
    Heard(Vec<Message>),
    /// A takeover check may be due.
    CheckDue,
    /// A takeover check finished.
    Checked(Result<CheckDone, JoinError>),
    /// A holder check (after a takeover) finished.
    HolderChecked(Result<(String, Vec<IpAddr>), JoinError>),
    /// A step-down may be due.
    StepDownDue,
    /// A probe of a silent standby finished: the pair, and whether it answered.
    StandbyProbed(Result<(Pair, bool), JoinError>),
    /// A step-down's API check finished.
    StandbyChecked(Result<StandbyDone, JoinError>),
}

/// Both sides of fast failover at work.
#[derive(Debug)]
pub struct FastFailover<L> {
    lan: Arc<L>,
    heard: mpsc::Receiver<Message>,
    heard_open: bool,
    metrics: FailoverMetrics,
    /// The desired set in force (without the takeovers), as last settled.
    desired: Arc<DesiredSet>,
    /// The standby's side: its state, the LAN checks in flight, the API checks of the
    /// holders it took IPs from (one each) and the IPs taken over from them since it began
    /// (checked next).
    standby: Standby,
    checks: JoinSet<CheckDone>,
    /// The holders whose silence was said (once per silence, not per IP and round).
    silent: BTreeSet<String>,
    holders: Option<Arc<dyn HolderCheck>>,
    holder_checks: JoinSet<(String, Vec<IpAddr>)>,
    holders_checking: BTreeMap<String, Vec<IpAddr>>,
    /// The holder's side: the IPs stepped down because nobody acks their adverts, the
    /// probes of the silent standbys and the API checks after a step-down.
    step_downs: StepDowns,
    standby_probes: JoinSet<(Pair, bool)>,
    standby_checks: JoinSet<StandbyDone>,
    /// The IPs held with a standby (not stepped down), by standby and relay, as of the
    /// last publish.
    pairs: BTreeMap<Pair, Vec<IpAddr>>,
    streams: Option<watch::Sender<Vec<Stream>>>,
    node: String,
    trust: Option<watch::Sender<Arc<Trust>>>,
    key: Option<PublicKey>,
    /// When the standby IPs by state were last published ([`Self::publish_coverage`]).
    covered_at: Option<Instant>,
}

impl<L: LanPort> FastFailover<L> {
    /// Fast failover of node `setup.node`.
    pub fn new(setup: FailoverSetup<L>) -> Self {
        FastFailover {
            lan: setup.lan,
            heard: setup.heard,
            heard_open: true,
            metrics: setup.metrics,
            desired: Arc::default(),
            step_downs: StepDowns::new(setup.config.interval),
            standby: Standby::new(&setup.node, setup.config),
            checks: JoinSet::new(),
            silent: BTreeSet::new(),
            holders: setup.holders,
            holder_checks: JoinSet::new(),
            holders_checking: BTreeMap::new(),
            standby_probes: JoinSet::new(),
            standby_checks: JoinSet::new(),
            pairs: BTreeMap::new(),
            streams: setup.streams,
            node: setup.node,
            trust: setup.trust,
            key: setup.key,
            covered_at: None,
        }
    }

    /// Publishes the standby IPs by state (`aliaslb_agent_standby_addresses`): after
    /// every event but the adverts heard, and after those at most once a second (they come
    /// ten times a second per holder, and it is a walk over every standby IP).
    fn publish_coverage(&mut self, force: bool) {
        let now = Instant::now();
        if !force
            && self
                .covered_at
                .is_some_and(|at| now.duration_since(at) < Duration::from_secs(1))
        {
            return;
        }
        self.covered_at = Some(now);
        let coverage = self.standby.coverage(&self.desired, now.into_std());
        self.metrics.set_standby(coverage);
    }

    /// The next thing to act on. The timers (a takeover check, a step-down) wait until the
    /// first reconcile is done (`synced`); what is heard is taken at once. Pending while
    /// there is nothing.
    pub async fn next(&mut self, synced: bool) -> FailoverEvent {
        let due = synced
            .then(|| self.standby.next_due(&self.desired))
            .flatten()
            .map(Instant::from_std);
        let step = synced.then(|| self.next_step_down()).flatten();
        tokio::select! {
            biased;
            message = self.heard.recv(), if self.heard_open => match message {
                Some(message) => {
                    let mut messages = vec![message];
                    while let Ok(more) = self.heard.try_recv() {
                        messages.push(more);
                    }
                    FailoverEvent::Heard(messages)
                }
                None => {
                    self.heard_open = false;
                    std::future::pending().await
                }
            },
            () = sleep_until(step) , if step.is_some() => FailoverEvent::StepDownDue,
            Some(done) = self.standby_probes.join_next(), if !self.standby_probes.is_empty() => {
                FailoverEvent::StandbyProbed(done)
            }
            Some(done) = self.standby_checks.join_next(), if !self.standby_checks.is_empty() => {
                FailoverEvent::StandbyChecked(done)
            }
            () = sleep_until(due), if due.is_some() => FailoverEvent::CheckDue,
            Some(done) = self.checks.join_next(), if !self.checks.is_empty() => {
                FailoverEvent::Checked(done)
            }
            Some(done) = self.holder_checks.join_next(), if !self.holder_checks.is_empty() => {
                FailoverEvent::HolderChecked(done)
            }
        }
    }

    /// Acts on `event`; returns whether what is held must change now (IPs taken over or
    /// given back, stepped down or held again: a reconcile adds or removes them).
    /// `lease_duration` bounds how long a holder's Lease is watched after a takeover.
    pub fn handle(
        &mut self,
        event: FailoverEvent,
        held: Held<'_>,
        lease_duration: Duration,
    ) -> bool {
        let heard = matches!(event, FailoverEvent::Heard(_));
        let changed = match event {
            FailoverEvent::Heard(messages) => self.on_messages(messages),
            FailoverEvent::CheckDue => {
                self.start_checks(held);
                false
            }
            FailoverEvent::Checked(done) => joined(done, "a takeover check")
                .is_some_and(|done| self.on_check(done, lease_duration)),
            FailoverEvent::HolderChecked(done) => joined(done, "a holder check")
                .is_some_and(|done| self.on_holder_alive(done, lease_duration)),
            FailoverEvent::StepDownDue => {
                self.probe_standbys(held);
                false
            }
            FailoverEvent::StandbyProbed(done) => joined(done, "a probe of a standby")
                .is_some_and(|done| self.on_standby_probed(done, held)),
            FailoverEvent::StandbyChecked(done) => {
                joined(done, "a standby check").is_some_and(|done| self.on_standby_checked(done))
            }
        };
        self.publish_coverage(!heard);
        changed
    }

    /// A new desired set in force (`in_force`, without the takeovers): takeovers whose
    /// standby line went away or names another holder end, and so do the step-downs whose
    /// standby changed. Returns the set to hold: `in_force` with the IPs taken over.
    pub fn settle(&mut self, in_force: Arc<DesiredSet>) -> Arc<DesiredSet> {
        if let Some(trust) = &self.trust {
            let now = Trust::of(&self.node, &in_force);
            trust.send_if_modified(|current| {
                let changed = **current != now;
                if changed {
                    *current = Arc::new(now);
                }
                changed
            });
        }
        for ip in self.standby.settle(&in_force) {
            info!(%ip, "takeover over: the assignment no longer names this node the IP's standby for that holder");
        }
        self.silent
            .retain(|h| in_force.standbys().any(|(_, l)| &l.holder == h));
        let key = |n: &str| in_force.peer_nodes().get(n).and_then(|p| p.key);
        let named: Vec<(String, Option<PublicKey>)> = in_force
            .iter()
            .flat_map(|(ip, _)| {
                let standby = in_force.peer(ip).map(|p| p.node.as_str());
                standby.into_iter().chain(in_force.relay_node(ip))
            })
            .map(|n| (n.to_owned(), key(n)))
            .collect();
        self.step_downs.name_peers(named);
        let desired = DesiredSet::with_taken_over(in_force, self.standby.taken());
        let ended = self.step_downs.settle(|ip| {
            let peer = desired.peer(ip)?;
            Some(Peers {
                standby: &peer.node,
                relay: desired.relay_node(ip),
            })
        });
        for ip in ended {
            info!(%ip, "step-down over: the assignment changed the IP's standby or took it from this node");
        }
        self.desired = desired.clone();
        self.publish_coverage(true);
        desired
    }

    /// The public half of this node's signing key (`None`: adverts off), for the report.
    pub fn key(&self) -> Option<PublicKey> {
        self.key
    }

    /// The IPs stepped down: desired, but not to be held now.
    pub fn stepped_down(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.step_downs.stepped_down().map(|(ip, _)| ip)
    }

    /// Hands adverts to the standby's side and acks to the holder's; returns whether IPs
    /// taken over go back to their holder or step-downs were lifted (a reconcile must
    /// remove or add them now).
    fn on_messages(&mut self, messages: Vec<Message>) -> bool {
        let now = Instant::now().into_std();
        let mut back = false;
        for message in messages {
            let advert = match message {
                Message::Advert(advert) => advert,
                Message::Ack(ack) => {
                    self.metrics.inc_received("ack");
                    match self.step_downs.acked(&ack, now) {
                        Acked::Accepted { lifted } => {
                            for ip in lifted {
                                info!(%ip, by = %ack.from, "acked again: the nodes hear this one again, the IP stepped down is held again");
                                self.metrics.inc("lifted");
                                back = true;
                            }
                        }
                        Acked::Stale => self.metrics.inc_received("replayed"),
                        Acked::Unnamed => self.metrics.inc_received("unknown_sender"),
                    }
                    continue;
                }
            };
            match self.standby.heard(&advert, &self.desired, now) {
                Heard::Accepted {
                    give_back,
                    back: was_missing,
                } => {
                    self.metrics.inc_received("accepted");
                    self.silent.remove(&advert.from);
                    if was_missing {
                        info!(holder = %advert.from, "the holder's adverts are heard again");
                    }
                    for ip in give_back {
                        info!(%ip, holder = %advert.from, "the holder is back and holds the IP: giving the takeover back");
                        self.metrics.inc("given_back");
                        back = true;
                    }
                }
                Heard::NotForMe => self.metrics.inc_received("not_for_me"),
                Heard::Unnamed => self.metrics.inc_received("unknown_sender"),
                Heard::Duplicate => self.metrics.inc_received("duplicate"),
                Heard::Stale => self.metrics.inc_received("replayed"),
            }
        }
        back
    }

    /// Starts a LAN check of the standby IPs whose holder went silent: one probe round per
    /// link for all of its due IPs.
    fn start_checks(&mut self, held: Held<'_>) {
        let now = Instant::now().into_std();
        let due = self.standby.due(&self.desired, now);
        let Some(host) = held.host() else {
            return;
        };
        let interfaces = Interfaces::of(host);
        let config = self.standby.config().check;
        let limit = config.window() + Duration::from_millis(200);
        let mut by_link: BTreeMap<(u32, Mac), Vec<IpAddr>> = BTreeMap::new();
        let mut holders: BTreeMap<String, usize> = BTreeMap::new();
        for (ip, holder) in due {
            let assigned = self
                .desired
                .standby(ip)
                .and_then(|l| l.interface.as_deref());
            let link = interfaces
                .choose(ip, held.interface_override(), assigned)
                .ok()
                .filter(|l| l.up)
                .and_then(|l| Some((l.index, Mac(l.mac?))));
            let Some(link) = link else {
                debug!(%ip, "no Ethernet interface up for this standby IP: no takeover");
                continue;
            };
            self.standby.checking(ip);
            by_link.entry(link).or_default().push(ip);
            *holders.entry(holder).or_default() += 1;
        }
        for (holder, ips) in holders {
            if self.silent.insert(holder.clone()) {
                warn!(%holder, ips, silent_for = ?self.standby.config().dead, "the holder's adverts stopped: checking the LAN before taking its IPs over");
            } else {
                debug!(%holder, ips, "re-checking the LAN for a holder whose adverts are missing");
            }
        }
        for ((ifindex, mac), ips) in by_link {
            let probe = self.lan.probe_many(ifindex, mac, ips.clone(), config);
            self.checks.spawn(async move {
                let outcomes = match tokio::time::timeout(limit, probe).await {
                    Ok(Ok(outcomes)) => outcomes,
                    // Cannot tell: not free (a takeover needs the LAN to say so).
                    _ => BTreeMap::new(),
                };
                ips.into_iter()
                    .map(|ip| (ip, outcomes.get(&ip) == Some(&ProbeOutcome::Free)))
                    .collect()
            });
        }
    }

    /// A check round finished; returns whether IPs were taken over (a reconcile adds them
    /// now).
    fn on_check(&mut self, done: CheckDone, lease_duration: Duration) -> bool {
        let checked = self
            .standby
            .checked(&done, &self.desired, Instant::now().into_std());
        for holder in &checked.answering {
            warn!(%holder, recheck_up_to = ?standby::MAX_RECHECK, "the holder's adverts are missing but its IPs answer on the LAN (adverts blocked, or its new key not relayed yet): it keeps them; re-checking one of them with backoff");
        }
        for ip in &checked.answered {
            debug!(%ip, "the IP is still answered on the LAN: its holder keeps it");
            self.metrics.inc("still_answered");
        }
        let mut from: BTreeMap<String, Vec<IpAddr>> = BTreeMap::new();
        for ip in &checked.taken {
            warn!(%ip, "nobody answers for the IP and its holder is silent: taking it over");
            self.metrics.inc("taken_over");
            if let Some(line) = self.desired.standby(*ip) {
                from.entry(line.holder.clone()).or_default().push(*ip);
            }
        }
        // Silent to this node is not dead: a holder cut off from the other nodes but not
        // from its clients still renews its Lease and reports the IP held.
        for (holder, ips) in from {
            self.check_holder(holder, ips, lease_duration);
        }
        !checked.taken.is_empty()
    }

    /// Asks whether `holder` is alive and holds `ips` (its Lease), one check per holder
    /// at a time: IPs taken over from a holder already being checked wait for the next
    /// check, so a holder that carried many IPs costs one Lease read per poll, not one per
    /// IP.
    fn check_holder(&mut self, holder: String, ips: Vec<IpAddr>, lease_duration: Duration) {
        let Some(holders) = &self.holders else {
            return;
        };
        if let Some(waiting) = self.holders_checking.get_mut(&holder) {
            waiting.extend(ips);
            return;
        }
        self.holders_checking.insert(holder.clone(), Vec::new());
        let within = lease_duration + Duration::from_secs(1);
        let check = holders.alive_holding(&holder, ips, within);
        self.holder_checks
            .spawn(async move { (holder, check.await) });
    }

    /// A holder check ended: the IPs its holder proved it holds go back, for good (until
    /// its adverts list them again). Returns whether any did. IPs taken over from the same
    /// holder meanwhile are checked next.
    fn on_holder_alive(
        &mut self,
        (holder, ips): (String, Vec<IpAddr>),
        lease_duration: Duration,
    ) -> bool {
        let waiting = self.holders_checking.remove(&holder).unwrap_or_default();
        let next: Vec<IpAddr> = waiting
            .into_iter()
            .filter(|ip| !ips.contains(ip) && self.standby.taken().contains(ip))
            .collect();
        if !next.is_empty() {
            self.check_holder(holder.clone(), next, lease_duration);
        }
        let mut back = false;
        for ip in ips {
            if self.standby.give_back_for_good(ip) {
                warn!(%ip, %holder, "the holder renewed its Lease holding the IP, so it is alive though silent on this LAN (cut off from this node?): giving the takeover back");
                self.metrics.inc("holder_alive");
                back = true;
            }
        }
        back
    }

    /// A claim of `ip` by `node` on the LAN, for an IP taken over here from that node:
    /// gives it back. Returns whether it did.
    pub fn holder_claims(&mut self, ip: IpAddr, node: Option<&str>) -> bool {
        let holder = self.desired.standby(ip).map(|l| l.holder.as_str());
        if node.is_none() || holder != node || !self.standby.taken().contains(&ip) {
            return false;
        }
        info!(%ip, holder = ?node, "the holder claims the IP on the LAN: giving the takeover back");
        self.metrics.inc("given_back");
        self.standby.give_back(ip)
    }

    /// When an IP held may next be stepped down (`None`: none armed, or no API to check
    /// with afterwards). O(standby and relay pairs), not O(IPs).
    fn next_step_down(&self) -> Option<Instant> {
        self.holders.as_ref()?;
        self.step_downs
            .next_due(self.pairs.keys().map(Peers::of))
            .map(Instant::from_std)
    }

    /// Probes on the LAN the standby of every pair of held IPs that neither the standby
    /// nor the relay acked for [`StepDowns::after`]: is this node still on the standby's
    /// LAN?
    fn probe_standbys(&mut self, held: Held<'_>) {
        if self.holders.is_none() {
            return;
        }
        let now = Instant::now().into_std();
        let due: Vec<Pair> = self
            .pairs
            .keys()
            .filter(|pair| self.step_downs.due(Peers::of(pair), now))
            .cloned()
            .collect();
        let Some(host) = held.host() else {
            return;
        };
        let interfaces = Interfaces::of(host);
        let config = self.standby.config().check;
        let limit = config.window() + Duration::from_millis(200);
        for pair in due {
            let Some(ip) = self.pairs.get(&pair).and_then(|ips| ips.first().copied()) else {
                continue;
            };
            let Some(address) = self.desired.peer(ip).map(|p| p.address) else {
                continue;
            };
            let link = interfaces
                .choose(ip, held.interface_override(), self.desired.interface(ip))
                .ok()
                .and_then(|l| Some((l.index, Mac(l.mac?))));
            self.step_downs.probing(Peers::of(&pair));
            // No Ethernet link to probe from: the standby cannot be reached there either.
            let probe =
                link.map(|(ifindex, mac)| self.lan.probe_many(ifindex, mac, vec![address], config));
            debug!(standby = %pair.0, %address, "no ack from the standby nor the relay: is the standby still on this LAN?");
            self.standby_probes.spawn(async move {
                let answered = match probe {
                    Some(probe) => matches!(
                        tokio::time::timeout(limit, probe).await,
                        Ok(Ok(outcomes)) if matches!(outcomes.get(&address), Some(ProbeOutcome::Taken { .. }))
                    ),
                    None => false,
                };
                (pair, answered)
            });
        }
    }

    /// A probe of a standby ended: not answered (and no ack meanwhile), the IPs of that
    /// pair are stepped down and the API is asked whether the standby took them; returns
    /// whether any were (a reconcile removes them now).
    fn on_standby_probed(&mut self, (pair, answered): (Pair, bool), held: Held<'_>) -> bool {
        let now = Instant::now().into_std();
        if !self.step_downs.probed(Peers::of(&pair), answered, now) {
            if answered {
                debug!(standby = %pair.0, "the standby's node answers on the LAN though neither it nor the relay acks: the IPs stay (its LAN check hears them answered too)");
                self.metrics.inc("standby_answers");
            }
            return false;
        }
        let Some(holders) = self.holders.clone() else {
            return false;
        };
        let ips: Vec<IpAddr> = self
            .pairs
            .remove(&pair)
            .unwrap_or_default()
            .into_iter()
            .filter(|ip| held.alias(*ip).is_some())
            .collect();
        if ips.is_empty() {
            return false;
        }
        for ip in &ips {
            self.step_downs.step_down(*ip, Peers::of(&pair), now);
            self.metrics.inc("stepped_down");
        }
        let (standby, relay) = pair;
        warn!(ips = ?ips, %standby, relay = ?relay, "neither the standby nor the relay acks this node's adverts and the standby does not answer on the LAN (cut off from the other nodes?): stepping down from the IPs before the standby takes them, so the LAN never sees two holders");
        // The evidence, gathered over the check's window: the LAN's (another MAC answers
        // the IP), and with a relay named the standby's own Lease (see `holder`).
        let api = relay
            .is_some()
            .then(|| holders.alive_holding(&standby, ips.clone(), STANDBY_CHECK));
        let probes = self.lan_probes(held, &ips);
        let config = self.standby.config().check;
        self.standby_checks.spawn(async move {
            let lan = async {
                tokio::time::sleep(STANDBY_CHECK).await;
                let mut answered = Vec::new();
                for (ips, probe) in probes.into_iter().map(|make| make()) {
                    if let Ok(Ok(outcomes)) =
                        tokio::time::timeout(config.window() + Duration::from_millis(200), probe)
                            .await
                    {
                        answered.extend(ips.into_iter().filter(|ip| {
                            matches!(outcomes.get(ip), Some(ProbeOutcome::Taken { .. }))
                        }));
                    }
                }
                answered
            };
            let (mut elsewhere, proven) = match api {
                Some(api) => tokio::join!(lan, api),
                None => (lan.await, Vec::new()),
            };
            elsewhere.extend(proven);
            (standby, ips, elsewhere)
        });
        true
    }

    /// Probes of `ips` on the LAN, one per link, to start when called (after a wait): each
    /// with the IPs it asks about.
    fn lan_probes(
        &self,
        held: Held<'_>,
        ips: &[IpAddr],
    ) -> Vec<impl FnOnce() -> (Vec<IpAddr>, BoxFuture<crate::l2::lan::ProbeResults>) + use<L>> {
        let Some(host) = held.host() else {
            return Vec::new();
        };
        let interfaces = Interfaces::of(host);
        let mut by_link: BTreeMap<(u32, Mac), Vec<IpAddr>> = BTreeMap::new();
        for ip in ips {
            let link = interfaces
                .choose(*ip, held.interface_override(), self.desired.interface(*ip))
                .ok()
                .and_then(|l| Some((l.index, Mac(l.mac?))));
            if let Some(link) = link {
                by_link.entry(link).or_default().push(*ip);
            }
        }
        let config = self.standby.config().check;
        by_link
            .into_iter()
            .map(|((ifindex, mac), ips)| {
                let lan = self.lan.clone();
                move || {
                    let probe = lan.probe_many(ifindex, mac, ips.clone(), config);
                    (ips, probe)
                }
            })
            .collect()
    }

    /// A step-down's check ended: the IPs held elsewhere stay stepped down (until the
    /// nodes hear each other again), the others are taken back. Returns whether any.
    fn on_standby_checked(&mut self, (standby, asked, elsewhere): StandbyDone) -> bool {
        for ip in &elsewhere {
            if self.step_downs.is_stepped_down(*ip) {
                info!(%ip, %standby, "another node holds the IP stepped down here: it stays there until the nodes hear each other again");
            }
        }
        let back = self.step_downs.retake(&standby, &asked, &elsewhere);
        for ip in &back {
            warn!(%ip, %standby, within = ?STANDBY_CHECK, "no evidence that another node holds the IP stepped down here (nobody answers for it on the LAN): holding it again; stepped down again only after the standby acks again");
            self.metrics.inc("retaken");
        }
        !back.is_empty()
    }

    /// Publishes the adverts to send: one stream per standby, address and interface, with
    /// the IPs held there (aliases on a link with carrier: `links_up`) whose line names
    /// that standby. The standby of an IP stepped down gets its stream too, without the
    /// IP: its acks tell when the nodes hear each other again.
    ///
    /// Also keeps the holder's pairs: the IPs held, by standby and relay.
    pub fn publish(&mut self, held: Held<'_>, links_up: &BTreeMap<u32, bool>) {
        type Key = (String, IpAddr, String, Option<IpAddr>);
        let desired = &self.desired;
        let mut streams: BTreeMap<Key, Vec<IpAddr>> = BTreeMap::new();
        let mut pairs: BTreeMap<Pair, Vec<IpAddr>> = BTreeMap::new();
        for alias in held.aliases() {
            let Some(peer) = desired.peer(alias.ip) else {
                continue;
            };
            if !self.step_downs.is_stepped_down(alias.ip) {
                let relay = desired.relay_node(alias.ip).map(str::to_owned);
                pairs
                    .entry((peer.node.clone(), relay))
                    .or_default()
                    .push(alias.ip);
            }
            if links_up.get(&alias.ifindex) == Some(&false) {
                continue;
            }
            let relay = desired.relay(alias.ip);
            streams
                .entry((peer.node.clone(), peer.address, alias.ifname.clone(), relay))
                .or_default()
                .push(alias.ip);
        }
        self.pairs = pairs;
        let Some(tx) = &self.streams else {
            return;
        };
        let interfaces = held.host().map(Interfaces::of);
        for (ip, _) in self.step_downs.stepped_down() {
            let interface = interfaces
                .as_ref()
                .and_then(|i| {
                    i.choose(ip, held.interface_override(), desired.interface(ip))
                        .ok()
                })
                .map(|l| l.name.clone());
            let (Some(peer), Some(interface)) = (desired.peer(ip), interface) else {
                continue;
            };
            let relay = desired.relay(ip);
            streams
                .entry((peer.node.clone(), peer.address, interface, relay))
                .or_default();
        }
        let streams: Vec<Stream> = streams
            .into_iter()
            .map(|((to, address, interface, relay), ips)| Stream {
                to,
                address,
                interface,
                relay,
                ips,
            })
            .collect();
        tx.send_if_modified(|current| {
            let changed = *current != streams;
            if changed {
                *current = streams;
            }
            changed
        });
    }
}

/// What a finished task returned; a task that panicked is logged.
fn joined<T>(done: Result<T, JoinError>, what: &str) -> Option<T> {
    done.map_err(|e| error!(error = %e, "{what} failed")).ok()
}
