//! tensorbridge's task runner, after matklad's xtask convention: `cargo xtask <task>` (the
//! alias lives in `.cargo/config.toml`). One module per task, arguments parsed by hand.
//!
//! Every task is a list of steps. Each step prints `==> step` before it runs; a failing step
//! fails the whole task with a message that names it; a timing summary ends every run,
//! failed or not.

mod bench;
mod ci;
mod cuda_toolkit;
mod demo;
mod fuzz;
mod tch_range;
mod test_gpu;
mod venv;

use std::env;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

const HELP: &str = "\
cargo xtask <task> [options]

tasks:
  ci [--no-miri] [--candle-cuda]
      The Python environment (see venv), then cargo fmt --check, clippy (workspace, then
      --all-features; with --candle-cuda also candle's CUDA half, built with a CUDA
      toolkit made of PyPI's NVIDIA wheels in target/cuda-toolkit: nvcc compiles candle's
      kernels, a long step), cargo test, cargo doc with warnings denied (libtorch for the tch
      crate from the venv), tensorbridge-tch against the oldest and the newest tch it
      accepts (tch_range::ENDS: each with its PyTorch, in target/tch-range), the Python
      package
      (maturin wheel into target/wheels, installed into the environment; the pyo3 crate's
      tests; pytest crates/tensorbridge-python/tests without gpu/), then Miri on each
      package in ci::MIRI_PACKAGES (installing the nightly toolchain, Miri and rust-src
      first if they are missing). --no-miri skips Miri, for quick local runs.
  test-gpu [--bundle DIR] [-- ARGS...]
      Report the GPUs found, build the GPU test binaries (release, stripped) and the
      wheel, and run them here with the Python GPU suite; with --bundle, copy them, the
      wheel and the Python tests into DIR (made afresh) with a run.sh for a GPU machine
      that has no Rust toolchain, plus every bench (release, stripped) and bench.sh, which
      runs them pinned to one core with the Python comparison. ARGS go to every test
      binary (-- --nocapture).
  bench [-- ARGS...]
      cargo bench -p tensorbridge-benches with the CPU groups (tch included, with the
      venv's libtorch); ARGS go to criterion (-- --quick).
  demo [--rust-only] [-- ARGS...]
      The main job: hand a buffer through every Rust adapter (release build), then through
      every Python framework in the managed environment (.venv, made when missing; the
      wheel built and installed), on the GPU when there is one; each prints a table of what
      was shared zero-copy (pointer and write checked) and the time per conversion.
  fuzz [--time SECS] [validate|cai|dlpack|own_export|array_interface ...]
      Run the libFuzzer targets of fuzz/ (cargo-fuzz on nightly, both installed when
      missing), each SECS seconds (default 60), growing fuzz/corpus/<target>; print the
      executions. A crash fails the task; its input lands in fuzz/artifacts/<target>/ and,
      once fixed, belongs in fuzz/regressions/<target>/ (replayed by `ci`).
  venv
      Create .venv (or $TENSORBRIDGE_VENV) with the pins of python/requirements.txt
      (torch, NumPy, JAX, TensorFlow, maturin, pytest) and print its path. The tasks
      that need Python or libtorch do this themselves.
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
        "venv" => venv_task(rest),
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
    if let Some(arg) = args.first() {
        bail!("unknown option `{arg}` for `venv` (it takes none)");
    }
    let mut steps = Steps::new("venv");
    let result = venv::ensure(&mut steps).map(|v| println!("{}", v.dir().display()));
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
}

/// The steps of one task: runs them, announces each, and times them for the summary.
struct Steps {
    task: &'static str,
    started: Instant,
    records: Vec<Record>,
}

impl Steps {
    fn new(task: &'static str) -> Steps {
        Steps {
            task,
            started: Instant::now(),
            records: Vec::new(),
        }
    }

    /// Runs `f` as the step `name`; its error, if any, says which step failed.
    fn run<T>(&mut self, name: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        println!("==> {name}");
        self.timed(name, f)
    }

    /// Runs `cmd` as the step `name`, echoing the command line.
    fn cmd(&mut self, name: &str, cmd: &mut Command) -> Result<()> {
        println!("==> {name}: {}", display(cmd));
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
        });
        result.with_context(|| format!("step `{name}` failed"))
    }

    /// Records a step that was left out on purpose, so the summary says so.
    fn skip(&mut self, name: &str, why: &str) {
        println!("==> {name}: skipped ({why})");
        self.records.push(Record {
            name: name.to_owned(),
            elapsed: Duration::ZERO,
            outcome: Outcome::Skipped(why.to_owned()),
        });
    }

    /// Prints the timing summary and passes `result` through.
    fn finish(self, result: Result<()>) -> Result<()> {
        let width = self
            .records
            .iter()
            .map(|r| r.name.len())
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
            println!("    {:<width$}  {time:>8}  {what}", r.name);
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
