//! The servers never outlive the process that started them: not when a `TestEnv` is dropped,
//! not when a test binary exits with the global environment still up (statics are never
//! dropped), and not when it is killed with SIGKILL.
//!
//! Runs without the libtest harness: it re-executes itself as the child holding the
//! environment (`ALIASLB_TESTENV_TEARDOWN_CHILD=exit|sigkill`) and inspects /proc afterwards.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use aliaslb_testenv::TestEnv;

const CHILD_ENV: &str = "ALIASLB_TESTENV_TEARDOWN_CHILD";

/// A named check: `Err` carries why it failed.
type Case = (&'static str, fn() -> Result<(), String>);

fn main() {
    if let Ok(mode) = std::env::var(CHILD_ENV) {
        child(&mode);
        return;
    }
    let cases: [Case; 3] = [
        ("drop_stops_servers_and_removes_dir", drop_stops_servers),
        ("exit_with_global_env_stops_servers", || {
            child_death_stops_servers("exit")
        }),
        ("sigkill_of_test_process_stops_servers", || {
            child_death_stops_servers("sigkill")
        }),
    ];
    // Speak enough of libtest's command line for `cargo test NAME`, `--list` and nextest.
    let args: Vec<String> = std::env::args().skip(1).collect();
    let has = |flag: &str| args.iter().any(|a| a == flag);
    let filters: Vec<&str> = args
        .iter()
        .filter(|a| !a.starts_with('-'))
        .map(String::as_str)
        .collect();
    let selected: Vec<Case> = cases
        .into_iter()
        .filter(|_| !has("--ignored"))
        .filter(|(name, _)| {
            filters.is_empty()
                || filters.iter().any(|f| {
                    if has("--exact") {
                        name == f
                    } else {
                        name.contains(f)
                    }
                })
        })
        .collect();
    if has("--list") {
        for (name, _) in &selected {
            println!("{name}: test");
        }
        return;
    }

    let mut failed = 0;
    for (name, case) in &selected {
        match case() {
            Ok(()) => println!("test {name} ... ok"),
            Err(why) => {
                failed += 1;
                println!("test {name} ... FAILED\n{why}");
            }
        }
    }
    println!(
        "\nteardown: {} passed, {failed} failed",
        selected.len() - failed
    );
    if failed > 0 {
        std::process::exit(1);
    }
}

/// Child side: start the global environment, report its folder, then die as told.
fn child(mode: &str) {
    let env = TestEnv::global();
    println!("DIR {}", env.dir().display());
    match mode {
        "exit" => std::process::exit(0),
        "sigkill" => loop {
            std::thread::sleep(Duration::from_secs(1));
        },
        other => panic!("unknown {CHILD_ENV} mode {other:?}"),
    }
}

fn drop_stops_servers() -> Result<(), String> {
    let env = TestEnv::start().map_err(|e| e.to_string())?;
    let dir = env.dir().to_owned();
    let running = processes_mentioning(&dir);
    if running.len() < 2 {
        return Err(format!(
            "expected etcd and kube-apiserver running, found {running:?}"
        ));
    }
    drop(env);
    // Drop waits for the supervisors, so everything must be gone right away.
    let left = processes_mentioning(&dir);
    if !left.is_empty() {
        return Err(format!("still running after drop: {left:?}"));
    }
    if dir.exists() {
        return Err(format!("{} not removed", dir.display()));
    }
    Ok(())
}

fn child_death_stops_servers(mode: &str) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut child = Command::new(exe)
        .env(CHILD_ENV, mode)
        .env_remove("ALIASLB_TESTENV_KEEP")
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    let stdout = child.stdout.take().ok_or("no child stdout")?;
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .map_err(|e| e.to_string())?;
    let dir = PathBuf::from(
        line.trim()
            .strip_prefix("DIR ")
            .ok_or_else(|| format!("child did not report its env: {line:?}"))?,
    );
    if mode == "sigkill" {
        let running = processes_mentioning(&dir);
        if running.len() < 2 {
            return Err(format!(
                "expected etcd and kube-apiserver running, found {running:?}"
            ));
        }
        child.kill().map_err(|e| e.to_string())?;
    }
    let status = child.wait().map_err(|e| e.to_string())?;
    let started = Instant::now();
    // TERM, then at most 10 s until KILL: allow a little more.
    while started.elapsed() < Duration::from_secs(15) {
        if processes_mentioning(&dir).is_empty() && !dir.exists() {
            println!(
                "  {mode}: child {status}, servers gone and dir removed after {:?}",
                started.elapsed()
            );
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(format!(
        "after the child ({status}) ended: still running {:?}, dir exists: {}",
        processes_mentioning(&dir),
        dir.exists()
    ))
}

/// `(pid, command line)` of every process whose command line mentions `dir`.
fn processes_mentioning(dir: &Path) -> Vec<(u32, String)> {
    let needle = dir.to_string_lossy().into_owned();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&raw).replace('\0', " ");
            cmdline.contains(&needle).then_some((pid, cmdline))
        })
        .collect()
}
