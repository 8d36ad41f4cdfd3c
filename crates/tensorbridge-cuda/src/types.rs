//! The layer's plain values, below everything else: what the driver says memory is
//! ([`MemoryType`]), what a stream is doing with respect to graph capture
//! ([`CaptureStatus`]), a GPU's name across processes ([`DeviceUuid`]), and the one
//! conversion between raw stream handles and the core's [`Stream`]. No driver call here.

use std::fmt;

use cudarc::driver::{CudaStream, sys};
use tensorbridge_core::{Stream, StreamHandle};

/// The kind of memory behind an address, as the driver reports it.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MemoryType {
    /// Page-locked host memory the driver knows (`cuMemHostAlloc`, `cuMemHostRegister`).
    Host,
    /// Device memory (`cuMemAlloc`, stream-ordered pools, VMM mappings).
    Device,
    /// Managed (unified) memory (`cuMemAllocManaged`).
    Managed,
    /// A CUDA array (not addressable by kernels as a pointer).
    Array,
}

impl fmt::Display for MemoryType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MemoryType::Host => "pinned host",
            MemoryType::Device => "device",
            MemoryType::Managed => "managed",
            MemoryType::Array => "array",
        })
    }
}

/// What a stream is doing with respect to graph capture.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CaptureStatus {
    /// Not being captured: work runs.
    None,
    /// Being captured into a graph; `id` is unique per capture sequence in the process.
    Active {
        /// The capture sequence's id (`cuStreamGetCaptureInfo`).
        id: u64,
    },
    /// Its capture was invalidated by an illegal call; ending it will fail.
    Invalidated,
    /// The legacy default stream while a stream that synchronises with it is being captured:
    /// any work on it would invalidate that capture.
    Implicit,
}

impl fmt::Display for CaptureStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CaptureStatus::None => f.write_str("not being captured"),
            CaptureStatus::Active { id } => {
                write!(f, "being captured into a CUDA graph (capture {id})")
            }
            CaptureStatus::Invalidated => f.write_str("in an invalidated CUDA graph capture"),
            CaptureStatus::Implicit => {
                f.write_str("the legacy default stream during a CUDA graph capture")
            }
        }
    }
}

/// A GPU's UUID, as the driver reports it (`cuDeviceGetUuid_v2`): what names a GPU across
/// processes, whose ordinals differ (`CUDA_VISIBLE_DEVICES`). Prints as `nvidia-smi -L` does:
/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
// Named publicly as `ipc::DeviceUuid`; elsewhere only the field of an `ipc` error.
#[cfg_attr(not(target_os = "linux"), allow(unreachable_pub))]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeviceUuid(pub [u8; 16]);

impl fmt::Display for DeviceUuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("GPU-")?;
        for (i, b) in self.0.iter().enumerate() {
            if matches!(i, 4 | 6 | 8 | 10) {
                f.write_str("-")?;
            }
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for DeviceUuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// The core's name for a raw CUDA stream handle: null (the driver API's legacy default
/// stream, since cudarc calls the non-`_ptsz` entry points) and `0x1` are
/// [`Stream::LegacyDefault`], `0x2` is [`Stream::PerThreadDefault`].
///
/// Safe: a [`Stream`] is only a value, like a raw pointer; trusting it (attaching it to a
/// tensor, handing it to the driver) is `unsafe`.
pub fn stream_from_raw(raw: sys::CUstream) -> Stream {
    match raw as usize {
        0 | 1 => Stream::LegacyDefault,
        2 => Stream::PerThreadDefault,
        // `StreamHandle::new` accepts every value above 2.
        h => StreamHandle::new(h).map_or(Stream::LegacyDefault, Stream::Handle),
    }
}

/// The core's name for a cudarc stream (see [`stream_from_raw`]).
pub fn stream_of(stream: &CudaStream) -> Stream {
    stream_from_raw(stream.cu_stream())
}

/// The handle to give the driver for a core stream: `CU_STREAM_LEGACY` (`0x1`),
/// `CU_STREAM_PER_THREAD` (`0x2`) or the handle itself.
///
/// Safe: it only converts a number. Handing the result to the driver is what needs the
/// stream to be live.
pub fn raw_stream(stream: Stream) -> sys::CUstream {
    std::ptr::without_provenance_mut(stream.cuda_handle())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_handles_map_to_core_streams() {
        assert_eq!(stream_from_raw(std::ptr::null_mut()), Stream::LegacyDefault);
        assert_eq!(
            stream_from_raw(std::ptr::without_provenance_mut(1)),
            Stream::LegacyDefault
        );
        assert_eq!(
            stream_from_raw(std::ptr::without_provenance_mut(2)),
            Stream::PerThreadDefault
        );
        let h = stream_from_raw(std::ptr::without_provenance_mut(0x7f00_1000));
        assert_eq!(h.cuda_handle(), 0x7f00_1000);
        for s in [Stream::LegacyDefault, Stream::PerThreadDefault, h] {
            assert_eq!(stream_from_raw(raw_stream(s)), s);
        }
    }
}
