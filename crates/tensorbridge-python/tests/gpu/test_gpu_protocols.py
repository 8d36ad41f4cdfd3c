"""Producers that expose only the CUDA Array Interface, in each of its versions (0 to 3), and
the interface's refusals: a mask, stream 0, a span past the allocation, a bad typestr. The
producer object is kept alive while the view lives (CAI has no owner slot of its own).
"""

import gc
import weakref

import numpy as np
import pytest

import tensorbridge as tb


class CaiOnly:
    def __init__(self, iface, keep):
        self.__cuda_array_interface__ = iface
        self.keep = keep


def _cai(a, **changes):
    d = dict(a.__cuda_array_interface__)
    d.update(changes)
    return d


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_cai_versions(version):
    cupy = pytest.importorskip("cupy")
    torch = pytest.importorskip("torch")
    a = cupy.arange(16, dtype=cupy.float32).reshape(4, 4)
    cupy.cuda.Device().synchronize()
    d = _cai(a, version=version)
    if version < 3:
        d.pop("stream", None)
    if version < 1:
        d.pop("mask", None)
    if version >= 2:
        d["strides"] = None  # v2 made None mean C-contiguous
    v = tb.asview(CaiOnly(d, a))
    assert (v.ptr, v.shape, v.strides, v.dtype, v.device) == (a.data.ptr, (4, 4), (4, 1), "float32", "cuda:0")
    t = torch.from_dlpack(v)
    assert t.data_ptr() == a.data.ptr
    np.testing.assert_array_equal(t.cpu().numpy(), np.arange(16).reshape(4, 4))


def test_cai_only_producer_kept_alive():
    cupy = pytest.importorskip("cupy")
    a = cupy.arange(1024, dtype=cupy.float32)
    p = CaiOnly(_cai(a), a)
    dead = []
    weakref.finalize(p, dead.append, 1)
    v = tb.asview(p)
    del p, a
    gc.collect()
    assert not dead
    y = cupy.from_dlpack(v)
    del v
    gc.collect()
    assert not dead and float(y[1000]) == 1000.0
    del y
    gc.collect()
    assert dead == [1]


@pytest.mark.parametrize(
    "change, exc",
    [
        ({"mask": "set below"}, ValueError),
        ({"stream": 0}, ValueError),  # 0 is ambiguous, CAI forbids it
        ({"shape": (1 << 30,)}, ValueError),  # the span runs past the allocation
        ({"typestr": ">f4"}, ValueError),
        ({"data": (0x1234567890123400, False)}, ValueError),  # not a CUDA allocation
    ],
    ids=["mask", "stream0", "past-allocation", "big-endian", "fabricated-pointer"],
)
def test_cai_refusals(change, exc):
    cupy = pytest.importorskip("cupy")
    a = cupy.arange(16, dtype=cupy.float32)
    if "mask" in change:
        change = {"mask": CaiOnly(_cai(cupy.ones(16, cupy.bool_)), None)}
    with pytest.raises(exc):
        tb.asview(CaiOnly(_cai(a, **change), a))
