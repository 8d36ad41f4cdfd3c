//! Shared test helpers for tensorbridge: proptest strategies for valid and deliberately
//! invalid raw descriptors, drop-counting owners, a do-nothing ready signal, and host buffers
//! that back strided tensors with real memory (fake producers).
//!
//! Every adapter crate's tests draw from these, so a property proved for the core is checked
//! on the same inputs through each adapter.

#[cfg(feature = "cuda")]
pub mod gpu;
pub mod layers;

use std::any::Any;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use proptest::collection::vec;
use proptest::prelude::*;
use tensorbridge_core::{
    Access, DType, DTypeCode, Descriptor, DeviceType, Element, Layout, Owner, Packing, RawTensor,
    ReadySignal, SignalError, Stream, Tensor,
};

/// A ready signal that waits for nothing, as a CUDA-aware adapter's recorded event would on
/// an idle device: it names (or not) a producer stream and may hold an owner, so that a
/// [`DropCounter`] sees when the signal itself is dropped.
#[derive(Debug, Default)]
pub struct FakeSignal {
    /// What [`ReadySignal::producer_stream`] answers.
    pub stream: Option<Stream>,
    /// Held, never used: dropped with the signal.
    pub keep: Option<Owner>,
}

impl FakeSignal {
    /// A signal naming `stream` (or no stream).
    pub fn naming(stream: Option<Stream>) -> FakeSignal {
        FakeSignal { stream, keep: None }
    }

    /// A signal that names no stream and holds `owner` until it is dropped.
    pub fn holding(owner: Owner) -> FakeSignal {
        FakeSignal {
            stream: None,
            keep: Some(owner),
        }
    }
}

impl ReadySignal for FakeSignal {
    unsafe fn enqueue_wait(&self, _consumer: Stream) -> Result<(), SignalError> {
        Ok(())
    }

    fn synchronize(&self) -> Result<(), SignalError> {
        Ok(())
    }

    fn producer_stream(&self) -> Option<Stream> {
        self.stream
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Counts how many owners made by [`DropCounter::owner`] have been dropped.
#[derive(Clone, Debug, Default)]
pub struct DropCounter(Arc<AtomicUsize>);

impl DropCounter {
    /// A counter at zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many counted owners have been dropped so far.
    pub fn drops(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }

    /// An owner that increments this counter exactly when it is dropped.
    pub fn owner(&self) -> Owner {
        Arc::new(CountedOwner(self.0.clone()))
    }

    /// The same, wrapping a payload that is dropped at the same time (for example the buffer
    /// a tensor points into).
    pub fn owner_with<P: Send + Sync + 'static>(&self, payload: P) -> Owner {
        Arc::new((CountedOwner(self.0.clone()), payload))
    }
}

struct CountedOwner(Arc<AtomicUsize>);

impl Drop for CountedOwner {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// Every dtype the core accepts, with 1 to 4 lanes (mostly 1).
pub fn dtype() -> impl Strategy<Value = DType> {
    let codes: Vec<DTypeCode> = (0u8..=17)
        .map(|c| DTypeCode::from_code(c).expect("codes 0..=17 exist"))
        .collect();
    (
        proptest::sample::select(codes),
        any::<proptest::sample::Index>(),
        prop_oneof![4 => Just(1u16), 1 => 2u16..=4],
    )
        .prop_map(|(code, bits_ix, lanes)| {
            let bits = *bits_ix.get(code.allowed_bits());
            DType::new(code, bits, lanes).expect("allowed bits, lanes >= 1")
        })
}

/// Dtypes of whole bytes per element (everything but packed fp6/fp4).
pub fn byte_dtype() -> impl Strategy<Value = DType> {
    dtype().prop_filter("whole bytes", |d| !d.is_subbyte())
}

/// A small layout (rank 0 to `max_rank`, extents 0 to 4, strides -6 to 6 including 0) so
/// that brute-force enumeration of element offsets stays cheap.
pub fn small_layout(max_rank: usize) -> impl Strategy<Value = (Vec<i64>, Vec<i64>)> {
    (0..=max_rank).prop_flat_map(|rank| (vec(0i64..=4, rank), vec(-6i64..=6, rank)))
}

/// An owned raw descriptor; [`RawParts::as_raw`] borrows it as a [`RawTensor`].
#[derive(Clone, Debug)]
pub struct RawParts {
    /// Data pointer or handle.
    pub data: usize,
    /// DLPack device type code.
    pub device_type: i32,
    /// DLPack device id.
    pub device_id: i32,
    /// DLPack dtype code.
    pub dtype_code: u8,
    /// Bits per lane.
    pub dtype_bits: u8,
    /// Lanes.
    pub dtype_lanes: u16,
    /// Extents.
    pub shape: Vec<i64>,
    /// Strides in elements, `None` for row-major.
    pub strides: Option<Vec<i64>>,
    /// Byte offset.
    pub byte_offset: u64,
    /// Read-only or not.
    pub readonly: bool,
    /// Sub-byte packing flag.
    pub padded: bool,
}

impl RawParts {
    /// Borrow as the core's untrusted descriptor.
    pub fn as_raw(&self) -> RawTensor<'_> {
        RawTensor {
            data: self.data,
            device_type: self.device_type,
            device_id: self.device_id,
            dtype_code: self.dtype_code,
            dtype_bits: self.dtype_bits,
            dtype_lanes: self.dtype_lanes,
            shape: &self.shape,
            strides: self.strides.as_deref(),
            byte_offset: self.byte_offset,
            access: if self.readonly {
                Access::ReadOnly
            } else {
                Access::ReadWrite
            },
            packing: if self.padded {
                Packing::Padded
            } else {
                Packing::Packed
            },
        }
    }
}

/// Device type codes that exist (1 to 4, 7 to 18).
pub fn device_code() -> impl Strategy<Value = i32> {
    prop_oneof![3 => Just(1), 2 => Just(2), 1 => 3i32..=4, 1 => 7i32..=18]
}

/// Valid raw descriptors: every dtype and device, ranks 0 to 8, negative and zero strides,
/// `None` strides, byte offsets, zero-size tensors with null data. `validate` must accept
/// every one.
pub fn valid_raw() -> impl Strategy<Value = RawParts> {
    (
        dtype(),
        device_code(),
        0i32..4,
        (0usize..=8).prop_flat_map(|rank| (vec(0i64..=5, rank), vec(-7i64..=7, rank))),
        any::<bool>(),
        0u64..4,
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(
            |(
                dt,
                device_type,
                device_id,
                (shape, strides),
                row_major,
                offset_elems,
                ro,
                padded,
                null,
            )| {
                let padding = if padded {
                    Packing::Padded
                } else {
                    Packing::Packed
                };
                let elem_bytes = dt.storage_bits(padding).div_ceil(8);
                let align = dt.alignment() as u64;
                let empty = shape.contains(&0);
                // A base far from both ends of the address space, aligned for every dtype,
                // leaving room for negative reach (at most 8 * 4 * 7 elements of <= 2^20 bytes).
                let data = if empty && null { 0 } else { 1usize << 44 };
                // On handle devices (OpenCL...) the offset is inside the handle's buffer, so
                // negative reach must be covered by the byte offset.
                let handle = !DeviceType::from_code(device_type)
                    .expect("device_code() yields known codes")
                    .has_addresses();
                let below = if handle && !empty {
                    let reach: i64 = shape
                        .iter()
                        .zip(&strides)
                        .map(|(&n, &s)| ((n - 1) * s).min(0))
                        .sum();
                    (-reach) as u64 * elem_bytes
                } else {
                    0
                };
                let below = if row_major { 0 } else { below };
                RawParts {
                    data,
                    device_type,
                    device_id,
                    dtype_code: dt.code().code(),
                    dtype_bits: dt.bits(),
                    dtype_lanes: dt.lanes(),
                    shape,
                    strides: if row_major { None } else { Some(strides) },
                    byte_offset: below + offset_elems * elem_bytes.max(1) / align * align,
                    readonly: ro,
                    padded,
                }
            },
        )
}

/// Descriptors that are deliberately wrong in one way or many: unknown codes, bad bits,
/// zero lanes, rank disagreement, negative and huge extents and strides, null or misaligned
/// data, spans past the end of the address space. Some may happen to be valid; properties
/// check that validation never panics and that accepted ones are consistent.
pub fn invalid_raw() -> impl Strategy<Value = RawParts> {
    let huge = prop_oneof![
        Just(i64::MAX),
        Just(i64::MIN),
        Just(i64::MAX / 2),
        Just(1i64 << 32),
        Just(1i64 << 55),
        Just(-(1i64 << 55)),
        -3i64..3,
    ];
    (
        any::<usize>(),
        any::<i32>(),
        any::<i32>(),
        (any::<u8>(), any::<u8>(), any::<u16>()),
        vec(prop_oneof![huge.clone(), -2i64..8], 0..=9),
        proptest::option::of(vec(prop_oneof![huge, -8i64..8], 0..=9)),
        any::<u64>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(
            |(
                data,
                device_type,
                device_id,
                (code, bits, lanes),
                shape,
                strides,
                byte_offset,
                ro,
                padded,
            )| {
                RawParts {
                    data,
                    device_type,
                    device_id,
                    dtype_code: code,
                    dtype_bits: bits,
                    dtype_lanes: lanes,
                    shape,
                    strides,
                    byte_offset,
                    readonly: ro,
                    padded,
                }
            },
        )
}

/// Mostly-invalid and valid descriptors mixed, the input for "never panics" properties.
pub fn any_raw() -> impl Strategy<Value = RawParts> {
    prop_oneof![valid_raw(), invalid_raw()]
}

/// A host buffer that backs a strided layout with real memory: the span the strides reach
/// is allocated, filled with distinct values, and element 0 placed so that the lowest
/// reached element is the buffer's first.
#[derive(Debug)]
pub struct HostBuffer<T> {
    // A Vec, not a Box: moving a Box into the owner would assert uniqueness under Miri's
    // aliasing model and invalidate the tensor's pointer into it.
    buf: Vec<T>,
    first: usize,
    shape: Vec<i64>,
    strides: Vec<i64>,
}

impl<T: Element> HostBuffer<T> {
    /// Allocates the span of `shape`/`strides` and fills it with `fill(i)` for buffer slot `i`.
    pub fn new(shape: &[i64], strides: &[i64], fill: impl Fn(usize) -> T) -> Self {
        let layout = Layout::new(shape, Some(strides), 0).expect("valid small layout");
        let (lo, hi) = layout.elem_reach();
        let len = if layout.is_empty() {
            0
        } else {
            (hi - lo + 1) as usize
        };
        let buf: Vec<T> = (0..len).map(fill).collect();
        HostBuffer {
            buf,
            first: (-lo) as usize,
            shape: shape.to_vec(),
            strides: strides.to_vec(),
        }
    }

    /// The value stored at a logical index, computed independently of the core (the oracle).
    pub fn expected(&self, index: &[i64]) -> T {
        let off: i64 = index.iter().zip(&self.strides).map(|(i, s)| i * s).sum();
        self.buf[(self.first as i64 + off) as usize]
    }

    /// Every element in row-major order of the logical index, by brute force.
    pub fn expected_contiguous(&self) -> Vec<T> {
        all_indices(&self.shape)
            .iter()
            .map(|ix| self.expected(ix))
            .collect()
    }

    /// A read-only tensor over the buffer, which its owner (counted by `counter`) keeps alive.
    pub fn into_tensor(self, counter: &DropCounter) -> Tensor {
        let data = if self.buf.is_empty() {
            0
        } else {
            self.buf.as_ptr() as usize + self.first * std::mem::size_of::<T>()
        };
        let raw = RawTensor {
            strides: Some(&self.strides),
            access: Access::ReadOnly,
            ..RawTensor::host(data, T::DTYPE, &self.shape)
        };
        let desc: Descriptor = raw.validate().expect("a buffer-backed layout is valid");
        // SAFETY: the span the strides reach is exactly the buffer (element 0 at slot
        // `first`, the lowest element at slot 0), which the owner keeps alive and which nobody
        // writes: the tensor is read-only and the buffer is moved into the owner.
        unsafe { Tensor::from_descriptor(desc, counter.owner_with(self)) }
    }
}

/// Every index of `shape` in row-major order (empty for empty tensors, one empty index for
/// rank 0).
pub fn all_indices(shape: &[i64]) -> Vec<Vec<i64>> {
    let mut out = vec![vec![]];
    for &n in shape {
        out = out
            .into_iter()
            .flat_map(|prefix| {
                (0..n).map(move |i| {
                    let mut ix = prefix.clone();
                    ix.push(i);
                    ix
                })
            })
            .collect();
    }
    out
}

/// Element offsets (in elements, relative to element 0) of every index, in row-major order.
pub fn brute_offsets(shape: &[i64], strides: &[i64]) -> Vec<i64> {
    all_indices(shape)
        .iter()
        .map(|ix| ix.iter().zip(strides).map(|(i, s)| i * s).sum())
        .collect()
}
