//! The documentation's links hold: every relative link and every `#anchor` in README.md,
//! BENCHMARKS.md, docs/**/*.md and charts/*/README.md resolves to a file or folder of the
//! repository and, for a Markdown target, to one of its headings (GitHub's anchor rule:
//! the heading's text in lower case, punctuation dropped, each space a `-`, `-1`, `-2`...
//! for repeats) or `<a id>`. Links to this repository on GitHub
//! (`https://github.com/aliaslb/aliaslb/blob/main/PATH`) are checked as relative ones.
//!
//! Markdown is read by pulldown-cmark (CommonMark with GitHub's tables), so a `](#x)` in a
//! code block is no link and a reference-style link is. Pure file reading: no network, no
//! API server.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};

use pulldown_cmark::{Event, Options, Parser, Tag, TagEnd};

/// Where this repository's files are on GitHub: such links are checked like relative ones.
const REPO_URL: &str = "https://github.com/aliaslb/aliaslb/";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the controller crate is in the workspace root")
        .to_path_buf()
}

fn options() -> Options {
    Options::ENABLE_TABLES
        | Options::ENABLE_STRIKETHROUGH
        | Options::ENABLE_TASKLISTS
        | Options::ENABLE_FOOTNOTES
}

/// GitHub's anchor for a heading's text: lower case, every character that is not a letter,
/// a digit, `_`, `-` or a space dropped, each space a `-` (github-slugger's rule).
fn slug(text: &str) -> String {
    text.trim()
        .chars()
        .flat_map(char::to_lowercase)
        .filter(|c| c.is_alphanumeric() || matches!(c, '_' | '-' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The `id` (or `name`) values of the HTML anchors in a piece of inline or block HTML.
fn html_ids(html: &str) -> Vec<String> {
    let mut ids = Vec::new();
    for attr in ["id=\"", "name=\""] {
        let mut rest = html;
        while let Some(at) = rest.find(attr) {
            rest = &rest[at + attr.len()..];
            if let Some(end) = rest.find('"') {
                ids.push(rest[..end].to_string());
                rest = &rest[end..];
            }
        }
    }
    ids
}

/// One link of a Markdown file: its line and its destination as written.
#[derive(Debug)]
struct Link {
    line: usize,
    dest: String,
}

/// What a Markdown file offers to links (its anchors) and asks of others (its links).
#[derive(Debug, Default)]
struct Doc {
    anchors: BTreeSet<String>,
    links: Vec<Link>,
}

fn parse(text: &str) -> Doc {
    let mut doc = Doc::default();
    let mut repeats: BTreeMap<String, usize> = BTreeMap::new();
    let mut heading: Option<String> = None;
    let line_of = |offset: usize| text[..offset].matches('\n').count() + 1;
    for (event, range) in Parser::new_ext(text, options()).into_offset_iter() {
        match event {
            Event::Start(Tag::Heading { .. }) => heading = Some(String::new()),
            Event::End(TagEnd::Heading(_)) => {
                let base = slug(&heading.take().unwrap_or_default());
                let seen = repeats.entry(base.clone()).or_insert(0);
                let anchor = if *seen == 0 {
                    base.clone()
                } else {
                    format!("{base}-{seen}")
                };
                *seen += 1;
                doc.anchors.insert(anchor);
            }
            Event::Text(t) | Event::Code(t) => {
                if let Some(h) = heading.as_mut() {
                    h.push_str(&t);
                }
            }
            Event::Html(html) | Event::InlineHtml(html) => doc.anchors.extend(html_ids(&html)),
            Event::Start(Tag::Link { dest_url, .. } | Tag::Image { dest_url, .. }) => {
                doc.links.push(Link {
                    line: line_of(range.start),
                    dest: dest_url.to_string(),
                })
            }
            _ => {}
        }
    }
    doc
}

/// The Markdown files whose links are checked, relative to the repository.
fn markdown_files(root: &Path) -> Vec<PathBuf> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(root.join(dir)) else {
            return;
        };
        for entry in entries.flatten() {
            let path = dir.join(entry.file_name());
            if entry.path().is_dir() {
                walk(root, &path, out);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    for top in ["README.md", "BENCHMARKS.md"] {
        if root.join(top).is_file() {
            files.push(PathBuf::from(top));
        }
    }
    walk(root, Path::new("docs"), &mut files);
    if let Ok(charts) = std::fs::read_dir(root.join("charts")) {
        for chart in charts.flatten() {
            let readme = Path::new("charts")
                .join(chart.file_name())
                .join("README.md");
            if root.join(&readme).is_file() {
                files.push(readme);
            }
        }
    }
    files.sort();
    files
}

/// `a/b/../c` as `a/c`, relative to the repository; `None` when it leaves the repository.
fn normalize(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::Normal(p) => out.push(p),
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

/// Every broken link of `files` (relative to `root`), as `file:line: link: why`.
fn broken_links(root: &Path, files: &[PathBuf]) -> Vec<String> {
    let mut docs: BTreeMap<PathBuf, Doc> = BTreeMap::new();
    let mut doc_of = |path: &Path| -> Option<BTreeSet<String>> {
        if !docs.contains_key(path) {
            let text = std::fs::read_to_string(root.join(path)).ok()?;
            docs.insert(path.to_path_buf(), parse(&text));
        }
        Some(docs[path].anchors.clone())
    };
    let mut broken = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(root.join(file))
            .unwrap_or_else(|e| panic!("reading {}: {e}", file.display()));
        let doc = parse(&text);
        for link in &doc.links {
            let at = format!("{}:{}: {}", file.display(), link.line, link.dest);
            // A link to this repository on GitHub is a link to a file of this tree.
            let dest = match link.dest.strip_prefix(REPO_URL) {
                Some(rest) => match rest.split_once('/').and_then(|(_, r)| r.split_once('/')) {
                    Some((_branch, path)) => format!("/{path}"),
                    None => continue,
                },
                None => link.dest.clone(),
            };
            if dest.contains("://") || dest.starts_with("mailto:") {
                continue;
            }
            let (path, anchor) = match dest.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (dest.as_str(), None),
            };
            let target = if path.is_empty() {
                Some(file.clone())
            } else if let Some(from_root) = path.strip_prefix('/') {
                normalize(Path::new(from_root))
            } else {
                normalize(&file.parent().unwrap_or(Path::new("")).join(path))
            };
            let Some(target) = target else {
                broken.push(format!("{at}: leaves the repository"));
                continue;
            };
            if !root.join(&target).exists() {
                broken.push(format!("{at}: no file {}", target.display()));
                continue;
            }
            let Some(anchor) = anchor else { continue };
            if target.extension().is_none_or(|e| e != "md") {
                continue; // a line anchor of a source file (#L10): GitHub's, not ours
            }
            let anchors = doc_of(&target).unwrap_or_default();
            if !anchors.contains(anchor) {
                broken.push(format!(
                    "{at}: {} has no heading or <a id> with the anchor #{anchor}",
                    target.display()
                ));
            }
        }
    }
    broken
}

#[test]
fn every_link_and_anchor_of_the_docs_resolves() {
    let root = repo();
    let files = markdown_files(&root);
    for must in ["README.md", "BENCHMARKS.md", "docs/configuration.md"] {
        assert!(
            files.iter().any(|f| f == Path::new(must)),
            "{must} is not among the checked files {files:?}"
        );
    }
    let links: usize = files
        .iter()
        .map(|f| {
            parse(&std::fs::read_to_string(root.join(f)).unwrap())
                .links
                .len()
        })
        .sum();
    assert!(links > 50, "only {links} links found in {files:?}");
    let broken = broken_links(&root, &files);
    assert!(
        broken.is_empty(),
        "{} broken links:\n{}",
        broken.len(),
        broken.join("\n")
    );
}

#[test]
fn anchors_follow_github() {
    let cases = [
        ("How it works", "how-it-works"),
        ("L3 mode: BGP with ECMP", "l3-mode-bgp-with-ecmp"),
        (
            "The pool ConfigMap (`aliaslb-pools` in the controller's namespace)",
            "the-pool-configmap-aliaslb-pools-in-the-controllers-namespace",
        ),
        (
            "Pool state: `kubectl get configmap aliaslb-pools-status`",
            "pool-state-kubectl-get-configmap-aliaslb-pools-status",
        ),
        (
            "Named pools: several pools per namespace, shared pools, draining",
            "named-pools-several-pools-per-namespace-shared-pools-draining",
        ),
        ("A -- B", "a----b"),
        ("Café au lait", "café-au-lait"),
    ];
    for (heading, anchor) in cases {
        let doc = parse(&format!("# {heading}\n"));
        assert_eq!(
            doc.anchors,
            BTreeSet::from([anchor.to_string()]),
            "{heading}"
        );
    }
    let doc = parse("## Upgrade\n\n### Upgrade\n\n## Upgrade\n\n<a id=\"x-y\"></a>text\n");
    assert_eq!(
        doc.anchors,
        ["upgrade", "upgrade-1", "upgrade-2", "x-y"]
            .map(String::from)
            .into()
    );
}

#[test]
fn a_broken_file_anchor_or_escape_is_reported_and_code_is_no_link() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("docs")).unwrap();
    std::fs::write(
        root.join("README.md"),
        "# Top\n\n[ok](docs/a.md#part-one) [ok](#top) [ok][r] [ok](docs/)\n\
         [no file](docs/missing.md) [no anchor](docs/a.md#part-two)\n\n\
         ```\n[not a link](#nowhere)\n```\n\n[r]: docs/a.md\n",
    )
    .unwrap();
    std::fs::write(
        root.join("docs/a.md"),
        "# A\n\n## Part one\n\n[ok](../README.md#top) [up](../../x.md) [bad](#b)\n\
         [ok](https://github.com/aliaslb/aliaslb/blob/main/README.md#top)\n\
         [bad](https://github.com/aliaslb/aliaslb/blob/main/README.md#alerts)\n\
         [ok](https://example.com/#anything)\n",
    )
    .unwrap();
    let files = markdown_files(root);
    assert_eq!(files, [PathBuf::from("README.md"), "docs/a.md".into()]);
    let broken = broken_links(root, &files);
    assert_eq!(
        broken,
        [
            "README.md:4: docs/missing.md: no file docs/missing.md",
            "README.md:4: docs/a.md#part-two: docs/a.md has no heading or <a id> with the anchor #part-two",
            "docs/a.md:5: ../../x.md: leaves the repository",
            "docs/a.md:5: #b: docs/a.md has no heading or <a id> with the anchor #b",
            "docs/a.md:7: https://github.com/aliaslb/aliaslb/blob/main/README.md#alerts: README.md has no heading or <a id> with the anchor #alerts",
        ]
    );
}
