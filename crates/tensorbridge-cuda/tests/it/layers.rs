//! The crate's layering, read from its sources: `raw.rs` is the one door to the driver, and
//! each module uses only those listed before it in `lib.rs`'s bottom-up module list (which
//! this test reads, so the list and the code cannot drift apart).

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `src/`, with its path relative to `src/`.
fn sources() -> Vec<(String, String)> {
    fn walk(dir: &Path, base: &Path, out: &mut Vec<(String, String)>) {
        for entry in fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, base, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path
                    .strip_prefix(base)
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                out.push((rel, fs::read_to_string(&path).unwrap()));
            }
        }
    }
    let mut out = Vec::new();
    walk(&src(), &src(), &mut out);
    out.sort();
    assert!(
        out.len() > 10,
        "expected the crate's sources, found {out:?}"
    );
    out
}

/// The code of a file without its comments (line comments and doc comments: a doc link to a
/// module above is no use of it). Strings are not parsed; none of this crate's holds `//`.
fn code(text: &str) -> String {
    text.lines()
        .map(|line| line.find("//").map_or(line, |i| &line[..i]))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The module a source file belongs to: its first path component without `.rs`.
fn module_of(rel: &str) -> &str {
    let first = rel.split(['/', '\\']).next().unwrap();
    first.strip_suffix(".rs").unwrap_or(first)
}

/// The leading identifier of `text`.
fn ident(text: &str) -> &str {
    let end = text
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(text.len());
    &text[..end]
}

/// The first names of the paths that start with `crate::` in `text`: `crate::context::bind`
/// -> `context`, `crate::Error` -> `Error`, and each of a group's (`crate::{Error, raw}`).
fn crate_paths(text: &str) -> Vec<&str> {
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

#[test]
fn only_raw_calls_the_driver() {
    let mut callers = Vec::new();
    for (rel, text) in sources() {
        if rel == "raw.rs" {
            assert!(
                code(&text).contains("sys::cu"),
                "raw.rs makes no driver call: has the door moved?"
            );
            continue;
        }
        let code = code(&text);
        // A direct call (`sys::cuInit`), an import of driver functions (`sys::{cuInit, ..}`),
        // or cudarc's own thin wrappers over them (`driver::result`).
        let direct = code.contains("sys::cu");
        let imported = code.match_indices("sys::{").any(|(i, _)| {
            let list = &code[i..];
            let list = &list[..list.find('}').unwrap_or(list.len())];
            list.contains("cu")
        });
        let result = code.contains("driver::result");
        if direct || imported || result {
            callers.push(rel);
        }
    }
    assert!(
        callers.is_empty(),
        "expected only raw.rs to call the driver (`sys::cu*`, cudarc's `result`), found calls in {callers:?}"
    );
}

#[test]
fn modules_use_only_the_layers_below() {
    let lib = fs::read_to_string(src().join("lib.rs")).unwrap();
    // The list: the comment lines `// - name:` of the comment that opens with "The modules,
    // bottom-up", bottom first.
    let order: Vec<String> = lib
        .lines()
        .skip_while(|l| !l.contains("The modules, bottom-up"))
        .take_while(|l| l.trim_start().starts_with("//"))
        .filter_map(|l| l.trim().strip_prefix("// - "))
        .filter_map(|l| l.split(':').next())
        .map(|name| name.trim().trim_end_matches(".rs").to_string())
        .collect();
    let rank: HashMap<&str, usize> = order
        .iter()
        .enumerate()
        .map(|(i, m)| (m.as_str(), i))
        .collect();
    assert_eq!(
        order.first().map(String::as_str),
        Some("types"),
        "expected lib.rs's bottom-up module list, found {order:?}"
    );
    assert_eq!(order.last().map(String::as_str), Some("lib"));
    // The names lib.rs re-exports (`crate::Error` is `error`'s).
    let mut exported: HashMap<String, String> = HashMap::new();
    let lib_code = code(&lib);
    for (i, _) in lib_code.match_indices("pub use ") {
        let rest = &lib_code[i + "pub use ".len()..];
        let stmt = &rest[..rest.find(';').unwrap()];
        let Some((module, names)) = stmt.split_once("::") else {
            continue;
        };
        if !rank.contains_key(module) {
            continue; // another crate's item
        }
        for name in names
            .trim_matches(|c| c == '{' || c == '}' || char::is_whitespace(c))
            .split(',')
        {
            let name = name.trim();
            if !name.is_empty() {
                exported.insert(name.to_string(), module.to_string());
            }
        }
    }
    let mut bad = Vec::new();
    let mut seen = 0;
    for (rel, text) in sources() {
        let module = module_of(&rel);
        if module == "lib" {
            continue;
        }
        let Some(&own) = rank.get(module) else {
            panic!("src/{rel} belongs to `{module}`, which lib.rs's module list does not name");
        };
        for ident in crate_paths(&code(&text)) {
            seen += 1;
            let used = if rank.contains_key(ident) {
                ident.to_string()
            } else if let Some(m) = exported.get(ident) {
                m.clone()
            } else {
                // An item of lib.rs itself (`reclaim`).
                "lib".to_string()
            };
            if rank[used.as_str()] > own {
                bad.push(format!("src/{rel} ({module}) uses crate::{ident} ({used})"));
            }
        }
    }
    assert!(seen > 50, "expected many `crate::` paths, found {seen}");
    assert!(
        bad.is_empty(),
        "expected each module to use only those before it in lib.rs's list {order:?}, found:\n{}",
        bad.join("\n")
    );
}
