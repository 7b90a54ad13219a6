//! The one fake kernel of the agent's tests: a node whose address table is kept in memory
//! behind [`AddressBackend`], with failures injected per operation and address, every
//! operation logged on tokio's clock (paused time applies), and a switch that makes every
//! operation hang. No I/O.

#![allow(dead_code)]

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aliaslb_agent::host::{Alias, HostAddress, HostState, Link};
use aliaslb_agent::kernel::backend::{AddressBackend, BackendError, Lifetime};
use tokio::time::Instant;

/// One operation the fake saw: its name, the address, when.
pub type Op = (&'static str, Option<IpAddr>, Instant);

/// A node with `eth0` (192.168.1.10/24, default route, MAC 02:00:00:00:00:02).
#[derive(Debug, Default)]
pub struct FakeKernel {
    /// The links and addresses, as a netlink dump would show them.
    pub host: Mutex<HostState>,
    fail: Mutex<HashMap<(&'static str, Option<IpAddr>), i32>>,
    log: Mutex<Vec<Op>>,
    /// While set, every operation waits for ever (a hung kernel).
    pub hang: AtomicBool,
    /// Operations that take this long, by name (a slow kernel).
    pub slow: Mutex<HashMap<&'static str, Duration>>,
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

impl FakeKernel {
    /// `eth0` only (index 2).
    pub fn new() -> Self {
        Self::with_links(false)
    }

    /// `lo` (index 1) and `eth0` (index 2), in that order.
    pub fn with_lo() -> Self {
        Self::with_links(true)
    }

    fn with_links(lo: bool) -> Self {
        let fake = FakeKernel::default();
        let mut links = Vec::new();
        if lo {
            links.push(Link {
                index: 1,
                name: "lo".into(),
                mac: Some([0; 6]),
                kind: None,
                up: true,
                parent: None,
            });
        }
        links.push(Link {
            index: 2,
            name: "eth0".into(),
            mac: Some([2, 0, 0, 0, 0, 2]),
            kind: None,
            up: true,
            parent: None,
        });
        *fake.host.lock().unwrap() = HostState {
            links,
            addresses: vec![HostAddress {
                ip: ip("192.168.1.10"),
                prefix_len: 24,
                ifindex: 2,
                owned: false,
                global: true,
            }],
            default_v4: Some(2),
            default_v6: None,
        };
        fake
    }

    /// The next operation `op` (`snapshot`, `add`, `delete`, `refresh`) on `target` fails
    /// with `errno`.
    pub fn fail_once(&self, op: &'static str, target: Option<&str>, errno: i32) {
        self.fail
            .lock()
            .unwrap()
            .insert((op, target.map(ip)), errno);
    }

    /// Logs the operation, hangs while [`FakeKernel::hang`] is set, then fails it if a
    /// failure was injected.
    async fn op(&self, op: &'static str, target: Option<IpAddr>) -> Result<(), BackendError> {
        self.log.lock().unwrap().push((op, target, Instant::now()));
        let slow = self.slow.lock().unwrap().get(op).copied();
        if let Some(slow) = slow {
            tokio::time::sleep(slow).await;
        }
        if self.hang.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        match self.fail.lock().unwrap().remove(&(op, target)) {
            Some(errno) => Err(BackendError::Kernel {
                op,
                target: target.map_or("-".into(), |t| t.to_string()),
                source: io::Error::from_raw_os_error(errno),
            }),
            None => Ok(()),
        }
    }

    /// Link `k` (as listed) gains or loses its carrier (a cable in or out).
    pub fn set_up(&self, k: usize, up: bool) {
        self.host.lock().unwrap().links[k].up = up;
    }

    /// The addresses the agent added, sorted.
    pub fn ours(&self) -> Vec<IpAddr> {
        let mut v: Vec<_> = self
            .host
            .lock()
            .unwrap()
            .addresses
            .iter()
            .filter(|a| a.owned)
            .map(|a| a.ip)
            .collect();
        v.sort();
        v
    }

    /// How many operations were logged.
    pub fn log_len(&self) -> usize {
        self.log.lock().unwrap().len()
    }

    /// The operations logged from the `n`-th on.
    pub fn log_since(&self, n: usize) -> Vec<Op> {
        self.log.lock().unwrap()[n..].to_vec()
    }
}

impl AddressBackend for &FakeKernel {
    async fn snapshot(&self) -> Result<HostState, BackendError> {
        self.op("snapshot", None).await?;
        Ok(self.host.lock().unwrap().clone())
    }

    async fn add(&self, alias: &Alias, _: Lifetime) -> Result<bool, BackendError> {
        self.op("add", Some(alias.ip)).await?;
        let mut host = self.host.lock().unwrap();
        if host
            .addresses
            .iter()
            .any(|a| a.ip == alias.ip && a.ifindex == alias.ifindex)
        {
            return Ok(false);
        }
        host.addresses.push(HostAddress {
            ip: alias.ip,
            prefix_len: alias.prefix_len(),
            ifindex: alias.ifindex,
            owned: true,
            global: true,
        });
        Ok(true)
    }

    async fn delete(&self, alias: &Alias) -> Result<bool, BackendError> {
        self.op("delete", Some(alias.ip)).await?;
        let mut host = self.host.lock().unwrap();
        let before = host.addresses.len();
        host.addresses
            .retain(|a| !(a.ip == alias.ip && a.ifindex == alias.ifindex));
        Ok(host.addresses.len() != before)
    }

    async fn refresh(&self, alias: &Alias, _: Lifetime) -> Result<(), BackendError> {
        self.op("refresh", Some(alias.ip)).await
    }
}

/// A [`FakeKernel`] shared with the test (the run loop owns its backend).
#[derive(Debug, Clone)]
pub struct Shared(pub Arc<FakeKernel>);

impl AddressBackend for Shared {
    async fn snapshot(&self) -> Result<HostState, BackendError> {
        (&*self.0).snapshot().await
    }

    async fn add(&self, alias: &Alias, lifetime: Lifetime) -> Result<bool, BackendError> {
        (&*self.0).add(alias, lifetime).await
    }

    async fn delete(&self, alias: &Alias) -> Result<bool, BackendError> {
        (&*self.0).delete(alias).await
    }

    async fn refresh(&self, alias: &Alias, lifetime: Lifetime) -> Result<(), BackendError> {
        (&*self.0).refresh(alias, lifetime).await
    }
}
