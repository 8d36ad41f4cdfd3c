//! The producer's side: a tensor becomes a share (a lifetime slot, an interprocess event for
//! its pending work, the legacy IPC handle of its whole allocation) and a handle; the shares
//! whose producer handle is gone wait in limbo, owner and all, until their last consumer has
//! let go.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use tensorbridge_core::{DeviceType, Tensor};

use super::cuda::{IpcEvent, check_shareable, device_uuid, mem_handle};
use super::lifetime::{MAX_CONSUMERS, Refusal, SLOTS, SlotFile, me, uid};
use super::wire::{Fields, IpcHandle, MAX_GENERATION, Memory, SlotRef};
use super::{Report, report};
use crate::raw::ensure_driver;
use crate::{Error, MemoryType, check_span};

/// A slot of one of this process's lifetime files.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Key {
    file: usize,
    slot: u32,
}

/// A share this process made, alive (its handle held) or in limbo (waiting for consumers).
struct Entry {
    generation: u64,
    /// Keeps the memory (the tensor's owner) alive; dropped when the share is freed.
    tensor: Tensor,
    /// The interprocess event consumers wait on; back to the pool with the share. Never
    /// read: held so that it drops with the share.
    _event: Option<IpcEvent>,
    /// The producer's handle is gone: freed once no consumer holds it.
    closed: bool,
}

/// How long a lifetime file whose last share was freed stays for the next share before its
/// producer removes it. Making a file is a dozen system calls and a scan of the directory for
/// stale files, which a process sharing one tensor at a time would otherwise pay on every
/// share (most of a share's cost); a file kept idle costs one descriptor and 64 KiB of
/// `/dev/shm`. A producer that exits within this time leaves the file to the next producer's
/// scan (its liveness lock went with the process).
pub(crate) const LINGER: Duration = Duration::from_secs(1);

struct Producer {
    /// This process's lifetime files; `None` once removed (its last share freed and
    /// [`LINGER`] passed).
    files: Vec<Option<Arc<SlotFile>>>,
    /// Since when each file (by index) has had no share, for those that have none.
    idle: HashMap<usize, Instant>,
    free: Vec<Key>,
    next_generation: u64,
    live: HashMap<Key, Entry>,
}

static PRODUCER: LazyLock<Mutex<Producer>> = LazyLock::new(|| {
    Mutex::new(Producer {
        files: Vec::new(),
        idle: HashMap::new(),
        free: Vec::new(),
        next_generation: 1,
        live: HashMap::new(),
    })
});

fn producer() -> MutexGuard<'static, Producer> {
    PRODUCER.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Producer {
    /// A free slot (a new lifetime file when every slot is taken) and a fresh generation.
    fn allocate(&mut self) -> Result<(Key, u64), Error> {
        if self.next_generation > MAX_GENERATION {
            return Err(Error::IpcHandleField {
                field: "slot generation",
                value: self.next_generation,
                expected: "1 to 2^40 - 1 (this process has made 2^40 shares)",
            });
        }
        // A file whose size was changed under it gets no new share (its consumers would be
        // refused); it goes once the shares still in it are freed.
        let damaged: Vec<usize> = self
            .files
            .iter()
            .enumerate()
            .filter(|(_, f)| f.as_ref().is_some_and(|f| !f.intact()))
            .map(|(i, _)| i)
            .collect();
        if !damaged.is_empty() {
            self.free.retain(|k| !damaged.contains(&k.file));
            for i in damaged {
                self.retire_file_if_unused(i);
            }
        }
        let key = match self.free.pop() {
            Some(key) => {
                self.idle.remove(&key.file);
                key
            }
            None => {
                let made = Some(Arc::new(SlotFile::create()?));
                let file = match self.files.iter().position(Option::is_none) {
                    Some(i) => {
                        self.files[i] = made;
                        i
                    }
                    None => {
                        self.files.push(made);
                        self.files.len() - 1
                    }
                };
                self.free
                    .extend((1..SLOTS).rev().map(|slot| Key { file, slot }));
                Key { file, slot: 0 }
            }
        };
        let generation = self.next_generation;
        self.next_generation += 1;
        Ok((key, generation))
    }

    /// The file of `key`, which a live share or a free slot names (so it is there).
    fn file(&self, key: Key) -> Option<Arc<SlotFile>> {
        self.files.get(key.file).cloned().flatten()
    }

    /// Removes file `i` (name and all) if no share in it is left.
    fn retire_file_if_unused(&mut self, i: usize) {
        if self.live.keys().any(|k| k.file == i) {
            return;
        }
        if let Some(file) = self.files.get_mut(i).and_then(Option::take) {
            file.remove();
            self.free.retain(|k| k.file != i);
        }
        self.idle.remove(&i);
    }

    /// Marks the files without a share idle (from `now`), and removes those idle for
    /// [`LINGER`]; how many stay, idle.
    fn retire_idle_files(&mut self, now: Instant) -> usize {
        let mut lingering = 0;
        for i in 0..self.files.len() {
            if self.files[i].is_none() || self.live.keys().any(|k| k.file == i) {
                self.idle.remove(&i);
                continue;
            }
            let since = *self.idle.entry(i).or_insert(now);
            if now.duration_since(since) >= LINGER {
                self.retire_file_if_unused(i);
            } else {
                lingering += 1;
            }
        }
        lingering
    }
}

/// The producer's hold on a share: while any clone lives, consumers may open the handle (with
/// or without a ticket); when the last is dropped, the share waits in limbo for the consumers
/// that hold it, or still have a ticket to, and is freed (its tensor dropped, once) when the
/// last of them lets go. Cheap to clone.
#[derive(Clone)]
pub struct Shared {
    inner: Arc<SharedInner>,
}

struct SharedInner {
    handle: IpcHandle,
    /// The process that shared: in a forked child, dropping an inherited copy changes nothing.
    pid: u32,
    /// `None` for a tensor without elements (nothing to keep).
    key: Option<Key>,
}

impl Shared {
    /// The handle to send to the consumers.
    pub fn handle(&self) -> &IpcHandle {
        &self.inner.handle
    }

    /// How many of the expected consumers have not opened the share yet.
    pub fn tickets_left(&self) -> u32 {
        self.inner.key.map_or(0, |key| {
            let file = producer().file(key);
            file.map_or(0, |f| f.tickets(key.slot))
        })
    }

    /// The process ids of the consumers that hold the share now.
    pub fn holders(&self) -> Vec<u32> {
        self.inner.key.map_or_else(Vec::new, |key| {
            let file = producer().file(key);
            file.map_or_else(Vec::new, |f| f.holders(key.slot))
        })
    }
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared")
            .field("handle", &self.inner.handle)
            .finish()
    }
}

impl Drop for SharedInner {
    fn drop(&mut self) {
        let Some(key) = self.key else {
            return;
        };
        if self.pid != std::process::id() {
            // A forked child's copy: the share is the parent's. Nothing here takes a lock the
            // parent's threads may have held at the fork.
            return;
        }
        let closing = {
            let mut p = producer();
            let file = p.file(key);
            p.live.get_mut(&key).and_then(|entry| {
                entry.closed = true;
                file.map(|f| (f, entry.generation))
            })
        };
        // Outside the producer's lock: the file's slot lock may take a moment.
        if let Some((file, generation)) = closing {
            file.close(key.slot, generation);
        }
        // Freed at once when no consumer holds it; otherwise the reaper watches it.
        super::collect();
        super::wake_reaper();
    }
}

/// Shares `tensor` with other processes of this user on this machine: its whole allocation
/// gets a legacy CUDA IPC handle, its pending work an interprocess event (recorded on the GPU,
/// never waited for on the host), and the share a lifetime slot that `consumers` processes
/// hold a ticket to. The memory stays alive (the tensor's owner is kept) while the returned
/// [`Shared`] lives, and after it until every ticket has been used and every consumer process
/// has released the share; it is released exactly once then.
///
/// `consumers` is how many processes the handle is meant for: up to that many may open it
/// after the producer's [`Shared`] is dropped (a fire-and-forget send through a queue); more
/// may open it while the [`Shared`] lives. 0: only while it lives. An expected consumer that
/// never opens the handle keeps the memory until this process exits.
///
/// Refused, with the reason: memory that is not CUDA device memory ([`Error::IpcNotDevice`],
/// [`Error::IpcMemoryType`]), virtual memory mappings ([`Error::IpcVirtualMemory`]: PyTorch's
/// expandable segments), stream-ordered pool memory ([`Error::IpcPoolMemory`]: cudarc's
/// allocations, `cudaMallocAsync`), anything else the driver will not share
/// ([`Error::IpcNotShareable`]), data produced inside a CUDA graph capture
/// ([`Error::CaptureMismatch`]), and no driver ([`Error::NoDriver`]).
pub fn export(tensor: &Tensor, consumers: u32) -> Result<Shared, Error> {
    if consumers > MAX_CONSUMERS {
        return Err(Error::IpcHandleField {
            field: "consumer count",
            value: u64::from(consumers),
            expected: "at most 8388607",
        });
    }
    let device = tensor.device();
    if device.kind != DeviceType::Cuda {
        return Err(Error::IpcNotDevice { device });
    }
    ensure_driver()?;
    super::collect();
    let ordinal = device.ordinal;
    let uuid = device_uuid(ordinal)?;
    // The offset folded into the pointer: the handle's base offset is then the distance from
    // the allocation's start to the data pointer, which the driver places inside it.
    let desc = tensor.descriptor().with_offset_folded();
    let mut fields = Fields {
        access: desc.access(),
        packing: desc.packing(),
        memory: Memory::None,
        dtype: desc.dtype(),
        shape: desc.shape().to_vec(),
        strides: desc.strides_elems().to_vec(),
        byte_offset: 0,
        producer: me(),
        uid: uid(),
        slot: SlotRef {
            nonce: 0,
            slot: 0,
            generation: 0,
        },
        alloc_size: 0,
        base_offset: 0,
        producer_base: 0,
        uuid,
        mem_handle: [0; 64],
        event_handle: None,
    };
    if desc.numel() == 0 {
        return Ok(Shared {
            inner: Arc::new(SharedInner {
                handle: IpcHandle::encode(fields),
                pid: std::process::id(),
                key: None,
            }),
        });
    }
    // The driver's word on the address (asked in the tensor's device's context): the whole
    // span inside one allocation of that device, and device memory, not managed.
    let info = check_span(&desc)?.ok_or(Error::NotAllocation {
        addr: desc.data_ptr(),
    })?;
    if info.memory != MemoryType::Device {
        return Err(Error::IpcMemoryType {
            addr: desc.data_ptr(),
            memory: info.memory,
        });
    }
    check_shareable(info.base, ordinal)?;
    let handle = mem_handle(info.base, ordinal)?;
    let event = if tensor.ready().is_now() {
        None
    } else {
        Some(IpcEvent::record_pending(tensor, ordinal)?)
    };
    fields.memory = Memory::Legacy;
    fields.alloc_size = info.size as u64;
    fields.base_offset = (desc.data() - info.base) as u64;
    fields.producer_base = info.base as u64;
    fields.mem_handle = handle;
    fields.event_handle = event.as_ref().map(|e| e.handle);

    let mut p = producer();
    let (key, generation) = p.allocate()?;
    let Some(file) = p.file(key) else {
        p.free.push(key);
        return Err(Error::IpcLifetimeFile {
            op: "create",
            path: super::lifetime::SHM_DIR.into(),
            errno: libc::ENOENT,
        });
    };
    fields.slot = SlotRef {
        nonce: file.nonce,
        slot: key.slot,
        generation,
    };
    let handle = IpcHandle::encode(fields);
    // What every consumer will check: refuse here, at the producer, what they would refuse.
    if let Err(e) = IpcHandle::from_bytes(handle.as_bytes()) {
        p.free.push(key);
        return Err(e);
    }
    if let Err(e) = file.assign(key.slot, generation, consumers) {
        p.free.push(key);
        return Err(e);
    }
    p.live.insert(
        key,
        Entry {
            generation,
            tensor: tensor.clone(),
            _event: event,
            closed: false,
        },
    );
    Ok(Shared {
        inner: Arc::new(SharedInner {
            handle,
            pid: std::process::id(),
            key: Some(key),
        }),
    })
}

/// The tensor of this process's own live share `slot` (an open in the producer's process
/// takes a ticket, as another process's would, and holds the memory through the tensor's
/// owner), and whether a ticket was taken (to give back with [`unlocal`] if the open fails).
/// `None`: no file of this process has that nonce (the handle is another process's, which
/// may carry the same pid in another PID namespace).
pub(crate) fn local(slot: &SlotRef) -> Option<Result<(Tensor, bool), Refusal>> {
    let p = producer();
    let file = p
        .files
        .iter()
        .position(|f| f.as_ref().is_some_and(|f| f.nonce == slot.nonce))?;
    let key = Key {
        file,
        slot: slot.slot,
    };
    Some(match (p.live.get(&key), p.file(key)) {
        (Some(entry), Some(f)) if entry.generation == slot.generation => f
            .take_ticket(slot.slot, slot.generation)
            .map(|ticket| (entry.tensor.clone(), ticket)),
        _ => Err(Refusal::Released),
    })
}

/// Gives back the ticket an open in the producer's own process took before it failed.
pub(crate) fn unlocal(slot: &SlotRef) {
    let p = producer();
    if let Some(f) = p.files.iter().flatten().find(|f| f.nonce == slot.nonce) {
        f.return_ticket(slot.slot, slot.generation);
    }
}

/// Frees the shares in limbo that no consumer holds any more (dead consumers' holds are taken
/// back and reported), and removes the lifetime files idle for [`LINGER`]; returns how many
/// shares still wait and how many files linger.
pub(crate) fn collect() -> Collected {
    let mut freed = Vec::new();
    let mut dead = Vec::new();
    let (waiting, lingering) = {
        let mut p = producer();
        let closed: Vec<Key> = p
            .live
            .iter()
            .filter(|(_, e)| e.closed)
            .map(|(k, _)| *k)
            .collect();
        let mut waiting = 0;
        for key in closed {
            let generation = p.live.get(&key).map_or(0, |e| e.generation);
            let released = p
                .file(key)
                .is_none_or(|f| f.is_released(key.slot, generation, &mut dead));
            if released {
                freed.extend(p.live.remove(&key));
                p.free.push(key);
            } else {
                waiting += 1;
            }
        }
        (waiting, p.retire_idle_files(Instant::now()))
    };
    for pid in dead {
        report(Report::ConsumerDied { pid });
    }
    // Owners drop outside the lock: a Python owner takes the GIL, a cudarc one frees memory.
    drop(freed);
    Collected { waiting, lingering }
}

/// What [`collect`] left: shares waiting for consumers, and idle lifetime files waiting for
/// [`LINGER`] to pass.
pub(crate) struct Collected {
    pub(crate) waiting: usize,
    pub(crate) lingering: usize,
}
