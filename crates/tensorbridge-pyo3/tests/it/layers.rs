//! The crate's layering, read from its sources: each module uses only those listed above it
//! in `lib.rs`'s bottom-up module list (which this test reads, so the list and the code
//! cannot drift apart), and the two wings, `import` and `export`, stand on the floor without
//! using each other.

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

/// The code of a file without its comments (a doc link to a module is no use of it). Strings
/// are not parsed; none of this crate's holds `//` next to a `crate::` path.
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

/// The first names of the paths that start with `crate::` in `text`: `crate::floor::ready`
/// -> `floor`, `crate::View` -> `View`, and each of a group's (`crate::{error, floor}`).
fn crate_paths(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    for (i, _) in text.match_indices("crate::") {
        let rest = &text[i + "crate::".len()..];
        let Some(group) = rest.strip_prefix('{') else {
            out.push(ident(rest));
            continue;
        };
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

/// lib.rs's bottom-up list: each line's modules (`// - import, export: ...`), bottom first.
fn levels() -> Vec<Vec<String>> {
    let lib = fs::read_to_string(src().join("lib.rs")).unwrap();
    lib.lines()
        .skip_while(|l| !l.contains("The modules, bottom-up"))
        .take_while(|l| l.trim_start().starts_with("//"))
        .filter_map(|l| l.trim().strip_prefix("// - "))
        .filter_map(|l| l.split(':').next())
        .map(|names| names.split(',').map(|n| n.trim().to_string()).collect())
        .collect()
}

/// Every `crate::` path of every source file but lib.rs (the root declares and re-exports
/// every module): (file, its module, the module the path names). A name that is no module
/// is an item of the root: a re-export (`crate::View`, `crate::Error`) is its module's, any
/// other (`crate::TensorArg`) is `lib`'s.
fn uses() -> Vec<(String, String, String)> {
    let lib = code(&fs::read_to_string(src().join("lib.rs")).unwrap());
    let modules: Vec<String> = levels().into_iter().flatten().collect();
    let mut exported: HashMap<String, String> = HashMap::new();
    for (i, _) in lib.match_indices("pub use ") {
        let rest = &lib[i + "pub use ".len()..];
        let stmt = &rest[..rest.find(';').unwrap()];
        let Some((module, names)) = stmt.split_once("::") else {
            continue;
        };
        if !modules.iter().any(|m| m == module) {
            continue;
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
    for (rel, text) in sources() {
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

#[test]
fn modules_use_only_the_levels_below() {
    let levels = levels();
    assert_eq!(
        levels.first().map(Vec::as_slice),
        Some(&["error".to_string()][..]),
        "expected lib.rs's bottom-up module list, found {levels:?}"
    );
    let rank: HashMap<&str, usize> = levels
        .iter()
        .enumerate()
        .flat_map(|(i, names)| names.iter().map(move |n| (n.as_str(), i)))
        .collect();
    let uses = uses();
    assert!(
        uses.len() > 50,
        "expected many `crate::` paths, found {}",
        uses.len()
    );
    let mut bad = Vec::new();
    for (rel, module, used) in &uses {
        let Some(&own) = rank.get(module.as_str()) else {
            panic!("src/{rel} belongs to `{module}`, which lib.rs's module list does not name");
        };
        if used != module && rank[used.as_str()] >= own {
            bad.push(format!("src/{rel} ({module}) uses crate::{used}"));
        }
    }
    assert!(
        bad.is_empty(),
        "expected each module to use only those on lines above its own in lib.rs's list \
         {levels:?}, found:\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_wings_do_not_use_each_other() {
    let uses = uses();
    let crossing: Vec<String> = uses
        .iter()
        .filter(|(_, module, used)| {
            (module == "import" && used == "export") || (module == "export" && used == "import")
        })
        .map(|(rel, _, used)| format!("src/{rel} uses crate::{used}"))
        .collect();
    // Both wings stand on the floor: the test sees them use it (so it reads the right files).
    for wing in ["import", "export"] {
        assert!(
            uses.iter().any(|(_, m, u)| m == wing && u == "floor"),
            "expected `{wing}` to use the floor"
        );
    }
    assert!(
        crossing.is_empty(),
        "expected import/ and export/ to share only the floor, found:\n{}",
        crossing.join("\n")
    );
}

/// Kernel calls find streams through the floor (the one reader of a `stream=` argument) and
/// through `TensorArg` (an argument's framework stream): never in the import's internals.
#[test]
fn kernel_calls_do_not_reach_into_the_import() {
    let uses = uses();
    assert!(
        uses.iter()
            .any(|(rel, _, used)| rel == "kernel.rs" && used == "floor"),
        "expected kernel.rs to read streams through the floor"
    );
    let reaching: Vec<&String> = uses
        .iter()
        .filter(|(rel, _, used)| rel == "kernel.rs" && used == "import")
        .map(|(rel, _, _)| rel)
        .collect();
    assert!(
        reaching.is_empty(),
        "expected kernel.rs to use no crate::import path, found {} in {reaching:?}",
        reaching.len()
    );
}
