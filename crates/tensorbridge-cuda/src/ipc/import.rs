//! The consumer's side: a handle becomes a tensor over the producer's memory, mapped once per
//! process however often it is opened, ordered after the producer's pending work on the
//! consumer's stream, and released (holder entry given back, mapping closed) only after the
//! device work enqueued on that stream before the tensor's last clone was dropped has run.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, PoisonError, Weak};

use cudarc::driver::{CudaContext, CudaStream, sys};
use tensorbridge_core::{Device, Owner, Ready, Stream, Tensor};

use super::cuda::{ImportedEvent, Mapping, ordinal_of};
use super::export::{local, unlocal};
use super::lifetime::{HOLDERS, Refusal, Registration, SlotFile, me, uid};
use super::wire::{DeviceUuid, Fields, IpcHandle, Memory, ProcessId, SlotRef};
use super::{Report, report};
use crate::CaptureStatus;
use crate::Error;
use crate::capture::{Fork, WaitPlan, capture_of, keep_with_graph, plan_wait};
use crate::context::{bind, device, device_of_stream};
use crate::event::{Event, Wait};
use crate::raw::ensure_driver;
use crate::raw_stream;
use crate::scope::with_spare;

/// What this process has open of other processes' shares. Lifetime files and holds are
/// found again through weak references (the tensors own them); mappings and imported events
/// are counted here, under this lock, by the holds that use them, and closed here when the
/// count falls to zero: a mapping is then never opened again while its close is still on its
/// way (CUDA refuses to map one allocation twice in a context).
struct Consumer {
    files: HashMap<(ProcessId, u64), Weak<SlotFile>>,
    holds: HashMap<(ProcessId, SlotRef), Weak<Held>>,
    mappings: HashMap<MapKey, (Mapping, usize)>,
    events: HashMap<[u8; 64], (Arc<ImportedEvent>, usize)>,
}

/// An allocation of a producer, on a GPU: the producer's address names it while it lives,
/// and it lives while any share of it is held (a held share keeps its memory alive). The
/// memory handle is part of the key: a handle that names another allocation at the same
/// address (or another producer with the same pid, in another PID namespace) never reuses
/// this mapping.
type MapKey = (ProcessId, u64, DeviceUuid, [u8; 64]);

static CONSUMER: LazyLock<Mutex<Consumer>> = LazyLock::new(|| {
    Mutex::new(Consumer {
        files: HashMap::new(),
        holds: HashMap::new(),
        mappings: HashMap::new(),
        events: HashMap::new(),
    })
});

/// Holds waiting (in the crate's retire queue) for their streams' work to finish.
static RETIRING: AtomicUsize = AtomicUsize::new(0);

/// How many released shares still wait for device work before their holder entry is given
/// back.
pub(crate) fn retiring() -> usize {
    RETIRING.load(Ordering::SeqCst)
}

/// This process's hold on one share: the holder entry in the producer's lifetime file, and
/// a use of the mapping of the allocation and of the imported event. Shared by every open of
/// the share in this process; dropped (the uses given back, the entry last) after the last
/// of them is released and its device work has run.
pub(crate) struct Held {
    mapping: MapKey,
    base: u64,
    /// The mapped size, as the driver reports it: what every later open of this hold is
    /// checked against.
    mapped: u64,
    event: Option<(Arc<ImportedEvent>, [u8; 64])>,
    registration: Option<Registration>,
    /// The process that made the hold: a forked child's drop of an inherited copy changes
    /// nothing (the hold, its mapping and its lock are the parent's).
    pid: u32,
}

impl Held {
    fn base(&self) -> u64 {
        self.base
    }

    /// The first open, for which this hold was made, failed after it: its ticket goes back.
    fn cancel(&self) {
        if let Some(r) = &self.registration {
            r.cancel();
        }
    }

    /// Checks an open that reuses this hold exactly as a first open is checked: the same
    /// allocation (memory handle, device, producer address), the same event, and an
    /// allocation size (inside which the decoder placed the view) within what is mapped.
    fn check_reuse(&self, x: &Fields) -> Result<(), Error> {
        let (_, base, uuid, mem) = &self.mapping;
        if *mem != x.mem_handle || *uuid != x.uuid || *base != x.producer_base {
            return Err(Error::IpcHandleField {
                field: "memory handle",
                value: x.producer_base,
                expected: "the allocation this process already maps for that share",
            });
        }
        if self.event.as_ref().map(|(_, h)| h) != x.event_handle.as_ref() {
            return Err(Error::IpcHandleField {
                field: "event handle",
                value: u64::from(x.event_handle.is_some()),
                expected: "the event this process already waits on for that share",
            });
        }
        if x.alloc_size > self.mapped {
            return Err(Error::IpcHandleField {
                field: "allocation size",
                value: x.alloc_size,
                expected: "at most the size of the allocation the memory handle maps",
            });
        }
        Ok(())
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if self.pid != std::process::id() {
            // A forked child: nothing of this is the child's to close or give back, and the
            // consumer's lock may have been held by a parent thread at the fork.
            if let Some(r) = self.registration.take() {
                drop(r); // a no-op in another process
            }
            if let Some((event, _)) = self.event.take() {
                std::mem::forget(event);
            }
            return;
        }
        // The mapping and the event first (closed if this was their last user), the holder
        // entry last: the producer may free and reuse the memory once the entry is back.
        {
            let mut c = consumer();
            c.unuse_mapping(&self.mapping);
            if let Some((event, handle)) = self.event.take() {
                drop(event);
                c.unuse_event(&handle);
            }
        }
        if let Some(registration) = self.registration.take() {
            let producer = registration.producer();
            let alive = registration.producer_alive();
            drop(registration);
            if !alive {
                report(Report::ProducerGone { pid: producer.pid });
            }
        }
    }
}

/// A tensor's owner for one open: when the tensor's last clone is dropped, the hold is kept
/// until the work enqueued so far on the stream it was opened on has run on the device.
struct Lease {
    held: Option<Arc<Held>>,
    on: ReleaseOn,
}

enum ReleaseOn {
    /// A raw stream of device `ordinal`'s primary context (or one of its default streams),
    /// which the caller of `import_raw` keeps live as long as the tensor.
    Raw { ordinal: u32, stream: Stream },
    /// A cudarc stream, kept live by this `Arc`.
    Cudarc(Arc<CudaStream>),
}

/// A hold in the retire queue (counted, so the reaper knows something is pending).
struct Retiring {
    /// Never read: held until the retire queue drops it.
    _held: Arc<Held>,
}

impl Drop for Retiring {
    fn drop(&mut self) {
        RETIRING.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let Some(held) = self.held.take() else {
            return;
        };
        if held.pid != std::process::id() {
            // A forked child (which cannot use CUDA): the hold is the parent's; leave it.
            std::mem::forget(held);
            return;
        }
        RETIRING.fetch_add(1, Ordering::SeqCst);
        let owner: Owner = Arc::new(Retiring { _held: held });
        match &self.on {
            // SAFETY: the caller of `import_raw` vouched that `stream` stays live as long as
            // the tensor or a clone of it lives; this runs as the last clone's owner drops,
            // so it is live for the call. It is a stream of device `ordinal`'s primary context
            // (`import_raw` computed `ordinal` from it) or a default stream of that device.
            ReleaseOn::Raw { ordinal, stream } => unsafe {
                crate::retire_on_raw(*ordinal, *stream, owner)
            },
            ReleaseOn::Cudarc(stream) => crate::retire_on(stream, owner),
        }
        // No `wake_reaper`: the retire queue's threads release the hold when the device is
        // done (the ipc reaper moves only the shares in limbo, which this is not).
    }
}

fn consumer() -> MutexGuard<'static, Consumer> {
    CONSUMER.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Consumer {
    /// Forgets the entries nothing uses any more.
    fn prune(&mut self) {
        self.files.retain(|_, w| w.strong_count() > 0);
        self.holds.retain(|_, w| w.strong_count() > 0);
    }

    fn file(&mut self, x: &Fields) -> Result<Arc<SlotFile>, Error> {
        let key = (x.producer, x.slot.nonce);
        if let Some(file) = self.files.get(&key).and_then(Weak::upgrade) {
            return Ok(file);
        }
        // No file: its producer removed it once its last share was freed (or, having died,
        // another producer of this user removed it).
        let Some(file) = SlotFile::open(x.producer, x.uid, x.slot.nonce)? else {
            return Err(Error::IpcReleased {
                pid: x.producer.pid,
            });
        };
        if !file.producer_alive() {
            return Err(Error::IpcProducerGone {
                pid: x.producer.pid,
            });
        }
        let file = Arc::new(file);
        self.files.insert(key, Arc::downgrade(&file));
        Ok(file)
    }

    /// A use of the mapping of `x`'s allocation (opened now if this process has none).
    fn use_mapping(&mut self, x: &Fields, ordinal: u32) -> Result<(MapKey, u64, u64), Error> {
        let key = (x.producer, x.producer_base, x.uuid, x.mem_handle);
        if let Some((m, users)) = self.mappings.get_mut(&key) {
            // The allocation at that address is still the one mapped: a share of it is held
            // (by the users of `m`), so the producer cannot have freed it.
            if m.size < x.alloc_size {
                return Err(Error::IpcHandleField {
                    field: "allocation size",
                    value: x.alloc_size,
                    expected: "at most the size of the allocation the memory handle maps",
                });
            }
            *users += 1;
            return Ok((key, m.base, m.size));
        }
        let m = Mapping::open(&x.mem_handle, ordinal, x.alloc_size)?;
        let (base, size) = (m.base, m.size);
        self.mappings.insert(key, (m, 1));
        Ok((key, base, size))
    }

    /// Gives back a use of a mapping; the last one closes it (here, under the lock).
    fn unuse_mapping(&mut self, key: &MapKey) {
        if let Some((_, users)) = self.mappings.get_mut(key) {
            *users -= 1;
            if *users == 0 {
                self.mappings.remove(key);
            }
        }
    }

    fn use_event(&mut self, handle: &[u8; 64], ordinal: u32) -> Result<Arc<ImportedEvent>, Error> {
        if let Some((e, users)) = self.events.get_mut(handle) {
            *users += 1;
            return Ok(e.clone());
        }
        let e = Arc::new(ImportedEvent::open(handle, ordinal)?);
        self.events.insert(*handle, (e.clone(), 1));
        Ok(e)
    }

    fn unuse_event(&mut self, handle: &[u8; 64]) {
        if let Some((_, users)) = self.events.get_mut(handle) {
            *users -= 1;
            if *users == 0 {
                self.events.remove(handle);
            }
        }
    }

    /// This process's hold on the share `x` names: the existing one, or a new holder entry,
    /// mapping and imported event.
    fn acquire(&mut self, x: &Fields, ordinal: u32) -> Result<(Arc<Held>, bool), Error> {
        let key = (x.producer, x.slot);
        if let Some(held) = self.holds.get(&key).and_then(Weak::upgrade) {
            held.check_reuse(x)?;
            return Ok((held, false));
        }
        self.prune();
        let file = self.file(x)?;
        if x.slot.slot >= file.slots {
            return Err(Error::IpcHandleField {
                field: "lifetime slot",
                value: u64::from(x.slot.slot),
                expected: "a slot of the producer's lifetime file",
            });
        }
        let mut dead = Vec::new();
        let registration = file.register(x.slot.slot, x.slot.generation, &mut dead);
        for pid in dead {
            report(Report::ConsumerDied { pid });
        }
        let registration = registration.map_err(|r| refusal(r, x.producer))?;
        // From here, an error cancels `registration`: the entry and the ticket go back.
        let (mapping, base, mapped) = match self.use_mapping(x, ordinal) {
            Ok(m) => m,
            Err(e) => {
                registration.cancel();
                return Err(e);
            }
        };
        let event = match &x.event_handle {
            Some(h) => match self.use_event(h, ordinal) {
                Ok(e) => Some((e, *h)),
                Err(e) => {
                    self.unuse_mapping(&mapping);
                    registration.cancel();
                    return Err(e);
                }
            },
            None => None,
        };
        let held = Arc::new(Held {
            mapping,
            base,
            mapped,
            event,
            registration: Some(registration),
            pid: std::process::id(),
        });
        self.holds.insert(key, Arc::downgrade(&held));
        Ok((held, true))
    }
}

fn refusal(r: Refusal, producer: ProcessId) -> Error {
    match r {
        Refusal::Released => Error::IpcReleased { pid: producer.pid },
        Refusal::Full => Error::IpcTooManyConsumers { limit: HOLDERS },
        Refusal::File(e) => e,
    }
}

/// Makes `stream` (of `ctx`) wait on the device for the producer's work the event captured,
/// by the capture rules every hand-off follows (`capture::plan_wait`, the producer's record
/// being outside any capture of this process): inside a capture, an external wait that the
/// graph keeps (with the imported event) for its replays; the legacy default stream during
/// another stream's capture is refused.
///
/// # Safety
/// The caller guarantees:
/// 1. `stream` is a live stream of `ctx` (or a default-stream sentinel) for the call.
unsafe fn wait(
    event: &Arc<ImportedEvent>,
    ctx: &CudaContext,
    stream: sys::CUstream,
) -> Result<(), Error> {
    // Bound for both calls (the wait binds it again, which then costs no switch).
    let _bound = bind(ctx)?;
    // The producer's work is usually done by the time a consumer opens the share: then
    // there is nothing to wait for, and no wait is enqueued (a stream waiting on an
    // interprocess event made the consumer's first use of the data about 100 us slower than
    // `torch.multiprocessing`'s, two H200s). An event that has completed stays complete for
    // this share: the producer records it once, before the handle exists.
    if event.0.is_complete()? {
        return Ok(());
    }
    // SAFETY: `stream` is live and its context current (obligation 1).
    let capture = unsafe { capture_of(stream) }?;
    let legacy = crate::stream_from_raw(stream) == Stream::LegacyDefault;
    let plan = plan_wait(CaptureStatus::None, capture, Fork::Refused, legacy)?;
    let how = match plan {
        WaitPlan::Wait => Wait::Default,
        WaitPlan::WaitExternal(_) => Wait::External,
    };
    let home = event.0.context();
    if home.cu_ctx() != ctx.cu_ctx() {
        // A stream of another GPU than the share's: the driver crashed (SIGSEGV inside
        // `cuStreamWaitEvent`, two H200s) when such a stream waited on an interprocess event
        // opened on the share's GPU. The wait hops through that GPU: a spare stream there
        // waits on the interprocess event and records an ordinary event, which `stream`
        // waits on (an event of another device, which `cuStreamWaitEvent` takes). Nothing
        // waits on the host.
        let hop = Event::in_context(home)?;
        with_spare(home, |spare| {
            // SAFETY: the spare stream is live in `home` for the closure; the imported event
            // is open (kept by its exporter while this process holds the share).
            unsafe { event.0.make_wait_in(spare.cu_stream(), home, Wait::Default) }?;
            // SAFETY: as above; `hop` is an event of `home`, the spare stream's context.
            unsafe { hop.record(spare.cu_stream()) }
        })?;
        // SAFETY: `stream` is live (obligation 1); `hop` is live until it drops below (or
        // with the graph that waits on it).
        unsafe { hop.make_wait_in(stream, ctx, how) }?;
        if let WaitPlan::WaitExternal(active) = plan {
            keep_with_graph(active, Box::new(hop));
        }
        return Ok(());
    }
    // SAFETY: `stream` is live (obligation 1); the event is an open imported event, which its
    // exporter keeps alive while this process holds the share.
    unsafe { event.0.make_wait_in(stream, ctx, how) }?;
    if let WaitPlan::WaitExternal(active) = plan {
        keep_with_graph(active, Box::new(event.clone()));
    }
    Ok(())
}

/// Where an open is going: the checks every open makes first, and the shortcuts that need no
/// mapping.
enum Plan {
    /// The producer's own process: its tensor, and whether the open took a ticket.
    Own(Tensor, bool),
    /// A tensor without elements: nothing to map.
    Empty(Tensor),
    /// Another process's memory, on this process's device `ordinal`.
    Map { ordinal: u32 },
}

fn plan(handle: &IpcHandle, consumer: Stream) -> Result<Plan, Error> {
    ensure_driver()?;
    if consumer == Stream::PerThreadDefault {
        return Err(Error::IpcStream { stream: consumer });
    }
    super::collect();
    let x = handle.fields();
    if x.memory == Memory::None {
        let ordinal = ordinal_of(x.uuid)?;
        let desc = x.descriptor_at(0, Device::cuda(ordinal))?;
        // SAFETY: a tensor without elements has no bytes to keep valid.
        let t = unsafe { Tensor::from_descriptor(desc, Arc::new(())) };
        return Ok(Plan::Empty(t));
    }
    if x.uid != uid() {
        return Err(Error::IpcOtherUser {
            handle_uid: x.uid,
            uid: uid(),
        });
    }
    if x.producer == me()
        && let Some(own) = local(&x.slot)
    {
        return own
            .map(|(t, ticket)| Plan::Own(t, ticket))
            .map_err(|r| refusal(r, x.producer));
    }
    Ok(Plan::Map {
        ordinal: ordinal_of(x.uuid)?,
    })
}

/// Opens a share on a cudarc stream: the tensor over the producer's memory (mapped in this
/// process on the producer's GPU, found by its UUID), whose data is ready on `consumer` (it
/// waits, on the device, for the producer's work pending when the handle was made). When the
/// tensor's last clone is dropped, this process lets go of the share after the work enqueued
/// on `consumer` by then has run (never blocking the host); the producer frees the memory
/// when its last holder has let go. Opening the same share again in this process reuses its
/// mapping.
///
/// In the producer's own process, the producer's tensor itself (handed to `consumer`).
/// Refused: a GPU this process does not see ([`Error::IpcDeviceNotVisible`]), a producer
/// that has exited ([`Error::IpcProducerGone`]), a share released before this open
/// ([`Error::IpcReleased`]), the per-thread default stream ([`Error::IpcStream`]).
pub fn import(handle: &IpcHandle, consumer: &Arc<CudaStream>) -> Result<Tensor, Error> {
    let name = crate::stream_of(consumer);
    let ordinal = match plan(handle, name)? {
        Plan::Own(own, ticket) => {
            return crate::handoff(&own, consumer).inspect_err(|_| {
                if ticket {
                    unlocal(&handle.fields().slot);
                }
            });
        }
        Plan::Empty(t) => return Ok(t),
        Plan::Map { ordinal } => ordinal,
    };
    let x = handle.fields();
    let (held, fresh) = consumer_acquire(x, ordinal)?;
    let prepared = (|| -> Result<_, Error> {
        if let Some((event, _)) = &held.event {
            // SAFETY: a cudarc stream borrowed for the call is live, in its own context.
            unsafe { wait(event, consumer.context(), consumer.cu_stream()) }?;
        }
        let desc = x.descriptor_at(held.base() as usize, Device::cuda(ordinal))?;
        Ok((desc, crate::ready_on(consumer)?))
    })();
    let (desc, ready) = prepared.inspect_err(|_| {
        if fresh {
            held.cancel();
        }
    })?;
    let lease = Lease {
        held: Some(held),
        on: ReleaseOn::Cudarc(consumer.clone()),
    };
    // SAFETY: the span lies inside the mapping (checked against the allocation's size when it
    // was opened, and the layout against that size when the handle was decoded), which stays
    // mapped, and the producer's memory alive (the holder entry), until the lease's last
    // release has run; the producer's pending writes are waited for on `consumer` (above).
    let t = unsafe { Tensor::from_descriptor(desc, Arc::new(lease)) };
    // SAFETY:
    // - 1: `consumer` waited for the producer's pending work (above): work ordered after it
    //   sees every write;
    // - 2: `ready` names `consumer` only as a stream of a primary context, and the tensor's
    //   owner (the lease) holds the `Arc` that keeps it alive;
    // - 3: the per-thread default stream was refused (`plan`).
    Ok(unsafe { t.with_ready(ready) })
}

/// [`import`] for a raw consumer stream: a handle of a stream of any device's primary context
/// (PyTorch's, CuPy's), or the legacy default stream of the producer's GPU.
///
/// # Safety
/// The caller guarantees:
/// 1. `consumer` is a live stream for the duration of the call and stays live until the
///    returned tensor and every clone of it have been dropped (its readiness names it, and
///    the release is ordered on it when the last clone drops).
pub unsafe fn import_raw(handle: &IpcHandle, consumer: Stream) -> Result<Tensor, Error> {
    let ordinal = match plan(handle, consumer)? {
        Plan::Own(own, ticket) => {
            // SAFETY: obligation 1 is `handoff_raw`'s 1; its 2 (the per-thread stream) cannot
            // arise: `plan` refused it.
            return unsafe { crate::handoff_raw(&own, consumer) }.inspect_err(|_| {
                if ticket {
                    unlocal(&handle.fields().slot);
                }
            });
        }
        Plan::Empty(t) => return Ok(t),
        Plan::Map { ordinal } => ordinal,
    };
    let x = handle.fields();
    // The stream's own context and device: a handle says where it is; the default streams
    // are those of the producer's GPU here.
    let ctx = match consumer {
        // SAFETY: a live handle (obligation 1).
        Stream::Handle(h) => unsafe { device_of_stream(h) }?.ctx().clone(),
        _ => device(ordinal)?.ctx().clone(),
    };
    let release_ordinal = u32::try_from(ctx.ordinal()).unwrap_or(u32::MAX);
    let (held, fresh) = consumer_acquire(x, ordinal)?;
    let prepared = (|| -> Result<_, Error> {
        if let Some((event, _)) = &held.event {
            // SAFETY: `consumer` is live (obligation 1), a stream of `ctx` or a default stream.
            unsafe { wait(event, &ctx, raw_stream(consumer)) }?;
        }
        x.descriptor_at(held.base() as usize, Device::cuda(ordinal))
    })();
    let desc = prepared.inspect_err(|_| {
        if fresh {
            held.cancel();
        }
    })?;
    let lease = Lease {
        held: Some(held),
        on: ReleaseOn::Raw {
            ordinal: release_ordinal,
            stream: consumer,
        },
    };
    // SAFETY: as in `import`.
    let t = unsafe { Tensor::from_descriptor(desc, Arc::new(lease)) };
    // SAFETY:
    // - 1: `consumer` waited for the producer's pending work (above);
    // - 2: `consumer` stays live as long as the tensor and its clones (obligation 1);
    // - 3: the per-thread default stream was refused (`plan`).
    Ok(unsafe { t.with_ready(Ready::Stream(consumer)) })
}

/// This process's hold on the share `x` names, and whether it was made by this call.
fn consumer_acquire(x: &Fields, ordinal: u32) -> Result<(Arc<Held>, bool), Error> {
    consumer().acquire(x, ordinal)
}

/// A retirement that never completes, counted as [`Lease`]'s drop counts one (the count goes
/// back when the guard drops): what a hold whose owner is kept for ever looks like.
#[cfg(test)]
pub(super) fn leak_retirement() -> impl Drop {
    struct Counted;
    impl Drop for Counted {
        fn drop(&mut self) {
            RETIRING.fetch_sub(1, Ordering::SeqCst);
        }
    }
    RETIRING.fetch_add(1, Ordering::SeqCst);
    Counted
}
