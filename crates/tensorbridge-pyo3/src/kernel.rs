//! Your own CUDA kernel on Python tensors: the arguments imported, the producer framework's
//! current stream borrowed as a cudarc stream for the call, checked views, and the
//! frameworks' later work ordered after the kernel's writes.

use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaStream};
use pyo3::prelude::*;
use tensorbridge::{DeviceType, Owner, Stream, Tensor};
use tensorbridge_cudarc::{CudaElement, DeviceView, DeviceViewMut, KernelArgs};

use crate::error::{Error, Result};
use crate::import::exchange;
use crate::owner::KeepAlive;

/// Whose current stream a [`kernel_call`] runs on.
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
}

/// A framework stream found for an argument: where it is, what keeps it alive.
struct Found {
    source: StreamSource,
    stream: Stream,
    keeper: Option<Owner>,
}

/// The arguments of a kernel call and the stream to launch on, as [`kernel_call`] hands
/// them to its closure.
pub struct KernelCall<'s> {
    tensors: Vec<Tensor>,
    args: KernelArgs<'s>,
    source: StreamSource,
}

impl KernelCall<'_> {
    /// The stream to launch on: the producer framework's current stream, borrowed for the
    /// call (see [`kernel_call`]).
    pub fn stream(&self) -> &Arc<CudaStream> {
        self.args.stream()
    }

    /// Whose stream [`stream`](KernelCall::stream) is.
    pub fn source(&self) -> StreamSource {
        self.source
    }

    /// Argument `i`, imported (zero-copy, its producer kept alive).
    pub fn tensor(&self, i: usize) -> Result<&Tensor> {
        self.tensors.get(i).ok_or(Error::NoArgument {
            index: i,
            count: self.tensors.len(),
        })
    }

    /// A read-only view of argument `i` for the kernel, the stream ordered after its
    /// producer on the GPU ([`KernelArgs::input`]).
    pub fn input<T: CudaElement>(&self, i: usize) -> Result<DeviceView<'_, T>> {
        Ok(self.args.input_at(i, self.tensor(i)?)?)
    }

    /// A writable view of argument `i`, refused (`ValueError`) when it overlaps itself or
    /// another argument, and (`BufferError`) when it is read-only ([`KernelArgs::output`]).
    pub fn output<T: CudaElement>(&self, i: usize) -> Result<DeviceViewMut<'_, T>> {
        Ok(self.args.output_at(i, self.tensor(i)?)?)
    }

    /// The kernel `name` of `src`, compiled with NVRTC on first use and cached per context
    /// ([`tensorbridge_cudarc::kernel`]); `RuntimeError` without libnvrtc.
    pub fn kernel(&self, src: &'static str, name: &'static str) -> Result<CudaFunction> {
        Ok(tensorbridge_cudarc::kernel(self.stream(), src, name)?)
    }
}

/// Runs `f`, which launches your own CUDA kernel, on Python tensors `args`, on the stream
/// their framework is using now:
///
/// 1. every argument is imported zero-copy ([`crate::import`]); all must be CUDA (or
///    managed) memory of one device (`ValueError` otherwise: the views refuse);
/// 2. the stream: the current stream of the first argument that comes from PyTorch
///    (through the DLPack C exchange API, so the stream of `with torch.cuda.stream(s)`, or
///    the capturing stream inside `torch.cuda.graph`), else of the first from CuPy
///    (`with cupy.cuda.Stream()`), else the legacy default stream ([`StreamSource`]);
///    borrowed as a cudarc stream for the call
///    ([`tensorbridge_cuda::with_stream_raw`]), the caller's CUDA context restored after;
/// 3. `f` makes the views ([`KernelCall::input`], [`KernelCall::output`]), each of which
///    orders the stream after that tensor's producer on the GPU, and launches;
/// 4. after `f`, the current stream of every other framework among the arguments (CuPy's
///    when the kernel ran on PyTorch's, say) waits on the GPU for the kernel's work, so
///    its later reads see the writes. The kernel's own framework needs nothing: its later
///    work is on the same stream.
///
/// The host never waits (except for NVRTC at a kernel's first use). The closure returns
/// this crate's [`Error`], into which the core's, the CUDA layer's, the cudarc adapter's
/// errors and cudarc's `DriverError` convert with `?`; the result is a `PyResult`.
///
/// JAX arrays are inputs here: JAX hands them over ready and has no current stream to
/// give, and writing into a JAX array in place breaks JAX's immutability.
pub fn kernel_call<R>(
    args: &[&Bound<'_, PyAny>],
    f: impl FnOnce(&KernelCall<'_>) -> Result<R>,
) -> PyResult<R> {
    Ok(kernel_call_inner(args, f)?)
}

fn kernel_call_inner<R>(
    args: &[&Bound<'_, PyAny>],
    f: impl FnOnce(&KernelCall<'_>) -> Result<R>,
) -> Result<R> {
    let tensors = args
        .iter()
        .map(|a| crate::import(a).map_err(Error::from))
        .collect::<Result<Vec<Tensor>>>()?;
    // Kernels take device and managed memory only: refused before any stream is looked for.
    if let Some(t) = tensors
        .iter()
        .find(|t| !matches!(t.device().kind, DeviceType::Cuda | DeviceType::CudaManaged))
    {
        return Err(tensorbridge_cuda::Error::NotCudaMemory { device: t.device() }.into());
    }
    // The device: the first argument on a CUDA device (managed memory names device 0).
    let ordinal = tensors
        .iter()
        .find(|t| t.device().kind == DeviceType::Cuda)
        .or_else(|| tensors.first())
        .map_or(0, |t| t.device().ordinal);
    // Each argument's framework stream, where its framework has one.
    let mut found: Vec<Found> = Vec::new();
    for a in args {
        if let Some(f) = framework_stream(a, ordinal)?
            && !found.iter().any(|g| g.stream == f.stream)
        {
            found.push(f);
        }
    }
    let chosen = found
        .iter()
        .position(|f| f.source == StreamSource::Torch)
        .or_else(|| (!found.is_empty()).then_some(0));
    let (source, stream, keeper) = match chosen {
        Some(i) => {
            let f = found.remove(i);
            (f.source, f.stream, f.keeper)
        }
        None => (StreamSource::LegacyDefault, Stream::LegacyDefault, None),
    };
    let body = |s: &Arc<CudaStream>| -> Result<R> {
        let call = KernelCall {
            tensors,
            args: KernelArgs::new(s),
            source,
        };
        let out = f(&call)?;
        if !found.is_empty() {
            let done = tensorbridge_cuda::CudaSignal::record(s)?;
            for other in &found {
                // SAFETY: another framework's current stream, live now (a CuPy stream is
                // held by its keeper in `found`; PyTorch's and the default streams always are).
                unsafe { done.wait_on_raw(other.stream) }?;
            }
        }
        Ok(out)
    };
    // SAFETY:
    // 1. the stream is live now and as long as `keeper`: PyTorch's current streams are its
    //    default stream or streams of its pools, which it never destroys (a stream made
    //    current from outside, `torch.cuda.ExternalStream`, must outlive the work that uses
    //    it, as PyTorch requires); CuPy's is kept alive by `keeper` (the Stream object); the
    //    legacy default stream always is.
    unsafe { tensorbridge_cuda::with_stream_raw(ordinal, stream, keeper, body) }?
}

/// The current stream of `obj`'s framework on device `ordinal`, when it has one: PyTorch's
/// (the type publishes the DLPack C exchange API), CuPy's (the type's module is `cupy`).
fn framework_stream(obj: &Bound<'_, PyAny>, ordinal: u32) -> Result<Option<Found>> {
    let py = obj.py();
    let device_id = i32::try_from(ordinal).unwrap_or(0);
    let info = exchange::type_info(obj)?;
    if let exchange::Table::Usable(api) = info.table {
        let stream = api.current_work_stream(obj, 2, device_id)?;
        return Ok(Some(Found {
            source: StreamSource::Torch,
            stream,
            keeper: None,
        }));
    }
    if info.cupy {
        let cuda = py.import("cupy.cuda")?;
        let current = cuda
            .getattr(pyo3::intern!(py, "get_current_stream"))?
            .call1((device_id,))?;
        let ptr: usize = current.getattr(pyo3::intern!(py, "ptr"))?.extract()?;
        let stream = tensorbridge_cuda::stream_from_raw(std::ptr::without_provenance_mut(ptr));
        return Ok(Some(Found {
            source: StreamSource::CuPy,
            stream,
            keeper: Some(KeepAlive::owner(current.unbind(), None)),
        }));
    }
    Ok(None)
}
