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
    let ctx = CudaContext::new(index).map_err(|e| Error::driver("cuDevicePrimaryCtxRetain", e))?;
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

/// Makes `ctx` current on this thread (driver calls on the legacy and per-thread default
/// streams, and event creation, act on the current context).
///
/// Unlike [`CudaContext::bind_to_thread`], this does not consume errors that cudarc stored
/// from its `Drop` impls, so they are not blamed on this crate's calls.
pub(crate) fn bind(ctx: &CudaContext) -> Result<(), Error> {
    let want = ctx.cu_ctx();
    let mut current = MaybeUninit::<sys::CUcontext>::uninit();
    // SAFETY: libcuda is loaded (a `CudaContext` exists); `cuCtxGetCurrent` writes one handle
    // through a pointer to a live local and keeps no reference to it.
    Error::check("cuCtxGetCurrent", unsafe {
        sys::cuCtxGetCurrent(current.as_mut_ptr())
    })?;
    // SAFETY: initialised by the successful call just above.
    let current = unsafe { current.assume_init() };
    if current != want {
        // SAFETY: `want` is a live context: `ctx` holds a retain of it (a primary context
        // retained by cudarc, or a context cudarc owns) for as long as it is borrowed here.
        Error::check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(want) })?;
    }
    Ok(())
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
        bind(self.context())?;
        // SAFETY: `self.raw` is a live event of the bound context (created in `create`, not
        // destroyed before `self` drops); `stream` is a live stream (our caller's obligation
        // 1), and one of another context is refused by the driver, not misused.
        Error::check("cuEventRecord", unsafe {
            sys::cuEventRecord(self.raw, stream)
        })
    }

    /// Makes work enqueued on `stream` after this call wait, on the device, for the work the
    /// event captured (`cuStreamWaitEvent`). Never blocks the host. Default-stream sentinels
    /// name the event's context's default streams.
    ///
    /// # Safety
    /// The caller guarantees:
    /// 1. `stream` is a live stream for the duration of the call (as for [`Event::record`]).
    pub(crate) unsafe fn make_wait(&self, stream: sys::CUstream) -> Result<(), Error> {
        // SAFETY: our caller's obligation 1 is `make_wait_in`'s.
        unsafe { self.make_wait_in(stream, self.context()) }
    }

    /// [`Event::make_wait`] with `ctx` current, for a `stream` of another context than the
    /// event's (default-stream sentinels then name `ctx`'s default streams).
    ///
    /// # Safety
    /// The caller guarantees:
    /// 1. `stream` is a live stream for the duration of the call (as for [`Event::record`]).
    pub(crate) unsafe fn make_wait_in(
        &self,
        stream: sys::CUstream,
        ctx: &CudaContext,
    ) -> Result<(), Error> {
        bind(ctx)?;
        // SAFETY: `self.raw` is a live event (waiting on an event of another context is
        // allowed); `stream` is a live stream (our caller's obligation 1). Flags 0 is
        // `CU_EVENT_WAIT_DEFAULT`.
        Error::check("cuStreamWaitEvent", unsafe {
            sys::cuStreamWaitEvent(stream, self.raw, 0)
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

    /// Blocks the calling thread until the captured work has finished.
    pub(crate) fn synchronize(&self) -> Result<(), Error> {
        bind(self.context())?;
        // SAFETY: `self.raw` is a live event.
        Error::check("cuEventSynchronize", unsafe {
            sys::cuEventSynchronize(self.raw)
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

/// A new `CU_EVENT_DISABLE_TIMING` event in `ctx`.
fn create(ctx: &CudaContext) -> Result<sys::CUevent, Error> {
    bind(ctx)?;
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
    if bind(ctx).is_ok() {
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

/// Keeps `owner` alive until the work enqueued on `consumer` so far has finished. If the
/// driver refuses the event, the owner is leaked instead: never freed early.
pub(crate) fn retire(consumer: &CudaStream, owner: Owner) {
    let recorded = Event::in_context(consumer.context()).and_then(|done| {
        // SAFETY: `consumer` is a cudarc stream, borrowed for the call, so live; the event is
        // in its context.
        unsafe { done.record(consumer.cu_stream()) }?;
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

/// Keeps `owner` alive until the work enqueued so far on `stream`, a stream of device
/// `ordinal`'s primary context, has finished on the device; [`reclaim`] releases it then.
/// Never blocks the host.
///
/// For owners whose memory another framework may still be using on the GPU when it lets go
/// of them: the tch adapter calls it from the deleter libtorch runs when a tensor's storage
/// is freed, with the stream the tensor was handed to. Without libcuda no device work can be
/// pending, and the owner is dropped at once. If the driver refuses the event, the owner is
/// leaked instead: never freed early.
///
/// # Safety
/// The caller guarantees:
/// 1. `stream` is a live stream for the duration of the call: a default stream (device
///    `ordinal`'s primary context's; [`Stream::PerThreadDefault`] is the calling thread's),
///    or the handle of a stream of that context that has not been destroyed.
pub unsafe fn retire_on(ordinal: u32, stream: Stream, owner: Owner) {
    if !driver_present() {
        drop(owner);
        return;
    }
    let recorded = device(ordinal).and_then(|dev| {
        let done = Event::pooled(&dev)?;
        // SAFETY: `stream` is live for the call (our caller's obligation 1); the event is in
        // the device's primary context, the stream's.
        unsafe { done.record(raw_stream(stream)) }?;
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
        // Nothing proves the device is done with the memory: keep it forever.
        Err(_) => std::mem::forget(owner),
    }
}

/// Releases the owners that dropped views kept alive, once the device has finished the
/// consumer work enqueued before each view was dropped, and returns how many still wait.
///
/// Called by this crate on every [`view`](crate::view) and
/// [`try_into_slice`](crate::try_into_slice) (and by the tch adapter when it hands memory to
/// libtorch); call it yourself to release memory sooner
/// when no more views are coming. Never blocks on the device.
pub fn reclaim() -> usize {
    let mut done = Vec::new();
    let pending = {
        let mut retired = RETIRED.lock().unwrap_or_else(PoisonError::into_inner);
        let mut i = 0;
        while i < retired.len() {
            // An error (a broken context) proves nothing finished: keep the owner.
            if matches!(retired[i].done.is_complete(), Ok(true)) {
                done.push(retired.swap_remove(i));
            } else {
                i += 1;
            }
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
