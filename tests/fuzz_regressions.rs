//! Replays every input under `fuzz/corpus/<target>/` and `fuzz/regressions/<target>/` through
//! the fuzz target's body (`tensorbridge_integration::fuzz`): the corpus libFuzzer built (each
//! input reached new code) and the reproducers of every crash it found, kept forever.
//! Runs on stable Rust in `cargo xtask ci`; `cargo xtask fuzz` grows the corpus.

use std::fs;
use std::path::{Path, PathBuf};

use tensorbridge_integration::fuzz;

fn inputs(target: &str) -> Vec<PathBuf> {
    let fuzz_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    let mut files = Vec::new();
    for kind in ["corpus", "regressions"] {
        let Ok(dir) = fs::read_dir(fuzz_dir.join(kind).join(target)) else {
            continue;
        };
        for entry in dir {
            let path = entry.expect("readable directory").path();
            if path.is_file() {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

fn replay(target: &str, body: fn(&[u8])) {
    let files = inputs(target);
    assert!(
        !files.is_empty(),
        "no committed inputs for `{target}`: run `cargo xtask fuzz` and commit fuzz/corpus"
    );
    for path in &files {
        let data = fs::read(path).expect("readable input");
        let result = std::panic::catch_unwind(|| body(&data));
        assert!(result.is_ok(), "{target}: {} panicked", path.display());
    }
    println!("{target}: {} inputs replayed", files.len());
}

#[test]
fn validate_corpus() {
    replay("validate", fuzz::validate);
}

#[test]
fn cai_corpus() {
    replay("cai", fuzz::cai);
}

#[test]
fn dlpack_corpus() {
    replay("dlpack", fuzz::dlpack);
}

#[test]
fn own_export_corpus() {
    replay("own_export", fuzz::own_export);
}

#[test]
fn array_interface_corpus() {
    replay("array_interface", fuzz::array_interface);
}
