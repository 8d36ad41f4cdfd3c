//! Stream hand-off on the driver API: the core's [`ReadySignal`] as a recorded CUDA event,
//! and the functions that order a consumer stream after a tensor's producer, on the GPU.
//!
//! Two kinds of consumer: a cudarc stream, live for the call by construction (the safe
//! [`make_ready_on`] and [`handoff`]), and a raw [`Stream`] value, which safe code can
//! make from any number and so must be vouched for (the `unsafe` [`make_ready_on_raw`] and
//! [`handoff_raw`]). A tensor's own readiness was vouched for by whoever attached it
//! ([`Tensor::with_ready`]), so the functions that use only that ([`record_ready`],
//! [`synchronize`]) are safe.

use std::any::Any;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream, sys};
use tensorbridge_core::{
    Device, DeviceType, Ready, ReadySignal, SignalError, Stream, Tensor, TensorRef,
};

use crate::capture::{Capture, Fork, WaitPlan, capture_of, keep_with_graph, plan_wait};
use crate::context::{DeviceCtx, bind, current_device, device, device_of_stream};
use crate::error::Error;
use crate::event::{Event, Wait};
use crate::types::{CaptureStatus, raw_stream, stream_of};

/// A CUDA event recorded on a producer stream: the [`ReadySignal`] this crate attaches to
/// tensors ([`Ready::Signal`]).
///
/// The event captures the producer's work at the moment it was recorded; work the producer
/// enqueues afterwards does not delay consumers that wait on it. Events come from a per-device
/// pool (created with `CU_EVENT_DISABLE_TIMING`) and go back when the last clone of the
/// signal is dropped (and no CUDA graph waits on it any more); waits enqueued before that
/// are unaffected.
///
/// As a [`ReadySignal`], it names its producer ([`ReadySignal::producer_stream`], which the
/// CUDA Array Interface export carries) only where a stream value names that stream on every
/// thread: a stream of a device's primary context other than the per-thread default stream.
/// Recorded on the per-thread default stream, or on a stream of another context, it names
/// none (its event is what consumers wait on, and needs no name).
///
/// Recorded on a stream being captured into a CUDA graph, it remembers the capture: only
/// streams of that capture can wait on it (see [`CaptureStatus`]).
#[derive(Debug)]
pub struct CudaSignal {
    /// Shared with the CUDA graphs that wait on it, so it is not re-recorded under them.
    event: Arc<Event>,
    producer: Stream,
    /// What [`ReadySignal::producer_stream`] reports (see the type's docs).
    named: Option<Stream>,
    /// The capture the event was recorded in, if any.
    capture: Option<u64>,
    /// The cudarc stream recorded on ([`CudaSignal::record`]), held so that the stream
    /// `named` names lives as long as the signal. Never read.
    _stream: Option<Arc<CudaStream>>,
}

impl CudaSignal {
    /// Records the work enqueued so far on `producer`: any raw handle (one of PyTorch's,
    /// CuPy's...), recorded in the primary context the stream belongs to, or a default stream
    /// of device `ordinal`'s primary context. A handle of a non-primary context is refused
    /// ([`Error::ForeignContext`]): use [`CudaSignal::record`] with a cudarc stream of that
    /// context.
    ///
    /// The signal names `producer` ([`ReadySignal::producer_stream`]; none for
    /// [`Stream::PerThreadDefault`]) but does not keep it alive: attaching it to a tensor with
    /// the `unsafe` [`Tensor::with_ready`] vouches that it stays live (obligation 2 there).
    /// [`CudaSignal::record`] is the safe form for cudarc streams, and keeps its stream alive.
    ///
    /// # Safety
    /// The caller guarantees:
    /// 1. `producer` is a live stream for the duration of the call: a default stream (device
    ///    `ordinal`'s primary context's; [`Stream::PerThreadDefault`] is the calling thread's),
    ///    or the handle of a stream that has not been destroyed (a destroyed or made-up handle
    ///    is undefined behaviour in the driver).
    pub unsafe fn record_raw(ordinal: u32, producer: Stream) -> Result<CudaSignal, Error> {
        // SAFETY: `producer` is live for the call (our caller's obligation 1).
        let at = unsafe { Located::locate(producer, ordinal) }?;
        let (event, capture) = at.record()?;
        Ok(CudaSignal {
            event: Arc::new(event),
            producer,
            named: (producer != Stream::PerThreadDefault).then_some(producer),
            capture,
            _stream: None,
        })
    }

    /// Records the work enqueued so far on a cudarc stream, in that stream's own context.
    /// Safe: the stream is live for the call by construction, and the signal holds a clone of
    /// the `Arc`, so the stream it names stays live as long as the signal.
    ///
    /// The signal names the stream ([`ReadySignal::producer_stream`]) when it is a stream of
    /// its device's primary context other than the per-thread default stream, and none
    /// otherwise.
    pub fn record(stream: &Arc<CudaStream>) -> Result<CudaSignal, Error> {
        let (event, capture) = Located::cudarc(stream).record()?;
        Ok(CudaSignal {
            event: Arc::new(event),
            producer: stream_of(stream),
            named: primary_name(stream)?,
            capture,
            _stream: Some(stream.clone()),
        })
    }

    /// The stream the event was recorded on, as the core writes it (its default streams are
    /// those of the event's context). Unlike [`ReadySignal::producer_stream`], also for the
    /// per-thread default stream and streams of non-primary contexts.
    pub fn producer(&self) -> Stream {
        self.producer
    }

    /// The capture the event was recorded in: [`CaptureStatus::Active`] with its id, or
    /// [`CaptureStatus::None`].
    pub fn capture(&self) -> CaptureStatus {
        match self.capture {
            Some(id) => CaptureStatus::Active { id },
            None => CaptureStatus::None,
        }
    }

    /// This signal as a tensor's [`Ready`] (a plain value; attaching it is
    /// [`Tensor::with_ready`]'s business).
    pub fn into_ready(self) -> Ready {
        Ready::Signal(Arc::new(self))
    }

    /// Makes work submitted to `consumer` after this call wait on the device until the
    /// recorded work has finished (`cuStreamWaitEvent`). Never blocks the host. Legal inside
    /// a CUDA graph capture (see [`make_ready_on`]).
    ///
    /// A handle names its own stream, on any device (its context must be a primary
    /// context); the default streams (`Stream::LegacyDefault`, `Stream::PerThreadDefault`) are
    /// those of the event's device's primary context. [`CudaSignal::wait_on`] is the safe
    /// form for cudarc streams.
    ///
    /// # Safety
    /// The caller guarantees:
    /// 1. `consumer` is a live stream for the duration of the call: a default stream, or the
    ///    handle of a stream that has not been destroyed (a destroyed or made-up handle is
    ///    undefined behaviour in the driver).
    pub unsafe fn wait_on_raw(&self, consumer: Stream) -> Result<(), Error> {
        let ordinal = u32::try_from(self.event.context().ordinal()).unwrap_or(u32::MAX);
        // SAFETY: `consumer` is live for the call (our caller's obligation 1).
        let at = unsafe { Located::locate(consumer, ordinal) }?;
        at.wait_signal(self)
    }

    /// [`CudaSignal::wait_on_raw`] for a cudarc stream, of any context or device (its default
    /// streams are its own context's). Safe: the stream is live for the call by construction.
    pub fn wait_on(&self, consumer: &CudaStream) -> Result<(), Error> {
        Located::cudarc(consumer).wait_signal(self)
    }

    /// Whether the recorded work has finished; never blocks. An error for a signal recorded
    /// during a capture (its work runs at the graph's replays, not now).
    pub fn is_complete(&self) -> Result<bool, Error> {
        self.refuse_host_wait()?;
        self.event.is_complete()
    }

    /// Blocks the calling thread until the recorded work has finished. An error for a signal
    /// recorded during a capture.
    pub fn synchronize(&self) -> Result<(), Error> {
        self.refuse_host_wait()?;
        self.event.synchronize()
    }

    fn refuse_host_wait(&self) -> Result<(), Error> {
        match self.capture {
            Some(id) => Err(Error::HostWaitInCapture {
                capture: CaptureStatus::Active { id },
            }),
            None => Ok(()),
        }
    }
}

impl ReadySignal for CudaSignal {
    unsafe fn enqueue_wait(&self, consumer: Stream) -> Result<(), SignalError> {
        // SAFETY: `consumer` is a live stream for the call (our caller's obligation 1), which
        // is all `wait_on_raw` asks; its default streams are the event's device's.
        unsafe { self.wait_on_raw(consumer) }.map_err(Into::into)
    }

    fn synchronize(&self) -> Result<(), SignalError> {
        CudaSignal::synchronize(self).map_err(Into::into)
    }

    fn producer_stream(&self) -> Option<Stream> {
        self.named
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A stream located for the driver: the context its default-stream sentinels mean (a
/// primary context for raw streams; its own for cudarc streams), and its raw handle.
///
/// The type carries the promise that the stream is live while the value exists: the safe
/// [`Located::cudarc`] borrows a cudarc stream for `'a`, and the `unsafe` [`Located::locate`]
/// makes its caller vouch for a raw one. Its methods are then safe.
struct Located<'a> {
    ctx: Ctx<'a>,
    raw: sys::CUstream,
    /// The core's name of the stream (for same-stream checks and messages).
    name: Stream,
}

enum Ctx<'a> {
    /// A device's primary context (raw streams).
    Primary(Arc<DeviceCtx>),
    /// A cudarc stream's own context.
    Cudarc(&'a Arc<CudaContext>),
}

impl Ctx<'_> {
    fn get(&self) -> &Arc<CudaContext> {
        match self {
            Ctx::Primary(dev) => dev.ctx(),
            Ctx::Cudarc(ctx) => ctx,
        }
    }
}

impl<'a> Located<'a> {
    /// A cudarc stream, in its own context.
    fn cudarc(stream: &'a CudaStream) -> Located<'a> {
        Located {
            ctx: Ctx::Cudarc(stream.context()),
            raw: stream.cu_stream(),
            name: stream_of(stream),
        }
    }

    /// A raw stream: a handle in the primary context it belongs to, a default-stream
    /// sentinel in device `ordinal`'s primary context.
    ///
    /// # Safety
    /// The caller guarantees:
    /// 1. \[live\] `stream` is live (a handle that has not been destroyed, or a sentinel)
    ///    for the call and as long as the returned value exists.
    unsafe fn locate(stream: Stream, ordinal: u32) -> Result<Located<'static>, Error> {
        let dev = match stream {
            // SAFETY: a live handle (obligation 1).
            Stream::Handle(h) => unsafe { device_of_stream(h) }?,
            _ => device(ordinal)?,
        };
        Ok(Located {
            ctx: Ctx::Primary(dev),
            raw: raw_stream(stream),
            name: stream,
        })
    }

    /// A raw stream for a tensor on `device`: sentinels in the primary context of the
    /// device the tensor's stream work runs on ([`stream_device`]).
    ///
    /// # Safety
    /// As [`Located::locate`].
    unsafe fn locate_for(stream: Stream, device: Device) -> Result<Located<'static>, Error> {
        let ordinal = match stream {
            // The handle says where it is; the ordinal is unused.
            Stream::Handle(_) => 0,
            _ => stream_device(device, stream)?,
        };
        // SAFETY: forwarded obligation 1.
        unsafe { Located::locate(stream, ordinal) }
    }

    /// Whether `self` and `other` are one stream (the same handle, or the same sentinel of one
    /// context; never the per-thread stream, which is another stream on every thread, so a
    /// name alone cannot prove it).
    fn same_as(&self, other: &Located<'_>) -> bool {
        self.name != Stream::PerThreadDefault
            && self.name == other.name
            && self.ctx.get().cu_ctx() == other.ctx.get().cu_ctx()
    }

    /// The stream's capture state.
    fn capture(&self) -> Result<Capture, Error> {
        let _bound = bind(self.ctx.get())?;
        // SAFETY: live while `self` exists (the type's promise), its context current.
        unsafe { capture_of(self.raw) }
    }

    /// A pooled event recorded on the stream now, with the capture it was recorded in.
    fn record(&self) -> Result<(Event, Option<u64>), Error> {
        let capture = match self.capture()? {
            Capture::Implicit => return Err(Error::LegacyDuringCapture),
            c => c.id(),
        };
        let event = Event::in_context(self.ctx.get())?;
        // SAFETY: live while `self` exists (the type's promise); the event is in the
        // stream's context.
        unsafe { event.record(self.raw) }?;
        Ok((event, capture))
    }

    /// Makes the stream wait, on the device, for the work enqueued on `producer` so far:
    /// nothing when they are one stream, an event and a wait otherwise, following the capture
    /// rules of the crate docs. Never blocks the host.
    fn wait_stream(&self, producer: &Located<'_>, fork: Fork) -> Result<(), Error> {
        if self.same_as(producer) {
            return Ok(());
        }
        let consumer_capture = self.capture()?;
        let producer_capture = producer.capture()?;
        let plan = plan_wait(
            producer_capture.status(),
            consumer_capture,
            fork,
            self.name == Stream::LegacyDefault,
        )?;
        let wait = match plan {
            WaitPlan::Wait => Wait::Default,
            WaitPlan::WaitExternal(graph) => {
                // The producer's work as of now, waited for by the graph at replay (a
                // dedicated event, kept with the graph so it is never re-recorded).
                let event = Arc::new(Event::in_context(producer.ctx.get())?);
                // SAFETY: the producer is live while it exists (the type's promise); the
                // event is in its context.
                unsafe { event.record(producer.raw) }?;
                // SAFETY: the consumer (`self`) is live while it exists (the type's promise).
                unsafe { event.make_wait_in(self.raw, self.ctx.get(), Wait::External) }?;
                keep_with_graph(graph, Box::new(event));
                return Ok(());
            }
        };
        let event = Event::in_context(producer.ctx.get())?;
        // SAFETY: the producer is live while it exists (the type's promise); the event is
        // in its context.
        unsafe { event.record(producer.raw) }?;
        // SAFETY: the consumer (`self`) is live while it exists (the type's promise).
        unsafe { event.make_wait_in(self.raw, self.ctx.get(), wait) }
        // The event goes back to the pool here; the wait already captured it.
    }

    /// Makes the stream wait, on the device, for `signal`'s recorded work, following the
    /// capture rules of the crate docs. Never blocks the host.
    fn wait_signal(&self, signal: &CudaSignal) -> Result<(), Error> {
        let recorded_here = signal.producer != Stream::PerThreadDefault
            && signal.producer == self.name
            && signal.event.context().cu_ctx() == self.ctx.get().cu_ctx();
        if recorded_here {
            // The signal was recorded on this very stream: its work is ahead of anything
            // enqueued here from now on.
            return Ok(());
        }
        let consumer_capture = self.capture()?;
        let producer = match signal.capture {
            Some(id) => CaptureStatus::Active { id },
            None => CaptureStatus::None,
        };
        // A signal is data, never a fork: the same rules as a tensor's producer stream.
        let wait = match plan_wait(producer, consumer_capture, Fork::Refused, false)? {
            WaitPlan::Wait => Wait::Default,
            WaitPlan::WaitExternal(graph) => {
                // SAFETY: live while `self` exists (the type's promise).
                unsafe {
                    signal
                        .event
                        .make_wait_in(self.raw, self.ctx.get(), Wait::External)
                }?;
                keep_with_graph(graph, Box::new(signal.event.clone()));
                return Ok(());
            }
        };
        // SAFETY: live while `self` exists (the type's promise).
        unsafe { signal.event.make_wait_in(self.raw, self.ctx.get(), wait) }
    }
}

/// The device whose primary context a default-stream sentinel of the readiness or consumer of
/// a tensor on `dev` means: the tensor's own device for CUDA device memory. Pinned and managed
/// memory carry ordinal 0 by DLPack's convention, which says nothing about where the work
/// runs: a sentinel then means the calling thread's current device, and is refused when no
/// context is current ([`Error::UnknownStreamDevice`]).
fn stream_device(dev: Device, stream: Stream) -> Result<u32, Error> {
    match dev.kind {
        DeviceType::Cuda => Ok(dev.ordinal),
        DeviceType::CudaManaged | DeviceType::CudaHost => {
            current_device()?.ok_or(Error::UnknownStreamDevice {
                stream,
                device: dev,
            })
        }
        _ => Err(Error::NotCudaMemory { device: dev }),
    }
}

/// Makes work submitted to `consumer` after this call wait, on the GPU, until `tensor`'s data
/// is ready; the host is never blocked.
///
/// | `tensor.ready()`       | what happens                                                    |
/// |------------------------|-----------------------------------------------------------------|
/// | `Now`                  | nothing (no driver call)                                        |
/// | `Stream(p)`, `p == consumer` | nothing: one stream runs its work in order                |
/// | `Stream(p)`            | a pooled event is recorded on `p` and `consumer` waits on it    |
/// | `Signal(s)` recorded on `consumer` | nothing                                             |
/// | `Signal(s)`            | `consumer` waits on the signal (`cuStreamWaitEvent` for this crate's [`CudaSignal`]) |
///
/// Inside a CUDA graph capture, the ordering becomes graph edges when producer and consumer
/// are streams of one capture; a producer outside the capture becomes an event-wait node for
/// its work as of now; a producer inside a capture and a consumer outside it, or the legacy
/// default stream while a stream it synchronises with is captured, are refused
/// ([`Error::CaptureMismatch`], [`Error::LegacyDuringCapture`]) rather than invalidating the
/// capture. No event is queried and the host never waits.
///
/// `consumer` may be a raw handle owned by another framework (cudarc cannot adopt those;
/// this uses the driver API directly), of any device's primary context, or a default stream:
/// the legacy default stream (`0x1`) or the per-thread default stream (`0x2`) of the tensor's
/// device's primary context (for pinned and managed memory, of the calling thread's current
/// device). For a cudarc stream, use the safe [`make_ready_on`].
///
/// Takes a `&Tensor` or a borrowed [`TensorRef`] (`tensor.as_ref()`, or an adapter's argument
/// pinned for a call): ordering needs no owner.
///
/// # Safety
/// A [`Stream`] is a plain value that safe code can make from any number; the driver trusts it.
/// The caller guarantees:
/// 1. `consumer` is a live stream for the duration of the call: the handle of a stream of a
///    primary context that has not been destroyed, or a default stream
///    ([`Stream::PerThreadDefault`] is the calling thread's). For the wait to order anything,
///    the work that uses the tensor must then be enqueued on `consumer`, while it lives.
pub unsafe fn make_ready_on_raw<'t>(
    tensor: impl Into<TensorRef<'t>>,
    consumer: Stream,
) -> Result<(), Error> {
    let tensor = tensor.into();
    match tensor.ready() {
        Ready::Now => Ok(()),
        Ready::Stream(producer)
            if *producer == consumer && consumer != Stream::PerThreadDefault =>
        {
            Ok(())
        }
        Ready::Stream(producer) => {
            // SAFETY: `consumer` is live for the call (our caller's obligation 1).
            let c = unsafe { Located::locate_for(consumer, tensor.device()) }?;
            // SAFETY: the tensor's producer stream is live, and the calling thread's if it is
            // the per-thread default stream: whoever attached the readiness vouched for both
            // (`Tensor::with_ready` obligations 2 and 3).
            let p = unsafe { Located::locate_for(*producer, tensor.device()) }?;
            c.wait_stream(&p, Fork::Refused)
        }
        Ready::Signal(signal) => match signal.as_any().downcast_ref::<CudaSignal>() {
            Some(own) => {
                // SAFETY: `consumer` is live for the call (our caller's obligation 1).
                let c = unsafe { Located::locate_for(consumer, tensor.device()) }?;
                c.wait_signal(own)
            }
            // SAFETY: our caller's obligation 1 is `enqueue_wait`'s: a live stream on the
            // tensor's device (the signal's) for the call.
            None => unsafe { signal.enqueue_wait(consumer) }.map_err(Error::from_signal),
        },
    }
}

/// Hands `tensor` to `consumer`: orders `consumer` after the producer on the GPU
/// ([`make_ready_on_raw`]) and returns the same tensor (a clone: same memory, same owner) whose
/// data is ready on `consumer` ([`Ready::Stream`]`(consumer)`), or [`Ready::Now`] when it
/// already was. Never blocks the host. For a cudarc stream, use the safe [`handoff`].
///
/// ```no_run
/// # use tensorbridge_core::{Stream, StreamHandle, Tensor};
/// # fn demo(tensor: Tensor, torch_stream: usize) -> Result<(), tensorbridge_cuda::Error> {
/// // A stream owned by another framework, as a raw `cudaStream_t`.
/// let consumer = StreamHandle::new(torch_stream).map_or(Stream::LegacyDefault, Stream::Handle);
/// // SAFETY: `torch_stream` is PyTorch's current stream on the tensor's device (a stream of
/// // its primary context, or 0 for the legacy default stream), and PyTorch keeps it alive
/// // for longer than `on_consumer` and its clones live; it is not the per-thread stream.
/// let on_consumer = unsafe { tensorbridge_cuda::handoff_raw(&tensor, consumer)? };
/// assert_eq!(on_consumer.ready().producer_stream(), Some(consumer));
/// # Ok(()) }
/// ```
///
/// # Safety
/// The returned tensor's readiness names `consumer`, which later hand-offs, views and
/// synchronisation hand to the driver from safe code. The caller guarantees:
/// 1. `consumer` is a live stream on the tensor's device, as for [`make_ready_on_raw`], and stays
///    live until no clone of the returned tensor names it any more (each dropped, or given
///    another readiness): [`Tensor::with_ready`]'s obligation 2;
/// 2. if `consumer` is [`Stream::PerThreadDefault`] (the calling thread's), the returned
///    tensor and its clones are handed off, viewed, synchronised and exported only on this
///    thread while they name it: [`Tensor::with_ready`]'s obligation 3.
pub unsafe fn handoff_raw(tensor: &Tensor, consumer: Stream) -> Result<Tensor, Error> {
    // SAFETY: our caller's obligation 1 includes `make_ready_on_raw`'s.
    unsafe { make_ready_on_raw(tensor, consumer) }?;
    Ok(if tensor.ready().is_now() {
        tensor.clone()
    } else {
        // SAFETY:
        // - 1: `consumer` now waits (on the device) for the producer's work, or is the
        //   producer, so the work enqueued on it so far covers the producer's writes;
        // - 2: `consumer` stays live while the result or a clone names it (our caller's
        //   obligation 1);
        // - 3: a per-thread `consumer` is this thread's, and the result stays on it (our
        //   caller's obligation 2).
        unsafe { tensor.clone().with_ready(Ready::Stream(consumer)) }
    })
}

/// [`handoff_raw`] to a cudarc stream, safe: the stream is live for the call by construction, and
/// the returned tensor keeps it alive.
///
/// Orders `consumer` after the producer on the GPU ([`make_ready_on`]) and returns the
/// same tensor (a clone: same memory, same owner) whose readiness is a [`CudaSignal`] recorded
/// on `consumer` right after the wait. The signal holds a clone of the `Arc`, so the stream it
/// names stays live as long as a tensor carries it; a [`Ready::Stream`]`(consumer)` would
/// need someone else to keep the stream alive, which is [`handoff_raw`]'s `unsafe` contract. The
/// cost is one pooled event record more than [`handoff_raw`].
///
/// A tensor that is [`Ready::Now`], or already ready on `consumer` itself, comes back
/// unchanged. The signal names `consumer` ([`ReadySignal::producer_stream`]) when it is a
/// stream of the tensor's device's primary context other than the per-thread default stream,
/// and none otherwise (a stream of another device, or of another context). Never blocks the
/// host, except where [`make_ready_on`] says.
pub fn handoff(tensor: &Tensor, consumer: &Arc<CudaStream>) -> Result<Tensor, Error> {
    let ready = handoff_ready(tensor, consumer)?;
    if same_ready(&ready, tensor.ready()) {
        return Ok(tensor.clone());
    }
    // SAFETY: `handoff_ready`'s result, for this tensor: obligations 1 to 3 hold (its docs).
    Ok(unsafe { tensor.clone().with_ready(ready) })
}

/// Whether two readinesses are the same value (one `handoff_ready` gave back unchanged).
fn same_ready(a: &Ready, b: &Ready) -> bool {
    match (a, b) {
        (Ready::Now, Ready::Now) => true,
        (Ready::Stream(x), Ready::Stream(y)) => x == y,
        (Ready::Signal(x), Ready::Signal(y)) => Arc::ptr_eq(x, y),
        _ => false,
    }
}

/// What [`handoff`] attaches, for a borrowed tensor (no owner needed): orders `consumer`
/// after the producer on the GPU ([`make_ready_on`]) and returns the readiness of the data
/// on `consumer`: the tensor's own when it is [`Ready::Now`] or already ready on `consumer`
/// itself, otherwise a [`CudaSignal`] recorded on `consumer` right after the wait (which
/// keeps `consumer` alive).
///
/// The result may be attached to this tensor or a clone of it ([`Tensor::with_ready`]), whose
/// obligations hold for it: 1. `consumer` waits for the producer, and the signal captures
/// that wait; 2. the signal names a stream only when it is `consumer`, of the tensor's
/// device's primary context, and keeps it alive; 3. it never names the per-thread default
/// stream.
pub fn handoff_ready<'t>(
    tensor: impl Into<TensorRef<'t>>,
    consumer: &Arc<CudaStream>,
) -> Result<Ready, Error> {
    let tensor = tensor.into();
    make_ready_on(tensor, consumer)?;
    match tensor.ready() {
        Ready::Now => return Ok(Ready::Now),
        Ready::Stream(producer) if is_consumer(tensor.device(), *producer, consumer)? => {
            return Ok(tensor.ready().clone());
        }
        _ => {}
    }
    let mut signal = CudaSignal::record(consumer)?;
    let same_device = tensor.device().kind == DeviceType::Cuda
        && usize::try_from(tensor.device().ordinal).ok() == Some(consumer.context().ordinal());
    if !same_device {
        // A readiness names streams of the tensor's own device only (pinned and managed
        // memory have none: the signal's event is what consumers wait on).
        signal.named = None;
    }
    Ok(signal.into_ready())
}

/// The same tensor with [`Ready::Stream`]`(p)` turned into a [`CudaSignal`] recorded on `p`
/// now, so work the producer enqueues on `p` later does not delay consumers. Other
/// readiness is kept as it is.
///
/// Safe: it hands the driver only the tensor's own producer stream, which whoever attached
/// the readiness vouched for ([`Tensor::with_ready`]).
pub fn record_ready(tensor: &Tensor) -> Result<Tensor, Error> {
    if !matches!(tensor.ready(), Ready::Stream(_)) {
        return Ok(tensor.clone());
    }
    let ready = settle(tensor)?;
    // SAFETY: `settle`'s result for this tensor: obligations 1 to 3 hold (its docs).
    Ok(unsafe { tensor.clone().with_ready(ready) })
}

/// What [`record_ready`] attaches, for a borrowed tensor: a [`Ready::Stream`]`(p)` becomes a
/// [`CudaSignal`] recorded on `p` now; any other readiness comes back as it is (a clone).
///
/// The result may be attached to this tensor or a clone of it ([`Tensor::with_ready`]), whose
/// obligations hold for it: 1. the event captures the work enqueued on the producer so far,
/// which is what the readiness said to wait for; 2. the signal names the tensor's producer
/// stream (none for the per-thread default stream, and for pinned and managed memory), which
/// the promise made when that readiness was attached keeps live while a clone names it; 3. it
/// never names the per-thread default stream.
///
/// Safe: it hands the driver only the tensor's own producer stream, which whoever attached
/// the readiness vouched for ([`Tensor::with_ready`]).
pub fn settle<'t>(tensor: impl Into<TensorRef<'t>>) -> Result<Ready, Error> {
    let tensor = tensor.into();
    match tensor.ready() {
        Ready::Stream(producer) => {
            let ordinal = match producer {
                Stream::Handle(_) => 0,
                _ => stream_device(tensor.device(), *producer)?,
            };
            // SAFETY: the tensor's producer stream is live, and the calling thread's if it is
            // the per-thread default stream (`Tensor::with_ready` obligations 2 and 3, vouched
            // for by whoever attached the readiness).
            let mut signal = unsafe { CudaSignal::record_raw(ordinal, *producer) }?;
            if tensor.device().kind != DeviceType::Cuda {
                // Pinned and managed memory: a sentinel names no device for others.
                signal.named = None;
            }
            Ok(signal.into_ready())
        }
        other => Ok(other.clone()),
    }
}

/// Blocks the calling thread until `tensor`'s data is ready and returns it with
/// [`Ready::Now`] (what host views need). Waits for the producer's work up to now, not for
/// work enqueued on the producer stream later.
///
/// Safe: it hands the driver only the tensor's own producer stream, which whoever attached
/// the readiness vouched for ([`Tensor::with_ready`]).
pub fn synchronize(tensor: &Tensor) -> Result<Tensor, Error> {
    if tensor.ready().is_now() {
        return Ok(tensor.clone());
    }
    wait_ready(tensor)?;
    // SAFETY:
    // - 1: the host has waited for all the work the tensor's readiness covered, which
    //   includes every write of its producer (that readiness was true): no write is pending;
    // - 2 and 3: `Ready::Now` names no stream.
    Ok(unsafe { tensor.clone().with_ready(Ready::Now) })
}

/// [`synchronize`] for a borrowed tensor: blocks the calling thread until the tensor's data
/// is ready (the producer's work up to now). An error for work recorded in a CUDA graph
/// capture ([`Error::HostWaitInCapture`]).
///
/// Safe: it hands the driver only the tensor's own producer stream, which whoever attached
/// the readiness vouched for ([`Tensor::with_ready`]).
pub fn wait_ready<'t>(tensor: impl Into<TensorRef<'t>>) -> Result<(), Error> {
    let tensor = tensor.into();
    match tensor.ready() {
        Ready::Now => Ok(()),
        Ready::Stream(producer) => {
            // SAFETY: the tensor's producer stream is live, and the calling thread's if it is
            // the per-thread default stream (`Tensor::with_ready` obligations 2 and 3).
            let p = unsafe { Located::locate_for(*producer, tensor.device()) }?;
            let (event, capture) = p.record()?;
            if let Some(id) = capture {
                return Err(Error::HostWaitInCapture {
                    capture: CaptureStatus::Active { id },
                });
            }
            event.synchronize()
        }
        Ready::Signal(signal) => signal.synchronize().map_err(Error::from_signal),
    }
}

/// Makes work submitted to a cudarc stream after this call wait, on the GPU, until `tensor`'s
/// data is ready: [`make_ready_on_raw`] for a cudarc stream, safe because the stream is live for
/// the call by construction. The cudarc adapter's views call it.
///
/// The stream's default-stream sentinels (cudarc's null and per-thread streams) are resolved
/// in the stream's own context, which need not be the device's primary context, and the
/// stream may be on another device than the tensor (waiting on another device's event is
/// allowed). Never blocks the host, with one exception: a signal of another adapter (not a
/// [`CudaSignal`]) can only be asked to wait on a stream of the tensor's device's primary
/// context ([`ReadySignal::enqueue_wait`]); for any other stream the host waits for the
/// signal instead ([`ReadySignal::synchronize`]).
///
/// Takes a `&Tensor` or a borrowed [`TensorRef`] (`tensor.as_ref()`, or an adapter's argument
/// pinned for a call): ordering needs no owner.
pub fn make_ready_on<'t>(
    tensor: impl Into<TensorRef<'t>>,
    consumer: &CudaStream,
) -> Result<(), Error> {
    let tensor = tensor.into();
    let c = Located::cudarc(consumer);
    match tensor.ready() {
        Ready::Now => Ok(()),
        Ready::Stream(producer) => {
            // SAFETY: the tensor's producer stream is live, and the calling thread's if it is
            // the per-thread default stream (`Tensor::with_ready` obligations 2 and 3, vouched
            // for by whoever attached the readiness).
            let p = unsafe { Located::locate_for(*producer, tensor.device()) }?;
            c.wait_stream(&p, Fork::Refused)
        }
        Ready::Signal(signal) => match signal.as_any().downcast_ref::<CudaSignal>() {
            Some(own) => c.wait_signal(own),
            None => {
                let in_primary = match tensor.device().kind {
                    DeviceType::Cuda => device(tensor.device().ordinal)
                        .is_ok_and(|dev| dev.ctx().cu_ctx() == consumer.context().cu_ctx()),
                    _ => false,
                };
                if in_primary {
                    // SAFETY: `consumer` is a cudarc stream borrowed for the call, so live, of
                    // the tensor's device's primary context (checked just above), whose
                    // default streams its sentinels then name: `enqueue_wait`'s obligation 1.
                    unsafe { signal.enqueue_wait(stream_of(consumer)) }.map_err(Error::from_signal)
                } else {
                    signal.synchronize().map_err(Error::from_signal)
                }
            }
        },
    }
}

/// Whether `producer`, the readiness stream of a tensor on `device`, is `consumer` itself.
fn is_consumer(device: Device, producer: Stream, consumer: &CudaStream) -> Result<bool, Error> {
    if producer != stream_of(consumer) || producer == Stream::PerThreadDefault {
        return Ok(false);
    }
    // SAFETY: the tensor's producer stream is live (`Tensor::with_ready` obligation 2).
    let p = unsafe { Located::locate_for(producer, device) }?;
    Ok(p.same_as(&Located::cudarc(consumer)))
}

/// The core's name for a cudarc stream where that name means the stream on every thread: a
/// stream of its device's primary context (the context this crate binds for raw handles and
/// default streams), other than the per-thread default stream. `None` otherwise.
fn primary_name(stream: &CudaStream) -> Result<Option<Stream>, Error> {
    let ctx = stream.context();
    let named = stream_of(stream);
    if ctx.is_primary() && named != Stream::PerThreadDefault {
        let dev = device(u32::try_from(ctx.ordinal()).unwrap_or(u32::MAX))?;
        if dev.ctx().cu_ctx() == ctx.cu_ctx() {
            return Ok(Some(named));
        }
    }
    Ok(None)
}

/// Where data produced on a cudarc stream becomes ready: [`Ready::Stream`] of it when a raw
/// handle names it unambiguously (a stream of its device's primary context), a
/// [`CudaSignal`] recorded on it now otherwise (which then names no stream).
///
/// The result names `stream` (directly, or as the signal's producer) only as a stream of its
/// device's primary context, never the per-thread default stream; a signal keeps the stream
/// alive itself, a [`Ready::Stream`] needs the caller to: attaching the result to a tensor
/// ([`Tensor::with_ready`]) vouches that `stream` outlives every clone that names it.
pub fn ready_on(stream: &Arc<CudaStream>) -> Result<Ready, Error> {
    if let Some(named) = primary_name(stream)? {
        return Ok(Ready::Stream(named));
    }
    Ok(CudaSignal::record(stream)?.into_ready())
}

/// Makes work submitted to `waiter` after this call wait, on the GPU, until the work
/// enqueued on `producer` so far has finished (an event recorded on `producer`,
/// `cuStreamWaitEvent` on `waiter`). The streams may be of any contexts and devices; nothing
/// happens when they are one stream. Never blocks the host.
///
/// Inside a CUDA graph capture this is how streams fork and join: a `waiter` outside any
/// capture that joins a capturing `producer` becomes part of the capture (and must be joined
/// back into the origin stream before the capture ends); the capture rules of the crate docs
/// apply otherwise.
///
/// Safe: both are cudarc streams, live for the call by construction.
pub fn join(waiter: &CudaStream, producer: &CudaStream) -> Result<(), Error> {
    Located::cudarc(waiter).wait_stream(&Located::cudarc(producer), Fork::Allowed)
}

/// [`join`] for a raw producer stream: a handle of any primary context, or a default stream of
/// `waiter`'s context. `waiter` waits, on the GPU, for the work enqueued on `producer` so far.
///
/// # Safety
/// The caller guarantees:
/// 1. `producer` is a live stream for the duration of the call: the handle of a stream that
///    has not been destroyed, or a default stream.
pub unsafe fn join_raw(waiter: &CudaStream, producer: Stream) -> Result<(), Error> {
    let w = Located::cudarc(waiter);
    let p = match producer {
        // SAFETY: a live handle (obligation 1).
        Stream::Handle(_) => unsafe { Located::locate(producer, 0) }?,
        _ => Located {
            ctx: Ctx::Cudarc(waiter.context()),
            raw: raw_stream(producer),
            name: producer,
        },
    };
    w.wait_stream(&p, Fork::Allowed)
}

/// [`join`] for a raw waiter: `waiter` (a handle of any primary context, or a default stream
/// of device `ordinal`'s primary context) waits, on the GPU, for the work enqueued on
/// `producer` so far. Inside a capture, the join of CUDA's fork pattern.
///
/// # Safety
/// The caller guarantees:
/// 1. `waiter` is a live stream for the duration of the call: the handle of a stream that
///    has not been destroyed, or a default stream.
pub(crate) unsafe fn join_into_raw(
    waiter: Stream,
    ordinal: u32,
    producer: &CudaStream,
) -> Result<(), Error> {
    // SAFETY: a live stream (obligation 1).
    let w = unsafe { Located::locate(waiter, ordinal) }?;
    w.wait_stream(&Located::cudarc(producer), Fork::Allowed)
}
