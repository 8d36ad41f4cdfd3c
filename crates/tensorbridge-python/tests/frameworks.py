"""Host-side adapters for the frameworks under test: one object per framework that can make a
tensor it owns, import a DLPack producer zero-copy, report its data pointer independently of
tensorbridge, read its current values without caching, and (when the framework allows it)
write one element in place.

Pointers are read without tensorbridge: NumPy's ``ctypes.data``, torch's ``data_ptr()``, JAX's
``unsafe_buffer_pointer()``, and for TensorFlow (which has no pointer accessor) the data field of
its own DLPack capsule, read with ctypes (``tbhelpers.read_capsule``).
"""

from __future__ import annotations

import importlib

import numpy as np

from tbhelpers import aligned_numpy, read_capsule

# DLPack dtypes every framework here can hold, with the value patterns the tests write.
DTYPES = [
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "complex64",
    "complex128",
]

ITEMSIZE = {
    "bool": 1, "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "float16": 2, "bfloat16": 2,
    "int32": 4, "uint32": 4, "float32": 4, "int64": 8, "uint64": 8, "float64": 8,
    "complex64": 8, "complex128": 16,
}  # fmt: skip


def np_dtype(name: str):
    """The NumPy dtype for a tensorbridge dtype name (bfloat16 through ml_dtypes)."""
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def sample(name: str, shape=(3, 5)) -> np.ndarray:
    """Values that catch sign, width and real/imag mix-ups: extremes for integers (uint64's
    top value has the sign bit set), fractions for floats, distinct imaginary parts."""
    n = int(np.prod(shape))
    i = np.arange(n)
    if name == "bool":
        v = (i % 3) == 1
    elif name.startswith("int"):
        info = np.iinfo(name)
        v = (i - n // 2).astype(name)
        v[0], v[-1] = info.min, info.max
    elif name.startswith("uint"):
        info = np.iinfo(name)
        v = i.astype(name)
        v[-1] = info.max
    elif name.startswith("complex"):
        v = (i * 0.5 - 2).astype(name) + 1j * (n - i).astype(name)
    else:
        v = (i * 0.5 - 3.0).astype(np.float32).astype(np_dtype(name))
    return np.asarray(v, dtype=np_dtype(name)).reshape(shape)


def marker(name: str, index: int = 0):
    """A value that ``sample(name)`` does not hold at flat ``index`` (0 or 1), exactly
    representable in the dtype."""
    if name == "bool":
        return not bool(sample(name).flat[index])
    if name.startswith(("int", "uint")):
        return 42 + index
    if name.startswith("complex"):
        return complex(42.5 + index, -7.0)
    return 42.5 + index


def assert_same_values(actual: np.ndarray, expected: np.ndarray):
    actual = np.asarray(actual)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    if expected.dtype.name == "bfloat16" or actual.dtype != expected.dtype:
        # compare bit patterns of bfloat16 (ml_dtypes) and values of everything else
        assert actual.dtype.itemsize == expected.dtype.itemsize, (actual.dtype, expected.dtype)
        a = np.ascontiguousarray(actual).view(f"u{actual.dtype.itemsize}")
        e = np.ascontiguousarray(expected).view(f"u{expected.dtype.itemsize}")
        assert np.array_equal(a, e), (actual, expected)
    else:
        assert np.array_equal(actual, expected), (actual, expected)


class Framework:
    name = "?"
    module = "?"
    # writes through the framework's own API are possible (NumPy, torch); JAX and TF arrays
    # are immutable by design, so sharing is proven by a write from another framework.
    writable = False

    def available(self) -> bool:
        try:
            importlib.import_module(self.module)
        except ImportError:
            return False
        return True

    def make(self, values: np.ndarray):
        raise NotImplementedError

    def consume(self, producer):
        raise NotImplementedError

    def ptr(self, x) -> int:
        raise NotImplementedError

    def read(self, x) -> np.ndarray:
        raise NotImplementedError

    def write_flat(self, x, index, value):
        """Writes ``value`` at flat (C-order) position ``index`` through the framework's API."""
        raise TypeError(f"{self.name} arrays are immutable")

    def write0(self, x, value):
        self.write_flat(x, 0, value)

    def __repr__(self):
        return self.name


class NumPyFw(Framework):
    name = module = "numpy"
    writable = True

    def make(self, values):
        # 64-byte aligned so that JAX, as a later consumer, does not copy
        return aligned_numpy(values.shape, values.dtype, fill=values)

    def consume(self, producer):
        return np.from_dlpack(producer)

    def ptr(self, x):
        return x.ctypes.data

    def read(self, x):
        return np.array(x, copy=True)

    def write_flat(self, x, index, value):
        x[np.unravel_index(index, x.shape)] = value


class TorchFw(Framework):
    name = "torch"
    module = "torch"
    writable = True

    def make(self, values):
        import torch

        if values.dtype.name == "bfloat16":
            return torch.from_numpy(values.view(np.uint16).copy()).view(torch.bfloat16).clone()
        return torch.from_numpy(np.ascontiguousarray(values).copy()).clone()

    def consume(self, producer):
        import torch

        return torch.from_dlpack(producer)

    def ptr(self, x):
        return x.data_ptr()

    def read(self, x):
        import torch

        x = x.detach().cpu()
        if x.dtype == torch.bfloat16:
            return x.contiguous().view(torch.int16).numpy().view(np_dtype("bfloat16")).copy()
        return x.numpy().copy()

    def write_flat(self, x, index, value):
        x[tuple(int(i) for i in np.unravel_index(index, tuple(x.shape)))] = value


class JaxFw(Framework):
    name = "jax"
    module = "jax"

    def make(self, values):
        import jax

        # explicitly on the host: on a machine with a CUDA jaxlib the default device is a GPU
        return jax.device_put(values, jax.devices("cpu")[0])

    def consume(self, producer):
        import jax

        return jax.dlpack.from_dlpack(producer)

    def ptr(self, x):
        return x.unsafe_buffer_pointer()

    def read(self, x):
        import jax.numpy as jnp

        # a fresh device-side copy each time: np.asarray(x) would cache the first readback
        return np.asarray(jnp.copy(x))


class TensorFlowFw(Framework):
    name = "tensorflow"
    module = "tensorflow"

    def make(self, values):
        import tensorflow as tf

        return tf.constant(values)

    def consume(self, producer):
        import tensorflow as tf

        # TF 2.21 takes only a legacy capsule (no from_dlpack(obj), no tf.from_dlpack)
        capsule = producer if type(producer).__name__ == "PyCapsule" else producer.__dlpack__()
        return tf.experimental.dlpack.from_dlpack(capsule)

    def ptr(self, x):
        import tensorflow as tf

        return read_capsule(tf.experimental.dlpack.to_dlpack(x)).ptr

    def read(self, x):
        return np.array(x.numpy(), copy=True)


HOST_FRAMEWORKS = [NumPyFw(), TorchFw(), JaxFw(), TensorFlowFw()]
BY_NAME = {f.name: f for f in HOST_FRAMEWORKS}


def require(fw: Framework):
    """Skip (cleanly, naming the module) when a framework is genuinely absent."""
    import pytest

    pytest.importorskip(fw.module)
    return fw


def writer_for(*frameworks: Framework):
    """A framework that can write into memory shared by the given ones: the first writable one,
    else torch (which imports every dtype here and ignores DLPack's read-only flag), else
    NumPy."""
    for fw in frameworks:
        if fw.writable:
            return fw
    for fw in (BY_NAME["torch"], BY_NAME["numpy"]):
        if fw.available():
            return fw
    raise RuntimeError("no writable framework present")
