//! Streams another library owns (PyTorch's, CuPy's, libtorch's) as cudarc streams, for a
//! scope: what cudarc's launches, this crate's safe hand-offs and the cudarc adapter's views
//! take.
//!
//! cudarc 0.19.10's `CudaContext::wrap_borrowed_stream` makes an `Arc<CudaStream>` that does
//! not destroy the stream when dropped; its contract makes the caller keep the stream alive
//! "while the returned wrapper, or anything retaining it, may be used". An `Arc` can be
//! cloned and kept past any scope, and an escaped clone of a destroyed stream is a dangling
//! handle the driver would be given. So [`with_stream_raw`] takes, beside the handle, what
//! keeps the stream alive (its owner: a CuPy `Stream` object, say), and when the closure
//! returns while clones of the wrapper are still held elsewhere, it keeps that owner until
//! the last clone is dropped ([`reclaim`](crate::reclaim) checks). An escape is then a
//! longer-lived owner, never a use after free, as for the cudarc adapter's forgotten views.

use std::sync::{Arc, Mutex, PoisonError};

use cudarc::driver::CudaStream;
use tensorbridge::{Owner, Stream};

use crate::context::{ContextGuard, device, device_of_stream};
use crate::error::Error;
use crate::raw::ensure_driver;
use crate::types::raw_stream;

/// Wrappers that outlived their scope, each with what keeps its stream alive.
static ESCAPED: Mutex<Vec<(Arc<CudaStream>, Owner)>> = Mutex::new(Vec::new());

/// Releases the owners of escaped wrappers whose last clone outside this list is gone.
/// Returns how many are still held.
pub(crate) fn sweep() -> usize {
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
    // Owners drop outside the lock: a Python owner attaches to the interpreter.
    drop(released);
    held
}

/// Runs `f` with `stream`, a stream of device `ordinal`'s primary context that another
/// library owns, as a cudarc stream: cudarc launches, [`handoff`](crate::handoff),
/// [`make_ready_on`](crate::make_ready_on), [`ready_on`](crate::ready_on) and the cudarc
/// adapter's views all take it. Work enqueued on it is ordered with the owner's own work on
/// that stream, as if the owner had enqueued it: that is the point (a kernel on PyTorch's
/// current stream runs after the PyTorch work before it and before the PyTorch work after
/// it, with no event at all).
///
/// - [`Stream::LegacyDefault`] is device `ordinal`'s legacy default stream (cudarc's
///   `default_stream`), [`Stream::PerThreadDefault`] the calling thread's per-thread stream
///   (`f` runs on this thread; a clone used on another thread names that thread's).
/// - A handle must belong to device `ordinal`'s primary context
///   ([`Error::DeviceMismatch`] for another device's, [`Error::ForeignContext`] for a
///   non-primary context's).
/// - `keeper` is what keeps the stream alive (`None` when nothing is needed: a default
///   stream, or a stream its library never destroys, as PyTorch's pool streams). If clones
///   of the wrapper outlive `f` (kept in a struct, in a signal that holds its stream), the
///   keeper is held until the last of them is dropped, so they never name a destroyed
///   stream.
///
/// The calling thread's current context is restored after `f`, whatever cudarc calls inside
/// made current. Without libcuda, [`Error::NoDriver`] before `f` runs.
///
/// # Safety
/// The caller guarantees:
/// 1. `stream` is a live stream (a default stream, or the handle of a stream that has not
///    been destroyed) for the call, and stays live as long as `keeper` is alive (for the
///    life of the process when `keeper` is `None`).
pub unsafe fn with_stream_raw<R>(
    ordinal: u32,
    stream: Stream,
    keeper: Option<Owner>,
    f: impl FnOnce(&Arc<CudaStream>) -> R,
) -> Result<R, Error> {
    ensure_driver()?;
    sweep();
    let _restore = ContextGuard::save()?;
    let dev = device(ordinal)?;
    let wrapped = match stream {
        Stream::LegacyDefault => dev.ctx().default_stream(),
        Stream::PerThreadDefault => dev.ctx().per_thread_stream(),
        Stream::Handle(h) => {
            // SAFETY: the handle is live for the call (obligation 1), not a sentinel.
            let home = unsafe { device_of_stream(h) }?;
            if !Arc::ptr_eq(home.ctx(), dev.ctx()) {
                return Err(Error::DeviceMismatch {
                    tensor: tensorbridge::Device::cuda(ordinal),
                    stream: home.ctx().ordinal(),
                });
            }
            // SAFETY: a live stream of this context (just asked of the driver), kept alive
            // as long as `keeper` is, which outlives every clone of the wrapper: held below
            // until the last one is dropped (obligation 1). Ordering cudarc's work with the
            // owner's is the purpose: both go to the same stream, in program order.
            unsafe { dev.ctx().wrap_borrowed_stream(raw_stream(stream)) }
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
        }
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
    }
}
