//! Stream hand-off: a kernel on stream A writes slowly (60 ms), a consumer on stream B (or a
//! default stream) reads after the hand-off. With the hand-off the values are right, the
//! consumer starts after the producer ends (CUDA events) and the host got control back in
//! under 1 ms, while the producer still ran. Without it the same program races, which is what
//! makes the first test able to fail.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, PushKernelArg};
use tensorbridge_core::{
    Access, DType, Descriptor, Device, Layout, Packing, Ready, Stream, Tensor,
};

use crate::{Affine, Kernels, affine, context, dptr, grid, serial, timing_event};

/// Elements written by the producer: 16 MiB of f32.
const N: usize = 1 << 22;
/// How long the producer spins before it writes.
const SPIN_NS: u64 = 60_000_000;
/// The most the hand-off may keep the host.
const HOST_LIMIT: Duration = Duration::from_millis(1);

/// What the producer writes, what the data holds before, what the consumer's buffer holds
/// before its copy.
fn written() -> Vec<f32> {
    affine(N, 2.0, 1.0)
}
const BEFORE: (f32, f32) = (0.5, 7.0);
const SENTINEL: (f32, f32) = (0.0, -1.0);

/// Two non-blocking streams, the kernels, the producer's data as a tensor (as a framework
/// would hand it over: a raw pointer, an owner, the producer's stream), and the consumer's
/// output buffer.
struct Rig {
    /// First, so it drops before `a`, the stream its readiness names.
    tensor: Tensor,
    ctx: Arc<CudaContext>,
    k: Kernels,
    a: Arc<CudaStream>,
    b: Arc<CudaStream>,
    src: u64,
    dst: CudaSlice<f32>,
}

/// How [`Rig::race`] hands the tensor to the consumer.
#[derive(Clone, Copy)]
enum HandOff {
    /// The `unsafe` [`tensorbridge_cuda::handoff_raw`], with the consumer as a raw stream handle (as another
    /// framework's stream would come).
    Raw,
    /// The safe [`tensorbridge_cuda::handoff`], with the consumer as a cudarc stream.
    Cudarc,
    /// None at all: the control.
    Skip,
}

impl Rig {
    fn new() -> Result<Rig> {
        let ctx = context(0)?;
        let k = Kernels::load(&ctx)?;
        let a = ctx.new_stream()?;
        let b = ctx.new_stream()?;
        let data = a.clone_htod(&vec![0.0f32; N])?;
        let src = dptr(&data);
        let dst = b.clone_htod(&vec![0.0f32; N])?;
        let desc = Descriptor::new(
            src as usize,
            Device::cuda(0),
            DType::FLOAT32,
            Packing::Packed,
            Layout::row_major(&[N as i64])?,
            Access::ReadWrite,
        )?;
        // SAFETY: the owner is the slice itself, which keeps the N floats allocated on cuda:0;
        // the kernels below are the only writers, ordered by the test.
        let tensor = unsafe { Tensor::from_descriptor(desc, Arc::new(data)) };
        // SAFETY:
        // - 1: every write to the data is a kernel on `a` (the upload, `reset`, `race`);
        // - 2: `a`, a stream of device 0's primary context, is held by the rig, which drops
        //   `tensor` first; the tests drop every clone before the rig;
        // - 3: not the per-thread default stream.
        let tensor = unsafe { tensor.with_ready(Ready::Stream(tensorbridge_cuda::stream_of(&a))) };
        let rig = Rig {
            ctx,
            k,
            a,
            b,
            src,
            tensor,
            dst,
        };
        // Warm up: the device's primary context and its event pool, outside any timing.
        tensorbridge_cuda::handoff(&rig.tensor, &rig.b)?;
        rig.ctx.synchronize()?;
        Ok(rig)
    }

    /// Resets the data to `BEFORE` and the output to `SENTINEL`, and waits for it.
    fn reset(&self) -> Result<()> {
        Affine::fill(self.src, N, BEFORE.0, BEFORE.1).launch(&self.k, &self.a)?;
        Affine::fill(dptr(&self.dst), N, SENTINEL.0, SENTINEL.1).launch(&self.k, &self.b)?;
        self.ctx.synchronize()?;
        Ok(())
    }

    /// Launches the slow write on A, then (with or without hand-off) the copy on `consumer`;
    /// returns what happened.
    fn race(&self, consumer: &Arc<CudaStream>, how: HandOff) -> Result<Outcome> {
        self.reset()?;
        let (scale, offset) = (2.0, 1.0);
        Affine::fill(self.src, N, scale, offset)
            .after(SPIN_NS)
            .launch(&self.k, &self.a)?;
        let a_end = timing_event(&self.a)?;

        let named = tensorbridge_cuda::stream_of(consumer);
        let start = Instant::now();
        match how {
            HandOff::Raw => {
                // SAFETY: `consumer` is a cudarc stream of device 0's primary context (or one of
                // its default streams), alive for the whole race, after `handed` is dropped at
                // the end of this block; a per-thread `consumer` is this thread's, and
                // `handed` never leaves it.
                let handed = unsafe { tensorbridge_cuda::handoff_raw(&self.tensor, named) }?;
                assert_eq!(handed.ready().producer_stream(), Some(named));
            }
            HandOff::Cudarc => {
                let handed = tensorbridge_cuda::handoff(&self.tensor, consumer)?;
                assert!(matches!(handed.ready(), Ready::Signal(_)));
                // The signal names the consumer, except the per-thread default stream.
                let want = (named != Stream::PerThreadDefault).then_some(named);
                assert_eq!(handed.ready().producer_stream(), want);
            }
            HandOff::Skip => {}
        }
        let host = start.elapsed();
        let producer_running = !a_end.is_complete();

        let c_start = timing_event(consumer)?;
        Affine::copy(self.src, dptr(&self.dst), N).launch(&self.k, consumer)?;
        self.ctx.synchronize()?;
        let gap_ms = a_end.elapsed_ms(&c_start)?;
        let got = self.b.clone_dtoh(&self.dst)?;
        let want = written();
        let wrong = got
            .iter()
            .zip(&want)
            .filter(|(g, w)| g.to_bits() != w.to_bits())
            .count();
        Ok(Outcome {
            host,
            producer_running,
            gap_ms,
            wrong,
        })
    }
}

/// One race: host time of the hand-off, whether the producer still ran when it returned, the
/// consumer's start minus the producer's end (ms, CUDA events), and how many values were
/// wrong.
#[derive(Debug)]
struct Outcome {
    host: Duration,
    producer_running: bool,
    gap_ms: f32,
    wrong: usize,
}

impl Outcome {
    fn print(&self, what: &str) {
        println!(
            "{what}: host {:.1} us, producer still running on return: {}, consumer started \
             {:.3} ms after the producer ended, {} of {N} values wrong",
            self.host.as_secs_f64() * 1e6,
            self.producer_running,
            self.gap_ms,
            self.wrong
        );
    }

    /// Right values, consumer after producer, host free in under 1 ms while the GPU worked.
    fn assert_ordered_without_blocking(&self, what: &str) {
        self.print(what);
        assert_eq!(
            self.wrong, 0,
            "{what}: the consumer read values the producer had not written"
        );
        assert!(
            self.gap_ms >= 0.0,
            "{what}: the consumer started {} ms before the producer ended",
            -self.gap_ms
        );
        assert!(
            self.host < HOST_LIMIT,
            "{what}: the hand-off kept the host {:?}",
            self.host
        );
        assert!(
            self.producer_running,
            "{what}: the producer had finished when the hand-off returned (did it block?)"
        );
    }
}

#[test]
fn handoff_orders_the_consumer_stream_without_blocking_the_host() -> Result<()> {
    let _serial = serial();
    let rig = Rig::new()?;
    rig.race(&rig.b, HandOff::Raw)?
        .assert_ordered_without_blocking("hand-off to stream B (raw handle)");
    rig.race(&rig.b, HandOff::Cudarc)?
        .assert_ordered_without_blocking("hand-off to stream B (cudarc stream, handoff_to)");
    Ok(())
}

#[test]
fn without_handoff_the_same_program_races() -> Result<()> {
    let _serial = serial();
    let rig = Rig::new()?;
    let control = rig.race(&rig.b, HandOff::Skip)?;
    control.print("no hand-off, stream B");
    assert!(
        control.wrong > 0 || control.gap_ms < 0.0,
        "no race observed without the hand-off: the hand-off test could not fail"
    );
    Ok(())
}

#[test]
fn handoff_to_the_default_streams() -> Result<()> {
    let _serial = serial();
    let rig = Rig::new()?;
    let legacy = rig.ctx.default_stream();
    let per_thread = rig.ctx.per_thread_stream();
    assert_eq!(tensorbridge_cuda::stream_of(&legacy), Stream::LegacyDefault);
    assert_eq!(
        tensorbridge_cuda::stream_of(&per_thread),
        Stream::PerThreadDefault
    );
    rig.race(&legacy, HandOff::Raw)?
        .assert_ordered_without_blocking("hand-off to the legacy default stream (0x1)");
    rig.race(&per_thread, HandOff::Raw)?
        .assert_ordered_without_blocking("hand-off to the per-thread default stream (0x2)");
    rig.race(&legacy, HandOff::Cudarc)?
        .assert_ordered_without_blocking("handoff_to the legacy default stream");
    rig.race(&per_thread, HandOff::Cudarc)?
        .assert_ordered_without_blocking("handoff_to the per-thread default stream");
    // A non-blocking producer does not synchronise with the legacy stream by itself.
    let control = rig.race(&legacy, HandOff::Skip)?;
    control.print("no hand-off, legacy default stream");
    assert!(
        control.wrong > 0 || control.gap_ms < 0.0,
        "no race on the legacy stream"
    );
    Ok(())
}

/// `make_ready_on` of a borrowed tensor (`TensorRef`, no owner), what a kernel argument's
/// view does.
#[test]
fn make_ready_on_a_borrowed_tensor_orders_its_stream_without_blocking_the_host() -> Result<()> {
    let _serial = serial();
    let rig = Rig::new()?;
    rig.reset()?;
    Affine::fill(rig.src, N, 2.0, 1.0)
        .after(SPIN_NS)
        .launch(&rig.k, &rig.a)?;
    let a_end = timing_event(&rig.a)?;
    let start = Instant::now();
    tensorbridge_cuda::make_ready_on(rig.tensor.as_ref(), &rig.b)?;
    let host = start.elapsed();
    let producer_running = !a_end.is_complete();
    let c_start = timing_event(&rig.b)?;
    let (n, dst) = (N as u64, dptr(&rig.dst));
    let (scale, offset, spin) = (1.0f32, 0.0f32, 0u64);
    // SAFETY: `spin_affine` reads the tensor's N floats into `dst`, on the stream made ready.
    unsafe {
        rig.b
            .launch_builder(&rig.k.spin_affine)
            .arg(&rig.src)
            .arg(&dst)
            .arg(&n)
            .arg(&scale)
            .arg(&offset)
            .arg(&spin)
            .launch(grid())
    }?;
    rig.ctx.synchronize()?;
    let got = rig.b.clone_dtoh(&rig.dst)?;
    let wrong = got
        .iter()
        .zip(written())
        .filter(|(g, w)| g.to_bits() != w.to_bits())
        .count();
    Outcome {
        host,
        producer_running,
        gap_ms: a_end.elapsed_ms(&c_start)?,
        wrong,
    }
    .assert_ordered_without_blocking("view on stream B");
    Ok(())
}

#[test]
fn a_recorded_signal_does_not_wait_for_later_producer_work() -> Result<()> {
    let _serial = serial();
    let rig = Rig::new()?;
    rig.reset()?;
    let other = rig.a.clone_htod(&vec![1.0f32; N])?;
    rig.ctx.synchronize()?;
    Affine::fill(rig.src, N, 2.0, 1.0)
        .after(SPIN_NS)
        .launch(&rig.k, &rig.a)?;
    let signalled = tensorbridge_cuda::record_ready(&rig.tensor)?;
    assert!(matches!(signalled.ready(), Ready::Signal(_)));
    assert_eq!(
        signalled.ready().producer_stream(),
        Some(tensorbridge_cuda::stream_of(&rig.a))
    );
    // Later producer work, five times as long, on the same stream.
    Affine::fill(dptr(&other), N, 1.0, 0.0)
        .after(5 * SPIN_NS)
        .launch(&rig.k, &rig.a)?;
    let a_later = timing_event(&rig.a)?;

    let start = Instant::now();
    tensorbridge_cuda::make_ready_on(&signalled, &rig.b)?;
    let host = start.elapsed();
    Affine::copy(rig.src, dptr(&rig.dst), N).launch(&rig.k, &rig.b)?;
    let c_end = timing_event(&rig.b)?;
    rig.ctx.synchronize()?;
    let got = rig.b.clone_dtoh(&rig.dst)?;
    let wrong = got
        .iter()
        .zip(written())
        .filter(|(g, w)| g.to_bits() != w.to_bits())
        .count();
    let ahead_ms = c_end.elapsed_ms(&a_later)?;
    println!(
        "signal: host {:.1} us, consumer done {ahead_ms:.1} ms before the producer's later work, {wrong} values wrong",
        host.as_secs_f64() * 1e6
    );
    assert_eq!(wrong, 0);
    assert!(host < HOST_LIMIT);
    assert!(
        ahead_ms > 100.0,
        "the consumer waited for producer work enqueued after the signal ({ahead_ms} ms)"
    );
    Ok(())
}

#[test]
fn synchronize_blocks_until_ready() -> Result<()> {
    let _serial = serial();
    let rig = Rig::new()?;
    rig.reset()?;
    Affine::fill(rig.src, N, 2.0, 1.0)
        .after(SPIN_NS)
        .launch(&rig.k, &rig.a)?;
    let a_end = timing_event(&rig.a)?;
    let start = Instant::now();
    let ready = tensorbridge_cuda::synchronize(&rig.tensor)?;
    let host = start.elapsed();
    assert!(ready.ready().is_now());
    assert!(
        a_end.is_complete(),
        "synchronize returned before the producer finished"
    );
    println!(
        "synchronize: host blocked {:.1} ms",
        host.as_secs_f64() * 1e3
    );
    Ok(())
}

#[test]
fn handoff_cost_per_call() -> Result<()> {
    let _serial = serial();
    let rig = Rig::new()?;
    let consumer = tensorbridge_cuda::stream_of(&rig.b);
    // For every raw `handoff` below: `consumer` is `rig.b`, a stream of device 0's primary
    // context that the rig keeps alive, and each result is dropped at once.
    const CALLS: u32 = 20_000;
    let time = |f: &dyn Fn() -> Result<()>| -> Result<f64> {
        for _ in 0..1000 {
            f()?;
        }
        let start = Instant::now();
        for _ in 0..CALLS {
            f()?;
        }
        Ok(start.elapsed().as_secs_f64() * 1e6 / f64::from(CALLS))
    };
    let stream_ready = time(&|| {
        // SAFETY: `consumer` is live, and the result dropped at once (see above).
        unsafe { tensorbridge_cuda::handoff_raw(&rig.tensor, consumer) }
            .map(drop)
            .map_err(Into::into)
    })?;
    let signalled = tensorbridge_cuda::record_ready(&rig.tensor)?;
    let signal_ready = time(&|| {
        // SAFETY: `consumer` is live, and the result dropped at once (see above).
        unsafe { tensorbridge_cuda::handoff_raw(&signalled, consumer) }
            .map(drop)
            .map_err(Into::into)
    })?;
    let cudarc_ready = time(&|| {
        tensorbridge_cuda::handoff(&rig.tensor, &rig.b)
            .map(drop)
            .map_err(Into::into)
    })?;
    let record = time(&|| {
        tensorbridge_cuda::record_ready(&rig.tensor)
            .map(drop)
            .map_err(Into::into)
    })?;
    let view = time(&|| {
        // What a view costs: the wait, and its owner retired when it drops.
        tensorbridge_cuda::make_ready_on(rig.tensor.as_ref(), &rig.b)?;
        tensorbridge_cuda::retire_on(&rig.b, rig.tensor.owner().clone());
        Ok(())
    })?;
    rig.ctx.synchronize()?;
    tensorbridge_cuda::reclaim();
    println!(
        "hand-off cost (host, mean of {CALLS}): Ready::Stream {stream_ready:.2} us \
         (event record + cuStreamWaitEvent), Ready::Signal {signal_ready:.2} us \
         (cuStreamWaitEvent), handoff_to {cudarc_ready:.2} us (event record + \
         cuStreamWaitEvent + event record), record_ready {record:.2} us, make_ready_on + retire_on \
         {view:.2} us"
    );
    assert!(
        stream_ready < 1000.0 && signal_ready < 1000.0 && cudarc_ready < 1000.0 && view < 1000.0
    );
    Ok(())
}

/// 1e5 hand-offs of every kind leave device memory where it was: the pooled events, the
/// owners kept alive for pending work and the views' guards are all given back.
///
/// The driver reports the device's free memory, all processes together: run it with the GPU
/// to itself (`run.sh` runs the binaries one after another, the Python suite after them).
/// Another process allocating meanwhile shows here as a move in 2 MiB pages.
#[test]
fn handoffs_return_device_memory_to_baseline() -> Result<()> {
    let _serial = serial();
    let rig = Rig::new()?;
    let consumer = tensorbridge_cuda::stream_of(&rig.b);
    let round = |i: u32| -> Result<()> {
        match i % 4 {
            // SAFETY: `consumer` is `rig.b`, live for the whole test; the result is
            // dropped at once.
            0 => drop(unsafe { tensorbridge_cuda::handoff_raw(&rig.tensor, consumer) }?),
            1 => drop(tensorbridge_cuda::handoff(&rig.tensor, &rig.b)?),
            2 => drop(tensorbridge_cuda::record_ready(&rig.tensor)?),
            _ => {
                tensorbridge_cuda::make_ready_on(rig.tensor.as_ref(), &rig.b)?;
                tensorbridge_cuda::retire_on(&rig.b, rig.tensor.owner().clone());
            }
        }
        Ok(())
    };
    // Warm up: the event pool and the driver's own structures reach their working size.
    for i in 0..2_000 {
        round(i)?;
    }
    rig.ctx.synchronize()?;
    tensorbridge_cuda::reclaim();
    let (free_before, total) = cudarc::driver::result::mem_get_info()?;
    const ROUNDS: u32 = 100_000;
    let start = Instant::now();
    for i in 0..ROUNDS {
        round(i)?;
    }
    let host = start.elapsed();
    rig.ctx.synchronize()?;
    tensorbridge_cuda::reclaim();
    let (free_after, _) = cudarc::driver::result::mem_get_info()?;
    let delta = free_before as i64 - free_after as i64;
    println!(
        "{ROUNDS} hand-offs in {:.1} ms: device memory free {free_before} -> {free_after} bytes \
         of {total} (delta {delta})",
        host.as_secs_f64() * 1e3
    );
    // The driver reserves in 2 MiB pages; anything growing per hand-off would show as
    // megabytes after 1e5 of them.
    assert!(
        delta.unsigned_abs() <= 2 << 20,
        "device memory moved by {delta} bytes over {ROUNDS} hand-offs"
    );
    Ok(())
}
