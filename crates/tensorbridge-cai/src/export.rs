//! Export: a [`Tensor`] (or a [`Descriptor`] and its [`Ready`]) -> an interface dict's values.

use tensorbridge_core::{
    Descriptor, Layout, Ready, StreamConvention, StreamRequest, Tensor, stream_to_wire,
};

use crate::{
    ArrayData, ArrayInterface, CudaArrayInterface, DataPointer, Error, Interface, TypeStr,
};

/// The version both interfaces are exported as.
pub const EXPORT_VERSION: i64 = 3;

/// The keys both interfaces share, with the byte offset folded into the address.
struct Common {
    typestr: TypeStr,
    shape: Vec<i64>,
    strides: Vec<i64>,
    address: usize,
}

fn common(desc: &Descriptor) -> Result<Common, Error> {
    let typestr = TypeStr::from_dtype(desc.dtype())?;
    Ok(Common {
        typestr,
        shape: desc.shape().to_vec(),
        // Never `None` for an array with elements: no consumer has to work out C order
        // (several consumers mishandle absent strides; zero-size CUDA arrays are the one
        // exception, `CudaArrayInterface::export_descriptor`). Whole bytes: every dtype with
        // a typestr has whole-byte elements.
        strides: desc.strides_bytes()?,
        // The CAI has no offset key, and the array interface's applies only to buffers.
        address: desc.data_ptr(),
    })
}

impl CudaArrayInterface {
    /// The interface describing `tensor`, zero-copy; see [`CudaArrayInterface::export_descriptor`].
    pub fn export(tensor: &Tensor) -> Result<CudaArrayInterface, Error> {
        CudaArrayInterface::export_descriptor(tensor.descriptor(), tensor.ready())
    }

    /// The interface (version 3) describing memory that CUDA kernels can take: CUDA device,
    /// managed and pinned host memory ([`Error::UnsupportedDevice`] otherwise).
    ///
    /// Exact byte strides (`None` only for zero-size arrays, see below); the byte offset
    /// folded into the address, which is 0 for zero-size arrays; `readonly` carried; `descr` the default `[('', typestr)]`;
    /// `stream` the producer stream of `ready` through
    /// [`stream_to_wire`](tensorbridge_core::stream_to_wire) (`None` for [`Ready::Now`]; a signal
    /// with no producer stream is refused, as the interface cannot carry an event).
    ///
    /// A zero-size array goes out as its producers give it (PyTorch, CuPy): null address,
    /// `strides` `None` (kept only where the shape's row-major strides would overflow, which
    /// the import of `None` computes). A consumer sizes the memory from the strides when they are there
    /// (CuPy 14: the largest `|shape * stride|`, 16 bytes for shape `(0, 4)` of `float32`)
    /// and must then find the device of the null address, which it cannot: CuPy refused the
    /// view of an empty PyTorch tensor that it takes from PyTorch itself.
    pub fn export_descriptor(
        desc: &Descriptor,
        ready: &Ready,
    ) -> Result<CudaArrayInterface, Error> {
        if !desc.device().kind.is_cuda_accessible() {
            return Err(Error::UnsupportedDevice {
                device: desc.device(),
                interface: Interface::Cuda,
            });
        }
        let stream = match ready {
            Ready::Now => None,
            Ready::Stream(s) => Some(*s),
            Ready::Signal(signal) => Some(signal.producer_stream().ok_or(Error::NoProducerStream)?),
        };
        let request = stream.map_or(StreamRequest::NoSync, StreamRequest::Stream);
        let stream = stream_to_wire(StreamConvention::CudaArrayInterface, request)?;
        let c = common(desc)?;
        Ok(CudaArrayInterface {
            descr: Some(c.typestr.default_descr()),
            typestr: c.typestr,
            shape: c.shape,
            data: DataPointer {
                address: if desc.numel() == 0 { 0 } else { c.address },
                readonly: desc.is_readonly(),
            },
            strides: if desc.numel() == 0 && Layout::row_major(desc.shape()).is_ok() {
                None
            } else {
                Some(c.strides)
            },
            mask: false,
            version: EXPORT_VERSION,
            stream,
        })
    }
}

impl ArrayInterface {
    /// The interface describing `tensor`, zero-copy; see [`ArrayInterface::export_descriptor`].
    pub fn export(tensor: &Tensor) -> Result<ArrayInterface, Error> {
        ArrayInterface::export_descriptor(tensor.descriptor(), tensor.ready())
    }

    /// The interface (version 3) describing host memory: CPU and pinned host memory
    /// ([`Error::UnsupportedDevice`] otherwise).
    ///
    /// The pointer form of `data` with the byte offset folded in (so `offset` is 0), exact
    /// byte strides, `readonly` carried, the default `descr`. The interface has no stream,
    /// so data with pending device work is refused (the core's `NotReady`): synchronise first.
    pub fn export_descriptor(desc: &Descriptor, ready: &Ready) -> Result<ArrayInterface, Error> {
        if !desc.device().kind.is_host_accessible() {
            return Err(Error::UnsupportedDevice {
                device: desc.device(),
                interface: Interface::Array,
            });
        }
        if !ready.is_now() {
            return Err(tensorbridge_core::Error::NotReady.into());
        }
        let c = common(desc)?;
        Ok(ArrayInterface {
            descr: Some(c.typestr.default_descr()),
            typestr: c.typestr,
            shape: c.shape,
            data: ArrayData::Pointer(DataPointer {
                address: c.address,
                readonly: desc.is_readonly(),
            }),
            strides: Some(c.strides),
            mask: false,
            offset: 0,
            version: EXPORT_VERSION,
        })
    }
}
