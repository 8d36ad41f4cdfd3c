//! The driver calls of sharing: GPUs by UUID, what kind of allocation an address lies in,
//! legacy IPC memory handles (get, open, close) and interprocess events (a producer's pool of
//! them, and the consumer's imported ones), and the producer's private stream per device.
//!
//! Every call binds the device's primary context for its own duration and puts the caller's
//! back (`crate::context::bind`); none blocks the host.

use std::ffi::c_void;
use std::mem::MaybeUninit;
use std::sync::{Mutex, OnceLock, PoisonError};

use cudarc::driver::sys;
use tensorbridge::{Stream, StreamHandle, Tensor};

use super::wire::DeviceUuid;
use crate::Error;
use crate::context::{bind, device};
use crate::raw::ensure_driver;

/// `cuDriverGetVersion` (12030 for CUDA 12.3), 0 when it cannot say.
fn driver_version() -> i32 {
    static VERSION: OnceLock<i32> = OnceLock::new();
    *VERSION.get_or_init(|| {
        let mut v = 0;
        // SAFETY: libcuda is loaded (callers checked `ensure_driver`); the driver writes one
        // int through a pointer to a live local.
        let rc = unsafe { sys::cuDriverGetVersion(&mut v) };
        if rc == sys::CUresult::CUDA_SUCCESS {
            v
        } else {
            0
        }
    })
}

/// `cuInit(0)`, once: what device queries need before any context exists (a consumer asks
/// for UUIDs before it knows which device's context to make).
fn init() -> Result<(), Error> {
    ensure_driver()?;
    static INIT: OnceLock<sys::CUresult> = OnceLock::new();
    // SAFETY: libcuda is loaded (checked just above); `cuInit` takes a flags value only.
    Error::check("cuInit", *INIT.get_or_init(|| unsafe { sys::cuInit(0) }))
}

/// The UUID of the device this process calls `ordinal`.
pub fn device_uuid(ordinal: u32) -> Result<DeviceUuid, Error> {
    init()?;
    uuid_of(i32::try_from(ordinal).map_err(|_| tensorbridge::Error::OrdinalTooLarge { ordinal })?)
}

fn uuid_of(ordinal: i32) -> Result<DeviceUuid, Error> {
    if driver_version() < 11040 {
        // `cuDeviceGetUuid_v2` (CUDA 11.4) is the only UUID entry point the CUDA 13 bindings
        // have; cudarc would panic on the missing symbol.
        return Err(Error::Driver {
            call: "cuDeviceGetUuid_v2",
            result: sys::CUresult::CUDA_ERROR_NOT_SUPPORTED,
        });
    }
    let mut dev: sys::CUdevice = 0;
    // SAFETY: the driver is initialised (`init`); it writes one int through a pointer to a
    // live local.
    Error::check("cuDeviceGet", unsafe {
        sys::cuDeviceGet(&mut dev, ordinal)
    })?;
    let mut uuid = MaybeUninit::<sys::CUuuid>::zeroed();
    // SAFETY: `dev` is a device the driver just named; it writes 16 bytes into a live local.
    Error::check("cuDeviceGetUuid_v2", unsafe {
        sys::cuDeviceGetUuid_v2(uuid.as_mut_ptr(), dev)
    })?;
    // SAFETY: zero-initialised plain bytes, written by the successful call.
    let uuid = unsafe { uuid.assume_init() };
    Ok(DeviceUuid(uuid.bytes.map(|b| b as u8)))
}

/// The ordinal this process gives the device with `uuid`: the devices this process sees
/// (after `CUDA_VISIBLE_DEVICES`) are asked once and remembered.
pub(crate) fn ordinal_of(uuid: DeviceUuid) -> Result<u32, Error> {
    static VISIBLE: OnceLock<Vec<DeviceUuid>> = OnceLock::new();
    init()?;
    let visible = match VISIBLE.get() {
        Some(v) => v,
        None => {
            let mut n = 0;
            // SAFETY: the driver is initialised; it writes one int through a live local.
            Error::check("cuDeviceGetCount", unsafe { sys::cuDeviceGetCount(&mut n) })?;
            let all = (0..n).map(uuid_of).collect::<Result<Vec<_>, _>>()?;
            VISIBLE.get_or_init(|| all)
        }
    };
    visible
        .iter()
        .position(|u| *u == uuid)
        .map(|i| i as u32)
        .ok_or(Error::IpcDeviceNotVisible { uuid })
}

/// Refuses, with the reason, an allocation that legacy CUDA IPC cannot share: a virtual
/// memory mapping, stream-ordered pool memory, or anything else the driver says no to
/// (`CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE`). A driver too old to answer lets
/// `cuIpcGetMemHandle` decide.
pub(crate) fn check_shareable(base: usize, ordinal: u32) -> Result<(), Error> {
    let dev = device(ordinal)?;
    let _bound = bind(dev.ctx())?;
    const ATTRIBUTES: [sys::CUpointer_attribute; 2] = [
        sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
        sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE,
    ];
    let mut values = [0u64; 2];
    let mut slots: [*mut c_void; 2] = std::array::from_fn(|i| (&raw mut values[i]).cast());
    let mut attributes = ATTRIBUTES;
    // SAFETY: a context is current (bound above); the driver writes each attribute (a bool
    // and a pool handle, at most 8 bytes each) into its zeroed, aligned `u64` slot and keeps
    // no pointer; `base` is only looked up.
    let rc = unsafe {
        sys::cuPointerGetAttributes(
            2,
            attributes.as_mut_ptr(),
            slots.as_mut_ptr(),
            base as sys::CUdeviceptr,
        )
    };
    if rc != sys::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let [capable, pool] = values;
    if capable & 0xff != 0 {
        return Ok(());
    }
    // Pools first: their memory is itself mapped through the virtual memory management API,
    // so the retain below would succeed for it too.
    if pool != 0 {
        return Err(Error::IpcPoolMemory { addr: base });
    }
    let mut vmm: sys::CUmemGenericAllocationHandle = 0;
    // SAFETY: the driver writes one handle through a pointer to a live local; `base` is only
    // looked up. A successful call retains the allocation handle, released just below.
    let retained = unsafe { sys::cuMemRetainAllocationHandle(&mut vmm, base as *mut c_void) };
    if retained == sys::CUresult::CUDA_SUCCESS {
        // SAFETY: the handle the successful call above retained, released once.
        let _ = unsafe { sys::cuMemRelease(vmm) };
        return Err(Error::IpcVirtualMemory { addr: base });
    }
    Err(Error::IpcNotShareable { addr: base })
}

/// The legacy IPC handle of the allocation that starts at `base` on device `ordinal`.
pub(crate) fn mem_handle(base: usize, ordinal: u32) -> Result<[u8; 64], Error> {
    let dev = device(ordinal)?;
    let _bound = bind(dev.ctx())?;
    let mut h = MaybeUninit::<sys::CUipcMemHandle>::zeroed();
    // SAFETY: a context is current; the driver writes 64 bytes into a live local. `base` is
    // the start of an allocation the driver reported (a wrong one is refused, not misused).
    Error::check("cuIpcGetMemHandle", unsafe {
        sys::cuIpcGetMemHandle(h.as_mut_ptr(), base as sys::CUdeviceptr)
    })?;
    // SAFETY: zero-initialised plain bytes, written by the successful call.
    Ok(unsafe { h.assume_init() }.reserved.map(|b| b as u8))
}

/// Another process's allocation, mapped into this one (`cuIpcOpenMemHandle`); closed when
/// dropped.
#[derive(Debug)]
pub(crate) struct Mapping {
    pub(crate) base: u64,
    /// The mapped size, as the driver reports it (`cuMemGetAddressRange`).
    pub(crate) size: u64,
    ordinal: u32,
}

impl Mapping {
    /// Maps the allocation `handle` names into device `ordinal`'s primary context and checks
    /// that it spans at least `size` bytes, as the share handle says (an altered size would
    /// let a view reach past the mapping).
    pub(crate) fn open(handle: &[u8; 64], ordinal: u32, size: u64) -> Result<Mapping, Error> {
        let dev = device(ordinal)?;
        let _bound = bind(dev.ctx())?;
        let h = sys::CUipcMemHandle {
            reserved: handle.map(|b| b as std::ffi::c_char),
        };
        let mut base: sys::CUdeviceptr = 0;
        let flags = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
        // SAFETY: a context is current; the driver reads the handle by value and writes one
        // pointer into a live local. A handle that names nothing is refused by the driver.
        Error::check("cuIpcOpenMemHandle", unsafe {
            sys::cuIpcOpenMemHandle_v2(&mut base, h, flags)
        })?;
        // Closed again (by its `Drop`) if what follows refuses it.
        let mut mapping = Mapping {
            base,
            size: 0,
            ordinal,
        };
        let mut start: sys::CUdeviceptr = 0;
        let mut len: usize = 0;
        // SAFETY: `base` was just mapped; the driver writes two values into live locals.
        Error::check("cuMemGetAddressRange", unsafe {
            sys::cuMemGetAddressRange_v2(&mut start, &mut len, base)
        })?;
        mapping.size = len as u64;
        // At least the handle's size: the driver may round a mapping up to its granularity,
        // and only a size beyond what is mapped could let a view reach past it.
        if start != base || mapping.size < size {
            return Err(Error::IpcHandleField {
                field: "allocation size",
                value: size,
                expected: "at most the size of the allocation the memory handle maps",
            });
        }
        Ok(mapping)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        if let Ok(dev) = device(self.ordinal)
            && let Ok(_bound) = bind(dev.ctx())
        {
            // SAFETY: `base` is this mapping's, opened once and closed once, here; no view
            // of it is left (the mapping is dropped after every tensor over it, and after the
            // device work enqueued before their release has finished).
            let _ = unsafe { sys::cuIpcCloseMemHandle(self.base) };
        }
    }
}

/// Another process's interprocess event, opened in this one (`cuIpcOpenEventHandle`);
/// destroyed (here) when dropped. The exporter keeps the event itself alive while this
/// process holds the share it belongs to.
#[derive(Debug)]
pub(crate) struct ImportedEvent {
    pub(crate) raw: sys::CUevent,
    ordinal: u32,
}

// SAFETY: a `CUevent` is a driver handle, usable from any thread (the driver API is
// thread-safe); it is destroyed once, in `Drop`.
unsafe impl Send for ImportedEvent {}
// SAFETY: `&ImportedEvent` only hands the handle to thread-safe driver calls.
unsafe impl Sync for ImportedEvent {}

impl ImportedEvent {
    pub(crate) fn open(handle: &[u8; 64], ordinal: u32) -> Result<ImportedEvent, Error> {
        let dev = device(ordinal)?;
        let _bound = bind(dev.ctx())?;
        let h = sys::CUipcEventHandle {
            reserved: handle.map(|b| b as std::ffi::c_char),
        };
        let mut raw: sys::CUevent = std::ptr::null_mut();
        // SAFETY: a context is current; the driver reads the handle by value and writes one
        // event into a live local.
        Error::check("cuIpcOpenEventHandle", unsafe {
            sys::cuIpcOpenEventHandle(&mut raw, h)
        })?;
        Ok(ImportedEvent { raw, ordinal })
    }
}

impl Drop for ImportedEvent {
    fn drop(&mut self) {
        if let Ok(dev) = device(self.ordinal)
            && let Ok(_bound) = bind(dev.ctx())
        {
            // SAFETY: opened once by `open`, destroyed once, here. Waits enqueued on it
            // before are unaffected.
            let _ = unsafe { sys::cuEventDestroy_v2(self.raw) };
        }
    }
}

/// An interprocess event of the producer (`CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING`)
/// with its handle, from a per-process pool. It goes back to the pool when the share it was
/// recorded for is freed (no consumer can wait on it any more), and is re-recorded for a
/// later share then.
#[derive(Debug)]
pub(crate) struct IpcEvent {
    raw: sys::CUevent,
    pub(crate) ordinal: u32,
    pub(crate) handle: [u8; 64],
}

// SAFETY: see `ImportedEvent`.
unsafe impl Send for IpcEvent {}
// SAFETY: see `ImportedEvent`.
unsafe impl Sync for IpcEvent {}

/// Pooled interprocess events, any device; more than this are destroyed when returned.
const EVENT_POOL_CAP: usize = 1024;
/// A raw event handle in the pool (moved out by value; `IpcEvent`'s `Drop` puts it back).
struct Pooled(sys::CUevent, u32, [u8; 64]);
// SAFETY: see `ImportedEvent`.
unsafe impl Send for Pooled {}
static EVENT_POOL: Mutex<Vec<Pooled>> = Mutex::new(Vec::new());

impl IpcEvent {
    /// A pooled event of device `ordinal`, or a new one.
    fn get(ordinal: u32) -> Result<IpcEvent, Error> {
        {
            let mut pool = EVENT_POOL.lock().unwrap_or_else(PoisonError::into_inner);
            if let Some(i) = pool.iter().position(|p| p.1 == ordinal) {
                let Pooled(raw, ordinal, handle) = pool.swap_remove(i);
                return Ok(IpcEvent {
                    raw,
                    ordinal,
                    handle,
                });
            }
        }
        let dev = device(ordinal)?;
        let _bound = bind(dev.ctx())?;
        let mut raw: sys::CUevent = std::ptr::null_mut();
        let flags = sys::CUevent_flags::CU_EVENT_INTERPROCESS as u32
            | sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        // SAFETY: a context is current; the driver writes one event into a live local.
        Error::check("cuEventCreate", unsafe {
            sys::cuEventCreate(&mut raw, flags)
        })?;
        let mut h = MaybeUninit::<sys::CUipcEventHandle>::zeroed();
        // SAFETY: `raw` is the interprocess event just made; the driver writes 64 bytes into
        // a live local.
        let rc = unsafe { sys::cuIpcGetEventHandle(h.as_mut_ptr(), raw) };
        if let Err(e) = Error::check("cuIpcGetEventHandle", rc) {
            // SAFETY: made above, destroyed once, here.
            let _ = unsafe { sys::cuEventDestroy_v2(raw) };
            return Err(e);
        }
        // SAFETY: zero-initialised plain bytes, written by the successful call.
        let handle = unsafe { h.assume_init() }.reserved.map(|b| b as u8);
        Ok(IpcEvent {
            raw,
            ordinal,
            handle,
        })
    }

    /// An event of device `ordinal` that captures the work `tensor`'s readiness says is
    /// pending: the device's private stream waits for it (GPU-side, through the crate's
    /// hand-off, whatever the readiness: a stream, this crate's signal or another adapter's),
    /// then the event is recorded there. Never blocks the host. Refused, as every hand-off,
    /// for data produced inside a CUDA graph capture.
    pub(crate) fn record_pending(tensor: &Tensor, ordinal: u32) -> Result<IpcEvent, Error> {
        let stream = private_stream(ordinal)?;
        // SAFETY: `stream` is a stream of device `ordinal`'s primary context that this crate
        // made and never destroys: live for the call (`make_ready_on_raw`'s obligation 1),
        // and the event below is recorded on it, the stream the wait was enqueued on.
        unsafe { crate::make_ready_on_raw(tensor, Stream::Handle(stream)) }?;
        let event = IpcEvent::get(ordinal)?;
        let dev = device(ordinal)?;
        let _bound = bind(dev.ctx())?;
        // SAFETY: the event is an interprocess event of this context; the stream is live (as
        // above). Consumers that waited on an earlier record of a pooled event have released
        // the share it belonged to (so their waits have run) before it came back to the pool.
        Error::check("cuEventRecord", unsafe {
            sys::cuEventRecord(event.raw, crate::raw_stream(Stream::Handle(stream)))
        })?;
        Ok(event)
    }
}

impl Drop for IpcEvent {
    fn drop(&mut self) {
        let mut pool = EVENT_POOL.lock().unwrap_or_else(PoisonError::into_inner);
        if pool.len() < EVENT_POOL_CAP {
            pool.push(Pooled(self.raw, self.ordinal, self.handle));
            return;
        }
        drop(pool);
        if let Ok(dev) = device(self.ordinal)
            && let Ok(_bound) = bind(dev.ctx())
        {
            // SAFETY: the event is ours, destroyed once (it is not in the pool).
            let _ = unsafe { sys::cuEventDestroy_v2(self.raw) };
        }
    }
}

/// The producer's private stream of device `ordinal` (non-blocking, never destroyed), where
/// interprocess events are recorded after the producer's readiness. Made with the driver API
/// directly: cudarc's `new_stream` synchronises the whole context the first time.
fn private_stream(ordinal: u32) -> Result<StreamHandle, Error> {
    static STREAMS: Mutex<Vec<(u32, StreamHandle)>> = Mutex::new(Vec::new());
    let mut streams = STREAMS.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((_, s)) = streams.iter().find(|(o, _)| *o == ordinal) {
        return Ok(*s);
    }
    let dev = device(ordinal)?;
    let _bound = bind(dev.ctx())?;
    let mut raw: sys::CUstream = std::ptr::null_mut();
    let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
    // SAFETY: a context is current; the driver writes one stream into a live local.
    Error::check("cuStreamCreate", unsafe {
        sys::cuStreamCreate(&mut raw, flags)
    })?;
    // A stream handle is an address, never 0, 1 or 2.
    let handle = StreamHandle::new(raw as usize).ok_or(Error::Driver {
        call: "cuStreamCreate",
        result: sys::CUresult::CUDA_ERROR_INVALID_HANDLE,
    })?;
    streams.push((ordinal, handle));
    Ok(handle)
}
