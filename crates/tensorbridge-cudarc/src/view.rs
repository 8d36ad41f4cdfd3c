//! Tensor -> cudarc: views over any CUDA [`Tensor`] that cudarc kernel launches take as
//! arguments, without pretending to own the memory.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use cudarc::driver::{CudaStream, LaunchArgs, PushKernelArg, sys};
use tensorbridge_core::{Descriptor, DeviceType, Owner, Ready, Tensor, TensorRef};

use tensorbridge_cuda::{make_ready_on, ready_on, retire_on, stream_of};

use crate::{CudaElement, Error};

/// What a view does for its memory when dropped.
pub(crate) enum Release {
    /// Keep this clone of the tensor's owner until the device has finished the work enqueued
    /// on the view's stream so far ([`tensorbridge_cuda::retire_on`]).
    Retire(Owner),
    /// Nothing: the memory is borrowed, and whoever holds the borrow orders its release after
    /// the view's stream (the scope of [`crate::lend`]; the caller of
    /// [`KernelTensor::borrowed`](crate::KernelTensor::borrowed)).
    Nothing,
}

/// [`Release`] as the view keeps it.
enum Guard {
    Retire(Option<Owner>),
    Nothing,
}

/// A read-only view of a CUDA [`Tensor`] as a cudarc kernel argument: pass `&view` to
/// [`LaunchArgs::arg`]; the kernel receives the address of element 0 (`const T*`).
///
/// Made by [`view`] (or [`Lent::view`](crate::Lent::view)) for one consumer stream,
/// on which it has already enqueued the GPU-side wait for the tensor's readiness. Launch on
/// that stream ([`stream`](DeviceView::stream)); the layout is the tensor's, so the kernel
/// must index with [`strides_elems`](DeviceView::strides_elems) unless the layout was checked
/// (e.g. `tensor.layout().check(Constraint::RowMajor)?`).
///
/// The view borrows the tensor, so the tensor (and its owner) outlives it on the host. When
/// it is dropped, the memory is kept alive on the device too: a clone of the owner is held
/// until the work enqueued on the view's stream so far has finished ([`tensorbridge_cuda::retire_on`]).
/// (Views of a [`Lent`](crate::Lent) buffer leave that to the end of the
/// [`lend`](crate::lend) scope.)
pub struct DeviceView<'t, T> {
    ptr: sys::CUdeviceptr,
    desc: &'t Descriptor,
    stream: Arc<CudaStream>,
    guard: Guard,
    _elem: PhantomData<&'t [T]>,
}

/// A writable view of a CUDA [`Tensor`] as a cudarc kernel argument: pass `&mut view` to
/// [`LaunchArgs::arg`]; the kernel receives the address of element 0 (`T*`).
///
/// Made by the `unsafe` [`view_mut`], or the safe
/// [`Lent::view_mut`](crate::Lent::view_mut). Everything said of [`DeviceView`]
/// holds; in addition, after the kernels that write have been enqueued, the data is ready on
/// the view's stream ([`ready_after`](DeviceView::ready_after)): attach that to the tensor
/// you hand on.
///
/// An output is pushed by mutable reference:
///
/// ```
/// use cudarc::driver::{LaunchArgs, PushKernelArg};
/// use tensorbridge_cudarc::DeviceViewMut;
/// fn push<'a>(launch: &mut LaunchArgs<'a>, y: &'a mut DeviceViewMut<'a, f32>) {
///     launch.arg(y);
/// }
/// ```
///
/// By shared reference it does not compile, and the error says why ("a kernel output
/// (`DeviceViewMut`) is passed as `&mut view`, not `&view`"):
///
/// ```compile_fail,E0277
/// use cudarc::driver::{LaunchArgs, PushKernelArg};
/// use tensorbridge_cudarc::DeviceViewMut;
/// fn push<'a>(launch: &mut LaunchArgs<'a>, y: &'a DeviceViewMut<'a, f32>) {
///     launch.arg(y);
/// }
/// ```
pub struct DeviceViewMut<'t, T> {
    inner: DeviceView<'t, T>,
}

/// A read-only view of `tensor` for cudarc launches on `stream`.
///
/// Checks that the memory is CUDA device memory on the stream's device (or managed memory),
/// and that `T` is the tensor's dtype; then enqueues on `stream` the GPU-side wait for the
/// tensor's readiness ([`make_ready_on`](tensorbridge_cuda::make_ready_on)). Never blocks the host (but see
/// there for signals of other adapters).
///
/// Safe: `stream` is a cudarc stream, live by construction, and the tensor's own readiness
/// was vouched for by whoever attached it ([`Tensor::with_ready`]).
///
/// ```no_run
/// # fn demo(tensor: &tensorbridge_core::Tensor, f: &cudarc::driver::CudaFunction,
/// #         stream: &std::sync::Arc<cudarc::driver::CudaStream>) -> Result<(), Box<dyn std::error::Error>> {
/// use cudarc::driver::{LaunchConfig, PushKernelArg};
/// let x = tensorbridge_cudarc::view::<f32>(tensor, stream)?;
/// let n = x.numel() as u32;
/// // SAFETY: `f` is `extern "C" __global__ void f(const float* x, unsigned n)`, reads
/// // `x[0..n)` of a row-major tensor, and is launched on the view's stream.
/// unsafe { stream.launch_builder(f).arg(&x).arg(&n).launch(LaunchConfig::for_num_elems(n))? };
/// # Ok(()) }
/// ```
pub fn view<'t, T: CudaElement>(
    tensor: &'t Tensor,
    stream: &Arc<CudaStream>,
) -> Result<DeviceView<'t, T>, Error> {
    make_view(
        tensor.as_ref(),
        stream,
        Release::Retire(tensor.owner().clone()),
    )
}

/// A writable view of `tensor` for cudarc launches on `stream`; the checks and the wait of
/// [`view`], and the tensor must be read-write (the core's
/// [`ReadOnly`](tensorbridge_core::Error::ReadOnly) otherwise).
///
/// # Safety
/// A `Tensor` is cheap to clone, so its type cannot promise exclusive access. The caller
/// guarantees:
/// 1. while the view lives, and until the work it enqueues has finished on the device,
///    nothing else reads or writes the tensor's bytes except work ordered with that work:
///    no other view of this tensor or of a clone, no host view, no foreign code.
pub unsafe fn view_mut<'t, T: CudaElement>(
    tensor: &'t Tensor,
    stream: &Arc<CudaStream>,
) -> Result<DeviceViewMut<'t, T>, Error> {
    if tensor.is_readonly() {
        return Err(tensorbridge_core::Error::ReadOnly.into());
    }
    make_view(
        tensor.as_ref(),
        stream,
        Release::Retire(tensor.owner().clone()),
    )
    .map(DeviceViewMut::from_view)
}

/// The checks, the wait and the view; `release` says how the memory outlives the GPU work.
pub(crate) fn make_view<'t, T: CudaElement>(
    tensor: TensorRef<'t>,
    stream: &Arc<CudaStream>,
    release: Release,
) -> Result<DeviceView<'t, T>, Error> {
    let device = tensor.device();
    let ordinal = stream.context().ordinal();
    match device.kind {
        DeviceType::Cuda if usize::try_from(device.ordinal).is_ok_and(|o| o == ordinal) => {}
        DeviceType::Cuda => {
            return Err(tensorbridge_cuda::Error::DeviceMismatch {
                tensor: device,
                stream: ordinal,
            }
            .into());
        }
        // Managed memory is addressable from every device; its ordinal is 0 by convention.
        DeviceType::CudaManaged => {}
        _ => return Err(tensorbridge_cuda::Error::NotCudaMemory { device }.into()),
    }
    if T::DTYPE != tensor.dtype() {
        return Err(tensorbridge_core::Error::DTypeMismatch {
            expected: T::DTYPE,
            found: tensor.dtype(),
        }
        .into());
    }
    make_ready_on(tensor, stream)?;
    let guard = match release {
        Release::Retire(owner) => Guard::Retire(Some(owner)),
        Release::Nothing => Guard::Nothing,
    };
    Ok(DeviceView {
        // A device address fits in 64 bits on every target cudarc supports.
        ptr: tensor.data_ptr() as sys::CUdeviceptr,
        desc: tensor.descriptor(),
        stream: stream.clone(),
        guard,
        _elem: PhantomData,
    })
}

impl<'t, T> DeviceView<'t, T> {
    /// The address of element 0 (data pointer plus byte offset), as kernels receive it.
    pub fn device_ptr(&self) -> sys::CUdeviceptr {
        self.ptr
    }

    /// The stream the view was made for; launch on it.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The tensor's description (shape, strides, dtype, device...).
    pub fn descriptor(&self) -> &'t Descriptor {
        self.desc
    }

    /// Extents.
    pub fn shape(&self) -> &'t [i64] {
        self.desc.shape()
    }

    /// Strides in units of elements, as a kernel indexes `ptr[i * stride]`.
    pub fn strides_elems(&self) -> &'t [i64] {
        self.desc.strides_elems()
    }

    /// Number of elements.
    pub fn numel(&self) -> u64 {
        self.desc.numel()
    }

    /// Where the data is ready once the work enqueued on the view's stream so far has run:
    /// [`Ready::Stream`] of that stream, or an event recorded on it now (per-thread default
    /// streams, non-primary contexts; such a signal keeps the stream alive and names none).
    /// Call it after the launches that write, and attach it to the tensor handed on.
    ///
    /// Attaching is the `unsafe` [`Tensor::with_ready`]: a [`Ready::Stream`] names the view's
    /// stream without keeping it alive, so keep a clone of [`stream`](DeviceView::stream)
    /// (in the tensor's owner, or beside it) until no clone of the tensor names it:
    ///
    /// ```no_run
    /// # fn demo(tensor: tensorbridge_core::Tensor, stream: &std::sync::Arc<cudarc::driver::CudaStream>)
    /// #     -> Result<(), tensorbridge_cudarc::Error> {
    /// // SAFETY: nothing else reads or writes `tensor` while `x` and its kernels run.
    /// let x = unsafe { tensorbridge_cudarc::view_mut::<f32>(&tensor, stream)? };
    /// // ... launches that write `x` on `x.stream()` ...
    /// let ready = x.ready_after()?;
    /// drop(x);
    /// // SAFETY: the kernels that write were enqueued on `stream` before `ready_after`, so
    /// // `ready` is true; `stream` is a stream this program keeps alive (it outlives
    /// // `handed` and its clones); `ready_after` never names the per-thread default stream.
    /// let handed = unsafe { tensor.with_ready(ready) };
    /// # drop(handed); Ok(()) }
    /// ```
    pub fn ready_after(&self) -> Result<Ready, Error> {
        Ok(ready_on(&self.stream)?)
    }
}

impl<T> Drop for DeviceView<'_, T> {
    fn drop(&mut self) {
        match &mut self.guard {
            Guard::Retire(owner) => {
                if let Some(owner) = owner.take() {
                    retire_on(&self.stream, owner);
                }
            }
            Guard::Nothing => {}
        }
    }
}

impl<'t, T> DeviceViewMut<'t, T> {
    pub(crate) fn from_view(inner: DeviceView<'t, T>) -> Self {
        DeviceViewMut { inner }
    }

    /// A read-only view of the same memory on the same stream, for launches that only read;
    /// this mutable view does the release when it is dropped.
    pub fn as_view(&self) -> DeviceView<'_, T> {
        DeviceView {
            ptr: self.inner.ptr,
            desc: self.inner.desc,
            stream: self.inner.stream.clone(),
            guard: Guard::Nothing,
            _elem: PhantomData,
        }
    }
}

impl<'t, T> std::ops::Deref for DeviceViewMut<'t, T> {
    type Target = DeviceView<'t, T>;

    /// The read-only getters; `&DeviceViewMut` is not itself a launch argument.
    fn deref(&self) -> &DeviceView<'t, T> {
        &self.inner
    }
}

impl<T> fmt::Debug for DeviceView<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceView")
            .field("ptr", &format_args!("{:#x}", self.ptr))
            .field("desc", self.desc)
            .field("stream", &stream_of(&self.stream))
            .finish_non_exhaustive()
    }
}

impl<T> fmt::Debug for DeviceViewMut<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("DeviceViewMut").field(&self.inner).finish()
    }
}

// SAFETY: pushes a pointer to the view's `CUdeviceptr` field (through cudarc's own impl for
// `&u64`), exactly what cudarc's impl for `&CudaView` pushes. The field lives as long as the
// `&'b` borrow of the view, and `'b: 'a` keeps it alive while the launch builder holds the
// pointer. The pointed-to device memory is valid for the tensor's span on this device: the
// tensor's owner guarantees it and outlives the view (`'t: 'b`).
unsafe impl<'a, 'b: 'a, 't: 'b, T> PushKernelArg<&'b DeviceView<'t, T>> for LaunchArgs<'a> {
    #[inline(always)]
    fn arg(&mut self, arg: &'b DeviceView<'t, T>) -> &mut Self {
        self.arg(&arg.ptr)
    }
}

// SAFETY: as for `&DeviceView`; the view is writable (checked when it was made).
unsafe impl<'a, 'b: 'a, 't: 'b, T> PushKernelArg<&'b mut DeviceViewMut<'t, T>> for LaunchArgs<'a> {
    #[inline(always)]
    fn arg(&mut self, arg: &'b mut DeviceViewMut<'t, T>) -> &mut Self {
        self.arg(&arg.inner.ptr)
    }
}

/// Never implemented: the bound that turns `.arg(&yv)` on an output view into a message that
/// says what to write. cudarc pushes `&T` for every `T: DeviceRepr`, so without this an
/// output passed by shared reference is reported as a missing `DeviceRepr`, which says
/// nothing about outputs.
#[diagnostic::on_unimplemented(
    message = "a kernel output (`DeviceViewMut`) is passed as `&mut view`, not `&view`",
    label = "write `.arg(&mut view)` here",
    note = "outputs take `&mut`: the kernel writes them, and the mutable borrow keeps every other use of the view out while the launch builder holds it",
    note = "to pass an output view read-only, write `.arg(&view.as_view())`"
)]
pub trait OutputTakesMut {}

// SAFETY: vacuous: `DeviceViewMut` never implements `OutputTakesMut` (the trait has no
// implementation at all), so this impl never applies; it exists for its error message.
unsafe impl<T> cudarc::driver::DeviceRepr for DeviceViewMut<'_, T> where Self: OutputTakesMut {}
