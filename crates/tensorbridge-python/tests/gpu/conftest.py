"""The GPU suite: skipped as a whole where no CUDA device answers (asked through the driver
with ctypes, independently of any framework), run from the GPU bundle otherwise:

    python3 -m pytest -q -p no:cacheprovider --rootdir <tests> <tests>/gpu

Each pair test records a row (producer, consumer, pointer equal, write visible, time per
conversion); the rows are printed as one table at the end of the run.
"""

import ctypes
import os

import pytest

# Before any framework is imported: JAX must not take 75 % of the GPU (torch, CuPy and Numba
# share it in this process), and it must see 64-bit types.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
os.environ.setdefault("JAX_ENABLE_X64", "1")


def _cuda_devices() -> tuple[int, str]:
    """(number of CUDA devices, why none) from libcuda itself."""
    for name in ("libcuda.so.1", "libcuda.so"):
        try:
            cu = ctypes.CDLL(name)
            break
        except OSError:
            continue
    else:
        return 0, "no CUDA driver (libcuda.so.1 not found)"
    if cu.cuInit(0) != 0:
        return 0, "cuInit failed (no usable CUDA device)"
    n = ctypes.c_int(0)
    if cu.cuDeviceGetCount(ctypes.byref(n)) != 0 or n.value == 0:
        return 0, "no CUDA device"
    return n.value, ""


N_DEVICES, WHY_NOT = _cuda_devices()


def pytest_collection_modifyitems(config, items):
    if N_DEVICES:
        return
    skip = pytest.mark.skip(reason=f"GPU suite: {WHY_NOT}")
    here = os.path.dirname(os.path.abspath(__file__))
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(skip)


ROWS: list[dict] = []


@pytest.fixture
def record():
    """``record(producer=..., consumer=..., ptr_equal=..., write_visible=..., us=..., note=...)``"""

    def add(**row):
        ROWS.append(row)

    return add


def pytest_terminal_summary(terminalreporter):
    if not ROWS:
        return
    tr = terminalreporter
    tr.section("tensorbridge GPU hand-offs")
    cols = ["producer", "via", "consumer", "dtype", "ptr_equal", "write_visible", "us", "note"]
    table = [[_fmt(r.get(c)) for c in cols] for r in ROWS]
    widths = [max(len(c), *(len(row[i]) for row in table)) for i, c in enumerate(cols)]
    tr.write_line("  ".join(c.ljust(w) for c, w in zip(cols, widths)))
    tr.write_line("  ".join("-" * w for w in widths))
    for row in table:
        tr.write_line("  ".join(v.ljust(w) for v, w in zip(row, widths)))


def _fmt(v):
    if v is None:
        return "-"
    if v is True:
        return "yes"
    if v is False:
        return "NO"
    if isinstance(v, float):
        return f"{v:.1f}"
    return str(v)
