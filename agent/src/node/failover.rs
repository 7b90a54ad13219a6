//! The run loop's fast-failover side: the adverts heard, the LAN checks before a takeover
//! (spawned, their results come back into the loop), the streams of adverts to send; on
//! the holder, the acks heard and the step-downs of IPs nobody acks. The decisions are the
//! pure [`Failover`](crate::l2::failover::Failover)'s and [`Fence`]'s.

use super::*;

/// How long a holder that stepped down waits for its standby's Lease to show the IP held
/// before it takes the IP back (no evidence: a dead standby, or no API). The standby writes
/// its report at once after a takeover, so about 0.5 s after the step-down.
pub(super) const STANDBY_CHECK: Duration = Duration::from_secs(1);

impl<B, S, L> Node<B, S, L>
where
    B: AddressBackend,
    S: ShieldBackend,
    L: LanPort,
{
    /// Hands adverts to the failover state and acks to the fence; returns whether IPs
    /// taken over go back to their holder or step-downs were lifted (a reconcile must
    /// remove or add them now).
    pub(super) fn on_messages(&mut self, messages: Vec<Message>) -> bool {
        let now = Instant::now().into_std();
        let mut back = false;
        for message in messages {
            let advert = match message {
                Message::Advert(advert) => advert,
                Message::Ack(ack) => {
                    self.metrics.inc_advert_received("ack");
                    match self.fence.acked(&ack, now) {
                        Acked::Accepted { lifted } => {
                            for ip in lifted {
                                info!(%ip, by = %ack.from, "acked again: the nodes hear this one again, the IP stepped down is held again");
                                self.metrics.inc_failover("lifted");
                                back = true;
                            }
                        }
                        Acked::Stale => self.metrics.inc_advert_received("replayed"),
                    }
                    continue;
                }
            };
            let advert = &advert;
            match self.failover.heard(advert, now) {
                Heard::Accepted { give_back } => {
                    self.metrics.inc_advert_received("accepted");
                    for ip in give_back {
                        info!(%ip, holder = %advert.from, "the holder is back and holds the IP: giving the takeover back");
                        self.metrics.inc_failover("given_back");
                        back = true;
                    }
                }
                Heard::NotForMe => self.metrics.inc_advert_received("not_for_me"),
                Heard::Duplicate => self.metrics.inc_advert_received("duplicate"),
                Heard::Stale => self.metrics.inc_advert_received("replayed"),
            }
        }
        back
    }

    /// Starts a LAN check of every standby IP whose holder went silent.
    pub(super) fn start_checks(&mut self) {
        let now = Instant::now().into_std();
        let due = self.failover.due(&self.desired, now);
        let Some(host) = self.aliases.last_snapshot() else {
            return;
        };
        let interfaces = Interfaces::of(host);
        let config = self.failover.config().check;
        let limit = config.window() + Duration::from_millis(200);
        for (ip, holder) in due {
            let assigned = self
                .desired
                .standby(ip)
                .and_then(|l| l.interface.as_deref());
            let link = self
                .lan_link(&interfaces, ip, assigned)
                .filter(|l| l.up)
                .and_then(|l| Some((l.index, Mac(l.mac?))));
            let Some((ifindex, mac)) = link else {
                debug!(%ip, "no Ethernet interface up for this standby IP: no takeover");
                continue;
            };
            warn!(%ip, %holder, silent_for = ?self.failover.config().dead, "the holder's adverts stopped: checking the LAN before taking the IP over");
            self.failover.checking(ip);
            let probe = self.lan.probe_many(ifindex, mac, vec![ip], config);
            self.checks.spawn(async move {
                let free = match tokio::time::timeout(limit, probe).await {
                    Ok(Ok(outcomes)) => outcomes.get(&ip) == Some(&ProbeOutcome::Free),
                    // Cannot tell: not free (a takeover needs the LAN to say so).
                    _ => false,
                };
                (ip, free)
            });
        }
    }

    /// A check finished; returns whether the IP was taken over (a reconcile adds it now).
    pub(super) fn on_check(&mut self, (ip, free): CheckDone) -> bool {
        let taken = self
            .failover
            .checked(ip, free, &self.desired, Instant::now().into_std());
        if taken {
            warn!(%ip, "nobody answers for the IP and its holder is silent: taking it over");
            self.metrics.inc_failover("taken_over");
            // Silent to this node is not dead: a holder cut off from the other nodes but
            // not from its clients still renews its Lease and reports the IP held.
            if let Some(line) = self.desired.standby(ip) {
                let holder = line.holder.clone();
                self.check_holder(holder, vec![ip]);
            }
        } else if !free {
            debug!(%ip, "the IP is still answered on the LAN: its holder keeps it");
            self.metrics.inc_failover("still_answered");
        }
        taken
    }

    /// Asks whether `holder` is alive and holds `ips` (its Lease), one check per holder
    /// at a time: IPs taken over from a holder already being checked wait for the next
    /// check, so a holder that carried many IPs costs one Lease read per poll, not one per
    /// IP.
    fn check_holder(&mut self, holder: String, ips: Vec<IpAddr>) {
        let Some(holders) = &self.holders else {
            return;
        };
        if let Some(waiting) = self.holders_checking.get_mut(&holder) {
            waiting.extend(ips);
            return;
        }
        self.holders_checking.insert(holder.clone(), Vec::new());
        let within = self.authority.lease_duration() + Duration::from_secs(1);
        let check = holders.alive_holding(&holder, ips, within);
        self.holder_checks
            .spawn(async move { (holder, check.await) });
    }

    /// A holder check ended: the IPs its holder proved it holds go back, for good (until
    /// its adverts list them again). Returns whether any did. IPs taken over from the same
    /// holder meanwhile are checked next.
    pub(super) fn on_holder_alive(&mut self, (holder, ips): (String, Vec<IpAddr>)) -> bool {
        let waiting = self.holders_checking.remove(&holder).unwrap_or_default();
        let next: Vec<IpAddr> = waiting
            .into_iter()
            .filter(|ip| !ips.contains(ip) && self.failover.taken().contains(ip))
            .collect();
        if !next.is_empty() {
            self.check_holder(holder.clone(), next);
        }
        let mut back = false;
        for ip in ips {
            if self.failover.give_back_for_good(ip) {
                warn!(%ip, %holder, "the holder renewed its Lease holding the IP, so it is alive though silent on this LAN (cut off from this node?): giving the takeover back");
                self.metrics.inc_failover("holder_alive");
                back = true;
            }
        }
        back
    }

    /// A claim of `ip` by `node` on the LAN, for an IP taken over here from that node:
    /// gives it back. Returns whether it did.
    pub(super) fn holder_claims(&mut self, ip: IpAddr, node: Option<&str>) -> bool {
        let holder = self.desired.standby(ip).map(|l| l.holder.as_str());
        if node.is_none() || holder != node || !self.failover.taken().contains(&ip) {
            return false;
        }
        info!(%ip, holder = ?node, "the holder claims the IP on the LAN: giving the takeover back");
        self.metrics.inc_failover("given_back");
        self.failover.give_back(ip)
    }

    /// When an IP held may next be stepped down (`None`: none armed, or no API to check
    /// with afterwards). O(standby and relay pairs), not O(IPs).
    pub(super) fn next_step_down(&self) -> Option<Instant> {
        self.holders.as_ref()?;
        self.fence
            .next_due(self.pairs.keys().map(Peers::of))
            .map(Instant::from_std)
    }

    /// Probes on the LAN the standby of every pair of held IPs that neither the standby
    /// nor the relay acked for [`Fence::after`]: is this node still on the standby's LAN?
    pub(super) fn probe_standbys(&mut self) {
        if self.holders.is_none() {
            return;
        }
        let now = Instant::now().into_std();
        let due: Vec<Pair> = self
            .pairs
            .keys()
            .filter(|pair| self.fence.due(Peers::of(pair), now))
            .cloned()
            .collect();
        let Some(host) = self.aliases.last_snapshot() else {
            return;
        };
        let interfaces = Interfaces::of(host);
        let config = self.failover.config().check;
        let limit = config.window() + Duration::from_millis(200);
        for pair in due {
            let Some(ip) = self.pairs.get(&pair).and_then(|ips| ips.first().copied()) else {
                continue;
            };
            let Some(address) = self.desired.peer(ip).map(|p| p.address) else {
                continue;
            };
            let link = self
                .lan_link(&interfaces, ip, self.desired.interface(ip))
                .and_then(|l| Some((l.index, Mac(l.mac?))));
            self.fence.probing(Peers::of(&pair));
            // No Ethernet link to probe from: the standby cannot be reached there either.
            let probe =
                link.map(|(ifindex, mac)| self.lan.probe_many(ifindex, mac, vec![address], config));
            debug!(standby = %pair.0, %address, "no ack from the standby nor the relay: is the standby still on this LAN?");
            self.fence_probes.spawn(async move {
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
    pub(super) fn on_standby_probed(&mut self, (pair, answered): (Pair, bool)) -> bool {
        let now = Instant::now().into_std();
        if !self.fence.probed(Peers::of(&pair), answered, now) {
            if answered {
                debug!(standby = %pair.0, "the standby's node answers on the LAN though neither it nor the relay acks: the IPs stay (its LAN check hears them answered too)");
                self.metrics.inc_failover("standby_answers");
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
            .filter(|ip| self.aliases.owned_alias(*ip).is_some())
            .collect();
        if ips.is_empty() {
            return false;
        }
        for ip in &ips {
            self.fence.step_down(*ip, Peers::of(&pair), now);
            self.metrics.inc_failover("stepped_down");
        }
        let (standby, relay) = pair;
        warn!(ips = ?ips, %standby, relay = ?relay, "neither the standby nor the relay acks this node's adverts and the standby does not answer on the LAN (cut off from the other nodes?): stepping down from the IPs before the standby takes them, so the LAN never sees two holders");
        let check = holders.alive_holding(&standby, ips.clone(), STANDBY_CHECK);
        self.standby_checks
            .spawn(async move { (standby, ips, check.await) });
        true
    }

    /// A step-down's API check ended: the IPs the standby holds stay stepped down (until
    /// the nodes hear each other again), the others are taken back. Returns whether any.
    pub(super) fn on_standby_checked(&mut self, (standby, asked, proven): StandbyDone) -> bool {
        for ip in &proven {
            if self.fence.is_stepped_down(*ip) {
                info!(%ip, %standby, "the standby holds the IP stepped down here (its Lease says so): it stays there until the nodes hear each other again");
            }
        }
        let back = self.fence.retake(&standby, &asked, &proven);
        for ip in &back {
            warn!(%ip, %standby, within = ?STANDBY_CHECK, "no evidence that the standby took the IP stepped down here (a dead standby, or no API): holding it again; stepped down again only after the standby acks again");
            self.metrics.inc_failover("retaken");
        }
        !back.is_empty()
    }

    /// The LAN link `ip` goes on (`assigned`: the interface its line names).
    fn lan_link<'h>(
        &self,
        interfaces: &Interfaces<'h>,
        ip: IpAddr,
        assigned: Option<&str>,
    ) -> Option<&'h Link> {
        interfaces
            .choose(ip, self.aliases.interface_override(), assigned)
            .ok()
    }

    /// Ends the step-downs the new desired set no longer names with the same standby.
    pub(super) fn settle_fence(&mut self) {
        let desired = &self.desired;
        let ended = self.fence.settle(|ip| {
            let peer = desired.peer(ip)?;
            Some(Peers {
                standby: &peer.node,
                relay: desired.relay_node(ip),
            })
        });
        for ip in ended {
            info!(%ip, "step-down over: the assignment changed the IP's standby or took it from this node");
        }
    }

    /// Publishes the adverts to send: one stream per standby, address and interface, with
    /// the IPs held there (aliases on a link with carrier) whose line names that standby.
    /// The standby of an IP stepped down gets its stream too, without the IP: its acks
    /// tell when the nodes hear each other again.
    ///
    /// Also keeps the fence's pairs: the IPs held, by standby and relay.
    pub(super) fn publish_streams(&mut self) {
        type Key = (String, IpAddr, String, Option<IpAddr>);
        let mut streams: BTreeMap<Key, Vec<IpAddr>> = BTreeMap::new();
        let mut pairs: BTreeMap<Pair, Vec<IpAddr>> = BTreeMap::new();
        for alias in self.aliases.owned() {
            let Some(peer) = self.desired.peer(alias.ip) else {
                continue;
            };
            if !self.fence.is_stepped_down(alias.ip) {
                let relay = self.desired.relay_node(alias.ip).map(str::to_owned);
                pairs
                    .entry((peer.node.clone(), relay))
                    .or_default()
                    .push(alias.ip);
            }
            if self.links_up.get(&alias.ifindex) == Some(&false) {
                continue;
            }
            let relay = self.desired.relay(alias.ip);
            streams
                .entry((peer.node.clone(), peer.address, alias.ifname.clone(), relay))
                .or_default()
                .push(alias.ip);
        }
        self.pairs = pairs;
        let Some(tx) = &self.streams_tx else {
            return;
        };
        let interfaces = self.aliases.last_snapshot().map(Interfaces::of);
        for (ip, _) in self.fence.stepped_down() {
            let interface = interfaces
                .as_ref()
                .and_then(|i| self.lan_link(i, ip, self.desired.interface(ip)))
                .map(|l| l.name.clone());
            let (Some(peer), Some(interface)) = (self.desired.peer(ip), interface) else {
                continue;
            };
            let relay = self.desired.relay(ip);
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
