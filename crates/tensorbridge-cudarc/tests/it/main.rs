//! The public API on any machine: everything that needs no GPU. The GPU half lives in
//! `tests/gpu` (feature `gpu-tests`). One module per area.

mod dtypes;
mod kernel;
mod layout;
mod messages;
