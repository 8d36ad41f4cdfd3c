//! Pointer inspection: the driver's view of addresses, and spans checked against the
//! allocation that holds them.

use anyhow::Result;
use cudarc::driver::DevicePtr;
use tensorbridge_core::{Access, DType, Descriptor, Device, DeviceType, Layout, Packing};
use tensorbridge_cuda::{Error, MemoryType};

use crate::{affine, context, dptr, serial};

fn f32_desc(device: Device, addr: usize, layout: Layout) -> Descriptor {
    Descriptor::new(
        addr,
        device,
        DType::FLOAT32,
        Packing::Packed,
        layout,
        Access::ReadWrite,
    )
    .expect("a valid descriptor")
}

#[test]
fn device_allocations_are_found_with_their_range() -> Result<()> {
    let _serial = serial();
    let ctx = context(0)?;
    let stream = ctx.new_stream()?;
    let slice = stream.clone_htod(&affine(1000, 1.0, 1.0))?;
    let ptr = dptr(&slice) as usize;
    let info = tensorbridge_cuda::inspect(ptr)?;
    println!("inspect({ptr:#x}) = {info:?}");
    assert_eq!(info.memory, MemoryType::Device);
    assert_eq!(info.ordinal, Some(0));
    assert_eq!(info.device(), Device::cuda(0));
    assert!(
        info.base <= ptr && ptr + 4000 <= info.base + info.size,
        "{info:?}"
    );
    // An interior address belongs to the same allocation.
    let inner = tensorbridge_cuda::inspect(ptr + 400)?;
    assert_eq!((inner.base, inner.size), (info.base, info.size));
    // The slice's own span passes.
    let exact = f32_desc(Device::cuda(0), ptr, Layout::row_major(&[1000])?);
    assert_eq!(tensorbridge_cuda::check_span(&exact)?, Some(info));
    Ok(())
}

#[test]
fn fabricated_addresses_are_refused() -> Result<()> {
    let _serial = serial();
    context(0)?;
    let made_up = 0x1234_5678_9012_3450usize;
    let err = tensorbridge_cuda::inspect(made_up).unwrap_err();
    println!("{err}");
    assert!(matches!(err, Error::NotAllocation { addr } if addr == made_up));
    let desc = f32_desc(Device::cuda(0), made_up, Layout::row_major(&[16])?);
    assert!(matches!(
        tensorbridge_cuda::check_span(&desc),
        Err(Error::NotAllocation { .. })
    ));
    // Ordinary host memory is no CUDA allocation either.
    let host = vec![1.0f32; 64];
    assert!(matches!(
        tensorbridge_cuda::inspect(host.as_ptr() as usize),
        Err(Error::NotAllocation { .. })
    ));
    Ok(())
}

#[test]
fn spans_running_outside_the_allocation_are_refused() -> Result<()> {
    let _serial = serial();
    let ctx = context(0)?;
    let stream = ctx.new_stream()?;
    let slice = stream.clone_htod(&affine(4096, 1.0, 1.0))?;
    let info = tensorbridge_cuda::inspect(dptr(&slice) as usize)?;
    let end = info.base + info.size;

    // 128 floats starting 256 bytes before the allocation's end: 256 bytes past it.
    let past = f32_desc(Device::cuda(0), end - 256, Layout::row_major(&[128])?);
    let err = tensorbridge_cuda::check_span(&past).unwrap_err();
    println!("{err}");
    assert!(
        matches!(err, Error::PastAllocation { by: 256, .. }),
        "{err}"
    );

    // Element 0 at the base, reversed: the span starts 60 bytes before it.
    let before = f32_desc(
        Device::cuda(0),
        info.base,
        Layout::new(&[16], Some(&[-1]), 0)?,
    );
    let err = tensorbridge_cuda::check_span(&before).unwrap_err();
    println!("{err}");
    assert!(
        matches!(err, Error::BeforeAllocation { by: 60, .. }),
        "{err}"
    );

    // The right memory claimed on the wrong device.
    let elsewhere = f32_desc(Device::cuda(1), info.base, Layout::row_major(&[16])?);
    let err = tensorbridge_cuda::check_span(&elsewhere).unwrap_err();
    println!("{err}");
    assert!(
        matches!(err, Error::OrdinalMismatch { found: 0, .. }),
        "{err}"
    );
    Ok(())
}

#[test]
fn pinned_and_managed_memory_are_told_apart() -> Result<()> {
    let _serial = serial();
    let ctx = context(0)?;
    // SAFETY: the memory is only inspected, never read.
    let pinned = unsafe { ctx.alloc_pinned::<f32>(256) }?;
    let pinned_ptr = pinned.as_ptr()? as usize;
    let info = tensorbridge_cuda::inspect(pinned_ptr)?;
    println!("pinned: {info:?}");
    assert_eq!(info.memory, MemoryType::Host);
    let as_cuda = f32_desc(Device::cuda(0), pinned_ptr, Layout::row_major(&[256])?);
    assert!(matches!(
        tensorbridge_cuda::check_span(&as_cuda),
        Err(Error::MemoryTypeMismatch {
            found: MemoryType::Host,
            ..
        })
    ));
    let as_host = f32_desc(
        Device::new(DeviceType::CudaHost, 0),
        pinned_ptr,
        Layout::row_major(&[256])?,
    );
    tensorbridge_cuda::check_span(&as_host)?;

    // SAFETY: the memory is only inspected, never read; 1 KiB of managed memory.
    let managed = unsafe { ctx.alloc_unified::<f32>(256, true) }?;
    let stream = ctx.default_stream();
    let (managed_ptr, _record) = managed.device_ptr(&stream);
    let info = tensorbridge_cuda::inspect(managed_ptr as usize)?;
    println!("managed: {info:?}");
    assert_eq!(info.memory, MemoryType::Managed);
    let as_managed = f32_desc(
        Device::new(DeviceType::CudaManaged, 0),
        managed_ptr as usize,
        Layout::row_major(&[256])?,
    );
    tensorbridge_cuda::check_span(&as_managed)?;
    Ok(())
}
