//! The import order and what each path keeps alive.

use pyo3::exceptions::{PyBufferError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use tensorbridge_core::{DType, Device};

use crate::{eval, with_py};

#[test]
fn buffers_are_shared_not_copied() {
    with_py(|py| {
        let ba = eval(py, "bytearray(b'abcdefgh')", &[]).unwrap();
        let t = tensorbridge_pyo3::import(&ba).unwrap();
        let addr: usize = eval(
            py,
            "__import__('ctypes').addressof((__import__('ctypes').c_char * 8).from_buffer(b))",
            &[("b", &ba)],
        )
        .unwrap()
        .extract()
        .unwrap();
        assert_eq!(t.data_ptr(), addr);
        assert_eq!((t.dtype(), t.shape()), (DType::UINT8, &[8i64][..]));
        assert!(!t.is_readonly());
        let bytes = eval(py, "b'xyz'", &[]).unwrap();
        assert!(tensorbridge_pyo3::import(&bytes).unwrap().is_readonly());
    });
}

#[test]
fn strided_memoryviews_keep_their_layout() {
    with_py(|py| {
        let mv = eval(
            py,
            "memoryview(__import__('array').array('d', range(12))).cast('B').cast('d', (3, 4))",
            &[],
        )
        .unwrap();
        let t = tensorbridge_pyo3::import(&mv).unwrap();
        assert_eq!(t.shape(), &[3, 4]);
        assert_eq!(t.strides_elems(), &[4, 1]);
        assert_eq!(t.host_view::<f64>().unwrap().get(&[2, 3]).unwrap(), 11.0);
    });
}

#[test]
fn the_producer_lives_as_long_as_the_tensor() {
    with_py(|py| {
        let refcnt = |o: &Bound<'_, PyAny>| {
            // SAFETY: a live object, attached.
            unsafe { pyo3::ffi::Py_REFCNT(o.as_ptr()) }
        };
        let obj = eval(py, "bytearray(16)", &[]).unwrap();
        let before = refcnt(&obj);
        let t = tensorbridge_pyo3::import(&obj).unwrap();
        assert!(refcnt(&obj) > before, "the view holds the exporter");
        drop(t);
        assert_eq!(refcnt(&obj), before);
    });
}

#[test]
fn array_interface_pointer_form() {
    with_py(|py| {
        let buf = eval(py, "(__import__('ctypes').c_int32 * 6)(*range(6))", &[]).unwrap();
        let obj = eval(
            py,
            "type('AI', (), {'__array_interface__': {'shape': (2, 3), 'typestr': '<i4', \
             'data': (__import__('ctypes').addressof(b), True), 'strides': None, 'version': 3}, \
             'b': b})()",
            &[("b", &buf)],
        )
        .unwrap();
        let t = tensorbridge_pyo3::import(&obj).unwrap();
        assert_eq!((t.dtype(), t.device()), (DType::INT32, Device::CPU));
        assert!(t.is_readonly());
        assert_eq!(t.host_view::<i32>().unwrap().get(&[1, 0]).unwrap(), 3);
    });
}

#[test]
fn refusals_raise_the_documented_exceptions() {
    with_py(|py| {
        let err = tensorbridge_pyo3::import(&eval(py, "object()", &[]).unwrap()).unwrap_err();
        assert!(err.is_instance_of::<PyTypeError>(py), "{err}");
        assert!(err.to_string().contains("of type object"), "{err}");
        let err = eval(py, "tb.asview(bytearray(4), stream=0)", &[]).unwrap_err();
        assert!(err.is_instance_of::<PyValueError>(py), "{err}");
        let refusing = eval(
            py,
            "type('R', (), {'__dlpack__': lambda s, **k: (_ for _ in ()).throw(BufferError('no')), \
             '__dlpack_device__': lambda s: (1, 0)})()",
            &[],
        )
        .unwrap();
        let err = tensorbridge_pyo3::import(&refusing).unwrap_err();
        assert!(err.is_instance_of::<PyBufferError>(py), "{err}");
        assert_eq!(err.to_string(), "BufferError: no");
    });
}

#[test]
fn legacy_producers_get_a_second_call_without_max_version() {
    with_py(|py| {
        let old = eval(
            py,
            "type('Old', (), {'__dlpack__': lambda s, stream=None: tb.asview(s.b).__dlpack__(), \
             '__dlpack_device__': lambda s: (1, 0), 'b': bytearray(8)})()",
            &[],
        )
        .unwrap();
        let t = tensorbridge_pyo3::import(&old).unwrap();
        assert_eq!(t.shape(), &[8]);
    });
}
