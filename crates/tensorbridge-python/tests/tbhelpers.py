"""Shared helpers for the tensorbridge Python test suites (CPU and GPU).

Nothing here imports tensorbridge or a framework at module level, so the GPU suite can use it
on a machine without TensorFlow and the CPU suite on a machine without CuPy.

What lives here:
- ``dlpack``: ctypes mirrors of the DLPack 1.3 structs, a reader for any DLPack capsule
  (``read_capsule``) and a hand-made producer (``HandMadeCapsule``) whose fields a test sets one by
  one and whose deleter is counted, so refusals can be checked to run it exactly once.
- memory: 64-byte aligned NumPy allocations (JAX and XLA copy anything less aligned on the
  host), libc ``malloc``/``free`` through ctypes, the resident set size from ``/proc/self/statm``.
- ``run_isolated``: runs a snippet in a fresh interpreter, for cases where a framework is known to
  abort the process instead of raising (torch 2.11 on negative DLPack strides).
- ``run_release_chains``: runs the release-chain matrix (``release_chains.py``) in a fresh
  interpreter, for the host and the GPU suites.
- versions: ``version_of`` reads an installed distribution's version without importing it, and
  the named facts the suites branch on (``JAX_DLPACK_VERSIONED``): each is one behaviour that a
  release changed, named with the release, so that an expectation that depends on it says so.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from importlib import metadata

# ---------------------------------------------------------------------------------------------
# DLPack 1.3 structs (dlpack.h). Offsets are asserted below, as the 1.3 header lays them out.


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER)]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [
        ("version", DLPackVersion),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", DELETER),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", DLTensor),
    ]


assert ctypes.sizeof(DLTensor) == 48 and DLTensor.byte_offset.offset == 40
assert ctypes.sizeof(DLManagedTensor) == 64 and DLManagedTensor.deleter.offset == 56
assert ctypes.sizeof(DLManagedTensorVersioned) == 80
assert DLManagedTensorVersioned.flags.offset == 24 and DLManagedTensorVersioned.dl_tensor.offset == 32

FLAG_READ_ONLY = 1
FLAG_IS_COPIED = 2
FLAG_SUBBYTE_PADDED = 4

KDLCPU, KDLCUDA, KDLCUDAHOST, KDLCUDAMANAGED = 1, 2, 3, 13

# Capsule C API with c_void_p arguments, as private prototypes (ctypes.pythonapi's shared
# function objects are left untouched).
_api = ctypes.pythonapi
_IsValid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_char_p)(("PyCapsule_IsValid", _api))
_GetName = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.py_object)(("PyCapsule_GetName", _api))
_GetPointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", _api)
)
_GetNameRaw = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.c_void_p)(("PyCapsule_GetName", _api))
_GetPointerRaw = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", _api)
)
_CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_New = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, _CAPSULE_DESTRUCTOR)(
    ("PyCapsule_New", _api)
)


def capsule_name(capsule) -> str:
    """The current name of a PyCapsule ("dltensor", "used_dltensor_versioned", ...)."""
    if type(capsule).__name__ != "PyCapsule":
        raise TypeError(f"expected a PyCapsule, found {type(capsule).__name__}")
    name = _GetName(capsule)
    return name.decode() if name is not None else ""


_SetName = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_char_p)(("PyCapsule_SetName", _api))
# capsules keep the char* of their name: these must live as long as the process
_USED_NAMES = {"dltensor": b"used_dltensor", "dltensor_versioned": b"used_dltensor_versioned"}


def consume_capsule(capsule) -> None:
    """A minimal, correct DLPack consumer: takes the tensor, renames the capsule to its
    ``used_`` name (so its destructor does nothing), and calls the producer's deleter."""
    name = capsule_name(capsule)
    if name not in _USED_NAMES:
        raise ValueError(f"expected a fresh DLPack capsule, found one named {name!r}")
    ptr = _GetPointer(capsule, name.encode())
    _SetName(capsule, _USED_NAMES[name])
    m = (DLManagedTensorVersioned if name == "dltensor_versioned" else DLManagedTensor).from_address(ptr)
    if m.deleter:
        m.deleter(ptr)


@dataclass
class CapsuleInfo:
    name: str
    versioned: bool
    version: tuple[int, int] | None
    flags: int
    data: int
    byte_offset: int
    device: tuple[int, int]
    dtype: tuple[int, int, int]
    shape: tuple[int, ...]
    strides: tuple[int, ...] | None  # None when the producer sent NULL strides

    @property
    def ptr(self) -> int:
        """Address of element 0 (data + byte_offset)."""
        return self.data + self.byte_offset

    @property
    def read_only(self) -> bool:
        return bool(self.flags & FLAG_READ_ONLY)

    @property
    def is_copied(self) -> bool:
        return bool(self.flags & FLAG_IS_COPIED)


def capsule_struct(capsule):
    """The managed struct inside a fresh DLPack capsule, as a ctypes structure over its memory
    (writes go to the struct itself: what a consumer that edits the struct does), without
    consuming the capsule."""
    name = capsule_name(capsule)
    if name not in ("dltensor", "dltensor_versioned"):
        raise ValueError(f"expected a fresh DLPack capsule, found one named {name!r}")
    ptr = _GetPointer(capsule, name.encode())
    kind = DLManagedTensorVersioned if name == "dltensor_versioned" else DLManagedTensor
    return kind.from_address(ptr)


def read_capsule(capsule) -> CapsuleInfo:
    """Reads a fresh DLPack capsule without consuming it.

    The capsule keeps its name, so its own destructor still runs the producer's deleter when
    it is collected: reading leaks nothing.
    """
    name = capsule_name(capsule)
    if name not in ("dltensor", "dltensor_versioned"):
        raise ValueError(f"expected a fresh DLPack capsule, found one named {name!r}")
    ptr = _GetPointer(capsule, name.encode())
    if name == "dltensor_versioned":
        m = DLManagedTensorVersioned.from_address(ptr)
        return _tensor_info(name, (m.version.major, m.version.minor), int(m.flags), m.dl_tensor)
    m = DLManagedTensor.from_address(ptr)
    return _tensor_info(name, None, 0, m.dl_tensor)


_KEEP: dict = {}


def _capsule_destructor_impl(capsule_ptr):
    # Only an unused capsule still owns its tensor (PYSPEC 2.3): a consumer renames it.
    name = _GetNameRaw(capsule_ptr)
    if name not in (b"dltensor", b"dltensor_versioned"):
        return
    m_addr = _GetPointerRaw(capsule_ptr, name)
    entry = _KEEP.get(m_addr)
    if entry is not None and not entry[5]:
        entry[3](m_addr)


# One thunk for every hand-made capsule, alive as long as the module.
_capsule_destructor = _CAPSULE_DESTRUCTOR(_capsule_destructor_impl)


@dataclass
class HandMadeCapsule:
    """A DLPack producer built field by field, for feeding tensorbridge untrusted descriptors.

    ``make()`` returns a fresh capsule. Its capsule destructor runs the deleter only while the
    capsule still has its unused name (the PYSPEC rule), and the deleter counts its calls in
    ``deleted``, so a test can check that every path (accepted, refused, never consumed) runs
    it exactly once. The memory the tensor describes is kept in ``keep`` (it is never freed by
    the deleter; the counter is the point).
    """

    data: int
    shape: tuple[int, ...]
    strides: tuple[int, ...] | None = None
    dtype: tuple[int, int, int] = (2, 32, 1)  # float32
    device: tuple[int, int] = (KDLCPU, 0)
    byte_offset: int = 0
    versioned: bool = True
    version: tuple[int, int] = (1, 3)
    flags: int = 0
    ndim: int | None = None  # override to lie about the rank
    null_deleter: bool = False
    keep: object = None
    deleted: int = 0

    def make(self):
        ndim = len(self.shape) if self.ndim is None else self.ndim
        shape_arr = (ctypes.c_int64 * max(len(self.shape), 1))(*self.shape)
        strides_arr = None
        if self.strides is not None:
            strides_arr = (ctypes.c_int64 * max(len(self.strides), 1))(*self.strides)
        if self.versioned:
            m = DLManagedTensorVersioned()
            m.version.major, m.version.minor = self.version
            m.flags = self.flags
            name = b"dltensor_versioned"
        else:
            m = DLManagedTensor()
            name = b"dltensor"
        t = m.dl_tensor
        t.data = self.data or None
        t.device.device_type, t.device.device_id = self.device
        t.ndim = ndim
        t.dtype.code, t.dtype.bits, t.dtype.lanes = self.dtype
        t.shape = ctypes.cast(shape_arr, ctypes.POINTER(ctypes.c_int64))
        t.strides = (
            ctypes.cast(strides_arr, ctypes.POINTER(ctypes.c_int64))
            if strides_arr is not None
            else ctypes.POINTER(ctypes.c_int64)()
        )
        t.byte_offset = self.byte_offset

        def deleter(_self_ptr):
            self.deleted += 1

        deleter_fn = DELETER() if self.null_deleter else DELETER(deleter)
        m.deleter = deleter_fn
        m_addr = ctypes.addressof(m)
        # Everything the C side points into (the struct, shape/strides, the deleter thunk) is
        # kept for the life of the process: a consumer may call the deleter long after this
        # object is gone, and a used capsule may outlive everything else.
        _KEEP[m_addr] = (m, shape_arr, strides_arr, deleter_fn, name, self.null_deleter)
        return _New(m_addr, name, _capsule_destructor)


# ---------------------------------------------------------------------------------------------
# The DLPack C exchange API (DLPack 1.3: `type(x).__dlpack_c_exchange_api__`), as a ctypes
# consumer: the table's functions are called with the GIL held and report failures as -1 with
# a Python exception set, so they are PYFUNCTYPE prototypes (ctypes raises that exception).

SET_ERROR = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p)
ALLOCATOR = ctypes.PYFUNCTYPE(
    ctypes.c_int,
    ctypes.POINTER(DLTensor),
    ctypes.POINTER(ctypes.c_void_p),
    ctypes.c_void_p,
    SET_ERROR,
)
FROM_PY = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.POINTER(ctypes.c_void_p))
TO_PY = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p))
DLTENSOR_FROM_PY = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.POINTER(DLTensor))
CURRENT_WORK_STREAM = ctypes.PYFUNCTYPE(
    ctypes.c_int, ctypes.c_int32, ctypes.c_int32, ctypes.POINTER(ctypes.c_void_p)
)


class DLPackExchangeAPI(ctypes.Structure):
    _fields_ = [
        ("version", DLPackVersion),
        ("prev_api", ctypes.c_void_p),
        ("managed_tensor_allocator", ctypes.c_void_p),
        ("managed_tensor_from_py_object_no_sync", ctypes.c_void_p),
        ("managed_tensor_to_py_object_no_sync", ctypes.c_void_p),
        ("dltensor_from_py_object_no_sync", ctypes.c_void_p),
        ("current_work_stream", ctypes.c_void_p),
    ]


assert DLPackExchangeAPI.managed_tensor_allocator.offset == 16
assert DLPackExchangeAPI.current_work_stream.offset == 48 and ctypes.sizeof(DLPackExchangeAPI) == 56

_DecRef = ctypes.PYFUNCTYPE(None, ctypes.c_void_p)(("Py_DecRef", _api))


@dataclass
class ExchangeTable:
    """A type's exchange table, read from its capsule: its address, the struct, and each
    function as a callable (``None`` where the pointer is NULL)."""

    address: int
    table: DLPackExchangeAPI
    allocator: object
    from_py: object
    to_py: object
    dltensor_from_py: object
    current_work_stream: object

    def to_py_object(self, managed: int):
        """``managed_tensor_to_py_object_no_sync``: the new object (its new reference taken
        over), or the exception the function set."""
        out = ctypes.c_void_p(0)
        rc = self.to_py(managed, ctypes.byref(out))
        assert rc == 0 and out.value
        obj = ctypes.cast(out, ctypes.py_object).value  # a second reference
        _DecRef(out.value)  # the one the function handed over
        return obj


def exchange_table(cls) -> ExchangeTable:
    """The DLPack 1.3 exchange table ``cls`` publishes (its capsule named
    ``dlpack_exchange_api``)."""
    capsule = cls.__dlpack_c_exchange_api__
    assert capsule_name(capsule) == "dlpack_exchange_api"
    address = _GetPointer(capsule, b"dlpack_exchange_api")
    table = DLPackExchangeAPI.from_address(address)

    def fn(proto, field):
        ptr = getattr(table, field)
        return proto(ptr) if ptr else None

    return ExchangeTable(
        address=address,
        table=table,
        allocator=fn(ALLOCATOR, "managed_tensor_allocator"),
        from_py=fn(FROM_PY, "managed_tensor_from_py_object_no_sync"),
        to_py=fn(TO_PY, "managed_tensor_to_py_object_no_sync"),
        dltensor_from_py=fn(DLTENSOR_FROM_PY, "dltensor_from_py_object_no_sync"),
        current_work_stream=fn(CURRENT_WORK_STREAM, "current_work_stream"),
    )


def managed_info(address: int) -> CapsuleInfo:
    """The fields of a DLManagedTensorVersioned at ``address`` (as ``read_capsule`` reads them)."""
    m = DLManagedTensorVersioned.from_address(address)
    return _tensor_info("managed", (m.version.major, m.version.minor), int(m.flags), m.dl_tensor)


def dltensor_info(t: DLTensor) -> CapsuleInfo:
    """The fields of a bare DLTensor (no version, no flags)."""
    return _tensor_info("dltensor", None, 0, t)


def _tensor_info(name, version, flags, t) -> CapsuleInfo:
    ndim = t.ndim
    shape = tuple(t.shape[i] for i in range(ndim)) if ndim and t.shape else ()
    strides = tuple(t.strides[i] for i in range(ndim)) if (ndim and t.strides) else (None if ndim else ())
    return CapsuleInfo(
        name=name,
        versioned=version is not None,
        version=version,
        flags=flags,
        data=t.data or 0,
        byte_offset=int(t.byte_offset),
        device=(t.device.device_type, t.device.device_id),
        dtype=(t.dtype.code, t.dtype.bits, t.dtype.lanes),
        shape=shape,
        strides=strides,
    )


def delete_managed(address: int) -> None:
    """Calls the deleter of the DLManagedTensorVersioned at ``address`` (a consumer done with it)."""
    m = DLManagedTensorVersioned.from_address(address)
    if m.deleter:
        m.deleter(address)


# ---------------------------------------------------------------------------------------------
# Memory


def aligned_numpy(shape, dtype, align: int = 64, fill=None):
    """A NumPy array whose data pointer is ``align``-byte aligned (JAX/XLA copy on the host
    unless the buffer is 64-byte aligned; see the table in the test report)."""
    import numpy as np

    dt = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    raw = np.empty(n + align, dtype=np.uint8)
    off = (-raw.ctypes.data) % align
    arr = raw[off : off + n].view(dt).reshape(shape)
    if fill is not None:
        arr[...] = fill
    return arr


_libc = None


def libc():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None)
        _libc.malloc.restype = ctypes.c_void_p
        _libc.malloc.argtypes = [ctypes.c_size_t]
        _libc.free.restype = None
        _libc.free.argtypes = [ctypes.c_void_p]
        _libc.memset.restype = ctypes.c_void_p
        _libc.memset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    return _libc


def rss_bytes() -> int:
    """Resident set size of this process, from /proc/self/statm (no psutil needed)."""
    with open("/proc/self/statm") as f:
        resident_pages = int(f.read().split()[1])
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


def run_isolated(code: str, timeout: float = 240.0) -> subprocess.CompletedProcess:
    """Runs ``code`` in a fresh interpreter with this test directory on ``sys.path``.

    Used where a framework kills the process instead of raising: the test then sees a
    negative return code (the signal) instead of losing the whole pytest run.
    """
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH", "")) if p)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def describe_exc(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


def run_release_chains(device: str, threads: int, timeout: float = 300.0) -> dict:
    """Runs ``release_chains.py`` (beside this file) in a fresh interpreter and returns its
    RESULT dict; fails naming the chain that was running if the interpreter died."""
    import json

    import pytest

    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH", "")) if p)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    r = subprocess.run(
        [sys.executable, os.path.join(here, "release_chains.py"), "--device", device, "--threads", str(threads)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    lines = r.stdout.splitlines()
    started = [line for line in lines if line.startswith("START ")]
    result = [line for line in lines if line.startswith("RESULT ")]
    if r.returncode != 0 or not result:
        pytest.fail(
            f"release_chains.py --device {device} --threads {threads} died (rc {r.returncode}) "
            f"during: {started[-1] if started else '?'}\n{r.stderr[-3000:]}"
        )
    return json.loads(result[-1][len("RESULT ") :])


# --- versions -----------------------------------------------------------------------------------


def version_of(dist: str) -> tuple[int, ...] | None:
    """The installed version of the distribution ``dist`` as numbers ((0, 12, 0, 1) for
    "0.12.0.1"; a suffix such as "+cu130" or "rc1" ends it), without importing it; None when it
    is not installed."""
    try:
        text = metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None
    out = []
    for part in text.split("+")[0].split("."):
        digits = ""
        for ch in part:
            if not ch.isdigit():
                break
            digits += ch
        if not digits:
            break
        out.append(int(digits))
        if len(digits) < len(part):
            break
    return tuple(out)


def at_least(dist: str, version: tuple[int, ...]) -> bool:
    """Whether ``dist`` is installed at ``version`` or later."""
    have = version_of(dist)
    return have is not None and have >= version


def jax_before(version: tuple[int, ...]) -> bool:
    """Whether JAX is installed at a release older than ``version``."""
    have = version_of("jax")
    return have is not None and have < version


# NumPy 2.1 speaks DLPack 1.x: ``ndarray.__dlpack__(max_version=...)``, versioned capsules
# that carry READ_ONLY, ``np.from_dlpack(x, copy=..., device=...)``, and writable arrays from
# producers that say they are writable. NumPy 2.0 and older (1.26.4 and 2.0.2 measured) export
# and ask for legacy capsules only, and every array ``np.from_dlpack`` makes is read-only (a
# legacy capsule cannot say whether the memory may be written): a read-only tensorbridge view
# is refused to it (BufferError), and nothing can be written through its imports.
NUMPY_DLPACK_VERSIONED = at_least("numpy", (2, 1))

def np_take(v):
    """NumPy's zero-copy import of ``v``: ``np.from_dlpack`` where NumPy speaks DLPack 1.x
    (2.1+). NumPy 2.0 and older ask for a legacy capsule, which a read-only view refuses, and
    make every such array read-only; there the array interface (``np.asarray``), which carries
    read-only both ways, stands in."""
    import numpy as np

    return np.from_dlpack(v) if NUMPY_DLPACK_VERSIONED else np.asarray(v)


# NumPy 2.0 made ``np.bool_`` an alias of ``np.bool``, whose ``__name__`` is "bool"; in NumPy
# 1.x it is "bool_".
NUMPY_1 = not at_least("numpy", (2,))

# JAX 0.4 (0.4.30 and 0.4.38 measured; 0.10.2 has neither): no DLPack type codes for the
# float8 family (7-14: "Unknown or invalid DLPack type code"), and a column-major DLPack import
# that it accepts and then fails its own layout check on first use.
JAX_0_4 = jax_before((0, 5))


def needs_numpy_dlpack_1(test):
    """Skips ``test`` under NumPy 2.0 and older, for tests that use NumPy as a DLPack 1.x
    consumer or producer (``max_version``, ``copy=``, READ_ONLY, or writing through
    ``np.from_dlpack``'s array); the version is in the reason."""
    import pytest

    return pytest.mark.skipif(
        not NUMPY_DLPACK_VERSIONED,
        reason=f"NumPy {metadata.version('numpy')} < 2.1 speaks legacy DLPack only (read-only "
        "np.from_dlpack arrays, no max_version or copy=)",
    )(test)


# JAX 0.12 speaks versioned DLPack both ways: ``__dlpack__(max_version=(1, 3))`` returns a
# ``dltensor_versioned`` capsule flagged READ_ONLY (JAX arrays are immutable), and
# ``jax.dlpack.from_dlpack`` asks its producer with ``max_version=(1, 3)``. JAX 0.11 and older
# export and ask for legacy capsules only (no flags: a view of a JAX array was writable, a
# read-only view was refused to JAX).
JAX_DLPACK_VERSIONED = at_least("jax", (0, 12))


def eventually(cond, timeout=20.0):
    """Whether ``cond()`` holds within ``timeout`` seconds (collecting garbage between
    tries, so that released views let go of what they pin)."""
    import gc
    import time

    deadline = time.time() + timeout
    while time.time() < deadline:
        if cond():
            return True
        gc.collect()
        time.sleep(0.01)
    return cond()
