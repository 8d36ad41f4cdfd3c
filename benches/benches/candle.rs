//! candle: a candle CPU tensor out to a `Tensor` (`tensorbridge_candle::import`: storage and
//! layout read, dtype mapped, the layout checked against the storage, validated, the candle
//! tensor cloned as the owner) next to reading the same by hand (the storage's pointer,
//! dims, strides and start offset under candle's lock, nothing checked or held), ranks 1, 2,
//! 4 and 8.

use std::hint::black_box;

use candle_core::{CpuStorage, DType, Device, Storage, Tensor as Candle};
use criterion::{Criterion, criterion_group, criterion_main};

fn shape(rank: usize) -> Vec<usize> {
    (0..rank).map(|d| 2 + d % 3).collect()
}

fn import_vs_by_hand(c: &mut Criterion) {
    let mut group = c.benchmark_group("candle/import");
    for rank in [1usize, 2, 4, 8] {
        let t = Candle::zeros(shape(rank), DType::F32, &Device::Cpu).expect("zeros");
        group.bench_function(format!("tensorbridge/rank{rank}"), |b| {
            b.iter(|| {
                // SAFETY: nothing writes `t` in place during the bench.
                let tb = unsafe { tensorbridge_candle::import(black_box(&t)) }.expect("import");
                black_box(tb.data_ptr());
            })
        });
        group.bench_function(format!("by_hand/rank{rank}"), |b| {
            b.iter(|| {
                let t = black_box(&t);
                let (storage, layout) = t.storage_and_layout();
                let Storage::Cpu(CpuStorage::F32(v)) = &*storage else {
                    unreachable!()
                };
                let first = v.as_ptr().wrapping_add(layout.start_offset());
                black_box((first, layout.dims(), layout.stride()));
            })
        });
        // SAFETY: as above.
        let tb = unsafe { tensorbridge_candle::import(&t) }.expect("import");
        group.bench_function(format!("export_back/rank{rank}"), |b| {
            b.iter(|| black_box(tensorbridge_candle::export(black_box(&tb)).expect("same")))
        });
    }
    group.finish();
}

criterion_group!(benches, import_vs_by_hand);
criterion_main!(benches);
