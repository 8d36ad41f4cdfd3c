//! A CUDA 13.0 toolkit made of PyPI's NVIDIA wheels, for the one part of the workspace that
//! needs CUDA at build time: candle's CUDA half (`tensorbridge-candle`'s `cuda` feature).
//!
//! candle-core's `cuda` feature compiles candle's kernels with nvcc (the `candle-kernels`
//! build script) and builds cudarc with `dynamic-linking`, which links libcuda, NVRTC,
//! cuBLAS(Lt) and cuRAND. The build machine has no CUDA toolkit and no driver; PyPI has every
//! piece but the driver:
//! - nvcc, its C runtime headers, CCCL (`nv/target`), NVVM (cicc), the runtime headers;
//! - NVRTC, cuBLAS and cuRAND (the libraries candle's cudarc links);
//! - no libcuda: that is the driver's. What the linker needs is a library named
//!   `libcuda.so` that defines the driver functions cudarc declares (the CUDA toolkit's own
//!   `lib/stubs/libcuda.so` is exactly that); this module compiles one from cudarc's
//!   bindings with `cc`, with the soname `libcuda.so.1`, so binaries load the real driver
//!   on the GPU machine.
//!
//! Everything lives in `target/cuda-toolkit/` (a Python environment for the wheels), with a
//! stamp written only after a complete install: a missing or half-made toolkit is rebuilt,
//! never assumed. [`Toolkit::apply`] points a cargo command at it (`CUDA_HOME`, nvcc on
//! `PATH`, `CUDA_COMPUTE_CAP=90`: the GPU machines' H100/H200).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, Result, bail};

use crate::{Steps, root};

/// The wheels, CUDA 13.0 throughout (the GPU machine's driver is CUDA 13.0: PTX from a newer
/// nvcc would not load there).
const WHEELS: &[&str] = &[
    "nvidia-cuda-nvcc==13.0.88",
    "nvidia-cuda-crt==13.0.88",
    "nvidia-cuda-cccl==13.0.85",
    "nvidia-nvvm==13.0.88",
    "nvidia-cuda-runtime==13.0.96",
    "nvidia-cuda-nvrtc==13.0.88",
    "nvidia-cublas==13.1.0.3",
    "nvidia-curand==10.4.0.35",
];

/// The libraries candle links, as the wheels name them: (link name, file). cudarc links the
/// first four; candle-kernels links the CUDA runtime for its statically built kernels.
const LINKED: &[(&str, &str)] = &[
    ("cudart", "libcudart.so.13"),
    ("nvrtc", "libnvrtc.so.13"),
    ("cublas", "libcublas.so.13"),
    ("cublasLt", "libcublasLt.so.13"),
    ("curand", "libcurand.so.10"),
];

/// The GPU machines' compute capability (H100 and H200: sm_90), for candle's kernels.
pub(crate) const COMPUTE_CAP: &str = "90";

/// Written after a complete install: what was installed.
const STAMP: &str = ".tensorbridge-cuda-toolkit";

/// An installed toolkit: the `nvidia/cu13` directory of the environment.
pub(crate) struct Toolkit {
    home: PathBuf,
}

impl Toolkit {
    /// Points `cmd` (a cargo command, or maturin's) at the toolkit: its `bin` goes in front
    /// of the `PATH` the command already has (a virtual environment's, say), or of this
    /// process's.
    pub(crate) fn apply(&self, cmd: &mut Command) {
        let mut path = std::ffi::OsString::from(self.home.join("bin"));
        let set = cmd
            .get_envs()
            .find(|(key, _)| *key == "PATH")
            .and_then(|(_, value)| value.map(std::ffi::OsStr::to_os_string));
        if let Some(old) = set.or_else(|| std::env::var_os("PATH")) {
            path.push(":");
            path.push(old);
        }
        cmd.env("CUDA_HOME", &self.home)
            .env("CUDA_COMPUTE_CAP", COMPUTE_CAP)
            .env("PATH", path);
    }
}

/// Installs the toolkit when it is missing or incomplete, with `python` (an interpreter that
/// can make a virtual environment), and returns it.
pub(crate) fn ensure(steps: &mut Steps, python: &Path) -> Result<Toolkit> {
    let dir = root().join("target").join("cuda-toolkit");
    let stamp_text = format!(
        "{}\nstub from cudarc {}\n",
        WHEELS.join("\n"),
        cudarc_version()?
    );
    let venv_python = dir.join("bin").join("python");
    if fs::read_to_string(dir.join(STAMP)).ok().as_deref() == Some(stamp_text.as_str()) {
        let home = home(&venv_python)?;
        if home.join("bin").join("nvcc").is_file() {
            println!("==> cuda toolkit: {} is complete", home.display());
            return Ok(Toolkit { home });
        }
    }
    crate::venv::remove_dir(&dir)?;
    steps.cmd(
        "cuda toolkit: environment",
        Command::new(python).args(["-m", "venv"]).arg(&dir),
    )?;
    steps.cmd(
        "cuda toolkit: pip install (nvcc, headers, NVRTC, cuBLAS, cuRAND)",
        Command::new(&venv_python)
            .args(["-m", "pip", "install", "--disable-pip-version-check"])
            .args(WHEELS),
    )?;
    let home = home(&venv_python)?;
    steps.run("cuda toolkit: libcuda link stub and library names", || {
        link_names(&home)?;
        libcuda_stub(&home)
    })?;
    fs::write(dir.join(STAMP), stamp_text).context("writing the toolkit's stamp")?;
    Ok(Toolkit { home })
}

/// `nvidia/cu13` in the environment's site-packages.
fn home(python: &Path) -> Result<PathBuf> {
    let out = Command::new(python)
        .args([
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        ])
        .output()
        .with_context(|| format!("running {}", python.display()))?;
    if !out.status.success() {
        bail!("{} could not report its site-packages", python.display());
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
        .join("nvidia")
        .join("cu13"))
}

/// The unversioned names the linker looks for (`-lnvrtc` wants `libnvrtc.so`).
fn link_names(home: &Path) -> Result<()> {
    let lib = home.join("lib");
    for (name, file) in LINKED {
        if !lib.join(file).is_file() {
            bail!("{} is missing from the toolkit", lib.join(file).display());
        }
        let link = lib.join(format!("lib{name}.so"));
        let _ = fs::remove_file(&link);
        std::os::unix::fs::symlink(file, &link)
            .with_context(|| format!("linking {}", link.display()))?;
    }
    Ok(())
}

/// `lib/stubs/libcuda.so`: every driver function cudarc's bindings declare, as an empty
/// function, with the soname of the real driver library.
fn libcuda_stub(home: &Path) -> Result<()> {
    let bindings = cudarc_source()?
        .join("src")
        .join("driver")
        .join("sys")
        .join("mod.rs");
    let text =
        fs::read_to_string(&bindings).with_context(|| format!("reading {}", bindings.display()))?;
    let mut names: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("pub unsafe fn "))
        .filter_map(|l| l.split('(').next())
        .filter(|n| n.starts_with("cu"))
        .collect();
    names.sort_unstable();
    names.dedup();
    if names.len() < 100 {
        bail!(
            "found only {} driver functions in {} (expected hundreds)",
            names.len(),
            bindings.display()
        );
    }
    let stubs = home.join("lib").join("stubs");
    fs::create_dir_all(&stubs)?;
    let source = stubs.join("libcuda_stub.c");
    let body: String = names
        .iter()
        .map(|n| format!("void {n}(void) {{}}\n"))
        .collect();
    fs::write(&source, body)?;
    let status = Command::new(std::env::var_os("CC").unwrap_or_else(|| "cc".into()))
        .args(["-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o"])
        .arg(stubs.join("libcuda.so"))
        .arg(&source)
        .status()
        .context("running the C compiler for the libcuda stub")?;
    if !status.success() {
        bail!("the C compiler failed on {}", source.display());
    }
    Ok(())
}

/// The cudarc version in `Cargo.lock`.
fn cudarc_version() -> Result<String> {
    let lock = fs::read_to_string(root().join("Cargo.lock")).context("reading Cargo.lock")?;
    let mut lines = lock.lines();
    while let Some(line) = lines.next() {
        if line == "name = \"cudarc\""
            && let Some(v) = lines.next().and_then(|l| l.strip_prefix("version = \""))
        {
            return Ok(v.trim_end_matches('"').to_owned());
        }
    }
    bail!("no cudarc in Cargo.lock")
}

/// cudarc's unpacked source in cargo's registry (`cargo fetch` first, so it is there).
fn cudarc_source() -> Result<PathBuf> {
    let version = cudarc_version()?;
    crate::run_status(crate::cargo().arg("fetch"))?;
    let src = crate::cargo_home()?.join("registry").join("src");
    for index in fs::read_dir(&src).with_context(|| format!("reading {}", src.display()))? {
        let dir = index?.path().join(format!("cudarc-{version}"));
        if dir.is_dir() {
            return Ok(dir);
        }
    }
    bail!("cudarc {version}'s source is not in {}", src.display())
}
