"""The outcome matrix on the GPU (docs/PROTOCOLS.md, "Outcome matrix"; the CPU one is
``tests/test_outcome_matrix.py``): every CUDA producer times every CUDA consumer, the direct
hand-off against the same hand-off through ``tb.asview``.

Outcomes, classified without tensorbridge (``gpu_frameworks``' pointers and device reads):
``zero-copy`` (the producer's device address and bytes), ``copy`` (its bytes elsewhere),
``wrong-values`` (other bytes than the producer's tensor shows), ``empty`` (no elements),
``refused <Exception>`` (from the consumer, or from ``tb.asview``). Both must agree, or the
cell is in ``GPU_DIFFERENCES``; there, ``direct`` is ``"*"`` where the direct outcome was not
measured when the entry was written, and ``"refused"`` where any refusal by the consumer is
the direct outcome (the outcome through tensorbridge is what the entry holds tensorbridge
to). Missing frameworks skip their rows and columns.

Bridged cells: where the producer does not speak the consumer's protocol at all (Numba's
arrays have no ``__dlpack__``; a cuda.core ``Buffer`` has no ``__cuda_array_interface__``),
the direct hand-off is refused by the consumer for want of the protocol, not for the
memory's sake. Through tensorbridge the same memory goes out with the producer's own access
(both producers hand it out writable), zero-copy: the hand-off tensorbridge exists for.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest

from gpu_frameworks import BY_NAME, CONSUMERS

N = 4096


@dataclass
class Made:
    obj: object
    ptr: int
    data: bytes  # the values the producer shows, C order
    keep: object = None


def _values():
    return (np.arange(N, dtype=np.float32) * 0.5 - 7).astype(np.float32)


def _framework(name: str) -> Made:
    fw = BY_NAME[name].require()
    values = _values()
    x = fw.make(values)
    return Made(x, fw.ptr(x), values.tobytes())


def _torch(kind: str) -> Made:
    torch = pytest.importorskip("torch")
    values = _values()
    base = torch.from_numpy(values.copy()).to("cuda")
    if kind == "requires-grad":
        t = base.requires_grad_(True)
    elif kind == "neg":
        c = torch.complex(base, -base)
        t = c.conj().imag
        assert t.is_neg()
    elif kind == "strided":
        t = base.reshape(64, 64)[1:, ::2]
    elif kind == "zero-size":
        t = torch.empty((0, 3), dtype=torch.float32, device="cuda")
    else:
        raise AssertionError(kind)
    shown = t.detach().resolve_neg().cpu().numpy()
    return Made(t, t.data_ptr(), np.ascontiguousarray(shown).tobytes())


def _from_ptr(readonly: bool) -> Made:
    import tensorbridge as tb

    cupy = pytest.importorskip("cupy")
    values = _values()
    buf = cupy.asarray(values)
    v = tb.from_ptr(buf.data.ptr, (N,), "float32", device="cuda:0", owner=buf, readonly=readonly)
    return Made(v, buf.data.ptr, values.tobytes(), keep=buf)


PRODUCERS: dict[str, Callable[[], Made]] = {
    "torch": lambda: _framework("torch"),
    "torch requires_grad": lambda: _torch("requires-grad"),
    "torch neg bit": lambda: _torch("neg"),
    "torch strided": lambda: _torch("strided"),
    "torch zero-size": lambda: _torch("zero-size"),
    "cupy": lambda: _framework("cupy"),
    "jax": lambda: _framework("jax"),
    "numba": lambda: _framework("numba"),
    "cuda.core": lambda: _framework("cuda.core"),
    "from_ptr": lambda: _from_ptr(False),
    "from_ptr read-only": lambda: _from_ptr(True),
}

CONSUMER_NAMES = [c.name for c in CONSUMERS]


def classify(consumer, made: Made, x) -> str:
    try:
        r = consumer.consume(x)
    except Exception as e:  # noqa: BLE001 - the exception's class is the outcome
        return f"refused {type(e).__name__}"
    if not made.data:
        return "empty"
    got = np.ascontiguousarray(np.asarray(consumer.read(r))).tobytes()
    if got != made.data:
        return "wrong-values"
    return "zero-copy" if consumer.ptr(r) == made.ptr else "copy"


@dataclass(frozen=True)
class Difference:
    direct: str
    through: str
    why: str


GPU_DIFFERENCES: dict[tuple[str, str], Difference] = {
    **{
        ("torch neg bit", c): Difference(
            "*",
            "refused BufferError",
            "tb.asview refuses: the memory holds the values un-negated and DLPack cannot say so",
        )
        for c in CONSUMER_NAMES
    },
    # cuda.core reads PyTorch tensors through its own C path, past the check PyTorch's
    # __dlpack__ makes; the view's __dlpack__ refuses as PyTorch's does.
    ("torch requires_grad", "cuda.core"): Difference(
        "*",
        "refused BufferError",
        "the view's __dlpack__ refuses a tensor that requires grad, as PyTorch's does",
    ),
    # Bridged (the module docs): the producer lacks the consumer's protocol.
    **{
        ("numba", c): Difference(
            "refused",
            "zero-copy",
            "Numba's arrays offer the CUDA Array Interface only; the view adds DLPack",
        )
        for c in ("torch", "cupy", "jax", "cuda.core")
    },
    **{
        ("cuda.core", c): Difference(
            "refused",
            "zero-copy",
            "a cuda.core Buffer offers DLPack only; the view adds the CUDA Array Interface",
        )
        for c in ("cupy(cai)", "numba")
    },
}


def _matches(documented: str, direct: str) -> bool:
    if documented == "refused":
        return direct.startswith("refused ")
    return documented in ("*", direct)


@pytest.mark.parametrize("consumer", CONSUMER_NAMES)
@pytest.mark.parametrize("producer", list(PRODUCERS))
def test_gpu_outcome_through_tensorbridge_is_the_direct_one(producer, consumer):
    import tensorbridge as tb

    c = next(f for f in CONSUMERS if f.name == consumer).require()
    made = PRODUCERS[producer]()
    direct = classify(c, made, made.obj)
    try:
        v = tb.asview(made.obj)
    except Exception as e:  # noqa: BLE001 - the refusal is the outcome
        via = f"refused {type(e).__name__}"
    else:
        via = classify(c, made, v)
    d = GPU_DIFFERENCES.get((producer, consumer))
    if d is None:
        assert via == direct, f"{producer} -> {consumer}: directly {direct!r}, through tb.asview {via!r}"
    else:
        assert _matches(d.direct, direct) and via == d.through, (
            f"{producer} -> {consumer}: directly {direct!r}, through tb.asview {via!r}; "
            f"documented {d.direct!r} / {d.through!r} ({d.why})"
        )


def test_gpu_requires_grad_reaches_no_consumer_writable():
    """A CUDA tensor that requires grad: torch.from_dlpack (which ignores DLPack's read-only
    flag) and the CUDA Array Interface's consumers (CuPy drops its readonly) get PyTorch's
    refusals from the view, in PyTorch's exception classes."""
    import tensorbridge as tb

    torch = pytest.importorskip("torch")
    t = torch.arange(6, dtype=torch.float32, device="cuda").requires_grad_(True)
    v = tb.asview(t)
    assert v.readonly and v.ptr == t.data_ptr()
    with pytest.raises(BufferError, match="requires grad"):
        torch.from_dlpack(v)
    with pytest.raises(RuntimeError, match="requires grad"):
        v.__cuda_array_interface__
