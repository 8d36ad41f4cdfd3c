//! The crate's one error type.

use std::ops::Range;

use tensorbridge_core::{DType, Device};

use crate::model::DescrDisplay;
use crate::typestr::HOST_ENDIAN;
use crate::{DescrField, Interface, TypeStr, TypeStrProblem};

/// Everything this crate refuses. Messages say what was expected and what was found; the
/// core's refusals (layout, alignment, null data...) pass through unchanged as [`Error::Core`].
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A refusal of the core (layout, alignment, null data, overflow...).
    #[error(transparent)]
    Core(#[from] tensorbridge_core::Error),

    // ---- typestr ----
    /// A string that is not `<byteorder><kind><size>`.
    #[error(
        "malformed typestr {typestr:?}: {problem} (expected <byteorder><kind><size>, like \"<f4\")"
    )]
    MalformedTypeStr {
        /// The string given.
        typestr: String,
        /// What is wrong with it.
        problem: TypeStrProblem,
    },
    /// A well-formed typestr that names no core dtype.
    #[error(
        "typestr {typestr} has no core dtype (expected |b1, i or u of 1/2/4/8 bytes, f2/f4/f8, c8/c16, or V with ImportOptions::void_as)"
    )]
    UnsupportedTypeStr {
        /// The typestr.
        typestr: TypeStr,
    },
    /// Multi-byte items stored in the other byte order.
    #[error(
        "typestr {typestr} is {} but this machine is {HOST_ENDIAN} (expected native byte order: '=', '|' or the machine's own)",
        .typestr.byte_order.describe()
    )]
    NonNativeByteOrder {
        /// The typestr.
        typestr: TypeStr,
    },
    /// Raw bytes (`V`) without the caller saying what they are.
    #[error(
        "typestr {typestr} is raw bytes that do not say which dtype they hold (expected ImportOptions::void_as, e.g. bfloat16 for <V2)"
    )]
    VoidNeedsDType {
        /// The typestr.
        typestr: TypeStr,
    },
    /// Raw bytes whose size differs from the dtype the caller named.
    #[error(
        "typestr {typestr} has items of {} bytes but ImportOptions::void_as is {dtype} of {} bytes",
        .typestr.size.unwrap_or(0),
        crate::typestr::padded_itemsize(*.dtype)
    )]
    VoidSizeMismatch {
        /// The typestr.
        typestr: TypeStr,
        /// The dtype the caller named.
        dtype: DType,
    },
    /// A core dtype that no typestr convention names.
    #[error(
        "dtype {dtype} has no typestr: no convention exists (NumPy has no such type and neither CuPy nor PyTorch exports one)"
    )]
    NoTypeStr {
        /// The dtype.
        dtype: DType,
    },

    // ---- the other keys ----
    /// A `version` this crate does not read.
    #[error("interface version {version} is not supported (expected 0 to 3)")]
    UnsupportedVersion {
        /// The version found.
        version: i64,
    },
    /// A `mask` other than `None`.
    #[error("mask is set (expected None: masked arrays are not supported)")]
    Masked,
    /// A `descr` that describes a structured dtype rather than the typestr's.
    #[error(
        "descr {} describes a structured dtype (expected None or [('', '{typestr}')])",
        DescrDisplay(.descr)
    )]
    StructuredDescr {
        /// The descr found.
        descr: Vec<DescrField>,
        /// The typestr it should have repeated.
        typestr: TypeStr,
    },
    /// A CAI `stream` integer that v3 does not allow.
    #[error(
        "stream {value} is not allowed by the CUDA Array Interface (expected None, 1, 2 or a stream handle above 2; 0 is disallowed)"
    )]
    InvalidStream {
        /// The integer found.
        value: i64,
    },
    /// A negative `offset`.
    #[error("offset {offset} is negative (expected a byte offset >= 0)")]
    NegativeOffset {
        /// The offset found.
        offset: i64,
    },
    /// Elements outside the buffer that `data` names.
    #[error(
        "the array reaches bytes {:#x}..{:#x} but its buffer spans {:#x}..{:#x}",
        .span.start, .span.end, .buffer.start, .buffer.end
    )]
    OutsideBuffer {
        /// The bytes the strides reach.
        span: Range<usize>,
        /// The buffer's bytes.
        buffer: Range<usize>,
    },

    // ---- devices and readiness ----
    /// Memory the interface cannot describe (or a device the caller named for import).
    #[error("{interface} cannot describe memory on {device} (expected {})", .interface.expected_devices())]
    UnsupportedDevice {
        /// The device.
        device: Device,
        /// The interface.
        interface: Interface,
    },
    /// A tensor whose readiness is an adapter signal that names no stream.
    #[error(
        "the tensor is ready per a signal with no producer stream (expected a stream: the CUDA Array Interface carries a stream, not an event)"
    )]
    NoProducerStream,
}
