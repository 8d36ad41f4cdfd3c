//! Owners kept until the device is done: [`retire_on`] keeps an owner alive until the work
//! enqueued on a stream so far has finished (an event recorded now), or, on a stream being
//! captured into a CUDA graph, as long as the graph.

use std::sync::{Arc, Mutex, PoisonError};

use cudarc::driver::{CudaContext, CudaStream, sys};
use tensorbridge::{Owner, Stream};

use crate::capture::{Capture, capture_of, keep_with_graph};
use crate::context::{bind, device, relaxed};
use crate::event::Event;
use crate::raw::ensure_driver;
use crate::types::raw_stream;

/// An owner kept alive until the consumer work enqueued before its view was dropped has
/// finished on the device.
struct Retired {
    done: Event,
    /// Never read: held so that it drops when the consumer work is done.
    _owner: Owner,
}

/// Owners waiting for consumer work; see [`reclaim`](crate::reclaim).
static RETIRED: Mutex<Vec<Retired>> = Mutex::new(Vec::new());

/// Keeps `owner` alive until the work enqueued on `consumer` so far has finished on the
/// device; [`reclaim`](crate::reclaim) releases it then. Never blocks the host. If the driver refuses the
/// event, the owner is leaked instead: never freed early.
///
/// On a stream being captured into a CUDA graph, the work does not run now but at every
/// replay: the owner is then kept as long as the graph (and every executable graph made from
/// it) exists, and released by [`reclaim`](crate::reclaim) after the graph is destroyed.
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
/// [`reclaim`](crate::reclaim) releases it then.
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
    // Without libcuda, or a driver that cannot start, no device work can be pending.
    if ensure_driver().is_err() {
        drop(owner);
        return;
    }
    match device(ordinal) {
        // SAFETY: `stream` is live for the call (our caller's obligation 1), of the device's
        // primary context.
        Ok(dev) => unsafe { retire_at(dev.ctx(), raw_stream(stream), owner) },
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

/// Releases the owners whose consumer work has finished; returns how many still wait. Never
/// blocks on the device; its event queries use the relaxed capture mode.
pub(crate) fn sweep() -> usize {
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
