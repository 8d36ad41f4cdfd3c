//! candle's CUDA tensors (the `cuda` feature): candle's storage and stream read through
//! candle's own cudarc (0.19, the workspace's version: one crate, no conversion between
//! two), readiness as candle's stream or an event recorded on it, and the leak-based
//! zero-copy path into candle.
//!
//! This module makes its few driver calls itself, on cudarc, rather than through
//! tensorbridge-cuda: it was written when the two could not share a build (candle-core's
//! `cuda` feature builds cudarc with `dynamic-linking`, and the CUDA layer then needed
//! cudarc's loading-only `is_culib_present`). They can now (docs/BUILDING.md, "candle"), so
//! these calls could move to the CUDA layer.

use std::any::Any;
use std::sync::Arc;

use candle_core::cuda::{CudaDType, CudaStorage, CudaStorageSlice};
use candle_core::op::BackpropOp;
use cudarc::driver::{CudaContext, CudaEvent, CudaSlice, CudaStream, DevicePtr, result, sys};
use half::{bf16, f16};
use tensorbridge_core::{
    Access, Descriptor, Device, Ready, ReadySignal, SignalError, Stream, StreamHandle, Tensor,
};

use crate::Error;
use crate::import::{Extent, describe};

fn driver(call: &'static str) -> impl FnOnce(cudarc::driver::DriverError) -> Error {
    move |e| Error::Driver {
        call,
        message: e.to_string(),
    }
}

/// A cudarc stream handle as the core's [`Stream`]: cudarc's default stream is the null
/// handle (the legacy default stream), its per-thread stream `0x2`.
pub(crate) fn stream_of(stream: &CudaStream) -> Stream {
    match stream.cu_stream() as usize {
        0 | 1 => Stream::LegacyDefault,
        2 => Stream::PerThreadDefault,
        h => Stream::Handle(StreamHandle::new(h).expect("handles above 2")),
    }
}

/// Restores the calling thread's current context when dropped: every function of this crate
/// leaves it as it found it, although the driver calls bind candle's.
struct Restore(sys::CUcontext);

impl Restore {
    fn bind(ctx: &CudaContext) -> Result<Restore, Error> {
        let previous = result::ctx::get_current()
            .map_err(driver("cuCtxGetCurrent"))?
            .unwrap_or(std::ptr::null_mut());
        ctx.bind_to_thread().map_err(driver("cuCtxSetCurrent"))?;
        Ok(Restore(previous))
    }
}

impl Drop for Restore {
    fn drop(&mut self) {
        // SAFETY: a context that was current on this thread when `bind` ran (or null, which
        // unbinds); the caller's, whose lifetime is the caller's business as it was before.
        let _ = unsafe { result::ctx::set_current(self.0) };
    }
}

/// An event recorded on candle's stream: where an imported tensor becomes ready when that
/// stream is the per-thread default stream (`0x2` names another stream on every thread).
#[derive(Debug)]
struct CandleEvent {
    event: CudaEvent,
}

impl ReadySignal for CandleEvent {
    unsafe fn enqueue_wait(&self, consumer: Stream) -> Result<(), SignalError> {
        let _restore = Restore::bind(self.event.context())?;
        // SAFETY: `consumer` is a live stream of the event's device's primary context, or a
        // default stream, which then means that context's (our caller's obligation 1; candle
        // uses the primary context, which `bind` made current); the event is alive (`self`).
        unsafe {
            result::stream::wait_event(
                consumer.cuda_handle() as sys::CUstream,
                self.event.cu_event(),
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
        }
        .map_err(driver("cuStreamWaitEvent"))?;
        Ok(())
    }

    fn synchronize(&self) -> Result<(), SignalError> {
        self.event
            .synchronize()
            .map_err(driver("cuEventSynchronize"))?;
        Ok(())
    }

    fn producer_stream(&self) -> Option<Stream> {
        None
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Where work on candle's stream so far is complete.
fn ready_on(stream: &Arc<CudaStream>) -> Result<Ready, Error> {
    match stream_of(stream) {
        Stream::PerThreadDefault => {
            let _restore = Restore::bind(stream.context())?;
            let event = stream.record_event(None).map_err(driver("cuEventRecord"))?;
            Ok(Ready::Signal(Arc::new(CandleEvent { event })))
        }
        other => Ok(Ready::Stream(other)),
    }
}

/// The descriptor and readiness of a candle CUDA tensor.
pub(crate) fn describe_cuda(
    tensor: &candle_core::Tensor,
    storage: &CudaStorage,
) -> Result<(Descriptor, Ready), Error> {
    let stream = storage.device.cuda_stream();
    let _restore = Restore::bind(stream.context())?;
    let extent = extent(&storage.slice, &stream)?;
    let ordinal = u32::try_from(stream.context().ordinal())
        .map_err(|_| tensorbridge_core::Error::OrdinalTooLarge { ordinal: u32::MAX })?;
    let desc = describe(tensor, &extent, Device::cuda(ordinal), Access::ReadWrite)?;
    // Obligations of `with_ready`, which `import` attaches this with:
    // 1: `extent` made `stream` wait for the slice's pending cudarc work (`device_ptr`), and
    //    the readiness is `stream` itself or an event recorded on it since;
    // 2: a stream named is candle's: a stream of the device's primary context (candle's
    //    `CudaContext::new` retains the primary context) or its legacy default stream; the
    //    owner holds the candle tensor, whose device holds an `Arc` of the stream;
    // 3: the per-thread default stream is never named (an event is recorded instead).
    let ready = ready_on(&stream)?;
    Ok((desc, ready))
}

/// The address of a CUDA storage's element 0.
pub(crate) fn base(storage: &CudaStorage) -> Result<usize, Error> {
    let stream = storage.device.cuda_stream();
    let _restore = Restore::bind(stream.context())?;
    Ok(extent(&storage.slice, &stream)?.addr)
}

/// The device address and length of candle's slice, made ready on `stream` through cudarc's
/// tracking (`device_ptr` waits for the slice's pending events and records a read).
fn extent(slice: &CudaStorageSlice, stream: &Arc<CudaStream>) -> Result<Extent, Error> {
    macro_rules! ext {
        ($s:expr) => {{
            let (ptr, _record) = $s.device_ptr(stream);
            Extent {
                addr: usize::try_from(ptr).map_err(|_| tensorbridge_core::Error::Overflow {
                    what: "device pointer",
                })?,
                len: $s.len(),
            }
        }};
    }
    Ok(match slice {
        CudaStorageSlice::U8(s) => ext!(s),
        CudaStorageSlice::U32(s) => ext!(s),
        CudaStorageSlice::I16(s) => ext!(s),
        CudaStorageSlice::I32(s) => ext!(s),
        CudaStorageSlice::I64(s) => ext!(s),
        CudaStorageSlice::BF16(s) => ext!(s),
        CudaStorageSlice::F16(s) => ext!(s),
        CudaStorageSlice::F32(s) => ext!(s),
        CudaStorageSlice::F64(s) => ext!(s),
        CudaStorageSlice::F8E4M3(s) => ext!(s),
        CudaStorageSlice::F8E8M0(s) => ext!(s),
        CudaStorageSlice::F6E2M3(_) => {
            return Err(Error::UnsupportedCandleDType { dtype: "f6e2m3" });
        }
        CudaStorageSlice::F6E3M2(_) => {
            return Err(Error::UnsupportedCandleDType { dtype: "f6e3m2" });
        }
        CudaStorageSlice::F4(_) => return Err(Error::UnsupportedCandleDType { dtype: "f4" }),
    })
}

/// Makes candle's stream wait (on the GPU) for a tensor's readiness.
fn wait_for(tensor: &Tensor, stream: &Arc<CudaStream>) -> Result<(), Error> {
    let candle = stream_of(stream);
    match tensor.ready() {
        Ready::Now => Ok(()),
        Ready::Stream(s) if *s == candle && candle != Stream::PerThreadDefault => Ok(()),
        Ready::Stream(s) => {
            let ctx = stream.context();
            let _restore = Restore::bind(ctx)?;
            let event = ctx
                .new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
                .map_err(driver("cuEventCreate"))?;
            // SAFETY: `s` is live and of the tensor's device's primary context, candle's
            // (the tensor's `with_ready` obligation 2; the device was checked equal), and a
            // per-thread default stream means this thread's (obligation 3); the event lives
            // until after the wait below is enqueued.
            unsafe { result::event::record(event.cu_event(), s.cuda_handle() as sys::CUstream) }
                .map_err(driver("cuEventRecord"))?;
            stream.wait(&event).map_err(driver("cuStreamWaitEvent"))?;
            Ok(())
        }
        Ready::Signal(signal) => {
            // SAFETY: candle's stream is alive (`stream` is an `Arc` of it) and on the
            // tensor's device (checked by the caller), of its primary context.
            unsafe { signal.enqueue_wait(candle) }.map_err(|e| Error::Driver {
                call: "ReadySignal::enqueue_wait",
                message: e.to_string(),
            })
        }
    }
}

/// [`export_leaked`](crate::export_leaked): the CUDA half.
pub(crate) fn export_leaked(
    tensor: &Tensor,
    device: &candle_core::CudaDevice,
) -> Result<candle_core::Tensor, Error> {
    // Checked by the caller too; here again so that no path of this function makes a
    // read-only tensor writable.
    crate::export::refuse_read_only(tensor)?;
    let stream = device.cuda_stream();
    let ordinal = stream.context().ordinal();
    if tensor.device() != Device::cuda(ordinal as u32) {
        return Err(Error::DeviceMismatch {
            tensor: tensor.device(),
            candle: format!("cuda:{ordinal}"),
        });
    }
    if !tensor.layout().is_c_contiguous() {
        return Err(Error::NotZeroCopy {
            what: "a strided CUDA tensor",
            why: "candle's storage constructor takes contiguous memory from its first element (Tensor::from_storage uses contiguous strides)",
            instead: "export_copied, or make it contiguous first",
        });
    }
    let dtype = crate::dtype::candle_dtype_of(tensor.dtype())?;
    let shape: Vec<usize> = tensor.shape().iter().map(|&n| n as usize).collect();
    if tensor.numel() == 0 {
        return Ok(candle_core::Tensor::zeros(
            shape,
            dtype,
            &candle_core::Device::Cuda(device.clone()),
        )?);
    }
    wait_for(tensor, &stream)?;
    let len = tensor.numel() as usize;
    let ptr = tensor.data_ptr() as sys::CUdeviceptr;
    let _restore = Restore::bind(stream.context())?;
    fn wrap<T: CudaDType>(
        stream: &Arc<CudaStream>,
        ptr: sys::CUdeviceptr,
        len: usize,
        device: &candle_core::CudaDevice,
    ) -> CudaStorage {
        // SAFETY: cudarc's `upgrade_device_ptr` obligations: `ptr` is element 0 of a C-contiguous CUDA
        // tensor of `len` elements of `T` on the stream's device, valid memory for as long as
        // the tensor's owner lives, which the caller keeps forever; the values are the
        // tensor's (any bit pattern is a valid `T` for candle's element types). The slice
        // this makes would free the memory when dropped; the caller makes sure it never is.
        let slice: CudaSlice<T> = unsafe { stream.upgrade_device_ptr(ptr, len) };
        CudaStorage::wrap_cuda_slice(slice, device.clone())
    }
    use candle_core::DType as D;
    let storage = match dtype {
        D::U8 => wrap::<u8>(&stream, ptr, len, device),
        D::U32 => wrap::<u32>(&stream, ptr, len, device),
        D::I16 => wrap::<i16>(&stream, ptr, len, device),
        D::I32 => wrap::<i32>(&stream, ptr, len, device),
        D::I64 => wrap::<i64>(&stream, ptr, len, device),
        D::BF16 => wrap::<bf16>(&stream, ptr, len, device),
        D::F16 => wrap::<f16>(&stream, ptr, len, device),
        D::F32 => wrap::<f32>(&stream, ptr, len, device),
        D::F64 => wrap::<f64>(&stream, ptr, len, device),
        _ => {
            return Err(Error::UnsupportedDType {
                dtype: tensor.dtype(),
            });
        }
    };
    let candle = candle_core::Tensor::from_storage(
        candle_core::Storage::Cuda(storage),
        shape,
        BackpropOp::none(),
        false,
    );
    // Never freed by candle, and the memory never released: a clone of the candle tensor
    // (its storage, and so the `CudaSlice`, never reaches a count of zero) and a clone of the
    // tensor (its owner) are forgotten. candle has no slot for a foreign owner that its
    // storage would release (the crate docs list the upstream change).
    std::mem::forget((candle.clone(), tensor.clone()));
    Ok(candle)
}
