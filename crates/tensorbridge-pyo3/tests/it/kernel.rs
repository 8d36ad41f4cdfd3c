//! Kernel calls and the streams users pass, without a GPU: what is refused, and how.

use pyo3::exceptions::{PyRuntimeError, PyValueError};

use crate::{eval, with_py};

/// `torch.cuda.current_stream().cuda_stream` is 0 for the default stream; `import_on_raw`
/// takes it (as the legacy default stream) where DLPack's convention calls it ambiguous.
/// Before the fix this import failed with "stream 0 is not valid for DLPack (CUDA)".
#[test]
fn import_on_raw_takes_stream_zero() {
    with_py(|py| {
        let ba = eval(py, "bytearray(8)", &[]).unwrap();
        // SAFETY: 0 is read as the legacy default stream, always live; host data uses none.
        let t = unsafe { tensorbridge_pyo3::import_on_raw(&ba, Some(0)) }.unwrap();
        assert_eq!(t.shape(), &[8]);
        // Other invalid values are still refused.
        // SAFETY: refused before any stream is used.
        let err = unsafe { tensorbridge_pyo3::import_on_raw(&ba, Some(-2)) }.unwrap_err();
        assert!(err.is_instance_of::<PyValueError>(py), "{err}");
    });
}

/// Host memory is refused before any stream is looked for, with the CUDA layer's message.
#[test]
fn kernel_calls_refuse_host_memory() {
    with_py(|py| {
        let a = eval(py, "bytearray(8)", &[]).unwrap();
        let b = eval(py, "bytearray(8)", &[]).unwrap();
        let a = tensorbridge_pyo3::TensorArg::new(a.as_borrowed()).unwrap();
        let b = tensorbridge_pyo3::TensorArg::new(b.as_borrowed()).unwrap();
        let mut ran = false;
        let err: pyo3::PyErr = tensorbridge_pyo3::kernel_call(&[&a, &b], |_| {
            ran = true;
            Ok(())
        })
        .unwrap_err()
        .into();
        assert!(!ran);
        assert!(err.is_instance_of::<PyValueError>(py), "{err}");
        assert!(
            err.to_string()
                .contains("memory on cpu cannot be passed to a CUDA kernel"),
            "{err}"
        );
    });
}

/// Errors of every layer convert with `?` inside the closure and come out as `PyErr`s of
/// the documented kinds; a cudarc `DriverError` is a `RuntimeError`.
#[test]
fn errors_convert_with_question_mark() {
    fn core_layer() -> tensorbridge_pyo3::Result<()> {
        let core: Result<(), tensorbridge_core::Error> = Err(tensorbridge_core::Error::ReadOnly);
        core?;
        Ok(())
    }
    fn layers() -> tensorbridge_pyo3::Result<()> {
        let driver: Result<(), cudarc::driver::DriverError> = Err(cudarc::driver::DriverError(
            cudarc::driver::sys::CUresult::CUDA_ERROR_LAUNCH_FAILED,
        ));
        driver?;
        Ok(())
    }
    with_py(|py| {
        let err: pyo3::PyErr = core_layer().unwrap_err().into();
        assert!(
            err.is_instance_of::<pyo3::exceptions::PyBufferError>(py),
            "{err}"
        );
        let err: pyo3::PyErr = layers().unwrap_err().into();
        assert!(err.is_instance_of::<PyRuntimeError>(py), "{err}");
        assert!(
            err.to_string().contains("CUDA_ERROR_LAUNCH_FAILED"),
            "{err}"
        );
        let nvrtc: pyo3::PyErr =
            tensorbridge_pyo3::Error::from(tensorbridge_cudarc::Error::NoNvrtc).into();
        assert!(nvrtc.is_instance_of::<PyRuntimeError>(py), "{nvrtc}");
        let alias: pyo3::PyErr = tensorbridge_pyo3::Error::from(tensorbridge_cudarc::Error::Core(
            tensorbridge_core::Error::SelfOverlap {
                dim: 0,
                size: 2,
                stride: 0,
                inner: 0,
            },
        ))
        .into();
        assert!(alias.is_instance_of::<PyValueError>(py), "{alias}");
    });
}
