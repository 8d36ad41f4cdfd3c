//! tch (libtorch): `Tensor` -> `tch::Tensor` and back, ranks 1, 4 and 8, next to tch's own
//! calls on the same memory, in the same groups so one run compares them.
//!
//! - `tch/export`: ours is `tensorbridge_tch::export` (the owner cloned into a boxed context, one shim call:
//!   `at::for_blob` with that context and its deleter, a heap `at::Tensor`), then dropping the
//!   tch tensor (libtorch frees the storage and calls the deleter, which drops the clone).
//!   tch's is `Tensor::from_blob` over the same pointer, shape and strides (no deleter: the
//!   caller keeps the memory alive by hand), then drop.
//! - `tch/import`: ours is `tensorbridge_tch::import` (one shim call describing the tensor and
//!   taking a reference to its storage, the core's validation, an `Arc` around that reference
//!   as owner), then drop (one more shim call gives the reference back). tch's is what reading the
//!   same facts costs through its own API: `data_ptr()`, `size()` and `stride()` (no
//!   validation, no keep-alive).
//!
//! CPU tensors: the CUDA path adds libtorch's current-stream lookup and, for tensors not
//! ready yet, one event record and wait.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use tch::{Device, Kind};
use tensorbridge_core::Tensor;

const RANKS: [usize; 4] = [1, 2, 4, 8];

fn shape(rank: usize) -> Vec<i64> {
    (0..rank).map(|d| 2 + (d % 3) as i64).collect()
}

fn export_group(c: &mut Criterion) {
    let mut group = c.benchmark_group("tch/export");
    for rank in RANKS {
        let shape = shape(rank);
        let numel: i64 = shape.iter().product();
        let tensor = Tensor::from_vec(vec![0.5f32; numel as usize], &shape).expect("valid");
        let strides = tensor.strides_elems().to_vec();
        group.bench_function(
            BenchmarkId::new("tensorbridge", format!("rank{rank}")),
            |b| {
                b.iter(|| {
                    // SAFETY: no view of the tensor lives while libtorch writes it.
                    black_box(
                        unsafe { tensorbridge_tch::export(black_box(&tensor)) }
                            .expect("convertible"),
                    )
                })
            },
        );
        let ptr = tensor.data_ptr() as *const u8;
        group.bench_function(
            BenchmarkId::new("tch_from_blob", format!("rank{rank}")),
            |b| {
                b.iter(|| {
                    // SAFETY: `tensor`'s buffer (`numel` floats with these strides) outlives every
                    // tch tensor made here, each dropped within the iteration.
                    black_box(unsafe {
                        tch::Tensor::from_blob(
                            black_box(ptr),
                            black_box(&shape),
                            black_box(&strides),
                            Kind::Float,
                            Device::Cpu,
                        )
                    })
                })
            },
        );
    }
    group.finish();
}

fn import_group(c: &mut Criterion) {
    let mut group = c.benchmark_group("tch/import");
    for rank in RANKS {
        let torch = tch::Tensor::ones(shape(rank), (Kind::Float, Device::Cpu));
        group.bench_function(
            BenchmarkId::new("tensorbridge", format!("rank{rank}")),
            |b| {
                b.iter(|| {
                    // SAFETY: nothing resizes `torch`'s storage during the bench, and it
                    // stays on this thread.
                    black_box(
                        unsafe { tensorbridge_tch::import(black_box(&torch)) }.expect("shareable"),
                    )
                })
            },
        );
        group.bench_function(
            BenchmarkId::new("tch_ptr_size_stride", format!("rank{rank}")),
            |b| {
                b.iter(|| {
                    let t = black_box(&torch);
                    black_box((t.data_ptr(), t.size(), t.stride()))
                })
            },
        );
    }
    group.finish();
}

criterion_group!(benches, export_group, import_group);
criterion_main!(benches);
