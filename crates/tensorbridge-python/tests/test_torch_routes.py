"""How the PyTorch import obtains its answers, checked against the answers themselves:

- the storage pin and check through PyTorch's C shim (``import/shim.rs``) against the Python
  route (``TENSORBRIDGE_TORCH_SHIM=0``): the same fields, both equal to PyTorch's own owning
  export's, and the shim's pin holds no Python storage object;
- PyTorch's const exchange table (``ReadOnlyTensorWrapper``, torch 2.14 and later) taken on
  the table's path, read-only, without a call to the wrapper's ``__dlpack__``; and, where the
  table cannot be recognised (``torch._C._const_dlpack_exchange_api`` removed, as in torch
  2.13 and earlier), the wrapper's own ``__dlpack__`` still gives a read-only view;
- the recognition is by the table's address: a stand-in ``_const_dlpack_exchange_api`` naming
  the ordinary table makes plain tensors read-only (any torch with an exchange table).

Each route is chosen once per process, so each case runs in a fresh interpreter.
"""

import json
import os
import sys

import pytest

from adversary import run_code

torch = pytest.importorskip("torch")
if not hasattr(torch.Tensor, "__dlpack_c_exchange_api__"):
    pytest.skip("this torch publishes no exchange table", allow_module_level=True)

HERE = os.path.dirname(os.path.abspath(__file__))

needs_readonly_export = pytest.mark.skipif(
    not hasattr(torch._C, "_const_dlpack_exchange_api"),
    reason=f"torch {torch.__version__} has no read-only export (2.14 and later)",
)


def child(body: str, env: dict | None = None) -> str:
    """``body`` in a fresh interpreter with ``env`` added to its environment."""
    saved = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    try:
        return run_code(f"import sys\nsys.path.insert(0, {HERE!r})\n{body}", body[:60])
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


FIELDS = """
import json, os, sys, torch
import tensorbridge as tb

dev = os.environ.get("TB_ROUTES_DEVICE", "cpu")

def fields(v, t):
    return [v.ptr - t.data_ptr() if t.numel() else 0, list(v.shape), list(v.strides),
            v.dtype_name, v.device, v.readonly]

base = torch.arange(48, dtype=torch.float32, device=dev).reshape(4, 3, 4)
cases = [base, base[1:, :, ::2], base.transpose(0, 2),
         torch.arange(6, dtype=torch.bfloat16, device=dev),
         torch.ones(6, dtype=torch.complex64, device=dev), torch.tensor(3.0, device=dev),
         torch.zeros(0, 3, device=dev), torch.arange(8, dtype=torch.int64, device=dev)[1:],
         torch.ones(2, dtype=torch.bool, device=dev),
         torch.arange(4.0, device=dev).as_subclass(type("Sub", (torch.Tensor,), {}))]
out = []
for t in cases:
    v = tb.asview(t)
    want = fields(tb.asview(t.__dlpack__(max_version=(1, 3))), t)
    assert fields(v, t) == want, (t, fields(v, t), want)
    out.append(fields(v, t))
# The pin: a Python storage object (its count goes up by one per view) or the shim's alias.
t = torch.arange(16.0, device=dev)
s = t.untyped_storage()
before = sys.getrefcount(s)
views = [tb.asview(t) for _ in range(3)]
held = sys.getrefcount(s) - before
# Rebinding the tensor lets go of its storage, which the views still pin: values kept.
t.set_(torch.zeros(2, device=dev))
del s
junk = [torch.full((16,), 7.0, device=dev) for _ in range(8)]
got = [torch.from_dlpack(v).cpu().tolist() for v in views]
assert got == [list(map(float, range(16)))] * 3, got
print("RESULT", json.dumps({"fields": out, "held": held}))
"""


def result(out: str) -> dict:
    line = next(l for l in out.splitlines() if l.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the shim is read on Linux")
def test_shim_and_python_routes_agree_field_by_field():
    """[same] for the two ways of obtaining the storage: each equals PyTorch's owning export
    field by field and keeps the memory after the tensor is rebound; the shim's pin holds no
    Python storage object (so the shim was used), the Python route's holds one per view."""
    shim = result(child(FIELDS))
    python = result(child(FIELDS, {"TENSORBRIDGE_TORCH_SHIM": "0"}))
    assert shim["fields"] == python["fields"]
    assert python["held"] == 3
    assert shim["held"] == 0, "the shim was not used (its verification failed on this torch?)"


def test_a_mode_still_sees_the_storage_question():
    """Under a ``TorchFunctionMode`` the import asks through Python, where the mode answers
    (and a lie is refused): the shim never answers around a mode."""
    out = child("""
import torch
from torch.overrides import TorchFunctionMode
import tensorbridge as tb
asked = []
class Mode(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        asked.append(getattr(func, "__name__", ""))
        return func(*args, **(kwargs or {}))
t = torch.arange(4.0)
tb.asview(t)  # the shim verified and in use from here on
with Mode():
    v = tb.asview(t)
assert "untyped_storage" in asked, asked
assert v.ptr == t.data_ptr()
print("OK")
""")
    assert "OK" in out


@needs_readonly_export
def test_readonly_wrapper_takes_the_const_table_read_only():
    """A ``ReadOnlyTensorWrapper`` is read through the const table: its ``__dlpack__`` (made
    to raise here) is never called; the view is read-only, on the tensor's memory, equal field
    by field to the wrapper's own read-only export, and refuses writes."""
    out = child("""
import numpy as np, torch
from torch.utils.dlpack import ReadOnlyTensorWrapper
import tensorbridge as tb
from tbhelpers import np_take
own = ReadOnlyTensorWrapper.__dlpack__
t = torch.arange(12.0).reshape(3, 4)[:, 1:]
w = ReadOnlyTensorWrapper(t)
general = tb.asview(own(w, max_version=(1, 3)))
def refuse(self, *args, **kwargs):
    raise AssertionError("the wrapper's __dlpack__ was called")
ReadOnlyTensorWrapper.__dlpack__ = refuse
v = tb.asview(w)
assert v.readonly and v.ptr == t.data_ptr()
assert (v.ptr, v.shape, v.strides, v.dtype_name, v.device, v.readonly) == (
    general.ptr, general.shape, general.strides, general.dtype_name, general.device,
    general.readonly)
a = np_take(v)
assert not a.flags.writeable and a.tolist() == t.tolist()
try:
    a[0, 0] = 5.0
except ValueError:
    pass
else:
    raise AssertionError("a write went through")
g = ReadOnlyTensorWrapper(torch.ones(3, requires_grad=True))
assert tb.asview(g).readonly
print("OK")
""")
    assert "OK" in out


@needs_readonly_export
def test_readonly_wrapper_without_the_const_table_falls_back_read_only():
    """A stand-in for torch before 2.14: ``torch._C._const_dlpack_exchange_api`` removed, so
    the table is not recognised; the wrapper's questions then raise (its ``__torch_function__``
    refuses everything) and its own ``__dlpack__``, which exports read-only, is asked."""
    out = child("""
import torch
from torch.utils.dlpack import ReadOnlyTensorWrapper
del torch._C._const_dlpack_exchange_api
import tensorbridge as tb
calls = []
own = ReadOnlyTensorWrapper.__dlpack__
def counted(self, *args, **kwargs):
    calls.append(kwargs)
    return own(self, *args, **kwargs)
ReadOnlyTensorWrapper.__dlpack__ = counted
t = torch.arange(6.0)
v = tb.asview(ReadOnlyTensorWrapper(t))
assert calls, "the fallback was not taken"
assert v.readonly and v.ptr == t.data_ptr()
print("OK")
""")
    assert "OK" in out


def test_const_table_is_recognised_by_its_address():
    """A test double on any torch with an exchange table: ``_const_dlpack_exchange_api`` made
    to name the ordinary table. Plain tensors then take the const table's rule (read-only,
    ``requires_grad`` not asked), on the same memory."""
    out = child("""
import torch
torch._C._const_dlpack_exchange_api = lambda: torch.Tensor.__dlpack_c_exchange_api__
import tensorbridge as tb
t = torch.arange(6.0)
v = tb.asview(t)
assert v.readonly and v.ptr == t.data_ptr() and v.shape == (6,)
print("OK")
""")
    assert "OK" in out
