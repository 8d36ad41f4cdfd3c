"""The smaller boundary checks, each with the invariant it checks:

- [type] only facts about the TYPE are cached, and a type that is not PyTorch's own class
  re-verifies its protocol attributes: a ``torch.Tensor`` subclass that gains a
  ``__dlpack__`` override after its first import is asked through it (the per-type cache
  kept bypassing it).
- [span] our own DLPack exports are checked against the extent we exported: an export
  edited through ctypes to claim more than its memory holds was accepted as a foreign
  tensor; it is refused (typed exception), while an edit that stays inside (a sub-view) is
  accepted as it says. The memory sits before a ``PROT_NONE`` page and each case runs in
  a child interpreter, so an accepted overrun is a segfault that fails one test. (A dtype
  widened past the export, and ``READ_ONLY`` cleared on a read-only view's export, were
  found by ``test_adversarial.py``'s own-exports family.)
- [access] a span overlapping one of our live read-only exports comes back read-only: a
  read-only view round-tripped through tvm-ffi (which drops ``READ_ONLY``) came back
  writable, through ``tb.asview`` and through the View's exchange table
  (``managed_tensor_to_py_object_no_sync``, what tvm-ffi uses for function results).
- [access] tensors that require grad are read-only, accepted as inputs: ``nn.Parameter``
  (and a leaf with ``requires_grad=True``) was refused with ``BufferError``; it is viewed
  read-only, zero-copy, and writes into the view are refused.
"""

import numpy as np
import pytest

from adversary import TYPED_ERRORS, Guarded, assert_inside, read_all, run_case
from tbhelpers import np_take

# --- a subclass that gains __dlpack__ later ---------------------------------------------------


def case_subclass_gains_dlpack_later():
    import torch

    import tensorbridge as tb

    class Late(torch.Tensor):
        pass

    s = torch.arange(6, dtype=torch.float32).as_subclass(Late)
    first = tb.asview(s)  # the type is classified here: no override yet
    assert first.ptr == s.data_ptr()
    calls = []

    def __dlpack__(self, *args, **kwargs):
        calls.append(kwargs)
        return torch.Tensor.__dlpack__(self, *args, **kwargs)

    Late.__dlpack__ = __dlpack__
    v = tb.asview(s)
    assert calls, "tensorbridge bypassed a __dlpack__ the class gained after its first import"
    assert v.ptr == s.data_ptr()


def test_torch_subclass_that_gains_dlpack_later_is_asked_through_it():
    """[type]: the override is seen on the next import (a fresh interpreter, so the
    per-type cache is empty and not full)."""
    pytest.importorskip("torch")
    run_case(__file__, "case_subclass_gains_dlpack_later")


# --- our own export, edited ------------------------------------------------------------------

# name -> (edit(struct's dl_tensor), accepted?, shape expected when accepted, pointer offset)
EDITS = {
    "shape_grown": (lambda t: t.shape.__setitem__(0, 32), False, None, 0),
    "shape_huge": (lambda t: t.shape.__setitem__(0, 1 << 40), False, None, 0),
    "stride_grown": (lambda t: t.strides.__setitem__(0, 2), False, None, 0),
    "stride_negative": (lambda t: t.strides.__setitem__(0, -1), False, None, 0),
    "offset_past_the_end": (lambda t: setattr(t, "byte_offset", t.byte_offset + 32), False, None, 0),
    "data_moved_past_the_end": (lambda t: setattr(t, "data", t.data + 32), False, None, 0),
    "dtype_widened": (lambda t: setattr(t.dtype, "bits", 64), False, None, 0),
    "vector_lanes": (lambda t: setattr(t.dtype, "lanes", 4), False, None, 0),
    "shape_shrunk": (lambda t: t.shape.__setitem__(0, 8), True, (8,), 0),
    "sub_view_by_offset": (
        lambda t: (setattr(t, "byte_offset", t.byte_offset + 16), t.shape.__setitem__(0, 12)),
        True,
        (12,),
        16,
    ),
}


def case_edited_own_export(edit_name, versioned):
    import tensorbridge as tb
    from tbhelpers import capsule_struct

    edit, accept, shape, offset = EDITS[edit_name]
    g = Guarded(64, "end")
    base = tb.asview(g.mv.cast("f"))  # 16 float32, the last one right before the guard page
    assert (base.ptr, base.shape, base.strides) == (g.addr, (16,), (1,))
    cap = base.__dlpack__(max_version=(1, 3)) if versioned else base.__dlpack__()
    edit(capsule_struct(cap).dl_tensor)
    try:
        v = tb.asview(cap)
    except TYPED_ERRORS as e:
        print(f"refused: {type(e).__name__}: {e}", flush=True)
        assert not accept, f"an edit inside the exported extent was refused: {e}"
        return
    print(f"accepted: {v!r}; exported bytes [{g.lo:#x}, {g.hi:#x})", flush=True)
    if v.size <= 1 << 20:
        read_all(v)  # past the guard page: a segfault, which fails the test
    assert accept, f"an export edited to reach outside its memory was accepted: {v!r}"
    assert_inside(v, g.lo, g.hi, "the exported memory")
    assert v.shape == shape and v.ptr == g.addr + offset and not v.readonly


@pytest.mark.parametrize("versioned", [True, False], ids=["versioned", "legacy"])
@pytest.mark.parametrize("edit", list(EDITS))
def test_edited_own_export_is_checked_against_its_extent(edit, versioned):
    """[span]: refused when the edit reaches outside the export, accepted inside."""
    run_case(__file__, "case_edited_own_export", edit, versioned)


def test_read_only_flag_cleared_on_our_export_stays_read_only(tb):
    """[access] (found by ``test_adversarial.py``'s own-exports family): a consumer
    that clears ``READ_ONLY`` on our versioned export of a read-only view does not get a
    writable view back."""
    from tbhelpers import capsule_struct

    data = bytes(range(16))
    v = tb.asview(data)
    cap = v.__dlpack__(max_version=(1, 3))
    m = capsule_struct(cap)
    assert m.flags & 1
    m.flags = 0
    back = tb.asview(cap)
    assert back.ptr == v.ptr
    assert back.readonly, f"clearing READ_ONLY on our export made it writable: {back!r}"


# --- a read-only view round-tripped through tvm-ffi -------------------------------------------


def read_only_view(tb):
    data = bytes(range(16))
    v = tb.asview(data)
    assert v.readonly
    return v, data


def test_read_only_view_through_tvm_ffi_and_back_with_asview(tb):
    """[access]: ``tvm_ffi.from_dlpack(view)`` drops READ_ONLY; ``tb.asview`` of
    the result overlaps a live read-only export and must be read-only."""
    tvm_ffi = pytest.importorskip("tvm_ffi", reason="apache-tvm-ffi is not installed")
    v, data = read_only_view(tb)
    t = tvm_ffi.from_dlpack(v)
    assert t.data_ptr() == v.ptr
    back = tb.asview(t)
    assert back.ptr == v.ptr
    assert back.readonly, f"a read-only view came back writable through tvm-ffi: {back!r}"
    assert not np_take(back).flags.writeable


def test_read_only_view_through_tvm_ffi_and_back_through_the_exchange_table(tb):
    """[access]: a tvm-ffi function returning its argument converts the result with
    the View's own ``managed_tensor_to_py_object_no_sync``: still read-only."""
    tvm_ffi = pytest.importorskip("tvm_ffi", reason="apache-tvm-ffi is not installed")
    echo = tvm_ffi.get_global_func("testing.echo")
    v, data = read_only_view(tb)
    r = echo(v)
    assert type(r) is tb.View and r.ptr == v.ptr
    assert r.readonly, f"a read-only view came back writable from a tvm-ffi function: {r!r}"
    n = np_take(r)
    assert not n.flags.writeable
    assert bytes(np.asarray(r)) == data


def test_writable_view_through_tvm_ffi_stays_writable(tb):
    """The control: a writable view comes back writable, both ways."""
    tvm_ffi = pytest.importorskip("tvm_ffi", reason="apache-tvm-ffi is not installed")
    ba = bytearray(range(16))
    v = tb.asview(ba)
    assert not tb.asview(tvm_ffi.from_dlpack(v)).readonly
    r = tvm_ffi.get_global_func("testing.echo")(v)
    assert not r.readonly
    np_take(r)[0] = 99
    assert ba[0] == 99


# --- tensors that require grad -----------------------------------------------------------------


@pytest.mark.parametrize("kind", ["parameter", "leaf"])
def test_tensor_requiring_grad_is_a_read_only_view(tb, kind):
    """[access]: accepted (it used to be refused with BufferError), zero-copy,
    read-only; a write through the view is refused and the tensor keeps its values."""
    torch = pytest.importorskip("torch")
    base = torch.arange(6, dtype=torch.float32)
    t = torch.nn.Parameter(base) if kind == "parameter" else base.clone().requires_grad_(True)
    assert t.requires_grad
    v = tb.asview(t)
    assert v.ptr == t.data_ptr() and v.shape == (6,) and v.dtype_name == "float32"
    assert v.readonly, f"a tensor that requires grad came out writable: {v!r}"
    n = np.asarray(v)  # NumPy honours the array interface's readonly
    assert not n.flags.writeable
    with pytest.raises(ValueError):
        n[0] = 42
    assert t.detach().tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    for max_version in (None, (1, 3)):
        with pytest.raises(BufferError, match="requires grad"):
            v.__dlpack__(max_version=max_version)  # as torch's own __dlpack__ refuses
