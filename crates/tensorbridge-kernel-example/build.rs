//! Takes the README's kernel recipe, the Rust block under "### Your own CUDA kernel on
//! framework tensors", verbatim into `$OUT_DIR/readme_kernel.rs`, which `src/lib.rs`
//! includes: the crate compiles exactly what the README shows, so the two cannot drift.

use std::path::Path;
use std::{env, fs};

const HEADING: &str = "### Your own CUDA kernel on framework tensors";

fn main() {
    let manifest = env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let readme = Path::new(&manifest).join("../../README.md");
    println!("cargo:rerun-if-changed={}", readme.display());
    let text =
        fs::read_to_string(&readme).unwrap_or_else(|e| panic!("reading {}: {e}", readme.display()));
    let block = recipe(&text).unwrap_or_else(|e| panic!("README.md: {e}"));
    let out = Path::new(&env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("readme_kernel.rs");
    fs::write(&out, block).unwrap_or_else(|e| panic!("writing {}: {e}", out.display()));
}

/// The first fenced Rust block after [`HEADING`], without its fences.
fn recipe(text: &str) -> Result<String, String> {
    let start = text
        .find(HEADING)
        .ok_or_else(|| format!("expected a heading {HEADING:?}"))?;
    let rest = &text[start..];
    let fence = rest
        .find("```rust")
        .ok_or_else(|| format!("expected a ```rust block under {HEADING:?}"))?;
    let body = &rest[fence..];
    let body = &body[body.find('\n').ok_or("an unterminated fence")? + 1..];
    let end = body
        .find("\n```")
        .ok_or_else(|| format!("expected the end of the Rust block under {HEADING:?}"))?;
    Ok(format!("{}\n", &body[..end]))
}
