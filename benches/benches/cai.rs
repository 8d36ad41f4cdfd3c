//! CUDA Array Interface and NumPy array interface (pure Rust): export (`from_tensor`) and
//! import (`validate` + `into_tensor`) of ranks 1, 2, 4 and 8, and the pairs through the core
//! (CAI -> DLPack, DLPack -> CAI). No Rust peer implements these interfaces; the Python
//! comparison (CuPy, Numba) is in `benches/python/compare.py`.
//!
//! The dict itself is Python's business: these figures are what the Rust side adds to a
//! Python layer's dict reads and writes.

use std::hint::black_box;
use std::ptr::NonNull;
use std::sync::Arc;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use tensorbridge_cai::{ArrayInterface, CudaArrayInterface, ImportOptions};
use tensorbridge_core::{Access, DType, Device, DeviceType, Owner, RawTensor, Tensor};
use tensorbridge_dlpack::{export_versioned, import_versioned};

const RANKS: [usize; 4] = [1, 2, 4, 8];

/// A C-contiguous f32 tensor of `rank` dimensions at a fake (never dereferenced) address.
fn tensor(rank: usize, device: Device) -> Tensor {
    let shape: Vec<i64> = (0..rank).map(|d| 2 + (d % 3) as i64).collect();
    let desc = RawTensor {
        access: Access::ReadWrite,
        ..RawTensor::new(0x7f00_0000_0000, device, DType::FLOAT32, &shape)
    }
    .validate()
    .expect("valid");
    let owner: Owner = Arc::new(());
    // SAFETY: never dereferenced: the benches only describe, convert and drop.
    unsafe { Tensor::from_descriptor(desc, owner) }
}

fn cai(c: &mut Criterion) {
    let cuda = Device::new(DeviceType::Cuda, 0);
    let options = ImportOptions::default();
    let mut export = c.benchmark_group("cai/export");
    for rank in RANKS {
        let t = tensor(rank, cuda);
        export.bench_function(BenchmarkId::new("cuda_array_interface", rank), |b| {
            b.iter(|| black_box(CudaArrayInterface::export(black_box(&t)).expect("exports")))
        });
        let h = tensor(rank, Device::CPU);
        export.bench_function(BenchmarkId::new("array_interface", rank), |b| {
            b.iter(|| black_box(ArrayInterface::export(black_box(&h)).expect("exports")))
        });
    }
    export.finish();

    let mut import = c.benchmark_group("cai/import");
    for rank in RANKS {
        let t = tensor(rank, cuda);
        let dict = CudaArrayInterface::export(&t).expect("exports");
        let owner: Owner = Arc::new(());
        import.bench_function(BenchmarkId::new("cuda_array_interface", rank), |b| {
            b.iter(|| {
                let v = black_box(&dict).import(cuda, &options).expect("valid");
                // SAFETY: never dereferenced (see `tensor`).
                let t = unsafe { v.into_tensor(owner.clone()) };
                black_box(&t);
            })
        });
        let h = tensor(rank, Device::CPU);
        let dict = ArrayInterface::export(&h).expect("exports");
        import.bench_function(BenchmarkId::new("array_interface", rank), |b| {
            b.iter(|| {
                let v = black_box(&dict).import(&options).expect("valid");
                // SAFETY: never dereferenced (see `tensor`).
                let t = unsafe { v.into_tensor(owner.clone()) };
                black_box(&t);
            })
        });
    }
    import.finish();
}

/// Pairs through the core: one adapter's import, the other's export.
fn pairs(c: &mut Criterion) {
    let cuda = Device::new(DeviceType::Cuda, 0);
    let options = ImportOptions::default();
    let mut group = c.benchmark_group("pairs");
    for rank in RANKS {
        let t = tensor(rank, cuda);
        let dict = CudaArrayInterface::export(&t).expect("exports");
        let owner: Owner = Arc::new(());
        group.bench_function(BenchmarkId::new("cai_to_dlpack", rank), |b| {
            b.iter(|| {
                let v = black_box(&dict).import(cuda, &options).expect("valid");
                // SAFETY: never dereferenced (see `tensor`).
                let t = unsafe { v.into_tensor(owner.clone()) };
                black_box(export_versioned(&t).expect("exports"))
            })
        });
        group.bench_function(BenchmarkId::new("dlpack_to_cai", rank), |b| {
            b.iter_batched(
                || NonNull::new(export_versioned(&t).expect("exports").into_raw()).unwrap(),
                |raw| {
                    // SAFETY: a live export of `t` (never dereferenced); ownership passes.
                    let imported = unsafe { import_versioned(raw) }.expect("valid");
                    black_box(CudaArrayInterface::export(&imported.tensor).expect("exports"))
                },
                criterion::BatchSize::SmallInput,
            )
        });
    }
    group.finish();
}

criterion_group!(benches, cai, pairs);
criterion_main!(benches);
