"""The ml_dtypes family (bfloat16, float8, float6, float4, int4) held in NumPy arrays: NumPy
cannot export them through DLPack, so tensorbridge reads them through the array interface
and names them; each consumer then takes them or refuses them cleanly. Expected outcomes are
the ones measured in the CI venv (torch 2.11, jax 0.10.2, tensorflow-cpu 2.21, ml_dtypes 0.6),
and in the newest one where a release changed them (named beside each).
"""

import gc

import numpy as np
import pytest

from tbhelpers import (
    FLAG_SUBBYTE_PADDED,
    JAX_0_4,
    JAX_DLPACK_VERSIONED,
    NUMPY_DLPACK_VERSIONED,
    aligned_numpy,
    read_capsule,
)

ml_dtypes = pytest.importorskip("ml_dtypes")

OK = "ok"
# NumPy 2.5 (the GPU machine's 2.5.2) raises BufferError where 2.4 (CI's) raised RuntimeError.
NP_REFUSES = ((RuntimeError, BufferError), "Unsupported dtype in DLTensor")
TF_REFUSES = ("InvalidArgumentError", "Unsupported Type Codes")
TORCH_REFUSES = (BufferError, "Unsupported")
# sub-byte types are padded in ml_dtypes (one per byte): only a versioned capsule can say so
TB_PADDED_LEGACY = (BufferError, "padded")
# JAX 0.12 asks for versioned capsules, which can say so (SUBBYTE_TYPE_PADDED): tensorbridge
# hands them over and JAX itself refuses them (JaxRuntimeError, a RuntimeError): float4 for
# its layout, float6 for its type code. JAX 0.11 and older ask for legacy capsules, which
# tensorbridge refuses for padded types.
JAX_SUBBYTE = (
    (RuntimeError, "Unsupported layout|invalid DLPack type code") if JAX_DLPACK_VERSIONED else TB_PADDED_LEGACY
)

# ml_dtypes name -> (DLPack (code, bits), torch, jax, tensorflow, numpy)
TABLE = {
    "bfloat16": ((4, 16), OK, OK, OK, NP_REFUSES),
    "float8_e4m3fn": ((10, 8), OK, OK, TF_REFUSES, NP_REFUSES),
    "float8_e5m2": ((12, 8), OK, OK, TF_REFUSES, NP_REFUSES),
    "float8_e4m3fnuz": ((11, 8), OK, OK, TF_REFUSES, NP_REFUSES),
    "float8_e5m2fnuz": ((13, 8), OK, OK, TF_REFUSES, NP_REFUSES),
    "float8_e8m0fnu": ((14, 8), OK, OK, TF_REFUSES, NP_REFUSES),
    "float8_e3m4": ((7, 8), TORCH_REFUSES, OK, TF_REFUSES, NP_REFUSES),
    "float8_e4m3": ((8, 8), TORCH_REFUSES, OK, TF_REFUSES, NP_REFUSES),
    "float8_e4m3b11fnuz": ((9, 8), TORCH_REFUSES, OK, TF_REFUSES, NP_REFUSES),
    "float6_e2m3fn": ((15, 6), TORCH_REFUSES, JAX_SUBBYTE, TB_PADDED_LEGACY, NP_REFUSES),
    "float6_e3m2fn": ((16, 6), TORCH_REFUSES, JAX_SUBBYTE, TB_PADDED_LEGACY, NP_REFUSES),
    "float4_e2m1fn": ((17, 4), TORCH_REFUSES, JAX_SUBBYTE, TB_PADDED_LEGACY, NP_REFUSES),
}


def consumers():
    out = {}
    try:
        import torch

        out["torch"] = (torch.from_dlpack, lambda y: y.data_ptr())
    except ImportError:
        pass
    try:
        import jax

        out["jax"] = (jax.dlpack.from_dlpack, lambda y: y.unsafe_buffer_pointer())
    except ImportError:
        pass
    try:
        import tensorflow as tf

        from frameworks import BY_NAME

        out["tensorflow"] = (lambda v: tf.experimental.dlpack.from_dlpack(v.__dlpack__()), BY_NAME["tensorflow"].ptr)
    except ImportError:
        pass
    out["numpy"] = (np.from_dlpack, lambda y: y.ctypes.data)
    return out


CONSUMERS = ["torch", "jax", "tensorflow", "numpy"]


@pytest.mark.parametrize("name", list(TABLE))
def test_asview_names_ml_dtype(tb, name):
    dt = getattr(ml_dtypes, name)
    a = aligned_numpy((8, 8), dt, fill=0)
    v = tb.asview(a)
    assert v.dtype == name
    assert v.ptr == a.ctypes.data
    assert v.itemsize == (2 if name == "bfloat16" else 1)
    code_bits = TABLE[name][0]
    info = read_capsule(v.__dlpack__(max_version=(1, 3)))
    assert info.dtype == (*code_bits, 1)
    assert bool(info.flags & FLAG_SUBBYTE_PADDED) == (code_bits[1] < 8)


@pytest.mark.parametrize("consumer", CONSUMERS)
@pytest.mark.parametrize("name", list(TABLE))
def test_ml_dtype_into_consumer(tb, name, consumer):
    cons = consumers()
    if consumer not in cons:
        pytest.skip(f"{consumer} absent")
    take, ptr = cons[consumer]
    dt = getattr(ml_dtypes, name)
    a = aligned_numpy((8, 8), dt, fill=np.arange(64).reshape(8, 8) % 4)
    v = tb.asview(a)
    expected = TABLE[name][1 + CONSUMERS.index(consumer)]
    if expected == OK and consumer == "jax" and JAX_0_4 and TABLE[name][0][0] in range(7, 15):
        # JAX 0.4 has no DLPack codes for the float8 family (XlaRuntimeError, a RuntimeError)
        expected = (RuntimeError, "invalid DLPack type code")
    if consumer == "numpy" and not NUMPY_DLPACK_VERSIONED and expected is NP_REFUSES and name.startswith(("float6", "float4")):
        # NumPy 2.0 and older ask for legacy capsules, which tensorbridge refuses for padded
        # sub-byte types before NumPy sees the dtype
        expected = TB_PADDED_LEGACY
    if expected == OK:
        y = take(v)
        assert ptr(y) == a.ctypes.data
        return
    exc, text = expected
    with pytest.raises(Exception, match=text) as info:
        take(v)
    assert (type(info.value).__name__ == exc) if isinstance(exc, str) else isinstance(info.value, exc)
    gc.collect()
    assert v.ptr == a.ctypes.data


@pytest.mark.parametrize("name", ["int4", "uint4", "int2", "uint2"])
def test_ml_int_subbyte_refused_cleanly(tb, name):
    """ml_dtypes' int4/int2 say only "<V1" (raw bytes): nothing names them, so refuse."""
    dt = getattr(ml_dtypes, name, None)
    if dt is None:
        pytest.skip(f"ml_dtypes has no {name}")
    with pytest.raises(ValueError, match="V1"):
        tb.asview(np.zeros(4, dt))


def test_bfloat16_from_numpy_is_shared_with_torch_both_ways(tb):
    torch = pytest.importorskip("torch")
    a = aligned_numpy((4,), ml_dtypes.bfloat16, fill=[1.5, 2.5, -3.0, 0.25])
    t = torch.from_dlpack(tb.asview(a))
    assert t.dtype == torch.bfloat16 and t.data_ptr() == a.ctypes.data
    t[0] = 42.5
    assert float(a[0]) == 42.5
    a[1] = -8
    assert t[1].item() == -8
