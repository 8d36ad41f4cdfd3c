//! The repository holds sources only: `ci`'s first step fails on any tracked build artifact.
//!
//! CI runs from a fresh clone, so what it checks is what is committed: the files
//! `git ls-files` lists, read from the work tree. A file is an artifact when its name ends
//! in an extension builds produce (shared and static libraries, objects, Rust libraries,
//! wheels, executables) or when its first bytes are an executable format's magic (ELF,
//! Mach-O, fat Mach-O, PE/COFF), whatever its name. A tracked file that must stay (a test
//! fixture that is a binary on purpose) goes into [`ALLOWED`] with the reason.

use std::fs::File;
use std::io::Read as _;
use std::path::Path;
use std::process::Command;

use anyhow::{Context as _, Result, bail};

/// Tracked files allowed despite looking like build output: (path, why). None today.
const ALLOWED: &[(&str, &str)] = &[];

/// Extensions (lower case, without the dot) of what compilers, linkers and packagers write.
const EXTENSIONS: &[&str] = &[
    "so", "dylib", "dll", "pyd", "a", "o", "obj", "lib", "whl", "rlib", "rmeta", "exe",
];

/// Magic numbers at the start of executable formats: (bytes, format).
const MAGIC: &[(&[u8], &str)] = &[
    (b"\x7fELF", "ELF"),
    (&[0xfe, 0xed, 0xfa, 0xce], "Mach-O (32-bit, big-endian)"),
    (&[0xce, 0xfa, 0xed, 0xfe], "Mach-O (32-bit)"),
    (&[0xfe, 0xed, 0xfa, 0xcf], "Mach-O (64-bit, big-endian)"),
    (&[0xcf, 0xfa, 0xed, 0xfe], "Mach-O (64-bit)"),
    (&[0xca, 0xfe, 0xba, 0xbe], "fat Mach-O"),
    (b"MZ", "PE/COFF (MZ)"),
    (b"!<arch>\n", "ar archive (static library)"),
];

/// Why `path` (whose first bytes are `head`) is a build artifact, or `None` when it is not.
pub(crate) fn artifact_reason(path: &str, head: &[u8]) -> Option<String> {
    if ALLOWED.iter().any(|(p, _)| *p == path) {
        return None;
    }
    let name = path.rsplit('/').next().unwrap_or(path);
    // `libfoo.so.1` counts as `.so`: every dot-separated part after the stem is checked.
    let mut parts = name.split('.');
    let stem = parts.next();
    if stem.is_some_and(|s| !s.is_empty()) {
        for ext in parts {
            let ext = ext.to_ascii_lowercase();
            if EXTENSIONS.contains(&ext.as_str()) {
                return Some(format!(
                    "its name ends in a build output's extension (.{ext})"
                ));
            }
        }
    }
    MAGIC
        .iter()
        .find(|(magic, _)| head.starts_with(magic))
        .map(|(_, format)| format!("its content starts with the {format} magic"))
}

/// Every tracked file of the repository at `root` that is a build artifact, with the reason.
pub(crate) fn tracked_artifacts(root: &Path) -> Result<Vec<(String, String)>> {
    let out = Command::new("git")
        .arg("-C")
        .arg(root)
        .args(["ls-files", "-z"])
        .output()
        .context("running `git ls-files`")?;
    if !out.status.success() {
        bail!(
            "`git ls-files` failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let mut found = Vec::new();
    for path in out.stdout.split(|&b| b == 0).filter(|p| !p.is_empty()) {
        let path = String::from_utf8_lossy(path).into_owned();
        let mut head = Vec::with_capacity(8);
        let full = root.join(&path);
        // A tracked file deleted in the work tree (or a submodule's folder) has no content
        // to read here; its name is still checked.
        if full.is_file() {
            File::open(&full)
                .and_then(|f| f.take(8).read_to_end(&mut head))
                .with_context(|| format!("reading {}", full.display()))?;
        }
        if let Some(reason) = artifact_reason(&path, &head) {
            found.push((path, reason));
        }
    }
    Ok(found)
}

/// The step: fails, naming each file and why, when a build artifact is tracked.
pub(crate) fn check(root: &Path) -> Result<()> {
    let found = tracked_artifacts(root)?;
    if found.is_empty() {
        return Ok(());
    }
    let list: Vec<String> = found
        .iter()
        .map(|(p, why)| format!("  {p}: {why}"))
        .collect();
    bail!(
        "{} tracked file(s) look like build output (the repository holds sources only: \
         `git rm --cached` them and ignore them in .gitignore, or list a fixture in \
         xtask/src/artifacts.rs's ALLOWED with the reason):\n{}",
        found.len(),
        list.join("\n")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_of_build_outputs_are_flagged() {
        for path in [
            "crates/x/python/pkg/_native.abi3.so",
            "libfoo.so.1",
            "target/x.whl",
            "a/b/libz.A",
            "m.pyd",
            "w.dll",
            "k.dylib",
            "libstd-123.rlib",
            "x.o",
            "tool.exe",
        ] {
            assert!(artifact_reason(path, b"").is_some(), "{path}");
        }
        for path in [
            "src/lib.rs",
            "docs/so.txt",
            ".so",
            "README.md",
            "fuzz/corpus/dlpack/0a7fa7ed",
            "python/requirements.txt",
            "crates/x/python/pkg/py.typed",
        ] {
            assert_eq!(artifact_reason(path, b"text"), None, "{path}");
        }
    }

    #[test]
    fn executable_content_is_flagged_whatever_the_name() {
        assert!(artifact_reason("fixture.bin", b"\x7fELF\x02\x01\x01\0").is_some());
        assert!(artifact_reason("data", &[0xcf, 0xfa, 0xed, 0xfe, 7, 0, 0, 1]).is_some());
        assert!(artifact_reason("tool", b"MZ\x90\0").is_some());
        assert!(artifact_reason("x", b"!<arch>\nx").is_some());
        assert_eq!(artifact_reason("x", b"\x7fEL"), None);
    }

    /// A planted ELF in a scratch repository is found by the step, by content, under a name
    /// that says nothing; a clean repository passes.
    #[test]
    fn the_step_flags_a_planted_elf() {
        let dir = std::env::temp_dir().join(format!("tb-artifacts-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("src")).unwrap();
        let git = |args: &[&str]| {
            let status = Command::new("git")
                .arg("-C")
                .arg(&dir)
                .args(args)
                .status()
                .expect("git runs");
            assert!(status.success(), "git {args:?}");
        };
        git(&["init", "-q"]);
        std::fs::write(dir.join("src/lib.rs"), "fn main() {}\n").unwrap();
        git(&["add", "src/lib.rs"]);
        check(&dir).expect("sources only");
        // The start of an x86-64 ELF shared object's header, then padding.
        let mut elf = b"\x7fELF\x02\x01\x01\0".to_vec();
        elf.resize(64, 0);
        std::fs::write(dir.join("src/data"), &elf).unwrap();
        git(&["add", "src/data"]);
        let err = check(&dir).expect_err("a tracked ELF fails the step");
        let message = format!("{err:#}");
        assert!(
            message.contains("src/data") && message.contains("ELF"),
            "{message}"
        );
        assert!(!message.contains("lib.rs"), "{message}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The repository itself holds sources only (what CI checks from a fresh clone).
    #[test]
    fn this_repository_holds_sources_only() {
        check(crate::root()).unwrap();
    }
}
