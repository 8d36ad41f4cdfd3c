//! What a kernel launch over foreign tensors needs besides the views: checked arguments
//! (inputs read, in-place outputs written, no aliasing a kernel could see), a strided layout
//! as a kernel argument, and kernels compiled with NVRTC once per context.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream, DeviceRepr};
use tensorbridge::{Constraint, Descriptor, Tensor};

use crate::view::{DeviceView, DeviceViewMut, Release, make_view};
use crate::{CudaElement, Error};

/// The most dimensions a [`KernelLayout`] holds.
pub const MAX_KERNEL_RANK: usize = 8;

/// A tensor's shape and strides (in elements) as a kernel argument, passed by value: pass
/// `&layout` to cudarc's `LaunchArgs::arg` next to the view, and declare the parameter as
/// [`KERNEL_LAYOUT_CUDA`]'s `tb_layout`. Strided, transposed, sliced and broadcast inputs then
/// need no copy and no hand-written `DeviceRepr`.
///
/// `#[repr(C)]` with explicit padding, so every byte the launch copies is initialised and the
/// CUDA struct matches on every target: 8 extents, 8 strides, the rank, 4 bytes of padding
/// (136 bytes). Dimensions past `rank` hold extent 1 and stride 0.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelLayout {
    /// Extents; 1 past `rank`.
    pub shape: [i64; MAX_KERNEL_RANK],
    /// Strides in elements; 0 past `rank`.
    pub strides: [i64; MAX_KERNEL_RANK],
    /// Number of dimensions.
    pub rank: u32,
    _pad: u32,
}

// SAFETY: a `#[repr(C)]` struct of integers with explicit padding (no uninitialised bytes, no
// pointers, no drop glue): its bytes are a valid kernel parameter of the C struct
// `KERNEL_LAYOUT_CUDA` declares, field for field.
unsafe impl DeviceRepr for KernelLayout {}

impl KernelLayout {
    /// The layout of `desc`; [`Error::RankTooLarge`] past [`MAX_KERNEL_RANK`] dimensions.
    pub fn of(desc: &Descriptor) -> Result<KernelLayout, Error> {
        KernelLayout::new(desc.shape(), desc.strides_elems())
    }

    /// A layout from extents and strides in elements (of equal length, as a validated
    /// layout has; extra strides are ignored); [`Error::RankTooLarge`] past
    /// [`MAX_KERNEL_RANK`] dimensions.
    pub fn new(shape: &[i64], strides: &[i64]) -> Result<KernelLayout, Error> {
        let rank = shape.len();
        if rank > MAX_KERNEL_RANK {
            return Err(Error::RankTooLarge {
                rank,
                max: MAX_KERNEL_RANK,
            });
        }
        let mut l = KernelLayout {
            shape: [1; MAX_KERNEL_RANK],
            strides: [0; MAX_KERNEL_RANK],
            rank: rank as u32,
            _pad: 0,
        };
        l.shape[..rank].copy_from_slice(shape);
        for (d, s) in l.strides[..rank].iter_mut().zip(strides) {
            *d = *s;
        }
        Ok(l)
    }
}

/// The CUDA C declaration of [`KernelLayout`] (`tb_layout`) and `tb_offset(layout, i)`, the
/// element offset of the `i`-th element in row-major order of the index. [`kernel`] prepends
/// it to every source; prepend it yourself for other compilers:
///
/// ```c
/// extern "C" __global__ void scale(float a, const float* x, tb_layout lx, long long n) {
///     long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
///     if (i < n) { /* read x[tb_offset(lx, i)] */ }
/// }
/// ```
pub const KERNEL_LAYOUT_CUDA: &str = r#"
#ifndef TB_LAYOUT_DEFINED
#define TB_LAYOUT_DEFINED
struct tb_layout {
    long long shape[8];
    long long strides[8];
    unsigned int rank;
    unsigned int pad;
};
__device__ __forceinline__ long long tb_offset(const tb_layout& l, long long i) {
    long long off = 0;
    for (int d = (int)l.rank - 1; d >= 0; --d) {
        long long n = l.shape[d];
        off += (i % n) * l.strides[d];
        i /= n;
    }
    return off;
}
#endif
"#;

impl<T> DeviceView<'_, T> {
    /// The tensor's shape and strides as a kernel argument ([`KernelLayout`]).
    pub fn layout(&self) -> Result<KernelLayout, Error> {
        KernelLayout::of(self.descriptor())
    }
}

/// One argument a [`KernelArgs`] has handed out.
struct Taken {
    desc: Descriptor,
    written: bool,
    /// What errors call it.
    position: usize,
}

/// The arguments of one kernel launch on `stream`, checked as they are made: inputs
/// ([`KernelArgs::input`], read) and in-place outputs ([`KernelArgs::output`], written).
/// Every output must be writable, hold no two elements at one address
/// ([`Constraint::NonOverlapping`]) and share no byte with any other argument, made before or
/// after it ([`Descriptor::check_disjoint`]): so a kernel that writes each output element
/// once, from one thread, cannot race with itself or read what it is overwriting. With those
/// checks, the `unsafe` of the cudarc adapter's [`view_mut`](crate::view_mut) is not needed;
/// what stays `unsafe` is the launch (the kernel's signature and bounds).
///
/// Each view is made as [`view`](crate::view) makes it: on the stream's device, of the
/// kernel's element type, with the stream ordered after the tensor's producer (no host
/// wait), and its owner kept until the stream's work is done when the view drops.
///
/// ```no_run
/// # fn demo(x: &tensorbridge::Tensor, y: &tensorbridge::Tensor, f: &cudarc::driver::CudaFunction,
/// #         stream: &std::sync::Arc<cudarc::driver::CudaStream>) -> Result<(), tensorbridge_cudarc::Error> {
/// use cudarc::driver::{LaunchConfig, PushKernelArg};
/// let args = tensorbridge_cudarc::KernelArgs::new(stream);
/// let xv = args.input::<f32>(x)?;
/// let mut yv = args.output::<f32>(y)?; // refused if `y` overlaps `x` or itself
/// let (lx, ly, n) = (xv.layout()?, yv.layout()?, yv.numel() as i64);
/// // SAFETY: `f` is `(const float*, tb_layout, float*, tb_layout, long long)`, reads and
/// // writes element offsets that `tb_offset` computes for `i < n`, on the views' stream.
/// unsafe {
///     stream.launch_builder(f).arg(&xv).arg(&lx).arg(&mut yv).arg(&ly).arg(&n)
///         .launch(LaunchConfig::for_num_elems(n as u32))?
/// };
/// # Ok(()) }
/// ```
pub struct KernelArgs<'s> {
    stream: &'s Arc<CudaStream>,
    taken: RefCell<Vec<Taken>>,
}

impl<'s> KernelArgs<'s> {
    /// No arguments yet, for launches on `stream`.
    pub fn new(stream: &'s Arc<CudaStream>) -> KernelArgs<'s> {
        KernelArgs {
            stream,
            taken: RefCell::new(Vec::new()),
        }
    }

    /// The stream the views are for: launch on it.
    pub fn stream(&self) -> &'s Arc<CudaStream> {
        self.stream
    }

    /// A read-only view of `tensor`, the next argument, refused if it overlaps an output
    /// ([`tensorbridge::Error::Aliased`]).
    pub fn input<'t, T: CudaElement>(
        &self,
        tensor: &'t Tensor,
    ) -> Result<DeviceView<'t, T>, Error> {
        // Not `self.input_at(self.taken.borrow().len(), ..)`: the borrow would live until the
        // end of that statement, across `record`'s `borrow_mut`.
        let position = self.taken.borrow().len();
        self.input_at(position, tensor)
    }

    /// [`input`](KernelArgs::input) for an argument whose position (what errors name) the
    /// caller numbers itself, as a Python call's arguments.
    pub fn input_at<'t, T: CudaElement>(
        &self,
        position: usize,
        tensor: &'t Tensor,
    ) -> Result<DeviceView<'t, T>, Error> {
        self.check(tensor.descriptor(), false, position)?;
        let view = make_view(tensor, self.stream, Release::Retire)?;
        self.record(tensor.descriptor(), false, position);
        Ok(view)
    }

    /// A writable view of `tensor`, the next argument: read-write
    /// ([`tensorbridge::Error::ReadOnly`]), free of self-overlap
    /// ([`tensorbridge::Error::SelfOverlap`]) and disjoint from every other argument
    /// ([`tensorbridge::Error::Aliased`]; those made before it are checked here, those made
    /// after it against it).
    ///
    /// Safe where [`view_mut`](crate::view_mut) is not: the aliasing a kernel could see
    /// among its own arguments is refused here, and the tensor's other users are ordered
    /// against the launch on the GPU through its readiness and the stream, as a framework's
    /// own in-place operation is. Views take only device and managed memory, which no safe
    /// host view reads, so work a caller leaves unordered can give wrong values on the
    /// device, never a data race in host memory.
    pub fn output<'t, T: CudaElement>(
        &self,
        tensor: &'t Tensor,
    ) -> Result<DeviceViewMut<'t, T>, Error> {
        let position = self.taken.borrow().len(); // as in `input`
        self.output_at(position, tensor)
    }

    /// [`output`](KernelArgs::output) at a position the caller numbers itself.
    pub fn output_at<'t, T: CudaElement>(
        &self,
        position: usize,
        tensor: &'t Tensor,
    ) -> Result<DeviceViewMut<'t, T>, Error> {
        if tensor.is_readonly() {
            return Err(tensorbridge::Error::ReadOnly.into());
        }
        tensor.layout().check(Constraint::NonOverlapping)?;
        self.check(tensor.descriptor(), true, position)?;
        let view = make_view(tensor, self.stream, Release::Retire)?;
        self.record(tensor.descriptor(), true, position);
        Ok(DeviceViewMut::from_view(view))
    }

    /// Checks `desc` against every argument so far.
    fn check(&self, desc: &Descriptor, written: bool, position: usize) -> Result<(), Error> {
        for t in self.taken.borrow().iter() {
            if written {
                desc.check_disjoint(position, &t.desc, t.position)?;
            } else if t.written {
                t.desc.check_disjoint(t.position, desc, position)?;
            }
        }
        Ok(())
    }

    fn record(&self, desc: &Descriptor, written: bool, position: usize) {
        self.taken.borrow_mut().push(Taken {
            desc: desc.clone(),
            written,
            position,
        });
    }
}

/// Whether libnvrtc can be loaded (asked once per process).
pub fn nvrtc_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: loads (and unloads) libnvrtc by name to see whether it exists, running its
    // initialisers, as cudarc does on first use of NVRTC; nothing of it is called.
    *PRESENT.get_or_init(|| unsafe { cudarc::nvrtc::sys::is_culib_present() })
}

/// Modules compiled so far: (context, source address and length) -> module.
type ModuleCache = Mutex<HashMap<(usize, usize, usize), Arc<CudaModule>>>;

/// The kernel `name` of the CUDA C++ source `src` (after [`KERNEL_LAYOUT_CUDA`], so
/// `tb_layout` and `tb_offset` are declared), for launches on `stream`: compiled with
/// NVRTC and loaded into the stream's context on first use, then taken from a cache (one
/// module per context and source: a `&'static str`, so the cache never outlives it). The
/// lookup is one lock and a hash of three integers.
///
/// Never panics: [`Error::NoNvrtc`] without libnvrtc, [`Error::Compile`] with NVRTC's log
/// for a source that does not compile (or holds a NUL byte), the CUDA layer's errors for
/// the driver (no driver, a failing module load, an unknown kernel name).
pub fn kernel(
    stream: &Arc<CudaStream>,
    src: &'static str,
    name: &'static str,
) -> Result<CudaFunction, Error> {
    if !tensorbridge_cuda::driver_present() {
        return Err(tensorbridge_cuda::Error::NoDriver.into());
    }
    static CACHE: OnceLock<ModuleCache> = OnceLock::new();
    let ctx: &Arc<CudaContext> = stream.context();
    let key = (
        ctx.cu_ctx() as usize,
        src.as_ptr().expose_provenance(),
        src.len(),
    );
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    let cached = cache
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&key)
        .cloned();
    let module = match cached {
        Some(m) => m,
        None => {
            let m = compile(ctx, src, name)?;
            cache
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .entry(key)
                .or_insert(m)
                .clone()
        }
    };
    let _restore = tensorbridge_cuda::ContextGuard::save()?;
    module
        .load_function(name)
        .map_err(|e| tensorbridge_cuda::Error::driver("cuModuleGetFunction", e).into())
}

/// NVRTC, then the module into `ctx`.
fn compile(ctx: &Arc<CudaContext>, src: &str, name: &str) -> Result<Arc<CudaModule>, Error> {
    let ptx = ptx(&format!("{KERNEL_LAYOUT_CUDA}{src}"), name)?;
    let _restore = tensorbridge_cuda::ContextGuard::save()?;
    ctx.load_module(ptx)
        .map_err(|e| tensorbridge_cuda::Error::driver("cuModuleLoadData", e).into())
}

/// `src` compiled to PTX by NVRTC (no driver needed), what [`kernel`] loads; `name` is the
/// kernel the errors name. [`Error::NoNvrtc`] without libnvrtc (cudarc would panic),
/// [`Error::Compile`] with NVRTC's log.
pub fn ptx(src: &str, name: &str) -> Result<cudarc::nvrtc::Ptx, Error> {
    if !nvrtc_present() {
        return Err(Error::NoNvrtc);
    }
    if src.contains('\0') || name.contains('\0') {
        return Err(Error::Compile {
            name: name.to_owned(),
            log: "the source or the kernel name holds a NUL byte".to_owned(),
        });
    }
    cudarc::nvrtc::compile_ptx(src).map_err(|e| Error::Compile {
        name: name.to_owned(),
        log: match e {
            cudarc::nvrtc::CompileError::CompileError { log, .. } => {
                log.to_string_lossy().into_owned()
            }
            other => format!("{other:?}"),
        },
    })
}
