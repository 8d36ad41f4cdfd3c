//! Shapes and strides both ways, over the testkit's small layouts: strides >= 0 cross
//! unchanged (libtorch has no negative strides: those that reach memory are refused with the
//! first offending dimension, those that reach none cross as their absolute value), and
//! libtorch's own views keep their strides and storage offset.

use proptest::prelude::*;
use tensorbridge_tch::{Error, ExportOptions};
use tensorbridge_testkit::{DropCounter, HostBuffer, small_layout};

use crate::{import, torch_values};

/// Small layouts with strides >= 0 (zero strides, broadcasting, included).
fn torch_layout() -> impl Strategy<Value = (Vec<i64>, Vec<i64>)> {
    small_layout(5).prop_map(|(shape, strides)| {
        let strides = strides.into_iter().map(i64::abs).collect();
        (shape, strides)
    })
}

proptest! {
    #[test]
    fn host_layouts_roundtrip_through_tch((shape, strides) in torch_layout()) {
        let buffer = HostBuffer::new(&shape, &strides, |i| i as f32 + 0.5);
        let expected = buffer.expected_contiguous();
        let counter = DropCounter::new();
        let t = buffer.into_tensor(&counter); // read-only: the buffer is shared
        // SAFETY: nothing writes through the libtorch tensor.
        let options = unsafe { ExportOptions::new().allow_read_only() };
        // SAFETY: no view of the tensor lives while libtorch writes it.
        let torch = unsafe { tensorbridge_tch::export_with(&t, options) }.unwrap();
        prop_assert_eq!(torch.size(), shape.clone());
        prop_assert_eq!(torch.stride(), strides.clone());
        if t.numel() > 0 {
            prop_assert_eq!(torch.data_ptr() as usize, t.data_ptr());
        }
        prop_assert_eq!(torch_values(&torch), expected.clone());

        let back = import(&torch).unwrap();
        prop_assert_eq!(back.shape(), &shape[..]);
        prop_assert_eq!(back.strides_elems(), &strides[..]);
        prop_assert_eq!(back.data_ptr(), torch.data_ptr() as usize);
        prop_assert_eq!(back.host_view::<f32>().unwrap().to_contiguous(), expected);

        drop((t, torch));
        prop_assert_eq!(counter.drops(), 0);
        drop(back);
        prop_assert_eq!(counter.drops(), 1);
    }

    /// A negative stride that moves (size > 1, tensor with elements) is refused with the first
    /// such dimension; one that reaches no memory (size 1, or no elements) is accepted, passed
    /// to libtorch as its absolute value, with the same memory and values.
    #[test]
    fn negative_strides_are_refused_only_where_they_reach_memory((shape, strides) in small_layout(5)) {
        prop_assume!(strides.iter().any(|&s| s < 0));
        let buffer = HostBuffer::new(&shape, &strides, |i| i as f32);
        let expected = buffer.expected_contiguous();
        let counter = DropCounter::new();
        let t = buffer.into_tensor(&counter);
        // SAFETY: nothing writes through the libtorch tensor.
        let options = unsafe { ExportOptions::new().allow_read_only() };
        let empty = shape.contains(&0);
        let moving = (0..shape.len()).find(|&d| strides[d] < 0 && shape[d] > 1 && !empty);
        match moving {
            Some(dim) => {
                // SAFETY: no view of the tensor lives while libtorch writes it.
                let err = unsafe { tensorbridge_tch::export_with(&t, options) }.unwrap_err();
                let refused = matches!(
                    err,
                    Error::NegativeStride { dim: d, stride } if d == dim && stride == strides[dim]
                );
                prop_assert!(refused, "{err}");
                prop_assert_eq!(std::sync::Arc::strong_count(t.owner()), 1, "no clone kept");
            }
            None => {
                // SAFETY: no view of the tensor lives while libtorch writes it.
                let torch = unsafe { tensorbridge_tch::export_with(&t, options) }.unwrap();
                let abs: Vec<i64> = strides.iter().map(|s| s.abs()).collect();
                prop_assert_eq!(torch.size(), shape.clone());
                prop_assert_eq!(torch.stride(), abs);
                if !empty {
                    prop_assert_eq!(torch.data_ptr() as usize, t.data_ptr());
                }
                prop_assert_eq!(torch_values(&torch), expected);
                drop((t, torch));
                prop_assert_eq!(counter.drops(), 1, "released once");
            }
        }
    }

    /// libtorch's own views (narrow, select, transpose, step slices) of a tensor it
    /// allocated, shared as they are: same memory, strides, storage offset and values.
    #[test]
    fn libtorch_views_are_shared_as_they_are(
        dims in proptest::collection::vec(1i64..=5, 1..=4),
        ops in proptest::collection::vec((0u8..4, any::<proptest::sample::Index>(), 0i64..3), 0..4),
    ) {
        let numel: i64 = dims.iter().product();
        let options = (tch::Kind::Float, tch::Device::Cpu);
        let base = tch::Tensor::arange(numel, options).reshape(&dims[..]);
        let mut view = base.shallow_clone();
        for (op, which, k) in ops {
            let ndim = view.dim();
            if ndim == 0 {
                break;
            }
            let d = which.index(ndim) as i64;
            let n = view.size()[d as usize];
            view = match op {
                0 if n > 1 => view.narrow(d, k.min(n - 1), (n - k.min(n - 1)).max(1)),
                1 if ndim > 1 => view.select(d, k.min(n - 1)),
                2 if ndim > 1 => view.transpose(d, (d + 1) % ndim as i64),
                3 => view.slice(d, k.min(n - 1), n, k + 1),
                _ => view,
            };
        }
        let shared = import(&view).unwrap();
        prop_assert_eq!(shared.shape(), &view.size()[..]);
        prop_assert_eq!(shared.strides_elems(), &view.stride()[..]);
        prop_assert_eq!(shared.data_ptr(), view.data_ptr() as usize);
        if view.numel() > 0 {
            // `base` starts its storage (offset 0): the view's storage offset, in bytes, is
            // how far its element 0 lies from there.
            let offset = view.data_ptr() as usize - base.data_ptr() as usize;
            prop_assert_eq!(shared.byte_offset(), offset as u64);
            prop_assert_eq!(shared.data(), base.data_ptr() as usize);
        }
        prop_assert_eq!(shared.host_view::<f32>().unwrap().to_contiguous(), torch_values(&view));
    }
}

/// The cases the property above may rarely draw, spelled out: a size-1 dimension with a
/// negative stride, and a tensor without elements with a negative stride on a dimension of
/// 3, both accepted with the stride's absolute value (they used to be refused).
#[test]
fn negative_strides_that_reach_no_memory_are_accepted() {
    for (shape, strides, abs) in [
        ([1i64, 3], [-7i64, 1], [7i64, 1]),
        ([0, 3], [3, -1], [3, 1]),
    ] {
        let buffer = HostBuffer::new(&shape, &strides, |i| i as f32);
        let expected = buffer.expected_contiguous();
        let counter = DropCounter::new();
        let t = buffer.into_tensor(&counter);
        // SAFETY: nothing writes through the libtorch tensor.
        let options = unsafe { ExportOptions::new().allow_read_only() };
        // SAFETY: no view of the tensor lives while libtorch writes it.
        let torch = unsafe { tensorbridge_tch::export_with(&t, options) }.unwrap();
        assert_eq!(torch.size(), shape);
        assert_eq!(torch.stride(), abs);
        if t.numel() > 0 {
            assert_eq!(torch.data_ptr() as usize, t.data_ptr(), "zero-copy");
        }
        assert_eq!(torch_values(&torch), expected);
        drop((t, torch));
        assert_eq!(counter.drops(), 1);
    }
}
