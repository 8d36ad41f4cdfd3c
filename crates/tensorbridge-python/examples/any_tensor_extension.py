"""Recipe: a Rust extension function that takes any framework's tensor (Python side).

The Rust side (docs/COOKBOOK.md; built as crates/tensorbridge-example) declares its
argument as `tensorbridge_pyo3::AnyTensor`; PyO3 then runs `tensorbridge_pyo3::import` on whatever Python passes: the DLPack C exchange API
(PyTorch), `__dlpack__`, a DLPack capsule, the CUDA Array Interface, NumPy's array interface
or the buffer protocol, zero-copy, keeping the producer alive for as long as Rust holds the
tensor. `tensorbridge.asview` is the same import, exposed to Python, so this script runs the
recipe's Python side against it when the compiled example extension is not installed:

- with the example extension (module `tensorbridge_example`, function `total(x) -> float`,
  built by `cargo xtask ci`): the real Rust function is called;
- without it: `total` below is the stand-in, doing in Python what the Rust function does.

    python any_tensor_extension.py
"""

import importlib

import numpy as np

import tensorbridge as tb


def total_standin(x):
    """What the Rust `total(x: AnyTensor) -> f32` does: view, check, read, no copy."""
    v = tb.asview(x)  # = tensorbridge_pyo3::import(x)
    if v.device != "cpu" or v.dtype != "float32":
        raise TypeError(f"expected a float32 host tensor, found {v.dtype} on {v.device}")
    return float(np.asarray(v).sum(dtype=np.float64))


def get_total():
    try:
        return importlib.import_module("tensorbridge_example").total, "rust"
    except ImportError:
        return total_standin, "python stand-in"


def inputs():
    """The same 2x3 float32 values from every producer present."""
    import array

    base = np.arange(6, dtype=np.float32).reshape(2, 3)
    out = {
        "numpy": base.copy(),
        "numpy (transposed view)": base.T,
        "buffer protocol (array.array)": array.array("f", base.ravel()),
        "DLPack capsule": base.copy().__dlpack__(),
    }
    for name in ("torch", "jax", "tensorflow"):
        try:
            mod = importlib.import_module(name)
        except ImportError:
            continue
        if name == "torch":
            out["torch"] = mod.from_numpy(base.copy())
        elif name == "jax":
            out["jax"] = mod.device_put(base, mod.devices("cpu")[0])
        else:
            out["tensorflow"] = mod.constant(base)
    return out


def main(device=None):
    total, impl = get_total()
    results = {}
    for name, x in inputs().items():
        results[name] = total(x)
        print(f"total({name}) = {results[name]}   [{impl}]")
    assert all(r == 15.0 for r in results.values()), results
    try:
        total(np.zeros(3, np.int64))
    except TypeError as e:
        print("wrong dtype refused:", e)
    return results


if __name__ == "__main__":
    main()
