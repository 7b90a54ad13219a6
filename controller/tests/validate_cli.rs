//! `aliaslb validate` as CI runs it: the built binary, files under `tests/data/`, exact
//! stdout (golden files `tests/data/NAME.stdout`), stderr and exit status.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data")
}

/// What one run of the binary produced.
#[derive(Debug)]
struct Run {
    status: i32,
    stdout: String,
    stderr: String,
}

/// Runs `aliaslb ARGS` in `tests/data`, feeding `stdin`.
fn aliaslb(args: &[&str], stdin: &str) -> Run {
    let mut child = Command::new(env!("CARGO_BIN_EXE_aliaslb"))
        .args(args)
        .current_dir(data_dir())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run aliaslb");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    Run {
        status: output.status.code().expect("exited"),
        stdout: String::from_utf8(output.stdout).unwrap(),
        stderr: String::from_utf8(output.stderr).unwrap(),
    }
}

fn golden(name: &str) -> String {
    std::fs::read_to_string(data_dir().join(format!("{name}.stdout"))).unwrap()
}

#[test]
fn classic_example_is_accepted_verbatim() {
    let run = aliaslb(&["validate", "classic.yaml"], "");
    assert_eq!(run.status, 0, "{run:?}");
    assert_eq!(
        run.stdout,
        "classic.yaml:1: ConfigMap aliaslb-pools: valid, 2 pools\n\
         classic.yaml:7: default: 3 entries, 3 IPv4 and 0 IPv6 addresses\n\
         classic.yaml:11: staging: 3 entries, 27 IPv4 and 18446744073709551615 IPv6 addresses\n"
    );
    assert_eq!(run.stderr, "");
}

#[test]
fn golden_outputs_and_exit_codes() {
    for (name, status) in [
        ("classic", 0),
        ("extended", 0),
        ("bare-data", 0),
        ("bad-entries", 1),
        ("bad-options", 1),
        ("unknown-pool-options", 1),
        ("multi", 1),
    ] {
        let file = format!("{name}.yaml");
        let run = aliaslb(&["validate", &file], "");
        assert_eq!(run.stdout, golden(name), "{name}: {run:?}");
        assert_eq!(run.status, status, "{name}: {run:?}");
        assert_eq!(run.stderr, "", "{name}");
    }
}

#[test]
fn each_bad_entry_is_reported_at_its_file_line() {
    let run = aliaslb(&["validate", "bad-entries.yaml"], "");
    assert_eq!(run.status, 1);
    let source: Vec<&str> = include_str!("data/bad-entries.yaml").lines().collect();
    // Every error names the file line holding the offending text (or the key).
    for line in run.stdout.lines() {
        let mut parts = line.splitn(3, ':');
        assert_eq!(parts.next(), Some("bad-entries.yaml"));
        let number: usize = parts.next().unwrap().parse().unwrap();
        let message = parts.next().unwrap();
        let key = message
            .trim_start()
            .strip_prefix("key ")
            .and_then(|m| m.split([',', ':']).next())
            .unwrap();
        let at = source[number - 1];
        match message.rsplit_once("(`") {
            Some((_, text)) if message.contains(", line ") => {
                let text = text.trim_end_matches("`)");
                assert!(at.contains(text), "{line}: file line is {at:?}");
            }
            _ => assert!(
                at.trim_start().starts_with(key),
                "{line}: file line is {at:?}"
            ),
        }
    }
    assert_eq!(run.stdout.lines().count(), 10);
}

#[test]
fn stdin_is_read_for_dash() {
    let run = aliaslb(&["validate", "-"], include_str!("data/classic.yaml"));
    assert_eq!(run.status, 0, "{run:?}");
    assert_eq!(
        run.stdout,
        golden("classic").replace("classic.yaml", "<stdin>")
    );
}

#[test]
fn usage_errors_exit_2_on_stderr() {
    for (args, stderr) in [
        (
            vec!["validate", "deployment.yaml"],
            "aliaslb: deployment.yaml:8: not a ConfigMap (kind: Deployment): expected `kind: ConfigMap` or a bare `data:` map\n",
        ),
        (
            vec!["validate", "not-yaml.yaml"],
            "aliaslb: not-yaml.yaml:5: not valid YAML: did not find expected ',' or ']' at line 5 column 1, while parsing a flow sequence at line 4 column 12\n",
        ),
        (
            vec!["validate", "empty.yaml"],
            "aliaslb: empty.yaml: no YAML document: expected a ConfigMap\n",
        ),
        (
            vec!["validate", "missing.yaml"],
            "aliaslb: missing.yaml: cannot read: No such file or directory (os error 2)\n",
        ),
    ] {
        let run = aliaslb(&args, "");
        assert_eq!(run.status, 2, "{args:?}: {run:?}");
        assert_eq!(run.stderr, stderr, "{args:?}");
        assert_eq!(run.stdout, "", "{args:?}");
    }
    let run = aliaslb(&["validate"], "");
    assert_eq!(run.status, 2, "{run:?}");
    assert!(run.stderr.contains("<FILE>..."), "{}", run.stderr);
}

#[test]
fn every_file_is_checked_and_the_worst_status_wins() {
    let run = aliaslb(&["validate", "bad-options.yaml", "classic.yaml"], "");
    assert_eq!(run.status, 1);
    assert_eq!(run.stdout, golden("bad-options") + &golden("classic"));
    let run = aliaslb(&["validate", "missing.yaml", "bad-options.yaml"], "");
    assert_eq!(run.status, 2);
    assert_eq!(run.stdout, golden("bad-options"));
}

#[test]
fn named_pools_draining_and_their_mistakes_with_file_lines() {
    let run = aliaslb(&["validate", "named.yaml"], "");
    assert_eq!(run.stdout, golden("named"), "{run:?}");
    assert_eq!(run.status, 1, "the second ConfigMap is invalid");
    assert_eq!(run.stderr, "");
}
