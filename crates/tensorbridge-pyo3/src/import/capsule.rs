//! DLPack capsules: the Python protocol's wrapper around a managed tensor.
//!
//! | struct | fresh name | after consumption |
//! |---|---|---|
//! | `DLManagedTensorVersioned` | `dltensor_versioned` | `used_dltensor_versioned` |
//! | `DLManagedTensor` (legacy) | `dltensor` | `used_dltensor` |
//!
//! A capsule is consumed exactly once: the consumer takes the pointer and renames the capsule
//! at once, before anything can fail, so the capsule's destructor, which releases the managed
//! tensor only while the capsule still has its fresh name, becomes a no-op. A capsule nobody
//! consumed releases its tensor when Python destroys it.
//!
//! Consumption is one critical section on the capsule (free-threaded builds run consumers in
//! parallel; exactly one wins), and destructors keep the exception in flight with raw
//! `PyErr_Fetch`/`PyErr_Restore`, so a `PanicException` propagating past a dying capsule is
//! never resumed as a Rust panic inside the destructor (see `attach.rs`).

use std::ffi::{CStr, c_void};
use std::ptr::NonNull;

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;
use tensorbridge_dlpack::dlpark::{legacy, versioned};
use tensorbridge_dlpack::ffi::{DLManagedTensor, DLManagedTensorVersioned};

use crate::error::{Error, Result};

pub(crate) const DLTENSOR: &CStr = c"dltensor";
pub(crate) const USED_DLTENSOR: &CStr = c"used_dltensor";
pub(crate) const DLTENSOR_VERSIONED: &CStr = c"dltensor_versioned";
pub(crate) const USED_DLTENSOR_VERSIONED: &CStr = c"used_dltensor_versioned";

/// A managed tensor taken out of a capsule: ours to import or release.
pub(crate) enum Consumed {
    Versioned(NonNull<DLManagedTensorVersioned>),
    Legacy(NonNull<DLManagedTensor>),
}

/// The capsule's name, `None` when it has none.
fn name_of(capsule: &Bound<'_, PyCapsule>) -> Result<Option<String>> {
    // SAFETY: a live capsule (borrowed), attached to the interpreter; the name pointer is
    // the capsule's own NUL-terminated string (or null), read before anything can rename it.
    let ptr = unsafe { ffi::PyCapsule_GetName(capsule.as_ptr()) };
    if ptr.is_null() {
        if let Some(err) = PyErr::take(capsule.py()) {
            return Err(err.into());
        }
        return Ok(None);
    }
    // SAFETY: non-null, NUL-terminated (the capsule API's contract), alive while the capsule
    // is and not renamed meanwhile (we hold the GIL).
    Ok(Some(
        unsafe { CStr::from_ptr(ptr) }
            .to_string_lossy()
            .into_owned(),
    ))
}

/// Whether `obj` is a capsule with one of DLPack's four names.
pub(crate) fn is_dlpack_capsule(capsule: &Bound<'_, PyCapsule>) -> bool {
    matches!(
        name_of(capsule).ok().flatten().as_deref(),
        Some("dltensor" | "dltensor_versioned" | "used_dltensor" | "used_dltensor_versioned")
    )
}

/// Takes the managed tensor out of a DLPack capsule and renames the capsule `used_*`.
///
/// Fails, leaving the capsule as it was, for a used capsule ([`Error::UsedCapsule`]), a
/// capsule of another kind ([`Error::CapsuleName`]) or a null pointer.
///
/// Atomic per capsule: reading the name, taking the pointer and renaming happen in one
/// critical section on the capsule, so of several threads consuming one capsule at once on
/// a free-threaded build exactly one gets the tensor and the others
/// [`Error::UsedCapsule`] (on GIL builds the critical section is a no-op: the GIL already
/// serialises the three calls, none of which releases it).
pub(crate) fn consume(capsule: &Bound<'_, PyCapsule>) -> Result<Consumed> {
    pyo3::sync::critical_section::with_critical_section(capsule.as_any(), || {
        consume_locked(capsule)
    })
}

/// [`consume`] inside the critical section.
fn consume_locked(capsule: &Bound<'_, PyCapsule>) -> Result<Consumed> {
    let name = name_of(capsule)?;
    let (fresh, used, versioned) = match name.as_deref() {
        Some("dltensor_versioned") => (DLTENSOR_VERSIONED, USED_DLTENSOR_VERSIONED, true),
        Some("dltensor") => (DLTENSOR, USED_DLTENSOR, false),
        Some(n @ ("used_dltensor" | "used_dltensor_versioned")) => {
            return Err(Error::UsedCapsule { name: n.to_owned() });
        }
        _ => return Err(Error::CapsuleName { name }),
    };
    // SAFETY: a live capsule, attached; the name matches (checked above), so this only
    // returns the stored pointer (null if the producer stored null).
    let ptr = unsafe { ffi::PyCapsule_GetPointer(capsule.as_ptr(), fresh.as_ptr()) };
    let Some(ptr) = NonNull::new(ptr) else {
        return Err(PyErr::take(capsule.py())
            .map(Error::from)
            .unwrap_or(Error::CapsuleName { name }));
    };
    // Rename first: from here on the capsule's destructor leaves the tensor to us.
    // SAFETY: a live capsule, attached; `used` is a static NUL-terminated string, as the
    // capsule API requires (it keeps the pointer).
    if unsafe { ffi::PyCapsule_SetName(capsule.as_ptr(), used.as_ptr()) } != 0 {
        return Err(PyErr::fetch(capsule.py()).into());
    }
    Ok(if versioned {
        Consumed::Versioned(ptr.cast())
    } else {
        Consumed::Legacy(ptr.cast())
    })
}

/// Wraps an export in a fresh `dltensor_versioned` capsule that owns it.
pub(crate) fn versioned_capsule<'py>(
    py: Python<'py>,
    managed: versioned::Dlpack,
) -> PyResult<Bound<'py, PyCapsule>> {
    let raw = NonNull::new(managed.into_raw()).expect("Managed::into_raw is never null");
    // SAFETY: `raw` is a live managed tensor we own (from `into_raw`); the destructor
    // releases it once unless a consumer renamed the capsule, and may run on any thread
    // that holds the GIL.
    let capsule = unsafe {
        PyCapsule::new_with_pointer_and_destructor(
            py,
            raw.cast::<c_void>(),
            DLTENSOR_VERSIONED,
            Some(destroy_versioned),
        )
    };
    if capsule.is_err() {
        // SAFETY: no capsule took it: still ours alone, released once here.
        unsafe { release(raw.as_ptr()) };
    }
    capsule
}

/// Wraps an export in a fresh `dltensor` (legacy) capsule that owns it.
pub(crate) fn legacy_capsule<'py>(
    py: Python<'py>,
    managed: legacy::Dlpack,
) -> PyResult<Bound<'py, PyCapsule>> {
    let raw = NonNull::new(managed.into_raw()).expect("Managed::into_raw is never null");
    // SAFETY: as in `versioned_capsule`.
    let capsule = unsafe {
        PyCapsule::new_with_pointer_and_destructor(
            py,
            raw.cast::<c_void>(),
            DLTENSOR,
            Some(destroy_legacy),
        )
    };
    if capsule.is_err() {
        // SAFETY: as in `versioned_capsule`.
        unsafe { release_legacy(raw.as_ptr()) };
    }
    capsule
}

/// Calls a versioned managed tensor's deleter (a null deleter means nothing to call).
///
/// # Safety
/// 1. `m` is a live managed tensor owned by the caller, released nowhere else.
pub(crate) unsafe fn release(m: *mut DLManagedTensorVersioned) {
    // SAFETY: live (obligation 1); `deleter` is a plain field.
    if let Some(deleter) = unsafe { (*m).deleter } {
        // SAFETY: ours to release, once (obligation 1).
        unsafe { deleter(m) };
    }
}

/// [`release`] for the legacy struct.
///
/// # Safety
/// 1. `m` is a live managed tensor owned by the caller, released nowhere else.
unsafe fn release_legacy(m: *mut DLManagedTensor) {
    // SAFETY: live (obligation 1).
    if let Some(deleter) = unsafe { (*m).deleter } {
        // SAFETY: ours to release, once (obligation 1).
        unsafe { deleter(m) };
    }
}

/// The capsule destructor both kinds share: releases the tensor only if the capsule still
/// has its fresh name (nobody consumed it), keeping any exception in flight.
///
/// The exception is stashed with the raw `PyErr_Fetch` / `PyErr_Restore`, never through
/// `PyErr::take`: a capsule often dies while an exception propagates (the frame that held it
/// unwinds), and when that exception is pyo3's `PanicException`, `PyErr::take` would resume
/// the panic inside this `extern "C"` callback and abort the process.
///
/// No consumer can race the destructor, on free-threaded builds either: a consumer holds a
/// reference to the capsule, and the destructor runs when the last one is gone.
///
/// # Safety
/// 1. Called by Python on a capsule being destroyed, with the GIL held.
unsafe fn destroy(capsule: *mut ffi::PyObject, fresh: &CStr, free: unsafe fn(*mut c_void)) {
    // SAFETY: `capsule` is live (being destroyed) and we hold the GIL (obligation 1);
    // `PyCapsule_IsValid` sets no exception.
    if unsafe { ffi::PyCapsule_IsValid(capsule, fresh.as_ptr()) } != 1 {
        // Consumed (renamed `used_*`): the consumer owns the tensor now.
        return;
    }
    let release = |_gil: &crate::ffi::attach::Gil| {
        // SAFETY: valid with this name (checked above), so this returns the stored pointer
        // without setting an exception.
        let ptr = unsafe { ffi::PyCapsule_GetPointer(capsule, fresh.as_ptr()) };
        if !ptr.is_null() {
            // SAFETY: the capsule owned the tensor and nobody consumed it; it dies now, so
            // this is the one release.
            unsafe { free(ptr) };
        }
    };
    // A capsule may die while an exception propagates: keep it, as it is.
    // SAFETY: Python holds the GIL for us (obligation 1).
    unsafe { crate::ffi::attach::keeping_exception(release) }
}

unsafe extern "C" fn destroy_versioned(capsule: *mut ffi::PyObject) {
    /// # Safety
    /// `p` is an unconsumed capsule's `DLManagedTensorVersioned`.
    unsafe fn free(p: *mut c_void) {
        // SAFETY: forwarded.
        unsafe { release(p.cast()) }
    }
    // SAFETY: Python calls capsule destructors with the GIL held on a dying capsule.
    unsafe { destroy(capsule, DLTENSOR_VERSIONED, free) }
}

unsafe extern "C" fn destroy_legacy(capsule: *mut ffi::PyObject) {
    /// # Safety
    /// `p` is an unconsumed capsule's `DLManagedTensor`.
    unsafe fn free(p: *mut c_void) {
        // SAFETY: forwarded.
        unsafe { release_legacy(p.cast()) }
    }
    // SAFETY: Python calls capsule destructors with the GIL held on a dying capsule.
    unsafe { destroy(capsule, DLTENSOR, free) }
}
