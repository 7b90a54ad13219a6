//! What an agent tells the controller, through an annotation on its own Lease.
//!
//! Agents never write Services (a compromised node must not steer traffic); they report
//! here instead, and the controller reads it for node election (interfaces and subnets),
//! break-before-make moves (which IPs are held right now) and conflicts. The report is
//! JSON in the annotation [`crate::keys::ANNOTATION_AGENT_REPORT`]; unknown fields are
//! ignored so agents and controllers of neighbouring versions understand each other.

use std::collections::BTreeSet;
use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

/// Current report format version.
pub const REPORT_VERSION: u32 = 1;

/// The report an agent publishes on its Lease.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentReport {
    /// Format version ([`REPORT_VERSION`]).
    #[serde(default)]
    pub version: u32,
    /// The node's interfaces and their connected subnets (its own addresses, not aliases).
    #[serde(default)]
    pub interfaces: Vec<InterfaceReport>,
    /// Load-balancer IPs the agent holds as aliases right now.
    #[serde(default)]
    pub held: BTreeSet<IpAddr>,
    /// Assigned IPs the agent refuses to take, and why.
    #[serde(default)]
    pub conflicts: Vec<Conflict>,
    /// The host-port shield (the agent's nftables table) on this node.
    #[serde(default)]
    pub shield: ShieldState,
}

/// State of an agent's host-port shield (its nftables table), as it reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ShieldState {
    /// The table is installed and every held IP is in it.
    Active,
    /// Disabled with `--host-port-shield=off`.
    Off,
    /// The last sync of the table failed; the agent retries, and adds no alias while its
    /// shield element cannot be written.
    Failing,
    /// Not reported: an agent of an older version, or a state this controller does not
    /// know (a newer agent).
    #[default]
    #[serde(other)]
    Unknown,
}

impl ShieldState {
    /// The state as in the report's JSON: `active`, `off`, `failing` or `unknown`.
    pub fn as_str(&self) -> &'static str {
        match self {
            ShieldState::Active => "active",
            ShieldState::Off => "off",
            ShieldState::Failing => "failing",
            ShieldState::Unknown => "unknown",
        }
    }
}

/// One interface of the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InterfaceReport {
    /// Interface name, e.g. `eth0`.
    pub name: String,
    /// Connected subnets of its own (non-alias) addresses, e.g. `192.168.55.3/24`.
    #[serde(default)]
    pub subnets: Vec<IpNet>,
}

/// An assigned IP the agent did not take.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Conflict {
    /// The IP.
    pub ip: IpAddr,
    /// Human-readable reason, e.g. "already configured on eth0 by another owner".
    pub reason: String,
}

/// Why a report could not be read.
#[derive(Debug, thiserror::Error)]
#[error("agent report is not valid JSON: {0}")]
pub struct ReportError(#[source] serde_json::Error);

impl AgentReport {
    /// Serialises the report for the Lease annotation.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("an AgentReport always serialises")
    }

    /// Reads a report from the Lease annotation.
    pub fn from_json(s: &str) -> Result<Self, ReportError> {
        serde_json::from_str(s).map_err(ReportError)
    }

    /// All subnets of all interfaces.
    pub fn subnets(&self) -> impl Iterator<Item = &IpNet> {
        self.interfaces.iter().flat_map(|i| i.subnets.iter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_ignores_unknown_fields() {
        let report = AgentReport {
            version: REPORT_VERSION,
            interfaces: vec![InterfaceReport {
                name: "eth1".into(),
                subnets: vec!["192.168.55.3/24".parse().unwrap()],
            }],
            held: ["192.168.55.10".parse().unwrap()].into(),
            conflicts: vec![Conflict {
                ip: "192.168.55.11".parse().unwrap(),
                reason: "already on eth1".into(),
            }],
            shield: ShieldState::Active,
        };
        let json = report.to_json();
        assert!(json.contains(r#""shield":"active""#), "{json}");
        assert_eq!(AgentReport::from_json(&json).unwrap(), report);
        let newer = json.replacen('{', r#"{"futureField":[1,2],"#, 1);
        assert_eq!(AgentReport::from_json(&newer).unwrap(), report);
        assert_eq!(report.subnets().count(), 1);

        // An older agent does not report its shield; a newer one may report a state this
        // version does not know. Both read as Unknown, the rest of the report intact.
        let older = json.replace(r#","shield":"active""#, "");
        assert!(!older.contains("shield"), "{older}");
        let unknown = AgentReport {
            shield: ShieldState::Unknown,
            ..report.clone()
        };
        assert_eq!(AgentReport::from_json(&older).unwrap(), unknown);
        let future = json.replace(r#""shield":"active""#, r#""shield":"someFutureState""#);
        assert_eq!(AgentReport::from_json(&future).unwrap(), unknown);
    }

    #[test]
    fn shield_state_names_match_the_json() {
        for state in [
            ShieldState::Active,
            ShieldState::Off,
            ShieldState::Failing,
            ShieldState::Unknown,
        ] {
            let json = serde_json::to_string(&state).unwrap();
            assert_eq!(json, format!("\"{}\"", state.as_str()));
            assert_eq!(serde_json::from_str::<ShieldState>(&json).unwrap(), state);
        }
        assert_eq!(ShieldState::default(), ShieldState::Unknown);
    }

    #[test]
    fn rejects_garbage_with_a_message() {
        let err = AgentReport::from_json("{not json").unwrap_err();
        assert!(
            err.to_string()
                .starts_with("agent report is not valid JSON"),
            "{err}"
        );
    }
}
