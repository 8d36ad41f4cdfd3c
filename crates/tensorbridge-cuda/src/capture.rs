//! CUDA graph capture: whether a stream is being captured, the rules a hand-off follows
//! across a capture's boundary ([`plan_wait`], pure), keeping objects alive as long as a
//! captured graph.
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
//!   hand-offs are refused with an error instead of invalidating the capture. The one
//!   exception is CUDA's fork pattern: a stream outside any capture that explicitly joins a
//!   capturing stream ([`join`](crate::join)) becomes part of the capture.
//! - Owners that must outlive the device's use of memory live as long as the graph (a CUDA
//!   user object retained by the graph under capture), not until an event that never runs.
//! - Event queries and host waits run in the relaxed capture mode, which a capture in global
//!   mode on another thread does not forbid.

use std::any::Any;
use std::ffi::c_void;
use std::sync::{Condvar, Mutex, OnceLock, PoisonError};

use cudarc::driver::sys;

use crate::context::bind;
use crate::error::Error;
use crate::raw;
use crate::release::InFlight;
use crate::types::CaptureStatus;

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

/// Whether a stream outside any capture may join a capture by waiting on a captured stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fork {
    /// Explicit stream-to-stream joins ([`join`](crate::join), [`join_raw`](crate::join_raw)):
    /// CUDA's fork pattern.
    Allowed,
    /// Tensor hand-offs: data made inside a capture, used outside it, is refused.
    Refused,
}

/// How a consumer stream waits for a producer's work, once the capture rules are applied.
#[derive(Clone, Copy, Debug)]
pub(crate) enum WaitPlan {
    /// `cuStreamWaitEvent` with the default flags on an event of the producer: outside any
    /// capture, inside one capture (a graph edge), or a stream joining a capture (the fork).
    Wait,
    /// The consumer is being captured and the producer is not: a wait with
    /// `CU_EVENT_WAIT_EXTERNAL` on an event recorded now, kept alive with the consumer's
    /// graph (never re-recorded while the graph may replay).
    WaitExternal(Active),
}

/// The capture rules of the crate docs, one arm per rule: how `consumer` waits for work
/// `producer` enqueued (or recorded, for a signal), or why it must not. Pure: table-tested
/// without a GPU. Same-stream hand-offs are decided before this (nothing to wait for).
///
/// `consumer_is_legacy` says the consumer is the legacy default stream, which may never join
/// a capture by forking (it synchronises with every blocking stream).
pub(crate) fn plan_wait(
    producer: CaptureStatus,
    consumer: Capture,
    fork: Fork,
    consumer_is_legacy: bool,
) -> Result<WaitPlan, Error> {
    use CaptureStatus as P;
    match (producer, consumer) {
        // The legacy stream while a stream it synchronises with is captured: any use
        // invalidates that capture.
        (P::Implicit, _) | (_, Capture::Implicit) => Err(Error::LegacyDuringCapture),
        // One capture: the wait becomes a graph edge.
        (P::Active { id }, Capture::Active(c)) if id == c.id => Ok(WaitPlan::Wait),
        // A stream outside any capture waiting on a captured stream joins the capture (the
        // fork of CUDA's cross-stream capture); it must be joined back before the capture
        // ends. Only for explicit stream-to-stream joins, and never the legacy stream.
        (P::Active { .. }, Capture::None) if fork == Fork::Allowed && !consumer_is_legacy => {
            Ok(WaitPlan::Wait)
        }
        // Work recorded in a capture runs at the graph's replays: nothing outside that
        // capture can wait for it now.
        (P::Active { .. }, _) => Err(Error::CaptureMismatch {
            producer,
            consumer: consumer.status(),
        }),
        // The producer's work as of now, waited for by the graph at every replay.
        (_, Capture::Active(c)) => Ok(WaitPlan::WaitExternal(c)),
        // Neither is captured (an invalidated capture fails at its end, whatever we do).
        _ => Ok(WaitPlan::Wait),
    }
}

/// The driver's version as `cuDriverGetVersion` reports it (12030 for CUDA 12.3); 0 when it
/// cannot say. Asked once.
pub(crate) fn driver_version() -> i32 {
    static VERSION: OnceLock<i32> = OnceLock::new();
    *VERSION.get_or_init(|| {
        // SAFETY: libcuda is loaded (callers run after `ensure_driver` or hold a cudarc
        // object).
        unsafe { raw::driver_version() }.unwrap_or(0)
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
    let info = if has_capture_info_v3() {
        // SAFETY: libcuda is loaded (a context is current) and has the entry point (checked
        // just above); `stream` is live and a context current (obligation 1).
        unsafe { raw::stream::capture_info(stream) }
    } else {
        // SAFETY: as above, for the old entry point.
        unsafe { raw::stream::is_capturing(stream) }
    };
    let info = match info {
        Ok(info) => info,
        // The legacy stream while a blocking stream is being captured.
        Err(Error::Driver {
            result: sys::CUresult::CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
            ..
        }) => return Ok(Capture::Implicit),
        Err(e) => return Err(e),
    };
    // The old entry point names no graph (null): `keep_with_graph` then leaks instead.
    Ok(match info.status {
        s if s == S::CU_STREAM_CAPTURE_STATUS_NONE as u32 => Capture::None,
        s if s == S::CU_STREAM_CAPTURE_STATUS_ACTIVE as u32 => Capture::Active(Active {
            id: info.id,
            graph: info.graph,
        }),
        _ => Capture::Invalidated,
    })
}

/// Objects whose graph was destroyed: the driver's destructor callback may not call CUDA, so
/// it only moves them here and wakes the thread that drops them ([`start_dropper`]).
static RELEASED: Mutex<Vec<Box<dyn Any + Send>>> = Mutex::new(Vec::new());

/// Signalled when [`RELEASED`] gains objects.
static RELEASED_MORE: Condvar = Condvar::new();

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
    RELEASED_MORE.notify_one();
}

/// Starts, once, the thread that drops the objects of destroyed graphs soon after the driver
/// hands them back (asleep otherwise). If the system refuses the thread,
/// [`reclaim`](crate::reclaim) drops them instead.
fn start_dropper() {
    static STARTED: OnceLock<()> = OnceLock::new();
    STARTED.get_or_init(|| {
        let _ = std::thread::Builder::new()
            .name("tensorbridge-graph-release".into())
            .spawn(|| {
                loop {
                    let (released, in_flight) = {
                        let mut list = RELEASED.lock().unwrap_or_else(PoisonError::into_inner);
                        while list.is_empty() {
                            list = RELEASED_MORE
                                .wait(list)
                                .unwrap_or_else(PoisonError::into_inner);
                        }
                        (std::mem::take(&mut *list), InFlight::start())
                    };
                    // Dropped with no lock held: they may call CUDA or Python.
                    drop(released);
                    drop(in_flight);
                }
            });
    });
}

/// Keeps `object` alive until `capture`'s graph, and every executable graph instantiated from
/// it, has been destroyed and their launches have finished; then a thread of this crate drops
/// it. Without a graph handle (drivers older than CUDA 12.3) the object is leaked: never
/// dropped early.
pub(crate) fn keep_with_graph(capture: Active, object: Box<dyn Any + Send>) {
    if capture.graph.is_null() {
        std::mem::forget(object);
        return;
    }
    start_dropper();
    let data = Box::into_raw(Box::new(object));
    // SAFETY: libcuda is loaded (a capture was read from the driver); `release_with_graph`
    // takes `data` back exactly once and calls no CUDA function.
    let Ok(user) = (unsafe { raw::graph::user_object_create(data.cast(), release_with_graph) })
    else {
        // Nothing holds `data`: leak the object rather than free memory the graph may use.
        return;
    };
    // SAFETY: `capture.graph` is the graph of a capture in progress (read just before, on
    // this thread, from a stream the caller holds); the user object's one reference moves to
    // it.
    if unsafe { raw::graph::retain_user_object_move(capture.graph, user) }.is_err() {
        // Our reference was not moved, and the caller's work may already be recorded in the
        // graph: keep the reference (and so the object) forever rather than free early.
    }
}

/// Drops, from the calling thread, the objects whose graphs are gone that the dropping thread
/// has not taken yet (see [`keep_with_graph`]); returns how many.
pub(crate) fn drain_released() -> usize {
    let released = std::mem::take(&mut *RELEASED.lock().unwrap_or_else(PoisonError::into_inner));
    let n = released.len();
    drop(released);
    n
}

/// Whether `stream` is being captured into a CUDA graph (`cuStreamGetCaptureInfo`), in its
/// own context (the calling thread's current context is left as it was).
pub fn capture_status(stream: &cudarc::driver::CudaStream) -> Result<CaptureStatus, Error> {
    let _bound = bind(stream.context())?;
    // SAFETY: a cudarc stream borrowed for the call is live; its context is current.
    Ok(unsafe { capture_of(stream.cu_stream()) }?.status())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn active(id: u64) -> Capture {
        Capture::Active(Active {
            id,
            graph: std::ptr::null_mut(),
        })
    }

    /// What a plan says, as a short string the table below compares.
    fn outcome(plan: Result<WaitPlan, Error>) -> String {
        match plan {
            Ok(WaitPlan::Wait) => "wait".into(),
            Ok(WaitPlan::WaitExternal(a)) => format!("external({})", a.id),
            Err(Error::LegacyDuringCapture) => "legacy".into(),
            Err(Error::CaptureMismatch { .. }) => "mismatch".into(),
            Err(e) => format!("{e}"),
        }
    }

    /// The crate docs' capture rules, every producer x consumer x fork x legacy combination.
    #[test]
    fn capture_rules_table() {
        use CaptureStatus as P;
        let producers = [P::None, P::Active { id: 7 }, P::Invalidated, P::Implicit];
        let consumers = [
            ("none", Capture::None),
            ("same", active(7)),
            ("other", active(9)),
            ("invalidated", Capture::Invalidated),
            ("implicit", Capture::Implicit),
        ];
        for p in producers {
            for (cname, c) in consumers {
                for fork in [Fork::Allowed, Fork::Refused] {
                    for legacy in [false, true] {
                        let got = outcome(plan_wait(p, c, fork, legacy));
                        let want = match (p, cname) {
                            (P::Implicit, _) | (_, "implicit") => "legacy",
                            (P::Active { .. }, "same") => "wait",
                            (P::Active { .. }, "none") if fork == Fork::Allowed && !legacy => {
                                "wait"
                            }
                            (P::Active { .. }, _) => "mismatch",
                            (_, "same") => "external(7)",
                            (_, "other") => "external(9)",
                            _ => "wait",
                        };
                        assert_eq!(
                            got, want,
                            "producer {p:?}, consumer {cname}, {fork:?}, legacy {legacy}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn mismatches_name_both_captures() {
        let err = plan_wait(
            CaptureStatus::Active { id: 3 },
            Capture::None,
            Fork::Refused,
            false,
        )
        .unwrap_err();
        assert!(matches!(
            err,
            Error::CaptureMismatch {
                producer: CaptureStatus::Active { id: 3 },
                consumer: CaptureStatus::None
            }
        ));
        assert_eq!(
            err.to_string(),
            "the data is ready on a stream that is being captured into a CUDA graph (capture 3) \
             but the consumer stream is not being captured (expected the consumer in the same \
             capture; outside it, order against the stream the graph is launched on)"
        );
    }
}
