//! Reliability across the CPU adapters: a soak of random round trips whose owners are all
//! released exactly once at the end, and exports, imports and releases spread over 8
//! threads at once.
//!
//! `TB_SOAK_ITERS` sets the soak's round trips (default 20 000, a few seconds in a debug
//! build; the long run, 1e6, is `TB_SOAK_ITERS=1000000 cargo test --release -p
//! tensorbridge-integration --test reliability`).

use std::ptr::NonNull;
use std::sync::mpsc;
use std::thread;

use tensorbridge_cai::{ArrayInterface, ImportOptions};
use tensorbridge_core::{Access, Tensor};
use tensorbridge_dlpack::ffi::{DLManagedTensor, DLManagedTensorVersioned};
use tensorbridge_dlpack::{
    ReadOnlyPolicy, export_legacy, export_versioned, import_legacy, import_versioned,
};
use tensorbridge_testkit::{DropCounter, HostBuffer};

/// A small deterministic generator (xorshift64*), so a failure names a reproducible step.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// One hop through an adapter and back; the result describes the same memory.
fn hop(t: &Tensor, how: u64) -> Tensor {
    match how {
        0 => {
            let raw = NonNull::new(export_versioned(t).unwrap().into_raw()).unwrap();
            // SAFETY: a live export of `t`, which its owner keeps alive; ownership passes.
            unsafe { import_versioned(raw) }.unwrap().into_tensor()
        }
        1 => {
            let raw = export_legacy(t, ReadOnlyPolicy::Discard)
                .unwrap()
                .into_raw();
            // SAFETY: as above; imported with the original access.
            unsafe { import_legacy(NonNull::new(raw).unwrap(), t.access()) }
                .unwrap()
                .into_tensor()
        }
        2 => {
            // A foreign-looking struct: our export with its shape pointer re-pointed to a
            // copy, which forces the general (validating) import path.
            let raw = export_versioned(t).unwrap().into_raw();
            let mut dims: Box<[i64]> = t.shape().iter().chain(t.strides_elems()).copied().collect();
            // SAFETY: our live export, not yet handed on; the copy outlives the import,
            // which reads it before returning.
            let dl = unsafe { &mut (*raw).dl_tensor };
            if !dims.is_empty() {
                dl.shape = dims.as_mut_ptr();
                dl.strides = dims.as_mut_ptr().wrapping_add(t.ndim());
            }
            // SAFETY: describes `t`'s memory, kept alive by the export it came from.
            let back = unsafe { import_versioned(NonNull::new(raw).unwrap()) };
            let back = back.unwrap().into_tensor();
            drop(dims);
            back
        }
        _ => {
            let ai = ArrayInterface::export(t).unwrap();
            let validated = ai.import(&ImportOptions::default()).unwrap();
            // SAFETY: the same memory as `t`, whose owner the new tensor holds.
            unsafe { validated.into_tensor(t.owner().clone()) }
        }
    }
}

#[test]
fn soak_random_round_trips_release_every_owner_once() {
    let iters: u64 = std::env::var("TB_SOAK_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let counter = DropCounter::new();
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut made = 0usize;
    let mut live: Vec<Tensor> = Vec::new();
    for step in 0..iters {
        if live.len() < 8 || rng.below(16) == 0 {
            let rank = rng.below(5) as usize;
            let shape: Vec<i64> = (0..rank).map(|_| rng.below(4) as i64).collect();
            let strides: Vec<i64> = (0..rank).map(|_| rng.below(9) as i64 - 4).collect();
            let buf = HostBuffer::<f64>::new(&shape, &strides, |i| i as f64 * 0.25);
            let mut t = buf.into_tensor(&counter);
            if rng.below(3) == 0 {
                t = t.into_readonly();
            }
            live.push(t);
            made += 1;
        }
        let i = rng.below(live.len() as u64) as usize;
        let before = live[i].host_view::<f64>().unwrap().to_contiguous();
        let next = hop(&live[i], rng.below(4));
        assert_eq!(
            next.data_ptr(),
            live[i].data_ptr(),
            "step {step}: zero-copy"
        );
        assert_eq!(next.access(), live[i].access(), "step {step}: access kept");
        assert_eq!(
            next.host_view::<f64>().unwrap().to_contiguous(),
            before,
            "step {step}: same values"
        );
        // Replace, keep, or drop: owners go at random moments.
        match rng.below(3) {
            0 => live[i] = next,
            1 => live.push(next),
            _ => drop(next),
        }
        if live.len() > 64 {
            live.swap_remove(rng.below(live.len() as u64) as usize);
        }
        assert!(
            counter.drops() <= made,
            "step {step}: more releases than owners"
        );
    }
    drop(live);
    assert_eq!(counter.drops(), made, "every owner released exactly once");
    println!("soak: {iters} round trips over {made} buffers, {made} releases");
}

/// A managed tensor pointer crossing threads: ownership moves with it.
struct Handoff<M>(NonNull<M>);
// SAFETY: the pointer is a managed tensor whose ownership moves to the receiving thread
// (the sender never touches it again); DLPack allows import and release on any thread.
unsafe impl<M> Send for Handoff<M> {}

#[test]
fn eight_threads_export_import_and_release() {
    const THREADS: usize = 8;
    const PER_THREAD: usize = 2_000;
    let counter = DropCounter::new();
    let t = Tensor::from_vec((0..24).map(|i| i as f32).collect(), &[2, 3, 4]).unwrap();
    // SAFETY: `t`'s buffer, kept alive by the counted owner that holds `t`.
    let t = unsafe { Tensor::from_descriptor(t.descriptor().clone(), counter.owner_with(t)) };
    let expected = t.host_view::<f32>().unwrap().to_contiguous();

    // Each thread exports and sends to the next one, which imports, checks and releases
    // what it received: every struct crosses a thread before import.
    let (senders, receivers): (Vec<_>, Vec<_>) = (0..THREADS)
        .map(|_| mpsc::channel::<(Handoff<DLManagedTensorVersioned>, Handoff<DLManagedTensor>)>())
        .unzip();
    let handles: Vec<_> = receivers
        .into_iter()
        .enumerate()
        .map(|(k, rx)| {
            let tx = senders[(k + 1) % THREADS].clone();
            let t = t.clone();
            let expected = expected.clone();
            thread::spawn(move || {
                let mut kept = Vec::new();
                for n in 0..PER_THREAD {
                    let v = NonNull::new(export_versioned(&t).unwrap().into_raw()).unwrap();
                    let l = export_legacy(&t, ReadOnlyPolicy::Refuse)
                        .unwrap()
                        .into_raw();
                    tx.send((Handoff(v), Handoff(NonNull::new(l).unwrap())))
                        .unwrap();
                    let (v, l) = rx.recv().unwrap();
                    // SAFETY: live exports of the shared buffer, owned by this thread now.
                    let a = unsafe { import_versioned(v.0) }.unwrap().into_tensor();
                    // SAFETY: as above; read-only here, never written.
                    let b = unsafe { import_legacy(l.0, Access::ReadOnly) }.unwrap();
                    assert_eq!(a.host_view::<f32>().unwrap().to_contiguous(), expected);
                    assert_eq!(b.tensor.data_ptr(), a.data_ptr());
                    // Keep some for a while, so releases interleave across threads.
                    if n % 7 == 0 {
                        kept.push(a);
                    }
                }
                drop(tx);
                kept
            })
        })
        .collect();
    drop(senders);
    let kept: Vec<Vec<Tensor>> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(counter.drops(), 0, "still in use");
    drop(kept);
    drop(t);
    assert_eq!(
        counter.drops(),
        1,
        "released once, after the last user on any thread"
    );
}
