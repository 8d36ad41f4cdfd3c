//! The crate's one error type.

/// Everything this crate refuses. The core's refusals pass through unchanged as
/// [`Error::Core`] and candle's own as [`Error::Candle`].
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A refusal of the core (layout arithmetic, dtype, readiness, access).
    #[error(transparent)]
    Core(#[from] tensorbridge_core::Error),

    /// An error candle returned (a tensor it could not make or move).
    #[error(transparent)]
    Candle(#[from] candle_core::Error),

    /// A candle dtype without a fixed layout the core can describe.
    #[error(
        "candle dtype {dtype} has no tensorbridge equivalent (expected u8, u32, i16, i32, i64, bf16, f16, f32, f64, f8e4m3 or f8e8m0; candle stores the fp6/fp4 types as raw bytes of its own layout)"
    )]
    UnsupportedCandleDType {
        /// candle's name for it.
        dtype: &'static str,
    },

    /// A tensorbridge dtype candle has no storage for.
    #[error(
        "dtype {dtype} has no candle equivalent (expected uint8, uint32, int16, int32, int64, bfloat16, float16, float32, float64, float8_e4m3fn or float8_e8m0fnu)"
    )]
    UnsupportedDType {
        /// The tensor's dtype.
        dtype: tensorbridge_core::DType,
    },

    /// A candle device this build cannot reach.
    #[error(
        "candle tensors on {device} are not supported by this build (expected cpu, or cuda with tensorbridge-candle's `cuda` feature)"
    )]
    UnsupportedDevice {
        /// candle's device, as it prints it.
        device: String,
    },

    /// A candle layout that reaches outside its own storage (candle's invariant broken).
    #[error(
        "the candle layout reaches element {reach} of a storage of {len} elements (expected every element inside the storage)"
    )]
    OutsideStorage {
        /// One past the highest element reached.
        reach: u128,
        /// Elements in the storage.
        len: usize,
    },

    /// A conversion into candle that cannot share memory; the message names what does.
    #[error("{what} cannot become a candle tensor without a copy: {why} (use {instead})")]
    NotZeroCopy {
        /// What was asked for.
        what: &'static str,
        /// Why candle cannot take it.
        why: &'static str,
        /// The function that does it (a copy, or a zero-copy path with other terms).
        instead: &'static str,
    },

    /// A tensor and a candle device that are not the same device.
    #[error(
        "the tensor is on {tensor} but the candle device is {candle} (expected the same device)"
    )]
    DeviceMismatch {
        /// The tensor's device.
        tensor: tensorbridge_core::Device,
        /// The candle device, as it prints it.
        candle: String,
    },

    /// A CUDA driver call that failed (the `cuda` feature).
    #[error("CUDA driver call {call} failed: {message}")]
    Driver {
        /// The call.
        call: &'static str,
        /// cudarc's description of the error.
        message: String,
    },

    /// A scoped borrow asked of a candle tensor that is not on the host.
    #[error(
        "lend borrows host tensors only, found a tensor on {device} (expected cpu; use the `unsafe` import for CUDA tensors)"
    )]
    NotHost {
        /// candle's device, as it prints it.
        device: String,
    },
}
