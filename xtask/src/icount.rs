//! `cargo xtask icount [--update]`: the instruction-count gate. Each conversion of the
//! harness `benches/src/bin/icount.rs` (release build) runs under valgrind's cachegrind
//! with `N` and with `2N` iterations; the difference over `N` is its instructions per
//! conversion, the same on every run of the same binary (time on a shared 2-core machine
//! moves by 10-40%, the count by well under 1%). Each conversion with a limit in
//! [`THRESHOLDS`] fails the gate when its count is over the limit, so that a regression in
//! a conversion's cost fails CI on a machine without a GPU. `--update` measures and writes
//! the file afresh: the count as the baseline, the limit 10% above it.
//!
//! `ci` runs it as one of its steps ([`gate`]); it needs valgrind (`apt-get install
//! valgrind`) and fails, never skips, without it.

use std::fmt::Write as _;
use std::fs;
use std::path::PathBuf;
use std::process::Command;
use std::thread;

use anyhow::{Context as _, Result, bail};

use crate::venv::Venv;
use crate::{Steps, cargo, display, root};

/// The committed baselines and limits, relative to the workspace root.
const THRESHOLDS: &str = "benches/icount.txt";

/// Iterations of the shorter run; the longer runs twice as many.
const N: u64 = 2000;

/// The limit `--update` writes: this much above the measured count.
const HEADROOM: f64 = 1.10;

pub(crate) fn run(args: &[String]) -> Result<()> {
    let mut update = false;
    for arg in args {
        match arg.as_str() {
            "--update" => update = true,
            other => bail!("unknown option `{other}` for `icount` (expected --update)"),
        }
    }
    let mut steps = Steps::new("icount");
    let result = icount(&mut steps, update);
    steps.finish(result)
}

/// The `ci` step: the gate, against the committed limits.
pub(crate) fn gate(steps: &mut Steps, _venv: &Venv) -> Result<()> {
    icount(steps, false)
}

/// One line of [`THRESHOLDS`]: a conversion, its baseline count and its limit (`None` for
/// peers, measured for the ratio only).
struct Entry {
    name: String,
    baseline: Option<f64>,
    limit: Option<f64>,
}

fn read_thresholds() -> Result<(Vec<String>, Vec<Entry>)> {
    let path = root().join(THRESHOLDS);
    let text = fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let mut header = Vec::new();
    let mut entries = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            if entries.is_empty() {
                header.push(line.to_owned());
            }
            continue;
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        let number = |s: &str| -> Result<Option<f64>> {
            if s == "-" {
                return Ok(None);
            }
            Ok(Some(s.parse().with_context(|| {
                format!("{}:{}: `{s}` is not a number", path.display(), i + 1)
            })?))
        };
        match fields.as_slice() {
            [name, baseline, limit] => entries.push(Entry {
                name: (*name).to_owned(),
                baseline: number(baseline)?,
                limit: number(limit)?,
            }),
            _ => bail!(
                "{}:{}: expected `NAME BASELINE LIMIT` (`-` for none), found `{line}`",
                path.display(),
                i + 1
            ),
        }
    }
    Ok((header, entries))
}

fn icount(steps: &mut Steps, update: bool) -> Result<()> {
    let (header, entries) = read_thresholds()?;
    steps.run("icount: valgrind present", || {
        let out = Command::new("valgrind")
            .arg("--version")
            .output()
            .context("valgrind is not installed (apt-get install valgrind): the gate needs it")?;
        if !out.status.success() {
            bail!("`valgrind --version` failed");
        }
        Ok(())
    })?;
    steps.cmd(
        "icount: build the harness (release)",
        cargo().args([
            "build",
            "--release",
            "-p",
            "tensorbridge-benches",
            "--bin",
            "icount",
        ]),
    )?;
    let bin = stripped_copy(&root().join("target").join("release").join("icount"));
    let counts = steps.run("icount: count under cachegrind", || measure(&bin, &entries))?;
    let report = report(&entries, &counts);
    steps.note(&report.text);
    if update {
        let mut text = header.join("\n");
        text.push('\n');
        for (entry, count) in entries.iter().zip(&counts) {
            let limit = if entry.limit.is_some() {
                format!("{:.0}", (count * HEADROOM).ceil())
            } else {
                "-".to_owned()
            };
            let _ = writeln!(text, "{} {count:.0} {limit}", entry.name);
        }
        let path = root().join(THRESHOLDS);
        fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        steps.note(&format!("==> icount: wrote {}", path.display()));
        return Ok(());
    }
    if !report.over.is_empty() {
        bail!(
            "instructions per conversion over the limit in {THRESHOLDS}: {} (if the cost is \
             meant, `cargo xtask icount --update` and say why in the commit)",
            report.over.join(", ")
        );
    }
    Ok(())
}

/// A copy of the harness without its debug information when `strip` is there (valgrind
/// reads a binary's debug information at every start, a quarter of each short run), the
/// harness itself otherwise. The counts of the conversions are the same either way.
fn stripped_copy(bin: &std::path::Path) -> PathBuf {
    let copy = root().join("target").join("icount").join("icount");
    let stripped = fs::create_dir_all(copy.parent().expect("a parent"))
        .and_then(|()| fs::copy(bin, &copy))
        .is_ok()
        && Command::new("strip")
            .arg(&copy)
            .status()
            .is_ok_and(|s| s.success());
    if stripped { copy } else { bin.to_owned() }
}

/// Instructions per conversion of each entry, measured in parallel (one valgrind per core).
fn measure(bin: &PathBuf, entries: &[Entry]) -> Result<Vec<f64>> {
    let workers = thread::available_parallelism().map_or(2, |n| n.get());
    let names: Vec<&str> = entries.iter().map(|e| e.name.as_str()).collect();
    let mut results: Vec<Option<Result<f64>>> = (0..names.len()).map(|_| None).collect();
    thread::scope(|s| {
        let chunks: Vec<Vec<usize>> = (0..workers)
            .map(|w| (w..names.len()).step_by(workers).collect())
            .collect();
        let handles: Vec<_> = chunks
            .into_iter()
            .map(|idx| {
                let names = &names;
                s.spawn(move || {
                    idx.into_iter()
                        .map(|i| (i, per_iteration(bin, names[i])))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for h in handles {
            for (i, r) in h.join().expect("a measuring thread panicked") {
                results[i] = Some(r);
            }
        }
    });
    results
        .into_iter()
        .map(|r| r.expect("every entry measured"))
        .collect()
}

/// `(I(2N) - I(N)) / N` for conversion `name`.
fn per_iteration(bin: &PathBuf, name: &str) -> Result<f64> {
    let short = instructions(bin, name, N)?;
    let long = instructions(bin, name, 2 * N)?;
    if long <= short {
        bail!(
            "{name}: {} iterations counted {long} instructions, {N} counted {short}",
            2 * N
        );
    }
    Ok((long - short) as f64 / N as f64)
}

/// The `I refs` cachegrind reports for one run of the harness.
fn instructions(bin: &PathBuf, name: &str, n: u64) -> Result<u64> {
    let mut cmd = Command::new("valgrind");
    cmd.args([
        "--tool=cachegrind",
        "--cache-sim=no",
        "--cachegrind-out-file=/dev/null",
    ])
    .arg(bin)
    .arg(name)
    .arg(n.to_string());
    let out = cmd
        .output()
        .with_context(|| format!("could not start `{}`", display(&cmd)))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        bail!("`{}` failed ({}):\n{stderr}", display(&cmd), out.status);
    }
    stderr
        .lines()
        .find_map(|l| {
            let rest = l.split_once("I   refs:")?.1;
            rest.trim().replace(',', "").parse::<u64>().ok()
        })
        .with_context(|| {
            format!(
                "no `I refs` line in the output of `{}`:\n{stderr}",
                display(&cmd)
            )
        })
}

struct Report {
    text: String,
    over: Vec<String>,
}

fn report(entries: &[Entry], counts: &[f64]) -> Report {
    let mut text = String::from(
        "| conversion | instructions | baseline | limit | |\n|---|---:|---:|---:|---|\n",
    );
    let mut over = Vec::new();
    for (e, &c) in entries.iter().zip(counts) {
        let opt = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.0}"));
        let verdict = match e.limit {
            Some(limit) if c > limit => {
                over.push(format!("{} ({c:.0} > {limit:.0})", e.name));
                "OVER THE LIMIT"
            }
            Some(_) if e.baseline.is_some_and(|b| c < 0.9 * b) => {
                "ok (10% under the baseline: `--update` to lower the limit)"
            }
            Some(_) => "ok",
            None => "peer",
        };
        let _ = writeln!(
            text,
            "| {} | {c:.0} | {} | {} | {verdict} |",
            e.name,
            opt(e.baseline),
            opt(e.limit)
        );
    }
    Report { text, over }
}
