"""Lifetime: the producer survives ``del`` + ``gc.collect()`` while a view (or anything made
from it) lives, and is released once the last user is gone. Observed with
``weakref.finalize`` on producers that support weak references: a NumPy subclass, custom
classes for each protocol, torch tensors. Also: consumers dying on other threads, views in
reference cycles, and views still alive at interpreter exit.
"""

import gc
import threading
import weakref

import numpy as np
import pytest

from tbhelpers import NUMPY_DLPACK_VERSIONED, aligned_numpy, np_take, run_isolated


class TrackedArray(np.ndarray):
    """An ndarray subclass (weak-referenceable, unlike a plain ndarray's buffer owner)."""


class DLPackWrapper:
    """A producer object that is not the memory's owner: only its ``__dlpack__`` reaches it."""

    def __init__(self, a):
        self.a = a

    def __dlpack__(self, **kw):
        kw.pop("stream", None)
        return self.a.__dlpack__(**kw)

    def __dlpack_device__(self):
        return (1, 0)


class AIWrapper:
    def __init__(self, a):
        self.a = a
        self.__array_interface__ = a.__array_interface__


def producers():
    def tracked():
        return aligned_numpy((16,), np.float64, fill=np.arange(16)).view(TrackedArray)

    out = {
        "numpy-subclass": tracked,
        "dlpack-wrapper": lambda: DLPackWrapper(aligned_numpy((16,), np.float64, fill=np.arange(16))),
        "array-interface": lambda: AIWrapper(aligned_numpy((16,), np.float64, fill=np.arange(16))),
    }
    try:
        import torch

        out["torch"] = lambda: torch.arange(16, dtype=torch.float64)
    except ImportError:
        pass
    return out


PRODUCERS = producers()


def consumers():
    out = {"view-only": None, "numpy": np_take, "view-of-view": None}
    try:
        import torch

        out["torch"] = torch.from_dlpack
    except ImportError:
        pass
    return out


@pytest.mark.parametrize("consumer", list(consumers()))
@pytest.mark.parametrize("producer", list(PRODUCERS))
def test_producer_lives_exactly_as_long_as_its_users(tb, producer, consumer):
    x = PRODUCERS[producer]()
    dead = []
    weakref.finalize(x, dead.append, True)
    v = tb.asview(x)
    del x
    gc.collect()
    assert not dead, "producer released while the view lives"

    if consumer == "view-only":
        user = None
    elif consumer == "view-of-view":
        user = tb.asview(v)
    else:
        user = consumers()[consumer](v)
    if user is not None:
        del v
        gc.collect()
        assert not dead, f"producer released while a {consumer} consumer lives"
        values = np_take(user) if consumer == "view-of-view" else np.asarray(user)
        np.testing.assert_array_equal(values, np.arange(16))
        del user, values
    else:
        np.testing.assert_array_equal(np_take(v), np.arange(16))
        del v
    gc.collect()
    assert dead == [True], "producer not released after the last user died"


def test_many_views_and_exports_of_one_producer(tb):
    x = aligned_numpy((8,), np.float32, fill=1).view(TrackedArray)
    dead = []
    weakref.finalize(x, dead.append, 1)
    views = [tb.asview(x) for _ in range(4)]
    exports = [np_take(v) for v in views for _ in range(2)]
    del x
    for i in range(len(views)):
        views.pop()
        gc.collect()
        assert not dead
    while exports:
        exports.pop()
        gc.collect()
        assert bool(dead) == (not exports)


def test_consumers_die_on_other_threads(tb):
    x = aligned_numpy((1024,), np.float32, fill=3).view(TrackedArray)
    dead = []
    weakref.finalize(x, dead.append, 1)
    v = tb.asview(x)
    holders = [[np_take(v)] for _ in range(8)]
    try:
        import torch

        holders += [[torch.from_dlpack(v)] for _ in range(8)]
    except ImportError:
        pass
    del x, v
    gc.collect()

    def drop(h):
        assert float(np.asarray(h[0]).sum()) == 3 * 1024
        h.clear()
        gc.collect()

    threads = [threading.Thread(target=drop, args=(h,)) for h in holders]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    gc.collect()
    assert dead == [1]


def test_concurrent_conversions(tb):
    """Several threads import and export the same producer at once (the GIL is held/released
    correctly; no counts are lost)."""
    x = aligned_numpy((256,), np.int64, fill=np.arange(256)).view(TrackedArray)
    dead = []
    weakref.finalize(x, dead.append, 1)
    errors = []

    def work():
        try:
            for _ in range(2000):
                y = np_take(tb.asview(x))
                assert y.ctypes.data == x.ctypes.data
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    del x
    gc.collect()
    assert dead == [1]


def test_view_in_a_reference_cycle_is_collected(tb):
    x = aligned_numpy((4,), np.float32, fill=1).view(TrackedArray)
    dead = []
    weakref.finalize(x, dead.append, 1)

    class Node:
        pass

    n = Node()
    n.self = n
    n.view = tb.asview(x)
    n.export = np_take(n.view)
    del x, n
    gc.collect()
    assert dead == [1]


def test_views_alive_at_interpreter_exit():
    """Views, exports, unconsumed capsules and from_ptr views with a release callback alive
    when the interpreter exits: no crash, no hang (deleters may run after finalisation starts;
    they must not touch Python then)."""
    r = run_isolated(
        """
        import ctypes, numpy as np, tensorbridge as tb
        a = np.arange(10.0)
        v = tb.asview(a)
        e = np.from_dlpack(v)
        c1 = v.__dlpack__()
        c2 = v.__dlpack__(max_version=(1, 3))
        buf = (ctypes.c_float * 4)()
        w = tb.from_ptr(ctypes.addressof(buf), (4,), "float32", device="cpu", owner=buf,
                        release=lambda: None)
        try:
            import torch
            t = torch.from_dlpack(w)
        except ImportError:
            pass
        class Cycle: pass
        cyc = Cycle(); cyc.me = cyc; cyc.v = tb.asview(e)
        print("ok")
        """
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "ok"


# --- reference cycles through a view's owner ------------------------------------------------------


class PtrWrapper:
    """The common wrapper pattern: an object that owns memory and holds a view of it whose
    owner is the object itself (a cycle: wrapper -> view -> owner -> wrapper)."""

    def __init__(self, tb, released):
        self.buf = aligned_numpy((4,), np.float32, fill=np.arange(4))
        # `release` must not read the wrapper's attributes: when the collector breaks the
        # cycle, it clears the wrapper's __dict__ first, and the view's release runs then.
        self.view = tb.from_ptr(self.buf.ctypes.data, (4,), "float32", device="cpu", owner=self,
                                release=lambda: released.append(1))  # fmt: skip


class AIProducer:
    """A producer that keeps a view of itself: ``p.v = tb.asview(p)``."""

    def __init__(self):
        self.a = aligned_numpy((4,), np.float32, fill=np.arange(4))
        self.__array_interface__ = self.a.__array_interface__


def test_cycle_through_from_ptr_owner_is_collected(tb):
    """``self.view = tb.from_ptr(..., owner=self)``: unreachable, the cycle is collected and
    ``release`` runs exactly once (before the fix: never, the wrapper leaked)."""
    released = []
    w = PtrWrapper(tb, released)
    ref = weakref.ref(w)
    del w
    gc.collect()
    assert ref() is None, "the wrapper and its view leaked"
    assert released == [1]
    gc.collect()
    assert released == [1]


def test_cycle_through_producer_is_collected(tb):
    """``p.v = tb.asview(p)``: the view keeps its producer alive, the producer keeps the view."""
    p = AIProducer()
    p.v = tb.asview(p)
    assert p.v.ptr == p.a.ctypes.data
    ref = weakref.ref(p)
    del p
    gc.collect()
    assert ref() is None, "the producer and its view leaked"


def test_views_in_a_cycle_keep_their_memory_while_reachable(tb):
    """A view reachable from outside the cycle, or a consumer of it, keeps the whole cycle
    (and the memory) alive through collections; the cycle goes once the last one is gone."""
    released = []
    w = PtrWrapper(tb, released)
    ref = weakref.ref(w)
    v = w.view
    e = np_take(w.view)
    del w
    for _ in range(3):
        gc.collect()
    assert ref() is not None and released == []
    assert np.asarray(v).tolist() == [0, 1, 2, 3]
    del v
    gc.collect()
    # The consumer still holds the memory: the cycle stays (its owner is shared with it).
    assert released == []
    assert e.tolist() == [0, 1, 2, 3]
    del e
    gc.collect()
    assert ref() is None and released == [1]


@pytest.mark.parametrize("consumer", ["asarray", "from_dlpack"])
@pytest.mark.parametrize("callback", ["lambda", "closure_list", "function"])
def test_release_callback_is_never_cleared_before_it_runs(callback, consumer):
    """A cycle ``wrapper -> from_ptr view -> owner=wrapper`` whose view a NumPy array keeps
    past several collections, then collected: the release callback runs once, intact. Before
    the fix the view's traversal reported the callback, the collector cleared that function
    (its closure and globals) before the view was freed, and the view then called it: a
    segfault (found with ``np.asarray``, i.e. the array interface, where the array holds the
    view itself). Run in a child interpreter, so a crash is a failure, not a lost run."""
    take = "np.asarray(w.view)" if consumer == "asarray" else "np.from_dlpack(w.view)"
    if consumer == "from_dlpack" and not NUMPY_DLPACK_VERSIONED:
        take = "np.asarray(w.view)"
    r = run_isolated(
        f"""
        import gc, weakref
        import numpy as np
        import tensorbridge as tb

        released = []

        def plain():
            released.append(1)

        def make_callback():
            kind = {callback!r}
            if kind == "lambda":
                return lambda: released.append(1)
            if kind == "closure_list":
                box = [released]
                return lambda: box[0].append(1)
            return plain

        class PtrWrapper:
            def __init__(self):
                self.buf = np.arange(4, dtype=np.float32)
                self.view = tb.from_ptr(self.buf.ctypes.data, (4,), "float32", device="cpu",
                                        owner=self, release=make_callback())

        w = PtrWrapper()
        ref = weakref.ref(w)
        v = w.view
        e = {take}
        del w
        for _ in range(3):
            gc.collect()
        del v
        gc.collect()
        assert released == [] and e.tolist() == [0.0, 1.0, 2.0, 3.0]
        del e
        gc.collect()
        assert ref() is None, "the cycle was not collected"
        assert released == [1], released
        print("ok")
        """
    )
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert r.stdout.strip() == "ok"
