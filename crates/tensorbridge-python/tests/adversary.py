"""Helpers for the tests that treat the Python object as an adversary (``test_boundary_*.py``,
``test_adversarial.py``): memory whose bounds fault, the byte span a view reaches, and a
runner that executes one function of a test module in a fresh interpreter so that a
segfault fails that one test (with the signal named) instead of killing pytest.

Nothing here imports tensorbridge or a framework at module level.

- ``Guarded``: ``n`` writable bytes placed right before (``where="end"``) or right after
  (``where="start"``) a ``PROT_NONE`` page of an anonymous ``mmap``: a read one byte past
  the end (or before the start) is a segfault, not a silent read of someone else's memory.
- ``view_span(v)``: the half-open byte range ``[lo, hi)`` a ``tensorbridge.View`` reaches
  (``None`` when it has no elements), from its pointer, shape and byte strides.
- ``assert_inside(v, lo, hi)``: the view's span lies inside ``[lo, hi)``.
- ``owned_extent(obj)``: ``[lo, hi)`` of a C-contiguous buffer exporter's whole memory.
- ``run_case(module_file, func, *args)``: ``func(*args)`` of the test module
  ``module_file`` in a fresh interpreter; the test fails with the signal's name and the
  child's output when it dies, and with the child's traceback when it raises.
- ``TYPED_ERRORS``: the exceptions an import may refuse with (design: [refuse]).
"""

from __future__ import annotations

import ctypes
import mmap
import os
import signal
import subprocess
import sys
import textwrap

TYPED_ERRORS = (TypeError, ValueError, BufferError, MemoryError, RuntimeError, NotImplementedError)

PAGE = mmap.PAGESIZE
_PROT_NONE = 0

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.mprotect.restype = ctypes.c_int


def _address_of(buffer) -> int:
    """The address of a writable buffer exporter's first byte (ctypes, no NumPy)."""
    return ctypes.addressof(ctypes.c_char.from_buffer(buffer))


class Guarded:
    """``n`` bytes (``n <= PAGE``) next to a page nothing may touch.

    ``where="end"``: the bytes end where the guard page starts (overruns fault);
    ``where="start"``: they start where the guard page ends (underruns fault).
    ``mv`` is a writable memoryview of exactly those bytes, ``addr`` their first address,
    ``[lo, hi)`` their extent. The mapping lives as long as this object (and every buffer
    exported from it). Filled with ``0, 1, 2, ...`` (mod 256).
    """

    def __init__(self, n: int = 16, where: str = "end"):
        assert 0 < n <= PAGE and where in ("end", "start")
        self.n = n
        self.mm = mmap.mmap(-1, 2 * PAGE)
        base = _address_of(self.mm)
        guard = base + PAGE if where == "end" else base
        if _libc.mprotect(guard, PAGE, _PROT_NONE) != 0:
            raise OSError(ctypes.get_errno(), "mprotect(PROT_NONE) failed")
        first = PAGE - n if where == "end" else PAGE
        self.mv = memoryview(self.mm)[first : first + n]
        self.addr = base + first
        self.lo, self.hi = self.addr, self.addr + n
        self.mv[:] = bytes(i % 256 for i in range(n))


def owned_extent(obj) -> tuple[int, int]:
    """``[lo, hi)`` of a C-contiguous buffer exporter's memory (bytes, bytearray,
    array.array, mmap, a contiguous memoryview), read through NumPy's ``frombuffer``."""
    import numpy as np

    a = np.frombuffer(obj, dtype=np.uint8)
    return a.ctypes.data, a.ctypes.data + a.nbytes


def view_span(v):
    """``[lo, hi)``: the bytes view ``v`` reaches, or ``None`` for a view without elements."""
    if v.size == 0:
        return None
    lo = hi = v.ptr
    for n, s in zip(v.shape, v.byte_strides):
        if s < 0:
            lo += (n - 1) * s
        else:
            hi += (n - 1) * s
    return lo, hi + v.itemsize


def assert_inside(v, lo: int, hi: int, what: str = "the exporter's memory"):
    span = view_span(v)
    if span is None:
        return
    assert lo <= span[0] and span[1] <= hi, (
        f"{v!r} reaches [{span[0]:#x}, {span[1]:#x}) "
        f"({span[0] - lo:+d} .. {span[1] - hi:+d} bytes from its edges), "
        f"outside {what} [{lo:#x}, {hi:#x})"
    )


def read_all(v):
    """Every byte of a host view, copied (a fault here is an overrun the span check missed)."""
    import numpy as np

    return np.array(np.asarray(v), copy=True)


def child_env() -> dict:
    here = os.path.dirname(os.path.abspath(__file__))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH", "")) if p)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    env.setdefault("JAX_ENABLE_X64", "1")
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    return env


def describe_rc(rc: int) -> str:
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit status {rc}"


def run_code(code: str, what: str, timeout: float = 300.0) -> str:
    """Runs ``code`` in a fresh interpreter; fails the calling test naming ``what`` when the
    child dies or exits non-zero. Returns its stdout."""
    import pytest

    r = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=child_env(),
    )
    if r.returncode != 0:
        pytest.fail(
            f"{what}: the child interpreter {describe_rc(r.returncode)}\n"
            f"--- stdout (tail) ---\n{r.stdout[-4000:]}\n--- stderr (tail) ---\n{r.stderr[-6000:]}",
            pytrace=False,
        )
    return r.stdout


def run_case(module_file: str, func: str, *args, timeout: float = 300.0) -> str:
    """``func(*args)`` from the module at ``module_file``, in a fresh interpreter (the
    module's folder and this one on ``sys.path``). ``args`` must round-trip through
    ``repr``."""
    folder = os.path.dirname(os.path.abspath(module_file))
    module = os.path.splitext(os.path.basename(module_file))[0]
    code = f"""
        import sys
        sys.path[:0] = [{folder!r}, {os.path.dirname(os.path.abspath(__file__))!r}]
        import {module} as m
        m.{func}(*{args!r})
        print("CASE DONE", flush=True)
    """
    out = run_code(code, f"{module}.{func}{args!r}", timeout=timeout)
    assert "CASE DONE" in out
    return out
