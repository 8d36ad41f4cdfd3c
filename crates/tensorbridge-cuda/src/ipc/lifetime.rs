//! Who holds a share: a file in `/dev/shm` that the producer and its consumers map, with one
//! slot per share, and the process identities that tell a live holder from a dead one. No
//! driver here: only the file, atomics in it, and `/proc`.
//!
//! # The file
//! `/dev/shm/tensorbridge-ipc-<uid>-<pid>-<nonce>` (mode 0600: only the producer's user
//! opens it), made by the producer when it first shares, mapped by every consumer that opens
//! one of its shares. A 64-byte header (magic `TBIPCLF1`, version, slot count, producer pid,
//! uid, start time, nonce) and [`SLOTS`] slots of [`SLOT_BYTES`]:
//!
//! | slot offset | bytes | field |
//! |---|---|---|
//! | 0 | 8 | the slot word: generation (40 bits) << 24, `OPEN` (bit 23), tickets (23 bits) |
//! | 8 | 8 | reserved |
//! | 16 + 16 i | 4 | holder i's process id (0: free) |
//! | 24 + 16 i | 8 | holder i's start time, with bit 63 set once written (0: being claimed) |
//!
//! # The protocol
//! - The producer assigns a slot a fresh generation, `OPEN`, and as many tickets as the share
//!   has expected consumers; it clears `OPEN` when its own handle is dropped.
//! - A consumer process claims a free holder entry (compare-and-swap of its pid into a 0),
//!   writes its start time, then, in one compare-and-swap on the slot word that also checks
//!   the generation, takes a ticket if one is left; with none left it may still hold the share
//!   while `OPEN` is set, and otherwise gives the entry back and is refused. Every access is
//!   sequentially consistent: a producer that has seen the last ticket taken sees the holder
//!   that took it.
//! - A consumer releases by writing 0 to its entry's start time, then to its pid.
//! - The producer frees the share once the word says neither `OPEN` nor tickets and no
//!   holder is alive. A holder whose process has exited (or whose pid now names a process
//!   that started at another time) is dead: its entry is taken back with two
//!   compare-and-swaps (start time, then pid) and reported.

use std::fs::{File, OpenOptions};
use std::io::Read as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::os::unix::io::AsRawFd as _;
use std::path::PathBuf;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, OnceLock};

use super::wire::{MAX_GENERATION, ProcessId};
use crate::Error;

/// Where lifetime files live: a tmpfs every process of the machine sees.
pub(crate) const SHM_DIR: &str = "/dev/shm";
const FILE_MAGIC: u64 = u64::from_le_bytes(*b"TBIPCLF1");
const FILE_VERSION: u32 = 1;
const HEADER: usize = 64;
/// Bytes per slot.
pub(crate) const SLOT_BYTES: usize = 256;
/// Consumer processes one share can record at a time.
pub const HOLDERS: usize = 15;
/// Slots per file (a file is 256 KiB of tmpfs, touched only where used).
pub(crate) const SLOTS: u32 = 1024;
const OPEN: u64 = 1 << 23;
const TICKETS: u64 = OPEN - 1;
/// The most consumers a share may expect (tickets are 23 bits of the slot word).
pub const MAX_CONSUMERS: u32 = TICKETS as u32;
/// Set in a holder's start field once the start time is written.
const WRITTEN: u64 = 1 << 63;

const _: () = assert!(16 + 16 * HOLDERS <= SLOT_BYTES);

/// The calling process: its id and start time (read once).
pub(crate) fn me() -> ProcessId {
    static ME: OnceLock<ProcessId> = OnceLock::new();
    *ME.get_or_init(|| {
        let pid = std::process::id();
        ProcessId {
            pid,
            start: stat(pid).map_or(0, |s| s.start),
        }
    })
}

/// The calling process's user id.
pub(crate) fn uid() -> u32 {
    // SAFETY: `getuid` takes nothing, cannot fail and touches no memory of ours.
    unsafe { libc::getuid() }
}

/// What `/proc/<pid>/stat` says of a process.
struct Stat {
    /// Field 3: `R`, `S`, `D`, `Z` (exited, not yet reaped), `X` (dead)...
    state: char,
    /// Field 22: start time in clock ticks after boot.
    start: u64,
}

fn stat(pid: u32) -> Option<Stat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces and parentheses:
    // fields 3 on start after the last `)`.
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    // Fields 4 to 21 lie between the state and the start time.
    let start = fields.nth(18)?.parse().ok()?;
    Some(Stat { state, start })
}

/// Whether `/proc` answers at all (without it, nothing can be said of other processes).
fn proc_mounted() -> bool {
    static MOUNTED: OnceLock<bool> = OnceLock::new();
    *MOUNTED.get_or_init(|| stat(std::process::id()).is_some())
}

/// Whether `id` has certainly exited: its pid names no process, a zombie, or a process that
/// started at another time (a reused pid). Unknown (no `/proc`, or a start time of 0, which
/// `/proc` could not give) counts as running: a share is never freed, nor an open refused,
/// on a guess.
pub(crate) fn has_exited(id: ProcessId) -> bool {
    if !proc_mounted() {
        return false;
    }
    match stat(id.pid) {
        None => true,
        Some(s) => matches!(s.state, 'Z' | 'X' | 'x') || (id.start != 0 && s.start != id.start),
    }
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

/// A lifetime file's path.
pub(crate) fn path(uid: u32, pid: u32, nonce: u64) -> PathBuf {
    PathBuf::from(format!(
        "{SHM_DIR}/tensorbridge-ipc-{uid}-{pid}-{nonce:016x}"
    ))
}

fn os_error(op: &'static str, path: &std::path::Path, e: &std::io::Error) -> Error {
    Error::IpcLifetimeFile {
        op,
        path: path.display().to_string(),
        errno: e.raw_os_error().unwrap_or(0),
    }
}

/// Why a consumer could not hold a share.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Another generation now, or neither a ticket left nor the producer's handle alive.
    Released,
    /// Every holder entry is taken by a live process.
    Full,
}

/// A lifetime file, mapped.
pub(crate) struct SlotFile {
    map: NonNull<u8>,
    len: usize,
    pub(crate) path: PathBuf,
    pub(crate) nonce: u64,
    pub(crate) slots: u32,
    /// The producer whose file this is.
    pub(crate) producer: ProcessId,
}

// SAFETY: the mapping is shared memory accessed only through atomics (and plain reads of the
// header written before the file was published); the pointer stays valid until `Drop`.
unsafe impl Send for SlotFile {}
// SAFETY: as above: every access through `&SlotFile` is atomic.
unsafe impl Sync for SlotFile {}

impl Drop for SlotFile {
    fn drop(&mut self) {
        // SAFETY: `map` and `len` are the mapping `map_file` made; nothing refers into it once
        // the file is dropped (atomics are borrowed from `&self` only).
        unsafe { libc::munmap(self.map.as_ptr().cast(), self.len) };
    }
}

fn map_file(file: &File, len: usize, path: &std::path::Path) -> Result<NonNull<u8>, Error> {
    // SAFETY: a fresh shared read-write mapping of `len` bytes of an open file; the kernel
    // picks the address. Nothing else is touched.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(os_error("map", path, &std::io::Error::last_os_error()));
    }
    NonNull::new(p.cast::<u8>()).ok_or_else(|| {
        os_error(
            "map",
            path,
            &std::io::Error::from_raw_os_error(libc::ENOMEM),
        )
    })
}

impl SlotFile {
    /// The address `offset` bytes into the mapping.
    fn at(&self, offset: usize, size: usize) -> *mut u8 {
        assert!(
            offset.is_multiple_of(size) && offset + size <= self.len,
            "lifetime file offset {offset} out of place"
        );
        // Plain address arithmetic (`wrapping_add` needs no `unsafe`); in bounds, as asserted.
        self.map.as_ptr().wrapping_add(offset)
    }

    fn u32_at(&self, offset: usize) -> &AtomicU32 {
        let p = self.at(offset, 4).cast::<AtomicU32>();
        // SAFETY: `p` is 4-aligned (the mapping is page-aligned and `offset` a multiple of 4)
        // and its 4 bytes lie inside the mapping (`at` asserts both), which lives as long as
        // `self` and is only ever accessed atomically, here and by the other processes.
        unsafe { &*p }
    }

    fn u64_at(&self, offset: usize) -> &AtomicU64 {
        let p = self.at(offset, 8).cast::<AtomicU64>();
        // SAFETY: as in `u32_at`, for 8 bytes.
        unsafe { &*p }
    }

    fn slot_base(&self, slot: u32) -> usize {
        HEADER + slot as usize * SLOT_BYTES
    }

    fn word(&self, slot: u32) -> &AtomicU64 {
        self.u64_at(self.slot_base(slot))
    }

    fn holder_pid(&self, slot: u32, i: usize) -> &AtomicU32 {
        self.u32_at(self.slot_base(slot) + 16 + 16 * i)
    }

    fn holder_start(&self, slot: u32, i: usize) -> &AtomicU64 {
        self.u64_at(self.slot_base(slot) + 24 + 16 * i)
    }

    /// A new file for this process's shares. Removes, first, the files of this user's
    /// producers that have exited (a crashed producer cannot remove its own).
    pub(crate) fn create() -> Result<SlotFile, Error> {
        let me = me();
        let uid = uid();
        remove_stale(uid);
        let nonce = nonce();
        let path = path(uid, me.pid, nonce);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| os_error("create", &path, &e))?;
        let len = HEADER + SLOTS as usize * SLOT_BYTES;
        file.set_len(len as u64).map_err(|e| {
            let _ = std::fs::remove_file(&path);
            os_error("size", &path, &e)
        })?;
        let map = map_file(&file, len, &path).inspect_err(|_| {
            let _ = std::fs::remove_file(&path);
        })?;
        let f = SlotFile {
            map,
            len,
            path,
            nonce,
            slots: SLOTS,
            producer: me,
        };
        f.u32_at(8).store(FILE_VERSION, SeqCst);
        f.u32_at(12).store(SLOTS, SeqCst);
        f.u32_at(16).store(me.pid, SeqCst);
        f.u32_at(20).store(uid, SeqCst);
        f.u64_at(24).store(me.start, SeqCst);
        f.u64_at(32).store(nonce, SeqCst);
        // Last: a file whose magic is there is complete.
        f.u64_at(0).store(FILE_MAGIC, SeqCst);
        Ok(f)
    }

    /// Maps the lifetime file of `producer`'s share (a consumer). `Ok(None)` when there is
    /// no such file; errors for a file that cannot be opened or is not what the handle says.
    pub(crate) fn open(
        producer: ProcessId,
        uid: u32,
        nonce: u64,
    ) -> Result<Option<SlotFile>, Error> {
        let path = path(uid, producer.pid, nonce);
        let file = match OpenOptions::new().read(true).write(true).open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(os_error("open", &path, &e)),
        };
        let len = file
            .metadata()
            .map_err(|e| os_error("read", &path, &e))?
            .len();
        let expected = HEADER + SLOTS as usize * SLOT_BYTES;
        if len != expected as u64 {
            return Err(os_error(
                "read",
                &path,
                &std::io::Error::from_raw_os_error(libc::EINVAL),
            ));
        }
        let map = map_file(&file, expected, &path)?;
        let f = SlotFile {
            map,
            len: expected,
            path,
            nonce,
            slots: SLOTS,
            producer,
        };
        let same = f.u64_at(0).load(SeqCst) == FILE_MAGIC
            && f.u32_at(8).load(SeqCst) == FILE_VERSION
            && f.u32_at(12).load(SeqCst) == SLOTS
            && f.u32_at(16).load(SeqCst) == producer.pid
            && f.u32_at(20).load(SeqCst) == uid
            && f.u64_at(24).load(SeqCst) == producer.start
            && f.u64_at(32).load(SeqCst) == nonce;
        if !same {
            return Err(os_error(
                "read",
                &f.path,
                &std::io::Error::from_raw_os_error(libc::EINVAL),
            ));
        }
        Ok(Some(f))
    }

    // ---- the producer ----

    /// Gives `slot` to a new share: `generation`, `OPEN`, `tickets`.
    pub(crate) fn assign(&self, slot: u32, generation: u64, tickets: u32) {
        debug_assert!(generation <= MAX_GENERATION && u64::from(tickets) <= TICKETS);
        self.word(slot)
            .store(generation << 24 | OPEN | u64::from(tickets), SeqCst);
    }

    /// The producer's handle is gone: no consumer without a ticket may hold the share now.
    pub(crate) fn close(&self, slot: u32) {
        self.word(slot).fetch_and(!OPEN, SeqCst);
    }

    /// The tickets left (expected consumers that have not opened the share yet).
    pub(crate) fn tickets(&self, slot: u32) -> u32 {
        (self.word(slot).load(SeqCst) & TICKETS) as u32
    }

    /// Whether the share in `slot` may be freed: not `OPEN`, no tickets, no live holder.
    /// Dead holders met on the way are taken back and pushed onto `dead`.
    pub(crate) fn is_released(&self, slot: u32, dead: &mut Vec<ProcessId>) -> bool {
        if self.word(slot).load(SeqCst) & (OPEN | TICKETS) != 0 {
            return false;
        }
        let mut held = false;
        for i in 0..HOLDERS {
            if self.holder_pid(slot, i).load(SeqCst) == 0 {
                continue;
            }
            match self.reap(slot, i) {
                Some(gone) => dead.push(gone),
                None => held = true,
            }
        }
        !held
    }

    /// Takes back holder entry `i` if its process has exited; returns that process. `None`
    /// when the entry is free, alive, or changed meanwhile.
    fn reap(&self, slot: u32, i: usize) -> Option<ProcessId> {
        let pid_at = self.holder_pid(slot, i);
        let start_at = self.holder_start(slot, i);
        let pid = pid_at.load(SeqCst);
        if pid == 0 {
            return None;
        }
        let start = start_at.load(SeqCst);
        if start & WRITTEN == 0 {
            // Being claimed: only a pid that names no process at all is certainly gone (the
            // claimer died between its two writes).
            let gone = ProcessId { pid, start: 0 };
            if has_exited(gone) && pid_at.compare_exchange(pid, 0, SeqCst, SeqCst).is_ok() {
                return Some(gone);
            }
            return None;
        }
        let id = ProcessId {
            pid,
            start: start & !WRITTEN,
        };
        if !has_exited(id) {
            return None;
        }
        // Start time first, then pid, each only if unchanged. Between the two the entry looks
        // like one being claimed by a pid that names no live process: no claimer can take it
        // (its pid is not 0), and another reaper's swap of the pid fails if ours succeeded.
        if start_at.compare_exchange(start, 0, SeqCst, SeqCst).is_err() {
            return None;
        }
        pid_at.compare_exchange(pid, 0, SeqCst, SeqCst).ok()?;
        Some(id)
    }

    // ---- a consumer ----

    /// Holds the share `(slot, generation)` for the calling process (one entry per process
    /// and share: the caller keeps the result and shares it among its opens).
    pub(crate) fn register(
        self: &Arc<Self>,
        slot: u32,
        generation: u64,
        dead: &mut Vec<ProcessId>,
    ) -> Result<Registration, Refusal> {
        if self.word(slot).load(SeqCst) >> 24 != generation {
            return Err(Refusal::Released);
        }
        let me = me();
        let index = match self.claim(slot, me) {
            Some(i) => i,
            None => {
                // Full: take back the entries of dead processes, then try once more.
                for i in 0..HOLDERS {
                    if let Some(gone) = self.reap(slot, i) {
                        dead.push(gone);
                    }
                }
                self.claim(slot, me).ok_or(Refusal::Full)?
            }
        };
        let registration = Registration {
            file: self.clone(),
            slot,
            index,
        };
        let word = self.word(slot);
        let mut w = word.load(SeqCst);
        loop {
            if w >> 24 != generation {
                return Err(Refusal::Released); // `registration` drops: the entry is given back
            }
            if w & TICKETS != 0 {
                match word.compare_exchange(w, w - 1, SeqCst, SeqCst) {
                    Ok(_) => return Ok(registration),
                    Err(now) => w = now,
                }
            } else if w & OPEN != 0 {
                return Ok(registration);
            } else {
                return Err(Refusal::Released);
            }
        }
    }

    /// Takes a ticket of `(slot, generation)` without a holder entry (an open in the
    /// producer's own process, which holds the memory through the tensor itself).
    pub(crate) fn take_ticket(&self, slot: u32, generation: u64) -> Result<(), Refusal> {
        let word = self.word(slot);
        let mut w = word.load(SeqCst);
        loop {
            if w >> 24 != generation {
                return Err(Refusal::Released);
            }
            if w & TICKETS != 0 {
                match word.compare_exchange(w, w - 1, SeqCst, SeqCst) {
                    Ok(_) => return Ok(()),
                    Err(now) => w = now,
                }
            } else if w & OPEN != 0 {
                return Ok(());
            } else {
                return Err(Refusal::Released);
            }
        }
    }

    fn claim(&self, slot: u32, me: ProcessId) -> Option<usize> {
        for i in 0..HOLDERS {
            if self
                .holder_pid(slot, i)
                .compare_exchange(0, me.pid, SeqCst, SeqCst)
                .is_ok()
            {
                self.holder_start(slot, i).store(me.start | WRITTEN, SeqCst);
                return Some(i);
            }
        }
        None
    }

    /// The live holders of `slot` (for tests and reports).
    pub(crate) fn holders(&self, slot: u32) -> Vec<u32> {
        (0..HOLDERS)
            .map(|i| self.holder_pid(slot, i).load(SeqCst))
            .filter(|&p| p != 0)
            .collect()
    }
}

/// A consumer process's hold on one share; dropping it gives the holder entry back.
pub(crate) struct Registration {
    file: Arc<SlotFile>,
    slot: u32,
    index: usize,
}

impl Registration {
    /// The producer of the share held.
    pub(crate) fn producer(&self) -> ProcessId {
        self.file.producer
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        // Start time first: an entry with a pid and no start time is one being claimed, which
        // a reader never mistakes for a dead holder of another start time.
        self.file
            .holder_start(self.slot, self.index)
            .store(0, SeqCst);
        self.file.holder_pid(self.slot, self.index).store(0, SeqCst);
    }
}

/// Removes the lifetime files of `uid`'s producers that have exited. Consumers that still map
/// one keep their mapping; the memory it counted died with its producer.
fn remove_stale(uid: u32) {
    let prefix = format!("tensorbridge-ipc-{uid}-");
    let Ok(dir) = std::fs::read_dir(SHM_DIR) else {
        return;
    };
    for entry in dir.flatten() {
        let name = entry.file_name();
        let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(&prefix)) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        let mut header = [0u8; HEADER];
        let read = File::open(entry.path()).and_then(|mut f| f.read_exact(&mut header));
        if read.is_err() || header[..8] != FILE_MAGIC.to_le_bytes() {
            continue;
        }
        let u32_at = |o: usize| u32::from_le_bytes(header[o..o + 4].try_into().unwrap_or([0; 4]));
        let u64_at = |o: usize| u64::from_le_bytes(header[o..o + 8].try_into().unwrap_or([0; 8]));
        if u32_at(16) != pid || u32_at(20) != uid {
            continue;
        }
        let producer = ProcessId {
            pid,
            start: u64_at(24),
        };
        if producer != me() && has_exited(producer) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pid above any kernel's `pid_max` (at most 2^22): names no process.
    const NO_PID: u32 = u32::MAX - 7;

    #[test]
    fn own_process_is_alive_and_a_changed_start_is_not() {
        let me = me();
        assert_eq!(me.pid, std::process::id());
        assert!(!has_exited(me));
        if proc_mounted() {
            assert_ne!(me.start, 0, "/proc gives a start time");
            assert!(has_exited(ProcessId {
                pid: me.pid,
                start: me.start + 1
            }));
            assert!(has_exited(ProcessId {
                pid: NO_PID,
                start: 1
            }));
        }
    }

    #[test]
    fn stat_reads_past_the_command_name() {
        if proc_mounted() {
            let s = stat(std::process::id()).unwrap();
            assert!(s.start > 0);
            assert!(matches!(s.state, 'R' | 'S' | 'D'));
        }
    }

    /// A producer's file and a consumer's mapping of the same file (the same process plays
    /// both: the protocol lives in the shared memory, not in the mappings).
    fn pair() -> (Arc<SlotFile>, Arc<SlotFile>) {
        let producer = SlotFile::create().expect("a lifetime file in /dev/shm");
        let consumer = SlotFile::open(producer.producer, uid(), producer.nonce)
            .unwrap()
            .expect("the file just made");
        (Arc::new(producer), Arc::new(consumer))
    }

    #[test]
    fn the_file_is_private_and_checked_on_open() {
        use std::os::unix::fs::PermissionsExt as _;
        let (p, _c) = pair();
        let mode = std::fs::metadata(&p.path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "only the producer's user may open it");
        // Another producer identity, or another nonce: not this file.
        let other = ProcessId {
            pid: p.producer.pid,
            start: p.producer.start + 1,
        };
        assert!(matches!(
            SlotFile::open(other, uid(), p.nonce),
            Err(Error::IpcLifetimeFile { op: "read", .. })
        ));
        assert!(
            SlotFile::open(p.producer, uid(), p.nonce ^ 1)
                .unwrap()
                .is_none()
        );
        std::fs::remove_file(&p.path).unwrap();
    }

    #[test]
    fn tickets_open_and_holders_decide_release() {
        let (p, c) = pair();
        let mut dead = Vec::new();
        p.assign(5, 9, 1);
        // Wrong generation: refused before any entry is claimed.
        assert_eq!(c.register(5, 8, &mut dead).err(), Some(Refusal::Released));
        assert!(p.holders(5).is_empty());
        // The expected consumer takes the ticket.
        let r = c.register(5, 9, &mut dead).unwrap();
        assert_eq!(p.tickets(5), 0);
        assert_eq!(p.holders(5), [me().pid]);
        // While open, more consumers may hold it without a ticket.
        let r2 = c.register(5, 9, &mut dead).unwrap();
        p.close(5);
        // Closed, no tickets: no one else.
        assert_eq!(c.register(5, 9, &mut dead).err(), Some(Refusal::Released));
        assert_eq!(
            p.holders(5).len(),
            2,
            "the refused claim gave its entry back"
        );
        assert!(!p.is_released(5, &mut dead), "held by live processes");
        drop(r);
        assert!(!p.is_released(5, &mut dead));
        drop(r2);
        assert!(p.is_released(5, &mut dead));
        assert!(dead.is_empty());
        std::fs::remove_file(&p.path).unwrap();
    }

    #[test]
    fn a_ticket_outlives_the_producer_handle() {
        let (p, c) = pair();
        let mut dead = Vec::new();
        p.assign(0, 1, 2);
        p.close(0);
        assert!(!p.is_released(0, &mut dead), "two tickets left");
        let r = c.register(0, 1, &mut dead).unwrap();
        assert!(
            c.take_ticket(0, 1).is_ok(),
            "the producer's own process takes one too"
        );
        assert_eq!(p.tickets(0), 0);
        assert_eq!(c.take_ticket(0, 1), Err(Refusal::Released));
        assert!(!p.is_released(0, &mut dead));
        drop(r);
        assert!(p.is_released(0, &mut dead));
        std::fs::remove_file(&p.path).unwrap();
    }

    #[test]
    fn dead_and_half_claimed_holders() {
        let (p, c) = pair();
        let mut dead = Vec::new();
        p.assign(1, 3, 0);
        // A holder that died: entry written, process gone.
        p.holder_pid(1, 4).store(NO_PID, SeqCst);
        p.holder_start(1, 4).store(12345 | WRITTEN, SeqCst);
        // A live process caught between its two writes: held.
        p.holder_pid(1, 7).store(me().pid, SeqCst);
        p.close(1);
        assert!(
            !p.is_released(1, &mut dead),
            "the half-claimed entry counts"
        );
        assert_eq!(
            dead,
            [ProcessId {
                pid: NO_PID,
                start: 12345
            }]
        );
        assert_eq!(p.holders(1), [me().pid]);
        // A claimer that died between its writes: its pid names nothing.
        p.holder_pid(1, 7).store(NO_PID, SeqCst);
        dead.clear();
        assert!(p.is_released(1, &mut dead));
        assert_eq!(dead.len(), 1);
        assert!(p.holders(1).is_empty());
        drop(c);
        std::fs::remove_file(&p.path).unwrap();
    }

    #[test]
    fn a_full_slot_takes_back_dead_entries() {
        let (p, c) = pair();
        let mut dead = Vec::new();
        p.assign(2, 1, 0);
        let held: Vec<_> = (0..HOLDERS)
            .map(|_| c.register(2, 1, &mut dead).unwrap())
            .collect();
        assert_eq!(c.register(2, 1, &mut dead).err(), Some(Refusal::Full));
        drop(held);
        for i in 0..HOLDERS {
            p.holder_pid(2, i).store(NO_PID, SeqCst);
            p.holder_start(2, i).store(7 | WRITTEN, SeqCst);
        }
        let r = c.register(2, 1, &mut dead).unwrap();
        assert_eq!(
            dead.len(),
            HOLDERS,
            "every dead entry taken back and reported"
        );
        assert_eq!(p.holders(2), [me().pid]);
        drop(r);
        std::fs::remove_file(&p.path).unwrap();
    }

    #[test]
    fn files_of_exited_producers_are_removed() {
        let stale = path(uid(), NO_PID, 0x5ca1ab1e);
        let mut header = vec![0u8; HEADER + SLOTS as usize * SLOT_BYTES];
        header[..8].copy_from_slice(&FILE_MAGIC.to_le_bytes());
        header[8..12].copy_from_slice(&FILE_VERSION.to_le_bytes());
        header[12..16].copy_from_slice(&SLOTS.to_le_bytes());
        header[16..20].copy_from_slice(&NO_PID.to_le_bytes());
        header[20..24].copy_from_slice(&uid().to_le_bytes());
        std::fs::write(&stale, &header).unwrap();
        let p = SlotFile::create().unwrap();
        assert!(!stale.exists(), "{} was left", stale.display());
        assert!(p.path.exists(), "a live producer's file stays");
        std::fs::remove_file(&p.path).unwrap();
    }

    /// The consumer half of `a_consumer_killed_while_holding_is_reaped`: holds the share the
    /// environment names, then exits without releasing it. Does nothing in a normal run.
    #[test]
    fn child_holds_and_exits() {
        let Ok(spec) = std::env::var("TB_LIFETIME_CHILD") else {
            return;
        };
        let v: Vec<u64> = spec.split(':').map(|x| x.parse().unwrap()).collect();
        let producer = ProcessId {
            pid: v[0] as u32,
            start: v[1],
        };
        let file = Arc::new(SlotFile::open(producer, uid(), v[2]).unwrap().unwrap());
        let held = file.register(v[3] as u32, v[4], &mut Vec::new()).unwrap();
        std::mem::forget(held);
        // As a killed process would: no destructor runs.
        std::process::exit(0);
    }

    #[test]
    fn a_consumer_killed_while_holding_is_reaped() {
        if !proc_mounted() {
            return;
        }
        let p = SlotFile::create().unwrap();
        let me = me();
        p.assign(3, 11, 1);
        p.close(3);
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "ipc::lifetime::tests::child_holds_and_exits",
                "--nocapture",
            ])
            .env(
                "TB_LIFETIME_CHILD",
                format!("{}:{}:{}:3:11", me.pid, me.start, p.nonce),
            )
            .status()
            .unwrap();
        assert!(status.success());
        let child_pid = p.holders(3);
        assert_eq!(child_pid.len(), 1, "the child holds the share");
        assert_eq!(p.tickets(3), 0, "and took the ticket");
        let mut dead = Vec::new();
        assert!(p.is_released(3, &mut dead), "the dead holder is taken back");
        assert_eq!(dead.len(), 1);
        assert_eq!(dead[0].pid, child_pid[0]);
        std::fs::remove_file(&p.path).unwrap();
    }
}
