"""Threads: 8 threads converting at once (imports, exports, consumers dropping on other
threads), with the GIL released wherever the package releases it. Every release callable
runs exactly once, producers' reference counts come back, and every view sees the data.
"""

import ctypes
import gc
import sys
import threading

import numpy as np

THREADS = 8
PER_THREAD = 5_000


def test_eight_threads_convert_at_once(tb):
    a = np.arange(64, dtype=np.float32).reshape(8, 8)
    buf = (ctypes.c_float * 64)(*range(64))
    addr = ctypes.addressof(buf)
    released = [0]
    lock = threading.Lock()

    def release():
        with lock:
            released[0] += 1

    refs_a, refs_buf = sys.getrefcount(a), sys.getrefcount(buf)
    errors = []
    barrier = threading.Barrier(THREADS)

    def work(k):
        try:
            barrier.wait()
            for n in range(PER_THREAD):
                v = tb.asview(a)
                b = np.from_dlpack(v)
                assert b[7, 7] == 63.0 and v.ptr == a.ctypes.data
                w = tb.from_ptr(addr, (8, 8), "float32", device="cpu", owner=buf, release=release)
                c = np.asarray(w)
                assert c[k % 8, 0] == (k % 8) * 8
                del v, b, w, c
        except Exception as e:  # reported below with the thread's number
            errors.append((k, repr(e)))

    threads = [threading.Thread(target=work, args=(k,)) for k in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    gc.collect()
    assert not errors, errors
    assert released[0] == THREADS * PER_THREAD, "each from_ptr view released exactly once"
    assert sys.getrefcount(a) == refs_a
    assert sys.getrefcount(buf) == refs_buf


def test_views_made_on_one_thread_die_on_another(tb):
    """Producers are released when the last consumer dies, whichever thread that is."""
    import weakref

    class Producer:
        def __init__(self):
            self.a = np.ones(16, dtype=np.float64)
            self.__array_interface__ = self.a.__array_interface__

    released = []
    views = []
    for _ in range(THREADS):
        p = Producer()
        weakref.finalize(p, released.append, 1)
        views.append(tb.asview(p))
        del p
    gc.collect()
    assert released == []
    threads = [threading.Thread(target=views.pop) for _ in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    gc.collect()
    assert len(released) == THREADS
