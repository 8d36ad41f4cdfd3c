//! The fuzz targets' bodies: each takes arbitrary bytes, decodes them into an untrusted
//! descriptor (a raw tensor, a typestr and CAI / array-interface dict, a DLPack managed
//! tensor) and runs it through the trust boundary. Nothing may panic, and what is accepted
//! must satisfy the checks below.
//!
//! The libFuzzer binaries in `fuzz/` (`cargo xtask fuzz`) call these functions; so does the
//! regression test `fuzz_regressions`, which replays the committed corpus and every crash
//! reproducer on stable Rust in `cargo xtask ci`. Addresses are arbitrary numbers: the
//! validation never dereferences them, and nothing here reads or writes tensor memory.

use std::ffi::c_void;
use std::ptr::{self, NonNull};
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tensorbridge_cai::{
    ArrayData, ArrayInterface, BufferRegion, CudaArrayInterface, DataPointer, DescrField,
    DescrFormat, ImportOptions, TypeStr,
};
use tensorbridge_core::{Access, Descriptor, Device, DeviceType, Packing, RawTensor, Tensor};
use tensorbridge_dlpack::dlpark::ManagedTensorBase;
use tensorbridge_dlpack::ffi::{
    DLDataType, DLDataTypeCode, DLDevice, DLDeviceType, DLManagedTensor, DLManagedTensorVersioned,
    DLPackVersion, DLTensor, DlpackFlags,
};
use tensorbridge_dlpack::{
    ImportError, Imported, export_versioned, import_legacy, import_versioned,
};

/// Reads fuzz bytes as a stream of values; past the end every read is 0.
struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        let n = N.min(self.0.len());
        out[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        out
    }
    fn u8(&mut self) -> u8 {
        self.take::<1>()[0]
    }
    fn bool(&mut self) -> bool {
        self.u8() & 1 == 1
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.take())
    }
    fn i32(&mut self) -> i32 {
        i32::from_le_bytes(self.take())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take())
    }
    fn i64(&mut self) -> i64 {
        i64::from_le_bytes(self.take())
    }
    /// Mostly small values (where the interesting layouts are), sometimes any `i64`.
    fn dim(&mut self) -> i64 {
        match self.u8() % 8 {
            0 => self.i64(),
            1 => 1i64 << (self.u8() % 64),
            _ => i64::from(self.u8() as i8),
        }
    }
    /// Mostly aligned plausible addresses, sometimes 0 or any value.
    fn address(&mut self) -> usize {
        match self.u8() % 4 {
            0 => 0,
            1 => self.u64() as usize,
            _ => 0x7f00_0000_0000 + (usize::from(self.u16()) << 4),
        }
    }
    /// Mostly a known code in `0..=max`, sometimes any value.
    fn code(&mut self, max: u8) -> i32 {
        if self.u8().is_multiple_of(8) {
            self.i32()
        } else {
            i32::from(self.u8() % (max + 1))
        }
    }
    fn dims(&mut self, ndim: usize) -> Vec<i64> {
        (0..ndim).map(|_| self.dim()).collect()
    }
}

/// A descriptor validates again, unchanged, from its own parts: validation is idempotent.
fn check_revalidates(desc: &Descriptor) {
    let (device_type, device_id) = desc.device().to_dlpack().expect("validated device");
    let dtype = desc.dtype();
    let again = RawTensor {
        data: desc.data(),
        device_type,
        device_id,
        dtype_code: dtype.code().code(),
        dtype_bits: dtype.bits(),
        dtype_lanes: dtype.lanes(),
        shape: desc.shape(),
        strides: Some(desc.strides_elems()),
        byte_offset: desc.byte_offset(),
        access: desc.access(),
        packing: desc.packing(),
    }
    .validate()
    .expect("a validated descriptor validates again");
    assert_eq!(&again, desc);
    let folded = desc.with_offset_folded();
    assert_eq!(folded.data_ptr(), desc.data_ptr());
    assert_eq!(folded.byte_span(), desc.byte_span());
}

/// A tensor over fake memory: the owner is a unit, and nothing dereferences the address.
fn fake_tensor(desc: Descriptor) -> Tensor {
    // SAFETY: nothing reads or writes through this tensor (the fuzz targets only describe,
    // export and import it); the address is never dereferenced.
    unsafe { Tensor::from_descriptor(desc, Arc::new(())) }
}

/// Target `validate`: arbitrary raw tensors through the core's trust boundary.
pub fn validate(data: &[u8]) {
    let mut b = Bytes(data);
    let ndim = usize::from(b.u8() % 12);
    let shape = b.dims(ndim);
    let strides = b.bool().then(|| b.dims(ndim));
    let raw = RawTensor {
        data: b.address(),
        device_type: b.code(20),
        device_id: b.code(3),
        dtype_code: b.u8() % 24,
        dtype_bits: [1, 2, 4, 6, 8, 16, 32, 64, 128, 3, 0, 255][usize::from(b.u8() % 12)],
        dtype_lanes: if b.u8().is_multiple_of(8) { b.u16() } else { 1 },
        shape: &shape,
        strides: strides.as_deref(),
        byte_offset: if b.bool() { 0 } else { b.u64() % 4096 },
        access: if b.bool() {
            Access::ReadOnly
        } else {
            Access::ReadWrite
        },
        packing: if b.bool() {
            Packing::Packed
        } else {
            Packing::Padded
        },
    };
    let Ok(desc) = raw.validate() else { return };
    assert_eq!(desc.shape(), &shape[..]);
    if let Some(strides) = &strides {
        assert_eq!(desc.strides_elems(), &strides[..]);
    }
    // An empty dimension makes the tensor empty whatever the others are (whose product
    // alone may overflow: found by this target, in its oracle).
    let numel = if shape.contains(&0) {
        Some(0)
    } else {
        shape.iter().try_fold(1u64, |n, &d| n.checked_mul(d as u64))
    };
    assert_eq!(Some(desc.numel()), numel);
    check_revalidates(&desc);
}

/// The typestrs the dict models draw from, plus whatever the bytes spell.
const TYPESTRS: &[&str] = &[
    "<f4", "<f8", "<f2", "|b1", "|u1", "|i1", "<i2", "<i4", "<i8", "<u8", "<c8", "<c16", ">f4",
    "|V2", "|V1", "<M8[ns]", "|O", "<U4",
];

fn typestr(b: &mut Bytes<'_>) -> Option<TypeStr> {
    if b.u8().is_multiple_of(4) {
        let len = usize::from(b.u8() % 9);
        let spelled: String = (0..len).map(|_| char::from(b.u8() % 128)).collect();
        TypeStr::from_str(&spelled).ok()
    } else {
        TypeStr::from_str(TYPESTRS[usize::from(b.u8()) % TYPESTRS.len()]).ok()
    }
}

/// Target `cai`: typestr parsing, then CAI and array-interface dicts through validation;
/// what is accepted exports back to an equal interface.
pub fn cai(data: &[u8]) {
    let mut b = Bytes(data);
    // The grammar: a parsed typestr prints as a string that parses to it again.
    let len = usize::from(b.u8() % 12);
    let spelled: String = (0..len).map(|_| char::from(b.u8())).collect();
    if let Ok(t) = TypeStr::from_str(&spelled) {
        let printed = t.to_string();
        assert_eq!(
            TypeStr::from_str(&printed).ok(),
            Some(t),
            "{spelled:?} -> {printed}"
        );
    }

    let Some(typestr) = typestr(&mut b) else {
        return;
    };
    let ndim = usize::from(b.u8() % 9);
    let shape = b.dims(ndim);
    let strides = b.bool().then(|| b.dims(ndim));
    let options = ImportOptions::default();
    if b.bool() {
        let cai = CudaArrayInterface {
            shape,
            typestr,
            data: DataPointer {
                address: b.address(),
                readonly: b.bool(),
            },
            strides,
            descr: None,
            mask: b.u8().is_multiple_of(16),
            version: i64::from(b.u8() % 5),
            stream: match b.u8() % 4 {
                0 => None,
                1 => Some(b.i64()),
                _ => Some(i64::from(b.u8() as i8)),
            },
        };
        let device = Device::new(DeviceType::Cuda, u32::from(b.u8() % 4));
        let Ok(validated) = cai.import(device, &options) else {
            return;
        };
        check_revalidates(validated.descriptor());
        let (desc, _stream) = validated.into_parts();
        let exported = CudaArrayInterface::export_descriptor(&desc, &tensorbridge_core::Ready::Now)
            .expect("a validated CAI exports");
        let again = exported
            .import(device, &options)
            .expect("our export validates");
        assert_same_interface(again.descriptor(), &desc);
    } else {
        let data = if b.bool() {
            ArrayData::Pointer(DataPointer {
                address: b.address(),
                readonly: b.bool(),
            })
        } else {
            ArrayData::Buffer(BufferRegion {
                address: b.address(),
                len: usize::from(b.u16()),
                readonly: b.bool(),
            })
        };
        let ai = ArrayInterface {
            shape,
            typestr,
            data,
            strides,
            descr: None,
            mask: b.u8().is_multiple_of(16),
            offset: i64::from(b.u8() as i8),
            version: i64::from(b.u8() % 5),
        };
        let Ok(validated) = ai.import(&options) else {
            return;
        };
        check_revalidates(validated.descriptor());
        let tensor = fake_tensor(validated.into_parts().0);
        let exported = ArrayInterface::export(&tensor).expect("a validated interface exports");
        let again = exported.import(&options).expect("our export validates");
        assert_same_interface(again.descriptor(), tensor.descriptor());
    }
}

/// How deep [`descr_fields`] nests: far past anything the interfaces accept (only the default
/// one-field form), shallow enough that the harness's own recursion is harmless. Deeper (and
/// cyclic) `descr` lists are the Python layer's to refuse while parsing.
const DESCR_DEPTH: u32 = 6;

/// A `descr` list as a dict can spell it: up to three fields, names from NumPy's forms,
/// typestr or nested formats, optional sub-array shapes.
fn descr_fields(b: &mut Bytes<'_>, depth: u32) -> Vec<DescrField> {
    let n = usize::from(b.u8() % 4);
    (0..n)
        .map(|_| {
            let name = ["", "x", "f0", "\u{e9}"][usize::from(b.u8() % 4)].to_owned();
            let format = if depth < DESCR_DEPTH && b.u8().is_multiple_of(3) {
                DescrFormat::Fields(descr_fields(b, depth + 1))
            } else {
                DescrFormat::TypeStr(
                    typestr(b).unwrap_or(TypeStr::from_str("|u1").expect("a typestr")),
                )
            };
            let shape = b.u8().is_multiple_of(8).then(|| {
                let rank = usize::from(b.u8() % 3);
                b.dims(rank)
            });
            DescrField {
                name,
                format,
                shape,
            }
        })
        .collect()
}

/// Byte strides, mostly whole (and negative) multiples of `itemsize`, sometimes anything.
fn byte_strides(b: &mut Bytes<'_>, ndim: usize, itemsize: i64) -> Vec<i64> {
    (0..ndim)
        .map(|_| match b.u8() % 4 {
            0 => b.dim(),
            _ => i64::from(b.u8() as i8 % 17).saturating_mul(itemsize),
        })
        .collect()
}

/// Target `array_interface`: what the Python layer's dict parsing hands the CAI adapter.
/// A typestr, a shape, byte strides, a `descr` nested up to `DESCR_DEPTH` levels, an
/// `offset`, and `data` as a buffer region (the form a buffer-protocol exporter's memory
/// takes, readonly or not) or a pointer, through `ArrayInterface::import`, and the same
/// layout and `descr` through `CudaArrayInterface::import`. What is accepted:
/// - lies inside the buffer region, every byte (the \[span\] invariant the Python layer
///   relies on once it passes the exporter's real extent);
/// - is read-only when the buffer or pointer says so (\[access\]);
/// - had no `descr`, or exactly the typestr's default `[('', typestr)]`.
///
/// Every refusal's message formats (a nested `descr` is printed in it).
pub fn array_interface(data: &[u8]) {
    let mut b = Bytes(data);
    let Some(typestr) = typestr(&mut b) else {
        return;
    };
    let itemsize = i64::try_from(typestr.size.unwrap_or(1)).unwrap_or(1).max(1);
    let ndim = usize::from(b.u8() % 5);
    let shape = b.dims(ndim);
    let strides = b.bool().then(|| byte_strides(&mut b, ndim, itemsize));
    let descr = match b.u8() % 4 {
        0 | 1 => None,
        2 => Some(typestr.default_descr()),
        _ => Some(descr_fields(&mut b, 0)),
    };
    let offset = match b.u8() % 4 {
        0 => b.i64(),
        _ => i64::from(b.u8() as i8).saturating_mul(if b.bool() { itemsize } else { 1 }),
    };
    let readonly = b.bool();
    let data = if b.u8().is_multiple_of(4) {
        ArrayData::Pointer(DataPointer {
            address: b.address(),
            readonly,
        })
    } else {
        ArrayData::Buffer(BufferRegion {
            address: b.address(),
            len: usize::from(b.u16() % 4096),
            readonly,
        })
    };
    let mask = b.u8().is_multiple_of(16);
    let version = i64::from(b.u8() % 5);
    let options = ImportOptions::default();
    let default_descr =
        |d: &Option<Vec<DescrField>>| d.as_ref().is_none_or(|d| *d == typestr.default_descr());

    let ai = ArrayInterface {
        shape: shape.clone(),
        typestr,
        data,
        strides: strides.clone(),
        descr: descr.clone(),
        mask,
        offset,
        version,
    };
    match ai.import(&options) {
        Ok(imported) => {
            let desc = imported.descriptor();
            assert!(
                default_descr(&descr),
                "a structured descr was accepted: {descr:?}"
            );
            assert!(!mask, "a masked interface was accepted");
            if readonly {
                assert_eq!(
                    desc.access(),
                    Access::ReadOnly,
                    "a read-only {data:?} became writable"
                );
            }
            if let ArrayData::Buffer(region) = data {
                let span = desc.byte_span();
                let buffer = region.address..region.address.saturating_add(region.len);
                assert!(
                    span.is_empty() || (buffer.start <= span.start && span.end <= buffer.end),
                    "span {span:x?} outside the buffer {buffer:x?}"
                );
            }
            check_revalidates(desc);
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }

    let cai = CudaArrayInterface {
        shape,
        typestr,
        data: DataPointer {
            address: match data {
                ArrayData::Pointer(p) => p.address,
                ArrayData::Buffer(r) => r.address,
            },
            readonly,
        },
        strides,
        descr: descr.clone(),
        mask,
        version,
        stream: None,
    };
    match cai.import(Device::cuda(0), &options) {
        Ok(imported) => {
            assert!(
                default_descr(&descr),
                "a structured descr was accepted: {descr:?}"
            );
            if readonly {
                assert_eq!(imported.descriptor().access(), Access::ReadOnly);
            }
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
}

/// An interface exported and validated again describes the same tensor, offset folded; for
/// an empty one the address may differ: the CAI asks exporters to write 0 there (found by
/// this target, which first compared addresses too).
fn assert_same_interface(again: &Descriptor, original: &Descriptor) {
    let original = original.with_offset_folded();
    if original.numel() == 0 {
        assert_eq!(
            (again.shape(), again.dtype(), again.device(), again.access()),
            (
                original.shape(),
                original.dtype(),
                original.device(),
                original.access()
            )
        );
    } else {
        assert_eq!(again, &original);
    }
}

/// What a fuzzed managed tensor's deleter frees and counts.
struct Producer {
    released: Arc<AtomicUsize>,
    _shape: Vec<i64>,
    _strides: Vec<i64>,
}

/// The deleter of every fuzzed struct, legacy or versioned: frees the struct and its
/// `Producer`, counting the release.
///
/// # Safety
/// 1. `m` is a struct that `dlpack` boxed together with its `Producer` (in `manager_ctx`),
///    both still live; called once per struct (the property under test).
unsafe extern "C" fn release<M: ManagedTensorBase>(m: *mut M) {
    // SAFETY: obligation 1: the box made in `dlpack`, released once.
    let m = unsafe { Box::from_raw(m) };
    // SAFETY: obligation 1: `manager_ctx` is the `Producer` box made for this struct.
    let producer = unsafe { Box::from_raw(m.manager_ctx().cast::<Producer>()) };
    producer.released.fetch_add(1, Ordering::SeqCst);
}

/// An import's outcome: the tensor, or `None` after the refused struct was released, by the
/// caller through [`ImportError::into_inner`] (`give_back`) or by dropping the error.
fn settle<M: ManagedTensorBase>(
    result: Result<Imported, ImportError<M>>,
    give_back: bool,
) -> Option<Tensor> {
    match result {
        Ok(imported) => Some(imported.into_tensor()),
        Err(e) if give_back => {
            if let Some(m) = e.into_inner() {
                // SAFETY: given back untouched and ours: released once, here, through its
                // deleter.
                unsafe { M::drop_raw(m.as_ptr()) };
            }
            None
        }
        Err(e) => {
            drop(e);
            None
        }
    }
}

/// Target `dlpack`: managed tensors with arbitrary field values (version, flags, device,
/// dtype, rank, null or real shape and strides, offset) through both imports. Whatever
/// happens, the producer's deleter runs exactly once; accepted tensors round-trip through
/// our export.
pub fn dlpack(data: &[u8]) {
    let mut b = Bytes(data);
    let legacy = b.u8().is_multiple_of(4);
    let ndim_field = if b.u8().is_multiple_of(16) {
        b.i32()
    } else {
        i32::from(b.u8() % 10)
    };
    // Arrays as long as the struct claims: the import reads `ndim` values, as DLPack lets
    // it (an overflow here was the harness's, caught by AddressSanitizer). Ranks above 64
    // come with a null shape, which is refused before anything is read.
    let stored = usize::try_from(ndim_field).ok().filter(|&n| n <= 64);
    let mut shape = b.dims(stored.unwrap_or(0));
    let mut strides = b.dims(stored.unwrap_or(0));
    let null_shape = stored.is_none() || b.u8().is_multiple_of(16);
    let null_strides = b.u8().is_multiple_of(4);
    let released = Arc::new(AtomicUsize::new(0));
    let dl = DLTensor {
        data: ptr::with_exposed_provenance_mut(b.address()),
        device: DLDevice {
            device_type: DLDeviceType(b.code(20) as u32),
            device_id: b.code(3),
        },
        ndim: ndim_field,
        dtype: DLDataType {
            code: DLDataTypeCode(b.u8() % 24),
            bits: [8, 16, 32, 64, 4, 6, 1, 128, 0, 7][usize::from(b.u8() % 10)],
            lanes: if b.u8().is_multiple_of(8) { b.u16() } else { 1 },
        },
        shape: if null_shape {
            ptr::null_mut()
        } else {
            shape.as_mut_ptr()
        },
        strides: if null_strides {
            ptr::null_mut()
        } else {
            strides.as_mut_ptr()
        },
        byte_offset: if b.bool() { 0 } else { b.u64() % 4096 },
    };
    let producer = Box::into_raw(Box::new(Producer {
        released: Arc::clone(&released),
        _shape: shape,
        _strides: strides,
    }))
    .cast::<c_void>();
    let give_back = b.bool();
    let imported = if legacy {
        let m = Box::into_raw(Box::new(DLManagedTensor {
            dl_tensor: dl,
            manager_ctx: producer,
            deleter: Some(release::<DLManagedTensor>),
        }));
        let access = if b.bool() {
            Access::ReadOnly
        } else {
            Access::ReadWrite
        };
        // SAFETY: a live struct whose shape and strides (owned by the producer box) hold
        // `ndim` values when non-null and `ndim` is in range; the deleter frees both boxes
        // once; the data address is never dereferenced (obligation 3 is moot).
        let result = unsafe { import_legacy(NonNull::new(m).expect("boxed"), access) };
        settle(result, give_back)
    } else {
        let version = DLPackVersion {
            major: if b.u8().is_multiple_of(8) {
                u32::from(b.u8())
            } else {
                1
            },
            minor: u32::from(b.u8() % 5),
        };
        let flags = if b.u8().is_multiple_of(8) {
            DlpackFlags::from_bits_retain(b.u64())
        } else {
            DlpackFlags::from_bits_retain(u64::from(b.u8() % 8))
        };
        let m = Box::into_raw(Box::new(DLManagedTensorVersioned {
            version,
            manager_ctx: producer,
            deleter: Some(release::<DLManagedTensorVersioned>),
            flags,
            dl_tensor: dl,
        }));
        // SAFETY: as for the legacy struct above.
        let result = unsafe { import_versioned(NonNull::new(m).expect("boxed")) };
        settle(result, give_back)
    };
    if let Some(tensor) = imported {
        assert_eq!(released.load(Ordering::SeqCst), 0, "released while in use");
        check_revalidates(tensor.descriptor());
        let raw = export_versioned(&tensor).expect("an imported tensor exports");
        let raw = NonNull::new(raw.into_raw()).expect("never null");
        // SAFETY: our own live export of the tensor; ownership passes to the import.
        let back = unsafe { import_versioned(raw) }.expect("our export imports");
        assert_eq!(back.tensor.descriptor(), &tensor.with_offset_folded());
        drop((tensor, back));
    }
    assert_eq!(
        released.load(Ordering::SeqCst),
        1,
        "the deleter runs exactly once"
    );
}

/// An owner whose release `own_export` counts.
struct CountedOwner(Arc<AtomicUsize>);

impl Drop for CountedOwner {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

std::thread_local! {
    /// The export's own deleter that `wrapped_deleter` calls (one export at a time per
    /// thread), its argument type erased.
    static WRAPPED: std::cell::Cell<Option<unsafe extern "C" fn(*mut c_void)>> =
        const { std::cell::Cell::new(None) };
    /// Calls of `wrapped_deleter` on this thread.
    static WRAPPER_CALLS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The deleter a fuzzed consumer installs in place of the export's: counts the call, then
/// calls the export's own deleter.
///
/// # Safety
/// 1. `m` is the managed struct whose deleter `WRAPPED` holds (this thread's), called once.
unsafe extern "C" fn wrapped_deleter<M>(m: *mut M) {
    WRAPPER_CALLS.with(|c| c.set(c.get() + 1));
    if let Some(inner) = WRAPPED.with(|w| w.take()) {
        // SAFETY: obligation 1: the export's own deleter (stored type-erased from
        // `unsafe extern "C" fn(*mut M)`, the same ABI), for the struct it was written into.
        unsafe { inner(m.cast()) };
    }
}

/// The fields of a managed struct that only one of the two kinds has, or that need its type.
trait Head: ManagedTensorBase + Sized + 'static {
    fn dl(&mut self) -> &mut DLTensor;
    fn set_version(&mut self, _version: DLPackVersion) {}
    fn set_flags(&mut self, _flags: DlpackFlags) {}
    fn set_manager_ctx(&mut self, ctx: *mut c_void);
    /// Replaces the deleter with `wrapped_deleter`, keeping the old one in `WRAPPED`.
    fn wrap_deleter(&mut self);
}

macro_rules! head {
    ($t:ty) => {
        fn dl(&mut self) -> &mut DLTensor {
            &mut self.dl_tensor
        }
        fn set_manager_ctx(&mut self, ctx: *mut c_void) {
            self.manager_ctx = ctx;
        }
        fn wrap_deleter(&mut self) {
            let inner = self.deleter.replace(wrapped_deleter::<$t>);
            let erased = inner.map(|f| {
                // SAFETY: `unsafe extern "C" fn(*mut T)` and `unsafe extern "C" fn(*mut c_void)`
                // have the same ABI (one pointer argument); called only with a `*mut T`.
                unsafe {
                    std::mem::transmute::<
                        unsafe extern "C" fn(*mut $t),
                        unsafe extern "C" fn(*mut c_void),
                    >(f)
                }
            });
            WRAPPED.with(|w| w.set(erased));
        }
    };
}

impl Head for DLManagedTensorVersioned {
    head!(DLManagedTensorVersioned);
    fn set_version(&mut self, version: DLPackVersion) {
        self.version = version;
    }
    fn set_flags(&mut self, flags: DlpackFlags) {
        self.flags = flags;
    }
}

impl Head for DLManagedTensor {
    head!(DLManagedTensor);
}

/// Target `own_export`: our own export of an arbitrary valid tensor, then any number of edits
/// a consumer could make to any field (version, `manager_ctx`, deleter, flags, data pointer,
/// byte offset, device, rank, dtype, shape and stride values through the struct's pointers,
/// the pointers themselves), then the import. An import that hands back the exported tensor
/// itself (the fast path) must describe exactly what was exported; anything else must be a
/// tensor that validates again (its element count agreeing with its shape) or a refusal; the
/// export is released exactly once, through the consumer's deleter if it installed one.
pub fn own_export(data: &[u8]) {
    let mut b = Bytes(data);
    let legacy = b.u8().is_multiple_of(4);
    let rank = usize::from(b.u8() % 11);
    let shape: Vec<i64> = (0..rank).map(|_| i64::from(b.u8() % 5)).collect();
    let strides: Vec<i64> = (0..rank).map(|_| i64::from(b.u8() as i8 % 8)).collect();
    let dtypes = [
        tensorbridge_core::DType::FLOAT32,
        tensorbridge_core::DType::INT64,
        tensorbridge_core::DType::UINT8,
        tensorbridge_core::DType::BFLOAT16,
    ];
    let dtype = dtypes[usize::from(b.u8() % 4)];
    let device = if b.bool() {
        Device::CPU
    } else {
        Device::new(DeviceType::Cuda, u32::from(b.u8() % 3))
    };
    let raw = RawTensor {
        strides: Some(&strides),
        byte_offset: u64::from(b.u8()) * u64::from(dtype.bits() / 8).max(1),
        access: if b.bool() {
            Access::ReadOnly
        } else {
            Access::ReadWrite
        },
        ..RawTensor::new(
            0x7f00_0000_0000 + (usize::from(b.u16()) << 4),
            device,
            dtype,
            &shape,
        )
    };
    let Ok(desc) = raw.validate() else {
        return;
    };
    let released = Arc::new(AtomicUsize::new(0));
    // SAFETY: nothing reads or writes through this tensor or its imports (the address is
    // fake, never dereferenced); the owner only counts its release.
    let original =
        unsafe { Tensor::from_descriptor(desc, Arc::new(CountedOwner(Arc::clone(&released)))) };
    WRAPPER_CALLS.with(|c| c.set(0));
    WRAPPED.with(|w| w.set(None));
    if legacy {
        let policy = tensorbridge_dlpack::ReadOnlyPolicy::Discard;
        let Ok(managed) = tensorbridge_dlpack::export_legacy(&original, policy) else {
            return;
        };
        let access = if b.bool() {
            Access::ReadOnly
        } else {
            Access::ReadWrite
        };
        let m = edit(&mut b, managed.into_raw());
        // SAFETY: our own export, edited; its arrays (ours or `m.1`'s) hold `ndim` values
        // when non-null and `ndim` is in range; the deleter releases the box once.
        let result = unsafe { import_legacy(m.0, access) };
        check_own(settle(result, b.bool()), &original, m.2);
        drop(m.1);
    } else {
        let Ok(managed) = export_versioned(&original) else {
            return;
        };
        let m = edit(&mut b, managed.into_raw());
        // SAFETY: as for the legacy struct.
        let result = unsafe { import_versioned(m.0) };
        check_own(settle(result, b.bool()), &original, m.2);
        drop(m.1);
    }
    let wrapped = WRAPPER_CALLS.with(|c| c.get());
    drop(original);
    assert_eq!(released.load(Ordering::SeqCst), 1, "released exactly once");
    assert!(wrapped <= 1, "the consumer's deleter ran {wrapped} times");
    assert!(
        WRAPPED.with(|w| w.take()).is_none(),
        "a wrapped deleter was never called"
    );
}

/// Arrays a fuzzed consumer points the struct at, kept until the import is done.
type Scratch = Vec<Vec<i64>>;

/// Applies the fuzzed edits to our own export `m`; returns it, the arrays it may now point
/// to, and whether anything changed.
fn edit<M: Head>(b: &mut Bytes<'_>, m: *mut M) -> (NonNull<M>, Scratch, bool) {
    let mut scratch: Scratch = Vec::new();
    let mut changed = false;
    let mut wrapped = false;
    // SAFETY: our own live export, owned here alone until the import.
    let r = unsafe { &mut *m };
    // How many values the struct's `shape` and `strides` pointers reach.
    let rank = usize::try_from(r.dl().ndim).expect("our export's rank");
    let (mut shape_len, mut strides_len) = (rank, rank);
    for _ in 0..usize::from(b.u8() % 5) {
        let which = b.u8() % 14;
        match which {
            0 => r.set_version(DLPackVersion {
                major: 1,
                minor: u32::from(b.u8() % 5),
            }),
            1 => r.set_version(DLPackVersion {
                major: u32::from(b.u8()),
                minor: 3,
            }),
            2 => r.set_manager_ctx(ptr::with_exposed_provenance_mut(b.address())),
            3 if !wrapped => {
                r.wrap_deleter();
                wrapped = true;
            }
            4 => r.set_flags(DlpackFlags::from_bits_retain(u64::from(b.u8() % 8))),
            5 => r.dl().data = ptr::with_exposed_provenance_mut(b.address()),
            6 => r.dl().byte_offset = b.u64() % 4096,
            7 => {
                r.dl().device = DLDevice {
                    device_type: DLDeviceType(b.code(20) as u32),
                    device_id: b.code(3),
                }
            }
            8 => {
                let ndim = if b.u8().is_multiple_of(8) {
                    -1
                } else {
                    i32::from(b.u8() % 11)
                };
                let n = usize::try_from(ndim).unwrap_or(0);
                if n > shape_len {
                    scratch.push(b.dims(n));
                    r.dl().shape = scratch.last_mut().expect("pushed").as_mut_ptr();
                    shape_len = n;
                }
                if n > strides_len {
                    scratch.push(b.dims(n));
                    r.dl().strides = scratch.last_mut().expect("pushed").as_mut_ptr();
                    strides_len = n;
                }
                r.dl().ndim = ndim;
            }
            9 => {
                r.dl().dtype = DLDataType {
                    code: DLDataTypeCode(b.u8() % 24),
                    bits: [8, 16, 32, 64, 4, 6, 1, 128, 0, 7][usize::from(b.u8() % 10)],
                    lanes: if b.u8().is_multiple_of(8) { b.u16() } else { 1 },
                }
            }
            10 | 11 => {
                let strides = b.u8() % 2 == 1;
                let (p, len) = if strides {
                    (r.dl().strides, strides_len)
                } else {
                    (r.dl().shape, shape_len)
                };
                if len > 0 && !p.is_null() {
                    let i = usize::from(b.u8()) % len;
                    let v = b.dim();
                    // SAFETY: `p` reaches `len` values: our export's shown arrays (their
                    // provenance allows writes) or a scratch array.
                    unsafe { p.wrapping_add(i).write(v) };
                }
            }
            12 | 13 => {
                // Enough values for the rank the struct declares now.
                let n = usize::try_from(r.dl().ndim).unwrap_or(0);
                let new = if b.u8().is_multiple_of(8) {
                    ptr::null_mut()
                } else {
                    scratch.push(b.dims(n));
                    scratch.last_mut().expect("pushed").as_mut_ptr()
                };
                if b.bool() {
                    r.dl().strides = new;
                    strides_len = if new.is_null() { 0 } else { n };
                } else {
                    r.dl().shape = new;
                    shape_len = if new.is_null() { 0 } else { n };
                }
            }
            _ => continue,
        }
        // Possibly to the same value: then the fast path may still take it back.
        changed = true;
    }
    (NonNull::new(m).expect("never null"), scratch, changed)
}

/// The import of an edited own export: a fast-path result must be the exported tensor as it
/// left; any other must validate again.
fn check_own(imported: Option<Tensor>, original: &Tensor, changed: bool) {
    let Some(t) = imported else {
        return;
    };
    check_revalidates(t.descriptor());
    // Any dimension of 0 makes 0 elements, whatever the others (their product may overflow).
    let product = if t.shape().contains(&0) {
        Some(0)
    } else {
        t.shape()
            .iter()
            .try_fold(1u64, |acc, &n| acc.checked_mul(u64::try_from(n).ok()?))
    };
    assert_eq!(
        product,
        Some(t.numel()),
        "element count agrees with the shape"
    );
    if Arc::ptr_eq(t.owner(), original.owner()) {
        let folded = original.with_offset_folded();
        assert_eq!(
            (t.data(), t.shape(), t.strides_elems(), t.byte_offset()),
            (
                folded.data(),
                folded.shape(),
                folded.strides_elems(),
                folded.byte_offset()
            ),
            "the fast path hands back only what was exported (edited: {changed})"
        );
        assert_eq!(
            (t.dtype(), t.device()),
            (original.dtype(), original.device())
        );
    }
}
