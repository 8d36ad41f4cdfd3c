//! The tch versions tensorbridge-tch accepts, tested: the oldest and the newest of the range
//! its manifest declares (`tch = ">=0.24, <0.27"`), each against the libtorch it expects.
//!
//! tch's `torch-sys` declares `links = "tch"`, so one build holds one tch version, and each
//! torch-sys release checks for one PyTorch release. For each end of the range this step:
//! 1. makes (or reuses) a Python environment with that PyTorch, from PyPI:
//!    `target/tch-range/torch-<version>/`, with a stamp written only after a successful
//!    install, so a missing or half-made cache is rebuilt, never assumed; the managed
//!    environment is used instead when it already has that torch; the end `Cargo.lock`
//!    already holds, with the managed environment's torch (the oldest, today), is the one
//!    `ci`'s `test` step has just tested, and is not run twice;
//! 2. pins tch and torch-sys to that release in `Cargo.lock` (`cargo update --precise`),
//!    and puts the lock file back afterwards, whatever happened;
//! 3. runs `cargo test -p tensorbridge-tch` (the C++ shim compiled against that libtorch's
//!    headers, the unit and integration tests, the doctests) with `LIBTORCH` pointing at it,
//!    in a target directory of its own (`target/tch-range/target-<tch>`), so the workspace's
//!    torch-sys build is not thrown away by a `LIBTORCH` change.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, Result, bail};

use crate::venv::Venv;
use crate::{Steps, cargo, root};

/// (tch release, the PyTorch release its torch-sys expects), oldest first. The ends of the
/// range in `crates/tensorbridge-tch/Cargo.toml`'s `tch` requirement.
pub(crate) const ENDS: &[(&str, &str)] = &[("0.24.0", "2.11.0"), ("0.26.0", "2.13.0")];

/// Written into a dedicated environment after its torch installed: the torch version.
const STAMP: &str = ".tensorbridge-torch";

/// Builds and tests tensorbridge-tch against every end of the range.
pub(crate) fn run(steps: &mut Steps, managed: &Venv) -> Result<()> {
    let locked = locked_tch()?;
    for &(tch, torch) in ENDS {
        if locked == tch && torch_version(&managed.python())?.as_deref() == Some(torch) {
            // `ci`'s `test` step has just tested this end: the locked tch with the managed
            // environment's torch.
            steps.skip(
                &format!("tch {tch}: cargo test -p tensorbridge-tch (torch {torch})"),
                "the locked tch with the managed torch: tested by the `test` step",
            );
            continue;
        }
        let libtorch = torch_for(steps, managed, torch)?;
        let target = root()
            .join("target")
            .join("tch-range")
            .join(format!("target-{tch}"));
        let lock = LockRestore::save()?;
        steps.cmd(
            &format!("tch {tch}: pin in Cargo.lock"),
            // torch-sys follows: each tch release requires its own.
            cargo().args(["update", "-p", "tch", "--precise", tch]),
        )?;
        let tested = steps.cmd(
            &format!("tch {tch}: cargo test -p tensorbridge-tch (torch {torch})"),
            managed
                .cargo()
                .args(["test", "-p", "tensorbridge-tch"])
                .env("LIBTORCH", &libtorch)
                .env("CARGO_TARGET_DIR", &target),
        );
        lock.restore()?;
        tested?;
    }
    Ok(())
}

/// The tch version `Cargo.lock` holds.
fn locked_tch() -> Result<String> {
    let lock = fs::read_to_string(root().join("Cargo.lock")).context("reading Cargo.lock")?;
    let mut lines = lock.lines();
    while let Some(line) = lines.next() {
        if line == "name = \"tch\""
            && let Some(v) = lines.next().and_then(|l| l.strip_prefix("version = \""))
        {
            return Ok(v.trim_end_matches('"').to_owned());
        }
    }
    bail!("no tch in Cargo.lock")
}

/// The torch directory (`LIBTORCH`) of an environment with PyTorch `version`: the managed
/// one when it has that version, else a dedicated one under `target/tch-range`.
fn torch_for(steps: &mut Steps, managed: &Venv, version: &str) -> Result<PathBuf> {
    if torch_version(&managed.python())?.as_deref() == Some(version) {
        return managed.torch_dir();
    }
    let dir = root()
        .join("target")
        .join("tch-range")
        .join(format!("torch-{version}"));
    let python = dir.join("bin").join("python");
    let stamp = dir.join(STAMP);
    let ready = fs::read_to_string(&stamp).ok().as_deref() == Some(version)
        && torch_version(&python)?.as_deref() == Some(version);
    if !ready {
        if dir.exists() {
            fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
        }
        steps.cmd(
            &format!("tch range: environment for torch {version}"),
            Command::new(managed.python())
                .args(["-m", "venv"])
                .arg(&dir),
        )?;
        steps.cmd(
            &format!("tch range: pip install torch=={version}"),
            Command::new(&python).args([
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                &format!("torch=={version}"),
            ]),
        )?;
        fs::write(&stamp, version).with_context(|| format!("writing {}", stamp.display()))?;
    }
    let torch = site_packages(&python)?.join("torch");
    if !torch.join("lib").is_dir() {
        bail!(
            "{} has no lib directory after installing torch {version}",
            torch.display()
        );
    }
    Ok(torch)
}

/// The torch version an interpreter imports (without the local `+cu130` part), or `None`
/// when the interpreter or torch is missing.
fn torch_version(python: &Path) -> Result<Option<String>> {
    if !python.exists() {
        return Ok(None);
    }
    let out = Command::new(python)
        .args([
            "-c",
            "import importlib.metadata as m; print(m.version('torch').split('+')[0])",
        ])
        .output()
        .with_context(|| format!("running {}", python.display()))?;
    Ok(out
        .status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned()))
}

fn site_packages(python: &Path) -> Result<PathBuf> {
    let out = Command::new(python)
        .args([
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        ])
        .output()
        .with_context(|| format!("running {}", python.display()))?;
    if !out.status.success() {
        bail!("{} could not report its site-packages", python.display());
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// `Cargo.lock` as it was, written back by [`LockRestore::restore`] or, on an early return
/// or a panic, when dropped.
struct LockRestore {
    path: PathBuf,
    saved: Option<Vec<u8>>,
}

impl LockRestore {
    fn save() -> Result<LockRestore> {
        let path = root().join("Cargo.lock");
        let saved = fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
        Ok(LockRestore {
            path,
            saved: Some(saved),
        })
    }

    fn restore(mut self) -> Result<()> {
        let saved = self.saved.take().expect("restored once");
        fs::write(&self.path, saved).with_context(|| format!("restoring {}", self.path.display()))
    }
}

impl Drop for LockRestore {
    fn drop(&mut self) {
        if let Some(saved) = self.saved.take() {
            let _ = fs::write(&self.path, saved);
        }
    }
}
