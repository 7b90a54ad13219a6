//! Flag value parsers both binaries use in their clap `value_parser`s. Pure, no I/O.

use std::time::Duration;

/// Parse a duration such as `4s`, `500ms` or `1m 30s`; zero is refused.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = parse_duration_or_zero(s)?;
    if d.is_zero() {
        return Err("must be greater than zero".to_owned());
    }
    Ok(d)
}

/// A duration flag that may be zero (`0s`: off).
pub fn parse_duration_or_zero(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s)
        .map_err(|e| format!("{e} (expected a duration such as 4s, 500ms or 1m30s)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        let table = [
            ("4s", Duration::from_secs(4)),
            ("500ms", Duration::from_millis(500)),
            ("1m 30s", Duration::from_secs(90)),
            ("1m30s", Duration::from_secs(90)),
        ];
        for (text, want) in table {
            assert_eq!(parse_duration(text), Ok(want), "{text}");
        }
    }

    #[test]
    fn bad_durations_are_explained() {
        let table = [
            ("4", "expected a duration such as 4s"),
            ("", "expected a duration such as 4s"),
            ("four seconds", "expected a duration such as 4s"),
            ("0s", "must be greater than zero"),
            ("0ms", "must be greater than zero"),
        ];
        for (text, want) in table {
            let err = parse_duration(text).unwrap_err();
            assert!(err.contains(want), "{text:?}: {err}");
        }
    }
}
