"""The per-call fast paths of the import, each checked against the
general path it stands in for, field by field, on the same memory:

- a NumPy ``ndarray`` (exactly that type) is read through the buffer protocol instead of
  ``__dlpack__``: the same pointer, shape, strides, dtype and writability as its DLPack
  capsule gives; what the buffer cannot say exactly (datetimes, byte-swapped data, ml_dtypes'
  types) still takes ``__dlpack__`` and gets NumPy's own answer;
- a PyTorch tensor is read through its exchange table's non-owning ``DLTensor`` with the
  tensor object as the owner: the same fields as its owning export, PyTorch's refusals kept;
- the per-type facts are cached: a NumPy masked array is still refused after plain arrays
  (and the other way round).
"""

import gc
import sys
import weakref

import numpy as np
import pytest

import tensorbridge as tb

from tbhelpers import needs_numpy_dlpack_1


def fields(v):
    return (v.ptr, v.shape, v.strides, v.dtype_name, v.device, v.readonly)


def via_dlpack(a):
    """The general path: the producer's own versioned capsule."""
    return tb.asview(a.__dlpack__(max_version=(1, 3)))


NUMPY_CASES = [
    np.arange(24, dtype=np.float32).reshape(2, 3, 4),
    np.arange(24, dtype=np.float64).reshape(4, 6).T,
    np.arange(24, dtype=np.int64)[::3],
    np.arange(24, dtype=np.int8).reshape(2, 12)[:, ::-2],
    np.arange(6, dtype=np.uint16),
    np.array([True, False, True]),
    np.arange(6, dtype=np.float16),
    (np.arange(6) + 1j).astype(np.complex64),
    np.arange(6).astype(np.complex128),
    np.array(3.5, dtype=np.float32),
    np.arange(12, dtype=np.float32).reshape(3, 1, 4)[:, :, ::2],  # a size-1 dimension
    np.ones((3, 1), dtype=np.float32)[:, ::100],  # a size-1 dimension's stride
    np.zeros((0, 3), dtype=np.float32),
    np.zeros((3, 0), dtype=np.int32)[:, ::-1],
    np.arange(4 ** 9, dtype=np.uint8).reshape((4,) * 9),  # more dimensions than kept inline
]


@needs_numpy_dlpack_1
@pytest.mark.parametrize("a", NUMPY_CASES, ids=lambda a: f"{a.dtype}{a.shape}{a.strides}")
def test_numpy_fast_path_matches_dlpack(a):
    fast = tb.asview(a)
    assert fields(fast) == fields(via_dlpack(a))
    assert fast.ptr == a.__array_interface__["data"][0]


@needs_numpy_dlpack_1
def test_numpy_fast_path_carries_read_only():
    a = np.arange(6, dtype=np.float32)
    a.flags.writeable = False
    assert tb.asview(a).readonly
    assert fields(tb.asview(a)) == fields(via_dlpack(a))


@needs_numpy_dlpack_1
def test_numpy_fast_path_releases_the_buffer_when_the_last_user_is_gone():
    """The fast path holds NumPy's buffer (a reference to the array) and releases it exactly
    when the view and every consumer of it are gone."""
    a = np.arange(8, dtype=np.float32)
    before = sys.getrefcount(a)
    v = tb.asview(a)
    assert sys.getrefcount(a) > before
    t = np.from_dlpack(v)  # a consumer keeps the memory too
    del v
    gc.collect()
    assert sys.getrefcount(a) > before
    t[0] = 42.0
    assert a[0] == 42.0  # the same memory, written through the consumer
    del t
    gc.collect()
    assert sys.getrefcount(a) == before


def test_numpy_fast_path_keeps_the_array_alive():
    a = np.arange(8, dtype=np.float32) + 1
    ref = weakref.ref(a) if hasattr(a, "__weakref__") else None
    v = tb.asview(a)
    ptr = v.ptr
    del a
    gc.collect()
    back = np.from_dlpack(v)
    assert back.__array_interface__["data"][0] == ptr
    assert back.tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]
    del v, back
    gc.collect()
    if ref is not None:
        assert ref() is None


class Sub(np.ndarray):
    """A subclass: never the fast path."""


def same_refusal(a):
    """`tb.asview(a)` fails exactly as the general path (a subclass view of `a`) does."""
    with pytest.raises(Exception) as fast:
        tb.asview(a)
    with pytest.raises(Exception) as general:
        tb.asview(a.view(Sub))
    assert type(fast.value) is type(general.value)
    assert str(fast.value) == str(general.value)
    return fast.value


def test_numpy_byteswapped_takes_the_general_path():
    err = same_refusal(np.arange(4, dtype=">f4"))
    assert "big-endian" in str(err)


def test_numpy_datetime_takes_the_general_path():
    same_refusal(np.array(["2026-11-23"], dtype="datetime64[D]"))


@needs_numpy_dlpack_1
def test_numpy_subclass_takes_the_general_path():
    a = np.arange(6, dtype=np.float32).view(Sub)
    assert fields(tb.asview(a)) == fields(via_dlpack(a))


def test_masked_array_refused_after_plain_arrays_and_plain_taken_after_masked():
    plain = np.arange(4.0)
    masked = np.ma.masked_array(np.arange(4.0), mask=[0, 1, 0, 0])
    for _ in range(2):  # the second round answers from the per-type cache
        assert tb.asview(plain).shape == (4,)
        with pytest.raises(ValueError, match="masked"):
            tb.asview(masked)


def test_ml_dtypes_arrays_still_take_dlpack():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    a = np.arange(6, dtype=np.float32).astype(ml_dtypes.bfloat16)
    v = tb.asview(a)
    assert v.dtype_name == "bfloat16"
    assert v.ptr == a.__array_interface__["data"][0]


# -- PyTorch: the exchange table's non-owning DLTensor -------------------------------------


def torch_cases(torch):
    base = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4)
    return [
        base,
        base.transpose(0, 2),
        base[:, 1:, ::2],
        torch.arange(6, dtype=torch.bfloat16),
        torch.ones(6, dtype=torch.complex64),
        torch.tensor(3.0),
        torch.zeros(0, 3),
        torch.arange(8, dtype=torch.int64)[1:],  # a storage offset
        torch.ones(2, dtype=torch.bool),
    ]


def test_torch_borrowed_path_matches_torchs_owning_export():
    torch = pytest.importorskip("torch")
    for x in torch_cases(torch):
        fast = tb.asview(x)
        assert fields(fast) == fields(via_dlpack(x)), x
        if x.numel():
            assert fast.ptr == x.data_ptr()
        assert not fast.readonly


def test_torch_path_pins_the_storage_not_only_the_tensor_object():
    """[owner]: the view holds the tensor's storage (and the tensor object, as every view holds
    its producer), so the memory outlives a rebinding of the object (`set_`), and is released
    once, when the view and its users are gone."""
    torch = pytest.importorskip("torch")
    released = []
    data = np.arange(6, dtype=np.float32)
    root = tb.from_ptr(data.ctypes.data, (6,), "float32", device="cpu", owner=data,
                       release=lambda: released.append(1))  # fmt: skip
    x = torch.from_dlpack(root)  # a torch tensor whose storage releases `root` once
    del root
    ref = weakref.ref(x)
    v = tb.asview(x)
    x.set_(torch.zeros(3))  # the object lets go of the storage...
    gc.collect()
    assert released == []  # ...which the view still pins
    assert ref() is not None  # the producer object is held too
    y = torch.from_dlpack(v)
    y[0] = 7.0
    assert data[0] == 7.0  # the same memory, writes visible
    del x, y
    gc.collect()
    assert released == []
    del v
    gc.collect()
    assert released == [1]
    assert ref() is None


def test_torch_refusals_are_kept_on_the_fast_path():
    torch = pytest.importorskip("torch")
    conj = torch.ones(3, dtype=torch.complex64).conj()
    assert conj.is_conj()
    with pytest.raises(BufferError) as ours:
        tb.asview(conj)
    with pytest.raises(BufferError) as torchs:
        conj.__dlpack__()
    assert str(ours.value) == str(torchs.value)
    neg = torch.ones(3, dtype=torch.complex64).conj().imag
    assert neg.is_neg()
    with pytest.raises(BufferError):
        tb.asview(neg)


def test_tensors_that_require_grad_come_out_read_only():
    """[access]: reading a tensor that requires grad is fine (nn.Parameter inputs); writing
    through the view would bypass autograd, so the view is read-only."""
    torch = pytest.importorskip("torch")
    grad = torch.ones(3, requires_grad=True)
    v = tb.asview(grad)
    assert v.readonly and v.ptr == grad.data_ptr()
    param = torch.nn.Parameter(torch.arange(4.0))
    p = tb.asview(param)
    assert p.readonly and p.ptr == param.data_ptr() and p.shape == (4,)
    a = np.asarray(p)  # NumPy honours the array interface's readonly
    assert not a.flags.writeable
    assert a.tolist() == [0.0, 1.0, 2.0, 3.0]
    with pytest.raises(ValueError):
        a[0] = 1.0


# -- the three-tensor extension call (benches/python/compare.py's subject) ---------------


@needs_numpy_dlpack_1
def test_three_tensor_calls_take_every_framework():
    ext = pytest.importorskip("tensorbridge_example")
    a = np.arange(6, dtype=np.float32)
    b = np.arange(4, dtype=np.int64)[::2]
    c = np.zeros((2, 3), dtype=np.float64)
    assert ext.nop3(a, b, c) == 6 + 2 + 6
    assert ext.dlpark_nop3(a, b, c) == 6 + 2 + 6
    assert ext.empty() is None
    torch = pytest.importorskip("torch")
    t = torch.ones(5)
    assert ext.nop3(t, a, tb.asview(t)) == 5 + 6 + 5
    assert ext.dlpark_nop3(t, t, t) == 15
    with pytest.raises(TypeError):
        ext.nop3(t, t, object())
