//! The buffer protocol's C API, declared here because pyo3 only offers it for the limited
//! API of Python 3.11 and later, and this crate builds against the limited API of 3.9
//! (`abi3-py39`: one wheel for every CPython from 3.9).
//!
//! `PyObject_GetBuffer` and `PyBuffer_Release` are exported by every CPython 3 shared library
//! and executable, and `Py_buffer` has had this layout since Python 3.3; Python 3.11 added all
//! three to the stable ABI unchanged, which is what makes declaring them for 3.9 and 3.10 safe
//! on CPython. (PyPy and GraalPy are not supported by this crate.)

use std::ffi::{c_char, c_int, c_void};
use std::mem::{offset_of, size_of};

use pyo3::ffi::{Py_ssize_t, PyObject};

/// `Py_buffer` (CPython's `Include/pybuffer.h`).
#[repr(C)]
#[allow(non_camel_case_types)] // The C name, as pyo3-ffi spells its own copy.
pub(crate) struct Py_buffer {
    pub(crate) buf: *mut c_void,
    /// Owned reference to the exporter, released by `PyBuffer_Release`.
    pub(crate) obj: *mut PyObject,
    pub(crate) len: Py_ssize_t,
    pub(crate) itemsize: Py_ssize_t,
    pub(crate) readonly: c_int,
    pub(crate) ndim: c_int,
    pub(crate) format: *mut c_char,
    pub(crate) shape: *mut Py_ssize_t,
    pub(crate) strides: *mut Py_ssize_t,
    pub(crate) suboffsets: *mut Py_ssize_t,
    pub(crate) internal: *mut c_void,
}

impl Py_buffer {
    /// An empty struct for `PyObject_GetBuffer` to fill.
    pub(crate) const fn zeroed() -> Py_buffer {
        Py_buffer {
            buf: std::ptr::null_mut(),
            obj: std::ptr::null_mut(),
            len: 0,
            itemsize: 0,
            readonly: 0,
            ndim: 0,
            format: std::ptr::null_mut(),
            shape: std::ptr::null_mut(),
            strides: std::ptr::null_mut(),
            suboffsets: std::ptr::null_mut(),
            internal: std::ptr::null_mut(),
        }
    }
}

// The layout CPython 3.3+ uses on 64-bit targets (pyo3-ffi's copy for 3.11+ agrees).
#[cfg(target_pointer_width = "64")]
const _: () = {
    assert!(size_of::<Py_buffer>() == 80);
    assert!(offset_of!(Py_buffer, obj) == 8);
    assert!(offset_of!(Py_buffer, len) == 16);
    assert!(offset_of!(Py_buffer, itemsize) == 24);
    assert!(offset_of!(Py_buffer, readonly) == 32);
    assert!(offset_of!(Py_buffer, ndim) == 36);
    assert!(offset_of!(Py_buffer, format) == 40);
    assert!(offset_of!(Py_buffer, shape) == 48);
    assert!(offset_of!(Py_buffer, strides) == 56);
    assert!(offset_of!(Py_buffer, suboffsets) == 64);
    assert!(offset_of!(Py_buffer, internal) == 72);
};

/// `PyBUF_FORMAT`: ask for the struct-module format string.
pub(crate) const PYBUF_FORMAT: c_int = 0x0004;
/// `PyBUF_SIMPLE`: one C-contiguous run of bytes, no shape or strides.
pub(crate) const PYBUF_SIMPLE: c_int = 0;
/// `PyBUF_WRITABLE`: refuse unless the memory may be written.
pub(crate) const PYBUF_WRITABLE: c_int = 0x0001;
/// `PyBUF_ND | PyBUF_STRIDES`: ask for shape and strides (any layout).
pub(crate) const PYBUF_STRIDES: c_int = 0x0010 | 0x0008;

unsafe extern "C" {
    /// Fills `view`; returns 0, or -1 with an exception set.
    pub(crate) fn PyObject_GetBuffer(
        obj: *mut PyObject,
        view: *mut Py_buffer,
        flags: c_int,
    ) -> c_int;
    /// Releases what `PyObject_GetBuffer` filled in, once.
    pub(crate) fn PyBuffer_Release(view: *mut Py_buffer);
}

pub(crate) mod attach;
pub(crate) mod callback;
pub(crate) mod exit;
