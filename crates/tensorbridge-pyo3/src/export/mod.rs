//! The core -> Python: `View`, the object every framework takes zero-copy, and what it
//! exports (DLPack capsules, the DLPack C exchange API, the CUDA Array Interface and NumPy's
//! array interface, copies on request).

pub(crate) mod capsule;
pub(crate) mod exchange;
pub(crate) mod interfaces;
pub(crate) mod pydtype;
pub(crate) mod view;
