//! Every cudarc element type: the dtype travels, views check it, and a kernel sees the same
//! bytes through the view.

use anyhow::Result;
use cudarc::driver::{CudaContext, DeviceRepr, PushKernelArg};
use std::sync::Arc;
use tensorbridge_core::DType;
use tensorbridge_cudarc::{self as tbc, CudaElement, Error};

use crate::{Kernels, context, dptr, grid, serial};

/// The bytes of `values` as the device holds them.
fn bytes_of<T: CudaElement>(values: &[T]) -> Vec<u8> {
    // SAFETY: every `CudaElement` here is a primitive without padding bytes, so all
    // `size_of_val(values)` bytes are initialised; the slice is only read.
    unsafe { std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), size_of_val(values)) }
        .to_vec()
}

fn roundtrip<T: CudaElement + DeviceRepr>(
    ctx: &Arc<CudaContext>,
    k: &Kernels,
    values: Vec<T>,
) -> Result<()> {
    let producer = ctx.new_stream()?;
    let consumer = ctx.new_stream()?;
    let slice = producer.clone_htod(&values)?;
    let ptr = dptr(&slice);
    let nbytes = size_of_val(values.as_slice());
    let out = consumer.clone_htod(&vec![0xa5u8; nbytes])?;
    let out_ptr = dptr(&out);

    let t = tbc::import(slice)?;
    assert_eq!(t.dtype(), T::DTYPE);
    assert_eq!(t.nbytes(), nbytes as u64);
    {
        let x = tbc::view::<T>(&t, &consumer)?;
        assert_eq!(x.device_ptr(), ptr);
        let n = nbytes as u64;
        // SAFETY: `copy_bytes(const u8*, u8*, u64)` copies the view's bytes into `out`.
        unsafe {
            consumer
                .launch_builder(&k.copy_bytes)
                .arg(&x)
                .arg(&out_ptr)
                .arg(&n)
                .launch(grid())
        }?;
    }
    assert_eq!(
        consumer.clone_dtoh(&out)?,
        bytes_of(&values),
        "{}: bytes through the view",
        T::DTYPE
    );
    // Any other element type is refused, naming both dtypes.
    let wrong = if T::DTYPE == DType::UINT8 {
        tbc::view::<i8>(&t, &consumer).map(drop)
    } else {
        tbc::view::<u8>(&t, &consumer).map(drop)
    };
    assert!(
        matches!(wrong, Err(Error::Core(tensorbridge_core::Error::DTypeMismatch { found, .. })) if found == T::DTYPE),
        "{}: {wrong:?}",
        T::DTYPE
    );
    println!(
        "{:>8}: {nbytes} bytes, pointer and bytes preserved",
        T::DTYPE
    );
    Ok(())
}

#[test]
fn every_element_type_roundtrips_through_a_view() -> Result<()> {
    let _serial = serial();
    let ctx = context(0)?;
    let k = Kernels::load(&ctx)?;
    const N: usize = 4099; // not a multiple of anything, so tails are exercised
    roundtrip(&ctx, &k, (0..N).map(|i| (i * 37 + 11) as i8).collect())?;
    roundtrip(&ctx, &k, (0..N).map(|i| (i * 4099) as i16).collect())?;
    roundtrip(&ctx, &k, (0..N).map(|i| i as i32 * -77_777 + 3).collect())?;
    roundtrip(&ctx, &k, (0..N).map(|i| (i as i64) << 40 | 5).collect())?;
    roundtrip(&ctx, &k, (0..N).map(|i| (i * 13 + 1) as u8).collect())?;
    roundtrip(&ctx, &k, (0..N).map(|i| (i * 65_521) as u16).collect())?;
    roundtrip(&ctx, &k, (0..N).map(|i| i as u32 * 2_654_435_761).collect())?;
    roundtrip(
        &ctx,
        &k,
        (0..N)
            .map(|i| (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .collect(),
    )?;
    roundtrip(&ctx, &k, (0..N).map(|i| i as f32 * 0.25 - 300.0).collect())?;
    roundtrip(&ctx, &k, (0..N).map(|i| i as f64 * -1e-3 + 1e9).collect())?;
    roundtrip(&ctx, &k, (0..N).map(|i| i % 3 == 0).collect())?;
    roundtrip(
        &ctx,
        &k,
        (0..N)
            .map(|i| half::f16::from_f32(i as f32 * 0.5 - 7.0))
            .collect(),
    )?;
    roundtrip(
        &ctx,
        &k,
        (0..N)
            .map(|i| half::bf16::from_f32(i as f32 * -3.0 + 0.125))
            .collect(),
    )?;
    Ok(())
}
