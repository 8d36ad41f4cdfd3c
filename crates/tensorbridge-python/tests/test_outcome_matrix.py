"""The outcome matrix (docs/PROTOCOLS.md, "Outcome matrix"; ARCHITECTURE.md, "The read-only
rule"): every host producer times every consumer, the direct hand-off against the same
hand-off through ``tb.asview``.

Each cell runs ``consumer(producer)`` and ``consumer(tb.asview(producer))`` and classifies
both outcomes the same way, without tensorbridge:

- ``zero-copy``: the result's data pointer is the producer's and its values are the
  producer's values (``read-only`` / ``writable`` added where the result says so: NumPy);
- ``copy``: the producer's values at another address;
- ``wrong-values``: the producer's memory, or a copy of it, holding other values than the
  producer's tensor shows (PyTorch's lazy negation and conjugation bits);
- ``empty``: a result of the producer's shape without elements (no address to compare);
- ``refused <Exception>``: the exception class, from the consumer or from ``tb.asview``;
- ``done`` (the Rust writer): it wrote (by 1.0) and the values stayed.

Both must agree, or the cell is in ``DIFFERENCES`` below, the one place the test's
expectations live: each entry names the two outcomes it expects (so a difference that goes
away or changes fails too), the versions it holds for, and why; ``test_differences_are_documented``
checks that docs/PROTOCOLS.md lists exactly these. Frameworks missing from an environment skip
their rows and columns (``importorskip``); the versions differ between the environments in
exactly these behaviours (legacy or versioned DLPack in NumPy and JAX), hence ``when``.

``python test_outcome_matrix.py`` prints the whole matrix of this environment.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest

from frameworks import JaxFw, TensorFlowFw, TorchFw, sample
from tbhelpers import NUMPY_DLPACK_VERSIONED, aligned_numpy, at_least, version_of

SHAPE = (3, 4)


# --- producers -------------------------------------------------------------------------------


@dataclass
class Made:
    """A producer object, the address of its element 0 (read without tensorbridge) and the
    values it shows (what every consumer must see)."""

    obj: object
    ptr: int
    values: np.ndarray
    keep: object = None  # what must stay alive with it (a buffer under from_ptr)


def _numpy(readonly: bool) -> Made:
    a = aligned_numpy(SHAPE, np.float64, fill=sample("float64", SHAPE))
    if readonly:
        a.flags.writeable = False
    return Made(a, a.ctypes.data, np.array(a, copy=True))


def _torch(kind: str) -> Made:
    torch = pytest.importorskip("torch")
    base = torch.from_numpy(sample("float64", SHAPE).copy())
    if kind == "plain":
        t = base
    elif kind == "requires-grad":
        t = base.requires_grad_(True)
    elif kind == "neg":
        # a lazily negated view: its memory holds the values un-negated
        c = torch.from_numpy(sample("complex128", SHAPE).copy())
        t = c.conj().imag
        assert t.is_neg()
    elif kind == "conj":
        t = torch.from_numpy(sample("complex128", SHAPE).copy()).conj()
        assert t.is_conj()
    elif kind == "zero-size":
        t = torch.empty((0, 3), dtype=torch.float64)
    elif kind == "strided":
        # non-contiguous, an element offset into its storage, positive strides
        t = torch.from_numpy(sample("float64", (4, 6)).copy())[1:, ::2]
        assert not t.is_contiguous()
    else:
        raise AssertionError(kind)
    values = t.detach().resolve_neg().resolve_conj().numpy().copy()
    return Made(t, t.data_ptr(), values)


def _jax() -> Made:
    pytest.importorskip("jax")
    a = JaxFw().make(aligned_numpy(SHAPE, np.float64, fill=sample("float64", SHAPE)))
    return Made(a, a.unsafe_buffer_pointer(), np.asarray(a).copy())


def _tensorflow() -> Made:
    pytest.importorskip("tensorflow")
    fw = TensorFlowFw()
    t = fw.make(sample("float64", SHAPE))
    return Made(t, fw.ptr(t), fw.read(t))


def _ml_dtypes() -> Made:
    ml_dtypes = pytest.importorskip("ml_dtypes")
    a = aligned_numpy(SHAPE, ml_dtypes.bfloat16, fill=sample("bfloat16", SHAPE))
    return Made(a, a.ctypes.data, np.array(a, copy=True))


def _from_ptr(readonly: bool) -> Made:
    import tensorbridge as tb

    buf = aligned_numpy(SHAPE, np.float64, fill=sample("float64", SHAPE))
    v = tb.from_ptr(buf.ctypes.data, SHAPE, "float64", device="cpu", owner=buf, readonly=readonly)
    return Made(v, buf.ctypes.data, np.array(buf, copy=True), keep=buf)


PRODUCERS: dict[str, Callable[[], Made]] = {
    "numpy": lambda: _numpy(False),
    "numpy read-only": lambda: _numpy(True),
    "torch": lambda: _torch("plain"),
    "torch requires_grad": lambda: _torch("requires-grad"),
    "torch neg bit": lambda: _torch("neg"),
    "torch conj bit": lambda: _torch("conj"),
    "torch zero-size": lambda: _torch("zero-size"),
    "torch strided": lambda: _torch("strided"),
    "jax": _jax,
    "tensorflow": _tensorflow,
    "ml_dtypes bfloat16": _ml_dtypes,
    "from_ptr": lambda: _from_ptr(False),
    "from_ptr read-only": lambda: _from_ptr(True),
}


# --- consumers -------------------------------------------------------------------------------


def _result_numpy(r):
    return r.ctypes.data if r.size else None, np.array(r, copy=True), r.flags.writeable


def _result_torch(r):
    fw = TorchFw()
    return (fw.ptr(r) if r.numel() else None), fw.read(r), None


def _result_jax(r):
    fw = JaxFw()
    return (fw.ptr(r) if r.size else None), fw.read(r), None


def _result_tf(r):
    fw = TensorFlowFw()
    return (fw.ptr(r) if int(np.prod(r.shape)) else None), fw.read(r), None


def _result_tvm(r):
    # values through torch where present (it takes every dtype here), else NumPy, else (NumPy
    # without bfloat16 in DLPack) the bytes of a contiguous result read with ctypes
    try:
        import torch

        values = TorchFw().read(torch.from_dlpack(r))
    except ImportError:
        if str(r.dtype) == "bfloat16" and r.is_contiguous():
            import ctypes

            import ml_dtypes

            dt = np.dtype(ml_dtypes.bfloat16)
            raw = ctypes.string_at(r.data_ptr(), r.numel() * dt.itemsize)
            values = np.frombuffer(raw, dtype=dt).reshape(r.shape).copy()
        else:
            values = np.array(np.from_dlpack(r), copy=True)
    return (r.data_ptr() if r.numel() else None), values, None


@dataclass
class Consumer:
    module: str
    take: Callable[[object], object]
    result: Callable[[object], tuple]


def _tf_take(x):
    import tensorflow as tf

    # TF 2.21 takes only a capsule, asked for as TF's users ask for one: without max_version
    return tf.experimental.dlpack.from_dlpack(x.__dlpack__())


def _rust_reader(x):
    import tensorbridge_example as ex

    return ("rust", ex.nd_ptr(x), ex.nd_sum(x))


def _rust_writer(x):
    import tensorbridge_example as ex

    ex.nd_scale(x, 1.0)
    return ("done",)


CONSUMERS: dict[str, Consumer] = {
    "np.from_dlpack": Consumer("numpy", lambda x: np.from_dlpack(x), _result_numpy),
    "np.asarray": Consumer("numpy", lambda x: np.asarray(x), _result_numpy),
    "torch.from_dlpack": Consumer(
        "torch", lambda x: __import__("torch").from_dlpack(x), _result_torch
    ),
    "jax.dlpack.from_dlpack": Consumer(
        "jax", lambda x: __import__("jax").dlpack.from_dlpack(x), _result_jax
    ),
    "tf.experimental.dlpack.from_dlpack": Consumer("tensorflow", _tf_take, _result_tf),
    "tvm_ffi.from_dlpack": Consumer(
        "tvm_ffi", lambda x: __import__("tvm_ffi").from_dlpack(x), _result_tvm
    ),
    "rust reader (ndarray view)": Consumer("tensorbridge_example", _rust_reader, None),
    "rust writer (ndarray view_mut)": Consumer("tensorbridge_example", _rust_writer, None),
}


# --- outcomes --------------------------------------------------------------------------------


def classify(consumer: Consumer, made: Made, x) -> str:
    """The outcome of ``consumer`` taking ``x``, which shows ``made``'s memory (see the
    module docs for the classes)."""
    try:
        r = consumer.take(x)
    except Exception as e:  # noqa: BLE001 - the exception's class is the outcome
        return f"refused {type(e).__name__}"
    if isinstance(r, tuple) and r[0] == "done":
        return "done" if np.array_equal(_values_now(made), made.values) else "wrong-values"
    if isinstance(r, tuple) and r[0] == "rust":
        _, ptr, total = r
        if made.values.size == 0:
            return "empty"
        same = np.isclose(total, made.values.astype(np.float64).sum())
        return ("zero-copy" if ptr == made.ptr else "copy") if same else "wrong-values"
    ptr, values, writable = consumer.result(r)
    if made.values.size == 0:
        return "empty" if values.shape == made.values.shape else "wrong-values"
    same = values.shape == made.values.shape and _same(values, made.values)
    if not same:
        return "wrong-values"
    kind = "zero-copy" if ptr == made.ptr else "copy"
    if kind == "zero-copy" and writable is not None:
        kind += " writable" if writable else " read-only"
    return kind


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    if a.dtype != b.dtype:
        if a.dtype.itemsize != b.dtype.itemsize:
            return False
        # bfloat16 read back through torch comes as ml_dtypes bits: compare bit patterns
        a = np.ascontiguousarray(a).view(f"u{a.dtype.itemsize}")
        b = np.ascontiguousarray(b).view(f"u{b.dtype.itemsize}")
    return bool(np.array_equal(a, b))


def _values_now(made: Made) -> np.ndarray:
    o = made.obj
    if isinstance(o, np.ndarray):
        return np.array(o, copy=True)
    if made.keep is not None:
        return np.array(made.keep, copy=True)
    if hasattr(o, "data_ptr"):
        return TorchFw().read(o)
    return JaxFw().read(o) if hasattr(o, "unsafe_buffer_pointer") else TensorFlowFw().read(o)


def through(x):
    """``x`` through tensorbridge: the view, or the exception ``asview`` raised (the cell's
    outcome then, for every consumer)."""
    import tensorbridge as tb

    try:
        return tb.asview(x)
    except Exception as e:  # noqa: BLE001 - the refusal is the outcome
        return e


def cell(producer: str, consumer: str) -> tuple[str, str]:
    """(direct outcome, outcome through ``tb.asview``) of one cell."""
    c = CONSUMERS[consumer]
    pytest.importorskip(c.module)
    made = PRODUCERS[producer]()
    direct = classify(c, made, made.obj)
    v = through(made.obj)
    tb_outcome = f"refused {type(v).__name__}" if isinstance(v, Exception) else classify(c, made, v)
    return direct, tb_outcome


# --- the documented differences --------------------------------------------------------------


@dataclass(frozen=True)
class Difference:
    """A cell whose outcome through tensorbridge differs from the direct one, on purpose."""

    direct: str
    through: str
    why: str
    # where it holds (docs/PROTOCOLS.md's "where" column); None: everywhere
    when: str | None = None


# Version conditions the differences depend on, by the name the docs use.
WHEN: dict[str, Callable[[], bool]] = {
    "NumPy < 2.1": lambda: not NUMPY_DLPACK_VERSIONED,
    "NumPy < 2.5": lambda: not at_least("numpy", (2, 5)),
}

ZERO_COPY = "zero-copy"
TVM_TABLE = (
    "tvm-ffi takes a view through its DLPack C exchange table (a versioned export with "
    "READ_ONLY set, the way PyTorch 2.14+ hands its read-only tensors to tvm-ffi), and keeps "
    "no flags; it asks NumPy for a legacy capsule, which NumPy refuses for read-only arrays"
)
ML_DTYPES = (
    "tensorbridge describes ml_dtypes' bfloat16 in DLPack; NumPy's own exporter refuses "
    "ml_dtypes arrays"
)

# (producer, consumer) -> the differences, the first whose `when` holds applies. A consumer
# of "*" is every consumer, and a direct outcome of "*" any outcome.
DIFFERENCES: dict[tuple[str, str], list[Difference]] = {
    ("numpy read-only", "tvm_ffi.from_dlpack"): [
        Difference("refused BufferError", ZERO_COPY, TVM_TABLE),
    ],
    ("numpy read-only", "torch.from_dlpack"): [
        Difference(
            "refused BufferError",
            ZERO_COPY,
            "NumPy before 2.1 exports legacy capsules only and refuses read-only arrays; the "
            "view hands torch the versioned READ_ONLY export NumPy 2.1+ hands it itself "
            "(torch ignores the flag either way)",
            when="NumPy < 2.1",
        ),
    ],
    ("torch requires_grad", "np.asarray"): [
        Difference(
            "refused RuntimeError",
            "zero-copy read-only",
            "strictly safer and told: NumPy honours the array interface's readonly, and the "
            "view is read-only (PyTorch's numpy() refuses the tensor)",
        ),
    ],
    ("torch neg bit", "*"): [
        Difference(
            "*",
            "refused BufferError",
            "tb.asview refuses: the memory holds the values un-negated and DLPack cannot say "
            "so; directly, consumers get the wrong values or refuse in their own words",
        ),
    ],
    ("torch conj bit", "np.asarray"): [
        Difference(
            "refused RuntimeError",
            "refused BufferError",
            "tb.asview refuses with PyTorch's own __dlpack__ refusal; np.asarray asks numpy(), "
            "whose refusal is a RuntimeError",
        ),
    ],
    ("torch conj bit", "tvm_ffi.from_dlpack"): [
        Difference(
            "wrong-values",
            "refused BufferError",
            "PyTorch's exchange table exports the memory unconjugated; tb.asview refuses with "
            "PyTorch's own __dlpack__ refusal",
        ),
    ],
    ("ml_dtypes bfloat16", "np.from_dlpack"): [
        Difference(
            "refused BufferError",
            "refused RuntimeError",
            "NumPy's exporter refuses ml_dtypes arrays; NumPy before 2.5 refuses to import "
            "bfloat16 from the view with RuntimeError",
            when="NumPy < 2.5",
        ),
    ],
    **{
        ("ml_dtypes bfloat16", c): [Difference("refused BufferError", ZERO_COPY, ML_DTYPES)]
        for c in (
            "torch.from_dlpack",
            "jax.dlpack.from_dlpack",
            "tf.experimental.dlpack.from_dlpack",
            "tvm_ffi.from_dlpack",
        )
    },
}


def expected_difference(producer: str, consumer: str) -> Difference | None:
    for key in ((producer, consumer), (producer, "*")):
        for d in DIFFERENCES.get(key, []):
            if d.when is None or WHEN[d.when]():
                return d
    return None


# --- the tests -------------------------------------------------------------------------------


@pytest.mark.parametrize("consumer", list(CONSUMERS))
@pytest.mark.parametrize("producer", list(PRODUCERS))
def test_outcome_through_tensorbridge_is_the_direct_one(producer, consumer):
    """One cell: the same outcome class both ways, or the documented difference."""
    direct, via = cell(producer, consumer)
    d = expected_difference(producer, consumer)
    if d is None:
        assert via == direct, (
            f"{producer} -> {consumer}: directly {direct!r}, through tb.asview {via!r} "
            "(an undocumented difference: fix it, or add it to DIFFERENCES and "
            "docs/PROTOCOLS.md's outcome matrix with the reason)"
        )
    else:
        assert (d.direct in ("*", direct)) and via == d.through, (
            f"{producer} -> {consumer}: directly {direct!r}, through tb.asview {via!r}; "
            f"documented: {d.direct!r} / {d.through!r} ({d.why})"
        )


def _docs_rows() -> set[tuple[str, str, str, str, str]]:
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, "..", "..", "..", "docs", "PROTOCOLS.md")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    start = text.index("## Outcome matrix")
    end = text.find("\n## ", start + 1)
    section = text[start : end if end != -1 else len(text)]
    rows = set()
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 6 and cells[0].startswith("`") and not set(cells[0]) <= {"-"}:
            producer, consumer, direct, via, where, _why = cells
            unquote = lambda s: s.strip("`")  # noqa: E731
            rows.add((unquote(producer), unquote(consumer), unquote(direct), unquote(via), where))
    return rows


def test_differences_are_documented():
    """docs/PROTOCOLS.md's outcome matrix lists exactly the differences above (producer,
    consumer, both outcomes, where), so neither can change without the other."""
    listed = {
        (p, c, d.direct, d.through, d.when or "everywhere")
        for (p, c), ds in DIFFERENCES.items()
        for d in ds
    }
    assert _docs_rows() == listed


def test_every_version_condition_is_known():
    assert {d.when for ds in DIFFERENCES.values() for d in ds} - {None} <= set(WHEN)


if __name__ == "__main__":
    import sys

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    os.environ.setdefault("JAX_ENABLE_X64", "1")
    versions = {m: version_of(m) for m in ("numpy", "torch", "jax", "tensorflow-cpu", "apache-tvm-ffi")}
    print(versions)
    for p in PRODUCERS:
        for c in CONSUMERS:
            try:
                direct, via = cell(p, c)
            except BaseException as e:  # noqa: BLE001 - a skip prints as such
                print(f"{p:22} {c:34} skipped ({e})")
                continue
            d = expected_difference(p, c)
            mark = "" if direct == via else (" (documented)" if d else "  <-- DIFFERENT")
            print(f"{p:22} {c:34} {direct:24} {via:24}{mark}")
