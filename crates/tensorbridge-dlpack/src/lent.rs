//! The read-only memory this crate has lent out and not yet had back: the span of every live
//! export of a read-only tensor. A DLPack consumer may drop the `READ_ONLY` flag and hand the
//! memory on (tvm-ffi's tensors keep no flags, and give our export back through their own
//! managed tensor); an import of a foreign managed tensor that overlaps one of these spans
//! comes back read-only, so a round trip never widens access. Nothing is slower while no
//! read-only export is alive (one atomic load per import).

use std::ops::Range;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use tensorbridge_core::{Descriptor, Device};

/// How many spans are registered (read without the lock).
static LIVE: AtomicUsize = AtomicUsize::new(0);
/// The spans, each with its token.
static SPANS: Mutex<Vec<(u64, Device, Range<usize>)>> = Mutex::new(Vec::new());
/// The next token.
static NEXT: AtomicU64 = AtomicU64::new(1);

/// Registers the span of a read-only export; `None` when there is nothing to register (a
/// writable tensor, an empty one, or memory without addresses). The token unregisters it.
pub(crate) fn register(desc: &Descriptor) -> Option<u64> {
    if !desc.is_readonly() || desc.numel() == 0 || !desc.device().kind.has_addresses() {
        return None;
    }
    let token = NEXT.fetch_add(1, Ordering::Relaxed);
    let mut spans = SPANS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    spans.push((token, desc.device(), desc.byte_span()));
    LIVE.store(spans.len(), Ordering::Release);
    Some(token)
}

/// Unregisters a span [`register`] returned.
pub(crate) fn unregister(token: u64) {
    let mut spans = SPANS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(i) = spans.iter().position(|(t, _, _)| *t == token) {
        spans.swap_remove(i);
    }
    LIVE.store(spans.len(), Ordering::Release);
}

/// Whether `desc` overlaps memory lent read-only (same device, a byte in common).
pub(crate) fn overlaps_readonly(desc: &Descriptor) -> bool {
    if LIVE.load(Ordering::Acquire) == 0 || desc.numel() == 0 {
        return false;
    }
    let span = desc.byte_span();
    let spans = SPANS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    spans.iter().any(|(_, device, lent)| {
        *device == desc.device() && lent.start < span.end && span.start < lent.end
    })
}
