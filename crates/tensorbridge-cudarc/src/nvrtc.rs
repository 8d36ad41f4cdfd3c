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

use std::ffi::{CStr, CString, c_char, c_int, c_void};
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
        if let Some(dir) = name.parent().filter(|d| !d.as_os_str().is_empty()) {
            preload_builtins(dir);
        }
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
        Some(Api {
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
        })
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

/// Maps the `libnvrtc-builtins` beside a libnvrtc found in `dir`, for good: NVRTC opens it by
/// name when it compiles, which the loader finds only on its own path (a wheel's directory is
/// not), or already mapped (it is then, by its soname).
fn preload_builtins(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("libnvrtc-builtins.so") {
            // SAFETY: NVRTC's own builtins library, beside it, which NVRTC itself would load;
            // loading runs its initialisers. Kept mapped for the life of the process (NVRTC
            // finds it by soname whenever it compiles).
            if let Ok(lib) = unsafe { libloading::Library::new(e.path()) } {
                std::mem::forget(lib);
            }
        }
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

/// The candidates, in the order of the module docs.
fn search() -> Vec<PathBuf> {
    let mapped = mapped_libraries();
    let mut found: Vec<PathBuf> = mapped
        .iter()
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| NAMES.iter().any(|want| n.starts_with(want)))
        })
        .cloned()
        .collect();
    if let Some(explicit) = std::env::var_os("TENSORBRIDGE_NVRTC") {
        found.push(PathBuf::from(explicit));
    }
    let mut dirs: Vec<PathBuf> = Vec::new();
    let mut site_packages: Vec<PathBuf> =
        mapped.iter().filter_map(|p| site_packages_of(p)).collect();
    for var in ["VIRTUAL_ENV", "CONDA_PREFIX"] {
        if let Some(prefix) = std::env::var_os(var) {
            site_packages.extend(site_packages_under(Path::new(&prefix)));
        }
    }
    for sp in site_packages {
        dirs.push(sp.join("nvidia/cu13/lib"));
        dirs.push(sp.join("nvidia/cuda_nvrtc/lib"));
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(home) = std::env::var_os(var) {
            dirs.push(Path::new(&home).join("lib64"));
            dirs.push(Path::new(&home).join("lib"));
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

    #[test]
    fn the_search_ends_with_the_loaders_names() {
        let found = search();
        let tail: Vec<_> = found[found.len() - NAMES.len()..].to_vec();
        assert_eq!(tail, NAMES.map(PathBuf::from));
    }
}
