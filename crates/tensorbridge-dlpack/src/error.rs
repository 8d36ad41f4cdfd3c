//! The crate's one error type, and the import error that gives a rejected managed tensor back.

use std::fmt;
use std::ptr::NonNull;

use dlpark::ManagedTensorBase;
use tensorbridge_core::{DType, Device};

use crate::import::ManagedOwner;

/// Everything this crate refuses. Messages say what was expected and what was found.
///
/// The core's validation errors (unknown dtype or device codes, rank disagreement,
/// misalignment, null data with elements...) are wrapped transparently in [`Error::Core`].
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A versioned managed tensor of another major version: its layout may differ, so only
    /// its deleter was called.
    #[error("DLPack major version {found} is not supported (expected {expected})")]
    UnsupportedMajorVersion {
        /// The major version the producer declared.
        found: u32,
        /// The major version this crate reads (`DLPACK_MAJOR_VERSION`).
        expected: u32,
    },
    /// `ndim < 0`.
    #[error("ndim is {ndim} (expected ndim >= 0)")]
    NegativeRank {
        /// The rank found.
        ndim: i32,
    },
    /// A null `shape` for a tensor with dimensions.
    #[error("shape is null but ndim is {ndim} (null is allowed only when ndim is 0)")]
    NullShape {
        /// The rank found.
        ndim: i32,
    },
    /// Null `strides` from a producer of DLPack 1.2 or later, which the 1.2 header forbids
    /// for `ndim != 0` (accepted, as compact row-major, from legacy and 1.0/1.1 producers).
    #[error(
        "strides are null for ndim {ndim} but DLPack {major}.{minor} requires them (null strides are accepted only from legacy and 1.0/1.1 producers)"
    )]
    NullStrides {
        /// The declared major version.
        major: u32,
        /// The declared minor version.
        minor: u32,
        /// The rank found.
        ndim: i32,
    },
    /// Flag bits that DLPack 1.3 does not define: a newer minor version gave them a meaning
    /// this crate cannot honour.
    #[error(
        "flags {flags:#x} set bits DLPack 1.3 does not define (expected only READ_ONLY, IS_COPIED and IS_SUBBYTE_TYPE_PADDED, mask 0x7)"
    )]
    UnknownFlags {
        /// The whole `flags` field found.
        flags: u64,
    },
    /// One of this crate's own exports, edited after it was handed out (through ctypes,
    /// say) to describe memory outside what it lent.
    #[error(
        "a DLPack export of tensorbridge's own was edited to reach bytes {found_lo:#x}..{found_hi:#x} on {found_device}, outside the bytes {lent_lo:#x}..{lent_hi:#x} on {lent_device} it lent (expected a description inside what was exported)"
    )]
    EditedExport {
        /// The device the edited struct names.
        found_device: Device,
        /// The first byte it reaches.
        found_lo: usize,
        /// One past the last byte it reaches.
        found_hi: usize,
        /// The device of the exported tensor.
        lent_device: Device,
        /// The first byte the export lent.
        lent_lo: usize,
        /// One past the last byte it lent.
        lent_hi: usize,
    },
    /// Export of a read-only tensor as a legacy managed tensor, which has no flag to say so,
    /// without [`ReadOnlyPolicy::Discard`](crate::ReadOnlyPolicy::Discard).
    #[error(
        "the tensor is read-only but a legacy DLManagedTensor has no read-only flag (expected a versioned export, or ReadOnlyPolicy::Discard to drop the flag knowingly)"
    )]
    ReadOnlyToLegacy,
    /// Export of padded sub-byte data as a legacy managed tensor, which has no flag to say so
    /// (legacy sub-byte data is packed).
    #[error(
        "dtype {dtype} is padded, but a legacy DLManagedTensor can only describe packed sub-byte data (expected a versioned export)"
    )]
    PaddedToLegacy {
        /// The sub-byte dtype.
        dtype: DType,
    },
    /// More dimensions than DLPack's `int32_t ndim` holds.
    #[error("the tensor has {ndim} dimensions (expected at most {max})", max = i32::MAX)]
    RankTooLarge {
        /// The rank found.
        ndim: usize,
    },
    /// The core refused the descriptor (or, on export, the device ordinal).
    #[error(transparent)]
    Core(#[from] tensorbridge_core::Error),
}

/// A refused import. It holds the managed tensor it was given, until the caller takes it back
/// with [`ImportError::into_inner`]; dropping the error (or turning it into an [`Error`])
/// releases the tensor by calling the producer's deleter, once.
///
/// The one exception is a foreign major version: DLPack tells the consumer to call the
/// deleter and read nothing else, which the import did before returning, so
/// [`ImportError::into_inner`] gives back `None`.
pub struct ImportError<M: ManagedTensorBase> {
    error: Error,
    managed: Option<ManagedOwner<M>>,
}

impl<M: ManagedTensorBase> ImportError<M> {
    /// A refusal that keeps the managed tensor for the caller.
    pub(crate) fn given_back(error: Error, managed: ManagedOwner<M>) -> Self {
        ImportError {
            error,
            managed: Some(managed),
        }
    }

    /// A refusal whose managed tensor the import already released.
    pub(crate) fn released(error: Error) -> Self {
        ImportError {
            error,
            managed: None,
        }
    }

    /// Why the import was refused.
    pub fn error(&self) -> &Error {
        &self.error
    }

    /// Whether the error still holds the managed tensor (false only after a foreign major
    /// version, whose deleter already ran).
    pub fn holds_managed(&self) -> bool {
        self.managed.is_some()
    }

    /// Takes the managed tensor back, without calling its deleter: ownership returns to the
    /// caller, as it was before the import (call the deleter, hand it on, or retry).
    /// `None` when the import already released it (foreign major version).
    pub fn into_inner(mut self) -> Option<NonNull<M>> {
        self.managed.take().map(ManagedOwner::into_raw)
    }

    /// The reason, after releasing the managed tensor (the deleter runs now, unless it
    /// already ran).
    pub fn into_error(self) -> Error {
        let ImportError { error, managed } = self;
        drop(managed);
        error
    }
}

impl<M: ManagedTensorBase> From<ImportError<M>> for Error {
    /// Releases the managed tensor, so `?` in a function returning [`Error`] neither leaks
    /// nor double-frees it.
    fn from(e: ImportError<M>) -> Error {
        e.into_error()
    }
}

impl<M: ManagedTensorBase> fmt::Debug for ImportError<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ImportError")
            .field("error", &self.error)
            .field("holds_managed", &self.holds_managed())
            .finish()
    }
}

impl<M: ManagedTensorBase> fmt::Display for ImportError<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.error, f)
    }
}

impl<M: ManagedTensorBase> std::error::Error for ImportError<M> {
    /// The reason's own source: `Display` already prints the reason itself.
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        std::error::Error::source(&self.error)
    }
}
