"""Issue 26, item 2: a view of a PyTorch tensor pins the tensor's STORAGE, not the tensor
object ([owner]).

The fast import kept only the tensor object alive. Rebinding that object to other memory
(``torch.utils.swap_tensors(t, u)``, ``t.set_(u)``, ``t.data = u``) then dropped the last
reference to the view's memory: with ``del u`` the memory was freed under the view (a
4 MiB CPU tensor is unmapped, so reading the view segfaulted). The invariant: the view
keeps the storage it was made from alive, and reads the values it had, whatever happens to
the tensor object afterwards. Each case runs in a child interpreter (the old behaviour
crashes); the small-tensor cases detect a silent read of reused memory by its values.
"""

import pytest

from adversary import run_case

REBINDS = ["swap_tensors", "set_", "data"]
SIZES = {"large": 1 << 20, "small": 64}  # 4 MiB (unmapped when freed) and 256 bytes (reused)


def case_rebind_under_view(how, n):
    import gc

    import numpy as np
    import torch

    import tensorbridge as tb

    t = torch.arange(n, dtype=torch.float32)
    expected = np.arange(n, dtype=np.float32)
    u = torch.full((n,), -1.0)
    v = tb.asview(t)
    ptr = v.ptr
    assert ptr == t.data_ptr()
    if how == "swap_tensors":
        torch.utils.swap_tensors(t, u)
    elif how == "set_":
        t.set_(u)
    else:
        t.data = u
    del u
    gc.collect()
    assert t.data_ptr() != ptr, "the rebinding did not move the tensor (the test proves nothing)"
    # Reuse freed memory of the same size with other values.
    junk = [torch.full((n,), 7.0) for _ in range(8)]
    got = np.array(np.asarray(v), copy=True)  # the view's memory, through __array_interface__
    assert v.ptr == ptr
    assert np.array_equal(got, expected), f"the view now reads {got[:8]} ... (expected {expected[:8]} ...)"
    # A consumer made from the view afterwards sees the same memory and values.
    again = torch.from_dlpack(v)
    assert again.data_ptr() == ptr and bool((again == torch.from_numpy(expected)).all())
    del junk


@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("how", REBINDS)
def test_view_survives_rebinding_its_tensor(how, size):
    """Item 2 / [owner]: after ``swap_tensors`` / ``set_`` / ``.data =`` and ``del u``, the
    view's memory is still valid and holds the values it had."""
    pytest.importorskip("torch")
    run_case(__file__, "case_rebind_under_view", how, SIZES[size])
