//! The interpreter's exit: no thread of ours takes the GIL back once CPython finalises.
//!
//! CPython up to 3.13 ends a thread that asks for the GIL after finalisation has begun
//! (`Py_FinalizeEx` sets the runtime's finalizing thread state) with `pthread_exit`, from
//! inside `PyEval_RestoreThread` / `PyGILState_Ensure`. That is a forced unwind through every
//! frame of the thread, and ours are Rust frames: a forced unwind through a Rust frame that
//! has cleanups or a `catch_unwind` is undefined behaviour, and in practice it aborts (pyo3's
//! trampolines catch panics, and Rust refuses to catch a foreign exception) or crashes (two
//! unwinders in one process meeting in one unwind). 3.14 parks such threads instead. Two
//! kinds of frames of ours would ask for the GIL during finalisation:
//!
//! - a call from Python that releases the GIL for its slow part (copies, host waits, `share`,
//!   `open`) and takes it back when done: a daemon thread inside it when the program ends;
//! - a thread of ours, or another library's, that takes the GIL to release a Python owner (the
//!   retire queue's reaper, the IPC limbo's reaper, a DLPack deleter run from C).
//!
//! A check of `Py_IsFinalizing` before asking races finalisation, which may begin right
//! after the check while the thread waits for the GIL. So the check is replaced by a gate
//! that the exit itself closes, before finalisation begins, and that waits for the threads
//! already through it:
//!
//! - The module registers an `atexit` function ([`install`]). CPython runs exit functions
//!   with the interpreter intact, after joining non-daemon threads and before it marks itself
//!   finalising; no thread can begin finalisation behind our back while one runs.
//! - Every GIL-released call goes through [`detach`]: it counts itself in (`WORKING`) while
//!   the gate is open, releases the GIL, and when its work is done moves to `RETURNING`
//!   before it asks for the GIL back, leaving the count once it holds it again. Every
//!   attach from a thread that does not hold the GIL ([`enter_attached`]) counts itself
//!   `RETURNING` for as long as it holds the GIL (the Python code a release runs may release
//!   and take the GIL again under our frames).
//! - The exit function closes the gate and, with the GIL released, waits until nobody is
//!   counted. The threads it waits for take the GIL back while the exit function is still
//!   running, so before finalisation: CPython lets them. Work that has not finished within
//!   [`WAIT_FOR_WORK`] is abandoned: those threads never ask for the GIL again (they park
//!   for ever when their work ends, as 3.14 parks them, and end with the process); the
//!   exit function waits only for the threads already past that decision, which need
//!   nothing but the GIL.
//! - Once the gate is closed, [`detach`] runs its work with the GIL held (nothing is released,
//!   so nothing is taken back), and a thread without the GIL does not attach: what it would
//!   have released leaks with the process.
//!
//! All of it is one atomic word, so a fork only has to forget the other threads' counts
//! (`os.register_at_fork`): the forking thread holds the GIL and is counted nowhere.
//!
//! - Python code our frames call with the GIL held (a producer's `__dlpack__`, PyTorch's
//!   tensor methods, which release the GIL around their work: a daemon thread ended inside
//!   one at exit unwinds through PyTorch's C++ frames, and the C++ runtime aborts the
//!   process) runs under [`enter_python`]: counted `RETURNING` while the gate is open, so the
//!   exit waits for it; once it is closed, a thread about to run such code parks instead.
//!
//! What stays possible: a finaliser our release triggers, and Python code that runs under
//! our frames without [`enter_python`], may give the GIL up at the interpreter's request and
//! wait for it again; if finalisation begins in that instant, CPython ends the thread there.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use pyo3::prelude::*;

/// One thread inside a [`detach`]'s work, the GIL released (bits 0 to 31 count them).
const WORKING: u64 = 1;
const WORKING_MASK: u64 = 0xFFFF_FFFF;
/// One thread about to take the GIL, or holding it after taking it under our frames
/// (bits 32 to 61 count them).
const RETURNING: u64 = 1 << 32;
const RETURNING_MASK: u64 = 0x3FFF_FFFF << 32;
/// The exit function ran: nothing new passes the gate.
const CLOSING: u64 = 1 << 62;
/// The exit stopped waiting for `WORKING` threads: they never take the GIL again.
const ABANDONED: u64 = 1 << 63;

/// The gate: the two counts and the two flags.
static GATE: AtomicU64 = AtomicU64::new(0);

/// How long the exit waits for GIL-released work (a copy, a wait for the device) to end
/// before abandoning the threads doing it.
pub(crate) const WAIT_FOR_WORK: Duration = Duration::from_secs(1);

/// Counts this thread in as `kind` (`WORKING` or `RETURNING`); false, and nothing counted,
/// when the gate is closed.
fn enter(gate: &AtomicU64, kind: u64) -> bool {
    gate.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |s| {
        (s & CLOSING == 0).then_some(s + kind)
    })
    .is_ok()
}

/// Counts one `kind` out. Never below zero: a fork that ran between entering and leaving
/// has already forgotten the count.
fn leave(gate: &AtomicU64, kind: u64, mask: u64) {
    let _ = gate.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |s| {
        (s & mask != 0).then(|| s - kind)
    });
}

/// A `RETURNING` thread, counted out when dropped (after the GIL is held again, or given
/// back).
pub(crate) struct Returning(&'static AtomicU64);

impl Drop for Returning {
    fn drop(&mut self) {
        leave(self.0, RETURNING, RETURNING_MASK);
    }
}

/// The end of a [`detach`]'s work, still without the GIL: `WORKING` becomes `RETURNING`, or,
/// when the exit has abandoned this thread, the thread parks for ever instead of asking for
/// the GIL. Runs on a panic too, since pyo3 takes the GIL back while unwinding.
struct WorkDone(&'static AtomicU64);

impl Drop for WorkDone {
    fn drop(&mut self) {
        let moved = self
            .0
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |s| {
                (s & ABANDONED == 0).then(|| {
                    // Counted in by `detach`; a fork in between forgot it.
                    let s = if s & WORKING_MASK != 0 {
                        s - WORKING
                    } else {
                        s
                    };
                    s + RETURNING
                })
            });
        if moved.is_err() {
            park_for_ever();
        }
    }
}

/// Never returns: the interpreter is finalising or about to, and this thread must not take
/// the GIL again. It ends with the process.
fn park_for_ever() -> ! {
    loop {
        std::thread::park();
    }
}

/// Runs `work` with the GIL released (pyo3's `detach`) and takes the GIL back only while
/// the interpreter is not finalising (see the module). Once the exit has begun, `work` runs
/// with the GIL held. Every GIL-released call of this crate goes through here.
pub(crate) fn detach<T, F>(py: Python<'_>, work: F) -> T
where
    F: Send + FnOnce() -> T,
    T: Send,
{
    install(py);
    if !enter(&GATE, WORKING) {
        return work();
    }
    // Dropped last: after pyo3 has taken the GIL back.
    let _back = Returning(&GATE);
    #[expect(
        clippy::disallowed_methods,
        reason = "the one place that releases the GIL"
    )]
    py.detach(move || {
        let _done = WorkDone(&GATE);
        work()
    })
}

/// For a thread that does not hold the GIL and is about to take it (`PyGILState_Ensure`):
/// the guard to hold until the GIL is given back, or `None` when the exit has begun and the
/// thread must not take it.
pub(crate) fn enter_attached() -> Option<Returning> {
    enter(&GATE, RETURNING).then_some(Returning(&GATE))
}

/// For a thread that holds the GIL and is about to run Python code under our frames (a
/// producer's `__dlpack__`, PyTorch's tensor methods, which release the GIL around their
/// work and take it back): the guard to hold while it may, counted `RETURNING`, so that the
/// exit waits until it is out (the exit function waits with the GIL released: such a thread
/// runs on, takes the GIL back before finalisation, and leaves). Once the exit has begun, a
/// thread other than the main one never runs such code again: it gives the GIL up and parks
/// for ever, as CPython 3.14 parks threads at exit, and ends with the process (CPython would
/// end it with `pthread_exit` at its next wait for the GIL, an unwind through our frames and
/// the frameworks' C++ ones that aborts the process). The main thread runs the exit itself
/// (later exit functions may call us): it goes on, uncounted.
pub(crate) fn enter_python(py: Python<'_>) -> Option<Returning> {
    install(py);
    if enter(&GATE, RETURNING) {
        return Some(Returning(&GATE));
    }
    if is_main_thread() {
        return None;
    }
    // SAFETY: this thread holds the GIL (`py`); it gives it up and never asks for it again,
    // so the thread state it returns is never restored, and nothing of this thread's runs
    // Python code afterwards (it parks until the process ends).
    let _ = unsafe { pyo3::ffi::PyEval_SaveThread() };
    park_for_ever()
}

/// Whether this is the process's main thread (the one whose thread id is the process id).
#[cfg(target_os = "linux")]
fn is_main_thread() -> bool {
    // SAFETY: a plain system call without arguments.
    let tid = unsafe { libc::gettid() };
    // SAFETY: as above.
    let pid = unsafe { libc::getpid() };
    tid == pid
}

/// Elsewhere the main thread cannot be told cheaply: no thread parks (the gate counts as
/// before; the exit still waits for the threads inside).
#[cfg(not(target_os = "linux"))]
fn is_main_thread() -> bool {
    true
}

/// Registers the exit function and the fork handler, once per process (a no-op after the
/// first success; a failure is retried by the next call).
pub(crate) fn install(py: Python<'_>) {
    static INSTALLED: AtomicBool = AtomicBool::new(false);
    if INSTALLED.load(Ordering::Acquire) {
        return;
    }
    // Two threads may both get here (the GIL can be released in between): registering
    // twice only runs the exit function twice, and the second run finds the gate closed
    // and nobody counted.
    let registered = (|| -> PyResult<()> {
        let exit = wrap_pyfunction!(before_exit, py)?;
        py.import("atexit")?.call_method1("register", (exit,))?;
        let child = wrap_pyfunction!(after_fork_in_child, py)?;
        let kwargs = pyo3::types::PyDict::new(py);
        kwargs.set_item("after_in_child", child)?;
        py.import("os")?
            .call_method("register_at_fork", (), Some(&kwargs))?;
        Ok(())
    })();
    if registered.is_ok() {
        INSTALLED.store(true, Ordering::Release);
    }
    // On failure the error is dropped: the gate then stays open, and the attach paths
    // still ask `Py_IsFinalizing` (the best effort that remains without the exit function).
}

/// The exit function: closes the gate and waits (the GIL released) until no thread is
/// counted, abandoning work that outlasts [`WAIT_FOR_WORK`].
#[pyfunction]
#[pyo3(name = "_tensorbridge_before_exit")]
fn before_exit(py: Python<'_>) {
    let state = GATE.fetch_or(CLOSING, Ordering::SeqCst);
    if state & (WORKING_MASK | RETURNING_MASK) == 0 {
        return;
    }
    // pyo3's own detach: exit functions run before finalisation begins, so taking the GIL
    // back here is always allowed.
    #[expect(
        clippy::disallowed_methods,
        reason = "before finalisation, by CPython's order"
    )]
    py.detach(|| wait_for_threads(&GATE, WAIT_FOR_WORK));
}

/// Waits until nobody is counted, or, past `patience`, marks the working threads abandoned
/// and waits for the returning ones only.
fn wait_for_threads(gate: &AtomicU64, patience: Duration) {
    let deadline = Instant::now() + patience;
    loop {
        let s = gate.load(Ordering::SeqCst);
        let waiting_for = if s & ABANDONED != 0 {
            RETURNING_MASK
        } else {
            WORKING_MASK | RETURNING_MASK
        };
        if s & waiting_for == 0 {
            return;
        }
        if s & ABANDONED == 0 && Instant::now() >= deadline {
            gate.fetch_or(ABANDONED, Ordering::SeqCst);
            continue;
        }
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// `os.register_at_fork(after_in_child=...)`: the child has only the forking thread, which
/// holds the GIL and is counted nowhere; the other threads' counts are forgotten.
#[pyfunction]
#[pyo3(name = "_tensorbridge_after_fork_in_child")]
fn after_fork_in_child() {
    forget_counts(&GATE);
}

/// Keeps the flags, forgets the counts.
fn forget_counts(gate: &AtomicU64) {
    gate.fetch_and(CLOSING | ABANDONED, Ordering::SeqCst);
}

#[cfg(test)]
mod tests {
    //! The gate's states, driven by hand on a gate of the test's own (the process's is
    //! left to the code under test elsewhere).
    use super::*;

    #[test]
    fn the_gate_waits_for_returning_threads_and_abandons_slow_work() {
        static G: AtomicU64 = AtomicU64::new(0);
        // Open: both kinds pass and are counted.
        assert!(enter(&G, WORKING));
        assert!(enter(&G, RETURNING));
        assert_eq!(G.load(Ordering::SeqCst), WORKING + RETURNING);
        // The working thread finishes: it becomes returning.
        drop(WorkDone(&G));
        assert_eq!(G.load(Ordering::SeqCst), 2 * RETURNING);
        leave(&G, RETURNING, RETURNING_MASK);
        leave(&G, RETURNING, RETURNING_MASK);
        assert_eq!(G.load(Ordering::SeqCst), 0);
        // Never below zero.
        leave(&G, RETURNING, RETURNING_MASK);
        assert_eq!(G.load(Ordering::SeqCst), 0);

        // A returning thread holds the exit until it leaves.
        assert!(enter(&G, RETURNING));
        let guard = Returning(&G);
        G.fetch_or(CLOSING, Ordering::SeqCst);
        assert!(!enter(&G, RETURNING), "closed: nobody new attaches");
        assert!(!enter(&G, WORKING), "closed: nobody new releases the GIL");
        let waiter = std::thread::spawn(|| wait_for_threads(&G, Duration::from_secs(60)));
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            !waiter.is_finished(),
            "the exit waits for the returning thread"
        );
        drop(guard);
        waiter.join().expect("no panic");
        assert_eq!(G.load(Ordering::SeqCst) & ABANDONED, 0, "nobody abandoned");

        // Work that outlasts the patience is abandoned: the thread parks instead of
        // returning, and the exit does not wait for it.
        G.store(WORKING, Ordering::SeqCst);
        let start = Instant::now();
        wait_for_threads(&G, Duration::from_millis(20));
        assert!(start.elapsed() >= Duration::from_millis(20));
        assert_ne!(G.load(Ordering::SeqCst) & ABANDONED, 0);
        let slow = std::thread::spawn(|| {
            drop(WorkDone(&G));
            // Never reached: the abandoned thread parks for ever.
            G.fetch_add(RETURNING, Ordering::SeqCst);
        });
        std::thread::sleep(Duration::from_millis(50));
        assert!(!slow.is_finished(), "the abandoned thread parked");
        assert_eq!(
            G.load(Ordering::SeqCst) & RETURNING_MASK,
            0,
            "and never counted itself returning"
        );
        // The parked thread is left behind (it ends with the test process).
        drop(slow);

        // A fork forgets the counts and keeps the flags.
        G.store(CLOSING | (3 * RETURNING + 2), Ordering::SeqCst);
        forget_counts(&G);
        assert_eq!(G.load(Ordering::SeqCst), CLOSING);
    }
}
