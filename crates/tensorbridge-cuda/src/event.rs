//! Events: a `CU_EVENT_DISABLE_TIMING` event (the cheapest kind; with
//! `CU_EVENT_BLOCKING_SYNC` too for events a thread waits on, `CU_EVENT_INTERPROCESS` for
//! events another process waits on, kept with their IPC handle), borrowed from its device's
//! pool when it belongs to a primary context, another process's interprocess event opened
//! here, and the two ways a stream waits on one.

use std::fmt;
use std::sync::{Arc, PoisonError};

use cudarc::driver::{CudaContext, sys};

use crate::context::{DeviceCtx, SpareEvent, bind, device, relaxed};
use crate::error::Error;
use crate::raw;

/// Events kept per device and kind for reuse; more are destroyed when returned.
const POOL_CAP: usize = 256;
/// Interprocess events kept per device: each waits in the pool only once every consumer of
/// the share it was recorded for has let go, and shares come and go in bursts.
const INTERPROCESS_POOL_CAP: usize = 1024;

/// A CUDA event created with `CU_EVENT_DISABLE_TIMING` (and its [`Kind`]'s flags), borrowed
/// from a device's pool when its context is that device's primary context, made and
/// destroyed on its own otherwise. Returned to the pool when dropped.
pub(crate) struct Event {
    raw: sys::CUevent,
    kind: Kind,
    home: Home,
    /// An interprocess event's IPC handle (`cuIpcGetEventHandle`, asked once when the event
    /// was made, or the handle it was opened from); `None` for the other kinds.
    ipc_handle: Option<[u8; 64]>,
}

/// What an event is for, which decides its flags (and its pool).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Ordering streams and queries: `CU_EVENT_DISABLE_TIMING`.
    Plain,
    /// Waited on by a host thread: `CU_EVENT_BLOCKING_SYNC` too, so `cuEventSynchronize`
    /// puts the thread to sleep instead of spinning a core.
    BlockingSync,
    /// Waited on by another process (`ipc`): `CU_EVENT_INTERPROCESS` too, with its IPC
    /// handle. Re-recorded only once no consumer can wait on its earlier record.
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    Interprocess,
}

impl Kind {
    fn flags(self) -> u32 {
        let timing = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        match self {
            Kind::Plain => timing,
            Kind::BlockingSync => timing | sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC as u32,
            Kind::Interprocess => timing | sys::CUevent_flags::CU_EVENT_INTERPROCESS as u32,
        }
    }

    /// The index of this kind's list in [`DeviceCtx::spare_events`].
    fn pool(self) -> usize {
        match self {
            Kind::Plain => 0,
            Kind::BlockingSync => 1,
            Kind::Interprocess => 2,
        }
    }

    /// How many spare events of this kind a device keeps.
    fn cap(self) -> usize {
        match self {
            Kind::Plain | Kind::BlockingSync => POOL_CAP,
            Kind::Interprocess => INTERPROCESS_POOL_CAP,
        }
    }
}

enum Home {
    /// Borrowed from this device's pool; goes back there.
    Pool(Arc<DeviceCtx>),
    /// Made in a context of its own (not a primary context); destroyed on drop.
    Own(Arc<CudaContext>),
}

// SAFETY: a `CUevent` is a driver handle that any thread may use (`raw::event::Handle`'s
// `Send`); the other fields are `Arc`s of `Send + Sync` types.
unsafe impl Send for Event {}
// SAFETY: `&Event` only hands the handle to driver calls, which are thread-safe; nothing in
// `Event` is mutated through a shared reference.
unsafe impl Sync for Event {}

impl Event {
    /// An event of `kind` in device `dev`'s primary context, from its pool when one is there.
    pub(crate) fn pooled_kind(dev: &Arc<DeviceCtx>, kind: Kind) -> Result<Event, Error> {
        let reused = dev.spare_events[kind.pool()]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        let (raw, ipc_handle) = match reused {
            Some(SpareEvent {
                raw: raw::event::Handle(raw),
                ipc_handle,
            }) => (raw, ipc_handle),
            None => create(dev.ctx(), kind)?,
        };
        Ok(Event {
            raw,
            kind,
            home: Home::Pool(dev.clone()),
            ipc_handle,
        })
    }

    /// Another process's interprocess event, opened in `ctx` from its IPC handle
    /// (`cuIpcOpenEventHandle`); destroyed (never pooled) when dropped. Its exporter keeps the
    /// event itself alive as long as it must.
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    pub(crate) fn open_interprocess(
        ctx: &Arc<CudaContext>,
        handle: &[u8; 64],
    ) -> Result<Event, Error> {
        let _bound = bind(ctx)?;
        // SAFETY: libcuda is loaded (`bind` used it); `ctx` is current (bound above); the
        // event is destroyed once, by this `Event`'s drop (`Home::Own`), after its last use.
        let raw = unsafe { raw::ipc::open_event_handle(handle) }?;
        Ok(Event {
            raw,
            kind: Kind::Interprocess,
            home: Home::Own(ctx.clone()),
            ipc_handle: Some(*handle),
        })
    }

    /// An interprocess event's IPC handle; `None` for the other kinds.
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    pub(crate) fn ipc_handle(&self) -> Option<&[u8; 64]> {
        self.ipc_handle.as_ref()
    }

    /// An event in `ctx`: pooled if `ctx` is its device's primary context, made for it
    /// otherwise.
    pub(crate) fn in_context(ctx: &Arc<CudaContext>) -> Result<Event, Error> {
        Event::in_context_kind(ctx, Kind::Plain)
    }

    /// [`Event::in_context`], of the given kind.
    pub(crate) fn in_context_kind(ctx: &Arc<CudaContext>, kind: Kind) -> Result<Event, Error> {
        if ctx.is_primary() {
            // An ordinal beyond `u32` cannot come from the driver; `device` refuses it.
            let dev = device(u32::try_from(ctx.ordinal()).unwrap_or(u32::MAX))?;
            if dev.ctx().cu_ctx() == ctx.cu_ctx() {
                return Event::pooled_kind(&dev, kind);
            }
        }
        let (raw, ipc_handle) = create(ctx, kind)?;
        Ok(Event {
            raw,
            kind,
            home: Home::Own(ctx.clone()),
            ipc_handle,
        })
    }

    /// The context the event was created in.
    pub(crate) fn context(&self) -> &Arc<CudaContext> {
        match &self.home {
            Home::Pool(dev) => dev.ctx(),
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
        // SAFETY: libcuda is loaded (the event exists); `self.raw` is a live event of the
        // bound context (created in `create`, not destroyed before `self` drops); `stream` is
        // a live stream (our caller's obligation 1), and one of another context is refused by
        // the driver, not misused.
        unsafe { raw::event::record(self.raw, stream) }
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
        // SAFETY: libcuda is loaded (the event exists); `self.raw` is a live event (waiting
        // on an event of another context is allowed); `stream` is a live stream (our
        // caller's obligation 1).
        unsafe { raw::stream::wait_event(stream, self.raw, flags) }
    }

    /// Whether the captured work has finished (`cuEventQuery`); never blocks.
    pub(crate) fn is_complete(&self) -> Result<bool, Error> {
        // SAFETY: libcuda is loaded (the event exists); `self.raw` is a live event.
        unsafe { raw::event::query(self.raw) }
    }

    /// Blocks the calling thread until the captured work has finished. In the relaxed
    /// capture mode, so that a capture in global mode on another thread does not forbid it
    /// (the event itself must not have been recorded in a capture: callers check).
    pub(crate) fn synchronize(&self) -> Result<(), Error> {
        let _bound = bind(self.context())?;
        relaxed(|| {
            // SAFETY: libcuda is loaded (the event exists); `self.raw` is a live event of
            // the bound context.
            unsafe { raw::event::synchronize(self.raw) }
        })
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        match &self.home {
            Home::Pool(dev) => {
                let mut pool = dev.spare_events[self.kind.pool()]
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                if pool.len() < self.kind.cap() {
                    // Re-recording a pooled event later does not affect waits enqueued on it
                    // before (`cuStreamWaitEvent` captures the event's state at the call).
                    pool.push(SpareEvent {
                        raw: raw::event::Handle(self.raw),
                        ipc_handle: self.ipc_handle,
                    });
                    return;
                }
                drop(pool);
                destroy(dev.ctx(), self.raw);
            }
            Home::Own(ctx) => destroy(ctx, self.raw),
        }
    }
}

impl fmt::Debug for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Event")
            .field("raw", &self.raw)
            .field("kind", &self.kind)
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

/// A new event of `kind` in `ctx`, with its IPC handle for an interprocess event.
fn create(ctx: &CudaContext, kind: Kind) -> Result<(sys::CUevent, Option<[u8; 64]>), Error> {
    let _bound = bind(ctx)?;
    // SAFETY: libcuda is loaded (`bind` used it); the context is current (bound above).
    let event = unsafe { raw::event::create(kind.flags()) }?;
    if kind != Kind::Interprocess {
        return Ok((event, None));
    }
    // SAFETY: libcuda is loaded; `event` is the interprocess event made just above.
    match unsafe { raw::ipc::get_event_handle(event) } {
        Ok(handle) => Ok((event, Some(handle))),
        Err(e) => {
            // SAFETY: libcuda is loaded; `event` was made above in the bound context, and is
            // destroyed once, here: nothing else has it.
            let _ = unsafe { raw::event::destroy(event) };
            Err(e)
        }
    }
}

/// Destroys an event; errors are ignored (this runs in `Drop`, and a failure leaves nothing
/// to undo). Pending work that recorded or waits on the event is unaffected: the driver
/// releases it once that work completes.
fn destroy(ctx: &CudaContext, event: sys::CUevent) {
    if let Ok(_bound) = bind(ctx) {
        // SAFETY: libcuda is loaded; `event` is a live event of `ctx` (bound), destroyed
        // exactly once (its `Event` or pool entry is gone after this).
        let _ = unsafe { raw::event::destroy(event) };
    }
}
