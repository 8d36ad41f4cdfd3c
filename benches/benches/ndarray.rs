//! ndarray: a host tensor viewed as an ndarray `ArrayView` (`tensorbridge_ndarray::view`, the
//! core's checks included) next to ndarray's own `ArrayView::from_shape_ptr` on the same
//! pointer, shape and strides (nothing checked), ranks 1, 2, 4 and 8; and an array lent as a
//! tensor (`lend`), the other direction.

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use ndarray::{ArrayD, ArrayView, IxDyn, ShapeBuilder};
use tensorbridge_core::Tensor;

fn shape(rank: usize) -> Vec<usize> {
    (0..rank).map(|d| 2 + d % 3).collect()
}

fn view_vs_from_shape_ptr(c: &mut Criterion) {
    let mut group = c.benchmark_group("ndarray/view");
    for rank in [1usize, 2, 4, 8] {
        let dims = shape(rank);
        let n: usize = dims.iter().product();
        let dims_i64: Vec<i64> = dims.iter().map(|&d| d as i64).collect();
        let t = Tensor::from_vec(vec![1.0f32; n], &dims_i64).expect("valid");
        group.bench_function(format!("tensorbridge/rank{rank}"), |b| {
            b.iter(|| {
                let v = tensorbridge_ndarray::view::<f32, IxDyn>(black_box(&t)).expect("a view");
                black_box(v.as_ptr());
            })
        });
        let strides: Vec<usize> = t.strides_elems().iter().map(|&s| s as usize).collect();
        let ptr = t.data_ptr() as *const f32;
        group.bench_function(format!("from_shape_ptr/rank{rank}"), |b| {
            b.iter(|| {
                // SAFETY: the tensor's own C-order layout over its live buffer, read-only.
                let v = unsafe {
                    ArrayView::from_shape_ptr(
                        IxDyn(black_box(&dims)).strides(IxDyn(&strides)),
                        black_box(ptr),
                    )
                };
                black_box(v.as_ptr());
            })
        });
    }
    group.finish();
}

fn lend(c: &mut Criterion) {
    let mut group = c.benchmark_group("ndarray/lend");
    for rank in [1usize, 2, 4, 8] {
        let a = ArrayD::<f32>::ones(IxDyn(&shape(rank)));
        group.bench_function(format!("rank{rank}"), |b| {
            b.iter(|| {
                tensorbridge_ndarray::lend(black_box(&a), |l| {
                    Ok::<_, tensorbridge_ndarray::Error>(black_box(l.descriptor().data_ptr()))
                })
                .expect("lent")
            })
        });
    }
    group.finish();
}

criterion_group!(benches, view_vs_from_shape_ptr, lend);
criterion_main!(benches);
