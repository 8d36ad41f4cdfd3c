//! `cargo xtask test-threads --python PATH [--allow-gil]`: the thread-stress tests
//! (`test_threads.py`, `test_release_chains.py`), unchanged, on a free-threaded CPython.
//!
//! The module declares `gil_used = false` (ARCHITECTURE.md, "Free-threaded Python"). A
//! free-threaded interpreter cannot load abi3 wheels, so this builds the package for `PATH`
//! itself (`--no-default-features`: no abi3 feature, a `cp3XXt` wheel), makes an environment
//! from `PATH` with `python/requirements-free-threaded.txt` (cached like the others), checks
//! that importing tensorbridge leaves the GIL off (CPython turns it back on, with a warning,
//! when a module does not declare itself GIL-free), and runs the two files there.
//! pyo3 0.30 builds free-threaded extensions for 3.14t only. `--allow-gil` takes an ordinary
//! interpreter too, to check the task itself: such a run says nothing about free threading.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};

use crate::ci::{PYTHON_CRATE, pytest_cmd};
use crate::venv::{self, FREE_THREADED, ask_python};
use crate::{Steps, absolute, root};

pub(crate) fn run(args: &[String]) -> Result<()> {
    let mut python = None;
    let mut allow_gil = false;
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--python" => {
                let path = args
                    .next()
                    .context("`--python` needs an interpreter's path")?;
                python = Some(absolute(Path::new(path))?);
            }
            "--allow-gil" => allow_gil = true,
            other => bail!(
                "unknown option `{other}` for `test-threads` (expected --python PATH, --allow-gil)"
            ),
        }
    }
    let python = python.context("`test-threads` needs --python PATH (a free-threaded CPython)")?;
    let mut steps = Steps::new("test-threads");
    let result = test_threads(&mut steps, &python, allow_gil);
    steps.finish(result)
}

fn test_threads(steps: &mut Steps, python: &Path, allow_gil: bool) -> Result<()> {
    let free_threaded = steps.run("interpreter", || {
        let out = ask_python(
            python,
            "import sys, sysconfig; print(sys.version.split()[0]); \
             print(sysconfig.get_config_var('Py_GIL_DISABLED') or 0)",
        )?;
        let mut lines = out.lines();
        let version = lines.next().unwrap_or_default().to_owned();
        let free = lines.next() == Some("1");
        println!(
            "{}: CPython {version}, {}",
            python.display(),
            if free {
                "free-threaded"
            } else {
                "with the GIL"
            }
        );
        if !free && !allow_gil {
            bail!(
                "{} is not a free-threaded build (sysconfig Py_GIL_DISABLED is not 1); pass \
                 --allow-gil to run the task on it anyway",
                python.display()
            );
        }
        Ok(free)
    })?;
    // maturin, from the pinned environment.
    let pinned = venv::ensure(steps)?;
    let out = root().join("target").join("wheels-threads");
    venv::remove_dir(&out)?;
    steps.cmd(
        "maturin build (for this interpreter, not abi3)",
        pinned
            .python_cmd()
            .args([
                "-m",
                "maturin",
                "build",
                "--release",
                "--no-default-features",
            ])
            .arg("--interpreter")
            .arg(python)
            .arg("--manifest-path")
            .arg(root().join(PYTHON_CRATE).join("Cargo.toml"))
            .arg("--out")
            .arg(&out)
            .env(
                "CARGO_TARGET_DIR",
                root().join("target").join("wheel-threads"),
            ),
    )?;
    let env = venv::ensure_with(steps, &FREE_THREADED, python)?;
    let site = root()
        .join("target")
        .join("python")
        .join(FREE_THREADED.name);
    venv::remove_dir(&site)?;
    steps.cmd(
        "install the wheel",
        env.pip_install()
            .args(["--no-index", "--no-deps", "--find-links"])
            .arg(&out)
            .arg("--target")
            .arg(&site)
            .arg("tensorbridge"),
    )?;
    if free_threaded {
        steps.cmd(
            "the GIL stays off after `import tensorbridge`",
            env.python_cmd()
                .args([
                    "-W",
                    "error",
                    "-c",
                    "import sys, tensorbridge; assert not sys._is_gil_enabled(), \
                     'importing tensorbridge turned the GIL on'; print('GIL off')",
                ])
                .env("PYTHONPATH", &site),
        )?;
    } else {
        steps.skip(
            "the GIL stays off after `import tensorbridge`",
            "the interpreter has a GIL (--allow-gil)",
        );
    }
    let tests = root().join(PYTHON_CRATE).join("tests");
    let files: Vec<PathBuf> = ["test_threads.py", "test_release_chains.py"]
        .iter()
        .map(|f| tests.join(f))
        .collect();
    let paths: Vec<&Path> = files.iter().map(PathBuf::as_path).collect();
    steps.cmd(
        "pytest test_threads.py test_release_chains.py",
        &mut pytest_cmd(&env, &site, &tests, &paths),
    )
}
