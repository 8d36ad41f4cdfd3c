//! The stand-in CUDA driver's step of `ci`: the sharing path (`tensorbridge_cuda::ipc`, the
//! Python `share` / `open`) through `tensorbridge-cuda-standin`, a libcuda that simulates
//! device memory with host shared memory, so that a machine without a GPU runs it.
//!
//! The stand-in is built as `libtensorbridge_cuda_standin.so` (never `libcuda.so` in a cargo
//! target directory: cargo puts those folders on the library path of every test it runs,
//! where a `libcuda.so` would replace the real driver for all of them) and copied into
//! `target/cuda-standin` as `libcuda.so.1`, with `libcuda.so` linking to it: cudarc opens
//! the one, `tensorbridge_cuda::driver_present` the other, and both must load the same
//! library. Only the driver tests get that folder on `LD_LIBRARY_PATH`.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};

use crate::venv::Venv;
use crate::{Steps, root};

/// Where the stand-in is put as `libcuda.so.1` and `libcuda.so`.
pub(crate) fn dir() -> PathBuf {
    root().join("target").join("cuda-standin")
}

/// `LD_LIBRARY_PATH` with the stand-in's folder first.
pub(crate) fn library_path() -> std::ffi::OsString {
    let mut path = dir().into_os_string();
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|p| !p.is_empty()) {
        path.push(":");
        path.push(old);
    }
    path
}

/// `cargo xtask test-standin`: this module's `ci` step, then the wheels for the pinned
/// environment and the Python driver tests through the stand-in: what `ci` runs of the
/// sharing path, alone.
pub(crate) fn task(args: &[String]) -> Result<()> {
    if let Some(arg) = args.first() {
        bail!("unknown option `{arg}` for `test-standin` (it takes none)");
    }
    let mut steps = Steps::new("test-standin");
    let result = (|| {
        let venv = crate::venv::ensure(&mut steps)?;
        run(&mut steps, &venv)?;
        let site = crate::ci::build_and_install_wheels(&mut steps, &venv)?;
        crate::ci::pytest_standin(&mut steps, &venv, &site)
    })();
    steps.finish(result)
}

/// The `ci` step: builds the stand-in, then runs tensorbridge-cuda's driver tests
/// (`cuda_driver`) through it. The Python driver tests run with each environment's pytest
/// suite (`ci::pytest`), once the wheels exist.
pub(crate) fn run(steps: &mut Steps, venv: &Venv) -> Result<()> {
    steps.run("stand-in driver: build", build)?;
    steps.cmd(
        "stand-in driver: cargo test -p tensorbridge-cuda --test cuda_driver",
        venv.cargo()
            .args([
                "test",
                "-p",
                "tensorbridge-cuda",
                "--features",
                "driver-tests",
                "--test",
                "cuda_driver",
            ])
            .env("LD_LIBRARY_PATH", library_path())
            // Two devices, so that the tests of a share on a second GPU run.
            .env("TB_STANDIN_DEVICES", "2"),
    )
}

/// Builds the stand-in and puts it in [`dir`] under the driver's two names.
fn build() -> Result<()> {
    let mut cmd = crate::cargo();
    cmd.args(["build", "-p", "tensorbridge-cuda-standin"]);
    let messages = crate::test_gpu::cargo_messages(&mut cmd)?;
    let Some(built) = built_library(&messages) else {
        bail!("cargo reported no libtensorbridge_cuda_standin.so among its artifacts");
    };
    install(&built, &dir())
}

/// The stand-in's shared library among cargo's `--message-format=json` lines.
fn built_library(json_lines: &str) -> Option<PathBuf> {
    json_lines
        .lines()
        .filter(|l| l.contains(r#""reason":"compiler-artifact""#))
        .flat_map(|l| l.split('"'))
        .find(|s| s.ends_with("/libtensorbridge_cuda_standin.so"))
        .map(PathBuf::from)
}

/// Copies `lib` into `dir` as `libcuda.so.1` and links `libcuda.so` to it (the same file:
/// the loader then loads it once whichever name a caller opens).
fn install(lib: &Path, dir: &Path) -> Result<()> {
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let real = dir.join("libcuda.so.1");
    let link = dir.join("libcuda.so");
    // Replaced, not written over: a process of an earlier run may still map the old file.
    for old in [&real, &link] {
        match fs::remove_file(old) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("removing {}", old.display())),
        }
    }
    fs::copy(lib, &real)
        .with_context(|| format!("copying {} to {}", lib.display(), real.display()))?;
    std::os::unix::fs::symlink("libcuda.so.1", &link)
        .with_context(|| format!("linking {}", link.display()))?;
    println!("stand-in driver: {}", real.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_library_is_found_among_cargo_messages() {
        let lines = concat!(
            r#"{"reason":"compiler-artifact","target":{"name":"libc"},"filenames":["/t/debug/deps/liblibc-1.rlib"]}"#,
            "\n",
            r#"{"reason":"compiler-artifact","target":{"name":"tensorbridge_cuda_standin"},"filenames":["/t/debug/libtensorbridge_cuda_standin.so"]}"#,
            "\n",
            r#"{"reason":"build-finished","success":true}"#,
        );
        assert_eq!(
            built_library(lines),
            Some(PathBuf::from("/t/debug/libtensorbridge_cuda_standin.so"))
        );
        assert_eq!(built_library(r#"{"reason":"build-finished"}"#), None);
    }

    #[test]
    fn install_gives_both_names_to_one_file_and_replaces_an_old_one() {
        let tmp = std::env::temp_dir().join(format!("tb-standin-install-{}", std::process::id()));
        let _ = fs::remove_dir_all(&tmp);
        fs::create_dir_all(&tmp).unwrap();
        let lib = tmp.join("built.so");
        let dir = tmp.join("out");
        for content in ["first", "second"] {
            fs::write(&lib, content).unwrap();
            install(&lib, &dir).unwrap();
            assert_eq!(
                fs::read_to_string(dir.join("libcuda.so.1")).unwrap(),
                content
            );
            assert_eq!(fs::read_to_string(dir.join("libcuda.so")).unwrap(), content);
            assert_eq!(
                fs::read_link(dir.join("libcuda.so")).unwrap(),
                Path::new("libcuda.so.1")
            );
        }
        fs::remove_dir_all(&tmp).unwrap();
    }
}
