//! DLPack capsules: consumed exactly once, released exactly once on every path.

use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;
use tensorbridge_core::Tensor;
use tensorbridge_testkit::DropCounter;

use crate::{eval, with_py};

fn counted(counter: &DropCounter) -> Tensor {
    let data: Vec<f32> = (0..6).map(|i| i as f32).collect();
    let t = Tensor::from_vec(data, &[2, 3]).unwrap();
    let desc = t.descriptor().clone();
    // SAFETY: the counter's owner holds `t` (and with it the vector) as its payload.
    unsafe { Tensor::from_descriptor(desc, counter.owner_with(t)) }
}

fn capsule_name(c: &Bound<'_, PyAny>) -> String {
    c.cast::<PyCapsule>()
        .unwrap()
        .name()
        .unwrap()
        .map(|n| {
            // SAFETY: the capsule is alive and not renamed while the name is read.
            unsafe { n.as_cstr() }.to_string_lossy().into_owned()
        })
        .unwrap_or_default()
}

#[test]
fn unconsumed_capsule_releases_its_tensor_once() {
    let counter = DropCounter::new();
    with_py(|py| {
        let view = tensorbridge_pyo3::export(py, counted(&counter)).unwrap();
        let capsule = eval(py, "v.__dlpack__(max_version=(1, 3))", &[("v", &view)]).unwrap();
        assert_eq!(capsule_name(&capsule), "dltensor_versioned");
        drop(view);
        assert_eq!(counter.drops(), 0, "the capsule keeps the memory alive");
        drop(capsule);
        assert_eq!(counter.drops(), 1);
    });
}

#[test]
fn unconsumed_legacy_capsule_releases_its_tensor_once() {
    let counter = DropCounter::new();
    with_py(|py| {
        let view = tensorbridge_pyo3::export(py, counted(&counter)).unwrap();
        let capsule = eval(py, "v.__dlpack__()", &[("v", &view)]).unwrap();
        assert_eq!(capsule_name(&capsule), "dltensor");
        drop(view);
        drop(capsule);
        assert_eq!(counter.drops(), 1);
    });
}

#[test]
fn consumed_capsule_is_released_by_the_consumer_only() {
    let counter = DropCounter::new();
    with_py(|py| {
        let view = tensorbridge_pyo3::export(py, counted(&counter)).unwrap();
        let capsule = eval(py, "v.__dlpack__(max_version=(1, 0))", &[("v", &view)]).unwrap();
        drop(view);
        let t = tensorbridge_pyo3::import(&capsule).unwrap();
        assert_eq!(capsule_name(&capsule), "used_dltensor_versioned");
        assert_eq!(t.host_view::<f32>().unwrap().get(&[1, 2]).unwrap(), 5.0);
        drop(capsule);
        assert_eq!(
            counter.drops(),
            0,
            "a consumed capsule must not release the tensor"
        );
        drop(t);
        assert_eq!(counter.drops(), 1);
    });
}

#[test]
fn a_used_capsule_is_a_buffer_error() {
    let counter = DropCounter::new();
    with_py(|py| {
        let view = tensorbridge_pyo3::export(py, counted(&counter)).unwrap();
        let capsule = eval(py, "v.__dlpack__(max_version=(1, 0))", &[("v", &view)]).unwrap();
        let first = tensorbridge_pyo3::import(&capsule).unwrap();
        let err = tensorbridge_pyo3::import(&capsule).unwrap_err();
        assert!(err.is_instance_of::<PyBufferError>(py), "{err}");
        assert!(err.to_string().contains("already consumed"), "{err}");
        drop((first, capsule, view));
        assert_eq!(counter.drops(), 1);
    });
}

#[test]
fn read_only_views_refuse_legacy_capsules_but_not_versioned_ones() {
    let counter = DropCounter::new();
    with_py(|py| {
        let view = tensorbridge_pyo3::export(py, counted(&counter).into_readonly()).unwrap();
        let err = eval(py, "v.__dlpack__()", &[("v", &view)]).unwrap_err();
        assert!(err.is_instance_of::<PyBufferError>(py), "{err}");
        // Its traceback holds the frame, and the frame the view.
        drop(err);
        let capsule = eval(py, "v.__dlpack__(max_version=(1, 0))", &[("v", &view)]).unwrap();
        let back = tensorbridge_pyo3::import(&capsule).unwrap();
        assert!(back.is_readonly());
        drop((back, capsule, view));
        assert_eq!(counter.drops(), 1);
    });
}

#[test]
fn copies_are_compact_independent_and_flagged() {
    let counter = DropCounter::new();
    with_py(|py| {
        // A transposed view: the host copy comes back compact, in C order.
        let t = counted(&counter);
        let strides = [1i64, 3];
        let layout = tensorbridge_core::Layout::new(&[3, 2], Some(&strides), 0).unwrap();
        let desc = tensorbridge_core::Descriptor::new(
            t.data_ptr(),
            t.device(),
            t.dtype(),
            t.packing(),
            layout,
            tensorbridge_core::Access::ReadWrite,
        )
        .unwrap();
        // SAFETY: the same memory and owner as `t`, a layout inside its span.
        let transposed = unsafe { Tensor::from_descriptor(desc, t.owner().clone()) };
        drop(t);
        let view = tensorbridge_pyo3::export(py, transposed).unwrap();
        let capsule = eval(
            py,
            "v.__dlpack__(max_version=(1, 3), copy=True)",
            &[("v", &view)],
        )
        .unwrap();
        let copy = tensorbridge_pyo3::import(&capsule).unwrap();
        assert!(copy.layout().is_c_contiguous());
        assert_eq!(
            copy.host_view::<f32>().unwrap().to_contiguous(),
            [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]
        );
        drop(view);
        assert_eq!(counter.drops(), 1, "the copy does not hold the source");
        drop((copy, capsule));
    });
}
