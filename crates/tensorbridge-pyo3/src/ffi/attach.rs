//! Touching the interpreter from destructors that foreign code may call.
//!
//! Our owners (`owner.rs`) and capsule destructors (`capsule.rs`) run wherever the last user
//! of a tensor lets go of it, and that is often inside another framework: PyTorch destroys a
//! tensor made by `torch.from_dlpack(view)` and calls our export's deleter, NumPy, JAX,
//! TensorFlow and CuPy do the same, on any thread, with or without the GIL. Two facts make
//! pyo3's own attaching wrong there:
//!
//! - pyo3 decides whether the thread is attached from a thread-local count of its own frames,
//!   not from the interpreter. PyTorch's tensor deallocation releases the GIL
//!   (`gil_scoped_release`) while it destroys the storage, so a chain `View` -> torch ->
//!   `View` dropped from inside a pyo3 frame re-enters our deleter with pyo3's count still
//!   positive and no thread state: `Python::try_attach` then attaches nothing, and the next
//!   call into the C API (`PyErr_Fetch`, `Py_DECREF`) dereferences a null thread state. The
//!   converse happens too: a C caller holding the GIL outside any pyo3 frame makes pyo3
//!   defer a `Py<T>` drop to its reference pool, keeping the producer alive until some
//!   unrelated pyo3 call.
//! - `PyErr::take` resumes a Rust panic when the exception in flight is pyo3's
//!   `PanicException`. A destructor that runs while a panic propagates as a Python exception
//!   would then unwind out of an `extern "C"` callback, which aborts the process.
//!
//! So these paths use [`attached`]: it asks the interpreter itself (`PyGILState_Check`),
//! takes the GIL with `PyGILState_Ensure` when the thread does not hold it, stashes the
//! exception in flight with the raw `PyErr_Fetch` / `PyErr_Restore` (the wheel is abi3 for
//! 3.9, so not the 3.12 raised-exception calls), and does its work with raw C API calls that
//! never consult pyo3's count: `Py_DecRef`, `PyObject_CallObject`, `PyErr_WriteUnraisable`.
//! When the interpreter is not initialised, or is exiting and the thread does not hold the
//! GIL, the work is not done and the caller leaks what it would have released: the process
//! is ending anyway. "Exiting" is decided by the exit's gate (`exit`), not by asking
//! `Py_IsFinalizing` alone, which races finalisation: CPython 3.13 and older end a thread
//! that waits for the GIL when finalisation begins with `pthread_exit`, whose forced unwind
//! must never run through our frames.
//!
//! `PyGILState_Check` answers 1 unconditionally once sub-interpreters were created (before
//! CPython 3.12); pyo3 modules refuse to load in sub-interpreters, so a process using this
//! crate has none of ours, and one embedding several interpreters is not supported.

use std::ffi::{c_char, c_int, c_void};
use std::ptr::NonNull;
use std::sync::OnceLock;

use pyo3::ffi;

unsafe extern "C" {
    /// Whether the calling thread holds the GIL (is attached, on free-threaded builds).
    /// Exported by every CPython 3 shared library and executable since 3.4, but declared
    /// only outside the limited API, which this crate builds against (`abi3-py39`).
    fn PyGILState_Check() -> c_int;
}

/// Proof, for the closure [`attached`] runs, that this thread holds the GIL (and no
/// exception is set). Not `Send`: it is only valid on the thread it was made on.
pub(crate) struct Gil {
    _not_send: std::marker::PhantomData<*mut ()>,
}

impl Gil {
    /// Releases one strong reference, now (never through pyo3's deferred pool).
    pub(crate) fn decref(&self, object: NonNull<ffi::PyObject>) {
        // SAFETY: the GIL is held (the `Gil` proof); the caller hands over one strong
        // reference to a live object.
        unsafe { ffi::Py_DecRef(object.as_ptr()) };
    }

    /// Calls `callable()`; an exception it raises is reported as unraisable (there is nobody
    /// to raise it to), exactly as CPython reports errors in finalizers, and never resumed as
    /// a Rust panic (it may be a `PanicException`).
    pub(crate) fn call_unraisable(&self, callable: NonNull<ffi::PyObject>) {
        // SAFETY: the GIL is held and no exception is set (the `Gil` proof); `callable` is a
        // live object we hold a reference to; a null argument tuple means no arguments.
        let result = unsafe { ffi::PyObject_CallObject(callable.as_ptr(), std::ptr::null_mut()) };
        if let Some(result) = NonNull::new(result) {
            self.decref(result);
        } else {
            // SAFETY: the GIL is held and the call set an exception, which this reports and
            // clears; `callable` is live (its context in the report).
            unsafe { ffi::PyErr_WriteUnraisable(callable.as_ptr()) };
        }
    }
}

/// The exception in flight, taken out raw so it can be put back unchanged.
#[cfg(not(Py_3_12))]
struct Pending {
    ptype: *mut ffi::PyObject,
    pvalue: *mut ffi::PyObject,
    ptraceback: *mut ffi::PyObject,
}

#[cfg(not(Py_3_12))]
impl Pending {
    /// Takes the exception in flight (all null when none), leaving none set.
    ///
    /// # Safety
    /// 1. The calling thread holds the GIL.
    unsafe fn fetch() -> Pending {
        let mut p = Pending {
            ptype: std::ptr::null_mut(),
            pvalue: std::ptr::null_mut(),
            ptraceback: std::ptr::null_mut(),
        };
        // SAFETY: GIL held (obligation 1); three live locals the call writes. Raw, so a
        // `PanicException` is moved, not resumed as a Rust panic.
        unsafe { ffi::PyErr_Fetch(&mut p.ptype, &mut p.pvalue, &mut p.ptraceback) };
        p
    }

    /// Puts the fetched exception back (a no-op when there was none), replacing anything
    /// set meanwhile (the work in between reports its own errors as unraisable).
    ///
    /// # Safety
    /// 1. The calling thread holds the GIL.
    unsafe fn restore(self) {
        if self.ptype.is_null() {
            return;
        }
        // SAFETY: GIL held (obligation 1); the three references came from `PyErr_Fetch`
        // and are handed back (the call steals them).
        unsafe { ffi::PyErr_Restore(self.ptype, self.pvalue, self.ptraceback) };
    }
}

/// An exception taken out of the interpreter's error indicator, to be put back: from 3.12
/// the exception is one object (`PyErr_GetRaisedException`; `PyErr_Fetch` is deprecated).
#[cfg(Py_3_12)]
struct Pending {
    exc: *mut ffi::PyObject,
}

#[cfg(Py_3_12)]
impl Pending {
    /// Takes the exception in flight (null when none), leaving none set.
    ///
    /// # Safety
    /// 1. The calling thread holds the GIL.
    unsafe fn fetch() -> Pending {
        // SAFETY: GIL held (obligation 1). Raw, so a `PanicException` is moved, not resumed
        // as a Rust panic.
        let exc = unsafe { ffi::PyErr_GetRaisedException() };
        Pending { exc }
    }

    /// Puts the fetched exception back (a no-op when there was none), replacing anything
    /// set meanwhile (the work in between reports its own errors as unraisable).
    ///
    /// # Safety
    /// 1. The calling thread holds the GIL.
    unsafe fn restore(self) {
        if self.exc.is_null() {
            return;
        }
        // SAFETY: GIL held (obligation 1); the reference came from
        // `PyErr_GetRaisedException` and is handed back (the call steals it).
        unsafe { ffi::PyErr_SetRaisedException(self.exc) };
    }
}

/// Runs `work` on this thread with the GIL really held, whatever pyo3's thread-local state
/// says, and with no exception set (one in flight is stashed and put back afterwards).
/// `None` (and `work` not run) when the interpreter is not initialised, or is finalising
/// and this thread does not already hold the GIL: the caller then leaks what it holds.
///
/// Never panics and never resumes a panic, so it may run inside `extern "C"` callbacks.
pub(crate) fn attached<R>(work: impl FnOnce(&Gil) -> R) -> Option<R> {
    // SAFETY: callable at any time, before, during and after initialisation.
    if unsafe { ffi::Py_IsInitialized() } == 0 {
        return None;
    }
    // SAFETY: callable without the GIL once the runtime is initialised (checked above): it
    // reads this thread's thread state and the runtime's auto-TSS key.
    let held = unsafe { PyGILState_Check() } != 0;
    let gstate = if held {
        None
    } else {
        // Counted in with the exit's gate (`exit`): while this thread holds the GIL it took,
        // finalisation cannot begin; once the exit has begun, it does not take the GIL.
        // `Py_IsFinalizing` remains for a process whose exit function was never registered.
        let returning = super::exit::enter_attached()?;
        if finalizing() {
            return None;
        }
        // SAFETY: the interpreter is initialised and not finalising, and cannot begin to
        // until `returning` is dropped (the exit's gate); matched by the
        // `PyGILState_Release` below.
        Some((unsafe { ffi::PyGILState_Ensure() }, returning))
    };
    // SAFETY: the GIL is held now.
    let pending = unsafe { Pending::fetch() };
    let gil = Gil {
        _not_send: std::marker::PhantomData,
    };
    let out = work(&gil);
    // SAFETY: still holding the GIL (released only below).
    unsafe { pending.restore() };
    if let Some((gstate, returning)) = gstate {
        // SAFETY: the matching `PyGILState_Ensure` above, on this thread.
        unsafe { ffi::PyGILState_Release(gstate) };
        // Only now may the exit go on.
        drop(returning);
    }
    Some(out)
}

/// Runs `work` with the exception in flight (if any) stashed raw and put back afterwards,
/// for callbacks that CPython itself calls with the GIL held (capsule destructors).
///
/// # Safety
/// 1. The calling thread holds the GIL.
pub(crate) unsafe fn keeping_exception<R>(work: impl FnOnce(&Gil) -> R) -> R {
    // SAFETY: GIL held (obligation 1).
    let pending = unsafe { Pending::fetch() };
    let out = work(&Gil {
        _not_send: std::marker::PhantomData,
    });
    // SAFETY: GIL held (obligation 1), still.
    unsafe { pending.restore() };
    out
}

/// Whether the interpreter is finalising, asked without the GIL. `Py_IsFinalizing` is public
/// from 3.13 (and in pyo3-ffi only for builds against it); 3.9 to 3.12 export it as
/// `_Py_IsFinalizing`. Neither is in the 3.9 limited API, so the symbol is looked up in the
/// running process once. Where neither is found, `false`: the check is a best effort anyway
/// (finalisation may start right after it), as pyo3's own is.
fn finalizing() -> bool {
    // SAFETY: CPython's `int Py_IsFinalizing(void)`: an atomic read of the runtime state.
    is_finalizing_function().is_some_and(|f| unsafe { f() } != 0)
}

/// CPython's `int (*)(void)` finalisation query.
type IsFinalizing = unsafe extern "C" fn() -> c_int;

/// `Py_IsFinalizing` or `_Py_IsFinalizing` from the running process, looked up once.
fn is_finalizing_function() -> Option<IsFinalizing> {
    static FUNCTION: OnceLock<Option<IsFinalizing>> = OnceLock::new();
    *FUNCTION.get_or_init(|| {
        [c"Py_IsFinalizing", c"_Py_IsFinalizing"]
            .into_iter()
            .find_map(|name| {
                // SAFETY: a NUL-terminated name; `dlsym` only reads it.
                let symbol = unsafe { lookup(name.as_ptr()) };
                // SAFETY: both symbols are CPython's `int (*)(void)`, callable without the GIL.
                NonNull::new(symbol).map(|s| unsafe {
                    std::mem::transmute::<*mut c_void, IsFinalizing>(s.as_ptr())
                })
            })
    })
}

/// `dlsym(RTLD_DEFAULT, name)`: the symbol in the process's global scope, or null.
///
/// # Safety
/// 1. `name` is a NUL-terminated string.
#[cfg(unix)]
unsafe fn lookup(name: *const c_char) -> *mut c_void {
    unsafe extern "C" {
        fn dlsym(handle: *mut c_void, symbol: *const c_char) -> *mut c_void;
    }
    // glibc and musl: `RTLD_DEFAULT` is the null handle; the BSDs and macOS use -2.
    #[cfg(any(target_os = "macos", target_os = "ios", target_os = "freebsd"))]
    let handle = std::ptr::without_provenance_mut::<c_void>(usize::MAX - 1);
    #[cfg(not(any(target_os = "macos", target_os = "ios", target_os = "freebsd")))]
    let handle = std::ptr::null_mut::<c_void>();
    // SAFETY: `handle` is `RTLD_DEFAULT`; `name` is NUL-terminated (obligation 1).
    unsafe { dlsym(handle, name) }
}

/// No symbol lookup off Unix: finalisation is then not detected (see [`finalizing`]).
///
/// # Safety
/// None beyond the Unix variant's.
#[cfg(not(unix))]
unsafe fn lookup(_name: *const c_char) -> *mut c_void {
    std::ptr::null_mut()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attaches_from_a_thread_that_does_not_hold_the_gil() {
        pyo3::Python::initialize();
        assert!(
            is_finalizing_function().is_some(),
            "Py_IsFinalizing or _Py_IsFinalizing is exported by the running CPython"
        );
        assert!(!finalizing());
        // A fresh thread: no GIL, no pyo3 frame. `attached` must take the GIL itself.
        let seen = std::thread::spawn(|| {
            attached(|_gil| {
                // SAFETY: `PyGILState_Check` may be called at any time after initialisation.
                unsafe { PyGILState_Check() }
            })
        })
        .join()
        .expect("no panic");
        assert_eq!(seen, Some(1), "the GIL is held inside `attached`");
        // SAFETY: as above.
        assert_eq!(unsafe { PyGILState_Check() }, 0, "and given back after");
    }
}
