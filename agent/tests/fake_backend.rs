//! The reconcile loop against a fault-injecting fake backend: failures are reported, the
//! rest of the reconcile still happens, and failed IPs are retried next time.

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;
use std::sync::Mutex;

use aliaslb_agent::aliases::{AliasConfig, AliasManager, DesiredSet, ReconcileError};
use aliaslb_agent::backend::{AddressBackend, BackendError, Lifetime};
use aliaslb_agent::host::{Alias, HostAddress, HostState, Link};

const EPERM: i32 = 1;
const EIO: i32 = 5;

/// A node with `eth0` (192.168.1.10/24, default route) whose address table is kept in
/// memory; `fail` makes the next operation named `op` on an IP fail with an errno.
#[derive(Debug, Default)]
struct Fake {
    host: Mutex<HostState>,
    fail: Mutex<HashMap<(&'static str, Option<IpAddr>), i32>>,
}

impl Fake {
    fn new() -> Self {
        let fake = Fake::default();
        *fake.host.lock().unwrap() = HostState {
            links: vec![Link {
                index: 2,
                name: "eth0".into(),
                mac: Some([2, 0, 0, 0, 0, 2]),
                up: true,
            }],
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

    fn fail_once(&self, op: &'static str, target: Option<&str>, errno: i32) {
        self.fail
            .lock()
            .unwrap()
            .insert((op, target.map(ip)), errno);
    }

    fn injected(&self, op: &'static str, target: Option<IpAddr>) -> Result<(), BackendError> {
        match self.fail.lock().unwrap().remove(&(op, target)) {
            Some(errno) => Err(BackendError::Kernel {
                op,
                target: target.map_or("-".into(), |t| t.to_string()),
                source: io::Error::from_raw_os_error(errno),
            }),
            None => Ok(()),
        }
    }

    fn ours(&self) -> Vec<IpAddr> {
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
}

impl AddressBackend for &Fake {
    async fn snapshot(&self) -> Result<HostState, BackendError> {
        self.injected("snapshot", None)?;
        Ok(self.host.lock().unwrap().clone())
    }

    async fn add(&self, alias: &Alias, _: Lifetime) -> Result<bool, BackendError> {
        self.injected("add", Some(alias.ip))?;
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
        self.injected("delete", Some(alias.ip))?;
        let mut host = self.host.lock().unwrap();
        let before = host.addresses.len();
        host.addresses
            .retain(|a| !(a.ip == alias.ip && a.ifindex == alias.ifindex));
        Ok(host.addresses.len() != before)
    }

    async fn refresh(&self, alias: &Alias, _: Lifetime) -> Result<(), BackendError> {
        self.injected("refresh", Some(alias.ip))
    }
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn desired(ips: &[&str]) -> DesiredSet {
    ips.iter().map(|s| (ip(s), None)).collect()
}

fn manager(fake: &Fake) -> AliasManager<&Fake> {
    AliasManager::new(
        fake,
        AliasConfig {
            interface_override: None,
            lifetime: Lifetime { seconds: 4 },
        },
    )
}

#[tokio::test]
async fn failed_add_is_reported_others_done_and_retried_next_time() {
    let fake = Fake::new();
    let mut m = manager(&fake);
    fake.fail_once("add", Some("10.0.0.2"), EPERM);
    let want = desired(&["10.0.0.1", "10.0.0.2", "10.0.0.3"]);

    let first = m.reconcile(&want).await;
    assert_eq!(first.added.len(), 2);
    assert_eq!(first.errors.len(), 1);
    assert_eq!(first.errors[0].category(), "PermissionDenied");
    assert!(first.errors[0].to_string().starts_with("add 10.0.0.2: "));
    assert_eq!(fake.ours(), vec![ip("10.0.0.1"), ip("10.0.0.3")]);
    assert_eq!(m.held_ips(), vec![ip("10.0.0.1"), ip("10.0.0.3")]);

    let second = m.reconcile(&want).await;
    assert!(second.errors.is_empty(), "{:?}", second.errors);
    assert_eq!(second.added.len(), 1);
    assert_eq!(second.added[0].ip, ip("10.0.0.2"));
    assert_eq!(m.writes().adds, 4, "3 + the retry, nothing re-added");

    let idle = m.reconcile(&want).await;
    assert!(!idle.changed());
    assert_eq!(m.writes().adds, 4);
}

#[tokio::test]
async fn failed_delete_is_reported_and_not_refreshed_any_more() {
    let fake = Fake::new();
    let mut m = manager(&fake);
    m.reconcile(&desired(&["10.0.0.1", "10.0.0.2"])).await;
    fake.fail_once("delete", Some("10.0.0.1"), EIO);
    let r = m.reconcile(&desired(&["10.0.0.2"])).await;
    assert_eq!(r.errors.len(), 1);
    assert!(matches!(r.errors[0], ReconcileError::Write(_)));
    // Still on the node, but no longer ours to keep alive: it expires with its lifetime.
    assert_eq!(fake.ours(), vec![ip("10.0.0.1"), ip("10.0.0.2")]);
    let refreshed = m.refresh_lifetimes().await;
    assert_eq!(refreshed.refreshed, 1);
    // The next reconcile removes it.
    let r = m.reconcile(&desired(&["10.0.0.2"])).await;
    assert_eq!(r.removed.len(), 1);
    assert_eq!(fake.ours(), vec![ip("10.0.0.2")]);
}

#[tokio::test]
async fn unreadable_node_changes_nothing() {
    let fake = Fake::new();
    let mut m = manager(&fake);
    fake.fail_once("snapshot", None, EPERM);
    let r = m.reconcile(&desired(&["10.0.0.1"])).await;
    assert!(matches!(r.errors[..], [ReconcileError::Snapshot(_)]));
    assert_eq!(r.errors[0].category(), "SnapshotFailed");
    assert_eq!(m.writes().adds, 0);
    assert!(fake.ours().is_empty());
}

#[tokio::test]
async fn refresh_counts_and_reports_failures() {
    let fake = Fake::new();
    let mut m = manager(&fake);
    m.reconcile(&desired(&["10.0.0.1", "10.0.0.2"])).await;
    fake.fail_once("refresh", Some("10.0.0.2"), EIO);
    let r = m.refresh_lifetimes().await;
    assert_eq!(r.refreshed, 1);
    assert_eq!(r.errors.len(), 1);
    assert_eq!(m.writes().refreshes, 2);
    assert_eq!(m.writes().adds, 2, "refreshes are counted apart from adds");
}

#[tokio::test]
async fn release_all_removes_every_alias_of_ours_and_nothing_else() {
    let fake = Fake::new();
    let mut m = manager(&fake);
    m.reconcile(&desired(&["10.0.0.1", "10.0.0.2"])).await;
    let r = m.release_all().await;
    assert_eq!(r.removed.len(), 2);
    assert!(fake.ours().is_empty());
    assert_eq!(
        fake.host.lock().unwrap().addresses.len(),
        1,
        "node address kept"
    );
    assert_eq!(m.held_ips(), Vec::<IpAddr>::new());
}

#[tokio::test]
async fn release_all_falls_back_to_what_it_holds_when_the_node_is_unreadable() {
    let fake = Fake::new();
    let mut m = manager(&fake);
    m.reconcile(&desired(&["10.0.0.1"])).await;
    fake.fail_once("snapshot", None, EIO);
    let r = m.release_all().await;
    assert_eq!(r.removed.len(), 1);
    assert!(fake.ours().is_empty());
}
