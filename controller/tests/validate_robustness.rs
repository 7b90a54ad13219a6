//! Robustness of `aliaslb validate` against arbitrary files: arbitrary bytes, arbitrary
//! unicode, ConfigMap-shaped documents from a small grammar, and those with a character
//! inserted, deleted or replaced. In-process through `validate::run` / `check_text` for many
//! cases, and through the built binary for a few dozen.
//!
//! Properties: no panic (exit status never 101, no "panicked"), status 0, 1 or 2, every
//! report line names the file and a line of it, every non-zero status comes with at least
//! one message, the output is deterministic, and the binary prints what the library does.
//!
//! Case counts are small by default; `PROPTEST_CASES=N` sets the in-process count and
//! `ALIASLB_BINARY_CASES=N` the number of binary runs (see BENCHMARKS.md).

use std::path::Path;
use std::process::Command;

use aliaslb_controller::cli::validate::{
    EXIT_INVALID, EXIT_USAGE, EXIT_VALID, STDIN, STDIN_NAME, check_text, run,
};
use proptest::prelude::*;
use proptest::test_runner::{TestCaseError, TestRunner};

/// Binary runs: `ALIASLB_BINARY_CASES`, else 24. Run through a [`TestRunner`] of our own,
/// because the `proptest!` macro lets `PROPTEST_CASES` override any configured count, and a
/// long in-process run must not mean 100,000 pairs of process spawns.
fn binary_cases() -> u32 {
    std::env::var("ALIASLB_BINARY_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(24)
}

// ---------------------------------------------------------------------------------------
// Generators.
// ---------------------------------------------------------------------------------------

/// A pool entry, valid or nearly so.
fn entry() -> impl Strategy<Value = String> {
    let v4 = prop_oneof![
        (0u8..4, any::<u8>()).prop_map(|(c, d)| format!("10.0.{c}.{d}")),
        Just("127.0.0.1".to_owned()),
        Just("1.2.3".to_owned()),
        Just("010.0.0.1".to_owned()),
    ];
    let v6 = prop_oneof![
        any::<u16>().prop_map(|n| format!("2001:db8::{n:x}")),
        Just("fe80::1%eth0".to_owned()),
        Just("::ffff:10.0.0.1".to_owned()),
    ];
    let addr = prop_oneof![3 => v4, 1 => v6];
    prop_oneof![
        3 => addr.clone(),
        2 => (addr.clone(), 0u8..140).prop_map(|(a, p)| format!("{a}/{p}")),
        2 => (addr.clone(), prop::sample::select(vec!["-", " - ", "--", "/"]), addr)
            .prop_map(|(a, s, b)| format!("{a}{s}{b}")),
        1 => "[ -~]{0,12}",
    ]
}

/// A key under `data:`, plain or quoted, valid or not.
fn data_key() -> impl Strategy<Value = String> {
    prop::sample::select(vec![
        "default",
        "default",
        "staging",
        "prod",
        "_fallback",
        "config.yaml",
        "Bad",
        "a_b",
        "\"default\"",
        "'staging'",
        "\"a\\nb\"",
        "\"tab\\there\"",
        "? complex",
        "123",
        "true",
        "~",
        "[a, b]",
        "{a: b}",
        "\"\"",
        "-x",
        "line 99999999999999999999",
    ])
    .prop_map(String::from)
}

/// One `key: value` under `data:`, in one of YAML's scalar styles (or not a scalar).
fn data_item() -> impl Strategy<Value = String> {
    let block_lines = prop::collection::vec(
        (entry(), prop::sample::select(vec!["", "", "  # c", "#x"])),
        0..5,
    )
    .prop_map(|lines| {
        lines
            .iter()
            .map(|(e, c)| format!("    {e}{c}\n"))
            .collect::<String>()
    });
    let options = prop::sample::select(vec![
        "    pools:\n      default:\n        interface: eth1\n",
        "    pools:\n      staging: {allowSharing: false}\n",
        "    pools:\n      default: {interface: [x}\n",
        "    pools:\n      nope: {}\n",
        "    pool: 1\n",
        "    pools: [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\n",
    ]);
    let indicator = prop::sample::select(vec!["|", "|-", "|+", ">", "|2", "|-1", ">-"]);
    prop_oneof![
        4 => (data_key(), indicator.clone(), block_lines).prop_map(|(k, i, v)| format!("  {k}: {i}\n{v}")),
        1 => (indicator, options).prop_map(|(i, v)| format!("  config.yaml: {i}\n{v}")),
        2 => (data_key(), entry()).prop_map(|(k, e)| format!("  {k}: '{}'\n", e.replace('\'', "''"))),
        1 => (data_key(), entry()).prop_map(|(k, e)| format!("  {k}: {e}\n")),
        1 => (data_key(), entry()).prop_map(|(k, e)| format!("  {k}: \"{e}\\n{e}\"\n")),
        1 => (data_key(), prop::sample::select(vec!["42", "[1, 2]", "{a: 1}", "~", "", "!!binary aGk=", "*nope", "&a x"]))
            .prop_map(|(k, v)| format!("  {k}: {v}\n")),
    ]
}

/// One YAML document: a ConfigMap (or something else) with a `data:` map (or not).
fn document() -> impl Strategy<Value = String> {
    let header = prop_oneof![
        6 => prop::sample::select(vec![
            "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: aliaslb-pools\n",
            "kind: ConfigMap\nmetadata: {name: x}\n",
            "kind: ConfigMap\n",
            "",
            "# only a comment\n",
            "metadata:\n  name: y\n",
        ]),
        1 => prop::sample::select(vec![
            "kind: Secret\n",
            "kind: [ConfigMap]\n",
            "kind: !Tag ConfigMap\n",
            "- a\n",
        ]),
    ];
    let data = prop_oneof![
        4 => prop::collection::vec(data_item(), 0..5).prop_map(|items| format!("data:\n{}", items.concat())),
        1 => prop::sample::select(vec!["data: {}\n", "data: ~\n", "data: [1]\n", "data: x\n", "data:\n", ""])
            .prop_map(String::from),
        1 => prop::collection::vec(data_item(), 0..3)
            .prop_map(|items| format!("data:\n{}", items.concat().replace("  ", "\t"))),
    ];
    (header, data).prop_map(|(h, d)| format!("{h}{d}"))
}

/// A small edit at a position given as a fraction of the text's length.
fn mutate(text: &str, edit: u8, at: f64, c: char) -> String {
    let mut chars: Vec<char> = text.chars().collect();
    let i = ((chars.len() as f64) * at) as usize;
    match edit % 3 {
        0 => chars.insert(i.min(chars.len()), c),
        1 if i < chars.len() => {
            chars.remove(i);
        }
        2 if i < chars.len() => chars[i] = c,
        _ => {}
    }
    chars.into_iter().collect()
}

/// A file's bytes, shown escaped (`\xff`, `\n`) in failing cases.
#[derive(Clone, PartialEq, Eq)]
struct Bytes(Vec<u8>);

impl std::fmt::Debug for Bytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "b\"{}\"", self.0.escape_ascii())
    }
}

/// A whole file as bytes: structured documents (possibly mutated), arbitrary unicode or
/// arbitrary bytes.
fn file_bytes() -> impl Strategy<Value = Bytes> {
    let structured = || {
        let separator =
            prop::sample::select(vec!["---\n", "--- # next\n", "\n---\n", "...\n---\n"]);
        (prop_oneof![3 => prop::collection::vec(document(), 1..2), 1 => prop::collection::vec(document(), 2..4)], separator, any::<bool>()).prop_map(
            |(docs, sep, lead)| {
                let body = docs.join(sep);
                if lead { format!("# leading comment\n---\n{body}") } else { body }
            },
        )
    };
    let edit_char = prop_oneof![
        4 => prop::sample::select(vec![
            '\t', ':', '-', '|', '"', '\'', '\n', ' ', '#', '[', '{', '&', '*', '!', '\r',
            '\u{FEFF}', '\u{2028}', '\u{85}', '\0',
        ]),
        1 => any::<char>(),
    ];
    prop_oneof![
        8 => structured().prop_map(String::into_bytes),
        3 => (structured(), prop::collection::vec((any::<u8>(), 0.0..1.0f64, edit_char), 1..4))
            .prop_map(|(text, edits)| {
                edits.iter().fold(text, |t, (e, at, c)| mutate(&t, *e, *at, *c)).into_bytes()
            }),
        1 => any::<String>().prop_map(String::into_bytes),
        1 => prop::collection::vec(any::<u8>(), 0..200),
        1 => "[a-z:{}\\[\\],|>'\"#&*!% \n\t-]{0,80}".prop_map(String::into_bytes),
    ]
    .prop_map(Bytes)
}

// ---------------------------------------------------------------------------------------
// Checks.
// ---------------------------------------------------------------------------------------

/// What one run printed.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Output {
    status: u8,
    stdout: String,
    stderr: String,
}

fn run_in_process(files: &[String], stdin: &[u8]) -> Output {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let status = run(files, &mut &stdin[..], &mut out, &mut err);
    Output {
        status,
        stdout: String::from_utf8(out).expect("stdout is UTF-8"),
        stderr: String::from_utf8(err).expect("stderr is UTF-8"),
    }
}

/// Lines of `bytes` as YAML (libyaml) counts them: `\r\n`, `\r`, `\n`, U+0085, U+2028 and
/// U+2029 each end a line.
fn yaml_line_count(bytes: &[u8]) -> usize {
    String::from_utf8_lossy(bytes)
        .replace("\r\n", "\n")
        .split(['\r', '\n', '\u{85}', '\u{2028}', '\u{2029}'])
        .count()
        - usize::from(bytes.ends_with(b"\n") || bytes.ends_with(b"\r"))
}

/// The checks on one run over `files` (display names and contents; `None` for a file that
/// cannot be read).
fn check_output(files: &[(String, Option<Vec<u8>>)], output: &Output) -> Result<(), TestCaseError> {
    prop_assert!(
        [EXIT_VALID, EXIT_INVALID, EXIT_USAGE].contains(&output.status),
        "status {}",
        output.status
    );
    prop_assert!(!output.stderr.contains("panicked"), "{output:?}");
    let line_count = |name: &str| -> Option<usize> {
        files
            .iter()
            .find(|(n, _)| n == name)
            .and_then(|(_, bytes)| bytes.as_ref())
            .map(|b| yaml_line_count(b).max(1))
    };
    // Report lines: `FILE:LINE: message`, LINE a line of FILE.
    for line in output.stdout.lines() {
        let named = files.iter().find_map(|(name, _)| {
            let rest = line.strip_prefix(name.as_str())?.strip_prefix(':')?;
            let (number, _) = rest.split_once(": ")?;
            Some((name, number.parse::<usize>().ok()?))
        });
        prop_assert!(
            named.is_some(),
            "stdout line names no file and line: {line:?}\n{output:?}"
        );
        let (name, number) = named.unwrap();
        let count = line_count(name).unwrap_or(1);
        prop_assert!(
            (1..=count).contains(&number),
            "{name}:{number}: the file has {count} lines\n{output:?}"
        );
    }
    // Usage errors: `aliaslb: FILE...`.
    for line in output.stderr.lines() {
        prop_assert!(
            files
                .iter()
                .any(|(name, _)| line.starts_with(&format!("aliaslb: {name}"))),
            "stderr line names no file: {line:?}\n{output:?}"
        );
    }
    match output.status {
        EXIT_VALID => prop_assert!(
            output.stderr.is_empty() && !output.stdout.is_empty(),
            "{output:?}"
        ),
        EXIT_INVALID => prop_assert!(!output.stdout.is_empty(), "{output:?}"),
        _ => prop_assert!(!output.stderr.is_empty(), "{output:?}"),
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// Arbitrary bytes on stdin through `run`, twice, and the same text through `check_text`.
    #[test]
    fn validate_is_total_and_deterministic(bytes in file_bytes()) {
        let bytes = bytes.0;
        let files = [STDIN.to_owned()];
        let first = run_in_process(&files, &bytes);
        check_output(&[(STDIN_NAME.to_owned(), Some(bytes.clone()))], &first)?;
        prop_assert_eq!(&run_in_process(&files, &bytes), &first, "not deterministic");
        match std::str::from_utf8(&bytes) {
            // Not UTF-8: the file cannot be read as text.
            Err(_) => prop_assert_eq!(first.status, EXIT_USAGE),
            Ok(text) => match check_text(STDIN_NAME, text) {
                Err(e) => {
                    prop_assert_eq!(first.status, EXIT_USAGE);
                    prop_assert_eq!(&first.stderr, &format!("aliaslb: {e}\n"));
                }
                Ok(report) => {
                    prop_assert_eq!(first.status, if report.valid { EXIT_VALID } else { EXIT_INVALID });
                    prop_assert_eq!(&first.stdout, &report.lines.iter().map(|l| format!("{l}\n")).collect::<String>());
                }
            },
        }
    }
}

/// The built binary on one to three random files (sometimes a missing one or a
/// directory), twice: exits 0, 1 or 2 without panicking, prints what `run` prints.
#[test]
fn binary_is_total_and_deterministic() {
    let config = ProptestConfig {
        cases: binary_cases(),
        ..ProptestConfig::default()
    };
    let files = prop::collection::vec(prop::option::weighted(0.9, file_bytes()), 1..4);
    let mut runner = TestRunner::new(config);
    if let Err(e) = runner.run(&files, check_binary) {
        panic!("{e}");
    }
}

fn check_binary(contents: Vec<Option<Bytes>>) -> Result<(), TestCaseError> {
    let dir = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    for (i, bytes) in contents.iter().enumerate() {
        let name = format!("pools-{i}.yaml");
        match bytes {
            Some(bytes) => std::fs::write(dir.path().join(&name), &bytes.0).unwrap(),
            None if i % 2 == 0 => std::fs::create_dir(dir.path().join(&name)).unwrap(),
            None => {}
        }
        files.push((name, bytes.as_ref().map(|b| b.0.clone())));
    }
    let names: Vec<String> = files.iter().map(|(n, _)| n.clone()).collect();
    let first = run_binary(dir.path(), &names);
    check_output(&files, &first)?;
    prop_assert_eq!(&run_binary(dir.path(), &names), &first, "not deterministic");
    let paths: Vec<String> = names
        .iter()
        .map(|n| dir.path().join(n).to_string_lossy().into_owned())
        .collect();
    let library = run_in_process(&paths, b"");
    let prefix = format!("{}/", dir.path().display());
    prop_assert_eq!(library.status, first.status);
    prop_assert_eq!(library.stdout.replace(&prefix, ""), first.stdout);
    prop_assert_eq!(library.stderr.replace(&prefix, ""), first.stderr);
    Ok(())
}

/// Runs `aliaslb validate FILES` in `dir`.
fn run_binary(dir: &Path, files: &[String]) -> Output {
    let output = Command::new(env!("CARGO_BIN_EXE_aliaslb"))
        .arg("validate")
        .args(files)
        .current_dir(dir)
        .output()
        .expect("run aliaslb");
    Output {
        // A signal (no code) or a panic (101) both fail the status check.
        status: output
            .status
            .code()
            .map_or(u8::MAX, |c| u8::try_from(c).unwrap_or(u8::MAX)),
        stdout: String::from_utf8(output.stdout).expect("stdout is UTF-8"),
        stderr: String::from_utf8(output.stderr).expect("stderr is UTF-8"),
    }
}

// ---------------------------------------------------------------------------------------
// Regressions found by the properties above, as plain tests.
// ---------------------------------------------------------------------------------------

/// Keys and kinds can hold line breaks (`"a\nb"`, a sequence as key or kind); each
/// message must still be one line, or line-oriented CI tooling splits it in two.
#[test]
fn every_message_is_one_line() {
    for text in [
        "data:\n  \"a\\nb\": \"10.0.0.1\"\n",
        "data:\n  [a, b]: |\n    10.0.0.1\n",
        "data:\n  \"x\\ty\\r\": \"10.0.0.1\\n10.0.0.1\"\n",
        "data:\n  config.yaml: \"pools:\\n  \\\"a\\\\nb\\\": {}\\n\"\n",
    ] {
        let out = run_in_process(&[STDIN.to_owned()], text.as_bytes());
        assert_eq!(out.status, EXIT_INVALID, "{text:?}: {out:?}");
        for line in out.stdout.lines() {
            assert!(line.starts_with("<stdin>:"), "{text:?}: {out:?}");
        }
    }
    let out = run_in_process(&[STDIN.to_owned()], b"kind: [a, b]\ndata: {}\n");
    assert_eq!(out.status, EXIT_USAGE, "{out:?}");
    assert_eq!(out.stderr.lines().count(), 1, "{out:?}");
}

/// yaml_serde's messages can quote a key that reads `line N`; shifting that "line number"
/// to the file's must not overflow.
#[test]
fn line_numbers_in_quoted_keys_do_not_overflow() {
    let text = format!(
        "# c\n---\n{{line {max}: 1, line {max}: 2}}\n",
        max = usize::MAX
    );
    let err = check_text("f.yaml", &text).unwrap_err().to_string();
    assert!(err.starts_with("f.yaml:3: not valid YAML: "), "{err}");
}

/// libyaml also breaks lines at a lone `\r` and at U+0085 (e.g. a mis-decoded `…` in a
/// comment); the lines reported must be the ones YAML saw, never past the file's end.
#[test]
fn exotic_line_breaks_keep_lines_in_the_file() {
    for text in [
        "data:\n  default: |\n    10.0.0.1 # \u{85}\n    nope\n",
        "data:\n  prod: |-\r    10.0.0.1\n    nope\n",
        "data:\n  a: |\n    10.0.0.1\r  b: |\n    nope\n",
        "data:\r  a: |\u{85}    10.0.0.1\r\n  b: |\n    nope\n",
    ] {
        let report = check_text("f.yaml", text).unwrap();
        assert_eq!(report.lines.len(), 1, "{report:?}");
        let yaml_lines = yaml_line_count(text.as_bytes());
        assert!(
            report.lines[0].starts_with(&format!("f.yaml:{yaml_lines}: ")),
            "{text:?}: {report:?}"
        );
    }
}
