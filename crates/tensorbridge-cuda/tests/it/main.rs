//! The CUDA layer's public API on any machine: everything that needs no GPU (no driver,
//! pure span checks, messages). Its GPU half is `tests/gpu` (feature `gpu-tests`, run by
//! `cargo xtask test-gpu`). One module per area.

#[cfg(target_os = "linux")]
mod ipc;
mod layers;
mod messages;
mod no_driver;
mod pointer;
