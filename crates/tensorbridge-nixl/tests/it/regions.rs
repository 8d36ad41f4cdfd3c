//! Regions and runs on host tensors, checked against the memory itself: no NIXL needed.

use std::sync::Arc;

use nixl_sys::{MemType, MemoryRegion, NixlDescriptor};
use tensorbridge_core::{DType, Descriptor, Device, Owner, RawTensor, Tensor};
use tensorbridge_nixl::{Error, NixlTensor, reg_regions, xfer_runs};

/// A host tensor over `buf` with the given layout (element strides, byte offset), `buf` kept
/// alive by the owner.
fn view(buf: &Arc<Vec<f32>>, shape: &[i64], strides: &[i64], offset: u64) -> Tensor {
    let raw = RawTensor {
        strides: Some(strides),
        byte_offset: offset,
        ..RawTensor::host(buf.as_ptr() as usize, DType::FLOAT32, shape)
    };
    let desc: Descriptor = raw.validate().expect("valid layout");
    let span = desc.byte_span();
    let mem = buf.as_ptr() as usize..buf.as_ptr() as usize + buf.len() * 4;
    assert!(desc.numel() == 0 || (mem.start <= span.start && span.end <= mem.end));
    let owner: Owner = buf.clone();
    // SAFETY: the span was just checked to lie inside `buf`, which the owner keeps alive;
    // the test only reads through host views while nothing writes.
    unsafe { Tensor::from_descriptor(desc, owner) }
}

fn bytes_of(runs: &[(usize, usize)]) -> Vec<u8> {
    runs.iter()
        // SAFETY: each run lies inside a live buffer of the test (checked by the tensor's
        // validation and kept alive by the caller).
        .flat_map(|&(a, n)| unsafe { std::slice::from_raw_parts(a as *const u8, n) }.to_vec())
        .collect()
}

fn elements(t: &Tensor) -> Vec<u8> {
    let v = t.host_view::<f32>().expect("host view");
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

#[test]
fn runs_are_the_elements_in_order() {
    let buf = Arc::new((0..42).map(|x| x as f32).collect::<Vec<_>>());
    let cases: Vec<(&[i64], &[i64], u64)> = vec![
        (&[6, 7], &[7, 1], 0),    // contiguous
        (&[7, 6], &[1, 7], 0),    // transposed
        (&[6, 3], &[7, 1], 4),    // columns 1..4
        (&[3, 4], &[14, 2], 0),   // every other row and column
        (&[6, 7], &[-7, 1], 140), // rows reversed
        (&[6, 7], &[0, 1], 0),    // row 0 broadcast
    ];
    for (shape, strides, offset) in cases {
        let t = view(&buf, shape, strides, offset);
        let runs = xfer_runs(&[NixlTensor::new(t.clone()).unwrap()], 1 << 16).unwrap();
        assert_eq!(bytes_of(&runs), elements(&t), "{shape:?} {strides:?}");
        assert!(
            runs.windows(2).all(|w| w[0].0 + w[0].1 != w[1].0),
            "unmerged runs"
        );
    }
}

#[test]
fn slices_of_one_buffer_are_one_region_and_one_run() {
    let buf = Arc::new(vec![0f32; 1000 * 16]);
    let parts: Vec<NixlTensor> = (0..1000)
        .rev()
        .map(|i| NixlTensor::new(view(&buf, &[16], &[1], i * 64)).unwrap())
        .collect();
    let regions = reg_regions(&parts);
    assert_eq!(
        regions,
        vec![(MemType::Dram, vec![(buf.as_ptr() as usize, 64_000, 0)])]
    );
    let mut ordered = parts.clone();
    ordered.reverse();
    assert_eq!(
        xfer_runs(&ordered, 16).unwrap(),
        vec![(buf.as_ptr() as usize, 64_000)]
    );
}

#[test]
fn separate_buffers_stay_separate_regions() {
    let a = Arc::new(vec![0f32; 64]);
    let b = Arc::new(vec![0f32; 64]);
    let parts = [
        NixlTensor::new(view(&a, &[10], &[1], 0)).unwrap(),
        NixlTensor::new(view(&b, &[64], &[1], 0)).unwrap(),
        NixlTensor::new(view(&a, &[32], &[1], 128)).unwrap(),
    ];
    let [(mem, mut rows)]: [_; 1] = reg_regions(&parts).try_into().unwrap();
    rows.sort();
    let mut want = vec![
        (a.as_ptr() as usize, 40, 0),
        (a.as_ptr() as usize + 128, 128, 0),
        (b.as_ptr() as usize, 256, 0),
    ];
    want.sort();
    assert_eq!((mem, rows), (MemType::Dram, want));
}

#[test]
fn region_is_the_span_with_memory_type_and_device() {
    let buf = Arc::new(vec![0f32; 64]);
    let t = NixlTensor::new(view(&buf, &[4, 4], &[-8, 2], 24 * 4)).unwrap();
    // Rows 3, 2, 1, 0 (stride 8) of columns 0, 2, 4, 6: bytes [0, 4 * (24 + 6 + 1)).
    assert_eq!(t.size(), 31 * 4);
    // SAFETY: the pointer is only compared, never dereferenced.
    assert_eq!(unsafe { t.as_ptr() } as usize, buf.as_ptr() as usize);
    assert_eq!((t.mem_type(), t.device_id()), (MemType::Dram, 0));
}

#[test]
fn refusals_are_typed() {
    let buf = Arc::new(vec![0f32; 8]);
    let t = view(&buf, &[8], &[1], 0);
    assert!(matches!(
        NixlTensor::new(t.clone().into_readonly()),
        Err(Error::ReadOnly)
    ));
    assert!(NixlTensor::new_read_only(t.clone().into_readonly()).is_ok());
    assert!(matches!(
        NixlTensor::new(view(&buf, &[0], &[1], 0)),
        Err(Error::Empty { .. })
    ));
    let transposed = NixlTensor::new(view(&buf, &[4, 2], &[1, 4], 0)).unwrap();
    assert!(matches!(
        xfer_runs(&[transposed], 7),
        Err(Error::TooManyRuns {
            runs: 8,
            run_bytes: 4,
            limit: 7
        })
    ));
    for (device, managed) in [
        (
            Device::new(tensorbridge_core::DeviceType::CudaManaged, 0),
            true,
        ),
        (Device::new(tensorbridge_core::DeviceType::Vulkan, 0), false),
    ] {
        let r = tensorbridge_nixl::memory_of(device);
        assert!(
            matches!(
                (&r, managed),
                (Err(Error::Managed { .. }), true) | (Err(Error::UnsupportedDevice { .. }), false)
            ),
            "{device}: {r:?}"
        );
    }
    assert_eq!(
        tensorbridge_nixl::memory_of(Device::cuda(3)).unwrap(),
        (MemType::Vram, 3)
    );
}
