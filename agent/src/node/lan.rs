//! The run loop's LAN side: the probes the guard asks for (spawned, their results come back
//! into the loop), the claims the LAN watch saw, the defences, and what the LAN port is
//! told to watch. The decisions are the pure [`Guard`](crate::l2::guard::Guard)'s.

use super::*;

impl<B, S, L> Node<B, S, L>
where
    B: AddressBackend,
    S: ShieldBackend,
    L: LanPort,
{
    /// Starts the probes the guard asks for, one `probe_many` per interface.
    pub(super) fn start_probes(&mut self) {
        let held = self.held();
        let due = self
            .guard
            .due_probes(&self.desired, &held, Instant::now().into_std());
        if due.is_empty() {
            return;
        }
        let Some(host) = self.aliases.last_snapshot() else {
            for p in due {
                self.guard.probe_failed(p.ip, Instant::now().into_std());
            }
            return;
        };
        let mut by_link: BTreeMap<u32, (String, Mac, Vec<IpAddr>)> = BTreeMap::new();
        let mut unprobed = Vec::new();
        let interfaces = Interfaces::of(host);
        for ProbeRequest { ip, ifindex } in due {
            match probe_link(
                &interfaces,
                &self.desired,
                self.aliases.interface_override(),
                ip,
                ifindex,
            ) {
                Some((link, mac)) => by_link
                    .entry(link.index)
                    .or_insert_with(|| (link.name.clone(), mac, Vec::new()))
                    .2
                    .push(ip),
                None => unprobed.push(ip),
            }
        }
        for ip in unprobed {
            debug!(%ip, "no Ethernet interface to probe on: retried later");
            self.guard.probe_failed(ip, Instant::now().into_std());
        }
        for (ifindex, (ifname, mac, ips)) in by_link {
            debug!(interface = %ifname, ips = ips.len(), "probing before a first claim");
            let probe = self
                .lan
                .probe_many(ifindex, mac, ips.clone(), self.probe_config);
            let limit = self.probe_config.window() + PROBE_GRACE;
            self.probes.spawn(async move {
                let result = tokio::time::timeout(limit, probe)
                    .await
                    .unwrap_or_else(|_| {
                        Err(LanError::Io {
                            ifindex,
                            source: std::io::Error::new(
                                std::io::ErrorKind::TimedOut,
                                format!("the probe did not finish within {limit:?}"),
                            ),
                        })
                    });
                (ifindex, ifname, ips, result)
            });
        }
    }

    /// Hands a finished probe to the guard.
    pub(super) fn on_probe(&mut self, (ifindex, ifname, ips, result): ProbeDone) {
        let now = Instant::now().into_std();
        let outcomes = match result {
            Ok(outcomes) => outcomes,
            Err(e) => {
                warn!(interface = %ifname, error = %e, ips = ips.len(), "cannot probe: first claims wait, retried with backoff");
                for ip in ips {
                    self.metrics.inc_probe(ProbeMetric::Failed);
                    self.guard.probe_failed(ip, now);
                }
                return;
            }
        };
        for ip in ips {
            let Some(outcome) = outcomes.get(&ip).copied() else {
                self.metrics.inc_probe(ProbeMetric::Failed);
                self.guard.probe_failed(ip, now);
                continue;
            };
            let who = match outcome {
                ProbeOutcome::Free => {
                    self.metrics.inc_probe(ProbeMetric::Free);
                    None
                }
                ProbeOutcome::Taken { mac } => {
                    self.metrics.inc_probe(ProbeMetric::Taken);
                    Some(self.sighting(mac, ifindex, Some(&ifname)))
                }
            };
            let mac = who.as_ref().map(|w| w.mac);
            match self
                .guard
                .probe_result(ip, outcome, who, &self.desired, now)
            {
                ProbeChange::Conflict => {
                    warn!(%ip, interface = %ifname, mac = ?mac.map(|m| m.to_string()), "address conflict: another host answered the probe; not taken")
                }
                ProbeChange::ConflictGone => {
                    info!(%ip, interface = %ifname, "conflict over: nobody answers the probe any more")
                }
                ProbeChange::Cleared => debug!(%ip, interface = %ifname, "probe: free"),
                ProbeChange::StillTaken => {
                    debug!(%ip, interface = %ifname, "re-probe: still taken")
                }
                ProbeChange::Nothing => {}
            }
        }
    }

    /// Hands claims seen on the LAN to the guard and does what it says; returns what must
    /// follow at once.
    pub(super) fn on_claims(&mut self, claims: &[LanClaim]) -> After {
        let held = self.held();
        let now = Instant::now();
        let fresh = self.authority.is_fresh(now);
        let mut after = After::Nothing;
        for claim in claims {
            let who = self.sighting(claim.mac, claim.ifindex, None);
            // An IP taken over from its holder goes back when that holder speaks for it.
            if claim.kind == ClaimKind::Uses && self.holder_claims(claim.ip, who.node.as_deref()) {
                after = After::Reconcile;
                continue;
            }
            let (ip, mac, ifname) = (claim.ip, claim.mac, who.ifname.clone());
            let link = self.own_link(ip);
            let verdict = self.guard.observe(
                claim,
                who,
                &self.desired,
                &held,
                fresh,
                link,
                now.into_std(),
            );
            let needs = match &verdict {
                Verdict::Ignore | Verdict::Elsewhere => After::Nothing,
                Verdict::Defend { .. } | Verdict::Defended | Verdict::Taken => After::Publish,
                Verdict::Yield { .. } | Verdict::Remove => After::Reconcile,
            };
            match &verdict {
                Verdict::Ignore => continue,
                Verdict::Elsewhere => {
                    self.metrics.inc_claim_elsewhere();
                    debug!(%ip, interface = %ifname, %mac, "a claim heard on another link than the address's own: ignored");
                    continue;
                }
                Verdict::Yield { node } => {
                    self.metrics.inc_yield();
                    warn!(%ip, interface = %ifname, %mac, %node, "another node claims a held IP while this agent's Lease is stale: yielding it");
                }
                Verdict::Remove => {
                    warn!(%ip, interface = %ifname, %mac, "a host that is not a node of this cluster claims a held IP while this agent's Lease is stale: removing it");
                }
                Verdict::Defend { node: Some(node) } => {
                    self.defend(ip);
                    warn!(%ip, interface = %ifname, %mac, %node, "another node claims a held IP while this agent's Lease is fresh: defended");
                }
                Verdict::Defend { node: None } => {
                    self.defend(ip);
                    warn!(%ip, interface = %ifname, %mac, "a host that is not a node of this cluster claims a held IP while this agent's Lease is fresh: defended, kept");
                }
                Verdict::Defended => {
                    debug!(%ip, %mac, "claimed again within the defence interval")
                }
                Verdict::Taken => {
                    warn!(%ip, interface = %ifname, %mac, "another host claims an IP being probed: not taken")
                }
            }
            after = after.max(needs);
        }
        after
    }

    /// Sends one defence of held `ip` from its link's MAC.
    fn defend(&self, ip: IpAddr) {
        let Some(alias) = self.aliases.owned_alias(ip) else {
            return;
        };
        let mac = self
            .aliases
            .last_snapshot()
            .and_then(|h| h.links.iter().find(|l| l.index == alias.ifindex))
            .and_then(|l| l.mac);
        let Some(mac) = mac else {
            debug!(alias = %alias, "link has no Ethernet address: no defence");
            return;
        };
        match self.lan.defend(alias.ifindex, Mac(mac), ip) {
            Ok(()) => self.metrics.inc_defence(),
            Err(e) => warn!(alias = %alias, error = %e, "defence not sent"),
        }
    }

    /// The link `ip`'s claims count on: its alias's, else the one its alias would go on
    /// (where a first claim is probed). `None`: no such link.
    fn own_link(&self, ip: IpAddr) -> Option<u32> {
        // Per claim, and a flood of forged claims must stay cheap: a look-up, not a scan.
        if let Some(alias) = self.aliases.owned_alias(ip) {
            return Some(alias.ifindex);
        }
        let host = self.aliases.last_snapshot()?;
        probe_link(
            &Interfaces::of(host),
            &self.desired,
            self.aliases.interface_override(),
            ip,
            None,
        )
        .map(|(link, _)| link.index)
    }

    /// Who `mac` is, seen on `ifindex`.
    fn sighting(&self, mac: Mac, ifindex: u32, ifname: Option<&str>) -> Sighting {
        let ifname = ifname.map(str::to_owned).unwrap_or_else(|| {
            self.aliases
                .last_snapshot()
                .and_then(|h| h.links.iter().find(|l| l.index == ifindex))
                .map_or_else(|| format!("if{ifindex}"), |l| l.name.clone())
        });
        Sighting {
            mac,
            node: self.desired.node_of_mac(mac).map(str::to_owned),
            ifindex,
            ifname,
        }
    }

    /// Tells the LAN port the links (with our MACs), and the IPs held when they changed.
    pub(super) fn tell_lan(&mut self) {
        if let Some(host) = self.aliases.last_snapshot() {
            // The node's own links only: no socket (and thread) per pod veth or CNI
            // bridge, and no MAC of theirs in the report. A link an L2 alias is on counts
            // as the node's whatever its kind (`--interface` or the pool's `interface`
            // may name a veth or bridge without an address of the node).
            let carrying: BTreeSet<u32> = self
                .aliases
                .owned()
                .filter(|a| !self.desired.is_routed(a.ip))
                .map(|a| a.ifindex)
                .collect();
            let interfaces: Vec<(u32, Mac)> = host
                .links
                .iter()
                .filter(|l| host::is_node_link(host, l) || carrying.contains(&l.index))
                .filter_map(|l| Some((l.index, Mac(l.mac?))))
                // Loopback's all-zero address is no Ethernet interface.
                .filter(|(_, mac)| mac.0 != [0; 6])
                .collect();
            // Every time, not only on a change: the port retries there the sockets it
            // could not open (cheap when nothing changed).
            self.lan.set_interfaces(&interfaces);
            self.lan_interfaces = interfaces;
        }
        // Routed (L3) addresses are on no LAN: nobody else's claim is news for them.
        let mut watched = self.aliases.held_ips();
        watched.retain(|ip| !self.desired.is_routed(*ip));
        if watched != self.lan_watched {
            self.lan.set_watched(&watched);
            self.lan_watched = watched;
        }
    }
}

/// The link and our MAC on it to probe `ip` on: where the conflict was seen (`hint`), else
/// the interface the alias would go on. `None`: no such link, or it has no Ethernet address.
fn probe_link<'a>(
    interfaces: &Interfaces<'a>,
    desired: &DesiredSet,
    interface_override: Option<&str>,
    ip: IpAddr,
    hint: Option<u32>,
) -> Option<(&'a Link, Mac)> {
    let host = interfaces.host();
    let link = match hint.and_then(|i| host.links.iter().find(|l| l.index == i)) {
        Some(link) => link,
        None => interfaces
            .choose(ip, interface_override, desired.interface(ip))
            .ok()?,
    };
    Some((link, Mac(link.mac?)))
}
