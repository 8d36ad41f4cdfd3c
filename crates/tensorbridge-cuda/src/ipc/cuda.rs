//! The driver side of sharing: GPUs by UUID, what kind of allocation an address lies in,
//! legacy IPC memory handles (get, open, close) and interprocess events (the producer's, from
//! the layer's event pool, and the consumer's imported ones).
//!
//! On the layer below, like every module of the crate: driver calls through `raw` only,
//! events from `event`'s pool (`Kind::Interprocess`), the producer's ordering on a stream of
//! `scope`'s spares through `handoff`. Every call binds the device's primary context for its
//! own duration and puts the caller's back (`crate::context::bind`); none blocks the host.

use std::sync::OnceLock;

use cudarc::driver::sys;
use tensorbridge_core::Tensor;

use super::wire::DeviceUuid;
use crate::Error;
use crate::capture::driver_version;
use crate::context::{bind, device};
use crate::event::{Event, Kind};
use crate::raw::{self, ensure_driver};
use crate::scope::with_spare;

/// The UUID of the device this process calls `ordinal`.
pub fn device_uuid(ordinal: u32) -> Result<DeviceUuid, Error> {
    ensure_driver()?;
    uuid_of(
        i32::try_from(ordinal)
            .map_err(|_| tensorbridge_core::Error::OrdinalTooLarge { ordinal })?,
    )
}

/// The UUID of device `ordinal`; the driver is initialised (the callers' `ensure_driver`).
fn uuid_of(ordinal: i32) -> Result<DeviceUuid, Error> {
    if driver_version() < 11040 {
        // `cuDeviceGetUuid_v2` (CUDA 11.4) is the only UUID entry point the CUDA 13 bindings
        // have; cudarc would panic on the missing symbol.
        return Err(Error::Driver {
            call: "cuDeviceGetUuid_v2",
            result: sys::CUresult::CUDA_ERROR_NOT_SUPPORTED,
        });
    }
    // SAFETY: the driver is initialised (the callers' `ensure_driver`).
    let dev = unsafe { raw::device::get(ordinal) }?;
    // SAFETY: the driver is initialised and has the entry point (version checked above);
    // `dev` is a device the driver just named.
    Ok(DeviceUuid(unsafe { raw::device::uuid(dev) }?))
}

/// The ordinal this process gives the device with `uuid`: the devices this process sees
/// (after `CUDA_VISIBLE_DEVICES`) are asked once and remembered.
pub(crate) fn ordinal_of(uuid: DeviceUuid) -> Result<u32, Error> {
    static VISIBLE: OnceLock<Vec<DeviceUuid>> = OnceLock::new();
    ensure_driver()?;
    let visible = match VISIBLE.get() {
        Some(v) => v,
        None => {
            // SAFETY: the driver is initialised (just above).
            let n = unsafe { raw::device::count() }?;
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
    let mut attributes = [
        sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
        sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE,
    ];
    let mut values = [0u64; 2];
    let mut slots: [*mut std::ffi::c_void; 2] =
        std::array::from_fn(|i| (&raw mut values[i]).cast());
    // SAFETY: the driver is initialised (`device` checked it) and a context is current (bound
    // above); the two lists have one entry per attribute, and each slot points to a zeroed,
    // aligned `u64`, room for its attribute (a bool, a pool handle: at most 8 bytes).
    let answered = unsafe { raw::pointer::get_attributes(&mut attributes, &mut slots, base) };
    if answered.is_err() {
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
    // SAFETY: the driver is initialised; a handle retained here is released just below.
    if let Ok(vmm) = unsafe { raw::mem::retain_allocation_handle(base) } {
        // SAFETY: the reference the successful call above retained, given back once.
        let _ = unsafe { raw::mem::release(vmm) };
        return Err(Error::IpcVirtualMemory { addr: base });
    }
    Err(Error::IpcNotShareable { addr: base })
}

/// The legacy IPC handle of the allocation that starts at `base` on device `ordinal`.
pub(crate) fn mem_handle(base: usize, ordinal: u32) -> Result<[u8; 64], Error> {
    let dev = device(ordinal)?;
    let _bound = bind(dev.ctx())?;
    // SAFETY: the driver is initialised (`device` checked it) and a context is current (bound
    // above). `base` is the start of an allocation the driver reported (a wrong one is
    // refused, not misused).
    unsafe { raw::ipc::get_mem_handle(base as sys::CUdeviceptr) }
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
        let flags = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
        // SAFETY: the driver is initialised (`device` checked it) and a context is current
        // (bound above); the mapping is closed once, by the `Mapping` made just below (its
        // `Drop`, in device `ordinal`'s primary context), after its last use.
        let base = unsafe { raw::ipc::open_mem_handle(handle, flags) }?;
        // Closed again (by its `Drop`) if what follows refuses it.
        let mut mapping = Mapping {
            base,
            size: 0,
            ordinal,
        };
        // SAFETY: the driver is initialised and a context is current (as above); `base` is
        // only looked up.
        let (start, len) = unsafe { raw::mem::address_range(base) }?;
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
            // SAFETY: the driver is initialised (a mapping exists) and the context the mapping
            // was opened in is current (bound above); `base` is this mapping's, opened once
            // and closed once, here; no view of it is left (the mapping is dropped after every
            // tensor over it, and after the device work enqueued before their release has
            // finished).
            let _ = unsafe { raw::ipc::close_mem_handle(self.base) };
        }
    }
}

/// Another process's interprocess event, opened in this one (`cuIpcOpenEventHandle`, in
/// device `ordinal`'s primary context); destroyed (here) when dropped, never pooled. The
/// exporter keeps the event itself alive while this process holds the share it belongs to.
#[derive(Debug)]
pub(crate) struct ImportedEvent(pub(crate) Event);

impl ImportedEvent {
    pub(crate) fn open(handle: &[u8; 64], ordinal: u32) -> Result<ImportedEvent, Error> {
        let dev = device(ordinal)?;
        Event::open_interprocess(dev.ctx(), handle).map(ImportedEvent)
    }
}

/// An interprocess event of the producer (`CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING`)
/// with its handle, from the device's event pool (`Kind::Interprocess`). It goes back to the
/// pool when the share it was recorded for is freed (no consumer can wait on it any more), and
/// is re-recorded for a later share then.
#[derive(Debug)]
pub(crate) struct IpcEvent {
    /// Never read: kept until the share is freed, then back to the pool.
    _event: Event,
    pub(crate) handle: [u8; 64],
}

impl IpcEvent {
    /// An event of device `ordinal` that captures the work `tensor`'s readiness says is
    /// pending: a stream of the layer (one of its spares, no caller's) waits for it
    /// (GPU-side, through the crate's hand-off, whatever the readiness: a stream, this
    /// crate's signal or another adapter's), then the event is recorded there. Never blocks
    /// the host. Refused, as every hand-off, for data produced inside a CUDA graph capture.
    pub(crate) fn record_pending(tensor: &Tensor, ordinal: u32) -> Result<IpcEvent, Error> {
        let dev = device(ordinal)?;
        let event = Event::pooled_kind(&dev, Kind::Interprocess)?;
        let handle = *event.ipc_handle().ok_or(Error::Driver {
            call: "cuIpcGetEventHandle",
            result: sys::CUresult::CUDA_ERROR_INVALID_HANDLE,
        })?;
        with_spare(dev.ctx(), |stream| {
            crate::make_ready_on(tensor, stream)?;
            // SAFETY: `stream` is a stream of the event's context (device `ordinal`'s primary
            // context) that this crate made and never destroys, live for the call; it is the
            // stream the wait was enqueued on. Consumers that waited on an earlier record of a
            // pooled event have released the share it belonged to (so their waits have run)
            // before it came back to the pool.
            unsafe { event.record(stream.cu_stream()) }
        })?;
        Ok(IpcEvent {
            _event: event,
            handle,
        })
    }
}
