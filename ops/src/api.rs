//! The Kubernetes API client and the watch retry policy both binaries share, chosen so
//! that every watch notices a dead apiserver connection within seconds and, once the
//! path heals, relists (or resumes) and acts within about 3 s. Does network I/O (the
//! client); [`WatchBackoff`] is pure.
//!
//! # Why TCP keepalives
//!
//! A watch on an object nobody changes carries no bytes: the 1.20 apiserver sends no
//! heartbeat, and bookmarks only when it wants (about 2 s before the watch's own
//! timeout). When the path to the apiserver drops packets (no RST, no FIN), the client
//! therefore cannot tell an idle watch from a dead one, and kube's watcher only gives up
//! after its server timeout plus 5 s (295 s); requests sent on such a connection wait
//! for TCP's retransmissions (minutes), and a packet the peer retransmits after the
//! path healed may come tens of seconds late (exponential backoff). That fits the lab's
//! 18 s and 35 s; the agent test `after_a_silent_cut_changes_apply_within_5s_of_the_heal`
//! reproduced 13 s with kube's default client.
//!
//! The cheapest signal that works for every connection of the client at once (watches,
//! lists, Lease writes), without any apiserver work, is the kernel's: [`client`] sets on
//! every socket
//! - TCP keepalive: a probe after [`KEEPALIVE_IDLE`] without traffic, then every
//!   [`KEEPALIVE_INTERVAL`];
//! - `TCP_USER_TIMEOUT` ([`TCP_USER_TIMEOUT`]): a connection whose sent data stays
//!   unacknowledged that long is dropped (keepalive does not probe while data is in
//!   flight, e.g. a request written into the cut). With it set, Linux also drops a
//!   connection whose keepalive probes went unanswered once that long passed since the
//!   peer was last heard (instead of after [`KEEPALIVE_RETRIES`] probes): an idle watch
//!   on a dead path errors after about 5 s;
//! - a connect timeout ([`CONNECT_TIMEOUT`], TCP and TLS) instead of kube's 30 s, so a
//!   connection attempt made during the outage does not outlive it by much. 4 s is just
//!   past Linux's second SYN retransmission (1 s, 3 s): an attempt either gets through
//!   within 1 s of the heal or fails at most 1 s after it.
//!
//! A watch that errors is retried by the watch driver ([`crate::watch::drive`]) after a
//! [`WatchBackoff`] delay, at most [`BACKOFF_MAX`] (jittered below it, so that the agents
//! cut off together do not relist together: [`crate::backoff`]). After a heal the worst case is
//! therefore about 1 s (a pending connection attempt) + [`BACKOFF_MAX`] + one request:
//! about 3 s, within the 5 s target.
//! A cut shorter than the 5 s detection leaves the connection alive: the peer's
//! retransmission (exponential from 200 ms) then comes within about the cut's length
//! after the heal, also under 5 s.
//!
//! Alternatives not taken: a short server-side watch timeout (`timeoutSeconds`) only
//! bounds detection by that timeout plus kube's 5 s margin, so it cannot reach 5 s, and
//! it costs one watch request per watch every few seconds (per node for the agents); an
//! application-level inactivity deadline needs traffic the 1.20 apiserver does not send;
//! a client read timeout would cut healthy idle watches. HTTP/2 pings would need the
//! HTTP/2 stack kube does not enable here.

use std::time::Duration;

use hyper_timeout::TimeoutConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kube::client::ConfigExt;
use kube::client::retry::RetryPolicy;
use tower::retry::RetryLayer;
use tower::{BoxError, ServiceBuilder};

use crate::backoff::Backoff;

/// Idle time before the first TCP keepalive probe.
pub const KEEPALIVE_IDLE: Duration = Duration::from_secs(2);
/// Time between unanswered keepalive probes.
pub const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(1);
/// Unanswered probes after which the kernel drops the connection (on Linux superseded by
/// [`TCP_USER_TIMEOUT`], which is set too).
pub const KEEPALIVE_RETRIES: u32 = 2;
/// How long sent data may stay unacknowledged before the kernel drops the connection.
pub const TCP_USER_TIMEOUT: Duration = Duration::from_secs(5);
/// Connect timeout (TCP and TLS handshake).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(4);

/// The watch retry's first step: the first delay after an error is in
/// `[BACKOFF_MIN / 2, BACKOFF_MIN]`.
pub const BACKOFF_MIN: Duration = Duration::from_millis(250);
/// The watch retry's last step, and the longest delay: bounds how long after an API path
/// heals a failing watch tries again (two watches per agent, a few per controller
/// replica).
pub const BACKOFF_MAX: Duration = Duration::from_secs(2);

/// A client from the kubeconfig or the in-cluster config (as
/// `kube::Client::try_default`), with the connection settings above.
pub async fn client() -> Result<kube::Client, kube::Error> {
    let config = kube::Config::infer()
        .await
        .map_err(kube::Error::InferConfig)?;
    client_for(config)
}

/// A client for `config` with the connection settings above. The layers are kube's own
/// (`kube::Client::try_from`) but for its request tracing; a proxy URL is left to kube
/// (without those settings).
pub fn client_for(config: kube::Config) -> Result<kube::Client, kube::Error> {
    if config.proxy_url.is_some() {
        tracing::warn!(
            "a proxy is configured: dead API connections are noticed only by kube's own timeouts"
        );
        return kube::Client::try_from(config);
    }
    let mut tcp = HttpConnector::new();
    tcp.enforce_http(false);
    tcp.set_keepalive(Some(KEEPALIVE_IDLE));
    tcp.set_keepalive_interval(Some(KEEPALIVE_INTERVAL));
    tcp.set_keepalive_retries(Some(KEEPALIVE_RETRIES));
    tcp.set_tcp_user_timeout(Some(TCP_USER_TIMEOUT));
    let https = config.rustls_https_connector_with_connector(tcp)?;
    let mut connector = TimeoutConnector::new(https);
    connector.set_connect_timeout(Some(CONNECT_TIMEOUT));
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    connector.set_reset_reader_on_write(config.reset_reader_on_write);
    let http = hyper_util::client::legacy::Builder::new(TokioExecutor::new()).build(connector);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(
            config
                .default_retry
                .then(|| RetryLayer::new(RetryPolicy::server_retry())),
        )
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .service(http);
    Ok(kube::Client::new(service, config.default_namespace))
}

/// The watch retry delay: steps doubling from [`BACKOFF_MIN`] to [`BACKOFF_MAX`], each
/// delay drawn from `[step / 2, step]` ([`crate::backoff::Backoff`]), reset by the first
/// event that proves the API answered (not `Event::Init`: kube's watcher yields it
/// *before* its list request).
///
/// Not kube's `StreamBackoff`: it resets on every `Ok` item, `Init` included, so during
/// an outage with relists the delay never grew, while with failing re-watches its
/// default grows to 30 s, which is then how late a heal is noticed.
#[derive(Debug)]
pub struct WatchBackoff(Backoff);

impl Default for WatchBackoff {
    fn default() -> Self {
        Self::new()
    }
}

impl WatchBackoff {
    /// Starts at the [`BACKOFF_MIN`] step.
    pub fn new() -> Self {
        WatchBackoff(Backoff::new(BACKOFF_MIN, BACKOFF_MAX))
    }

    /// [`WatchBackoff::new`] drawing its jitter from `seed` (tests).
    pub fn seeded(seed: u64) -> Self {
        WatchBackoff(Backoff::seeded(BACKOFF_MIN, BACKOFF_MAX, seed))
    }

    /// The delay before the next retry; the step doubles for the one after (up to
    /// [`BACKOFF_MAX`]).
    pub fn next_delay(&mut self) -> Duration {
        self.0.next_delay()
    }

    /// Back to the [`BACKOFF_MIN`] step.
    pub fn reset(&mut self) {
        self.0.reset();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_caps_and_resets() {
        for seed in 0..50 {
            let mut b = WatchBackoff::seeded(seed);
            let got: Vec<_> = (0..7).map(|_| b.next_delay()).collect();
            let within =
                |d: Duration, step: Duration| d + Duration::from_millis(1) >= step / 2 && d <= step;
            assert!(within(got[0], BACKOFF_MIN), "{got:?}");
            assert!(within(got[1], BACKOFF_MIN * 2), "{got:?}");
            assert!(within(got[6], BACKOFF_MAX), "{got:?}");
            assert!(got.iter().all(|d| *d <= BACKOFF_MAX), "{got:?}");
            b.reset();
            assert!(within(b.next_delay(), BACKOFF_MIN));
        }
    }
}
