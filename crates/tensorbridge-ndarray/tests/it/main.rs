//! tensorbridge-ndarray's public API: views of every strided layout against the testkit's
//! reference, arrays and views out to tensors and back, owners dropped once, refusals.

mod refusals;
mod roundtrip;
mod views;
