//! Prometheus text encoding and registration shared by both binaries' metrics, and the
//! metric they share: `aliaslb_build_info{version,commit} 1` ([`crate::build`]), under that
//! one name in both (a binary's own metrics carry its prefix, `aliaslb_` or
//! `aliaslb_agent_`). Pure, no I/O: the [`crate::http`] server sends the result with
//! [`CONTENT_TYPE`].
//!
//! Each part of a binary owns its metrics: a struct of its own, built by [`registered`]
//! calls against the binary's one [`Registry`], so a part's metrics live beside its code.

use std::sync::LazyLock;

use prometheus_client::encoding::text;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Metric, Registry};

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

/// `metric` (a fresh default one) registered in `registry` as `name` with `help`, and
/// returned: the metrics types are handles, the registry keeps its own clone.
pub fn registered<M: Metric + Clone + Default>(
    registry: &mut Registry,
    name: &str,
    help: &str,
) -> M {
    with(registry, name, help, M::default())
}

/// A count as a gauge's value (saturating).
pub fn count(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// [`registered`] for a metric that has no useful default (a histogram's buckets).
pub fn with<M: Metric + Clone>(registry: &mut Registry, name: &str, help: &str, metric: M) -> M {
    registry.register(name, help, metric.clone());
    metric
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

    #[test]
    fn a_registered_metric_is_the_one_encoded() {
        let mut registry = Registry::with_prefix("aliaslb");
        let counter: Counter = registered(&mut registry, "things", "Things seen");
        counter.inc_by(2);
        assert!(
            encode(&registry)
                .unwrap()
                .contains("aliaslb_things_total 2")
        );
    }
}
