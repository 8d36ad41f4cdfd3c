//! A test-only DLPack producer: builds legacy and versioned managed tensors from a [`Spec`],
//! over memory the test keeps alive through a payload, with a deleter that frees the struct
//! and its shape/strides storage and drops the payload together with a counted owner, so a
//! [`DropCounter`] counts the deleter calls (a second call would be a double free, which
//! Miri reports).

use std::ffi::c_void;
use std::ptr::{self, NonNull};

use dlpark::ManagedTensorBase;
use tensorbridge_core::{Owner, Tensor};
use tensorbridge_dlpack::ffi::{
    DLDataType, DLDataTypeCode, DLDevice, DLDeviceType, DLManagedTensor, DLManagedTensorVersioned,
    DLPackVersion, DLTensor, DlpackFlags,
};
use tensorbridge_testkit::DropCounter;

/// Everything a producer writes into a managed tensor, including what a buggy or future one
/// might write.
#[derive(Clone, Debug)]
pub(crate) struct Spec {
    pub(crate) data: *mut c_void,
    pub(crate) device: DLDevice,
    pub(crate) dtype: DLDataType,
    pub(crate) ndim: i32,
    /// `None` writes a NULL `shape`.
    pub(crate) shape: Option<Vec<i64>>,
    /// `None` writes NULL `strides`.
    pub(crate) strides: Option<Vec<i64>>,
    pub(crate) byte_offset: u64,
    /// Versioned structs only.
    pub(crate) version: DLPackVersion,
    /// Versioned structs only; any bits, known or not.
    pub(crate) flags: u64,
}

impl Spec {
    /// A C-order float32 host tensor at a fake, aligned address (never dereferenced).
    pub(crate) fn fake_f32(shape: &[i64]) -> Spec {
        let mut strides = vec![0i64; shape.len()];
        let mut acc = 1;
        for d in (0..shape.len()).rev() {
            strides[d] = acc;
            acc *= shape[d].max(1);
        }
        Spec {
            data: ptr::without_provenance_mut(1 << 20),
            device: DLDevice::CPU,
            dtype: DLDataType::F32,
            ndim: shape.len() as i32,
            shape: Some(shape.to_vec()),
            strides: Some(strides),
            byte_offset: 0,
            version: DLPackVersion::CURRENT,
            flags: 0,
        }
    }

    /// Describes a real tensor exactly (its own data pointer and byte offset).
    pub(crate) fn of(t: &Tensor) -> Spec {
        let (device_type, device_id) = t.device().to_dlpack().expect("small ordinal");
        Spec {
            data: ptr::with_exposed_provenance_mut(t.data()),
            device: DLDevice {
                device_type: DLDeviceType(device_type as u32),
                device_id,
            },
            dtype: DLDataType {
                code: DLDataTypeCode(t.dtype().code().code()),
                bits: t.dtype().bits(),
                lanes: t.dtype().lanes(),
            },
            ndim: t.ndim() as i32,
            shape: Some(t.shape().to_vec()),
            strides: Some(t.strides_elems().to_vec()),
            byte_offset: t.byte_offset(),
            version: DLPackVersion::CURRENT,
            flags: if t.is_readonly() {
                DlpackFlags::READ_ONLY.bits()
            } else {
                0
            },
        }
    }
}

/// The producer's context: the managed struct first (the deleter casts back to the context),
/// then the storage its pointers aim into, then the keep-alive payload.
#[repr(C)]
struct Ctx<M> {
    managed: M,
    shape: Option<Vec<i64>>,
    strides: Option<Vec<i64>>,
    _keep: Owner,
}

unsafe extern "C" fn deleter<M>(managed: *mut M) {
    // SAFETY: `managed` came from `Box::into_raw` of a `Ctx<M>` in `build` (first field,
    // `repr(C)`), and DLPack calls the deleter once.
    drop(unsafe { Box::from_raw(managed.cast::<Ctx<M>>()) });
}

fn build<M: ManagedTensorBase>(
    spec: &Spec,
    keep: impl Send + Sync + 'static,
    counter: &DropCounter,
    with_deleter: bool,
) -> NonNull<M> {
    let mut shape = spec.shape.clone();
    let mut strides = spec.strides.clone();
    let dl = DLTensor {
        data: spec.data,
        device: spec.device,
        ndim: spec.ndim,
        dtype: spec.dtype,
        // Vec buffers do not move when the Vec moves into the box below.
        shape: shape.as_mut().map_or(ptr::null_mut(), |s| s.as_mut_ptr()),
        strides: strides.as_mut().map_or(ptr::null_mut(), |s| s.as_mut_ptr()),
        byte_offset: spec.byte_offset,
    };
    let deleter = with_deleter.then_some(deleter::<M> as unsafe extern "C" fn(*mut M));
    let mut managed = M::from_parts(dl, ptr::null_mut(), deleter);
    // SAFETY: test producer: the flags are whatever the test wants the importer to see.
    unsafe { managed.set_flags_unchecked(DlpackFlags::from_bits_retain(spec.flags)) };
    let ctx = Box::into_raw(Box::new(Ctx {
        managed,
        shape,
        strides,
        _keep: counter.owner_with(keep),
    }));
    // SAFETY: `ctx` is the live box just made.
    let managed = unsafe { &raw mut (*ctx).managed };
    NonNull::new(managed).expect("from a box")
}

/// A versioned managed tensor with `spec.version` and `spec.flags`.
pub(crate) fn versioned(
    spec: &Spec,
    keep: impl Send + Sync + 'static,
    counter: &DropCounter,
) -> NonNull<DLManagedTensorVersioned> {
    let p = build::<DLManagedTensorVersioned>(spec, keep, counter, true);
    // SAFETY: `p` is the live struct just built; `from_parts` set the current version.
    unsafe { (*p.as_ptr()).version = spec.version };
    p
}

/// A legacy managed tensor (version and flags of `spec` ignored).
pub(crate) fn legacy(
    spec: &Spec,
    keep: impl Send + Sync + 'static,
    counter: &DropCounter,
) -> NonNull<DLManagedTensor> {
    build::<DLManagedTensor>(spec, keep, counter, true)
}

/// A versioned managed tensor with a NULL deleter, and the box the test must free itself
/// once the tensor is no longer used.
pub(crate) fn versioned_without_deleter(
    spec: &Spec,
    counter: &DropCounter,
) -> (NonNull<DLManagedTensorVersioned>, Reclaim) {
    let p = build::<DLManagedTensorVersioned>(spec, (), counter, false);
    (p, Reclaim(p.as_ptr()))
}

/// What a producer with a NULL deleter frees itself, when its consumer is done.
pub(crate) struct Reclaim(*mut DLManagedTensorVersioned);

impl Reclaim {
    /// # Safety
    /// 1. Nobody uses the managed tensor any more.
    pub(crate) unsafe fn free(self) {
        // SAFETY: built by `build` as a `Ctx<DLManagedTensorVersioned>`; obligation 1.
        drop(unsafe { Box::from_raw(self.0.cast::<Ctx<DLManagedTensorVersioned>>()) });
    }
}

/// The stable prefix of a managed tensor of some future major version, allocated alone (32
/// bytes on 64-bit targets, not the 80 of a 1.x struct), so that reading any field past `flags`, or making a
/// reference to a whole 1.x struct, is out of bounds and Miri reports it.
#[repr(C)]
struct FutureMajor {
    version: DLPackVersion,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    flags: u64,
}

unsafe extern "C" fn future_deleter(managed: *mut DLManagedTensorVersioned) {
    // SAFETY: made by `future_major` from a `Box<FutureMajor>`, called once.
    let header = unsafe { Box::from_raw(managed.cast::<FutureMajor>()) };
    // SAFETY: `manager_ctx` is the `Box<Owner>` that `future_major` made.
    drop(unsafe { Box::from_raw(header.manager_ctx.cast::<Owner>()) });
}

/// A managed tensor declaring `major.0`, of which only the stable prefix exists.
pub(crate) fn future_major(major: u32, counter: &DropCounter) -> NonNull<DLManagedTensorVersioned> {
    let raw = Box::into_raw(Box::new(FutureMajor {
        version: DLPackVersion { major, minor: 0 },
        // The counted owner lives in its own allocation, so the header is exactly 32 bytes.
        manager_ctx: Box::into_raw(Box::new(counter.owner())).cast(),
        deleter: Some(future_deleter),
        flags: u64::MAX,
    }));
    NonNull::new(raw.cast()).expect("from a box")
}

/// Releases a managed tensor the caller owns (given back by an import error, or handed over
/// by an export), calling its deleter as a consumer would.
///
/// # Safety
/// 1. `managed` is live and owned by the caller.
pub(crate) unsafe fn release<M: ManagedTensorBase>(managed: NonNull<M>) {
    // SAFETY: obligation 1.
    unsafe { M::drop_raw(managed.as_ptr()) };
}

/// A host float32 tensor over real memory with values `0, 1, 2, ...` in C order.
pub(crate) fn host_f32(shape: &[i64]) -> Tensor {
    let n: i64 = shape.iter().product();
    Tensor::from_vec((0..n).map(|i| i as f32).collect(), shape).expect("valid shape")
}
