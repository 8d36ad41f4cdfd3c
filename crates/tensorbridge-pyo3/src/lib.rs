//! Python tensors for PyO3 extension authors, and the `tensorbridge` Python module: any
//! Python tensor or array becomes a tensorbridge [`Tensor`] without a copy ([`import`],
//! [`AnyTensor`]), and any [`Tensor`] becomes a Python object every framework takes
//! ([`export`], [`View`]). The wheel (`crates/tensorbridge-python`) is this crate's
//! [`register`] in a `#[pymodule]`.
//!
//! | direction | call | data | stream |
//! |---|---|---|---|
//! | Python -> [`Tensor`] | [`import`], [`AnyTensor`], `unsafe` [`import_on_raw`]; Python `tensorbridge.asview` | zero-copy, the memory pinned (a PyTorch tensor's storage) and the producer object kept alive | [`import`]: the tensor carries the producer's readiness (its current stream when it outlives the tensor, else an event recorded on it; the stream its protocol names), nothing is enqueued; [`import_on_raw`]: the caller's stream is also ordered after the producer, on the GPU (and never named by the tensor) |
//! | Python -> a call's argument | [`TensorArg`] (`FromPyObject`) | zero-copy, borrowed for the call: no owner, no `View` | as [`import`] |
//! | [`Tensor`] -> Python | [`export`] gives a [`View`] | zero-copy | kept in the view; each consumer's stream waits for it on the GPU |
//! | [`View`] -> DLPack consumer | `view.__dlpack__(stream=, max_version=, dl_device=, copy=)` | zero-copy; a copy for `copy=True` and for `dl_device=(1, 0)` from CUDA (`IS_COPIED`) | the consumer's stream waits (`cuStreamWaitEvent`); the host never blocks, except for the host copy, which the protocol makes synchronous |
//! | [`View`] -> DLPack C exchange API consumer (tvm-ffi, dlpark, cuda.core) | `type(view).__dlpack_c_exchange_api__` (DLPack 1.3 capsule) or `__c_dlpack_exchange_api__` (1.2 int): `managed_tensor_from_py_object_no_sync` (as `__dlpack__(max_version=(1, 3))`, but a view of a tensor that requires grad goes out read-only, as PyTorch's own table exports it), `dltensor_from_py_object_no_sync` (borrowed; refused for read-only views but those whose producer hands them out flagless), `managed_tensor_to_py_object_no_sync` (a managed tensor -> a new [`View`]) | zero-copy, no Python call | `current_work_stream` is NULL (the legacy default stream) for every device; the exports make the legacy default stream wait for the view's producer (GPU-side) |
//! | [`View`] -> CAI / array interface consumer | `__cuda_array_interface__`, `__array_interface__` | zero-copy | CAI v3 `stream`: the view's producer stream |
//! | address -> [`View`] | Python `tensorbridge.from_ptr` | zero-copy; on CUDA the driver checks the span | `producer_stream`, the stream the data becomes ready on (`asview`'s `stream` is the consumer's; both read as every `stream=` is, with DLPack's integers) |
//! | a CUDA tensor -> another process | Python `tensorbridge.share(x)` gives a picklable `Handle`; `tensorbridge.open(handle)` in another process gives a [`View`] (`tensorbridge_cuda::ipc` underneath) | zero-copy across processes (CUDA IPC of the whole allocation, the offset carried) | the producer's pending work is waited for on the consumer's stream through an interprocess event; the producer frees the memory only after every consumer's work on it is done |
//! | Python tensors -> your own CUDA kernel | [`kernel_call`] / [`kernel_call_on`] on [`TensorArg`]s (views through [`KernelCall::input`] / [`KernelCall::output`], outputs checked for aliasing and access) | zero-copy, in place, borrowed for the call | the kernel runs on the current stream of the arguments' framework (PyTorch's, else CuPy's, else the legacy default stream), or the caller's (`kernel_call_on`), borrowed for the call: ordered like the framework's own operations, both ways; other frameworks' current streams wait for it on the GPU |
//!
//! # The import order
//! What [`import`] does with an object is decided once per type (its route; the module
//! `import` has the table, and the invariants every route keeps):
//! 1. a [`View`] of this crate: its tensor, as it is;
//! 2. an exact `numpy.ndarray` whose dimensions are all longer than 1: its buffer (what its
//!    `__dlpack__` would export, without the Python call);
//! 3. a PyTorch tensor (a type publishing PyTorch's DLPack C exchange API capsule,
//!    `__dlpack_c_exchange_api__`, and overriding none of `__dlpack__`, `__dlpack_device__`,
//!    `__torch_function__`): the table's non-owning `DLTensor`, the memory pinned by a
//!    reference to the tensor's storage (so rebinding the tensor, `set_`, `.data =`,
//!    `torch.utils.swap_tensors`, leaves an import's memory alone). A tensor that requires
//!    grad is read-only (and a view of it refuses `__dlpack__` and the CUDA Array Interface,
//!    as PyTorch does); a lazily negated one is refused (`BufferError`); a conjugated one, and
//!    any the table fails on, is asked through `__dlpack__`, whose refusal is PyTorch's;
//! 4. another type's exchange table capsule: its owning export. The DLPack 1.2 int form
//!    (`__c_dlpack_exchange_api__`) is never dereferenced;
//! 5. `obj.__dlpack__(max_version=(1, 3), stream=...)`, retried without `max_version` on
//!    `TypeError` for producers older than DLPack 1.0; without a caller's stream,
//!    `stream=None` (every device takes it); with one, a stream is passed only for device
//!    memory, after asking `__dlpack_device__`; ROCm producers get ROCm's values. A legacy
//!    capsule is read-only unless its producer is known to allow writes (NumPy, PyTorch,
//!    CuPy; JAX and TensorFlow arrays are immutable), and a view of it goes to legacy
//!    consumers as the producer's capsule would;
//! 6. a DLPack capsule itself (`dltensor` or `dltensor_versioned`, renamed `used_*` when
//!    consumed; a used capsule is refused with `BufferError`); a legacy one is read-only
//!    unless it is one of our own exports;
//! 7. `__cuda_array_interface__`, versions 0 to 3: the driver names the device and checks the
//!    span when it can be loaded; the interface's `stream` becomes the tensor's readiness (the
//!    exporter, which the tensor holds, keeps that stream alive);
//! 8. `__array_interface__` (pointer form, or a buffer asked for C-contiguously, whose extent
//!    bounds the span);
//! 9. the buffer protocol (`bytes`, `bytearray`, `array.array`, `memoryview`, `mmap`...).
//!
//! Anything else is a `TypeError` that names the type and the protocols tried.
//!
//! # Owned or borrowed
//! [`import`] and [`AnyTensor`] give an owned [`Tensor`]: its owner holds what pins the
//! memory (and the producer object), so it may be kept, sent to other threads and exported.
//! [`TensorArg`] imports the same way for one call and owns nothing: what pins the memory is
//! a plain reference, or the argument the call holds. It is what a `#[pyfunction]` that only
//! reads, or launches a kernel on, its arguments takes; [`TensorArg::to_tensor`] makes an
//! owned tensor of it when something must outlive the call.
//!
//! ```no_run
//! use pyo3::prelude::*;
//! use tensorbridge_pyo3::AnyTensor;
//!
//! /// Sums a float32 host array from any framework, without copying it.
//! #[pyfunction]
//! fn total(x: AnyTensor) -> Result<f32, tensorbridge_pyo3::Error> {
//!     Ok(x.0.host_view::<f32>()?.iter().sum())
//! }
//! ```
//!
//! # Your own kernel
//! [`kernel_call`] is the one call a `#[pyfunction]` needs to launch its own cudarc kernel
//! on framework tensors (the cookbook's recipe, `crates/tensorbridge-example`'s `axpy`): the
//! stream, the views, the aliasing checks, NVRTC; `unsafe` stays at the launch. Its closure
//! returns this crate's [`Result`], into which the core's, the CUDA layer's, the cudarc
//! adapter's errors and cudarc's `DriverError` convert with `?`.
//!
//! # Errors
//! Extension functions can return `Result<_, tensorbridge_pyo3::Error>`: the core's, the
//! adapters' and the CUDA layer's errors, a refused cudarc import, a failed cudarc call and a
//! `PyErr` all convert with `?`, and PyO3 raises what [`Error`] maps to.
//! [`Error`] is mapped to Python exceptions in one place: `TypeError` for objects of the
//! wrong kind, `ValueError` for bad values (dtype names, shapes, strides, pointers, streams),
//! `BufferError` for DLPack protocol problems (used capsules, refused copies, read-only data
//! to a legacy capsule), `MemoryError` for copies that cannot be made (refused before
//! allocating when far larger than the view spans, or refused by the allocator),
//! `RuntimeError` for failing CUDA driver calls. A producer's own exception passes through
//! unchanged.
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
//!   (view, DLPack consumer, clone) is gone.
//! - **Garbage collection**: a [`View`] shows the collector the Python objects its owner holds
//!   while it is the owner's only user, so a cycle through them (`self.view =
//!   from_ptr(..., owner=self)`, `p.v = asview(p)`) is collected, `release()` running once.
//!   When the collector breaks such a cycle it clears the other objects first: a `release`
//!   callback must not rely on the attributes of the object that holds the view. Cycles
//!   through a producer that a DLPack deleter also holds (NumPy's `__dlpack__`, PyTorch
//!   tensors, whose C++ side then holds them) are not visible and stay uncollected.
//!   (view, DLPack consumer, clone) is gone. An exception `release()` raises is reported as
//!   unraisable (`sys.unraisablehook`).
//! - **Exceptions in flight**: every destructor (owners, capsules) stashes the exception in
//!   flight with the raw `PyErr_Fetch`/`PyErr_Restore` (`PyErr_GetRaisedException`/`PyErr_SetRaisedException` from 3.12) and puts it back unchanged: a
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
//! # Interpreter exit
//! Every call that releases the GIL (copies, host waits, `share`, `open`) and every thread
//! that takes the GIL to release a Python owner (the reapers, deleters called from C) passes
//! a gate that an `atexit` function closes before CPython finalises: the exit waits (up to
//! 1 s for work still running) until they hold the GIL again or have given it back, and after
//! that nothing of this crate asks for the GIL from a thread that does not hold it, so
//! CPython (3.13 and older) never ends a thread with `pthread_exit` under our frames. The gate
//! is installed by [`register`] and by the first import or GIL-released call.
//!
//! # Limitations
//! - Streams are trusted like pointers: a stream integer given to `asview`, to
//!   [`import_on_raw`] or to `from_ptr` (`producer_stream`), or handed to `__dlpack__` by a
//!   consumer, is handed to the driver, and must name a live stream of the data's device
//!   during the call. No tensor's readiness names it afterwards (an event recorded on it
//!   stands in), so it need not outlive the call. The streams a readiness does name are
//!   default streams, PyTorch's pool streams (which PyTorch never destroys), and a CUDA Array
//!   Interface exporter's stream, which the exporter (held by the tensor) keeps alive.
//! - Host memory from Python is shared, not borrowed: host views of an extracted tensor
//!   assume Python code does not write the memory meanwhile (the same assumption rust-numpy
//!   makes without its borrow checker). Host pointers given to `from_ptr` cannot be checked.
//! - Copies (`copy=True`, or the host for a CUDA view) to the host are compact; CUDA device
//!   copies take the span the strides reach verbatim, on the device; pinned and managed
//!   memory copy only to the host. A device copy is freed with `cuMemFree`, which waits for
//!   work still using it. A host copy over 1 GiB and over 16 times the bytes the view spans
//!   (a broadcast view) is refused.
//! - The buffer protocol is declared by this crate for Python 3.9 and 3.10 (pyo3 offers it
//!   only for the 3.11 limited API); PyPy and GraalPy are not supported.
//! - ROCm tensors import and export, but without stream ordering (no ROCm driver here): the
//!   stream values are checked and passed on as the DLPack spec's ROCm rules say (`None`,
//!   -1, `0` for the default stream, handles; CUDA's `1` and `2` refused on export).

#![cfg_attr(docsrs, feature(doc_cfg))]

// The modules, bottom-up: each uses only those on lines above its own in this list (names on
// one line stand side by side and use neither each other). `tests/it/layers.rs` reads this
// list and checks it against every `crate::` path.
// - error: the crate's error type and its Python exceptions
// - ffi: the C API pyo3 does not wrap, the GIL-attach and exit gates, C entry points
// - convert: Python values (dtypes, devices) to the core's
// - owner: Python objects and buffers as a tensor's owner
// - floor: what both wings stand on: readiness, capsule names, stream arguments, `View`
// - import, export: the two wings (Python -> the core, the core -> Python), side by side
// - lib: the root's own items (`TensorArg`, `import`, `export`)
// - kernel, python, share: the entries (your kernel, the Python module's functions, IPC)
mod convert;
mod error;
mod export;
mod ffi;
mod floor;
mod import;
mod kernel;
mod owner;
mod python;
// CUDA IPC and its `/dev/shm` lifetime files: Linux only, as the CUDA layer's `ipc`.
#[cfg(target_os = "linux")]
mod share;

use pyo3::prelude::*;
use tensorbridge_core::{Descriptor, Ready, Tensor, TensorRef};

pub use error::{Error, Result};
pub use floor::view::View;
pub use kernel::{KernelCall, StreamSource, kernel_call, kernel_call_on};

/// Imports any Python tensor or array zero-copy, in the order of the crate docs, as an owned
/// [`Tensor`]: its owner pins the memory (for PyTorch, the tensor's storage), so it may be
/// kept, sent to other threads and exported. Nothing is enqueued on any stream: the tensor
/// carries the producer's readiness (PyTorch's current stream, or an event recorded on it
/// when PyTorch does not own that stream; the legacy default stream, which
/// `__dlpack__(stream=None)` orders, for other DLPack producers; the CUDA Array Interface's
/// `stream`), and whoever uses it on a stream orders against that
/// ([`tensorbridge_cuda::make_ready_on`], the cudarc adapter's views, `View.__dlpack__`).
/// For an argument used only within one call, [`TensorArg`] costs less.
///
/// Safe: it trusts the producer's protocol implementation as every consumer does (DLPack
/// structs, interface dicts and buffers describe memory their exporter keeps valid, and the
/// streams they name live as long as the framework requires of its users).
pub fn import(obj: &Bound<'_, PyAny>) -> PyResult<Tensor> {
    Ok(import::import_tensor(obj, floor::ready::Consumer::NONE)?)
}

/// [`import`] for a caller who will use the data on `stream` (DLPack's integer conventions:
/// `None`, `-1` for no synchronisation, `1`, `2`, or a `cudaStream_t` handle; and `0`, what
/// `torch.cuda.current_stream().cuda_stream` and CuPy's `Stream.null.ptr` are for the
/// default stream, read as the CUDA runtime reads a null stream: the legacy default stream).
/// On return, work enqueued on that stream sees the producer's data; the host is never
/// blocked. The tensor's readiness never names `stream` (an event recorded on it stands in
/// when needed), so `stream` need only live for the call.
///
/// # Safety
/// 1. A handle in `stream` names a live CUDA stream of the device the data is on (in its
///    primary context, as PyTorch's, CuPy's and JAX's streams are) during the call; `2` (the
///    per-thread default stream) is used only on the calling thread.
pub unsafe fn import_on_raw(obj: &Bound<'_, PyAny>, stream: Option<i64>) -> PyResult<Tensor> {
    // A null `cudaStream_t` is the legacy default stream (DLPack calls 0 ambiguous because a
    // per-thread-default build reads it otherwise; PyTorch and CuPy hand out 0 for their
    // default stream, which is the legacy one in their builds).
    let stream = match stream {
        Some(0) => Some(1),
        other => other,
    };
    // SAFETY: obligation 1 is `Consumer::assume`'s (0 became 1, the always-live legacy
    // stream).
    let consumer = unsafe { floor::ready::Consumer::assume(stream) }?;
    Ok(import::import_tensor(obj, consumer)?)
}

/// A function argument that accepts any Python tensor or array ([`import`]), owned: it may
/// outlive the call.
#[derive(Clone, Debug)]
pub struct AnyTensor(pub Tensor);

impl<'a, 'py> FromPyObject<'a, 'py> for AnyTensor {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        import(&obj).map(AnyTensor)
    }
}

/// A function argument that accepts any Python tensor or array, borrowed for the call:
/// imported as [`import`] imports it (the same routes, checks, refusals and readiness), but
/// with no owner of its own: its memory is pinned by a plain reference (a PyTorch storage, a
/// held buffer, a managed tensor) or by the argument itself, which the call holds. What it
/// offers ends with the call: [`TensorArg::as_ref`], host views, [`kernel_call`]. Anything
/// that must outlive the call takes [`TensorArg::to_tensor`].
///
/// ```no_run
/// use pyo3::prelude::*;
/// use tensorbridge_pyo3::TensorArg;
///
/// /// Sums a float32 host array from any framework, without copying it or keeping it.
/// #[pyfunction]
/// fn total(x: TensorArg<'_, '_>) -> Result<f32, tensorbridge_pyo3::Error> {
///     Ok(x.as_ref().as_slice::<f32>()?.iter().sum())
/// }
/// ```
pub struct TensorArg<'a, 'py> {
    obj: Borrowed<'a, 'py, PyAny>,
    imported: import::Imported,
}

impl<'a, 'py> TensorArg<'a, 'py> {
    /// Imports `obj` for as long as it is borrowed ([`TensorArg`]).
    pub fn new(obj: Borrowed<'a, 'py, PyAny>) -> Result<TensorArg<'a, 'py>> {
        let imported = import::import(&obj, floor::ready::Consumer::NONE)?;
        Ok(TensorArg { obj, imported })
    }

    /// The Python object.
    pub fn object(&self) -> &Borrowed<'a, 'py, PyAny> {
        &self.obj
    }

    /// The validated description.
    pub fn descriptor(&self) -> &Descriptor {
        &self.imported.desc
    }

    /// Where the data becomes ready.
    pub fn ready(&self) -> &Ready {
        &self.imported.ready
    }

    /// The tensor borrowed from this argument: what ordering, device views for a launch and
    /// host views need ([`TensorRef::host_view`], [`TensorRef::as_slice`]).
    pub fn as_ref(&self) -> TensorRef<'_> {
        // SAFETY: from_parts \[span\] and \[no-race\]: the import's pin, which `self` holds
        // (or the argument it borrows, which the call holds), keeps the span valid as long as
        // `self` is borrowed; \[ready\]: the import's readiness is true and names only
        // streams that outlive the tensor (the import's invariants).
        unsafe { TensorRef::from_parts(&self.imported.desc, &self.imported.ready) }
    }

    /// An owned [`Tensor`] of the same memory, for what must outlive the call: the owner
    /// holds what pins the memory. Its readiness is settled (thread-bound streams become
    /// events) so it may cross threads.
    pub fn to_tensor(&self) -> Result<Tensor> {
        let mut ready = self.imported.ready.clone();
        if floor::ready::needs_settling(&ready, self.imported.desc.device().kind) {
            ready = floor::ready::settled(&self.imported.desc, &ready)?;
        }
        let owner = self.imported.owner(&self.obj);
        // SAFETY: from_descriptor: the owner holds the pin (`Imported::owner`), which keeps
        // the span valid (the import's invariants);
        let tensor = unsafe { Tensor::from_descriptor(self.imported.desc.clone(), owner) };
        // SAFETY: with_ready: the import's readiness, settled: true, naming only streams that
        // outlive the tensor and none bound to this thread.
        Ok(unsafe { tensor.with_ready(ready) })
    }

    /// An owner that pins this argument's memory (and holds the object), for what must be
    /// kept past the call.
    pub(crate) fn owner(&self) -> tensorbridge_core::Owner {
        self.imported.owner(&self.obj)
    }

    /// The current stream of this argument's framework on device `ordinal`, when it has one:
    /// PyTorch's (read when the argument was imported), CuPy's (asked now).
    pub(crate) fn framework_stream(
        &self,
        ordinal: u32,
    ) -> Result<Option<floor::stream::FrameworkStream>> {
        use floor::stream::{Framework, FrameworkStream};
        use tensorbridge_cuda::StreamLife;
        if let Some(current) = self.imported.current {
            return Ok(Some(FrameworkStream {
                framework: Framework::Torch,
                stream: current.stream,
                life: if current.immortal {
                    StreamLife::Immortal
                } else {
                    StreamLife::CallOnly
                },
            }));
        }
        let obj = self.object();
        let py = obj.py();
        if import::route::facts(obj)?.cupy {
            let device_id = i32::try_from(ordinal).unwrap_or(0);
            let current = py
                .import(pyo3::intern!(py, "cupy.cuda"))?
                .getattr(pyo3::intern!(py, "get_current_stream"))?
                .call1((device_id,))?;
            let ptr: usize = current.getattr(pyo3::intern!(py, "ptr"))?.extract()?;
            let stream = tensorbridge_cuda::stream_from_raw(std::ptr::without_provenance_mut(ptr));
            return Ok(Some(FrameworkStream {
                framework: Framework::CuPy,
                stream,
                life: StreamLife::KeptBy(owner::KeepAlive::owner(current.unbind(), None)),
            }));
        }
        Ok(None)
    }
}

impl std::fmt::Debug for TensorArg<'_, '_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TensorArg")
            .field("desc", &self.imported.desc)
            .field("ready", &self.imported.ready)
            .finish_non_exhaustive()
    }
}

impl<'a, 'py> FromPyObject<'a, 'py> for TensorArg<'a, 'py> {
    type Error = Error;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> Result<Self> {
        TensorArg::new(obj)
    }
}

/// A [`View`] of `tensor`, as a Python object: what every framework takes zero-copy.
pub fn export(py: Python<'_>, tensor: Tensor) -> PyResult<Bound<'_, PyAny>> {
    Ok(Bound::new(py, View::new(tensor))?.into_any())
}

/// Adds `View`, `asview` and `from_ptr` to a Python module (what the `tensorbridge` wheel's
/// `#[pymodule]` does).
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // The exit's gate (`ffi::exit`): no thread of ours takes the GIL once CPython finalises.
    ffi::exit::install(m.py());
    m.add_class::<View>()?;
    export::exchange::install(m.py())?;
    m.add_function(wrap_pyfunction!(python::asview, m)?)?;
    m.add_function(wrap_pyfunction!(python::from_ptr, m)?)?;
    #[cfg(target_os = "linux")]
    share::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
