//! Stream ordering across the boundary, both ways. A producer kernel spins 60 ms on its
//! stream and then writes; the consumer runs on the other side's stream. With the crate's
//! hand-off the consumer sees every value, starts after the producer ended (CUDA events) and
//! the host got control back while the producer still ran. Without it (the control: the same
//! program with readiness withheld) the consumer reads stale values, which is what makes the
//! first test of each pair able to fail.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use cudarc::driver::{CudaContext, CudaSlice, DevicePtr};
use tch::{Device as TchDevice, Kind};
use tensorbridge_core::{
    Access, DType, Descriptor, Device, Layout, Packing, Ready, Stream, Tensor,
};
use tensorbridge_cudarc as tbc;

use crate::{Affine, Kernels, affine, context, import, serial, timing_event, torch_values, wrong};

/// Elements written by the producer: 16 MiB of f32.
const N: usize = 1 << 22;
/// How long the producer spins before it writes.
const SPIN_NS: u64 = 60_000_000;
/// The most the conversion may keep the host (it never waits for the GPU; the bound leaves
/// room for a shared machine).
const HOST_LIMIT: Duration = Duration::from_millis(5);
/// What the data holds before the producer writes `2 i + 1`.
const BEFORE: f32 = 0.5;

fn written() -> Vec<f32> {
    affine(N, 2.0, 1.0)
}

/// The device pointer of a slice.
fn dptr(slice: &CudaSlice<f32>) -> u64 {
    let (ptr, _record) = slice.device_ptr(slice.stream());
    ptr
}

/// One race: host time of the conversion, whether the producer still ran when it returned,
/// the consumer's start minus the producer's end (ms, CUDA events), values wrong.
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

    fn assert_ordered_without_blocking(&self, what: &str) {
        self.print(what);
        assert_eq!(
            self.wrong, 0,
            "{what}: the consumer read values not written yet"
        );
        assert!(
            self.gap_ms >= 0.0,
            "{what}: the consumer started before the producer ended"
        );
        assert!(
            self.host < HOST_LIMIT,
            "{what}: the conversion kept the host {:?}",
            self.host
        );
        assert!(
            self.producer_running,
            "{what}: the producer had finished when the conversion returned (did it block?)"
        );
    }

    fn assert_raced(&self, what: &str) {
        self.print(what);
        assert!(
            self.wrong > 0 || self.gap_ms < 0.0,
            "{what}: no race observed without the hand-off, so its test could not fail"
        );
    }
}

/// A cudarc producer on its own stream, a libtorch consumer on libtorch's current stream:
/// `tensorbridge_tch::export` of a tensor that is [`Ready::Stream`] of the producer (or, for the control,
/// claims [`Ready::Now`]), then a device-to-host copy by libtorch.
fn cudarc_to_libtorch(ctx: &Arc<CudaContext>, k: &Kernels, hand_off: bool) -> Result<Outcome> {
    let producer = ctx.new_stream()?;
    let legacy = ctx.default_stream(); // libtorch's current stream
    let data = producer.clone_htod(&vec![BEFORE; N])?;
    producer.synchronize()?;
    let src = dptr(&data);
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
    // Warm up (libtorch's streams, the event pool) outside the timing.
    // SAFETY: no view of the tensor lives while libtorch writes it.
    drop(unsafe { tensorbridge_tch::export(&tensor) }?);
    ctx.synchronize()?;

    Affine::fill(src, N, 2.0, 1.0)
        .after(SPIN_NS)
        .launch(k, &producer)?;
    let p_end = timing_event(&producer)?;
    let tensor = if hand_off {
        // SAFETY: 1: the only pending write is the kernel just enqueued on `producer`; 2:
        // `producer`, a stream of device 0's primary context, outlives every clone (they are
        // dropped, and the device synchronised, before this function returns); 3: not the
        // per-thread stream.
        unsafe { tensor.with_ready(Ready::Stream(tensorbridge_cuda::stream_of(&producer))) }
    } else {
        tensor // the control: claims `Ready::Now` although the producer is still running
    };

    let start = Instant::now();
    // SAFETY: no view of the tensor lives while libtorch writes it.
    let torch = unsafe { tensorbridge_tch::export(&tensor) }?;
    let host = start.elapsed();
    let producer_running = !p_end.is_complete();
    let c_start = timing_event(&legacy)?;
    let got = torch_values(&torch); // libtorch's copy on its stream, then its sync
    ctx.synchronize()?;
    let gap_ms = p_end.elapsed_ms(&c_start)?;
    drop((torch, tensor));
    tch::Cuda::synchronize(0);
    tensorbridge_cuda::reclaim();
    Ok(Outcome {
        host,
        producer_running,
        gap_ms,
        wrong: wrong(&got, &written()),
    })
}

/// A producer on libtorch's current stream writing a libtorch tensor, a cudarc consumer on
/// its own stream: `tensorbridge_tch::import`, then a view for the consumer stream (or, for the control, the
/// raw pointer without a view), then a copy kernel there.
fn libtorch_to_cudarc(ctx: &Arc<CudaContext>, k: &Kernels, hand_off: bool) -> Result<Outcome> {
    let consumer = ctx.new_stream()?;
    let legacy = ctx.default_stream(); // libtorch's current stream
    let x = tch::Tensor::full(
        [N as i64],
        f64::from(BEFORE),
        (Kind::Float, TchDevice::Cuda(0)),
    );
    let dst = consumer.clone_htod(&vec![-1.0f32; N])?;
    // Warm up (the event pool, the view path) outside the timing.
    drop(tbc::view::<f32>(&import(&x)?, &consumer)?);
    ctx.synchronize()?;

    let x_ptr = x.data_ptr() as u64;
    Affine::fill(x_ptr, N, 2.0, 1.0)
        .after(SPIN_NS)
        .launch(k, &legacy)?;
    let p_end = timing_event(&legacy)?;

    let start = Instant::now();
    let shared = import(&x)?;
    assert!(matches!(
        shared.ready(),
        Ready::Stream(Stream::LegacyDefault)
    ));
    let view = if hand_off {
        Some(tbc::view::<f32>(&shared, &consumer)?)
    } else {
        None
    };
    let host = start.elapsed();
    let producer_running = !p_end.is_complete();
    let src = view.as_ref().map_or(x_ptr, |v| v.device_ptr());
    let c_start = timing_event(&consumer)?;
    Affine::copy(src, dptr(&dst), N).launch(k, &consumer)?;
    drop(view);
    ctx.synchronize()?;
    let gap_ms = p_end.elapsed_ms(&c_start)?;
    let got = consumer.clone_dtoh(&dst)?;
    drop(shared);
    tensorbridge_cuda::reclaim();
    Ok(Outcome {
        host,
        producer_running,
        gap_ms,
        wrong: wrong(&got, &written()),
    })
}

#[test]
fn export_orders_libtorch_after_the_producer_without_blocking() -> Result<()> {
    let _serial = serial();
    let ctx = context(0)?;
    let k = Kernels::load(&ctx)?;
    cudarc_to_libtorch(&ctx, &k, true)?
        .assert_ordered_without_blocking("cudarc producer -> export -> libtorch's stream");
    Ok(())
}

#[test]
fn export_without_readiness_races() -> Result<()> {
    let _serial = serial();
    let ctx = context(0)?;
    let k = Kernels::load(&ctx)?;
    cudarc_to_libtorch(&ctx, &k, false)?
        .assert_raced("control: cudarc producer -> export claiming Ready::Now");
    Ok(())
}

#[test]
fn import_orders_a_cudarc_consumer_without_blocking() -> Result<()> {
    let _serial = serial();
    let ctx = context(0)?;
    let k = Kernels::load(&ctx)?;
    libtorch_to_cudarc(&ctx, &k, true)?
        .assert_ordered_without_blocking("libtorch's stream -> import -> view on stream B");
    Ok(())
}

#[test]
fn import_without_a_view_races() -> Result<()> {
    let _serial = serial();
    let ctx = context(0)?;
    let k = Kernels::load(&ctx)?;
    libtorch_to_cudarc(&ctx, &k, false)?
        .assert_raced("control: libtorch's stream -> raw pointer on stream B");
    Ok(())
}
