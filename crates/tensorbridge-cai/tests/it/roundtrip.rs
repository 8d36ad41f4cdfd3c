//! Export then import gives back the same tensor: same memory, layout, dtype, access and
//! stream.

use std::fmt::Debug;

use proptest::prelude::*;
use tensorbridge_cai::{ArrayInterface, CudaArrayInterface, ImportOptions, TypeStr};
use tensorbridge_core::{
    Bool8, DType, Descriptor, Device, DeviceType, Element, Layout, Packing, Ready, Stream,
    StreamHandle, StreamRequest,
};
use tensorbridge_testkit::{DropCounter, HostBuffer, RawParts, small_layout, valid_raw};

use crate::config;

/// Valid raw descriptors whose dtype has a typestr.
fn exportable_raw() -> impl Strategy<Value = RawParts> {
    valid_raw().prop_filter("dtype has a typestr", |r| {
        DType::from_dlpack(r.dtype_code, r.dtype_bits, r.dtype_lanes)
            .is_ok_and(|dt| TypeStr::from_dtype(dt).is_ok())
    })
}

fn stream() -> impl Strategy<Value = Stream> {
    prop_oneof![
        Just(Stream::LegacyDefault),
        Just(Stream::PerThreadDefault),
        (3usize..=i64::MAX as usize)
            .prop_map(|h| Stream::Handle(StreamHandle::new(h).expect("h > 2"))),
    ]
}

/// What import should give back for `d`: the offset folded into the pointer, and address 0
/// for zero-size arrays when `zero_is_null` (the CAI's rule).
fn expected(d: &Descriptor, device: Device, zero_is_null: bool) -> Descriptor {
    let folded = d.with_offset_folded();
    // The CUDA Array Interface gives an empty array a null pointer and no strides (row
    // major on import; its own strides where row major would overflow): nothing is
    // addressed either way.
    let (data, layout) = if zero_is_null && d.numel() == 0 {
        let layout = Layout::row_major(d.shape()).unwrap_or_else(|_| folded.layout().clone());
        (0, layout)
    } else {
        (folded.data_ptr(), folded.layout().clone())
    };
    Descriptor::new(data, device, d.dtype(), Packing::Packed, layout, d.access())
        .expect("the folded layout is valid")
}

/// Export `t` through the array interface, import it again over the same owner, and check
/// the values read through it against the buffer's oracle.
fn host_roundtrip<T: Element + PartialEq + Debug>(
    shape: &[i64],
    strides: &[i64],
    fill: impl Fn(usize) -> T,
) -> Result<(), TestCaseError> {
    let counter = DropCounter::new();
    let buf = HostBuffer::new(shape, strides, fill);
    let oracle = buf.expected_contiguous();
    let t = buf.into_tensor(&counter);
    let a = ArrayInterface::export(&t)?;
    let v = a.import(&ImportOptions::new().void_as(T::DTYPE))?;
    // SAFETY: the clone of `t`'s owner keeps the buffer alive; it is read-only and nobody
    // writes it.
    let back = unsafe { v.into_tensor(t.owner().clone()) };
    prop_assert_eq!(back.data_ptr(), t.data_ptr());
    prop_assert_eq!(back.strides_elems(), t.strides_elems());
    prop_assert!(back.is_readonly());
    prop_assert_eq!(back.host_view::<T>()?.to_contiguous(), oracle.clone());

    // The CAI over the same memory, described as pinned host memory.
    let pinned = Device::new(DeviceType::CudaHost, 0);
    let d = expected(t.descriptor(), pinned, false);
    let c = CudaArrayInterface::export_descriptor(&d, &Ready::Now)?;
    let v = c.import(pinned, &ImportOptions::new().void_as(T::DTYPE))?;
    // SAFETY: as above; pinned host memory is host memory, and the test never asks a CUDA
    // driver about it.
    let via_cai = unsafe { v.into_tensor(t.owner().clone()) };
    if t.numel() > 0 {
        prop_assert_eq!(via_cai.data_ptr(), t.data_ptr());
    }
    prop_assert_eq!(via_cai.host_view::<T>()?.to_contiguous(), oracle);

    drop(t);
    drop(back);
    prop_assert_eq!(counter.drops(), 0);
    drop(via_cai);
    prop_assert_eq!(counter.drops(), 1);
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn cai_roundtrip(
        raw in exportable_raw(),
        kind in proptest::sample::select(vec![
            DeviceType::Cuda,
            DeviceType::CudaManaged,
            DeviceType::CudaHost,
        ]),
        stream in proptest::option::of(stream()),
    ) {
        let raw = RawParts { device_type: kind.code(), ..raw };
        let d = raw.as_raw().validate()?;
        let ready = stream.map_or(Ready::Now, Ready::Stream);
        let c = CudaArrayInterface::export_descriptor(&d, &ready)?;
        let v = c.import(d.device(), &ImportOptions::new().void_as(d.dtype()))?;
        prop_assert_eq!(v.descriptor(), &expected(&d, d.device(), true));
        prop_assert_eq!(v.stream(), stream.map_or(StreamRequest::NoSync, StreamRequest::Stream));
    }

    #[test]
    fn array_interface_roundtrip(raw in exportable_raw()) {
        let raw = RawParts { device_type: DeviceType::Cpu.code(), device_id: 0, ..raw };
        let d = raw.as_raw().validate()?;
        let a = ArrayInterface::export_descriptor(&d, &Ready::Now)?;
        let v = a.import(&ImportOptions::new().void_as(d.dtype()))?;
        prop_assert_eq!(v.descriptor(), &expected(&d, Device::CPU, false));
        prop_assert_eq!(v.stream(), StreamRequest::NoSync);
    }

    #[test]
    fn host_memory_roundtrip((shape, strides) in small_layout(4), which in 0u8..6) {
        match which {
            0 => host_roundtrip(&shape, &strides, |i| i as f32 * 0.5)?,
            1 => host_roundtrip(&shape, &strides, |i| -(i as i64))?,
            2 => host_roundtrip(&shape, &strides, |i| i as u8)?,
            3 => host_roundtrip(&shape, &strides, |i| Bool8((i % 3) as u8))?,
            4 => host_roundtrip(&shape, &strides, |i| i as f64 - 7.25)?,
            _ => host_roundtrip(&shape, &strides, |i| i as i16 * 3)?,
        }
    }
}
