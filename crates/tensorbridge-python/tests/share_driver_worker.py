"""The CUDA driver through ctypes, and the other process of ``test_share_driver.py``.

``Driver`` allocates, copies and frees device memory with the driver API (``cuMemAlloc_v2``,
``cuMemcpyHtoD_v2``, ...) on device 0's primary context: the same calls work on a real
libcuda and on the stand-in (``crates/tensorbridge-cuda-standin``), so the tests need no
framework with CUDA.

Run as a script, this module is a worker: it reads one JSON command a line on stdin and
answers one JSON line on stdout (``{"ok": ...}`` or ``{"error": type, "message": ...}``).
``Worker`` is the test's side.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import subprocess
import sys
import time

import numpy as np

DRIVER_NAMES = ("libcuda.so.1", "libcuda.so")


class DriverError(RuntimeError):
    pass


def load_libcuda():
    """The loaded libcuda (the first of its names the loader finds), or the reason there is none."""
    errors = []
    for name in DRIVER_NAMES:
        try:
            return ctypes.CDLL(name), None
        except OSError as e:
            errors.append(f"{name}: {e}")
    return None, "; ".join(errors)


class Driver:
    """Device 0's primary context, current on the threads that call in."""

    def __init__(self, lib):
        self.lib = lib
        self.check(lib.cuInit(0), "cuInit")
        dev = ctypes.c_int()
        self.check(lib.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
        self.ctx = ctypes.c_void_p()
        self.check(lib.cuDevicePrimaryCtxRetain(ctypes.byref(self.ctx), dev), "cuDevicePrimaryCtxRetain")
        name = ctypes.create_string_buffer(256)
        self.check(lib.cuDeviceGetName(name, 256, dev), "cuDeviceGetName")
        self.name = name.value.decode(errors="replace")
        self.bind()

    @property
    def standin(self) -> bool:
        return self.name.startswith("tensorbridge stand-in")

    def check(self, rc: int, call: str):
        if rc != 0:
            raise DriverError(f"{call} failed with CUresult {rc}")

    def bind(self):
        """Makes the context current on the calling thread (driver calls need one)."""
        self.check(self.lib.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")

    def alloc(self, nbytes: int) -> int:
        self.bind()
        ptr = ctypes.c_uint64()
        self.check(self.lib.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(nbytes)), "cuMemAlloc_v2")
        return ptr.value

    def free(self, ptr: int):
        self.bind()
        self.check(self.lib.cuMemFree_v2(ctypes.c_uint64(ptr)), "cuMemFree_v2")

    def alloc_async(self, nbytes: int) -> int:
        """Memory of the device's stream-ordered pool (``cuMemAllocAsync`` on the legacy
        default stream, then synchronized)."""
        self.bind()
        ptr = ctypes.c_uint64()
        self.check(
            self.lib.cuMemAllocAsync(ctypes.byref(ptr), ctypes.c_size_t(nbytes), ctypes.c_void_p(0)),
            "cuMemAllocAsync",
        )
        self.check(self.lib.cuCtxSynchronize(), "cuCtxSynchronize")
        return ptr.value

    def free_async(self, ptr: int):
        self.bind()
        self.check(self.lib.cuMemFreeAsync(ctypes.c_uint64(ptr), ctypes.c_void_p(0)), "cuMemFreeAsync")
        self.check(self.lib.cuCtxSynchronize(), "cuCtxSynchronize")

    def write(self, ptr: int, values) -> None:
        a = np.ascontiguousarray(values, dtype=np.float32)
        self.bind()
        self.check(
            self.lib.cuMemcpyHtoD_v2(ctypes.c_uint64(ptr), ctypes.c_void_p(a.ctypes.data), ctypes.c_size_t(a.nbytes)),
            "cuMemcpyHtoD_v2",
        )
        # A copy from pageable memory returns once the bytes are staged, before they land in
        # device memory: another process reading now could read the old values.
        self.check(self.lib.cuCtxSynchronize(), "cuCtxSynchronize")

    def read(self, ptr: int, n: int) -> np.ndarray:
        out = np.empty(n, dtype=np.float32)
        self.bind()
        self.check(
            self.lib.cuMemcpyDtoH_v2(ctypes.c_void_p(out.ctypes.data), ctypes.c_uint64(ptr), ctypes.c_size_t(out.nbytes)),
            "cuMemcpyDtoH_v2",
        )
        return out


def driver_or_skip():
    """The loaded CUDA driver (the real one or the stand-in), or a pytest skip saying why
    there is none (a failure when ``TB_REQUIRE_DRIVER=1``, as CI's stand-in step sets)."""
    import pytest

    lib, why = load_libcuda()
    reason = None
    if lib is None:
        reason = f"no libcuda loads ({why})"
    else:
        try:
            return Driver(lib)
        except Exception as e:  # noqa: BLE001 - a driver without a device, say
            reason = f"the CUDA driver does not initialise: {e}"
    if os.environ.get("TB_REQUIRE_DRIVER") == "1":
        pytest.fail(f"TB_REQUIRE_DRIVER=1, but {reason}")
    pytest.skip(f"{reason}: these tests need a CUDA driver, the real one or the stand-in (`cargo xtask test-standin`)")


def workers_of(cls):
    """A fixture's body: hands the test a function that starts a worker of ``cls``, and
    closes every worker it started once the test is over."""
    workers = []

    def start():
        w = cls()
        workers.append(w)
        return w

    yield start
    for w in workers:
        w.close()


class Allocation:
    """``n`` float32 of device memory holding ``0, 1, 2, ...``, as a ``from_ptr`` view whose
    ``release`` frees it and counts its calls."""

    def __init__(self, tb, drv: Driver, n: int):
        self.drv = drv
        self.n = n
        self.ptr = drv.alloc(4 * n)
        drv.write(self.ptr, np.arange(n, dtype=np.float32))
        self.released = 0

    def release(self):
        self.released += 1
        self.drv.free(self.ptr)

    def view(self, tb):
        return tb.from_ptr(self.ptr, (self.n,), "float32", device="cuda:0", release=self.release)


class Worker:
    """This module as a script in a fresh interpreter (the environment's, with the caller's
    ``PYTHONPATH``, so the same wheel), driven a command at a time."""

    def __init__(self):
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def call(self, op: str, **args):
        try:
            self.proc.stdin.write(json.dumps(dict(op=op, **args)) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(30)
            raise RuntimeError(f"the worker exited ({self.proc.returncode}) during {op}: {self.proc.stderr.read()}")
        reply = json.loads(line)
        if "error" in reply:
            raise WorkerError(reply["error"], reply["message"])
        return reply["ok"]

    def close(self):
        if self.proc.poll() is None:
            try:
                self.call("exit")
            except Exception:  # noqa: BLE001 - it may be gone already
                pass
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def kill(self):
        self.proc.kill()
        self.proc.wait()


class WorkerError(Exception):
    def __init__(self, kind: str, message: str):
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message


def answer(ops) -> None:
    """Answers the test's JSON commands, one a line on stdin, until ``exit`` (or the end):
    ``{"op": name, ...}`` runs ``ops[name](...)``; the reply line is ``{"ok": result}`` or
    ``{"error": type, "message": text}``."""
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd.pop("op")
        if op == "exit":
            break
        try:
            reply = {"ok": ops[op](**cmd)}
        except Exception as e:  # noqa: BLE001 - every failure goes back to the test
            reply = {"error": type(e).__name__, "message": str(e)}
        sys.stdout.write(json.dumps(reply) + "\n")
        sys.stdout.flush()


def serve():
    import tensorbridge as tb

    lib, why = load_libcuda()
    drv = Driver(lib) if lib is not None else None
    state = {}

    def open_(handle):
        state["view"] = tb.open(bytes.fromhex(handle))
        return list(state["view"].shape)

    def read(index, count):
        v = state["view"]
        return drv.read(v.ptr + 4 * index, count).tolist()

    def write(index, values):
        drv.write(state["view"].ptr + 4 * index, values)
        return True

    def span(handle):
        # Opens a (possibly altered) handle; when the open succeeds, whether the view's first
        # and last bytes lie in one allocation the driver knows (cuMemGetAddressRange_v2).
        v = tb.open(bytes.fromhex(handle))
        try:
            if v.size == 0:
                return True
            lo = hi = v.ptr
            for n, st in zip(v.shape, v.byte_strides):
                if st < 0:
                    lo += (n - 1) * st
                else:
                    hi += (n - 1) * st
            hi += v.itemsize - 1
            ranges = []
            for addr in (lo, hi):
                base, size = ctypes.c_uint64(), ctypes.c_size_t()
                drv.bind()
                rc = drv.lib.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(addr))
                if rc != 0:
                    return False
                ranges.append((base.value, size.value))
            return ranges[0] == ranges[1]
        finally:
            del v
            gc.collect()

    def drop():
        state.clear()
        gc.collect()
        return True

    def share(n):
        a = Allocation(tb, drv, n)
        state["alloc"] = a
        state["handle"] = tb.share(a.view(tb), consumers=1)
        return bytes(state["handle"]).hex()

    def become(uid):
        # After tensorbridge and the driver are loaded (their files may be unreadable to
        # that user): only what the share itself checks stands between the users.
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
        return os.getuid()

    ops = dict(
        span=span,
        open=open_, read=read, write=write, drop=drop, share=share, become=become, ready=lambda: why or drv.name
    )
    answer(ops)
    # What this process still holds goes back before it exits (its device work is done).
    state.clear()
    gc.collect()
    time.sleep(0.05)


if __name__ == "__main__":
    serve()
