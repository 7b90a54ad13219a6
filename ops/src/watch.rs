//! The one watch loop both binaries run: [`drive`] polls a kube `watcher` stream forever,
//! hands every event to its owner and, after an error, waits a [`WatchBackoff`] delay
//! before it watches again, either resuming the same stream or starting a new one
//! ([`AfterError`]). Does no I/O of its own (the stream does) but sleep.
//!
//! # The backoff rule
//!
//! The delay's step doubles from [`BACKOFF_MIN`](crate::api::BACKOFF_MIN) to
//! [`BACKOFF_MAX`](crate::api::BACKOFF_MAX) for as long as the watch fails, each delay
//! drawn from `[step / 2, step]` ([`crate::backoff`]: the agents that one API server
//! restart cut off do not relist in step), and is reset
//! only by an event that proves the API answered: not `Event::Init`, which kube's
//! watcher yields *before* its list request (a relist that fails right away yields
//! `Init` then an error, so resetting on `Init` would keep the delay at its minimum for
//! the whole outage, which is what kube's own `StreamBackoff` does). The test
//! `the_delay_grows_during_an_outage_and_only_a_real_event_resets_it` pins the times.
//!
//! # Logs
//!
//! One `warn` when a watch starts failing (`kind`, `error`, `delay`), `debug` for every
//! further error of the same outage, one `info` when an event arrives again, `error` if
//! the stream ever ends (kube's watcher does not; the driver then starts a new one).

use futures::{Stream, StreamExt};
use kube::runtime::watcher::{self, Event};

use crate::api::WatchBackoff;

/// What [`drive`] does with the stream after an error, once the backoff delay passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterError {
    /// Poll the same stream again: kube's watcher then resumes the watch from the last
    /// resource version it saw, or relists when the server says it is too old (410).
    /// For caches, which only need every change.
    Resume,
    /// Drop the stream and make a new one (a fresh list, ending in `InitDone`). For a
    /// watch whose owner needs a state read *after* the outage: a resumed watch that
    /// brings no event never says it is current.
    Relist,
}

/// Polls the watch stream `make` returns forever, handing every event to `on_event`.
///
/// After an error: waits the next [`WatchBackoff`] delay (from the
/// [`BACKOFF_MIN`](crate::api::BACKOFF_MIN) step, doubling, jittered, at most
/// [`BACKOFF_MAX`](crate::api::BACKOFF_MAX), reset by any event but `Event::Init`), then
/// polls the same stream ([`AfterError::Resume`]) or calls `make` for a new one
/// ([`AfterError::Relist`]).
/// A stream that ends is replaced by a new one after the same delay, in both modes.
/// `kind` names the watch in the logs (e.g. `"Service"`); put further fields in a span
/// around the call.
pub async fn drive<K, S>(
    kind: &'static str,
    make: impl FnMut() -> S,
    after_error: AfterError,
    on_event: impl FnMut(Event<K>),
) where
    S: Stream<Item = Result<Event<K>, watcher::Error>>,
{
    drive_with(kind, make, after_error, on_event, WatchBackoff::new()).await;
}

/// [`drive`] with the given backoff (tests: seeded).
async fn drive_with<K, S>(
    kind: &'static str,
    mut make: impl FnMut() -> S,
    after_error: AfterError,
    mut on_event: impl FnMut(Event<K>),
    mut backoff: WatchBackoff,
) where
    S: Stream<Item = Result<Event<K>, watcher::Error>>,
{
    let mut failing = false;
    loop {
        let mut stream = std::pin::pin!(make());
        loop {
            match stream.next().await {
                Some(Ok(event)) => {
                    // `Init` comes before the list request: it proves nothing about the API.
                    if !matches!(event, Event::Init) {
                        backoff.reset();
                        if failing {
                            tracing::info!(kind, "watch works again");
                            failing = false;
                        }
                    }
                    on_event(event);
                }
                Some(Err(error)) => {
                    let delay = backoff.next_delay();
                    if failing {
                        tracing::debug!(kind, error = %error, ?delay, "watch still failing");
                    } else {
                        match after_error {
                            AfterError::Resume => tracing::warn!(
                                kind, error = %error, ?delay,
                                "watch failed; resuming it after the delay"
                            ),
                            AfterError::Relist => tracing::warn!(
                                kind, error = %error, ?delay,
                                "watch failed; starting it again with a fresh list after the delay"
                            ),
                        }
                        failing = true;
                    }
                    tokio::time::sleep(delay).await;
                    if after_error == AfterError::Relist {
                        break;
                    }
                }
                None => {
                    let delay = backoff.next_delay();
                    tracing::error!(
                        kind,
                        ?delay,
                        "watch stream ended (a bug: kube's watcher never ends); starting a new watch after the delay"
                    );
                    tokio::time::sleep(delay).await;
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::{Arc, Mutex};
    use std::task::Poll;

    use std::time::Duration;

    use tokio::time::Instant;

    use super::*;
    use crate::api::{BACKOFF_MAX, BACKOFF_MIN};

    type Item = Result<Event<u32>, watcher::Error>;

    fn err() -> Item {
        Err(watcher::Error::NoResourceVersion)
    }

    fn label(item: &Item) -> &'static str {
        match item {
            Ok(Event::Init) => "Init",
            Ok(Event::InitApply(_)) => "InitApply",
            Ok(Event::InitDone) => "InitDone",
            Ok(Event::Apply(_)) => "Apply",
            Ok(Event::Delete(_)) => "Delete",
            Err(_) => "Err",
        }
    }

    /// What the fake streams handed out: (milliseconds since the start, stream number,
    /// item).
    type Polls = Arc<Mutex<Vec<(u128, usize, &'static str)>>>;

    /// A factory of fake watch streams (fault injection): the n-th call yields the n-th
    /// script, then stays pending (as an idle watch); a call past the scripts yields an
    /// idle stream. Every item handed out is logged with the (paused) time.
    fn fake(scripts: Vec<Vec<Item>>, polls: Polls) -> impl FnMut() -> BoxedItems {
        let start = Instant::now();
        let mut scripts: VecDeque<_> = scripts.into();
        let mut made = 0;
        move || {
            let mut script: VecDeque<Item> = scripts.pop_front().unwrap_or_default().into();
            let n = made;
            made += 1;
            let polls = polls.clone();
            futures::stream::poll_fn(move |_| match script.pop_front() {
                Some(item) => {
                    let ms = (Instant::now() - start).as_millis();
                    polls.lock().unwrap().push((ms, n, label(&item)));
                    Poll::Ready(Some(item))
                }
                // Never woken: the test's timeout ends the run.
                None => Poll::Pending,
            })
            .boxed()
        }
    }

    type BoxedItems = futures::stream::BoxStream<'static, Item>;

    /// The seed of the driver's backoff in these tests.
    const SEED: u64 = 48;

    /// The first `n` delays of a backoff seeded like the driver's: its twin.
    fn twin(n: usize) -> Vec<Duration> {
        let mut twin = WatchBackoff::seeded(SEED);
        (0..n).map(|_| twin.next_delay()).collect()
    }

    /// `to - from` (polled times, in whole milliseconds of paused time) is `delay` (tokio's
    /// timers fire on the millisecond after the deadline).
    #[track_caller]
    fn assert_waited(from: u128, to: u128, delay: Duration) {
        let waited = (to - from) as f64;
        let want = delay.as_secs_f64() * 1000.0;
        assert!(
            waited >= want - 0.001 && waited < want + 1.0,
            "waited {waited} ms, the delay was {delay:?}"
        );
    }

    /// Every delay lies in `[step / 2, step]` of its doubling step.
    #[track_caller]
    fn assert_steps(delays: &[Duration], steps_ms: &[u64]) {
        for (delay, step) in delays.iter().zip(steps_ms) {
            let step = Duration::from_millis(*step);
            assert!(
                *delay >= step / 2 - Duration::from_millis(1) && *delay <= step,
                "{delay:?} is not in the {step:?} step"
            );
        }
    }

    /// Runs [`drive`] over `scripts` for a minute of paused time; returns what was polled
    /// and the events `on_event` got.
    async fn run(
        scripts: Vec<Vec<Item>>,
        after_error: AfterError,
    ) -> (Vec<(u128, usize, &'static str)>, Vec<&'static str>) {
        let polls = Polls::default();
        let mut seen = Vec::new();
        let on_event = |event: Event<u32>| seen.push(label(&Ok(event)));
        let backoff = WatchBackoff::seeded(SEED);
        let drive = drive_with(
            "test",
            fake(scripts, polls.clone()),
            after_error,
            on_event,
            backoff,
        );
        let ended = tokio::time::timeout(Duration::from_secs(60), drive).await;
        assert!(ended.is_err(), "the driver returned");
        let polls = polls.lock().unwrap().clone();
        for (ms, stream, item) in &polls {
            println!("{ms:>5} ms  stream {stream}  {item}");
        }
        (polls, seen)
    }

    #[tokio::test(start_paused = true)]
    async fn the_delay_grows_during_an_outage_and_only_a_real_event_resets_it() {
        use Event::*;
        let script = vec![
            err(),
            err(),
            err(),
            Ok(Init),
            err(),
            err(),
            Ok(InitApply(1)),
            Ok(InitDone),
            err(),
            Ok(Apply(2)),
        ];
        let (polls, seen) = run(vec![script], AfterError::Resume).await;
        let items: Vec<_> = polls.iter().map(|(_, _, item)| *item).collect();
        assert_eq!(
            items,
            [
                "Err",
                "Err",
                "Err",
                "Init",
                "Err",
                "Err",
                "InitApply",
                "InitDone",
                "Err",
                "Apply"
            ]
        );
        let t: Vec<u128> = polls.iter().map(|(ms, _, _)| *ms).collect();
        let d = twin(5);
        // Steps of 250 ms, 500 ms, 1 s, 2 s, 2 s (capped), each delay jittered within it.
        assert_steps(&d, &[250, 500, 1000, 2000, 2000]);
        assert_eq!(t[0], 0);
        assert_waited(t[0], t[1], d[0]);
        assert_waited(t[1], t[2], d[1]);
        assert_waited(t[2], t[3], d[2]);
        // `Init`: no reset, the list request has not been answered: the next step is 2 s.
        assert_eq!(t[3], t[4]);
        assert_waited(t[4], t[5], d[3]);
        assert_waited(t[5], t[6], d[4]);
        // The API answered: reset, so the next error waits the first step again (the
        // seeded twin starts its numbers over too).
        assert_eq!((t[6], t[7], t[8]), (t[6], t[6], t[6]));
        assert_waited(t[8], t[9], d[0]);
        assert_eq!(
            seen,
            ["Init", "InitApply", "InitDone", "Apply"],
            "every event reaches the owner"
        );
        assert_eq!(
            (BACKOFF_MIN.as_millis(), BACKOFF_MAX.as_millis()),
            (250, 2000)
        );
    }

    /// Different seeds (different agents): the same outage, retries at different times.
    #[tokio::test(start_paused = true)]
    async fn two_drivers_failing_together_retry_apart() {
        let mut times = Vec::new();
        for seed in [1, 2] {
            let polls = Polls::default();
            let script = vec![err(), err(), err(), err()];
            let drive = drive_with(
                "test",
                fake(vec![script], polls.clone()),
                AfterError::Resume,
                |_: Event<u32>| {},
                WatchBackoff::seeded(seed),
            );
            assert!(
                tokio::time::timeout(Duration::from_secs(60), drive)
                    .await
                    .is_err()
            );
            let last = polls.lock().unwrap().last().map(|(ms, _, _)| *ms);
            times.push(last);
        }
        assert_ne!(times[0], times[1], "{times:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn resume_polls_the_same_stream_after_an_error() {
        use Event::*;
        let (polls, seen) = run(
            vec![
                vec![Ok(Init), Ok(InitDone), err(), Ok(Apply(1))],
                vec![Ok(Init), Ok(InitDone)],
            ],
            AfterError::Resume,
        )
        .await;
        assert!(polls.iter().all(|(_, stream, _)| *stream == 0), "{polls:?}");
        assert_eq!(polls[3].2, "Apply");
        assert_waited(polls[2].0, polls[3].0, twin(1)[0]);
        assert_eq!(seen, ["Init", "InitDone", "Apply"]);
    }

    #[tokio::test(start_paused = true)]
    async fn relist_makes_a_new_stream_after_an_error() {
        use Event::*;
        let (polls, seen) = run(
            vec![
                // The first stream's `Apply` after the error is never polled.
                vec![Ok(Init), Ok(InitDone), err(), Ok(Apply(1))],
                // A relist that fails: `Init` does not reset the delay.
                vec![Ok(Init), err()],
                vec![Ok(Init), Ok(InitApply(2)), Ok(InitDone)],
            ],
            AfterError::Relist,
        )
        .await;
        let without_times: Vec<_> = polls.iter().map(|(_, n, item)| (*n, *item)).collect();
        assert_eq!(
            without_times,
            [
                (0, "Init"),
                (0, "InitDone"),
                (0, "Err"),
                (1, "Init"),
                (1, "Err"),
                (2, "Init"),
                (2, "InitApply"),
                (2, "InitDone"),
            ]
        );
        let t: Vec<u128> = polls.iter().map(|(ms, _, _)| *ms).collect();
        let d = twin(2);
        assert_eq!((t[0], t[1], t[2]), (0, 0, 0));
        assert_waited(t[2], t[3], d[0]);
        assert_eq!(t[3], t[4]);
        // Grown: the failed relist's `Init` did not reset it.
        assert_waited(t[4], t[5], d[1]);
        assert_steps(&d, &[250, 500]);
        assert_eq!((t[5], t[6], t[7]), (t[5], t[5], t[5]));
        assert_eq!(
            seen,
            ["Init", "InitDone", "Init", "Init", "InitApply", "InitDone"]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_ended_stream_is_replaced_after_a_delay() {
        use Event::*;
        let ended = futures::stream::iter([Ok(Init), Ok(InitDone)]).boxed();
        let polls = Polls::default();
        let mut rest = fake(vec![vec![Ok(Init), Ok(InitDone)]], polls.clone());
        let mut first = Some(ended);
        let make = move || first.take().unwrap_or_else(&mut rest);
        let mut seen = 0;
        let backoff = WatchBackoff::seeded(SEED);
        let drive = drive_with(
            "test",
            make,
            AfterError::Resume,
            |_: Event<u32>| seen += 1,
            backoff,
        );
        assert!(
            tokio::time::timeout(Duration::from_secs(60), drive)
                .await
                .is_err()
        );
        assert_eq!(seen, 4);
        let polls = polls.lock().unwrap().clone();
        let items: Vec<_> = polls.iter().map(|(_, n, item)| (*n, *item)).collect();
        assert_eq!(items, [(0, "Init"), (0, "InitDone")]);
        assert_waited(0, polls[0].0, twin(1)[0]);
    }

    /// Every log event of the driver: level and `name=value` fields.
    #[derive(Debug, Clone, Default)]
    struct Logs(Arc<Mutex<Vec<(tracing::Level, String)>>>);

    impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Logs {
        fn on_event(
            &self,
            event: &tracing::Event<'_>,
            _: tracing_subscriber::layer::Context<'_, S>,
        ) {
            struct Fields(String);
            impl tracing::field::Visit for Fields {
                fn record_debug(
                    &mut self,
                    field: &tracing::field::Field,
                    value: &dyn std::fmt::Debug,
                ) {
                    self.0 += &format!(" {}={value:?}", field.name());
                }
            }
            let mut fields = Fields(String::new());
            event.record(&mut fields);
            let level = *event.metadata().level();
            self.0.lock().unwrap().push((level, fields.0));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn one_warning_per_outage_and_one_notice_of_the_recovery() {
        use tracing::Level;
        use tracing_subscriber::layer::SubscriberExt;
        let logs = Logs::default();
        let _guard =
            tracing::subscriber::set_default(tracing_subscriber::registry().with(logs.clone()));
        let script = vec![
            err(),
            err(),
            Ok(Event::Init),
            err(),
            Ok(Event::InitApply(1)),
            Ok(Event::InitDone),
            err(),
        ];
        run(vec![script], AfterError::Resume).await;
        let logs = logs.0.lock().unwrap().clone();
        for (level, fields) in &logs {
            println!("{level:>5}{fields}");
        }
        let levels: Vec<_> = logs.iter().map(|(level, _)| *level).collect();
        assert_eq!(
            levels,
            [
                Level::WARN,
                Level::DEBUG,
                Level::DEBUG,
                Level::INFO,
                Level::WARN
            ]
        );
        let error = watcher::Error::NoResourceVersion.to_string();
        // The delays logged are the driver's (its seeded twin's): the first step, the third,
        // and the first again after the recovery.
        let d = twin(3);
        assert_eq!(
            logs[0].1,
            format!(
                " message=watch failed; resuming it after the delay kind=\"test\" error={error} delay={:?}",
                d[0]
            )
        );
        assert!(
            logs[2].1.ends_with(&format!("delay={:?}", d[2])),
            "{}",
            logs[2].1
        );
        assert_eq!(logs[3].1, " message=watch works again kind=\"test\"");
        assert!(
            logs[4].1.ends_with(&format!("delay={:?}", d[0])),
            "{}",
            logs[4].1
        );
    }
}
