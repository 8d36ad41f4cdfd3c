//! Making DLPack capsules: a fresh capsule owns its managed tensor and releases it when Python
//! destroys it unconsumed (a consumer renames it `used_*` and takes the tensor over).

use std::ffi::{CStr, c_void};
use std::ptr::NonNull;

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;
use tensorbridge_dlpack::dlpark::{legacy, versioned};
use tensorbridge_dlpack::ffi::{DLManagedTensor, DLManagedTensorVersioned};

use crate::ffi::callback::void_entry;
use crate::floor::capsule::{DLTENSOR, DLTENSOR_VERSIONED};

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
/// The exception is stashed with the raw `PyErr_Fetch` / `PyErr_Restore` (their one-object
/// forms from 3.12), never through
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
    void_entry("a DLPack capsule's destructor", || {
        // SAFETY: Python calls capsule destructors with the GIL held on a dying capsule.
        unsafe { destroy(capsule, DLTENSOR_VERSIONED, free) }
    });
}

unsafe extern "C" fn destroy_legacy(capsule: *mut ffi::PyObject) {
    /// # Safety
    /// `p` is an unconsumed capsule's `DLManagedTensor`.
    unsafe fn free(p: *mut c_void) {
        // SAFETY: forwarded.
        unsafe { release_legacy(p.cast()) }
    }
    void_entry("a legacy DLPack capsule's destructor", || {
        // SAFETY: Python calls capsule destructors with the GIL held on a dying capsule.
        unsafe { destroy(capsule, DLTENSOR, free) }
    });
}
