//! The crate's one error type.

use std::fmt;
use std::sync::Arc;

use cudarc::driver::{DriverError, sys};
use tensorbridge::Device;

use crate::MemoryType;

/// Everything this crate refuses. Messages say what was expected and what was found; the
/// core's refusals (layout, alignment, dtype, read-only...) pass through unchanged as
/// [`Error::Core`], and every failing driver call becomes [`Error::Driver`] with its name and
/// `CUresult` (never a panic).
#[non_exhaustive]
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// A refusal of the core (layout, alignment, dtype mismatch, read-only...).
    #[error(transparent)]
    Core(#[from] tensorbridge::Error),

    // ---- the driver ----
    /// libcuda could not be loaded: a machine without an NVIDIA driver.
    #[error(
        "no CUDA driver: libcuda could not be loaded (expected an NVIDIA driver on this machine)"
    )]
    NoDriver,
    /// A driver call returned something other than `CUDA_SUCCESS`.
    #[error("{call} failed with {result:?} (expected CUDA_SUCCESS)")]
    Driver {
        /// The driver function (or cudarc call) that failed, e.g. `"cuStreamWaitEvent"`.
        call: &'static str,
        /// What it returned.
        result: sys::CUresult,
    },
    /// The ready signal of another adapter failed while this crate waited on it.
    #[error("the tensor's ready signal failed: {0}")]
    Signal(#[source] Arc<dyn std::error::Error + Send + Sync + 'static>),

    // ---- cudarc -> Tensor ----
    /// A shape and strides that reach outside the slice they describe.
    #[error(
        "the layout reaches bytes [{lo}, {hi}) from the start of the slice (expected within [0, {nbytes}), the slice's {len} elements)"
    )]
    OutsideSlice {
        /// Lowest byte reached, relative to the slice's first byte (may be negative).
        lo: i128,
        /// One past the highest byte reached.
        hi: i128,
        /// The slice's length in elements.
        len: usize,
        /// The slice's length in bytes.
        nbytes: usize,
    },

    // ---- Tensor -> cudarc ----
    /// A tensor whose memory CUDA kernels cannot take.
    #[error("memory on {device} cannot be passed to a CUDA kernel (expected cuda or cuda_managed)")]
    NotCudaMemory {
        /// The tensor's device.
        device: Device,
    },
    /// A tensor on another device than the stream it was asked for.
    #[error(
        "the tensor is on {tensor} but the stream belongs to cuda:{stream} (expected the same device)"
    )]
    DeviceMismatch {
        /// The tensor's device.
        tensor: Device,
        /// The ordinal of the stream's context.
        stream: usize,
    },

    // ---- pointer inspection ----
    /// An address the driver knows nothing about (a made-up number, unregistered host memory).
    #[error("address {addr:#x} is not a CUDA allocation")]
    NotAllocation {
        /// The address asked about.
        addr: usize,
    },
    /// Memory of another kind than the tensor claims.
    #[error(
        "address {addr:#x} is {found} memory (expected {expected} memory for a tensor on {device})"
    )]
    MemoryTypeMismatch {
        /// The address asked about.
        addr: usize,
        /// What the driver says it is.
        found: MemoryType,
        /// What the tensor's device needs.
        expected: MemoryType,
        /// The tensor's device.
        device: Device,
    },
    /// Device memory on another device than the tensor claims.
    #[error("address {addr:#x} is on cuda:{found} (expected {device})")]
    OrdinalMismatch {
        /// The address asked about.
        addr: usize,
        /// The ordinal the driver reports.
        found: u32,
        /// The tensor's device.
        device: Device,
    },
    /// A tensor whose bytes start before the allocation that holds its first element.
    #[error(
        "bytes [{lo:#x}, {hi:#x}) start {by} bytes before the allocation [{base:#x}, {end:#x}) on {device}"
    )]
    BeforeAllocation {
        /// The span's first byte.
        lo: usize,
        /// One past its last byte.
        hi: usize,
        /// How far before the allocation it starts.
        by: usize,
        /// The allocation's first byte.
        base: usize,
        /// One past the allocation's last byte.
        end: usize,
        /// The device the driver places the allocation on.
        device: Device,
    },
    /// A tensor whose bytes run past the end of the allocation that holds its first element.
    #[error(
        "bytes [{lo:#x}, {hi:#x}) run {by} bytes past the allocation [{base:#x}, {end:#x}) on {device}"
    )]
    PastAllocation {
        /// The span's first byte.
        lo: usize,
        /// One past its last byte.
        hi: usize,
        /// How far past the allocation it runs.
        by: usize,
        /// The allocation's first byte.
        base: usize,
        /// One past the allocation's last byte.
        end: usize,
        /// The device the driver places the allocation on.
        device: Device,
    },
}

impl Error {
    /// A failed driver call.
    pub(crate) fn driver(call: &'static str, err: DriverError) -> Error {
        Error::Driver {
            call,
            result: err.0,
        }
    }

    /// `Ok` for `CUDA_SUCCESS`, the typed error otherwise.
    pub(crate) fn check(call: &'static str, result: sys::CUresult) -> Result<(), Error> {
        match result {
            sys::CUresult::CUDA_SUCCESS => Ok(()),
            result => Err(Error::Driver { call, result }),
        }
    }

    /// This crate's error from a [`tensorbridge::SignalError`]: itself when the signal was
    /// this crate's, wrapped otherwise.
    pub(crate) fn from_signal(err: tensorbridge::SignalError) -> Error {
        match err.downcast::<Error>() {
            Ok(own) => *own,
            Err(other) => Error::Signal(Arc::from(other)),
        }
    }
}

/// What a failed consuming conversion gives back: the error and the slice, untouched, so its
/// memory is neither leaked nor freed behind the caller's back.
pub struct IntoTensorError<T> {
    error: Error,
    slice: cudarc::driver::CudaSlice<T>,
}

impl<T> IntoTensorError<T> {
    pub(crate) fn new(error: Error, slice: cudarc::driver::CudaSlice<T>) -> Self {
        IntoTensorError { error, slice }
    }

    /// Why the conversion failed.
    pub fn error(&self) -> &Error {
        &self.error
    }

    /// The slice, back.
    pub fn into_inner(self) -> cudarc::driver::CudaSlice<T> {
        self.slice
    }

    /// The error and the slice.
    pub fn into_parts(self) -> (Error, cudarc::driver::CudaSlice<T>) {
        (self.error, self.slice)
    }
}

impl<T> fmt::Debug for IntoTensorError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IntoTensorError")
            .field("error", &self.error)
            .field("len", &self.slice.len())
            .finish_non_exhaustive()
    }
}

impl<T> fmt::Display for IntoTensorError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.error, f)
    }
}

impl<T> std::error::Error for IntoTensorError<T> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.error.source()
    }
}

impl<T> From<IntoTensorError<T>> for Error {
    fn from(e: IntoTensorError<T>) -> Error {
        e.error
    }
}
