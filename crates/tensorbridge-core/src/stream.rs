//! Streams and readiness: where a tensor's data becomes ready, and the integer conventions of
//! DLPack and the CUDA Array Interface in one place.
//!
//! The core knows no CUDA. It records *where* data becomes ready ([`Ready`]); a CUDA-aware
//! adapter (tensorbridge-cudarc) turns that into GPU-side ordering by implementing
//! [`ReadySignal`] or by recording an event on [`Ready::Stream`] and making the consumer's
//! stream wait on it.
//!
//! Streams follow the raw-pointer model: a [`StreamHandle`], a [`Stream`] or a [`Ready`] is a
//! plain value, safe to make from any number; trusting one is `unsafe`. Attaching a readiness
//! to a tensor ([`Tensor::with_ready`](crate::Tensor::with_ready)) vouches that it is true and
//! that the streams it names are live, because adapters hand those streams to the driver from
//! safe code; handing a stream to a driver directly ([`ReadySignal::enqueue_wait`], the
//! adapters' raw-stream functions) vouches the same for the call.

use std::any::Any;
use std::fmt;
use std::num::NonZeroUsize;
use std::sync::Arc;

use crate::{DeviceType, Error};

/// A raw stream handle (`cudaStream_t`, `hipStream_t`) that is not one of the special values
/// 0, 1 or 2, so it cannot be confused with a default stream.
///
/// Only a number: safe to make, like a raw pointer; trusting it (attaching it to a tensor with
/// [`Tensor::with_ready`](crate::Tensor::with_ready), handing it to a driver) is `unsafe`,
/// with the obligation that it names a live stream.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct StreamHandle(NonZeroUsize);

impl StreamHandle {
    /// A handle from its address. `None` for 0, 1 and 2, which are the default streams'
    /// sentinels, never real handles.
    ///
    /// Safe: nothing checks, or needs, that `raw` is a stream. A handle is safe to make, like
    /// a raw pointer; trusting it (attaching it to a tensor, handing it to a driver) is
    /// `unsafe`.
    pub const fn new(raw: usize) -> Option<StreamHandle> {
        if raw <= 2 {
            return None;
        }
        match NonZeroUsize::new(raw) {
            Some(nz) => Some(StreamHandle(nz)),
            None => None,
        }
    }

    /// The handle's address, as passed to the runtime or driver API.
    pub const fn get(self) -> usize {
        self.0.get()
    }
}

impl fmt::Debug for StreamHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StreamHandle({:#x})", self.0)
    }
}

/// A device stream, without the ambiguous `0`.
///
/// CUDA's `cudaStreamLegacy` and `cudaStreamPerThread` are the handles `0x1` and `0x2`; the
/// null handle means one of them depending on how the code was compiled, which is why no
/// variant stands for it. ROCm's default (null) stream is [`Stream::LegacyDefault`].
///
/// A plain value, like a raw pointer: safe to make, `unsafe` to trust (see [`StreamHandle`]).
/// The default streams are those of whichever context the call that uses them makes current
/// (for the adapters: the primary context of the tensor's device).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stream {
    /// The legacy default stream (CUDA `cudaStreamLegacy`, ROCm's null stream).
    LegacyDefault,
    /// The per-thread default stream (CUDA `cudaStreamPerThread`) *of the thread that uses
    /// the value*: it names a different stream on every host thread. A readiness that names
    /// it is true only on the thread that enqueued the producer's work (see
    /// [`Tensor::with_ready`](crate::Tensor::with_ready), obligation 3).
    PerThreadDefault,
    /// Any other stream.
    Handle(StreamHandle),
}

impl Stream {
    /// The stream in words, for messages: "legacy default stream", "stream 0x7f...".
    pub fn describe(self) -> String {
        self.to_string()
    }

    /// The value to hand to the CUDA runtime or driver API: `0x1`, `0x2` or the handle.
    ///
    /// ROCm callers use 0 for [`Stream::LegacyDefault`] instead.
    pub const fn cuda_handle(self) -> usize {
        match self {
            Stream::LegacyDefault => 1,
            Stream::PerThreadDefault => 2,
            Stream::Handle(h) => h.get(),
        }
    }
}

impl fmt::Display for Stream {
    /// The stream in words, as [`Stream::describe`] says it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Stream::LegacyDefault => f.write_str("legacy default stream"),
            Stream::PerThreadDefault => f.write_str("per-thread default stream"),
            Stream::Handle(h) => write!(f, "stream {:#x}", h.get()),
        }
    }
}

/// What a stream argument on the wire asks for, after [`stream_from_wire`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StreamRequest {
    /// Nothing to order: no pending work (CAI `None`), or the party opted out of any
    /// synchronisation (DLPack `-1`).
    NoSync,
    /// Order against this stream.
    Stream(Stream),
}

/// The integer conventions for streams on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StreamConvention {
    /// The `stream` argument of `__dlpack__` for a CUDA (or CUDA-managed/pinned) producer:
    /// the consumer's stream.
    DlpackCuda,
    /// The `stream` argument of `__dlpack__` for a ROCm producer.
    DlpackRocm,
    /// The `stream` key of `__cuda_array_interface__` v3: the producer's stream.
    CudaArrayInterface,
}

impl StreamConvention {
    /// The DLPack convention for a device: ROCm's for ROCm memory, CUDA's otherwise.
    pub fn dlpack_for(device: DeviceType) -> StreamConvention {
        match device {
            DeviceType::Rocm | DeviceType::RocmHost => StreamConvention::DlpackRocm,
            _ => StreamConvention::DlpackCuda,
        }
    }
}

impl StreamConvention {
    /// The values this convention allows, for error messages (the table of
    /// [`stream_from_wire`] in words).
    pub fn valid_values(self) -> &'static str {
        match self {
            StreamConvention::DlpackCuda => {
                "None, -1 for no sync, 1 (legacy default), 2 (per-thread default) or a stream handle; 0 is ambiguous"
            }
            StreamConvention::DlpackRocm => {
                "None, -1 for no sync, 0 (default stream) or a stream handle; 1 and 2 are CUDA's"
            }
            StreamConvention::CudaArrayInterface => {
                "None, 1 (legacy default), 2 (per-thread default) or a stream handle; 0 is disallowed"
            }
        }
    }
}

impl fmt::Display for StreamConvention {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StreamConvention::DlpackCuda => "DLPack (CUDA)",
            StreamConvention::DlpackRocm => "DLPack (ROCm)",
            StreamConvention::CudaArrayInterface => "CUDA Array Interface v3",
        })
    }
}

/// The one mapping from wire integers to streams. `None` is the Python `None` (or an absent
/// key).
///
/// Safe, although the integer comes from foreign code: the result is only a value. A stream is
/// safe to make, like a raw pointer; trusting it (attaching it to a tensor, handing it to a
/// driver) is `unsafe`, and that is where the caller vouches for the producer.
///
/// | wire value | `DlpackCuda`                | `DlpackRocm`        | `CudaArrayInterface` |
/// |------------|-----------------------------|---------------------|----------------------|
/// | `None`     | legacy default (spec)       | legacy default      | no sync needed       |
/// | `-1`       | no sync                     | no sync             | error                |
/// | `0`        | error (ambiguous)           | legacy default      | error (disallowed)   |
/// | `1`        | legacy default              | error               | legacy default       |
/// | `2`        | per-thread default          | error               | per-thread default   |
/// | `> 2`      | handle                      | handle              | handle               |
/// | `< -1`     | error                       | error               | error                |
///
/// Sources: the Python array API standard's `__dlpack__(stream=...)` and the CUDA Array
/// Interface v3's `stream` key; docs/PROTOCOLS.md has the table with its reasoning.
pub fn stream_from_wire(
    convention: StreamConvention,
    value: Option<i64>,
) -> Result<StreamRequest, Error> {
    use StreamConvention::*;
    let bad = |v: i64| Error::InvalidStream {
        value: v,
        convention,
    };
    let Some(v) = value else {
        return Ok(match convention {
            DlpackCuda | DlpackRocm => StreamRequest::Stream(Stream::LegacyDefault),
            CudaArrayInterface => StreamRequest::NoSync,
        });
    };
    match (convention, v) {
        (DlpackCuda | DlpackRocm, -1) => Ok(StreamRequest::NoSync),
        (DlpackRocm, 0) => Ok(StreamRequest::Stream(Stream::LegacyDefault)),
        (DlpackCuda | CudaArrayInterface, 1) => Ok(StreamRequest::Stream(Stream::LegacyDefault)),
        (DlpackCuda | CudaArrayInterface, 2) => Ok(StreamRequest::Stream(Stream::PerThreadDefault)),
        (_, v) if v > 2 => usize::try_from(v)
            .ok()
            .and_then(StreamHandle::new)
            .map(|h| StreamRequest::Stream(Stream::Handle(h)))
            .ok_or(bad(v)),
        (_, v) => Err(bad(v)),
    }
}

/// The inverse of [`stream_from_wire`]: the integer to put on the wire, `None` for the
/// Python `None`. Fails where the convention has no value (per-thread default on ROCm,
/// handles above `i64::MAX`).
///
/// | request              | `DlpackCuda` | `DlpackRocm` | `CudaArrayInterface` |
/// |----------------------|--------------|--------------|----------------------|
/// | no sync              | `-1`         | `-1`         | `None`               |
/// | legacy default       | `1`          | `0`          | `1`                  |
/// | per-thread default   | `2`          | error        | `2`                  |
/// | handle               | handle       | handle       | handle               |
pub fn stream_to_wire(
    convention: StreamConvention,
    request: StreamRequest,
) -> Result<Option<i64>, Error> {
    use StreamConvention::*;
    let stream = match request {
        StreamRequest::NoSync => {
            return Ok(match convention {
                DlpackCuda | DlpackRocm => Some(-1),
                CudaArrayInterface => None,
            });
        }
        StreamRequest::Stream(s) => s,
    };
    match (convention, stream) {
        (DlpackRocm, Stream::LegacyDefault) => Ok(Some(0)),
        (DlpackRocm, Stream::PerThreadDefault) => {
            Err(Error::StreamNotRepresentable { stream, convention })
        }
        (_, Stream::LegacyDefault) => Ok(Some(1)),
        (_, Stream::PerThreadDefault) => Ok(Some(2)),
        (_, Stream::Handle(h)) => i64::try_from(h.get())
            .map(Some)
            .map_err(|_| Error::StreamNotRepresentable { stream, convention }),
    }
}

/// An error from a [`ReadySignal`], boxed so the core needs no CUDA error type.
pub type SignalError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The hook through which a device-aware adapter attaches "ready" semantics to a tensor:
/// typically a recorded CUDA event.
///
/// Implementations must be cheap to share ([`Ready`] holds them in an `Arc`) and must not
/// block the host in [`ReadySignal::enqueue_wait`].
///
/// Implementing the trait is safe: a signal is trusted only once it is attached to a tensor
/// with the `unsafe` [`Tensor::with_ready`](crate::Tensor::with_ready), whose caller vouches
/// that it is true and that its [`producer_stream`](ReadySignal::producer_stream) is live.
pub trait ReadySignal: Any + Send + Sync + fmt::Debug {
    /// Make work submitted to `consumer` after this call wait until the data is ready,
    /// on the device, without blocking the host.
    ///
    /// # Safety
    /// The caller guarantees:
    /// 1. `consumer` is a live stream on the signal's device (the device of the tensor it is
    ///    attached to) for the duration of the call: a handle of a stream of that device's
    ///    primary context that has not been destroyed, or a default stream, which then means
    ///    that context's (and, for [`Stream::PerThreadDefault`], the calling thread's). For
    ///    the wait to order anything, the consumer's work must be enqueued after this call,
    ///    while the stream still lives.
    unsafe fn enqueue_wait(&self, consumer: Stream) -> Result<(), SignalError>;

    /// Block the calling host thread until the data is ready.
    fn synchronize(&self) -> Result<(), SignalError>;

    /// The producer stream the signal was recorded on, if a stream value names it for any
    /// thread (for the CUDA Array Interface, which carries a stream, not an event). Signals
    /// recorded on [`Stream::PerThreadDefault`], which names another stream on every thread,
    /// should return `None`.
    fn producer_stream(&self) -> Option<Stream>;

    /// Upcast, so an adapter can recognise its own signal type.
    fn as_any(&self) -> &dyn Any;
}

/// Where a tensor's data becomes ready.
///
/// A plain value, safe to make; a tensor trusts it only through the `unsafe`
/// [`Tensor::with_ready`](crate::Tensor::with_ready), whose caller vouches that it is true and
/// that the streams it names are live.
// Its `Clone` must stay what the derive gives: the same bytes, with the `Arc`'s count raised.
// `Tensor::clone_into_uninit` copies tensors bitwise and counts the copy by forgetting a
// clone; a variant whose clone allocates would break that (tested in
// `tests/it/ownership.rs`, which Miri runs).
#[derive(Clone, Debug, Default)]
pub enum Ready {
    /// No pending work: the data may be used on any stream and from the host.
    #[default]
    Now,
    /// The data is ready once the work enqueued on this producer stream so far has finished.
    ///
    /// A handle names its own stream, of a device's primary context. The default streams are
    /// those of the tensor's device's primary context; pinned and managed memory carry no GPU
    /// in their device (ordinal 0 by convention), so for them a default stream means the
    /// device current on the thread that hands the tensor off (adapters that know the device
    /// record an event instead). [`Stream::PerThreadDefault`] means the per-thread default
    /// stream of the thread that *uses* the tensor, which differs from thread to thread: it is
    /// true only on the thread that enqueued the producer's work.
    Stream(Stream),
    /// An adapter-provided signal (for example a CUDA event recorded on the producer stream).
    Signal(Arc<dyn ReadySignal>),
}

impl Ready {
    /// The producer stream, when one is known.
    pub fn producer_stream(&self) -> Option<Stream> {
        match self {
            Ready::Now => None,
            Ready::Stream(s) => Some(*s),
            Ready::Signal(sig) => sig.producer_stream(),
        }
    }

    /// Whether there is nothing to wait for.
    pub fn is_now(&self) -> bool {
        matches!(self, Ready::Now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use StreamConvention::*;

    const ALL: [StreamConvention; 3] = [DlpackCuda, DlpackRocm, CudaArrayInterface];

    #[test]
    fn zero_is_refused_where_ambiguous() {
        assert!(matches!(
            stream_from_wire(DlpackCuda, Some(0)),
            Err(Error::InvalidStream { value: 0, .. })
        ));
        assert!(stream_from_wire(CudaArrayInterface, Some(0)).is_err());
        assert_eq!(
            stream_from_wire(DlpackRocm, Some(0)).unwrap(),
            StreamRequest::Stream(Stream::LegacyDefault)
        );
    }

    #[test]
    fn table_values() {
        let h = StreamHandle::new(0x5555).unwrap();
        let cases: [(StreamConvention, Option<i64>, Option<StreamRequest>); 14] = [
            (
                DlpackCuda,
                None,
                Some(StreamRequest::Stream(Stream::LegacyDefault)),
            ),
            (DlpackCuda, Some(-1), Some(StreamRequest::NoSync)),
            (
                DlpackCuda,
                Some(1),
                Some(StreamRequest::Stream(Stream::LegacyDefault)),
            ),
            (
                DlpackCuda,
                Some(2),
                Some(StreamRequest::Stream(Stream::PerThreadDefault)),
            ),
            (
                DlpackCuda,
                Some(0x5555),
                Some(StreamRequest::Stream(Stream::Handle(h))),
            ),
            (DlpackCuda, Some(-2), None),
            (DlpackRocm, Some(1), None),
            (DlpackRocm, Some(2), None),
            (DlpackRocm, Some(-1), Some(StreamRequest::NoSync)),
            (CudaArrayInterface, None, Some(StreamRequest::NoSync)),
            (CudaArrayInterface, Some(-1), None),
            (
                CudaArrayInterface,
                Some(1),
                Some(StreamRequest::Stream(Stream::LegacyDefault)),
            ),
            (
                CudaArrayInterface,
                Some(2),
                Some(StreamRequest::Stream(Stream::PerThreadDefault)),
            ),
            (CudaArrayInterface, Some(i64::MIN), None),
        ];
        for (conv, wire, want) in cases {
            let got = stream_from_wire(conv, wire).ok();
            assert_eq!(got, want, "{conv} {wire:?}");
        }
    }

    #[test]
    fn every_accepted_value_roundtrips_to_itself_or_the_canonical_none() {
        for conv in ALL {
            for v in [-3i64, -1, 0, 1, 2, 3, 0x7f00_0000, i64::MAX] {
                let Ok(req) = stream_from_wire(conv, Some(v)) else {
                    continue;
                };
                let back = stream_to_wire(conv, req).unwrap();
                // CAI has no wire value for "no sync" other than None.
                assert_eq!(back, Some(v), "{conv} {v}");
                assert_eq!(stream_from_wire(conv, back).unwrap(), req);
            }
        }
        assert!(
            stream_to_wire(DlpackRocm, StreamRequest::Stream(Stream::PerThreadDefault)).is_err()
        );
    }

    #[test]
    fn messages_name_the_values_each_convention_allows() {
        let msg = |conv, v| stream_from_wire(conv, Some(v)).unwrap_err().to_string();
        assert_eq!(
            msg(CudaArrayInterface, -1),
            "stream -1 is not valid for CUDA Array Interface v3 (expected None, 1 (legacy default), 2 (per-thread default) or a stream handle; 0 is disallowed)"
        );
        assert!(msg(DlpackRocm, 1).contains("0 (default stream)"));
        assert!(msg(DlpackCuda, 0).contains("0 is ambiguous"));
        let e = stream_to_wire(DlpackRocm, StreamRequest::Stream(Stream::PerThreadDefault))
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "DLPack (ROCm) has no value for the per-thread default stream (expected one of: None, -1 for no sync, 0 (default stream) or a stream handle; 1 and 2 are CUDA's)"
        );
    }

    #[test]
    fn handles_never_alias_default_streams() {
        assert!(StreamHandle::new(0).is_none());
        assert!(StreamHandle::new(1).is_none());
        assert!(StreamHandle::new(2).is_none());
        assert_eq!(StreamHandle::new(3).unwrap().get(), 3);
        assert_eq!(Stream::PerThreadDefault.cuda_handle(), 2);
    }
}
