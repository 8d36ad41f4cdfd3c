//! Keeps the documentation's links working: every relative Markdown link (`[text](path)`,
//! `[text](path#anchor)`, `[text](#anchor)`) in a Markdown file of the repository names a
//! file or folder that exists, and an anchor names a heading of that file (GitHub's rule:
//! lower case, punctuation dropped, spaces as `-`). The README links to the pages under
//! `docs/`; a page moved or renamed without its links fails here.
//!
//! Links with a scheme (`https:`, `mailto:`) are not followed: the repository cites nothing
//! outside it (`tests/standalone_docs.rs`).

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ lies in the workspace root")
        .to_path_buf()
}

/// The repository's Markdown files, relative to `root`, with `/` separators: the ones
/// `git ls-files` lists (tracked, and untracked ones git does not ignore), or, without git, a
/// walk that skips hidden folders and `target/`.
fn markdown_files(root: &Path) -> Vec<String> {
    let listed = Command::new("git")
        .args([
            "ls-files",
            "-z",
            "--cached",
            "--others",
            "--exclude-standard",
        ])
        .current_dir(root)
        .output();
    let mut all: Vec<String> = match listed {
        Ok(out) if out.status.success() => String::from_utf8(out.stdout)
            .expect("git ls-files gives UTF-8 paths")
            .split('\0')
            .filter(|p| !p.is_empty())
            .map(str::to_owned)
            .collect(),
        _ => {
            let mut found = Vec::new();
            walk(root, root, &mut found);
            found
        }
    };
    all.retain(|f| f.ends_with(".md") && root.join(f).is_file());
    all.sort();
    all.dedup();
    all
}

fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || name == "target" {
            continue;
        }
        if path.is_dir() {
            walk(root, &path, out);
        } else if let Ok(rel) = path.strip_prefix(root) {
            out.push(rel.to_string_lossy().replace('\\', "/"));
        }
    }
}

/// The link targets of one Markdown text, outside fenced code blocks and inline code, with
/// their line numbers (from 1).
fn links(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut fenced = false;
    for (n, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        // Inline code spans removed: `a[i](j)` in code is no link.
        let mut prose = String::new();
        for (i, part) in line.split('`').enumerate() {
            if i % 2 == 0 {
                prose.push_str(part);
            }
        }
        let mut from = 0;
        while let Some(at) = prose[from..].find("](").map(|i| i + from) {
            let start = at + 2;
            let Some(len) = prose[start..].find(')') else {
                break;
            };
            out.push((n + 1, prose[start..start + len].trim().to_owned()));
            from = start + len;
        }
    }
    out
}

/// The anchors GitHub gives a Markdown text's headings (`## The core` -> `the-core`), a
/// repeated one suffixed `-1`, `-2`, ....
fn anchors(text: &str) -> Vec<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced || !line.starts_with('#') {
            continue;
        }
        let title = line.trim_start_matches('#');
        if !title.starts_with(' ') {
            continue;
        }
        let slug: String = title
            .trim()
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let count = seen.entry(slug.clone()).or_insert(0);
        out.push(if *count == 0 {
            slug
        } else {
            format!("{slug}-{count}")
        });
        *count += 1;
    }
    out
}

/// What is wrong with the link `target` in the file `rel`, if anything.
fn broken(root: &Path, rel: &str, target: &str) -> Option<String> {
    if target.contains("://") || target.starts_with("mailto:") {
        return None;
    }
    let (path, anchor) = match target.split_once('#') {
        Some((path, anchor)) => (path, Some(anchor)),
        None => (target, None),
    };
    let here = Path::new(rel).parent().unwrap_or(Path::new(""));
    let file = if path.is_empty() {
        root.join(rel)
    } else {
        root.join(here).join(path)
    };
    if !file.exists() {
        return Some(format!("`{path}` does not exist"));
    }
    let anchor = anchor?;
    let text = fs::read_to_string(&file).ok()?;
    if anchors(&text).iter().any(|a| a == anchor) {
        None
    } else {
        Some(format!("`{path}` has no heading `#{anchor}`"))
    }
}

#[test]
fn every_relative_link_in_the_docs_resolves() {
    let root = root();
    let files = markdown_files(&root);
    assert!(
        files.iter().any(|f| f == "README.md") && files.iter().any(|f| f == "docs/ERRORS.md"),
        "the Markdown files of {} are not the repository's: {files:?}",
        root.display()
    );
    let mut bad = Vec::new();
    let mut checked = 0;
    for rel in &files {
        let text = fs::read_to_string(root.join(rel)).expect("a readable Markdown file");
        for (line, target) in links(&text) {
            checked += 1;
            if let Some(why) = broken(&root, rel, &target) {
                bad.push(format!("{rel}:{line}: ({target}): {why}"));
            }
        }
    }
    assert!(
        checked > 20,
        "only {checked} links found: the parser lost them"
    );
    assert!(bad.is_empty(), "broken links:\n  {}", bad.join("\n  "));
}

#[test]
fn the_readme_links_every_page_under_docs() {
    let root = root();
    let readme = fs::read_to_string(root.join("README.md")).expect("README.md");
    let linked: Vec<String> = links(&readme).into_iter().map(|(_, t)| t).collect();
    let mut missing = Vec::new();
    for rel in markdown_files(&root) {
        if rel.starts_with("docs/") && !linked.contains(&rel) {
            missing.push(rel);
        }
    }
    assert!(
        missing.is_empty(),
        "README.md, the door to the docs, does not link: {}",
        missing.join(", ")
    );
}

#[test]
fn the_parser_finds_links_and_anchors() {
    let text = "# A `b` c\n\nSee [x](docs/ERRORS.md#a-b-c), `[no](code)` and [y](#a-b-c).\n\
                ```\n[no](fenced)\n```\n## A b c\n";
    assert_eq!(
        links(text),
        [
            (3, "docs/ERRORS.md#a-b-c".to_owned()),
            (3, "#a-b-c".to_owned())
        ]
    );
    assert_eq!(anchors(text), ["a-b-c", "a-b-c-1"]);
    let root = root();
    assert_eq!(broken(&root, "README.md", "docs/ERRORS.md"), None);
    assert_eq!(
        broken(&root, "docs/ERRORS.md", "#python-exceptions"),
        None,
        "a heading of docs/ERRORS.md"
    );
    assert!(broken(&root, "README.md", "docs/NOPE").is_some());
    assert!(broken(&root, "docs/TESTING.md", "docs/ERRORS.md").is_some());
    assert!(broken(&root, "README.md", "docs/ERRORS.md#no-such-heading").is_some());
}
