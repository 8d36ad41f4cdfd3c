//! Device ordinals: tensors carry their slice's device, views refuse other devices' streams.

use anyhow::Result;
use cudarc::driver::CudaContext;
use tensorbridge_core::{Device, DeviceType, Ready, Stream};
use tensorbridge_cudarc::{self as tbc, Error};

use crate::{affine, context, dptr, serial};

#[test]
fn tensors_carry_their_device_and_views_refuse_other_devices() -> Result<()> {
    let _serial = serial();
    context(0)?;
    let count = CudaContext::device_count()? as usize;
    println!("{count} CUDA device(s)");
    let mut tensors = Vec::new();
    for ordinal in 0..count {
        let ctx = context(ordinal)?;
        let stream = ctx.new_stream()?;
        let slice = stream.clone_htod(&affine(1024, 1.0, ordinal as f32))?;
        let ptr = dptr(&slice);
        let info = tensorbridge_cuda::inspect(ptr as usize)?;
        assert_eq!(
            info.ordinal,
            Some(ordinal as u32),
            "inspect on device {ordinal}"
        );
        let t = tbc::import(slice)?;
        assert_eq!(t.device(), Device::cuda(ordinal as u32));
        assert_eq!(
            tensorbridge_cuda::check_span(t.descriptor())?.map(|i| i.base <= ptr as usize),
            Some(true)
        );
        // The tensor's own device takes it.
        drop(tbc::view::<f32>(&t, &stream)?);
        tensors.push((t, stream));
    }
    if count >= 2 {
        let (t0, _) = &tensors[0];
        let (_, s1) = &tensors[1];
        assert!(matches!(
            tbc::view::<f32>(t0, s1),
            Err(Error::Cuda(tensorbridge_cuda::Error::DeviceMismatch { tensor, stream: 1 })) if tensor == Device::cuda(0)
        ));
        // A hand-off across devices: device 1's stream waits for device 0's producer. The
        // signal recorded on device 1's stream names no stream: a tensor's readiness names
        // streams of its own device only.
        let handed = tensorbridge_cuda::handoff(t0, s1)?;
        assert!(matches!(handed.ready(), Ready::Signal(_)));
        assert_eq!(handed.ready().producer_stream(), None);
        println!("cross-device view refused, cross-device hand-off enqueued");
    } else {
        println!("one device: the cross-device refusal needs two (run on a 2-GPU machine)");
    }
    // Host memory never becomes a kernel argument.
    let (_, s0) = &tensors[0];
    let host = tensorbridge_core::Tensor::from_vec(vec![1.0f32; 4], &[4])?;
    assert!(matches!(
        tbc::view::<f32>(&host, s0),
        Err(Error::Cuda(tensorbridge_cuda::Error::NotCudaMemory { device })) if device.kind == DeviceType::Cpu
    ));
    for (t, s) in &tensors {
        s.synchronize()?;
        let _ = t.ready().clone();
    }
    drop(tensors);
    tensorbridge_cuda::reclaim();
    Ok(())
}

#[test]
fn default_streams_map_to_the_core_sentinels() -> Result<()> {
    let _serial = serial();
    let ctx = context(0)?;
    assert_eq!(
        tensorbridge_cuda::stream_of(&ctx.default_stream()),
        Stream::LegacyDefault
    );
    assert_eq!(
        tensorbridge_cuda::stream_of(&ctx.per_thread_stream()),
        Stream::PerThreadDefault
    );
    let s = ctx.new_stream()?;
    assert!(
        matches!(tensorbridge_cuda::stream_of(&s), Stream::Handle(h) if h.get() == s.cu_stream() as usize)
    );
    assert_eq!(
        tensorbridge_cuda::raw_stream(tensorbridge_cuda::stream_of(&s)),
        s.cu_stream()
    );
    let primary = tensorbridge_cuda::primary_context(0)?;
    assert_eq!(primary.cu_ctx(), ctx.cu_ctx());
    // A slice on a stream of the primary context carries that stream, not an event.
    let slice = s.clone_htod(&[1u8, 2, 3])?;
    tbc::lend(&slice, |b| -> Result<()> {
        assert!(matches!(b.ready(), Ready::Stream(st) if *st == tensorbridge_cuda::stream_of(&s)));
        Ok(())
    })?;
    // On the per-thread default stream (a different stream on every thread), an event, which
    // names no stream: `0x2` would mean another stream on the thread that reads it.
    let per_thread = ctx.per_thread_stream();
    let slice = per_thread.clone_htod(&[1u8, 2, 3])?;
    tbc::lend(&slice, |b| -> Result<()> {
        assert!(matches!(b.ready(), Ready::Signal(_)));
        assert_eq!(b.ready().producer_stream(), None);
        Ok(())
    })?;
    per_thread.synchronize()?;
    Ok(())
}
