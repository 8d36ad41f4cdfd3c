//! `cargo xtask bench [-- ARGS...]`: the criterion benches, ARGS passed to criterion.

use anyhow::{Result, bail};

use crate::venv::{self, with_libtorch};
use crate::{Steps, cargo, split_passthrough};

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
    let libtorch = venv::ensure(steps)?.torch_dir()?;
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
    steps.cmd("bench", &mut cmd)
}
