//! DLPack: `Tensor` -> versioned managed tensor -> `Tensor` round trip, ranks 1, 2, 4 and 8,
//! next to dlpark's own round trip on the same descriptor (its producer over a shared buffer,
//! its consumer's validation), in the same group so one run compares them.
//!
//! - `tensorbridge`: `export_versioned` (one allocation: the managed struct, a private copy
//!   of it, the shape and strides shown to consumers, and the finished `Imported`, a clone of
//!   the tensor copied in place), `import_versioned` (recognises its own export by the mark
//!   in `manager_ctx`, compares every field with the private copy and the shown dimension
//!   values with the kept tensor's, hands the `Imported` back in one copy and frees the box),
//!   then drop.
//! - `dlpark`: `metadata::Dynamic` copying shape and strides into its one allocation with an
//!   `Arc` of the buffer as context, then `Managed::from_raw` + `validate` (structural checks
//!   only: no dtype or device codes, alignment or address-span checks), then drop.
//! - `dlpark_to_tensorbridge`: dlpark's producer as above, then our `import_versioned` of a
//!   foreign struct: the core's full validation and a wrapper owner (one more allocation).
//!   This is what importing from any other producer costs.

use std::hint::black_box;
use std::ptr::NonNull;
use std::sync::Arc;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use dlpark::Managed;
use dlpark::ffi::{DLDataType, DLDevice, DLManagedTensorVersioned};
use dlpark::metadata::Dynamic;
use tensorbridge_core::Tensor;
use tensorbridge_dlpack::{export_versioned, import_versioned};

fn roundtrip(c: &mut Criterion) {
    let mut group = c.benchmark_group("dlpack/roundtrip");
    for rank in [1usize, 2, 4, 8] {
        let shape: Vec<i64> = (0..rank).map(|d| 2 + (d % 3) as i64).collect();
        let numel: i64 = shape.iter().product();
        let tensor = Tensor::from_vec(vec![0.5f32; numel as usize], &shape).expect("valid");
        let strides = tensor.strides_elems().to_vec();

        group.bench_function(
            BenchmarkId::new("tensorbridge", format!("rank{rank}")),
            |b| {
                b.iter(|| {
                    let raw = export_versioned(black_box(&tensor))
                        .expect("exportable")
                        .into_raw();
                    let raw = NonNull::new(raw).expect("never null");
                    // SAFETY: a live export of `tensor`, whose owner (cloned into the export)
                    // keeps the buffer alive; ownership moves to the import; never written.
                    let imported = unsafe { import_versioned(raw) }.expect("valid");
                    // By reference: `black_box` by value copies the ~280-byte result into a
                    // stack slot, which is criterion's cost, not the conversion's. Dropping
                    // it (the owner's release) stays inside the measurement.
                    black_box(&imported);
                })
            },
        );

        // dlpark's own producer on the same buffer and descriptor: shape and strides copied
        // into its one allocation, an `Arc` of the buffer as context.
        let buffer: Arc<Vec<f32>> = Arc::new(vec![0.5f32; numel as usize]);
        let dlpark_export = || -> *mut DLManagedTensorVersioned {
            let data = buffer.as_ptr().cast_mut().cast();
            let mut init = Dynamic::new(black_box(&shape[..]), black_box(&strides[..]))
                .initialize(Arc::clone(&buffer))
                .expect("valid metadata");
            init.set_data(data)
                .set_dtype(DLDataType::F32)
                .set_device(DLDevice::CPU);
            // SAFETY: describes the shared buffer, which the context (an `Arc` of it) keeps
            // alive until the deleter runs; never written.
            unsafe { init.finish() }.into_raw()
        };
        // ... and its own consumer.
        group.bench_function(BenchmarkId::new("dlpark", format!("rank{rank}")), |b| {
            b.iter(|| {
                let raw = dlpark_export();
                // SAFETY: a live managed tensor from dlpark's producer; ownership moves here.
                let managed =
                    unsafe { Managed::<DLManagedTensorVersioned>::from_raw(raw) }.expect("v1");
                black_box(managed.validate().expect("valid").shape().len());
                black_box(managed)
            })
        });

        group.bench_function(
            BenchmarkId::new("dlpark_to_tensorbridge", format!("rank{rank}")),
            |b| {
                b.iter(|| {
                    let raw = NonNull::new(dlpark_export()).expect("never null");
                    // SAFETY: a live managed tensor from dlpark's producer over the shared
                    // buffer; ownership moves to the import; never written.
                    let imported = unsafe { import_versioned(raw) }.expect("valid");
                    black_box(&imported);
                })
            },
        );
    }
    group.finish();
}

criterion_group!(benches, roundtrip);
criterion_main!(benches);
