"""Lifetime and leaks on the GPU: device memory stays allocated while a view or a consumer
uses it, is freed after the last one, and 20 000 hand-offs leave the producer's refcount,
the frameworks' device memory and the host RSS where they were.
"""

import gc
import sys
import time

import pytest

import tensorbridge as tb
from gpu_frameworks import cudart
from tbhelpers import rss_bytes

N = 20_000


def eventually(cond, timeout=2.0):
    """True once ``cond()`` holds: releases that wait for device work may be reclaimed a little
    later (on the next tensorbridge call), not at the ``del``."""
    end = time.monotonic() + timeout
    while True:
        gc.collect()
        if cond():
            return True
        if time.monotonic() > end:
            return False
        tb.asview(bytearray(1))  # any call gives deferred releases a chance to run
        time.sleep(0.01)
RSS_TOLERANCE = 4 * 1024 * 1024  # a leaked event or capsule per hand-off would be >= 5 MB


def test_torch_storage_outlives_the_tensor_object():
    torch = pytest.importorskip("torch")
    cupy = pytest.importorskip("cupy")
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    t = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
    ptr = t.data_ptr()
    v = tb.asview(t)
    del t
    gc.collect()
    assert torch.cuda.memory_allocated() - base >= 4 << 20, "torch freed the storage under a live view"
    c = cupy.from_dlpack(v)
    del v
    gc.collect()
    assert torch.cuda.memory_allocated() - base >= 4 << 20
    assert c.data.ptr == ptr and float(c[12345]) == 12345.0
    del c
    torch.cuda.synchronize()
    assert eventually(lambda: torch.cuda.memory_allocated() == base), "storage not freed after the last consumer"


def test_cupy_memory_outlives_the_array_object():
    torch = pytest.importorskip("torch")
    cupy = pytest.importorskip("cupy")
    pool = cupy.get_default_memory_pool()
    cupy.cuda.Device().synchronize()
    base = pool.used_bytes()
    a = cupy.arange(1 << 20, dtype=cupy.float32)
    v = tb.asview(a)
    del a
    gc.collect()
    assert pool.used_bytes() - base >= 4 << 20
    t = torch.from_dlpack(v)
    del v
    gc.collect()
    assert t[777].item() == 777.0
    del t
    torch.cuda.synchronize()
    assert eventually(lambda: pool.used_bytes() == base), "CuPy memory not freed after the last consumer"


def _measure(fn, obj):
    for _ in range(1000):
        fn()
    gc.collect()
    refs0, rss0 = sys.getrefcount(obj), rss_bytes()
    t0 = time.perf_counter()
    for _ in range(N):
        fn()
    dt = time.perf_counter() - t0
    eventually(lambda: sys.getrefcount(obj) <= refs0)
    return sys.getrefcount(obj) - refs0, rss_bytes() - rss0, dt


def test_no_leak_torch_to_cupy():
    torch = pytest.importorskip("torch")
    cupy = pytest.importorskip("cupy")
    t = torch.ones(1024, device="cuda")
    torch.cuda.synchronize()
    mem0 = torch.cuda.memory_allocated()
    d_refs, d_rss, dt = _measure(lambda: cupy.from_dlpack(tb.asview(t)), t)
    torch.cuda.synchronize()
    print(f"torch -> cupy: {dt / N * 1e6:.1f} us, refcount {d_refs:+d}, RSS {d_rss / 1024:+.0f} KiB")
    assert d_refs == 0 and d_rss < RSS_TOLERANCE
    assert eventually(lambda: torch.cuda.memory_allocated() == mem0)


def test_no_leak_cupy_to_torch_on_a_side_stream():
    """Each hand-off makes torch's side stream wait (a pooled event): none may pile up."""
    torch = pytest.importorskip("torch")
    cupy = pytest.importorskip("cupy")
    a = cupy.ones(1024, cupy.float32)
    s = torch.cuda.Stream()

    def handoff():
        with torch.cuda.stream(s):
            torch.from_dlpack(tb.asview(a))

    d_refs, d_rss, dt = _measure(handoff, a)
    s.synchronize()
    print(f"cupy -> torch (side stream): {dt / N * 1e6:.1f} us, refcount {d_refs:+d}, RSS {d_rss / 1024:+.0f} KiB")
    assert d_refs == 0 and d_rss < RSS_TOLERANCE


def test_no_leak_from_ptr_cuda_release_counted():
    torch = pytest.importorskip("torch")
    rt = cudart()
    p = rt.malloc(1 << 20)
    count = [0]

    def release():
        count[0] += 1

    holder = object()
    try:
        d_refs, d_rss, dt = _measure(
            lambda: torch.from_dlpack(tb.from_ptr(p, (1024,), "float32", device="cuda:0", owner=holder, release=release)),
            holder,
        )
        print(f"from_ptr(cuda) -> torch: {dt / N * 1e6:.1f} us, RSS {d_rss / 1024:+.0f} KiB")
        assert eventually(lambda: count[0] == N + 1000), count[0]
        assert d_refs == 0 and d_rss < RSS_TOLERANCE
    finally:
        torch.cuda.synchronize()
        rt.free(p)
