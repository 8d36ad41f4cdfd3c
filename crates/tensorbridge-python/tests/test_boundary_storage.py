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


# The storage is verified, not believed (``import/torch.rs``). ``untyped_storage()`` is a
# Python-level answer: a subclass may override it and a ``__torch_function__`` mode intercepts
# it for every tensor. Pinning the storage such an answer names left the tensor's own memory
# unpinned: ``swap_tensors`` then freed it under the view (both cases segfaulted before the
# fix). The import now calls PyTorch's C method (no subclass override is reached), checks that
# what comes back is a real storage holding the view's bytes, and refuses otherwise.

N_LARGE = 1 << 20  # 4 MiB of float32: unmapped when freed, so a dangling read faults


def _swap_away_and_check(t, v, n):
    """Rebinds ``t`` to other memory and drops the last other reference; ``v`` must still
    read ``arange(n)``."""
    import gc

    import numpy as np
    import torch

    ptr = v.ptr
    u = torch.full((n,), -1.0).as_subclass(type(t))
    torch.utils.swap_tensors(t, u)
    del u
    gc.collect()
    assert t.data_ptr() != ptr, "the swap did not move the tensor (the test proves nothing)"
    junk = [torch.full((n,), 7.0) for _ in range(8)]
    got = np.array(np.asarray(v), copy=True)
    assert np.array_equal(got, np.arange(n, dtype=np.float32)), got[:8]
    del junk


def case_subclass_overriding_untyped_storage(n):
    import torch

    import tensorbridge as tb

    asked = []

    class Liar(torch.Tensor):
        def untyped_storage(self):
            asked.append(1)
            return torch.empty(1).untyped_storage()

    t = torch.arange(n, dtype=torch.float32).as_subclass(Liar)
    v = tb.asview(t)
    assert v.ptr == t.data_ptr()
    assert not asked, "the subclass's Python override was asked for the storage"
    _swap_away_and_check(t, v, n)


def case_mode_answering_untyped_storage(answer, n):
    import pytest
    import torch
    from torch.overrides import TorchFunctionMode

    import tensorbridge as tb

    intercepted = []

    class Mode(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if getattr(func, "__name__", "") == "untyped_storage":
                intercepted.append(answer)
                if answer == "other storage":
                    return torch.empty(1).untyped_storage()
                if answer == "not a storage":
                    return bytearray(16)
                if answer == "raises":
                    raise RuntimeError("no storage for you")
            return func(*args, **(kwargs or {}))

    t = torch.arange(n, dtype=torch.float32)
    with Mode():
        if answer == "its own storage":
            v = tb.asview(t)
        else:
            with pytest.raises(RuntimeError, match=r"untyped_storage\(\)"):
                tb.asview(t)
            v = None
    assert intercepted, "the mode was not asked (the test proves nothing)"
    if v is not None:
        # A mode that answers truthfully is no reason to refuse.
        _swap_away_and_check(t, v, n)


def case_subclass_overriding_is_neg():
    import pytest
    import torch

    import tensorbridge as tb

    class Liar(torch.Tensor):
        def is_neg(self):
            return False

    t = torch.arange(4.0)._neg_view().as_subclass(Liar)
    assert t.is_neg() is False and torch.Tensor.is_neg(t) is True
    with pytest.raises(BufferError, match="negative bit"):
        tb.asview(t)


def test_subclass_override_of_untyped_storage_is_not_asked():
    """A subclass whose ``untyped_storage()`` names another storage: the view pins the
    tensor's own storage and survives ``swap_tensors`` (segfaulted before)."""
    pytest.importorskip("torch")
    run_case(__file__, "case_subclass_overriding_untyped_storage", N_LARGE)


@pytest.mark.parametrize("answer", ["other storage", "not a storage", "raises", "its own storage"])
def test_torch_function_mode_cannot_choose_the_pin(answer):
    """A ``TorchFunctionMode`` that answers ``untyped_storage()`` with another storage, a
    non-storage, or an exception: refused with ``RuntimeError`` (the first segfaulted after a
    swap before); one that answers truthfully: a view that survives the swap."""
    pytest.importorskip("torch")
    run_case(__file__, "case_mode_answering_untyped_storage", answer, N_LARGE)


def test_subclass_override_of_is_neg_is_not_asked():
    """A lazily negated tensor whose subclass says ``is_neg() == False`` is still refused:
    PyTorch's own ``is_neg`` is asked."""
    pytest.importorskip("torch")
    run_case(__file__, "case_subclass_overriding_is_neg")


def test_subclass_override_of_requires_grad_is_not_asked():
    """A tensor that requires grad, whose subclass says it does not, still gives a read-only
    view: PyTorch's own getter is asked."""
    torch = pytest.importorskip("torch")
    import tensorbridge as tb

    class Liar(torch.Tensor):
        @property
        def requires_grad(self):
            return False

    t = torch.ones(4, requires_grad=True).as_subclass(Liar)
    assert t.requires_grad is False and torch._C.TensorBase.requires_grad.__get__(t) is True
    assert tb.asview(t).readonly
    assert not tb.asview(torch.ones(4).as_subclass(Liar)).readonly
