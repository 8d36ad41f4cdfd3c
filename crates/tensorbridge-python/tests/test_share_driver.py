"""``tb.share`` / ``tb.open`` across processes through a CUDA driver, with no framework: device
memory comes from the driver API through ctypes (``share_driver_worker.Driver``), is wrapped
with ``tb.from_ptr`` and shared with a worker process that opens it and reads and writes it
with the same calls.

CI runs this module with the stand-in driver first on ``LD_LIBRARY_PATH`` (``cargo xtask ci``
and ``cargo xtask test-standin``; ``TB_REQUIRE_DRIVER=1`` makes a driver that does not load a
failure), the GPU bundle on the real one. In the ordinary CPU suite, where no libcuda loads, it
skips. The framework pairs, ordering against busy producers and the device-memory soak are
``gpu/test_gpu_ipc.py``'s.
"""

from __future__ import annotations

import gc
import os
import pickle
import time

import numpy as np
import pytest

from share_driver_worker import Allocation, Worker, WorkerError, driver_or_skip, workers_of
from tbhelpers import eventually

N = 4096


@pytest.fixture(scope="module")
def drv():
    return driver_or_skip()


@pytest.fixture
def worker():
    yield from workers_of(Worker)


def fnv1a(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def altered(data: bytes, at: int, new: bytes) -> bytes:
    """``data`` with bytes ``at..`` replaced and the checksum recomputed (layout:
    ``crates/tensorbridge-cuda/src/ipc/wire.rs``)."""
    b = bytearray(data)
    b[at : at + len(new)] = new
    b[-8:] = fnv1a(bytes(b[:-8])).to_bytes(8, "little")
    return bytes(b)


def test_values_and_writes_cross_both_ways_and_the_memory_is_released_once(tb, drv, worker):
    a = Allocation(tb, drv, N)
    h = tb.share(a.view(tb), consumers=1)
    w = worker()
    assert w.call("open", handle=bytes(h).hex()) == [N]
    assert w.call("read", index=0, count=N) == list(range(N)), "the consumer read other values"
    w.call("write", index=0, values=[-1.0])
    assert drv.read(a.ptr, 1)[0] == -1.0, "the consumer's write is not seen here"
    drv.write(a.ptr + 4, [42.0])
    assert w.call("read", index=1, count=1) == [42.0], "this write is not seen there"
    w.call("drop")
    w.close()
    assert a.released == 0, "released while the producer's handle lives"
    del h
    assert eventually(lambda: a.released == 1), "never released"
    time.sleep(0.05)
    gc.collect()
    assert a.released == 1, "released more than once"


def test_a_pickled_handle_opens_and_a_killed_consumer_lets_go(tb, drv, worker):
    a = Allocation(tb, drv, N)
    h = tb.share(a.view(tb), consumers=1)
    sent = pickle.loads(pickle.dumps(h))
    w = worker()
    w.call("open", handle=bytes(sent).hex())
    assert w.call("read", index=N - 1, count=1) == [N - 1.0]
    w.kill()
    del h, sent
    assert eventually(lambda: a.released == 1), "a killed consumer's hold kept the memory"


def test_a_ticket_keeps_the_memory_after_the_producer_handle_is_gone(tb, drv, worker):
    a = Allocation(tb, drv, N)
    h = tb.share(a.view(tb), consumers=1)
    data = bytes(h)
    del h
    gc.collect()
    time.sleep(0.05)
    assert a.released == 0, "freed with a ticket outstanding"
    w = worker()
    w.call("open", handle=data.hex())
    assert w.call("read", index=3, count=1) == [3.0]
    w.call("drop")
    w.close()
    assert eventually(lambda: a.released == 1), "never released"


def test_altered_handles_are_value_errors_in_the_consumer(tb, drv, worker):
    a = Allocation(tb, drv, N)
    h = tb.share(a.view(tb), consumers=0)
    data = bytes(h)
    damaged = bytearray(data)
    damaged[130] ^= 4
    with pytest.raises(ValueError):
        tb.Handle(bytes(damaged))
    size = int.from_bytes(data[64:72], "little")
    w = worker()
    for name, bad in [
        ("size", altered(data, 64, (2 * size).to_bytes(8, "little"))),
        ("uuid", altered(data, 96, b"\xee" * 16)),
    ]:
        with pytest.raises(WorkerError) as e:
            w.call("open", handle=bad.hex())
        assert e.value.kind == "ValueError", f"{name}: {e.value}"
    # A memory handle the driver never made: the driver refuses it.
    with pytest.raises(WorkerError) as e:
        w.call("open", handle=altered(data, 112, b"\x5a" * 64).hex())
    assert e.value.kind == "RuntimeError", str(e.value)
    assert "cuIpcOpenMemHandle" in e.value.message
    # The refusals left nothing held: the real handle still opens, and the memory goes.
    assert w.call("open", handle=data.hex()) == [N]
    w.call("drop")
    w.close()
    del h
    assert eventually(lambda: a.released == 1), "never released"


def test_no_altered_handle_opens_a_view_past_the_allocation(tb, drv, worker):
    """Any bytes of the handle changed (checksum recomputed, as whoever alters a handle can):
    the consumer refuses it with a typed error, or opens a view whose first and last bytes
    lie in one allocation the driver knows. Never a crash, never a view past the mapping."""
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies
    a = Allocation(tb, drv, N)
    h = tb.share(a.view(tb), consumers=0)
    data = bytes(h)
    w = worker()

    @hypothesis.settings(max_examples=60, deadline=None, derandomize=True)
    @hypothesis.given(at=st.integers(16, len(data) - 9), new=st.binary(min_size=1, max_size=8))
    def check(at, new):
        bad = altered(data, at, new[: len(data) - 8 - at])
        try:
            assert w.call("span", handle=bad.hex()), f"a view past the allocation: offset {at}, {new.hex()}"
        except WorkerError as e:
            assert e.kind in ("ValueError", "RuntimeError"), str(e)

    check()
    w.close()
    del h
    assert eventually(lambda: a.released == 1), "never released"


def test_a_producer_that_exited_is_refused(tb, drv, worker):
    p = worker()
    data = bytes.fromhex(p.call("share", n=N))
    p.close()
    with pytest.raises(ValueError, match="exited"):
        tb.open(data)


def test_another_user_cannot_open_a_share(tb, drv, worker):
    if os.geteuid() != 0:
        pytest.skip("needs root, to switch the consumer to another user (CI runs as root)")
    a = Allocation(tb, drv, N)
    h = tb.share(a.view(tb), consumers=0)
    w = worker()
    assert w.call("become", uid=65534) == 65534
    with pytest.raises(WorkerError) as e:
        w.call("open", handle=bytes(h).hex())
    assert e.value.kind == "ValueError", str(e.value)
    assert "same user" in e.value.message
    w.close()
    del h
    assert eventually(lambda: a.released == 1), "never released"
