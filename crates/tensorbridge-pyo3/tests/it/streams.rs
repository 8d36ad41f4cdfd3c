//! The one reader of a Python `stream=` argument, on every entry that takes one (`asview`,
//! `from_ptr`'s `producer_stream`, `open`, `kernel_call_on`): `0` is refused the same way
//! everywhere, `-1` means no synchronisation (refused where a stream is needed), other types
//! are a `TypeError` naming the type. Host data, so no GPU is needed: every entry reads its
//! stream before anything that would.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;

use crate::{eval, with_py};

/// Calls `entry` of the module with `stream` as its stream argument, on host data.
fn call<'py>(py: Python<'py>, entry: &str, stream: &str) -> PyResult<Bound<'py, PyAny>> {
    let expr = match entry {
        "asview" => format!("tb.asview(bytearray(8), stream={stream})"),
        "from_ptr" => format!(
            "tb.from_ptr(ba_ptr, (2,), 'float32', device='cpu', owner=ba, producer_stream={stream})"
        ),
        "open" => format!("tb.open(b'not a handle', stream={stream})"),
        "kernel_call_on" => format!("kernel_on(bytearray(8), {stream})"),
        _ => unreachable!(),
    };
    let ba = eval(py, "bytearray(8)", &[])?;
    let ptr = eval(
        py,
        "__import__('ctypes').addressof((__import__('ctypes').c_char * 8).from_buffer(ba))",
        &[("ba", &ba)],
    )?;
    let kernel_on = pyo3::wrap_pyfunction!(kernel_on, py)?.into_any();
    eval(
        py,
        &expr,
        &[("ba", &ba), ("ba_ptr", &ptr), ("kernel_on", &kernel_on)],
    )
}

/// `kernel_call_on` behind a `#[pyfunction]`, as an extension declares it.
#[pyfunction]
fn kernel_on(x: tensorbridge_pyo3::TensorArg<'_, '_>, stream: &Bound<'_, PyAny>) -> PyResult<()> {
    Ok(tensorbridge_pyo3::kernel_call_on(
        &[&x],
        stream,
        |_| Ok(()),
    )?)
}

const ENTRIES: [&str; 4] = ["asview", "from_ptr", "open", "kernel_call_on"];

#[test]
fn zero_is_refused_by_every_entry_with_one_message() {
    with_py(|py| {
        for entry in ENTRIES {
            let err = call(py, entry, "0").unwrap_err();
            assert!(err.is_instance_of::<PyValueError>(py), "{entry}: {err}");
            assert!(
                err.to_string().contains("stream=0 is ambiguous"),
                "{entry}: {err}"
            );
        }
    });
}

#[test]
fn other_types_are_type_errors_naming_the_type() {
    with_py(|py| {
        for entry in ENTRIES {
            for (value, type_name) in [("'1'", "str"), ("True", "bool"), ("1.0", "float")] {
                let err = call(py, entry, value).unwrap_err();
                assert!(err.is_instance_of::<PyTypeError>(py), "{entry}: {err}");
                let msg = err.to_string();
                assert!(
                    msg.contains("a CUDA stream object") && msg.contains(type_name),
                    "{entry} {value}: {msg}"
                );
            }
        }
    });
}

#[test]
fn values_below_minus_one_and_past_64_bits_are_refused() {
    with_py(|py| {
        for entry in ENTRIES {
            for value in ["-2", "2**64"] {
                let err = call(py, entry, value).unwrap_err();
                assert!(err.is_instance_of::<PyValueError>(py), "{entry}: {err}");
                assert!(
                    err.to_string().contains(&format!(
                        "stream {}",
                        if value == "-2" {
                            "-2"
                        } else {
                            "18446744073709551616"
                        }
                    )),
                    "{entry} {value}: {err}"
                );
            }
        }
    });
}

/// `-1` is DLPack's "no synchronisation": nothing to order for `asview` and nothing pending
/// for `from_ptr` (both succeed on host data); `open` and `kernel_call_on` need a stream to
/// work on and say so.
#[test]
fn minus_one_is_no_synchronisation() {
    with_py(|py| {
        for entry in ["asview", "from_ptr"] {
            let view = call(py, entry, "-1").unwrap();
            let shape: Vec<i64> = view.getattr("shape").unwrap().extract().unwrap();
            assert!(!shape.is_empty(), "{entry}");
        }
        for entry in ["open", "kernel_call_on"] {
            let err = call(py, entry, "-1").unwrap_err();
            assert!(err.is_instance_of::<PyValueError>(py), "{entry}: {err}");
            assert!(
                err.to_string()
                    .contains(&format!("{entry} needs a stream to work on")),
                "{entry}: {err}"
            );
        }
    });
}

/// A stream given for host memory is refused by `from_ptr` (the producer's stream) with the
/// value; `asview` ignores it for host data (a consumer's stream orders nothing there).
#[test]
fn a_stream_for_host_memory() {
    with_py(|py| {
        let err = call(py, "from_ptr", "1").unwrap_err();
        assert!(err.is_instance_of::<PyValueError>(py), "{err}");
        assert!(
            err.to_string()
                .contains("a stream (1) was given for memory on cpu"),
            "{err}"
        );
        call(py, "asview", "1").unwrap();
        call(py, "asview", "2").unwrap();
    });
}
