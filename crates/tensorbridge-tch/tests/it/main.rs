//! tensorbridge-tch's public API on the CPU (libtorch from the managed venv, no GPU needed),
//! one module per area. The GPU suite is `tests/gpu` (feature `gpu-tests`).

mod dtypes;
mod layout;
mod ownership;
mod pinning;
mod refusals;
mod zero_copy;

use std::sync::Arc;

use tensorbridge_core::{Access, DType, Device, RawTensor, Tensor};
use tensorbridge_testkit::DropCounter;

/// The crate's `tensorbridge_tch::import`, for tests that never resize the storage of a tensor
/// they import while the import lives (its safety obligation). The tests about resizing (`pinning`) call
/// the crate's function themselves.
fn import(t: &tch::Tensor) -> Result<Tensor, tensorbridge_tch::Error> {
    // SAFETY: no test that calls this resizes the imported storage (see above).
    unsafe { tensorbridge_tch::import(t) }
}

/// A tensor's values in row-major order, copied by libtorch.
fn torch_values(t: &tch::Tensor) -> Vec<f32> {
    let n = t.numel();
    let mut out = vec![0.0f32; n];
    t.copy_data(&mut out, n);
    out
}

/// `0.0, 1.0, ...` as a writable host tensor of `shape` whose owner `counter` counts (and
/// which also holds the buffer).
fn counted_tensor(counter: &DropCounter, shape: &[i64]) -> Tensor {
    let numel: i64 = shape.iter().product();
    let t = Tensor::from_vec((0..numel).map(|i| i as f32).collect(), shape).unwrap();
    // SAFETY: the same description as `t`, whose owner (the buffer) the counted owner holds.
    unsafe {
        Tensor::from_descriptor(
            t.descriptor().clone(),
            counter.owner_with(t.owner().clone()),
        )
    }
}

/// A host tensor over `bytes` zero bytes that claims `device` and `dtype`, for refusals
/// that must happen before anything touches the memory. Read-write unless `access` says.
fn claimed(device: Device, dtype: DType, shape: &[i64], access: Access) -> Tensor {
    let buffer = Arc::new(vec![0u64; 64]);
    let raw = RawTensor {
        access,
        ..RawTensor::new(buffer.as_ptr() as usize, device, dtype, shape)
    };
    let desc = raw.validate().unwrap();
    // SAFETY: 512 real host bytes, which the owner keeps alive, behind every shape used here
    // (at most 64 elements of at most 8 bytes); a tensor that claims another device is only
    // ever refused, never read or written.
    unsafe { Tensor::from_descriptor(desc, buffer) }
}
