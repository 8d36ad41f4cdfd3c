"""Every host framework, both ways, every dtype: producer -> tb.asview -> consumer.

For each ordered pair (producer, consumer) of NumPy, PyTorch, JAX and TensorFlow, and each of
the 15 dtypes they share, the test checks that

- the view reports the producer's pointer, shape, element strides, dtype name and device;
- the consumer's tensor has the producer's data pointer (read independently of tensorbridge,
  see ``frameworks.py``) and the same values;
- writes are visible both ways: one through the consumer seen by the producer, one through
  the producer seen by the consumer; JAX and TF are immutable by design: as consumers of a
  writable producer, a third framework that imports the same view writes on their side, and
  its write must show in both; as producers their views are read-only and nothing writes;
  consumers that ask for legacy capsules (TF, JAX before 0.12, NumPy before 2.1) get them, as
  JAX and TF hand out their own arrays (ARCHITECTURE.md, "The read-only rule").

The only pairs that do not share memory are the ones the frameworks themselves refuse, and
those are asserted exactly (see ``EXPECTED_REFUSALS``). NumPy bfloat16 (ml_dtypes) has no DLPack
export of its own (NumPy raises BufferError); tensorbridge falls back to the array interface
and names the dtype from it, so NumPy is a bfloat16 producer here like the others.
"""

import gc

import numpy as np
import pytest

from frameworks import (
    BY_NAME,
    DTYPES,
    HOST_FRAMEWORKS,
    ITEMSIZE,
    assert_same_values,
    marker,
    require,
    sample,
    writer_for,
)
from tbhelpers import NUMPY_DLPACK_VERSIONED, describe_exc, np_take

FW_IDS = [f.name for f in HOST_FRAMEWORKS]

# (producer, consumer, dtype) -> (exception type, text in its message). Measured in the CI
# venv (numpy 2.4.6, torch 2.11, jax 0.10.2, tensorflow-cpu 2.21): NumPy has no bfloat16, so
# np.from_dlpack refuses a bfloat16 tensor from any producer, tensorbridge included. NumPy
# 2.5 (the GPU machine's 2.5.2) raises BufferError where 2.4 raised RuntimeError.
EXPECTED_REFUSALS = {
    ("*", "numpy", "bfloat16"): ((RuntimeError, BufferError), "Unsupported dtype"),
}


def expected_refusal(p, c, dt):
    for (ep, ec, ed), v in EXPECTED_REFUSALS.items():
        if ep in ("*", p) and ec in ("*", c) and ed in ("*", dt):
            return v
    return None


def c_strides(shape):
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= s
    return tuple(reversed(out))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("producer", FW_IDS)
def test_asview_describes_producer(tb, producer, dtype):
    p = require(BY_NAME[producer])
    values = sample(dtype)
    x = p.make(values)
    v = tb.asview(x)
    assert v.ptr == p.ptr(x)
    assert v.shape == (3, 5)
    assert v.strides == (5, 1)
    assert v.byte_strides == (5 * ITEMSIZE[dtype], ITEMSIZE[dtype])
    assert v.dtype == dtype
    assert v.itemsize == ITEMSIZE[dtype]
    assert v.nbytes == 15 * ITEMSIZE[dtype]
    assert v.ndim == 2
    assert v.device == "cpu"
    assert v.__dlpack_device__() == (1, 0)
    # [access]: JAX and TF arrays are immutable; their legacy capsules cannot say so, so the
    # view is read-only unless the producer is known to hand out writable memory (NumPy, torch)
    assert v.readonly is (not p.writable)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("consumer", FW_IDS)
@pytest.mark.parametrize("producer", FW_IDS)
def test_producer_to_consumer_zero_copy(tb, producer, consumer, dtype):
    p, c = require(BY_NAME[producer]), require(BY_NAME[consumer])
    values = sample(dtype)
    x = p.make(values)
    v = tb.asview(x)

    # An immutable producer's view is read-only; TF, JAX before 0.12 and NumPy before 2.1 ask
    # for legacy capsules, which cannot carry the flag, and get the one the producer (JAX, TF)
    # would give them itself.
    if not p.writable:
        assert v.readonly
    refusal = expected_refusal(producer, consumer, dtype)
    if refusal is not None:
        exc, text = refusal
        with pytest.raises(exc, match=text):
            c.consume(v)
        # the refused export was released cleanly and the view is still usable
        gc.collect()
        assert v.ptr == p.ptr(x)
        return

    y = c.consume(v)
    assert c.ptr(y) == p.ptr(x), f"{producer} -> {consumer} copied"
    assert_same_values(c.read(y), values)
    if not p.writable:
        # Zero-copy is shown by the pointer and the values; nothing writes into an immutable
        # producer's memory (NumPy hands the read-only flag on; torch 2.11 ignores it).
        if consumer == "numpy":
            assert not y.flags.writeable
        return

    # Writes both ways: through the consumer at flat index 0 (seen by the producer), through
    # the producer at flat index 1 (seen by the consumer). A side that cannot write (JAX and
    # TF are immutable by design) is stood in for by a third framework importing the same
    # view, whose write must then show on both sides.
    third = []
    if consumer == "numpy" and not NUMPY_DLPACK_VERSIONED:
        # NumPy 2.0 and older make every DLPack import read-only
        assert not y.flags.writeable

    def can_write(fw, obj):
        return fw.writable and not (fw.name == "numpy" and not obj.flags.writeable)

    def writer_of(fw, obj):
        if can_write(fw, obj):
            return fw, obj
        if not third:
            w = writer_for()
            try:
                z = w.consume(v)
            except Exception:
                # the stand-in refuses the dtype (NumPy and bfloat16, where torch is absent)
                if expected_refusal(producer, w.name, dtype) is None:
                    raise
                third.append(None)
                return None
            assert w.ptr(z) == p.ptr(x)
            # None: no framework here can write through the view (NumPy 2.0 and older import
            # DLPack read-only, and torch is absent: CPython 3.9)
            third.append((w, z) if can_write(w, z) else None)
        return third[0]

    m0, m1 = marker(dtype, 0), marker(dtype, 1)
    writer = writer_of(c, y)
    if writer is not None:
        w, target = writer
        w.write_flat(target, 0, m0)
        assert p.read(x).flat[0] == m0, f"write through {w.name} (consumer side) not seen by the producer"
        assert c.read(y).flat[0] == m0
    writer = writer_of(p, x)
    if writer is None:
        return
    w, target = writer
    w.write_flat(target, 1, m1)
    assert c.read(y).flat[1] == m1, f"write through {w.name} (producer side) not seen by the consumer"
    assert p.read(x).flat[1] == m1
    # the rest of the buffer is untouched
    assert_same_values(p.read(x).reshape(-1)[2:], values.reshape(-1)[2:])


@pytest.mark.parametrize("consumer", FW_IDS)
@pytest.mark.parametrize("producer", FW_IDS)
def test_consumer_keeps_memory_after_producer_and_view_are_gone(tb, producer, consumer):
    """producer -> view -> consumer; drop the producer and the view: the consumer's tensor
    still reads the original values (the chain keeps the memory alive)."""
    p, c = require(BY_NAME[producer]), require(BY_NAME[consumer])
    values = sample("float32", (64, 64))
    x = p.make(values)
    y = c.consume(tb.asview(x))
    ptr = p.ptr(x)
    del x
    gc.collect()
    # churn the allocator so that freed memory would be reused
    junk = [np.full((64, 64), -1.0, np.float32) for _ in range(64)]
    assert c.ptr(y) == ptr
    assert_same_values(c.read(y), values)
    del junk


@pytest.mark.parametrize("producer", FW_IDS)
def test_view_of_view_is_the_same_memory(tb, producer):
    p = require(BY_NAME[producer])
    x = p.make(sample("int32"))
    v = tb.asview(x)
    vv = tb.asview(v)
    assert (vv.ptr, vv.shape, vv.strides, vv.dtype) == (v.ptr, v.shape, v.strides, v.dtype)
    del v
    gc.collect()
    assert_same_values(np_take(vv), sample("int32"))


def test_tensorflow_tensor_pointer_equals_numpy_buffer_view(tb):
    """The pointer tensorbridge reports for a TF tensor is the one TF's own buffer protocol
    and DLPack export report (cookbook: "the device pointer of a TensorFlow tensor")."""
    tf = pytest.importorskip("tensorflow")
    t = tf.constant(np.arange(12, dtype=np.float32).reshape(3, 4))
    v = tb.asview(t)
    assert v.ptr == np.asarray(memoryview(t)).ctypes.data
    assert v.ptr == BY_NAME["tensorflow"].ptr(t)


def test_torch_exchange_api_producer(tb):
    """torch 2.11 tensors carry the DLPack C exchange API (a type attribute); whichever path
    tensorbridge takes, the view is the tensor's memory and follows its storage offset."""
    torch = pytest.importorskip("torch")
    assert type(getattr(torch.Tensor, "__dlpack_c_exchange_api__", None)).__name__ == "PyCapsule"
    base = torch.arange(20, dtype=torch.float32).reshape(4, 5)
    t = base[1:, 2:]  # storage offset 7, non-contiguous
    v = tb.asview(t)
    assert v.ptr == t.data_ptr() == base.data_ptr() + 7 * 4
    assert v.shape == (3, 3) and v.strides == (5, 1)
    y = torch.from_dlpack(v)
    y[0, 0] = -1
    assert base[1, 2].item() == -1


def test_torch_requires_grad_is_viewed_read_only(tb):
    """torch refuses to export a tensor that requires grad; a view of it is read-only instead
    (reading it is fine, as C++ extensions and tvm-ffi read nn.Parameter inputs; writing would
    bypass autograd), and its ``__dlpack__`` refuses as torch's does, in every version: a
    versioned capsule's read-only flag would not stop ``torch.from_dlpack``, which ignores it.
    The detached tensor is writable."""
    torch = pytest.importorskip("torch")
    t = torch.zeros(3, requires_grad=True)
    v = tb.asview(t)
    assert v.readonly and v.ptr == t.data_ptr()
    for max_version in (None, (1, 3)):
        with pytest.raises(BufferError, match="requires grad"):
            v.__dlpack__(max_version=max_version)
    with pytest.raises(BufferError, match="requires grad"):
        v.__dlpack__(max_version=(1, 3), copy=True)  # torch refuses its copies too
    with pytest.raises(BufferError, match="requires grad"):
        torch.from_dlpack(v)
    r = np.asarray(v)  # told: NumPy honours the array interface's readonly
    assert not r.flags.writeable and r.ctypes.data == t.data_ptr()
    w = tb.asview(t.detach())
    assert w.ptr == t.data_ptr() and not w.readonly


def test_tensorflow_dlpack_functions(tb):
    """TF's DLPack entry points in 2.21: ``tf.experimental.dlpack.to_dlpack`` (a legacy capsule
    that tensorbridge consumes zero-copy) and ``from_dlpack`` (takes only a legacy capsule, so
    a view is handed over as ``view.__dlpack__()``). ``tf.from_dlpack`` does not exist in 2.21;
    if a later TF adds it, it must take a view directly, zero-copy."""
    tf = pytest.importorskip("tensorflow")
    t = tf.constant(np.arange(8, dtype=np.float32))
    cap = tf.experimental.dlpack.to_dlpack(t)
    v = tb.asview(cap)
    assert v.ptr == BY_NAME["tensorflow"].ptr(t)
    # a bare legacy capsule's producer is unknown: read-only ([access])
    assert v.readonly
    with pytest.raises(TypeError):
        tf.experimental.dlpack.from_dlpack(v)  # not a capsule: TF's own TypeError
    # read-only only for want of a flag: it goes back out as the legacy capsule it came as
    again = tf.experimental.dlpack.from_dlpack(v.__dlpack__())
    assert BY_NAME["tensorflow"].ptr(again) == v.ptr
    assert v.__dlpack__(max_version=(1, 3)) is not None  # told read-only where it can be
    # a writable producer's view goes back to TF zero-copy
    a = np.arange(8, dtype=np.float32)
    w = tb.asview(a)
    back = tf.experimental.dlpack.from_dlpack(w.__dlpack__())
    assert BY_NAME["tensorflow"].ptr(back) == w.ptr == a.ctypes.data
    if hasattr(tf, "from_dlpack"):
        assert BY_NAME["tensorflow"].ptr(tf.from_dlpack(w)) == w.ptr
    else:
        assert tf.__version__.startswith("2.21"), "tf.from_dlpack is absent: check the TF pin"


# --- tensors torch refuses to export --------------------------------------------------------------

TORCH_REFUSALS = {
    "sparse_coo": lambda torch: torch.eye(3).to_sparse(),
    "sparse_csr": lambda torch: torch.eye(3).to_sparse_csr(),
    "mkldnn": lambda torch: torch.ones(3).to_mkldnn(),
    "quantized": lambda torch: torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.qint8),
    "bits": lambda torch: torch.zeros(3, dtype=torch.bits8),
    "meta": lambda torch: torch.empty(3, device="meta"),
    "conj": lambda torch: torch.ones(3, dtype=torch.complex64).conj(),
}


@pytest.mark.parametrize("case", sorted(TORCH_REFUSALS))
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_torch_refusals_are_torchs_own(tb, case):
    """Every tensor torch's ``__dlpack__`` refuses is refused with torch's exception type and
    message, without libtorch's C++ backtrace (before the fix, sparse, mkldnn, quantized, bit
    and meta tensors reached the DLPack C exchange API and raised RuntimeError with ~15 lines
    of C++ frames)."""
    torch = pytest.importorskip("torch")
    t = TORCH_REFUSALS[case](torch)
    with pytest.raises(Exception) as theirs:
        t.__dlpack__(max_version=(1, 3))
    with pytest.raises(Exception) as ours:
        tb.asview(t)
    assert type(ours.value) is type(theirs.value), (describe_exc(ours.value), describe_exc(theirs.value))
    assert str(ours.value) == str(theirs.value)
    assert "frame #" not in str(ours.value) and "Exception raised from" not in str(ours.value)


def test_torch_negative_bit_is_refused(tb):
    """A lazily negated tensor (``x.conj().imag``) shows -2 where its memory holds 2; torch
    2.11's ``__dlpack__`` exports the memory as it is (a consumer sees 2). tensorbridge
    refuses it, pointing to ``resolve_neg()``, which gives a tensor that views correctly."""
    torch = pytest.importorskip("torch")
    t = torch.tensor([1 + 2j]).conj().imag
    assert t.is_neg() and t.tolist() == [-2.0]
    with pytest.raises(BufferError, match="resolve_neg"):
        tb.asview(t)
    r = t.resolve_neg()
    assert np.asarray(tb.asview(r)).tolist() == [-2.0]


def test_torch_subclass_overriding_dlpack_is_asked(tb):
    """A torch.Tensor subclass that overrides ``__dlpack__`` (or ``__torch_function__``, through
    which torch's ``__dlpack__`` dispatches) is asked through it, not around it through the
    C exchange API it inherits; a refusal from it is final."""
    torch = pytest.importorskip("torch")
    calls = []

    class Overriding(torch.Tensor):
        def __dlpack__(self, **kw):
            calls.append(kw)
            return super().__dlpack__(**kw)

    class Dispatching(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            if func is torch.Tensor.__dlpack__:
                calls.append("torch_function")
            return super().__torch_function__(func, types, args, kwargs or {})

    class Refusing(torch.Tensor):
        def __dlpack__(self, **kw):
            raise BufferError("this subclass does not export")

    class Plain(torch.Tensor):
        pass

    base = torch.arange(4, dtype=torch.float32)
    v = tb.asview(base.as_subclass(Overriding))
    assert v.ptr == base.data_ptr() and len(calls) == 1 and calls[0]["max_version"] == (1, 3)
    v = tb.asview(base.as_subclass(Dispatching))
    assert v.ptr == base.data_ptr() and calls[1:] == ["torch_function"]
    with pytest.raises(BufferError, match="does not export"):
        tb.asview(base.as_subclass(Refusing))
    assert tb.asview(base.as_subclass(Plain)).ptr == base.data_ptr()
