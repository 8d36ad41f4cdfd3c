//! `cargo xtask test-gpu [--bundle DIR] [-- ARGS...]`: the GPU test suite, run here or
//! packed into a bundle for a GPU machine without a Rust toolchain (docs/BUILDING.md, "The GPU
//! bundle").

use std::fs;
use std::io::ErrorKind;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context as _, Result, bail};

use crate::ci::{self, EXAMPLE_CRATE, EXAMPLE_WHEEL_PREFIX, PYTHON_CRATE, build_wheels};
use crate::venv::{self, with_libtorch};
use crate::{Steps, absolute, cargo, display, root, split_passthrough};

/// The test binaries of the GPU suite: (package, the feature that compiles them).
const GPU_TESTS: &[(&str, &str)] = &[
    ("tensorbridge-integration", "gpu-tests"),
    // The CUDA layer's own suite (`cuda_gpu`): hand-off, capture, contexts, pointers,
    // copies, the reaper, borrowed streams, first calls (it re-runs its own binary).
    ("tensorbridge-cuda", "gpu-tests"),
    ("tensorbridge-cudarc", "gpu-tests"),
    // The CUDA layer through a driver (`cuda_driver`): the sharing path across processes.
    // CI runs it on the stand-in driver (`standin.rs`); here it meets the real one.
    ("tensorbridge-cuda", "driver-tests"),
    // Links libtorch: built with the managed venv's (`LIBTORCH`); on the GPU machine its
    // binary finds that machine's libtorch through `run.sh`'s `LD_LIBRARY_PATH`, which is
    // searched before the rpath to this machine's venv.
    ("tensorbridge-tch", "gpu-tests"),
    // tensorbridge-candle's `gpu-tests` is built apart (`build_candle`), not in this list: it
    // needs the CUDA toolkit, and its cudarc links the CUDA libraries, which would turn every
    // binary of this build to linking them.
];

/// The bundle's scripts' shared preamble: where libtorch, libcuda and the CUDA toolkit are
/// (`TB_GPU_LD_LIBRARY_PATH`, or found on the GPU machine at run time).
const LIBPATH_SH: &str = include_str!("../templates/libpath.sh");

pub(crate) fn run(args: &[String]) -> Result<()> {
    let (own, test_args) = split_passthrough(args);
    let mut bundle = None;
    let mut candle_cuda = false;
    let mut own = own.iter();
    while let Some(arg) = own.next() {
        match arg.as_str() {
            "--bundle" => {
                let dir = own.next().context("`--bundle` needs a directory")?;
                bundle = Some(absolute(Path::new(dir))?);
            }
            "--candle-cuda" => candle_cuda = true,
            other => bail!(
                "unknown option `{other}` for `test-gpu` (expected --bundle DIR or \
                 --candle-cuda; pass the test binaries' arguments after `--`)"
            ),
        }
    }
    let mut steps = Steps::new("test-gpu");
    let result = test_gpu(&mut steps, bundle.as_deref(), candle_cuda, test_args);
    steps.finish(result)
}

fn test_gpu(
    steps: &mut Steps,
    bundle: Option<&Path>,
    candle_cuda: bool,
    test_args: &[String],
) -> Result<()> {
    steps.run("devices", || {
        let found = report_devices()?;
        if !found && bundle.is_none() {
            bail!(
                "no NVIDIA GPU found on this machine, so the GPU tests cannot run here; build \
                 a bundle for a GPU machine with `cargo xtask test-gpu --bundle gpu-bundle`"
            );
        }
        Ok(())
    })?;
    // tensorbridge-tch's GPU tests link libtorch; the Python package's GPU suite runs
    // against the wheel, like the CPU suite in `ci`.
    let venv = venv::ensure(steps)?;
    let libtorch = venv.torch_dir()?;
    let mut binaries = steps.run("build (release, stripped)", || {
        build(&libtorch, bundle.is_some())
    })?;
    // candle's CUDA half (its tests and the example extension's candle recipes) is opt-in:
    // candle-kernels compiles candle's quantized and MoE kernels with nvcc, twice (about 20
    // minutes on 2 cores, more than the rest of the bundle), which a user who wants the GPU
    // tests of tch, cudarc or the Python package should not wait for.
    let toolkit = if candle_cuda {
        Some(crate::cuda_toolkit::ensure(steps, &venv.python())?)
    } else {
        steps.skip(
            "candle's CUDA half (candle_gpu, the example extension's candle recipes)",
            "opt in with --candle-cuda; test_gpu_candle.py then skips, saying so",
        );
        None
    };
    if let Some(toolkit) = &toolkit {
        // Built apart, with a CUDA toolkit (`cuda_toolkit`), see `build_candle`.
        binaries.extend(
            steps.run("build candle's GPU tests (release, stripped)", || {
                build_candle(toolkit)
            })?,
        );
    }
    let mut wheels = build_wheels(steps, &venv)?;
    if bundle.is_some() {
        // The GPU machines run CPython 3.12: the bundle carries both builds, and pip picks
        // the 3.12 one there (`--find-links`).
        wheels.extend(ci::build_wheels_py312(steps, &venv)?);
    }
    // manylinux_2_28, as in `ci`: they install on the GPU machine whatever its glibc.
    ci::check_manylinux(steps, &venv, &wheels)?;
    // The example extension once more, with its candle recipes (`test_gpu_candle.py`), for
    // the interpreter that runs the suite: the GPU machine's CPython 3.12, or this venv's.
    let abi = if bundle.is_some() || venv.python_version()? >= (3, 12) {
        "abi3-py312"
    } else {
        "abi3-py39"
    };
    let candle_example = match &toolkit {
        Some(toolkit) => Some(steps.run(
            &format!("build the example extension with candle-cuda ({abi})"),
            || build_candle_example(&venv, toolkit, abi),
        )?),
        None => None,
    };
    let mut python = Python {
        wheels,
        tests: root().join(PYTHON_CRATE).join("tests"),
        examples: root().join(PYTHON_CRATE).join("examples"),
    };
    match bundle {
        Some(dir) => {
            // The example extension the bundle installs is the one with the candle recipes
            // (a superset of the ordinary one: every other recipe is the same code), since
            // one interpreter can import only one `tensorbridge_example`.
            if let Some(candle_example) = candle_example {
                python.wheels.retain(|w| !is_example_wheel(w));
                python.wheels.push(candle_example);
            }
            // The bench groups for the GPU machine: the GPU ones (feature `gpu`) and the CPU
            // ones, so that they are measured on the same quiet host in the same run.
            let benches = steps.run("build the benches (release, stripped)", || {
                build_benches(&libtorch)
            })?;
            steps.run(&format!("bundle into {}", dir.display()), || {
                write_bundle(dir, &binaries, &python, candle_cuda)?;
                write_benches(dir, &benches)
            })
        }
        None => {
            let site = ci::install_wheels(steps, &venv)?;
            if let Some(candle_example) = &candle_example {
                // In place of the ordinary example extension, as in the bundle.
                steps.cmd(
                    "python: install the example extension with candle-cuda",
                    venv.pip_install()
                        .args(["--no-index", "--no-deps", "--upgrade", "--target"])
                        .arg(&site)
                        .arg(candle_example),
                )?;
            }
            let smoke = python.tests.join("test_native_smoke.py");
            // The sharing tests CI runs on the stand-in driver, here on the real one, in a
            // process of their own as in CI: a process reports a dead consumer on stderr
            // once, and the GPU suite's killed-consumer test reads that report.
            let driver: Vec<PathBuf> = ci::DRIVER_TESTS
                .iter()
                .map(|t| python.tests.join(t))
                .collect();
            let driver: Vec<&Path> = driver.iter().map(PathBuf::as_path).collect();
            let gpu = python.tests.join("gpu");
            let mut paths = vec![smoke.as_path()];
            if gpu.is_dir() {
                paths.push(gpu.as_path());
            }
            let gpu_suite = steps.cmd(
                "python: pytest (GPU suite)",
                ci::pytest_cmd(&venv, &site, &python.tests, &paths)
                    .env(CANDLE_ENV, if candle_cuda { "1" } else { "0" }),
            );
            let driver_suite = steps.cmd(
                "python: pytest (the sharing tests on the real driver)",
                &mut ci::pytest_cmd(&venv, &site, &python.tests, &driver),
            );
            let mut failed = Vec::new();
            for bin in &binaries {
                let mut cmd = Command::new(&bin.path);
                cmd.args(test_args);
                if steps.cmd(&format!("run {}", bin.name), &mut cmd).is_err() {
                    failed.push(bin.name.as_str());
                }
            }
            if gpu_suite.is_err() {
                failed.push("the Python GPU suite");
            }
            if driver_suite.is_err() {
                failed.push("the Python sharing tests on the real driver");
            }
            if !failed.is_empty() {
                bail!("GPU tests failed: {}", failed.join(", "));
            }
            Ok(())
        }
    }
}

/// Prints the NVIDIA devices `nvidia-smi -L` lists, or why there are none; true if any.
fn report_devices() -> Result<bool> {
    let out = match Command::new("nvidia-smi").arg("-L").output() {
        Ok(out) => out,
        Err(e) if e.kind() == ErrorKind::NotFound => {
            println!("no GPU found: nvidia-smi is not installed (no NVIDIA driver here)");
            return Ok(false);
        }
        Err(e) => {
            println!("no GPU found: could not run nvidia-smi: {e}");
            return Ok(false);
        }
    };
    if !out.status.success() {
        println!(
            "no GPU found: `nvidia-smi -L` exited with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
        return Ok(false);
    }
    let list = String::from_utf8_lossy(&out.stdout);
    let gpus: Vec<&str> = list.lines().filter(|l| l.starts_with("GPU ")).collect();
    if gpus.is_empty() {
        println!("no GPU found: nvidia-smi lists no devices");
        return Ok(false);
    }
    for gpu in &gpus {
        println!("{gpu}");
    }
    Ok(true)
}

/// A test executable that cargo built.
#[derive(Debug, PartialEq)]
struct TestBinary {
    /// The test target's name (`gpu`), which is also its name in a bundle.
    name: String,
    path: PathBuf,
}

/// The packages and features of the GPU build: the [`GPU_TESTS`], and with `benches` the
/// benches' package with [`BENCH_FEATURES`]. The test build and the bench build
/// ([`build_benches`]) select exactly the same, so that cargo unifies the same features for
/// both and the bench build reuses every dependency the test build compiled (selected
/// apart, criterion's dependencies turned features of shared crates on, and the bench build
/// compiled candle, libtorch's crate and cudarc a second time: 4 of a cold bundle's 19
/// minutes on 2 cores).
fn select(cmd: &mut Command, benches: bool) {
    for (package, feature) in GPU_TESTS {
        cmd.args(["-p", package, "--features", &format!("{package}/{feature}")]);
    }
    if benches {
        for feature in BENCH_FEATURES {
            cmd.args([
                "-p",
                BENCH_PACKAGE,
                "--features",
                &format!("{BENCH_PACKAGE}/{feature}"),
            ]);
        }
    }
}

/// The package of the criterion benches, and the features the bundle builds them with (the
/// GPU groups and libtorch's).
const BENCH_PACKAGE: &str = "tensorbridge-benches";
const BENCH_FEATURES: [&str; 2] = ["gpu", "tch"];

/// Builds the GPU test binaries in release, stripped of symbols (~1 MB each instead of
/// ~10 MB), and returns them. With `benches`, the benches' package is in the same build
/// ([`select`]).
fn build(libtorch: &Path, benches: bool) -> Result<Vec<TestBinary>> {
    let mut cmd = with_libtorch(cargo(), libtorch);
    cmd.args(["test", "--release"]);
    select(&mut cmd, benches);
    cmd.args(["--no-run"])
        .env("CARGO_PROFILE_RELEASE_STRIP", "symbols");
    let messages = cargo_messages(&mut cmd)?;
    let binaries = test_binaries(&messages);
    if binaries.is_empty() {
        bail!("cargo built no test binaries (expected the `gpu` test of tensorbridge-integration)");
    }
    for (i, bin) in binaries.iter().enumerate() {
        if binaries[..i].iter().any(|b| b.name == bin.name) {
            bail!("two GPU test binaries are both named `{}`", bin.name);
        }
        println!("built {} ({})", bin.name, bin.path.display());
    }
    Ok(binaries)
}

/// Builds tensorbridge-candle's GPU test binary (`candle_gpu`), release and stripped, in a
/// target directory of its own with the CUDA toolkit from PyPI: candle-core's `cuda` feature
/// compiles candle's kernels with nvcc and links the CUDA libraries (cudarc's
/// `dynamic-linking`, which takes over the workspace's `fallback-dynamic-loading`: the rest
/// of the suite loads them). On the GPU machine it loads the real libcuda, cuBLAS, cuRAND
/// and the CUDA runtime through `run.sh`'s `LD_LIBRARY_PATH` (the driver's directory,
/// PyTorch's NVIDIA wheels, the CUDA toolkit's `lib64`).
fn build_candle(toolkit: &crate::cuda_toolkit::Toolkit) -> Result<Vec<TestBinary>> {
    let mut cmd = cargo();
    cmd.args([
        "test",
        "--release",
        "-p",
        "tensorbridge-candle",
        "--features",
        "gpu-tests",
        "--no-run",
    ])
    .env("CARGO_PROFILE_RELEASE_STRIP", "symbols")
    .env(
        "CARGO_TARGET_DIR",
        root().join("target").join("candle-cuda"),
    );
    toolkit.apply(&mut cmd);
    let binaries = test_binaries(&cargo_messages(&mut cmd)?);
    if binaries.is_empty() {
        bail!("cargo built no candle GPU test binary (expected `candle_gpu`)");
    }
    Ok(binaries)
}

/// The example extension (`tensorbridge_example`) with its `candle-cuda` feature, as a wheel
/// for the stable ABI `abi` (`abi3-py312` or `abi3-py39`) in `target/wheels-candle-cuda`:
/// built like [`build_candle`] (in `target/candle-cuda`, with the CUDA toolkit), release,
/// stripped. candle's kernels are compiled once for this wheel and once for `candle_gpu`
/// (their build dependencies resolve with different features, so each gets its own build
/// script output), then kept in that directory (docs/BUILDING.md, "candle"). Tagged
/// `linux_x86_64` and not
/// repaired: it links libcuda and the CUDA libraries that candle-core links (cuBLAS, cuRAND,
/// the CUDA runtime), which the GPU machine's driver and PyTorch provide (`libpath.sh` puts
/// them on the loader's path) and auditwheel would otherwise copy into the wheel; its glibc
/// is this machine's (2.36 on the build machine; the GPU machine has 2.39). The ordinary
/// example wheel (`ci`'s, manylinux_2_28, no CUDA library linked) is left as it is.
fn build_candle_example(
    venv: &venv::Venv,
    toolkit: &crate::cuda_toolkit::Toolkit,
    abi: &str,
) -> Result<PathBuf> {
    let out = root().join("target").join("wheels-candle-cuda");
    for old in ci::wheels_in(&out, EXAMPLE_WHEEL_PREFIX)? {
        fs::remove_file(&old).with_context(|| format!("removing {}", old.display()))?;
    }
    let mut maturin = venv.python_cmd();
    maturin
        .args([
            "-m",
            "maturin",
            "build",
            "--release",
            "--compatibility",
            "linux",
            "--auditwheel",
            "skip",
            "--manifest-path",
        ])
        .arg(root().join(EXAMPLE_CRATE).join("Cargo.toml"))
        .arg("--out")
        .arg(&out)
        .args(["--no-default-features", "--features"])
        .arg(format!("{abi},candle-cuda"))
        .env("CARGO_PROFILE_RELEASE_STRIP", "symbols")
        .env(
            "CARGO_TARGET_DIR",
            root().join("target").join("candle-cuda"),
        );
    if abi != "abi3-py39" {
        // The build machine's interpreter may be older than the ABI (as in `ci`).
        maturin.env("PYO3_NO_PYTHON", "1");
    }
    toolkit.apply(&mut maturin);
    println!("{}", display(&maturin));
    crate::run_status(&mut maturin)?;
    match ci::wheels_in(&out, EXAMPLE_WHEEL_PREFIX)?.as_slice() {
        [one] => Ok(one.clone()),
        found => bail!(
            "expected one {EXAMPLE_WHEEL_PREFIX}*.whl in {} after maturin, found {found:?}",
            out.display()
        ),
    }
}

/// Whether `wheel` is a build of the example extension (by its file name).
fn is_example_wheel(wheel: &Path) -> bool {
    wheel
        .file_name()
        .is_some_and(|n| n.to_string_lossy().starts_with(EXAMPLE_WHEEL_PREFIX))
}

/// Runs a cargo build command with `--message-format=json` and returns its JSON lines, after
/// showing the compiler's warnings and errors as cargo would (with that format they travel
/// in the JSON instead of stderr); fails when cargo does.
pub(crate) fn cargo_messages(cmd: &mut Command) -> Result<String> {
    cmd.arg("--message-format=json")
        .stdout(Stdio::piped())
        // `output()` would capture stderr too; cargo's progress belongs on the terminal.
        .stderr(Stdio::inherit());
    println!("{}", display(cmd));
    let out = cmd
        .output()
        .with_context(|| format!("could not start `{}`", display(cmd)))?;
    let messages = String::from_utf8_lossy(&out.stdout).into_owned();
    for line in messages.lines() {
        if line.contains(r#""reason":"compiler-message""#)
            && let Some(rendered) = string_field(line, "rendered")
        {
            eprint!("{rendered}");
        }
    }
    if !out.status.success() {
        bail!("`{}` exited with {}", display(cmd), out.status);
    }
    Ok(messages)
}

/// The GPU suite among cargo's `--message-format=json` lines: `compiler-artifact` messages
/// whose profile says `"test":true`, whose target requires one of the [`GPU_TESTS`]
/// features, and whose `executable` is a string. (A package's CPU tests and library unit
/// tests are built too, but they are not part of the suite.)
fn test_binaries(json_lines: &str) -> Vec<TestBinary> {
    let mut found = Vec::new();
    for line in json_lines.lines() {
        if !line.contains(r#""reason":"compiler-artifact""#) {
            continue;
        }
        // Both objects are flat (no nested objects), so each ends at its first `}`. The target
        // has a `test` key of its own (whether `cargo test` tests it): read the profile's.
        let (Some(target), Some(profile)) = (object(line, "target"), object(line, "profile"))
        else {
            continue;
        };
        let needs_gpu = GPU_TESTS.iter().any(|(_, feature)| {
            array(target, "required-features")
                .is_some_and(|features| features.contains(&format!("\"{feature}\"")))
        });
        if !profile.contains(r#""test":true"#) || !needs_gpu {
            continue;
        }
        // `"executable":null` for artifacts that are not programs.
        let (Some(path), Some(name)) = (
            string_field(line, "executable"),
            string_field(target, "name"),
        ) else {
            continue;
        };
        found.push(TestBinary {
            name,
            path: PathBuf::from(path),
        });
    }
    found
}

/// Builds every bench of tensorbridge-benches with the `gpu` and `tch` features (release,
/// stripped) and returns them as (name, path).
fn build_benches(libtorch: &Path) -> Result<Vec<TestBinary>> {
    let mut cmd = with_libtorch(cargo(), libtorch);
    cmd.arg("bench");
    select(&mut cmd, true);
    // `cargo bench` builds with the `bench` profile, which inherits `release`: stripped the
    // same way, its dependencies are the test build's.
    cmd.arg("--no-run")
        .env("CARGO_PROFILE_RELEASE_STRIP", "symbols")
        .env("CARGO_PROFILE_BENCH_STRIP", "symbols");
    let messages = cargo_messages(&mut cmd)?;
    let mut benches = Vec::new();
    for line in messages.lines() {
        if !line.contains(r#""reason":"compiler-artifact""#) {
            continue;
        }
        let Some(target) = object(line, "target") else {
            continue;
        };
        let is_bench = array(target, "kind").is_some_and(|k| k.contains(r#""bench""#));
        if let (true, Some(path), Some(name)) = (
            is_bench,
            string_field(line, "executable"),
            string_field(target, "name"),
        ) {
            benches.push(TestBinary {
                name,
                path: PathBuf::from(path),
            });
        }
    }
    if benches.is_empty() {
        bail!("cargo built no bench binaries");
    }
    Ok(benches)
}

/// Copies the benches into `dir/benches`, the Python comparison, the table of conversions
/// (`table.py`) and the plot script beside them, and writes `bench.sh`.
fn write_benches(dir: &Path, benches: &[TestBinary]) -> Result<()> {
    let to = dir.join("benches");
    fs::create_dir_all(&to).with_context(|| format!("creating {}", to.display()))?;
    for bench in benches {
        fs::copy(&bench.path, to.join(&bench.name))
            .with_context(|| format!("copying {}", bench.path.display()))?;
    }
    for script in [
        "benches/python/compare.py",
        "benches/python/breakdown.py",
        "benches/python/ipc.py",
        "benches/python/nixl.py",
        "benches/python/table.py",
        "benches/plot_copy_vs_share.py",
    ] {
        let from = root().join(script);
        let name = from.file_name().context("a script has a file name")?;
        fs::copy(&from, to.join(name)).with_context(|| format!("copying {}", from.display()))?;
    }
    let bench_sh = dir.join("bench.sh");
    fs::write(&bench_sh, bench_script())
        .with_context(|| format!("writing {}", bench_sh.display()))?;
    fs::set_permissions(&bench_sh, fs::Permissions::from_mode(0o755))
        .with_context(|| format!("making {} executable", bench_sh.display()))?;
    println!("benches: {} binaries, bench.sh", benches.len());
    Ok(())
}

/// `bench.sh`: every bench on one pinned core of the GPU machine, then the Python side by
/// side; results (criterion's output, the CSV, the SVG, compare.json) under `$OUT`.
/// The bundle's `bench.sh` (`xtask/templates/bench.sh`).
fn bench_script() -> &'static str {
    include_str!("../templates/bench.sh")
}

fn object<'a>(json: &'a str, key: &str) -> Option<&'a str> {
    let start = json.find(&format!("\"{key}\":{{"))?;
    let len = json[start..].find('}')? + 1;
    Some(&json[start..start + len])
}

/// The array of strings `"key":[...]` in `json`, brackets included.
fn array<'a>(json: &'a str, key: &str) -> Option<&'a str> {
    let start = json.find(&format!("\"{key}\":["))?;
    let len = json[start..].find(']')? + 1;
    Some(&json[start..start + len])
}

/// The first `"key":"value"` in `json`, with the value unescaped; `None` when there is none
/// (or the value is not a string). A minimal reader for cargo's one-line JSON messages.
fn string_field(json: &str, key: &str) -> Option<String> {
    let opening = format!("\"{key}\":\"");
    let start = json.find(&opening)? + opening.len();
    let mut chars = json[start..].chars();
    let mut value = String::new();
    loop {
        match chars.next()? {
            '"' => return Some(value),
            '\\' => value.push(match chars.next()? {
                'n' => '\n',
                't' => '\t',
                'r' => '\r',
                'b' => '\u{8}',
                'f' => '\u{c}',
                'u' => {
                    let hex: String = chars.by_ref().take(4).collect();
                    char::from_u32(u32::from_str_radix(&hex, 16).ok()?).unwrap_or('\u{fffd}')
                }
                other => other, // `\"`, `\\`, `\/`
            }),
            c => value.push(c),
        }
    }
}

/// What the bundle carries for the Python package: the wheels (the package and the
/// cookbook's example extension) and the pytest suites.
struct Python {
    wheels: Vec<PathBuf>,
    /// `crates/tensorbridge-python/tests`: the GPU suite in `gpu/`, with the shared
    /// `conftest.py` and helpers beside it.
    tests: PathBuf,
    /// `crates/tensorbridge-python/examples`: the cookbook's scripts and the demo, which the
    /// GPU suite runs; in the bundle beside `python-tests`, as in the crate.
    examples: PathBuf,
}

/// The bundle's folder for the Python tests.
const BUNDLE_PYTHON_TESTS: &str = "python-tests";

/// Copies a folder of Python tests (or scripts), leaving out caches.
fn copy_tests(from: &Path, to: &Path) -> Result<()> {
    fs::create_dir_all(to).with_context(|| format!("creating {}", to.display()))?;
    for entry in fs::read_dir(from).with_context(|| format!("listing {}", from.display()))? {
        let entry = entry?;
        let name = entry.file_name();
        let lossy = name.to_string_lossy();
        if lossy == "__pycache__" || lossy.ends_with(".pyc") || lossy.starts_with('.') {
            continue;
        }
        let (src, dst) = (entry.path(), to.join(&name));
        if entry.file_type()?.is_dir() {
            copy_tests(&src, &dst)?;
        } else {
            fs::copy(&src, &dst)
                .with_context(|| format!("copying {} to {}", src.display(), dst.display()))?;
        }
    }
    Ok(())
}

/// Makes `dir` afresh with the binaries, the wheel, the Python tests and a `run.sh` that runs
/// them all.
fn write_bundle(
    dir: &Path,
    binaries: &[TestBinary],
    python: &Python,
    candle_cuda: bool,
) -> Result<()> {
    if dir.exists() {
        // Only replace what is clearly a bundle (or nothing): never wipe someone's folder.
        let is_empty = fs::read_dir(dir)
            .with_context(|| format!("reading {}", dir.display()))?
            .next()
            .is_none();
        if !is_empty && !dir.join("run.sh").is_file() {
            bail!(
                "{} exists and is not a bundle (no run.sh); refusing to replace it",
                dir.display()
            );
        }
        fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for bin in binaries {
        let len = fs::metadata(&bin.path)
            .with_context(|| format!("reading {}", bin.path.display()))?
            .len();
        if len > GZIP_ABOVE {
            gzip(&bin.path, &dir.join(format!("{}.gz", bin.name)))?;
            continue;
        }
        let to = dir.join(&bin.name);
        fs::copy(&bin.path, &to)
            .with_context(|| format!("copying {} to {}", bin.path.display(), to.display()))?;
    }
    for wheel in &python.wheels {
        let name = wheel.file_name().context("a wheel path has a file name")?;
        fs::copy(wheel, dir.join(name)).with_context(|| format!("copying {}", wheel.display()))?;
    }
    copy_tests(&python.tests, &dir.join(BUNDLE_PYTHON_TESTS))?;
    if python.examples.is_dir() {
        copy_tests(&python.examples, &dir.join("examples"))?;
    }
    let run_sh = dir.join("run.sh");
    let names: Vec<&str> = binaries.iter().map(|b| b.name.as_str()).collect();
    fs::write(&run_sh, run_script(&names, candle_cuda))
        .with_context(|| format!("writing {}", run_sh.display()))?;
    let libpath = dir.join("libpath.sh");
    fs::write(&libpath, LIBPATH_SH).with_context(|| format!("writing {}", libpath.display()))?;
    fs::set_permissions(&run_sh, fs::Permissions::from_mode(0o755))
        .with_context(|| format!("making {} executable", run_sh.display()))?;

    let mut total = 0;
    for entry in fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            println!("{:>10}  {}/", "", entry.file_name().to_string_lossy());
            continue;
        }
        let len = entry.metadata()?.len();
        total += len;
        println!(
            "{:>10}  {}",
            format_size(len),
            entry.file_name().to_string_lossy()
        );
    }
    println!("{:>10}  total in {}", format_size(total), dir.display());
    println!(
        "on the GPU machine: {}/run.sh [ARGS...], e.g. run.sh --nocapture",
        dir.display()
    );
    Ok(())
}

/// Test binaries larger than this travel gzipped (`NAME.gz`, unpacked by `run.sh`): candle's
/// (`candle_gpu`, 37 MB of which 32 MB are candle's quantized and MoE kernels, and 10 MB
/// gzipped) would otherwise take the bundle past the 64 MiB a GPU run can carry.
const GZIP_ABOVE: u64 = 16 << 20;

/// `gzip -c from > to` (gzip is on every Linux the bundle goes to: Debian and Ubuntu mark it
/// essential).
fn gzip(from: &Path, to: &Path) -> Result<()> {
    let out = fs::File::create(to).with_context(|| format!("creating {}", to.display()))?;
    let status = Command::new("gzip")
        .arg("-c")
        .arg(from)
        .stdout(out)
        .status()
        .context("running gzip")?;
    if !status.success() {
        bail!("gzip {} exited with {status}", from.display());
    }
    Ok(())
}

fn format_size(bytes: u64) -> String {
    if bytes >= 1 << 20 {
        format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20))
    } else {
        format!("{:.1} KiB", bytes as f64 / 1024.0)
    }
}

/// The bundle's `run.sh`: runs every binary in `names` with the script's arguments, then
/// installs the wheel into `py/` and runs the Python GPU suite with `PYTHONPATH` (pytest's
/// arguments come from `PYTEST_ARGS`).
/// The bundle's `run.sh`, from `xtask/templates/run.sh` with the binaries' names.
/// Tells the Python GPU suite whether the example extension carries its candle recipes
/// (`1`) or the bundle was built without `--candle-cuda` (`0`: `test_gpu_candle.py` skips,
/// saying so, instead of failing on an extension it was never meant to find).
const CANDLE_ENV: &str = "TB_GPU_CANDLE";

fn run_script(names: &[&str], candle_cuda: bool) -> String {
    include_str!("../templates/run.sh")
        .replace("@BINARIES@", &names.join(" "))
        .replace("@PYTHON_TESTS@", BUNDLE_PYTHON_TESTS)
        .replace("@CANDLE@", if candle_cuda { "1" } else { "0" })
}

#[cfg(test)]
mod tests {
    use super::*;

    // Shortened from real `cargo test --no-run --message-format=json` output.
    const MESSAGES: &str = r#"{"reason":"compiler-artifact","package_id":"registry+https://github.com/rust-lang/crates.io-index#anyhow@1.0.104","manifest_path":"/r/anyhow-1.0.104/Cargo.toml","target":{"kind":["lib"],"crate_types":["lib"],"name":"anyhow","src_path":"/r/anyhow-1.0.104/src/lib.rs","edition":"2018","doc":true,"doctest":true,"test":true},"profile":{"opt_level":"3","debuginfo":0,"debug_assertions":false,"overflow_checks":false,"test":false},"features":["default","std"],"filenames":["/w/target/release/deps/libanyhow-1.rlib"],"executable":null,"fresh":true}
{"reason":"compiler-artifact","package_id":"path+file:///w/tests#tensorbridge-integration@0.1.0","manifest_path":"/w/tests/Cargo.toml","target":{"kind":["example"],"crate_types":["bin"],"name":"demo","src_path":"/w/tests/examples/demo.rs","edition":"2024","doc":false,"doctest":false,"test":false},"profile":{"opt_level":"3","debuginfo":0,"debug_assertions":false,"overflow_checks":false,"test":false},"features":["cudarc","gpu-tests"],"filenames":["/w/target/release/examples/demo"],"executable":"/w/target/release/examples/demo","fresh":false}
{"reason":"compiler-artifact","package_id":"path+file:///w/tests#tensorbridge-integration@0.1.0","manifest_path":"/w/tests/Cargo.toml","target":{"kind":["test"],"crate_types":["bin"],"name":"gpu","src_path":"/w/tests/gpu/main.rs","edition":"2024","required-features":["gpu-tests"],"doc":false,"doctest":false,"test":true},"profile":{"opt_level":"3","debuginfo":"line-tables-only","debug_assertions":false,"overflow_checks":false,"test":true},"features":["cudarc","gpu-tests"],"filenames":["/w/target/release/deps/gpu-0123"],"executable":"/w/target/release/deps/gpu-0123","fresh":false}
{"reason":"compiler-artifact","package_id":"path+file:///w/crates/tensorbridge-cudarc#0.1.0","manifest_path":"/w/crates/tensorbridge-cudarc/Cargo.toml","target":{"kind":["test"],"crate_types":["bin"],"name":"it","src_path":"/w/crates/tensorbridge-cudarc/tests/it/main.rs","edition":"2024","doc":false,"doctest":false,"test":true},"profile":{"opt_level":"3","debuginfo":"line-tables-only","debug_assertions":false,"overflow_checks":false,"test":true},"features":["default"],"filenames":["/w/target/release/deps/it-4567"],"executable":"/w/target/release/deps/it-4567","fresh":true}
{"reason":"build-finished","success":true}"#;

    #[test]
    fn scripts_are_filled_and_parse() {
        let run = run_script(&["gpu", "cudarc_gpu"], false);
        assert!(run.contains("binaries=(gpu cudarc_gpu)"), "{run}");
        assert!(
            run.contains(&format!("{CANDLE_ENV}=\"${{{CANDLE_ENV}:-0}}\"")),
            "{run}"
        );
        assert!(run_script(&[], true).contains(&format!("${{{CANDLE_ENV}:-1}}")));
        assert!(run.contains(&format!("$here/{BUNDLE_PYTHON_TESTS}")));
        for (name, text) in [
            ("run.sh", run.as_str()),
            ("bench.sh", bench_script()),
            ("libpath.sh", LIBPATH_SH),
        ] {
            assert!(
                !["@BINARIES@", "@PYTHON_TESTS@"]
                    .iter()
                    .any(|p| text.contains(p)),
                "{name} has an unfilled placeholder"
            );
            // `bash -n` parses without running; skipped where there is no bash.
            if let Ok(mut child) = Command::new("bash").arg("-n").stdin(Stdio::piped()).spawn() {
                use std::io::Write as _;
                child
                    .stdin
                    .take()
                    .unwrap()
                    .write_all(text.as_bytes())
                    .unwrap();
                assert!(child.wait().unwrap().success(), "{name} does not parse");
            }
        }
    }

    #[test]
    fn finds_only_test_executables() {
        assert_eq!(
            test_binaries(MESSAGES),
            [TestBinary {
                name: "gpu".to_owned(),
                path: PathBuf::from("/w/target/release/deps/gpu-0123"),
            }]
        );
    }

    #[test]
    fn string_field_unescapes_and_refuses_null() {
        let json = r#"{"a":null,"b":"C:\\x \"q\" \u00e9\/"}"#;
        assert_eq!(string_field(json, "a"), None);
        assert_eq!(string_field(json, "b").as_deref(), Some(r#"C:\x "q" é/"#));
        assert_eq!(string_field(r#"{"b":"cut"#, "b"), None);
    }
}
