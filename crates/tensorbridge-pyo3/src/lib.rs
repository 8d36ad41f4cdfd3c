//! Python tensors for PyO3 extension authors, and the `tensorbridge` Python module: any
//! Python tensor or array becomes a tensorbridge [`Tensor`] without a copy ([`extract`],
//! [`AnyTensor`]), and any [`Tensor`] becomes a Python object every framework takes
//! ([`into_py`], [`View`]). The wheel (`crates/tensorbridge-python`) is this crate's
//! [`register`] in a `#[pymodule]`.
//!
//! | direction | call | data | stream |
//! |---|---|---|---|
//! | Python -> [`Tensor`] | [`extract`], [`AnyTensor`], `unsafe` [`extract_on`]; Python `tensorbridge.asview` | zero-copy, the producer object kept alive | [`extract`]: the tensor carries the producer's readiness (its current stream, or the stream its protocol names), nothing is enqueued; [`extract_on`]: the caller's stream is ordered after the producer, on the GPU, and the tensor is [`Ready::Stream`](tensorbridge::Ready::Stream) of it |
//! | [`Tensor`] -> Python | [`into_py`] gives a [`View`] | zero-copy | kept in the view; each consumer's stream waits for it on the GPU |
//! | [`View`] -> DLPack consumer | `view.__dlpack__(stream=, max_version=, dl_device=, copy=)` | zero-copy; a copy for `copy=True` and for `dl_device=(1, 0)` from CUDA (`IS_COPIED`) | the consumer's stream waits (`cuStreamWaitEvent`); the host never blocks, except for the host copy, which the protocol makes synchronous |
//! | [`View`] -> CAI / array interface consumer | `__cuda_array_interface__`, `__array_interface__` | zero-copy | CAI v3 `stream`: the view's producer stream |
//! | address -> [`View`] | Python `tensorbridge.from_ptr` | zero-copy; on CUDA the driver checks the span | the producer stream given |
//!
//! # The import order
//! [`extract`] tries, in this order:
//! 1. a [`View`] of this crate (its tensor, as it is);
//! 2. the DLPack C exchange API of `type(obj)` (`__dlpack_c_exchange_api__`, a DLPack 1.3
//!    capsule, or `__c_dlpack_exchange_api__`, the 1.2 int), which PyTorch 2.11 publishes:
//!    no Python call, and the caller's stream is ordered after the producer's current work
//!    stream here;
//! 3. `obj.__dlpack__(max_version=(1, 3), stream=...)`, retried without `max_version` on
//!    `TypeError` for producers older than DLPack 1.0; a stream is passed only for device
//!    memory, after asking `__dlpack_device__`;
//! 4. a DLPack capsule itself (`dltensor` or `dltensor_versioned`, renamed `used_*` when
//!    consumed; a used capsule is refused with `BufferError`);
//! 5. `__cuda_array_interface__`, versions 0 to 3: the driver names the device and checks the
//!    span when it can be loaded; the interface's `stream` becomes the tensor's readiness (an
//!    event and a GPU-side wait when used, never a host synchronisation);
//! 6. `__array_interface__` (pointer or buffer form);
//! 7. the buffer protocol (`bytes`, `bytearray`, `array.array`, `memoryview`, `mmap`...).
//!
//! Anything else is a `TypeError` that names the type and the protocols tried.
//!
//! ```no_run
//! use pyo3::prelude::*;
//! use tensorbridge_pyo3::AnyTensor;
//!
//! /// Sums a float32 host array from any framework, without copying it.
//! #[pyfunction]
//! fn total(x: AnyTensor) -> PyResult<f32> {
//!     let view = x.0.host_view::<f32>().map_err(tensorbridge_pyo3::Error::from)?;
//!     Ok(view.iter().sum())
//! }
//! ```
//!
//! # Errors
//! [`Error`] is mapped to Python exceptions in one place: `TypeError` for objects of the
//! wrong kind, `ValueError` for bad values (dtype names, shapes, strides, pointers, streams),
//! `BufferError` for DLPack protocol problems (used capsules, refused copies, read-only data
//! to a legacy capsule), `RuntimeError` for failing CUDA driver calls. A producer's own
//! exception passes through unchanged.
//!
//! # Ownership
//! - **Import**: the tensor's owner holds the producer object (a strong reference) and what
//!   the protocol hands over: the DLPack managed tensor, whose deleter runs once when the
//!   last clone is dropped; the held buffer-protocol view, released once. Capsules are
//!   consumed exactly once: renamed before the import can fail, so a refused import releases
//!   the tensor through our owner and never through the capsule. Owners may be dropped on any
//!   thread and inside other frameworks' deleters (PyTorch runs them with the GIL released,
//!   even where pyo3 believes it is held): they take the GIL as the interpreter reports it
//!   (`PyGILState_Check`/`PyGILState_Ensure`, not pyo3's thread-local count), release Python
//!   objects at once with raw reference counting, and leak them if the interpreter is gone
//!   or finalising.
//! - **Export**: a capsule owns its managed tensor until a consumer renames it; Python
//!   destroying an unconsumed capsule releases it (keeping any exception in flight). The
//!   managed tensor holds a clone of the tensor's owner, so the memory outlives the view
//!   as long as the consumer needs it.
//! - **`from_ptr`**: `owner` is held and `release()` called exactly once, when the last user
//!   (view, DLPack consumer, clone) is gone. An exception `release()` raises is reported as
//!   unraisable (`sys.unraisablehook`).
//! - **Exceptions in flight**: every destructor (owners, capsules) stashes the exception in
//!   flight with the raw `PyErr_Fetch`/`PyErr_Restore` and puts it back unchanged: a
//!   `PanicException` propagating past a dying capsule is never resumed as a Rust panic
//!   inside the C callback (which would abort the process).
//!
//! # Threads and free-threaded Python
//! Nothing here relies on the GIL for mutual exclusion, so a module may declare
//! `#[pymodule(gil_used = false)]` (the wheel does). Consuming a capsule (read its name, take
//! the pointer, rename it) is one critical section on the capsule
//! (`pyo3::sync::critical_section::with_critical_section`, a no-op on GIL builds): of several
//! threads consuming one capsule, exactly one gets the tensor and the others a
//! `BufferError`. A free-threaded interpreter needs a build of this crate without `abi3`.
//!
//! # Limitations
//! - Streams are trusted like pointers: a stream integer given to `asview`, to
//!   [`extract_on`] or to `from_ptr`, or handed to `__dlpack__` by a consumer, is handed to
//!   the driver. A handle must name a live stream of the data's device; one that a tensor's
//!   readiness names must stay alive as long as the tensor does (the CUDA Array Interface's
//!   own rule for exported streams).
//! - Host memory from Python is shared, not borrowed: host views of an extracted tensor
//!   assume Python code does not write the memory meanwhile (the same assumption rust-numpy
//!   makes without its borrow checker). Host pointers given to `from_ptr` cannot be checked.
//! - Copies (`copy=True`, or the host for a CUDA view) take the span the strides reach
//!   verbatim; CUDA device memory is copied on the device; pinned and managed memory only to
//!   the host. A device copy is freed with `cuMemFree`, which waits for work still using it.
//! - The buffer protocol is declared by this crate for Python 3.9 and 3.10 (pyo3 offers it
//!   only for the 3.11 limited API); PyPy and GraalPy are not supported.
//! - ROCm tensors import and export, but without stream ordering (no ROCm driver here).

#![cfg_attr(docsrs, feature(doc_cfg))]

mod attach;
mod buffer;
mod capsule;
mod convert;
mod copy;
mod error;
mod exchange;
mod ffi;
mod import;
mod interfaces;
mod owner;
mod python;
mod view;

use pyo3::prelude::*;
use tensorbridge::Tensor;

pub use error::Error;
pub use view::View;

/// Imports any Python tensor or array zero-copy, in the order of the crate docs. Nothing is
/// enqueued on any stream: the tensor carries the producer's readiness (PyTorch's current
/// stream through the DLPack C exchange API; the legacy default stream, which
/// `__dlpack__(stream=None)` orders, for other DLPack producers; the CUDA Array Interface's
/// `stream`), and whoever uses it on a stream orders against that
/// ([`tensorbridge_cuda::make_ready_on`], the cudarc adapter's views, `View.__dlpack__`).
///
/// Safe: it trusts the producer's protocol implementation as every consumer does (DLPack
/// structs, interface dicts and buffers describe memory their exporter keeps valid, and the
/// streams they name live as long as the framework requires of its users).
pub fn extract(obj: &Bound<'_, PyAny>) -> PyResult<Tensor> {
    // SAFETY: no stream: only the legacy default stream is named, which is always live.
    Ok(unsafe { import::import(obj, None) }?)
}

/// [`extract`] for a caller who will use the data on `stream` (DLPack's integer conventions:
/// `None`, `-1` for no synchronisation, `1`, `2`, or a `cudaStream_t` handle; 0 is refused).
/// On return, work enqueued on that stream sees the producer's data; the host is never
/// blocked.
///
/// # Safety
/// 1. A handle in `stream` names a live CUDA stream of the device the data is on (in its
///    primary context, as PyTorch's, CuPy's and JAX's streams are) during the call, and for
///    as long as the returned tensor or a clone of it lives (its readiness may name it);
///    `2` (the per-thread default stream) is used only on the calling thread.
pub unsafe fn extract_on(obj: &Bound<'_, PyAny>, stream: Option<i64>) -> PyResult<Tensor> {
    // SAFETY: obligation 1 is `import`'s.
    Ok(unsafe { import::import(obj, stream) }?)
}

/// A function argument that accepts any Python tensor or array ([`extract`]).
#[derive(Clone, Debug)]
pub struct AnyTensor(pub Tensor);

impl<'a, 'py> FromPyObject<'a, 'py> for AnyTensor {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        extract(&obj).map(AnyTensor)
    }
}

/// A [`View`] of `tensor`, as a Python object: what every framework takes zero-copy.
pub fn into_py(py: Python<'_>, tensor: Tensor) -> PyResult<Bound<'_, PyAny>> {
    Ok(Bound::new(py, View::new(tensor))?.into_any())
}

/// Adds `View`, `asview` and `from_ptr` to a Python module (what the `tensorbridge` wheel's
/// `#[pymodule]` does).
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<View>()?;
    m.add_function(wrap_pyfunction!(python::asview, m)?)?;
    m.add_function(wrap_pyfunction!(python::from_ptr, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
