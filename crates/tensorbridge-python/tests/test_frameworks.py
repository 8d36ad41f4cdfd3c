"""Every host framework, both ways, every dtype: producer -> tb.asview -> consumer.

For each ordered pair (producer, consumer) of NumPy, PyTorch, JAX and TensorFlow, and each of
the 15 dtypes they share, the test checks that

- the view reports the producer's pointer, shape, element strides, dtype name and device;
- the consumer's tensor has the producer's data pointer (read independently of tensorbridge,
  see ``frameworks.py``) and the same values;
- a write is visible on the other side: through the consumer when it can write, else through
  the producer, else (JAX and TF are immutable by design) through a third framework that
  imports the same view, whose write must then show in both.

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

FW_IDS = [f.name for f in HOST_FRAMEWORKS]

# (producer, consumer, dtype) -> (exception type, text in its message). Measured in the CI
# venv (numpy 2.4.6, torch 2.11, jax 0.10.2, tensorflow-cpu 2.21): NumPy has no bfloat16, so
# np.from_dlpack refuses a bfloat16 tensor from any producer, tensorbridge included.
EXPECTED_REFUSALS = {
    ("*", "numpy", "bfloat16"): (RuntimeError, "Unsupported dtype"),
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
    # DLPack producers here export writable memory (JAX/TF through legacy capsules, which
    # cannot say otherwise; NumPy and torch through versioned ones without READ_ONLY)
    assert v.readonly is False


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("consumer", FW_IDS)
@pytest.mark.parametrize("producer", FW_IDS)
def test_producer_to_consumer_zero_copy(tb, producer, consumer, dtype):
    p, c = require(BY_NAME[producer]), require(BY_NAME[consumer])
    values = sample(dtype)
    x = p.make(values)
    v = tb.asview(x)

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

    m = marker(dtype)
    w = writer_for(c, p)
    if w is c:
        w.write0(y, m)
        assert p.read(x).flat[0] == m, "write through the consumer not seen by the producer"
    elif w is p:
        w.write0(x, m)
        assert c.read(y).flat[0] == m, "write through the producer not seen by the consumer"
    else:
        # JAX <-> TF and each with itself: both immutable; a third framework writes
        z = w.consume(v)
        assert w.ptr(z) == p.ptr(x)
        w.write0(z, m)
        assert p.read(x).flat[0] == m
        assert c.read(y).flat[0] == m
    # the rest of the buffer is untouched
    assert_same_values(p.read(x).reshape(-1)[1:], values.reshape(-1)[1:])


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
    assert_same_values(np.from_dlpack(vv), sample("int32"))


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


def test_torch_requires_grad_is_refused_cleanly(tb):
    """torch refuses to export a tensor that requires grad (BufferError from __dlpack__); the
    view must not be made by going around that refusal silently."""
    torch = pytest.importorskip("torch")
    t = torch.zeros(3, requires_grad=True)
    with pytest.raises((BufferError, RuntimeError), match="grad"):
        tb.asview(t)
    v = tb.asview(t.detach())
    assert v.ptr == t.data_ptr()
