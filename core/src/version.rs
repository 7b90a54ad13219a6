//! Which agent releases a controller works with (the version skew policy). Pure: no I/O.
//! (This build's own version and commit are `aliaslb_ops::build`'s.)
//!
//! # The policy
//!
//! An upgrade goes **agents first, then the controller** (docs/operations.md, "Upgrade"): while it is
//! under way the agents run the next release and the controller the previous one, and a
//! new agent reads what an older controller writes. The other order is the one that breaks:
//! an older agent may refuse what a newer controller writes (the sharded assignments, the
//! fast-failover words) and then follows no change. So a controller of release line
//! `M.m` (major and minor; in `0.x` the minor is the breaking part, as semver says)
//! supports the agents of:
//!
//! - its own line `M.m` (any patch, any pre-release);
//! - the next line, `M.(m+1)` or `(M+1).0`: an upgrade in progress.
//!
//! It warns about every other agent ([`AgentSupport`]): one of an older line (upgrade the
//! agents), more than one line ahead (upgrade the controller), one that reports no version
//! (older than version reporting), and one whose version does not parse.
//!
//! Agents report their version in the label [`crate::keys::LABEL_AGENT_VERSION`] of their
//! Lease ([`label_value`]); a report from a node is a claim about that node only, and the
//! worst a false one does is a false warning.

use semver::Version;

/// Longest Kubernetes label value.
const MAX_LABEL_VALUE: usize = 63;

/// How a controller takes an agent's version (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AgentSupport {
    /// The controller's release line or the next one.
    Supported,
    /// No version reported: the agent is older than version reporting.
    Unreported,
    /// A release line older than the controller's: the agents were not upgraded first.
    Older {
        /// What the agent reported.
        agent: String,
    },
    /// More than one release line ahead of the controller.
    TooNew {
        /// What the agent reported.
        agent: String,
    },
    /// Not a version (`MAJOR.MINOR.PATCH`, semver).
    Unreadable {
        /// What the agent reported.
        agent: String,
    },
}

impl AgentSupport {
    /// Whether the controller works with that agent.
    pub fn is_supported(&self) -> bool {
        *self == AgentSupport::Supported
    }

    /// Short stable category (a log field): `supported`, `unreported`, `older`, `too_new`,
    /// `unreadable`.
    pub fn category(&self) -> &'static str {
        match self {
            AgentSupport::Supported => "supported",
            AgentSupport::Unreported => "unreported",
            AgentSupport::Older { .. } => "older",
            AgentSupport::TooNew { .. } => "too_new",
            AgentSupport::Unreadable { .. } => "unreadable",
        }
    }

    /// One sentence for a log line or an Event: what is wrong and what to do, for a
    /// controller of release `controller`. Empty for [`AgentSupport::Supported`].
    pub fn advice(&self, controller: &str) -> String {
        let line = line_of(controller);
        match self {
            AgentSupport::Supported => String::new(),
            AgentSupport::Unreported => format!(
                "the agent reports no version: it is older than version reporting, and this \
                 controller ({controller}) supports agents of release line {line} and the next \
                 one only; upgrade the agents (agents first, then the controller)"
            ),
            AgentSupport::Older { agent } => format!(
                "the agent runs {agent}, an older release line than this controller's \
                 ({controller}): it may refuse what this controller writes and then follow no \
                 change; upgrade the agents (agents first, then the controller)"
            ),
            AgentSupport::TooNew { agent } => format!(
                "the agent runs {agent}, more than one release line ahead of this controller \
                 ({controller}, which supports {line} and the next line): upgrade the \
                 controller"
            ),
            AgentSupport::Unreadable { agent } => format!(
                "the agent reports version {agent:?}, which is not a version: this controller \
                 ({controller}) cannot tell whether it supports it"
            ),
        }
    }
}

/// `major.minor` of `version` (the whole text when it does not parse).
fn line_of(version: &str) -> String {
    match Version::parse(version) {
        Ok(v) => format!("{}.{}", v.major, v.minor),
        Err(_) => version.to_owned(),
    }
}

/// How a controller of release `controller` takes an agent that reports `agent` (the label
/// value, `None` when absent). A controller version that does not parse supports only
/// agents reporting the very same text.
pub fn agent_support(controller: &str, agent: Option<&str>) -> AgentSupport {
    let Some(agent) = agent else {
        return AgentSupport::Unreported;
    };
    let unreadable = || AgentSupport::Unreadable {
        agent: agent.to_owned(),
    };
    let Ok(ours) = Version::parse(controller) else {
        return if agent == controller {
            AgentSupport::Supported
        } else {
            unreadable()
        };
    };
    let Ok(theirs) = Version::parse(agent) else {
        return unreadable();
    };
    let (own, next_minor, next_major) = (
        (ours.major, ours.minor),
        (ours.major, ours.minor + 1),
        (ours.major + 1, 0),
    );
    let line = (theirs.major, theirs.minor);
    if line == own || line == next_minor || line == next_major {
        AgentSupport::Supported
    } else if line < own {
        AgentSupport::Older {
            agent: agent.to_owned(),
        }
    } else {
        AgentSupport::TooNew {
            agent: agent.to_owned(),
        }
    }
}

/// `version` as a Kubernetes label value: at most 63 characters of `[A-Za-z0-9._-]`,
/// beginning and ending with a letter or digit. A semver version without build metadata is
/// one already (`0.2.0`, `0.2.0-rc.1`); anything else becomes one (`+` and other characters
/// become `.`, then it is cut), so that an odd version can never make the Lease unwritable.
pub fn label_value(version: &str) -> String {
    let mapped: String = version
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                c
            } else {
                '.'
            }
        })
        .take(MAX_LABEL_VALUE)
        .collect();
    mapped
        .trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_controller_supports_its_own_line_and_the_next_one() {
        let cases: &[(&str, Option<&str>, &str)] = &[
            // (controller, agent, category)
            ("0.2.0", Some("0.2.0"), "supported"),
            ("0.2.0", Some("0.2.7"), "supported"),
            ("0.2.3", Some("0.2.0"), "supported"),
            ("0.2.0", Some("0.2.1-rc.1"), "supported"),
            ("0.2.0-rc.1", Some("0.2.0"), "supported"),
            // Agents first: the next line is an upgrade in progress.
            ("0.2.0", Some("0.3.0"), "supported"),
            ("0.2.0", Some("1.0.0"), "supported"),
            ("1.4.2", Some("1.5.0"), "supported"),
            ("1.4.2", Some("2.0.0"), "supported"),
            // The wrong order, and too far ahead.
            ("0.2.0", Some("0.1.9"), "older"),
            ("1.0.0", Some("0.9.0"), "older"),
            ("0.2.0", Some("0.4.0"), "too_new"),
            ("1.4.2", Some("2.1.0"), "too_new"),
            ("1.4.2", Some("1.6.0"), "too_new"),
            // Nothing, or not a version.
            ("0.2.0", None, "unreported"),
            ("0.2.0", Some("0.2"), "unreadable"),
            ("0.2.0", Some("latest"), "unreadable"),
            ("dev", Some("dev"), "supported"),
            ("dev", Some("0.2.0"), "unreadable"),
        ];
        for (controller, agent, want) in cases {
            let got = agent_support(controller, *agent);
            assert_eq!(
                got.category(),
                *want,
                "controller {controller}, agent {agent:?}: {got:?}"
            );
            assert_eq!(got.is_supported(), *want == "supported");
            assert_eq!(got.advice(controller).is_empty(), *want == "supported");
        }
    }

    #[test]
    fn the_advice_says_what_to_upgrade() {
        let older = agent_support("0.3.1", Some("0.2.0")).advice("0.3.1");
        assert!(
            older.contains("0.2.0") && older.contains("upgrade the agents"),
            "{older}"
        );
        let newer = agent_support("0.3.1", Some("0.5.0")).advice("0.3.1");
        assert!(newer.contains("supports 0.3 and the next line"), "{newer}");
        assert!(newer.contains("upgrade the controller"), "{newer}");
        let none = agent_support("0.3.1", None).advice("0.3.1");
        assert!(none.contains("no version"), "{none}");
    }

    #[test]
    fn a_version_becomes_a_valid_label_value() {
        assert_eq!(label_value("0.2.0"), "0.2.0");
        assert_eq!(label_value("0.2.0-rc.1"), "0.2.0-rc.1");
        assert_eq!(label_value("0.2.0+build.5"), "0.2.0.build.5");
        assert_eq!(label_value("+0.2.0+"), "0.2.0");
        assert_eq!(label_value("0.2.0 évé"), "0.2.0..v");
        let long = "1".repeat(100);
        assert_eq!(label_value(&long).len(), MAX_LABEL_VALUE);
        // The label's own rule (k8s.io/apimachinery validation.IsValidLabelValue).
        for v in ["0.2.0+x", "-a-", "x".repeat(70).as_str(), "a b/c"] {
            let l = label_value(v);
            assert!(l.len() <= MAX_LABEL_VALUE, "{l}");
            assert!(
                l.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)),
                "{l}"
            );
            assert!(
                l.is_empty()
                    || (l.starts_with(|c: char| c.is_ascii_alphanumeric())
                        && l.ends_with(|c: char| c.is_ascii_alphanumeric())),
                "{l}"
            );
        }
    }

    #[test]
    fn this_workspace_has_a_version_that_parses() {
        let version = env!("CARGO_PKG_VERSION");
        assert!(Version::parse(version).is_ok(), "{version}");
        assert!(agent_support(version, Some(version)).is_supported());
        assert_eq!(label_value(version), version);
    }
}
