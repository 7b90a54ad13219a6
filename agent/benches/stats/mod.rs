//! Timing, statistics and command-line helpers the kernel benchmarks share. No I/O
//! but reading the environment.

#![allow(dead_code)]

use std::future::Future;
use std::time::{Duration, Instant};

/// The median (upper middle) of `xs`.
pub fn median(xs: &[Duration]) -> Duration {
    assert!(!xs.is_empty(), "no samples");
    let mut v = xs.to_vec();
    v.sort();
    v[v.len() / 2]
}

/// `d` in milliseconds.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// `xs` in milliseconds, one decimal, space separated.
pub fn list(xs: &[Duration]) -> String {
    xs.iter()
        .map(|d| format!("{:.1}", ms(*d)))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The sections the command line selects (`cargo bench` passes `--bench`; any argument not
/// starting with `-` names a section): whether `name` runs (every one when none is named).
pub fn sections() -> impl Fn(&str) -> bool {
    let wanted: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    move |name: &str| wanted.is_empty() || wanted.iter().any(|w| w == name)
}

/// The whole number in the environment variable `name`, else `default`.
pub fn env_number(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a whole number")),
        Err(_) => default,
    }
}

/// Runs `fut` to completion on `rt`; returns how long it took and its output.
pub fn timed<T>(rt: &tokio::runtime::Runtime, fut: impl Future<Output = T>) -> (Duration, T) {
    let start = Instant::now();
    let out = rt.block_on(fut);
    (start.elapsed(), out)
}
