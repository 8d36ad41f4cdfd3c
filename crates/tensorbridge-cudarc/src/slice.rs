//! cudarc -> [`Tensor`]: borrowed ([`lend`]) and owned ([`import`]) forms, and the
//! pure check of a caller's shape and strides against a slice's length.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use cudarc::driver::{
    CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, DeviceSlice, sys,
};
use tensorbridge_core::{Access, Descriptor, Device, Layout, Packing, Ready, Stream, Tensor};

use tensorbridge_cuda::{ContextGuard, make_ready_on, make_ready_on_raw, ready_on, reclaim};

use crate::view::{DeviceView, DeviceViewMut, Release, make_view};
use crate::{CudaElement, Error, ImportError};

/// Checks that `layout` (shape, strides in elements, byte offset) reaches only bytes of a
/// slice of `len` elements of `itemsize` bytes: every byte `[lo, hi)` it reaches, counted
/// from the slice's first byte, lies in `[0, len * itemsize)`. Tensors without elements reach
/// nothing and always fit.
///
/// Pure arithmetic (in `i128`, so it cannot overflow); [`lend_shaped`] and
/// [`import_shaped`] call it before anything else.
pub fn check_fits(layout: &Layout, itemsize: usize, len: usize) -> Result<(), Error> {
    if layout.numel() == 0 {
        return Ok(());
    }
    let size = itemsize as i128;
    let (first, last) = layout.elem_reach();
    let start = i128::from(layout.byte_offset());
    let lo = start + i128::from(first) * size;
    let hi = start + (i128::from(last) + 1) * size;
    let nbytes = len as i128 * size;
    if lo < 0 || hi > nbytes {
        return Err(Error::OutsideSlice {
            lo,
            hi,
            len,
            nbytes: len.saturating_mul(itemsize),
        });
    }
    Ok(())
}

/// The 1-D layout of a slice of `len` elements.
fn layout_1d(len: usize) -> Result<Layout, Error> {
    let n = i64::try_from(len).map_err(|_| tensorbridge_core::Error::Overflow {
        what: "slice length",
    })?;
    Ok(Layout::row_major(&[n])?)
}

/// The descriptor of a slice's memory: `ptr` on the slice's device, dtype `T`.
fn describe<T: CudaElement>(
    ptr: sys::CUdeviceptr,
    stream: &CudaStream,
    layout: Layout,
    access: Access,
) -> Result<Descriptor, Error> {
    let ordinal = u32::try_from(stream.context().ordinal())
        .map_err(|_| tensorbridge_core::Error::OrdinalTooLarge { ordinal: u32::MAX })?;
    let addr = usize::try_from(ptr).map_err(|_| tensorbridge_core::Error::Overflow {
        what: "device pointer",
    })?;
    Ok(Descriptor::new(
        addr,
        Device::cuda(ordinal),
        T::DTYPE,
        Packing::Packed,
        layout,
        access,
    )?)
}

pub(crate) mod sealed {
    use super::*;

    /// What [`Source`](super::Source) needs from each cudarc type.
    // Public inside a private module: it bounds the public `Source` trait but cannot be named
    // (or implemented) outside this crate, which is what seals `Source`.
    #[allow(unreachable_pub)]
    pub trait Sealed {
        /// The element type.
        type Elem: CudaElement;
        /// Read-only for shared borrows, read-write for exclusive ones.
        const ACCESS: Access;
        /// Elements in the buffer.
        fn len(&self) -> usize;
        /// The stream cudarc allocated the buffer on.
        fn home_stream(&self) -> &Arc<CudaStream>;
        /// The device pointer, through cudarc's `DevicePtr(Mut)` on `stream`: `stream`
        /// waits (on the GPU) for the buffer's pending writes (and reads, for exclusive
        /// borrows), and cudarc's read (write) event is recorded on `stream` before this
        /// returns, when cudarc manages multi-stream ordering.
        fn touch(&mut self, stream: &CudaStream) -> sys::CUdeviceptr;
    }
}

/// A cudarc buffer that [`lend`] can borrow: `&CudaSlice<T>` and `&CudaView<'_, T>`
/// give a read-only tensor, `&mut CudaSlice<T>` and `&mut CudaViewMut<'_, T>` a read-write
/// one. Sealed.
pub trait Source: sealed::Sealed {}

impl<T: CudaElement> sealed::Sealed for &CudaSlice<T> {
    type Elem = T;
    const ACCESS: Access = Access::ReadOnly;
    fn len(&self) -> usize {
        CudaSlice::len(self)
    }
    fn home_stream(&self) -> &Arc<CudaStream> {
        CudaSlice::stream(self)
    }
    fn touch(&mut self, stream: &CudaStream) -> sys::CUdeviceptr {
        DevicePtr::device_ptr(*self, stream).0
    }
}
impl<T: CudaElement> Source for &CudaSlice<T> {}

impl<T: CudaElement> sealed::Sealed for &mut CudaSlice<T> {
    type Elem = T;
    const ACCESS: Access = Access::ReadWrite;
    fn len(&self) -> usize {
        CudaSlice::len(self)
    }
    fn home_stream(&self) -> &Arc<CudaStream> {
        CudaSlice::stream(self)
    }
    fn touch(&mut self, stream: &CudaStream) -> sys::CUdeviceptr {
        DevicePtrMut::device_ptr_mut(*self, stream).0
    }
}
impl<T: CudaElement> Source for &mut CudaSlice<T> {}

impl<T: CudaElement> sealed::Sealed for &CudaView<'_, T> {
    type Elem = T;
    const ACCESS: Access = Access::ReadOnly;
    fn len(&self) -> usize {
        CudaView::len(self)
    }
    fn home_stream(&self) -> &Arc<CudaStream> {
        DeviceSlice::stream(*self)
    }
    fn touch(&mut self, stream: &CudaStream) -> sys::CUdeviceptr {
        DevicePtr::device_ptr(*self, stream).0
    }
}
impl<T: CudaElement> Source for &CudaView<'_, T> {}

impl<T: CudaElement> sealed::Sealed for &mut CudaViewMut<'_, T> {
    type Elem = T;
    const ACCESS: Access = Access::ReadWrite;
    fn len(&self) -> usize {
        CudaViewMut::len(self)
    }
    fn home_stream(&self) -> &Arc<CudaStream> {
        DeviceSlice::stream(*self)
    }
    fn touch(&mut self, stream: &CudaStream) -> sys::CUdeviceptr {
        DevicePtrMut::device_ptr_mut(*self, stream).0
    }
}
impl<T: CudaElement> Source for &mut CudaViewMut<'_, T> {}

/// The owner of a borrowed form's tensor. It keeps nothing alive: the borrow does, and the
/// tensor never leaves its [`Lent`] (see there).
struct BorrowOwner;

/// A cudarc buffer borrowed as a [`Tensor`] for the duration of a [`lend`] call.
///
/// It does not dereference to the tensor: a `Tensor` is `'static` and cheap to clone, so a
/// clone would outlive the borrow and let safe code use freed memory. It gives out what
/// cannot escape: the [`Descriptor`] and [`Ready`] by reference, views for cudarc launches
/// ([`Lent::view`], [`Lent::view_mut`]), GPU-side ordering
/// ([`Lent::make_ready_on`], [`Lent::join`], and their `unsafe`
/// raw-stream forms [`Lent::make_ready_on_raw`], [`Lent::join_raw`]), and the tensor itself
/// only through the `unsafe` [`Lent::as_tensor`].
///
/// When [`lend`] returns (or unwinds), the buffer goes back to cudarc's tracking: its
/// stream is made to wait (on the GPU) for the work enqueued so far on every stream a view was
/// made for, then cudarc's read event (write event, for `&mut` borrows) is recorded on it, so
/// a later cudarc write or free of the buffer, on any stream, orders after every consumer.
/// The host is not blocked.
pub struct Lent<S: Source> {
    tensor: Tensor,
    source: S,
    stream: Arc<CudaStream>,
    /// Streams views were made for, to join when the scope ends.
    consumers: Mutex<Vec<Arc<CudaStream>>>,
}

/// Lends a cudarc buffer to `f` as a 1-D tensor of its length: zero-copy, dtype from the
/// element type, device `cuda:<the slice's ordinal>`, read-only for `&CudaSlice` and
/// `&CudaView`, read-write for `&mut CudaSlice` and `&mut CudaViewMut`.
///
/// The buffer's pending writes travel with it: its stream is made to wait for them (on the
/// GPU, through cudarc's event tracking), and the tensor's [`Ready`] is that stream (or an
/// event recorded on it, for per-thread default streams and streams of non-primary contexts).
///
/// A scope rather than a returned value, for the same reason as [`std::thread::scope`]: what
/// happens when the borrow ends (the consumers' work ordered before the buffer's next use)
/// must not depend on a value the caller could `mem::forget`.
///
/// ```no_run
/// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use cudarc::driver::CudaContext;
/// let ctx = CudaContext::new(0)?;
/// let stream = ctx.new_stream()?;
/// let slice = stream.clone_htod(&[1.0f32, 2.0, 3.0])?;
/// let shape = tensorbridge_cudarc::lend(&slice, |borrowed| {
///     assert!(borrowed.descriptor().is_readonly());
///     Ok::<_, tensorbridge_cudarc::Error>(borrowed.descriptor().shape().to_vec())
/// })?;
/// assert_eq!(shape, [3]);
/// # Ok(()) }
/// ```
pub fn lend<S, R, E>(source: S, f: impl FnOnce(&mut Lent<S>) -> Result<R, E>) -> Result<R, E>
where
    S: Source,
    E: From<Error>,
{
    let layout = layout_1d(source.len())?;
    let mut borrowed = borrow(source, layout)?;
    f(&mut borrowed)
    // `borrowed` drops here, on return or unwind: see `Lent`'s `Drop`.
}

/// [`lend`] with a caller-given layout (shape, strides in elements, byte offset from
/// the slice's first byte), checked against the slice's length by [`check_fits`].
pub fn lend_shaped<S, R, E>(
    source: S,
    layout: &Layout,
    f: impl FnOnce(&mut Lent<S>) -> Result<R, E>,
) -> Result<R, E>
where
    S: Source,
    E: From<Error>,
{
    let mut borrowed = borrow(source, layout.clone())?;
    f(&mut borrowed)
}

fn borrow<S: Source>(mut source: S, layout: Layout) -> Result<Lent<S>, Error> {
    check_fits(&layout, size_of::<S::Elem>(), source.len())?;
    // cudarc's event tracking binds the buffer's context: put the caller's back.
    let _keep = ContextGuard::save()?;
    let stream = source.home_stream().clone();
    let ptr = source.touch(&stream);
    let desc = describe::<S::Elem>(ptr, &stream, layout, S::ACCESS)?;
    let ready = ready_on(&stream)?;
    // SAFETY:
    // - the span lies inside the buffer (`check_fits`; `CudaElement` obligation 1 makes the
    //   element sizes agree), which cudarc allocated on the stream's device;
    // - `source` keeps the buffer borrowed, shared for read-only access and exclusively for
    //   read-write access, for as long as the `Lent` lives, and the tensor and every
    //   clone of its owner stay inside the `Lent` and its views, which cannot outlive it
    //   (`as_tensor`, the one way out, is `unsafe` with that obligation);
    // - device memory: no host views (obligation 2 concerns host-accessible memory only).
    let tensor = unsafe { Tensor::from_descriptor(desc, Arc::new(BorrowOwner)) };
    // SAFETY:
    // - 1: `touch` made `stream` wait for the buffer's pending cudarc work, and `ready` is
    //   `stream` itself or an event recorded on it since, so work ordered after `ready` sees
    //   every write cudarc tracked;
    // - 2: `ready` names a stream only as `stream`, a stream of the tensor's device's primary
    //   context (`ready_on`): the `Lent` holds an `Arc` of it (a signal holds its
    //   own), and the tensor and its clones cannot outlive the `Lent` (see above);
    // - 3: `ready_on` never names the per-thread default stream.
    let tensor = unsafe { tensor.with_ready(ready) };
    Ok(Lent {
        tensor,
        source,
        stream,
        consumers: Mutex::new(Vec::new()),
    })
}

impl<S: Source> Lent<S> {
    /// The tensor's description.
    pub fn descriptor(&self) -> &Descriptor {
        self.tensor.descriptor()
    }

    /// Where the data becomes ready.
    pub fn ready(&self) -> &Ready {
        self.tensor.ready()
    }

    /// The buffer's own stream (where cudarc allocated it).
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// A read-only view for cudarc launches on `stream`; see [`view`](crate::view). The
    /// buffer's stream is made to wait for `stream`'s work when the scope ends.
    pub fn view(&self, stream: &Arc<CudaStream>) -> Result<DeviceView<'_, S::Elem>, Error> {
        refuse_capture(stream)?;
        let view = make_view(self.tensor.as_ref(), stream, Release::Nothing)?;
        self.consumer(stream);
        Ok(view)
    }

    /// A writable view for cudarc launches on `stream`; fails with the core's
    /// [`ReadOnly`](tensorbridge_core::Error::ReadOnly) for shared borrows.
    ///
    /// Safe, unlike [`view_mut`](crate::view_mut): the buffer is borrowed exclusively (a
    /// `&mut` source) and `&mut self` makes this view the only one.
    pub fn view_mut(
        &mut self,
        stream: &Arc<CudaStream>,
    ) -> Result<DeviceViewMut<'_, S::Elem>, Error> {
        if self.tensor.is_readonly() {
            return Err(tensorbridge_core::Error::ReadOnly.into());
        }
        refuse_capture(stream)?;
        self.consumer(stream);
        make_view(self.tensor.as_ref(), stream, Release::Nothing).map(DeviceViewMut::from_view)
    }

    /// Remembers `stream` for the join at the end of the scope.
    fn consumer(&self, stream: &Arc<CudaStream>) {
        let mut consumers = self
            .consumers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let known = |s: &Arc<CudaStream>| same_stream(s, stream);
        if !known(&self.stream) && !consumers.iter().any(known) {
            consumers.push(stream.clone());
        }
    }

    /// Orders `consumer` after the buffer's pending work, on the GPU
    /// ([`make_ready_on`](tensorbridge_cuda::make_ready_on)), and remembers it, as views
    /// do, so that the buffer's stream waits for its work when the scope ends. Safe: the
    /// stream is live for the call by construction.
    pub fn make_ready_on(&self, consumer: &Arc<CudaStream>) -> Result<(), Error> {
        refuse_capture(consumer)?;
        make_ready_on(&self.tensor, consumer)?;
        self.consumer(consumer);
        Ok(())
    }

    /// Orders `consumer`, a raw stream, after the buffer's pending work, on the GPU
    /// ([`tensorbridge_cuda::make_ready_on_raw`]). Unlike [`make_ready_on`](Lent::make_ready_on),
    /// it cannot remember the stream: [`join_raw`](Lent::join_raw) it after its work is enqueued.
    ///
    /// # Safety
    /// The caller guarantees:
    /// 1. `consumer` is a live stream on the buffer's device for the duration of the call:
    ///    the handle of a stream of that device's primary context that has not been
    ///    destroyed, or a default stream ([`tensorbridge_cuda::make_ready_on_raw`]'s obligation 1).
    pub unsafe fn make_ready_on_raw(&self, consumer: Stream) -> Result<(), Error> {
        // SAFETY: our caller's obligation 1 is `make_ready_on_raw`'s, for the tensor that
        // describes the buffer (on the buffer's device).
        Ok(unsafe { make_ready_on_raw(&self.tensor, consumer) }?)
    }

    /// Makes the buffer's stream wait (on the GPU) for the work enqueued on `consumer` so
    /// far: call it after using the tensor on a stream of your own through
    /// [`as_tensor`](Lent::as_tensor) (views, and streams given to
    /// [`make_ready_on`](Lent::make_ready_on), are joined by themselves).
    /// `consumer` may be of any context or device. Safe: the stream is live for the call by
    /// construction.
    pub fn join(&self, consumer: &CudaStream) -> Result<(), Error> {
        Ok(tensorbridge_cuda::join(&self.stream, consumer)?)
    }

    /// [`join`](Lent::join) for a raw stream of the buffer's stream's
    /// context (default streams are that context's).
    ///
    /// # Safety
    /// The caller guarantees:
    /// 1. `consumer` is a live stream of the context of the buffer's
    ///    [`stream`](Lent::stream) for the duration of the call: the handle of a stream
    ///    that has not been destroyed, or a default stream.
    pub unsafe fn join_raw(&self, consumer: Stream) -> Result<(), Error> {
        // SAFETY: our caller's obligation 1 is `join_raw`'s, with the buffer's stream waiting.
        Ok(unsafe { tensorbridge_cuda::join_raw(&self.stream, consumer) }?)
    }

    /// The tensor itself, for adapters that take a `&Tensor`.
    ///
    /// # Safety
    /// The caller guarantees:
    /// 1. no clone of the tensor or of its owner outlives the [`lend`] call (the owner
    ///    keeps nothing alive; the borrow does);
    /// 2. device work that uses the memory through it is ordered before the buffer's next use
    ///    by cudarc: it was enqueued on the buffer's [`stream`](Lent::stream), or on a
    ///    stream given to [`make_ready_on`](Lent::make_ready_on), or
    ///    [`join`](Lent::join) (or [`join_raw`](Lent::join_raw)) was called for
    ///    its stream after it was enqueued.
    pub unsafe fn as_tensor(&self) -> &Tensor {
        &self.tensor
    }
}

impl<S: Source> Drop for Lent<S> {
    fn drop(&mut self) {
        // No view is left (they borrow `self`); whatever they enqueued on their streams is
        // enqueued by now. Make the buffer's stream wait for all of it, then record cudarc's
        // read (write) event there, so cudarc's next use of the buffer on any stream orders
        // after every consumer.
        let consumers = std::mem::take(
            self.consumers
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner),
        );
        // cudarc binds the buffer's context: put the caller's back (without a driver no
        // cudarc buffer exists, so the guard cannot fail; if it did, the joins still run).
        let _keep = ContextGuard::save();
        for consumer in consumers {
            join_home(&consumer, &self.stream);
        }
        let _ = self.source.touch(&self.stream);
    }
}

/// A lent buffer's borrow ends with its scope, before any replay of a graph captured on
/// `stream` would run: [`Error::LentToCapture`] for a stream being captured.
fn refuse_capture(stream: &CudaStream) -> Result<(), Error> {
    match tensorbridge_cuda::capture_status(stream)? {
        tensorbridge_cuda::CaptureStatus::None => Ok(()),
        capture => Err(Error::LentToCapture { capture }),
    }
}

/// Whether two cudarc streams are one: the same handle in the same context.
fn same_stream(a: &CudaStream, b: &CudaStream) -> bool {
    a.cu_stream() == b.cu_stream() && a.context().cu_ctx() == b.context().cu_ctx()
}

/// Makes `home` wait on the GPU for the work enqueued on `consumer` so far. If the driver
/// refuses, blocks until `consumer` is idle instead: the borrow ends when the scope returns,
/// and the memory must not be reused before the consumer is done with it.
fn join_home(consumer: &CudaStream, home: &CudaStream) {
    if tensorbridge_cuda::join(home, consumer).is_err() {
        // Nothing better is left to do with an error here; cudarc keeps it for its next call.
        consumer.context().record_err(consumer.synchronize());
    }
}

impl<S: Source> fmt::Debug for Lent<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lent")
            .field("tensor", &self.tensor)
            .finish_non_exhaustive()
    }
}

/// The owner of an owned form's tensor: the slice itself. Dropping the last clone drops the
/// slice, which cudarc frees on its stream after the work it tracked. cudarc's drop binds the
/// slice's context to the dropping thread; the owner puts that thread's context back, so
/// dropping a tensor (in the caller's code, a reaper's, another framework's deleter) never
/// changes the current context of whoever drops it. `None` only once `try_into_slice` took the
/// slice back.
struct SliceOwner<T>(Option<CudaSlice<T>>);

impl<T> Drop for SliceOwner<T> {
    fn drop(&mut self) {
        if let Some(slice) = self.0.take() {
            // Without a driver no slice exists; a failing save still drops the slice.
            let _restore = ContextGuard::save().ok();
            drop(slice);
        }
    }
}

impl<T> SliceOwner<T> {
    /// The slice (present until `try_into_slice` takes it, which consumes the owner).
    fn slice(&self) -> &CudaSlice<T> {
        self.0
            .as_ref()
            .expect("a SliceOwner holds its slice until it is taken back")
    }
}

/// Moves a slice into a 1-D tensor that owns it: zero-copy, read-write, dtype from `T`, device
/// `cuda:<the slice's ordinal>`, [`Ready`] the slice's stream (after its pending writes and
/// reads, through cudarc's tracking). When the last clone of the tensor is dropped, the slice
/// is dropped and cudarc frees it asynchronously on its stream.
///
/// Fails only when the driver refuses an event (non-primary contexts), giving the slice back.
// The error carries the slice back (a failed consuming conversion returns its input);
// boxing it would allocate on the refusal path for nothing.
#[allow(clippy::result_large_err)]
pub fn import<T: CudaElement>(slice: CudaSlice<T>) -> Result<Tensor, ImportError<T>> {
    match layout_1d(slice.len()) {
        Ok(layout) => own(slice, layout),
        Err(e) => Err(ImportError::new(e, slice)),
    }
}

/// [`import`] with a caller-given layout, checked against the slice's length by
/// [`check_fits`]; the slice comes back inside the error when it does not fit.
// The error carries the slice back (a failed consuming conversion returns its input);
// boxing it would allocate on the refusal path for nothing.
#[allow(clippy::result_large_err)]
pub fn import_shaped<T: CudaElement>(
    slice: CudaSlice<T>,
    layout: &Layout,
) -> Result<Tensor, ImportError<T>> {
    own(slice, layout.clone())
}

// The error carries the slice back (a failed consuming conversion returns its input);
// boxing it would allocate on the refusal path for nothing.
#[allow(clippy::result_large_err)]
fn own<T: CudaElement>(mut slice: CudaSlice<T>, layout: Layout) -> Result<Tensor, ImportError<T>> {
    if let Err(e) = check_fits(&layout, size_of::<T>(), slice.len()) {
        return Err(ImportError::new(e, slice));
    }
    // cudarc's event tracking binds the slice's context: put the caller's back.
    let _keep = match ContextGuard::save() {
        Ok(keep) => keep,
        Err(e) => return Err(ImportError::new(e.into(), slice)),
    };
    let stream = slice.stream().clone();
    let ptr = DevicePtrMut::device_ptr_mut(&mut slice, &stream).0;
    let described = describe::<T>(ptr, &stream, layout, Access::ReadWrite)
        .and_then(|desc| Ok((desc, ready_on(&stream)?)));
    let (desc, ready) = match described {
        Ok(parts) => parts,
        Err(e) => return Err(ImportError::new(e, slice)),
    };
    // SAFETY:
    // - the span lies inside the slice (`check_fits`; `CudaElement` obligation 1), device
    //   memory cudarc allocated on the stream's device, readable and writable;
    // - the owner is the slice itself, so the memory stays allocated until the last clone of
    //   the owner is dropped; nothing else can reach the slice after this move;
    // - device memory: no host views (obligation 2 concerns host-accessible memory only).
    let tensor = unsafe { Tensor::from_descriptor(desc, Arc::new(SliceOwner(Some(slice)))) };
    // SAFETY:
    // - 1: `device_ptr_mut` made `stream` wait for the slice's pending cudarc reads and
    //   writes, and `ready` is `stream` itself or an event recorded on it since;
    // - 2: `ready` names a stream only as `stream`, a stream of the tensor's device's primary
    //   context (`ready_on`), which the slice holds an `Arc` of (a signal holds its
    //   own): the owner, and so every clone of the tensor, keeps it alive;
    // - 3: `ready_on` never names the per-thread default stream.
    Ok(unsafe { tensor.with_ready(ready) })
}

/// Takes the slice back out of a tensor made by [`import`], if this is the last clone
/// of it (and of its owner) and `T` is its element type; the tensor comes back otherwise.
///
/// Views that were dropped keep the owner alive until their GPU work is done, so this calls
/// [`reclaim`] first. The slice's stream is made to wait (on the GPU) for the tensor's
/// readiness, so work handed to other streams orders before cudarc's next use.
// The error is the tensor itself, given back whole.
#[allow(clippy::result_large_err)]
pub fn try_into_slice<T: CudaElement>(tensor: Tensor) -> Result<CudaSlice<T>, Tensor> {
    reclaim();
    // cudarc's event tracking binds the slice's context: put the caller's back.
    let Ok(_keep) = ContextGuard::save() else {
        return Err(tensor);
    };
    let Ok(typed) = tensor.owner().clone().downcast::<SliceOwner<T>>() else {
        return Err(tensor);
    };
    // The tensor and `typed`: nobody else holds the owner.
    if Arc::strong_count(&typed) != 2 {
        return Err(tensor);
    }
    if make_ready_on(&tensor, typed.slice().stream()).is_err() {
        return Err(tensor);
    }
    let desc = tensor.descriptor().clone();
    let ready = tensor.ready().clone();
    drop(tensor);
    match Arc::try_unwrap(typed) {
        Ok(mut owner) => {
            let Some(mut slice) = owner.0.take() else {
                unreachable!("a SliceOwner holds its slice until it is taken back")
            };
            // Records cudarc's write event after the wait above, for its own tracking.
            let stream = slice.stream().clone();
            let _ = DevicePtrMut::device_ptr_mut(&mut slice, &stream);
            Ok(slice)
        }
        // Someone upgraded a weak reference in between: rebuild the tensor.
        Err(typed) => {
            let owner: tensorbridge_core::Owner = typed;
            // SAFETY: the same description and owner as the tensor dropped just above, whose
            // guarantees (made in `own`) hold for as long as the owner lives.
            let rebuilt = unsafe { Tensor::from_descriptor(desc, owner) };
            // SAFETY: `ready` is the readiness of the tensor dropped just above, given back
            // to the caller as the same tensor (same description and owner) rebuilt; no driver
            // call or other thread saw the gap. What was promised when `ready` was attached
            // (it is true, its streams live while a clone names them, a per-thread stream
            // used only on its thread) therefore covers the rebuilt tensor as it covered the
            // dropped one.
            Err(unsafe { rebuilt.with_ready(ready) })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_d_layouts_fit_exactly() {
        let l = layout_1d(6).unwrap();
        assert!(check_fits(&l, 4, 6).is_ok());
        assert!(matches!(
            check_fits(&l, 4, 5),
            Err(Error::OutsideSlice {
                lo: 0,
                hi: 24,
                len: 5,
                nbytes: 20
            })
        ));
    }
}
