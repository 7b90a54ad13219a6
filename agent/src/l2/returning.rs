//! A returning holder asks the LAN first. An agent that starts while its node's kernel
//! still has LAN aliases of ours (a restart within their lifetime, a node whose link and
//! agent come back after its standby took its IPs over) must not answer for an IP another
//! node holds now: two MACs would answer for it.
//!
//! So, at start, before anything else: the kernel's ARP replies and neighbour
//! advertisements for those IPs are silenced (a table of our own, `aliaslb-quiet`, in the
//! nftables families `arp` and `ip6`: the aliases stay, established flows do not notice),
//! each IP is probed on its link ([`RETURN_PROBE`], about 25 ms), an IP another MAC answers
//! for is taken down at once, and the silence is lifted. The IPs taken down are re-checked
//! by the LAN guard once the assignment says whether they are still this node's. Without
//! nftables (or if the table cannot be written) every such alias is taken down first
//! instead, and re-checked the same way. The I/O is the backends'; the script is pure.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use aliaslb_core::mac::Mac;
use tracing::{info, warn};

use crate::host::Alias;
use crate::kernel::backend::{AddressBackend, BackendError, Write, write_each};
use crate::l2::lan::{LanPort, ProbeConfig, ProbeOutcome};
use crate::shield::ShieldBackend;

/// The name of the silencing tables.
pub const QUIET_TABLE: &str = "aliaslb-quiet";

/// The probe of a returning IP: two ARP probes (or DAD solicitations) 10 ms apart, 15 ms
/// listening after the last. A LAN answers in well under a millisecond; the IP is silent
/// meanwhile, so short.
pub const RETURN_PROBE: ProbeConfig = ProbeConfig {
    count: 2,
    interval: Duration::from_millis(10),
    wait: Duration::from_millis(15),
};

/// What the start found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Returning {
    /// Kept: nobody else answers for them.
    pub kept: Vec<IpAddr>,
    /// Taken down: another MAC answers for them (re-checked by the guard).
    pub yielded: Vec<(IpAddr, Mac)>,
    /// Taken down without a probe (no nftables, or no link to probe on): re-checked by the
    /// guard.
    pub withdrawn: Vec<IpAddr>,
}

impl Returning {
    /// The IPs the guard re-checks before they are held again.
    pub fn to_recheck(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.yielded
            .iter()
            .map(|(ip, _)| *ip)
            .chain(self.withdrawn.iter().copied())
    }
}

/// The nftables script that silences the kernel's ARP replies and neighbour advertisements
/// for `ips` (and replaces any silence a crashed start left). Pure.
pub fn quiet_script(ips: &[IpAddr]) -> String {
    let v4: Vec<String> = ips
        .iter()
        .filter(|ip| ip.is_ipv4())
        .map(ToString::to_string)
        .collect();
    let v6: Vec<String> = ips
        .iter()
        .filter_map(|ip| match ip {
            IpAddr::V6(v6) => Some(format!("0x{:032x}", u128::from(*v6))),
            IpAddr::V4(_) => None,
        })
        .collect();
    let mut out = lift_script();
    if !v4.is_empty() {
        out.push_str(&format!(
            "table arp {QUIET_TABLE} {{\n  chain out {{\n    type filter hook output priority 0; policy accept;\n    arp operation reply arp saddr ip {{ {} }} drop\n  }}\n}}\n",
            v4.join(", ")
        ));
    }
    if !v6.is_empty() {
        // The target address of a neighbour advertisement: 16 bytes from the 8th byte of
        // the ICMPv6 header (type, code, checksum, flags).
        let rules: String = v6
            .iter()
            .map(|t| format!("    icmpv6 type nd-neighbor-advert @th,64,128 {t} drop\n"))
            .collect();
        out.push_str(&format!(
            "table ip6 {QUIET_TABLE} {{\n  chain out {{\n    type filter hook output priority 0; policy accept;\n{rules}  }}\n}}\n"
        ));
    }
    out
}

/// The nftables script that lifts the silence (whether there is one or not). Pure.
pub fn lift_script() -> String {
    format!(
        "add table arp {QUIET_TABLE}\ndelete table arp {QUIET_TABLE}\nadd table ip6 {QUIET_TABLE}\ndelete table ip6 {QUIET_TABLE}\n"
    )
}

/// At start: the node's LAN aliases of ours (not on `routed_device`), silenced, probed on
/// `lan`, taken down where another MAC answers, then heard again (see the module docs).
/// `nft` is `None` without the host-port shield: then they are all taken down first.
pub async fn ask_the_lan_first<B, S, L>(
    backend: &B,
    nft: Option<&S>,
    lan: &L,
    routed_device: &str,
) -> Result<Returning, BackendError>
where
    B: AddressBackend,
    S: ShieldBackend,
    L: LanPort,
{
    let host = backend.snapshot().await?;
    let routed = host
        .links
        .iter()
        .find(|l| l.name == routed_device)
        .map(|l| l.index);
    // Each with its link's MAC while the link is up (none: nothing can be asked there).
    let aliases: Vec<(Alias, Option<[u8; 6]>)> = host
        .addresses
        .iter()
        .filter(|a| a.owned && Some(a.ifindex) != routed)
        .map(|a| {
            let link = host.links.iter().find(|l| l.index == a.ifindex);
            let alias = Alias {
                ip: a.ip,
                ifindex: a.ifindex,
                ifname: link.map_or_else(|| format!("if{}", a.ifindex), |l| l.name.clone()),
            };
            (alias, link.and_then(|l| l.mac.filter(|_| l.up)))
        })
        .collect();
    if aliases.is_empty() {
        return Ok(Returning::default());
    }
    let ips: Vec<IpAddr> = aliases.iter().map(|(a, _)| a.ip).collect();
    let quiet = match nft {
        Some(nft) => match nft.apply(&quiet_script(&ips)).await {
            Ok(()) => true,
            Err(error) => {
                warn!(%error, "cannot silence the kernel's ARP / NDP answers for the LAN aliases of a run before: taking them down instead");
                false
            }
        },
        None => false,
    };
    if !quiet {
        return Ok(Returning {
            withdrawn: withdraw(backend, aliases.iter().map(|(a, _)| a)).await?,
            ..Returning::default()
        });
    }
    // One probe per link, all at once.
    let mut by_link: BTreeMap<(u32, [u8; 6]), Vec<&Alias>> = BTreeMap::new();
    let mut out = Returning::default();
    let mut down: Vec<Alias> = Vec::new();
    for (alias, mac) in &aliases {
        match mac {
            Some(mac) => by_link
                .entry((alias.ifindex, *mac))
                .or_default()
                .push(alias),
            // No carrier (or no Ethernet address): nothing can be asked; down it goes.
            None => down.push(alias.clone()),
        }
    }
    let probes = by_link.into_iter().map(|((ifindex, mac), aliases)| {
        let ips = aliases.iter().map(|a| a.ip).collect();
        let probe = lan.probe_many(ifindex, Mac(mac), ips, RETURN_PROBE);
        async move { (aliases, probe.await) }
    });
    for (aliases, result) in futures::future::join_all(probes).await {
        for alias in aliases {
            match result.as_ref().ok().and_then(|o| o.get(&alias.ip)) {
                Some(ProbeOutcome::Taken { mac }) => {
                    out.yielded.push((alias.ip, *mac));
                    down.push(alias.clone());
                }
                // Free, or the probe failed (the LAN cannot be asked now): kept, as an
                // agent of before kept it; the guard defends it from here on.
                _ => out.kept.push(alias.ip),
            }
        }
    }
    for alias in &down {
        if !out.yielded.iter().any(|(ip, _)| *ip == alias.ip) {
            out.withdrawn.push(alias.ip);
        }
        backend.delete(alias).await?;
    }
    if let Some(nft) = nft
        && let Err(error) = nft.apply(&lift_script()).await
    {
        warn!(%error, table = QUIET_TABLE, "cannot lift the silence on the IPs kept: delete the nftables tables by hand");
    }
    for (ip, mac) in &out.yielded {
        warn!(%ip, %mac, "held before this agent started, and another MAC answers for it on the LAN now: taken down, yielded");
    }
    if !out.kept.is_empty() {
        info!(
            kept = out.kept.len(),
            "held before this agent started, and nobody else answers for them: kept"
        );
    }
    Ok(out)
}

/// Takes `aliases` down (no silence to ask the LAN behind): the kernel must not answer
/// ARP / NDP for an IP another node may have taken over meanwhile. Returns their IPs: the LAN
/// guard asks the LAN who answers for each before it is held again
/// ([`crate::l2::guard::LanGuard::returning`]).
async fn withdraw<'a, B: AddressBackend>(
    backend: &B,
    aliases: impl IntoIterator<Item = &'a Alias>,
) -> Result<Vec<IpAddr>, BackendError> {
    let mut out = Vec::new();
    for (alias, result) in write_each(backend, Write::Delete, aliases).await {
        result?;
        out.push(alias.ip);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_silence_names_each_ip_in_its_family_and_starts_by_lifting_any_old_one() {
        let ips: Vec<IpAddr> = vec![
            "192.168.55.10".parse().unwrap(),
            "2001:db8::10".parse().unwrap(),
            "192.168.55.11".parse().unwrap(),
        ];
        let script = quiet_script(&ips);
        assert!(script.starts_with(&lift_script()), "{script}");
        assert!(
            script
                .contains("arp operation reply arp saddr ip { 192.168.55.10, 192.168.55.11 } drop"),
            "{script}"
        );
        assert!(
            script.contains(
                "icmpv6 type nd-neighbor-advert @th,64,128 0x20010db8000000000000000000000010 drop"
            ),
            "{script}"
        );
        let v4_only = quiet_script(&ips[..1]);
        assert!(!v4_only.contains("table ip6 aliaslb-quiet {"), "{v4_only}");
    }
}
