"""Recipe: handing a cudarc buffer to PyTorch (Python side of a Rust extension).

The Rust side (docs/COOKBOOK.md; built as crates/tensorbridge-example) moves a
`cudarc::driver::CudaSlice<f32>` into a tensorbridge `Tensor` (`tensorbridge_cudarc::import`: zero-copy, the slice's stream recorded as where
the data becomes ready) and returns `tensorbridge_pyo3::export(py, tensor)`, a `View`.
`torch.from_dlpack(view)` then makes torch's current stream wait for cudarc's stream on the
GPU, and cudarc frees the slice when torch lets go of the tensor.

This needs the compiled example extension (module `tensorbridge_example`, function
`ramp(n) -> View` filling 0..n on a cudarc stream; crate `tensorbridge-example`) and a GPU.
Without the extension the script exits with status 2, without a GPU with status 3.

    python cudarc_to_torch.py
"""

import gc
import importlib
import sys

from _cmem import cuda_available


def main(device="cuda"):
    ext = importlib.import_module("tensorbridge_example")
    import torch

    n = 1 << 20
    view = ext.ramp(n)  # a cudarc CudaSlice<f32>, moved into a tensorbridge View
    assert view.device == "cuda:0" and view.shape == (n,) and view.dtype == "float32"
    t = torch.from_dlpack(view)  # torch's current stream waits for cudarc's, on the GPU
    assert t.data_ptr() == view.ptr, "not zero-copy"
    del view
    s = t.double().sum().item()  # on torch's stream, after cudarc's fill; exact in float64
    assert s == n * (n - 1) / 2, s
    print(f"torch tensor over a cudarc buffer: {t.shape}, sum {s}")
    del t
    gc.collect()
    return {"sum": s}


if __name__ == "__main__":
    try:
        importlib.import_module("tensorbridge_example")
    except ImportError as e:
        print(f"needs the example extension (crate tensorbridge-example): {e}", file=sys.stderr)
        sys.exit(2)
    if not cuda_available():
        print("needs a CUDA GPU (cudarc allocates the buffer on device 0)", file=sys.stderr)
        sys.exit(3)
    main()
