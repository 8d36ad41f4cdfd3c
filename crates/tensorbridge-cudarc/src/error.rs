//! The crate's one error type.

use std::fmt;

/// Everything this crate refuses. Messages say what was expected and what was found; the
/// core's refusals (layout, alignment, dtype, read-only...) pass through unchanged as
/// [`Error::Core`], and the CUDA layer's (no driver, a failing driver call with its name and
/// `CUresult`, never a panic) as [`Error::Cuda`].
#[non_exhaustive]
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// A refusal of the core (layout, alignment, dtype mismatch, read-only...).
    #[error(transparent)]
    Core(#[from] tensorbridge_core::Error),

    /// A refusal of the CUDA driver layer: no driver, a failing driver call, memory kernels
    /// cannot take, a stream of another device, a ready signal that failed.
    #[error(transparent)]
    Cuda(#[from] tensorbridge_cuda::Error),

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
    /// A lent buffer asked for on a stream being captured into a CUDA graph: the borrow
    /// ends with the scope, before any replay would use the memory.
    #[error(
        "a lent cudarc buffer cannot be used on a stream {capture} (expected a stream outside any capture; import the slice instead, so the graph can keep it alive)"
    )]
    LentToCapture {
        /// The stream's capture state.
        capture: tensorbridge_cuda::CaptureStatus,
    },

    // ---- kernels ----
    /// A tensor with more dimensions than a [`KernelLayout`](crate::KernelLayout) holds.
    #[error(
        "the tensor has {rank} dimensions but a kernel layout holds at most {max} (expected a tensor of rank <= {max}; reshape or make it contiguous and flatten it)"
    )]
    RankTooLarge {
        /// The tensor's rank.
        rank: usize,
        /// [`MAX_KERNEL_RANK`](crate::MAX_KERNEL_RANK).
        max: usize,
    },
    /// NVRTC (libnvrtc) could not be loaded, so kernels cannot be compiled at run time.
    #[error(
        "cannot compile CUDA kernels: libnvrtc could not be loaded (expected the CUDA toolkit's libnvrtc.so on the library path, e.g. /usr/local/cuda/lib64, or the nvidia-cuda-nvrtc wheel)"
    )]
    NoNvrtc,
    /// A kernel source that NVRTC refused.
    #[error("NVRTC could not compile the source of kernel {name}: {log}")]
    Compile {
        /// The kernel asked for.
        name: String,
        /// NVRTC's log (or what else went wrong).
        log: String,
    },
}

impl From<cudarc::driver::DriverError> for Error {
    /// A failing cudarc call (a launch, an allocation, a copy) as the CUDA layer's
    /// [`Driver`](tensorbridge_cuda::Error::Driver) error, so `?` works on cudarc's results
    /// in functions that return this crate's errors.
    fn from(e: cudarc::driver::DriverError) -> Error {
        Error::Cuda(tensorbridge_cuda::Error::driver(
            tensorbridge_cuda::Error::CUDARC_CALL,
            e,
        ))
    }
}

/// What a failed consuming conversion gives back: the error and the slice, untouched, so its
/// memory is neither leaked nor freed behind the caller's back.
pub struct ImportError<T> {
    error: Error,
    slice: cudarc::driver::CudaSlice<T>,
}

impl<T> ImportError<T> {
    pub(crate) fn new(error: Error, slice: cudarc::driver::CudaSlice<T>) -> Self {
        ImportError { error, slice }
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

impl<T> fmt::Debug for ImportError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ImportError")
            .field("error", &self.error)
            .field("len", &self.slice.len())
            .finish_non_exhaustive()
    }
}

impl<T> fmt::Display for ImportError<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.error, f)
    }
}

impl<T> std::error::Error for ImportError<T> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.error.source()
    }
}

impl<T> From<ImportError<T>> for Error {
    fn from(e: ImportError<T>) -> Error {
        e.error
    }
}
