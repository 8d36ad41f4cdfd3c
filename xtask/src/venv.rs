//! The managed Python environment: `.venv` at the workspace root, with the pins of
//! `python/requirements.txt` (torch for the tch adapter, NumPy, JAX, TensorFlow, maturin and
//! pytest for the Python package).
//!
//! Tasks that need libtorch or Python call [`ensure`] first, so the README's two commands
//! work on a fresh machine with nothing but Rust and CPython. `TENSORBRIDGE_VENV` points the
//! tasks at another environment (for several work trees sharing one install); it is created
//! there the same way when missing.

use std::env;
use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, Result, bail};

use crate::{Steps, root};

/// The requirements file, relative to the workspace root.
const REQUIREMENTS: &str = "python/requirements.txt";

/// Written into the environment after a successful install: the requirements it satisfies.
/// Equal to the current file means the install step can be skipped.
const STAMP: &str = ".tensorbridge-requirements";

/// A ready Python environment.
#[derive(Clone, Debug)]
pub(crate) struct Venv {
    dir: PathBuf,
}

// Some accessors are used only by the tasks that land with the tch and Python crates.
#[allow(dead_code)]
impl Venv {
    /// The environment's directory.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Its `python`.
    pub(crate) fn python(&self) -> PathBuf {
        self.dir.join("bin").join("python")
    }

    /// A `python` command inside the environment (see [`Venv::activate`]).
    pub(crate) fn python_cmd(&self) -> Command {
        let mut cmd = Command::new(self.python());
        self.activate(&mut cmd);
        cmd
    }

    /// What `source bin/activate` would do for `cmd`: `VIRTUAL_ENV`, and `bin` first on
    /// `PATH` (torch-sys and maturin look for `python` there).
    pub(crate) fn activate(&self, cmd: &mut Command) {
        let mut path = OsString::from(self.dir.join("bin"));
        if let Some(old) = env::var_os("PATH") {
            path.push(":");
            path.push(old);
        }
        cmd.env("VIRTUAL_ENV", &self.dir).env("PATH", path);
    }

    /// The environment's `site-packages` (asked of its Python, not guessed).
    pub(crate) fn site_packages(&self) -> Result<PathBuf> {
        let out = self
            .python_cmd()
            .args([
                "-c",
                "import sysconfig; print(sysconfig.get_paths()['purelib'])",
            ])
            .output()
            .context("running the environment's python")?;
        if !out.status.success() {
            bail!(
                "the environment's python could not report site-packages: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
    }

    /// `cargo`, run in the workspace root, with pyo3 pointed at this environment's Python
    /// (`PYO3_PYTHON`), so every build agrees on the interpreter and nothing rebuilds.
    pub(crate) fn cargo(&self) -> Command {
        let mut cmd = crate::cargo();
        cmd.env("PYO3_PYTHON", self.python());
        cmd
    }

    /// The directory of the shared libpython that the environment's interpreter runs on,
    /// which an embedding test binary needs at run time; `None` when the interpreter is
    /// statically linked (or the library is missing), so nothing can be embedded.
    pub(crate) fn libpython_dir(&self) -> Result<Option<PathBuf>> {
        let out = self
            .python_cmd()
            .args([
                "-c",
                "import os, sysconfig as s; d = s.get_config_var('LIBDIR') or ''; \
                 f = s.get_config_var('LDLIBRARY') or ''; \
                 print(d if s.get_config_var('Py_ENABLE_SHARED') and \
                 os.path.isfile(os.path.join(d, f)) else '')",
            ])
            .output()
            .context("running the environment's python")?;
        if !out.status.success() {
            bail!(
                "the environment's python could not report its libpython: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let dir = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        Ok((!dir.is_empty()).then(|| PathBuf::from(dir)))
    }

    /// The installed torch package (`<site-packages>/torch`): what torch-sys takes as
    /// `LIBTORCH`, with the shared libraries in its `lib`.
    pub(crate) fn torch_dir(&self) -> Result<PathBuf> {
        let dir = self.site_packages()?.join("torch");
        if !dir.join("lib").is_dir() {
            bail!(
                "{} has no lib directory: is torch installed in {}?",
                dir.display(),
                self.dir.display()
            );
        }
        Ok(dir)
    }
}

/// The environment's location: `$TENSORBRIDGE_VENV`, or `.venv` in the workspace root.
fn location() -> PathBuf {
    match env::var_os("TENSORBRIDGE_VENV") {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => root().join(".venv"),
    }
}

/// Creates the environment when missing and installs the pinned requirements when they
/// changed since the last install (a stamp file remembers them), as steps of `steps`.
pub(crate) fn ensure(steps: &mut Steps) -> Result<Venv> {
    let venv = Venv { dir: location() };
    let requirements_path = root().join(REQUIREMENTS);
    let requirements = fs::read_to_string(&requirements_path)
        .with_context(|| format!("reading {}", requirements_path.display()))?;
    if !venv.python().exists() {
        steps.cmd(
            "venv: create",
            Command::new(python3())
                .arg("-m")
                .arg("venv")
                .arg(venv.dir()),
        )?;
    }
    let stamp = venv.dir().join(STAMP);
    if fs::read_to_string(&stamp).ok().as_deref() == Some(requirements.as_str()) {
        println!(
            "==> venv: {} already has {REQUIREMENTS}",
            venv.dir().display()
        );
        return Ok(venv);
    }
    steps.cmd(
        "venv: install",
        venv.python_cmd()
            .args(["-m", "pip", "install", "--disable-pip-version-check", "-r"])
            .arg(&requirements_path),
    )?;
    fs::write(&stamp, &requirements).with_context(|| format!("writing {}", stamp.display()))?;
    Ok(venv)
}

/// `cmd` (a cargo command) with `LIBTORCH` set to `libtorch`, a torch installation
/// ([`Venv::torch_dir`]): how torch-sys, and so tensorbridge-tch, find libtorch (docs/BUILDING.md,
/// "libtorch"). Give every cargo command of a task the same value: torch-sys rebuilds when it
/// changes.
pub(crate) fn with_libtorch(mut cmd: Command, libtorch: &Path) -> Command {
    cmd.env("LIBTORCH", libtorch);
    cmd
}

/// The interpreter that creates the environment: `$PYTHON`, or `python3`.
fn python3() -> OsString {
    env::var_os("PYTHON").unwrap_or_else(|| "python3".into())
}
