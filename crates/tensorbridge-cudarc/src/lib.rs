//! cudarc 0.19 buffers as tensorbridge [`Tensor`]s and back, without copies: a cudarc slice
//! becomes a tensor any adapter takes (DLPack, libtorch, Python), and any CUDA tensor becomes
//! a view that cudarc kernel launches take as an argument. Stream ordering is the CUDA
//! layer's ([`tensorbridge_cuda`]), which this crate calls for every conversion.
//!
//! | direction | call | data | stream |
//! |---|---|---|---|
//! | `CudaSlice` -> [`Tensor`], owned | [`import`], [`import_shaped`]; back with [`try_into_slice`] | zero-copy, the slice moves into the owner | the slice's stream waits for cudarc's pending work; the tensor is [`Ready::Stream`] of it |
//! | `&CudaSlice`, `&CudaView` -> tensor, lent for a scope | [`lend`], [`lend_shaped`] | zero-copy, read-only | as above; at the scope's end the slice's stream waits for every view's stream |
//! | `&mut CudaSlice`, `&mut CudaViewMut` -> tensor, lent for a scope | the same | zero-copy, read-write | as above, after pending reads too |
//! | any CUDA [`Tensor`] -> cudarc launch argument, borrowed | [`view`], `unsafe` [`view_mut`] | zero-copy | the view's stream waits (on the GPU) for the tensor's [`Ready`] |
//! | a kernel's arguments, checked | [`KernelArgs::input`], [`KernelArgs::output`] (safe: outputs refused when they overlap themselves or any other argument; a `&Tensor`, or a borrowed tensor whose owner the caller retires), [`KernelLayout`] (shape and strides as a kernel argument), [`grid_stride`] (a launch for any number of elements), [`kernel`], [`kernel_with`], [`Kernel`] (NVRTC for the device's architecture, loaded functions cached per context) | zero-copy | as for [`view`] |
//!
//! A slice whose stream is a per-thread default stream, or belongs to a non-primary context,
//! gets a [`CudaSignal`](tensorbridge_cuda::CudaSignal) recorded on that stream instead of a
//! [`Ready::Stream`]: a raw handle plus an ordinal names a stream of the device's primary
//! context, and `0x2` names a different stream on every host thread.
//!
//! ```no_run
//! use cudarc::driver::{CudaContext, LaunchConfig, PushKernelArg};
//! use tensorbridge_cudarc as tbc;
//!
//! # fn demo(kernel: &cudarc::driver::CudaFunction) -> Result<(), Box<dyn std::error::Error>> {
//! let ctx = CudaContext::new(0)?;
//! let producer = ctx.new_stream()?;
//! let consumer = ctx.new_stream()?;
//! let slice = producer.clone_htod(&[1.0f32, 2.0, 3.0, 4.0])?;
//!
//! let tensor = tbc::import(slice)?; // owned, Ready::Stream(producer)
//! // ... hand `tensor` to any adapter (tch, DLPack, Python) ...
//! let x = tbc::view::<f32>(&tensor, &consumer)?; // `consumer` now waits for `producer`
//! let n = x.numel() as u32;
//! // The launch is sound: `kernel` is `(const float* x, unsigned n)`, reads `x[0..n)` and
//! // runs on the view's stream.
//! unsafe { consumer.launch_builder(kernel).arg(&x).arg(&n).launch(LaunchConfig::for_num_elems(n))? };
//! # Ok(()) }
//! ```
//!
//! # Ownership
//! - **Lent** ([`lend`]): the closure gets a [`Lent`], which holds the borrow of the cudarc
//!   buffer and the tensor that describes it. It does not dereference to the tensor: a
//!   [`Tensor`] is `'static` and cheap to clone, so a clone would outlive the borrow and let
//!   safe code read freed memory. It hands out the [`Descriptor`](tensorbridge_core::Descriptor),
//!   views (borrowed from it, so they cannot leave the closure) and hand-off; the tensor
//!   itself only through the `unsafe` [`Lent::as_tensor`]. When the closure returns (or
//!   unwinds), the buffer's stream is made to wait (on the GPU) for the work enqueued on every
//!   stream a view was made for, and cudarc's read (write) event is recorded after that, so
//!   cudarc's own tracking orders the buffer's next write or free after every consumer. A
//!   scope, not a returned guard, so that `mem::forget` cannot skip this (the reason
//!   `std::thread::scope` is a closure).
//! - **Owned** ([`import`]): the `CudaSlice` moves into the tensor's owner. Dropping the last
//!   clone drops the slice, which cudarc frees asynchronously on its stream after the work it
//!   tracked. [`try_into_slice`] takes it back when no one else holds the tensor; a refused
//!   [`import`] gives the slice back ([`ImportError::into_inner`]).
//! - **Views** ([`view`]) borrow the tensor, so its owner outlives them on the host; when a
//!   view is dropped, a clone of the owner is kept until the device has finished the work
//!   enqueued on the view's stream so far ([`tensorbridge_cuda::retire_on`], released by the
//!   CUDA layer's reaper soon after that work ends). So memory is never freed under a
//!   running kernel, whatever the owner is (a DLPack deleter, a Python object, a cudarc
//!   slice). A view that is `mem::forget`-ten keeps its owner clone forever: a leak, never a
//!   use after free.
//!
//! # Soundness
//! cudarc can only enter foreign memory by pretending to own it:
//! `CudaStream::upgrade_device_ptr` makes an owning `CudaSlice`, whose `Drop` would free
//! memory cudarc never allocated, so users `leak()` it again after borrowing a view. That is
//! unsound: `leak()` drops the slice's events that the borrowed `CudaView` still refers to,
//! the slice waits on them and carries a stream that is not the producer's, and
//! `upgrade_device_ptr` itself `unwrap`s driver errors.
//!
//! [`DeviceView`] owns nothing and pretends nothing. It holds the address of element 0 (a
//! `CUdeviceptr` field), a borrow of the [`Tensor`] (so the tensor's owner, which guarantees
//! the memory, outlives the view on the host), and the consumer stream. Its launch-argument
//! impl (`PushKernelArg<&DeviceView>` for cudarc's `LaunchArgs`) pushes a pointer to that
//! field through cudarc's own impl for `&u64`, the same thing cudarc's impl for `&CudaView`
//! pushes, with the lifetime bound `'view: 'args` that keeps the field alive while the
//! builder holds it. No cudarc object is created over the memory, so no `Drop` frees it and no
//! event is torn down. Device-side lifetime is covered by the owner retention above, and
//! ordering by the wait enqueued when the view was made. Read-only tensors give only
//! read-only views; [`view_mut`] is `unsafe` because a `Tensor` is cheap to clone and cannot
//! promise exclusive access (the core's host views make the same choice), while
//! [`Lent::view_mut`] is safe (an exclusive cudarc borrow behind `&mut self`).
//! As with any cudarc launch, the launch itself is `unsafe`: the kernel's signature, bounds,
//! and use of the view's stream are the caller's promise.
//!
//! No safe function writes under a shared borrow: the safe writable views
//! ([`KernelArgs::output`], [`Lent::view_mut`]) only name memory; what writes is the
//! `unsafe` launch, and the memory views take (device and managed) is not host-accessible in
//! the core's model, so no safe host view or slice reads it meanwhile.
//!
//! # Your own kernel on a framework's tensors
//! A kernel that reads some tensors and writes others in place, for PyTorch, CuPy, JAX or
//! libtorch users, runs best on the framework's current stream, borrowed as a cudarc stream
//! for the call ([`tensorbridge_cuda::with_stream_raw`]; the Python layer's `kernel_call`
//! and the tch adapter's `with_current_stream` find it): inputs produced on other streams
//! are waited for by the views, and the framework's later work on its stream sees the
//! kernel's writes with no event at all. [`KernelArgs`] makes the views and checks that no
//! output overlaps itself or another argument, [`KernelLayout`] carries strided layouts into
//! the kernel, and [`kernel`] compiles the source with NVRTC once per context. The launch
//! itself is the one `unsafe` block left.
//!
//! # NVRTC
//! [`kernel`] compiles with NVRTC for the device's own architecture ([`Arch::Device`]: a
//! CUBIN the driver loads as it is; PTX for the newest architecture NVRTC knows when it does
//! not know the device yet), with the options of [`CompileOptions`] (`-D` defines, include
//! paths, fast math, any other), and takes C++ templates by name expression
//! (`"scale<float>"`). The cache is keyed by the source's contents, the options, the name
//! and the context, and holds loaded functions: after the first call, a lookup and no driver
//! call (a `static` [`Kernel`] skips hashing the source too). libnvrtc is searched once per
//! process, in this order ([`nvrtc_path`] says what was found):
//! 1. a libnvrtc the process has already mapped (PyTorch, CuPy or JAX loaded theirs);
//! 2. `TENSORBRIDGE_NVRTC`, the path of a libnvrtc file, when set;
//! 3. `nvidia/cu13/lib` and `nvidia/cuda_nvrtc/lib` (the pip wheels) in every
//!    `site-packages` a mapped library lives in (the extension module itself, CuPy's,
//!    jaxlib's), then under `$VIRTUAL_ENV` and `$CONDA_PREFIX`;
//! 4. `$CUDA_HOME` and `$CUDA_PATH` (`lib64`, `lib`), then `/usr/local/cuda/lib64`;
//! 5. the loader's own search by name (`LD_LIBRARY_PATH`, rpath, `ldconfig`).
//!
//! Names `libnvrtc.so.13`, `libnvrtc.so.12`, `libnvrtc.so`, in that order, in each place.
//! Only absolute paths are opened: a variable that is empty (`ENV CUDA_HOME=`) or relative
//! is ignored, since it would name a file under the current directory, whose libraries
//! nobody vouches for (opening a library runs its initialisers). The `libnvrtc-builtins`
//! beside the library found is opened by the one name NVRTC's version implies.
//!
//! # Contexts
//! Like the CUDA layer, every function of this crate leaves the calling thread's current
//! context as it found it, although the cudarc calls it makes bind their own.
//!
//! # Limitations
//! - Element types: `i8`..`i64`, `u8`..`u64`, `f32`, `f64`, `bool`, and `half::f16`/`bf16`
//!   with the `half` feature ([`CudaElement`]). Not `isize`/`usize` (their width is the
//!   target's), `i128`/`u128` (no DLPack code), nor cudarc's `f8`/`f4` types (their crates
//!   are not pinned in this workspace). A `bool` tensor from foreign code may hold bytes
//!   other than 0 and 1; kernels see them as the bytes they are.
//! - A view is for the stream it was made for: cudarc's `LaunchArgs` does not say which
//!   stream it launches on, so a view launched elsewhere is unordered (the `unsafe` launch's
//!   business). Views are not cudarc `DevicePtr`s, so cudarc's memcpy functions do not take
//!   them; copy through a kernel, or through the source slice.
//! - A lent buffer cannot be used on a stream being captured into a CUDA graph
//!   ([`Error::LentToCapture`]): the borrow ends with the scope, before any replay. Imported
//!   slices can: a view dropped on a capturing stream keeps the owner as long as the graph.
//! - [`KernelLayout`] holds at most [`MAX_KERNEL_RANK`] (8) dimensions.
//! - A compiled kernel stays loaded (and its context retained) for the life of the process,
//!   one module per source, options and context (and per template instance).
//! - The CUDA layer's limitations apply ([`tensorbridge_cuda`]'s crate docs).

#![cfg_attr(docsrs, feature(doc_cfg))]

mod compile;
mod dtype;
mod error;
mod kernel;
mod nvrtc;
mod slice;
mod view;

pub use compile::{Arch, CompileOptions, Kernel, kernel, kernel_with, ptx, ptx_with};
pub use dtype::CudaElement;
pub use error::{Error, ImportError};
pub use kernel::{
    GRID_STRIDE_BLOCK, GRID_STRIDE_MAX_BLOCKS, KERNEL_LAYOUT_CUDA, KernelArgs, KernelLayout,
    KernelTensor, MAX_KERNEL_RANK, grid_stride,
};
pub use nvrtc::{nvrtc_path, nvrtc_present, nvrtc_version};
pub use slice::{
    Lent, Source, check_fits, import, import_shaped, lend, lend_shaped, try_into_slice,
};
pub use view::{DeviceView, DeviceViewMut, view, view_mut};

// Thread safety of the public types, checked at compile time:
// - `Lent<S>`: a core `Tensor`, the lent slice (`S: Source`, Send + Sync when its element
//   type is), the stream, and the consumers under a `Mutex`.
// - `DeviceView`, `DeviceViewMut`: a device address (an integer), a borrowed `Tensor`, the
//   stream and a guard; they cross threads with the borrow. (Kernels that use them are
//   ordered by their stream, not by the host thread.)
// - `Error`: plain data. `ImportError<S>` carries the slice back, so it is as thread-safe as
//   the slice.
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Lent<&'static cudarc::driver::CudaSlice<f32>>>();
    assert_send_sync::<DeviceView<'static, f32>>();
    assert_send_sync::<DeviceViewMut<'static, f32>>();
    assert_send_sync::<Error>();
    assert_send_sync::<ImportError<cudarc::driver::CudaSlice<f32>>>();
};

// For the docs' links.
#[cfg(doc)]
use tensorbridge_core::{Ready, Tensor};
