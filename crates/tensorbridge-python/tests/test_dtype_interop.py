"""``View.dtype``, ``View.dtype_name`` and ``View.size`` as NumPy and JAX read them.

NumPy (``np.result_type``, ``np.dtype``) and JAX (``jnp.asarray``, ``jnp.array``) read
``x.dtype`` before anything else and refuse a string there. ``View.dtype`` is a
``numpy.dtype`` wherever NumPy (or ml_dtypes) has one, so those calls work on host views; the
core name stays available as ``View.dtype_name`` and as ``str(view.dtype)``, and a
``numpy.dtype`` compares equal to it.
"""

import subprocess
import sys

import numpy as np
import pytest

from tbhelpers import HandMadeCapsule, aligned_numpy

PLAIN = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
         "float16", "float32", "float64", "complex64", "complex128"]  # fmt: skip
ML_DTYPES = ["bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
             "float8_e4m3b11fnuz", "float8_e3m4", "float8_e4m3", "float8_e8m0fnu",
             "float6_e2m3fn", "float6_e3m2fn", "float4_e2m1fn"]  # fmt: skip


def _values(name):
    return aligned_numpy((2, 3), np.dtype(name), fill=np.arange(6).reshape(2, 3) % 2)


@pytest.mark.parametrize("name", PLAIN)
def test_dtype_is_numpys_and_equals_the_name(tb, name):
    a = _values(name)
    v = tb.asview(a)
    assert isinstance(v.dtype, np.dtype) and v.dtype == a.dtype
    assert v.dtype == name and str(v.dtype) == name == v.dtype_name
    assert isinstance(v.dtype_name, str)


@pytest.mark.parametrize("name", PLAIN)
def test_numpy_reads_the_view(tb, name):
    a = _values(name)
    v = tb.asview(a)
    assert np.result_type(v) == a.dtype
    assert np.result_type(v, np.int8) == np.result_type(a, np.int8)
    assert np.dtype(v) == a.dtype  # NumPy's `.dtype` attribute protocol
    b = np.asarray(v)
    assert b.dtype == a.dtype and b.ctypes.data == a.ctypes.data  # zero-copy
    np.testing.assert_array_equal(b, a)


@pytest.mark.parametrize("name", PLAIN)
def test_jax_asarray_reads_the_view(tb, name):
    jnp = pytest.importorskip("jax.numpy")
    a = _values(name)
    v = tb.asview(a)
    for j in (jnp.asarray(v), jnp.array(v)):
        assert j.dtype == a.dtype and j.shape == a.shape
        np.testing.assert_array_equal(np.asarray(j), a)


def test_jax_asarray_of_a_strided_view(tb):
    jnp = pytest.importorskip("jax.numpy")
    a = aligned_numpy((4, 6), np.float32, fill=np.arange(24).reshape(4, 6))
    v = tb.asview(a[::2, 1::2])
    np.testing.assert_array_equal(np.asarray(jnp.asarray(v)), a[::2, 1::2])
    assert np.result_type(v, np.float64) == np.float64


@pytest.mark.parametrize("name", ML_DTYPES)
def test_ml_dtypes_are_numpy_dtypes(tb, name):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    if not hasattr(ml_dtypes, name):
        pytest.skip(f"ml_dtypes {ml_dtypes.__version__} has no {name}")
    dt = np.dtype(getattr(ml_dtypes, name))
    a = np.zeros((3,), dt)
    v = tb.asview(a)
    assert isinstance(v.dtype, np.dtype) and v.dtype == dt
    assert v.dtype == name and str(v.dtype) == v.dtype_name == name
    assert np.result_type(v) == dt
    # The array interface cannot name these: bfloat16 goes as raw bytes ("<V2"), which
    # .view() names, zero-copy; fp8/fp6/fp4 have no array interface (DLPack only).
    if name == "bfloat16":
        b = np.asarray(v).view(v.dtype)
        assert b.dtype == dt and b.ctypes.data == a.ctypes.data
    else:
        assert not hasattr(v, "__array_interface__")


def test_names_without_a_numpy_dtype_stay_strings(tb):
    # a vector type (lanes > 1): NumPy has no equivalent
    buf = aligned_numpy((16,), np.float32)
    h = HandMadeCapsule(data=buf.ctypes.data, shape=(4,), strides=(1,), dtype=(2, 32, 4), keep=buf)
    v = tb.asview(h.make())
    assert v.dtype == "float32x4" == v.dtype_name and isinstance(v.dtype, str)
    # packed fp4 (DLPack's default): two elements a byte, which ml_dtypes cannot describe
    p = tb.from_ptr(buf.ctypes.data, (8,), "float4_e2m1fn", device="cpu", owner=buf)
    assert p.dtype == "float4_e2m1fn" == p.dtype_name and isinstance(p.dtype, str)
    # complex32 (chalf): no NumPy type
    c = tb.from_ptr(buf.ctypes.data, (4,), "complex32", device="cpu", owner=buf)
    assert c.dtype == "complex32" and isinstance(c.dtype, str)


def test_dtype_objects_are_cached(tb):
    a, b = tb.asview(_values("int16")), tb.asview(np.zeros(5, np.int16))
    assert a.dtype is b.dtype is a.dtype


@pytest.mark.parametrize(
    "shape", [(), (0,), (7,), (2, 3), (4, 0, 3), (2, 3, 4)], ids=lambda s: str(s)
)
def test_size_is_numel(tb, shape):
    a = aligned_numpy(shape, np.float32)
    v = tb.asview(a)
    assert v.size == a.size == int(np.prod(shape, dtype=np.int64))
    assert isinstance(v.size, int)


def test_size_of_a_strided_view_and_of_from_ptr(tb):
    a = aligned_numpy((6, 8), np.int32)
    assert tb.asview(a[::2, ::3]).size == 9
    v = tb.from_ptr(a.ctypes.data, (4, 2), "int32", strides=(1, 4), device="cpu", owner=a)
    assert v.size == 8


def test_asview_and_dtype_name_do_not_import_numpy():
    """Only ``view.dtype`` imports NumPy, once; ``asview`` and ``dtype_name`` never do."""
    code = (
        "import sys, tensorbridge as tb\n"
        "v = tb.asview(bytearray(8))\n"
        "assert v.dtype_name == 'uint8' and v.size == 8\n"
        "assert 'numpy' not in sys.modules, 'asview imported numpy'\n"
        "d = v.dtype\n"
        "assert 'numpy' in sys.modules and type(d).__module__.startswith('numpy'), type(d)\n"
        "assert d == 'uint8'\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
