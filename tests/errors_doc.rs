//! Keeps `docs/ERRORS.md` honest: every variant of the core, DLPack, CUDA Array Interface,
//! CUDA layer, cudarc, Python, ndarray, candle and burn error enums has an entry (`Error::Name`) in its crate's section, with its message
//! template exactly as the `#[error]` attribute spells it. A variant added or a message changed
//! without the document following fails here.
//!
//! The enums are read from the error.rs sources with a plain line scanner (not through the
//! crates), so the test needs no feature, driver or GPU.

use std::path::{Path, PathBuf};

/// One variant as the source declares it.
#[derive(Debug)]
struct Variant {
    name: String,
    /// The first string literal of its `#[error(...)]` attribute, unescaped; `None` for
    /// `#[error(transparent)]`.
    template: Option<String>,
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ lies in the workspace root")
        .to_path_buf()
}

fn read(rel: &str) -> String {
    let path = root().join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// The variants of `pub enum Error { ... }` in `source`: the lines of its body that start with
/// exactly four spaces and an upper-case letter (`^\s{4}([A-Z][A-Za-z0-9]*)`), each with the
/// `#[error(...)]` template that precedes it.
fn variants(source: &str) -> Vec<Variant> {
    let mut lines = source.lines();
    lines
        .by_ref()
        .find(|l| l.trim_start().starts_with("pub enum Error {"))
        .expect("a `pub enum Error {` line");
    let mut found = Vec::new();
    // The attribute's text from `#[error(` on, gathered until the variant line.
    let mut attribute: Option<String> = None;
    for line in lines {
        if line == "}" {
            break;
        }
        let trimmed = line.trim_start();
        if let Some(rest) = trimmed.strip_prefix("#[error(") {
            attribute = Some(rest.to_owned());
            continue;
        }
        let name = line.strip_prefix("    ").and_then(|rest| {
            rest.starts_with(|c: char| c.is_ascii_uppercase()).then(|| {
                rest.chars()
                    .take_while(char::is_ascii_alphanumeric)
                    .collect::<String>()
            })
        });
        match name {
            Some(name) => found.push(Variant {
                name,
                template: attribute.take().and_then(|a| first_string_literal(&a)),
            }),
            None => {
                if let Some(a) = attribute.as_mut() {
                    a.push('\n');
                    a.push_str(trimmed);
                }
            }
        }
    }
    found
}

/// The first `"..."` literal in `text`, unescaped; `None` when there is none
/// (`transparent`).
fn first_string_literal(text: &str) -> Option<String> {
    let start = text.find('"')?;
    let mut out = String::new();
    let mut chars = text[start + 1..].chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => return Some(out),
            '\\' => match chars.next()? {
                'n' => out.push('\n'),
                't' => out.push('\t'),
                other => out.push(other),
            },
            c => out.push(c),
        }
    }
    panic!("unterminated string literal in {text:?}")
}

/// The text under the `## ` heading that names `crate_name` in backticks, up to the next `## `
/// heading.
fn section<'a>(doc: &'a str, crate_name: &str) -> &'a str {
    let tag = format!("`{crate_name}`");
    let mut start = None;
    let mut offset = 0;
    for line in doc.split_inclusive('\n') {
        if line.starts_with("## ") {
            if let Some(s) = start {
                return &doc[s..offset];
            }
            if line.contains(&tag) {
                start = Some(offset);
            }
        }
        offset += line.len();
    }
    match start {
        Some(s) => &doc[s..],
        None => panic!("docs/ERRORS.md has no `## ` section naming {tag}"),
    }
}

/// (crate, error.rs, a variant the scanner must find, the least number of variants).
const ENUMS: [(&str, &str, &str, usize); 10] = [
    (
        "tensorbridge",
        "crates/tensorbridge-core/src/error.rs",
        "Misaligned",
        30,
    ),
    (
        "tensorbridge-dlpack",
        "crates/tensorbridge-dlpack/src/error.rs",
        "UnsupportedMajorVersion",
        8,
    ),
    (
        "tensorbridge-cai",
        "crates/tensorbridge-cai/src/error.rs",
        "MalformedTypeStr",
        14,
    ),
    (
        "tensorbridge-cuda",
        "crates/tensorbridge-cuda/src/error.rs",
        "PastAllocation",
        11,
    ),
    (
        "tensorbridge-cudarc",
        "crates/tensorbridge-cudarc/src/error.rs",
        "OutsideSlice",
        3,
    ),
    (
        "tensorbridge-pyo3",
        "crates/tensorbridge-pyo3/src/error.rs",
        "NotATensor",
        40,
    ),
    (
        "tensorbridge-ndarray",
        "crates/tensorbridge-ndarray/src/error.rs",
        "RankMismatch",
        2,
    ),
    (
        "tensorbridge-candle",
        "crates/tensorbridge-candle/src/error.rs",
        "NotZeroCopy",
        10,
    ),
    (
        "tensorbridge-burn",
        "crates/tensorbridge-burn/src/error.rs",
        "WrongBurnTensor",
        5,
    ),
    (
        "tensorbridge-nixl",
        "crates/tensorbridge-nixl/src/lib.rs",
        "TooManyRuns",
        8,
    ),
];

#[test]
fn the_scanner_finds_every_variant() {
    // Guards the guard: if the sources change shape, the scanner must not quietly find nothing.
    for (crate_name, path, known, least) in ENUMS {
        let found = variants(&read(path));
        assert!(
            found.len() >= least,
            "{crate_name}: only {} variants found in {path}: {found:?}",
            found.len()
        );
        let known = found
            .iter()
            .find(|v| v.name == known)
            .unwrap_or_else(|| panic!("{crate_name}: {known} not found in {path}"));
        assert!(known.template.is_some(), "{crate_name}: {known:?}");
        assert!(
            found.iter().all(|v| v.template.is_some()
                || [
                    "Core", "Cuda", "Dlpack", "Cai", "Cudarc", "Python", "Candle", "Nixl"
                ]
                .contains(&v.name.as_str())),
            "{crate_name}: a non-transparent variant without a template: {found:?}"
        );
    }
}

#[test]
fn every_variant_is_documented() {
    let doc = read("docs/ERRORS.md");
    let mut missing = Vec::new();
    for (crate_name, path, _, _) in ENUMS {
        let text = section(&doc, crate_name);
        for v in variants(&read(path)) {
            if !text.contains(&format!("Error::{}", v.name)) {
                missing.push(format!("{crate_name}: Error::{}", v.name));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "docs/ERRORS.md has no entry for these variants (add one under the crate's `## ` section):\n  {}",
        missing.join("\n  ")
    );
}

#[test]
fn every_message_template_is_documented_verbatim() {
    let doc = read("docs/ERRORS.md");
    let mut missing = Vec::new();
    for (crate_name, path, _, _) in ENUMS {
        let text = section(&doc, crate_name);
        for v in variants(&read(path)) {
            if let Some(template) = v.template
                && !text.contains(&template)
            {
                missing.push(format!("{crate_name}: Error::{}: {template}", v.name));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "docs/ERRORS.md does not quote these #[error] templates exactly:\n  {}",
        missing.join("\n  ")
    );
}

#[test]
fn the_scanner_reads_multi_line_attributes_and_escapes() {
    let source = r#"
pub enum Error {
    /// Doc.
    #[error("one {a}")]
    One {
        /// Field.
        a: u8,
    },
    #[error(
        "two \"quoted\" {b:?}"
    )]
    Two { b: u8 },
    #[error(transparent)]
    Core(#[from] Inner),
    Plain,
}
"#;
    let found = variants(source);
    let names: Vec<&str> = found.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(names, ["One", "Two", "Core", "Plain"]);
    assert_eq!(found[0].template.as_deref(), Some("one {a}"));
    assert_eq!(found[1].template.as_deref(), Some("two \"quoted\" {b:?}"));
    assert_eq!(found[2].template, None);
    assert_eq!(found[3].template, None);
}
