//! Stream hand-off on the driver API: the core's [`ReadySignal`] as a recorded CUDA event,
//! and the functions that order a consumer stream after a tensor's producer, on the GPU.

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
#[derive(Debug)]
pub struct CudaSignal {
    event: Event,
    producer: Stream,
}

impl CudaSignal {
    /// Records the work enqueued so far on `producer`, a stream of device `ordinal`: any raw
    /// handle (one of PyTorch's, CuPy's...) or a default stream. The event is made in the
    /// device's primary context, which must be the producer stream's context (it is for every
    /// framework that uses the runtime API); otherwise the driver refuses the record with
    /// [`Error::Driver`].
    pub fn record(ordinal: u32, producer: Stream) -> Result<CudaSignal, Error> {
        let event = Event::pooled(&device(ordinal)?)?;
        event.record(raw_stream(producer))?;
        Ok(CudaSignal { event, producer })
    }

    /// Records the work enqueued so far on a cudarc stream, in that stream's own context.
    pub fn record_on(stream: &CudaStream) -> Result<CudaSignal, Error> {
        let event = Event::in_context(stream.context())?;
        event.record(stream.cu_stream())?;
        Ok(CudaSignal {
            event,
            producer: stream_of(stream),
        })
    }

    /// The stream the event was recorded on.
    pub fn producer(&self) -> Stream {
        self.producer
    }

    /// This signal as a tensor's [`Ready`].
    pub fn into_ready(self) -> Ready {
        Ready::Signal(Arc::new(self))
    }

    /// Makes work submitted to `consumer` after this call wait on the device until the
    /// recorded work has finished (`cuStreamWaitEvent`). Never blocks the host.
    ///
    /// The default streams (`Stream::LegacyDefault`, `Stream::PerThreadDefault`) are those of
    /// the event's context; a handle names its own stream, on any device.
    pub fn wait_on(&self, consumer: Stream) -> Result<(), Error> {
        self.event.make_wait(raw_stream(consumer))
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
    fn enqueue_wait(&self, consumer: Stream) -> Result<(), SignalError> {
        self.wait_on(consumer).map_err(Into::into)
    }

    fn synchronize(&self) -> Result<(), SignalError> {
        CudaSignal::synchronize(self).map_err(Into::into)
    }

    fn producer_stream(&self) -> Option<Stream> {
        Some(self.producer)
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
/// `consumer` may be any stream: a raw handle owned by another framework (cudarc cannot adopt
/// those; this uses the driver API directly), the legacy default stream (`0x1`) or the
/// per-thread default stream (`0x2`) of the tensor's device.
pub fn make_ready_on(tensor: &Tensor, consumer: Stream) -> Result<(), Error> {
    match tensor.ready() {
        Ready::Now => Ok(()),
        Ready::Stream(producer) if *producer == consumer => Ok(()),
        Ready::Stream(producer) => {
            let event = Event::pooled(&device(producer_ordinal(tensor)?)?)?;
            event.record(raw_stream(*producer))?;
            event.make_wait(raw_stream(consumer))
            // The event goes back to the pool here; the wait already captured it.
        }
        Ready::Signal(signal) => match signal.as_any().downcast_ref::<CudaSignal>() {
            Some(own) => own.wait_on(consumer),
            None => signal.enqueue_wait(consumer).map_err(Error::from_signal),
        },
    }
}

/// Hands `tensor` to `consumer`: orders `consumer` after the producer on the GPU
/// ([`make_ready_on`]) and returns the same tensor (a clone: same memory, same owner) whose
/// data is ready on `consumer` ([`Ready::Stream`]`(consumer)`), or [`Ready::Now`] when it
/// already was. Never blocks the host.
///
/// ```no_run
/// # use tensorbridge::{Stream, StreamHandle, Tensor};
/// # fn demo(tensor: Tensor, torch_stream: usize) -> Result<(), tensorbridge_cudarc::Error> {
/// // A stream owned by another framework, as a raw `cudaStream_t`.
/// let consumer = StreamHandle::new(torch_stream).map_or(Stream::LegacyDefault, Stream::Handle);
/// let on_consumer = tensorbridge_cudarc::handoff(&tensor, consumer)?;
/// assert_eq!(on_consumer.ready().producer_stream(), Some(consumer));
/// # Ok(()) }
/// ```
pub fn handoff(tensor: &Tensor, consumer: Stream) -> Result<Tensor, Error> {
    make_ready_on(tensor, consumer)?;
    Ok(if tensor.ready().is_now() {
        tensor.clone()
    } else {
        tensor.clone().with_ready(Ready::Stream(consumer))
    })
}

/// The same tensor with [`Ready::Stream`]`(p)` turned into a [`CudaSignal`] recorded on `p`
/// now, so work the producer enqueues on `p` later does not delay consumers. Other
/// readiness is kept as it is.
pub fn record_ready(tensor: &Tensor) -> Result<Tensor, Error> {
    match tensor.ready() {
        Ready::Stream(producer) => {
            let signal = CudaSignal::record(producer_ordinal(tensor)?, *producer)?;
            Ok(tensor.clone().with_ready(signal.into_ready()))
        }
        _ => Ok(tensor.clone()),
    }
}

/// Blocks the calling thread until `tensor`'s data is ready and returns it with
/// [`Ready::Now`] (what host views need). Waits for the producer's work up to now, not for
/// work enqueued on the producer stream later.
pub fn synchronize(tensor: &Tensor) -> Result<Tensor, Error> {
    match tensor.ready() {
        Ready::Now => return Ok(tensor.clone()),
        Ready::Stream(producer) => {
            let event = Event::pooled(&device(producer_ordinal(tensor)?)?)?;
            event.record(raw_stream(*producer))?;
            event.synchronize()?;
        }
        Ready::Signal(signal) => signal.synchronize().map_err(Error::from_signal)?,
    }
    Ok(tensor.clone().with_ready(Ready::Now))
}

/// [`make_ready_on`] for a cudarc stream: like it, but the stream's default-stream sentinels
/// (cudarc's null and per-thread streams) are resolved in the stream's own context, which
/// need not be the device's primary context.
pub(crate) fn make_ready_on_cudarc(tensor: &Tensor, consumer: &CudaStream) -> Result<(), Error> {
    let ctx = consumer.context();
    match tensor.ready() {
        Ready::Now => Ok(()),
        Ready::Stream(producer) => {
            let dev = device(producer_ordinal(tensor)?)?;
            if *producer == stream_of(consumer) && dev.ctx().cu_ctx() == ctx.cu_ctx() {
                return Ok(());
            }
            let event = Event::pooled(&dev)?;
            event.record(raw_stream(*producer))?;
            event.make_wait_in(consumer.cu_stream(), ctx)
        }
        Ready::Signal(signal) => match signal.as_any().downcast_ref::<CudaSignal>() {
            Some(own) => own.event.make_wait_in(consumer.cu_stream(), ctx),
            None => signal
                .enqueue_wait(stream_of(consumer))
                .map_err(Error::from_signal),
        },
    }
}

/// Where data produced on a cudarc stream becomes ready: [`Ready::Stream`] of it when a raw
/// handle names it unambiguously (a stream of its device's primary context, other than the
/// per-thread default stream, which differs from thread to thread), a [`CudaSignal`] recorded
/// on it now otherwise.
pub(crate) fn ready_on_stream(stream: &CudaStream) -> Result<Ready, Error> {
    let ctx = stream.context();
    let named = stream_of(stream);
    if ctx.is_primary() && named != Stream::PerThreadDefault {
        let dev = device(u32::try_from(ctx.ordinal()).unwrap_or(u32::MAX))?;
        if dev.ctx().cu_ctx() == ctx.cu_ctx() {
            return Ok(Ready::Stream(named));
        }
    }
    Ok(CudaSignal::record_on(stream)?.into_ready())
}
