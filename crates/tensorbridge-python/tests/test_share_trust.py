"""The sharing protocol's trust model from Python, through a CUDA driver (the stand-in in CI,
a GPU in the bundle): one regression per defect an independent review reproduced, and
hypothesis editing handles and lifetime files. Skips where no libcuda loads (the ordinary
CPU suite), as ``test_share_driver.py`` does; ``TB_REQUIRE_DRIVER=1`` makes that a failure.

Invariants under attack (ARCHITECTURE.md, "Sharing protocol: trust model"):
- every open of a handle, also one of a share this process already holds, gives a view
  inside the allocation shared, or a typed error;
- nothing written into or cut from a lifetime file kills the producer or a consumer;
- a forked child dropping an inherited handle revokes nothing; a failed open costs no ticket;
  another user's handle is refused; no planted file hangs a producer.
"""

from __future__ import annotations

import gc
import os
import threading
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

# The driver worker comes with the stand-in's Python tests (``test_share_driver.py``).
_worker = pytest.importorskip("share_driver_worker", reason="needs share_driver_worker.py, the driver tests' worker")
Allocation, WorkerError = _worker.Allocation, _worker.WorkerError
driver_or_skip, workers_of = _worker.driver_or_skip, _worker.workers_of
from tbhelpers import eventually  # noqa: E402 - after the check above
from share_trust_worker import TrustWorker  # noqa: E402 - after the check above

N = 4096
# 2 MiB: an allocation no driver rounds up (its granularity), so the genuine view of the
# edited-handle test is exactly what the driver maps, and anything past it is past the mapping.
N_EDIT = 1 << 19
settings.register_profile("trust", max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def drv():
    return driver_or_skip()


@pytest.fixture
def worker():
    yield from workers_of(TrustWorker)


def altered(data: bytes, at: int, new: bytes) -> bytes:
    """``data`` with bytes ``at..`` replaced and the FNV-1a checksum recomputed."""
    b = bytearray(data)
    b[at : at + len(new)] = new
    h = 0xCBF29CE484222325
    for c in b[:-8]:
        h = ((h ^ c) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    b[-8:] = h.to_bytes(8, "little")
    return bytes(b)


def u(data: bytes, at: int, n: int) -> int:
    return int.from_bytes(data[at : at + n], "little")


def lifetime_file(data: bytes) -> str | None:
    """The producer's lifetime file for handle ``data`` (this version's per-user directory,
    or by name in /dev/shm itself for older versions), if it exists."""
    uid, pid, nonce = u(data, 40, 4), u(data, 28, 4), u(data, 56, 8)
    for p in (f"/dev/shm/tensorbridge-{uid}/ipc-{pid}-{nonce:016x}", f"/dev/shm/tensorbridge-ipc-{uid}-{pid}-{nonce:016x}"):
        if os.path.exists(p):
            return p
    return None


def call_within(w, seconds, op, **args):
    """``w.call`` that kills the worker past ``seconds`` (its call then fails): a hang fails."""
    timer = threading.Timer(seconds, w.kill)
    timer.start()
    try:
        return w.call(op, **args)
    finally:
        timer.cancel()


# ---- edited handles, also on a share already held ----

edits = st.fixed_dictionaries(
    {},
    optional={
        "alloc_size": st.sampled_from([2, 3, 16, 1 << 10]).map(lambda k: k * 4 * N_EDIT) | st.integers(1, 1 << 48),
        "base_offset": st.integers(0, 8 * 4 * N_EDIT),
        "byte_offset": st.integers(0, 8 * 4 * N_EDIT),
        "shape": st.integers(0, 4 * N_EDIT),
        "stride": st.integers(-3, 3),
        "mem": st.tuples(st.integers(112, 175), st.integers(1, 255)),
    },
)


def edit(data: bytes, e: dict) -> bytes:
    at = {"alloc_size": 64, "base_offset": 72, "byte_offset": 80, "shape": 240, "stride": 248}
    for k, v in e.items():
        if k == "mem":
            i, x = v
            data = altered(data, i, bytes([data[i] ^ x]))
        else:
            data = altered(data, at[k], int(v).to_bytes(8, "little", signed=True))
    return data


def test_every_open_of_an_edited_handle_stays_inside_the_allocation(tb, drv, worker):
    a = Allocation(tb, drv, N_EDIT)
    h = tb.share(a.view(tb), consumers=0)
    genuine = bytes(h)
    w = worker()
    lo, hi = w.call("open_keep", handle=genuine.hex())  # held from here on: opens below reuse it
    assert hi - lo == 4 * N_EDIT

    @settings(settings.get_profile("trust"))
    @given(edits)
    def check(e):
        try:
            got = w.call("open_keep", handle=edit(genuine, e).hex())
        except WorkerError as err:
            assert err.kind in ("ValueError", "RuntimeError"), str(err)
            return
        try:
            assert got is None or lo <= got[0] <= got[1] <= hi, f"a view of [{got[0]:#x}, {got[1]:#x}) outside [{lo:#x}, {hi:#x})"
        finally:
            w.call("drop_last")

    check()
    assert w.call("read", index=N_EDIT - 1, count=1) == [N_EDIT - 1.0], "the held view is still the genuine one"
    w.call("drop")
    w.close()
    del h
    assert eventually(lambda: a.released == 1), "never released"


# ---- damage to lifetime files ----


@settings(settings.get_profile("trust"))
@given(
    writes=st.lists(st.tuples(st.integers(0, 64 + 1024 * 256 + 64), st.binary(min_size=1, max_size=16)), max_size=6),
    size=st.none() | st.integers(0, 2 * (64 + 1024 * 256)),
)
def test_damage_to_a_lifetime_file_kills_neither_side(tb, drv, writes, size):
    a = Allocation(tb, drv, N)
    h = tb.share(a.view(tb), consumers=1)
    data = bytes(h)
    w = TrustWorker()
    try:
        w.call("open_keep", handle=data.hex())
        path = lifetime_file(data)
        assert path is not None
        slot = u(data, 44, 4)
        word = range(64 + 256 * slot, 64 + 256 * slot + 8)
        touched_word = False
        with open(path, "r+b") as f:
            for at, b in writes:
                if at < word.stop and at + len(b) > word.start:
                    touched_word = True
                f.seek(at)
                f.write(b)
            if size is not None:
                f.truncate(size)
        # A second consumer: a view or a typed error, never a crash.
        w2 = TrustWorker()
        try:
            try:
                w2.call("open_keep", handle=data.hex())
            except WorkerError as err:
                assert err.kind in ("ValueError", "RuntimeError"), str(err)
        finally:
            w2.close()
        assert w.call("read", index=7, count=1) == [7.0]
        assert w.call("drop") is True
    finally:
        w.close()
    del h
    gc.collect()
    if not touched_word:
        # The slot's tickets and `OPEN` are intact (or unreadable): the holders' locks decide.
        assert eventually(lambda: a.released == 1), "never released"
    # The producer lives on and shares again.
    b = Allocation(tb, drv, 16)
    assert len(bytes(tb.share(b.view(tb), consumers=0))) > 0


# ---- one regression each ----


def test_a_forked_child_dropping_its_handle_revokes_nothing(tb, drv, worker):
    a = Allocation(tb, drv, N)
    h = tb.share(a.view(tb), consumers=0)  # openable only while h lives
    pid = os.fork()
    if pid == 0:
        try:
            del h
            gc.collect()
        finally:
            os._exit(0)
    deadline = time.time() + 20
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.time() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("the forked child hung dropping its handle")
        time.sleep(0.01)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    w = worker()
    lo, hi = w.call("open_keep", handle=bytes(h).hex())
    assert hi - lo == 4 * N
    w.call("drop")
    w.close()
    del h
    assert eventually(lambda: a.released == 1), "never released"


def test_a_failed_open_gives_its_ticket_back(tb, drv, worker):
    a = Allocation(tb, drv, N)
    h = tb.share(a.view(tb), consumers=1)
    data = bytes(h)
    del h
    gc.collect()
    w = worker()
    with pytest.raises(WorkerError):
        w.call("open_keep", handle=altered(data, 112, b"\x5a" * 64).hex())
    w.call("open_keep", handle=data.hex())  # the ticket is still there
    w.call("drop")
    w.close()
    assert eventually(lambda: a.released == 1), "never released"


def test_another_users_handle_is_refused(tb, drv, worker):
    a = Allocation(tb, drv, N)
    h = tb.share(a.view(tb), consumers=0)
    other = (os.geteuid() + 1) & 0xFFFFFFFF
    with pytest.raises(ValueError, match=f"made by user {other}"):
        tb.open(altered(bytes(h), 40, other.to_bytes(4, "little")))
    w = worker()
    with pytest.raises(WorkerError, match=f"made by user {other}"):
        w.call("open_keep", handle=altered(bytes(h), 40, other.to_bytes(4, "little")).hex())
    w.close()
    del h
    assert eventually(lambda: a.released == 1), "never released"


def test_a_planted_fifo_hangs_no_producer(tb, drv, worker):
    uid = os.geteuid()
    planted = [f"/dev/shm/tensorbridge-ipc-{uid}-1-00000000000000f2"]  # where older versions looked
    own = f"/dev/shm/tensorbridge-{uid}"
    if os.path.isdir(own):
        planted.append(f"{own}/ipc-1-00000000000000f2")
    for p in planted:
        os.mkfifo(p, 0o600)
    try:
        w = worker()
        data = bytes.fromhex(call_within(w, 30, "share", n=16))  # a fresh process's first share
        assert len(data) > 0
    finally:
        for p in planted:
            os.unlink(p)
