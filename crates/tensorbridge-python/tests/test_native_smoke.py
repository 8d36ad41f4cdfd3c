"""Smoke tests of the extension module itself, written by the native side (the rest of this
folder belongs to the Python suite): the package's shape, stubs, and the native paths that no
framework reaches on its own (the buffer protocol, the exchange API's fallbacks, capsule
destructors with an exception in flight)."""

import array
import gc
import importlib.resources
import sys

import pytest


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
