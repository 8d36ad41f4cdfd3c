//! `check_span_with`: the span checks against what the driver said, without a driver.

use tensorbridge_core::{Access, DType, Descriptor, Device, DeviceType, Layout, Packing};
use tensorbridge_cuda::{Error, MemoryType, PointerInfo, check_span_with};

const BASE: usize = 0x7f00_0000_0000;

fn desc(device: Device, data: usize, layout: Layout) -> Descriptor {
    Descriptor::new(
        data,
        device,
        DType::FLOAT32,
        Packing::Packed,
        layout,
        Access::ReadWrite,
    )
    .unwrap()
}

fn alloc(memory: MemoryType, ordinal: Option<u32>, base: usize, size: usize) -> PointerInfo {
    PointerInfo {
        addr: base,
        memory,
        ordinal,
        base,
        size,
    }
}

#[test]
fn spans_inside_one_allocation_pass() {
    let d = desc(
        Device::cuda(0),
        BASE + 0x1000,
        Layout::row_major(&[1024]).unwrap(),
    );
    let info = alloc(MemoryType::Device, Some(0), BASE, 0x2000);
    check_span_with(&d, &info).unwrap();
    // Managed memory may back a `cuda` tensor.
    let managed = alloc(MemoryType::Managed, Some(0), BASE, 0x2000);
    check_span_with(&d, &managed).unwrap();
}

#[test]
fn spans_running_past_the_end_say_by_how_much() {
    let d = desc(
        Device::cuda(0),
        BASE + 0x1000,
        Layout::row_major(&[1024]).unwrap(),
    );
    let info = alloc(MemoryType::Device, Some(0), BASE, 0x1800);
    let err = check_span_with(&d, &info).unwrap_err();
    assert!(matches!(err, Error::PastAllocation { by: 0x800, .. }));
    assert_eq!(
        err.to_string(),
        "bytes [0x7f0000001000, 0x7f0000002000) run 2048 bytes past the allocation [0x7f0000000000, 0x7f0000001800) on cuda:0"
    );
}

#[test]
fn spans_starting_before_the_base_say_by_how_much() {
    // Reversed rows: element 0 is at BASE + 0x100, the span reaches back to BASE - 0x100.
    let layout = Layout::new(&[3, 64], Some(&[-64, 1]), 0).unwrap();
    let d = desc(Device::cuda(0), BASE + 0x100, layout);
    let info = alloc(MemoryType::Device, Some(0), BASE, 0x1000);
    let err = check_span_with(&d, &info).unwrap_err();
    assert!(
        matches!(err, Error::BeforeAllocation { by: 0x100, lo, .. } if lo == BASE - 0x100),
        "{err}"
    );
}

#[test]
fn memory_of_the_wrong_kind_is_refused() {
    let d = desc(Device::cuda(0), BASE, Layout::row_major(&[4]).unwrap());
    let pinned = alloc(MemoryType::Host, None, BASE, 0x1000);
    assert!(matches!(
        check_span_with(&d, &pinned),
        Err(Error::MemoryTypeMismatch {
            found: MemoryType::Host,
            expected: MemoryType::Device,
            ..
        })
    ));
    let host = desc(
        Device::new(DeviceType::CudaHost, 0),
        BASE,
        Layout::row_major(&[4]).unwrap(),
    );
    check_span_with(&host, &pinned).unwrap();
    let device_mem = alloc(MemoryType::Device, Some(0), BASE, 0x1000);
    assert!(check_span_with(&host, &device_mem).is_err());
    let managed = desc(
        Device::new(DeviceType::CudaManaged, 0),
        BASE,
        Layout::row_major(&[4]).unwrap(),
    );
    assert!(check_span_with(&managed, &device_mem).is_err());
}

#[test]
fn memory_on_another_device_is_refused() {
    let d = desc(Device::cuda(1), BASE, Layout::row_major(&[4]).unwrap());
    let info = alloc(MemoryType::Device, Some(0), BASE, 0x1000);
    assert!(matches!(
        check_span_with(&d, &info),
        Err(Error::OrdinalMismatch { found: 0, .. })
    ));
}

#[test]
fn non_cuda_devices_are_refused_and_empty_tensors_pass() {
    let d = desc(Device::CPU, BASE, Layout::row_major(&[4]).unwrap());
    let info = alloc(MemoryType::Host, None, BASE, 0x1000);
    assert!(matches!(
        check_span_with(&d, &info),
        Err(Error::NotCudaMemory { .. })
    ));
    let empty = desc(Device::cuda(0), 0, Layout::row_major(&[0]).unwrap());
    check_span_with(&empty, &alloc(MemoryType::Device, Some(3), 0, 0)).unwrap();
}

#[test]
fn pointer_info_names_its_device() {
    assert_eq!(
        alloc(MemoryType::Device, Some(2), BASE, 1).device(),
        Device::cuda(2)
    );
    assert_eq!(
        alloc(MemoryType::Managed, Some(2), BASE, 1).device().kind,
        DeviceType::CudaManaged
    );
    assert_eq!(
        alloc(MemoryType::Host, None, BASE, 16).range(),
        BASE..BASE + 16
    );
}
