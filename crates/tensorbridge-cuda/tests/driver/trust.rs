//! The sharing protocol's trust model, end to end through a driver (the stand-in in CI, a
//! GPU in the bundle): one regression per defect an independent review reproduced. Each
//! drives the public API only, so the same file shows the old behaviour on older code.
//!
//! - a handle edited (size and shape, checksum recomputed) after its share is already held
//!   in the process is checked against the mapping it reuses;
//! - an open that fails after registering gives its ticket back;
//! - another user's lifetime file (and handle) is never used;
//! - a FIFO planted where lifetime files live hangs no producer;
//! - a lifetime file shrunk under a live share kills neither side;
//! - a forked child dropping an inherited share revokes nothing;
//! - the producer removes its lifetime file once the last share in it is freed;
//! - a producer in another PID namespace (a container sharing `/dev/shm` but not its process
//!   ids) is alive to this one: its lifetime file survives this namespace's stale-file scan,
//!   and a consumer of its own namespace still opens its share.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use cudarc::driver::CudaStream;
use tensorbridge_core::{Owner, Ready};
use tensorbridge_cuda::ipc::{self, IpcHandle};
use tensorbridge_testkit::DropCounter;

use crate::{
    Io, Peer, RawAlloc, altered, context, eventually, from_host, hex, pattern, serial, tensor_at,
};

/// Elements of every shared tensor: 16 KiB, a whole number of pages (on the stand-in, the
/// guard page follows the last element).
const N: usize = 4096;

/// Handle offsets, as `ipc/wire.rs` documents them.
const PID: usize = 28;
const START: usize = 32;
const UID: usize = 40;
const SLOT: usize = 44;
const GENERATION: usize = 48;
const NONCE: usize = 56;
const ALLOC_SIZE: usize = 64;
const SHAPE: usize = 240;

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from(u32_at(b, at)) | u64::from(u32_at(b, at + 4)) << 32
}

fn euid() -> u32 {
    // SAFETY: `geteuid` takes nothing and cannot fail.
    unsafe { libc::geteuid() }
}

/// A producer's tensor of `N` floats of [`pattern`] in a fresh allocation, owned by a counted
/// owner that frees it.
fn produce(a: &Arc<CudaStream>, counter: &DropCounter) -> Result<tensorbridge_core::Tensor> {
    let alloc = RawAlloc::new(a.context(), N * 4)?;
    from_host(a, alloc.ptr, &pattern(N))?;
    let ptr = alloc.ptr;
    let owner: Owner = counter.owner_with(alloc);
    // SAFETY: the owner keeps the allocation of `N` floats; `a` outlives the tensor.
    unsafe {
        tensor_at(
            ptr,
            N,
            0,
            owner,
            Ready::Stream(tensorbridge_cuda::stream_of(a)),
        )
    }
}

/// Where the producer of `bytes` keeps its lifetime file: in this version's per-user
/// directory, or (older versions) by name in `/dev/shm` itself; whichever exists.
fn lifetime_file(bytes: &[u8]) -> Option<std::path::PathBuf> {
    let (uid, pid, nonce) = (u32_at(bytes, UID), u32_at(bytes, PID), u64_at(bytes, NONCE));
    [
        format!("/dev/shm/tensorbridge-{uid}/ipc-{pid}-{nonce:016x}"),
        format!("/dev/shm/tensorbridge-ipc-{uid}-{pid}-{nonce:016x}"),
    ]
    .into_iter()
    .map(std::path::PathBuf::from)
    .find(|p| p.exists())
}

fn outcome(r: Result<tensorbridge_core::Tensor, tensorbridge_cuda::Error>) -> String {
    match r {
        Ok(t) => format!("opened {} elements", t.numel()),
        Err(e) => format!("{e}"),
    }
}

// ---- the child process ----

/// The child's roles (`trust-<role>`).
pub(crate) fn child(role: &str, io: &Io) -> Result<()> {
    let ctx = context(0)?;
    let c = ctx.new_stream()?;
    io.say("ready", &1);
    match role {
        // Holds the share, then opens it again claiming a 64 GiB allocation and a view of all
        // of it: past what any driver maps for these 16 KiB, whatever it rounds up to.
        "cachehit" => {
            let bytes = io.handle()?;
            let held = ipc::import(&IpcHandle::from_bytes(&bytes)?, &c)?;
            let edited = altered(
                &altered(&bytes, ALLOC_SIZE, &(1u64 << 36).to_le_bytes()),
                SHAPE,
                &(1i64 << 34).to_le_bytes(),
            );
            let again = IpcHandle::from_bytes(&edited).and_then(|h| ipc::import(&h, &c));
            io.say("edited", &outcome(again));
            drop(held);
        }
        // An open that fails after registering (a memory handle the driver never made), then
        // the genuine handle.
        "ticket" => {
            let bytes = io.handle()?;
            let bad = altered(&bytes, 112, &[0x5a; 64]);
            let first = IpcHandle::from_bytes(&bad).and_then(|h| ipc::import(&h, &c));
            io.say("first", &outcome(first));
            let second = IpcHandle::from_bytes(&bytes).and_then(|h| ipc::import(&h, &c));
            io.say("second", &outcome(second));
        }
        "open" => {
            let bytes = io.handle()?;
            let r = IpcHandle::from_bytes(&bytes).and_then(|h| ipc::import(&h, &c));
            io.say("result", &outcome(r));
        }
        // A fresh producer process (its first share makes a lifetime file).
        "share" => {
            let counter = DropCounter::new();
            let t = produce(&c, &counter)?;
            let shared = ipc::export(&t, 0)?;
            io.say("shared", &shared.handle().as_bytes().len());
        }
        // A producer that stays until told `done`; on `consume`, a consumer of its own
        // namespace (a child it starts) opens the share.
        "nsproducer" => {
            let counter = DropCounter::new();
            let t = produce(&c, &counter)?;
            let shared = ipc::export(&t, 1)?;
            drop(t);
            let bytes = hex(shared.handle().as_bytes());
            io.say("handle", &bytes);
            io.say("pid", &std::process::id());
            loop {
                match io.line()?.as_str() {
                    "consume" => {
                        let mut consumer = crate::Peer::spawn("trust-open", &[])?;
                        consumer.send(&bytes)?;
                        let result = consumer.expect("result")?;
                        consumer.finish()?;
                        io.say("consumed", &result);
                    }
                    "done" | "" => break,
                    other => bail!("unknown command {other:?}"),
                }
            }
            drop(shared);
        }
        other => bail!("unknown role trust-{other}"),
    }
    Ok(())
}

// ---- the tests ----

#[test]
fn a_handle_edited_after_its_share_is_held_is_checked_against_the_mapping() -> Result<()> {
    let _serial = serial();
    let ctx = context(0)?;
    let a = ctx.new_stream()?;
    let counter = DropCounter::new();
    let t = produce(&a, &counter)?;
    let shared = ipc::export(&t, 0)?;
    drop(t);
    let mut peer = Peer::spawn("trust-cachehit", &[])?;
    peer.send(&hex(shared.handle().as_bytes()))?;
    let edited = peer.expect("edited")?;
    peer.finish()?;
    ensure!(
        edited.contains("allocation size"),
        "a held share's edited handle was not checked: {edited}"
    );
    drop(shared);
    ensure!(eventually(|| counter.drops() == 1), "never released");
    Ok(())
}

#[test]
fn a_failed_open_gives_its_ticket_back() -> Result<()> {
    let _serial = serial();
    let ctx = context(0)?;
    let a = ctx.new_stream()?;
    let counter = DropCounter::new();
    let t = produce(&a, &counter)?;
    // One expected consumer, the producer's handle gone: only the ticket lets it in.
    let shared = ipc::export(&t, 1)?;
    let bytes = shared.handle().as_bytes().to_vec();
    drop((t, shared));
    let mut peer = Peer::spawn("trust-ticket", &[])?;
    peer.send(&hex(&bytes))?;
    let first = peer.expect("first")?;
    let second = peer.expect("second")?;
    peer.finish()?;
    ensure!(
        !first.starts_with("opened"),
        "the bad handle opened: {first}"
    );
    ensure!(
        second.starts_with("opened"),
        "the failed open cost the consumer its ticket: {second}"
    );
    ensure!(eventually(|| counter.drops() == 1), "never released");
    Ok(())
}

#[test]
fn another_users_lifetime_file_and_handle_are_never_used() -> Result<()> {
    if euid() != 0 {
        println!("skipped: planting another user's file needs root");
        return Ok(());
    }
    let _serial = serial();
    let ctx = context(0)?;
    let a = ctx.new_stream()?;
    let counter = DropCounter::new();
    let t = produce(&a, &counter)?;
    let shared = ipc::export(&t, 0)?;
    drop(t);
    let genuine = shared.handle().as_bytes().to_vec();
    // The handle says user 65534 made the share, whose (planted) file is well formed: the
    // format older versions read, open and ready for a consumer.
    let other = 65534u32;
    let bytes = altered(&genuine, UID, &other.to_le_bytes());
    let (pid, nonce) = (u32_at(&bytes, PID), u64_at(&bytes, NONCE));
    let slot = u32_at(&bytes, SLOT) as usize;
    let planted = format!("/dev/shm/tensorbridge-ipc-{other}-{pid}-{nonce:016x}");
    let mut file = vec![0u8; 64 + 1024 * 256];
    file[..8].copy_from_slice(b"TBIPCLF1");
    file[8..12].copy_from_slice(&1u32.to_le_bytes());
    file[12..16].copy_from_slice(&1024u32.to_le_bytes());
    file[16..20].copy_from_slice(&pid.to_le_bytes());
    file[20..24].copy_from_slice(&other.to_le_bytes());
    file[24..32].copy_from_slice(&u64_at(&bytes, START).to_le_bytes());
    file[32..40].copy_from_slice(&nonce.to_le_bytes());
    let word = u64_at(&bytes, GENERATION) << 24 | 1 << 23;
    file[64 + slot * 256..72 + slot * 256].copy_from_slice(&word.to_le_bytes());
    std::fs::write(&planted, &file)?;
    std::os::unix::fs::chown(&planted, Some(other), Some(other))?;
    let mut peer = Peer::spawn("trust-open", &[])?;
    peer.send(&hex(&bytes))?;
    let result = peer.expect("result")?;
    peer.finish()?;
    let _ = std::fs::remove_file(&planted);
    ensure!(
        result.contains("made by user 65534"),
        "another user's share was used: {result}"
    );
    drop(shared);
    ensure!(eventually(|| counter.drops() == 1), "never released");
    Ok(())
}

/// Makes a FIFO at `path` (owned by `owner` when given).
fn mkfifo(path: &str, owner: Option<u32>) -> Result<()> {
    let c = std::ffi::CString::new(path)?;
    // SAFETY: a NUL-terminated path, live for the call.
    if unsafe { libc::mkfifo(c.as_ptr(), 0o600) } != 0 {
        bail!("mkfifo {path}: {}", std::io::Error::last_os_error());
    }
    if let Some(uid) = owner {
        std::os::unix::fs::chown(path, Some(uid), Some(uid))?;
    }
    Ok(())
}

#[test]
fn a_fifo_planted_where_lifetime_files_live_hangs_no_producer() -> Result<()> {
    let _serial = serial();
    let uid = euid();
    // Where older versions scanned (anyone may create names in /dev/shm: as root, the FIFO is
    // another user's), and in this version's own directory (only this user can).
    let old = format!("/dev/shm/tensorbridge-ipc-{uid}-1-00000000000000f1");
    mkfifo(&old, (uid == 0).then_some(65534))?;
    let dir = format!("/dev/shm/tensorbridge-{uid}");
    let new = format!("{dir}/ipc-1-00000000000000f1");
    let planted_new = std::path::Path::new(&dir).is_dir() && mkfifo(&new, None).is_ok();
    let started = Instant::now();
    let peer = Peer::spawn("trust-share", &[]);
    let shared = peer.and_then(|p| {
        let said = p.expect("shared");
        drop(p);
        said
    });
    let _ = std::fs::remove_file(&old);
    if planted_new {
        let _ = std::fs::remove_file(&new);
    }
    ensure!(
        shared.is_ok() && started.elapsed() < Duration::from_secs(30),
        "a producer hung on a planted FIFO: {shared:?}"
    );
    Ok(())
}

#[test]
fn a_lifetime_file_shrunk_under_a_live_share_kills_no_one() -> Result<()> {
    let _serial = serial();
    let ctx = context(0)?;
    let a = ctx.new_stream()?;
    let counter = DropCounter::new();
    let t = produce(&a, &counter)?;
    let shared = ipc::export(&t, 1)?;
    drop(t);
    let bytes = shared.handle().as_bytes().to_vec();
    let mut peer = Peer::spawn("hold", &[])?;
    peer.send(&hex(&bytes))?;
    peer.expect("held")?;
    let Some(path) = lifetime_file(&bytes) else {
        bail!("no lifetime file for the share");
    };
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)?
        .set_len(0)?;
    // The consumer releases (and exits) with the file shrunk; the producer collects.
    peer.send("release")?;
    let status = peer.wait()?;
    ensure!(status.success(), "the consumer died: {status}");
    drop(shared);
    ensure!(
        eventually(|| counter.drops() == 1),
        "never released once the holder let go"
    );
    Ok(())
}

#[test]
fn a_forked_child_dropping_the_share_revokes_nothing() -> Result<()> {
    let _serial = serial();
    let ctx = context(0)?;
    let a = ctx.new_stream()?;
    let counter = DropCounter::new();
    let t = produce(&a, &counter)?;
    // Openable only while the producer's handle lives.
    let shared = ipc::export(&t, 0)?;
    drop(t);
    // SAFETY: the child only drops its copy of the share and `_exit`s.
    let pid = unsafe { libc::fork() };
    ensure!(pid >= 0, "fork failed");
    if pid == 0 {
        // The child's copy of the producer's handle (its last reference there) goes.
        drop(shared);
        // SAFETY: ends the child at once.
        unsafe { libc::_exit(0) };
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut status = 0;
    loop {
        // SAFETY: `pid` is our child; `status` a live local.
        if unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } == pid {
            break;
        }
        if Instant::now() > deadline {
            // SAFETY: our child, not reaped yet.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            bail!("the forked child hung dropping its copy of the share");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut peer = Peer::spawn("hold", &[])?;
    peer.send(&hex(shared.handle().as_bytes()))?;
    let held = peer.expect("held");
    if held.is_ok() {
        peer.send("release")?;
        peer.finish()?;
    }
    ensure!(held.is_ok(), "the child's drop revoked the share: {held:?}");
    drop(shared);
    ensure!(eventually(|| counter.drops() == 1), "never released");
    Ok(())
}

#[test]
fn the_producer_removes_its_lifetime_file_with_its_last_share() -> Result<()> {
    let _serial = serial();
    let ctx = context(0)?;
    let a = ctx.new_stream()?;
    let counter = DropCounter::new();
    let t = produce(&a, &counter)?;
    let shared = ipc::export(&t, 0)?;
    drop(t);
    let bytes = shared.handle().as_bytes().to_vec();
    let Some(path) = lifetime_file(&bytes) else {
        bail!("no lifetime file for a live share");
    };
    drop(shared);
    ensure!(eventually(|| counter.drops() == 1), "never released");
    // Every share of this process (the tests run one at a time and release theirs) is freed.
    ensure!(
        eventually(|| !path.exists()),
        "{} outlived the last share in it",
        path.display()
    );
    Ok(())
}

/// The design choice the share's cost rests on: a file whose last share was freed stays a
/// moment for the next share (making one is a dozen system calls and a directory scan).
#[test]
fn the_next_share_reuses_the_idle_lifetime_file() -> Result<()> {
    let _serial = serial();
    let ctx = context(0)?;
    let a = ctx.new_stream()?;
    let counter = DropCounter::new();
    let t = produce(&a, &counter)?;
    let first = ipc::export(&t, 0)?;
    let Some(path) = lifetime_file(first.handle().as_bytes()) else {
        bail!("no lifetime file for a live share");
    };
    drop(first);
    ipc::collect();
    let second = ipc::export(&t, 0)?;
    assert_eq!(
        lifetime_file(second.handle().as_bytes()),
        Some(path.clone()),
        "the second share made a new lifetime file instead of reusing the idle one"
    );
    drop(second);
    drop(t);
    ensure!(eventually(|| counter.drops() == 1), "never released");
    ensure!(
        eventually(|| !path.exists()),
        "{} outlived its linger after the last share in it",
        path.display()
    );
    Ok(())
}

/// Whether this process may make PID namespaces (`unshare --pid`: root, util-linux).
fn pid_namespaces() -> bool {
    euid() == 0
        && std::process::Command::new("unshare")
            .args(["--pid", "--fork", "--", "true"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
}

#[test]
fn a_producer_in_another_pid_namespace_is_alive_here() -> Result<()> {
    if !pid_namespaces() {
        println!("skipped: making a PID namespace needs root and unshare(1)");
        return Ok(());
    }
    let _serial = serial();
    // The producer: a process of a PID namespace of its own, sharing this machine's
    // `/dev/shm` (as containers that share it but not their process ids do), under a pid that
    // names no process here (low pids always do: init and the kernel's threads).
    let inner = (20_000..32_000)
        .find(|p| !std::path::Path::new(&format!("/proc/{p}")).exists())
        .context("every pid from 20000 to 32000 is in use here")?;
    let set_pid = format!(
        "echo {} > /proc/sys/kernel/ns_last_pid && \"$@\"; exit $?",
        inner - 1
    );
    let wrapper = [
        "unshare",
        "--pid",
        "--fork",
        // The namespace's first process goes with unshare (a failed test kills unshare).
        "--kill-child",
        "--mount-proc",
        "sh",
        "-c",
        set_pid.as_str(),
        "sh",
    ];
    let mut producer = Peer::spawn_wrapped(&wrapper, "trust-nsproducer", &[])?;
    let bytes = crate::unhex(&producer.expect("handle")?);
    let said: u32 = producer.expect("pid")?.parse()?;
    ensure!(
        u32_at(&bytes, PID) == inner && said == inner,
        "the producer's pid should be {inner} in its namespace, it said {said}"
    );
    ensure!(
        !std::path::Path::new(&format!("/proc/{inner}")).exists(),
        "pid {inner} came into use here meanwhile: the test proves nothing"
    );
    let Some(path) = lifetime_file(&bytes) else {
        bail!("no lifetime file for the namespaced producer's live share");
    };
    // A fresh producer here (its first share makes a lifetime file, and scans for files of
    // producers that are gone): the namespaced producer's pid names no process of its here,
    // which older versions took for dead.
    let here = Peer::spawn("trust-share", &[])?;
    here.expect("shared")?;
    here.finish()?;
    ensure!(
        path.exists(),
        "{} (a live producer's) was removed by another namespace's scan",
        path.display()
    );
    // Its own namespace's consumer (a container's processes share one) still opens it.
    producer.send("consume")?;
    let result = producer.expect("consumed")?;
    ensure!(
        result == format!("opened {N} elements"),
        "the share of a producer in another PID namespace was lost: {result}"
    );
    producer.send("done")?;
    producer.finish()?;
    Ok(())
}
