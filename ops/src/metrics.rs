//! Prometheus text encoding shared by both binaries' metrics modules, and the metric they
//! share: `aliaslb_build_info{version,commit} 1` ([`crate::build`]), under that one name in
//! both (a binary's own metrics carry its prefix, `aliaslb_` or `aliaslb_agent_`). Pure, no
//! I/O: the [`crate::http`] server sends the result with [`CONTENT_TYPE`].

use std::sync::LazyLock;

use prometheus_client::encoding::text;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

use crate::build;

/// Content type of [`encode`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Every metric in `registry`, then `aliaslb_build_info`, in the OpenMetrics text format
/// ([`CONTENT_TYPE`]).
pub fn encode(registry: &Registry) -> Result<String, std::fmt::Error> {
    let mut out = String::new();
    text::encode_registry(&mut out, registry)?;
    text::encode_registry(&mut out, &BUILD)?;
    text::encode_eof(&mut out)?;
    Ok(out)
}

/// `aliaslb_build_info{version, commit} 1`, the same in every binary.
static BUILD: LazyLock<Registry> = LazyLock::new(|| {
    let mut registry = Registry::with_prefix("aliaslb");
    registry.register(
        "build",
        "The release and commit of this build (always 1)",
        Info::new(vec![("version", build::VERSION), ("commit", build::COMMIT)]),
    );
    registry
});

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
        assert_eq!(text.matches("# EOF").count(), 1, "{text}");
        let info = format!(
            "aliaslb_build_info{{version=\"{}\",commit=\"{}\"}} 1\n",
            build::VERSION,
            build::COMMIT
        );
        assert!(text.contains(&info), "{text}");
        assert!(text.contains("# TYPE aliaslb_build info\n"), "{text}");
    }
}
