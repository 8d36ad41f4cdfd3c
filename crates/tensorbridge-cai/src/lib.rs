//! The CUDA Array Interface v3 (`__cuda_array_interface__`) and NumPy's array interface v3
//! (`__array_interface__`) as plain Rust values, converted to and from the core [`Tensor`]
//! without copying. No Python here: a pyo3 layer fills a [`CudaArrayInterface`] or an
//! [`ArrayInterface`] from the dict, calls [`validate`](CudaArrayInterface::import), and
//! turns exported values back into a dict. The typestr grammar they share is [`TypeStr`].
//!
//! | direction | call | data | stream |
//! |---|---|---|---|
//! | CAI -> [`Tensor`] | [`CudaArrayInterface::import`], then `unsafe` [`Imported::into_tensor`] | zero-copy | `stream` becomes [`Ready::Stream`](tensorbridge_core::Ready::Stream); `None` [`Ready::Now`](tensorbridge_core::Ready::Now); 0 and negatives refused |
//! | array interface -> [`Tensor`] | [`ArrayInterface::import`], then `unsafe` [`Imported::into_tensor`] | zero-copy | none: [`Ready::Now`](tensorbridge_core::Ready::Now) |
//! | [`Tensor`] -> CAI | [`CudaArrayInterface::export`] | zero-copy | the producer stream (`None` when there is no pending work) |
//! | [`Tensor`] -> array interface | [`ArrayInterface::export`] | zero-copy | none: tensors with pending work are refused |
//!
//! Both directions follow the interfaces' rules (docs/PROTOCOLS.md, "CUDA Array
//! Interface") and validate
//! through the core: strides count **bytes** here and elements in the core; absent strides
//! mean C order; data 0 only for zero-size arrays; the stream integers map through
//! [`tensorbridge_core::stream_from_wire`] / [`tensorbridge_core::stream_to_wire`].
//!
//! ```
//! use tensorbridge_core::{DType, Tensor};
//! use tensorbridge_cai::{ArrayInterface, ImportOptions, TypeStr};
//!
//! let t = Tensor::from_vec((0..6).map(|i| i as f32).collect(), &[2, 3])?;
//! let ai = ArrayInterface::export(&t)?; // {'typestr': '<f4', 'strides': (12, 4), ...}
//! assert_eq!(ai.typestr, TypeStr::from_dtype(DType::FLOAT32)?);
//! assert_eq!(ai.strides, Some(vec![12, 4]));
//!
//! let imported = ai.import(&ImportOptions::new())?;
//! // SAFETY: `t`'s owner keeps the vector alive for as long as the new tensor's clone of it
//! // lives, and nothing writes to it.
//! let back = unsafe { imported.into_tensor(t.owner().clone()) };
//! assert_eq!(back.data_ptr(), t.data_ptr());
//! assert_eq!(back.host_view::<f32>()?.get(&[1, 2])?, 5.0);
//!
//! // Raw bytes say nothing about their meaning: the caller names the dtype.
//! let bf16 = "<V2".parse::<TypeStr>()?;
//! assert_eq!(bf16.to_dtype(&ImportOptions::new().void_as(DType::BFLOAT16))?, DType::BFLOAT16);
//! assert!(bf16.to_dtype(&ImportOptions::new()).is_err());
//! # Ok::<(), tensorbridge_cai::Error>(())
//! ```
//!
//! # dtypes and typestrs
//! Export uses the first typestr of a row (`<` stands for this machine's order, `>` on
//! big-endian targets); import accepts the typestrs of the last column.
//!
//! | core dtype | export | import | sources |
//! |---|---|---|---|
//! | `bool` | `\|b1` | `b1` in any byte order | NumPy |
//! | `int8`, `uint8` | `\|i1`, `\|u1` | `i1`, `u1` in any byte order | NumPy, PyTorch |
//! | `int16`..`int64`, `uint16`..`uint64` | `<i2` `<i4` `<i8`, `<u2` `<u4` `<u8` | native order (`<`, `=`, `\|`) | NumPy, PyTorch |
//! | `float16`, `float32`, `float64` | `<f2`, `<f4`, `<f8` | native order | NumPy, PyTorch |
//! | `complex64`, `complex128` | `<c8`, `<c16` | native order | NumPy, PyTorch |
//! | `bfloat16` | `<V2`, `descr` `[('', '<V2')]` | `<V2` or `\|V2` with `void_as(BFLOAT16)` | ml_dtypes, CuPy, PyTorch |
//! | `opaque8`..`opaque128` | `\|V1`..`\|V16` | `Vn` with `void_as(opaque)` | NumPy's plain void |
//! | `float8_*`, `float6_*`, `float4_e2m1fn` | refused ([`Error::NoTypeStr`]) | `<V1`/`\|V1` with `void_as` | ml_dtypes; CuPy and PyTorch refuse |
//! | `complex32`, vector types (`float32x4`) | refused ([`Error::NoTypeStr`]) | none | NumPy, PyTorch |
//! | none | | `<f16` `<c32` (long double), `<f1`, `t`, `m`, `M`, `O`, `S`, `U` refused ([`Error::UnsupportedTypeStr`]) | NumPy, ml_dtypes |
//!
//! Big-endian typestrs (`>f4`) are refused on this little-endian machine
//! ([`Error::NonNativeByteOrder`]) unless the scalars are single bytes, whose order does not
//! matter (NumPy itself prints `>i1` as `|i1`).
//!
//! Sources, and how they were checked:
//! - **NumPy**: the typestrs NumPy 2.4.6 prints (`np.dtype(name).str`), embedded with the
//!   script that generated them in this crate's `tests/it/numpy_typestrs.rs` and checked by
//!   the test `numpy_typestrs_match_reference`. NumPy has no `c4`, and `f16` is the
//!   platform's `long double` (80-bit x87 padded to 16 bytes on x86-64), not binary128.
//! - **ml_dtypes** 0.6.0 (same script): `bfloat16` is `<V2` with descr `[('', '<V2')]`; every
//!   fp8 type is `<V1` except `float8_e5m2`, which is `<f1` (kind `f`); `float4_e2m1fn`,
//!   `float6_e2m3fn` and `float6_e3m2fn` are `<V1` (one byte per element, padded).
//! - **CuPy** 14.2 with ml_dtypes, measured on the GPU machine: exports bfloat16 as typestr
//!   `<V2` with descr `[('', '<V2')]`; refuses to export `float8_e4m3fn`.
//! - **PyTorch** 2.11, measured on the GPU machine and in `torch/_tensor.py`
//!   (`_dtype_to_typestr`): bfloat16 is `<V2` ("same as ml_dtypes.bfloat16.dtype.str"); no
//!   entry for complex32 or any fp8 type; its CAI is version 2 without `stream`.
//! - **Numba** exports `self.dtype.str`, NumPy's typestr, so an ml_dtypes dtype travels
//!   as above.
//!
//! So `<V2` is the one convention for bfloat16, and it does not say "bfloat16": on import
//! the caller states it ([`ImportOptions::void_as`](field@ImportOptions::void_as)); nothing
//! is guessed. The fp8 family has no convention (ml_dtypes' `V1`/`f1` are not accepted by
//! CuPy or PyTorch), so export refuses it and import needs `void_as`.
//!
//! # Ownership
//! Neither interface has an owner slot: whoever reads the dict must keep the exporting
//! object alive. Import therefore takes the owner from the caller, in the `unsafe`
//! [`Imported::into_tensor`], whose contract is the core's: the memory stays valid until
//! every clone of the owner is dropped. Validation is safe and separate, so a refused
//! import never touches (or drops) the owner. Export borrows the tensor: the caller keeps
//! the tensor (or its owner) alive as long as the dict's pointer is used, typically by
//! storing it in the Python object that exposes the dict.
//!
//! # Limitations
//! - Byte strides must be multiples of the item size on every dimension, also those of
//!   size 1 (NumPy allows other strides there); such arrays are refused.
//! - `mask` and structured `descr`s are refused; `descr` may only repeat the typestr.
//! - The CAI carries no device: the caller names it (CUDA, managed or pinned host memory).
//!   The array interface always imports as [`Device::CPU`](tensorbridge_core::Device::CPU).
//! - The array interface's buffer form needs the Python layer to resolve the buffer
//!   ([`ArrayData::Buffer`]); versions above 3 are refused although NumPy ignores `version`.
//! - The CAI cannot carry an event: tensors ready per a signal without a producer stream are
//!   refused on export.
//!
//! [`Tensor`]: tensorbridge_core::Tensor

// clippy reads the `// SAFETY:` comment in the crate docs' example as belonging to the first
// item (rust-clippy's comment scan does not stop at `//!` lines).
#[allow(clippy::unnecessary_safety_comment)]
mod error;
mod export;
mod import;
mod model;
mod typestr;

pub use error::Error;
pub use export::EXPORT_VERSION;
pub use import::{ImportOptions, Imported};
pub use model::{
    ArrayData, ArrayInterface, BufferRegion, CudaArrayInterface, DataPointer, DescrField,
    DescrFormat, Interface,
};
pub use typestr::{ByteOrder, DateTimeUnit, TimeUnit, TypeKind, TypeStr, TypeStrProblem};

// Thread safety of the public types, checked at compile time: every one is plain data
// (integers, strings, vectors; addresses are `usize`, never dereferenced here), except
// `Imported`, which holds a core `Descriptor` and a `StreamRequest`, plain data too.
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<CudaArrayInterface>();
    assert_send_sync::<ArrayInterface>();
    assert_send_sync::<ArrayData>();
    assert_send_sync::<BufferRegion>();
    assert_send_sync::<DataPointer>();
    assert_send_sync::<DescrField>();
    assert_send_sync::<DescrFormat>();
    assert_send_sync::<Interface>();
    assert_send_sync::<TypeStr>();
    assert_send_sync::<TypeKind>();
    assert_send_sync::<ByteOrder>();
    assert_send_sync::<DateTimeUnit>();
    assert_send_sync::<TimeUnit>();
    assert_send_sync::<TypeStrProblem>();
    assert_send_sync::<ImportOptions>();
    assert_send_sync::<Imported>();
    assert_send_sync::<Error>();
};
