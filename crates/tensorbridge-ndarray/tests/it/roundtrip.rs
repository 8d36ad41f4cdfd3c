//! ndarray arrays and views out to tensors (owned, shared, lent) and back, zero-copy, over
//! random shapes, reversed, stepped and permuted axes; the owner's buffer freed exactly once.

use std::alloc::{GlobalAlloc, Layout as AllocLayout, System};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use ndarray::{ArcArray, Array, ArrayD, Axis, Ix2, IxDyn, Slice, array, s};
use proptest::prelude::*;
use tensorbridge_core::Tensor;
use tensorbridge_testkit::all_indices;

/// Counts how often the block at `WATCHED` is freed: the test allocator below forwards to
/// the system allocator and counts deallocations of that one address.
struct CountingAlloc;
static WATCHED: AtomicUsize = AtomicUsize::new(0);
static FREES: AtomicUsize = AtomicUsize::new(0);
/// One watcher at a time (tests run on several threads).
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

/// A random array: shape, then per axis reversed and/or stepped by 2, then permuted.
fn array() -> impl Strategy<Value = ArrayD<i32>> {
    (0usize..=4)
        .prop_flat_map(|rank| {
            (
                proptest::collection::vec(0usize..=4, rank),
                proptest::collection::vec(0u8..4, rank),
                Just((0..rank).collect::<Vec<usize>>()).prop_shuffle(),
            )
        })
        .prop_map(|(shape, ops, perm)| {
            let n: usize = shape.iter().product();
            let mut a = Array::from_shape_vec(IxDyn(&shape), (0..n as i32).collect()).unwrap();
            for (axis, op) in ops.into_iter().enumerate() {
                if op & 1 == 1 {
                    a.invert_axis(Axis(axis));
                }
                if op & 2 == 2 {
                    a.slice_axis_inplace(Axis(axis), Slice::new(0, None, 2));
                }
            }
            a.permuted_axes(IxDyn(&perm))
        })
}

fn ix(index: &[i64]) -> Vec<usize> {
    index.iter().map(|&i| i as usize).collect()
}

fn same_values(t: &Tensor, a: &ArrayD<i32>) -> Result<(), TestCaseError> {
    let shape: Vec<i64> = a.shape().iter().map(|&n| n as i64).collect();
    prop_assert_eq!(t.shape(), &shape[..]);
    let core = t.host_view::<i32>().unwrap();
    for index in all_indices(&shape) {
        prop_assert_eq!(core.get(&index).unwrap(), a[&ix(&index)[..]]);
    }
    Ok(())
}

proptest! {
    #[test]
    fn owned_arrays_roundtrip(a in array()) {
        let ptr = a.as_ptr() as usize;
        let strides: Vec<i64> = a.strides().iter().map(|&s| s as i64).collect();
        let copy = a.clone();
        let t = tensorbridge_ndarray::import(a).unwrap();
        prop_assert!(!t.is_readonly());
        prop_assert_eq!(t.strides_elems(), &strides[..]);
        if t.numel() > 0 {
            prop_assert_eq!(t.data_ptr(), ptr);
        }
        same_values(&t, &copy)?;
        // And back as a view: the same element 0 and strides.
        {
            let v = tensorbridge_ndarray::view::<i32, IxDyn>(&t).unwrap();
            prop_assert_eq!(&v, &copy.view());
            if t.numel() > 0 {
                prop_assert_eq!(v.strides(), copy.strides());
                prop_assert_eq!(v.as_ptr() as usize, ptr);
            }
        }
        // And the array itself back, when this is the last clone.
        let again = tensorbridge_ndarray::try_into_array::<i32, IxDyn>(t).unwrap();
        prop_assert_eq!(again.as_ptr() as usize, ptr);
        prop_assert_eq!(&again, &copy);
    }

    #[test]
    fn lent_views_roundtrip(a in array()) {
        let ptr = a.as_ptr() as usize;
        tensorbridge_ndarray::lend(&a.view(), |lent| {
            prop_assert!(lent.descriptor().is_readonly());
            if !a.is_empty() {
                prop_assert_eq!(lent.descriptor().data_ptr(), ptr);
            }
            let back = tensorbridge_ndarray::view_ref::<i32, IxDyn>(lent.as_ref()).unwrap();
            if !a.is_empty() {
                prop_assert_eq!(back.strides(), a.strides());
            }
            prop_assert_eq!(&back, &a.view());
            Ok(())
        })?;
    }

    #[test]
    fn shared_arrays_are_read_only_and_zero_copy(a in array()) {
        let shared: ArcArray<i32, IxDyn> = a.into_shared();
        let t = tensorbridge_ndarray::import_shared(&shared).unwrap();
        prop_assert!(t.is_readonly());
        if t.numel() > 0 {
            prop_assert_eq!(t.data_ptr(), shared.as_ptr() as usize);
        }
        same_values(&t, &shared.to_owned())?;
    }
}

#[test]
fn an_imported_array_is_freed_once_after_the_last_clone() {
    let _one = WATCH.lock().unwrap();
    let a = Array::from_shape_vec((64, 3), (0..192).map(|i| i as f64).collect()).unwrap();
    let block = a.as_ptr() as usize;
    FREES.store(0, Ordering::SeqCst);
    WATCHED.store(block, Ordering::SeqCst);
    let t = tensorbridge_ndarray::import(a.slice_move(s![..;-1, ..])).unwrap();
    let clones: Vec<Tensor> = (0..8).map(|_| t.clone()).collect();
    let threads: Vec<_> = clones
        .into_iter()
        .map(|c| std::thread::spawn(move || c.host_view::<f64>().unwrap().get(&[0, 0]).unwrap()))
        .collect();
    for th in threads {
        assert_eq!(th.join().unwrap(), 189.0);
    }
    assert_eq!(FREES.load(Ordering::SeqCst), 0, "freed while a clone lives");
    drop(t);
    assert_eq!(FREES.load(Ordering::SeqCst), 1);
    WATCHED.store(0, Ordering::SeqCst);
}

#[test]
fn a_lent_mutable_array_takes_writes_through_the_tensor() {
    let mut a = array![[1i64, 2, 3], [4, 5, 6]];
    let ptr = a.as_ptr() as usize;
    tensorbridge_ndarray::lend_mut(&mut a.slice_mut(s![.., ..;-2]), |lent| {
        assert!(!lent.descriptor().is_readonly());
        assert_eq!(lent.descriptor().data_ptr(), ptr + 2 * 8);
        // SAFETY: the only view of the lent tensor while it lives.
        let mut v = unsafe { tensorbridge_ndarray::view_mut_ref::<i64, Ix2>(lent.as_ref()) }?;
        v[[1, 0]] = 60;
        v[[0, 1]] = 10;
        Ok::<_, tensorbridge_ndarray::Error>(())
    })
    .unwrap();
    assert_eq!(a, array![[10, 2, 3], [4, 5, 60]]);
}

#[test]
fn try_into_array_gives_the_tensor_back_while_shared_or_of_another_type() {
    let t = tensorbridge_ndarray::import(array![1.0f32, 2.0]).unwrap();
    let keep = t.clone();
    let t = tensorbridge_ndarray::try_into_array::<f32, ndarray::Ix1>(t).unwrap_err();
    drop(keep);
    let t = tensorbridge_ndarray::try_into_array::<f32, Ix2>(t).unwrap_err();
    let t = tensorbridge_ndarray::try_into_array::<i32, ndarray::Ix1>(t).unwrap_err();
    let a = tensorbridge_ndarray::try_into_array::<f32, ndarray::Ix1>(t).unwrap();
    assert_eq!(a, array![1.0, 2.0]);
    let other = Tensor::from_vec(vec![1.0f32], &[1]).unwrap();
    assert!(tensorbridge_ndarray::try_into_array::<f32, ndarray::Ix1>(other).is_err());
}
