//! Import: an interface dict's values -> a validated [`Descriptor`] -> a [`Tensor`].

use tensorbridge_core::{
    Access, DType, Descriptor, Device, Layout, Owner, Packing, Ready, StreamConvention,
    StreamRequest, Tensor, stream_from_wire,
};

use crate::typestr::padded_itemsize;
use crate::{
    ArrayData, ArrayInterface, CudaArrayInterface, DescrField, DescrFormat, Error, Interface,
    TypeStr,
};

/// What the caller knows that the interface does not say.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ImportOptions {
    /// The dtype that `V` (raw bytes) typestrs hold, such as [`DType::BFLOAT16`] for `<V2`
    /// or an fp8 dtype for `<V1`. Its size (one byte per element for fp6/fp4, as ml_dtypes
    /// stores them) must equal the typestr's. `None` refuses `V` typestrs
    /// ([`Error::VoidNeedsDType`]); an opaque dtype (`opaque16`) keeps them as bytes.
    /// Ignored for other kinds.
    pub void_as: Option<DType>,
}

impl ImportOptions {
    /// No hints: `V` typestrs are refused.
    pub const fn new() -> ImportOptions {
        ImportOptions { void_as: None }
    }

    /// Read `V` typestrs as `dtype` (see [`ImportOptions::void_as`](field@ImportOptions::void_as)).
    pub const fn void_as(self, dtype: DType) -> ImportOptions {
        ImportOptions {
            void_as: Some(dtype),
        }
    }
}

/// A validated import waiting for its owner: the descriptor, and the producer stream the
/// data becomes ready on.
///
/// Safe to build and inspect: a [`Descriptor`] promises nothing about the memory. Only
/// [`Imported::into_tensor`], which trusts the address, is `unsafe`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Imported {
    descriptor: Descriptor,
    stream: StreamRequest,
}

impl Imported {
    /// The validated description (byte offset 0 for the CAI and the pointer form of the
    /// array interface; the buffer's `offset` for its buffer form).
    pub fn descriptor(&self) -> &Descriptor {
        &self.descriptor
    }

    /// What the producer asked for: [`StreamRequest::NoSync`] for `stream` `None` (and
    /// always for the array interface), else the stream its pending work is on.
    pub fn stream(&self) -> StreamRequest {
        self.stream
    }

    /// The stream request as the core's readiness: [`Ready::Now`] or [`Ready::Stream`].
    pub fn ready(&self) -> Ready {
        match self.stream {
            StreamRequest::NoSync => Ready::Now,
            StreamRequest::Stream(s) => Ready::Stream(s),
        }
    }

    /// The parts, for callers who attach the owner themselves.
    pub fn into_parts(self) -> (Descriptor, StreamRequest) {
        (self.descriptor, self.stream)
    }

    /// The tensor: the descriptor, `owner`, and [`Imported::ready`].
    ///
    /// Infallible, so `owner` is never dropped on an error path: validate first, then hand
    /// the owner over.
    ///
    /// # Safety
    /// The interface carries no owner, so the caller vouches for the address. Until every
    /// clone of `owner` is dropped (the tensor and its clones hold one each):
    /// 1. every byte of `self.descriptor().byte_span()` is valid memory on the device the
    ///    descriptor names, readable, and writable too unless the interface said read-only;
    /// 2. on host-accessible devices, no one else writes those bytes while a host view of
    ///    the tensor reads them, and no one else touches them while a mutable view writes;
    /// 3. the stream named by [`Imported::stream`], if any, stays valid (CAI v3: the
    ///    exporter's stream lives as long as the exporting object, so keeping that object
    ///    in `owner` is enough), and is a stream of the descriptor's device's primary context;
    /// 4. [`Imported::stream`] is true: [`StreamRequest::NoSync`] only when no work on the
    ///    data is pending, otherwise the stream the producer's pending work is on; and if it
    ///    is the per-thread default stream (`2`), the tensor is used only on the thread that
    ///    exported the interface (it names another stream on every thread). These and
    ///    obligation 3 are what [`Tensor::with_ready`] asks of the readiness.
    pub unsafe fn into_tensor(self, owner: Owner) -> Tensor {
        let ready = self.ready();
        // SAFETY: obligations 1 and 2 are exactly `Tensor::from_descriptor`'s, forwarded to
        // our caller for the same owner and the same descriptor.
        let tensor = unsafe { Tensor::from_descriptor(self.descriptor, owner) };
        // SAFETY: `ready` is `Imported::stream` as a readiness, which our caller vouches for:
        // - `with_ready` 1 (true) and 3 (per-thread stream on its thread): our obligation 4;
        // - `with_ready` 2 (a live stream of the device's primary context while a clone names
        //   it): our obligation 3, which holds until every clone of the owner, so of the
        //   tensor, is dropped (CAI v3: "an exported stream must live at least as long as the
        //   exporting object").
        unsafe { tensor.with_ready(ready) }
    }
}

impl CudaArrayInterface {
    /// Validates the interface for memory on `device` (the CAI has no device key: derive it
    /// from the pointer, e.g. with `cuPointerGetAttribute`).
    ///
    /// Accepts versions 0 to 3; `strides` `None` is C order; byte strides must be multiples of
    /// the item size; data 0 only for zero-size arrays; `mask` must be unset; `descr`, when
    /// present, must be the typestr's default `[('', typestr)]`; `stream` maps through
    /// [`stream_from_wire`] (0 and negative values refused), also for versions below 3 that
    /// carry one.
    pub fn import(&self, device: Device, options: &ImportOptions) -> Result<Imported, Error> {
        if !device.kind.is_cuda_accessible() {
            return Err(Error::UnsupportedDevice {
                device,
                interface: Interface::Cuda,
            });
        }
        let descriptor = Parts {
            shape: &self.shape,
            typestr: self.typestr,
            strides: self.strides.as_deref(),
            descr: self.descr.as_deref(),
            mask: self.mask,
            version: self.version,
        }
        .validate(
            self.data.address,
            0,
            device,
            access(self.data.readonly),
            options,
        )?;
        // The core's table decides what is legal; the message is the CAI's own (the core's
        // names DLPack's -1, which the CAI does not allow).
        let stream = stream_from_wire(StreamConvention::CudaArrayInterface, self.stream).map_err(
            |e| match (e, self.stream) {
                (tensorbridge_core::Error::InvalidStream { .. }, Some(value)) => {
                    Error::InvalidStream { value }
                }
                (e, _) => Error::Core(e),
            },
        )?;
        Ok(Imported { descriptor, stream })
    }
}

impl ArrayInterface {
    /// Validates the interface as host memory ([`Device::CPU`]).
    ///
    /// The same rules as [`CudaArrayInterface::import`] without a stream; for
    /// [`ArrayData::Buffer`], `offset` must be >= 0 and every element must lie inside the
    /// buffer; for [`ArrayData::Pointer`], `offset` is ignored, as the interface says.
    pub fn import(&self, options: &ImportOptions) -> Result<Imported, Error> {
        let parts = Parts {
            shape: &self.shape,
            typestr: self.typestr,
            strides: self.strides.as_deref(),
            descr: self.descr.as_deref(),
            mask: self.mask,
            version: self.version,
        };
        let descriptor = match self.data {
            ArrayData::Pointer(p) => {
                parts.validate(p.address, 0, Device::CPU, access(p.readonly), options)?
            }
            ArrayData::Buffer(region) => {
                let offset = u64::try_from(self.offset).map_err(|_| Error::NegativeOffset {
                    offset: self.offset,
                })?;
                let desc = parts.validate(
                    region.address,
                    offset,
                    Device::CPU,
                    access(region.readonly),
                    options,
                )?;
                let span = desc.byte_span();
                let buffer = region.address..region.address.saturating_add(region.len);
                if !span.is_empty() && (span.start < buffer.start || span.end > buffer.end) {
                    return Err(Error::OutsideBuffer { span, buffer });
                }
                desc
            }
        };
        Ok(Imported {
            descriptor,
            stream: StreamRequest::NoSync,
        })
    }
}

fn access(readonly: bool) -> Access {
    if readonly {
        Access::ReadOnly
    } else {
        Access::ReadWrite
    }
}

/// The keys both interfaces share.
struct Parts<'a> {
    shape: &'a [i64],
    typestr: TypeStr,
    strides: Option<&'a [i64]>,
    descr: Option<&'a [DescrField]>,
    mask: bool,
    version: i64,
}

impl Parts<'_> {
    /// Checks the keys, then hands the layout to the core's validation.
    fn validate(
        &self,
        data: usize,
        byte_offset: u64,
        device: Device,
        access: Access,
        options: &ImportOptions,
    ) -> Result<Descriptor, Error> {
        if !(0..=3).contains(&self.version) {
            return Err(Error::UnsupportedVersion {
                version: self.version,
            });
        }
        if self.mask {
            return Err(Error::Masked);
        }
        if let Some(descr) = self.descr {
            check_descr(descr, self.typestr)?;
        }
        let dtype = self.typestr.to_dtype(options)?;
        // Element strides on the stack up to 8 dimensions (a vector per import before:
        // its allocation and release were a sixth of the import's instructions), checked
        // with the shape and the memory in one call that copies them once, into the
        // descriptor (docs/BENCHMARKS.md, "Conversions at the metadata floor").
        let mut inline = [0i64; 8];
        let spilled: Vec<i64>;
        let strides: Option<&[i64]> = match self.strides {
            None => None,
            Some(bytes) => {
                // Whole bytes: `to_dtype` never yields packed sub-byte types.
                let itemsize = usize::try_from(padded_itemsize(dtype)).unwrap_or(usize::MAX);
                if let Some(out) = inline.get_mut(..bytes.len()) {
                    Layout::strides_from_bytes_into(bytes, itemsize, out)?;
                    Some(&*out)
                } else {
                    spilled = Layout::strides_from_bytes(bytes, itemsize)?;
                    Some(&spilled)
                }
            }
        };
        // `Padded`: one byte per fp6/fp4 element, as ml_dtypes stores them behind `<V1`;
        // the core ignores it for whole-byte dtypes.
        Ok(Descriptor::from_slices(
            data,
            device,
            dtype,
            Packing::Padded,
            self.shape,
            strides,
            byte_offset,
            access,
        )?)
    }
}

/// `descr` may only repeat the typestr: `[('', typestr)]`.
fn check_descr(descr: &[DescrField], typestr: TypeStr) -> Result<(), Error> {
    match descr {
        [
            DescrField {
                name,
                format: DescrFormat::TypeStr(t),
                shape: None,
            },
        ] if name.is_empty() && *t == typestr => Ok(()),
        _ => Err(Error::StructuredDescr {
            descr: descr.to_vec(),
            typestr,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ByteOrder, TypeKind};

    #[test]
    fn only_the_default_descr_passes() {
        let f4 = TypeStr::new(ByteOrder::Little, TypeKind::Float, 4);
        let i4 = TypeStr::new(ByteOrder::Little, TypeKind::Int, 4);
        assert_eq!(check_descr(&f4.default_descr(), f4), Ok(()));
        assert!(check_descr(&i4.default_descr(), f4).is_err());
        assert!(check_descr(&[], f4).is_err());
        let mut named = f4.default_descr();
        named[0].name = "x".into();
        assert!(check_descr(&named, f4).is_err());
        let mut two = f4.default_descr();
        two.extend(f4.default_descr());
        assert!(check_descr(&two, f4).is_err());
    }
}
