//! Your own CUDA kernel on Python tensors: the arguments borrowed for the call
//! ([`TensorArg`]), one stream chosen (the framework's current stream, or the caller's),
//! checked views, and the frameworks' later work ordered after the kernel's writes.

use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaStream};
use pyo3::prelude::*;
use tensorbridge_core::{DeviceType, Owner, Stream, TensorRef};
use tensorbridge_cuda::StreamLife;
use tensorbridge_cudarc::{CudaElement, DeviceView, DeviceViewMut, KernelArgs, KernelTensor};

use crate::TensorArg;
use crate::error::{Error, Result};
use crate::floor::stream::{Framework, StreamArg};

/// Whose stream a kernel call runs on.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamSource {
    /// PyTorch's current stream of the device (`torch.cuda.current_stream(device)`), through
    /// the DLPack C exchange API's `current_work_stream`.
    Torch,
    /// CuPy's current stream of the device (`cupy.cuda.get_current_stream(device)`).
    CuPy,
    /// The legacy default stream of the device: no argument came from a framework with a
    /// current stream (JAX, Numba, NumPy-style producers, `tensorbridge.View`s).
    LegacyDefault,
    /// The stream the caller chose ([`kernel_call_on`]).
    Caller,
}

/// A framework stream found for an argument: where it is, how long it lives.
struct Found {
    source: StreamSource,
    stream: Stream,
    life: StreamLife,
}

/// The arguments of a kernel call and the stream to launch on, as [`kernel_call`] hands
/// them to its closure.
pub struct KernelCall<'s> {
    args: KernelArgs<'s>,
    source: StreamSource,
    /// Each argument (by address) and its tensor, borrowed for the call.
    tensors: Vec<(*const (), TensorRef<'s>)>,
    /// The kernels the closure asked for ([`KernelCall::function`], [`KernelCall::kernel`]):
    /// what a failed launch is reported with.
    kernels: std::cell::RefCell<Vec<String>>,
}

impl<'s> KernelCall<'s> {
    /// The stream to launch on (see [`kernel_call`]).
    pub fn stream(&self) -> &Arc<CudaStream> {
        self.args.stream()
    }

    /// Whose stream [`stream`](KernelCall::stream) is.
    pub fn source(&self) -> StreamSource {
        self.source
    }

    /// The position of `arg` among the call's arguments, and its tensor.
    fn tensor(&self, arg: &TensorArg<'_, '_>) -> Result<(usize, TensorRef<'s>)> {
        let key = std::ptr::from_ref(arg).cast::<()>();
        self.tensors
            .iter()
            .enumerate()
            .find(|(_, (k, _))| *k == key)
            .map(|(i, (_, t))| (i, *t))
            .ok_or(Error::NotAnArgument)
    }

    /// A read-only view of `arg`, one of the call's arguments, for the kernel: the stream
    /// ordered after its producer on the GPU ([`KernelArgs::input`]).
    pub fn input<T: CudaElement>(&self, arg: &TensorArg<'_, '_>) -> Result<DeviceView<'s, T>> {
        let (i, t) = self.tensor(arg)?;
        // SAFETY: KernelTensor::borrowed \[device-life\]: the call retires the pins of its
        // arguments on this stream after `f` (one event), except those of the framework
        // whose current stream this is, whose allocator orders reuse after its own work
        // ([`kernel_call`], item 5).
        Ok(self
            .args
            .input_at(i, unsafe { KernelTensor::borrowed(t) })?)
    }

    /// A writable view of `arg`, refused (`ValueError`) when it overlaps itself or another
    /// argument, and (`BufferError`) when it is read-only: an immutable producer's array (JAX,
    /// TensorFlow), a tensor that requires grad ([`KernelArgs::output`]).
    pub fn output<T: CudaElement>(&self, arg: &TensorArg<'_, '_>) -> Result<DeviceViewMut<'s, T>> {
        let (i, t) = self.tensor(arg)?;
        // SAFETY: as in `input`.
        Ok(self
            .args
            .output_at(i, unsafe { KernelTensor::borrowed(t) })?)
    }

    /// Refuses, with [`Error::ShapeMismatch`], arguments whose shapes differ from the first's.
    pub fn same_shape(&self, args: &[&TensorArg<'_, '_>]) -> Result<()> {
        let Some((first, rest)) = args.split_first() else {
            return Ok(());
        };
        let (i, expected) = self.tensor(first)?;
        for arg in rest {
            let (j, t) = self.tensor(arg)?;
            if t.shape() != expected.shape() {
                return Err(Error::ShapeMismatch {
                    index: j,
                    found: t.shape().to_vec(),
                    other: i,
                    expected: expected.shape().to_vec(),
                });
            }
        }
        Ok(())
    }

    /// The kernel `name` of `src`, compiled with NVRTC for the device's own architecture on
    /// first use and cached per context ([`tensorbridge_cudarc::kernel`]); `RuntimeError`
    /// without libnvrtc.
    pub fn kernel(&self, src: &str, name: &str) -> Result<CudaFunction> {
        self.asked_for(name);
        Ok(tensorbridge_cudarc::kernel(self.stream(), src, name)?)
    }

    /// A kernel declared once (`static K: Kernel = Kernel::new(SRC, "name")`), its loaded
    /// function kept in the value per context: no hashing of the source per call.
    pub fn function(&self, kernel: &tensorbridge_cudarc::Kernel) -> Result<CudaFunction> {
        self.asked_for(kernel.name());
        Ok(kernel.function(self.stream())?)
    }

    fn asked_for(&self, name: &str) {
        let mut kernels = self.kernels.borrow_mut();
        if !kernels.iter().any(|k| k == name) {
            kernels.push(name.to_owned());
        }
    }
}

/// Runs `f`, which launches your own CUDA kernel, on `args` (borrowed for the call: declare
/// the `#[pyfunction]`'s tensor parameters as [`TensorArg`]), on the stream their framework
/// is using now:
///
/// 1. all arguments must be CUDA (or managed) memory of one device (`ValueError` otherwise:
///    the views refuse);
/// 2. the stream: the current stream of the first argument that comes from PyTorch (the
///    stream of `with torch.cuda.stream(s)`, or the capturing stream inside
///    `torch.cuda.graph`), else of the first from CuPy (`with cupy.cuda.Stream()`), else the
///    legacy default stream ([`StreamSource`]); borrowed as a cudarc stream for the call
///    ([`tensorbridge_cuda::with_stream_raw`]), the caller's CUDA context restored after;
/// 3. `f` makes the views ([`KernelCall::input`], [`KernelCall::output`]), each of which
///    orders the stream after that argument's producer on the GPU, and launches;
/// 4. after `f`, the current stream of every other framework among the arguments (CuPy's
///    when the kernel ran on PyTorch's, say) waits on the GPU for the kernel's work, so its
///    later reads see the writes. The kernel's own framework needs nothing: its later work is
///    on the same stream;
/// 5. memory: an argument of the framework whose stream the kernel ran on is released by that
///    framework's own rules, as its own operations' arguments are (PyTorch's and CuPy's
///    allocators reuse memory in the order of the stream it was allocated on; memory used on
///    another stream needs `record_stream`, as for PyTorch's own operations). Every other
///    argument's memory is kept until the kernel finishes (one event per call), and released
///    soon after, whoever drops the argument.
///
/// The host never waits (except for NVRTC at a kernel's first use).
///
/// JAX arrays are inputs only: JAX hands them over ready and immutable (read-only views;
/// [`KernelCall::output`] refuses them).
pub fn kernel_call<R>(
    args: &[&TensorArg<'_, '_>],
    f: impl FnOnce(&KernelCall<'_>) -> Result<R>,
) -> Result<R> {
    call(args, None, f)
}

/// [`kernel_call`] on the stream the caller chose: for kernel libraries that take `stream=`
/// and for inputs whose framework has no current stream (JAX). `stream` is read as every
/// `stream=` of this crate reads it (ARCHITECTURE.md, "Streams from Python"): a stream object
/// (anything with the CUDA stream protocol `__cuda_stream__`, as cuda.core's streams have; a
/// `torch.cuda.Stream`; a `cupy.cuda.Stream`), `None` (the legacy default stream) or an int
/// with DLPack's meanings (`1` the legacy default stream, `2` the per-thread one, a
/// `cudaStream_t`; `0` is ambiguous and `-1` names no stream: both `ValueError`), which
/// Python code vouches is live for the call, as the DLPack protocol trusts stream ints. The kernel runs on it, and the arguments' frameworks' current streams wait for it
/// as in [`kernel_call`].
pub fn kernel_call_on<R>(
    args: &[&TensorArg<'_, '_>],
    stream: &Bound<'_, PyAny>,
    f: impl FnOnce(&KernelCall<'_>) -> Result<R>,
) -> Result<R> {
    let chosen = caller_stream(stream)?;
    call(args, Some(chosen), f)
}

fn call<'a, R>(
    args: &'a [&'a TensorArg<'_, '_>],
    chosen: Option<Found>,
    f: impl FnOnce(&KernelCall<'_>) -> Result<R>,
) -> Result<R> {
    // Kernels take device and managed memory only: refused before any stream is looked for.
    if let Some(a) = args.iter().find(|a| {
        !matches!(
            a.descriptor().device().kind,
            DeviceType::Cuda | DeviceType::CudaManaged
        )
    }) {
        return Err(tensorbridge_cuda::Error::NotCudaMemory {
            device: a.descriptor().device(),
        }
        .into());
    }
    // The device: the first argument on a CUDA device (managed memory names device 0).
    let ordinal = args
        .iter()
        .find(|a| a.descriptor().device().kind == DeviceType::Cuda)
        .or_else(|| args.first())
        .map_or(0, |a| a.descriptor().device().ordinal);
    // Each argument's framework stream, where its framework has one (one pass: PyTorch's was
    // read by the import).
    let mut found: Vec<Found> = Vec::new();
    let mut owned_by: Vec<Option<Stream>> = Vec::with_capacity(args.len());
    for a in args {
        let f = framework_stream(a, ordinal)?;
        owned_by.push(f.as_ref().map(|f| f.stream));
        if let Some(f) = f
            && !found.iter().any(|g| g.stream == f.stream)
        {
            found.push(f);
        }
    }
    let chosen = match chosen {
        Some(c) => c,
        None => {
            let i = found
                .iter()
                .position(|f| f.source == StreamSource::Torch)
                .or_else(|| (!found.is_empty()).then_some(0));
            match i {
                Some(i) => found.remove(i),
                None => Found {
                    source: StreamSource::LegacyDefault,
                    stream: Stream::LegacyDefault,
                    life: StreamLife::Immortal,
                },
            }
        }
    };
    let (source, stream) = (chosen.source, chosen.stream);
    found.retain(|f| f.stream != stream);
    let tensors: Vec<(*const (), TensorRef<'a>)> = args
        .iter()
        .map(|a| (std::ptr::from_ref(*a).cast::<()>(), a.as_ref()))
        .collect();
    // The pins of arguments whose memory the call stream's framework does not order: kept
    // until the kernel is done (one event for all), also when `f` fails or panics.
    let kept: Vec<Owner> = args
        .iter()
        .zip(&owned_by)
        .filter(|(_, by)| **by != Some(stream))
        .map(|(a, _)| a.owner())
        .collect();
    let body = |s: &Arc<CudaStream>| -> Result<R> {
        let _retire = Retire { stream: s, kept };
        let call = KernelCall {
            args: KernelArgs::new(s),
            source,
            tensors,
            kernels: std::cell::RefCell::new(Vec::new()),
        };
        let out = f(&call).map_err(|e| named(e, &call.kernels.borrow()))?;
        if !found.is_empty() {
            let done = tensorbridge_cuda::CudaSignal::record(s)?;
            for other in &found {
                // SAFETY: another framework's current stream, live now (asked during this
                // call; a CuPy stream is held by its keeper in `found`).
                unsafe { done.wait_on_raw(other.stream) }?;
            }
        }
        Ok(out)
    };
    // SAFETY: the stream is live now and for as long as `life` says: PyTorch's default and
    // pool streams are never destroyed (Immortal), a stream PyTorch did not make is lent for
    // the call only (CallOnly: the closure runs on a stream of the layer, forked and joined),
    // CuPy's is kept alive by its Stream object (KeptBy), the legacy default stream always
    // is; a caller's stream as `caller_stream` says.
    unsafe { tensorbridge_cuda::with_stream_raw(ordinal, stream, chosen.life, body) }?
}

/// A cudarc call that failed inside a kernel call's closure (a launch: cudarc's `launch`
/// returns a bare `DriverError`, which converts with `?`), reported with the kernels the
/// closure asked for; any other error as it is.
fn named(e: Error, kernels: &[String]) -> Error {
    match e {
        Error::Cuda(tensorbridge_cuda::Error::Driver {
            call: tensorbridge_cuda::Error::CUDARC_CALL,
            result,
        }) if !kernels.is_empty() => Error::KernelFailed {
            kernel: kernels.join(", "),
            result,
        },
        e => e,
    }
}

/// Retires a call's kept owners on its stream when the call's body ends, however it ends.
struct Retire<'s> {
    stream: &'s Arc<CudaStream>,
    kept: Vec<Owner>,
}

impl Drop for Retire<'_> {
    fn drop(&mut self) {
        if !self.kept.is_empty() {
            tensorbridge_cuda::retire_all_on(self.stream, std::mem::take(&mut self.kept));
        }
    }
}

/// A framework stream found for an argument, as the call uses it.
fn framework_stream(arg: &TensorArg<'_, '_>, ordinal: u32) -> Result<Option<Found>> {
    Ok(arg.framework_stream(ordinal)?.map(|f| Found {
        source: match f.framework {
            Framework::Torch => StreamSource::Torch,
            Framework::CuPy => StreamSource::CuPy,
        },
        stream: f.stream,
        life: f.life,
    }))
}

/// The stream a caller chose for [`kernel_call_on`] (the one reader of `stream=`,
/// [`StreamArg`]; `None` is the legacy default stream, `-1` refused), and how long it lives.
fn caller_stream(stream: &Bound<'_, PyAny>) -> Result<Found> {
    let (stream, life) = StreamArg::read(Some(stream))?.stream_or_default("kernel_call_on")?;
    Ok(Found {
        source: StreamSource::Caller,
        stream,
        life,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use cudarc::driver::sys::CUresult;

    fn launch_failure() -> Error {
        cudarc::driver::DriverError(CUresult::CUDA_ERROR_INVALID_VALUE).into()
    }

    #[test]
    fn a_failed_launch_names_the_kernel() {
        let e = named(launch_failure(), &["axpy".to_owned()]);
        let msg = e.to_string();
        assert!(msg.contains("kernel axpy"), "{msg}");
        assert!(msg.contains("CUDA_ERROR_INVALID_VALUE"), "{msg}");
        let e = named(launch_failure(), &["axpy".to_owned(), "scale".to_owned()]);
        assert!(e.to_string().contains("kernel axpy, scale"), "{e}");
    }

    #[test]
    fn other_errors_and_calls_without_kernels_pass_unchanged() {
        // No kernel asked for: nothing to name.
        let e = named(launch_failure(), &[]);
        assert!(matches!(e, Error::Cuda(_)), "{e}");
        // A failed call of the CUDA layer (not cudarc's launch) keeps its own name.
        let layer = Error::Cuda(tensorbridge_cuda::Error::Driver {
            call: "cuStreamWaitEvent",
            result: CUresult::CUDA_ERROR_INVALID_VALUE,
        });
        let e = named(layer, &["axpy".to_owned()]);
        assert!(e.to_string().contains("cuStreamWaitEvent"), "{e}");
        let e = named(Error::NotAnArgument, &["axpy".to_owned()]);
        assert!(matches!(e, Error::NotAnArgument), "{e}");
    }
}
