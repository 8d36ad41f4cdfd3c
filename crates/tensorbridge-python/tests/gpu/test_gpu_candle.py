"""candle CUDA tensors to PyTorch and back through Python, ordered on the GPU.

The example extension's candle recipes (``crates/tensorbridge-example/src/candle_recipes.rs``,
built with its ``candle-cuda`` feature) make candle's stream busy for BUSY_MS before it writes
the tensor it hands to Python; torch, on a stream of its own, must read the final values
without the host waiting. The other way, torch's stream is kept busy before it writes, and
candle (sharing the memory through ``tensorbridge_candle::export_leaked``) must sum the final
values. Each direction has its control with the ordering left out, which must read stale data:
it proves the race is real, so the ordered runs prove something.

Needs the extension built with ``candle-cuda`` (``cargo xtask test-gpu --candle-cuda`` builds
it so, and its bundle carries that build): without it these tests fail (they do not skip),
since a GPU bundle that lacks them has not tested candle, unless the bundle says it was built
without that opt-in (``TB_GPU_CANDLE=0``, written by ``test-gpu`` into ``run.sh``): then they
skip with that reason. So does an extension that cannot be imported:
the candle build links libcuda, cuBLAS, cuRAND and the CUDA runtime, and a library missing
from the loader's path is an ``ImportError``, which must not pass for a skip.

candle's devices, its kernels and the producer kernel are made once, before anything is
timed (the ``warm`` fixture): making a candle device costs milliseconds of host time, which
would otherwise count as the host waiting.
"""

import os
import time

import pytest

if os.environ.get("TB_GPU_CANDLE") == "0":
    pytest.skip(
        "the GPU bundle was built without --candle-cuda (candle's CUDA half is opt-in): "
        "candle on the GPU was not tested",
        allow_module_level=True,
    )

torch = pytest.importorskip("torch")
try:
    import tensorbridge_example as ext
except ImportError as e:
    pytest.fail(f"tensorbridge_example does not import: {e}", pytrace=False)

N = 1 << 20
BUSY_MS = 100
HOST_LIMIT_S = 0.5 * BUSY_MS / 1000


def _has_candle():
    assert hasattr(ext, "candle_busy_fill"), (
        "tensorbridge_example was built without its `candle-cuda` feature: build the wheel "
        "with `--features candle-cuda` (docs/BUILDING.md, \"candle\")"
    )


@pytest.fixture(scope="module", autouse=True)
def warm():
    """Both candle devices made, candle's fill and reduce kernels and the producer loaded."""
    _has_candle()
    for own_stream in (False, True):
        v = ext.candle_busy_fill(16, 1.0, 0, own_stream)
        assert torch.from_dlpack(v).sum().item() == 16.0
    assert ext.candle_sum(torch.ones(16, device="cuda"), True) == 16.0
    torch.cuda.synchronize()


@pytest.fixture(scope="module")
def torch_cycles():
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(1000)  # warm-up
    s.record()
    torch.cuda._sleep(20_000_000)
    e.record()
    e.synchronize()
    return int(20_000_000 / s.elapsed_time(e) * BUSY_MS)


@pytest.mark.parametrize("own_stream", [False, True], ids=["per-thread", "own-stream"])
def test_candle_to_torch_after_a_busy_candle_producer(own_stream):
    _has_candle()
    cs = torch.cuda.Stream()
    t0 = time.perf_counter()
    v = ext.candle_busy_fill(N, 7.0, BUSY_MS, own_stream)
    with torch.cuda.stream(cs):
        t = torch.from_dlpack(v)  # torch's stream cs waits for candle's on the GPU
        total = t.sum()
    host = time.perf_counter() - t0
    assert t.device.type == "cuda" and t.data_ptr() == v.ptr  # zero-copy
    cs.synchronize()
    assert total.item() == 7.0 * N, "torch read before candle's producer finished"
    assert host < HOST_LIMIT_S, f"the host waited {host * 1e3:.1f} ms for the GPU"


def test_candle_to_torch_control_without_ordering_reads_stale_data():
    _has_candle()
    cs = torch.cuda.Stream()
    v = ext.candle_busy_fill(N, 7.0, BUSY_MS, True)
    cap = v.__dlpack__(stream=-1, max_version=(1, 3))  # "do not synchronise"
    with torch.cuda.stream(cs):
        z = torch.from_dlpack(cap).clone()
    cs.synchronize()
    torch.cuda.synchronize()
    assert not bool((z == 7).all()), "the unordered control read candle's values: no race observed"


def _busy_torch_tensor(torch_cycles, value):
    x = torch.zeros(N, device="cuda")
    torch.cuda.synchronize()
    ps = torch.cuda.Stream()
    with torch.cuda.stream(ps):
        torch.cuda._sleep(torch_cycles)
        x.fill_(value)
    return x, ps


def test_torch_to_candle_after_a_busy_torch_producer(torch_cycles):
    _has_candle()
    x, ps = _busy_torch_tensor(torch_cycles, 3.0)
    with torch.cuda.stream(ps):
        # Imported on torch's current stream (ps): candle's stream waits for it on the GPU.
        total = ext.candle_sum(x, True)
    assert total == 3.0 * N, "candle summed before torch's producer finished"
    torch.cuda.synchronize()


def test_torch_to_candle_control_without_ordering_reads_stale_data(torch_cycles):
    _has_candle()
    x, ps = _busy_torch_tensor(torch_cycles, 3.0)
    with torch.cuda.stream(ps):
        total = ext.candle_sum(x, False)
    torch.cuda.synchronize()
    assert total != 3.0 * N, "the unordered control summed torch's values: no race observed"
