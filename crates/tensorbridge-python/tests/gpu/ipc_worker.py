"""The other process of the IPC GPU suite (``test_gpu_ipc.py``): a spawned consumer that
opens share handles with ``tb.open`` and uses them through a framework, on command.

``Worker`` is the parent's side: it starts a fresh interpreter (``multiprocessing``'s spawn
context, environment overrides applied for the child only), sends ``(op, args)`` over a pipe
and returns what the child's function ``op`` returned, or raises ``WorkerError`` with the
child's exception type, message and traceback. ``serve`` is the child's loop. Objects the
child keeps between calls live in ``STATE`` under the key the parent chose.
"""

from __future__ import annotations

import ctypes
import gc
import multiprocessing as mp
import os
import time

import numpy as np

STATE: dict = {}


class WorkerError(Exception):
    def __init__(self, kind, message, trace):
        super().__init__(f"{kind}: {message}\n--- in the worker ---\n{trace}")
        self.kind = kind
        self.message = message


class Worker:
    def __init__(self, env: dict | None = None, name: str = "consumer"):
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        saved = {k: os.environ.get(k) for k in (env or {})}
        os.environ.update(env or {})
        try:
            self.proc = ctx.Process(target=serve, args=(child,), name=f"tb-ipc-{name}", daemon=True)
            self.proc.start()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        child.close()
        self.call("ready", timeout=300)  # imports tensorbridge and initialises CUDA

    @property
    def pid(self) -> int:
        return self.proc.pid

    def call(self, op, *args, timeout=120):
        try:
            self.conn.send((op, args))
            if not self.conn.poll(timeout):
                raise TimeoutError(f"the worker did not answer {op} in {timeout} s")
            reply = self.conn.recv()
        except (EOFError, ConnectionError) as e:
            self.proc.join(5)
            raise WorkerError("WorkerDied", f"exit code {self.proc.exitcode} during {op}", repr(e)) from e
        if reply[0] == "ok":
            return reply[1]
        raise WorkerError(*reply[1:])

    def __getattr__(self, op):
        return lambda *args, **kw: self.call(op, *args, **kw)

    def kill(self):
        self.proc.kill()
        self.proc.join(30)

    def close(self):
        if self.proc.is_alive():
            try:
                self.conn.send(None)
                self.proc.join(60)
            except (BrokenPipeError, OSError):
                pass
        if self.proc.is_alive():
            self.kill()


def serve(conn):
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            STATE.clear()
            gc.collect()
            conn.close()
            return
        op, args = msg
        try:
            conn.send(("ok", globals()[op](*args)))
        except BaseException as e:  # noqa: BLE001 - every failure goes back to the parent
            import traceback

            conn.send(("err", type(e).__name__, str(e), traceback.format_exc()))


# --------------------------------------------------------------------------------------------
# the child's operations


def ready():
    """Imports tensorbridge and PyTorch (when present) and initialises CUDA, so that what the
    parent times next is not this process's start-up."""
    import tensorbridge  # noqa: F401

    from gpu_frameworks import cudart

    cudart().check(cudart().lib.cudaFree(None), "cudaFree(0)")  # the runtime's context
    try:
        import torch
    except ImportError:
        return os.getpid()
    torch.zeros(1, device="cuda").cpu()
    return os.getpid()


def _fw(name):
    from gpu_frameworks import BY_NAME

    return BY_NAME[name]


def _take(fw, v):
    """``v`` through the consumer framework ``fw`` (or, for ``from_ptr``, a second view made
    from its raw pointer and read through PyTorch)."""
    if fw == "from_ptr":
        import tensorbridge as tb
        import torch

        w = tb.from_ptr(v.ptr, v.shape, v.dtype_name, device=v.device, owner=v)
        return torch.from_dlpack(w)
    return _fw(fw).consume(v)


def _read(fw, v, y):
    if fw == "from_ptr":
        return y.cpu().numpy().copy()
    if fw == "jax":
        # A fresh JAX array: JAX treats arrays as immutable and may cache what it read.
        return _fw("jax").read(_fw("jax").consume(v))
    return _fw(fw).read(y)


def _sync():
    from gpu_frameworks import cudart

    cudart().check(cudart().lib.cudaDeviceSynchronize(), "cudaDeviceSynchronize")


def open_view(key, handle, fw, stream=None):
    """Opens ``handle``, takes it through ``fw``, and returns what it sees."""
    import tensorbridge as tb

    t0 = time.perf_counter()
    v = tb.open(handle, stream=stream)
    t_open = time.perf_counter() - t0
    y = _take(fw, v)
    STATE[key] = (fw, v, y)
    if fw == "from_ptr":
        ptr = y.data_ptr()
    else:
        ptr = _fw(fw).ptr(y)
    return {
        "zero_copy": ptr == v.ptr,
        "device": v.device,
        "shape": v.shape,
        "dtype": v.dtype_name,
        "readonly": v.readonly,
        "ptr": v.ptr,
        "values": _read(fw, v, y),
        "open_s": t_open,
    }


def read(key):
    fw, v, y = STATE[key]
    return _read(fw, v, y)


def write(key, index, value):
    """Writes through the framework (PyTorch for those that cannot write in place), waits for
    the device, and returns."""
    fw, v, y = STATE[key]
    if fw in ("torch", "cupy", "numba"):
        _fw(fw).write_flat(y, index, value)
    else:
        import torch

        torch.from_dlpack(v).view(-1)[index] = value
    _sync()


def drop(key):
    STATE.pop(key, None)
    gc.collect()


def open_error(handle, stream=None):
    """``None`` if ``tb.open`` succeeds (the view is dropped again), else (type, message)."""
    import tensorbridge as tb

    try:
        v = tb.open(handle, stream=stream)
    except Exception as e:  # noqa: BLE001
        return type(e).__name__, str(e)
    del v
    return None


def open_read_drop(handle, index):
    """One element of a share, then everything dropped: one iteration of the leak loop."""
    import tensorbridge as tb
    import torch

    v = tb.open(handle)
    value = float(torch.from_dlpack(v)[index].item())
    del v
    return value


def busy_open(key, handle):
    """Opens on a non-blocking stream of PyTorch's and copies at once, without waiting:
    returns how long ``tb.open`` kept the host."""
    import tensorbridge as tb
    import torch

    cs = torch.cuda.Stream()
    t0 = time.perf_counter()
    v = tb.open(handle, stream=cs.cuda_stream)
    t_open = time.perf_counter() - t0
    with torch.cuda.stream(cs):
        z = torch.from_dlpack(v).clone()
    STATE[key] = (cs, v, z)
    return t_open


def unordered_open(key, handle):
    """The control: the same copy through the raw pointer (``from_ptr`` with no producer
    stream: nothing to wait for), on a non-blocking stream."""
    import tensorbridge as tb
    import torch

    v = tb.open(handle)  # its wait goes to the legacy default stream, which cs ignores
    w = tb.from_ptr(v.ptr, v.shape, v.dtype_name, device=v.device, owner=v)
    cs = torch.cuda.Stream()
    with torch.cuda.stream(cs):
        z = torch.from_dlpack(w).clone()
    STATE[key] = (cs, v, z)
    return None


def finish(key):
    cs, v, z = STATE.pop(key)
    cs.synchronize()
    return z.cpu().numpy()


def open_on_stream(key, handle):
    """Opens on a non-blocking stream of PyTorch's (the stream its release is ordered on) and
    keeps the view; returns the values read there."""
    import tensorbridge as tb
    import torch

    cs = torch.cuda.Stream()
    v = tb.open(handle, stream=cs.cuda_stream)
    with torch.cuda.stream(cs):
        values = torch.from_dlpack(v).cpu().numpy()
    STATE[key] = (cs, v)
    return values


def read_then_drop_while_busy(key, cycles):
    """Keeps the device reading the share for a while (a sleep, then a copy, on the stream it
    was opened on), drops every reference at once, and returns the copy when it is done: the
    producer must not get its memory back before the copy has run."""
    import torch

    cs, v = STATE.pop(key)
    with torch.cuda.stream(cs):
        t = torch.from_dlpack(v)
        torch.cuda._sleep(cycles)
        z = t.clone()
    del v, t
    gc.collect()
    cs.synchronize()
    return z.cpu().numpy()


def torch_cycles(ms):
    """Clock cycles ``torch.cuda._sleep`` spins for about ``ms`` on this GPU."""
    import torch

    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1000)
    s.record()
    torch.cuda._sleep(20_000_000)
    e.record()
    e.synchronize()
    return int(20_000_000 / s.elapsed_time(e) * ms)


def hold(key, handle):
    """Opens and keeps: for the killed-consumer test."""
    import tensorbridge as tb

    STATE[key] = tb.open(handle)
    return STATE[key].device


def free_device_bytes():
    from gpu_frameworks import cudart

    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    lib = cudart().lib
    cudart().check(lib.cudaMemGetInfo(ctypes.byref(free), ctypes.byref(total)), "cudaMemGetInfo")
    return free.value


def settle(timeout=10.0):
    """Waits (the device idle, then the reaper) until this process holds no share."""
    _sync()
    gc.collect()
    deadline = time.time() + timeout
    while time.time() < deadline:
        if not _shm_holds():
            return True
        time.sleep(0.01)
    return False


def _shm_holds() -> bool:
    """Whether this process is still a holder in any lifetime file (read from this user's
    /dev/shm/tensorbridge-<euid> with the layout the CUDA layer documents: 64-byte header,
    256-byte slots, holder pids at slot + 16 + 16 i)."""
    me = os.getpid()
    root = f"/dev/shm/tensorbridge-{os.geteuid()}"
    try:
        names = os.listdir(root)
    except OSError:
        return False
    for name in names:
        if not name.startswith("ipc-"):
            continue
        try:
            data = np.fromfile(os.path.join(root, name), dtype=np.uint8)
        except OSError:
            continue
        slots = data[64:].reshape(-1, 256)
        pids = slots[:, 16:256].reshape(-1, 15, 16)[:, :, :4].copy().view(np.uint32)
        if (pids == me).any():
            return True
    return False


def share_back(values, device="cuda:0"):
    """Shares a tensor of this process (PyTorch) and returns the handle's bytes: for tests
    where the worker is the producer (and then exits, or is killed)."""
    import tensorbridge as tb
    import torch

    x = torch.from_numpy(np.asarray(values)).to(device)
    h = tb.share(x)
    STATE["shared"] = (x, h)
    return bytes(h)


def share_error(kind):
    """What ``tb.share`` says of memory it must refuse, made in this process: PyTorch's
    expandable segments (the environment turned them on for this worker)."""
    import tensorbridge as tb
    import torch

    x = torch.ones(1 << 20, device="cuda")
    try:
        tb.share(x)
    except Exception as e:  # noqa: BLE001
        return type(e).__name__, str(e), kind
    return None


def peer_copy(key, device):
    """The view copied to another GPU of this process by PyTorch (peer access or staging)."""
    import torch

    fw, v, y = STATE[key]
    return torch.from_dlpack(v).to(device).cpu().numpy()
