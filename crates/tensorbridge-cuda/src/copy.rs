//! Copies the driver makes for the layers above: device memory of this crate's own
//! ([`DeviceBuffer`]), and the bytes of a tensor's memory copied out, ordered after the
//! tensor's readiness on the GPU. What to copy (which bytes, into what layout) is the
//! caller's business; the driver calls are here.

use std::fmt;
use std::sync::Arc;

use cudarc::driver::sys;
use tensorbridge_core::{DeviceType, Stream, TensorRef};

use crate::context::{ContextGuard, DeviceCtx, bind, device};
use crate::error::Error;
use crate::handoff::make_ready_on_raw;
use crate::raw;
use crate::types::raw_stream;

/// `len` bytes of device memory on one device (`cuMemAlloc` in its primary context), freed
/// (`cuMemFree`, which first waits for work still using it) when dropped. A tensor's owner
/// for memory this crate allocated.
pub struct DeviceBuffer {
    ptr: sys::CUdeviceptr,
    len: usize,
    dev: Arc<DeviceCtx>,
    ordinal: u32,
}

impl DeviceBuffer {
    /// `len` bytes of uninitialised device memory on device `ordinal`; none (address 0) for
    /// `len == 0`. [`Error::Driver`] naming `cuMemAlloc` with `CUDA_ERROR_OUT_OF_MEMORY` when
    /// the device has no room; [`Error::NoDriver`] without libcuda. The caller's current
    /// context is left as it was.
    pub fn alloc(ordinal: u32, len: usize) -> Result<DeviceBuffer, Error> {
        let dev = device(ordinal)?;
        let ptr = if len == 0 {
            0
        } else {
            let _bound = bind(dev.ctx())?;
            // SAFETY: libcuda is loaded (`device` checked); the device's context is current.
            unsafe { raw::mem::alloc(len) }?
        };
        Ok(DeviceBuffer {
            ptr,
            len,
            dev,
            ordinal,
        })
    }

    /// The first byte's address (0 when empty).
    pub fn addr(&self) -> usize {
        self.ptr as usize
    }

    /// The size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no byte.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device it is on.
    pub fn ordinal(&self) -> u32 {
        self.ordinal
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if self.ptr == 0 {
            return;
        }
        // Errors leave nothing to undo: the memory is then leaked.
        if let Ok(_bound) = bind(self.dev.ctx()) {
            // SAFETY: libcuda is loaded (the buffer exists); `ptr` came from `cuMemAlloc` in
            // this device's primary context (now current) and is freed once, here.
            let _ = unsafe { raw::mem::free(self.ptr) };
        }
    }
}

impl fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("addr", &format_args!("{:#x}", self.ptr))
            .field("len", &self.len)
            .field("ordinal", &self.ordinal)
            .finish()
    }
}

/// The device whose primary context serves a tensor's memory (DLPack gives managed and
/// pinned memory ordinal 0).
fn ordinal_of(tensor: &TensorRef<'_>) -> u32 {
    match tensor.device().kind {
        DeviceType::Cuda => tensor.device().ordinal,
        _ => 0,
    }
}

/// Copies `len` bytes of `tensor`'s memory, from address `from`, to host memory at `to`: on
/// the legacy default stream after it waits (on the GPU) for the tensor's readiness, then
/// the host waits for the copy. For device, managed and pinned memory. The caller's current
/// context is left as it was.
///
/// # Safety
/// The caller guarantees:
/// 1. `[from, from + len)` lies inside the tensor's span (memory its borrow keeps valid);
/// 2. `to` is valid for writes of `len` bytes and overlaps no byte of the source.
pub unsafe fn to_host<'t>(
    tensor: impl Into<TensorRef<'t>>,
    from: usize,
    to: *mut u8,
    len: usize,
) -> Result<(), Error> {
    let tensor = tensor.into();
    if len == 0 {
        return Ok(());
    }
    let legacy = Stream::LegacyDefault;
    // SAFETY: the legacy default stream is always a live stream.
    unsafe { make_ready_on_raw(tensor, legacy) }?;
    let _keep = ContextGuard::save()?;
    let dev = device(ordinal_of(&tensor))?;
    let _bound = bind(dev.ctx())?;
    // SAFETY: libcuda is loaded (`device` checked); the context is current; the legacy
    // default stream is live; the source bytes lie in the tensor's memory, kept valid by its
    // borrow (obligation 1), the destination is writable and disjoint (obligation 2), and
    // the host waits for the copy below, before either can go.
    unsafe { raw::mem::memcpy_async(to.expose_provenance(), from, len, raw_stream(legacy)) }?;
    // SAFETY: as above.
    unsafe { raw::stream::synchronize(raw_stream(legacy)) }
}

/// Copies `dst.len()` bytes of `tensor`'s device memory, from address `from`, into `dst`:
/// enqueued on `stream` (a stream of `dst`'s device) after it waits (on the GPU) for the
/// tensor's readiness; with `wait`, the host then waits for the copy. Never blocks the host
/// otherwise. The caller's current context is left as it was.
///
/// # Safety
/// The caller guarantees:
/// 1. `[from, from + dst.len())` lies inside the tensor's span (memory its borrow keeps
///    valid, and that the tensor's owner keeps valid until the copy has run: hold the owner
///    with `dst` when `wait` is false);
/// 2. `stream` is a live stream of `dst`'s device's primary context (or a default stream)
///    for the call.
pub unsafe fn on_device<'t>(
    tensor: impl Into<TensorRef<'t>>,
    from: usize,
    dst: &DeviceBuffer,
    stream: Stream,
    wait: bool,
) -> Result<(), Error> {
    let tensor = tensor.into();
    // SAFETY: `stream` is live for the call (obligation 2).
    unsafe { make_ready_on_raw(tensor, stream) }?;
    if dst.is_empty() {
        return Ok(());
    }
    let _keep = ContextGuard::save()?;
    let _bound = bind(dst.dev.ctx())?;
    let raw = raw_stream(stream);
    // SAFETY: libcuda is loaded (the buffer exists); its context is current; `stream` is a
    // live stream of it (obligation 2); the source bytes are valid device memory until the
    // copy has run (obligation 1); the destination is `dst`'s own allocation of that many
    // bytes, alive for the call (the caller holds it after); the copy is ordered after the
    // tensor's producer by the wait enqueued on the same stream above.
    unsafe { raw::mem::memcpy_async(dst.addr(), from, dst.len(), raw) }?;
    if wait {
        // SAFETY: as above.
        unsafe { raw::stream::synchronize(raw) }?;
    }
    Ok(())
}
