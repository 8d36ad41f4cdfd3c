"""``tensorbridge.View``'s DLPack C exchange API on CUDA: the table names the legacy default
stream as its ``current_work_stream``, so a consumer that calls
``managed_tensor_from_py_object_no_sync`` (or ``dltensor_from_py_object_no_sync``) and then
works on the legacy default stream must see the producer's finished values, without the host
waiting.

The producer is a CuPy kernel that spins >= 60 ms on a non-blocking stream of its own, then
fills its array with 7; the view learns that stream from a CUDA Array Interface dict
(``stream``). The consumer copies the exported pointer on CuPy's ``Stream.null`` (the legacy
default stream, which does not synchronise with non-blocking streams) at once. The control
does the same copy without the exchange call and must read stale data: the race is real.
"""

import ctypes

import numpy as np
import pytest

import tensorbridge as tb
from gpu_frameworks import cupy_spin_kernel
from tbhelpers import DLTensor, delete_managed, dltensor_info, exchange_table, managed_info

N = 1 << 20
BUSY_MS = 60



@pytest.fixture(scope="module")
def cupy():
    return pytest.importorskip("cupy")


@pytest.fixture(scope="module")
def cupy_spin(cupy):
    k, cycles = cupy_spin_kernel(cupy, BUSY_MS)

    def launch(x, value=7.0):
        n = x.size
        k(((n + 255) // 256,), (256,), (x, np.int64(n), np.int64(cycles), np.float32(value)))

    return launch


@pytest.fixture(scope="module")
def api():
    return exchange_table(tb.View)


class Cai:
    """A CUDA Array Interface v3 producer whose ``stream`` is the stream still writing."""

    def __init__(self, a, stream):
        self.a, self.stream = a, stream

    @property
    def __cuda_array_interface__(self):
        d = dict(self.a.__cuda_array_interface__)
        d["stream"] = self.stream.ptr
        return d


def busy_view(cupy, cupy_spin):
    """(array, producer stream, view): the producer still spins when this returns."""
    x = cupy.zeros(N, cupy.float32)
    cupy.cuda.Device().synchronize()
    ps = cupy.cuda.Stream(non_blocking=True)
    with ps:
        cupy_spin(x)
    v = tb.asview(Cai(x, ps))
    assert v.ptr == x.data.ptr
    return x, ps, v


def copy_on_legacy_stream(cupy, ptr):
    """N floats at ``ptr`` copied on the legacy default stream, enqueued now; synchronised."""
    mem = cupy.cuda.UnownedMemory(ptr, N * 4, None)
    src = cupy.ndarray((N,), cupy.float32, memptr=cupy.cuda.MemoryPointer(mem, 0))
    with cupy.cuda.Stream.null:
        z = src.copy()
    return z


def test_managed_export_orders_the_legacy_stream_after_the_producer(cupy, cupy_spin, api):
    x, ps, v = busy_view(cupy, cupy_spin)
    out = ctypes.c_void_p(0)
    assert api.from_py(v, ctypes.byref(out)) == 0
    info = managed_info(out.value)
    assert info.ptr == x.data.ptr and info.device == (2, x.device.id)
    # The host did not wait: the producer still spins.
    assert not ps.done, "the export waited on the host"
    stream = ctypes.c_void_p(0x1234)
    assert api.current_work_stream(2, x.device.id, ctypes.byref(stream)) == 0
    assert stream.value is None  # NULL: the legacy default stream
    z = copy_on_legacy_stream(cupy, info.ptr)
    busy_after = not ps.done
    cupy.cuda.Stream.null.synchronize()
    delete_managed(out.value)
    ps.synchronize()
    assert bool(cupy.all(z == 7)), "the legacy default stream read before the producer finished"
    print(f"producer still busy after the consumer enqueued: {busy_after}")


def test_borrowed_dltensor_orders_the_legacy_stream_after_the_producer(cupy, cupy_spin, api):
    x, ps, v = busy_view(cupy, cupy_spin)
    t = DLTensor()
    assert api.dltensor_from_py(v, ctypes.byref(t)) == 0
    info = dltensor_info(t)
    assert info.ptr == x.data.ptr
    assert not ps.done, "the export waited on the host"
    z = copy_on_legacy_stream(cupy, info.ptr)
    cupy.cuda.Stream.null.synchronize()
    ps.synchronize()
    assert bool(cupy.all(z == 7)), "the legacy default stream read before the producer finished"


def test_control_without_the_exchange_call_reads_stale_data(cupy, cupy_spin):
    """The same copy on the legacy default stream without asking the table: nothing orders
    it after the non-blocking producer, so it reads zeros. If this ever reads 7s, the race
    window is gone and the two tests above prove nothing."""
    x, ps, v = busy_view(cupy, cupy_spin)
    z = copy_on_legacy_stream(cupy, v.ptr)
    cupy.cuda.Stream.null.synchronize()
    ps.synchronize()
    assert not bool(cupy.all(z == 7)), "the unordered control read the producer's values"


def test_import_through_the_table_is_ready_on_the_legacy_stream(cupy, api):
    """``managed_tensor_to_py_object_no_sync``: a CUDA managed tensor becomes a View that
    shares its memory and is ready on the legacy default stream (CAI ``stream`` 1)."""
    x = cupy.arange(16, dtype=cupy.float32)
    cupy.cuda.Device().synchronize()
    v = tb.asview(x)
    out = ctypes.c_void_p(0)
    assert api.from_py(v, ctypes.byref(out)) == 0
    w = api.to_py_object(out.value)
    assert w.ptr == x.data.ptr and w.device == f"cuda:{x.device.id}"
    assert w.__cuda_array_interface__["stream"] == 1
    y = cupy.asarray(w)
    assert y.data.ptr == x.data.ptr
    assert bool(cupy.all(y == x))


def test_export_inside_a_capture_is_refused_and_the_capture_stays_valid(cupy, api):
    """While a blocking stream captures (global mode), the legacy default stream may not be
    used: the export fails with -1 and the CUDA layer's exception instead of invalidating the
    capture (``cuStreamEndCapture`` then succeeds)."""
    cu = ctypes.CDLL("libcuda.so.1")
    x = cupy.zeros(N, cupy.float32)
    ps = cupy.cuda.Stream(non_blocking=True)
    with ps:
        x.fill(7)  # the view's readiness names ps: not ready "now"
    v = tb.asview(Cai(x, ps))
    cupy.cuda.Device().synchronize()
    capturing = cupy.cuda.Stream()  # blocking: it synchronises with the legacy stream
    handle = ctypes.c_void_p(capturing.ptr)
    out = ctypes.c_void_p(0x1234)
    assert cu.cuStreamBeginCapture_v2(handle, 0) == 0  # CU_STREAM_CAPTURE_MODE_GLOBAL
    graph = ctypes.c_void_p(0)
    try:
        with pytest.raises((ValueError, RuntimeError, BufferError), match="captur") as refused:
            api.from_py(v, ctypes.byref(out))
    finally:
        ended = cu.cuStreamEndCapture(handle, ctypes.byref(graph))
        if graph.value:
            cu.cuGraphDestroy(graph)
    print(f"refused inside the capture: {refused.value!r}")
    assert ended == 0, f"the capture was invalidated (cuStreamEndCapture returned {ended})"
    assert out.value is None
    # The view still exports once the capture is over.
    assert api.from_py(v, ctypes.byref(out)) == 0
    delete_managed(out.value)


def test_tvm_ffi_takes_a_cuda_view_zero_copy(cupy):
    tvm_ffi = pytest.importorskip("tvm_ffi", reason="apache-tvm-ffi is not installed")
    x = cupy.arange(N, dtype=cupy.float32)
    cupy.cuda.Device().synchronize()
    v = tb.asview(x)
    t = tvm_ffi.from_dlpack(v)
    assert t.data_ptr() == v.ptr == x.data.ptr
    assert tuple(t.shape) == (N,)
    assert "cuda" in str(t.device)
