//! Export: `Tensor` / `Descriptor` + `Ready` -> dict values.

use std::sync::Arc;

use tensorbridge_cai::{
    ArrayData, ArrayInterface, CudaArrayInterface, DataPointer, EXPORT_VERSION, TypeStr,
};
use tensorbridge_core::{
    Access, DType, DTypeCode, Descriptor, Device, DeviceType, Layout, Packing, Ready, Stream,
    StreamHandle, Tensor,
};

use crate::ts;
use tensorbridge_testkit::FakeSignal;

/// A descriptor with fake addresses: export never dereferences them.
fn desc(device: Device, dtype: DType, layout: Layout, data: usize, access: Access) -> Descriptor {
    Descriptor::new(data, device, dtype, Packing::Packed, layout, access).unwrap()
}

#[test]
fn cai_folds_the_offset_and_states_every_stride() {
    let layout = Layout::new(&[2, 3], Some(&[1, 2]), 16).unwrap();
    let d = desc(
        Device::cuda(1),
        DType::FLOAT64,
        layout,
        0x10_0000,
        Access::ReadOnly,
    );
    let c = CudaArrayInterface::export_descriptor(&d, &Ready::Now).unwrap();
    assert_eq!(
        c.data,
        DataPointer {
            address: 0x10_0010,
            readonly: true
        }
    );
    assert_eq!(c.shape, vec![2, 3]);
    assert_eq!(c.strides, Some(vec![8, 16]));
    assert_eq!(c.typestr, TypeStr::from_dtype(DType::FLOAT64).unwrap());
    assert_eq!(c.descr, Some(c.typestr.default_descr()));
    assert_eq!(c.version, 3);
    assert_eq!(EXPORT_VERSION, 3);
    assert_eq!(c.stream, None);
    assert!(!c.mask);

    // C-contiguous data gets its strides too, never None.
    let d = desc(
        Device::cuda(0),
        DType::INT32,
        Layout::row_major(&[2, 3]).unwrap(),
        0x1000,
        Access::ReadWrite,
    );
    let c = CudaArrayInterface::export_descriptor(&d, &Ready::Now).unwrap();
    assert_eq!(c.strides, Some(vec![12, 4]));
    assert!(!c.data.readonly);
}

#[test]
fn cai_exports_zero_size_arrays_at_address_0() {
    let layout = Layout::new(&[0, 4], None, 8).unwrap();
    let d = desc(
        Device::cuda(0),
        DType::FLOAT32,
        layout,
        0x5000,
        Access::ReadWrite,
    );
    let c = CudaArrayInterface::export_descriptor(&d, &Ready::Now).unwrap();
    assert_eq!(c.data.address, 0);
    // As PyTorch and CuPy give it: a consumer that sizes the memory from strides (CuPy)
    // would otherwise look for the device of the null address.
    assert_eq!(c.strides, None);
}

#[test]
fn cai_exports_the_producer_stream() {
    let d = desc(
        Device::cuda(0),
        DType::FLOAT16,
        Layout::row_major(&[4]).unwrap(),
        0x1000,
        Access::ReadWrite,
    );
    let h = StreamHandle::new(0xabc0).unwrap();
    let cases = [
        (Ready::Now, None),
        (Ready::Stream(Stream::LegacyDefault), Some(1)),
        (Ready::Stream(Stream::PerThreadDefault), Some(2)),
        (Ready::Stream(Stream::Handle(h)), Some(0xabc0)),
        (
            Ready::Signal(Arc::new(FakeSignal::naming(Some(Stream::Handle(h))))),
            Some(0xabc0),
        ),
    ];
    for (ready, want) in cases {
        let c = CudaArrayInterface::export_descriptor(&d, &ready).unwrap();
        assert_eq!(c.stream, want, "{ready:?}");
    }
}

#[test]
fn cai_takes_managed_and_pinned_memory() {
    for kind in [DeviceType::CudaManaged, DeviceType::CudaHost] {
        let d = desc(
            Device::new(kind, 0),
            DType::UINT8,
            Layout::row_major(&[3]).unwrap(),
            0x1001,
            Access::ReadWrite,
        );
        assert!(CudaArrayInterface::export_descriptor(&d, &Ready::Now).is_ok());
    }
}

#[cfg(target_endian = "little")]
#[test]
fn bfloat16_and_opaque_bytes_export_as_void() {
    let d = desc(
        Device::cuda(0),
        DType::BFLOAT16,
        Layout::row_major(&[2]).unwrap(),
        0x1000,
        Access::ReadWrite,
    );
    let c = CudaArrayInterface::export_descriptor(&d, &Ready::Now).unwrap();
    assert_eq!(c.typestr.to_string(), "<V2");
    // As CuPy 14.2 does.
    assert_eq!(c.descr, Some(ts("<V2").default_descr()));

    let opaque = DType::new(DTypeCode::OpaqueHandle, 32, 1).unwrap();
    let d = desc(
        Device::cuda(0),
        opaque,
        Layout::row_major(&[2]).unwrap(),
        0x1000,
        Access::ReadWrite,
    );
    let c = CudaArrayInterface::export_descriptor(&d, &Ready::Now).unwrap();
    assert_eq!(c.typestr.to_string(), "|V4");
}

#[test]
fn array_interface_describes_a_host_tensor() {
    let t = Tensor::from_vec(vec![1u16, 2, 3, 4, 5, 6], &[3, 2]).unwrap();
    let a = ArrayInterface::export(&t).unwrap();
    assert_eq!(
        a.data,
        ArrayData::Pointer(DataPointer {
            address: t.data_ptr(),
            readonly: false
        })
    );
    assert_eq!(a.offset, 0);
    assert_eq!(a.shape, vec![3, 2]);
    assert_eq!(a.strides, Some(vec![4, 2]));
    assert_eq!(a.typestr, TypeStr::from_dtype(DType::UINT16).unwrap());
    assert_eq!(a.version, 3);
    assert!(!a.mask);

    let ro = t.into_readonly();
    let a = ArrayInterface::export(&ro).unwrap();
    assert!(matches!(
        a.data,
        ArrayData::Pointer(DataPointer { readonly: true, .. })
    ));
}

#[test]
fn array_interface_folds_the_offset_into_the_pointer() {
    let layout = Layout::new(&[2], Some(&[-1]), 4).unwrap();
    let d = desc(Device::CPU, DType::INT32, layout, 0x2000, Access::ReadWrite);
    let a = ArrayInterface::export_descriptor(&d, &Ready::Now).unwrap();
    assert_eq!(
        a.data,
        ArrayData::Pointer(DataPointer {
            address: 0x2004,
            readonly: false
        })
    );
    assert_eq!(a.strides, Some(vec![-4]));
    assert_eq!(a.offset, 0);
}
