//! Tests that run through a CUDA driver: the stand-in (`tensorbridge-cuda-standin`, which
//! `cargo xtask ci` loads as libcuda on machines without a GPU) or a real one (the GPU
//! bundle, `cargo xtask test-gpu`). The same tests run on both; those that depend on what
//! only the stand-in does (guard pages after every allocation, shared-memory names) ask
//! [`standin`] first and say when they skip.
//!
//! Built only with the `driver-tests` feature: without a driver every test here fails
//! rather than skips.
//!
//! Processes: this binary runs itself again as the other side of a share (`child`, which
//! does nothing unless `TB_DRIVER_CHILD` names a role). The child says `IPC <key> <value>`
//! lines on its stdout and reads hex handles and commands on its stdin.

// Tests return `Result` for the driver's errors and assert what they check.
#![allow(clippy::panic_in_result_fn)]

mod ipc;
mod standin;
mod trust;

use std::io::{BufRead as _, BufReader, Write as _};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use cudarc::driver::{CudaContext, CudaStream, sys};
use tensorbridge_core::{Access, DType, Descriptor, Device, Layout, Owner, Packing, Ready, Tensor};

/// Whether the loaded driver is the stand-in (it names its devices so).
pub(crate) fn standin() -> bool {
    static IS: OnceLock<bool> = OnceLock::new();
    *IS.get_or_init(|| {
        let Ok(ctx) = context(0) else {
            return false;
        };
        ctx.name()
            .is_ok_and(|n| n.starts_with("tensorbridge stand-in"))
    })
}

/// Device `ordinal`'s primary context, through the layer (which initialises the driver).
pub(crate) fn context(ordinal: u32) -> Result<Arc<CudaContext>> {
    Ok(tensorbridge_cuda::primary_context(ordinal)?)
}

/// One test at a time: the share registries and `ipc::reports` are per process.
pub(crate) fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A `cuMemAlloc`'d buffer (legacy IPC shares only those), freed when dropped.
pub(crate) struct RawAlloc {
    ctx: Arc<CudaContext>,
    pub(crate) ptr: u64,
    pub(crate) bytes: usize,
}

impl RawAlloc {
    pub(crate) fn new(ctx: &Arc<CudaContext>, bytes: usize) -> Result<RawAlloc> {
        ctx.bind_to_thread()?;
        let mut ptr = 0;
        // SAFETY: a context is current; the driver writes one pointer into a live local.
        unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes) }.result()?;
        Ok(RawAlloc {
            ctx: ctx.clone(),
            ptr,
            bytes,
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

/// A float32 tensor of `n` elements at `ptr` on cuda:`ordinal`.
///
/// # Safety
/// 1. `owner` keeps `n` floats at `ptr` on that device allocated until it is dropped;
/// 2. `ready` is true of the data and names only streams that outlive the tensor.
pub(crate) unsafe fn tensor_at(
    ptr: u64,
    n: usize,
    ordinal: u32,
    owner: Owner,
    ready: Ready,
) -> Result<Tensor> {
    let desc = Descriptor::new(
        ptr as usize,
        Device::cuda(ordinal),
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

/// `n` floats at device address `ptr`, copied on `stream` (then synchronised).
pub(crate) fn to_host(stream: &Arc<CudaStream>, ptr: u64, n: usize) -> Result<Vec<f32>> {
    stream.context().bind_to_thread()?;
    let mut out = vec![0f32; n];
    // SAFETY: `out` holds `n` floats; the caller names a live allocation of at least `4 n`
    // bytes at `ptr`; the copy is complete after the synchronisation, before `out` is read.
    unsafe { sys::cuMemcpyDtoHAsync_v2(out.as_mut_ptr().cast(), ptr, n * 4, stream.cu_stream()) }
        .result()?;
    stream.synchronize()?;
    Ok(out)
}

/// Writes `values` at device address `ptr` on `stream` (then synchronised).
pub(crate) fn from_host(stream: &Arc<CudaStream>, ptr: u64, values: &[f32]) -> Result<()> {
    stream.context().bind_to_thread()?;
    // SAFETY: `values` is live until the synchronisation below; the caller names a live
    // allocation of at least `4 * values.len()` bytes at `ptr`.
    unsafe {
        sys::cuMemcpyHtoDAsync_v2(
            ptr,
            values.as_ptr().cast(),
            values.len() * 4,
            stream.cu_stream(),
        )
    }
    .result()?;
    stream.synchronize()?;
    Ok(())
}

/// `0, 1, 2, ...` as floats: what producers write and consumers check.
pub(crate) fn pattern(n: usize) -> Vec<f32> {
    (0..n).map(|i| i as f32).collect()
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub(crate) fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap_or(0))
        .collect()
}

/// `bytes` with bytes `at..` replaced by `with` and the FNV-1a checksum recomputed: an
/// altered handle that the decoder's checksum does not catch.
pub(crate) fn altered(bytes: &[u8], at: usize, with: &[u8]) -> Vec<u8> {
    let mut b = bytes.to_vec();
    b[at..at + with.len()].copy_from_slice(with);
    let n = b.len() - 8;
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &x in &b[..n] {
        h = (h ^ u64::from(x)).wrapping_mul(0x0100_0000_01b3);
    }
    b[n..].copy_from_slice(&h.to_le_bytes());
    b
}

/// Polls `tensorbridge_cuda::ipc::collect` until `cond` holds (or 20 s pass).
pub(crate) fn eventually(cond: impl Fn() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        tensorbridge_cuda::ipc::collect();
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    false
}

/// The other process: this binary, running only `child`, in a role.
pub(crate) struct Peer {
    child: Child,
    lines: Receiver<String>,
    /// What it printed besides `IPC` lines: shown when it fails to answer.
    other: std::cell::RefCell<Vec<String>>,
}

impl Drop for Peer {
    /// A child that did not finish is killed: a failing test leaves no process behind.
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Peer {
    /// Starts the child in `role`, with `env` added, and waits for its `ready`.
    pub(crate) fn spawn(role: &str, env: &[(&str, &str)]) -> Result<Peer> {
        Peer::spawn_wrapped(&[], role, env)
    }

    /// Like [`Peer::spawn`], with the child started by `wrapper` (a program and its
    /// arguments, such as `unshare --pid --fork --`) in front of this test binary.
    pub(crate) fn spawn_wrapped(
        wrapper: &[&str],
        role: &str,
        env: &[(&str, &str)],
    ) -> Result<Peer> {
        let exe = std::env::current_exe()?;
        let mut cmd = match wrapper.split_first() {
            Some((program, args)) => {
                let mut cmd = Command::new(program);
                cmd.args(args).arg(&exe);
                cmd
            }
            None => Command::new(&exe),
        };
        cmd.args(["--exact", "child", "--nocapture", "--test-threads=1"])
            .env("TB_DRIVER_CHILD", role)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().context("running this test binary again")?;
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

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends a line (a hex handle, or a command).
    pub(crate) fn send(&mut self, line: &str) -> Result<()> {
        let stdin = self.child.stdin.as_mut().context("the child's stdin")?;
        writeln!(stdin, "{line}")?;
        stdin.flush()?;
        Ok(())
    }

    /// The value of the child's next `IPC <key> <value>` line.
    pub(crate) fn expect(&self, key: &str) -> Result<String> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let line = self.lines.recv_timeout(left).with_context(|| {
                format!(
                    "the child printed no `IPC {key}` line (its state: {}); its other output: {:?}",
                    self.state(),
                    self.other.borrow()
                )
            })?;
            if let Some(rest) = line.strip_prefix(&format!("IPC {key} ")) {
                return Ok(rest.to_owned());
            }
            if line.starts_with("IPC ") {
                bail!(
                    "expected `IPC {key}`, the child said `{line}`; its other output: {:?}",
                    self.other.borrow()
                );
            }
            self.other.borrow_mut().push(line);
        }
    }

    /// How the child stands once its output has closed: how it ended (a signal's number
    /// included), or still running.
    fn state(&self) -> String {
        let pid = self.child.id() as libc::id_t;
        for _ in 0..100 {
            // SAFETY: a zeroed `siginfo_t` is a valid value of the plain C struct.
            let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
            // SAFETY: `pid` is our child and `info` a live local the call fills; WNOWAIT
            // leaves the child to be reaped by `Child::wait`.
            let r = unsafe {
                libc::waitid(
                    libc::P_PID,
                    pid,
                    &mut info,
                    libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
                )
            };
            // SAFETY: `info` was filled by `waitid` (its pid stays 0 while the child runs).
            if r == 0 && unsafe { info.si_pid() } != 0 {
                // SAFETY: as above.
                let status = unsafe { info.si_status() };
                return if info.si_code == libc::CLD_EXITED {
                    format!("exited with {status}")
                } else {
                    format!("ended by signal {status}")
                };
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        "still running".to_owned()
    }

    /// Closes the child's stdin and waits for it to exit.
    pub(crate) fn wait(mut self) -> Result<ExitStatus> {
        drop(self.child.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            ensure!(Instant::now() < deadline, "the child did not exit");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Like [`Peer::wait`], and the child must have succeeded.
    pub(crate) fn finish(self) -> Result<()> {
        let status = self.wait()?;
        ensure!(status.success(), "the child exited with {status}");
        Ok(())
    }
}

/// What a child says and reads.
pub(crate) struct Io;

impl Io {
    pub(crate) fn say(&self, key: &str, value: &dyn std::fmt::Display) {
        println!("IPC {key} {value}");
        let _ = std::io::stdout().flush();
    }

    /// The next line on stdin (empty at its end).
    pub(crate) fn line(&self) -> Result<String> {
        let mut line = String::new();
        std::io::stdin().read_line(&mut line)?;
        Ok(line.trim().to_owned())
    }

    /// A handle: a line of hex.
    pub(crate) fn handle(&self) -> Result<Vec<u8>> {
        let bytes = unhex(&self.line()?);
        ensure!(
            bytes.len() >= 248,
            "{} bytes, not a handle (stdin closed early?)",
            bytes.len()
        );
        Ok(bytes)
    }
}

/// The child side of the tests; returns at once in an ordinary run.
#[test]
fn child() -> Result<()> {
    let Ok(role) = std::env::var("TB_DRIVER_CHILD") else {
        return Ok(());
    };
    // The harness has printed `test child ... ` without a line end: every `IPC` line starts
    // a line of its own.
    println!();
    let io = Io;
    let result = match role.strip_prefix("trust-") {
        Some(role) => trust::child(role, &io),
        None => ipc::child(&role, &io),
    };
    if let Err(e) = &result {
        io.say("failed", &format!("{e:#}"));
    }
    // What it still holds is released before it exits (roles that must not release exit
    // on their own).
    while tensorbridge_cuda::ipc::collect() > 0 {
        std::thread::sleep(Duration::from_millis(1));
    }
    std::process::exit(i32::from(result.is_err()));
}
