"""Rust ndarray data to NumPy, PyTorch and JAX and back, through the example extension's
ndarray recipes (crates/tensorbridge-example/src/ndarray_recipes.rs): every hand-off shares
memory (pointers compared) and writes are seen both ways."""

import numpy as np
import pytest

ext = pytest.importorskip("tensorbridge_example")

GRID = np.array([[10.0 * i + j for j in range(4)] for i in range(3)])


def test_ndarray_to_numpy_and_back():
    v, ptr = ext.nd_grid(3, 4, False)
    a = np.asarray(v)
    assert a.ctypes.data == ptr  # the Rust array's memory
    assert (a == GRID).all()
    assert ext.nd_ptr(a) == ptr  # back into Rust: the same memory again
    a[1, 2] = -100.0  # NumPy writes, Rust reads
    assert ext.nd_sum(v) == GRID.sum() - GRID[1, 2] - 100.0
    ext.nd_scale(a, 2.0)  # Rust writes, NumPy reads
    assert a[2, 3] == 2 * GRID[2, 3] and a[1, 2] == -200.0


def test_negative_strides_reach_numpy_as_they_are():
    v, ptr = ext.nd_grid(3, 4, True)  # rows reversed in Rust: stride -4 elements
    a = np.asarray(v)
    assert a.strides == (-32, 8)
    assert a.ctypes.data == ptr
    assert (a == GRID[::-1]).all()
    assert ext.nd_ptr(a) == ptr
    assert ext.nd_sum(a[::2, 1::2]) == GRID[::-1][::2, 1::2].sum()


def test_numpy_strided_arrays_into_ndarray_views():
    base = np.arange(48.0).reshape(6, 8)
    x = base[::-2, 1::3]  # negative and stepped strides, not contiguous
    assert ext.nd_ptr(x) == x.ctypes.data
    assert ext.nd_sum(x) == x.sum()
    ext.nd_scale(x, 3.0)  # writes through the strided view land in `base`
    assert base[5, 1] == 3 * 41.0 and base[4, 1] == 33.0


def test_ndarray_to_torch_and_back():
    torch = pytest.importorskip("torch")
    v, ptr = ext.nd_grid(3, 4, False)
    t = torch.from_dlpack(v)
    assert t.data_ptr() == ptr
    assert t.shape == (3, 4) and t.dtype == torch.float64
    t[0, 0] = 7.0  # torch writes, Rust reads
    assert ext.nd_sum(v) == GRID.sum() + 7.0
    assert ext.nd_ptr(t) == ptr
    ext.nd_scale(t, 0.5)  # Rust writes, torch reads
    assert t[2, 3].item() == GRID[2, 3] / 2 and t[0, 0].item() == 3.5
    del v  # torch keeps the Rust array alive
    assert t.sum().item() == (GRID.sum() + 7.0) / 2


def test_ndarray_to_jax_and_back():
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")
    v, ptr = ext.nd_grid(3, 4, False)
    x = jnp.from_dlpack(v)
    assert x.unsafe_buffer_pointer() == ptr  # 64-byte aligned: JAX shares instead of copying
    assert (np.asarray(x) == GRID).all()
    assert ext.nd_ptr(x) == ptr
    np.asarray(v)[2, 0] = 1.5  # a write through the Rust memory is what JAX reads
    assert float(x[2, 0]) == 1.5
    assert jax.devices("cpu")


def test_refusals_are_python_exceptions():
    with pytest.raises(TypeError, match="expected float64, found float32"):
        ext.nd_sum(np.zeros(3, np.float32))
    ro = np.zeros(3)
    ro.flags.writeable = False
    with pytest.raises(BufferError, match="read-only"):
        ext.nd_scale(ro, 2.0)
    # A writable view whose four elements are one (np.broadcast_to would be read-only).
    alias = np.lib.stride_tricks.as_strided(np.zeros(1), (4,), (0,), writeable=True)
    with pytest.raises(ValueError, match="share an address"):
        ext.nd_scale(alias, 2.0)
