"""Producers that are not a big framework: custom classes exposing only ``__array_interface__``
or the buffer protocol, odd ``__dlpack__`` implementations, raw capsules from every framework,
and hand-made DLPack capsules whose every field is chosen by the test (``HandMadeCapsule``),
including the malformed ones. Every refused capsule must still have its deleter run exactly
once (the consumer owns it once it is taken), and every accepted one exactly once after the
last user is gone.
"""

import array
import ctypes
import gc
import weakref

import numpy as np
import pytest

from tbhelpers import KDLCPU, HandMadeCapsule, aligned_numpy, capsule_name, consume_capsule, needs_numpy_dlpack_1


class AIOnly:
    """Exposes only ``__array_interface__`` (a dict built by the test)."""

    def __init__(self, iface, keep=None):
        self.__array_interface__ = iface
        self.keep = keep


def ai_of(a, **changes):
    d = dict(a.__array_interface__)
    d.update(changes)
    return d


# --- __array_interface__ --------------------------------------------------------------------------


def test_array_interface_only_producer_zero_copy_and_kept_alive(tb):
    a = aligned_numpy((3, 4), np.int16, fill=np.arange(12).reshape(3, 4))
    p = AIOnly(ai_of(a), keep=a)
    dead = []
    weakref.finalize(p, dead.append, 1)
    v = tb.asview(p)
    assert (v.ptr, v.shape, v.strides, v.dtype, v.readonly) == (a.ctypes.data, (3, 4), (4, 1), "int16", False)
    del p, a
    gc.collect()
    assert not dead
    y = np.from_dlpack(v)
    np.testing.assert_array_equal(y, np.arange(12).reshape(3, 4))
    del v
    gc.collect()
    assert not dead  # y still uses it
    del y
    gc.collect()
    assert dead == [1]


def test_array_interface_byte_strides_and_readonly(tb):
    a = aligned_numpy((4, 6), np.float64, fill=np.arange(24).reshape(4, 6))
    x = a[::2, 1::2]
    v = tb.asview(AIOnly(ai_of(x, data=(x.ctypes.data, True)), keep=a))
    assert v.shape == (2, 3) and v.strides == (12, 2) and v.readonly
    np.testing.assert_array_equal(np.asarray(v), x)


@needs_numpy_dlpack_1
def test_array_interface_data_as_buffer_with_offset(tb):
    raw = bytearray(np.arange(8, dtype=np.float32).tobytes())
    p = AIOnly({"shape": (3,), "typestr": "<f4", "data": raw, "offset": 8, "version": 3})
    v = tb.asview(p)
    np.testing.assert_array_equal(np.from_dlpack(v), [2, 3, 4])
    np.from_dlpack(v)[0] = 42
    assert np.frombuffer(raw, np.float32)[2] == 42


@pytest.mark.parametrize("typestr, name", [("<f8", "float64"), ("|b1", "bool"), ("<c8", "complex64"),
                                           ("|u1", "uint8"), ("<i2", "int16"), ("<u8", "uint64"),
                                           ("<f2", "float16"), ("|i1", "int8"), ("<c16", "complex128")])  # fmt: skip
def test_array_interface_typestrs(tb, typestr, name):
    a = aligned_numpy((4,), np.dtype(typestr), fill=1)
    v = tb.asview(AIOnly(ai_of(a), keep=a))
    assert v.dtype == name


def test_array_interface_zero_d_and_descr(tb):
    a = aligned_numpy((), np.float32, fill=3)
    v = tb.asview(AIOnly(ai_of(a, descr=[("", "<f4")]), keep=a))
    assert v.shape == () and np.asarray(v)[()] == 3


def test_array_interface_mask_none_accepted(tb):
    a = aligned_numpy((4,), np.float32, fill=1)
    assert tb.asview(AIOnly(ai_of(a, mask=None), keep=a)).shape == (4,)


def test_array_interface_mask_refused(tb):
    """A mask says some elements are invalid: no DLPack consumer can honour that, so refuse."""
    a = aligned_numpy((4,), np.float32, fill=1)
    m = np.array([True, False, True, True])
    with pytest.raises(ValueError, match="(?i)mask"):
        tb.asview(AIOnly(ai_of(a, mask=m), keep=(a, m)))


def test_numpy_masked_array_with_masked_elements_is_refused(tb):
    """np.ma.MaskedArray is an ndarray subclass whose inherited ``__dlpack__`` and
    ``__array_interface__`` describe the data only: a consumer would read the masked-out
    values as if valid. tensorbridge refuses a masked array that hides elements."""
    ma = np.ma.array([1.0, 2.0, 3.0], mask=[False, True, False])
    with pytest.raises(ValueError, match="(?i)mask"):
        tb.asview(ma)


def test_numpy_masked_array_without_mask_is_its_data(tb):
    """``nomask`` (no element hidden): the data, zero-copy."""
    ma = np.ma.array([1.0, 2.0, 3.0])
    assert ma.mask is np.ma.nomask
    v = tb.asview(ma)
    assert v.ptr == ma.data.ctypes.data


@pytest.mark.parametrize(
    "change, exc",
    [
        ({"typestr": ">f4"}, ValueError),  # big-endian data
        ({"typestr": "<f3"}, ValueError),
        ({"typestr": "garbage"}, ValueError),
        ({"typestr": "|O8"}, ValueError),  # Python objects
        ({"shape": (2, -2)}, ValueError),
        ({"strides": (4,)}, ValueError),  # 1 stride for 2 dims
        ({"strides": (6, 4)}, ValueError),  # byte stride not a multiple of the itemsize
        ({"version": 99}, ValueError),
        ({"shape": "2x2"}, TypeError),
        ({"data": (1, False)}, ValueError),  # misaligned for float32
        ({"data": (0, False)}, ValueError),  # NULL with 4 elements
    ],
    ids=lambda x: repr(x),
)
def test_array_interface_refusals(tb, change, exc):
    a = aligned_numpy((2, 2), np.float32, fill=1)
    with pytest.raises(exc):
        tb.asview(AIOnly(ai_of(a, **change), keep=a))


def test_array_interface_missing_keys(tb):
    a = aligned_numpy((2, 2), np.float32, fill=1)
    for key in ("shape", "typestr"):
        d = ai_of(a)
        del d[key]
        with pytest.raises((TypeError, ValueError), match=key):
            tb.asview(AIOnly(d, keep=a))
    with pytest.raises(TypeError):
        tb.asview(AIOnly([1, 2, 3]))


# --- buffer protocol ------------------------------------------------------------------------------


@needs_numpy_dlpack_1
def test_bytearray_is_writable_uint8(tb):
    b = bytearray(b"\x00" * 8)
    v = tb.asview(b)
    assert (v.shape, v.dtype, v.readonly) == ((8,), "uint8", False)
    np.from_dlpack(v)[3] = 7
    assert b[3] == 7


@needs_numpy_dlpack_1
def test_bytes_is_readonly(tb):
    b = b"abcdefgh"
    v = tb.asview(b)
    assert v.readonly and v.dtype == "uint8" and v.shape == (8,)
    with pytest.raises(BufferError):
        v.__dlpack__()
    assert bytes(np.from_dlpack(v)) == b


@needs_numpy_dlpack_1
def test_array_array_and_ctypes_and_memoryview_cast(tb):
    a = array.array("d", [1.5, 2.5, 3.5])
    v = tb.asview(a)
    assert (v.dtype, v.shape) == ("float64", (3,))
    np.from_dlpack(v)[0] = -1
    assert a[0] == -1

    c = (ctypes.c_float * 6)(*range(6))
    v = tb.asview(c)
    assert (v.dtype, v.shape, v.ptr) == ("float32", (6,), ctypes.addressof(c))

    m = memoryview(bytearray(24)).cast("i", (2, 3))
    v = tb.asview(m)
    assert (v.dtype, v.shape, v.strides) == ("int32", (2, 3), (3, 1))


def test_strided_memoryview(tb):
    base = aligned_numpy((4, 6), np.float32, fill=np.arange(24).reshape(4, 6))
    m = memoryview(base[:, ::3])
    v = tb.asview(m)
    assert v.shape == (4, 2) and v.strides == (6, 3)
    np.testing.assert_array_equal(np.asarray(v), base[:, ::3])


def test_buffer_producer_kept_alive(tb):
    a = array.array("i", range(16))
    dead = []
    weakref.finalize(a, dead.append, 1)
    v = tb.asview(a)
    del a
    gc.collect()
    assert not dead
    np.testing.assert_array_equal(np.from_dlpack(v), np.arange(16))
    del v
    gc.collect()
    assert dead == [1]


def test_unsupported_buffer_formats(tb):
    rec = np.zeros(3, dtype=[("a", "<i4"), ("b", "<f4")])
    with pytest.raises((TypeError, ValueError)):
        tb.asview(memoryview(rec))


# --- __dlpack__ variants --------------------------------------------------------------------------


class LegacyProducer:
    """A pre-2023 producer: ``__dlpack__(stream=None)`` only, so ``max_version`` is a TypeError."""

    def __init__(self, a):
        self.a = a
        self.calls = []

    def __dlpack__(self, stream=None):
        self.calls.append(stream)
        return self.a.__dlpack__()

    def __dlpack_device__(self):
        return (KDLCPU, 0)


class RecordingProducer:
    def __init__(self, a):
        self.a = a
        self.calls = []

    def __dlpack__(self, **kw):
        self.calls.append(kw)
        kw.pop("stream", None)
        return self.a.__dlpack__(**kw)

    def __dlpack_device__(self):
        return (KDLCPU, 0)


def test_legacy_signature_falls_back_on_type_error(tb):
    a = aligned_numpy((5,), np.float32, fill=2)
    p = LegacyProducer(a)
    v = tb.asview(p)
    assert v.ptr == a.ctypes.data
    assert len(p.calls) >= 1 and p.calls[-1] is None


@needs_numpy_dlpack_1
def test_asks_for_dlpack_1_3(tb):
    a = aligned_numpy((5,), np.float32, fill=2)
    p = RecordingProducer(a)
    v = tb.asview(p)
    assert v.ptr == a.ctypes.data
    assert len(p.calls) == 1
    assert tuple(p.calls[0]["max_version"]) == (1, 3)
    assert p.calls[0].get("stream") is None


class SelfReturning:
    """The famous wrong answer: a class whose ``__dlpack__`` returns ``self``."""

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, *args, **kwargs):
        return self

    def __dlpack_device__(self):
        return (KDLCPU, 0)


def test_dlpack_returning_self_is_refused_clearly(tb):
    p = SelfReturning(np.zeros(3))
    with pytest.raises(TypeError) as info:
        tb.asview(p)
    msg = str(info.value)
    assert "capsule" in msg.lower() and "SelfReturning" in msg, msg


def test_dlpack_returning_self_also_breaks_frameworks(tb):
    """The control: this is what users hit with torch (and CuPy) and why they ask."""
    torch = pytest.importorskip("torch")
    with pytest.raises(Exception):
        torch.from_dlpack(SelfReturning(np.zeros(3)))


class ReturnsUsedCapsule:
    def __init__(self, a):
        self.cap = a.__dlpack__()
        consume_capsule(self.cap)

    def __dlpack__(self, **kw):
        return self.cap

    def __dlpack_device__(self):
        return (KDLCPU, 0)


def test_dlpack_returning_used_capsule_is_buffer_error(tb):
    p = ReturnsUsedCapsule(np.zeros(3))
    assert capsule_name(p.cap) == "used_dltensor"
    with pytest.raises(BufferError):
        tb.asview(p)


def test_dlpack_returning_foreign_capsule_is_type_error(tb):
    torch = pytest.importorskip("torch")
    foreign = torch.Tensor.__dlpack_c_exchange_api__  # a capsule named "dlpack_exchange_api"

    class P:
        def __dlpack__(self, **kw):
            return foreign

        def __dlpack_device__(self):
            return (KDLCPU, 0)

    with pytest.raises(TypeError, match="dlpack_exchange_api"):
        tb.asview(P())
    with pytest.raises(TypeError):
        tb.asview(foreign)


def test_dlpack_buffer_error_propagates(tb):
    class Refusing:
        def __dlpack__(self, **kw):
            raise BufferError("cannot export: on purpose")

        def __dlpack_device__(self):
            return (KDLCPU, 0)

    with pytest.raises(BufferError, match="on purpose"):
        tb.asview(Refusing())


# --- raw capsules ---------------------------------------------------------------------------------


@needs_numpy_dlpack_1
@pytest.mark.parametrize("versioned", [False, True])
def test_numpy_capsule_consumed_exactly_once(tb, versioned):
    a = aligned_numpy((4,), np.float32, fill=np.arange(4))
    cap = a.__dlpack__(max_version=(1, 0)) if versioned else a.__dlpack__()
    fresh = "dltensor_versioned" if versioned else "dltensor"
    assert capsule_name(cap) == fresh
    v = tb.asview(cap)
    assert capsule_name(cap) == "used_" + fresh
    assert v.ptr == a.ctypes.data
    with pytest.raises(BufferError, match="(?i)used|consumed"):
        tb.asview(cap)
    del a, cap
    gc.collect()
    np.testing.assert_array_equal(np.from_dlpack(v), np.arange(4))


def test_capsule_from_each_framework(tb):
    torch = pytest.importorskip("torch")
    t = torch.arange(6, dtype=torch.float32)
    v = tb.asview(torch.utils.dlpack.to_dlpack(t))
    assert v.ptr == t.data_ptr()

    tf = pytest.importorskip("tensorflow")
    x = tf.constant([1.0, 2.0, 3.0])
    cap = tf.experimental.dlpack.to_dlpack(x)
    v = tb.asview(cap)
    assert capsule_name(cap) == "used_dltensor"
    del x, cap
    gc.collect()
    np.testing.assert_array_equal(np.from_dlpack(v), [1, 2, 3])

    jax = pytest.importorskip("jax")
    j = jax.device_put(np.arange(8.0), jax.devices("cpu")[0])
    v = tb.asview(j.__dlpack__())
    assert v.ptr == j.unsafe_buffer_pointer()


def test_capsule_consumed_by_torch_then_tensorbridge_and_vice_versa(tb):
    torch = pytest.importorskip("torch")
    a = aligned_numpy((4,), np.float32, fill=1)
    cap = a.__dlpack__()
    torch.from_dlpack(cap)
    with pytest.raises(BufferError):
        tb.asview(cap)
    cap = a.__dlpack__()
    tb.asview(cap)
    with pytest.raises(RuntimeError, match="consumed only once"):
        torch.from_dlpack(cap)


# --- hand-made capsules ---------------------------------------------------------------------------


@pytest.fixture
def buf():
    return aligned_numpy((64,), np.float32, fill=np.arange(64))


def _consume_and_release(tb, h, cap=None):
    """asview, then drop everything; returns the view's description taken before the drop."""
    v = tb.asview(h.make() if cap is None else cap)
    d = (v.ptr, v.shape, v.strides, v.dtype, v.readonly)
    assert h.deleted == 0, "deleter ran while the view lives"
    del v
    gc.collect()
    assert h.deleted == 1, f"deleter ran {h.deleted} times"
    return d


@pytest.mark.parametrize("versioned, version", [(False, None), (True, (1, 0)), (True, (1, 1))])
def test_null_strides_mean_c_contiguous(tb, buf, versioned, version):
    h = HandMadeCapsule(data=buf.ctypes.data, shape=(4, 8), strides=None, versioned=versioned,
                        version=version or (1, 0), keep=buf)  # fmt: skip
    assert _consume_and_release(tb, h)[:3] == (buf.ctypes.data, (4, 8), (8, 1))


def test_byte_offset_is_applied(tb, buf):
    h = HandMadeCapsule(data=buf.ctypes.data, shape=(4,), strides=(1,), byte_offset=16, keep=buf)
    v = tb.asview(h.make())
    assert v.ptr == buf.ctypes.data + 16
    np.testing.assert_array_equal(np.from_dlpack(v), [4, 5, 6, 7])


def test_read_only_flag_is_kept(tb, buf):
    h = HandMadeCapsule(data=buf.ctypes.data, shape=(8,), strides=(1,), flags=1, keep=buf)
    v = tb.asview(h.make())
    assert v.readonly
    with pytest.raises(BufferError):
        v.__dlpack__()


def test_deleter_runs_once_after_a_chain_of_consumers(tb, buf):
    torch = pytest.importorskip("torch")
    h = HandMadeCapsule(data=buf.ctypes.data, shape=(8, 8), strides=(8, 1), keep=buf)
    v = tb.asview(h.make())
    n = np.from_dlpack(v)
    t = torch.from_dlpack(v)
    v2 = tb.asview(t)
    del v
    gc.collect()
    assert h.deleted == 0
    del n, t
    gc.collect()
    assert h.deleted == 0
    del v2
    gc.collect()
    assert h.deleted == 1


def test_null_deleter_is_accepted(tb, buf):
    h = HandMadeCapsule(data=buf.ctypes.data, shape=(4,), strides=(1,), null_deleter=True, keep=buf)
    v = tb.asview(h.make())
    assert v.ptr == buf.ctypes.data
    del v
    gc.collect()


def test_float8_dtype_is_named(tb, buf):
    h = HandMadeCapsule(data=buf.ctypes.data, shape=(4,), strides=(1,), dtype=(10, 8, 1), keep=buf)
    assert _consume_and_release(tb, h)[3] == "float8_e4m3fn"


def test_vector_dtype_is_accepted_and_named(tb, buf):
    """lanes > 1 is valid DLPack (API.md): the view says "float32x4" and NumPy, which cannot
    take vector types, refuses it itself."""
    h = HandMadeCapsule(data=buf.ctypes.data, shape=(4,), strides=(1,), dtype=(2, 32, 4), keep=buf)
    v = tb.asview(h.make())
    assert v.dtype == "float32x4"
    assert v.itemsize == 16 and v.nbytes == 64
    with pytest.raises(Exception):
        np.from_dlpack(v)
    del v
    gc.collect()
    assert h.deleted == 1


def test_zero_size_null_data_is_accepted(tb):
    h = HandMadeCapsule(data=0, shape=(0, 3), strides=(3, 1))
    assert _consume_and_release(tb, h)[1] == (0, 3)


BAD_CAPSULES = {
    # name: (HandMadeCapsule changes, expected exception)
    "major_2": (dict(version=(2, 0)), BufferError),
    "dtype_code_99": (dict(dtype=(99, 32, 1)), TypeError),
    "float_bits_24": (dict(dtype=(2, 24, 1)), TypeError),
    "bool_bits_1": (dict(dtype=(6, 1, 1)), TypeError),
    "device_99": (dict(device=(99, 0)), BufferError),
    "ndim_negative": (dict(ndim=-1), ValueError),
    "ndim_too_large": (dict(ndim=2), ValueError),  # shape/strides arrays hold 1 entry
    "negative_shape": (dict(shape=(-4,)), ValueError),
    "null_data": (dict(data=0), ValueError),
    "misaligned": (dict(byte_offset=2), ValueError),
    "overflowing_extent": (dict(shape=(2**62,), strides=(4,)), ValueError),
}


@pytest.mark.parametrize("case", list(BAD_CAPSULES))
def test_bad_capsule_refused_and_deleter_runs_once(tb, buf, case):
    changes, exc = BAD_CAPSULES[case]
    fields = dict(data=buf.ctypes.data, shape=(4,), strides=(1,), keep=buf)
    if case == "ndim_too_large":
        # rank 2 announced but the arrays hold 1 entry: read the truth from a 2-entry array
        # whose second entries are absurd, so the view cannot silently "work"
        fields.update(shape=(4, -7), strides=(1, 1), ndim=2)
        changes = {}
    fields.update(changes)
    h = HandMadeCapsule(**fields)
    cap = h.make()
    with pytest.raises(exc):
        tb.asview(cap)
    del cap
    gc.collect()
    assert h.deleted == 1, f"deleter ran {h.deleted} times for a refused capsule"


# --- what is not a tensor -------------------------------------------------------------------------


@pytest.mark.parametrize("obj", [42, 3.5, None, [1, 2, 3], {"a": 1}, "text", object()], ids=repr)
def test_unknown_types_are_type_errors_naming_the_type(tb, obj):
    with pytest.raises(TypeError) as info:
        tb.asview(obj)
    assert type(obj).__name__ in str(info.value), str(info.value)


def test_stream_zero_is_refused(tb):
    a = aligned_numpy((4,), np.float32, fill=1)
    with pytest.raises(ValueError, match="0"):
        tb.asview(a, stream=0)


def test_cuda_array_interface_host_pointer_is_refused(tb):
    """A CAI producer whose pointer is host memory (or anything the driver does not know, or
    no driver at all): never a view that a GPU framework would then dereference."""
    a = aligned_numpy((4,), np.float32, fill=1)

    class FakeCuda:
        __cuda_array_interface__ = {"shape": (4,), "typestr": "<f4", "data": (a.ctypes.data, False), "version": 3}

    with pytest.raises(ValueError):
        tb.asview(FakeCuda())


# --- ROCm producers and views (no ROCm runtime here: fakes) ---------------------------------------

KDLROCM = 10


class FakeRocm:
    """A ROCm producer: ``__dlpack_device__`` says (10, 0); ``__dlpack__`` records its keyword
    arguments, and refuses CUDA's 1 and 2 as the DLPack spec's ROCm rules (and torch on ROCm)
    do, then hands out a hand-made ROCm capsule over host memory (never dereferenced)."""

    def __init__(self, buf):
        self.h = HandMadeCapsule(
            data=buf.ctypes.data, shape=(4,), strides=(1,), device=(KDLROCM, 0), keep=buf
        )
        self.calls = []

    def __dlpack__(self, **kw):
        self.calls.append(kw)
        if kw.get("stream") in (1, 2):
            raise AssertionError(f"unsupported stream on ROCm: {kw['stream']}")
        return self.h.make()

    def __dlpack_device__(self):
        return (KDLROCM, 0)


def test_rocm_producer_gets_rocm_streams(tb, buf):
    """The caller's stream reaches a ROCm producer in ROCm's values: ``None`` passed
    explicitly, -1 and handles unchanged, CUDA's legacy default stream (1) as ROCm's default
    stream 0, and CUDA's per-thread default stream (2), which ROCm has not, refused before
    the producer is asked."""
    p = FakeRocm(buf)
    for given, passed in [(None, None), (-1, -1), (1, 0), (0x7F00_1234, 0x7F00_1234)]:
        v = tb.asview(p, stream=given)
        assert v.device == "rocm:0" and v.ptr == buf.ctypes.data
        assert "stream" in p.calls[-1], p.calls[-1]
        assert p.calls[-1]["stream"] == passed, (given, p.calls[-1])
    n = len(p.calls)
    with pytest.raises(ValueError, match="ROCm"):
        tb.asview(p, stream=2)
    assert len(p.calls) == n


def test_cpu_producer_gets_no_stream(tb):
    """Host producers get no ``stream`` at all (the array API: CPU takes only None)."""
    p = RecordingProducer(aligned_numpy((3,), np.float32, fill=1))
    tb.asview(p)
    assert "stream" not in p.calls[-1], p.calls[-1]


@pytest.mark.parametrize("stream", [None, -1, 0, 0x7F00_1234])
def test_rocm_view_takes_rocm_consumer_streams(tb, buf, stream):
    """A consumer on ROCm passes 0 (its default stream) or a handle (torch on ROCm does)."""
    v = tb.asview(FakeRocm(buf))
    cap = v.__dlpack__(stream=stream, max_version=(1, 3))
    assert capsule_name(cap) == "dltensor_versioned"
    consume_capsule(cap)


@pytest.mark.parametrize("stream", [1, 2])
def test_rocm_view_refuses_cuda_only_streams(tb, buf, stream):
    v = tb.asview(FakeRocm(buf))
    with pytest.raises(ValueError, match="ROCm"):
        v.__dlpack__(stream=stream, max_version=(1, 3))


def test_capsule_that_does_not_validate_falls_back_to_the_array_interface(tb):
    """CuPy 14.2 exports negative strides through DLPack as ``(u64)byte_stride / itemsize``
    (2**62 - 1 for -4 bytes of float32) while its array interface says -4: such a producer
    is viewed through the interface, and the refused capsule's deleter runs once. A producer
    whose interface is wrong too gets the interface's error."""
    import numpy as np

    base = np.arange(10, dtype=np.float32)
    rev = base[::-1]
    h = HandMadeCapsule(data=rev.ctypes.data, shape=(10,), strides=((2**64 - 4) // 4,), keep=base)

    class CupyLike:
        def __dlpack__(self, stream=None, max_version=None, dl_device=None, copy=None):
            return h.make()

        def __dlpack_device__(self):
            return (1, 0)

        __array_interface__ = rev.__array_interface__

    v = tb.asview(CupyLike())
    assert v.shape == (10,) and v.strides == (-1,) and v.ptr == rev.ctypes.data
    assert np.array_equal(np.asarray(v), rev)
    assert h.deleted == 1

    class AllWrong(CupyLike):
        __array_interface__ = {**rev.__array_interface__, "strides": (3,)}

    with pytest.raises(ValueError):
        tb.asview(AllWrong())
    assert h.deleted == 2

    class NoInterface:
        __dlpack__ = CupyLike.__dlpack__
        __dlpack_device__ = CupyLike.__dlpack_device__

    with pytest.raises(ValueError, match="overflows"):
        tb.asview(NoInterface())
    assert h.deleted == 3
