//! [`Tensor`] -> tch: `at::for_blob` through the shim, with a deleter that releases the
//! tensor's owner exactly once, when libtorch frees the storage.

use std::borrow::Cow;
use std::ffi::c_void;
use std::ptr;

#[cfg(doc)]
use tensorbridge_core::Ready;
use tensorbridge_core::{DeviceType, ExclusiveTensor, Owner, Stream, Tensor};

use crate::Error;
use crate::ffi::{self, ScalarType, TorchDeviceType};
use crate::import::current_cuda_stream;

/// How [`export_with`] treats what libtorch cannot express. [`ExportOptions::new`] (the
/// default) refuses everything [`export`] refuses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExportOptions {
    allow_read_only: bool,
}

impl ExportOptions {
    /// The defaults: read-only tensors are refused ([`Error::ReadOnly`]).
    pub const fn new() -> ExportOptions {
        ExportOptions {
            allow_read_only: false,
        }
    }

    /// Shares read-only tensors too. libtorch has no read-only tensors, so the returned tch
    /// tensor is writable as far as tch knows, and its safe API (`fill_`, `copy_`, in-place
    /// operators...) would write.
    ///
    /// # Safety
    /// The caller guarantees, for each read-only tensor converted with these options:
    /// 1. nothing writes through the returned tch tensor, nor through any tensor libtorch
    ///    derives from it (views, shallow clones, DLPack exports), while any of them lives.
    pub const unsafe fn allow_read_only(self) -> ExportOptions {
        ExportOptions {
            allow_read_only: true,
        }
    }
}

/// What libtorch's storage holds on to: the tensor's owner and, on CUDA, the stream the
/// tensor was handed to. Boxed into the `at::DataPtr`'s context; [`release`] frees it.
struct Release {
    owner: Owner,
    /// The device ordinal and libtorch's current stream at [`export`] time (CUDA only).
    cuda: Option<(u32, Stream)>,
}

/// The context deleter libtorch calls, exactly once, when the storage of a tensor made by
/// [`export`] is freed (after its last view, shallow clone and DLPack export), on whichever
/// thread frees it; also called by the shim when making the tensor failed.
///
/// On CUDA the owner is not dropped at once but kept until the work enqueued so far on the
/// stream the tensor was handed to has finished (`tensorbridge_cuda::retire_on_raw`), as
/// libtorch's caching allocator does for its own blocks: kernels libtorch enqueued there
/// may still read the memory.
///
/// Never unwinds into libtorch, and never aborts: if dropping the owner panics (owners must
/// not: a panicking drop is a bug), the panic is caught and reported, and what was left to
/// release leaks (`tensorbridge_core::callback`, the one policy for such entries).
///
/// # Safety
/// 1. `ctx` came from `Box::into_raw` of a `Box<Release>` in [`export_with`], and this is
///    the one call for it.
unsafe extern "C" fn release(ctx: *mut c_void) {
    // SAFETY: obligation 1: the box's own pointer, turned back into the box exactly once.
    let boxed = unsafe { Box::from_raw(ctx.cast::<Release>()) };
    tensorbridge_core::callback::foreign_entry(
        "libtorch's deleter (tensorbridge-tch)",
        (),
        move || {
            let Release { owner, cuda } = *boxed;
            match cuda {
                // SAFETY: `stream` was libtorch's current stream of device `ordinal` when the
                // tensor was made: its default stream or a pool stream, which libtorch never
                // destroys (the primary context's; never the per-thread stream), so it is live.
                Some((ordinal, stream)) => unsafe {
                    tensorbridge_cuda::retire_on_raw(ordinal, stream, owner);
                },
                None => drop(owner),
            }
        },
    );
}

/// The libtorch device for a core device: CPU (and pinned host memory, which libtorch treats
/// as CPU memory) or CUDA with the ordinal.
fn torch_device(tensor: &Tensor) -> Result<(TorchDeviceType, i8), Error> {
    let device = tensor.device();
    match device.kind {
        DeviceType::Cpu | DeviceType::CudaHost => Ok((TorchDeviceType::CPU, -1)),
        DeviceType::Cuda | DeviceType::CudaManaged => i8::try_from(device.ordinal)
            .map(|index| (TorchDeviceType::CUDA, index))
            .map_err(|_| Error::OrdinalOutOfRange { device }),
        _ => Err(Error::UnsupportedDevice { device }),
    }
}

/// A core [`Tensor`] as a tch tensor, zero-copy: [`export_with`] with the default options
/// (read-only tensors are refused). `unsafe` as [`export_with`] is; [`export_exclusive`] is
/// the safe form.
///
/// # Safety
/// Obligation 1 of [`export_with`].
///
/// Safe code cannot make libtorch write under a live view of a shared tensor:
///
/// ```compile_fail,E0133
/// let t = tensorbridge_core::Tensor::from_vec(vec![1.0f32, 2.0], &[2])?;
/// let slice: &[f32] = t.as_ref().as_slice()?; // a live shared view
/// let _ = tensorbridge_tch::export(&t)?.fill_(11.0); // refused: `export` is `unsafe`
/// assert_eq!(slice, [1.0, 2.0]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// ```
/// use tensorbridge_core::Tensor;
///
/// let t = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3])?;
/// // SAFETY: no view of `t` is alive while libtorch writes below.
/// let torch = unsafe { tensorbridge_tch::export(&t) }?;
/// assert_eq!(torch.size(), [2, 3]);
/// assert_eq!(torch.data_ptr() as usize, t.data_ptr()); // the same memory
/// let _ = torch.narrow(1, 0, 1).fill_(0.0); // libtorch writes through a view of its own
/// drop(torch); // libtorch frees the storage: the deleter releases its clone of the owner
/// assert_eq!(t.host_view::<f32>()?.to_contiguous(), [0.0, 2.0, 3.0, 0.0, 5.0, 6.0]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub unsafe fn export(tensor: &Tensor) -> Result<tch::Tensor, Error> {
    // SAFETY: the caller's obligation 1, forwarded.
    unsafe { export_with(tensor, ExportOptions::new()) }
}

/// A tensor proven to have no other holder ([`Tensor::into_exclusive`]) as a tch tensor,
/// zero-copy, as [`export`] makes it: the sound way to let libtorch write in place from safe
/// tch code (`fill_`, `add_`). The tensor moves into libtorch's storage (its owner released
/// once, when libtorch frees the storage), so no Rust view or clone of it can read the
/// memory while libtorch writes. Read-only tensors are refused ([`Error::ReadOnly`]), and
/// everything else as [`export_with`] refuses it.
///
/// ```
/// use tensorbridge_core::Tensor;
///
/// let t = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3])?;
/// let ptr = t.data_ptr();
/// let mut torch = tensorbridge_tch::export_exclusive(t.into_exclusive().expect("no clone"))?;
/// let _ = torch.fill_(7.0); // safe tch code, writing in place: nobody else can look
/// assert_eq!(torch.data_ptr() as usize, ptr);
/// assert_eq!(Vec::<f32>::try_from(&torch)?, [7.0, 7.0, 7.0]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn export_exclusive(tensor: ExclusiveTensor) -> Result<tch::Tensor, Error> {
    // The storage keeps a clone of the owner; this, its only other holder, goes at the end
    // of the call, so libtorch's storage is the owner's one holder afterwards.
    let tensor = tensor.into_tensor();
    // SAFETY: obligation 1: the owner has no other holder (`ExclusiveTensor`) and `tensor`,
    // its only Rust one, is dropped at the end of this call without a view made of it, so
    // no Rust reference can read the memory libtorch writes.
    unsafe { export_with(&tensor, ExportOptions::new()) }
}

/// A core [`Tensor`] as a tch tensor, zero-copy: `at::for_blob` over the tensor's element 0
/// with its shape and strides (in elements), the matching scalar type and device, and a
/// context that holds a clone of the tensor's owner. libtorch releases that clone exactly
/// once, when it frees the storage: after the returned tensor and every view, shallow clone
/// and DLPack export libtorch made of it are gone.
///
/// Streams: on CUDA, libtorch's current stream for the tensor's device (on this thread) is
/// made to wait, on the GPU, for the tensor's [`Ready`] (`tensorbridge_cuda::make_ready_on_raw`:
/// an event, never a host wait), so libtorch work enqueued there afterwards sees the data.
/// When libtorch frees the storage, the owner is kept until the work enqueued on that stream
/// has finished ([`tensorbridge_cuda::reclaim`] releases it; this function calls it too). A
/// host tensor that is not [`Ready::Now`] is waited for on the host first
/// (`tensorbridge_cuda::synchronize`): libtorch's CPU kernels have no stream.
///
/// A negative stride on a dimension that reaches no memory (of size 1, or of a tensor
/// without elements) is passed as its absolute value, which reaches no memory either.
///
/// Refused with a typed error: negative strides on dimensions of more than one element
/// of a tensor with elements ([`Error::NegativeStride`]), sub-byte
/// dtypes ([`Error::SubByte`]), dtypes libtorch lacks ([`Error::UnsupportedDType`]),
/// devices other than CPU, pinned host, CUDA and managed memory
/// ([`Error::UnsupportedDevice`]), ordinals above 127, and read-only tensors unless the
/// options allow them ([`Error::ReadOnly`]). A refusal or a libtorch failure leaves no clone
/// of the owner behind.
///
/// # Safety
/// `unsafe` because libtorch has no read-only or copy-on-write tensors, and tch's in-place
/// operations (`fill_`, `add_`, `copy_`) are safe: the memory becomes writable from safe code
/// while the caller may still hold views of it. The caller guarantees:
/// 1. while libtorch may write the memory (through the returned tch tensor or anything
///    libtorch makes from it: views, shallow clones, DLPack exports), no Rust reference
///    reads or writes it: no host view or slice of `tensor`, of a clone of it, or of another
///    tensor over the same bytes is alive across such a write.
pub unsafe fn export_with(tensor: &Tensor, options: ExportOptions) -> Result<tch::Tensor, Error> {
    if tensor.is_readonly() && !options.allow_read_only {
        return Err(Error::ReadOnly);
    }
    let scalar_type = ScalarType::from_dtype(tensor.dtype())?;
    let (device_type, device_index) = torch_device(tensor)?;
    let strides = torch_strides(tensor)?;
    let cuda = if device_type == TorchDeviceType::CUDA {
        tensorbridge_cuda::reclaim();
        let stream = current_cuda_stream(device_index)?;
        // SAFETY: `stream` is libtorch's current stream of the tensor's device on this
        // thread: its default stream (the legacy one) or a pool stream, live for the call
        // (libtorch never destroys them), of the device's primary context.
        unsafe { tensorbridge_cuda::make_ready_on_raw(tensor, stream) }?;
        // The deleter may run on another thread, where the per-thread default stream (only
        // an external stream of that value gets here) is another stream; the legacy stream
        // orders after every per-thread stream's work, so retire on that instead.
        let retire_on = match stream {
            Stream::PerThreadDefault => Stream::LegacyDefault,
            stream => stream,
        };
        // The device index is an ordinal that fits `i8`, so it is >= 0.
        Some((device_index as u32, retire_on))
    } else {
        if !tensor.ready().is_now() {
            tensorbridge_cuda::synchronize(tensor)?;
        }
        None
    };
    let shape = tensor.shape();
    let ctx = Box::into_raw(Box::new(Release {
        owner: tensor.owner().clone(),
        cuda,
    }));
    let mut out = ptr::null_mut();
    let mut err = ptr::null_mut();
    // SAFETY:
    // - the data pointer is element 0 of the tensor, with its shape and strides (>= 0 after
    //   `torch_strides`, which only changed strides that reach nothing, so element 0 is the
    //   lowest byte the strides reach): the storage libtorch computes from
    //   them is the tensor's byte span, valid on its device while the owner lives
    //   (`Tensor::from_descriptor`'s obligation 1), which the context keeps alive until
    //   libtorch calls `release`; the scalar type has the dtype's itemsize;
    // - writable: the tensor is read-write, or the caller vouched for no writes
    //   (`ExportOptions::allow_read_only`);
    // - `shape` and `strides` hold `ndim` values each and are only read during the call;
    // - `ctx` is a fresh `Box<Release>` that the shim releases exactly once with `release`
    //   (now, on failure, or when libtorch frees the storage), and it is not used here
    //   again; `out` and `err` are live locals the shim writes once each.
    let status = unsafe {
        ffi::tb_tch_from_blob(
            ptr::with_exposed_provenance_mut::<c_void>(tensor.data_ptr()),
            shape.as_ptr(),
            strides.as_ptr(),
            shape.len() as i64,
            scalar_type,
            device_type,
            device_index,
            ctx.cast(),
            release,
            &mut out,
            &mut err,
        )
    };
    // SAFETY: `err` is what this call stored.
    unsafe { ffi::check("tb_tch_from_blob", status, err) }?;
    // SAFETY: on success `out` is a new heap `at::Tensor` (tch's `C_tensor`) that nobody
    // else owns; the tch tensor takes it over and frees it when dropped.
    Ok(unsafe { tch::Tensor::from_ptr(out) })
}

/// The strides to hand libtorch, which takes none below 0: the tensor's own, except that a
/// negative stride on a dimension that reaches no memory (size 1, or any dimension of a
/// tensor without elements: `stride * (size - 1)` moves nowhere, or nothing is read) becomes
/// its absolute value. So element 0 stays the lowest byte the strides reach, and the storage
/// libtorch computes is the tensor's byte span (none without elements). A negative stride
/// that does move is refused, naming the first such dimension.
fn torch_strides(tensor: &Tensor) -> Result<Cow<'_, [i64]>, Error> {
    let strides = tensor.strides_elems();
    if strides.iter().all(|&s| s >= 0) {
        return Ok(Cow::Borrowed(strides));
    }
    let empty = tensor.numel() == 0;
    let mut normalised = strides.to_vec();
    for (dim, (stride, &size)) in normalised.iter_mut().zip(tensor.shape()).enumerate() {
        if *stride < 0 {
            if !empty && size > 1 {
                return Err(Error::NegativeStride {
                    dim,
                    stride: *stride,
                });
            }
            *stride = stride.saturating_abs();
        }
    }
    Ok(Cow::Owned(normalised))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tensorbridge_testkit::DropCounter;

    /// Calls the shim as `export_with` does, with a counted owner and the given sizes and
    /// scalar type, and returns its status.
    fn make(counter: &DropCounter, sizes: &[i64], scalar_type: ScalarType) -> i32 {
        let buffer = vec![0f32; 16];
        let ctx = Box::into_raw(Box::new(Release {
            owner: counter.owner_with(buffer),
            cuda: None,
        }));
        let strides = vec![1i64; sizes.len()];
        let data = ptr::dangling_mut::<f32>().cast::<c_void>();
        let mut out = ptr::null_mut();
        let mut err = ptr::null_mut();
        // SAFETY: as in `export_with`; every call here is made to fail before libtorch could
        // read `data` (a dangling pointer).
        let status = unsafe {
            ffi::tb_tch_from_blob(
                data,
                sizes.as_ptr(),
                strides.as_ptr(),
                sizes.len() as i64,
                scalar_type,
                TorchDeviceType::CPU,
                -1,
                ctx.cast(),
                release,
                &mut out,
                &mut err,
            )
        };
        // SAFETY: `err` is what the call stored.
        let result = unsafe { ffi::check("tb_tch_from_blob", status, err) };
        assert_eq!(status != 0, result.is_err());
        if let Err(e) = result {
            println!("{e}");
            assert!(out.is_null());
        }
        status
    }

    #[test]
    fn a_failure_before_libtorch_took_the_context_releases_it_once() {
        // An unknown scalar type fails while the options are built, before `for_blob`.
        let counter = DropCounter::new();
        assert_ne!(make(&counter, &[4], ScalarType(100)), 0);
        assert_eq!(counter.drops(), 1);
    }

    #[test]
    fn a_failure_inside_make_tensor_releases_the_context_once() {
        // A negative size fails in `make_tensor`, after the maker took the context.
        let counter = DropCounter::new();
        assert_ne!(make(&counter, &[-1], ScalarType::FLOAT), 0);
        assert_eq!(counter.drops(), 1);
    }
}
