//! The crate's one error type, and the error of a consuming conversion that gives its input
//! back.

use std::fmt;

/// Everything this crate refuses. The core's refusals (not host memory, wrong dtype, not
/// ready, read-only, overlapping elements for a writable view) pass through unchanged as
/// [`Error::Core`].
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A refusal of the core (device, dtype, readiness, access, overlap, arithmetic).
    #[error(transparent)]
    Core(#[from] tensorbridge_core::Error),

    /// A view asked for with a fixed number of dimensions (`Ix2`, ...) that the tensor does
    /// not have.
    #[error(
        "the tensor has {found} dimensions (expected {expected} for the requested ndarray dimension type; ask for IxDyn to take any rank)"
    )]
    RankMismatch {
        /// Dimensions of the requested ndarray dimension type.
        expected: usize,
        /// Dimensions of the tensor.
        found: usize,
    },
}

/// A refused consuming conversion ([`import`](crate::import)): the error and the array,
/// given back whole ([`ImportError::into_inner`]).
pub struct ImportError<A> {
    error: Error,
    array: A,
}

impl<A> ImportError<A> {
    pub(crate) fn new(error: Error, array: A) -> Self {
        ImportError { error, array }
    }

    /// What was refused.
    pub fn error(&self) -> &Error {
        &self.error
    }

    /// The array, untouched.
    pub fn into_inner(self) -> A {
        self.array
    }
}

impl<A> fmt::Debug for ImportError<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ImportError")
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

impl<A> fmt::Display for ImportError<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.error, f)
    }
}

impl<A> std::error::Error for ImportError<A> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.error)
    }
}

impl<A> From<ImportError<A>> for Error {
    /// Drops the array (which frees it) and keeps the error.
    fn from(e: ImportError<A>) -> Error {
        e.error
    }
}
