//! The crate's layering, read from its sources: `raw.rs` is the one door to the driver, and
//! each module uses only those listed before it in `lib.rs`'s bottom-up module list (which
//! this test reads, so the list and the code cannot drift apart).

use std::path::{Path, PathBuf};

use tensorbridge_testkit::layers::{code, levels, sources, uses, violations};

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn only_raw_calls_the_driver() {
    let mut callers = Vec::new();
    for (rel, text) in sources(&src()) {
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
    let lib = std::fs::read_to_string(src().join("lib.rs")).unwrap();
    let levels = levels(&lib);
    let order: Vec<&str> = levels.iter().flatten().map(String::as_str).collect();
    assert!(
        levels.iter().all(|names| names.len() == 1),
        "expected one module per line of lib.rs's bottom-up list, found {levels:?}"
    );
    assert_eq!(
        order.first().copied(),
        Some("types"),
        "expected lib.rs's bottom-up module list, found {order:?}"
    );
    assert_eq!(order.last().copied(), Some("lib"));
    let uses = uses(&src());
    assert!(
        uses.len() > 50,
        "expected many `crate::` paths, found {}",
        uses.len()
    );
    let bad = violations(&levels, &uses);
    assert!(
        bad.is_empty(),
        "expected each module to use only those before it in lib.rs's list {order:?}, found:\n{}",
        bad.join("\n")
    );
}
