//! CUDA tensors both ways: same device pointer, device and ordinal, strides, and writes
//! through either side seen through the other.

use anyhow::Result;
use tch::{Device as TchDevice, Kind};
use tensorbridge_core::{Device, Layout, Ready, Stream};
use tensorbridge_cudarc as tbc;

use crate::{context, import, serial, torch_values};

#[test]
fn libtorch_cuda_tensors_cross_both_ways() -> Result<()> {
    let _serial = serial();
    let _ctx = context(0)?;
    let x = tch::Tensor::arange(12, (Kind::Float, TchDevice::Cuda(0))).reshape([3, 4]);
    let shared = import(&x.transpose(0, 1))?;
    assert_eq!(shared.device(), Device::cuda(0));
    assert_eq!(shared.data_ptr(), x.data_ptr() as usize);
    assert_eq!(shared.strides_elems(), [1, 4]);
    // libtorch's current stream: its default stream, the legacy one.
    assert!(matches!(
        shared.ready(),
        Ready::Stream(Stream::LegacyDefault)
    ));

    // SAFETY: no view of the tensor lives while libtorch writes it.
    let back = unsafe { tensorbridge_tch::export(&shared) }?;
    assert_eq!(back.device(), TchDevice::Cuda(0));
    assert_eq!(back.data_ptr(), x.data_ptr());
    assert_eq!((back.size(), back.stride()), (vec![4, 3], vec![1, 4]));
    // A write through the second libtorch tensor (another storage over the same memory) is
    // seen through the first.
    let _ = back.narrow(0, 0, 1).fill_(-1.0);
    let values = torch_values(&x);
    assert_eq!(&values[..5], [-1.0, 1.0, 2.0, 3.0, -1.0]);
    Ok(())
}

#[test]
fn cudarc_memory_crosses_into_libtorch_and_back() -> Result<()> {
    let _serial = serial();
    let ctx = context(0)?;
    let stream = ctx.new_stream()?;
    let host: Vec<f32> = (0..1024).map(|i| i as f32).collect();
    let slice = stream.clone_htod(&host)?;
    // Ready::Stream(stream): the upload is pending there.
    let tensor = tbc::import_shaped(slice, &Layout::row_major(&[32, 32])?)?;
    let ptr = tensor.data_ptr();

    // SAFETY: no view of the tensor lives while libtorch writes it.
    let mut torch = unsafe { tensorbridge_tch::export(&tensor) }?; // libtorch's stream waits for `stream` on the GPU
    assert_eq!(torch.data_ptr() as usize, ptr);
    assert_eq!(torch.device(), TchDevice::Cuda(0));
    assert_eq!(torch_values(&torch), host);

    let _ = torch.g_mul_scalar_(2.0); // libtorch writes the cudarc buffer
    let doubled: Vec<f32> = host.iter().map(|v| v * 2.0).collect();
    assert_eq!(torch_values(&torch), doubled);
    drop(torch);
    tch::Cuda::synchronize(0);
    tensorbridge_cuda::reclaim(); // libtorch's clone of the owner, kept until its stream was done
    let slice = tbc::try_into_slice::<f32>(tensor)
        .map_err(|t| anyhow::anyhow!("the slice is still shared: {t:?}"))?;
    assert_eq!(stream.clone_dtoh(&slice)?, doubled);
    Ok(())
}

#[test]
fn ordinals_cross_both_ways() -> Result<()> {
    let _serial = serial();
    let count = tch::Cuda::device_count();
    println!("libtorch sees {count} CUDA device(s)");
    assert!(count >= 1);
    for ordinal in 0..count {
        let ctx = context(ordinal as usize)?;
        let x = tch::Tensor::ones([8], (Kind::Float, TchDevice::Cuda(ordinal as usize)));
        let shared = import(&x)?;
        assert_eq!(shared.device(), Device::cuda(ordinal as u32));
        // SAFETY: no view of the tensor lives while libtorch writes it.
        let back = unsafe { tensorbridge_tch::export(&shared) }?;
        assert_eq!(back.device(), TchDevice::Cuda(ordinal as usize));

        let slice = ctx.new_stream()?.clone_htod(&[3.0f32; 8])?;
        let t = tbc::import(slice)?;
        assert_eq!(t.device(), Device::cuda(ordinal as u32));
        // SAFETY: no view of the tensor lives while libtorch writes it.
        let torch = unsafe { tensorbridge_tch::export(&t) }?;
        assert_eq!(torch.device(), TchDevice::Cuda(ordinal as usize));
        assert_eq!(torch_values(&torch), [3.0; 8]);
    }
    Ok(())
}
