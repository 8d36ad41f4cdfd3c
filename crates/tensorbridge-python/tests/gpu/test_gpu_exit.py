"""Interpreter exit with CUDA work in flight: daemon threads inside every GIL-released CUDA
path, and the reaper releasing Python owners, while the interpreter finalises.

The CPU half (host copies, ``share``/``open`` refused) is ``../test_exit.py``, which says
why: CPython 3.13 and older end a daemon thread that asks for the GIL during finalisation
with ``pthread_exit``, and that must never happen under our frames. Here the main thread
queues about two seconds of GPU work (``torch.cuda._sleep``) before it starts the threads,
so every thread is inside a GIL-released wait of tensorbridge's (a copy to the host, a device
copy the host waits for, a host wait for pinned memory, an IPC export and open) or has views
retiring on the busy stream (released by the reaper thread, which takes the GIL) when the
program ends. Every child must exit with status 0, twice.

The threads call tensorbridge only: PyTorch's own bindings release the GIL around every
operator, and a daemon thread inside one of those at exit is ended inside PyTorch's C++
frames (SIGABRT, "terminate called without an active exception"), with or without
tensorbridge in the process. That is PyTorch's exit, not this library's, so the GPU work is
queued by the main thread before the threads start.
"""

import importlib.util

import pytest

from tbhelpers import run_isolated

RUNS = 2
THREADS = 8

CHILD = """
import sys, threading, time
import numpy as np
import torch
import tensorbridge as tb

LONG = 4_000_000_000  # GPU clock cycles: about two seconds of queued work
x = torch.ones(1 << 22, device="cuda")
torch.cuda.synchronize()

def queue():
    torch.cuda._sleep(LONG)

{setup}

step()  # first use (context, modules) outside the threads
torch.cuda.synchronize()
queue()  # the work in flight at exit, queued before any thread starts
threads = {threads}
running = threading.Barrier(threads + 1)

def loop():
    running.wait()
    while True:
        try:
            step()
        except (ValueError, RuntimeError, BufferError):
            pass

for _ in range(threads):
    threading.Thread(target=loop, daemon=True).start()
running.wait()
time.sleep(0.1)

class Busy:
    def __del__(self):
        end = time.monotonic() + 0.3
        while time.monotonic() < end:
            pass

busy = Busy()
print("main done", flush=True)
"""

PATHS = {
    # Device to host copy, ordered after the queued work: the host waits, GIL released.
    "copy_to_host": """
def step():
    tb.asview(x).__dlpack__(dl_device=(1, 0), copy=True)
""",
    # A device copy the host waits for (no consumer stream).
    "copy_on_device": """
def step():
    tb.asview(x).__dlpack__(copy=True)
""",
    # Pinned memory still being written by a busy stream: NumPy's read waits on the host,
    # GIL released.
    "pinned_host_wait": """
h = torch.zeros(1 << 20, pin_memory=True)
s = torch.cuda.Stream()
def queue():
    with torch.cuda.stream(s):
        torch.cuda._sleep(LONG)
        h.copy_(x[: 1 << 20], non_blocking=True)
def step():
    v = tb.from_ptr(h.data_ptr(), (1 << 20,), "float32", device="cuda_host", owner=h,
                    producer_stream=s.cuda_stream)
    np.asarray(v)
""",
    # A share and an open of it in this process (the producer's own tensor comes back).
    "share_and_open": """
def step():
    h = tb.share(x, consumers=0)
    tb.open(h)
""",
    # Device copies onto a consumer stream, the host not waiting: each copy's source is
    # kept until the busy stream has passed it, then released by the reaper (which takes
    # the GIL from its own thread), while the interpreter finalises.
    "reaper_releases": """
s = torch.cuda.Stream()
sp = s.cuda_stream
def step():
    c = tb.asview(x).__dlpack__(stream=sp, copy=True)
    del c
""",
}

# A process that used JAX and torch and had a kernel call refused (aliasing outputs): once
# ended with SIGABRT at exit.
if importlib.util.find_spec("tensorbridge_example") and importlib.util.find_spec("jax"):
    PATHS["refused_kernel_call_with_jax"] = """
import jax.numpy as jnp
import tensorbridge_example as ext
j = jnp.ones(1024)
ext.axpy(1.0, torch.zeros(4, device="cuda"), torch.zeros(4, device="cuda"))
def step():
    try:
        ext.axpy(2.0, x, x)  # refused: the output overlaps the input
    except ValueError:
        pass
    try:
        ext.axpy(2.0, j, x[:1024])  # a JAX input (refused where JAX runs on the CPU)
    except Exception:
        pass
"""


# The import alone (PyTorch's methods release the GIL under our frames): ended with SIGABRT
# on two H200s, every run, before the import ran under the exit gate; so did every path whose
# step imports a CUDA tensor without a long GIL-released wait after it.
PATHS["import_only"] = """
def step():
    tb.asview(x)
"""


@pytest.mark.parametrize("path", sorted(PATHS))
def test_daemon_threads_with_cuda_work_in_flight_at_exit(path):
    pytest.importorskip("torch")
    code = CHILD.format(setup=PATHS[path], threads=THREADS)
    for run in range(RUNS):
        r = run_isolated(code, timeout=120)
        assert r.returncode == 0, (
            f"{path}, run {run + 1}: the interpreter exited with {r.returncode} "
            f"(a negative code is the signal that killed it)\n"
            f"stdout: {r.stdout[-2000:]}\nstderr: {r.stderr[-4000:]}"
        )
        assert "main done" in r.stdout
