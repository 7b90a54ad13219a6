//! The run loop's fast-failover side: the adverts heard, the LAN checks before a takeover
//! (spawned, their results come back into the loop), the streams of adverts to send. The
//! decisions are the pure [`Failover`](crate::l2::failover::Failover)'s.

use super::*;

impl<B, S, L> Node<B, S, L>
where
    B: AddressBackend,
    S: ShieldBackend,
    L: LanPort,
{
    /// Hands adverts to the failover state; returns whether IPs taken over go back to
    /// their holder (a reconcile must remove them now).
    pub(super) fn on_adverts(&mut self, adverts: &[Advert]) -> bool {
        let now = Instant::now().into_std();
        let mut back = false;
        for advert in adverts {
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
        let config = self.failover.config().check;
        let limit = config.window() + Duration::from_millis(200);
        for (ip, holder) in due {
            let assigned = self
                .desired
                .standby(ip)
                .and_then(|l| l.interface.as_deref());
            let link =
                host::choose_interface(host, ip, self.aliases.interface_override(), assigned)
                    .ok()
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

    /// Publishes the adverts to send: one stream per standby, address and interface, with
    /// the IPs held there (aliases on a link with carrier) whose line names that standby.
    pub(super) fn publish_streams(&self) {
        let Some(tx) = &self.streams_tx else {
            return;
        };
        type Key = (String, IpAddr, String, Option<IpAddr>);
        let mut streams: BTreeMap<Key, Vec<IpAddr>> = BTreeMap::new();
        for alias in self.aliases.owned() {
            if self.links_up.get(&alias.ifindex) == Some(&false) {
                continue;
            }
            let Some(peer) = self.desired.peer(alias.ip) else {
                continue;
            };
            let relay = self.desired.relay(alias.ip);
            streams
                .entry((peer.node.clone(), peer.address, alias.ifname.clone(), relay))
                .or_default()
                .push(alias.ip);
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
