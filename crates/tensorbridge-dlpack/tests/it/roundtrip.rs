//! Properties: Tensor -> export -> import gives the same tensor (offset folded where the
//! device allows), at the same address, with the same values.

use std::ptr::NonNull;

use proptest::prelude::*;
use tensorbridge_core::{Access, Packing, Tensor};
use tensorbridge_dlpack::{
    ReadOnlyPolicy, export_legacy, export_versioned, import_legacy, import_versioned,
};
use tensorbridge_testkit::{DropCounter, HostBuffer, small_layout, valid_raw};

proptest! {
    #![proptest_config(crate::proptest_config())]

    /// Every valid descriptor (every device and dtype, ranks 0 to 8, negative and zero
    /// strides, byte offsets, padding, null data for empty tensors) survives the versioned
    /// round trip; the owner is released exactly once, after the last user.
    #[test]
    fn export_import_roundtrip(parts in valid_raw()) {
        let counter = DropCounter::new();
        let desc = parts.as_raw().validate().expect("valid_raw is valid");
        // SAFETY: fake addresses, never dereferenced.
        let t = unsafe { Tensor::from_descriptor(desc, counter.owner()) };
        let raw = export_versioned(&t).unwrap().into_raw();
        // SAFETY: a live export, ownership passed; nothing is dereferenced.
        let back = unsafe { import_versioned(NonNull::new(raw).unwrap()) }.unwrap();
        prop_assert_eq!(back.tensor.descriptor(), &t.with_offset_folded());
        prop_assert_eq!(back.tensor.data_ptr(), t.data_ptr());
        prop_assert_eq!(back.tensor.byte_span(), t.byte_span());
        prop_assert!(!back.is_copied);
        drop(t);
        prop_assert_eq!(counter.drops(), 0);
        drop(back);
        prop_assert_eq!(counter.drops(), 1);
    }

    /// The same through the legacy struct: no flags, so read-only must be discarded
    /// knowingly and is restored by the importer's `access`; padded sub-byte data is refused.
    #[test]
    fn legacy_export_import_roundtrip(parts in valid_raw()) {
        let counter = DropCounter::new();
        let desc = parts.as_raw().validate().expect("valid_raw is valid");
        // SAFETY: fake addresses, never dereferenced.
        let t = unsafe { Tensor::from_descriptor(desc, counter.owner()) };
        let exported = export_legacy(&t, ReadOnlyPolicy::Discard);
        if t.packing() == Packing::Padded {
            prop_assert!(exported.is_err());
        } else {
            let raw = NonNull::new(exported.unwrap().into_raw()).unwrap();
            // SAFETY: a live export, ownership passed; nothing is dereferenced.
            let back = unsafe { import_legacy(raw, t.access()) }.unwrap();
            prop_assert_eq!(back.tensor.descriptor(), &t.with_offset_folded());
            prop_assert_eq!(back.version, None);
        }
        drop(t);
        prop_assert_eq!(counter.drops(), 1);
    }

    /// Real host memory: the values read through the imported tensor are the producer's, for
    /// strided, reversed and broadcast layouts.
    #[test]
    fn host_values_roundtrip((shape, strides) in small_layout(4), legacy in any::<bool>()) {
        let counter = DropCounter::new();
        let buf = HostBuffer::<f64>::new(&shape, &strides, |i| i as f64 + 0.5);
        let expected = buf.expected_contiguous();
        let t = buf.into_tensor(&counter);
        let back = if legacy {
            let raw = export_legacy(&t, ReadOnlyPolicy::Discard).unwrap().into_raw();
            // SAFETY: a live export of `t`'s buffer, which the export keeps alive; read-only
            // again on import, never written.
            unsafe { import_legacy(NonNull::new(raw).unwrap(), Access::ReadOnly) }.unwrap()
        } else {
            let raw = export_versioned(&t).unwrap().into_raw();
            // SAFETY: as above; the flag keeps it read-only.
            unsafe { import_versioned(NonNull::new(raw).unwrap()) }.unwrap()
        };
        drop(t);
        let view = back.tensor.host_view::<f64>().unwrap();
        prop_assert_eq!(view.to_contiguous(), expected);
        prop_assert_eq!(counter.drops(), 0);
        drop(back);
        prop_assert_eq!(counter.drops(), 1);
    }
}
