"""The ``tb.View`` surface on the host: attributes, repr, ``__array_interface__``, and the full
array-API ``__dlpack__`` signature (versions, read-only, ``copy``, ``dl_device``, ``stream``).

Capsules are inspected with ctypes (``tbhelpers.read_capsule``) without consuming them, so the
flags tensorbridge sets (READ_ONLY, IS_COPIED) are checked directly, not through a consumer
that may ignore them.
"""

import gc

import numpy as np
import pytest

from tbhelpers import (
    needs_numpy_dlpack_1,
    FLAG_IS_COPIED,
    FLAG_READ_ONLY,
    JAX_DLPACK_VERSIONED,
    aligned_numpy,
    capsule_name,
    capsule_struct,
    read_capsule,
    run_isolated,
)


@pytest.fixture
def arr():
    return aligned_numpy((2, 3), np.float32, fill=np.arange(6).reshape(2, 3))


def test_attributes(tb, arr):
    v = tb.asview(arr)
    assert isinstance(v, tb.View)
    assert isinstance(v.ptr, int) and v.ptr == arr.ctypes.data
    assert v.shape == (2, 3) and isinstance(v.shape, tuple)
    assert v.strides == (3, 1) and isinstance(v.strides, tuple)
    assert v.byte_strides == (12, 4)
    assert v.dtype == "float32" and v.dtype == np.float32 and isinstance(v.dtype, np.dtype)
    assert v.dtype_name == "float32" and isinstance(v.dtype_name, str)
    assert v.size == 6 and isinstance(v.size, int)
    assert v.device == "cpu"
    assert v.readonly is False
    assert (v.nbytes, v.ndim, v.itemsize) == (24, 2, 4)


def test_repr_names_what_matters(tb, arr):
    v = tb.asview(arr)
    r = repr(v)
    # <tensorbridge.View float32[2, 3] strides=(3, 1) cpu ptr=0x... readwrite>
    assert r.startswith("<tensorbridge.View ") and r.endswith(">"), r
    for part in ("float32", "[2, 3]", "strides=(3, 1)", "cpu", hex(arr.ctypes.data), "readwrite"):
        assert part in r, (part, r)
    arr.flags.writeable = False
    r = repr(tb.asview(arr))
    assert "readonly" in r and "readwrite" not in r, r


def test_array_interface_is_v3_and_exact(tb, arr):
    v = tb.asview(arr[:, ::2])
    ai = v.__array_interface__
    assert ai["version"] == 3
    assert ai["shape"] == (2, 2)
    assert np.dtype(ai["typestr"]) == np.float32
    assert ai["data"] == (arr.ctypes.data, False)
    assert ai["strides"] in ((12, 8),)
    assert ai.get("mask") is None
    y = np.asarray(v)
    assert y.ctypes.data == arr.ctypes.data
    y[1, 1] = 99
    assert arr[1, 2] == 99


@pytest.mark.parametrize("shape", [(0,), (3, 0), (0, 2, 5)])
def test_empty_view_at_null_reaches_numpy(tb, shape):
    """An empty tensor at the null address (PyTorch gives ``torch.empty(0)`` a null
    pointer): its array interface points at a non-null stand-in, since NumPy before 2.4
    reads ``data: (0, ...)`` as "no data" and raised ``TypeError`` for ``np.asarray``
    (seen on 1.26 and 2.0). The view itself still says where it is."""
    v = tb.from_ptr(0, shape, "float64", device="cpu")
    assert v.ptr == 0
    address, readonly = v.__array_interface__["data"]
    assert address != 0 and address % 64 == 0 and readonly is False
    a = np.asarray(v)
    assert a.shape == shape and a.dtype == np.float64 and a.size == 0


def test_host_view_has_no_cuda_array_interface(tb, arr):
    v = tb.asview(arr)
    with pytest.raises(AttributeError):
        v.__cuda_array_interface__
    assert not hasattr(v, "__cuda_array_interface__")


def test_dlpack_device(tb, arr):
    assert tuple(tb.asview(arr).__dlpack_device__()) == (1, 0)


# --- __dlpack__: versions ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "max_version, name, version",
    [
        (None, "dltensor", None),
        ((0, 8), "dltensor", None),
        ((1, 0), "dltensor_versioned", (1,)),
        ((1, 3), "dltensor_versioned", (1,)),
        ((1, 99), "dltensor_versioned", (1,)),
    ],
)
def test_dlpack_version_negotiation(tb, arr, max_version, name, version):
    v = tb.asview(arr)
    kw = {} if max_version is None else {"max_version": max_version}
    cap = v.__dlpack__(**kw)
    info = read_capsule(cap)
    assert info.name == name
    if version:
        # same major; the minor may be the producer's own (minors are ABI compatible)
        assert info.version[0] == 1 and info.version <= (1, 3)
    assert info.ptr == arr.ctypes.data
    assert info.device == (1, 0)
    assert info.dtype == (2, 32, 1)
    assert info.shape == (2, 3)
    # strides are always sent (DLPack >= 1.2 forbids NULL for ndim != 0; NULL crashed consumers)
    assert info.strides == (3, 1)
    assert info.flags == 0
    assert info.byte_offset == 0 or info.data + info.byte_offset == arr.ctypes.data


def test_dlpack_newer_consumer_gets_our_version(tb, arr):
    """A consumer that knows DLPack 2.x gets the producer's own 1.x (array API: "if
    max_version >= own, return own"); the consumer checks the name and version."""
    v = tb.asview(arr)
    cap = v.__dlpack__(max_version=(2, 0))
    info = read_capsule(cap)
    assert info.versioned and info.version[0] == 1


def test_unconsumed_capsules_are_released(tb, arr):
    """Capsules that nobody consumes are freed by their destructor (no leak, no crash): the
    view's refcount returns to where it was."""
    import sys

    v = tb.asview(arr)
    before = sys.getrefcount(v)
    caps = [v.__dlpack__(max_version=(1, 3)) for _ in range(100)] + [v.__dlpack__() for _ in range(100)]
    del caps
    gc.collect()
    assert sys.getrefcount(v) == before


# --- __dlpack__: read-only ---------------------------------------------------------------------


@needs_numpy_dlpack_1
def test_readonly_view_exports_flag_and_refuses_legacy(tb, arr):
    arr.flags.writeable = False
    v = tb.asview(arr)
    assert v.readonly is True
    info = read_capsule(v.__dlpack__(max_version=(1, 0)))
    assert info.flags & FLAG_READ_ONLY
    with pytest.raises(BufferError, match="(?i)read.?only"):
        v.__dlpack__()
    with pytest.raises(BufferError, match="(?i)read.?only"):
        v.__dlpack__(max_version=(0, 8))
    # NumPy honours the flag: its import is read-only
    y = np.from_dlpack(v)
    assert y.ctypes.data == arr.ctypes.data
    assert not y.flags.writeable
    with pytest.raises(ValueError):
        y[0, 0] = 1
    # the array interface says so too
    assert v.__array_interface__["data"][1] is True
    assert not np.asarray(v).flags.writeable


def test_readonly_into_legacy_only_consumers_is_refused(tb, arr):
    """TF, and JAX up to 0.11, ask for legacy capsules, which cannot carry READ_ONLY:
    BufferError, as NumPy itself does for a read-only array. JAX
    0.12 asks for a versioned capsule (``max_version=(1, 3)``), which carries the flag: it
    takes the read-only view, zero-copy (its arrays are immutable anyway)."""
    arr.flags.writeable = False
    v = tb.asview(arr)
    jax = pytest.importorskip("jax")
    if JAX_DLPACK_VERSIONED:
        assert jax.dlpack.from_dlpack(v).unsafe_buffer_pointer() == arr.ctypes.data
    else:
        with pytest.raises(BufferError, match="(?i)read.?only"):
            jax.dlpack.from_dlpack(v)
    tf = pytest.importorskip("tensorflow")
    with pytest.raises(BufferError, match="(?i)read.?only"):
        tf.experimental.dlpack.from_dlpack(v.__dlpack__())


def test_readonly_into_torch_is_not_enforced_by_torch(tb, arr):
    """torch 2.11 has no read-only tensors and ignores DLPack's READ_ONLY flag (no
    framework enforces it end to end today): the import succeeds and shares memory. This records the
    behaviour; tensorbridge sets the flag (checked above) and cannot do more."""
    torch = pytest.importorskip("torch")
    arr.flags.writeable = False
    t = torch.from_dlpack(tb.asview(arr))
    assert t.data_ptr() == arr.ctypes.data


# --- __dlpack__: copy and dl_device ------------------------------------------------------------


@needs_numpy_dlpack_1
def test_copy_true_is_a_real_copy_flagged_is_copied(tb, arr):
    v = tb.asview(arr)
    info = read_capsule(v.__dlpack__(max_version=(1, 3), copy=True))
    assert info.flags & FLAG_IS_COPIED
    assert info.ptr != arr.ctypes.data
    assert info.shape == (2, 3)
    y = np.from_dlpack(v, copy=True)
    assert y.ctypes.data != arr.ctypes.data
    np.testing.assert_array_equal(y, arr)
    y[0, 0] = 100
    assert arr[0, 0] == 0
    arr[0, 1] = 200
    assert y[0, 1] == 1


@needs_numpy_dlpack_1
def test_copy_true_of_strided_and_readonly_view(tb, arr):
    x = arr[:, ::-2]
    x.flags.writeable = False
    v = tb.asview(x)
    y = np.from_dlpack(v, copy=True)
    np.testing.assert_array_equal(y, x)
    assert y.ctypes.data not in range(arr.ctypes.data, arr.ctypes.data + arr.nbytes)


@needs_numpy_dlpack_1
def test_copy_false_and_none_share(tb, arr):
    v = tb.asview(arr)
    for copy in (False, None):
        info = read_capsule(v.__dlpack__(max_version=(1, 3), copy=copy))
        assert info.ptr == arr.ctypes.data and not info.flags & FLAG_IS_COPIED
    y = np.from_dlpack(v, copy=False)
    assert y.ctypes.data == arr.ctypes.data


@needs_numpy_dlpack_1
def test_dl_device_cpu_on_host_view_shares(tb, arr):
    v = tb.asview(arr)
    info = read_capsule(v.__dlpack__(max_version=(1, 3), dl_device=(1, 0)))
    assert info.ptr == arr.ctypes.data and info.device == (1, 0)
    y = np.from_dlpack(v, device="cpu")
    assert y.ctypes.data == arr.ctypes.data


def test_dl_device_cuda_from_host_view_is_refused_without_copy(tb, arr):
    v = tb.asview(arr)
    with pytest.raises(BufferError):
        v.__dlpack__(max_version=(1, 3), dl_device=(2, 0), copy=False)


def test_stream_on_host_view(tb, arr):
    """Host memory has no streams: ``None`` is the only stream a CPU consumer may pass
    (array API); ``-1`` ("no synchronisation") is harmless; anything else is a clean error."""
    v = tb.asview(arr)
    assert capsule_name(v.__dlpack__(stream=None)) == "dltensor"
    for bad in (0,):
        with pytest.raises((BufferError, ValueError)):
            v.__dlpack__(stream=bad)


def test_dlpack_keyword_only(tb, arr):
    v = tb.asview(arr)
    with pytest.raises(TypeError):
        v.__dlpack__(None)  # stream is keyword-only
    with pytest.raises(TypeError):
        v.__dlpack__(bogus=1)


def test_dlpack_bad_argument_types(tb, arr):
    v = tb.asview(arr)
    with pytest.raises((TypeError, ValueError)):
        v.__dlpack__(max_version="1.0")
    with pytest.raises((TypeError, ValueError)):
        v.__dlpack__(dl_device="cpu")


# --- copies that cannot be made -------------------------------------------------------------------


def test_impossible_copies_raise_memory_error():
    """A copy of a broadcast view far larger than the memory it spans (16 TiB from one
    element; 8 EiB from one uint16, past ``isize::MAX``) and a copy no allocator can serve
    (128 TiB, the whole user address space, spanned by a host pointer that is never read)
    raise MemoryError. Before the fix the first and the last aborted the process ("memory
    allocation failed", SIGABRT) and the second was a PanicException ("capacity
    overflow"). Run in a fresh interpreter, so an abort fails this test instead of killing
    pytest."""
    r = run_isolated(
        """
        import numpy as np, tensorbridge as tb
        views = [
            tb.asview(np.broadcast_to(np.float32(1), (1 << 21, 1 << 21))),
            tb.from_ptr(1 << 16, (1 << 60, 4), "uint16", strides=(0, 0), device="cpu"),
            tb.from_ptr(1 << 16, (1 << 47,), "uint8", device="cpu"),
        ]
        for v in views:
            for kw in ({"max_version": (1, 3), "copy": True}, {"copy": True}):
                try:
                    v.__dlpack__(**kw)
                    print("no error")
                except BaseException as e:
                    print(type(e).__name__, str(e).splitlines()[0])
        """
    )
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr[-2000:])
    lines = r.stdout.splitlines()
    assert len(lines) == 6, lines
    assert all(line.startswith("MemoryError") for line in lines), lines
    assert "spans only 4 bytes" in lines[0] and str(1 << 44) in lines[0], lines[0]
    assert "spans only 2 bytes" in lines[2] and str(1 << 63) in lines[2], lines[2]
    assert "cannot allocate" in lines[4] and str(1 << 47) in lines[4], lines[4]


@needs_numpy_dlpack_1
def test_broadcast_copies_within_the_limit_are_made(tb):
    """The refusal is for copies far larger than what the view spans AND over 1 GiB: a
    broadcast row copied to a 4 MiB compact array is made, element by element."""
    row = np.arange(1024, dtype=np.float32)
    v = tb.asview(np.broadcast_to(row, (1024, 1024)))
    info = read_capsule(v.__dlpack__(max_version=(1, 3), copy=True))
    assert info.flags & FLAG_IS_COPIED
    y = np.from_dlpack(v, copy=True)
    assert y.shape == (1024, 1024) and y.strides == (4096, 4)
    assert (y == row).all()


def test_own_export_edited_through_ctypes_is_validated_again(tb, arr):
    """Our own capsule, edited by a consumer before it comes back, is imported as it reads now
    when that stays inside what it lent (the fast path for our own exports used to compare
    only the shape pointer and hand back a tensor whose shape said 2**40 rows and whose size
    said 6 elements; reading it segfaulted), and refused when it reaches outside: tensorbridge
    made the export and knows its extent."""
    view = tb.asview(arr)
    cap = view.__dlpack__(max_version=(1, 3))
    capsule_struct(cap).dl_tensor.shape[0] = 1 << 40
    with pytest.raises(BufferError, match="edited to reach bytes"):
        tb.asview(cap)

    cap = view.__dlpack__(max_version=(1, 3))
    capsule_struct(cap).dl_tensor.shape[0] = 1
    one_row = tb.asview(cap)
    assert (one_row.shape, one_row.nbytes) == ((1, 3), 12)
    np.testing.assert_array_equal(np.asarray(one_row), [[0, 1, 2]])

    cap = view.__dlpack__(max_version=(1, 3))
    m = capsule_struct(cap)
    m.dl_tensor.strides[0] = 1
    m.dl_tensor.strides[1] = 2
    reordered = tb.asview(cap)
    assert reordered.strides == (1, 2)
    np.testing.assert_array_equal(np.asarray(reordered), [[0, 2, 4], [1, 3, 5]])

    # Unedited, it still comes back as it left (same pointer, shape and strides).
    back = tb.asview(view.__dlpack__(max_version=(1, 3)))
    assert (back.ptr, back.shape, back.strides, back.nbytes) == (view.ptr, (2, 3), (3, 1), 24)
