//! The owner is dropped exactly once, when the last clone of the tensor goes.

use std::sync::Arc;

use proptest::prelude::*;
use tensorbridge_core::{DType, RawTensor, Ready, Tensor};
use tensorbridge_testkit::{DropCounter, FakeSignal};

proptest! {
    #![proptest_config(crate::config())]

    #[test]
    fn owner_dropped_once_after_last_clone(clones in 0usize..8, order in any::<proptest::sample::Index>()) {
        let counter = DropCounter::new();
        let shape = [3i64];
        let desc = RawTensor::host(0x1000, DType::UINT8, &shape).validate().unwrap();
        // SAFETY: never dereferenced; the test only clones and drops.
        let first = unsafe { Tensor::from_descriptor(desc, counter.owner()) };
        let mut all: Vec<Tensor> = (0..clones).map(|_| first.clone()).collect();
        all.insert(order.index(clones + 1), first);
        let readied: Vec<Tensor> = all.drain(..).map(|t| t.into_readonly()).collect();
        let mut readied = readied;
        while readied.len() > 1 {
            readied.pop();
            prop_assert_eq!(counter.drops(), 0);
        }
        drop(readied);
        prop_assert_eq!(counter.drops(), 1);
    }

    /// Clones, plain or written into place, of inline (up to 8 dimensions, copied bitwise)
    /// and spilled layouts equal the original and count the owner: released once, last.
    #[test]
    fn clones_in_place_equal_and_count_the_owner(
        (shape, strides) in tensorbridge_testkit::small_layout(12),
    ) {
        let counter = DropCounter::new();
        let raw = RawTensor {
            strides: Some(&strides),
            ..RawTensor::host(0x1000, DType::FLOAT64, &shape)
        };
        let desc = raw.validate().unwrap();
        // SAFETY: never dereferenced; the test only clones and drops.
        let t = unsafe { Tensor::from_descriptor(desc, counter.owner()) };
        let mut slot = Box::new(std::mem::MaybeUninit::<Tensor>::uninit());
        let placed = t.clone_into_uninit(&mut slot);
        prop_assert_eq!(placed.descriptor(), t.descriptor());
        prop_assert_eq!(placed.shape(), &shape[..]);
        let plain = t.clone();
        prop_assert_eq!(plain.descriptor(), t.descriptor());
        // SAFETY: initialised by `clone_into_uninit`; taken out once, then the box is freed
        // as `MaybeUninit` (nothing dropped twice).
        let placed = unsafe { slot.assume_init_read() };
        drop((t, plain));
        prop_assert_eq!(counter.drops(), 0);
        drop(placed);
        prop_assert_eq!(counter.drops(), 1);
    }
}

/// `clone_into_uninit` copies the readiness bitwise and counts it: a signal (an `Arc`) is
/// shared with the original, not duplicated, and released once, after both are dropped.
#[test]
fn clones_in_place_count_the_ready_signal() {
    let owner = DropCounter::new();
    let signal = DropCounter::new();
    let shape = [4i64];
    let desc = RawTensor::host(0x1000, DType::UINT8, &shape)
        .validate()
        .unwrap();
    let ready = Arc::new(FakeSignal::holding(signal.owner()));
    // SAFETY: never dereferenced.
    let t = unsafe { Tensor::from_descriptor(desc, owner.owner()) };
    // SAFETY: the signal names no stream, and nothing waits on it.
    let t = unsafe { t.with_ready(Ready::Signal(ready.clone())) };
    drop(ready);
    let mut slot = Box::new(std::mem::MaybeUninit::<Tensor>::uninit());
    t.clone_into_uninit(&mut slot);
    // SAFETY: initialised by `clone_into_uninit`; taken out once.
    let placed = unsafe { slot.assume_init_read() };
    let (Ready::Signal(a), Ready::Signal(b)) = (t.ready(), placed.ready()) else {
        panic!("the readiness was not copied: {:?}", placed.ready());
    };
    assert!(Arc::ptr_eq(a, b), "one signal, shared");
    assert_eq!(Arc::strong_count(a), 2);
    assert!(Arc::ptr_eq(t.owner(), placed.owner()));
    drop(t);
    assert_eq!((owner.drops(), signal.drops()), (0, 0));
    drop(placed);
    assert_eq!((owner.drops(), signal.drops()), (1, 1));
}

#[test]
fn owner_survives_into_threads() {
    let counter = DropCounter::new();
    let shape = [2i64];
    let desc = RawTensor::host(0x1000, DType::UINT8, &shape)
        .validate()
        .unwrap();
    // SAFETY: never dereferenced.
    let t = unsafe { Tensor::from_descriptor(desc, counter.owner()) };
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let t = t.clone();
            std::thread::spawn(move || t.numel())
        })
        .collect();
    drop(t);
    for h in handles {
        assert_eq!(h.join().unwrap(), 2);
    }
    assert_eq!(counter.drops(), 1);
}

/// `into_exclusive` succeeds only for the one holder of an owner: any clone of the tensor,
/// of its owner, or a `Weak` that could become one keeps it shared.
#[test]
fn exclusive_only_without_other_holders() {
    let counter = DropCounter::new();
    let t = Tensor::from_vec(vec![1i32, 2, 3], &[3]).unwrap();
    let clone = t.clone();
    let t = t.into_exclusive().expect_err("a clone shares the owner");
    drop(clone);
    let owner = t.owner().clone();
    let t = t.into_exclusive().expect_err("an owner clone shares it");
    drop(owner);
    let weak = Arc::downgrade(t.owner());
    let t = t
        .into_exclusive()
        .expect_err("a weak reference could become a holder");
    drop(weak);
    let mut only = t.into_exclusive().expect("the only holder");
    only.host_view_mut::<i32>().unwrap().set(&[1], 20).unwrap();
    assert_eq!(only.host_view::<i32>().unwrap().to_contiguous(), [1, 20, 3]);
    let t = only.into_tensor();
    assert_eq!(t.host_view::<i32>().unwrap().to_contiguous(), [1, 20, 3]);
    // The owner still goes once.
    let shape = [3i64];
    let desc = RawTensor::host(0x1000, DType::UINT8, &shape)
        .validate()
        .unwrap();
    // SAFETY: never dereferenced; the test only clones, checks and drops.
    let t = unsafe { Tensor::from_descriptor(desc, counter.owner()) };
    let only = t.into_exclusive().unwrap();
    assert_eq!(counter.drops(), 0);
    drop(only);
    assert_eq!(counter.drops(), 1);
}

/// Exclusive does not widen access: a read-only tensor gives no mutable view.
#[test]
fn exclusive_read_only_is_still_read_only() {
    let t = Tensor::from_vec(vec![1u8], &[1]).unwrap().into_readonly();
    let mut only = t.into_exclusive().unwrap();
    assert!(matches!(
        only.host_view_mut::<u8>(),
        Err(tensorbridge_core::Error::ReadOnly)
    ));
}
