"""Refusals on the GPU: copies that cannot be made raise MemoryError (device memory
exhausted; a broadcast CUDA view copied to the host, far larger than what it spans), and
CUDA tensors torch refuses to export are refused with torch's own exception and message
(not a C++ backtrace, not another interface's error)."""

import gc

import pytest

import tensorbridge as tb
from gpu_frameworks import cudart
from tbhelpers import read_capsule

MB2 = 2 << 20


def test_device_copy_out_of_memory_is_memory_error():
    """A device copy (``copy=True``) that ``cuMemAlloc`` cannot serve: MemoryError, and the
    process goes on (a small copy is made afterwards)."""
    torch = pytest.importorskip("torch")
    free, _ = torch.cuda.mem_get_info()
    n = int(free * 0.6) // MB2 * MB2
    rt = cudart()
    p = rt.malloc(n)
    try:
        v = tb.from_ptr(p, (n,), "uint8", device="cuda:0")
        with pytest.raises(MemoryError, match="cannot allocate"):
            v.__dlpack__(max_version=(1, 3), copy=True, stream=-1)
        small = tb.from_ptr(p, (1024,), "uint8", device="cuda:0")
        info = read_capsule(small.__dlpack__(max_version=(1, 3), copy=True, stream=-1))
        assert info.is_copied and info.ptr != p
        del v, small
        gc.collect()
    finally:
        rt.free(p)


def test_broadcast_cuda_view_to_host_is_refused():
    """One float32 broadcast to 16 TiB, asked for on the host (``dl_device=(1, 0)``)."""
    rt = cudart()
    p = rt.malloc(MB2)
    try:
        v = tb.from_ptr(p, (1 << 21, 1 << 21), "float32", strides=(0, 0), device="cuda:0")
        with pytest.raises(MemoryError, match="spans only 4 bytes"):
            v.__dlpack__(max_version=(1, 3), dl_device=(1, 0))
        del v
        gc.collect()
    finally:
        rt.free(p)


CUDA_REFUSALS = {
    "sparse_coo": lambda torch: torch.eye(3, device="cuda").to_sparse(),
    "conj": lambda torch: torch.ones(3, dtype=torch.complex64, device="cuda").conj(),
}


@pytest.mark.parametrize("case", sorted(CUDA_REFUSALS))
def test_torch_cuda_refusals_are_torchs_own(case):
    """Before the fix: sparse tensors failed in the C exchange API (RuntimeError with C++
    frames). A tensor that requires grad is no longer refused: see the test below."""
    torch = pytest.importorskip("torch")
    t = CUDA_REFUSALS[case](torch)
    with pytest.raises(Exception) as theirs:
        t.__dlpack__(max_version=(1, 3))
    with pytest.raises(Exception) as ours:
        tb.asview(t)
    assert type(ours.value) is type(theirs.value), (repr(ours.value), repr(theirs.value))
    assert str(ours.value) == str(theirs.value)
    assert "frame #" not in str(ours.value)


@pytest.mark.parametrize("kind", ["parameter", "leaf"])
def test_cuda_tensor_requiring_grad_is_a_read_only_view(kind):
    """torch refuses to export a CUDA tensor that requires grad (it once went on to
    ``__cuda_array_interface__`` and failed there); tensorbridge reads it, as C++ extensions
    and tvm-ffi read ``nn.Parameter`` inputs, through a read-only view: zero-copy, and no
    consumer can write into it (a write would bypass autograd): the view's ``__dlpack__`` and
    CUDA Array Interface refuse it as PyTorch's do (``torch.from_dlpack`` ignores DLPack's
    read-only flag, CuPy the interface's), in PyTorch's exception classes."""
    torch = pytest.importorskip("torch")
    base = torch.arange(6, dtype=torch.float32, device="cuda")
    t = torch.nn.Parameter(base) if kind == "parameter" else base.clone().requires_grad_(True)
    with pytest.raises(Exception):
        t.__dlpack__(max_version=(1, 3))
    v = tb.asview(t)
    assert v.readonly and v.ptr == t.data_ptr() and v.device == "cuda:0"
    with pytest.raises(RuntimeError, match="requires grad"):
        v.__cuda_array_interface__
    for max_version in (None, (1, 3)):
        with pytest.raises(BufferError, match="requires grad"):
            v.__dlpack__(max_version=max_version)
    with pytest.raises(BufferError, match="requires grad"):
        torch.from_dlpack(v)
    assert t.detach().tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


@pytest.mark.parametrize("liar", ["subclass", "mode"])
def test_cuda_storage_is_verified_not_believed(liar):
    """The pin of a CUDA tensor's view is its own storage, whatever a subclass or a
    ``TorchFunctionMode`` answers for ``untyped_storage()`` (test_boundary_storage.py does
    the CPU side in child interpreters). A subclass's override is never asked: after
    ``swap_tensors`` and churn through the caching allocator, the view still reads its
    values. A mode naming another storage is refused with ``RuntimeError``; a mode that
    answers truthfully is not."""
    torch = pytest.importorskip("torch")
    from torch.overrides import TorchFunctionMode

    n = 1 << 20

    class Liar(torch.Tensor):
        def untyped_storage(self):
            return torch.empty(1, device="cuda").untyped_storage()

    class Mode(TorchFunctionMode):
        def __init__(self, truthful):
            super().__init__()
            self.truthful, self.asked = truthful, 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            if getattr(func, "__name__", "") == "untyped_storage":
                self.asked += 1
                if not self.truthful:
                    return torch.empty(1, device="cuda").untyped_storage()
            return func(*args, **(kwargs or {}))

    t = torch.arange(n, dtype=torch.float32, device="cuda")
    if liar == "mode":
        with Mode(truthful=False) as m, pytest.raises(RuntimeError, match=r"untyped_storage\(\)"):
            tb.asview(t)
        assert m.asked
        with Mode(truthful=True) as m:
            v = tb.asview(t)
        assert m.asked
    else:
        t = t.as_subclass(Liar)
        v = tb.asview(t)
    ptr = v.ptr
    assert ptr == t.data_ptr()
    u = torch.full((n,), -1.0, device="cuda").as_subclass(type(t))
    torch.utils.swap_tensors(t, u)
    del u
    gc.collect()
    assert t.data_ptr() != ptr, "the swap did not move the tensor (the test proves nothing)"
    junk = [torch.full((n,), 7.0, device="cuda") for _ in range(8)]
    back = torch.from_dlpack(v)
    assert back.data_ptr() == ptr
    assert torch.equal(back, torch.arange(n, dtype=torch.float32, device="cuda"))
    del junk
