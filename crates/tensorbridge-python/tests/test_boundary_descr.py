"""No unbounded recursion over foreign data ([refuse]).

``descr`` in ``__array_interface__`` and ``__cuda_array_interface__`` was parsed recursively:
a cyclic list (``d = []; d.append(("x", d))``) or one nested 10**5 deep overflowed the stack
(a segfault). Only the default one-field form (``[('', typestr)]``) is ever accepted, so a
nested ``descr`` is refused while parsing: a clean ``TypeError`` or ``ValueError`` naming
``descr``. Each case runs in a child interpreter (the old behaviour crashes).

The CUDA Array Interface cases describe a zero-size array at address 0, which is accepted
on a machine without a driver: the ``descr`` is the only reason to refuse them.
"""

import pytest

from adversary import run_case

DESCRS = ["cyclic", "deep", "deep_format_list", "cyclic_through_two_lists", "shallow_nested"]


def make_descr(kind):
    if kind == "cyclic":
        d = []
        d.append(("x", d))
        return d
    if kind == "cyclic_through_two_lists":
        a, b = [], []
        a.append(("a", b))
        b.append(("b", a))
        return a
    if kind == "deep":
        d = "<f4"
        for _ in range(10**5):
            d = [("x", d)]
        return d
    if kind == "deep_format_list":
        d = [("", "<f4")]
        for _ in range(10**5):
            d = [("", d, (1,))]
        return d
    if kind == "shallow_nested":  # one level, as NumPy writes a nested struct
        return [("x", [("y", "<f4")])]
    raise ValueError(kind)


def case_nested_descr(which, kind):
    import numpy as np

    import tensorbridge as tb

    class P:
        pass

    p = P()
    a = np.zeros(4, np.float32)
    if which == "array":
        p.__array_interface__ = {
            "shape": (4,), "typestr": "<f4", "data": (a.ctypes.data, False), "version": 3,
            "descr": make_descr(kind),
        }  # fmt: skip
    else:
        p.__cuda_array_interface__ = {
            "shape": (0,), "typestr": "<f4", "data": (0, False), "version": 3,
            "descr": make_descr(kind),
        }  # fmt: skip
    try:
        v = tb.asview(p)
    except (TypeError, ValueError) as e:
        assert "descr" in str(e), f"refused, but not for the descr: {type(e).__name__}: {e}"
        print(f"refused: {type(e).__name__}: {str(e)[:200]}", flush=True)
        return
    raise AssertionError(f"a nested descr was accepted: {v!r}")


@pytest.mark.parametrize("kind", DESCRS)
@pytest.mark.parametrize("which", ["array", "cuda"])
def test_nested_descr_is_refused_cleanly(which, kind):
    """[refuse]: cyclic and deeply nested ``descr`` give TypeError/ValueError."""
    run_case(__file__, "case_nested_descr", which, kind)
