//! Consuming DLPack capsules: the Python protocol's wrapper around a managed tensor.
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
//! `PyErr_Fetch`/`PyErr_Restore` (their one-object forms from 3.12), so a `PanicException` propagating past a dying capsule is
//! never resumed as a Rust panic inside the destructor (see `attach.rs`).

use std::ffi::CStr;
use std::ptr::NonNull;

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyCapsule;
use tensorbridge_dlpack::ffi::{DLManagedTensor, DLManagedTensorVersioned};

use crate::error::{Error, Result};

pub(crate) use crate::floor::capsule::{
    DLTENSOR, DLTENSOR_VERSIONED, USED_DLTENSOR, USED_DLTENSOR_VERSIONED,
};

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
