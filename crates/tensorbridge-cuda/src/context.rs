//! Contexts and the calling thread's driver state: each device's primary context (retained
//! once, with the spare events the event module pools there), which primary context a raw
//! stream belongs to, binding a context for the duration of a call and putting the caller's
//! back ([`Rebound`], [`ContextGuard`]), the calling thread's current device, and its
//! stream-capture mode ([`relaxed`]).

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use cudarc::driver::{CudaContext, sys};
use tensorbridge_core::StreamHandle;

use crate::error::Error;
use crate::raw::{self, ensure_driver};
use crate::types::raw_stream;

/// One device's primary context (retained for the life of the process) and the spare event
/// handles of its pools (see the event module: this module only keeps them).
pub(crate) struct DeviceCtx {
    ctx: Arc<CudaContext>,
    /// Spare events of this context, one list per kind of event the event module makes.
    pub(crate) spare_events: [Mutex<Vec<SpareEvent>>; 3],
}

/// A pooled event: its handle, and for an interprocess event the IPC handle the driver gave
/// it (asked once, when the event was made).
pub(crate) struct SpareEvent {
    pub(crate) raw: raw::event::Handle,
    pub(crate) ipc_handle: Option<[u8; 64]>,
}

impl DeviceCtx {
    /// The device's primary context.
    pub(crate) fn ctx(&self) -> &Arc<CudaContext> {
        &self.ctx
    }
}

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
    let index = usize::try_from(ordinal)
        .map_err(|_| tensorbridge_core::Error::OrdinalTooLarge { ordinal })?;
    // cudarc casts the ordinal to `int`; refuse what would wrap rather than ask for device -1.
    if i32::try_from(ordinal).is_err() {
        return Err(tensorbridge_core::Error::OrdinalTooLarge { ordinal }.into());
    }
    // cudarc makes the context it retains current: put the caller's back.
    let ctx = {
        let _keep = ContextGuard::save()?;
        CudaContext::new(index).map_err(|e| Error::driver("cuDevicePrimaryCtxRetain", e))?
    };
    let dev = Arc::new(DeviceCtx {
        ctx,
        spare_events: std::array::from_fn(|_| Mutex::new(Vec::new())),
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
    // SAFETY: libcuda is loaded (every caller checked `ensure_driver`); a context is current
    // (every caller checked, or bound one).
    let dev = unsafe { raw::ctx::get_device() }?;
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
    // SAFETY: libcuda is loaded (just checked); `handle` is a live stream (obligation 1).
    let ctx =
        unsafe { raw::stream::get_ctx(raw_stream(tensorbridge_core::Stream::Handle(handle))) }?;
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
    // SAFETY: libcuda is loaded (every caller checked `ensure_driver` or holds a cudarc
    // object).
    unsafe { raw::ctx::get_current() }
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
    // SAFETY: libcuda is loaded (`current` just answered); `want` is a live context
    // (obligation 1).
    unsafe { raw::ctx::set_current(want) }?;
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
            // SAFETY: libcuda is loaded (`bind` used it); `previous` was current on this
            // thread when `bind` ran (or null, which unbinds); this crate destroys no context
            // in between. An error (the caller's context destroyed meanwhile by code this
            // crate called) leaves ours current, which is all that is left to do in a `Drop`.
            let _ = unsafe { raw::ctx::set_current(previous) };
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
    /// none). Fails only if the driver cannot say which context is current. Initialises the
    /// driver first (`cuInit`), so it may be a process's first CUDA call.
    pub fn save() -> Result<ContextGuard, Error> {
        // Without libcuda, or with a driver that cannot start, no context can be current.
        if ensure_driver().is_err() {
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
            // SAFETY: libcuda is loaded (`current` just answered); `saved` was current on
            // this thread when the guard was made (or null, which unbinds). A caller that
            // destroyed that context meanwhile gets the driver's error here, which a `Drop`
            // can only ignore.
            let _ = unsafe { raw::ctx::set_current(saved) };
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

/// Runs `f` with this thread's capture mode relaxed, so that driver queries it makes (event
/// queries and host waits) are not refused, and do not invalidate a capture in global mode
/// elsewhere. The previous mode is restored afterwards.
///
/// Callers hold an event or a bound context, so libcuda is loaded.
pub(crate) fn relaxed<R>(f: impl FnOnce() -> R) -> R {
    let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    // SAFETY: libcuda is loaded (callers hold events or a bound context).
    let swapped = unsafe { raw::capture_mode::exchange(&mut mode) }.is_ok();
    let result = f();
    if swapped {
        // SAFETY: as above; `mode` now holds the thread's previous mode, put back.
        let _ = unsafe { raw::capture_mode::exchange(&mut mode) };
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_of_unused_ordinal_is_not_touched_without_a_driver() {
        if !crate::raw::driver_present() {
            assert!(matches!(device(0), Err(Error::NoDriver)));
            // Nothing to save or restore: the guard is inert.
            drop(ContextGuard::save().unwrap());
        }
    }
}
