//! `cargo xtask bench [-- ARGS...]`: the criterion benches, ARGS passed to criterion.

use anyhow::{Result, bail};

use crate::venv::{self, with_libtorch};
use crate::{Steps, cargo, root, split_passthrough};

pub(crate) fn run(args: &[String]) -> Result<()> {
    let (own, criterion_args) = split_passthrough(args);
    // The place for `--gpu`: once the GPU bench groups exist it will add their feature
    // (`--features ...`) to the command below.
    if let Some(other) = own.first() {
        bail!("unknown option `{other}` for `bench` (pass criterion's arguments after `--`)");
    }
    let mut steps = Steps::new("bench");
    let result = bench(&mut steps, criterion_args);
    steps.finish(result)
}

fn bench(steps: &mut Steps, criterion_args: &[String]) -> Result<()> {
    // The `tch` bench links libtorch: the managed venv's, through `LIBTORCH`.
    let venv = venv::ensure(steps)?;
    let libtorch = venv.torch_dir()?;
    let mut cmd = with_libtorch(cargo(), &libtorch);
    // `--bench '*'` selects the bench targets only: plain `cargo bench` would also hand
    // criterion's arguments to the library's libtest harness, which rejects them.
    cmd.args([
        "bench",
        "-p",
        "tensorbridge-benches",
        "--features",
        "tch",
        "--bench",
        "*",
    ]);
    if !criterion_args.is_empty() {
        cmd.arg("--").args(criterion_args);
    }
    steps.cmd("bench", &mut cmd)?;
    // One table of the conversions against their peers, from criterion's results (the
    // groups just run, and those of earlier runs that this one's filter left out), printed
    // and written into the latest-run section of docs/BENCHMARKS.md. The GPU bundle's
    // bench.sh runs the same script, with compare.py's rows too.
    let title = format!(
        "`cargo xtask bench` on this machine ({}; CPU groups only, no Python rows: those \
         need a GPU, `bench.sh`); criterion medians, rank 1 / 2 / 4 / 8.",
        host_description()
    );
    steps.cmd(
        "the table of conversions (benches/python/table.py)",
        venv.python_cmd()
            .current_dir(root())
            .arg(root().join("benches/python/table.py"))
            .arg("--criterion")
            .arg(root().join("target/criterion"))
            .arg("--write")
            .arg(root().join("docs/BENCHMARKS.md"))
            .arg("--title")
            .arg(title),
    )
}

/// The CPU's model name and the date, for the table's title.
fn host_description() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("model name")
                    .map(|r| r.trim_start_matches([' ', '\t', ':']).to_owned())
            })
        })
        .unwrap_or_else(|| "unknown CPU".to_owned());
    let date = std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    format!("{date}, {cpu}")
}
