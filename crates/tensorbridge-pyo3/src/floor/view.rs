//! The `tensorbridge.View` object itself: the tensor it shows and its cached interface
//! dicts. The import recognises its own views by this type; what a view exports (its Python
//! methods) is the export's (`export/view.rs`).

use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyDict;
use tensorbridge_core::Tensor;

use crate::floor::access::Provenance;

/// A zero-copy view of tensor memory that someone else owns, which keeps that memory (and
/// the object it came from) alive while the view, or anything made from it, lives.
///
/// Made by `tensorbridge.asview` and `tensorbridge.from_ptr` in Python, and by
/// [`export`](crate::export) in Rust. Immutable: every attribute is fixed at creation.
///
/// Also a DLPack C exchange API producer: the type's `__dlpack_c_exchange_api__` (and
/// `__c_dlpack_exchange_api__`) lets tvm-ffi, dlpark and cuda.core take a view without a
/// Python call; its `current_work_stream` is the legacy default stream, where the data is
/// made ready.
#[pyclass(module = "tensorbridge", name = "View", frozen)]
pub struct View {
    pub(crate) tensor: Tensor,
    /// `__cuda_array_interface__`, built on first access: the view
    /// is immutable, and consumers such as CuPy and Numba read the dict on every import
    /// (building it costs more than the rest of their import; measured in
    /// `benches/python/compare.py`). Each access returns a copy, so a consumer that edits its
    /// dict cannot change what the next one reads.
    pub(crate) cai: PyOnceLock<Py<PyDict>>,
    /// The same for `__array_interface__` (pinned host memory has both).
    pub(crate) ai: PyOnceLock<Py<PyDict>>,
    /// Why the tensor is read-only, where that changes what the view hands out
    /// (`crate::floor::access`).
    pub(crate) provenance: Provenance,
}

impl View {
    /// A view of `tensor`. A read-only tensor goes out only where its flag goes with it
    /// (`Provenance::Flagged`): no legacy capsule.
    pub fn new(tensor: Tensor) -> View {
        View::with_provenance(tensor, Provenance::Flagged)
    }

    /// A view of `tensor`, read-only for the reason `provenance` gives.
    pub(crate) fn with_provenance(tensor: Tensor, provenance: Provenance) -> View {
        View {
            tensor,
            cai: PyOnceLock::new(),
            ai: PyOnceLock::new(),
            provenance,
        }
    }

    /// The tensor this view shows.
    pub fn tensor(&self) -> &Tensor {
        &self.tensor
    }

    /// Why the tensor is read-only (`crate::floor::access`).
    pub(crate) fn provenance(&self) -> Provenance {
        self.provenance
    }
}
