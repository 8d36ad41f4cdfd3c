//! The managed Python environments, one per file `python/requirements*.txt` ([`ENVS`]): the
//! pinned one (the torch whose libtorch the tch adapter links, and what every cargo step and
//! the wheels are built with), the newest releases, the oldest supported ones, and CPython
//! 3.9 for the abi3-py39 wheel's promise. docs/BUILDING.md ("Python environments") says
//! which versions each holds and why.
//!
//! Each environment is built from its requirements file by the interpreter its [`Spec`]
//! names, and cached outside the checkout, so CI and every later run (any clone, any work
//! tree) reuse it: `<cache>/venvs/<name>-<python>-<hash>`, where the hash covers the
//! requirements file and the interpreter (its version and path), so a changed pin or a
//! different interpreter is a different environment, built afresh, and nothing stale is ever
//! assumed. The cache is `$TENSORBRIDGE_CACHE`, else `$XDG_CACHE_HOME/tensorbridge`, else
//! `~/.cache/tensorbridge`. An environment counts as built only once its stamp is written,
//! after pip succeeded; a half-built one (an interrupted install) is removed and rebuilt.
//! Several processes may ask for one environment at once: the first builds it under an
//! exclusive lock, the others wait and then share it (a shared lock held while in use, so a
//! prune never removes an environment someone is using). The environments hold the
//! requirements only: the wheels under test go into each checkout's own `target/python/`
//! ([`crate::ci`]), never into the shared environment.
//!
//! `TENSORBRIDGE_VENV` points the pinned environment somewhere else (created there the same
//! way when missing).

use std::env;
use std::ffi::{OsStr, OsString};
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::SystemTime;

use anyhow::{Context as _, Result, bail};

use crate::{Steps, root};

/// One managed environment.
#[derive(Debug)]
pub(crate) struct Spec {
    /// Its short name (steps, cache folders, `target/python/<name>`).
    pub(crate) name: &'static str,
    /// The requirements file, relative to the workspace root.
    pub(crate) requirements: &'static str,
    /// The CPython it runs on, as `major.minor`; `None`: `$PYTHON`, else `python3` (the
    /// machine's own interpreter, whatever its version).
    pub(crate) python: Option<&'static str>,
}

/// What `ci` and the other tasks build with: torch 2.11 for the tch crate's libtorch, the
/// interpreter pyo3 is built against, maturin with zig for the manylinux_2_28 wheels.
pub(crate) const PINNED: Spec = Spec {
    name: "pinned",
    requirements: "python/requirements.txt",
    python: None,
};

/// The newest release of every framework (NumPy 2.5 and JAX 0.12 need CPython 3.12+).
pub(crate) const NEWEST: Spec = Spec {
    name: "newest",
    requirements: "python/requirements-newest.txt",
    python: Some("3.13"),
};

/// The oldest supported releases: torch 2.10, the first with the DLPack C exchange table
/// (and the first to need CPython 3.10), NumPy 1.26.
pub(crate) const FLOOR: Spec = Spec {
    name: "floor",
    requirements: "python/requirements-floor.txt",
    python: Some("3.10"),
};

/// CPython 3.9, the oldest the abi3-py39 wheel promises: no torch (no torch release has
/// both 3.9 wheels and the exchange table), NumPy 2.0, ml_dtypes, JAX 0.4.
pub(crate) const PY39: Spec = Spec {
    name: "py39",
    requirements: "python/requirements-py39.txt",
    python: Some("3.9"),
};

/// Every environment `cargo xtask ci` runs the pytest suite in, the pinned one first.
pub(crate) const ENVS: &[&Spec] = &[&PINNED, &NEWEST, &FLOOR, &PY39];

/// What the thread-stress tests need on a free-threaded interpreter that the caller names
/// (`cargo xtask test-threads --python PATH`): NumPy, pytest, hypothesis.
pub(crate) const FREE_THREADED: Spec = Spec {
    name: "free-threaded",
    requirements: "python/requirements-free-threaded.txt",
    python: None,
};

/// The PyTorch that the newest end of tensorbridge-tch's tch range links (tch 0.26 expects
/// torch 2.13): libtorch only, no pytest suite ([`crate::tch_range`]).
pub(crate) const TCH_NEWEST: Spec = Spec {
    name: "tch-newest",
    requirements: "python/requirements-tch-newest.txt",
    python: None,
};

/// Written into the environment after a successful install: the requirements it satisfies.
/// Its modification time is the environment's last use (what pruning keeps the newest of).
const STAMP: &str = ".tensorbridge-requirements";

/// Environments of one name kept in the cache besides the one in use: the most recently used
/// ones, so that work trees on neighbouring commits do not rebuild each other's.
const KEEP_PER_NAME: usize = 2;

/// A ready Python environment.
#[derive(Clone, Debug)]
pub(crate) struct Venv {
    name: &'static str,
    dir: PathBuf,
    /// A shared lock on the environment for as long as any clone lives: a concurrent
    /// prune leaves it alone. (`None` for `TENSORBRIDGE_VENV`, which is never pruned.)
    _in_use: Option<Arc<File>>,
}

impl Venv {
    /// The environment's short name ([`Spec::name`]).
    pub(crate) fn name(&self) -> &'static str {
        self.name
    }

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

    /// `python -m pip install --disable-pip-version-check` inside the environment: the start
    /// of every pip install xtask runs; the caller adds its options and what to install.
    pub(crate) fn pip_install(&self) -> Command {
        let mut cmd = self.python_cmd();
        cmd.args(["-m", "pip", "install", "--disable-pip-version-check"]);
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

    /// Runs `code` with the environment's Python and returns what it printed, trimmed.
    fn ask(&self, code: &str, what: &str) -> Result<String> {
        ask_python(&self.python(), code).with_context(|| format!("asking {} for {what}", self.name))
    }

    /// The environment's `site-packages` (asked of its Python, not guessed).
    pub(crate) fn site_packages(&self) -> Result<PathBuf> {
        self.ask(
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
            "its site-packages",
        )
        .map(PathBuf::from)
    }

    /// `major.minor` of the environment's interpreter.
    pub(crate) fn python_version(&self) -> Result<(u32, u32)> {
        parse_version(&self.ask(VERSION_CODE, "its version")?)
    }

    /// `cargo`, run in the workspace root, with pyo3 pointed at this environment's Python
    /// (`PYO3_PYTHON`), so every build agrees on the interpreter and nothing rebuilds, and
    /// bindgen at libclang where `ci` installed one.
    pub(crate) fn cargo(&self) -> Command {
        let mut cmd = crate::cargo();
        cmd.env("PYO3_PYTHON", self.python());
        // libclang for nixl-sys's bindgen, once `ci` has found it (`nixl::bindgen_setup`).
        cmd.envs(crate::nixl::bindgen_env().iter().map(|(k, v)| (k, v)));
        cmd
    }

    /// The directory of the shared libpython that the environment's interpreter runs on,
    /// which an embedding test binary needs at run time; `None` when the interpreter is
    /// statically linked (or the library is missing), so nothing can be embedded.
    pub(crate) fn libpython_dir(&self) -> Result<Option<PathBuf>> {
        let dir = self.ask(
            "import os, sysconfig as s; d = s.get_config_var('LIBDIR') or ''; \
             f = s.get_config_var('LDLIBRARY') or ''; \
             print(d if s.get_config_var('Py_ENABLE_SHARED') and \
             os.path.isfile(os.path.join(d, f)) else '')",
            "its libpython",
        )?;
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

const VERSION_CODE: &str = "import sys; print('%d.%d' % sys.version_info[:2])";

/// `"3.13"` -> `(3, 13)`.
pub(crate) fn parse_version(s: &str) -> Result<(u32, u32)> {
    let parse = || -> Option<(u32, u32)> {
        let (major, minor) = s.trim().split_once('.')?;
        Some((major.parse().ok()?, minor.parse().ok()?))
    };
    parse().with_context(|| format!("`{s}` is not a major.minor Python version"))
}

/// Runs `code` with `python` and returns its output, trimmed; fails when it does.
pub(crate) fn ask_python(python: &Path, code: &str) -> Result<String> {
    let out = Command::new(python)
        .args(["-c", code])
        .output()
        .with_context(|| format!("running {}", python.display()))?;
    if !out.status.success() {
        bail!(
            "{} exited with {}: {}",
            python.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// The pinned environment ([`PINNED`]), created or updated when needed.
pub(crate) fn ensure(steps: &mut Steps) -> Result<Venv> {
    ensure_spec(steps, &PINNED)
}

/// The environment `spec`, created when missing (the interpreter found first, see
/// [`find_python`]), as steps of `steps`; returns it ready, held in use.
pub(crate) fn ensure_spec(steps: &mut Steps, spec: &Spec) -> Result<Venv> {
    let interpreter = find_python(steps, spec)?;
    ensure_with(steps, spec, &interpreter)
}

/// The environment `spec` built with `interpreter` (cached under a key that covers it).
pub(crate) fn ensure_with(steps: &mut Steps, spec: &Spec, interpreter: &Path) -> Result<Venv> {
    let requirements_path = root().join(spec.requirements);
    let requirements = fs::read_to_string(&requirements_path)
        .with_context(|| format!("reading {}", requirements_path.display()))?;
    if spec.name == PINNED.name
        && let Some(dir) = env::var_os("TENSORBRIDGE_VENV").filter(|d| !d.is_empty())
    {
        let venv = Venv {
            name: spec.name,
            dir: PathBuf::from(dir),
            _in_use: None,
        };
        install(steps, spec, &venv, interpreter, &requirements)?;
        return Ok(venv);
    }
    let (version, fingerprint) = interpreter_identity(interpreter)?;
    let key = format!(
        "{}-py{version}-{:016x}",
        spec.name,
        fnv1a(&[requirements.as_bytes(), fingerprint.as_bytes()])
    );
    let venvs = cache_dir().join("venvs");
    fs::create_dir_all(&venvs).with_context(|| format!("creating {}", venvs.display()))?;
    let venv_dir = venvs.join(&key);
    let lock_path = venvs.join(format!("{key}.lock"));
    let lock = File::create(&lock_path)
        .with_context(|| format!("creating the lock {}", lock_path.display()))?;
    // Fast path: built, and shared with whoever else uses it.
    lock.lock_shared()
        .with_context(|| format!("locking {}", lock_path.display()))?;
    let stamp = venv_dir.join(STAMP);
    if !is_built(&stamp, &requirements) {
        // Built by nobody yet (or half-built): build it alone. The check is repeated under
        // the exclusive lock, since another process may have built it meanwhile.
        lock.unlock()?;
        lock.lock()
            .with_context(|| format!("locking {}", lock_path.display()))?;
        if !is_built(&stamp, &requirements) {
            if venv_dir.exists() {
                steps.note(&format!(
                    "==> venv {}: {} is half-built (no stamp): rebuilding it",
                    spec.name,
                    venv_dir.display()
                ));
                fs::remove_dir_all(&venv_dir)
                    .with_context(|| format!("removing {}", venv_dir.display()))?;
            }
            let venv = Venv {
                name: spec.name,
                dir: venv_dir.clone(),
                _in_use: None,
            };
            install(steps, spec, &venv, interpreter, &requirements)?;
        }
        lock.unlock()?;
        lock.lock_shared()
            .with_context(|| format!("locking {}", lock_path.display()))?;
    } else {
        steps.note(&format!(
            "==> venv {}: cached {} (python {version}, {})",
            spec.name,
            venv_dir.display(),
            spec.requirements
        ));
    }
    // Marks the use, for pruning (the stamp's modification time).
    let _ = File::options()
        .append(true)
        .open(&stamp)
        .and_then(|f| f.set_modified(SystemTime::now()));
    prune(steps, &venvs, spec.name, &key);
    Ok(Venv {
        name: spec.name,
        dir: venv_dir,
        _in_use: Some(Arc::new(lock)),
    })
}

/// Whether the stamp says the environment holds exactly `requirements`.
fn is_built(stamp: &Path, requirements: &str) -> bool {
    fs::read_to_string(stamp).ok().as_deref() == Some(requirements)
}

/// Creates `venv` with `interpreter` when it has no Python yet and installs `requirements`
/// unless its stamp already says so; writes the stamp last.
fn install(
    steps: &mut Steps,
    spec: &Spec,
    venv: &Venv,
    interpreter: &Path,
    requirements: &str,
) -> Result<()> {
    let stamp = venv.dir().join(STAMP);
    if is_built(&stamp, requirements) {
        steps.note(&format!(
            "==> venv {}: {} already has {}",
            spec.name,
            venv.dir().display(),
            spec.requirements
        ));
        return Ok(());
    }
    if !venv.python().exists() {
        steps.cmd(
            &format!("venv {}: create", spec.name),
            Command::new(interpreter)
                .arg("-m")
                .arg("venv")
                .arg(venv.dir()),
        )?;
    }
    steps.cmd(
        &format!("venv {}: install", spec.name),
        venv.pip_install()
            .args([
                "--no-input",
                // The environment is the cache: a second copy of torch's CUDA wheels in pip's
                // own cache costs gigabytes (CI once ran out of disk on it).
                "--no-cache-dir",
                "-r",
            ])
            .arg(root().join(spec.requirements)),
    )?;
    fs::write(&stamp, requirements).with_context(|| format!("writing {}", stamp.display()))
}

/// Removes environments named `name` other than `keep` beyond the [`KEEP_PER_NAME`] most
/// recently used, skipping any that someone holds. Best effort: a failure is reported, not
/// fatal (the cache only grows).
fn prune(steps: &mut Steps, venvs: &Path, name: &str, keep: &str) {
    let Ok(entries) = fs::read_dir(venvs) else {
        return;
    };
    let prefix = format!("{name}-py");
    let mut others: Vec<(SystemTime, String)> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let file = e.file_name().to_string_lossy().into_owned();
            let is_env = file.starts_with(&prefix) && !file.ends_with(".lock") && file != keep;
            let used = fs::metadata(e.path().join(STAMP))
                .and_then(|m| m.modified())
                .unwrap_or(SystemTime::UNIX_EPOCH);
            is_env.then_some((used, file))
        })
        .collect();
    others.sort_by_key(|o| std::cmp::Reverse(o.0));
    for (_, file) in others.into_iter().skip(KEEP_PER_NAME) {
        let lock_path = venvs.join(format!("{file}.lock"));
        let Ok(lock) = File::create(&lock_path) else {
            continue;
        };
        if lock.try_lock().is_err() {
            continue; // in use, or being built
        }
        let dir = venvs.join(&file);
        match fs::remove_dir_all(&dir) {
            Ok(()) => steps.note(&format!("==> venv: pruned {}", dir.display())),
            Err(e) => steps.note(&format!("==> venv: could not prune {}: {e}", dir.display())),
        }
    }
}

/// The cache of environments (and of interpreters built for them).
pub(crate) fn cache_dir() -> PathBuf {
    let var = |name| {
        env::var_os(name)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    var("TENSORBRIDGE_CACHE")
        .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("tensorbridge")))
        .or_else(|| var("HOME").map(|d| d.join(".cache").join("tensorbridge")))
        .unwrap_or_else(|| root().join("target").join("cache"))
}

/// (`major.minor`, everything that makes one interpreter differ from another: its full
/// version, build and real path).
fn interpreter_identity(python: &Path) -> Result<(String, String)> {
    let out = ask_python(
        python,
        "import os, sys; print('%d.%d' % sys.version_info[:2]); print(sys.version); \
         print(os.path.realpath(sys.executable)); print(sys.abiflags)",
    )?;
    let version = out.lines().next().unwrap_or_default().to_owned();
    Ok((version, out))
}

/// The interpreter for `spec`:
/// - the pinned environment: `$PYTHON`, else `python3`;
/// - the others (`X.Y`): `$TENSORBRIDGE_PYTHON_X_Y`, else `pythonX.Y` on `PATH`, else pyenv's
///   newest `X.Y.*` (`$PYENV_ROOT`, default `~/.pyenv`), else `/usr/bin/pythonX.Y` and
///   `/usr/local/bin/pythonX.Y`; for 3.13 only, an interpreter built from Debian's source
///   package into the cache by `python/build-cpython.sh` (run here when none is found).
///
/// Each candidate is asked its version; one that answers differently (a pyenv shim for a
/// version pyenv does not have) is passed over.
pub(crate) fn find_python(steps: &mut Steps, spec: &Spec) -> Result<PathBuf> {
    let Some(want) = spec.python else {
        return Ok(env::var_os("PYTHON")
            .filter(|p| !p.is_empty())
            .unwrap_or_else(|| "python3".into())
            .into());
    };
    let var = format!("TENSORBRIDGE_PYTHON_{}", want.replace('.', "_"));
    if let Some(path) = env::var_os(&var).filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        return match ask_python(&path, VERSION_CODE) {
            Ok(v) if v == want => Ok(path),
            Ok(v) => bail!("${var} = {} is CPython {v}, not {want}", path.display()),
            Err(e) => Err(e).with_context(|| format!("${var} = {}", path.display())),
        };
    }
    let exe = format!("python{want}");
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(path) = env::var_os("PATH") {
        candidates.extend(env::split_paths(&path).map(|d| d.join(&exe)));
    }
    let pyenv = env::var_os("PYENV_ROOT")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|h| PathBuf::from(h).join(".pyenv")));
    if let Some(versions) = pyenv.map(|p| p.join("versions"))
        && let Ok(entries) = fs::read_dir(&versions)
    {
        // Newest patch release first: 3.13.10 before 3.13.9.
        let mut found: Vec<(u32, PathBuf)> = entries
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let patch = name.strip_prefix(&format!("{want}."))?.parse().ok()?;
                Some((patch, e.path().join("bin").join(&exe)))
            })
            .collect();
        found.sort_by_key(|f| std::cmp::Reverse(f.0));
        candidates.extend(found.into_iter().map(|(_, p)| p));
    }
    candidates.push(Path::new("/usr/bin").join(&exe));
    candidates.push(Path::new("/usr/local/bin").join(&exe));
    let built = cache_dir().join("python").join(want).join("bin").join(&exe);
    candidates.push(built.clone());
    for candidate in &candidates {
        if candidate.is_file() && ask_python(candidate, VERSION_CODE).is_ok_and(|v| v == want) {
            return Ok(candidate.clone());
        }
    }
    if want == "3.13" {
        // Debian's newer suites carry 3.13; its source builds here in a few minutes.
        let script = root().join("python").join("build-cpython.sh");
        let prefix = cache_dir().join("python").join(want);
        steps.cmd(
            &format!("venv {}: build CPython {want}", spec.name),
            Command::new("bash").arg(&script).arg(want).arg(&prefix),
        )?;
        if ask_python(&built, VERSION_CODE).is_ok_and(|v| v == want) {
            return Ok(built);
        }
        bail!("{} did not produce {}", script.display(), built.display());
    }
    bail!(
        "no CPython {want} for the `{}` environment ({}): looked for {exe} on PATH, under \
         pyenv's versions, /usr/bin and /usr/local/bin; install one (pyenv install {want}) \
         or set ${var} to its path",
        spec.name,
        spec.requirements
    )
}

/// 64-bit FNV-1a over `parts` (each followed by a separator): a stable name for a cache
/// entry, not a security measure.
pub(crate) fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut hash = 0xcbf2_9ce4_8422_2325_u64;
    for part in parts {
        for &b in part.iter().chain(&[0xff]) {
            hash ^= u64::from(b);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    }
    hash
}

/// `cmd` (a cargo command) with `LIBTORCH` set to `libtorch`, a torch installation
/// ([`Venv::torch_dir`]): how torch-sys, and so tensorbridge-tch, find libtorch (docs/BUILDING.md,
/// "libtorch"). Give every cargo command of a task the same value: torch-sys rebuilds when it
/// changes.
pub(crate) fn with_libtorch(mut cmd: Command, libtorch: &Path) -> Command {
    cmd.env("LIBTORCH", libtorch);
    cmd
}

/// Removes `dir` if it is there, so that what fills it next (a `pip install --target`, a
/// build) starts from an empty folder.
pub(crate) fn remove_dir(dir: &Path) -> Result<()> {
    if dir.exists() {
        fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    Ok(())
}

/// Installs with `venv`'s pip into `dir` (`--no-deps --target dir`, then `what`: a
/// requirement or `-r FILE`) unless `dir/.requirements` holds `stamp` already, the text the
/// folder was last made from; the folder is made afresh, and stamped once pip succeeded.
pub(crate) fn install_stamped(
    steps: &mut Steps,
    venv: &Venv,
    step: &str,
    dir: &Path,
    stamp: &str,
    what: &[&OsStr],
) -> Result<()> {
    let stamp_file = dir.join(".requirements");
    if fs::read_to_string(&stamp_file).ok().as_deref() == Some(stamp) {
        return Ok(());
    }
    remove_dir(dir)?;
    let mut pip = venv.pip_install();
    pip.args(["--no-deps", "--target"]).arg(dir).args(what);
    steps.cmd(step, &mut pip)?;
    fs::write(&stamp_file, stamp).with_context(|| format!("writing {}", stamp_file.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_requirements_file_is_an_environment_and_keeps_the_shared_tools() {
        let mut files: Vec<String> = fs::read_dir(root().join("python"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|f| f.starts_with("requirements") && f.ends_with(".txt"))
            .map(|f| format!("python/{f}"))
            .collect();
        files.sort();
        let mut declared: Vec<String> = ENVS
            .iter()
            .chain([&&FREE_THREADED, &&TCH_NEWEST])
            .map(|s| s.requirements.to_owned())
            .collect();
        // Not an environment: installed beside the environments (`nixl.rs`).
        declared.push(crate::nixl::REQUIREMENTS.to_owned());
        declared.sort();
        assert_eq!(files, declared);
        for spec in ENVS.iter().chain([&&FREE_THREADED]) {
            let text = fs::read_to_string(root().join(spec.requirements)).unwrap();
            for tool in ["pytest==", "hypothesis==", "numpy=="] {
                assert!(
                    text.lines().any(|l| l.starts_with(tool)),
                    "{} pins no {tool}",
                    spec.requirements
                );
            }
        }
        let pinned = ENVS
            .iter()
            .chain([&&FREE_THREADED, &&TCH_NEWEST])
            .map(|s| s.requirements)
            .chain([crate::nixl::REQUIREMENTS]);
        for requirements in pinned {
            let text = fs::read_to_string(root().join(requirements)).unwrap();
            // Exact pins only: the cache key is the file, so a range would hide a new release.
            for line in text.lines().map(str::trim) {
                if !line.is_empty() && !line.starts_with('#') {
                    assert!(
                        line.contains("=="),
                        "{requirements}: `{line}` is not pinned"
                    );
                }
            }
        }
    }

    #[test]
    fn versions_parse() {
        assert_eq!(parse_version("3.13\n").unwrap(), (3, 13));
        assert!(parse_version("3").is_err());
        assert!(parse_version("three.x").is_err());
    }

    #[test]
    fn fnv_separates_parts() {
        assert_ne!(fnv1a(&[b"ab", b"c"]), fnv1a(&[b"a", b"bc"]));
        assert_eq!(fnv1a(&[b"x"]), fnv1a(&[b"x"]));
    }
}
