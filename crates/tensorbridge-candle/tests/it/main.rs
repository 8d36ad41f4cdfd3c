//! tensorbridge-candle's public API on the CPU: candle tensors of random layouts out to the
//! core and back, zero-copy (pointers, writes both ways), the storage freed once, copies in,
//! refusals.

mod export;
mod import;
mod refusals;
