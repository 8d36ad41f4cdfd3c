//! A stand-in for the CUDA driver (`libcuda`), for tests on machines without a GPU.
//!
//! Built as a shared library and loaded in place of libcuda: `cargo xtask` copies it into a
//! folder of its own as `libcuda.so.1` and `libcuda.so` and puts that folder first on
//! `LD_LIBRARY_PATH` for the driver tests (`tensorbridge-cuda`'s `driver` test binary, the
//! Python package's `test_share_driver.py`), which then run the same code paths as on a GPU.
//!
//! # What it simulates
//! - **Devices**: `TB_STANDIN_DEVICES` of them (0 to 16, default 1; 0 makes `cuInit` answer
//!   `CUDA_ERROR_NO_DEVICE`), each with a fixed UUID that differs per ordinal, the same in
//!   every process, a name, and a few attributes (unified addressing, memory pools). Every
//!   call but `cuInit`, `cuDriverGetVersion` and the error strings answers
//!   `CUDA_ERROR_NOT_INITIALIZED` before `cuInit`, as the driver does.
//! - **Contexts**: one primary context per device; a per-thread context stack
//!   (`cuCtxSetCurrent`, push, pop). Memory, stream and event calls need a current context.
//! - **Device memory is host shared memory.** `cuMemAlloc_v2` creates a POSIX shared-memory
//!   object (`/dev/shm/tb-standin-<pid>-<n>`: a header page saying its size and producer,
//!   then the data) and maps the data `MAP_SHARED`, followed by a `PROT_NONE` guard page. The
//!   allocation ends as close to the guard page as 256-byte alignment allows (exactly at it
//!   when its size is a multiple of 256), so a view past the end faults instead of reading.
//!   `cuMemAllocAsync` (stream-ordered pool memory) is private anonymous memory laid out the
//!   same way and, as on a GPU, not shareable through legacy IPC.
//! - **Legacy IPC**: `cuIpcGetMemHandle` writes a 64-byte handle naming the shared-memory
//!   object; `cuIpcOpenMemHandle_v2` in another process maps the same bytes (guard page
//!   included) after reading the size from the object's header, not from the handle. It
//!   refuses the process's own allocations (`CUDA_ERROR_INVALID_CONTEXT`), handles it did not
//!   make and objects that are gone or whose producer has exited (`CUDA_ERROR_INVALID_VALUE`).
//!   Opening an allocation this process has mapped already returns the same address and
//!   counts a reference, which `cuIpcCloseMemHandle` gives back (the mapping goes with the
//!   last), as the driver documents since CUDA 11. Interprocess events
//!   (`cuIpcGetEventHandle`, `cuIpcOpenEventHandle`) are events like any other.
//! - **Pointer queries** (`cuPointerGetAttribute(s)`, `cuMemGetAddressRange_v2`) answer from
//!   this process's registry of allocations and mappings: device memory on the device it was
//!   made or mapped on, in its primary context, with its range and a buffer id; addresses it
//!   does not know answer as host memory does on the driver (memory type 0, or an error for
//!   the single-attribute query).
//! - **Streams and events** complete at once: records, queries, waits and synchronisations
//!   succeed, a host function (`cuLaunchHostFunc`) runs on the calling thread, and no stream
//!   is ever capturing.
//! - **Copies and sets** (`cuMemcpy*`, `cuMemsetD8*`, `cuMemsetD32*`) are plain `memcpy` and
//!   `memset`, done before the call returns; device ranges must lie inside one known
//!   allocation or mapping (`CUDA_ERROR_INVALID_VALUE` otherwise).
//!
//! Every entry point catches panics (`CUDA_ERROR_UNKNOWN`) and refuses null pointers where
//! the driver requires one (`CUDA_ERROR_INVALID_VALUE`). Unknown stream and event handles are
//! `CUDA_ERROR_INVALID_HANDLE`.
//!
//! # What it does not
//! No kernels, modules, NVRTC, graphs or capture, no virtual memory management, managed or
//! pinned host memory, no real asynchrony (nothing is ever pending, so tests of waiting and
//! ordering prove nothing here), no peer devices. A process's objects in `/dev/shm` are
//! removed when freed and when it exits normally; those of a killed process are removed by
//! the next process's `cuInit`.

#![allow(non_snake_case)]

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::ffi::{CString, c_char, c_int, c_uint, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Mutex, MutexGuard, Once, OnceLock, PoisonError};

type CUresult = u32;
type CUdevice = c_int;
type CUdeviceptr = u64;
type CUcontext = *mut c_void;
type CUstream = *mut c_void;
type CUevent = *mut c_void;
type CUhostFn = Option<unsafe extern "C" fn(*mut c_void)>;

/// `CUipcMemHandle` and `CUipcEventHandle`: 64 opaque bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct IpcHandle {
    reserved: [u8; 64],
}

const SUCCESS: CUresult = 0;
const INVALID_VALUE: CUresult = 1;
const OUT_OF_MEMORY: CUresult = 2;
const NOT_INITIALIZED: CUresult = 3;
const NO_DEVICE: CUresult = 100;
const INVALID_DEVICE: CUresult = 101;
const INVALID_CONTEXT: CUresult = 201;
const INVALID_HANDLE: CUresult = 400;
const NOT_FOUND: CUresult = 500;
const NOT_SUPPORTED: CUresult = 801;
const UNKNOWN: CUresult = 999;

/// The most devices `TB_STANDIN_DEVICES` may ask for.
const MAX_DEVICES: usize = 16;
/// What `cuDriverGetVersion` says: CUDA 13.0.
const DRIVER_VERSION: c_int = 13000;
/// The largest allocation (1 TiB): more is out of memory, as on a GPU.
const MAX_ALLOC: u64 = 1 << 40;
/// Device allocations are aligned to this, as the driver's are (at least).
const ALIGN: u64 = 256;
/// The prefix of this library's shared-memory objects (after the `/`).
const SHM_PREFIX: &str = "tb-standin-";
/// The header page's first bytes, and those of the IPC handles.
const HEADER_MAGIC: &[u8; 8] = b"TBSTDIN1";
const MEM_MAGIC: &[u8; 8] = b"TBSIMEM1";
const EVENT_MAGIC: &[u8; 8] = b"TBSIEVT1";
/// `CU_EVENT_DISABLE_TIMING`, `CU_EVENT_INTERPROCESS`.
const EVENT_DISABLE_TIMING: c_uint = 0x2;
const EVENT_INTERPROCESS: c_uint = 0x4;
/// `CU_MEMORYTYPE_DEVICE`.
const MEMORY_TYPE_DEVICE: u32 = 2;

/// The primary contexts: a context handle is the address of its device's byte.
static CONTEXTS: [AtomicU8; MAX_DEVICES] = [const { AtomicU8::new(0) }; MAX_DEVICES];
/// The pool handle every stream-ordered allocation reports (`CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE`).
static POOL: AtomicU8 = AtomicU8::new(0);
static INITIALISED: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// The calling thread's context stack, top last.
    static STACK: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
    /// The thread's stream capture mode (`cuThreadExchangeStreamCaptureMode`).
    static CAPTURE_MODE: Cell<u32> = const { Cell::new(0) };
}

/// What an address range of the registry is.
#[derive(Debug)]
enum Kind {
    /// This process's allocation; `shm` names its shared-memory object (`None`: pool memory),
    /// and `fd` is that object kept open with the allocation's liveness lock on it (-1 for
    /// pool memory): see [`hold_lock`].
    Alloc {
        id: u64,
        shm: Option<CString>,
        fd: c_int,
    },
    /// Another process's allocation, mapped here `refs` times.
    Mapping { pid: u32, id: u64, refs: u32 },
}

/// A known device address range: `[start, start + size)`, inside a reservation of
/// `reserve_len` bytes at `reserve` (the data pages and the guard page).
#[derive(Debug)]
struct Region {
    size: u64,
    device: c_int,
    buffer_id: u64,
    reserve: usize,
    reserve_len: usize,
    kind: Kind,
}

#[derive(Debug)]
struct Event {
    flags: c_uint,
}

#[derive(Debug, Default)]
struct State {
    regions: BTreeMap<u64, Region>,
    /// Stream handle -> device.
    streams: HashMap<usize, c_int>,
    events: HashMap<usize, Event>,
    next_handle: usize,
    next_id: u64,
    retained: [u32; MAX_DEVICES],
}

fn state() -> MutexGuard<'static, State> {
    static STATE: OnceLock<Mutex<State>> = OnceLock::new();
    STATE
        .get_or_init(|| Mutex::new(State::default()))
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
}

impl State {
    /// A fresh opaque handle for a stream or an event (never 0, 1 or 2, which name the
    /// legacy and per-thread default streams).
    fn handle(&mut self) -> usize {
        self.next_handle += 1;
        0x7b5d_0000_0000 + self.next_handle * 16
    }

    /// The region holding `addr`.
    fn find(&self, addr: u64) -> Option<(u64, &Region)> {
        let (&start, region) = self.regions.range(..=addr).next_back()?;
        (addr - start < region.size).then_some((start, region))
    }

    /// `Ok` when `[addr, addr + len)` lies inside one region.
    fn check_range(&self, addr: u64, len: usize) -> Result<(), CUresult> {
        let (start, region) = self.find(addr).ok_or(INVALID_VALUE)?;
        let end = addr.checked_add(len as u64).ok_or(INVALID_VALUE)?;
        if end <= start + region.size {
            Ok(())
        } else {
            Err(INVALID_VALUE)
        }
    }

    fn check_stream(&self, stream: CUstream) -> Result<(), CUresult> {
        let s = stream as usize;
        if s <= 2 || self.streams.contains_key(&s) {
            Ok(())
        } else {
            Err(INVALID_HANDLE)
        }
    }

    fn event(&self, event: CUevent) -> Result<&Event, CUresult> {
        self.events.get(&(event as usize)).ok_or(INVALID_HANDLE)
    }
}

/// Runs an entry point's body: its error code, or `CUDA_ERROR_UNKNOWN` when it panicked.
fn guard(body: impl FnOnce() -> Result<(), CUresult>) -> CUresult {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => SUCCESS,
        Ok(Err(code)) => code,
        Err(_) => UNKNOWN,
    }
}

/// Writes `value` through `out`, refusing null.
///
/// # Safety
/// 1. `out` is null or valid for a write of a `T` (alignment not required).
unsafe fn put<T>(out: *mut T, value: T) -> Result<(), CUresult> {
    if out.is_null() {
        return Err(INVALID_VALUE);
    }
    // SAFETY: non-null, and valid for the write by obligation 1.
    unsafe { out.write_unaligned(value) };
    Ok(())
}

/// Writes `value` through `out` when it is not null (the driver's optional outputs).
///
/// # Safety
/// 1. `out` is null or valid for a write of a `T` (alignment not required).
unsafe fn put_opt<T>(out: *mut T, value: T) {
    if !out.is_null() {
        // SAFETY: non-null, and valid for the write by obligation 1.
        unsafe { out.write_unaligned(value) };
    }
}

fn initialised() -> Result<(), CUresult> {
    if INITIALISED.load(Ordering::Acquire) {
        Ok(())
    } else {
        Err(NOT_INITIALIZED)
    }
}

/// `TB_STANDIN_DEVICES` (0 to 16; 1 when unset or unreadable).
fn device_count() -> usize {
    static COUNT: OnceLock<usize> = OnceLock::new();
    *COUNT.get_or_init(|| {
        std::env::var("TB_STANDIN_DEVICES")
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .filter(|&n| n <= MAX_DEVICES)
            .unwrap_or(1)
    })
}

fn check_device(dev: CUdevice) -> Result<usize, CUresult> {
    initialised()?;
    usize::try_from(dev)
        .ok()
        .filter(|&d| d < device_count())
        .ok_or(INVALID_DEVICE)
}

fn context_of(device: usize) -> usize {
    (&raw const CONTEXTS[device]) as usize
}

/// The device of a context handle, if it is one of the primary contexts.
fn device_of_context(ctx: usize) -> Option<c_int> {
    (0..device_count())
        .find(|&d| context_of(d) == ctx)
        .map(|d| d as c_int)
}

/// The top of the calling thread's context stack (0 when empty, or while the thread's
/// locals are being destroyed).
fn current_context() -> usize {
    STACK
        .try_with(|s| s.borrow().last().copied().unwrap_or(0))
        .unwrap_or(0)
}

/// The device of the calling thread's current context.
fn current_device() -> Result<c_int, CUresult> {
    initialised()?;
    device_of_context(current_context()).ok_or(INVALID_CONTEXT)
}

fn page() -> usize {
    // SAFETY: sysconf only reads a configuration value.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(p).ok().filter(|&p| p > 0).unwrap_or(4096)
}

fn round_up(n: u64, to: u64) -> u64 {
    n.div_ceil(to) * to
}

fn shm_name(pid: u32, id: u64) -> CString {
    CString::new(format!("/{SHM_PREFIX}{pid}-{id}")).unwrap_or_default()
}

fn pid() -> u32 {
    std::process::id()
}

/// `F_OFD_SETLK` / `F_OFD_GETLK` of `kind` on the object's first byte; for `F_OFD_GETLK`,
/// true when another open file description holds a conflicting lock.
fn ofd_lock(fd: c_int, cmd: c_int, kind: c_int) -> bool {
    // SAFETY: a zeroed `flock` is a valid value of the plain C struct.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = 0;
    fl.l_len = 1;
    // SAFETY: `fd` is open; `fl` is a live local the call reads and (GETLK) fills.
    let r = unsafe { libc::fcntl(fd, cmd, &mut fl) };
    r == 0 && (cmd != libc::F_OFD_GETLK || fl.l_type != libc::F_UNLCK as libc::c_short)
}

/// An allocation's liveness, as the real driver has it (the memory lives exactly as long
/// as its process's context): the allocating process holds a read lock on the object's
/// first byte for the allocation's life, which the kernel drops when the process dies.
/// A lock, not a process id: a process of another PID namespace (a container sharing
/// `/dev/shm`) is alive to this one while its lock is held, whatever its pid names here.
fn hold_lock(fd: c_int) -> bool {
    ofd_lock(fd, libc::F_OFD_SETLK, libc::F_RDLCK)
}

/// Whether the allocation behind the open object `fd` is alive: see [`hold_lock`]. (An
/// error counts as alive: nothing is removed on a guess.)
fn object_alive(fd: c_int) -> bool {
    ofd_lock(fd, libc::F_OFD_GETLK, libc::F_WRLCK)
}

/// A reservation of `data_len` bytes and a guard page, the data part left for the caller to
/// map: returns the reservation's address.
fn reserve(data_len: usize) -> Result<usize, CUresult> {
    // SAFETY: a new anonymous mapping at an address the kernel picks; nothing is replaced.
    let at = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            data_len + page(),
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if at == libc::MAP_FAILED {
        Err(OUT_OF_MEMORY)
    } else {
        Ok(at as usize)
    }
}

/// Maps `data_len` bytes of `fd` at `offset` (or anonymous memory for `fd == -1`) over the
/// start of the reservation at `at`, read-write.
fn map_data(at: usize, data_len: usize, fd: c_int, offset: usize) -> Result<(), CUresult> {
    let (flags, offset) = if fd < 0 {
        (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, 0)
    } else {
        (libc::MAP_SHARED, offset as libc::off_t)
    };
    // SAFETY: `at` is the start of a reservation of this library at least `data_len` bytes
    // long (plus a guard page), which only this library uses; MAP_FIXED replaces part of it.
    let got = unsafe {
        libc::mmap(
            at as *mut c_void,
            data_len,
            libc::PROT_READ | libc::PROT_WRITE,
            flags | libc::MAP_FIXED,
            fd,
            offset,
        )
    };
    if got == libc::MAP_FAILED {
        Err(OUT_OF_MEMORY)
    } else {
        Ok(())
    }
}

fn unmap(at: usize, len: usize) {
    // SAFETY: a reservation of this library, unmapped once, after its region left the
    // registry.
    unsafe { libc::munmap(at as *mut c_void, len) };
}

/// The data pages of an allocation of `size` bytes, and where the allocation starts in them
/// (as close to the guard page as 256-byte alignment allows).
fn layout(size: u64) -> (usize, usize) {
    let data_len = round_up(size, page() as u64) as usize;
    (data_len, data_len - round_up(size, ALIGN) as usize)
}

/// The first bytes of a shared-memory object: what `cuIpcOpenMemHandle_v2` believes.
#[repr(C)]
#[derive(Clone, Copy)]
struct Header {
    magic: [u8; 8],
    size: u64,
    pid: u32,
    device: c_int,
}

/// Removes the shared-memory objects of allocations that are gone (their processes were
/// killed before they could): those whose liveness lock ([`hold_lock`]) nobody holds.
fn sweep() {
    let Ok(dir) = std::fs::read_dir("/dev/shm") else {
        return;
    };
    for entry in dir.flatten() {
        let name = entry.file_name();
        if !name.to_str().is_some_and(|n| n.starts_with(SHM_PREFIX)) {
            continue;
        }
        let Ok(c) = CString::new(format!("/{}", name.to_string_lossy())) else {
            continue;
        };
        // SAFETY: a NUL-terminated name; a non-blocking open maps nothing.
        let fd = unsafe {
            libc::shm_open(
                c.as_ptr(),
                libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                0,
            )
        };
        if fd < 0 {
            continue;
        }
        let alive = object_alive(fd);
        // SAFETY: `fd` is open and closed once.
        unsafe { libc::close(fd) };
        if !alive {
            // SAFETY: a NUL-terminated name; removing a name maps nothing.
            unsafe { libc::shm_unlink(c.as_ptr()) };
        }
    }
}

/// At exit, this process's allocations go, as the driver frees them with the process.
extern "C" fn unlink_all() {
    let names: Vec<CString> = match catch_unwind(|| {
        state()
            .regions
            .values()
            .filter_map(|r| match &r.kind {
                Kind::Alloc { shm: Some(n), .. } => Some(n.clone()),
                _ => None,
            })
            .collect()
    }) {
        Ok(names) => names,
        Err(_) => return,
    };
    for n in names {
        // SAFETY: a NUL-terminated name; removing a name maps nothing.
        unsafe { libc::shm_unlink(n.as_ptr()) };
    }
}

/// Allocates `size` bytes on the current device: shared memory (`shared`), or private
/// memory standing for a stream-ordered pool.
fn allocate(out: *mut CUdeviceptr, size: usize, shared: bool) -> Result<(), CUresult> {
    if out.is_null() || size == 0 {
        return Err(INVALID_VALUE);
    }
    let device = current_device()?;
    let size = size as u64;
    if size > MAX_ALLOC {
        return Err(OUT_OF_MEMORY);
    }
    let (data_len, lead) = layout(size);
    let mut st = state();
    st.next_id += 1;
    let id = st.next_id;
    let shm = if shared {
        static AT_EXIT: Once = Once::new();
        AT_EXIT.call_once(|| {
            // SAFETY: registers a function that takes no arguments and never unwinds.
            unsafe { libc::atexit(unlink_all) };
        });
        Some(shm_name(pid(), id))
    } else {
        None
    };
    let at = reserve(data_len)?;
    let mapped = match &shm {
        None => map_data(at, data_len, -1, 0).map(|()| -1),
        Some(name) => map_shared(name, at, data_len, size, device),
    };
    let fd = match mapped {
        Ok(fd) => fd,
        Err(e) => {
            unmap(at, data_len + page());
            return Err(e);
        }
    };
    let start = (at + lead) as u64;
    st.regions.insert(
        start,
        Region {
            size,
            device,
            buffer_id: id,
            reserve: at,
            reserve_len: data_len + page(),
            kind: Kind::Alloc { id, shm, fd },
        },
    );
    // SAFETY: checked non-null above; the caller's pointer is valid by its contract.
    unsafe { put(out, start) }
}

/// Creates the shared-memory object `name` (a header page, then `data_len` bytes), maps its
/// data at `at`, and returns it open with the allocation's liveness lock ([`hold_lock`]).
fn map_shared(
    name: &CString,
    at: usize,
    data_len: usize,
    size: u64,
    device: c_int,
) -> Result<c_int, CUresult> {
    // SAFETY: a NUL-terminated name; the object is new (O_EXCL) and this user's alone.
    let fd = unsafe {
        libc::shm_open(
            name.as_ptr(),
            libc::O_CREAT | libc::O_EXCL | libc::O_RDWR,
            0o600,
        )
    };
    if fd < 0 {
        return Err(OUT_OF_MEMORY);
    }
    let header = Header {
        magic: *HEADER_MAGIC,
        size,
        pid: pid(),
        device,
    };
    let total = (page() + data_len) as libc::off_t;
    // SAFETY: `fd` is open.
    let sized = unsafe { libc::ftruncate(fd, total) } == 0;
    // SAFETY: `fd` is open; the header is plain bytes read from a live local.
    let written = unsafe { libc::pwrite(fd, (&raw const header).cast(), size_of::<Header>(), 0) };
    let ok = sized && written == size_of::<Header>() as isize && hold_lock(fd);
    let mapped = if ok {
        map_data(at, data_len, fd, page())
    } else {
        Err(OUT_OF_MEMORY)
    };
    if mapped.is_err() {
        // SAFETY: `fd` is open and closed once (its lock goes with it).
        unsafe { libc::close(fd) };
        // SAFETY: a NUL-terminated name of this process's new object.
        unsafe { libc::shm_unlink(name.as_ptr()) };
    }
    mapped.map(|()| fd)
}

/// Frees the allocation that starts at `ptr`.
fn free(ptr: CUdeviceptr) -> Result<(), CUresult> {
    initialised()?;
    let mut st = state();
    if !matches!(
        st.regions.get(&ptr),
        Some(Region {
            kind: Kind::Alloc { .. },
            ..
        })
    ) {
        return Err(INVALID_VALUE);
    }
    let region = st.regions.remove(&ptr).ok_or(INVALID_VALUE)?;
    unmap(region.reserve, region.reserve_len);
    if let Kind::Alloc {
        shm: Some(name),
        fd,
        ..
    } = &region.kind
    {
        // SAFETY: a NUL-terminated name of this process's object. Mappings in other
        // processes keep the memory; no new one can be made.
        unsafe { libc::shm_unlink(name.as_ptr()) };
        // SAFETY: the object's descriptor, kept since the allocation and closed once here
        // (its liveness lock goes with it).
        unsafe { libc::close(*fd) };
    }
    Ok(())
}

/// Copies `len` bytes from `src` to `dst`; `dst_dev` / `src_dev` say which side is device
/// memory that must lie inside one known region (`None`: either, as unified addressing
/// decides: device memory when the registry knows the address, host memory otherwise).
fn copy(
    dst: u64,
    src: u64,
    len: usize,
    dst_dev: Option<bool>,
    src_dev: Option<bool>,
) -> Result<(), CUresult> {
    initialised()?;
    if len == 0 {
        return Ok(());
    }
    let st = state();
    for (addr, dev) in [(dst, dst_dev), (src, src_dev)] {
        if addr == 0 {
            return Err(INVALID_VALUE);
        }
        match dev {
            Some(true) => st.check_range(addr, len)?,
            Some(false) => {}
            None => {
                if st.find(addr).is_some() {
                    st.check_range(addr, len)?;
                }
            }
        }
    }
    // SAFETY: device sides lie inside mapped regions (checked above, under the lock that
    // keeps them mapped); host sides are valid for `len` bytes by the caller's contract, as
    // with the driver. Overlap is allowed (memmove).
    unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, len) };
    Ok(())
}

/// Sets `count` elements of `width` bytes at device address `dst` to `value`.
fn set(dst: CUdeviceptr, value: u32, width: usize, count: usize) -> Result<(), CUresult> {
    initialised()?;
    let len = count.checked_mul(width).ok_or(INVALID_VALUE)?;
    if len == 0 {
        return Ok(());
    }
    let st = state();
    st.check_range(dst, len)?;
    if width == 4 && !dst.is_multiple_of(4) {
        return Err(INVALID_VALUE);
    }
    for i in 0..count {
        let at = (dst as usize + i * width) as *mut u8;
        if width == 4 {
            // SAFETY: inside a mapped region (checked above, under the lock), aligned for
            // `u32` (checked above).
            unsafe { at.cast::<u32>().write(value) };
        } else {
            // SAFETY: inside a mapped region (checked above, under the lock).
            unsafe { at.write(value as u8) };
        }
    }
    Ok(())
}

// ---- entry points ------------------------------------------------------------------------

/// Declares exported driver entry points: `extern "C"`, never unwinding, with the one safety
/// contract every driver call has.
macro_rules! entry {
    ($( $(#[doc = $doc:expr])* fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $body:block )*) => {$(
        $(#[doc = $doc])*
        ///
        /// # Safety
        /// 1. Each pointer argument is null or valid for the reads and writes the CUDA driver
        ///    API documents for it.
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $name($($arg: $ty),*) -> CUresult {
            guard(move || $body)
        }
    )*};
}

entry! {
    /// Initialises the stand-in (and removes objects of killed processes once).
    fn cuInit(_flags: c_uint) {
        if device_count() == 0 {
            return Err(NO_DEVICE);
        }
        if !INITIALISED.swap(true, Ordering::AcqRel) {
            sweep();
        }
        Ok(())
    }

    /// 13000 (CUDA 13.0).
    fn cuDriverGetVersion(version: *mut c_int) {
        // SAFETY: the caller's contract (obligation 1).
        unsafe { put(version, DRIVER_VERSION) }
    }

    /// `TB_STANDIN_DEVICES` (default 1).
    fn cuDeviceGetCount(count: *mut c_int) {
        initialised()?;
        // SAFETY: the caller's contract (obligation 1).
        unsafe { put(count, device_count() as c_int) }
    }

    /// The device of an ordinal: the ordinal itself.
    fn cuDeviceGet(device: *mut CUdevice, ordinal: c_int) {
        check_device(ordinal)?;
        // SAFETY: the caller's contract (obligation 1).
        unsafe { put(device, ordinal) }
    }

    /// A fixed UUID per ordinal.
    fn cuDeviceGetUuid(uuid: *mut [u8; 16], dev: CUdevice) {
        let d = check_device(dev)?;
        // SAFETY: the caller's contract (obligation 1).
        unsafe { put(uuid, device_uuid(d)) }
    }

    /// A fixed UUID per ordinal.
    fn cuDeviceGetUuid_v2(uuid: *mut [u8; 16], dev: CUdevice) {
        let d = check_device(dev)?;
        // SAFETY: the caller's contract (obligation 1).
        unsafe { put(uuid, device_uuid(d)) }
    }

    /// "tensorbridge stand-in device N", cut to `len - 1` bytes and NUL-terminated.
    fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) {
        let d = check_device(dev)?;
        let len = usize::try_from(len).map_err(|_| INVALID_VALUE)?;
        if name.is_null() || len == 0 {
            return Err(INVALID_VALUE);
        }
        let text = format!("tensorbridge stand-in device {d}");
        let n = text.len().min(len - 1);
        // SAFETY: `name` holds `len` bytes (obligation 1); `n + 1 <= len` are written.
        unsafe { std::ptr::copy_nonoverlapping(text.as_ptr().cast::<c_char>(), name, n) };
        // SAFETY: as above (`n < len`).
        unsafe { name.wrapping_add(n).write(0) };
        Ok(())
    }

    /// A few attributes with plausible values (unified addressing, memory pools, compute
    /// capability 9.0); 0 for the others.
    fn cuDeviceGetAttribute(value: *mut c_int, attribute: c_int, dev: CUdevice) {
        check_device(dev)?;
        let v = match attribute {
            1..=3 => 1024,         // max threads per block, block dims x and y
            4 => 64,                   // block dim z
            5 => i32::MAX,             // grid dim x
            6 | 7 => 65535,            // grid dims y and z
            8 => 49152,                // shared memory per block
            10 => 32,                  // warp size
            16 => 1,                   // multiprocessors
            41 => 1,                   // unified addressing
            75 => 9,                   // compute capability major
            76 => 0,                   // compute capability minor
            115 => 1,                  // memory pools supported
            _ => 0,
        };
        // SAFETY: the caller's contract (obligation 1).
        unsafe { put(value, v) }
    }

    /// 16 GiB.
    fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) {
        check_device(dev)?;
        // SAFETY: the caller's contract (obligation 1).
        unsafe { put(bytes, 16 << 30) }
    }

    /// Peers: every pair of distinct devices.
    fn cuDeviceCanAccessPeer(can: *mut c_int, dev: CUdevice, peer: CUdevice) {
        check_device(dev)?;
        check_device(peer)?;
        // SAFETY: the caller's contract (obligation 1).
        unsafe { put(can, c_int::from(dev != peer)) }
    }

    /// The device's primary context, one more reference counted.
    fn cuDevicePrimaryCtxRetain(ctx: *mut CUcontext, dev: CUdevice) {
        let d = check_device(dev)?;
        // SAFETY: the caller's contract (obligation 1).
        unsafe { put(ctx, context_of(d) as CUcontext) }?;
        state().retained[d] += 1;
        Ok(())
    }

    /// One reference fewer (the context stays usable).
    fn cuDevicePrimaryCtxRelease_v2(dev: CUdevice) {
        let d = check_device(dev)?;
        let mut st = state();
        st.retained[d] = st.retained[d].saturating_sub(1);
        Ok(())
    }

    /// Flags 0; active while retained.
    fn cuDevicePrimaryCtxGetState(dev: CUdevice, flags: *mut c_uint, active: *mut c_int) {
        let d = check_device(dev)?;
        let on = c_int::from(state().retained[d] > 0);
// SAFETY: the caller's contract (obligation 1).
        unsafe { put(flags, 0) }?;
        // SAFETY: as above.
        unsafe { put(active, on) }
    }

    /// Replaces the top of the thread's context stack (null pops it).
    fn cuCtxSetCurrent(ctx: CUcontext) {
        initialised()?;
        let ctx = ctx as usize;
        if ctx != 0 && device_of_context(ctx).is_none() {
            return Err(INVALID_CONTEXT);
        }
        STACK.with(|s| {
            let mut s = s.borrow_mut();
            s.pop();
            if ctx != 0 {
                s.push(ctx);
            }
        });
        Ok(())
    }

    /// The top of the thread's context stack (null when empty).
    fn cuCtxGetCurrent(ctx: *mut CUcontext) {
        initialised()?;
        // SAFETY: the caller's contract (obligation 1).
        unsafe { put(ctx, current_context() as CUcontext) }
    }

    /// Pushes a context on the thread's stack.
    fn cuCtxPushCurrent_v2(ctx: CUcontext) {
        initialised()?;
        let ctx = ctx as usize;
        if device_of_context(ctx).is_none() {
            return Err(INVALID_CONTEXT);
        }
        STACK.with(|s| s.borrow_mut().push(ctx));
        Ok(())
    }

    /// Pops the thread's stack.
    fn cuCtxPopCurrent_v2(ctx: *mut CUcontext) {
        initialised()?;
        let top = STACK.with(|s| s.borrow_mut().pop()).ok_or(INVALID_CONTEXT)?;
        // SAFETY: the caller's contract (obligation 1); the output is optional.
        unsafe { put_opt(ctx, top as CUcontext) };
        Ok(())
    }

    /// The current context's device.
    fn cuCtxGetDevice(device: *mut CUdevice) {
        let d = current_device()?;
        // SAFETY: the caller's contract (obligation 1).
        unsafe { put(device, d) }
    }

    /// Nothing is ever pending.
    fn cuCtxSynchronize() {
        current_device().map(drop)
    }

    /// Flags 0.
    fn cuCtxGetFlags(flags: *mut c_uint) {
        current_device()?;
        // SAFETY: the caller's contract (obligation 1).
        unsafe { put(flags, 0) }
    }

    /// The context's device number as its id.
    fn cuCtxGetId(ctx: CUcontext, id: *mut u64) {
        initialised()?;
        let ctx = if ctx.is_null() { current_context() } else { ctx as usize };
        let d = device_of_context(ctx).ok_or(INVALID_CONTEXT)?;
        // SAFETY: the caller's contract (obligation 1).
        unsafe { put(id, d as u64 + 1) }
    }

    /// Device memory: shared memory with a guard page after it.
    fn cuMemAlloc_v2(ptr: *mut CUdeviceptr, size: usize) {
        allocate(ptr, size, true)
    }

    /// Frees an allocation (its start only).
    fn cuMemFree_v2(ptr: CUdeviceptr) {
        free(ptr)
    }

    /// Pool memory: private memory with a guard page, not shareable.
    fn cuMemAllocAsync(ptr: *mut CUdeviceptr, size: usize, stream: CUstream) {
        initialised()?;
        state().check_stream(stream)?;
        allocate(ptr, size, false)
    }

    /// Frees at once.
    fn cuMemFreeAsync(ptr: CUdeviceptr, stream: CUstream) {
        initialised()?;
        state().check_stream(stream)?;
        free(ptr)
    }

    /// Half of the total free.
    fn cuMemGetInfo_v2(free_bytes: *mut usize, total: *mut usize) {
        current_device()?;
// SAFETY: the caller's contract (obligation 1).
        unsafe { put(free_bytes, 8 << 30) }?;
        // SAFETY: as above.
        unsafe { put(total, 16 << 30) }
    }

    /// Not virtual memory: `CUDA_ERROR_INVALID_VALUE`, as for every legacy allocation.
    fn cuMemRetainAllocationHandle(_handle: *mut u64, _addr: *mut c_void) {
        initialised()?;
        Err(INVALID_VALUE)
    }

    /// No virtual memory handles exist.
    fn cuMemRelease(_handle: u64) {
        initialised()?;
        Err(INVALID_VALUE)
    }

    /// Host to device, at once.
    fn cuMemcpyHtoD_v2(dst: CUdeviceptr, src: *const c_void, len: usize) {
        copy(dst, src as u64, len, Some(true), Some(false))
    }

    /// Device to host, at once.
    fn cuMemcpyDtoH_v2(dst: *mut c_void, src: CUdeviceptr, len: usize) {
        copy(dst as u64, src, len, Some(false), Some(true))
    }

    /// Device to device, at once.
    fn cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, len: usize) {
        copy(dst, src, len, Some(true), Some(true))
    }

    /// Either way (unified addressing), at once.
    fn cuMemcpy(dst: CUdeviceptr, src: CUdeviceptr, len: usize) {
        copy(dst, src, len, None, None)
    }

    /// Host to device, at once.
    fn cuMemcpyHtoDAsync_v2(dst: CUdeviceptr, src: *const c_void, len: usize, stream: CUstream) {
        initialised()?;
        state().check_stream(stream)?;
        copy(dst, src as u64, len, Some(true), Some(false))
    }

    /// Device to host, at once.
    fn cuMemcpyDtoHAsync_v2(dst: *mut c_void, src: CUdeviceptr, len: usize, stream: CUstream) {
        initialised()?;
        state().check_stream(stream)?;
        copy(dst as u64, src, len, Some(false), Some(true))
    }

    /// Device to device, at once.
    fn cuMemcpyDtoDAsync_v2(dst: CUdeviceptr, src: CUdeviceptr, len: usize, stream: CUstream) {
        initialised()?;
        state().check_stream(stream)?;
        copy(dst, src, len, Some(true), Some(true))
    }

    /// Either way (unified addressing), at once.
    fn cuMemcpyAsync(dst: CUdeviceptr, src: CUdeviceptr, len: usize, stream: CUstream) {
        initialised()?;
        state().check_stream(stream)?;
        copy(dst, src, len, None, None)
    }

    /// Bytes, at once.
    fn cuMemsetD8_v2(dst: CUdeviceptr, value: u8, count: usize) {
        set(dst, u32::from(value), 1, count)
    }

    /// Bytes, at once.
    fn cuMemsetD8Async(dst: CUdeviceptr, value: u8, count: usize, stream: CUstream) {
        initialised()?;
        state().check_stream(stream)?;
        set(dst, u32::from(value), 1, count)
    }

    /// 32-bit words, at once.
    fn cuMemsetD32_v2(dst: CUdeviceptr, value: c_uint, count: usize) {
        set(dst, value, 4, count)
    }

    /// 32-bit words, at once.
    fn cuMemsetD32Async(dst: CUdeviceptr, value: c_uint, count: usize, stream: CUstream) {
        initialised()?;
        state().check_stream(stream)?;
        set(dst, value, 4, count)
    }

    /// The range of the allocation or mapping holding `ptr`; `CUDA_ERROR_NOT_FOUND` for
    /// addresses this process does not know.
    fn cuMemGetAddressRange_v2(base: *mut CUdeviceptr, size: *mut usize, ptr: CUdeviceptr) {
        initialised()?;
        let st = state();
        let (start, region) = st.find(ptr).ok_or(NOT_FOUND)?;
// SAFETY: the caller's contract (obligation 1); both outputs are optional.
        unsafe { put_opt(base, start) };
        // SAFETY: as above.
        unsafe { put_opt(size, region.size as usize) };
        Ok(())
    }

    /// One attribute of a known address; `CUDA_ERROR_INVALID_VALUE` for others.
    fn cuPointerGetAttribute(data: *mut c_void, attribute: c_uint, ptr: CUdeviceptr) {
        initialised()?;
        if data.is_null() {
            return Err(INVALID_VALUE);
        }
        let st = state();
        let found = st.find(ptr).ok_or(INVALID_VALUE)?;
        // SAFETY: `data` holds the attribute's value by the caller's contract.
        unsafe { write_attribute(data, attribute, ptr, Some(found)) }
    }

    /// Attributes of any address: defaults (memory type 0) for addresses this process does
    /// not know, as the driver answers for host memory.
    fn cuPointerGetAttributes(count: c_uint, attributes: *const c_uint, data: *mut *mut c_void, ptr: CUdeviceptr) {
        initialised()?;
        if count == 0 || attributes.is_null() || data.is_null() {
            return Err(INVALID_VALUE);
        }
        let st = state();
        let found = st.find(ptr);
        for i in 0..count as usize {
            // SAFETY: both arrays hold `count` entries (obligation 1).
            let attribute = unsafe { attributes.wrapping_add(i).read_unaligned() };
            // SAFETY: as above.
            let slot = unsafe { data.wrapping_add(i).read_unaligned() };
            if slot.is_null() {
                return Err(INVALID_VALUE);
            }
            // SAFETY: each slot holds its attribute's value (obligation 1).
            unsafe { write_attribute(slot, attribute, ptr, found) }?;
        }
        Ok(())
    }

    /// A 64-byte handle naming the shared-memory object of the allocation at `ptr` (its
    /// start, as the driver requires).
    fn cuIpcGetMemHandle(handle: *mut [u8; 64], ptr: CUdeviceptr) {
        current_device()?;
        let st = state();
        let Some(Region { device, kind: Kind::Alloc { id, shm: Some(_), .. }, .. }) = st.regions.get(&ptr) else {
            return Err(INVALID_VALUE);
        };
        let mut h = [0u8; 64];
        h[..8].copy_from_slice(MEM_MAGIC);
        h[8..12].copy_from_slice(&pid().to_le_bytes());
        h[12..16].copy_from_slice(&device.to_le_bytes());
        h[16..24].copy_from_slice(&id.to_le_bytes());
        // SAFETY: the caller's contract (obligation 1).
        unsafe { put(handle, h) }
    }

    /// Maps another process's allocation (a reference more when it is mapped already).
    fn cuIpcOpenMemHandle_v2(ptr: *mut CUdeviceptr, handle: IpcHandle, _flags: c_uint) {
        let handle = handle.reserved;
        current_device()?;
        if ptr.is_null() || &handle[..8] != MEM_MAGIC {
            return Err(INVALID_VALUE);
        }
        let producer = u32::from_le_bytes(handle[8..12].try_into().map_err(|_| INVALID_VALUE)?);
        let id = u64::from_le_bytes(handle[16..24].try_into().map_err(|_| INVALID_VALUE)?);
        if producer == pid() {
            return Err(INVALID_CONTEXT);
        }
        let mut st = state();
        for (&start, region) in st.regions.iter_mut() {
            if let Kind::Mapping { pid: p, id: i, refs } = &mut region.kind
                && *p == producer
                && *i == id
            {
                *refs += 1;
                // SAFETY: checked non-null above; the caller's contract.
                return unsafe { put(ptr, start) };
            }
        }
        let (start, region) = open_shared(producer, id)?;
        st.regions.insert(start, region);
        // SAFETY: checked non-null above; the caller's contract.
        unsafe { put(ptr, start) }
    }

    /// One reference fewer on a mapping (its start); unmapped with the last.
    fn cuIpcCloseMemHandle(ptr: CUdeviceptr) {
        initialised()?;
        let mut st = state();
        let Some(Region { kind: Kind::Mapping { refs, .. }, .. }) = st.regions.get_mut(&ptr) else {
            return Err(INVALID_VALUE);
        };
        *refs -= 1;
        if *refs == 0 {
            let region = st.regions.remove(&ptr).ok_or(INVALID_VALUE)?;
            unmap(region.reserve, region.reserve_len);
        }
        Ok(())
    }

    /// A stream of the current context.
    fn cuStreamCreate(stream: *mut CUstream, _flags: c_uint) {
        let d = current_device()?;
        if stream.is_null() {
            return Err(INVALID_VALUE);
        }
        let mut st = state();
        let h = st.handle();
        st.streams.insert(h, d);
        // SAFETY: checked non-null above; the caller's contract.
        unsafe { put(stream, h as CUstream) }
    }

    /// A stream of the current context (priorities are ignored).
    fn cuStreamCreateWithPriority(stream: *mut CUstream, flags: c_uint, _priority: c_int) {
        // SAFETY: the caller's contract, passed on.
        unsafe { match cuStreamCreate(stream, flags) { SUCCESS => Ok(()), e => Err(e) } }
    }

    /// Destroys a stream.
    fn cuStreamDestroy_v2(stream: CUstream) {
        initialised()?;
        state().streams.remove(&(stream as usize)).map(drop).ok_or(INVALID_HANDLE)
    }

    /// Nothing is ever pending.
    fn cuStreamSynchronize(stream: CUstream) {
        initialised()?;
        state().check_stream(stream)
    }

    /// Nothing is ever pending.
    fn cuStreamQuery(stream: CUstream) {
        initialised()?;
        state().check_stream(stream)
    }

    /// The wait is over at once.
    fn cuStreamWaitEvent(stream: CUstream, event: CUevent, _flags: c_uint) {
        initialised()?;
        let st = state();
        st.check_stream(stream)?;
        st.event(event).map(drop)
    }

    /// The stream's context (the current one for the default streams).
    fn cuStreamGetCtx(stream: CUstream, ctx: *mut CUcontext) {
        initialised()?;
        let s = stream as usize;
        let device = if s <= 2 {
            current_device()?
        } else {
            *state().streams.get(&s).ok_or(INVALID_HANDLE)?
        };
        // SAFETY: the caller's contract (obligation 1).
        unsafe { put(ctx, context_of(device as usize) as CUcontext) }
    }

    /// `CU_STREAM_NON_BLOCKING` for streams made here, 0 for the default streams.
    fn cuStreamGetFlags(stream: CUstream, flags: *mut c_uint) {
        initialised()?;
        state().check_stream(stream)?;
        // SAFETY: the caller's contract (obligation 1).
        unsafe { put(flags, c_uint::from(stream as usize > 2)) }
    }

    /// The handle as the id.
    fn cuStreamGetId(stream: CUstream, id: *mut u64) {
        initialised()?;
        state().check_stream(stream)?;
        // SAFETY: the caller's contract (obligation 1).
        unsafe { put(id, stream as u64) }
    }

    /// Never capturing.
    fn cuStreamIsCapturing(stream: CUstream, status: *mut c_uint) {
        initialised()?;
        state().check_stream(stream)?;
        // SAFETY: the caller's contract (obligation 1).
        unsafe { put(status, 0) }
    }

    /// Never capturing: status 0, no id, graph or dependencies.
    fn cuStreamGetCaptureInfo_v2(
        stream: CUstream,
        status: *mut c_uint,
        id: *mut u64,
        graph: *mut *mut c_void,
        deps: *mut *const c_void,
        num_deps: *mut usize,
    ) {
        initialised()?;
        state().check_stream(stream)?;
// SAFETY: the caller's contract (obligation 1); all but the status are optional.
        unsafe { put(status, 0) }?;
        // SAFETY: as above.
        unsafe { put_opt(id, 0) };
        // SAFETY: as above.
        unsafe { put_opt(graph, std::ptr::null_mut()) };
        // SAFETY: as above.
        unsafe { put_opt(deps, std::ptr::null()) };
        // SAFETY: as above.
        unsafe { put_opt(num_deps, 0) };
        Ok(())
    }

    /// Never capturing: status 0, no id, graph, dependencies or edge data.
    fn cuStreamGetCaptureInfo_v3(
        stream: CUstream,
        status: *mut c_uint,
        id: *mut u64,
        graph: *mut *mut c_void,
        deps: *mut *const c_void,
        edges: *mut *const c_void,
        num_deps: *mut usize,
    ) {
        initialised()?;
        state().check_stream(stream)?;
// SAFETY: the caller's contract (obligation 1); all but the status are optional.
        unsafe { put(status, 0) }?;
        // SAFETY: as above.
        unsafe { put_opt(id, 0) };
        // SAFETY: as above.
        unsafe { put_opt(graph, std::ptr::null_mut()) };
        // SAFETY: as above.
        unsafe { put_opt(deps, std::ptr::null()) };
        // SAFETY: as above.
        unsafe { put_opt(edges, std::ptr::null()) };
        // SAFETY: as above.
        unsafe { put_opt(num_deps, 0) };
        Ok(())
    }

    /// Swaps the thread's capture mode.
    fn cuThreadExchangeStreamCaptureMode(mode: *mut c_uint) {
        initialised()?;
        if mode.is_null() {
            return Err(INVALID_VALUE);
        }
        // SAFETY: checked non-null; the caller's contract.
        let new = unsafe { mode.read_unaligned() };
        let old = CAPTURE_MODE.with(|m| m.replace(new));
        // SAFETY: as above.
        unsafe { put(mode, old) }
    }

    /// Runs `f(data)` now, on the calling thread (the stream has nothing pending).
    fn cuLaunchHostFunc(stream: CUstream, f: CUhostFn, data: *mut c_void) {
        initialised()?;
        state().check_stream(stream)?;
        let f = f.ok_or(INVALID_VALUE)?;
        // SAFETY: the caller's function and data, called once as the driver would.
        unsafe { f(data) };
        Ok(())
    }

    /// An event of the current context.
    fn cuEventCreate(event: *mut CUevent, flags: c_uint) {
        current_device()?;
        if event.is_null() {
            return Err(INVALID_VALUE);
        }
        let mut st = state();
        let h = st.handle();
        st.events.insert(h, Event { flags });
        // SAFETY: checked non-null above; the caller's contract.
        unsafe { put(event, h as CUevent) }
    }

    /// Destroys an event.
    fn cuEventDestroy_v2(event: CUevent) {
        initialised()?;
        state().events.remove(&(event as usize)).map(drop).ok_or(INVALID_HANDLE)
    }

    /// Destroys an event.
    fn cuEventDestroy(event: CUevent) {
        initialised()?;
        state().events.remove(&(event as usize)).map(drop).ok_or(INVALID_HANDLE)
    }

    /// Complete at once.
    fn cuEventRecord(event: CUevent, stream: CUstream) {
        initialised()?;
        let st = state();
        st.check_stream(stream)?;
        st.event(event).map(drop)
    }

    /// Complete at once.
    fn cuEventRecordWithFlags(event: CUevent, stream: CUstream, _flags: c_uint) {
        initialised()?;
        let st = state();
        st.check_stream(stream)?;
        st.event(event).map(drop)
    }

    /// Always complete.
    fn cuEventQuery(event: CUevent) {
        initialised()?;
        state().event(event).map(drop)
    }

    /// Always complete.
    fn cuEventSynchronize(event: CUevent) {
        initialised()?;
        state().event(event).map(drop)
    }

    /// 0 ms; `CUDA_ERROR_INVALID_HANDLE` for events without timing, as the driver says.
    fn cuEventElapsedTime_v2(ms: *mut f32, start: CUevent, end: CUevent) {
        initialised()?;
        let st = state();
        for e in [start, end] {
            if st.event(e)?.flags & EVENT_DISABLE_TIMING != 0 {
                return Err(INVALID_HANDLE);
            }
        }
        // SAFETY: the caller's contract (obligation 1).
        unsafe { put(ms, 0.0) }
    }

    /// A 64-byte handle for an interprocess event.
    fn cuIpcGetEventHandle(handle: *mut [u8; 64], event: CUevent) {
        initialised()?;
        let st = state();
        if st.event(event)?.flags & EVENT_INTERPROCESS == 0 {
            return Err(INVALID_VALUE);
        }
        let mut h = [0u8; 64];
        h[..8].copy_from_slice(EVENT_MAGIC);
        h[8..12].copy_from_slice(&pid().to_le_bytes());
        h[16..24].copy_from_slice(&(event as u64).to_le_bytes());
        // SAFETY: the caller's contract (obligation 1).
        unsafe { put(handle, h) }
    }

    /// An event of this process standing for another process's (complete at once, as all).
    fn cuIpcOpenEventHandle(event: *mut CUevent, handle: IpcHandle) {
        let handle = handle.reserved;
        current_device()?;
        if event.is_null() || &handle[..8] != EVENT_MAGIC {
            return Err(INVALID_VALUE);
        }
        let mut st = state();
        let h = st.handle();
        st.events.insert(h, Event { flags: EVENT_INTERPROCESS | EVENT_DISABLE_TIMING });
        // SAFETY: checked non-null above; the caller's contract.
        unsafe { put(event, h as CUevent) }
    }

    /// The code's name (`CUDA_ERROR_INVALID_VALUE` and null for codes it does not know).
    fn cuGetErrorName(error: CUresult, text: *mut *const c_char) {
        let s = error_text(error).map(|(name, _)| name);
        // SAFETY: the caller's contract (obligation 1).
        unsafe { put(text, s.map_or(std::ptr::null(), |s| s.as_ptr().cast())) }?;
        s.map(drop).ok_or(INVALID_VALUE)
    }

    /// The code's description (`CUDA_ERROR_INVALID_VALUE` and null for codes it does not know).
    fn cuGetErrorString(error: CUresult, text: *mut *const c_char) {
        let s = error_text(error).map(|(_, what)| what);
        // SAFETY: the caller's contract (obligation 1).
        unsafe { put(text, s.map_or(std::ptr::null(), |s| s.as_ptr().cast())) }?;
        s.map(drop).ok_or(INVALID_VALUE)
    }
}

/// The UUID of device `d`: fixed, distinct per ordinal, the same in every process.
fn device_uuid(d: usize) -> [u8; 16] {
    let mut u = *b"TB-standin-gpu\0\0";
    u[15] = d as u8;
    u
}

/// Maps allocation `id` of process `producer` with a guard page after it, as the producer's
/// header describes it.
fn open_shared(producer: u32, id: u64) -> Result<(u64, Region), CUresult> {
    let name = shm_name(producer, id);
    // SAFETY: a NUL-terminated name; opening maps nothing.
    let fd = unsafe { libc::shm_open(name.as_ptr(), libc::O_RDWR, 0) };
    if fd < 0 {
        return Err(INVALID_VALUE);
    }
    let result = (|| {
        // The producer's allocation is gone once its liveness lock is (its process died
        // before it could remove the name): the driver refuses such a handle.
        if !object_alive(fd) {
            return Err(INVALID_VALUE);
        }
        let mut header = Header {
            magic: [0; 8],
            size: 0,
            pid: 0,
            device: 0,
        };
        // SAFETY: `fd` is open; the read fills a live local of plain bytes.
        let read = unsafe { libc::pread(fd, (&raw mut header).cast(), size_of::<Header>(), 0) };
        // SAFETY: `fd` is open; `stat` is a live local the call fills.
        let mut stat: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let stat_ok = unsafe { libc::fstat(fd, &mut stat) } == 0;
        if read != size_of::<Header>() as isize
            || &header.magic != HEADER_MAGIC
            || header.pid != producer
            || header.size == 0
            || !stat_ok
            || header.size > MAX_ALLOC
        {
            return Err(INVALID_VALUE);
        }
        let (data_len, lead) = layout(header.size);
        if (stat.st_size as u64) < (page() + data_len) as u64 {
            return Err(INVALID_VALUE);
        }
        let device = c_int::try_from(check_device(header.device)?).map_err(|_| INVALID_DEVICE)?;
        let at = reserve(data_len)?;
        if let Err(e) = map_data(at, data_len, fd, page()) {
            unmap(at, data_len + page());
            return Err(e);
        }
        Ok((
            (at + lead) as u64,
            Region {
                size: header.size,
                device,
                buffer_id: id,
                reserve: at,
                reserve_len: data_len + page(),
                kind: Kind::Mapping {
                    pid: producer,
                    id,
                    refs: 1,
                },
            },
        ))
    })();
    // SAFETY: `fd` is open and closed once; a mapping keeps the object.
    unsafe { libc::close(fd) };
    result
}

/// An attribute's value, in the width the driver writes it.
enum Value {
    Ptr(usize),
    U64(u64),
    U32(u32),
    I32(c_int),
    U8(u8),
}

/// Writes attribute `attribute` of `ptr` (in `found`, or unknown) through `data`.
///
/// # Safety
/// 1. `data` is valid for a write of the attribute's value (at most 8 bytes).
unsafe fn write_attribute(
    data: *mut c_void,
    attribute: c_uint,
    ptr: CUdeviceptr,
    found: Option<(u64, &Region)>,
) -> Result<(), CUresult> {
    let region = found.map(|(_, r)| r);
    let shm = |want: bool| matches!(region, Some(Region { kind: Kind::Alloc { shm, .. }, .. }) if shm.is_some() == want);
    let known = region.is_some();
    let value = match attribute {
        // CONTEXT
        1 => Value::Ptr(region.map_or(0, |r| context_of(r.device as usize))),
        // MEMORY_TYPE
        2 => Value::U32(if known { MEMORY_TYPE_DEVICE } else { 0 }),
        // DEVICE_POINTER
        3 => Value::U64(if known { ptr } else { 0 }),
        // HOST_POINTER: device memory has none.
        4 => Value::Ptr(0),
        // SYNC_MEMOPS, IS_MANAGED, IS_GPU_DIRECT_RDMA_CAPABLE: false.
        6 | 8 | 15 => Value::U8(0),
        // BUFFER_ID
        7 => Value::U64(region.map_or(0, |r| r.buffer_id)),
        // DEVICE_ORDINAL
        9 => Value::I32(region.map_or(-2, |r| r.device)),
        // IS_LEGACY_CUDA_IPC_CAPABLE: this process's shared-memory allocations.
        10 => Value::U8(u8::from(shm(true))),
        // RANGE_START_ADDR
        11 => Value::U64(found.map_or(0, |(s, _)| s)),
        // RANGE_SIZE
        12 => Value::Ptr(region.map_or(0, |r| r.size as usize)),
        // MAPPED
        13 => Value::U8(u8::from(known)),
        // ALLOWED_HANDLE_TYPES
        14 => Value::U64(0),
        // ACCESS_FLAGS: read-write.
        16 => Value::U32(if known { 3 } else { 0 }),
        // MEMPOOL_HANDLE: one pool for every stream-ordered allocation.
        17 => Value::Ptr(if shm(false) {
            (&raw const POOL) as usize
        } else {
            0
        }),
        // P2P_TOKENS
        5 => return Err(NOT_SUPPORTED),
        _ => return Err(INVALID_VALUE),
    };
    // SAFETY (each arm): obligation 1; the value has the attribute's width.
    match value {
        // SAFETY: see above.
        Value::Ptr(v) => unsafe { put(data.cast::<usize>(), v) },
        // SAFETY: see above.
        Value::U64(v) => unsafe { put(data.cast::<u64>(), v) },
        // SAFETY: see above.
        Value::U32(v) => unsafe { put(data.cast::<u32>(), v) },
        // SAFETY: see above.
        Value::I32(v) => unsafe { put(data.cast::<c_int>(), v) },
        // SAFETY: see above.
        Value::U8(v) => unsafe { put(data.cast::<u8>(), v) },
    }
}

/// The name and description of the codes this library returns.
fn error_text(code: CUresult) -> Option<(&'static str, &'static str)> {
    Some(match code {
        SUCCESS => ("CUDA_SUCCESS\0", "no error\0"),
        INVALID_VALUE => ("CUDA_ERROR_INVALID_VALUE\0", "invalid argument\0"),
        OUT_OF_MEMORY => ("CUDA_ERROR_OUT_OF_MEMORY\0", "out of memory\0"),
        NOT_INITIALIZED => ("CUDA_ERROR_NOT_INITIALIZED\0", "initialization error\0"),
        NO_DEVICE => (
            "CUDA_ERROR_NO_DEVICE\0",
            "no CUDA-capable device is detected\0",
        ),
        INVALID_DEVICE => ("CUDA_ERROR_INVALID_DEVICE\0", "invalid device ordinal\0"),
        INVALID_CONTEXT => ("CUDA_ERROR_INVALID_CONTEXT\0", "invalid device context\0"),
        INVALID_HANDLE => ("CUDA_ERROR_INVALID_HANDLE\0", "invalid resource handle\0"),
        NOT_FOUND => ("CUDA_ERROR_NOT_FOUND\0", "named symbol not found\0"),
        NOT_SUPPORTED => ("CUDA_ERROR_NOT_SUPPORTED\0", "operation not supported\0"),
        UNKNOWN => ("CUDA_ERROR_UNKNOWN\0", "unknown error\0"),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    //! The entry points called in-process (the test binary contains the library): the
    //! refusals a caller relies on. Sharing across processes is tested through the loaded
    //! library by tensorbridge-cuda's `cuda_driver` binary.

    use super::*;

    /// Initialised, with device 0's primary context current on this thread.
    fn bound() {
        let mut ctx: CUcontext = std::ptr::null_mut();
        // SAFETY: a live local for the context; the others take no pointer.
        unsafe {
            assert_eq!(cuInit(0), SUCCESS);
        }
        // SAFETY: as above.
        let rc = unsafe { cuDevicePrimaryCtxRetain(&mut ctx, 0) };
        assert_eq!(rc, SUCCESS);
        // SAFETY: a context the library handed out.
        let rc = unsafe { cuCtxSetCurrent(ctx) };
        assert_eq!(rc, SUCCESS);
    }

    fn alloc(size: usize) -> u64 {
        let mut p = 0;
        // SAFETY: a live local.
        let rc = unsafe { cuMemAlloc_v2(&mut p, size) };
        assert_eq!(rc, SUCCESS);
        p
    }

    #[test]
    fn null_outputs_and_sizes_are_invalid_values() {
        bound();
        // SAFETY: null pointers are what is tested; the library refuses them.
        unsafe {
            assert_eq!(cuMemAlloc_v2(std::ptr::null_mut(), 64), INVALID_VALUE);
        }
        let mut p = 0;
        // SAFETY: a live local.
        let rc = unsafe { cuMemAlloc_v2(&mut p, 0) };
        assert_eq!(rc, INVALID_VALUE);
        // SAFETY: as above.
        let rc = unsafe { cuMemAlloc_v2(&mut p, usize::MAX) };
        assert_eq!(rc, OUT_OF_MEMORY);
        // SAFETY: null is refused.
        let rc = unsafe { cuDeviceGetCount(std::ptr::null_mut()) };
        assert_eq!(rc, INVALID_VALUE);
        // SAFETY: null is refused.
        let rc = unsafe { cuCtxGetCurrent(std::ptr::null_mut()) };
        assert_eq!(rc, INVALID_VALUE);
    }

    #[test]
    fn copies_stay_inside_one_allocation_and_frees_take_its_start() {
        bound();
        let p = alloc(1000);
        let src = [7u8; 16];
        let mut out = [0u8; 16];
        // SAFETY: 16 bytes of a live local, inside the allocation.
        let rc = unsafe { cuMemcpyHtoD_v2(p + 984, src.as_ptr().cast(), 16) };
        assert_eq!(rc, SUCCESS);
        // SAFETY: as above.
        let rc = unsafe { cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), p + 984, 16) };
        assert_eq!(rc, SUCCESS);
        assert_eq!(out, src);
        // SAFETY: the library checks the device range (past the end) first.
        let rc = unsafe { cuMemcpyHtoD_v2(p + 985, src.as_ptr().cast(), 16) };
        assert_eq!(rc, INVALID_VALUE);
        // SAFETY: an address nothing was allocated at: refused before any access.
        let rc = unsafe { cuMemcpyDtoH_v2(out.as_mut_ptr().cast(), 16, 16) };
        assert_eq!(rc, INVALID_VALUE);
        // SAFETY: as above.
        let rc = unsafe { cuMemsetD32_v2(p + 2, 1, 1) };
        assert_eq!(rc, INVALID_VALUE, "misaligned");
        // SAFETY: takes no pointer the library dereferences.
        let rc = unsafe { cuMemFree_v2(p + 8) };
        assert_eq!(rc, INVALID_VALUE, "not its start");
        // SAFETY: takes no pointer the library dereferences.
        let rc = unsafe { cuMemFree_v2(p) };
        assert_eq!(rc, SUCCESS);
        // SAFETY: takes no pointer the library dereferences.
        let rc = unsafe { cuMemFree_v2(p) };
        assert_eq!(rc, INVALID_VALUE, "freed twice");
    }

    #[test]
    fn pointer_attributes_of_device_pool_and_host_memory() {
        bound();
        let p = alloc(4096);
        let mut pool = 0;
        // SAFETY: a live local; the legacy default stream.
        let rc = unsafe { cuMemAllocAsync(&mut pool, 64, std::ptr::null_mut()) };
        assert_eq!(rc, SUCCESS);
        let host = 5u64;
        let attrs = [2u32, 9, 10, 11, 12, 17];
        for (addr, want) in [
            (p + 100, [2, 0, 1, p, 4096, 0]),
            (pool, [2, 0, 0, pool, 64, 1]),
            (
                (&raw const host) as u64,
                [0, (-2i32) as u32 as u64, 0, 0, 0, 0],
            ),
        ] {
            let mut values = [0u64; 6];
            let mut slots: Vec<*mut c_void> =
                values.iter_mut().map(|v| (v as *mut u64).cast()).collect();
            // SAFETY: six attributes, six live 8-byte slots.
            let rc = unsafe { cuPointerGetAttributes(6, attrs.as_ptr(), slots.as_mut_ptr(), addr) };
            assert_eq!(rc, SUCCESS);
            let pool_handle = values[5] != 0;
            values[5] = u64::from(pool_handle);
            assert_eq!(values, want, "{addr:#x}");
        }
        let mut out = 0u64;
        // SAFETY: a live local; host memory is refused by the single query.
        let rc =
            unsafe { cuPointerGetAttribute((&raw mut out).cast(), 2, (&raw const host) as u64) };
        assert_eq!(rc, INVALID_VALUE);
        let mut h = [0u8; 64];
        // SAFETY: a live local of 64 bytes.
        let rc = unsafe { cuIpcGetMemHandle(&mut h, pool) };
        assert_eq!(rc, INVALID_VALUE, "pool memory");
        // SAFETY: as above.
        let rc = unsafe { cuIpcGetMemHandle(&mut h, p + 4) };
        assert_eq!(rc, INVALID_VALUE, "not a start");
        // SAFETY: as above.
        let rc = unsafe { cuIpcGetMemHandle(&mut h, p) };
        assert_eq!(rc, SUCCESS);
        let mut base = 0;
        // SAFETY: a live local.
        let own = unsafe { cuIpcOpenMemHandle_v2(&mut base, IpcHandle { reserved: h }, 1) };
        assert_eq!(own, INVALID_CONTEXT, "its own allocation");
        h[0] ^= 1;
        // SAFETY: a live local.
        let bad = unsafe { cuIpcOpenMemHandle_v2(&mut base, IpcHandle { reserved: h }, 1) };
        assert_eq!(bad, INVALID_VALUE, "not a handle of the stand-in");
        // SAFETY: takes no pointer the library dereferences.
        let rc = unsafe { cuIpcCloseMemHandle(p) };
        assert_eq!(rc, INVALID_VALUE, "not a mapping");
        // SAFETY: the legacy default stream.
        let rc = unsafe { cuMemFreeAsync(pool, std::ptr::null_mut()) };
        assert_eq!(rc, SUCCESS);
        // SAFETY: takes no pointer the library dereferences.
        let rc = unsafe { cuMemFree_v2(p) };
        assert_eq!(rc, SUCCESS);
    }

    #[test]
    fn unknown_streams_and_events_are_invalid_handles() {
        bound();
        let bogus = 0x1234_5678usize as CUstream;
        // SAFETY: takes no pointer the library dereferences.
        let rc = unsafe { cuStreamSynchronize(bogus) };
        assert_eq!(rc, INVALID_HANDLE);
        // SAFETY: takes no pointer the library dereferences.
        let rc = unsafe { cuEventQuery(bogus) };
        assert_eq!(rc, INVALID_HANDLE);
        let mut e: CUevent = std::ptr::null_mut();
        // SAFETY: a live local.
        let rc = unsafe { cuEventCreate(&mut e, EVENT_DISABLE_TIMING) };
        assert_eq!(rc, SUCCESS);
        let mut h = [0u8; 64];
        // SAFETY: a live local of 64 bytes.
        let rc = unsafe { cuIpcGetEventHandle(&mut h, e) };
        assert_eq!(rc, INVALID_VALUE, "not interprocess");
        // SAFETY: takes no pointer the library dereferences.
        // SAFETY: takes no pointer the library dereferences.
        let rc = unsafe { cuStreamWaitEvent(std::ptr::null_mut(), e, 0) };
        assert_eq!(rc, SUCCESS);
        // SAFETY: takes no pointer the library dereferences.
        let rc = unsafe { cuEventDestroy_v2(e) };
        assert_eq!(rc, SUCCESS);
        // SAFETY: takes no pointer the library dereferences.
        let rc = unsafe { cuEventDestroy_v2(e) };
        assert_eq!(rc, INVALID_HANDLE, "destroyed twice");
    }

    proptest::proptest! {
        /// Hostile IPC handles (any bytes; the stand-in's magic with any process and
        /// allocation id, this process's own parent included) never map anything and never
        /// fail other than with the driver's refusals.
        #[test]
        fn no_made_up_handle_maps(
            mut bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 64),
            magic: bool,
            parent: bool,
        ) {
            bound();
            if magic {
                bytes[..8].copy_from_slice(MEM_MAGIC);
            }
            if parent {
                bytes[8..12].copy_from_slice(&std::os::unix::process::parent_id().to_le_bytes());
            }
            let reserved: [u8; 64] = bytes.try_into().unwrap_or([0; 64]);
            let mut base = 0;
            // SAFETY: a live local.
            let rc = unsafe { cuIpcOpenMemHandle_v2(&mut base, IpcHandle { reserved }, 1) };
            proptest::prop_assert!(
                [INVALID_VALUE, INVALID_CONTEXT, INVALID_DEVICE].contains(&rc),
                "{rc}"
            );
            proptest::prop_assert_eq!(base, 0);
        }
    }

    #[test]
    fn every_code_returned_has_a_name_and_a_description() {
        for code in [
            SUCCESS,
            INVALID_VALUE,
            OUT_OF_MEMORY,
            NOT_INITIALIZED,
            NO_DEVICE,
            INVALID_DEVICE,
            INVALID_CONTEXT,
            INVALID_HANDLE,
            NOT_FOUND,
            NOT_SUPPORTED,
            UNKNOWN,
        ] {
            let (name, what) = error_text(code).expect("named");
            assert!(name.starts_with("CUDA_") && name.ends_with('\0') && what.ends_with('\0'));
        }
        let mut s: *const c_char = std::ptr::NonNull::dangling().as_ptr();
        // SAFETY: a live local.
        let rc = unsafe { cuGetErrorName(12345, &mut s) };
        assert_eq!(rc, INVALID_VALUE);
        assert!(s.is_null());
    }
}
