//! GPU integration tests: compiled only with the `gpu-tests` feature, run by
//! `cargo xtask test-gpu` (here, or from its bundle on a GPU machine). They expect a GPU and
//! fail, rather than skip, without one. One module per area.

mod smoke;
