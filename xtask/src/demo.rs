//! `cargo xtask demo [-- ARGS...]`: the main job. First the Rust adapters
//! (`tests/examples/demo.rs`, release), then the Python package against every framework in
//! the managed environment (`crates/tensorbridge-python/examples/demo.py`: on the GPU when
//! there is one, on the host otherwise), each printing its table of what was shared
//! zero-copy (pointer and write checked) and what one conversion costs.

use anyhow::{Result, bail};

use crate::venv::with_libtorch;
use crate::{Steps, cargo, ci, root, split_passthrough, venv};

/// The Python demo, relative to the workspace root.
const PYTHON_DEMO: &str = "crates/tensorbridge-python/examples/demo.py";

pub(crate) fn run(args: &[String]) -> Result<()> {
    let (own, demo_args) = split_passthrough(args);
    let mut python = true;
    for arg in own {
        match arg.as_str() {
            "--rust-only" => python = false,
            other => bail!(
                "unknown option `{other}` for `demo` (expected --rust-only; pass the Rust \
                 demo's arguments after `--`)"
            ),
        }
    }
    let mut steps = Steps::new("demo");
    let result = demo(&mut steps, python, demo_args);
    steps.finish(result)
}

fn demo(steps: &mut Steps, python: bool, demo_args: &[String]) -> Result<()> {
    // The libtorch row links the environment's libtorch (`--rust-only` leaves both out).
    let venv = if python {
        Some(venv::ensure(steps)?)
    } else {
        None
    };
    let mut cmd = match &venv {
        Some(venv) => with_libtorch(cargo(), &venv.torch_dir()?),
        None => cargo(),
    };
    cmd.args([
        "run",
        "--release",
        "-p",
        "tensorbridge-integration",
        "--example",
        "demo",
    ]);
    if venv.is_some() {
        cmd.args(["--features", "tch"]);
    }
    if !demo_args.is_empty() {
        cmd.arg("--").args(demo_args);
    }
    steps.cmd("demo: Rust adapters", &mut cmd)?;
    if !python {
        steps.skip("demo: Python frameworks", "--rust-only");
        return Ok(());
    }
    let Some(venv) = venv else {
        return Ok(());
    };
    // The wheels go into `target/python/pinned`, not into the shared environment.
    let site = ci::build_and_install_wheels(steps, &venv)?;
    steps.cmd(
        "demo: Python frameworks",
        venv.python_cmd()
            .arg(root().join(PYTHON_DEMO))
            .env("PYTHONPATH", &site)
            .current_dir(root()),
    )
}
