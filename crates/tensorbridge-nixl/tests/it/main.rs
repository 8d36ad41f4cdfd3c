//! tensorbridge-nixl's public API: regions, descriptor merging and runs (no NIXL needed), and
//! a tensor moved to a Python process through NIXL (`transfer`).

mod regions;
mod transfer;
