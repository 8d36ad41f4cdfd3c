"""A view of a PyTorch tensor pins the tensor's STORAGE, not the tensor
object ([owner]).

The fast import kept only the tensor object alive. Rebinding that object to other memory
(``torch.utils.swap_tensors(t, u)``, ``t.set_(u)``, ``t.data = u``) then dropped the last
reference to the view's memory: with ``del u`` the memory was freed under the view (a
4 MiB CPU tensor is unmapped, so reading the view segfaulted). The invariant: the view
keeps the storage it was made from alive, and reads the values it had, whatever happens to
the tensor object afterwards. Each case runs in a child interpreter (the old behaviour
crashes); the small-tensor cases detect a silent read of reused memory by its values.
"""

import os

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
    """[owner]: after ``swap_tensors`` / ``set_`` / ``.data =`` and ``del u``, the
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


def case_property_pin_holds_the_span(examples):
    """Hypothesis, in this (child) interpreter: random strided views of a storage (offsets,
    zero and overlapping strides, ranks 0-4, several dtypes, requires_grad), plain or as a
    subclass overriding ``untyped_storage``, imported under no mode, a truthful mode, or a
    mode answering with another storage (of a random size) or a non-storage. Each import
    either raises a typed exception (and only under a lying mode) or gives a zero-copy view
    whose whole span lies inside the tensor's own storage, read-only when it requires grad;
    the view then survives ``t.data = ...`` with its values."""
    import gc

    import numpy as np
    import torch
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
    from torch.overrides import TorchFunctionMode

    import tensorbridge as tb
    from adversary import TYPED_ERRORS, assert_inside

    class Liar(torch.Tensor):
        def untyped_storage(self):
            return torch.empty(3, dtype=torch.uint8).untyped_storage()

    class Mode(TorchFunctionMode):
        def __init__(self, answer, size):
            super().__init__()
            self.answer, self.size = answer, size

        def __torch_function__(self, func, types, args=(), kwargs=None):
            if getattr(func, "__name__", "") == "untyped_storage":
                if self.answer == "other":
                    return torch.empty(self.size, dtype=torch.uint8).untyped_storage()
                if self.answer == "junk":
                    return bytearray(self.size)
            return func(*args, **(kwargs or {}))

    dtypes = [torch.float32, torch.float64, torch.int16, torch.uint8, torch.bool, torch.complex64]

    @st.composite
    def tensors(draw):
        dtype = draw(st.sampled_from(dtypes))
        rank = draw(st.integers(0, 4))
        shape = [draw(st.integers(0, 5)) for _ in range(rank)]
        strides = [draw(st.integers(0, 7)) for _ in range(rank)]
        offset = draw(st.integers(0, 9))
        reach = offset + sum((n - 1) * s for n, s in zip(shape, strides) if n > 0) + 1
        base = torch.zeros(max(reach, 1), dtype=dtype)
        if dtype.is_floating_point or dtype.is_complex:
            base += torch.arange(base.numel(), dtype=torch.float32).to(dtype)
        # Not a view of `base` (a view would keep the storage alive through `_base`): a
        # tensor of its own over the storage, the storage's only holder once `base` is gone.
        t = torch.empty(0, dtype=dtype).set_(base.untyped_storage(), offset, shape, strides)
        del base
        if draw(st.booleans()) and (dtype.is_floating_point or dtype.is_complex):
            t.requires_grad_(True)
        if draw(st.booleans()):
            t = t.as_subclass(Liar)
        return t

    @settings(max_examples=examples, derandomize=True, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(tensors(), st.sampled_from(["none", "truthful", "other", "junk"]), st.integers(0, 4096))
    def prop(t, mode, size):
        print("EXAMPLE", t.dtype, tuple(t.shape), t.stride(), t.storage_offset(), type(t).__name__,
              t.requires_grad, mode, size, flush=True)
        store = torch._C.TensorBase.untyped_storage(t)
        lo = torch._C.StorageBase.data_ptr(store)
        hi = lo + torch._C.StorageBase.nbytes(store)
        try:
            if mode == "none":
                v = tb.asview(t)
            else:
                with Mode(mode, size):
                    v = tb.asview(t)
        except TYPED_ERRORS:
            assert mode in ("other", "junk"), f"refused without a lying mode ({mode})"
            return
        assert t.numel() == 0 or v.ptr == t.data_ptr()
        assert_inside(v, lo, hi, "the tensor's own storage")
        assert v.readonly == t.requires_grad
        expected = t.detach().clone()
        n = t.numel()
        # Rebinds the tensor (hypothesis holds a weak reference to its examples, which
        # `swap_tensors` refuses): the old storage loses the tensor's reference.
        t.data = torch.zeros(1, dtype=t.dtype)
        del store
        gc.collect()
        junk = [torch.full((4096,), 7, dtype=torch.uint8) for _ in range(4)]
        got = np.asarray(v)
        want = expected.as_subclass(torch.Tensor).numpy()
        assert n == 0 or np.array_equal(got, want), "the view's values changed"
        del junk

    prop()


def test_property_pin_holds_the_span():
    """[owner], [span] for the PyTorch route, whatever a subclass or a mode answers (one
    child interpreter for the whole hypothesis run: a crash names its last example)."""
    pytest.importorskip("torch")
    pytest.importorskip("hypothesis")
    examples = int(os.environ.get("TB_ADVERSARIAL_EXAMPLES", "120"))
    run_case(__file__, "case_property_pin_holds_the_span", examples, timeout=600)
