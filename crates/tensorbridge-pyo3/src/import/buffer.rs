//! The buffer protocol (PEP 3118) -> [`Tensor`]: host memory of `bytes`, `bytearray`,
//! `array.array`, `memoryview`, `mmap` and anything else that exports a strided buffer.

use std::sync::Arc;

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use tensorbridge_core::{Access, Layout, RawTensor, Ready};

use crate::convert::dtype_from_format;
use crate::error::{Error, Result};
use crate::ffi::{PYBUF_FORMAT, PYBUF_SIMPLE, PYBUF_STRIDES, PYBUF_WRITABLE};
use crate::floor::access::Provenance;
use crate::import::{Imported, Pin};
use crate::owner::HeldBuffer;

/// Shapes and strides of up to 8 dimensions without a heap allocation.
type Dims = smallvec::SmallVec<[i64; 8]>;

/// Byte strides -> element strides, refused (by [`Layout::strides_from_bytes`], with its
/// error) when they are not whole elements.
fn strides_in_elements(bytes: &[i64], itemsize: usize) -> Result<Dims> {
    let size = i64::try_from(itemsize).unwrap_or(0);
    if size == 0 || bytes.iter().any(|b| b % size != 0) {
        return Ok(Layout::strides_from_bytes(bytes, itemsize)?
            .into_iter()
            .collect());
    }
    Ok(bytes.iter().map(|b| b / size).collect())
}

/// A NumPy `ndarray` (exactly that type) through the buffer protocol: the same memory,
/// dtype, layout and writability its `__dlpack__` exports, without a Python call or a
/// capsule. `Ok(None)` for anything the buffer does not describe exactly as DLPack would:
/// dtypes without a buffer format (datetimes, ml_dtypes' types), byte-swapped data, strides
/// that are not whole elements, and any dimension of size 0 or 1 (NumPy's buffer rewrites
/// the strides of those, its `__dlpack__` does not). The caller then takes the general way,
/// whose answer is the one it always gave.
pub(crate) fn ndarray(obj: &Bound<'_, PyAny>) -> Result<Option<Imported>> {
    match get(obj) {
        // A refusal drops `held`, which releases the buffer.
        Ok(held) if exact(&held) => Ok(imported(held).ok()),
        Ok(_) => Ok(None),
        // Not this way; the general way asks NumPy again and reports its refusal.
        Err(_) => Ok(None),
    }
}

/// Whether a held buffer's layout is the array's own: every dimension longer than 1.
fn exact(held: &HeldBuffer) -> bool {
    let view = held.view();
    let ndim = usize::try_from(view.ndim).unwrap_or(0);
    if ndim == 0 {
        return true;
    }
    if view.shape.is_null() {
        return false;
    }
    // SAFETY: `shape` holds `ndim` values the exporter keeps until release; `held` is alive.
    unsafe { std::slice::from_raw_parts(view.shape, ndim) }
        .iter()
        .all(|&n| n > 1)
}

/// Asks `obj` for a strided buffer with its format (read-only buffers allowed). `Ok(None)`
/// when `obj` does not export buffers at all (a `TypeError` from `PyObject_GetBuffer`).
pub(crate) fn hold(obj: &Bound<'_, PyAny>) -> Result<Option<Arc<HeldBuffer>>> {
    match get(obj) {
        Ok(held) => Ok(Some(held)),
        Err(err) if err.is_instance_of::<PyTypeError>(obj.py()) => Ok(None),
        Err(err) => Err(err.into()),
    }
}

/// `PyObject_GetBuffer(obj, STRIDES | FORMAT)` into a held buffer, or the exporter's error.
fn get(obj: &Bound<'_, PyAny>) -> PyResult<Arc<HeldBuffer>> {
    HeldBuffer::get(obj, PYBUF_STRIDES | PYBUF_FORMAT)
}

/// `obj`'s memory as one C-contiguous run of bytes (`PyBUF_SIMPLE`: `buf` is its first byte
/// and `len` its length, whatever layout the exporter has), writable when the exporter
/// allows it (asked with `PyBUF_WRITABLE` first, as NumPy asks for an array interface's
/// `data`), read-only otherwise. `Ok(None)` when `obj` exports no buffer; an exporter that
/// cannot give its memory as one run (a `memoryview` with steps) refuses with its own
/// `BufferError`.
pub(crate) fn hold_contiguous(obj: &Bound<'_, PyAny>) -> Result<Option<Arc<HeldBuffer>>> {
    // Not writable (or no buffer at all): asked again read-only, which says which.
    if let Ok(held) = HeldBuffer::get(obj, PYBUF_SIMPLE | PYBUF_WRITABLE) {
        return Ok(Some(held));
    }
    match HeldBuffer::get(obj, PYBUF_SIMPLE) {
        Ok(held) => Ok(Some(held)),
        Err(err) if err.is_instance_of::<PyTypeError>(obj.py()) => Ok(None),
        Err(err) => Err(err.into()),
    }
}

/// What a held buffer describes, zero-copy; the held buffer is the pin (\[owner\]: released
/// when the last user is dropped; the exporter keeps the memory until then, and NumPy
/// refuses to resize an array while it is exported). The shape and strides are the
/// exporter's description of its own memory (PEP 3118), trusted as NumPy trusts them.
pub(crate) fn imported(held: Arc<HeldBuffer>) -> Result<Imported> {
    let view = held.view();
    if !view.suboffsets.is_null() {
        return Err(Error::Suboffsets);
    }
    let format = if view.format.is_null() {
        None
    } else {
        // SAFETY: a non-null format is a NUL-terminated string the exporter keeps until
        // the buffer is released (PEP 3118); `held` is alive here.
        let bytes = unsafe { std::ffi::CStr::from_ptr(view.format) };
        Some(bytes.to_str().map_err(|_| Error::BufferFormat {
            format: bytes.to_string_lossy().into_owned(),
        })?)
    };
    let dtype = dtype_from_format(format)?;
    if usize::try_from(view.itemsize).ok() != Some(dtype.itemsize()) {
        return Err(Error::BufferFormat {
            format: format.unwrap_or("B").to_owned(),
        });
    }
    let ndim = usize::try_from(view.ndim).unwrap_or(0);
    let one_dim = [view.len / view.itemsize.max(1)];
    let shape: Dims = if ndim == 0 {
        Dims::new()
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
        let bytes: Dims = unsafe { std::slice::from_raw_parts(view.strides, ndim) }
            .iter()
            .map(|&s| s as i64)
            .collect();
        Some(strides_in_elements(&bytes, dtype.itemsize())?)
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
    // Concurrent writes by Python code while a host view reads are the same hazard as with
    // NumPy views, which the Python caller rules out by not mutating the exporter meanwhile.
    Ok(Imported {
        desc,
        ready: Ready::Now,
        pin: Pin::Owner(held),
        current: None,
        provenance: Provenance::Flagged,
    })
}
