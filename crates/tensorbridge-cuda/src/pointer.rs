//! Pointer inspection: what the driver knows about an address, and whether a tensor's bytes
//! lie inside one live allocation on the device it claims.

use std::ffi::c_void;
use std::ops::Range;

use cudarc::driver::sys;
use tensorbridge_core::{Descriptor, Device, DeviceType};

use crate::context::{bind, current, device};
use crate::error::Error;
use crate::raw::{self, ensure_driver};
use crate::types::MemoryType;

/// What the driver knows about an address (`cuPointerGetAttributes`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PointerInfo {
    /// The address asked about.
    pub addr: usize,
    /// The kind of memory.
    pub memory: MemoryType,
    /// The device the allocation belongs to (its context's device); `None` when the driver
    /// reports none (host memory registered for all devices).
    pub ordinal: Option<u32>,
    /// The allocation's first byte (`CU_POINTER_ATTRIBUTE_RANGE_START_ADDR`).
    pub base: usize,
    /// The allocation's size in bytes (`CU_POINTER_ATTRIBUTE_RANGE_SIZE`).
    pub size: usize,
}

impl PointerInfo {
    /// The allocation's bytes, `[base, base + size)`.
    pub fn range(&self) -> Range<usize> {
        self.base..self.base.saturating_add(self.size)
    }

    /// The device as the core names it: `cuda:<ordinal>` for device memory, `cuda_managed`
    /// and `cuda_host` (ordinal 0, the DLPack convention) for the others.
    pub fn device(&self) -> Device {
        match self.memory {
            MemoryType::Device | MemoryType::Array => Device::cuda(self.ordinal.unwrap_or(0)),
            MemoryType::Managed => Device::new(DeviceType::CudaManaged, 0),
            MemoryType::Host => Device::new(DeviceType::CudaHost, 0),
        }
    }
}

/// The attributes asked for, in order; each is written into one zeroed `u64` (the widest of
/// them: `CUdeviceptr` and `size_t`), so narrower ones (`unsigned int`, `int`, `bool`) land in
/// its low bytes.
const ATTRIBUTES: [sys::CUpointer_attribute; 5] = [
    sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
    sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
    sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
    sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
    sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_IS_MANAGED,
];

/// Asks the driver what `addr` is: memory type, device, and the allocation that holds it.
///
/// Fails with [`Error::NotAllocation`] for addresses the driver does not know (made-up
/// numbers, ordinary host memory): it reports those as `CUDA_ERROR_INVALID_VALUE` or as
/// memory type 0, and both are handled. The query needs a current context; with unified
/// addressing any context answers for every device, so the caller's is used when it has one,
/// and device 0's primary context otherwise (bound for the call only: the calling thread's
/// current context is left as it was).
pub fn inspect(addr: usize) -> Result<PointerInfo, Error> {
    inspect_on(addr, 0)
}

/// [`inspect`] in the calling thread's current context, or, when it has none, with device
/// `ordinal`'s primary context current for the call (device 0's when the driver knows no
/// device `ordinal`; the answer then says where the address really is).
fn inspect_on(addr: usize, ordinal: u32) -> Result<PointerInfo, Error> {
    ensure_driver()?;
    let _bound = if current()?.is_null() {
        let dev = match device(ordinal) {
            Err(Error::Driver { .. }) if ordinal != 0 => device(0)?,
            dev => dev?,
        };
        Some(bind(dev.ctx())?)
    } else {
        None
    };
    let mut values = [0u64; ATTRIBUTES.len()];
    let mut slots: [*mut c_void; ATTRIBUTES.len()] =
        std::array::from_fn(|i| (&raw mut values[i]).cast::<c_void>());
    let mut attributes = ATTRIBUTES;
    // SAFETY: libcuda is loaded (checked above); a context is current (the caller's, or
    // bound above); each slot points to a live, zeroed, 8-byte-aligned `u64`, one per
    // attribute, and every attribute asked for is at most 8 bytes.
    match unsafe { raw::pointer::get_attributes(&mut attributes, &mut slots, addr) } {
        Ok(()) => {}
        Err(Error::Driver {
            result: sys::CUresult::CUDA_ERROR_INVALID_VALUE,
            ..
        }) => return Err(Error::NotAllocation { addr }),
        Err(e) => return Err(e),
    }
    let [memory, ordinal, base, size, managed] = values;
    parse(
        addr,
        memory as u32,
        ordinal as u32 as i32,
        base,
        size,
        managed != 0,
    )
}

/// Attribute values -> [`PointerInfo`]; `NotAllocation` for memory type 0 (unknown address).
fn parse(
    addr: usize,
    memory: u32,
    ordinal: i32,
    base: u64,
    size: u64,
    managed: bool,
) -> Result<PointerInfo, Error> {
    use sys::CUmemorytype as M;
    let memory = match memory {
        _ if managed => MemoryType::Managed,
        m if m == M::CU_MEMORYTYPE_HOST as u32 => MemoryType::Host,
        m if m == M::CU_MEMORYTYPE_DEVICE as u32 => MemoryType::Device,
        m if m == M::CU_MEMORYTYPE_ARRAY as u32 => MemoryType::Array,
        m if m == M::CU_MEMORYTYPE_UNIFIED as u32 => MemoryType::Managed,
        _ => return Err(Error::NotAllocation { addr }),
    };
    let base = usize::try_from(base).map_err(|_| Error::NotAllocation { addr })?;
    let size = usize::try_from(size).map_err(|_| Error::NotAllocation { addr })?;
    Ok(PointerInfo {
        addr,
        memory,
        ordinal: u32::try_from(ordinal).ok(),
        base,
        size,
    })
}

/// Checks, by asking the driver, that the whole of `desc.byte_span()` lies inside one live
/// allocation of the kind its device claims, on that device: what a raw pointer must pass
/// before it may become a [`Tensor`](tensorbridge_core::Tensor) (the Python `from_ptr` calls
/// this).
///
/// The allocation is the one holding element 0; the errors say which part is outside
/// ([`Error::BeforeAllocation`], [`Error::PastAllocation`]), or that the address is no
/// allocation at all ([`Error::NotAllocation`]), of the wrong kind
/// ([`Error::MemoryTypeMismatch`]) or on another device ([`Error::OrdinalMismatch`]).
/// Returns what the driver said, or `None` for tensors without elements (nothing to check).
///
/// `cuda` tensors may live in device or managed memory, `cuda_managed` ones in managed
/// memory, `cuda_host` ones in pinned host memory; other devices are refused
/// ([`Error::NotCudaMemory`]).
///
/// The answer is a snapshot: memory freed after the check is the owner's business.
pub fn check_span(desc: &Descriptor) -> Result<Option<PointerInfo>, Error> {
    if desc.numel() == 0 {
        return Ok(None);
    }
    expected_memory(desc.device())?;
    let ordinal = match desc.device().kind {
        DeviceType::Cuda => desc.device().ordinal,
        _ => 0,
    };
    let info = inspect_on(desc.data_ptr(), ordinal)?;
    check_span_with(desc, &info)?;
    Ok(Some(info))
}

/// The memory types a device kind may live in.
fn expected_memory(device: Device) -> Result<&'static [MemoryType], Error> {
    match device.kind {
        DeviceType::Cuda => Ok(&[MemoryType::Device, MemoryType::Managed]),
        DeviceType::CudaManaged => Ok(&[MemoryType::Managed]),
        DeviceType::CudaHost => Ok(&[MemoryType::Host]),
        _ => Err(Error::NotCudaMemory { device }),
    }
}

/// The checks of [`check_span`] against what the driver said about element 0 (`info`),
/// without asking the driver: pure, so it can be tested anywhere.
pub fn check_span_with(desc: &Descriptor, info: &PointerInfo) -> Result<(), Error> {
    if desc.numel() == 0 {
        return Ok(());
    }
    let device = desc.device();
    let expected = expected_memory(device)?;
    if !expected.contains(&info.memory) {
        return Err(Error::MemoryTypeMismatch {
            addr: info.addr,
            found: info.memory,
            expected: expected[0],
            device,
        });
    }
    if device.kind == DeviceType::Cuda && info.ordinal != Some(device.ordinal) {
        return Err(Error::OrdinalMismatch {
            addr: info.addr,
            // -1 (none) prints as u32::MAX; device memory always has an ordinal.
            found: info.ordinal.unwrap_or(u32::MAX),
            device,
        });
    }
    let span = desc.byte_span();
    let alloc = info.range();
    let at = info.device();
    if span.start < alloc.start {
        return Err(Error::BeforeAllocation {
            lo: span.start,
            hi: span.end,
            by: alloc.start - span.start,
            base: alloc.start,
            end: alloc.end,
            device: at,
        });
    }
    if span.end > alloc.end {
        return Err(Error::PastAllocation {
            lo: span.start,
            hi: span.end,
            by: span.end - alloc.end,
            base: alloc.start,
            end: alloc.end,
            device: at,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_type_zero_is_no_allocation() {
        assert!(matches!(
            parse(0x1234, 0, -2, 0, 0, false),
            Err(Error::NotAllocation { addr: 0x1234 })
        ));
        let info = parse(0x1000, 2, 1, 0x1000, 64, false).unwrap();
        assert_eq!(info.memory, MemoryType::Device);
        assert_eq!(info.ordinal, Some(1));
        assert_eq!(info.device(), Device::cuda(1));
        let managed = parse(0x1000, 2, 0, 0x1000, 64, true).unwrap();
        assert_eq!(managed.memory, MemoryType::Managed);
        assert_eq!(
            parse(0x1000, 1, -1, 0x1000, 64, false).unwrap().ordinal,
            None
        );
    }
}
