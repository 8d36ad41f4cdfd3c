//! `tensorbridge.View` as a DLPack C exchange API producer: the type attribute
//! `__dlpack_c_exchange_api__` (a capsule named `dlpack_exchange_api`, DLPack 1.3) and its
//! DLPack 1.2 alias `__c_dlpack_exchange_api__` (the table's address as an int) name one
//! static table, through which consumers (tvm-ffi, dlpark, cuda.core) take a view without a
//! Python call.
//!
//! | function | what it does |
//! |---|---|
//! | `managed_tensor_allocator` | not provided: `set_error("NotImplementedError", ...)`, -1 (the header requires the pointer to be set) |
//! | `managed_tensor_from_py_object_no_sync` | `view.__dlpack__(max_version=(1, 3))`'s zero-copy export: the same refusals, `READ_ONLY` carried, one owner clone per export |
//! | `managed_tensor_to_py_object_no_sync` | imports the (stolen) managed tensor into a new `View`; its deleter runs once, also on failure |
//! | `dltensor_from_py_object_no_sync` | a non-owning `DLTensor` into the view's own descriptor, valid while the view lives; refused for read-only and padded sub-byte views (a `DLTensor` has no flags) |
//! | `current_work_stream` | NULL (the legacy default stream) for every device; never touches Python |
//!
//! "no_sync" means the consumer uses the data on the producer's current work stream. A view
//! has no current stream of its own, only a readiness (`Tensor::ready`), so this producer
//! names the legacy default stream for every device, and both exports make the data ready
//! there before they return: nothing for data that is ready now, else a wait enqueued on the
//! legacy default stream (on the GPU; the host never blocks). Where that is illegal (a
//! stream capture the legacy stream would join) the export fails with the CUDA layer's
//! error. A consumer that imports through `managed_tensor_to_py_object_no_sync` hands over
//! data ready on the stream this table named, so the new view is ready on the legacy
//! default stream.
//!
//! Every function is called with the GIL held (the header's "-1 with a Python exception
//! set"); they attach anyway (`PyGILState_Ensure`, reentrant), so a caller that breaks the
//! contract gets defined behaviour. No panic crosses the C boundary or aborts
//! (`ffi::callback`): a panic becomes a `RuntimeError` and -1.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::ptr::{self, NonNull};

use pyo3::prelude::*;
use pyo3::types::PyCapsule;
use tensorbridge_core::{DeviceType, Packing, Ready, Stream, Tensor};
use tensorbridge_dlpack::dlpark::ffi::{DLPackExchangeAPI, DLPackExchangeAPIHeader};
use tensorbridge_dlpack::ffi::{
    DLDeviceType, DLManagedTensorVersioned, DLPACK_MAJOR_VERSION, DLPACK_MINOR_VERSION,
    DLPackVersion, DLTensor,
};
use tensorbridge_dlpack::{export_versioned, import_versioned};

use crate::View;
use crate::convert::type_name;
use crate::error::{Error, Result};
use crate::export::refuse_negative_strides;
use crate::ffi::callback::{python_entry, void_entry};

/// The capsule name DLPack 1.3 gives the table.
const CAPSULE_NAME: &CStr = c"dlpack_exchange_api";

/// The table, for the process's lifetime (DLPack: "must stay alive throughout the lifetime
/// of the process").
struct Table(DLPackExchangeAPI);

// SAFETY: the table is never written (consumers read it through a `const` pointer), and its
// one pointer field, `prev_api`, is null.
unsafe impl Sync for Table {}

static TABLE: Table = Table(DLPackExchangeAPI {
    header: DLPackExchangeAPIHeader {
        version: DLPackVersion {
            major: DLPACK_MAJOR_VERSION,
            minor: DLPACK_MINOR_VERSION,
        },
        // No older table: every consumer of a 1.x table reads this one.
        prev_api: ptr::null_mut(),
    },
    managed_tensor_allocator: Some(managed_tensor_allocator),
    managed_tensor_from_py_object_no_sync: Some(managed_tensor_from_py_object_no_sync),
    managed_tensor_to_py_object_no_sync: Some(managed_tensor_to_py_object_no_sync),
    dltensor_from_py_object_no_sync: Some(dltensor_from_py_object_no_sync),
    current_work_stream: Some(current_work_stream),
});

/// Publishes the table on the `View` type: `__dlpack_c_exchange_api__` (the capsule) and
/// `__c_dlpack_exchange_api__` (its address). Idempotent: every call names the same table.
pub(crate) fn install(py: Python<'_>) -> PyResult<()> {
    let ty = py.get_type::<View>();
    let table = NonNull::from(&TABLE.0);
    // SAFETY: the pointer is to a static, live for the process; the capsule has no
    // destructor, and consumers only read through it.
    let capsule = unsafe { PyCapsule::new_with_pointer(py, table.cast(), CAPSULE_NAME) }?;
    ty.setattr(pyo3::intern!(py, "__dlpack_c_exchange_api__"), capsule)?;
    ty.setattr(
        pyo3::intern!(py, "__c_dlpack_exchange_api__"),
        table.as_ptr().expose_provenance(),
    )?;
    Ok(())
}

/// The value `__dlpack__`'s `stream` takes for the legacy default stream (DLPack's CUDA
/// convention) on devices whose work streams order, `None` elsewhere (host memory, and ROCm,
/// for which nothing is enqueued).
fn legacy_default_stream(kind: DeviceType) -> Option<i64> {
    matches!(
        kind,
        DeviceType::Cuda | DeviceType::CudaManaged | DeviceType::CudaHost
    )
    .then_some(1)
}

/// `py_object` as a `View`.
///
/// # Safety
/// 1. `py_object` is null or a live Python object, borrowed for `'py`.
unsafe fn view_of<'py>(
    py: Python<'py>,
    py_object: *mut c_void,
    function: &'static str,
) -> Result<Bound<'py, View>> {
    let object = NonNull::new(py_object).ok_or(Error::NullArgument {
        function,
        argument: "py_object",
    })?;
    // SAFETY: a live object the caller keeps alive for the call (obligation 1).
    let object = unsafe { Bound::from_borrowed_ptr(py, object.as_ptr().cast()) };
    match object.cast::<View>() {
        Ok(view) => Ok(view.clone()),
        Err(_) => Err(Error::NotAView {
            type_name: type_name(&object),
        }),
    }
}

/// Makes `t`'s data ready on the legacy default stream, the stream [`current_work_stream`]
/// names: nothing when it is ready now, else a GPU-side wait (the host never blocks).
fn ready_on_legacy_default(t: &Tensor) -> Result<()> {
    if legacy_default_stream(t.device().kind).is_some() {
        // SAFETY: the legacy default stream is always live, and not thread-bound.
        unsafe { tensorbridge_cuda::make_ready_on_raw(t, Stream::LegacyDefault) }?;
    }
    Ok(())
}

/// `DLPackManagedTensorAllocator`: not provided. The header requires the pointer to be set,
/// and this function to report through `set_error` exactly when it fails: it always does,
/// with `NotImplementedError`.
unsafe extern "C" fn managed_tensor_allocator(
    _prototype: *mut DLTensor,
    out: *mut *mut DLManagedTensorVersioned,
    error_ctx: *mut c_void,
    set_error: Option<unsafe extern "C" fn(*mut c_void, *const c_char, *const c_char)>,
) -> c_int {
    void_entry("managed_tensor_allocator", || {
        if !out.is_null() {
            // SAFETY: a place for one pointer (the header's contract for `out`).
            unsafe { out.write(ptr::null_mut()) };
        }
        if let Some(set_error) = set_error {
            // SAFETY: the consumer's callback with its own context, given two NUL-terminated
            // strings that outlive the call.
            unsafe {
                set_error(
                    error_ctx,
                    c"NotImplementedError".as_ptr(),
                    c"tensorbridge.View's DLPack C exchange API does not allocate tensors \
                      (managed_tensor_allocator is not provided)"
                        .as_ptr(),
                )
            };
        }
    });
    -1
}

/// `DLPackManagedTensorFromPyObjectNoSync`: an owning managed tensor of a `View`, the one
/// `view.__dlpack__(max_version=(1, 3))` makes (zero-copy, `READ_ONLY` for read-only views,
/// the same refusals but one: a view of a tensor that requires grad goes out read-only here,
/// as PyTorch's own table exports the tensor, where `__dlpack__` refuses it as PyTorch's
/// does: `crate::floor::access`), its data ready on the legacy default stream. `*out` is NULL on
/// failure.
unsafe extern "C" fn managed_tensor_from_py_object_no_sync(
    py_object: *mut c_void,
    out: *mut *mut DLManagedTensorVersioned,
) -> c_int {
    const FUNCTION: &str = "managed_tensor_from_py_object_no_sync";
    python_entry(FUNCTION, |py| {
        let out = NonNull::new(out).ok_or(Error::NullArgument {
            function: FUNCTION,
            argument: "out",
        })?;
        // SAFETY: a place for one pointer (the header's contract for `out`).
        unsafe { out.write(ptr::null_mut()) };
        // SAFETY: the caller passes a live object (the header's contract for `py_object`).
        let view = unsafe { view_of(py, py_object, FUNCTION) }?;
        let view = view.get();
        let stream = legacy_default_stream(view.tensor().device().kind);
        // No `copy`: the exported tensor is the view's own.
        let (exported, _) = view.prepare_export(py, stream, None, None)?;
        let managed = export_versioned(&exported)?;
        // SAFETY: as above; ownership passes to the caller, which calls the deleter once.
        unsafe { out.write(managed.into_raw()) };
        Ok(())
    })
}

/// `DLPackDLTensorFromPyObjectNoSync`: a non-owning `DLTensor` of a `View`, pointing into the
/// view's own descriptor (the view is immutable and its object does not move), valid while
/// the view lives; data ready on the legacy default stream. Data, device, dtype and
/// `byte_offset` as the managed export writes them (the offset folded into `data` where the
/// device has addresses). Refused where the missing flags would lie: read-only views (but
/// those whose producer hands them out without a flag itself, `crate::floor::access`) and padded
/// sub-byte views; and negative strides, as every export of a view refuses them.
unsafe extern "C" fn dltensor_from_py_object_no_sync(
    py_object: *mut c_void,
    out: *mut DLTensor,
) -> c_int {
    const FUNCTION: &str = "dltensor_from_py_object_no_sync";
    python_entry(FUNCTION, |py| {
        let out = NonNull::new(out).ok_or(Error::NullArgument {
            function: FUNCTION,
            argument: "out",
        })?;
        // SAFETY: the caller passes a live object (the header's contract for `py_object`).
        let view = unsafe { view_of(py, py_object, FUNCTION) }?;
        let t = view.get().tensor();
        if !crate::floor::access::flagless_allowed(t.descriptor(), view.get().provenance()) {
            return Err(Error::NoFlags {
                reason: "the view is read-only",
            });
        }
        if t.packing() == Packing::Padded {
            return Err(Error::NoFlags {
                reason: "its sub-byte elements are padded",
            });
        }
        refuse_negative_strides(t)?;
        let borrowed = tensorbridge_dlpack::borrowed_dltensor(t)?;
        ready_on_legacy_default(t)?;
        // SAFETY: a writable `DLTensor` place (the header: "pre-allocated on stack").
        unsafe { out.write(borrowed) };
        Ok(())
    })
}

/// `DLPackManagedTensorToPyObjectNoSync`: a new `View` of an owning managed tensor, whose
/// ownership is stolen (the header): validated by the DLPack import, its deleter runs once
/// when the view and everything made from it are gone, or at once when the import fails.
/// On CUDA-accessible devices the view is ready on the legacy default stream, where this
/// table's `current_work_stream` told the producer to have its data ready.
unsafe extern "C" fn managed_tensor_to_py_object_no_sync(
    tensor: *mut DLManagedTensorVersioned,
    out_py_object: *mut *mut c_void,
) -> c_int {
    const FUNCTION: &str = "managed_tensor_to_py_object_no_sync";
    python_entry(FUNCTION, |py| {
        if !out_py_object.is_null() {
            // SAFETY: a place for one pointer (the header's contract).
            unsafe { out_py_object.write(ptr::null_mut()) };
        }
        let managed = NonNull::new(tensor).ok_or(Error::NullArgument {
            function: FUNCTION,
            argument: "tensor",
        })?;
        // SAFETY:
        // - 1 and 3: the caller's producer follows the DLPack contract (what every DLPack
        //   consumer trusts);
        // - 2: the header says the ownership is stolen: the caller neither uses it nor
        //   deletes it after this call; a refusal releases it here, once.
        let t = unsafe { import_versioned(managed) }
            .map_err(tensorbridge_dlpack::Error::from)?
            .into_tensor();
        // From here on a failure drops `t`, which calls the deleter once.
        let out = NonNull::new(out_py_object).ok_or(Error::NullArgument {
            function: FUNCTION,
            argument: "out_py_object",
        })?;
        let t = if legacy_default_stream(t.device().kind).is_some() {
            // SAFETY:
            // - 1: a no_sync producer has its data ready on the consumer's current work
            //   stream, which this table names as the legacy default stream for every device;
            // - 2: the legacy default stream is always live;
            // - 3: it is not the per-thread default stream.
            unsafe { t.with_ready(Ready::Stream(Stream::LegacyDefault)) }
        } else {
            t
        };
        // Pinned and managed memory: the legacy stream of this thread's current device
        // becomes an event, so the view can cross threads.
        let t = if crate::floor::ready::needs_settling(t.ready(), t.device().kind) {
            let ready = crate::floor::ready::settled(t.descriptor(), t.ready())?;
            // SAFETY: an event recorded on the stream the readiness named, capturing the same
            // work (`settled`).
            unsafe { t.with_ready(ready) }
        } else {
            t
        };
        let view = Bound::new(py, View::new(t))?;
        // SAFETY: as above; the caller owns the new reference.
        unsafe { out.write(view.into_ptr().cast()) };
        Ok(())
    })
}

/// `DLPackCurrentWorkStream`: NULL, the legacy default stream, for every device (a view has
/// no current stream; both exports make their data ready there). Never touches Python and
/// never fails, except for a null `out_current_stream` (-1, with no exception: there is no
/// GIL to rely on here).
unsafe extern "C" fn current_work_stream(
    _device_type: DLDeviceType,
    _device_id: i32,
    out_current_stream: *mut *mut c_void,
) -> c_int {
    tensorbridge_core::callback::foreign_entry("current_work_stream", -1, || {
        if out_current_stream.is_null() {
            return -1;
        }
        // SAFETY: a place for one pointer (the header's contract).
        unsafe { out_current_stream.write(ptr::null_mut()) };
        0
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_dlpack_1_3_with_every_function() {
        let api = &TABLE.0;
        assert_eq!((api.header.version.major, api.header.version.minor), (1, 3));
        assert!(api.header.prev_api.is_null());
        assert!(api.managed_tensor_allocator.is_some());
        assert!(api.managed_tensor_from_py_object_no_sync.is_some());
        assert!(api.managed_tensor_to_py_object_no_sync.is_some());
        assert!(api.dltensor_from_py_object_no_sync.is_some());
        assert!(api.current_work_stream.is_some());
    }

    #[test]
    fn current_work_stream_is_null_for_every_device() {
        for (device_type, id) in [(1, 0), (2, 0), (2, 3), (3, 0), (13, 1)] {
            let mut out: *mut c_void = ptr::dangling_mut();
            // SAFETY: `out` is a live local.
            let rc = unsafe { current_work_stream(DLDeviceType(device_type), id, &mut out) };
            assert_eq!(rc, 0);
            assert!(out.is_null());
        }
        // SAFETY: a null out is refused before anything is written.
        let rc = unsafe { current_work_stream(DLDeviceType(2), 0, ptr::null_mut()) };
        assert_eq!(rc, -1);
    }

    #[test]
    fn the_allocator_reports_not_implemented_through_set_error() {
        use std::cell::RefCell;
        thread_local! {
            static SEEN: RefCell<Vec<(String, String)>> = const { RefCell::new(Vec::new()) };
        }
        unsafe extern "C" fn record(_ctx: *mut c_void, kind: *const c_char, msg: *const c_char) {
            // SAFETY: a NUL-terminated string that lives for the call (the allocator's).
            let kind = unsafe { CStr::from_ptr(kind) };
            // SAFETY: as above.
            let msg = unsafe { CStr::from_ptr(msg) };
            SEEN.with(|s| {
                s.borrow_mut().push((
                    kind.to_string_lossy().into_owned(),
                    msg.to_string_lossy().into_owned(),
                ))
            });
        }
        let mut out: *mut DLManagedTensorVersioned = ptr::dangling_mut();
        // SAFETY: live locals; a callback of the right type; the prototype is not read.
        let rc = unsafe {
            managed_tensor_allocator(ptr::null_mut(), &mut out, ptr::null_mut(), Some(record))
        };
        assert_eq!(rc, -1);
        assert!(out.is_null());
        SEEN.with(|s| {
            let seen = s.borrow();
            assert_eq!(seen.len(), 1);
            assert_eq!(seen[0].0, "NotImplementedError");
            assert!(
                seen[0].1.contains("managed_tensor_allocator"),
                "{}",
                seen[0].1
            );
        });
    }
}
