"""Every ordered pair of PyTorch, CuPy, JAX, Numba and cuda.core on the GPU through
tensorbridge (producer -> tb.asview -> consumer), and every consumer of a raw cudaMalloc
pointer (tb.from_ptr): zero-copy proven by pointer equality (pointers read without
tensorbridge) and by writes both ways (each side's write seen by the other). A dtype sweep
covers the frameworks that hold typed device arrays.

Consumers: torch.from_dlpack, cupy.from_dlpack, cupy.asarray (CUDA Array Interface),
jax.dlpack.from_dlpack, numba.cuda.as_cuda_array (CUDA Array Interface), and cuda.core's
StridedMemoryView.
"""

import gc
import statistics
import time

import numpy as np
import pytest

import tensorbridge as tb
from gpu_frameworks import (BY_NAME, CONSUMERS, PRODUCERS, cudart, device_values, np_dtype,
                            refused_read_only, writer)

P_IDS = [p.name for p in PRODUCERS]
C_IDS = [c.name for c in CONSUMERS]
N = 1024


def _median_us(fn, n=50, warmup=5):
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e6


def _at(a, i):
    return np.asarray(a).reshape(-1)[i]


@pytest.mark.parametrize("consumer", C_IDS)
@pytest.mark.parametrize("producer", P_IDS)
def test_pair_zero_copy(producer, consumer, record):
    p, c = BY_NAME[producer].require(), BY_NAME[consumer].require()
    values = (np.arange(N, dtype=np.float32) * 0.5 - 7).astype(np.float32)
    x = p.make(values)
    v = tb.asview(x)
    assert v.device == "cuda:0"
    assert v.ptr == p.ptr(x)
    expected = values.view(np_dtype(v.dtype))  # cuda.core's Buffer exports bytes
    if refused_read_only(c, v, p):
        record(producer=producer, via="asview", consumer=consumer, dtype=v.dtype,
               ptr_equal=None, write_visible=None, note="refused: read-only into a legacy capsule")  # fmt: skip
        return
    y = c.consume(v)
    assert c.ptr(y) == p.ptr(x), f"{producer} -> {consumer} is not zero-copy"
    np.testing.assert_array_equal(c.read(y).reshape(-1), expected.reshape(-1))

    # Writes both ways: through the consumer at element 0 (seen by the producer), through the
    # producer at element 1 (seen by the consumer); a side that cannot write (JAX, cuda.core)
    # is stood in for by torch or CuPy importing the same view.
    third = []

    def writer_of(fw, obj):
        if fw.writable:
            return fw, obj
        if not third:
            w = writer()
            z = w.consume(v)
            assert w.ptr(z) == p.ptr(x)
            third.append((w, z))
        return third[0]

    w, target = writer_of(c, y)
    w.write_flat(target, 0, 42)
    seen0 = _at(p.read(x), 0) == 42 and _at(c.read(y), 0) == 42
    w, target = writer_of(p, x)
    w.write_flat(target, 1, 43)
    seen1 = _at(c.read(y), 1) == 43 and _at(p.read(x), 1) == 43
    seen = bool(seen0 and seen1)
    us = _median_us(lambda: c.consume(tb.asview(x)))
    record(producer=producer, via="asview", consumer=consumer, dtype=v.dtype,
           ptr_equal=True, write_visible=bool(seen), us=us)  # fmt: skip
    assert seen0, f"a write on the consumer side ({consumer}) is not seen by {producer}"
    assert seen1, f"a write on the producer side ({producer}) is not seen by {consumer}"


@pytest.mark.parametrize("consumer", C_IDS)
def test_raw_cuda_malloc_pointer(consumer, record):
    """Memory a C library allocated (cudaMalloc through ctypes), described with tb.from_ptr,
    released with cudaFree exactly once after the last consumer is gone."""
    c = BY_NAME[consumer].require()
    rt = cudart()
    n = 4096
    p = rt.malloc(n * 4)
    rt.to_device(p, np.arange(n, dtype=np.float32))
    freed = []

    def release():
        freed.append(p)
        rt.free(p)

    v = tb.from_ptr(p, (64, 64), "float32", device="cuda:0", release=release)
    assert (v.ptr, v.shape, v.strides, v.device) == (p, (64, 64), (64, 1), "cuda:0")
    y = c.consume(v)
    assert c.ptr(y) == p
    np.testing.assert_array_equal(c.read(y).reshape(-1), np.arange(n, dtype=np.float32))
    w = writer(c)
    target = y if w is c else w.consume(v)
    w.write0(target, 42)
    seen = device_values(p, (n,), np.float32)[0] == 42
    us = _median_us(lambda: c.consume(tb.from_ptr(p, (64, 64), "float32", device="cuda:0", owner=v)))
    del target
    record(producer="cudaMalloc", via="from_ptr", consumer=consumer, dtype="float32",
           ptr_equal=True, write_visible=bool(seen), us=us)  # fmt: skip
    assert seen
    del v
    gc.collect()
    assert freed == [], "cudaFree ran while a consumer still holds the memory"
    del y
    gc.collect()
    assert freed == [p], f"release ran {len(freed)} times"


@pytest.mark.parametrize("alloc", ["cupy.cuda.runtime.malloc", "cuda.core Device.allocate"])
def test_other_raw_allocations(alloc, record):
    torch = pytest.importorskip("torch")
    if alloc.startswith("cupy"):
        cupy = pytest.importorskip("cupy")
        p = cupy.cuda.runtime.malloc(1 << 20)
        owner, release = None, (lambda: cupy.cuda.runtime.free(p))
    else:
        pytest.importorskip("cuda.core")
        from gpu_frameworks import cuda_core_allocate

        buf = cuda_core_allocate(1 << 20)
        p, owner, release = int(buf.handle), buf, None
    v = tb.from_ptr(p, (1 << 18,), "float32", device="cuda:0", owner=owner, release=release)
    t = torch.from_dlpack(v)
    t.fill_(3.0)
    torch.cuda.synchronize()
    ok = (device_values(p, (4,), np.float32) == 3).all()
    record(producer=alloc, via="from_ptr", consumer="torch", dtype="float32",
           ptr_equal=t.data_ptr() == p, write_visible=bool(ok))  # fmt: skip
    assert t.data_ptr() == p and ok


# --- dtypes -----------------------------------------------------------------------------------

DTYPES = ["bool", "int8", "uint8", "int16", "int32", "int64", "uint64", "float16", "bfloat16",
          "float32", "float64", "complex64", "complex128"]  # fmt: skip
TYPED = ["torch", "cupy", "jax", "numba"]


def _sample(dt):
    i = np.arange(48)
    if dt == "bool":
        return (i % 3) == 1
    if dt.startswith(("int", "uint")):
        v = i.astype(dt)
        v[-1] = np.iinfo(dt).max
        return v
    if dt.startswith("complex"):
        return (i - 5 + 1j * (48 - i)).astype(dt)
    return (i * 0.5 - 3).astype(np.float32).astype(np_dtype(dt))


# What a framework itself cannot do, measured on the GPU machine (H200, numba-cuda 0.30,
# NumPy 2.5): exactly this refusal is asserted, anything else fails.
PRODUCER_LIMITS = {("numba", "bfloat16"): (ValueError, "cannot include dtype 'E'")}
# No consumer refused a dtype a producer could hold in the first GPU run: any refusal fails.
CONSUMER_LIMITS: dict = {}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("consumer", TYPED + ["cuda.core"])
@pytest.mark.parametrize("producer", TYPED)
def test_dtype_pair(producer, consumer, dtype):
    """Every dtype a producer can hold, into every consumer: shared and equal. The producer
    limits above are asserted as such (the framework's refusal, not tensorbridge's)."""
    p, c = BY_NAME[producer].require(), BY_NAME[consumer].require()
    values = _sample(dtype)
    limit = PRODUCER_LIMITS.get((producer, dtype))
    if limit is not None:
        with pytest.raises(limit[0], match=limit[1]):
            p.make(values)
        return
    x = p.make(values)
    v = tb.asview(x)
    assert v.dtype == dtype and v.ptr == p.ptr(x)
    limit = CONSUMER_LIMITS.get((consumer, dtype))
    if limit is not None:
        with pytest.raises(limit[0], match=limit[1]):
            c.consume(v)
        gc.collect()
        assert v.ptr == p.ptr(x)
        return
    if refused_read_only(c, v, p):
        return
    y = c.consume(v)
    assert c.ptr(y) == p.ptr(x)
    got = c.read(y)
    if dtype == "bfloat16":
        got, values = np.asarray(got).view(np.uint16), values.view(np.uint16)
    np.testing.assert_array_equal(np.asarray(got).reshape(-1), values.reshape(-1))
