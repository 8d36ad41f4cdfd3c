//! The crate's one error type.

use std::sync::Arc;

use cudarc::driver::{DriverError, sys};
use tensorbridge_core::Device;

use crate::types::{CaptureStatus, DeviceUuid, MemoryType};

/// Everything this crate refuses. Messages say what was expected and what was found; the
/// core's refusals (layout, alignment, dtype, read-only...) pass through unchanged as
/// [`Error::Core`], and every failing driver call becomes [`Error::Driver`] with its name and
/// `CUresult` (never a panic).
#[non_exhaustive]
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// A refusal of the core (layout, alignment, dtype mismatch, read-only...).
    #[error(transparent)]
    Core(#[from] tensorbridge_core::Error),

    // ---- the driver ----
    /// libcuda could not be loaded: a machine without an NVIDIA driver.
    #[error(
        "no CUDA driver: libcuda could not be loaded (expected an NVIDIA driver on this machine)"
    )]
    NoDriver,
    /// A driver call returned something other than `CUDA_SUCCESS`.
    #[error("the CUDA driver call {call} failed with {result:?}")]
    Driver {
        /// The driver function (or cudarc call) that failed, e.g. `"cuStreamWaitEvent"`.
        call: &'static str,
        /// What it returned.
        result: sys::CUresult,
    },
    /// The ready signal of another adapter failed while this crate waited on it.
    #[error("the tensor's ready signal failed: {0}")]
    Signal(#[source] Arc<dyn std::error::Error + Send + Sync + 'static>),

    // ---- streams ----
    /// A raw stream handle of a context that is not its device's primary context.
    #[error(
        "stream {stream:#x} belongs to a CUDA context that is not cuda:{ordinal}'s primary context (expected a stream of a primary context, as PyTorch, CuPy and JAX use; pass a cudarc stream of that context instead)"
    )]
    ForeignContext {
        /// The stream handle.
        stream: usize,
        /// The device of its context.
        ordinal: u32,
    },
    /// A default-stream sentinel for pinned or managed memory, whose DLPack device names no
    /// GPU, with no CUDA context current on the calling thread to say which device's stream
    /// it is.
    #[error(
        "the {stream} of memory on {device} names no GPU: no CUDA context is current on this thread (expected a stream handle, or the producer's device made current)"
    )]
    UnknownStreamDevice {
        /// The sentinel.
        stream: tensorbridge_core::Stream,
        /// The tensor's device (pinned or managed memory).
        device: Device,
    },

    // ---- CUDA graph capture ----
    /// A hand-off that would use the legacy default stream while a stream it synchronises
    /// with is being captured into a CUDA graph, which invalidates the capture.
    #[error(
        "the legacy default stream cannot be used while a stream it synchronizes with is being captured into a CUDA graph (expected the capturing stream, or a non-blocking stream, as the consumer or producer)"
    )]
    LegacyDuringCapture,
    /// A hand-off across the boundary of a CUDA graph capture in the direction the driver
    /// forbids: data produced inside a capture, used by a stream outside it (or in another).
    #[error(
        "the data is ready on a stream that is {producer} but the consumer stream is {consumer} (expected the consumer in the same capture; outside it, order against the stream the graph is launched on)"
    )]
    CaptureMismatch {
        /// The producer's capture state.
        producer: CaptureStatus,
        /// The consumer's.
        consumer: CaptureStatus,
    },
    /// A host wait for work recorded into a CUDA graph capture, which runs at the graph's
    /// replays, not now.
    #[error(
        "cannot wait on the host for work that is {capture} (expected the graph to be launched, and its launch stream waited for)"
    )]
    HostWaitInCapture {
        /// The capture.
        capture: CaptureStatus,
    },

    // ---- tensors on CUDA streams ----
    /// A tensor whose memory CUDA kernels cannot take.
    #[error("memory on {device} cannot be passed to a CUDA kernel (expected cuda or cuda_managed)")]
    NotCudaMemory {
        /// The tensor's device.
        device: Device,
    },
    /// A tensor on another device than the stream it was asked for.
    #[error(
        "the tensor is on {tensor} but the stream belongs to cuda:{stream} (expected the same device)"
    )]
    DeviceMismatch {
        /// The tensor's device.
        tensor: Device,
        /// The ordinal of the stream's context.
        stream: usize,
    },

    // ---- pointer inspection ----
    /// An address the driver knows nothing about (a made-up number, unregistered host memory).
    #[error("address {addr:#x} is not a CUDA allocation")]
    NotAllocation {
        /// The address asked about.
        addr: usize,
    },
    /// Memory of another kind than the tensor claims.
    #[error(
        "address {addr:#x} is {found} memory (expected {expected} memory for a tensor on {device})"
    )]
    MemoryTypeMismatch {
        /// The address asked about.
        addr: usize,
        /// What the driver says it is.
        found: MemoryType,
        /// What the tensor's device needs.
        expected: MemoryType,
        /// The tensor's device.
        device: Device,
    },
    /// Device memory on another device than the tensor claims.
    #[error("address {addr:#x} is on cuda:{found} (expected {device})")]
    OrdinalMismatch {
        /// The address asked about.
        addr: usize,
        /// The ordinal the driver reports.
        found: u32,
        /// The tensor's device.
        device: Device,
    },
    /// A tensor whose bytes start before the allocation that holds its first element.
    #[error(
        "bytes [{lo:#x}, {hi:#x}) start {by} bytes before the allocation [{base:#x}, {end:#x}) on {device}"
    )]
    BeforeAllocation {
        /// The span's first byte.
        lo: usize,
        /// One past its last byte.
        hi: usize,
        /// How far before the allocation it starts.
        by: usize,
        /// The allocation's first byte.
        base: usize,
        /// One past the allocation's last byte.
        end: usize,
        /// The device the driver places the allocation on.
        device: Device,
    },
    /// A tensor whose bytes run past the end of the allocation that holds its first element.
    #[error(
        "bytes [{lo:#x}, {hi:#x}) run {by} bytes past the allocation [{base:#x}, {end:#x}) on {device}"
    )]
    PastAllocation {
        /// The span's first byte.
        lo: usize,
        /// One past its last byte.
        hi: usize,
        /// How far past the allocation it runs.
        by: usize,
        /// The allocation's first byte.
        base: usize,
        /// One past the allocation's last byte.
        end: usize,
        /// The device the driver places the allocation on.
        device: Device,
    },

    // ---- sharing with another process (`ipc`) ----
    /// Bytes that are not a share handle at all.
    #[error(
        "these {len} bytes are not a tensorbridge share handle (expected the bytes of tensorbridge.share or tensorbridge_cuda::ipc::export, which start with \"TBSHARE\")"
    )]
    IpcNotAHandle {
        /// How many bytes were given.
        len: usize,
    },
    /// A share handle shorter or longer than it says it is.
    #[error(
        "the share handle is {len} bytes long but {expected} were expected (a truncated or padded handle)"
    )]
    IpcHandleLength {
        /// How many bytes were given.
        len: usize,
        /// How many the handle needs.
        expected: usize,
    },
    /// A share handle of another format version.
    #[error(
        "the share handle has format version {found} (expected {expected}: the producing and the opening process run incompatible tensorbridge versions)"
    )]
    IpcHandleVersion {
        /// The handle's version.
        found: u32,
        /// The version this build reads.
        expected: u32,
    },
    /// A share handle whose checksum does not match its bytes.
    #[error(
        "the share handle's checksum is {found:#018x} but its bytes hash to {computed:#018x} (a corrupted or altered handle)"
    )]
    IpcHandleChecksum {
        /// The checksum the handle carries.
        found: u64,
        /// The checksum of its bytes.
        computed: u64,
    },
    /// A share handle with a field no producer writes.
    #[error("the share handle's {field} is {value} (expected {expected})")]
    IpcHandleField {
        /// The field.
        field: &'static str,
        /// Its value.
        value: u64,
        /// What a producer writes there.
        expected: &'static str,
    },
    /// A share handle whose tensor reaches outside the allocation it names.
    #[error(
        "the share handle describes bytes [{lo}, {hi}) of an allocation of {size} bytes (expected the tensor inside its allocation: an altered handle)"
    )]
    IpcHandleSpan {
        /// The first byte, from the allocation's start.
        lo: i128,
        /// One past the last byte, from the allocation's start.
        hi: i128,
        /// The allocation's size.
        size: u64,
    },
    /// A tensor whose device CUDA IPC cannot share.
    #[error(
        "memory on {device} cannot be shared with another process (expected cuda device memory; CUDA IPC does not share pinned host or managed memory)"
    )]
    IpcNotDevice {
        /// The tensor's device.
        device: Device,
    },
    /// Memory of a kind CUDA IPC cannot share, behind a tensor that claims device memory.
    #[error(
        "address {addr:#x} is {memory} memory, which CUDA IPC cannot share (expected device memory)"
    )]
    IpcMemoryType {
        /// The tensor's address.
        addr: usize,
        /// What the driver says it is.
        memory: MemoryType,
    },
    /// Memory mapped with the virtual memory management API.
    #[error(
        "address {addr:#x} lies in a virtual memory mapping (cuMemCreate and cuMemMap, as PyTorch's expandable segments make), which legacy CUDA IPC cannot share and this version does not share through file descriptors (expected memory from cudaMalloc: for PyTorch, PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False)"
    )]
    IpcVirtualMemory {
        /// The tensor's address.
        addr: usize,
    },
    /// Memory from a stream-ordered pool.
    #[error(
        "address {addr:#x} comes from a stream-ordered memory pool (cudaMallocAsync: CuPy's MemoryAsyncPool, PyTorch's backend:cudaMallocAsync, cudarc's allocations), which legacy CUDA IPC cannot share (expected memory from cudaMalloc or a caching allocator built on it)"
    )]
    IpcPoolMemory {
        /// The tensor's address.
        addr: usize,
    },
    /// An allocation the driver says CUDA IPC cannot share, for no reason this crate knows.
    #[error(
        "the CUDA driver says the allocation at {addr:#x} cannot be shared with CUDA IPC (expected memory from cudaMalloc; memory opened from another process's share cannot be shared again: share the original)"
    )]
    IpcNotShareable {
        /// The tensor's address.
        addr: usize,
    },
    /// A share of a GPU the opening process does not see.
    #[error(
        "the shared tensor is on {uuid}, which this process cannot see (expected that GPU among the devices CUDA_VISIBLE_DEVICES leaves visible)"
    )]
    IpcDeviceNotVisible {
        /// The GPU's UUID.
        uuid: DeviceUuid,
    },
    /// A share whose producing process has exited.
    #[error(
        "the producer of the share, process {pid}, has exited (expected it running: memory shared by a process lives only as long as that process)"
    )]
    IpcProducerGone {
        /// The producer's process id.
        pid: u32,
    },
    /// A share its producer released before this open.
    #[error(
        "the share was released by its producer, process {pid}, before this process opened it (expected the producer to still hold the handle, or a share made for more consumers)"
    )]
    IpcReleased {
        /// The producer's process id.
        pid: u32,
    },
    /// A share already held by as many processes as its slot records.
    #[error(
        "{limit} processes already hold this share (expected at most {limit} consumer processes at a time)"
    )]
    IpcTooManyConsumers {
        /// How many processes a share can record.
        limit: usize,
    },
    /// The shared-memory file that counts a share's holders could not be used.
    #[error(
        "cannot {op} the share lifetime file {path}: {} (expected a writable /dev/shm that both processes see, and both processes run by the same user)",
        std::io::Error::from_raw_os_error(*.errno)
    )]
    IpcLifetimeFile {
        /// What was being done (`create`, `open`, `map`, `read`).
        op: &'static str,
        /// The file.
        path: String,
        /// The OS error number.
        errno: i32,
    },
    /// A share lifetime file, or the per-user directory of them, that is not what this crate
    /// makes: another user's, a link, a FIFO, another mode or size, a foreign header.
    #[error("refusing the share lifetime file {path}: it is {found} (expected {expected})")]
    IpcLifetimeFileRefused {
        /// The file or directory.
        path: String,
        /// What it is.
        found: String,
        /// What it must be.
        expected: &'static str,
    },
    /// A handle of a share made by another user.
    #[error(
        "the share was made by user {handle_uid} and this process runs as user {uid} (expected producer and consumer to run as the same user: another user's memory is never mapped)"
    )]
    IpcOtherUser {
        /// The user the handle names.
        handle_uid: u32,
        /// This process's effective user.
        uid: u32,
    },
    /// A consumer stream a release cannot be ordered on.
    #[error(
        "a shared tensor cannot be opened on the {stream}: its release is ordered on that stream from whichever thread drops the tensor (expected the legacy default stream or a stream handle)"
    )]
    IpcStream {
        /// The stream given.
        stream: tensorbridge_core::Stream,
    },
}

impl Error {
    /// The `call` of a [`Error::Driver`] converted from cudarc's bare `DriverError`, which
    /// does not say which call failed (a kernel launch, in a kernel crate).
    pub const CUDARC_CALL: &'static str = "(a cudarc call)";

    /// A failed driver call, from cudarc's error type.
    pub fn driver(call: &'static str, err: DriverError) -> Error {
        Error::Driver {
            call,
            result: err.0,
        }
    }

    /// `Ok` for `CUDA_SUCCESS`, the typed error otherwise.
    pub(crate) fn check(call: &'static str, result: sys::CUresult) -> Result<(), Error> {
        match result {
            sys::CUresult::CUDA_SUCCESS => Ok(()),
            result => Err(Error::Driver { call, result }),
        }
    }

    /// This crate's error from a [`tensorbridge_core::SignalError`]: itself when the signal was
    /// this crate's, wrapped otherwise.
    pub fn from_signal(err: tensorbridge_core::SignalError) -> Error {
        match err.downcast::<Error>() {
            Ok(own) => *own,
            Err(other) => Error::Signal(Arc::from(other)),
        }
    }
}
