"""The boundary's GPU checks, each naming the invariant it checks (the CPU items are in
``../test_boundary_*.py``).

- [ready]: readiness names only streams that outlive the tensor. A view of a torch
  tensor made under ``torch.cuda.stream(torch.cuda.ExternalStream(cupy_stream.ptr))`` (with
  ``stream=None``) remembered the external stream's HANDLE; after CuPy destroyed the stream,
  the next consumer ordered itself against whatever stream reused the handle value (on an
  H100 it waited 299 ms on an unrelated one). Here the handle is reused on purpose by a
  stream kept busy for ``BUSY_MS``; the consumer must not wait for it (its copy finishes
  while the unrelated stream is still busy) and must read the right values. The control
  makes the consumer wait on that stream explicitly and shows the measurement sees a wait.
- [access] (GPU): a JAX array is immutable; passed as the OUTPUT of a kernel
  (``tensorbridge_example.axpy``) it is refused (a read-only output), and left unchanged.
  As an input it is fine (the control). A torch tensor that requires grad: the same.
- Managed memory: ``cupy.asarray(tb.asview(a))`` for a CuPy array in managed memory works for every
  dtype CuPy has: the view's readiness is an event, which the CUDA Array Interface cannot
  name, and the view used to refuse its ``__cuda_array_interface__`` (CuPy then built an
  object array: "ValueError: Unsupported dtype object"). Same memory, right values, writes
  visible both ways.
"""

import gc
import time

import numpy as np
import pytest

import tensorbridge as tb
from gpu_frameworks import cupy_spin_kernel

N = 1 << 20
BUSY_MS = 300


@pytest.fixture(scope="module")
def cupy():
    return pytest.importorskip("cupy")


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


@pytest.fixture(scope="module")
def spin(cupy):
    k, cycles = cupy_spin_kernel(cupy, BUSY_MS)

    def launch(stream):
        """Keeps ``stream`` busy for about BUSY_MS (one spinning thread)."""
        scratch = cupy.zeros(1, cupy.float32)
        with stream:
            k((1,), (1,), (scratch, np.int64(1), np.int64(cycles), np.float32(0)))
        return scratch

    return launch


# --- a dead external stream's handle ----------------------------------------------------------


def _view_on_a_stream_that_dies(torch, cupy):
    """A view of ``x`` (7s) made under an ExternalStream of a CuPy stream, which is then
    destroyed; returns (view, x, the dead handle)."""
    cs = cupy.cuda.Stream(non_blocking=True)
    handle = cs.ptr
    x = torch.zeros(N, device="cuda")
    torch.cuda.synchronize()
    ext = torch.cuda.ExternalStream(handle)
    with torch.cuda.stream(ext):
        torch.cuda._sleep(1_000_000)  # the producer's work is still running at the import
        x.fill_(7.0)
        v = tb.asview(x)  # stream=None: the view is ready "after the current stream"
    cs.synchronize()
    del ext
    del cs  # CuPy destroys the stream (cudaStreamDestroy) here
    gc.collect()
    return v, x, handle


def _stream_reusing(cupy, handle, tries=256):
    """A new CuPy stream whose handle equals ``handle`` (the driver reuses freed handles), and
    the streams made on the way (kept alive meanwhile); None when none reused it."""
    made = []
    for _ in range(tries):
        s = cupy.cuda.Stream(non_blocking=True)
        if s.ptr == handle:
            return s, made
        made.append(s)
    return None, made


def _consume_and_time(torch, v, before=None):
    """A torch consumer on its own stream copies the view (after waiting for ``before``, a
    CuPy stream, when given); returns (seconds until its copy finished, the copy)."""
    cons = torch.cuda.Stream()
    with torch.cuda.stream(cons):
        if before is not None:
            cons.wait_stream(torch.cuda.ExternalStream(before.ptr))  # the control's wait
        y = torch.from_dlpack(v)
        z = y.clone()
        done = torch.cuda.Event()
        done.record()
    t0 = time.perf_counter()
    while not done.query():
        time.sleep(0.0005)
    waited = time.perf_counter() - t0
    return waited, z


@pytest.mark.parametrize("control", [False, True], ids=["view", "control_explicit_wait"])
def test_view_does_not_order_against_a_dead_external_stream(torch, cupy, spin, control):
    """[ready]: after the producer's external stream is destroyed and its handle
    reused by a busy, unrelated stream, a consumer of the view does not wait for that stream,
    and reads 7s. The control waits on the unrelated stream on purpose: it must take about
    BUSY_MS, which shows a wait would be seen."""
    v, x, handle = _view_on_a_stream_that_dies(torch, cupy)
    reused, made = _stream_reusing(cupy, handle)
    if reused is None:
        pytest.skip(f"the driver did not hand out handle {handle:#x} again in {len(made)} new streams")
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    start.record(reused)
    busy = spin(reused)  # the unrelated stream, now busy for ~BUSY_MS
    end.record(reused)
    waited, z = _consume_and_time(torch, v, before=reused if control else None)
    still_busy = not end.done
    end.synchronize()
    spun_ms = cupy.cuda.get_elapsed_time(start, end)
    print(
        f"control={control}: consumer finished after {waited * 1e3:.1f} ms, unrelated stream "
        f"busy for {spun_ms:.1f} ms, still busy then: {still_busy}"
    )
    assert spun_ms > BUSY_MS / 2, f"the unrelated stream was busy only {spun_ms:.1f} ms: the measurement proves nothing"
    assert bool((z == 7).all()), "the consumer read the view before the producer's fill"
    if control:
        assert waited > BUSY_MS / 1e3 / 2, f"the control did not wait ({waited * 1e3:.1f} ms): the measurement proves nothing"
    else:
        assert waited < BUSY_MS / 1e3 / 3 and still_busy, (
            f"the consumer waited {waited * 1e3:.1f} ms on an unrelated stream that reused the dead handle {handle:#x}"
        )
    del busy, made, v, x


def test_view_of_a_dead_external_stream_is_still_usable(torch, cupy):
    """With no stream reusing the handle, taking the view after its producer stream
    died raises nothing (a dead handle given to the driver is an error) and reads 7s."""
    v, x, _ = _view_on_a_stream_that_dies(torch, cupy)
    cons = torch.cuda.Stream()
    with torch.cuda.stream(cons):
        z = torch.from_dlpack(v).clone()
    cons.synchronize()
    assert bool((z == 7).all())
    c = cupy.from_dlpack(v)
    assert bool(cupy.all(c == 7))


# --- immutable producers as kernel outputs ----------------------------------------------------


@pytest.fixture(scope="module")
def ext():
    return pytest.importorskip("tensorbridge_example", reason="the example extension is not built")


def test_jax_array_as_kernel_output_is_refused(ext, torch):
    """[access]: ``axpy(alpha, x, y)`` writes ``y``; a JAX ``y`` is immutable."""
    jnp = pytest.importorskip("jax.numpy")
    x = torch.ones(1024, device="cuda")
    y = jnp.zeros((1024,), dtype=jnp.float32)
    assert tb.asview(y).readonly, "a JAX array's view is writable"
    with pytest.raises((BufferError, ValueError)):
        ext.axpy(2.0, x, y)
    torch.cuda.synchronize()
    assert float(jnp.abs(y).max()) == 0.0, "the refused kernel wrote into the JAX array"


def test_jax_array_as_kernel_input_is_fine(ext, torch):
    """The control: a JAX input is read, a torch output written."""
    jnp = pytest.importorskip("jax.numpy")
    x = jnp.full((1024,), 3.0, dtype=jnp.float32)
    y = torch.ones(1024, device="cuda")
    ext.axpy(2.0, x, y)
    torch.cuda.synchronize()
    assert bool(torch.all(y == 7.0))


def test_tensor_requiring_grad_is_an_input_not_an_output(ext, torch):
    """[access]: tensors that require grad are read-only views: accepted as inputs,
    refused as outputs (and left unchanged)."""
    p = torch.nn.Parameter(torch.full((1024,), 3.0, device="cuda"))
    y = torch.ones(1024, device="cuda")
    ext.axpy(2.0, p, y)
    torch.cuda.synchronize()
    assert bool(torch.all(y == 7.0))
    with pytest.raises((BufferError, ValueError)):
        ext.axpy(2.0, y, p)
    torch.cuda.synchronize()
    assert bool(torch.all(p.detach() == 3.0))


# --- cupy.asarray of a view of managed memory -------------------------------------------------

CUPY_DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
               "float16", "float32", "float64", "complex64", "complex128"]  # fmt: skip


def _managed(cupy, values):
    mem = cupy.cuda.malloc_managed(max(values.nbytes, 1))
    a = cupy.ndarray(values.shape, values.dtype, memptr=mem)
    a[...] = cupy.asarray(values)
    cupy.cuda.Device().synchronize()
    return a


def _sample(name, n=64):
    i = np.arange(n)
    if name == "bool":
        return (i % 3) == 1
    if name.startswith("complex"):
        return (i * 0.5 - 2).astype(name) + 1j * (n - i).astype(name)
    return (i % 100).astype(name)


@pytest.mark.parametrize("dtype", CUPY_DTYPES)
def test_cupy_asarray_of_a_view_of_managed_memory(cupy, dtype):
    """Managed memory: zero-copy through the CUDA Array Interface, right dtype and values, writes
    visible through both arrays."""
    values = _sample(dtype)
    a = _managed(cupy, values)
    v = tb.asview(a)
    assert v.device in ("cuda_managed", "cuda:0"), v
    print(f"{dtype}: {v!r}")
    b = cupy.asarray(v)
    assert b.dtype == a.dtype, f"cupy.asarray(view) gave {b.dtype} (expected {a.dtype})"
    assert b.data.ptr == a.data.ptr and b.shape == a.shape
    np.testing.assert_array_equal(cupy.asnumpy(b), values)
    b[0] = a[1]
    cupy.cuda.Device().synchronize()
    assert cupy.asnumpy(a)[0] == values[1], "a write through cupy.asarray(view) was not seen"
