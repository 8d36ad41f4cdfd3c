//! One policy for every function foreign code calls into (DLPack deleters, Python capsule
//! destructors, the DLPack C exchange API's entries, libtorch's deleter context, CUDA host
//! callbacks): a panic inside never unwinds across the C boundary, and never aborts the
//! process either.
//!
//! A panic there is a bug (an owner whose `Drop` panicked, say): the caller is C code that
//! cannot be unwound through, and aborting would take the user's process down for what is,
//! at worst, a leak. So the panic is caught, reported once on stderr (the panic hook has
//! already printed its message and location), and the entry returns its failure value; what
//! the body was releasing when it panicked may be leaked. Adapters with a richer channel add
//! to it (the Python layer also raises a `RuntimeError` where the C API lets an entry report
//! one).

use std::any::Any;
use std::io::Write as _;
use std::panic::{AssertUnwindSafe, catch_unwind};

/// Runs `body`, the body of `extern "C"` entry `name`: its value, or `on_panic` if it panicked
/// (the panic caught and reported; see the module docs). Never unwinds.
///
/// ```
/// let status = tensorbridge_core::callback::foreign_entry("an example", -1, || -> i32 {
///     panic!("a bug")
/// });
/// assert_eq!(status, -1);
/// ```
pub fn foreign_entry<R>(name: &'static str, on_panic: R, body: impl FnOnce() -> R) -> R {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(value) => value,
        Err(payload) => {
            report(name, payload.as_ref());
            on_panic
        }
    }
}

/// Writes one line about a caught panic; never panics itself (a failing stderr is ignored,
/// and a panicking payload formatter cannot run: only `&str` and `String` payloads are read).
fn report(name: &'static str, payload: &(dyn Any + Send)) {
    let message = payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic with a non-string payload");
    let _ = catch_unwind(AssertUnwindSafe(|| {
        let _ = writeln!(
            std::io::stderr(),
            "tensorbridge: a panic in {name} was caught at the C boundary and not propagated \
             ({message}); what it was releasing may be leaked. This is a bug: please report it."
        );
    }));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_the_failure_value_and_drops_run_once() {
        let dropped = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        struct Counted(std::sync::Arc<std::sync::atomic::AtomicUsize>);
        impl Drop for Counted {
            fn drop(&mut self) {
                self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        }
        let held = Counted(dropped.clone());
        let status = foreign_entry("a test entry", -1, move || {
            let _held = held;
            panic!("deliberately");
        });
        assert_eq!(status, -1);
        assert_eq!(dropped.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert_eq!(foreign_entry("a test entry", -1, || 0), 0);
        let string_payload = foreign_entry("a test entry", 7u8, || panic!("{}", String::from("x")));
        assert_eq!(string_payload, 7);
    }
}
