//! Sharing a CUDA tensor with another process on the same machine, zero-copy, whatever
//! framework made it and whatever framework takes it: [`export`] turns a [`Tensor`] into a
//! [`Shared`] share and its [`IpcHandle`] (plain bytes), [`import`] / [`import_raw`] turn the
//! handle into a [`Tensor`] over the same memory in another process.
//!
//! ```no_run
//! # fn demo(tensor: &tensorbridge_core::Tensor) -> Result<(), tensorbridge_cuda::Error> {
//! use tensorbridge_cuda::ipc;
//! // Producer: any CUDA tensor (PyTorch's, CuPy's, a C library's), pending work and all.
//! let shared = ipc::export(tensor, 1)?;
//! let bytes: Vec<u8> = shared.handle().as_bytes().to_vec(); // send these by any means
//!
//! // Consumer (another process): the same memory, ready on `stream` once the producer's
//! // pending writes have run; the host never waits.
//! let ctx = tensorbridge_cuda::primary_context(0)?;
//! let stream = ctx.new_stream().map_err(|e| tensorbridge_cuda::Error::driver("new_stream", e))?;
//! let handle = ipc::IpcHandle::from_bytes(&bytes)?; // validated: a bad handle is an error
//! let theirs = ipc::import(&handle, &stream)?;
//! # Ok(()) }
//! ```
//!
//! # The protocol
//! A handle ([`IpcHandle`], format in `wire.rs`: magic, version, length, checksum) carries:
//! - the **memory**: the legacy CUDA IPC handle of the tensor's whole allocation
//!   (`cuIpcGetMemHandle` of the base `cuPointerGetAttributes` reports: caching allocators
//!   hand out pieces of larger `cudaMalloc` blocks, and IPC maps whole allocations), the
//!   allocation's size, and the tensor's offset in it. The consumer maps the allocation
//!   (`cuIpcOpenMemHandle`), checks that the driver maps at least the handle's size
//!   (`cuMemGetAddressRange`), and views only the tensor's bytes, which the decoder has
//!   checked lie inside that size;
//! - the **layout**: dtype, shape, strides in elements, read-only, validated by the core;
//! - the **GPU** by UUID (`cuDeviceGetUuid_v2`), not ordinal: `CUDA_VISIBLE_DEVICES` numbers
//!   GPUs differently in every process. The consumer maps the memory on that GPU, whichever
//!   ordinal it has there; a consumer working on another GPU of the machine reads it through
//!   peer access (`CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`) or copies it with its framework. A GPU
//!   the consumer does not see is [`Error::IpcDeviceNotVisible`];
//! - the **producer's pending work**: an interprocess event (`CU_EVENT_INTERPROCESS`)
//!   recorded, on the producer's GPU, after the tensor's readiness (its producer stream, an
//!   event, another adapter's signal: a stream of the layer's own waits for it first).
//!   The consumer's stream waits on it (`cuStreamWaitEvent`); neither host blocks. A tensor
//!   that is ready now carries no event;
//! - the **lifetime slot** and the **producer**: its user, pid and start time, the slot's
//!   index and generation in the producer's lifetime file (`lifetime.rs`), which lives in
//!   the user's own `0700` directory `/dev/shm/tensorbridge-<uid>/`.
//!
//! # Lifetime rules
//! 1. The producer's memory stays alive (the [`Tensor`]'s owner is kept by the share) while
//!    the producer's [`Shared`] lives, and after that while any expected consumer has not
//!    opened the share yet (`consumers` tickets, taken by each process's first open) or any
//!    consumer process holds it: a share whose producer handle is gone waits in a limbo list,
//!    collected by a reaper thread, and its owner is dropped exactly once, when both counts
//!    are zero.
//! 2. A consumer process holds a share once, however many tensors it opened from it: one
//!    holder entry, one mapping per allocation (CUDA refuses to map one allocation twice in a
//!    context), one imported event. Each open's tensor owns a lease; when the last clone of a
//!    tensor is dropped, the lease is kept (this crate's retire queue) until the work enqueued
//!    by then on the stream it was opened on has run, so the producer never gets back memory a
//!    consumer kernel may still read. When the last lease has run out, the mapping is closed
//!    and the holder entry given back. Neither host waits for the device: the retire queue's
//!    threads sleep until the device is done ([`crate::reclaim`] releases what is done now).
//! 3. Death is detected by locks, not by process ids: the producer and every holder hold a
//!    byte-range lock on the lifetime file for as long as they live, and the kernel drops a
//!    dead process's locks. A holder entry whose lock is free is taken back by the producer
//!    and reported ([`Report::ConsumerDied`]); a producer whose lock is free is refused at
//!    open ([`Error::IpcProducerGone`]) and reported at release ([`Report::ProducerGone`]).
//!    Pid reuse and PID namespaces change nothing. A forked child that inherits the file's
//!    descriptor shares its parent's locks: memory may then stay longer, never less.
//!    A producer's memory dies with its process (the driver frees it with the context); a
//!    consumer's mapping then stays a mapping of freed memory only within that consumer: the
//!    driver never hands those pages to anyone while they are mapped.
//! 4. In the producer's own process an open takes a ticket too, and returns the producer's
//!    tensor itself. An open that fails (in any process) gives its ticket back.
//! 5. Only the process that made a [`Shared`], a hold or a lease releases it: in a forked
//!    child, dropping inherited ones is a no-op (no lock the parent's threads may have held at
//!    the fork is taken), and the process identity is read again.
//! 6. The producer removes its lifetime file a second after the last share in it is freed
//!    (its reaper waits that long: a process sharing one tensor at a time keeps one file); a file left
//!    by a producer that died (its lock free) is removed by the next producer of that user.
//!
//! # What a handle grants
//! Any process of the same user on the same machine that holds the bytes can map the whole
//! allocation (not only the tensor's bytes: other tensors of a caching allocator's block are
//! in it), read and write, for as long as the share lives. Another user's process is refused:
//! the handle's user must be the caller's effective user ([`Error::IpcOtherUser`]), and the
//! lifetime file lies in a `0700` directory of its user, opened without following links or
//! blocking and checked for type, owner, mode and size ([`Error::IpcLifetimeFileRefused`]).
//! Read-only is a promise the consumer's frameworks keep, not a protection: CUDA IPC maps
//! memory writable. Treat a handle like an open file descriptor to that memory. The checksum
//! catches damage, not forgery: the decoder's checks (sizes, offsets inside the allocation,
//! versions), and at open the driver's size of the mapping (every open, also one that reuses
//! a mapping this process already holds for the share), are what keep an altered handle from
//! viewing anything but a whole allocation the producer shared. The full trust model (who may
//! write each byte, what each side checks) is in ARCHITECTURE.md, "Sharing protocol: trust
//! model".
//!
//! Handles never work across machines: CUDA IPC maps memory of the same machine. Across PID
//! namespaces they do, where both see the same `/dev/shm` (liveness is a lock, not a pid). Across nodes, move the data with NCCL
//! (`torch.distributed`), UCX or NIXL, which take the same tensors through the frameworks:
//! `torch.from_dlpack(view)` for `torch.distributed.send`, or a NIXL `register_memory` of the
//! view's pointer and size.
//!
//! # Limitations
//! - Legacy IPC only: memory from `cudaMalloc` and caching allocators built on it (PyTorch's
//!   default, CuPy's default pool, JAX/XLA's BFC allocator, `cuMemAlloc`). Virtual memory
//!   mappings (PyTorch's expandable segments), stream-ordered pools (`cudaMallocAsync`,
//!   cudarc's allocations), managed and pinned host memory are refused with the reason.
//! - A producer keeps its memory only while its process lives.
//! - At most [`HOLDERS`] consumer processes hold one share at a time, and a share expects at
//!   most [`MAX_CONSUMERS`] consumers.
//! - Lifetime files live in `/dev/shm/tensorbridge-<uid>/`, which both processes must see
//!   (containers: share `/dev/shm`; the PID namespace need not be shared) and run as the same
//!   effective user. Another local user who creates that directory first (or a link of that
//!   name) denies this user sharing with a typed error; nothing more.
//! - A forked child cannot use CUDA, hence neither side of a share; it may drop what it
//!   inherited (a no-op).
//! - A consumer stream on another GPU than the share's waits for the producer through the
//!   share's GPU (a spare stream there waits on the interprocess event; the consumer's
//!   stream waits on an ordinary event it records): the driver crashed when a stream waited
//!   on an interprocess event opened on another device.

mod cuda;
mod export;
mod import;
mod lifetime;
mod wire;

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

pub use crate::types::DeviceUuid;
pub use cuda::device_uuid;
pub use export::{Shared, export};
pub use import::{import, import_raw};
pub use lifetime::{HOLDERS, MAX_CONSUMERS};
pub use wire::{IpcHandle, MAX_NDIM, ProcessId, VERSION};

#[cfg(doc)]
use crate::Error;
#[cfg(doc)]
use tensorbridge_core::Tensor;

/// Something this process noticed about another process of a share.
#[non_exhaustive]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Report {
    /// A consumer process exited while holding one of this process's shares; its hold was
    /// taken back (the memory is freed once no other holder is left).
    ConsumerDied {
        /// Its process id.
        pid: u32,
    },
    /// The producer of a share this process held exited before this process released it.
    ProducerGone {
        /// Its process id.
        pid: u32,
    },
}

/// Reports kept for [`reports`]; older ones are dropped beyond this.
const REPORTS_CAP: usize = 1024;
static REPORTS: Mutex<Vec<Report>> = Mutex::new(Vec::new());

fn report(r: Report) {
    static WARNED: [AtomicBool; 2] = [AtomicBool::new(false), AtomicBool::new(false)];
    let (i, text) = match &r {
        Report::ConsumerDied { pid } => (
            0,
            format!(
                "consumer process {pid} exited while holding a shared tensor; its hold was taken back"
            ),
        ),
        Report::ProducerGone { pid } => (
            1,
            format!(
                "the producer process {pid} of a shared tensor exited before this process released it"
            ),
        ),
    };
    // Once per kind and process on stderr, as PyTorch warns about its own shares; every
    // occurrence in `reports()`. Written, not `eprintln!`ed: this runs on the reaper thread
    // too, and `eprintln!` panics when stderr is a pipe nobody reads (EPIPE), which would end
    // the thread with `RUNNING` still set. A report that cannot be written is dropped.
    if !WARNED[i].swap(true, Ordering::Relaxed) {
        let _ = writeln!(
            std::io::stderr(),
            "tensorbridge: {text} (further reports: tensorbridge_cuda::ipc::reports)"
        );
    }
    let mut reports = REPORTS.lock().unwrap_or_else(PoisonError::into_inner);
    if reports.len() == REPORTS_CAP {
        reports.remove(0);
    }
    reports.push(r);
}

/// The reports gathered since the last call (consumers that died holding this process's
/// shares, producers that exited before this process released theirs), oldest first.
pub fn reports() -> Vec<Report> {
    std::mem::take(&mut *REPORTS.lock().unwrap_or_else(PoisonError::into_inner))
}

/// Moves shares along without blocking: releases the holds whose consumer work has run (this
/// crate's [`reclaim`](crate::reclaim)), gives back their holder entries, and frees the
/// shares in limbo that no consumer holds any more. Returns how many are still waiting.
/// A reaper thread moves the shares in limbo while any waits; call it to move sooner.
pub fn collect() -> usize {
    crate::reclaim();
    export::collect().waiting + import::retiring()
}

/// What the reaper thread moves, and how many shares still wait for it: [`collect`] without
/// the holds retiring in this process. Those are released by the layer's retire reapers
/// (asleep until the device is done) or with the CUDA graph that keeps them, and some never
/// are (a retirement whose owner is kept for ever because nothing proves the device is done
/// with it): polling cannot move them, so they must not keep this thread alive. What it
/// polls are the shares in limbo, whose holders are other processes, which nothing here can
/// wait on, and the lifetime files idle until their linger passes (so that the producer
/// removes its own file, `export::LINGER` after its last share was freed).
fn reap() -> usize {
    crate::reclaim();
    let c = export::collect();
    c.waiting + c.lingering
}

/// Whether the reaper thread runs (set before it starts, cleared as it exits).
static RUNNING: AtomicBool = AtomicBool::new(false);

/// Starts the reaper thread unless it runs: it calls [`reap`] until nothing waits, napping
/// 1 ms, then longer (up to 50 ms) while work stays pending, and exits when nothing does.
fn wake_reaper() {
    if RUNNING.swap(true, Ordering::SeqCst) {
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("tensorbridge-ipc-reaper".into())
        .spawn(|| {
            let mut nap = Duration::from_millis(1);
            loop {
                if reap() == 0 {
                    RUNNING.store(false, Ordering::SeqCst);
                    // Work that arrived between the count and the store found RUNNING set and
                    // did not start a thread: look once more, and go on if it is there and no
                    // other reaper has started since.
                    if reap() == 0 || RUNNING.swap(true, Ordering::SeqCst) {
                        return;
                    }
                }
                std::thread::sleep(nap);
                nap = (nap * 2).min(Duration::from_millis(50));
            }
        });
    if spawned.is_err() {
        // No thread: the next export, import or collect moves things along instead.
        RUNNING.store(false, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    use super::*;

    /// Set in the child process of [`a_report_on_a_broken_stderr_is_dropped`].
    const CHILD: &str = "TENSORBRIDGE_TEST_REPORT_CHILD";

    #[test]
    fn a_report_on_a_broken_stderr_is_dropped() {
        if std::env::var_os(CHILD).is_some() {
            // The child: stderr is a pipe whose read end is closed. Both kinds are written
            // once (the first of each kind goes to stderr), from a thread as on the reaper.
            let reporter = std::thread::spawn(|| {
                report(Report::ConsumerDied { pid: 1 });
                report(Report::ProducerGone { pid: 2 });
            });
            assert!(reporter.join().is_ok(), "report panicked");
            assert_eq!(
                reports(),
                [
                    Report::ConsumerDied { pid: 1 },
                    Report::ProducerGone { pid: 2 }
                ]
            );
            return;
        }
        let (reader, writer) = std::io::pipe().unwrap();
        // Closed before the child starts: each write to its stderr fails with EPIPE (Rust
        // ignores SIGPIPE, so the write returns the error instead of killing the process).
        drop(reader);
        let out = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "ipc::tests::a_report_on_a_broken_stderr_is_dropped",
                // The harness would capture `eprintln!` output; the report must meet the pipe.
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD, "1")
            .stdout(Stdio::piped())
            .stderr(writer)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("1 passed"),
            "expected the child to report and pass with a broken stderr, found {:?}: {stdout}",
            out.status
        );
    }

    /// Threads of this process named as the reaper (`comm` keeps 15 bytes of a name).
    fn reapers() -> usize {
        let name = &"tensorbridge-ipc-reaper"[..15];
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
            .filter(|comm| comm.trim_end() == name)
            .count()
    }

    #[test]
    fn a_leaked_retirement_does_not_keep_the_reaper_alive() {
        // A hold whose retirement never completes (its owner kept for ever: see `retire.rs`'s
        // `Kept::leak`), counted as `Lease::drop` counts one, and the reaper woken (as a
        // share going to limbo wakes it).
        let _leaked = import::leak_retirement();
        assert!(collect() >= 1, "the leaked hold counts as waiting");
        wake_reaper();
        // The reaper clears `RUNNING` as it exits (it set its thread's name when it started).
        let deadline = Instant::now() + Duration::from_secs(5);
        while (RUNNING.load(Ordering::SeqCst) || reapers() > 0) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(
            !RUNNING.load(Ordering::SeqCst),
            "expected the reaper to stop when only a retirement it cannot move is left"
        );
        assert_eq!(
            reapers(),
            0,
            "expected the reaper to exit when only a retirement it cannot move is left"
        );
    }
}
