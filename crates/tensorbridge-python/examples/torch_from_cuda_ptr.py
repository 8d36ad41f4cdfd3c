"""Recipe: a PyTorch tensor from a raw CUDA pointer (zero-copy, freed exactly once).

Someone hands you an address: a C library's cudaMalloc, a handle from another process'
allocator, a field of a struct. `tb.from_ptr` describes it (shape, dtype, strides in
elements), asks the CUDA driver that the whole span lies in one live allocation on that
device (a made-up address is a ValueError, never a tensor), and keeps `owner` alive / calls
`release` exactly once when the last user is gone. `torch.from_dlpack` then takes it as is.

    python torch_from_cuda_ptr.py            # on the GPU when there is one
    python torch_from_cuda_ptr.py --device cpu
"""

import argparse
import gc

import torch

import tensorbridge as tb
from _cmem import cuda_available, cuda_malloc, host_malloc


def main(device=None):
    device = device or ("cuda" if cuda_available() else "cpu")
    n = 3 * 4
    # 1. Memory someone else allocated: a bare address and a way to free it.
    if device == "cuda":
        ptr, free = cuda_malloc(n * 4)
    else:
        ptr, free = host_malloc(n * 4)
    freed = []

    def release():
        freed.append(ptr)
        free()

    # 2. Describe it once; the view owns the `release` from here on.
    view = tb.from_ptr(ptr, (3, 4), "float32", device="cuda:0" if device == "cuda" else "cpu", release=release)
    # 3. Any DLPack consumer takes the view; this is the tensor over that memory.
    t = torch.from_dlpack(view)
    del view  # the tensor keeps the memory alive on its own

    t.copy_(torch.arange(n, dtype=torch.float32).reshape(3, 4))
    assert t.data_ptr() == ptr, "not zero-copy"
    assert t.device.type == device
    # the memory really is the tensor: read it back through a second, independent view
    again = torch.from_dlpack(tb.from_ptr(ptr, (n,), "float32", device=str(t.device)))
    assert again[5].item() == 5.0
    del again
    print(f"torch tensor over raw {device} pointer {ptr:#x}: {t.shape}, {t.dtype}, {t.device}")
    print(t.cpu().numpy())

    # 4. A made-up address is refused before any framework sees it (CUDA: checked by the driver).
    if device == "cuda":
        try:
            tb.from_ptr(0x1234567890123456, (4,), "float32", device="cuda:0")
        except ValueError as e:
            print("fabricated pointer refused:", e)
        else:
            raise AssertionError("a fabricated CUDA pointer was accepted")

    # 5. Freed exactly once, when the last user is gone.
    assert freed == []
    del t
    gc.collect()
    assert freed == [ptr], freed
    print("released once")
    return {"ptr": ptr, "device": device, "released": len(freed)}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cpu", "cuda"])
    main(ap.parse_args().device)
