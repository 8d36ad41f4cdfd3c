//! Streams another library owns (PyTorch's, CuPy's, libtorch's) as cudarc streams, for a
//! scope: what cudarc's launches, this crate's safe hand-offs and the cudarc adapter's views
//! take.
//!
//! cudarc 0.19.10's `CudaContext::wrap_borrowed_stream` makes an `Arc<CudaStream>` that does
//! not destroy the stream when dropped; its contract makes the caller keep the stream alive
//! "while the returned wrapper, or anything retaining it, may be used". An `Arc` can be
//! cloned and kept past any scope, and an escaped clone of a destroyed stream is a dangling
//! handle the driver would be given. So [`with_stream_raw`] is told how long the stream lives
//! ([`StreamLife`]):
//! - [`StreamLife::Immortal`]: never destroyed (default streams, PyTorch's pool streams);
//!   the stream itself is lent.
//! - [`StreamLife::KeptBy`]: alive as long as an owner (a CuPy `Stream` object); the stream
//!   is lent, and when the closure returns while clones of the wrapper are still held
//!   elsewhere, the owner is kept until the last clone is dropped ([`reclaim`](crate::reclaim)
//!   and the next [`with_stream_raw`] check). An escape is then a longer-lived owner.
//! - [`StreamLife::CallOnly`]: alive for the call only (`torch.cuda.ExternalStream`, a
//!   libtorch stream made from an external handle). The closure gets a stream of this crate
//!   instead, one it never destroys, forked from the caller's stream before the closure (an
//!   event recorded there and waited on) and joined back after it (the reverse): work on it
//!   is ordered exactly as if it had been enqueued on the caller's stream, also inside a
//!   CUDA graph capture (CUDA's fork/join pattern), and no clone of the wrapper, escaped or
//!   not, ever names the caller's stream.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use cudarc::driver::{CudaContext, CudaStream, sys};
use tensorbridge_core::{Owner, Stream};

use crate::capture::capture_of;
use crate::context::{ContextGuard, DeviceCtx, bind, device, device_of_stream};
use crate::error::Error;
use crate::handoff::{join_into_raw, join_raw};
use crate::raw::{self, ensure_driver};
use crate::types::{CaptureStatus, raw_stream};

/// How long a stream handed to [`with_stream_raw`] lives, which decides what the closure is
/// lent (see the module docs of the crate's "Borrowed streams").
///
/// `From<Option<Owner>>` keeps the older spelling: `None` is [`StreamLife::Immortal`],
/// `Some(owner)` is [`StreamLife::KeptBy`].
#[non_exhaustive]
pub enum StreamLife {
    /// Never destroyed while the process runs: the default streams, PyTorch's and libtorch's
    /// pool streams (which they never destroy). The stream itself is lent.
    Immortal,
    /// Alive as long as this owner is (a CuPy `Stream` object): the stream itself is lent,
    /// and the owner is held until the last clone of the wrapper is dropped.
    KeptBy(Owner),
    /// Alive for the call only, as far as anyone can promise (`torch.cuda.ExternalStream`, a
    /// libtorch stream made from an external handle): the closure runs on a stream of this
    /// crate, forked from this one and joined back to it with events.
    CallOnly,
}

impl From<Option<Owner>> for StreamLife {
    fn from(keeper: Option<Owner>) -> StreamLife {
        match keeper {
            None => StreamLife::Immortal,
            Some(owner) => StreamLife::KeptBy(owner),
        }
    }
}

impl std::fmt::Debug for StreamLife {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            StreamLife::Immortal => "Immortal",
            StreamLife::KeptBy(_) => "KeptBy(..)",
            StreamLife::CallOnly => "CallOnly",
        })
    }
}

/// Wrappers that outlived their scope, each with what keeps its stream alive.
static ESCAPED: Mutex<Vec<(Arc<CudaStream>, Owner)>> = Mutex::new(Vec::new());

/// This crate's own streams, free for the next call, per context: non-blocking streams made
/// by this crate and never destroyed (an escaped clone of one stays valid for the life of the
/// process), lent in place of call-only streams and taken for the layer's own work
/// ([`with_spare`]: the interprocess events of `ipc`).
static SPARE: Mutex<Vec<Arc<CudaStream>>> = Mutex::new(Vec::new());

/// Own streams whose wrapper escaped a scope: back to [`SPARE`] when the last clone is gone.
static OUT: Mutex<Vec<Arc<CudaStream>>> = Mutex::new(Vec::new());

/// How many entries [`ESCAPED`] and [`OUT`] hold together, so that [`sweep`] (on every
/// [`with_stream_raw`]) takes no lock when nothing escaped.
static HELD: AtomicUsize = AtomicUsize::new(0);

/// Releases the owners of escaped wrappers whose last clone outside this crate is gone, and
/// returns own streams to the spares likewise. Returns how many owners are still held.
pub(crate) fn sweep() -> usize {
    if HELD.load(Ordering::Acquire) == 0 {
        return 0;
    }
    let mut released = Vec::new();
    let held = {
        let mut escaped = ESCAPED.lock().unwrap_or_else(PoisonError::into_inner);
        let mut i = 0;
        while i < escaped.len() {
            // A count of 1 is this list's own clone: no one else can clone it any more.
            if Arc::strong_count(&escaped[i].0) == 1 {
                released.push(escaped.swap_remove(i));
            } else {
                i += 1;
            }
        }
        escaped.len()
    };
    HELD.fetch_sub(released.len(), Ordering::AcqRel);
    // Owners drop outside the lock: a Python owner attaches to the interpreter.
    drop(released);
    let back: Vec<Arc<CudaStream>> = {
        let mut out = OUT.lock().unwrap_or_else(PoisonError::into_inner);
        let (free, kept) = std::mem::take(&mut *out)
            .into_iter()
            .partition(|s| Arc::strong_count(s) == 1);
        *out = kept;
        free
    };
    HELD.fetch_sub(back.len(), Ordering::AcqRel);
    if !back.is_empty() {
        SPARE
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(back);
    }
    held
}

/// Runs `f` with `stream`, a stream of device `ordinal`'s primary context that another
/// library owns, as a cudarc stream: cudarc launches, [`handoff`](crate::handoff()),
/// [`make_ready_on`](crate::make_ready_on), [`ready_on`](crate::ready_on) and the cudarc
/// adapter's views all take it. Work enqueued on it is ordered with the owner's own work on
/// that stream, as if the owner had enqueued it: that is the point (a kernel on PyTorch's
/// current stream runs after the PyTorch work before it and before the PyTorch work after
/// it, with no event at all).
///
/// - [`Stream::LegacyDefault`] is device `ordinal`'s legacy default stream (cudarc's
///   `default_stream`), [`Stream::PerThreadDefault`] the calling thread's per-thread stream
///   (`f` runs on this thread; a clone used on another thread names that thread's). Both
///   live forever, whatever `life` says.
/// - A handle must belong to device `ordinal`'s primary context
///   ([`Error::DeviceMismatch`] for another device's, [`Error::ForeignContext`] for a
///   non-primary context's).
/// - `life` says how long the stream lives ([`StreamLife`]; `None` and `Some(owner)` mean
///   [`StreamLife::Immortal`] and [`StreamLife::KeptBy`]). For [`StreamLife::KeptBy`], if
///   clones of the wrapper outlive `f` (kept in a struct, in a signal that holds its stream),
///   the owner is held until the last of them is dropped, so they never name a destroyed
///   stream. For [`StreamLife::CallOnly`], `f` gets a stream of this crate that waits (on the
///   GPU) for the work enqueued on `stream` so far, and `stream` waits for everything `f`
///   enqueued before this function returns (also when `f` panics): two event records and two
///   waits, legal inside a CUDA graph capture (the fork/join pattern). An escaped clone names
///   that stream of this crate, which is never destroyed; work enqueued through it after the
///   call is not ordered with `stream`.
///
/// The calling thread's current context is restored after `f`, whatever cudarc calls inside
/// made current. Without libcuda, [`Error::NoDriver`] before `f` runs; a failing fork is an
/// error before `f` runs, a failing join an error after it.
///
/// # Safety
/// The caller guarantees:
/// 1. `stream` is a live stream (a default stream, or the handle of a stream that has not
///    been destroyed) for the call, and stays live as long as `life` says: for the life of
///    the process ([`StreamLife::Immortal`]), as long as the owner is alive
///    ([`StreamLife::KeptBy`]), or only for the call ([`StreamLife::CallOnly`]).
pub unsafe fn with_stream_raw<R>(
    ordinal: u32,
    stream: Stream,
    life: impl Into<StreamLife>,
    f: impl FnOnce(&Arc<CudaStream>) -> R,
) -> Result<R, Error> {
    ensure_driver()?;
    sweep();
    let life = life.into();
    let _restore = ContextGuard::save()?;
    let dev = device(ordinal)?;
    let (wrapped, keeper) = match stream {
        Stream::LegacyDefault => (dev.ctx().default_stream(), None),
        Stream::PerThreadDefault => (dev.ctx().per_thread_stream(), None),
        Stream::Handle(h) => {
            // SAFETY: the handle is live for the call (obligation 1), not a sentinel.
            let home = unsafe { device_of_stream(h) }?;
            if !Arc::ptr_eq(home.ctx(), dev.ctx()) {
                return Err(Error::DeviceMismatch {
                    tensor: tensorbridge_core::Device::cuda(ordinal),
                    stream: home.ctx().ordinal(),
                });
            }
            let keeper = match life {
                StreamLife::CallOnly => {
                    // SAFETY: `stream` is live for the call (obligation 1), a stream of
                    // device `ordinal`'s primary context (just checked).
                    return unsafe { forked(&dev, ordinal, stream, f) };
                }
                StreamLife::KeptBy(owner) => Some(owner),
                StreamLife::Immortal => None,
            };
            // SAFETY: a live stream of this context (just asked of the driver), kept alive
            // for the process or as long as `keeper` is, which outlives every clone of the
            // wrapper: held below until the last one is dropped (obligation 1). Ordering
            // cudarc's work with the owner's is the purpose: both go to the same stream, in
            // program order.
            let wrapped = unsafe { dev.ctx().wrap_borrowed_stream(raw_stream(stream)) };
            (wrapped, keeper)
        }
    };
    // Checked when `f` returns or unwinds: a clone kept before a panic escapes too.
    let scope = Scope { wrapped, keeper };
    Ok(f(&scope.wrapped))
}

/// The borrow's end: keeps the keeper of a wrapper whose clones outlive the scope.
struct Scope {
    wrapped: Arc<CudaStream>,
    keeper: Option<Owner>,
}

impl Drop for Scope {
    fn drop(&mut self) {
        if Arc::strong_count(&self.wrapped) > 1
            && let Some(keeper) = self.keeper.take()
        {
            ESCAPED
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push((self.wrapped.clone(), keeper));
            HELD.fetch_add(1, Ordering::AcqRel);
        }
    }
}

/// [`with_stream_raw`] for a call-only stream: `f` runs on a stream of this crate forked from
/// `stream` and joined back to it.
///
/// # Safety
/// The caller guarantees:
/// 1. `stream` is a live stream of `dev`'s context (device `ordinal`) for the call.
unsafe fn forked<R>(
    dev: &Arc<DeviceCtx>,
    ordinal: u32,
    stream: Stream,
    f: impl FnOnce(&Arc<CudaStream>) -> R,
) -> Result<R, Error> {
    let want = {
        let _bound = bind(dev.ctx())?;
        // SAFETY: `stream` is live for the call (obligation 1); its context is current.
        unsafe { capture_of(raw_stream(stream)) }?.status()
    };
    let own = spare_stream(dev.ctx(), want)?;
    // The fork: `own` waits for the caller's work so far (inside a capture, `own` joins it).
    // SAFETY: `stream` is live for the call (obligation 1).
    if let Err(e) = unsafe { join_raw(&own, stream) } {
        give_back(own);
        return Err(e);
    }
    let mut join = Join {
        own,
        stream,
        ordinal,
        joined: None,
    };
    let out = f(&join.own);
    // SAFETY: `stream` is live for the call (obligation 1).
    let joined = unsafe { join_into_raw(stream, ordinal, &join.own) };
    join.joined = Some(joined.clone());
    drop(join);
    joined.map(|()| out)
}

/// The join at the end of a forked scope, also when the closure unwinds (a capture must be
/// joined back before it ends): the caller's stream waits for the work on the own stream.
struct Join {
    own: Arc<CudaStream>,
    stream: Stream,
    ordinal: u32,
    /// Set once joined (on the normal path); `None` while unwinding.
    joined: Option<Result<(), Error>>,
}

impl Drop for Join {
    fn drop(&mut self) {
        if self.joined.is_none() {
            // SAFETY: the stream is live for the call that owns this guard (`forked`'s
            // obligation 1), which is still unwinding. An error here has nowhere to go.
            let _ = unsafe { join_into_raw(self.stream, self.ordinal, &self.own) };
        }
        give_back(self.own.clone());
    }
}

/// A stream of this crate in `ctx`, free for one call: a spare in the capture state `want`
/// (the caller's stream's: a stream of this crate stays part of a capture it joined until
/// that capture ends, so only a call inside the same capture may take it), or a new
/// non-blocking one.
fn spare_stream(ctx: &Arc<CudaContext>, want: CaptureStatus) -> Result<Arc<CudaStream>, Error> {
    let _bound = bind(ctx)?;
    {
        let mut spare = SPARE.lock().unwrap_or_else(PoisonError::into_inner);
        let found = spare.iter().position(|s| {
            s.context().cu_ctx() == ctx.cu_ctx()
                // SAFETY: a stream of this crate, never destroyed; its context is current.
                && unsafe { capture_of(s.cu_stream()) }.is_ok_and(|c| c.status() == want)
        });
        if let Some(at) = found {
            return Ok(spare.swap_remove(at));
        }
    }
    let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
    // SAFETY: libcuda is loaded (the context exists); `ctx` is current (bound above).
    let handle = unsafe { raw::stream::create(flags) }?;
    // SAFETY: a live stream of `ctx` (made just above), never destroyed: no code of this
    // crate destroys it, and the wrapper, not owning it, does not either. Work on it is
    // ordered with the callers' streams by the fork and join of each call.
    Ok(unsafe { ctx.wrap_borrowed_stream(handle) })
}

/// Runs `f` on a stream of this crate in `ctx` that no capture uses (a spare, or a new one),
/// and gives the stream back after. For the layer's own ordering work, which needs a stream
/// no caller enqueues on.
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
pub(crate) fn with_spare<R>(
    ctx: &Arc<CudaContext>,
    f: impl FnOnce(&Arc<CudaStream>) -> Result<R, Error>,
) -> Result<R, Error> {
    let own = spare_stream(ctx, CaptureStatus::None)?;
    let out = f(&own);
    give_back(own);
    out
}

/// Returns one of this crate's streams after a call: to the spares, or, while clones of the
/// wrapper escaped the call, to [`OUT`] until they are gone (never to another call at once).
fn give_back(own: Arc<CudaStream>) {
    // One count is `own`; another is the `Join` guard's while it drops.
    if Arc::strong_count(&own) <= 2 {
        SPARE
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(own);
    } else {
        OUT.lock().unwrap_or_else(PoisonError::into_inner).push(own);
        HELD.fetch_add(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_driver_is_an_error_before_the_closure() {
        if crate::raw::driver_present() {
            return;
        }
        let mut ran = false;
        // SAFETY: the legacy default stream is always live; without a driver nothing runs.
        let r = unsafe { with_stream_raw(0, Stream::LegacyDefault, None, |_| ran = true) };
        assert!(matches!(r, Err(Error::NoDriver)), "{r:?}");
        assert!(!ran);
        // SAFETY: as above.
        let r = unsafe {
            with_stream_raw(0, Stream::LegacyDefault, StreamLife::CallOnly, |_| {
                ran = true
            })
        };
        assert!(matches!(r, Err(Error::NoDriver)), "{r:?}");
        assert!(!ran);
    }

    #[test]
    fn an_optional_keeper_is_a_life() {
        assert!(matches!(StreamLife::from(None), StreamLife::Immortal));
        let owner: Owner = Arc::new(());
        assert!(matches!(
            StreamLife::from(Some(owner)),
            StreamLife::KeptBy(_)
        ));
    }
}
