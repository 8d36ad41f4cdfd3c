//! Every public entry works as the first CUDA call of a process (the bug: saving the caller's
//! context called `cuCtxGetCurrent` before `cuInit`, which fails with
//! `CUDA_ERROR_NOT_INITIALIZED`). This binary re-runs itself once per entry, in a fresh
//! process whose first CUDA call is that entry (the variable `TB_FIRST_CALL` names it).
//!
//! Entries that take a cudarc stream or a `DeviceBuffer` cannot come first (making one is a
//! CUDA call); the others are all here. Tensors are empty device tensors (no memory needed)
//! ready on the legacy default stream, so the entry must reach the driver.

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Result, bail, ensure};
use tensorbridge_core::{
    Access, DType, Descriptor, Device, Layout, Packing, Ready, Stream, Tensor,
};
use tensorbridge_cuda::{Error, StreamLife};

use crate::{serial, wait_until};

/// The variable that makes a re-run of this binary the child for one entry.
const ENV: &str = "TB_FIRST_CALL";

/// This test's name, as the harness filters it.
const SELF: &str = "first_call::every_public_entry_works_as_a_processes_first_cuda_call";

/// The entries, each run first in a process of its own.
const ENTRIES: &[&str] = &[
    "primary_context",
    "current_device",
    "ContextGuard::save",
    "inspect",
    "check_span",
    "make_ready_on_raw",
    "handoff_raw",
    "record_ready",
    "settle",
    "synchronize",
    "wait_ready",
    "CudaSignal::record_raw",
    "retire_on_raw",
    "retire_all_on_raw",
    "with_stream_raw",
    "with_stream_raw (call only)",
    "reclaim",
    "copy::DeviceBuffer::alloc",
    "copy::to_host",
];

#[test]
fn every_public_entry_works_as_a_processes_first_cuda_call() -> Result<()> {
    if let Ok(entry) = std::env::var(ENV) {
        return child(&entry);
    }
    let _serial = serial();
    let exe = std::env::current_exe()?;
    let mut failed = Vec::new();
    for entry in ENTRIES {
        let out = Command::new(&exe)
            .args(["--exact", SELF, "--nocapture", "--test-threads=1"])
            .env(ENV, entry)
            .output()?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if out.status.success() && text.contains("1 passed") {
            println!("first call {entry}: ok");
        } else {
            println!("first call {entry}: FAILED ({})\n{text}", out.status);
            failed.push(*entry);
        }
    }
    ensure!(failed.is_empty(), "failed as a first CUDA call: {failed:?}");
    Ok(())
}

/// An empty float32 tensor on cuda:0 (no memory), ready on the legacy default stream.
fn empty_on_legacy() -> Result<Tensor> {
    let desc = Descriptor::new(
        0,
        Device::cuda(0),
        DType::FLOAT32,
        Packing::Packed,
        Layout::row_major(&[0])?,
        Access::ReadWrite,
    )?;
    // SAFETY: no element, no byte to keep valid.
    let t = unsafe { Tensor::from_descriptor(desc, Arc::new(())) };
    // SAFETY: 1: nothing to be ready; 2: the legacy default stream is always live; 3: not
    // the per-thread default stream.
    Ok(unsafe { t.with_ready(Ready::Stream(Stream::LegacyDefault)) })
}

/// Counts its drops.
struct Counted(Arc<AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// The child: `entry` is this process's first CUDA call.
fn child(entry: &str) -> Result<()> {
    let t = empty_on_legacy()?;
    let not_an_allocation = |r: Result<_, Error>| -> Result<()> {
        match r {
            Err(Error::NotAllocation { .. }) => Ok(()),
            other => bail!("expected NotAllocation, found {other:?}"),
        }
    };
    match entry {
        "primary_context" => drop(tensorbridge_cuda::primary_context(0)?),
        "current_device" => {
            ensure!(
                tensorbridge_cuda::current_device()?.is_none(),
                "a context was current"
            );
        }
        "ContextGuard::save" => drop(tensorbridge_cuda::ContextGuard::save()?),
        "inspect" => not_an_allocation(tensorbridge_cuda::inspect(0x1000).map(drop))?,
        "check_span" => {
            let desc = Descriptor::new(
                0x1000,
                Device::cuda(0),
                DType::FLOAT32,
                Packing::Packed,
                Layout::row_major(&[4])?,
                Access::ReadWrite,
            )?;
            not_an_allocation(tensorbridge_cuda::check_span(&desc).map(drop))?;
        }
        "make_ready_on_raw" => {
            // SAFETY: this thread's per-thread default stream is live; nothing escapes.
            unsafe { tensorbridge_cuda::make_ready_on_raw(&t, Stream::PerThreadDefault) }?
        }
        "handoff_raw" => {
            // SAFETY: as above; the result is dropped on this thread.
            drop(unsafe { tensorbridge_cuda::handoff_raw(&t, Stream::PerThreadDefault) }?)
        }
        "record_ready" => drop(tensorbridge_cuda::record_ready(&t)?),
        "settle" => drop(tensorbridge_cuda::settle(t.as_ref())?),
        "synchronize" => drop(tensorbridge_cuda::synchronize(&t)?),
        "wait_ready" => tensorbridge_cuda::wait_ready(t.as_ref())?,
        "CudaSignal::record_raw" => {
            // SAFETY: the legacy default stream is always live.
            let s = unsafe { tensorbridge_cuda::CudaSignal::record_raw(0, Stream::LegacyDefault) }?;
            s.synchronize()?;
        }
        "retire_on_raw" | "retire_all_on_raw" => {
            let drops = Arc::new(AtomicUsize::new(0));
            let owner: tensorbridge_core::Owner = Arc::new(Counted(drops.clone()));
            if entry == "retire_on_raw" {
                // SAFETY: the legacy default stream is always live.
                unsafe { tensorbridge_cuda::retire_on_raw(0, Stream::LegacyDefault, owner) };
            } else {
                // SAFETY: as above.
                unsafe { tensorbridge_cuda::retire_all_on_raw(0, Stream::LegacyDefault, [owner]) };
            }
            // A refused event would keep the owner forever: released means it worked.
            ensure!(
                wait_until(Duration::from_secs(5), || drops.load(Ordering::SeqCst) == 1).is_some(),
                "the retired owner was never released"
            );
        }
        "with_stream_raw" | "with_stream_raw (call only)" => {
            let life = if entry == "with_stream_raw" {
                StreamLife::Immortal
            } else {
                StreamLife::CallOnly
            };
            // SAFETY: the legacy default stream is always live.
            unsafe {
                tensorbridge_cuda::with_stream_raw(0, Stream::LegacyDefault, life, |s| {
                    tensorbridge_cuda::make_ready_on(&t, s)
                })
            }??;
        }
        "reclaim" => ensure!(tensorbridge_cuda::reclaim() == 0, "nothing was retired"),
        "copy::DeviceBuffer::alloc" => {
            let b = tensorbridge_cuda::copy::DeviceBuffer::alloc(0, 1 << 20)?;
            ensure!(b.addr() != 0 && b.len() == 1 << 20, "{b:?}");
        }
        "copy::to_host" => {
            // A host tensor (pageable memory: unified addressing copies it) ready now, so the
            // first driver call is the copy's own.
            let src = Tensor::from_vec((0..16).map(|i| i as f32).collect::<Vec<_>>(), &[16])?;
            let mut dst = vec![0.0f32; 16];
            // SAFETY: the 64 bytes of `src` into the 64 of `dst`, disjoint.
            unsafe {
                tensorbridge_cuda::copy::to_host(&src, src.data_ptr(), dst.as_mut_ptr().cast(), 64)
            }?;
            ensure!(dst[15] == 15.0, "{dst:?}");
        }
        other => bail!("unknown entry {other}"),
    }
    Ok(())
}
