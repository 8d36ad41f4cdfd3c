//! candle -> core, over random shapes, permutations and narrowed views (candle's start
//! offset), against candle's own copy of the values; writes both ways; the storage freed once.

use std::alloc::{GlobalAlloc, Layout as AllocLayout, System};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use candle_core::{Device, IndexOp, Tensor as Candle};
use proptest::prelude::*;
use tensorbridge_testkit::all_indices;

/// Counts frees of the block at `WATCHED` (the candle storage's `Vec`).
struct CountingAlloc;
static WATCHED: AtomicUsize = AtomicUsize::new(0);
static FREES: AtomicUsize = AtomicUsize::new(0);
static WATCH: Mutex<()> = Mutex::new(());

// SAFETY: forwards every call to `System` unchanged; the counting touches only atomics.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: AllocLayout) -> *mut u8 {
        // SAFETY: our caller's obligations are `System.alloc`'s.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: AllocLayout) {
        if ptr as usize == WATCHED.load(Ordering::SeqCst) {
            FREES.fetch_add(1, Ordering::SeqCst);
        }
        // SAFETY: our caller's obligations are `System.dealloc`'s.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

/// A random candle tensor: a shape, a permutation of its dimensions and a narrowed
/// dimension (so strides are not C order and the start offset is not 0).
fn candle() -> impl Strategy<Value = Candle> {
    (1usize..=4)
        .prop_flat_map(|rank| {
            (
                proptest::collection::vec(1usize..=4, rank),
                Just((0..rank).collect::<Vec<usize>>()).prop_shuffle(),
                0..rank,
                0usize..4,
            )
        })
        .prop_map(|(shape, perm, axis, cut)| {
            let n: usize = shape.iter().product();
            let base = Candle::arange(0f32, n as f32, &Device::Cpu)
                .unwrap()
                .reshape(shape.clone())
                .unwrap();
            let len = shape[axis];
            let start = cut.min(len - 1);
            base.narrow(axis, start, len - start)
                .unwrap()
                .permute(perm)
                .unwrap()
        })
}

/// candle's own copy of the values, in logical C order.
fn values(c: &Candle) -> Vec<f32> {
    c.flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

proptest! {
    #[test]
    fn imports_match_candle(c in candle()) {
        // SAFETY: nothing writes `c` in place while `t` lives.
        let t = unsafe { tensorbridge_candle::import(&c) }.unwrap();
        let shape: Vec<i64> = c.dims().iter().map(|&n| n as i64).collect();
        let strides: Vec<i64> = c.stride().iter().map(|&s| s as i64).collect();
        prop_assert_eq!(t.shape(), &shape[..]);
        prop_assert_eq!(t.strides_elems(), &strides[..]);
        prop_assert_eq!(t.byte_offset(), 4 * c.layout().start_offset() as u64);
        prop_assert!(!t.is_readonly());
        prop_assert!(t.ready().is_now());
        let view = t.host_view::<f32>().unwrap();
        let want = values(&c);
        for (index, w) in all_indices(&shape).iter().zip(&want) {
            prop_assert_eq!(view.get(index).unwrap(), *w);
        }
        // The same through a lent (locked, read-only) borrow.
        tensorbridge_candle::lend(&c, |r| {
            prop_assert_eq!(r.descriptor(), &t.descriptor().to_readonly());
            prop_assert_eq!(r.host_view::<f32>().unwrap().to_contiguous(), want.clone());
            Ok(())
        })?;
    }
}

#[test]
fn zero_copy_both_ways() {
    let c = Candle::zeros((3, 4), candle_core::DType::F32, &Device::Cpu).unwrap();
    let col = c.i((.., 1)).unwrap(); // a strided view of the same storage
    // SAFETY: candle writes `c` in place below only while no view of `t` is alive.
    let t = unsafe { tensorbridge_candle::import(&col) }.unwrap();
    let base = {
        let (storage, _) = c.storage_and_layout();
        match &*storage {
            candle_core::Storage::Cpu(candle_core::CpuStorage::F32(v)) => v.as_ptr() as usize,
            _ => unreachable!(),
        }
    };
    // Element 0 of the column is element 1 of the storage: the same memory.
    assert_eq!(t.data_ptr(), base + 4);
    // The core writes, candle reads.
    {
        // SAFETY: the only view; candle does not touch the storage meanwhile.
        let mut v = unsafe { t.host_view_mut::<f32>() }.unwrap();
        v.set(&[2], 7.0).unwrap();
    }
    assert_eq!(c.i((2, 1)).unwrap().to_scalar::<f32>().unwrap(), 7.0);
    // candle writes in place, the core reads.
    c.slice_set(
        &Candle::ones((3, 1), candle_core::DType::F32, &Device::Cpu).unwrap(),
        1,
        1,
    )
    .unwrap();
    assert_eq!(
        t.host_view::<f32>().unwrap().to_contiguous(),
        [1.0, 1.0, 1.0]
    );
}

#[test]
fn the_storage_is_freed_once_after_the_last_clone() {
    let _one = WATCH.lock().unwrap();
    let c = Candle::arange(0i64, 1000, &Device::Cpu).unwrap();
    let block = {
        let (storage, _) = c.storage_and_layout();
        match &*storage {
            candle_core::Storage::Cpu(candle_core::CpuStorage::I64(v)) => v.as_ptr() as usize,
            _ => unreachable!(),
        }
    };
    FREES.store(0, Ordering::SeqCst);
    WATCHED.store(block, Ordering::SeqCst);
    // SAFETY: nothing writes `c` in place.
    let t = unsafe { tensorbridge_candle::import(&c.narrow(0, 10, 5).unwrap()) }.unwrap();
    drop(c);
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let t = t.clone();
            std::thread::spawn(move || t.host_view::<i64>().unwrap().get(&[0]).unwrap())
        })
        .collect();
    for th in threads {
        assert_eq!(th.join().unwrap(), 10);
    }
    assert_eq!(
        FREES.load(Ordering::SeqCst),
        0,
        "freed while the tensor lives"
    );
    drop(t);
    assert_eq!(FREES.load(Ordering::SeqCst), 1);
    WATCHED.store(0, Ordering::SeqCst);
}

#[test]
fn every_mapped_dtype_imports_with_its_core_dtype() {
    use candle_core::DType as D;
    for d in [
        D::U8,
        D::U32,
        D::I16,
        D::I32,
        D::I64,
        D::BF16,
        D::F16,
        D::F32,
        D::F64,
    ] {
        let c = Candle::zeros((2, 2), d, &Device::Cpu).unwrap();
        // SAFETY: nothing writes `c` in place.
        let t = unsafe { tensorbridge_candle::import(&c) }.unwrap();
        assert_eq!(
            t.dtype(),
            tensorbridge_candle::dtype_of_candle(d).unwrap(),
            "{d:?}"
        );
        assert_eq!(t.nbytes(), 4 * d.size_in_bytes() as u64);
    }
}
