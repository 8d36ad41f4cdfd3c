//! The core's one error type.

use crate::{DType, DTypeCode, Device, Stream, StreamConvention};

/// Everything the core can refuse. Messages say what was expected and what was found.
///
/// Adapter crates wrap this transparently in their own error enums.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    // ---- dtypes and devices ----
    /// A DLPack type code this version does not know.
    #[error(
        "unknown DLPack dtype code {code} (expected {})",
        crate::dtype::known_codes()
    )]
    UnknownDTypeCode {
        /// The raw code.
        code: u8,
    },
    /// A bit width the code does not allow.
    #[error("dtype code {code} cannot have {bits} bits (expected one of {allowed:?})")]
    InvalidBits {
        /// The kind of element.
        code: DTypeCode,
        /// The bits found.
        bits: u8,
        /// The bits this code allows.
        allowed: &'static [u8],
    },
    /// `lanes == 0`.
    #[error("dtype {code} has 0 lanes (expected at least 1)")]
    ZeroLanes {
        /// The kind of element.
        code: DTypeCode,
    },
    /// A dtype name that is not recognised.
    #[error(
        "unknown dtype name {name:?} (expected a name like \"float32\", \"bfloat16\", \"float8_e4m3fn\", \"complex64\" or \"bool\")"
    )]
    UnknownDTypeName {
        /// The name given.
        name: String,
    },
    /// A DLPack device type code this version does not know.
    #[error(
        "unknown DLPack device type {code} (expected {})",
        crate::device::known_codes()
    )]
    UnknownDeviceType {
        /// The raw code.
        code: i32,
    },
    /// A negative device id.
    #[error("device id {id} is negative (expected an ordinal >= 0)")]
    NegativeDeviceId {
        /// The raw id.
        id: i32,
    },
    /// An ordinal that DLPack's `int32_t device_id` cannot hold.
    #[error("device ordinal {ordinal} does not fit DLPack's int32 device id")]
    OrdinalTooLarge {
        /// The ordinal.
        ordinal: u32,
    },
    /// A device string that is not recognised.
    #[error("unknown device {name:?} (expected a name like \"cpu\", \"cuda:0\" or \"cuda_host\")")]
    UnknownDeviceName {
        /// The string given.
        name: String,
    },

    // ---- layout ----
    /// Shape and strides of different lengths.
    #[error("shape has {shape} dimensions but strides has {strides}")]
    RankMismatch {
        /// Length of the shape.
        shape: usize,
        /// Length of the strides.
        strides: usize,
    },
    /// A negative extent.
    #[error("dimension {dim} has negative size {size}")]
    NegativeSize {
        /// The dimension.
        dim: usize,
        /// The size found.
        size: i64,
    },
    /// Arithmetic on the layout would overflow.
    #[error("{what} overflows 64-bit arithmetic")]
    Overflow {
        /// Which quantity overflowed (`"number of elements"`, `"byte span"`, ...).
        what: &'static str,
    },
    /// A null data pointer for a tensor that has elements.
    #[error(
        "data pointer is null but the tensor has {numel} elements (null is allowed only when empty)"
    )]
    NullData {
        /// The number of elements.
        numel: u64,
    },
    /// The first element's address is not aligned for the dtype.
    #[error("data pointer {addr:#x} is not aligned to {align} bytes")]
    Misaligned {
        /// The address of element 0 (data plus byte offset).
        addr: usize,
        /// The alignment the dtype needs.
        align: usize,
    },
    /// The bytes the strides reach do not fit in the address space.
    #[error(
        "the tensor's bytes reach {reach} relative to address {addr:#x}, outside the address space"
    )]
    OutOfAddressSpace {
        /// The address of element 0.
        addr: usize,
        /// The offending byte offset relative to it.
        reach: i128,
    },
    /// A packed sub-byte element is not at a byte boundary where a byte address is needed.
    #[error(
        "dimension {dim} has stride {stride} elements of {bits} bits, not a whole number of bytes"
    )]
    SubByteStride {
        /// The dimension.
        dim: usize,
        /// Stride in elements.
        stride: i64,
        /// Bits per element.
        bits: u64,
    },
    /// A byte stride that is not a multiple of the item size.
    #[error(
        "dimension {dim} has byte stride {stride_bytes}, not a multiple of the item size {itemsize}"
    )]
    StrideNotMultiple {
        /// The dimension.
        dim: usize,
        /// The byte stride found.
        stride_bytes: i64,
        /// The item size in bytes.
        itemsize: usize,
    },
    /// A layout that is not compact row-major where that was required.
    #[error("dimension {dim} has stride {stride} but compact row-major needs {expected}")]
    NotRowMajor {
        /// The dimension.
        dim: usize,
        /// Stride found, in elements.
        stride: i64,
        /// Stride expected, in elements.
        expected: i64,
    },
    /// A layout that is not compact column-major where that was required.
    #[error("dimension {dim} has stride {stride} but compact column-major needs {expected}")]
    NotColumnMajor {
        /// The dimension.
        dim: usize,
        /// Stride found, in elements.
        stride: i64,
        /// Stride expected, in elements.
        expected: i64,
    },
    /// A layout that is not a permutation of a compact layout where that was required.
    #[error(
        "dimension {dim} with stride {stride} makes the layout not dense (not a permutation of a compact layout)"
    )]
    NotDense {
        /// The first dimension that breaks density.
        dim: usize,
        /// Its stride in elements.
        stride: i64,
    },
    /// A negative stride where the consumer cannot take one.
    #[error("dimension {dim} has negative stride {stride} (expected strides >= 0)")]
    NegativeStride {
        /// The dimension.
        dim: usize,
        /// The stride found.
        stride: i64,
    },
    /// A zero stride on a dimension of size > 1 (a broadcast) where the consumer cannot take one.
    #[error(
        "dimension {dim} of size {size} has stride 0 (a broadcast; expected a non-zero stride)"
    )]
    ZeroStride {
        /// The dimension.
        dim: usize,
        /// Its size.
        size: i64,
    },
    /// A non-zero byte offset where the consumer needs it folded into the pointer.
    #[error("byte offset is {byte_offset} (expected 0)")]
    NonZeroByteOffset {
        /// The byte offset found.
        byte_offset: u64,
    },

    // ---- access, views, streams ----
    /// A typed view whose element type does not match the tensor's dtype.
    #[error("dtype mismatch: expected {expected}, found {found}")]
    DTypeMismatch {
        /// The dtype the caller asked for.
        expected: DType,
        /// The tensor's dtype.
        found: DType,
    },
    /// Host access to memory the host cannot touch.
    #[error(
        "memory on {device} is not accessible from the host (expected cpu, cuda_host or rocm_host)"
    )]
    NotHostAccessible {
        /// The tensor's device.
        device: Device,
    },
    /// A buffer whose length disagrees with the shape.
    #[error("shape holds {numel} elements but the buffer has {len}")]
    ElementCount {
        /// Elements the shape describes.
        numel: u64,
        /// Elements in the buffer.
        len: usize,
    },
    /// Host access to data that is not ready yet (pending device work).
    #[error(
        "the tensor has pending device work (expected it ready; synchronize through its adapter first)"
    )]
    NotReady,
    /// Write access to a read-only tensor.
    #[error("the tensor is read-only (expected a writable tensor)")]
    ReadOnly,
    /// A layout in which two elements may share an address, given where each element must
    /// have its own (a kernel's in-place output): the check is conservative and refuses
    /// what it cannot prove free of overlap.
    #[error(
        "dimension {dim} (size {size}, stride {stride}) may reach the same addresses as the dimensions inside it, which span {inner} elements (expected a layout in which no two elements share an address: each stride, in increasing magnitude, larger than the span of the smaller ones)"
    )]
    SelfOverlap {
        /// The dimension whose stride is too small.
        dim: usize,
        /// Its size.
        size: i64,
        /// Its stride in elements.
        stride: i64,
        /// The elements the dimensions with smaller strides reach (inclusive span).
        inner: i64,
    },
    /// Two tensors of one call whose bytes overlap, where one of them is written.
    #[error(
        "argument {written} is written but its bytes [{written_lo:#x}, {written_hi:#x}) overlap those of argument {other}, [{other_lo:#x}, {other_hi:#x}) on {device} (expected an output disjoint from every other argument; pass a separate tensor, or a copy)"
    )]
    Aliased {
        /// The written argument's position.
        written: usize,
        /// Its first byte.
        written_lo: usize,
        /// One past its last byte.
        written_hi: usize,
        /// The other argument's position.
        other: usize,
        /// Its first byte.
        other_lo: usize,
        /// One past its last byte.
        other_hi: usize,
        /// The device both are on.
        device: Device,
    },
    /// An index with the wrong rank or out of bounds.
    #[error("index {index:?} is out of bounds for shape {shape:?}")]
    IndexOutOfBounds {
        /// The index given.
        index: Vec<i64>,
        /// The tensor's shape.
        shape: Vec<i64>,
    },
    /// A stream integer that the convention does not allow.
    #[error(
        "stream {value} is not valid for {convention} (expected {})",
        convention.valid_values()
    )]
    InvalidStream {
        /// The integer found.
        value: i64,
        /// The convention it was read under.
        convention: StreamConvention,
    },
    /// A stream that a convention has no integer for.
    #[error(
        "{convention} has no value for the {} (expected one of: {})",
        stream.describe(),
        convention.valid_values()
    )]
    StreamNotRepresentable {
        /// The stream.
        stream: Stream,
        /// The convention.
        convention: StreamConvention,
    },
}
