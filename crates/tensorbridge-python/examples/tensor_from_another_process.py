"""Cookbook: a tensor from another process.

A PyTorch tensor on the GPU is shared with a second process, which takes it with CuPy (or
PyTorch, where CuPy is absent) without a copy: ``tb.share(x)`` gives a small picklable
handle, ``tb.open(handle)`` in the other process a View over the same memory. The script
checks its claims: the consumer reads the producer's values, a write by the consumer is seen
by the producer, the producer's pending work is waited for on the GPU, and the memory is
released once, after the consumer lets go (counted with ``from_ptr``'s ``release``).

    python tensor_from_another_process.py

Without a GPU it says so and exits 3.
"""

import multiprocessing as mp
import os
import sys
import time

import numpy as np

import tensorbridge as tb

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _cmem import cuda_available  # noqa: E402


def consumer(handles, answers):
    """The other process: open, read, write, let go."""
    view = tb.open(handles.get(timeout=120))
    try:
        import cupy as xp  # noqa: F401

        x = xp.asarray(view)  # the CUDA Array Interface, zero-copy
        framework, ptr, total = "cupy", x.data.ptr, float(x.sum())
        x[0] = -1
        xp.cuda.Device().synchronize()
    except ImportError:
        import torch

        x = torch.from_dlpack(view)  # DLPack, zero-copy
        framework, ptr, total = "torch", x.data_ptr(), float(x.sum())
        x[0] = -1
        torch.cuda.synchronize()
    answers.put((framework, ptr == view.ptr, total))
    del x, view  # the share is released once the device work on it has run


def main(device="cuda", n=1 << 20):
    if device != "cuda" or not cuda_available():
        print("two-process hand-off: skipped (no CUDA GPU here)")
        return {"skipped": "no CUDA GPU"}
    import torch

    released = []
    x = torch.arange(n, dtype=torch.float32, device="cuda")
    # Count the release: a view whose owner is the tensor and whose release is counted.
    counted = tb.from_ptr(x.data_ptr(), (n,), "float32", device="cuda:0", owner=x,
                          release=lambda: released.append(time.time()))  # fmt: skip
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)  # the producer is still busy when it shares
        y = torch.from_dlpack(counted)
        y.mul_(2)
        h = tb.share(y)  # torch's current stream: the consumer waits for it on the GPU
    ctx = mp.get_context("spawn")
    handles, answers = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=consumer, args=(handles, answers))
    p.start()
    t0 = time.perf_counter()
    handles.put(h)  # pickled: a few hundred bytes
    del h, y, counted  # the producer lets go; the consumer's ticket keeps the memory
    framework, zero_copy, total = answers.get(timeout=300)
    p.join(60)
    seen = float(x[0].item())
    del x
    deadline = time.time() + 10
    while not released and time.time() < deadline:
        time.sleep(0.01)
    expected = float(np.arange(n, dtype=np.float64).sum() * 2)
    result = {
        "consumer": framework,
        "zero_copy": zero_copy,
        "sum_ok": total == expected,
        "write_seen": seen == -1.0,
        "released": len(released),
        "seconds": time.perf_counter() - t0,
    }
    print(f"two-process hand-off: torch (process {os.getpid()}) -> {framework} (process {p.pid}): "
          f"zero-copy {zero_copy}, values {'right' if result['sum_ok'] else 'WRONG'}, "
          f"consumer write seen {result['write_seen']}, released {len(released)}x")  # fmt: skip
    assert zero_copy and result["sum_ok"] and result["write_seen"], result
    assert len(released) == 1, f"released {len(released)} times"
    return result


if __name__ == "__main__":
    r = main()
    sys.exit(3 if "skipped" in r else 0)
