//! The crate's one error type.

/// Everything this crate refuses. The core's refusals pass through unchanged as
/// [`Error::Core`].
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Error {
    /// A refusal of the core (host access, readiness, layout arithmetic).
    #[error(transparent)]
    Core(#[from] tensorbridge_core::Error),

    /// A burn dtype without a plain element layout the core can describe.
    #[error(
        "burn dtype {dtype} has no tensorbridge equivalent (expected f64, f32, flex32, f16, bf16, i64, i32, i16, i8, u64, u32, u16, u8 or bool stored as bytes)"
    )]
    UnsupportedBurnDType {
        /// burn's name for it.
        dtype: String,
    },

    /// A tensorbridge dtype burn-flex has no storage for.
    #[error(
        "dtype {dtype} has no burn-flex equivalent (expected float64, float32, float16, bfloat16, int8..int64 or uint8..uint64)"
    )]
    UnsupportedDType {
        /// The tensor's dtype.
        dtype: tensorbridge_core::DType,
    },

    /// A burn layout that reaches outside its own storage (burn's invariant broken).
    #[error(
        "the burn layout reaches bytes [{lo}, {hi}) of a storage of {len} bytes (expected every element inside the storage)"
    )]
    OutsideStorage {
        /// Lowest byte reached, from the storage's start (may be negative).
        lo: i128,
        /// One past the highest byte reached.
        hi: i128,
        /// The storage's length in bytes.
        len: usize,
    },

    /// A high-level burn tensor that is not a burn-flex tensor, or of another rank or kind.
    #[error("{what} (expected {expected})")]
    WrongBurnTensor {
        /// What was found.
        what: String,
        /// What was expected.
        expected: &'static str,
    },
}
