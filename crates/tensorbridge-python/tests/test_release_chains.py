"""Releases re-entering tensorbridge from other frameworks' deleters (host), capsules
consumed by many threads at once, and destructors running while a panic propagates.

Each case runs in a fresh interpreter (``run_isolated`` / ``release_chains.py``): before the
fix these crashed the process (SIGSEGV: tensorbridge's owner touched Python on a null thread
state after PyTorch released the GIL around its storage deleter; SIGABRT: a panic resumed
inside a capsule destructor), which must be a failing test, not a dead pytest run.
"""

import pytest

from tbhelpers import run_isolated, run_release_chains

# The chains that crashed before the fix, spelled out (each also in the matrix below).
CRASHED_CHAINS = [
    "x = torch.zeros(16); v = tb.asview(x); t = torch.from_dlpack(v); w = tb.asview(t); del v, t, w",
    "x = torch.zeros(16); v = tb.asview(x); t = torch.from_dlpack(v); w = tb.asview(t); del v, w, t",
    "x = torch.zeros(16); v = tb.asview(x); t = torch.from_dlpack(v); w = tb.asview(t); del w, t, v",
    "b = aligned_numpy((16,), np.float32); v = tb.from_ptr(b.ctypes.data, (16,), 'float32', device='cpu', "
    "owner=b, release=lambda: done.append(1)); del b; t = torch.from_dlpack(v); w = tb.asview(t); del v, t, w",
    "x = torch.zeros(16); v = tb.asview(x); t = torch.from_dlpack(v); "
    "c = torch.utils.dlpack.to_dlpack(t); w = tb.asview(c); del v, t, c, w",
    "x = torch.zeros(16); v = tb.asview(x); t = torch.from_dlpack(v); "
    "c = torch.utils.dlpack.to_dlpack(t); del v, t; w = tb.asview(c); del w, c",
]


def test_chains_through_torch_release_the_owner_once():
    """The chains that crashed, each released in the order given, in one fresh interpreter
    (each snippet prints its number first, so a crash names it); the memory's owner is
    released exactly once, after the last user."""
    pytest.importorskip("torch")
    body = "\n".join(
        f"""
print("SNIPPET {k}", flush=True)
done = []
{snippet}
gc.collect()
if "x" in globals():
    weakref.finalize(x, done.append, 1)
    del x
    gc.collect()
assert done == [1], ({k}, done)
"""
        for k, snippet in enumerate(CRASHED_CHAINS)
    )
    r = run_isolated(
        "import gc, weakref, numpy as np, torch, tensorbridge as tb\n"
        "from tbhelpers import aligned_numpy\n" + body + "\nprint('ok')\n",
        timeout=120,
    )
    ran = [line for line in r.stdout.splitlines() if line.startswith("SNIPPET ")]
    assert r.returncode == 0, (
        f"rc {r.returncode} in {ran[-1] if ran else '?'}: "
        f"{CRASHED_CHAINS[int(ran[-1].split()[1])] if ran else ''}\n{r.stderr[-3000:]}"
    )
    assert r.stdout.split()[-1] == "ok"


@pytest.mark.parametrize("threads", [1, 16])
def test_every_chain_every_release_order(threads):
    """Every chain of up to three hops through every host producer/consumer present
    (tensorbridge ``asview``/``from_ptr``/``__dlpack__``, torch ``from_dlpack`` and
    ``to_dlpack`` capsules, NumPy, JAX ``from_dlpack``/``__dlpack__``, TensorFlow's
    ``experimental.dlpack``), each released in every order; on 16 threads the objects are
    made on one thread and released on another. The memory's owner is released exactly
    once, never while a user is alive."""
    stats = run_release_chains("cpu", threads)
    assert not stats["failures"], "\n".join(stats["failures"][:50])
    assert stats["chains"] > 0 and stats["orders"] > stats["chains"]
    print(
        f"\n{stats['chains']} chains, {stats['orders']} release orders on {threads} thread(s); "
        f"hops {stats['hops']}; absent {stats['absent']}"
    )


def test_many_threads_consume_one_capsule_exactly_once(tb):
    """Free-threaded builds run consumers in parallel: consumption is one critical section
    per capsule, so exactly one thread gets the tensor, the others a BufferError that says
    the capsule was used, and the producer's deleter runs once (after the winner is gone).
    On GIL builds the GIL serialises the same steps; the test runs there too."""
    import threading
    import weakref

    import numpy as np

    threads = 16
    for round_ in range(50):
        a = np.arange(16, dtype=np.float32)
        released = []
        weakref.finalize(a, released.append, 1)
        for versioned in (True, False):
            v = tb.asview(a)
            capsule = v.__dlpack__(max_version=(1, 3)) if versioned else v.__dlpack__()
            del v
            barrier = threading.Barrier(threads)
            won, refused, other = [], [], []

            def consume():
                barrier.wait()
                try:
                    won.append(tb.asview(capsule))
                except BufferError as e:
                    refused.append(str(e))
                except BaseException as e:  # noqa: BLE001 - collected, asserted below
                    other.append(repr(e))

            ts = [threading.Thread(target=consume) for _ in range(threads)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            assert not other, other
            assert len(won) == 1, f"round {round_}: {len(won)} threads got the tensor"
            assert len(refused) == threads - 1
            assert all("already consumed" in m for m in refused), refused[0]
            assert won[0].ptr == a.ctypes.data
            del won, capsule
        del a
        assert released == [1], "released once, after the last user"


PANIC_SETUP = """
import gc, sys, weakref, numpy as np, tensorbridge as tb

def find_panic_exception():
    # pyo3 creates its PanicException type (module pyo3_runtime) the first time the
    # extension takes an error: make it take one, then find the type among
    # BaseException's subclasses.
    class Raises:
        def __dlpack__(self, *a, **k):
            raise RuntimeError("producer error")
        def __dlpack_device__(self):
            return (1, 0)
    try:
        tb.asview(Raises())
    except RuntimeError:
        pass
    found = [c for c in BaseException.__subclasses__()
             if c.__module__ == "pyo3_runtime" and c.__name__ == "PanicException"]
    assert len(found) == 1, found
    return found[0]

PanicException = find_panic_exception()

def boom():
    raise PanicException("a Rust panic propagating through Python")

def consume(*args):
    raise AssertionError("never called: an argument raised first")
"""


@pytest.mark.parametrize(
    "what, expr",
    [
        # Capsules on the value stack when the exception unwinds the frame: their
        # destructors run while it is in flight.
        ("unconsumed versioned capsule", "consume(v.__dlpack__(max_version=(1, 3)), boom())"),
        ("unconsumed legacy capsule", "consume(v.__dlpack__(), boom())"),
        # The last reference to a View whose owner calls `release` (Python code).
        ("from_ptr view with release", "consume(make_from_ptr_view(), boom())"),
        # A capsule whose export's owner is the last holder of a from_ptr view's memory.
        ("capsule of a from_ptr view", "consume(make_from_ptr_view().__dlpack__(max_version=(1, 3)), boom())"),
    ],
)
def test_destructors_while_a_panic_exception_propagates(what, expr):
    r = run_isolated(
        PANIC_SETUP
        + f"""
a = np.arange(8.0)
v = tb.asview(a)
del a
calls = []
keep = np.zeros(4, dtype=np.float32)
def make_from_ptr_view():
    return tb.from_ptr(keep.ctypes.data, (4,), "float32", device="cpu", owner=keep,
                       release=lambda: calls.append(1))
try:
    {expr}
except PanicException as e:
    assert "Rust panic propagating" in str(e), e
    print("propagated")
else:
    raise AssertionError("no exception")
del v
gc.collect()
if "from_ptr" in {what!r}:
    assert calls == [1], calls
print("ok")
"""
    )
    assert r.returncode == 0, f"{what}: rc {r.returncode}\n{r.stderr[-3000:]}"
    assert r.stdout.split() == ["propagated", "ok"], r.stdout
