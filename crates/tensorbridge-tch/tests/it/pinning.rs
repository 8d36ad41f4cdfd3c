//! What keeps an imported tch tensor's memory alive, and what cannot (why `tensorbridge_tch::import` is
//! `unsafe`). The owner of an import holds a reference to the storage, so rebinding the
//! source (`set_`, `set_data`, `set_source_tensor_`) releases nothing; growing the storage
//! moves it to new memory whatever holds the storage, which is the caller's promise.

use tch::{Device as TchDevice, Kind};

use tensorbridge_testkit::DropCounter;

use crate::counted_tensor;

/// The source is rebound three ways while the import lives: the memory (a core tensor
/// handed to libtorch, whose release the counter sees) stays alive and readable until the
/// import is dropped. With a shallow clone as owner (the same `TensorImpl` as the source),
/// each rebinding released the storage under the live import.
#[test]
fn rebinding_the_source_releases_nothing_under_an_import() {
    for op in ["set_", "set_data", "set_source_tensor_"] {
        let counter = DropCounter::new();
        let t = counted_tensor(&counter, &[2, 3]);
        // SAFETY: no view of the tensor lives while libtorch writes it.
        let mut torch = unsafe { tensorbridge_tch::export(&t) }.unwrap();
        drop(t);
        // SAFETY: a storage `tensorbridge_tch::export` made, which libtorch refuses to resize.
        let shared = unsafe { tensorbridge_tch::import(&torch) }.unwrap();
        let other = tch::Tensor::zeros([4], (Kind::Float, TchDevice::Cpu));
        match op {
            "set_" => drop(torch.set_()),
            "set_data" => torch.set_data(&other),
            _ => drop(torch.set_source_tensor_(&other)),
        }
        assert_ne!(
            torch.data_ptr() as usize,
            shared.data_ptr(),
            "{op}: rebound"
        );
        drop((torch, other));
        assert_eq!(
            counter.drops(),
            0,
            "{op}: the import still holds the storage"
        );
        assert_eq!(
            shared.host_view::<f32>().unwrap().to_contiguous(),
            [0.0, 1.0, 2.0, 3.0, 4.0, 5.0],
            "{op}: the memory is still there"
        );
        drop(shared);
        assert_eq!(counter.drops(), 1, "{op}: released once, with the import");
    }
}

/// The evidence for the `unsafe`: a reference to the storage (what an import's owner holds;
/// here a tensor of its own over it, which holds one) does not keep the old memory when the
/// source grows the storage.
/// libtorch allocates new memory, moves the storage's data pointer there and frees the old
/// memory; the storage, and every tensor over it, follows the move. An import describes the
/// old address, so holding the storage cannot pin it.
#[test]
fn growing_the_storage_moves_every_tensor_over_it() {
    let mut torch = tch::Tensor::arange(6, (Kind::Float, TchDevice::Cpu));
    let owner_like = torch.detach();
    let before = torch.data_ptr() as usize;
    assert_eq!(owner_like.data_ptr() as usize, before);
    drop(torch.resize_([1 << 16]));
    let after = torch.data_ptr() as usize;
    assert_ne!(after, before, "the storage moved to new memory");
    assert_eq!(
        owner_like.data_ptr() as usize,
        after,
        "the alias followed the storage: nothing holds the old memory"
    );
}

/// Storages `tensorbridge_tch::export` made cannot be resized: for those, the obligation holds by construction.
#[test]
fn storages_export_made_refuse_to_grow() {
    let counter = DropCounter::new();
    // SAFETY: no view of the tensor lives while libtorch writes it.
    let mut torch = unsafe { tensorbridge_tch::export(&counted_tensor(&counter, &[6])) }.unwrap();
    let err = torch.f_resize_([1 << 16]).unwrap_err();
    assert!(err.to_string().contains("not resizable"), "{err}");
    drop(torch);
    assert_eq!(counter.drops(), 1);
}
