//! The address backend seam: what the reconcile loop needs from the kernel, as a small
//! trait, so the loop runs against the real kernel (`netlink::NetlinkBackend`) and against
//! a fault-injecting fake in tests.
//!
//! No I/O here: only the trait, its error type, the lifetime settings and [`Timed`], which
//! bounds every request of any backend (a netlink socket the kernel stops answering must
//! not freeze the loop: the heartbeat then tells the truth, see `heartbeat::may_renew`).

use std::future::Future;
use std::io;
use std::time::Duration;

use aliaslb_core::mac::Mac;

use crate::host::{Alias, HostState};

/// A macvlan to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewMacvlan {
    /// Its name (`alb` and the MAC's last bytes: L2 mode's `vmac::link_name`).
    pub name: String,
    /// Its MAC.
    pub mac: Mac,
    /// Index of the LAN interface it goes on.
    pub parent: u32,
    /// Name of that interface (for logs).
    pub parent_name: String,
}

/// Errors of an address backend.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The netlink socket could not be opened.
    #[error("cannot open a netlink socket: {0}")]
    Connect(#[source] io::Error),
    /// The kernel refused or failed a request.
    #[error("{op} {target}: {source}")]
    Kernel {
        /// What was asked: `add`, `delete`, `refresh`, `dump addresses`...
        op: &'static str,
        /// What it was asked on (the alias, or `-` for dumps).
        target: String,
        /// The kernel's errno.
        #[source]
        source: io::Error,
    },
    /// The kernel did not answer within the request timeout.
    #[error("{op}: no answer from the kernel within {timeout:?}")]
    Timeout {
        /// What was asked.
        op: &'static str,
        /// The timeout.
        timeout: Duration,
    },
    /// The kernel's answer could not be understood.
    #[error("unexpected netlink answer to {op}: {detail}")]
    Protocol {
        /// What was asked.
        op: &'static str,
        /// What went wrong.
        detail: String,
    },
}

impl BackendError {
    /// A short stable category in snake_case, the style of every error category (the controller's
    /// metric labels use it too).
    pub fn category(&self) -> &'static str {
        match self {
            BackendError::Connect(_) => "netlink_connect",
            BackendError::Kernel { source, .. }
                if source.kind() == io::ErrorKind::PermissionDenied =>
            {
                "permission_denied"
            }
            BackendError::Kernel { .. } => "kernel_error",
            BackendError::Protocol { .. } => "netlink_protocol",
            BackendError::Timeout { .. } => "timeout",
        }
    }

    /// The operation that failed (`connect` for a socket that could not be opened).
    pub fn op(&self) -> &'static str {
        match self {
            BackendError::Connect(_) => "connect",
            BackendError::Kernel { op, .. }
            | BackendError::Protocol { op, .. }
            | BackendError::Timeout { op, .. } => op,
        }
    }

    /// Whether the kernel did not answer in time.
    pub fn is_timeout(&self) -> bool {
        matches!(self, BackendError::Timeout { .. })
    }
}

/// Default bound on one kernel request: the kernel answers an address request in
/// microseconds and a dump of 10,000 addresses in tens of milliseconds; two seconds without
/// an answer is a stuck socket, not a slow kernel.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

/// An [`AddressBackend`] whose every request fails with [`BackendError::Timeout`] when
/// `inner` does not answer within `timeout`.
#[derive(Debug, Clone)]
pub struct Timed<B> {
    inner: B,
    timeout: Duration,
}

impl<B> Timed<B> {
    /// `inner` with every request bounded by `timeout`.
    pub fn new(inner: B, timeout: Duration) -> Self {
        Timed { inner, timeout }
    }

    /// The wrapped backend.
    pub fn inner(&self) -> &B {
        &self.inner
    }
}

/// `fut` bounded by `timeout`; a timeout is an error naming `op`.
async fn bounded<T>(
    op: &'static str,
    timeout: Duration,
    fut: impl Future<Output = Result<T, BackendError>>,
) -> Result<T, BackendError> {
    match tokio::time::timeout(timeout, fut).await {
        Ok(result) => result,
        Err(_) => Err(BackendError::Timeout { op, timeout }),
    }
}

impl<B: AddressBackend> AddressBackend for Timed<B> {
    fn snapshot(&self) -> impl Future<Output = Result<HostState, BackendError>> + Send {
        bounded("dump", self.timeout, self.inner.snapshot())
    }

    fn add(
        &self,
        alias: &Alias,
        lifetime: Lifetime,
    ) -> impl Future<Output = Result<bool, BackendError>> + Send {
        bounded("add", self.timeout, self.inner.add(alias, lifetime))
    }

    fn delete(&self, alias: &Alias) -> impl Future<Output = Result<bool, BackendError>> + Send {
        bounded("delete", self.timeout, self.inner.delete(alias))
    }

    fn refresh(
        &self,
        alias: &Alias,
        lifetime: Lifetime,
    ) -> impl Future<Output = Result<(), BackendError>> + Send {
        bounded("refresh", self.timeout, self.inner.refresh(alias, lifetime))
    }

    fn write_all(
        &self,
        write: Write,
        aliases: &[&Alias],
    ) -> impl Future<Output = Vec<Result<bool, BackendError>>> + Send {
        let (timeout, n) = (self.timeout, aliases.len());
        let all = self.inner.write_all(write, aliases);
        async move {
            match tokio::time::timeout(timeout, all).await {
                Ok(results) => results,
                Err(_) => (0..n)
                    .map(|_| {
                        Err(BackendError::Timeout {
                            op: write.op(),
                            timeout,
                        })
                    })
                    .collect(),
            }
        }
    }

    fn add_macvlan(
        &self,
        macvlan: &NewMacvlan,
    ) -> impl Future<Output = Result<(), BackendError>> + Send {
        bounded("add macvlan", self.timeout, self.inner.add_macvlan(macvlan))
    }

    fn delete_link(
        &self,
        index: u32,
        name: &str,
    ) -> impl Future<Output = Result<(), BackendError>> + Send {
        bounded(
            "delete link",
            self.timeout,
            self.inner.delete_link(index, name),
        )
    }
}

/// Lifetime given to every alias, refreshed at every renewal, so the kernel drops the
/// alias by itself if the agent dies or hangs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lifetime {
    /// `valid_lft`, in whole seconds (at least 1); `preferred_lft` is the same for IPv4
    /// and 0 for IPv6 ([`crate::kernel::netlink::preferred_lifetime`]).
    pub seconds: u32,
}

impl Lifetime {
    /// The lifetime for a lease of `lease_duration`, rounded up to whole seconds.
    pub fn for_lease(lease_duration: Duration) -> Self {
        let secs = lease_duration.as_secs() + u64::from(lease_duration.subsec_nanos() > 0);
        Lifetime {
            seconds: u32::try_from(secs.max(1)).unwrap_or(u32::MAX - 1),
        }
    }
}

/// One kind of write to an alias, for [`AddressBackend::write_all`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Write {
    /// [`AddressBackend::add`].
    Add(Lifetime),
    /// [`AddressBackend::delete`].
    Delete,
    /// [`AddressBackend::refresh`] (which reports `Ok(true)`).
    Refresh(Lifetime),
}

impl Write {
    /// The operation's name, as errors say it.
    pub fn op(self) -> &'static str {
        match self {
            Write::Add(_) => "add",
            Write::Delete => "delete",
            Write::Refresh(_) => "refresh",
        }
    }
}

/// The most aliases one [`AddressBackend::write_all`] call takes. The netlink backend sends
/// them in one message and reads their answers back at once: 64 answers fit the socket's
/// default receive buffer many times over (an answer lost to an overflow is an error, and
/// the write is made again at the next reconcile).
pub const BATCH: usize = 64;

/// `write` on every alias of `aliases`, [`BATCH`] per backend call, one call after the
/// other (the kernel takes address writes one at a time anyway); each alias with its
/// result.
pub async fn write_each<'a, B: AddressBackend>(
    backend: &B,
    write: Write,
    aliases: impl IntoIterator<Item = &'a Alias>,
) -> Vec<(&'a Alias, Result<bool, BackendError>)> {
    let aliases: Vec<&Alias> = aliases.into_iter().collect();
    let mut results = Vec::with_capacity(aliases.len());
    for chunk in aliases.chunks(BATCH) {
        let answers = backend.write_all(write, chunk).await;
        debug_assert_eq!(answers.len(), chunk.len(), "one answer per write");
        results.extend(chunk.iter().copied().zip(answers));
    }
    results
}

/// What the reconcile loop needs from the kernel.
///
/// Writes return `Ok(true)` when they changed something and `Ok(false)` when the kernel
/// already was in the asked state (EEXIST on add, EADDRNOTAVAIL/ENOENT/ESRCH on delete).
pub trait AddressBackend: Sync {
    /// Dumps links, all addresses (each marked owned or not) and the default routes.
    fn snapshot(&self) -> impl Future<Output = Result<HostState, BackendError>> + Send;
    /// Adds `alias` as a /32 or /128 with our ownership marker and `lifetime`.
    fn add(
        &self,
        alias: &Alias,
        lifetime: Lifetime,
    ) -> impl Future<Output = Result<bool, BackendError>> + Send;
    /// Deletes `alias`.
    fn delete(&self, alias: &Alias) -> impl Future<Output = Result<bool, BackendError>> + Send;
    /// Re-sets `alias`'s lifetime to `lifetime` from now (re-creating it if it vanished).
    fn refresh(
        &self,
        alias: &Alias,
        lifetime: Lifetime,
    ) -> impl Future<Output = Result<(), BackendError>> + Send;
    /// `write` on each of `aliases` (at most [`BATCH`]), the results in the same order.
    /// The default makes the writes one by one, all in flight at once; the netlink
    /// backend sends them to the kernel in one message.
    fn write_all(
        &self,
        write: Write,
        aliases: &[&Alias],
    ) -> impl Future<Output = Vec<Result<bool, BackendError>>> + Send {
        futures::future::join_all(aliases.iter().map(move |alias| async move {
            match write {
                Write::Add(lifetime) => self.add(alias, lifetime).await,
                Write::Delete => self.delete(alias).await,
                Write::Refresh(lifetime) => self.refresh(alias, lifetime).await.map(|()| true),
            }
        }))
    }
    /// Creates the macvlan of a virtual MAC, set up as L2 mode's `vmac` module says. A backend
    /// without links refuses (the default).
    fn add_macvlan(
        &self,
        macvlan: &NewMacvlan,
    ) -> impl Future<Output = Result<(), BackendError>> + Send {
        let target = macvlan.name.clone();
        async move {
            Err(BackendError::Kernel {
                op: "add macvlan",
                target,
                source: io::Error::from(io::ErrorKind::Unsupported),
            })
        }
    }
    /// Deletes link `index` (one of our macvlans, `name` for logs).
    fn delete_link(
        &self,
        index: u32,
        name: &str,
    ) -> impl Future<Output = Result<(), BackendError>> + Send {
        let _ = index;
        let target = name.to_owned();
        async move {
            Err(BackendError::Kernel {
                op: "delete link",
                target,
                source: io::Error::from(io::ErrorKind::Unsupported),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lifetime_rounds_up_and_is_never_zero() {
        assert_eq!(Lifetime::for_lease(Duration::from_secs(4)).seconds, 4);
        assert_eq!(Lifetime::for_lease(Duration::from_millis(4100)).seconds, 5);
        assert_eq!(Lifetime::for_lease(Duration::ZERO).seconds, 1);
    }

    #[test]
    fn permission_errors_have_their_own_category() {
        let e = BackendError::Kernel {
            op: "add",
            target: "10.0.0.1/32 dev eth0".into(),
            source: io::Error::from_raw_os_error(1),
        };
        assert_eq!(e.category(), "permission_denied");
        assert!(
            e.to_string().starts_with("add 10.0.0.1/32 dev eth0: "),
            "{e}"
        );
    }

    /// A backend that never answers.
    struct Hung;

    impl AddressBackend for Hung {
        async fn snapshot(&self) -> Result<HostState, BackendError> {
            std::future::pending().await
        }
        async fn add(&self, _: &Alias, _: Lifetime) -> Result<bool, BackendError> {
            std::future::pending().await
        }
        async fn delete(&self, _: &Alias) -> Result<bool, BackendError> {
            std::future::pending().await
        }
        async fn refresh(&self, _: &Alias, _: Lifetime) -> Result<(), BackendError> {
            std::future::pending().await
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_without_answer_times_out_naming_its_operation() {
        let timed = Timed::new(Hung, Duration::from_secs(2));
        let alias = Alias {
            ip: "10.0.0.1".parse().unwrap(),
            ifindex: 2,
            ifname: "eth0".into(),
        };
        let start = tokio::time::Instant::now();
        let e = timed.snapshot().await.unwrap_err();
        assert_eq!(start.elapsed(), Duration::from_secs(2));
        assert!(e.is_timeout());
        assert_eq!((e.op(), e.category()), ("dump", "timeout"));
        assert_eq!(e.to_string(), "dump: no answer from the kernel within 2s");
        let life = Lifetime { seconds: 4 };
        assert_eq!(timed.add(&alias, life).await.unwrap_err().op(), "add");
        assert_eq!(timed.delete(&alias).await.unwrap_err().op(), "delete");
        assert_eq!(
            timed.refresh(&alias, life).await.unwrap_err().op(),
            "refresh"
        );
    }
}
