//! The reconcile loop against a fault-injecting fake backend: failures are reported, the
//! rest of the reconcile still happens, and failed IPs are retried next time. With a fake
//! host-port shield: no alias is ever on the node without its shield element.

mod fakes;

use std::net::IpAddr;
use std::sync::Mutex;

use aliaslb_agent::aliases::{AliasConfig, AliasManager, ReconcileError};
use aliaslb_agent::desired::DesiredSet;
use aliaslb_agent::kernel::backend::Lifetime;
use aliaslb_agent::shield::{
    Dropped, OpenPort, Protocol, Shield, ShieldBackend, ShieldError, TableView,
};
use aliaslb_core::report::ShieldState;
use fakes::FakeKernel as Fake;

const EPERM: i32 = 1;
const EIO: i32 = 5;

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
            routed_device: "lo".into(),
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
    assert_eq!(first.errors[0].category(), "permission_denied");
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
    assert_eq!(r.errors[0].category(), "snapshot_failed");
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

#[tokio::test(start_paused = true)]
async fn after_a_lifetime_without_refresh_nothing_is_re_created_blindly() {
    let fake = Fake::new();
    let mut m = manager(&fake);
    m.reconcile(&desired(&["10.0.0.1"])).await;
    let r = m.refresh_lifetimes().await;
    assert_eq!((r.refreshed, r.expired), (1, false));
    // Within the lifetime (4 s): refreshed as usual.
    tokio::time::advance(std::time::Duration::from_millis(3_900)).await;
    let r = m.refresh_lifetimes().await;
    assert_eq!((r.refreshed, r.expired), (1, false));
    // Frozen for a whole lifetime: the kernel may have dropped the alias, and another node
    // may hold the IP now; a refresh (an add that replaces) would re-create it unannounced.
    tokio::time::advance(std::time::Duration::from_secs(4)).await;
    let writes = m.writes().refreshes;
    let r = m.refresh_lifetimes().await;
    assert!(r.expired, "{r:?}");
    assert_eq!(r.refreshed, 0);
    assert_eq!(m.writes().refreshes, writes, "no kernel write");
    // The loop reconciles then; the next refresh goes on as usual.
    m.reconcile(&desired(&["10.0.0.1"])).await;
    let r = m.refresh_lifetimes().await;
    assert_eq!((r.refreshed, r.expired), (1, false));
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

/// A shield backend that records every script with the aliases on the fake node at the
/// moment it was applied; `fail` makes that many next applies fail.
#[derive(Debug)]
struct FakeShield<'a> {
    node: &'a Fake,
    log: Mutex<Vec<(String, Vec<IpAddr>)>>,
    fail: Mutex<u32>,
}

impl<'a> FakeShield<'a> {
    fn new(node: &'a Fake) -> Self {
        FakeShield {
            node,
            log: Mutex::new(Vec::new()),
            fail: Mutex::new(0),
        }
    }

    fn take(&self) -> Vec<(String, Vec<IpAddr>)> {
        std::mem::take(&mut self.log.lock().unwrap())
    }
}

impl ShieldBackend for &FakeShield<'_> {
    async fn apply(&self, script: &str) -> Result<(), ShieldError> {
        let mut fail = self.fail.lock().unwrap();
        if *fail > 0 {
            *fail -= 1;
            return Err(ShieldError::Nft {
                what: "apply",
                stderr: "Error: Could not process rule: No such file or directory".into(),
            });
        }
        drop(fail);
        self.log
            .lock()
            .unwrap()
            .push((script.to_owned(), self.node.ours()));
        Ok(())
    }
    async fn check(&self, _: &str) -> Result<(), ShieldError> {
        Ok(())
    }
    async fn inspect(&self) -> Result<Option<TableView>, ShieldError> {
        Ok(Some(TableView {
            rules: aliaslb_agent::shield::expected_rules(false),
            sets: aliaslb_agent::shield::SETS.map(str::to_owned).into(),
            dropped: Dropped::default(),
        }))
    }
    async fn chains(&self) -> Result<Option<std::collections::BTreeSet<String>>, ShieldError> {
        Ok(Some(
            aliaslb_agent::shield::expected_rules(false)
                .into_keys()
                .collect(),
        ))
    }
}

fn shielded<'a>(
    fake: &'a Fake,
    shield: &'a FakeShield<'a>,
) -> AliasManager<&'a Fake, &'a FakeShield<'a>> {
    manager(fake).with_shield(Some(Shield::new(shield)))
}

fn web(ips: &[&str]) -> DesiredSet {
    let mut d = desired(ips);
    for i in ips {
        d.open(
            ip(i),
            [OpenPort {
                protocol: Protocol::Tcp,
                port: 80,
            }],
        );
    }
    d
}

#[tokio::test]
async fn the_shield_element_comes_before_the_alias_and_goes_after_it() {
    let fake = Fake::new();
    let nft = FakeShield::new(&fake);
    let mut m = shielded(&fake, &nft);
    assert_eq!(m.shield_state(), ShieldState::Active);

    m.reconcile(&web(&["10.0.0.1"])).await;
    let log = nft.take();
    assert_eq!(log.len(), 1, "one table write, nothing after: {log:?}");
    let (script, on_node) = &log[0];
    assert!(
        script.starts_with("add table inet aliaslb\ndelete table inet aliaslb\n"),
        "{script}"
    );
    assert!(
        script.contains("held4 { 10.0.0.1 }") && script.contains("ports4 { 10.0.0.1 . tcp . 80 }"),
        "{script}"
    );
    assert!(
        on_node.is_empty(),
        "the element was written before the alias: {on_node:?}"
    );
    assert_eq!(fake.ours(), vec![ip("10.0.0.1")]);

    // A second IP: one element update, still before its alias.
    m.reconcile(&web(&["10.0.0.1", "10.0.0.2"])).await;
    let log = nft.take();
    assert_eq!(log.len(), 1, "{log:?}");
    assert_eq!(
        log[0].0,
        "add element inet aliaslb held4 { 10.0.0.2 }\nadd element inet aliaslb ports4 { 10.0.0.2 . tcp . 80 }\n"
    );
    assert_eq!(log[0].1, vec![ip("10.0.0.1")]);

    // Idle: nothing written.
    m.reconcile(&web(&["10.0.0.1", "10.0.0.2"])).await;
    assert!(nft.take().is_empty());

    // Removal: the element goes once the alias is gone.
    m.reconcile(&web(&["10.0.0.2"])).await;
    let log = nft.take();
    assert_eq!(log.len(), 1, "{log:?}");
    assert!(
        log[0]
            .0
            .starts_with("delete element inet aliaslb held4 { 10.0.0.1 }"),
        "{}",
        log[0].0
    );
    assert_eq!(log[0].1, vec![ip("10.0.0.2")], "written after the delete");

    m.release_all().await;
    m.remove_shield().await.unwrap();
    let log = nft.take();
    assert_eq!(
        log.last().unwrap().0,
        "add table inet aliaslb\ndelete table inet aliaslb\n"
    );
    assert!(
        log.last().unwrap().1.is_empty(),
        "the table goes after the aliases"
    );
}

#[tokio::test]
async fn no_alias_is_added_while_its_element_cannot_be_written() {
    let fake = Fake::new();
    let nft = FakeShield::new(&fake);
    let mut m = shielded(&fake, &nft);
    m.reconcile(&web(&["10.0.0.1"])).await;
    nft.take();

    *nft.fail.lock().unwrap() = 1;
    let r = m.reconcile(&web(&["10.0.0.1", "10.0.0.2"])).await;
    assert!(r.added.is_empty(), "{:?}", r.added);
    assert!(
        r.errors.iter().any(|e| e.category() == "nft_failed"),
        "{:?}",
        r.errors
    );
    assert_eq!(fake.ours(), vec![ip("10.0.0.1")], "the held alias stays");
    // The retry in the same pass (after the writes) rewrites the whole table and works.
    let log = nft.take();
    assert_eq!(log.len(), 1, "{log:?}");
    assert!(
        log[0].0.starts_with("add table inet aliaslb"),
        "{}",
        log[0].0
    );
    assert!(
        !log[0].0.contains("10.0.0.2"),
        "not added, not shielded: {}",
        log[0].0
    );
    assert_eq!(m.shield_state(), ShieldState::Active);

    let r = m.reconcile(&web(&["10.0.0.1", "10.0.0.2"])).await;
    assert_eq!(r.added.len(), 1);
    assert_eq!(fake.ours(), vec![ip("10.0.0.1"), ip("10.0.0.2")]);
    let log = nft.take();
    assert!(
        log[0].0.contains("held4 { 10.0.0.2 }") && log[0].1 == vec![ip("10.0.0.1")],
        "{log:?}"
    );
}

#[tokio::test]
async fn a_failing_shield_is_reported_and_an_alias_that_cannot_be_deleted_stays_shielded() {
    let fake = Fake::new();
    let nft = FakeShield::new(&fake);
    let mut m = shielded(&fake, &nft);
    m.reconcile(&web(&["10.0.0.1", "10.0.0.2"])).await;
    nft.take();

    fake.fail_once("delete", Some("10.0.0.1"), EIO);
    m.reconcile(&web(&["10.0.0.2"])).await;
    assert!(
        nft.take().is_empty(),
        "10.0.0.1 is still on the node: its element stays"
    );
    assert!(m.shield().unwrap().contents().contains(ip("10.0.0.1")));
    m.reconcile(&web(&["10.0.0.2"])).await;
    assert!(!m.shield().unwrap().contents().contains(ip("10.0.0.1")));

    // Both writes of a pass fail: the report says failing until a write works.
    *nft.fail.lock().unwrap() = 2;
    let r = m.reconcile(&web(&["10.0.0.2", "10.0.0.3"])).await;
    assert_eq!(r.errors.len(), 2, "{:?}", r.errors);
    assert_eq!(m.shield_state(), ShieldState::Failing);
    assert_eq!(m.shield().unwrap().errors(), 2);
    assert_eq!(
        fake.ours(),
        vec![ip("10.0.0.2")],
        "10.0.0.3 waits for its element"
    );
    m.reconcile(&web(&["10.0.0.2", "10.0.0.3"])).await;
    assert_eq!(m.shield_state(), ShieldState::Active);
    assert_eq!(fake.ours(), vec![ip("10.0.0.2"), ip("10.0.0.3")]);
}
