//! The public API of tensorbridge-cai, one module per area.

use proptest::test_runner::Config as ProptestConfig;
use tensorbridge_cai::{
    ArrayData, ArrayInterface, CudaArrayInterface, DataPointer, ImportOptions, TypeStr,
};

mod export;
mod import;
mod refusals;
mod roundtrip;
mod typestr;

/// Proptest's defaults (including `PROPTEST_CASES`), without failure persistence: Miri's
/// isolation forbids the file system, and a failing case prints its input anyway.
fn config() -> ProptestConfig {
    ProptestConfig {
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// A parsed typestr (tests only pass valid ones).
fn ts(s: &str) -> TypeStr {
    s.parse().expect("a valid typestr")
}

/// A CAI v3 dict for C-order data at `address`, writable, no stream.
fn cai(typestr: &str, shape: &[i64], address: usize) -> CudaArrayInterface {
    CudaArrayInterface {
        shape: shape.to_vec(),
        typestr: ts(typestr),
        data: DataPointer {
            address,
            readonly: false,
        },
        strides: None,
        descr: None,
        mask: false,
        version: 3,
        stream: None,
    }
}

/// An array interface v3 dict for C-order data at `address`, writable.
fn host(typestr: &str, shape: &[i64], address: usize) -> ArrayInterface {
    ArrayInterface {
        shape: shape.to_vec(),
        typestr: ts(typestr),
        data: ArrayData::Pointer(DataPointer {
            address,
            readonly: false,
        }),
        strides: None,
        descr: None,
        mask: false,
        offset: 0,
        version: 3,
    }
}

/// No hints.
fn plain() -> ImportOptions {
    ImportOptions::new()
}
