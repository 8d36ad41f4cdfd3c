//! The buffer protocol (PEP 3118) -> [`Tensor`]: host memory of `bytes`, `bytearray`,
//! `array.array`, `memoryview`, `mmap` and anything else that exports a strided buffer.

use std::ptr::NonNull;
use std::sync::Arc;

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use tensorbridge::{Access, Layout, RawTensor, Tensor};

use crate::convert::dtype_from_format;
use crate::error::{Error, Result};
use crate::ffi::{PYBUF_FORMAT, PYBUF_STRIDES, Py_buffer, PyObject_GetBuffer};
use crate::owner::HeldBuffer;

/// Asks `obj` for a strided buffer with its format (read-only buffers allowed). `Ok(None)`
/// when `obj` does not export buffers at all (a `TypeError` from `PyObject_GetBuffer`).
pub(crate) fn hold(obj: &Bound<'_, PyAny>) -> Result<Option<HeldBuffer>> {
    let view = Box::into_raw(Box::new(Py_buffer::zeroed()));
    // SAFETY: attached (we hold `obj`); `view` is a live, writable, never-moving struct.
    let rc = unsafe { PyObject_GetBuffer(obj.as_ptr(), view, PYBUF_STRIDES | PYBUF_FORMAT) };
    if rc != 0 {
        // SAFETY: a failed call leaves nothing to release; the box is ours.
        drop(unsafe { Box::from_raw(view) });
        let err = PyErr::fetch(obj.py());
        return if err.is_instance_of::<PyTypeError>(obj.py()) {
            Ok(None)
        } else {
            Err(err.into())
        };
    }
    // SAFETY: from `Box::into_raw`, filled by a successful `PyObject_GetBuffer`, released by
    // nobody else.
    Ok(Some(unsafe {
        HeldBuffer::new(NonNull::new(view).expect("Box::into_raw is never null"))
    }))
}

/// The tensor a held buffer describes, zero-copy; the buffer is released when the last
/// clone of the tensor is dropped.
pub(crate) fn tensor(held: HeldBuffer) -> Result<Tensor> {
    let view = held.view();
    if !view.suboffsets.is_null() {
        return Err(Error::Suboffsets);
    }
    let format = if view.format.is_null() {
        None
    } else {
        // SAFETY: a non-null format is a NUL-terminated string the exporter keeps until
        // the buffer is released (PEP 3118); `held` is alive here.
        Some(
            unsafe { std::ffi::CStr::from_ptr(view.format) }
                .to_string_lossy()
                .into_owned(),
        )
    };
    let dtype = dtype_from_format(format.as_deref())?;
    if usize::try_from(view.itemsize).ok() != Some(dtype.itemsize()) {
        return Err(Error::BufferFormat {
            format: format.unwrap_or_else(|| "B".to_owned()),
        });
    }
    let ndim = usize::try_from(view.ndim).unwrap_or(0);
    let one_dim = [view.len / view.itemsize.max(1)];
    let shape: Vec<i64> = if ndim == 0 {
        Vec::new()
    } else if view.shape.is_null() {
        one_dim.iter().map(|&n| n as i64).collect()
    } else {
        // SAFETY: `shape` holds `ndim` values the exporter keeps until release.
        unsafe { std::slice::from_raw_parts(view.shape, ndim) }
            .iter()
            .map(|&n| n as i64)
            .collect()
    };
    let strides = if ndim == 0 || view.strides.is_null() {
        None
    } else {
        // SAFETY: as for `shape`.
        let bytes: Vec<i64> = unsafe { std::slice::from_raw_parts(view.strides, ndim) }
            .iter()
            .map(|&s| s as i64)
            .collect();
        Some(Layout::strides_from_bytes(&bytes, dtype.itemsize())?)
    };
    let raw = RawTensor {
        strides: strides.as_deref(),
        access: if view.readonly != 0 {
            Access::ReadOnly
        } else {
            Access::ReadWrite
        },
        ..RawTensor::host(view.buf.expose_provenance(), dtype, &shape)
    };
    let desc = raw.validate()?;
    // SAFETY: the exporter keeps the buffer's memory valid (and writable unless read-only)
    // until `PyBuffer_Release`, which `held` calls when the tensor's last clone drops it;
    // the bytes the layout reaches are the ones the exporter described. Concurrent writes
    // by Python code while a host view reads are the same hazard as with NumPy views, which
    // the Python caller rules out by not mutating the exporter meanwhile.
    Ok(unsafe { Tensor::from_descriptor(desc, Arc::new(held)) })
}
