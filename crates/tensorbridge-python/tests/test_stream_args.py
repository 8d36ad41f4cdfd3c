"""One reading of a ``stream=`` argument on every function that takes one (ARCHITECTURE.md,
"Streams from Python"): ``asview(stream=)``, ``from_ptr(producer_stream=)``,
``open(stream=)`` and an extension's ``kernel_call_on`` (the example's ``axpy_on``). Host
data, no GPU: every entry reads its stream before anything that needs a driver."""

import numpy as np
import pytest


def _host():
    a = np.ones(4, dtype=np.float32)
    return a


def _call(tb, entry, stream):
    a = _host()
    if entry == "asview":
        return tb.asview(a, stream=stream)
    if entry == "from_ptr":
        return tb.from_ptr(a.ctypes.data, (4,), "float32", device="cpu", owner=a, producer_stream=stream)
    if entry == "open":
        return tb.open(b"not a handle", stream=stream)
    if entry == "kernel_call_on":
        ext = pytest.importorskip("tensorbridge_example")
        return ext.axpy_on(1.0, a, _host(), stream)
    raise AssertionError(entry)


ENTRIES = ["asview", "from_ptr", "open", "kernel_call_on"]


@pytest.mark.parametrize("entry", ENTRIES)
def test_zero_is_ambiguous_everywhere(tb, entry):
    with pytest.raises(ValueError, match="stream=0 is ambiguous"):
        _call(tb, entry, 0)


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("value", ["1", True, 1.0, b"\x01"], ids=["str", "bool", "float", "bytes"])
def test_other_types_are_type_errors_naming_the_type(tb, entry, value):
    with pytest.raises(TypeError, match=f"CUDA stream object .*{type(value).__name__}"):
        _call(tb, entry, value)


@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("value", [-2, -(2**40), 2**64])
def test_out_of_range_integers_are_refused(tb, entry, value):
    with pytest.raises(ValueError, match=f"stream {value}"):
        _call(tb, entry, value)


@pytest.mark.parametrize("entry", ["asview", "from_ptr"])
def test_minus_one_is_no_synchronisation(tb, entry):
    v = _call(tb, entry, -1)
    assert v.shape == (4,)


@pytest.mark.parametrize("entry", ["open", "kernel_call_on"])
def test_minus_one_names_no_stream_to_work_on(tb, entry):
    with pytest.raises(ValueError, match=f"{entry} needs a stream to work on"):
        _call(tb, entry, -1)


class CudaStreamProtocol:
    """cuda.core's shape of a stream: ``__cuda_stream__() -> (version, handle)``."""

    def __init__(self, handle):
        self.handle = handle
        self.asked = 0

    def __cuda_stream__(self):
        self.asked += 1
        return (0, self.handle)


class TorchLikeStream:
    """A ``torch.cuda.Stream``'s shape: ``stream_id`` (0 for the default stream) and
    ``cuda_stream`` (its handle, 0 for the default stream)."""

    stream_id = 0
    cuda_stream = 0


class CupyLikeStream:
    ptr = 0


@pytest.mark.parametrize("stream", [CudaStreamProtocol(0), TorchLikeStream(), CupyLikeStream()],
                         ids=["__cuda_stream__", "torch", "cupy"])  # fmt: skip
def test_stream_objects_are_read_by_every_entry(tb, stream):
    """A stream object's handle 0 is its framework's default stream: not ambiguous, so not
    refused. asview on host data takes it (nothing to order); from_ptr refuses a producer
    stream for host memory, naming the stream it read."""
    assert _call(tb, "asview", stream).shape == (4,)
    with pytest.raises(ValueError, match=r"a stream \(0\) was given for memory on cpu"):
        _call(tb, "from_ptr", stream)
    if isinstance(stream, CudaStreamProtocol):
        assert stream.asked == 2, "the protocol was not asked"


def test_a_legacy_default_stream_for_host_memory_is_refused_by_from_ptr_only(tb):
    for value in (1, 2, 0x7F00_1234):
        assert _call(tb, "asview", value).shape == (4,)
        with pytest.raises(ValueError, match=rf"a stream \({value}\) was given for memory on cpu"):
            _call(tb, "from_ptr", value)

