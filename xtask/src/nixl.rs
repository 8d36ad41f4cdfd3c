//! NIXL for the tests: `python/requirements-nixl.txt` installed with `pip install --no-deps
//! --target target/nixl/<env>` beside (not into) each shared environment that NIXL has
//! wheels for, so the pytest suite runs `tensorbridge.nixl`'s tests against a real agent.
//! `--no-deps`: the wheel declares torch and the CUDA stack, which NIXL does not need.
//! Also libclang for `nixl-sys`'s bindgen ([`bindgen_setup`]), and the Rust crate's test
//! against that NIXL ([`run`], one of `ci`'s extra steps).

use std::env;
use std::ffi::{OsStr, OsString};
use std::fs;
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use anyhow::{Context as _, Result, bail};

use crate::venv::Venv;
use crate::{Steps, root};

/// The requirements file, relative to the workspace root.
pub(crate) const REQUIREMENTS: &str = "python/requirements-nixl.txt";

/// The oldest CPython NIXL publishes wheels for.
const MIN_PYTHON: (u32, u32) = (3, 10);

/// `target/nixl/<env>` with NIXL installed for `env` (reinstalled when the requirements file
/// changed), or `None` where NIXL has no wheel for its interpreter (said as a skipped step).
pub(crate) fn install(steps: &mut Steps, env: &Venv) -> Result<Option<PathBuf>> {
    let (major, minor) = env.python_version()?;
    let name = format!(
        "NIXL: pip install --no-deps -r {REQUIREMENTS} ({})",
        env.name()
    );
    if (major, minor) < MIN_PYTHON {
        steps.skip(
            &name,
            &format!("NIXL has no wheel for CPython {major}.{minor} (3.10 to 3.14 have one)"),
        );
        return Ok(None);
    }
    let requirements = root().join(REQUIREMENTS);
    let text = fs::read_to_string(&requirements)
        .with_context(|| format!("reading {}", requirements.display()))?;
    let dir = root().join("target").join("nixl").join(env.name());
    crate::venv::install_stamped(
        steps,
        env,
        &name,
        &dir,
        &text,
        &[OsStr::new("-r"), requirements.as_os_str()],
    )?;
    Ok(Some(dir))
}

/// What [`bindgen_setup`] found: the variables every `Venv::cargo` command gets.
static BINDGEN_ENV: OnceLock<Vec<(&'static str, OsString)>> = OnceLock::new();

/// The variables bindgen needs ([`bindgen_setup`]), for `Venv::cargo`; none before it ran
/// or where `LIBCLANG_PATH` was already set.
pub(crate) fn bindgen_env() -> &'static [(&'static str, OsString)] {
    BINDGEN_ENV.get().map_or(&[], Vec::as_slice)
}

/// The libclang `nixl-sys`'s build script (bindgen) loads, from PyPI.
const LIBCLANG: &str = "libclang==18.1.1";

/// Makes bindgen work for every cargo command `ci` runs through `Venv::cargo` (`nixl-sys`, a
/// dependency of `tensorbridge-nixl`, runs it in its build script): unless `LIBCLANG_PATH` is
/// already set, installs [`LIBCLANG`] into `target/nixl/libclang` and has those commands get
/// `LIBCLANG_PATH` pointing at it and `BINDGEN_EXTRA_CLANG_ARGS` naming the C compiler's own
/// headers (the wheel has no clang resource headers: `stdbool.h` would be missing). Debian's
/// `libclang-dev` works as well: set `LIBCLANG_PATH` to its folder.
pub(crate) fn bindgen_setup(steps: &mut Steps, venv: &Venv) -> Result<()> {
    if env::var_os("LIBCLANG_PATH").is_some() {
        steps.note("==> bindgen: LIBCLANG_PATH is set; using it");
        return Ok(());
    }
    let dir = root().join("target").join("nixl").join("libclang");
    crate::venv::install_stamped(
        steps,
        venv,
        &format!("bindgen: pip install {LIBCLANG}"),
        &dir,
        LIBCLANG,
        &[OsStr::new(LIBCLANG)],
    )?;
    let include = Command::new("cc")
        .arg("-print-file-name=include")
        .output()
        .context("running cc -print-file-name=include")?;
    let include = String::from_utf8(include.stdout)?.trim().to_owned();
    let mut vars = vec![(
        "LIBCLANG_PATH",
        dir.join("clang").join("native").into_os_string(),
    )];
    if env::var_os("BINDGEN_EXTRA_CLANG_ARGS").is_none() {
        vars.push(("BINDGEN_EXTRA_CLANG_ARGS", format!("-I{include}").into()));
    }
    // A second call (one process runs `ci` once) keeps the first's values.
    let _ = BINDGEN_ENV.set(vars);
    Ok(())
}

/// `cargo test -p tensorbridge-nixl` against a real NIXL: the pinned environment's NIXL
/// ([`install`]), its `libnixl_capi.so` on `LD_LIBRARY_PATH` for `nixl-sys`'s loader, and the
/// interpreter for the test's Python peer; `TB_REQUIRE_NIXL=1`, so nothing skips.
pub(crate) fn run(steps: &mut Steps, venv: &Venv) -> Result<()> {
    let Some(dir) = install(steps, venv)? else {
        bail!("the pinned environment's CPython has no NIXL wheel");
    };
    let libs = dir.join(".nixl_cu13.mesonpy.libs");
    steps.cmd(
        "NIXL: cargo test -p tensorbridge-nixl (a tensor to a Python process)",
        venv.cargo()
            .args(["test", "-p", "tensorbridge-nixl"])
            .env("LD_LIBRARY_PATH", &libs)
            .env("TB_NIXL_PYTHON", venv.python())
            .env("TB_NIXL_PYTHONPATH", &dir)
            .env("TB_REQUIRE_NIXL", "1")
            .env("UCX_NET_DEVICES", "lo"),
    )
}

/// The Python NIXL tests (`test_nixl.py`) with NIXL beside the wheels of `site` ([`install`])
/// and `TB_REQUIRE_NIXL=1`, in a pytest process of their own: NIXL cannot be loaded into a
/// process that has imported TensorFlow (both bundle gRPC; the process exits), and the main
/// suite imports TensorFlow. Reported as skipped where NIXL has no wheel for the interpreter.
pub(crate) fn pytest(steps: &mut Steps, env: &Venv, site: &std::path::Path) -> Result<()> {
    let Some(nixl) = install(steps, env)? else {
        return Ok(());
    };
    let tests = root().join(crate::ci::PYTHON_CRATE).join("tests");
    let file = tests.join("test_nixl.py");
    let mut cmd = crate::ci::pytest_cmd(env, site, &tests, &[file.as_path()]);
    cmd.env("PYTHONPATH", crate::ci::python_path_with(&[&nixl, site]))
        .env("TB_REQUIRE_NIXL", "1");
    steps.cmd(
        &format!("pytest test_nixl.py with NIXL ({})", env.name()),
        &mut cmd,
    )
}

/// `cargo xtask test-nixl`: what `ci` runs of NIXL, alone: libclang, NIXL beside the pinned
/// environment, the Rust crate's test ([`run`]), then the wheels and the Python NIXL tests
/// against a real agent ([`pytest`]); `test_nixl_driver.py` runs with the stand-in driver
/// (`test-standin`).
pub(crate) fn task(args: &[String]) -> Result<()> {
    if let Some(arg) = args.first() {
        bail!("unknown option `{arg}` for `test-nixl` (it takes none)");
    }
    let mut steps = Steps::new("test-nixl");
    let result = (|| {
        let venv = crate::venv::ensure(&mut steps)?;
        bindgen_setup(&mut steps, &venv)?;
        run(&mut steps, &venv)?;
        let site = crate::ci::build_and_install_wheels(&mut steps, &venv)?;
        pytest(&mut steps, &venv, &site)
    })();
    steps.finish(result)
}
