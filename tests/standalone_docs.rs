//! Keeps the repository standalone: no tracked text file (`md`, `rs`, `py`, `pyi`, `toml`,
//! `sh`, `txt`) sends its reader outside it. A reader of the code or the docs has only the
//! repository, so a reason has to be written out where it is used, never left in a tracker
//! or a document nobody else has.
//!
//! Refused, line by line (each rule is [`Rule`]):
//! - the project's own tracker: "issue" with a number (`issue 27`, `issues #295`), the
//!   possessive or a label (`issue's`, `issue:`), "the issue", and "issue" as a part of an
//!   identifier (`test_issue_...`);
//! - tracker numbers: `#` and three or more digits after a name (`name#NNN`, `name #NNN`),
//!   a space, a bracket or a comma, and tracker URLs (`/issues/N`, `/pull/N`). Not format
//!   strings (`{x:#018x}`: a colon before the `#`, a letter after the digits), colours
//!   (`"#1b7f3b"`: a quote before), attributes (`#[...]`) or one or two digits (`frame #1`);
//! - files outside the repository: `../shared`, `/work/`, `PEERS`, and any `NAME.md` that no
//!   file of the repository is called (`DESIGN.md`, `STYLE.md`, `BUILD.md`).
//!
//! What to write instead: the behaviour, the versions it holds for, and why it matters
//! ("NumPy before 2.4 reads a null data pointer as no data"); a benchmark titled by what it
//! measures; a target stated as the target.
//!
//! The files are the ones `git ls-files` lists (tracked, and untracked ones git does not
//! ignore), or, without git, a walk of the tree that skips `target/`, hidden folders and the
//! build and fuzzing outputs. `fuzz/corpus/` (binary inputs) and this file (whose examples
//! below are the patterns themselves) are skipped.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The extensions of the text files checked.
const EXTENSIONS: &[&str] = &["md", "rs", "py", "pyi", "toml", "sh", "txt"];

/// This file, relative to the root: it spells the patterns out.
const SELF: &str = "tests/standalone_docs.rs";

/// One kind of reference out of the repository.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rule {
    /// The project's tracker: "issue 27", "the issue's", `test_issue_...`.
    Issue,
    /// A tracker number: `numpy#26037`, `pytorch #188023`, `.../issues/12`.
    TrackerNumber,
    /// A file outside the repository: `../shared`, `DESIGN.md`.
    OutsideFile,
}

impl Rule {
    fn advice(self) -> &'static str {
        match self {
            Rule::Issue => {
                "cites the project's tracker: say what the behaviour or target is instead"
            }
            Rule::TrackerNumber => {
                "cites a tracker number: say what the upstream behaviour is, in which versions, and why it matters"
            }
            Rule::OutsideFile => {
                "names a file outside the repository: carry what it says into the text"
            }
        }
    }
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ lies in the workspace root")
        .to_path_buf()
}

/// The files to check, relative to `root`, with `/` separators.
fn files(root: &Path) -> Vec<String> {
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
    let mut all = match listed {
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
    all.sort();
    all.dedup();
    all
}

/// Every file under `dir`, skipping what is not the repository's: hidden folders, build
/// outputs and the fuzzers' working folders.
fn walk(root: &Path, dir: &Path, found: &mut Vec<String>) {
    let entries = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading the folder {}: {e}", dir.display()));
    for entry in entries {
        let entry = entry.unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()));
        let path = entry.path();
        let rel = path
            .strip_prefix(root)
            .expect("under the root")
            .to_string_lossy()
            .replace('\\', "/");
        let name = entry.file_name().to_string_lossy().into_owned();
        if path.is_dir() {
            let skipped = name.starts_with('.')
                || matches!(name.as_str(), "target" | "__pycache__" | "gpu-bundle")
                || matches!(
                    rel.as_str(),
                    "fuzz/target" | "fuzz/artifacts" | "fuzz/coverage" | "fuzz/corpus"
                );
            if !skipped {
                walk(root, &path, found);
            }
        } else {
            found.push(rel);
        }
    }
}

fn checked(rel: &str) -> bool {
    rel != SELF
        && !rel.starts_with("fuzz/corpus/")
        && Path::new(rel)
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| EXTENSIONS.contains(&e))
}

fn is_word(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The references out of the repository in one line, each with the text that matched.
/// `names` are the file names the repository has (for `NAME.md`).
fn findings(line: &str, names: &[String]) -> Vec<(Rule, String)> {
    let mut out = Vec::new();
    issue_refs(line, &mut out);
    tracker_numbers(line, &mut out);
    outside_files(line, names, &mut out);
    out
}

/// "issue" (any case) as a word or a part of an identifier, cited: with a number, possessive,
/// as a label, after "the", or inside an identifier.
fn issue_refs(line: &str, out: &mut Vec<(Rule, String)>) {
    let lower = line.to_ascii_lowercase();
    let mut from = 0;
    while let Some(at) = lower[from..].find("issue").map(|i| i + from) {
        from = at + "issue".len();
        let before = lower[..at].chars().next_back();
        // A letter or digit right before: part of another word ("reissue").
        if before.is_some_and(|c| c.is_ascii_alphanumeric()) {
            continue;
        }
        let mut rest = &lower[from..];
        if let Some(r) = rest.strip_prefix('s') {
            rest = r;
        }
        let next = rest.chars().next();
        // A letter right after: another word ("issued", "issuer").
        if next.is_some_and(|c| c.is_ascii_alphabetic()) {
            continue;
        }
        let in_identifier = before == Some('_') || next == Some('_');
        let numbered = rest
            .trim_start()
            .trim_start_matches('#')
            .starts_with(|c: char| c.is_ascii_digit());
        let labelled = rest.starts_with("'s") || rest.starts_with(':');
        let the = lower[..at].trim_end().ends_with(" the")
            || lower[..at].trim_end() == "the"
            || lower[..at].trim_end().ends_with("(the");
        if in_identifier || numbered || labelled || the {
            let start = lower[..at]
                .rfind(|c: char| c.is_whitespace())
                .map_or(0, |i| i + 1);
            // The word and the one after it ("issue 27", "issue's reproduction").
            let words: Vec<&str> = line[start..].split_whitespace().take(2).collect();
            out.push((Rule::Issue, words.join(" ")));
        }
    }
}

/// `#` and three or more digits after a name, a space, a bracket or a comma, or at the start
/// of the line; and `/issues/N`, `/pull/N` in addresses.
fn tracker_numbers(line: &str, out: &mut Vec<(Rule, String)>) {
    let bytes = line.as_bytes();
    for (at, _) in line.match_indices('#') {
        let digits = bytes[at + 1..]
            .iter()
            .take_while(|b| b.is_ascii_digit())
            .count();
        if digits < 3 {
            continue;
        }
        let after = &line[at + 1 + digits..];
        // A letter or `_` after the digits: a format spec (`#018x`) or a hex colour; a `.` and a
        // digit: a version (`crate#100.2.0`).
        let mut chars = after.chars();
        match chars.next() {
            Some(c) if is_word(c) => continue,
            Some('.') if chars.next().is_some_and(|c| c.is_ascii_digit()) => continue,
            _ => {}
        }
        let before = line[..at].chars().next_back();
        let cites = match before {
            None => true,
            Some(c) => c.is_ascii_alphanumeric() || matches!(c, ' ' | '\t' | '(' | ',' | '-' | '_'),
        };
        if cites {
            let start = line[..at]
                .trim_end()
                .rfind(|c: char| c.is_whitespace() || c == '(')
                .map_or(0, |i| i + 1);
            out.push((Rule::TrackerNumber, excerpt(line, start, at + 1 + digits)));
        }
    }
    for marker in ["/issues/", "/pull/"] {
        for (at, _) in line.match_indices(marker) {
            if line[at + marker.len()..].starts_with(|c: char| c.is_ascii_digit()) {
                out.push((
                    Rule::TrackerNumber,
                    excerpt(line, at, at + marker.len() + 1),
                ));
            }
        }
    }
}

/// `../shared`, `/work/`, `PEERS`, and `NAME.md` where no file of the repository is `NAME.md`.
fn outside_files(line: &str, names: &[String], out: &mut Vec<(Rule, String)>) {
    for marker in ["../shared", "/work/"] {
        if let Some(at) = line.find(marker) {
            out.push((Rule::OutsideFile, excerpt(line, at, at + marker.len())));
        }
    }
    for (at, _) in line.match_indices("PEERS") {
        let before = line[..at].chars().next_back();
        let after = line[at + "PEERS".len()..].chars().next();
        if !before.is_some_and(|c| c.is_ascii_alphabetic())
            && !after.is_some_and(|c| c.is_ascii_alphabetic())
        {
            out.push((Rule::OutsideFile, excerpt(line, at, at + "PEERS".len())));
        }
    }
    for (at, _) in line.match_indices(".md") {
        if line[at + 3..].starts_with(is_word) {
            continue;
        }
        let start = line[..at]
            .rfind(|c: char| !(is_word(c) || c == '-'))
            .map_or(0, |i| i + 1);
        let name = &line[start..at + 3];
        if start == at || !name.starts_with(|c: char| c.is_ascii_alphabetic()) {
            continue;
        }
        if !names.iter().any(|n| n == name) {
            out.push((Rule::OutsideFile, name.to_owned()));
        }
    }
}

/// `line[start..stop]`, widened to character boundaries.
fn excerpt(line: &str, mut start: usize, mut stop: usize) -> String {
    stop = stop.min(line.len());
    while !line.is_char_boundary(start) {
        start -= 1;
    }
    while !line.is_char_boundary(stop) {
        stop += 1;
    }
    line[start..stop].to_owned()
}

#[test]
fn no_text_file_sends_its_reader_outside_the_repository() {
    let root = root();
    let all = files(&root);
    assert!(
        all.iter().any(|f| f == "docs/ERRORS.md") && all.iter().any(|f| f == SELF),
        "the file list of {} is not the repository's ({} files)",
        root.display(),
        all.len()
    );
    let names: Vec<String> = all
        .iter()
        .map(|f| f.rsplit('/').next().unwrap_or(f).to_owned())
        .collect();
    let mut found = Vec::new();
    let mut read = 0;
    for rel in all.iter().filter(|f| checked(f)) {
        let text = match std::fs::read(root.join(rel)) {
            Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            // Tracked but deleted in the working tree: nothing to read.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => panic!("reading {rel}: {e}"),
        };
        read += 1;
        for (n, line) in text.lines().enumerate() {
            for (rule, text) in findings(line, &names) {
                found.push(format!("{rel}:{}: `{text}` {}", n + 1, rule.advice()));
            }
        }
    }
    assert!(
        read > 100,
        "only {read} text files found under {}",
        root.display()
    );
    assert!(
        found.is_empty(),
        "{} reference(s) out of the repository (see this test's module docs):\n{}",
        found.len(),
        found.join("\n")
    );
}

#[cfg(test)]
mod rules {
    use super::{Rule, findings};

    fn rules(line: &str) -> Vec<Rule> {
        let names = ["README.md", "ERRORS.md", "BUILDING.md"].map(str::to_owned);
        findings(line, &names).into_iter().map(|(r, _)| r).collect()
    }

    #[test]
    fn the_projects_tracker_is_refused() {
        for line in [
            "### Your own kernel: the host cost of one call (issue 27)",
            "| issue 27's figure |",
            "Targets are from Issue 8; met and missed are against them.",
            "(burn issue #3964 asks for it)",
            "(cudarc issues #295 and #519)",
            "the issue's reproduction verbatim",
            "\"\"\"Issue 26, item 6 (host): access is never wider",
            "the per-call fast paths of the import (issue: per-call overhead)",
            "# The chains the issue reported, spelled out",
            "def test_issue_chains_through_torch():",
            "ISSUE_CHAINS = [",
        ] {
            assert!(rules(line).contains(&Rule::Issue), "{line}");
        }
    }

    #[test]
    fn tracker_numbers_are_refused() {
        for line in [
            "the object for a scalar (numpy#26037, fixed by numpy#29338)",
            "aborts the process on them (pytorch #188023), and",
            "one block have the same memory handle (CuPy #9436 is that effect)",
            "the PR that made the raw pointer public, #556, was closed",
            "#1306, a storage type that holds a foreign owner",
            "see https://github.com/o/r/issues/12 and https://github.com/o/r/pull/7",
        ] {
            assert!(rules(line).contains(&Rule::TrackerNumber), "{line}");
        }
    }

    #[test]
    fn files_outside_the_repository_are_refused() {
        for line in [
            "as ../shared/DESIGN.md explains",
            "see DESIGN.md, section 3",
            "(STYLE.md)",
            "BUILD.md says so",
            "the PEERS notes",
            "measured in PEERS-2026-11.md",
            "/work/main/ARCHITECTURE.md",
        ] {
            assert!(rules(line).contains(&Rule::OutsideFile), "{line}");
        }
    }

    #[test]
    fn ordinary_text_passes() {
        for line in [
            "\"the share handle's checksum is {found:#018x} but its bytes hash to {computed:#018x}\"",
            "[float(r[\"share_us\"]) for r in rows], \"#1b7f3b\"),",
            "#[derive(Debug)]",
            "let s = r#\"raw\"#;",
            "libtorch backtrace (`Exception raised from ... frame #0: ...`)",
            "\"package_id\":\"path+file:///w/crates/tensorbridge-cudarc#0.1.0\"",
            "the driver may issue the copy on another stream, and issued work completes",
            "a tissue of lies; reissue it",
            "the peers spend; docs/ERRORS.md and README.md say what to do",
            "docs/BUILDING.md holds the pins",
            "// ([`kernel_call`], item 5).",
            "Per-call overhead, 2026-11-23",
        ] {
            assert_eq!(rules(line), Vec::<Rule>::new(), "{line}");
        }
    }
}
