"""Recipe: your own CUDA kernel on PyTorch tensors (Python side of a Rust extension).

The Rust side (docs/COOKBOOK.md, "Your own CUDA kernel on PyTorch tensors"; crate
`tensorbridge-example`, function `axpy`) is a `#[pyfunction]` that calls
`tensorbridge_pyo3::kernel_call(&[x, y], |call| ...)`: both tensors imported zero-copy, torch's
current stream borrowed as a cudarc stream, `y` checked not to overlap `x` or itself, the
kernel compiled with NVRTC once and launched on that stream. So it behaves like a torch op:
ordered after the work before it on torch's current stream, before the work after it, with
the host free, inside `torch.cuda.graph` too.

Needs the compiled example extension and a GPU (exit 2 without the extension, 3 without a
GPU).

    python torch_own_kernel.py
"""

import importlib
import sys
import time

from _cmem import cuda_available


def main(device="cuda"):
    ext = importlib.import_module("tensorbridge_example")
    import torch

    n = 1 << 20
    x = torch.full((n,), 3.0, device=device)
    y = torch.ones(n, device=device)
    # The first call compiles the kernel with NVRTC (once per process and device, ~0.1 s):
    # done here, so the call below shows the host cost of a call, not of the compiler.
    ext.axpy(0.0, torch.zeros(1, device=device), torch.zeros(1, device=device))
    # torch's first `mul_` is warmed up too: CUDA loads a kernel's module at its first launch, and
    # that waits for the device, so the first one would wait for the busy stream below.
    x.mul_(1.0)
    # About 50 ms of GPU work, whatever the clock: torch's spin kernel timed once.
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1000)  # its first launch loads the kernel: not part of the timing
    e0.record()
    torch.cuda._sleep(20_000_000)
    e1.record()
    e1.synchronize()
    cycles = int(20_000_000 / e0.elapsed_time(e1) * 50)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(cycles)  # the stream is busy a while...
        x.mul_(2.0)  # ...then writes x = 6
        t0 = time.perf_counter()
        ext.axpy(0.5, x, y)  # y += 0.5 * x on s, after x.mul_
        host_us = (time.perf_counter() - t0) * 1e6
        busy = not s.query()
        z = y * 1  # on s, after the kernel
    s.synchronize()
    assert bool(torch.all(z == 4.0)), z[:4]

    # Strided and transposed arguments need nothing special.
    a = torch.arange(6.0, device=device).reshape(2, 3)
    b = torch.zeros(3, 2, device=device).t()
    ext.axpy(1.0, a, b)
    assert torch.equal(a, b)

    # An output that overlaps an input is refused before anything runs.
    try:
        ext.axpy(1.0, y, y)
        raise AssertionError("aliasing was accepted")
    except ValueError as e:
        refused = str(e)
    print(f"axpy on torch's stream: host {host_us:.0f} us, stream still busy: {busy}")
    print(f"refused: {refused}")
    return {"host_us": host_us, "busy": busy, "refused": refused}


if __name__ == "__main__":
    try:
        importlib.import_module("tensorbridge_example")
    except ImportError as e:
        print(f"needs the example extension (crate tensorbridge-example): {e}", file=sys.stderr)
        sys.exit(2)
    if not cuda_available():
        print("needs a CUDA GPU", file=sys.stderr)
        sys.exit(3)
    main()
