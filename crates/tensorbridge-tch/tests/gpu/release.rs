//! The deleter on CUDA: when libtorch frees the storage while its stream still runs work on
//! the memory, the owner is kept until that work is done (then released once), so the
//! memory is never freed under a running kernel.

use anyhow::Result;
use cudarc::driver::DevicePtr;
use tensorbridge_core::{Access, DType, Descriptor, Device, Layout, Packing, Tensor};

use tensorbridge_testkit::DropCounter;

use crate::{Affine, Kernels, context, serial, torch_values};

const N: usize = 1 << 20;
const SPIN_NS: u64 = 60_000_000;

#[test]
fn the_owner_outlives_libtorch_work_enqueued_before_the_storage_was_freed() -> Result<()> {
    let _serial = serial();
    let ctx = context(0)?;
    let k = Kernels::load(&ctx)?;
    let stream = ctx.new_stream()?;
    let legacy = ctx.default_stream(); // libtorch's current stream
    let slice = stream.clone_htod(&vec![1.0f32; N])?;
    stream.synchronize()?;
    let ptr = {
        let (ptr, _record) = slice.device_ptr(&stream);
        ptr
    };
    let counter = DropCounter::new();
    let desc = Descriptor::new(
        ptr as usize,
        Device::cuda(0),
        DType::FLOAT32,
        Packing::Packed,
        Layout::row_major(&[N as i64])?,
        Access::ReadWrite,
    )?;
    // SAFETY: the counted owner holds the slice, which keeps the N floats allocated on
    // cuda:0; the upload has finished (synchronised above), so nothing is pending.
    let tensor = unsafe { Tensor::from_descriptor(desc, counter.owner_with(slice)) };
    // SAFETY: no view of the tensor lives while libtorch writes it.
    let torch = unsafe { tensorbridge_tch::export(&tensor) }?;
    assert_eq!(torch_values(&torch.narrow(0, 0, 4)), [1.0; 4]);
    drop(tensor);

    // Work on libtorch's stream that uses the memory (here a 60 ms in-place kernel), then
    // libtorch frees the storage while it runs.
    Affine {
        src: ptr,
        dst: ptr,
        n: N,
        scale: 2.0,
        offset: 0.0,
        spin_ns: SPIN_NS,
    }
    .launch(&k, &legacy)?;
    drop(torch); // the deleter runs now
    assert_eq!(
        counter.drops(),
        0,
        "released while libtorch's stream still used the memory"
    );
    let pending = tensorbridge_cuda::reclaim();
    assert!(
        pending >= 1 && counter.drops() == 0,
        "{pending} owner(s) pending"
    );
    println!("after the storage was freed: {pending} owner(s) kept for pending work");

    legacy.synchronize()?;
    tensorbridge_cuda::reclaim();
    assert_eq!(counter.drops(), 1, "released once the work was done");
    Ok(())
}
