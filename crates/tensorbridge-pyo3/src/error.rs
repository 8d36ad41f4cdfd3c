//! The crate's one error type and its one mapping to Python exceptions.

use pyo3::PyErr;
use pyo3::exceptions::{PyBufferError, PyMemoryError, PyRuntimeError, PyTypeError, PyValueError};
use tensorbridge_core::Device;

/// Everything this crate refuses. Messages say what was expected and what was found; the
/// adapters' errors (and cudarc's `DriverError`) convert with `?` and pass through unchanged, and a Python exception raised by a producer
/// (inside `__dlpack__`, say) travels as [`Error::Python`].
///
/// `From<Error> for PyErr` is the one place that picks the Python exception: `TypeError` for
/// objects of the wrong kind, `ValueError` for bad values (dtype names, shapes, strides,
/// pointers, streams), `BufferError` for DLPack protocol problems (used capsules, refused
/// copies, read-only data to a writer), `MemoryError` for copies that cannot be made,
/// `RuntimeError` for failing CUDA driver calls.
#[non_exhaustive]
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A refusal of the core (layout, alignment, dtype or device names, streams...).
    #[error(transparent)]
    Core(#[from] tensorbridge_core::Error),
    /// A refusal of the DLPack adapter (versions, flags, null shape or strides...).
    #[error(transparent)]
    Dlpack(#[from] tensorbridge_dlpack::Error),
    /// A refusal of the CUDA Array Interface / array interface adapter.
    #[error(transparent)]
    Cai(#[from] tensorbridge_cai::Error),
    /// A refusal of the CUDA layer (pointer checks, driver calls, stream hand-off).
    #[error(transparent)]
    Cuda(#[from] tensorbridge_cuda::Error),
    /// A refusal of the cudarc adapter (views for kernel launches, slices).
    #[error(transparent)]
    Cudarc(#[from] tensorbridge_cudarc::Error),
    /// An exception raised by Python code this crate called (a producer's `__dlpack__`, a
    /// dict lookup...), passed on as it is.
    #[error(transparent)]
    Python(#[from] PyErr),

    // ---- what kind of object ----
    /// An object that implements none of the protocols.
    #[error(
        "cannot view an object of type {type_name}: it has no DLPack C exchange API, __dlpack__, __cuda_array_interface__, __array_interface__ or buffer interface, and is not a DLPack capsule (expected a tensor or array from a framework, a DLPack capsule, or a buffer)"
    )]
    NotATensor {
        /// `type(obj).__qualname__`, with its module.
        type_name: String,
    },
    /// A capsule that is not a DLPack capsule.
    #[error(
        "a capsule {} is not a DLPack tensor (expected \"dltensor\" or \"dltensor_versioned\")",
        .name.as_deref().map_or_else(|| "without a name".to_owned(), |n| format!("named {n:?}"))
    )]
    CapsuleName {
        /// The capsule's name (`None` for an unnamed capsule).
        name: Option<String>,
    },
    /// A DLPack capsule that was consumed already.
    #[error(
        "the DLPack capsule was already consumed (its name is {name:?}; expected an unused \"dltensor\" or \"dltensor_versioned\" capsule: a capsule can be imported once)"
    )]
    UsedCapsule {
        /// The capsule's name, `used_dltensor` or `used_dltensor_versioned`.
        name: String,
    },
    /// `__dlpack__` returned something that is not a DLPack capsule.
    #[error(
        "{type_name}.__dlpack__ returned an object of type {found} (expected a DLPack capsule)"
    )]
    NotACapsule {
        /// The producer's type.
        type_name: String,
        /// The type of what it returned.
        found: String,
    },
    /// A dtype argument that is no dtype at all.
    #[error(
        "a {type_name} is not a dtype (expected a dtype name, a NumPy or ml_dtypes dtype or type, a torch dtype, or float/int/bool/complex)"
    )]
    NotADType {
        /// The argument's type.
        type_name: String,
    },
    /// A pointer argument that is no int.
    #[error("a {type_name} is not a pointer (expected an int address)")]
    NotAPointer {
        /// The argument's type.
        type_name: String,
    },
    /// A negative pointer.
    #[error("pointer {value} is negative (expected an address >= 0)")]
    NegativePointer {
        /// The value given.
        value: i64,
    },
    /// A device argument of the wrong kind.
    #[error(
        "a {type_name} is not a device (expected a string like \"cpu\", \"cuda\" or \"cuda:1\", or a (device_type, device_id) tuple)"
    )]
    NotADevice {
        /// The argument's type.
        type_name: String,
    },

    // ---- bad values ----
    /// A dtype name with two meanings.
    #[error(
        "dtype name {name:?} is ambiguous ({meanings}); expected an explicit name like \"int32\" or \"int64\""
    )]
    AmbiguousDType {
        /// The name given.
        name: String,
        /// What it means where.
        meanings: &'static str,
    },
    /// A dtype of a Python framework with no DLPack counterpart.
    #[error(
        "dtype {name} has no DLPack equivalent (expected a name the core knows, like \"float32\")"
    )]
    UnsupportedDType {
        /// The framework's name for it.
        name: String,
    },
    /// A byte order other than the machine's.
    #[error("dtype {name} is big-endian (expected native byte order)")]
    NonNativeDType {
        /// The dtype as given.
        name: String,
    },
    /// A buffer-protocol format string with no core dtype.
    #[error(
        "buffer format {format:?} has no core dtype (expected one of ?bBhHiIlLqQefdFD or Zf/Zd, in native byte order)"
    )]
    BufferFormat {
        /// The format string.
        format: String,
    },
    /// A buffer with sub-buffers (PIL-style indirect arrays).
    #[error("the buffer uses suboffsets (expected a plain strided buffer)")]
    Suboffsets,
    /// A stream given for memory that has no streams.
    #[error(
        "a stream ({value}) was given for memory on {device} (expected None: only CUDA memory has streams)"
    )]
    StreamOnHost {
        /// The stream integer.
        value: i64,
        /// The device.
        device: Device,
    },
    /// A stream value of the wrong Python type.
    #[error("stream must be None or an int (found an object of type {type_name})")]
    StreamType {
        /// The argument's type.
        type_name: String,
    },
    /// A `stream=` argument that is no stream: neither `None`, an int nor a stream object.
    #[error(
        "stream must be None, an int or a CUDA stream object (a torch.cuda.Stream, a cupy.cuda.Stream, an object with __cuda_stream__) (found an object of type {type_name})"
    )]
    StreamObject {
        /// The argument's type.
        type_name: String,
    },
    /// A cudarc call in a kernel call's closure failed (its launch, or the kernel's earlier
    /// work reported at it): the kernels the closure asked for named.
    #[error(
        "kernel {kernel} failed: its launch (a cudarc call in its kernel_call) returned {result:?}"
    )]
    KernelFailed {
        /// The kernels the closure asked for (`KernelCall::function`, `KernelCall::kernel`).
        kernel: String,
        /// What the driver returned.
        result: cudarc::driver::sys::CUresult,
    },
    /// `stream=0`, which DLPack calls ambiguous.
    #[error(
        "stream=0 is ambiguous (the legacy or the per-thread default stream; DLPack refuses it): expected 1 for the legacy default stream, 2 for the per-thread default stream, or the stream object itself (a framework's default stream object is read as the legacy default stream)"
    )]
    StreamZero,
    /// `stream=-1` (no synchronisation) for a call that must run or order on a stream.
    #[error(
        "{entry} needs a stream to work on, and -1 (no synchronisation) names none (expected None or 1 for the legacy default stream, 2, a stream handle or a stream object)"
    )]
    StreamNeeded {
        /// The function that was called.
        entry: &'static str,
    },
    /// A stream integer no convention can carry.
    #[error(
        "stream {repr} does not fit a 64-bit integer (expected None, -1, 1, 2 or a stream handle)"
    )]
    StreamRange {
        /// `repr` of the value.
        repr: String,
    },
    /// A `from_ptr` on a CUDA device where no driver can check the pointer.
    #[error(
        "cannot check device pointer {addr:#x} on {device}: no CUDA driver could be loaded (expected an NVIDIA driver: CUDA pointers that cannot be checked are refused)"
    )]
    Unchecked {
        /// The pointer.
        addr: usize,
        /// The device claimed.
        device: Device,
    },
    /// A NumPy masked array with masked elements: every protocol would show them as valid.
    #[error(
        "masked arrays cannot be viewed: {masked} of {total} elements are masked and every protocol would show them as valid (expected arr.filled(value) or arr.data)"
    )]
    Masked {
        /// Masked elements.
        masked: u64,
        /// All elements.
        total: u64,
    },
    /// A required key missing from an interface dict.
    #[error("{interface} has no {key:?} key (expected {expected})")]
    MissingKey {
        /// `__cuda_array_interface__` or `__array_interface__`.
        interface: &'static str,
        /// The key.
        key: &'static str,
        /// What the interface requires there.
        expected: &'static str,
    },
    /// A `release` argument that cannot be called.
    #[error("release must be callable with no arguments (found an object of type {type_name})")]
    NotCallable {
        /// The argument's type.
        type_name: String,
    },
    /// A host device with an ordinal other than 0.
    #[error("{device} is not a host device (expected ordinal 0 for host memory: \"cpu\")")]
    HostOrdinal {
        /// The device given.
        device: Device,
    },
    /// A key of an interface dict with a value of the wrong kind.
    #[error("{interface}[{key:?}] must be {expected} (found {found})")]
    InterfaceKey {
        /// `__cuda_array_interface__` or `__array_interface__`.
        interface: &'static str,
        /// The key.
        key: &'static str,
        /// What the interface allows.
        expected: &'static str,
        /// What was there.
        found: String,
    },
    /// An interface attribute that is not a dict.
    #[error("{interface} must be a dict (found an object of type {found})")]
    InterfaceNotDict {
        /// `__cuda_array_interface__` or `__array_interface__`.
        interface: &'static str,
        /// Its type.
        found: String,
    },
    /// A `max_version` that is not a `(major, minor)` pair of non-negative ints.
    #[error("max_version must be None or a (major, minor) tuple of ints (found {found})")]
    MaxVersion {
        /// `repr` of what was given.
        found: String,
    },

    // ---- DLPack protocol ----
    /// `__dlpack__(dl_device=...)` to a device this view cannot reach.
    #[error(
        "cannot export memory on {device} to DLPack device {requested:?} (expected {own:?}{})",
        if device.kind.is_cuda_accessible() { ", or (1, 0) for a copy to the host" } else { "" }
    )]
    UnsupportedDlDevice {
        /// The `(device_type, device_id)` asked for.
        requested: (i32, i32),
        /// The view's `(device_type, device_id)`.
        own: (i32, i32),
        /// The view's device.
        device: Device,
    },
    /// `copy=False` where only a copy can serve the request.
    #[error(
        "copy=False but exporting memory on {device} to DLPack device {requested:?} needs a copy (expected copy=None or copy=True)"
    )]
    CopyRefused {
        /// The device asked for.
        requested: (i32, i32),
        /// The view's device.
        device: Device,
    },
    /// A negative stride, which DLPack consumers cannot all take.
    #[error(
        "dimension {dim} has negative stride {stride}: DLPack consumers cannot all take negative strides (torch 2.11's from_dlpack aborts the process), so __dlpack__ refuses them (expected copy=True for a compact copy, or np.asarray(view) / __cuda_array_interface__ for zero-copy access)"
    )]
    NegativeStrides {
        /// The dimension.
        dim: usize,
        /// Its stride in elements.
        stride: i64,
    },
    /// A read-only view asked for as a legacy capsule, which cannot say read-only.
    #[error(
        "the view is read-only but a legacy DLPack capsule (asked for without max_version) has no read-only flag (expected max_version=(1, 0) or later, or copy=True)"
    )]
    ReadOnlyLegacy,
    /// A DLPack export (any version, copies too, and the DLPack C exchange API's) of a view
    /// of a PyTorch tensor that requires grad: PyTorch's `__dlpack__` refuses the tensor, and
    /// some DLPack consumers (`torch.from_dlpack`) ignore the read-only flag.
    #[error(
        "cannot export a view of a tensor that requires grad: PyTorch's __dlpack__ refuses it, and DLPack consumers that ignore the read-only flag (torch.from_dlpack) would write past autograd (expected tb.asview(tensor.detach()), or np.asarray(view) for read-only host access)"
    )]
    RequiresGrad,
    /// The CUDA Array Interface of a view of a PyTorch tensor that requires grad: PyTorch's
    /// own interface refuses the tensor (`RuntimeError`), and its consumers may ignore
    /// `readonly`.
    #[error(
        "cannot give the {interface} of a view of a tensor that requires grad: PyTorch's own refuses it, and its consumers may ignore readonly (expected tb.asview(tensor.detach()))"
    )]
    RequiresGradInterface {
        /// The interface asked for.
        interface: &'static str,
    },
    /// A copy this crate cannot make.
    #[error(
        "cannot copy memory on {device} (expected cpu or cuda memory; pinned and managed memory copy only to the host; non-contiguous packed sub-byte data does not copy)"
    )]
    CannotCopy {
        /// The view's device.
        device: Device,
    },
    /// A copy far larger than the memory its source spans (a broadcast view), refused before
    /// anything is allocated.
    #[error(
        "refusing to copy {bytes} bytes on {device}: the view spans only {span} bytes (a broadcast view); a copy over 1 GiB and over 16 times the bytes a view spans is refused (expected copy=None for zero-copy access, or a smaller view)"
    )]
    CopyTooLarge {
        /// Bytes the copy would take.
        bytes: u64,
        /// Bytes the view spans.
        span: u64,
        /// The view's device.
        device: Device,
    },
    /// An allocation for a copy that the system (or the CUDA driver) refused.
    #[error("cannot allocate {bytes} bytes on {device} for a copy (out of memory)")]
    OutOfMemory {
        /// Bytes asked for.
        bytes: u64,
        /// Where (`cpu` for host memory).
        device: Device,
    },
    /// A tensor with a lazy negative bit (PyTorch's `x.conj().imag`): its memory holds the
    /// negated values, and no protocol can say so.
    #[error(
        "cannot view a {type_name} with its negative bit set: its memory holds the negated values and DLPack cannot say so (expected tensor.resolve_neg())"
    )]
    NegativeBit {
        /// The tensor's type.
        type_name: String,
    },
    /// A view asked of a kernel call for a tensor that is not one of its arguments.
    #[error(
        "this tensor is not an argument of the kernel call (expected one of the TensorArgs given to kernel_call)"
    )]
    NotAnArgument,
    /// Kernel arguments whose shapes differ where the kernel needs them equal.
    #[error(
        "argument {index} has shape {found:?} but argument {other} has shape {expected:?} (expected equal shapes)"
    )]
    ShapeMismatch {
        /// The position of the argument that differs.
        index: usize,
        /// Its shape.
        found: Vec<i64>,
        /// The position of the argument it is compared with.
        other: usize,
        /// That argument's shape.
        expected: Vec<i64>,
    },
    /// A PyTorch tensor whose storage, as PyTorch reported it, did not hold the memory the
    /// tensor showed, on every attempt: rebound to other memory meanwhile (`set_`, `.data =`,
    /// `swap_tensors` on another thread), or a `__torch_function__` override or mode answered
    /// `untyped_storage()` with another storage. Nothing could pin the memory.
    #[error(
        "a {type_name}'s memory is not inside the storage PyTorch reported for it ({attempts} attempts; expected untyped_storage() to return the tensor's own storage and no other thread to rebind the tensor during the import: is a __torch_function__ override or mode answering for it?)"
    )]
    Rebound {
        /// Its type.
        type_name: String,
        /// How often it was read.
        attempts: usize,
    },
    /// A PyTorch tensor its table exported whose storage could not be had:
    /// `untyped_storage()` raised (a `__torch_function__` override or mode answering for it).
    /// Nothing could pin the memory, and an owner of the tensor alone would not.
    #[error(
        "a {type_name}'s storage could not be pinned: untyped_storage() raised {cause} (expected PyTorch's own answer: is a __torch_function__ override or mode answering for it?)"
    )]
    Unpinned {
        /// Its type.
        type_name: String,
        /// What `untyped_storage()` raised.
        cause: String,
    },
    /// A DLPack C exchange API table that could not be used.
    #[error("{type_name}'s DLPack C exchange API is unusable: {problem}")]
    Exchange {
        /// The producer's type.
        type_name: String,
        /// What is wrong.
        problem: &'static str,
    },
    /// `tensorbridge.View`'s DLPack C exchange API called with an object that is no View
    /// (the table is only for objects of the type it was found on).
    #[error(
        "tensorbridge.View's DLPack C exchange API was given an object of type {type_name} (expected a tensorbridge.View: a table serves only objects of the type it is found on)"
    )]
    NotAView {
        /// The object's type.
        type_name: String,
    },
    /// A view that `dltensor_from_py_object_no_sync` cannot describe: a bare `DLTensor`
    /// has no flags.
    #[error(
        "dltensor_from_py_object_no_sync cannot lend this view: {reason}, and a DLTensor has no flags to say so (expected managed_tensor_from_py_object_no_sync or __dlpack__(max_version=(1, 0)) or later, whose flags do)"
    )]
    NoFlags {
        /// What the flags would have said.
        reason: &'static str,
    },
    /// A null pointer where a DLPack C exchange API function needs one.
    #[error("{function} was called with a null {argument} (expected a valid pointer)")]
    NullArgument {
        /// The exchange API function.
        function: &'static str,
        /// The argument.
        argument: &'static str,
    },
}

impl From<cudarc::driver::DriverError> for Error {
    /// A failing cudarc call (a launch, `new_stream`, `clone_htod`...) as the CUDA layer's
    /// [`Driver`](tensorbridge_cuda::Error::Driver) error (`RuntimeError` in Python), so `?`
    /// works on cudarc's results in a [`kernel_call`](crate::kernel_call) closure and in any
    /// extension function returning this crate's `Result`. cudarc's error does not say which
    /// call failed; the message names cudarc and the `CUresult`.
    fn from(e: cudarc::driver::DriverError) -> Error {
        Error::Cuda(tensorbridge_cuda::Error::driver(
            tensorbridge_cuda::Error::CUDARC_CALL,
            e,
        ))
    }
}

/// The Python exception for a refusal of the core: `TypeError` for element types the core
/// does not know (STYLE: wrong kinds and dtypes), `BufferError` for data that is not ready or
/// writable, `ValueError` for the rest.
/// The exception for a refusal of the CUDA layer: `RuntimeError` for the driver (no driver, a
/// failing call, a failed signal), the core's for the core's, `ValueError` for the rest
/// (pointer checks, devices).
fn cuda_exception(cuda: &tensorbridge_cuda::Error, msg: String) -> PyErr {
    use tensorbridge_cuda::Error as Cuda;
    match cuda {
        Cuda::Driver { .. } | Cuda::Signal(_) | Cuda::NoDriver => PyRuntimeError::new_err(msg),
        Cuda::Core(core) => core_exception(core, msg),
        _ => PyValueError::new_err(msg),
    }
}

fn core_exception(core: &tensorbridge_core::Error, msg: String) -> PyErr {
    use tensorbridge_core::Error as Core;
    match core {
        Core::UnknownDTypeCode { .. }
        | Core::InvalidBits { .. }
        | Core::ZeroLanes { .. }
        | Core::DTypeMismatch { .. } => PyTypeError::new_err(msg),
        Core::ReadOnly | Core::NotReady | Core::NotHostAccessible { .. } => {
            PyBufferError::new_err(msg)
        }
        _ => PyValueError::new_err(msg),
    }
}

impl From<Error> for PyErr {
    fn from(e: Error) -> PyErr {
        use tensorbridge_core::Error as Core;
        use tensorbridge_dlpack::Error as Dlpack;
        let msg = e.to_string();
        match e {
            Error::Python(err) => err,
            Error::Core(core) => core_exception(&core, msg),
            // A DLPack producer's device this version cannot name: data the consumer cannot
            // take (the Python protocol's `BufferError`).
            Error::Dlpack(Dlpack::Core(
                Core::UnknownDeviceType { .. } | Core::NegativeDeviceId { .. },
            )) => PyBufferError::new_err(msg),
            Error::Dlpack(Dlpack::Core(core)) => core_exception(&core, msg),
            // Malformed layouts are bad values; versions and flags are protocol problems.
            Error::Dlpack(
                Dlpack::NegativeRank { .. }
                | Dlpack::NullShape { .. }
                | Dlpack::NullStrides { .. }
                | Dlpack::RankTooLarge { .. },
            ) => PyValueError::new_err(msg),
            Error::Dlpack(_) => PyBufferError::new_err(msg),
            Error::Cai(tensorbridge_cai::Error::Core(core)) => core_exception(&core, msg),
            Error::Cai(_) => PyValueError::new_err(msg),
            Error::Cuda(cuda) => cuda_exception(&cuda, msg),
            Error::Cudarc(tensorbridge_cudarc::Error::Cuda(cuda)) => cuda_exception(&cuda, msg),
            Error::Cudarc(tensorbridge_cudarc::Error::Core(core)) => core_exception(&core, msg),
            // No NVRTC, or a kernel that does not compile: the environment or the
            // extension's source, not the caller's values.
            Error::Cudarc(
                tensorbridge_cudarc::Error::NoNvrtc | tensorbridge_cudarc::Error::Compile { .. },
            ) => PyRuntimeError::new_err(msg),
            // Layouts outside a slice, ranks a kernel layout cannot hold: bad values.
            Error::Cudarc(_) => PyValueError::new_err(msg),
            Error::NotATensor { .. }
            | Error::CapsuleName { .. }
            | Error::NotACapsule { .. }
            | Error::NotADType { .. }
            | Error::NotADevice { .. }
            | Error::NotAPointer { .. }
            | Error::NotCallable { .. }
            | Error::InterfaceNotDict { .. }
            | Error::InterfaceKey { .. }
            | Error::StreamType { .. }
            | Error::StreamObject { .. }
            | Error::NotAView { .. } => PyTypeError::new_err(msg),
            Error::AmbiguousDType { .. }
            | Error::UnsupportedDType { .. }
            | Error::NonNativeDType { .. }
            | Error::BufferFormat { .. }
            | Error::Suboffsets
            | Error::StreamOnHost { .. }
            | Error::StreamRange { .. }
            | Error::StreamZero
            | Error::StreamNeeded { .. }
            | Error::Unchecked { .. }
            | Error::MaxVersion { .. }
            | Error::NegativePointer { .. }
            | Error::HostOrdinal { .. }
            | Error::MissingKey { .. }
            | Error::NotAnArgument
            | Error::ShapeMismatch { .. }
            | Error::NullArgument { .. }
            | Error::Masked { .. } => PyValueError::new_err(msg),
            Error::UsedCapsule { .. }
            | Error::UnsupportedDlDevice { .. }
            | Error::CopyRefused { .. }
            | Error::CannotCopy { .. }
            | Error::NegativeStrides { .. }
            | Error::ReadOnlyLegacy
            | Error::RequiresGrad
            | Error::NegativeBit { .. }
            | Error::Exchange { .. }
            | Error::NoFlags { .. } => PyBufferError::new_err(msg),
            Error::Rebound { .. }
            | Error::Unpinned { .. }
            | Error::KernelFailed { .. }
            | Error::RequiresGradInterface { .. } => PyRuntimeError::new_err(msg),
            Error::CopyTooLarge { .. } | Error::OutOfMemory { .. } => PyMemoryError::new_err(msg),
        }
    }
}

/// A cudarc import that failed: its error (the refused slice is dropped, which frees it), so
/// `tensorbridge_cudarc::import(slice)?` works in a function returning this crate's `Result`.
impl<T> From<tensorbridge_cudarc::ImportError<T>> for Error {
    fn from(e: tensorbridge_cudarc::ImportError<T>) -> Error {
        Error::Cudarc(e.into())
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
