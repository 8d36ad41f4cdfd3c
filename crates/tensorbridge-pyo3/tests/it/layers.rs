//! The crate's layering, read from its sources: each module uses only those listed above it
//! in `lib.rs`'s bottom-up module list (which this test reads, so the list and the code
//! cannot drift apart), and the two wings, `import` and `export`, stand on the floor without
//! using each other.

use std::path::{Path, PathBuf};

use tensorbridge_testkit::layers;

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn levels() -> Vec<Vec<String>> {
    layers::levels(&std::fs::read_to_string(src().join("lib.rs")).unwrap())
}

fn uses() -> Vec<(String, String, String)> {
    layers::uses(&src())
}

#[test]
fn modules_use_only_the_levels_below() {
    let levels = levels();
    assert_eq!(
        levels.first().map(Vec::as_slice),
        Some(&["error".to_string()][..]),
        "expected lib.rs's bottom-up module list, found {levels:?}"
    );
    let uses = uses();
    assert!(
        uses.len() > 50,
        "expected many `crate::` paths, found {}",
        uses.len()
    );
    let bad = layers::violations(&levels, &uses);
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
