//! The controller's logging policy: its default log filter, which `main` hands to
//! `aliaslb_ops::telemetry::init` (the subscriber: text or JSON on stderr, `RUST_LOG`
//! respected). Pure, no I/O.

/// The filter when `RUST_LOG` is unset or empty.
pub const DEFAULT_FILTER: &str = "info";

#[cfg(test)]
mod tests {
    use super::*;
    use aliaslb_ops::telemetry;

    #[test]
    fn the_default_filter_parses() {
        let filter = telemetry::filter(DEFAULT_FILTER, None).unwrap();
        assert_eq!(filter.to_string(), "info");
    }
}
