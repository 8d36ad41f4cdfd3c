"""Recipe: a CuPy array over memory a C library allocated (zero-copy, lifetime handled).

The C side returns a device pointer (here cudaMalloc through ctypes, as any C library or
ctypes binding would) and tells you how to free it. `tb.from_ptr` turns it into a view that
frees it exactly once, after the last array over it is gone; CuPy takes the view through
DLPack (`cupy.from_dlpack`) or the CUDA Array Interface (`cupy.asarray`). Without
tensorbridge, `cupy.cuda.UnownedMemory` does not manage lifetime unless you pass an owner.

On a machine without a GPU the same recipe runs on host memory (libc malloc) and NumPy, which
is what CuPy would refuse ("CPU arrays cannot be directly imported").

    python cupy_over_c_memory.py [--device cpu|cuda]
"""

import argparse
import gc

import numpy as np

import tensorbridge as tb
from _cmem import cuda_available, cuda_malloc, host_malloc


def main(device=None):
    device = device or ("cuda" if cuda_available() else "cpu")
    shape = (256, 256)
    nbytes = shape[0] * shape[1] * 4
    if device == "cuda":
        import cupy as xp

        ptr, free = cuda_malloc(nbytes)
        where = "cuda:0"
    else:
        xp = np
        ptr, free = host_malloc(nbytes)
        where = "cpu"
    freed = []

    def release():
        freed.append(1)
        free()

    view = tb.from_ptr(ptr, shape, "float32", device=where, release=release)
    a = xp.from_dlpack(view)  # DLPack
    b = xp.asarray(view)  # CUDA Array Interface (CuPy) / array interface (NumPy)
    del view

    a[...] = xp.arange(shape[0] * shape[1], dtype=xp.float32).reshape(shape)
    ptr_of = (lambda x: x.data.ptr) if device == "cuda" else (lambda x: x.ctypes.data)
    assert ptr_of(a) == ptr_of(b) == ptr, "not zero-copy"
    assert float(b[1, 2]) == 258.0  # a write through one array is seen through the other
    total = float(a.sum())
    print(f"{xp.__name__} arrays over C-allocated {device} memory at {ptr:#x}: sum = {total}")

    del a
    gc.collect()
    assert freed == [], "freed while an array still uses it"
    del b
    gc.collect()
    assert freed == [1]
    print("freed once, after the last array")
    return {"ptr": ptr, "device": device, "sum": total}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cpu", "cuda"])
    main(ap.parse_args().device)
