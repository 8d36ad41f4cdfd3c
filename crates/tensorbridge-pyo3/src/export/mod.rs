//! The core -> Python: `View`, the object every framework takes zero-copy, and what it
//! exports (DLPack capsules, the DLPack C exchange API, the CUDA Array Interface and NumPy's
//! array interface, copies on request).

pub(crate) mod capsule;
pub(crate) mod copy;
pub(crate) mod exchange;
pub(crate) mod interfaces;
pub(crate) mod pydtype;
pub(crate) mod view;

use tensorbridge_core::Tensor;

use crate::error::{Error, Result};

/// Refuses layouts with a negative stride on a dimension that has more than one element:
/// torch 2.11's `from_dlpack` aborts the process on them (no exception to catch), and a producer
/// cannot tell its consumers apart.
pub(crate) fn refuse_negative_strides(t: &Tensor) -> Result<()> {
    if t.numel() == 0 {
        return Ok(());
    }
    match t
        .shape()
        .iter()
        .zip(t.strides_elems())
        .position(|(&n, &s)| n > 1 && s < 0)
    {
        Some(dim) => Err(Error::NegativeStrides {
            dim,
            stride: t.strides_elems()[dim],
        }),
        None => Ok(()),
    }
}
