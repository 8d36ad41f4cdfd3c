//! Retired owners are released a bounded time after the device finishes their work, with no
//! further tensorbridge call, by a thread that sleeps meanwhile (no core spun): never before
//! the work ends, soon after it, one stream never holding up another's, and with no lock
//! held while an owner drops (an owner that calls the layer back from its drop).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use tensorbridge_core::Stream;

use crate::{Affine, Kernels, context, serial, wait_until};

/// How long the busy kernel spins.
const BUSY: Duration = Duration::from_millis(300);
/// The most a release may come after the work ends (the reaper's wake-up and the drop).
const BOUND: Duration = Duration::from_millis(100);

/// An owner that records when it was dropped (and runs `on_drop` first, if any).
struct Stamped {
    at: Arc<Mutex<Option<Instant>>>,
    on_drop: Option<Box<dyn Fn() + Send + Sync>>,
}

impl Drop for Stamped {
    fn drop(&mut self) {
        if let Some(f) = &self.on_drop {
            f();
        }
        *self.at.lock().unwrap() = Some(Instant::now());
    }
}

fn stamped() -> (tensorbridge_core::Owner, Arc<Mutex<Option<Instant>>>) {
    let at = Arc::new(Mutex::new(None));
    let owner: tensorbridge_core::Owner = Arc::new(Stamped {
        at: at.clone(),
        on_drop: None,
    });
    (owner, at)
}

/// This process's CPU time (user + system) so far, from `/proc/self/stat` (clock ticks of
/// 10 ms on Linux).
fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command (which may hold spaces) start after the last ')'.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line: 11 and 12 after the state.
    let ticks: u64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i)?.parse::<u64>().ok())
        .sum();
    Duration::from_millis(ticks * 10)
}

/// A spin of `spin` on `stream`, writing a scratch buffer afterwards.
fn busy(k: &Kernels, stream: &Arc<cudarc::driver::CudaStream>, spin: Duration) -> Result<u64> {
    let scratch = stream.alloc_zeros::<f32>(1 << 10)?;
    let ptr = crate::dptr(&scratch);
    Affine::fill(ptr, 1 << 10, 1.0, 0.0)
        .after(spin.as_nanos() as u64)
        .launch(k, stream)?;
    // The buffer is freed by cudarc on its stream, after the kernel.
    drop(scratch);
    Ok(ptr)
}

#[test]
fn owners_are_released_soon_after_their_work_with_no_further_call() -> Result<()> {
    let _serial = serial();
    let ctx = context(0)?;
    let k = Kernels::load(&ctx)?;
    let s = ctx.new_stream()?;
    // Warm up: the reaper's thread, the event pool.
    tensorbridge_cuda::retire_on(&s, Arc::new(()));
    s.synchronize()?;
    std::thread::sleep(Duration::from_millis(20));

    let (owner, at) = stamped();
    let start = Instant::now();
    busy(&k, &s, BUSY)?;
    tensorbridge_cuda::retire_on(&s, owner);
    ensure!(at.lock().unwrap().is_none(), "released before the work ran");
    // No tensorbridge call, no host wait on the device: the main thread sleeps.
    let cpu_before = cpu_time();
    std::thread::sleep(BUSY + BOUND + Duration::from_millis(100));
    let cpu = cpu_time().saturating_sub(cpu_before);
    let released = at
        .lock()
        .unwrap()
        .ok_or_else(|| anyhow::anyhow!("not released {:?} after the call", start.elapsed()))?;
    let after = released - start;
    println!("released {after:?} after the call (work: {BUSY:?}); process CPU meanwhile: {cpu:?}");
    ensure!(
        after >= BUSY,
        "released {after:?} after the call: before the work ended"
    );
    ensure!(
        after <= BUSY + BOUND,
        "released {after:?} after the call: more than {BOUND:?} after the work"
    );
    // A thread spinning on the event would show as ~300 ms of CPU.
    ensure!(
        cpu < BUSY / 2,
        "{cpu:?} of CPU while the reaper waited {BUSY:?}: it spins"
    );
    Ok(())
}

#[test]
fn a_batch_behind_one_event_is_released_together_after_its_work() -> Result<()> {
    let _serial = serial();
    let ctx = context(0)?;
    let k = Kernels::load(&ctx)?;
    let s = ctx.new_stream()?;
    let stamps: Vec<_> = (0..8).map(|_| stamped()).collect();
    let start = Instant::now();
    busy(&k, &s, BUSY)?;
    tensorbridge_cuda::retire_all_on(&s, stamps.iter().map(|(o, _)| o.clone()));
    let ats: Vec<_> = stamps.into_iter().map(|(_, at)| at).collect();
    std::thread::sleep(BUSY / 2);
    ensure!(
        ats.iter().all(|a| a.lock().unwrap().is_none()),
        "released before the work ended"
    );
    let done = wait_until(BUSY + BOUND * 2, || {
        ats.iter().all(|a| a.lock().unwrap().is_some())
    });
    ensure!(done.is_some(), "not all of the batch was released");
    for a in &ats {
        let after = a.lock().unwrap().unwrap_or(start) - start;
        ensure!(
            after >= BUSY && after <= BUSY + BOUND,
            "released {after:?} after the call"
        );
    }
    // The raw form, on the legacy default stream.
    let (owner, at) = stamped();
    busy(&k, &ctx.default_stream(), BUSY / 3)?;
    // SAFETY: device 0's legacy default stream is always live.
    unsafe { tensorbridge_cuda::retire_all_on_raw(0, Stream::LegacyDefault, [owner]) };
    ensure!(
        wait_until(BUSY + BOUND, || at.lock().unwrap().is_some()).is_some(),
        "retire_all_on_raw: not released"
    );
    Ok(())
}

#[test]
fn a_slow_stream_does_not_hold_up_another_streams_releases() -> Result<()> {
    let _serial = serial();
    let ctx = context(0)?;
    let k = Kernels::load(&ctx)?;
    let (slow, quick) = (ctx.new_stream()?, ctx.new_stream()?);
    let (slow_owner, slow_at) = stamped();
    let (quick_owner, quick_at) = stamped();
    let start = Instant::now();
    busy(&k, &slow, BUSY * 3)?;
    tensorbridge_cuda::retire_on(&slow, slow_owner);
    busy(&k, &quick, BUSY / 3)?;
    tensorbridge_cuda::retire_on(&quick, quick_owner);
    let quick_done = wait_until(BUSY, || quick_at.lock().unwrap().is_some());
    ensure!(
        quick_done.is_some(),
        "the quick stream's owner waited for the slow stream's work"
    );
    ensure!(
        slow_at.lock().unwrap().is_none(),
        "the slow stream's owner was released before its work ended"
    );
    println!(
        "quick stream's owner released {:?} after the call, the slow stream still busy",
        start.elapsed()
    );
    ensure!(
        wait_until(BUSY * 3 + BOUND, || slow_at.lock().unwrap().is_some()).is_some(),
        "the slow stream's owner was never released"
    );
    Ok(())
}

/// An owner whose drop calls the layer again (as a cudarc buffer or a Python owner does):
/// no lock of the layer is held while it drops, so nothing deadlocks.
#[test]
fn owners_that_call_the_layer_back_while_dropping_do_not_deadlock() -> Result<()> {
    let _serial = serial();
    let ctx = context(0)?;
    let k = Kernels::load(&ctx)?;
    let s = ctx.new_stream()?;
    let inner = stamped();
    let inner_owner = Mutex::new(Some(inner.0));
    let outer_at = Arc::new(Mutex::new(None));
    let owner: tensorbridge_core::Owner = Arc::new(Stamped {
        at: outer_at.clone(),
        on_drop: Some(Box::new(move || {
            tensorbridge_cuda::reclaim();
            if let Some(o) = inner_owner.lock().unwrap().take() {
                // SAFETY: device 0's legacy default stream is always live.
                unsafe { tensorbridge_cuda::retire_on_raw(0, Stream::LegacyDefault, o) };
            }
        })),
    });
    busy(&k, &s, BUSY / 3)?;
    tensorbridge_cuda::retire_on(&s, owner);
    ensure!(
        wait_until(Duration::from_secs(5), || {
            outer_at.lock().unwrap().is_some() && inner.1.lock().unwrap().is_some()
        })
        .is_some(),
        "an owner retiring another from its drop was not released (deadlock?)"
    );
    Ok(())
}
