//! The one timing rule of every wait a crowd would otherwise take in step, in both
//! binaries: **equal jitter**. A retry after a failure, or the wait before a periodic
//! re-read, is drawn uniformly from `[D/2, D]`, where `D` is the delay the caller names:
//! the backoff's current step ([`Backoff`], doubling from its first delay to its cap) or
//! the period ([`jittered`]). A periodic write whose rate and spacing must both hold (the
//! agent's Lease) takes a [`phase`] of its own instead, drawn once. Pure: random numbers,
//! no I/O, no sleeping.
//!
//! # Why
//!
//! Thousands of agents started by one DaemonSet rollout, or all cut off by one API server
//! restart, otherwise fail, wait and retry together: a doubling backoff without jitter
//! sends every relist of the crowd in the same instant, again and again, at a server that
//! is just coming back, and renewals that are retried in step stay in step for good.
//! client-go jitters its backoff and the kubelet its node-lease renewals for this reason.
//!
//! # Why `[D/2, D]`
//!
//! - never later than `D`: every bound stated in `D` still holds (the watch driver's
//!   2 s heal bound, the re-read periods, the write retries' cap);
//! - never sooner than `D/2`: no failure makes a client retry faster than half its
//!   un-jittered rate;
//! - `D/2` wide: after a few failed rounds a crowd's retries are spread over half the
//!   current step, where they were all at one instant.
//!
//! [`Backoff`] is `backon`'s exponential backoff with jitter (which adds a uniform
//! fraction of its step: `[d, 2d]`), run at half the steps, so its delays are `[D/2, D]`
//! for `D` = `first`, `2 first`, ... up to `max`.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};

/// A doubling delay with equal jitter: the n-th delay is uniform in `[D/2, D]` with
/// `D = first x 2^(n-1)`, at most `max`; [`Backoff::reset`] starts over at `first`.
#[derive(Debug)]
pub struct Backoff {
    builder: ExponentialBuilder,
    steps: ExponentialBackoff,
    max: Duration,
}

impl Backoff {
    /// Delays from `[first/2, first]` doubling up to `[max/2, max]`.
    pub fn new(first: Duration, max: Duration) -> Self {
        Self::from_builder(first, max, |b| b)
    }

    /// [`Backoff::new`] with the random numbers drawn from `seed` (tests: a run that can be
    /// repeated; two seeds give two spreads).
    pub fn seeded(first: Duration, max: Duration, seed: u64) -> Self {
        Self::from_builder(first, max, |b| b.with_jitter_seed(seed))
    }

    fn from_builder(
        first: Duration,
        max: Duration,
        seed: impl FnOnce(ExponentialBuilder) -> ExponentialBuilder,
    ) -> Self {
        let max = max.max(first);
        let builder = seed(
            ExponentialBuilder::new()
                .with_min_delay(first / 2)
                .with_max_delay(max / 2)
                .with_factor(2.0)
                .with_jitter()
                .without_max_times(),
        );
        Backoff {
            steps: builder.build(),
            builder,
            max,
        }
    }

    /// The next delay (the backoff grows for the one after).
    pub fn next_delay(&mut self) -> Duration {
        // backon works in f32 seconds: a delay may come out a few nanoseconds past `max`.
        self.steps.next().unwrap_or(self.max).min(self.max)
    }

    /// Back to the first step (a success). A seeded backoff starts its numbers over too.
    pub fn reset(&mut self) {
        self.steps = self.builder.build();
    }
}

/// `period` with equal jitter: uniform in `[period/2, period]`. For the wait before a
/// periodic re-read, so that a crowd started together spreads out.
pub fn jittered(period: Duration) -> Duration {
    jittered_with(&mut fastrand::Rng::new(), period)
}

/// [`jittered`] drawing from `rng` (tests: seeded).
pub fn jittered_with(rng: &mut fastrand::Rng, period: Duration) -> Duration {
    period / 2 + uniform(rng, period / 2)
}

/// A phase: uniform in `[0, period)`. Drawn once by a client that writes once per
/// `period` at `start + phase + k x period`: the crowd's writes spread evenly over the
/// period, each client's exactly a period apart.
pub fn phase(period: Duration) -> Duration {
    phase_with(&mut fastrand::Rng::new(), period)
}

/// [`phase`] drawing from `rng` (tests: seeded).
pub fn phase_with(rng: &mut fastrand::Rng, period: Duration) -> Duration {
    if period.is_zero() {
        return Duration::ZERO;
    }
    let nanos = u64::try_from(period.as_nanos()).unwrap_or(u64::MAX);
    Duration::from_nanos(rng.u64(0..nanos))
}

/// Uniform in `[0, span]`, to the nanosecond.
fn uniform(rng: &mut fastrand::Rng, span: Duration) -> Duration {
    let nanos = u64::try_from(span.as_nanos()).unwrap_or(u64::MAX);
    Duration::from_nanos(rng.u64(0..=nanos))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    /// Steps of `[D/2, D]` with D = 250 ms doubling to 2 s, every draw within its step.
    #[test]
    fn each_delay_lies_within_half_its_step_and_its_step() {
        for seed in 0..200 {
            let mut b = Backoff::seeded(250 * MS, 2000 * MS, seed);
            for step in [250, 500, 1000, 2000, 2000, 2000] {
                let d = b.next_delay();
                let step = step * MS;
                assert!(
                    d >= step / 2 - MS && d <= step,
                    "seed {seed}: {d:?} outside [{:?}, {step:?}]",
                    step / 2
                );
            }
            b.reset();
            let d = b.next_delay();
            assert!(d >= 125 * MS - MS && d <= 250 * MS, "after reset: {d:?}");
        }
    }

    /// What the jitter is for: a thousand clients failing at the same instant do not
    /// retry at the same instant. Their fourth retries (2 s steps, about 3.75 s in) spread
    /// over most of the 1 s the rule allows, no 10 ms holding more than a few percent.
    #[test]
    fn a_crowd_that_failed_together_retries_spread_out() {
        let mut at: Vec<Duration> = (0..1000)
            .map(|seed| {
                let mut b = Backoff::seeded(250 * MS, 2000 * MS, seed);
                (0..4).map(|_| b.next_delay()).sum()
            })
            .collect();
        at.sort();
        let (first, last) = (at[0], at[999]);
        assert!(last - first > 800 * MS, "spread only {:?}", last - first);
        let mut buckets = std::collections::BTreeMap::<u128, usize>::new();
        for t in &at {
            *buckets.entry(t.as_millis() / 10).or_default() += 1;
        }
        let busiest = buckets.values().max().copied().unwrap_or(0);
        assert!(busiest <= 40, "{busiest} of 1000 in one 10 ms");
        // Without jitter all 1000 would retry at 250 + 500 + 1000 + 2000 ms exactly.
        assert!(at.iter().filter(|t| **t == 3750 * MS).count() < 10);
    }

    #[test]
    fn seeded_backoffs_repeat_and_differ_by_seed() {
        let run = |seed| {
            let mut b = Backoff::seeded(200 * MS, 30_000 * MS, seed);
            (0..8).map(|_| b.next_delay()).collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
    }

    #[test]
    fn a_jittered_period_lies_in_its_upper_half_and_spreads() {
        let mut rng = fastrand::Rng::with_seed(1);
        let period = 60_000 * MS;
        let draws: Vec<Duration> = (0..1000).map(|_| jittered_with(&mut rng, period)).collect();
        assert!(draws.iter().all(|d| *d >= period / 2 && *d <= period));
        let min = draws.iter().min().copied().unwrap_or_default();
        let max = draws.iter().max().copied().unwrap_or_default();
        assert!(max - min > 25_000 * MS, "{min:?}..{max:?}");
        assert!(jittered(period) <= period);
    }

    /// Phases fill the period evenly: every tenth of it holds 5 to 15 % of 1000 clients.
    #[test]
    fn phases_spread_over_the_whole_period() {
        let mut rng = fastrand::Rng::with_seed(2);
        let period = 10_000 * MS;
        let mut tenths = [0usize; 10];
        for _ in 0..1000 {
            let p = phase_with(&mut rng, period);
            assert!(p < period);
            tenths[usize::try_from(p.as_millis() / 1000).unwrap()] += 1;
        }
        assert!(tenths.iter().all(|n| (50..=150).contains(n)), "{tenths:?}");
        assert_eq!(phase(Duration::ZERO), Duration::ZERO);
    }
}
