//! The trust boundary: untrusted [`RawTensor`] -> validated [`Descriptor`] -> [`Tensor`].

use std::any::Any;
use std::fmt;
use std::ops::{Deref, Range};
use std::sync::Arc;

#[cfg(doc)]
use crate::Stream;
use crate::layout::{Dims, Facts, MAX_ELEM_REACH, strides_or_row_major};
use crate::view::{Element, HostView, HostViewMut};
use crate::{DType, Device, Error, Layout, Packing, Ready};

/// Whether consumers may write through a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum Access {
    /// Consumers must not write (DLPack `READ_ONLY`, CAI `data[1] == True`).
    ReadOnly,
    /// Consumers may write.
    #[default]
    ReadWrite,
}

/// Whatever keeps a tensor's memory alive. Dropping the last clone releases the memory, for
/// example by running a DLPack producer's deleter or dropping a Python reference.
pub type Owner = Arc<dyn Any + Send + Sync>;

/// An untrusted description of a tensor, as it arrives from foreign code: raw integer codes,
/// borrowed shape and strides, nothing checked. [`RawTensor::validate`] is the only way on.
///
/// Validation never dereferences `data`.
#[derive(Clone, Copy, Debug)]
pub struct RawTensor<'a> {
    /// Data pointer (an address, or a handle on devices such as OpenCL). 0 is allowed only
    /// for tensors without elements.
    pub data: usize,
    /// DLPack `DLDeviceType` code.
    pub device_type: i32,
    /// DLPack device id.
    pub device_id: i32,
    /// DLPack `DLDataTypeCode`.
    pub dtype_code: u8,
    /// Bits per lane.
    pub dtype_bits: u8,
    /// Lanes per element.
    pub dtype_lanes: u16,
    /// Extents.
    pub shape: &'a [i64],
    /// Strides in units of elements; `None` means compact row-major.
    pub strides: Option<&'a [i64]>,
    /// Bytes from `data` to element 0.
    pub byte_offset: u64,
    /// Whether consumers may write.
    pub access: Access,
    /// How sub-byte elements are laid out (ignored for whole-byte types).
    pub packing: Packing,
}

impl<'a> RawTensor<'a> {
    /// A raw descriptor for memory on `device`, C order, read-write; fill in the other
    /// fields with struct update syntax.
    pub fn new(data: usize, device: Device, dtype: DType, shape: &'a [i64]) -> RawTensor<'a> {
        RawTensor {
            data,
            device_type: device.kind.code(),
            // An ordinal DLPack cannot carry (above i32::MAX) becomes -1, which validation
            // refuses, rather than a different device.
            device_id: i32::try_from(device.ordinal).unwrap_or(-1),
            dtype_code: dtype.code().code(),
            dtype_bits: dtype.bits(),
            dtype_lanes: dtype.lanes(),
            shape,
            strides: None,
            byte_offset: 0,
            access: Access::ReadWrite,
            packing: Packing::Packed,
        }
    }

    /// [`RawTensor::new`] on the host ([`Device::CPU`]).
    pub fn host(data: usize, dtype: DType, shape: &'a [i64]) -> RawTensor<'a> {
        RawTensor::new(data, Device::CPU, dtype, shape)
    }

    /// Checks everything: device and dtype codes, rank agreement, non-negative extents,
    /// overflow-free element, bit and byte arithmetic, null data only when empty, alignment
    /// of element 0 for the dtype (devices with addresses), and that the byte span the strides
    /// reach fits in the address space.
    #[inline]
    pub fn validate(&self) -> Result<Descriptor, Error> {
        let device = Device::from_dlpack(self.device_type, self.device_id)?;
        let dtype = DType::from_dlpack(self.dtype_code, self.dtype_bits, self.dtype_lanes)?;
        Descriptor::from_slices(
            self.data,
            device,
            dtype,
            self.packing,
            self.shape,
            self.strides,
            self.byte_offset,
            self.access,
        )
    }
}

/// A validated description of a tensor: where its bytes are, what they mean, and how they
/// are laid out. Holds no owner and promises nothing about the memory; see [`Tensor`].
///
/// Built only by [`Descriptor::new`] and [`RawTensor::validate`]; every getter is infallible.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Descriptor {
    data: usize,
    device: Device,
    dtype: DType,
    packing: Packing,
    layout: Layout,
    access: Access,
    // `nbytes` and the byte span are computed when asked (a multiplication each), not
    // stored: a `Tensor` crosses every hand-off by value, and at up to 256 bytes it is
    // copied by glibc's straight-line `memcpy` path instead of its loop (measured on the
    // DLPack round trip, where the tensor moves twice).
}

impl Descriptor {
    /// Validates typed parts; see [`RawTensor::validate`] for what is checked.
    #[inline]
    pub fn new(
        data: usize,
        device: Device,
        dtype: DType,
        packing: Packing,
        layout: Layout,
        access: Access,
    ) -> Result<Descriptor, Error> {
        let memory = Memory::check(
            data,
            device,
            dtype,
            packing,
            layout.strides_elems(),
            layout.byte_offset(),
            layout.facts(),
        )?;
        Ok(Descriptor {
            data,
            device,
            dtype,
            packing: memory.packing,
            layout,
            access,
        })
    }

    /// Validates typed parts with the shape and strides (in elements; `None` is compact
    /// row-major) still borrowed: [`RawTensor::validate`] once the codes are decoded, and
    /// what adapters whose device and dtype are already typed call instead of building a
    /// [`Layout`] first (which validates the dimensions, then moves them into the
    /// descriptor). The dimensions are checked on the borrowed slices and copied once, into
    /// the result.
    #[allow(
        clippy::too_many_arguments,
        reason = "the fields of a descriptor, each checked; a struct of them is `RawTensor`"
    )]
    #[inline]
    pub fn from_slices(
        data: usize,
        device: Device,
        dtype: DType,
        packing: Packing,
        shape: &[i64],
        strides: Option<&[i64]>,
        byte_offset: u64,
        access: Access,
    ) -> Result<Descriptor, Error> {
        let mut storage = Dims::new();
        let strides = strides_or_row_major(shape, strides, &mut storage)?;
        let facts = Facts::check(shape, strides)?;
        let memory = Memory::check(data, device, dtype, packing, strides, byte_offset, facts)?;
        Ok(Descriptor {
            data,
            device,
            dtype,
            packing: memory.packing,
            layout: Layout::from_checked(shape, strides, byte_offset, facts),
            access,
        })
    }

    /// The data pointer as given (an address, or a handle on devices without addresses).
    #[inline]
    pub fn data(&self) -> usize {
        self.data
    }

    /// The address of element 0 (`data + byte_offset`) on devices with addresses; `data`
    /// itself on handle devices, where the byte offset must travel separately.
    #[inline]
    pub fn data_ptr(&self) -> usize {
        if self.device.kind.has_addresses() {
            // Checked to fit in `Descriptor::new`.
            self.data + self.layout.byte_offset() as usize
        } else {
            self.data
        }
    }

    /// Where the memory lives.
    #[inline]
    pub fn device(&self) -> Device {
        self.device
    }

    /// The element type.
    #[inline]
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// How sub-byte elements are laid out; always [`Packing::Packed`] for whole-byte types.
    #[inline]
    pub fn packing(&self) -> Packing {
        self.packing
    }

    /// Shape, strides and byte offset.
    #[inline]
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Extents, all >= 0.
    #[inline]
    pub fn shape(&self) -> &[i64] {
        self.layout.shape()
    }

    /// Strides in units of elements.
    #[inline]
    pub fn strides_elems(&self) -> &[i64] {
        self.layout.strides_elems()
    }

    /// Strides in bytes. Fails only for packed sub-byte types where a stride is not a whole
    /// number of bytes ([`Error::SubByteStride`]).
    pub fn strides_bytes(&self) -> Result<Vec<i64>, Error> {
        let bits = self.dtype.storage_bits(self.packing);
        // Allocated once at its length: collecting `Result`s grows the vector from empty
        // (a `realloc` per doubling; the CAI export of a rank-8 tensor paid three).
        let mut out = Vec::with_capacity(self.ndim());
        for (dim, &s) in self.strides_elems().iter().enumerate() {
            // Exact in i64: checked in `Descriptor::new`.
            let b = i128::from(s) * i128::from(bits);
            if b % 8 != 0 {
                return Err(Error::SubByteStride {
                    dim,
                    stride: s,
                    bits,
                });
            }
            out.push((b / 8) as i64);
        }
        Ok(out)
    }

    /// Bytes from `data` to element 0.
    #[inline]
    pub fn byte_offset(&self) -> u64 {
        self.layout.byte_offset()
    }

    /// Number of dimensions.
    #[inline]
    pub fn ndim(&self) -> usize {
        self.layout.ndim()
    }

    /// Number of elements.
    #[inline]
    pub fn numel(&self) -> u64 {
        self.layout.numel()
    }

    /// Bytes the elements occupy: `numel * itemsize` (packed sub-byte types: rounded up to
    /// whole bytes). Not the span: a broadcast tensor's span is smaller, a strided one's larger.
    #[inline]
    pub fn nbytes(&self) -> u64 {
        // Checked to fit in `u64` by the validation that built `self`.
        nbytes_exact(self.numel(), self.storage_bits()) as u64
    }

    /// The bytes `[lowest, highest)` that the strides reach: absolute addresses on devices
    /// with addresses, offsets from the handle on others. Empty for tensors without elements.
    #[inline]
    pub fn byte_span(&self) -> Range<usize> {
        let first = if self.device.kind.has_addresses() {
            self.data_ptr()
        } else {
            self.byte_offset() as usize
        };
        let (lo, hi) = self.byte_span_from_first();
        // Both ends checked to fit in `Descriptor::new`.
        let lo = (first as i128 + i128::from(lo)) as usize;
        let hi = (first as i128 + i128::from(hi)) as usize;
        lo..hi
    }

    /// Refuses `self`, argument `index` of a call that writes it, when its bytes overlap
    /// those of `other`, argument `other_index` of the same call ([`Error::Aliased`]).
    ///
    /// Spans are compared, not elements: two interleaved views of one buffer (the even and
    /// the odd elements) are refused although they share no element. Tensors without
    /// elements overlap nothing; memory of devices without addresses (handles) cannot be
    /// compared and is taken as disjoint when the devices differ, compared as offsets
    /// otherwise. Host and device addresses are one address space under CUDA's unified
    /// addressing, so CUDA, pinned and managed memory are compared whatever their devices.
    pub fn check_disjoint(
        &self,
        index: usize,
        other: &Descriptor,
        other_index: usize,
    ) -> Result<(), Error> {
        let comparable = (self.device.kind.has_addresses() && other.device.kind.has_addresses())
            || self.device == other.device;
        if !comparable || self.numel() == 0 || other.numel() == 0 {
            return Ok(());
        }
        let (a, b) = (self.byte_span(), other.byte_span());
        if a.start < b.end && b.start < a.end {
            return Err(Error::Aliased {
                written: index,
                written_lo: a.start,
                written_hi: a.end,
                other: other_index,
                other_lo: b.start,
                other_hi: b.end,
                device: self.device,
            });
        }
        Ok(())
    }

    /// The span's bytes relative to element 0, `[lo, hi)`.
    #[inline]
    pub fn byte_span_from_first(&self) -> (i64, i64) {
        let (lo, hi) = span_exact(self.numel(), self.layout.elem_reach(), self.storage_bits());
        // Both ends checked to fit in `i64` by the validation that built `self`.
        (lo as i64, hi as i64)
    }

    /// Bits per element as stored (the packing decides for sub-byte types).
    #[inline]
    fn storage_bits(&self) -> i128 {
        i128::from(self.dtype.storage_bits(self.packing))
    }

    /// Read-only or read-write.
    #[inline]
    pub fn access(&self) -> Access {
        self.access
    }

    /// Whether consumers must not write.
    #[inline]
    pub fn is_readonly(&self) -> bool {
        self.access == Access::ReadOnly
    }

    /// The same description with writes forbidden. (The opposite direction is not offered:
    /// only whoever vouches for the memory may grant writes.)
    pub fn to_readonly(&self) -> Descriptor {
        Descriptor {
            access: Access::ReadOnly,
            ..self.clone()
        }
    }

    /// The same tensor described with `byte_offset = 0` and the offset folded into the data
    /// pointer, which is what consumers that ignore `byte_offset` need (several DLPack
    /// consumers read `data` and never `byte_offset`). Unchanged on handle devices, whose offset cannot be folded.
    pub fn with_offset_folded(&self) -> Descriptor {
        let mut folded = self.clone();
        folded.fold_offset();
        folded
    }

    /// Folds the byte offset into the data pointer in place (see `with_offset_folded`).
    fn fold_offset(&mut self) {
        if self.device.kind.has_addresses() && self.byte_offset() != 0 {
            self.data = self.data_ptr();
            self.layout.set_byte_offset(0);
        }
    }
}

/// What checking the memory side of a descriptor establishes.
struct Memory {
    packing: Packing,
}

/// Bytes `numel` elements of `bits` bits occupy, rounded up to whole bytes; exact (`numel`
/// is below 2^64 and `bits` below 2^24).
#[inline]
fn nbytes_exact(numel: u64, bits: i128) -> i128 {
    (i128::from(numel) * bits + 7) / 8
}

/// Bytes `[lo, hi)` reached relative to element 0 by elements `reach.0..=reach.1` of `bits`
/// bits; `(0, 0)` when there are none. Exact: reach is within `±2^55` and `bits` below 2^24.
#[inline]
fn span_exact(numel: u64, reach: (i64, i64), bits: i128) -> (i128, i128) {
    if numel == 0 {
        return (0, 0);
    }
    let (lo, hi) = reach;
    // Arithmetic shifts: floor division by 8, without a 128-bit division call.
    (
        (i128::from(lo) * bits) >> 3,
        ((i128::from(hi) + 1) * bits + 7) >> 3,
    )
}

impl Memory {
    /// Byte arithmetic, null data, address space and alignment; see [`RawTensor::validate`].
    #[inline]
    fn check(
        data: usize,
        device: Device,
        dtype: DType,
        packing: Packing,
        strides: &[i64],
        byte_offset: u64,
        facts: Facts,
    ) -> Result<Memory, Error> {
        let packing = if dtype.is_subbyte() {
            packing
        } else {
            Packing::Packed
        };
        let bits = i128::from(dtype.storage_bits(packing));
        let numel = facts.numel;
        // Only checked here: `Descriptor` computes both again when asked.
        u64::try_from(nbytes_exact(numel, bits)).map_err(|_| Error::Overflow {
            what: "number of bytes",
        })?;
        // Byte strides must be exact in i64 (they are handed to NumPy, CAI and libtorch).
        // `Facts::check` bounded every stride by `MAX_ELEM_REACH` (2^55 - 1), so up to 256
        // bits per element (every dtype but wide vectors of lanes) the product is below
        // 2^63 and the scan over the strides can be skipped.
        let bits64 = bits as i64;
        const _: () = assert!((MAX_ELEM_REACH as i128) * 256 <= i64::MAX as i128);
        if bits64 > 256 && strides.iter().any(|s| s.checked_mul(bits64).is_none()) {
            return Err(Error::Overflow {
                what: "byte stride",
            });
        }
        let (lo_b, hi_b) = span_exact(numel, facts.reach, bits);
        let fit = |v: i128| i64::try_from(v).map_err(|_| Error::Overflow { what: "byte span" });
        let span = (fit(lo_b)?, fit(hi_b)?);
        // Base 0 for handle devices: offsets inside the handle's buffer must be >= 0 too.
        let base: i128 = if device.kind.has_addresses() {
            data as i128
        } else {
            0
        };
        let first = base + i128::from(byte_offset);
        let out_of_space = |reach: i128| Error::OutOfAddressSpace {
            addr: first.min(usize::MAX as i128) as usize,
            reach,
        };
        if first > usize::MAX as i128 {
            return Err(out_of_space(0));
        }
        if first + i128::from(span.0) < 0 {
            return Err(out_of_space(i128::from(span.0)));
        }
        if first + i128::from(span.1) > usize::MAX as i128 {
            return Err(out_of_space(i128::from(span.1)));
        }
        if numel > 0 && data == 0 {
            return Err(Error::NullData { numel });
        }
        let align = dtype.alignment();
        // `first` fits usize (checked above).
        let addr = first as usize;
        // Alignments are powers of two (1 to 8): a mask, not a division, on this hot path.
        debug_assert!(align.is_power_of_two());
        if numel > 0 && device.kind.has_addresses() && addr & (align - 1) != 0 {
            return Err(Error::Misaligned { addr, align });
        }
        Ok(Memory { packing })
    }
}

impl fmt::Debug for Descriptor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Descriptor")
            .field("data", &format_args!("{:#x}", self.data))
            .field("device", &format_args!("{}", self.device))
            .field("dtype", &format_args!("{}", self.dtype))
            .field("shape", &self.shape())
            .field("strides_elems", &self.strides_elems())
            .field("byte_offset", &self.byte_offset())
            .field("access", &self.access)
            .finish()
    }
}

/// A validated tensor description together with the owner that keeps its memory alive and
/// where its data becomes ready. Cheap to clone (no heap allocation for up to 8 dimensions);
/// dropping the last clone drops the owner, which releases the memory exactly once.
///
/// `Tensor` dereferences to its [`Descriptor`] for the layout getters: a tensor *is* a
/// descriptor with a guarantee attached, and repeating two dozen getters would add nothing.
#[derive(Clone)]
pub struct Tensor {
    desc: Descriptor,
    owner: Owner,
    ready: Ready,
}

// A `Tensor` crosses every hand-off by value: an export keeps a clone, an import hands one
// back, and callers move the result. Up to 256 bytes, glibc's `memcpy` copies it in
// straight-line code (29 instructions, callgrind); above, it takes its loop path (52). Adapters wrap it with a few bytes more (the DLPack
// `Imported` is 256), hence the headroom. Measured on 64-bit targets only.
#[cfg(target_pointer_width = "64")]
const _: () = assert!(std::mem::size_of::<Tensor>() <= 240);

impl Tensor {
    /// Attaches an owner to a validated description. The tensor is [`Ready::Now`]: when work
    /// on the memory is still pending, attach where it completes with [`Tensor::with_ready`]
    /// before the tensor is used.
    ///
    /// # Safety
    /// The caller guarantees, until every clone of `owner` is dropped (the tensor and its
    /// clones hold one each):
    /// 1. every byte of `desc.byte_span()` is valid memory on `desc.device()`, readable, and
    ///    writable too when `desc.access()` is [`Access::ReadWrite`];
    /// 2. on host-accessible devices, no one else writes those bytes while a host view of
    ///    this tensor reads them, and no one else reads or writes them while a mutable host
    ///    view writes (device-side ordering is what [`Ready`] is for).
    #[inline]
    pub unsafe fn from_descriptor(desc: Descriptor, owner: Owner) -> Tensor {
        Tensor {
            desc,
            owner,
            ready: Ready::Now,
        }
    }

    /// A writable host tensor that owns `data`, with the given shape in C order.
    pub fn from_vec<T: Element>(data: Vec<T>, shape: &[i64]) -> Result<Tensor, Error> {
        let layout = Layout::row_major(shape)?;
        if layout.numel() != data.len() as u64 {
            return Err(Error::ElementCount {
                numel: layout.numel(),
                len: data.len(),
            });
        }
        let owner = BoxOwner::new(data.into_boxed_slice());
        let desc = Descriptor::new(
            owner.ptr as usize,
            Device::CPU,
            T::DTYPE,
            Packing::Packed,
            layout,
            Access::ReadWrite,
        )?;
        // SAFETY:
        // - the span is the boxed slice's `len` elements in C order, which `BoxOwner` keeps
        //   allocated (and writable: it came from `Box::into_raw`) until its last clone drops;
        // - the slice is reachable only through the raw pointer, never through a reference,
        //   so host views are the only readers and writers and uphold obligation 2 themselves.
        Ok(unsafe { Tensor::from_descriptor(desc, Arc::new(owner)) })
    }

    /// The validated description.
    #[inline]
    pub fn descriptor(&self) -> &Descriptor {
        &self.desc
    }

    /// The owner; clone it to keep the memory alive beyond this tensor.
    #[inline]
    pub fn owner(&self) -> &Owner {
        &self.owner
    }

    /// Where the data becomes ready.
    #[inline]
    pub fn ready(&self) -> &Ready {
        &self.ready
    }

    /// The same tensor, ready per `ready` (adapters call this when they know the producer
    /// stream or have recorded an event).
    ///
    /// `unsafe` because everything downstream trusts the readiness: host views are allowed
    /// only on [`Ready::Now`], and CUDA-aware adapters hand the streams it names to the driver
    /// from safe functions. A [`Ready`] itself is safe to make, like a raw pointer; attaching
    /// it is what vouches for it:
    ///
    /// ```compile_fail,E0133
    /// use tensorbridge_core::{Ready, Stream, StreamHandle, Tensor};
    /// let t = Tensor::from_vec(vec![1.0f32], &[1])?;
    /// let made_up = Stream::Handle(StreamHandle::new(0xdead).unwrap()); // fine: a number
    /// let t = t.with_ready(Ready::Stream(made_up)); // refused: trusting it is `unsafe`
    /// # Ok::<(), tensorbridge_core::Error>(())
    /// ```
    ///
    /// # Safety
    /// The caller guarantees:
    /// 1. `ready` truthfully says when the data is ready: host or device access ordered after
    ///    it sees every write of the producer's work ([`Ready::Stream`]: the work enqueued on
    ///    that stream so far; [`Ready::Signal`]: the signal's `enqueue_wait` and `synchronize`
    ///    order after it). [`Ready::Now`] only when nothing is pending: no device work that
    ///    writes the memory still runs or waits to run;
    /// 2. every stream handle `ready` names ([`Ready::Stream`]`(`[`Stream::Handle`]`(_))`, or a
    ///    signal's [`producer_stream`](crate::ReadySignal::producer_stream)) is a live stream
    ///    of a device's primary context (the runtime API's, which PyTorch, CuPy and JAX use;
    ///    normally the tensor's device), until no clone of the returned tensor names it any
    ///    more: each has been dropped or given another readiness that does not name it;
    /// 3. [`Stream::PerThreadDefault`] names the per-thread default stream of the thread that
    ///    uses the tensor, which differs from thread to thread: `ready` names it only when
    ///    this is the thread that enqueued the producer's work, and while a clone of the
    ///    returned tensor still names it, adapters are asked to act on the readiness (hand
    ///    it off, view, synchronise or export it) only on this thread.
    #[inline]
    pub unsafe fn with_ready(mut self, ready: Ready) -> Tensor {
        // In place: the struct update form built a second tensor and copied it (240 bytes)
        // where it was not inlined.
        self.ready = ready;
        self
    }

    /// The same tensor, read-only.
    pub fn into_readonly(mut self) -> Tensor {
        self.desc.access = Access::ReadOnly;
        self
    }

    /// The same tensor with its byte offset folded into the data pointer
    /// ([`Descriptor::with_offset_folded`]).
    pub fn into_offset_folded(mut self) -> Tensor {
        self.desc.fold_offset();
        self
    }

    /// Clones the tensor into `dst` and returns it there, initialised: what
    /// `dst.write(self.clone())` does, without building the clone on the stack first (a
    /// tensor is a few hundred bytes; adapters that box a clone per export, such as
    /// tensorbridge-dlpack's, save a copy per conversion). Whatever `dst` held is overwritten,
    /// not dropped, as with [`MaybeUninit::write`](std::mem::MaybeUninit::write).
    ///
    /// ```
    /// use std::mem::MaybeUninit;
    /// use tensorbridge_core::Tensor;
    ///
    /// let t = Tensor::from_vec(vec![1u8, 2, 3], &[3])?;
    /// let mut slot = Box::new(MaybeUninit::<Tensor>::uninit());
    /// let copy = t.clone_into_uninit(&mut slot);
    /// assert_eq!(copy.descriptor(), t.descriptor());
    /// // `MaybeUninit` never drops what it holds: take the clone out to release it (Miri
    /// // reports the leak otherwise).
    /// // SAFETY: initialised by `clone_into_uninit` above, and taken out once.
    /// let copy = unsafe { slot.assume_init_read() };
    /// drop(copy);
    /// # Ok::<(), tensorbridge_core::Error>(())
    /// ```
    #[inline]
    pub fn clone_into_uninit<'a>(
        &self,
        dst: &'a mut std::mem::MaybeUninit<Tensor>,
    ) -> &'a mut Tensor {
        let dst = dst.as_mut_ptr();
        if self.desc.layout.is_inline() {
            // SAFETY: `dst` is valid for writes of one `Tensor` (it comes from a `&mut
            // MaybeUninit<Tensor>`) and cannot overlap `self` (a shared and a unique borrow).
            // The bitwise copy duplicates the descriptor, which is sound for an inline layout
            // (`Layout::is_inline`; every other descriptor field is `Copy`), and the owner and
            // readiness handles, whose counts the two forgotten clones below raise for the copy.
            unsafe { std::ptr::copy_nonoverlapping(self, dst, 1) };
            // The copy's owner is `self.owner`'s pointer; this clone is that same pointer,
            // and forgetting it leaves the count raised by one, for the copy to release.
            // Counting rather than writing the clone over the copy keeps the copy one block
            // of stores, which the next copy of it (moving it out of a DLPack export, say)
            // reads back without store-forwarding stalls (42 -> 39.5 ns per DLPack round
            // trip, measured).
            std::mem::forget(Arc::clone(&self.owner));
            // Likewise: `Ready`'s clone is `Copy` data or a clone of its `Arc`, the same
            // pointer as in the copy.
            std::mem::forget(self.ready.clone());
            // SAFETY: initialised by the copy, counted above, and borrowed from `dst` for `'a`.
            return unsafe { &mut *dst };
        }
        // SAFETY: valid for writes (above); a full clone, written once.
        unsafe { dst.write(self.clone()) };
        // SAFETY: initialised above, and borrowed from `dst` for `'a`.
        unsafe { &mut *dst }
    }

    /// The description and readiness, borrowed for as long as `self` is: what ordering,
    /// device views and host views need, without an owner of their own.
    #[inline]
    pub fn as_ref(&self) -> TensorRef<'_> {
        TensorRef {
            desc: &self.desc,
            ready: &self.ready,
        }
    }

    /// A typed read-only view over host memory ([`TensorRef::host_view`]).
    ///
    /// Fails unless the memory is host-accessible, `T` matches the dtype, and the data is
    /// ready ([`Ready::Now`]; synchronise through the adapter that made the tensor first).
    pub fn host_view<T: Element>(&self) -> Result<HostView<'_, T>, Error> {
        self.as_ref().host_view()
    }

    /// A typed writable view over host memory.
    ///
    /// # Safety
    /// 1. While the view lives, nothing else reads or writes the tensor's bytes: no other
    ///    view of this tensor or of a clone, no foreign code.
    pub unsafe fn host_view_mut<T: Element>(&self) -> Result<HostViewMut<'_, T>, Error> {
        // SAFETY: forwarded obligation 1.
        unsafe { self.as_ref().host_view_mut() }
    }
}

impl Tensor {
    /// This tensor as an [`ExclusiveTensor`] when it is the only holder of its owner: no
    /// other clone of this tensor exists, nor any other clone of its owner (a DLPack export,
    /// a framework's storage, a `Weak` that could become one): `Arc::get_mut`'s test. The
    /// tensor comes back unchanged otherwise.
    ///
    /// Taking `self` by value also proves that no view borrowed from it is alive. What the
    /// answer cannot see is another owner over the same bytes; a safe adapter never makes
    /// one for memory safe Rust can still reach (see [`ExclusiveTensor`]).
    ///
    /// ```
    /// use tensorbridge_core::Tensor;
    /// let t = Tensor::from_vec(vec![1.0f32, 2.0], &[2])?;
    /// let other = t.clone();
    /// let t = t.into_exclusive().unwrap_err(); // `other` shares the owner
    /// drop(other);
    /// let mut only = t.into_exclusive().unwrap();
    /// only.host_view_mut::<f32>()?.set(&[0], 5.0)?; // safe: nobody else can look
    /// assert_eq!(only.into_tensor().host_view::<f32>()?.get(&[0])?, 5.0);
    /// # Ok::<(), tensorbridge_core::Error>(())
    /// ```
    #[allow(
        clippy::result_large_err,
        reason = "the tensor itself comes back, as large as the success; boxing it would allocate"
    )]
    pub fn into_exclusive(mut self) -> Result<ExclusiveTensor, Tensor> {
        if Arc::get_mut(&mut self.owner).is_some() {
            Ok(ExclusiveTensor(self))
        } else {
            Err(self)
        }
    }
}

/// A [`Tensor`] proven to be the only holder of its owner ([`Tensor::into_exclusive`]): what
/// lets safe code hand its memory to a writer (burn's in-place operations, a mutable host
/// view) without a shared view reading underneath.
///
/// # Soundness
/// Not `Clone`, and it never lends its owner or the inner [`Tensor`] (either could be cloned
/// into a second holder): it gives the description, the readiness, host views borrowed from
/// itself (mutable ones through `&mut self`), and the tensor back by value
/// ([`into_tensor`](Self::into_tensor)), after which it is shared like any tensor. Other
/// owners over the same bytes are ruled out by the adapters, not here: every safe import
/// that makes a writable tensor moves the memory's only Rust owner into it (a `Vec`, an
/// ndarray `Array`, a cudarc slice), lends it for a scope as a borrowed form, or is
/// `unsafe` with the promise as an obligation ([`Tensor::from_descriptor`] obligation 2);
/// memory a foreign producer also reaches (a NumPy array) is shared by that protocol, under
/// the importer's promise. Access is unchanged: an exclusive read-only tensor is still
/// never written.
pub struct ExclusiveTensor(Tensor);

impl ExclusiveTensor {
    /// The validated description.
    #[inline]
    pub fn descriptor(&self) -> &Descriptor {
        &self.0.desc
    }

    /// Where the data becomes ready.
    #[inline]
    pub fn ready(&self) -> &Ready {
        &self.0.ready
    }

    /// The tensor, shared again (clones may follow).
    #[inline]
    pub fn into_tensor(self) -> Tensor {
        self.0
    }

    /// A typed read-only view over host memory ([`TensorRef::host_view`]).
    pub fn host_view<T: Element>(&self) -> Result<HostView<'_, T>, Error> {
        self.0.as_ref().host_view()
    }

    /// A typed writable view over host memory, safe: the borrow of `self` is the only way
    /// to the bytes. Fails as [`host_view`](Self::host_view) does, and with
    /// [`Error::ReadOnly`] for a read-only tensor.
    pub fn host_view_mut<T: Element>(&mut self) -> Result<HostViewMut<'_, T>, Error> {
        // SAFETY: obligation 1 (nothing else reads or writes the bytes while the view
        // lives): the owner has no other holder (checked by `into_exclusive`, and never
        // lent since), so no other tensor, view or export of this owner exists, and the
        // view borrows `self` mutably, so no other view of `self` does either.
        unsafe { self.0.as_ref().host_view_mut() }
    }
}

impl Deref for ExclusiveTensor {
    type Target = Descriptor;

    #[inline]
    fn deref(&self) -> &Descriptor {
        &self.0.desc
    }
}

impl fmt::Debug for ExclusiveTensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ExclusiveTensor").field(&self.0).finish()
    }
}

/// A tensor borrowed for `'a`: its validated description and its readiness, with the memory
/// kept valid by whatever the borrow is of (a [`Tensor`]'s owner through [`Tensor::as_ref`],
/// or an adapter's argument pinned for one call) instead of an owner of its own.
///
/// What work that ends within `'a` needs (ordering a stream, device views for a launch, host
/// views); work that may outlive `'a` (an export, memory retired on a stream) takes a
/// [`Tensor`]. `Copy`: two references.
#[derive(Clone, Copy)]
pub struct TensorRef<'a> {
    desc: &'a Descriptor,
    ready: &'a Ready,
}

impl<'a> TensorRef<'a> {
    /// A borrowed tensor over `desc`, ready per `ready`.
    ///
    /// # Safety
    /// The caller guarantees, for `'a`:
    /// 1. \[span\] every byte of `desc.byte_span()` is valid memory on `desc.device()`,
    ///    readable, and writable too when `desc.access()` is [`Access::ReadWrite`];
    /// 2. \[no-race\] obligation 2 of [`Tensor::from_descriptor`];
    /// 3. \[ready\] obligations 1 to 3 of [`Tensor::with_ready`] for `ready`.
    #[inline]
    pub unsafe fn from_parts(desc: &'a Descriptor, ready: &'a Ready) -> TensorRef<'a> {
        TensorRef { desc, ready }
    }

    /// The validated description.
    #[inline]
    pub fn descriptor(&self) -> &'a Descriptor {
        self.desc
    }

    /// Where the data becomes ready.
    #[inline]
    pub fn ready(&self) -> &'a Ready {
        self.ready
    }

    /// A typed read-only view over host memory, for `'a`.
    ///
    /// Fails unless the memory is host-accessible, `T` matches the dtype, and the data is
    /// ready ([`Ready::Now`]).
    pub fn host_view<T: Element>(&self) -> Result<HostView<'a, T>, Error> {
        self.check_host::<T>()?;
        // SAFETY: `check_host` established host accessibility, dtype agreement (so `T`'s
        // size and alignment match the validated layout) and readiness; the borrow keeps the
        // span valid for reads for `'a` (`from_parts` obligations 1 and 2, or the owner of
        // the tensor this was borrowed from).
        Ok(unsafe { HostView::new(self.desc) })
    }

    /// The elements of a C-contiguous host tensor as a slice, for `'a`: what summing or
    /// copying them wants (an iterator over a strided view computes each element's offset).
    /// Fails as [`host_view`](Self::host_view) does, and when the
    /// layout is not C-contiguous ([`Error::NotRowMajor`]).
    pub fn as_slice<T: Element>(&self) -> Result<&'a [T], Error> {
        self.check_host::<T>()?;
        self.desc.layout().check(crate::Constraint::RowMajor)?;
        let len = usize::try_from(self.desc.numel()).map_err(|_| Error::Overflow {
            what: "number of elements",
        })?;
        if len == 0 {
            return Ok(&[]);
        }
        // SAFETY: host-accessible, ready, of dtype `T` (checked), C-contiguous (checked), so
        // the `len` elements from `data_ptr()` are the span, valid and unwritten by others for
        // `'a` (as in `host_view`); `data_ptr()` is non-null (validation refuses null data
        // with elements) and aligned for `T` (validated alignment, `Element` obligation 2).
        Ok(unsafe { std::slice::from_raw_parts(self.desc.data_ptr() as *const T, len) })
    }

    /// A typed writable view over host memory, for `'a`.
    ///
    /// # Safety
    /// 1. While the view lives, nothing else reads or writes the tensor's bytes: no other
    ///    view of this tensor or of a clone, no foreign code.
    pub unsafe fn host_view_mut<T: Element>(&self) -> Result<HostViewMut<'a, T>, Error> {
        if self.desc.is_readonly() {
            return Err(Error::ReadOnly);
        }
        self.check_host::<T>()?;
        // SAFETY: as in `host_view`, plus write access (checked just above: whoever vouched
        // for the memory vouched for writes) and exclusivity (caller obligation 1).
        Ok(unsafe { HostViewMut::new(self.desc) })
    }

    fn check_host<T: Element>(&self) -> Result<(), Error> {
        if !self.desc.device().kind.is_host_accessible() {
            return Err(Error::NotHostAccessible {
                device: self.desc.device(),
            });
        }
        if T::DTYPE != self.desc.dtype() {
            return Err(Error::DTypeMismatch {
                expected: T::DTYPE,
                found: self.desc.dtype(),
            });
        }
        if !self.ready.is_now() {
            return Err(Error::NotReady);
        }
        Ok(())
    }
}

impl<'a> From<&'a Tensor> for TensorRef<'a> {
    /// [`Tensor::as_ref`]: so that functions taking `impl Into<TensorRef<'a>>` accept both.
    #[inline]
    fn from(tensor: &'a Tensor) -> TensorRef<'a> {
        tensor.as_ref()
    }
}

impl Deref for TensorRef<'_> {
    type Target = Descriptor;

    #[inline]
    fn deref(&self) -> &Descriptor {
        self.desc
    }
}

impl fmt::Debug for TensorRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TensorRef")
            .field("desc", self.desc)
            .field("ready", self.ready)
            .finish()
    }
}

impl Deref for Tensor {
    type Target = Descriptor;

    #[inline]
    fn deref(&self) -> &Descriptor {
        &self.desc
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tensor")
            .field("desc", &self.desc)
            .field("ready", &self.ready)
            .finish_non_exhaustive()
    }
}

/// Owns a boxed slice through a raw pointer, so no reference to its elements exists while
/// host views read and write them.
struct BoxOwner<T> {
    ptr: *mut T,
    len: usize,
}

impl<T> BoxOwner<T> {
    fn new(data: Box<[T]>) -> Self {
        let len = data.len();
        let ptr = Box::into_raw(data).cast::<T>();
        BoxOwner { ptr, len }
    }
}

impl<T> Drop for BoxOwner<T> {
    fn drop(&mut self) {
        let slice = std::ptr::slice_from_raw_parts_mut(self.ptr, self.len);
        // SAFETY: `ptr`/`len` came from `Box::into_raw` in `BoxOwner::new` and this is the only
        // place that turns them back, once, when the owner itself is dropped.
        drop(unsafe { Box::from_raw(slice) });
    }
}

// SAFETY: `BoxOwner<T>` is a `Box<[T]>` behind a raw pointer; it is sent and shared exactly
// like one. `T: Element` types are plain `Copy` data with no thread affinity.
unsafe impl<T: Send> Send for BoxOwner<T> {}
// SAFETY: shared access never hands out `&T` (only the tensor's raw pointer reads it), so
// sharing needs no more than `Box<[T]>: Sync`.
unsafe impl<T: Sync> Sync for BoxOwner<T> {}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(shape: &[i64]) -> RawTensor<'_> {
        RawTensor::host(0x1000, DType::FLOAT32, shape)
    }

    #[test]
    fn null_data_only_when_empty() {
        let r = RawTensor {
            data: 0,
            ..raw(&[0, 3])
        };
        assert!(r.validate().is_ok());
        let r = RawTensor {
            data: 0,
            ..raw(&[2, 3])
        };
        assert_eq!(r.validate(), Err(Error::NullData { numel: 6 }));
    }

    #[test]
    fn alignment_of_first_element() {
        let r = RawTensor {
            byte_offset: 2,
            ..raw(&[4])
        };
        assert_eq!(
            r.validate(),
            Err(Error::Misaligned {
                addr: 0x1002,
                align: 4
            })
        );
        let r = RawTensor {
            byte_offset: 4,
            ..raw(&[4])
        };
        assert_eq!(r.validate().unwrap().data_ptr(), 0x1004);
        // OpenCL pointers are handles: no alignment, no folding.
        let r = RawTensor {
            device_type: 4,
            byte_offset: 2,
            ..raw(&[4])
        };
        let d = r.validate().unwrap();
        assert_eq!(d.data_ptr(), 0x1000);
        assert_eq!(d.with_offset_folded().byte_offset(), 2);
    }

    #[test]
    fn span_must_fit_in_the_address_space() {
        let strides = [-1i64];
        let r = RawTensor {
            strides: Some(&strides),
            ..raw(&[0x2000])
        };
        assert!(matches!(r.validate(), Err(Error::OutOfAddressSpace { .. })));
        let r = RawTensor {
            data: usize::MAX - 7,
            ..raw(&[4])
        };
        assert!(matches!(
            r.validate(),
            Err(Error::OutOfAddressSpace { .. } | Error::Misaligned { .. })
        ));
        let r = RawTensor {
            data: usize::MAX - 15,
            ..raw(&[4])
        };
        assert!(matches!(r.validate(), Err(Error::OutOfAddressSpace { .. })));
    }

    #[test]
    fn span_nbytes_and_byte_strides() {
        let strides = [-4i64, 1];
        let r = RawTensor {
            strides: Some(&strides),
            byte_offset: 32,
            ..raw(&[3, 4])
        };
        let d = r.validate().unwrap();
        assert_eq!(d.byte_span(), 0x1000..0x1000 + 48);
        assert_eq!(d.nbytes(), 48);
        assert_eq!(d.strides_bytes().unwrap(), vec![-16, 4]);
        let folded = d.with_offset_folded();
        assert_eq!((folded.data(), folded.byte_offset()), (0x1020, 0));
        assert_eq!(folded.byte_span(), d.byte_span());
    }

    #[test]
    fn packed_subbyte_spans_count_bits() {
        let shape = [5i64];
        let r = RawTensor {
            dtype_code: 17,
            dtype_bits: 4,
            ..raw(&shape)
        };
        let d = r.validate().unwrap();
        assert_eq!(d.nbytes(), 3);
        assert_eq!(d.byte_span().len(), 3);
        assert!(matches!(
            d.strides_bytes(),
            Err(Error::SubByteStride { dim: 0, .. })
        ));
        let padded = RawTensor {
            packing: Packing::Padded,
            ..r
        }
        .validate()
        .unwrap();
        assert_eq!(padded.nbytes(), 5);
        assert_eq!(padded.strides_bytes().unwrap(), vec![1]);
    }

    #[test]
    fn from_vec_checks_the_count() {
        assert_eq!(
            Tensor::from_vec(vec![1.0f32; 5], &[2, 3]).unwrap_err(),
            Error::ElementCount { numel: 6, len: 5 }
        );
        let t = Tensor::from_vec(vec![1u8, 2, 3], &[3]).unwrap();
        assert_eq!(t.numel(), 3);
        assert_eq!(t.dtype(), DType::UINT8);
    }
}
