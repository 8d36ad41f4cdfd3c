"""Smoke tests of the extension module itself, written by the native side (the rest of this
folder belongs to the Python suite): the package's shape, stubs, and the native paths that no
framework reaches on its own (the buffer protocol, the exchange API's fallbacks, capsule
destructors with an exception in flight)."""

import array
import gc
import importlib.resources
import sys

import pytest

from tbhelpers import needs_numpy_dlpack_1


def test_package_shape(tb):
    assert tb.View.__module__ == "tensorbridge"
    assert callable(tb.asview) and callable(tb.from_ptr)
    assert isinstance(tb.__version__, str)
    files = importlib.resources.files("tensorbridge")
    assert files.joinpath("py.typed").is_file()
    assert files.joinpath("_native.pyi").is_file()


def test_view_is_immutable(tb):
    v = tb.asview(bytearray(4))
    with pytest.raises(AttributeError):
        v.ptr = 0
    with pytest.raises(TypeError):
        tb.View()


@needs_numpy_dlpack_1
def test_buffer_protocol_round_trip(tb):
    a = array.array("f", [1.0, 2.0, 3.0])
    v = tb.asview(a)
    assert (v.dtype, v.shape, v.strides, v.byte_strides) == ("float32", (3,), (1,), (4,))
    assert v.ptr == a.buffer_info()[0]
    np = pytest.importorskip("numpy")
    y = np.from_dlpack(v)
    y[0] = 7
    assert a[0] == 7


def test_view_of_a_view_is_the_same_tensor(tb):
    v = tb.asview(bytearray(8))
    w = tb.asview(v)
    assert (w.ptr, w.shape, w.readonly) == (v.ptr, v.shape, v.readonly)


def test_capsule_dropped_while_an_exception_propagates(tb):
    """An unconsumed capsule destroyed during exception handling releases its tensor and
    leaves the exception alone (no SystemError)."""
    b = bytearray(16)
    before = sys.getrefcount(b)

    def fail_holding_a_capsule():
        cap = tb.asview(b).__dlpack__(max_version=(1, 0))  # noqa: F841 - dies with the frame
        raise KeyError("the exception in flight")

    with pytest.raises(KeyError, match="in flight"):
        fail_holding_a_capsule()
    gc.collect()
    assert sys.getrefcount(b) == before


def test_release_after_every_consumer(tb):
    np = pytest.importorskip("numpy")
    import ctypes

    buf = (ctypes.c_double * 3)(1, 2, 3)
    calls = []
    v = tb.from_ptr(ctypes.addressof(buf), (3,), np.float64, device="cpu", release=lambda: calls.append(1))
    y = np.from_dlpack(v)
    t = np.asarray(v)
    del v
    gc.collect()
    assert calls == []
    del y
    gc.collect()
    assert calls == []
    del t
    gc.collect()
    assert calls == [1]


# --- on a GPU (skipped without one): streams ordered on the device, pointers checked --------


def cuda_torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    return torch


def _busy(torch, stream, x, value):
    """Enqueues ~0.2 s of GPU sleep and then a fill on `stream`: a consumer that is not
    ordered after it reads the old values."""
    with torch.cuda.stream(stream):
        torch.cuda._sleep(int(4e8))
        x.fill_(value)


class _OnlyDlpack:
    """Hides a tensor's C exchange API so that asview takes `__dlpack__`."""

    def __init__(self, t):
        self.t = t

    def __dlpack__(self, **kw):
        return self.t.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self.t.__dlpack_device__()


@pytest.mark.parametrize("path", ["exchange_api", "dlpack"])
def test_gpu_consumer_stream_waits_on_the_device_not_the_host(tb, path):
    torch = cuda_torch()
    import time

    producer, consumer, third = torch.cuda.Stream(), torch.cuda.Stream(), torch.cuda.Stream()
    n = 1 << 20
    x = torch.zeros(n, device="cuda")
    tb.asview(x, stream=consumer.cuda_stream)  # warm-up: driver, contexts, events
    torch.cuda.synchronize()
    _busy(torch, producer, x, 1.0)
    with torch.cuda.stream(producer):
        t0 = time.perf_counter()
        v = tb.asview(x if path == "exchange_api" else _OnlyDlpack(x), stream=consumer.cuda_stream)
        took = time.perf_counter() - t0
    assert took < 0.05, f"asview blocked the host for {took:.3f} s"
    assert v.ptr == x.data_ptr() and v.device == "cuda:0"
    with torch.cuda.stream(consumer):
        on_consumer = torch.from_dlpack(v).sum()
    # A third stream takes the view too: tensorbridge orders it after the consumer's wait.
    with torch.cuda.stream(third):
        on_third = torch.from_dlpack(v).sum()
    torch.cuda.synchronize()
    assert on_consumer.item() == n and on_third.item() == n


def test_gpu_cuda_array_interface_stream_becomes_readiness(tb):
    torch = cuda_torch()
    producer, consumer = torch.cuda.Stream(), torch.cuda.Stream()
    n = 1 << 20
    x = torch.zeros(n, device="cuda")
    torch.cuda.synchronize()

    class Cai:
        def __init__(self, t, stream):
            self.t = t
            self.__cuda_array_interface__ = {
                "shape": (n,), "typestr": "<f4", "data": (t.data_ptr(), False),
                "strides": None, "version": 3, "stream": stream,
            }

    _busy(torch, producer, x, 2.0)
    v = tb.asview(Cai(x, producer.cuda_stream))
    assert v.__cuda_array_interface__["stream"] == producer.cuda_stream
    with torch.cuda.stream(consumer):
        s = torch.from_dlpack(v).sum()
    torch.cuda.synchronize()
    assert s.item() == 2 * n


def test_gpu_from_ptr_checks_the_allocation(tb):
    torch = cuda_torch()
    np = pytest.importorskip("numpy")
    x = torch.arange(256, dtype=torch.float32, device="cuda")
    v = tb.from_ptr(x.data_ptr(), (16, 16), "float32", device="cuda:0", owner=x)
    assert torch.equal(torch.from_dlpack(v).flatten(), x)
    with pytest.raises(ValueError, match="past the allocation"):
        tb.from_ptr(x.data_ptr(), (1 << 30,), "float32", device="cuda:0", owner=x)
    with pytest.raises(ValueError, match="not a CUDA allocation"):
        tb.from_ptr(0xDEAD0000, (4,), "float32", device="cuda")
    host = np.zeros(4, np.float32)
    with pytest.raises(ValueError):
        tb.from_ptr(host.ctypes.data, (4,), "float32", device="cuda", owner=host)
    with pytest.raises(ValueError):
        tb.from_ptr(x.data_ptr(), (4,), "float32", device=f"cuda:{torch.cuda.device_count()}")


def test_gpu_copies(tb):
    torch = cuda_torch()
    np = pytest.importorskip("numpy")
    x = torch.arange(24, dtype=torch.float32, device="cuda").reshape(4, 6)[:, ::2]
    v = tb.asview(x)

    class Copied:
        def __dlpack__(self, **kw):
            return v.__dlpack__(copy=True, **kw)

        def __dlpack_device__(self):
            return v.__dlpack_device__()

    y = torch.from_dlpack(Copied())
    assert y.data_ptr() != x.data_ptr() and torch.equal(y, x)
    h = np.from_dlpack(v, device="cpu")
    assert np.array_equal(h, x.cpu().numpy()) and h.flags.c_contiguous
    with pytest.raises(BufferError):
        v.__dlpack__(max_version=(1, 3), dl_device=(1, 0), copy=False)


def test_gpu_frameworks_share_the_memory(tb):
    torch = cuda_torch()
    x = torch.arange(12, dtype=torch.float32, device="cuda").reshape(3, 4)
    v = tb.asview(x)
    cp = pytest.importorskip("cupy")
    assert cp.from_dlpack(v).data.ptr == x.data_ptr()
    assert cp.asarray(v).data.ptr == x.data_ptr()
    numba_cuda = pytest.importorskip("numba.cuda")
    assert numba_cuda.as_cuda_array(v).device_ctypes_pointer.value == x.data_ptr()
    w = tb.asview(cp.arange(6, dtype=cp.float64))
    assert w.device == "cuda:0" and torch.from_dlpack(w).sum().item() == 15
