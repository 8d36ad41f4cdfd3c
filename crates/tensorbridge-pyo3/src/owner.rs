//! Owners that keep Python objects alive behind a [`Tensor`](tensorbridge_core::Tensor): the
//! producer object, a held buffer-protocol view, a `release` callback.
//!
//! A tensor's owner is dropped wherever its last clone goes: on a thread holding the GIL, on
//! one that does not (a DLPack consumer may call our deleter from any thread), inside another
//! framework's deleter that released the GIL while pyo3 believes it is held (PyTorch
//! destroying a tensor made from our export), or while Python shuts down. So every drop here
//! goes through [`attached`]: the GIL as the interpreter itself reports it, taken when
//! missing, any exception in flight stashed raw and put back, and raw C API calls that never
//! consult pyo3's thread-local count; when the interpreter is gone, the owner leaks rather
//! than touches it. Releasing at once matters even where the GIL is held: a DLPack consumer
//! calls our deleter from C with the GIL but not through pyo3, and a bare `Py<PyAny>`
//! dropped there would only be queued for the next time pyo3 attaches, keeping the producer
//! alive until some unrelated call.

use std::ptr::NonNull;
use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::{PyTraverseError, gc::PyVisit};
use tensorbridge_core::Owner;

use crate::ffi::attach::attached;
use crate::ffi::{Py_buffer, PyBuffer_Release, PyObject_GetBuffer};

/// Releases a Python reference now: the real GIL held, so the object is freed at once (not
/// queued in pyo3's pool). Leaks it when the interpreter is gone.
fn release_now(object: Py<PyAny>) {
    // Out of pyo3's hands: its `Drop` would trust its own count of attached frames.
    let Some(ptr) = NonNull::new(object.into_ptr()) else {
        return;
    };
    // `None` (the interpreter is gone): the reference is leaked with the process.
    let _ = attached(|gil| gil.decref(ptr));
}

/// Keeps a Python object alive, and with it whatever owned the memory before (`inner`, or
/// `pinned`, another Python object: a PyTorch storage).
pub(crate) struct KeepAlive {
    /// The previous owner (a DLPack import's deleter, a held buffer...), dropped first.
    inner: Option<Owner>,
    /// What pins the memory when it is a Python object of its own (a PyTorch storage),
    /// released before `object`.
    pinned: Option<Py<PyAny>>,
    /// Held so that the producer lives as long as the tensor; taken only by `drop`.
    object: Option<Py<PyAny>>,
}

impl Drop for KeepAlive {
    fn drop(&mut self) {
        drop(self.inner.take());
        if let Some(pinned) = self.pinned.take() {
            release_now(pinned);
        }
        if let Some(object) = self.object.take() {
            release_now(object);
        }
    }
}

impl KeepAlive {
    /// An owner that holds `object`, and `inner` (dropped before `object` is released).
    pub(crate) fn owner(object: Py<PyAny>, inner: Option<Owner>) -> Owner {
        std::sync::Arc::new(KeepAlive {
            inner,
            pinned: None,
            object: Some(object),
        })
    }

    /// An owner that holds `object` and `pinned`, the Python object that pins the memory
    /// (released first).
    pub(crate) fn pinning(object: Py<PyAny>, pinned: Py<PyAny>) -> Owner {
        std::sync::Arc::new(KeepAlive {
            inner: None,
            pinned: Some(pinned),
            object: Some(object),
        })
    }
}

/// `from_ptr`'s owner: calls `release()` exactly once when dropped, then lets `owner` go.
pub(crate) struct Release {
    callback: Option<Py<PyAny>>,
    /// Held until the callback has run; taken only by `drop`.
    owner: Option<Py<PyAny>>,
}

impl Release {
    pub(crate) fn owner(callback: Option<Py<PyAny>>, owner: Option<Py<PyAny>>) -> Owner {
        std::sync::Arc::new(Release { callback, owner })
    }
}

impl Drop for Release {
    fn drop(&mut self) {
        self.call();
        if let Some(owner) = self.owner.take() {
            release_now(owner);
        }
    }
}

impl Release {
    /// Calls the callback, once, with the GIL held; when the interpreter is gone or going it
    /// cannot run, and the memory it would have released goes with the process. An exception
    /// in flight (a capsule destructor runs while one unwinds, a `PanicException` included)
    /// is neither seen nor cleared by the callback; one the callback raises is reported as
    /// unraisable, the way CPython reports errors in finalizers.
    fn call(&mut self) {
        let Some(callback) = self.callback.take() else {
            return;
        };
        let Some(ptr) = NonNull::new(callback.into_ptr()) else {
            return;
        };
        // `None` (the interpreter is gone): the callback and its reference are leaked.
        let _ = attached(|gil| {
            gil.call_unraisable(ptr);
            gil.decref(ptr);
        });
    }
}

/// Visits the Python objects that `owner` and the owners it holds keep alive, for
/// `View.__traverse__`, so that reference cycles through a view's owner (a wrapper that
/// holds a view of itself: `self.view = from_ptr(..., owner=self)`) are collected.
///
/// The garbage collector subtracts one reference for every visit, so an object may be
/// visited only for a reference that the traversing view owns. Owners are shared (`Arc`):
/// by clones of the tensor in other views, in DLPack capsules and their consumers, in Rust
/// code. A link is followed only while this view holds its only strong reference and no
/// weak one (nobody else can then clone it without going through the view, which needs the
/// GIL the collector holds); a shared link ends the walk, and the cycle is collected by a
/// later collection, once the other users are gone. Unknown owner types end it too (a
/// DLPack producer's deleter is opaque). Reads only Rust fields: no interpreter access.
///
/// Only references the view merely drops are visited, never one it calls when it goes (a
/// `from_ptr` release callback): the collector may clear a visited object before the view is
/// freed, and calling a cleared function crashes.
///
/// One clone can happen during a collection: through `Py<View>::get()` (a frozen class)
/// on a thread that does not hold the GIL. That thread's `Py<View>` makes the view
/// reachable, and a producer the first pass visited but the second no longer does may be
/// taken for garbage in the collector's first analysis (its weak references cleared, its
/// finalizer run early). Nothing is cleared on that account: before clearing anything,
/// CPython (3.9 and later) counts again which of the objects found unreachable are
/// referenced from outside that set, and the view's reference is.
pub(crate) fn visit_owner(owner: &Owner, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
    let mut next = Some(owner);
    while let Some(owner) = next.take() {
        if std::sync::Arc::strong_count(owner) != 1 || std::sync::Arc::weak_count(owner) != 0 {
            break;
        }
        let any: &(dyn std::any::Any + Send + Sync) = &**owner;
        if let Some(keep) = any.downcast_ref::<KeepAlive>() {
            visit.call(&keep.object)?;
            visit.call(&keep.pinned)?;
            next = keep.inner.as_ref();
        } else if let Some(release) = any.downcast_ref::<Release>() {
            // Not the callback: it is CALLED when the owner goes, and the collector may clear
            // (`tp_clear`) anything a traversal reports before the view holding it is freed;
            // a cleared function called afterwards crashes the interpreter (its globals and
            // closure are gone). Unreported, the callback counts as referenced from outside
            // the garbage, so it and what it refers to are never cleared under the view. The
            // cost: a cycle that runs through the callback itself (a bound method of the
            // view's owner) is not collected; one through the owner still is.
            visit.call(&release.owner)?;
        } else if let Some(held) = any.downcast_ref::<HeldBuffer>() {
            let exporter = &held.view().obj;
            if !exporter.is_null() {
                // SAFETY: `Py<PyAny>` is `repr(transparent)` over `NonNull<PyObject>`, which
                // has the layout of a non-null `*mut PyObject`; `obj` is non-null (checked)
                // and is the strong reference the held buffer owns until it is released.
                let exporter = unsafe { &*std::ptr::from_ref(exporter).cast::<Py<PyAny>>() };
                visit.call(exporter)?;
            }
        }
    }
    Ok(())
}

/// A buffer held through the buffer protocol: released (`PyBuffer_Release`) once, when the
/// last tensor using it is dropped.
///
/// The `Py_buffer` lives inside the owner's own allocation (an `Arc`, made before
/// `PyObject_GetBuffer` fills the struct and never moved after): exporters may point `shape`
/// into the struct itself (`PyBuffer_FillInfo` points it at `len`), and one allocation serves
/// both the struct and the owner.
pub(crate) struct HeldBuffer {
    view: Py_buffer,
    /// `PyObject_GetBuffer` filled `view`: it is released on drop.
    filled: bool,
}

impl HeldBuffer {
    /// `PyObject_GetBuffer(obj, flags)` into a new held buffer, or the exporter's error
    /// (the struct, unfilled, is then freed without a release).
    pub(crate) fn get(obj: &Bound<'_, PyAny>, flags: std::ffi::c_int) -> PyResult<Arc<HeldBuffer>> {
        let mut held = Arc::new(HeldBuffer {
            view: Py_buffer::zeroed(),
            filled: false,
        });
        let unique = Arc::get_mut(&mut held).expect("a new Arc has no other reference");
        // SAFETY: attached (we hold `obj`); `view` is a live, writable struct inside the
        // `Arc`'s allocation, which never moves while the `Arc` (or a clone) lives.
        let rc = unsafe { PyObject_GetBuffer(obj.as_ptr(), &raw mut unique.view, flags) };
        if rc != 0 {
            return Err(PyErr::fetch(obj.py()));
        }
        unique.filled = true;
        Ok(held)
    }

    /// The filled struct.
    pub(crate) fn view(&self) -> &Py_buffer {
        &self.view
    }
}

impl Drop for HeldBuffer {
    fn drop(&mut self) {
        if !self.filled {
            return;
        }
        let view = &raw mut self.view;
        // If the interpreter is gone, the view is not released (the exporter's reference is
        // leaked rather than touched); the struct is our memory and goes with the `Arc`.
        attached(|_gil| {
            // SAFETY: the GIL is held (the `Gil` proof); `view` was filled by
            // `PyObject_GetBuffer` (`filled`) and is released exactly once, here, at the
            // address it was filled at.
            unsafe { PyBuffer_Release(view) };
        });
    }
}

// SAFETY: the view is touched only by `view()` (reads of plain fields) and by `drop`, which
// holds the GIL (checked with the interpreter, not pyo3) before releasing it; the buffer protocol allows releasing a
// view from any thread that holds the GIL.
unsafe impl Send for HeldBuffer {}
// SAFETY: shared access only reads the filled struct, which nothing mutates until `drop`.
unsafe impl Sync for HeldBuffer {}
