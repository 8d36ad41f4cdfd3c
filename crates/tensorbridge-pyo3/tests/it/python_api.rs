//! `from_ptr`, `View` and the `AnyTensor` argument type.

use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use tensorbridge_pyo3::AnyTensor;

use crate::{eval, module, with_py};

#[test]
fn release_runs_exactly_once_after_the_last_user() {
    with_py(|py| {
        let calls = eval(py, "[]", &[]).unwrap();
        let buf = eval(py, "(__import__('ctypes').c_float * 4)(1, 2, 3, 4)", &[]).unwrap();
        let view = eval(
            py,
            "tb.from_ptr(__import__('ctypes').addressof(b), (2, 2), 'float32', device='cpu', \
             owner=b, release=lambda: calls.append(1))",
            &[("b", &buf), ("calls", &calls)],
        )
        .unwrap();
        let t = tensorbridge_pyo3::import(&view).unwrap();
        drop(view);
        assert_eq!(
            calls.len().unwrap(),
            0,
            "the extracted tensor is still a user"
        );
        drop(t);
        assert_eq!(calls.len().unwrap(), 1);
    });
}

#[test]
fn release_is_not_called_when_from_ptr_raises() {
    with_py(|py| {
        let calls = eval(py, "[]", &[]).unwrap();
        let err = eval(
            py,
            "tb.from_ptr(0, (4,), 'float32', device='cpu', release=lambda: calls.append(1))",
            &[("calls", &calls)],
        )
        .unwrap_err();
        assert!(err.is_instance_of::<PyValueError>(py), "{err}");
        assert_eq!(calls.len().unwrap(), 0);
    });
}

#[test]
fn repr_and_attributes() {
    with_py(|py| {
        let v = eval(
            py,
            "tb.asview(__import__('array').array('h', [1, 2, 3]))",
            &[],
        )
        .unwrap();
        let r = v.repr().unwrap().to_string();
        assert!(
            r.starts_with("<tensorbridge.View int16[3] strides=(1,) cpu ptr=0x"),
            "{r}"
        );
        assert!(r.ends_with("readwrite>"), "{r}");
        let dev: (i32, i32) = eval(py, "v.__dlpack_device__()", &[("v", &v)])
            .unwrap()
            .extract()
            .unwrap();
        assert_eq!(dev, (1, 0));
        let ai = eval(py, "v.__array_interface__['typestr']", &[("v", &v)]).unwrap();
        assert_eq!(ai.extract::<String>().unwrap(), "<i2");
    });
}

/// The cookbook's recipe: `?` on a core error, no mapping by hand.
#[pyfunction]
fn total(x: AnyTensor) -> Result<f64, tensorbridge_pyo3::Error> {
    Ok(x.0.host_view::<f64>()?.iter().sum())
}

#[test]
fn any_tensor_is_a_function_argument() {
    with_py(|py| {
        let m = module(py);
        m.add_function(wrap_pyfunction!(total, &m).unwrap())
            .unwrap();
        let globals = pyo3::types::PyDict::new(py);
        globals.set_item("m", &m).unwrap();
        let s: f64 = py
            .eval(
                c"m.total(__import__('array').array('d', [1.5, 2.5]))",
                Some(&globals),
                None,
            )
            .unwrap()
            .extract()
            .unwrap();
        assert_eq!(s, 4.0);
        let err = py
            .eval(
                c"m.total(__import__('array').array('f', [1.5, 2.5]))",
                Some(&globals),
                None,
            )
            .unwrap_err();
        assert!(err.is_instance_of::<PyTypeError>(py), "{err}");
        assert!(
            err.to_string()
                .contains("dtype mismatch: expected float64, found float32"),
            "{err}"
        );
    });
}

#[test]
fn cudarc_errors_convert_with_question_mark() {
    // What `stream.clone_htod(..)?` gives in a function returning the crate's `Result`.
    fn failing() -> Result<(), tensorbridge_pyo3::Error> {
        Err(cudarc::driver::DriverError(
            cudarc::driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY,
        ))?
    }
    with_py(|py| {
        let err: PyErr = failing().unwrap_err().into();
        assert!(err.is_instance_of::<PyRuntimeError>(py), "{err}");
        let msg = err.to_string();
        assert!(
            msg.contains("(a cudarc call)") && msg.contains("CUDA_ERROR_OUT_OF_MEMORY"),
            "{msg}"
        );
    });
}

#[test]
fn size_dtype_name_and_dtype_without_numpy() {
    with_py(|py| {
        let v = eval(
            py,
            "tb.asview(__import__('array').array('I', [1, 2, 3, 4, 5, 6]))",
            &[],
        )
        .unwrap();
        let size: u64 = eval(py, "v.size", &[("v", &v)]).unwrap().extract().unwrap();
        assert_eq!(size, 6);
        let name: String = eval(py, "v.dtype_name", &[("v", &v)])
            .unwrap()
            .extract()
            .unwrap();
        assert_eq!(name, "uint32");
        // With NumPy unimportable (no test here reads a uint32 view's dtype with NumPy
        // importable, and the cache is per process), `dtype` is the name.
        let dtype = eval(
            py,
            "(lambda s, saved: (s.__setitem__('numpy', None), v.dtype, \
              s.pop('numpy') if saved is None else s.__setitem__('numpy', saved))[1])\
             (__import__('sys').modules, __import__('sys').modules.get('numpy'))",
            &[("v", &v)],
        )
        .unwrap();
        assert_eq!(dtype.extract::<String>().unwrap(), "uint32");
    });
}
