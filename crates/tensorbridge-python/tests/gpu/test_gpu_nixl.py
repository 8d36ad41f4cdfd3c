"""``tensorbridge.nixl`` on GPUs: two processes on two GPUs for every producer/consumer pair
among PyTorch, CuPy and JAX; a producer kept busy ~100 ms (the transfer carries the final
values; the control, NIXL by hand, shows the race; a peer READing a busy producer's tensors
gets the final values, ``describe`` having waited); 1,000 tensors of one allocation
registered as one descriptor; typed refusals of managed and cross-allocation memory; virtual
memory registered with a warning, or refused on request.

NIXL comes from the wheel folder ``TB_NIXL_WHEELS`` (the bundle's run.sh installs it and
sets ``TB_REQUIRE_NIXL=1``); without it these tests skip, saying so. Two GPUs are needed for
the pair tests (they skip on one, saying so).
"""

import hashlib
import os
import subprocess
import sys

import numpy as np
import pytest

import tensorbridge as tb
import tensorbridge.nixl as tbn
from gpu_frameworks import cudart
from nixlhelpers import peers, require_nixl  # noqa: F401 - peers: a fixture

FRAMEWORKS = ["torch", "cupy", "jax"]
N, K = 8, 1 << 14  # 8 tensors of 64 KiB, one buffer


def digest(values: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(values, np.float32).tobytes()).hexdigest()


def two_gpus():
    n = cudart().device_count()
    if n < 2:
        pytest.skip(f"needs two GPUs (a process on each), found {n}")


def introduced(peers, producer, consumer, start=0):
    """A producer on GPU 0 sending N tensors from ``start`` and a consumer on GPU 1 receiving
    them, both registered and introduced to each other; ``producer`` and ``consumer`` are
    (agent name, framework). Returns (producer, consumer, the send's and the receive's
    answers)."""
    prod = peers(producer[0], producer[1], "cuda:0")
    cons = peers(consumer[0], consumer[1], "cuda:1")
    sent = prod.ask(op="send", n=N, k=K, dtype="float32", start=start)
    recv = cons.ask(op="recv", n=N, k=K, dtype="float32")
    cons.ask(op="peer", md=sent["md"])
    prod.ask(op="peer", md=recv["md"])
    return prod, cons, sent, recv


@pytest.mark.parametrize("producer", FRAMEWORKS)
@pytest.mark.parametrize("consumer", FRAMEWORKS)
def test_pair_across_two_gpus(peers, producer, consumer):
    two_gpus()
    for fw in {producer, consumer}:
        pytest.importorskip(fw)
    prod, cons, sent, recv = introduced(
        peers, (f"p-{producer}", producer), (f"c-{consumer}", consumer), start=3
    )
    assert sent["count"] == 1 and recv["count"] == 1  # one registration descriptor per side
    # PyTorch's and CuPy's default allocators hand out memory CUDA IPC can share (cudaMalloc
    # under a cache); JAX's may not, which registers all the same, named in `staged`.
    for fw, answer in ((producer, sent), (consumer, recv)):
        if fw != "jax" or answer is recv:  # a JAX consumer receives into CuPy memory
            assert answer["staged"] == [], (fw, answer["staged"])
    got = cons.ask(op="read", peer=f"p-{producer}", remote=sent["remote"])
    assert got["digest"] == digest(np.arange(N * K) + 3)


@pytest.mark.parametrize("ordered", [True, False], ids=["tensorbridge", "control-by-hand"])
def test_busy_producer_transfer_carries_final_values(peers, ordered):
    two_gpus()
    pytest.importorskip("torch")
    prod, cons, _, recv = introduced(
        peers, ("busy-producer", "torch"), ("busy-consumer", "torch")
    )
    out = prod.ask(
        op="write_busy", peer="busy-consumer", remote=recv["remote"], tag="busy",
        ordered=ordered, busy_ms=100,
    )
    got = cons.ask(op="wait", peer="busy-producer", tag="busy")
    if ordered:
        assert got["digest"] == out["final_digest"], "the transfer did not carry the final values"
    else:
        # The control: NIXL posted with nothing waiting copies what is there before the
        # producer's 100 ms of work ends. If this ever matches, the ordering test above
        # proves nothing on this machine.
        assert got["digest"] != out["final_digest"], "the control did not show the race"


def test_busy_producer_read_by_its_peer_gets_final_values(peers):
    """The other direction: the peer READs, so nothing on the producer's side orders the
    copy; ``describe`` waits for the producer's pending work before handing out the
    description."""
    two_gpus()
    pytest.importorskip("torch")
    prod, cons, _, _ = introduced(peers, ("busy-source", "torch"), ("busy-reader", "torch"))
    out = prod.ask(op="describe_busy", busy_ms=100)
    got = cons.ask(op="read", peer="busy-source", remote=out["remote"])
    assert got["digest"] == out["final_digest"]


def test_thousand_tensors_of_one_allocation_register_as_one_descriptor():
    require_nixl()
    torch = pytest.importorskip("torch")
    x = torch.zeros(1000 * 256, device="cuda:0")
    parts = list(x.split(256))
    agent = tbn.make_agent("one-descriptor")
    with tbn.register(agent, parts) as reg:
        assert reg.count == 1
        [descs] = reg.descs
        assert descs.mem_type == "VRAM"
        assert descs.tuples() == [(x.data_ptr(), x.numel() * 4, 0)]
    # Two small tensors of the caching allocator's same segment: one descriptor too (the
    # driver's allocation, not adjacency, decides), spanning both.
    a = torch.zeros(256, device="cuda:0")
    b = torch.zeros(256, device="cuda:0")
    [d] = tbn.registration_descs([a, b])
    lo = min(a.data_ptr(), b.data_ptr())
    hi = max(a.data_ptr(), b.data_ptr()) + 1024
    assert d.tuples() == [(lo, hi - lo, 0)]


def test_managed_memory_is_refused():
    cupy = pytest.importorskip("cupy")
    mem = cupy.cuda.memory.malloc_managed(4096)
    x = cupy.ndarray((1024,), cupy.float32, memptr=mem)
    with pytest.raises(tbn.ManagedMemoryError, match="managed"):
        tbn.registration_descs(x)


def test_span_crossing_allocations_is_refused():
    cupy = pytest.importorskip("cupy")
    ptr = cupy.cuda.runtime.malloc(1 << 20)
    try:

        class TooLong:  # a producer that lies: twice its allocation
            __cuda_array_interface__ = {
                "shape": (1 << 19,), "typestr": "<f4", "data": (ptr, False), "version": 3,
                "strides": None, "stream": None,
            }

        # Refused at import (tensorbridge checks CUDA spans against the driver) or, for
        # views made otherwise, by the adapter: never handed to NIXL.
        with pytest.raises((ValueError, tbn.CrossAllocationError), match="past the allocation|inside the allocation"):
            tbn.registration_descs(tb.asview(TooLong()))
    finally:
        cupy.cuda.runtime.free(ptr)


def test_virtual_memory_registers_with_a_warning_or_is_refused_on_request():
    """PyTorch's expandable segments map memory through the virtual memory API, which CUDA
    IPC cannot share: registered as NIXL by hand would (named in ``staged``, a
    ``StagedMemoryWarning``), refused with ``require_ipc=True``."""
    pytest.importorskip("torch")
    code = (
        "import warnings, torch, tensorbridge.nixl as tbn\n"
        "x = torch.zeros(1 << 20, device='cuda:0')\n"
        "a = tbn.make_agent('vmm')\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    reg = tbn.register(a, x)\n"
        "print('warned', [type(m.message).__name__ for m in w])\n"
        "print('staged', len(reg.staged), 'virtual memory' in reg.staged[0] if reg.staged else None)\n"
        "reg.deregister()\n"
        "try:\n    tbn.register(a, x, require_ipc=True)\n    print('accepted')\n"
        "except tbn.VirtualMemoryError as e:\n    print('VirtualMemoryError')\n"
    )
    env = {**os.environ, "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    lines = [line for line in out.stdout.splitlines() if line.split(" ")[0] in
             ("warned", "staged", "accepted", "VirtualMemoryError")]
    assert lines == ["warned ['StagedMemoryWarning']", "staged 1 True", "VirtualMemoryError"], (
        out.stdout + out.stderr
    )
