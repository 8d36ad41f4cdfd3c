//! The instruction-count harness: runs one conversion a given number of times, so that
//! `cargo xtask icount` can count its instructions under valgrind (`--tool=cachegrind
//! --cache-sim=no`), which gives the same count on every run of the same binary, unlike
//! time. The per-conversion cost is the difference between a run of `2N` and one of `N`
//! iterations, divided by `N`: start-up, set-up and warm-up cancel out.
//!
//! `icount --list` prints the conversions; `icount NAME N` runs `NAME` `N` times (after a
//! warm-up of a few iterations). The conversions are the criterion groups' bodies
//! (`benches/benches/*.rs`) with the same tensors, so a count and a time speak of the same
//! work; peers (dlpark, ndarray's `from_shape_ptr`, candle read by hand) are here too, for
//! the ratio of instructions, but carry no threshold.

use std::hint::black_box;
use std::ptr::NonNull;
use std::sync::Arc;

use candle_core::{CpuStorage, Storage};
use dlpark::Managed;
use dlpark::ffi::{DLDataType, DLDevice, DLManagedTensorVersioned};
use dlpark::metadata::Dynamic;
use ndarray::{ArrayView, IxDyn, ShapeBuilder};
use tensorbridge_cai::{ArrayInterface, CudaArrayInterface, ImportOptions};
use tensorbridge_core::{DType, Device, DeviceType, Owner, RawTensor, Tensor};
use tensorbridge_dlpack::{export_versioned, import_versioned};

/// Warm-up iterations before the counted ones (first-call lazy work: allocator pools).
const WARM_UP: usize = 16;

/// One conversion, ready to run: set-up done, each call one conversion.
type Body = Box<dyn FnMut()>;

/// Sets one conversion up at a rank.
type Make = fn(usize) -> Body;

/// The conversions by name; each is measured at the ranks of [`RANKS`].
const CONVERSIONS: &[(&str, Make)] = &[
    ("core/raw_to_tensor", core_raw_to_tensor),
    ("dlpack/roundtrip", dlpack_roundtrip),
    ("dlpack/dlpark_roundtrip", dlpark_roundtrip),
    ("dlpack/dlpark_to_tensorbridge", dlpark_to_tensorbridge),
    ("cai/import", cai_import),
    ("cai/export", cai_export),
    ("array_interface/import", array_interface_import),
    ("ndarray/view", ndarray_view),
    ("ndarray/from_shape_ptr", ndarray_from_shape_ptr),
    ("candle/import", candle_import),
    ("candle/by_hand", candle_by_hand),
];

const RANKS: [usize; 3] = [1, 4, 8];

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [flag] if flag == "--list" => {
            for (name, _) in CONVERSIONS {
                for rank in RANKS {
                    println!("{name}/rank{rank}");
                }
            }
        }
        [name, n] => {
            let n: usize = n.parse().expect("N is a count of iterations");
            let (conversion, rank) = name
                .rsplit_once("/rank")
                .expect("NAME ends in /rank<R> (see --list)");
            let rank: usize = rank.parse().expect("a rank");
            let make = CONVERSIONS
                .iter()
                .find(|(c, _)| *c == conversion)
                .unwrap_or_else(|| panic!("no conversion `{conversion}` (see --list)"))
                .1;
            let mut body = make(rank);
            for _ in 0..WARM_UP {
                body();
            }
            for _ in 0..n {
                body();
            }
        }
        _ => {
            eprintln!("usage: icount --list | icount NAME N");
            std::process::exit(2);
        }
    }
}

/// The extents the criterion benches use: 2, 3, 4, 2, 3, 4...
fn extents(rank: usize) -> Vec<i64> {
    (0..rank).map(|d| 2 + (d % 3) as i64).collect()
}

fn fake_owner() -> Owner {
    Arc::new(())
}

/// A C-contiguous f32 tensor at a fake (never dereferenced) address on `device`.
fn fake_tensor(rank: usize, device: Device) -> Tensor {
    let shape = extents(rank);
    let desc = RawTensor::new(0x7f00_0000_0000, device, DType::FLOAT32, &shape)
        .validate()
        .expect("valid");
    // SAFETY: never dereferenced: the conversions only describe, convert and drop.
    unsafe { Tensor::from_descriptor(desc, fake_owner()) }
}

/// `core/raw_to_tensor` (benches/benches/core.rs): a strided, offset layout validated and
/// given an owner (an `Arc` clone), then dropped.
fn core_raw_to_tensor(rank: usize) -> Body {
    let shape: Vec<i64> = (0..rank).map(|d| 2 + d as i64).collect();
    let mut strides = vec![0i64; rank];
    let mut acc = 1;
    for d in 0..rank {
        strides[d] = acc;
        acc *= shape[d];
    }
    let owner = fake_owner();
    Box::new(move || {
        let raw = RawTensor {
            strides: Some(&strides),
            byte_offset: 64,
            ..RawTensor::host(0x7f00_0000_0000, DType::FLOAT32, &shape)
        };
        let desc = black_box(&raw).validate().expect("valid");
        // SAFETY: never dereferenced.
        let t = unsafe { Tensor::from_descriptor(desc, owner.clone()) };
        black_box(&t);
    })
}

/// `dlpack/roundtrip/tensorbridge`: `export_versioned`, `import_versioned`, drop.
fn dlpack_roundtrip(rank: usize) -> Body {
    let shape = extents(rank);
    let numel: i64 = shape.iter().product();
    let tensor = Tensor::from_vec(vec![0.5f32; numel as usize], &shape).expect("valid");
    Box::new(move || {
        let raw = export_versioned(black_box(&tensor))
            .expect("exportable")
            .into_raw();
        let raw = NonNull::new(raw).expect("never null");
        // SAFETY: a live export of `tensor`; ownership moves to the import; never written.
        let imported = unsafe { import_versioned(raw) }.expect("valid");
        black_box(&imported);
    })
}

/// dlpark's producer over a shared buffer (`metadata::Dynamic`, an `Arc` as context).
fn dlpark_producer(rank: usize) -> impl FnMut() -> *mut DLManagedTensorVersioned {
    let shape = extents(rank);
    let numel: i64 = shape.iter().product();
    let strides = Tensor::from_vec(vec![0u8; numel as usize], &shape)
        .expect("valid")
        .strides_elems()
        .to_vec();
    let buffer: Arc<Vec<f32>> = Arc::new(vec![0.5f32; numel as usize]);
    move || {
        let data = buffer.as_ptr().cast_mut().cast();
        let mut init = Dynamic::new(black_box(&shape[..]), black_box(&strides[..]))
            .initialize(Arc::clone(&buffer))
            .expect("valid metadata");
        init.set_data(data)
            .set_dtype(DLDataType::F32)
            .set_device(DLDevice::CPU);
        // SAFETY: describes the shared buffer, kept alive by the context; never written.
        unsafe { init.finish() }.into_raw()
    }
}

/// `dlpack/roundtrip/dlpark`: dlpark's producer and its own consumer (peer).
fn dlpark_roundtrip(rank: usize) -> Body {
    let mut export = dlpark_producer(rank);
    Box::new(move || {
        let raw = export();
        // SAFETY: a live managed tensor from dlpark's producer; ownership moves here.
        let managed = unsafe { Managed::<DLManagedTensorVersioned>::from_raw(raw) }.expect("v1");
        black_box(managed.validate().expect("valid").shape().len());
        black_box(managed);
    })
}

/// `dlpack/roundtrip/dlpark_to_tensorbridge`: dlpark's producer, our import of a foreign
/// struct (the core's validation and a wrapper owner).
fn dlpark_to_tensorbridge(rank: usize) -> Body {
    let mut export = dlpark_producer(rank);
    Box::new(move || {
        let raw = NonNull::new(export()).expect("never null");
        // SAFETY: a live managed tensor over the shared buffer; ownership moves to the import.
        let imported = unsafe { import_versioned(raw) }.expect("valid");
        black_box(&imported);
    })
}

/// `cai/import/cuda_array_interface`: validate the dict, attach an owner, drop.
fn cai_import(rank: usize) -> Body {
    let cuda = Device::new(DeviceType::Cuda, 0);
    let dict = CudaArrayInterface::export(&fake_tensor(rank, cuda)).expect("exports");
    let options = ImportOptions::default();
    let owner = fake_owner();
    Box::new(move || {
        let v = black_box(&dict).import(cuda, &options).expect("valid");
        // SAFETY: never dereferenced.
        let t = unsafe { v.into_tensor(owner.clone()) };
        black_box(&t);
    })
}

/// `cai/export/cuda_array_interface`.
fn cai_export(rank: usize) -> Body {
    let t = fake_tensor(rank, Device::new(DeviceType::Cuda, 0));
    Box::new(move || {
        black_box(CudaArrayInterface::export(black_box(&t)).expect("exports"));
    })
}

/// `cai/import/array_interface`.
fn array_interface_import(rank: usize) -> Body {
    let dict = ArrayInterface::export(&fake_tensor(rank, Device::CPU)).expect("exports");
    let options = ImportOptions::default();
    let owner = fake_owner();
    Box::new(move || {
        let v = black_box(&dict).import(&options).expect("valid");
        // SAFETY: never dereferenced.
        let t = unsafe { v.into_tensor(owner.clone()) };
        black_box(&t);
    })
}

fn host_tensor(rank: usize) -> (Tensor, Vec<usize>) {
    let dims: Vec<usize> = extents(rank).iter().map(|&n| n as usize).collect();
    let n: usize = dims.iter().product();
    let dims_i64 = extents(rank);
    let t = Tensor::from_vec(vec![1.0f32; n], &dims_i64).expect("valid");
    (t, dims)
}

/// `ndarray/view/tensorbridge`: `tensorbridge_ndarray::view` of a host tensor.
fn ndarray_view(rank: usize) -> Body {
    let (t, _) = host_tensor(rank);
    Box::new(move || {
        let v = tensorbridge_ndarray::view::<f32, IxDyn>(black_box(&t)).expect("a view");
        black_box(v.as_ptr());
    })
}

/// `ndarray/view/from_shape_ptr`: ndarray's own unchecked constructor (peer).
fn ndarray_from_shape_ptr(rank: usize) -> Body {
    let (t, dims) = host_tensor(rank);
    let strides: Vec<usize> = t.strides_elems().iter().map(|&s| s as usize).collect();
    let ptr = t.data_ptr() as *const f32;
    Box::new(move || {
        let _keep = &t;
        // SAFETY: the tensor's own C-order layout over its live buffer, read-only.
        let v = unsafe {
            ArrayView::from_shape_ptr(
                IxDyn(black_box(&dims)).strides(IxDyn(&strides)),
                black_box(ptr),
            )
        };
        black_box(v.as_ptr());
    })
}

fn candle_tensor(rank: usize) -> candle_core::Tensor {
    let dims: Vec<usize> = extents(rank).iter().map(|&n| n as usize).collect();
    candle_core::Tensor::zeros(dims, candle_core::DType::F32, &candle_core::Device::Cpu)
        .expect("zeros")
}

/// `candle/import/tensorbridge`: `tensorbridge_candle::import`, then drop.
fn candle_import(rank: usize) -> Body {
    let t = candle_tensor(rank);
    Box::new(move || {
        // SAFETY: nothing writes `t` in place.
        let tb = unsafe { tensorbridge_candle::import(black_box(&t)) }.expect("import");
        black_box(tb.data_ptr());
    })
}

/// `candle/import/by_hand`: the storage pointer, dims, strides and offset read (peer).
fn candle_by_hand(rank: usize) -> Body {
    let t = candle_tensor(rank);
    Box::new(move || {
        let t = black_box(&t);
        let (storage, layout) = t.storage_and_layout();
        let Storage::Cpu(CpuStorage::F32(v)) = &*storage else {
            unreachable!()
        };
        let first = v.as_ptr().wrapping_add(layout.start_offset());
        black_box((first, layout.dims(), layout.stride()));
    })
}
