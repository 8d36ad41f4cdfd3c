//! tensorbridge: zero-copy tensor hand-offs between Rust and the GPU/Python ecosystem, as one
//! dependency.
//!
//! The core model ([`Tensor`], [`Descriptor`], [`DType`], [`Device`], [`Layout`], [`Ready`],
//! the trust boundary [`RawTensor`]) is at the root; each adapter is a module behind the
//! feature named after what it reaches:
//!
//! ```toml
//! [dependencies]
//! tensorbridge = { version = "0.1", features = ["pyo3", "cudarc"] }
//! ```
//!
//! | feature | module | what it adds |
//! |---|---|---|
//! | (none) | the root | the core: no CUDA, libtorch or Python library |
//! | `dlpack` | `tensorbridge::dlpack` | DLPack import/export (legacy and versioned) |
//! | `cai` | `tensorbridge::cai` | the CUDA Array Interface and NumPy's array interface |
//! | `cuda` | `tensorbridge::cuda`, `tensorbridge::cudarc_crate` | the CUDA driver layer; the cudarc it is built with |
//! | `cudarc` | `tensorbridge::cudarc` | cudarc slices <-> tensors, views and checked kernel arguments |
//! | `tch` | `tensorbridge::tch` | libtorch tensors through tch (needs libtorch when building) |
//! | `pyo3` | `tensorbridge::pyo3`, `tensorbridge::pyo3_crate` | any Python tensor in, `View`s out, your own kernel on framework tensors; the pyo3 it is built with |
//! | `ndarray` | `tensorbridge::ndarray`, `tensorbridge::ndarray_crate` | ndarray views over host tensors (every stride), arrays and views out to tensors; the ndarray it is built with |
//! | `burn` | `tensorbridge::burn`, `tensorbridge::burn_tensor_crate`, `tensorbridge::burn_flex_crate` | burn's CPU backend (burn-flex) tensors out and in, zero-copy; the burn it is built with |
//! | `candle` | `tensorbridge::candle`, `tensorbridge::candle_crate` | candle CPU tensors out zero-copy and back as far as candle allows; the candle-core it is built with (CUDA tensors: `tensorbridge-candle`'s `cuda` feature) |
//!
//! | `abi3`, `abi3-py39` ... `abi3-py313` | | pyo3's stable-ABI features, forwarded (each turns on `pyo3`) |
//!
//! # A PyO3 extension with this one dependency
//!
//! pyo3's macros (`#[pyfunction]`, `#[pymodule]`, `#[pyclass]`, `#[pymethods]`) expand to
//! paths that start with `::pyo3`, which a crate without its own `pyo3` dependency does not
//! have. Each macro takes the path to use instead: write
//! `#[pyo3(crate = "tensorbridge::pyo3_crate")]` under it. The stable ABI is a feature of
//! this crate (`features = ["pyo3", "abi3-py39"]`), forwarded to pyo3. Nothing else is needed:
//! `crates/tensorbridge-kernel-example` is such a crate, built and tested by CI.
//!
//! ```toml
//! [dependencies]
//! tensorbridge = { version = "0.1", features = ["pyo3", "abi3-py39"] }
//! ```
//!
//! (Or add `pyo3 = "0.30"` beside it, at the version `pyo3_crate` is, and leave the
//! attribute out; the two must then be kept in step by hand.)
//!
//! The foreign crates the adapters speak are re-exported at the versions the adapters are
//! built with (`cudarc_crate` is cudarc 0.19 with CUDA 13.0 bindings, `pyo3_crate` is
//! pyo3 0.30, `ndarray_crate` ndarray 0.17, `candle_crate` candle-core 0.11, `burn_tensor_crate`
//! and `burn_flex_crate` burn 0.23.0-pre.1), so a crate that
//! takes them from here cannot end up with two versions of any. libtorch's tch is the
//! exception: `tensorbridge-tch` accepts tch 0.24 through 0.26, and the user's own tch
//! dependency picks the one (tch allows one version per build).
//! Each module is the adapter crate itself (`tensorbridge::dlpack` is `tensorbridge-dlpack`),
//! whose documentation says what it converts, zero-copy or not, what happens to streams, who
//! owns what, and its limitations.

#![cfg_attr(docsrs, feature(doc_cfg))]

pub use tensorbridge_core::*;

#[cfg(feature = "burn")]
pub use tensorbridge_burn as burn;
#[cfg(feature = "cai")]
pub use tensorbridge_cai as cai;
#[cfg(feature = "candle")]
pub use tensorbridge_candle as candle;
#[cfg(feature = "cuda")]
pub use tensorbridge_cuda as cuda;
#[cfg(feature = "cudarc")]
pub use tensorbridge_cudarc as cudarc;
#[cfg(feature = "dlpack")]
pub use tensorbridge_dlpack as dlpack;
#[cfg(feature = "ndarray")]
pub use tensorbridge_ndarray as ndarray;
#[cfg(feature = "pyo3")]
pub use tensorbridge_pyo3 as pyo3;
#[cfg(feature = "tch")]
pub use tensorbridge_tch as tch;

/// The burn-flex crate (burn's CPU backend) the burn adapter is built with (0.23.0-pre.1).
#[cfg(feature = "burn")]
pub use ::burn_flex as burn_flex_crate;
/// The burn-tensor crate the burn adapter is built with (0.23.0-pre.1, with its Flex backend).
#[cfg(feature = "burn")]
pub use ::burn_tensor as burn_tensor_crate;
/// The candle-core crate the candle adapter is built with (0.11).
#[cfg(feature = "candle")]
pub use ::candle_core as candle_crate;
/// The cudarc crate the CUDA layer and the cudarc adapter are built with (0.19, CUDA 13.0
/// bindings, libcuda and libnvrtc loaded at run time): launch your kernels with these types.
#[cfg(feature = "cuda")]
pub use ::cudarc as cudarc_crate;
/// The ndarray crate the ndarray adapter is built with (0.17).
#[cfg(feature = "ndarray")]
pub use ::ndarray as ndarray_crate;
/// The pyo3 crate the Python adapter is built with (0.30).
#[cfg(feature = "pyo3")]
pub use ::pyo3 as pyo3_crate;

// The Rust snippets of the README and of the cookbook are compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeDoctests;

#[cfg(doctest)]
#[doc = include_str!("../../../docs/COOKBOOK.md")]
struct CookbookDoctests;
