//! Zero-copy vs copying, by tensor size (GPU, feature `gpu`): what handing a CUDA buffer to
//! another library costs when it is shared (tensorbridge: describe, export as DLPack, import,
//! make a launch view on another stream) and when it is copied (a device-to-device copy of
//! the same bytes, the fallback when two libraries cannot share).
//!
//! Not a criterion bench: the copy side needs CUDA events (device time) and sizes up to
//! 1 GiB. Prints a markdown table and writes `copy_vs_share.csv` into `$OUT` (or the current
//! directory); `benches/plot_copy_vs_share.py` turns the CSV into docs/copy_vs_share.svg.
//! Medians over many repetitions after a warm-up; the buffers hold non-zero data.

use std::hint::black_box;
use std::ptr::NonNull;
use std::time::Instant;

use cudarc::driver::{CudaContext, sys};
use tensorbridge_cudarc as tbc;
use tensorbridge_dlpack::{export_versioned, import_versioned};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        // `cargo bench` asks harness-less benches to list themselves; nothing to list.
        return;
    }
    assert!(
        tensorbridge_cuda::driver_present(),
        "copy_vs_share needs an NVIDIA GPU and driver: libcuda could not be loaded"
    );
    let ctx = CudaContext::new(0).expect("a CUDA context on device 0");
    let producer = ctx.new_stream().expect("a stream");
    let consumer = ctx.new_stream().expect("a stream");
    let mut rows = Vec::new();
    println!(
        "| bytes | zero-copy share (host, median) | D2D copy (device, median) | copy / share |"
    );
    println!("|---:|---:|---:|---:|");
    for log2 in (12..=30).step_by(2) {
        let bytes = 1usize << log2;
        let n = bytes / 4;
        let host: Vec<f32> = (0..n).map(|i| (i % 65_521) as f32 + 0.5).collect();
        let src = producer.clone_htod(&host).expect("upload");
        let copy_src = producer.clone_htod(&host).expect("upload");
        let mut dst = producer.alloc_zeros::<f32>(n).expect("alloc");
        let tensor = tbc::import(src).expect("owned tensor");
        ctx.synchronize().expect("synchronize");

        // Share: the whole hand-off a consumer library sees, as host time (it enqueues
        // a GPU-side wait and never blocks).
        let share = |reps: usize| -> Vec<f64> {
            (0..reps)
                .map(|_| {
                    let start = Instant::now();
                    let raw = export_versioned(&tensor).expect("export").into_raw();
                    // SAFETY: a live export of `tensor`; ownership passes to the import.
                    let back = unsafe { import_versioned(NonNull::new(raw).expect("non-null")) }
                        .expect("import")
                        .into_tensor();
                    let view = tbc::view::<f32>(&back, &consumer).expect("view");
                    black_box(&view);
                    drop(view);
                    start.elapsed().as_secs_f64() * 1e6
                })
                .collect()
        };
        share(200);
        let share_us = median(share(2_000));
        consumer.synchronize().expect("synchronize");
        tensorbridge_cuda::reclaim();

        // Copy: device time of one D2D copy of the same bytes, CUDA events around it.
        let reps = if bytes >= 1 << 28 { 10 } else { 50 };
        let mut copy_ms = Vec::new();
        for rep in 0..reps + 3 {
            let start = producer
                .record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
                .expect("event");
            producer.memcpy_dtod(&copy_src, &mut dst).expect("copy");
            let end = producer
                .record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
                .expect("event");
            end.synchronize().expect("synchronize");
            if rep >= 3 {
                copy_ms.push(f64::from(start.elapsed_ms(&end).expect("elapsed")));
            }
        }
        let check = producer.clone_dtoh(&dst).expect("download");
        assert_eq!(check[n - 1], host[n - 1], "the copy is real");
        let copy_us = median(copy_ms) * 1e3;
        println!(
            "| {bytes} | {share_us:.2} us | {copy_us:.2} us | {:.1}x |",
            copy_us / share_us
        );
        rows.push(format!("{bytes},{share_us:.4},{copy_us:.4}"));
    }
    let dir = std::env::var_os("OUT").map_or_else(|| ".".into(), std::path::PathBuf::from);
    let path = dir.join("copy_vs_share.csv");
    let csv = format!("bytes,share_us,copy_us\n{}\n", rows.join("\n"));
    std::fs::write(&path, csv).expect("writing the CSV");
    println!("wrote {}", path.display());
}
