"""A span that comes from a foreign description lies inside memory the
exporter owns ([span]).

An ``__array_interface__`` whose ``data`` is a buffer-protocol object names a buffer; a
strided buffer's ``buf`` is the address of its element 0 (for ``memoryview(ba)[::-1]`` the
LAST byte of ``ba``) and its ``len`` the bytes of its items, not the lowest address and the
span. Checking the dict's layout against ``[buf, buf + len)`` accepted a writable view
reaching 15 bytes past a 16-byte ``bytearray``. Each case here puts the exporter's bytes
next to a ``PROT_NONE`` page (``adversary.Guarded``), imports, and then reads every byte of
the view: an overrun is a segfault, so every case runs in its own interpreter
(``adversary.run_case``) and a crash fails only that case, naming the signal.

What must hold: ``tb.asview`` either refuses with a typed exception (NumPy itself asks a
``data`` buffer for a C-contiguous (``PyBUF_SIMPLE``) export and so refuses these) or gives
a view whose whole byte span lies inside the exporter's memory, readable to the last byte.
The same holds for the other places a span is derived from a description: the dict's
``offset`` and ``strides`` over a buffer, a NumPy array with negative strides as ``data``,
and the buffer protocol itself (``tb.asview(memoryview(...)[::-1])``), which is right today
and stays so.
"""

import ctypes

import numpy as np
import pytest

from adversary import TYPED_ERRORS, Guarded, assert_inside, read_all, run_case


class AI:
    """Exposes only ``__array_interface__``."""

    def __init__(self, iface):
        self.__array_interface__ = iface


def _dict(data, shape, typestr="|u1", **extra):
    return {"shape": shape, "typestr": typestr, "data": data, "version": 3, **extra}


# name -> (where the guard page is, builder(g: Guarded) -> the object tb.asview is given)
CASES = {
    # the simplest case: reversed, so buf is the last byte; overran 15 bytes
    "reversed_memoryview": ("end", lambda g: AI(_dict(g.mv[::-1], (16,)))),
    # every other byte, reversed: buf is the last byte, len 8; overran 7 bytes
    "reversed_memoryview_step2": ("end", lambda g: AI(_dict(g.mv[::-2], (8,)))),
    # the dict's ``offset`` measured from buf (the last byte): element 0 at 15 bytes past it
    "reversed_memoryview_with_offset": ("end", lambda g: AI(_dict(g.mv[::-1], (1,), offset=15))),
    # a NumPy array with negative strides as data: buf is row 3 of a 4x4 byte matrix
    "reversed_numpy_rows": (
        "end",
        lambda g: AI(_dict(np.frombuffer(g.mv, np.uint8).reshape(4, 4)[::-1], (16,))),
    ),
    "reversed_numpy_float32": (
        "end",
        lambda g: AI(_dict(np.frombuffer(g.mv, np.float32)[::-1], (4,), "<f4")),
    ),
    # the dict's own strides over a contiguous buffer: inside (accepted today), and outside
    # (refused today) in both directions
    "dict_negative_strides_with_offset": (
        "end",
        lambda g: AI(_dict(g.mv, (4,), "<f4", strides=(-4,), offset=12)),
    ),
    "dict_negative_strides_before_the_buffer": (
        "start",
        lambda g: AI(_dict(g.mv, (4,), "<f4", strides=(-4,))),
    ),
    "dict_strides_past_the_end": ("end", lambda g: AI(_dict(g.mv, (4,), "<f4", strides=(8,)))),
    "dict_offset_past_the_end": ("end", lambda g: AI(_dict(g.mv, (4,), "<f4", offset=4))),
    "dict_forward_strided_buffer": ("end", lambda g: AI(_dict(g.mv[::2], (8,)))),
    # the buffer protocol itself (PEP 3118 strides, buf at element 0): right today
    "buffer_reversed_memoryview": ("end", lambda g: g.mv[::-1]),
    "buffer_reversed_memoryview_at_start": ("start", lambda g: g.mv[::-1]),
    "buffer_memoryview_of_reversed_numpy_2d": (
        "end",
        lambda g: memoryview(np.frombuffer(g.mv, np.uint8).reshape(4, 4)[::-1, ::-1]),
    ),
    "buffer_ctypes_array": ("end", lambda g: (ctypes.c_uint8 * 16).from_buffer(g.mv)),
}


def case_guarded_import(name):
    """In a child interpreter: import the case's object, check the span, read every byte."""
    import tensorbridge as tb

    where, build = CASES[name]
    g = Guarded(16, where)
    obj = build(g)
    try:
        v = tb.asview(obj)
    except TYPED_ERRORS as e:
        print(f"refused: {type(e).__name__}: {e}", flush=True)
        return
    print(f"accepted: {v!r}; guarded bytes [{g.lo:#x}, {g.hi:#x})", flush=True)
    # Read first: an overrun into the guard page is a segfault (the child's signal is the
    # test's failure); an overrun that stays readable is caught by the span check after.
    values = read_all(v)
    assert values.size == v.size
    assert_inside(v, g.lo, g.hi, "the 16 guarded bytes")


@pytest.mark.parametrize("name", list(CASES))
def test_buffer_spans_stay_inside_the_exporter(name):
    """[span]: the view a buffer-backed description gives lies inside the
    exporter's memory (or the description is refused with a typed exception)."""
    run_case(__file__, "case_guarded_import", name)


def test_reversed_memoryview_of_a_bytearray_in_process(tb):
    """The simplest case, in this process: a 16-byte ``bytearray`` and ``data =
    memoryview(ba)[::-1]``. Refused, or a view inside the bytearray (no bytes are read)."""
    ba = bytearray(range(16))
    lo = ctypes.addressof((ctypes.c_char * 16).from_buffer(ba))
    p = AI(_dict(memoryview(ba)[::-1], (16,)))
    try:
        v = tb.asview(p)
    except TYPED_ERRORS:
        return
    assert_inside(v, lo, lo + 16, "the bytearray")


def test_read_only_buffer_stays_read_only(tb):
    """[access]: ``data`` naming a read-only buffer never gives a writable view."""
    b = bytes(range(16))
    for data in (b, memoryview(b), memoryview(bytearray(b)).toreadonly()):
        try:
            v = tb.asview(AI(_dict(data, (16,))))
        except TYPED_ERRORS:
            continue
        assert v.readonly, data
