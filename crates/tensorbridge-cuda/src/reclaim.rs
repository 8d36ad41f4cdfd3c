//! [`reclaim`]: what the layers below keep and no longer need, released from the calling
//! thread, now.

use crate::context::ContextGuard;
use crate::{capture, release, retire, scope};

/// Releases, from the calling thread and now, what the layer keeps and no longer needs to:
/// the keepers of borrowed streams whose last escaped wrapper is gone ([`with_stream_raw`](crate::with_stream_raw)),
/// the owners of CUDA graphs since destroyed, and retired owners whose work has finished
/// (the reaper threads release those anyway, soon after the work ends; a release one of them
/// has just taken is waited for, up to 20 ms). Returns how many retirements still wait for
/// device work. The calling thread's
/// current context is as it was afterwards, whatever the released owners' drops made current
/// (a cudarc buffer or stream binds its own context to free itself).
///
/// Never blocks on the device. Its event queries use the relaxed capture mode, so a CUDA
/// graph being captured on any thread is not disturbed.
pub fn reclaim() -> usize {
    // Without a driver there is nothing to save (the guard is inert) and nothing was retired.
    let _restore = ContextGuard::save().ok();
    capture::drain_released();
    scope::sweep();
    let pending = retire::sweep();
    // A release the layer's threads took just before (so not found above) finishes first, if
    // it does soon: after this returns, what had completed is released. Bounded, since such a
    // release may wait for something this thread holds (a Python owner, for the GIL).
    release::wait_idle(std::time::Duration::from_millis(20));
    pending
}
