//! tensorbridge-candle on a GPU (feature `gpu-tests`; run from the bundle of `cargo xtask
//! test-gpu`): candle CUDA tensors out to the core zero-copy, ordered after a busy producer
//! on candle's stream (and the control that reads without ordering and sees the race), the
//! round trip back, and foreign CUDA memory into candle (`export_leaked`) ordered after a
//! busy producer on another stream, with its owner never released.
//!
//! Fails, rather than skips, without a GPU. The busy producer is the testkit's (the one the
//! CUDA layer's, cudarc's and tch's GPU suites use): a kernel that spins for `SPIN_MS` on the
//! GPU's global timer and then writes its value, compiled with NVRTC (the CUDA toolkit's
//! libnvrtc).

// Tests fail through assertions; `Result` only carries driver errors out with their context,
// as in the other GPU suites.
#![allow(clippy::panic_in_result_fn)]

use std::time::{Duration, Instant};

use candle_core::{DType as D, Device as CandleDevice, Storage, Tensor as Candle};
use cudarc::driver::{CudaStream, DevicePtr, result, sys};
use tensorbridge_core::{Access, DType, Device, RawTensor, Ready, Stream, StreamHandle, Tensor};
use tensorbridge_testkit::DropCounter;
use tensorbridge_testkit::gpu::{Affine, Kernels};

type TestResult = Result<(), Box<dyn std::error::Error>>;

const SPIN_MS: u64 = 100;
const N: usize = 1 << 16;

/// The testkit's busy producer: `N` floats at `ptr` become `value` after `SPIN_MS` of GPU time
/// (it spins on the global timer, whatever the SM clock runs at).
fn busy_fill(ptr: u64, value: f32) -> Affine {
    Affine::fill(ptr, N, 0.0, value).after(SPIN_MS * 1_000_000)
}

/// The device address of a candle CUDA tensor's storage.
fn storage_ptr(c: &Candle) -> u64 {
    let (storage, _) = c.storage_and_layout();
    let Storage::Cuda(cuda) = &*storage else {
        panic!("a CUDA tensor")
    };
    let stream = cuda.device.cuda_stream();
    let slice = cuda.as_cuda_slice::<f32>().expect("f32");
    let (ptr, _record) = slice.device_ptr(&stream);
    ptr
}

/// Makes `consumer` wait for `ready` the way the CUDA-aware adapters do: the stream, or the
/// signal's own wait.
fn order(ready: &Ready, consumer: &CudaStream) -> TestResult {
    let handle = consumer.cu_stream() as usize;
    let consumer_stream = Stream::Handle(StreamHandle::new(handle).expect("a stream of its own"));
    match ready {
        Ready::Now => {}
        Ready::Stream(s) => {
            let event = consumer.context().new_event(None)?;
            // SAFETY: `s` is candle's stream, alive while the candle tensor is (the test
            // holds it); the event lives until the wait below is enqueued.
            unsafe { result::event::record(event.cu_event(), s.cuda_handle() as sys::CUstream) }?;
            consumer.wait(&event)?;
        }
        // SAFETY: `consumer` is a live stream of the tensor's device's primary context.
        Ready::Signal(sig) => unsafe { sig.enqueue_wait(consumer_stream) }
            .map_err(|e| e as Box<dyn std::error::Error>)?,
    }
    Ok(())
}

/// Copies `n` floats at `ptr` to the host on `stream` (after what it waits for) and waits.
fn read_on(
    stream: &CudaStream,
    ptr: u64,
    n: usize,
) -> Result<Vec<f32>, Box<dyn std::error::Error>> {
    let mut host = vec![-1f32; n];
    // SAFETY: `ptr` holds `n` floats the caller keeps alive; the host buffer is `n` floats
    // and outlives the copy (synchronized below).
    unsafe { result::memcpy_dtoh_async(&mut host[..], ptr, stream.cu_stream()) }?;
    stream.synchronize()?;
    Ok(host)
}

fn devices() -> Result<(CandleDevice, CandleDevice), Box<dyn std::error::Error>> {
    // candle's default (the per-thread default stream) and one with a stream of its own.
    Ok((
        CandleDevice::new_cuda(0)?,
        CandleDevice::new_cuda_with_stream(0)?,
    ))
}

#[test]
fn cuda_imports_are_zero_copy_and_carry_candle_stream() -> TestResult {
    let (per_thread, own) = devices()?;
    for dev in [&per_thread, &own] {
        let c = Candle::arange(0f32, 24., dev)?
            .reshape((4, 6))?
            .narrow(1, 2, 3)?;
        // SAFETY: nothing writes `c` in place while `t` lives.
        let t = unsafe { tensorbridge_candle::import(&c) }?;
        assert_eq!(t.device(), Device::cuda(0));
        assert_eq!(t.data_ptr() as u64, storage_ptr(&c) + 2 * 4);
        assert_eq!(
            (t.shape(), t.strides_elems()),
            (&[4i64, 3][..], &[6i64, 1][..])
        );
        match (t.ready(), dev.same_device(&per_thread)) {
            // The per-thread default stream is never named: an event stands for it.
            (Ready::Signal(sig), true) if sig.producer_stream().is_none() => {}
            (Ready::Stream(Stream::Handle(_)), false) => {}
            (other, _) => panic!("unexpected readiness {other:?}"),
        }
        // Back: the same candle tensor.
        assert_eq!(tensorbridge_candle::export(&t)?.id(), c.id());
    }
    Ok(())
}

/// A candle producer kept busy for SPIN_MS, then the import read on another stream: ordered,
/// it reads the final values; the control reads the same memory unordered and sees the race.
#[test]
fn consumers_order_after_candle_busy_producer() -> TestResult {
    let (per_thread, own) = devices()?;
    for dev in [&per_thread, &own] {
        let c = Candle::zeros(N, D::F32, dev)?;
        let CandleDevice::Cuda(cuda) = dev else {
            unreachable!()
        };
        let candle_stream = cuda.cuda_stream();
        let consumer = candle_stream.context().new_stream()?;
        // Loaded once and kept for the test: a module dropped right after a launch is unloaded,
        // and `cuModuleUnload` waits for the kernel, which would block the host for the whole
        // spin (the control would then see no race, and the ordered read prove nothing).
        let k = Kernels::load(candle_stream.context())?;

        // Ordered: the consumer waits for the import's readiness.
        busy_fill(storage_ptr(&c), 42.0).launch(&k, &candle_stream)?;
        // SAFETY: nothing writes `c` in place from the host while `t` lives.
        let t = unsafe { tensorbridge_candle::import(&c) }?;
        let start = Instant::now();
        order(t.ready(), &consumer)?;
        assert!(
            start.elapsed() < Duration::from_millis(SPIN_MS / 2),
            "the host waited"
        );
        let got = read_on(&consumer, t.data_ptr() as u64, N)?;
        assert!(
            got.iter().all(|&v| v == 42.0),
            "ordered read saw {:?}",
            &got[..4]
        );

        // Control: the same producer, read without ordering, sees values before the write.
        busy_fill(storage_ptr(&c), 7.0).launch(&k, &candle_stream)?;
        let stale = read_on(&consumer, t.data_ptr() as u64, N)?;
        assert!(
            stale.iter().any(|&v| v != 7.0),
            "the unordered control did not race: the ordering test proves nothing"
        );
        candle_stream.synchronize()?;
    }
    Ok(())
}

/// Foreign CUDA memory (a cudarc allocation of its own, written by a busy producer on a
/// stream of its own) into candle, zero-copy: candle's kernels see the producer's writes, the
/// memory is the same, and the owner is never released (candle could only free it).
#[test]
fn foreign_memory_enters_candle_after_its_producer() -> TestResult {
    let (_, own) = devices()?;
    let CandleDevice::Cuda(cuda) = &own else {
        unreachable!()
    };
    let ctx = cuda.cuda_stream().context().clone();
    let producer = ctx.new_stream()?;
    let k = Kernels::load(&ctx)?;
    for ordered in [true, false] {
        let buf = producer.alloc_zeros::<f32>(N)?;
        let (ptr, record) = buf.device_ptr(&producer);
        drop(record);
        busy_fill(ptr, 3.0).launch(&k, &producer)?;
        let shape = [N as i64];
        let raw = RawTensor {
            access: Access::ReadWrite,
            ..RawTensor::new(ptr as usize, Device::cuda(0), DType::FLOAT32, &shape)
        };
        let counter = DropCounter::new();
        // SAFETY: the span is `buf`'s, which the owner keeps; device memory.
        let t = unsafe { Tensor::from_descriptor(raw.validate()?, counter.owner_with(buf)) };
        let ready = if ordered {
            Ready::Stream(Stream::Handle(
                StreamHandle::new(producer.cu_stream() as usize).expect("own stream"),
            ))
        } else {
            // The control: deliberately says the data is ready while the producer spins.
            Ready::Now
        };
        // SAFETY: `producer` is a stream of device 0's primary context, alive for the test;
        // the control's readiness is false on purpose (a GPU race, not a host access).
        let t = unsafe { t.with_ready(ready) };
        let c = tensorbridge_candle::export_leaked(&t, &own)?;
        assert_eq!(storage_ptr(&c), ptr);
        let sum = c.sum_all()?.to_scalar::<f32>()?;
        if ordered {
            assert_eq!(sum, 3.0 * N as f32);
        } else {
            assert_ne!(sum, 3.0 * N as f32, "the unordered control did not race");
        }
        producer.synchronize()?;
        drop(c);
        drop(t);
        assert_eq!(counter.drops(), 0, "export_leaked keeps the owner for good");
    }
    // A read-only tensor would become a writable candle tensor: refused on the CUDA device
    // too, and nothing is kept.
    let buf = producer.alloc_zeros::<f32>(N)?;
    let (ptr, record) = buf.device_ptr(&producer);
    drop(record);
    producer.synchronize()?;
    let shape = [N as i64];
    let raw = RawTensor {
        access: Access::ReadOnly,
        ..RawTensor::new(ptr as usize, Device::cuda(0), DType::FLOAT32, &shape)
    };
    let counter = DropCounter::new();
    // SAFETY: the span is `buf`'s, which the owner keeps; device memory, ready (synchronised).
    let t = unsafe { Tensor::from_descriptor(raw.validate()?, counter.owner_with(buf)) };
    let e = tensorbridge_candle::export_leaked(&t, &own).unwrap_err();
    assert!(
        matches!(
            e,
            tensorbridge_candle::Error::NotZeroCopy {
                what: "a read-only tensor",
                ..
            }
        ),
        "{e}"
    );
    drop(t);
    assert_eq!(counter.drops(), 1, "a refused export keeps nothing");
    Ok(())
}
