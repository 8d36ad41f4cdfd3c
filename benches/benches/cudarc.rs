//! cudarc (GPU, feature `gpu`): slice -> Tensor -> launch-argument view, and the stream
//! hand-off itself, as the host sees them (the GPU-side wait is enqueued, never waited for).
//!
//! Needs an NVIDIA GPU and driver: without one it stops with a message saying so.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use tensorbridge::{Ready, Tensor};
use tensorbridge_cudarc as tbc;

struct Setup {
    producer: Arc<CudaStream>,
    consumer: Arc<CudaStream>,
    slice: CudaSlice<f32>,
    /// An owned tensor on the producer stream (`Ready::Stream`).
    owned: Tensor,
}

fn setup() -> Setup {
    assert!(
        tensorbridge_cuda::driver_present(),
        "the cudarc benches need an NVIDIA GPU and driver: libcuda could not be loaded"
    );
    let ctx = CudaContext::new(0).expect("a CUDA context on device 0");
    let producer = ctx.new_stream().expect("a stream");
    let consumer = ctx.new_stream().expect("a stream");
    let slice = producer.clone_htod(&vec![1.5f32; 1 << 20]).expect("upload");
    let other = producer.clone_htod(&vec![2.5f32; 1 << 20]).expect("upload");
    let owned = tbc::import(other).expect("owned tensor");
    ctx.synchronize().expect("synchronize");
    Setup {
        producer,
        consumer,
        slice,
        owned,
    }
}

fn slice_to_view(c: &mut Criterion) {
    let s = setup();
    let mut group = c.benchmark_group("cudarc/slice_to_view");
    // Borrow, describe, view on another stream (GPU-side wait), end of scope (GPU-side join,
    // cudarc's read event).
    group.bench_function("borrowed", |b| {
        b.iter(|| {
            tbc::lend(black_box(&s.slice), |t| {
                let v = t.view(&s.consumer)?;
                Ok::<_, tbc::Error>(black_box(v.device_ptr()))
            })
            .expect("view")
        })
    });
    // A view of an owned tensor (any `Tensor`): checks, GPU-side wait, and on drop the owner
    // kept until the consumer's work is done.
    group.bench_function("tensor_view", |b| {
        b.iter(|| {
            let v = tbc::view::<f32>(black_box(&s.owned), &s.consumer).expect("view");
            black_box(v.device_ptr())
        })
    });
    group.finish();
    s.consumer.synchronize().expect("synchronize");
    tensorbridge_cuda::reclaim();
}

fn handoff(c: &mut Criterion) {
    let s = setup();
    let consumer = tensorbridge_cuda::stream_of(&s.consumer);
    let producer = tensorbridge_cuda::stream_of(&s.producer);
    let signalled = tensorbridge_cuda::record_ready(&s.owned).expect("record");
    assert!(matches!(signalled.ready(), Ready::Signal(_)));
    let mut group = c.benchmark_group("cudarc/handoff");
    // The raw `handoff`s below hand the driver `consumer` and `producer`: streams of device 0's
    // primary context that `s` keeps alive until after every result is dropped (at once).
    // Ready::Stream: pooled event recorded on the producer, cuStreamWaitEvent on the consumer.
    group.bench_function("stream_ready", |b| {
        b.iter(|| {
            // SAFETY: `consumer` is live, and the result dropped at once (see above).
            unsafe { tensorbridge_cuda::handoff_raw(black_box(&s.owned), consumer) }
                .expect("handoff")
        })
    });
    // Ready::Signal: cuStreamWaitEvent only.
    group.bench_function("signal_ready", |b| {
        b.iter(|| {
            // SAFETY: `consumer` is live, and the result dropped at once (see above).
            unsafe { tensorbridge_cuda::handoff_raw(black_box(&signalled), consumer) }
                .expect("handoff")
        })
    });
    // Same stream: nothing to do.
    group.bench_function("same_stream", |b| {
        b.iter(|| {
            // SAFETY: `producer` is live, and the result dropped at once (see above).
            unsafe { tensorbridge_cuda::handoff_raw(black_box(&s.owned), producer) }
                .expect("handoff")
        })
    });
    // The safe form for a cudarc stream: as `stream_ready`, plus an event recorded on the
    // consumer (the returned readiness keeps the stream alive).
    group.bench_function("handoff_to", |b| {
        b.iter(|| tensorbridge_cuda::handoff(black_box(&s.owned), &s.consumer).expect("handoff_to"))
    });
    // Ready::Stream -> Ready::Signal: one pooled event recorded.
    group.bench_function("record_ready", |b| {
        b.iter(|| tensorbridge_cuda::record_ready(black_box(&s.owned)).expect("record"))
    });
    group.finish();
    s.consumer.synchronize().expect("synchronize");
}

criterion_group!(benches, slice_to_view, handoff);
criterion_main!(benches);
