"""Any framework's tensor through NIXL (the NVIDIA Inference Xfer Library).

NIXL moves bytes between processes and nodes (UCX, GDS, Mooncake, ... underneath), but its
Python API takes ``(addr, len, dev)`` tuples, N x 3 arrays or contiguous torch tensors only.
This module is the adapter: anything ``tensorbridge.asview`` takes (PyTorch, JAX, CuPy,
NumPy, Numba, cuda.core, a DLPack capsule, ``from_ptr``, a ``View``) becomes NIXL
descriptors, computed from the view (docs/NIXL.md has the rules and the invariants):

- ``register(agent, tensors)``: the fewest registration descriptors covering the tensors,
  one per allocation (CUDA: the driver's allocation of each span, merged across tensors;
  host: spans that overlap or touch merged), the views held until ``deregister()``.
- ``describe(tensors)``: what a peer needs to address the tensors (memory type, contiguous
  runs in element order), as bytes to send beside the agent metadata.
- ``transfer(agent, op, local, remote, remote_agent)``: local and remote runs paired in
  element order (strided tensors as their contiguous runs), the transfer posted after the
  local producers' pending GPU work has finished, the local views held until it is done.
- ``wait_notification(agent, remote_agent, tag)``: the receiving side's completion, before
  its consumers touch the data.

NIXL is not a dependency of tensorbridge: install it beside it
(``pip install --no-deps nixl-cu13==1.5.1``; ``--no-deps`` because the wheel declares torch
and the CUDA stack as requirements though it needs neither to run). Only ``make_agent``
imports it; the other functions take the agent you made. NumPy is required.
"""

from __future__ import annotations

import bisect
import ctypes
import importlib.util
import json
import re
import sys
import threading
import time
import warnings
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from ._native import View, asview

__all__ = [
    "NIXL_INSTALL",
    "NixlNotInstalledError",
    "NixlConflictError",
    "NixlMemoryError",
    "UnregistrableMemoryError",
    "ReadOnlyMemoryError",
    "ManagedMemoryError",
    "VirtualMemoryError",
    "PoolMemoryError",
    "StagedMemoryWarning",
    "CrossAllocationError",
    "LayoutError",
    "TransferError",
    "Descs",
    "Remote",
    "Registration",
    "Transfer",
    "import_nixl",
    "make_agent",
    "memory_of",
    "registration_descs",
    "xfer_descs",
    "describe",
    "register",
    "ready",
    "transfer",
    "wait_notification",
]

NIXL_INSTALL = "pip install --no-deps nixl-cu13==1.5.1"
"""How to install the NIXL release this module is tested with (CUDA 13 build; ``nixl-cu12``
for CUDA 12). ``--no-deps``: the wheel declares torch and the CUDA stack, which NIXL does not
need to run."""

MAX_RUNS = 1 << 16
"""The most contiguous runs one tensor may be cut into for a transfer; more is refused
(``LayoutError``): each run is a descriptor, and NIXL's cost grows with their count."""


# --------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------


class NixlNotInstalledError(ImportError):
    """No NIXL Python package could be imported."""


class NixlConflictError(ImportError):
    """NIXL cannot be loaded into this process: TensorFlow is already loaded, and both carry
    gRPC, whose flag registry then aborts the process (exit status 1) when NIXL's copy loads.
    Import NIXL (``tensorbridge.nixl.import_nixl()``) before TensorFlow, or use NIXL in a
    process without TensorFlow."""


class NixlMemoryError(BufferError):
    """Memory NIXL cannot be given. ``what`` names the tensor (its position), ``expected``
    and ``found`` say what was needed and what the tensor is."""

    def __init__(self, what: str, expected: str, found: str) -> None:
        super().__init__(f"{what}: expected {expected}, found {found}")
        self.what = what
        self.expected = expected
        self.found = found


class UnregistrableMemoryError(NixlMemoryError):
    """Memory of a kind no NIXL memory type describes (a device other than the CPU, pinned
    host memory or a CUDA GPU), or an empty tensor (nothing to register)."""


class ReadOnlyMemoryError(UnregistrableMemoryError):
    """A read-only view: registration lets every peer write the memory. Pass
    ``allow_readonly=True`` where peers only read it."""


class ManagedMemoryError(NixlMemoryError):
    """CUDA managed (unified) memory: its pages move between host and device, which NIXL's
    registration (and GPUDirect RDMA) does not follow."""


class VirtualMemoryError(NixlMemoryError):
    """CUDA virtual memory management (``cuMemCreate``/``cuMemMap``: PyTorch's expandable
    segments, JAX's GPU allocator), refused where ``require_ipc=True`` asked for memory CUDA
    IPC can share. Without it such memory is registered (``StagedMemoryWarning``)."""


class PoolMemoryError(NixlMemoryError):
    """Memory of a stream-ordered pool (``cudaMallocAsync``), refused where
    ``require_ipc=True`` asked for memory CUDA IPC can share. Without it such memory is
    registered (``StagedMemoryWarning``)."""


class StagedMemoryWarning(RuntimeWarning):
    """CUDA memory that legacy CUDA IPC cannot share (a virtual memory mapping, or a
    stream-ordered pool) was registered. NIXL moves it correctly, as it would if registered by
    hand, but between two processes of one node UCX cannot map it into the peer and copies it
    through host memory: slower than GPU to GPU. ``Registration.staged`` names the tensors;
    ``register(..., require_ipc=True)`` refuses them instead (``VirtualMemoryError``,
    ``PoolMemoryError``)."""


class CrossAllocationError(NixlMemoryError):
    """A tensor whose byte span does not lie inside one CUDA allocation."""


class LayoutError(NixlMemoryError, ValueError):
    """A layout the transfer cannot express: too many contiguous runs, overlapping runs on a
    receiving side, or sides of different sizes."""


class TransferError(RuntimeError):
    """NIXL reported a failed transfer, or it did not finish in time."""


# --------------------------------------------------------------------------------------
# NIXL itself (only make_agent needs it)
# --------------------------------------------------------------------------------------


def import_nixl() -> Any:
    """The NIXL Python API module (``nixl._api``, else ``nixl_cu13._api``, else
    ``nixl_cu12._api``); ``NixlNotInstalledError`` (an ``ImportError``) with the install
    command when none imports; ``NixlConflictError`` (an ``ImportError``) instead of the
    process ending when TensorFlow is already loaded."""
    errors = []
    for name in ("nixl._api", "nixl_cu13._api", "nixl_cu12._api"):
        package = name.split(".")[0]
        if (
            package not in sys.modules
            and "tensorflow" in sys.modules
            and importlib.util.find_spec(package) is not None
        ):
            # Measured with nixl-cu13 1.5.1 and TensorFlow 2.21: "Flag 'grpc_experiments' was
            # defined more than once", then the process exits. TensorFlow after NIXL works.
            raise NixlConflictError(
                f"NIXL ({package}) cannot be imported after TensorFlow: expected a process "
                "without TensorFlow loaded, found tensorflow in sys.modules (both bundle "
                "gRPC, and loading NIXL's copy second ends the process); import NIXL first "
                "(tensorbridge.nixl.import_nixl()) or use it in another process"
            )
        try:
            module = __import__(name, fromlist=["nixl_agent"])
        except ImportError as e:
            errors.append(f"{name}: {e}")
            continue
        if hasattr(module, "nixl_agent"):
            return module
        errors.append(f"{name}: no nixl_agent")
    raise NixlNotInstalledError(
        "NIXL is not installed: expected one of the packages nixl, nixl-cu13, nixl-cu12, "
        f"found none importable ({'; '.join(errors)}); install it with `{NIXL_INSTALL}`"
    )


def make_agent(
    name: str,
    backend: Optional[str] = "UCX",
    params: Optional[Dict[str, str]] = None,
    **config: Any,
) -> Any:
    """A ``nixl_agent`` named ``name`` with ``backend`` created (``None``: none).
    ``config`` goes to ``nixl_agent_config`` (``enable_prog_thread``, ...)."""
    api = import_nixl()
    agent = api.nixl_agent(name, api.nixl_agent_config(backends=[], **config))
    if backend is not None:
        agent.create_backend(backend, dict(params or {}))
    return agent


# --------------------------------------------------------------------------------------
# The CUDA driver, for what a view does not say: allocations, memory kinds, streams
# --------------------------------------------------------------------------------------

_CU_POINTER_ATTRIBUTE_IS_MANAGED = 8
_CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE = 10
_CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE = 17
_CU_POINTER_ATTRIBUTE_RANGE_START_ADDR = 11
_CU_POINTER_ATTRIBUTE_RANGE_SIZE = 12
_CU_STREAM_NON_BLOCKING = 1


class _Driver:
    """libcuda through ctypes: loaded on first use, only for CUDA views. Pointer queries need
    a current context: the calling thread's when it has one, else the device's primary
    context, made current for the call only (the thread's state is left as it was)."""

    def __init__(self) -> None:
        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise NixlMemoryError(
                "CUDA memory", "a CUDA driver (libcuda.so.1) to inspect it", f"none ({e})"
            ) from None
        self._check("cuInit", self.lib.cuInit(0))
        self._streams: Dict[int, int] = {}
        self._contexts: Dict[int, int] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _check(call: str, rc: int) -> None:
        if rc != 0:
            raise RuntimeError(f"{call} failed with CUresult {rc}")

    def _primary(self, ordinal: int) -> int:
        """Device ``ordinal``'s primary context, retained once for the process."""
        with self._lock:
            if ordinal not in self._contexts:
                device = ctypes.c_int()
                self._check("cuDeviceGet", self.lib.cuDeviceGet(ctypes.byref(device), ordinal))
                ctx = ctypes.c_void_p()
                self._check(
                    "cuDevicePrimaryCtxRetain",
                    self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), device),
                )
                self._contexts[ordinal] = int(ctx.value)
            return self._contexts[ordinal]

    def _call(self, ordinal: int, fn: Any) -> Any:
        """``fn()`` with a context current: the thread's own, else ``ordinal``'s primary."""
        current = ctypes.c_void_p()
        self._check("cuCtxGetCurrent", self.lib.cuCtxGetCurrent(ctypes.byref(current)))
        if current.value:
            return fn()
        self._check(
            "cuCtxPushCurrent", self.lib.cuCtxPushCurrent_v2(ctypes.c_void_p(self._primary(ordinal)))
        )
        try:
            return fn()
        finally:
            popped = ctypes.c_void_p()
            self.lib.cuCtxPopCurrent_v2(ctypes.byref(popped))

    def _attribute(self, ordinal: int, attribute: int, ptr: int, ctype: Any) -> Any:
        value = ctype()
        self._check(
            "cuPointerGetAttribute",
            self._call(
                ordinal,
                lambda: self.lib.cuPointerGetAttribute(
                    ctypes.byref(value), ctypes.c_int(attribute), ctypes.c_uint64(ptr)
                ),
            ),
        )
        return value.value

    def allocation(self, ordinal: int, ptr: int) -> Tuple[int, int]:
        """The driver's allocation holding ``ptr``: (base, size)."""
        base = self._attribute(ordinal, _CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, ptr, ctypes.c_uint64)
        size = self._attribute(ordinal, _CU_POINTER_ATTRIBUTE_RANGE_SIZE, ptr, ctypes.c_uint64)
        return int(base), int(size)

    def is_managed(self, ordinal: int, ptr: int) -> bool:
        return bool(self._attribute(ordinal, _CU_POINTER_ATTRIBUTE_IS_MANAGED, ptr, ctypes.c_uint32))

    def not_ipc(self, ordinal: int, ptr: int) -> Optional[str]:
        """Why legacy CUDA IPC cannot share the memory at ``ptr``: ``"pool"`` (a
        stream-ordered pool), ``"vmm"`` (a virtual memory mapping), or ``None`` where it can
        (or where the driver cannot say). Pools first: their memory is mapped through the
        virtual memory API, so ``cuMemRetainAllocationHandle`` succeeds for it too."""
        try:
            capable = self._attribute(
                ordinal, _CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, ptr, ctypes.c_uint32
            )
        except RuntimeError:
            return None  # a driver too old to answer: nothing to tell
        if capable & 0xFF:  # a bool: the driver may write one byte of the four
            return None
        try:
            pool = self._attribute(ordinal, _CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE, ptr, ctypes.c_uint64)
        except RuntimeError:
            pool = 0
        if pool:
            return "pool"
        handle = ctypes.c_uint64()
        rc = self._call(
            ordinal,
            lambda: self.lib.cuMemRetainAllocationHandle(ctypes.byref(handle), ctypes.c_void_p(ptr)),
        )
        if rc == 0:
            self.lib.cuMemRelease(handle)
            return "vmm"
        return None

    def stream(self, ordinal: int) -> int:
        """A private non-blocking stream on device ``ordinal`` (made once, kept)."""
        ctx = self._primary(ordinal)
        with self._lock:
            if ordinal not in self._streams:
                self._check("cuCtxPushCurrent", self.lib.cuCtxPushCurrent_v2(ctypes.c_void_p(ctx)))
                try:
                    stream = ctypes.c_void_p()
                    self._check(
                        "cuStreamCreate",
                        self.lib.cuStreamCreate(ctypes.byref(stream), _CU_STREAM_NON_BLOCKING),
                    )
                finally:
                    popped = ctypes.c_void_p()
                    self.lib.cuCtxPopCurrent_v2(ctypes.byref(popped))
                self._streams[ordinal] = int(stream.value)
            return self._streams[ordinal]

    def synchronize(self, stream: int) -> None:
        self._check("cuStreamSynchronize", self.lib.cuStreamSynchronize(ctypes.c_void_p(stream)))


_driver: Optional[_Driver] = None
_driver_lock = threading.Lock()


def _cuda() -> _Driver:
    global _driver
    with _driver_lock:
        if _driver is None:
            _driver = _Driver()
        return _driver


# --------------------------------------------------------------------------------------
# Views -> memory types, spans, runs
# --------------------------------------------------------------------------------------

_DEVICE = re.compile(r"^([a-z_]+)(?::(\d+))?$")


def _view(obj: Any) -> View:
    return obj if isinstance(obj, View) else asview(obj)


def _views(tensors: Any) -> List[View]:
    """One tensor or a sequence of them, as views."""
    if isinstance(tensors, (list, tuple)):
        return [_view(t) for t in tensors]
    return [_view(tensors)]


def _what(i: int, view: View) -> str:
    return f"tensor {i} ({view.device}, {view.dtype_name}{list(view.shape)})"


def memory_of(view: Any) -> Tuple[str, int]:
    """NIXL's memory type and device id for a view: ("DRAM", 0) for host and pinned host
    memory, ("VRAM", ordinal) for CUDA device memory; ``NixlMemoryError`` otherwise."""
    view = _view(view)
    m = _DEVICE.match(view.device)
    kind, ordinal = (m.group(1), int(m.group(2) or 0)) if m else (view.device, 0)
    if kind in ("cpu", "cuda_host"):
        return "DRAM", 0
    if kind == "cuda":
        return "VRAM", ordinal
    what = _what(0, view)
    if kind == "cuda_managed":
        raise ManagedMemoryError(what, "host or CUDA device memory", "CUDA managed memory")
    raise UnregistrableMemoryError(
        what, "host (cpu, cuda_host) or CUDA device memory", f"device {view.device}"
    )


def _span(view: View) -> Tuple[int, int]:
    """[lowest, highest) byte addresses the view reaches (non-empty views only)."""
    lo = hi = view.ptr
    for n, s in zip(view.shape, view.byte_strides):
        reach = (n - 1) * s
        if reach < 0:
            lo += reach
        else:
            hi += reach
    return lo, hi + view.itemsize


_NOT_IPC = {
    "vmm": (VirtualMemoryError, "a virtual memory mapping (cuMemCreate/cuMemMap: PyTorch's "
            "expandable segments, JAX's GPU allocator)"),
    "pool": (PoolMemoryError, "memory of a stream-ordered pool (cudaMallocAsync)"),
}


class _Known:
    """The CUDA allocations one call has already asked the driver about: (device, base, end,
    why CUDA IPC cannot share it). Sound for the call only: every view of the call pins its
    memory until the call returns, so an allocation found for one view cannot be freed, nor
    its range reused, while the call runs, and another pointer inside that range is in the
    same allocation. A thousand slices of one buffer cost the driver's answers once."""

    __slots__ = ("keys", "allocs")

    def __init__(self) -> None:
        self.keys: List[Tuple[int, int]] = []  # (device, base), sorted
        self.allocs: List[Tuple[int, int, int, Optional[str]]] = []  # in the same order

    def find(self, dev: int, lo: int) -> Optional[Tuple[int, int, int, Optional[str]]]:
        at = bisect.bisect_right(self.keys, (dev, lo)) - 1
        if at >= 0:
            a = self.allocs[at]
            if a[0] == dev and a[1] <= lo < a[2]:
                return a
        return None

    def add(self, alloc: Tuple[int, int, int, Optional[str]]) -> None:
        at = bisect.bisect_right(self.keys, (alloc[0], alloc[1]))
        self.keys.insert(at, (alloc[0], alloc[1]))
        self.allocs.insert(at, alloc)


class _Checked(NamedTuple):
    """What ``_check_memory`` found for a view: its NIXL memory type and device, its byte
    span [lo, hi), the base of its CUDA allocation (-1 on the host), and why CUDA IPC cannot
    share it (``None`` where it can, and on the host)."""

    mem: str
    dev: int
    lo: int
    hi: int
    base: int
    staged: Optional[str]


def _check_memory(
    i: int,
    view: View,
    allow_readonly: bool,
    require_ipc: bool = False,
    known: Optional[_Known] = None,
) -> _Checked:
    """Raises for memory NIXL must not be given; otherwise what was found (``_Checked``).
    ``known`` carries the driver's answers from one view to the next within one call."""
    mem, dev = memory_of(view)
    if view.nbytes == 0:
        raise UnregistrableMemoryError(_what(i, view), "a tensor with at least one element", "none")
    if view.readonly and not allow_readonly:
        raise ReadOnlyMemoryError(
            _what(i, view),
            "writable memory (registered memory may be written by every peer; "
            "allow_readonly=True where peers only read it)",
            "a read-only view",
        )
    lo, hi = _span(view)
    if mem == "VRAM":
        found = known.find(dev, lo) if known is not None else None
        if found is None:
            cuda = _cuda()
            if cuda.is_managed(dev, lo):
                raise ManagedMemoryError(_what(i, view), "CUDA device memory", "CUDA managed memory")
            base, size = cuda.allocation(dev, lo)
            found = (dev, base, base + size, cuda.not_ipc(dev, lo))
            if known is not None:
                known.add(found)
        _, base, end, staged = found
        if staged is not None and require_ipc:
            error, kind = _NOT_IPC[staged]
            raise error(
                _what(i, view),
                "memory CUDA IPC can share (cudaMalloc, or a caching allocator over it), "
                "as require_ipc=True asks",
                kind,
            )
        if hi > end:
            raise CrossAllocationError(
                _what(i, view),
                f"a span inside the allocation [{base:#x}, {end:#x})",
                f"span [{lo:#x}, {hi:#x})",
            )
        return _Checked(mem, dev, lo, hi, base, staged)
    return _Checked(mem, dev, lo, hi, -1, None)


class Descs:
    """NIXL descriptors of one memory type: ``array`` is N x 3 uint64 rows
    ``(addr, nbytes, device_id)``, what ``register_memory``, ``get_reg_descs`` and
    ``get_xfer_descs`` take with ``mem_type``."""

    __slots__ = ("mem_type", "array")

    def __init__(self, mem_type: str, array: np.ndarray) -> None:
        self.mem_type = mem_type
        self.array = array

    def __len__(self) -> int:
        return int(self.array.shape[0])

    @property
    def nbytes(self) -> int:
        return int(self.array[:, 1].sum()) if len(self) else 0

    def tuples(self) -> List[Tuple[int, int, int]]:
        return [(int(a), int(n), int(d)) for a, n, d in self.array]

    def __repr__(self) -> str:
        return f"Descs({self.mem_type!r}, {self.tuples()!r})"


def registration_descs(
    tensors: Any, *, allow_readonly: bool = False, require_ipc: bool = False
) -> List[Descs]:
    """The fewest registration descriptors covering ``tensors``, one ``Descs`` per memory
    type. CUDA: one per driver allocation, spanning the tensors' spans in it. Host: spans
    that overlap or touch merged (the host has no allocation a process can ask for)."""
    return _registration(_views(tensors), allow_readonly, require_ipc)[0]


def _registration(
    views: List[View], allow_readonly: bool, require_ipc: bool = False
) -> Tuple[List[Descs], List[str]]:
    """The descriptors, and the tensors CUDA IPC cannot share (each named with why)."""
    # (mem, dev, group) -> [lo, hi]
    groups: Dict[Tuple[str, int], List[Tuple[int, int, int]]] = {}
    staged: List[str] = []
    known = _Known()
    for i, v in enumerate(views):
        c = _check_memory(i, v, allow_readonly, require_ipc, known)
        if c.staged is not None:
            staged.append(f"{_what(i, v)}: {_NOT_IPC[c.staged][1]}")
        groups.setdefault((c.mem, c.dev), []).append((c.base, c.lo, c.hi))
    out: Dict[str, List[Tuple[int, int, int]]] = {}
    for (mem, dev), spans in groups.items():
        rows = out.setdefault(mem, [])
        if mem == "VRAM":
            hull: Dict[int, List[int]] = {}
            for key, lo, hi in spans:
                h = hull.setdefault(key, [lo, hi])
                h[0], h[1] = min(h[0], lo), max(h[1], hi)
            rows.extend((lo, hi - lo, dev) for lo, hi in sorted(hull.values()))
        else:
            spans.sort(key=lambda s: s[1])
            cur_lo, cur_hi = spans[0][1], spans[0][2]
            for _, lo, hi in spans[1:]:
                if lo <= cur_hi:
                    cur_hi = max(cur_hi, hi)
                else:
                    rows.append((cur_lo, cur_hi - cur_lo, dev))
                    cur_lo, cur_hi = lo, hi
            rows.append((cur_lo, cur_hi - cur_lo, dev))
    descs = [Descs(mem, np.array(rows, dtype=np.uint64).reshape(-1, 3)) for mem, rows in out.items()]
    return descs, staged


def _runs(i: int, view: View, limit: int) -> Tuple[List[int], List[int]]:
    """The view's bytes in element (C) order as contiguous runs: (addresses, lengths),
    adjacent runs merged. Empty views give none. Python lists: most tensors are one run,
    and NumPy's per-call cost would dominate a thousand of them."""
    if view.nbytes == 0:
        return [], []
    # The dimensions left once the innermost contiguous ones are folded into one run.
    dims = [(n, s) for n, s in zip(view.shape, view.byte_strides) if n != 1]
    run = view.itemsize
    while dims and dims[-1][1] == run:
        run *= dims[-1][0]
        dims.pop()
    if not dims:  # one run covers the view
        return [view.ptr], [run]
    count = 1
    for n, _ in dims:
        count *= n
    if count > limit:
        raise LayoutError(
            _what(i, view),
            f"at most {limit} contiguous runs (make it contiguous first)",
            f"{count} runs of {run} bytes",
        )
    offsets = np.zeros(1, np.int64)
    for n, s in dims:
        offsets = (offsets[:, None] + np.arange(n, dtype=np.int64)[None, :] * s).reshape(-1)
    addrs = (np.int64(view.ptr) + offsets).astype(np.uint64)
    lens = np.full(addrs.shape, run, np.uint64)
    if len(addrs) > 1:
        starts = np.concatenate(([True], addrs[1:] != addrs[:-1] + lens[:-1]))
        idx = np.flatnonzero(starts)
        lens = np.add.reduceat(lens, idx)
        addrs = addrs[idx]
    return addrs.tolist(), lens.tolist()


def _all_runs(views: List[View], limit: int, allow_readonly: bool) -> Tuple[str, Descs]:
    mems = set()
    addrs: List[int] = []
    lens: List[int] = []
    devs: List[int] = []
    known = _Known()
    for i, v in enumerate(views):
        c = _check_memory(i, v, allow_readonly, known=known)
        mems.add(c.mem)
        a, n = _runs(i, v, limit)
        addrs.extend(a)
        lens.extend(n)
        devs.extend([c.dev] * len(a))
    if len(mems) > 1:
        raise LayoutError(
            "tensors", "one memory type per side of a transfer", f"{sorted(mems)}"
        )
    a = np.array(addrs, dtype=np.uint64)
    n = np.array(lens, dtype=np.uint64)
    d = np.array(devs, dtype=np.uint64)
    # Runs of consecutive tensors that touch, on one device, merge too.
    if len(a) > 1:
        starts = np.concatenate(([True], (a[1:] != a[:-1] + n[:-1]) | (d[1:] != d[:-1])))
        idx = np.flatnonzero(starts)
        n = np.add.reduceat(n, idx)
        a, d = a[idx], d[idx]
    mem = mems.pop() if mems else "DRAM"
    return mem, Descs(mem, np.stack([a, n, d], axis=1).astype(np.uint64).reshape(-1, 3))


def xfer_descs(tensors: Any, *, max_runs: int = MAX_RUNS) -> Descs:
    """Transfer descriptors for ``tensors``: their bytes in element order, one tensor after
    another, as contiguous runs (adjacent runs merged); one memory type. Read-only views
    are accepted (as sources)."""
    return _all_runs(_views(tensors), max_runs, True)[1]


def _overlaps(descs: Descs) -> bool:
    order = np.argsort(descs.array[:, 0], kind="stable")
    a = descs.array[order, 0]
    n = descs.array[order, 1]
    return bool(len(a) > 1 and np.any(a[1:] < a[:-1] + n[:-1]))


class Remote:
    """What a peer needs to address tensors of this process: the memory type and the runs
    (``descs``), whether any byte is reached twice (``overlapping``: such a side can only be
    read) and whether any tensor was read-only (``readonly``). ``bytes(remote)`` is the wire
    form, ``Remote.from_bytes`` reads it back, checking every field."""

    MAGIC = "tensorbridge.nixl.remote"
    VERSION = 1

    def __init__(self, descs: Descs, overlapping: bool, readonly: bool) -> None:
        self.descs = descs
        self.overlapping = overlapping
        self.readonly = readonly

    @property
    def mem_type(self) -> str:
        return self.descs.mem_type

    @property
    def nbytes(self) -> int:
        return self.descs.nbytes

    def __bytes__(self) -> bytes:
        return json.dumps(
            {
                "magic": self.MAGIC,
                "version": self.VERSION,
                "mem_type": self.mem_type,
                "overlapping": self.overlapping,
                "readonly": self.readonly,
                "runs": self.descs.tuples(),
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> "Remote":
        try:
            obj = json.loads(bytes(data))
        except (ValueError, TypeError) as e:
            raise ValueError(f"remote description: expected JSON, found {e}") from None
        if not isinstance(obj, dict) or obj.get("magic") != cls.MAGIC:
            raise ValueError(f"remote description: expected magic {cls.MAGIC!r}, found {obj!r:.80}")
        if obj.get("version") != cls.VERSION:
            raise ValueError(
                f"remote description: expected version {cls.VERSION}, found {obj.get('version')!r}"
            )
        mem = obj.get("mem_type")
        if mem not in ("DRAM", "VRAM"):
            raise ValueError(f"remote description: expected mem_type DRAM or VRAM, found {mem!r}")
        runs = obj.get("runs")
        ok = isinstance(runs, list) and all(
            isinstance(r, list)
            and len(r) == 3
            and all(type(x) is int and 0 <= x < 1 << 64 for x in r)
            and r[1] > 0
            and r[0] + r[1] <= 1 << 64
            for r in runs
        )
        if not ok:
            raise ValueError(
                "remote description: expected runs as [addr, nbytes > 0, device] integer "
                f"triples within 64 bits, found {runs!r:.80}"
            )
        flags = [obj.get("overlapping"), obj.get("readonly")]
        if not all(isinstance(f, bool) for f in flags):
            raise ValueError(f"remote description: expected boolean flags, found {flags!r}")
        arr = np.array(runs, dtype=np.uint64).reshape(-1, 3)
        return cls(Descs(mem, arr), flags[0], flags[1])

    def __repr__(self) -> str:
        return (
            f"Remote({self.mem_type}, {len(self.descs)} runs, {self.nbytes} bytes, "
            f"overlapping={self.overlapping}, readonly={self.readonly})"
        )


def describe(tensors: Any, *, max_runs: int = MAX_RUNS, wait: bool = True) -> Remote:
    """The description a peer needs to read or write ``tensors`` (send ``bytes(...)`` beside
    the agent metadata). The tensors must also be registered with this process's agent.
    A peer's transfer is ordered after nothing in this process, so by default this returns
    once the work pending on the tensors' producers has finished (``ready``); ``wait=False``
    when the caller orders that itself."""
    views = ready(tensors) if wait else _views(tensors)
    descs = _all_runs(views, max_runs, True)[1]
    return Remote(descs, _overlaps(descs), any(v.readonly for v in views))


def _pair(local: Descs, remote: Descs) -> Tuple[np.ndarray, np.ndarray]:
    """Both sides cut at the union of their run boundaries, so that piece k of one is
    piece k of the other in byte order."""
    if local.nbytes != remote.nbytes:
        raise LayoutError(
            "transfer",
            f"sides of equal size (remote {remote.nbytes} bytes)",
            f"local {local.nbytes} bytes",
        )
    cl = np.cumsum(local.array[:, 1].astype(np.int64))
    cr = np.cumsum(remote.array[:, 1].astype(np.int64))
    ends = np.union1d(cl, cr)
    starts = np.concatenate(([0], ends[:-1]))
    lens = (ends - starts).astype(np.uint64)

    def cut(side: Descs, cum: np.ndarray) -> np.ndarray:
        k = np.searchsorted(cum, starts, side="right")
        before = np.concatenate(([0], cum[:-1]))[k]
        addr = side.array[k, 0] + (starts - before).astype(np.uint64)
        return np.stack([addr, lens, side.array[k, 2]], axis=1).astype(np.uint64)

    return cut(local, cl), cut(remote, cr)


# --------------------------------------------------------------------------------------
# Ordering: the producers' pending work, before NIXL reads or writes
# --------------------------------------------------------------------------------------


def ready(tensors: Any) -> List[View]:
    """Views of ``tensors``, returned once the work their producers had enqueued on the GPU
    has finished. NIXL's transfer API takes no CUDA stream and its engines start copying when
    a transfer is posted, so the host waits; it waits for that work only: a private stream
    of this module is made to wait for each producer on the GPU (the producer's own DLPack
    ordering, or a view's readiness), then synchronized. Host tensors are returned as they
    are."""
    objs = tensors if isinstance(tensors, (list, tuple)) else [tensors]
    views: List[View] = []
    streams: Dict[int, int] = {}
    for obj in objs:
        v = _view(obj)
        m = _DEVICE.match(v.device)
        if m and m.group(1) == "cuda":
            ordinal = int(m.group(2) or 0)
            stream = streams.setdefault(ordinal, _cuda().stream(ordinal))
            v = asview(obj, stream=stream)
        views.append(v)
    for stream in streams.values():
        _cuda().synchronize(stream)
    return views


# --------------------------------------------------------------------------------------
# Registration and transfers
# --------------------------------------------------------------------------------------

# Views of registrations garbage-collected while NIXL still held their memory and
# deregistration failed: kept for the life of the process rather than freed under NIXL.
_leaked: List[Any] = []


class Registration:
    """Tensors registered with a NIXL agent. Holds their views (so their memory lives) until
    ``deregister()`` (or the end of a ``with`` block); ``descs`` are the descriptors
    registered, ``count`` their number, ``staged`` the tensors CUDA IPC cannot share (each
    with why; ``StagedMemoryWarning``), empty when there are none."""

    def __init__(
        self,
        agent: Any,
        views: List[View],
        descs: List[Descs],
        backends: Sequence[str],
        staged: Sequence[str] = (),
    ):
        self.agent = agent
        self.views: Optional[List[View]] = views
        self.descs = descs
        self.staged = list(staged)
        self._backends = list(backends)
        self._dlists: List[Any] = []

    @property
    def count(self) -> int:
        return sum(len(d) for d in self.descs)

    @property
    def registered(self) -> bool:
        return self.views is not None

    def deregister(self) -> None:
        """Deregisters from the agent, then lets the memory go. A second call does nothing."""
        if self.views is None:
            return
        while self._dlists:
            self.agent.deregister_memory(self._dlists[-1], self._backends)
            self._dlists.pop()
        self.views = None

    def __enter__(self) -> "Registration":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.deregister()

    def __del__(self) -> None:
        if getattr(self, "views", None) is None:
            return
        try:
            self.deregister()
        except Exception as e:  # never free memory NIXL may still use
            _leaked.append(self.views)
            warnings.warn(
                f"tensorbridge.nixl: a registration was dropped and deregistering failed "
                f"({e}); its memory is kept for the life of the process",
                ResourceWarning,
                stacklevel=1,
            )

    def __repr__(self) -> str:
        state = "registered" if self.registered else "deregistered"
        return f"Registration({self.count} descriptors, {state})"


def register(
    agent: Any,
    tensors: Any,
    *,
    allow_readonly: bool = False,
    require_ipc: bool = False,
    backends: Sequence[str] = (),
) -> Registration:
    """Registers ``tensors`` with ``agent`` as the fewest descriptors covering them
    (``registration_descs``) and holds their views until the registration is deregistered.
    Refuses, before NIXL sees anything: empty tensors, devices NIXL has no memory type for,
    read-only views (unless ``allow_readonly``), CUDA managed memory, spans that cross CUDA
    allocations, and with ``require_ipc`` CUDA memory that CUDA IPC cannot share (virtual
    memory mappings, stream-ordered pools). Such memory is otherwise registered, as NIXL by
    hand would, with a ``StagedMemoryWarning`` and the tensors named in ``staged``."""
    views = _views(tensors)
    descs, staged = _registration(views, allow_readonly, require_ipc)
    if staged:
        warnings.warn(
            "tensorbridge.nixl: registered CUDA memory that CUDA IPC cannot share ("
            + "; ".join(staged[:3]) + ("; ..." if len(staged) > 3 else "")
            + "): NIXL moves it correctly, but between processes of one node UCX copies it "
            "through host memory; require_ipc=True refuses it instead",
            StagedMemoryWarning,
            stacklevel=2,
        )
    reg = Registration(agent, views, descs, backends, staged)
    try:
        for d in descs:
            dlist = agent.get_reg_descs(d.array, d.mem_type)
            if dlist is None:
                raise TransferError(f"NIXL refused registration descriptors {d!r}")
            agent.register_memory(dlist, d.mem_type, list(backends))
            reg._dlists.append(dlist)
    except BaseException:
        reg.deregister()
        raise
    return reg


class Transfer:
    """A posted NIXL transfer. Holds the local views until it is done; ``wait`` returns when
    it is, ``release`` frees NIXL's request (also at the end of a ``with`` block)."""

    def __init__(self, agent: Any, handle: Any, views: List[View], state: str, pieces: int):
        self.agent = agent
        self.handle = handle
        self.views = views
        self.pieces = pieces
        self._state = state

    @property
    def state(self) -> str:
        """"DONE", "PROC" or "ERR", as NIXL reports it now."""
        if self._state == "PROC":
            self._state = self.agent.check_xfer_state(self.handle)
        return self._state

    def done(self) -> bool:
        state = self.state
        if state == "ERR":
            raise TransferError("NIXL reported the transfer failed (state ERR)")
        return state == "DONE"

    def wait(self, timeout: Optional[float] = 30.0) -> List[View]:
        """Polls until the transfer is done and returns the local views; ``TransferError`` if
        NIXL reports a failure or ``timeout`` seconds pass (``None``: no limit)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.done():
            if deadline is not None and time.monotonic() > deadline:
                raise TransferError(f"the transfer did not finish in {timeout} s (state PROC)")
            time.sleep(0)
        return self.views

    def release(self) -> None:
        if self.handle is not None:
            self.agent.release_xfer_handle(self.handle)
            self.handle = None

    def __enter__(self) -> "Transfer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


def transfer(
    agent: Any,
    op: str,
    local: Any,
    remote: Any,
    remote_agent: str,
    *,
    notif: bytes = b"",
    backends: Sequence[str] = (),
    max_runs: int = MAX_RUNS,
) -> Transfer:
    """Posts ``op`` ("READ": remote into local; "WRITE": local into remote) between the
    local tensors and ``remote`` (a ``Remote`` or its bytes) of ``remote_agent``. Both sides
    are cut into matching contiguous runs in element order; the local producers' pending GPU
    work finishes first (``ready``). ``notif`` reaches the remote agent when the data has
    landed (``wait_notification`` there)."""
    if op not in ("READ", "WRITE"):
        raise ValueError(f"op: expected 'READ' or 'WRITE', found {op!r}")
    if not isinstance(remote, Remote):
        remote = Remote.from_bytes(remote)
    views = ready(local)
    mem, descs = _all_runs(views, max_runs, op == "WRITE")
    if op == "READ" and _overlaps(descs):
        raise LayoutError("local tensors", "no byte reached twice on the receiving side", "overlapping runs")
    if op == "WRITE" and (remote.overlapping or remote.readonly):
        raise LayoutError(
            "remote tensors",
            "writable tensors, no byte reached twice",
            "read-only tensors" if remote.readonly else "overlapping runs",
        )
    lp, rp = _pair(descs, remote.descs)
    ld = agent.get_xfer_descs(lp, mem)
    rd = agent.get_xfer_descs(rp, remote.mem_type)
    if ld is None or rd is None:
        raise TransferError("NIXL refused the transfer descriptors")
    handle = agent.initialize_xfer(op, ld, rd, remote_agent, notif, list(backends))
    state = agent.transfer(handle)
    if state == "ERR":
        agent.release_xfer_handle(handle)
        raise TransferError("NIXL reported the transfer failed when posting it (state ERR)")
    return Transfer(agent, handle, views, state, len(lp))


def wait_notification(
    agent: Any, remote_agent: str, tag: bytes, timeout: Optional[float] = 30.0
) -> None:
    """Returns once ``remote_agent`` has notified ``tag`` (a transfer's ``notif``): the
    data it wrote has landed, and consumers may use it. ``TransferError`` after ``timeout``
    seconds (``None``: no limit). NIXL signals completion to the host only, so consumers are
    ordered by enqueuing their work after this returns."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while not agent.check_remote_xfer_done(remote_agent, tag):
        if deadline is not None and time.monotonic() > deadline:
            raise TransferError(f"no notification {tag!r} from {remote_agent!r} in {timeout} s")
        time.sleep(0.0005)
