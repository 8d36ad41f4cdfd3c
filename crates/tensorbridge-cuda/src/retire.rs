//! Owners kept until the device is done: [`retire_on`] (and [`retire_all_on`], many owners
//! behind one event) keeps owners alive until the work enqueued on a stream so far has
//! finished, or, on a stream being captured into a CUDA graph, as long as the graph.
//!
//! # The reaper
//! A retired owner is released a bounded time after its work finishes, whatever the program
//! does next (not at its next tensorbridge call): each retirement records a
//! `CU_EVENT_BLOCKING_SYNC` event on its stream and joins that stream's *lane*, a queue in
//! stream order served by one thread started on first use. The thread sleeps in
//! `cuEventSynchronize` on the oldest event of its lane (the driver wakes it: no core is
//! spun), then releases every owner at the front of the lane whose event has completed, and
//! waits for the next; a lane idle for [`LINGER`] ends its thread. One lane per stream, so a
//! slow stream never delays the release of another stream's owners; past [`MAX_LANES`]
//! streams at once, new streams share a lane (releases then wait for the slower stream's
//! work too: late, never early).
//!
//! The threads touch no stream: an event, once recorded, is waited on and queried without
//! its stream, which may be destroyed meanwhile. Owners are dropped with no lock held (a
//! Python owner takes the GIL there, a cudarc buffer calls the driver). [`sweep`] (called by
//! [`reclaim`](crate::reclaim)) releases what has completed at the front of every lane from
//! the calling thread, for callers that want memory back now.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use cudarc::driver::{CudaContext, CudaStream, sys};
use tensorbridge_core::{Owner, Stream};

use crate::capture::{Capture, capture_of, keep_with_graph};
use crate::context::{bind, device, relaxed};
use crate::event::{Event, Kind};
use crate::raw::ensure_driver;
use crate::release::InFlight;
use crate::types::raw_stream;

/// How long a lane's thread waits for new work before it ends.
const LINGER: Duration = Duration::from_secs(2);

/// The most lanes (and so reaper threads) at once.
const MAX_LANES: usize = 16;

/// What one retirement keeps: one owner, or a batch behind one event.
enum Kept {
    One(Owner),
    Many(Vec<Owner>),
}

impl Kept {
    /// Never frees: for memory nothing proves the device is done with.
    fn leak(self) {
        match self {
            Kept::One(o) => std::mem::forget(o),
            Kept::Many(v) => v.into_iter().for_each(std::mem::forget),
        }
    }

    fn is_empty(&self) -> bool {
        matches!(self, Kept::Many(v) if v.is_empty())
    }
}

/// Owners kept until the consumer work enqueued before they were retired has finished.
struct Retired {
    /// Shared with the lane's thread while it waits on it, outside the lock.
    done: Arc<Event>,
    /// Never read: held so that it drops when the consumer work is done.
    _kept: Kept,
}

/// Which lane a stream's retirements join: its context, its handle, and for the per-thread
/// default stream the retiring thread (a different stream on every thread).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct LaneKey {
    ctx: usize,
    stream: usize,
    thread: u64,
}

/// Retirements of one stream, oldest first (the order their events complete in).
struct Lane {
    key: LaneKey,
    queue: VecDeque<Retired>,
    /// Whether a thread serves the lane (false when starting one failed: then only
    /// [`sweep`] releases it).
    served: bool,
}

/// Every lane, and the condition their threads wait on for new retirements.
struct Lanes {
    lanes: Mutex<Vec<Lane>>,
    more: Condvar,
}

static LANES: Lanes = Lanes {
    lanes: Mutex::new(Vec::new()),
    more: Condvar::new(),
};

fn lock() -> MutexGuard<'static, Vec<Lane>> {
    LANES.lanes.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Keeps `owner` alive until the work enqueued on `consumer` so far has finished on the
/// device, then releases it (the reaper, see [`retire_all_on`]). Never blocks the host. If
/// the driver refuses the event, the owner is leaked instead: never freed early.
///
/// On a stream being captured into a CUDA graph, the work does not run now but at every
/// replay: the owner is then kept as long as the graph (and every executable graph made from
/// it) exists, and released after the graph is destroyed.
///
/// For memory a kernel on `consumer` may still be using when its last host-side user lets
/// go (the cudarc adapter's views call it when they drop). Safe: `consumer` is a cudarc
/// stream, live for the call by construction.
pub fn retire_on(consumer: &CudaStream, owner: Owner) {
    // SAFETY: `consumer` is a cudarc stream borrowed for the call, so live; its context is
    // the event's.
    unsafe { retire_at(consumer.context(), consumer.cu_stream(), Kept::One(owner)) }
}

/// Keeps every owner of `owners` alive until the work enqueued on `consumer` so far has
/// finished on the device, behind ONE event (what a kernel call retires: all its arguments'
/// owners, once per call), then releases them.
///
/// The release is a bounded time after the work finishes, not at a later tensorbridge call:
/// a thread per stream with pending owners (started on first use, ended after a while
/// without work) sleeps in `cuEventSynchronize` on a `CU_EVENT_BLOCKING_SYNC` event, never
/// spinning a core, and drops the owners when the driver wakes it. That thread never touches
/// `consumer` (only the event recorded on it now), and holds no lock while an owner drops
/// (a Python owner takes the GIL on that thread). Never blocks the caller. As [`retire_on`]
/// for captures and refused events. An empty `owners` records nothing.
pub fn retire_all_on(consumer: &CudaStream, owners: impl IntoIterator<Item = Owner>) {
    let kept = Kept::Many(owners.into_iter().collect());
    if kept.is_empty() {
        return;
    }
    // SAFETY: as in `retire_on`.
    unsafe { retire_at(consumer.context(), consumer.cu_stream(), kept) }
}

/// [`retire_on`] for a raw stream: keeps `owner` alive until the work enqueued so far on
/// `stream`, a stream of device `ordinal`'s primary context, has finished on the device,
/// then releases it (the reaper, see [`retire_all_on`]). Never blocks the host.
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
    // SAFETY: forwarded obligation 1.
    unsafe { retire_raw(ordinal, stream, Kept::One(owner)) }
}

/// [`retire_all_on`] for a raw stream: every owner of `owners` behind one event, as
/// [`retire_on_raw`].
///
/// # Safety
/// As [`retire_on_raw`].
pub unsafe fn retire_all_on_raw(
    ordinal: u32,
    stream: Stream,
    owners: impl IntoIterator<Item = Owner>,
) {
    let kept = Kept::Many(owners.into_iter().collect());
    if kept.is_empty() {
        return;
    }
    // SAFETY: forwarded obligation 1.
    unsafe { retire_raw(ordinal, stream, kept) }
}

/// The body of the `_raw` forms.
///
/// # Safety
/// As [`retire_on_raw`].
unsafe fn retire_raw(ordinal: u32, stream: Stream, kept: Kept) {
    // Without libcuda, or a driver that cannot start, no device work can be pending.
    if ensure_driver().is_err() {
        drop(kept);
        return;
    }
    match device(ordinal) {
        // SAFETY: `stream` is live for the call (our caller's obligation 1), of the device's
        // primary context.
        Ok(dev) => unsafe { retire_at(dev.ctx(), raw_stream(stream), kept) },
        // Nothing proves the device is done with the memory: keep it forever.
        Err(_) => kept.leak(),
    }
}

/// The body of every retirement.
///
/// # Safety
/// The caller guarantees:
/// 1. `stream` is a live stream of `ctx` (or one of its default streams) for the call.
unsafe fn retire_at(ctx: &Arc<CudaContext>, stream: sys::CUstream, kept: Kept) {
    let Ok(_bound) = bind(ctx) else {
        kept.leak();
        return;
    };
    // SAFETY: `stream` is live (obligation 1) and its context current.
    match unsafe { capture_of(stream) } {
        Ok(Capture::Active(active)) => {
            keep_with_graph(active, Box::new(kept));
            return;
        }
        Ok(Capture::None) => {}
        // Nothing can be recorded (an invalidated capture, the legacy stream during one) or
        // known: keep the owners forever rather than free early.
        _ => {
            kept.leak();
            return;
        }
    }
    let recorded = Event::in_context_kind(ctx, Kind::BlockingSync).and_then(|done| {
        // SAFETY: `stream` is live for the call (obligation 1); the event is in its context.
        unsafe { done.record(stream) }?;
        Ok(done)
    });
    match recorded {
        Ok(done) => {
            let key = LaneKey {
                ctx: ctx.cu_ctx() as usize,
                stream: stream as usize,
                thread: if stream as usize == 2 {
                    thread_key()
                } else {
                    0
                },
            };
            enqueue(
                key,
                Retired {
                    done: Arc::new(done),
                    _kept: kept,
                },
            );
        }
        // Nothing proves the consumer is done with the memory: keep it forever.
        Err(_) => kept.leak(),
    }
}

/// A number for the calling thread, for the per-thread default stream's lanes.
fn thread_key() -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    std::thread::current().id().hash(&mut h);
    h.finish() | 1
}

/// Adds a retirement to its stream's lane, starting the lane's thread if none serves it.
fn enqueue(key: LaneKey, retired: Retired) {
    let mut lanes = lock();
    let at = match lanes.iter().position(|l| l.key == key) {
        Some(at) => at,
        None if lanes.len() < MAX_LANES => {
            lanes.push(Lane {
                key,
                queue: VecDeque::new(),
                served: false,
            });
            lanes.len() - 1
        }
        // Too many streams at once: share a lane (released late, never early).
        None => (key.stream ^ key.ctx) % lanes.len(),
    };
    let lane = &mut lanes[at];
    lane.queue.push_back(retired);
    if lane.served {
        drop(lanes);
        LANES.more.notify_all();
        return;
    }
    let key = lane.key;
    let started = std::thread::Builder::new()
        .name("tensorbridge-reaper".into())
        .spawn(move || serve(key))
        .is_ok();
    // Not started (the system refuses threads): `sweep` releases the lane instead.
    lane.served = started;
}

/// A lane's thread: waits (asleep) for the oldest event of its lane, releases what has
/// completed at the front, and ends after [`LINGER`] without work.
fn serve(key: LaneKey) {
    loop {
        let oldest = {
            let mut lanes = lock();
            loop {
                let Some(at) = lanes.iter().position(|l| l.key == key) else {
                    return;
                };
                if let Some(front) = lanes[at].queue.front() {
                    break front.done.clone();
                }
                let (again, waited) = LANES
                    .more
                    .wait_timeout(lanes, LINGER)
                    .unwrap_or_else(PoisonError::into_inner);
                lanes = again;
                if waited.timed_out()
                    && let Some(at) = lanes.iter().position(|l| l.key == key)
                    && lanes[at].queue.is_empty()
                {
                    lanes.swap_remove(at);
                    return;
                }
            }
        };
        // No lock held: the wait may be long. An event recorded outside a capture may be
        // waited on (relaxed mode, by `Event::synchronize`) whatever other threads capture.
        let waited = oldest.synchronize();
        let (released, _in_flight) = {
            let mut lanes = lock();
            let Some(at) = lanes.iter().position(|l| l.key == key) else {
                return;
            };
            let released = pop_complete(&mut lanes[at]);
            // Counted before the lock goes: a `sweep` that finds the lane empty after this
            // waits for these drops.
            let in_flight = InFlight::start();
            let still_first = lanes[at]
                .queue
                .front()
                .is_some_and(|f| Arc::ptr_eq(&f.done, &oldest));
            if waited.is_err() && still_first {
                // The driver cannot wait on this event (a broken context): nothing proves
                // the work finished, so its owners are kept forever, and the lane moves on.
                if let Some(stuck) = lanes[at].queue.pop_front() {
                    stuck._kept.leak();
                }
            }
            (released, in_flight)
        };
        drop(oldest);
        // Owners drop outside the lock: a Python owner takes the GIL, a cudarc buffer binds
        // its context to free itself.
        drop(released);
    }
}

/// Takes the retirements at the front of `lane` whose events have completed (an error
/// proves nothing finished: kept).
fn pop_complete(lane: &mut Lane) -> Vec<Retired> {
    let mut done = Vec::new();
    relaxed(|| {
        while let Some(front) = lane.queue.front() {
            if !matches!(front.done.is_complete(), Ok(true)) {
                break;
            }
            done.extend(lane.queue.pop_front());
        }
    });
    done
}

/// Releases, from the calling thread, the owners at the front of every lane whose work has
/// finished; returns how many retirements still wait. Never blocks on the device; its event
/// queries use the relaxed capture mode.
pub(crate) fn sweep() -> usize {
    let (done, pending) = {
        let mut lanes = lock();
        if lanes.iter().all(|l| l.queue.is_empty()) {
            return 0;
        }
        let mut done = Vec::new();
        for lane in lanes.iter_mut() {
            done.extend(pop_complete(lane));
        }
        (done, lanes.iter().map(|l| l.queue.len()).sum())
    };
    // Owners drop outside the lock (see `serve`).
    drop(done);
    pending
}
