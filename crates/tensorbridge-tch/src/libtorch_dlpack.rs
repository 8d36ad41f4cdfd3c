//! libtorch's own DLPack export (`at::toDLPackVersioned`, reached through the shim) of
//! tensors this crate made, imported back through tensorbridge-dlpack: the export keeps the
//! storage, and so the owner, alive until its deleter runs, and libtorch's dtype mapping
//! agrees with this crate's for every scalar type.

use std::ptr::{self, NonNull};

use tensorbridge_core::{Access, DType, DTypeCode, Device, RawTensor, Tensor};
use tensorbridge_dlpack::ffi::DLManagedTensorVersioned;
use tensorbridge_testkit::DropCounter;

use crate::{ExportOptions, ScalarType, export, export_with, ffi};

/// libtorch's DLPack export of `t`, imported back as a core tensor.
fn through_libtorch_dlpack(t: &tch::Tensor) -> Tensor {
    let mut out = ptr::null_mut();
    let mut err = ptr::null_mut();
    // SAFETY: `t` is a live `C_tensor`; `out` and `err` are live locals.
    let status = unsafe { ffi::tb_tch_to_dlpack_versioned(t.as_ptr(), &mut out, &mut err) };
    // SAFETY: `err` is what the call stored.
    unsafe { ffi::check("tb_tch_to_dlpack_versioned", status, err) }.expect("exported");
    let managed = NonNull::new(out.cast::<DLManagedTensorVersioned>()).expect("not null");
    // SAFETY: a fresh versioned export by libtorch, whose ownership moves to the import; its
    // data is the storage the export holds a reference to.
    let imported = unsafe { tensorbridge_dlpack::import_versioned(managed) }
        .unwrap_or_else(|e| panic!("libtorch's export imports: {}", e.error()));
    imported.into_tensor()
}

#[test]
fn a_libtorch_dlpack_export_keeps_the_owner_until_its_deleter() {
    let counter = DropCounter::new();
    let values: Vec<f32> = (0..12).map(|i| i as f32).collect();
    let t = Tensor::from_vec(values, &[3, 4]).unwrap();
    // A tensor whose owner is counted and also keeps `t`'s buffer alive.
    // SAFETY: same memory and layout as `t`, whose owner the counted owner holds.
    let counted = unsafe {
        Tensor::from_descriptor(
            t.descriptor().clone(),
            counter.owner_with(t.owner().clone()),
        )
    };
    drop(t);
    // SAFETY: obligation 1: nothing writes through the libtorch tensor.
    let torch = unsafe { export(&counted) }.unwrap();
    drop(counted);
    let view = torch.transpose(0, 1).narrow(0, 1, 2); // libtorch's view of its own tensor
    drop(torch);
    let exported = through_libtorch_dlpack(&view);
    drop(view);
    assert_eq!(counter.drops(), 0, "the DLPack export holds the storage");
    assert_eq!(exported.shape(), [2, 3]);
    assert_eq!(exported.strides_elems(), [1, 4]);
    assert_eq!(
        exported.host_view::<f32>().unwrap().to_contiguous(),
        [1.0, 5.0, 9.0, 2.0, 6.0, 10.0]
    );
    let clone = exported.clone();
    drop(exported);
    assert_eq!(counter.drops(), 0);
    drop(clone); // the DLPack deleter frees libtorch's storage, which runs ours
    assert_eq!(counter.drops(), 1);
}

#[test]
fn libtorch_maps_every_scalar_type_to_the_same_dlpack_dtype() {
    let mut checked = 0;
    for code in 0..=45 {
        let Ok(dtype) = ScalarType(code).to_dtype() else {
            continue;
        };
        let buffer = vec![0u64; 8]; // 64 bytes, aligned for every dtype
        let shape = [4i64];
        let raw = RawTensor {
            access: Access::ReadOnly,
            ..RawTensor::new(buffer.as_ptr() as usize, Device::CPU, dtype, &shape)
        };
        let desc = raw.validate().unwrap();
        // SAFETY: 4 elements of at most 16 bytes fit the 64-byte buffer, which the owner
        // keeps alive; nothing writes it (read-only, and the test never writes).
        let t = unsafe { Tensor::from_descriptor(desc, std::sync::Arc::new(buffer)) };
        // SAFETY: nothing writes through the libtorch tensor.
        let options = unsafe { ExportOptions::new().allow_read_only() };
        // SAFETY: obligation 1: nothing writes through the libtorch tensor.
        let torch = unsafe { export_with(&t, options) }.unwrap();
        let back = through_libtorch_dlpack(&torch);
        assert_eq!(back.dtype(), dtype, "{}", ScalarType(code));
        assert_eq!(back.data_ptr(), t.data_ptr());
        checked += 1;
    }
    assert_eq!(checked, 22);
    assert_eq!(
        ScalarType::FLOAT4_E2M1FN_X2.to_dtype().unwrap(),
        DType::new(DTypeCode::Float4E2M1Fn, 4, 2).unwrap()
    );
}
