//! Who holds a share: a file the producer and its consumers read and write with `pread` /
//! `pwrite` under byte-range locks, with one slot per share, and liveness told by locks the
//! kernel drops when a process dies. No driver here: only the file, its locks, and `/proc`
//! (for the start time a handle records).
//!
//! # Where, and who may write it
//! `/dev/shm/tensorbridge-<euid>/ipc-<pid>-<nonce>`: a directory per user, made mode `0700`
//! by the first producer of that user and checked on every use (`lstat`, then an
//! `O_DIRECTORY | O_NOFOLLOW` open and `fstat`: a directory, not a link, owned by the caller's
//! effective user, mode exactly `0700`; anything else is refused with a typed error, never
//! followed or repaired). Only that user (and root) can create, rename, truncate or replace
//! anything in it. Every lifetime file is opened `O_RDWR | O_NOFOLLOW | O_NONBLOCK |
//! O_CLOEXEC` relative to the checked directory and then `fstat`ed: a regular file, owned by
//! the caller, mode exactly `0600`, exactly [`FILE_BYTES`] long. A FIFO, a link, a device, a
//! directory, another user's file or a file of another size is refused; no open blocks.
//!
//! The file is never mapped: a mapping of a file another process can shrink raises `SIGBUS`
//! on the next access. Reads and writes are `pread` / `pwrite`; a file shrunk under a live
//! share gives short reads, which are typed errors (consumers) or a slot whose bookkeeping is
//! gone (the producer: it then waits only for the holders' locks, below).
//!
//! # The file
//! A 64-byte header (magic `TBIPCLF2`, version, slot count, producer pid, uid, start time,
//! nonce, all little-endian) and [`SLOTS`] slots of [`SLOT_BYTES`]:
//!
//! | slot offset | bytes | field |
//! |---|---|---|
//! | 0 | 8 | the slot word: generation (40 bits) << 24, `OPEN` (bit 23), tickets (23 bits) |
//! | 8 | 8 | reserved |
//! | 16 + 16 i | 4 | holder i's process id (0: free), for reports only |
//!
//! # Locks (open file description locks, `F_OFD_SETLK`)
//! - **A slot's bytes** are write-locked by whoever changes them, for a few reads and writes
//!   (non-blocking attempts, retried for at most [`LOCK_PATIENCE`]; then a typed error).
//!   Within a process a mutex serialises the threads, which share one description.
//! - **The producer's liveness**: one byte past the file's end ([`LIVE`]), write-locked by the
//!   producer from before the file gets its name until its process exits or it removes the
//!   file. A consumer that finds it unlocked (`F_OFD_GETLK`) knows the producer is gone.
//! - **A holder's liveness**: one byte per slot and holder entry, past the file's end,
//!   write-locked by the consumer process that claimed the entry for as long as it holds the
//!   share. An entry whose lock is free is not held, whatever its bytes say: the kernel drops
//!   a dead process's locks, so no process id, start time or PID namespace is trusted.
//!
//! Locks live with the open file description: a forked child that inherits the descriptor
//! shares them, so a holder (or producer) is alive while the parent or such a child lives.
//! That keeps memory longer, never frees it early. The descriptor is close-on-exec.
//!
//! # The protocol
//! - The producer assigns a slot a fresh generation, `OPEN`, and as many tickets as the share
//!   has expected consumers; it clears `OPEN` when its own handle is dropped.
//! - A consumer process, holding the slot's lock: checks the generation, locks a free holder
//!   entry's liveness byte and writes its pid there, then takes a ticket if one is left; with
//!   none left it may still hold the share while `OPEN` is set, and otherwise gives the entry
//!   back and is refused. An open that fails after this gives its ticket back.
//! - A consumer releases, holding the slot's lock, by clearing its entry (only if it still
//!   names it), then unlocking the entry's liveness byte. In a forked child a release is a
//!   no-op: the hold is its parent's.
//! - The producer frees the share, holding the slot's lock, once the word says neither
//!   `OPEN` nor tickets (or cannot be read: a shrunk file) and no holder entry's liveness
//!   byte is locked. Entries with a pid and no lock are dead holders: cleared and reported.
//! - The producer removes its file a second after the last share in it is freed (kept that
//!   long for its next share); a producer that died
//!   without doing so leaves a file whose liveness byte nobody locks, which the next producer
//!   of the same user removes.

use std::fs::File;
use std::io::{ErrorKind, Read as _};
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::FileExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::wire::{MAX_GENERATION, ProcessId};
use crate::Error;

/// Where the per-user directories live: a tmpfs every process of the machine sees.
pub(crate) const SHM_DIR: &str = "/dev/shm";
const FILE_MAGIC: u64 = u64::from_le_bytes(*b"TBIPCLF2");
const FILE_VERSION: u32 = 2;
const HEADER: usize = 64;
/// Bytes per slot.
pub(crate) const SLOT_BYTES: usize = 256;
/// Consumer processes one share can record at a time.
pub const HOLDERS: usize = 15;
/// Slots per file (a file is 256 KiB of tmpfs, touched only where used).
pub(crate) const SLOTS: u32 = 1024;
/// A lifetime file's exact size.
pub(crate) const FILE_BYTES: usize = HEADER + SLOTS as usize * SLOT_BYTES;
const OPEN: u64 = 1 << 23;
const TICKETS: u64 = OPEN - 1;
/// The most consumers a share may expect (tickets are 23 bits of the slot word).
pub const MAX_CONSUMERS: u32 = TICKETS as u32;
/// The producer's liveness byte; holder `i` of slot `s` locks `LIVE + 16 (s + 1) + i`. Far
/// past the file's end: locks need no bytes behind them.
pub(crate) const LIVE: u64 = 1 << 32;
/// How long a slot's lock is tried for before the operation fails.
pub(crate) const LOCK_PATIENCE: Duration = Duration::from_secs(2);
/// What a lifetime file must be.
const FILE_EXPECTED: &str =
    "a regular file of 262208 bytes, mode 0600, owned by this process's user, made by tensorbridge";
/// What the per-user directory must be.
const DIR_EXPECTED: &str =
    "a directory (not a link) owned by this process's user, mode 0700, that only it can enter";

const _: () = assert!(16 + 16 * HOLDERS <= SLOT_BYTES);
const _: () = assert!(FILE_BYTES == 262_208);

/// The calling process: its id and start time. Read again in a forked child (the cache is
/// keyed by the pid), never inherited.
pub(crate) fn me() -> ProcessId {
    static PID: AtomicU32 = AtomicU32::new(0);
    static START: AtomicU64 = AtomicU64::new(0);
    let pid = std::process::id();
    if PID.load(SeqCst) == pid {
        return ProcessId {
            pid,
            start: START.load(SeqCst),
        };
    }
    let start = start_time(pid).unwrap_or(0);
    START.store(start, SeqCst);
    PID.store(pid, SeqCst);
    ProcessId { pid, start }
}

/// The calling process's effective user id: the owner of the files it makes.
pub(crate) fn uid() -> u32 {
    // SAFETY: `geteuid` takes nothing, cannot fail and touches no memory of ours.
    unsafe { libc::geteuid() }
}

/// Field 22 of `/proc/<pid>/stat`: the start time in clock ticks after boot.
fn start_time(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces and parentheses:
    // fields 3 on start after the last `)`; fields 4 to 21 lie between the state and it.
    let rest = &text[text.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Eight bytes no other process will pick: from the kernel's random source, or failing that
/// from the time and the process id.
fn nonce() -> u64 {
    let mut b = [0u8; 8];
    if File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .is_ok()
    {
        return u64::from_le_bytes(b);
    }
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    super::wire::fnv1a(&[t.to_le_bytes(), u64::from(std::process::id()).to_le_bytes()].concat())
}

/// The per-user directory under `shm`.
pub(crate) fn dir_path(shm: &Path, uid: u32) -> PathBuf {
    shm.join(format!("tensorbridge-{uid}"))
}

/// A lifetime file's name in its directory.
fn file_name(pid: u32, nonce: u64) -> String {
    format!("ipc-{pid}-{nonce:016x}")
}

fn os_error(op: &'static str, path: &Path, e: &std::io::Error) -> Error {
    Error::IpcLifetimeFile {
        op,
        path: path.display().to_string(),
        errno: e.raw_os_error().unwrap_or(libc::EIO),
    }
}

fn refused(path: &Path, found: String, expected: &'static str) -> Error {
    Error::IpcLifetimeFileRefused {
        path: path.display().to_string(),
        found,
        expected,
    }
}

/// A file read error: a short read is a shrunk file.
fn read_error(path: &Path, e: &std::io::Error) -> Error {
    if e.kind() == ErrorKind::UnexpectedEof {
        refused(
            path,
            "shorter than its format (shrunk)".into(),
            FILE_EXPECTED,
        )
    } else {
        os_error("read", path, e)
    }
}

fn c_path(path: &Path) -> Result<std::ffi::CString, Error> {
    std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| refused(path, "a name with a NUL byte".into(), DIR_EXPECTED))
}

/// What `fstat` says of an open descriptor.
fn fstat(fd: &OwnedFd) -> std::io::Result<libc::stat> {
    // SAFETY: an all-zero `stat` is a valid value of a plain C struct of integers.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is open (borrowed for the call); `fstat` writes one struct into `st`.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(st)
}

fn kind_of(mode: u32) -> &'static str {
    match mode & libc::S_IFMT {
        libc::S_IFREG => "a regular file",
        libc::S_IFDIR => "a directory",
        libc::S_IFLNK => "a symbolic link",
        libc::S_IFIFO => "a FIFO",
        libc::S_IFSOCK => "a socket",
        libc::S_IFCHR => "a character device",
        libc::S_IFBLK => "a block device",
        _ => "of an unknown type",
    }
}

/// The per-user directory, opened and checked (made first when `create`). `Ok(None)`: it does
/// not exist and `create` is false.
pub(crate) fn open_dir(shm: &Path, create: bool) -> Result<Option<OwnedFd>, Error> {
    let path = dir_path(shm, uid());
    let c = c_path(&path)?;
    let mut made = false;
    if create {
        // SAFETY: `c` is a NUL-terminated path that lives for the call.
        made = unsafe { libc::mkdir(c.as_ptr(), 0o700) } == 0;
        if !made {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EEXIST) {
                return Err(os_error("create", &path, &e));
            }
        }
    }
    match std::fs::symlink_metadata(&path) {
        Ok(m) if m.file_type().is_symlink() => {
            return Err(refused(&path, "a symbolic link".into(), DIR_EXPECTED));
        }
        Ok(_) => {}
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(os_error("open", &path, &e)),
    }
    // SAFETY: as for `mkdir`; the flags never follow a link, never block, and the descriptor
    // is returned to us alone.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY
                | libc::O_DIRECTORY
                | libc::O_NOFOLLOW
                | libc::O_NONBLOCK
                | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENOENT) => Ok(None),
            Some(libc::ELOOP) => Err(refused(&path, "a symbolic link".into(), DIR_EXPECTED)),
            Some(libc::ENOTDIR) => Err(refused(&path, "not a directory".into(), DIR_EXPECTED)),
            _ => Err(os_error("open", &path, &e)),
        };
    }
    // SAFETY: `fd` was just opened, is valid and owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let st = fstat(&fd).map_err(|e| os_error("open", &path, &e))?;
    if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
        return Err(refused(&path, kind_of(st.st_mode).into(), DIR_EXPECTED));
    }
    if st.st_uid != uid() {
        return Err(refused(
            &path,
            format!("owned by user {}", st.st_uid),
            DIR_EXPECTED,
        ));
    }
    // Made just now, ours, a directory: the umask may have taken bits off `0700`. (Any other
    // mode of a directory found is refused, not repaired.)
    // SAFETY: `fd` is open for the call.
    if made && st.st_mode & 0o7777 != 0o700 && unsafe { libc::fchmod(fd.as_raw_fd(), 0o700) } == 0 {
        return Ok(Some(fd));
    }
    if st.st_mode & 0o7777 != 0o700 {
        return Err(refused(
            &path,
            format!("mode {:04o}", st.st_mode & 0o7777),
            DIR_EXPECTED,
        ));
    }
    Ok(Some(fd))
}

/// Opens `name` in the checked directory `dir` without following a link or blocking, and
/// checks what it is. `Ok(None)` when there is no such entry.
fn open_checked(dir: &OwnedFd, name: &str, path: &Path) -> Result<Option<File>, Error> {
    let c = std::ffi::CString::new(name)
        .map_err(|_| refused(path, "a bad name".into(), FILE_EXPECTED))?;
    // SAFETY: `dir` is an open directory and `c` a NUL-terminated name, both live for the
    // call; the flags never follow a link or block (a FIFO opens at once), and the
    // descriptor is returned to us alone.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c.as_ptr(),
            libc::O_RDWR | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY,
        )
    };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENOENT) => Ok(None),
            Some(libc::ELOOP) => Err(refused(path, "a symbolic link".into(), FILE_EXPECTED)),
            Some(libc::EISDIR) => Err(refused(path, "a directory".into(), FILE_EXPECTED)),
            Some(libc::ENXIO) => Err(refused(path, "a FIFO or socket".into(), FILE_EXPECTED)),
            _ => Err(os_error("open", path, &e)),
        };
    }
    // SAFETY: `fd` was just opened, is valid and owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let st = fstat(&fd).map_err(|e| os_error("open", path, &e))?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(refused(path, kind_of(st.st_mode).into(), FILE_EXPECTED));
    }
    if st.st_uid != uid() {
        return Err(refused(
            path,
            format!("owned by user {}", st.st_uid),
            FILE_EXPECTED,
        ));
    }
    if st.st_mode & 0o7777 != 0o600 {
        return Err(refused(
            path,
            format!("mode {:04o}", st.st_mode & 0o7777),
            FILE_EXPECTED,
        ));
    }
    if st.st_size as u64 != FILE_BYTES as u64 {
        return Err(refused(
            path,
            format!("{} bytes long", st.st_size),
            FILE_EXPECTED,
        ));
    }
    Ok(Some(File::from(fd)))
}

/// `F_OFD_SETLK` (`F_WRLCK` or `F_UNLCK`) or `F_OFD_GETLK` on `len` bytes at `start`.
/// For `F_OFD_GETLK`, `Ok(true)` when another description holds a conflicting lock.
fn ofd(
    file: &File,
    cmd: libc::c_int,
    kind: libc::c_int,
    start: u64,
    len: u64,
) -> std::io::Result<bool> {
    // SAFETY: an all-zero `flock` is a valid value of a plain C struct of integers (`l_pid`
    // must be 0 for OFD locks).
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = start as libc::off_t;
    fl.l_len = len as libc::off_t;
    // SAFETY: `file` is open for the call; `fcntl` reads and (for GETLK) writes `fl`, a live
    // local of the type the command takes.
    if unsafe { libc::fcntl(file.as_raw_fd(), cmd, &mut fl) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(cmd == libc::F_OFD_GETLK && fl.l_type != libc::F_UNLCK as libc::c_short)
}

fn try_lock(file: &File, start: u64) -> std::io::Result<bool> {
    match ofd(file, libc::F_OFD_SETLK, libc::F_WRLCK, start, 1) {
        Ok(_) => Ok(true),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EACCES)) => Ok(false),
        Err(e) => Err(e),
    }
}

fn unlock(file: &File, start: u64, len: u64) {
    let _ = ofd(file, libc::F_OFD_SETLK, libc::F_UNLCK, start, len);
}

/// Whether another open file description holds a lock on the byte at `at`. An error (which
/// `F_OFD_GETLK` on an open file does not give) counts as locked: nothing is freed on a guess.
fn is_locked(file: &File, at: u64) -> bool {
    ofd(file, libc::F_OFD_GETLK, libc::F_WRLCK, at, 1).unwrap_or(true)
}

fn holder_lock(slot: u32, i: usize) -> u64 {
    LIVE + 16 * (u64::from(slot) + 1) + i as u64
}

/// Why a consumer could not hold a share.
#[derive(Clone, Debug)]
pub(crate) enum Refusal {
    /// Another generation now, or neither a ticket left nor the producer's handle alive.
    Released,
    /// Every holder entry is taken by a live process.
    Full,
    /// The file could not be read, written or locked.
    File(Error),
}

/// The header a producer writes at the start of its lifetime file.
fn header_bytes(producer: ProcessId, uid: u32, nonce: u64) -> [u8; HEADER] {
    let mut header = [0u8; HEADER];
    header[..8].copy_from_slice(&FILE_MAGIC.to_le_bytes());
    header[8..12].copy_from_slice(&FILE_VERSION.to_le_bytes());
    header[12..16].copy_from_slice(&SLOTS.to_le_bytes());
    header[16..20].copy_from_slice(&producer.pid.to_le_bytes());
    header[20..24].copy_from_slice(&uid.to_le_bytes());
    header[24..32].copy_from_slice(&producer.start.to_le_bytes());
    header[32..40].copy_from_slice(&nonce.to_le_bytes());
    header
}

/// A lifetime file, open.
pub(crate) struct SlotFile {
    file: File,
    /// Serialises this process's threads (they share one open file description, whose locks
    /// do not exclude each other).
    guard: Mutex<()>,
    pub(crate) path: PathBuf,
    pub(crate) nonce: u64,
    pub(crate) slots: u32,
    /// The producer whose file this is.
    pub(crate) producer: ProcessId,
    /// The per-user directory (the producer's own file: to remove it by name).
    dir: Option<OwnedFd>,
}

impl SlotFile {
    /// Runs `f` holding the lock on `slot`'s bytes (and this process's mutex).
    fn with_slot<R>(&self, slot: u32, f: impl FnOnce() -> Result<R, Error>) -> Result<R, Error> {
        let _g = self.guard.lock().unwrap_or_else(PoisonError::into_inner);
        let start = self.slot_base(slot);
        let len = SLOT_BYTES as u64;
        let deadline = Instant::now() + LOCK_PATIENCE;
        let mut nap = Duration::from_micros(50);
        loop {
            match ofd(&self.file, libc::F_OFD_SETLK, libc::F_WRLCK, start, len) {
                Ok(_) => break,
                Err(e)
                    if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EACCES))
                        && Instant::now() < deadline =>
                {
                    std::thread::sleep(nap);
                    nap = (nap * 2).min(Duration::from_millis(5));
                }
                Err(e) => return Err(os_error("lock", &self.path, &e)),
            }
        }
        let r = f();
        unlock(&self.file, start, len);
        r
    }

    fn slot_base(&self, slot: u32) -> u64 {
        (HEADER + slot as usize * SLOT_BYTES) as u64
    }

    fn read_u64(&self, at: u64) -> Result<u64, Error> {
        let mut b = [0u8; 8];
        self.file
            .read_exact_at(&mut b, at)
            .map_err(|e| read_error(&self.path, &e))?;
        Ok(u64::from_le_bytes(b))
    }

    fn read_u32(&self, at: u64) -> Result<u32, Error> {
        let mut b = [0u8; 4];
        self.file
            .read_exact_at(&mut b, at)
            .map_err(|e| read_error(&self.path, &e))?;
        Ok(u32::from_le_bytes(b))
    }

    fn write(&self, at: u64, bytes: &[u8]) -> Result<(), Error> {
        self.file
            .write_all_at(bytes, at)
            .map_err(|e| os_error("write", &self.path, &e))
    }

    fn word(&self, slot: u32) -> Result<u64, Error> {
        self.read_u64(self.slot_base(slot))
    }

    fn set_word(&self, slot: u32, w: u64) -> Result<(), Error> {
        self.write(self.slot_base(slot), &w.to_le_bytes())
    }

    fn holder_at(&self, slot: u32, i: usize) -> u64 {
        self.slot_base(slot) + 16 + 16 * i as u64
    }

    /// A new file for this process's shares in the per-user directory under `SHM_DIR`.
    pub(crate) fn create() -> Result<SlotFile, Error> {
        Self::create_in(Path::new(SHM_DIR))
    }

    /// A new file for this process's shares in the per-user directory under `shm`. Removes,
    /// first, the files of this user's producers that have exited (a crashed producer cannot
    /// remove its own). The file gets its name only once it is complete and its liveness byte
    /// locked, so no other producer's scan takes it for a dead one.
    pub(crate) fn create_in(shm: &Path) -> Result<SlotFile, Error> {
        let dir = open_dir(shm, true)?.ok_or_else(|| {
            os_error(
                "create",
                &dir_path(shm, uid()),
                &std::io::Error::from_raw_os_error(libc::ENOENT),
            )
        })?;
        remove_stale(&dir, &dir_path(shm, uid()));
        let me = me();
        let uid = uid();
        let nonce = nonce();
        let name = file_name(me.pid, nonce);
        let path = dir_path(shm, uid).join(&name);
        let tmp = format!("new-{}-{nonce:016x}", me.pid);
        let c_tmp = std::ffi::CString::new(tmp.as_str())
            .map_err(|_| refused(&path, "a bad name".into(), FILE_EXPECTED))?;
        let c_name = std::ffi::CString::new(name.as_str())
            .map_err(|_| refused(&path, "a bad name".into(), FILE_EXPECTED))?;
        // SAFETY: `dir` is an open directory and `c_tmp` a NUL-terminated name, live for the
        // call; `O_EXCL` makes a new file (never an existing one, never through a link).
        let fd = unsafe {
            libc::openat(
                dir.as_raw_fd(),
                c_tmp.as_ptr(),
                libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                0o600 as libc::c_uint,
            )
        };
        if fd < 0 {
            return Err(os_error("create", &path, &std::io::Error::last_os_error()));
        }
        // SAFETY: `fd` was just opened, is valid and owned by nothing else.
        let file = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        let unlink_tmp = || {
            // SAFETY: as for `openat`; removes only the name this call made.
            unsafe { libc::unlinkat(dir.as_raw_fd(), c_tmp.as_ptr(), 0) };
        };
        let made = (|| {
            // The umask may have taken bits off: exactly 0600, as every opener checks.
            // SAFETY: `file` is open for the call.
            if unsafe { libc::fchmod(file.as_raw_fd(), 0o600) } != 0 {
                return Err(os_error("create", &path, &std::io::Error::last_os_error()));
            }
            file.set_len(FILE_BYTES as u64)
                .map_err(|e| os_error("size", &path, &e))?;
            if !try_lock(&file, LIVE).map_err(|e| os_error("lock", &path, &e))? {
                return Err(os_error(
                    "lock",
                    &path,
                    &std::io::Error::from_raw_os_error(libc::EAGAIN),
                ));
            }
            let header = header_bytes(me, uid, nonce);
            file.write_all_at(&header, 0)
                .map_err(|e| os_error("write", &path, &e))?;
            // SAFETY: both names are NUL-terminated and live; both relative to `dir`.
            if unsafe {
                libc::renameat(
                    dir.as_raw_fd(),
                    c_tmp.as_ptr(),
                    dir.as_raw_fd(),
                    c_name.as_ptr(),
                )
            } != 0
            {
                return Err(os_error("create", &path, &std::io::Error::last_os_error()));
            }
            Ok(())
        })();
        if let Err(e) = made {
            unlink_tmp();
            return Err(e);
        }
        Ok(SlotFile {
            file,
            guard: Mutex::new(()),
            path,
            nonce,
            slots: SLOTS,
            producer: me,
            dir: Some(dir),
        })
    }

    /// Opens the lifetime file of `producer`'s share (a consumer), under `SHM_DIR`.
    pub(crate) fn open(
        producer: ProcessId,
        uid: u32,
        nonce: u64,
    ) -> Result<Option<SlotFile>, Error> {
        Self::open_in(Path::new(SHM_DIR), producer, uid, nonce)
    }

    /// Opens the lifetime file of `producer`'s share under `shm`. `Ok(None)` when there is no
    /// such file; errors for another user's share, a directory or file that is not what this
    /// crate makes, or a header that is not what the handle says.
    pub(crate) fn open_in(
        shm: &Path,
        producer: ProcessId,
        uid: u32,
        nonce: u64,
    ) -> Result<Option<SlotFile>, Error> {
        if uid != self::uid() {
            return Err(Error::IpcOtherUser {
                handle_uid: uid,
                uid: self::uid(),
            });
        }
        let Some(dir) = open_dir(shm, false)? else {
            return Ok(None);
        };
        let name = file_name(producer.pid, nonce);
        let path = dir_path(shm, uid).join(&name);
        let Some(file) = open_checked(&dir, &name, &path)? else {
            return Ok(None);
        };
        let mut header = [0u8; HEADER];
        file.read_exact_at(&mut header, 0)
            .map_err(|e| read_error(&path, &e))?;
        let u32_at =
            |o: usize| u32::from_le_bytes([header[o], header[o + 1], header[o + 2], header[o + 3]]);
        let u64_at = |o: usize| u64::from(u32_at(o)) | u64::from(u32_at(o + 4)) << 32;
        let same = u64_at(0) == FILE_MAGIC
            && u32_at(8) == FILE_VERSION
            && u32_at(12) == SLOTS
            && u32_at(16) == producer.pid
            && u32_at(20) == uid
            && u64_at(24) == producer.start
            && u64_at(32) == nonce;
        if !same {
            return Err(refused(
                &path,
                "a header other than the handle's producer wrote".into(),
                FILE_EXPECTED,
            ));
        }
        Ok(Some(SlotFile {
            file,
            guard: Mutex::new(()),
            path,
            nonce,
            slots: SLOTS,
            producer,
            dir: None,
        }))
    }

    /// Whether the file still has its format's size and the header its producer wrote (a
    /// consumer refuses any other): the producer puts no new share in a file that was
    /// shrunk, grown or written over (an idle file is kept for the next share: this is what
    /// keeps a damaged one from being reused).
    pub(crate) fn intact(&self) -> bool {
        let mut header = [0u8; HEADER];
        self.file
            .metadata()
            .is_ok_and(|m| m.len() == FILE_BYTES as u64)
            && self.file.read_exact_at(&mut header, 0).is_ok()
            && header == header_bytes(self.producer, uid(), self.nonce)
    }

    /// Whether the producer still holds its liveness lock (its process, or a forked child of
    /// it holding the same descriptor, lives and has not removed the file).
    pub(crate) fn producer_alive(&self) -> bool {
        is_locked(&self.file, LIVE)
    }

    // ---- the producer ----

    /// Gives `slot` to a new share: `generation`, `OPEN`, `tickets`, no holders.
    pub(crate) fn assign(&self, slot: u32, generation: u64, tickets: u32) -> Result<(), Error> {
        debug_assert!(generation <= MAX_GENERATION && u64::from(tickets) <= TICKETS);
        self.with_slot(slot, || {
            let mut bytes = [0u8; SLOT_BYTES];
            bytes[..8]
                .copy_from_slice(&(generation << 24 | OPEN | u64::from(tickets)).to_le_bytes());
            self.write(self.slot_base(slot), &bytes)
        })
    }

    /// The producer's handle is gone: no consumer without a ticket may hold the share now.
    /// Best effort: [`SlotFile::is_released`] clears `OPEN` again for a closed share.
    pub(crate) fn close(&self, slot: u32, generation: u64) {
        let _ = self.with_slot(slot, || {
            let w = self.word(slot)?;
            if w >> 24 == generation {
                self.set_word(slot, w & !OPEN)?;
            }
            Ok(())
        });
    }

    /// The tickets left (expected consumers that have not opened the share yet); 0 when the
    /// file cannot say.
    pub(crate) fn tickets(&self, slot: u32) -> u32 {
        self.with_slot(slot, || self.word(slot))
            .map_or(0, |w| (w & TICKETS) as u32)
    }

    /// Whether the closed share `(slot, generation)` may be freed: no `OPEN`, no tickets (or a
    /// word that cannot be read or names another generation: the bookkeeping is gone, and no
    /// consumer can take a ticket from it either), and no holder entry's liveness byte locked.
    /// Dead holders (a pid, no lock) are cleared and their pids pushed onto `dead`. Once
    /// released, the slot's word is cleared: no later open finds the share. `false` when the
    /// slot's lock cannot be had (asked again later).
    pub(crate) fn is_released(&self, slot: u32, generation: u64, dead: &mut Vec<u32>) -> bool {
        self.with_slot(slot, || {
            if let Ok(w) = self.word(slot)
                && w >> 24 == generation
            {
                if w & OPEN != 0 {
                    let _ = self.set_word(slot, w & !OPEN);
                }
                if w & TICKETS != 0 {
                    return Ok(false);
                }
            }
            let mut held = false;
            for i in 0..HOLDERS {
                if is_locked(&self.file, holder_lock(slot, i)) {
                    held = true;
                    continue;
                }
                if let Ok(pid) = self.read_u32(self.holder_at(slot, i))
                    && pid != 0
                {
                    dead.push(pid);
                    let _ = self.write(self.holder_at(slot, i), &0u32.to_le_bytes());
                }
            }
            if !held {
                let _ = self.set_word(slot, 0);
            }
            Ok(!held)
        })
        .unwrap_or(false)
    }

    /// Removes the file's name (the producer, once no share in it is left).
    pub(crate) fn remove(&self) {
        if let Some(dir) = &self.dir
            && let Some(name) = self.path.file_name()
            && let Ok(c) = std::ffi::CString::new(name.as_bytes())
        {
            // SAFETY: `dir` is open and `c` NUL-terminated, both live for the call.
            unsafe { libc::unlinkat(dir.as_raw_fd(), c.as_ptr(), 0) };
        }
    }

    // ---- a consumer ----

    /// Holds the share `(slot, generation)` for the calling process (one entry per process
    /// and share: the caller keeps the result and shares it among its opens).
    pub(crate) fn register(
        self: &Arc<Self>,
        slot: u32,
        generation: u64,
        dead: &mut Vec<u32>,
    ) -> Result<Registration, Refusal> {
        let out = self.with_slot(slot, || {
            let w = self.word(slot)?;
            if w >> 24 != generation {
                return Ok(Err(Refusal::Released));
            }
            let mut index = self.claim(slot)?;
            if index.is_none() {
                // Full: take back the entries of dead processes, then try once more.
                // This process's own entries are never taken: its own locks are invisible to
                // `F_OFD_GETLK` on its own description, and it is alive.
                let mine = std::process::id();
                for i in 0..HOLDERS {
                    if !is_locked(&self.file, holder_lock(slot, i))
                        && let Ok(pid) = self.read_u32(self.holder_at(slot, i))
                        && pid != 0
                        && pid != mine
                    {
                        dead.push(pid);
                        self.write(self.holder_at(slot, i), &0u32.to_le_bytes())?;
                    }
                }
                index = self.claim(slot)?;
            }
            let Some(index) = index else {
                return Ok(Err(Refusal::Full));
            };
            let give_back = |r: Refusal| -> Result<Result<(u32, usize, bool), Refusal>, Error> {
                let _ = self.write(self.holder_at(slot, index), &0u32.to_le_bytes());
                unlock(&self.file, holder_lock(slot, index), 1);
                Ok(Err(r))
            };
            if w & TICKETS != 0 {
                if let Err(e) = self.set_word(slot, w - 1) {
                    return give_back(Refusal::File(e));
                }
                Ok(Ok((slot, index, true)))
            } else if w & OPEN != 0 {
                Ok(Ok((slot, index, false)))
            } else {
                give_back(Refusal::Released)
            }
        });
        match out {
            Err(e) => Err(Refusal::File(e)),
            Ok(Err(r)) => Err(r),
            Ok(Ok((slot, index, ticket))) => Ok(Registration {
                file: self.clone(),
                slot,
                generation,
                index,
                ticket: ticket.into(),
                pid: std::process::id(),
            }),
        }
    }

    /// A free entry of `slot`, claimed: its liveness byte locked, this process's pid written.
    /// Called holding the slot's lock.
    fn claim(&self, slot: u32) -> Result<Option<usize>, Error> {
        for i in 0..HOLDERS {
            let at = self.holder_at(slot, i);
            if self.read_u32(at)? != 0 || is_locked(&self.file, holder_lock(slot, i)) {
                continue;
            }
            if try_lock(&self.file, holder_lock(slot, i))
                .map_err(|e| os_error("lock", &self.path, &e))?
            {
                if let Err(e) = self.write(at, &std::process::id().to_le_bytes()) {
                    unlock(&self.file, holder_lock(slot, i), 1);
                    return Err(e);
                }
                return Ok(Some(i));
            }
        }
        Ok(None)
    }

    /// Takes a ticket of `(slot, generation)` without a holder entry (an open in the
    /// producer's own process, which holds the memory through the tensor itself). `Ok(true)`
    /// when a ticket was taken, `Ok(false)` when the share was open without one.
    pub(crate) fn take_ticket(&self, slot: u32, generation: u64) -> Result<bool, Refusal> {
        self.with_slot(slot, || {
            let w = self.word(slot)?;
            Ok(if w >> 24 != generation {
                Err(Refusal::Released)
            } else if w & TICKETS != 0 {
                self.set_word(slot, w - 1)?;
                Ok(true)
            } else if w & OPEN != 0 {
                Ok(false)
            } else {
                Err(Refusal::Released)
            })
        })
        .unwrap_or_else(|e| Err(Refusal::File(e)))
    }

    /// Gives back a ticket taken by an open that then failed (best effort: nothing is given
    /// when the share has moved on).
    pub(crate) fn return_ticket(&self, slot: u32, generation: u64) {
        let _ = self.with_slot(slot, || {
            let w = self.word(slot)?;
            if w >> 24 == generation && w & TICKETS < TICKETS {
                self.set_word(slot, w + 1)?;
            }
            Ok(())
        });
    }

    /// The pids recorded in `slot`'s holder entries whose liveness byte is locked.
    pub(crate) fn holders(&self, slot: u32) -> Vec<u32> {
        self.with_slot(slot, || {
            Ok((0..HOLDERS)
                .filter(|&i| is_locked(&self.file, holder_lock(slot, i)))
                .filter_map(|i| self.read_u32(self.holder_at(slot, i)).ok())
                .filter(|&p| p != 0)
                .collect())
        })
        .unwrap_or_default()
    }
}

/// A consumer process's hold on one share; dropping it gives the holder entry back (in the
/// process that made it only: a forked child's drop changes nothing).
pub(crate) struct Registration {
    file: Arc<SlotFile>,
    slot: u32,
    generation: u64,
    index: usize,
    /// Whether this hold took a ticket not yet given back by [`Registration::cancel`].
    ticket: std::sync::atomic::AtomicBool,
    /// The process that registered.
    pid: u32,
}

impl Registration {
    /// Whether the producer of the share held is still alive.
    pub(crate) fn producer_alive(&self) -> bool {
        self.file.producer_alive()
    }

    /// The producer of the share held.
    pub(crate) fn producer(&self) -> ProcessId {
        self.file.producer
    }

    /// The open this hold was made for failed: the ticket it took goes back (the entry goes
    /// back when the hold is dropped).
    pub(crate) fn cancel(&self) {
        if self.pid == std::process::id() && self.ticket.swap(false, SeqCst) {
            self.file.return_ticket(self.slot, self.generation);
        }
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        if self.pid != std::process::id() {
            // A forked child: the hold, and the lock (shared with the parent's description),
            // are the parent's.
            return;
        }
        let at = self.file.holder_at(self.slot, self.index);
        let lock = holder_lock(self.slot, self.index);
        // The entry and its lock go together, holding the slot's lock and this process's
        // mutex: no other thread of this process claims the entry in between.
        let done = self.file.with_slot(self.slot, || {
            if self.file.read_u32(at).ok() == Some(self.pid) {
                let _ = self.file.write(at, &0u32.to_le_bytes());
            }
            unlock(&self.file.file, lock, 1);
            Ok(())
        });
        if done.is_err() {
            // The slot's lock could not be had: the lock goes anyway (an entry with a pid and
            // no lock is a released one to every reader).
            unlock(&self.file.file, lock, 1);
        }
    }
}

/// Removes the lifetime files in the checked per-user directory `dir` whose producer's
/// liveness byte nobody locks (the producer exited without removing it). Opens never block
/// or follow links; anything that is not a well-formed lifetime file is left alone.
fn remove_stale(dir: &OwnedFd, dir_path: &Path) {
    // The listing only gives names: each is opened relative to the checked descriptor.
    let Ok(entries) = std::fs::read_dir(dir_path) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else {
            continue;
        };
        if !name.starts_with("ipc-") {
            continue;
        }
        let full = dir_path.join(name);
        let Ok(Some(file)) = open_checked(dir, name, &full) else {
            continue;
        };
        let mut magic = [0u8; 8];
        if file.read_exact_at(&mut magic, 0).is_err() || u64::from_le_bytes(magic) != FILE_MAGIC {
            continue;
        }
        if !is_locked(&file, LIVE)
            && let Ok(c) = std::ffi::CString::new(name)
        {
            // SAFETY: `dir` is open and `c` NUL-terminated, both live for the call.
            unsafe { libc::unlinkat(dir.as_raw_fd(), c.as_ptr(), 0) };
        }
    }
}

#[cfg(test)]
mod tests;
