//! The copies `__dlpack__(copy=True)` and `__dlpack__(dl_device=(1, 0))` ask for.
//!
//! Host copies are compact, in C order, so every consumer takes them (negative strides
//! abort torch 2.11's `from_dlpack`). Device copies take the bytes the source's strides
//! reach, `[lowest, highest)`, verbatim into new device memory and keep the source's strides
//! (element 0 at the same distance from the buffer's start): compacting would need a kernel.
//! Either is writable and owned by nobody else (`IS_COPIED`).
//!
//! Only the layout logic is here: the driver calls (allocation, the ordered copies, the host
//! wait, the context binding) are the CUDA layer's (`tensorbridge_cuda::copy`).

use std::sync::Arc;

use pyo3::prelude::*;
use tensorbridge_core::{Access, Descriptor, Device, DeviceType, Stream, StreamRequest, Tensor};
use tensorbridge_cuda::copy::DeviceBuffer;

use crate::error::{Error, Result};

/// The descriptor of a copy that keeps the source's layout: element 0 at the same distance
/// from the start of a buffer at `base` that holds the source's span.
fn describe_span(src: &Tensor, base: usize, device: Device) -> Result<Descriptor> {
    let span = src.byte_span();
    let first = if src.numel() == 0 {
        base
    } else {
        base + (src.data_ptr() - span.start)
    };
    Ok(Descriptor::new(
        first,
        device,
        src.dtype(),
        src.packing(),
        src.layout().with_byte_offset(0),
        Access::ReadWrite,
    )?)
}

/// The most a copy may exceed the bytes its source spans: a copy larger than
/// [`MAX_BLOWUP`] times the span AND larger than [`BLOWUP_FLOOR`] is refused before anything
/// is allocated. Only broadcast views (zero strides) copy to more than they span: one
/// element broadcast to a 16 TiB shape spans 4 bytes, and allocating its copy would take
/// the machine's memory (or abort the process, which an infallible allocation does).
const MAX_BLOWUP: u64 = 16;
/// Copies up to this size are always attempted (1 GiB): small broadcasts copy as asked.
const BLOWUP_FLOOR: u64 = 1 << 30;

/// Refuses a compact copy of `src` that would be far larger than the memory `src` spans
/// (see [`MAX_BLOWUP`]).
fn refuse_blowup(src: &Tensor, bytes: u64) -> Result<()> {
    let span = src.byte_span().len() as u64;
    if bytes > BLOWUP_FLOOR && bytes / MAX_BLOWUP > span {
        return Err(Error::CopyTooLarge {
            bytes,
            span,
            device: src.device(),
        });
    }
    Ok(())
}

/// A host buffer of `len` bytes, 8-byte aligned (enough for every dtype), as a tensor
/// owner and its address. Fallible: an allocation the system refuses is
/// [`Error::OutOfMemory`], never an abort.
fn host_buffer(len: usize) -> Result<(tensorbridge_core::Owner, usize)> {
    let oom = || Error::OutOfMemory {
        bytes: len as u64,
        device: Device::CPU,
    };
    let words = len.div_ceil(8).max(1);
    let count = i64::try_from(words).map_err(|_| oom())?;
    // Above `isize::MAX` bytes there is no layout; otherwise the allocator's answer. Zeroed
    // by the allocator (`calloc`: fresh pages are not touched twice), as `vec![0; n]` does,
    // but without its abort on failure.
    let layout = std::alloc::Layout::array::<u64>(words).map_err(|_| oom())?;
    // SAFETY: `layout` has a non-zero size (`words >= 1`).
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<u64>();
    if ptr.is_null() {
        return Err(oom());
    }
    // SAFETY: `ptr` comes from the global allocator with the layout of `[u64; words]`, so
    // capacity `words` matches; all `words` elements are initialised (zero is a valid `u64`).
    let zeros = unsafe { Vec::from_raw_parts(ptr, words, words) };
    let buffer = Tensor::from_vec(zeros, &[count])?;
    Ok((buffer.owner().clone(), buffer.data_ptr()))
}

/// Copies the elements of a layout whose element 0 is at `first` into `dst`, compact and in C
/// order, `itemsize` bytes each.
///
/// # Safety
/// 1. Every element the layout reaches from `first` is `itemsize` readable bytes.
/// 2. `dst` is writable for `numel * itemsize` bytes and overlaps none of them.
unsafe fn gather(first: usize, shape: &[i64], byte_strides: &[i64], itemsize: usize, dst: usize) {
    let numel: i64 = shape.iter().product();
    if numel == 0 {
        return;
    }
    let mut index = vec![0i64; shape.len()];
    let mut offset = 0i64;
    let mut out = dst;
    for _ in 0..numel {
        // SAFETY: `first + offset` is an element the layout reaches (obligation 1); `out` is
        // within the `numel * itemsize` writable bytes (obligation 2); no overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(
                std::ptr::with_exposed_provenance::<u8>(first.wrapping_add_signed(offset as isize)),
                std::ptr::with_exposed_provenance_mut::<u8>(out),
                itemsize,
            );
        }
        out += itemsize;
        // The next index in C order (an odometer), keeping `offset` in step.
        for d in (0..shape.len()).rev() {
            index[d] += 1;
            offset += byte_strides[d];
            if index[d] < shape[d] {
                break;
            }
            offset -= byte_strides[d] * shape[d];
            index[d] = 0;
        }
    }
}

/// A compact (C order) copy into host memory of a CPU, pinned, managed or CUDA device tensor,
/// so that every consumer takes it (no negative or zero strides, no gaps). Device sources
/// are copied on the legacy default stream after it waits (on the GPU) for the source's
/// readiness, and the host then waits for the copy: the protocol asks the producer to
/// synchronise for `dl_device=(1, 0)`. The GIL is released meanwhile.
pub(crate) fn to_host(py: Python<'_>, src: &Tensor) -> Result<Tensor> {
    let kind = src.device().kind;
    if kind != DeviceType::Cpu && !kind.is_cuda_accessible() {
        return Err(Error::CannotCopy {
            device: src.device(),
        });
    }
    let contiguous = src.layout().is_c_contiguous();
    if !contiguous
        && src.dtype().is_subbyte()
        && src.packing() == tensorbridge_core::Packing::Packed
    {
        return Err(Error::CannotCopy {
            device: src.device(),
        });
    }
    refuse_blowup(src, src.nbytes())?;
    let len = usize::try_from(src.nbytes()).map_err(|_| Error::OutOfMemory {
        bytes: src.nbytes(),
        device: Device::CPU,
    })?;
    let (owner, base) = host_buffer(len)?;
    let span = src.byte_span();
    // Where the source's elements can be read on the host (element 0's address): the source
    // itself, or a staging copy of its span from device memory; `None` when the span was
    // already copied into the result (a contiguous device tensor).
    let mut _staging = None;
    let readable = if kind == DeviceType::Cpu || span.is_empty() {
        Some(src.data_ptr())
    } else if contiguous {
        device_to_host(py, src, span.start, base, len)?;
        None
    } else {
        let (staging, at) = host_buffer(span.len())?;
        device_to_host(py, src, span.start, at, span.len())?;
        _staging = Some(staging);
        Some(at + (src.data_ptr() - span.start))
    };
    if let Some(first) = readable
        && len > 0
    {
        let shape = src.shape().to_vec();
        let strides = src.strides_bytes()?;
        let itemsize = src.dtype().storage_bits(src.packing()).div_ceil(8) as usize;
        crate::ffi::exit::detach(py, || {
            if contiguous {
                // SAFETY: the compact elements are the `len` bytes at `first` (readable host
                // memory: the source, kept by `src`); the result is a fresh buffer of at
                // least `len` bytes.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        std::ptr::with_exposed_provenance::<u8>(first),
                        std::ptr::with_exposed_provenance_mut::<u8>(base),
                        len,
                    );
                }
            } else {
                // SAFETY: every element the layout reaches from `first` lies in readable host
                // memory (the source's validated span, or the staging copy of it, alive until
                // the end of this function); the result holds `numel * itemsize` = `len`
                // bytes and is fresh.
                unsafe { gather(first, &shape, &strides, itemsize, base) };
            }
        });
    }
    let desc = Descriptor::new(
        base,
        Device::CPU,
        src.dtype(),
        src.packing(),
        tensorbridge_core::Layout::row_major(src.shape())?,
        Access::ReadWrite,
    )?;
    // SAFETY: `owner` keeps the host buffer (holding the compact elements, written above)
    // alive and writable; nothing else references it.
    Ok(unsafe { Tensor::from_descriptor(desc, owner) })
}

/// Copies `len` bytes of device-accessible memory at `from` (inside `src`'s span) to host
/// memory at `to`, ordered after `src`'s readiness, and waits for the copy (the GIL released).
fn device_to_host(py: Python<'_>, src: &Tensor, from: usize, to: usize, len: usize) -> Result<()> {
    crate::ffi::exit::detach(py, || {
        // SAFETY: `from..from+len` lies in the source's span (the callers pass its span or
        // the whole of it), kept alive by `src`; `to` is a fresh host buffer of at least
        // `len` bytes, disjoint from the source.
        unsafe {
            tensorbridge_cuda::copy::to_host(
                src,
                from,
                std::ptr::with_exposed_provenance_mut(to),
                len,
            )
        }
    })?;
    Ok(())
}

/// A copy of a CUDA device tensor into new device memory on the same device, enqueued on the
/// consumer's stream after it waits (on the GPU) for the source's readiness; for
/// [`StreamRequest::NoSync`] the copy runs on the legacy default stream and the host waits
/// for it. Never blocks the host otherwise.
///
/// # Safety
/// 1. A [`StreamRequest::Stream`] names a live stream of the tensor's device's primary
///    context for the duration of the call.
pub(crate) unsafe fn on_device(
    py: Python<'_>,
    src: &Tensor,
    consumer: StreamRequest,
) -> Result<Tensor> {
    let device = src.device();
    if device.kind != DeviceType::Cuda {
        return Err(Error::CannotCopy { device });
    }
    crate::export::refuse_negative_strides(src)?;
    let span = src.byte_span();
    let len = span.len();
    let (stream, wait) = match consumer {
        StreamRequest::Stream(s) => (s, false),
        StreamRequest::NoSync => (Stream::LegacyDefault, true),
    };
    let buffer = match DeviceBuffer::alloc(device.ordinal, len) {
        Err(tensorbridge_cuda::Error::Driver {
            result: cudarc::driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY,
            ..
        }) => {
            return Err(Error::OutOfMemory {
                bytes: len as u64,
                device,
            });
        }
        other => other?,
    };
    let base = buffer.addr();
    crate::ffi::exit::detach(py, || {
        // SAFETY: the span is the source's own, device memory kept alive by `src` for the call
        // and, past it, by the retirement below until the copy has run; `stream` is live for
        // the call (obligation 1, or the legacy default stream).
        unsafe { tensorbridge_cuda::copy::on_device(src, span.start, &buffer, stream, wait) }
    })?;
    if !wait && len > 0 {
        // The copy runs on the consumer's stream after this returns: the source's memory must
        // outlive it, whoever drops the source meanwhile.
        // SAFETY: `stream` is live for the call (obligation 1), of the device's primary
        // context.
        unsafe { tensorbridge_cuda::retire_on_raw(device.ordinal, stream, src.owner().clone()) };
    }
    let desc = describe_span(src, base, device)?;
    // SAFETY: `buffer` keeps the allocation (holding the span, being written on the
    // consumer's stream, which is where the consumer reads it) alive until the copy's last
    // user drops it (`cuMemFree` then waits for work still using it); nothing else
    // references it.
    Ok(unsafe { Tensor::from_descriptor(desc, Arc::new(buffer)) })
}

/// A copy of a host tensor into new host memory.
pub(crate) fn host_to_host(py: Python<'_>, src: &Tensor) -> Result<Tensor> {
    if src.device().kind != DeviceType::Cpu {
        return Err(Error::CannotCopy {
            device: src.device(),
        });
    }
    to_host(py, src)
}

#[cfg(test)]
mod tests {
    use tensorbridge_core::{DType, RawTensor};

    use super::*;

    /// One float32 broadcast to `shape` (all strides zero).
    fn broadcast(shape: &[i64]) -> Tensor {
        let one = Tensor::from_vec(vec![1.0f32], &[1]).unwrap();
        let strides = vec![0; shape.len()];
        let desc = RawTensor {
            strides: Some(&strides),
            ..RawTensor::host(one.data_ptr(), DType::FLOAT32, shape)
        }
        .validate()
        .unwrap();
        // SAFETY: every element is the one float `one`'s owner keeps alive.
        unsafe { Tensor::from_descriptor(desc, one.owner().clone()) }
    }

    #[test]
    fn copies_far_larger_than_their_span_are_refused() {
        let huge = broadcast(&[1 << 21, 1 << 21]);
        assert!(matches!(
            refuse_blowup(&huge, huge.nbytes()),
            Err(Error::CopyTooLarge { bytes, span: 4, .. }) if bytes == 1 << 44
        ));
        // Under 1 GiB: made, however broadcast.
        let small = broadcast(&[1 << 10, 1 << 10]);
        assert!(refuse_blowup(&small, small.nbytes()).is_ok());
    }

    #[test]
    fn host_buffers_no_allocator_serves_are_out_of_memory() {
        for len in [usize::MAX, isize::MAX as usize] {
            assert!(matches!(
                host_buffer(len),
                Err(Error::OutOfMemory { device, .. }) if device == Device::CPU
            ));
        }
        let (owner, addr) = host_buffer(24).unwrap();
        assert!(addr % 8 == 0);
        drop(owner);
    }
}
