//! `tensorbridge_cuda::ipc` across processes, with copies only (no kernels), so that it runs
//! on the stand-in as on a GPU: values arrive, writes are seen both ways, the memory is
//! released exactly once and only when every consumer has let go (tickets, holders, a
//! consumer that exits holding it), and damaged, altered or orphaned handles are refused with
//! typed errors in the consumer.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Result, bail, ensure};
use cudarc::driver::{CudaStream, DevicePtr as _};
use tensorbridge_core::{Owner, Ready};
use tensorbridge_cuda::Error;
use tensorbridge_cuda::ipc::{self, IpcHandle, Report};
use tensorbridge_testkit::DropCounter;

use crate::{
    Io, Peer, RawAlloc, altered, context, eventually, from_host, hex, pattern, serial, tensor_at,
    to_host, unhex,
};

/// Elements of every shared tensor: 16 KiB, a whole number of pages, so that on the stand-in
/// the guard page follows the last element directly.
pub(crate) const N: usize = 4096;

/// A producer's tensor: `N` floats of [`pattern`] in a fresh `cuMemAlloc` allocation, owned
/// by a counted owner that also frees the allocation, ready on `a` (so an export records an
/// interprocess event for it).
fn produce(a: &Arc<CudaStream>, counter: &DropCounter) -> Result<(tensorbridge_core::Tensor, u64)> {
    let alloc = RawAlloc::new(a.context(), N * 4)?;
    from_host(a, alloc.ptr, &pattern(N))?;
    let ptr = alloc.ptr;
    let owner: Owner = counter.owner_with(alloc);
    let ordinal = a.context().ordinal() as u32;
    // SAFETY: the owner keeps the allocation of `N` floats on `a`'s device (it frees it when
    // dropped); `a` outlives the tensor (each test keeps it to its end, after the release is
    // awaited).
    let t = unsafe {
        tensor_at(
            ptr,
            N,
            ordinal,
            owner,
            Ready::Stream(tensorbridge_cuda::stream_of(a)),
        )
    }?;
    Ok((t, ptr))
}

// ---- the child process ----

/// The child's roles.
pub(crate) fn child(role: &str, io: &Io) -> Result<()> {
    let ctx = context(0)?;
    let c = ctx.new_stream()?;
    if role == "produce" {
        return produce_and_exit(&c, io);
    }
    io.say("ready", &1);
    let bytes = io.handle()?;
    let handle = match role {
        "damaged" => {
            let mut b = bytes;
            b[130] ^= 4;
            io.say("error", &format!("{:?}", IpcHandle::from_bytes(&b).err()));
            return Ok(());
        }
        // Twice the allocation's size.
        "size" => {
            let size = u64::from_le_bytes(bytes[64..72].try_into()?);
            IpcHandle::from_bytes(&altered(&bytes, 64, &(size * 2).to_le_bytes()))?
        }
        // A GPU no process here has.
        "uuid" => IpcHandle::from_bytes(&altered(&bytes, 96, &[0xee; 16]))?,
        // A memory handle the driver never made.
        "memory" => IpcHandle::from_bytes(&altered(&bytes, 112, &[0x5a; 64]))?,
        _ => IpcHandle::from_bytes(&bytes)?,
    };
    match role {
        "otheruser" => {
            // After the driver is loaded and initialised (its file may be unreadable to that
            // user): only what the share itself checks stands between the users.
            // SAFETY (each call): a plain system call on this process's credentials; no
            // memory is passed.
            // SAFETY: see above.
            let groups = unsafe { libc::setgroups(0, std::ptr::null()) };
            // SAFETY: see above.
            let gid = unsafe { libc::setgid(65534) };
            // SAFETY: see above.
            let uid = unsafe { libc::setuid(65534) };
            ensure!(
                groups == 0 && gid == 0 && uid == 0,
                "could not become uid 65534"
            );
            io.say("error", &format!("{:?}", ipc::import(&handle, &c).err()));
        }
        "size" | "uuid" | "memory" | "uuid-blind" => {
            io.say("error", &format!("{:?}", ipc::import(&handle, &c).err()));
        }
        "consume" => {
            let t = ipc::import(&handle, &c)?;
            ensure!(t.shape() == [N as i64], "shape {:?}", t.shape());
            io.say("device", &t.device());
            let seen = to_host(&c, t.data_ptr() as u64, N)?;
            let wrong = seen
                .iter()
                .zip(pattern(N))
                .filter(|(a, b)| **a != *b)
                .count();
            io.say("wrong", &wrong);
            from_host(&c, t.data_ptr() as u64, &[-1.0])?;
            io.say("written", &1);
            ensure!(io.line()? == "look", "expected `look`");
            io.say("seen", &to_host(&c, t.data_ptr() as u64 + 4, 1)?[0]);
        }
        "hold" => {
            let t = ipc::import(&handle, &c)?;
            io.say("held", &std::process::id());
            match io.line()?.as_str() {
                // Exits holding the share: no release reaches the producer.
                "die" => {
                    std::mem::forget(t);
                    std::process::exit(0);
                }
                "release" => drop(t),
                other => bail!("unknown command {other:?}"),
            }
        }
        "readpast" => {
            let t = ipc::import(&handle, &c)?;
            let end = t.data_ptr() + N * 4;
            // SAFETY: the tensor's last byte, host-readable on the stand-in (device memory is
            // host memory there; this role only runs on it), mapped while `t` lives.
            let last = unsafe { std::ptr::read_volatile((end - 1) as *const u8) };
            io.say("last", &last);
            // SAFETY: deliberately not: the byte after the mapping, which must fault (the
            // producer checks that this process dies of it). Nothing is written.
            let past = unsafe { std::ptr::read_volatile(end as *const u8) };
            io.say("survived", &past);
        }
        other => bail!("unknown role {other}"),
    }
    Ok(())
}

/// The child as the producer: shares a tensor with one expected consumer, says the handle,
/// and exits (its memory goes with it) when told to.
fn produce_and_exit(a: &Arc<CudaStream>, io: &Io) -> Result<()> {
    let counter = DropCounter::new();
    let (t, _) = produce(a, &counter)?;
    let shared = ipc::export(&t, 1)?;
    io.say("ready", &1);
    io.say("handle", &hex(shared.handle().as_bytes()));
    let _ = io.line()?;
    std::process::exit(0);
}

// ---- the producer's tests ----

#[test]
fn share_roundtrip_values_and_writes_both_ways_release_once() -> Result<()> {
    let _serial = serial();
    let ctx = context(0)?;
    let a = ctx.new_stream()?;
    let counter = DropCounter::new();
    let (t, ptr) = produce(&a, &counter)?;
    let shared = ipc::export(&t, 1)?;
    drop(t);
    let mut peer = Peer::spawn("consume", &[])?;
    peer.send(&hex(shared.handle().as_bytes()))?;
    assert_eq!(peer.expect("device")?, "cuda:0");
    assert_eq!(peer.expect("wrong")?, "0", "the consumer read other values");
    peer.expect("written")?;
    assert_eq!(
        to_host(&a, ptr, 1)?,
        [-1.0],
        "the consumer's write is not seen here"
    );
    from_host(&a, ptr + 4, &[42.0])?;
    peer.send("look")?;
    assert_eq!(peer.expect("seen")?, "42", "this write is not seen there");
    peer.finish()?;
    assert_eq!(shared.tickets_left(), 0, "the consumer took its ticket");
    ensure!(
        eventually(|| shared.holders().is_empty()),
        "the consumer's hold stayed"
    );
    assert_eq!(
        counter.drops(),
        0,
        "released while the producer's handle lives"
    );
    drop(shared);
    ensure!(eventually(|| counter.drops() == 1), "never released");
    std::thread::sleep(Duration::from_millis(50));
    ipc::collect();
    assert_eq!(counter.drops(), 1, "released exactly once");
    Ok(())
}

#[test]
fn tickets_keep_the_memory_until_every_expected_consumer_has_been() -> Result<()> {
    let _serial = serial();
    let ctx = context(0)?;
    let a = ctx.new_stream()?;
    let counter = DropCounter::new();
    let (t, _) = produce(&a, &counter)?;
    let shared = ipc::export(&t, 2)?;
    drop(t);
    let bytes = hex(shared.handle().as_bytes());
    assert_eq!(shared.tickets_left(), 2);
    let mut first = Peer::spawn("hold", &[])?;
    first.send(&bytes)?;
    let pid: u32 = first.expect("held")?.parse()?;
    assert_eq!(pid, first.pid());
    assert_eq!(shared.holders(), [pid], "the holder is listed");
    assert_eq!(shared.tickets_left(), 1, "its ticket is taken");
    first.send("release")?;
    first.finish()?;
    ensure!(
        eventually(|| shared.holders().is_empty()),
        "its hold stayed"
    );
    // One ticket left: the producer's handle goes, the memory stays.
    drop(shared);
    std::thread::sleep(Duration::from_millis(50));
    ipc::collect();
    assert_eq!(counter.drops(), 0, "freed with a ticket outstanding");
    let mut second = Peer::spawn("hold", &[])?;
    second.send(&bytes)?;
    second.expect("held")?;
    assert_eq!(
        counter.drops(),
        0,
        "freed while the second consumer holds it"
    );
    second.send("release")?;
    second.finish()?;
    ensure!(eventually(|| counter.drops() == 1), "never released");
    Ok(())
}

#[test]
fn a_consumer_that_exits_holding_the_share_is_reaped_and_reported() -> Result<()> {
    let _serial = serial();
    let ctx = context(0)?;
    let a = ctx.new_stream()?;
    let counter = DropCounter::new();
    let (t, _) = produce(&a, &counter)?;
    let shared = ipc::export(&t, 1)?;
    drop(t);
    let _ = ipc::reports();
    let mut peer = Peer::spawn("hold", &[])?;
    peer.send(&hex(shared.handle().as_bytes()))?;
    let pid: u32 = peer.expect("held")?.parse()?;
    peer.send("die")?;
    peer.finish()?;
    drop(shared);
    ensure!(
        eventually(|| counter.drops() == 1),
        "a dead consumer's hold kept the memory"
    );
    assert!(
        ipc::reports().contains(&Report::ConsumerDied { pid }),
        "the dead consumer was not reported"
    );
    Ok(())
}

#[test]
fn damaged_and_altered_handles_are_refused_in_the_consumer() -> Result<()> {
    let _serial = serial();
    let ctx = context(0)?;
    let a = ctx.new_stream()?;
    let counter = DropCounter::new();
    let (t, _) = produce(&a, &counter)?;
    let shared = ipc::export(&t, 0)?;
    drop(t);
    let bytes = hex(shared.handle().as_bytes());
    for (role, expected) in [
        ("damaged", "Some(IpcHandleChecksum"),
        ("size", "Some(IpcHandleField"),
        ("uuid", "Some(IpcDeviceNotVisible"),
        ("memory", "Some(Driver"),
    ] {
        let mut peer = Peer::spawn(role, &[])?;
        peer.send(&bytes)?;
        let error = peer.expect("error")?;
        assert!(error.starts_with(expected), "{role}: {error}");
        peer.finish()?;
    }
    ensure!(
        eventually(|| shared.holders().is_empty()),
        "a refused open left a hold"
    );
    drop(shared);
    ensure!(eventually(|| counter.drops() == 1), "never released");
    Ok(())
}

#[test]
fn another_user_cannot_open_a_share() -> Result<()> {
    // SAFETY: reads this process's effective user id; touches no memory.
    if unsafe { libc::geteuid() } != 0 {
        println!("skipped: needs root, to switch the consumer to another user (CI runs as root)");
        return Ok(());
    }
    let _serial = serial();
    let ctx = context(0)?;
    let a = ctx.new_stream()?;
    let counter = DropCounter::new();
    let (t, _) = produce(&a, &counter)?;
    let shared = ipc::export(&t, 0)?;
    drop(t);
    let mut peer = Peer::spawn("otheruser", &[])?;
    peer.send(&hex(shared.handle().as_bytes()))?;
    let error = peer.expect("error")?;
    // Refused by the handle's user before any file is looked at (the trust model).
    assert!(error.starts_with("Some(IpcOtherUser"), "{error}");
    peer.finish()?;
    assert!(shared.holders().is_empty(), "the other user holds it");
    drop(shared);
    ensure!(eventually(|| counter.drops() == 1), "never released");
    Ok(())
}

/// A share on device 1 names its GPU by UUID: a consumer that sees only one GPU is refused,
/// one that sees both maps it on that GPU and reads it.
#[test]
fn a_share_on_the_second_gpu_is_found_by_uuid() -> Result<()> {
    let count = cudarc::driver::CudaContext::device_count()?;
    if count < 2 {
        println!(
            "skipped: needs two devices ({count} here; the stand-in has two with TB_STANDIN_DEVICES=2, as ci sets)"
        );
        return Ok(());
    }
    let _serial = serial();
    let ctx = context(1)?;
    let a = ctx.new_stream()?;
    let counter = DropCounter::new();
    let (t, _) = produce(&a, &counter)?;
    let shared = ipc::export(&t, 0)?;
    drop(t);
    let bytes = hex(shared.handle().as_bytes());
    // One GPU visible: the stand-in's count, or the real driver's visibility.
    let mut blind = Peer::spawn(
        "uuid-blind",
        &[("TB_STANDIN_DEVICES", "1"), ("CUDA_VISIBLE_DEVICES", "0")],
    )?;
    blind.send(&bytes)?;
    let error = blind.expect("error")?;
    assert!(error.starts_with("Some(IpcDeviceNotVisible"), "{error}");
    blind.finish()?;
    let mut peer = Peer::spawn("consume", &[])?;
    peer.send(&bytes)?;
    assert_eq!(
        peer.expect("device")?,
        "cuda:1",
        "not mapped on the producer's GPU"
    );
    assert_eq!(peer.expect("wrong")?, "0", "the consumer read other values");
    peer.expect("written")?;
    peer.send("look")?;
    peer.expect("seen")?;
    peer.finish()?;
    drop(shared);
    ensure!(eventually(|| counter.drops() == 1), "never released");
    Ok(())
}

#[test]
fn a_handle_whose_producer_has_exited_is_refused() -> Result<()> {
    let _serial = serial();
    let ctx = context(0)?;
    let c = ctx.new_stream()?;
    let peer = Peer::spawn("produce", &[])?;
    let bytes = unhex(&peer.expect("handle")?);
    peer.finish()?;
    let handle = IpcHandle::from_bytes(&bytes)?;
    let r = ipc::import(&handle, &c);
    assert!(matches!(r, Err(Error::IpcProducerGone { .. })), "{r:?}");
    Ok(())
}

#[test]
fn an_open_in_the_producer_process_is_the_producer_tensor() -> Result<()> {
    let _serial = serial();
    let ctx = context(0)?;
    let a = ctx.new_stream()?;
    let counter = DropCounter::new();
    let (t, ptr) = produce(&a, &counter)?;
    let shared = ipc::export(&t, 1)?;
    let back = ipc::import(shared.handle(), &a)?;
    assert_eq!(back.data_ptr() as u64, ptr, "not the producer's memory");
    assert_eq!(shared.tickets_left(), 0, "the open took the ticket");
    drop((t, back, shared));
    ensure!(eventually(|| counter.drops() == 1), "never released");
    Ok(())
}

#[test]
fn stream_ordered_pool_memory_is_refused() -> Result<()> {
    let _serial = serial();
    let ctx = context(0)?;
    let a = ctx.new_stream()?;
    let slice = a.alloc_zeros::<f32>(N)?;
    let (ptr, sync) = slice.device_ptr(&a);
    drop(sync);
    let counter = DropCounter::new();
    // SAFETY: the owner keeps the slice (N floats) alive; the data is ready once `a` has run
    // what was enqueued so far, and `a` outlives the tensor.
    let t = unsafe {
        tensor_at(
            ptr,
            N,
            0,
            counter.owner_with(slice),
            Ready::Stream(tensorbridge_cuda::stream_of(&a)),
        )
    }?;
    if ctx.has_async_alloc() {
        let r = ipc::export(&t, 1);
        assert!(matches!(r, Err(Error::IpcPoolMemory { .. })), "{r:?}");
    } else {
        println!(
            "skipped: this driver has no stream-ordered pools (cudarc allocates with cuMemAlloc)"
        );
    }
    drop(t);
    a.synchronize()?;
    assert_eq!(counter.drops(), 1);
    Ok(())
}

#[test]
fn the_stream_a_share_is_opened_on_must_not_be_the_per_thread_default() -> Result<()> {
    let _serial = serial();
    let ctx = context(0)?;
    let a = ctx.new_stream()?;
    let counter = DropCounter::new();
    let (t, _) = produce(&a, &counter)?;
    let shared = ipc::export(&t, 0)?;
    drop(t);
    let r = ipc::import(shared.handle(), &ctx.per_thread_stream());
    assert!(matches!(r, Err(Error::IpcStream { .. })), "{r:?}");
    drop(shared);
    ensure!(eventually(|| counter.drops() == 1), "never released");
    Ok(())
}

/// The stand-in's guard page: a consumer reading one byte past a shared tensor's mapping
/// dies of it (what tests of views past the mapping rely on).
#[test]
fn standin_a_read_past_the_mapping_faults() -> Result<()> {
    if !crate::standin() {
        println!("skipped: guard pages are the stand-in's; a GPU's memory is not host-readable");
        return Ok(());
    }
    let _serial = serial();
    let ctx = context(0)?;
    let a = ctx.new_stream()?;
    let counter = DropCounter::new();
    let (t, _) = produce(&a, &counter)?;
    let shared = ipc::export(&t, 0)?;
    drop(t);
    let mut peer = Peer::spawn("readpast", &[])?;
    peer.send(&hex(shared.handle().as_bytes()))?;
    let last: u8 = peer.expect("last")?.parse()?;
    // The last float is 4095.0 = 0x457ff000, little-endian: its last byte is 0x45.
    assert_eq!(last, 0x45);
    let status = peer.wait()?;
    use std::os::unix::process::ExitStatusExt as _;
    assert!(
        matches!(status.signal(), Some(libc::SIGSEGV | libc::SIGBUS)),
        "the read past the mapping did not fault: {status}"
    );
    drop(shared);
    ensure!(eventually(|| counter.drops() == 1), "never released");
    Ok(())
}
