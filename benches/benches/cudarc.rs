//! cudarc (GPU, feature `gpu`): slice -> Tensor -> launch-argument view, the stream hand-off
//! itself, and a kernel call's host cost piece by piece (the cached kernel lookup, a call
//! with borrowed arguments retired in one batch, a call-only stream's fork and join), as the
//! host sees them (the GPU-side work is enqueued, never waited for).
//!
//! Needs an NVIDIA GPU and driver: without one it stops with a message saying so.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use tensorbridge_core::{Ready, Tensor};
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

/// The cookbook's axpy, grid-stride.
const AXPY: &str = r#"
extern "C" __global__ void axpy(float alpha, const float* x, tb_layout lx,
                                float* y, tb_layout ly, long long n) {
    for (long long i = tb_index(); i < n; i += tb_stride())
        y[tb_offset(ly, i)] += alpha * x[tb_offset(lx, i)];
}"#;

static AXPY_KERNEL: tbc::Kernel = tbc::Kernel::new(AXPY, "axpy");

/// One axpy on `stream` through checked views of `x` and `y`, each borrowed or owned.
fn axpy_call(
    stream: &Arc<CudaStream>,
    x: tbc::KernelTensor<'_>,
    y: tbc::KernelTensor<'_>,
    f: &cudarc::driver::CudaFunction,
) {
    use cudarc::driver::PushKernelArg;
    let args = tbc::KernelArgs::new(stream);
    let xv = args.input::<f32>(x).expect("input");
    let mut yv = args.output::<f32>(y).expect("output");
    let (lx, ly, n) = (
        xv.layout().expect("layout"),
        yv.layout().expect("layout"),
        yv.numel(),
    );
    let alpha = 0.5f32;
    // SAFETY: `axpy`'s signature is this argument list; it touches only the views' elements
    // (grid-stride over `n`), on the views' stream.
    unsafe {
        stream
            .launch_builder(f)
            .arg(&alpha)
            .arg(&xv)
            .arg(&lx)
            .arg(&mut yv)
            .arg(&ly)
            .arg(&(n as i64))
            .launch(tbc::grid_stride(n))
    }
    .expect("launch");
}

fn kernel_call(c: &mut Criterion) {
    let s = setup();
    let stream = &s.consumer;
    let x = tbc::import(stream.clone_htod(&vec![1.0f32; 1 << 16]).expect("upload")).expect("x");
    let y = tbc::import(stream.clone_htod(&vec![0.0f32; 1 << 16]).expect("upload")).expect("y");
    let f = tbc::kernel(stream, AXPY, "axpy").expect("compile");
    let module = stream
        .context()
        .load_module(tbc::ptx(&format!("{}{AXPY}", tbc::KERNEL_LAYOUT_CUDA), "axpy").expect("ptx"))
        .expect("module");
    let mut group = c.benchmark_group("cudarc/kernel_call");
    // The cached lookup by source (a hash of the source, a lock, a comparison).
    group.bench_function("kernel_lookup", |b| {
        b.iter(|| tbc::kernel(black_box(stream), AXPY, "axpy").expect("kernel"))
    });
    // A `static Kernel`: a lock and a comparison.
    group.bench_function("static_kernel", |b| {
        b.iter(|| AXPY_KERNEL.function(black_box(stream)).expect("kernel"))
    });
    // What every call paid before functions were cached: the context saved, then
    // cuModuleGetFunction.
    group.bench_function("module_get_function", |b| {
        b.iter(|| {
            let _keep = tensorbridge_cuda::ContextGuard::save().expect("save");
            module.load_function(black_box("axpy")).expect("function")
        })
    });
    // A whole call, owned arguments: two views, each retiring its owner (two events).
    group.bench_function("call_owned", |b| {
        b.iter(|| axpy_call(stream, (&x).into(), (&y).into(), &f))
    });
    // A whole call, borrowed arguments: two views with no owner, the owners retired with
    // one event after the launch (what `kernel_call` does).
    group.bench_function("call_borrowed", |b| {
        b.iter(|| {
            // SAFETY: both owners are retired on `stream` right after the launch.
            let xa = unsafe { tbc::KernelTensor::borrowed(x.as_ref()) };
            // SAFETY: as above.
            let ya = unsafe { tbc::KernelTensor::borrowed(y.as_ref()) };
            axpy_call(stream, xa, ya, &f);
            tensorbridge_cuda::retire_all_on(stream, [x.owner().clone(), y.owner().clone()]);
        })
    });
    // The borrowed stream around a call: lent as it is (immortal), or forked and joined
    // (call-only: two event records and two waits more).
    let name = tensorbridge_cuda::stream_of(stream);
    for (label, call_only) in [("stream_immortal", false), ("stream_call_only", true)] {
        group.bench_function(label, |b| {
            b.iter(|| {
                let life = if call_only {
                    tensorbridge_cuda::StreamLife::CallOnly
                } else {
                    tensorbridge_cuda::StreamLife::Immortal
                };
                // SAFETY: `stream` lives for the whole bench, past every clone.
                unsafe {
                    tensorbridge_cuda::with_stream_raw(0, name, life, |s| black_box(s.cu_stream()))
                }
                .expect("with_stream_raw")
            })
        });
    }
    group.finish();
    stream.synchronize().expect("synchronize");
}

criterion_group!(benches, slice_to_view, handoff, kernel_call);
criterion_main!(benches);
