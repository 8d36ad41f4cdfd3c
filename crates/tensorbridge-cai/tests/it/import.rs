//! Import: dict values -> `Imported` -> `Tensor`.

use proptest::collection::vec;
use proptest::prelude::*;
use tensorbridge_cai::{
    ArrayData, BufferRegion, CudaArrayInterface, DataPointer, ImportOptions, TypeStr,
};
use tensorbridge_core::{
    DType, Device, DeviceType, Packing, Ready, Stream, StreamHandle, StreamRequest,
};
use tensorbridge_testkit::{DropCounter, dtype};

use crate::{cai, config, host, plain, ts};

const GPU: Device = Device::cuda(0);

#[test]
fn absent_strides_mean_c_order() {
    let v = cai("<f4", &[2, 3, 4], 0x1000)
        .import(GPU, &plain())
        .unwrap();
    let d = v.descriptor();
    assert_eq!(d.strides_elems(), &[12, 4, 1]);
    assert_eq!(d.dtype(), DType::FLOAT32);
    assert_eq!(d.device(), GPU);
    assert_eq!(d.data_ptr(), 0x1000);
    assert_eq!(d.byte_offset(), 0);
    assert!(!d.is_readonly());
}

#[test]
fn byte_strides_become_element_strides() {
    // NumPy 2.4.6: np.zeros((2, 3), 'f4')[:, ::2].__array_interface__['strides'] == (12, 8).
    let mut c = cai("<f4", &[2, 2], 0x1000);
    c.strides = Some(vec![12, 8]);
    let v = c.import(GPU, &plain()).unwrap();
    assert_eq!(v.descriptor().strides_elems(), &[3, 2]);
    // Negative and zero (broadcast) strides too.
    c.strides = Some(vec![0, -4]);
    let v = c.import(GPU, &plain()).unwrap();
    assert_eq!(v.descriptor().strides_elems(), &[0, -1]);
}

#[test]
fn versions_0_to_3_are_read() {
    for version in 0..=3 {
        let mut c = cai("|u1", &[4], 0x1000);
        c.version = version;
        assert!(c.import(GPU, &plain()).is_ok(), "{version}");
        let mut h = host("|u1", &[4], 0x1000);
        h.version = version;
        assert!(h.import(&plain()).is_ok(), "{version}");
    }
}

#[test]
fn null_data_is_accepted_for_zero_size_arrays() {
    let v = cai("<f8", &[0, 5], 0).import(GPU, &plain()).unwrap();
    assert_eq!(v.descriptor().numel(), 0);
    assert_eq!(v.descriptor().data_ptr(), 0);
    assert!(host("<f8", &[3, 0], 0).import(&plain()).is_ok());
}

#[test]
fn readonly_is_carried() {
    let mut c = cai("<i2", &[3], 0x1000);
    c.data.readonly = true;
    assert!(c.import(GPU, &plain()).unwrap().descriptor().is_readonly());
    let mut h = host("<i2", &[3], 0x1000);
    h.data = ArrayData::Pointer(DataPointer {
        address: 0x1000,
        readonly: true,
    });
    assert!(h.import(&plain()).unwrap().descriptor().is_readonly());
}

#[test]
fn streams_map_to_the_core_model() {
    let h = StreamHandle::new(0x7f00).unwrap();
    let cases = [
        (None, StreamRequest::NoSync),
        (Some(1), StreamRequest::Stream(Stream::LegacyDefault)),
        (Some(2), StreamRequest::Stream(Stream::PerThreadDefault)),
        (Some(0x7f00), StreamRequest::Stream(Stream::Handle(h))),
    ];
    for (wire, want) in cases {
        let mut c = cai("<f4", &[2], 0x1000);
        c.stream = wire;
        let v = c.import(GPU, &plain()).unwrap();
        assert_eq!(v.stream(), want, "{wire:?}");
        match (v.ready(), want) {
            (Ready::Now, StreamRequest::NoSync) => {}
            (Ready::Stream(s), StreamRequest::Stream(w)) => assert_eq!(s, w),
            (r, w) => panic!("{wire:?}: ready {r:?} for request {w:?}"),
        }
    }
}

#[test]
fn version_2_with_a_stream_is_still_ordered() {
    // Out of spec (stream came with v3), but dropping it would risk a race.
    let mut c = cai("<f4", &[2], 0x1000);
    c.version = 2;
    c.stream = Some(1);
    let v = c.import(GPU, &plain()).unwrap();
    assert_eq!(v.stream(), StreamRequest::Stream(Stream::LegacyDefault));
}

#[test]
fn cai_takes_cuda_managed_and_pinned_memory() {
    for kind in [
        DeviceType::Cuda,
        DeviceType::CudaManaged,
        DeviceType::CudaHost,
    ] {
        let dev = Device::new(kind, 1);
        let v = cai("<f4", &[2], 0x1000).import(dev, &plain()).unwrap();
        assert_eq!(v.descriptor().device(), dev);
    }
}

#[test]
fn cupy_bfloat16_imports_with_the_callers_dtype() {
    // CuPy 14.2 with ml_dtypes: typestr '<V2', descr [('', '<V2')].
    let mut c = cai("<V2", &[4, 4], 0x1000);
    c.descr = Some(ts("<V2").default_descr());
    c.strides = Some(vec![8, 2]);
    let opts = ImportOptions::new().void_as(DType::BFLOAT16);
    let v = c.import(GPU, &opts).unwrap();
    assert_eq!(v.descriptor().dtype(), DType::BFLOAT16);
    assert_eq!(v.descriptor().strides_elems(), &[4, 1]);
}

#[test]
fn fp4_behind_v1_is_one_byte_per_element() {
    let mut c = cai("<V1", &[2, 3], 0x1001);
    c.strides = Some(vec![3, 1]);
    let opts = ImportOptions::new().void_as(DType::FLOAT4_E2M1FN);
    let v = c.import(GPU, &opts).unwrap();
    let d = v.descriptor();
    assert_eq!(d.dtype(), DType::FLOAT4_E2M1FN);
    assert_eq!(d.packing(), Packing::Padded);
    assert_eq!(d.strides_elems(), &[3, 1]);
    assert_eq!(d.nbytes(), 6);
}

#[test]
fn buffer_form_uses_the_offset() {
    let mut h = host("<i4", &[2], 0);
    h.data = ArrayData::Buffer(BufferRegion {
        address: 0x1000,
        len: 16,
        readonly: true,
    });
    h.offset = 8;
    let v = h.import(&plain()).unwrap();
    assert_eq!(v.descriptor().data_ptr(), 0x1008);
    assert_eq!(v.descriptor().byte_span(), 0x1008..0x1010);
    assert!(v.descriptor().is_readonly());
    assert_eq!(v.stream(), StreamRequest::NoSync);
}

#[test]
fn pointer_form_ignores_the_offset() {
    let mut h = host("<i4", &[2], 0x1000);
    h.offset = 8;
    let v = h.import(&plain()).unwrap();
    assert_eq!(v.descriptor().data_ptr(), 0x1000);
    assert_eq!(v.descriptor().device(), Device::CPU);
}

#[test]
fn into_tensor_attaches_the_owner_and_the_stream() {
    let counter = DropCounter::new();
    let values: Vec<i16> = vec![10, 20, 30];
    let mut h = host("<i2", &[3], values.as_ptr() as usize);
    h.data = ArrayData::Pointer(DataPointer {
        address: values.as_ptr() as usize,
        readonly: true,
    });
    let v = h.import(&plain()).unwrap();
    // SAFETY: the owner holds `values`, whose heap buffer (three i16) does not move when the
    // Vec is moved, and which nothing writes; the tensor is read-only.
    let t = unsafe { v.into_tensor(counter.owner_with(values)) };
    assert!(t.ready().is_now());
    assert_eq!(
        t.host_view::<i16>().unwrap().to_contiguous(),
        vec![10, 20, 30]
    );
    let clone = t.clone();
    drop(t);
    assert_eq!(counter.drops(), 0);
    drop(clone);
    assert_eq!(counter.drops(), 1);

    let mut c = cai("<f4", &[0], 0);
    c.stream = Some(2);
    let v = c.import(GPU, &plain()).unwrap();
    // SAFETY: a zero-size tensor: its byte span is empty, so there is no memory to vouch for.
    let t = unsafe { v.into_tensor(counter.owner()) };
    assert!(matches!(t.ready(), Ready::Stream(Stream::PerThreadDefault)));
    drop(t);
    assert_eq!(counter.drops(), 2);
}

fn wire_typestr() -> impl Strategy<Value = TypeStr> {
    proptest::sample::select(vec![
        "|b1", "|i1", "<i2", "<i4", "<i8", "|u1", "<u8", "<f2", "<f4", "<f8", "<c8", "<c16", ">f4",
        ">i1", "=f8", "|f4", "<V2", "|V1", "<V16", "|V3", "<f16", "|O", "<M8[ns]", "|S4",
    ])
    .prop_map(ts)
}

fn wire_int() -> impl Strategy<Value = i64> {
    prop_oneof![
        -3i64..10,
        Just(i64::MAX),
        Just(i64::MIN),
        Just(1i64 << 62),
        Just(-(1i64 << 62)),
        any::<i64>()
    ]
}

prop_compose! {
    fn any_cai()(
        shape in vec(wire_int(), 0..6),
        strides in proptest::option::of(vec(wire_int(), 0..6)),
        typestr in wire_typestr(),
        address in prop_oneof![Just(0usize), Just(0x1000usize), Just(usize::MAX), any::<usize>()],
        readonly in any::<bool>(),
        mask in any::<bool>(),
        version in prop_oneof![0i64..=3, wire_int()],
        stream in proptest::option::of(wire_int()),
    ) -> CudaArrayInterface {
        CudaArrayInterface {
            shape,
            typestr,
            data: DataPointer { address, readonly },
            strides,
            descr: None,
            mask,
            version,
            stream,
        }
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn import_never_panics(
        c in any_cai(),
        void_as in proptest::option::of(dtype()),
        offset in wire_int(),
        len in any::<usize>(),
    ) {
        let opts = match void_as {
            Some(dt) => ImportOptions::new().void_as(dt),
            None => ImportOptions::new(),
        };
        if let Ok(v) = c.import(GPU, &opts) {
            // Whatever is accepted describes what was given.
            let d = v.descriptor();
            prop_assert_eq!(d.shape(), &c.shape[..]);
            prop_assert_eq!(d.data_ptr(), c.data.address);
            prop_assert_eq!(d.is_readonly(), c.data.readonly);
            prop_assert!(!c.mask && (0..=3).contains(&c.version));
            if let Some(bytes) = &c.strides {
                let itemsize = d.dtype().storage_bits(Packing::Padded) as i64 / 8;
                let elems: Vec<i64> = bytes.iter().map(|b| b / itemsize).collect();
                prop_assert_eq!(d.strides_elems(), &elems[..]);
            }
        }
        let h = tensorbridge_cai::ArrayInterface {
            shape: c.shape.clone(),
            typestr: c.typestr,
            data: ArrayData::Buffer(BufferRegion {
                address: c.data.address,
                len,
                readonly: c.data.readonly,
            }),
            strides: c.strides.clone(),
            descr: None,
            mask: c.mask,
            offset,
            version: c.version,
        };
        if let Ok(v) = h.import(&opts) {
            let span = v.descriptor().byte_span();
            prop_assert!(
                span.is_empty()
                    || (span.start >= c.data.address && span.end - c.data.address <= len)
            );
        }
    }
}
