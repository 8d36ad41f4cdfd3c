//! `cargo xtask ci [--no-miri]`: everything CI checks, in the order CI checks it.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, Result, bail};

use crate::venv::{self, Venv, with_libtorch};
use crate::{Steps, cargo, root, run_status};

/// Packages whose tests also run under Miri (`cargo +nightly miri test -p <pkg>`): unit
/// tests, integration tests and doctests. Add a crate once its tests need no FFI (Miri cannot
/// call CUDA, Python or libtorch); gate single tests that cannot run with `#[cfg(not(miri))]`.
pub(crate) const MIRI_PACKAGES: &[&str] = &[
    "tensorbridge-core",
    "tensorbridge-dlpack",
    "tensorbridge-cai",
    "tensorbridge-ndarray",
];

/// Packages left out of the `--all-features` clippy run because one of their features needs
/// CUDA, Python or libtorch at build time (say which beside each entry). cudarc loads libcuda
/// at run time and builds anywhere, and libtorch (tensorbridge-tch, the benches' `tch`
/// feature) comes from the managed venv, which every cargo command here gets through
/// `LIBTORCH` (see [`ci`]).
const ALL_FEATURES_EXCLUDED: &[&str] = &[
    // `cuda` / `gpu-tests`: candle-core's `cuda` compiles candle's kernels with nvcc and
    // builds cudarc with `dynamic-linking`, which cudarc refuses next to the workspace's
    // `dynamic-loading` (the CUDA layer's). Checked on its own, with the CUDA toolkit from
    // PyPI, in a target directory of its own (`candle_cuda_check`, with `--candle-cuda`).
    "tensorbridge-candle",
    // `candle-cuda`: the candle recipes, which need candle's CUDA half (as above) together
    // with the Python layer's CUDA crates, a build cudarc refuses until the CUDA layer builds
    // under its `dynamic-linking` (docs/BUILDING.md, "candle").
    "tensorbridge-example",
];

/// Packages that need libpython to link their test binaries: left out of the plain
/// `cargo test` step and tested in the Python step, inside the managed environment.
/// `tensorbridge-python` (the extension module) has no Rust tests at all (`test = false`):
/// its tests are the pytest suite, run against the built wheel.
const PYTHON_PACKAGES: &[&str] = &[
    "tensorbridge-pyo3",
    "tensorbridge-python",
    "tensorbridge-example",
];

/// Where the Python package lives, relative to the workspace root.
pub(crate) const PYTHON_CRATE: &str = "crates/tensorbridge-python";

/// The wheels maturin builds: (crate folder, the start of the wheel's file name). The
/// example extension is the cookbook's Rust recipes, which the Python suite tests.
const WHEELS: &[(&str, &str)] = &[
    (PYTHON_CRATE, "tensorbridge-"),
    ("crates/tensorbridge-example", "tensorbridge_example-"),
];

/// Proptest cases per property under Miri, which runs ~1000x slower than native code.
const MIRI_PROPTEST_CASES: u32 = 8;

pub(crate) fn run(args: &[String]) -> Result<()> {
    let mut miri = true;
    let mut candle_cuda = false;
    for arg in args {
        match arg.as_str() {
            "--no-miri" => miri = false,
            "--candle-cuda" => candle_cuda = true,
            other => {
                bail!("unknown option `{other}` for `ci` (expected --no-miri or --candle-cuda)")
            }
        }
    }
    let mut steps = Steps::new("ci");
    let result = ci(&mut steps, miri, candle_cuda);
    steps.finish(result)
}

fn ci(steps: &mut Steps, miri: bool, candle_cuda: bool) -> Result<()> {
    // First, so that every cargo step below builds pyo3 against the same interpreter
    // (`PYO3_PYTHON`): pyo3's build script reruns, and pyo3 and its dependents rebuild,
    // whenever the interpreter it finds changes.
    let venv = venv::ensure(steps)?;
    let cargo = || venv.cargo();
    steps.cmd("fmt", cargo().args(["fmt", "--all", "--check"]))?;
    // Every member, the Python crates included: checking needs an interpreter for pyo3's
    // build script, not libpython.
    // tensorbridge-tch links libtorch: torch-sys finds it through `LIBTORCH`, the torch
    // package of the managed venv (created above on a fresh machine).
    let libtorch = venv.torch_dir()?;
    // Every workspace-wide command below gets `LIBTORCH`, rather than excluding the crate
    // from them and checking it in steps of its own: `--workspace` includes non-default
    // members, and `--all-features` turns on the benches' `tch` feature, which links
    // libtorch too, so exclusions would have to cover the benches as well and would take
    // their tch bench out of clippy. One environment for all commands also builds torch-sys
    // once: its build script reruns whenever `LIBTORCH` changes (docs/BUILDING.md, "libtorch").
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
    if candle_cuda {
        candle_cuda_check(steps, &venv)?;
    } else {
        // candle-kernels compiles candle's quantized and MoE kernels for sm_90a with nvcc in
        // its build script, also for clippy: far more than the rest of CI on 2 cores
        // (docs/BUILDING.md, "candle"). `test-gpu --bundle` builds it, with its GPU tests.
        steps.skip(
            "clippy tensorbridge-candle --features gpu-tests (candle CUDA)",
            "opt in with --candle-cuda; test-gpu --bundle builds it",
        );
    }
    // Includes the doctests (tensorbridge-tch's load libtorch through its build script's
    // rpath, as its other test binaries do).
    let mut test = torch_cargo();
    test.args(["test", "--workspace"]);
    for package in PYTHON_PACKAGES {
        test.args(["--exclude", package]);
    }
    steps.cmd("test", &mut test)?;
    // tensorbridge-tch accepts a range of tch releases: its oldest and newest, each with the
    // libtorch it expects (`tch_range`).
    crate::tch_range::run(steps, &venv)?;
    steps.cmd(
        "doc",
        torch_cargo()
            .args(["doc", "--workspace", "--no-deps"])
            .env("RUSTDOCFLAGS", "-D warnings"),
    )?;
    python(steps, &venv)?;
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

/// candle's CUDA half (`tensorbridge-candle`'s `cuda` and `gpu-tests` features) through
/// clippy, with the CUDA toolkit from PyPI (`cuda_toolkit`), in `target/candle-cuda`: its
/// cudarc is built for linking, not loading, so sharing the main target directory would
/// rebuild cudarc's dependents whenever the two alternate. Its GPU tests run from the bundle.
fn candle_cuda_check(steps: &mut Steps, venv: &Venv) -> Result<()> {
    let toolkit = crate::cuda_toolkit::ensure(steps, &venv.python())?;
    let mut clippy = venv.cargo();
    clippy
        .args([
            "clippy",
            "-p",
            "tensorbridge-candle",
            "--all-targets",
            "--features",
            "gpu-tests",
            "--",
            "-D",
            "warnings",
        ])
        .env(
            "CARGO_TARGET_DIR",
            root().join("target").join("candle-cuda"),
        );
    toolkit.apply(&mut clippy);
    steps.cmd(
        "clippy tensorbridge-candle --features gpu-tests (candle CUDA)",
        &mut clippy,
    )
}

/// The Python package: the wheel built and installed into the environment, the pyo3 crate's
/// Rust tests against the environment's libpython, and the pytest suite against the wheel.
fn python(steps: &mut Steps, venv: &Venv) -> Result<()> {
    build_and_install_wheels(steps, venv)?;
    match venv.libpython_dir()? {
        Some(libdir) => steps.cmd(
            "python: cargo test -p tensorbridge-pyo3",
            venv.cargo()
                .args(["test", "-p", "tensorbridge-pyo3"])
                .env("LD_LIBRARY_PATH", prepend_path(&libdir)),
        )?,
        None => steps.skip(
            "python: cargo test -p tensorbridge-pyo3",
            "the environment's interpreter has no shared libpython to embed; the pytest suite covers the crate",
        ),
    }
    let tests = root().join(PYTHON_CRATE).join("tests");
    steps.cmd(
        "python: pytest",
        venv.python_cmd()
            .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
            .arg(&tests)
            // The GPU suite runs on a GPU machine (`cargo xtask test-gpu`).
            .arg("--ignore")
            .arg(tests.join("gpu"))
            .current_dir(root()),
    )
}

/// Builds the wheels ([`build_wheels`]) and installs them into the environment.
pub(crate) fn build_and_install_wheels(steps: &mut Steps, venv: &Venv) -> Result<()> {
    let wheels = build_wheels(steps, venv)?;
    install_wheels(steps, venv, &wheels)
}

/// Installs built wheels into the environment, replacing what is there.
pub(crate) fn install_wheels(steps: &mut Steps, venv: &Venv, wheels: &[PathBuf]) -> Result<()> {
    steps.cmd(
        "python: install the wheels",
        venv.python_cmd()
            .args([
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "--force-reinstall",
                "--no-deps",
            ])
            .args(wheels),
    )
}

/// `maturin build --release` of each of [`WHEELS`] into `target/wheels` (older wheels of
/// the same package removed first, so exactly one of each is there); returns their paths.
/// These are the `abi3-py39` wheels: one for every CPython from 3.9, what `ci` tests.
pub(crate) fn build_wheels(steps: &mut Steps, venv: &Venv) -> Result<Vec<PathBuf>> {
    build_wheels_into(steps, venv, &root().join("target").join("wheels"), None)
}

/// The same wheels for CPython 3.12 and later (`cp312-abi3`, feature `abi3-py312`): the
/// limited API has vectorcall and METH_FASTCALL only from 3.12, so these call Python and
/// are called faster (docs/BENCHMARKS.md). pip prefers them over the 3.9 ones where both
/// fit. Built without asking an interpreter (`PYO3_NO_PYTHON`: the build machine's may be
/// older than 3.12), in their own target directory, so switching between the two builds
/// recompiles nothing.
pub(crate) fn build_wheels_py312(steps: &mut Steps, venv: &Venv) -> Result<Vec<PathBuf>> {
    build_wheels_into(
        steps,
        venv,
        &root().join("target").join("wheels-py312"),
        Some("abi3-py312"),
    )
}

fn build_wheels_into(
    steps: &mut Steps,
    venv: &Venv,
    out: &Path,
    abi: Option<&str>,
) -> Result<Vec<PathBuf>> {
    let mut built = Vec::new();
    for (folder, prefix) in WHEELS {
        for old in wheels_in(out, prefix)? {
            fs::remove_file(&old).with_context(|| format!("removing {}", old.display()))?;
        }
        let mut maturin = venv.python_cmd();
        maturin
            .args(["-m", "maturin", "build", "--release", "--manifest-path"])
            .arg(root().join(folder).join("Cargo.toml"))
            .arg("--out")
            .arg(out);
        if let Some(feature) = abi {
            maturin
                .args(["--no-default-features", "--features", feature])
                .env("PYO3_NO_PYTHON", "1")
                .env("CARGO_TARGET_DIR", root().join("target").join(feature));
        }
        steps.cmd(
            &format!("python: maturin build {folder} {}", abi.unwrap_or("")),
            &mut maturin,
        )?;
        match wheels_in(out, prefix)?.as_slice() {
            [one] => built.push(one.clone()),
            found => bail!(
                "expected one {prefix}*.whl in {} after maturin, found {found:?}",
                out.display()
            ),
        }
    }
    Ok(built)
}

/// The wheels in `dir` whose file name starts with `prefix` (none when `dir` does not exist).
fn wheels_in(dir: &Path, prefix: &str) -> Result<Vec<PathBuf>> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Ok(Vec::new());
    };
    let mut found = Vec::new();
    for entry in entries {
        let path = entry?.path();
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        if name.starts_with(prefix) && name.ends_with(".whl") {
            found.push(path);
        }
    }
    Ok(found)
}

/// `dir` first, then the caller's `LD_LIBRARY_PATH`.
fn prepend_path(dir: &Path) -> std::ffi::OsString {
    let mut path = dir.as_os_str().to_owned();
    if let Some(old) = env::var_os("LD_LIBRARY_PATH").filter(|p| !p.is_empty()) {
        path.push(":");
        path.push(old);
    }
    path
}

/// Installs what Miri needs; any refusal fails the task (never a silent skip).
fn miri_setup(steps: &mut Steps) -> Result<()> {
    nightly_toolchain(steps)?;
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

/// The nightly toolchain (Miri and cargo-fuzz need it), installed when missing.
pub(crate) fn nightly_toolchain(steps: &mut Steps) -> Result<()> {
    steps.run("nightly toolchain", || {
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
    })
}
