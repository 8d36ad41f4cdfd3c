//! What a kernel launch over foreign tensors needs besides the views: checked arguments
//! (inputs read, in-place outputs written, no aliasing a kernel could see), a strided layout
//! as a kernel argument, and a launch configuration for any number of elements. (Compiling
//! kernels: the `compile` module.)

use std::cell::RefCell;
use std::sync::Arc;

use cudarc::driver::{CudaStream, DeviceRepr, LaunchConfig};
use tensorbridge_core::{Constraint, Descriptor, Owner, Tensor, TensorRef};

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

    /// A layout from extents and strides in elements, of equal length (as a validated
    /// layout has: the core's [`RankMismatch`](tensorbridge_core::Error::RankMismatch) otherwise);
    /// [`Error::RankTooLarge`] past [`MAX_KERNEL_RANK`] dimensions.
    pub fn new(shape: &[i64], strides: &[i64]) -> Result<KernelLayout, Error> {
        let rank = shape.len();
        if strides.len() != rank {
            return Err(tensorbridge_core::Error::RankMismatch {
                shape: rank,
                strides: strides.len(),
            }
            .into());
        }
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
        l.strides[..rank].copy_from_slice(strides);
        Ok(l)
    }
}

/// The CUDA C declaration of [`KernelLayout`] (`tb_layout`), `tb_offset(layout, i)`, the
/// element offset of the `i`-th element in row-major order of the index, and the grid-stride
/// loop's `tb_index()` (this thread's first element) and `tb_stride()` (the whole grid's
/// threads), which [`grid_stride`] launches are written with. [`kernel`](crate::kernel)
/// prepends it to every source; prepend it yourself for other compilers:
///
/// ```c
/// extern "C" __global__ void scale(float a, const float* x, tb_layout lx, long long n) {
///     for (long long i = tb_index(); i < n; i += tb_stride()) { /* read x[tb_offset(lx, i)] */ }
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
__device__ __forceinline__ long long tb_index() {
    return blockIdx.x * (long long)blockDim.x + threadIdx.x;
}
__device__ __forceinline__ long long tb_stride() {
    return (long long)gridDim.x * blockDim.x;
}
#endif
"#;

impl<T> DeviceView<'_, T> {
    /// The tensor's shape and strides as a kernel argument ([`KernelLayout`]).
    pub fn layout(&self) -> Result<KernelLayout, Error> {
        KernelLayout::of(self.descriptor())
    }
}

/// Threads per block of a [`grid_stride`] launch.
pub const GRID_STRIDE_BLOCK: u32 = 256;

/// The most blocks a [`grid_stride`] launch has: beyond `GRID_STRIDE_BLOCK *
/// GRID_STRIDE_MAX_BLOCKS` elements (16 Mi), each thread loops. Several times the threads any
/// GPU keeps resident, so the loop costs nothing below that.
pub const GRID_STRIDE_MAX_BLOCKS: u32 = 1 << 16;

/// The launch configuration of a grid-stride kernel over `numel` elements, for any `numel`:
/// blocks of [`GRID_STRIDE_BLOCK`] threads, `ceil(numel / block)` blocks but at least one (an
/// empty tensor launches one block whose threads do nothing; the driver refuses a zero grid)
/// and at most [`GRID_STRIDE_MAX_BLOCKS`] (more elements than threads, even past 2^32: each
/// thread loops; cudarc's `LaunchConfig::for_num_elems(n as u32)` wraps there and leaves most
/// of the tensor unwritten). The kernel loops:
///
/// ```c
/// for (long long i = tb_index(); i < n; i += tb_stride()) { ... }
/// ```
///
/// (`tb_index` and `tb_stride` are [`KERNEL_LAYOUT_CUDA`]'s, which
/// [`kernel`](crate::kernel) prepends.)
pub fn grid_stride(numel: u64) -> LaunchConfig {
    let block = u64::from(GRID_STRIDE_BLOCK);
    let blocks = numel
        .div_ceil(block)
        .clamp(1, u64::from(GRID_STRIDE_MAX_BLOCKS));
    LaunchConfig {
        // At most GRID_STRIDE_MAX_BLOCKS: fits.
        grid_dim: (blocks as u32, 1, 1),
        block_dim: (GRID_STRIDE_BLOCK, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// A kernel argument before its view is made: a [`Tensor`] (`&tensor`), whose view keeps a
/// clone of its owner until the launch's work is done, or a borrowed tensor
/// ([`KernelTensor::borrowed`]), whose view keeps nothing: the caller retires the owners of a
/// whole call at once ([`tensorbridge_cuda::retire_all_on`], one event for all of them).
#[derive(Clone, Copy, Debug)]
pub struct KernelTensor<'t> {
    tensor: TensorRef<'t>,
    owner: Option<&'t Owner>,
}

impl<'t> From<&'t Tensor> for KernelTensor<'t> {
    fn from(tensor: &'t Tensor) -> KernelTensor<'t> {
        KernelTensor {
            tensor: tensor.as_ref(),
            owner: Some(tensor.owner()),
        }
    }
}

impl<'t> KernelTensor<'t> {
    /// A borrowed tensor as a kernel argument: its view neither holds nor retires an owner.
    ///
    /// # Safety
    /// The launch's work runs on the device after the host code returns; the borrow ends with
    /// `'t`. The caller guarantees:
    /// 1. \[device-life\] the memory stays valid until the work enqueued on the kernel's
    ///    stream before the view is dropped has finished on the device: its owner is retired
    ///    on that stream after the launches ([`tensorbridge_cuda::retire_all_on`]), or its
    ///    allocator orders every reuse of it after that stream's work (PyTorch's caching
    ///    allocator does for a tensor whose current stream is the kernel's).
    pub unsafe fn borrowed(tensor: TensorRef<'t>) -> KernelTensor<'t> {
        KernelTensor {
            tensor,
            owner: None,
        }
    }

    /// The tensor.
    pub fn tensor(&self) -> TensorRef<'t> {
        self.tensor
    }

    /// How its view releases the memory.
    fn release(&self) -> Release {
        match self.owner {
            Some(owner) => Release::Retire(owner.clone()),
            None => Release::Nothing,
        }
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
/// wait). A `&Tensor` argument's owner is kept until the stream's work is done when the view
/// drops; a borrowed one ([`KernelTensor::borrowed`]) keeps nothing, its caller retiring the
/// owners of the whole call with one event.
///
/// ```no_run
/// # fn demo(x: &tensorbridge_core::Tensor, y: &tensorbridge_core::Tensor, f: &cudarc::driver::CudaFunction,
/// #         stream: &std::sync::Arc<cudarc::driver::CudaStream>) -> Result<(), tensorbridge_cudarc::Error> {
/// use cudarc::driver::PushKernelArg;
/// let args = tensorbridge_cudarc::KernelArgs::new(stream);
/// let xv = args.input::<f32>(x)?;
/// let mut yv = args.output::<f32>(y)?; // refused if `y` overlaps `x` or itself
/// let (lx, ly, n) = (xv.layout()?, yv.layout()?, yv.numel());
/// // SAFETY: `f` is `(const float*, tb_layout, float*, tb_layout, long long)`, a grid-stride
/// // loop over `i < n` that reads and writes the element offsets `tb_offset` computes, on the
/// // views' stream.
/// unsafe {
///     stream.launch_builder(f).arg(&xv).arg(&lx).arg(&mut yv).arg(&ly).arg(&(n as i64))
///         .launch(tensorbridge_cudarc::grid_stride(n))?
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

    /// A read-only view of `tensor` (a `&Tensor`, or a [`KernelTensor::borrowed`]), the next
    /// argument, refused if it overlaps an output ([`tensorbridge_core::Error::Aliased`]).
    pub fn input<'t, T: CudaElement>(
        &self,
        tensor: impl Into<KernelTensor<'t>>,
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
        tensor: impl Into<KernelTensor<'t>>,
    ) -> Result<DeviceView<'t, T>, Error> {
        let arg = tensor.into();
        let desc = arg.tensor.descriptor();
        self.check(desc, false, position)?;
        let view = make_view(arg.tensor, self.stream, arg.release())?;
        self.record(desc, false, position);
        Ok(view)
    }

    /// A writable view of `tensor` (a `&Tensor`, or a [`KernelTensor::borrowed`]), the next
    /// argument: read-write ([`tensorbridge_core::Error::ReadOnly`]), free of self-overlap
    /// ([`tensorbridge_core::Error::SelfOverlap`]) and disjoint from every other argument
    /// ([`tensorbridge_core::Error::Aliased`]; those made before it are checked here, those made
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
        tensor: impl Into<KernelTensor<'t>>,
    ) -> Result<DeviceViewMut<'t, T>, Error> {
        let position = self.taken.borrow().len(); // as in `input`
        self.output_at(position, tensor)
    }

    /// [`output`](KernelArgs::output) at a position the caller numbers itself.
    pub fn output_at<'t, T: CudaElement>(
        &self,
        position: usize,
        tensor: impl Into<KernelTensor<'t>>,
    ) -> Result<DeviceViewMut<'t, T>, Error> {
        let arg = tensor.into();
        let desc = arg.tensor.descriptor();
        if desc.is_readonly() {
            return Err(tensorbridge_core::Error::ReadOnly.into());
        }
        desc.layout().check(Constraint::NonOverlapping)?;
        self.check(desc, true, position)?;
        let view = make_view(arg.tensor, self.stream, arg.release())?;
        self.record(desc, true, position);
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
