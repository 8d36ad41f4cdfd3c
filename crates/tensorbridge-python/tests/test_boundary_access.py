"""Host memory: access is never wider than the producer allows ([access]).

JAX and TensorFlow hand their arrays over as legacy DLPack capsules, which have no
read-only flag; tensorbridge imported every legacy capsule read-write, so
``np.from_dlpack(tb.asview(jax_array))[0] = 42`` changed an immutable JAX array (NumPy
imports the same capsules read-only). The invariant: a legacy capsule is read-only unless
its producer is known to allow writes (NumPy, PyTorch, CuPy); a versioned capsule says so
itself (its ``READ_ONLY`` flag). Read-only shows as ``View.readonly``, as a NumPy array
that refuses writes (``flags.writeable`` False), and as the producer's values unchanged.

Controls: NumPy arrays and PyTorch tensors stay writable (a write through the view reaches
the producer), and so do legacy capsules their `__dlpack__` hands out, a versioned capsule
without the flag, and our own exports (which come back as they were lent). A legacy capsule
handed over bare names no producer and is read-only, as ``np.from_dlpack`` takes it.
"""

import numpy as np
import pytest

from tbhelpers import HandMadeCapsule, aligned_numpy, np_take


def assert_read_only(tb, x, values_of, what):
    """``tb.asview(x)`` is read-only in every way a consumer can see, and ``x`` unchanged
    after a refused write."""
    before = np.array(values_of(), copy=True)
    v = tb.asview(x)
    assert v.readonly, f"{what} came out writable: {v!r}"
    n = np_take(v)
    assert not n.flags.writeable, f"NumPy's import of the view of {what} is writable"
    with pytest.raises(ValueError):
        n.reshape(-1)[0] = 42
    assert np.array_equal(values_of(), before)


def assert_writable_and_shared(tb, x, ptr, values_of, what):
    v = tb.asview(x)
    assert not v.readonly, f"{what} came out read-only: {v!r}"
    assert v.ptr == ptr
    n = np_take(v)
    n.reshape(-1)[0] = 42
    assert values_of().reshape(-1)[0] == 42, f"a write through the view of {what} was not seen"


# --- immutable producers: read-only ------------------------------------------------------------


def test_jax_array_is_read_only(tb):
    """A ``jax.numpy`` array (immutable) comes out read-only."""
    jnp = pytest.importorskip("jax.numpy")
    j = jnp.arange(6.0)
    assert_read_only(tb, j, lambda: np.asarray(jnp.copy(j)), "a JAX array")


def test_jax_legacy_capsule_is_read_only(tb):
    """JAX's own legacy capsule, given raw."""
    jnp = pytest.importorskip("jax.numpy")
    j = jnp.arange(6.0)
    assert_read_only(tb, j.__dlpack__(), lambda: np.asarray(jnp.copy(j)), "JAX's legacy capsule")


def test_tf_constant_is_read_only(tb):
    """A ``tf.constant`` comes out read-only (object and raw capsule)."""
    tf = pytest.importorskip("tensorflow")
    c = tf.constant([1.0, 2.0, 3.0])
    assert_read_only(tb, c, lambda: c.numpy().copy(), "a tf.constant")
    assert_read_only(tb, tf.experimental.dlpack.to_dlpack(c), lambda: c.numpy().copy(), "TF's legacy capsule")


def test_legacy_capsule_from_an_unknown_producer_is_read_only(tb):
    """A legacy capsule whose producer tensorbridge does not know (hand-made here):
    it cannot say read-only, so it is taken read-only."""
    buf = aligned_numpy((16,), np.float32, fill=np.arange(16))
    h = HandMadeCapsule(data=buf.ctypes.data, shape=(16,), strides=(1,), versioned=False, keep=buf)
    assert_read_only(tb, h.make(), lambda: buf.copy(), "an unknown producer's legacy capsule")

    class Unknown:
        """An unknown producer whose ``__dlpack__`` hands out a legacy capsule."""

        def __dlpack__(self, **kw):
            return h.make()

        def __dlpack_device__(self):
            return (1, 0)

    assert_read_only(tb, Unknown(), lambda: buf.copy(), "an unknown producer's __dlpack__ (legacy)")


# --- producers known to allow writes: writable (controls) ------------------------------------


def test_numpy_array_stays_writable_and_its_bare_capsule_does_not(tb):
    """A writable NumPy array is writable through its view. Its legacy capsule handed over
    bare names no producer (a capsule carries no type), so it is taken read-only, exactly as
    ``np.from_dlpack`` takes legacy capsules."""
    a = aligned_numpy((6,), np.float32, fill=np.arange(6))
    assert_writable_and_shared(tb, a, a.ctypes.data, lambda: a, "a NumPy array")
    assert_read_only(tb, a.__dlpack__(), lambda: a.copy(), "a bare NumPy legacy capsule")


def test_torch_tensor_stays_writable_and_its_bare_capsules_do_not(tb):
    torch = pytest.importorskip("torch")
    t = torch.arange(6, dtype=torch.float32)
    values = lambda: t.numpy()  # noqa: E731
    assert_writable_and_shared(tb, t, t.data_ptr(), values, "a torch tensor")

    class Legacy:
        """A producer of PyTorch's module (so known to allow writes) whose ``__dlpack__``
        hands out torch's legacy capsule."""

        __module__ = "torch.custom"

        def __dlpack__(self, **kw):
            return torch.utils.dlpack.to_dlpack(t)

        def __dlpack_device__(self):
            return (1, 0)

    assert_writable_and_shared(tb, Legacy(), t.data_ptr(), values, "torch's legacy capsule through __dlpack__")
    assert_read_only(tb, torch.utils.dlpack.to_dlpack(t), lambda: t.numpy().copy(), "a bare torch.utils.dlpack capsule")
    assert_read_only(tb, t.__dlpack__(), lambda: t.numpy().copy(), "a bare legacy __dlpack__() capsule")


def test_our_own_legacy_capsule_keeps_the_access_it_was_exported_with(tb):
    """A bare capsule that tensorbridge exported is no unknown producer's: it comes back with
    the access it left with, writable or read-only."""
    a = aligned_numpy((6,), np.float32, fill=np.arange(6))
    assert_writable_and_shared(tb, tb.asview(a).__dlpack__(), a.ctypes.data, lambda: a, "our own legacy capsule")
    b = aligned_numpy((6,), np.float32, fill=np.arange(6))
    b.flags.writeable = False
    ro = tb.asview(b)
    assert ro.readonly
    assert_read_only(tb, ro.__dlpack__(max_version=(1, 3)), lambda: b.copy(), "our own read-only capsule")


def test_versioned_capsule_without_the_flag_stays_writable(tb):
    buf = aligned_numpy((16,), np.float32, fill=np.arange(16))
    h = HandMadeCapsule(data=buf.ctypes.data, shape=(16,), strides=(1,), versioned=True, keep=buf)
    assert_writable_and_shared(tb, h.make(), buf.ctypes.data, lambda: buf, "a versioned capsule without READ_ONLY")


def test_flagless_producer_is_flagless_through_its_interface_too(tb):
    """JAX's CUDA arrays may reach tensorbridge through ``__cuda_array_interface__`` (which
    says ``readonly``) when their ``__dlpack__`` refuses the request; the view must still go
    to a legacy consumer as JAX's own capsule would. The host stand-in: a type of JAX's
    module whose ``__dlpack__`` refuses with ``BufferError`` and whose array interface
    exports read-only memory. A type of another module, the same otherwise, stays strict."""
    buf = np.arange(6, dtype=np.float32)
    buf.flags.writeable = False

    def make(module):
        def refuse(self, **kwargs):
            raise BufferError("refused, as a producer may")

        cls = type("Array", (), {
            "__module__": module,
            "__dlpack__": refuse,
            "__dlpack_device__": lambda self: (1, 0),
            "__array_interface__": property(lambda self: buf.__array_interface__),
        })
        return cls()

    v = tb.asview(make("jaxlib._fake_interface"))
    assert v.readonly and v.ptr == buf.ctypes.data
    legacy = v.__dlpack__()  # what JAX's __dlpack__ would hand a legacy consumer
    np.testing.assert_array_equal(np.from_dlpack(_Capsule(legacy)), buf)
    assert not np.from_dlpack(v).flags.writeable  # a versioned consumer is told read-only

    strict = tb.asview(make("some_library"))
    with pytest.raises(BufferError, match="read-only"):
        strict.__dlpack__()


class _Capsule:
    """Hands NumPy a given legacy capsule."""

    def __init__(self, capsule):
        self.capsule = capsule

    def __dlpack__(self, **kwargs):
        return self.capsule

    def __dlpack_device__(self):
        return (1, 0)


def test_jax_array_stays_flagless_while_tensorbridge_lends_it(tb):
    """A JAX array viewed and lent read-only (NumPy holds the export) is viewed again and
    handed to a legacy consumer: JAX's own ``__dlpack__`` would hand it over flagless, and so
    does the view, whatever tensorbridge has lent of the same memory. A legacy capsule of an
    unknown producer over that memory stays read-only-strict (the lent export coming back)."""
    jnp = pytest.importorskip("jax.numpy")
    j = jnp.arange(6, dtype=jnp.float32)
    held = np.from_dlpack(tb.asview(j))  # a live read-only export of j's memory
    assert not held.flags.writeable
    again = tb.asview(j)
    capsule = again.__dlpack__()  # legacy, as JAX before 0.12 asks
    np.testing.assert_array_equal(np.from_dlpack(_Capsule(capsule)), np.asarray(j))
    # The same memory as a bare legacy capsule (its producer unknown to the import): strict
    # while lent, as the lent export coming back through a consumer that dropped the flag.
    bare = tb.asview(tb.asview(j).__dlpack__())
    assert bare.readonly
    with pytest.raises(BufferError, match="read-only"):
        bare.__dlpack__()
    del held
