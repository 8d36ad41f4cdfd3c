//! aarch64 Linux (Grace Hopper and Grace Blackwell nodes, Arm clusters): the Python package's
//! wheel for `aarch64-unknown-linux-gnu`, cross-compiled on the x86-64 build machine, checked
//! and smoke-tested there under qemu-user, and every crate that can build for the target
//! checked for it (`cargo xtask test-aarch64`, and a lane of `cargo xtask ci`).
//!
//! What it needs, installed when missing (never skipped silently: a refusal fails the task):
//! - the Rust target (`rustup target add aarch64-unknown-linux-gnu`);
//! - `qemu-aarch64`, from Debian's `qemu-user` without its recommended `qemu-user-binfmt`
//!   (which would register arm64 executables with the kernel for the whole machine; the
//!   interpreter is started through qemu explicitly instead);
//! - an arm64 sysroot ([`Sysroot`]): Debian's arm64 CPython 3.11 (the interpreter and its
//!   standard library, with their libraries), `libgcc_s` (which the wheel links: the one
//!   unwinder, see `ci::build_wheels_into`) and `libstdc++` (NumPy's), fetched with a private
//!   apt configuration and unpacked with `dpkg-deb -x` (no change to the machine's own
//!   dpkg or apt: no foreign architecture added); plus NumPy, ml_dtypes (which
//!   `test_from_ptr.py` imports) and pytest as PyPI's aarch64 wheels, at the pinned
//!   environment's versions (`python/requirements.txt`). Debian's own NumPy (1.24) predates
//!   DLPack 1.x, which the smoke tests exchange. It lives in
//!   the cache beside the Python environments (`<cache>/aarch64/`), keyed by what it holds.

use std::env;
use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, Result, bail};

use crate::venv::{self, Venv};
use crate::{Steps, root, run_status};

/// The Rust target.
pub(crate) const TARGET: &str = "aarch64-unknown-linux-gnu";

/// Workspace members left out of `cargo check --target aarch64-unknown-linux-gnu`, and why.
pub(crate) const CHECK_EXCLUDED: &[&str] = &[
    // torch-sys and this crate's shim compile C++ against libtorch for the target in their
    // build scripts: that needs an aarch64 libtorch (the build machine's torch is x86-64's)
    // and a C++ cross compiler. Its Rust code has nothing specific to an architecture.
    "tensorbridge-tch",
    // nixl-sys's build script compiles its C++ stub for the target: a C++ cross compiler
    // again (NIXL's aarch64 wheels exist; the adapter's Rust is architecture-neutral).
    "tensorbridge-nixl",
];

/// The Python tests run on the aarch64 wheel under qemu: the package's import and shape,
/// NumPy arrays viewed and handed back (pointer equality, writes both ways), `from_ptr`,
/// copies, the typed errors, and DLPack capsules of both kinds (versioned and legacy),
/// made and consumed. Files of `crates/tensorbridge-python/tests`, whole (their GPU and
/// framework tests skip here) but for [`SMOKE_DESELECTED`].
pub(crate) const SMOKE_TESTS: &[&str] = &[
    "test_native_smoke.py",
    "test_view.py",
    "test_from_ptr.py",
    "test_protocols.py",
];

/// Tests of [`SMOKE_TESTS`] left out under qemu: those that start a fresh interpreter
/// (`sys.executable`, an arm64 executable that the kernel cannot start without qemu; the
/// sysroot registers nothing with the kernel). A unit test keeps the list complete.
pub(crate) const SMOKE_DESELECTED: &[&str] =
    &["test_view.py::test_impossible_copies_raise_memory_error"];

/// The Debian release, archive and keyring the arm64 packages come from (the release of
/// CI's machine, whose keyring verifies them).
const DEBIAN_SUITE: &str = "bookworm";
const DEBIAN_ARCHIVE: &str = "http://deb.debian.org/debian";
const DEBIAN_KEYRING: &str = "/usr/share/keyrings/debian-archive-keyring.gpg";

/// The arm64 packages (apt adds their dependencies). Bookworm's CPython is 3.11.
const DEBS: &[&str] = &[
    "python3.11-minimal",
    "libpython3.11-stdlib",
    "libgcc-s1",
    "libstdc++6",
];

/// The interpreter's version, as PyPI's tags and the sysroot's path name it.
const PYTHON: (u32, u32) = (3, 11);

/// The PyPI packages, at the versions `python/requirements.txt` pins.
const PYPI: &[&str] = &["numpy", "ml_dtypes", "pytest"];

/// Written last, once the sysroot is complete: what it holds.
const STAMP: &str = ".tensorbridge-aarch64";

/// What the aarch64 steps need on the build machine: qemu and the sysroot (the Rust target
/// is installed by [`tools`] too, but needs no handle).
pub(crate) struct Tools {
    qemu: PathBuf,
    sysroot: Sysroot,
}

/// An arm64 root file system with CPython and its libraries (`root/`), and the [`PYPI`]
/// packages (`site/`), held in use (a shared lock) for as long as it lives.
pub(crate) struct Sysroot {
    dir: PathBuf,
    _in_use: File,
}

impl Sysroot {
    fn root(&self) -> PathBuf {
        self.dir.join("root")
    }

    fn site(&self) -> PathBuf {
        self.dir.join("site")
    }

    /// The arm64 `libgcc_s.so.1` the wheel links (`ci::build_wheel_aarch64`).
    pub(crate) fn libgcc_s(&self) -> PathBuf {
        self.root()
            .join("lib")
            .join("aarch64-linux-gnu")
            .join("libgcc_s.so.1")
    }

    fn interpreter(&self) -> PathBuf {
        self.root()
            .join("usr")
            .join("bin")
            .join(format!("python{}.{}", PYTHON.0, PYTHON.1))
    }
}

impl Tools {
    /// The arm64 `python` under qemu, with `site` (a folder of installed wheels), if any,
    /// and then the [`PYPI`] packages importable. `-L`: the arm64 loader and libraries come
    /// from the sysroot; `-S`: no `site` module, so no site-packages but these folders.
    fn python_cmd(&self, site: Option<&Path>) -> Command {
        let mut cmd = Command::new(&self.qemu);
        cmd.arg("-L")
            .arg(self.sysroot.root())
            .arg(self.sysroot.interpreter())
            .arg("-S");
        let mut path = std::ffi::OsString::new();
        if let Some(site) = site {
            path.push(site);
            path.push(":");
        }
        path.push(self.sysroot.site());
        cmd.env("PYTHONPATH", path)
            .env("PYTHONNOUSERSITE", "1")
            .env_remove("PYTHONHOME")
            .env_remove("VIRTUAL_ENV")
            .current_dir(root());
        cmd
    }

    /// The arm64 `libgcc_s.so.1` ([`Sysroot::libgcc_s`]).
    pub(crate) fn libgcc_s(&self) -> PathBuf {
        self.sysroot.libgcc_s()
    }
}

/// `cargo xtask test-aarch64`: what `ci`'s aarch64 lane runs, alone.
pub(crate) fn task(args: &[String]) -> Result<()> {
    if let Some(arg) = args.first() {
        bail!("unknown option `{arg}` for `test-aarch64` (it takes none)");
    }
    let mut steps = Steps::new("test-aarch64");
    let result = (|| {
        let venv = venv::ensure(&mut steps)?;
        let tools = tools(&mut steps, &venv)?;
        lane(&mut steps, &venv, &tools)
    })();
    steps.finish(result)
}

/// Installs (when missing) and returns what the aarch64 steps need: the Rust target, qemu,
/// the sysroot. Mostly downloads: `ci` runs it in the background while cargo compiles.
pub(crate) fn tools(steps: &mut Steps, venv: &Venv) -> Result<Tools> {
    rust_target(steps)?;
    let qemu = qemu(steps)?;
    let sysroot = sysroot(steps, venv)?;
    let tools = Tools { qemu, sysroot };
    steps.cmd(
        "aarch64: the arm64 interpreter under qemu",
        tools.python_cmd(None).args([
            "-c",
            "import platform, numpy, ml_dtypes, pytest; \
             assert platform.machine() == 'aarch64', platform.machine(); \
             print('CPython', platform.python_version(), platform.machine(), \
             'numpy', numpy.__version__, 'ml_dtypes', ml_dtypes.__version__, \
             'pytest', pytest.__version__)",
        ]),
    )?;
    Ok(tools)
}

/// The wheel built for aarch64 and checked (manylinux tag, one unwinder, an AArch64
/// module), the smoke tests on it under qemu, and `cargo check` of the workspace for the
/// target (run whatever the wheel's steps gave, so that one run reports both).
pub(crate) fn lane(steps: &mut Steps, venv: &Venv, tools: &Tools) -> Result<()> {
    let wheel = crate::ci::build_wheel_aarch64(steps, venv, &tools.libgcc_s()).and_then(|wheel| {
        crate::ci::check_manylinux(steps, venv, std::slice::from_ref(&wheel))?;
        smoke(steps, venv, tools, &wheel)
    });
    let check = check(steps, venv);
    wheel.and(check)
}

/// `cargo check --target aarch64-unknown-linux-gnu` of every member but [`CHECK_EXCLUDED`],
/// all targets (tests, benches and examples hold code too). Build scripts that compile C
/// for the target (criterion's `alloca`, a dev-dependency of the benches) get zig as the
/// target's C compiler ([`zig_tools`]).
pub(crate) fn check(steps: &mut Steps, venv: &Venv) -> Result<()> {
    let mut check = venv.cargo();
    check.args(["check", "--workspace", "--all-targets", "--target", TARGET]);
    for package in CHECK_EXCLUDED {
        check.args(["--exclude", package]);
    }
    let env_target = TARGET.replace('-', "_");
    for (tool, path) in zig_tools(venv)? {
        check.env(format!("{tool}_{env_target}"), path);
    }
    steps.cmd(
        &format!("aarch64: cargo check --target {TARGET}"),
        &mut check,
    )
}

/// Scripts in `target/aarch64-zig` that run zig (the pinned environment's, through
/// maturin, which fixes up cc-rs's arguments for zig) as the target's C compiler, C++
/// compiler and archiver, as cc-rs reads them from `CC_<target>`, `CXX_<target>` and
/// `AR_<target>`. Nothing else of the build sees the environment (its `PATH` is set inside
/// the scripts only), so the host's build scripts do not rerun.
fn zig_tools(venv: &Venv) -> Result<Vec<(&'static str, PathBuf)>> {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = root().join("target").join("aarch64-zig");
    fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let bin = venv.dir().join("bin");
    let mut tools = Vec::new();
    for (tool, file, command) in [
        ("CC", "cc", "cc -- -target aarch64-linux-gnu.2.28"),
        ("CXX", "cxx", "c++ -- -target aarch64-linux-gnu.2.28"),
        ("AR", "ar", "ar --"),
    ] {
        let path = dir.join(file);
        let script = format!(
            "#!/bin/sh\nPATH='{bin}':\"$PATH\" exec '{python}' -m maturin zig {command} \"$@\"\n",
            bin = bin.display(),
            python = venv.python().display(),
        );
        fs::write(&path, script).with_context(|| format!("writing {}", path.display()))?;
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755))
            .with_context(|| format!("making {} executable", path.display()))?;
        tools.push((tool, path));
    }
    Ok(tools)
}

/// The wheel installed for the arm64 CPython (pip told the platform, so that a wheel whose
/// tags do not fit an aarch64 manylinux_2_28 CPython 3.11 is refused) into
/// `target/python/aarch64`, then [`SMOKE_TESTS`] run on it under qemu.
pub(crate) fn smoke(steps: &mut Steps, venv: &Venv, tools: &Tools, wheel: &Path) -> Result<()> {
    let site = root().join("target").join("python").join("aarch64");
    crate::venv::remove_dir(&site)?;
    let mut pip = venv.pip_install();
    pip.args(["--no-index", "--no-deps", "--no-compile"])
        .args(pypi_platform())
        .arg("--target")
        .arg(&site)
        .arg(wheel);
    steps.cmd("aarch64: install the wheel", &mut pip)?;
    let tests = root().join(crate::ci::PYTHON_CRATE).join("tests");
    let mut pytest = tools.python_cmd(Some(&site));
    pytest
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir"])
        .arg(&tests);
    for file in SMOKE_TESTS {
        pytest.arg(tests.join(file));
    }
    for test in SMOKE_DESELECTED {
        // Node ids, relative to the root directory (`--rootdir`).
        pytest.arg("--deselect").arg(test);
    }
    steps.cmd("aarch64: pytest smoke tests under qemu", &mut pytest)
}

/// pip's options for wheels that fit the sysroot's CPython on aarch64 manylinux_2_28.
fn pypi_platform() -> Vec<String> {
    let (major, minor) = PYTHON;
    let (glibc_major, glibc_minor) = crate::ci::MANYLINUX;
    [
        "--only-binary=:all:".to_owned(),
        "--platform".to_owned(),
        format!("manylinux_{glibc_major}_{glibc_minor}_aarch64"),
        "--platform".to_owned(),
        "manylinux2014_aarch64".to_owned(),
        "--python-version".to_owned(),
        format!("{major}.{minor}"),
        "--implementation".to_owned(),
        "cp".to_owned(),
        "--abi".to_owned(),
        format!("cp{major}{minor}"),
    ]
    .into()
}

/// The Rust target, added with rustup when the toolchain lacks it.
fn rust_target(steps: &mut Steps) -> Result<()> {
    let installed = steps.run(&format!("aarch64: is {TARGET} installed"), || {
        let out = Command::new("rustup")
            .args(["target", "list", "--installed"])
            .current_dir(root())
            .output()
            .context("could not run `rustup target list`: the aarch64 steps need rustup")?;
        if !out.status.success() {
            bail!(
                "`rustup target list --installed` exited with {}",
                out.status
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .any(|l| l.trim() == TARGET))
    })?;
    if installed {
        steps.note(&format!("==> aarch64: {TARGET} installed"));
        return Ok(());
    }
    steps.cmd(
        &format!("aarch64: rustup target add {TARGET}"),
        Command::new("rustup")
            .args(["target", "add", TARGET])
            .current_dir(root()),
    )
}

/// `qemu-aarch64` (or `qemu-aarch64-static`) from `PATH`, installed from Debian's
/// `qemu-user` when neither is there.
fn qemu(steps: &mut Steps) -> Result<PathBuf> {
    let find = || {
        let path = env::var_os("PATH")?;
        env::split_paths(&path).find_map(|dir| {
            ["qemu-aarch64", "qemu-aarch64-static"]
                .iter()
                .map(|name| dir.join(name))
                .find(|p| p.is_file())
        })
    };
    if let Some(qemu) = find() {
        steps.note(&format!("==> aarch64: qemu {}", qemu.display()));
        return Ok(qemu);
    }
    let install = || {
        let mut cmd = Command::new("apt-get");
        cmd.args([
            "install",
            "-y",
            "-q",
            "--no-install-recommends",
            "qemu-user",
        ])
        .env("DEBIAN_FRONTEND", "noninteractive");
        cmd
    };
    // A fresh machine's package lists may be missing or stale: updated once on failure.
    if steps
        .cmd("aarch64: apt-get install qemu-user", &mut install())
        .is_err()
    {
        steps.cmd(
            "aarch64: apt-get update",
            Command::new("apt-get").args(["update", "-q"]),
        )?;
        steps
            .cmd("aarch64: apt-get install qemu-user", &mut install())
            .context(
                "qemu-aarch64 is needed to run the aarch64 wheel: install Debian's qemu-user \
                 (apt-get install --no-install-recommends qemu-user)",
            )?;
    }
    find().context("qemu-user is installed but no qemu-aarch64 is on PATH")
}

/// The pins of [`PYPI`] in `requirements` (the pinned environment's file), as pip
/// requirements (`numpy==2.4.6`).
fn pypi_pins(requirements: &str) -> Result<Vec<String>> {
    PYPI.iter()
        .map(|name| {
            requirements
                .lines()
                .map(str::trim)
                .find(|l| {
                    l.strip_prefix(name)
                        .is_some_and(|rest| rest.starts_with("=="))
                })
                .map(str::to_owned)
                .with_context(|| format!("python/requirements.txt pins no `{name}==`"))
        })
        .collect()
}

/// What a sysroot holds, in words: its stamp, and (hashed) its cache key.
fn contents(pins: &[String]) -> String {
    format!(
        "debian {DEBIAN_SUITE} arm64 {DEBIAN_ARCHIVE}: {}\npypi cp{}{} aarch64: {}\n",
        DEBS.join(" "),
        PYTHON.0,
        PYTHON.1,
        pins.join(" ")
    )
}

/// The sysroot, built under an exclusive lock when missing or half-made (no stamp), then
/// held under a shared one (as `venv` does with the environments).
fn sysroot(steps: &mut Steps, venv: &Venv) -> Result<Sysroot> {
    let requirements_path = root().join(venv::PINNED.requirements);
    let requirements = fs::read_to_string(&requirements_path)
        .with_context(|| format!("reading {}", requirements_path.display()))?;
    let stamp_text = contents(&pypi_pins(&requirements)?);
    let cache = venv::cache_dir().join("aarch64");
    fs::create_dir_all(&cache).with_context(|| format!("creating {}", cache.display()))?;
    let key = format!(
        "py{}.{}-{:016x}",
        PYTHON.0,
        PYTHON.1,
        venv::fnv1a(&[stamp_text.as_bytes()])
    );
    let dir = cache.join(&key);
    let lock_path = cache.join(format!("{key}.lock"));
    let lock = File::create(&lock_path)
        .with_context(|| format!("creating the lock {}", lock_path.display()))?;
    let built = || fs::read_to_string(dir.join(STAMP)).ok().as_deref() == Some(&*stamp_text);
    lock.lock()
        .with_context(|| format!("locking {}", lock_path.display()))?;
    if built() {
        steps.note(&format!("==> aarch64: cached sysroot {}", dir.display()));
    } else {
        crate::venv::remove_dir(&dir)?;
        build_sysroot(steps, venv, &dir, &requirements)?;
        fs::write(dir.join(STAMP), &stamp_text).context("writing the sysroot's stamp")?;
    }
    lock.unlock()?;
    lock.lock_shared()
        .with_context(|| format!("locking {}", lock_path.display()))?;
    Ok(Sysroot { dir, _in_use: lock })
}

/// Fetches [`DEBS`] with their dependencies through a private apt configuration in
/// `dir/apt` (its own sources, lists, archive cache and an empty dpkg status, so that every
/// dependency is fetched and nothing of the machine's apt or dpkg changes), unpacks them
/// into `dir/root`, and installs [`PYPI`] for the sysroot's CPython into `dir/site`.
fn build_sysroot(steps: &mut Steps, venv: &Venv, dir: &Path, requirements: &str) -> Result<()> {
    let apt = dir.join("apt");
    for sub in [
        "etc/apt/apt.conf.d",
        "etc/apt/preferences.d",
        "etc/apt/sources.list.d",
        "etc/apt/trusted.gpg.d",
        "var/lib/apt/lists/partial",
        "var/cache/apt/archives/partial",
        "var/lib/dpkg",
    ] {
        fs::create_dir_all(apt.join(sub))
            .with_context(|| format!("creating {}", apt.join(sub).display()))?;
    }
    let status = apt.join("var/lib/dpkg/status");
    fs::write(&status, "").context("writing the private dpkg status")?;
    fs::write(
        apt.join("etc/apt/sources.list"),
        format!(
            "deb [arch=arm64 signed-by={DEBIAN_KEYRING}] {DEBIAN_ARCHIVE} {DEBIAN_SUITE} main\n"
        ),
    )
    .context("writing the private sources.list")?;
    let config = apt.join("apt.conf");
    fs::write(
        &config,
        format!(
            "Dir \"{}/\";\n\
             Dir::State::status \"{}\";\n\
             APT::Architecture \"arm64\";\n\
             APT::Architectures {{ \"arm64\"; }};\n\
             Acquire::Languages \"none\";\n\
             Debug::NoLocking \"true\";\n\
             APT::Sandbox::User \"root\";\n",
            apt.display(),
            status.display()
        ),
    )
    .context("writing the private apt.conf")?;
    let apt_get = || {
        let mut cmd = Command::new("apt-get");
        cmd.env("APT_CONFIG", &config).arg("-q");
        cmd
    };
    steps.cmd(
        "aarch64: apt-get update (arm64, private)",
        apt_get().arg("update"),
    )?;
    steps.cmd(
        "aarch64: apt-get download CPython (arm64, private)",
        apt_get()
            .args([
                "install",
                "-y",
                "--download-only",
                "--no-install-recommends",
            ])
            .args(DEBS),
    )?;
    let archives = apt.join("var/cache/apt/archives");
    let target = dir.join("root");
    fs::create_dir_all(&target).with_context(|| format!("creating {}", target.display()))?;
    let count = steps.run("aarch64: unpack the arm64 packages", || {
        let mut debs: Vec<PathBuf> = fs::read_dir(&archives)
            .with_context(|| format!("listing {}", archives.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "deb"))
            .collect();
        debs.sort();
        if debs.is_empty() {
            bail!("apt fetched no package into {}", archives.display());
        }
        for deb in &debs {
            run_status(Command::new("dpkg-deb").arg("-x").arg(deb).arg(&target))?;
        }
        Ok(debs.len())
    })?;
    steps.note(&format!(
        "==> aarch64: {count} packages unpacked into {}",
        target.display()
    ));
    // The lists and the packages are not needed once unpacked.
    fs::remove_dir_all(&apt).with_context(|| format!("removing {}", apt.display()))?;
    steps.cmd(
        "aarch64: pip install NumPy, ml_dtypes and pytest (aarch64 wheels)",
        venv.pip_install()
            .args(["--no-input", "--no-cache-dir"])
            .args(pypi_platform())
            .arg("--target")
            .arg(dir.join("site"))
            .args(pypi_pins(requirements)?),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_come_from_the_requirements() {
        let pins = pypi_pins(
            "# c\ntorch==2.11.0\nnumpy==2.4.6\nml_dtypes==0.6.0\npytest-x==1\npytest==9.2.0\n",
        )
        .unwrap();
        assert_eq!(pins, ["numpy==2.4.6", "ml_dtypes==0.6.0", "pytest==9.2.0"]);
        let missing = pypi_pins("numpy==2.4.6\nml_dtypes==0.6.0\n")
            .unwrap_err()
            .to_string();
        assert!(missing.contains("pytest"), "{missing}");
        // The pinned environment's own file has both.
        let pinned = fs::read_to_string(root().join(venv::PINNED.requirements)).unwrap();
        assert_eq!(pypi_pins(&pinned).unwrap().len(), PYPI.len());
    }

    #[test]
    fn the_key_follows_the_pins() {
        let a = contents(&["numpy==2.4.6".into(), "pytest==9.2.0".into()]);
        let b = contents(&["numpy==2.4.7".into(), "pytest==9.2.0".into()]);
        assert_eq!(
            a,
            contents(&["numpy==2.4.6".into(), "pytest==9.2.0".into()])
        );
        assert_ne!(a, b);
        assert!(
            a.contains("python3.11-minimal") && a.contains("cp311"),
            "{a}"
        );
    }

    /// Every smoke test that starts a subprocess is deselected, and every deselected test
    /// exists and does.
    #[test]
    fn smoke_tests_that_start_a_subprocess_are_deselected() {
        let tests = root().join(crate::ci::PYTHON_CRATE).join("tests");
        let mut spawning = Vec::new();
        for file in SMOKE_TESTS {
            let text =
                fs::read_to_string(tests.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
            for function in text.split("\ndef ").skip(1) {
                let name = function.split('(').next().unwrap_or_default();
                let body = function.split("\n\n\n").next().unwrap_or_default();
                if name.starts_with("test_")
                    && ["run_isolated(", "subprocess.", "multiprocessing"]
                        .iter()
                        .any(|s| body.contains(s))
                {
                    spawning.push(format!("{file}::{name}"));
                }
            }
        }
        assert_eq!(spawning, SMOKE_DESELECTED, "start a subprocess");
    }
}
