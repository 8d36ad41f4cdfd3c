"""tensorbridge demo: one buffer through every framework present, zero-copy, with a table.

One buffer is allocated outside every framework (cudaMalloc on the GPU when there is one,
aligned libc memory on the host otherwise) and described once with ``tb.from_ptr``. Every
framework present then wraps that same memory through tensorbridge, and each of those
wrappers is handed, through ``tb.asview``, to every consumer. For each (producer, consumer)
row the table says whether the consumer's tensor has the buffer's address (read with the
consumer's own API), whether writes are visible both ways (a write into the buffer seen by
the consumer; a write through the consumer, where it can write, seen in the buffer), and the
median time of one hand-off (``consumer(tb.asview(producer))``) over many calls after a
warm-up.

    python demo.py                  # GPU when there is one, host otherwise
    python demo.py --device cpu     # force the host
    python demo.py --calls 500

Frameworks that are not installed are left out (rows skipped, listed at the end). On the GPU
it ends with a two-process hand-off (``tensor_from_another_process.py``: a tensor shared with
a second process, zero-copy). Exit status: 0 when every row present is zero-copy with writes
visible and the hand-off worked, 1 otherwise.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import importlib
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
os.environ.setdefault("JAX_ENABLE_X64", "1")

import numpy as np  # noqa: E402

import tensorbridge as tb  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _cmem import cuda_available, cudart  # noqa: E402


def _try_import(name):
    try:
        return importlib.import_module(name)
    except Exception:  # noqa: BLE001 - an absent or broken framework is skipped, not fatal
        return None


# ---------------------------------------------------------------------------------------------
# the buffer: raw memory and element-0 access that needs no framework


class HostBuffer:
    def __init__(self, n):
        libc = ctypes.CDLL(None)
        libc.posix_memalign.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_size_t]
        libc.free.argtypes = [ctypes.c_void_p]
        p = ctypes.c_void_p()
        if libc.posix_memalign(ctypes.byref(p), 64, n * 4) != 0:  # 64 B: JAX copies less aligned memory
            raise MemoryError("posix_memalign failed")
        self.ptr, self.n, self.device = p.value, n, "cpu"
        self.freed = 0

        def release():
            self.freed += 1
            libc.free(p.value)

        self.root = tb.from_ptr(self.ptr, (n,), "float32", device="cpu", release=release)
        self._np = np.asarray(self.root)  # through the array interface

    def fill(self):
        self._np[:] = np.arange(self.n, dtype=np.float32)

    def set0(self, value):
        self._np[0] = value

    def get0(self):
        return float(self._np[0])


class CudaBuffer:
    def __init__(self, n):
        self.rt = cudart()
        self.rt.cudaDeviceSynchronize.argtypes = []
        p = ctypes.c_void_p()
        if self.rt.cudaMalloc(ctypes.byref(p), n * 4) != 0:
            raise MemoryError("cudaMalloc failed")
        self.ptr, self.n, self.device = p.value, n, "cuda:0"
        self.freed = 0

        def release():
            self.freed += 1
            self.rt.cudaFree(p.value)

        self.root = tb.from_ptr(self.ptr, (n,), "float32", device="cuda:0", release=release)

    def _h2d(self, arr):
        self.rt.cudaDeviceSynchronize()
        self.rt.cudaMemcpy(self.ptr, arr.ctypes.data, arr.nbytes, 1)

    def fill(self):
        self._h2d(np.arange(self.n, dtype=np.float32))

    def set0(self, value):
        self._h2d(np.array([value], np.float32))

    def get0(self):
        out = np.zeros(1, np.float32)
        self.rt.cudaDeviceSynchronize()
        self.rt.cudaMemcpy(out.ctypes.data, self.ptr, 4, 2)
        return float(out[0])


# ---------------------------------------------------------------------------------------------
# consumers: name -> (take(view), ptr(y), read0(y), write0(y, v) or None)


def host_consumers():
    out = {
        "numpy": (np.from_dlpack, lambda y: y.ctypes.data, lambda y: float(y[0]), _np_write),
        "numpy (array interface)": (np.asarray, lambda y: y.ctypes.data, lambda y: float(y[0]), _np_write),
    }
    torch = _try_import("torch")
    if torch:
        out["torch"] = (torch.from_dlpack, lambda y: y.data_ptr(), lambda y: float(y[0]), _np_write)
    jax = _try_import("jax")
    if jax:
        import jax.numpy as jnp

        out["jax"] = (jax.dlpack.from_dlpack, lambda y: y.unsafe_buffer_pointer(),
                      lambda y: float(jnp.copy(y)[0]), None)  # fmt: skip
    tf = _try_import("tensorflow")
    if tf:
        out["tensorflow"] = (lambda v: tf.experimental.dlpack.from_dlpack(v.__dlpack__()),
                             lambda y: np.from_dlpack(y).ctypes.data,
                             lambda y: float(y.numpy()[0]), None)  # fmt: skip
    return out


def _np_write(y, value):
    y[0] = value


def _numba_write(y, value):
    # not `y[0] = value`: numba-cuda 0.30 compiles a kernel for that which calls np.row_stack,
    # gone in NumPy 2.5; a one-element view and a copy write the same element
    y.ravel()[0:1].copy_to_device(np.array([value], dtype=y.dtype))


def cuda_consumers():
    out = {}
    torch = _try_import("torch")
    if torch:
        out["torch"] = (torch.from_dlpack, lambda y: y.data_ptr(), lambda y: float(y[0].item()), _np_write)
    cupy = _try_import("cupy")
    if cupy:
        out["cupy"] = (cupy.from_dlpack, lambda y: y.data.ptr, lambda y: float(y[0]), _np_write)
        out["cupy (CUDA Array Interface)"] = (cupy.asarray, lambda y: y.data.ptr, lambda y: float(y[0]), _np_write)
    jax = _try_import("jax")
    if jax:
        import jax.numpy as jnp

        out["jax"] = (jax.dlpack.from_dlpack, lambda y: y.unsafe_buffer_pointer(),
                      lambda y: float(jnp.copy(y)[0]), None)  # fmt: skip
    numba_cuda = _try_import("numba.cuda")
    if numba_cuda:
        out["numba (CUDA Array Interface)"] = (numba_cuda.as_cuda_array,
                                               lambda y: y.__cuda_array_interface__["data"][0],
                                               lambda y: float(y[0:1].copy_to_host()[0]),
                                               _numba_write)  # fmt: skip
    take = _cuda_core_smv()
    if take:
        # a StridedMemoryView describes memory, it has no element access: read at its pointer
        out["cuda.core"] = (take, lambda y: int(y.ptr), lambda y: _cuda_read0(int(y.ptr)), None)
    return out


def _cuda_read0(ptr):
    rt = cudart()
    out = np.zeros(1, np.float32)
    rt.cudaDeviceSynchronize()
    rt.cudaMemcpy(out.ctypes.data, ptr, 4, 2)
    return float(out[0])


def _cuda_core_smv():
    core = _try_import("cuda.core")
    if core is None:
        return None
    try:
        from cuda.core import Device
    except ImportError:
        from cuda.core.experimental import Device
    try:
        from cuda.core.utils import StridedMemoryView as SMV
    except ImportError:
        from cuda.core.experimental.utils import StridedMemoryView as SMV
    dev = Device(0)
    dev.set_current()
    stream = dev.create_stream()

    # The lambda holds the Stream object itself (not only its handle): a destroyed stream's
    # handle must never reach __dlpack__.
    if hasattr(SMV, "from_dlpack"):
        return lambda v, s=stream: SMV.from_dlpack(v, stream_ptr=int(s.handle))
    return lambda v, s=stream: SMV(v, stream_ptr=int(s.handle))


# ---------------------------------------------------------------------------------------------


def median_us(fn, calls, warmup):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def run(device, n, calls, warmup, out=sys.stdout):
    buf = CudaBuffer(n) if device == "cuda" else HostBuffer(n)
    buf.fill()
    consumers = cuda_consumers() if device == "cuda" else host_consumers()
    wanted = (["torch", "cupy", "jax", "numba", "cuda.core"] if device == "cuda"
              else ["numpy", "torch", "jax", "tensorflow"])  # fmt: skip
    missing = [m for m in wanted if not any(c.split(" ")[0] == m for c in consumers)]
    rows, n_producers = _rows(buf, consumers, calls, warmup)
    ok_all = all(r.get("refused") or (r.get("ptr") and r.get("write") in (True, None))
                 for r in rows)  # fmt: skip

    print(f"tensorbridge {tb.__version__}: one {n}-element float32 buffer at {buf.ptr:#x} "
          f"({buf.device}), {n_producers} producers x {len(consumers)} consumers", file=out)  # fmt: skip
    _table(rows, out)
    if missing:
        print(f"skipped (not installed): {', '.join(missing)}", file=out)
    # every wrapper is gone: dropping the raw view releases the buffer, exactly once
    buf.root = None
    buf.__dict__.pop("_np", None)
    gc.collect()
    print(f"buffer released {buf.freed} time(s), after its last user", file=out)
    return ok_all and buf.freed == 1, rows


def _rows(buf, consumers, calls, warmup):
    # producers: the raw view itself, then each framework's own object over the same memory
    producers = {"tb.from_ptr (raw)": buf.root}
    for name, (take, *_rest) in consumers.items():
        if "interface" in name:
            continue  # same framework as its DLPack row
        try:
            obj = take(buf.root)
        except Exception as e:  # noqa: BLE001 - reported in the table
            producers[name] = e
            continue
        protocols = ("__dlpack__", "__cuda_array_interface__", "__array_interface__")
        if any(hasattr(obj, p) for p in protocols):
            producers[name] = obj  # (a cuda.core StridedMemoryView may export nothing)
    rows = []
    marker = 1.0
    for pname, producer in producers.items():
        for cname, (take, ptr_of, read0, write0) in consumers.items():
            row = {"producer": pname, "consumer": cname}
            rows.append(row)
            if isinstance(producer, Exception):
                row["note"] = f"producer failed: {type(producer).__name__}: {producer}"[:80]
                continue
            try:
                v = tb.asview(producer)
                try:
                    y = take(v)
                except BufferError as e:
                    # A view ends as the direct hand-off does: refused only where the producer
                    # refuses the same consumer itself (NumPy before 2.1 refuses its read-only
                    # arrays to legacy consumers). JAX and TensorFlow hand their read-only
                    # arrays to legacy consumers, and so do their views.
                    try:
                        take(producer)
                    except BufferError:
                        row["refused"] = True
                        row["note"] = f"refused, as directly: {str(e).splitlines()[0][:50]}"
                        continue
                    raise
                row["ptr"] = ptr_of(y) == buf.ptr
                checks = []
                if read0 is not None:
                    marker += 1
                    buf.set0(marker)
                    checks.append(read0(y) == marker)
                # a read-only view is not written through (its producer is immutable)
                if write0 is not None and not v.readonly:
                    marker += 1
                    write0(y, marker)
                    checks.append(buf.get0() == marker)
                row["write"] = all(checks) if checks else None
                if v.readonly and row["write"]:
                    row["write"] = None  # read back right, and not written: "n/a (read-only)"
                del y
                row["us"] = median_us(lambda: take(tb.asview(producer)), calls, warmup)
            except Exception as e:  # noqa: BLE001 - reported in the table
                row["note"] = f"{type(e).__name__}: {str(e).splitlines()[0][:60]}"
    return rows, len(producers)


def _table(rows, out):
    cols = [("producer", "producer"), ("consumer", "consumer"), ("ptr", "same address"),
            ("write", "writes visible"), ("us", "us / hand-off"), ("note", "note")]  # fmt: skip

    def cell(r, k):
        v = r.get(k)
        if k == "write" and v is None and "ptr" in r and "note" not in r:
            return "n/a (read-only)"
        if v is None:
            return ""
        if v is True:
            return "yes"
        if v is False:
            return "NO"
        if isinstance(v, float):
            return f"{v:.1f}"
        return str(v)

    table = [[cell(r, k) for k, _ in cols] for r in rows]
    widths = [max(len(h), *(len(t[i]) for t in table)) for i, (_, h) in enumerate(cols)]
    print("  ".join(h.ljust(w) for (_, h), w in zip(cols, widths)).rstrip(), file=out)
    print("  ".join("-" * w for w in widths), file=out)
    for t in table:
        print("  ".join(c.ljust(w) for c, w in zip(t, widths)).rstrip(), file=out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda when a GPU is present")
    ap.add_argument("--n", type=int, default=1024, help="elements in the buffer")
    ap.add_argument("--calls", type=int, default=200, help="timed hand-offs per row")
    ap.add_argument("--warmup", type=int, default=20, help="untimed hand-offs per row first")
    args = ap.parse_args(argv)
    device = args.device or ("cuda" if cuda_available() else "cpu")
    ok, _ = run(device, args.n, args.calls, args.warmup)
    shared = _two_process(device)
    return 0 if ok and shared else 1


def _two_process(device):
    """The two-process hand-off (``tensor_from_another_process.py``): its line, or why not."""
    if device != "cuda":
        print("two-process hand-off: skipped (no CUDA GPU here)")
        return True
    if _try_import("torch") is None:
        print("two-process hand-off: skipped (PyTorch is not installed)")
        return True
    from tensor_from_another_process import main as two_process

    try:
        two_process("cuda")
    except Exception as e:  # noqa: BLE001 - reported, and the exit status says so
        print(f"two-process hand-off: FAILED: {type(e).__name__}: {e}")
        return False
    return True


if __name__ == "__main__":
    sys.exit(main())
