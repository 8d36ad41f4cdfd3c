//! Core: untrusted raw descriptor -> validated `Tensor`, ranks 1, 2, 4 and 8.
//!
//! Measures `RawTensor::validate` plus attaching an owner (an `Arc` clone), the whole cost
//! every adapter's import pays at the trust boundary.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use tensorbridge_core::{DType, Owner, RawTensor, Tensor};

fn raw_to_tensor(c: &mut Criterion) {
    let mut group = c.benchmark_group("core/raw_to_tensor");
    let owner: Owner = Arc::new(());
    for rank in [1usize, 2, 4, 8] {
        // A strided (transposed, offset) layout, so no fast path for compact tensors hides
        // the general cost.
        let shape: Vec<i64> = (0..rank).map(|d| 2 + d as i64).collect();
        let mut strides = vec![0i64; rank];
        let mut acc = 1;
        for d in 0..rank {
            strides[d] = acc;
            acc *= shape[d];
        }
        let raw = RawTensor {
            strides: Some(&strides),
            byte_offset: 64,
            ..RawTensor::host(0x7f00_0000_0000, DType::FLOAT32, &shape)
        };
        group.bench_function(format!("rank{rank}"), |b| {
            b.iter(|| {
                let desc = black_box(&raw).validate().expect("valid");
                // SAFETY: never dereferenced: the bench only measures construction and drop.
                let t = unsafe { Tensor::from_descriptor(desc, owner.clone()) };
                black_box(t)
            })
        });
    }
    group.finish();
}

criterion_group!(benches, raw_to_tensor);
criterion_main!(benches);
