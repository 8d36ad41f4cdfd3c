"""``tensorbridge.View`` as a DLPack C exchange API producer (DLPack 1.3), seen by a ctypes
consumer: the table on ``type(view)``, each of its functions, and who releases what.

Ownership is counted through ``tb.from_ptr(..., release=...)``: ``release`` runs once, only
after the view and every managed tensor exported from it are gone, which shows that each export
holds one owner clone and that its deleter runs exactly once.

GPU ordering (the legacy default stream waits for a busy producer) is in
``gpu/test_gpu_exchange_producer.py``.
"""

import ctypes
import gc
import sys

import numpy as np
import pytest

import tensorbridge as tb
from tbhelpers import (
    DELETER,
    FLAG_READ_ONLY,
    KDLCPU,
    SET_ERROR,
    DLManagedTensorVersioned,
    DLTensor,
    aligned_numpy,
    delete_managed,
    dltensor_info,
    exchange_table,
    managed_info,
)


def counted_view(shape=(3, 4), dtype=np.float32, readonly=False, strides=None, offset=0):
    """A view over a fresh host array whose ``release`` is counted; returns (view, array,
    release count)."""
    a = aligned_numpy((64,), dtype, fill=np.arange(64))
    calls = []
    v = tb.from_ptr(
        a.ctypes.data + offset * a.itemsize,
        shape,
        np.dtype(dtype).name,
        strides=strides,
        device="cpu",
        owner=a,
        readonly=readonly,
        release=lambda: calls.append(1),
    )
    return v, a, calls


@pytest.fixture(scope="module")
def api():
    return exchange_table(tb.View)


def export(api, obj) -> int:
    out = ctypes.c_void_p(0)
    assert api.from_py(obj, ctypes.byref(out)) == 0
    assert out.value
    return out.value


def test_the_table_is_published_on_the_type(api):
    v, _, _ = counted_view()
    # A type attribute, the same table for every view (consumers cache it per type).
    assert "__dlpack_c_exchange_api__" in vars(tb.View)
    assert type(v).__dlpack_c_exchange_api__ is tb.View.__dlpack_c_exchange_api__
    assert (api.table.version.major, api.table.version.minor) == (1, 3)
    assert api.table.prev_api is None
    # The DLPack 1.2 alias: the same table's address as an int.
    assert isinstance(tb.View.__c_dlpack_exchange_api__, int)
    assert tb.View.__c_dlpack_exchange_api__ == api.address
    for fn in (api.allocator, api.from_py, api.to_py, api.dltensor_from_py, api.current_work_stream):
        assert fn is not None


def test_managed_export_is_the_view_zero_copy(api):
    # A strided view with an element offset: data pointer, shape, strides all differ from the
    # array's own.
    v, a, released = counted_view(shape=(3, 4), strides=(8, 2), offset=5)
    managed = export(api, v)
    info = managed_info(managed)
    assert info.version == (1, 3)
    assert info.flags == 0
    assert info.ptr == v.ptr == a.ctypes.data + 5 * 4
    # The offset is folded into `data`, as `__dlpack__` writes it.
    assert info.byte_offset == 0
    assert info.device == (KDLCPU, 0)
    assert info.dtype == (2, 32, 1)
    assert info.shape == v.shape == (3, 4)
    assert info.strides == v.strides == (8, 2)
    # The same struct `__dlpack__(max_version=(1, 3))` hands out.
    from tbhelpers import read_capsule

    capsule = read_capsule(v.__dlpack__(max_version=(1, 3)))
    assert (capsule.ptr, capsule.shape, capsule.strides, capsule.flags) == (
        info.ptr,
        info.shape,
        info.strides,
        info.flags,
    )
    del capsule
    # The export holds the owner: the view going does not release the memory...
    del v
    gc.collect()
    assert released == []
    # ...the deleter does, once.
    delete_managed(managed)
    gc.collect()
    assert released == [1]


def test_each_export_holds_its_own_owner_clone(api):
    v, _, released = counted_view()
    first, second = export(api, v), export(api, v)
    assert first != second
    del v
    delete_managed(first)
    gc.collect()
    assert released == []
    delete_managed(second)
    gc.collect()
    assert released == [1]


def test_managed_export_of_a_read_only_view_is_flagged(api):
    v, _, released = counted_view(readonly=True)
    managed = export(api, v)
    assert managed_info(managed).flags & FLAG_READ_ONLY
    delete_managed(managed)
    del v
    gc.collect()
    assert released == [1]


def test_managed_export_refuses_what_dunder_dlpack_refuses(api):
    a = aligned_numpy((8,), np.float32, fill=0)
    v = tb.asview(a[::-1])
    with pytest.raises(BufferError, match="negative stride"):
        v.__dlpack__(max_version=(1, 3))
    out = ctypes.c_void_p(0x1234)
    with pytest.raises(BufferError, match="negative stride"):
        api.from_py(v, ctypes.byref(out))
    assert out.value is None  # NULL on failure


@pytest.mark.parametrize("obj", [np.zeros(3, np.float32), object(), None])
def test_objects_that_are_not_views_are_refused(api, obj):
    out = ctypes.c_void_p(0x1234)
    with pytest.raises(TypeError, match=f"object of type .*{type(obj).__name__}.*expected a tensorbridge.View"):
        api.from_py(obj, ctypes.byref(out))
    assert out.value is None
    t = DLTensor()
    with pytest.raises(TypeError, match="expected a tensorbridge.View"):
        api.dltensor_from_py(obj, ctypes.byref(t))


def test_borrowed_dltensor_points_into_the_view(api):
    v, a, released = counted_view(shape=(2, 3), strides=(6, 1), offset=3)
    t = DLTensor()
    assert api.dltensor_from_py(v, ctypes.byref(t)) == 0
    info = dltensor_info(t)
    managed = export(api, v)
    exported = managed_info(managed)
    delete_managed(managed)
    # As the managed export writes it.
    for field in ("data", "byte_offset", "device", "dtype", "shape", "strides"):
        assert getattr(info, field) == getattr(exported, field), field
    assert info.ptr == v.ptr == a.ctypes.data + 3 * 4
    assert info.shape == v.shape and info.strides == v.strides
    # Non-owning: it takes no owner clone, so the view alone keeps the memory.
    gc.collect()
    assert released == []
    del v, t
    gc.collect()
    assert released == [1]


def test_borrowed_dltensor_of_a_rank_0_view_has_strides(api):
    v, _, _ = counted_view(shape=())
    t = DLTensor()
    assert api.dltensor_from_py(v, ctypes.byref(t)) == 0
    assert t.ndim == 0 and t.data == v.ptr
    # DLPack 1.2+: strides are never NULL.
    assert bool(t.strides) and bool(t.shape)


def test_borrowed_dltensor_refuses_a_read_only_view(api):
    v, _, _ = counted_view(readonly=True)
    t = DLTensor()
    with pytest.raises(BufferError, match="read-only.*DLTensor has no flags"):
        api.dltensor_from_py(v, ctypes.byref(t))


def test_current_work_stream_is_the_legacy_default_stream(api):
    for device in [(1, 0), (2, 0), (2, 1), (3, 0), (13, 0)]:
        out = ctypes.c_void_p(0x1234)
        assert api.current_work_stream(*device, ctypes.byref(out)) == 0
        assert out.value is None  # NULL


def test_the_allocator_is_not_provided(api):
    seen = []
    set_error = SET_ERROR(lambda ctx, kind, msg: seen.append((ctx, kind, msg)))
    proto = DLTensor()
    out = ctypes.c_void_p(0x1234)
    assert api.allocator(ctypes.byref(proto), ctypes.byref(out), 0x99, set_error) == -1
    assert out.value is None
    # Exactly once, with the caller's context.
    ((ctx, kind, msg),) = seen
    assert ctx == 0x99
    assert kind == b"NotImplementedError"
    assert b"managed_tensor_allocator" in msg


def test_round_trip_through_our_own_table(api):
    v, a, released = counted_view(shape=(4, 2), strides=(2, 1), offset=8)
    w = api.to_py_object(export(api, v))
    assert type(w) is tb.View
    assert (w.ptr, w.shape, w.strides, w.dtype_name, w.device) == (v.ptr, v.shape, v.strides, "float32", "cpu")
    assert sys.getrefcount(w) == 2  # `w` and getrefcount's argument: no reference leaked
    del v
    gc.collect()
    assert released == []
    del w
    gc.collect()
    assert released == [1]


def test_a_read_only_managed_tensor_becomes_a_read_only_view(api):
    v, _, released = counted_view(readonly=True)
    w = api.to_py_object(export(api, v))
    assert w.readonly
    del v, w
    gc.collect()
    assert released == [1]


def test_to_py_object_of_a_torch_export(api):
    """A managed tensor from PyTorch's own table: the view shares its memory, and PyTorch's
    deleter runs once, when the view goes (counted through the release of the view PyTorch's
    tensor was made from)."""
    torch = pytest.importorskip("torch")
    if not hasattr(torch.Tensor, "__dlpack_c_exchange_api__"):
        pytest.skip("this torch publishes no DLPack C exchange API")
    v, a, released = counted_view(shape=(3, 4))
    x = torch.from_dlpack(v)
    del v
    torch_api = exchange_table(torch.Tensor)
    managed = export(torch_api, x)
    assert managed_info(managed).ptr == x.data_ptr()
    w = api.to_py_object(managed)
    assert type(w) is tb.View
    assert w.ptr == x.data_ptr() == a.ctypes.data
    assert w.shape == (3, 4) and w.strides == (4, 1)
    x[1, 2] = -7.0
    assert np.asarray(w)[1, 2] == -7.0
    del x
    gc.collect()
    assert released == []  # the view holds PyTorch's managed tensor
    del w
    gc.collect()
    assert released == [1]  # PyTorch's deleter ran, once


def _hand_made(version=(1, 3), flags=0):
    """A DLManagedTensorVersioned built by hand over a NumPy array, with a counted deleter."""
    a = aligned_numpy((4,), np.float32, fill=1)
    shape = (ctypes.c_int64 * 1)(4)
    strides = (ctypes.c_int64 * 1)(1)
    m = DLManagedTensorVersioned()
    m.version.major, m.version.minor = version
    m.flags = flags
    t = m.dl_tensor
    t.data = a.ctypes.data
    t.device.device_type, t.device.device_id = KDLCPU, 0
    t.ndim = 1
    t.dtype.code, t.dtype.bits, t.dtype.lanes = 2, 32, 1
    t.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
    t.strides = ctypes.cast(strides, ctypes.POINTER(ctypes.c_int64))
    deleted = []
    deleter = DELETER(lambda _p: deleted.append(1))
    m.deleter = deleter
    keep = (a, shape, strides, deleter, m)
    return ctypes.addressof(m), deleted, keep


@pytest.mark.parametrize(
    "version, flags, error, match",
    [
        ((2, 0), 0, BufferError, "major version"),
        ((1, 3), 1 << 40, BufferError, "flag"),
    ],
)
def test_to_py_object_refusals_run_the_deleter_once(api, version, flags, error, match):
    managed, deleted, keep = _hand_made(version, flags)
    out = ctypes.c_void_p(0x1234)
    with pytest.raises(error, match=match):
        api.to_py(managed, ctypes.byref(out))
    assert out.value is None
    assert deleted == [1]
    del keep


def test_to_py_object_accepts_a_hand_made_tensor_and_deletes_it_once(api):
    managed, deleted, keep = _hand_made()
    w = api.to_py_object(managed)
    assert w.ptr == keep[0].ctypes.data and w.shape == (4,)
    assert deleted == []
    del w
    gc.collect()
    assert deleted == [1]


def test_null_arguments_are_refused(api):
    out = ctypes.c_void_p(0)
    with pytest.raises(ValueError, match="null tensor"):
        api.to_py(None, ctypes.byref(out))
    v, _, _ = counted_view()
    with pytest.raises(ValueError, match="null out"):
        api.from_py(v, None)
    # A null out still takes the tensor's ownership: its deleter runs once.
    managed, deleted, keep = _hand_made()
    with pytest.raises(ValueError, match="null out_py_object"):
        api.to_py(managed, None)
    assert deleted == [1]


# ---------------------------------------------------------------------------------------------
# tvm-ffi, a consumer of the table (`tvm_ffi.from_dlpack` calls it before `__dlpack__`).


def test_tvm_ffi_takes_a_view_zero_copy():
    tvm_ffi = pytest.importorskip("tvm_ffi", reason="apache-tvm-ffi is not installed")
    torch = pytest.importorskip("torch")
    v, a, released = counted_view(shape=(3, 4))
    t = tvm_ffi.from_dlpack(v)
    assert t.data_ptr() == v.ptr == a.ctypes.data
    assert tuple(t.shape) == (3, 4)
    # A write through tvm-ffi's tensor is seen through the view.
    x = torch.from_dlpack(t)
    assert x.data_ptr() == v.ptr
    x[2, 3] = 99.0
    assert np.asarray(v)[2, 3] == 99.0
    del x
    del v
    gc.collect()
    assert released == []  # tvm-ffi's tensor holds the export
    del t
    gc.collect()
    assert released == [1]


def test_tvm_ffi_goes_through_the_table():
    """tvm-ffi's fallback is ``__dlpack__()`` without ``max_version``, which refuses a read-only
    view (a legacy capsule cannot say read-only): a read-only view that imports came through
    the table."""
    tvm_ffi = pytest.importorskip("tvm_ffi", reason="apache-tvm-ffi is not installed")
    v, _, released = counted_view(readonly=True)
    with pytest.raises(BufferError, match="legacy DLPack capsule"):
        v.__dlpack__()
    t = tvm_ffi.from_dlpack(v)
    assert t.data_ptr() == v.ptr
    del v, t
    gc.collect()
    assert released == [1]


def test_tvm_ffi_function_arguments_round_trip_through_the_table():
    """A View passed to a tvm-ffi function goes in through ``managed_tensor_from_py_object_no_sync``
    and a tensor returned comes back through ``managed_tensor_to_py_object_no_sync`` as a View
    of the same memory (tvm-ffi converts results with the argument's table)."""
    tvm_ffi = pytest.importorskip("tvm_ffi", reason="apache-tvm-ffi is not installed")
    echo = tvm_ffi.get_global_func("testing.echo")
    v, _, released = counted_view(shape=(2, 3))
    r = echo(v)
    assert type(r) is tb.View
    assert r is not v
    assert (r.ptr, r.shape, r.strides) == (v.ptr, v.shape, v.strides)
    del v
    gc.collect()
    assert released == []
    del r
    gc.collect()
    assert released == [1]
