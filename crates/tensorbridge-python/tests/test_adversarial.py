"""The Python object is an adversary: property-based tests (hypothesis) of ``tb.asview``.

Every family generates objects a hostile or merely odd producer could hand over, imports
each, and checks the import boundary's invariants ([refuse], [span], [access], [once]):

- the import raises one of the typed exceptions (``TypeError``, ``ValueError``,
  ``BufferError``, ``MemoryError``, ``RuntimeError``, ``NotImplementedError``), or an
  exception the generated object itself raised (passed through unchanged), and nothing
  else: no ``SystemError``, no ``PanicException``, no crash;
- or it returns a view whose whole byte span lies inside memory the exporter owns (the
  extent computed from the exporter the test made) and that is read-only where the
  exporter is.

Families (one test each):

- ``array_interface``: ``__array_interface__`` dicts over real exporters (``bytearray``,
  ``bytes``, ``array.array``, ``mmap``, read-only memoryviews; sliced with random starts,
  stops and steps, reshaped and reversed through NumPy), with random ``offset``/``strides``,
  nested and cyclic ``descr``, huge, negative and boundary numbers, wrong types for every
  key, bools where ints are expected, and subclasses of int/tuple/dict/str with hostile
  ``__index__``/``__iter__``/``__getitem__``/``__eq__`` that raise or mutate; and the same
  exporters through the buffer protocol directly;
- ``cuda_array_interface``: the same for ``__cuda_array_interface__`` (no driver here: only a
  null pointer of a zero-size array may be accepted);
- ``capsules``: DLPack capsules built field by field with ctypes (shape, strides, ndim,
  dtype, device, byte offset, flags, version, null data, null deleter), deleters counted:
  exactly once, whatever happens; ``READ_ONLY`` and legacy capsules from unknown producers
  come out read-only;
- ``own_exports``: our own exports (versioned and legacy, read-only and writable) with
  shape, strides, offset, data, rank, dtype and flags edited through ctypes: refused, or a
  view inside the exported memory, read-only when the export was ([span], [access]);
- ``exchange_attributes``: ``__dlpack_c_exchange_api__`` / ``__c_dlpack_exchange_api__`` of
  every type on arbitrary classes (ints, a ``PROT_NONE`` page, a table of counting
  functions, foreign capsules, junk); an int is never dereferenced;
- ``lying_producers``: ``__dlpack__`` returning non-capsules, used capsules, capsules of
  the wrong name, the same capsule twice; ``__dlpack_device__`` raising or returning junk;
  attributes that change between reads.

Families that can crash the interpreter (the interfaces, the exchange attributes) run their
whole hypothesis run in ONE child interpreter (``adversary.run_code``): every example is
imported in-process there, each announced on stdout first, so a segfault fails that family's
test naming the signal and the last example. The others run in pytest's process.

Cost: ``max_examples`` per family is ``TB_ADVERSARIAL_EXAMPLES`` (default 120), drawn
deterministically (``derandomize=True``) unless ``TB_ADVERSARIAL_SEED`` is set (long local
runs: ``TB_ADVERSARIAL_EXAMPLES=20000 TB_ADVERSARIAL_SEED=$RANDOM pytest test_adversarial.py``).
"""

from __future__ import annotations

import array
import ctypes
import gc
import mmap
import os
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from adversary import PAGE, TYPED_ERRORS, Guarded, owned_extent, run_code, view_span

EXAMPLES = int(os.environ.get("TB_ADVERSARIAL_EXAMPLES", "120"))
SEED = os.environ.get("TB_ADVERSARIAL_SEED")


def configured(test):
    """The suite's settings: a fixed budget, derandomized unless a seed is given, no example
    database (CI starts clean), no deadline (the machine is shared)."""
    test = settings(
        max_examples=EXAMPLES,
        derandomize=SEED is None,
        deadline=None,
        database=None,
        print_blob=True,
        suppress_health_check=list(HealthCheck),
    )(test)
    if SEED is not None:
        test = seed(int(SEED))(test)
    return test


def safe_repr(obj, limit=300):
    """``repr`` for the log, which a 1000-level or cyclic ``descr`` must not break (the
    suite's own reprs hit the recursion limit; the import under test must not)."""
    try:
        return repr(obj)[:limit]
    except RecursionError:
        return f"<{type(obj).__name__} too deep to print>"


def announce(*parts):
    """One line per example before its import: the last one names a crash."""
    line = " ".join(str(p) for p in parts).replace("\n", " ")
    print("example:", line[:400], flush=True)


# ---------------------------------------------------------------------------------------------
# Hostile values


class Hostile(Exception):
    """Raised by the generated objects themselves: it may pass through the import."""


class EvilInt(int):
    """An int whose Python-level methods raise (C code reading the value directly is fine)."""

    def __index__(self):
        raise Hostile("EvilInt.__index__")

    def __int__(self):
        raise Hostile("EvilInt.__int__")

    def __eq__(self, other):
        raise Hostile("EvilInt.__eq__")

    __hash__ = int.__hash__

    def __repr__(self):
        return f"EvilInt({int.__repr__(self)})"


class IndexOnly:
    """Not an int, but ``__index__`` says ``value`` (or raises, or mutates ``victim``)."""

    def __init__(self, value, action=None, victim=None):
        self.value, self.action, self.victim = value, action, victim

    def __index__(self):
        if self.action == "raise":
            raise Hostile("IndexOnly.__index__")
        if self.action == "mutate" and self.victim is not None:
            self.victim.clear()
        return self.value

    def __repr__(self):
        return f"IndexOnly({self.value}, {self.action})"


class EvilTuple(tuple):
    """A tuple whose Python-level protocol lies: iteration and indexing raise, len lies."""

    def __iter__(self):
        raise Hostile("EvilTuple.__iter__")

    def __getitem__(self, i):
        raise Hostile("EvilTuple.__getitem__")

    def __len__(self):
        return 1000


class EvilList(list):
    def __iter__(self):
        raise Hostile("EvilList.__iter__")

    def __getitem__(self, i):
        raise Hostile("EvilList.__getitem__")


class EvilDict(dict):
    """A dict whose Python-level lookups raise or empty it."""

    mode = "raise"

    def __getitem__(self, k):
        if self.mode == "raise":
            raise Hostile("EvilDict.__getitem__")
        self.clear()
        raise KeyError(k)

    def get(self, k, default=None):
        return self.__getitem__(k)

    def __contains__(self, k):
        return self.__getitem__(k) is not None

    def keys(self):
        raise Hostile("EvilDict.keys")


class EvilKey(str):
    """A key equal in hash to a real key, whose ``__eq__`` raises or mutates the dict."""

    def __new__(cls, text, action, victim):
        s = super().__new__(cls, text)
        s.action, s.victim = action, victim
        return s

    __hash__ = str.__hash__

    def __eq__(self, other):
        if self.action == "raise":
            raise Hostile("EvilKey.__eq__")
        if self.action == "clear":
            self.victim.clear()
        return str.__eq__(self, other)


INT_EDGES = [0, 1, -1, 2, 3, 4, 7, 8, 15, 16, 17, 2**31 - 1, 2**31, 2**32, 2**53, 2**62,
             2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**31), -(2**63), -(2**63) - 1, 10**30]  # fmt: skip


def ints(small=(-4, 64)):
    """Mostly small ints, sometimes boundary and huge ones, bools, int subclasses and
    index-only objects."""
    return st.one_of(
        st.integers(*small),
        st.integers(*small),
        st.sampled_from(INT_EDGES),
        st.booleans(),
        st.integers(-8, 64).map(EvilInt),
        st.builds(IndexOnly, st.integers(-4, 64), st.sampled_from([None, "raise"])),
    )


JUNK = st.one_of(
    st.none(),
    st.floats(allow_nan=True),
    st.text(max_size=6),
    st.binary(max_size=6),
    st.just(object()),
    st.just([1, 2]),
    st.just({"a": 1}),
    st.just(Ellipsis),
)


def tuple_of(elements, max_size=4):
    return st.one_of(
        st.lists(elements, max_size=max_size).map(tuple),
        st.lists(elements, max_size=max_size).map(EvilTuple),
        st.lists(elements, max_size=max_size),  # a list where a tuple is expected
        JUNK,
    )


TYPESTRS = ["|u1", "|i1", "|b1", "<i2", "<u2", "<f2", "<i4", "<f4", "<u4", "<i8", "<f8", "<c8",
            "<c16", ">f4", ">i8", "|V2", "|V1", "<M8[ns]", "|O", "<U4", "<f3", "f4", "", "<"]  # fmt: skip
typestrs = st.one_of(st.sampled_from(TYPESTRS), st.text(max_size=5), JUNK)


def descrs(typestr):
    """``descr`` values: the default, near misses, nested (a few levels), cyclic, junk."""
    leaf = st.sampled_from([typestr if isinstance(typestr, str) else "<f4", "<f4", "|u1", "x"])
    field = st.tuples(st.sampled_from(["", "x", ("t", "x")]), leaf)
    nested = st.recursive(
        st.lists(field, max_size=3),
        lambda inner: st.lists(st.tuples(st.sampled_from(["", "y"]), inner), min_size=1, max_size=2),
        max_leaves=6,
    )

    def cyclic(depth):
        d = []
        node = d
        for _ in range(depth):
            nxt = []
            node.append(("c", nxt))
            node = nxt
        node.append(("c", d))
        return d

    def deep(depth):
        d = "<f4"
        for _ in range(depth):
            d = [("", d)]
        return d

    return st.one_of(
        st.just([("", typestr)]),
        nested,
        st.integers(0, 3).map(cyclic),
        st.sampled_from([10, 1000, 10**5]).map(deep),
        st.lists(field, max_size=3).map(EvilList),
        st.lists(st.tuples(st.just(""), leaf, tuple_of(ints(), 2)), max_size=2),
        JUNK,
    )


# ---------------------------------------------------------------------------------------------
# Exporters with a known extent

BASES = ["bytearray", "bytes", "array_b", "array_h", "array_f", "array_d", "mmap", "readonly_view"]


class Exporter:
    """A real buffer exporter, the extent it owns and whether it is read-only; ``derived``
    is a strided view of it (a memoryview slice or a NumPy array) that also exports a
    buffer."""

    def __init__(self, base, nbytes, derive):
        self.recipe = (base, nbytes, derive)
        raw = bytes(i % 251 for i in range(nbytes))
        if base == "bytearray":
            self.obj = bytearray(raw)
        elif base == "bytes":
            self.obj = raw
        elif base.startswith("array_"):
            code = base[-1]
            size = array.array(code).itemsize
            self.obj = array.array(code, bytes(raw[: nbytes // size * size]))
        elif base == "mmap":
            self.obj = mmap.mmap(-1, max(nbytes, 1))
            self.obj[:nbytes] = raw
        else:
            self.obj = memoryview(bytearray(raw)).toreadonly()
        self.readonly = base in ("bytes", "readonly_view")
        self.lo, self.hi = owned_extent(self.obj)
        self.derived = self._derive(derive)

    def _derive(self, derive):
        kind = derive[0]
        if kind == "whole":
            return self.obj
        flat = memoryview(self.obj).cast("B")
        if kind == "slice":
            _, start, stop, step = derive
            return flat[start:stop:step]
        # ("numpy", dtype, rows, reverse_rows, reverse_cols, col_step)
        _, dtype, rows, rev_r, rev_c, col_step = derive
        a = np.frombuffer(flat, dtype=np.uint8)
        item = np.dtype(dtype).itemsize
        a = a[: a.size // item * item].view(dtype)
        if rows and a.size % rows == 0 and a.size:
            a = a.reshape(rows, -1)
            a = a[::-1] if rev_r else a
            a = a[:, ::-col_step] if rev_c else a[:, ::col_step]
        elif rev_r:
            a = a[::-1]
        return a


derivations = st.one_of(
    st.just(("whole",)),
    st.tuples(st.just("slice"), st.integers(-20, 40) | st.none(), st.integers(-20, 40) | st.none(),
              st.sampled_from([1, 2, 3, -1, -2, -3, None])),  # fmt: skip
    st.tuples(st.just("numpy"), st.sampled_from(["u1", "<u2", "<f4", "<f8"]), st.integers(0, 4),
              st.booleans(), st.booleans(), st.integers(1, 3)),  # fmt: skip
)
exporters = st.builds(Exporter, st.sampled_from(BASES), st.integers(0, 64), derivations)


def allowed(e, raised_by_object=()):
    """A refusal the boundary may give: a typed exception, or one the object raised."""
    return isinstance(e, TYPED_ERRORS + (Hostile,)) or any(e is r for r in raised_by_object)


def check_view(v, lo, hi, readonly, what):
    span = view_span(v)
    if span is not None:
        assert lo <= span[0] and span[1] <= hi, (
            f"{what}: {v!r} reaches [{span[0]:#x}, {span[1]:#x}), outside the exporter's "
            f"[{lo:#x}, {hi:#x}) ({span[0] - lo:+d} .. {span[1] - hi:+d})"
        )
    if readonly:
        assert v.readonly, f"{what}: {v!r} is writable over a read-only exporter"


def import_or_refusal(obj, raised_by_object=()):
    import tensorbridge as tb

    try:
        return tb.asview(obj)
    except BaseException as e:  # noqa: BLE001 - the property is about which ones
        if allowed(e, raised_by_object):
            return None
        raise AssertionError(f"tb.asview raised an untyped {type(e).__name__}: {e}") from e


# ---------------------------------------------------------------------------------------------
# Family: __array_interface__


class AIHolder:
    """Only ``__array_interface__`` (an attribute, or a property that raises)."""

    def __init__(self, iface, dtype=None):
        self._iface = iface
        if dtype is not None:
            self.dtype = dtype

    @property
    def __array_interface__(self):
        if isinstance(self._iface, Hostile):
            raise self._iface
        return self._iface


def _key_value(data, key, good, bad):
    """Present with a good value, present with anything, or absent."""
    return data.draw(st.sampled_from(["good", "bad", "absent"]), label=f"{key}?"), good, bad


def plausible(exporter):
    """``(typestr, shape, strides)`` that describe ``exporter.derived`` as its own buffer
    says (the honest dict), before any key is mutated."""
    m = memoryview(exporter.derived)
    fmt = {"B": "|u1", "b": "|i1", "h": "<i2", "H": "<u2", "f": "<f4", "d": "<f8"}.get(m.format, "|u1")
    return fmt, tuple(m.shape), tuple(m.strides)


def draw_interface(data, exporter, cuda):
    """A dict for ``exporter.derived``: mostly the honest one (buffer form on the host,
    pointer form for CUDA) with one to three keys replaced by drawn values (wrong types,
    hostile objects, boundary numbers, nested descr), sometimes pointer or junk ``data``."""
    typestr, shape, strides = plausible(exporter)
    form = data.draw(st.sampled_from(["buffer"] * 4 + ["pointer", "none", "junk"] if not cuda else
                                     ["pointer"] * 3 + ["junk"]), label="data form")  # fmt: skip
    d = {"typestr": typestr, "shape": shape, "version": 3}
    if data.draw(st.booleans(), label="honest strides"):
        d["strides"] = strides
    if form == "buffer":
        d["data"] = exporter.derived
    elif form == "pointer":
        addr = data.draw(st.one_of(st.just(0), ints((0, 64)), st.just(exporter.lo)), label="address")
        ro = data.draw(st.one_of(st.booleans(), ints((0, 2)), JUNK), label="readonly")
        d["data"] = data.draw(st.sampled_from([(addr, ro), EvilTuple((addr, ro)), [addr, ro], (addr,)]), label="tuple")
        if cuda:
            d["shape"] = data.draw(st.sampled_from([(0,), (0, 3), shape]), label="cuda shape")
    elif form == "junk":
        d["data"] = data.draw(JUNK, label="data junk")
    keys = ["typestr", "shape", "strides", "offset", "version", "descr", "mask", "data"] + (["stream"] if cuda else [])
    mutated = data.draw(st.lists(st.sampled_from(keys), max_size=3, unique=True), label="mutated keys")
    values = {
        "typestr": st.one_of(typestrs, st.sampled_from(["|u1", "<f4", "<u2", "<f8"])),
        "shape": st.one_of(tuple_of(ints((-2, 40)), 3), st.just((exporter.hi - exporter.lo,))),
        "strides": st.one_of(st.none(), tuple_of(ints((-16, 16)), 3)),
        "offset": st.one_of(ints((-8, 64)), JUNK),
        "version": st.one_of(ints((-1, 4)), JUNK),
        "descr": descrs(d["typestr"]),
        "mask": st.one_of(st.none(), JUNK),
        # (an exporter itself cannot be in a strategy: hypothesis hashes sampled values)
        "data": st.one_of(JUNK, st.sampled_from(["derived", "obj"])),
        "stream": st.one_of(st.none(), ints((-2, 4)), JUNK),
    }
    if data.draw(st.integers(0, 3), label="descr?") == 0:
        d["descr"] = data.draw(descrs(d["typestr"]), label="descr")
    for key in mutated:
        if data.draw(st.integers(0, 5), label=f"delete {key}?") == 0:
            d.pop(key, None)
        else:
            d[key] = data.draw(values[key], label=key)
            if key == "data" and d[key] in ("derived", "obj"):
                d[key] = getattr(exporter, d[key])
    # Hostile containers around the dict.
    wrap = data.draw(st.sampled_from(["dict"] * 6 + ["evil_key_raise", "evil_key_clear", "evil_dict", "not_dict", "raise"]),
                     label="container")  # fmt: skip
    if wrap.startswith("evil_key"):
        key = data.draw(st.sampled_from(sorted(d) or ["shape"]), label="shadowed key")
        evil = EvilKey(key, None, d)  # inert while it is inserted (the insert compares too)
        d[evil] = 1
        evil.action = "raise" if wrap.endswith("raise") else "clear"
    elif wrap == "evil_dict":
        e = EvilDict(d)
        e.mode = data.draw(st.sampled_from(["raise", "clear"]), label="EvilDict mode")
        d = e
    elif wrap == "not_dict":
        d = list(d.items())
    elif wrap == "raise":
        d = Hostile("__array_interface__ property")
    return d, form


def _cuda_driver_present():
    for name in ("libcuda.so.1", "libcuda.so"):
        try:
            ctypes.CDLL(name)
            return True
        except OSError:
            continue
    return False


@configured
@given(st.data())
def family_array_interface(data):
    ex = data.draw(exporters, label="exporter")
    if data.draw(st.integers(0, 4), label="buffer protocol directly?") == 0:
        announce("buffer", ex.recipe)
        v = import_or_refusal(ex.derived)
        if v is not None:
            check_view(v, ex.lo, ex.hi, ex.readonly, f"buffer protocol of {ex.recipe}")
        return
    iface, form = draw_interface(data, ex, cuda=False)
    dtype = data.draw(st.one_of(st.none(), JUNK, st.just(np.dtype("f4"))), label="dtype attribute")
    holder = AIHolder(iface, dtype)
    raised = (iface,) if isinstance(iface, Hostile) else ()
    announce("array_interface", ex.recipe, form, safe_repr(iface))
    v = import_or_refusal(holder, raised)
    if v is None or form != "buffer":
        return  # the pointer form is trusted like a pointer: nothing to check it against
    check_view(v, ex.lo, ex.hi, ex.readonly, f"__array_interface__ over {ex.recipe}")


@configured
@given(st.data())
def family_cuda_array_interface(data):
    ex = data.draw(exporters, label="exporter")
    iface, form = draw_interface(data, ex, cuda=True)
    raised = (iface,) if isinstance(iface, Hostile) else ()

    class CaiHolder:
        @property
        def __cuda_array_interface__(self):
            if isinstance(iface, Hostile):
                raise iface
            return iface

    announce("cuda_array_interface", form, safe_repr(iface))
    v = import_or_refusal(CaiHolder(), raised)
    if v is not None and not _cuda_driver_present():
        assert v.ptr == 0 and v.size == 0, f"a CUDA pointer nothing checked was accepted: {v!r}"


def test_array_interface_family():
    """[refuse], [span], [access] over generated ``__array_interface__`` dicts and buffer
    exporters (a child interpreter: nested descr crashed it)."""
    run_code(_child("family_array_interface"), "hypothesis family array_interface", timeout=900)


def test_cuda_array_interface_family():
    """[refuse] over generated ``__cuda_array_interface__`` dicts (a child interpreter)."""
    run_code(_child("family_cuda_array_interface"), "hypothesis family cuda_array_interface", timeout=900)


def quiet_memoryview_clears():
    """Drops one kind of unraisable noise: the collector clearing a generated memoryview
    that another generated object still exports from ("memoryview has 1 exported buffer").
    Everything else (tensorbridge reports panics in destructors as unraisable) is shown."""
    previous = sys.unraisablehook

    def hook(u):
        if isinstance(u.exc_value, BufferError) and "exported buffer" in str(u.exc_value):
            return
        previous(u)

    sys.unraisablehook = hook


def _child(family):
    here = os.path.dirname(os.path.abspath(__file__))
    return f"""
        import sys
        sys.path.insert(0, {here!r})
        import test_adversarial as m
        m.quiet_memoryview_clears()
        print("hypothesis: max_examples", m.EXAMPLES, "seed", m.SEED or "derandomized", flush=True)
        m.{family}()
        print("family done", flush=True)
    """


# ---------------------------------------------------------------------------------------------
# Family: DLPack capsules built field by field

DTYPES = [(0, 32, 1), (1, 8, 1), (2, 32, 1), (2, 16, 1), (2, 64, 1), (4, 16, 1), (5, 64, 1),
          (6, 8, 1), (2, 32, 4), (2, 24, 1), (99, 32, 1), (2, 0, 1), (2, 32, 0), (10, 8, 1), (17, 4, 1)]  # fmt: skip
DEVICES = [(1, 0), (1, 0), (1, 0), (1, 7), (2, 0), (3, 0), (13, 0), (10, 0), (99, 0), (0, 0), (1, -1)]


@st.composite
def capsule_recipes(draw):
    rank = draw(st.integers(0, 4))
    dims = st.one_of(st.integers(0, 6), st.sampled_from([-1, -(2**63), 2**31, 2**62, 2**63 - 1]))
    shape = draw(st.lists(dims, min_size=rank, max_size=rank))
    strides = draw(st.one_of(st.none(), st.lists(st.one_of(st.integers(-8, 8), st.sampled_from([2**62, -(2**62)])),
                                                 min_size=rank, max_size=rank)))  # fmt: skip
    return dict(
        shape=tuple(shape) or (1,),  # the arrays hold at least one entry
        ndim=draw(st.one_of(st.just(rank), st.integers(-2, rank))),
        strides=None if strides is None else (tuple(strides) or (1,)),
        dtype=draw(st.sampled_from(DTYPES)),
        device=draw(st.sampled_from(DEVICES)),
        byte_offset=draw(st.one_of(st.integers(0, 64), st.sampled_from([1, 2, 3, 2**40, 2**63, 2**64 - 1]))),
        versioned=draw(st.booleans()),
        version=draw(st.sampled_from([(1, 3), (1, 0), (1, 99), (0, 9), (2, 0), (1, 1)])),
        flags=draw(st.one_of(st.integers(0, 7), st.sampled_from([2**63, 2**64 - 1]))),
        data=draw(st.sampled_from(["base", "base", "base+4", "base+1", "null", "low"])),
        null_deleter=draw(st.integers(0, 5)) == 0,
        null_shape=draw(st.integers(0, 7)) == 0,
    )


@configured
@given(capsule_recipes())
def test_capsules_family(recipe):
    """[refuse], [once], [access] over hand-made DLPack capsules: no crash, a typed
    refusal or a view; the deleter runs exactly once (after the view is gone, or at the
    refusal); READ_ONLY and legacy capsules of an unknown producer come out read-only."""
    from tbhelpers import HandMadeCapsule, aligned_numpy, capsule_struct

    import tensorbridge as tb

    buf = aligned_numpy((64,), np.float32, fill=0)
    base = buf.ctypes.data
    data = {"base": base, "base+4": base + 4, "base+1": base + 1, "null": 0, "low": 4096}[recipe["data"]]
    fields = {k: v for k, v in recipe.items() if k not in ("data", "null_shape")}
    fields["ndim"] = min(fields["ndim"], len(fields["shape"]))  # never past the arrays
    if fields["strides"] is not None:
        fields["strides"] = (fields["strides"] + (1,) * 4)[: len(fields["shape"])]
    h = HandMadeCapsule(data=data, keep=buf, **fields)
    cap = h.make()
    if recipe["null_shape"]:
        capsule_struct(cap).dl_tensor.shape = ctypes.POINTER(ctypes.c_int64)()
    try:
        v = tb.asview(cap)
    except TYPED_ERRORS:
        v = None
    except BaseException as e:  # noqa: BLE001
        raise AssertionError(f"tb.asview raised an untyped {type(e).__name__}: {e}") from e
    if v is not None:
        assert h.deleted == 0, "the deleter ran while the view lives"
        if recipe["null_shape"]:
            assert v.ndim == 0, f"a null shape was read as {v.shape}"
        if recipe["versioned"] and recipe["flags"] & 1:
            assert v.readonly, f"a READ_ONLY capsule came out writable: {v!r}"
        if not recipe["versioned"]:
            assert v.readonly, f"a legacy capsule of an unknown producer came out writable: {v!r}"
        if v.device == "cpu" and v.size:
            assert v.ptr == data + recipe["byte_offset"], (hex(v.ptr), hex(data), recipe["byte_offset"])
        del v
    del cap
    gc.collect()
    if not recipe["null_deleter"]:
        assert h.deleted == 1, f"the deleter ran {h.deleted} times"


# ---------------------------------------------------------------------------------------------
# Family: our own exports, edited through ctypes


@st.composite
def own_export_edits(draw):
    return dict(
        readonly=draw(st.booleans()),
        versioned=draw(st.booleans()),
        shape=draw(st.lists(st.tuples(st.integers(0, 1), st.sampled_from([0, 1, 2, 7, 8, 9, 16, 17, 1 << 40, -1])),
                            max_size=2)),  # fmt: skip
        strides=draw(st.lists(st.tuples(st.integers(0, 1), st.sampled_from([0, 1, 2, -1, 8, 9, -8, 1 << 40])),
                              max_size=2)),  # fmt: skip
        byte_offset=draw(st.one_of(st.none(), st.sampled_from([0, 4, 32, 60, 64, 256, 2**63]))),
        data=draw(st.one_of(st.none(), st.sampled_from([-64, -4, 4, 64, 4096]))),
        ndim=draw(st.one_of(st.none(), st.integers(0, 2))),
        dtype=draw(st.one_of(st.none(), st.sampled_from([(2, 64, 1), (1, 8, 1), (2, 32, 2), (0, 32, 1)]))),
        flags=draw(st.one_of(st.none(), st.integers(0, 7))),
    )


@configured
@given(own_export_edits())
def test_own_exports_family(edit):
    """[span], [access], [once] for our own DLPack exports edited by a consumer: the import
    refuses, or gives a view inside the memory the export described, read-only when the
    exported view was; the exported memory's ``release`` runs exactly once at the end."""
    from tbhelpers import capsule_struct

    import tensorbridge as tb

    a = np.arange(64, dtype=np.float32)
    lo, hi = owned_extent(a)
    released = []
    base = tb.from_ptr(lo + 64, (4, 8), "float32", device="cpu", owner=a, readonly=edit["readonly"],
                       release=lambda: released.append(1))  # fmt: skip
    blo, bhi = lo + 64, lo + 64 + 128
    if not edit["versioned"] and edit["readonly"]:
        edit["versioned"] = True  # a read-only view has no legacy export (a tested refusal)
    cap = base.__dlpack__(max_version=(1, 3)) if edit["versioned"] else base.__dlpack__()
    m = capsule_struct(cap)
    t = m.dl_tensor
    for i, value in edit["shape"]:
        t.shape[i] = value
    for i, value in edit["strides"]:
        t.strides[i] = value
    if edit["byte_offset"] is not None:
        t.byte_offset = edit["byte_offset"]
    if edit["data"] is not None:
        t.data = (t.data or 0) + edit["data"]
    if edit["ndim"] is not None:
        t.ndim = edit["ndim"]
    if edit["dtype"] is not None:
        t.dtype.code, t.dtype.bits, t.dtype.lanes = edit["dtype"]
    if edit["flags"] is not None and edit["versioned"]:
        m.flags = edit["flags"]
    v = import_or_refusal(cap)
    if v is not None:
        check_view(v, blo, bhi, edit["readonly"], f"our export edited by {edit}")
        del v
    del cap, base, m, t
    gc.collect()
    assert released == [1], f"release ran {len(released)} times"


# ---------------------------------------------------------------------------------------------
# Family: exchange attributes on arbitrary classes

EXCHANGE_VALUES = ["0", "1", "16", "True", "False", "-1", "2**64 - 8", "2**64", "guard_page", "counting_table",
                   "counting_capsule", "wrong_name_capsule", "torch_capsule", "view_capsule", "'16'", "None",
                   "1.5", "[16]", "object()", "b'dlpack'"]  # fmt: skip


def _exchange_value(spec, keep):
    from test_boundary_exchange import _counting_table

    from tbhelpers import _api

    new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)(
        ("PyCapsule_New", _api)
    )
    if spec == "guard_page":
        g = Guarded(16, "start")
        keep.append(g)
        return g.lo - PAGE, None
    if spec in ("counting_table", "counting_capsule", "wrong_name_capsule"):
        address, calls, k = _counting_table()
        keep.append(k)
        if spec == "counting_table":
            return address, calls
        name = b"dlpack_exchange_api" if spec == "counting_capsule" else b"dltensor"
        return new(address, name, None), None  # a capsule is trusted: calls allowed
    if spec == "torch_capsule":
        try:
            import torch
        except ImportError:  # an environment without PyTorch: the view's own capsule stands in
            spec = "view_capsule"
        else:
            return torch.Tensor.__dlpack_c_exchange_api__, None
    if spec == "view_capsule":
        import tensorbridge as tb

        return tb.View.__dlpack_c_exchange_api__, None
    return eval(spec), None  # noqa: S307 - this file's literals


@configured
@given(
    st.sampled_from(EXCHANGE_VALUES),
    st.sampled_from(["__c_dlpack_exchange_api__", "__dlpack_c_exchange_api__", "both"]),
    st.sampled_from(["nothing", "dlpack", "array_interface", "subclass_of_bytearray"]),
)
def family_exchange_attributes(spec, attribute, other):
    keep = []
    value, calls = _exchange_value(spec, keep)
    names = ["__c_dlpack_exchange_api__", "__dlpack_c_exchange_api__"] if attribute == "both" else [attribute]
    a = np.arange(4, dtype=np.float32)
    ns = {name: value for name in names}
    bases = (object,)
    if other == "dlpack":
        ns["__dlpack__"] = lambda self, **kw: a.__dlpack__(**kw)
        ns["__dlpack_device__"] = lambda self: (1, 0)
    elif other == "array_interface":
        ns["__array_interface__"] = property(lambda self: a.__array_interface__)
    elif other == "subclass_of_bytearray":
        bases = (bytearray,)
    cls = type("Arbitrary", bases, ns)
    obj = cls(a.tobytes()) if other == "subclass_of_bytearray" else cls()
    announce("exchange", spec, attribute, other)
    v = import_or_refusal(obj)
    if calls is not None:
        assert calls == [], f"functions of a table given as an int were called: {calls}"
    if v is not None:
        assert other != "nothing", f"an object with only an exchange attribute was viewed: {v!r}"
        if other in ("dlpack", "array_interface"):
            assert v.ptr == a.ctypes.data and v.shape == (4,)
        else:
            check_view(v, *owned_extent(obj), False, "a bytearray subclass")


def test_exchange_attributes_family():
    """[refuse], design "only the capsule form is trusted": every type of exchange attribute
    on arbitrary classes (a child interpreter: the int form crashed it)."""
    run_code(_child("family_exchange_attributes"), "hypothesis family exchange_attributes", timeout=900)


# ---------------------------------------------------------------------------------------------
# Family: producers that lie


class Liar:
    """A producer whose answers are drawn: ``__dlpack__`` (what it returns or raises, on
    the n-th call), ``__dlpack_device__``, and an ``__array_interface__`` that changes
    between reads."""

    def __init__(self, backing, dlpack, device, iface_script, raised):
        self.backing, self.dlpack_script, self.device_script = backing, dlpack, device
        self.iface_script, self.raised = iface_script, raised
        self.calls = {"dlpack": 0, "device": 0, "iface": 0}
        self.cap = None

    def _raise(self, what):
        e = Hostile(what)
        self.raised.append(e)
        raise e

    def dlpack_impl(self, *args, **kwargs):
        i = self.calls["dlpack"]
        self.calls["dlpack"] += 1
        what = self.dlpack_script[min(i, len(self.dlpack_script) - 1)]
        a = self.backing
        if what == "good":
            return a.__dlpack__(**{k: v for k, v in kwargs.items() if k == "max_version"})
        if what == "legacy_good":
            return a.__dlpack__()
        if what == "same_capsule":
            if self.cap is None:
                self.cap = a.__dlpack__()
            return self.cap
        if what == "used_capsule":
            from tbhelpers import consume_capsule

            c = a.__dlpack__()
            consume_capsule(c)
            return c
        if what == "wrong_name":
            from tbhelpers import _api

            new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)(
                ("PyCapsule_New", _api)
            )
            return new(a.ctypes.data, b"not_a_dltensor", None)
        if what == "type_error":
            raise TypeError("__dlpack__() got an unexpected keyword argument")
        if what == "buffer_error":
            raise BufferError("refused on purpose")
        if what == "hostile":
            self._raise("__dlpack__")
        return {"int": 16, "none": None, "self": self, "str": "dltensor", "array": a, "list": [a]}[what]

    def device_impl(self):
        i = self.calls["device"]
        self.calls["device"] += 1
        what = self.device_script[min(i, len(self.device_script) - 1)]
        if what == "hostile":
            self._raise("__dlpack_device__")
        if what == "value_error":
            raise ValueError("no device")
        return {"cpu": (1, 0), "cuda": (2, 0), "rocm": (10, 0), "short": (1,), "str": "cpu", "none": None,
                "huge": (2**40, 0), "bools": (True, False), "long": (1, 0, 0)}[what]  # fmt: skip

    def iface_impl(self):
        i = self.calls["iface"]
        self.calls["iface"] += 1
        what = self.iface_script[min(i, len(self.iface_script) - 1)]
        a = self.backing
        if what == "honest":
            return a.__array_interface__
        if what == "grown":
            return {**a.__array_interface__, "shape": (a.size * 4,)}
        if what == "hostile":
            self._raise("__array_interface__")
        return {"none": None, "junk": 16}[what]


def _liar_class(protocols):
    ns = {}
    if protocols in ("dlpack", "both"):
        ns["__dlpack__"] = Liar.dlpack_impl
        ns["__dlpack_device__"] = Liar.device_impl
    if protocols in ("iface", "both"):
        ns["__array_interface__"] = property(Liar.iface_impl)
    return type(f"LyingProducer_{protocols}", (Liar,), ns)


# Made once: tensorbridge caches facts per type (64 types at most), a class per example
# would fill that cache for the rest of the session.
LIAR_CLASSES = {p: _liar_class(p) for p in ("dlpack", "iface", "both")}


DLPACK_ANSWERS = ["good", "legacy_good", "same_capsule", "used_capsule", "wrong_name", "type_error",
                  "buffer_error", "hostile", "int", "none", "self", "str", "array", "list"]  # fmt: skip
DEVICE_ANSWERS = ["cpu", "cuda", "rocm", "short", "str", "none", "huge", "bools", "long", "hostile", "value_error"]
IFACE_ANSWERS = ["honest", "grown", "hostile", "none", "junk"]


@configured
@given(
    st.lists(st.sampled_from(DLPACK_ANSWERS), min_size=1, max_size=3),
    st.lists(st.sampled_from(DEVICE_ANSWERS), min_size=1, max_size=3),
    st.lists(st.sampled_from(IFACE_ANSWERS), min_size=1, max_size=3),
    st.sampled_from(["dlpack", "iface", "both"]),
    st.integers(1, 2),
)
def test_lying_producers_family(dlpack, device, iface, protocols, imports):
    """[refuse], [once], [span]: a producer whose protocol answers are drawn (changing
    between calls); every import refuses cleanly or views the producer's own memory."""
    backing = np.arange(8, dtype=np.float32)
    raised = []
    cls = LIAR_CLASSES[protocols]
    p = cls(backing, dlpack, device, iface, raised)
    lo, hi = owned_extent(backing)
    for _ in range(imports):
        v = import_or_refusal(p, raised)
        if v is None:
            continue
        grown = "grown" in iface and protocols != "dlpack"
        if not grown:  # the interface that lies about its shape is a pointer form: trusted
            check_view(v, lo, hi, False, "a lying producer")
        del v
    gc.collect()


if __name__ == "__main__":  # a family by hand: python test_adversarial.py family_array_interface
    globals()[sys.argv[1]]()
