//! `cargo xtask ci [--no-miri] [--env NAME]...`: everything CI checks, in the order CI checks
//! it.
//!
//! The shape, on CI's two cores: the pinned environment first (every cargo step needs its
//! interpreter and libtorch); the other environments are built in the background while cargo
//! compiles (pip mostly waits on the network and the disk). Then the Rust checks, the
//! [`EXTRA_STEPS`], the wheels, and the pytest suite in every environment, in two background
//! lanes of environments while the pyo3 crate's tests and Miri run in the foreground (each of
//! those mostly keeps one core busy).

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, Result, bail};

use crate::venv::{self, ENVS, Spec, Venv, with_libtorch};
use crate::{Background, Steps, cargo, root, run_status};

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
/// CUDA, Python or libtorch at build time (say which beside each entry). None do: cudarc
/// loads libcuda at run time and builds anywhere, and libtorch (tensorbridge-tch, the
/// benches' `tch` feature) comes from the managed venv, which every cargo command here gets
/// through `LIBTORCH` (see [`ci`]).
const ALL_FEATURES_EXCLUDED: &[&str] = &[
    // `cuda` / `gpu-tests`: candle-core's `cuda` compiles candle's kernels with nvcc (a CUDA
    // toolkit, and an hour of a loaded 2-core machine) and links the CUDA libraries, which
    // would turn the whole build to cudarc's `dynamic-linking`. Checked on its own, with the
    // CUDA toolkit from PyPI, in a target directory of its own (`candle_cuda_check`, with
    // `--candle-cuda`; `test-gpu` builds it).
    "tensorbridge-candle",
    // `candle-cuda`: the candle recipes, candle's CUDA half as above (docs/BUILDING.md,
    // "candle").
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
    "tensorbridge-kernel-example",
];

/// The crates a registry would receive: every workspace member without `publish = false`
/// (a unit test keeps the two lists in step). The `package` step builds each from the
/// `.crate` file `cargo package` makes, against the others' `.crate` files and crates.io,
/// as a registry's user would get them: a path outside the package, a file left out of it or
/// a dependency without a version fails here, so publishing is a decision, not a project.
pub(crate) const PUBLISHED: &[&str] = &[
    "tensorbridge-core",
    "tensorbridge",
    "tensorbridge-dlpack",
    "tensorbridge-cai",
    "tensorbridge-cuda",
    "tensorbridge-cudarc",
    "tensorbridge-pyo3",
    "tensorbridge-tch",
    "tensorbridge-ndarray",
    "tensorbridge-candle",
    "tensorbridge-burn",
];

/// Where the Python package lives, relative to the workspace root.
pub(crate) const PYTHON_CRATE: &str = "crates/tensorbridge-python";

/// The wheels maturin builds: (crate folder, the distribution's name as pip spells it, the
/// start of the wheel's file name). The example extension is the cookbook's Rust recipes,
/// which the Python suite tests.
const WHEELS: &[(&str, &str, &str)] = &[
    (PYTHON_CRATE, "tensorbridge", "tensorbridge-"),
    (EXAMPLE_CRATE, "tensorbridge_example", EXAMPLE_WHEEL_PREFIX),
];

/// The example extension's crate, relative to the workspace root, and the start of its
/// wheels' file names (`test-gpu` builds it a second time, with its candle recipes).
pub(crate) const EXAMPLE_CRATE: &str = "crates/tensorbridge-example";
pub(crate) const EXAMPLE_WHEEL_PREFIX: &str = "tensorbridge_example-";

/// The glibc the wheels are linked against, as the manylinux tag says it: `manylinux_2_28`,
/// the floor of torch's own wheels since 2.6 (so every machine that runs a supported torch
/// installs them), and of RHEL 8, Ubuntu 20.04 (2.31) and Debian 11 (2.31). maturin links
/// with zig (`--zig`) to reach it from a newer build machine; `auditwheel` checks the result.
pub(crate) const MANYLINUX: (u32, u32) = (2, 28);

/// Proptest cases per property under Miri, which runs ~1000x slower than native code.
const MIRI_PROPTEST_CASES: u32 = 8;

/// Steps of other xtask modules that `ci` runs after the Rust checks and before the Python
/// package: each gets the steps and the pinned environment (its libtorch, its interpreter).
/// Add a module's `fn(&mut Steps, &Venv) -> Result<()>` here.
const EXTRA_STEPS: &[fn(&mut Steps, &Venv) -> Result<()>] = &[
    // tensorbridge-tch accepts a range of tch releases: its oldest and newest, each with the
    // libtorch it expects.
    crate::tch_range::run,
    // The declared MSRV is a toolchain CI builds (docs/RELEASES.md, "MSRV").
    crate::release::msrv,
    // Each published crate against the last release tag, once there is one
    // (docs/RELEASES.md, "What CI checks").
    crate::release::semver,
    // The sharing path through the stand-in CUDA driver (a GPU-less machine's only way to
    // run it): tensorbridge-cuda's driver tests.
    crate::standin::run,
    // Instructions per conversion (valgrind's cachegrind) against the committed limits in
    // benches/icount.txt: a conversion that got dearer fails here, on a machine without a
    // GPU (docs/TESTING.md, "The instruction-count gate").
    crate::icount::gate,
    // tensorbridge-nixl against a real NIXL (left out of the `test` step): a tensor moved to
    // a Python process.
    crate::nixl::run,
];

struct Options {
    miri: bool,
    /// The aarch64 lane (`aarch64.rs`); `--no-aarch64` leaves it out of a quick local run.
    aarch64: bool,
    /// `--candle-cuda`: clippy on candle's CUDA half too, the candle crate's and the example
    /// extension's (nvcc builds candle's kernels: long).
    candle_cuda: bool,
    /// The environments whose pytest suite runs ([`ENVS`] by default, `--env` narrows).
    envs: Vec<&'static Spec>,
}

pub(crate) fn run(args: &[String]) -> Result<()> {
    let mut options = Options {
        miri: true,
        aarch64: true,
        candle_cuda: false,
        envs: Vec::new(),
    };
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--no-miri" => options.miri = false,
            "--no-aarch64" => options.aarch64 = false,
            "--candle-cuda" => options.candle_cuda = true,
            "--env" => {
                let name = args.next().context("`--env` needs an environment's name")?;
                let Some(spec) = ENVS.iter().find(|s| s.name == name) else {
                    bail!(
                        "no environment `{name}` (expected one of: {})",
                        ENVS.iter().map(|s| s.name).collect::<Vec<_>>().join(", ")
                    );
                };
                options.envs.push(spec);
            }
            other => bail!(
                "unknown option `{other}` for `ci` (expected --no-miri, --no-aarch64, --candle-cuda, --env NAME)"
            ),
        }
    }
    if options.envs.is_empty() {
        options.envs = ENVS.to_vec();
    }
    let mut steps = Steps::new("ci");
    let result = ci(&mut steps, &options);
    steps.finish(result)
}

fn ci(steps: &mut Steps, options: &Options) -> Result<()> {
    // Before anything is built: a second, and a fresh clone holds only what is committed.
    steps.run("sources only", || crate::artifacts::check(root()))?;
    // First, so that every cargo step below builds pyo3 against the same interpreter
    // (`PYO3_PYTHON`): pyo3's build script reruns, and pyo3 and its dependents rebuild,
    // whenever the interpreter it finds changes.
    let venv = venv::ensure(steps)?;
    // libclang for nixl-sys's bindgen, for every cargo command below (`Venv::cargo`).
    crate::nixl::bindgen_setup(steps, &venv)?;
    // The other environments meanwhile (the pinned one is ready, so none of them waits for
    // it): pip downloads and unpacks while cargo compiles.
    let others: Vec<&'static Spec> = options
        .envs
        .iter()
        .copied()
        .filter(|s| s.name != venv.name())
        .collect();
    let environments = steps.background(
        "environments",
        &logs_dir().join("environments.log"),
        move |bg| {
            others
                .into_iter()
                .map(|spec| venv::ensure_spec(bg, spec))
                .collect::<Result<Vec<Venv>>>()
        },
    )?;
    // What the aarch64 lane needs (the Rust target, qemu, the arm64 sysroot): downloads,
    // meanwhile too.
    let aarch64_tools = if options.aarch64 {
        let venv = venv.clone();
        Some(steps.background(
            "aarch64 tools",
            &logs_dir().join("aarch64-tools.log"),
            move |bg| crate::aarch64::tools(bg, &venv),
        )?)
    } else {
        steps.skip("aarch64", "--no-aarch64");
        None
    };
    let rust = rust_checks(steps, &venv).and_then(|()| {
        if options.candle_cuda {
            candle_cuda_check(steps, &venv)
        } else {
            // candle-kernels compiles candle's quantized and MoE kernels for sm_90a with nvcc
            // in its build script, also for clippy: far more than the rest of CI on 2 cores
            // (docs/BUILDING.md, "candle"). `test-gpu --bundle` builds it, with its GPU tests.
            steps.skip(
                "clippy tensorbridge-candle and tensorbridge-example with candle CUDA",
                "opt in with --candle-cuda; test-gpu --bundle builds them",
            );
            Ok(())
        }
    });
    // Joined whatever happened, so that no pip is left running and its failure is reported.
    let others = environments.join(steps);
    let ready = rust.and(others);
    let aarch64_tools = match (ready.is_ok(), aarch64_tools) {
        (true, tools) => tools,
        (false, Some(tools)) => {
            let _ = tools.join(steps);
            None
        }
        (false, None) => None,
    };
    let others = ready?;
    let mut envs: Vec<Venv> = Vec::new();
    if options.envs.iter().any(|s| s.name == venv.name()) {
        envs.push(venv.clone());
    }
    envs.extend(others);
    python(steps, &venv, envs, options.miri, aarch64_tools)
}

/// fmt, clippy, the Rust tests, rustdoc, and the [`EXTRA_STEPS`].
fn rust_checks(steps: &mut Steps, venv: &Venv) -> Result<()> {
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
    // Includes the doctests (tensorbridge-tch's load libtorch through its build script's
    // rpath, as its other test binaries do).
    let mut test = torch_cargo();
    test.args(["test", "--workspace"]);
    for package in PYTHON_PACKAGES {
        test.args(["--exclude", package]);
    }
    // Its test needs NIXL's library on the loader's path: `nixl::run`, an extra step.
    test.args(["--exclude", "tensorbridge-nixl"]);
    steps.cmd("test", &mut test)?;
    steps.cmd(
        "doc",
        torch_cargo()
            .args(["doc", "--workspace", "--no-deps"])
            .env("RUSTDOCFLAGS", "-D warnings"),
    )?;
    // `--allow-dirty`: CI's checkout is clean; a developer's uncommitted changes are what
    // they want checked. Needs `LIBTORCH` (tensorbridge-tch) and the interpreter (pyo3).
    forget_packaged_sources()?;
    let mut package = torch_cargo();
    package.args(["package", "--allow-dirty"]);
    for crate_name in PUBLISHED {
        package.args(["-p", crate_name]);
    }
    steps.cmd("package", &mut package)?;
    for step in EXTRA_STEPS {
        step(steps, venv)?;
    }
    Ok(())
}

/// Removes the workspace's own crates from the sources cargo unpacked out of earlier
/// `cargo package` runs. Packaging several crates verifies each against the others through
/// a temporary local registry, whose unpacked sources land in `registry/src/-<hash>/` of
/// cargo's home, named by crate and version only. Cargo reuses an unpacked directory that is
/// already there, so on a machine that packaged the same version before, a crate would be
/// verified against its siblings' *old* sources (a CI runner's kept home did exactly that:
/// a function added to the core "did not exist"). Only local registries (the `-` prefix)
/// and only this workspace's crates are touched; crates.io's sources stay.
fn forget_packaged_sources() -> Result<()> {
    let src = crate::cargo_home()?.join("registry").join("src");
    let Ok(registries) = fs::read_dir(&src) else {
        return Ok(()); // nothing unpacked yet
    };
    for registry in registries {
        let registry = registry?;
        if !registry.file_name().to_string_lossy().starts_with('-') {
            continue;
        }
        for unpacked in fs::read_dir(registry.path())? {
            let unpacked = unpacked?;
            let name = unpacked.file_name();
            let name = name.to_string_lossy();
            let ours = PUBLISHED.iter().any(|published| {
                name.strip_prefix(published)
                    .and_then(|rest| rest.strip_prefix('-'))
                    .is_some_and(|version| version.starts_with(|c: char| c.is_ascii_digit()))
            });
            if ours {
                fs::remove_dir_all(unpacked.path())
                    .with_context(|| format!("removing {}", unpacked.path().display()))?;
            }
        }
    }
    Ok(())
}

/// The Python package: both wheels built (manylinux_2_28, checked by auditwheel) and
/// installed into each environment's own folder; the pytest suite in every environment, in
/// background lanes, while the pyo3 crate's Rust tests (against the pinned environment's
/// libpython) and Miri run here. With `aarch64_tools` (being installed in the background),
/// a lane of its own for aarch64 (`aarch64.rs`): the wheel, its checks and smoke tests under
/// qemu, `cargo check` of the workspace for the target.
fn python(
    steps: &mut Steps,
    venv: &Venv,
    envs: Vec<Venv>,
    miri: bool,
    aarch64_tools: Option<Background<crate::aarch64::Tools>>,
) -> Result<()> {
    let built = build_wheels(steps, venv)
        .and_then(|mut wheels| {
            wheels.extend(build_wheels_py312(steps, venv)?);
            Ok(wheels)
        })
        .and_then(|wheels| check_manylinux(steps, venv, &wheels));
    let aarch64_tools = match (built, aarch64_tools) {
        (Ok(()), tools) => tools,
        (Err(e), tools) => {
            if let Some(tools) = tools {
                let _ = tools.join(steps);
            }
            return Err(e);
        }
    };
    let mut lanes: Vec<Background<()>> = Vec::new();
    // The aarch64 lane: its cargo steps use target directories no other step of this phase
    // builds in (`target/wheel-aarch64-*`, and `target/` only once the pyo3 crate's tests
    // are built: its check waits for their lock at worst).
    if let Some(tools) = aarch64_tools {
        let venv = venv.clone();
        lanes.push(steps.background(
            "aarch64 lane",
            &logs_dir().join("aarch64.log"),
            move |bg| {
                let tools = tools.join(bg)?;
                crate::aarch64::lane(bg, &venv, &tools)
            },
        )?);
    }
    // Two lanes of environments, one after another in each: with Miri (mostly one core) in
    // the foreground that is three processes on CI's two cores until Miri ends, two after.
    for (lane, envs) in split_lanes(envs, PYTEST_LANES).into_iter().enumerate() {
        let name = format!("pytest lane {}", lane + 1);
        let log = logs_dir().join(format!("pytest-{}.log", lane + 1));
        lanes.push(steps.background(&name, &log, move |bg| {
            let mut failed = Vec::new();
            for env in &envs {
                if let Err(e) = pytest(bg, env) {
                    bg.note(&format!("==> pytest ({}) failed: {e:#}", env.name()));
                    failed.push(env.name());
                }
            }
            if !failed.is_empty() {
                bail!("the pytest suite failed in: {}", failed.join(", "));
            }
            Ok(())
        })?);
    }
    let foreground = pyo3_tests(steps, venv).and_then(|()| {
        if miri {
            self::miri(steps)
        } else {
            steps.skip("miri", "--no-miri");
            Ok(())
        }
    });
    let mut suites = Ok(());
    for lane in lanes {
        // Every lane is joined (and its output shown) even when one failed.
        suites = suites.and(lane.join(steps));
    }
    foreground.and(suites)
}

/// candle's CUDA half through clippy: `tensorbridge-candle --features gpu-tests` and the
/// example extension's candle recipes (`--features candle-cuda`), with the CUDA toolkit from
/// PyPI (`cuda_toolkit`), in `target/candle-cuda`: its cudarc links the CUDA libraries
/// instead of loading them, so sharing the main target directory would rebuild cudarc's
/// dependents whenever the two alternate. In release, as `test-gpu` builds the same two
/// (`candle_gpu`, the example wheel), so that the three reuse one compilation of candle's
/// kernels per package instead of adding a debug one (docs/BUILDING.md, "candle"). Their GPU
/// tests run from the bundle.
fn candle_cuda_check(steps: &mut Steps, venv: &Venv) -> Result<()> {
    let toolkit = crate::cuda_toolkit::ensure(steps, &venv.python())?;
    for (package, feature) in [
        ("tensorbridge-candle", "gpu-tests"),
        ("tensorbridge-example", "candle-cuda"),
    ] {
        let mut clippy = venv.cargo();
        clippy
            .args([
                "clippy",
                "--release",
                "-p",
                package,
                "--all-targets",
                "--features",
                feature,
                "--",
                "-D",
                "warnings",
            ])
            .env("CARGO_PROFILE_RELEASE_STRIP", "symbols")
            .env(
                "CARGO_TARGET_DIR",
                root().join("target").join("candle-cuda"),
            );
        toolkit.apply(&mut clippy);
        steps.cmd(
            &format!("clippy {package} --features {feature} (candle CUDA)"),
            &mut clippy,
        )?;
    }
    Ok(())
}

/// How many environments' pytest suites run at once ([`python`]).
const PYTEST_LANES: usize = 2;

/// `envs` dealt round-robin into at most `lanes` non-empty lanes, so that the pinned (first)
/// and the newest (second), the longest suites, are in different lanes.
fn split_lanes<T>(envs: Vec<T>, lanes: usize) -> Vec<Vec<T>> {
    let mut out: Vec<Vec<T>> = (0..lanes.max(1)).map(|_| Vec::new()).collect();
    for (i, env) in envs.into_iter().enumerate() {
        out[i % lanes.max(1)].push(env);
    }
    out.retain(|lane| !lane.is_empty());
    out
}

/// The pyo3 crate's tests, embedding the pinned environment's libpython; and the README's
/// kernel recipe, built as the extension module a kernel crate makes from it with the facade
/// alone (`tensorbridge-kernel-example`), and tested.
fn pyo3_tests(steps: &mut Steps, venv: &Venv) -> Result<()> {
    steps.cmd(
        "python: cargo build -p tensorbridge-kernel-example",
        venv.cargo()
            .args(["build", "-p", "tensorbridge-kernel-example"]),
    )?;
    match venv.libpython_dir()? {
        Some(libdir) => steps.cmd(
            "python: cargo test -p tensorbridge-pyo3 -p tensorbridge-kernel-example",
            venv.cargo()
                .args([
                    "test",
                    "-p",
                    "tensorbridge-pyo3",
                    "-p",
                    "tensorbridge-kernel-example",
                ])
                .env("LD_LIBRARY_PATH", prepend_path(&libdir)),
        ),
        None => {
            steps.skip(
                "python: cargo test -p tensorbridge-pyo3 -p tensorbridge-kernel-example",
                "the environment's interpreter has no shared libpython to embed; the pytest suite covers the crate",
            );
            Ok(())
        }
    }
}

/// The wheels installed for `env` (as pip chooses among both builds), then the whole
/// pytest suite but the GPU one, in `env` (its NIXL tests skip there); then the NIXL tests
/// again, with NIXL, in a process of their own (`nixl::pytest`); then the driver tests (`test_share_driver.py`,
/// which skip in the suite's run for want of a libcuda) again through the stand-in driver
/// that the Rust checks built (`standin.rs`).
fn pytest(steps: &mut Steps, env: &Venv) -> Result<()> {
    let site = install_wheels(steps, env)?;
    let tests = root().join(PYTHON_CRATE).join("tests");
    let suite = steps.cmd(
        &format!("pytest ({})", env.name()),
        &mut pytest_cmd(env, &site, &tests, &[tests.as_path()]),
    );
    let nixl = crate::nixl::pytest(steps, env, &site);
    let standin = pytest_standin(steps, env, &site);
    suite.and(nixl).and(standin)
}

/// The Python package's tests that need a CUDA driver, the real one or the stand-in: the
/// sharing path, the sharing protocol's trust model (ARCHITECTURE.md), and the CUDA half of
/// `tensorbridge.nixl`'s descriptors.
pub(crate) const DRIVER_TESTS: &[&str] = &[
    "test_share_driver.py",
    "test_share_trust.py",
    "test_nixl_driver.py",
];

/// [`DRIVER_TESTS`] in `env` with the wheels of `site`, through the stand-in driver
/// (`standin.rs`, built before), failing rather than skipping when it does not load.
pub(crate) fn pytest_standin(steps: &mut Steps, env: &Venv, site: &Path) -> Result<()> {
    let tests = root().join(PYTHON_CRATE).join("tests");
    let driver: Vec<PathBuf> = DRIVER_TESTS.iter().map(|t| tests.join(t)).collect();
    let paths: Vec<&Path> = driver.iter().map(PathBuf::as_path).collect();
    steps.cmd(
        &format!(
            "pytest {} on the stand-in driver ({})",
            DRIVER_TESTS.join(" "),
            env.name()
        ),
        pytest_cmd(env, site, &tests, &paths)
            .env("LD_LIBRARY_PATH", crate::standin::library_path())
            .env("TB_REQUIRE_DRIVER", "1"),
    )
}

/// `python -m pytest` in `env` with the wheels of `site` ([`install_wheels`]) importable
/// (`PYTHONPATH`, which the suite's subprocesses inherit), over `paths`; the GPU suite is
/// left out unless `paths` names it (it runs on a GPU machine: `cargo xtask test-gpu`).
pub(crate) fn pytest_cmd(env: &Venv, site: &Path, tests: &Path, paths: &[&Path]) -> Command {
    let mut cmd = env.python_cmd();
    cmd.args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir"])
        .arg(tests)
        .args(paths);
    if !paths.iter().any(|p| p.starts_with(tests.join("gpu"))) {
        cmd.arg("--ignore").arg(tests.join("gpu"));
    }
    cmd.env("PYTHONPATH", python_path(site)).current_dir(root());
    cmd
}

/// `site`, then the caller's `PYTHONPATH`.
fn python_path(site: &Path) -> std::ffi::OsString {
    python_path_with(&[site])
}

/// `dirs` in order, then the caller's `PYTHONPATH`.
pub(crate) fn python_path_with(dirs: &[&Path]) -> std::ffi::OsString {
    let mut path = std::ffi::OsString::new();
    for dir in dirs {
        if !path.is_empty() {
            path.push(":");
        }
        path.push(dir.as_os_str());
    }
    if let Some(old) = env::var_os("PYTHONPATH").filter(|p| !p.is_empty()) {
        path.push(":");
        path.push(old);
    }
    path
}

/// Where `ci`'s background steps write their output.
fn logs_dir() -> PathBuf {
    root().join("target").join("xtask-logs")
}

/// Installs the wheels built in `target/wheels` and `target/wheels-py312` into
/// `target/python/<env>` (made afresh; the shared environment itself stays as its
/// requirements made it), letting pip choose between the two builds as it does for users,
/// and checks its choice: the abi3-py312 build on CPython 3.12 and later, abi3-py39 below.
/// Returns the folder, for `PYTHONPATH`.
pub(crate) fn install_wheels(steps: &mut Steps, env: &Venv) -> Result<PathBuf> {
    let site = root().join("target").join("python").join(env.name());
    venv::remove_dir(&site)?;
    let mut pip = env.pip_install();
    pip.args(["--no-index", "--no-deps", "--find-links"])
        .arg(wheels_dir(None))
        .arg("--find-links")
        .arg(wheels_dir(Some("abi3-py312")))
        .arg("--target")
        .arg(&site);
    for (_, dist, _) in WHEELS {
        pip.arg(dist);
    }
    steps.cmd(
        &format!("python: install the wheels ({})", env.name()),
        &mut pip,
    )?;
    let (major, minor) = env.python_version()?;
    let want = if (major, minor) >= (3, 12) {
        "cp312-abi3"
    } else {
        "cp39-abi3"
    };
    for (_, dist, _) in WHEELS {
        let tags = installed_tags(&site, dist)?;
        if !tags.iter().any(|t| t.starts_with(want)) {
            bail!(
                "pip installed {dist} tagged {tags:?} for CPython {major}.{minor} in {}; \
                 expected the {want} build",
                env.name()
            );
        }
        steps.note(&format!(
            "==> {}: {dist} {} (CPython {major}.{minor})",
            env.name(),
            tags.join(" ")
        ));
    }
    Ok(site)
}

/// The `Tag:` lines of the installed distribution `dist`'s WHEEL file under `site`.
fn installed_tags(site: &Path, dist: &str) -> Result<Vec<String>> {
    let entries = fs::read_dir(site).with_context(|| format!("listing {}", site.display()))?;
    for entry in entries {
        let name = entry?.file_name().to_string_lossy().into_owned();
        if name.starts_with(&format!("{dist}-")) && name.ends_with(".dist-info") {
            let wheel = site.join(&name).join("WHEEL");
            let text = fs::read_to_string(&wheel)
                .with_context(|| format!("reading {}", wheel.display()))?;
            return Ok(text
                .lines()
                .filter_map(|l| l.strip_prefix("Tag:"))
                .map(|t| t.trim().to_owned())
                .collect());
        }
    }
    bail!("no {dist}-*.dist-info in {}", site.display())
}

/// Builds the wheels ([`build_wheels`]) and installs them for the pinned environment
/// ([`install_wheels`]); returns the folder to put on `PYTHONPATH`.
pub(crate) fn build_and_install_wheels(steps: &mut Steps, venv: &Venv) -> Result<PathBuf> {
    build_wheels(steps, venv)?;
    install_wheels(steps, venv)
}

/// The folder `maturin` writes one build's wheels into: `target/wheels` for the default
/// abi3-py39 build, `target/wheels-py312` for `abi3-py312`.
fn wheels_dir(abi: Option<&str>) -> PathBuf {
    root().join("target").join(match abi {
        None => "wheels".to_owned(),
        Some(feature) => format!("wheels-{}", feature.trim_start_matches("abi3-")),
    })
}

/// `maturin build --release` of each of [`WHEELS`] into `target/wheels` (older wheels of
/// the same package removed first, so exactly one of each is there); returns their paths.
/// These are the `abi3-py39` wheels: one for every CPython from 3.9.
pub(crate) fn build_wheels(steps: &mut Steps, venv: &Venv) -> Result<Vec<PathBuf>> {
    build_wheels_into(steps, venv, None)
}

/// The same wheels for CPython 3.12 and later (`cp312-abi3`, feature `abi3-py312`), into
/// `target/wheels-py312`: the limited API has vectorcall and METH_FASTCALL only from 3.12,
/// so these call Python and are called faster (docs/BENCHMARKS.md). pip prefers them over
/// the 3.9 ones where both fit. Built without asking an interpreter (`PYO3_NO_PYTHON`: the
/// build machine's may be older than 3.12).
pub(crate) fn build_wheels_py312(steps: &mut Steps, venv: &Venv) -> Result<Vec<PathBuf>> {
    build_wheels_into(steps, venv, Some("abi3-py312"))
}

/// Both builds link with zig against glibc [`MANYLINUX`] (`--zig --compatibility`), each in
/// a target directory of its own (`target/wheel-<abi>`): zig's linker and C compiler would
/// otherwise make every other release build in `target/` rebuild, and the two builds each
/// other.
fn build_wheels_into(steps: &mut Steps, venv: &Venv, abi: Option<&str>) -> Result<Vec<PathBuf>> {
    maturin_wheels(steps, venv, WHEELS, abi, None, &system_libgcc_s()?)
}

/// The Python package's wheel for aarch64 Linux (abi3-py39, manylinux_2_28), cross-compiled
/// with zig into `target/wheels-aarch64` (its own target directory,
/// `target/wheel-aarch64-abi3-py39`), linking `libgcc_s`, an arm64 `libgcc_s.so.1` (the
/// sysroot's: `aarch64.rs`). Only the package users install: the example extension serves
/// the x86-64 suite's cookbook tests. Only the abi3-py39 build: the smoke tests' arm64
/// CPython is 3.11, which would not test a 3.12 one.
pub(crate) fn build_wheel_aarch64(
    steps: &mut Steps,
    venv: &Venv,
    libgcc_s: &Path,
) -> Result<PathBuf> {
    let built = maturin_wheels(
        steps,
        venv,
        &WHEELS[..1],
        None,
        Some(crate::aarch64::TARGET),
        libgcc_s,
    )?;
    let [wheel] = built.as_slice() else {
        bail!("expected one aarch64 wheel, built {built:?}");
    };
    let name = wheel.file_name().unwrap_or_default().to_string_lossy();
    if !name.ends_with("_aarch64.whl") {
        bail!("the aarch64 build made {name}, which is not tagged for aarch64");
    }
    Ok(wheel.clone())
}

/// `maturin build --release --zig` of `wheels` for the stable ABI `abi` (`None`:
/// abi3-py39) and the Rust target `target` (`None`: the build machine's), linking
/// `libgcc_s` (of the target's architecture); returns the wheels' paths.
fn maturin_wheels(
    steps: &mut Steps,
    venv: &Venv,
    wheels: &[(&str, &str, &str)],
    abi: Option<&str>,
    target: Option<&str>,
    libgcc_s: &Path,
) -> Result<Vec<PathBuf>> {
    let out = match target {
        None => wheels_dir(abi),
        Some(_) => cross_wheels_dir(),
    };
    let target_dir = match target {
        None => format!("wheel-{}", abi.unwrap_or("abi3-py39")),
        Some(_) => format!("wheel-aarch64-{}", abi.unwrap_or("abi3-py39")),
    };
    let (glibc_major, glibc_minor) = MANYLINUX;
    let mut built = Vec::new();
    for (folder, _, prefix) in wheels {
        for old in wheels_in(&out, prefix)? {
            fs::remove_file(&old).with_context(|| format!("removing {}", old.display()))?;
        }
        let mut maturin = venv.python_cmd();
        maturin
            .args([
                "-m",
                "maturin",
                "build",
                "--release",
                "--zig",
                "--compatibility",
            ])
            .arg(format!("manylinux_{glibc_major}_{glibc_minor}"))
            .arg("--manifest-path")
            .arg(root().join(folder).join("Cargo.toml"))
            .arg("--out")
            .arg(&out)
            .env("CARGO_TARGET_DIR", root().join("target").join(&target_dir));
        if let Some(target) = target {
            maturin.args(["--target", target]);
        }
        if let Some(feature) = abi {
            maturin
                .args(["--no-default-features", "--features", feature])
                .env("PYO3_NO_PYTHON", "1");
        }
        // One unwinder: zig replaces `-lgcc_s` (which Rust's std asks for) with a static copy
        // of LLVM's libunwind, hidden in the module, while glibc's `pthread_exit` and
        // `pthread_cancel` unwind with libgcc_s. A forced unwind through our frames then
        // handed libgcc_s's context to libunwind's accessors from Rust's personality routine
        // (SIGSEGV at exit). Given libgcc_s itself, zig links it and leaves its own copy out;
        // `check_manylinux` checks the result (`one_unwinder`).
        maturin
            .arg("--")
            .arg("-C")
            .arg(format!("link-arg={}", libgcc_s.display()));
        steps.cmd(
            &format!(
                "python: maturin build {folder} {}{}",
                abi.unwrap_or("abi3-py39"),
                target.map(|t| format!(" --target {t}")).unwrap_or_default()
            ),
            &mut maturin,
        )?;
        match wheels_in(&out, prefix)?.as_slice() {
            [one] => built.push(one.clone()),
            found => bail!(
                "expected one {prefix}*.whl in {} after maturin, found {found:?}",
                out.display()
            ),
        }
    }
    Ok(built)
}

/// Where the aarch64 wheel is written.
fn cross_wheels_dir() -> PathBuf {
    root().join("target").join("wheels-aarch64")
}

/// The build machine's `libgcc_s.so.1` (as its C compiler finds it), which the wheels link
/// (`build_wheels_into`). Every manylinux system has it; its `_Unwind_*` symbols carry GCC
/// 3.x / 4.2 versions, which every manylinux policy allows.
fn system_libgcc_s() -> Result<PathBuf> {
    let out = Command::new("cc")
        .arg("-print-file-name=libgcc_s.so.1")
        .output()
        .context(
            "running `cc -print-file-name=libgcc_s.so.1` (a C compiler is needed to find libgcc_s)",
        )?;
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if !out.status.success() || !path.is_absolute() || !path.is_file() {
        bail!(
            "the C compiler found no libgcc_s.so.1 (it answered {:?}); the wheels link it so \
             that they use one unwinder",
            path
        );
    }
    path.canonicalize()
        .with_context(|| format!("resolving {}", path.display()))
}

/// The wheels' architectures, as their platform tags end, and as `readelf -h` names the
/// machine of an ELF module built for each.
const ELF_MACHINES: &[(&str, &str)] = &[
    ("x86_64", "Advanced Micro Devices X86-64"),
    ("aarch64", "AArch64"),
];

/// The ELF machine a wheel's modules must be built for, from its file name's platform tag.
fn tagged_machine(wheel_name: &str) -> Option<&'static str> {
    ELF_MACHINES
        .iter()
        .find(|(arch, _)| wheel_name.ends_with(&format!("_{arch}.whl")))
        .map(|(_, machine)| *machine)
}

/// The `Machine:` of `readelf -h`'s output.
fn elf_machine(header: &str) -> Option<&str> {
    header
        .lines()
        .find_map(|l| l.trim().strip_prefix("Machine:"))
        .map(str::trim)
}

/// Symbol prefixes of an unwinder's implementation: the `_Unwind_*` ABI and LLVM libunwind's
/// own `__unw_*` / `unw_*` entry points.
const UNWINDER_SYMBOLS: &[&str] = &["_Unwind_", "__unw_", "unw_"];

/// Whether a wheel's extension module uses exactly one unwinder, the system's: it depends on
/// `libgcc_s.so.1` (what glibc's `pthread_exit` unwinds with) and defines no unwinder of its
/// own, exported or hidden (`defined`: every defined symbol, local ones included), nor holds
/// LLVM libunwind's messages (`libunwind_text`: a stripped copy). The problems, in words.
fn one_unwinder(needed: &[&str], defined: &[&str], libunwind_text: bool) -> Vec<String> {
    let mut problems = Vec::new();
    if !needed.contains(&"libgcc_s.so.1") {
        problems.push(format!(
            "does not depend on libgcc_s.so.1 (NEEDED: {}): Rust's panics would unwind with \
             another unwinder than glibc's pthread_exit",
            needed.join(", ")
        ));
    }
    let own: Vec<&str> = defined
        .iter()
        .copied()
        .filter(|s| UNWINDER_SYMBOLS.iter().any(|p| s.starts_with(p)))
        .collect();
    if !own.is_empty() {
        problems.push(format!(
            "defines its own unwinder ({}{}): two unwinders would meet in one unwind",
            own.iter().take(4).copied().collect::<Vec<_>>().join(", "),
            if own.len() > 4 { ", ..." } else { "" }
        ));
    }
    if libunwind_text {
        problems.push("holds LLVM libunwind's messages (\"libunwind: \"): a bundled copy".into());
    }
    problems
}

/// [`one_unwinder`] on every extension module in `wheel` (unpacked by the environment's
/// Python into a scratch folder, read with binutils' `readelf` and `nm`, which read an
/// aarch64 module as well), and each module built for the architecture its tag names.
fn check_one_unwinder(venv: &Venv, wheel: &Path) -> Result<()> {
    // Named after the wheel too: the aarch64 lane checks its wheel beside other steps.
    let scratch = env::temp_dir().join(format!(
        "tensorbridge-unwinder-{}-{}",
        std::process::id(),
        wheel.file_name().unwrap_or_default().to_string_lossy()
    ));
    let _ = fs::remove_dir_all(&scratch);
    fs::create_dir_all(&scratch).with_context(|| format!("creating {}", scratch.display()))?;
    let unpack = "import sys, zipfile\n\
                  z = zipfile.ZipFile(sys.argv[1])\n\
                  for n in z.namelist():\n    \
                      if n.endswith('.so'): print(z.extract(n, sys.argv[2]))\n";
    let out = venv
        .python_cmd()
        .args(["-c", unpack])
        .arg(wheel)
        .arg(&scratch)
        .output()
        .context("unpacking the wheel")?;
    if !out.status.success() {
        bail!(
            "unpacking {}: {}",
            wheel.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let modules: Vec<PathBuf> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(PathBuf::from)
        .collect();
    if modules.is_empty() {
        bail!("{} holds no extension module", wheel.display());
    }
    let wheel_name = wheel.file_name().unwrap_or_default().to_string_lossy();
    let machine = tagged_machine(&wheel_name)
        .with_context(|| format!("{wheel_name}: no known architecture in its platform tag"))?;
    let mut problems = Vec::new();
    for module in &modules {
        let tool = |program: &str, args: &[&str]| -> Result<String> {
            let out = Command::new(program)
                .args(args)
                .arg(module)
                .output()
                .with_context(|| format!("running {program} (binutils)"))?;
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        };
        let header = tool("readelf", &["-hW"])?;
        let found = elf_machine(&header).unwrap_or("none");
        if found != machine {
            problems.push(format!(
                "{}: an ELF module for {found:?}, in a wheel tagged for {machine:?}",
                module.display()
            ));
        }
        let dynamic = tool("readelf", &["-dW"])?;
        let needed: Vec<&str> = dynamic
            .lines()
            .filter(|l| l.contains("(NEEDED)"))
            .filter_map(|l| l.split_once('[')?.1.split_once(']').map(|(n, _)| n))
            .collect();
        // The full symbol table (hidden symbols included) and the dynamic one (a stripped
        // module has only that).
        let symbols = tool("nm", &["--defined-only"])? + &tool("nm", &["-D", "--defined-only"])?;
        let defined: Vec<&str> = symbols
            .lines()
            .filter_map(|l| l.split_whitespace().nth(2))
            .collect();
        let bytes = fs::read(module).with_context(|| format!("reading {}", module.display()))?;
        let text = bytes.windows(11).any(|w| w == b"libunwind: ");
        for p in one_unwinder(&needed, &defined, text) {
            problems.push(format!("{}: {p}", module.display()));
        }
    }
    let _ = fs::remove_dir_all(&scratch);
    if !problems.is_empty() {
        bail!("{}:\n  {}", wheel.display(), problems.join("\n  "));
    }
    Ok(())
}

/// `auditwheel show` on each wheel: its file name must carry `manylinux_2_28` (or older),
/// and the symbols it links must allow that tag (auditwheel's own reading of the binary,
/// not maturin's). And one unwinder in each ([`one_unwinder`]).
pub(crate) fn check_manylinux(steps: &mut Steps, venv: &Venv, wheels: &[PathBuf]) -> Result<()> {
    for wheel in wheels {
        let name = wheel
            .file_name()
            .context("a wheel has a file name")?
            .to_string_lossy()
            .into_owned();
        steps.run(&format!("python: one unwinder in {name}"), || {
            check_one_unwinder(venv, wheel)
        })?;
        steps.run(&format!("python: auditwheel show {name}"), || {
            let out = venv
                .python_cmd()
                .args(["-m", "auditwheel", "show"])
                .arg(wheel)
                .output()
                .context("running auditwheel")?;
            let text = String::from_utf8_lossy(&out.stdout).replace('\n', " ");
            if !out.status.success() {
                bail!(
                    "auditwheel show exited with {}: {text} {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            let tagged = manylinux_of(&name)
                .with_context(|| format!("{name} has no manylinux_2_* platform tag"))?;
            let allowed = text
                .split_once("constrains the platform tag to")
                .and_then(|(_, rest)| manylinux_of(rest))
                .with_context(|| format!("auditwheel named no manylinux tag for {name}: {text}"))?;
            if tagged > MANYLINUX || allowed > tagged {
                bail!(
                    "{name}: tagged manylinux_{}_{}, its symbols need manylinux_{}_{}; \
                     expected manylinux_{}_{} or older",
                    tagged.0,
                    tagged.1,
                    allowed.0,
                    allowed.1,
                    MANYLINUX.0,
                    MANYLINUX.1
                );
            }
            println!(
                "{name}: manylinux_{}_{} (auditwheel: its symbols allow manylinux_{}_{})",
                tagged.0, tagged.1, allowed.0, allowed.1
            );
            Ok(())
        })?;
    }
    Ok(())
}

/// The first `manylinux_A_B` in `s`, as (A, B).
fn manylinux_of(s: &str) -> Option<(u32, u32)> {
    let rest = &s[s.find("manylinux_")? + "manylinux_".len()..];
    let mut parts = rest.splitn(3, '_');
    let major = parts.next()?.parse().ok()?;
    let minor: String = parts
        .next()?
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    Some((major, minor.parse().ok()?))
}

/// The wheels in `dir` whose file name starts with `prefix` (none when `dir` does not exist).
pub(crate) fn wheels_in(dir: &Path, prefix: &str) -> Result<Vec<PathBuf>> {
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

/// Miri on each of [`MIRI_PACKAGES`], after installing what it needs.
fn miri(steps: &mut Steps) -> Result<()> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manylinux_tags_parse() {
        assert_eq!(
            manylinux_of("tensorbridge-0.1.0-cp39-abi3-manylinux_2_28_x86_64.whl"),
            Some((2, 28))
        );
        assert_eq!(
            manylinux_of(r#" "manylinux_2_17_x86_64". In order"#),
            Some((2, 17))
        );
        assert_eq!(manylinux_of("linux_x86_64"), None);
        assert!((2, 34) > MANYLINUX && (2, 17) < MANYLINUX);
    }

    #[test]
    fn modules_are_built_for_the_tagged_architecture() {
        // readelf's own words, from an x86-64 and an aarch64 library of the build machine.
        let x86 = "ELF Header:\n  Class:                             ELF64\n  \
                   Machine:                           Advanced Micro Devices X86-64\n  \
                   Version:                           0x1\n";
        let arm = "  Type:                              DYN (Shared object file)\n  \
                   Machine:                           AArch64\n";
        let x86_wheel = "tensorbridge-0.1.0-cp39-abi3-manylinux_2_28_x86_64.whl";
        let arm_wheel = "tensorbridge-0.1.0-cp39-abi3-manylinux_2_28_aarch64.whl";
        assert_eq!(elf_machine(x86), tagged_machine(x86_wheel));
        assert_eq!(elf_machine(arm), tagged_machine(arm_wheel));
        assert_ne!(elf_machine(x86), tagged_machine(arm_wheel));
        assert_ne!(elf_machine(arm), tagged_machine(x86_wheel));
        assert_eq!(
            tagged_machine("tensorbridge-0.1.0-cp39-abi3-linux_riscv64.whl"),
            None
        );
        assert_eq!(elf_machine("not readelf"), None);
    }

    #[test]
    fn one_unwinder_wants_libgcc_s_and_no_copy_of_its_own() {
        let system = ["libc.so.6", "libgcc_s.so.1"];
        // What the wheels are after the fix: libgcc_s's symbols undefined, none defined.
        assert!(
            one_unwinder(&system, &["PyInit__native", "rust_eh_personality"], false).is_empty()
        );
        // What zig made before: LLVM libunwind hidden inside, no libgcc_s.
        let zig = [
            "libc.so.6",
            "ld-linux-x86-64.so.2",
            "libpthread.so.0",
            "libdl.so.2",
        ];
        let bundled = [
            "_Unwind_GetIP",
            "_Unwind_RaiseException",
            "__unw_get_proc_info",
        ];
        let problems = one_unwinder(&zig, &bundled, true);
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(problems[0].contains("libgcc_s.so.1"), "{problems:?}");
        assert!(problems[1].contains("_Unwind_GetIP"), "{problems:?}");
        // Each condition alone is refused: libgcc_s with a copy beside it (exported or not),
        // a stripped copy, no unwinder at all.
        assert_eq!(
            one_unwinder(&system, &["_Unwind_ForcedUnwind"], false).len(),
            1
        );
        assert_eq!(one_unwinder(&system, &["unw_step"], false).len(), 1);
        assert_eq!(one_unwinder(&system, &[], true).len(), 1);
        assert_eq!(one_unwinder(&["libc.so.6"], &[], false).len(), 1);
    }

    #[test]
    fn every_member_is_published_or_says_it_is_not() {
        let manifest = fs::read_to_string(root().join("Cargo.toml")).expect("the root manifest");
        let members = manifest
            .split("\nmembers = [")
            .nth(1)
            .and_then(|rest| rest.split(']').next())
            .expect("a members list");
        let mut seen = 0;
        for member in members.split(',').map(|m| m.trim().trim_matches('"')) {
            if member.is_empty() {
                continue;
            }
            seen += 1;
            let toml = fs::read_to_string(root().join(member).join("Cargo.toml"))
                .unwrap_or_else(|e| panic!("{member}/Cargo.toml: {e}"));
            let name = toml
                .lines()
                .find_map(|l| l.strip_prefix("name = \""))
                .and_then(|n| n.strip_suffix('"'))
                .unwrap_or_else(|| panic!("{member}/Cargo.toml has a name"));
            let unpublished = toml.lines().any(|l| l.trim() == "publish = false");
            assert_ne!(
                PUBLISHED.contains(&name),
                unpublished,
                "{name}: in PUBLISHED exactly when its manifest lacks `publish = false`"
            );
        }
        assert!(seen >= PUBLISHED.len(), "read {seen} members");
    }

    #[test]
    fn lanes_are_dealt_round_robin() {
        assert_eq!(
            split_lanes(vec![1, 2, 3, 4], 2),
            vec![vec![1, 3], vec![2, 4]]
        );
        assert_eq!(split_lanes(vec![1], 2), vec![vec![1]]);
        assert!(split_lanes(Vec::<u8>::new(), 2).is_empty());
    }

    #[test]
    fn wheel_folders() {
        assert!(wheels_dir(None).ends_with("target/wheels"));
        assert!(wheels_dir(Some("abi3-py312")).ends_with("target/wheels-py312"));
    }
}
