"""The cookbook's recipes (``examples/``), each run here on the host; their GPU variants run
in ``gpu/test_gpu_cookbook.py``. Each recipe asserts its own claims (zero-copy, released once,
refusals); these tests run them and check what they return.
"""

import importlib
import os
import subprocess
import sys

import pytest

from tbhelpers import NUMPY_DLPACK_VERSIONED, needs_numpy_dlpack_1

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
if EXAMPLES not in sys.path:
    sys.path.insert(0, EXAMPLES)


def recipe(name):
    return importlib.import_module(name)


def test_torch_from_raw_pointer_host():
    pytest.importorskip("torch")
    r = recipe("torch_from_cuda_ptr").main("cpu")
    assert r["device"] == "cpu" and r["released"] == 1


@needs_numpy_dlpack_1
def test_array_over_c_library_memory_host():
    r = recipe("cupy_over_c_memory").main("cpu")
    assert r["device"] == "cpu" and r["sum"] == sum(range(256 * 256))


def test_tensorflow_tensor_pointer():
    pytest.importorskip("tensorflow")
    r = recipe("tf_device_pointer").main("cpu")
    assert r["device"] == "cpu" and r["ptr"] != 0


def test_extension_function_taking_any_tensor():
    mod = recipe("any_tensor_extension")
    _, impl = mod.get_total()
    if _present("tensorbridge_example"):
        assert impl == "rust"  # the compiled recipe (crate tensorbridge-example), not the stand-in
    r = mod.main()
    # every producer present reached the function, zero-copy, with the same values
    expected = {"numpy", "numpy (transposed view)", "buffer protocol (array.array)", "DLPack capsule"}
    for name in ("torch", "jax", "tensorflow"):
        try:
            importlib.import_module(name)
            expected.add(name)
        except ImportError:
            pass
    assert set(r) == expected
    assert all(v == 15.0 for v in r.values())


def test_cudarc_recipe_says_what_it_needs_on_the_host():
    """GPU-only (cudarc allocates on device 0): on the host the script says why it cannot run
    (exit 2 without the example extension, 3 without a GPU); the recipe itself runs in
    gpu/test_gpu_cookbook.py."""
    try:
        importlib.import_module("tensorbridge_example")
        want = (3, "needs a CUDA GPU")
    except ImportError:
        want = (2, "tensorbridge_example")
    if recipe("_cmem").cuda_available():
        pytest.skip("a GPU is present: gpu/test_gpu_cookbook.py runs the recipe")
    r = subprocess.run([sys.executable, os.path.join(EXAMPLES, "cudarc_to_torch.py")],
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == want[0], (r.returncode, r.stdout, r.stderr)
    assert want[1] in r.stderr


def test_example_extension_without_a_gpu_is_a_clean_error():
    """The compiled recipe's ramp() on a machine with no CUDA driver: RuntimeError, no panic."""
    ext = pytest.importorskip("tensorbridge_example")
    if recipe("_cmem").cuda_available():
        pytest.skip("a GPU is present")
    with pytest.raises(RuntimeError, match="(?i)cuda"):
        ext.ramp(4)


def test_example_extension_errors_map_through_the_crate_error():
    """The compiled recipes return ``Result<_, tensorbridge_pyo3::Error>``: ``?`` on a core
    error raises the exception and message the crate's one mapping gives, not a hand-made
    one."""
    ext = pytest.importorskip("tensorbridge_example")
    import numpy as np

    assert ext.total(np.arange(6, dtype=np.float32)) == 15.0
    with pytest.raises(TypeError, match="dtype mismatch: expected float32, found int32"):
        ext.total(np.arange(6, dtype=np.int32))
    with pytest.raises(TypeError, match="cannot view an object of type"):
        ext.total(object())


def test_own_kernel_without_a_gpu_is_a_clean_error():
    """The compiled kernel recipe (axpy) on host tensors: a ValueError naming the device
    (kernels take CUDA memory), never a panic; on a machine without a driver the same."""
    ext = pytest.importorskip("tensorbridge_example")
    np = pytest.importorskip("numpy")
    x = np.ones(4, np.float32)
    y = np.zeros(4, np.float32)
    with pytest.raises(ValueError, match="memory on cpu cannot be passed to a CUDA kernel"):
        ext.axpy(2.0, x, y)
    assert (y == 0).all()
    with pytest.raises(TypeError):
        ext.axpy(2.0, object(), y)


def test_own_kernel_recipe_says_what_it_needs_on_the_host():
    try:
        importlib.import_module("tensorbridge_example")
        want = (3, "needs a CUDA GPU")
    except ImportError:
        want = (2, "tensorbridge_example")
    if recipe("_cmem").cuda_available():
        pytest.skip("a GPU is present: gpu/test_gpu_cookbook.py runs the recipe")
    r = subprocess.run([sys.executable, os.path.join(EXAMPLES, "torch_own_kernel.py")],
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == want[0], (r.returncode, r.stdout, r.stderr)
    assert want[1] in r.stderr


def test_demo_host_table():
    demo = recipe("demo")
    import io

    out = io.StringIO()
    ok, rows = demo.run("cpu", 256, calls=5, warmup=1, out=out)
    text = out.getvalue()
    print(text)
    assert ok, text
    present = [m for m in ("numpy", "torch", "jax", "tensorflow") if _present(m)]
    consumers = {r["consumer"] for r in rows}
    producers = {r["producer"] for r in rows}
    for m in present:
        assert m in consumers and m in producers, (m, consumers, producers)
    assert all(r.get("ptr") is True or r.get("refused") for r in rows), text
    # Immutable producers (JAX, TensorFlow) come out read-only, and go to consumers that ask
    # for a legacy capsule as they would themselves (jax -> jax, jax -> tensorflow pass).
    # Refused only what the producer refuses directly: NumPy before 2.1 asks for legacy
    # capsules, and the demo's NumPy producer (a DLPack import of the shared buffer) is
    # read-only there, which NumPy refuses to export to a legacy consumer.
    for r in rows:
        if r.get("refused"):
            assert r["producer"] == "numpy" and not NUMPY_DLPACK_VERSIONED, r
    for pair in (("jax", "jax"), ("jax", "tensorflow"), ("tensorflow", "jax")):
        row = next((r for r in rows if (r["producer"], r["consumer"]) == pair), None)
        if row is not None:
            assert row.get("ptr") is True, row
    assert "released 1 time(s)" in text


def test_demo_cli_degrades_without_frameworks():
    """Runs as `cargo xtask demo` would, with JAX and TensorFlow hidden: rows skipped, exit 0."""
    code = (
        "import sys; sys.modules['jax'] = None; sys.modules['tensorflow'] = None\n"
        f"sys.path.insert(0, {EXAMPLES!r}); import demo\n"
        "sys.exit(demo.main(['--device', 'cpu', '--calls', '3', '--warmup', '1']))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    # with whatever else this environment lacks (torch, on CPython 3.9)
    missing = [m for m in ("numpy", "torch", "jax", "tensorflow") if m in ("jax", "tensorflow") or not _present(m)]
    assert f"skipped (not installed): {', '.join(missing)}" in r.stdout


def _present(m):
    try:
        importlib.import_module(m)
        return True
    except ImportError:
        return False


def test_tensor_from_another_process_says_why_not_on_the_host():
    """GPU-only (CUDA IPC); its GPU run is in gpu/test_gpu_cookbook.py."""
    r = recipe("tensor_from_another_process").main("cpu")
    assert r == {"skipped": "no CUDA GPU"}
