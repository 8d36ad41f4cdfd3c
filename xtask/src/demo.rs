//! `cargo xtask demo [-- ARGS...]`: the main job (`tests/examples/demo.rs`) in release.

use anyhow::{Result, bail};

use crate::{Steps, cargo, split_passthrough};

pub(crate) fn run(args: &[String]) -> Result<()> {
    let (own, demo_args) = split_passthrough(args);
    if let Some(other) = own.first() {
        bail!("unknown option `{other}` for `demo` (pass the demo's arguments after `--`)");
    }
    let mut cmd = cargo();
    cmd.args([
        "run",
        "--release",
        "-p",
        "tensorbridge-integration",
        "--example",
        "demo",
    ]);
    if !demo_args.is_empty() {
        cmd.arg("--").args(demo_args);
    }
    let mut steps = Steps::new("demo");
    let result = steps.cmd("demo", &mut cmd);
    steps.finish(result)
}
