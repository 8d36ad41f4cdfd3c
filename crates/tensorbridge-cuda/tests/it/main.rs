//! The CUDA layer's public API on any machine: everything that needs no GPU (no driver,
//! pure span checks, messages). Its GPU half runs in the cudarc adapter's GPU suite
//! (`crates/tensorbridge-cudarc/tests/gpu`), which drives it with cudarc kernels. One module
//! per area.

mod ipc;
mod messages;
mod no_driver;
mod pointer;
