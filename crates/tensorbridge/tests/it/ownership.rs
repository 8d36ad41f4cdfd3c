//! The owner is dropped exactly once, when the last clone of the tensor goes.

use proptest::prelude::*;
use tensorbridge::{DType, RawTensor, Tensor};
use tensorbridge_testkit::DropCounter;

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
