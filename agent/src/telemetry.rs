//! The agent's logging policy: its default log filter, which `main` hands to
//! `aliaslb_ops::telemetry::init` (the subscriber: text or JSON on stderr, `RUST_LOG`
//! respected). Pure, no I/O.

/// The filter when `RUST_LOG` is unset or empty: `info`, minus kube-client's own line per
/// failed request (an ERROR every renewal during an API outage). The agent logs those
/// failures itself, once per outage edge, and counts each in
/// `aliaslb_agent_lease_renew_failures_total`.
pub const DEFAULT_FILTER: &str = "info,kube_client::client::builder=off";

#[cfg(test)]
mod tests {
    use super::*;
    use aliaslb_ops::telemetry;

    #[test]
    fn the_default_filter_parses() {
        let filter = telemetry::filter(DEFAULT_FILTER, None).unwrap().to_string();
        assert!(
            filter.contains("kube_client::client::builder=off") && filter.contains("info"),
            "{filter}"
        );
    }
}
