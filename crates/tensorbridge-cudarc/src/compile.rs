//! Kernels compiled with NVRTC at first use, for the device's own architecture, and cached
//! per context as loaded functions: a call after the first costs a lookup, no driver call.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream};
use cudarc::nvrtc::Ptx;

use crate::Error;
use crate::kernel::KERNEL_LAYOUT_CUDA;
use crate::nvrtc;

/// The architecture NVRTC compiles for.
#[non_exhaustive]
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub enum Arch {
    /// The device's own (`sm_90` on an H100: a CUBIN the driver loads as it is); where NVRTC
    /// does not know the device yet, the newest virtual architecture it knows below it (PTX
    /// the driver compiles for the device).
    #[default]
    Device,
    /// What NVRTC picks without an option (PTX for its oldest supported architecture, which
    /// the driver compiles at load time): the behaviour before options existed.
    NvrtcDefault,
    /// A name NVRTC takes for `--gpu-architecture`: `sm_90a` (architecture-specific
    /// features, a CUBIN), `compute_80` (PTX)...
    Named(Cow<'static, str>),
}

impl Arch {
    /// [`Arch::Named`] from a string constant, in a `const` context.
    pub const fn named(name: &'static str) -> Arch {
        Arch::Named(Cow::Borrowed(name))
    }
}

/// How NVRTC compiles a kernel; part of the cache key with the source and the name.
///
/// Two ways to build one. At run time, one item at a time ([`define`](Self::define),
/// [`include_path`](Self::include_path), [`option`](Self::option), [`arch`](Self::arch): any
/// string, a generated one too). In a `const` context, for a `static` [`Kernel`]: lists of
/// string constants ([`defines`](Self::defines), [`include_paths`](Self::include_paths),
/// [`options`](Self::options)), [`fast_math`](Self::fast_math), and the architecture through
/// [`for_arch`](Self::for_arch). Both kinds may be combined; the lists come first on the
/// NVRTC command line.
///
/// ```
/// use tensorbridge_cudarc::{Arch, CompileOptions, Kernel};
/// static SCALE: Kernel = Kernel::with_options(
///     r#"extern "C" __global__ void scale(T* x, long long n) { /* ... */ }"#,
///     "scale",
///     CompileOptions::for_arch(Arch::named("sm_90a"))
///         .defines(&[("T", "float")])
///         .options(&["-std=c++17"])
///         .fast_math(true),
/// );
/// assert_eq!(SCALE.options().nvrtc_options(Some(90)), [
///     "--gpu-architecture=sm_90a", "-DT=float", "--use_fast_math", "-std=c++17",
/// ]);
/// ```
///
/// ```
/// use tensorbridge_cudarc::CompileOptions;
/// let opts = CompileOptions::new()
///     .define("T", "float")          // -DT=float
///     .define("UNROLL", "")          // -DUNROLL
///     .include_path("/opt/kernels")  // --include-path=/opt/kernels
///     .fast_math(true);              // --use_fast_math
/// assert_eq!(opts.nvrtc_options(Some(90)), [
///     "--gpu-architecture=sm_90", "-DT=float", "-DUNROLL",
///     "--include-path=/opt/kernels", "--use_fast_math",
/// ]);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct CompileOptions {
    arch: Arch,
    /// The `const` lists, before the run-time items of each kind.
    static_defines: &'static [(&'static str, &'static str)],
    static_include_paths: &'static [&'static str],
    static_extra: &'static [&'static str],
    defines: Vec<(Cow<'static, str>, Cow<'static, str>)>,
    include_paths: Vec<Cow<'static, str>>,
    fast_math: bool,
    extra: Vec<Cow<'static, str>>,
}

impl CompileOptions {
    /// The defaults: the device's own architecture, nothing else.
    pub const fn new() -> CompileOptions {
        CompileOptions::for_arch(Arch::Device)
    }

    /// The defaults but the architecture (`const`: a `static` [`Kernel`]'s options start
    /// here or at [`new`](Self::new)).
    pub const fn for_arch(arch: Arch) -> CompileOptions {
        CompileOptions {
            arch,
            static_defines: &[],
            static_include_paths: &[],
            static_extra: &[],
            defines: Vec::new(),
            include_paths: Vec::new(),
            fast_math: false,
            extra: Vec::new(),
        }
    }

    /// `-D name=value` for each pair (`-D name` for an empty value), in a `const` context;
    /// replaces an earlier list, keeps what [`define`](Self::define) added.
    pub const fn defines(mut self, defines: &'static [(&'static str, &'static str)]) -> Self {
        self.static_defines = defines;
        self
    }

    /// `--include-path=dir` for each directory, in a `const` context; replaces an earlier
    /// list, keeps what [`include_path`](Self::include_path) added.
    pub const fn include_paths(mut self, dirs: &'static [&'static str]) -> Self {
        self.static_include_paths = dirs;
        self
    }

    /// Other NVRTC options verbatim, in a `const` context; replaces an earlier list, keeps
    /// what [`option`](Self::option) added.
    pub const fn options(mut self, options: &'static [&'static str]) -> Self {
        self.static_extra = options;
        self
    }

    /// The architecture to compile for (default [`Arch::Device`]).
    pub fn arch(mut self, arch: Arch) -> CompileOptions {
        self.arch = arch;
        self
    }

    /// `-D name=value` (`-D name` for an empty value).
    pub fn define(
        mut self,
        name: impl Into<Cow<'static, str>>,
        value: impl Into<Cow<'static, str>>,
    ) -> CompileOptions {
        self.defines.push((name.into(), value.into()));
        self
    }

    /// `--include-path=dir`: where `#include "..."` looks.
    pub fn include_path(mut self, dir: impl Into<Cow<'static, str>>) -> CompileOptions {
        self.include_paths.push(dir.into());
        self
    }

    /// `--use_fast_math` (flush denormals, fast approximate division, square root and
    /// transcendentals, fused multiply-add).
    pub const fn fast_math(mut self, on: bool) -> CompileOptions {
        self.fast_math = on;
        self
    }

    /// Any other NVRTC option, verbatim (`-std=c++17`, `--maxrregcount=64`...).
    pub fn option(mut self, option: impl Into<Cow<'static, str>>) -> CompileOptions {
        self.extra.push(option.into());
        self
    }

    /// The NVRTC command line for a device of compute capability `cc` (`major * 10 + minor`;
    /// `None`: no device, so [`Arch::Device`] means NVRTC's default).
    pub fn nvrtc_options(&self, cc: Option<i32>) -> Vec<String> {
        let mut out = Vec::new();
        match (&self.arch, cc) {
            (Arch::Device, Some(cc)) => {
                out.push(format!("--gpu-architecture={}", nvrtc::arch_for(cc)));
            }
            (Arch::Device, None) | (Arch::NvrtcDefault, _) => {}
            (Arch::Named(name), _) => out.push(format!("--gpu-architecture={name}")),
        }
        let statics = self.static_defines.iter().map(|&(n, v)| (n, v));
        let dynamic = self.defines.iter().map(|(n, v)| (&**n, &**v));
        for (name, value) in statics.chain(dynamic) {
            out.push(if value.is_empty() {
                format!("-D{name}")
            } else {
                format!("-D{name}={value}")
            });
        }
        let dynamic = self.include_paths.iter().map(|d| &**d);
        for dir in self.static_include_paths.iter().copied().chain(dynamic) {
            out.push(format!("--include-path={dir}"));
        }
        if self.fast_math {
            out.push("--use_fast_math".to_owned());
        }
        out.extend(self.static_extra.iter().map(|o| o.to_string()));
        out.extend(self.extra.iter().map(|o| o.to_string()));
        out
    }
}

/// The defaults, for the functions that take none.
static DEFAULT_OPTIONS: CompileOptions = CompileOptions::new();

/// A name NVRTC must resolve as a C++ expression (a template instance, a namespaced kernel):
/// added as a name expression, loaded by its lowered (mangled) name.
fn is_expression(name: &str) -> bool {
    name.contains('<') || name.contains("::")
}

/// A loaded module: what it was compiled from, in which context.
struct Module {
    ctx: usize,
    src: Box<str>,
    options: CompileOptions,
    /// The name expression it was compiled with (templates: one module per instance).
    expression: Option<Box<str>>,
    module: Arc<CudaModule>,
    /// The expression's lowered name.
    lowered: Option<String>,
    /// Functions taken from it so far.
    functions: Vec<(Box<str>, CudaFunction)>,
}

/// Every module loaded so far, by a hash of (context, source, options); colliding entries
/// are told apart by comparing the source and options themselves.
type Modules = Mutex<HashMap<u64, Vec<Module>>>;

fn modules() -> &'static Modules {
    static MODULES: OnceLock<Modules> = OnceLock::new();
    MODULES.get_or_init(|| Mutex::new(HashMap::new()))
}

/// A fast hash (FxHash's mixing, 8 bytes at a time): keys are compared in full on a hit, so
/// the hash needs speed, not strength.
fn mix(mut h: u64, bytes: &[u8]) -> u64 {
    const K: u64 = 0x517c_c1b7_2722_0a95;
    let mut chunks = bytes.chunks_exact(8);
    for c in chunks.by_ref() {
        let w = u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
        h = (h.rotate_left(5) ^ w).wrapping_mul(K);
    }
    for &b in chunks.remainder() {
        h = (h.rotate_left(5) ^ u64::from(b)).wrapping_mul(K);
    }
    (h.rotate_left(5) ^ bytes.len() as u64).wrapping_mul(K)
}

/// [`mix`] as a [`Hasher`](std::hash::Hasher), for the options.
struct Mixer(u64);

impl std::hash::Hasher for Mixer {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        self.0 = mix(self.0, bytes);
    }
}

fn key(ctx: usize, src: &str, options: &CompileOptions) -> u64 {
    let mut h = Mixer(mix(ctx as u64, src.as_bytes()));
    if *options != DEFAULT_OPTIONS {
        std::hash::Hash::hash(options, &mut h);
    }
    std::hash::Hasher::finish(&h)
}

/// The kernel `name` of the CUDA C++ source `src`, for launches on `stream`, with the default
/// options ([`kernel_with`]): compiled with NVRTC for the device's own architecture and loaded
/// into the stream's context at first use, then taken from a cache of loaded functions (no
/// driver call; a hash of the source, a lock and a comparison). The source may be any string
/// (a per-dtype source generated at run time too): the cache is keyed by its contents.
///
/// [`KERNEL_LAYOUT_CUDA`] is prepended (with `#line 1`, so NVRTC's messages count the lines
/// of `src`), so `tb_layout`, `tb_offset`, `tb_index` and `tb_stride` are declared. `name` is
/// an `extern "C"` kernel's name, or a C++ name expression (`scale<float>`,
/// `ns::kernel<4, double>`) that NVRTC resolves (templates by name).
///
/// Never panics: [`Error::NoNvrtc`] without libnvrtc (searched as the crate docs say),
/// [`Error::Compile`] with NVRTC's log for a source that does not compile (or holds a NUL
/// byte), the CUDA layer's errors for the driver (no driver, a failing module load, an
/// unknown kernel name). The calling thread's current context is left as it was.
///
/// For a kernel used on every call, a `static` [`Kernel`] skips the hashing too.
pub fn kernel(stream: &Arc<CudaStream>, src: &str, name: &str) -> Result<CudaFunction, Error> {
    kernel_with(stream, src, name, &DEFAULT_OPTIONS)
}

/// [`kernel`] with NVRTC options ([`CompileOptions`]: architecture, `-D` defines, include
/// paths, fast math, anything else), part of the cache key.
pub fn kernel_with(
    stream: &Arc<CudaStream>,
    src: &str,
    name: &str,
    options: &CompileOptions,
) -> Result<CudaFunction, Error> {
    if !tensorbridge_cuda::driver_present() {
        return Err(tensorbridge_cuda::Error::NoDriver.into());
    }
    let ctx = stream.context();
    let ctx_key = ctx.cu_ctx() as usize;
    let expression = is_expression(name).then_some(name);
    let h = key(ctx_key, src, options);
    let found = |modules: &mut HashMap<u64, Vec<Module>>| -> Option<Result<CudaFunction, Error>> {
        let m = modules.get_mut(&h)?.iter_mut().find(|m| {
            m.ctx == ctx_key
                && *m.src == *src
                && m.options == *options
                && m.expression.as_deref() == expression
        })?;
        if let Some((_, f)) = m.functions.iter().find(|(n, _)| **n == *name) {
            return Some(Ok(f.clone()));
        }
        Some(load_function(m, name))
    };
    {
        let mut modules = modules().lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(f) = found(&mut modules) {
            return f;
        }
    }
    // Compiled outside the lock (NVRTC takes a while); a thread that compiled the same
    // meanwhile wins, and this one's module is dropped.
    let (module, lowered) = compile_and_load(ctx, src, name, expression, options)?;
    let mut modules = modules().lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(f) = found(&mut modules) {
        return f;
    }
    let mut m = Module {
        ctx: ctx_key,
        src: src.into(),
        options: options.clone(),
        expression: expression.map(Into::into),
        module,
        lowered,
        functions: Vec::new(),
    };
    let f = load_function(&mut m, name);
    modules.entry(h).or_default().push(m);
    f
}

/// The function `name` of a loaded module (its lowered name for an expression), remembered.
fn load_function(m: &mut Module, name: &str) -> Result<CudaFunction, Error> {
    if name.contains('\0') {
        return Err(Error::Compile {
            name: name.to_owned(),
            log: "the kernel name holds a NUL byte".to_owned(),
        });
    }
    let symbol = match (&m.expression, &m.lowered) {
        (Some(e), Some(l)) if **e == *name => l.as_str(),
        _ => name,
    };
    let f = {
        let _restore = tensorbridge_cuda::ContextGuard::save()?;
        m.module
            .load_function(symbol)
            .map_err(|e| tensorbridge_cuda::Error::driver("cuModuleGetFunction", e))?
    };
    m.functions.push((name.into(), f.clone()));
    Ok(f)
}

/// NVRTC for `ctx`'s device, then the module into `ctx`.
fn compile_and_load(
    ctx: &Arc<CudaContext>,
    src: &str,
    name: &str,
    expression: Option<&str>,
    options: &CompileOptions,
) -> Result<(Arc<CudaModule>, Option<String>), Error> {
    let _restore = tensorbridge_cuda::ContextGuard::save()?;
    let cc = ctx
        .compute_capability()
        .map_err(|e| tensorbridge_cuda::Error::driver("cuDeviceGetAttribute", e))?;
    let args = options.nvrtc_options(Some(cc.0 * 10 + cc.1));
    let full = format!("{KERNEL_LAYOUT_CUDA}\n#line 1\n{src}");
    let names: Vec<&str> = expression.into_iter().collect();
    let image = nvrtc::compile(&full, name, &args, &names)?;
    let ptx = if image.cubin {
        Ptx::from_binary(image.bytes)
    } else {
        Ptx::from_src(String::from_utf8_lossy(&image.bytes).into_owned())
    };
    let module = ctx
        .load_module(ptx)
        .map_err(|e| tensorbridge_cuda::Error::driver("cuModuleLoadData", e))?;
    Ok((module, image.lowered.into_iter().next()))
}

/// A kernel compiled once per context and kept as loaded functions in the value itself: a
/// `static` for a kernel used on every call, whose lookup after the first is a lock and a
/// comparison (no hashing of the source, no driver call).
///
/// ```no_run
/// use tensorbridge_cudarc::Kernel;
/// static AXPY: Kernel = Kernel::new(
///     r#"extern "C" __global__ void axpy(float a, const float* x, float* y, long long n) {
///         for (long long i = tb_index(); i < n; i += tb_stride()) y[i] += a * x[i];
///     }"#,
///     "axpy",
/// );
/// # fn demo(stream: &std::sync::Arc<cudarc::driver::CudaStream>) -> Result<(), tensorbridge_cudarc::Error> {
/// let f = AXPY.function(stream)?; // NVRTC the first time in this context
/// # Ok(()) }
/// ```
pub struct Kernel {
    src: Cow<'static, str>,
    name: Cow<'static, str>,
    options: CompileOptions,
    /// (context, function) for each context it was loaded into.
    loaded: Mutex<Vec<(usize, CudaFunction)>>,
}

impl Kernel {
    /// The kernel `name` of `src`, with the default options.
    pub const fn new(src: &'static str, name: &'static str) -> Kernel {
        Kernel {
            src: Cow::Borrowed(src),
            name: Cow::Borrowed(name),
            options: CompileOptions::new(),
            loaded: Mutex::new(Vec::new()),
        }
    }

    /// The kernel `name` of `src`, with options: `const`, so a `static` kernel may have
    /// options ([`CompileOptions`]'s `const` builders).
    pub const fn with_options(
        src: &'static str,
        name: &'static str,
        options: CompileOptions,
    ) -> Kernel {
        Kernel {
            src: Cow::Borrowed(src),
            name: Cow::Borrowed(name),
            options,
            loaded: Mutex::new(Vec::new()),
        }
    }

    /// A kernel from any source (a generated one too), with options.
    pub fn from_source(
        src: impl Into<Cow<'static, str>>,
        name: impl Into<Cow<'static, str>>,
        options: CompileOptions,
    ) -> Kernel {
        Kernel {
            src: src.into(),
            name: name.into(),
            options,
            loaded: Mutex::new(Vec::new()),
        }
    }

    /// The kernel's name (what launch errors name it by).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// How NVRTC compiles it.
    pub fn options(&self) -> &CompileOptions {
        &self.options
    }

    /// The loaded function for launches on `stream` ([`kernel_with`] at first use in its
    /// context, then from this value).
    pub fn function(&self, stream: &Arc<CudaStream>) -> Result<CudaFunction, Error> {
        let ctx = stream.context().cu_ctx() as usize;
        {
            let loaded = self.loaded.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some((_, f)) = loaded.iter().find(|(c, _)| *c == ctx) {
                return Ok(f.clone());
            }
        }
        let f = kernel_with(stream, &self.src, &self.name, &self.options)?;
        self.loaded
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((ctx, f.clone()));
        Ok(f)
    }
}

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kernel")
            .field("name", &self.name)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// `src` compiled to PTX by NVRTC (no driver needed) for NVRTC's default architecture, as it
/// is (no prelude); `name` is the kernel the errors name. [`Error::NoNvrtc`] without libnvrtc,
/// [`Error::Compile`] with NVRTC's log.
pub fn ptx(src: &str, name: &str) -> Result<Ptx, Error> {
    ptx_with(src, name, &CompileOptions::new().arch(Arch::NvrtcDefault))
}

/// [`ptx`] with options; an [`Arch::Device`] means NVRTC's default here (there is no device).
/// A real architecture (`sm_XY`) gives a CUBIN image instead of PTX text.
pub fn ptx_with(src: &str, name: &str, options: &CompileOptions) -> Result<Ptx, Error> {
    let image = nvrtc::compile(src, name, &options.nvrtc_options(None), &[])?;
    Ok(if image.cubin {
        Ptx::from_binary(image.bytes)
    } else {
        Ptx::from_src(String::from_utf8_lossy(&image.bytes).into_owned())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_spell_nvrtcs_command_line() {
        assert_eq!(
            CompileOptions::new().nvrtc_options(None),
            Vec::<String>::new()
        );
        let o = CompileOptions::new()
            .arch(Arch::Named("sm_90a".into()))
            .define("N", "4")
            .option("-std=c++17");
        assert_eq!(
            o.nvrtc_options(Some(80)),
            ["--gpu-architecture=sm_90a", "-DN=4", "-std=c++17"]
        );
        assert_eq!(
            CompileOptions::new()
                .arch(Arch::NvrtcDefault)
                .nvrtc_options(Some(90)),
            Vec::<String>::new()
        );
    }

    #[test]
    fn keys_tell_sources_options_and_contexts_apart() {
        let a = key(1, "k", &DEFAULT_OPTIONS);
        assert_eq!(a, key(1, "k", &CompileOptions::new()));
        assert_ne!(a, key(2, "k", &DEFAULT_OPTIONS));
        assert_ne!(a, key(1, "k ", &DEFAULT_OPTIONS));
        assert_ne!(a, key(1, "k", &CompileOptions::new().fast_math(true)));
    }

    #[test]
    fn templates_are_name_expressions() {
        assert!(is_expression("scale<float>"));
        assert!(is_expression("ns::k"));
        assert!(!is_expression("axpy"));
    }
}
