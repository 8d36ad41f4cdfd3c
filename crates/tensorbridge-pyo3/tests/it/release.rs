//! Owners and capsule destructors re-entered from foreign code: with the GIL released under a
//! pyo3 frame (what PyTorch's tensor deallocation does around its storage deleter), and
//! while a `PanicException` is in flight. Before the fix the first crashed (SIGSEGV: an
//! error fetched on a null thread state) and the second aborted (a panic resumed inside the
//! capsule destructor); either takes this whole binary down, which is the failure.

use pyo3::ffi;
use pyo3::panic::PanicException;
use pyo3::prelude::*;
use tensorbridge_core::Tensor;
use tensorbridge_testkit::DropCounter;

use crate::{eval, with_py};

/// Runs `f` with the GIL released by raw C API calls, so pyo3's thread-local count still
/// says the thread is attached: the state in which PyTorch's `THPVariable_dealloc` runs the
/// deleters of storages made from DLPack (`gil_scoped_release`).
fn gil_released_behind_pyo3s_back(f: impl FnOnce()) {
    // SAFETY: the thread holds the GIL (inside `with_py`); matched by the restore below.
    let state = unsafe { ffi::PyEval_SaveThread() };
    f();
    // SAFETY: the thread state saved above, on the same thread.
    unsafe { ffi::PyEval_RestoreThread(state) };
}

/// The object's reference count.
fn refcnt(obj: &Bound<'_, PyAny>) -> isize {
    // SAFETY: attached; a live object.
    unsafe { ffi::Py_REFCNT(obj.as_ptr()) }
}

#[test]
fn a_producer_is_released_when_its_owner_drops_with_the_gil_released_under_pyo3() {
    with_py(|py| {
        // An array-interface producer: its tensor's owner holds it (a buffer-protocol
        // producer would be held through its `Py_buffer` instead).
        let producer = eval(
            py,
            "(lambda b: type('P', (), {'b': b, '__array_interface__': {'version': 3, \
             'data': (__import__('ctypes').addressof(b), False), 'shape': (4,), \
             'typestr': '|u1'}})())((__import__('ctypes').c_uint8 * 4)())",
            &[],
        )
        .unwrap();
        let before = refcnt(&producer);
        let t = tensorbridge_pyo3::import(&producer).unwrap();
        assert!(refcnt(&producer) > before, "the tensor holds the producer");
        // The owner's drop takes the GIL itself (and gives it back).
        gil_released_behind_pyo3s_back(move || drop(t));
        assert_eq!(refcnt(&producer), before, "released at once, not deferred");
    });
}

#[test]
fn a_release_callback_runs_once_when_the_gil_was_released_under_pyo3() {
    with_py(|py| {
        let calls = pyo3::types::PyList::empty(py);
        let view = released_into(py, &calls);
        let t = tensorbridge_pyo3::import(&view).unwrap();
        drop(view);
        assert_eq!(calls.len(), 0);
        gil_released_behind_pyo3s_back(move || drop(t));
        assert_eq!(calls.len(), 1, "called once, at once");
    });
}

/// A `from_ptr` view over a ctypes buffer whose `release` appends to `calls`.
fn released_into<'py>(
    py: Python<'py>,
    calls: &Bound<'py, pyo3::types::PyList>,
) -> Bound<'py, PyAny> {
    let buffer = eval(py, "(__import__('ctypes').c_uint8 * 4)()", &[]).unwrap();
    eval(
        py,
        "tb.from_ptr(__import__('ctypes').addressof(b), (4,), 'uint8', device='cpu', \
         owner=b, release=lambda: calls.append(1))",
        &[("b", &buffer), ("calls", calls.as_any())],
    )
    .unwrap()
}

/// A tensor whose owner is counted.
fn counted(counter: &DropCounter) -> Tensor {
    let t = Tensor::from_vec(vec![1.0f32; 4], &[4]).unwrap();
    let desc = t.descriptor().clone();
    // SAFETY: the counter's owner holds `t` (and with it the vector) as its payload.
    unsafe { Tensor::from_descriptor(desc, counter.owner_with(t)) }
}

/// Sets a `PanicException` as the exception in flight (what pyo3 raises for a Rust panic).
fn raise_panic_exception(py: Python<'_>) {
    PanicException::new_err("a panic propagating as a Python exception").restore(py);
}

/// The exception in flight is still a `PanicException`: takes it out raw (pyo3's
/// `PyErr::take` would resume the panic) and says whether it was one.
fn take_panic_exception(py: Python<'_>) -> bool {
    // SAFETY: attached; `PyErr_Occurred` returns a borrowed type or null.
    let occurred = unsafe { ffi::PyErr_Occurred() };
    let is_panic = !occurred.is_null()
        && occurred
            == py
                .get_type::<PanicException>()
                .as_ptr()
                .cast::<ffi::PyObject>();
    // SAFETY: attached.
    unsafe { ffi::PyErr_Clear() };
    is_panic
}

#[test]
fn an_unconsumed_capsule_dies_while_a_panic_exception_is_in_flight() {
    let counter = DropCounter::new();
    with_py(|py| {
        let view = tensorbridge_pyo3::export(py, counted(&counter)).unwrap();
        let capsule = eval(py, "v.__dlpack__(max_version=(1, 3))", &[("v", &view)]).unwrap();
        let legacy = eval(py, "v.__dlpack__()", &[("v", &view)]).unwrap();
        drop(view);
        raise_panic_exception(py);
        drop(capsule);
        drop(legacy);
        assert!(take_panic_exception(py), "the exception in flight is kept");
        assert_eq!(counter.drops(), 1);
    });
}

#[test]
fn a_release_callback_runs_while_a_panic_exception_is_in_flight() {
    with_py(|py| {
        let calls = pyo3::types::PyList::empty(py);
        let view = released_into(py, &calls);
        let capsule = eval(py, "v.__dlpack__(max_version=(1, 3))", &[("v", &view)]).unwrap();
        drop(view);
        raise_panic_exception(py);
        // The capsule's destructor releases the export, whose owner calls `release`: Python
        // code, which must neither see nor clear the exception in flight.
        drop(capsule);
        assert!(take_panic_exception(py), "the exception in flight is kept");
        assert_eq!(calls.len(), 1);
    });
}
