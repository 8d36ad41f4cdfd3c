//! Releases in flight on the layer's own threads (the reaper's lanes, the graph dropper):
//! counted while an owner is being dropped there, so that [`reclaim`](crate::reclaim), which
//! promises that what has completed is released when it returns, can wait (a bounded time)
//! for a release another thread took a moment before. No driver call here.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);
static LOCK: Mutex<()> = Mutex::new(());
static DONE: Condvar = Condvar::new();

/// One release in flight, from its take (made while the lock that guarded the taken objects
/// is still held, so anyone who looks after that lock sees it) to its drop.
pub(crate) struct InFlight(());

impl InFlight {
    /// Counts a release in flight until the value is dropped (after the owners it covers).
    pub(crate) fn start() -> InFlight {
        IN_FLIGHT.fetch_add(1, Ordering::AcqRel);
        InFlight(())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        IN_FLIGHT.fetch_sub(1, Ordering::AcqRel);
        let _guard = LOCK.lock().unwrap_or_else(PoisonError::into_inner);
        DONE.notify_all();
    }
}

/// Waits, at most `limit`, until no release is in flight. Bounded: a release on another
/// thread may wait for something the caller holds (a Python owner for the GIL).
pub(crate) fn wait_idle(limit: Duration) {
    if IN_FLIGHT.load(Ordering::Acquire) == 0 {
        return;
    }
    let deadline = Instant::now() + limit;
    let mut guard = LOCK.lock().unwrap_or_else(PoisonError::into_inner);
    while IN_FLIGHT.load(Ordering::Acquire) > 0 {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        guard = DONE
            .wait_timeout(guard, left)
            .unwrap_or_else(PoisonError::into_inner)
            .0;
    }
}
