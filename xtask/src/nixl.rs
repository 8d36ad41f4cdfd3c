//! NIXL for the tests: `python/requirements-nixl.txt` installed with `pip install --no-deps
//! --target target/nixl/<env>` beside (not into) each shared environment that NIXL has
//! wheels for, so the pytest suite runs `tensorbridge.nixl`'s tests against a real agent.
//! `--no-deps`: the wheel declares torch and the CUDA stack, which NIXL does not need.

use std::fs;
use std::path::PathBuf;

use anyhow::{Context as _, Result};

use crate::venv::Venv;
use crate::{Steps, root};

/// The requirements file, relative to the workspace root.
pub(crate) const REQUIREMENTS: &str = "python/requirements-nixl.txt";

/// The oldest CPython NIXL publishes wheels for.
const MIN_PYTHON: (u32, u32) = (3, 10);

/// `target/nixl/<env>` with NIXL installed for `env` (reinstalled when the requirements file
/// changed), or `None` where NIXL has no wheel for its interpreter (said as a skipped step).
pub(crate) fn install(steps: &mut Steps, env: &Venv) -> Result<Option<PathBuf>> {
    let (major, minor) = env.python_version()?;
    let name = format!(
        "NIXL: pip install --no-deps -r {REQUIREMENTS} ({})",
        env.name()
    );
    if (major, minor) < MIN_PYTHON {
        steps.skip(
            &name,
            &format!("NIXL has no wheel for CPython {major}.{minor} (3.10 to 3.14 have one)"),
        );
        return Ok(None);
    }
    let requirements = root().join(REQUIREMENTS);
    let text = fs::read_to_string(&requirements)
        .with_context(|| format!("reading {}", requirements.display()))?;
    let dir = root().join("target").join("nixl").join(env.name());
    let stamp = dir.join(".requirements");
    if fs::read_to_string(&stamp).ok().as_deref() == Some(text.as_str()) {
        return Ok(Some(dir));
    }
    if dir.exists() {
        fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    let mut pip = env.python_cmd();
    pip.args([
        "-m",
        "pip",
        "install",
        "--disable-pip-version-check",
        "--no-deps",
        "--target",
    ])
    .arg(&dir)
    .arg("-r")
    .arg(&requirements);
    steps.cmd(&name, &mut pip)?;
    fs::write(&stamp, &text).with_context(|| format!("writing {}", stamp.display()))?;
    Ok(Some(dir))
}
