//! tensorbridge tensors as NIXL memory: `nixl-sys`'s descriptor traits for the core's
//! [`Tensor`], so any tensor an adapter produced (cudarc, tch, candle, ndarray, a DLPack
//! import) registers with a NIXL agent and moves to another process or node.
//!
//! NIXL (NVIDIA Inference Xfer Library) moves bytes between agents over UCX and other
//! engines; `nixl-sys` binds its C API and describes memory through two traits,
//! [`MemoryRegion`] (address and size) and [`NixlDescriptor`] (memory type and device). The
//! orphan rule keeps this crate from implementing them on [`Tensor`] itself, so
//! [`NixlTensor`] wraps one: the span from the layout, the memory type and device id from the
//! core's [`Device`], and the tensor kept (so its owner and the memory live) for as long as
//! the `NixlTensor` does.
//!
//! | direction | what | zero-copy | stream |
//! |---|---|---|---|
//! | export | [`NixlTensor`]: one region, the tensor's byte span | yes (NIXL reads and writes the memory in place) | none: NIXL takes no stream; order the producer first (below) |
//! | export | [`reg_desc_list`]: the fewest regions covering several tensors | yes | none |
//! | export | [`xfer_desc_list`]: a tensor's bytes in element order, as contiguous runs | yes | none |
//! | export | [`register`]: a [`Registered`] tensor, deregistered when dropped | yes | none |
//!
//! # Ownership
//! A [`NixlTensor`] holds a clone of the tensor, so its owner (and the memory) lives at least
//! as long. [`Registered`] drops NIXL's registration before the tensor: the memory outlives
//! the registration. NIXL itself holds raw addresses only; descriptor lists hold no
//! tensors, so keep the tensors of a transfer (or their [`Registered`] forms) until it is
//! done.
//!
//! # Ordering
//! NIXL's transfer requests take no CUDA stream and complete on the host. Before posting a
//! transfer of GPU memory, wait for the producer (the tensor's readiness: with
//! `tensorbridge-cuda`, `synchronize` it); consumers on the receiving side start after the
//! transfer's status (or notification) says it is done.
//!
//! # Limitations
//! - Memory types: host and pinned host memory are `Dram` (device 0), CUDA device memory is
//!   `Vram` (the ordinal). Managed memory is refused (its pages migrate, which registration
//!   and GPUDirect RDMA do not follow), as are all other devices, empty tensors, and
//!   read-only tensors unless asked for ([`NixlTensor::new_read_only`]).
//! - Allocations: this crate does not ask the CUDA driver where allocations begin and end
//!   (the core depends on no CUDA library); tensors made by tensorbridge's CUDA adapters had
//!   their spans checked against the driver's allocation when they were imported.
//!   [`reg_desc_list`] merges spans that overlap or touch on one device. The Python package's
//!   `tensorbridge.nixl` also merges by the driver's allocation and refuses virtual memory
//!   mappings.
//! - Loading: `nixl-sys` is built in its stub mode, which `dlopen`s `libnixl_capi.so` at
//!   first use (the library in NIXL's Python wheel works: put its folder on
//!   `LD_LIBRARY_PATH`). Any `nixl-sys` call without it aborts the process; this crate's
//!   functions that reach NIXL check [`nixl_available`] first and return
//!   [`Error::NixlNotLoaded`]. Building needs libclang (bindgen).

use std::ops::Range;

use nixl_sys::{
    Agent, MemType, MemoryRegion, NixlDescriptor, NixlError, RegDescList, RegistrationHandle,
    XferDescList,
};
use tensorbridge_core::{Device, DeviceType, Tensor};

/// The most contiguous runs [`xfer_desc_list`] cuts one tensor into by default: each run is a
/// descriptor, and NIXL's cost grows with their count.
pub const MAX_RUNS: usize = 1 << 16;

/// What can go wrong turning tensors into NIXL descriptors.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A device NIXL has no memory type for.
    #[error("device {device}: expected host, pinned host or CUDA device memory")]
    UnsupportedDevice {
        /// The tensor's device.
        device: Device,
    },
    /// CUDA managed memory.
    #[error(
        "device {device}: expected host or CUDA device memory, found CUDA managed memory (its pages migrate, which NIXL registration does not follow)"
    )]
    Managed {
        /// The tensor's device.
        device: Device,
    },
    /// A tensor without elements: nothing to register or move.
    #[error("expected a tensor with at least one element, found shape {shape:?}")]
    Empty {
        /// The tensor's shape.
        shape: Vec<i64>,
    },
    /// A read-only tensor given where peers could write it.
    #[error(
        "expected a writable tensor (registered memory may be written by every peer), found a read-only one; use NixlTensor::new_read_only where peers only read it"
    )]
    ReadOnly,
    /// Tensors of more than one memory type or device in one transfer list.
    #[error("expected one memory type and device per list, found {first:?} and {second:?}")]
    MixedDevices {
        /// The first tensor's device.
        first: Device,
        /// A later tensor's device.
        second: Device,
    },
    /// A tensor whose layout needs more contiguous runs than allowed.
    #[error("expected at most {limit} contiguous runs, found {runs} runs of {run_bytes} bytes")]
    TooManyRuns {
        /// The runs the layout needs.
        runs: u64,
        /// Bytes per run.
        run_bytes: u64,
        /// The limit given.
        limit: usize,
    },
    /// `libnixl_capi.so` could not be loaded: `nixl-sys` would abort on any call.
    #[error(
        "NIXL's C API (libnixl_capi.so) is not loadable: install NIXL (`pip install --no-deps nixl-cu13==1.5.1`) and put the folder holding libnixl_capi.so on LD_LIBRARY_PATH"
    )]
    NixlNotLoaded,
    /// NIXL refused a call.
    #[error(transparent)]
    Nixl(#[from] NixlError),
}

/// Whether NIXL's C API was found (`nixl-sys`'s stub loaded `libnixl_capi.so`). When it was
/// not, every `nixl-sys` call aborts the process; this crate's calls return
/// [`Error::NixlNotLoaded`] instead.
pub fn nixl_available() -> bool {
    !nixl_sys::is_stub()
}

fn require_nixl() -> Result<(), Error> {
    if nixl_available() {
        Ok(())
    } else {
        Err(Error::NixlNotLoaded)
    }
}

/// A NIXL agent named `name`, or [`Error::NixlNotLoaded`] where NIXL's C API is missing
/// (instead of `nixl-sys`'s abort).
pub fn agent(name: &str) -> Result<Agent, Error> {
    require_nixl()?;
    Ok(Agent::new(name)?)
}

/// NIXL's memory type and device id for a tensor's device: `Dram`/0 for host and pinned
/// host memory, `Vram`/ordinal for CUDA device memory.
pub fn memory_of(device: Device) -> Result<(MemType, u64), Error> {
    match device.kind {
        DeviceType::Cpu | DeviceType::CudaHost => Ok((MemType::Dram, 0)),
        DeviceType::Cuda => Ok((MemType::Vram, u64::from(device.ordinal))),
        DeviceType::CudaManaged => Err(Error::Managed { device }),
        _ => Err(Error::UnsupportedDevice { device }),
    }
}

/// A tensor as one NIXL memory region: its byte span `[lowest, highest)`, its memory type and
/// device id. Holds the tensor, so the memory lives as long as this does.
#[derive(Debug, Clone)]
pub struct NixlTensor {
    tensor: Tensor,
    span: Range<usize>,
    mem_type: MemType,
    device_id: u64,
}

impl NixlTensor {
    /// A writable tensor as a region (registered memory may be written by every peer).
    pub fn new(tensor: Tensor) -> Result<NixlTensor, Error> {
        if tensor.is_readonly() {
            return Err(Error::ReadOnly);
        }
        NixlTensor::new_read_only(tensor)
    }

    /// Any tensor, read-only ones included: for memory peers only read.
    pub fn new_read_only(tensor: Tensor) -> Result<NixlTensor, Error> {
        let (mem_type, device_id) = memory_of(tensor.device())?;
        if tensor.numel() == 0 {
            return Err(Error::Empty {
                shape: tensor.shape().to_vec(),
            });
        }
        let span = tensor.byte_span();
        Ok(NixlTensor {
            tensor,
            span,
            mem_type,
            device_id,
        })
    }

    /// The tensor.
    pub fn tensor(&self) -> &Tensor {
        &self.tensor
    }

    /// The bytes the tensor's strides reach.
    pub fn span(&self) -> Range<usize> {
        self.span.clone()
    }
}

impl MemoryRegion for NixlTensor {
    /// # Safety
    /// `nixl-sys`'s contract: the pointer is not used after this value is dropped. It stays
    /// valid until then, since this value holds the tensor and with it the tensor's owner.
    unsafe fn as_ptr(&self) -> *const u8 {
        self.span.start as *const u8
    }

    fn size(&self) -> usize {
        self.span.len()
    }
}

impl NixlDescriptor for NixlTensor {
    fn mem_type(&self) -> MemType {
        self.mem_type
    }

    fn device_id(&self) -> u64 {
        self.device_id
    }
}

/// A tensor registered with an agent: deregistered when dropped (or by
/// [`Registered::deregister`]), and only then is the tensor let go.
#[derive(Debug)]
pub struct Registered {
    // Declared first: dropped before `tensor`, so NIXL lets go of the memory first.
    handle: RegistrationHandle,
    tensor: NixlTensor,
}

impl Registered {
    /// The region registered.
    pub fn region(&self) -> &NixlTensor {
        &self.tensor
    }

    /// Deregisters, then gives the tensor back.
    pub fn deregister(mut self) -> Result<Tensor, Error> {
        self.handle.deregister()?;
        Ok(self.tensor.tensor.clone())
    }
}

/// Registers `tensor`'s span with `agent`; the result holds the tensor until deregistered.
pub fn register(agent: &Agent, tensor: NixlTensor) -> Result<Registered, Error> {
    require_nixl()?;
    let handle = agent.register_memory(&tensor, None)?;
    Ok(Registered { handle, tensor })
}

/// One registration region: `(address, length in bytes, device id)`.
pub type Region = (usize, usize, u64);

/// The fewest registration regions covering `tensors`: per memory type and device, spans
/// that overlap or touch merged. Returns `(memory type, [(addr, len, device id)])` groups.
pub fn reg_regions(tensors: &[NixlTensor]) -> Vec<(MemType, Vec<Region>)> {
    let mut keyed: Vec<(u8, u64, Range<usize>)> = tensors
        .iter()
        .map(|t| (mem_key(t.mem_type), t.device_id, t.span()))
        .collect();
    keyed.sort_by_key(|(m, d, s)| (*m, *d, s.start));
    let mut out: Vec<(MemType, Vec<Region>)> = Vec::new();
    let mut cur: Option<(u8, u64, Range<usize>)> = None;
    let flush = |c: (u8, u64, Range<usize>), out: &mut Vec<(MemType, Vec<_>)>| {
        let mem = if c.0 == 0 {
            MemType::Dram
        } else {
            MemType::Vram
        };
        match out.last_mut() {
            Some((m, rows)) if *m == mem => rows.push((c.2.start, c.2.len(), c.1)),
            _ => out.push((mem, vec![(c.2.start, c.2.len(), c.1)])),
        }
    };
    for k in keyed {
        cur = match cur {
            Some(mut c) if c.0 == k.0 && c.1 == k.1 && k.2.start <= c.2.end => {
                c.2.end = c.2.end.max(k.2.end);
                Some(c)
            }
            Some(c) => {
                flush(c, &mut out);
                Some(k)
            }
            None => Some(k),
        };
    }
    if let Some(c) = cur {
        flush(c, &mut out);
    }
    out
}

fn mem_key(m: MemType) -> u8 {
    match m {
        MemType::Dram => 0,
        _ => 1,
    }
}

/// [`reg_regions`] as `nixl-sys` registration lists, one per memory type.
pub fn reg_desc_list(tensors: &[NixlTensor]) -> Result<Vec<RegDescList<'_>>, Error> {
    require_nixl()?;
    let mut lists = Vec::new();
    for (mem, rows) in reg_regions(tensors) {
        let mut list = RegDescList::new(mem)?;
        for (addr, len, dev) in rows {
            list.add_desc(addr, len, dev);
        }
        lists.push(list);
    }
    Ok(lists)
}

/// The bytes of `tensors`, one after another, each in element (C) order, as contiguous
/// runs `(addr, len)`: runs that touch are merged (across tensors too). All tensors must
/// share one memory type and device; at most `max_runs` runs per tensor before merging.
pub fn xfer_runs(tensors: &[NixlTensor], max_runs: usize) -> Result<Vec<(usize, usize)>, Error> {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    if let Some(first) = tensors.first() {
        for t in &tensors[1..] {
            if (t.mem_type, t.device_id) != (first.mem_type, first.device_id) {
                return Err(Error::MixedDevices {
                    first: first.tensor.device(),
                    second: t.tensor.device(),
                });
            }
        }
    }
    for t in tensors {
        tensor_runs(
            &t.tensor,
            max_runs,
            &mut |addr, len| match runs.last_mut() {
                Some((a, n)) if *a + *n == addr => *n += len,
                _ => runs.push((addr, len)),
            },
        )?;
    }
    Ok(runs)
}

/// [`xfer_runs`] as a `nixl-sys` transfer list.
pub fn xfer_desc_list(tensors: &[NixlTensor], max_runs: usize) -> Result<XferDescList<'_>, Error> {
    require_nixl()?;
    let runs = xfer_runs(tensors, max_runs)?;
    let (mem, dev) = tensors
        .first()
        .map_or((MemType::Dram, 0), |t| (t.mem_type, t.device_id));
    let mut list = XferDescList::new(mem)?;
    for (addr, len) in runs {
        list.add_desc(addr, len, dev);
    }
    Ok(list)
}

/// Calls `emit(addr, len)` for the tensor's contiguous runs in element order.
fn tensor_runs(
    t: &Tensor,
    max_runs: usize,
    emit: &mut dyn FnMut(usize, usize),
) -> Result<(), Error> {
    if t.numel() == 0 {
        return Ok(());
    }
    // Sub-byte element types (the packed fp4/fp6 family) have no byte strides: such a
    // tensor moves only as one contiguous span.
    let strides = match t.strides_bytes() {
        Ok(s) if t.nbytes().is_multiple_of(t.numel()) => s,
        _ if t.layout().is_c_contiguous() => {
            let span = t.byte_span();
            emit(span.start, span.len());
            return Ok(());
        }
        _ => {
            return Err(Error::TooManyRuns {
                runs: t.numel(),
                run_bytes: 0,
                limit: max_runs,
            });
        }
    };
    let item = (t.nbytes() / t.numel()) as i64;
    // Dimensions of extent 1 never move the address; the innermost C-contiguous ones form
    // one run.
    let mut dims: Vec<(i64, i64)> = t
        .shape()
        .iter()
        .zip(&strides)
        .filter(|(n, _)| **n != 1)
        .map(|(n, s)| (*n, *s))
        .collect();
    let mut run = item;
    while let Some(&(n, s)) = dims.last() {
        if s != run {
            break;
        }
        run *= n;
        dims.pop();
    }
    let count: u64 = dims.iter().map(|(n, _)| *n as u64).product();
    if count > max_runs as u64 {
        return Err(Error::TooManyRuns {
            runs: count,
            run_bytes: run as u64,
            limit: max_runs,
        });
    }
    let base = t.data_ptr() as i64;
    let mut index = vec![0i64; dims.len()];
    for _ in 0..count {
        let offset: i64 = index.iter().zip(&dims).map(|(i, (_, s))| i * s).sum();
        emit((base + offset) as usize, run as usize);
        for d in (0..dims.len()).rev() {
            index[d] += 1;
            if index[d] < dims[d].0 {
                break;
            }
            index[d] = 0;
        }
    }
    Ok(())
}
