"""Release chains: memory handed through up to three hops between tensorbridge and the
frameworks present, every object of the chain released in every order, on one thread or
on many. Run as a script in a fresh interpreter (a crash is then the parent test's failure,
not a dead pytest): ``test_release_chains.py`` (host) and ``gpu/test_gpu_release_chains.py``
(CUDA) start it.

Why: a chain such as ``v = tb.asview(x); t = torch.from_dlpack(v); w = tb.asview(t)``
released as ``del v, t, w`` makes PyTorch destroy ``t``'s storage with the GIL released
(its tensor deallocation does that around the storage's deleter) from inside tensorbridge's
own frame (``w``'s owner drops ``t``), and that deleter is tensorbridge's export deleter,
whose owner then touches Python. Any framework's deleter may re-enter tensorbridge this
way; the order of releases decides which one runs last and where.

What each chain checks:
- the root's memory owner (the object ``from_ptr`` was given, or the object ``asview`` was
  given) is released exactly once (a counting ``release`` callback, ``weakref.finalize``);
- never while an object that shares the memory (same data pointer, not a consumed capsule)
  is alive: the count is checked after every single release;
- at the end, after every object is gone (frameworks that free on a worker thread get up to
  a few seconds).

Usage: ``python release_chains.py --device cpu|cuda --threads N [--skip-through ID]``.
Prints ``START <id>`` before each chain (so a crash names the chain that was running) and,
at the end, one JSON line ``RESULT {...}``: chains run, orders run, hops refused, failures.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import queue
import sys
import threading
import time
import weakref

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("JAX_ENABLE_X64", "1")
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import numpy as np  # noqa: E402

import tensorbridge as tb  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

from tbhelpers import aligned_numpy, capsule_name, read_capsule  # noqa: E402

MAX_HOPS = 3
N = 16  # float32 elements: 64 bytes, aligned to 64 so JAX and TF share instead of copying


def _module(name):
    try:
        return __import__(name, fromlist=["_"])
    except Exception:  # noqa: BLE001 - absent or broken: its hops are left out, and listed
        return None


def is_capsule(x) -> bool:
    return type(x).__name__ == "PyCapsule"


def fresh_capsule(x) -> bool:
    return is_capsule(x) and capsule_name(x) in ("dltensor", "dltensor_versioned")


class Forward:
    """A producer that forwards DLPack and the CUDA Array Interface to an array that has no
    weak references, holding it: its own death (weakly referenced) is the array's release."""

    def __init__(self, array):
        self.array = array
        if hasattr(array, "__cuda_array_interface__"):
            self.__cuda_array_interface__ = array.__cuda_array_interface__

    def __dlpack__(self, *args, **kwargs):
        return self.array.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self.array.__dlpack_device__()


class Hop:
    """One hand-off: ``apply(x)`` makes a new object over ``x``'s memory (or a copy of it)."""

    def __init__(self, name, accepts, apply, consumes_capsule=True):
        self.name, self.accepts, self.apply = name, accepts, apply
        self.consumes_capsule = consumes_capsule


def frameworks(device: str):
    """(roots, hops, pointer-of, absent framework names) for ``device``."""
    torch = _module("torch")
    jax = _module("jax")
    jnp = _module("jax.numpy") if jax else None
    absent = []
    roots = {}
    hops = []

    def counted_root(make_owner, ptr_of_owner):
        """``from_ptr`` over memory an owner object holds, with a counting release."""

        def root():
            owner = make_owner()
            released = []
            fin = []
            try:
                weakref.finalize(owner, fin.append, 1)
            except TypeError:
                fin = None
            v = tb.from_ptr(ptr_of_owner(owner), (N,), "float32", device=device, owner=owner,
                            release=lambda: released.append(1))
            return v, (lambda: len(released) + (len(fin) if fin is not None else 0),
                       2 if fin is not None else 1)

        return root

    def asview_root(make_owner):
        def root():
            owner = make_owner()
            try:
                weakref.ref(owner)
            except TypeError:
                # No weak references (CuPy's ndarray): a forwarding producer stands in, so
                # that tensorbridge still imports through the array's own protocols.
                owner = Forward(owner)
            fin = []
            weakref.finalize(owner, fin.append, 1)
            return tb.asview(owner), (lambda: len(fin), 1)

        return root

    hops.append(Hop("tb.asview", lambda x: True, tb.asview))

    def view_capsule(x):
        return x.__dlpack__(max_version=(1, 3)) if device == "cpu" else x.__dlpack__(max_version=(1, 3), stream=-1)

    hops.append(Hop("View.__dlpack__", lambda x: isinstance(x, tb.View), view_capsule, False))

    if device == "cpu":
        roots["from_ptr(numpy)"] = counted_root(lambda: aligned_numpy((N,), np.float32, fill=1.0),
                                                lambda a: a.ctypes.data)
        roots["asview(numpy)"] = asview_root(lambda: aligned_numpy((N,), np.float32, fill=1.0))
        hops.append(Hop("np.from_dlpack", lambda x: not is_capsule(x), np.from_dlpack))
        if torch is not None:
            roots["asview(torch)"] = asview_root(lambda: torch.ones(N))
            hops.append(Hop("torch.from_dlpack", lambda x: not is_capsule(x) or fresh_capsule(x),
                            torch.from_dlpack))
            hops.append(Hop("torch.to_dlpack", lambda x: isinstance(x, torch.Tensor),
                            torch.utils.dlpack.to_dlpack, False))
        else:
            absent.append("torch")
        if jax is not None:
            hops.append(Hop("jnp.from_dlpack", lambda x: not is_capsule(x), jnp.from_dlpack))
            # JAX as a producer is the next hop's input (its `__dlpack__`); its own unconsumed
            # capsules are left out: JAX frees them about a second late, on its own schedule,
            # which only slows the matrix down (tensorbridge's, torch's and TF's are here).
        else:
            absent.append("jax")
        tf = _module("tensorflow")
        if tf is not None:
            def tf_from(x):
                # TF takes only a legacy capsule; a consumed or versioned one is refused.
                return tf.experimental.dlpack.from_dlpack(x if is_capsule(x) else x.__dlpack__())

            def tf_accepts(x):
                if is_capsule(x):
                    return capsule_name(x) == "dltensor"
                return hasattr(x, "__dlpack__") and not isinstance(x, tf.Tensor)

            hops.append(Hop("tf.from_dlpack", tf_accepts, tf_from))
            hops.append(Hop("tf.to_dlpack", lambda x: isinstance(x, tf.Tensor),
                            tf.experimental.dlpack.to_dlpack, False))
        else:
            absent.append("tensorflow")
    else:
        cupy = _module("cupy")
        if torch is not None and torch.cuda.is_available():
            roots["asview(torch)"] = asview_root(lambda: torch.ones(N, device="cuda"))
            roots["from_ptr(torch)"] = counted_root(lambda: torch.ones(N, device="cuda"),
                                                    lambda t: t.data_ptr())
            hops.append(Hop("torch.from_dlpack", lambda x: not is_capsule(x) or fresh_capsule(x),
                            torch.from_dlpack))
            hops.append(Hop("torch.to_dlpack", lambda x: isinstance(x, torch.Tensor),
                            torch.utils.dlpack.to_dlpack, False))
        else:
            absent.append("torch")
        if cupy is not None:
            roots["asview(cupy)"] = asview_root(lambda: cupy.ones(N, dtype=cupy.float32))
            hops.append(Hop("cupy.from_dlpack", lambda x: not is_capsule(x) or fresh_capsule(x),
                            cupy.from_dlpack))
            hops.append(Hop("cupy.asarray(CAI)",
                            lambda x: hasattr(x, "__cuda_array_interface__") and not isinstance(x, cupy.ndarray),
                            cupy.asarray))
        else:
            absent.append("cupy")
        numba_cuda = _module("numba.cuda")
        if numba_cuda is not None:
            hops.append(Hop("numba.as_cuda_array",
                            lambda x: hasattr(x, "__cuda_array_interface__") and not is_capsule(x),
                            numba_cuda.as_cuda_array))
            if hasattr(numba_cuda, "from_dlpack"):
                hops.append(Hop("numba.from_dlpack", lambda x: not is_capsule(x) and hasattr(x, "__dlpack__"),
                                numba_cuda.from_dlpack))
        else:
            absent.append("numba")
        try:
            from gpu_frameworks import CudaCoreGpu, cuda_core

            _, smv = cuda_core()
            stream = CudaCoreGpu.consumer_stream()

            def smv_from(x):
                if hasattr(smv, "from_dlpack"):
                    return smv.from_dlpack(x, stream_ptr=stream)
                return smv(x, stream_ptr=stream)

            hops.append(Hop("cuda.core.StridedMemoryView",
                            lambda x: not is_capsule(x) and hasattr(x, "__dlpack__"), smv_from))
        except Exception:  # noqa: BLE001 - absent: listed
            absent.append("cuda.core")
        if jax is not None:
            try:
                jax.devices("gpu")
                hops.append(Hop("jax.from_dlpack", lambda x: not is_capsule(x), jax.dlpack.from_dlpack))
            except Exception:  # noqa: BLE001 - a CPU-only jax
                absent.append("jax[cuda]")
        else:
            absent.append("jax")
    return roots, hops, absent


def ptr_of(x):
    """The object's data pointer without tensorbridge, or None (a consumed capsule, or a
    framework with no accessor)."""
    if isinstance(x, tb.View):
        return x.ptr
    if is_capsule(x):
        return read_capsule(x).ptr if fresh_capsule(x) else None
    for attr in ("data_ptr",):
        if hasattr(x, attr) and callable(getattr(x, attr)):
            return x.data_ptr()
    if hasattr(x, "unsafe_buffer_pointer"):
        return x.unsafe_buffer_pointer()
    if hasattr(x, "__array_interface__"):
        return x.__array_interface__["data"][0]
    if hasattr(x, "__cuda_array_interface__"):
        return x.__cuda_array_interface__["data"][0]
    if hasattr(x, "ptr") and isinstance(getattr(x, "ptr"), int):
        return x.ptr
    if type(x).__module__.startswith("tensorflow"):
        import tensorflow as tf

        return read_capsule(tf.experimental.dlpack.to_dlpack(x)).ptr
    if hasattr(x, "data") and hasattr(x.data, "ptr"):  # cupy
        return x.data.ptr
    return None


def chains(roots, hops):
    """Every (root, hop names) of 0 to MAX_HOPS hops whose hops accept their inputs' kinds
    (decided while building: a refused hop ends that chain)."""
    for root in sorted(roots):
        for n in range(0, MAX_HOPS + 1):
            for combo in itertools.product(range(len(hops)), repeat=n):
                yield root, combo


def build(roots, hops, root, combo, with_shares=False):
    """(objects, sharing flags, released-count function, expected count) or None when a hop
    does not accept its input or refuses it (that chain is a shorter one already run)."""
    v, (count, expected) = roots[root]()
    objs = [v]
    base = v.ptr
    for i in combo:
        hop = hops[i]
        x = objs[-1]
        if not hop.accepts(x):
            return None
        try:
            y = hop.apply(x)
        except Exception:  # noqa: BLE001 - a refusal (read-only, dtype...) ends the chain
            return None
        objs.append(y)
    shares = [ptr_of(x) == base for x in objs] if with_shares else None
    return objs, shares, count, expected


def release_in_order(objs, shares, count, order, fail):
    """Drops ``objs`` in ``order``; the memory's owner must stay unreleased while a sharing
    object lives, and be released exactly ``expected`` times once all are gone."""
    slots = list(objs)
    del objs[:]
    alive = set(range(len(slots)))
    for k in order:
        slots[k] = None
        alive.discard(k)
        # A consumed capsule (renamed used_*) holds nothing: it is no user.
        users = [j for j in alive if shares[j] and not (is_capsule(slots[j]) and not fresh_capsule(slots[j]))]
        if users and count() != 0:
            fail(f"released after dropping #{k} while {users} still use the memory")
            return


def settle(count, expected, fail, late):
    """Checks the release count once every object is gone: exactly ``expected`` now, or,
    for frameworks that free on their own schedule (JAX frees memory it exported about a
    second later), put on ``late`` for one check at the end of the run."""
    c = count()
    if c == expected:
        return
    if c > expected:
        fail(f"released {c} times, expected {expected}")
        return
    late.append((count, expected, fail))


def check_late(late, seconds=10.0):
    """The end of the run: every late chain must reach its count (collecting meanwhile)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(count() < expected for count, expected, _ in late):
        gc.collect()
        time.sleep(0.01)
    for count, expected, fail in late:
        if count() != expected:
            fail(f"released {count()} times, expected {expected} (after waiting {seconds} s)")


def run(device, threads, skip_through):
    roots, hops, absent = frameworks(device)
    work = []
    for cid, (root, combo) in enumerate(chains(roots, hops)):
        if cid <= skip_through:
            continue
        work.append((cid, root, combo))
    stats = {"chains": 0, "orders": 0, "refused": 0, "failures": [], "absent": absent,
             "hops": [h.name for h in hops], "roots": sorted(roots), "threads": threads}
    lock = threading.Lock()
    late = []

    def label(cid, root, combo):
        return f"{cid} {root} -> " + " -> ".join(hops[i].name for i in combo)

    def one_chain(cid, root, combo, release_on=None):
        name = label(cid, root, combo)
        if threads == 1:
            print("START", name, flush=True)
        # The first build decides whether the chain exists and which objects share the
        # root's memory (pointers read once: TF's costs a capsule); it is released in order 0.
        built = build(roots, hops, root, combo, with_shares=True)
        if built is None:
            with lock:
                stats["refused"] += 1
            return
        shares = built[1]
        for order in itertools.permutations(range(len(shares))):
            if built is None:
                built = build(roots, hops, root, combo)
            if built is None:  # refused this time: report, it was accepted before
                with lock:
                    stats["failures"].append(f"{name}: a hop refused on a second build")
                return
            objs, _, count, expected = built
            built = None

            def fail(msg, order=order):
                with lock:
                    stats["failures"].append(f"{name} order {order}: {msg}")

            if release_on is None:
                release_in_order(objs, shares, count, order, fail)
            else:
                done = threading.Event()
                release_on.put((objs, shares, count, order, fail, done))
                del objs
                done.wait()
            settle(count, expected, fail, late)
            with lock:
                stats["orders"] += 1
        with lock:
            stats["chains"] += 1

    if threads == 1:
        for item in work:
            one_chain(*item)
    else:
        # Each thread builds its share of the chains and hands every chain to the next
        # thread's releaser, which drops the objects in order: releases happen on another
        # thread than the one that made them, while every other thread works.
        queues = [queue.Queue() for _ in range(threads)]
        errors = []

        def releaser(q):
            while True:
                item = q.get()
                if item is None:
                    return
                objs, shares, count, order, fail, done = item
                del item
                try:
                    release_in_order(objs, shares, count, order, fail)
                finally:
                    del objs
                    done.set()

        def builder(k, barrier):
            try:
                barrier.wait()
                for item in work[k::threads]:
                    one_chain(*item, release_on=queues[(k + 1) % threads])
            except BaseException as e:  # noqa: BLE001 - reported as a failure
                errors.append(f"thread {k}: {type(e).__name__}: {e}")

        rel = [threading.Thread(target=releaser, args=(q,)) for q in queues]
        barrier = threading.Barrier(threads)
        bld = [threading.Thread(target=builder, args=(k, barrier)) for k in range(threads)]
        for t in rel + bld:
            t.start()
        for t in bld:
            t.join()
        for q in queues:
            q.put(None)
        for t in rel:
            t.join()
        stats["failures"].extend(errors)
    stats["late"] = len(late)
    check_late(late)
    print("RESULT", json.dumps(stats), flush=True)
    return 0


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--skip-through", type=int, default=-1)
    a = p.parse_args(argv)
    return run(a.device, a.threads, a.skip_through)


if __name__ == "__main__":
    sys.exit(main())
