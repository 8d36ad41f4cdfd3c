//! CUDA graph capture: whether a stream is being captured, keeping objects alive as long as a
//! captured graph, and driver queries that must not disturb another thread's capture.
//!
//! While a stream is captured (`torch.cuda.graph`, `cudaStreamBeginCapture`), work enqueued
//! on it is recorded into a graph instead of running. The rules the hand-off follows:
//! - An event recorded on a capturing stream, and a wait on it by a stream of the same
//!   capture, become graph edges: legal, and what ordering means inside a capture.
//! - A capturing stream may not wait on an event recorded outside the capture, unless the wait
//!   says `CU_EVENT_WAIT_EXTERNAL`; the graph then waits, at each replay, for the event's
//!   record. This crate uses a dedicated event for that, kept (with the graph) until the graph
//!   is destroyed, so the record it waits for is the producer's work at capture time.
//! - A stream outside the capture may not wait on an event recorded inside it, and the legacy
//!   default stream may not be used while a stream it synchronises with is captured: such
//!   hand-offs are refused with an error instead of invalidating the capture.
//! - Owners that must outlive the device's use of memory live as long as the graph (a CUDA
//!   user object retained by the graph under capture), not until an event that never runs.
//! - Event queries (in [`reclaim`](crate::reclaim)) run in the relaxed capture mode, which a
//!   capture in global mode on another thread does not forbid.

use std::any::Any;
use std::ffi::c_void;
use std::sync::{Mutex, OnceLock, PoisonError};

use cudarc::driver::sys;

use crate::Error;

/// What a stream is doing with respect to graph capture.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CaptureStatus {
    /// Not being captured: work runs.
    None,
    /// Being captured into a graph; `id` is unique per capture sequence in the process.
    Active {
        /// The capture sequence's id (`cuStreamGetCaptureInfo`).
        id: u64,
    },
    /// Its capture was invalidated by an illegal call; ending it will fail.
    Invalidated,
    /// The legacy default stream while a stream that synchronises with it is being captured:
    /// any work on it would invalidate that capture.
    Implicit,
}

impl std::fmt::Display for CaptureStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CaptureStatus::None => f.write_str("not being captured"),
            CaptureStatus::Active { id } => {
                write!(f, "being captured into a CUDA graph (capture {id})")
            }
            CaptureStatus::Invalidated => f.write_str("in an invalidated CUDA graph capture"),
            CaptureStatus::Implicit => {
                f.write_str("the legacy default stream during a CUDA graph capture")
            }
        }
    }
}

/// A capture sequence's id and the graph it is building.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Active {
    pub(crate) id: u64,
    pub(crate) graph: sys::CUgraph,
}

/// [`CaptureStatus`] with the graph under construction, for [`keep_with_graph`].
#[derive(Clone, Copy, Debug)]
pub(crate) enum Capture {
    None,
    Active(Active),
    Invalidated,
    Implicit,
}

impl Capture {
    pub(crate) fn status(self) -> CaptureStatus {
        match self {
            Capture::None => CaptureStatus::None,
            Capture::Active(a) => CaptureStatus::Active { id: a.id },
            Capture::Invalidated => CaptureStatus::Invalidated,
            Capture::Implicit => CaptureStatus::Implicit,
        }
    }

    /// The capture's id, when one is active.
    pub(crate) fn id(self) -> Option<u64> {
        match self {
            Capture::Active(a) => Some(a.id),
            _ => None,
        }
    }
}

/// The driver's version as `cuDriverGetVersion` reports it (12030 for CUDA 12.3); 0 when it
/// cannot say.
fn driver_version() -> i32 {
    static VERSION: OnceLock<i32> = OnceLock::new();
    *VERSION.get_or_init(|| {
        let mut v = 0;
        // SAFETY: libcuda is loaded (callers run after `ensure_driver` or hold a cudarc
        // object); the driver writes one int through a pointer to a live local.
        let rc = unsafe { sys::cuDriverGetVersion(&mut v) };
        if rc == sys::CUresult::CUDA_SUCCESS {
            v
        } else {
            0
        }
    })
}

/// Whether the driver has `cuStreamGetCaptureInfo_v3` and user objects (CUDA 12.3); cudarc
/// panics on a missing symbol, so older drivers take the `cuStreamIsCapturing` path.
fn has_capture_info_v3() -> bool {
    driver_version() >= 12030
}

/// The capture state of `stream` in the current context (sentinels name that context's
/// default streams). The caller binds the right context first.
///
/// # Safety
/// The caller guarantees:
/// 1. `stream` is a live stream for the duration of the call (a default-stream sentinel, or
///    the handle of a stream that has not been destroyed), and a context is current.
pub(crate) unsafe fn capture_of(stream: sys::CUstream) -> Result<Capture, Error> {
    use sys::CUstreamCaptureStatus as S;
    // Read as a plain integer: a value outside the enum (a newer driver's) must not become
    // an invalid Rust enum.
    let mut status: u32 = u32::MAX;
    let status_out = (&raw mut status).cast::<sys::CUstreamCaptureStatus>();
    let mut graph: sys::CUgraph = std::ptr::null_mut();
    let mut id: sys::cuuint64_t = 0;
    let rc = if has_capture_info_v3() {
        // SAFETY: `stream` is live and a context current (obligation 1); the driver writes
        // the status, id and graph through pointers to live locals, and is told (nulls) not
        // to return the dependency arrays.
        unsafe {
            sys::cuStreamGetCaptureInfo_v3(
                stream,
                status_out,
                &mut id,
                &mut graph,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        }
    } else {
        // SAFETY: as above, for the status alone.
        unsafe { sys::cuStreamIsCapturing(stream, status_out) }
    };
    match rc {
        sys::CUresult::CUDA_SUCCESS => {}
        // The legacy stream while a blocking stream is being captured.
        sys::CUresult::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT => return Ok(Capture::Implicit),
        result => {
            return Err(Error::Driver {
                call: "cuStreamGetCaptureInfo",
                result,
            });
        }
    }
    // The old entry point names no graph (null): `keep_with_graph` then leaks instead.
    Ok(match status {
        s if s == S::CU_STREAM_CAPTURE_STATUS_NONE as u32 => Capture::None,
        s if s == S::CU_STREAM_CAPTURE_STATUS_ACTIVE as u32 => {
            Capture::Active(Active { id, graph })
        }
        _ => Capture::Invalidated,
    })
}

/// Objects whose graph was destroyed: the driver's destructor callback may not call CUDA, so
/// it only moves them here, and [`drain_released`] drops them on an ordinary thread.
static RELEASED: Mutex<Vec<Box<dyn Any + Send>>> = Mutex::new(Vec::new());

/// The user object's destructor (called by the driver, on a thread of its own, once the
/// graph and every executable graph made from it are destroyed and their launches done).
///
/// # Safety
/// `data` is the `Box<Box<dyn Any + Send>>` leaked by [`keep_with_graph`], passed once.
unsafe extern "C" fn release_with_graph(data: *mut c_void) {
    // SAFETY: the pointer came from `Box::into_raw` in `keep_with_graph`, and the driver calls
    // each user object's destructor exactly once.
    let kept = unsafe { Box::from_raw(data.cast::<Box<dyn Any + Send>>()) };
    // No CUDA call here (the driver forbids it in this callback) and no drop of the object:
    // it may call CUDA or Python when dropped. Poisoning cannot leave the list inconsistent.
    RELEASED
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(*kept);
}

/// Keeps `object` alive until `capture`'s graph, and every executable graph instantiated from
/// it, has been destroyed and their launches have finished; then [`reclaim`](crate::reclaim)
/// drops it. Without a graph handle (drivers older than CUDA 12.3) the object is leaked:
/// never dropped early.
pub(crate) fn keep_with_graph(capture: Active, object: Box<dyn Any + Send>) {
    if capture.graph.is_null() {
        std::mem::forget(object);
        return;
    }
    let data = Box::into_raw(Box::new(object));
    let mut user: sys::CUuserObject = std::ptr::null_mut();
    let flags = sys::CUuserObject_flags_enum::CU_USER_OBJECT_NO_DESTRUCTOR_SYNC as u32;
    // SAFETY: libcuda is loaded; the driver writes the handle through a pointer to a live
    // local; `data` stays valid until the destructor, which takes it back exactly once.
    let created = unsafe {
        sys::cuUserObjectCreate(&mut user, data.cast(), Some(release_with_graph), 1, flags)
    };
    if created != sys::CUresult::CUDA_SUCCESS {
        // Nothing holds `data`: leak the object rather than free memory the graph may use.
        return;
    }
    let moved = sys::CUuserObjectRetain_flags_enum::CU_GRAPH_USER_OBJECT_MOVE as u32;
    // SAFETY: `capture.graph` is the graph of a capture in progress (read just before, on
    // this thread, from a stream the caller holds); the user object's one reference moves to
    // it.
    let retained = unsafe { sys::cuGraphRetainUserObject(capture.graph, user, 1, moved) };
    if retained != sys::CUresult::CUDA_SUCCESS {
        // Our reference was not moved, and the caller's work may already be recorded in the
        // graph: keep the reference (and so the object) forever rather than free early.
    }
}

/// Drops the objects whose graphs are gone (see [`keep_with_graph`]); returns how many.
pub(crate) fn drain_released() -> usize {
    let released = std::mem::take(&mut *RELEASED.lock().unwrap_or_else(PoisonError::into_inner));
    let n = released.len();
    drop(released);
    n
}

/// Runs `f` with this thread's capture mode relaxed, so that driver queries it makes (event
/// queries) are not refused, and do not invalidate a capture in global mode elsewhere. The
/// previous mode is restored afterwards.
pub(crate) fn relaxed<R>(f: impl FnOnce() -> R) -> R {
    let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    // SAFETY: libcuda is loaded (callers hold events); the driver swaps the thread's mode
    // with the value behind a pointer to a live local.
    let swapped =
        unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) } == sys::CUresult::CUDA_SUCCESS;
    let result = f();
    if swapped {
        // SAFETY: as above; `mode` now holds the thread's previous mode, put back.
        let _ = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) };
    }
    result
}

/// Whether `stream` is being captured into a CUDA graph (`cuStreamGetCaptureInfo`), in its
/// own context (the calling thread's current context is left as it was).
pub fn capture_status(stream: &cudarc::driver::CudaStream) -> Result<CaptureStatus, Error> {
    let _bound = crate::driver::bind(stream.context())?;
    // SAFETY: a cudarc stream borrowed for the call is live; its context is current.
    Ok(unsafe { capture_of(stream.cu_stream()) }?.status())
}
