"""``tensorbridge.nixl``: any framework's tensor as NIXL descriptors, on the host.

Descriptor arithmetic is checked without NIXL (runs read back byte for byte against the
tensor's own element order; pairs replayed in-process with memmove); registration and
transfers run through a real NIXL agent (UCX on loopback) and two processes: a NumPy
producer and a PyTorch consumer, and the reverse. Skipped where NIXL is not installed, a
failure with ``TB_REQUIRE_NIXL=1`` (CI installs it: ``python/requirements-nixl.txt``, and runs
this file in a pytest process of its own: NIXL cannot load after TensorFlow, which other
files of the suite import).
"""

import ctypes
import gc
import sys
import weakref

import numpy as np
import pytest

import tensorbridge as tb
import tensorbridge.nixl as tbn
from nixlhelpers import b64, peers, require_nixl, unb64  # noqa: F401 - peers: a fixture


def read_runs(descs):
    return b"".join(ctypes.string_at(int(a), int(n)) for a, n, _ in descs.array)


LAYOUTS = {
    "contiguous": lambda a: a,
    "transposed": lambda a: a.T,
    "column slice": lambda a: a[:, 1:4],
    "step 2": lambda a: a[::2, ::3],
    "negative": lambda a: a[::-1, ::-2],
    "broadcast": lambda a: np.broadcast_to(a[:1], a.shape),
    "one column": lambda a: a[:, 2:3],
}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_runs_are_the_elements_in_order(layout):
    base = np.arange(6 * 7, dtype=np.float64).reshape(6, 7)
    x = LAYOUTS[layout](base)
    descs = tbn.xfer_descs(x)
    assert descs.mem_type == "DRAM"
    assert read_runs(descs) == np.ascontiguousarray(x).tobytes()
    # Adjacent runs are merged: no run ends where the next one starts.
    a, n = descs.array[:, 0], descs.array[:, 1]
    assert not np.any(a[1:] == a[:-1] + n[:-1])


def test_touching_tensors_transfer_as_one_run():
    buf = np.arange(1000, dtype=np.int32)
    parts = [buf[i * 10 : (i + 1) * 10] for i in range(100)]
    descs = tbn.xfer_descs(parts)
    assert descs.tuples() == [(buf.ctypes.data, buf.nbytes, 0)]


def test_slices_of_one_buffer_register_as_one_descriptor():
    buf = np.zeros(1000 * 16, np.float32)
    parts = [buf[i * 16 : (i + 1) * 16] for i in range(1000)][::-1]  # any order
    [descs] = tbn.registration_descs(parts)
    assert descs.tuples() == [(buf.ctypes.data, buf.nbytes, 0)]


def test_separate_buffers_stay_separate_descriptors():
    a, b = np.zeros(64, np.uint8), np.zeros(64, np.uint8)
    [descs] = tbn.registration_descs([a[:10], b, a[32:]])
    assert sorted(descs.tuples()) == sorted(
        [(a.ctypes.data, 10, 0), (a.ctypes.data + 32, 32, 0), (b.ctypes.data, 64, 0)]
    )


def test_strided_registration_covers_the_span():
    buf = np.zeros((8, 8), np.float64)
    [descs] = tbn.registration_descs(buf[::-2, 1:3])
    lo = buf.ctypes.data + 8 * 1 + 64 * 1  # row 1 (the lowest row reached), column 1
    hi = buf.ctypes.data + 64 * 7 + 8 * 3  # row 7, past column 2
    assert descs.tuples() == [(lo, hi - lo, 0)]


@pytest.mark.parametrize("src_layout", ["contiguous", "transposed", "negative"])
@pytest.mark.parametrize("dst_layout", ["contiguous", "transposed", "column slice"])
def test_pairs_replayed_move_every_element(src_layout, dst_layout):
    src = LAYOUTS[src_layout](np.arange(6 * 7, dtype=np.float32).reshape(6, 7) + 1)
    dst = {
        "contiguous": lambda shape: np.zeros(shape, np.float32),
        "transposed": lambda shape: np.zeros(shape[::-1], np.float32).T,
        "column slice": lambda shape: np.zeros(shape + (2,), np.float32)[..., 1],
    }[dst_layout](src.shape)
    remote = tbn.Remote.from_bytes(bytes(tbn.describe(dst)))
    local, far = tbn._pair(tbn.xfer_descs(src), remote.descs)
    assert np.array_equal(local[:, 1], far[:, 1])
    for (la, n, _), (ra, _, _) in zip(local, far):
        ctypes.memmove(int(ra), int(la), int(n))
    assert np.array_equal(dst, src)


def test_sides_of_different_sizes_are_refused():
    with pytest.raises(tbn.LayoutError, match="sides of equal size"):
        tbn._pair(tbn.xfer_descs(np.zeros(4, np.float32)), tbn.xfer_descs(np.zeros(5, np.float32)))


def test_too_many_runs_is_a_clear_error():
    x = np.zeros((100, 100), np.float32).T
    with pytest.raises(tbn.LayoutError, match="at most 99 contiguous runs") as e:
        tbn.xfer_descs(x, max_runs=99)
    assert isinstance(e.value, ValueError) and isinstance(e.value, BufferError)
    assert "10000 runs of 4 bytes" in str(e.value)


def test_refusals_are_typed():
    with pytest.raises(tbn.ReadOnlyMemoryError, match="read-only view"):
        tbn.registration_descs(np.frombuffer(b"abcdefgh", np.uint8))
    [d] = tbn.registration_descs(np.frombuffer(b"abcdefgh", np.uint8), allow_readonly=True)
    assert len(d) == 1
    with pytest.raises(tbn.UnregistrableMemoryError, match="at least one element"):
        tbn.registration_descs(np.zeros((3, 0)))
    for bad in [b"", b"{", b'{"magic": "x"}', bytes(tbn.describe(np.zeros(2))).replace(b'"DRAM"', b'"FILE"')]:
        with pytest.raises(ValueError, match="remote description"):
            tbn.Remote.from_bytes(bad)
    tampered = bytes(tbn.describe(np.zeros(2))).replace(b",16,0]", b",-16,0]")
    with pytest.raises(ValueError, match="integer triples"):
        tbn.Remote.from_bytes(tampered)


def test_devices_without_a_nixl_memory_type_are_refused():
    buf = np.zeros(16, np.uint8)
    try:
        v = tb.from_ptr(buf.ctypes.data, (16,), "uint8", device=(7, 0), owner=buf)  # Vulkan
    except (ValueError, TypeError, BufferError) as e:
        pytest.skip(f"from_ptr does not make a Vulkan view here: {e}")
    with pytest.raises(tbn.UnregistrableMemoryError, match="device vulkan"):
        tbn.registration_descs(v)


def test_missing_nixl_is_an_import_error_with_the_install_command(monkeypatch):
    for name in ("nixl", "nixl._api", "nixl_cu13", "nixl_cu13._api", "nixl_cu12", "nixl_cu12._api"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(ImportError, match=r"pip install --no-deps nixl-cu13==1\.5\.1") as e:
        tbn.make_agent("absent")
    assert isinstance(e.value, tbn.NixlNotInstalledError)


def test_nixl_after_tensorflow_is_a_typed_error_not_an_exit():
    """In a fresh process (this one may hold TensorFlow already, or NIXL): TensorFlow then
    NIXL would end the process; tensorbridge refuses with NixlConflictError instead."""
    import subprocess

    pytest.importorskip("tensorflow")
    require_nixl_present()
    code = (
        "import tensorflow, tensorbridge.nixl as tbn\n"
        "try:\n    tbn.import_nixl()\nexcept tbn.NixlConflictError as e:\n"
        "    print('NixlConflictError', 'import NIXL first' in str(e))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().splitlines()[-1:] == ["NixlConflictError True"], (
        out.stdout + out.stderr[-2000:]
    )


def require_nixl_present():
    """A skip where no NIXL package is installed (found, not imported)."""
    import importlib.util
    import os

    if not any(importlib.util.find_spec(p) for p in ("nixl", "nixl_cu13", "nixl_cu12")):
        if os.environ.get("TB_REQUIRE_NIXL") == "1":
            pytest.fail("TB_REQUIRE_NIXL=1, but no NIXL package is installed")
        pytest.skip(f"NIXL not installed ({tbn.NIXL_INSTALL})")


# ---- a real agent ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def agent():
    require_nixl()
    return tbn.make_agent("tb-test-local")


@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_registration_keeps_memory_alive_until_deregistered(agent, framework):
    if framework == "torch":
        torch = pytest.importorskip("torch")
        x = torch.arange(4096, dtype=torch.float32)
    else:
        x = np.arange(4096, dtype=np.float32)
    parts = [x[i * 256 : (i + 1) * 256] for i in range(16)]
    alive = weakref.ref(x)
    reg = tbn.register(agent, parts)
    assert reg.count == 1 and reg.registered
    del x, parts
    gc.collect()
    assert alive() is not None, "registered memory was released while registered"
    reg.deregister()
    gc.collect()
    assert alive() is None, "deregistered memory is still held"
    reg.deregister()  # a second call does nothing


def test_registration_as_a_context_manager_and_refusal_registers_nothing(agent):
    x = np.zeros(1024, np.uint8)
    alive = weakref.ref(x)
    with tbn.register(agent, [x[:512], x[512:]]) as reg:
        assert [d.tuples() for d in reg.descs] == [[(x.ctypes.data, 1024, 0)]]
    del x
    gc.collect()
    assert alive() is None and not reg.registered
    with pytest.raises(tbn.UnregistrableMemoryError):
        tbn.register(agent, [np.zeros(4), np.zeros(0)])


# ---- two processes ----------------------------------------------------------------------


N, K = 8, 64


def expected(start, n=N, k=K):
    return [float(v) for v in np.arange(n * k) + start]


def test_numpy_producer_writes_into_torch_consumer(peers):
    pytest.importorskip("torch")
    consumer = peers("tb-torch-consumer", "torch")
    recv = consumer.ask(op="recv", n=N, k=K, dtype="float32")
    assert recv["count"] == 1  # N tensors of one buffer, one registration descriptor

    agent = tbn.make_agent("tb-numpy-producer")
    buf = (np.arange(N * K) + 1000).astype(np.float32)
    parts = [buf[i * K : (i + 1) * K] for i in range(N)]
    with tbn.register(agent, parts) as reg:
        assert reg.count == 1
        consumer.ask(op="peer", md=b64(agent.get_agent_metadata()))
        name = agent.add_remote_agent(unb64(recv["md"]))
        with tbn.transfer(agent, "WRITE", parts, unb64(recv["remote"]), name, notif=b"np->torch") as x:
            x.wait(timeout=30)
        got = consumer.ask(op="wait", peer="tb-numpy-producer", tag="np->torch")
    assert got["values"] == expected(1000)
    agent.remove_remote_agent(name)


def test_torch_producer_read_by_numpy_consumer_strided(peers):
    torch = pytest.importorskip("torch")
    agent = tbn.make_agent("tb-torch-producer")
    # The producer's tensor is a transpose: its runs are single elements, paired with the
    # consumer's contiguous slices element by element.
    src = (torch.arange(N * K, dtype=torch.float32) + 7).reshape(K, N).T  # (N, K), strided
    with tbn.register(agent, src) as reg:
        assert reg.count == 1
        remote = tbn.describe(src)
        assert len(remote.descs) == N * K
        consumer = peers("tb-numpy-consumer", "numpy")
        consumer.ask(op="recv", n=N, k=K, dtype="float32")
        consumer.ask(op="peer", md=b64(agent.get_agent_metadata()))
        got = consumer.ask(op="read", peer="tb-torch-producer", remote=b64(bytes(remote)))
        assert got["pieces"] == N * K
        assert got["values"] == [float(v) for v in src.reshape(-1)]


def test_readme_recipe_torch_producer_to_jax_consumer(peers):
    """The README's recipe, on the host: a PyTorch tensor registered and described in this
    process; the other process reads it into a buffer of its own, notifies, and hands the
    buffer to JAX; this process deregisters after the notification."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("jax")
    a = tbn.make_agent("A")
    x = torch.linspace(-1, 1, N * K, dtype=torch.float32)
    reg = tbn.register(a, x)
    consumer = peers("B", "numpy")
    consumer.ask(op="recv", n=1, k=N * K, dtype="float32")
    consumer.ask(op="peer", md=b64(a.get_agent_metadata()))
    got = consumer.ask(op="read", peer="A", remote=b64(bytes(tbn.describe(x))), tag="read", jax=True)
    tbn.wait_notification(a, "B", b"read", timeout=30)
    reg.deregister()
    assert got["values"] == [float(v) for v in x]
