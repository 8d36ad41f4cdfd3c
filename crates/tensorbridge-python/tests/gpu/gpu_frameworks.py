"""CUDA-side adapters for the GPU suite: PyTorch, CuPy, JAX, Numba and cuda.core, plus raw
device memory (cudaMalloc through ctypes, CuPy's runtime and cuda.core) and a reader that
copies device bytes to the host without tensorbridge.

Every adapter can make a device tensor it owns (``make``), import a producer the way that
framework's users do (``consume``), report its device pointer independently of tensorbridge
(``ptr``), read its current values to the host (``read``) and, where the framework allows,
write one element in place (``write_flat``).
"""

from __future__ import annotations

import ctypes
import glob
import importlib
import os
import sys

import numpy as np

from tbhelpers import JAX_DLPACK_VERSIONED

# ---------------------------------------------------------------------------------------------
# raw device memory


class CudaRT:
    """The CUDA runtime through ctypes: what "a C library allocated it" means in the tests."""

    def __init__(self):
        self.lib = None
        for cand in self._candidates():
            try:
                self.lib = ctypes.CDLL(cand)
                break
            except OSError:
                continue
        if self.lib is None:
            raise OSError("libcudart not found (tried the CUDA toolkit and the nvidia wheels)")
        L = self.lib
        L.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
        L.cudaFree.argtypes = [ctypes.c_void_p]
        L.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        L.cudaMemset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
        L.cudaDeviceSynchronize.argtypes = []
        L.cudaGetErrorString.restype = ctypes.c_char_p

    @staticmethod
    def _candidates():
        yield from ("libcudart.so", "libcudart.so.13", "libcudart.so.12")
        roots = ["/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib"]
        for p in sys.path:
            roots += glob.glob(os.path.join(p, "nvidia", "*", "lib"))
            roots += glob.glob(os.path.join(p, "nvidia", "cuda_runtime", "lib"))
        for r in roots:
            yield from sorted(glob.glob(os.path.join(r, "libcudart.so*")), reverse=True)

    def check(self, rc, what):
        if rc != 0:
            raise RuntimeError(f"{what} failed: {self.lib.cudaGetErrorString(rc).decode()}")

    def malloc(self, nbytes: int) -> int:
        p = ctypes.c_void_p()
        self.check(self.lib.cudaMalloc(ctypes.byref(p), nbytes), f"cudaMalloc({nbytes})")
        return p.value

    def free(self, ptr: int):
        self.check(self.lib.cudaFree(ptr), "cudaFree")

    def to_device(self, ptr: int, host: np.ndarray):
        host = np.ascontiguousarray(host)
        self.check(self.lib.cudaMemcpy(ptr, host.ctypes.data, host.nbytes, 1), "cudaMemcpy H2D")

    def device_count(self) -> int:
        n = ctypes.c_int(0)
        self.check(self.lib.cudaGetDeviceCount(ctypes.byref(n)), "cudaGetDeviceCount")
        return n.value

    def to_host(self, ptr: int, nbytes: int) -> np.ndarray:
        out = np.empty(nbytes, np.uint8)
        self.check(self.lib.cudaMemcpy(out.ctypes.data, ptr, nbytes, 2), "cudaMemcpy D2H")
        return out


_rt = None


def cudart() -> CudaRT:
    global _rt
    if _rt is None:
        _rt = CudaRT()
    return _rt


def device_bytes(ptr: int, nbytes: int) -> np.ndarray:
    """Copies ``nbytes`` at device address ``ptr`` to the host after the whole device is idle
    (cudaDeviceSynchronize, then cudaMemcpy), with no framework and no tensorbridge involved."""
    rt = cudart()
    rt.check(rt.lib.cudaDeviceSynchronize(), "cudaDeviceSynchronize")
    return rt.to_host(ptr, nbytes)


def device_values(ptr: int, shape, dtype) -> np.ndarray:
    dt = np.dtype(dtype)
    n = int(np.prod(shape)) * dt.itemsize
    return device_bytes(ptr, n).view(dt).reshape(shape)


def np_dtype(name):
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


# ---------------------------------------------------------------------------------------------
# frameworks


class GpuFramework:
    name = "?"
    module = "?"
    writable = False
    # Whether its consumer takes a read-only view (a JAX array's, a tensor that requires
    # grad): it must ask for a versioned capsule (``max_version``), CAI or cuda.core's view,
    # which say read-only; a legacy capsule cannot, and tensorbridge refuses one for a
    # read-only view (as NumPy refuses its read-only arrays), unless the producer hands its
    # read-only arrays out in legacy capsules itself (``flagless``).
    takes_read_only = True
    # Its arrays are read-only and it hands them out in legacy capsules itself (JAX): views
    # of them go to legacy consumers as the producer's own capsules would (ARCHITECTURE.md,
    # "The read-only rule").
    flagless = False

    def available(self):
        try:
            importlib.import_module(self.module)
        except ImportError:
            return False
        return True

    def require(self):
        import pytest

        pytest.importorskip(self.module)
        return self

    def make(self, values: np.ndarray):
        raise NotImplementedError

    def consume(self, view):
        raise NotImplementedError

    def ptr(self, x) -> int:
        raise NotImplementedError

    def read(self, x) -> np.ndarray:
        raise NotImplementedError

    def write_flat(self, x, index, value):
        """Writes ``value`` at flat (C-order) position ``index`` of a contiguous ``x``."""
        raise TypeError(f"{self.name} arrays are not written in place here")

    def write0(self, x, value):
        self.write_flat(x, 0, value)

    def __repr__(self):
        return self.name


class TorchGpu(GpuFramework):
    name = "torch"
    module = "torch"
    writable = True

    def make(self, values):
        import torch

        if values.dtype.name == "bfloat16":
            h = torch.from_numpy(values.view(np.uint16).copy()).view(torch.bfloat16)
        else:
            h = torch.from_numpy(np.ascontiguousarray(values).copy())
        return h.to("cuda")

    def consume(self, view):
        import torch

        return torch.from_dlpack(view)

    def ptr(self, x):
        return x.data_ptr()

    def read(self, x):
        import torch

        x = x.detach().cpu()
        if x.dtype == torch.bfloat16:
            return x.contiguous().view(torch.int16).numpy().view(np_dtype("bfloat16"))
        return x.numpy().copy()

    def write_flat(self, x, index, value):
        x.view(-1)[index] = value


class CupyGpu(GpuFramework):
    name = "cupy"
    module = "cupy"
    writable = True

    def make(self, values):
        import cupy

        return cupy.asarray(values)

    def consume(self, view):
        import cupy

        return cupy.from_dlpack(view)

    def ptr(self, x):
        return x.data.ptr

    def read(self, x):
        import cupy

        return cupy.asnumpy(x)

    def write_flat(self, x, index, value):
        x.reshape(-1)[index] = value  # a view: the tests' arrays are contiguous


class CupyCaiGpu(CupyGpu):
    """CuPy taking the view through the CUDA Array Interface (``cupy.asarray``)."""

    name = "cupy(cai)"

    def make(self, values):
        raise TypeError("consumer only")

    def consume(self, view):
        import cupy

        return cupy.asarray(view)


class JaxGpu(GpuFramework):
    name = "jax"
    module = "jax"
    # jax.dlpack.from_dlpack calls ``__dlpack__(stream=...)`` without max_version before 0.12
    # (the GPU machine's 0.11.2), with ``max_version=(1, 3)`` from 0.12 (tbhelpers).
    takes_read_only = JAX_DLPACK_VERSIONED
    flagless = True

    @staticmethod
    def device():
        import jax

        return jax.devices("gpu")[0]

    def make(self, values):
        import jax

        return jax.device_put(values, self.device())

    def consume(self, view):
        import jax

        return jax.dlpack.from_dlpack(view)

    def ptr(self, x):
        return x.unsafe_buffer_pointer()

    def read(self, x):
        import jax.numpy as jnp

        return np.asarray(jnp.copy(x))


class NumbaGpu(GpuFramework):
    name = "numba"
    module = "numba.cuda"
    writable = True

    def make(self, values):
        from numba import cuda

        return cuda.to_device(np.ascontiguousarray(values))

    def consume(self, view):
        from numba import cuda

        return cuda.as_cuda_array(view)

    def ptr(self, x):
        return x.__cuda_array_interface__["data"][0]

    def read(self, x):
        return x.copy_to_host()

    def write_flat(self, x, index, value):
        # Not `x[i] = value`: numba-cuda 0.30's DeviceNDArray.__setitem__ compiles a kernel
        # that calls np.row_stack, which NumPy 2.5 removed. A one-element view and a copy
        # (a plain memcpy) write the same element.
        one = x.ravel()[index : index + 1]  # views of contiguous data
        one.copy_to_device(np.full(1, value, dtype=x.dtype))


def cuda_core():
    """(Device, StridedMemoryView) from cuda.core 1.x, or its older experimental namespace."""
    try:
        from cuda.core import Device
    except ImportError:
        from cuda.core.experimental import Device
    try:
        from cuda.core.utils import StridedMemoryView
    except ImportError:
        from cuda.core.experimental.utils import StridedMemoryView
    return Device, StridedMemoryView


def cuda_core_allocate(nbytes):
    """``Device(0).allocate(nbytes)``, stream-ordered on the device's default stream (cuda.core
    1.2 requires the ``stream`` keyword), then synchronised so the memory can be filled."""
    Device, _ = cuda_core()
    dev = Device(0)
    dev.set_current()
    try:
        buf = dev.allocate(nbytes, stream=dev.default_stream)
    except TypeError:  # older cuda.core: no stream keyword
        buf = dev.allocate(nbytes)
    dev.sync()
    return buf


class CudaCoreGpu(GpuFramework):
    """cuda.core: a ``Buffer`` from ``Device.allocate`` as producer (its DLPack export is a
    1-D byte array), a ``StridedMemoryView`` as consumer."""

    name = "cuda.core"
    module = "cuda.core"

    def make(self, values):
        values = np.ascontiguousarray(values)
        buf = cuda_core_allocate(values.nbytes)
        cudart().to_device(int(buf.handle), values)
        return buf

    _stream = None

    @classmethod
    def consumer_stream(cls) -> int:
        """A stream of cuda.core's own, as consumers pass theirs (never 0: it is ambiguous)."""
        if cls._stream is None:
            Device, _ = cuda_core()
            dev = Device(0)
            dev.set_current()
            cls._stream = dev.create_stream()
        return int(cls._stream.handle)

    def consume(self, view):
        _, SMV = cuda_core()
        stream = self.consumer_stream()
        if hasattr(SMV, "from_dlpack"):
            return SMV.from_dlpack(view, stream_ptr=stream)
        return SMV(view, stream_ptr=stream)

    def ptr(self, x):
        return int(x.handle) if hasattr(x, "handle") else int(x.ptr)

    def read(self, x):
        if hasattr(x, "handle"):  # a Buffer: its bytes
            return device_bytes(int(x.handle), x.size)
        return device_values(int(x.ptr), x.shape, x.dtype)


PRODUCERS = [TorchGpu(), CupyGpu(), JaxGpu(), NumbaGpu(), CudaCoreGpu()]
CONSUMERS = [TorchGpu(), CupyGpu(), CupyCaiGpu(), JaxGpu(), NumbaGpu(), CudaCoreGpu()]
BY_NAME = {f.name: f for f in PRODUCERS + CONSUMERS}


def writer(*fws):
    """The first of ``fws`` that can write in place, else torch, else CuPy."""
    for f in fws:
        if f.writable:
            return f
    for name in ("torch", "cupy"):
        if BY_NAME[name].available():
            return BY_NAME[name]
    raise RuntimeError("no writable GPU framework present")


SPIN_FILL = r"""
extern "C" __global__ void spin_fill(float* out, long long n, long long cycles, float value) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) { }
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = value;
}
"""


def cupy_spin_kernel(cupy, busy_ms):
    """``(kernel, cycles)``: CuPy's build of ``SPIN_FILL`` (compiled and warmed up here) and
    the clock cycles one thread spins for about ``busy_ms`` on this GPU (measured with CUDA
    events over 20 000 000 cycles, the fastest of three: a measurement that waited behind
    other work would make the spin too short to prove anything)."""
    k = cupy.RawKernel(SPIN_FILL, "spin_fill")
    out = cupy.zeros(1, cupy.float32)
    k((1,), (1,), (out, np.int64(1), np.int64(1000), np.float32(0)))  # compile + warm-up
    cupy.cuda.Device().synchronize()
    ms = []
    for _ in range(3):
        s, e = cupy.cuda.Event(), cupy.cuda.Event()
        s.record()
        k((1,), (1,), (out, np.int64(1), np.int64(20_000_000), np.float32(0)))
        e.record()
        e.synchronize()
        ms.append(cupy.cuda.get_elapsed_time(s, e))
    return k, int(20_000_000 / min(ms) * busy_ms)


def refused_read_only(consumer, view, producer):
    """When ``consumer`` cannot take the read-only ``view`` of ``producer``'s array (see
    ``takes_read_only`` and ``flagless``), asserts tensorbridge's refusal (``BufferError``
    naming the reason and the way out) and returns True; otherwise returns False and the
    caller consumes the view."""
    import pytest

    if not view.readonly or consumer.takes_read_only or producer.flagless:
        return False
    with pytest.raises(BufferError, match=r"read-only but a legacy DLPack capsule .*max_version"):
        consumer.consume(view)
    return True

