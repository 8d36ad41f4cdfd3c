"""``tensorbridge.nixl``'s CUDA half through a CUDA driver (the stand-in in CI, the real one in
the GPU bundle): registration descriptors grouped by the driver's allocation (a gap between
tensors of one allocation still one descriptor, two allocations two), the device id, a span
past its allocation refused, memory CUDA IPC cannot share (a stream-ordered pool) registered
with a ``StagedMemoryWarning`` or refused with ``require_ipc``, transfer runs of a strided CUDA
view, and ``ready`` (a private stream made to wait, then synchronized). NIXL itself is not
needed: descriptors are built, not registered (VRAM registration needs a CUDA-enabled UCX and a
GPU: ``gpu/test_gpu_nixl.py``)."""

import warnings

import pytest

import tensorbridge as tb
import tensorbridge.nixl as tbn
from share_driver_worker import driver_or_skip


@pytest.fixture(scope="module")
def cuda():
    return driver_or_skip()


@pytest.fixture
def alloc(cuda):
    ptrs = []

    def make(nbytes):
        ptrs.append(cuda.alloc(nbytes))
        return ptrs[-1]

    yield make
    for p in ptrs:
        cuda.free(p)


def view(ptr, n, offset=0, strides=None, shape=None):
    return tb.from_ptr(ptr + offset, shape or (n,), "float32", strides=strides, device="cuda:0")


def test_tensors_of_one_allocation_are_one_descriptor_gaps_included(alloc):
    a = alloc(1 << 16)
    b = alloc(1 << 16)
    # Two tensors of `a` with a gap between them, one of `b`.
    [descs] = tbn.registration_descs([view(a, 16), view(a, 16, offset=4096), view(b, 64)])
    assert descs.mem_type == "VRAM"
    assert sorted(descs.tuples()) == sorted([(a, 4096 + 64, 0), (b, 256, 0)])


def test_memory_type_and_device(alloc):
    assert tbn.memory_of(view(alloc(256), 64)) == ("VRAM", 0)


def test_span_past_its_allocation_is_refused(alloc):
    ptr = alloc(4096)

    class TooLong:  # a producer that lies: twice its allocation
        __cuda_array_interface__ = {
            "shape": (2048,), "typestr": "<f4", "data": (ptr, False), "version": 3,
            "strides": None, "stream": None,
        }

    # tensorbridge's import checks CUDA spans against the driver's allocation already, so
    # such a span never reaches NIXL; the adapter checks again for views made otherwise.
    with pytest.raises((ValueError, tbn.CrossAllocationError), match="past the allocation|inside the allocation"):
        tbn.registration_descs(tb.asview(TooLong()))


class RecordingAgent:
    """What ``register`` asks of a NIXL agent, recorded: the descriptors it registers."""

    def __init__(self):
        self.registered = []

    def get_reg_descs(self, array, mem_type):
        return (mem_type, [tuple(int(x) for x in row) for row in array])

    def register_memory(self, dlist, mem_type, backends):
        self.registered.append(dlist)

    def deregister_memory(self, dlist, backends):
        self.registered.remove(dlist)


def test_pool_memory_registers_with_a_warning_or_is_refused_on_request(cuda, alloc):
    """Memory legacy CUDA IPC cannot share is what NIXL by hand takes too: registered, the
    tensor named in ``staged`` and a ``StagedMemoryWarning`` raised; ``require_ipc=True``
    refuses it with the typed error instead. Plain device memory raises neither."""
    ptr = cuda.alloc_async(4096)
    try:
        pooled = view(ptr, 256)
        agent = RecordingAgent()
        with pytest.warns(tbn.StagedMemoryWarning, match="stream-ordered pool"):
            reg = tbn.register(agent, pooled)
        assert reg.staged and "tensor 0" in reg.staged[0] and "pool" in reg.staged[0]
        assert agent.registered == [("VRAM", [(ptr, 1024, 0)])]
        reg.deregister()
        assert agent.registered == []
        with pytest.raises(tbn.PoolMemoryError, match="require_ipc=True") as e:
            tbn.register(agent, pooled, require_ipc=True)
        assert "stream-ordered pool" in e.value.found and agent.registered == []
        with pytest.raises(tbn.PoolMemoryError):
            tbn.registration_descs([view(alloc(256), 64), pooled], require_ipc=True)
        # One call asks the driver once per allocation: the verdict of one allocation never
        # reaches a tensor of another, whichever order they come in.
        plain = alloc(8192)
        mixed = [view(plain, 16), pooled, view(plain, 16, offset=4096), view(ptr, 16, offset=2048)]
        with pytest.warns(tbn.StagedMemoryWarning):
            reg = tbn.register(agent, mixed)
        assert [w.split("): ")[0] + ")" for w in reg.staged] == [
            "tensor 1 (cuda:0, float32[256])", "tensor 3 (cuda:0, float32[16])"
        ]
        assert sorted(agent.registered[0][1]) == sorted([(plain, 4096 + 64, 0), (ptr, 2048 + 64, 0)])
        reg.deregister()
    finally:
        cuda.free_async(ptr)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # plain device memory: no warning
        reg = tbn.register(RecordingAgent(), view(alloc(1024), 256))
    assert reg.staged == [] and reg.count == 1


def test_strided_cuda_view_runs(alloc):
    ptr = alloc(4 * 6 * 8)
    t = view(ptr, 0, shape=(8, 6), strides=(1, 8))  # a transpose: single-element runs
    descs = tbn.xfer_descs(t)
    assert descs.mem_type == "VRAM" and len(descs) == 48
    want = [(ptr + 4 * (c * 8 + r), 4, 0) for r in range(8) for c in range(6)]
    assert descs.tuples() == want


def test_ready_waits_on_a_private_stream_and_returns_views(alloc):
    ptr = alloc(1024)
    v = view(ptr, 256)
    [back] = tbn.ready([v])
    assert back.ptr == ptr and back.device == "cuda:0"
    assert tbn.ready(v)[0].ptr == ptr  # one tensor, not a list
    remote = tbn.describe(v)  # waits as ready does
    assert remote.mem_type == "VRAM" and remote.descs.tuples() == [(ptr, 1024, 0)]
