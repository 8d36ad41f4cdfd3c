//! `tensorbridge.share`, `tensorbridge.open` and `tensorbridge.Handle`: a CUDA tensor of any
//! framework shared with another process of the same user on the same machine, zero-copy,
//! through the CUDA layer's `ipc` module (whose docs give the protocol and lifetime rules).
//!
//! The handle is a small object around the share's bytes: picklable (as its bytes, so it
//! travels through `multiprocessing`, `torch.multiprocessing`, Ray's object store or a
//! socket), comparable, and validated whenever it is made from bytes. In the producer's
//! process, the handle that `share` returned also holds the share: dropping it lets the share
//! go (after its expected consumers have opened it and every consumer has released it). In a
//! forked child, dropping the inherited handle changes nothing: the share is the parent's.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyTuple, PyType};
use tensorbridge_cuda::ipc::{self, IpcHandle, Shared};

use crate::View;
use crate::floor::stream::StreamArg;

/// Adds `Handle`, `share` and `open` to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Handle>()?;
    m.add_function(wrap_pyfunction!(share, m)?)?;
    m.add_function(wrap_pyfunction!(open, m)?)?;
    Ok(())
}

/// Handle(data)
/// --
///
/// A share of a CUDA tensor: what ``tensorbridge.share`` returns and ``tensorbridge.open``
/// takes. ``bytes(h)`` are the handle's bytes; ``Handle(data)`` makes one from them again
/// (checking the format, version, checksum, sizes and offsets: ``ValueError`` otherwise).
/// Pickles as its bytes.
///
/// Whoever holds the bytes can map the tensor's whole CUDA allocation, read and write, from
/// any process of the same user on the same machine while the share lives: treat them like an
/// open file descriptor. Another user's process is refused. They mean nothing on another
/// machine.
#[pyclass(module = "tensorbridge", name = "Handle", frozen)]
pub struct Handle {
    handle: IpcHandle,
    /// The producer's hold, in the process that shared (absent in handles made from bytes).
    /// Never read: held so that the share lives as long as this object.
    _shared: Option<Shared>,
}

fn bytes_of(data: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    if let Ok(b) = data.cast::<PyBytes>() {
        return Ok(b.as_bytes().to_vec());
    }
    if let Ok(b) = data.cast::<PyByteArray>() {
        return Ok(b.to_vec());
    }
    if let Ok(view) = data.cast::<pyo3::types::PyMemoryView>() {
        let bytes = view.call_method0("tobytes")?;
        return Ok(bytes.cast::<PyBytes>()?.as_bytes().to_vec());
    }
    Err(PyTypeError::new_err(format!(
        "a share handle is a tensorbridge.Handle or its bytes (found an object of type {})",
        data.get_type().name()?
    )))
}

#[pymethods]
impl Handle {
    #[new]
    fn new(data: &Bound<'_, PyAny>) -> PyResult<Handle> {
        let bytes = bytes_of(data)?;
        Ok(Handle {
            handle: IpcHandle::from_bytes(&bytes).map_err(crate::Error::from)?,
            _shared: None,
        })
    }

    fn __bytes__<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, self.handle.as_bytes())
    }

    /// Pickles as ``Handle(bytes(self))``: the producer's hold stays with the original.
    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyType>, Bound<'py, PyTuple>)> {
        let py = slf.py();
        let bytes = PyBytes::new(py, slf.get().handle.as_bytes());
        Ok((slf.get_type(), PyTuple::new(py, [bytes])?))
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .cast::<Handle>()
            .is_ok_and(|o| o.get().handle.as_bytes() == self.handle.as_bytes())
    }

    fn __hash__(&self) -> u64 {
        // The handle's own checksum (its last eight bytes): already a hash of everything.
        let b = self.handle.as_bytes();
        let mut last = [0u8; 8];
        last.copy_from_slice(&b[b.len() - 8..]);
        u64::from_le_bytes(last)
    }

    /// The extents.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.handle.shape())
    }

    /// The strides, in elements.
    #[getter]
    fn strides<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.handle.strides_elems())
    }

    /// The core dtype name ("float32", "bfloat16", ...).
    #[getter]
    fn dtype_name(&self) -> String {
        self.handle.dtype().to_string()
    }

    /// Whether consumers may only read.
    #[getter]
    fn readonly(&self) -> bool {
        self.handle.is_readonly()
    }

    /// The GPU, as ``nvidia-smi -L`` names it ("GPU-xxxxxxxx-...").
    #[getter]
    fn device_uuid(&self) -> String {
        self.handle.device_uuid().to_string()
    }

    /// The producing process's id.
    #[getter]
    fn producer_pid(&self) -> u32 {
        self.handle.producer().pid
    }

    fn __repr__(&self) -> String {
        let shape = self
            .handle
            .shape()
            .iter()
            .map(i64::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        format!(
            "<tensorbridge.Handle {}[{shape}] on {} from process {}{}>",
            self.handle.dtype(),
            self.handle.device_uuid(),
            self.handle.producer().pid,
            if self.handle.is_readonly() {
                " readonly"
            } else {
                ""
            }
        )
    }
}

/// share(obj, *, consumers=1)
/// --
///
/// Shares a CUDA tensor of any framework (anything ``asview`` takes: torch, CuPy, JAX, Numba,
/// cuda.core, ``from_ptr``, a View) with other processes of this user on this machine,
/// zero-copy. Returns a ``Handle``: send it by any means (pickle it, or ``bytes(h)``), and
/// ``tensorbridge.open(h)`` in the other process gives a View of the same memory.
///
/// Work still pending on the producer's stream is waited for on the consumer's stream, on
/// the GPU; no host waits. The memory stays alive while this handle lives, and after it is
/// dropped until ``consumers`` processes have opened it and every process that opened it has
/// released its views (the consumer's GPU work on them finished first). ``consumers=0``:
/// openable only while this handle lives.
///
/// Refused with ``ValueError`` (saying why): host, pinned and managed memory, PyTorch's
/// expandable segments, stream-ordered pools (``cudaMallocAsync``).
#[pyfunction]
#[pyo3(signature = (obj, *, consumers=1))]
pub(crate) fn share(py: Python<'_>, obj: &Bound<'_, PyAny>, consumers: u32) -> PyResult<Handle> {
    let tensor = crate::import(obj)?;
    let shared = crate::ffi::exit::detach(py, || ipc::export(&tensor, consumers));
    let shared = shared.map_err(crate::Error::from)?;
    Ok(Handle {
        handle: shared.handle().clone(),
        _shared: Some(shared),
    })
}

/// open(handle, *, stream=None)
/// --
///
/// A View of the tensor another process shared (``handle``: a ``Handle`` or its bytes),
/// zero-copy, on the producer's GPU (found by UUID, whatever ``CUDA_VISIBLE_DEVICES``
/// numbers it here). Every framework takes it (``torch.from_dlpack``, ``cupy.asarray``,
/// ``jax.dlpack.from_dlpack``).
///
/// ``stream`` is the CUDA stream this process uses the data on, read as every ``stream=`` of
/// tensorbridge reads it (``None`` or ``1``: the legacy default stream; ``2``; a
/// ``cudaStream_t`` handle or a stream object, which must stay alive as long as the view;
/// ``0`` and ``-1`` raise ValueError): it waits,
/// on the GPU, for the producer's pending work, and when the last view (or tensor made from
/// it) is gone, the share is released after the work enqueued there by then has run. Opening
/// a handle again in this process maps the memory once.
///
/// Refused with ``ValueError``: a bad or altered handle, a GPU this process does not see, a
/// producer that has exited, a share already released; ``RuntimeError`` without a driver.
#[pyfunction]
#[pyo3(signature = (handle, *, stream=None))]
pub(crate) fn open(
    py: Python<'_>,
    handle: &Bound<'_, PyAny>,
    stream: Option<&Bound<'_, PyAny>>,
) -> PyResult<View> {
    let (consumer, _) = StreamArg::read(stream)?.stream_or_default("open")?;
    let handle = match handle.cast::<Handle>() {
        Ok(h) => h.get().handle.clone(),
        Err(_) => IpcHandle::from_bytes(&bytes_of(handle)?).map_err(crate::Error::from)?,
    };
    // SAFETY: the Python caller vouches for its stream handle (documented above, as for
    // `asview`'s `stream`): live, of a primary context, as long as the view and everything
    // made from it; `None` and 1 are the always-live legacy default stream.
    let tensor = crate::ffi::exit::detach(py, || unsafe { ipc::import_raw(&handle, consumer) });
    Ok(View::new(tensor.map_err(crate::Error::from)?))
}
