"""Memory "a C library allocated", for the cookbook recipes: libc ``malloc``/``free`` on the
host and ``cudaMalloc``/``cudaFree`` from the CUDA runtime on the GPU, both through ctypes,
exactly as a C extension or a ctypes binding would hand them to Python (a bare address).
"""

import ctypes
import glob
import os
import sys


def libc():
    lib = ctypes.CDLL(None)
    lib.malloc.restype = ctypes.c_void_p
    lib.malloc.argtypes = [ctypes.c_size_t]
    lib.free.restype = None
    lib.free.argtypes = [ctypes.c_void_p]
    return lib


def cudart():
    """The CUDA runtime library (the toolkit's, or the one the nvidia wheels ship)."""
    names = ["libcudart.so", "libcudart.so.13", "libcudart.so.12"]
    for root in ["/usr/local/cuda/lib64", *sys.path]:
        names += sorted(glob.glob(os.path.join(root, "nvidia", "*", "lib", "libcudart.so*")), reverse=True)
        names += sorted(glob.glob(os.path.join(root, "libcudart.so*")), reverse=True)
    for name in names:
        try:
            lib = ctypes.CDLL(name)
        except OSError:
            continue
        lib.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
        lib.cudaFree.argtypes = [ctypes.c_void_p]
        lib.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        return lib
    raise OSError("libcudart not found")


def cuda_malloc(nbytes):
    rt = cudart()
    p = ctypes.c_void_p()
    rc = rt.cudaMalloc(ctypes.byref(p), nbytes)
    if rc != 0:
        raise MemoryError(f"cudaMalloc({nbytes}) failed with error {rc}")
    return p.value, (lambda: rt.cudaFree(p.value))


def host_malloc(nbytes):
    c = libc()
    p = c.malloc(nbytes)
    if not p:
        raise MemoryError(f"malloc({nbytes}) failed")
    return p, (lambda: c.free(p))


def cuda_available():
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        pass
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        n = ctypes.c_int(0)
        return lib.cuInit(0) == 0 and lib.cuDeviceGetCount(ctypes.byref(n)) == 0 and n.value > 0
    except OSError:
        return False
