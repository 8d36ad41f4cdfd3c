"""tensorbridge as the first CUDA call of a process: every entry initialises the driver
before it asks it anything (saving the caller's context used to call ``cuCtxGetCurrent``
first, which fails with ``CUDA_ERROR_NOT_INITIALIZED`` in a fresh process). Each case runs in
a fresh interpreter, where nothing else touched CUDA before.
"""

import subprocess
import sys

import pytest

pytest.importorskip("tensorbridge_example", reason="the example extension is not built")


def run_fresh(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )


def test_ramp_is_a_processes_first_cuda_call():
    out = run_fresh(
        "import tensorbridge_example as ex\n"
        "v = ex.ramp(8)\n"
        "print(v.ptr != 0, tuple(v.shape), str(v.dtype))\n"
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.split() == ["True", "(8,)", "float32"], out.stdout + out.stderr


def test_from_ptr_checks_a_pointer_as_the_first_cuda_call():
    # The driver-checked pointer path: the first CUDA call is tensorbridge's pointer query,
    # which must say "not a CUDA allocation", not "not initialized".
    out = run_fresh(
        "import tensorbridge as tb\n"
        "try:\n"
        "    tb.from_ptr(0x1000, (4,), 'float32', device='cuda:0', owner=object())\n"
        "except Exception as e:\n"
        "    print(type(e).__name__, e)\n"
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "NOT_INITIALIZED" not in out.stdout + out.stderr, out.stdout + out.stderr
    assert "not a CUDA allocation" in out.stdout, out.stdout + out.stderr
