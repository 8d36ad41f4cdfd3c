//! `cargo xtask ci [--no-miri]`: everything CI checks, in the order CI checks it.

use std::env;
use std::process::Command;

use anyhow::{Context as _, Result, bail};

use crate::venv::{self, with_libtorch};
use crate::{Steps, cargo, run_status};

/// Packages whose tests also run under Miri (`cargo +nightly miri test -p <pkg>`): unit
/// tests, integration tests and doctests. Add a crate once its tests need no FFI (Miri cannot
/// call CUDA, Python or libtorch); gate single tests that cannot run with `#[cfg(not(miri))]`.
pub(crate) const MIRI_PACKAGES: &[&str] =
    &["tensorbridge", "tensorbridge-dlpack", "tensorbridge-cai"];

/// Packages left out of the `--all-features` clippy run because one of their features needs
/// CUDA, Python or libtorch at build time (say which beside each entry). None do: cudarc
/// loads libcuda at run time and builds anywhere, and libtorch (tensorbridge-tch, the
/// benches' `tch` feature) comes from the managed venv, which every cargo command here gets
/// through `LIBTORCH` (see [`ci`]).
const ALL_FEATURES_EXCLUDED: &[&str] = &[];

/// Proptest cases per property under Miri, which runs ~1000x slower than native code.
const MIRI_PROPTEST_CASES: u32 = 8;

pub(crate) fn run(args: &[String]) -> Result<()> {
    let mut miri = true;
    for arg in args {
        match arg.as_str() {
            "--no-miri" => miri = false,
            other => bail!("unknown option `{other}` for `ci` (expected --no-miri)"),
        }
    }
    let mut steps = Steps::new("ci");
    let result = ci(&mut steps, miri);
    steps.finish(result)
}

fn ci(steps: &mut Steps, miri: bool) -> Result<()> {
    steps.cmd("fmt", cargo().args(["fmt", "--all", "--check"]))?;
    // tensorbridge-tch links libtorch: torch-sys finds it through `LIBTORCH`, the torch
    // package of the managed venv (created here on a fresh machine).
    let venv = venv::ensure(steps)?;
    let libtorch = venv.torch_dir()?;
    // Every workspace-wide command below gets `LIBTORCH`, rather than excluding the crate
    // from them and checking it in steps of its own: `--workspace` includes non-default
    // members, and `--all-features` turns on the benches' `tch` feature, which links
    // libtorch too, so exclusions would have to cover the benches as well and would take
    // their tch bench out of clippy. One environment for all commands also builds torch-sys
    // once: its build script reruns whenever `LIBTORCH` changes (BUILD.md gotcha 1).
    let torch_cargo = || with_libtorch(cargo(), &libtorch);
    steps.cmd(
        "clippy",
        torch_cargo().args([
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ]),
    )?;
    let mut clippy_all = torch_cargo();
    clippy_all.args(["clippy", "--workspace", "--all-targets", "--all-features"]);
    for package in ALL_FEATURES_EXCLUDED {
        clippy_all.args(["--exclude", package]);
    }
    clippy_all.args(["--", "-D", "warnings"]);
    steps.cmd("clippy --all-features", &mut clippy_all)?;
    // Includes the doctests (tensorbridge-tch's load libtorch through its build script's
    // rpath, as its other test binaries do).
    steps.cmd("test", torch_cargo().args(["test", "--workspace"]))?;
    steps.cmd(
        "doc",
        torch_cargo()
            .args(["doc", "--workspace", "--no-deps"])
            .env("RUSTDOCFLAGS", "-D warnings"),
    )?;
    if !miri {
        steps.skip("miri", "--no-miri");
        return Ok(());
    }
    miri_setup(steps)?;
    let flags = miri_flags();
    for package in MIRI_PACKAGES {
        steps.cmd(
            &format!("miri test -p {package}"),
            cargo()
                .args(["+nightly", "miri", "test", "-p", package])
                .env("MIRIFLAGS", &flags),
        )?;
    }
    Ok(())
}

/// Installs what Miri needs; any refusal fails the task (never a silent skip).
fn miri_setup(steps: &mut Steps) -> Result<()> {
    steps.run("miri: nightly toolchain", || {
        let out = Command::new("rustup")
            .args(["toolchain", "list"])
            .output()
            .context("could not run `rustup toolchain list`: Miri needs rustup")?;
        if !out.status.success() {
            bail!("`rustup toolchain list` exited with {}", out.status);
        }
        let list = String::from_utf8_lossy(&out.stdout);
        if list.lines().any(|l| l.starts_with("nightly-")) {
            println!("nightly toolchain present");
            Ok(())
        } else {
            run_status(Command::new("rustup").args([
                "toolchain",
                "install",
                "nightly",
                "--profile",
                "minimal",
            ]))
        }
    })?;
    steps.cmd(
        "miri: components",
        Command::new("rustup").args(["+nightly", "component", "add", "miri", "rust-src"]),
    )?;
    steps.cmd("miri: setup", cargo().args(["+nightly", "miri", "setup"]))
}

/// `MIRIFLAGS`: the caller's, plus what keeps proptest fast and off the file system.
///
/// Miri isolates the program from the host, environment included, so proptest's settings
/// are set inside the interpreter (`-Zmiri-env-set`) rather than forwarded. Without failure
/// persistence proptest never opens its regressions file, so isolation can stay on.
fn miri_flags() -> String {
    let mut flags = env::var("MIRIFLAGS").unwrap_or_default();
    for setting in [
        format!("PROPTEST_CASES={MIRI_PROPTEST_CASES}"),
        "PROPTEST_DISABLE_FAILURE_PERSISTENCE=1".to_owned(),
    ] {
        if !flags.is_empty() {
            flags.push(' ');
        }
        flags.push_str("-Zmiri-env-set=");
        flags.push_str(&setting);
    }
    flags
}
