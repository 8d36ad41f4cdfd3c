//! tensorbridge's task runner, after matklad's xtask convention: `cargo xtask <task>` (the
//! alias lives in `.cargo/config.toml`). One module per task, arguments parsed by hand.
//!
//! Every task is a list of steps. Each step prints `==> step` before it runs; a failing step
//! fails the whole task with a message that names it; a timing summary ends every run,
//! failed or not.

mod aarch64;
mod artifacts;
mod bench;
mod ci;
mod cuda_toolkit;
mod demo;
mod fuzz;
mod icount;
mod nixl;
mod release;
mod standin;
mod tch_range;
mod test_gpu;
mod threads;
mod venv;

use std::env;
use std::fmt::Write as _;
use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

const HELP: &str = "\
cargo xtask <task> [options]

tasks:
  ci [--no-miri] [--no-aarch64] [--env NAME]...
      A check that no tracked file is a build artifact (xtask/src/artifacts.rs), the
      Python environments (see venv), then cargo fmt --check, clippy (workspace, then
      --all-features), cargo test, cargo doc with warnings denied (libtorch for the tch
      crate from the pinned environment), cargo package, the tch range, the MSRV (the
      declared rust-version is a toolchain built here) and cargo-semver-checks of every
      published crate against the last vX.Y.Z tag (skipped, saying so, until one
      exists), the Python package (both maturin wheels,
      abi3-py39 into target/wheels and abi3-py312 into target/wheels-py312, linked with zig
      for manylinux_2_28 and checked with auditwheel; the pyo3 crate's tests; pytest
      crates/tensorbridge-python/tests without gpu/ in every environment, each with the
      wheel pip picks for its interpreter), then Miri on each package in
      ci::MIRI_PACKAGES (installing the nightly toolchain, Miri and rust-src first if they
      are missing). The other environments build while cargo compiles, and the pytest
      runs go on (two lanes) while the pyo3 tests and Miri run. Beside them, an aarch64 lane
      (see test-aarch64; its tools are fetched while cargo compiles). --no-miri skips Miri,
      --no-aarch64 the aarch64 lane, for quick local runs; --env NAME (repeatable) runs
      pytest in those environments only.
  test-gpu [--bundle DIR] [--candle-cuda] [-- ARGS...]
      Report the GPUs found, build the GPU test binaries (release, stripped) and the
      wheel, and run them here with the Python GPU suite; with --bundle, copy them, the
      wheel and the Python tests into DIR (made afresh) with a run.sh for a GPU machine
      that has no Rust toolchain, plus every bench (release, stripped) and bench.sh, which
      runs them pinned to one core with the Python comparison. --candle-cuda adds candle's
      CUDA half (its GPU tests and the example extension's candle recipes: nvcc builds
      candle's kernels twice, about 20 more minutes on 2 cores). ARGS go to every test
      binary (-- --nocapture).
  bench [-- ARGS...]
      cargo bench -p tensorbridge-benches with the CPU groups (tch included, with the
      venv's libtorch); ARGS go to criterion (-- --quick). Then one table of the
      conversions against their peers (benches/python/table.py), printed and written
      into docs/BENCHMARKS.md between the latest-run markers.
  demo [--rust-only] [-- ARGS...]
      The main job: hand a buffer through every Rust adapter (release build), then through
      every Python framework in the managed environment (.venv, made when missing; the
      wheel built and installed), on the GPU when there is one; each prints a table of what
      was shared zero-copy (pointer and write checked) and the time per conversion.
  icount [--update]
      The instruction-count gate (ci runs it): each conversion of the harness
      benches/src/bin/icount.rs (release) under valgrind's cachegrind, its instructions
      per conversion against the limits in benches/icount.txt; fails when one is over.
      --update measures and rewrites the file (baseline = the count, limit = +10%).
  fuzz [--time SECS] [validate|cai|dlpack|own_export|array_interface ...]
      Run the libFuzzer targets of fuzz/ (cargo-fuzz on nightly, both installed when
      missing), each SECS seconds (default 60), growing fuzz/corpus/<target>; print the
      executions. A crash fails the task; its input lands in fuzz/artifacts/<target>/ and,
      once fixed, belongs in fuzz/regressions/<target>/ (replayed by `ci`).
  venv [NAME...]
      Make the Python environments (default: all of pinned, newest, floor, py39) from
      python/requirements*.txt in the cache ($TENSORBRIDGE_CACHE, else
      $XDG_CACHE_HOME/tensorbridge, else ~/.cache/tensorbridge; $TENSORBRIDGE_VENV for the
      pinned one), each with its CPython (newest 3.13, floor 3.10, py39 3.9: found on PATH,
      under pyenv, or $TENSORBRIDGE_PYTHON_3_13 and the like), and print their paths. The
      tasks that need Python or libtorch do this themselves.
  test-threads --python PATH [--allow-gil]
      test_threads.py and test_release_chains.py, unchanged, on the free-threaded CPython
      at PATH: a wheel built for it (not abi3), an environment from
      python/requirements-free-threaded.txt, and a check that importing tensorbridge
      leaves the GIL off. --allow-gil accepts an ordinary interpreter (checks the task).
  test-standin
      The sharing path (tensorbridge_cuda::ipc, the Python share/open) through the
      stand-in CUDA driver (crates/tensorbridge-cuda-standin, put in target/cuda-standin
      as libcuda.so.1): tensorbridge-cuda's cuda_driver tests, then the wheels and
      test_share_driver.py, test_share_trust.py and test_nixl_driver.py in the pinned environment.
      `ci` runs the same steps.
  test-aarch64
      aarch64 Linux from this x86-64 machine: the Rust target, qemu-aarch64 (Debian's
      qemu-user) and an arm64 sysroot (Debian's CPython 3.11 and PyPI's aarch64 NumPy and
      pytest, cached beside the environments) installed when missing; the Python package's
      abi3-py39 wheel cross-built with zig for manylinux_2_28 aarch64 into
      target/wheels-aarch64 and checked (auditwheel, one unwinder, an AArch64 module);
      the smoke tests (xtask/src/aarch64.rs, SMOKE_TESTS) run on it under qemu; then cargo
      check --target aarch64-unknown-linux-gnu of the workspace but tensorbridge-tch and tensorbridge-nixl.
      `ci` runs the same steps.
  test-nixl
      What ci runs of NIXL, alone: libclang for nixl-sys (PyPI), NIXL beside the pinned
      environment (python/requirements-nixl.txt, --no-deps), cargo test -p tensorbridge-nixl
      (a Tensor to a Python process), then the wheels and test_nixl.py against a real agent.
  help
      This text.
";

fn main() -> ExitCode {
    let args: Vec<String> = env::args().skip(1).collect();
    let Some((task, rest)) = args.split_first() else {
        print!("{HELP}");
        return ExitCode::SUCCESS;
    };
    let result = match task.as_str() {
        "ci" => ci::run(rest),
        "test-gpu" => test_gpu::run(rest),
        "bench" => bench::run(rest),
        "demo" => demo::run(rest),
        "fuzz" => fuzz::run(rest),
        "icount" => icount::run(rest),
        "venv" => venv_task(rest),
        "test-threads" => threads::run(rest),
        "test-standin" => standin::task(rest),
        "test-aarch64" => aarch64::task(rest),
        "test-nixl" => nixl::task(rest),
        "help" | "--help" | "-h" => {
            print!("{HELP}");
            return ExitCode::SUCCESS;
        }
        other => {
            eprintln!("error: unknown task `{other}`\n\n{HELP}");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn venv_task(args: &[String]) -> Result<()> {
    let mut specs = Vec::new();
    for arg in args {
        match venv::ENVS.iter().find(|s| s.name == arg) {
            Some(spec) => specs.push(*spec),
            None => bail!(
                "unknown environment `{arg}` for `venv` (expected some of: {})",
                venv::ENVS
                    .iter()
                    .map(|s| s.name)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
    if specs.is_empty() {
        specs = venv::ENVS.to_vec();
    }
    let mut steps = Steps::new("venv");
    let result = (|| {
        let mut made = Vec::new();
        for spec in specs {
            made.push(venv::ensure_spec(&mut steps, spec)?);
        }
        for v in made {
            println!("{}: {}", v.name(), v.dir().display());
        }
        Ok(())
    })();
    steps.finish(result)
}

/// The workspace root: this package lives in `<root>/xtask`.
fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask's manifest dir has a parent")
}

/// `cargo`, run in the workspace root.
///
/// Deliberately the `cargo` on `PATH` (the rustup proxy) rather than `$CARGO` (the toolchain's
/// own binary, which cargo sets for `cargo run`): only the proxy understands `+nightly`.
fn cargo() -> Command {
    let mut cmd = Command::new("cargo");
    cmd.current_dir(root());
    cmd
}

/// Cargo's home: `CARGO_HOME`, else `~/.cargo`.
fn cargo_home() -> Result<PathBuf> {
    std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .context("neither CARGO_HOME nor HOME is set")
}

/// Splits `args` at the first `--`: (the task's own options, everything after `--`).
fn split_passthrough(args: &[String]) -> (&[String], &[String]) {
    match args.iter().position(|a| a == "--") {
        Some(i) => (&args[..i], &args[i + 1..]),
        None => (args, &[]),
    }
}

/// A command line as a shell would show it, with the environment it sets in front.
fn display(cmd: &Command) -> String {
    let mut s = String::new();
    for (key, value) in cmd.get_envs() {
        if let Some(value) = value {
            let _ = write!(
                s,
                "{}={} ",
                key.to_string_lossy(),
                quote(&value.to_string_lossy())
            );
        }
    }
    s.push_str(&quote(&cmd.get_program().to_string_lossy()));
    for arg in cmd.get_args() {
        s.push(' ');
        s.push_str(&quote(&arg.to_string_lossy()));
    }
    s
}

fn quote(s: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "-_=+./:,@%".contains(c);
    if !s.is_empty() && s.chars().all(plain) {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// Runs `cmd` to completion with inherited stdio; fails unless it exits with status 0.
fn run_status(cmd: &mut Command) -> Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("could not start `{}`", display(cmd)))?;
    if !status.success() {
        bail!("`{}` exited with {status}", display(cmd));
    }
    Ok(())
}

/// An absolute path: `path` itself, or `path` under the current directory.
fn absolute(path: &Path) -> Result<PathBuf> {
    Ok(if path.is_absolute() {
        path.to_owned()
    } else {
        env::current_dir()
            .context("reading the current directory")?
            .join(path)
    })
}

enum Outcome {
    Ok,
    Failed,
    Skipped(String),
}

struct Record {
    name: String,
    elapsed: Duration,
    outcome: Outcome,
    /// Ran in a [`Background`] thread, beside the steps around it.
    background: bool,
}

/// The steps of one task: runs them, announces each, and times them for the summary.
struct Steps {
    task: &'static str,
    started: Instant,
    records: Vec<Record>,
    /// Where the announcements and the commands' output go instead of the terminal (the
    /// steps of a [`Background`] thread, printed whole when it is joined).
    log: Option<File>,
}

impl Steps {
    fn new(task: &'static str) -> Steps {
        Steps {
            task,
            started: Instant::now(),
            records: Vec::new(),
            log: None,
        }
    }

    /// A line of the task's own output: on the terminal, or in the log of a background run.
    fn note(&mut self, line: &str) {
        match &mut self.log {
            Some(log) => {
                let _ = writeln!(log, "{line}");
            }
            None => println!("{line}"),
        }
    }

    /// Runs `f` as the step `name`; its error, if any, says which step failed.
    fn run<T>(&mut self, name: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        self.note(&format!("==> {name}"));
        self.timed(name, f)
    }

    /// Runs `cmd` as the step `name`, echoing the command line.
    fn cmd(&mut self, name: &str, cmd: &mut Command) -> Result<()> {
        self.note(&format!("==> {name}: {}", display(cmd)));
        if let Some(log) = &self.log {
            let out = log.try_clone().context("duplicating the log's handle")?;
            let err = log.try_clone().context("duplicating the log's handle")?;
            cmd.stdin(Stdio::null()).stdout(out).stderr(err);
        }
        self.timed(name, || run_status(cmd))
    }

    fn timed<T>(&mut self, name: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let start = Instant::now();
        let result = f();
        self.records.push(Record {
            name: name.to_owned(),
            elapsed: start.elapsed(),
            outcome: if result.is_ok() {
                Outcome::Ok
            } else {
                Outcome::Failed
            },
            background: self.log.is_some(),
        });
        result.with_context(|| format!("step `{name}` failed"))
    }

    /// Records a step that was left out on purpose, so the summary says so.
    fn skip(&mut self, name: &str, why: &str) {
        self.note(&format!("==> {name}: skipped ({why})"));
        self.records.push(Record {
            name: name.to_owned(),
            elapsed: Duration::ZERO,
            outcome: Outcome::Skipped(why.to_owned()),
            background: self.log.is_some(),
        });
    }

    /// Runs `f` on a thread of its own, beside the steps that follow, with its commands'
    /// output going to the file `log` (created afresh) instead of the terminal. Join it with
    /// [`Background::join`], which prints that output and adds its steps to the summary.
    /// Only work that shares nothing with the foreground belongs there: two cargo builds in
    /// one target directory would wait for each other's lock.
    fn background<T: Send + 'static>(
        &mut self,
        name: &str,
        log: &Path,
        f: impl FnOnce(&mut Steps) -> Result<T> + Send + 'static,
    ) -> Result<Background<T>> {
        if let Some(dir) = log.parent() {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        }
        let file = File::create(log).with_context(|| format!("creating {}", log.display()))?;
        self.note(&format!(
            "==> {name}: in the background (output in {}, shown when it ends)",
            log.display()
        ));
        let mut steps = Steps {
            task: self.task,
            started: Instant::now(),
            records: Vec::new(),
            log: Some(file),
        };
        let handle = thread::spawn(move || {
            let result = f(&mut steps);
            (steps.records, result)
        });
        Ok(Background {
            name: name.to_owned(),
            log: log.to_owned(),
            handle,
        })
    }

    /// Prints the timing summary and passes `result` through.
    fn finish(self, result: Result<()>) -> Result<()> {
        let width = self
            .records
            .iter()
            .map(|r| r.name.len() + if r.background { 2 } else { 0 })
            .max()
            .unwrap_or(0)
            .max("total".len());
        println!();
        println!("==> summary: cargo xtask {}", self.task);
        for r in &self.records {
            let (time, what) = match &r.outcome {
                Outcome::Ok => (secs(r.elapsed), "ok".to_owned()),
                Outcome::Failed => (secs(r.elapsed), "FAILED".to_owned()),
                Outcome::Skipped(why) => ("-".to_owned(), format!("skipped ({why})")),
            };
            // Background steps are indented: their time overlapped the steps around them.
            let name = if r.background {
                format!("  {}", r.name)
            } else {
                r.name.clone()
            };
            println!("    {name:<width$}  {time:>8}  {what}");
        }
        let verdict = if result.is_ok() { "ok" } else { "FAILED" };
        println!(
            "    {:<width$}  {:>8}  {verdict}",
            "total",
            secs(self.started.elapsed())
        );
        result
    }
}

/// Steps running on a thread of their own ([`Steps::background`]).
#[must_use = "join it: its steps and its failure belong to the task"]
struct Background<T> {
    name: String,
    log: PathBuf,
    handle: JoinHandle<(Vec<Record>, Result<T>)>,
}

impl<T> Background<T> {
    /// Waits for the thread, prints its output, adds its steps (indented) to `steps`'
    /// summary and returns its result.
    fn join(self, steps: &mut Steps) -> Result<T> {
        steps.note(&format!("==> {}: waiting for it to end", self.name));
        let start = Instant::now();
        let joined = self.handle.join();
        let waited = start.elapsed();
        steps.note(&format!(
            "==> {}: output ({}; waited {})",
            self.name,
            self.log.display(),
            secs(waited)
        ));
        match std::fs::read(&self.log) {
            Ok(text) => {
                let text = String::from_utf8_lossy(&text);
                steps.note(text.trim_end());
            }
            Err(e) => steps.note(&format!("(could not read {}: {e})", self.log.display())),
        }
        steps.note(&format!("==> {}: end of its output", self.name));
        let (records, result) = match joined {
            Ok(joined) => joined,
            Err(_) => (Vec::new(), Err(anyhow::anyhow!("the thread panicked"))),
        };
        let background = steps.log.is_some();
        steps.records.extend(records.into_iter().map(|mut r| {
            r.background = true;
            r.background |= background;
            r
        }));
        steps.records.push(Record {
            name: format!("{} (wait)", self.name),
            elapsed: waited,
            outcome: if result.is_ok() {
                Outcome::Ok
            } else {
                Outcome::Failed
            },
            background: false,
        });
        result.with_context(|| format!("`{}` (in the background) failed", self.name))
    }
}

fn secs(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passthrough_splits_at_the_first_double_dash() {
        let args: Vec<String> = ["--bundle", "b", "--", "--nocapture", "--"]
            .map(String::from)
            .into();
        let (own, rest) = split_passthrough(&args);
        assert_eq!(own, ["--bundle", "b"]);
        assert_eq!(rest, ["--nocapture", "--"]);
        let (own, rest) = split_passthrough(&args[..2]);
        assert_eq!((own.len(), rest.len()), (2, 0));
    }

    #[test]
    fn display_quotes_what_a_shell_would_split() {
        let mut cmd = Command::new("cargo");
        cmd.args(["bench", "--bench", "*", "--", "it's"])
            .env("RUSTDOCFLAGS", "-D warnings");
        assert_eq!(
            display(&cmd),
            r"RUSTDOCFLAGS='-D warnings' cargo bench --bench '*' -- 'it'\''s'"
        );
    }
}
