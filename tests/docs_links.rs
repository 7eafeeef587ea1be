//! The links in README.md, CONTRIBUTING.md and docs/*.md resolve.
//!
//! - A relative link (`[text](docs/io.md)`, `[text](../src/lib.rs)`, an image, a reference
//!   definition `[label]: path`) names a file or directory that exists, relative to the
//!   document that holds it.
//! - A fragment (`#anchor` in the same document, or `other.md#anchor`) matches a heading of the
//!   target document under GitHub's rules: the heading's text as rendered (code spans and
//!   links reduced to their text), lowercased, every character that is not a letter, a digit,
//!   a space, `-` or `_` dropped, spaces turned into `-`; a repeated heading gets `-1`, `-2`,
//!   ... in order. `<a id="...">` / `<a name="...">` anchors count too.
//! - A path into the repository written in a code span (`` `src/server/shard/wire.rs` ``,
//!   `` `docs/io.md` ``) names a file or directory that exists, relative to the repository's
//!   root: those are the docs' other way of pointing at a file, and they go stale the same way.
//!   Spans with glob or placeholder characters (`*`, `?`, `<`, `{`, `$`, `...`) are skipped.
//!
//! Links with a scheme (`https:`, `mailto:`) are not followed: the tests run without a network.
//! Links and headings inside fenced code blocks and code spans are not links or headings.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::path::{Component, Path, PathBuf};

/// The top directories a code span may name a repository path under.
const REPO_DIRS: &[&str] = &[
    "benches/",
    "config/",
    "contrib/",
    "docs/",
    "examples/",
    "scripts/",
    "src/",
    "tests/",
    "third_party/",
    "tools/",
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The documents whose links are checked: README.md, CONTRIBUTING.md and every docs/*.md.
fn documents() -> Vec<PathBuf> {
    let root = root();
    let mut docs: Vec<PathBuf> = fs::read_dir(root.join("docs"))
        .expect("docs/ is readable")
        .map(|entry| entry.expect("a docs/ entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    docs.sort();
    let mut all = vec![root.join("README.md"), root.join("CONTRIBUTING.md")];
    all.extend(docs);
    all
}

/// A line of a document outside fenced code blocks, with its 1-based number.
struct Line<'a> {
    number: usize,
    text: &'a str,
}

/// The lines of `text` outside fenced code blocks (``` or ~~~, closed by a fence of the same
/// character at least as long).
fn prose_lines(text: &str) -> Vec<Line<'_>> {
    let mut lines = Vec::new();
    let mut fence: Option<(char, usize)> = None;
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        let run = |c: char| trimmed.chars().take_while(|&x| x == c).count();
        let opening = if indent <= 3 {
            ['`', '~']
                .into_iter()
                .map(|c| (c, run(c)))
                .find(|&(_, n)| n >= 3)
        } else {
            None
        };
        match (fence, opening) {
            (None, Some(open)) => fence = Some(open),
            (Some((c, n)), Some((c2, n2)))
                if c == c2 && n2 >= n && trimmed[n2..].trim().is_empty() =>
            {
                fence = None
            }
            (None, None) => lines.push(Line {
                number: i + 1,
                text: line,
            }),
            _ => {}
        }
    }
    lines
}

/// `text` with every code span replaced by spaces (so offsets stay put), and the spans' contents.
fn split_code_spans(text: &str) -> (String, Vec<String>) {
    let chars: Vec<char> = text.chars().collect();
    let mut prose = String::with_capacity(text.len());
    let mut spans = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        if chars[i] != '`' {
            prose.push(chars[i]);
            i += 1;
            continue;
        }
        let ticks = chars[i..].iter().take_while(|&&c| c == '`').count();
        // The closing run is exactly as long as the opening one.
        let mut j = i + ticks;
        let mut close = None;
        while j < chars.len() {
            if chars[j] == '`' {
                let run = chars[j..].iter().take_while(|&&c| c == '`').count();
                if run == ticks {
                    close = Some(j);
                    break;
                }
                j += run;
            } else {
                j += 1;
            }
        }
        match close {
            Some(j) => {
                spans.push(
                    chars[i + ticks..j]
                        .iter()
                        .collect::<String>()
                        .trim()
                        .to_string(),
                );
                prose.extend(std::iter::repeat_n(' ', j + ticks - i));
                i = j + ticks;
            }
            None => {
                // An unmatched run is literal backticks.
                prose.extend(std::iter::repeat_n('`', ticks));
                i += ticks;
            }
        }
    }
    (prose, spans)
}

/// The link targets of one line of prose (code spans already blanked): inline links and images
/// `[text](target "title")`, and a reference definition `[label]: target`.
fn link_targets(prose: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let trimmed = prose.trim_start();
    if trimmed.starts_with('[') {
        if let Some(end) = trimmed.find("]:") {
            let target = trimmed[end + 2..].split_whitespace().next().unwrap_or("");
            targets.push(target.trim_matches(['<', '>']).to_string());
            return targets;
        }
    }
    let bytes = prose.as_bytes();
    let mut i = 0;
    while let Some(offset) = prose[i..].find("](") {
        let start = i + offset + 2;
        // The target runs to the `)` that balances the `(`, or to `>` for `<...>`.
        let rest = &prose[start..];
        let target = if let Some(inner) = rest.strip_prefix('<') {
            inner.split('>').next().unwrap_or("").to_string()
        } else {
            let mut depth = 0usize;
            let mut end = rest.len();
            for (k, &b) in rest.as_bytes().iter().enumerate() {
                match b {
                    b'(' => depth += 1,
                    b')' if depth == 0 => {
                        end = k;
                        break;
                    }
                    b')' => depth -= 1,
                    _ => {}
                }
            }
            rest[..end]
                .split_whitespace()
                .next()
                .unwrap_or("")
                .to_string()
        };
        targets.push(target);
        i = start;
        if i >= bytes.len() {
            break;
        }
    }
    targets
}

/// A heading's anchor under GitHub's rules (before duplicates are numbered).
fn slug(heading: &str) -> String {
    // Render the inline markup that changes the text: links keep their text, code spans their
    // contents (backticks are punctuation and go anyway), emphasis stars go.
    let mut text = String::new();
    let mut rest = heading;
    while let Some(open) = rest.find('[') {
        let Some(close) = rest[open..].find("](").map(|c| open + c) else {
            break;
        };
        let Some(end) = rest[close..].find(')').map(|e| close + e) else {
            break;
        };
        text.push_str(&rest[..open]);
        text.push_str(&rest[open + 1..close]);
        rest = &rest[end + 1..];
    }
    text.push_str(rest);
    text.trim()
        .to_lowercase()
        .chars()
        .filter(|&c| c.is_alphanumeric() || c == ' ' || c == '-' || c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// Every anchor of a document: its headings' slugs, numbered where repeated, and explicit
/// `<a id>` / `<a name>` anchors.
fn anchors(text: &str) -> HashSet<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut anchors = HashSet::new();
    for line in prose_lines(text) {
        let trimmed = line.text.trim_start();
        if line.text.len() - trimmed.len() <= 3 && trimmed.starts_with('#') {
            let level = trimmed.chars().take_while(|&c| c == '#').count();
            let after = &trimmed[level..];
            if level <= 6 && (after.is_empty() || after.starts_with(' ')) {
                // A closing run of #s is not part of the heading.
                let title = after.trim().trim_end_matches('#').trim_end();
                let base = slug(title);
                let count = seen.entry(base.clone()).or_insert(0);
                let anchor = if *count == 0 {
                    base.clone()
                } else {
                    format!("{base}-{count}")
                };
                *count += 1;
                anchors.insert(anchor);
            }
        }
        for key in ["id=\"", "name=\""] {
            let mut rest = line.text;
            while let Some(at) = rest.find(key) {
                let value = &rest[at + key.len()..];
                if rest[..at].contains("<a") {
                    if let Some(end) = value.find('"') {
                        anchors.insert(value[..end].to_string());
                    }
                }
                rest = value;
            }
        }
    }
    anchors
}

/// `path` with `.` and `..` components folded, without touching the file system.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

/// Everything wrong with the links of the document at `path` whose text is `text`, one line
/// each. `read` gives the text of another document (for its anchors).
fn check_document(
    path: &Path,
    text: &str,
    read: &mut dyn FnMut(&Path) -> Option<String>,
) -> Vec<String> {
    let root = root();
    let shown = path
        .strip_prefix(&root)
        .unwrap_or(path)
        .display()
        .to_string();
    let dir = path.parent().expect("a document is in a directory");
    let own_anchors = anchors(text);
    let mut problems = Vec::new();
    for line in prose_lines(text) {
        let (prose, spans) = split_code_spans(line.text);
        for target in link_targets(&prose) {
            if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (file, fragment) = match target.split_once('#') {
                Some((file, fragment)) => (file, Some(fragment)),
                None => (target.as_str(), None),
            };
            let where_ = format!("{shown}:{}", line.number);
            let resolved = if file.is_empty() {
                path.to_path_buf()
            } else {
                normalize(&dir.join(file))
            };
            let is_markdown = resolved.extension().is_some_and(|ext| ext == "md");
            let exists = resolved.exists() || (is_markdown && read(&resolved).is_some());
            if !file.is_empty() && !exists {
                problems.push(format!(
                    "{where_}: {target}: no such file ({})",
                    resolved.display()
                ));
                continue;
            }
            let Some(fragment) = fragment else { continue };
            let target_anchors = if file.is_empty() {
                own_anchors.clone()
            } else if is_markdown {
                match read(&resolved) {
                    Some(other) => anchors(&other),
                    None => {
                        problems.push(format!("{where_}: {target}: cannot read the target"));
                        continue;
                    }
                }
            } else {
                // An anchor into a non-Markdown file (a line number on GitHub): not checked.
                continue;
            };
            if !target_anchors.contains(fragment) {
                problems.push(format!(
                    "{where_}: {target}: no heading with the anchor #{fragment}"
                ));
            }
        }
        for span in spans {
            if !REPO_DIRS.iter().any(|dir| span.starts_with(dir))
                || span.contains(char::is_whitespace)
                || span.contains(['*', '?', '<', '{', '$'])
                || span.contains("...")
            {
                continue;
            }
            // `src/lib.rs:12` names a line of the file.
            let file = span.split(':').next().unwrap_or(&span);
            if !root.join(file).exists() {
                problems.push(format!(
                    "{shown}:{}: `{span}`: no such file in the repository",
                    line.number
                ));
            }
        }
    }
    problems
}

#[test]
fn every_link_in_the_docs_resolves() {
    let mut cache: HashMap<PathBuf, Option<String>> = HashMap::new();
    let mut read = |path: &Path| {
        cache
            .entry(path.to_path_buf())
            .or_insert_with(|| fs::read_to_string(path).ok())
            .clone()
    };
    let mut problems = Vec::new();
    let documents = documents();
    for document in &documents {
        let text = fs::read_to_string(document)
            .unwrap_or_else(|err| panic!("{}: {err}", document.display()));
        problems.extend(check_document(document, &text, &mut read));
    }
    assert!(
        problems.is_empty(),
        "{} broken link(s) in {} documents:\n{}",
        problems.len(),
        documents.len(),
        problems.join("\n")
    );
}

// The checker itself, on documents made up here: each broken kind is reported, each good one
// is not.

fn check_made_up(text: &str, others: &[(&str, &str)]) -> Vec<String> {
    let path = root().join("docs").join("made-up.md");
    let mut read = |p: &Path| {
        others
            .iter()
            .find(|(name, _)| root().join(name) == p)
            .map(|(_, text)| text.to_string())
            .or_else(|| fs::read_to_string(p).ok())
    };
    check_document(&path, text, &mut read)
}

#[test]
fn slugs_follow_githubs_rules() {
    assert_eq!(slug("Peer comparison"), "peer-comparison");
    assert_eq!(slug("A long `lru_crawler` walk"), "a-long-lru_crawler-walk");
    assert_eq!(slug("memcached's proxy"), "memcacheds-proxy");
    assert_eq!(
        slug("Text, meta and binary on one server"),
        "text-meta-and-binary-on-one-server"
    );
    assert_eq!(
        slug("`/metrics` scraped under load"),
        "metrics-scraped-under-load"
    );
    assert_eq!(slug("Where `unsafe` lives"), "where-unsafe-lives");
    assert_eq!(slug("A/B runs: 2 + 2"), "ab-runs-2--2");
    assert_eq!(slug("See [the page](x.md) now"), "see-the-page-now");
    let text = "# Top\n## Same\n## Same\n```\n## Not a heading\n```\n## Same\n";
    let found = anchors(text);
    for anchor in ["top", "same", "same-1", "same-2"] {
        assert!(found.contains(anchor), "{anchor} in {found:?}");
    }
    assert!(!found.contains("not-a-heading"));
    assert!(!found.contains("same-3"));
}

#[test]
fn broken_links_are_reported() {
    let good = "# Title\n## A section\n\
        [self](#a-section), [file](io.md), [up](../README.md), [dir](../src/),\n\
        [web](https://example.com/missing), [ref]: architecture.md\n\
        `docs/io.md`, `src/lib.rs:1`, `tests/*.rs`, `src/<module>.rs`, `src/...`\n";
    assert_eq!(check_made_up(good, &[]), Vec::<String>::new());

    let broken = [
        ("[gone](no-such-file.md)", "no such file"),
        ("[gone](../src/no_such.rs)", "no such file"),
        ("[anchor](#no-such-heading)", "#no-such-heading"),
        ("[anchor](io.md#no-such-heading)", "#no-such-heading"),
        ("![picture](pictures/none.svg)", "no such file"),
        ("[ref]: nowhere.md", "no such file"),
        (
            "see `src/no_such_module.rs`",
            "no such file in the repository",
        ),
    ];
    for (line, expected) in broken {
        let problems = check_made_up(&format!("# Title\n{line}\n"), &[]);
        assert_eq!(problems.len(), 1, "{line}: {problems:?}");
        assert!(problems[0].contains(expected), "{line}: {problems:?}");
        assert!(
            problems[0].contains("docs/made-up.md:2"),
            "{line}: {problems:?}"
        );
    }

    // Inside code, nothing is a link.
    let code = "# Title\n```\n[gone](no-such-file.md)\n```\n`[gone](no-such-file.md)`\n";
    assert_eq!(check_made_up(code, &[]), Vec::<String>::new());

    // A fragment into another document is checked against that document's headings.
    let other = [("docs/other-made-up.md", "# Other\n## Its part\n")];
    assert_eq!(
        check_made_up("[x](other-made-up.md#its-part)", &other),
        Vec::<String>::new()
    );
    let problems = check_made_up("[x](other-made-up.md#its-whole)", &other);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("#its-whole"), "{problems:?}");
}
