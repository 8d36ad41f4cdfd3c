//! cudarc -> Tensor -> cudarc: pointers stay the same, and writes made on either side are
//! seen on the other.

use anyhow::Result;
use cudarc::driver::{LaunchConfig, PushKernelArg};
use tensorbridge_core::{Access, DType, Descriptor, Device, Layout, Packing, Ready, Tensor};
use tensorbridge_cudarc::{self as tbc, Error};
use tensorbridge_testkit::DropCounter;

use crate::{Kernels, affine, assert_exact, context, dptr, grid, serial};

const N: usize = 1 << 16;

#[test]
fn borrowed_slice_keeps_the_pointer_and_sees_cudarc_writes() -> Result<()> {
    let _serial = serial();
    let ctx = context(0)?;
    let k = Kernels::load(&ctx)?;
    let producer = ctx.new_stream()?;
    let consumer = ctx.new_stream()?;
    let mut slice = producer.clone_htod(&affine(N, 1.5, 3.0))?;
    // A write through cudarc after the upload, on the producer stream.
    let fresh = affine(N, -0.25, 11.0);
    producer.memcpy_htod(&fresh, &mut slice)?;
    let ptr = dptr(&slice);
    let out = consumer.clone_htod(&vec![-1.0f32; N])?;
    let out_ptr = dptr(&out);

    tbc::lend(&slice, |borrowed| -> Result<()> {
        let desc = borrowed.descriptor();
        assert_eq!(desc.data_ptr() as u64, ptr);
        assert_eq!(desc.device(), Device::cuda(0));
        assert_eq!(desc.dtype(), DType::FLOAT32);
        assert_eq!(desc.shape(), &[N as i64]);
        assert!(desc.is_readonly());
        assert_eq!(
            borrowed.ready().producer_stream(),
            Some(tensorbridge_cuda::stream_of(&producer))
        );
        let x = borrowed.view(&consumer)?;
        assert_eq!(x.device_ptr(), ptr);
        assert_eq!(x.stream().cu_stream(), consumer.cu_stream());
        let n = N as u64;
        // SAFETY: `copy_bytes(const u8*, u8*, u64)` copies the view's `4 N` bytes into `out`,
        // on the view's stream.
        unsafe {
            consumer
                .launch_builder(&k.copy_bytes)
                .arg(&x)
                .arg(&out_ptr)
                .arg(&(4 * n))
                .launch(grid())
        }?;
        Ok(())
    })?;
    assert_exact(
        &consumer.clone_dtoh(&out)?,
        &fresh,
        "copy through a borrowed view",
    );
    Ok(())
}

#[test]
fn writes_through_a_mutable_view_reach_the_slice() -> Result<()> {
    let _serial = serial();
    let ctx = context(0)?;
    let k = Kernels::load(&ctx)?;
    let producer = ctx.new_stream()?;
    let consumer = ctx.new_stream()?;
    let mut slice = producer.clone_htod(&affine(N, 0.5, 2.0))?;
    tbc::lend(&mut slice, |borrowed| -> Result<()> {
        assert_eq!(borrowed.descriptor().access(), Access::ReadWrite);
        let mut x = borrowed.view_mut(&consumer)?;
        let n = N as u64;
        // SAFETY: `scale_in_place(float*, u64, float)` over the view's N floats, on its stream.
        unsafe {
            consumer
                .launch_builder(&k.scale_in_place)
                .arg(&mut x)
                .arg(&n)
                .arg(&3.0f32)
                .launch(grid())
        }?;
        // No synchronisation: the end of the scope orders the producer stream (and cudarc's
        // write event) after the consumer's kernel, on the GPU.
        Ok(())
    })?;
    let back = producer.clone_dtoh(&slice)?;
    assert_exact(
        &back,
        &affine(N, 1.5, 6.0),
        "written through a mutable view",
    );

    // A shared borrow gives no mutable view.
    tbc::lend(&slice, |shared| -> Result<()> {
        assert!(matches!(
            shared.view_mut(&consumer),
            Err(Error::Core(tensorbridge_core::Error::ReadOnly))
        ));
        Ok(())
    })?;
    Ok(())
}

#[test]
fn owned_tensor_roundtrips_to_the_same_slice() -> Result<()> {
    let _serial = serial();
    let ctx = context(0)?;
    let k = Kernels::load(&ctx)?;
    let producer = ctx.new_stream()?;
    let consumer = ctx.new_stream()?;
    let slice = producer.clone_htod(&affine(N, 2.0, -5.0))?;
    let ptr = dptr(&slice);

    let t = tbc::import(slice)?;
    assert_eq!(t.data_ptr() as u64, ptr);
    assert_eq!(t.device(), Device::cuda(0));
    assert_eq!(t.access(), Access::ReadWrite);
    assert_eq!(
        t.ready().producer_stream(),
        Some(tensorbridge_cuda::stream_of(&producer))
    );
    {
        // SAFETY: no other view, clone or foreign code touches `t` meanwhile.
        let mut x = unsafe { tbc::view_mut::<f32>(&t, &consumer)? };
        assert_eq!(x.device_ptr(), ptr);
        let n = N as u64;
        // SAFETY: `scale_in_place` over the view's N floats, on its stream.
        unsafe {
            consumer
                .launch_builder(&k.scale_in_place)
                .arg(&mut x)
                .arg(&n)
                .arg(&-1.0f32)
                .launch(grid())
        }?;
    }
    // The consumer wrote: the data is ready on its stream now.
    // SAFETY:
    // - 1: the only write since the upload, `scale_in_place`, was enqueued on `consumer`,
    //   after the view made it wait for the producer;
    // - 2: `consumer`, a stream of device 0's primary context, lives to the end of the test,
    //   after `t` and its clones;
    // - 3: not the per-thread default stream.
    let t = unsafe { t.with_ready(Ready::Stream(tensorbridge_cuda::stream_of(&consumer))) };

    // A wrong element type or a second holder gets the tensor back.
    let t = tbc::try_into_slice::<i32>(t).expect_err("the owner holds f32");
    let clone = t.clone();
    let t = tbc::try_into_slice::<f32>(t).expect_err("a clone is alive");
    drop(clone);
    // The view kept the owner until the consumer's kernel is done.
    consumer.synchronize()?;
    let slice = tbc::try_into_slice::<f32>(t).expect("the last holder");
    assert_eq!(dptr(&slice), ptr);
    assert_exact(
        &producer.clone_dtoh(&slice)?,
        &affine(N, -2.0, 5.0),
        "written through the owned tensor's view",
    );

    // Shapes are checked, and a refused slice comes back.
    let bad = Layout::row_major(&[N as i64 + 1])?;
    let refused = tbc::import_shaped(slice, &bad).expect_err("one element too many");
    assert!(matches!(refused.error(), Error::OutsideSlice { .. }));
    assert_eq!(refused.into_inner().len(), N);
    Ok(())
}

#[test]
fn foreign_tensors_drive_launches_and_outlive_their_kernels() -> Result<()> {
    let _serial = serial();
    let ctx = context(0)?;
    let k = Kernels::load(&ctx)?;
    let producer = ctx.new_stream()?;
    let consumer = ctx.new_stream()?;
    let data = producer.clone_htod(&affine(N, 1.0, 0.5))?;
    let ptr = dptr(&data);
    let out = consumer.clone_htod(&vec![-3.0f32; N])?;
    let out_ptr = dptr(&out);
    producer.synchronize()?;
    consumer.synchronize()?;

    // As PyTorch or CuPy would hand it over: a raw pointer, a producer stream, an owner.
    let counter = DropCounter::new();
    let desc = Descriptor::new(
        ptr as usize,
        Device::cuda(0),
        DType::FLOAT32,
        Packing::Packed,
        Layout::row_major(&[N as i64])?,
        Access::ReadOnly,
    )?;
    // SAFETY: the owner holds the slice, which keeps the N floats allocated on cuda:0.
    let t = unsafe { Tensor::from_descriptor(desc, counter.owner_with(data)) };
    // SAFETY:
    // - 1: the upload on `producer` is the only write (and has even finished);
    // - 2: `producer`, a stream of device 0's primary context, lives to the end of the test,
    //   after `t` (dropped below);
    // - 3: not the per-thread default stream.
    let t = unsafe { t.with_ready(Ready::Stream(tensorbridge_cuda::stream_of(&producer))) };
    // SAFETY: refused before any view exists (the tensor is read-only).
    let refused = unsafe { tbc::view_mut::<f32>(&t, &consumer) };
    assert!(matches!(
        refused,
        Err(Error::Core(tensorbridge_core::Error::ReadOnly))
    ));
    drop(refused);
    {
        let x = tbc::view::<f32>(&t, &consumer)?;
        assert_eq!(x.device_ptr(), ptr);
        let n = N as u64;
        let (scale, offset, spin) = (2.0f32, 1.0f32, 50_000_000u64);
        // SAFETY: `spin_affine(const float*, float*, u64, float, float, u64)` reads the view's
        // N floats and writes `out`'s, on the view's stream.
        unsafe {
            consumer
                .launch_builder(&k.spin_affine)
                .arg(&x)
                .arg(&out_ptr)
                .arg(&n)
                .arg(&scale)
                .arg(&offset)
                .arg(&spin)
                .launch(grid())
        }?;
    }
    // The tensor is gone while the kernel still spins: the owner must wait for it.
    drop(t);
    tensorbridge_cuda::reclaim();
    assert_eq!(
        counter.drops(),
        0,
        "the owner was dropped while a kernel still read its memory"
    );
    consumer.synchronize()?;
    tensorbridge_cuda::reclaim();
    assert_eq!(
        counter.drops(),
        1,
        "the owner was not released once the kernel was done"
    );
    assert_exact(
        &consumer.clone_dtoh(&out)?,
        &affine(N, 2.0, 2.0),
        "read through a foreign view",
    );
    Ok(())
}

#[test]
fn shaped_views_index_with_their_strides() -> Result<()> {
    let _serial = serial();
    let ctx = context(0)?;
    let k = Kernels::load(&ctx)?;
    let stream = ctx.new_stream()?;
    let (rows, cols) = (4usize, 6usize);
    let host = affine(rows * cols, 1.0, 100.0);
    let slice = stream.clone_htod(&host)?;
    let out = stream.clone_htod(&vec![-1.0f32; rows * cols])?;
    let out_ptr = dptr(&out);

    let gather = |view: &tbc::DeviceView<'_, f32>| -> Result<Vec<f32>> {
        let shape = view.shape();
        let strides = view.strides_elems();
        // SAFETY: `gather2d(const float*, i64, i64, i64, i64, float*)` reads the view through
        // its own strides (inside the slice: checked by `with_slice_shaped`) into `out`.
        unsafe {
            stream
                .launch_builder(&k.gather2d)
                .arg(view)
                .arg(&shape[0])
                .arg(&shape[1])
                .arg(&strides[0])
                .arg(&strides[1])
                .arg(&out_ptr)
                .launch(LaunchConfig::for_num_elems((rows * cols) as u32))
        }?;
        let mut v = stream.clone_dtoh(&out)?;
        v.truncate((shape[0] * shape[1]) as usize);
        Ok(v)
    };

    // The transpose: 6 x 4 with strides (1, 6).
    let transposed = Layout::new(&[cols as i64, rows as i64], Some(&[1, cols as i64]), 0)?;
    let got = tbc::lend_shaped(&slice, &transposed, |b| gather(&b.view(&stream)?))?;
    let want: Vec<f32> = (0..cols * rows)
        .map(|i| host[(i % rows) * cols + i / rows])
        .collect();
    assert_exact(&got, &want, "transposed view");

    // Rows reversed: element 0 is the last row, 3 rows in; strides (-6, 1).
    let offset = ((rows - 1) * cols * 4) as u64;
    let reversed = Layout::new(
        &[rows as i64, cols as i64],
        Some(&[-(cols as i64), 1]),
        offset,
    )?;
    let got = tbc::lend_shaped(&slice, &reversed, |b| {
        assert_eq!(b.descriptor().data_ptr() as u64, dptr(&slice) + offset);
        gather(&b.view(&stream)?)
    })?;
    let want: Vec<f32> = (0..rows * cols)
        .map(|i| host[(rows - 1 - i / cols) * cols + i % cols])
        .collect();
    assert_exact(&got, &want, "reversed rows");

    // A cudarc sub-view starts where it starts.
    let tail = slice.slice(cols..);
    tbc::lend(&tail, |b| -> Result<()> {
        assert_eq!(
            b.descriptor().data_ptr() as u64,
            dptr(&slice) + (cols * 4) as u64
        );
        assert_eq!(b.descriptor().shape(), &[((rows - 1) * cols) as i64]);
        Ok(())
    })?;

    // Layouts that reach outside the slice are refused before anything is described.
    let too_big = Layout::row_major(&[rows as i64 + 1, cols as i64])?;
    let refused = tbc::lend_shaped(&slice, &too_big, |_| Ok::<_, Error>(()));
    assert!(matches!(refused, Err(Error::OutsideSlice { len: 24, .. })));
    let no_offset = Layout::new(&[rows as i64, cols as i64], Some(&[-(cols as i64), 1]), 0)?;
    let refused = tbc::lend_shaped(&slice, &no_offset, |_| Ok::<_, Error>(()));
    assert!(matches!(refused, Err(Error::OutsideSlice { lo: -72, .. })));
    Ok(())
}
