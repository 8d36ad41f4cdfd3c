//! The driver layer: whether libcuda is there, each device's primary context, pooled events,
//! raw stream handles, and the queue that keeps owners alive until consumer work is done.
//!
//! Every call into libcuda in this crate goes through [`ensure_driver`] first (directly, or
//! because a cudarc object exists, which proves the library loaded): cudarc panics when
//! libcuda is missing, this crate returns [`Error::NoDriver`].

use std::fmt;
use std::mem::MaybeUninit;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use cudarc::driver::{CudaContext, CudaStream, sys};
use tensorbridge::{Owner, Stream, StreamHandle};

use crate::Error;
use crate::capture::{Capture, capture_of, drain_released, keep_with_graph, relaxed};

/// Whether libcuda can be loaded on this machine. Checked once, then cached.
///
/// Every driver-facing function of this crate returns [`Error::NoDriver`] instead of
/// touching cudarc when this is false.
pub fn driver_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    *PRESENT.get_or_init(|| {
        // SAFETY: `is_culib_present` only tries to load libcuda under its usual names (running
        // the library's initialisers, as any use of cudarc would) and drops the handle again;
        // it reads and writes no memory of ours.
        unsafe { sys::is_culib_present() }
    })
}

/// `Ok` when libcuda can be loaded, [`Error::NoDriver`] otherwise.
pub(crate) fn ensure_driver() -> Result<(), Error> {
    if driver_present() {
        Ok(())
    } else {
        Err(Error::NoDriver)
    }
}

/// Events kept per device for reuse; more are destroyed when returned.
const POOL_CAP: usize = 256;

/// One device's primary context (retained for the life of the process) and its event pool.
pub(crate) struct DeviceCtx {
    ctx: Arc<CudaContext>,
    pool: Mutex<Vec<RawEvent>>,
}

impl DeviceCtx {
    /// The device's primary context.
    pub(crate) fn ctx(&self) -> &Arc<CudaContext> {
        &self.ctx
    }
}

/// A `CUevent` handle created in a [`DeviceCtx`]'s context.
struct RawEvent(sys::CUevent);

// SAFETY: a `CUevent` is a driver handle, not thread-affine: the driver API is thread-safe and
// any thread may record, wait on, query or destroy an event (with its context current where
// the call needs one, which `Event` arranges).
unsafe impl Send for RawEvent {}

/// The devices whose primary context this crate has retained, by ordinal. A short list
/// searched linearly: machines have a handful of GPUs.
static DEVICES: Mutex<Vec<(u32, Arc<DeviceCtx>)>> = Mutex::new(Vec::new());

/// Device `ordinal`'s primary context, retained on first use and kept for the life of the
/// process (through cudarc's [`CudaContext::new`]).
pub(crate) fn device(ordinal: u32) -> Result<Arc<DeviceCtx>, Error> {
    ensure_driver()?;
    let mut devices = DEVICES.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((_, dev)) = devices.iter().find(|(o, _)| *o == ordinal) {
        return Ok(dev.clone());
    }
    let index =
        usize::try_from(ordinal).map_err(|_| tensorbridge::Error::OrdinalTooLarge { ordinal })?;
    // cudarc casts the ordinal to `int`; refuse what would wrap rather than ask for device -1.
    if i32::try_from(ordinal).is_err() {
        return Err(tensorbridge::Error::OrdinalTooLarge { ordinal }.into());
    }
    // cudarc makes the context it retains current: put the caller's back.
    let ctx = {
        let _keep = ContextGuard::save()?;
        CudaContext::new(index).map_err(|e| Error::driver("cuDevicePrimaryCtxRetain", e))?
    };
    let dev = Arc::new(DeviceCtx {
        ctx,
        pool: Mutex::new(Vec::new()),
    });
    devices.push((ordinal, dev.clone()));
    Ok(dev)
}

/// Device `ordinal`'s primary context as cudarc sees it: the context this crate records its
/// events in and binds for raw stream handles. Retained on first use for the life of the
/// process.
///
/// Fails with [`Error::NoDriver`] without libcuda and with [`Error::Driver`] for an ordinal
/// the driver does not know.
pub fn primary_context(ordinal: u32) -> Result<Arc<CudaContext>, Error> {
    Ok(device(ordinal)?.ctx.clone())
}

/// The device of the calling thread's current context: what the runtime API (and PyTorch,
/// CuPy, JAX) call "the current device", `None` when no context is current (the runtime then
/// uses device 0 when it first needs one). Without libcuda, [`Error::NoDriver`].
pub fn current_device() -> Result<Option<u32>, Error> {
    ensure_driver()?;
    if current()?.is_null() {
        return Ok(None);
    }
    Ok(Some(current_context_device()?))
}

/// `cuCtxGetDevice` of the current context (which must exist).
fn current_context_device() -> Result<u32, Error> {
    let mut dev: sys::CUdevice = 0;
    // SAFETY: a context is current (the caller's check); the driver writes one int through a
    // pointer to a live local.
    Error::check("cuCtxGetDevice", unsafe { sys::cuCtxGetDevice(&mut dev) })?;
    u32::try_from(dev).map_err(|_| Error::Driver {
        call: "cuCtxGetDevice",
        result: sys::CUresult::CUDA_ERROR_INVALID_DEVICE,
    })
}

/// The device whose primary context a raw stream handle belongs to (`cuStreamGetCtx`);
/// [`Error::ForeignContext`] for a stream of any other context, whose events this crate does
/// not pool.
///
/// # Safety
/// The caller guarantees:
/// 1. `handle` names a live stream (not a default-stream sentinel) for the duration of the
///    call.
pub(crate) unsafe fn device_of_stream(handle: StreamHandle) -> Result<Arc<DeviceCtx>, Error> {
    ensure_driver()?;
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: `handle` is a live stream (obligation 1); the driver writes one handle through
    // a pointer to a live local.
    Error::check("cuStreamGetCtx", unsafe {
        sys::cuStreamGetCtx(raw_stream(Stream::Handle(handle)), &mut ctx)
    })?;
    {
        let devices = DEVICES.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((_, dev)) = devices.iter().find(|(_, d)| d.ctx.cu_ctx() == ctx) {
            return Ok(dev.clone());
        }
    }
    let ordinal = {
        // SAFETY: `ctx` is the live stream's context, alive at least as long as the stream
        // (obligation 1) for this short call.
        let _bound = unsafe { bind_raw(ctx) }?;
        current_context_device()?
    };
    let dev = device(ordinal)?;
    if dev.ctx.cu_ctx() == ctx {
        Ok(dev)
    } else {
        Err(Error::ForeignContext {
            stream: handle.get(),
            ordinal,
        })
    }
}

/// The context current on the calling thread (null when none is).
pub(crate) fn current() -> Result<sys::CUcontext, Error> {
    let mut current = MaybeUninit::<sys::CUcontext>::uninit();
    // SAFETY: libcuda is loaded (every caller checked `ensure_driver` or holds a cudarc
    // object); `cuCtxGetCurrent` writes one handle through a pointer to a live local and keeps
    // no reference to it.
    Error::check("cuCtxGetCurrent", unsafe {
        sys::cuCtxGetCurrent(current.as_mut_ptr())
    })?;
    // SAFETY: initialised by the successful call just above.
    Ok(unsafe { current.assume_init() })
}

/// Makes `ctx` current on this thread until the returned guard is dropped, which puts back
/// the context that was current before (or none). Driver calls on the legacy and per-thread
/// default streams, and event creation, act on the current context; the guard makes sure no
/// call of this crate leaves the caller's current context changed (the runtime API, and so
/// PyTorch, CuPy and JAX, read their "current device" from it).
///
/// Unlike [`CudaContext::bind_to_thread`], this does not consume errors that cudarc stored
/// from its `Drop` impls, so they are not blamed on this crate's calls.
pub(crate) fn bind(ctx: &CudaContext) -> Result<Rebound, Error> {
    // SAFETY: `ctx` holds a retain of its context (a primary context retained by cudarc, or
    // a context cudarc owns) for as long as it is borrowed here.
    unsafe { bind_raw(ctx.cu_ctx()) }
}

/// [`bind`] for a raw context handle.
///
/// # Safety
/// The caller guarantees:
/// 1. `want` is a live context for the duration of the guard.
pub(crate) unsafe fn bind_raw(want: sys::CUcontext) -> Result<Rebound, Error> {
    let previous = current()?;
    if previous == want {
        return Ok(Rebound { previous: None });
    }
    // SAFETY: `want` is a live context (obligation 1).
    Error::check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(want) })?;
    Ok(Rebound {
        previous: Some(previous),
    })
}

/// What [`bind`] changed: the context to put back when dropped, `None` when nothing changed.
/// Not `Send`: it restores the current context of the thread that made it.
#[must_use = "dropping it at once restores the previous context"]
pub(crate) struct Rebound {
    previous: Option<sys::CUcontext>,
}

impl Drop for Rebound {
    fn drop(&mut self) {
        if let Some(previous) = self.previous.take() {
            // SAFETY: `previous` was current on this thread when `bind` ran (or null, which
            // unbinds); this crate destroys no context in between. An error (the caller's
            // context destroyed meanwhile by code this crate called) leaves ours current,
            // which is all that is left to do in a `Drop`.
            let _ = unsafe { sys::cuCtxSetCurrent(previous) };
        }
    }
}

/// Keeps the calling thread's current CUDA context as it is: saves it when made, and puts it
/// back when dropped if anything changed it meanwhile.
///
/// Every public function of this crate leaves the calling thread's current context as it
/// found it. cudarc does not: its calls make their context current and leave it so. Code that
/// calls cudarc on behalf of a caller that owns the thread's CUDA state (a PyTorch, CuPy or
/// JAX user, whose "current device" is the current context) holds one of these across those
/// calls:
///
/// ```no_run
/// # fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let _keep = tensorbridge_cuda::ContextGuard::save()?;
/// let ctx = cudarc::driver::CudaContext::new(1)?; // makes device 1's context current...
/// let stream = ctx.new_stream()?;
/// # Ok(()) }
/// // ...and `_keep` puts back whatever was current before, when it drops.
/// ```
///
/// Not `Send`: it restores the thread it was made on. Without libcuda there is nothing to
/// save, and the guard does nothing.
#[must_use = "dropping it at once restores the context at once"]
pub struct ContextGuard {
    /// The context current when saved (null for none); `None` without a driver.
    saved: Option<sys::CUcontext>,
}

impl ContextGuard {
    /// Saves the calling thread's current context (none is a valid state, and restored as
    /// none). Fails only if the driver cannot say which context is current.
    pub fn save() -> Result<ContextGuard, Error> {
        if !driver_present() {
            return Ok(ContextGuard { saved: None });
        }
        Ok(ContextGuard {
            saved: Some(current()?),
        })
    }
}

impl Drop for ContextGuard {
    fn drop(&mut self) {
        let Some(saved) = self.saved else {
            return;
        };
        if current().is_ok_and(|now| now != saved) {
            // SAFETY: `saved` was current on this thread when the guard was made (or null,
            // which unbinds). A caller that destroyed that context meanwhile gets the
            // driver's error here, which a `Drop` can only ignore.
            let _ = unsafe { sys::cuCtxSetCurrent(saved) };
        }
    }
}

impl fmt::Debug for ContextGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ContextGuard")
            .field("saved", &self.saved)
            .finish()
    }
}

/// A CUDA event created with `CU_EVENT_DISABLE_TIMING` (the cheapest kind), borrowed from a
/// device's pool when its context is that device's primary context, made and destroyed on
/// its own otherwise. Returned to the pool when dropped.
pub(crate) struct Event {
    raw: sys::CUevent,
    home: Home,
}

enum Home {
    /// Borrowed from this device's pool; goes back there.
    Pool(Arc<DeviceCtx>),
    /// Made in a context of its own (not a primary context); destroyed on drop.
    Own(Arc<CudaContext>),
}

// SAFETY: see `RawEvent`; the other fields are `Arc`s of `Send + Sync` types.
unsafe impl Send for Event {}
// SAFETY: `&Event` only hands the handle to driver calls, which are thread-safe; nothing in
// `Event` is mutated through a shared reference.
unsafe impl Sync for Event {}

impl Event {
    /// An event in device `dev`'s primary context, from its pool when one is there.
    pub(crate) fn pooled(dev: &Arc<DeviceCtx>) -> Result<Event, Error> {
        let reused = dev
            .pool
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        let raw = match reused {
            Some(RawEvent(raw)) => raw,
            None => create(&dev.ctx)?,
        };
        Ok(Event {
            raw,
            home: Home::Pool(dev.clone()),
        })
    }

    /// An event in `ctx`: pooled if `ctx` is its device's primary context, made for it
    /// otherwise.
    pub(crate) fn in_context(ctx: &Arc<CudaContext>) -> Result<Event, Error> {
        if ctx.is_primary() {
            // An ordinal beyond `u32` cannot come from the driver; `device` refuses it.
            let dev = device(u32::try_from(ctx.ordinal()).unwrap_or(u32::MAX))?;
            if dev.ctx.cu_ctx() == ctx.cu_ctx() {
                return Event::pooled(&dev);
            }
        }
        let raw = create(ctx)?;
        Ok(Event {
            raw,
            home: Home::Own(ctx.clone()),
        })
    }

    /// The context the event was created in.
    pub(crate) fn context(&self) -> &Arc<CudaContext> {
        match &self.home {
            Home::Pool(dev) => &dev.ctx,
            Home::Own(ctx) => ctx,
        }
    }

    /// Captures the work enqueued on `stream` so far (`cuEventRecord`). `stream` must belong
    /// to the event's context (or be a default stream, which then means that context's); the
    /// driver refuses a live handle of another context with `CUDA_ERROR_INVALID_HANDLE`.
    ///
    /// # Safety
    /// The caller guarantees:
    /// 1. `stream` is a live stream for the duration of the call: a default-stream sentinel
    ///    (`0x1`, `0x2`, null), or the handle of a stream that has not been destroyed. (A
    ///    destroyed or made-up handle is undefined behaviour in the driver.)
    pub(crate) unsafe fn record(&self, stream: sys::CUstream) -> Result<(), Error> {
        let _bound = bind(self.context())?;
        // SAFETY: `self.raw` is a live event of the bound context (created in `create`, not
        // destroyed before `self` drops); `stream` is a live stream (our caller's obligation
        // 1), and one of another context is refused by the driver, not misused.
        Error::check("cuEventRecord", unsafe {
            sys::cuEventRecord(self.raw, stream)
        })
    }

    /// Makes work enqueued on `stream` after this call wait, on the device, for the work the
    /// event captured (`cuStreamWaitEvent` with `wait`'s flags). `ctx` is made current for
    /// the call: `stream`'s context, whose default streams the sentinels then name (it may
    /// be another context than the event's). Never blocks the host.
    ///
    /// # Safety
    /// The caller guarantees:
    /// 1. `stream` is a live stream for the duration of the call (as for [`Event::record`]).
    pub(crate) unsafe fn make_wait_in(
        &self,
        stream: sys::CUstream,
        ctx: &CudaContext,
        wait: Wait,
    ) -> Result<(), Error> {
        let _bound = bind(ctx)?;
        let flags = match wait {
            Wait::Default => sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT as u32,
            Wait::External => sys::CUevent_wait_flags::CU_EVENT_WAIT_EXTERNAL as u32,
        };
        // SAFETY: `self.raw` is a live event (waiting on an event of another context is
        // allowed); `stream` is a live stream (our caller's obligation 1).
        Error::check("cuStreamWaitEvent", unsafe {
            sys::cuStreamWaitEvent(stream, self.raw, flags)
        })
    }

    /// Whether the captured work has finished (`cuEventQuery`); never blocks.
    pub(crate) fn is_complete(&self) -> Result<bool, Error> {
        // SAFETY: `self.raw` is a live event.
        match unsafe { sys::cuEventQuery(self.raw) } {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            result => Err(Error::Driver {
                call: "cuEventQuery",
                result,
            }),
        }
    }

    /// Blocks the calling thread until the captured work has finished. In the relaxed
    /// capture mode, so that a capture in global mode on another thread does not forbid it
    /// (the event itself must not have been recorded in a capture: callers check).
    pub(crate) fn synchronize(&self) -> Result<(), Error> {
        let _bound = bind(self.context())?;
        relaxed(|| {
            // SAFETY: `self.raw` is a live event.
            Error::check("cuEventSynchronize", unsafe {
                sys::cuEventSynchronize(self.raw)
            })
        })
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        match &self.home {
            Home::Pool(dev) => {
                let mut pool = dev.pool.lock().unwrap_or_else(PoisonError::into_inner);
                if pool.len() < POOL_CAP {
                    // Re-recording a pooled event later does not affect waits enqueued on it
                    // before (`cuStreamWaitEvent` captures the event's state at the call).
                    pool.push(RawEvent(self.raw));
                    return;
                }
                drop(pool);
                destroy(&dev.ctx, self.raw);
            }
            Home::Own(ctx) => destroy(ctx, self.raw),
        }
    }
}

impl fmt::Debug for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Event")
            .field("raw", &self.raw)
            .field("ordinal", &self.context().ordinal())
            .finish()
    }
}

/// How a stream waits on an event (`cuStreamWaitEvent`'s flags).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wait {
    /// `CU_EVENT_WAIT_DEFAULT`.
    Default,
    /// `CU_EVENT_WAIT_EXTERNAL`: inside a capture, an event-wait node that waits, at each
    /// replay, for the event's latest record (only valid while capturing).
    External,
}

/// A new `CU_EVENT_DISABLE_TIMING` event in `ctx`.
fn create(ctx: &CudaContext) -> Result<sys::CUevent, Error> {
    let _bound = bind(ctx)?;
    let mut raw = MaybeUninit::<sys::CUevent>::uninit();
    let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
    // SAFETY: the context is current (bound above); `cuEventCreate` writes one handle through
    // a pointer to a live local and keeps no reference to it.
    Error::check("cuEventCreate", unsafe {
        sys::cuEventCreate(raw.as_mut_ptr(), flags)
    })?;
    // SAFETY: initialised by the successful call just above.
    Ok(unsafe { raw.assume_init() })
}

/// Destroys an event; errors are ignored (this runs in `Drop`, and a failure leaves nothing
/// to undo). Pending work that recorded or waits on the event is unaffected: the driver
/// releases it once that work completes.
fn destroy(ctx: &CudaContext, raw: sys::CUevent) {
    if let Ok(_bound) = bind(ctx) {
        // SAFETY: `raw` is a live event of `ctx`, destroyed exactly once (its `Event` or pool
        // entry is gone after this).
        let _ = unsafe { sys::cuEventDestroy_v2(raw) };
    }
}

/// The core's name for a raw CUDA stream handle: null (the driver API's legacy default
/// stream, since cudarc calls the non-`_ptsz` entry points) and `0x1` are
/// [`Stream::LegacyDefault`], `0x2` is [`Stream::PerThreadDefault`].
///
/// Safe: a [`Stream`] is only a value, like a raw pointer; trusting it (attaching it to a
/// tensor, handing it to the driver) is `unsafe`.
pub fn stream_from_raw(raw: sys::CUstream) -> Stream {
    match raw as usize {
        0 | 1 => Stream::LegacyDefault,
        2 => Stream::PerThreadDefault,
        // `StreamHandle::new` accepts every value above 2.
        h => StreamHandle::new(h).map_or(Stream::LegacyDefault, Stream::Handle),
    }
}

/// The core's name for a cudarc stream (see [`stream_from_raw`]).
pub fn stream_of(stream: &CudaStream) -> Stream {
    stream_from_raw(stream.cu_stream())
}

/// The handle to give the driver for a core stream: `CU_STREAM_LEGACY` (`0x1`),
/// `CU_STREAM_PER_THREAD` (`0x2`) or the handle itself.
///
/// Safe: it only converts a number. Handing the result to the driver is what needs the
/// stream to be live.
pub fn raw_stream(stream: Stream) -> sys::CUstream {
    std::ptr::without_provenance_mut(stream.cuda_handle())
}

/// An owner kept alive until the consumer work enqueued before its view was dropped has
/// finished on the device.
struct Retired {
    done: Event,
    /// Never read: held so that it drops when the consumer work is done.
    _owner: Owner,
}

/// Owners waiting for consumer work; see [`reclaim`].
static RETIRED: Mutex<Vec<Retired>> = Mutex::new(Vec::new());

/// Keeps `owner` alive until the work enqueued on `consumer` so far has finished on the
/// device; [`reclaim`] releases it then. Never blocks the host. If the driver refuses the
/// event, the owner is leaked instead: never freed early.
///
/// On a stream being captured into a CUDA graph, the work does not run now but at every
/// replay: the owner is then kept as long as the graph (and every executable graph made from
/// it) exists, and released by [`reclaim`] after the graph is destroyed.
///
/// For memory a kernel on `consumer` may still be using when its last host-side user lets
/// go (the cudarc adapter's views call it when they drop). Safe: `consumer` is a cudarc
/// stream, live for the call by construction.
pub fn retire_on(consumer: &CudaStream, owner: Owner) {
    // SAFETY: `consumer` is a cudarc stream borrowed for the call, so live; its context is
    // the event's.
    unsafe { retire_at(consumer.context(), consumer.cu_stream(), owner) }
}

/// [`retire_on`] for a raw stream: keeps `owner` alive until the work enqueued so far on
/// `stream`, a stream of device `ordinal`'s primary context, has finished on the device;
/// [`reclaim`] releases it then.
/// Never blocks the host.
///
/// For owners whose memory another framework may still be using on the GPU when it lets go
/// of them: the tch adapter calls it from the deleter libtorch runs when a tensor's storage
/// is freed, with the stream the tensor was handed to. Without libcuda no device work can be
/// pending, and the owner is dropped at once. If the driver refuses the event, the owner is
/// leaked instead: never freed early. On a capturing stream, as [`retire_on`].
///
/// # Safety
/// The caller guarantees:
/// 1. `stream` is a live stream for the duration of the call: a default stream (device
///    `ordinal`'s primary context's; [`Stream::PerThreadDefault`] is the calling thread's),
///    or the handle of a stream of that context that has not been destroyed.
pub unsafe fn retire_on_raw(ordinal: u32, stream: Stream, owner: Owner) {
    if !driver_present() {
        drop(owner);
        return;
    }
    match device(ordinal) {
        // SAFETY: `stream` is live for the call (our caller's obligation 1), of the device's
        // primary context.
        Ok(dev) => unsafe { retire_at(&dev.ctx, raw_stream(stream), owner) },
        // Nothing proves the device is done with the memory: keep it forever.
        Err(_) => std::mem::forget(owner),
    }
}

/// The body of [`retire_on`] and [`retire_on_raw`].
///
/// # Safety
/// The caller guarantees:
/// 1. `stream` is a live stream of `ctx` (or one of its default streams) for the call.
unsafe fn retire_at(ctx: &Arc<CudaContext>, stream: sys::CUstream, owner: Owner) {
    let Ok(_bound) = bind(ctx) else {
        std::mem::forget(owner);
        return;
    };
    // SAFETY: `stream` is live (obligation 1) and its context current.
    match unsafe { capture_of(stream) } {
        Ok(Capture::Active(active)) => {
            keep_with_graph(active, Box::new(owner));
            return;
        }
        Ok(Capture::None) => {}
        // Nothing can be recorded (an invalidated capture, the legacy stream during one) or
        // known: keep the owner forever rather than free early.
        _ => {
            std::mem::forget(owner);
            return;
        }
    }
    let recorded = Event::in_context(ctx).and_then(|done| {
        // SAFETY: `stream` is live for the call (obligation 1); the event is in its context.
        unsafe { done.record(stream) }?;
        Ok(done)
    });
    match recorded {
        Ok(done) => RETIRED
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Retired {
                done,
                _owner: owner,
            }),
        // Nothing proves the consumer is done with the memory: keep it forever.
        Err(_) => std::mem::forget(owner),
    }
}

/// Releases the keepers of borrowed streams whose last escaped wrapper is gone
/// ([`with_stream_raw`](crate::with_stream_raw)), and the owners that dropped views kept
/// alive, once the device has finished the consumer work enqueued before each view was
/// dropped (and those kept by CUDA graphs that have since been destroyed), and returns how
/// many still wait for device work. The calling thread's current context is as it was
/// afterwards, whatever the released owners' drops made current (a cudarc buffer or stream
/// binds its own context to free itself).
///
/// The cudarc adapter calls it on every view and `try_into_slice`, the tch adapter when it
/// hands memory to libtorch; call it yourself to release memory sooner when no more views
/// are coming. Never blocks on the device. Its event queries use the relaxed capture mode,
/// so a CUDA graph being captured on any thread is not disturbed.
pub fn reclaim() -> usize {
    // Without a driver there is nothing to save (the guard is inert) and nothing was retired.
    let _restore = ContextGuard::save().ok();
    drain_released();
    crate::borrow::sweep_escaped();
    let mut done = Vec::new();
    let pending = {
        let mut retired = RETIRED.lock().unwrap_or_else(PoisonError::into_inner);
        if !retired.is_empty() {
            relaxed(|| {
                let mut i = 0;
                while i < retired.len() {
                    // An error (a broken context) proves nothing finished: keep the owner.
                    if matches!(retired[i].done.is_complete(), Ok(true)) {
                        done.push(retired.swap_remove(i));
                    } else {
                        i += 1;
                    }
                }
            });
        }
        retired.len()
    };
    // Owners drop outside the lock: their `Drop` may call back into this crate or cudarc.
    drop(done);
    pending
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_of_unused_ordinal_is_not_touched_without_a_driver() {
        if !driver_present() {
            assert!(matches!(device(0), Err(Error::NoDriver)));
            // Nothing to save or restore: the guard is inert.
            drop(ContextGuard::save().unwrap());
        }
    }

    #[test]
    fn raw_handles_map_to_core_streams() {
        assert_eq!(stream_from_raw(std::ptr::null_mut()), Stream::LegacyDefault);
        assert_eq!(
            stream_from_raw(std::ptr::without_provenance_mut(1)),
            Stream::LegacyDefault
        );
        assert_eq!(
            stream_from_raw(std::ptr::without_provenance_mut(2)),
            Stream::PerThreadDefault
        );
        let h = stream_from_raw(std::ptr::without_provenance_mut(0x7f00_1000));
        assert_eq!(h.cuda_handle(), 0x7f00_1000);
        for s in [Stream::LegacyDefault, Stream::PerThreadDefault, h] {
            assert_eq!(stream_from_raw(raw_stream(s)), s);
        }
    }
}
