//! The owner handed to libtorch is released exactly once, when libtorch frees the storage:
//! after every view, shallow clone and conversion made meanwhile, on whichever thread drops
//! the last one; tch tensors shared the other way stay alive as long as the core tensor.

use std::sync::Arc;

use tch::Kind;
use tensorbridge_core::{Access, DType, Device};
use tensorbridge_tch::Error;
use tensorbridge_testkit::DropCounter;

use crate::{claimed, counted_tensor, import, torch_values};

#[test]
fn released_once_after_every_libtorch_view_and_clone() {
    let counter = DropCounter::new();
    let t = counted_tensor(&counter, &[4, 6]);
    // SAFETY: no view of the tensor lives while libtorch writes it.
    let torch = unsafe { tensorbridge_tch::export(&t) }.unwrap();
    let clone = t.clone();
    drop(t);
    drop(clone);
    assert_eq!(counter.drops(), 0, "libtorch holds a clone of the owner");

    let views = vec![
        torch.narrow(1, 2, 3),
        torch.transpose(0, 1),
        torch.select(0, 2),
        torch.slice(1, 1, 6, 2),
        torch.reshape([24]),
        torch.view([2, 12]),
        torch.shallow_clone(),
        torch.unsqueeze(0).expand([3, 4, 6], false),
    ];
    drop(torch);
    for (i, view) in views.into_iter().enumerate().rev() {
        assert_eq!(counter.drops(), 0, "view {i} still holds the storage");
        drop(view);
    }
    assert_eq!(counter.drops(), 1, "released once, with the last view");
}

#[test]
fn each_conversion_holds_its_own_clone() {
    let counter = DropCounter::new();
    let t = counted_tensor(&counter, &[3]);
    // SAFETY: no view of the tensor lives while libtorch writes it.
    let a = unsafe { tensorbridge_tch::export(&t) }.unwrap();
    // SAFETY: no view of the tensor lives while libtorch writes it.
    let b = unsafe { tensorbridge_tch::export(&t) }.unwrap();
    assert_eq!(Arc::strong_count(t.owner()), 3);
    drop((t, a));
    assert_eq!(counter.drops(), 0);
    drop(b);
    assert_eq!(counter.drops(), 1);
}

#[test]
fn released_on_the_thread_that_drops_the_last_view() {
    let counter = DropCounter::new();
    let t = counted_tensor(&counter, &[2, 2]);
    // SAFETY: no view of the tensor lives while libtorch writes it.
    let torch = unsafe { tensorbridge_tch::export(&t) }.unwrap();
    drop(t);
    let view = torch.transpose(0, 1);
    drop(torch);
    // tch tensors are `Send`: the storage is freed, and the deleter runs, over there.
    let values = std::thread::spawn(move || {
        let values = torch_values(&view);
        drop(view);
        values
    })
    .join()
    .unwrap();
    assert_eq!(values, [0.0, 2.0, 1.0, 3.0]);
    assert_eq!(counter.drops(), 1);
}

#[test]
fn round_trips_release_the_original_owner_once() {
    let counter = DropCounter::new();
    let t = counted_tensor(&counter, &[2, 3]);
    // SAFETY: no view of the tensor lives while libtorch writes it.
    let torch = unsafe { tensorbridge_tch::export(&t) }.unwrap();
    drop(t);
    let back = import(&torch.narrow(0, 1, 1)).unwrap(); // owned by a storage reference
    drop(torch);
    assert_eq!(counter.drops(), 0);
    // SAFETY: no view of the tensor lives while libtorch writes it.
    let again = unsafe { tensorbridge_tch::export(&back) }.unwrap(); // a second storage over the same memory
    drop(back);
    assert_eq!(counter.drops(), 0);
    assert_eq!(torch_values(&again), [3.0, 4.0, 5.0]);
    drop(again);
    assert_eq!(counter.drops(), 1);
}

#[test]
fn import_keeps_libtorch_memory_alive() {
    let torch = tch::Tensor::arange(6, (Kind::Float, tch::Device::Cpu)).reshape([2, 3]);
    let shared = import(&torch.transpose(0, 1)).unwrap();
    drop(torch); // the storage reference in the owner still holds the storage
    assert_eq!(
        shared.host_view::<f32>().unwrap().to_contiguous(),
        [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]
    );
    let clones: Vec<_> = (0..4).map(|_| shared.clone()).collect();
    drop(shared);
    assert!(
        clones
            .iter()
            .all(|c| c.host_view::<f32>().unwrap().get(&[2, 1]).unwrap() == 5.0)
    );
}

#[test]
fn refusals_and_failures_keep_no_clone() {
    let t = claimed(Device::CPU, DType::FLOAT32, &[4], Access::ReadOnly);
    assert!(matches!(
        // SAFETY: no view of the tensor lives while libtorch writes it.
        unsafe { tensorbridge_tch::export(&t) },
        Err(Error::ReadOnly)
    ));
    assert_eq!(Arc::strong_count(t.owner()), 1);

    // A failure inside libtorch: without a GPU it has no current CUDA stream to report.
    // (The unit tests cover failures after the owner reached the shim.)
    if !tch::Cuda::is_available() {
        let t = claimed(Device::cuda(0), DType::FLOAT32, &[4], Access::ReadWrite);
        // SAFETY: no view of the tensor lives while libtorch writes it.
        let err = unsafe { tensorbridge_tch::export(&t) }.unwrap_err();
        assert!(matches!(err, Error::Torch { .. }), "{err}");
        assert_eq!(Arc::strong_count(t.owner()), 1);
    }
}
