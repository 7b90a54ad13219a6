//! A server that cannot start yields an error naming it, with the tail of its log, quickly
//! (not after the readiness timeout), and leaves no process behind.

use std::time::{Duration, Instant};

use aliaslb_testenv::{Error, TestEnv};

#[test]
fn apiserver_start_failure_reports_its_log_tail() {
    let started = Instant::now();
    let err = TestEnv::start_with(&["--no-such-flag=1"]).expect_err("unknown flag must fail");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "took {:?}: the exit was not noticed",
        started.elapsed()
    );
    let Error::StartUp {
        server,
        reason,
        tail,
        log,
    } = &err
    else {
        panic!("expected a start-up error, got {err}");
    };
    assert_eq!(*server, "kube-apiserver");
    assert!(reason.contains("exited"), "{reason}");
    assert!(tail.contains("unknown flag: --no-such-flag"), "{tail}");
    assert!(err.to_string().contains("unknown flag: --no-such-flag"));

    // The failed environment was dropped: etcd is stopped and the folder removed.
    let dir = log.parent().unwrap();
    assert!(!dir.exists(), "{} left behind", dir.display());
    let needle = dir.to_string_lossy().into_owned();
    for entry in std::fs::read_dir("/proc").unwrap().filter_map(Result::ok) {
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline);
        assert!(!cmdline.contains(&needle), "still running: {cmdline}");
    }
}
