//! The crate's one error type.

use tensorbridge_core::{DType, Device};

use crate::{ScalarType, TorchDevice, TorchLayout};

/// Everything this crate refuses. Messages say what was expected and what was found; the
/// core's refusals (layout arithmetic, alignment...) pass through unchanged as
/// [`Error::Core`], the CUDA hand-off's as [`Error::Cuda`], and a C++ exception from libtorch
/// becomes [`Error::Torch`] with libtorch's message (never an unwind, never an abort).
#[non_exhaustive]
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// A refusal of the core (rank, overflow, alignment, address span...).
    #[error(transparent)]
    Core(#[from] tensorbridge_core::Error),
    /// The stream hand-off on the CUDA driver failed (or there is no driver).
    #[error(transparent)]
    Cuda(#[from] tensorbridge_cuda::Error),
    /// libtorch threw while the shim called it.
    #[error("libtorch failed in {call}: {message}")]
    Torch {
        /// The shim function that called libtorch (`"tb_tch_from_blob"`,
        /// `"tb_tch_describe"`...).
        call: &'static str,
        /// libtorch's message, without its C++ backtrace.
        message: String,
    },

    // ---- tch -> Tensor ----
    /// An undefined tensor (`tch::Tensor::new()`): no memory to share.
    #[error("the tch tensor is undefined (expected a tensor with data)")]
    Undefined,
    /// A sparse, MKL-DNN or jagged tensor: no single strided block of memory to share.
    #[error("layout {layout} has no strides (expected torch.strided; call to_dense() first)")]
    NotStrided {
        /// The tensor's layout.
        layout: TorchLayout,
    },
    /// A lazily conjugated complex tensor: its memory holds the unconjugated values.
    #[error(
        "the tensor's conjugate bit is set, so its memory holds the unconjugated values (expected a materialised tensor; call resolve_conj() first)"
    )]
    ConjugateBit,
    /// A lazily negated tensor: its memory holds the values before negation.
    #[error(
        "the tensor's negative bit is set, so its memory holds the values before negation (expected a materialised tensor; call resolve_neg() first)"
    )]
    NegativeBit,
    /// A scalar type without a DLPack code (quantized, `Bits*`, sub-byte integers).
    #[error(
        "scalar type {scalar_type} has no DLPack type code (expected bool, integers, floats, bfloat16, complex, fp8 or float4_e2m1fn_x2)"
    )]
    UnsupportedScalarType {
        /// The tensor's scalar type.
        scalar_type: ScalarType,
    },
    /// A device the core cannot describe as memory (meta, MPS, XLA...).
    #[error("a tensor on {device} cannot be shared (expected cpu or cuda)")]
    UnsupportedTorchDevice {
        /// The tensor's device.
        device: TorchDevice,
    },

    // ---- Tensor -> tch ----
    /// A negative stride on a dimension that reaches memory (more than one element, in a
    /// tensor with elements), which libtorch does not support. Negative strides that reach
    /// nothing (size-1 dimensions, tensors without elements) are passed as their absolute
    /// value instead.
    #[error("stride {stride} of dimension {dim} is negative (libtorch takes only strides >= 0)")]
    NegativeStride {
        /// The dimension.
        dim: usize,
        /// Its stride, in elements.
        stride: i64,
    },
    /// Elements smaller than a byte (packed or padded fp6 and fp4), which libtorch cannot
    /// address.
    #[error(
        "dtype {dtype} has elements smaller than a byte (libtorch takes whole-byte elements only)"
    )]
    SubByte {
        /// The tensor's dtype.
        dtype: DType,
    },
    /// A dtype libtorch has no scalar type for.
    #[error(
        "dtype {dtype} has no libtorch scalar type (expected bool, integers, floats, bfloat16, complex, an fp8 type libtorch has, or float4_e2m1fnx2)"
    )]
    UnsupportedDType {
        /// The tensor's dtype.
        dtype: DType,
    },
    /// A dtype whose libtorch scalar type has no tch `Kind`
    /// ([`kind_of_dtype`](crate::kind_of_dtype)).
    #[error(
        "dtype {dtype} is libtorch's {scalar_type}, which tch 0.24 has no Kind for (expected a dtype with a tch::Kind)"
    )]
    NoKind {
        /// The dtype asked about.
        dtype: DType,
        /// Its libtorch scalar type.
        scalar_type: ScalarType,
    },
    /// Memory libtorch cannot take.
    #[error(
        "memory on {device} cannot become a libtorch tensor (expected cpu, cuda_host, cuda or cuda_managed)"
    )]
    UnsupportedDevice {
        /// The tensor's device.
        device: Device,
    },
    /// A device ordinal above libtorch's `DeviceIndex` (an `int8_t`).
    #[error("device {device} has an ordinal above 127, libtorch's largest device index")]
    OrdinalOutOfRange {
        /// The tensor's device.
        device: Device,
    },
    /// A read-only tensor, refused unless the caller accepts that libtorch cannot keep it so
    /// ([`ExportOptions::allow_read_only`](crate::ExportOptions::allow_read_only)).
    #[error(
        "the tensor is read-only but libtorch has no read-only tensors (expected a writable tensor, or ExportOptions::allow_read_only to share it knowingly)"
    )]
    ReadOnly,
}
