"""Owners of a kernel call's arguments are released a bounded time after the kernel finishes,
with no further tensorbridge call (not at the next one): after ``axpy(a, x, y); del y``, ``y``
lives while the kernel is pending and goes soon after it ends. ``y`` is an object whose
``__cuda_array_interface__`` exports a torch buffer, so the import's owner is the object
itself and a weak reference sees its release. The stream is kept busy ~300 ms before the
kernel; the release must come after that (never early) and within a bound after it.
"""

import time
import weakref

import pytest

ext = pytest.importorskip("tensorbridge_example", reason="the example extension is not built")

N = 1 << 16
BUSY_S = 0.3
BOUND_S = 0.15


@pytest.fixture(scope="module")
def torch():
    torch = pytest.importorskip("torch")
    x = torch.zeros(4, device="cuda")
    y = torch.zeros(4, device="cuda")
    ext.axpy(1.0, x, y)  # NVRTC and the module load, once
    torch.cuda.synchronize()
    return torch


@pytest.fixture(scope="module")
def cycles_per_s(torch):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1000)
    s.record()
    torch.cuda._sleep(20_000_000)
    e.record()
    e.synchronize()
    return 20_000_000 / (s.elapsed_time(e) / 1e3)


class Exported:
    """A CUDA Array Interface exporter over a torch buffer: the owner an import keeps."""

    def __init__(self, t):
        self.t = t
        self.__cuda_array_interface__ = {
            "shape": tuple(t.shape),
            "typestr": "<f4",
            "data": (t.data_ptr(), False),
            "version": 3,
            "stream": None,
        }


def test_an_arguments_owner_goes_soon_after_the_kernel_with_no_further_call(
    torch, cycles_per_s
):
    x = torch.ones(N, device="cuda")
    y = torch.zeros(N, device="cuda")
    torch.cuda.synchronize()
    held = Exported(y)
    ref = weakref.ref(held)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(int(cycles_per_s * BUSY_S))
        start = time.monotonic()
        ext.axpy(1.0, x, held)  # on s, after the sleep
    del held
    assert ref() is not None, "released before the kernel ran"
    # No tensorbridge call from here on: only the clock and the weak reference.
    while ref() is not None and time.monotonic() - start < BUSY_S + 2.0:
        time.sleep(0.001)
    after = time.monotonic() - start
    assert ref() is None, f"still alive {after:.3f} s after the call"
    print(f"released {after * 1e3:.0f} ms after the call (stream busy {BUSY_S * 1e3:.0f} ms)")
    assert after >= BUSY_S * 0.9, f"released {after:.3f} s after the call: before the kernel"
    assert after <= BUSY_S + BOUND_S, f"released {after:.3f} s after the call: too late"
    s.synchronize()
    assert float(y[0]) == 1.0
