//! The driver API, one checked call at a time: every `cu*` function this crate calls, as an
//! `unsafe fn` that turns the `CUresult` into [`Error::Driver`] (with the call's name) and
//! reads its out-parameters, and nothing else. What each call needs to be sound is its
//! `# Safety`; the modules above this one make sure of it. Grouped by the object the call acts
//! on, as the driver API's reference is (cudarc's `result.rs` is the model: a thin wrapper
//! over `sys`).
//!
//! Every function here needs libcuda loaded and initialised: [`ensure_driver`] succeeded (or a
//! cudarc context exists, which proves both: cudarc calls `cuInit` before it makes one). That is obligation 0 of every `# Safety` below,
//! written once here.

use std::sync::OnceLock;

use cudarc::driver::sys;

use crate::error::Error;

/// Whether libcuda can be loaded on this machine. Checked once, then cached.
///
/// Every driver-facing function of this crate returns [`Error::NoDriver`] instead of
/// touching cudarc when this is false.
///
/// The dynamic loader is asked, not cudarc: cudarc's own check (`is_culib_present`) exists
/// only when cudarc loads libcuda at run time, and this crate also builds where cudarc links
/// it (candle-core's `cuda` feature asks for `dynamic-linking`, which takes over the
/// workspace's `fallback-dynamic-loading`). The answer holds in both modes:
/// - cudarc loading: every name tried here (`libcuda.so.1`, `libcuda.so`) is one cudarc's
///   loader also tries, so when one opens here, cudarc's first driver call finds a libcuda
///   and does not panic;
/// - cudarc linking: libcuda is already mapped (the process could not have started, or the
///   extension module been imported, without it), and opening its soname returns that
///   mapped library.
pub fn driver_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    *PRESENT.get_or_init(|| {
        LIBCUDA_NAMES.iter().any(|&name| {
            // SAFETY: opening libcuda runs its initialisers, as cudarc's first call would (or,
            // when it is linked, did already); the handle is dropped at once, and nothing of
            // the library is called or kept.
            unsafe { libloading::Library::new(name) }.is_ok()
        })
    })
}

/// The names [`driver_present`] opens libcuda by, the driver's soname first: each is among
/// those cudarc's loader tries (`cudarc::get_lib_name_candidates`, which cudarc defines only
/// when loading).
#[cfg(not(windows))]
const LIBCUDA_NAMES: &[&str] = &["libcuda.so.1", "libcuda.so"];
#[cfg(windows)]
const LIBCUDA_NAMES: &[&str] = &["nvcuda.dll"];

/// `Ok` when libcuda is loaded and initialised (`cuInit`, once per process, before any other
/// driver call of this crate: a driver call before it fails with
/// `CUDA_ERROR_NOT_INITIALIZED`, so every public entry can be a process's first CUDA call).
/// [`Error::NoDriver`] without libcuda, [`Error::Driver`] naming `cuInit` when the driver
/// refuses to start (no device, a driver too old for the bindings).
pub(crate) fn ensure_driver() -> Result<(), Error> {
    static INIT: OnceLock<sys::CUresult> = OnceLock::new();
    if !driver_present() {
        return Err(Error::NoDriver);
    }
    let result = *INIT.get_or_init(|| {
        // SAFETY: libcuda is loaded (just checked); `cuInit(0)` takes no pointer, may be
        // called from any thread and any number of times (later calls return at once), and
        // cudarc makes the same call before its first context.
        unsafe { sys::cuInit(0) }
    });
    Error::check("cuInit", result)
}

/// `cuDriverGetVersion`: the driver's version (12030 for CUDA 12.3).
///
/// # Safety
/// 0. libcuda is loaded (the module docs).
pub(crate) unsafe fn driver_version() -> Result<i32, Error> {
    let mut v = 0;
    // SAFETY: libcuda is loaded (obligation 0); the driver writes one int through a pointer to
    // a live local.
    Error::check("cuDriverGetVersion", unsafe {
        sys::cuDriverGetVersion(&mut v)
    })?;
    Ok(v)
}

/// Devices: ordinals, the count, UUIDs. These need no context, only an initialised driver.
/// (Used by `ipc`, which is Linux only.)
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
pub(crate) mod device {
    use std::mem::MaybeUninit;

    use cudarc::driver::sys;

    use crate::error::Error;

    /// `cuDeviceGet`: the device the driver calls `ordinal` (refused when there is none).
    ///
    /// # Safety
    /// 0. libcuda is loaded and initialised (the module docs).
    pub(crate) unsafe fn get(ordinal: i32) -> Result<sys::CUdevice, Error> {
        let mut dev: sys::CUdevice = 0;
        // SAFETY: obligation 0; the driver writes one int through a pointer to a live local.
        Error::check("cuDeviceGet", unsafe {
            sys::cuDeviceGet(&mut dev, ordinal)
        })?;
        Ok(dev)
    }

    /// `cuDeviceGetCount`: how many devices this process sees.
    ///
    /// # Safety
    /// 0. libcuda is loaded and initialised (the module docs).
    pub(crate) unsafe fn count() -> Result<i32, Error> {
        let mut n = 0;
        // SAFETY: obligation 0; the driver writes one int through a pointer to a live local.
        Error::check("cuDeviceGetCount", unsafe { sys::cuDeviceGetCount(&mut n) })?;
        Ok(n)
    }

    /// `cuDeviceGetUuid_v2`: the device's 16-byte UUID.
    ///
    /// # Safety
    /// 0. libcuda is loaded and initialised (the module docs), and the driver has the entry
    ///    point (version 11040 or later: cudarc panics on a missing symbol);
    /// 1. `dev` is a device the driver named ([`get`]).
    pub(crate) unsafe fn uuid(dev: sys::CUdevice) -> Result<[u8; 16], Error> {
        let mut uuid = MaybeUninit::<sys::CUuuid>::zeroed();
        // SAFETY: obligations 0 and 1; the driver writes 16 bytes into a live local.
        Error::check("cuDeviceGetUuid_v2", unsafe {
            sys::cuDeviceGetUuid_v2(uuid.as_mut_ptr(), dev)
        })?;
        // SAFETY: zero-initialised plain bytes (every bit pattern is valid), written by the
        // successful call.
        let uuid = unsafe { uuid.assume_init() };
        Ok(uuid.bytes.map(|b| b as u8))
    }
}

/// Contexts: the calling thread's current context and its device.
pub(crate) mod ctx {
    use std::mem::MaybeUninit;

    use cudarc::driver::sys;

    use crate::error::Error;

    /// `cuCtxGetCurrent`: the context current on the calling thread (null when none is).
    ///
    /// # Safety
    /// 0. libcuda is loaded and initialised (the module docs).
    pub(crate) unsafe fn get_current() -> Result<sys::CUcontext, Error> {
        let mut current = MaybeUninit::<sys::CUcontext>::uninit();
        // SAFETY: libcuda is loaded (obligation 0); the driver writes one handle through a
        // pointer to a live local and keeps no reference to it.
        Error::check("cuCtxGetCurrent", unsafe {
            sys::cuCtxGetCurrent(current.as_mut_ptr())
        })?;
        // SAFETY: initialised by the successful call just above.
        Ok(unsafe { current.assume_init() })
    }

    /// `cuCtxSetCurrent`: makes `ctx` current on the calling thread (null unbinds).
    ///
    /// # Safety
    /// 0. libcuda is loaded and initialised (the module docs);
    /// 1. `ctx` is null or a live context (not destroyed).
    pub(crate) unsafe fn set_current(ctx: sys::CUcontext) -> Result<(), Error> {
        // SAFETY: obligations 0 and 1.
        Error::check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(ctx) })
    }

    /// `cuCtxGetDevice`: the device of the current context.
    ///
    /// # Safety
    /// 0. libcuda is loaded and initialised (the module docs);
    /// 1. a context is current on the calling thread.
    pub(crate) unsafe fn get_device() -> Result<sys::CUdevice, Error> {
        let mut dev: sys::CUdevice = 0;
        // SAFETY: obligations 0 and 1; the driver writes one int through a pointer to a live
        // local.
        Error::check("cuCtxGetDevice", unsafe { sys::cuCtxGetDevice(&mut dev) })?;
        Ok(dev)
    }
}

/// Events.
pub(crate) mod event {
    use std::mem::MaybeUninit;

    use cudarc::driver::sys;

    use crate::error::Error;

    /// A `CUevent` handle that crosses threads (kept in pools).
    pub(crate) struct Handle(pub(crate) sys::CUevent);

    // SAFETY: a `CUevent` is a driver handle, not thread-affine: the driver API is thread-safe
    // and any thread may record, wait on, query or destroy an event (with its context current
    // where the call needs one, which the callers arrange).
    unsafe impl Send for Handle {}

    /// `cuEventCreate` with `flags`, in the current context.
    ///
    /// # Safety
    /// 0. libcuda is loaded and initialised (the module docs);
    /// 1. a context is current on the calling thread (the event's).
    pub(crate) unsafe fn create(flags: u32) -> Result<sys::CUevent, Error> {
        let mut raw = MaybeUninit::<sys::CUevent>::uninit();
        // SAFETY: obligations 0 and 1; the driver writes one handle through a pointer to a
        // live local and keeps no reference to it.
        Error::check("cuEventCreate", unsafe {
            sys::cuEventCreate(raw.as_mut_ptr(), flags)
        })?;
        // SAFETY: initialised by the successful call just above.
        Ok(unsafe { raw.assume_init() })
    }

    /// `cuEventRecord`: captures the work enqueued on `stream` so far.
    ///
    /// # Safety
    /// 0. libcuda is loaded and initialised (the module docs);
    /// 1. `event` is a live event, and its context is current;
    /// 2. `stream` is a live stream for the call: a default-stream sentinel (`0x1`, `0x2`,
    ///    null: the current context's) or the handle of a stream not destroyed. (The driver
    ///    refuses a live handle of another context; a destroyed or made-up one is undefined
    ///    behaviour.)
    pub(crate) unsafe fn record(event: sys::CUevent, stream: sys::CUstream) -> Result<(), Error> {
        // SAFETY: obligations 0 to 2.
        Error::check("cuEventRecord", unsafe {
            sys::cuEventRecord(event, stream)
        })
    }

    /// `cuEventQuery`: whether the captured work has finished; never blocks.
    ///
    /// # Safety
    /// 0. libcuda is loaded and initialised (the module docs);
    /// 1. `event` is a live event.
    pub(crate) unsafe fn query(event: sys::CUevent) -> Result<bool, Error> {
        // SAFETY: obligations 0 and 1.
        match unsafe { sys::cuEventQuery(event) } {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            result => Err(Error::Driver {
                call: "cuEventQuery",
                result,
            }),
        }
    }

    /// `cuEventSynchronize`: blocks the calling thread until the captured work has finished
    /// (yielding the core for events made with `CU_EVENT_BLOCKING_SYNC`, spinning otherwise).
    ///
    /// # Safety
    /// 0. libcuda is loaded and initialised (the module docs);
    /// 1. `event` is a live event, and its context is current.
    pub(crate) unsafe fn synchronize(event: sys::CUevent) -> Result<(), Error> {
        // SAFETY: obligations 0 and 1.
        Error::check("cuEventSynchronize", unsafe {
            sys::cuEventSynchronize(event)
        })
    }

    /// `cuEventDestroy`. Pending work that recorded or waits on the event is unaffected: the
    /// driver releases the event once that work completes.
    ///
    /// # Safety
    /// 0. libcuda is loaded and initialised (the module docs);
    /// 1. `event` is a live event, and its context is current;
    /// 2. nothing uses `event` after this call (it is destroyed exactly once).
    pub(crate) unsafe fn destroy(event: sys::CUevent) -> Result<(), Error> {
        // SAFETY: obligations 0 to 2.
        Error::check("cuEventDestroy", unsafe { sys::cuEventDestroy_v2(event) })
    }
}

/// Streams.
pub(crate) mod stream {
    use cudarc::driver::sys;

    use crate::error::Error;

    /// `cuStreamGetCtx`: the context a stream belongs to.
    ///
    /// # Safety
    /// 0. libcuda is loaded and initialised (the module docs);
    /// 1. `stream` is the handle of a live stream (not a default-stream sentinel).
    pub(crate) unsafe fn get_ctx(stream: sys::CUstream) -> Result<sys::CUcontext, Error> {
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: obligations 0 and 1; the driver writes one handle through a pointer to a
        // live local.
        Error::check("cuStreamGetCtx", unsafe {
            sys::cuStreamGetCtx(stream, &mut ctx)
        })?;
        Ok(ctx)
    }

    /// `cuStreamCreate` with `flags`, in the current context.
    ///
    /// # Safety
    /// 0. libcuda is loaded and initialised (the module docs);
    /// 1. a context is current on the calling thread (the stream's).
    pub(crate) unsafe fn create(flags: u32) -> Result<sys::CUstream, Error> {
        let mut stream: sys::CUstream = std::ptr::null_mut();
        // SAFETY: obligations 0 and 1; the driver writes one handle through a pointer to a
        // live local.
        Error::check("cuStreamCreate", unsafe {
            sys::cuStreamCreate(&mut stream, flags)
        })?;
        Ok(stream)
    }

    /// `cuStreamSynchronize`: blocks the calling thread until the work enqueued on `stream`
    /// has finished.
    ///
    /// # Safety
    /// 0. libcuda is loaded and initialised (the module docs);
    /// 1. `stream` is a live stream for the call, and a context is current (whose default
    ///    streams the sentinels name).
    pub(crate) unsafe fn synchronize(stream: sys::CUstream) -> Result<(), Error> {
        // SAFETY: obligations 0 and 1.
        Error::check("cuStreamSynchronize", unsafe {
            sys::cuStreamSynchronize(stream)
        })
    }

    /// `cuStreamWaitEvent`: work enqueued on `stream` after this call waits, on the device,
    /// for the work `event` captured. Never blocks the host.
    ///
    /// # Safety
    /// 0. libcuda is loaded and initialised (the module docs);
    /// 1. `event` is a live event (of any context);
    /// 2. `stream` is a live stream for the call (as for [`super::event::record`]; the
    ///    sentinels name the current context's default streams).
    pub(crate) unsafe fn wait_event(
        stream: sys::CUstream,
        event: sys::CUevent,
        flags: u32,
    ) -> Result<(), Error> {
        // SAFETY: obligations 0 to 2.
        Error::check("cuStreamWaitEvent", unsafe {
            sys::cuStreamWaitEvent(stream, event, flags)
        })
    }

    /// What `cuStreamGetCaptureInfo` says of a stream: the status as the driver's integer
    /// (a newer driver's value must not become an invalid Rust enum), the capture's id and
    /// the graph being built (null from the old entry point).
    #[derive(Clone, Copy, Debug)]
    pub(crate) struct CaptureInfo {
        pub(crate) status: u32,
        pub(crate) id: u64,
        pub(crate) graph: sys::CUgraph,
    }

    /// `cuStreamGetCaptureInfo_v3` (CUDA 12.3): status, id and graph, no dependencies.
    /// `CUDA_ERROR_STREAM_CAPTURE_IMPLICIT` (the legacy stream while a blocking stream is
    /// captured) comes back as that [`Error::Driver`].
    ///
    /// # Safety
    /// 0. libcuda is loaded and initialised (the module docs), and the driver has the entry
    ///    point (version 12030 or later: cudarc panics on a missing symbol);
    /// 1. `stream` is a live stream for the call, and a context is current (whose default
    ///    streams the sentinels name).
    pub(crate) unsafe fn capture_info(stream: sys::CUstream) -> Result<CaptureInfo, Error> {
        let mut status: u32 = u32::MAX;
        let status_out = (&raw mut status).cast::<sys::CUstreamCaptureStatus>();
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        let mut id: sys::cuuint64_t = 0;
        // SAFETY: obligations 0 and 1; the driver writes the status (an `enum`, the size of a
        // `u32`), id and graph through pointers to live locals, and is told (nulls) not to
        // return the dependency arrays.
        Error::check("cuStreamGetCaptureInfo", unsafe {
            sys::cuStreamGetCaptureInfo_v3(
                stream,
                status_out,
                &mut id,
                &mut graph,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        })?;
        Ok(CaptureInfo { status, id, graph })
    }

    /// `cuStreamIsCapturing`: the status alone, for drivers older than CUDA 12.3 (id 0, no
    /// graph).
    ///
    /// # Safety
    /// As [`capture_info`], without the version requirement.
    pub(crate) unsafe fn is_capturing(stream: sys::CUstream) -> Result<CaptureInfo, Error> {
        let mut status: u32 = u32::MAX;
        let status_out = (&raw mut status).cast::<sys::CUstreamCaptureStatus>();
        // SAFETY: as above, for the status alone.
        Error::check("cuStreamIsCapturing", unsafe {
            sys::cuStreamIsCapturing(stream, status_out)
        })?;
        Ok(CaptureInfo {
            status,
            id: 0,
            graph: std::ptr::null_mut(),
        })
    }
}

/// Graphs: user objects that live as long as a graph.
pub(crate) mod graph {
    use std::ffi::c_void;

    use cudarc::driver::sys;

    use crate::error::Error;

    /// `cuUserObjectCreate` with one reference and `CU_USER_OBJECT_NO_DESTRUCTOR_SYNC`.
    ///
    /// # Safety
    /// 0. libcuda is loaded and initialised (the module docs);
    /// 1. `destroy(data)` is sound to call once, from a driver thread, when the last
    ///    reference goes, and calls no CUDA function (the driver forbids it there).
    pub(crate) unsafe fn user_object_create(
        data: *mut c_void,
        destroy: unsafe extern "C" fn(*mut c_void),
    ) -> Result<sys::CUuserObject, Error> {
        let mut user: sys::CUuserObject = std::ptr::null_mut();
        let flags = sys::CUuserObject_flags_enum::CU_USER_OBJECT_NO_DESTRUCTOR_SYNC as u32;
        // SAFETY: obligations 0 and 1; the driver writes the handle through a pointer to a
        // live local.
        Error::check("cuUserObjectCreate", unsafe {
            sys::cuUserObjectCreate(&mut user, data, Some(destroy), 1, flags)
        })?;
        Ok(user)
    }

    /// `cuGraphRetainUserObject` with `CU_GRAPH_USER_OBJECT_MOVE`: the caller's one reference
    /// moves to the graph.
    ///
    /// # Safety
    /// 0. libcuda is loaded and initialised (the module docs);
    /// 1. `graph` is a live graph (a capture in progress's) and `user` a live user object
    ///    whose reference the caller holds.
    pub(crate) unsafe fn retain_user_object_move(
        graph: sys::CUgraph,
        user: sys::CUuserObject,
    ) -> Result<(), Error> {
        let moved = sys::CUuserObjectRetain_flags_enum::CU_GRAPH_USER_OBJECT_MOVE as u32;
        // SAFETY: obligations 0 and 1.
        Error::check("cuGraphRetainUserObject", unsafe {
            sys::cuGraphRetainUserObject(graph, user, 1, moved)
        })
    }
}

/// The calling thread's stream-capture mode.
pub(crate) mod capture_mode {
    use cudarc::driver::sys;

    use crate::error::Error;

    /// `cuThreadExchangeStreamCaptureMode`: sets the calling thread's mode to `*mode` and
    /// writes the previous one there.
    ///
    /// # Safety
    /// 0. libcuda is loaded and initialised (the module docs).
    pub(crate) unsafe fn exchange(mode: &mut sys::CUstreamCaptureMode) -> Result<(), Error> {
        // SAFETY: obligation 0; the driver swaps the value behind a pointer to a live local.
        Error::check("cuThreadExchangeStreamCaptureMode", unsafe {
            sys::cuThreadExchangeStreamCaptureMode(mode)
        })
    }
}

/// Pointer attributes.
pub(crate) mod pointer {
    use std::ffi::c_void;

    use cudarc::driver::sys;

    use crate::error::Error;

    /// `cuPointerGetAttributes`: `attributes[i]` of `addr` written through `slots[i]`.
    ///
    /// # Safety
    /// 0. libcuda is loaded and initialised (the module docs);
    /// 1. a context is current on the calling thread;
    /// 2. `attributes` and `slots` have equal lengths, and each `slots[i]` points to live,
    ///    writable memory, aligned and large enough for `attributes[i]`'s value.
    pub(crate) unsafe fn get_attributes(
        attributes: &mut [sys::CUpointer_attribute],
        slots: &mut [*mut c_void],
        addr: usize,
    ) -> Result<(), Error> {
        debug_assert_eq!(attributes.len(), slots.len());
        // SAFETY: obligations 0 to 2; the driver keeps no pointer after returning; `addr` is
        // only looked up, never dereferenced.
        Error::check("cuPointerGetAttributes", unsafe {
            sys::cuPointerGetAttributes(
                attributes.len() as u32,
                attributes.as_mut_ptr(),
                slots.as_mut_ptr(),
                addr as sys::CUdeviceptr,
            )
        })
    }
}

/// Device memory.
pub(crate) mod mem {
    use cudarc::driver::sys;

    use crate::error::Error;

    /// `cuMemAlloc`: `len` (> 0) bytes of device memory in the current context.
    ///
    /// # Safety
    /// 0. libcuda is loaded and initialised (the module docs);
    /// 1. a context is current on the calling thread (the memory's).
    pub(crate) unsafe fn alloc(len: usize) -> Result<sys::CUdeviceptr, Error> {
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: obligations 0 and 1; the driver writes the address through a pointer to a
        // live local.
        Error::check("cuMemAlloc", unsafe { sys::cuMemAlloc_v2(&mut ptr, len) })?;
        Ok(ptr)
    }

    /// `cuMemFree`. The driver waits for work still using the memory before it frees it.
    ///
    /// # Safety
    /// 0. libcuda is loaded and initialised (the module docs);
    /// 1. `ptr` came from [`alloc`] in the context now current, and is freed once.
    pub(crate) unsafe fn free(ptr: sys::CUdeviceptr) -> Result<(), Error> {
        // SAFETY: obligations 0 and 1.
        Error::check("cuMemFree", unsafe { sys::cuMemFree_v2(ptr) })
    }

    /// `cuMemcpyAsync`: `len` bytes from `src` to `dst` (any addresses unified addressing
    /// knows: device, managed, pinned or pageable host memory), enqueued on `stream`.
    ///
    /// # Safety
    /// 0. libcuda is loaded and initialised (the module docs);
    /// 1. a context is current, and `stream` is a live stream for the call (the sentinels
    ///    name the current context's default streams);
    /// 2. `src` is readable and `dst` writable for `len` bytes until the copy has run (for
    ///    pageable host memory, until the call returns: the driver stages it), and they do
    ///    not overlap.
    pub(crate) unsafe fn memcpy_async(
        dst: usize,
        src: usize,
        len: usize,
        stream: sys::CUstream,
    ) -> Result<(), Error> {
        // SAFETY: obligations 0 to 2.
        Error::check("cuMemcpyAsync", unsafe {
            sys::cuMemcpyAsync(
                dst as sys::CUdeviceptr,
                src as sys::CUdeviceptr,
                len,
                stream,
            )
        })
    }

    /// `cuMemGetAddressRange_v2`: the start and size of the allocation that contains `ptr`.
    ///
    /// # Safety
    /// 0. libcuda is loaded and initialised (the module docs);
    /// 1. a context is current on the calling thread. `ptr` is only looked up.
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    pub(crate) unsafe fn address_range(
        ptr: sys::CUdeviceptr,
    ) -> Result<(sys::CUdeviceptr, usize), Error> {
        let mut start: sys::CUdeviceptr = 0;
        let mut len: usize = 0;
        // SAFETY: obligations 0 and 1; the driver writes two values into live locals.
        Error::check("cuMemGetAddressRange", unsafe {
            sys::cuMemGetAddressRange_v2(&mut start, &mut len, ptr)
        })?;
        Ok((start, len))
    }

    /// `cuMemRetainAllocationHandle`: the virtual-memory allocation handle of the mapping
    /// that contains `addr`, retained (refused for memory that is not such a mapping).
    ///
    /// # Safety
    /// 0. libcuda is loaded and initialised (the module docs);
    /// 1. a handle returned is released once ([`release`]). `addr` is only looked up.
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    pub(crate) unsafe fn retain_allocation_handle(
        addr: usize,
    ) -> Result<sys::CUmemGenericAllocationHandle, Error> {
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: obligations 0 and 1; the driver writes one handle through a pointer to a
        // live local and never dereferences `addr`.
        Error::check("cuMemRetainAllocationHandle", unsafe {
            sys::cuMemRetainAllocationHandle(&mut handle, addr as *mut std::ffi::c_void)
        })?;
        Ok(handle)
    }

    /// `cuMemRelease`: gives back one reference to a virtual-memory allocation handle.
    ///
    /// # Safety
    /// 0. libcuda is loaded and initialised (the module docs);
    /// 1. the caller holds the reference given back ([`retain_allocation_handle`]'s), and
    ///    gives it back once.
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    pub(crate) unsafe fn release(handle: sys::CUmemGenericAllocationHandle) -> Result<(), Error> {
        // SAFETY: obligations 0 and 1.
        Error::check("cuMemRelease", unsafe { sys::cuMemRelease(handle) })
    }
}

/// Legacy CUDA IPC: memory and event handles another process of the machine can open.
/// (Mostly used by `ipc`, which is Linux only.)
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
pub(crate) mod ipc {
    use std::mem::MaybeUninit;

    use cudarc::driver::sys;

    use crate::error::Error;

    /// `cuIpcGetMemHandle`: the 64-byte handle of the allocation that starts at `base`.
    ///
    /// # Safety
    /// 0. libcuda is loaded and initialised (the module docs);
    /// 1. a context is current on the calling thread (the allocation's). `base` is only
    ///    looked up: an address that starts no allocation is refused by the driver, not
    ///    misused.
    pub(crate) unsafe fn get_mem_handle(base: sys::CUdeviceptr) -> Result<[u8; 64], Error> {
        let mut h = MaybeUninit::<sys::CUipcMemHandle>::zeroed();
        // SAFETY: obligations 0 and 1; the driver writes 64 bytes into a live local.
        Error::check("cuIpcGetMemHandle", unsafe {
            sys::cuIpcGetMemHandle(h.as_mut_ptr(), base)
        })?;
        // SAFETY: zero-initialised plain bytes, written by the successful call.
        Ok(unsafe { h.assume_init() }.reserved.map(|b| b as u8))
    }

    /// `cuIpcOpenMemHandle_v2`: maps the allocation `handle` names into the current context
    /// and returns its address there. A handle that names nothing is refused by the driver.
    ///
    /// # Safety
    /// 0. libcuda is loaded and initialised (the module docs);
    /// 1. a context is current on the calling thread (the one to map into);
    /// 2. the mapping is closed once ([`close_mem_handle`]), in that context, after every use
    ///    of it.
    pub(crate) unsafe fn open_mem_handle(
        handle: &[u8; 64],
        flags: u32,
    ) -> Result<sys::CUdeviceptr, Error> {
        let h = sys::CUipcMemHandle {
            reserved: handle.map(|b| b as std::ffi::c_char),
        };
        let mut base: sys::CUdeviceptr = 0;
        // SAFETY: obligations 0 to 2; the driver reads the handle by value and writes one
        // address into a live local.
        Error::check("cuIpcOpenMemHandle", unsafe {
            sys::cuIpcOpenMemHandle_v2(&mut base, h, flags)
        })?;
        Ok(base)
    }

    /// `cuIpcCloseMemHandle`: unmaps what [`open_mem_handle`] mapped.
    ///
    /// # Safety
    /// 0. libcuda is loaded and initialised (the module docs);
    /// 1. the context the mapping was opened in is current;
    /// 2. `base` came from [`open_mem_handle`], is closed once, and nothing uses the mapping
    ///    afterwards (no view of it is left, no device work on it is pending).
    pub(crate) unsafe fn close_mem_handle(base: sys::CUdeviceptr) -> Result<(), Error> {
        // SAFETY: obligations 0 to 2.
        Error::check("cuIpcCloseMemHandle", unsafe {
            sys::cuIpcCloseMemHandle(base)
        })
    }

    /// `cuIpcGetEventHandle`: the 64-byte handle of an interprocess event.
    ///
    /// # Safety
    /// 0. libcuda is loaded and initialised (the module docs);
    /// 1. `event` is a live event made with `CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING`
    ///    (the driver refuses other events).
    pub(crate) unsafe fn get_event_handle(event: sys::CUevent) -> Result<[u8; 64], Error> {
        let mut h = MaybeUninit::<sys::CUipcEventHandle>::zeroed();
        // SAFETY: obligations 0 and 1; the driver writes 64 bytes into a live local.
        Error::check("cuIpcGetEventHandle", unsafe {
            sys::cuIpcGetEventHandle(h.as_mut_ptr(), event)
        })?;
        // SAFETY: zero-initialised plain bytes, written by the successful call.
        Ok(unsafe { h.assume_init() }.reserved.map(|b| b as u8))
    }

    /// `cuIpcOpenEventHandle`: another process's interprocess event, opened in the current
    /// context. A handle that names nothing is refused by the driver.
    ///
    /// # Safety
    /// 0. libcuda is loaded and initialised (the module docs);
    /// 1. a context is current on the calling thread;
    /// 2. the event is destroyed once ([`super::event::destroy`]), after every use of it.
    pub(crate) unsafe fn open_event_handle(handle: &[u8; 64]) -> Result<sys::CUevent, Error> {
        let h = sys::CUipcEventHandle {
            reserved: handle.map(|b| b as std::ffi::c_char),
        };
        let mut raw: sys::CUevent = std::ptr::null_mut();
        // SAFETY: obligations 0 to 2; the driver reads the handle by value and writes one
        // event into a live local.
        Error::check("cuIpcOpenEventHandle", unsafe {
            sys::cuIpcOpenEventHandle(&mut raw, h)
        })?;
        Ok(raw)
    }
}
