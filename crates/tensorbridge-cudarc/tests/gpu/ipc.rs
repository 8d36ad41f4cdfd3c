//! A tensor shared with another process (`tensorbridge_cuda::ipc`): this test binary is the
//! producer, and runs itself again as the consumer (`ipc::child`, which does nothing unless
//! `TB_IPC_CHILD` names a role): it initialises, says it is ready, reads the handle (hex)
//! on its stdin, and prints `IPC <key> <value>` lines the producer reads.
//!
//! Memory comes from `cuMemAlloc` (cudarc's own allocations come from a stream-ordered pool,
//! which legacy IPC refuses: checked below). The producer's owner is counted: released once,
//! and only after the consumer's last device work on the memory has run.

use std::io::{BufRead as _, BufReader, Write as _};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::mpsc::{Receiver, channel};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use cudarc::driver::{CudaContext, CudaStream, sys};
use tensorbridge_core::{Access, DType, Descriptor, Device, Layout, Owner, Packing, Ready, Tensor};
use tensorbridge_cuda::Error;
use tensorbridge_cuda::ipc::{self, IpcHandle, Report};
use tensorbridge_testkit::DropCounter;

use tensorbridge_testkit::gpu::wrong;

use crate::{Affine, Kernels, affine, context, serial};

const N: usize = 1 << 20;
const SPIN_NS: u64 = 100_000_000;

/// A `cuMemAlloc`'d buffer, freed when dropped.
struct RawAlloc {
    ctx: Arc<CudaContext>,
    ptr: u64,
}

impl RawAlloc {
    fn new(ctx: &Arc<CudaContext>, bytes: usize) -> Result<RawAlloc> {
        ctx.bind_to_thread()?;
        let mut ptr = 0;
        // SAFETY: a context is current; the driver writes one pointer into a live local.
        unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes) }.result()?;
        Ok(RawAlloc {
            ctx: ctx.clone(),
            ptr,
        })
    }
}

impl Drop for RawAlloc {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: allocated by `new`, freed once, here.
            let _ = unsafe { sys::cuMemFree_v2(self.ptr) };
        }
    }
}

/// A float32 tensor of `n` elements at `ptr` on cuda:0, ready per `ready`.
///
/// # Safety
/// 1. `owner` keeps `n` floats at `ptr` on cuda:0 allocated until it is dropped;
/// 2. `ready` is true of the data and names only streams that outlive the tensor.
unsafe fn tensor_at(ptr: u64, n: usize, owner: Owner, ready: Ready) -> Result<Tensor> {
    let desc = Descriptor::new(
        ptr as usize,
        Device::cuda(0),
        DType::FLOAT32,
        Packing::Packed,
        Layout::row_major(&[n as i64])?,
        Access::ReadWrite,
    )?;
    // SAFETY: obligation 1.
    let t = unsafe { Tensor::from_descriptor(desc, owner) };
    // SAFETY: obligation 2.
    Ok(unsafe { t.with_ready(ready) })
}

/// `n` floats at device address `ptr`, copied on `stream` (which is then synchronised).
fn to_host(stream: &Arc<CudaStream>, ptr: u64, n: usize) -> Result<Vec<f32>> {
    stream.context().bind_to_thread()?;
    let mut out = vec![0f32; n];
    // SAFETY: `out` holds `n` floats; `ptr` is a live allocation of at least `4 n` bytes the
    // caller names; the copy is complete after the synchronisation below, before `out` is read.
    unsafe { sys::cuMemcpyDtoHAsync_v2(out.as_mut_ptr().cast(), ptr, n * 4, stream.cu_stream()) }
        .result()?;
    stream.synchronize()?;
    Ok(out)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap_or(0))
        .collect()
}

/// The other process: this binary, running only `ipc::child`, in `role`.
struct Peer {
    child: Child,
    lines: Receiver<String>,
    /// What the consumer printed besides `IPC` lines (its test harness, its stage marks):
    /// shown when it fails to answer, so a hang says where the consumer stopped.
    other: std::cell::RefCell<Vec<String>>,
}

impl Drop for Peer {
    /// A consumer that did not finish (the producer failed or gave up on it) is killed, so a
    /// failing test never leaves a process behind holding the GPU or waiting on its stdin.
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Peer {
    /// Starts the consumer in `role` and waits until it is ready (CUDA initialised, kernels
    /// compiled), so that what the producer does next is timed against a consumer that can
    /// act at once.
    fn spawn(role: &str) -> Result<Peer> {
        let mut child = Command::new(std::env::current_exe()?)
            .args(["--exact", "ipc::child", "--nocapture", "--test-threads=1"])
            .env("TB_IPC_CHILD", role)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("running this test binary again as the consumer")?;
        let out = child.stdout.take().context("the child's stdout")?;
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let peer = Peer {
            child,
            lines,
            other: std::cell::RefCell::default(),
        };
        peer.expect("ready")?;
        Ok(peer)
    }

    /// Sends the handle (a line of hex on the consumer's stdin).
    fn send(&mut self, handle: &[u8]) -> Result<()> {
        let stdin = self.child.stdin.as_mut().context("the child's stdin")?;
        writeln!(stdin, "{}", hex(handle))?;
        stdin.flush()?;
        Ok(())
    }

    /// The value of the consumer's next `IPC <key> <value>` line.
    fn expect(&self, key: &str) -> Result<String> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self.lines.recv_timeout(left).with_context(|| {
                format!(
                    "the consumer printed no `IPC {key}` line; its other output: {:?}",
                    self.other.borrow()
                )
            })?;
            if let Some(rest) = line.strip_prefix(&format!("IPC {key} ")) {
                return Ok(rest.to_owned());
            }
            if line.starts_with("IPC ") {
                bail!("expected `IPC {key}`, the consumer said `{line}`");
            }
            self.other.borrow_mut().push(line);
        }
    }

    fn finish(mut self) -> Result<()> {
        // Closes the consumer's stdin: it reads nothing more.
        drop(self.child.stdin.take());
        let status = self.child.wait()?;
        ensure!(status.success(), "the consumer exited with {status}");
        Ok(())
    }
}

/// Polls [`ipc::collect`] until `cond` holds (or 20 s pass); returns when it held.
fn eventually(cond: impl Fn() -> bool) -> Option<Instant> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        ipc::collect();
        if cond() {
            return Some(Instant::now());
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    None
}

// ---- the consumer process ----

/// The consumer side of the tests below; returns at once in an ordinary run.
#[test]
fn child() -> Result<()> {
    let Ok(role) = std::env::var("TB_IPC_CHILD") else {
        return Ok(());
    };
    let say = |key: &str, value: &dyn std::fmt::Display| {
        println!("IPC {key} {value}");
        let _ = std::io::stdout().flush();
    };
    let result = consumer(&role, &say);
    if let Err(e) = &result {
        say("failed", &format!("{e:#}"));
    }
    // Whatever it still holds is released (its device work has run) before it exits.
    while ipc::collect() > 0 {
        std::thread::sleep(Duration::from_millis(1));
    }
    std::process::exit(i32::from(result.is_err()));
}

/// The handle the producer sends: a line of hex on stdin.
fn receive() -> Result<Vec<u8>> {
    let mut line = String::new();
    std::io::stdin().read_line(&mut line)?;
    Ok(unhex(line.trim()))
}

fn consumer(role: &str, say: &dyn Fn(&str, &dyn std::fmt::Display)) -> Result<()> {
    // Stage marks (not `IPC` lines): the producer shows them if this process stops answering.
    let stage = |what: &str| {
        println!("consumer stage: {what}");
        let _ = std::io::stdout().flush();
    };
    stage("context");
    let ctx = context(0)?;
    stage("kernels");
    let k = Kernels::load(&ctx)?;
    stage("stream");
    let c = ctx.new_stream()?;
    stage("allocation");
    let out = RawAlloc::new(&ctx, N * 4)?;
    say("ready", &1);
    let bytes = receive()?;
    ensure!(
        bytes.len() >= 131,
        "the producer sent {} bytes, not a handle (its stdin closed early?)",
        bytes.len()
    );
    if role == "damaged" {
        let mut b = bytes;
        b[130] ^= 4;
        say("error", &IpcHandle::from_bytes(&b).unwrap_err());
        return Ok(());
    }
    if role == "forged" {
        // Twice the allocation, checksum recomputed: the mapped size tells.
        let mut b = bytes;
        let size = u64::from_le_bytes(b[64..72].try_into()?);
        b[64..72].copy_from_slice(&(size * 2).to_le_bytes());
        let n = b.len() - 8;
        let mut h: u64 = 0xcbf29ce484222325;
        for &x in &b[..n] {
            h = (h ^ u64::from(x)).wrapping_mul(0x100000001b3);
        }
        b[n..].copy_from_slice(&h.to_le_bytes());
        let handle = IpcHandle::from_bytes(&b)?;
        say("error", &ipc::import(&handle, &c).unwrap_err());
        return Ok(());
    }
    let handle = IpcHandle::from_bytes(&bytes)?;
    match role {
        "roundtrip" => {
            let t = ipc::import(&handle, &c)?;
            ensure!(t.shape() == [N as i64] && t.device() == Device::cuda(0));
            let seen = to_host(&c, t.data_ptr() as u64, N)?;
            say("wrong", &wrong(&seen, &affine(N, 2.0, 1.0)));
            // Element 0 becomes -1.0 (0xbf800000), on the stream the tensor is ready on.
            c.context().bind_to_thread()?;
            // SAFETY: the tensor's first element, in the mapping the tensor keeps alive.
            unsafe { sys::cuMemsetD32Async(t.data_ptr() as u64, 0xbf80_0000, 1, c.cu_stream()) }
                .result()?;
            c.synchronize()?;
            say("written", &1);
        }
        "busy" | "race" => {
            let t = ipc::import(&handle, &c)?;
            // The ordered copy runs on `c`, which waited for the producer; the control on a
            // fresh stream that did not.
            let on = if role == "busy" {
                c.clone()
            } else {
                ctx.new_stream()?
            };
            let t0 = Instant::now();
            Affine::copy(t.data_ptr() as u64, out.ptr, N).launch(&k, &on)?;
            say("launched_us", &t0.elapsed().as_micros());
            let seen = to_host(&on, out.ptr, N)?;
            say("wrong", &wrong(&seen, &affine(N, 3.0, 0.5)));
        }
        "slowdrop" => {
            let t = ipc::import(&handle, &c)?;
            // A copy that starts 300 ms from now, then every reference dropped at once: the
            // producer must keep the memory until the copy has run.
            Affine::copy(t.data_ptr() as u64, out.ptr, N)
                .after(300_000_000)
                .launch(&k, &c)?;
            drop(t);
            let dropped = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
            say("dropped_ms", &dropped.as_millis());
            let seen = to_host(&c, out.ptr, N)?;
            say("wrong", &wrong(&seen, &affine(N, 2.0, 1.0)));
        }
        "leak" => {
            let t = ipc::import(&handle, &c)?;
            // Dropped inside a capture of `c`: the hold is kept with the graph, which is
            // never destroyed (forgotten), so its retirement never completes.
            c.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)?;
            drop(t);
            // SAFETY: zero is the default flag set (no bits).
            let flags = unsafe { std::mem::transmute::<u32, sys::CUgraphInstantiate_flags>(0) };
            std::mem::forget(c.end_capture(flags)?);
            ensure!(
                ipc::collect() >= 1,
                "the hold kept with the graph counts as waiting"
            );
            // A second later no ipc reaper may be running (one started when the tensor was
            // dropped, and polled every 50 ms for ever, before).
            std::thread::sleep(Duration::from_secs(1));
            say("reapers", &reapers());
            // The hold is kept for good: exit without waiting for it (as `child` would).
            std::process::exit(0);
        }
        "hold" => {
            let t = ipc::import(&handle, &c)?;
            say("held", &std::process::id());
            std::thread::sleep(Duration::from_secs(120));
            drop(t);
        }
        other => bail!("unknown role {other}"),
    }
    Ok(())
}

/// Threads of this process named as the ipc reaper (`comm` keeps 15 bytes of a name).
fn reapers() -> usize {
    let name = &"tensorbridge-ipc-reaper"[..15];
    std::fs::read_dir("/proc/self/task")
        .map(|tasks| {
            tasks
                .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
                .filter(|comm| comm.trim_end() == name)
                .count()
        })
        .unwrap_or(usize::MAX)
}

// ---- the producer's tests ----

/// A producer's buffer, filled with `affine(N, scale, offset)` on `a` (after `spin_ns`), as
/// a counted tensor ready on `a`.
fn producer(
    ctx: &Arc<CudaContext>,
    k: &Kernels,
    a: &Arc<CudaStream>,
    counter: &DropCounter,
    (scale, offset, spin_ns): (f32, f32, u64),
) -> Result<(Tensor, u64)> {
    let alloc = RawAlloc::new(ctx, N * 4)?;
    let ptr = alloc.ptr;
    Affine::fill(ptr, N, scale, offset)
        .after(spin_ns)
        .launch(k, a)?;
    // SAFETY:
    // - 1: the owner holds the allocation of N floats;
    // - 2: the fill is the only write, on `a`, which every test keeps alive past the tensor
    //   (the share's tensor clone is dropped when the share is freed, which each test waits
    //   for, or `a` lives to the end of the process's test).
    let t = unsafe {
        tensor_at(
            ptr,
            N,
            counter.owner_with(alloc),
            Ready::Stream(tensorbridge_cuda::stream_of(a)),
        )
    }?;
    Ok((t, ptr))
}

#[test]
fn ipc_roundtrip_writes_both_ways_and_releases_once() -> Result<()> {
    let _serial = serial();
    let ctx = context(0)?;
    let k = Kernels::load(&ctx)?;
    let a = ctx.new_stream()?;
    let counter = DropCounter::new();
    let (t, ptr) = producer(&ctx, &k, &a, &counter, (2.0, 1.0, 0))?;
    let shared = ipc::export(&t, 1)?;
    drop(t);
    let mut peer = Peer::spawn("roundtrip")?;
    peer.send(shared.handle().as_bytes())?;
    assert_eq!(peer.expect("wrong")?, "0", "the consumer read other values");
    assert_eq!(peer.expect("written")?, "1");
    peer.finish()?;
    let first = to_host(&a, ptr, 2)?;
    assert_eq!(
        first[0], -1.0,
        "the producer does not see the consumer's write"
    );
    assert_eq!(first[1], 3.0);
    assert_eq!(shared.tickets_left(), 0, "the consumer took its ticket");
    drop(shared);
    eventually(|| counter.drops() == 1).context("the memory was never released")?;
    std::thread::sleep(Duration::from_millis(100));
    ipc::collect();
    assert_eq!(counter.drops(), 1, "released exactly once");
    Ok(())
}

#[test]
fn ipc_busy_producer_is_waited_for_on_the_gpu_and_the_control_races() -> Result<()> {
    let _serial = serial();
    let ctx = context(0)?;
    let k = Kernels::load(&ctx)?;
    let a = ctx.new_stream()?;
    for role in ["busy", "race"] {
        let counter = DropCounter::new();
        let mut peer = Peer::spawn(role)?;
        let (t, _) = producer(&ctx, &k, &a, &counter, (3.0, 0.5, SPIN_NS))?;
        let written = a.record_event(None)?;
        let t0 = Instant::now();
        let shared = ipc::export(&t, 1)?;
        let t_export = t0.elapsed();
        drop(t);
        peer.send(shared.handle().as_bytes())?;
        let launched_us: u64 = peer.expect("launched_us")?.parse()?;
        let busy_after = !written.is_complete();
        let wrong: usize = peer.expect("wrong")?.parse()?;
        peer.finish()?;
        println!(
            "{role}: export {t_export:?}, consumer launch {launched_us} us, producer busy after it: {busy_after}, wrong {wrong}"
        );
        if role == "busy" {
            assert!(t_export < Duration::from_millis(20), "export kept the host");
            assert!(
                busy_after,
                "the producer finished before the consumer had launched: a host waited"
            );
            assert_eq!(
                wrong, 0,
                "the consumer read before the producer had written"
            );
        } else {
            assert!(
                wrong > 0,
                "the unordered control read final values: no race was shown"
            );
        }
        drop(shared);
        a.synchronize()?;
        eventually(|| counter.drops() == 1).context("not released")?;
    }
    Ok(())
}

#[test]
fn ipc_memory_stays_until_the_consumer_has_read_it() -> Result<()> {
    let _serial = serial();
    let ctx = context(0)?;
    let k = Kernels::load(&ctx)?;
    let a = ctx.new_stream()?;
    let counter = DropCounter::new();
    let (t, _) = producer(&ctx, &k, &a, &counter, (2.0, 1.0, 0))?;
    a.synchronize()?;
    let shared = ipc::export(&t, 1)?;
    let bytes = shared.handle().as_bytes().to_vec();
    drop((t, shared));
    ipc::collect();
    assert_eq!(counter.drops(), 0, "freed with a ticket outstanding");
    let mut peer = Peer::spawn("slowdrop")?;
    peer.send(&bytes)?;
    let dropped_ms: u128 = peer.expect("dropped_ms")?.parse()?;
    let released = eventually(|| counter.drops() == 1).context("not released")?;
    let released_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis()
        - released.elapsed().as_millis();
    assert_eq!(peer.expect("wrong")?, "0", "the consumer read freed memory");
    peer.finish()?;
    assert!(
        released_ms >= dropped_ms + 250,
        "released {} ms after the consumer dropped, before its 300 ms-late read had run",
        released_ms.saturating_sub(dropped_ms)
    );
    assert_eq!(counter.drops(), 1);
    Ok(())
}

#[test]
fn ipc_a_killed_consumer_is_reaped_and_reported() -> Result<()> {
    let _serial = serial();
    let ctx = context(0)?;
    let k = Kernels::load(&ctx)?;
    let a = ctx.new_stream()?;
    let counter = DropCounter::new();
    let (t, _) = producer(&ctx, &k, &a, &counter, (2.0, 1.0, 0))?;
    let shared = ipc::export(&t, 1)?;
    drop(t);
    let mut peer = Peer::spawn("hold")?;
    peer.send(shared.handle().as_bytes())?;
    let pid: u32 = peer.expect("held")?.parse()?;
    assert_eq!(shared.holders(), [pid]);
    drop(shared);
    std::thread::sleep(Duration::from_millis(300));
    ipc::collect();
    assert_eq!(counter.drops(), 0, "freed while the consumer held it");
    let _ = ipc::reports();
    peer.child.kill()?;
    peer.child.wait()?;
    eventually(|| counter.drops() == 1).context("the dead consumer's hold was never taken back")?;
    assert!(ipc::reports().contains(&Report::ConsumerDied { pid }));
    Ok(())
}

#[test]
fn ipc_a_hold_kept_for_ever_does_not_keep_the_reaper_polling() -> Result<()> {
    let _serial = serial();
    let ctx = context(0)?;
    let k = Kernels::load(&ctx)?;
    let a = ctx.new_stream()?;
    let counter = DropCounter::new();
    let (t, _) = producer(&ctx, &k, &a, &counter, (2.0, 1.0, 0))?;
    let shared = ipc::export(&t, 1)?;
    drop(t);
    let mut peer = Peer::spawn("leak")?;
    peer.send(shared.handle().as_bytes())?;
    let running: usize = peer.expect("reapers")?.parse()?;
    ensure!(
        running == 0,
        "expected the consumer's ipc reaper to stop when only a hold kept with a graph is left, found {running} running"
    );
    peer.finish()?;
    drop(shared);
    // The consumer exited holding the share: taken back, reported, freed once.
    eventually(|| counter.drops() == 1)
        .context("the exited consumer's hold was never taken back")?;
    let _ = ipc::reports();
    Ok(())
}

#[test]
fn ipc_damaged_and_forged_handles_are_refused_in_the_consumer() -> Result<()> {
    let _serial = serial();
    let ctx = context(0)?;
    let k = Kernels::load(&ctx)?;
    let a = ctx.new_stream()?;
    let counter = DropCounter::new();
    let (t, _) = producer(&ctx, &k, &a, &counter, (2.0, 1.0, 0))?;
    let shared = ipc::export(&t, 0)?;
    for (role, expected) in [("damaged", "checksum"), ("forged", "allocation size")] {
        let mut peer = Peer::spawn(role)?;
        peer.send(shared.handle().as_bytes())?;
        let said = peer.expect("error")?;
        peer.finish()?;
        assert!(said.contains(expected), "{role}: {said}");
    }
    Ok(())
}

#[test]
fn ipc_open_in_the_producer_process_is_the_producer_tensor() -> Result<()> {
    let _serial = serial();
    let ctx = context(0)?;
    let k = Kernels::load(&ctx)?;
    let a = ctx.new_stream()?;
    let c = ctx.new_stream()?;
    let counter = DropCounter::new();
    let (t, ptr) = producer(&ctx, &k, &a, &counter, (2.0, 1.0, 0))?;
    let shared = ipc::export(&t, 1)?;
    let mine = ipc::import(shared.handle(), &c)?;
    assert_eq!(mine.data_ptr() as u64, ptr);
    assert_eq!(shared.tickets_left(), 0);
    drop((t, shared));
    ipc::collect();
    assert_eq!(
        counter.drops(),
        0,
        "the imported tensor still holds the memory"
    );
    drop(mine);
    assert_eq!(counter.drops(), 1);
    Ok(())
}

#[test]
fn ipc_refuses_memory_legacy_ipc_cannot_share() -> Result<()> {
    let _serial = serial();
    let ctx = context(0)?;
    let a = ctx.new_stream()?;
    ctx.bind_to_thread()?;
    let bytes = 1 << 21;
    // A stream-ordered pool (cudarc's allocations come from one).
    let mut pooled = 0;
    // SAFETY: a context is current; the driver writes one pointer; freed below.
    unsafe { sys::cuMemAllocAsync(&mut pooled, bytes, a.cu_stream()) }.result()?;
    a.synchronize()?;
    // SAFETY: the allocation holds `bytes`; the tensor is dropped before it is freed.
    let t = unsafe { tensor_at(pooled, 1024, Arc::new(()), Ready::Now) }?;
    let r = ipc::export(&t, 1);
    assert!(matches!(r, Err(Error::IpcPoolMemory { .. })), "{r:?}");
    drop(t);
    // SAFETY: allocated above, freed once.
    unsafe { sys::cuMemFreeAsync(pooled, a.cu_stream()) }.result()?;
    // Managed memory.
    let mut managed = 0;
    let global = sys::CUmemAttach_flags::CU_MEM_ATTACH_GLOBAL as u32;
    // SAFETY: as above.
    unsafe { sys::cuMemAllocManaged(&mut managed, bytes, global) }.result()?;
    // SAFETY: as above.
    let t = unsafe { tensor_at(managed, 1024, Arc::new(()), Ready::Now) }?;
    let r = ipc::export(&t, 1);
    assert!(
        matches!(
            r,
            Err(Error::IpcMemoryType { .. } | Error::MemoryTypeMismatch { .. })
        ),
        "{r:?}"
    );
    drop(t);
    // SAFETY: allocated above, freed once.
    unsafe { sys::cuMemFree_v2(managed) }.result()?;
    // A virtual memory mapping (as PyTorch's expandable segments make).
    let (vmm, size, handle) = vmm_alloc(bytes)?;
    // SAFETY: as above.
    let t = unsafe { tensor_at(vmm, 1024, Arc::new(()), Ready::Now) }?;
    let r = ipc::export(&t, 1);
    assert!(matches!(r, Err(Error::IpcVirtualMemory { .. })), "{r:?}");
    drop(t);
    ctx.bind_to_thread()?;
    // SAFETY: the mapping `vmm_alloc` made, undone once.
    unsafe { sys::cuMemUnmap(vmm, size) }.result()?;
    // SAFETY: its reservation, freed once.
    unsafe { sys::cuMemAddressFree(vmm, size) }.result()?;
    // SAFETY: its allocation handle, released once.
    unsafe { sys::cuMemRelease(handle) }.result()?;
    Ok(())
}

/// `bytes` (rounded up to the granularity) of device 0 memory through the virtual memory
/// management API: created, mapped at a reserved address, readable and writable.
fn vmm_alloc(bytes: usize) -> Result<(u64, usize, sys::CUmemGenericAllocationHandle)> {
    // SAFETY: a plain C struct for which all zeros is a valid (empty) value.
    let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = 0;
    let mut gran = 0usize;
    let minimum = sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM;
    // SAFETY: `prop` is a valid description; the driver writes one value.
    unsafe { sys::cuMemGetAllocationGranularity(&mut gran, &prop, minimum) }.result()?;
    let size = bytes.div_ceil(gran) * gran;
    let mut handle = 0;
    // SAFETY: as above; the driver writes one handle.
    unsafe { sys::cuMemCreate(&mut handle, size, &prop, 0) }.result()?;
    let mut ptr = 0;
    // SAFETY: reserves address space; the driver writes one address.
    unsafe { sys::cuMemAddressReserve(&mut ptr, size, 0, 0, 0) }.result()?;
    // SAFETY: maps the whole allocation at the reservation.
    unsafe { sys::cuMemMap(ptr, size, 0, handle, 0) }.result()?;
    // SAFETY: a plain C struct; all zeros is valid.
    let mut access: sys::CUmemAccessDesc = unsafe { std::mem::zeroed() };
    access.location = prop.location;
    access.flags = sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    // SAFETY: one access descriptor for the mapped range.
    unsafe { sys::cuMemSetAccess(ptr, size, &access, 1) }.result()?;
    Ok((ptr, size, handle))
}
