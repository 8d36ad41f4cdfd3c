"""``tb.share`` / ``tb.open`` / ``tb.Handle`` without a GPU: the handle format as the CUDA
layer documents it (``crates/tensorbridge-cuda/src/ipc/wire.rs``; the encoder below is written
from that table, not from the Rust code), pickling by every protocol and through a spawned
process, every refusal of a bad handle (a clean ``ValueError``, never a crash), and what
``share``/``open`` say where there is nothing to share or no driver to open with. The GPU
half (real producer and consumer processes) is ``gpu/test_gpu_ipc.py``.
"""

import ctypes
import multiprocessing as mp
import pickle
import struct

import numpy as np
import pytest

FIXED = struct.Struct("<8sIIIBBHBBHIQIIQQQQQQ16s64s64s")
assert FIXED.size == 240


def fnv1a(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def spec(**changes):
    """A float32 (3, 4) tensor, row-major, 1 KiB into a 2 MiB allocation, with an event."""
    s = dict(
        magic=b"TBSHARE\0", version=2, flags=0b10, memory=1, reserved=0,
        dtype=(2, 32, 1), pid=31337, start=123456, uid=1000, slot=12, generation=77,
        nonce=0x0123456789ABCDEF, alloc_size=2 << 20, base_offset=1024, byte_offset=0,
        producer_base=0x7F1200000000, uuid=bytes(range(16)), mem_handle=b"\x5a" * 64,
        event_handle=b"\xa5" * 64, shape=(3, 4), strides=(4, 1), length=None,
    )  # fmt: skip
    s.update(changes)
    return s


def encode(s) -> bytes:
    ndim = len(s["shape"])
    length = s["length"] if s["length"] is not None else 248 + 16 * ndim
    code, bits, lanes = s["dtype"]
    body = FIXED.pack(
        s["magic"], s["version"], length, s["flags"], s["memory"], ndim, s["reserved"],
        code, bits, lanes, s["pid"], s["start"], s["uid"], s["slot"], s["generation"],
        s["nonce"], s["alloc_size"], s["base_offset"], s["byte_offset"], s["producer_base"],
        s["uuid"], s["mem_handle"], s["event_handle"],
    )  # fmt: skip
    body += struct.pack(f"<{2 * ndim}q", *s["shape"], *s["strides"])
    return body + struct.pack("<Q", fnv1a(body))


def test_the_documented_format_is_a_handle(tb):
    data = encode(spec())
    h = tb.Handle(data)
    assert bytes(h) == data
    assert h.shape == (3, 4) and h.strides == (4, 1)
    assert h.dtype_name == "float32" and not h.readonly
    assert h.producer_pid == 31337
    assert h.device_uuid == "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"
    assert "float32[3, 4]" in repr(h) and "31337" in repr(h)
    # bytes-like carriers: bytearray, memoryview
    assert tb.Handle(bytearray(data)) == h
    assert tb.Handle(memoryview(data)) == h
    assert tb.Handle(encode(spec(flags=0b11))).readonly


@pytest.mark.parametrize("protocol", range(2, pickle.HIGHEST_PROTOCOL + 1))
def test_handles_pickle_as_their_bytes(tb, protocol):
    h = tb.Handle(encode(spec()))
    back = pickle.loads(pickle.dumps(h, protocol=protocol))
    assert type(back) is tb.Handle
    assert back == h and hash(back) == hash(h) and bytes(back) == bytes(h)
    assert len(pickle.dumps(h, protocol=protocol)) < 600, "a few hundred bytes on the wire"
    assert back != tb.Handle(encode(spec(slot=13)))
    assert h != bytes(h), "a handle equals handles, not bytes"


def _child_echo(q_in, q_out):
    h = q_in.get(timeout=60)
    q_out.put((type(h).__name__, bytes(h), h.shape, h.dtype_name))


def test_a_handle_travels_to_a_spawned_process(tb):
    h = tb.Handle(encode(spec()))
    ctx = mp.get_context("spawn")
    q_in, q_out = ctx.Queue(), ctx.Queue()
    p = ctx.Process(target=_child_echo, args=(q_in, q_out))
    p.start()
    try:
        q_in.put(h)
        name, data, shape, dtype = q_out.get(timeout=120)
    finally:
        p.join(timeout=60)
    assert p.exitcode == 0
    assert (name, data, shape, dtype) == ("Handle", bytes(h), (3, 4), "float32")


def test_every_truncation_and_padding_is_a_value_error(tb):
    data = encode(spec())
    for n in range(len(data)):
        with pytest.raises(ValueError, match="not a tensorbridge share handle|bytes long but"):
            tb.Handle(data[:n])
    with pytest.raises(ValueError, match=f"is {len(data) + 1} bytes long but {len(data)} were expected"):
        tb.Handle(data + b"\0")


def test_every_changed_byte_is_a_value_error(tb):
    data = encode(spec())
    for i in range(len(data)):
        for mask in (0x01, 0x80):
            bad = bytearray(data)
            bad[i] ^= mask
            with pytest.raises(ValueError):
                tb.Handle(bytes(bad))
    bad = bytearray(data)
    bad[100] ^= 1
    with pytest.raises(ValueError, match="checksum"):
        tb.Handle(bytes(bad))


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(version=1), "format version 1"),
        (dict(flags=1 << 3), "flags"),
        (dict(memory=2), "memory kind"),
        (dict(pid=0), "producer process id"),
        (dict(alloc_size=0), "allocation size"),
        (dict(base_offset=2 << 20), "base offset"),
        (dict(generation=0), "slot generation"),
        (dict(base_offset=(2 << 20) - 16), r"describes bytes \[2097136, 2097184\) of an allocation of 2097152 bytes"),
        (dict(base_offset=8, strides=(-4, 1)), r"describes bytes \[-24, "),
        (dict(shape=(1,) * 65, strides=(1,) * 65), "rank is 65"),
        (dict(dtype=(99, 32, 1)), r"dtype \(code << 24 \| bits << 16 \| lanes\) is 1663041537"),
    ],
)
def test_forged_fields_are_value_errors(tb, changes, message):
    # The checksum recomputed, as a forger would: the field checks are what refuse.
    with pytest.raises(ValueError, match=message):
        tb.Handle(encode(spec(**changes)))


def test_not_bytes_is_a_type_error(tb):
    with pytest.raises(TypeError, match="tensorbridge.Handle or its bytes"):
        tb.Handle("TBSHARE")
    with pytest.raises(TypeError, match="tensorbridge.Handle or its bytes"):
        tb.open(12345)


def test_host_memory_is_not_shared(tb):
    with pytest.raises(ValueError, match="memory on cpu cannot be shared with another process"):
        tb.share(np.arange(6, dtype=np.float32))
    buf = (ctypes.c_float * 4)()
    v = tb.from_ptr(ctypes.addressof(buf), (4,), "float32", device="cpu", owner=buf)
    with pytest.raises(ValueError, match="memory on cpu cannot be shared"):
        tb.share(v)
    torch = pytest.importorskip("torch")
    with pytest.raises(ValueError, match="memory on cpu cannot be shared"):
        tb.share(torch.zeros(3))


def test_open_checks_the_stream_then_needs_a_driver(tb):
    h = tb.Handle(encode(spec()))
    with pytest.raises(ValueError):
        tb.open(h, stream=-1)
    if _driver_present():
        pytest.skip("a CUDA driver is present: the no-driver path runs where there is none")
    with pytest.raises(RuntimeError, match="no CUDA driver"):
        tb.open(h)
    with pytest.raises(RuntimeError, match="no CUDA driver"):
        tb.open(bytes(h), stream=None)


def _driver_present() -> bool:
    for name in ("libcuda.so.1", "libcuda.so"):
        try:
            ctypes.CDLL(name)
            return True
        except OSError:
            continue
    return False
