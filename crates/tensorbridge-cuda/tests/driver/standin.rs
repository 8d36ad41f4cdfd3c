//! What the driver says of addresses, as the layer reads it (`inspect`, `check_span`): the
//! same on the stand-in as on a GPU for `cuMemAlloc` memory and host memory. The calls only
//! the stand-in answers predictably (a process opening its own IPC handle) run only there.

use anyhow::Result;
use cudarc::driver::sys;
use tensorbridge_core::{DType, Descriptor, Device, Layout, Packing};
use tensorbridge_cuda::{Error, MemoryType};

use crate::{RawAlloc, context, serial};

#[test]
fn the_driver_knows_its_allocations_and_not_host_memory() -> Result<()> {
    let _serial = serial();
    let ctx = context(0)?;
    let alloc = RawAlloc::new(&ctx, 1000)?;
    let info = tensorbridge_cuda::inspect(alloc.ptr as usize + 10)?;
    assert_eq!(info.memory, MemoryType::Device);
    assert_eq!(info.device(), Device::cuda(0));
    assert_eq!(info.range().start, alloc.ptr as usize);
    assert!(info.range().len() >= alloc.bytes, "{:?}", info.range());
    let host = [0u8; 64];
    let r = tensorbridge_cuda::inspect(host.as_ptr() as usize);
    assert!(matches!(r, Err(Error::NotAllocation { .. })), "{r:?}");
    // A view that reaches past the allocation is refused by the span check.
    let desc = Descriptor::new(
        alloc.ptr as usize,
        Device::cuda(0),
        DType::FLOAT32,
        Packing::Packed,
        Layout::row_major(&[(alloc.bytes / 4 + 64) as i64])?,
        tensorbridge_core::Access::ReadWrite,
    )?;
    let r = tensorbridge_cuda::check_span(&desc);
    assert!(r.is_err(), "{r:?}");
    Ok(())
}

#[test]
fn standin_refuses_its_own_handle_and_copies_outside_allocations() -> Result<()> {
    if !crate::standin() {
        println!("skipped: checks the stand-in's own answers");
        return Ok(());
    }
    let _serial = serial();
    let ctx = context(0)?;
    let alloc = RawAlloc::new(&ctx, 4096)?;
    ctx.bind_to_thread()?;
    let mut h = sys::CUipcMemHandle { reserved: [0; 64] };
    // SAFETY: a context is current; the driver writes 64 bytes into a live local.
    unsafe { sys::cuIpcGetMemHandle(&mut h, alloc.ptr) }.result()?;
    let mut base = 0;
    // SAFETY: as above; one pointer is written.
    let rc = unsafe { sys::cuIpcOpenMemHandle_v2(&mut base, h, 1) };
    assert_eq!(
        rc,
        sys::CUresult::CUDA_ERROR_INVALID_CONTEXT,
        "its own allocation"
    );
    let mut out = [0u8; 8];
    // SAFETY: the stand-in checks the device range (it lies past the allocation) before it
    // touches anything; `out` is a live local of 8 bytes.
    let rc = unsafe { sys::cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), alloc.ptr + 4092, 8) };
    assert_eq!(
        rc,
        sys::CUresult::CUDA_ERROR_INVALID_VALUE,
        "a copy past the end"
    );
    Ok(())
}
