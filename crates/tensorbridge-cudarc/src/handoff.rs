//! Stream hand-off on the driver API: the core's [`ReadySignal`] as a recorded CUDA event,
//! and the functions that order a consumer stream after a tensor's producer, on the GPU.
//!
//! Two kinds of consumer: a cudarc stream, live for the call by construction (the safe
//! [`make_ready_on_stream`] and [`handoff_to`]), and a raw [`Stream`] value, which safe code can
//! make from any number and so must be vouched for (the `unsafe` [`make_ready_on`] and
//! [`handoff`]). A tensor's own readiness was vouched for by whoever attached it
//! ([`Tensor::with_ready`]), so the functions that use only that ([`record_ready`],
//! [`synchronize`]) are safe.

use std::any::Any;
use std::sync::Arc;

use cudarc::driver::CudaStream;
use tensorbridge::{DeviceType, Ready, ReadySignal, SignalError, Stream, Tensor};

use crate::Error;
use crate::driver::{Event, device, raw_stream, stream_of};

/// A CUDA event recorded on a producer stream: the [`ReadySignal`] this crate attaches to
/// tensors ([`Ready::Signal`]).
///
/// The event captures the producer's work at the moment it was recorded; work the producer
/// enqueues afterwards does not delay consumers that wait on it. Events come from a per-device
/// pool (created with `CU_EVENT_DISABLE_TIMING`) and go back when the last clone of the
/// signal is dropped; waits enqueued before that are unaffected.
///
/// As a [`ReadySignal`], it names its producer ([`ReadySignal::producer_stream`], which the
/// CUDA Array Interface export carries) only where a stream value names that stream on every
/// thread: a stream of a device's primary context other than the per-thread default stream.
/// Recorded on the per-thread default stream, or on a stream of another context, it names
/// none (its event is what consumers wait on, and needs no name).
#[derive(Debug)]
pub struct CudaSignal {
    event: Event,
    producer: Stream,
    /// What [`ReadySignal::producer_stream`] reports (see the type's docs).
    named: Option<Stream>,
    /// The cudarc stream recorded on ([`CudaSignal::record_on`]), held so that the stream
    /// `named` names lives as long as the signal. Never read.
    _stream: Option<Arc<CudaStream>>,
}

impl CudaSignal {
    /// Records the work enqueued so far on `producer`, a stream of device `ordinal`: any raw
    /// handle (one of PyTorch's, CuPy's...) or a default stream. The event is made in the
    /// device's primary context, which must be the producer stream's context (it is for every
    /// framework that uses the runtime API); otherwise the driver refuses the record with
    /// [`Error::Driver`].
    ///
    /// The signal names `producer` ([`ReadySignal::producer_stream`]; none for
    /// [`Stream::PerThreadDefault`]) but does not keep it alive: attaching it to a tensor with
    /// the `unsafe` [`Tensor::with_ready`] vouches that it stays live (obligation 2 there).
    /// [`CudaSignal::record_on`] is the safe form for cudarc streams, and keeps its stream alive.
    ///
    /// # Safety
    /// The caller guarantees:
    /// 1. `producer` is a live stream for the duration of the call: a default stream (device
    ///    `ordinal`'s primary context's; [`Stream::PerThreadDefault`] is the calling thread's),
    ///    or the handle of a stream that has not been destroyed. The driver refuses a live
    ///    handle of another context; a destroyed or made-up handle is undefined behaviour there.
    pub unsafe fn record(ordinal: u32, producer: Stream) -> Result<CudaSignal, Error> {
        let event = Event::pooled(&device(ordinal)?)?;
        // SAFETY: `producer` is live for the call (our caller's obligation 1).
        unsafe { event.record(raw_stream(producer)) }?;
        Ok(CudaSignal {
            event,
            producer,
            named: (producer != Stream::PerThreadDefault).then_some(producer),
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
    pub fn record_on(stream: &Arc<CudaStream>) -> Result<CudaSignal, Error> {
        let event = Event::in_context(stream.context())?;
        // SAFETY: `stream` is a cudarc stream borrowed for the call, so live; the event is in
        // its context.
        unsafe { event.record(stream.cu_stream()) }?;
        Ok(CudaSignal {
            event,
            producer: stream_of(stream),
            named: primary_name(stream)?,
            _stream: Some(stream.clone()),
        })
    }

    /// The stream the event was recorded on, as the core writes it (its default streams are
    /// those of the event's context). Unlike [`ReadySignal::producer_stream`], also for the
    /// per-thread default stream and streams of non-primary contexts.
    pub fn producer(&self) -> Stream {
        self.producer
    }

    /// This signal as a tensor's [`Ready`] (a plain value; attaching it is
    /// [`Tensor::with_ready`]'s business).
    pub fn into_ready(self) -> Ready {
        Ready::Signal(Arc::new(self))
    }

    /// Makes work submitted to `consumer` after this call wait on the device until the
    /// recorded work has finished (`cuStreamWaitEvent`). Never blocks the host.
    ///
    /// The default streams (`Stream::LegacyDefault`, `Stream::PerThreadDefault`) are those of
    /// the event's context; a handle names its own stream, on any device.
    /// [`CudaSignal::wait_on_stream`] is the safe form for cudarc streams.
    ///
    /// # Safety
    /// The caller guarantees:
    /// 1. `consumer` is a live stream for the duration of the call: a default stream, or the
    ///    handle of a stream that has not been destroyed (a destroyed or made-up handle is
    ///    undefined behaviour in the driver).
    pub unsafe fn wait_on(&self, consumer: Stream) -> Result<(), Error> {
        // SAFETY: `consumer` is live for the call (our caller's obligation 1).
        unsafe { self.event.make_wait(raw_stream(consumer)) }
    }

    /// [`CudaSignal::wait_on`] for a cudarc stream, of any context or device (its default
    /// streams are its own context's). Safe: the stream is live for the call by construction.
    pub fn wait_on_stream(&self, consumer: &CudaStream) -> Result<(), Error> {
        // SAFETY: `consumer` is a cudarc stream borrowed for the call, so live; its context is
        // made current, so its default-stream sentinels mean its own default streams.
        unsafe {
            self.event
                .make_wait_in(consumer.cu_stream(), consumer.context())
        }
    }

    /// Whether the recorded work has finished; never blocks.
    pub fn is_complete(&self) -> Result<bool, Error> {
        self.event.is_complete()
    }

    /// Blocks the calling thread until the recorded work has finished.
    pub fn synchronize(&self) -> Result<(), Error> {
        self.event.synchronize()
    }
}

impl ReadySignal for CudaSignal {
    unsafe fn enqueue_wait(&self, consumer: Stream) -> Result<(), SignalError> {
        // The trait's default streams are those of the device's primary context, whichever
        // context the event was made in.
        let ordinal = u32::try_from(self.event.context().ordinal()).unwrap_or(u32::MAX);
        let primary = device(ordinal)?;
        // SAFETY: `consumer` is a live stream for the call (our caller's obligation 1); the
        // device's primary context is made current for its default-stream sentinels.
        unsafe { self.event.make_wait_in(raw_stream(consumer), primary.ctx()) }.map_err(Into::into)
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

/// The device whose primary context holds a tensor's producer stream: the tensor's own
/// ordinal for CUDA device, managed and pinned memory (managed and pinned tensors carry
/// ordinal 0 by convention, so their producer streams are taken to be device 0's).
fn producer_ordinal(tensor: &Tensor) -> Result<u32, Error> {
    let device = tensor.device();
    match device.kind {
        DeviceType::Cuda | DeviceType::CudaManaged | DeviceType::CudaHost => Ok(device.ordinal),
        _ => Err(Error::NotCudaMemory { device }),
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
/// | `Signal(s)`            | `consumer` waits on the signal (`cuStreamWaitEvent` for this crate's [`CudaSignal`]) |
///
/// `consumer` may be any stream of the tensor's device's primary context: a raw handle owned
/// by another framework (cudarc cannot adopt those; this uses the driver API directly), the
/// legacy default stream (`0x1`) or the per-thread default stream (`0x2`). For a cudarc
/// stream, use the safe [`make_ready_on_stream`].
///
/// # Safety
/// A [`Stream`] is a plain value that safe code can make from any number; the driver trusts it.
/// The caller guarantees:
/// 1. `consumer` is a live stream on the tensor's device for the duration of the call: the
///    handle of a stream of that device's primary context that has not been destroyed, or a
///    default stream (that context's; [`Stream::PerThreadDefault`] is the calling thread's).
///    For the wait to order anything, the work that uses the tensor must then be enqueued on
///    `consumer`, while it lives.
pub unsafe fn make_ready_on(tensor: &Tensor, consumer: Stream) -> Result<(), Error> {
    match tensor.ready() {
        Ready::Now => Ok(()),
        Ready::Stream(producer) if *producer == consumer => Ok(()),
        Ready::Stream(producer) => {
            let event = Event::pooled(&device(producer_ordinal(tensor)?)?)?;
            // SAFETY: the tensor's producer stream is live, and the calling thread's if it is
            // the per-thread default stream: whoever attached the readiness vouched for both
            // (`Tensor::with_ready` obligations 2 and 3).
            unsafe { event.record(raw_stream(*producer)) }?;
            // SAFETY: `consumer` is live for the call (our caller's obligation 1).
            unsafe { event.make_wait(raw_stream(consumer)) }
            // The event goes back to the pool here; the wait already captured it.
        }
        Ready::Signal(signal) => match signal.as_any().downcast_ref::<CudaSignal>() {
            // SAFETY: `consumer` is live for the call (our caller's obligation 1), which is
            // all `wait_on` asks.
            Some(own) => unsafe { own.wait_on(consumer) },
            // SAFETY: our caller's obligation 1 is `enqueue_wait`'s: a live stream on the
            // tensor's device (the signal's) for the call.
            None => unsafe { signal.enqueue_wait(consumer) }.map_err(Error::from_signal),
        },
    }
}

/// Hands `tensor` to `consumer`: orders `consumer` after the producer on the GPU
/// ([`make_ready_on`]) and returns the same tensor (a clone: same memory, same owner) whose
/// data is ready on `consumer` ([`Ready::Stream`]`(consumer)`), or [`Ready::Now`] when it
/// already was. Never blocks the host. For a cudarc stream, use the safe [`handoff_to`].
///
/// ```no_run
/// # use tensorbridge::{Stream, StreamHandle, Tensor};
/// # fn demo(tensor: Tensor, torch_stream: usize) -> Result<(), tensorbridge_cudarc::Error> {
/// // A stream owned by another framework, as a raw `cudaStream_t`.
/// let consumer = StreamHandle::new(torch_stream).map_or(Stream::LegacyDefault, Stream::Handle);
/// // SAFETY: `torch_stream` is PyTorch's current stream on the tensor's device (a stream of
/// // its primary context, or 0 for the legacy default stream), and PyTorch keeps it alive
/// // for longer than `on_consumer` and its clones live; it is not the per-thread stream.
/// let on_consumer = unsafe { tensorbridge_cudarc::handoff(&tensor, consumer)? };
/// assert_eq!(on_consumer.ready().producer_stream(), Some(consumer));
/// # Ok(()) }
/// ```
///
/// # Safety
/// The returned tensor's readiness names `consumer`, which later hand-offs, views and
/// synchronisation hand to the driver from safe code. The caller guarantees:
/// 1. `consumer` is a live stream on the tensor's device, as for [`make_ready_on`], and stays
///    live until no clone of the returned tensor names it any more (each dropped, or given
///    another readiness): [`Tensor::with_ready`]'s obligation 2;
/// 2. if `consumer` is [`Stream::PerThreadDefault`] (the calling thread's), the returned
///    tensor and its clones are handed off, viewed, synchronised and exported only on this
///    thread while they name it: [`Tensor::with_ready`]'s obligation 3.
pub unsafe fn handoff(tensor: &Tensor, consumer: Stream) -> Result<Tensor, Error> {
    // SAFETY: our caller's obligation 1 includes `make_ready_on`'s.
    unsafe { make_ready_on(tensor, consumer) }?;
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

/// [`handoff`] to a cudarc stream, safe: the stream is live for the call by construction, and
/// the returned tensor keeps it alive.
///
/// Orders `consumer` after the producer on the GPU ([`make_ready_on_stream`]) and returns the
/// same tensor (a clone: same memory, same owner) whose readiness is a [`CudaSignal`] recorded
/// on `consumer` right after the wait. The signal holds a clone of the `Arc`, so the stream it
/// names stays live as long as a tensor carries it; a [`Ready::Stream`]`(consumer)` would
/// need someone else to keep the stream alive, which is [`handoff`]'s `unsafe` contract. The
/// cost is one pooled event record more than [`handoff`].
///
/// A tensor that is [`Ready::Now`], or already ready on `consumer` itself, comes back
/// unchanged. The signal names `consumer` ([`ReadySignal::producer_stream`]) when it is a
/// stream of the tensor's device's primary context other than the per-thread default stream,
/// and none otherwise (a stream of another device, or of another context). Never blocks the
/// host, except where [`make_ready_on_stream`] says.
pub fn handoff_to(tensor: &Tensor, consumer: &Arc<CudaStream>) -> Result<Tensor, Error> {
    make_ready_on_stream(tensor, consumer)?;
    match tensor.ready() {
        Ready::Now => return Ok(tensor.clone()),
        Ready::Stream(producer) if is_consumer(tensor, *producer, consumer)? => {
            return Ok(tensor.clone());
        }
        _ => {}
    }
    let mut signal = CudaSignal::record_on(consumer)?;
    let same_device = producer_ordinal(tensor)
        .ok()
        .and_then(|o| usize::try_from(o).ok())
        == Some(consumer.context().ordinal());
    if !same_device {
        // A tensor's readiness names streams of its own device only.
        signal.named = None;
    }
    // SAFETY:
    // - 1: `consumer` now waits for the producer (`make_ready_on_stream`), and the event
    //   captures the work on `consumer` up to and including that wait, so work ordered after
    //   the event sees the producer's writes;
    // - 2: the signal names a stream only when it is `consumer`, of the tensor's device's
    //   primary context (`record_on`, `same_device`), and holds a clone of its `Arc`, so the
    //   stream lives as long as the signal, which every tensor carrying it holds;
    // - 3: it never names the per-thread default stream (`record_on`).
    Ok(unsafe { tensor.clone().with_ready(signal.into_ready()) })
}

/// The same tensor with [`Ready::Stream`]`(p)` turned into a [`CudaSignal`] recorded on `p`
/// now, so work the producer enqueues on `p` later does not delay consumers. Other
/// readiness is kept as it is.
///
/// Safe: it hands the driver only the tensor's own producer stream, which whoever attached
/// the readiness vouched for ([`Tensor::with_ready`]).
pub fn record_ready(tensor: &Tensor) -> Result<Tensor, Error> {
    match tensor.ready() {
        Ready::Stream(producer) => {
            let ordinal = producer_ordinal(tensor)?;
            // SAFETY: the tensor's producer stream is live, and the calling thread's if it is
            // the per-thread default stream (`Tensor::with_ready` obligations 2 and 3, vouched
            // for by whoever attached the readiness).
            let signal = unsafe { CudaSignal::record(ordinal, *producer) }?;
            // SAFETY:
            // - 1: the event captures the work enqueued on the producer so far, which is what
            //   the tensor's readiness said to wait for;
            // - 2: the signal names the tensor's producer stream, or none for the per-thread
            //   default stream, and the result is a clone of the tensor: the promise made when
            //   that readiness was attached keeps the stream live until no clone names it;
            // - 3: the signal never names the per-thread default stream (`record`).
            Ok(unsafe { tensor.clone().with_ready(signal.into_ready()) })
        }
        _ => Ok(tensor.clone()),
    }
}

/// Blocks the calling thread until `tensor`'s data is ready and returns it with
/// [`Ready::Now`] (what host views need). Waits for the producer's work up to now, not for
/// work enqueued on the producer stream later.
///
/// Safe: it hands the driver only the tensor's own producer stream, which whoever attached
/// the readiness vouched for ([`Tensor::with_ready`]).
pub fn synchronize(tensor: &Tensor) -> Result<Tensor, Error> {
    match tensor.ready() {
        Ready::Now => return Ok(tensor.clone()),
        Ready::Stream(producer) => {
            let event = Event::pooled(&device(producer_ordinal(tensor)?)?)?;
            // SAFETY: the tensor's producer stream is live, and the calling thread's if it is
            // the per-thread default stream (`Tensor::with_ready` obligations 2 and 3).
            unsafe { event.record(raw_stream(*producer)) }?;
            event.synchronize()?;
        }
        Ready::Signal(signal) => signal.synchronize().map_err(Error::from_signal)?,
    }
    // SAFETY:
    // - 1: the host has waited for all the work the tensor's readiness covered, which
    //   includes every write of its producer (that readiness was true): no write is pending;
    // - 2 and 3: `Ready::Now` names no stream.
    Ok(unsafe { tensor.clone().with_ready(Ready::Now) })
}

/// Makes work submitted to a cudarc stream after this call wait, on the GPU, until `tensor`'s
/// data is ready: [`make_ready_on`] for a cudarc stream, safe because the stream is live for
/// the call by construction. Views ([`view`](crate::view)) call it.
///
/// The stream's default-stream sentinels (cudarc's null and per-thread streams) are resolved
/// in the stream's own context, which need not be the device's primary context, and the
/// stream may be on another device than the tensor (waiting on another device's event is
/// allowed). Never blocks the host, with one exception: a signal of another adapter (not a
/// [`CudaSignal`]) can only be asked to wait on a stream of the tensor's device's primary
/// context ([`ReadySignal::enqueue_wait`]); for any other stream the host waits for the
/// signal instead ([`ReadySignal::synchronize`]).
pub fn make_ready_on_stream(tensor: &Tensor, consumer: &CudaStream) -> Result<(), Error> {
    let ctx = consumer.context();
    match tensor.ready() {
        Ready::Now => Ok(()),
        Ready::Stream(producer) => {
            let dev = device(producer_ordinal(tensor)?)?;
            if *producer == stream_of(consumer) && dev.ctx().cu_ctx() == ctx.cu_ctx() {
                return Ok(());
            }
            let event = Event::pooled(&dev)?;
            // SAFETY: the tensor's producer stream is live, and the calling thread's if it is
            // the per-thread default stream (`Tensor::with_ready` obligations 2 and 3, vouched
            // for by whoever attached the readiness).
            unsafe { event.record(raw_stream(*producer)) }?;
            // SAFETY: `consumer` is a cudarc stream borrowed for the call, so live; its own
            // context is made current.
            unsafe { event.make_wait_in(consumer.cu_stream(), ctx) }
        }
        Ready::Signal(signal) => match signal.as_any().downcast_ref::<CudaSignal>() {
            Some(own) => own.wait_on_stream(consumer),
            None => {
                let in_primary = producer_ordinal(tensor)
                    .and_then(device)
                    .is_ok_and(|dev| dev.ctx().cu_ctx() == ctx.cu_ctx());
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

/// Whether `producer`, the readiness stream of `tensor`, is `consumer` itself: the same name
/// and the tensor's device's primary context.
fn is_consumer(tensor: &Tensor, producer: Stream, consumer: &CudaStream) -> Result<bool, Error> {
    if producer != stream_of(consumer) {
        return Ok(false);
    }
    let dev = device(producer_ordinal(tensor)?)?;
    Ok(dev.ctx().cu_ctx() == consumer.context().cu_ctx())
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
/// handle names it unambiguously ([`primary_name`]), a [`CudaSignal`] recorded on it now
/// otherwise (which then names no stream).
///
/// The result names `stream` (directly, or as the signal's producer) only as a stream of its
/// device's primary context, never the per-thread default stream; a signal keeps the stream
/// alive itself, a [`Ready::Stream`] needs the caller to.
pub(crate) fn ready_on_stream(stream: &Arc<CudaStream>) -> Result<Ready, Error> {
    if let Some(named) = primary_name(stream)? {
        return Ok(Ready::Stream(named));
    }
    Ok(CudaSignal::record_on(stream)?.into_ready())
}
