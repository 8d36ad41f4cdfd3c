"""The PyTorch import's two ways of obtaining the storage (PyTorch's C shim, and Python with
``TENSORBRIDGE_TORCH_SHIM=0``) on CUDA tensors: the same fields as PyTorch's own export,
the memory kept after the tensor is rebound, the shim's pin holding no Python storage object
(``tests/test_torch_routes.py`` does the same on the CPU)."""

import sys

import pytest

from test_torch_routes import FIELDS, child, result


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the shim is read on Linux")
def test_shim_and_python_routes_agree_on_cuda_tensors():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no GPU")
    shim = result(child(FIELDS, {"TB_ROUTES_DEVICE": "cuda"}))
    python = result(child(FIELDS, {"TB_ROUTES_DEVICE": "cuda", "TENSORBRIDGE_TORCH_SHIM": "0"}))
    assert shim["fields"] == python["fields"]
    assert python["held"] == 3
    assert shim["held"] == 0, "the shim was not used on CUDA tensors"
