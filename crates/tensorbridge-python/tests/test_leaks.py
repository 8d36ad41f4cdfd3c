"""Leak tests: 100 000 conversions per path (``TB_LEAK_N`` to change it); the producer's reference count must come back to
exactly where it was, and the resident set size (``/proc/self/statm``) may grow by at most
``RSS_TOLERANCE`` after a warm-up.

Why that tolerance: one leaked DLPack struct (64-80 bytes) plus its shape/strides per
conversion is >= 8 MB over 100 000 conversions, and a leaked Python object per conversion is
>= 3 MB; the allocator's own noise after warm-up, measured on the build machine, is well under
1 MiB. 2 MiB separates the two.
"""

import ctypes
import gc
import os
import sys
import time

import numpy as np
import pytest

from tbhelpers import aligned_numpy, np_take, rss_bytes

# TB_LEAK_N overrides it, for the 1e6-conversion soak (`TB_LEAK_N=1000000 pytest ...`).
N = int(os.environ.get("TB_LEAK_N", 100_000))
WARMUP = 5_000
RSS_TOLERANCE = 2 * 1024 * 1024


class AIOnly:
    def __init__(self, a):
        self.a = a
        self.__array_interface__ = a.__array_interface__


def _paths(tb):
    """name -> (object whose refcount must stay flat, one conversion)."""
    a = aligned_numpy((4, 4), np.float32, fill=1)
    ai = AIOnly(a)
    ba = bytearray(64)
    v = tb.asview(a)
    ro = a.copy()
    ro.flags.writeable = False
    rv = tb.asview(ro)

    class Masked:
        def __init__(self):
            self.__array_interface__ = dict(a.__array_interface__, mask=np.ones(16, bool))

    masked = Masked()

    def refuse_legacy():
        try:
            rv.__dlpack__()
        except BufferError:
            pass

    def refuse_mask():
        try:
            tb.asview(masked)
        except ValueError:
            pass

    paths = {
        "asview(numpy)": (a, lambda: tb.asview(a)),
        "np.from_dlpack(asview(numpy))": (a, lambda: np.from_dlpack(tb.asview(a))),
        "asview(__array_interface__)": (ai, lambda: tb.asview(ai)),
        "asview(bytearray)": (ba, lambda: tb.asview(ba)),
        "asview(capsule)": (a, lambda: tb.asview(a.__dlpack__())),
        "unconsumed __dlpack__ capsules": (v, lambda: (v.__dlpack__(), v.__dlpack__(max_version=(1, 3)))),
        "refused: legacy export of read-only": (rv, refuse_legacy),
        "refused: masked __array_interface__": (masked, refuse_mask),
    }
    try:
        import torch

        t = torch.ones(4, 4)
        paths["torch.from_dlpack(asview(torch))"] = (t, lambda: torch.from_dlpack(tb.asview(t)))
    except ImportError:
        pass
    return paths


PATH_NAMES = [
    "asview(numpy)",
    "np.from_dlpack(asview(numpy))",
    "asview(__array_interface__)",
    "asview(bytearray)",
    "asview(capsule)",
    "unconsumed __dlpack__ capsules",
    "refused: legacy export of read-only",
    "refused: masked __array_interface__",
    "torch.from_dlpack(asview(torch))",
]


def _measure(fn, obj):
    for _ in range(WARMUP):
        fn()
    gc.collect()
    refs0, rss0 = sys.getrefcount(obj), rss_bytes()
    t0 = time.perf_counter()
    for _ in range(N):
        fn()
    dt = time.perf_counter() - t0
    gc.collect()
    return sys.getrefcount(obj) - refs0, rss_bytes() - rss0, dt


@pytest.mark.parametrize("path", PATH_NAMES)
def test_no_leak(tb, path):
    paths = _paths(tb)
    if path not in paths:
        pytest.skip(f"{path}: framework absent")
    obj, fn = paths[path]
    d_refs, d_rss, dt = _measure(fn, obj)
    print(f"{path}: {N} conversions in {dt:.2f} s ({dt / N * 1e6:.2f} us each), "
          f"refcount {d_refs:+d}, RSS {d_rss / 1024:+.0f} KiB")  # fmt: skip
    assert d_refs == 0, f"{path}: producer refcount changed by {d_refs} over {N} conversions"
    assert d_rss < RSS_TOLERANCE, f"{path}: RSS grew by {d_rss / 2**20:.1f} MiB over {N} conversions"


def test_no_leak_from_ptr_release(tb):
    """from_ptr with owner and release: the release callable runs once per view, the owner's
    refcount comes back, memory stays flat."""
    buf = (ctypes.c_float * 16)()
    addr = ctypes.addressof(buf)
    count = [0]

    def release():
        count[0] += 1

    def fn():
        np.from_dlpack(tb.from_ptr(addr, (4, 4), "float32", device="cpu", owner=buf, release=release))

    d_refs, d_rss, dt = _measure(fn, buf)
    print(f"from_ptr+release: {dt / N * 1e6:.2f} us each, refcount {d_refs:+d}, RSS {d_rss / 1024:+.0f} KiB")
    assert count[0] == N + WARMUP
    assert d_refs == 0
    assert d_rss < RSS_TOLERANCE


def test_no_leak_jax_and_tensorflow(tb):
    """Fewer iterations (these frameworks' own import costs 10-50 us): 20 000 each."""
    n = 20_000
    results = {}
    try:
        import jax

        j = jax.device_put(np.ones(16, np.float32), jax.devices("cpu")[0])
        # JAX arrays are immutable: their views are read-only, which NumPy takes
        results["jax"] = (j, lambda: np_take(tb.asview(j)))
    except ImportError:
        pass
    try:
        import tensorflow as tf

        t = tf.ones(16)
        results["tensorflow"] = (t, lambda: np_take(tb.asview(t)))
    except ImportError:
        pass
    if not results:
        pytest.skip("neither JAX nor TensorFlow present")
    for name, (obj, fn) in results.items():
        for _ in range(2000):
            fn()
        gc.collect()
        refs0, rss0 = sys.getrefcount(obj), rss_bytes()
        for _ in range(n):
            fn()
        gc.collect()
        d_refs, d_rss = sys.getrefcount(obj) - refs0, rss_bytes() - rss0
        print(f"{name}: refcount {d_refs:+d}, RSS {d_rss / 1024:+.0f} KiB over {n}")
        assert d_refs == 0, name
        assert d_rss < RSS_TOLERANCE, name
