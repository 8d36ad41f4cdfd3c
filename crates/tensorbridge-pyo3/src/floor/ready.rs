//! Readiness: where a consumer will use data ([`Consumer`]), ordering it after a producer on
//! the GPU, and turning thread-bound readiness into events so a tensor may cross threads.
//! Both wings use these: the import orders a consumer's stream, the export settles what it
//! hands out.

use tensorbridge_core::{
    Descriptor, DeviceType, Ready, Stream, StreamConvention, StreamRequest, Tensor,
    stream_from_wire,
};

use crate::error::Result;

/// A consumer's stream, parsed once: where the caller will use the data (DLPack's CUDA
/// conventions). Holding one is the caller's promise that a handle in it is live for the
/// call; it is never kept in a readiness (\[ready\]).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Consumer(Option<StreamRequest>);

impl Consumer {
    /// No consumer stream: producers are asked with `stream=None` (the legacy default stream
    /// orders their work), and the data is used where its readiness says.
    pub(crate) const NONE: Consumer = Consumer(None);

    /// The consumer stream `wire` (DLPack's CUDA values: `None`, -1, 1, 2, a handle; 0 is
    /// refused), checked.
    ///
    /// # Safety
    /// 1. \[live\] a handle in `wire` names a live stream of the device the data turns out
    ///    to be on (its primary context) for the call, and `2` (the per-thread default stream)
    ///    is used on the calling thread.
    pub(crate) unsafe fn assume(wire: Option<i64>) -> Result<Consumer> {
        Ok(match wire {
            None => Consumer::NONE,
            some => Consumer(Some(stream_from_wire(StreamConvention::DlpackCuda, some)?)),
        })
    }

    /// The consumer stream a caller's `stream=` argument names
    /// ([`StreamArg`](crate::floor::stream::StreamArg)).
    ///
    /// # Safety
    /// As [`Consumer::assume`].
    pub(crate) unsafe fn assume_arg(arg: &crate::floor::stream::StreamArg) -> Consumer {
        Consumer(arg.request())
    }

    /// The request, if the caller gave a stream.
    pub(crate) fn request(self) -> Option<StreamRequest> {
        self.0
    }

    /// The value `__dlpack__`'s `stream` takes for it (DLPack's CUDA convention).
    pub(crate) fn wire(self) -> Result<Option<i64>> {
        match self.0 {
            None => Ok(None),
            Some(request) => Ok(tensorbridge_core::stream_to_wire(
                StreamConvention::DlpackCuda,
                request,
            )?),
        }
    }
}

/// Whether a device's memory is ordered by CUDA streams (and so carries a readiness).
pub(crate) fn is_stream_ordered(kind: DeviceType) -> bool {
    matches!(kind, DeviceType::Cuda | DeviceType::CudaManaged)
}

/// Makes the consumer's stream wait (on the GPU) until memory described by `desc` is ready
/// per `ready`, when a consumer stream was given and the memory is CUDA-accessible.
pub(crate) fn order_consumer(desc: &Descriptor, ready: &Ready, consumer: Consumer) -> Result<()> {
    let Some(StreamRequest::Stream(waiter)) = consumer.request() else {
        return Ok(());
    };
    if !desc.device().kind.is_cuda_accessible() || ready.is_now() {
        return Ok(());
    }
    // SAFETY: the consumer vouched for its stream for the call ([`Consumer::assume`]);
    // `ready` is true and names live streams (\[ready\]).
    unsafe { make_ready_on_raw(desc, ready, waiter) }
}

/// [`tensorbridge_cuda::make_ready_on_raw`] for a description and a readiness.
///
/// # Safety
/// 1. `waiter` is live for the call (as `make_ready_on_raw` requires);
/// 2. `ready` is true for `desc` and names streams live for the call.
pub(crate) unsafe fn make_ready_on_raw(
    desc: &Descriptor,
    ready: &Ready,
    waiter: Stream,
) -> Result<()> {
    // The CUDA layer orders tensors; this placeholder owns nothing and nothing reads through
    // it (ordering enqueues a wait; it does not touch the memory).
    // SAFETY: nothing dereferences the placeholder's memory; it is dropped at the end.
    let placeholder = unsafe { Tensor::from_descriptor(desc.clone(), std::sync::Arc::new(())) };
    // SAFETY: obligation 2.
    let placeholder = unsafe { placeholder.with_ready(ready.clone()) };
    // SAFETY: obligation 1.
    unsafe { tensorbridge_cuda::make_ready_on_raw(&placeholder, waiter) }?;
    Ok(())
}

/// `import::settle`'s event for a description and its readiness.
pub(crate) fn settled(desc: &Descriptor, ready: &Ready) -> Result<Ready> {
    // SAFETY: as in `make_ready_on_raw`: a placeholder nothing reads through; the readiness
    // was vouched for by whoever made it (a stream of this thread, live now).
    let placeholder = unsafe { Tensor::from_descriptor(desc.clone(), std::sync::Arc::new(())) };
    // SAFETY: as above.
    let placeholder = unsafe { placeholder.with_ready(ready.clone()) };
    Ok(tensorbridge_cuda::record_ready(&placeholder)?
        .ready()
        .clone())
}

/// Whether `import::settle` would turn `ready` into an event for memory on a `kind` device: the
/// per-thread default stream, or a default-stream sentinel for pinned or managed memory.
pub(crate) fn needs_settling(ready: &Ready, kind: DeviceType) -> bool {
    match ready {
        Ready::Stream(Stream::PerThreadDefault) => true,
        Ready::Stream(Stream::LegacyDefault) => kind != DeviceType::Cuda,
        _ => false,
    }
}
