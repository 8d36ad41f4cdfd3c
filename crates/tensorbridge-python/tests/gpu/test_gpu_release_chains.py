"""Release chains on the GPU: memory handed through up to three hops between tensorbridge
and every CUDA framework present (torch ``from_dlpack``/``to_dlpack``, CuPy ``from_dlpack``
and ``asarray`` over the CUDA Array Interface, Numba ``as_cuda_array``/``from_dlpack``,
cuda.core ``StridedMemoryView``, JAX), each chain released in every order, on one thread
and on 16 (made on one thread, released on another). The memory's owner (a CUDA torch
tensor or CuPy array given to ``asview``, or the owner of a ``from_ptr`` view with a
counting ``release``) is released exactly once, never while a user is alive.

The matrix is ``release_chains.py --device cuda``, run in a fresh interpreter so that a crash
fails the test; under compute-sanitizer run that script directly:
``compute-sanitizer --tool memcheck python3 release_chains.py --device cuda --threads 1``.
"""

import pytest

from tbhelpers import run_isolated, run_release_chains


@pytest.mark.parametrize("threads", [1, 16])
def test_gpu_every_chain_every_release_order(threads):
    stats = run_release_chains("cuda", threads, timeout=580.0)
    assert not stats["failures"], "\n".join(stats["failures"][:50])
    assert stats["chains"] > 0 and stats["orders"] > stats["chains"]
    print(
        f"\n{stats['chains']} chains, {stats['orders']} release orders on {threads} thread(s); "
        f"hops {stats['hops']}; absent {stats['absent']}"
    )


@pytest.mark.parametrize(
    "snippet",
    [
        "t = torch.from_dlpack(v); w = tb.asview(t); del v, t, w",
        "t = torch.from_dlpack(v); c = torch.utils.dlpack.to_dlpack(t); w = tb.asview(c); del v, t, c, w",
        "t = torch.from_dlpack(v); w = tb.asview(t); a = cupy.from_dlpack(w); del v, t, w, a",
        "t = torch.from_dlpack(v); w = tb.asview(t); a = cupy.asarray(w); del v, t, w, a",
    ],
)
def test_gpu_chains_through_torch_release_the_tensor_once(snippet):
    """The chain that crashed (a View over a CUDA torch tensor, through torch and back, CuPy
    last), released in the order that crashed: the tensor is released once, at the end."""
    pytest.importorskip("torch")
    if "cupy" in snippet:
        pytest.importorskip("cupy")
    r = run_isolated(
        f"""
        import gc, weakref, torch, tensorbridge as tb
        try:
            import cupy
        except ImportError:
            cupy = None
        done = []
        x = torch.zeros(16, device="cuda")
        weakref.finalize(x, done.append, 1)
        v = tb.asview(x)
        del x
        {snippet}
        gc.collect()
        torch.cuda.synchronize()
        assert done == [1], done
        print("ok")
        """,
        timeout=180,
    )
    assert r.returncode == 0, f"rc {r.returncode}\n{r.stderr[-3000:]}"
    assert r.stdout.strip() == "ok"
