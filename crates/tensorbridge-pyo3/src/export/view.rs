//! `tensorbridge.View`: a [`Tensor`] as a Python object that every framework can take
//! (DLPack with the full array API signature, the CUDA Array Interface on CUDA, NumPy's
//! array interface on the host).

use pyo3::PyTraverseError;
use pyo3::exceptions::PyAttributeError;
use pyo3::gc::PyVisit;
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyDict, PyTuple};
use tensorbridge_cai::{ArrayInterface, CudaArrayInterface};
use tensorbridge_core::{
    DeviceType, Ready, Stream, StreamConvention, StreamRequest, Tensor, stream_from_wire,
};
use tensorbridge_dlpack::ffi::DlpackFlags;
use tensorbridge_dlpack::{ReadOnlyPolicy, export_legacy, export_versioned};

use crate::convert::stream_from_py;
use crate::error::{Error, Result};
use crate::export::capsule::{legacy_capsule, versioned_capsule};
use crate::export::copy;
use crate::export::interfaces::{array_to_py, cai_to_py};
use crate::export::refuse_negative_strides;
use crate::floor::access::Provenance;
use crate::floor::view::View;

impl View {
    /// `__dlpack__` with its arguments parsed.
    fn export<'py>(
        &self,
        py: Python<'py>,
        stream: Option<i64>,
        format: CapsuleFormat,
        requested: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> Result<Bound<'py, PyCapsule>> {
        // What the producer's `__dlpack__` refuses, this one refuses too (copies as well: the
        // producer refuses those), whatever flag it would carry: `torch.from_dlpack` ignores
        // the flag (`crate::floor::access`).
        if self.provenance == Provenance::Refused {
            return Err(Error::RequiresGrad);
        }
        let (exported, copied) = self.prepare_export(py, stream, requested, copy)?;
        if format == CapsuleFormat::Versioned {
            let mut managed = export_versioned(&exported)?;
            if copied {
                // SAFETY: the export describes a copy made for this consumer alone: no other
                // reference to its memory exists, and it is writable.
                unsafe { *managed.flags_mut() |= DlpackFlags::IS_COPIED };
            }
            Ok(versioned_capsule(py, managed)?)
        } else {
            // A legacy capsule cannot say read-only: it goes out read-only only where the
            // producer itself hands it out that way (`crate::floor::access`), and then as it would.
            if !crate::floor::access::flagless_allowed(exported.descriptor(), self.provenance) {
                return Err(Error::ReadOnlyLegacy);
            }
            let managed = export_legacy(&exported, ReadOnlyPolicy::Discard)?;
            Ok(legacy_capsule(py, managed)?)
        }
    }

    /// What [`export`](Self::export) hands over, before the DLPack struct is built: the
    /// tensor to export (this view's, or a copy) and whether it is a copy. The consumer's
    /// `stream` has been ordered after the producer when this returns. The DLPack C exchange
    /// API (`crate::export::exchange`) exports through this too.
    pub(crate) fn prepare_export(
        &self,
        py: Python<'_>,
        stream: Option<i64>,
        requested: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> Result<(Tensor, bool)> {
        let t = &self.tensor;
        let device = t.device();
        let own = device.to_dlpack()?;
        let requested = requested.unwrap_or(own);
        let to_host = requested != own;
        if to_host
            && !(requested == (DeviceType::Cpu.code(), 0) && device.kind.is_cuda_accessible())
        {
            return Err(Error::UnsupportedDlDevice {
                requested,
                own,
                device,
            });
        }
        if to_host && copy == Some(false) {
            return Err(Error::CopyRefused { requested, device });
        }
        // Streams order CUDA-accessible memory: device, managed and pinned. Everything else
        // (and the host copy, for which the protocol makes the producer synchronise) takes
        // `None`, or -1 which asks for nothing.
        let ordered = matches!(
            device.kind,
            DeviceType::Cuda | DeviceType::CudaManaged | DeviceType::CudaHost
        );
        // ROCm device memory takes the ROCm values of the protocol (None, -1, 0 for the
        // default stream, handles; 1 and 2 are CUDA's and refused). There is no ROCm runtime
        // here to order the consumer's stream with, so the value is checked and nothing is
        // enqueued: the data is ready where its producer said when it was imported (a
        // producer asked through `__dlpack__` synchronised on the default stream, which
        // orders against every blocking stream).
        let rocm = device.kind == DeviceType::Rocm && !to_host;
        if rocm {
            stream_from_wire(StreamConvention::DlpackRocm, stream)?;
        } else if (to_host || !ordered)
            && let Some(value) = stream.filter(|&v| v != -1)
        {
            return Err(Error::StreamOnHost {
                value,
                device: if to_host {
                    tensorbridge_core::Device::CPU
                } else {
                    device
                },
            });
        }
        let request = || stream_from_wire(StreamConvention::DlpackCuda, stream);
        let (exported, copied) = if to_host {
            (copy::to_host(py, t)?, true)
        } else if copy == Some(true) {
            let c = match device.kind {
                DeviceType::Cpu => copy::host_to_host(py, t)?,
                // SAFETY: the consumer's stream is live for the call: the DLPack protocol's
                // contract for `stream` ("the stream the consumer will use").
                DeviceType::Cuda => unsafe { copy::on_device(py, t, request()?) }?,
                _ => return Err(Error::CannotCopy { device }),
            };
            (c, true)
        } else {
            if device.kind == DeviceType::CudaHost && stream.is_none() {
                // Pinned memory to a consumer that passes no stream (NumPy, or any host
                // consumer): it reads on the host, so the data must be finished when it gets
                // the capsule. The protocol asks the producer to wait on the host here.
                if !t.ready().is_now() {
                    let done = crate::ffi::exit::detach(py, || tensorbridge_cuda::synchronize(t))?;
                    drop(done);
                }
            } else if ordered && let StreamRequest::Stream(consumer) = request()? {
                // SAFETY: as above: the consumer vouches that its stream is live; this only
                // enqueues a wait on it (GPU-side, the host does not block).
                unsafe { tensorbridge_cuda::make_ready_on_raw(t, consumer) }?;
            }
            refuse_negative_strides(t)?;
            (t.clone(), false)
        };
        Ok((exported, copied))
    }
}

/// Which DLPack struct a capsule carries: what the consumer's `max_version` asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum CapsuleFormat {
    /// `DLManagedTensorVersioned` in a `"dltensor_versioned"` capsule (`max_version >= (1, 0)`).
    Versioned,
    /// `DLManagedTensor` in a `"dltensor"` capsule (no `max_version`, or a major of 0): no
    /// version and no flags, so read-only views are refused, unless their producer hands
    /// them out that way itself (`crate::floor::access`).
    Legacy,
}

/// `(3, 1)`, `(3,)`, `()`, as Python prints tuples.
fn py_tuple(values: &[i64]) -> String {
    match values {
        [one] => format!("({one},)"),
        _ => format!(
            "({})",
            values
                .iter()
                .map(i64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

#[pymethods]
impl View {
    /// The address of element 0 (the data pointer plus any byte offset).
    #[getter]
    fn ptr(&self) -> usize {
        self.tensor.data_ptr()
    }

    /// Extents.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.tensor.shape())
    }

    /// Strides in elements (DLPack's and PyTorch's unit).
    #[getter]
    fn strides<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.tensor.strides_elems())
    }

    /// Strides in bytes (NumPy's and the CUDA Array Interface's unit).
    #[getter]
    fn byte_strides<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let bytes = self.tensor.strides_bytes().map_err(Error::from)?;
        PyTuple::new(py, bytes)
    }

    /// The element type as NumPy and JAX read it (`np.result_type(view)`,
    /// `jnp.asarray(view)`): a `numpy.dtype` where NumPy, or ml_dtypes for bfloat16 and the
    /// fp8/fp6/fp4 types, has one and can be imported; the core name (a `str`) otherwise
    /// (vector types, complex32, packed fp6/fp4). `str(view.dtype) == view.dtype_name`, and
    /// a `numpy.dtype` compares equal to that name (`view.dtype == "float32"`).
    #[getter]
    fn dtype(&self, py: Python<'_>) -> Py<PyAny> {
        crate::export::pydtype::dtype_object(py, self.tensor.dtype(), self.tensor.packing())
    }

    /// The element type's core name, always a `str`: `"float32"`, `"bfloat16"`, `"bool"`,
    /// `"complex64"`, `"float32x4"`...
    #[getter]
    fn dtype_name(&self) -> String {
        self.tensor.dtype().to_string()
    }

    /// Number of elements (the product of the shape; NumPy's `size`, torch's `numel()`).
    #[getter]
    fn size(&self) -> u64 {
        self.tensor.numel()
    }

    /// Where the memory lives: `"cpu"`, `"cuda:0"`, `"cuda_host"`, `"cuda_managed"`...
    #[getter]
    fn device(&self) -> String {
        self.tensor.device().to_string()
    }

    /// Whether consumers must not write.
    #[getter]
    fn readonly(&self) -> bool {
        self.tensor.is_readonly()
    }

    /// Bytes the elements occupy (`numel * itemsize`; packed sub-byte types rounded up).
    #[getter]
    fn nbytes(&self) -> u64 {
        self.tensor.nbytes()
    }

    /// Number of dimensions.
    #[getter]
    fn ndim(&self) -> usize {
        self.tensor.ndim()
    }

    /// Bytes of one element (rounded up for sub-byte types).
    #[getter]
    fn itemsize(&self) -> usize {
        self.tensor.dtype().itemsize()
    }

    /// The garbage collector's traversal: the Python objects the view's owner keeps alive
    /// (see `owner::visit_owner`), so that a cycle through them is collected.
    ///
    /// There is deliberately no `__clear__`: clearing a view would drop its owner and free
    /// (or release through `release()`) memory that the view's pointer, a NumPy array built
    /// on it, or an exported capsule may still be used through (objects in a cycle can
    /// still be reached from finalizers and weakref callbacks while the collector breaks
    /// the cycle). It is not needed either: a view is immutable and refers only to objects
    /// that existed before it, so every cycle through a view also runs through a mutable
    /// object (an instance's `__dict__`, a list), whose `tp_clear` breaks it; the view is
    /// then freed by its reference count, releasing its owner once. The cached interface
    /// dicts are not visited: they hold only numbers, strings and tuples of them, never a
    /// path back to the view.
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        crate::owner::visit_owner(self.tensor.owner(), &visit)
    }

    /// Exports the view as a DLPack capsule (the array API's `__dlpack__`).
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<Bound<'py, PyAny>>,
        max_version: Option<Bound<'py, PyAny>>,
        dl_device: Option<Bound<'py, PyAny>>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let stream = stream_from_py(stream.as_ref())?;
        let format = match max_version.filter(|v| !v.is_none()) {
            None => CapsuleFormat::Legacy,
            Some(v) => {
                let (major, minor): (i64, i64) = v.extract().map_err(|_| Error::MaxVersion {
                    found: v.repr().map(|r| r.to_string()).unwrap_or_default(),
                })?;
                if major < 0 || minor < 0 {
                    return Err(Error::MaxVersion {
                        found: format!("({major}, {minor})"),
                    }
                    .into());
                }
                if major >= 1 {
                    CapsuleFormat::Versioned
                } else {
                    CapsuleFormat::Legacy
                }
            }
        };
        let requested = match dl_device.filter(|d| !d.is_none()) {
            None => None,
            Some(d) => Some(d.extract::<(i32, i32)>().map_err(|_| Error::NotADevice {
                type_name: format!(
                    "{} (dl_device must be a (device_type, device_id) tuple)",
                    crate::convert::type_name(&d)
                ),
            })?),
        };
        Ok(self.export(py, stream, format, requested, copy)?)
    }

    /// `(device_type, device_id)` in DLPack's numbering (1 = CPU, 2 = CUDA, ...).
    fn __dlpack_device__(&self) -> PyResult<(i32, i32)> {
        Ok(self.tensor.device().to_dlpack().map_err(Error::from)?)
    }

    /// The CUDA Array Interface (version 3) of a CUDA, managed or pinned view; the view must
    /// stay alive while the pointer is used. `stream` is where the data becomes ready
    /// (`None` when nothing is pending). A readiness the interface cannot name (an event with
    /// no producer stream, as a view of CuPy's managed memory has) is served on the legacy
    /// default stream: it waits for the event on the GPU, and `stream` is `1`.
    /// `AttributeError` for host views and for dtypes the interface cannot name (fp8, fp4),
    /// so consumers fall back to DLPack.
    #[getter(__cuda_array_interface__)]
    fn cuda_array_interface<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        // CAI consumers (CuPy) may ignore `readonly`; the producer's own interface refuses
        // such a tensor (`crate::floor::access`).
        if self.provenance == Provenance::Refused {
            return Err(Error::RequiresGradInterface {
                interface: "__cuda_array_interface__",
            }
            .into());
        }
        let dict = self.cai.get_or_try_init(py, || -> PyResult<Py<PyDict>> {
            let t = &self.tensor;
            let unnamed = matches!(t.ready(), Ready::Signal(s) if s.producer_stream().is_none());
            let ready = if unnamed && t.device().kind.is_cuda_accessible() {
                // SAFETY: the legacy default stream is always live and not thread-bound.
                unsafe { tensorbridge_cuda::make_ready_on_raw(t, Stream::LegacyDefault) }
                    .map_err(Error::from)?;
                Ready::Stream(Stream::LegacyDefault)
            } else {
                t.ready().clone()
            };
            let cai =
                CudaArrayInterface::export_descriptor(t.descriptor(), &ready).map_err(|e| {
                    PyAttributeError::new_err(format!(
                        "this view has no __cuda_array_interface__: {e}"
                    ))
                })?;
            Ok(cai_to_py(py, &cai)?.unbind())
        })?;
        dict.bind(py).copy()
    }

    /// NumPy's array interface (version 3) of a host view; the view must stay alive while
    /// the pointer is used. Host memory CUDA still writes (pinned or managed memory with
    /// pending device work) is waited for on the host first, as the protocol's host
    /// consumers need (the GIL released meanwhile). `AttributeError` for device views and
    /// for dtypes NumPy cannot name (fp8, fp4), so consumers fall back to DLPack.
    #[getter(__array_interface__)]
    fn array_interface<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let dict = self.ai.get_or_try_init(py, || -> PyResult<Py<PyDict>> {
            let t = &self.tensor;
            if !t.ready().is_now() && t.device().kind.is_host_accessible() {
                crate::ffi::exit::detach(py, || tensorbridge_cuda::synchronize(t))
                    .map_err(Error::from)?;
            }
            let ai =
                ArrayInterface::export_descriptor(t.descriptor(), &Ready::Now).map_err(|e| {
                    PyAttributeError::new_err(format!("this view has no __array_interface__: {e}"))
                })?;
            Ok(array_to_py(py, &ai)?.unbind())
        })?;
        dict.bind(py).copy()
    }

    fn __repr__(&self) -> String {
        let t = &self.tensor;
        let shape = t
            .shape()
            .iter()
            .map(i64::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        format!(
            "<tensorbridge.View {}[{shape}] strides={} {} ptr={:#x} {}>",
            t.dtype(),
            py_tuple(t.strides_elems()),
            t.device(),
            t.data_ptr(),
            if t.is_readonly() {
                "readonly"
            } else {
                "readwrite"
            }
        )
    }
}
