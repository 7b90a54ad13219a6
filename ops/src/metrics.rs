//! Prometheus text encoding shared by both binaries' metrics modules. Pure, no I/O: the
//! [`crate::http`] server sends the result with [`CONTENT_TYPE`].

use prometheus_client::registry::Registry;

/// Content type of [`encode`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Every metric in `registry` in the OpenMetrics text format ([`CONTENT_TYPE`]).
pub fn encode(registry: &Registry) -> Result<String, std::fmt::Error> {
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, registry)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;

    #[test]
    fn encodes_a_registry_in_openmetrics_text() {
        let mut registry = Registry::with_prefix("aliaslb");
        let counter = Counter::<u64>::default();
        registry.register("things", "Things seen", counter.clone());
        counter.inc_by(3);
        let text = encode(&registry).unwrap();
        assert!(
            text.contains("# HELP aliaslb_things Things seen."),
            "{text}"
        );
        assert!(text.contains("aliaslb_things_total 3"), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
