"""Interpreter exit with daemon threads inside tensorbridge's GIL-released calls.

CPython 3.13 and older end a daemon thread that asks for the GIL once finalisation has begun
with ``pthread_exit``: a forced unwind through the thread's frames. A thread inside one of our
calls that release the GIL (copies, ``share``, ``open``) asks for it back when its work ends,
so before the fix it was ended under Rust frames and the process died at exit (SIGSEGV where
the module carried a second unwinder, SIGABRT where Rust met the forced unwind). The module
now never takes the GIL back once the exit has begun (``tensorbridge_pyo3``'s ``ffi::exit``),
and links one unwinder.

Each case runs a child interpreter whose daemon threads loop in one GIL-released path, keeps
the interpreter busy in Python code during finalisation (as libraries' finalisers do, so the
threads' work ends while CPython finalises), and asserts a clean exit, several times. The CUDA
paths with real work in flight are ``gpu/test_gpu_exit.py``.
"""

import importlib.util

import pytest

from tbhelpers import run_isolated

RUNS = 2
THREADS = 16

# The child: ``SETUP`` defines ``step()``, one call through the path under test; THREADS
# daemon threads run it in a loop; the main thread returns once they all run, and a finaliser
# that runs Python code for 0.3 s during module teardown keeps finalisation going while the
# threads' calls end.
CHILD = """
import sys, threading, time
import numpy as np
import tensorbridge as tb

{setup}

threads = {threads}
running = threading.Barrier(threads + 1)

def loop():
    running.wait()
    while True:
        try:
            step()
        except (ValueError, RuntimeError):
            pass

for _ in range(threads):
    threading.Thread(target=loop, daemon=True).start()
running.wait()
time.sleep(0.05)

class Busy:
    def __del__(self):
        end = time.monotonic() + 0.3
        while time.monotonic() < end:
            pass

busy = Busy()
print("main done", flush=True)
"""


PATHS = {
    # The host copy of a strided view (the gather), GIL released.
    "dlpack_copy_strided": """
v = tb.asview(np.ones(4 << 20, dtype=np.uint8)[::2])
def step():
    v.__dlpack__(copy=True)
""",
    # The host copy of a contiguous view (one memcpy), GIL released.
    "dlpack_copy_contiguous": """
v = tb.asview(np.ones(2 << 20, dtype=np.uint8))
def step():
    v.__dlpack__(copy=True)
""",
    # A copy asked for by device: the same host copy through `dl_device`.
    "dlpack_copy_to_cpu_device": """
v = tb.asview(np.ones((1024, 2048), dtype=np.uint8)[:, ::2])
def step():
    v.__dlpack__(dl_device=(1, 0), copy=True)
""",
    # `share`: the export runs with the GIL released (host memory is refused there, inside).
    "share": """
a = np.ones(1024, dtype=np.float32)
def step():
    tb.share(a)
""",
}

# `open` of a well-formed handle runs the import with the GIL released; without a driver it
# is refused inside, with one it is refused for the GPU it names (no such UUID).
PATHS["open"] = """
from test_share import encode, spec
h = tb.Handle(encode(spec()))
def step():
    tb.open(h)
"""

# The PyTorch import asks the tensor questions through PyTorch's methods (`is_neg`,
# `requires_grad`), whose bindings release the GIL around their work: a daemon thread ended
# inside one at exit unwinds through PyTorch's C++ frames and the C++ runtime aborts the
# process ("terminate called without an active exception"; every run, before the import ran
# under the exit gate).
if importlib.util.find_spec("torch"):
    PATHS["torch_import"] = """
import torch
x = torch.ones(1024)
def step():
    tb.asview(x)
"""


@pytest.mark.parametrize("path", sorted(PATHS))
def test_daemon_threads_inside_a_gil_released_call_at_exit(path):
    code = CHILD.format(setup=PATHS[path], threads=THREADS)
    for run in range(RUNS):
        r = run_isolated(code, timeout=60)
        assert r.returncode == 0, (
            f"{path}, run {run + 1}: the interpreter exited with {r.returncode} "
            f"(a negative code is the signal that killed it)\n"
            f"stdout: {r.stdout[-2000:]}\nstderr: {r.stderr[-4000:]}"
        )
        assert "main done" in r.stdout


def test_a_copy_after_the_exit_began_still_works():
    """An exit function registered after tensorbridge's import runs before the module's own:
    a copy there (GIL released as usual) is right. One registered before the import runs
    after it: the copy then keeps the GIL, and is right too."""
    code = """
import atexit
import numpy as np

def copy_and_check(tag):
    v = tb.asview(np.arange(1 << 20, dtype=np.int64)[::3])
    out = np.asarray(tb.asview(v.__dlpack__(copy=True)))
    assert (out == np.arange(1 << 20, dtype=np.int64)[::3]).all(), tag
    print(tag, "ok", flush=True)

atexit.register(copy_and_check, "after")   # registered first: runs last
import tensorbridge as tb
atexit.register(copy_and_check, "before")  # registered last: runs first
"""
    r = run_isolated(code, timeout=60)
    assert r.returncode == 0, r.stderr[-4000:]
    assert r.stdout.split() == ["before", "ok", "after", "ok"], r.stdout


def test_a_forked_child_exits_without_waiting_for_its_parents_threads():
    """A fork while other threads are inside a GIL-released call: the child has none of them,
    and its exit must not wait for them (the counts are forgotten at fork)."""
    code = """
import os, threading, time
import numpy as np
import tensorbridge as tb

v = tb.asview(np.ones(8 << 20, dtype=np.uint8)[::2])
def loop():
    while True:
        v.__dlpack__(copy=True)
for _ in range(4):
    threading.Thread(target=loop, daemon=True).start()
time.sleep(0.05)
start = time.monotonic()
pid = os.fork()
if pid == 0:
    raise SystemExit(0)  # a normal exit: threading's shutdown, the exit functions, finalisation
_, status = os.waitpid(pid, 0)
took = time.monotonic() - start
print(os.waitstatus_to_exitcode(status), round(took, 2), flush=True)
"""
    r = run_isolated(code, timeout=60)
    assert r.returncode == 0, r.stderr[-4000:]
    status, took = r.stdout.split()
    assert status == "0", r.stdout
    # The exit's patience is 1 s; a child that waited for threads it does not have would
    # take at least that.
    assert float(took) < 0.9, r.stdout


def test_the_exit_waits_for_a_copy_in_flight():
    """A daemon thread inside a host copy (about 0.1 s) when the program ends: the exit waits
    for the copy (up to 1 s), and the thread gets its result and runs on until finalisation.
    Without the wait, the thread would be ended inside the call when it asks for the GIL."""
    code = """
import os, threading
import numpy as np
import tensorbridge as tb

v = tb.asview(np.ones(32 << 20, dtype=np.uint8)[::2])
v.__dlpack__(copy=True)  # first use outside the measured call
inside = threading.Event()

def work():
    inside.set()
    capsule = v.__dlpack__(copy=True)
    os.write(1, b"returned\\n")

threading.Thread(target=work, daemon=True).start()
inside.wait()
os.write(1, b"main done\\n")
"""
    for run in range(RUNS):
        r = run_isolated(code, timeout=60)
        assert r.returncode == 0, r.stderr[-4000:]
        assert r.stdout.split() == ["main", "done", "returned"], (run, r.stdout, r.stderr[-2000:])
