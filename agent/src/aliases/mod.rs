//! The alias reconcile loop: desired set in, kernel changes out, report back.
//!
//! Owns the loop state (aliases we own, current conflicts, write counters). Each reconcile
//! is observe (one dump through the [`AddressBackend`]) -> pure [`plan`] -> apply only the
//! difference -> report. Kernel I/O happens only through the backend; announcements only
//! through the optional [`Announcer`]; the host-port shield only through the optional
//! [`Shield`].
//!
//! With a shield, no alias exists without its shield element: elements of the IPs to add
//! are written before the adds (an add whose element could not be written is not made, and
//! retried), elements of removed IPs after the deletes.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::Duration;

use tracing::{debug, info, instrument, warn};

use crate::desired::DesiredSet;
use crate::host::{Alias, Held, HostState, InterfaceError, Interfaces};
use crate::kernel::backend::{AddressBackend, BackendError, Lifetime, Write, write_each};
use crate::l2::announce::Announcer;
use crate::l2::vmac;
use crate::shield::{Contents, IPVS_LINK, NoShield, Shield, ShieldBackend, ShieldError};
use aliaslb_core::report::ShieldState;

pub mod metrics;

/// Settings of the alias manager.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AliasConfig {
    /// `--interface`: put every alias on this interface.
    pub interface_override: Option<String>,
    /// Lifetime of every alias (the agent lease duration).
    pub lifetime: Lifetime,
    /// L3 mode: the local device the routed addresses go on (`aliaslb0`, else `lo`).
    pub routed_device: String,
}

/// A desired IP that exists on the node as somebody else's address: not taken.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct ForeignAddress {
    /// The IP.
    pub ip: IpAddr,
    /// The interface holding the foreign address.
    pub ifname: String,
}

/// One failure of a reconcile; the rest of the reconcile still went on.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// The node's addresses could not be read: nothing was changed.
    #[error("cannot read the node's addresses: {0}")]
    Snapshot(#[source] BackendError),
    /// No interface fits the IP.
    #[error("{ip}: {source}")]
    Interface {
        /// The IP.
        ip: IpAddr,
        /// Why.
        #[source]
        source: InterfaceError,
    },
    /// A kernel write failed (retried at the next reconcile).
    #[error(transparent)]
    Write(#[from] BackendError),
    /// The host-port shield could not be written: the aliases it was to guard were not
    /// added (retried at the next reconcile).
    #[error("host-port shield: {0}")]
    Shield(#[source] ShieldError),
}

impl ReconcileError {
    /// A short stable category in snake_case, the style of every error category (the controller's
    /// metric labels use it too).
    pub fn category(&self) -> &'static str {
        match self {
            ReconcileError::Snapshot(_) => "snapshot_failed",
            ReconcileError::Interface { .. } => "no_interface",
            ReconcileError::Write(e) => e.category(),
            ReconcileError::Shield(e) => e.category(),
        }
    }
}

/// What one reconcile did.
#[derive(Debug, Default)]
pub struct ReconcileReport {
    /// Aliases put on the node by this reconcile.
    pub added: Vec<Alias>,
    /// Aliases of ours removed by this reconcile.
    pub removed: Vec<Alias>,
    /// Aliases of ours found on the node and still desired, taken over without re-adding
    /// (after a restart, or an add that raced with the dump).
    pub adopted: Vec<Alias>,
    /// Every desired IP currently held by somebody else on the node.
    pub conflicts: Vec<ForeignAddress>,
    /// What failed; those IPs are retried at the next reconcile.
    pub errors: Vec<ReconcileError>,
    /// Desired LAN IPs not added because their link has no carrier: the kernel would answer
    /// for them the instant it came back, before anyone could ask the LAN whether another
    /// node took them meanwhile. The LAN guard re-checks them once the link is back.
    pub unplugged: Vec<IpAddr>,
}

impl ReconcileReport {
    /// Whether the reconcile changed anything on the node or in what we own.
    pub fn changed(&self) -> bool {
        !(self.added.is_empty() && self.removed.is_empty() && self.adopted.is_empty())
    }
}

/// What a lifetime refresh did.
#[derive(Debug, Default)]
pub struct RefreshReport {
    /// Aliases whose lifetime was reset.
    pub refreshed: usize,
    /// Refreshes that failed.
    pub errors: Vec<ReconcileError>,
    /// Nothing was refreshed: the last complete refresh is a lifetime old or older (the
    /// agent was frozen or starved), so the kernel may have expired the aliases, and a
    /// refresh (an add that replaces) would silently re-create them, unannounced, while
    /// another node may hold them now. Reconcile instead: it reads the node afresh and
    /// adds what is missing the normal way, announced and under the LAN guard.
    pub expired: bool,
    /// How long the round took.
    pub took: Duration,
}

/// Whether a refresh round that took `took` crowds its refresh `interval`: more than half
/// of it. The kernel walks the link's address list for each refresh, so a round grows
/// faster than the aliases on one link (about a second at 10,000): the agent then spends
/// its time refreshing, and a late round lets aliases lapse.
pub fn refresh_crowded(took: Duration, interval: Duration) -> bool {
    took * 2 > interval
}

/// Kernel writes issued since start, by kind (attempts, successful or not).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteCounts {
    /// Address adds.
    pub adds: u64,
    /// Address deletes.
    pub deletes: u64,
    /// Lifetime refreshes (replace requests).
    pub refreshes: u64,
}

/// The pure decision of one reconcile.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct AliasPlan {
    /// Aliases to add.
    pub add: Vec<Alias>,
    /// Aliases of ours to remove.
    pub remove: Vec<Alias>,
    /// Aliases of ours already right.
    pub keep: Vec<Alias>,
    /// Desired IPs held by somebody else.
    pub conflicts: Vec<ForeignAddress>,
    /// Desired IPs with no interface.
    pub no_interface: Vec<(IpAddr, InterfaceError)>,
}

/// Diffs `desired` against what the node holds. Only addresses carrying our marker are
/// ever put in `remove`; a desired IP present as a foreign address is a conflict. Routed
/// (L3) addresses go on `routed_device`, the others where the assignment, `--interface`
/// (`interface_override`) or the subnets say.
pub fn plan(
    desired: &DesiredSet,
    host: &HostState,
    interface_override: Option<&str>,
    routed_device: &str,
) -> AliasPlan {
    let ifname = |index: u32| {
        host.links
            .iter()
            .find(|l| l.index == index)
            .map_or_else(|| format!("if{index}"), |l| l.name.clone())
    };
    let ours = |a: &crate::host::HostAddress| Alias {
        ip: a.ip,
        ifindex: a.ifindex,
        ifname: ifname(a.ifindex),
    };
    let mut p = AliasPlan::default();
    for a in host.addresses.iter().filter(|a| a.owned) {
        if !desired.contains(a.ip) {
            p.remove.push(ours(a));
        }
    }
    // The node's addresses by IP (a stable sort: the dump's order within an IP), so each
    // desired IP finds its own in O(log n), not by a walk of them all.
    let mut by_ip: Vec<&crate::host::HostAddress> = host.addresses.iter().collect();
    by_ip.sort_by_key(|a| a.ip);
    let interfaces = Interfaces::of(host);
    for (ip, assigned) in desired.iter() {
        let from = by_ip.partition_point(|a| a.ip < ip);
        let present = &by_ip[from..from + by_ip[from..].partition_point(|a| a.ip == ip)];
        if let Some(foreign) = present.iter().find(|a| !a.owned) {
            p.conflicts.push(ForeignAddress {
                ip,
                ifname: ifname(foreign.ifindex),
            });
        }
        let mut owned = present.iter().filter(|a| a.owned).map(|a| ours(a));
        let chosen = if desired.is_routed(ip) {
            interfaces.choose(ip, Some(routed_device), None)
        } else if let Some(mac) = desired.vmac(ip) {
            let name = vmac::link_name(mac);
            host.links
                .iter()
                .find(|l| l.name == name && vmac::is_ours(l))
                .ok_or(InterfaceError::NoSuchInterface {
                    name,
                    source_of_name: "the IP's virtual MAC",
                })
        } else {
            interfaces.choose(ip, interface_override, assigned)
        };
        let link = match chosen {
            Ok(link) => link,
            Err(e) => {
                // Keep what we hold: it stays refreshed until the interface question is
                // answered (or expires with the lease if the agent goes away).
                p.keep.extend(owned);
                p.no_interface.push((ip, e));
                continue;
            }
        };
        let mut on_link = false;
        for alias in owned.by_ref() {
            if alias.ifindex == link.index && !on_link {
                on_link = true;
                p.keep.push(alias);
            } else {
                p.remove.push(alias);
            }
        }
        let conflicted = present.iter().any(|a| !a.owned);
        if !on_link && !conflicted {
            p.add.push(Alias {
                ip,
                ifindex: link.index,
                ifname: link.name.clone(),
            });
        }
    }
    p
}

/// Owns the alias loop state and applies desired sets to the node.
#[derive(Debug)]
pub struct AliasManager<B, S = NoShield> {
    backend: B,
    config: AliasConfig,
    announcer: Option<Announcer>,
    shield: Option<Shield<S>>,
    owned: BTreeMap<IpAddr, Alias>,
    conflicts: BTreeSet<ForeignAddress>,
    writes: WriteCounts,
    /// The node as the last reconcile read it (`None` when that read failed).
    host: Option<HostState>,
    /// When a refresh last reset every lifetime (`None`: not yet, or a reconcile since
    /// [`RefreshReport::expired`]).
    refreshed_at: Option<tokio::time::Instant>,
}

impl<B: AddressBackend> AliasManager<B> {
    /// A manager that owns nothing yet: the first [`reconcile`](Self::reconcile) adopts
    /// our aliases still desired and removes the stale ones (after a crash).
    pub fn new(backend: B, config: AliasConfig) -> Self {
        AliasManager {
            backend,
            config,
            announcer: None,
            shield: None,
            owned: BTreeMap::new(),
            conflicts: BTreeSet::new(),
            writes: WriteCounts::default(),
            host: None,
            refreshed_at: None,
        }
    }
}

impl<B: AddressBackend, S: ShieldBackend> AliasManager<B, S> {
    /// Announces (GARP / unsolicited NA) every alias added or adopted from now on.
    pub fn with_announcer(mut self, announcer: Announcer) -> Self {
        self.announcer = Some(announcer);
        self
    }

    /// Guards every alias with `shield` from the next reconcile on (its first sync
    /// replaces the table a previous agent left); `None`: no shield.
    pub fn with_shield<T: ShieldBackend>(self, shield: Option<Shield<T>>) -> AliasManager<B, T> {
        AliasManager {
            backend: self.backend,
            config: self.config,
            announcer: self.announcer,
            shield,
            owned: self.owned,
            conflicts: self.conflicts,
            writes: self.writes,
            host: self.host,
            refreshed_at: self.refreshed_at,
        }
    }

    /// The host-port shield, if there is one.
    pub fn shield(&self) -> Option<&Shield<S>> {
        self.shield.as_ref()
    }

    /// The host-port shield, to look at its table ([`Shield::look`]).
    pub fn shield_mut(&mut self) -> Option<&mut Shield<S>> {
        self.shield.as_mut()
    }

    /// What the Lease report says of the shield.
    pub fn shield_state(&self) -> ShieldState {
        self.shield.as_ref().map_or(ShieldState::Off, Shield::state)
    }

    /// Removes the shield's table (SIGTERM path, after [`release_all`](Self::release_all)).
    pub async fn remove_shield(&mut self) -> Result<(), ShieldError> {
        match &mut self.shield {
            Some(shield) => shield.remove().await,
            None => Ok(()),
        }
    }

    /// The backend (e.g. to list interfaces with the same connection).
    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The node's links and addresses as the last reconcile read them, before its writes
    /// (`None` before the first reconcile and after one that could not read the node):
    /// the loop's interface report and link states come from it, without a second dump.
    pub fn last_snapshot(&self) -> Option<&HostState> {
        self.host.as_ref()
    }

    /// `--interface`, if given.
    pub fn interface_override(&self) -> Option<&str> {
        self.config.interface_override.as_deref()
    }

    /// The aliases we hold, as of the last reconcile.
    pub fn owned(&self) -> impl Iterator<Item = &Alias> {
        self.owned.values()
    }

    /// Our alias of `ip`, if we hold it. O(log n).
    pub fn owned_alias(&self, ip: IpAddr) -> Option<&Alias> {
        self.owned.get(&ip)
    }

    /// The IPs we hold, for the Lease report.
    pub fn held_ips(&self) -> Vec<IpAddr> {
        self.owned.keys().copied().collect()
    }

    /// What is held, read-only, for the parts of the agent that act on it.
    pub fn held(&self) -> Held<'_> {
        Held::new(
            &self.owned,
            self.host.as_ref(),
            self.config.interface_override.as_deref(),
        )
    }

    /// Desired IPs currently held by somebody else, as of the last reconcile.
    pub fn conflicts(&self) -> impl Iterator<Item = &ForeignAddress> {
        self.conflicts.iter()
    }

    /// Kernel writes issued since start.
    pub fn writes(&self) -> WriteCounts {
        self.writes
    }

    /// Makes the node hold exactly `desired` among our aliases: one dump, then only the
    /// difference is written. An idle reconcile writes nothing.
    #[instrument(skip_all, fields(desired = desired.len()))]
    pub async fn reconcile(&mut self, desired: &DesiredSet) -> ReconcileReport {
        let mut report = ReconcileReport::default();
        let Some(mut host) = self.read_node(&mut report).await else {
            return report;
        };
        // Virtual MACs: their macvlans first, so the aliases can go on them.
        let links = vmac::plan(desired, &host, self.config.interface_override.as_deref());
        if !links.create.is_empty() {
            for macvlan in &links.create {
                match self.backend.add_macvlan(macvlan).await {
                    Ok(()) => info!(
                        link = macvlan.name,
                        mac = %macvlan.mac,
                        parent = macvlan.parent_name,
                        "virtual MAC link created"
                    ),
                    Err(e) => {
                        warn!(link = macvlan.name, error = %e, "virtual MAC link not created");
                        report.errors.push(e.into());
                    }
                }
            }
            host = match self.read_node(&mut report).await {
                Some(host) => host,
                None => return report,
            };
        }
        let mut plan = plan(
            desired,
            &host,
            self.config.interface_override.as_deref(),
            &self.config.routed_device,
        );
        // Why a virtual MAC's link is missing says more than that it is.
        for (ip, why) in links.no_parent {
            plan.no_interface.retain(|(i, _)| *i != ip);
            plan.no_interface.push((ip, why));
        }
        // No alias goes on a link without carrier (see `ReconcileReport::unplugged`);
        // routed addresses are not on the LAN.
        let (add, unplugged): (Vec<Alias>, Vec<Alias>) = plan
            .add
            .into_iter()
            .partition(|a| desired.is_routed(a.ip) || host.has_carrier(a.ifindex));
        plan.add = add;
        for alias in &unplugged {
            debug!(alias = %alias, "not added: its link has no carrier (re-checked on the LAN when it is back)");
        }
        report.unplugged = unplugged.into_iter().map(|a| a.ip).collect();
        if let Some(shield) = &mut self.shield {
            shield.set_ipvs(host.links.iter().any(|l| l.name == IPVS_LINK));
            // Before any alias appears: every IP kept or added is shielded, and the IPs
            // being removed stay shielded until they are gone.
            let mut before = shield_target(desired, plan.keep.iter().chain(&plan.add));
            keep_shielded(
                &mut before,
                shield.contents(),
                plan.remove.iter().map(|a| a.ip),
            );
            if let Err(e) = shield.sync(before).await {
                // Fail closed: no new alias without its shield element.
                for alias in plan.add.drain(..) {
                    warn!(alias = %alias, "not added: its shield element could not be written");
                }
                report.errors.push(ReconcileError::Shield(e));
            }
        }
        let mut owned: BTreeMap<IpAddr, Alias> = BTreeMap::new();
        for alias in plan.keep {
            if !self.owned.contains_key(&alias.ip) {
                info!(alias = %alias, "adopted");
                report.adopted.push(alias.clone());
            }
            owned.insert(alias.ip, alias);
        }

        let backend = &self.backend;
        self.writes.deletes += plan.remove.len() as u64;
        let deletes = write_each(backend, Write::Delete, &plan.remove).await;
        let mut undeleted = Vec::new();
        for (alias, result) in deletes {
            match result {
                Ok(changed) => {
                    info!(alias = %alias, changed, "removed");
                    if let Some(a) = &self.announcer {
                        a.cancel(alias.ip);
                    }
                    if changed {
                        report.removed.push(alias.clone());
                    }
                }
                // Not retried as such: it is not desired, so it is not refreshed either,
                // and the kernel drops it when its lifetime runs out.
                Err(e) => {
                    warn!(alias = %alias, error = %e, "remove failed");
                    undeleted.push(alias.ip);
                    report.errors.push(e.into());
                }
            }
        }

        let lifetime = self.config.lifetime;
        self.writes.adds += plan.add.len() as u64;
        let adds = write_each(backend, Write::Add(lifetime), &plan.add).await;
        for (alias, result) in adds {
            match result {
                Ok(changed) => {
                    info!(alias = %alias, changed, "added");
                    if changed {
                        report.added.push(alias.clone());
                    } else {
                        report.adopted.push(alias.clone());
                    }
                    owned.insert(alias.ip, alias.clone());
                }
                Err(e) => {
                    warn!(alias = %alias, error = %e, "add failed; retried at the next reconcile");
                    report.errors.push(e.into());
                }
            }
        }

        for (ip, source) in plan.no_interface {
            warn!(%ip, error = %source, "no interface for alias");
            report.errors.push(ReconcileError::Interface { ip, source });
        }
        // After the deletes of their aliases: the macvlans nothing needs any more.
        for (index, name) in &links.delete {
            match backend.delete_link(*index, name).await {
                Ok(()) => info!(link = name, "virtual MAC link removed"),
                Err(e) => {
                    warn!(link = name, error = %e, "virtual MAC link not removed");
                    report.errors.push(e.into());
                }
            }
        }
        let conflicts: BTreeSet<ForeignAddress> = plan.conflicts.into_iter().collect();
        for c in conflicts.difference(&self.conflicts) {
            warn!(ip = %c.ip, interface = %c.ifname, "address conflict: IP held by another owner on this node");
        }
        report.conflicts = conflicts.iter().cloned().collect();
        self.conflicts = conflicts;
        if let Some(shield) = &mut self.shield {
            // After the deletes: what is gone loses its elements; an alias whose delete
            // failed is still on the node and keeps them.
            let mut after = shield_target(desired, owned.values());
            keep_shielded(&mut after, shield.contents(), undeleted);
            if let Err(e) = shield.sync(after).await {
                report.errors.push(ReconcileError::Shield(e));
            }
        }
        self.owned = owned;

        if let Some(announcer) = &self.announcer {
            // Routed addresses are announced by the routing daemon, never on the LAN.
            let on_lan = |a: &&Alias| !desired.is_routed(a.ip);
            for alias in report.added.iter().chain(&report.adopted).filter(on_lan) {
                let mac = host
                    .links
                    .iter()
                    .find(|l| l.index == alias.ifindex)
                    .and_then(|l| l.mac);
                match mac {
                    Some(mac) => announcer.announce(alias, mac),
                    None => debug!(alias = %alias, "link has no Ethernet address: not announced"),
                }
            }
        }
        self.host = Some(host);
        report
    }

    /// One dump of the node; `None` (and the error in `report`) when it cannot be read.
    async fn read_node(&mut self, report: &mut ReconcileReport) -> Option<HostState> {
        match self.backend.snapshot().await {
            Ok(h) => Some(h),
            Err(e) => {
                warn!(error = %e, "reconcile: cannot read the node's addresses");
                report.errors.push(ReconcileError::Snapshot(e));
                self.host = None;
                None
            }
        }
    }

    /// Resets the lifetime of every alias we hold (the heartbeat calls this every renew
    /// interval). A refresh of an alias deleted meanwhile re-creates it.
    #[instrument(skip_all, fields(owned = self.owned.len()))]
    pub async fn refresh_lifetimes(&mut self) -> RefreshReport {
        let lifetime = self.config.lifetime;
        let now = tokio::time::Instant::now();
        let window = std::time::Duration::from_secs(lifetime.seconds.into());
        if self
            .refreshed_at
            .is_some_and(|at| now.saturating_duration_since(at) >= window)
        {
            warn!(
                since_ms = now
                    .saturating_duration_since(self.refreshed_at.unwrap_or(now))
                    .as_millis(),
                "the last lifetime refresh is a lifetime old (agent frozen or starved?): not \
                 re-creating expired aliases blindly; reconciling from a fresh read instead"
            );
            self.refreshed_at = None;
            return RefreshReport {
                expired: true,
                ..RefreshReport::default()
            };
        }
        self.writes.refreshes += self.owned.len() as u64;
        let backend = &self.backend;
        let results = write_each(backend, Write::Refresh(lifetime), self.owned.values()).await;
        let mut report = RefreshReport::default();
        for (alias, result) in results {
            match result {
                Ok(_) => report.refreshed += 1,
                Err(e) => {
                    warn!(alias = %alias, error = %e, "lifetime refresh failed");
                    report.errors.push(e.into());
                }
            }
        }
        if report.errors.is_empty() {
            self.refreshed_at = Some(now);
        }
        report.took = now.elapsed();
        report
    }

    /// Removes every alias of ours from the node (SIGTERM path): those the kernel lists
    /// with our marker, and those we hold if the node cannot be read.
    #[instrument(skip_all)]
    pub async fn release_all(&mut self) -> ReconcileReport {
        let mut report = self.reconcile(&DesiredSet::new()).await;
        if !report.errors.is_empty() && !self.owned.is_empty() {
            let held: Vec<Alias> = std::mem::take(&mut self.owned).into_values().collect();
            self.writes.deletes += held.len() as u64;
            for alias in held {
                match self.backend.delete(&alias).await {
                    Ok(true) => report.removed.push(alias),
                    Ok(false) => {}
                    Err(e) => report.errors.push(e.into()),
                }
            }
        }
        report
    }
}

/// The shield contents for `aliases`: each IP with the ports `desired` opens on it.
fn shield_target<'a>(
    desired: &DesiredSet,
    aliases: impl IntoIterator<Item = &'a Alias>,
) -> Contents {
    let mut target = Contents::new();
    for alias in aliases {
        target.open(alias.ip, desired.ports(alias.ip));
    }
    target
}

/// Adds `ips` to `target`, with the ports `current` opens on them.
fn keep_shielded(target: &mut Contents, current: &Contents, ips: impl IntoIterator<Item = IpAddr>) {
    for ip in ips {
        // Shielded even when the table does not know it yet (an alias a previous agent
        // left, about to be deleted): then with no port open.
        target.open(ip, current.ports(ip));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::{HostAddress, Link};

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn host() -> HostState {
        let link = |index: u32, name: &str| Link {
            index,
            name: name.into(),
            mac: None,
            kind: None,
            up: true,
            parent: None,
        };
        HostState {
            links: vec![link(2, "eth0"), link(3, "eth1")],
            addresses: vec![
                node_addr(2, "192.168.1.10", 24),
                node_addr(3, "10.0.0.2", 24),
            ],
            default_v4: Some(2),
            default_v6: None,
        }
    }

    fn node_addr(ifindex: u32, a: &str, prefix_len: u8) -> HostAddress {
        HostAddress {
            ip: ip(a),
            prefix_len,
            ifindex,
            owned: false,
            global: true,
        }
    }

    fn ours(ifindex: u32, a: &str) -> HostAddress {
        HostAddress {
            owned: true,
            ..node_addr(ifindex, a, 32)
        }
    }

    fn alias(ifindex: u32, ifname: &str, a: &str) -> Alias {
        Alias {
            ip: ip(a),
            ifindex,
            ifname: ifname.into(),
        }
    }

    fn desired(ips: &[&str]) -> DesiredSet {
        ips.iter().map(|s| (ip(s), None)).collect()
    }

    #[test]
    fn plan_adds_missing_on_subnet_interface_and_removes_stale_owned_only() {
        let mut h = host();
        h.addresses.push(ours(3, "10.0.0.60"));
        let p = plan(&desired(&["10.0.0.50", "172.16.0.1"]), &h, None, "lo");
        assert_eq!(
            p.add,
            vec![
                alias(3, "eth1", "10.0.0.50"),
                alias(2, "eth0", "172.16.0.1")
            ]
        );
        assert_eq!(p.remove, vec![alias(3, "eth1", "10.0.0.60")]);
        assert!(p.keep.is_empty() && p.conflicts.is_empty());
    }

    #[test]
    fn plan_keeps_owned_and_moves_when_interface_changes() {
        let mut h = host();
        h.addresses.push(ours(3, "10.0.0.50"));
        h.addresses.push(ours(3, "10.0.0.51"));
        let mut d = desired(&["10.0.0.50"]);
        d.insert(ip("10.0.0.51"), Some("eth0".into()));
        let p = plan(&d, &h, None, "lo");
        assert_eq!(p.keep, vec![alias(3, "eth1", "10.0.0.50")]);
        assert_eq!(p.remove, vec![alias(3, "eth1", "10.0.0.51")]);
        assert_eq!(p.add, vec![alias(2, "eth0", "10.0.0.51")]);
    }

    #[test]
    fn plan_finds_each_ips_addresses_among_many_in_any_order() {
        let mut h = host();
        // 10.0.0.51 held on eth0 (not its subnet's link) before it is held on eth1.
        h.addresses.push(ours(2, "10.0.0.51"));
        let many: Vec<String> = (100..300)
            .rev()
            .map(|i| format!("10.0.{}.{}", i / 250, i % 250))
            .collect();
        for a in &many {
            h.addresses.push(ours(3, a));
        }
        h.addresses.push(ours(3, "10.0.0.51"));
        let even: Vec<&str> = many
            .iter()
            .filter(|a| a.ends_with(['0', '2', '4', '6', '8']))
            .map(String::as_str)
            .collect();
        let mut want = even.clone();
        want.push("10.0.0.51");
        let d: DesiredSet = want.iter().map(|a| (ip(a), Some("eth1".into()))).collect();
        let p = plan(&d, &h, None, "lo");
        assert!(p.add.is_empty() && p.conflicts.is_empty(), "{p:?}");
        let mut kept: Vec<IpAddr> = p.keep.iter().map(|a| a.ip).collect();
        kept.sort();
        let mut expect_kept: Vec<IpAddr> = want.iter().map(|a| ip(a)).collect();
        expect_kept.sort();
        assert_eq!(kept, expect_kept);
        assert!(p.keep.contains(&alias(3, "eth1", "10.0.0.51")));
        let mut removed: Vec<Alias> = p.remove.clone();
        removed.sort_by_key(|a| (a.ip, a.ifindex));
        let mut expect_removed: Vec<Alias> = many
            .iter()
            .filter(|a| !even.contains(&a.as_str()))
            .map(|a| alias(3, "eth1", a))
            .chain([alias(2, "eth0", "10.0.0.51")])
            .collect();
        expect_removed.sort_by_key(|a| (a.ip, a.ifindex));
        assert_eq!(removed, expect_removed);
    }

    #[test]
    fn plan_never_takes_or_removes_foreign_addresses() {
        let h = host();
        let p = plan(&desired(&["10.0.0.2"]), &h, None, "lo");
        assert_eq!(
            p.conflicts,
            vec![ForeignAddress {
                ip: ip("10.0.0.2"),
                ifname: "eth1".into()
            }]
        );
        assert!(p.add.is_empty() && p.remove.is_empty());
        let empty = plan(&DesiredSet::new(), &h, None, "lo");
        assert_eq!(empty, AliasPlan::default());
    }

    #[test]
    fn plan_reports_missing_interface() {
        let p = plan(&desired(&["10.0.0.50"]), &host(), Some("bond0"), "lo");
        assert!(p.add.is_empty());
        assert_eq!(p.no_interface.len(), 1);
        assert_eq!(p.no_interface[0].0, ip("10.0.0.50"));
    }
}
