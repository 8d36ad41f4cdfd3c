//! tensorbridge-burn's public API: host tensors of every small strided layout into burn-flex
//! and back (zero-copy, against the testkit's reference and burn's own values), writes
//! through burn's in-place operations, the owner released once, refusals.

mod convert;
