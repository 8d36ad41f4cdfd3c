"""Your own CUDA kernel on framework tensors: ``tensorbridge_example.axpy(alpha, x, y)``
(``y += alpha * x`` in place, NVRTC, on the producer framework's current stream; the cookbook's
recipe "Your own CUDA kernel on PyTorch tensors").

Ordering is proven as in test_gpu_streams.py: a producer busy for ~100 ms on a non-default
stream, then the call, then the framework reading ``y`` on that stream. The values must be
right, the call must return while the producer is still busy (the host did not wait), and a
control (the same kernel on the legacy default stream, unordered) must read stale data.
"""

import threading
import time

import numpy as np
import pytest
from gpu_frameworks import cupy_spin_kernel

N = 1 << 20
BUSY_MS = 100

ext = pytest.importorskip("tensorbridge_example", reason="the example extension is not built")



@pytest.fixture(scope="module")
def torch():
    torch = pytest.importorskip("torch")
    x = torch.zeros(4, device="cuda")
    y = torch.zeros(4, device="cuda")
    ext.axpy(1.0, x, y)  # NVRTC and the module load happen here, once per context
    torch.cuda.synchronize()
    return torch


@pytest.fixture(scope="module")
def torch_cycles(torch):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1000)
    s.record()
    torch.cuda._sleep(20_000_000)
    e.record()
    e.synchronize()
    return int(20_000_000 / s.elapsed_time(e) * BUSY_MS)


@pytest.fixture(scope="module")
def cupy_spin():
    cupy = pytest.importorskip("cupy")
    k, cycles = cupy_spin_kernel(cupy, BUSY_MS)

    def launch(x, value):
        # One block spins, then a grid fills: busy ~BUSY_MS whatever N is.
        k((1,), (1,), (x, np.int64(0), np.int64(cycles), np.float32(value)))
        k(((x.size + 255) // 256,), (256,), (x, np.int64(x.size), np.int64(0), np.float32(value)))

    return launch


def test_busy_torch_stream_then_axpy_then_torch_reads(torch, torch_cycles):
    """x is written at the end of ~100 ms of work on a non-default stream s; axpy runs under
    ``with torch.cuda.stream(s)``, so on s, after that work; torch then reads y on s. Right
    values, and the host returned from axpy long before the producer finished."""
    x = torch.zeros(N, device="cuda")
    y = torch.ones(N, device="cuda")
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(torch_cycles)
        x.fill_(3.0)
        t0 = time.perf_counter()
        ext.axpy(2.0, x, y)
        dt = time.perf_counter() - t0
        busy = not s.query()
        z = y.clone()
    s.synchronize()
    assert busy, "the producer finished before axpy returned: the host waited"
    assert dt < BUSY_MS / 1e3 / 10, f"axpy took {dt * 1e3:.1f} ms on the host"
    assert bool(torch.all(z == 7.0)), z[:8]
    assert bool(torch.all(y == 7.0))


def test_control_the_same_kernel_on_the_legacy_stream_reads_stale_data(torch, torch_cycles):
    """The same kernel through pointers on the legacy default stream, no ordering: torch's
    streams are non-blocking, so it runs before x is filled and y ends up 1, not 7. If this
    ever gives 7 the race is not observable and the test above proves nothing."""
    x = torch.zeros(N, device="cuda")
    y = torch.ones(N, device="cuda")
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(torch_cycles)
        x.fill_(3.0)
        ext.axpy_ptr(2.0, x.data_ptr(), y.data_ptr(), N, 0)
        z = y.clone()
    torch.cuda.synchronize()
    assert not bool(torch.all(z == 7.0)), "the unordered control got the right values"


def test_axpy_on_the_default_stream_and_stream_zero(torch):
    """No stream context: torch's current stream is its default stream, handle 0 (the legacy
    default stream), which the call accepts."""
    assert torch.cuda.current_stream().cuda_stream == 0
    x = torch.full((1000,), 2.0, device="cuda")
    y = torch.ones(1000, device="cuda")
    ext.axpy(0.5, x, y)
    assert bool(torch.all(y == 2.0))


def test_a_failed_launch_names_the_kernel(torch):
    """A launch the driver refuses (4,096 threads per block) is a RuntimeError that names the
    kernel and what the driver said; nothing was written."""
    x = torch.ones(1000, device="cuda")
    y = torch.ones(1000, device="cuda")
    with pytest.raises(RuntimeError, match="kernel axpy failed") as info:
        ext.axpy_unlaunchable(x, y)
    assert "CUDA_ERROR_INVALID_VALUE" in str(info.value), str(info.value)
    torch.cuda.synchronize()
    assert bool(torch.all(y == 1.0))


def test_stream_zero_and_stream_objects_on_every_entry(tb, torch):
    """One reading of ``stream=`` (ARCHITECTURE.md, "Streams from Python"): the int 0 is
    refused by every entry; the default stream's own object (handle 0) is the legacy default
    stream, taken by every entry."""
    default = torch.cuda.current_stream()
    assert default.cuda_stream == 0
    x = torch.full((1000,), 2.0, device="cuda")
    y = torch.ones(1000, device="cuda")
    for call in (
        lambda s: tb.asview(x, stream=s),
        lambda s: tb.from_ptr(x.data_ptr(), (1000,), "float32", owner=x, producer_stream=s),
        lambda s: ext.axpy_on(0.5, x, y, s),
    ):
        with pytest.raises(ValueError, match="stream=0 is ambiguous"):
            call(0)
        call(default)
    torch.cuda.synchronize()
    assert bool(torch.all(y == 2.0)), y[:8]
    assert bool(torch.all(torch.from_dlpack(tb.asview(x, stream=1)) == 2.0))


def test_cupy_producer_under_its_own_stream(cupy_spin):
    """CuPy: x is filled after ~100 ms on ``with cupy.cuda.Stream()``; axpy runs on CuPy's
    current stream; CuPy copies y on it."""
    cupy = pytest.importorskip("cupy")
    x = cupy.zeros(N, cupy.float32)
    y = cupy.ones(N, cupy.float32)
    ext.axpy(1.0, x, y)  # this context's module
    cupy.cuda.Device().synchronize()
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        cupy_spin(x, 3.0)
        t0 = time.perf_counter()
        ext.axpy(2.0, x, y)
        dt = time.perf_counter() - t0
        busy = not s.done
        z = y.copy()
    s.synchronize()
    assert busy, "the producer finished before axpy returned: the host waited"
    assert dt < BUSY_MS / 1e3 / 10, f"axpy took {dt * 1e3:.1f} ms on the host"
    assert bool(cupy.all(z == 7.0))


def test_cupy_output_torch_stream_waits_for_the_kernel(torch, cupy_spin):
    """x from torch (so the kernel runs on torch's current stream), y from CuPy: CuPy's
    current stream is made to wait for the kernel before CuPy reads y."""
    cupy = pytest.importorskip("cupy")
    x = torch.full((N,), 3.0, device="cuda")
    y = cupy.ones(N, cupy.float32)
    torch.cuda.synchronize()
    cupy.cuda.Device().synchronize()
    ts = torch.cuda.Stream()
    cs = cupy.cuda.Stream(non_blocking=True)
    with torch.cuda.stream(ts), cs:
        torch.cuda._sleep(1_000_000)  # keep the kernel's stream busy a little
        ext.axpy(2.0, x, y)
        z = y.copy()  # on cs
    cs.synchronize()
    assert bool(cupy.all(z == 7.0))


def test_jax_producer(torch):
    """A JAX array as the input (JAX hands it over ready), a torch tensor as the output."""
    jnp = pytest.importorskip("jax.numpy")
    x = jnp.full((N,), 3.0, dtype=jnp.float32)
    y = torch.ones(N, device="cuda")
    ext.axpy(2.0, x, y)
    torch.cuda.synchronize()
    assert bool(torch.all(y == 7.0))


def test_strided_transposed_and_empty(torch):
    x = torch.arange(12.0, device="cuda").reshape(3, 4)
    y = torch.zeros(4, 3, device="cuda").t()  # transposed: strides (1, 3)
    ext.axpy(2.0, x, y)
    assert torch.equal(y, 2 * x)

    base = torch.arange(48.0, device="cuda").reshape(6, 8)
    xs = base[::2, 1::4]  # strided, offset: shape (3, 2)
    ys = torch.ones(16, device="cuda").reshape(4, 4)[1:4, ::2]  # shape (3, 2)
    assert xs.shape == ys.shape
    want = ys + 0.5 * xs
    ext.axpy(0.5, xs, ys)
    assert torch.equal(ys, want)

    # a broadcast input is fine (only outputs must not overlap themselves)
    xb = torch.tensor([1.0, 2.0, 3.0], device="cuda").expand(4, 3)
    yb = torch.zeros(4, 3, device="cuda")
    ext.axpy(1.0, xb, yb)
    assert torch.equal(yb, xb)

    e = torch.empty(0, device="cuda")
    ext.axpy(1.0, e, torch.empty(0, device="cuda"))
    ext.axpy(1.0, torch.empty(3, 0, device="cuda"), torch.empty(3, 0, device="cuda"))


def test_cupy_negative_strides():
    cupy = pytest.importorskip("cupy")
    x = cupy.arange(10, dtype=cupy.float32)[::-1]
    y = cupy.zeros(10, cupy.float32)[::-1]
    ext.axpy(1.0, x, y)
    assert bool(cupy.all(y == cupy.arange(10, dtype=cupy.float32)[::-1]))


def test_aliasing_outputs_are_refused(torch):
    x = torch.ones(8, device="cuda")
    with pytest.raises(ValueError, match="overlap"):
        ext.axpy(2.0, x, x)
    buf = torch.zeros(16, device="cuda")
    with pytest.raises(ValueError, match="overlap"):
        ext.axpy(2.0, buf[0:8], buf[4:12])
    with pytest.raises(ValueError, match="same addresses"):
        ext.axpy(2.0, torch.ones(4, 3, device="cuda"), torch.zeros(1, 3, device="cuda").expand(4, 3))
    assert bool(torch.all(x == 1.0)) and bool(torch.all(buf == 0.0)), "a refused call wrote"
    # disjoint halves of one buffer are fine
    ext.axpy(2.0, buf[8:16] + 1, buf[0:8])
    assert bool(torch.all(buf[0:8] == 2.0))


def test_wrong_devices_are_refused(torch):
    with pytest.raises(ValueError, match="cannot be passed to a CUDA kernel"):
        ext.axpy(1.0, torch.ones(4), torch.ones(4, device="cuda"))
    with pytest.raises(ValueError, match="cannot be passed to a CUDA kernel"):
        ext.axpy(1.0, torch.ones(4, device="cuda"), torch.ones(4))
    with pytest.raises(TypeError, match="float32"):
        ext.axpy(1.0, torch.ones(4, device="cuda", dtype=torch.float64), torch.ones(4, device="cuda"))


def test_tensors_on_two_devices_are_refused(torch):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    x = torch.ones(4, device="cuda:1")
    y = torch.ones(4, device="cuda:0")
    with pytest.raises(ValueError, match="cuda:"):
        ext.axpy(1.0, x, y)
    # both on device 1: runs on device 1's current stream
    y1 = torch.ones(4, device="cuda:1")
    ext.axpy(1.0, x, y1)
    assert bool(torch.all(y1 == 2.0))


def test_eight_threads_at_once(torch):
    errors = []
    results = {}

    def work(k):
        try:
            s = torch.cuda.Stream()
            with torch.cuda.stream(s):
                x = torch.full((4096,), float(k + 1), device="cuda")
                y = torch.zeros(4096, device="cuda")
                for _ in range(50):
                    ext.axpy(1.0, x, y)
                results[k] = y.cpu()
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for k in range(8):
        assert bool(torch.all(results[k] == 50.0 * (k + 1))), k


def test_captured_in_a_cuda_graph_and_replayed(torch):
    x = torch.full((N,), 2.0, device="cuda")
    y = torch.zeros(N, device="cuda")
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        ext.axpy(1.0, x, y)
    torch.cuda.synchronize()
    assert bool(torch.all(y == 0.0)), "capture ran the kernel"
    for _ in range(100):
        g.replay()
    torch.cuda.synchronize()
    assert bool(torch.all(y == 200.0)), y[:4]
    del g


# -- the second recipe: a strided 2-D kernel (`add_transposed`) and a caller's stream -------


@pytest.mark.parametrize("layout", ["contiguous", "a_transposed", "b_sliced", "out_transposed"])
def test_add_transposed_takes_every_layout_in_place(torch, layout):
    """``out = a + b.T`` with a 2-D grid reading strides from ``tb_layout``: transposed and
    sliced arguments are read and written in place (same pointers), the values right."""
    m, n = 257, 131  # not multiples of the 16 x 16 block
    a = torch.randn(m, n, device="cuda")
    b = torch.randn(n, m, device="cuda")
    out = torch.zeros(m, n, device="cuda")
    if layout == "a_transposed":
        a = torch.randn(n, m, device="cuda").t()
    elif layout == "b_sliced":
        b = torch.randn(n, 2 * m, device="cuda")[:, ::2]
    elif layout == "out_transposed":
        out = torch.zeros(n, m, device="cuda").t()
    ptr = out.data_ptr()
    ext.add_transposed(a, b, out)
    torch.cuda.synchronize()
    assert out.data_ptr() == ptr
    assert torch.allclose(out, a + b.t()), (out - (a + b.t())).abs().max()


def test_add_transposed_after_a_busy_producer(torch, torch_cycles):
    """The 2-D kernel is ordered after ~100 ms of work on the current stream, like axpy."""
    a = torch.zeros(64, 32, device="cuda")
    b = torch.ones(32, 64, device="cuda")
    out = torch.zeros(64, 32, device="cuda")
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(torch_cycles)
        a.fill_(2.0)
        ext.add_transposed(a, b, out)
        busy = not s.query()
    s.synchronize()
    assert busy, "the host waited for the producer"
    assert bool(torch.all(out == 3.0))


def test_add_transposed_refuses_shapes_that_do_not_fit(torch):
    a = torch.zeros(4, 3, device="cuda")
    with pytest.raises(ValueError, match=r"expected a \(m, n\), b \(n, m\)"):
        ext.add_transposed(a, torch.zeros(4, 3, device="cuda"), torch.zeros(4, 3, device="cuda"))


def test_axpy_on_a_stream_the_caller_chose(torch, torch_cycles):
    """``kernel_call_on``: the kernel runs on the caller's stream (a torch pool stream given
    as a ``torch.cuda.Stream``, then the same stream as an int), after the work on it."""
    x = torch.zeros(N, device="cuda")
    y = torch.ones(N, device="cuda")
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(torch_cycles)
        x.fill_(3.0)
    ext.axpy_on(2.0, x, y, s)  # the current stream is the default one; the kernel runs on s
    ext.axpy_on(1.0, x, y, s.cuda_stream)
    assert not s.query(), "the host waited for the producer"
    s.synchronize()
    assert bool(torch.all(y == 10.0)), y[:8]


def test_jax_input_on_a_caller_stream(torch):
    """A JAX array has no current stream to give: it is an input (read-only) on the caller's
    stream; as an output it is refused (immutable)."""
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")
    x = jnp.full((1024,), 2.0, dtype=jnp.float32)
    y = torch.zeros(1024, device="cuda")
    s = torch.cuda.Stream()
    ext.axpy_on(1.5, x, y, s)
    s.synchronize()
    assert bool(torch.all(y == 3.0))
    with pytest.raises(BufferError):
        ext.axpy_on(1.0, torch.zeros(1024, device="cuda"), jnp.zeros(1024, dtype=jnp.float32), s)
    del jax
