//! FRR through `vtysh`, read-only (only `show` commands are ever run).
//!
//! [`read`] runs `vtysh -c 'show bgp summary json'`, then one `vtysh` with a `-c 'show
//! bgp <afi> unicast neighbors <peer> advertised-routes json'` per Established (peer,
//! family) of the IPv4 and IPv6 unicast families; `vtysh` prints one JSON document per
//! command, back to back. Children are killed when the reading is dropped (the caller's
//! timeout). The pure parsers ([`parse_summary`], [`parse_advertised`]) are unit tested
//! on captured output of FRR 8.4; fields they do not need are ignored.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::Path;
use std::process::Stdio;

use ipnet::IpNet;
use serde::Deserialize;
use tokio::process::Command;

use super::{RoutingError, RoutingStatus, host_address};

const DAEMON: &str = "frr";
/// The families whose advertised routes are read: (summary key, `show bgp` words).
const FAMILIES: [(&str, &str); 2] = [
    ("ipv4Unicast", "ipv4 unicast"),
    ("ipv6Unicast", "ipv6 unicast"),
];

/// One family of `show bgp summary json` (e.g. `ipv4Unicast`).
#[derive(Debug, Deserialize)]
struct SummaryFamily {
    #[serde(default)]
    peers: BTreeMap<String, SummaryPeer>,
}

#[derive(Debug, Deserialize)]
struct SummaryPeer {
    state: String,
}

/// The BGP sessions of `show bgp summary json`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    /// Every configured peer, in any family (a peer in two families is one session).
    pub peers: BTreeSet<String>,
    /// The Established peers.
    pub established: BTreeSet<String>,
    /// The (peer, `show bgp` family words) to ask for advertised routes: Established
    /// peers of the unicast families.
    pub to_ask: Vec<(String, &'static str)>,
}

/// Parses `show bgp summary json`: an object keyed by family (`ipv4Unicast`,
/// `ipv6Unicast`, `l2VpnEvpn`, ...), each with `peers: { "<peer>": { "state": .. } }`;
/// `{}` when there is no `router bgp`.
pub fn parse_summary(json: &str) -> Result<Summary, String> {
    let families: BTreeMap<String, serde_json::Value> =
        serde_json::from_str(json).map_err(|e| format!("not a JSON object: {e}"))?;
    let mut summary = Summary::default();
    for (key, value) in families {
        // Families are objects; anything else at the top level is not a family.
        if !value.is_object() {
            continue;
        }
        let family: SummaryFamily =
            serde_json::from_value(value).map_err(|e| format!("family {key}: {e}"))?;
        let words = FAMILIES.iter().find(|(k, _)| *k == key).map(|(_, w)| *w);
        for (peer, state) in family.peers {
            if !is_peer_name(&peer) {
                return Err(format!("peer name {peer:?} is not an address or interface"));
            }
            let up = state.state == "Established";
            if up {
                summary.established.insert(peer.clone());
                if let Some(words) = words {
                    summary.to_ask.push((peer.clone(), words));
                }
            }
            summary.peers.insert(peer);
        }
    }
    Ok(summary)
}

#[derive(Debug, Deserialize)]
struct Advertised {
    #[serde(default, rename = "advertisedRoutes")]
    advertised_routes: Option<BTreeMap<String, serde_json::Value>>,
    #[serde(default)]
    warning: Option<String>,
}

/// Parses one `show bgp <afi> unicast neighbors <peer> advertised-routes json`: the
/// host prefixes keyed in `advertisedRoutes`. A `warning` (`No such neighbor ...`: the
/// peer went away since the summary) reads as nothing advertised.
pub fn parse_advertised(doc: serde_json::Value) -> Result<BTreeSet<IpAddr>, String> {
    let doc: Advertised =
        serde_json::from_value(doc).map_err(|e| format!("unexpected document: {e}"))?;
    let Some(routes) = doc.advertised_routes else {
        return match doc.warning {
            Some(_) => Ok(BTreeSet::new()),
            None => Err("neither `advertisedRoutes` nor `warning`".to_string()),
        };
    };
    let mut out = BTreeSet::new();
    for prefix in routes.keys() {
        let net: IpNet = prefix
            .parse()
            .map_err(|e| format!("advertised route key {prefix:?}: {e}"))?;
        out.extend(host_address(net));
    }
    Ok(out)
}

/// Whether `s` can be passed to `vtysh` as one word (an address or an interface name).
fn is_peer_name(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | ':' | '-' | '_' | '%'))
}

/// Runs `vtysh [--vty_socket DIR] -c CMD...`; its stdout.
async fn vtysh(
    binary: &Path,
    vty_socket: Option<&Path>,
    commands: &[String],
) -> Result<String, RoutingError> {
    let mut cmd = Command::new(binary);
    if let Some(dir) = vty_socket {
        cmd.arg("--vty_socket").arg(dir);
    }
    for c in commands {
        cmd.arg("-c").arg(c);
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let unreachable = |detail: String| RoutingError::Unreachable {
        daemon: DAEMON,
        what: "FRR's bgpd through",
        target: binary.to_path_buf(),
        detail,
        hint: "is bgpd running, is vtysh in the agent image, and is FRR's vty socket \
               directory mounted (give it as frr:<vtysh>:<dir>)?",
    };
    let out = cmd
        .output()
        .await
        .map_err(|e| unreachable(format!("cannot run it: {e}")))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let words = format!("{} {}", stderr.trim(), stdout.trim());
        let words = words.trim();
        // vtysh exits 1 both when it reaches no daemon ("Exiting: failed to connect to
        // any daemons.", "bgpd is not running") and when a command fails ("% Unknown
        // command: ...").
        if words.contains("failed to connect") || words.contains("is not running") {
            return Err(unreachable(format!("vtysh {}: {words}", out.status)));
        }
        return Err(RoutingError::Refused {
            daemon: DAEMON,
            command: commands.join("; "),
            reply: words.to_string(),
            hint: "FRR 8 or later is required",
        });
    }
    String::from_utf8(out.stdout).map_err(|e| RoutingError::Protocol {
        daemon: DAEMON,
        command: commands.join("; "),
        detail: format!("output is not UTF-8: {e}"),
    })
}

/// Reads FRR once (unbounded; [`super::read`] bounds it).
pub async fn read(binary: &Path, vty_socket: Option<&Path>) -> Result<RoutingStatus, RoutingError> {
    let summary_cmd = "show bgp summary json".to_string();
    let out = vtysh(binary, vty_socket, std::slice::from_ref(&summary_cmd)).await?;
    let summary = parse_summary(&out).map_err(|detail| RoutingError::Protocol {
        daemon: DAEMON,
        command: summary_cmd.clone(),
        detail,
    })?;
    let commands: Vec<String> = summary
        .to_ask
        .iter()
        .map(|(peer, family)| format!("show bgp {family} neighbors {peer} advertised-routes json"))
        .collect();
    let mut exported = BTreeSet::new();
    if !commands.is_empty() {
        let out = vtysh(binary, vty_socket, &commands).await?;
        let mut docs = serde_json::Deserializer::from_str(&out).into_iter::<serde_json::Value>();
        for command in &commands {
            let protocol = |detail: String| RoutingError::Protocol {
                daemon: DAEMON,
                command: command.clone(),
                detail,
            };
            let doc = docs
                .next()
                .ok_or_else(|| protocol("no JSON answer".to_string()))?
                .map_err(|e| protocol(format!("not JSON: {e}")))?;
            exported.extend(parse_advertised(doc).map_err(protocol)?);
        }
    }
    Ok(RoutingStatus {
        daemon: DAEMON,
        established: summary.established.len(),
        sessions: summary.peers.len(),
        exported,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SUMMARY: &str = include_str!("../../../tests/data/routing/frr-summary-established.json");
    const SUMMARY_DOWN: &str = include_str!("../../../tests/data/routing/frr-summary-down.json");
    const ADV4: &str = include_str!("../../../tests/data/routing/frr-advertised-ipv4.json");
    const ADV6: &str = include_str!("../../../tests/data/routing/frr-advertised-ipv6.json");
    const NO_SUCH: &str =
        include_str!("../../../tests/data/routing/frr-advertised-no-such-neighbor.json");

    fn ips(list: &[&str]) -> BTreeSet<IpAddr> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    fn adv(s: &str) -> Result<BTreeSet<IpAddr>, String> {
        parse_advertised(serde_json::from_str(s).unwrap())
    }

    #[test]
    fn summary_established() {
        let s = parse_summary(SUMMARY).unwrap();
        assert_eq!(s.peers.len(), 2);
        assert_eq!(s.established.len(), 2);
        // fd00:9::2 is listed in ipv4Unicast too (default ipv4-unicast activation).
        assert_eq!(
            s.to_ask,
            vec![
                ("10.0.9.2".to_string(), "ipv4 unicast"),
                ("fd00:9::2".to_string(), "ipv4 unicast"),
                ("fd00:9::2".to_string(), "ipv6 unicast"),
            ]
        );
    }

    #[test]
    fn summary_down() {
        let s = parse_summary(SUMMARY_DOWN).unwrap();
        assert_eq!(s.peers.len(), 2);
        assert!(s.established.is_empty());
        assert!(s.to_ask.is_empty());
    }

    #[test]
    fn summary_without_bgp_and_other_families() {
        // FRR 8.4's answer without `router bgp`.
        assert_eq!(parse_summary("{}").unwrap(), Summary::default());
        let s = parse_summary(r#"{"l2VpnEvpn":{"peers":{"swp1":{"state":"Established"}}},"x":1}"#)
            .unwrap();
        assert_eq!(s.established.len(), 1);
        assert!(s.to_ask.is_empty());
    }

    #[test]
    fn advertised_routes() {
        assert_eq!(adv(ADV4).unwrap(), ips(&["10.200.0.7"]));
        assert_eq!(adv(ADV6).unwrap(), ips(&["fd00:200::7"]));
        assert_eq!(adv(NO_SUCH).unwrap(), ips(&[]));
        // FRR 8.4's answer without `router bgp`.
        let no_bgp = r#"{ "warning":"Default BGP instance not found" }"#;
        assert_eq!(adv(no_bgp).unwrap(), ips(&[]));
        assert_eq!(
            adv(r#"{"advertisedRoutes":{"10.200.0.0/24":{},"10.200.0.9/32":{}}}"#).unwrap(),
            ips(&["10.200.0.9"])
        );
    }

    #[test]
    fn malformed_output_is_an_error_not_a_panic() {
        for bad in [
            "",
            "% Unknown command",
            "[1]",
            r#"{"ipv4Unicast":{"peers":{"a b":{"state":"x"}}}}"#,
            r#"{"ipv4Unicast":{"peers":{"10.0.0.1":{}}}}"#,
            r#"{"ipv4Unicast":{"peers":[1]}}"#,
        ] {
            assert!(parse_summary(bad).is_err(), "{bad:?} accepted");
        }
        for bad in [
            r#"{}"#,
            r#"[]"#,
            r#"{"advertisedRoutes":{"nonsense":{}}}"#,
            r#"{"advertisedRoutes":[]}"#,
        ] {
            assert!(adv(bad).is_err(), "{bad:?} accepted");
        }
    }
}
