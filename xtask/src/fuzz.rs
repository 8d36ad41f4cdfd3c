//! `cargo xtask fuzz [--time SECS] [TARGET...]`: runs the libFuzzer targets in `fuzz/`
//! (cargo-fuzz, nightly), each for SECS seconds, growing `fuzz/corpus/<target>`.
//!
//! A crash fails the task; libFuzzer writes the input to `fuzz/artifacts/<target>/`. Move it
//! to `fuzz/regressions/<target>/` once fixed: the `fuzz_regressions` test replays the
//! corpus and every reproducer on stable Rust in `cargo xtask ci`.

use std::process::Command;

use anyhow::{Context as _, Result, bail};

use crate::{Steps, cargo, root, run_status};

/// The targets, as named in `fuzz/Cargo.toml`.
pub(crate) const TARGETS: &[&str] = &["validate", "cai", "dlpack", "own_export", "array_interface"];

/// Seconds per target when `--time` is not given.
const DEFAULT_SECS: u64 = 60;

pub(crate) fn run(args: &[String]) -> Result<()> {
    let mut secs = DEFAULT_SECS;
    let mut targets: Vec<&str> = Vec::new();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--time" => {
                let value = it.next().context("--time needs a number of seconds")?;
                secs = value
                    .parse()
                    .with_context(|| format!("--time expects seconds, found `{value}`"))?;
            }
            t if TARGETS.contains(&t) => targets.push(t),
            other => bail!(
                "unknown option or target `{other}` for `fuzz` (expected --time SECS and any of {})",
                TARGETS.join(", ")
            ),
        }
    }
    if targets.is_empty() {
        targets = TARGETS.to_vec();
    }
    let mut steps = Steps::new("fuzz");
    let result = fuzz(&mut steps, &targets, secs);
    steps.finish(result)
}

fn fuzz(steps: &mut Steps, targets: &[&str], secs: u64) -> Result<()> {
    setup(steps)?;
    let dir = root().join("fuzz");
    steps.cmd(
        "build",
        Command::new("cargo")
            .current_dir(&dir)
            .args(["+nightly", "fuzz", "build", "-O"]),
    )?;
    let mut summary = Vec::new();
    for target in targets {
        let corpus = dir.join("corpus").join(target);
        std::fs::create_dir_all(&corpus)
            .with_context(|| format!("creating {}", corpus.display()))?;
        let before = count_files(&corpus);
        let out = steps.run(&format!("fuzz {target} ({secs} s)"), || {
            let mut cmd = Command::new("cargo");
            cmd.current_dir(&dir)
                .args(["+nightly", "fuzz", "run", "-O", target])
                .arg(&corpus)
                .arg("--")
                .arg(format!("-max_total_time={secs}"));
            println!("{}", crate::display(&cmd));
            let out = cmd.output().context("could not run cargo fuzz")?;
            let log = String::from_utf8_lossy(&out.stderr).into_owned();
            if !out.status.success() {
                // The tail has libFuzzer's report and the artifact's path.
                let tail: Vec<&str> = log.lines().rev().take(40).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                bail!(
                    "`{target}` found a crash (artifact in fuzz/artifacts/{target}/):\n{}",
                    tail.join("\n")
                );
            }
            Ok(log)
        })?;
        // libFuzzer ends with "Done 3630772 runs in 46 second(s)".
        let done = out
            .lines()
            .rev()
            .find(|l| l.starts_with("Done "))
            .unwrap_or("(no `Done` line)")
            .to_owned();
        let after = count_files(&corpus);
        summary.push(format!(
            "{target}: {done}; corpus {before} -> {after} inputs"
        ));
    }
    println!("\n==> fuzz results");
    for line in &summary {
        println!("    {line}");
    }
    Ok(())
}

fn count_files(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |d| d.filter_map(|e| e.ok()).count())
}

/// The nightly toolchain and cargo-fuzz, installed when missing; any refusal fails loudly.
fn setup(steps: &mut Steps) -> Result<()> {
    crate::ci::nightly_toolchain(steps)?;
    let have = Command::new("cargo")
        .args(["fuzz", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if have {
        println!("==> cargo-fuzz present");
        return Ok(());
    }
    steps.run("install cargo-fuzz", || {
        run_status(cargo().args(["install", "cargo-fuzz", "--locked"]))
    })
}
