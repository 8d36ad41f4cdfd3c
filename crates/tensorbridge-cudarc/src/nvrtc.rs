//! NVRTC, found and called by this crate: libnvrtc is searched where the CUDA toolkit and
//! pip put it (cudarc looks only on the loader's path, so a process where no framework
//! mapped it first could not compile), and a source is compiled with name expressions (C++
//! templates by name), for a chosen architecture, to a CUBIN or PTX image.
//!
//! # Where libnvrtc is looked for, in order
//! 1. A libnvrtc the process has already mapped (PyTorch, CuPy or JAX loaded theirs): the
//!    same library, so one NVRTC serves the process.
//! 2. `TENSORBRIDGE_NVRTC`, the path of a libnvrtc file, when set.
//! 3. Every `site-packages` / `dist-packages` directory a library the process has mapped lives
//!    in (the Python extension module itself, CuPy's, jaxlib's), then those of
//!    `$VIRTUAL_ENV` and `$CONDA_PREFIX`: `nvidia/cu13/lib` (the CUDA 13 wheels) and
//!    `nvidia/cuda_nvrtc/lib` (the CUDA 12 wheel `nvidia-cuda-nvrtc-cu12`).
//! 4. `$CUDA_HOME` and `$CUDA_PATH` (`lib64`, then `lib`), then `/usr/local/cuda/lib64`.
//! 5. The loader's own search by name (`LD_LIBRARY_PATH`, the executable's rpath, the
//!    `ldconfig` cache): `libnvrtc.so.13`, `libnvrtc.so.12`, `libnvrtc.so`.
//!
//! In each directory the names are tried in that order too (`libnvrtc.so.13` first). The
//! library found, and the `libnvrtc-builtins` beside it (which NVRTC opens by name when it
//! compiles, and the loader would not find in a wheel's directory), stay loaded for the life
//! of the process; [`nvrtc_path`] says which.
//!
//! # What is trusted
//! Opening a library runs its initialisers, so a path is opened only when it cannot depend on
//! the current directory (which may be an untrusted checkout): every variable above counts
//! only when it holds an absolute path. An empty value (`ENV CUDA_HOME=` in an image) or a
//! relative one is ignored as if unset, never joined (joined, `""` became `lib64/...` and
//! `lib/python*/site-packages/...` under the current directory). Mapped libraries are named
//! by absolute paths. The builtins library is opened by the one name NVRTC's version implies
//! (`libnvrtc-builtins.so.MAJOR.MINOR`) in the directory NVRTC was found in, not by a
//! pattern. Step 5 is the loader's: a bare name, which `dlopen` never resolves against the
//! current directory (unless `LD_LIBRARY_PATH` itself names it, which is the loader's rule
//! and the environment's choice). The candidates are a function of the environment and
//! the mapped libraries ([`candidates`]), tested without NVRTC.

use std::ffi::{CStr, CString, OsString, c_char, c_int, c_void};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::Error;

type Program = *mut c_void;
type NvrtcResult = c_int;

/// The NVRTC functions this crate calls, resolved once.
struct Api {
    /// Keeps the library mapped (never unloaded: the functions below point into it).
    _lib: libloading::Library,
    path: PathBuf,
    version: unsafe extern "C" fn(*mut c_int, *mut c_int) -> NvrtcResult,
    num_archs: Option<unsafe extern "C" fn(*mut c_int) -> NvrtcResult>,
    archs: Option<unsafe extern "C" fn(*mut c_int) -> NvrtcResult>,
    create: unsafe extern "C" fn(
        *mut Program,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> NvrtcResult,
    destroy: unsafe extern "C" fn(*mut Program) -> NvrtcResult,
    add_name: unsafe extern "C" fn(Program, *const c_char) -> NvrtcResult,
    compile: unsafe extern "C" fn(Program, c_int, *const *const c_char) -> NvrtcResult,
    log_size: unsafe extern "C" fn(Program, *mut usize) -> NvrtcResult,
    log: unsafe extern "C" fn(Program, *mut c_char) -> NvrtcResult,
    ptx_size: unsafe extern "C" fn(Program, *mut usize) -> NvrtcResult,
    ptx: unsafe extern "C" fn(Program, *mut c_char) -> NvrtcResult,
    cubin_size: unsafe extern "C" fn(Program, *mut usize) -> NvrtcResult,
    cubin: unsafe extern "C" fn(Program, *mut c_char) -> NvrtcResult,
    lowered: unsafe extern "C" fn(Program, *const c_char, *mut *const c_char) -> NvrtcResult,
    error_string: unsafe extern "C" fn(NvrtcResult) -> *const c_char,
}

impl Api {
    /// Opens `name` (a path, or a bare name for the loader's search) and resolves the
    /// functions; `None` when it is not there or is not NVRTC.
    fn open(name: &Path) -> Option<Api> {
        // SAFETY: loading runs the library's initialisers, as any use of NVRTC would; a file
        // named like libnvrtc is taken to be NVRTC (its symbols are checked below, and typed
        // as NVRTC's public header declares them).
        let lib = unsafe { libloading::Library::new(name) }.ok()?;
        /// One symbol as a plain function pointer (valid while `lib` is loaded: forever).
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the symbol is NVRTC's function of that name, whose C signature is the
                // field's type (nvrtc.h); the library stays loaded as long as `Api` (which is
                // never dropped once found).
                *unsafe { lib.get(concat!($name, "\0").as_bytes()) }.ok()?
            };
        }
        macro_rules! opt_sym {
            ($name:literal) => {
                // SAFETY: as for `sym!`; absent from NVRTC before CUDA 11.2.
                unsafe { lib.get(concat!($name, "\0").as_bytes()) }
                    .ok()
                    .map(|s| *s)
            };
        }
        let api = Api {
            version: sym!("nvrtcVersion"),
            num_archs: opt_sym!("nvrtcGetNumSupportedArchs"),
            archs: opt_sym!("nvrtcGetSupportedArchs"),
            create: sym!("nvrtcCreateProgram"),
            destroy: sym!("nvrtcDestroyProgram"),
            add_name: sym!("nvrtcAddNameExpression"),
            compile: sym!("nvrtcCompileProgram"),
            log_size: sym!("nvrtcGetProgramLogSize"),
            log: sym!("nvrtcGetProgramLog"),
            ptx_size: sym!("nvrtcGetPTXSize"),
            ptx: sym!("nvrtcGetPTX"),
            cubin_size: sym!("nvrtcGetCUBINSize"),
            cubin: sym!("nvrtcGetCUBIN"),
            lowered: sym!("nvrtcGetLoweredName"),
            error_string: sym!("nvrtcGetErrorString"),
            path: name.to_path_buf(),
            _lib: lib,
        };
        // A bare name was the loader's search, which finds the builtins by name too.
        if let Some(dir) = name.parent().filter(|d| d.is_absolute()) {
            let (mut major, mut minor) = (0, 0);
            // SAFETY: two live out-parameters NVRTC writes once each.
            if unsafe { (api.version)(&mut major, &mut minor) } == 0 {
                preload_builtins(&dir.join(builtins_name(major, minor)));
            }
        }
        Some(api)
    }

    /// NVRTC's name for a result code.
    fn describe(&self, result: NvrtcResult) -> String {
        // SAFETY: `nvrtcGetErrorString` takes any value and returns a static NUL-terminated
        // string (or null).
        let s = unsafe { (self.error_string)(result) };
        if s.is_null() {
            return format!("NVRTC error {result}");
        }
        // SAFETY: non-null, NUL-terminated, static (NVRTC's own table).
        unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned()
    }
}

/// The file name of the builtins library NVRTC `major.minor` opens by name when it compiles
/// (its soname: `libnvrtc-builtins.so.13.0` for NVRTC 13.0).
fn builtins_name(major: c_int, minor: c_int) -> String {
    format!("libnvrtc-builtins.so.{major}.{minor}")
}

/// Maps `file`, the builtins library beside a libnvrtc found in an absolute directory, for
/// good: NVRTC opens it by name when it compiles, which the loader finds only on its own path
/// (a wheel's directory is not), or already mapped (it is then, by its soname). Nothing else
/// in the directory is opened.
fn preload_builtins(file: &Path) {
    if !file.is_file() {
        return;
    }
    // SAFETY: NVRTC's own builtins library, by the exact name NVRTC loads, beside it in the
    // directory NVRTC was found in (an absolute path); loading runs its initialisers, as
    // NVRTC's own load would. Kept mapped for the life of the process (NVRTC finds it by
    // soname whenever it compiles).
    if let Ok(lib) = unsafe { libloading::Library::new(file) } {
        std::mem::forget(lib);
    }
}

/// The library names tried in each directory, newest first.
const NAMES: [&str; 3] = ["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"];

/// NVRTC, searched once per process (see the module docs); `None` when it is nowhere.
fn api() -> Option<&'static Api> {
    static API: OnceLock<Option<Api>> = OnceLock::new();
    API.get_or_init(|| search().into_iter().find_map(|p| Api::open(&p)))
        .as_ref()
}

/// Whether libnvrtc could be found and loaded (searched once per process, in the order the
/// crate docs give: "NVRTC").
pub fn nvrtc_present() -> bool {
    api().is_some()
}

/// Where the libnvrtc this crate compiles with was found (a file path, or the bare name the
/// loader resolved); `None` when there is none.
pub fn nvrtc_path() -> Option<&'static Path> {
    api().map(|a| a.path.as_path())
}

/// NVRTC's version (major, minor).
pub fn nvrtc_version() -> Option<(i32, i32)> {
    let api = api()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: two live out-parameters NVRTC writes once each.
    let r = unsafe { (api.version)(&mut major, &mut minor) };
    (r == 0).then_some((major, minor))
}

/// The candidates of this process, in the order of the module docs.
fn search() -> Vec<PathBuf> {
    candidates(&|name| std::env::var_os(name), &mapped_libraries())
}

/// A variable's value when it names a place that does not depend on the current directory:
/// an absolute path. Empty and relative values are ignored as if unset.
fn absolute(value: Option<OsString>) -> Option<PathBuf> {
    let path = PathBuf::from(value?);
    path.is_absolute().then_some(path)
}

/// The candidates for the environment `var` reads and the `mapped` libraries, in the order
/// of the module docs: absolute paths of files that exist, then the loader's bare names.
/// Reads nothing but `var` and the file system under absolute paths.
fn candidates(var: &dyn Fn(&str) -> Option<OsString>, mapped: &[PathBuf]) -> Vec<PathBuf> {
    let mapped: Vec<&PathBuf> = mapped.iter().filter(|p| p.is_absolute()).collect();
    let mut found: Vec<PathBuf> = mapped
        .iter()
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| NAMES.iter().any(|want| n.starts_with(want)))
        })
        .map(|p| (*p).clone())
        .collect();
    if let Some(explicit) = absolute(var("TENSORBRIDGE_NVRTC")) {
        found.push(explicit);
    }
    let mut dirs: Vec<PathBuf> = Vec::new();
    let mut site_packages: Vec<PathBuf> =
        mapped.iter().filter_map(|p| site_packages_of(p)).collect();
    for name in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
        if let Some(prefix) = absolute(var(name)) {
            site_packages.extend(site_packages_under(&prefix));
        }
    }
    for sp in site_packages {
        dirs.push(sp.join("nvidia/cu13/lib"));
        dirs.push(sp.join("nvidia/cuda_nvrtc/lib"));
    }
    for name in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(home) = absolute(var(name)) {
            dirs.push(home.join("lib64"));
            dirs.push(home.join("lib"));
        }
    }
    dirs.push(PathBuf::from("/usr/local/cuda/lib64"));
    let mut seen: Vec<PathBuf> = Vec::new();
    for dir in dirs {
        if seen.contains(&dir) {
            continue;
        }
        for name in NAMES {
            let file = dir.join(name);
            if file.is_file() {
                found.push(file);
            }
        }
        seen.push(dir);
    }
    // Every path so far is absolute (built only from absolute ones); kept so by construction
    // and checked here, since opening a relative one would resolve it against the current
    // directory.
    found.retain(|p| p.is_absolute());
    // The loader's own search, by name.
    found.extend(NAMES.iter().map(PathBuf::from));
    found
}

/// The files of the libraries mapped into this process (`/proc/self/maps`; empty elsewhere).
fn mapped_libraries() -> Vec<PathBuf> {
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return Vec::new();
    };
    let mut libs: Vec<PathBuf> = Vec::new();
    for line in maps.lines() {
        // address perms offset dev inode path
        let Some(path) = line.split_whitespace().nth(5) else {
            continue;
        };
        if path.starts_with('/') && path.contains(".so") {
            let p = PathBuf::from(path);
            if !libs.contains(&p) {
                libs.push(p);
            }
        }
    }
    libs
}

/// The `site-packages` (or `dist-packages`) directory `file` lies under, if any.
fn site_packages_of(file: &Path) -> Option<PathBuf> {
    let mut dir = file.parent();
    while let Some(d) = dir {
        if d.file_name()
            .is_some_and(|n| n == "site-packages" || n == "dist-packages")
        {
            return Some(d.to_path_buf());
        }
        dir = d.parent();
    }
    None
}

/// `prefix/lib/python3.*/site-packages` (and `Lib/site-packages`) directories.
fn site_packages_under(prefix: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(prefix.join("lib")) {
        for e in entries.flatten() {
            let name = e.file_name();
            if name.to_string_lossy().starts_with("python") {
                out.push(e.path().join("site-packages"));
            }
        }
    }
    out.push(prefix.join("Lib").join("site-packages"));
    out
}

/// What [`compile`] made: a CUBIN (real architecture) or PTX (virtual) image, and the lowered
/// (mangled) name of each name expression asked for.
pub(crate) struct Image {
    pub(crate) bytes: Vec<u8>,
    pub(crate) cubin: bool,
    pub(crate) lowered: Vec<String>,
}

/// The architecture option for a device of compute capability `cc` (`major * 10 + minor`): its
/// own (`sm_XY`, a CUBIN the driver loads as it is) when NVRTC knows it, else the newest
/// virtual architecture NVRTC knows below it (`compute_XY`, PTX the driver compiles for the
/// device), else `sm_XY` anyway (NVRTC's error then says why).
pub(crate) fn arch_for(cc: i32) -> String {
    let supported = supported_archs();
    if supported.is_empty() || supported.contains(&cc) {
        return format!("sm_{cc}");
    }
    match supported.iter().copied().filter(|a| *a <= cc).max() {
        Some(below) => format!("compute_{below}"),
        None => format!("sm_{cc}"),
    }
}

/// The real architectures NVRTC compiles for (`nvrtcGetSupportedArchs`), empty if it cannot
/// say.
fn supported_archs() -> Vec<i32> {
    let Some(api) = api() else {
        return Vec::new();
    };
    let (Some(num), Some(list)) = (api.num_archs, api.archs) else {
        return Vec::new();
    };
    let mut n: c_int = 0;
    // SAFETY: one live out-parameter.
    if unsafe { num(&mut n) } != 0 || n <= 0 {
        return Vec::new();
    }
    let mut archs = vec![0 as c_int; n as usize];
    // SAFETY: `archs` holds the `n` ints NVRTC writes.
    if unsafe { list(archs.as_mut_ptr()) } != 0 {
        return Vec::new();
    }
    archs
}

/// A program, destroyed when dropped.
struct Prog<'a> {
    api: &'a Api,
    prog: Program,
}

impl Drop for Prog<'_> {
    fn drop(&mut self) {
        // SAFETY: a program `nvrtcCreateProgram` made, destroyed once.
        unsafe { (self.api.destroy)(&mut self.prog) };
    }
}

/// Compiles `src` with `options` (each an NVRTC option such as `--gpu-architecture=sm_90`),
/// after adding `names` as name expressions; `kernel` is what errors name. The image is
/// CUBIN when the options name a real architecture (`sm_XY`), PTX otherwise.
pub(crate) fn compile(
    src: &str,
    kernel: &str,
    options: &[String],
    names: &[&str],
) -> Result<Image, Error> {
    let api = api().ok_or(Error::NoNvrtc)?;
    let refused = |log: String| Error::Compile {
        name: kernel.to_owned(),
        log,
    };
    let nul = || refused("the source, an option or the kernel name holds a NUL byte".to_owned());
    let c_src = CString::new(src).map_err(|_| nul())?;
    let c_opts = options
        .iter()
        .map(|o| CString::new(o.as_str()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| nul())?;
    let c_names = names
        .iter()
        .map(|n| CString::new(*n))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|_| nul())?;
    let mut prog: Program = std::ptr::null_mut();
    // SAFETY: `prog` is a live out-parameter; the source and name are NUL-terminated strings
    // that outlive the call; no headers (null arrays, count 0).
    let r = unsafe {
        (api.create)(
            &mut prog,
            c_src.as_ptr(),
            c"tensorbridge_kernel.cu".as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    if r != 0 {
        return Err(refused(api.describe(r)));
    }
    let prog = Prog { api, prog };
    for name in &c_names {
        // SAFETY: a live program; a NUL-terminated expression NVRTC copies.
        let r = unsafe { (api.add_name)(prog.prog, name.as_ptr()) };
        if r != 0 {
            return Err(refused(api.describe(r)));
        }
    }
    let ptrs: Vec<*const c_char> = c_opts.iter().map(|o| o.as_ptr()).collect();
    let count = c_int::try_from(ptrs.len()).map_err(|_| refused("too many options".into()))?;
    // SAFETY: a live program; `count` NUL-terminated options that outlive the call.
    let r = unsafe { (api.compile)(prog.prog, count, ptrs.as_ptr()) };
    if r != 0 {
        let log = read(prog.prog, api.log_size, api.log)
            .map(|bytes| String::from_utf8_lossy(trim_nul(&bytes)).into_owned())
            .unwrap_or_default();
        let what = api.describe(r);
        return Err(refused(if log.trim().is_empty() {
            what
        } else {
            log.trim_end().to_owned()
        }));
    }
    let real = options
        .iter()
        .any(|o| o.strip_prefix("--gpu-architecture=sm_").is_some());
    let bytes = if real {
        read(prog.prog, api.cubin_size, api.cubin)
    } else {
        read(prog.prog, api.ptx_size, api.ptx).map(|mut b| {
            // PTX is text: keep it without its NUL (cudarc adds one when it loads text).
            let len = trim_nul(&b).len();
            b.truncate(len);
            b
        })
    }
    .map_err(|r| refused(api.describe(r)))?;
    let mut lowered = Vec::with_capacity(c_names.len());
    for name in &c_names {
        let mut out: *const c_char = std::ptr::null();
        // SAFETY: a live, compiled program; the expression was added before compiling; `out`
        // is a live out-parameter NVRTC points at a string it owns until the program dies.
        let r = unsafe { (api.lowered)(prog.prog, name.as_ptr(), &mut out) };
        if r != 0 || out.is_null() {
            return Err(refused(api.describe(r)));
        }
        // SAFETY: non-null, NUL-terminated, alive until `prog` drops (after this copy).
        lowered.push(
            unsafe { CStr::from_ptr(out) }
                .to_string_lossy()
                .into_owned(),
        );
    }
    Ok(Image {
        bytes,
        cubin: real,
        lowered,
    })
}

/// A size-then-fill NVRTC getter's bytes.
fn read(
    prog: Program,
    size: unsafe extern "C" fn(Program, *mut usize) -> NvrtcResult,
    fill: unsafe extern "C" fn(Program, *mut c_char) -> NvrtcResult,
) -> Result<Vec<u8>, NvrtcResult> {
    let mut n = 0usize;
    // SAFETY: a live program; one live out-parameter.
    let r = unsafe { size(prog, &mut n) };
    if r != 0 {
        return Err(r);
    }
    let mut bytes = vec![0u8; n];
    // SAFETY: `bytes` holds the `n` bytes NVRTC writes.
    let r = unsafe { fill(prog, bytes.as_mut_ptr().cast()) };
    if r != 0 {
        return Err(r);
    }
    Ok(bytes)
}

fn trim_nul(bytes: &[u8]) -> &[u8] {
    match bytes.iter().position(|b| *b == 0) {
        Some(end) => &bytes[..end],
        None => bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn site_packages_are_found_above_a_library() {
        assert_eq!(
            site_packages_of(Path::new(
                "/v/lib/python3.12/site-packages/torch/lib/libtorch.so"
            )),
            Some(PathBuf::from("/v/lib/python3.12/site-packages"))
        );
        assert_eq!(
            site_packages_of(Path::new("/usr/lib/python3/dist-packages/cupy/x.so")),
            Some(PathBuf::from("/usr/lib/python3/dist-packages"))
        );
        assert_eq!(site_packages_of(Path::new("/usr/lib/libc.so.6")), None);
    }

    /// Every candidate is an absolute path, or one of the loader's bare names (which `dlopen`
    /// never resolves against the current directory).
    fn assert_not_relative(found: &[PathBuf]) {
        for p in found {
            assert!(
                p.is_absolute() || NAMES.iter().any(|n| p.as_os_str() == *n),
                "candidate {} depends on the current directory (all: {found:?})",
                p.display()
            );
        }
    }

    #[test]
    fn empty_and_relative_variables_are_ignored() {
        let cwd = std::env::current_dir().unwrap();
        for name in [
            "TENSORBRIDGE_NVRTC",
            "VIRTUAL_ENV",
            "CONDA_PREFIX",
            "CUDA_HOME",
            "CUDA_PATH",
        ] {
            for value in ["", ".", "rel", "rel/lib64/libnvrtc.so.13", "./x"] {
                let var = |n: &str| (n == name).then(|| OsString::from(value));
                let found = candidates(&var, &[]);
                assert_not_relative(&found);
                // Nothing under the current directory, whatever it holds.
                assert!(
                    found.iter().all(|p| !p.starts_with(&cwd)),
                    "{name}={value:?}"
                );
            }
        }
        // A relative "mapped" path (never in /proc/self/maps, but the input says so) too.
        let found = candidates(
            &|_| None,
            &[PathBuf::from(
                "lib/python3.12/site-packages/x/libnvrtc.so.13",
            )],
        );
        assert_not_relative(&found);
    }

    #[test]
    fn absolute_variables_are_searched() {
        let dir = scratch("absolute");
        let lib64 = dir.join("cuda/lib64");
        std::fs::create_dir_all(&lib64).unwrap();
        std::fs::write(lib64.join("libnvrtc.so.12"), b"").unwrap();
        let sp = dir.join("venv/lib/python3.12/site-packages/nvidia/cu13/lib");
        std::fs::create_dir_all(&sp).unwrap();
        std::fs::write(sp.join("libnvrtc.so.13"), b"").unwrap();
        let var = |n: &str| match n {
            "CUDA_HOME" => Some(dir.join("cuda").into_os_string()),
            "VIRTUAL_ENV" => Some(dir.join("venv").into_os_string()),
            "TENSORBRIDGE_NVRTC" => Some(OsString::from("/opt/nvrtc/libnvrtc.so.13")),
            _ => None,
        };
        let found = candidates(&var, &[]);
        assert_eq!(
            found[..3],
            [
                PathBuf::from("/opt/nvrtc/libnvrtc.so.13"),
                sp.join("libnvrtc.so.13"),
                lib64.join("libnvrtc.so.12"),
            ]
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn builtins_are_named_by_nvrtcs_version() {
        assert_eq!(builtins_name(13, 0), "libnvrtc-builtins.so.13.0");
        assert_eq!(builtins_name(12, 4), "libnvrtc-builtins.so.12.4");
    }

    /// A fresh scratch directory (absolute) for one test.
    fn scratch(what: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "tb-nvrtc-{what}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// Builds a shared library from C `source` into `out` with the system's `cc`.
    fn cc_shared(source: &str, out: &Path) {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let src = std::env::temp_dir().join(format!("tb-nvrtc-{}-{n}.c", std::process::id()));
        std::fs::write(&src, source).unwrap();
        let status = std::process::Command::new("cc")
            .args(["-shared", "-fPIC", "-o"])
            .arg(out)
            .arg(&src)
            .status()
            .expect("this test needs a C compiler (`cc`)");
        assert!(status.success(), "cc failed on {}", src.display());
        std::fs::remove_file(&src).unwrap();
    }

    /// A library whose initialiser creates the file `marker`: proof that someone opened it.
    fn planted(marker: &Path) -> String {
        let marker = marker.to_str().unwrap();
        assert!(!marker.contains(['"', '\\']), "a plain path: {marker}");
        format!(
            r#"
            #include <stdio.h>
            __attribute__((constructor)) static void planted(void) {{
                FILE *f = fopen("{marker}", "w");
                if (f) fclose(f);
            }}
            "#
        )
    }

    /// Set in the child processes the tests below start (the test binary itself, running one
    /// test in a directory and environment of the parent's choosing).
    const CHILD: &str = "TB_NVRTC_CHILD";

    /// The variables the search reads, removed from each child but the one under test.
    const VARS: [&str; 5] = [
        "TENSORBRIDGE_NVRTC",
        "VIRTUAL_ENV",
        "CONDA_PREFIX",
        "CUDA_HOME",
        "CUDA_PATH",
    ];

    /// Runs the test `name` of this binary in a child process, in `cwd`, with `vars` set
    /// (the others of [`VARS`] removed); the check that it passed, to be run after any
    /// check of what it left behind.
    fn run_child(name: &str, cwd: &Path, vars: &[(&str, &OsString)]) -> impl FnOnce() + use<> {
        let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
        cmd.args([name, "--exact", "--nocapture", "--test-threads=1"])
            .current_dir(cwd)
            .env(CHILD, "1");
        for v in VARS {
            cmd.env_remove(v);
        }
        for (k, v) in vars {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        let what = format!("child {name} with {vars:?}");
        move || {
            assert!(
                out.status.success(),
                "{what} failed:\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }

    /// A library planted at every path an empty or relative variable would have led to, in
    /// the child's current directory, is never opened: each variable set empty, then
    /// relative, in a process of its own (the search runs once per process).
    #[test]
    fn planted_libraries_under_the_working_directory_never_load() {
        const SELF: &str = "nvrtc::tests::planted_libraries_under_the_working_directory_never_load";
        if std::env::var_os(CHILD).is_some() {
            let found = search();
            // Opens the candidates in order until one is NVRTC (none is here, unless the
            // machine has one, which then comes first).
            let _ = nvrtc_present();
            assert_not_relative(&found);
            return;
        }
        let dir = scratch("planted");
        let marker = dir.join("marker");
        let lib = dir.join("planted.so");
        cc_shared(&planted(&marker), &lib);
        // The planted library does write its marker when opened, so the marker's absence
        // below means it was not opened.
        // SAFETY: the test's own library, whose initialiser only creates a file.
        drop(unsafe { libloading::Library::new(&lib) }.unwrap());
        assert!(
            marker.exists(),
            "the planted library's initialiser writes its marker"
        );
        std::fs::remove_file(&marker).unwrap();
        let cwd = dir.join("checkout");
        for prefix in ["", "rel/"] {
            for sub in [
                "lib64",
                "lib",
                "lib/python3.12/site-packages/nvidia/cu13/lib",
                "lib/python3.12/site-packages/nvidia/cuda_nvrtc/lib",
                "Lib/site-packages/nvidia/cu13/lib",
            ] {
                let d = cwd.join(prefix).join(sub);
                std::fs::create_dir_all(&d).unwrap();
                for name in NAMES {
                    std::fs::copy(&lib, d.join(name)).unwrap();
                }
            }
        }
        // Every case is run, and every failure reported at once.
        let mut failures: Vec<String> = Vec::new();
        let mut runs = 0;
        for var in VARS {
            for value in [
                "",
                "rel",
                "rel/lib64/libnvrtc.so.13",
                "lib64/libnvrtc.so.13",
            ] {
                let passed = run_child(SELF, &cwd, &[(var, &OsString::from(value))]);
                if marker.exists() {
                    failures.push(format!("{var}={value:?}: a planted library was opened"));
                    std::fs::remove_file(&marker).unwrap();
                }
                if let Err(e) = std::panic::catch_unwind(passed) {
                    let why = e.downcast_ref::<String>().cloned().unwrap_or_default();
                    failures.push(format!("{var}={value:?}: {why}"));
                }
                runs += 1;
            }
        }
        assert_eq!(runs, VARS.len() * 4);
        assert!(failures.is_empty(), "{}", failures.join("\n"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A stand-in NVRTC 13.0 (every function the crate resolves, doing nothing) found through
    /// `TENSORBRIDGE_NVRTC`: beside it, the builtins of its version are opened and a file that
    /// only starts like a builtins library is not.
    #[test]
    fn only_the_builtins_of_nvrtcs_version_are_opened() {
        const SELF: &str = "nvrtc::tests::only_the_builtins_of_nvrtcs_version_are_opened";
        if std::env::var_os(CHILD).is_some() {
            assert!(nvrtc_present(), "the stand-in NVRTC loads");
            assert_eq!(nvrtc_version(), Some((13, 0)));
            return;
        }
        let dir = scratch("builtins");
        let lib = dir.join("lib");
        std::fs::create_dir_all(&lib).unwrap();
        let stub = [
            "nvrtcGetNumSupportedArchs",
            "nvrtcGetSupportedArchs",
            "nvrtcCreateProgram",
            "nvrtcDestroyProgram",
            "nvrtcAddNameExpression",
            "nvrtcCompileProgram",
            "nvrtcGetProgramLogSize",
            "nvrtcGetProgramLog",
            "nvrtcGetPTXSize",
            "nvrtcGetPTX",
            "nvrtcGetCUBINSize",
            "nvrtcGetCUBIN",
            "nvrtcGetLoweredName",
        ]
        .map(|f| format!("int {f}(void) {{ return 1; }}\n"))
        .concat();
        let fake = format!(
            "{stub}int nvrtcVersion(int *major, int *minor) {{ *major = 13; *minor = 0; return 0; }}\n\
             const char *nvrtcGetErrorString(int r) {{ (void)r; return \"stand-in\"; }}\n"
        );
        cc_shared(&fake, &lib.join("libnvrtc.so.13"));
        // The right builtins write one marker, the impostors another.
        let marker = dir.join("builtins-marker");
        let impostor = dir.join("impostor-marker");
        cc_shared(&planted(&marker), &lib.join("libnvrtc-builtins.so.13.0"));
        for name in ["libnvrtc-builtins.so.13.0.evil", "libnvrtc-builtins.so"] {
            cc_shared(&planted(&impostor), &lib.join(name));
        }
        let nvrtc = lib.join("libnvrtc.so.13").into_os_string();
        let passed = run_child(SELF, &dir, &[("TENSORBRIDGE_NVRTC", &nvrtc)]);
        assert!(
            !impostor.exists(),
            "a file only named like the builtins was opened"
        );
        passed();
        assert!(marker.exists(), "the builtins of NVRTC 13.0 were preloaded");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_search_ends_with_the_loaders_names() {
        let found = search();
        let tail: Vec<_> = found[found.len() - NAMES.len()..].to_vec();
        assert_eq!(tail, NAMES.map(PathBuf::from));
    }
}
