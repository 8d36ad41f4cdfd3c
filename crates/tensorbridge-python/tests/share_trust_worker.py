"""The other process of ``test_share_trust.py``: ``share_driver_worker``'s worker with opens
kept side by side (an edited handle is opened while the genuine one is held) and each view's
extent reported, so the test can check that no view reaches outside the allocation shared.

Run as a script it serves one JSON command a line, as ``share_driver_worker`` does.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import time

from share_driver_worker import Allocation, Driver, Worker, answer, load_libcuda


class TrustWorker(Worker):
    """This module as a script in a fresh interpreter, driven a command at a time."""

    def __init__(self):  # noqa: D107 - the base class's, with this script
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )


def extent(view) -> tuple[int, int] | None:
    """The bytes ``[lo, hi)`` a view's elements cover; ``None`` for a view without elements."""
    cai = view.__cuda_array_interface__
    ptr = cai["data"][0]
    shape = cai["shape"]
    item = int(cai["typestr"][2:])
    strides = cai.get("strides")
    if strides is None:
        strides, step = [], item
        for n in reversed(shape):
            strides.insert(0, step)
            step *= n
    if any(n == 0 for n in shape):
        return None
    lo = ptr + sum(min(0, (n - 1) * s) for n, s in zip(shape, strides))
    hi = ptr + sum(max(0, (n - 1) * s) for n, s in zip(shape, strides)) + item
    return lo, hi


def serve():
    import tensorbridge as tb

    lib, why = load_libcuda()
    drv = Driver(lib) if lib is not None else None
    views = []
    state = {}

    def open_keep(handle):
        v = tb.open(bytes.fromhex(handle))
        views.append(v)
        span = extent(v)
        return None if span is None else list(span)

    def drop_last():
        views.pop()
        gc.collect()
        return True

    def drop():
        views.clear()
        gc.collect()
        return True

    def read(index, count):
        return drv.read(views[-1].__cuda_array_interface__["data"][0] + 4 * index, count).tolist()

    def share(n):
        a = Allocation(tb, drv, n)
        state["alloc"] = a
        state["handle"] = tb.share(a.view(tb), consumers=0)
        return bytes(state["handle"]).hex()

    ops = dict(open_keep=open_keep, drop_last=drop_last, drop=drop, read=read, share=share, ready=lambda: why or drv.name)
    answer(ops)
    views.clear()
    state.clear()
    gc.collect()
    time.sleep(0.05)


if __name__ == "__main__":
    serve()
