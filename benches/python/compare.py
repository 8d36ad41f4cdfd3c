#!/usr/bin/env python3
"""tensorbridge against the peers, side by side in one process, on a GPU machine.

Each row times one path as the median over batches of 50 calls (time.perf_counter_ns around
each batch, divided by 50) after a warm-up, next to what a user would do instead, on the
same buffer, the two timed alternately in blocks. The stream
rows time how long each consumer keeps the host while the producer stream is still busy for
SPIN_MS. Prints a markdown table and writes compare.json into $OUT (or the current
directory). Rows whose library is missing say so instead of failing.

Run (GPU machine, the bundle's wheel on PYTHONPATH):
    python3 benches/python/compare.py
On a machine without a GPU (or with --cpu), the rows that need none: NumPy, torch CPU tensors
(plain and read-only), tvm-ffi's import and its `testing.nop` with three CPU tensors.
"""
import json
import os
import statistics
import sys
import time

import numpy as np

import tensorbridge as tb

N = 1 << 20  # float32 elements (4 MiB), non-zero data
CALLS = 20_000
WARMUP = 2_000
SPIN_MS = 60
BATCH = 50  # calls between two clock reads

rows = []


def samples_ns(fn, calls, batch=BATCH):
    """Per-call times of `fn`, each the mean over a batch of `batch` calls between two clock
    reads: a clock read costs about as much as the cheapest calls timed here on a virtual
    machine, and timing calls one by one would add it to both sides of every ratio (pulling
    every ratio towards 1)."""
    clock = time.perf_counter_ns
    out = []
    for _ in range(max(1, calls // batch)):
        t0 = clock()
        for _ in range(batch):
            fn()
        out.append((clock() - t0) / batch)
    return out


def median_ns(fn, calls=CALLS, warmup=WARMUP):
    for _ in range(warmup):
        fn()
    return statistics.median(samples_ns(fn, calls))


def paired_ns(fns, calls=CALLS, warmup=WARMUP, blocks=10):
    """Medians of several paths timed alternately in `blocks` blocks (so drift on the host
    hits every path alike)."""
    for fn in fns:
        for _ in range(warmup):
            fn()
    samples = [[] for _ in fns]
    for _ in range(blocks):
        for i, fn in enumerate(fns):
            samples[i].extend(samples_ns(fn, calls // blocks))
    return [statistics.median(s) for s in samples]


def row(name, ours, peer_name, peer, target=None, note=""):
    """Times `ours` and `peer` alternately in blocks (so drift hits both) and records them."""
    try:
        ours()
    except Exception as e:  # a path that fails is reported, never hidden
        rows.append({"path": name, "error": f"{type(e).__name__}: {e}"})
        print(f"| {name} | error: {type(e).__name__}: {e} | | | |")
        return
    b = None
    if peer is not None:
        try:
            peer()
        except Exception as e:
            note = f"peer failed: {type(e).__name__}: {e}"
            peer = None
    if peer is not None:
        a, b = paired_ns([ours, peer])
    else:
        a = median_ns(ours)
    record(name, a, peer_name, b, target, note)


def record(name, a, peer_name, b, target=None, note=""):
    ratio = a / b if b else None
    rows.append({"path": name, "ours_ns": a, "peer": peer_name, "peer_ns": b,
                 "ratio": ratio, "target": target, "note": note})
    verdict = ""
    if ratio is not None and target is not None:
        verdict = "met" if ratio <= target else "MISSED"
    print(f"| {name} | {a / 1e3:.3f} µs | {peer_name}: "
          f"{(b / 1e3) if b else float('nan'):.3f} µs | "
          f"{ratio if ratio else float('nan'):.2f}x | {verdict} {note} |")


class PlainCAI:
    """A plain object exposing a fixed CUDA Array Interface dict (what users write by hand)."""

    def __init__(self, cai, owner):
        self.__cuda_array_interface__ = cai
        self._owner = owner


def readonly_wrapper(torch):
    """PyTorch's read-only tensor type (`torch.utils.dlpack.ReadOnlyTensorWrapper`, 2.14 and
    later), or None."""
    return getattr(getattr(torch.utils, "dlpack", None), "ReadOnlyTensorWrapper", None)


def readonly_rows(torch, t, tvm_ffi):
    """`tb.asview` of a read-only wrapper of `t` (PyTorch's const exchange table) next to the
    plain tensor and to tvm-ffi's import of the same wrapper."""
    wrapper = readonly_wrapper(torch)
    if wrapper is None:
        print(f"| tb.asview(ReadOnlyTensorWrapper) | skipped: torch {torch.__version__} has "
              "no read-only export | | | |")
        rows.append({"path": "tb.asview(ReadOnlyTensorWrapper)",
                     "error": f"torch {torch.__version__}: no ReadOnlyTensorWrapper"})
        return
    w = wrapper(t)
    v = tb.asview(w)
    assert v.readonly and v.ptr == t.data_ptr()
    row("tb.asview(ReadOnlyTensorWrapper)", lambda: tb.asview(w),
        "tb.asview(the plain tensor)", lambda: tb.asview(t), target=1.2,
        note="(the const table's fast path)")
    if tvm_ffi:
        row("tb.asview(ReadOnlyTensorWrapper)", lambda: tb.asview(w),
            "tvm_ffi.from_dlpack(ReadOnlyTensorWrapper)", lambda: tvm_ffi.from_dlpack(w),
            target=1.0)


def main_cpu():
    """The rows a machine without a GPU can measure."""
    import torch

    print(f"tensorbridge {getattr(tb, '__version__', '?')}, torch {torch.__version__}, "
          f"numpy {np.__version__}, python {sys.version.split()[0]}")
    print("device: CPU only")
    print()
    print("| path | tensorbridge | peer | ratio | target |")
    print("|---|---:|---:|---:|---|")
    try:
        import tvm_ffi
    except ImportError:
        tvm_ffi = None
    a = np.arange(N, dtype=np.float32) + 0.5
    row("tb.asview(numpy array)", lambda: tb.asview(a),
        "np.from_dlpack(numpy array)", lambda: np.from_dlpack(a), target=1.2)
    t = torch.arange(N, dtype=torch.float32) + 0.5
    assert tb.asview(t).ptr == t.data_ptr()
    row("tb.asview(torch CPU tensor)", lambda: tb.asview(t),
        "tvm_ffi.from_dlpack(torch CPU tensor)" if tvm_ffi else "tvm-ffi: not installed",
        (lambda: tvm_ffi.from_dlpack(t)) if tvm_ffi else None, target=1.0)
    readonly_rows(torch, t, tvm_ffi)
    view_t = tb.asview(t)
    row("torch.from_dlpack(tb view)", lambda: torch.from_dlpack(view_t),
        "torch.from_dlpack(torch tensor)", lambda: torch.from_dlpack(t), target=1.0)
    print()
    three_tensor_rows(torch, device="cpu")
    out = os.environ.get("OUT", ".")
    with open(os.path.join(out, "compare.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print(f"\nwrote {os.path.join(out, 'compare.json')}")


def main():
    if "--cpu" in sys.argv[1:]:
        return main_cpu()
    try:
        import cupy as cp
        import torch
        if not torch.cuda.is_available():
            raise ImportError("torch sees no GPU")
    except ImportError as e:
        print(f"(no GPU row can run here: {e}; the CPU rows follow)")
        return main_cpu()

    print(f"tensorbridge {getattr(tb, '__version__', '?')}, torch {torch.__version__}, "
          f"cupy {cp.__version__}, numpy {np.__version__}, python {sys.version.split()[0]}")
    print(f"device: {torch.cuda.get_device_name(0)}")
    print()
    print("| path | tensorbridge | peer | ratio | target |")
    print("|---|---:|---:|---:|---|")

    t = torch.arange(N, dtype=torch.float32, device="cuda") + 0.5
    c = cp.arange(N, dtype=cp.float32) + 0.5
    torch.cuda.synchronize()
    view_t = tb.asview(t)
    view_c = tb.asview(c)
    assert view_t.ptr == t.data_ptr() and view_c.ptr == c.data.ptr

    # 1. Into tensorbridge: tb.asview next to tvm-ffi's and cuda.core's imports, and NumPy's.
    smv = strided_memory_view()
    try:
        import tvm_ffi
    except ImportError:
        tvm_ffi = None
    row("tb.asview(torch tensor)", lambda: tb.asview(t),
        "tvm_ffi.from_dlpack(torch tensor)" if tvm_ffi else "tvm-ffi: not installed",
        (lambda: tvm_ffi.from_dlpack(t)) if tvm_ffi else None, target=1.0)
    readonly_rows(torch, t, tvm_ffi)
    for label, obj in (("torch tensor", t), ("cupy array", c)):
        peer = (lambda o=obj: smv(o)) if smv else None
        row(f"tb.asview({label})", lambda o=obj: tb.asview(o),
            f"cuda.core StridedMemoryView({label})" if smv else "cuda.core: not installed",
            peer, target=1.0)
    a = np.arange(N, dtype=np.float32) + 0.5
    row("tb.asview(numpy array)", lambda: tb.asview(a),
        "np.from_dlpack(numpy array)", lambda: np.from_dlpack(a), target=1.2)

    # 2. Out of tensorbridge: torch.from_dlpack on a view vs on a torch tensor (torch 2.11
    # calls __dlpack__ on both; it consumes no exchange table).
    row("torch.from_dlpack(tb view)", lambda: torch.from_dlpack(view_c),
        "torch.from_dlpack(torch tensor)", lambda: torch.from_dlpack(t), target=1.0)
    if tvm_ffi:
        # tvm-ffi consumes the view's DLPack C exchange table.
        row("tvm_ffi.from_dlpack(tb view)", lambda: tvm_ffi.from_dlpack(view_t),
            "tvm_ffi.from_dlpack(torch tensor)", lambda: tvm_ffi.from_dlpack(t),
            note="(informational)")

    # 3. cupy.asarray on a tensorbridge view vs on a plain CAI object with the same dict.
    plain = PlainCAI(dict(view_t.__cuda_array_interface__), t)
    row("cupy.asarray(tb view)", lambda: cp.asarray(view_t),
        "cupy.asarray(plain CAI object)", lambda: cp.asarray(plain), target=1.0)

    # 4. Three torch CUDA tensors into a PyO3 function, net of an empty call.
    print()
    three_tensor_rows(torch)

    # 5. tb.from_ptr vs CuPy's UnownedMemory + MemoryPointer route, over the same pointer.
    ptr, nbytes = c.data.ptr, c.nbytes

    def cupy_unowned():
        mem = cp.cuda.UnownedMemory(ptr, nbytes, c, 0)
        return cp.ndarray((N,), cp.float32, cp.cuda.MemoryPointer(mem, 0))

    row("tb.from_ptr(ptr, ...)", lambda: tb.from_ptr(ptr, (N,), "float32", device="cuda:0",
                                                       owner=c),
        "cupy UnownedMemory + MemoryPointer + ndarray", cupy_unowned,
        note="(from_ptr asks the driver for the allocation's range; CuPy checks nothing)")

    # 5. numba.cuda.as_cuda_array on a tensorbridge view vs on a plain CAI object.
    try:
        from numba import cuda as ncuda
        row("numba.cuda.as_cuda_array(tb view)", lambda: ncuda.as_cuda_array(view_t),
            "numba.cuda.as_cuda_array(plain CAI)", lambda: ncuda.as_cuda_array(plain),
            target=1.0)
    except ImportError as e:
        rows.append({"path": "numba", "error": str(e)})

    # 6. Streams: how long each consumer keeps the host while the producer is busy.
    print()
    stream_rows(cp, torch)

    # 7. Your own kernel: the host cost of one axpy call on three arguments.
    print()
    kernel_rows(torch)

    out = os.environ.get("OUT", ".")
    with open(os.path.join(out, "compare.json"), "w") as f:
        json.dump(rows, f, indent=1)
    print(f"\nwrote {os.path.join(out, 'compare.json')}")


def three_tensor_rows(torch, n=1 << 16, device="cuda"):
    """A PyO3 function of tensorbridge-example taking three torch tensors (CUDA, or `device`)
    borrowed for
    the call (`TensorArg`, `nop3`) and owned (`AnyTensor`, `nop3_owned`), next to tvm-ffi's
    `testing.nop` with the same three and dlpark 0.10's own import of them (`dlpark_nop3`);
    each net of its own empty call (`empty()`, `testing.nop()`), all timed alternately in
    blocks."""
    try:
        import tensorbridge_example as ext
    except ImportError as e:
        print(f"three tensors: skipped ({e})")
        rows.append({"path": "three tensors", "error": str(e)})
        return
    x, y, z = (torch.full((n,), float(i + 1), device=device) for i in range(3))
    kind = "CUDA" if device == "cuda" else device.upper()
    assert ext.nop3(x, y, z) == 3 * n
    paths = {"tensorbridge nop3(x, y, z)": lambda: ext.nop3(x, y, z),
             "tensorbridge nop3_owned(x, y, z)": lambda: ext.nop3_owned(x, y, z),
             "tensorbridge empty()": ext.empty,
             "dlpark dlpark_nop3(x, y, z)": lambda: ext.dlpark_nop3(x, y, z)}
    try:
        import tvm_ffi
        try:
            import tvm_ffi.testing  # noqa: F401
        except ImportError:
            pass
        nop = tvm_ffi.get_global_func("testing.nop")
        paths["tvm-ffi testing.nop(x, y, z)"] = lambda: nop(x, y, z)
        paths["tvm-ffi testing.nop()"] = lambda: nop()
    except Exception as e:
        print(f"| tvm-ffi | skipped: {type(e).__name__}: {e} | |")
    medians = dict(zip(paths, paired_ns(list(paths.values()))))
    print("| call (host time, median) | time |")
    print("|---|---:|")
    for label, ns in medians.items():
        print(f"| {label} | {ns / 1e3:.3f} µs |")
        rows.append({"path": f"three: {label}", "ours_ns": ns})
    ours = medians["tensorbridge nop3(x, y, z)"] - medians["tensorbridge empty()"]
    owned = medians["tensorbridge nop3_owned(x, y, z)"] - medians["tensorbridge empty()"]
    dlpark = medians["dlpark dlpark_nop3(x, y, z)"] - medians["tensorbridge empty()"]
    print()
    print("| path | tensorbridge | peer | ratio | target |")
    print("|---|---:|---:|---:|---|")
    if "tvm-ffi testing.nop()" in medians:
        tvm = medians["tvm-ffi testing.nop(x, y, z)"] - medians["tvm-ffi testing.nop()"]
        record(f"three torch {kind} tensors, net of an empty call", ours,
               "tvm-ffi testing.nop, net", tvm, target=1.0)
        record(f"three torch {kind} tensors, owned (AnyTensor), net", owned,
               "tvm-ffi testing.nop, net", tvm, note="(informational)")
    record(f"three torch {kind} tensors, net of an empty call", ours,
           "dlpark 0.10 import, net", dlpark, note="(informational)")


def strided_memory_view():
    """cuda.core's StridedMemoryView constructor, whatever this version calls it."""
    try:
        from cuda.core.utils import StridedMemoryView
    except ImportError:
        try:
            from cuda.core.experimental.utils import StridedMemoryView
        except ImportError:
            return None
    if hasattr(StridedMemoryView, "from_any_interface"):
        return lambda o: StridedMemoryView.from_any_interface(o, stream_ptr=-1)
    return lambda o: StridedMemoryView(o, stream_ptr=-1)


SPIN = r"""
extern "C" __global__ void spin_fill(float* out, unsigned long long n, long long cycles,
                                     float value) {
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        long long start = clock64();
        while (clock64() - start < cycles) {}
    }
    __syncthreads();
    for (unsigned long long i = blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        out[i] = value;
    }
}
"""


def stream_rows(cp, torch):
    """A producer busy for SPIN_MS on its own stream publishes its result with the stream in
    its CAI; each consumer imports it. Return time = how long the import kept the host;
    correct = the consumer saw the producer's values (not the 0s before)."""
    spin = cp.RawKernel(SPIN, "spin_fill")
    clock_khz = cp.cuda.runtime.deviceGetAttribute(cp.cuda.runtime.cudaDevAttrClockRate, 0)
    cycles = int(clock_khz * SPIN_MS)  # kHz * ms = cycles
    producer = cp.cuda.Stream(non_blocking=True)
    print(f"| consumer of a producer busy {SPIN_MS} ms | host time of the import | "
          "values seen by the consumer | blocks the host? |")
    print("|---|---:|---|---|")

    def produce():
        out = cp.zeros(N, dtype=cp.float32)
        cp.cuda.Device().synchronize()
        with producer:
            spin((1,), (1,), (out, cp.uint64(1), cp.int64(cycles), cp.float32(7.0)))
            spin((256,), (256,), (out, cp.uint64(N), cp.int64(0), cp.float32(7.0)))
        cai = dict(out.__cuda_array_interface__)
        cai["stream"] = producer.ptr
        return PlainCAI(cai, out), out

    def consume(label, fn, check):
        # Once with an idle producer first: the first use of a consumer loads its kernels
        # (CUDA lazy loading), which may synchronise the context; that is not the import.
        obj, out = produce()
        cp.cuda.Device().synchronize()
        check(fn(obj))
        obj, out = produce()
        t0 = time.perf_counter_ns()
        result = fn(obj)
        host_ms = (time.perf_counter_ns() - t0) / 1e6
        ok = check(result)
        cp.cuda.Device().synchronize()
        blocks = host_ms >= SPIN_MS * 0.5
        rows.append({"path": f"stream: {label}", "host_ms": host_ms, "correct": ok,
                     "blocks": blocks})
        print(f"| {label} | {host_ms:.3f} ms | {'producer values' if ok else 'WRONG'} | "
              f"{'yes' if blocks else 'no'} |")

    consumer = torch.cuda.Stream()

    def tb_then_torch(obj):
        v = tb.asview(obj)
        with torch.cuda.stream(consumer):
            # torch passes its current stream to __dlpack__; tensorbridge makes that stream
            # wait GPU-side for the producer. Only the import is timed.
            return torch.from_dlpack(v)

    def torch_check(x):
        with torch.cuda.stream(consumer):
            # Enqueued on the consumer stream, after the wait the import put there.
            ok = (x == 7.0).all()
        torch.cuda.synchronize()
        return bool(ok.item())

    consume("tb.asview + torch.from_dlpack (on torch's stream)", tb_then_torch, torch_check)
    consume("cupy.asarray(CAI with stream)", lambda o: cp.asarray(o),
            lambda a: bool((a == 7.0).all().item()))
    try:
        from numba import cuda as ncuda
        consume("numba.cuda.as_cuda_array(CAI with stream)",
                lambda o: ncuda.as_cuda_array(o),
                lambda a: bool(cp.asarray(a).min() == 7.0))
    except ImportError:
        pass


CPP_AXPY = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>

__global__ void axpy_kernel(float a, const float* x, float* y, long long n) {
    long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] += a * x[i];
}

void axpy(double alpha, torch::Tensor x, torch::Tensor y) {
    long long n = y.numel();
    if (n == 0) return;
    auto stream = c10::cuda::getCurrentCUDAStream();
    axpy_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(
        (float)alpha, x.data_ptr<float>(), y.data_ptr<float>(), n);
}
"""


def cpp_extension():
    """The same axpy as a PyTorch C++/CUDA extension, built here with ``load_inline`` (nvcc and
    ninja on the GPU machine): what a kernel author writes with PyTorch's own tools, the
    per-call baseline (target: <= 1.0x its time). ``None`` (and why) when it cannot be built."""
    try:
        from torch.utils.cpp_extension import load_inline

        build = os.path.join(os.environ.get("OUT", "."), "cpp_ext_build")
        os.makedirs(build, exist_ok=True)
        major, minor = __import__("torch").cuda.get_device_capability()
        mod = load_inline(
            name="tb_bench_axpy",
            cpp_sources="void axpy(double alpha, torch::Tensor x, torch::Tensor y);",
            cuda_sources=CPP_AXPY,
            functions=["axpy"],
            build_directory=build,
            extra_cuda_cflags=["-O2", f"-gencode=arch=compute_{major}{minor},code=sm_{major}{minor}"],
            verbose=False,
        )
        return mod, None
    except Exception as e:  # no nvcc, no ninja: the row says so
        return None, f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"


def kernel_rows(torch, n=1 << 16):
    """Host time of one ``axpy(alpha, x, y)`` (y += alpha * x in place, our own NVRTC kernel
    on torch's current stream: two borrowed imports, the stream borrowed, checked views, the
    launch), next to the same kernel as a PyTorch C++/CUDA extension built in this run
    (``load_inline``, ``getCurrentCUDAStream``, ``<<<>>>``: the baseline), torch's own
    ``y.add_(x, alpha=...)``, the same NVRTC kernel launched through cudarc on pointers
    extracted beforehand (``axpy_ptr``: no import, no check, no ordering) and tvm-ffi passing
    the same three arguments to a function that does nothing (``testing.nop``). All timed
    alternately in blocks; the GPU work is tiny and the queue is drained every 1000 calls so
    launches never back up."""
    try:
        import tensorbridge_example as ext
    except ImportError as e:
        print(f"kernel call: skipped ({e}; the example extension is not installed)")
        rows.append({"path": "kernel call", "error": str(e)})
        return
    x = torch.full((n,), 2.0, device="cuda")
    y = torch.zeros(n, device="cuda")
    ext.axpy(1.0, x, y)  # NVRTC and the module load, once
    torch.cuda.synchronize()
    xp, yp = x.data_ptr(), y.data_ptr()

    def drained(fn, block=1000):
        count = [0]

        def call():
            fn()
            count[0] += 1
            if count[0] % block == 0:
                torch.cuda.synchronize()
        return call

    paths = {}
    cpp, why = cpp_extension()
    if cpp is not None:
        cpp.axpy(1.0, x, y)
        paths["PyTorch C++/CUDA extension (load_inline)"] = lambda: cpp.axpy(1.0, x, y)
    else:
        print(f"| PyTorch C++/CUDA extension | not built: {why} | |")
    paths["tensorbridge axpy(alpha, x, y)"] = lambda: ext.axpy(1.0, x, y)
    paths["torch y.add_(x, alpha=1.0)"] = lambda: y.add_(x, alpha=1.0)
    paths["cudarc on pre-extracted pointers (axpy_ptr)"] = lambda: ext.axpy_ptr(1.0, xp, yp, n, 0)
    try:
        import tvm_ffi
        try:
            import tvm_ffi.testing  # noqa: F401  (registers the testing.* functions in some builds)
        except ImportError:
            pass
        nop = tvm_ffi.get_global_func("testing.nop")
        paths["tvm-ffi testing.nop(alpha, x, y)"] = lambda: nop(1.0, x, y)
    except Exception as e:  # not installed, or no testing.nop in this build
        print(f"| tvm-ffi | skipped: {type(e).__name__}: {e} | |")
    labels = list(paths)
    medians = {}
    try:
        for label, ns in zip(labels, paired_ns([drained(paths[k]) for k in labels],
                                               calls=CALLS // 2, warmup=WARMUP // 4)):
            medians[label] = ns
    except Exception as e:  # reported, never hidden
        print(f"| kernel call | error: {type(e).__name__}: {e} | |")
        rows.append({"path": "kernel call", "error": f"{type(e).__name__}: {e}"})
        return
    base_label = "PyTorch C++/CUDA extension (load_inline)"
    base = medians.get(base_label)
    print("| kernel call (host time, median, batches of 50) | time | vs C++ extension |")
    print("|---|---:|---:|")
    for label, ns in medians.items():
        ratio = ns / base if base else float("nan")
        print(f"| {label} | {ns / 1e3:.2f} µs | {ratio:.2f}x |")
        rows.append({"path": f"kernel: {label}", "ours_ns": ns, "peer": base_label,
                     "peer_ns": base, "ratio": ratio,
                     "target": 1.0 if label.startswith("tensorbridge") else None})
    torch.cuda.synchronize()
    assert bool(torch.all(y > 0)), "axpy did not write"


if __name__ == "__main__":
    main()
