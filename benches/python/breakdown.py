#!/usr/bin/env python3
"""Where `tb.asview(torch CUDA tensor)` and the three-tensor call spend their time, next to
what the peers spend (docs/BENCHMARKS.md explains the misses of the per-call targets with it).

Each line is the median host time of one Python-visible piece, timed alternately in blocks
with the others (`compare.paired_ns`): the call into the extension and the View alone
(`tb.asview(view)`), the PyTorch questions the import must ask per tensor to keep PyTorch's
refusals (`requires_grad`, `is_neg()`; `is_conj()` only for complex tensors), and the peers'
whole imports, and what the storage check costs when asked through Python (the import asks
PyTorch's C shim instead where it is verified, `import/shim.rs`). Run on the GPU machine like
compare.py; without a GPU (or with --cpu) on a CPU tensor.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import tensorbridge as tb  # noqa: E402
from compare import paired_ns  # noqa: E402


def main():
    import torch

    device = "cuda" if torch.cuda.is_available() and "--cpu" not in sys.argv[1:] else "cpu"
    print(f"torch {torch.__version__}, {device} tensor")
    t = torch.arange(1 << 16, dtype=torch.float32, device=device)
    v = tb.asview(t)
    base = torch._C.TensorBase
    store = base.untyped_storage(t)
    pieces = {
        "tb.asview(torch tensor)": lambda: tb.asview(t),
        "tb.asview(tb view): the call and a View, no import": lambda: tb.asview(v),
        "t.requires_grad": lambda: t.requires_grad,
        "t.is_neg()": lambda: t.is_neg(),
        "t.is_conj() (complex tensors only)": lambda: t.is_conj(),
        "TensorBase.untyped_storage(t) (Python route only)": lambda: base.untyped_storage(t),
        "StorageBase.data_ptr(storage) (Python route only)":
            lambda: torch._C.StorageBase.data_ptr(store),
        "len(storage) (Python route only)": lambda: len(store),
        "len(()) (an empty C call)": lambda: len(()),
    }
    wrapper = getattr(getattr(torch.utils, "dlpack", None), "ReadOnlyTensorWrapper", None)
    if wrapper is not None:
        w = wrapper(t)
        pieces["tb.asview(ReadOnlyTensorWrapper(t))"] = lambda: tb.asview(w)
    try:
        import tvm_ffi
        pieces["tvm_ffi.from_dlpack(torch tensor)"] = lambda: tvm_ffi.from_dlpack(t)
    except ImportError:
        pass
    try:
        from cuda.core.utils import StridedMemoryView
        pieces["cuda.core StridedMemoryView(torch tensor)"] = (
            lambda: StridedMemoryView.from_any_interface(t, stream_ptr=-1))
    except ImportError:
        pass
    medians = paired_ns(list(pieces.values()), calls=20_000, warmup=2_000)
    print("| piece (median host time) | time |")
    print("|---|---:|")
    for label, ns in zip(pieces, medians):
        print(f"| {label} | {ns / 1e3:.3f} µs |")


if __name__ == "__main__":
    main()
