//! One reader for a Python `stream=` argument: `asview(stream=)`, `open(stream=)`,
//! `from_ptr(producer_stream=)` and `kernel_call_on(stream)` read the same value the same way
//! (ARCHITECTURE.md, "Streams from Python"). Integers take DLPack's CUDA meanings, as
//! `__dlpack__(stream=)` does; a stream object is read through its framework's protocol.
//!
//! | value | read as |
//! |---|---|
//! | `None` | [`StreamArg::Absent`]: the entry's default (each entry documents it) |
//! | `-1` | [`StreamArg::NoSync`]: no synchronisation |
//! | `0` | refused ([`Error::StreamZero`]): ambiguous between the legacy and the per-thread default stream |
//! | `1` | the legacy default stream |
//! | `2` | the per-thread default stream |
//! | `> 2` | a `cudaStream_t` handle |
//! | `< -1` | refused |
//! | a `torch.cuda.Stream` | its `cuda_stream` (`0`, its default stream, is the legacy default stream) |
//! | an object with `__cuda_stream__` (cuda.core) | the handle it returns |
//! | an object with `ptr` (a `cupy.cuda.Stream`) | that handle (`0`: the legacy default stream) |
//!
//! A stream object's handle `0` is unambiguous: the framework names its own default stream,
//! which is the legacy one in PyTorch's and CuPy's builds. View.__dlpack__'s `stream` is not
//! read here: it is what a consumer sends under the DLPack protocol (an int, `0` refused).

use pyo3::prelude::*;
use tensorbridge_core::{Stream, StreamConvention, StreamRequest, stream_from_wire};
use tensorbridge_cuda::StreamLife;

use crate::convert::type_name;
use crate::error::{Error, Result};
use crate::floor::attribute;
use crate::owner::KeepAlive;

/// A Python `stream=` argument, read ([`StreamArg::read`]).
pub(crate) enum StreamArg {
    /// `None`.
    Absent,
    /// `-1`: the caller asks for no synchronisation.
    NoSync,
    /// A stream, and how long it is known to live.
    Stream {
        stream: Stream,
        life: StreamLife,
        /// The integer the caller gave, or the object's handle (for messages).
        value: i64,
    },
}

impl StreamArg {
    /// Reads `obj` (absent: `None`) by the table of the module docs.
    pub(crate) fn read(obj: Option<&Bound<'_, PyAny>>) -> Result<StreamArg> {
        let Some(obj) = obj.filter(|o| !o.is_none()) else {
            return Ok(StreamArg::Absent);
        };
        if obj.cast::<pyo3::types::PyBool>().is_ok() {
            return Err(Error::StreamObject {
                type_name: type_name(obj),
            });
        }
        if obj.cast::<pyo3::types::PyInt>().is_ok() {
            let Ok(value) = obj.extract::<i64>() else {
                return Err(Error::StreamRange {
                    repr: obj.repr()?.to_string(),
                });
            };
            return StreamArg::from_int(value);
        }
        StreamArg::from_object(obj)
    }

    /// An integer, with DLPack's CUDA meanings.
    pub(crate) fn from_int(value: i64) -> Result<StreamArg> {
        if value == 0 {
            return Err(Error::StreamZero);
        }
        Ok(
            match stream_from_wire(StreamConvention::DlpackCuda, Some(value))? {
                StreamRequest::NoSync => StreamArg::NoSync,
                StreamRequest::Stream(stream) => StreamArg::Stream {
                    stream,
                    // A handle is vouched for by the caller for the call; the default
                    // streams always live.
                    life: match stream {
                        Stream::Handle(_) => StreamLife::CallOnly,
                        _ => StreamLife::Immortal,
                    },
                    value,
                },
            },
        )
    }

    /// A stream object: a `torch.cuda.Stream`, the CUDA stream protocol's `__cuda_stream__`,
    /// CuPy's `ptr`. One that owns its stream (the protocol's, CuPy's) is held as long as
    /// the stream is used ([`StreamLife::KeptBy`]); a `torch.cuda.Stream` is PyTorch's pool
    /// stream (never destroyed) or an external one (lent for the call only).
    fn from_object(obj: &Bound<'_, PyAny>) -> Result<StreamArg> {
        let py = obj.py();
        let of = |handle: usize, life: StreamLife| StreamArg::Stream {
            stream: tensorbridge_cuda::stream_from_raw(std::ptr::without_provenance_mut(handle)),
            life,
            value: i64::try_from(handle).unwrap_or(i64::MAX),
        };
        let kept = || StreamLife::KeptBy(KeepAlive::owner(obj.clone().unbind(), None));
        if let Some(id) = attribute(obj, pyo3::intern!(py, "stream_id"))? {
            // A `torch.cuda.Stream`: its id is 0 for the default stream, odd for pool
            // streams, the (even) handle itself for an external stream.
            let id: i64 = id.extract()?;
            let handle: usize = obj.getattr(pyo3::intern!(py, "cuda_stream"))?.extract()?;
            let life = if id == 0 || id & 1 == 1 {
                StreamLife::Immortal
            } else {
                StreamLife::CallOnly
            };
            return Ok(of(handle, life));
        }
        // The CUDA stream protocol: `__cuda_stream__()` -> (version, handle).
        if let Some(method) = attribute(obj, pyo3::intern!(py, "__cuda_stream__"))? {
            let (_, handle): (i64, usize) = method.call0()?.extract()?;
            return Ok(of(handle, kept()));
        }
        if let Some(handle) = attribute(obj, pyo3::intern!(py, "ptr"))? {
            let handle: usize = handle.extract()?;
            return Ok(of(handle, kept()));
        }
        Err(Error::StreamObject {
            type_name: type_name(obj),
        })
    }

    /// The request DLPack's `stream` makes of a producer: `None` for [`StreamArg::Absent`].
    pub(crate) fn request(&self) -> Option<StreamRequest> {
        match self {
            StreamArg::Absent => None,
            StreamArg::NoSync => Some(StreamRequest::NoSync),
            StreamArg::Stream { stream, .. } => Some(StreamRequest::Stream(*stream)),
        }
    }

    /// The stream an entry that must run or order on one uses: `None` is the legacy default
    /// stream (DLPack's meaning of `None`), `-1` is refused for `entry` (no stream to use).
    pub(crate) fn stream_or_default(self, entry: &'static str) -> Result<(Stream, StreamLife)> {
        match self {
            StreamArg::Absent => Ok((Stream::LegacyDefault, StreamLife::Immortal)),
            StreamArg::NoSync => Err(Error::StreamNeeded { entry }),
            StreamArg::Stream { stream, life, .. } => Ok((stream, life)),
        }
    }
}

/// A framework whose current stream a kernel call may run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Framework {
    Torch,
    CuPy,
}

/// A framework's current stream for an argument: whose, which, how long it lives.
pub(crate) struct FrameworkStream {
    pub(crate) framework: Framework,
    pub(crate) stream: Stream,
    pub(crate) life: StreamLife,
}
