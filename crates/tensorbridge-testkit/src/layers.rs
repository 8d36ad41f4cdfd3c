//! A crate's layering, read from its sources: the layering tests of `tensorbridge-cuda` and
//! `tensorbridge-pyo3` check that each module uses only the modules on lines below its own in
//! `lib.rs`'s bottom-up module list, which they read with [`levels`], so the list and the code
//! cannot drift apart.
//!
//! The list is the comment that opens with "The modules, bottom-up": one line per level,
//! `// - name, other: what they are`, the bottom level first.

use std::collections::HashMap;
use std::fs;
use std::path::Path;

/// Every `.rs` file under `src`, with its path relative to `src` and its text, sorted by path.
///
/// # Panics
///
/// If `src` cannot be read, or holds ten files or fewer (not a crate's sources).
#[must_use]
pub fn sources(src: &Path) -> Vec<(String, String)> {
    fn walk(dir: &Path, base: &Path, out: &mut Vec<(String, String)>) {
        for entry in fs::read_dir(dir).expect("a source directory") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                walk(&path, base, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path
                    .strip_prefix(base)
                    .expect("under the base")
                    .to_string_lossy()
                    .into_owned();
                out.push((rel, fs::read_to_string(&path).expect("a source file")));
            }
        }
    }
    let mut out = Vec::new();
    walk(src, src, &mut out);
    out.sort();
    assert!(
        out.len() > 10,
        "expected the crate's sources, found {out:?}"
    );
    out
}

/// The code of a file without its comments (line and doc comments: a doc link to a module is
/// no use of it). Strings are not parsed; the crates read hold no `//` next to a `crate::`
/// path inside a string.
#[must_use]
pub fn code(text: &str) -> String {
    text.lines()
        .map(|line| line.find("//").map_or(line, |i| &line[..i]))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The module a source file belongs to: its first path component without `.rs`.
#[must_use]
pub fn module_of(rel: &str) -> &str {
    let first = rel.split(['/', '\\']).next().unwrap_or(rel);
    first.strip_suffix(".rs").unwrap_or(first)
}

/// The leading identifier of `text`.
fn ident(text: &str) -> &str {
    let end = text
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(text.len());
    &text[..end]
}

/// The first names of the paths that start with `crate::` in `text`: `crate::floor::ready`
/// -> `floor`, `crate::Error` -> `Error`, and each of a group's top-level names
/// (`crate::{error, floor}`).
#[must_use]
pub fn crate_paths(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    for (i, _) in text.match_indices("crate::") {
        let rest = &text[i + "crate::".len()..];
        let Some(group) = rest.strip_prefix('{') else {
            out.push(ident(rest));
            continue;
        };
        // The names at the group's top level: after its `{` and after each top-level comma.
        let mut depth = 1;
        let mut start = true;
        for (j, c) in group.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 1 => break,
                '}' => depth -= 1,
                ',' if depth == 1 => start = true,
                c if c.is_whitespace() => {}
                _ if start && depth == 1 => {
                    out.push(ident(&group[j..]));
                    start = false;
                }
                _ => {}
            }
        }
    }
    out
}

/// `lib.rs`'s bottom-up module list (`lib` is its text): each line's modules, bottom first.
#[must_use]
pub fn levels(lib: &str) -> Vec<Vec<String>> {
    lib.lines()
        .skip_while(|l| !l.contains("The modules, bottom-up"))
        .take_while(|l| l.trim_start().starts_with("//"))
        .filter_map(|l| l.trim().strip_prefix("// - "))
        .filter_map(|l| l.split(':').next())
        .map(|names| {
            names
                .split(',')
                .map(|n| n.trim().trim_end_matches(".rs").to_string())
                .collect()
        })
        .collect()
}

/// Every `crate::` path of every source file under `src` but `lib.rs` (the root declares and
/// re-exports every module): (file, its module, the module the path names). A name that is
/// no module of `lib.rs`'s list is an item of the root: a re-export (`crate::Error`) is its
/// module's, any other is `lib`'s.
///
/// # Panics
///
/// As [`sources`], and if `src/lib.rs` cannot be read.
#[must_use]
pub fn uses(src: &Path) -> Vec<(String, String, String)> {
    let lib_text = fs::read_to_string(src.join("lib.rs")).expect("lib.rs");
    let lib = code(&lib_text);
    let modules: Vec<String> = levels(&lib_text).into_iter().flatten().collect();
    let mut exported: HashMap<String, String> = HashMap::new();
    for (i, _) in lib.match_indices("pub use ") {
        let rest = &lib[i + "pub use ".len()..];
        let stmt = &rest[..rest.find(';').unwrap_or(rest.len())];
        let Some((module, names)) = stmt.split_once("::") else {
            continue;
        };
        if !modules.iter().any(|m| m == module) {
            continue; // another crate's item
        }
        for name in names
            .trim_matches(|c| c == '{' || c == '}' || char::is_whitespace(c))
            .split(',')
        {
            // `floor::view::View` is `View`, the floor's.
            let name = name.trim().rsplit("::").next().unwrap_or_default();
            if !name.is_empty() {
                exported.insert(name.to_string(), module.to_string());
            }
        }
    }
    let mut out = Vec::new();
    for (rel, text) in sources(src) {
        let module = module_of(&rel).to_string();
        if module == "lib" {
            continue;
        }
        for ident in crate_paths(&code(&text)) {
            let used = if modules.iter().any(|m| m == ident) {
                ident.to_string()
            } else if let Some(m) = exported.get(ident) {
                m.clone()
            } else {
                "lib".to_string()
            };
            out.push((rel.clone(), module.clone(), used));
        }
    }
    out
}

/// The uses of [`uses`] that break the levels of [`levels`]: a module using one on its own
/// line or above (`lib` is the top). Each as "src/FILE (MODULE) uses crate::USED".
///
/// # Panics
///
/// If a file belongs to a module the list does not name (the list would be stale).
#[must_use]
pub fn violations(levels: &[Vec<String>], uses: &[(String, String, String)]) -> Vec<String> {
    let rank: HashMap<&str, usize> = levels
        .iter()
        .enumerate()
        .flat_map(|(i, names)| names.iter().map(move |n| (n.as_str(), i)))
        .collect();
    let top = levels.len();
    let mut bad = Vec::new();
    for (rel, module, used) in uses {
        let Some(&own) = rank.get(module.as_str()) else {
            panic!("src/{rel} belongs to `{module}`, which lib.rs's module list does not name");
        };
        let theirs = rank.get(used.as_str()).copied().unwrap_or(top);
        if used != module && theirs >= own {
            bad.push(format!("src/{rel} ({module}) uses crate::{used}"));
        }
    }
    bad
}

#[cfg(test)]
mod tests {
    use super::{crate_paths, levels, module_of, violations};

    #[test]
    fn paths_groups_and_modules_are_read() {
        assert_eq!(
            crate_paths("use crate::{error::Error, floor}; crate::View::new(); crate::a::{b, c}"),
            ["error", "floor", "View", "a"]
        );
        assert_eq!(module_of("import/dlpack.rs"), "import");
        assert_eq!(module_of("kernel.rs"), "kernel");
        let lib = "//! The modules, bottom-up:\n// - error: errors\n// - import, export: wings\n// - lib.rs: root\nmod a;";
        let levels = levels(lib);
        assert_eq!(
            levels,
            [vec!["error"], vec!["import", "export"], vec!["lib"]]
        );
        let up = (
            "error.rs".to_string(),
            "error".to_string(),
            "import".to_string(),
        );
        let side = (
            "import/a.rs".to_string(),
            "import".to_string(),
            "export".to_string(),
        );
        let down = (
            "export/b.rs".to_string(),
            "export".to_string(),
            "error".to_string(),
        );
        assert_eq!(
            violations(&levels, std::slice::from_ref(&down)),
            Vec::<String>::new()
        );
        assert_eq!(violations(&levels, &[up, side, down]).len(), 2);
    }
}
