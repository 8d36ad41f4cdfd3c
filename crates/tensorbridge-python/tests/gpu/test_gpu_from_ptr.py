"""``tb.from_ptr`` on CUDA: the driver is asked that the whole byte span lies in one live
allocation on the stated device; anything else is a ``ValueError`` before any framework sees
the pointer. Also the CUDA view's own exports: CUDA Array Interface v3, ``__dlpack__`` with
``copy`` and ``dl_device``, and the absence of ``__array_interface__``.
"""

import gc

import numpy as np
import pytest

import tensorbridge as tb
from gpu_frameworks import cudart, device_values
from tbhelpers import FLAG_IS_COPIED, FLAG_READ_ONLY, read_capsule

MB2 = 2 << 20  # a multiple of every allocation granularity, so the allocation is exactly this


@pytest.fixture
def alloc():
    rt = cudart()
    p = rt.malloc(MB2)
    rt.to_device(p, np.arange(MB2 // 4, dtype=np.float32))
    yield p
    rt.free(p)


@pytest.mark.parametrize("dtype", ["float32", "uint8"])
def test_fabricated_pointer_is_refused(dtype, record):
    """0x1234567890123456 is not 4-byte aligned, so as float32 the alignment check refuses it
    first; as uint8 only the driver can: both must be ValueError naming the address."""
    with pytest.raises(ValueError) as info:
        tb.from_ptr(0x1234567890123456, (4,), dtype, device="cuda:0")
    msg = str(info.value)
    print(f"fabricated pointer ({dtype}):", msg)
    record(producer="0x1234567890123456", via=f"from_ptr {dtype}", consumer="-", note=f"ValueError: {msg[:70]}")
    assert "0x1234567890123456" in msg.lower()
    if dtype == "uint8":
        assert "align" not in msg, msg


def test_fabricated_aligned_pointer_is_refused_by_the_driver():
    with pytest.raises(ValueError) as info:
        tb.from_ptr(0x1234567890123400, (64,), "float32", device="cuda:0")
    assert "align" not in str(info.value), str(info.value)


def test_exact_allocation_is_accepted(alloc):
    v = tb.from_ptr(alloc, (MB2 // 4,), "float32", device="cuda:0")
    assert v.nbytes == MB2
    v = tb.from_ptr(alloc + MB2 - 4, (1,), "float32", device="cuda:0")
    assert v.ptr == alloc + MB2 - 4


def test_span_past_the_allocation_is_refused(alloc, record):
    with pytest.raises(ValueError) as info:
        tb.from_ptr(alloc, (MB2 // 4 + 1,), "float32", device="cuda:0")
    msg = str(info.value)
    print("span past the allocation:", msg)
    record(producer="cudaMalloc(2 MiB)", via="from_ptr 2 MiB + 4 B", consumer="-", note=f"ValueError: {msg[:60]}")
    with pytest.raises(ValueError):
        tb.from_ptr(alloc + 4, (MB2 // 4,), "float32", device="cuda:0")
    with pytest.raises(ValueError):
        # strides reach past the end although numel * itemsize fits
        tb.from_ptr(alloc, (2, 4), "float32", strides=(MB2 // 4, 1), device="cuda:0")
    with pytest.raises(ValueError):
        # negative strides reaching before the start
        tb.from_ptr(alloc, (4,), "float32", strides=(-1,), device="cuda:0")


def test_freed_allocation_is_refused():
    rt = cudart()
    p = rt.malloc(MB2)
    rt.free(p)
    with pytest.raises(ValueError):
        tb.from_ptr(p, (16,), "float32", device="cuda:0")


def test_host_pointer_as_cuda_is_refused():
    a = np.zeros(1024, np.float32)
    with pytest.raises(ValueError):
        tb.from_ptr(a.ctypes.data, (1024,), "float32", device="cuda:0", owner=a)


def test_wrong_device_is_refused(alloc):
    n_devices = cudart().device_count()
    with pytest.raises(ValueError):
        tb.from_ptr(alloc, (16,), "float32", device=f"cuda:{n_devices}")  # no such device
    if n_devices > 1:
        with pytest.raises(ValueError):
            tb.from_ptr(alloc, (16,), "float32", device="cuda:1")  # allocated on device 0


def test_misaligned_and_null(alloc):
    with pytest.raises(ValueError):
        tb.from_ptr(alloc + 2, (4,), "float32", device="cuda:0")
    with pytest.raises(ValueError):
        tb.from_ptr(0, (4,), "float32", device="cuda:0")
    v = tb.from_ptr(0, (0, 4), "float32", device="cuda:0")  # empty: NULL is fine
    assert v.shape == (0, 4)


@pytest.mark.parametrize("stream", [0, -5])
def test_bad_producer_stream(alloc, stream):
    with pytest.raises(ValueError):
        tb.from_ptr(alloc, (4,), "float32", device="cuda:0", producer_stream=stream)


def test_release_runs_once_for_cuda_memory():
    rt = cudart()
    p = rt.malloc(MB2)
    calls = []

    def release():
        calls.append(1)
        rt.free(p)

    v = tb.from_ptr(p, (MB2 // 4,), "float32", device="cuda:0", release=release)
    torch = pytest.importorskip("torch")
    t = torch.from_dlpack(v)
    del v
    gc.collect()
    assert calls == []
    t.fill_(1)
    torch.cuda.synchronize()
    del t
    gc.collect()
    assert calls == [1]


def test_refused_from_ptr_does_not_call_release():
    calls = []
    with pytest.raises(ValueError):
        tb.from_ptr(0x1234567890123456, (4,), "float32", device="cuda:0", release=lambda: calls.append(1))
    gc.collect()
    assert calls == []


# --- the CUDA view's exports -------------------------------------------------------------------


def test_cuda_array_interface_v3(alloc):
    v = tb.from_ptr(alloc, (4, 8), "float32", strides=(16, 2), device="cuda:0")
    cai = v.__cuda_array_interface__
    assert cai["version"] == 3
    assert cai["shape"] == (4, 8)
    assert np.dtype(cai["typestr"]) == np.float32
    assert cai["data"] == (alloc, False)
    assert cai["strides"] == (64, 8)
    assert cai.get("stream") is None  # nothing pending: no from_ptr producer_stream was given
    assert cai.get("mask") is None
    with pytest.raises(AttributeError):
        v.__array_interface__
    assert tuple(v.__dlpack_device__()) == (2, 0)


def test_cuda_view_dtype_and_size(alloc):
    """``View.dtype`` is a ``numpy.dtype`` on CUDA views too, equal to the core name (which
    ``dtype_name`` keeps); ``size`` counts elements; CuPy's array over the view agrees."""
    v = tb.from_ptr(alloc, (4, 8), "float32", strides=(16, 2), device="cuda:0")
    assert isinstance(v.dtype, np.dtype) and v.dtype == np.float32 and v.dtype == "float32"
    assert v.dtype_name == "float32" and v.size == 32
    assert np.result_type(v) == np.float32  # reads .dtype only: no host access
    cupy = pytest.importorskip("cupy")
    c = cupy.asarray(v)
    assert (c.dtype, c.size, c.data.ptr) == (v.dtype, v.size, alloc)


def test_producer_stream_is_from_ptrs_name_for_it(alloc):
    """``from_ptr`` takes the producer's stream as ``producer_stream=`` (CUDA Array Interface
    rules); ``stream=`` (``asview``'s consumer stream, DLPack rules) is no alias."""
    with pytest.raises(TypeError, match="stream"):
        tb.from_ptr(alloc, (4,), "float32", device="cuda:0", stream=1)
    v = tb.from_ptr(alloc, (4,), "float32", device="cuda:0", producer_stream=1)
    assert v.__cuda_array_interface__.get("stream") == 1


def test_cuda_array_interface_carries_producer_stream(alloc):
    cupy = pytest.importorskip("cupy")
    s = cupy.cuda.Stream(non_blocking=True)
    v = tb.from_ptr(alloc, (4,), "float32", device="cuda:0", producer_stream=s.ptr)
    st = v.__cuda_array_interface__.get("stream")
    assert st is not None and st != 0, st


def test_readonly_cuda_view(alloc):
    v = tb.from_ptr(alloc, (16,), "float32", device="cuda:0", readonly=True)
    assert v.__cuda_array_interface__["data"] == (alloc, True)
    assert read_capsule(v.__dlpack__(max_version=(1, 3), stream=-1)).flags & FLAG_READ_ONLY
    with pytest.raises(BufferError):
        v.__dlpack__(stream=-1)


def test_dl_device_cpu_copies_to_host(alloc):
    v = tb.from_ptr(alloc, (8, 8), "float32", device="cuda:0")
    info = read_capsule(v.__dlpack__(max_version=(1, 3), dl_device=(1, 0)))
    assert info.device == (1, 0) and info.is_copied
    h = np.from_dlpack(v, device="cpu")
    np.testing.assert_array_equal(h.reshape(-1), np.arange(64, dtype=np.float32))
    with pytest.raises(BufferError):
        v.__dlpack__(max_version=(1, 3), dl_device=(1, 0), copy=False)


def test_copy_true_on_device(alloc):
    v = tb.from_ptr(alloc, (8, 8), "float32", device="cuda:0")
    torch = pytest.importorskip("torch")
    cap = v.__dlpack__(max_version=(1, 3), copy=True, stream=torch.cuda.current_stream().cuda_stream or 1)
    info = read_capsule(cap)
    assert info.is_copied and info.device == (2, 0) and info.ptr != alloc
    t = torch.from_dlpack(cap)
    torch.cuda.synchronize()
    np.testing.assert_array_equal(t.cpu().numpy().reshape(-1), np.arange(64, dtype=np.float32))
    t.fill_(-1)
    torch.cuda.synchronize()
    assert device_values(alloc, (1,), np.float32)[0] == 0  # the original is untouched


def test_negative_strides_on_cuda(alloc):
    """Refused through DLPack (torch aborts on them), open through the CUDA Array Interface."""
    v = tb.from_ptr(alloc + 60, (16,), "float32", strides=(-1,), device="cuda:0")
    with pytest.raises(BufferError, match="(?i)negative"):
        v.__dlpack__(max_version=(1, 3), stream=-1)
    cupy = pytest.importorskip("cupy")
    y = cupy.asarray(v)
    assert y.data.ptr == alloc + 60
    np.testing.assert_array_equal(cupy.asnumpy(y), np.arange(16, dtype=np.float32)[::-1])
