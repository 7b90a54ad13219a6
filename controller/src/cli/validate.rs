//! `aliaslb validate FILE...`: checks pool ConfigMap files before they reach a cluster
//! (GitOps CI), with the same parser the controller uses ([`PoolConfig::parse`]).
//!
//! I/O only in [`run`] (reading the files and stdin, writing the report); the rest is
//! plain text processing, unit-tested below.
//!
//! Output is plain and stable, no colours:
//! - **stdout**: one line per configuration error, `FILE:LINE: key KEY, line N: message
//!   (`text`)`, where LINE is the line in FILE and N the line within the key's value; for
//!   a valid ConfigMap, a summary line per ConfigMap and per pool, also `FILE:LINE: ...`.
//! - **stderr**: usage errors, `aliaslb: FILE[:LINE]: message`.
//! - exit status: 0 when every ConfigMap is valid, 1 when any is invalid, 2 on a usage
//!   error (unreadable file, not YAML, not a ConfigMap, no files), which wins over 1.
//!
//! Accepted input: one or more `---`-separated YAML documents, each a `kind: ConfigMap` or
//! a bare `data:` map; `-` reads stdin. yaml_serde (libyaml) gives no spans for values
//! (a parser that does, serde-saphyr, words its errors otherwise than libyaml, whose
//! messages this command's output keeps), so the
//! lines of the keys under `data:` are found in the raw text: in a literal block scalar
//! (`|`, `|-`, `|+`) value line N is N lines below its key; any other value (plain,
//! quoted, folded `>`) is reported at its key's line.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};

use aliaslb_core::pool::{PoolConfig, PoolConfigError, PoolKey};
use aliaslb_core::range::Family;
use yaml_serde::Value;

/// The file name that stands for stdin.
pub const STDIN: &str = "-";
/// How stdin is named in messages.
pub const STDIN_NAME: &str = "<stdin>";

/// Exit status: every ConfigMap is valid.
pub const EXIT_VALID: u8 = 0;
/// Exit status: some ConfigMap has configuration errors.
pub const EXIT_INVALID: u8 = 1;
/// Exit status: a file could not be read or is not a ConfigMap.
pub const EXIT_USAGE: u8 = 2;

/// Arguments of `aliaslb validate`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// ConfigMap YAML files (one or more `---` documents each); `-` reads stdin.
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<String>,
}

/// Why a file cannot be checked at all (exit status 2).
#[derive(Debug, thiserror::Error)]
pub enum UsageError {
    /// The file could not be read.
    #[error("{file}: cannot read: {source}")]
    Read {
        /// File name as given.
        file: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A document is not YAML.
    #[error("{file}:{line}: not valid YAML: {message}")]
    Yaml {
        /// File name as given.
        file: String,
        /// 1-based line in the file.
        line: usize,
        /// yaml_serde's message, control characters escaped.
        message: String,
    },
    /// A document is YAML but not a ConfigMap.
    #[error(
        "{file}:{line}: not a ConfigMap ({what}): expected `kind: ConfigMap` or a bare `data:` map"
    )]
    NotConfigMap {
        /// File name as given.
        file: String,
        /// 1-based line in the file where the document starts.
        line: usize,
        /// What was found instead, control characters escaped.
        what: String,
    },
    /// The file holds no YAML document.
    #[error("{file}: no YAML document: expected a ConfigMap")]
    Empty {
        /// File name as given.
        file: String,
    },
}

/// The outcome of checking one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileReport {
    /// Lines for stdout: errors, or summaries of valid ConfigMaps; control characters are
    /// escaped, so none holds a line break.
    pub lines: Vec<String>,
    /// Whether every ConfigMap in the file is valid.
    pub valid: bool,
}

/// Checks every file, writes the report and returns the exit status.
pub fn run(files: &[String], stdin: &mut dyn Read, out: &mut dyn Write, err: &mut dyn Write) -> u8 {
    let mut status = EXIT_VALID;
    for file in files {
        let name = if file == STDIN { STDIN_NAME } else { file };
        let report = read(file, stdin).and_then(|text| check_text(name, &text));
        // A broken pipe on stdout/stderr leaves nothing to report to; the status still tells.
        match report {
            Ok(report) => {
                for line in &report.lines {
                    let _ = writeln!(out, "{line}");
                }
                if !report.valid {
                    status = status.max(EXIT_INVALID);
                }
            }
            Err(e) => {
                let _ = writeln!(err, "aliaslb: {e}");
                status = EXIT_USAGE;
            }
        }
    }
    status
}

fn read(file: &str, stdin: &mut dyn Read) -> Result<String, UsageError> {
    let mut text = String::new();
    let result = if file == STDIN {
        stdin.read_to_string(&mut text)
    } else {
        std::fs::File::open(file).and_then(|mut f| f.read_to_string(&mut text))
    };
    result.map(|_| text).map_err(|source| UsageError::Read {
        file: if file == STDIN { STDIN_NAME } else { file }.to_owned(),
        source,
    })
}

/// Checks the ConfigMaps in `text`, read from `file` (used in messages only).
pub fn check_text(file: &str, text: &str) -> Result<FileReport, UsageError> {
    let text = yaml_line_breaks(text);
    let text = text.as_ref();
    let mut report = FileReport {
        lines: Vec::new(),
        valid: true,
    };
    let mut documents = 0;
    for doc in split_documents(text) {
        let value: Value = yaml_serde::from_str(doc.text).map_err(|e| UsageError::Yaml {
            file: file.to_owned(),
            line: doc.start + e.location().map_or(1, |l| l.line()),
            message: one_line(&shift_lines(&e.to_string(), doc.start)),
        })?;
        if value.is_null() {
            continue;
        }
        documents += 1;
        check_document(file, &doc, &value, &mut report)?;
    }
    for line in &mut report.lines {
        *line = one_line(line);
    }
    if documents == 0 {
        return Err(UsageError::Empty {
            file: file.to_owned(),
        });
    }
    Ok(report)
}

/// `text` with the line breaks libyaml turns into `\n` (`\r\n`, a lone `\r`, U+0085)
/// written as `\n`, so that the lines found by scanning the raw text, the lines yaml_serde
/// reports and the lines of the values count alike: a stray `\r` or a mis-decoded `…`
/// (U+0085) in a comment would otherwise shift every line after it. The values do not
/// change. U+2028 and U+2029 are left alone: libyaml counts them as line breaks but keeps
/// them in values, where the controller does not split lines at them either.
fn yaml_line_breaks(text: &str) -> Cow<'_, str> {
    const BREAKS: [char; 2] = ['\r', '\u{85}'];
    if text.contains(BREAKS) {
        Cow::Owned(text.replace("\r\n", "\n").replace(BREAKS, "\n"))
    } else {
        Cow::Borrowed(text)
    }
}

/// Rewrites yaml_serde's `line N` (relative to the document parsed) to lines of the file.
fn shift_lines(message: &str, by: usize) -> String {
    const MARK: &str = "line ";
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(at) = rest.find(MARK) {
        let (before, after) = rest.split_at(at + MARK.len());
        out.push_str(before);
        let digits = after.len() - after.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        // The message may quote user text that reads `line N` with a huge N.
        match after[..digits]
            .parse::<usize>()
            .ok()
            .and_then(|n| n.checked_add(by))
        {
            Some(n) => out.push_str(&n.to_string()),
            None => out.push_str(&after[..digits]),
        }
        rest = &after[digits..];
    }
    out.push_str(rest);
    out
}

/// `s` with control characters (line breaks, tabs, ...) escaped as `\n`, `\t`, `\u{..}`:
/// keys, kinds and names may hold them, and each message must stay one line for
/// line-oriented CI tooling.
fn one_line(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// One YAML document: its text (from its `---` line, if any) and where it starts.
#[derive(Debug)]
struct Document<'a> {
    /// 0-based index in the file of the document's first line.
    start: usize,
    text: &'a str,
}

/// Splits at `---` lines. A document marker always starts in column 0, so no block
/// scalar content (which is indented) is mistaken for one.
fn split_documents(text: &str) -> Vec<Document<'_>> {
    let mut docs = Vec::new();
    let (mut start_line, mut start_byte, mut offset) = (0, 0, 0);
    for (index, line) in text.split_inclusive('\n').enumerate() {
        let bare = line.trim_end_matches(['\n', '\r']);
        let is_marker = bare == "---" || bare.starts_with("--- ") || bare.starts_with("---\t");
        if is_marker && offset > start_byte {
            docs.push(Document {
                start: start_line,
                text: &text[start_byte..offset],
            });
            (start_line, start_byte) = (index, offset);
        } else if is_marker {
            start_line = index;
        }
        offset += line.len();
    }
    docs.push(Document {
        start: start_line,
        text: &text[start_byte..],
    });
    docs
}

fn check_document(
    file: &str,
    doc: &Document<'_>,
    value: &Value,
    report: &mut FileReport,
) -> Result<(), UsageError> {
    let positions = KeyPositions::find(doc.text);
    let doc_line = doc.start + positions.first_content + 1;
    let not_config_map = |what: String| UsageError::NotConfigMap {
        file: file.to_owned(),
        line: doc_line,
        what,
    };
    let Value::Mapping(map) = value else {
        return Err(not_config_map("not a mapping".to_owned()));
    };
    let name = match map.get("kind") {
        Some(Value::String(kind)) if kind == "ConfigMap" => {
            let name = map
                .get("metadata")
                .and_then(|m| m.get("name"))
                .and_then(Value::as_str)
                .unwrap_or("(unnamed)");
            format!("ConfigMap {name}")
        }
        Some(kind) => {
            return Err(not_config_map(format!(
                "kind: {}",
                one_line(yaml_serde::to_string(kind).unwrap_or_default().trim())
            )));
        }
        None if map.contains_key("data") => "data map".to_owned(),
        None => return Err(not_config_map("no `kind` and no `data`".to_owned())),
    };
    let (data, mut errors) = string_data(map.get("data"));
    let config = PoolConfig::parse(&data);
    if let Err(parse_errors) = &config {
        errors.extend(parse_errors.iter().cloned());
    }
    let file_line = |key: &str, line: Option<usize>| -> usize {
        let value_line = match positions.keys.get(key) {
            Some(pos) => pos.line + if pos.literal { line.unwrap_or(0) } else { 0 },
            None => positions.data.unwrap_or(positions.first_content),
        };
        doc.start + value_line + 1
    };
    match config {
        Ok(config) if errors.is_empty() => {
            let pools = config.pools().count();
            report.lines.push(if pools == 0 {
                format!(
                    "{file}:{doc_line}: {name}: valid, but it defines no pool: every \
                     LoadBalancer Service stays pending"
                )
            } else {
                format!(
                    "{file}:{doc_line}: {name}: valid, {pools} pool{}",
                    plural(pools)
                )
            });
            for (key, pool) in config.pools() {
                report.lines.push(format!(
                    "{file}:{}: {}",
                    file_line(key.as_str(), None),
                    summary(key, pool)
                ));
            }
        }
        _ => {
            report.valid = false;
            errors.sort_by(|a, b| (&a.key, a.line).cmp(&(&b.key, b.line)));
            for e in errors {
                report
                    .lines
                    .push(format!("{file}:{}: {e}", file_line(&e.key, e.line)));
            }
        }
    }
    Ok(())
}

/// The `data` map as strings, and an error for each value that is not a string (the API
/// server would reject it). Scalar keys become strings, as kubectl's YAML conversion does.
fn string_data(data: Option<&Value>) -> (BTreeMap<String, String>, Vec<PoolConfigError>) {
    let mut strings = BTreeMap::new();
    let mut errors = Vec::new();
    let Some(Value::Mapping(map)) = data else {
        return (strings, errors);
    };
    for (key, value) in map {
        let key = match key {
            Value::String(s) => s.clone(),
            other => yaml_serde::to_string(other)
                .unwrap_or_default()
                .trim()
                .to_owned(),
        };
        match value {
            Value::String(s) => {
                strings.insert(key, s.clone());
            }
            Value::Null => {
                strings.insert(key, String::new());
            }
            _ => errors.push(PoolConfigError {
                key,
                line: None,
                text: String::new(),
                message: "the value must be a string: quote it, or use a `|` block".to_owned(),
            }),
        }
    }
    (strings, errors)
}

fn summary(key: &PoolKey, pool: &aliaslb_core::pool::Pool) -> String {
    let entries = pool.entries.len();
    let mut s = format!(
        "{key}: {entries} entr{}, {} IPv4 and {} IPv6 addresses",
        if entries == 1 { "y" } else { "ies" },
        pool.size(Family::V4),
        pool.size(Family::V6)
    );
    if *key == PoolKey::Fallback {
        s.push_str(", for namespaces without a key of their own");
    }
    let options = &pool.options;
    if matches!(key, PoolKey::Named(_)) {
        let mut who: Vec<String> = Vec::new();
        if !options.namespaces.is_empty() {
            who.push(format!("namespaces {}", options.namespaces.join(",")));
        }
        if !options.namespace_selector.is_empty() {
            who.push(format!(
                "namespaces labelled {}",
                labels_text(&options.namespace_selector)
            ));
        }
        if who.is_empty() {
            s.push_str(
                ", no namespace may draw from it yet (no `namespaces` nor `namespaceSelector`)",
            );
        } else {
            s.push_str(&format!(", for {}", who.join(" and ")));
        }
        if !options.auto_assign {
            s.push_str(", only on request (autoAssign: false)");
        }
    }
    if options.draining {
        s.push_str(", draining");
    } else {
        let draining = pool.entries.iter().filter(|e| e.draining).count();
        if draining > 0 {
            s.push_str(&format!(
                ", {draining} entr{} draining",
                if draining == 1 { "y" } else { "ies" }
            ));
        }
    }
    if let Some(interface) = &options.interface {
        s.push_str(&format!(", interface {interface}"));
    }
    if !options.node_selector.is_empty() {
        s.push_str(&format!(", nodes {}", labels_text(&options.node_selector)));
    }
    if !options.allow_sharing {
        s.push_str(", no IP sharing");
    }
    if options.on_conflict == aliaslb_core::pool::OnConflict::Renumber {
        s.push_str(", renumbered on a LAN claim (onConflict: renumber)");
    }
    if options.virtual_mac {
        s.push_str(", each IP answered from its own MAC (virtualMAC)");
    }
    s
}

/// `k=v,k2=v2`.
fn labels_text(labels: &BTreeMap<String, String>) -> String {
    let pairs: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    pairs.join(",")
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// Where a key under `data:` sits in a document's text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct KeyPosition {
    /// 0-based line of the key within the document.
    line: usize,
    /// Whether the value is a literal block scalar (`|`, `|-`, `|+`, ...), whose lines map
    /// one to one onto the file's.
    literal: bool,
}

/// Lines found by scanning a document's raw text.
#[derive(Debug, Default)]
struct KeyPositions {
    /// 0-based line of the first line that is not blank, a comment or `---`.
    first_content: usize,
    /// 0-based line of the top-level `data:`.
    data: Option<usize>,
    keys: HashMap<String, KeyPosition>,
}

impl KeyPositions {
    fn find(text: &str) -> KeyPositions {
        let lines: Vec<&str> = text.lines().collect();
        let is_filler = |l: &str| {
            let t = l.trim();
            t.is_empty() || t.starts_with('#') || t == "---" || t.starts_with("--- ")
        };
        let mut found = KeyPositions {
            first_content: lines.iter().position(|l| !is_filler(l)).unwrap_or(0),
            ..KeyPositions::default()
        };
        found.data = lines.iter().position(|l| {
            l.strip_prefix("data:")
                .is_some_and(|rest| rest.is_empty() || rest.starts_with([' ', '\t']))
        });
        let Some(data) = found.data else {
            return found;
        };
        let mut child_indent = None;
        for (index, line) in lines.iter().enumerate().skip(data + 1) {
            let content = line.trim_start_matches(' ');
            let indent = line.len() - content.len();
            // Comments anywhere and block scalar content deeper than the keys are skipped.
            if content.trim().is_empty() || content.starts_with('#') {
                continue;
            }
            if indent == 0 {
                break;
            }
            let child = *child_indent.get_or_insert(indent);
            if indent != child {
                continue;
            }
            if let Some((key, rest)) = split_key(content) {
                let literal = rest.trim_start().starts_with('|');
                found.keys.entry(key).or_insert(KeyPosition {
                    line: index,
                    literal,
                });
            }
        }
        found
    }
}

/// `key: rest` of a block mapping line, with plain, `"double"` or `'single'` quoted keys.
fn split_key(content: &str) -> Option<(String, &str)> {
    let (key, after) = match content.chars().next()? {
        quote @ ('"' | '\'') => {
            let end = content[1..].find(quote)? + 1;
            (content[1..end].to_owned(), &content[end + 1..])
        }
        _ => {
            let colon = content.match_indices(':').map(|(i, _)| i).find(|&i| {
                content[i + 1..].is_empty() || content[i + 1..].starts_with([' ', '\t'])
            })?;
            (content[..colon].trim_end().to_owned(), &content[colon..])
        }
    };
    Some((key, after.trim_start().strip_prefix(':')?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_documents_at_markers_only_in_column_zero() {
        // A comment-only region is a document of its own, parsed as null and skipped.
        let text = "# leading comment\n---\na: 1\n---\nb: |\n  ---\n  x\n--- # c\nc: 2\n";
        let docs = split_documents(text);
        let got: Vec<(usize, &str)> = docs.iter().map(|d| (d.start, d.text)).collect();
        assert_eq!(
            got,
            [
                (0, "# leading comment\n"),
                (1, "---\na: 1\n"),
                (3, "---\nb: |\n  ---\n  x\n"),
                (7, "--- # c\nc: 2\n"),
            ]
        );
        assert_eq!(split_documents("a: 1").len(), 1);
    }

    #[test]
    fn yaml_errors_in_later_documents_name_file_lines() {
        let text = "kind: ConfigMap\ndata: {}\n---\ndata:\n  a: [x\n";
        let err = check_text("f.yaml", text).unwrap_err().to_string();
        assert_eq!(
            err,
            "f.yaml:6: not valid YAML: did not find expected ',' or ']' at line 6 column 1, \
             while parsing a flow sequence at line 5 column 6"
        );
        assert_eq!(shift_lines("no lines here", 3), "no lines here");
    }

    #[test]
    fn finds_keys_and_block_styles() {
        let text = "---\nkind: ConfigMap\ndata:\n  # comment\n  plain: 10.0.0.1\n  literal: |-\n    10.0.0.2\n    not-a-key: x\n  \"quoted\": |+\n    10.0.0.3\n  folded: >\n    10.0.0.4\n  config.yaml: |\n    pools:\n      plain: {}\nmetadata:\n  name: x\n";
        let found = KeyPositions::find(text);
        assert_eq!(found.first_content, 1);
        assert_eq!(found.data, Some(2));
        let mut keys: Vec<(&str, usize, bool)> = found
            .keys
            .iter()
            .map(|(k, p)| (k.as_str(), p.line, p.literal))
            .collect();
        keys.sort();
        assert_eq!(
            keys,
            [
                ("config.yaml", 12, true),
                ("folded", 10, false),
                ("literal", 5, true),
                ("plain", 4, false),
                ("quoted", 8, true),
            ]
        );
    }

    #[test]
    fn errors_point_at_file_lines_across_documents() {
        let text = "\
apiVersion: v1
kind: ConfigMap
metadata:
  name: first
data:
  default: |-
     192.168.55.10
     192.168.55.300
---
# second document
apiVersion: v1
kind: ConfigMap
metadata: {name: second}
data:
  staging: 10.0.0.1/24
  prod: |

     10.0.0.5-10.0.0.1
  Bad: |
     10.9.0.1
";
        let report = check_text("pools.yaml", text).unwrap();
        assert!(!report.valid);
        let lines: Vec<&str> = report
            .lines
            .iter()
            .map(|l| l.split(": key").next().unwrap())
            .collect();
        assert_eq!(
            lines,
            [
                "pools.yaml:8",
                "pools.yaml:19",
                "pools.yaml:18",
                "pools.yaml:15"
            ]
        );
    }
}
