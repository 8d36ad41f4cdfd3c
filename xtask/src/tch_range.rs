//! The tch versions tensorbridge-tch accepts, tested: the oldest and the newest of the range
//! its manifest declares (`tch = ">=0.24, <0.27"`), each against the libtorch it expects.
//!
//! tch's `torch-sys` declares `links = "tch"`, so one build holds one tch version, and each
//! torch-sys release checks for one PyTorch release. For each end of the range this step:
//! 1. takes the managed environment when it has that PyTorch, else the managed environment
//!    whose requirements file pins it (`python/requirements-tch-newest.txt`), built in the
//!    environment cache like the others ([`crate::venv`]: a missing or half-made one is
//!    rebuilt, never assumed, and a CI run reuses it); the end `Cargo.lock`
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

use crate::venv::{self, Spec, Venv};
use crate::{Steps, cargo, root};

/// (tch release, the PyTorch release its torch-sys expects), oldest first. The ends of the
/// range in `crates/tensorbridge-tch/Cargo.toml`'s `tch` requirement.
pub(crate) const ENDS: &[(&str, &str)] = &[("0.24.0", "2.11.0"), ("0.26.0", "2.13.0")];

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
        let (_env, libtorch) = torch_for(steps, managed, torch)?;
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

/// The environments that hold a torch for an end of the range other than the managed one's:
/// managed environments like the others ([`crate::venv`]), cached outside the checkout and
/// built only when missing (torch's CUDA wheels are about 7 GB unpacked).
const TORCH_ENVS: &[&Spec] = &[&venv::TCH_NEWEST];

/// The environment with PyTorch `version` and its torch directory (`LIBTORCH`): the managed
/// one when it has that version, else the one of [`TORCH_ENVS`] whose requirements pin it.
/// The environment is returned so that it stays held (in use) while the tests run.
fn torch_for(steps: &mut Steps, managed: &Venv, version: &str) -> Result<(Venv, PathBuf)> {
    if torch_version(&managed.python())?.as_deref() == Some(version) {
        return Ok((managed.clone(), managed.torch_dir()?));
    }
    let Some(spec) = spec_pinning(version)? else {
        bail!(
            "no environment pins torch=={version}: add it to a requirements file of \
             `TORCH_ENVS` in xtask/src/tch_range.rs"
        );
    };
    let env = venv::ensure_spec(steps, spec)?;
    let found = torch_version(&env.python())?;
    if found.as_deref() != Some(version) {
        bail!(
            "{} holds torch {found:?}, not {version}",
            env.dir().display()
        );
    }
    let torch = env.torch_dir()?;
    Ok((env, torch))
}

/// The environment of [`TORCH_ENVS`] whose requirements file pins `torch=={version}`.
fn spec_pinning(version: &str) -> Result<Option<&'static Spec>> {
    let pin = format!("torch=={version}");
    for &spec in TORCH_ENVS {
        let path = root().join(spec.requirements);
        let text =
            fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        if text.lines().any(|l| l.trim() == pin) {
            return Ok(Some(spec));
        }
    }
    Ok(None)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Each end of the range finds its torch: the pinned environment's, or a requirements
    /// file of [`TORCH_ENVS`] that pins exactly the version torch-sys expects.
    #[test]
    fn every_end_has_an_environment() {
        let pinned = fs::read_to_string(root().join(venv::PINNED.requirements)).unwrap();
        for &(tch, torch) in ENDS {
            let in_pinned = pinned
                .lines()
                .any(|l| l.trim() == format!("torch=={torch}"));
            assert!(
                in_pinned || spec_pinning(torch).unwrap().is_some(),
                "tch {tch}: no environment pins torch=={torch}"
            );
        }
        assert!(spec_pinning("0.0.0").unwrap().is_none());
    }
}
